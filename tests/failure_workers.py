"""Rank functions for the failure end-to-end tests (module level: pickled by reference).

Faults happen at a fixed step, after ``flush()`` so what came before is in the store.
Where a test must look at the job while it is broken, the ranks wait for a release file
the test creates once it has seen what it needs (no sleeps as synchronisation).
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from datetime import timedelta

SAMPLE = 0.2
FAULT_STEP = 5
LIMIT = 60.0


def start(store: str, hang_after: float) -> None:
    import commscope

    commscope.instrument(store, hang_after=hang_after, sample_interval=SAMPLE)


def flush() -> None:
    from commscope.record.recorder import active

    rec = active()
    if rec is not None:
        rec.flush(timeout=2.0)


def released(path: str) -> bool:
    return os.path.exists(path)


def wait_release(path: str) -> None:
    end = time.monotonic() + LIMIT
    while not released(path) and time.monotonic() < end:
        time.sleep(0.05)


def finish() -> None:
    import commscope

    commscope.uninstrument()


def _loop(rank: int, fault, steps: int = 400, group=None) -> None:
    import torch
    import torch.distributed as dist

    t = torch.ones(8)
    for step in range(steps):
        if step == FAULT_STEP:
            fault(rank)
        dist.all_reduce(t, group=group)
        t.fill_(1.0)


def quick_group(seconds: float):
    """A group over every rank whose ops time out after ``seconds``.  Created with the default
    group's long timeout (creating it is itself a store barrier that a slow start under load
    must not trip), then shortened."""
    import torch.distributed as dist

    group = dist.new_group()
    group.set_timeout(timedelta(seconds=seconds))
    return group


def killed(rank: int, ws: int, store: str, release: str) -> None:
    """Rank 1 is killed with SIGKILL mid-loop; the others' all_reduce fails."""
    start(store, 2.0)

    def fault(r: int) -> None:
        if r == 1:
            flush()
            os.kill(os.getpid(), signal.SIGKILL)

    try:
        _loop(rank, fault)
    except RuntimeError:
        wait_release(release)
    finish()


def _gone(pid: int) -> bool:
    """The process has ended (a zombie its parent has not reaped yet has)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def deadline_exit(rank: int, ws: int, store: str, release: str) -> None:
    """Rank 1 skips all_reduce #6, which rank 0 waits in; once released, both leave through
    ``os._exit(0)`` as a job's own deadline has them (the demo deadlock_mismatch.py does):
    rank 0 from a thread while it waits, rank 1 a second after rank 0 is gone (none of rank
    0's ops can fail on rank 1's leaving)."""
    import threading

    import torch
    import torch.distributed as dist

    start(store, 1.0)
    here = release + ".pid0"
    if rank == 0:
        with open(here + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace(here + ".tmp", here)

        def leave() -> None:
            wait_release(release)
            flush()
            os._exit(0)

        threading.Thread(target=leave, daemon=True).start()
    t = torch.ones(8)
    for step in range(FAULT_STEP + 1):
        if rank == 1 and step == FAULT_STEP:
            break  # "my batch is empty"
        dist.all_reduce(t)
        t.fill_(1.0)
    flush()
    wait_release(release)
    with open(here) as f:
        pid = int(f.read())
    end = time.monotonic() + LIMIT
    while not _gone(pid) and time.monotonic() < end:
        time.sleep(0.05)
    time.sleep(5 * SAMPLE)  # (heartbeats after rank 0 left, as a loaded machine wakes a rank late)
    os._exit(0)


def segfault(rank: int, ws: int, store: str, release: str) -> None:
    """Rank 1 dereferences a null pointer mid-loop."""
    start(store, 2.0)

    def parse_record(r: int) -> None:
        if r == 1:
            flush()
            ctypes.string_at(0)

    try:
        _loop(rank, parse_record)
    except RuntimeError:
        wait_release(release)
    finish()


def spin_in_python(release: str) -> int:
    """Busy pure-Python work that never calls into torch.distributed (the culprit's frame).

    It looks for the release file only twice a second: a loop of short calls that release
    the GIL (like ``os.stat``) starves every other thread of the process in CPython, the
    recorder's included, and the rank would look dead."""
    n = 0
    look = time.monotonic() + 0.5
    while True:
        for _ in range(20_000):
            n += 1
        if time.monotonic() > look:
            if os.path.exists(release):
                return n
            look = time.monotonic() + 0.5


def spinning(rank: int, ws: int, store: str, release: str, hang_after: float, timeout: float | None = None) -> None:
    """Rank 1 spins in Python while the others wait in all_reduce, or time out on it after
    ``timeout`` seconds."""
    start(store, hang_after)
    group = quick_group(timeout) if timeout else None

    def fault(r: int) -> None:
        if r == 1:
            spin_in_python(release)

    try:
        _loop(rank, fault, steps=FAULT_STEP + 1, group=group)
    except RuntimeError:
        wait_release(release)
    wait_release(release)
    finish()


def late_barrier(rank: int, ws: int, store: str, release: str, monitored: bool) -> None:
    """Rank 1 reaches the barrier only after the test releases it: the others time out."""
    import torch.distributed as dist

    start(store, 60.0)
    quick = None if monitored else quick_group(1.0)
    dist.barrier()
    if rank == 1:
        wait_release(release)
    try:
        if monitored:
            dist.monitored_barrier(timeout=timedelta(seconds=1))
        else:
            dist.barrier(group=quick)
    except RuntimeError:
        wait_release(release)
    finish()


def send_into_barrier(rank: int, ws: int, store: str, release: str) -> None:
    """Rank 1 sends to rank 2 (a group of the two), which never posts the recv: it goes into
    the barrier rank 1 never reaches (a wait cycle through it).  The barrier times out on
    ranks 0 and 2 (1 s), which raise it once the test releases them; rank 1's send then
    fails as rank 2's connection closes, and rank 1 raises that."""
    import torch
    import torch.distributed as dist

    start(store, 60.0)
    pair = dist.new_group([1, 2])
    quick = quick_group(1.0)
    dist.barrier()
    if rank == 1:
        dist.send(torch.ones(8), 2, group=pair)
    try:
        dist.barrier(group=quick)
    except RuntimeError:
        wait_release(release)
        raise


def first_use_while_draining(rank: int, ws: int, store: str, release: str) -> None:
    """Ranks 0 and 1 first use a new group (of every rank) while their recorder thread is
    between taking the new groups and draining the records (``NativeOps.collect``, held
    there until the op is recorded); rank 2 never enters.  Before, that tick's block
    restated the group without its members, and no later block restated it (ranks 0 and 1
    record nothing more while they wait): nobody was missing from a group of two."""
    import threading

    import torch
    import torch.distributed as dist

    from commscope.record.nativeops import NativeOps

    armed, between, recorded = threading.Event(), threading.Event(), threading.Event()
    collect = NativeOps.collect

    def held(self, now, final, emit, out, rank_, drain=True):
        m = self.m
        if not armed.is_set() or between.is_set() or final or not drain or rank_ is None:
            return collect(self, now, final, emit, out, rank_, drain)

        class Between:
            def __getattr__(self, name):
                return getattr(m, name)

            def take_groups(self):
                got = m.take_groups()
                between.set()
                recorded.wait(LIMIT)
                return got

        self.m = Between()
        try:
            return collect(self, now, final, emit, out, rank_, drain)
        finally:
            self.m = m

    NativeOps.collect = held
    start(store, 2.0)
    t = torch.ones(8)
    for _ in range(3):
        dist.all_reduce(t)
    group = dist.new_group()
    if rank < 2:
        armed.set()
        between.wait(LIMIT)
        _waiting = dist.all_reduce(t, group=group, async_op=True)  # (its begin is recorded as it is called)
        recorded.set()
    wait_release(release)  # (the test kills the job once it has seen the hang)
    os._exit(0)


def healthy(rank: int, ws: int, store: str) -> None:
    """A slow-but-progressing rank, ranks leaving at different times, destroy_process_group."""
    import torch
    import torch.distributed as dist

    start(store, 2.0)
    t = torch.ones(8)
    for _ in range(10):
        if rank == ws - 1:
            time.sleep(0.3)  # the slow rank: late every step, never past hang_after
        dist.all_reduce(t)
    dist.barrier()
    time.sleep(0.4 * rank)  # ranks finish at different times
    dist.destroy_process_group()
    finish()


def own_count(release: str, rank: int, n: int) -> None:
    """The rank's own count of the ops it issued (``n``), written before it blocks, for
    the test to compare with what the trace holds."""
    path = f"{release}.count{rank}"
    with open(path + ".tmp", "w") as f:
        f.write(str(n))
    os.replace(path + ".tmp", path)


def any_source_beside_a_barrier(rank: int, ws: int, store: str, release: str) -> None:
    """Rank 0 receives from any source; rank 2 waits in the world's barrier, which rank 0,
    in its recv, never reaches; rank 1, idle, neither sends nor comes.  Only rank 1 can
    end it (rank 2 cannot send before rank 0 is in the barrier).  Killed by the test."""
    import torch
    import torch.distributed as dist

    start(store, 5.0)  # (a first barrier's skew under load is no hang)
    dist.barrier()
    flush()
    own_count(release, rank, 1 if rank == 1 else 2)
    if rank == 0:
        dist.recv(torch.ones(8))
    elif rank == 1:
        wait_release(release)
    else:
        dist.barrier()


def p2p_timeout_into_a_chain(rank: int, ws: int, store: str, release: str) -> None:
    """Rank 1 receives from rank 2 on a group whose ops time out (2 s); rank 2 sends to
    rank 3, which went into the barrier of group C (0, 2, 3) with rank 0, the barrier
    rank 2 never reaches.  Rank 1's recv times out, blamed on rank 3 (rank 2 was held by
    it); it raises once the test releases it.  The others hang until killed."""
    import torch
    import torch.distributed as dist

    start(store, 5.0)  # (a first barrier's skew under load is no hang)
    dist.barrier()  # (the ranks together: creating a group is a store barrier of its timeout)
    p12 = dist.new_group([1, 2], timeout=timedelta(seconds=2.0))
    p23 = dist.new_group([2, 3])
    c = dist.new_group([0, 2, 3])
    flush()
    own_count(release, rank, 2)
    if rank == 1:
        try:
            dist.recv(torch.ones(8), 2, group=p12)
        except RuntimeError:
            wait_release(release)
            raise
    elif rank == 2:
        dist.send(torch.ones(8), 3, group=p23)
    else:
        dist.barrier(group=c)


def send_into_barrier_beside_an_idle_rank(rank: int, ws: int, store: str, release: str) -> None:
    """Rank 0 sends to rank 1 (a group of the two), which never posts the recv: it went into
    the barrier (1 s timeout) that rank 0 never reaches; rank 2, idle, never comes either.
    The barrier times out on rank 1, which raises once the test releases it; rank 0's send
    then fails as rank 1's connection closes, and rank 0 raises that; rank 2 returns."""
    import torch
    import torch.distributed as dist

    start(store, 60.0)
    pair = dist.new_group([0, 1])
    quick = quick_group(1.0)
    dist.barrier()
    flush()
    own_count(release, rank, 1 if rank == 2 else 2)
    if rank == 0:
        dist.send(torch.ones(8), 1, group=pair)
    elif rank == 2:
        wait_release(release)
        return
    try:
        dist.barrier(group=quick)
    except RuntimeError:
        wait_release(release)
        raise


def send_into_a_barrier_another_group_waits_on(rank: int, ws: int, store: str, release: str) -> None:
    """Rank 1 sends to rank 2, which never posts the recv: it went into group W's barrier
    (0, 1, 2) with rank 0, the barrier rank 1 never reaches; rank 3 waits in group D's
    all_reduce (2, 3), which rank 2, in the barrier, never reaches.  Hangs until killed."""
    import torch
    import torch.distributed as dist

    start(store, 5.0)  # (a first barrier's skew under load is no hang)
    w = dist.new_group([0, 1, 2])
    d = dist.new_group([2, 3])
    pair = dist.new_group([1, 2])
    dist.barrier()
    flush()
    own_count(release, rank, 2)
    if rank == 1:
        dist.send(torch.ones(8), 2, group=pair)
    elif rank in (0, 2):
        dist.barrier(group=w)
    else:
        dist.all_reduce(torch.ones(8), group=d)


def two_groups_in_different_orders(rank: int, ws: int, store: str, release: str) -> None:
    """Ranks 0 and 1 call the all_reduces of groups A and B (both {0, 1}) in different
    orders, each waiting in one for the other; rank 2 waits in the world's barrier, which
    neither reaches.  Hangs until killed."""
    import torch
    import torch.distributed as dist

    start(store, 5.0)  # (a first barrier's skew under load is no hang)
    a = dist.new_group([0, 1])
    b = dist.new_group([0, 1])
    dist.barrier()
    flush()
    own_count(release, rank, 2)
    if rank < 2:
        dist.all_reduce(torch.ones(8), group=a if rank == 0 else b)
        dist.all_reduce(torch.ones(8), group=b if rank == 0 else a)
    else:
        dist.barrier()


def chain_into_a_deadlock_beside_an_idle_rank(rank: int, ws: int, store: str, release: str) -> None:
    """Ranks 1 and 2 send to each other (a p2p deadlock); rank 3 sends to 2 (a chain into
    it); rank 0 waits in the world's barrier, which none of them reaches; rank 4, idle,
    never comes either.  Hangs until killed."""
    import torch
    import torch.distributed as dist

    start(store, 5.0)  # (a first barrier's skew under load is no hang)
    dist.barrier()
    flush()
    own_count(release, rank, 1 if rank == 4 else 2)
    if rank in (1, 2):
        dist.send(torch.ones(8), 3 - rank)
    elif rank == 3:
        dist.send(torch.ones(8), 2)
    elif rank == 0:
        dist.barrier()
    else:
        wait_release(release)


def chain_into_a_wait_cycle_beside_an_idle_rank(rank: int, ws: int, store: str, release: str) -> None:
    """Group B = 0, 1, 4: rank 1 waits in its all_reduce, which rank 4, sending to 1, never
    reaches (a wait cycle through it) and rank 0, idle, never comes to; rank 3 sends to 1
    as well, and rank 2 to 3 (a chain into the cycle).  Hangs until killed."""
    import torch
    import torch.distributed as dist

    start(store, 5.0)  # (a first barrier's skew under load is no hang)
    b = dist.new_group([0, 1, 4])
    dist.barrier()
    flush()
    own_count(release, rank, 1 if rank == 0 else 2)
    if rank == 1:
        dist.all_reduce(torch.ones(8), group=b)
    elif rank == 0:
        wait_release(release)
    else:
        dist.send(torch.ones(8), 3 if rank == 2 else 1)
