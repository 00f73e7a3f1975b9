"""TraceModel: columns, incremental ingest, cross-rank indexes and the queries the TUI uses."""

from __future__ import annotations

import numpy as np
import pytest

from commscope.analysis import TraceModel, rankstate
from commscope.analysis import model as model_mod
from commscope.analysis.bandwidth import busbw, busbw_factor, instances, op_busbw, size_bytes
from commscope.analysis.synth import S, TraceBuilder, healthy_trace, liveness_trace

MS = 1_000_000


def _snapshot(m: TraceModel) -> dict:
    out = {}
    for r, rt in m.ranks.items():
        n = rt.n
        sigs = [m.sigs[c] for c in rt.sig[:n].tolist()]
        out[r] = (rt.begin[:n].tolist(), rt.comp[:n].tolist(), rt.seq[:n].tolist(), rt.peer[:n].tolist(),
                  [(s.op, s.group, s.site, s.in_shapes) for s in sigs], sorted(rt.open))
    coll = {k: {seq: gi.at(seq) for seq in range(1, 50)} for k, gi in m.coll.items()}
    return {"ranks": out, "coll": coll, "p2p": sorted(m.p2p)}


@pytest.mark.parametrize("batch", [1, 17, 333])
def test_incremental_equals_bulk(batch):
    ev = healthy_trace(4, 300)
    bulk = TraceModel.from_events(ev)
    inc = TraceModel()
    v0 = inc.version
    for k in range(0, len(ev), batch):
        changed = inc.ingest(ev[k:k + batch])
        assert changed == {e["rank"] for e in ev[k:k + batch]}
    assert inc.version > v0
    assert _snapshot(inc) == _snapshot(bulk)
    assert inc.bounds() == bulk.bounds()



@pytest.mark.parametrize("chunk", [1, 5, 64])
def test_chunked_and_interleaved_ingest_equals_bulk(monkeypatch, chunk):
    ev = healthy_trace(4, 300)
    bulk = TraceModel.from_events(ev)
    per_rank: dict[int, list] = {}
    for e in ev:
        per_rank.setdefault(e["rank"], []).append(e)
    # round robin over ranks, each rank's own order kept: many rank runs per chunk
    interleaved = [e for k in range(max(map(len, per_rank.values()))) for v in per_rank.values() if k < len(v)
                   for e in v[k:k + 1]]
    assert len(interleaved) == len(ev)
    assert len({e["rank"] for e in interleaved[:50]}) > 1
    monkeypatch.setattr(model_mod, "INGEST_CHUNK", chunk)
    for events in (ev, interleaved):
        m = TraceModel.from_events(events)
        assert _snapshot(m) == _snapshot(bulk)
        assert m.bounds() == bulk.bounds() and m.events == bulk.events


def test_split_by_rank_keeps_batch_order_for_any_rank_numbers():
    ranks = np.array([70000, 3, 70000, 3, 5, 3], np.int64)
    parts = {r: pos.tolist() for r, pos in model_mod._split_by_rank(ranks)}
    assert parts == {3: [1, 3, 5], 5: [4], 70000: [0, 2]}
    (r, pos), = model_mod._split_by_rank(np.array([7, 7, 7], np.int64))
    assert r == 7 and pos is None

def test_op_detail_matching_and_labels():
    b = TraceBuilder(3)
    t = b.t0 + S
    b.collective(t, "all_reduce", site="a.py:1 in f")
    i = b.sync(0, t + 10 * MS, t + 11 * MS, "send", peer=2, dir="send", shape=(8,))
    j = b.sync(2, t + 10 * MS, t + 11 * MS, "recv", peer=0, dir="recv", shape=(8,))
    m = TraceModel.from_events(b.sorted_events())
    d = m.op(1, 0)
    assert d["op"] == "all_reduce" and d["seq"] == 1 and d["site"] == "a.py:1 in f" and d["in_shapes"] == [[1024]]
    assert d["complete_ns"] - d["begin_ns"] == 100_000 and not d["in_flight"]
    assert m.matching(1, 0) == {0: 0, 2: 0}
    si, ri = m.op_index(0, i), m.op_index(2, j)
    assert m.matching(0, si) == {2: ri} and m.matching(2, ri) == {0: si}
    assert m.label(0, si) == "send #1 to 2 (group 0)"
    assert m.collective("0", 1) == {0: 0, 1: 0, 2: 0}
    assert m.p2p_pair("0", 0, 2, 1) == (si, ri)


def test_window_queries_handle_long_and_inflight_ops():
    b = TraceBuilder(1)
    t = b.t0 + S
    long_op = b.sync(0, t, t + 100 * MS, "all_reduce")  # spans the whole window
    for k in range(10):
        b.sync(0, t + (200 + 10 * k) * MS, t + (201 + 10 * k) * MS, "broadcast", root=0)
    stuck = b.sync(0, t + 400 * MS, None, "all_reduce")
    m = TraceModel.from_events(b.sorted_events())
    rt = m.ranks[0]
    w = m.ops_in_window(0, t + 50 * MS, t + 60 * MS)
    assert w.tolist() == [m.op_index(0, long_op)]
    w = m.ops_in_window(0, t + 205 * MS, t + 231 * MS)
    assert [int(rt.begin[i]) for i in w] == [t + 210 * MS, t + 220 * MS, t + 230 * MS]
    w = m.ops_in_window(0, t + 10 * S, t + 11 * S)
    assert w.tolist() == [m.op_index(0, stuck)]
    assert m.inflight(0) == [m.op_index(0, stuck)]
    assert rankstate.current_op(m, 0) == m.op_index(0, stuck)


def test_out_of_order_flight_recorder_ops_are_sorted_for_queries():
    b = TraceBuilder(1)
    t = b.t0 + S
    for k in range(5):
        b.sync(0, t + k * 10 * MS, t + k * 10 * MS + MS, "all_reduce")
    b.sync(0, t + 5 * MS, t + 5 * MS, "all_reduce", seq=1, src="fr")  # merged late, earlier ts
    m = TraceModel.from_events(b.sorted_events())
    w = m.ops_in_window(0, t, t + S)
    begins = m.ranks[0].begin[w]
    assert (np.diff(begins) >= 0).all() and len(w) == 6


def test_states_samples_and_liveness():
    b, t, a = liveness_trace()
    m = TraceModel.from_events(b.sorted_events())
    now = t + 10 * S
    assert rankstate.rank_state(m, 0, now).text == "in all_reduce #2 (group 0) for 9.0 s"
    assert rankstate.rank_state(m, 1, now).text.startswith("waiting on all_reduce #2 (group 0) for 8.0 s")
    assert rankstate.rank_state(m, 2, now).kind == "exited"
    assert rankstate.rank_state(m, 3, now).kind == "dead"
    assert rankstate.rank_state(m, 3, t + 3 * S).kind == "idle"
    s = m.samples(0)
    assert s["ts"].shape[0] == 51 and np.isnan(s["gpu_util"]).all() and (s["cpu"] == 50.0).all()
    assert m.latest_sample(0)["ts"] == now
    assert a and m.sample_interval(0) == 0.2 and m.hang_after() == 2.0


def test_nested_ops_are_not_indexed_and_close_with_parent():
    b = TraceBuilder(2)
    t = b.t0 + S
    for r in range(2):
        o = b.begin(r, t, "all_gather_v", shape=(3 + r,))
        n = b.begin(r, t + 10, "all_gather", shape=(1,), nested=True, parent=o, **{"async": True})
        b.end(r, n, t + 20)  # never waited: ends with its parent
        b.end(r, o, t + MS)
    m = TraceModel.from_events(b.sorted_events())
    assert m.collective("0", 1) == {0: 0, 1: 0}
    assert len(m.coll) == 1 and m.inflight(0) == [] and m.op(0, 1)["inferred_end"]


def test_compact_storage():
    m = TraceModel.from_events(healthy_trace(8, 2000))
    rt = m.ranks[0]
    per_op = sum(getattr(rt, c).nbytes for c in ("begin", "end", "wb", "we", "done", "gpu", "comp", "id", "seq",
                                                  "peer", "parent", "sig", "flags")) / rt.begin.shape[0]
    assert per_op <= 100
    assert len(m.sigs) < 50  # repeated calls share one interned signature


def test_bandwidth_definitions():
    assert busbw_factor("all_reduce", 4) == 1.5
    assert busbw_factor("all_gather", 4) == 0.75 and busbw_factor("reduce_scatter", 8) == 0.875
    assert busbw_factor("all_to_all", 2) == 0.5
    for op in ("broadcast", "reduce", "send", "recv"):
        assert busbw_factor(op, 8) == 1.0
    assert size_bytes("all_gather", 100, 400) == 400 and size_bytes("reduce_scatter", 400, 100) == 400
    assert size_bytes("barrier", 0, 0) == 0
    assert busbw("all_reduce", 1e9, 1.0, 4) == 1.5e9
    b = TraceBuilder(4)
    b.group("pair", [0, 1])
    t = b.t0 + S
    t = b.collective(t, "all_reduce", skew={1: 3 * MS}, latency=2 * MS, shape=(250_000,))  # 1 MB
    b.collective(t, "all_reduce", group="pair", latency=MS, shape=(250_000,))
    m = TraceModel.from_events(b.sorted_events())
    inst = instances(m, m.group_index("0"))
    assert inst.latency.tolist() == [2 * MS] and inst.skew.tolist() == [3 * MS]
    assert inst.waits[0].tolist() == [3 * MS, 0, 3 * MS, 3 * MS]
    bw = op_busbw(m, 0, 0)
    assert bw["algbw"] == pytest.approx(1e6 / 2e-3) and bw["busbw"] == pytest.approx(1e6 / 2e-3 * 1.5)
    bw = op_busbw(m, 0, 1)  # group of 2: factor 2(n-1)/n = 1, not the world's 1.5
    assert bw["group_size"] == 2 and bw["busbw"] == pytest.approx(1e6 / 1e-3)


def test_tolerates_odd_values_and_huge_ids():
    b = TraceBuilder(2)
    t = b.t0 + S
    b.collective(t, "all_reduce")
    b.add(0, t + MS, "op", phase="begin", id=1 << 40, op="all_reduce", group="0", seq=None, peer="x")
    b.add(0, t + 2 * MS, "op", phase="end", id=1 << 40)
    b.add(1, t + MS, "op", phase="end", id=999)  # end of an op never seen
    m = TraceModel.from_events(b.sorted_events())
    i = m.op_index(0, 1 << 40)
    assert i == 1 and m.op(0, i)["complete_ns"] == t + 2 * MS and "seq" not in m.op(0, i)
    assert m.collective("0", 1) == {0: 0, 1: 0}
