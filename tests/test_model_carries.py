"""A window's first batch of a stream: its carry (JSON op events older than the records after
them) taken before its rank's records, as the stream has them (``model._apart_early``), and
nothing else taken out of its place (from a review's cases: /tmp/review68b)."""

from __future__ import annotations

import numpy as np

from commscope.analysis.model import TraceModel
from commscope.oprecords import PH_BEGIN, PH_END, OpRecords, Static
from commscope.schema import SCHEMA_VERSION

T = 1_700_000_000_000_000_000
S = 1_000_000_000
STATICS = [Static({"type": "op", "phase": "begin", "op": "all_reduce", "group": "0", "in_shapes": [[4]],
                   "in_dtypes": ["float32"], "in_bytes": 16, "site": "train.py:4 in step"}, 11, -1, None)]


def records(rank: int, rows: list[tuple[int, int, int, int, int]]) -> OpRecords:
    """Op records of ``rank``: (phase, ts, id, static, seq) rows."""
    ph, ts, ids, st, seq = (list(c) for c in zip(*rows, strict=True))
    k = len(rows)
    return OpRecords(rank, np.array(ph, np.int8), np.array(ts, np.int64), np.array(ids, np.int64),
                     np.array(st, np.int32), np.array(seq, np.int64), np.full(k, -1, np.int64),
                     np.full(k, 7 + rank, np.uint64), np.full(k, -1, np.int32), np.zeros(k, np.int64),
                     np.zeros(k, np.uint8), {}, STATICS)


def event(rank: int, ts: int, typ: str, **kw: object) -> dict:
    return {"type": typ, "ts": ts, "rank": rank, "v": SCHEMA_VERSION, **kw}


def begin(rank: int, ts: int, op_id: int, seq: int) -> dict:
    return event(rank, ts, "op", phase="begin", id=op_id, op="all_reduce", group="0", in_shapes=[[4]],
                 in_dtypes=["float32"], in_bytes=16, site="train.py:4 in step", seq=seq, tid=7 + rank)


def test_a_carry_goes_before_its_ranks_records_and_the_trace_starts_at_it():
    """Rank 0's carry (its meta, an op in flight) and its records, beside two ranks of records
    alone: rank 0 stays in time order, and the trace starts at its meta (it started at the
    records' first begin: the fresh ranks' bounds overwrote the carry's)."""
    events = [event(0, T - 500, "meta", world_size=3), begin(0, T, 1, 1)]
    ops = [records(0, [(PH_BEGIN, T + 1000, 2, 0, 2), (PH_END, T + 1100, 2, -1, -1)])]
    for r in (1, 2):
        ops.append(records(r, [(PH_BEGIN, T + 200 + r, 1, 0, 1), (PH_BEGIN, T + 1000 + r, 2, 0, 2)]))
    m = TraceModel()
    m.ingest(events, ops)
    assert m.start_ns == T - 500 and m.bounds() == (T - 500, T + 1100)
    assert m.table.ordered[:m.table.size].all()
    rt = m.ranks[0]
    assert rt.n == 2 and rt.begin[:2].tolist() == [T, T + 1000]
    assert m.events == 2 + 2 + 4


def test_a_restarted_rank_ends_the_batch_with_its_new_incarnation_whatever_its_clock():
    """Two streams of one rank in one batch (incarnation 1 on a host whose clock is 5 s behind):
    the rank ends with incarnation 1's meta, as stream by stream, not with the older-looking
    one taken out of its place."""
    inc = 1 << 40
    e0 = [event(0, T + 1000, "meta", world_size=1, host="A", pid=1, inc=0, job="j", run="r"),
          event(0, T + 1200, "op", phase="done", id=1, gpu_ns=5)]
    r0 = records(0, [(PH_BEGIN, T + 1010, 1, 0, 1), (PH_END, T + 1100, 1, -1, -1)])
    e1 = [event(0, T + 1000 - 5 * S, "meta", world_size=1, host="B", pid=2, inc=1, job="j", run="r")]
    r1 = records(0, [(PH_BEGIN, T + 1000 - 5 * S + 20, inc + 1, 0, 1)])
    m = TraceModel()
    m.ingest(e0 + e1, [r0, r1])
    meta = m.ranks[0].meta
    assert (meta["host"], meta["pid"], meta["inc"]) == ("B", 2, 1)


def test_a_done_older_than_its_ops_begin_still_finds_it():
    """A ``done`` (the Python recorder's device time) of an op a record of the batch begins,
    its time a little before the begin (the wall clock stepped back): it finds its op."""
    m = TraceModel()
    m.ingest([event(0, T + 990, "op", phase="done", id=5, gpu_ns=777)],
             [records(0, [(PH_BEGIN, T + 1000, 5, 0, 1), (PH_END, T + 1500, 5, -1, -1)])])
    assert int(m.ranks[0].gpu[0]) == 777


def test_a_rank_that_holds_ops_takes_its_events_after_its_records():
    """An older JSON op beside the records of a rank the model holds already (a Flight
    Recorder op merged late) is no carry: the batch goes as it always did."""
    m = TraceModel()
    m.ingest([], [records(0, [(PH_BEGIN, T, 1, 0, 1), (PH_END, T + 10, 1, -1, -1)])])
    m.ingest([begin(0, T + 50, 3, 3)], [records(0, [(PH_BEGIN, T + 100, 2, 0, 2)])])
    rt = m.ranks[0]
    assert rt.begin[:rt.n].tolist() == [T, T + 100, T + 50]  # (in arrival order: records first)
    assert not m.table.ordered[rt._s]
