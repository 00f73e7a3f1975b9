"""The recorder's thread on real ranks: live visibility of hangs, failing stores, exits, bounds."""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import textwrap
import time
import warnings

import orjson
import pytest
import torch
import torch.distributed as dist
from trace_helpers import of_type, ops, read_events

import commscope
from commscope.launch import Job, run_ranks
from commscope.store import open_reader


def blocked(rank: int, ws: int, store: str) -> None:
    commscope.instrument(store, hang_after=1.0, sample_interval=0.2)
    dist.all_reduce(torch.ones(2))
    if rank == 1:
        time.sleep(600)  # never arrives: rank 0 blocks in the next all_reduce
    stuck_in_all_reduce(torch.ones(8))


def stuck_in_all_reduce(t: torch.Tensor) -> None:
    dist.all_reduce(t)


def _poll_until(reader, predicate, timeout: float):
    events: list[dict] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        events += reader.poll()
        if predicate(events):
            return events
        time.sleep(0.1)
    raise AssertionError(f"condition not met within {timeout}s; saw {len(events)} events")


def test_blocked_rank_begin_and_stack_are_readable_while_it_is_blocked(tmp_path):
    store = tmp_path / "trace"
    job = Job(blocked, 2, args=(str(store),)).start()
    try:
        reader = open_reader(str(store), wait=True)

        def stuck(events):
            begins = [e for e in events if e["rank"] == 0 and e["type"] == "op" and e["phase"] == "begin"
                      and e.get("seq") == 2]
            stacks = [e for e in events if e["rank"] == 0 and e["type"] == "stack"]
            return begins and stacks

        events = _poll_until(reader, stuck, timeout=20)
        assert sorted(job.alive()) == [0, 1]  # still blocked while we read it
        op = [o for o in ops(events, 0) if o.get("seq") == 2][0]
        assert op["op"] == "all_reduce" and "end" not in op["phases"]
        assert op["site"].endswith("in stuck_in_all_reduce")
        # (its own stacks, not another rank's request's, ``hangsignal``: one may come meanwhile)
        own = [e for e in of_type(events, "stack", 0) if e.get("reason") != "request"]
        stack = own[0]
        assert stack["id"] == op["id"]
        main = [t for t in stack["threads"] if t.get("op_thread")]
        assert len(main) == 1
        assert "stuck_in_all_reduce" in [f[2] for f in main[0]["frames"]]
        assert not any(t["name"] == "commscope-recorder" for t in stack["threads"])
        assert len(own) == 1  # once per stuck op
        beats = of_type(events, "heartbeat", 0)
        assert beats and beats[-1]["inflight"] >= 1
    finally:
        job.kill()


def unwritable(rank: int, ws: int, store: str) -> list:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        commscope.instrument(store, sample_interval=0.1)
        x = torch.ones(3) * (rank + 1)
        for _ in range(20):
            dist.all_reduce(x)
        deadline = time.monotonic() + 60  # until the recorder has tried the store and said so
        while not any("cannot write trace store" in str(w.message) for w in caught) and time.monotonic() < deadline:
            time.sleep(0.05)
        rec = commscope.record.recorder.active()
        dropped = rec.outbox.dropped + len(rec.outbox.pending)
        commscope.uninstrument()
    msgs = [warnings.formatwarning(w.message, w.category, w.filename, w.lineno, w.line)
            for w in caught if "commscope" in str(w.message)]  # (as Python prints them)
    return [x.tolist(), msgs, dropped]


def test_unwritable_store_never_disturbs_training_and_warns_once(tmp_path):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the store directory should be")
    results = run_ranks(unwritable, 2, args=(str(blocker / "trace"),))
    for r in results:
        values, msgs, dropped = r.value
        assert values == [3.0 * 2**19] * 3  # 1 + 2, then doubled by each of the other 19 sums
        store_msgs = [m for m in msgs if "cannot write trace store" in m]
        assert len(store_msgs) == 1, msgs
        assert ".py:" not in store_msgs[0], store_msgs  # commscope's, not its source line's (helper-193)
        assert dropped > 0


def deleted_midway(rank: int, ws: int, store: str) -> int:
    import shutil

    commscope.instrument(store, sample_interval=0.1)
    dist.all_reduce(torch.ones(1))
    commscope.record.recorder.active().flush()
    dist.barrier()
    if rank == 0:
        shutil.rmtree(store)
    dist.barrier()
    dist.broadcast(torch.ones(1), src=0)
    return 0


def test_store_deleted_mid_run_is_recreated(tmp_path):
    store = tmp_path / "trace"
    run_ranks(deleted_midway, 2, args=(str(store),))
    events = read_events(store)
    names = [o["op"] for o in ops(events)]
    assert "broadcast" in names  # what came after the deletion
    assert {e["rank"] for e in events} == {0, 1}
    for path in sorted(store.glob("*/rank-*.jsonl")):  # the file starts again with the loss, counted
        first = orjson.loads(path.read_bytes().split(b"\n", 1)[0])
        assert first["type"] == "dropped" and first["reason"].startswith("store_lost") and first["entries"] > 0
    # Of what went before, only what the ranks were in is restated (``inflight.restatement``):
    # the last op each group completed, never the whole history.
    assert names.count("all_reduce") <= 2, names  # (at most one a rank)


def flood(rank: int, ws: int, store: str) -> dict:
    rec = commscope.instrument(store, sample_interval=0.2, flight_recorder=False)
    rec._stop.set()  # stall the writer thread: nothing drains the buffer
    rec._thread.join()
    ops_ = rec.ops
    if ops_.name == "native":
        ops_.m.set_capacity(50_000)  # a tiny buffer (bytes) so the hot path overflows it
    else:
        ops_.QUEUE_CAP = 500
    x = torch.ones(1)
    for _ in range(2000):
        dist.all_reduce(x, op=dist.ReduceOp.MAX)
    if ops_.name == "native":
        queued = ops_.m.stats()["buffered"]
        dropped = ops_.m.stats()["dropped_total"]
    else:
        queued, dropped = len(ops_.q), ops_.hot_dropped
    rec._stop.clear()
    rec._thread = None  # start() is idempotent: forget the stopped thread
    rec.start()
    dist.barrier()
    rec.flush()
    # the recorder's own count, at the end: the barrier may have found the ring still full
    total = ops_.m.stats()["dropped_total"] if ops_.name == "native" else ops_.dropped()
    return {"source": ops_.name, "queued": queued, "dropped": dropped, "total": total, "value": x.item()}


@pytest.mark.parametrize("source", ["native", "python"])
def test_memory_stays_bounded_and_drops_are_counted(tmp_path, source):
    store = tmp_path / "trace"
    results = run_ranks(flood, 2, args=(str(store),), env={"COMMSCOPE_SOURCE": source})
    for r in results:
        assert r.value["source"] == source
        if source == "native":
            assert r.value["queued"] <= 50_000 and r.value["dropped"] > 1000  # bytes held, records dropped
        else:  # the cap applies to begins; an end whose begin was queued is never dropped
            assert r.value["queued"] <= 501 and r.value["dropped"] > 1000
        assert r.value["value"] == 1.0
    events = read_events(store)
    for rank in (0, 1):
        drops = of_type(events, "dropped", rank)
        assert sum(d["count"] for d in drops) == results[rank].value["total"]
        assert sum(d.get("records", 0) for d in drops) == results[rank].value["total"]  # op records, all
        assert drops[-1]["reason"].startswith("recorder buffer full")


def samples(rank: int, ws: int, store: str) -> None:
    commscope.instrument(store, sample_interval=0.1)
    x = torch.ones(1000)
    for _ in range(5):
        dist.all_reduce(x)
        time.sleep(0.1)


def test_samples_and_heartbeats_without_a_gpu(tmp_path):
    store = tmp_path / "trace"
    run_ranks(samples, 2, args=(str(store),))
    events = read_events(store)
    for rank in (0, 1):
        s = of_type(events, "sample", rank)
        assert len(s) >= 3
        assert all(isinstance(x["cpu"], float) and x["rss"] > 10**7 for x in s)
        assert not any(k.startswith("gpu") for x in s for k in x)  # a CPU job: no GPU fields
        assert len(of_type(events, "heartbeat", rank)) == len(s)
        assert of_type(events, "meta", rank)[0]["sample_interval"] == 0.1


SCRIPT = textwrap.dedent("""
    import os, sys, torch, torch.distributed as dist, commscope
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2])
    commscope.instrument(sys.argv[1], sample_interval=0.1)
    dist.init_process_group("gloo", rank=0, world_size=1)
    dist.all_reduce(torch.ones(1))
    if sys.argv[3] == "raise":
        raise RuntimeError("boom in training")
    if sys.argv[3] == "os_exit":
        os._exit(3)  # no atexit: what was recorded still reaches the store, and the exit says how it left
    if sys.argv[3] == "kill":
        import signal
        os.kill(os.getpid(), signal.SIGKILL)  # not a word: what was recorded waits in the spool
    if sys.argv[3].startswith("caught") or sys.argv[3].startswith("kept"):  # a sys.exit the program catches
        def leave():
            sys.exit(3)
        try:
            leave()
        except SystemExit as e:
            if sys.argv[3].startswith("kept"):  # (and keeps until the exit: freed only after atexit)
                kept = e
            if sys.argv[3] == "kept_left":  # (and leaves with it after all)
                raise
        dist.all_reduce(torch.ones(1))
        if sys.argv[3] == "caught_then_exit":
            sys.exit(5)
    if sys.argv[3] == "exit":
        sys.exit(4)
""")


def _run_script(tmp_path, mode: str) -> tuple[int, list[dict]]:
    from commscope.launch import free_port

    store = tmp_path / mode
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(store), str(free_port()), mode],
                          capture_output=True, text=True, timeout=60)
    return proc.returncode, read_events(store)


def test_exit_events_tell_clean_crashed_and_killed_processes_apart(tmp_path):
    code, events = _run_script(tmp_path, "clean")
    assert code == 0
    assert [e["reason"] for e in of_type(events, "exit")] == ["atexit"]
    code, events = _run_script(tmp_path, "raise")
    assert code == 1
    exits = of_type(events, "exit")
    assert len(exits) == 1 and exits[0]["reason"] == "exception"
    assert exits[0]["exc"] == "RuntimeError: boom in training"
    code, events = _run_script(tmp_path, "os_exit")
    assert code == 3
    exits = of_type(events, "exit")
    assert [(e["reason"], e["code"]) for e in exits] == [("os._exit", 3)]
    assert [o["op"] for o in ops(events)] == ["all_reduce"]
    code, events = _run_script(tmp_path, "exit")
    assert code == 4
    assert [(e["reason"], e.get("code")) for e in of_type(events, "exit")] == [("atexit", 4)]
    # a sys.exit caught by the program says nothing of how it leaves later (it said code 3)
    code, events = _run_script(tmp_path, "caught")
    assert code == 0
    assert [(e["reason"], e.get("code")) for e in of_type(events, "exit")] == [("atexit", None)]
    assert [o["op"] for o in ops(events)] == ["all_reduce", "all_reduce"]
    code, events = _run_script(tmp_path, "caught_then_exit")
    assert code == 5
    assert [(e["reason"], e.get("code")) for e in of_type(events, "exit")] == [("atexit", 5)]
    # caught and kept alive until the exit (status 0): its code is taken back all the same;
    # kept and re-raised, it leaves the program, and its code stands
    code, events = _run_script(tmp_path, "kept")
    assert code == 0
    assert [(e["reason"], e.get("code")) for e in of_type(events, "exit")] == [("atexit", None)]
    assert [o["op"] for o in ops(events)] == ["all_reduce", "all_reduce"]
    code, events = _run_script(tmp_path, "kept_left")
    assert code == 3
    assert [(e["reason"], e.get("code")) for e in of_type(events, "exit")] == [("atexit", 3)]
    code, events = _run_script(tmp_path, "kill")
    assert code == -9
    # nobody forwarded its spool (no other rank, no launcher): a reader on this host forwards
    # it, with an exit saying it ended without a word (how, only a launcher could have seen)
    assert [(e["reason"], e["src"]) for e in of_type(events, "exit")] == [("gone", "spool")] and of_type(events, "meta")
    assert [o["op"] for o in ops(events)] == ["all_reduce"]


@pytest.mark.parametrize("source", ["native", "python"])
def test_instrument_before_init_uses_env_defaults(tmp_path, monkeypatch, source):
    """Flight Recorder is switched on only where it is needed: the Python path's C++ coverage."""
    store = tmp_path / "envstore"
    env = dict(os.environ, COMMSCOPE_STORE=str(store), COMMSCOPE_HANG_AFTER="7.5", COMMSCOPE_SOURCE=source)
    env.pop("TORCH_FR_BUFFER_SIZE", None)
    code = textwrap.dedent("""
        import os, torch, torch.distributed as dist, commscope
        from commscope.launch import free_port
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        rec = commscope.instrument()
        print(os.environ.get("TORCH_FR_BUFFER_SIZE"))
        dist.init_process_group("gloo", rank=0, world_size=1)
        dist.all_reduce(torch.ones(1))
        print(rec.hang_after)
    """)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == (["None", "7.5"] if source == "native" else ["2000", "7.5"])
    events = read_events(store)
    assert [o["op"] for o in ops(events)] == ["all_reduce"]
    meta = of_type(events, "meta")[0]
    assert meta["recorder"] == source
    if source == "python":
        assert meta["fr"] is True


class _PairsDoneByNextPoll:
    """Stands in for the Python recorder's CudaTimer where there is no GPU: an op's event
    pair, registered when its call returned (as ``_cuda_stop`` does), has completed by the
    recorder thread's next poll."""

    def __init__(self) -> None:
        self.finished: collections.deque = collections.deque()
        self.dropped = 0

    def poll(self) -> list[tuple[int, int]]:
        out = []
        while self.finished:
            out.append((self.finished.popleft(), 1000))
        return out


def quick_device_ops(rank: int, ws: int, store: str) -> int:
    rec = commscope.instrument(store, sample_interval=0.05)
    hot = rec.ops
    timer = hot.cuda = _PairsDoneByNextPoll()
    issued = []
    take_id = hot.next_id

    def next_id() -> int:
        issued.append(take_id())
        return issued[-1]

    hot.next_id = next_id
    x = torch.ones(4)
    for _ in range(40):
        dist.all_reduce(x)
        timer.finished.append(issued[-1])
        time.sleep(0.002)
    time.sleep(0.3)
    return len(issued)


def test_python_recorder_writes_a_device_done_after_its_ops_begin_and_end(tmp_path):
    """Found on an H200: ops that finished on the device before the thread's next drain got
    their ``done`` written ahead of their begin, and readers dropped it."""
    store = tmp_path / "trace"
    n = run_ranks(quick_device_ops, 1, args=(str(store),), env={"COMMSCOPE_SOURCE": "python"})[0].value
    events = [e for e in read_events(store) if e["type"] == "op"]
    assert n == 40 and len(ops(events)) == 40
    position = {(e["id"], e["phase"]): i for i, e in enumerate(events)}
    for o in ops(events):
        assert o["phases"]["done"]["gpu_ns"] == 1000, o
        assert position[(o["id"], "begin")] < position[(o["id"], "end")] < position[(o["id"], "done")]
