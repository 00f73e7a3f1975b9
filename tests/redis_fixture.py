"""A real redis-server for the Redis store tests (never a mock).

``redis_server`` (session): one private server on a free loopback port, with its own
config and data directory, stopped at the end.  ``redis_url`` (function): a URL on a
database of that server that nobody else used since it was flushed, so "the newest job"
in one test never sees another test's jobs.  A missing redis-server fails the tests
that need it with the install hint, instead of silently skipping them.

Import the fixtures into a test module with ``from redis_fixture import *``.
"""

from __future__ import annotations

import itertools

import pytest

from commscope.bench.redis_server import RedisServer, RedisServerMissing, find_redis_server

DATABASES = 64
_db_numbers = itertools.cycle(range(1, DATABASES))

__all__ = ["redis_client", "redis_server", "redis_url", "require_redis_server"]


def require_redis_server() -> str:
    try:
        return find_redis_server()
    except RedisServerMissing as exc:
        pytest.fail(f"{exc}  (scripts/test and .ci/run install it)", pytrace=False)


@pytest.fixture(scope="session")
def redis_server():
    binary = require_redis_server()
    server = RedisServer(binary=binary, extra={"databases": DATABASES})
    try:
        server.start()
    except Exception as exc:
        server.close()
        pytest.fail(f"could not start redis-server: {exc}", pytrace=False)
    yield server
    server.close()


def redis_client(url: str):
    """A redis-py client for a store URL: an independent way to look at what commscope stored."""
    import redis

    from commscope.store.redis_url import parse_url

    t = parse_url(url)
    return redis.Redis(host=t.host, port=t.port, db=t.db, password=t.password, protocol=2)


@pytest.fixture
def redis_url(redis_server) -> str:
    """``redis://127.0.0.1:PORT/N`` on a freshly flushed database N."""
    assert redis_server.running, "the session's redis-server died"
    db = next(_db_numbers)
    url = f"redis://127.0.0.1:{redis_server.port}/{db}"
    client = redis_client(url)
    client.flushdb()
    client.close()
    return url
