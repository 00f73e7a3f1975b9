"""A rank's last tick, cut by the process ending: its ``exit`` reaches the store exactly once.

``uninstrument`` (and atexit) wait for the recorder thread's last tick, which writes the
rest and the ``exit``.  On a loaded host that tick outlasted the old 1 s wait, the process
left, the daemon thread stopped mid-tick, and the rank's ``exit`` was lost (a forwarder
then wrote a launcher's or a ``gone`` one: the unwaited work uncounted, a clean rank read
as killed) or, cut after its write, written twice (the rank's own and a forwarder's).
Here the last tick is held forever at each of those points and the wait shortened, so the
cut is certain: every rank still has its own ``exit``, once, and every op record."""

from __future__ import annotations

from collections import Counter

import pytest

from commscope.launch import Job, free_port
from commscope.record import recorder as recording
from commscope.store import open_reader

pytestmark = pytest.mark.timeout(180)

UNWAITED = 300
OPS = UNWAITED + 50 + 1  # the unwaited, the waited, the barrier


def cut_job(rank: int, ws: int, store: str, case: str) -> None:
    import sys
    import threading

    import torch
    import torch.distributed as dist

    import commscope
    from commscope.record import outbox, recorder
    from commscope.store import StoreError

    where = CASES[case]
    held = getattr(recorder.Recorder, where)
    write = recorder.Recorder._write

    def hold_forever(self, *args, **kwargs):
        if self.exited and self._stop.is_set() and (where != "_write" or args[0]):  # the last tick only
            if case == "refused, then cut":  # what the caller past its hold does, surely after the last write
                self._keep_exit()
            threading.Event().wait()
        return held(self, *args, **kwargs)

    def refused(lines):
        raise StoreError("the store refuses (test)")

    def refusing(self, final, *args):
        if final and self.outbox.writer is not None:
            self.outbox.writer.write = refused
        return write(self, final, *args)

    setattr(recorder.Recorder, where, hold_forever)
    if case == "refused, then cut":
        recorder.Recorder._write = refusing
        outbox.Outbox.FINAL_WRITE_S = 0.0  # (no retries)
    recorder.Recorder.FINAL_HOLD_S = 0.5  # the thread never ends: any wait is cut
    # (the forkserver's fd 2 is not the test's): the rank's stderr from now on
    sys.stderr = open(f"{store}-{rank}.err", "w", buffering=1)  # noqa: SIM115
    commscope.instrument(store, sample_interval=0.2, hang_after=60.0, flight_recorder=False)
    x = torch.ones(1)
    kept = [dist.all_reduce(x, async_op=True) for _ in range(UNWAITED)]  # never waited
    for _ in range(50):
        dist.all_reduce(x, async_op=True).wait()
    dist.barrier()
    if case == "stored at destroy, then cut":
        del kept  # (each collected unwaited: counted as such)
        dist.destroy_process_group()  # its exit written by an ordinary tick; then the launcher leaves
        rec = recorder.active()
        for _ in range(600):  # (stored, and the spool says so: the case this is)
            if rec.group_end_stored:
                return
            rec.flush()
        raise AssertionError("destroy_process_group's exit never reached the store")
    commscope.uninstrument()
    del kept


#: case -> the recorder's method its last tick is held in forever
CASES = {
    "cut before the write": "_write",
    "cut after the write": "_leave_spool",
    "refused, then cut": "_leave_spool",  # the last write keeps the exit in the spool, then the caller
    "stored at destroy, then cut": "_write",  # an ordinary tick wrote it: the spool says so as well
}


@pytest.mark.parametrize("recorder", ["native", "python"])
@pytest.mark.parametrize("case", list(CASES))
def test_a_cut_last_tick_keeps_the_ranks_own_exit_once(tmp_path, recorder, case):
    """Cut before the store took the last events, the exit waits in the spool for the
    launcher's forwarder; cut after, the spool says the exit is stored and the forwarder
    adds none; the store refusing and then the hold running out keep it once, not twice."""
    store = str(tmp_path / "trace")
    job = f"cut-{recorder}-{case.split(',')[0].replace(' ', '-')}"
    env = {"COMMSCOPE_JOB": job, "COMMSCOPE_SOURCE": recorder}
    results = Job(cut_job, 2, args=(store, case), env=env).start().join(120)
    assert all(r.ok for r in results.values()), {k: r.error for k, r in results.items()}
    events = open_reader(f"{store}/{job}").read_all()
    exits = [e for e in events if e["type"] == "exit"]
    reason = "destroy_process_group" if case.startswith("stored") else "uninstrument"
    assert sorted((e["rank"], e.get("src"), e["reason"], e.get("unwaited_count")) for e in exits) == [
        (0, None, reason, UNWAITED), (1, None, reason, UNWAITED)]
    ends = Counter(e["rank"] for e in events if e["type"] == "op" and e["phase"] == "end")
    assert ends == {0: OPS, 1: OPS}
    for rank in (0, 1):  # said where the rank's output goes
        with open(f"{store}-{rank}.err") as err:
            assert f"commscope: rank {rank}: the recorder's last write did not end within 0.5 s" in err.read()


def restarted_then_cut(slot: int, ws: int, store: str, ports: list[int]) -> None:
    """Incarnation 0 ends at destroy_process_group; incarnation 1's last tick is cut."""
    import os
    import threading
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    import commscope
    from commscope.record import recorder

    samples = recorder.Recorder._samples

    def hold_forever(self, *args, **kwargs):
        if self.exited and self._stop.is_set():
            threading.Event().wait()
        return samples(self, *args, **kwargs)

    recorder.Recorder._samples = hold_forever
    recorder.Recorder.FINAL_HOLD_S = 0.5
    commscope.instrument(store, sample_interval=0.2, hang_after=60.0, flight_recorder=False)
    x = torch.ones(1)
    for inc in range(2):
        os.environ["MASTER_PORT"] = str(ports[inc])
        dist.init_process_group("gloo", rank=slot, world_size=2, timeout=timedelta(seconds=60))
        dist.all_reduce(x)
        if inc == 0:
            dist.destroy_process_group()
    kept = [dist.all_reduce(x, async_op=True) for _ in range(5)]
    dist.barrier()
    commscope.uninstrument()
    del kept


def test_a_cut_after_a_restart_keeps_the_new_incarnation_s_own_exit(tmp_path):
    """(helper-86) The exit queued in incarnation 0 was kept again for incarnation 1."""
    store = str(tmp_path / "trace")
    results = Job(restarted_then_cut, 2, args=(store, [free_port(), free_port()]), init=False,
                  env={"COMMSCOPE_JOB": "restarted"}).start().join(120)
    assert all(r.ok for r in results.values()), {k: r.error for k, r in results.items()}
    exits = [e for e in open_reader(f"{store}/restarted").read_all() if e["type"] == "exit"]
    in_order = sorted((e["rank"], e["ts"], e["reason"], e.get("unwaited_count")) for e in exits)
    assert [(r, reason, count) for r, _ts, reason, count in in_order] == [
        (r, reason, count) for r in (0, 1) for reason, count in (("destroy_process_group", None), ("uninstrument", 5))]


def test_keeping_the_exit_never_waits_for_good_on_its_lock():
    """(helper-87) ``_keep_exit`` may run in a signal handler (``os._exit``) that interrupted
    the lock's holder: it waited forever; now it gives up (the exit then reads as the
    forwarder says), keeping nothing."""
    import threading
    from types import SimpleNamespace

    kept: list[bytes] = []
    rec = recording.Recorder.__new__(recording.Recorder)
    rec._exit_lock, rec.rank, rec.EXIT_LOCK_WAIT_S, rec.spool = threading.Lock(), 0, 0.05, object()
    rec._exit_line, rec._exit, rec._exit_kept, rec._exit_stored = b'{"type":"exit"}', None, False, False
    rec.group_end_stored, rec._destroy_line, rec._kept_any = False, None, False
    rec.ops = SimpleNamespace(keep_event=kept.append)
    with rec._exit_lock:  # held, as by the thread the handler interrupted
        rec._keep_exit()
    assert kept == []
    rec._keep_exit()  # (free: kept, once)
    rec._keep_exit()
    assert kept == [b'{"type":"exit"}']


def test_a_forked_child_does_not_inherit_the_ending_lock_held():
    """(helper-87) A child forked while a thread of the parent ended the recording waited
    ENDING_WAIT_S in its own ``os._exit`` for a lock nobody there releases."""
    import threading

    held, taken, done = recording._ending, threading.Event(), threading.Event()

    def holder():  # (the parent's thread that is ending the recording)
        with held:
            taken.set()
            done.wait()

    t = threading.Thread(target=holder)
    t.start()
    try:
        taken.wait()
        recording._after_fork_child()  # (what the child runs, with no recorder here)
        assert recording._ending is not held and recording._ending.acquire(blocking=False)
        recording._ending.release()
    finally:
        recording._ending = held
        done.set()
        t.join()
