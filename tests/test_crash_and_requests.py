"""The rank side of failures: crash files from fatal signals, and cross-rank stack requests."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest
import torch.distributed as dist

from commscope.analysis import rankstate
from commscope.record.hangsignal import StackRequests
from commscope.schema import SCHEMA_VERSION
from commscope.store.crashlog import crash_file_name, parse
from commscope.store.directory import DirectoryReader

pytestmark = pytest.mark.timeout(60)

CRASHING = textwrap.dedent("""
    import ctypes, sys, threading, time
    from commscope.record import crashlog
    from commscope.store.crashlog import crash_file_name
    from commscope.store.directory import DirectoryWriter
    w = DirectoryWriter(sys.argv[1], "job", 3)
    w.write([b'{"type":"heartbeat","ts":%d,"v":1,"rank":3}' % time.time_ns()])
    assert crashlog.arm(w.dir / crash_file_name(3))
    threading.Thread(target=time.sleep, args=(60,), name="loader", daemon=True).start()
    def parse_record():
        ctypes.string_at(0)
    parse_record()
""")


def test_a_segfault_leaves_its_stacks_and_the_reader_turns_them_into_events(tmp_path):
    proc = subprocess.run([sys.executable, "-c", CRASHING, str(tmp_path)], capture_output=True, timeout=60)
    assert proc.returncode == -11, proc.stderr.decode()
    crash = tmp_path / "job" / crash_file_name(3)
    assert crash.stat().st_size > 0
    reader = DirectoryReader(tmp_path / "job")
    first = reader.poll()
    assert [e["type"] for e in first] == ["heartbeat"]  # the crash file is read once it stopped growing
    stack, exit_ = reader.poll()
    assert exit_ == {"type": "exit", "v": SCHEMA_VERSION, "rank": 3, "ts": crash.stat().st_mtime_ns, "reason": "signal",
                     "signal": "Segmentation fault", "exc": "Fatal Python error: Segmentation fault",
                     "src": "faulthandler"}
    assert stack["type"] == "stack" and stack["reason"] == "signal"
    crashing = [t for t in stack["threads"] if t.get("op_thread")]
    assert len(crashing) == 1 and crashing[0]["frames"][-1][2] == "string_at"
    assert crashing[0]["frames"][-2][2] == "parse_record"  # outermost first, like a traceback
    assert len(stack["threads"]) == 2
    assert reader.poll() == []  # once
    assert [e["type"] for e in DirectoryReader(tmp_path / "job").read_all()] == ["heartbeat", "stack", "exit"]


def test_empty_or_foreign_crash_files_mean_nothing(tmp_path):
    job = tmp_path / "job"
    job.mkdir()
    (job / "rank-00000.jsonl").write_bytes(b'{"type":"heartbeat","ts":1,"v":1,"rank":0}\n')
    (job / crash_file_name(0)).write_bytes(b"")
    (job / crash_file_name(1)).write_bytes(b"not faulthandler output\n")
    assert [e["type"] for e in DirectoryReader(job).read_all()] == ["heartbeat"]
    assert parse("Fatal Python error: Aborted\n\nStack (most recent call first):\n  File \"x.py\", line 3 in f\n") \
        == ("Aborted", [{"tid": 0, "name": "crashing thread", "frames": [["x.py", 3, "f"]], "op_thread": True}])


def test_clean_exit_removes_the_empty_crash_file(tmp_path):
    import faulthandler

    from commscope.record import crashlog
    from commscope.store.directory import DirectoryWriter

    was = faulthandler.is_enabled()
    faulthandler.disable()  # pytest enables it for itself; a program that did keeps its own
    try:
        w = DirectoryWriter(tmp_path, "job", 0)
        assert crashlog.arm(w.dir / crash_file_name(0)) and (tmp_path / "job" / crash_file_name(0)).exists()
        crashlog.disarm()
        assert not (tmp_path / "job" / crash_file_name(0)).exists()
        faulthandler.enable()
        assert not crashlog.arm(w.dir / crash_file_name(0))  # enabled by the program: left alone
    finally:
        faulthandler.disable()
        if was:
            faulthandler.enable()


def test_stack_requests_are_posted_once_per_incident_and_answered_once_by_every_rank():
    store = dist.HashStore()
    ranks = [StackRequests(2.0, store=store) for _ in range(3)]
    for r, req in enumerate(ranks):
        req.rank = r
    for req in ranks:
        req.poll(store)
    assert all(not req.out for req in ranks)  # nothing stuck, nothing asked
    t = time.time_ns()
    ranks[0]._incident = t - 2_000_000_000  # rank 0's op began 2 s ago and is stuck
    ranks[2]._incident = t - 1_999_000_000  # rank 2 is stuck in the same collective
    for req in ranks:
        req.poll(store)
    events = [list(req.out) for req in ranks]
    assert all(len(e) == 1 for e in events)  # rank 2 saw rank 0's request: no second one
    assert {e[0]["trigger"] for e in events} == {0} and len({e[0]["request_ns"] for e in events}) == 1
    assert events[1][0]["reason"] == "request"
    main = [th for th in events[1][0]["threads"] if th.get("op_thread")]
    assert len(main) == 1 and any(f[2] == "test_stack_requests_are_posted_once_per_incident_and_answered_once_"
                                  "by_every_rank" for f in main[0]["frames"])
    for req in ranks:
        req.out.clear()
        req.poll(store)
    assert all(not req.out for req in ranks)  # answered once
    ranks[1]._incident = time.time_ns()  # a later incident (an op that failed): asked anew
    for _ in range(2):  # rank 0 polls before rank 1 posts: it answers on its next poll
        for req in ranks:
            req.poll(store)
    assert all(len(req.out) == 1 and req.out[0]["trigger"] == 1 for req in ranks)


def test_the_request_poller_runs_with_the_recorder_and_ends_with_it(tmp_path):
    """(Answering on real ranks: test_e2e_failures, where a spinning rank shows its frame.)"""
    from commscope.launch import run_ranks

    res = run_ranks(_threads_after_uninstrument, 2, args=(str(tmp_path / "t"),), timeout=60)
    assert all(r.value == (True, False) for r in res), [r.value for r in res]


def _threads_after_uninstrument(rank: int, ws: int, store: str) -> tuple[bool, bool]:
    import threading

    import torch

    import commscope

    commscope.instrument(store, hang_after=1.0, sample_interval=0.2)
    dist.all_reduce(torch.ones(2))
    from commscope.record.recorder import active

    active().flush(timeout=2.0)
    running = any(t.name == "commscope-stack-requests" for t in threading.enumerate())
    commscope.uninstrument()
    end = time.monotonic() + 5
    while any(t.name == "commscope-stack-requests" for t in threading.enumerate()) and time.monotonic() < end:
        time.sleep(0.05)
    return running, any(t.name == "commscope-stack-requests" for t in threading.enumerate())


def test_a_crash_timed_by_a_coarse_mtime_still_follows_the_last_op():
    """The kernel stamps the crash file with a coarse clock, so its exit can read a few ms
    before the last op the rank began (seen in CI: 1.2 ms): still the rank's crash.  An
    exit long before the rank's last op is another run's, as before."""
    from commscope.analysis import TraceModel
    from commscope.analysis.synth import S, TraceBuilder

    MS = S // 1000

    for lag, crashed in ((3 * MS, True), (2 * S, False)):
        b = TraceBuilder(2)
        t = b.warmup()
        b.sync(1, t, t + MS, "all_reduce")
        b.add(1, t - lag, "exit", reason="signal", signal="Segmentation fault",
              exc="Fatal Python error: Segmentation fault", src="faulthandler")
        m = TraceModel.from_events(b.sorted_events())
        assert (rankstate.crash(m, 1) is not None) is crashed, lag
        assert rankstate.crash(m, 0) is None
    b = TraceBuilder(2)
    t = b.warmup()
    b.sync(1, t, t + MS, "all_reduce")
    b.add(1, t - 3 * MS, "exit", reason="atexit")  # a clean exit is timed by the rank's own clock
    assert rankstate.exited(TraceModel.from_events(b.sorted_events()), 1) is None
