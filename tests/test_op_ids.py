"""A begin that reuses an op id its rank has begun starts a new piece of its stream
(``analysis/opids``): each phase goes to the latest begin of its id before it, as the
stream put them, and the reuse is counted and said.

The model pairs phases with ops by id and takes a batch's begins before its phases.  A
damaged or foreign trace that reused an id let the end of one op close another: a rank
hung in a collective its peers never entered was read as finished, ``check`` exited 0 over
a hang, and what the model held depended on how the reader cut the stream.  Whichever way
the model takes records in (rank by rank, new ranks together, a live poll together or a
scalar step a rank, a poll handed over as one set of columns, event dicts), the pairing is
the stream's.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from commscope import blocks
from commscope.analysis import TraceModel, diagnose, opids
from commscope.analysis.synth import S, TraceBuilder
from commscope.cli import main as cli
from commscope.events import encode
from commscope.oprecords import PH_BEGIN, PH_END, OpRecords, Static, Unpacked, packed
from commscope.store import open_writer
from commscope.store.base import ReadStats

T = 1_700_000_000_000_000_000


def _static(op: str, shape: int = 4) -> Static:
    fields = {"type": "op", "phase": "begin", "op": op, "group": "0", "in_shapes": [[shape]],
              "in_dtypes": ["float32"], "in_bytes": 4 * shape, "site": f"train.py:{shape} in step"}
    return Static(fields, hash((op, shape)) & 0xFFFFFFFF, -1, None)


STATICS = [_static("all_reduce"), _static("broadcast", 8)]


def _records(rank: int, rows: list[tuple[int, ...]], statics: list[Static] = STATICS) -> OpRecords:
    """Records from (phase, id, static[, parent id]) rows, a microsecond apart; begins of
    static 0 take seq = id, of static 1 seq 1; a thread per rank."""
    k = len(rows)
    rows = [(*row, -1) if len(row) == 3 else row for row in rows]
    ph, ids, st, parent = (np.array(c) for c in zip(*rows, strict=True))
    begin = ph == PH_BEGIN
    return OpRecords(rank, ph.astype(np.int8), T + rank + 1000 * np.arange(k) + 1000 * ids,
                     ids.astype(np.int64), np.where(begin, st, -1).astype(np.int32),
                     np.where(begin, np.where(st == 0, ids, 1), -1).astype(np.int64), parent.astype(np.int64),
                     np.full(k, 7 + rank, np.uint64), np.full(k, -1, np.int32), np.zeros(k, np.int64),
                     np.zeros(k, np.uint8), {}, statics)


def _first() -> list[OpRecords]:
    """Four ranks, ops 1 to 3 each, begun and ended."""
    return [_records(r, [row for i in (1, 2, 3) for row in ((PH_BEGIN, i, 0), (PH_END, i, -1))]) for r in range(4)]


def _second(static: int) -> list[OpRecords]:
    """Op 4 on every rank; rank 2 begins op 2 again, rank 1 begins op 5 twice."""
    return [_records(0, [(PH_BEGIN, 4, static)]), _records(1, [(PH_BEGIN, 4, static), (PH_BEGIN, 5, 0),
                                                               (PH_BEGIN, 5, 0)]),
            _records(2, [(PH_BEGIN, 2, static), (PH_BEGIN, 4, static)]), _records(3, [(PH_BEGIN, 4, static)])]


def _third() -> list[OpRecords]:
    """Rank 3 begins op 4 again (its highest: what the batch before raised) and op 6, rank 0 op 5."""
    return [_records(3, [(PH_BEGIN, 4, 0), (PH_BEGIN, 6, 0)]), _records(0, [(PH_BEGIN, 5, 0)])]


def _ingest(m: TraceModel, recs: list[OpRecords], spans: bool) -> None:
    if spans:
        got = packed(recs)
        assert got is not None
        m.ingest([], Unpacked(got), got)
    else:
        m.ingest([], recs)


@pytest.mark.parametrize("how", ["rank by rank", "together", "scalar", "spans"])
def test_a_begin_reusing_an_id_starts_a_new_op_whichever_way_it_is_ingested(how, monkeypatch):
    taken = []
    for name in ("_fresh_begins", "_live_begins", "_together_begins", "_record_begins"):
        original = getattr(TraceModel, name)

        def spy(self, *args, _original=original, _name=name, **kwargs):
            taken.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(TraceModel, name, spy)
    m = TraceModel()
    m.batch_ranks = how != "rank by rank"
    spans = how == "spans"
    _ingest(m, _first(), spans)
    _ingest(m, _second(1 if how == "scalar" else 0), spans)
    _ingest(m, _third(), spans)
    expected = {"rank by rank": {"_record_begins"}, "together": {"_fresh_begins", "_together_begins"},
                "scalar": {"_fresh_begins", "_live_begins"}, "spans": {"_fresh_begins", "_together_begins"}}[how]
    assert expected <= set(taken)
    assert m.reused == {1: 1, 2: 1, 3: 1} and m.read_losses == {}
    assert {r: m.ranks[r].n for r in range(4)} == {0: 5, 1: 6, 2: 5, 3: 6}
    assert m.ranks[1].id[:6].tolist() == [1, 2, 3, 4, 5, 5] and m.ranks[3].id[:6].tolist() == [1, 2, 3, 4, 4, 6]
    # rank 2: op 2 first named an op begun and ended; now it names the one begun after, open
    assert m.op_index(2, 2) == 3 and m.ranks[2].comp[1] > 0 and m.ranks[2].comp[3] == 0
    assert m.ranks[2].begin[1] == _first()[2].ts[2]
    assert [m.op_index(r, 5) for r in (0, 1)] == [4, 5] and m.op_index(3, 4) == 4
    assert [int(m.table.top_id[m.ranks[r]._s]) for r in range(4)] == [5, 5, 4, 6]
    found = diagnose(m, now=T + 10**12, hang_after=1.0)
    assert "trace_incomplete" not in [f.kind for f in found]


def _pairs(m: TraceModel, rank: int) -> list[tuple[int, int, int]]:
    """(id, begin, completion) of a rank's ops."""
    rt = m.ranks[rank]
    return list(zip(rt.id[:rt.n].tolist(), rt.begin[:rt.n].tolist(), rt.comp[:rt.n].tolist(), strict=True))


@pytest.mark.parametrize("cut", [None, 1, 2, 3, 4])
def test_phases_go_to_the_latest_begin_of_their_id_before_them_however_the_stream_is_cut(cut):
    """Op 1 begun and ended, begun again and ended again, begun a third time and left open:
    the same model whether the stream comes in one batch or two (cut after row ``cut``), and
    a phase of a later batch goes to the latest op."""
    rows = [(PH_BEGIN, 1, 0), (PH_END, 1, -1), (PH_BEGIN, 1, 0), (PH_END, 1, -1), (PH_BEGIN, 1, 0)]
    whole = _records(0, rows)
    m = TraceModel()
    if cut is None:
        m.ingest([], [whole])
    else:
        m.ingest([], [whole.take(np.arange(cut))])
        m.ingest([], [whole.take(np.arange(cut, len(rows)))])
    ts = whole.ts.tolist()
    assert _pairs(m, 0) == [(1, ts[0], ts[1]), (1, ts[2], ts[3]), (1, ts[4], 0)]
    assert m.reused == {0: 2} and m.op_index(0, 1) == 2
    m.ingest([], [_records(0, [(PH_END, 1, -1)])])
    assert m.ranks[0].comp[2] > 0 and m.ranks[0].comp[1] == ts[3]


@pytest.mark.parametrize("seed", range(8))
def test_a_batch_pairs_as_the_stream_event_by_event_does(seed):
    """Random streams of two ranks whose ids repeat, with nested ops naming a parent (ends,
    and parents, of ops begun in an earlier batch too): ingested in batches of random
    sizes, as records (rank 0's split in two records now and then) and as event dicts, each
    leaves what ingesting them one event at a time leaves."""
    rng = np.random.default_rng(seed)
    streams = {}
    for r in (0, 1):
        rows, open_ids = [], []
        for _ in range(60):
            if open_ids and rng.random() < 0.5:
                rows.append((PH_END, open_ids.pop(int(rng.integers(len(open_ids)))), -1))
            else:
                op_id = int(rng.integers(1, 6))
                parent = open_ids[-1] if open_ids and rng.random() < 0.3 else -1
                rows.append((PH_BEGIN, op_id, 0, parent))
                open_ids.append(op_id)
        streams[r] = _records(r, rows)

    def model(cuts: list[int], dicts: bool, split: bool) -> TraceModel:
        m = TraceModel()
        for a, b in zip([0, *cuts], [*cuts, 60], strict=True):
            parts = [streams[r].take(np.arange(a, b)) for r in (0, 1)]
            if split and b - a > 1:  # (two records of rank 0 in one batch, as two reads of its stream)
                mid = (a + b) // 2
                parts[:1] = [streams[0].take(np.arange(a, mid)), streams[0].take(np.arange(mid, b))]
            if dicts:
                m.ingest([e for p in parts for e in p.events()])
            else:
                m.ingest([], parts)
        return m

    one_by_one = model(list(range(1, 60)), False, False)
    expected = [(_pairs(one_by_one, r), one_by_one.ranks[r].parent[:one_by_one.ranks[r].n].tolist()) for r in (0, 1)]
    assert one_by_one.reused and any(p >= 0 for _, parents in expected for p in parents)
    for dicts in (False, True):
        cuts = sorted({int(c) for c in rng.integers(1, 60, 4)})
        for m in (model(cuts, dicts, False), model([], dicts, False), model(cuts, dicts, True)):
            assert [(_pairs(m, r), m.ranks[r].parent[:m.ranks[r].n].tolist()) for r in (0, 1)] == expected
            assert m.reused == one_by_one.reused and m.events == one_by_one.events == 120


def test_a_rank_twice_in_a_batch_with_an_id_in_both_records(monkeypatch):
    """Two streams of one rank in one batch, both beginning op 7: the second record's is a
    reuse, as a list of records and as a poll's columns."""
    for spans in (False, True):
        m = TraceModel()
        _ingest(m, [_records(0, [(PH_BEGIN, 1, 0)]), _records(1, [(PH_BEGIN, 1, 0)])], spans)
        _ingest(m, [_records(0, [(PH_BEGIN, 7, 0)]), _records(1, [(PH_BEGIN, 2, 0)]),
                    _records(0, [(PH_BEGIN, 7, 0), (PH_END, 7, -1)])], spans)
        assert m.reused == {0: 1} and m.ranks[0].id[:3].tolist() == [1, 7, 7]
        assert m.ranks[0].comp[1] == 0 and m.ranks[0].comp[2] > 0  # (the end after the second begin: its)


def test_an_ingest_that_fails_partway_leaves_every_rank_s_highest_id_right(monkeypatch):
    m = TraceModel()
    m.batch_ranks = False
    m.ingest([], [_records(0, [(PH_BEGIN, 1, 0)]), _records(1, [(PH_BEGIN, 1, 0)])])
    original = TraceModel._record_begins

    def failing(self, recs, *args, **kwargs):
        if recs.rank == 1:
            raise MemoryError("a batch too large")
        return original(self, recs, *args, **kwargs)

    monkeypatch.setattr(TraceModel, "_record_begins", failing)
    with pytest.raises(MemoryError):
        m.ingest([], [_records(0, [(PH_BEGIN, 2, 0), (PH_BEGIN, 3, 0)]), _records(1, [(PH_BEGIN, 2, 0)])])
    monkeypatch.setattr(TraceModel, "_record_begins", original)
    assert int(m.table.top_id[m.ranks[0]._s]) == 3
    m.ingest([], [_records(0, [(PH_BEGIN, 3, 0)])])
    assert m.reused == {0: 1} and m.ranks[0].id[:4].tolist() == [1, 2, 3, 3]


def test_event_dicts_reusing_an_id_are_paired_in_stream_order_too():
    """The dict path (JSON events a reader hands as dicts, ``from_events``): a reuse within
    a batch, one of an earlier batch's id, and one of an id the same batch's records began."""
    b = TraceBuilder(2)
    t = b.collective(b.t0 + S)
    b._ids[0] = 0
    b.sync(0, t + S, None, "all_reduce")  # id 1 again, seq 2: its peer never enters it
    m = TraceModel()
    m.ingest(b.events)
    assert m.reused == {0: 1} and m.ranks[0].n == 2 and m.ranks[0].comp[0] > 0 and m.ranks[0].comp[1] == 0
    assert m.op_index(0, 1) == 1
    later = dict(b.events[-1], ts=t + 3 * S, id=2)
    m.ingest([later, dict(later, ts=t + 4 * S), dict(later, phase="end", ts=t + 5 * S)])
    assert m.reused == {0: 2} and m.ranks[0].n == 4 and m.ranks[0].comp[2:4].tolist() == [0, t + 5 * S]
    m.ingest([dict(later, ts=t + 6 * S, id=9)], [_records(0, [(PH_BEGIN, 9, 0)])])
    assert m.reused == {0: 3} and m.ranks[0].n == 6 and m.read_losses == {}
    stats = ReadStats(corrupt_by_rank={1: 2})
    m.note_read_stats(stats)
    assert m.read_losses == {1: {"damaged": 2}} and m.reused == {0: 3}
    found = diagnose(m, now=t + 10 * S, hang_after=2.0)
    assert [(f.kind, f.culprits) for f in found if f.severity == "error"][:1] == [("missing_ranks", [1])]


def test_ids_that_do_not_rise_are_looked_up_not_taken_for_reuse():
    """Ids out of order (ops of two threads) or negative (a foreign trace) are looked up in
    the id map: none of them reused, none skipped."""
    m = TraceModel()
    m.ingest([], [_records(0, [(PH_BEGIN, 3, 0), (PH_BEGIN, 1, 0)]), _records(1, [(PH_BEGIN, 1, 0)])])
    m.ingest([], [_records(0, [(PH_BEGIN, 2, 0), (PH_BEGIN, 5, 0), (PH_BEGIN, 4, 0)]),
                  _records(1, [(PH_BEGIN, -4, 0), (PH_BEGIN, -4, 0), (PH_BEGIN, 2, 0)])])
    assert m.reused == {} and m.ranks[0].n == 5 and m.ranks[1].n == 4


def test_the_pure_parts():
    got = opids.begun([_records(0, [(PH_BEGIN, 4, 0), (PH_END, 4, -1), (PH_BEGIN, 5, 0)]),
                       _records(1, [(PH_END, 1, -1)]), _records(2, [(PH_BEGIN, 3, 0), (PH_BEGIN, 3, 0)])])
    assert got.ids.tolist() == [4, 5, 3, 3] and got.record.tolist() == [0, 0, 2, 2]
    once = np.ones(3, np.bool_)
    assert opids.suspects(got, np.array([3, -1, -1]), once).tolist() == [False, False, True]
    assert opids.suspects(got, np.array([4, -1, 2]), once).tolist() == [True, False, True]
    assert opids.suspects(got, np.array([3, -1, 2]), np.array([True, True, False])).tolist() == [False, False, True]
    assert opids.highest(got, 3).tolist() == [5, -1, 3]
    # begins at 0, 2, 5, 7 (ids 4, 4, 9, 4); phases at 1, 3, 4, 6, 8, 9 (ids 4, 4, 9, 9, 4, 5)
    k = opids.paired(np.array([0, 2, 5, 7]), np.array([4, 4, 9, 4]), np.array([1, 3, 4, 6, 8, 9]),
                     np.array([4, 4, 9, 9, 4, 5]))
    assert k.tolist() == [0, 1, -1, 2, 3, -1]
    seen = {7}
    bad = opids.repeated(np.array([1, 7, 2, 1, -3, -3]), np.array([False, False, True, False, False, False]), seen)
    assert bad.tolist() == [False, True, True, True, False, False] and seen == {1, 2, 7}


JOB = "job-1"


def _hung_with_a_reused_id() -> list[dict]:
    """Rank 0 enters all_reduce #2 under the id of its all_reduce #1 and hangs there; rank 1
    never enters it.  The end of #1 would close #2 were the id taken as it came."""
    b = TraceBuilder(2)
    t = b.collective(b.t0 + S)
    b._ids[0] = 0
    b.sync(0, t + S, None, "all_reduce")
    b.heartbeats(t, t + 8 * S)
    return b.sorted_events()


def _check(capsys, store: Path) -> tuple[int, dict]:
    capsys.readouterr()
    rc = cli(["check", str(store), "--json", "--hang-after", "2"])
    return rc, json.loads(capsys.readouterr().out)


def test_check_of_a_json_store_reusing_an_id_finds_the_hang(tmp_path, capsys):
    events = _hung_with_a_reused_id()
    for r in (0, 1):
        w = open_writer(str(tmp_path), JOB, r, job_meta={"world_size": 2})
        w.write([encode(e) for e in events if e["rank"] == r])
        w.close()
    rc, out = _check(capsys, tmp_path)
    _the_hang_is_found(rc, out)


def _the_hang_is_found(rc: int, out: dict) -> None:
    """Rank 1 never entered all_reduce #2: the finding, with no victim blamed, every op
    read (rank 0's two, rank 1's one: none lost to the reused id), and the reuse said."""
    assert rc == 1 and out["ops"] == 3 and out["skipped"]["invalid"] == 0
    assert [(f["kind"], f["severity"], f["seq"], f["culprits"]) for f in out["findings"]] == [
        ("missing_ranks", "error", 2, [1])]
    assert out["warnings"] == ["1 op begin(s) reused an op id their rank had begun, as a damaged or foreign trace "
                               "does (rank 0: 1): each phase was paired with the latest begin of its id before it"]


def test_check_of_a_native_store_reusing_an_id_finds_the_hang(tmp_path, capsys):
    """Native blocks: rank 0 begins op 1 (seq 1), ends it, begins op 1 again (seq 2) and
    hangs; rank 1 ends seq 1 and goes on beating."""
    t0 = T

    def meta(rank: int) -> dict:
        return {"type": "meta", "rank": rank, "ts": t0, "v": 3, "world_size": 2, "backend": "gloo",
                "recorder": "native", "names": ["all_reduce"], "host": "h", "hang_after": 2.0}

    def block(rank: int, recs: bytes, ts: int) -> bytes:
        return blocks.encode_block(recs, rank, ts, blocks.count_records(recs))

    def begin(op_id: int, ts: int, seq: int) -> bytes:
        return blocks.pack_begin(op_id, ts, name=0, site=0, seq=seq, ins=[(6, [4])], outs=[(6, [4])],
                                 in_bytes=16, out_bytes=16)

    table = blocks.pack_site(0, "train.py:3 in step") + blocks.pack_group(0, "0", "gloo", [0, 1])
    lines = {0: [table + begin(1, t0 + S, 1) + blocks.pack_end(1, t0 + 2 * S) + begin(1, t0 + 3 * S, 2)],
             1: [table + begin(1, t0 + S, 1) + blocks.pack_end(1, t0 + 2 * S)]}
    for r, recs in lines.items():
        w = open_writer(str(tmp_path), JOB, r, job_meta={"world_size": 2})
        beats = [encode({"type": "heartbeat", "rank": r, "ts": t0 + k * S, "v": 3, "inflight": int(r == 0)})
                 for k in range(4, 9)]
        w.write([encode(meta(r)), block(r, recs[0], t0 + 3 * S), *beats])
        w.close()
    rc, out = _check(capsys, tmp_path)
    _the_hang_is_found(rc, out)
