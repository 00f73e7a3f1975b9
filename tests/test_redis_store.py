"""Redis store specifics: URLs and redaction, key layout, trimming, lost replies, reconnects.

Everything runs against a real redis-server (tests/redis_fixture.py).  Network faults are
made real where Redis can make them (CLIENT KILL, a stopped server); a reply lost *after*
Redis executed the batch cannot be timed from outside, so that one is injected at the
socket of the writer's connection.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import orjson
import pytest
import redis
from redis_fixture import *  # noqa: F403  (the redis_server and redis_url fixtures)
from redis_fixture import busiest_by_redis_py, cluster_client, filled, redis_client

from commscope import events as E
from commscope.bench.redis_server import RedisServer
from commscope.redact import redact
from commscope.store import StoreError, open_reader, open_writer
from commscope.store.base import Shard
from commscope.store.redis_store import Keys, RedisAuthError, RedisWriter, delete_job, list_jobs
from commscope.store.redis_url import parse_url
from commscope.store.resp import Interruptible


def ev(rank: int, i: int, **kw) -> dict:
    return {"v": 1, "type": "op", "rank": rank, "ts": 1000 + i, "phase": "begin", "id": i, **kw}


def lines(rank: int, a: int, b: int, **kw) -> list[bytes]:
    return [E.encode(ev(rank, i, **kw)) for i in range(a, b)]


def stored_ids(url: str, job: str, rank: int) -> list[tuple[bytes, int]]:
    """(entry id, event id) of every entry, read with redis-py: an independent view."""
    c = redis_client(url)
    try:
        return [(eid, E.decode(f[b"e"])["id"]) for eid, f in c.xrange(Keys.stream(job, rank))]
    finally:
        c.close()


# ---------------------------------------------------------------------------- URLs
@pytest.mark.parametrize("url, expect", [
    ("redis://localhost:6379/0", dict(host="localhost", port=6379, db=0)),
    ("redis://h", dict(host="h", port=6379, db=0)),
    ("redis://:p%40ss@h:7000/3?job=run-1&maxlen=5000", dict(host="h", port=7000, db=3, password="p@ss", job="run-1",
                                                            maxlen=5000)),
    ("redis://alice:pw@h/2", dict(username="alice", password="pw", db=2)),
    ("rediss://h:6380/0?ssl_cert_reqs=none", dict(scheme="rediss", ssl_verify=False)),
    ("unix:///run/redis.sock?db=4&job=x", dict(scheme="unix", path="/run/redis.sock", db=4, job="x")),
    ("redis://h/0?timeout=0.5", dict(timeout=0.5)),
    ("redis://h/0?rate=500", dict(rate=500)),
    ("redis://h/2?db=2", dict(db=2)),
    ("redis://h/2147483647", dict(db=2147483647)),
    ("redis://h/0", dict(rate=25_000)),
])
def test_url_forms(url, expect):
    t = parse_url(url)
    for k, v in expect.items():
        assert getattr(t, k) == v, k


@pytest.mark.parametrize("url, problem", [
    ("redis://h:notaport/0", "port"),
    ("redis://h/abc", "database"),
    ("redis://h/0?jobb=x", "unknown option"),
    ("redis://h/0?job=d1&job=d2", "option 'job' given twice, differently"),  # (recorded d2, showed d1: helper-197)
    ("redis://h/0?job=a/b", "job name"),
    ("redis://h/0?maxlen=0", "maxlen"),
    ("redis://h/0?timeout=-1", "timeout"),
    ("redis://h/0?rate=0", "rate"),
    ("redis://h/0?rate=fast", "rate"),
    ("unix://", "unix:///path"),
    ("redis://h/\u00b2", "the database must be a number 0-2147483647"),  # ('\u00b2'.isdigit(), which int refuses)
    ("redis://h/2147483648", "the database must be a number 0-2147483647"),  # (Redis refused it at the first read)
    ("redis://h/1?db=2", r"two databases \(/1 and db=2\)"),  # (redis-py reads db=2; /1 was taken, db= ignored)
    ("redis://h/0?maxlen=\u00b2", "maxlen"),
    ("redis://h/0?rate=\u0663", "rate"),  # (an Arabic-Indic 3, read as 3)
])
def test_bad_urls_are_store_errors(url, problem):
    with pytest.raises(StoreError, match=problem):
        parse_url(url)


@pytest.mark.parametrize("url", [
    "redis://:hunter2secret@h:1/0", "redis://bob:hunter2secret@h/0", "redis://hunter2secret@h",
    "redis://:hunter2/secret@h/0", "redis://:hunter2#secret@h/0", "redis://:hunter2?secret@h/0?job=x",
    "redis://h/0?password=hunter2secret&job=x", "unix://:hunter2secret@/tmp/r.sock",
    "redis://:hunter2secret@h:notaport/0", "redis://:hunter2/x=secret@h:1/0", "redis:///:hunter2secret@h",
    "redis://:hunter2?x=secret@h/0", "redis://:hunter2?secret@h:1/0",
])
def test_password_never_survives_redaction_or_parsing(url):
    for part in ("hunter2", "secret"):
        assert part not in redact(url)
    try:
        t = parse_url(url)
    except StoreError as exc:
        assert "hunter2" not in str(exc)
        return
    assert "hunter2" not in repr(t) and "hunter2" not in t.display()


@pytest.mark.parametrize("url, shown", [
    # a store's name is one URL whole: a password holding a space (not percent-encoded)
    ("redis://:Pw 1234-spaced@h:1/0", "redis://***@h:1/0"),
    ("redis://bob:Pw 1234-spaced@h/0?job=x", "redis://***@h/0?job=x"),
    ("redis://h/0?password=Pw 1234-spaced&job=x", "redis://h/0?password=***&job=x"),
    ("unix:///tmp/r.sock?password=Pw 1234-spaced", "unix:///tmp/r.sock?password=***"),
    # ... and what stays: an ACL user without its password, TLS files, a plain URL
    ("redis://ml-team:@h:6379/0", "redis://ml-team:@h:6379/0"),
    ("rediss://:pw@h/0?ssl_keyfile=/k/key.pem", "rediss://:***@h/0?ssl_keyfile=/k/key.pem"),
    ("redis://h:6379/0?job=a b", "redis://h:6379/0?job=a b"),
])
def test_a_store_name_is_redacted_as_one_url(url, shown):
    from commscope.store import redact_store

    assert redact_store(url) == shown


@pytest.mark.parametrize("world, query, every", [
    (None, "", 1 / 25_000), (8, "", 8 / 25_000), (1250, "", 0.05), (16_384, "", 16_384 / 25_000),
    (65_536, "", 1.0), (16_384, "?rate=100000", 16_384 / 100_000), (2, "?rate=1", 1.0),
])
def test_a_wide_job_writes_each_rank_less_often(redis_url, world, query, every):
    """A job's appends per second stay at most ``rate`` (25,000 by default): up to 1,250
    ranks write every tick (50 ms), 16,384 every ~0.66 s, none less than once a second."""
    w = open_writer(redis_url + query, "paced", 0, {"world_size": world} if world else None)
    assert w.write_every == pytest.approx(every)
    w.close()


# ---------------------------------------------------------------------------- layout
def test_key_layout_and_job_registry(redis_url):
    w = open_writer(redis_url, "j1", 0, {"world_size": 2})
    w.write(lines(0, 1, 4))
    open_writer(redis_url, "j1", 1).write(lines(1, 1, 2))
    c = redis_client(redis_url)
    assert c.type(Keys.stream("j1", 0)) == b"stream"
    assert [eid for eid, _ in c.xrange(Keys.stream("j1", 0))] == [b"0-1", b"0-2", b"0-3"]
    assert c.smembers(Keys.ranks("j1")) == {b"0", b"1"}
    assert c.get(Keys.meta("j1")) == b'{"world_size":2,"job":"j1"}'
    assert c.zrange(Keys.JOBS, 0, -1) == [b"j1"]
    assert [j for j, _ in list_jobs(redis_url)] == ["j1"]
    assert delete_job(redis_url, "j1") == 4
    assert c.keys(Keys.ALL) == []
    c.close()


def test_a_reader_says_a_stream_s_first_event(redis_url):
    """``TraceReader.first_event``: what a dead spool's run is judged against (helper-168)."""
    w = open_writer(redis_url, "firsts", 1, {"world_size": 2})
    w.write(lines(1, 1, 3))
    reader = open_reader(redis_url + "?job=firsts")
    assert reader.first_event((1, 0)) == E.decode(lines(1, 1, 2)[0])
    assert reader.first_event((0, 0)) is None and reader.first_event((1, 5)) is None
    reader.close()


def test_writer_takes_the_job_from_the_url(redis_url):
    w = open_writer(redis_url + "?job=fixed", "ignored", 0)
    w.write(lines(0, 1, 2))
    assert w.job == "fixed" and "job=fixed" in w.description
    assert open_reader(redis_url).job()["job"] == "fixed"


def test_a_forwarder_of_rank_0_leaves_the_jobs_metadata_as_rank_0_wrote_it(redis_url):
    """A forwarder of rank 0's spool opens its writer as ``spool.forward_dead`` does
    (``resume``, no metadata of its own).  Before, it opened as rank 0 and set the job's
    key to ``{"job": ...}`` alone: the world size and all rank 0 wrote were gone (a second
    launch's rank 0 refused under a reused id, its spool forwarded by the next ``check``,
    took the first launch's metadata away), and an old job became the newest.  Now it writes the key only where it is missing, as the directory store's
    forwarder never writes ``job.json``."""
    w = open_writer(redis_url, "j", 0, {"world_size": 2, "backend": "gloo"})
    w.write(lines(0, 1, 3))
    w.close()
    other = open_writer(redis_url, "k", 0, {"world_size": 1})  # (the newest job)
    other.close()
    forwarder = open_writer(redis_url, "j", 0, incarnation=0, resume=True, connect_timeout=2.0)
    forwarder.write(lines(0, 3, 4))
    forwarder.close()
    reader = open_reader(redis_url + "?job=j")
    assert reader.job() == {"world_size": 2, "backend": "gloo", "job": "j"}
    assert [e["id"] for e in reader.read_all()] == [1, 2, 3]  # (the forwarder wrote)
    assert [j for j, _ in list_jobs(redis_url)] == ["j", "k"]  # (oldest first: "k" still the newest)


# ---------------------------------------------------------------------------- trimming and gaps
def test_maxlen_trims_and_the_reader_says_so(redis_url):
    w = open_writer(redis_url + "?maxlen=100", "t", 0, {"world_size": 1})
    for a in range(1, 2001, 100):
        w.write(lines(0, a, a + 100))
    c = redis_client(redis_url)
    assert c.xlen(Keys.stream("t", 0)) < 400  # approximate trimming: whole macro nodes go
    reader = open_reader(redis_url)
    got = [e["id"] for e in reader.read_all()]
    assert got == list(range(got[0], 2001)) and got[0] > 1  # the newest, contiguous
    assert reader.stats.trimmed and reader.missing == {0: got[0] - 1}
    assert any("trimmed by maxlen" in m for m in reader.stats.warnings)
    assert reader.job()["maxlen"] == 100


def test_untrimmed_reader_reports_no_trimming(redis_url):
    open_writer(redis_url, "t", 0).write(lines(0, 1, 500))
    reader = open_reader(redis_url)
    assert len(reader.read_all()) == 499 and not reader.stats.trimmed and reader.missing == {}


def test_lost_entries_in_the_middle_are_counted(redis_url):
    w = open_writer(redis_url, "g", 0)
    w.write(lines(0, 1, 11))
    c = redis_client(redis_url)
    c.xdel(Keys.stream("g", 0), "0-4", "0-5")  # what a Redis without persistence may lose
    reader = open_reader(redis_url)
    assert [e["id"] for e in reader.read_all()] == [1, 2, 3, 6, 7, 8, 9, 10]
    assert reader.missing == {0: 2} and not reader.stats.trimmed
    assert any("#4-#5" in m for m in reader.stats.warnings)


def test_foreign_entries_are_counted_as_corrupt(redis_url):
    w = open_writer(redis_url, "f", 0)
    w.write(lines(0, 1, 3))
    c = redis_client(redis_url)
    c.xadd(Keys.stream("f", 0), {"something": "else"})  # an auto id ms-seq: not ours
    reader = open_reader(redis_url)
    assert [e["id"] for e in reader.read_all()] == [1, 2] and reader.stats.corrupt == 1
    with pytest.raises(StoreError) as info:  # and the writer refuses to append after it
        w.write(lines(0, 3, 4))
    assert "another process" in str(info.value) and info.value.written == 0


def test_foreign_members_of_the_jobs_set_are_passed_over(redis_url):
    """A member of commscope:jobs that is no job id (binary, or not a name commscope writes)
    is not a job: the reader opens the newest real one, list_jobs leaves it out (no traceback)."""
    open_writer(redis_url, "real", 0).write(lines(0, 1, 3))
    c = redis_client(redis_url)
    c.zadd(Keys.JOBS, {b"\xff\xfe": 1e18, b"a b/c": 1e18 + 1})
    c.close()
    reader = open_reader(redis_url)
    assert reader.job_name() == "real" and [e["id"] for e in reader.read_all()] == [1, 2]
    assert [j for j, _ in list_jobs(redis_url)] == ["real"]


def test_a_flush_without_a_restart_is_a_stated_loss_and_the_job_stays_findable(redis_url):
    """FLUSHDB (or DEL, eviction) while the writer stays connected: docs/redis.md's Faults say a
    flushed Redis gets a store_lost marker and the rank's meta again, as a restart does; the job
    is registered again, so readers still find it."""
    meta = E.encode({"v": 1, "type": "meta", "rank": 0, "ts": 1, "world_size": 1})
    w = open_writer(redis_url, "fl", 0, {"world_size": 1})
    w.write([meta] + lines(0, 1, 10))
    c = redis_client(redis_url)
    c.flushdb()
    c.close()
    w.write(lines(0, 10, 15))
    reader = open_reader(redis_url)
    got = reader.read_all()
    assert reader.job_name() == "fl" and reader.job()["world_size"] == 1
    # (ops 1-9 never ended: still in flight, stated again after the meta, then 10-14)
    assert [e["type"] for e in got[:2]] == ["dropped", "meta"] and [e["id"] for e in got[2:]] == list(range(1, 15))
    assert reader.missing == {0: 10} and any("lost by Redis" in m for m in reader.stats.warnings)


SPOOL_CHILD = """
import os, signal, sys
from commscope import events as E
from commscope.record.pyspool import PyRing
from commscope.store import open_writer, spool
url = sys.argv[1]
sp = spool.Spool.create({"job": "sp", "store_id": spool.store_id(url), "store": url, "rank": 1, "inc": 0,
                         "run": "?", "host": "h", "pid": os.getpid()}, ring=1 << 16)
ring = PyRing()
ring.attach(sp.fd)
meta = E.encode({"v": 1, "type": "meta", "rank": 1, "ts": 1, "world_size": 2})
ring.note_meta(meta)
w = open_writer(url, "sp", 1, {"world_size": 2})
w.write([meta] + [E.encode({"v": 1, "type": "heartbeat", "rank": 1, "ts": 10 + i}) for i in range(4)])
sp.set_flag(spool.META_STORED)
sp.note_stored(w.stored)  # (what the recorder notes after each write)
ring.keep_event(E.encode({"v": 1, "type": "heartbeat", "rank": 1, "ts": 99}))  # its last write failed
print(sp.path, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


NEVER_CHILD = """
import os, signal, sys
from commscope import events as E
from commscope.record.pyspool import PyRing
from commscope.store import spool
url, job, ts = sys.argv[1], sys.argv[2], int(sys.argv[3])
sp = spool.Spool.create({"job": job, "store_id": spool.store_id(url), "store": url, "rank": 0, "inc": 0,
                         "run": "?", "host": "h", "pid": os.getpid()}, ring=1 << 16)
ring = PyRing()
ring.attach(sp.fd)
ring.note_meta(E.encode({"v": 1, "type": "meta", "rank": 0, "ts": ts, "world_size": 1}))
for i in range(3):  # (its store refused it all along: every record waits in the spool)
    ring.keep_event(E.encode({"v": 1, "type": "heartbeat", "rank": 0, "ts": ts + i + 1}))
print(sp.path, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_job_that_never_reached_redis_is_read_as_the_newest_of_its_time_beside_other_jobs(redis_url):
    """A job whose ranks never reached Redis (full, a wrong password) waits in their spools;
    the next reader on the host forwards it, whether or not the store holds other jobs
    (helper-163: check read the job before it, "healthy"), and it takes its place among the
    jobs by its ranks' start, not by the forward (a later run's launcher that forwarded it
    made it the newest: its hint then showed the earlier run)."""
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from commscope.store import spool

    def never(job: str, ts: int) -> Path:
        p = subprocess.run([sys.executable, "-c", NEVER_CHILD, redis_url, job, str(ts)], capture_output=True,
                           text=True)
        assert p.returncode == -signal.SIGKILL, p.stderr
        return Path(p.stdout.strip())

    def newest() -> str:
        reader = open_reader(redis_url)
        try:
            return reader.job_id
        finally:
            reader.close()

    older = open_writer(redis_url, "older", 0, job_meta={"world_size": 1})
    older.write(lines(0, 1, 2))
    older.close()
    paths = [never("unsent", time.time_ns())]  # (after "older" began)
    try:
        assert newest() == "unsent"
        got = open_reader(redis_url + "?job=unsent").read_all()
        assert [e["type"] for e in got] == ["meta", "heartbeat", "heartbeat", "heartbeat", "exit"], got
        paths.append(never("forgot", time.time_ns()))
        later = open_writer(redis_url, "later", 0, job_meta={"world_size": 1})  # (begun after "forgot")
        later.write(lines(0, 1, 2))
        assert newest() == "later"  # ("forgot" forwarded by this reader, dated before "later")
        assert [e["type"] for e in open_reader(redis_url + "?job=forgot").read_all()][:2] == ["meta", "heartbeat"]
        look = redis_client(redis_url)
        before = look.xlen(Keys.stream("later", 0))
        paths.append(never("other", time.time_ns()))
        pinned = open_reader(redis_url + "?job=later")  # (a reader of one job: another's spool to its own)
        pinned.close()
        assert look.xlen(Keys.stream("later", 0)) == before  # (helper-164: it went into "later")
        look.close()
        assert [e["type"] for e in open_reader(redis_url + "?job=other").read_all()][:2] == ["meta", "heartbeat"]
        later.close()
    finally:
        for path in paths:
            spool._remove(path)


def test_a_forwarder_dates_the_job_it_put_in_the_index_but_never_undoes_its_lead(redis_url):
    """``date_job`` comes before the forward's write (a write that fails leaves the job dated
    by its rank's start all the same), and moves only the forwarder's own score: rank 0
    registering meanwhile as the job's lead keeps its time (helper-164)."""
    look = redis_client(redis_url)
    w = RedisWriter(redis_url, "fwd", 1, resume=True)
    w.date_job(1_700_000_000 * 10**9)
    assert look.zscore(Keys.JOBS, "fwd") == 1_700_000_000 * 10**6
    w.close()
    w = RedisWriter(redis_url, "raced", 1, resume=True)  # (put in the index at the forward's time)
    lead = RedisWriter(redis_url, "raced", 0, {"world_size": 2})  # (rank 0 opening: the job's lead, its time)
    said = look.zscore(Keys.JOBS, "raced")
    w.date_job(1_700_000_000 * 10**9)
    assert look.zscore(Keys.JOBS, "raced") == said != 1_700_000_000 * 10**6
    w.close()
    lead.close()
    look.close()


def test_forwarding_tries_a_store_that_will_not_open_once_a_job(redis_url, monkeypatch):
    """A store that will not open (down, full, a user that may not write) was tried again for
    each dead spool of the job at every reader's open: one try a job and pass (helper-164:
    65 connections for 64 spools)."""
    import signal
    import subprocess
    import sys
    from pathlib import Path

    import commscope.store as store_module
    from commscope.store import spool

    paths = []
    for _ in range(3):
        p = subprocess.run([sys.executable, "-c", NEVER_CHILD, redis_url, "many", str(time.time_ns())],
                           capture_output=True, text=True)
        assert p.returncode == -signal.SIGKILL, p.stderr
        paths.append(Path(p.stdout.strip()))
    tries = []

    def refused(*args, **kwargs):
        tries.append(args)
        raise StoreError("cannot connect to redis://h:1/0: connection refused")

    monkeypatch.setattr(store_module, "open_writer", refused)
    try:
        assert spool.forward_orphans(only=spool.store_id(redis_url)) == 0
        assert len(tries) == 1, tries
        monkeypatch.undo()
        assert spool.forward_orphans(only=spool.store_id(redis_url)) == 3  # (all three, once it opens)
    finally:
        for path in paths:
            spool._remove(path)


def test_run_refuses_a_redis_its_ranks_could_never_write_before_the_job_runs(tmp_path, redis_cluster_url):
    """A wrong password, a cluster node named with database 1, a database the server lacks:
    each rank found it while the job ran unrecorded, and the launcher's hint then pointed at
    a failing check (helper-163).  Now ``run`` says it and exits 2 before running the
    command; a server that does not answer now is the ranks' to retry, and the command
    runs; so does a job id the store holds (another node of the job names it too: helper-164),
    by ``?job=`` or ``--job``."""
    import subprocess
    import sys

    from redis_fixture import require_redis_server

    require_redis_server()

    def run(url: str) -> tuple[int, str, bool]:
        ran = tmp_path / "ran"
        ran.unlink(missing_ok=True)
        p = subprocess.run([sys.executable, "-m", "commscope", "run", "--store", url, "--", "touch", str(ran)],
                           capture_output=True, text=True, timeout=120)
        return p.returncode, p.stderr, ran.exists()

    with RedisServer(password="s3cretPW", data_dir=tmp_path / "r") as server:
        server.start()
        w = open_writer(server.url + "?job=pinned1", "x", 0, job_meta={"world_size": 1})
        w.write(lines(0, 1, 2))
        w.close()
        shown = server.url.replace(":s3cretPW@", ":***@")
        for url, said in (
                (server.url.replace(":s3cretPW@", ":wrong@"), f"cannot log in to {shown}: wrong password or user name"),
                (server.url.replace("/0", "/99"), f"cannot use {shown[:-2]}/99: no database 99 on that server"),
                (redis_cluster_url.replace("/0", "/1"), "it is a Redis Cluster node, and a cluster has only database 0")):
            code, err, ran = run(url)
            assert code == 2 and said in err and not ran, err
            assert "s3cretPW" not in err
        for url in (server.url + "?job=fresh", server.url + "?job=pinned1"):
            code, err, ran = run(url)
            assert code == 0 and ran, err
        ran = tmp_path / "ran"
        ran.unlink()
        p = subprocess.run([sys.executable, "-m", "commscope", "run", "--store", server.url, "--job", "pinned1", "--",
                            "touch", str(ran)], capture_output=True, text=True, timeout=120)
        assert p.returncode == 0 and ran.exists(), p.stderr
    code, err, ran = run(server.url)  # (stopped: not answering now)
    assert code == 0 and ran and "recording to" in err, err


def _op(i: int, phase: str, ts: int, **kw) -> bytes:
    return E.encode({"v": 1, "type": "op", "rank": 0, "ts": ts, "phase": phase, "id": i, **kw})


def _all_reduce(i: int, ts: int) -> bytes:
    return _op(i, "begin", ts, op="all_reduce", group="0", seq=i, in_shapes=[[4]], in_dtypes=["float32"], bytes=16)


def _stream(url: str, job: str) -> list[dict]:
    c = redis_client(url)
    try:
        return [E.decode(f[b"e"]) for _, f in c.xrange(Keys.stream(job, 0))]
    finally:
        c.close()


@pytest.mark.parametrize("marks", ["child", "inline"])
def test_a_flush_restates_the_ops_in_flight_and_no_op_as_in_flight_that_ended(redis_url, marks):
    """After a flush the writer states what the rank was in (a mark's carry: store/inflight.py),
    replayed from the newest mark it knows and what it wrote after: the op still in flight,
    the last one done with its end (never as in flight), nothing the writer never wrote."""
    meta = E.encode({"v": 1, "type": "meta", "rank": 0, "ts": 1, "world_size": 1})
    w = RedisWriter(redis_url, "rs", 0, {"world_size": 1}, marks=marks, mark_every_s=1e-9)
    w.write([meta, _all_reduce(1, 10), _op(1, "end", 11), _all_reduce(2, 12), _op(2, "end", 13)])
    if marks == "child":  # (the child's mark read back at the next write, once it is done)
        w._marker.wait(60)
    w.write([_all_reduce(3, 14), _op(3, "end", 15), _all_reduce(4, 16)])  # (after a mark: the base moved on)
    if marks == "child":
        w._marker.wait(60)
    follower = open_reader(redis_url)
    followed = follower.poll()
    c = redis_client(redis_url)
    c.flushdb()
    c.close()
    w.write([E.encode({"v": 1, "type": "heartbeat", "rank": 0, "ts": 20}), _all_reduce(5, 21)])
    followed += follower.poll()  # (a live reader that read them before reads no begin twice)
    assert [e["id"] for e in followed if e["type"] == "op" and e["phase"] == "begin"] == [1, 2, 3, 4, 5]
    assert any(e["type"] == "dropped" and "store_lost" in e["reason"] for e in followed)  # (the loss, said)
    got = _stream(redis_url, "rs")
    assert [e["type"] for e in got[:2]] == ["dropped", "meta"] and "store_lost" in got[0]["reason"]
    ops = [(e["id"], e["phase"]) for e in got if e["type"] == "op"]
    # (the last done of its group with its end, the op in flight; then what came after)
    assert ops == [(3, "begin"), (3, "end"), (4, "begin"), (5, "begin")]
    assert got[-2]["type"] == "heartbeat"
    reader = open_reader(redis_url)
    assert [e["id"] for e in reader.read_all() if e["type"] == "op" and e["phase"] == "begin"] == [3, 4, 5]


def test_a_gap_left_by_skip_restates_nothing_and_keeps_what_the_rank_is_in(redis_url):
    """``skip`` (a copy of a trimmed source) leaves entry numbers unused behind a marker: nothing
    vanished from the stream, so nothing is restated there, and a later flush still restates
    the ops in flight from before it and after it."""
    meta = E.encode({"v": 1, "type": "meta", "rank": 0, "ts": 1, "world_size": 1})
    w = RedisWriter(redis_url, "sk", 0, {"world_size": 1})  # (child marks, none due: 5 minutes)
    w.write([meta, _all_reduce(1, 10)])
    w.skip(3, "trimmed at the source")
    w.write([_all_reduce(2, 11)])
    got = _stream(redis_url, "sk")
    assert [e.get("id") for e in got if e["type"] == "op"] == [1, 2]  # (no op stated at the skip)
    c = redis_client(redis_url)
    c.flushdb()
    c.close()
    w.write([E.encode({"v": 1, "type": "heartbeat", "rank": 0, "ts": 20})])
    got = _stream(redis_url, "sk")
    assert [(e["id"], e["phase"]) for e in got if e["type"] == "op"] == [(1, "begin"), (2, "begin")]


def test_a_lost_reply_to_the_loss_s_statement_states_it_once(redis_url):
    """The connection drops after Redis appended the marker and the restatement but before
    the writer heard so: the next write settles that statement (it landed), instead of taking
    it for the caller's events (counted in ``stored_after_drop``) and stating it again."""
    meta = E.encode({"v": 1, "type": "meta", "rank": 0, "ts": 1, "world_size": 1})
    w = RedisWriter(redis_url, "ls", 0, {"world_size": 1})
    w.write([meta, _all_reduce(1, 10)])
    real_run = w._nodes.run

    def run(key, payload, *args):
        reply = real_run(key, payload, *args)
        if b"store_lost" in payload:  # Redis did it, and the reply never comes
            w._nodes.run = real_run
            w._nodes.close()
            raise ConnectionResetError(104, "Connection reset by peer")
        return reply

    w._nodes.run = run
    c = redis_client(redis_url)
    c.flushdb()
    c.close()
    w.write([_all_reduce(2, 11)])
    got = _stream(redis_url, "ls")
    assert [e["type"] for e in got].count("dropped") == 1
    assert [(e["id"], e["phase"]) for e in got if e["type"] == "op"] == [(1, "begin"), (2, "begin")]
    assert w.stored_after_drop == 0


def test_a_writer_told_not_to_restate_keeps_nothing(redis_url):
    """``restate=False`` (a process writing thousands of simulated ranks: bench scale) keeps no
    line, and a loss states the marker and the meta only, as before."""
    meta = E.encode({"v": 1, "type": "meta", "rank": 0, "ts": 1, "world_size": 1})
    w = RedisWriter(redis_url, "nr", 0, {"world_size": 1}, restate=False)
    w.write([meta, _all_reduce(1, 10)])
    assert not w._kept and w._kept_bytes == 0
    c = redis_client(redis_url)
    c.flushdb()
    c.close()
    w.write([_all_reduce(2, 11)])
    assert [e["type"] for e in _stream(redis_url, "nr")] == ["dropped", "meta", "op"]


def test_a_replica_that_lacked_the_newest_writes_has_only_what_it_lacked_restated(redis_url):
    """Redis still holds the stream up to some entry (a failover to a replica that lacked the
    newest writes; here XDEL of the newest entries): an op whose begin it still holds is not
    stated twice (an id begun twice reads as reused), one whose begin it lost is."""
    meta = E.encode({"v": 1, "type": "meta", "rank": 0, "ts": 1, "world_size": 1})
    w = RedisWriter(redis_url, "rp", 0, {"world_size": 1})  # (child marks, none due: a loss before the first)
    w.write([meta, _all_reduce(1, 10)])  # entries 1-2: op 1 in flight (an async op: its wait comes later)
    w.write([_op(5, "begin", 11, op="send", group="0", peer=1, dir="send", seq=1), _op(1, "end", 12)])  # 3-4
    c = redis_client(redis_url)
    c.xdel(Keys.stream("rp", 0), "0-3", "0-4")
    c.close()
    w.write([E.encode({"v": 1, "type": "heartbeat", "rank": 0, "ts": 20})])
    got = _stream(redis_url, "rp")
    begins = [e["id"] for e in got if e["type"] == "op" and e["phase"] == "begin"]
    assert begins == [1, 5], got  # (op 1's begin once; op 5's again, after the marker)
    after = got[[e["type"] for e in got].index("dropped"):]
    assert [(e["id"], e["phase"]) for e in after if e["type"] == "op"] == [(1, "end"), (5, "begin")]


def test_a_spool_forwarded_into_a_redis_that_lost_the_stream_states_the_loss(redis_url):
    """A rank whose last write failed (Redis down) dies; Redis comes back empty; the forwarder
    of its spool must not pass the remnant off as the whole stream: the entries the rank had
    stored are counted as lost by Redis, its meta stated again."""
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from commscope.store import spool

    p = subprocess.run([sys.executable, "-c", SPOOL_CHILD, redis_url], capture_output=True, text=True)
    assert p.returncode == -signal.SIGKILL, p.stderr
    path, pid = Path(p.stdout.strip()), int(Path(p.stdout.strip()).name.split("-")[0])
    assert spool.read(path).stored == 5
    c = redis_client(redis_url)
    c.flushdb()  # Redis restarted without persistence while the rank was gone
    c.close()
    try:
        assert spool.forward_orphans(exit_status={pid: -signal.SIGKILL}.get, only=spool.store_id(redis_url)) == 1
    finally:
        spool._remove(path)
    reader = open_reader(redis_url + "?job=sp")
    got = reader.read_all()
    assert [e["type"] for e in got][:2] == ["dropped", "meta"] and got[-1]["type"] == "exit"
    assert reader.missing == {1: 5} and any("lost by Redis" in m for m in reader.stats.warnings)


def test_the_open_s_bound_is_for_opening_only(redis_url):
    """The recorder opens its writer inside init_process_group with a short bound
    (connect_timeout); once a write went through, replies get the URL's own timeout, and
    messages show the URL as given (no timeout= the user never wrote)."""
    w = open_writer(redis_url + "?timeout=30", "to", 0, {"world_size": 1}, connect_timeout=2.0)
    assert "timeout=30" in w.description and w.target.timeout == 2.0  # (opening: bounded)
    w.write(lines(0, 1, 3))
    assert w.target.timeout == 30.0
    assert all(c.t.timeout == 30.0 and c.sock.gettimeout() == 30.0 for c in w._nodes._conns.values())
    w.close()


# ---------------------------------------------------------------------------- faults
def test_killed_connection_is_replaced_without_an_error(redis_url):
    w = open_writer(redis_url, "k", 0)
    w.write(lines(0, 1, 100))
    c = redis_client(redis_url)
    assert c.client_kill_filter(_type="normal", skipme=True) >= 1  # e.g. an idle timeout
    w.write(lines(0, 100, 200))  # reconnects by itself: no StoreError
    assert [i for _, i in stored_ids(redis_url, "k", 0)] == list(range(1, 200))


def test_a_deadline_cuts_every_wait_of_a_write_short(tmp_path):
    """A last write (at exit, at a new incarnation) has what is left of its time: a Redis
    that stopped answering (SIGSTOP: it accepts, it never replies) holds it no longer, whatever
    the URL's reply timeout (600 s here), the reconnect included, and the error says so."""
    server = RedisServer(data_dir=tmp_path / "r").start()
    try:
        w = open_writer(server.url + "?timeout=600", "dl", 0)
        w.write(lines(0, 1, 10))
        os.kill(server.proc.pid, signal.SIGSTOP)
        try:
            w.set_deadline(time.monotonic() + 0.3)
            with pytest.raises(StoreError) as info:
                w.write(lines(0, 10, 20))
            w.set_deadline(None)
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
        assert info.value.written == 0
        assert "no answer within 0.3 s, the time it had" in str(info.value)
        w.write(lines(0, 10, 20))  # Redis answers again: what was in flight is settled, nothing twice
        assert [i for _, i in stored_ids(server.url, "dl", 0)] == list(range(1, 20))
        w.close()
    finally:
        server.close()


def test_an_interrupted_thread_s_write_gives_up_at_once(tmp_path):
    """The recorder thread's store I/O runs in an ``Interruptible``: whoever must not wait for
    it (a new incarnation's attach, ``uninstrument``) ends the wait on a Redis that stopped
    answering at once, and the writer counts nothing it did not store as stored."""
    server = RedisServer(data_dir=tmp_path / "r").start()
    try:
        w = open_writer(server.url + "?timeout=600", "it", 0)
        w.write(lines(0, 1, 10))
        os.kill(server.proc.pid, signal.SIGSTOP)
        scope = Interruptible()
        result: dict[str, int] = {}

        def write():
            with scope:
                try:
                    w.write(lines(0, 10, 20))
                except StoreError as exc:
                    result["written"] = exc.written

        thread = threading.Thread(target=write)
        try:
            thread.start()
            until = time.monotonic() + 60
            while not len(scope._conns) and thread.is_alive() and time.monotonic() < until:
                time.sleep(0.01)  # (until it waits on the stopped server)
            scope.interrupt()
            thread.join(60)
            assert not thread.is_alive() and result == {"written": 0}
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
            thread.join()
        w.write(lines(0, 10, 20))  # (outside the scope: nothing cut)
        assert [i for _, i in stored_ids(server.url, "it", 0)] == list(range(1, 20))
        w.close()
    finally:
        server.close()


class _LoseReplyOnce:
    """Wrap the writer's connection: the next reply is lost after Redis executed the command."""

    def __init__(self, writer: RedisWriter, then_unreachable: bool = False):
        self.writer = writer
        self.conn = writer._nodes.conn(writer.key)
        self.then_unreachable = then_unreachable
        real_read = self.conn.read

        def read():
            real_read()  # Redis did the work ...
            self.conn.read = real_read
            self.conn.close()
            raise ConnectionResetError(104, "Connection reset by peer")  # ... but we never hear of it

        self.conn.read = read
        if then_unreachable:
            real_reconnect = writer._reconnect

            def reconnect():
                writer._reconnect = real_reconnect
                raise StoreError("cannot connect to redis://...: connection refused")

            writer._reconnect = reconnect


def test_lost_reply_is_settled_at_once_when_redis_answers(redis_url):
    w = open_writer(redis_url, "lr", 0)
    w.write(lines(0, 1, 10))
    _LoseReplyOnce(w)
    w.write(lines(0, 10, 20))  # the batch landed; the writer reconnects, sees it, does not resend
    assert [i for _, i in stored_ids(redis_url, "lr", 0)] == list(range(1, 20))


@pytest.mark.parametrize("recorder_dropped", [0, 3, 10, 12])
def test_lost_reply_while_redis_is_unreachable_is_settled_next_time(redis_url, recorder_dropped):
    w = open_writer(redis_url, "lu", 0)
    w.write(lines(0, 1, 10))
    batch = lines(0, 10, 20)
    _LoseReplyOnce(w, then_unreachable=True)
    with pytest.raises(StoreError) as info:
        w.write(batch)
    assert info.value.written == 0  # unknown yet: the recorder keeps all of it
    # The recorder retries with what it still holds (maybe minus its oldest events, dropped
    # because its buffer filled up meanwhile) plus newer events.
    w.write((batch + lines(0, 20, 25))[recorder_dropped:])
    # The batch had landed: stored once.  Of the newer events only those the recorder
    # dropped (and counted) are missing.
    expect = list(range(1, 20)) + list(range(20 + max(0, recorder_dropped - 10), 25))
    stored = stored_ids(redis_url, "lu", 0)
    assert [i for _, i in stored] == expect
    assert [eid for eid, _ in stored] == [b"0-%d" % k for k in range(1, len(expect) + 1)]
    # Events the recorder counted as dropped although they had landed: known exactly.
    assert w.stored_after_drop == min(recorder_dropped, 10)


def test_batch_that_never_landed_is_sent_again(redis_url):
    w = open_writer(redis_url, "nl", 0)
    w.write(lines(0, 1, 5))
    batch = lines(0, 5, 9)
    conn = w._nodes.conn(w.key)
    real_send = conn.send

    def send_fails(data):
        conn.send = real_send
        conn.close()
        raise BrokenPipeError(32, "Broken pipe")

    def unreachable():
        raise StoreError("cannot connect: connection refused")

    conn.send = send_fails
    w._reconnect = unreachable
    with pytest.raises(StoreError) as info:
        w.write(batch)
    assert info.value.written == 0
    del w._reconnect
    w.write(batch)
    assert [i for _, i in stored_ids(redis_url, "nl", 0)] == list(range(1, 9))


def test_server_down_at_open_and_back_later(tmp_path):
    server = RedisServer(data_dir=tmp_path / "r")
    server.start()
    url = server.url
    server.stop()
    try:
        with pytest.raises(StoreError, match="connection refused"):
            open_writer(url, "d", 0)
        with pytest.raises(StoreError, match="connection refused"):
            open_reader(url)
        server.start()
        w = open_writer(url, "d", 0)
        w.write(lines(0, 1, 50))
        server.stop()
        with pytest.raises(StoreError) as info:
            w.write(lines(0, 50, 60))
        assert info.value.written == 0
        server.start()  # no persistence: the first 49 are gone, the writer goes on numbering
        w.write(lines(0, 50, 60))
        reader = open_reader(url + "?job=d")
        follower = open_reader(url + "?job=d")
        got = reader.read_all()
        # (ops 1-49 never ended: still in flight, stated again after the marker, then 50-59)
        assert [e["id"] for e in got if e["type"] == "op"] == list(range(1, 60))
        # the gap is reported, not hidden, with its true cause: the writer found it on reconnecting
        assert [e["entries"] for e in got if e["type"] == "dropped"] == [49]
        assert reader.missing == {0: 49} and not reader.stats.trimmed
        assert any("49 stream entries (#1-#49) were lost by Redis" in m for m in reader.stats.warnings)
        server.stop()
        with pytest.raises(StoreError, match="cannot (read|connect)"):  # a partial read must not pass
            reader.read_all()
        assert follower.poll() == [] and any("still trying" in m for m in follower.stats.warnings)
        server.start()
        w.write(lines(0, 60, 61))
        # the live reader carries on: Redis lost everything again, so it reads the ops still in
        # flight as the writer restated them (it read none of them before), then 60
        assert [e["id"] for e in follower.poll() if e["type"] == "op"] == list(range(1, 61))
    finally:
        server.close()


def test_two_writers_for_one_rank_cannot_interleave(redis_url):
    a = open_writer(redis_url, "two", 0)
    b = open_writer(redis_url, "two", 0)  # opened before a wrote: the mixing check cannot see it
    a.write(lines(0, 1, 5))
    with pytest.raises(StoreError, match="another process"):
        b.write(lines(0, 100, 105))
    assert [i for _, i in stored_ids(redis_url, "two", 0)] == [1, 2, 3, 4]


def test_reader_poll_survives_a_lost_connection(redis_url):
    w = open_writer(redis_url, "p", 0)
    w.write(lines(0, 1, 3))
    reader = open_reader(redis_url)
    assert len(reader.poll()) == 2
    c = redis_client(redis_url)
    c.client_kill_filter(_type="normal", skipme=True)
    w.write(lines(0, 3, 5))
    first = reader.poll()  # may notice the dead connection and return nothing this time
    rest = reader.poll()
    assert [e["id"] for e in first + rest] == [3, 4]


def test_wrong_password_is_one_clear_error(tmp_path):
    secret = "Tr0ub4dor-and-3"
    with RedisServer(password=secret, data_dir=tmp_path / "r") as server:
        server.start()
        good = server.url
        wrong = good.replace(secret, "not-the-password")
        for url in (wrong, good.replace(f":{secret}@", "")):
            for opener in (lambda u: open_writer(u, "j", 0), open_reader):
                with pytest.raises(RedisAuthError) as info:
                    opener(url)
                text = str(info.value)
                assert "cannot log in" in text and secret not in text and "not-the-password" not in text
        w = open_writer(good, "j", 0)
        w.write(lines(0, 1, 3))
        r = open_reader(good)
        for obj in (w, r):
            assert secret not in repr(obj) and secret not in obj.description
        assert len(r.read_all()) == 2


def test_meta_event_never_stores_the_password(redis_url):
    """Even a URL quoted inside an argv entry, for a password the writer does not know."""
    url = redis_url.replace("redis://", "redis://:pw-in-argv-1234@")
    w = RedisWriter(redis_url, "m", 0)
    meta = {"type": "meta", "ts": 1, "argv": ["train.py", f"--store={url}"], "store": redact(url), "v": 1,
            "rank": 0}
    w.write([E.encode(meta), E.encode(ev(0, 1, site="a://b@c"))])
    c = redis_client(redis_url)
    raw = [f[b"e"] for _, f in c.xrange(Keys.stream("m", 0))]
    assert b"pw-in-argv-1234" not in raw[0] and b"--store=redis://:***@127.0.0.1" in raw[0]
    assert raw[1] == E.encode(ev(0, 1, site="a://b@c"))  # only meta events are touched


def test_unix_socket_url(tmp_path):
    sock = tmp_path / "r.sock"
    with RedisServer(data_dir=tmp_path / "r", extra={"unixsocket": str(sock), "unixsocketperm": "700"}) as server:
        server.start()
        url = f"unix://{sock}?db=2"
        open_writer(url, "u", 0, {"world_size": 1}).write(lines(0, 1, 4))
        reader = open_reader(url)
        assert [e["id"] for e in reader.read_all()] == [1, 2, 3]
        assert reader.description == f"unix://{sock}?db=2&job=u"
        assert redis_client(f"redis://127.0.0.1:{server.port}/2").xlen(Keys.stream("u", 0)) == 3


def test_a_member_is_a_stream_only_as_the_writer_spells_it():
    """"03", "3+0" and "٣" were rank 3 too (its stream listed twice); "²" raised in int()."""
    from commscope.store.redis_keys import Keys

    for rank, inc in ((0, 0), (3, 0), (3, 1), (12_345_678, 0), (7, 999_999)):
        assert Keys.parse_member(Keys.member(rank, inc)) == (rank, inc)
        assert Keys.parse_member(Keys.member(rank, inc).encode()) == (rank, inc)
    for other in ("03", "3+0", "3+01", "٣", "²", "3\n", "123456789", "3+1234567", "", "+1", "-3"):
        assert Keys.parse_member(other) is None, other


def test_a_redis_that_evicts_keys_when_full_is_said(redis_url):
    """A Redis whose maxmemory-policy is allkeys-* drops a trace's keys whole when full (a job's
    index keys first: helper h203 saw 'no job' over the surviving streams, the loss said nowhere):
    a reader says so, and 'no job' says the job's keys may have been evicted."""
    open_writer(redis_url, "ev", 0).write(lines(0, 1, 3))
    c = redis_client(redis_url)
    old = c.config_get("maxmemory-policy")["maxmemory-policy"]
    try:
        assert not [w for w in open_reader(redis_url).stats.warnings if "maxmemory-policy" in w]
        c.config_set("maxmemory-policy", "allkeys-lru")
        reader = open_reader(redis_url)
        assert [e["id"] for e in reader.read_all()] == [1, 2]
        assert [w for w in reader.stats.warnings if "evicts keys when full (maxmemory-policy allkeys-lru)" in w]
        with pytest.raises(StoreError, match=r"no job 'gone' .*allkeys-lru\): the job's keys may have been evicted"):
            open_reader(redis_url.split("?")[0] + "?job=gone")
        c.config_set("maxmemory-policy", "volatile-lru")  # (commscope's keys have no expiry: not evicted)
        assert not [w for w in open_reader(redis_url).stats.warnings if "maxmemory-policy" in w]
    finally:
        c.config_set("maxmemory-policy", old)
        c.close()


def test_a_foreign_entry_at_the_largest_stream_id_leaves_the_rest_readable(redis_url):
    """An entry 0-18446744073709551615 that commscope never writes (the largest id a stream
    can hold): the read pages past it without asking Redis for an id after the largest (which
    it refuses, 'Invalid stream ID', and the whole job was unreadable); the entry is counted
    as what it is, never read as an event."""
    open_writer(redis_url, "big", 0).write(lines(0, 1, 4))
    c = redis_client(redis_url)
    c.xadd(Keys.stream("big", 0), {"e": b"not an event"}, id=b"0-18446744073709551615")
    c.close()
    reader = open_reader(redis_url)
    assert [e["id"] for e in reader.read_all() if e["type"] == "op"] == [1, 2, 3]
    assert reader.stats.corrupt + reader.stats.invalid == 1 and not reader.stats.missing_by_rank  # (no gap of 1.8e19)


def test_a_writer_on_a_redis_that_evicts_warns_at_open_and_sets_the_jobs_index_again(tmp_path):
    """A Redis with maxmemory and an LRU policy, filled while a rank writes: it drops the job's
    index keys (written once, idle) before the rank's stream, written all along; a reader then
    found "no job" beside it.  The writer says at open that this Redis evicts (once), and
    sets the index again every ``refresh_every`` seconds: the next write past it brings the job
    back, every event still read.  A Redis that does not evict gets no warning, no refresh."""
    from redis_fixture import require_redis_server

    require_redis_server()
    with RedisServer(data_dir=tmp_path / "plain") as plain:
        plain.start()
        w = open_writer(plain.url, "calm", 0, job_meta={"world_size": 1})
        assert w.warning is None and w._refreshed is None
        w.close()
    with RedisServer(data_dir=tmp_path / "lru", extra={"maxmemory": "4mb", "maxmemory-policy": "allkeys-lru"}) as server:
        server.start()
        w = open_writer(server.url, "long", 0, job_meta={"world_size": 16_384})
        assert w.warning and "evicts keys when full (maxmemory-policy allkeys-lru)" in w.warning
        assert w.refresh_every == 16_384 / RedisWriter.REFRESH_RATE  # (the job's ranks: 10 refreshes a second)
        w.refresh_every = 3600.0  # (the index as it was: set once at open)
        w.write(lines(0, 1, 3))
        c = redis_client(server.url)
        index = [Keys.meta("long"), Keys.ranks("long"), Keys.JOBS]
        n, filler = 0, b"x" * 65_536
        while c.exists(*index[:2]):  # fill it, the rank writing on, until the job's index is evicted
            c.set(f"filler:{n}", filler)
            n += 1
            if n % 8 == 0:
                w.write(lines(0, 2 + n // 8, 3 + n // 8))
            assert n < 100_000, "Redis never evicted the job's index"
        written = 2 + n // 8 + 1
        # (its stream, written all along, is evicted last, but LRU is approximate: it may have
        # gone too, a loss the writer states at its next write)
        with pytest.raises(StoreError, match="evicted"):
            open_reader(server.url + "?job=long")
        c.delete(*[f"filler:{i}" for i in range(n)])  # (room again)
        w.refresh_every = 0.0
        w.write(lines(0, written, written + 1))
        assert c.exists(*index) == 3  # (this rank's member of the set of streams, the metadata, the job's row)
        reader = open_reader(server.url)
        assert reader.job_id == "long" and reader.ranks() == [(0, 0)]
        got = [e["id"] for e in reader.read_all() if e["type"] == "op"]
        # every op (read, or its begin stated again after the loss of what eviction took too: they
        # are all in flight), and the loss said with its cause
        assert sorted(set(got)) == list(range(1, written + 1)), got
        lost = reader.stats.missing_by_rank.get(0, 0)
        assert (lost > 0) == any("were lost by Redis (gone when the rank reconnected" in m for m in reader.stats.warnings)
        c.close()
        w.close()


def test_a_writer_on_a_redis_too_small_for_its_job_s_ranks_warns_at_open_and_a_full_one_says_what_to_change(
        tmp_path):
    """Each rank holds a connection: a Redis of ``maxclients`` 32 takes the writers of 28 ranks
    with an eighth spare (for consoles, ranks starting again), so a job of 29 is warned at
    open, once, with the evicting warning where both hold; a rank or console that then finds
    it full is told what to change."""
    from redis_fixture import require_redis_server

    require_redis_server()
    with RedisServer(data_dir=tmp_path / "r", extra={"maxclients": 32, "maxmemory": "64mb",
                                                    "maxmemory-policy": "allkeys-lru"}) as server:
        server.start()
        w = open_writer(server.url, "fits", 0, job_meta={"world_size": 28})
        assert "evicts keys" in w.warning and "maxclients" not in w.warning, w.warning
        w.close()
        w = open_writer(server.url, "wide", 0, job_meta={"world_size": 29})
        first, second = w.warning.split("\n")
        assert "evicts keys when full" in first
        assert second == (f"commscope: {server.url} takes 32 clients a master (maxclients), and this job puts 29 "
                          "ranks on it, a connection each: too few are left for consoles and ranks starting again; "
                          "raise maxclients to 34 or more (and Redis's open files: ulimit -n)")
        held = filled(server)
        try:
            for opening, url in ((lambda: open_writer(server.url, "wide", 1, job_meta={"world_size": 29}), server.url),
                                 (lambda: open_reader(server.url + "?job=wide"), server.url + "?job=wide")):
                with pytest.raises(StoreError) as e:
                    opening()
                assert str(e.value) == (
                    f"cannot use {url}: Redis said: ERR max number of clients reached (it holds as many "
                    "connections as its maxclients: a wide job's ranks hold one each; raise maxclients in its "
                    "config, and the open files it may use: ulimit -n)")
        finally:
            for s in held:
                s.close()
        w.close()


def test_a_writer_on_a_redis_other_clients_fill_warns_at_open(tmp_path):
    """Other jobs or consoles may fill a Redis a narrow job fits: past 15/16 of its
    ``maxclients`` in clients (the writer's own among them) a rank warns at open."""
    from redis_fixture import require_redis_server

    require_redis_server()
    with RedisServer(data_dir=tmp_path / "r", extra={"maxclients": 32}) as server:
        server.start()
        held = filled(server)
        try:
            for s in held[:2]:  # (room for the writer and one more: 31 clients with it, past 30)
                s.close()
            held = held[2:]
            look = redis_client(server.url)
            wait_until = time.monotonic() + 60
            while look.info("clients")["connected_clients"] != 31:  # (Redis saw the two go; this one came)
                assert time.monotonic() < wait_until, look.info("clients")
                time.sleep(0.01)
            look.close()
            w = open_writer(server.url, "crowd", 0, job_meta={"world_size": 2})
            assert w.warning == (f"commscope: {server.url} already serves 31 of the 32 clients it takes (maxclients) "
                                 "on this rank's master: ranks of this job may find none (they wait in their spools), "
                                 "nor consoles; raise maxclients (and Redis's open files: ulimit -n)"), w.warning
            w.close()
        finally:
            for s in held:
                s.close()


def test_a_writer_on_a_cluster_is_warned_by_its_busiest_master_and_only_where_it_is_known(redis_cluster_url):
    """On a cluster the ranks on its busiest master count (counted rank by rank by redis-py
    here): the fewest ranks that put more than 7/8 of its ``maxclients`` there are warned,
    one fewer are not.  An ACL user that may not read the slot map (it learns it from
    MOVED) cannot say the spread: no warning, and ``busiest`` says it does not know."""
    from commscope.store import redis_keeper
    from commscope.store.cluster import Nodes

    nodes = Nodes(parse_url(redis_cluster_url), "test")
    nodes.connect()
    most = nodes.clients(Keys.JOBS).most  # (10,000, or fewer where Redis's open files are limited)
    edge = _edge(redis_cluster_url, "cwide", most * 7 // 8)
    for world in (edge - 1, edge):
        w = open_writer(redis_cluster_url, "cwide", world % 7, job_meta={"world_size": world})
        assert (w.warning is not None) is (world == edge), w.warning
        on = busiest_by_redis_py(redis_cluster_url, "cwide", world)
        assert world < edge or f"this job puts {on:,} ranks on its busiest master" in w.warning, w.warning
        w.close()
        delete_job(redis_cluster_url, "cwide")
    ports = [n.port for n in redis_cluster_client_nodes(redis_cluster_url)]
    try:
        for port in ports:  # (ACLs are a node's own: set on each master)
            redis_client(f"redis://127.0.0.1:{port}/0").execute_command(
                "ACL", "SETUSER", "nomap", "on", ">pw", "~*", "&*", "+@all", "-cluster")
        limited = redis_cluster_url.replace("redis://", "redis://nomap:pw@")
        w = open_writer(limited, "cwide", 1, job_meta={"world_size": edge * 3})
        assert w.warning is None and w._nodes.learning
        assert redis_keeper.busiest(w._nodes, "cwide", edge * 3) is None
        w.close()
        delete_job(redis_cluster_url, "cwide")
    finally:
        for port in ports:
            redis_client(f"redis://127.0.0.1:{port}/0").execute_command("ACL", "DELUSER", "nomap")
        nodes.close()


def redis_cluster_client_nodes(url: str) -> list:
    client = cluster_client(url)
    try:
        return client.get_primaries()
    finally:
        client.close()


def _edge(url: str, job: str, most: int) -> int:
    """The fewest ranks of ``job`` whose busiest master (redis-py's count) serves more than
    ``most``: adding a rank never lowers a master's count, so a bisection finds it."""
    lo, hi = most, (most + 1) * 3  # (the busiest serves at least a third)
    while lo + 1 < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if busiest_by_redis_py(url, job, mid) > most else (mid, hi)
    return hi


def test_a_follower_reads_the_ends_its_writers_said_only_when_they_changed(tmp_path):
    """A console's poll looks at the ends the job's writers said at close (``Keys.ends``)
    every 5 s.  It read the four hashes whole (HGETALL) each time: one field per rank of the
    job (16k fields every 5 s) whatever changed.  Now it reads each copy's length and version
    first, and a copy whole only when that changed: a tail lost after its writer closed is
    still counted, once, by the next look; a look with nothing new reads no hash; a writer
    that said its end again (same member, same length) and one that never bumped the version
    (an older commscope: only the length changed) are both read."""
    from redis_fixture import require_redis_server

    require_redis_server()
    with RedisServer(data_dir=tmp_path / "r") as server:
        server.start()
        url = server.url
        c = redis_client(url)
        writers = [open_writer(url, "ends", r, job_meta={"world_size": 3}) for r in range(3)]
        for r, w in enumerate(writers):
            w.write(lines(r, 1, 4))
        live = open_reader(url)

        def look() -> int:
            """One poll that looks at the ends; HGETALLs it sent."""
            before = int(c.info("commandstats").get("cmdstat_hgetall", {}).get("calls", 0))
            live._tail_look = 0.0  # (it looks every TAIL_LOOK_S: now)
            live.poll()
            return int(c.info("commandstats").get("cmdstat_hgetall", {}).get("calls", 0)) - before

        look()
        writers[0].write(lines(0, 4, 6))
        writers[0].close()  # said 5
        c.xdel(Keys.stream("ends", 0), "0-4", "0-5")  # the tail the stream's master lost after
        assert look() == 1  # (the copy it changed: one of four)
        assert live.missing == {0: 2} and sum("#4-#5) were lost by Redis" in m for m in live.stats.warnings) == 1
        assert look() == 0 and look() == 0  # nothing changed: no hash read
        assert live.missing == {0: 2}
        writers[1].close()  # said 3: all read, nothing lost
        assert look() == 1 and live.missing == {0: 2}
        # the same member said again, larger (a forwarder sending what the rank's spool kept)
        again = open_writer(url, "ends", 1, resume=True, job_meta={"world_size": 3})
        again.write(lines(1, 4, 6))
        c.xdel(Keys.stream("ends", 1), "0-5")
        again.close()  # said 5, the hash's length unchanged
        assert look() == 1 and live.missing == {0: 2, 1: 1}
        c.hset(Keys.ends("ends"), "2", 4)  # a writer before the version: only the length changes
        assert look() == 1 and live.missing == {0: 2, 1: 1, 2: 1}
        assert look() == 0 and live.missing == {0: 2, 1: 1, 2: 1}
        writers[2].close()
        live.close()
        c.close()


def test_a_console_while_redis_restarted_empty_and_before_the_writers_return_is_not_healthy(tmp_path):
    """Redis restarts without persistence while a console follows a job: every stream it read
    is gone, and until each writer writes again (and states what was lost) nothing said so:
    the console showed a healthy job.  Now a poll that connected again (or finds fewer streams
    listed) looks at what Redis holds of the streams it read: rank 0's, alive, is not settled
    (``emptied``: trace_incomplete, error) until its writer writes again, and nothing is
    counted lost (the console had read it all); rank 1 wrote its exit but its writer never
    said its end (the process died right after): it will never write again, so its stream's
    unread part is a stated loss of an unknown count, caused by the restart; rank 2 closed
    its writer and the console had read up to the end it said: it lost nothing unread."""
    from commscope.bench.redis_server import RedisServer
    from commscope.tui.feed import LIVE, Feed

    def ops(rank: int, lo: int, hi: int) -> list[bytes]:
        return [E.encode(e) for i in range(lo, hi) for e in (
            dict(ev(rank, i, op="all_reduce", group="0", seq=i), ts=10**18 + 2 * i),
            {"v": 1, "type": "op", "rank": rank, "ts": 10**18 + 2 * i + 1,
                                                    "phase": "end", "id": i})]

    def meta(rank: int) -> bytes:
        return E.encode({"v": 1, "type": "meta", "rank": rank, "ts": 10**18, "world_size": 3, "backend": "gloo",
                         "host": "h", "pid": 1 + rank})

    def bye(rank: int) -> bytes:
        return E.encode({"v": 1, "type": "exit", "rank": rank, "ts": 10**18 + 22, "reason": "atexit"})

    with RedisServer(data_dir=tmp_path / "r") as server:  # (no persistence: a restart loses everything)
        url = server.start().url
        ws = [open_writer(url, "gone", r, {"world_size": 3}) for r in range(3)]
        ws[0].write([meta(0)] + ops(0, 1, 12))
        for r in (1, 2):
            ws[r].write([meta(r)] + ops(r, 1, 11) + [bye(r)])
        ws[2].close()  # (rank 1's writer never closes: its process died right after its exit)
        feed = Feed(open_reader(url + "?job=gone"), mode=LIVE, hang_after=60.0)
        deadline = time.monotonic() + 60
        while feed.model.events < 23 + 2 * 22:
            feed.step()
            assert time.monotonic() < deadline

        def judged() -> list[tuple]:
            feed._diagnosed_at = float("-inf")  # (judged at the next step, whatever the pace)
            feed.step()
            return [(f.kind, f.severity, f.culprits, f.evidence.to_json().get("per_rank")) for f in feed.findings]

        assert judged() == []  # healthy
        server.restart()
        while not feed.reader.stats.emptied_by_rank:  # (until it connected again)
            feed.step()
            assert time.monotonic() < deadline, feed.reader.stats.warnings
        assert judged() == [("trace_incomplete", "error", [0, 1],
                             {"0": {"emptied": 1}, "1": {"lost_unknown": "restart"}})]
        assert sum("Redis holds less of its stream than was read" in m for m in feed.reader.stats.warnings) == 2
        assert feed.reader.stats.missing_by_rank == {}  # (nothing counted: not known yet)
        ws[0].write(ops(0, 12, 13))  # rank 0's writer is back: it states the loss (entries 1-23)
        while feed.reader.stats.emptied_by_rank.get(0):
            feed.step()
            assert time.monotonic() < deadline, feed.reader.stats.warnings
        assert judged() == [("trace_incomplete", "error", [1], {"1": {"lost_unknown": "restart"}})]
        assert feed.reader.stats.missing_by_rank == {}  # (the console had read all that was lost)
        assert sum("Redis holds less of its stream than was read" in m for m in feed.reader.stats.warnings) == 2
        ws[0].close()


def test_ranks_gone_silent_while_redis_refused_their_writes_are_not_healthy(tmp_path, capsys):
    """A Redis at its maxmemory refuses the ranks' appends, their exits among them: a check
    from another host (no spools to read) read the 14% of ops that landed as a healthy job,
    exit 0, a warning its only word (helper-197).  A rank whose writer said no end, on a node
    that refuses writes for lack of memory or refused some since it started, and silent past
    its threshold without an exit, lost what never came: how much is not known
    (``lost_unknown`` ``full``: an error).  A rank whose writer closed (its end said) lost
    nothing; a console says it alike (a copy says the store's warning); where the store refused nothing (or forgot it, its
    stats reset), the job reads as stopped as a whole (a warning), as before."""
    from commscope import cli
    from commscope.tui.feed import LIVE, Feed

    def said(findings: list[tuple]) -> list[tuple]:
        """(kind, severity, the ranks said lost and why) of each finding."""
        return [(kind, severity, {r: d["lost_unknown"] for r, d in per_rank.items() if "lost_unknown" in d})
                for kind, severity, per_rank in findings]

    def judged(url: str) -> list[tuple]:
        assert cli.main(["check", "--json", url]) in (0, 1)
        out = orjson.loads(capsys.readouterr().out)
        return said([(f["kind"], f["severity"], f["evidence"].get("per_rank")) for f in out["findings"]])

    with RedisServer(data_dir=tmp_path / "r") as server:
        url = server.start().url
        ws = [open_writer(url, "full", r, {"world_size": 3}) for r in range(3)]
        for r in range(3):
            ws[r].write([E.encode({"v": 1, "type": "meta", "rank": r, "ts": 1000, "world_size": 3, "backend": "gloo",
                                   "host": "h", "pid": 1 + r})] + [
                E.encode(e) for i in range(1, 11) for e in (
                    dict(ev(r, i, op="all_reduce", group="0", seq=i), ts=1000 + 2 * i),
                    {"v": 1, "type": "op", "rank": r, "ts": 1001 + 2 * i, "phase": "end", "id": i})] + [
                E.encode({"v": 1, "type": "heartbeat", "rank": r, "ts": 1030})])  # (a recorder wrote: judged silent)
        ws[2].close()  # (its end said: whatever came after, it wrote none)
        stopped = [("trace_incomplete", "warning", {})]  # (no rank wrote an exit: stopped as a whole)
        assert judged(url + "?job=full") == stopped  # the store refused nothing
        c = redis_client(url)
        c.config_set("maxmemory", 1)  # (under what it holds: every write refused)
        with pytest.raises(StoreError, match="OOM command not allowed"):
            ws[0].write(lines(0, 11, 12))
        full = [("trace_incomplete", "error", {"0": "full", "1": "full"})]
        assert judged(url + "?job=full") == full
        part = open_reader(url + "?job=full")  # (a console's read process of a part: rank 1 alone, the
        part.take_shard(Shard(1, 2))  # job's one end, rank 2's, as many as its streams: helper-205)
        part.read_all()
        assert part.stats.refused_by_rank == {1: 1}
        part.close()
        feed = Feed(open_reader(url + "?job=full"), mode=LIVE, hang_after=60.0)
        deadline = time.monotonic() + 60
        while feed.model.events < 3 * 22:
            feed.step()
            assert time.monotonic() < deadline
        feed._diagnosed_at = float("-inf")  # (judged at the next step, whatever the pace)
        feed.step()
        assert said([(f.kind, f.severity, f.evidence.to_json().get("per_rank")) for f in feed.findings]) == full
        feed.close()
        assert cli.main(["copy", url + "?job=full", str(tmp_path / "copy"), "--job", "c"]) == 0
        assert "is full (maxmemory 1 B) and refuses writes for lack of memory" in capsys.readouterr().err
        c.config_set("maxmemory", 0)  # (not full now, though it refused writes since it started: any job's
        assert judged(url + "?job=full") == stopped  # refusals, no loss of this one's; helper-205)
        c.close()


def test_a_poll_reads_about_its_budget_however_many_streams_are_behind(redis_url):
    """A console's read process polls with a budget (8 MiB); a round of every stream at
    ``PAGE`` entries each read past it: a restart at the tail, 1,024 streams each from its
    keyframe seconds back, held ~60 MB of replies at once.  Each XREAD now asks each stream
    for about as many entries as bring what is left of the budget (``RedisReader._count``),
    at the mean size of the entries read so far (a guess before the first).  64 streams of
    200 entries of ~1 KB (12.8 MB) polled with 1 MiB: the first poll within twice the budget
    (its guess at 512 bytes an entry), each later one within the budget and a round of
    ``MIN_PAGE`` entries a stream; every event read once, in order."""
    ranks, per = 64, 200
    pad = "x" * 900
    for r in range(ranks):
        w = RedisWriter(redis_url, "job", r, {"world_size": ranks}, marks="off")
        w.write([E.encode(ev(r, i, pad=pad)) for i in range(per)])
        w.close()
    reader = open_reader(redis_url)
    budget = 1 << 20
    seen: dict[int, list[int]] = {}
    polls = []
    try:
        while True:
            before = reader.stats.bytes
            got = reader.poll_batch(max_bytes=budget).events
            if not got:
                break
            polls.append(reader.stats.bytes - before)
            for e in got:
                seen.setdefault(e["rank"], []).append(e["id"])
    finally:
        reader.close()
    entry = len(E.encode(ev(0, 100, pad=pad)))
    assert polls[0] <= 2 * budget + ranks * entry
    assert all(p <= budget + ranks * reader.MIN_PAGE * entry for p in polls[1:]), polls
    assert len(polls) >= ranks * per * entry // (2 * budget + ranks * entry)
    assert seen == {r: list(range(per)) for r in range(ranks)}


def test_a_node_refusing_to_say_whether_the_job_is_there_is_not_no_job(redis_url, capsys):
    """A reply error where the job's keys were asked for (CLUSTERDOWN on a cluster with a node
    down, LOADING, NOPERM) read as their absence: check said "no job" of a job that is there
    (helper-172).  Here a user whose ACL keeps it from the job's keys."""
    from commscope import cli

    w = open_writer(redis_url, "kept", 0, job_meta={"world_size": 1})
    w.write([E.encode({"v": 1, "type": "meta", "rank": 0, "ts": 1, "host": "h", "world_size": 1})])
    w.close()
    admin = redis_client(redis_url)
    admin.execute_command("ACL", "SETUSER", "elsewhere", "on", ">pw", "~other:*", "+@all")
    try:
        url = redis_url.replace("redis://", "redis://elsewhere:pw@") + "?job=kept"
        assert cli.main(["check", url]) == 2
        err = capsys.readouterr().err
        assert "NOPERM" in err and "no job" not in err and ":pw@" not in err, err
    finally:
        admin.execute_command("ACL", "DELUSER", "elsewhere")


def test_a_redis_full_to_its_maxmemory_is_said(redis_url):
    """A Redis at its maxmemory refuses the ranks' appends: a check from another host (no
    spools) exited 0 over 89% of the ops never stored, the cause said nowhere (helper-193).
    A reader says the store is full, or refused writes for lack of memory since it started;
    in words that do not move while ranks retry (a console says a warning once by its
    text, helper-199)."""
    open_writer(redis_url, "oom", 0).write(lines(0, 1, 3))
    c = redis_client(redis_url)
    old = c.config_get("maxmemory")["maxmemory"]
    policy = c.config_get("maxmemory-policy")["maxmemory-policy"]

    def said() -> list[str]:
        return [w for w in open_reader(redis_url).stats.warnings if "for lack of memory" in w]

    try:
        c.config_resetstat()
        assert not said()
        c.config_set("maxmemory", 1)  # (under what it holds: every write refused)
        full = said()
        assert len(full) == 1 and "is full (maxmemory 1 B) and refuses writes for lack of memory: events of this " \
            "trace that never reached the store may be among them" in full[0], full
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            c.set("commscope-test-oom", "x")
        assert said() == full  # (the same words once it refused more)
        c.config_set("maxmemory", 0)  # (lifted: it refused some all the same)
        (was,) = said()
        assert "has refused writes for lack of memory since it started (maxmemory since raised or lifted)" in was, was
        c.config_resetstat()
        assert not said()
    finally:
        c.config_set("maxmemory", old)
        c.config_set("maxmemory-policy", policy)
        c.config_resetstat()
        c.close()
