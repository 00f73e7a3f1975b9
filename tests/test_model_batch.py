"""Ranks new to the model are ingested together (``TraceModel._fresh_begins``); the rank by
rank path must leave exactly the same model, whatever the records hold and however a
reader batches them.

Generated op records (collectives, p2p with any-source receives, async ops and their
waits, device ops and their ``done``, nested ops with parents, exceptions, approximate
ends, out-of-order begins) are ingested in random batches, some ranks whole in one batch,
some split over two, with heartbeats, samples, groups, exits, stacks and JSON op phases
beside them, once with ``batch_ranks`` and once without; every column, index, open set,
failure list and version must match, and so must what diagnose() finds.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from model_compare import differences, model_state

from commscope.analysis import runmax
from commscope.analysis.diagnose import diagnose
from commscope.analysis.model import CONTAINER, NESTED, TraceModel
from commscope.analysis.rankstate import blocked, blocked_mask
from commscope.bench.synthstore import JobShape, write_store
from commscope.oprecords import (
    F_APPROX,
    F_GPU,
    F_SOURCE,
    PH_BEGIN,
    PH_DONE,
    PH_END,
    PH_WAIT_BEGIN,
    PH_WAIT_END,
    OpRecords,
    Static,
    concat,
)
from commscope.schema import SCHEMA_VERSION

T = 1_700_000_000_000_000_000
S = 1_000_000_000
SETTINGS = settings(derandomize=True, deadline=None, database=None, max_examples=60, print_blob=False,
                    suppress_health_check=list(HealthCheck))


def _static(op: str, group: str = "0", *, is_async: bool = False, nested: bool = False, direction: str | None = None,
            device: int | None = None, peer: int = -1, any_source: bool = False, shape: int = 4) -> Static:
    fields = {"type": "op", "phase": "begin", "op": op, "group": group, "in_shapes": [[shape]],
              "in_dtypes": ["float32"], "in_bytes": 4 * shape, "site": f"train.py:{len(op) + shape} in step"}
    if is_async:
        fields["async"] = True
    if nested:
        fields["nested"] = True
    if direction:
        fields["dir"] = direction
    if device is not None:
        fields["device"] = device
    if peer >= 0:
        fields["peer"] = peer
    return Static(fields, hash((op, group, is_async, nested, direction, device, peer, shape)) & 0xFFFFFFFF, peer,
                  0 if any_source else None)


def _pool(world: int, rank: int) -> list[Static]:
    nxt, prev = (rank + 1) % world, (rank - 1) % world
    return [
        _static("all_reduce"),
        _static("all_reduce", shape=8),  # a mismatch when ranks differ here
        _static("all_reduce", is_async=True),
        _static("broadcast", "1"),
        _static("all_gather", device=0),
        _static("isend", direction="send", peer=nxt),
        _static("irecv", direction="recv", peer=prev, is_async=True),
        _static("recv", direction="recv", peer=-1, any_source=True),
        _static("all_reduce", nested=True),
        _static("batch_isend_irecv"),
    ]


@st.composite
def records(draw, rank: int, world: int) -> OpRecords:
    statics = _pool(world, rank)
    n = draw(st.integers(0, 40))
    rows: list[tuple] = []  # phase, ts, id, static, seq, parent, tid, peer, gpu, flags
    exc: dict[int, str] = {}
    seqs: dict[str, int] = {}
    ts = T + rank * 7
    damaged = draw(st.integers(0, 5)) == 0  # (its ids now and then ones used before: ``opids``)
    for op_id in range(1, n + 1):
        oid = op_id
        if damaged and op_id > 1 and draw(st.integers(0, 7)) == 0:
            oid = draw(st.integers(1, op_id - 1))
        k = draw(st.integers(0, len(statics) - 1))
        s = statics[k]
        ts += draw(st.integers(-3, 1000))  # now and then earlier than the op before
        group = s.fields["group"]
        seqs[group] = seqs.get(group, 0) + 1
        seq = -1 if s.fields.get("nested") or draw(st.integers(0, 9)) == 0 else seqs[group]
        parent = draw(st.integers(1, op_id - 1)) if s.fields.get("nested") and op_id > 1 else -1  # (chains too)
        rows.append((PH_BEGIN, ts, oid, k, seq, parent, 11 + 1000 * rank, s.peer, 0, 0))  # a thread per process
        fate = draw(st.integers(0, 5))
        if fate == 0:
            continue  # still in flight
        t = ts + draw(st.integers(1, 500))
        flags = F_APPROX if fate == 1 else 0
        if s.any_source_gid is not None and fate > 1:
            flags |= F_SOURCE
        row = len(rows)
        rows.append((PH_END, t, oid, -1, draw(st.integers(1, 5)) if flags & F_SOURCE else -1, -1, 0,
                     (rank + 2) % world if flags & F_SOURCE else -1, 0, flags))
        if fate == 2:
            exc[row] = "RuntimeError: Connection closed by peer"
        if s.fields.get("async") and fate > 2:
            rows.append((PH_WAIT_BEGIN, t + 1, oid, -1, -1, -1, 0, -1, 0, 0))
            rows.append((PH_WAIT_END, t + 2, oid, -1, -1, -1, 0, -1, 0, 0))
        if "device" in s.fields and fate > 3:
            rows.append((PH_DONE, t + 3, oid, -1, -1, -1, 0, -1, 50 + oid, F_GPU))
    if draw(st.booleans()) and rows:  # a phase of an op this stream never began
        rows.append((PH_END, ts + 5, n + 40, -1, -1, -1, 0, -1, 0, 0))
    cols = list(zip(*rows, strict=True)) if rows else [()] * 10
    dt = (np.int8, np.int64, np.int64, np.int32, np.int64, np.int64, np.uint64, np.int32, np.int64, np.uint8)
    arrays = [np.array(c, d) for c, d in zip(cols, dt, strict=True)]
    return OpRecords(rank, *arrays, exc=exc, statics=statics)


def _incarnation(recs: OpRecords) -> OpRecords:
    """The same records as the rank's next incarnation writes them: its op ids from 1 << 40."""
    out = recs.take(np.arange(len(recs)))
    out.id += 1 << 40
    out.parent[out.parent >= 0] += 1 << 40
    return out


def _split(recs: OpRecords, at: int) -> tuple[OpRecords, OpRecords]:
    rows = np.arange(len(recs))
    return recs.take(rows[:at]), recs.take(rows[at:])


def _misc(rank: int, k: int) -> list[dict]:
    """What a reader hands beside the records: liveness, samples and the rare rest."""
    base = {"v": SCHEMA_VERSION, "rank": rank}
    out = [dict(base, type="heartbeat", ts=T + 100 * k + rank, inflight=k % 3),
           dict(base, type="sample", ts=T + 100 * k + 1, cpu=50.0 + k, rss=1 << 30, gpu_util=None)]
    if k == 0:
        out.append(dict(base, type="meta", ts=T, world_size=4, recorder="native"))
        out.append(dict(base, type="group", ts=T, group="1", granks=[0, 1, 2, 3], backend="gloo"))
    if k == 2:
        out.append(dict(base, type="stack", ts=T + 900, id=1, reason="hang", frames=[]))
        out.append(dict(base, type="op", ts=T + 901, phase="done", id=1, gpu_ns=7))
    if k == 3 and rank == 3:
        out.append(dict(base, type="exit", ts=T + 1_000_000, reason="exception", exc="ValueError: boom"))
    return out


@st.composite
def batches(draw) -> list[tuple[list[dict], list[OpRecords]]]:
    world = 4
    recs = [draw(records(r, world)) for r in range(world)]
    parts: list[list[OpRecords]] = [[], [], []]
    for r in recs:
        how = draw(st.integers(0, 3))
        if how == 3 and len(r) > 1:  # split over two batches: the second finds the rank begun
            a, b = _split(r, draw(st.integers(1, len(r) - 1)))
            parts[0].append(a)
            parts[draw(st.integers(1, 2))].append(b)
        else:
            parts[min(how, 2)].append(r)
    out = []
    for k, p in enumerate(parts):
        events = [e for r in range(world) for e in _misc(r, k) if draw(st.integers(0, 3)) > 0]
        out.append((events, p))
    return out


@st.composite
def polls(draw) -> list[tuple[list[dict], list[OpRecords]]]:
    """What a live console's polls hand over: every rank's records cut into pieces of a
    few rows, the ranks' next pieces together in each batch (one ``OpRecords`` per rank,
    ranks already begun: ``_live_begins``), now and then a rank twice or with more than
    LIVE_ROWS rows (together where plain, else rank by rank) or a rank new to the model
    beside them."""
    world = draw(st.integers(2, 5))
    recs = [draw(records(r, world)) for r in range(world)]
    pieces: list[list[OpRecords]] = []
    for r in recs:
        cuts, at = [], 0
        while at < len(r):
            at += draw(st.sampled_from([1, 2, 3, 5, 40]))
            cuts.append(min(at, len(r)))
        rows = np.arange(len(r))
        pieces.append([r.take(rows[a:b]) for a, b in zip([0, *cuts][:len(cuts)], cuts, strict=True)])
    out = []
    for k in range(max((len(p) for p in pieces), default=0)):
        ops = [p[k] for p in pieces if k < len(p)]
        if ops and draw(st.integers(0, 4)) == 0:
            ops.append(_incarnation(ops[0]))  # a rank twice in one batch (two streams of one rank)
        events = [e for r in range(world) for e in _misc(r, min(k, 3)) if draw(st.integers(0, 3)) == 0]
        out.append((events, ops))
    return out


def _build(plan, batched: bool) -> TraceModel:
    m = TraceModel()
    m.batch_ranks = batched
    for events, ops in plan:
        m.ingest(events, ops)
    return m


def _found(m: TraceModel) -> list[tuple]:
    return [(f.kind, tuple(f.culprits), tuple(sorted(f.victims))) for f in diagnose(m, now=T + 10**12)]


@SETTINGS
@given(batches())
def test_ranks_ingested_together_leave_the_model_rank_by_rank_ingest_leaves(plan):
    models = _same(plan)
    assert _found(models[True]) == _found(models[False])


@SETTINGS
@given(polls())
def test_ranks_already_begun_ingested_together_leave_what_rank_by_rank_leaves(plan):
    """A live console's batches: a few records of every rank, ranks already begun."""
    models = _same(plan)
    assert _found(models[True]) == _found(models[False])


def test_a_live_batch_takes_the_live_path(monkeypatch):
    """Two polls of four ranks, each its own thread id: the second goes through
    ``_together_begins`` (no Python step per rank) with its codes looked up at once, then a
    new signature sends them one record after another (``_live_begins``); the same model as
    rank by rank."""
    taken = []
    original, together = TraceModel._live_begins, TraceModel._together_begins

    def spy(self, recs_list, live, codes, known, changed):
        taken.append((list(live.pos), known is not None))
        return original(self, recs_list, live, codes, known, changed)

    def spy_together(self, regular, changed):
        taken.append((list(regular[0].pos), "together"))
        return together(self, regular, changed)

    monkeypatch.setattr(TraceModel, "_live_begins", spy)
    monkeypatch.setattr(TraceModel, "_together_begins", spy_together)
    statics = _pool(4, 0)

    def threaded(recs: OpRecords) -> OpRecords:  # a thread id per process, as real ranks have
        recs.tid[:] = 0x7F00_0000_0000 + 4096 * recs.rank
        return recs

    models = {}
    for batched in (True, False):
        m = models[batched] = TraceModel()
        m.batch_ranks = batched
        m.ingest([], [threaded(_begins(r, statics, [0])) for r in range(4)])
        m.ingest([], [threaded(_begins(r, statics, [0, 0], first_id=2)) for r in range(4)])
        m.ingest([], [threaded(_begins(r, statics, [3], first_id=4)) for r in range(4)])
    assert taken == [([0, 1, 2, 3], "together"), ([0, 1, 2, 3], False)]
    assert differences(model_state(models[True]), model_state(models[False])) == []
    m = models[True]
    assert m.ranks[2].n == 4 and m.collective("1", 1) == {r: 3 for r in range(4)} and sorted(m.inflight(2)) == [0, 1, 2, 3]


def test_a_long_live_record_goes_together_where_it_is_plain(monkeypatch):
    """A console behind a full-rate job reads ~50 records a rank a poll, more than
    ``LIVE_ROWS``: plain, they still go together (``_together_begins``: no step per rank or
    row); with a signature new to the model (the scalar way, a step a row), or a parent on a
    begin, rank by rank.  The same model as rank by rank each time."""
    from commscope.analysis import model as model_mod

    taken = []
    together, by_rank = TraceModel._together_begins, TraceModel._record_begins

    def spy_together(self, regular, changed):
        taken.append(("together", list(regular[0].pos)))
        return together(self, regular, changed)

    def spy_rank(self, recs, *a):
        taken.append(("rank", recs.rank))
        return by_rank(self, recs, *a)

    monkeypatch.setattr(TraceModel, "_together_begins", spy_together)
    monkeypatch.setattr(TraceModel, "_record_begins", spy_rank)
    statics = _pool(4, 0)
    long = model_mod.LIVE_ROWS + 8
    models, paths = {}, {}
    for batched in (True, False):
        taken.clear()
        m = models[batched] = TraceModel()
        m.batch_ranks = batched
        m.ingest([], [_begins(r, statics, [0]) for r in range(4)])
        m.ingest([], [_begins(r, statics, [0] * long, first_id=2) for r in range(4)])
        m.ingest([], [_begins(r, statics, [3] * long, first_id=2 + long) for r in range(4)])
        child = [_begins(r, statics, [0] * long, first_id=2 + 2 * long) for r in range(4)]
        child[1].parent[3] = 2 + long  # (a begin with a parent: not plain)
        m.ingest([], child)
        paths[batched] = list(taken)
    assert paths[True] == [("together", [0, 1, 2, 3]), *[("rank", r) for r in range(4)],  # (a new signature)
                           ("together", [0, 2, 3]), ("rank", 1)]
    assert paths[False] == [("rank", r) for r in range(4)] * 4
    assert differences(model_state(models[True]), model_state(models[False])) == []
    m = models[True]
    assert m.ranks[2].n == 1 + 3 * long and m.collective("1", long) == {r: 2 * long for r in range(4)}


def test_a_gpu_jobs_live_records_go_together(monkeypatch):
    """A GPU job's ops each come with a device time (a ``done`` with F_GPU), and an end may
    be approximate (F_APPROX): its live records still go together (``_together_phases``
    applies both, as ``_apply_extras`` does rank by rank), with the same model as rank by rank."""
    from commscope.analysis.vocab import APPROX

    taken = []
    together = TraceModel._together_phases

    def spy(self, lv, changed):
        taken.append(list(lv.pos))
        return together(self, lv, changed)

    monkeypatch.setattr(TraceModel, "_together_phases", spy)
    statics = _pool(4, 0)  # (4: an all_gather on a device)
    models, paths = {}, {}
    for batched in (True, False):
        taken.clear()
        m = models[batched] = TraceModel()
        m.batch_ranks = batched
        m.ingest([], [_rows(r, [(PH_BEGIN, T + r, 1, 4, 1, -1, 0)], statics) for r in range(4)])
        live = []
        for r in range(4):
            recs = _rows(r, [(PH_BEGIN, T + 100 + r, 2, 4, 2, -1, 0),
                             (PH_END, T + 200 + r, 1, -1, -1, -1, F_APPROX if r % 2 else 0),
                             (PH_DONE, T + 300 + r, 1, -1, -1, -1, F_GPU),
                             (PH_END, T + 400 + r, 2, -1, -1, -1, 0),
                             (PH_DONE, T + 500 + r, 2, -1, -1, -1, F_GPU)], statics)
            recs.gpu[2], recs.gpu[4] = 70 + r, 80 + r
            if r == 3:  # (an op's done twice: its last device time holds, as rank by rank)
                again = _rows(r, [(PH_DONE, T + 600 + r, 1, -1, -1, -1, F_GPU)], statics)
                again.gpu[0] = 99
                recs = concat([recs, again])
            live.append(recs)
        m.ingest([], live)
        paths[batched] = list(taken)
    assert paths == {True: [[0, 1, 2, 3]], False: []}
    assert differences(model_state(models[True]), model_state(models[False])) == []
    m = models[True]
    assert [m.ranks[r].gpu[:2].tolist() for r in range(4)] == [[70, 80], [71, 81], [72, 82], [99, 83]]
    assert [bool(m.ranks[r].flags[0] & APPROX) for r in range(4)] == [False, True, False, True]


def test_the_batched_path_is_taken_and_its_columns_are_views(monkeypatch):
    """Whole new ranks share one set of columns (no copy per rank); a rank that grows later
    gets its own, and the others are untouched."""
    world = 4
    taken = []
    original = TraceModel._fresh_begins

    def spy(self, *a, **k):
        out = original(self, *a, **k)
        taken.append(out)
        return out

    monkeypatch.setattr(TraceModel, "_fresh_begins", spy)
    statics = _pool(world, 0)
    begins = [OpRecords(r, np.array([PH_BEGIN, PH_END], np.int8), np.array([T + r, T + 10 + r]),
                        np.array([1, 1]), np.array([0, -1], np.int32), np.array([1, -1]), np.array([-1, -1]),
                        np.array([5, 0], np.uint64), np.array([-1, -1], np.int32), np.zeros(2, np.int64),
                        np.zeros(2, np.uint8), {}, statics) for r in range(world)]
    m = TraceModel()
    m.ingest([], begins)
    assert len(taken) == 1 and taken[0].ranks == list(range(world))
    shared = taken[0].cols["begin"]
    assert all(m.ranks[r].begin.base is shared for r in range(world))
    assert m.inflight(0) == [] and m.ranks[0].comp[0] == T + 10
    more = OpRecords(0, np.array([PH_BEGIN], np.int8), np.array([T + 50]), np.array([2]), np.array([0], np.int32),
                     np.array([2]), np.array([-1]), np.array([5], np.uint64), np.array([-1], np.int32),
                     np.zeros(1, np.int64), np.zeros(1, np.uint8), {}, statics)
    m.ingest([], [more])
    assert m.ranks[0].begin.base is not shared and m.ranks[0].n == 2 and m.inflight(0) == [1]
    assert m.ranks[1].begin.base is shared and m.ranks[1].begin.tolist() == [T + 1]


def _begins(rank: int, statics: list[Static], which: list[int], first_id: int = 1) -> OpRecords:
    """Begins of ops ``which`` (static indices), seq 1, 2 ... per static's group."""
    k = len(which)
    seq, per = [], {}
    for w in which:
        g = statics[w].fields["group"]
        per[g] = per.get(g, 0) + 1
        seq.append(per[g])
    return OpRecords(rank, np.full(k, PH_BEGIN, np.int8), T + np.arange(k) * 10 + rank,
                     np.arange(first_id, first_id + k), np.array(which, np.int32), np.array(seq),
                     np.full(k, -1), np.full(k, 5, np.uint64), np.full(k, -1, np.int32), np.zeros(k, np.int64),
                     np.zeros(k, np.uint8), {}, statics)


def test_indexes_are_made_in_the_order_rank_by_rank_makes_them():
    """A rank already begun (ingested rank by rank) that comes first in a batch and uses a
    group new to the model makes that group's index, and takes its first column, before
    the new ranks ingested together do: detectors iterate the indexes in that order."""
    statics = [_static("all_reduce", "0"), _static("all_reduce", "2"), _static("broadcast", "3")]
    first = [_begins(0, statics, [0]), _begins(5, statics, [0])]
    second = [_begins(0, statics, [1, 1], first_id=2), _begins(1, statics, [2, 1]), _begins(2, statics, [1])]
    models = {}
    for batched in (True, False):
        m = models[batched] = TraceModel()
        m.batch_ranks = batched
        m.ingest([], first)
        m.ingest([], second)
    assert differences(model_state(models[True]), model_state(models[False])) == []
    assert [k[1] for k in models[True].coll] == ["0", "2", "3"]
    assert models[True].coll[(0, "2")].ranks == [0, 1, 2]


def _rows(rank: int, rows: list[tuple], statics: list[Static]) -> OpRecords:
    """Records from (phase, ts, id, static, seq, parent, flags) rows."""
    ph, ts, ids, stc, seq, parent, flags = (list(c) for c in zip(*rows, strict=True))
    k = len(rows)
    return OpRecords(rank, np.array(ph, np.int8), np.array(ts), np.array(ids), np.array(stc, np.int32),
                     np.array(seq), np.array(parent), np.full(k, 5, np.uint64), np.full(k, -1, np.int32),
                     np.zeros(k, np.int64), np.array(flags, np.uint8), {}, statics)


def _blocked_one(m: TraceModel, rank: int) -> tuple[int, ...]:
    """What ``rankstate.blocked`` says of one rank, judged on its own (the definition the
    judgement of every rank at once, ``_all_blocked``, must give)."""
    rt, cand = m.ranks.get(rank), m.inflight(rank)
    if not rt or not cand:
        return ()
    i = np.array(cand, np.int64)
    f = m.sig_flags(rt.sig[i])
    ok = blocked_mask(f, rt.begin[i], rt.comp[i], rt.wb[i], rt.we[i]) & ((f & CONTAINER) == 0)
    parent = rt.parent[i]
    inner = ((f & NESTED) != 0) & (parent >= 0) & (rt.comp[np.maximum(parent, 0)] == 0)
    return tuple(i[ok & ~inner].tolist())


def _same(plan) -> dict[bool, TraceModel]:
    models = {batched: _build(plan, batched) for batched in (True, False)}
    assert differences(model_state(models[True]), model_state(models[False])) == []
    for m in models.values():
        assert {r: tuple(blocked(m, r)) for r in m.ranks} == {r: _blocked_one(m, r) for r in m.ranks}
    return models


def test_a_poll_handed_over_as_arrays_interns_its_new_signatures_as_rank_by_rank(monkeypatch):
    """A live poll handed over as one set of columns (``Spans``) whose ranks, each its own
    thread, begin ops of kinds new to them (in no order of their statics, several a record,
    one record with two threads): its new signatures are interned first, in the order the
    rank by rank way meets them (``TraceModel._intern_new``), and the poll goes together;
    the model is what rank by rank leaves, signature for signature."""
    from commscope.oprecords import Unpacked, packed

    statics = [_static("all_reduce"), _static("all_gather"), _static("broadcast"), _static("reduce_scatter"),
               _static("all_reduce", shape=8)]

    def recs(rank: int, rows: list[tuple[int, int, int]], t0: int) -> OpRecords:
        """Begins (static, id, thread), each ended 5 ns later."""
        cols = [(PH_BEGIN, t0 + 10 * j, i, st, i, -1, tid) for j, (st, i, tid) in enumerate(rows)]
        cols += [(PH_END, t0 + 10 * j + 5, i, -1, -1, -1, 0) for j, (st, i, tid) in enumerate(rows)]
        ph, ts, ids, stc, seq, parent, tids = (list(c) for c in zip(*cols, strict=True))
        k = len(cols)
        return OpRecords(rank, np.array(ph, np.int8), np.array(ts), np.array(ids), np.array(stc, np.int32),
                         np.array(seq), np.array(parent), np.array(tids, np.uint64), np.full(k, -1, np.int32),
                         np.zeros(k, np.int64), np.zeros(k, np.uint8), {}, statics)

    first = [recs(r, [(0, 1, 100 + r)], T) for r in range(6)]  # (every rank begun: the next poll is live)
    second = [recs(0, [(2, 2, 100), (1, 3, 100)], T + S), recs(1, [(1, 2, 101), (3, 3, 101)], T + S),
              recs(2, [(3, 2, 102)], T + S), recs(3, [(0, 2, 103), (2, 3, 103), (4, 4, 103)], T + S),
              recs(4, [(4, 2, 104), (1, 3, 999), (3, 4, 104)], T + S), recs(5, [(0, 2, 105)], T + S)]
    third = [recs(r, [(1 + r % 4, 5, 100 + r), (0, 6, 100 + r)], T + 2 * S) for r in range(6)]
    scalar = []  # (the models whose polls went the scalar way, a step a row)
    live_begins = TraceModel._live_begins
    monkeypatch.setattr(TraceModel, "_live_begins", lambda m, *a: scalar.append(m) or live_begins(m, *a))
    built = {}
    for how in ("arrays", "together", "rank by rank"):
        m = TraceModel()
        m.batch_ranks = how != "rank by rank"
        for poll in (first, second, third):
            sp = packed(poll) if how == "arrays" else None
            m.ingest([], Unpacked(sp) if sp is not None else poll, sp)
        built[how] = m
    assert built["arrays"] not in scalar and built["together"] in scalar
    want = built["rank by rank"]
    for how in ("arrays", "together"):
        assert differences(model_state(built[how]), model_state(want)) == [], how
        assert [(x.op, x.tid, x.in_shapes) for x in built[how].sigs] == [(x.op, x.tid, x.in_shapes) for x in want.sigs]
    assert len({x.tid for x in want.sigs}) == 7 and len(want.sigs) > 12  # (new ones in each poll)


def test_a_nested_op_inside_a_nested_op_closes_with_its_outer_op():
    """Found by review: closing nested ops walked the open set in hash order, which differs
    between a large set that shrank and a small new one ({7, 8} iterates 8 first)."""
    statics = [_static("all_reduce"), _static("all_reduce", nested=True)]
    rows = [(PH_BEGIN, T, 1, 0, 1, -1, 0)] + [(PH_BEGIN, T + j, 1 + j, 0, 1 + j, -1, 0) for j in range(1, 7)]
    rows += [(PH_BEGIN, T + 7, 8, 1, -1, 1, 0), (PH_BEGIN, T + 8, 9, 1, -1, 8, 0)]  # 9 inside 8 inside 1
    rows += [(PH_END, T + 20 + j, 1 + j, -1, -1, -1, 0) for j in range(7)]
    models = _same([([], [_rows(r, rows, statics) for r in (0, 1)])])
    for m in models.values():
        assert m.inflight(0) == [] and m.ranks[0].comp[7:9].tolist() == [T + 20, T + 20]


def test_an_inferred_completion_stays_when_the_ops_own_end_does_not_complete_it():
    """An async nested op closed at its parent's end (a JSON event here), then its own end
    arrives (an async op completes at its wait's end): it stays closed, both ways."""
    statics = [_static("all_reduce"), _static("all_reduce", is_async=True, nested=True)]
    rows = [(PH_BEGIN, T, 1, 0, 1, -1, 0), (PH_BEGIN, T + 1, 2, 1, -1, 1, 0), (PH_BEGIN, T + 2, 3, 0, 2, -1, 0),
            (PH_END, T + 5, 2, -1, -1, -1, 0), (PH_END, T + 6, 3, -1, -1, -1, 0)]
    ends = [{"type": "op", "phase": "end", "ts": T + 3, "id": 1, "rank": r, "v": SCHEMA_VERSION} for r in (0, 1)]
    models = _same([(ends, [_rows(r, rows, statics) for r in (0, 1)])])
    for m in models.values():
        assert m.inflight(0) == [] and int(m.ranks[0].comp[1]) == T + 3


def test_ids_past_the_dense_map_are_found_the_same_way():
    """Found by review: the batch path counted a rank's ops twice when choosing between a
    dense id map and a dict, so a negative id was found by one path and not the other."""
    from commscope.analysis.columns import BELOW_MAX, DENSE_ID_FACTOR, DENSE_ID_SLACK, ID_DICT_BYTES

    statics = [_static("all_reduce")]
    big = DENSE_ID_FACTOR * 2 + DENSE_ID_SLACK + 1
    rows = [(PH_BEGIN, T, -5, 0, 1, -1, 0), (PH_BEGIN, T + 1, big, 0, 2, -1, 0), (PH_END, T + 9, -5, -1, -1, -1, 0)]
    models = _same([([], [_rows(r, rows, statics) for r in (0, 1)])])
    # (the big id starts the dense map at it, ``id_base``: a negative id is in no dense map)
    assert {(m.ranks[0].index_of(-5), m.ranks[0].index_of(big)) for m in models.values()} == {(None, 1)}
    # ids spread past what a map a few times the ops holds: a dict, the negative id in it, both ways
    far = [(PH_BEGIN, T + 2 + j, big * (j + 2) * 8, 0, 3 + j, -1, 0) for j in range(BELOW_MAX + 2)]
    models = _same([([], [_rows(r, rows + far, statics) for r in (0, 1)])])
    assert {m.ranks[0].index_of(-5) for m in models.values()} == {0}
    assert all(m.ranks[0].id_dict is not None for m in models.values())
    # (and a dict's ids count in the model's bytes, as its arrays do)
    assert all(m.ranks[0].nbytes() >= ID_DICT_BYTES * len(m.ranks[0].id_dict) for m in models.values())


def test_a_windows_ranks_map_their_ids_densely_from_where_they_start():
    """A rank read from a window: the few ops its carry holds (ids from the job's start), then
    its ops there (ids far past them).  Its id map starts at the window's ids (``id_base``),
    the carried ones apart (``id_below``), not a dict of every id (~100 bytes an op the
    budget did not count); every id is found as a dict finds it, batched or rank by rank,
    one batch or a live batch at a time; and an id below the window's, later, too."""
    statics = [_static("all_reduce")]
    carried = [(PH_BEGIN, T, 7, 0, 7, -1, 0), (PH_BEGIN, T + 1, 40, 0, 40, -1, 0)]
    start = 900_000
    window = [(PH_BEGIN, T + 10 + j, start + j, 0, start + j, -1, 0) for j in range(300)]
    ends = [(PH_END, T + 400 + j, i, -1, -1, -1, 0) for j, i in enumerate([40, start, start + 299])]
    late = [(PH_BEGIN, T + 900, 3, 0, 3, -1, 0), (PH_BEGIN, T + 901, start + 300, 0, start + 300, -1, 0)]
    ids = [7, 40] + [start + j for j in range(300)] + [3, start + 300]
    for plan in ([([], [_rows(r, carried + window + ends + late, statics) for r in (0, 1)])],
                 [([], [_rows(r, carried, statics) for r in (0, 1)]), ([], [_rows(r, window, statics) for r in (0, 1)]),
                  ([], [_rows(r, ends, statics) for r in (0, 1)]), ([], [_rows(r, late, statics) for r in (0, 1)])]):
        for m in _same(plan).values():
            rt = m.ranks[0]
            assert rt.id_dict is None and rt.id_base >= 40 and set(rt.id_below) >= {7, 40}
            assert rt.id2idx.nbytes < 8 << 10  # (ids from 0: 3.6 MB a rank; from the span's floor: 21 KB)
            assert [rt.index_of(i) for i in ids] == list(range(len(ids)))
            assert rt.lookup(np.array(ids + [5, -1, start + 301])).tolist() == [*range(len(ids)), -1, -1, -1]
            assert rt.end[1] == T + 400 and rt.end[2] == T + 401 and rt.end[301] == T + 402  # (their ends found)
    # a rank whose ids start again from 0 (its process restarted) below ids a map from 0 holds
    # densely: dense from 0, as before (found by review: the map had started at the first ids)
    first = [(PH_BEGIN, T + j, 10_000 + j, 0, j + 1, -1, 0) for j in range(3000)]
    again = [(PH_BEGIN, T + 5000 + j, j, 0, j + 1, -1, 0) for j in range(3000)]
    for m in _same([([], [_rows(r, first, statics) for r in (0, 1)]),
                    ([], [_rows(r, again, statics) for r in (0, 1)])]).values():
        rt = m.ranks[0]
        assert rt.id_dict is None and rt.id_base == 0 and not rt.id_below
        assert [rt.index_of(i) for i in (10_000, 12_999, 0, 2999)] == [0, 2999, 3000, 5999]


def test_negative_ids_that_run_on_are_found_as_the_id_map_finds_them():
    """Ranks ingested together find an end's op where the rank's ids run on (``idoff``); a
    negative id runs on too, but the dense id map never holds one: its end finds no op,
    either way."""
    statics = [_static("all_reduce")]
    rows = [(PH_BEGIN, T, 7, 0, 1, -1, 0)] + [(PH_BEGIN, T + 1 + j, -5 + j, 0, 2 + j, -1, 0) for j in range(3)]
    rows += [(PH_END, T + 20, 7, -1, -1, -1, 0)] + [(PH_END, T + 21 + j, -5 + j, -1, -1, -1, 0) for j in range(3)]
    models = _same([([], [_rows(r, rows, statics) for r in (0, 1)])])
    for m in models.values():
        assert m.ranks[0].end[:4].tolist() == [T + 20, 0, 0, 0]


def test_ranks_are_made_in_the_records_order():
    """A new rank whose records come twice in a batch goes rank by rank; it is still made
    first when it comes first (the console lists ranks in the model's order)."""
    statics = [_static("all_reduce")]
    begin = [(PH_BEGIN, T, 1, 0, 1, -1, 0)]
    later = [(PH_BEGIN, T + 10, 2, 0, 2, -1, 0)]
    plan = [([], [_rows(5, begin, statics), _rows(5, later, statics), _rows(0, begin, statics),
                  _rows(1, begin, statics)])]
    models = _same(plan)
    assert [list(m.ranks) for m in models.values()] == [[5, 0, 1], [5, 0, 1]]


def test_memory_counts_shared_columns_while_a_rank_still_holds_them():
    """Found by review: once the other ranks grew out of the columns they shared, a rank
    that stopped (a hang) keeps the whole block alive; the console's budget must see it."""
    statics = [_static("all_reduce")]
    k = 2000
    first = [(PH_BEGIN, T + j, j + 1, 0, j + 1, -1, 0) for j in range(k)]
    m = _build([([], [_rows(r, first, statics) for r in range(8)])], True)
    block = m.ranks[0].begin.base
    assert block is not None and all(m.ranks[r].begin.base is block for r in range(8))
    more = [(PH_BEGIN, T + k + 1, k + 1, 0, k + 1, -1, 0)]
    m.ingest([], [_rows(r, more, statics) for r in range(1, 8)])  # rank 0 stopped
    assert m.ranks[0].begin.base is block and m.ranks[1].begin.base is not block
    held = {id(a.base): a.base.nbytes for a in (getattr(m.ranks[0], c) for c in ("begin", "end", "comp", "id"))}
    assert len(held) == 4 and sum(held.values()) == 4 * 8 * k * 8  # int64 columns of 8 ranks, whole
    moved: dict[int, int] = {}  # grown out: the block(s) they moved to, each counted once
    for r in range(1, 8):
        m.ranks[r].nbytes(moved)
    assert not set(moved) & set(held)
    assert m.nbytes() >= sum(held.values()) + sum(moved.values())  # the blocks are still counted whole


@pytest.mark.parametrize("fmt", ["native", "json"])
def test_a_synthetic_job_read_from_its_store_is_the_same_either_way(tmp_path, fmt, monkeypatch):
    """The real reader's batches (``source.load_trace``), a rank missing from the last
    all_reduce: the same model and the same culprit."""
    from commscope.analysis import source

    store = tmp_path / "job"
    write_store(str(store), JobShape(ranks=24, ops=30, culprit=5, json=fmt == "json"))
    built = {}
    monkeypatch.setenv("COMMSCOPE_READ_WORKERS", "0")
    for batched in (True, False):
        monkeypatch.setattr(TraceModel, "batch_ranks", batched)
        built[batched], _reader, _warnings = source.load_trace(str(store))
    assert differences(model_state(built[True]), model_state(built[False])) == []
    found = diagnose(built[True])
    assert [(f.kind, f.culprits) for f in found][:1] == [("missing_ranks", [5])]


def _ending(st: int, ts: int, op_id: int) -> list[tuple]:
    """The records that end op ``op_id`` begun at ``ts`` through static ``st`` of the live
    jobs' (1: async, its wait too; 3: device-timed, its ``done`` too)."""
    rows = [(PH_END, ts + 500, op_id, -1, -1, -1, 0)]
    if st == 1:
        rows += [(PH_WAIT_BEGIN, ts + 600, op_id, -1, -1, -1, 0), (PH_WAIT_END, ts + 700, op_id, -1, -1, -1, 0)]
    if st == 3:
        rows.append((PH_DONE, ts + 800, op_id, -1, -1, -1, 0))
    return rows


def _live_job(seed: int, world: int, polls: int, *, ending: float = 0.9,
              at_once: float = 0.5) -> list[tuple[list, list[OpRecords]]]:
    """A live job's polls: every rank's ops cut into polls of a few records each, a few
    ranks skipping polls; ops that end in a later poll (some never: ``ending`` of them
    end, ``at_once`` of those in their begin's poll), device-timed ones with ``done``,
    begins out of time order, ids that jump (a gap in a rank's counter), ends of ops
    never begun and ends in the poll before their begin's."""
    import random

    rng = random.Random(seed)
    statics = [_static("all_reduce"), _static("all_reduce", is_async=True), _static("broadcast", "1"),
               _static("all_gather", device=0)]
    next_id = dict.fromkeys(range(world), 1)
    seq = {(r, g): 0 for r in range(world) for g in ("0", "1")}
    pending: dict[int, list[tuple]] = {r: [] for r in range(world)}  # phases still to come
    plan = []
    clock = T
    for _ in range(polls):
        ops = []
        for r in range(world):
            if rng.random() < 0.2:
                continue
            rows = [pending[r].pop(0) for _ in range(min(len(pending[r]), rng.randrange(3)))]
            for _ in range(rng.randrange(4)):
                clock += 1000
                if rng.random() < 0.05:
                    next_id[r] += rng.randrange(2, 50)  # a gap
                st = rng.randrange(len(statics))
                g = statics[st].fields["group"]
                seq[(r, g)] += 1
                op_id = next_id[r]
                next_id[r] += 1
                ts = clock - (5000 if rng.random() < 0.1 else 0)  # some out of order
                rows.append((PH_BEGIN, ts, op_id, st, seq[(r, g)], -1, 0))
                if rng.random() < ending:
                    later = _ending(st, ts, op_id)
                    if rng.random() < at_once:
                        rows += later
                    else:
                        pending[r] += later
            if rng.random() < 0.05:
                rows.append((PH_END, clock, 10**6 + rng.randrange(100), -1, -1, -1, 0))  # never begun
            if rows:
                ops.append(_rows(r, rows, statics))
        plan.append(([], ops))
    return plan


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_long_live_job_together_leaves_what_rank_by_rank_leaves(seed):
    """Hundreds of polls of 40 ranks: ranks outgrow their rows again and again and move
    together into new blocks (``RankTable.relocate``), so a poll's ranks sit in several
    blocks; their scalars, open sets, id maps and completions as rank by rank leaves them,
    and the same findings."""
    plan = _live_job(seed, world=40, polls=300)
    models = _same(plan)
    m = models[True]
    blocks = {int(m.table.block[rt._s]) for rt in m.ranks.values()}
    assert len(blocks) > 1 and m.total_ops() > 5000
    assert _found(m) == _found(models[False])
    for r in (0, 7, 39):  # the lazy parts: open sets and id maps, asked after the fact
        rt = m.ranks[r]
        assert rt.open == {i for i in range(rt.n) if rt.comp[i] == 0}
        assert all(rt.index_of(int(rt.id[i])) == i for i in range(rt.n) if int(rt.id[i]) >= 0)


def _table_books(m: TraceModel) -> list[str]:
    """What is wrong with the model's table's books: each block's ranks and rows as its ranks
    say, no rank in a dropped block, and every block but the arena holding at least
    ``1 / EMPTY_BELOW`` of its rows (``RankTable.compact``)."""
    t = m.table
    k = t.size
    wrong = []
    for b, cols in enumerate(t.blocks):
        here = t.block[:k] == b
        if cols is None:
            if here.any():
                wrong.append(f"block {b} dropped with {int(here.sum())} ranks in it")
            continue
        if t._residents[b] != int(here.sum()) or t._held[b] != int(t.cap[:k][here].sum()):
            wrong.append(f"block {b}: books {t._residents[b]} ranks, {t._held[b]} rows; "
                         f"ranks say {int(here.sum())}, {int(t.cap[:k][here].sum())}")
        if b != t._arena and t._held[b] * t.EMPTY_BELOW < cols["begin"].shape[0]:
            wrong.append(f"block {b} holds {t._held[b]} of its {cols['begin'].shape[0]} rows")
    return wrong


def test_a_wide_live_job_lives_in_a_few_blocks_and_a_rank_that_stops_pins_none():
    """300 ranks over 150 polls, moving as they outgrow their rows: they live in the arena
    and a few blocks, not one block per batch that moved some (each gather across ranks
    goes block by block); ranks that stop growing (dead at poll 30) are moved out of a block
    they would pin, and their published views with them; the books stay right after every
    poll, and the model is rank by rank's."""
    plan = _live_job(5, world=300, polls=150)
    stopped = {5, 6, 7}
    plan = [(evs, [r for r in ops if k < 30 or r.rank not in stopped]) for k, (evs, ops) in enumerate(plan)]
    m = TraceModel()
    most = 0
    t = m.table
    for evs, ops in plan:
        m.ingest(evs, ops)
        assert _table_books(m) == []
        most = max(most, sum(cols is not None for cols in t.blocks))
        t.views()  # (published as a console does: a view of a moved rank's old rows would pin their block)
        assert all(rt._view.begin.base is t.blocks[int(t.block[rt._s])]["begin"]
                   for rt in m.ranks.values() if rt._view is not None and rt._view.n)
    # (blocks made; alive at once: arenas of a few generations, where a block per batch that
    # moved ranks left 54 alive here, and ~1.9k at 16k ranks)
    assert len(m.table.blocks) > 20 and most <= 16
    models = _same(plan)
    assert _found(models[True]) == _found(models[False])


def test_a_poll_of_heartbeats_and_samples_leaves_what_rank_by_rank_leaves(monkeypatch):
    """``_liveness_together`` (a chunk of only heartbeats and samples, a live poll's events)
    against the rank by rank path it stands for: heartbeats out of order and of equal times
    (the last of equals gives the count in flight), several samples of one rank in a chunk,
    a GPU error, ranks new to the model in the middle, and a chunk of other events."""
    import random

    rng = random.Random(4)

    def polls() -> list[list[dict]]:
        out = []
        for k in range(30):
            evs = []
            for r in rng.sample(range(40), 25) + ([41] if k == 12 else []):
                ts = T + k * 10**9 + rng.randrange(-5, 5) * 10**6
                for _ in range(rng.randrange(3)):
                    evs.append({"v": 3, "type": "heartbeat", "rank": r, "ts": ts + rng.choice((0, 0, 1)),
                                "inflight": rng.randrange(3)})
                for _ in range(rng.choice((0, 1, 1, 2))):
                    e = {"v": 3, "type": "sample", "rank": r, "ts": ts + 7, "cpu": rng.random() * 100,
                         "rss": 1 << 30, "gpu_util": rng.choice((None, 40.0))}
                    if rng.random() < 0.05:
                        e["gpu_error"] = f"nvml {k}"
                    evs.append(e)
            rng.shuffle(evs)
            if k == 20:
                evs.append({"v": 3, "type": "meta", "rank": 3, "ts": T, "world_size": 42})
            out.append(evs)
        return out

    plan = polls()
    late = T + 40 * 10**9
    plan += [[{"v": 3, "type": "heartbeat", "rank": 0, "ts": late, "inflight": c}] for c in (1, 2)]  # equal times
    together = TraceModel()
    for evs in plan:
        together.ingest(evs)
    taken = []
    monkeypatch.setattr(TraceModel, "_liveness_together", lambda *a: taken.append(1))  # (None: rank by rank)
    alone = TraceModel()
    for evs in plan:
        alone.ingest(evs)
    assert len(taken) == 32  # every chunk (the one with a meta event: its meta apart, ``_liveness_apart``)
    assert differences(model_state(together), model_state(alone)) == []
    assert together.ranks[41].samples.n == alone.ranks[41].samples.n
    assert together.ranks[0].hb_inflight == 2


@pytest.mark.parametrize("first", [[], [0, 1, 2]])
def test_a_poll_of_heartbeats_and_samples_from_ranks_with_no_slot_goes_rank_by_rank(first, monkeypatch):
    """Ranks far past the others (no slot in the table's array: ``RankTable.add``) in a chunk
    of heartbeats and samples: each rank keeps its own samples and heartbeat, as rank by rank
    leaves them (they once went to the last slot, or another rank's)."""
    def poll(ranks: list[int], k: int) -> list[dict]:
        out = []
        for r in ranks:
            out += [{"v": 3, "type": "heartbeat", "rank": r, "ts": T + k * 10**9 + r, "inflight": r % 3},
                    {"v": 3, "type": "sample", "rank": r, "ts": T + k * 10**9 + r, "cpu": float(r + k), "rss": 1}]
        return out

    plan = ([poll(first, 0)] if first else []) + [poll([100_000, 100_001, *first], k) for k in (1, 2)]
    together = TraceModel()
    for evs in plan:
        together.ingest(evs)
    monkeypatch.setattr(TraceModel, "_liveness_together", lambda *a: None)
    alone = TraceModel()
    for evs in plan:
        alone.ingest(evs)
    assert differences(model_state(together), model_state(alone)) == []
    assert together.samples(100_001)["cpu"].tolist() == [100_002.0, 100_003.0]
    assert together.ranks[100_000].hb_inflight == 100_000 % 3


ONE_STATIC = [_static("all_reduce")]  # (one decoder table for every poll: signatures known, the live path taken)


def _two(rows: list[tuple]) -> list[OpRecords]:
    """The same records on ranks 0 and 1 (two ranks: a live batch goes together)."""
    return [_rows(r, rows, ONE_STATIC) for r in (0, 1)]


HOSTILE_POLLS = {
    # ids mapped when asked must map as batch by batch does: a negative id, then one huge
    # enough to turn the map into a dict (the negative one is in it, or not, the same way)
    "negative then huge id": [[(PH_BEGIN, T, 1, 0, 1, -1, 0)], [(PH_BEGIN, T + 10, -5, 0, 2, -1, 0)],
                              [(PH_BEGIN, T + 20, 10**9, 0, 3, -1, 0), (PH_END, T + 25, 10**9, -1, -1, -1, 0)],
                              [(PH_END, T + 30, -5, -1, -1, -1, 0)]],
    "a dict by one batch's count": [[(PH_BEGIN, T, 1, 0, 1, -1, 0)], [(PH_BEGIN, T + 10, 4 * 2 + 4096 + 2, 0, 2, -1, 0)],
                                    [(PH_BEGIN, T + 20, -5, 0, 3, -1, 0)], [(PH_END, T + 30, -5, -1, -1, -1, 0)]],
    # completions that go back to 0 or below (ends at hostile times): open again, as rank by rank
    "an end at 0 after one": [[(PH_BEGIN, T, 1, 0, 1, -1, 0)], [(PH_END, T + 5, 1, -1, -1, -1, 0)],
                              [(PH_END, 0, 1, -1, -1, -1, 0)]],
    "an end below 0": [[(PH_BEGIN, T, 1, 0, 1, -1, 0), (PH_END, T + 5, 1, -1, -1, -1, 0)],
                       [(PH_BEGIN, T + 10, 2, 0, 2, -1, 0), (PH_END, -7, 2, -1, -1, -1, 0)]],
    "an id at the bottom of int64": [[(PH_BEGIN, T, 1, 0, 1, -1, 0)], [(PH_BEGIN, T + 1, -(1 << 63), 0, 2, -1, 0)]],
}


@pytest.mark.parametrize("name", list(HOSTILE_POLLS))
def test_hostile_polls_leave_what_rank_by_rank_leaves(name):
    """Found by review: cases where the live path together left another model."""
    models = _same([([], _two(rows)) for rows in HOSTILE_POLLS[name]])
    assert _found(models[True]) == _found(models[False])
    for m in models.values():
        for rt in m.ranks.values():
            assert rt.open == {i for i in range(rt.n) if rt.comp[i] <= 0}


def test_a_nested_op_begun_by_a_batchs_events_closes_with_its_outer_op():
    """Found by review: a JSON nested begin in the batch whose records end its parent (the
    rank had no nested op before it, so its records went together)."""
    nested = {"v": SCHEMA_VERSION, "type": "op", "phase": "begin", "rank": 0, "ts": T + 2, "id": 2, "parent": 1,
              "op": "all_reduce", "group": "0", "nested": True, "tid": 5}
    plan = [([], _two([(PH_BEGIN, T, 1, 0, 1, -1, 0)])), ([nested], _two([(PH_END, T + 9, 1, -1, -1, -1, 0)]))]
    m = _same(plan)[True]
    assert m.ranks[0].comp[:2].tolist() == [T + 9, T + 9] and m.inflight(0) == []


def test_a_huge_rank_number_costs_no_array_by_rank():
    """Found by review: arrays indexed by rank (the table's slots, a group's columns) were
    sized by the largest rank number: one rank numbered 4M in 40 groups took 670 MiB."""
    statics = [_static("all_reduce", str(g)) for g in range(40)]
    m = TraceModel()
    m.ingest([], [_rows(4_194_303, [(PH_BEGIN, T + g, g + 1, g, 1, -1, 0) for g in range(40)], statics)])
    assert m.table.rank_slot.nbytes < 1 << 20 and all(gi.colmap.nbytes < 1 << 20 for gi in m.coll.values())
    assert m.collective("7", 1) == {4_194_303: 7}


def test_a_first_rounds_metas_and_groups_beside_heartbeats_leave_what_one_event_at_a_time_leaves(monkeypatch):
    """A poll's first round hands mostly heartbeats and samples, and a meta or a group a
    rank: those go together (``_liveness_together``), the rest rank by rank
    (``_liveness_apart``); the model is the one each event ingested alone leaves (but for
    the counts of ingests), its ranks made in rank order."""
    taken = []
    apart = TraceModel._liveness_apart
    monkeypatch.setattr(TraceModel, "_liveness_apart", lambda self, *a: taken.append(1) or apart(self, *a))
    events = []
    for rank in (5, 2, 7, 0, 3, 1, 4):
        events += [e for k in range(4) for e in _misc(rank, k) if e["type"] != "op"]
        events.append({"v": SCHEMA_VERSION, "rank": rank, "type": "heartbeat", "ts": T + 5000 + rank, "inflight": 1})
    base = {"v": SCHEMA_VERSION, "rank": 6}  # (a rank with no heartbeat: made in its place all the same)
    events += [dict(base, type="meta", ts=T + 3, world_size=8, recorder="native"),
               dict(base, type="summary", ts=T + 1, seg=0, events=9, size=900, ops=[]),
               dict(base, type="stack", ts=T + 950, id=2, reason="hang", frames=[])]
    together = TraceModel()
    together.ingest(events)
    alone = TraceModel()
    for e in events:
        alone.ingest([e])
    assert taken == [1]

    def state(m: TraceModel) -> dict:
        s = model_state(m)
        for d in s["ranks"].values():
            del d["version"], d["touched"]  # (counts of ingests: one a call here)
        del s["version"], s["rank_order"]
        return s

    assert differences(state(together), state(alone)) == []
    assert list(together.ranks) == sorted(together.ranks) == list(range(8))
    monkeypatch.setattr(TraceModel, "_liveness_together", lambda *a: None)  # (rank by rank, versions and all)
    by_rank = TraceModel()
    by_rank.ingest(events)
    assert differences(model_state(together), model_state(by_rank)) == []
    assert together.ranks[6].meta is not None and together.ranks[3].exits and together.ranks[0].last_stack


def test_new_ranks_aligned_together_are_aligned_as_each_alone():
    """``model._aligned`` (every new rank of a whole read's step at once) gives each rank the
    ``aligned_from`` and ``idoff`` its own ``RankTrace.align`` gives it: runs of consecutive
    ids, breaks anywhere (at a rank's first row too), one-row ranks, ids that wrap."""
    from commscope.analysis.columns import RankTable, RankTrace
    from commscope.analysis.model import _aligned

    rng = np.random.default_rng(11)
    top = np.iinfo(np.int64).max
    for trial in range(300):
        sizes = rng.integers(1, 9, rng.integers(1, 12))
        ids = []
        for k in sizes.tolist():
            nxt = int(rng.choice([0, 5, -3, top - 2, int(rng.integers(-50, 50))]))
            for _ in range(k):
                ids.append(nxt)
                nxt = nxt + 1 if rng.random() < 0.7 else int(rng.integers(-20, 20))
                nxt = nxt if nxt <= top else -top - 1  # (wrapped, as int64 arithmetic wraps)
        ids_a = np.array(ids, np.int64)
        start = np.zeros(len(sizes) + 1, np.int64)
        np.cumsum(sizes, out=start[1:])
        got_from, got_off = _aligned(ids_a, start)
        table = RankTable()
        for j in range(len(sizes)):
            rt = RankTrace(j, cap=0, table=table)
            rt.align(ids_a[start[j]:start[j + 1]], 0)
            assert (int(got_from[j]), int(got_off[j])) == (int(table.aligned_from[rt._s]), int(table.idoff[rt._s])), (
                trial, j, ids_a[start[j]:start[j + 1]].tolist())


def test_a_dead_rank_in_an_op_whose_id_finds_no_op_is_named_in_that_op():
    """Found by review (random plans): a dead rank whose op in flight has an id the id map
    does not hold (a negative one) made ``find_dead`` look the op up by its id, find none,
    and raise; it is named by the op's index, as ``activity`` found it."""
    statics = [_static("all_reduce")]
    events = [{"type": "heartbeat", "ts": T + k * S, "rank": r, "inflight": 1, "v": SCHEMA_VERSION}
              for r in (0, 1) for k in range(1, 60)]
    events += [{"type": "heartbeat", "ts": T + S, "rank": 2, "inflight": 1, "v": SCHEMA_VERSION}]
    ops = [_rows(r, [(PH_BEGIN, T + S // 2, 1, 0, 1, -1, 0), (PH_END, T + S // 2 + 1000, 1, -1, -1, -1, 0),
                     (PH_BEGIN, T + S, -5 if r == 2 else 2, 0, 2, -1, 0)], statics) for r in range(3)]
    m = TraceModel()
    m.ingest(events, ops)
    found = [f for f in diagnose(m, T + 60 * S, 5.0) if f.severity == "error"]
    assert [(f.kind, f.culprits, dict(f.victims)) for f in found] == [("dead_rank", [2], {})]
    assert "(in all_reduce #2 (group 0))" in found[0].message


def test_a_source_on_a_collective_is_refused_and_its_rank_is_not_missing_from_it():
    """Found by review (random plans): a hostile source record on a collective (a device
    op, so still in flight) moved its seq after it was indexed; ``find_missing`` found the
    rank waiting at a seq nobody entered by the index, called every member missing and
    raised.  A source resolves only a receive (its peer and seq stay the collective's), and
    a rank waiting in a collective entered it: nothing is missing."""
    statics = [_static("all_gather", device=0)]
    recs = OpRecords(1, np.array([PH_BEGIN, PH_END], np.int8), np.array([T, T + 20_000]), np.array([24, 24]),
                     np.array([0, -1], np.int32), np.array([5, 4]), np.array([-1, -1]), np.full(2, 5, np.uint64),
                     np.array([-1, 1], np.int32), np.zeros(2, np.int64), np.array([0, F_APPROX | F_SOURCE], np.uint8),
                     {}, statics)
    m = TraceModel()
    m.ingest([], [recs])
    assert m.ranks[1].seq[0] == 5 and m.ranks[1].peer[0] == -1 and m.ranks[1].comp[0] == 0  # (in flight)
    assert [f.kind for f in diagnose(m, T + 10**12, 5.0)] == []


def test_a_source_resolves_only_an_any_source_receive():
    """A source record (``F_SOURCE``: an end carrying the peer an any-source recv got) sets
    the peer and seq of a receive whose peer is open; on a send or a collective it is
    refused: their peer and seq stay as their begins said."""
    statics = [_static("recv", direction="recv", peer=-1, any_source=True), _static("isend", direction="send", peer=2),
               _static("all_reduce")]
    k = 6
    recs = OpRecords(0, np.array([PH_BEGIN, PH_END] * 3, np.int8), np.arange(T, T + k), np.array([1, 1, 2, 2, 3, 3]),
                     np.array([0, -1, 1, -1, 2, -1], np.int32), np.array([-1, 9, 4, 9, 7, 9]), np.full(k, -1),
                     np.full(k, 5, np.uint64), np.array([-1, 3, 2, 3, -1, 3], np.int32), np.zeros(k, np.int64),
                     np.array([0, F_SOURCE] * 3, np.uint8), {}, statics)
    m = TraceModel()
    m.ingest([], [recs])
    rt = m.ranks[0]
    assert rt.peer[:3].tolist() == [3, 2, -1] and rt.seq[:3].tolist() == [9, 4, 7]
    assert (rt.comp[:3] > 0).all()


def test_a_chunk_of_neither_ops_nor_liveness_leaves_what_rank_by_rank_leaves(monkeypatch):
    """A whole read's events (each stream's meta; groups, stacks, exits, retention
    summaries, drop reports beside them), none an op, a heartbeat or a sample: ingested
    rank by rank without the per-rank masks (``_misc_only``), they leave the model the
    general way leaves, versions and the ranks' order included, and later batches (ops,
    heartbeats) land alike on it."""
    taken = []
    misc_only = TraceModel._misc_only
    monkeypatch.setattr(TraceModel, "_misc_only", lambda self, *a: taken.append(1) or misc_only(self, *a))
    events = []
    for rank in (5, 2, 7, 0, 3):
        base = {"v": SCHEMA_VERSION, "rank": rank}
        events += [dict(base, type="meta", ts=T + rank, world_size=8, recorder="native"),
                   dict(base, type="summary", ts=T - 10, seg=0, events=9, size=900, ops=[])]
        if rank % 2:
            events += [dict(base, type="group", ts=T + 40, group="1", granks=[1, 3, 5, 7], backend="gloo"),
                       dict(base, type="stack", ts=T + 950, id=2, reason="hang", frames=[]),
                       dict(base, type="dropped", ts=T + 960, count=3, total=3, cause="buffer full")]
        if rank == 3:
            events.append(dict(base, type="exit", ts=T + 1_000_000, reason="exception", exc="ValueError: boom"))
    events.append({"v": SCHEMA_VERSION, "rank": 6, "type": "summary", "ts": T, "seg": 0, "events": 1, "size": 9,
                   "ops": []})  # (a rank with nothing timed)
    events.append({"v": SCHEMA_VERSION, "rank": 4, "type": "meta", "ts": 0, "world_size": 8,
                   "recorder": "native"})  # (a rank whose times are all 0: no bound of the chunk's)
    later = [e for r in range(8) for e in _misc(r, 1)]
    fast, general = TraceModel(), TraceModel()
    for m in (fast, general):
        m.ingest(events)
        if m is fast:
            assert taken == [1]
            monkeypatch.setattr(TraceModel, "_misc_only", lambda *a: None)  # (the general way from here on)
        assert m.changed == frozenset({0, 2, 3, 4, 5, 6, 7})
    assert differences(model_state(fast), model_state(general)) == []
    assert list(fast.ranks) == [0, 2, 3, 4, 5, 6, 7] and fast.ranks[3].exits and fast.ranks[5].last_stack
    assert fast.ranks[6].first_ts == 0 and fast.ranks[5].first_ts == T + 5 and fast.start_ns == T
    for m in (fast, general):
        m.ingest(later, [_rows(r, [(PH_BEGIN, T + 2000, 1, 0, 1, -1, 0)], [_static("all_reduce")]) for r in range(8)])
    assert differences(model_state(fast), model_state(general)) == []


@pytest.mark.parametrize("piece", [None, 7])
def test_samples_appended_for_many_ranks_at_once_read_back_as_each_rank_s_own(piece, monkeypatch):
    """``SampleRows`` (every rank's samples, rows of one shared block): random polls, each
    appending to some slots at once (``append``) or to one (``append_one``), through ranks
    outgrowing their rows and blocks giving way, read back per slot as a list of each
    slot's own appends holds them; the arrays handed out before stay as they were (rows a
    rank left, and a block that gave way, are never written again); the last sample is the
    last appended.  ``piece``: samples copied at a time (``COPY_ROWS``: a few, so a copy
    goes in many pieces, some a slot of more)."""
    from commscope.analysis.columns import SAMPLE_FIELDS, SampleRows

    if piece is not None:
        monkeypatch.setattr(SampleRows, "COPY_ROWS", piece)
    rng = np.random.default_rng(5)
    table = SampleRows()
    own: dict[int, list[list[float]]] = {}
    last: dict[int, object] = {}
    handed: list[tuple[dict[str, np.ndarray], list[list[float]]]] = []
    renewed = moved = 0
    for poll in range(300):
        block, fill = table.rows, table.fill
        caps = table.cap.copy()
        if poll % 3:
            slots = rng.choice(200, size=int(rng.integers(1, 60)), replace=False)
            counts = rng.integers(0, 5, size=slots.shape[0])
            counts[0] = max(1, int(counts[0]))
            values = rng.random((int(counts.sum()), len(SAMPLE_FIELDS)))
            values[rng.random(values.shape) < 0.1] = np.nan
            lasts = [f"poll {poll} slot {s}" for s in slots.tolist()]
            table.append(slots, counts, values, lasts)
            at = 0
            for s, k, text in zip(slots.tolist(), counts.tolist(), lasts, strict=True):
                own.setdefault(s, []).extend(values[at:at + k].tolist())
                at += k
                last[s] = text
        else:
            s = int(rng.integers(0, 260))  # (past the slots so far too)
            values = rng.random((int(rng.integers(1, 40)), len(SAMPLE_FIELDS)))
            table.append_one(s, values, {"poll": poll})
            own.setdefault(s, []).extend(values.tolist())
            last[s] = {"poll": poll}
        renewed += table.rows is not block
        moved += table.rows is block and bool((table.cap[:caps.shape[0]] != caps).any()) and table.fill > fill
        for s in rng.choice(sorted(own), size=3).tolist():
            handed.append((table.arrays(s), [row[:] for row in own[s]]))
    for s, rows in own.items():
        got = np.column_stack([table.arrays(s)[f] for f in SAMPLE_FIELDS])
        assert np.array_equal(got, np.array(rows).reshape(-1, len(SAMPLE_FIELDS)), equal_nan=True), s
        assert table.last[s] == last[s]
    for arrays, rows in handed:
        assert np.array_equal(np.column_stack([arrays[f] for f in SAMPLE_FIELDS]),
                              np.array(rows).reshape(-1, len(SAMPLE_FIELDS)), equal_nan=True)
    assert all(c.flags.c_contiguous for c in table.arrays(0).values())
    assert table.arrays(10_000)["ts"].shape == (0,) and renewed >= 3 and moved >= 10


def test_a_live_rank_s_samples_go_into_the_shared_block_counted_once():
    """Samples polls bring a sample a rank (appended for the poll's ranks at once, through
    ``TraceModel.ingest``) are rows of the table's one block: the columns read back as
    written, each contiguous, and the model counts the block once, however many ranks hold
    rows in it."""
    beats_only, sampled = TraceModel(), TraceModel()
    for k in range(100):
        beats = [{"v": 3, "type": "heartbeat", "rank": r, "ts": T + k * 10**9, "inflight": 0} for r in range(3)]
        beats_only.ingest([dict(b) for b in beats])
        sampled.ingest(beats + [{"v": 3, "type": "sample", "rank": r, "ts": T + k * 10**9 + 1, "cpu": float(k + r),
                                 "rss": 1 << 30} for r in range(3)])
    for r in range(3):
        got = sampled.samples(r)
        assert got["cpu"].tolist() == [float(k + r) for k in range(100)] and np.isnan(got["gpu_util"]).all()
        assert all(c.flags.c_contiguous for c in got.values())
        assert sampled.latest_sample(r)["cpu"] == float(99 + r)
    rows = sampled.table.sample_rows
    assert rows.rows.shape[0] >= 300
    assert sampled.nbytes() - beats_only.nbytes() == rows.nbytes() - beats_only.table.sample_rows.nbytes()
    assert sampled.ranks[0].nbytes() == beats_only.ranks[0].nbytes()


def _touched_since(log: list[tuple[int, int]], version: int, current: int) -> int | None:
    """The rule of a touch log read from ``RankTrace.touched`` (oldest first): the earliest
    begin among the batches after ``version``, None where the log no longer holds them all."""
    if version >= current:
        return np.iinfo(np.int64).max
    if not log or log[0][0] > version + 1:
        return None
    return min((b for v, b in log if v > version), default=np.iinfo(np.int64).max)


def test_views_published_together_are_each_ranks_own_view():
    """``RankTable.views`` (every changed rank published in one pass: the running max done
    once, the touch logs gathered as rings, each block's read-only columns looked up once)
    against ``RankTrace.view`` of each rank alone, after every poll of a live job whose ranks
    move between blocks, begin out of time order and keep ops in flight, over more polls
    than a touch log holds (it wraps), with polls of heartbeats alone between (a view
    published again from the same rows); and each view's ``touched_since`` of every version
    against the rank's own log."""
    from commscope.analysis.columns import TOUCH_LOG, RankView

    plan = _live_job(11, world=40, polls=TOUCH_LOG + 30)
    m = TraceModel()
    t = m.table
    beats = again = 0
    for k, (evs, ops) in enumerate(plan):
        m.ingest(evs, ops)
        first = {}
        if k % 3 == 0:  # (heartbeats alone: the ranks change, their rows do not)
            t.views()
            first = {r: rt._view for r, rt in m.ranks.items()}
            beats += 1
            m.ingest([{"type": "heartbeat", "ts": T + beats, "v": 3, "rank": r, "inflight": 1} for r in m.ranks])
        t.views()
        together = {r: rt._view for r, rt in m.ranks.items()}
        again += sum(v.version != first[r].version and v.rows is first[r].rows and v.at == first[r].at
                     for r, v in together.items() if r in first)
        for v in together.values():  # (the running max as published, before any view alone)
            assert v is not None
            exact = np.maximum.accumulate(runmax.ends_of(v.sb, v.comp[v.order_])) if v.n else v.pmax
            assert np.array_equal(v.pmax, exact), (k, v.rank)
        for r, rt in m.ranks.items():
            rt._view = None  # (what a rank's own view makes, from nothing)
            alone = rt.view()
            v = together[r]
            assert v is not None and alone is not None
            for name in (*RankView.COLUMNS, "order_", "sb", "pmax"):
                assert np.array_equal(getattr(v, name), getattr(alone, name)), (k, r, name)
            assert all(getattr(v, f) == getattr(alone, f) for f in (
                "rank", "version", "n", "open", "first_ts", "last_ts", "last_hb", "meta", "exits")), (k, r)
            assert v.touches == alone.touches == int(t.touches[rt._s])
            log = rt.touched
            for version in range(0, v.version + 2) if k % 4 == 0 else ():
                want = _touched_since(log, version, v.version)
                assert v.touched_since(version) == want, (k, r, version)
                assert alone.touched_since(version) == want, (k, r, version)
    wrapped = [rt for rt in m.ranks.values() if int(t.touches[rt._s]) > TOUCH_LOG]
    assert len(wrapped) > 10 and any(not rt._sorted for rt in m.ranks.values()) and again > 100


def _batch_touches(m: TraceModel, before: np.ndarray) -> int:
    """The earliest begin among the touch log entries every rank was written by the batch
    just ingested (``before``: the table's ``touches`` before it; I64_MAX: none)."""
    t = m.table
    low = np.iinfo(np.int64).max
    for s in range(t.size):
        for k in range(int(before[s]) if s < before.shape[0] else 0, int(t.touches[s])):
            low = min(low, int(t.touch_first[s, k % t.touch_first.shape[1]]))
    return low


@pytest.mark.parametrize(("remembered", "together"), [(8, True), (256, True), (8, False)])
def test_a_model_s_touches_since_a_version_are_every_rank_s_together(monkeypatch, remembered, together):
    """``TraceModel.touched_since``, what a console asks each step instead of walking 16k
    ranks' ops in flight: after every poll of a live job (ops that end polls later, begins
    out of time order, ranks skipping polls, polls of heartbeats alone), for every version,
    the earliest begin among the entries every rank's own touch log was written since,
    and None once the model's log of ``TOUCHES`` batches no longer reaches back; ranks
    ingested together and rank by rank."""
    monkeypatch.setattr(TraceModel, "TOUCHES", remembered)
    plan = _live_job(7, world=30, polls=60)
    m = TraceModel()
    m.batch_ranks = together
    m.live_rows = m.live_rows if together else 0
    log: list[tuple[int, int]] = []
    for k, (evs, ops) in enumerate(plan):
        before = m.table.touches[:m.table.size].copy()
        m.ingest(evs, ops)
        log.append((m.version, _batch_touches(m, before)))
        if k % 5 == 4:  # (heartbeats alone: ranks change, no op does)
            before = m.table.touches[:m.table.size].copy()
            m.ingest([{"type": "heartbeat", "ts": T + k, "v": SCHEMA_VERSION, "rank": r, "inflight": 1}
                      for r in m.ranks])
            log.append((m.version, _batch_touches(m, before)))
            assert log[-1][1] == np.iinfo(np.int64).max
        for version in range(0, m.version + 2):
            assert m.touched_since(version) == _touched_since(log[-remembered:], version, m.version), (k, version)
    assert m.touched_since(0) is None if remembered < len(log) else m.touched_since(0) is not None


def _hang_feed(monkeypatch) -> tuple[Any, list[int]]:
    """A live console's feed with a model of its own (a log of 8 batches), and the list its
    walks of every rank's ops in flight are counted in."""
    from commscope.store import EmptyReader
    from commscope.tui.feed import LIVE, Feed

    monkeypatch.setattr(TraceModel, "TOUCHES", 8)
    feed = Feed(EmptyReader("polls"), mode=LIVE, hang_after=1.0)
    walks, walk = [], feed.model.oldest_in_flight
    monkeypatch.setattr(feed.model, "oldest_in_flight", lambda after: walks.append(after) or walk(after))
    return feed, walks


def _ask_hang(monkeypatch, feed: Any, clock: int, hang: int) -> bool:
    """Whether a hang is due at ``clock``: ``Feed._hang_due`` (asked first: the walk
    settles every open set) against a walk of every rank's ops in flight (one that began
    after the last judgement's moment less ``hang``, ``hang`` old now).  A hang found is
    judged at once, as the diagnosis it makes due judges."""
    monkeypatch.setattr(feed, "now", lambda: clock)
    after, upto = feed._judged[0] - hang, clock - hang
    got = feed._hang_due(0.0)
    want = any(rt.comp[i] == 0 and after < int(rt.begin[i]) <= upto for rt in feed.model.ranks.values()
               for i in rt.open)
    assert got == want, clock
    if want:
        feed._judged = (clock, hang)
    return want


def test_a_console_walks_every_rank_for_a_hang_only_when_one_may_be_due(monkeypatch):
    """``Feed._hang_due`` answers as walking every rank's ops in flight answers (an op in
    flight that began after the last judgement's moment less hang_after and is hang_after
    old now), after every poll of a live job and at moments before, at and past its latest
    op, over diagnoses that judge at new moments (each hang found, and at a pace of their
    own), pauses of the job, and a model log that no longer reaches back; and walks them
    only when the last walk or an op changed since may have passed hang_after."""
    feed, walks = _hang_feed(monkeypatch)
    m = feed.model
    hang = 100_000
    asked = due = 0
    latest = clock = T
    # (a poll: ~45 us of the job's; most ops end in it)
    for k, (evs, ops) in enumerate(_live_job(3, world=30, polls=120, ending=0.995, at_once=0.97)):
        m.ingest(evs, ops)
        latest = max([latest, *(int(recs.ts.max()) for recs in ops if recs.ts.shape[0])])
        if k % 7 == 0:
            feed._judged = (clock, hang)  # (a diagnosis at its own pace)
        if k % 40 == 39:
            for _ in range(10):  # (more batches than the model's log holds, no op among them)
                m.ingest([{"type": "heartbeat", "ts": T, "v": SCHEMA_VERSION, "rank": 0, "inflight": 1}])
        for now in (latest - hang, latest, latest + hang // 3, latest + (4 if k % 10 == 9 else 1) * hang):
            clock = max(clock, now)  # (a console's moment never goes back, ``store.AsOf``)
            due += _ask_hang(monkeypatch, feed, clock, hang)
            asked += 1
    assert 10 < due < asked // 2
    assert 20 < len(walks) < asked // 3


def _hostile_job(seed: int, world: tuple[int, int], polls: int) -> list[list[OpRecords]]:
    """A live job's polls with what ``_live_job`` has not: ranks joining as it runs, nested
    ops (sends inside an all_reduce, most never closed but by their outer op's end), a
    poll of ~40 records a rank now and then, and completions sent back to 0 (an end or a
    ``done`` at ts 0, hostile)."""
    import random

    rng = random.Random(seed)
    statics = [_static("all_reduce"), _static("all_reduce", is_async=True), _static("broadcast", "1"),
               _static("all_gather", device=0), _static("send", nested=True, direction="send", peer=1)]
    next_id: dict[int, int] = {}
    pending: dict[int, list[tuple]] = {}
    ended: dict[int, list[tuple[int, int]]] = {}
    seq: dict[tuple[int, str], int] = {}
    clock = T
    plan = []
    for k in range(polls):
        ops = []
        for r in range(world[0] + (world[1] - world[0]) * k // polls):
            next_id.setdefault(r, 1)
            pending.setdefault(r, [])
            ended.setdefault(r, [])
            if rng.random() < 0.2:
                continue
            rows = [pending[r].pop(0) for _ in range(min(len(pending[r]), rng.randrange(4)))]
            outer = None
            for _ in range(rng.randrange(40) if rng.random() < 0.05 else rng.randrange(4)):
                clock += 1000
                st = rng.randrange(len(statics))
                st = 0 if st == 4 and outer is None else st
                g = statics[st].fields["group"]
                seq[(r, g)] = seq.get((r, g), 0) + 1
                op_id = next_id[r]
                next_id[r] += 1
                ts = clock - (5000 if rng.random() < 0.1 else 0)
                rows.append((PH_BEGIN, ts, op_id, st, seq[(r, g)], outer if st == 4 else -1, 0))
                outer = op_id if st == 0 else outer
                if rng.random() < (0.3 if st == 4 else 0.97):
                    later = _ending(st, ts, op_id)
                    ended[r].append((op_id, st))
                    if rng.random() < 0.9:
                        rows += later
                    else:
                        pending[r] += later
            if ended[r] and rng.random() < 0.03:
                op_id, st = rng.choice(ended[r])
                rows.append((PH_DONE if st == 3 else PH_WAIT_END if st == 1 else PH_END, 0, op_id, -1, -1, -1, 0))
            if rows:
                ops.append(_rows(r, rows, statics))
        plan.append(ops)
    return plan


@pytest.mark.parametrize(("seed", "together", "failing"), [(1, True, False), (2, False, False), (3, True, True)])
def test_a_console_s_hang_walk_answers_as_every_rank_s_ops_do_on_a_hostile_job(monkeypatch, seed, together, failing):
    """``Feed._hang_due`` against a walk of every rank's ops in flight on ``_hostile_job``
    (ranks joining, nested ops their outer op's end closes, long polls, completions sent
    back to 0, polls of heartbeats alone), its ranks ingested together or rank by rank,
    with ingests that fail partway (the model's log then cannot say what changed)."""
    import random

    feed, walks = _hang_feed(monkeypatch)
    m = feed.model
    m.batch_ranks = together
    m.live_rows = m.live_rows if together else 0
    rng = random.Random(seed)
    phases = TraceModel._batch_phases

    def flaky(self, *args, **kwargs):
        if rng.random() < 0.04:
            raise MemoryError("in the middle of a batch")
        return phases(self, *args, **kwargs)

    if failing:
        monkeypatch.setattr(TraceModel, "_batch_phases", flaky)
    hang = 60_000
    latest = clock = T
    asked = due = failed = 0
    for k, ops in enumerate(_hostile_job(seed, (10, 40), 120)):
        batches: list[tuple[list, list]] = [([], ops)]
        if k % 11 == 5:  # (heartbeats alone)
            batches.append(([{"type": "heartbeat", "ts": latest, "v": SCHEMA_VERSION, "rank": r, "inflight": 1}
                             for r in m.ranks], []))
        for events, recs in batches:
            try:
                m.ingest(events, recs)
            except MemoryError:
                failed += 1
        latest = max([latest, *(int(recs.ts.max()) for recs in ops if recs.ts.shape[0])])
        if k % 7 == 0:
            feed._judged = (clock, hang)
        for now in (latest - hang, latest, latest + hang // 3, latest + 3 * hang):
            clock = max(clock, now)
            due += _ask_hang(monkeypatch, feed, clock, hang)
            asked += 1
    assert 10 < due < asked // 2 and len(walks) < asked * 2 // 3
    assert (failed > 3) == failing


def test_an_ingest_that_fails_partway_leaves_no_judgement_of_the_model_before(monkeypatch):
    """A batch whose begins went in before the ingest failed (a bug, a lack of memory): the
    model changed, so what was judged of it before (its open ops, its blocked ranks) is not
    handed out again as its state now."""
    from commscope.analysis import rankstate

    statics = [_static("all_reduce", "0")]
    m = TraceModel()
    m.ingest([], [_begins(0, statics, [0]), _begins(1, statics, [0])])
    before = rankstate.open_ops(m)
    assert sorted(rankstate.blocked_ranks(m)) == [0, 1]
    version = m.version

    def fails(*args, **kwargs):
        raise MemoryError("in the middle of a batch")

    monkeypatch.setattr(m, "_ingest_chunk", fails)  # (the events go after the records' begins)
    beat = {"type": "heartbeat", "ts": T + 100, "rank": 2, "inflight": 1, "v": SCHEMA_VERSION}
    with pytest.raises(MemoryError):
        m.ingest([beat], [_begins(2, statics, [0])])
    assert m.version > version
    assert m.changed == frozenset({0, 1, 2})
    slots, ops = rankstate.open_ops(m)
    fresh = m.table.open_ops()
    assert slots.tolist() == fresh[0].tolist() and ops.tolist() == fresh[1].tolist()
    assert len(slots) == len(before[0]) + 1  # rank 2's begin, in before the failure
    assert sorted(rankstate.blocked_ranks(m)) == [0, 1, 2]
    # (a console's question, "what changed since", has no answer past it: rank 2's begin went in)
    assert m.touched_since(version) is None and m.touched_since(m.version) == np.iinfo(np.int64).max
