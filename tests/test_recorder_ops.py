"""Every wrapped torch.distributed function, on real Gloo ranks: same results as raw, recorded right."""

from __future__ import annotations

import os
import signal
import sys
import warnings

import pytest
import torch
import torch.distributed as dist
from trace_helpers import by_rank, of_type, ops, read_events

import commscope
from commscope.launch import run_ranks
from commscope.record.ops import TORCH_OPS


def _summary(ret, *tensors):
    """What a call returned and what it left in its tensors, comparable across runs."""
    kind = type(ret).__name__
    if isinstance(ret, list):
        kind = f"list[{','.join(type(x).__name__ for x in ret)}]"
    elif isinstance(ret, int):
        kind = f"int={ret}"
    return kind, [t.tolist() for t in tensors]


def exercise(rank: int, ws: int, store: str | None) -> dict:
    """Call every wrapped op once (twice for the async variants) and summarize the results."""
    warnings.simplefilter("ignore")
    if store:
        commscope.instrument(store, sample_interval=0.2, hang_after=60)
    res: dict = {}
    peer = 1 - rank

    def t(n=4):
        return torch.arange(float(n)) + 10 * rank

    x = t()
    res["all_reduce"] = _summary(dist.all_reduce(x), x)
    x = t()
    w = dist.all_reduce(x, op=dist.ReduceOp.MAX, async_op=True)
    res["all_reduce_async_type"] = type(w) is dist.Work
    res["all_reduce_async"] = _summary(w.wait(), x)
    xs = [t(), t(2)]
    res["all_reduce_coalesced"] = _summary(dist.all_reduce_coalesced(xs), *xs)
    x = t()
    res["reduce"] = _summary(dist.reduce(x, dst=1), x)
    x = t()
    res["broadcast"] = _summary(dist.broadcast(x, src=1), x)
    outs = [torch.zeros(4) for _ in range(ws)]
    res["all_gather"] = _summary(dist.all_gather(outs, t()), *outs)
    out = torch.zeros(4 * ws)
    res["all_gather_into_tensor"] = _summary(dist.all_gather_into_tensor(out, t()), out)
    out = torch.zeros(4 * ws)
    res["all_gather_single"] = _summary(dist.all_gather_single(out, t()), out)
    x = torch.zeros(4)
    res["reduce_scatter_single"] = _summary(dist.reduce_scatter_single(x, torch.arange(4.0 * ws) + rank), x)
    outl = [[torch.zeros(4)] for _ in range(ws)]
    res["all_gather_coalesced"] = _summary(dist.all_gather_coalesced(outl, [t()]), *[o[0] for o in outl])
    gl = [torch.zeros(4) for _ in range(ws)] if rank == 0 else None
    res["gather"] = _summary(dist.gather(t(), gl, dst=0), *(gl or []))
    x = torch.zeros(4)
    res["scatter"] = _summary(dist.scatter(x, [t() + i for i in range(ws)] if rank == 0 else None, src=0), x)
    x = torch.zeros(4)
    res["reduce_scatter"] = _summary(dist.reduce_scatter(x, [t() + i for i in range(ws)]), x)
    x = torch.zeros(4)
    res["reduce_scatter_tensor"] = _summary(dist.reduce_scatter_tensor(x, torch.arange(4.0 * ws) + rank), x)
    outs = [torch.zeros(4) for _ in range(ws)]
    res["all_to_all"] = _summary(dist.all_to_all(outs, [t() + i for i in range(ws)]), *outs)
    out = torch.zeros(4 * ws)
    res["all_to_all_single"] = _summary(dist.all_to_all_single(out, torch.arange(4.0 * ws) + rank), out)
    res["barrier"] = _summary(dist.barrier())
    res["monitored_barrier"] = _summary(dist.monitored_barrier())
    x = t()
    if rank == 0:
        res["send"] = _summary(dist.send(x, dst=peer))
        y = torch.zeros(4)
        res["recv"] = _summary(dist.recv(y, src=peer), y)
    else:
        y = torch.zeros(4)
        res["recv"] = _summary(dist.recv(y, src=peer), y)
        res["send"] = _summary(dist.send(x, dst=peer))
    y = torch.zeros(4)
    sw = dist.isend(t(), dst=peer)
    rw = dist.irecv(y, src=peer)
    res["isend"] = (type(sw) is dist.Work, sw.wait())
    res["irecv"] = (type(rw) is dist.Work, rw.wait(), y.tolist())
    y = torch.zeros(4)
    ops_ = [dist.P2POp(dist.isend, t(), peer), dist.P2POp(dist.irecv, y, peer)]
    works = dist.batch_isend_irecv(ops_)
    res["batch_isend_irecv"] = (len(works), [w.wait() for w in works], y.tolist())
    objs = [None] * ws
    res["all_gather_object"] = (dist.all_gather_object(objs, {"r": rank}), objs)
    gobjs = [None] * ws if rank == 0 else None
    res["gather_object"] = (dist.gather_object(("g", rank), gobjs, dst=0), gobjs)
    lst = [rank, "x"] if rank == 1 else [None, None]
    res["broadcast_object_list"] = (dist.broadcast_object_list(lst, src=1), lst)
    outo = [None]
    res["scatter_object_list"] = (dist.scatter_object_list(outo, [f"s{i}" for i in range(ws)], src=0), outo)
    if rank == 0:
        res["send_object_list"] = dist.send_object_list([{"a": 1}, 2], dst=1)
    else:
        got = [None, None]
        res["recv_object_list"] = (dist.recv_object_list(got, src=0), got)
    return res


def test_every_op_returns_exactly_what_raw_returns_and_is_recorded(tmp_path):
    raw = [r.value for r in run_ranks(exercise, 2, args=(None,))]
    store = tmp_path / "trace"
    inst = [r.value for r in run_ranks(exercise, 2, args=(str(store),))]
    assert raw == inst
    assert inst[0]["all_reduce_async_type"] is True

    events = read_events(store)
    ranks = by_rank(events)
    assert set(ranks) == {0, 1}
    for rank in (0, 1):
        meta = of_type(events, "meta", rank)
        assert len(meta) == 1 and meta[0]["world_size"] == 2 and meta[0]["backend"] == "gloo"
        # object ops are one logical op each: their inner all_gather/broadcast are nested traffic
        wrapped = [o for o in ops(events, rank) if o.get("src") != "fr" and not o.get("nested")]
        names = [o["op"] for o in wrapped]
        expected = set(TORCH_OPS) - ({"send_object_list"} if rank else {"recv_object_list"})
        assert expected <= set(names), expected - set(names)
        assert names.count("all_gather") == 1 and names.count("broadcast") == 1
        # every op ended; collectives of group "0" are numbered 1..n in call order
        assert all("end" in o["phases"] for o in wrapped)
        colls = [o for o in wrapped if "dir" not in o and o["op"] != "batch_isend_irecv"]
        assert [o["seq"] for o in colls] == list(range(1, len(colls) + 1))
        assert all(o["group"] == "0" for o in wrapped)
        by_name: dict = {}
        for o in wrapped:
            by_name.setdefault(o["op"], o)  # the first call of each name
        ar = by_name["all_reduce"]
        assert ar["in_shapes"] == [[4]] and ar["in_dtypes"] == ["float32"] and ar["in_bytes"] == 16
        assert ar["redop"] == "sum" and ar["site"].endswith("in exercise")
        assert "test_recorder_ops.py" in ar["site"]
        line = int(ar["site"].split(":")[-1].split()[0])
        with open(__file__) as f:
            assert "dist.all_reduce(x)" in f.read().splitlines()[line - 1]
        assert [o for o in wrapped if o["op"] == "all_reduce" and o.get("async")][0]["redop"] == "max"
        assert by_name["reduce"]["root"] == 1 and by_name["broadcast"]["root"] == 1
        assert by_name["scatter"]["root"] == 0 and by_name["gather"]["root"] == 0
        assert by_name["all_gather"]["out_shapes"] == [[4], [4]]
        assert by_name["all_to_all_single"]["out_bytes"] == 32
        # p2p: peer, direction and a per-(peer, direction) counter
        for name, direction in (("send", "send"), ("recv", "recv"), ("isend", "send"), ("irecv", "recv")):
            o = by_name[name]
            assert o["peer"] == 1 - rank and o["dir"] == direction, o
        p2p = [o for o in wrapped if o.get("dir") == "send"]
        assert [o["seq"] for o in p2p] == list(range(1, len(p2p) + 1))
        # async work: issue (begin/end) then wait
        for name in ("isend", "irecv"):
            phases = by_name[name]["phases"]
            assert {"begin", "end", "wait_begin", "wait_end"} <= set(phases)
            assert phases["end"]["ts"] <= phases["wait_begin"]["ts"] <= phases["wait_end"]["ts"]
        exits = of_type(events, "exit", rank)
        assert len(exits) == 1 and exits[0]["reason"] in ("destroy_process_group", "atexit")
        assert "unwaited" not in exits[0]


def test_batch_isend_irecv_records_children_as_p2p(tmp_path):
    store = tmp_path / "trace"
    run_ranks(exercise, 2, args=(str(store),))
    events = read_events(store)
    for rank in (0, 1):
        all_ops = ops(events, rank)
        batch = [o for o in all_ops if o["op"] == "batch_isend_irecv"]
        assert len(batch) == 1 and "seq" not in batch[0]
        children = [o for o in all_ops if o.get("parent") == batch[0]["id"]]
        assert sorted(o["op"] for o in children) == ["irecv", "isend"]
        for child in children:
            assert not child.get("nested") and child["peer"] == 1 - rank and child["async"]
            assert "wait_end" in child["phases"]
        # the batch's isend is this rank's 3rd message to its peer (after send and isend)
        assert [o["seq"] for o in children if o["op"] == "isend"] == [3]


def subgroup_work(rank: int, ws: int, store: str) -> list:
    commscope.instrument(store, sample_interval=0.2)
    g = dist.new_group([2, 0])  # group ranks follow global order: 0 -> 0, 2 -> 1
    got = []
    if rank in (0, 2):
        x = torch.ones(3) * rank
        dist.all_reduce(x, group=g)
        got.append(x.tolist())
        y = torch.zeros(3)
        if rank == 0:
            dist.send(x, group=g, group_dst=1)
        else:
            dist.recv(y, group=g, group_src=0)
        dist.broadcast(x, group=g, group_src=1)
    dist.all_reduce(torch.ones(1))
    return got


def test_subgroups_record_group_names_ranks_and_global_peers(tmp_path):
    store = tmp_path / "trace"
    results = run_ranks(subgroup_work, 3, args=(str(store),))
    assert results[0].value == [[2.0, 2.0, 2.0]] and results[1].value == []
    events = read_events(store)
    groups = {(e["rank"], e["group"]): e["granks"] for e in of_type(events, "group")}
    assert groups[(0, "1")] == [0, 2] and groups[(2, "1")] == [0, 2]
    assert (1, "1") not in groups
    r0 = {o["op"]: o for o in ops(events, 0) if o["group"] == "1"}
    r2 = {o["op"]: o for o in ops(events, 2) if o["group"] == "1"}
    assert r0["all_reduce"]["seq"] == r2["all_reduce"]["seq"] == 1
    assert r0["send"]["peer"] == 2 and r2["recv"]["peer"] == 0  # global ranks, not group ranks
    assert r0["broadcast"]["root"] == 2 and r0["broadcast"]["seq"] == 2
    world = [o for o in ops(events, 1) if o["group"] == "0"]
    assert [o["seq"] for o in world] == [1]


def raising(rank: int, ws: int, store: str | None) -> list:
    """Calls that raise; returns (type, message) of each exception."""
    if store:
        commscope.instrument(store, sample_interval=0.2)
    out = []
    calls = [
        lambda: dist.all_gather([torch.zeros(3 + r) for r in range(ws)], torch.zeros(3 + rank)),
        lambda: dist.send(torch.ones(2), dst=rank),  # to itself (dst=99 segfaults torch 2.13)
        lambda: dist.broadcast(torch.ones(2), src=0, group=42),
        lambda: dist.all_reduce([1, 2]),
        # (a Gloo all_to_all_single size error is left out: it can break the next barrier)
    ]
    for call in calls:
        try:
            call()
            out.append(None)
        except Exception as exc:
            out.append((type(exc).__name__, str(exc).split("\n")[0]))
        dist.barrier()
    return out


def test_exceptions_propagate_unchanged_and_are_recorded(tmp_path):
    raw = [r.value for r in run_ranks(raising, 2, args=(None,))]
    store = tmp_path / "trace"
    inst = [r.value for r in run_ranks(raising, 2, args=(str(store),))]
    assert raw == inst
    assert all(x is not None for x in raw[0]), raw[0]
    ag = [o for o in ops(read_events(store), 0) if o["op"] == "all_gather"]
    assert len(ag) == 1 and ag[0]["phases"]["end"]["exc"].startswith("RuntimeError:")


def ddp_work(rank: int, ws: int, store: str) -> int:
    commscope.instrument(store, sample_interval=0.2)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
    dist.all_reduce(torch.ones(2))
    # a group used only from C++: its members still reach the trace
    sub = dist.new_group([0, 1])
    other = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2), process_group=sub)
    other(torch.randn(3, 2)).sum().backward()
    return 0


def test_ddp_all_reduces_are_recorded_with_real_timings(tmp_path):
    """DDP's reducer issues its all-reduces from C++: the native recorder sees them at the
    dispatcher, with a real completion time, in the group's own sequence."""
    store = tmp_path / "trace"
    run_ranks(ddp_work, 2, args=(str(store),))
    events = read_events(store)
    for rank in (0, 1):
        all_ops = [o for o in ops(events, rank) if not o.get("nested")]
        cpp = [o for o in all_ops if o.get("src") == "c10d"]
        grads = [o for o in cpp if o["op"] == "all_reduce" and o["group"] == "0"]
        assert len(grads) == 3, [o["op"] for o in cpp]  # one gradient bucket per step
        assert all(o["in_bytes"] == (8 * 4 + 4) * 4 for o in grads)
        for o in grads:  # completed, with a duration the backend really took
            assert o["phases"]["end"]["ts"] > o["ts"] and "approx" not in o["phases"]["end"]
        assert [o["op"] for o in cpp if o["group"] == "1"][-1] == "all_reduce"
        assert [e["granks"] for e in of_type(events, "group", rank) if e["group"] == "1"] == [[0, 1]]
        # one sequence per group for everything, whoever issued it
        seqs = [o["seq"] for o in all_ops if o["group"] == "0" and "seq" in o]
        assert seqs == list(range(1, len(seqs) + 1))
        wrapped = [o for o in all_ops if o.get("src") is None]
        assert [o["op"] for o in wrapped] == ["all_reduce"]  # the user's own, once
    key = [(o["op"], o.get("seq")) for o in ops(events, 0)]
    assert key == [(o["op"], o.get("seq")) for o in ops(events, 1)]


def test_ddp_all_reduces_arrive_through_flight_recorder_merge_in_python(tmp_path):
    """Without the native recorder, DDP's C++ all-reduces come from Flight Recorder."""
    store = tmp_path / "trace"
    run_ranks(ddp_work, 2, args=(str(store),), env={"COMMSCOPE_SOURCE": "python", "TORCH_FR_BUFFER_SIZE": "2000"})
    events = read_events(store)
    for rank in (0, 1):
        all_ops = ops(events, rank)
        fr = [o for o in all_ops if o.get("src") == "fr"]
        grads = [o for o in fr if o["op"] == "all_reduce" and o["group"] == "0"]
        assert len(grads) == 3, [o["op"] for o in fr]  # one gradient bucket per step
        assert [o["op"] for o in fr if o["group"] == "1"][-1] == "all_reduce"
        assert [e["granks"] for e in of_type(events, "group", rank) if e["group"] == "1"] == [[0, 1]]
        assert all(o["in_bytes"] == (8 * 4 + 4) * 4 for o in grads)
        seqs = [o["seq"] for o in fr if o["group"] == "0"]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
        # the wrapper's own all_reduce is not duplicated by the merge
        wrapped = [o for o in all_ops if o.get("src") != "fr"]
        assert [o["op"] for o in wrapped] == ["all_reduce"]
    assert [o["seq"] for o in ops(events, 0) if o.get("src") == "fr"] == \
        [o["seq"] for o in ops(events, 1) if o.get("src") == "fr"]


def test_uninstrument_restores_every_original_object(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCH_FR_BUFFER_SIZE", raising=False)
    import commscope.varlen as varlen_mod

    names = [n for n in list(TORCH_OPS) + ["batch_isend_irecv", "destroy_process_group", "init_process_group"] if hasattr(dist, n)]
    before = {n: getattr(dist, n) for n in names}
    varlen_before = {n: getattr(varlen_mod, n) for n in dir(varlen_mod) if not n.startswith("_")}
    work_wait = vars(dist.Work)["wait"]
    p2p_new, p2p_init = vars(dist.P2POp)["__new__"], vars(dist.P2POp)["__init__"]
    exits = (sys.exit, os._exit, signal.signal)  # (noted by the recorder while instrumented)
    rec = commscope.instrument(tmp_path / "t", flight_recorder=False)
    assert commscope.instrument() is rec  # idempotent
    assert all(getattr(dist, n) is not before[n] for n in names)
    assert vars(dist.Work)["wait"] is not work_wait
    assert all(now is not then for now, then in zip((sys.exit, os._exit, signal.signal), exits, strict=True))
    commscope.uninstrument()
    assert (sys.exit, os._exit, signal.signal) == exits
    assert all(getattr(dist, n) is before[n] for n in names)
    assert {n: getattr(varlen_mod, n) for n in varlen_before} == varlen_before
    assert vars(dist.Work)["wait"] is work_wait
    assert vars(dist.P2POp)["__new__"] is p2p_new and vars(dist.P2POp)["__init__"] is p2p_init
    commscope.uninstrument()  # a second call is harmless
    with commscope.instrumented(tmp_path / "u", flight_recorder=False):
        assert dist.all_reduce is not before["all_reduce"]
    assert dist.all_reduce is before["all_reduce"]


@pytest.mark.parametrize("ws", [2])
def test_unwaited_async_work_is_listed_at_exit(tmp_path, ws):
    store = tmp_path / "trace"
    run_ranks(leaky, ws, args=(str(store),))
    events = read_events(store)
    for rank in range(ws):
        exit_ = of_type(events, "exit", rank)[0]
        leaked = [o for o in ops(events, rank) if o["id"] in exit_.get("unwaited", [])]
        assert [o["op"] for o in leaked] == ["all_reduce"] and leaked[0]["seq"] == 2


def leaky(rank: int, ws: int, store: str) -> None:
    commscope.instrument(store, sample_interval=0.2)
    dist.all_reduce(torch.ones(2), async_op=True).wait()
    keep = dist.all_reduce(torch.ones(2), async_op=True)  # never waited
    dist.barrier()
    del keep


class _Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("cannot print me")


def unprintable(rank: int, ws: int, store: str) -> bool:
    from commscope.record import ops as O
    from commscope.record import pyhot

    commscope.instrument(store, flight_recorder=False)
    err = _Unprintable()

    def stand_in(*args, **kwargs):
        raise err

    wrapped = pyhot.make_wrapper("all_reduce", stand_in, O.all_reduce)
    try:
        wrapped(torch.ones(1))
    except _Unprintable as exc:
        return exc is err
    return False


def test_even_an_unprintable_exception_propagates_as_itself(tmp_path):
    assert run_ranks(unprintable, 1, args=(str(tmp_path),))[0].value is True


def test_instrument_with_another_store_warns_and_keeps_the_running_one(tmp_path):
    rec = commscope.instrument(tmp_path / "a", flight_recorder=False)
    try:
        with pytest.warns(RuntimeWarning, match=r"already recording to .*[/\\]a; instrument\(.*[/\\]b\)"):
            again = commscope.instrument(tmp_path / "b")
        assert again is rec and rec.store == str(tmp_path / "a")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert commscope.instrument() is rec  # no store named: nothing to warn about
    finally:
        commscope.uninstrument()


def detail_work(rank: int, ws: int, store: str) -> float:
    commscope.instrument(store, sample_interval=0.2)
    x = torch.ones(4) * (rank + 1)
    for _ in range(3):
        dist.all_reduce(x)
    dist.broadcast(x, src=0)
    dist.barrier()
    return float(x[0])


def test_debug_detail_helper_groups_are_not_user_ops(tmp_path):
    """TORCH_DISTRIBUTED_DEBUG=DETAIL checks every collective with extra collectives on hidden
    helper groups; those are the backend's own traffic, not ops of the job."""
    store = tmp_path / "trace"
    results = run_ranks(detail_work, 2, args=(str(store),), env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
    assert [r.value for r in results] == [12.0, 12.0]  # (1 + 2), then doubled twice
    events = read_events(store)
    for rank in (0, 1):
        top = [o for o in ops(events, rank) if not o.get("nested")]
        assert [(o["op"], o["group"], o["seq"]) for o in top] == [
            ("all_reduce", "0", 1), ("all_reduce", "0", 2), ("all_reduce", "0", 3), ("broadcast", "0", 4),
            ("barrier", "0", 5)]
        assert {e["group"] for e in of_type(events, "group", rank)} == {"0"}
