"""The store contract, run unchanged against every backend: a directory, Redis Streams on
one Redis, and on a real Redis Cluster of three masters.

Each test gets a fresh store (a tmp_path, or a flushed Redis database on the session's
real redis-server).  Backend-specific set-up -- appending raw or damaged data behind a
writer's back, making the next write fail half way -- lives in the two small Backend
classes; the assertions are shared.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading

import pytest
from redis_fixture import *  # noqa: F403  (the redis_server and redis_url fixtures)
from redis_fixture import cluster_client, redis_client

from commscope import events as E
from commscope.store import StoreError, open_reader, open_writer
from commscope.store.directory import rank_file_name
from commscope.store.redis_store import Keys


def ev(rank: int, i: int, **kw) -> dict:
    return {"v": 1, "type": "op", "rank": rank, "ts": 1000 + i, "phase": "begin", "id": i, "op": "all_reduce",
            "group": "0", "seq": i, "site": "train.py:42 in step", **kw}


def lines(*events: dict) -> list[bytes]:
    return [E.encode(e) for e in events]


class DirectoryBackend:
    name = "directory"

    def __init__(self, root):
        self.root = root
        self.store = str(root)

    def job_store(self, job: str) -> str:
        return str(self.root / job)

    def missing_store(self) -> str:
        return str(self.root / "not-yet")

    def append_raw(self, job: str, rank: int, records: list[bytes]) -> None:
        with open(self.root / job / rank_file_name(rank), "ab") as f:
            f.write(b"".join(r + b"\n" for r in records))

    def append_torn(self, job: str, rank: int, data: bytes) -> None:
        with open(self.root / job / rank_file_name(rank), "ab") as f:
            f.write(data)

    @contextlib.contextmanager
    def failing_writes(self, monkeypatch):
        """The disk fills up part way through the next write."""
        real_write = os.write
        calls = {"n": 0}

        def half_then_full(fd, data):
            calls["n"] += 1
            if calls["n"] == 1:
                return real_write(fd, bytes(data[: len(data) // 2]))
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, "write", half_then_full)
        try:
            yield
        finally:
            monkeypatch.setattr(os, "write", real_write)

    def close(self) -> None:
        pass


class RedisBackend:
    name = "redis"

    def __init__(self, url: str):
        self.store = url
        self.client = redis_client(url)

    def job_store(self, job: str) -> str:
        return f"{self.store}{'&' if '?' in self.store else '?'}job={job}"

    def missing_store(self) -> str:
        return self.store  # a flushed database: no job at all yet

    def append_raw(self, job: str, rank: int, records: list[bytes]) -> None:
        key = Keys.stream(job, rank)
        top = self.client.xrevrange(key, count=1)
        k = int(top[0][0].split(b"-")[1]) if top else 0
        for r in records:
            k += 1
            self.client.xadd(key, {"e": r}, id=f"0-{k}")

    def append_torn(self, job: str, rank: int, data: bytes) -> None:
        self.append_raw(job, rank, [data])  # an entry holding half an event

    @contextlib.contextmanager
    def failing_writes(self, monkeypatch):
        """Redis runs out of memory part way through the next write (maxmemory, noeviction)."""
        used = int(self.client.info("memory")["used_memory"])
        self.client.config_set("maxmemory-policy", "noeviction")
        self.client.config_set("maxmemory", str(used + (3 << 20)))
        try:
            yield
        finally:
            self.client.config_set("maxmemory", "0")

    def close(self) -> None:
        self.client.close()


class RedisClusterBackend(RedisBackend):
    name = "redis-cluster"

    def __init__(self, url: str, cluster):
        self.store = url
        self.cluster = cluster
        self.client = cluster_client(url)

    @contextlib.contextmanager
    def failing_writes(self, monkeypatch):
        """The masters run out of memory part way through the next write."""

        nodes = [redis_client(s.url) for s in self.cluster.servers]
        for node in nodes:
            node.config_set("maxmemory-policy", "noeviction")
            node.config_set("maxmemory", str(int(node.info("memory")["used_memory"]) + (3 << 20)))
        try:
            yield
        finally:
            for node in nodes:
                node.config_set("maxmemory", "0")
                node.close()


@pytest.fixture(params=["directory", "redis", "redis-cluster", "redis-cluster-tls"])
def backend(request, tmp_path):
    if request.param == "directory":
        b = DirectoryBackend(tmp_path)
    elif request.param == "redis":
        b = RedisBackend(request.getfixturevalue("redis_url"))
    elif request.param == "redis-cluster":
        b = RedisClusterBackend(request.getfixturevalue("redis_cluster_url"),
                                request.getfixturevalue("redis_cluster"))
    else:  # the same over TLS, with client certificates (tests/test_redis_tls.py: its failures)
        b = RedisClusterBackend(request.getfixturevalue("redis_tls_cluster_url"),
                                request.getfixturevalue("redis_tls_cluster"))
    yield b
    b.close()


def ids(events: list[dict]) -> list[tuple[int, int]]:
    return [(e["rank"], e["id"]) for e in events]


def test_round_trip_with_job_metadata(backend):
    w0 = open_writer(backend.store, "job-a", 0, {"world_size": 2})
    w1 = open_writer(backend.store, "job-a", 1)
    w0.write(lines(ev(0, 1), ev(0, 2)))
    w1.write(lines(ev(1, 1)))
    reader = open_reader(backend.store)
    got = reader.read_all()
    assert ids(got) == [(0, 1), (0, 2), (1, 1)]
    assert got[0] == ev(0, 1)  # every field survives
    assert reader.job() == {"world_size": 2, "job": "job-a"}
    assert reader.stats.events == 3 and reader.stats.corrupt == 0 and not reader.stats.trimmed
    assert reader.read_all() == [] and reader.poll() == []  # nothing is returned twice
    for w in (w0, w1):
        w.close()
    reader.close()


def test_tail_returns_only_new_events(backend):
    w = open_writer(backend.store, "j", 0, {"world_size": 1})
    reader = open_reader(backend.store)
    assert reader.poll() == []
    w.write(lines(ev(0, 1)))
    assert ids(reader.poll()) == [(0, 1)]
    assert reader.poll() == []
    w.write(lines(ev(0, 2), ev(0, 3)))
    assert ids(reader.poll()) == [(0, 2), (0, 3)]
    w1 = open_writer(backend.store, "j", 1)  # a rank that shows up late is picked up
    w1.write(lines(ev(1, 1)))
    assert ids(reader.poll()) == [(1, 1)]


def test_tail_while_another_thread_writes(backend):
    writers = [open_writer(backend.store, "live", r, {"world_size": 2}) for r in range(2)]
    reader = open_reader(backend.store)
    n = 3000

    def produce():
        for start in range(1, n + 1, 50):
            for r, w in enumerate(writers):
                w.write(lines(*(ev(r, i) for i in range(start, min(start + 50, n + 1)))))

    t = threading.Thread(target=produce)
    t.start()
    seen: dict[int, list[int]] = {0: [], 1: []}
    polls = 0
    while t.is_alive() or sum(map(len, seen.values())) < 2 * n:
        for e in reader.poll():
            seen[e["rank"]].append(e["id"])
        polls += 1
        if not t.is_alive() and polls > 100_000:
            break
    t.join()
    assert seen == {0: list(range(1, n + 1)), 1: list(range(1, n + 1))}  # all, in order, once
    assert reader.stats.corrupt == 0


def test_partial_event_is_never_returned(backend):
    w = open_writer(backend.store, "j", 0, {"world_size": 1})
    w.write(lines(ev(0, 1)))
    backend.append_torn("j", 0, E.encode(ev(0, 2))[:25])  # a writer cut off mid-event
    reader = open_reader(backend.store)
    assert ids(reader.poll()) == [(0, 1)]
    assert ids(reader.read_all()) == []
    assert reader.stats.corrupt == 1 and reader.stats.corrupt_by_rank == {0: 1}
    assert reader.stats.events == 1


def test_corrupt_entries_are_counted_and_skipped(backend):
    w = open_writer(backend.store, "j", 3, {"world_size": 4})
    w.write(lines(ev(3, 1)))
    backend.append_raw("j", 3, [b"{not json", E.encode(ev(3, 2)), b'{"type": "op"}',
                                b'{"v": 99, "type": "meta", "rank": 3, "ts": 1}', b"[1, 2]", E.encode(ev(3, 3))])
    reader = open_reader(backend.store)
    got = reader.read_all()
    assert ids(got) == [(3, 1), (3, 2), (3, 3)]
    assert reader.stats.corrupt == 1 and reader.stats.corrupt_by_rank == {3: 1}  # not JSON
    assert reader.stats.invalid == 3 and reader.stats.invalid_by_reason == {  # JSON, not an event
        "op: no ts": 1, "meta: unsupported schema version": 1, "event: not an object": 1}


def test_jobs_are_separate_newest_by_default(backend):
    old = [open_writer(backend.store, "old", r, {"world_size": 4}) for r in range(4)]
    for r, w in enumerate(old):
        w.write(lines(ev(r, 1)))
    new = [open_writer(backend.store, "new", r, {"world_size": 2}) for r in range(2)]
    for r, w in enumerate(new):
        w.write(lines(ev(r, 7)))
    newest = open_reader(backend.store)
    assert sorted(ids(newest.read_all())) == [(0, 7), (1, 7)]
    assert newest.job()["job"] == "new"
    old_again = open_reader(backend.job_store("old"))
    assert sorted(ids(old_again.read_all())) == [(0, 1), (1, 1), (2, 1), (3, 1)]
    assert old_again.job() == {"world_size": 4, "job": "old"}


def test_a_new_job_never_mixes_into_an_old_one(backend):
    w = open_writer(backend.store, "j", 0, {"world_size": 2})
    w.write(lines(ev(0, 1)))
    with pytest.raises(StoreError, match="refusing to mix jobs"):
        open_writer(backend.store, "j", 0)
    open_writer(backend.store, "j", 1).write(lines(ev(1, 1)))  # a rank without events yet is fine
    assert sorted(ids(open_reader(backend.store).read_all())) == [(0, 1), (1, 1)]


def test_reader_waits_for_a_job_that_does_not_exist_yet(backend):
    with pytest.raises(StoreError):
        open_reader(backend.missing_store())
    reader = open_reader(backend.missing_store(), wait=True)
    assert reader.poll() == [] and reader.job() is None
    target = backend.store if backend.name == "redis" else backend.missing_store()
    open_writer(target, "later", 0, {"world_size": 1}).write(lines(ev(0, 1)))
    assert ids(reader.poll()) == [(0, 1)]
    assert reader.job()["job"] == "later"


def test_reader_waits_for_a_named_job(backend):
    open_writer(backend.store, "other", 0).write(lines(ev(0, 5)))
    reader = open_reader(backend.job_store("named"), wait=True)
    assert reader.poll() == []
    open_writer(backend.store, "named", 0, {"world_size": 1}).write(lines(ev(0, 1)))
    assert ids(reader.poll()) == [(0, 1)]


def test_failed_write_reports_exactly_what_landed(backend, monkeypatch):
    w = open_writer(backend.store, "j", 0, {"world_size": 1})
    w.write(lines(ev(0, 1)))
    batch = lines(*(ev(0, i, pad="x" * 100) for i in range(2, 40_002)))
    with backend.failing_writes(monkeypatch), pytest.raises(StoreError) as info:
        w.write(batch)
    k = info.value.written
    assert 0 < k < len(batch)  # part of the batch landed: the interesting case
    stored = open_reader(backend.job_store("j")).read_all()
    assert ids(stored) == [(0, i) for i in range(1, k + 2)]  # exactly the first k, no more
    w.write(batch[k:])  # what the recorder's retry sends
    reader = open_reader(backend.job_store("j"))
    got = reader.read_all()
    assert ids(got) == [(0, i) for i in range(1, 40_002)]  # nothing lost, nothing twice
    # (a directory store's torn copy of a line is cut off: it read as a damaged line, a loss)
    assert reader.stats.corrupt == 0


def test_every_reader_is_a_trace_reader_with_one_poll(backend, tmp_path):
    from commscope.analysis.flight_import import FlightRecorderReader
    from commscope.analysis.source import open_source
    from commscope.store import EmptyReader, TraceReader

    w = open_writer(backend.store, "j", 0, {"world_size": 1})
    w.write(lines(*(ev(0, i) for i in range(1, 201))))
    reader = open_source(backend.store)
    assert isinstance(reader, TraceReader)
    first = reader.poll(max_bytes=1)  # a budget bounds a read, never stops one
    rest = reader.poll(max_bytes=None)
    assert ids(first + rest) == [(0, i) for i in range(1, 201)] and first
    assert reader.backlog_bytes() == 0 and reader.total_bytes() >= 0 and reader.stats.events == 200
    reader.close()
    w.close()
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    (dumps / "fr_trace_0").write_text('{"version": "2.4", "entries": []}')
    # a dump without entries still says who wrote it (meta) and when (heartbeat); nothing says nothing
    for other, types in ((FlightRecorderReader(dumps), ["meta", "heartbeat"]), (EmptyReader("nothing"), [])):
        assert isinstance(other, TraceReader)
        got = other.poll(max_bytes=1 << 20)
        assert [e["type"] for e in got] == types and other.stats.events == len(types)
        assert other.poll() == [] and other.backlog_bytes() == 0 and other.total_bytes() == 0
        other.close()
