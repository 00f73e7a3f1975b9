"""A training script in which rank 1 raises mid-loop, run as a plain ``python`` process per rank.

Run by tests/test_e2e_failures.py the way a launcher runs a script (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT in the environment), so the exception travels the real path:
uncaught, ``sys.excepthook``, interpreter exit.  The other ranks' all_reduce then fails;
they wait for the test's release file and let that exception go uncaught too.

With ``after_destroy``, every rank runs its 10 steps and destroys its process group, and
rank 1 then raises saving its checkpoint: a crash after the group ended.

    python raising_rank.py STORE RELEASE [after_destroy]
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
    if sys.argv[3:] == ["after_destroy"]:
        for _ in range(10):
            dist.all_reduce(torch.ones(8))
        dist.destroy_process_group()
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
