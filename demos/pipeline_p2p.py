"""Pipeline parallelism with point-to-point ops: each rank is one stage of a small model.

Run it under commscope (2 or more ranks):

    commscope run -- torchrun --standalone --nproc-per-node 4 demos/pipeline_p2p.py
    commscope attach ./commscope-trace        # live, from another terminal
    commscope check ./commscope-trace         # afterwards: no findings, exit 0

or without commscope:  torchrun --standalone --nproc-per-node 4 demos/pipeline_p2p.py

Options: --iters N (default 8), --micro N micro-batches per iteration (default 6),
--backend nccl (CUDA, one GPU per rank), --pause SECONDS per micro-batch (default 0.05).

What it does: micro-batches of different sequence lengths flow forward through the stages
with commscope.varlen.send_tensors/recv_tensors (activations plus token ids; the receiver
needs no shapes or dtypes in advance); the last stage returns each micro-batch's loss to
stage 0 with isend_tensors, closing the ring; gradients then flow backwards with
torch.distributed.batch_isend_irecv; one all_reduce per iteration keeps the stages'
scalars in step.

What to look for in the console: the fill-and-drain wave moving from rank to rank in the
timeline, each send matched with its recv on the next rank (op detail: sizes differ per
micro-batch), and batch_isend_irecv containers with their isend/irecv children.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist

from commscope import varlen

WIDTH = 32


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=8)
    ap.add_argument("--micro", type=int, default=6)
    ap.add_argument("--backend", choices=["gloo", "nccl"], default="gloo")
    ap.add_argument("--pause", type=float, default=0.05)
    args = ap.parse_args()

    if args.backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(args.backend)
    rank, ws = dist.get_rank(), dist.get_world_size()
    if ws < 2:
        raise SystemExit("pipeline_p2p.py needs at least 2 ranks (--nproc-per-node 2 or more)")
    dev = torch.device("cuda", torch.cuda.current_device()) if args.backend == "nccl" else torch.device("cpu")
    first, last = 0, ws - 1
    torch.manual_seed(rank)
    stage = torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.GELU()).to(dev)
    lengths = torch.Generator().manual_seed(1234)  # every rank draws the same lengths
    t0 = time.time()
    for it in range(args.iters):
        # forward: activations through the stages, losses back to stage 0
        sends = []
        for _ in range(args.micro):
            seq = int(torch.randint(4, 65, (1,), generator=lengths))
            if rank == first:
                x = torch.randn(seq, WIDTH, device=dev)
                ids = torch.arange(seq, device=dev)
            else:
                x, ids = varlen.recv_tensors(src=rank - 1)
            with torch.no_grad():
                y = stage(x)
            if rank == last:
                sends.append(varlen.isend_tensors([y.pow(2).mean().reshape(1)], dst=first))
            else:
                varlen.send_tensors([y, ids], dst=rank + 1)
            if args.pause:
                time.sleep(args.pause)
        if rank == first:
            losses = [float(varlen.recv_tensors(src=last)[0]) for _ in range(args.micro)]
            print(f"iteration {it}: mean loss {sum(losses) / len(losses):.4f}", flush=True)
        for w in sends:
            w.wait()
        # backward: each stage hands a gradient to the previous one, receives the next one's
        for _ in range(args.micro):
            grad = torch.randn(8, WIDTH, device=dev)
            into = torch.empty(8, WIDTH, device=dev)
            ops = [dist.P2POp(dist.isend, grad, (rank - 1) % ws), dist.P2POp(dist.irecv, into, (rank + 1) % ws)]
            for work in dist.batch_isend_irecv(ops):
                work.wait()
        scale = torch.ones(1, device=dev)
        dist.all_reduce(scale)
    dist.destroy_process_group()
    if rank == first:
        print(f"pipeline_p2p: completed {args.iters} iterations on {ws} stages in {time.time() - t0:.1f} s",
              flush=True)


if __name__ == "__main__":
    main()
