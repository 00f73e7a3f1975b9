"""commscope.varlen on NCCL with CUDA tensors (skipped without CUDA).

World size 1 runs on any CUDA box: every function, every strategy forced one by one, several
process groups, CPU tensors staged through an NCCL group, a mixed cpu:gloo,cuda:nccl group.
With two or more GPUs, a multi-rank job also covers the uneven paths (NCCL's grouped
broadcasts, batch_isend_irecv, the p2p header protocol) and send/recv.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import commscope.varlen as V
from commscope.launch import run_ranks
from commscope.varlen import _meta
from commscope.varlen._plan import SUPPORTED

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

TIMEOUT = 180
DTYPES = [torch.float32, torch.bfloat16, torch.bool, torch.complex64, torch.int64, torch.float8_e4m3fn,
          torch.float16, torch.uint8]


def rand(shape, dtype, seed, device):
    gen = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        t = torch.randint(0, 2, shape, generator=gen).bool()
    elif dtype.is_complex:
        t = torch.randn(shape, dtype=dtype, generator=gen)
    elif dtype.is_floating_point:
        t = torch.randn(shape, generator=gen).to(dtype)
    else:
        t = torch.randint(0, 100, shape, generator=gen).to(dtype)
    return t.to(device)


def same(a, b) -> bool:
    return (isinstance(a, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and a.device == b.device
            and torch.equal(_meta.raw(a.contiguous()).cpu(), _meta.raw(b.contiguous()).cpu()))


def _single_rank_checks(fails: list[str], group, tag: str) -> None:
    dev = torch.device("cuda", torch.cuda.current_device())
    for i, dtype in enumerate(DTYPES):
        x = rand((5, 3), dtype, i, dev)
        nc = rand((3, 10), dtype, 100 + i, dev)[:, ::2]  # non-contiguous, varying along dim 1
        for s in (None, *SUPPORTED["all_gather_v"]):
            got = V.all_gather_v(x, group=group, strategy=s)
            if not (len(got) == 1 and same(got[0], x)):
                fails.append(f"{tag} all_gather_v {dtype} {s}")
            got = V.all_gather_v(nc, dim=1, cat=True, group=group, strategy=s)
            if not same(got, nc.contiguous()):
                fails.append(f"{tag} all_gather_v dim=1 cat {dtype} {s}")
            if not same(V.all_gather_v(x, sizes=[5], cat=True, group=group, strategy=s), x):
                fails.append(f"{tag} all_gather_v sizes= {dtype} {s}")
        handle = V.all_gather_v(x, group=group, async_op=True)
        if not same(handle.wait()[0], x):
            fails.append(f"{tag} async all_gather_v {dtype}")
        for s in (None, *SUPPORTED["gather_v"]):
            got = V.gather_v(x, dst=0, group=group, strategy=s)
            if not (len(got) == 1 and same(got[0], x)):
                fails.append(f"{tag} gather_v {dtype} {s}")
            if not same(V.scatter_v([x], src=0, group=group, strategy=s), x):
                fails.append(f"{tag} scatter_v list {dtype} {s}")
            if not same(V.scatter_v(nc, src=0, split_sizes=[5], dim=1, group=group, strategy=s), nc.contiguous()):
                fails.append(f"{tag} scatter_v split {dtype} {s}")
        got = V.all_to_all_v([nc], dim=1, group=group)
        if not (len(got) == 1 and same(got[0], nc.contiguous())):
            fails.append(f"{tag} all_to_all_v {dtype}")
        if not same(V.broadcast_v(x, src=0, group=group), x):
            fails.append(f"{tag} broadcast_v {dtype}")
    for dtype, op in ((torch.float32, dist.ReduceOp.SUM), (torch.bfloat16, dist.ReduceOp.AVG),
                      (torch.int64, dist.ReduceOp.MAX), (torch.complex64, dist.ReduceOp.SUM)):
        x = rand((7, 4), dtype, 7, dev)
        for s in (None, *SUPPORTED["reduce_scatter_v"]):
            got = V.reduce_scatter_v(x, [7], op, group=group, strategy=s)
            if not (got.shape == x.shape and got.device == x.device and torch.allclose(got.float() if not
                    dtype.is_complex else got, x.float() if not dtype.is_complex else x)):
                fails.append(f"{tag} reduce_scatter_v {dtype} {op} {s}")
    zero_d_error = None
    try:
        V.all_gather_v(torch.tensor(1.0, device=dev), group=group)
    except ValueError as exc:
        zero_d_error = str(exc)
    if not zero_d_error or "0-d" not in zero_d_error:
        fails.append(f"{tag} 0-d did not raise a ValueError: {zero_d_error}")


def _w_single(rank, ws):
    torch.cuda.set_device(0)
    fails: list[str] = []
    _single_rank_checks(fails, None, "world")
    for i in range(2):  # several process groups, each with its own communicator
        _single_rank_checks(fails, dist.new_group([0]), f"new_group#{i}")
    # CPU tensors on an NCCL-only group travel through the GPU and come back on the CPU
    x = rand((4, 2), torch.float32, 1, "cpu")
    got = V.all_gather_v(x, cat=True)
    if not same(got, x):
        fails.append("cpu tensor staged through nccl")
    return fails


def _w_mixed(rank, ws):
    torch.cuda.set_device(0)
    fails: list[str] = []
    for device in ("cpu", "cuda"):
        x = rand((3, 2), torch.float32, 3, device)
        if not same(V.all_gather_v(x, cat=True, strategy="padded"), x):
            fails.append(f"mixed group {device}")
        if not same(V.broadcast_v(x, src=0), x):
            fails.append(f"mixed group broadcast_v {device}")
    return fails


def test_nccl_single_rank_every_function_and_strategy():
    fails = run_ranks(_w_single, 1, backend="nccl", timeout=TIMEOUT)[0].value
    assert not fails, "\n".join(fails[:30])


def test_mixed_backend_group():
    fails = run_ranks(_w_mixed, 1, backend="cpu:gloo,cuda:nccl", timeout=TIMEOUT)[0].value
    assert not fails, "\n".join(fails)


# --------------------------------------------------------------------------- 2+ GPUs
def _w_multi(rank, ws):
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    fails: list[str] = []
    sizes = [7] + [3 * r for r in range(1, ws)]  # uneven ...
    sizes[-1] = 0                                # ... with a zero-length rank
    inputs = [rand((sizes[r], 5), torch.bfloat16, r, dev) for r in range(ws)]
    mine = inputs[rank]
    for s in (None, *SUPPORTED["all_gather_v"]):
        if s == "native":
            continue
        got = V.all_gather_v(mine, strategy=s)
        if not all(same(g, w) for g, w in zip(got, inputs, strict=True)):
            fails.append(f"rank {rank} all_gather_v {s}")
    for s in (None, "padded", "p2p", "a2a"):
        got = V.gather_v(mine, dst=1, cat=True, strategy=s)
        if (rank == 1) != (got is not None) or (got is not None and not same(got, torch.cat(inputs))):
            fails.append(f"rank {rank} gather_v {s}")
        whole = rand((sum(sizes), 5), torch.bfloat16, 99, dev)
        got = V.scatter_v(whole if rank == 0 else None, src=0, split_sizes=sizes, strategy=s)
        if not same(got, whole.split(sizes)[rank]):
            fails.append(f"rank {rank} scatter_v {s}")
    full = rand((sum(sizes), 3), torch.float32, 5, dev) + rank
    want = sum(rand((sum(sizes), 3), torch.float32, 5, dev) + r for r in range(ws)).split(sizes)[rank]
    for s in (None, "padded", "list", "allreduce"):
        got = V.reduce_scatter_v(full, sizes, strategy=s)
        if not torch.allclose(got, want, rtol=1e-5, atol=1e-5):
            fails.append(f"rank {rank} reduce_scatter_v {s}")
    chunks = [rand((r + rank, 2), torch.int64, 10 * rank + r, dev) for r in range(ws)]
    got = V.all_to_all_v(chunks)
    want = [rand((rank + s, 2), torch.int64, 10 * s + rank, dev) for s in range(ws)]
    if not all(same(g, w) for g, w in zip(got, want, strict=True)):
        fails.append(f"rank {rank} all_to_all_v")
    # p2p around a ring (even world size), a long header (second header message) and a packed
    # payload.  NCCL runs a pair's p2p on one stream in posting order, so the two directions
    # go in separate phases: even ranks send first, then odd ones.
    payload = [rand((i % 4, 3), DTYPES[i % len(DTYPES)], 1000 * rank + i, dev) for i in range(40)]
    nxt, prv = (rank + 1) % ws, (rank - 1) % ws
    for phase in (0, 1):
        if rank % 2 == phase:
            V.isend_tensors(payload, nxt).wait()
            continue
        recv = V.irecv_tensors(prv)
        while not recv.is_completed():  # NCCL works report completion: polling drives the receive
            pass
        got = recv.wait()
        want = [rand((i % 4, 3), DTYPES[i % len(DTYPES)], 1000 * prv + i, dev) for i in range(40)]
        if not all(same(g, w) for g, w in zip(got, want, strict=True)):
            fails.append(f"rank {rank} isend_tensors/irecv_tensors")
    if rank < 2:  # blocking pair, ordered so it can't deadlock
        big = [rand((1 << 20,), torch.float32, rank, dev), rand((3,), torch.bool, rank, dev)]
        if rank == 0:
            V.send_tensors(big, 1)
        else:
            got = V.recv_tensors(0)
            want = [rand((1 << 20,), torch.float32, 0, dev), rand((3,), torch.bool, 0, dev)]
            if not all(same(g, w) for g, w in zip(got, want, strict=True)):
                fails.append("send_tensors/recv_tensors")
    try:
        V.all_gather_v(torch.zeros(2, 3 + (rank == 1), device=dev))
        fails.append(f"rank {rank} mismatch did not raise")
    except ValueError as exc:
        if "offending ranks" not in str(exc):
            fails.append(f"rank {rank} mismatch message: {exc}")
    return fails


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_nccl_multi_rank():
    ws = 4 if torch.cuda.device_count() >= 4 else 2
    fails = [f for r in run_ranks(_w_multi, ws, backend="nccl", timeout=TIMEOUT) for f in r.value]
    assert not fails, "\n".join(fails[:30])
