"""Op records in columns: what a reader hands the model for a stream's packed op records.

The native and Python recorders pack op phases as binary records in ``block`` events
(``commscope.blocks``).  Turning each into a dict, only for the model to pull the dict
apart into its numpy columns again, cost most of a read and most of its memory: a large
trace held one dict per event at once.  ``blocks.BlockDecoder`` decodes a stream's blocks
straight into an ``OpRecords``: one numpy column per field, one row per record, in stream
order, with what repeats from call to call (a begin's op, group, shapes, call site ...)
interned once per stream as a ``Static`` and referenced by index.  The model ingests the
columns as they are (``analysis.model.TraceModel.ingest``); a consumer that wants events
asks ``events()``, which gives exactly the op events the records stand for.

Torch-free and numpy only: a format, below the stores and the analysis.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from commscope import schema
from commscope.schema import SCHEMA_VERSION

#: Phase codes, in ``schema.PHASES`` order (the model's op columns use the same codes).
PHASES = schema.PHASES
PH_BEGIN, PH_END, PH_WAIT_BEGIN, PH_WAIT_END, PH_DONE = range(len(PHASES))
PHASE_CODE = {p: i for i, p in enumerate(PHASES)}


def completes(phase: str, *, failed: bool, is_async: bool, device: bool) -> bool:
    """Whether an op is done at this phase, as the model judges it (``TraceModel._complete``,
    vectorized): a sync op at its end, an async one at the end of its wait, one timed on the
    device when the device says so; an op that raised at the phase that raised.  (A ``done``
    of an op not timed on the device only bounds an end still to come.)"""
    if failed and phase in ("end", "wait_end"):
        return True
    if device:
        return phase == "done"
    return phase == ("wait_end" if is_async else "end")

#: Bits of ``OpRecords.flags``
F_APPROX = 1  # an end whose time is only a bound
F_GPU = 2  # ``gpu`` holds the device time a ``done`` measured
F_SOURCE = 4  # an end that resolved an any-source recv: ``peer`` and ``seq`` hold its source
F_UNISSUED = 8  # the end of an op the backend refused as it was called: it took no seq after all


class Static(NamedTuple):
    """What a begin record's repeating part decodes to: the op event's fields but ts, id,
    seq, parent and tid, decoded, validated and redacted once per distinct content."""

    fields: dict
    sk: int  # their signature key (``events.signature_key``)
    peer: int  # the global peer rank (-1: none)
    any_source_gid: int | None  # an any-source recv's group id: its peer comes with a SOURCE record
    keyed: bool = True  # the event carries ``sk`` (BEGIN/BEGIN_SIG records; RBEGIN fragments do not)


class Span(NamedTuple):
    """Where a stream's records lie in columns decoded for many streams at once
    (``blocks.decode_chunks``): rows ``start`` to ``start + len`` of ``whole``, the records
    of several streams back to back (its ``rank`` is -1).  The model takes a poll's columns
    from ``whole`` at once where its streams' records lie so, instead of gathering them
    stream by stream."""

    whole: OpRecords
    start: int


class Spans(NamedTuple):
    """A batch's op records when every one is a slice of one ``whole`` (a reader that
    decoded all of a poll's streams together, ``blocks.decode_chunks``): record ``k`` is
    rows ``start[k]`` to ``start[k + 1]`` of ``whole`` (none empty), of rank ``ranks[k]``.
    The model takes a poll of thousands of streams as these arrays, with no pass over the
    records (``TraceModel.ingest``)."""

    whole: OpRecords
    start: np.ndarray  # one more than the records
    ranks: np.ndarray

    def of(self, records: Sequence[OpRecords]) -> bool:
        """Whether these are ``records`` (their count, the first's and the last's place:
        what a reader hands over with them, checked in O(1))."""
        k = self.ranks.shape[0]
        if not k or len(records) != k:
            return False
        first, last = records[0].span, records[-1].span
        return (first is not None and last is not None and first.whole is self.whole and last.whole is self.whole
                and first.start == int(self.start[0]) and last.start == int(self.start[-2])
                and len(records[-1]) == int(self.start[-1] - self.start[-2]))


@dataclasses.dataclass(slots=True)
class OpRecords:
    """One stream's op records, a row each, in stream order (see the module docstring).

    Begins have ``static`` >= 0 (an index into ``statics``, the decoder's table, which only
    grows), ``seq`` (-1: none), ``parent`` (an op id, -1: none), ``tid`` and ``peer`` (the
    static's).  Other phases have ``static`` -1; an end of an any-source recv carries its
    source in ``peer``/``seq`` (``F_SOURCE``), a ``done`` its device time in ``gpu``
    (``F_GPU``).  Exception texts (redacted) are sparse: ``exc`` maps a row to its text.
    ``where`` (optional) says, per row, before which event of the stream's other events
    the record came, so ``merged`` can put events back in stream order.  ``span``
    (optional): the records are a slice of columns decoded for many streams (``Span``).
    """

    rank: int
    phase: np.ndarray  # int8, PH_*
    ts: np.ndarray  # int64
    id: np.ndarray  # int64
    static: np.ndarray  # int32
    seq: np.ndarray  # int64
    parent: np.ndarray  # int64
    tid: np.ndarray  # uint64
    peer: np.ndarray  # int32
    gpu: np.ndarray  # int64
    flags: np.ndarray  # uint8
    exc: dict[int, str]
    statics: Sequence[Static]
    where: np.ndarray | None = None
    span: Span | None = None

    def __len__(self) -> int:
        return int(self.phase.shape[0])

    def begins(self) -> np.ndarray:
        return np.flatnonzero(self.phase == PH_BEGIN)

    def events(self) -> list[dict]:
        """The op events these records stand for, as dicts (schema version SCHEMA_VERSION),
        exactly what a reader returned before records stayed in columns."""
        out: list[dict] = []
        rank, statics, exc = self.rank, self.statics, self.exc
        cols = zip(self.phase.tolist(), self.ts.tolist(), self.id.tolist(), self.static.tolist(), self.seq.tolist(),
                   self.parent.tolist(), self.tid.tolist(), self.peer.tolist(), self.gpu.tolist(),
                   self.flags.tolist(), strict=True)
        for row, (ph, ts, op_id, st, seq, parent, tid, peer, gpu, flags) in enumerate(cols):
            e: dict = {"type": "op", "ts": ts, "phase": PHASES[ph], "id": op_id}
            if ph == PH_BEGIN:
                s = statics[st]
                if seq >= 0:
                    e["seq"] = seq
                if parent >= 0:
                    e["parent"] = parent
                e.update(s.fields)
                e["tid"] = tid
                if s.keyed:
                    e["sk"] = s.sk
            else:
                if row in exc:
                    e["exc"] = exc[row]
                if flags & F_APPROX:
                    e["approx"] = True
                if flags & F_GPU:
                    e["gpu_ns"] = gpu
                if flags & F_SOURCE:
                    e["peer"] = peer
                    if seq >= 0:
                        e["seq"] = seq
                if flags & F_UNISSUED:
                    e["unissued"] = True
            e["v"] = SCHEMA_VERSION
            e["rank"] = rank
            out.append(e)
        return out

    def rows_of(self, rank: int, a: int, b: int) -> OpRecords:
        """Rows ``a`` to ``b`` of several streams' records (this), as ``rank``'s own: views
        of these columns, with their ``span`` (no exception texts: ``Unpacked`` gives them)."""
        return OpRecords(rank, self.phase[a:b], self.ts[a:b], self.id[a:b], self.static[a:b], self.seq[a:b],
                         self.parent[a:b], self.tid[a:b], self.peer[a:b], self.gpu[a:b], self.flags[a:b], {},
                         self.statics, None, Span(self, a))

    def take(self, rows: np.ndarray) -> OpRecords:
        """The records at ``rows`` (sorted), as a batch of their own."""
        exc = {}
        if self.exc:
            at = {int(r): k for k, r in enumerate(rows.tolist())}
            exc = {at[r]: t for r, t in self.exc.items() if r in at}
        return OpRecords(self.rank, self.phase[rows], self.ts[rows], self.id[rows], self.static[rows], self.seq[rows],
                         self.parent[rows], self.tid[rows], self.peer[rows], self.gpu[rows], self.flags[rows], exc,
                         self.statics, None if self.where is None else self.where[rows])


def concat(parts: list[OpRecords]) -> OpRecords:
    """One batch of several of one stream (in order; they share the decoder's statics)."""
    if len(parts) == 1:
        return parts[0]
    exc: dict[int, str] = {}
    base = 0
    for p in parts:
        for r, t in p.exc.items():
            exc[base + r] = t
        base += len(p)
    where = None if any(p.where is None for p in parts) else np.concatenate([p.where for p in parts])
    cat = np.concatenate
    return OpRecords(parts[0].rank, cat([p.phase for p in parts]), cat([p.ts for p in parts]),
                     cat([p.id for p in parts]), cat([p.static for p in parts]), cat([p.seq for p in parts]),
                     cat([p.parent for p in parts]), cat([p.tid for p in parts]), cat([p.peer for p in parts]),
                     cat([p.gpu for p in parts]), cat([p.flags for p in parts]), exc, parts[-1].statics, where)


#: ``OpRecords``' columns, in its fields' order (each a row per record)
_COLUMNS = tuple(f.name for f in dataclasses.fields(OpRecords) if f.type == "np.ndarray")


def packed(records: Sequence[OpRecords]) -> Spans | None:
    """Several streams' records copied into one set of columns, back to back, as ``Spans``
    (``Unpacked`` gives them back): what a worker of a whole read hands over in one piece,
    ten arrays instead of ten a stream (pickling a read of 16k streams spent more on the
    arrays' count than on their bytes).  None where that cannot say them: none, an empty
    one, one with ``where``, or decoders that do not share one table of statics."""
    if not records or any(not len(r) or r.where is not None or r.statics is not records[0].statics
                          for r in records):
        return None
    exc: dict[int, str] = {}
    start = np.zeros(len(records) + 1, np.int64)
    for k, r in enumerate(records):
        exc.update((int(start[k]) + row, text) for row, text in r.exc.items())
        start[k + 1] = start[k] + len(r)
    cat = np.concatenate
    cols = [cat([getattr(r, name) for r in records]) for name in _COLUMNS]
    whole = OpRecords(-1, *cols, exc, records[0].statics)
    return Spans(whole, start, np.fromiter((r.rank for r in records), np.int64, len(records)))


class Unpacked(Sequence[OpRecords]):
    """The streams' records of ``packed``, each a view of its rows (``OpRecords.rows_of``)
    with its own exception texts, made when first asked: the model takes a poll's
    ``Spans`` as arrays and asks for few of its records (a new rank's, an irregular one),
    and making every stream's views (~6 us a stream: 16k of them a poll) was most of what a
    console spent taking a batch from its read process."""

    __slots__ = ("spans", "_made", "_exc")

    def __init__(self, spans: Spans) -> None:
        self.spans = spans
        self._made: list[OpRecords | None] = [None] * spans.ranks.shape[0]
        self._exc = sorted(spans.whole.exc)

    def __len__(self) -> int:
        return len(self._made)

    def __getitem__(self, k: int) -> OpRecords:  # type: ignore[override]  # (an index, not a slice)
        got = self._made[k]
        if got is None:
            k = range(len(self._made))[k]  # (a negative index counted from the end; out of range: IndexError)
            sp = self.spans
            a, b = int(sp.start[k]), int(sp.start[k + 1])
            got = self._made[k] = sp.whole.rows_of(int(sp.ranks[k]), a, b)
            if self._exc:
                rows = self._exc[bisect.bisect_left(self._exc, a):bisect.bisect_left(self._exc, b)]
                got.exc = {row - a: sp.whole.exc[row] for row in rows}
        return got


def merged(events: list[dict], ops: OpRecords | None) -> list[dict]:
    """``events`` with the records' events put back where they came in the stream
    (``OpRecords.where``); without positions, after them."""
    if ops is None or not len(ops):
        return events
    expanded = ops.events()
    if ops.where is None:
        return events + expanded
    out: list[dict] = []
    at = 0
    for where, e in zip(ops.where.tolist(), expanded, strict=True):
        if where > at:
            out.extend(events[at:where])
            at = where
        out.append(e)
    out.extend(events[at:])
    return out
