"""The recorder sees each varlen op as one logical op, its inner collectives marked nested."""

from __future__ import annotations

import torch
import torch.distributed as dist
from trace_helpers import ops, read_events

import commscope
from commscope.analysis import TraceModel, diagnose
from commscope.launch import run_ranks


def varlen_work(rank: int, ws: int, store: str) -> list:
    commscope.instrument(store, sample_interval=0.2)
    from commscope import varlen

    x = torch.arange(float(3 + rank))
    got = varlen.all_gather_v(x, cat=True)
    dist.all_reduce(torch.ones(1))  # a plain collective after varlen ones: seq stays aligned
    chunks = [torch.full((r + 1,), float(r)) for r in range(ws)] if rank == 0 else None
    mine = varlen.scatter_v(chunks, src=0)
    if rank == 0:
        varlen.send_tensors([torch.ones(2, 3), torch.arange(5)], 1)
        h = varlen.isend_tensors([torch.zeros(4)], 1)
        h.wait()
    elif rank == 1:
        a, b = varlen.recv_tensors(0)
        (c,) = varlen.irecv_tensors(0).wait()
        assert a.shape == (2, 3) and b.tolist() == [0, 1, 2, 3, 4] and c.tolist() == [0.0] * 4
    return [got.tolist(), mine.tolist()]


def test_varlen_ops_are_recorded_as_one_logical_op_each(tmp_path):
    store = tmp_path / "trace"
    results = run_ranks(varlen_work, 3, args=(str(store),))
    assert results[2].value[1] == [2.0, 2.0, 2.0]
    events = read_events(store)
    seqs = {}
    for rank in range(3):
        all_ops = ops(events, rank)
        top = [o for o in all_ops if not o.get("nested") and o.get("src") != "fr"]
        names = [o["op"] for o in top]
        assert names[:3] == ["all_gather_v", "all_reduce", "scatter_v"], names
        seqs[rank] = [o["seq"] for o in top[:3]]
        assert seqs[rank] == [1, 2, 3]
        for outer in top[:3:2]:
            inner = [o for o in all_ops if o.get("parent") == outer["id"]]
            assert inner and all(o.get("nested") and "seq" not in o for o in inner), outer["op"]
            assert all(o["phases"]["end"]["ts"] <= outer["phases"]["end"]["ts"] for o in inner)
        if rank in (0, 1):
            p2p = [o for o in top if o["op"].endswith("_tensors")]
            direction = "send" if rank == 0 else "recv"
            assert [o["op"] for o in p2p] == [f"{direction}_tensors", f"i{direction}_tensors"]
            assert all(o["peer"] == 1 - rank and o["dir"] == direction for o in p2p)
            assert [o["seq"] for o in p2p] == [1, 2]
            assert {"wait_begin", "wait_end"} <= set(p2p[1]["phases"])  # the handle's wait()
    model = TraceModel.from_events(events)
    assert diagnose(model) == []


def placeholder_work(rank: int, ws: int, store: str) -> list:
    commscope.instrument(store, sample_interval=0.2)
    from commscope import varlen

    t = varlen.broadcast_v(torch.arange(4.0) if rank == 0 else "placeholder", src=0)  # (ignored: the docs say so)
    c = varlen.scatter_v([torch.ones(r + 1) for r in range(ws)] if rank == 0 else {"unused": 1}, src=0)
    dist.all_reduce(torch.ones(1))
    return [t.tolist(), c.tolist()]


def test_a_receiver_s_placeholder_is_recorded_as_its_varlen_op(tmp_path):
    """Receivers of broadcast_v and scatter_v may pass anything (it is ignored): the native
    recorder described it as tensors, failed, and ran the op unrecorded, its inner broadcast
    counted as the rank's collective, so check said collective_mismatch (broadcast_v against
    broadcast) over a job that ran well, exit 1 (helper-178)."""
    store = tmp_path / "trace"
    results = run_ranks(placeholder_work, 2, args=(str(store),))
    assert [r.value for r in results] == [[[0.0, 1.0, 2.0, 3.0], [1.0]], [[0.0, 1.0, 2.0, 3.0], [1.0, 1.0]]]
    events = read_events(store)
    for rank in range(2):
        top = [o for o in ops(events, rank) if not o.get("nested") and o.get("src") != "fr"]
        assert [(o["op"], o["seq"]) for o in top] == [("broadcast_v", 1), ("scatter_v", 2), ("all_reduce", 3)], top
    assert diagnose(TraceModel.from_events(events)) == []
