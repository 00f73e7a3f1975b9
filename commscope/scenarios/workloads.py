"""The demo workloads: real torch.distributed work, healthy or with one deliberate bug.

Each ``worker(rank, world_size, ctx)`` runs on a rank whose process group exists and whose
recorder is on (the runner did both).  Tensors live on ``ctx.device(rank)``: CPU for Gloo,
``cuda:rank`` for NCCL.  The faults are written the way they happen in real code (a rank
that skips a step, a branch that calls the wrong collective, receives ordered before
sends), not as fake events.  A hanging worker ends in ``ctx.hold()``: the runner's
watchdog ends every rank together at the demo's deadline.
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist

from commscope.scenarios.base import DemoContext


def _log(rank: int, msg: str) -> None:
    print(f"[rank {rank}] {msg}", flush=True)


def _rng(ctx: DemoContext, *salt: int) -> torch.Generator:
    """A generator every rank seeds alike, so ranks agree on 'random' sizes without talking."""
    g = torch.Generator()
    g.manual_seed(hash((ctx.seed, *salt)) & 0x7FFFFFFF)
    return g


def _flush_trace() -> None:
    """Let the recorder write what happened so far (before a deliberate crash)."""
    try:
        from commscope.record.recorder import active

        rec = active()
        if rec is not None:
            rec.flush(timeout=1.0)
    except Exception:
        pass


# ---------------------------------------------------------------------- 1 healthy-training
def healthy_training(rank: int, ws: int, ctx: DemoContext) -> dict:
    """DDP on a small MLP; scatter_v of the dataset, async metric all_reduce, all_gather_v eval."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from commscope import varlen

    dev = ctx.device(rank)
    steps = ctx.n(300)
    eval_every = max(1, min(100, steps // 3))
    features, classes = 16, 4

    # The dataset lives on rank 0 and is split unevenly (rank r gets a share ~ r + 2).
    if rank == 0:
        g = _rng(ctx, 1)
        n = 200 * ws
        x = torch.randn(n, features, generator=g)
        w = torch.randn(features, classes, generator=g)
        y = (x @ w).argmax(dim=1).float()
        data = torch.cat([x, y[:, None]], dim=1).to(dev)
        weights = [r + 2 for r in range(ws)]
        sizes = [n * wt // sum(weights) for wt in weights]
        sizes[-1] += n - sum(sizes)
        shard = varlen.scatter_v(data, src=0, split_sizes=sizes)
    else:
        shard = varlen.scatter_v(None, src=0)
    x_local, y_local = shard[:, :features], shard[:, features].long()
    _log(rank, f"got {len(shard)} samples from scatter_v")

    torch.manual_seed(ctx.seed)
    model = torch.nn.Sequential(torch.nn.Linear(features, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, classes)).to(dev)
    ddp = DDP(model, device_ids=[rank] if dev.type == "cuda" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    loss_fn = torch.nn.CrossEntropyLoss()
    gen = torch.Generator(device="cpu")
    gen.manual_seed(ctx.seed + rank)

    pending = None  # async all_reduce of the running loss, overlapped with the next step
    stats = torch.zeros(2, device=dev)
    acc = float("nan")
    for step in range(1, steps + 1):
        idx = torch.randint(len(x_local), (32,), generator=gen).to(dev)
        loss = loss_fn(ddp(x_local[idx]), y_local[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()  # DDP's C++ reducer all-reduces the gradients (seen via Flight Recorder)
        opt.step()
        if pending is not None:
            pending.wait()  # the previous step's metric, reduced while this step computed
        stats = torch.stack([loss.detach(), torch.ones((), device=dev)])
        pending = dist.all_reduce(stats, async_op=True)
        ctx.pause(0.03)
        if step % eval_every == 0 or step == steps:
            pending.wait()
            pending = None
            acc = _evaluate(rank, model, x_local, y_local, dev)
            if rank == 0:
                _log(rank, f"step {step}: mean loss {float(stats[0] / stats[1]):.3f}, eval accuracy {acc:.3f}")
    if pending is not None:
        pending.wait()
    return {"steps": steps, "accuracy": acc}


def _evaluate(rank: int, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, dev: torch.device) -> float:
    """Each rank predicts on its own (different-size) shard; all_gather_v collects them all."""
    from commscope import varlen

    with torch.no_grad():
        pred = model(x).argmax(dim=1)
    # One row per sample: (prediction, label).  Lengths differ per rank: exact sizes, no pad.
    rows = torch.stack([pred, y], dim=1)
    every = varlen.all_gather_v(rows, cat=True)
    return float((every[:, 0] == every[:, 1]).float().mean())


# ---------------------------------------------------------------------- 2 varlen-tour
def varlen_tour(rank: int, ws: int, ctx: DemoContext) -> int:
    """Every commscope.varlen function in turn, random sizes including empty ranks; checked."""
    from commscope import varlen

    dev = ctx.device(rank)
    rounds = ctx.n(4)
    nxt, prv = (rank + 1) % ws, (rank - 1) % ws
    checked = 0
    for rnd in range(rounds):
        g = _rng(ctx, 2, rnd)
        # lengths every rank knows; one rank (changing per round) is empty
        lens = torch.randint(1, 9, (ws,), generator=g).tolist()
        lens[rnd % ws] = 0
        mine = torch.full((lens[rank], 3), float(rank), device=dev)

        parts = varlen.all_gather_v(mine)
        assert [len(p) for p in parts] == lens and all(bool((p == r).all()) for r, p in enumerate(parts))
        ctx.pause(0.25)

        root = rnd % ws
        got = varlen.gather_v(mine, dst=root)
        assert (got is not None) == (rank == root)
        ctx.pause(0.25)

        chunks = [torch.full((n, 2), float(r), device=dev) for r, n in enumerate(lens)] if rank == root else None
        piece = varlen.scatter_v(chunks, src=root)
        assert piece.shape == (lens[rank], 2) and bool((piece == rank).all())
        ctx.pause(0.25)

        pair = torch.randint(0, 5, (ws, ws), generator=g)  # pair[i, j]: rows i sends to j
        sends = [torch.full((int(pair[rank, j]), 4), float(rank), device=dev) for j in range(ws)]
        recvd = varlen.all_to_all_v(sends)
        assert [len(t) for t in recvd] == [int(pair[i, rank]) for i in range(ws)]
        ctx.pause(0.25)

        splits = torch.randint(0, 6, (ws,), generator=g).tolist()
        full = torch.ones(sum(splits), 2, device=dev)
        red = varlen.reduce_scatter_v(full, splits)
        assert red.shape == (splits[rank], 2) and bool((red == ws).all())
        ctx.pause(0.25)

        shape = tuple(torch.randint(1, 5, (1 + rnd % 3,), generator=g).tolist())
        b = varlen.broadcast_v(torch.arange(torch.Size(shape).numel(), device=dev).reshape(shape)
                               if rank == root else None, src=root)
        assert tuple(b.shape) == shape
        ctx.pause(0.25)

        # send_tensors/recv_tensors around the ring (even ranks send first), a mixed bag
        bag = [torch.full((lens[rank],), rank, dtype=torch.int64, device=dev),
               torch.randn(2, 3, device=dev), torch.empty(0, device=dev)]
        if rank % 2 == 0:
            varlen.send_tensors(bag, dst=nxt)
            back = varlen.recv_tensors(src=prv)
        else:
            back = varlen.recv_tensors(src=prv)
            varlen.send_tensors(bag, dst=nxt)
        assert len(back) == 3 and back[0].shape == (lens[prv],)
        ctx.pause(0.25)

        # the async versions, both directions posted before either is waited
        sw = varlen.isend_tensors([torch.full((rnd + 1,), float(rank), device=dev)], dst=nxt)
        rw = varlen.irecv_tensors(src=prv)
        (t,) = rw.wait()
        sw.wait()
        assert t.shape == (rnd + 1,) and bool((t == prv).all())
        checked += 1
        ctx.pause(0.4)
    return checked


# ---------------------------------------------------------------------- 3 pipeline
def pipeline(rank: int, ws: int, ctx: DemoContext) -> int:
    """Pipeline stages around the ring: activations forward with send_tensors/recv_tensors
    (each micro-batch has its own sequence length, the receiver needs no shapes), losses back
    to stage 0, gradients along the ring with batch_isend_irecv."""
    from commscope import varlen

    dev = ctx.device(rank)
    torch.manual_seed(ctx.seed + rank)
    layer = torch.nn.Linear(8, 8).to(dev)
    micro = 6
    iters = ctx.n(8)
    first, last = 0, ws - 1
    g = _rng(ctx, 3)
    done = 0
    for it in range(iters):
        # forward: fill the pipeline one micro-batch after another
        losses = []
        for _ in range(micro):
            seq = int(torch.randint(2, 17, (1,), generator=g))
            if rank == first:
                x = torch.randn(seq, 8, device=dev)
                ids = torch.arange(seq, device=dev)
            else:
                x, ids = varlen.recv_tensors(src=rank - 1)
            with torch.no_grad():
                y = torch.tanh(layer(x))
            if rank == last:
                losses.append(varlen.isend_tensors([y.pow(2).mean().reshape(1), ids[-1:]], dst=first))
            else:
                varlen.send_tensors([y, ids], dst=rank + 1)
            ctx.pause(0.08)
        if rank == first:  # stage 0 collects the losses that came round the ring
            total = sum(float(varlen.recv_tensors(src=last)[0]) for _ in range(micro))
            if it == iters - 1:
                _log(rank, f"iteration {it}: loss {total / micro:.4f}")
        for w in losses:
            w.wait()
        # backward: every stage passes a gradient to the previous one and receives the next's
        for _ in range(micro):
            grad = torch.randn(4, 8, device=dev)
            buf = torch.empty(4, 8, device=dev)
            ops = [dist.P2POp(dist.isend, grad, (rank - 1) % ws), dist.P2POp(dist.irecv, buf, (rank + 1) % ws)]
            for w in dist.batch_isend_irecv(ops):
                w.wait()
            ctx.pause(0.04)
        dist.all_reduce(layer.weight.data)  # keep the replicas' 'weights' in step (one collective)
        done += 1
    return done


# ---------------------------------------------------------------------- 4 straggler
def straggler(rank: int, ws: int, ctx: DemoContext) -> int:
    """Every rank computes then all-reduces; the last rank also 'loads data' slowly first."""
    dev = ctx.device(rank)
    slow = ws - 1
    grads = torch.ones(1024, device=dev)
    steps = ctx.n(40, least=10)
    for _ in range(steps):
        ctx.pause(0.05)  # compute
        if rank == slow:
            # a slow data loader on one rank: the same delay at every step, by a wide margin
            time.sleep(max(0.05, 0.15 * ctx.pace))
        dist.all_reduce(grads)
        grads.fill_(1.0)
    return steps


# ---------------------------------------------------------------------- 5 missing-rank
def missing_rank(rank: int, ws: int, ctx: DemoContext) -> None:
    """One rank skips one all_reduce; the others wait for it at their last one, forever."""
    dev = ctx.device(rank)
    culprit = ws - 1
    steps = ctx.n(12, least=4)
    skip = steps // 2
    t = torch.ones(256, device=dev)
    for step in range(steps):
        ctx.pause(0.15)
        if rank == culprit and step == skip:
            _log(rank, f"step {step}: my batch is empty, skipping the gradient sync (the bug)")
            continue
        dist.all_reduce(t)
        t.fill_(1.0)
    if rank == culprit:
        _log(rank, "done; saving a checkpoint and idling")
    ctx.hold()


# ---------------------------------------------------------------------- 6 collective-mismatch
def collective_mismatch(rank: int, ws: int, ctx: DemoContext) -> None:
    """Rank 1 takes a different branch: broadcast where the others all_reduce (that op hangs);
    then, on a second group, it passes a tensor of another shape (same number of elements,
    so Gloo/NCCL cannot notice and the result is silently wrong)."""
    dev = ctx.device(rank)
    culprit = 1
    other = dist.new_group(list(range(ws)))
    t = torch.ones(8, device=dev)
    for _ in range(ctx.n(6, least=2)):
        dist.all_reduce(t)
        dist.all_reduce(torch.ones(4, 4, device=dev), group=other)
        t.fill_(1.0)
        ctx.pause(0.2)
    # bug 1: a rank-dependent branch issues a different collective (async: the step overlaps)
    if rank == culprit:
        work = dist.broadcast(t, src=0, async_op=True)
    else:
        work = dist.all_reduce(t, async_op=True)
    ctx.pause(0.2)
    # bug 2: same 16 elements, but (16,) on rank 1 where the others pass (4, 4)
    x = torch.ones(16, device=dev) if rank == culprit else torch.ones(4, 4, device=dev)
    dist.all_reduce(x, group=other)
    _log(rank, "waiting for the step's all_reduce")
    try:
        work.wait()  # never completes: the ranks do not agree on what this collective is
    except Exception as exc:
        _log(rank, f"the collective failed: {exc}")
    ctx.hold()


# ---------------------------------------------------------------------- 7 p2p-deadlock
def p2p_deadlock(rank: int, ws: int, ctx: DemoContext) -> None:
    """A few healthy ring exchanges, then a refactor that makes every rank receive first."""
    dev = ctx.device(rank)
    nxt, prv = (rank + 1) % ws, (rank - 1) % ws
    buf = torch.zeros(64, device=dev)
    for _ in range(ctx.n(4, least=1)):
        if rank % 2 == 0:  # correct: even ranks send first, odd ranks receive first
            dist.send(buf, nxt)
            dist.recv(buf, prv)
        else:
            dist.recv(buf, prv)
            dist.send(buf, nxt)
        dist.all_reduce(buf)
        ctx.pause(0.3)
    _log(rank, "exchanging halos: receive first, then send (the bug)")
    try:
        dist.recv(buf, prv)  # every rank waits for its left neighbour, who waits too
        dist.send(buf, nxt)
    except Exception as exc:
        _log(rank, f"p2p failed: {exc}")
    ctx.hold()


# ---------------------------------------------------------------------- 8 dead-rank
def dead_rank(rank: int, ws: int, ctx: DemoContext) -> None:
    """Rank 1 dies abruptly mid-run (os._exit: no exception, no clean exit).  The others'
    next all_reduce can never complete; they notice, keep their heartbeat for a while (so
    the console shows the dead rank next to live ones) and exit."""
    dev = ctx.device(rank)
    victim = 1
    steps = ctx.n(10, least=3)
    die_at = steps // 2
    t = torch.ones(256, device=dev)
    for step in range(steps):
        ctx.pause(0.2)
        if rank == victim and step == die_at:
            _log(rank, f"step {step}: crashing (os._exit)")
            _flush_trace()
            sys.stdout.flush()
            os._exit(3)
        try:
            dist.all_reduce(t)
        except Exception as exc:
            _log(rank, f"step {step}: all_reduce failed ({str(exc).splitlines()[0][:120]}); shutting down")
            # Tear the process group down, as an elastic agent would: that closes this
            # rank's connections, so ranks still blocked on it fail too instead of hanging.
            dist.destroy_process_group()
            break
        t.fill_(1.0)
    # Survivors linger so the console sees heartbeats from them but not from rank 1.
    linger = max(4.0, ctx.hang_after + 3.0)
    end = time.time() + linger
    while time.time() < end and (not ctx.deadline or time.time() < ctx.deadline):
        time.sleep(0.2)


# ---------------------------------------------------------------------- 9 async-leak
def async_leak(rank: int, ws: int, ctx: DemoContext) -> int:
    """Training steps with properly waited async all_reduces; the last rank also sends its
    metrics to rank 0 with isend and never waits on the returned work."""
    dev = ctx.device(rank)
    leaker = ws - 1
    steps = ctx.n(30, least=3)
    leaked = []
    for step in range(steps):
        grads = torch.ones(512, device=dev)
        work = dist.all_reduce(grads, async_op=True)
        ctx.pause(0.15)  # compute overlapped with the all_reduce
        work.wait()
        if step % 3 == 2:  # log metrics to rank 0
            if rank == leaker:
                metrics = torch.tensor([float(step), 0.5], device=dev)
                leaked.append((dist.isend(metrics, dst=0), metrics))  # the bug: never waited
            elif rank == 0:
                box = torch.empty(2, device=dev)
                dist.irecv(box, src=leaker).wait()
    dist.barrier()
    return len(leaked)
