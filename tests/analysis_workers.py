"""Rank functions for the analysis end-to-end tests (module level: pickled by reference).

Every fault scenario ends by sleeping, so the job stays hung until the test kills it;
exceptions Gloo raises (size mismatch, a dead peer) are swallowed for the same reason.
"""

from __future__ import annotations

import os
import time

HANG_AFTER = 2.0
SAMPLE = 0.2
LINGER = 120.0


def _start(store: str) -> None:
    import commscope

    commscope.instrument(store, hang_after=HANG_AFTER, sample_interval=SAMPLE)


def _hang() -> None:
    time.sleep(LINGER)


def skip_one(rank: int, ws: int, store: str) -> None:
    import torch
    import torch.distributed as dist

    _start(store)
    t = torch.ones(8)
    for i in range(5):
        if rank == ws - 1 and i == 2:
            continue  # the bug: this rank skips one all_reduce
        dist.all_reduce(t)
    _hang()


def disagree(rank: int, ws: int, store: str) -> None:
    import torch
    import torch.distributed as dist

    _start(store)
    t = torch.ones(8)
    try:
        for _ in range(3):
            dist.all_reduce(t)
        if rank == 1:
            dist.broadcast(t, src=0)
        else:
            dist.all_reduce(t)
    except Exception:
        pass
    _hang()


def shape_mismatch(rank: int, ws: int, store: str) -> None:
    import torch
    import torch.distributed as dist

    _start(store)
    try:
        for _ in range(3):
            dist.all_reduce(torch.ones(8))
        dist.all_reduce(torch.ones(12 if rank == 1 else 8))
    except Exception:
        pass
    _hang()


def p2p_cycle(rank: int, ws: int, store: str) -> None:
    import torch
    import torch.distributed as dist

    _start(store)
    dist.all_reduce(torch.ones(2))
    buf = torch.zeros(4)
    dist.recv(buf, src=(rank - 1) % ws)  # everyone receives first: nobody ever sends
    dist.send(buf, dst=(rank + 1) % ws)
    _hang()


def exit_mid_run(rank: int, ws: int, store: str) -> None:
    import torch
    import torch.distributed as dist

    _start(store)
    t = torch.ones(8)
    for _ in range(3):
        dist.all_reduce(t)
    if rank == 1:
        time.sleep(0.5)  # let the recorder write what happened so far
        os._exit(3)
    try:
        dist.all_reduce(t)
    except Exception:
        pass
    _hang()


def straggler(rank: int, ws: int, store: str) -> None:
    import torch
    import torch.distributed as dist

    _start(store)
    t = torch.ones(8)
    for _ in range(14):
        if rank == ws - 1:
            time.sleep(0.12)
        dist.all_reduce(t)
    _hang()


def healthy(rank: int, ws: int, store: str) -> None:
    """Collectives, subgroup, async overlap, p2p ring, batch_isend_irecv: must yield no findings."""
    import torch
    import torch.distributed as dist

    import commscope

    commscope.instrument(store, hang_after=HANG_AFTER, sample_interval=SAMPLE)
    t = torch.ones(16)
    sub = dist.new_group([0, 1])
    for _ in range(3):
        dist.all_reduce(t)
        w = dist.all_reduce(t.clone(), async_op=True)
        if rank in (0, 1):
            dist.all_reduce(t, group=sub)
        w.wait()
        ops = [dist.P2POp(dist.isend, t, (rank + 1) % ws), dist.P2POp(dist.irecv, torch.empty(16), (rank - 1) % ws)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        if rank % 2 == 0:
            dist.send(t, (rank + 1) % ws)
            dist.recv(t, (rank - 1) % ws)
        else:
            dist.recv(t, (rank - 1) % ws)
            dist.send(t, (rank + 1) % ws)
        dist.broadcast(t, src=0)
        dist.all_gather([torch.empty(16) for _ in range(ws)], t)
        dist.barrier()
    commscope.uninstrument()


def fr_dump(out: str) -> None:
    import torch

    c10d = torch._C._distributed_c10d
    import torch.distributed as dist

    rank = dist.get_rank()
    for kind in ("json", "pkl"):
        os.makedirs(os.path.join(out, kind), exist_ok=True)
    with open(os.path.join(out, "json", f"fr_trace_{rank}"), "wb") as f:
        data = c10d._dump_fr_trace_json(includeCollectives=True, onlyActive=False)
        f.write(data if isinstance(data, bytes) else data.encode())
    with open(os.path.join(out, "pkl", f"fr_trace_{rank}"), "wb") as f:
        f.write(c10d._dump_fr_trace(includeCollectives=True, includeStackTraces=False, onlyActive=False))


def fr_crosscheck(rank: int, ws: int, store: str, out: str, mismatch: bool) -> None:
    """Recorded by commscope and by Flight Recorder at once; dumps FR at the end.

    With ``mismatch``, rank 1 passes a smaller tensor to the last all_reduce.  It is
    issued async and every rank dumps right away, as FR would on a hang: Gloo may abort
    a process once the mismatched data arrives.
    """
    import torch
    import torch.distributed as dist

    import commscope

    commscope.instrument(store, hang_after=HANG_AFTER, sample_interval=SAMPLE)
    t = torch.ones(6)
    sub = dist.new_group([0, 1])
    dist.all_reduce(t)
    dist.broadcast(t, src=0)
    if rank in (0, 1):
        dist.all_reduce(torch.ones(3), group=sub)
    dist.all_gather([torch.empty(6) for _ in range(ws)], t)
    dist.barrier()
    if mismatch:
        work = dist.all_reduce(torch.ones(2 if rank == 1 else 6), async_op=True)
        fr_dump(out)
        from commscope.record.recorder import active

        rec = active()
        if rec is not None:
            rec.flush(timeout=1.0)
        try:
            work.wait()
        except Exception:
            pass
        time.sleep(LINGER)
    dist.all_reduce(torch.ones(2, 5))
    commscope.uninstrument()
    fr_dump(out)
