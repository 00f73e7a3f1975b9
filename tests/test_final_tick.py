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

from commscope.launch import Job
from commscope.store import open_reader

pytestmark = pytest.mark.timeout(180)

UNWAITED = 300
OPS = UNWAITED + 50 + 1  # the unwaited, the waited, the barrier


def cut_job(rank: int, ws: int, store: str, where: str) -> None:
    import sys
    import threading

    import torch
    import torch.distributed as dist

    import commscope
    from commscope.record import recorder

    held = getattr(recorder.Recorder, where)

    def hold_forever(self, *args, **kwargs):
        if self.exited and (where != "_write" or args[0]):  # the last tick only
            threading.Event().wait()
        return held(self, *args, **kwargs)

    setattr(recorder.Recorder, where, hold_forever)
    recorder.Recorder.FINAL_HOLD_S = 0.5  # the thread never ends: any wait is cut
    # (the forkserver's fd 2 is not the test's): the rank's stderr from now on
    sys.stderr = open(f"{store}-{rank}.err", "w", buffering=1)  # noqa: SIM115
    commscope.instrument(store, sample_interval=0.2, hang_after=60.0, flight_recorder=False)
    x = torch.ones(1)
    kept = [dist.all_reduce(x, async_op=True) for _ in range(UNWAITED)]  # never waited
    for _ in range(50):
        dist.all_reduce(x, async_op=True).wait()
    dist.barrier()
    commscope.uninstrument()
    del kept


@pytest.mark.parametrize("recorder", ["native", "python"])
@pytest.mark.parametrize("where", ["_write", "_leave_spool"])
def test_a_cut_last_tick_keeps_the_ranks_own_exit_once(tmp_path, recorder, where):
    """``_write``: cut before the store took the last events (the exit waits in the spool
    for the launcher's forwarder); ``_leave_spool``: cut after (the spool says the exit is
    stored, so the forwarder adds none)."""
    store = str(tmp_path / "trace")
    job = f"cut-{recorder}-{where.strip('_')}"
    env = {"COMMSCOPE_JOB": job, "COMMSCOPE_SOURCE": recorder}
    results = Job(cut_job, 2, args=(store, where), env=env).start().join(120)
    assert all(r.ok for r in results.values()), {k: r.error for k, r in results.items()}
    events = open_reader(f"{store}/{job}").read_all()
    exits = [e for e in events if e["type"] == "exit"]
    assert sorted((e["rank"], e.get("src"), e["reason"], e.get("unwaited_count")) for e in exits) == [
        (0, None, "uninstrument", UNWAITED), (1, None, "uninstrument", UNWAITED)]
    ends = Counter(e["rank"] for e in events if e["type"] == "op" and e["phase"] == "end")
    assert ends == {0: OPS, 1: OPS}
    for rank in (0, 1):  # said where the rank's output goes
        with open(f"{store}-{rank}.err") as err:
            assert f"commscope: rank {rank}: the recorder's last write did not end within 0.5 s" in err.read()
