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

from commscope.bench.redis_server import (
    RedisCluster,
    RedisServer,
    RedisServerMissing,
    TlsFiles,
    find_redis_server,
    make_tls_files,
)

DATABASES = 64
_db_numbers = itertools.cycle(range(1, DATABASES))

__all__ = ["busiest_by_redis_py", "cluster_client", "filled", "redis_client", "redis_cluster", "redis_cluster_url", "redis_server", "redis_tls_cluster",
           "redis_tls_cluster_url", "redis_url", "require_redis_server", "tls_files"]


def filled(server) -> list:
    """The test's own clients of ``server`` (a ``RedisServer``), a PING each, until it refuses
    one as full (``maxclients``: it says so to the client past it, then closes it); the
    caller closes them."""
    import socket

    held = []
    while True:
        s = socket.create_connection(("127.0.0.1", server.port), timeout=60)
        s.sendall(b"PING\r\n")
        if not s.recv(64).startswith(b"+PONG"):
            s.close()
            return held
        held.append(s)


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


def _tls_kwargs(t) -> dict:
    """redis-py's TLS arguments for a parsed store URL (its names are the URL's)."""
    if not t.tls:
        return {}
    return {"ssl": True, "ssl_ca_certs": t.ssl_ca_certs, "ssl_certfile": t.ssl_certfile, "ssl_keyfile": t.ssl_keyfile,
            "ssl_cert_reqs": "required" if t.ssl_verify else "none", "ssl_check_hostname": False}


def redis_client(url: str):
    """A redis-py client for a store URL: an independent way to look at what commscope stored."""
    import redis

    from commscope.store.redis_url import parse_url

    t = parse_url(url)
    return redis.Redis(host=t.host, port=t.port, db=t.db, password=t.password, protocol=2, **_tls_kwargs(t))


def _no_keeper_left() -> None:
    """No keeper of Redis keyframes (``store/redis_keeper.py``) of this process left after a
    test, nor cached for a later one (``children.Keeper.of``).  Those of the test's closed
    writers end by themselves, but at the lowest priority on busy cores seconds later (one
    still connected was counted as another test's client); those of writers a test left
    open would run until the process ends, and could take keyframes in a database a later
    test is given again."""
    import psutil

    from commscope.store import children

    for p in psutil.Process().children():
        try:
            if "commscope.store.redis_keeper" in " ".join(p.cmdline()):
                p.kill()
                p.wait(60)
        except (psutil.Error, ChildProcessError):
            pass
    for key in [k for k in children.Keeper._of if k[1] == "commscope.store.redis_keeper"]:
        del children.Keeper._of[key]


@pytest.fixture
def redis_url(redis_server):
    """``redis://127.0.0.1:PORT/N`` on a freshly flushed database N; no keeper of the test's
    writers left after it."""
    assert redis_server.running, "the session's redis-server died"
    db = next(_db_numbers)
    url = f"redis://127.0.0.1:{redis_server.port}/{db}"
    client = redis_client(url)
    client.flushdb()
    client.close()
    yield url
    _no_keeper_left()


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
    return redis.RedisCluster(host=t.host, port=t.port, password=t.password, protocol=2, **_tls_kwargs(t))


def busiest_by_redis_py(url: str, job: str, world: int) -> int:
    """The ranks of ``job`` (``world`` of them) on its busiest master, counted rank by rank by
    redis-py (its own slot of each rank's stream and its own slot map): an independent look."""
    from collections import Counter

    from commscope.store.redis_keys import Keys

    client = cluster_client(url)
    try:
        on = Counter(client.nodes_manager.get_node_from_slot(client.keyslot(Keys.stream(job, r))).port
                     for r in range(world))
    finally:
        client.close()
    return max(on.values())


@pytest.fixture
def redis_cluster_url(redis_cluster):
    """``redis://127.0.0.1:PORT/0`` on the session's cluster, every master flushed; no keeper
    of the test's writers left after it."""
    yield _flushed(redis_cluster)
    _no_keeper_left()


def _flushed(cluster: RedisCluster) -> str:
    for server in cluster.servers:
        assert server.running, "a node of the session's cluster died"
        client = redis_client(server.url)
        client.flushall()
        client.close()
    return cluster.url


def require_openssl() -> None:
    import shutil

    if shutil.which("openssl") is None:
        pytest.fail("openssl not found: the TLS tests make their certificates with it (apt-get install openssl; "
                    "scripts/test and .ci/run install it)", pytrace=False)


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory) -> TlsFiles:
    """A private CA, a server certificate naming 127.0.0.1 and localhost, a client certificate."""
    require_openssl()
    return make_tls_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="session")
def redis_tls_cluster(tls_files):
    """A Redis Cluster of three masters over TLS only (``tls-cluster yes``), asking clients for
    a certificate (``tls-auth-clients yes``, Redis's default)."""
    cluster = _started(RedisCluster(3, binary=require_redis_server(), tls=tls_files), "a Redis Cluster over TLS")
    yield cluster
    cluster.close()


@pytest.fixture
def redis_tls_cluster_url(redis_tls_cluster) -> str:
    """``rediss://127.0.0.1:PORT/0?ssl_ca_certs=...&ssl_certfile=...&ssl_keyfile=...``, every master flushed."""
    return _flushed(redis_tls_cluster)
