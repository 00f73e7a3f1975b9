"""A training script in which rank 1 raises mid-loop, run as a plain ``python`` process per rank.

Run by tests/test_e2e_failures.py the way a launcher runs a script (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT in the environment), so the exception travels the real path:
uncaught, ``sys.excepthook``, interpreter exit.  The other ranks' all_reduce then fails;
they wait for the test's release file and let that exception go uncaught too.

With ``after_destroy``, every rank runs its 10 steps and destroys its process group, and
rank 1 then raises saving its checkpoint: a crash after the group ended; ``world``: the
group destroyed as ``destroy_process_group(dist.group.WORLD)``; ``segv``: rank 1 dies of a
segfault instead; ``full``: the store refuses rank 1's writes once the group ended (the
disk its checkpoint filled is the store's); ``full_early``: from just before it ended.

With ``finally``, the ranks destroy their group in a ``finally``: rank 0 raises at step 5,
rank 1 has an irecv posted that its code waits on after the all_reduce the exception cut.

With ``ddp ODD``, rank ODD builds its model one input wider than the others' and every rank
wraps it in DistributedDataParallel: its check of the models across ranks raises on the
ranks whose parameters differ from rank 0's, and the others then fail on the ones gone.

With ``pipe WIDTH``, three pipeline stages pass (4, 16) float32 tensors on with
``batch_isend_irecv``, four microbatches; rank 1 sends its third one (4, WIDTH) wide: wider,
Gloo aborts rank 2 on it; narrower, it is taken without a word.

    python raising_rank.py STORE RELEASE [after_destroy [world|segv|full|full_early] | finally | ddp ODD
                                          | pipe WIDTH]
"""

import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import commscope


def load_batch(rank: int, step: int) -> torch.Tensor:
    if rank == 1 and step == 5:
        raise ValueError(f"corrupt record in shard {rank} at step {step}")
    return torch.ones(8)


def save_checkpoint(rank: int) -> None:
    if rank == 1:
        raise OSError(f"checkpoint shard {rank}: No space left on device")


def main() -> None:
    store, release = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    commscope.instrument(store, hang_after=2.0, sample_interval=0.2)
    rank = dist.get_rank()
    if sys.argv[3:4] == ["ddp"]:
        from torch.nn.parallel import DistributedDataParallel

        width = 9 if rank == int(sys.argv[4]) else 8
        model = DistributedDataParallel(torch.nn.Linear(width, 4))
        for _ in range(3):
            model(torch.ones(2, width)).sum().backward()
        return
    if sys.argv[3:4] == ["pipe"]:
        world = dist.get_world_size()
        for mb in range(4):
            ops = []
            if rank > 0:
                ops.append(dist.P2POp(dist.irecv, torch.empty(4, 16), rank - 1))
            if rank < world - 1:
                width = int(sys.argv[4]) if rank == 1 and mb == 2 else 16
                ops.append(dist.P2POp(dist.isend, torch.ones(4, width), rank + 1))
            for work in dist.batch_isend_irecv(ops):
                work.wait()
        dist.barrier()
        return
    if sys.argv[3:] == ["finally"]:
        try:
            for step in range(10):
                if rank == 1:
                    work = dist.irecv(torch.zeros(8), src=0)
                else:
                    dist.send(torch.ones(8), dst=1)
                t = load_batch(rank + 1, step)  # (rank 0 raises at step 5)
                dist.all_reduce(t)
                if rank == 1:
                    work.wait()
        finally:
            dist.destroy_process_group()
        return
    if sys.argv[3:4] == ["after_destroy"]:
        how = sys.argv[4] if len(sys.argv) > 4 else ""
        for _ in range(10):
            dist.all_reduce(torch.ones(8))
        if how == "full_early" and rank == 1:  # (the store refuses the destroy's exit as well)
            from commscope.record.recorder import active
            from commscope.store import StoreError

            def refuse_all(*_args, **_kwargs):
                raise StoreError("No space left on device", 0)

            active().flush(timeout=5.0)
            active().outbox.writer.write = refuse_all
        dist.destroy_process_group(dist.group.WORLD if how == "world" else None)
        if how == "full" and rank == 1:
            from commscope.record.recorder import active
            from commscope.store import StoreError

            active().flush(timeout=5.0)  # (the destroy's exit stored)

            def refuse(*_args, **_kwargs):
                raise StoreError("No space left on device", 0)

            active().outbox.writer.write = refuse
        if how == "segv" and rank == 1:
            import ctypes

            ctypes.string_at(0)
        save_checkpoint(rank)
        return
    try:
        for step in range(400):
            t = load_batch(rank, step)
            dist.all_reduce(t)
    except RuntimeError:
        end = time.monotonic() + 60
        while not os.path.exists(release) and time.monotonic() < end:
            time.sleep(0.05)
        raise


if __name__ == "__main__":
    main()
