"""Real Gloo ranks recording to Redis: diagnosed like a directory trace, surviving a Redis
restart without unreported loss, and never leaking the password."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from redis_fixture import *  # noqa: F403  (the redis_server and redis_url fixtures)
from redis_fixture import redis_client, require_redis_server
from trace_helpers import assert_the_hang_outlived_the_loss, the_hang

import commscope
from commscope import cli
from commscope import events as E
from commscope.bench.redis_server import RedisServer
from commscope.launch import Job, run_ranks
from commscope.store import open_reader
from commscope.store.redis_store import Keys

# ---------------------------------------------------------------------------- same diagnosis


def diagnosable_job(rank: int, ws: int, store: str) -> None:
    """A short job with something to find: a straggler, a p2p pair, an async op never waited.

    Rank 1 is late by 4 times the longest all_reduce it has seen (50 ms at least, 2 s at
    most): a straggler is judged against what the collectives take, and on a loaded machine
    they take tens of ms (a fixed 50 ms was then within twice their median: no straggler in
    a third of the runs on a core shared with two busy loops)."""
    commscope.instrument(store, sample_interval=60.0, hang_after=60.0, flight_recorder=False)
    x = torch.ones(64)
    late = 0.05
    for step in range(10):
        if rank == 1:
            time.sleep(late)  # always last, by far
        t0 = time.monotonic()
        dist.all_reduce(x)
        if rank == 1 and step:  # (the first one also waits for the others' start)
            late = min(2.0, max(late, 4 * (time.monotonic() - t0)))
    dist.broadcast(x, src=0)
    if rank == 0:
        dist.send(x, 1)
    elif rank == 1:
        dist.recv(x, 0)
    work = dist.all_reduce(x, async_op=True)  # never waited
    dist.barrier()
    commscope.uninstrument()
    del work


VOLATILE = {"ts", "tid", "pid", "host", "store", "run", "argv", "cpu", "rss", "inflight", "python", "local_rank"}


def normalized(events: list[dict]) -> dict[int, list[dict]]:
    """Per rank, in stored order, without the fields that differ from run to run; its
    heartbeats and samples after its other events, each kind in its order.  Where the
    recorder thread's tick falls among a rank's ops is timing: rank 1 sleeps a tick's length
    before each all_reduce, and a loaded CI once stored its first sample after its first op
    in one run and before it in the other."""
    out: dict[int, list[dict]] = {}
    for e in events:
        out.setdefault(e["rank"], []).append({k: v for k, v in e.items() if k not in VOLATILE})
    return {r: [e for e in evs if e["type"] not in LIVENESS] + [e for e in evs if e["type"] in LIVENESS]
            for r, evs in out.items()}


#: Events the recorder's thread writes at its ticks, wherever they fall among the ops
LIVENESS = frozenset({"heartbeat", "sample"})


def check_json(store: str, capsys, hang_after: str = "60") -> dict:
    """``check --json``'s report and exit; where it printed none, no findings and what it
    said instead, which is a store it could not read (exit 2: a Redis starved by a loaded
    machine answers past the reply timeout), never an internal error."""
    capsys.readouterr()
    rc = cli.main(["check", store, "--json", "--hang-after", hang_after])
    said = capsys.readouterr()
    if not said.out.strip():
        assert rc == 2, (rc, said.err)
        return {"findings": [], "error": said.err, "rc": rc}
    out = json.loads(said.out)
    out["rc"] = rc
    return out


def test_redis_trace_is_diagnosed_like_a_directory_trace(redis_url, tmp_path, capsys):
    env = {"COMMSCOPE_JOB": "same-job"}
    directory = str(tmp_path / "trace")
    run_ranks(diagnosable_job, 3, args=(directory,), env=env, timeout=60)
    run_ranks(diagnosable_job, 3, args=(redis_url,), env=env, timeout=60)

    from_dir = normalized(open_reader(directory).read_all())
    from_redis = normalized(open_reader(redis_url).read_all())
    assert sorted(from_redis) == [0, 1, 2]
    for rank in from_dir:
        assert from_redis[rank] == from_dir[rank], f"rank {rank} differs"

    a, b = check_json(directory, capsys), check_json(redis_url, capsys)
    for key in ("rc", "ranks", "events", "ops", "warnings"):
        assert a[key] == b[key], key

    def findings(report: dict) -> list[tuple]:
        return sorted((f["kind"], f["severity"], f.get("group"), f.get("seq"), f.get("op"), tuple(f["ranks"]),
                       tuple(f["culprits"])) for f in report["findings"])

    assert findings(a) == findings(b)
    assert {"straggler", "unwaited_work"} <= {f[0] for f in findings(b)}, findings(b)  # not a vacuous match
    assert b["source"].startswith("redis://") and "job=same-job" in b["source"]


# ---------------------------------------------------------------------------- restart mid-job


def restart_job(rank: int, ws: int, store: str, stop_file: str) -> dict:
    """Trains until ``stop_file`` exists; touches ``stop_file.noticed.<rank>`` once the
    recorder has reported the store failing (so the test knows the outage was seen).
    Logs every event other than the op records (those wait in the spool's ring) in the
    order the recorder hands it to the store."""
    rec = commscope.instrument(store, sample_interval=0.1, hang_after=60.0, flight_recorder=False)
    log: list[bytes] = []
    with rec._tick_lock:  # before the process group exists, so before anything is written
        rec.outbox.cap_bytes = 2048  # small, so that the outage overflows it and drops get counted
        put = rec.outbox.put

        def logged(line: bytes, ring_end: int = -1) -> None:
            if ring_end < 0:
                log.append(line)
            put(line, ring_end)

        rec.outbox.put = logged
    dist.init_process_group("gloo", rank=rank, world_size=ws)
    x = torch.ones(16)
    flag = torch.zeros(1)
    steps = 0
    while True:
        dist.all_reduce(x)
        flag[0] = float(os.path.exists(stop_file))
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # all ranks stop at the same step
        steps += 1
        if "store" in rec._warned and not os.path.exists(f"{stop_file}.noticed.{rank}"):
            Path(f"{stop_file}.noticed.{rank}").touch()
        if rec.outbox.dropped and not os.path.exists(f"{stop_file}.dropped.{rank}"):
            Path(f"{stop_file}.dropped.{rank}").touch()
        if flag[0] > 0:
            break
        time.sleep(0.002)
    commscope.uninstrument()  # the final write goes through: Redis is back by now
    dist.destroy_process_group()
    return {"log": log, "left": len(rec.outbox.pending), "store_dropped": rec.outbox.dropped,
            "ring_dropped": rec.ops.dropped(), "steps": steps, "saw_failure": "store" in rec._warned,
            "stored_after_drop": rec.outbox.writer.stored_after_drop}


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _is_subsequence(short: list, long: list) -> bool:
    it = iter(long)
    return all(any(x == y for y in it) for x in short)


@pytest.mark.parametrize("fault", ["restart_mid_job", "down_at_start"])
def test_redis_outage_loses_no_op_and_only_what_was_reported_dropped(tmp_path, fault):
    require_redis_server()
    server = RedisServer(appendonly=True, data_dir=tmp_path / "redis")  # appendfsync always
    server.start()
    url = server.url + "?job=outage"
    stop_file = str(tmp_path / "stop")
    keys = [Keys.stream("outage", r) for r in range(2)]
    if fault == "down_at_start":
        server.stop()
    job = Job(restart_job, 2, args=(url, stop_file), init=False).start()
    client = None
    try:
        if fault == "restart_mid_job":
            client = redis_client(server.url)
            _wait_for(lambda: all(client.xlen(k) > 20 for k in keys), 60, "both ranks to record")
            client.close()
            server.stop()  # SIGTERM: Redis writes its AOF and goes away; ranks keep training
        # The outage lasts until a rank has noticed it and its outbox has overflowed (a fixed
        # sleep was too short under load: the buffer sometimes never filled).
        _wait_for(lambda: any(Path(f"{stop_file}.noticed.{r}").exists() for r in range(2)), 120,
                  "a rank to notice the outage")
        _wait_for(lambda: any(Path(f"{stop_file}.dropped.{r}").exists() for r in range(2)), 120,
                  "a rank's outbox to overflow")
        assert sorted(job.alive()) == [0, 1]
        server.start()  # same port, same data directory
        client = redis_client(server.url)
        before = [client.xlen(k) for k in keys]
        _wait_for(lambda: all(client.xlen(k) > n + 20 for k, n in zip(keys, before, strict=True)), 60,
                  "recording to resume")
        Path(stop_file).touch()
        results = job.join(60)
        assert all(r.ok for r in results.values()), {r: (x.error, x.exitcode) for r, x in results.items()}

        trace = open_reader(url).read_all()
        for rank in range(2):
            res = results[rank].value
            entries = client.xrange(Keys.stream("outage", rank))
            stored = [f[b"e"] for _, f in entries]
            # Redis kept every entry: numbered 1..n without a gap, none twice.
            assert [eid for eid, _ in entries] == [b"0-%d" % k for k in range(1, len(entries) + 1)]
            assert len(set(stored)) == len(stored), "duplicate entries"
            assert E.decode(stored[0])["type"] == "meta"
            assert res["left"] == 0 and res["ring_dropped"] == 0
            # Every op of the rank is in the trace, once: the outage cost no op record.
            ops_ = [e for e in trace if e["rank"] == rank and e["type"] == "op" and e["phase"] == "begin"]
            assert len(ops_) == 2 * res["steps"] and len({e["id"] for e in ops_}) == len(ops_)
            # Exact accounting of the other events.  The recorder counts as dropped every
            # event it gave up on; a few of those may have reached Redis after all (the batch
            # in flight when Redis went down landed; the writer learns it when Redis is back).
            others = [v for v in stored[1:] if not v.startswith(b'{"type":"block"')]
            assert _is_subsequence(others, res["log"]), "events stored out of order, or never recorded"
            missing = len(res["log"]) - len(others)
            assert missing == res["store_dropped"] - res["stored_after_drop"], (
                missing, res["store_dropped"], res["stored_after_drop"])
            drops = [E.decode(v) for v in stored if b'"type":"dropped"' in v]
            if res["store_dropped"]:
                assert drops[-1]["total"] == res["store_dropped"]  # and the trace itself says so
                assert not any(d.get("records") for d in drops)  # none of them an op record
            else:
                assert not drops
        assert any(results[r].value["saw_failure"] for r in range(2)), "the outage was never noticed"
        assert any(results[r].value["store_dropped"] for r in range(2)), "the buffer never overflowed"
    finally:
        if client is not None:
            client.close()
        job.kill()
        server.close()


# ---------------------------------------------------------------------------- password


def password_job(rank: int, ws: int, store: str, err_file: str) -> dict:
    fd = os.open(f"{err_file}.{rank}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 2)  # everything the rank prints to stderr, warnings included
    sys.argv.append(f"--store={store}")  # the URL, password and all, ends up in the meta event's argv
    rec = commscope.instrument(store, sample_interval=0.1, hang_after=60.0, flight_recorder=False)
    x = torch.ones(8)
    for _ in range(20):
        dist.all_reduce(x)
        time.sleep(0.01)
    commscope.uninstrument()
    sys.stderr.flush()
    return {"steps": 20, "value": float(x[0]), "error": rec.outbox.error}


def _everything_in(url: str) -> bytes:
    """Every byte commscope stored in that database, read with redis-py."""
    c = redis_client(url)
    out = []
    for key in c.keys("*"):
        kind = c.type(key)
        out.append(key)
        if kind == b"stream":
            out += [v for _, f in c.xrange(key) for v in f.values()]
        elif kind == b"string":
            out.append(c.get(key))
        elif kind == b"set":
            out += list(c.smembers(key))
        elif kind == b"zset":
            out += c.zrange(key, 0, -1)
    c.close()
    return b"\n".join(out)


def test_password_is_never_shown_and_a_wrong_one_is_one_warning(tmp_path, capsys):
    require_redis_server()
    secret = "Pa55-w0rd-never-shown"
    with RedisServer(password=secret, data_dir=tmp_path / "redis") as server:
        server.start()
        wrong = server.url.replace(secret, "wrong-Pa55")
        errs = tmp_path / "err-wrong"
        results = run_ranks(password_job, 2, args=(wrong, str(errs)), env={"COMMSCOPE_JOB": "pw"}, timeout=60)
        for r in range(2):
            res = results[r].value
            assert res["steps"] == 20 and res["value"] == 2.0 ** 20  # training went on
            text = Path(f"{errs}.{r}").read_text()
            assert text.count("commscope: cannot log in to redis://:***@127.0.0.1") == 1, text
            assert "wrong password" in text and "wrong-Pa55" not in text and secret not in text
        assert _everything_in(server.url) == b""  # nothing could be written

        errs = tmp_path / "err-good"
        results = run_ranks(password_job, 2, args=(server.url, str(errs)), env={"COMMSCOPE_JOB": "pw"}, timeout=60)
        assert all(results[r].value["error"] is None for r in range(2)), [results[r].value for r in range(2)]
        stored = _everything_in(server.url)
        assert (b'"type":"op"' in stored or b'"type":"block"' in stored)  # ops were recorded
        assert b":***@127.0.0.1" in stored  # argv and store, redacted
        shown = [stored.decode(errors="replace")] + [Path(f"{errs}.{r}").read_text() for r in range(2)]

        capsys.readouterr()
        assert cli.main(["check", server.url, "--json"]) in (0, 1)
        assert cli.main(["report", server.url]) == 0
        assert cli.main(["export", server.url, "--chrome", str(tmp_path / "chrome.json")]) == 0
        assert cli.main(["copy", server.url, str(tmp_path / "copied")]) == 0
        assert cli.main(["check", wrong]) == 2
        assert cli.main(["copy", wrong, str(tmp_path / "never")]) == 2
        out = capsys.readouterr()
        assert "cannot log in" in out.err
        shown += [out.out, out.err, (tmp_path / "chrome.json").read_text()]
        shown += [p.read_text() for p in (tmp_path / "copied").rglob("*") if p.is_file()]
        for text in shown:
            assert secret not in text and "wrong-Pa55" not in text


def test_each_rank_warns_once_at_open_that_its_redis_evicts_keys(tmp_path):
    """A Redis whose maxmemory-policy evicts keys (allkeys-lru) may drop a trace's keys whole:
    a reader said so, the ranks writing it said nothing.  Each rank now warns once, on its
    stderr, when its writer opens, and training goes on; no warning on one that does not evict."""
    require_redis_server()
    for policy, said in (("allkeys-lru", 1), ("noeviction", 0)):
        with RedisServer(data_dir=tmp_path / policy, extra={"maxmemory": "256mb", "maxmemory-policy": policy}) as server:
            server.start()
            errs = tmp_path / f"err-{policy}"
            results = run_ranks(password_job, 2, args=(server.url, str(errs)), env={"COMMSCOPE_JOB": policy}, timeout=60)
            for r in range(2):
                assert results[r].value["steps"] == 20 and results[r].value["error"] is None
                text = Path(f"{errs}.{r}").read_text()
                assert text.count(f"evicts keys when full (maxmemory-policy {policy})") == said, text
                assert text.count("evicts keys when full") == said, text  # (once, the rank's only)


def test_fixture_names_the_missing_binary(monkeypatch):
    """Without redis-server the tests fail with the install hint instead of skipping."""
    import redis_fixture

    from commscope.bench import redis_server as rs

    monkeypatch.setenv(rs.REDIS_SERVER_ENV, "/nonexistent/redis-server")
    monkeypatch.setattr(rs.shutil, "which", lambda name: None)
    monkeypatch.setattr(rs.os.path, "isfile", lambda p: False)
    with pytest.raises(pytest.fail.Exception, match="apt-get install redis-server"):
        redis_fixture.require_redis_server()


# ---------------------------------------------------------------------------- a paced writer
def paced_flush_job(rank: int, ws: int, store: str) -> list[int]:
    """Ops, then ``flush`` with the store's pace at a second: what flush returns for must be
    in the store when it returns (the recorder writes then, whatever the pace)."""
    rec = commscope.instrument(store, sample_interval=60.0, hang_after=60.0, flight_recorder=False)
    x = torch.ones(4)
    counts = []
    for n in (3, 5):
        for _ in range(n):
            dist.all_reduce(x)
        assert rec.flush(timeout=30.0)
        reader = open_reader(store)
        counts.append(sum(1 for e in reader.read_all() if e["type"] == "op" and e.get("op") == "all_reduce"
                          and e["phase"] == "begin"))
        reader.close()
    commscope.uninstrument()
    return counts


def test_flush_writes_whatever_the_stores_pace(redis_url):
    url = redis_url + "?rate=1&job=paced"  # one rank: a write a second at most
    res = run_ranks(paced_flush_job, 1, args=(url,), timeout=120)
    assert res[0].value == [3, 8]


# ---------------------------------------------------------------------------- a hang through a flush
def hang_until_released(rank: int, ws: int, store: str, release: str) -> None:
    """Five all_reduces, then rank 1 stays out of the sixth (it waits for ``release`` in
    Python) while the others wait in it: a hang that a store's loss meanwhile (a flush, a
    deleted job directory: test_store_losses) must not hide."""
    commscope.instrument(store, sample_interval=0.2, hang_after=1.0, flight_recorder=False)
    x = torch.ones(8)
    for _ in range(5):
        dist.all_reduce(x)
    if rank == 1:
        _wait_for(lambda: os.path.exists(release), 120, "the release")
    dist.all_reduce(x)
    commscope.uninstrument()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("source", ["native", "python"])
def test_a_hang_is_still_found_after_redis_lost_the_streams_while_it_hung(redis_url, tmp_path, capsys, source):
    """Redis flushed while ranks 0 and 2 wait in an all_reduce rank 1 never entered: their
    writers state the loss, and restate the ops they still have in flight (the carry of
    ``store/inflight.py``, as a mark holds it), so the hang is still found, on rank 1 alone,
    with the loss counted.  Before, the begins went with the flushed entries and ``check``
    found only the loss.  Both recorders: the native one's records in blocks, the Python
    one's as JSON events."""
    url = redis_url + "?job=hang-flush"
    release = tmp_path / "release"
    job = Job(hang_until_released, 3, args=(url, str(release)), pg_timeout=300,
              env={"COMMSCOPE_NATIVE": "1" if source == "native" else "0"}).start()
    client = redis_client(url)
    try:
        def hung() -> dict | None:
            out = check_json(url, capsys, "1") if client.exists(Keys.meta("hang-flush")) else None
            return out if out is not None and the_hang(out) is not None else None

        _wait_for(hung, 60, "the hang found before the flush")
        before = the_hang(hung())
        assert (before["culprits"], before["seq"], before["op"]) == ([1], 6, "all_reduce"), before

        client.flushdb()
        streams = [Keys.stream("hang-flush", r) for r in range(3)]

        def all_stated() -> bool:  # every rank's writer found its stream gone and said so
            return all(any(b"store_lost" in v[b"e"] for _, v in client.xrange(s, count=50)) for s in streams)

        _wait_for(all_stated, 30, "every rank's store_lost marker")
        assert len(job.alive()) == 3
        out = check_json(url, capsys, "1")
        assert_the_hang_outlived_the_loss(out, before["group"])
        assert "lost by Redis" in json.dumps(out), out
        assert out["rc"] == 1
    finally:
        release.touch()
        job.join(60)
        job.kill()
        client.close()
