"""Uninstrumented Gloo jobs that hang, for ``commscope snapshot``: ``bench snapshot`` and
tests/test_snapshot.py run them (``python -m commscope.bench.hungjob MODE``).

Nothing here instruments anything: these are jobs commscope never saw start.  Run as a rank
(RANK/WORLD_SIZE from the launcher: torchrun or plain processes) or as a
``torch.multiprocessing.spawn`` parent (``--spawn N``).  MODE picks the fault:

    missing    rank 2 spins in Python; the others wait in all_reduce
    loader     rank 1 sleeps in a DataLoader's dataset; the others wait in all_reduce
    mismatch   rank 3 calls broadcast; the others all_reduce
    cycle      ranks 0 and 1 each recv from the other; the rest wait in barrier
    dead       rank 3 kills itself (SIGKILL); rank 1 stays in all_reduce, the ones whose
               connection to it broke catch the error and sleep
    flight     like missing, and every rank writes its Flight Recorder dump to
               $TORCH_FR_DUMP_TEMP_FILE<rank> 2 s into the hang (as NCCL's watchdog does on a
               timeout; run with TORCH_FR_BUFFER_SIZE set)
    debugserver  like missing, with torch's debug server running (it serves every rank's Flight
               Recorder buffer; DEBUG_PORT: its frontend's port; needs tabulate and jinja2)
    steps      healthy: all_reduce in a loop, printing the time per step (the cost bench)
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

HOLD_S = 600  # nothing hangs longer than a test: the test kills the job


def spin() -> None:
    x = 0
    while True:
        x += 1


class SlowDataset(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(HOLD_S)  # a stuck read
        return torch.ones(1)


def _dump_later(rank: int) -> None:
    """The Flight Recorder dump a watchdog writes once the collective has hung a while."""
    from torch._C._distributed_c10d import _dump_fr_trace_json

    time.sleep(2.0)
    data = _dump_fr_trace_json(includeCollectives=True, onlyActive=False)
    path = os.environ["TORCH_FR_DUMP_TEMP_FILE"] + str(rank)
    with open(path + ".tmp", "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())
    os.replace(path + ".tmp", path)


def work(rank: int, world: int, mode: str) -> None:
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=HOLD_S))
    t = torch.ones(1000)
    dist.all_reduce(t)
    if mode == "steps":
        steps = int(os.environ.get("STEPS", "200"))
        for _step in range(steps):
            t0 = time.perf_counter()
            for _ in range(20):
                dist.all_reduce(t)
            if rank == 0:
                print(f"step {(time.perf_counter() - t0) * 1e3:.3f}", flush=True)
        dist.destroy_process_group()
        return
    if mode == "flight":
        threading.Thread(target=_dump_later, args=(rank,), daemon=True).start()
        mode = "missing"
    if mode == "debugserver":
        from torch.distributed.debug import start_debug_server

        start_debug_server(port=int(os.environ["DEBUG_PORT"]))  # (it reads RANK and MASTER_* itself)
        mode = "missing"
    if mode == "missing":
        if rank == 2:
            spin()
        dist.all_reduce(t)
    elif mode == "missing-caught":  # (rank 2 spins; the others wait, and outlive its death)
        if rank == 2:
            spin()
        try:
            dist.all_reduce(t)
        except RuntimeError:
            time.sleep(HOLD_S)
    elif mode == "loader":
        if rank == 1:
            for batch in torch.utils.data.DataLoader(SlowDataset(), num_workers=0):
                t += batch
        dist.all_reduce(t)
    elif mode == "mismatch":
        if rank == 3:
            dist.broadcast(t, src=0)
        else:
            dist.all_reduce(t)
    elif mode == "cycle":
        if rank < 2:
            dist.recv(t, src=1 - rank)
        else:
            dist.barrier()
    elif mode == "dead":
        if rank == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            dist.all_reduce(t)
        except RuntimeError:
            time.sleep(HOLD_S)  # a job that waits for the rank to come back
    time.sleep(HOLD_S)


def spawned(rank: int, world: int, mode: str) -> None:
    work(rank, world, mode)


if __name__ == "__main__":
    if sys.argv[1] == "--spawn":
        import torch.multiprocessing as mp

        world = int(sys.argv[2])
        mp.spawn(spawned, args=(world, sys.argv[3]), nprocs=world)
    else:
        work(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), sys.argv[1])
