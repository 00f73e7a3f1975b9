"""A real redis-server for the Redis store tests (never a mock).

``redis_server`` (session): one private server on a free loopback port, with its own
config and data directory, stopped at the end.  ``redis_url`` (function): a URL on a
database of that server that nobody else used since it was flushed, so "the newest job"
in one test never sees another test's jobs.  ``redis_cluster`` (session): a real Redis
Cluster of three masters (``redis-server --cluster-enabled yes`` x3, ``redis-cli --cluster
create``); ``redis_cluster_url`` (function): a URL to its first node, every master flushed.  A missing redis-server fails the tests
that need it with the install hint, instead of silently skipping them.

Import the fixtures into a test module with ``from redis_fixture import *``.
"""

from __future__ import annotations

import itertools

import pytest

from commscope.bench.redis_server import RedisCluster, RedisServer, RedisServerMissing, find_redis_server

DATABASES = 64
_db_numbers = itertools.cycle(range(1, DATABASES))

__all__ = ["cluster_client", "redis_client", "redis_cluster", "redis_cluster_url", "redis_server", "redis_url",
           "require_redis_server"]


def require_redis_server() -> str:
    try:
        return find_redis_server()
    except RedisServerMissing as exc:
        pytest.fail(f"{exc}  (scripts/test and .ci/run install it)", pytrace=False)


def _started(thing, what: str):
    """``thing.start()``, or the test fails saying why (and ``thing`` is cleaned up)."""
    try:
        thing.start()
    except Exception as exc:
        thing.close()
        pytest.fail(f"could not start {what}: {exc}", pytrace=False)
    return thing


@pytest.fixture(scope="session")
def redis_server():
    server = _started(RedisServer(binary=require_redis_server(), extra={"databases": DATABASES}), "redis-server")
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


@pytest.fixture(scope="session")
def redis_cluster():
    cluster = _started(RedisCluster(3, binary=require_redis_server()), "a Redis Cluster")
    yield cluster
    cluster.close()


def cluster_client(url: str):
    """A redis-py cluster client for a store URL (any node): an independent look."""
    import redis

    from commscope.store.redis_url import parse_url

    t = parse_url(url)
    return redis.RedisCluster(host=t.host, port=t.port, password=t.password, protocol=2)


@pytest.fixture
def redis_cluster_url(redis_cluster) -> str:
    """``redis://127.0.0.1:PORT/0`` on the session's cluster, every master flushed."""
    import redis

    for server in redis_cluster.servers:
        assert server.running, "a node of the session's cluster died"
        client = redis.Redis(host="127.0.0.1", port=server.port, protocol=2)
        client.flushall()
        client.close()
    return redis_cluster.url
