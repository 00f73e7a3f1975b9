"""Rank functions for the death matrix (module level: pickled by reference).  How a rank
dies (``die``) is the one ``commscope bench deaths`` uses.

Rank 1 dies of ``cause`` at ``moment``; before it dies it writes how many ops it issued
(its own count) to ``count_path``, which the test compares with what the trace holds.
Rank 0 runs on until its collective fails.  No sleep synchronises anything: the sleeps in
``mid_run`` only give the recorder thread time to drain some ticks, as a real job would.
The one wait is rank 1's, before it dies, for rank 0 to be about to enter the op rank 1
never joins (a file rank 0 makes just before it, polled): a launcher stops the others when
one dies, and a rank 0 it stopped before that op waited for nobody.
"""

from __future__ import annotations

import os
import time

from commscope.bench.deaths import die

CAUSES = ("abort", "segfault", "sigkill", "os_exit", "exception", "terminate")
MOMENTS = ("after_init", "first_tick", "mid_run", "after_op")
MID = 30  # ops before a mid-run death

#: What the trace must say about each cause: the finding's kind and a word of its cause.
EXPECT = {
    "abort": ("rank_crashed", "SIGABRT (Aborted)"),
    "segfault": ("rank_crashed", "SIGSEGV (Segmentation fault)"),
    "sigkill": ("dead_rank", "killed by SIGKILL"),
    "os_exit": ("dead_rank", "os._exit(3)"),
    "exception": ("rank_crashed", "RuntimeError: rank 1 gave up"),
    "terminate": ("rank_crashed", "gloo::EnforceNotMet: sizes differ"),
    "sigterm": ("dead_rank", "killed by SIGTERM"),
}
#: The Python recorder has no C++ in the process to hook ``std::terminate``: it sees the abort.
EXPECT_PYTHON = {**EXPECT, "terminate": ("rank_crashed", "SIGABRT (Aborted)")}
#: Under a launcher of its own (mp.spawn, torchrun) nothing of commscope sees a rank's exit
#: status: a SIGKILL is known only as an end without a word, forwarded from its spool.
UNSEEN = {"sigkill": ("dead_rank", "ended without a word")}


def dying(rank: int, ws: int, store: str, cause: str, moment: str, count_path: str) -> None:
    import torch
    import torch.distributed as dist

    import commscope

    commscope.instrument(store, sample_interval=0.2, hang_after=60.0, flight_recorder=False)
    t = torch.ones(16)
    issued = 0

    def own_count(n: int) -> None:
        with open(count_path + ".tmp", "w") as f:
            f.write(str(n))
        os.replace(count_path + ".tmp", count_path)

    # ("peer_idle": rank 1 dies after its op MID while rank 0 is between ops, in Python, until
    # its launcher stops it: nobody waits for rank 1 in an op)
    last = {"after_init": 0, "first_tick": 3, "mid_run": MID, "after_op": MID, "peer_idle": MID}[moment]
    # (rank 1 dies once rank 0 is about to enter the op rank 1 never joins: under a launcher
    # that stops the others when one dies, a rank 0 slowed by a loaded host was stopped before
    # it entered it, so nobody waited for rank 1 and "no findings" was the right answer, CI's
    # ``[spawn-os_exit-after_init-native]``; not for "peer_idle", which is that case on purpose)
    entering = count_path + ".rank0-entering"
    for step in range(400):
        if rank == 0 and step == last and moment == "peer_idle":
            while True:
                time.sleep(0.05)
        if rank == 0 and step == last:
            open(entering, "w").close()
        if rank == 1 and step == last:
            if moment == "mid_run":  # one async op still in flight when it dies
                dist.all_reduce(t, async_op=True)
                issued += 1
            deadline = time.monotonic() + 60
            while moment != "peer_idle" and not os.path.exists(entering) and time.monotonic() < deadline:
                time.sleep(0.005)
            own_count(issued)
            die(cause)
        dist.all_reduce(t)
        issued += 1
        if moment in ("mid_run", "after_op") and step == MID // 2:
            time.sleep(0.3)  # the recorder drains a few ticks: the death finds a half-sent ring
    commscope.uninstrument()


def skipping(rank: int, ws: int, store: str) -> None:
    """The commonest DDP bug: rank 2 skips the loss all_reduce of one batch.  Its next
    all_reduce (the big gradient) meets the others' small one, and Gloo aborts a rank
    (``terminate called after throwing gloo::EnforceNotMet``)."""
    import torch
    import torch.distributed as dist

    import commscope

    commscope.instrument(store, sample_interval=0.2, hang_after=60.0, flight_recorder=False)
    grad, loss = torch.ones(100_000), torch.ones(10)
    for step in range(60):
        dist.all_reduce(grad)
        if not (rank == 2 and step == 20):
            dist.all_reduce(loss)
    commscope.uninstrument()


def dying_together(rank: int, ws: int, store: str, cause: str, count_dir: str) -> None:
    """Ranks 1 and 2 die of ``cause`` right after the same all_reduce (as a host's ranks do
    when it is lost); the others run on until their collective fails."""
    import torch
    import torch.distributed as dist

    import commscope

    commscope.instrument(store, sample_interval=0.2, hang_after=60.0, flight_recorder=False)
    t = torch.ones(16)
    for step in range(400):
        if rank in (1, 2) and step == MID:
            path = os.path.join(count_dir, str(rank))
            with open(path + ".tmp", "w") as f:
                f.write(str(step))
            os.replace(path + ".tmp", path)
            die(cause)
        dist.all_reduce(t)
    commscope.uninstrument()




def failing_before_a_tick(rank: int, ws: int, store: str, count_path: str) -> None:
    """Rank 1 segfaults right after init.  Rank 0 holds its recorder's tick lock (a loaded
    host's thread, late), its all_reduce fails on rank 1's closed connection, and it is
    SIGTERMed (as mp.spawn stops the rank left) before any tick took its group: its records
    reach the store only from its spool."""
    import signal

    import torch
    import torch.distributed as dist

    import commscope

    rec = commscope.instrument(store, sample_interval=0.2, hang_after=60.0, flight_recorder=False)
    if rank == 1:
        with open(count_path, "w") as f:
            f.write("0")
        die("segfault")
    rec.flush(10.0)
    with rec._tick_lock:  # (no tick from here on)
        try:
            dist.all_reduce(torch.ones(4))
        finally:
            os.kill(os.getpid(), signal.SIGTERM)
