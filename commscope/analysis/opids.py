"""Op ids a rank uses twice: where a begin reuses one, its stream is taken in stream order.

The model pairs an op's phases with its begin by the op's id, so a rank's ids should be
unique (the recorder numbers a rank's ops from ``(incarnation << 40) + 1`` on).  A batch
takes its begins before its phases, which is exact only then: in a damaged or foreign
trace that reused an id, the end of the op the id first named closed the op it named next
(a hang vanished and ``check`` exited 0), and what the model held depended on how a reader
cut the stream into batches.  So where a begin reuses an id its rank has begun before, in
the model or earlier in the batch, that rank's phases of the batch are paired in stream
order (``paired``, ``TraceModel._ingest_cut``): each goes to the latest begin of its id
before it, as a reader of the stream event by event would pair them, and a later batch's
to the latest of all.  Such begins are counted per rank (``TraceModel.reused``) and
``check`` says so in a warning.

Most batches are cleared by comparisons alone, for all records at once: a record whose
begins' ids rise, the first above the highest its rank had begun (``top``), reuses none.
Only the others are looked up in the rank's id map.  Pure functions, numpy only.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter
from typing import NamedTuple

import numpy as np

from commscope.oprecords import PH_BEGIN, OpRecords, Spans

#: ``top`` of a rank that has begun no op with a non-negative id
NONE = -1

_PHASE = attrgetter("phase")
_ID = attrgetter("id")


class Begun(NamedTuple):
    """The ids of a batch's begins, record after record, and the record of each."""

    ids: np.ndarray  # int64
    record: np.ndarray  # ascending


def begun(records: Sequence[OpRecords], spans: Spans | None = None) -> Begun:
    """The begins of ``records`` (``spans``: the same records as slices of one set of
    columns, a reader's poll, taken with no step per record)."""
    if spans is not None:
        w, a, b = spans.whole, int(spans.start[0]), int(spans.start[-1])
        at = np.flatnonzero(w.phase[a:b] == PH_BEGIN)
        return Begun(w.id[a:b][at], np.searchsorted(spans.start, at + a, side="right") - 1)
    if not records:
        return Begun(np.zeros(0, np.int64), np.zeros(0, np.int64))
    sizes = np.fromiter(map(len, map(_PHASE, records)), np.int64, len(records))
    at = np.flatnonzero(np.concatenate(list(map(_PHASE, records))) == PH_BEGIN)
    ids = np.concatenate(list(map(_ID, records)))[at]
    return Begun(ids, np.searchsorted(np.cumsum(sizes), at, side="right"))


def suspects(got: Begun, top: np.ndarray, once: np.ndarray) -> np.ndarray:
    """Per record, whether it may reuse an id (then ``repeated`` looks): its begins' ids do
    not rise from above ``top`` (its rank's highest, ``NONE``: none), one is negative, or
    its rank has another record in the batch (``once`` false: ``top`` does not know the
    ids of the others)."""
    ids, rec = got.ids, got.record
    odd = ~once
    if not ids.shape[0]:
        return odd
    prev = np.empty_like(ids)
    prev[0] = top[rec[0]]
    prev[1:] = ids[:-1]
    first = np.flatnonzero(rec[1:] != rec[:-1]) + 1
    prev[first] = top[rec[first]]
    bad = (ids <= prev) | (ids < 0)
    if bad.any():
        odd = odd.copy()
        odd[rec[bad]] = True
    return odd


def highest(got: Begun, records: int) -> np.ndarray:
    """Per record, the highest non-negative id it begins (``NONE``: none)."""
    out = np.full(records, NONE, np.int64)
    ids, rec = got.ids, got.record
    if ids.shape[0]:
        at = np.flatnonzero(np.r_[True, rec[1:] != rec[:-1]])
        out[rec[at]] = np.maximum.reduceat(np.maximum(ids, NONE), at)
    return out


def repeated(ids: np.ndarray, known: np.ndarray, seen: set[int]) -> np.ndarray:
    """Which of a rank's begins (``ids``, in stream order) reuse an id: one the rank has
    (``known``, looked up in its id map), one of ``seen`` (its earlier records' in the
    batch), or one an earlier begin here has.  Adds the ids to ``seen``.  Negative ids are
    never taken for reused (no reader makes one: the schema and the block decoder keep ids
    in [0, 2**62); a caller's own are paired as they come)."""
    bad = known.copy()
    if seen:
        bad |= np.isin(ids, np.fromiter(seen, np.int64, len(seen)))
    _, first = np.unique(ids, return_index=True)
    again = np.ones(ids.shape[0], np.bool_)
    again[first] = False
    bad |= again
    bad &= ids >= 0
    seen.update(ids[ids >= 0].tolist())
    return bad


def paired(begin_at: np.ndarray, begin_ids: np.ndarray, phase_at: np.ndarray, phase_ids: np.ndarray) -> np.ndarray:
    """For each phase (at ``phase_at`` of a rank's stream, id ``phase_ids``), the latest
    begin of its id before it among the begins at ``begin_at`` (ascending, ids
    ``begin_ids``): that begin's index there, -1 where there is none.  One sort, whatever
    how often the ids repeat."""
    out = np.full(phase_at.shape[0], -1, np.int64)
    if not begin_at.shape[0] or not phase_at.shape[0]:
        return out
    uniq, group = np.unique(begin_ids, return_inverse=True)
    pg = np.minimum(np.searchsorted(uniq, phase_ids), uniq.shape[0] - 1)
    known = uniq[pg] == phase_ids
    span = int(max(int(begin_at.max()), int(phase_at.max()))) + 1
    key = group.reshape(-1).astype(np.int64) * span + begin_at
    order = np.argsort(key, kind="stable")
    keys = key[order]
    j = np.searchsorted(keys, pg.astype(np.int64) * span + phase_at) - 1  # (a begin and a phase never share a place)
    at = np.maximum(j, 0)
    ok = known & (j >= 0) & (keys[at] // span == pg)
    out[ok] = order[at[ok]]
    return out
