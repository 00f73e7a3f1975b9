"""A job that hangs on purpose, to see how commscope names the culprit.  Ends on its own.

Run it under commscope (3 or more ranks, so there is a majority to disagree with):

    commscope run --hang-after 5 -- torchrun --standalone --nproc-per-node 3 demos/deadlock_mismatch.py
    commscope attach ./commscope-trace        # live, from another terminal, while it hangs
    commscope check ./commscope-trace         # during or after: the finding, exit 1

Choose the bug with --bug:

* mismatch (default): rank 1 takes a different branch and calls broadcast where the
  others call all_reduce.  Look for a collective_mismatch error naming rank 1, with a
  per-rank table of what each rank called at that sequence number and where.
* deadlock: after a few correct ring exchanges, every rank calls recv before send.  Look
  for a p2p_deadlock error with the wait-for cycle (rank 0 waits for 2, 2 for 1, ...).
* skip: the last rank skips one all_reduce.  Look for a missing_ranks error naming it,
  with what it is doing instead and its last sequence number in the group.

The hang is held for --hold seconds (default 30), then every rank prints a line and
exits together, so nothing is left hanging even without commscope or torchrun's help.
Without commscope it is just a job that hangs for a while:
``torchrun --standalone --nproc-per-node 3 demos/deadlock_mismatch.py``.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def exit_at(deadline: float, rank: int, bug: str, late: float = 0.0) -> None:
    """Leave at the deadline, all ranks together (they agreed on it with an all_reduce);
    ``late``: seconds after it (a loaded machine wakes one rank later than the others)."""

    def run() -> None:
        time.sleep(max(0.0, deadline + late - time.time()))
        print(f"deadlock_mismatch: rank {rank} held the {bug} hang until the deadline; exiting", flush=True)
        os._exit(0)  # the process is stuck inside a collective: no clean shutdown is possible

    threading.Thread(target=run, daemon=True).start()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bug", choices=["mismatch", "deadlock", "skip"], default="mismatch")
    ap.add_argument("--hold", type=float, default=30.0, help="seconds the job stays hung before it exits")
    ap.add_argument("--backend", choices=["gloo", "nccl"], default="gloo")
    ap.add_argument("--late-rank", type=int, default=-1,
                    help="this rank leaves half a second after the others (as a loaded machine may have it)")
    args = ap.parse_args()

    if args.backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    # A timeout longer than the hold: the blocked ops stay blocked (as in a real hang)
    # until every rank leaves at the agreed deadline.
    dist.init_process_group(args.backend, timeout=timedelta(seconds=args.hold + 120))
    rank, ws = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", torch.cuda.current_device()) if args.backend == "nccl" else torch.device("cpu")

    t = torch.ones(64, device=dev)
    nxt, prv = (rank + 1) % ws, (rank - 1) % ws
    for _ in range(5):  # healthy steps first
        dist.all_reduce(t)
        t.fill_(1.0)
        if ws > 1:
            if rank % 2 == 0:
                dist.send(t, nxt)
                dist.recv(t, prv)
            else:
                dist.recv(t, prv)
                dist.send(t, nxt)
        time.sleep(0.2)
    # The deadline is agreed just before the bug, so the hang is held --hold seconds however
    # long the healthy steps took (on a loaded machine they can outlast a short hold).
    deadline = torch.tensor([time.time() + args.hold], dtype=torch.float64, device=dev)
    dist.all_reduce(deadline, op=dist.ReduceOp.MAX)
    exit_at(float(deadline), rank, args.bug, 0.5 if rank == args.late_rank else 0.0)
    if rank == 0:
        print(f"deadlock_mismatch: injecting '{args.bug}'; hanging for {args.hold:g} s", flush=True)

    try:
        if args.bug == "mismatch":
            if rank == 1:
                dist.broadcast(t, src=0)  # the others all_reduce here
            else:
                dist.all_reduce(t)
        elif args.bug == "deadlock":
            dist.recv(t, prv)  # everyone waits for its left neighbour first
            dist.send(t, nxt)
        else:
            for step in range(6):
                if rank == ws - 1 and step == 3:
                    continue  # "my batch is empty": this rank skips one gradient sync
                dist.all_reduce(t)
    except Exception:
        if time.time() < float(deadline):
            raise
        # (a rank that left at the deadline a moment before this one closed its connections:
        # this rank leaves as planned, from its own exit thread, not with that error)
    while True:  # a rank that got through waits for the deadline like the others
        time.sleep(1.0)


if __name__ == "__main__":
    main()
