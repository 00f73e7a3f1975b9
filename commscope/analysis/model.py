"""TraceModel: one compact, incrementally updated in-memory model of a trace.

Three layers, three modules:

- ``columns``: ops stored per rank in numpy columns (begin/end/wait/done times, id, seq,
  peer, parent, signature code, flags), so a million ops take 90-130 MB and window
  queries are binary searches (``RankTrace``), and the one growth helper (``grown``);
- this module: ingest and interning.  Everything about an op that repeats from call to
  call (op name, group, call site, shapes, dtypes, reduce op, root, thread) is interned
  once as a ``Sig`` and referenced by an int32 code.  ``ingest`` costs time proportional
  to its batch: per cache-sized chunk, C-level passes that pull columns out of the event
  dicts, then vectorized column writes.  The queries the detectors and the console use;
- ``indexes``: cross-rank indexes (collectives by (group, seq), p2p by (group, src, dst,
  seq)), small int32 matrices per group or channel.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence, Set
from itertools import repeat
from operator import attrgetter, is_, itemgetter
from types import MappingProxyType
from typing import Any, NamedTuple, Protocol

import numpy as np

from commscope import histories, optable
from commscope.analysis import opids, runs
from commscope.analysis.columns import (
    I64_MAX,
    I64_MIN,
    RANK_SLOTS,
    RankColumns,
    RankTable,
    RankTrace,
    RankView,
    Samples,
    grown,
    no_samples,
)
from commscope.analysis.errors import classify
from commscope.analysis.indexes import GroupIndex, SeqIndex
from commscope.analysis.runs import Foreign, JobReference
from commscope.analysis.vocab import (  # noqa: F401  (re-exported: the model's names)
    APPROX,
    ASYNC,
    COLL,
    CONTAINER,
    DEVICE,
    DONE,
    EXC,
    FR,
    INFERRED,
    KILL_SIGNALS,
    NESTED,
    P2P,
    RECV,
    SEND,
    SNAPSHOT,
    SPACE_FR,
    SPACE_NATIVE,
    WAIT_EXC,
    RankState,
    describe_kill,
    is_kill,
    signal_label,
)
from commscope.beats import SAMPLE_FIELDS, Beats
from commscope.events import FR_OVERWRITE, Event, running_drops
from commscope.oprecords import (
    F_APPROX,
    F_GPU,
    F_SOURCE,
    F_UNISSUED,
    PH_BEGIN,
    PH_DONE,
    PH_END,
    PH_WAIT_BEGIN,
    PH_WAIT_END,
    PHASE_CODE,
    OpRecords,
    Spans,
    Static,
    Unpacked,
)


def untimed(flags: np.ndarray, begin: np.ndarray, comp: np.ndarray) -> np.ndarray:
    """Completed ops without a measured duration: Flight Recorder entries whose completion is
    only a bound (Gloo), and ends recorded at the begin's own timestamp (old traces, dur 0).
    Their latency and bandwidth are unknown: left out of statistics and straggler thresholds."""
    return (comp > 0) & (((flags & APPROX) != 0) | (comp <= begin))


#: Phase flags the together path applies itself (``TraceModel._together_phases``): an end
#: whose time is a bound, a device time (a GPU job's every op has one)
TOGETHER_FLAGS = F_APPROX | F_GPU


def _irregular_rows(phase: np.ndarray, flags: np.ndarray, parent: np.ndarray) -> np.ndarray:
    """The rows that make a live record not regular (``TraceModel._regular``): a phase with a
    flag the together path does not apply (an any-source recv's source), a begin with a parent."""
    return ((phase > PH_BEGIN) & ((flags & ~np.uint8(TOGETHER_FLAGS)) != 0)) | ((phase == PH_BEGIN) & (parent >= 0))


#: Kinds of the events other than ops, as ``_liveness`` sorts them
K_SAMPLE, K_HEARTBEAT, K_OTHER, K_SUMMARY = range(4)
_KIND = {"sample": K_SAMPLE, "heartbeat": K_HEARTBEAT, "summary": K_SUMMARY}
_RANK_OF = itemgetter("rank")
_TS_OF = itemgetter("ts")
DEFAULT_SAMPLE_INTERVAL = 1.0
#: characters kept of the reason a report of drops gave (a store's error: a few lines at most)
DROP_REASON_CHARS = 300
#: Events are ingested in chunks this long, so that the several column passes over a chunk's
#: dicts find them in cache (one pass over a cold dict costs ~100 ns, a warm one ~25 ns).
INGEST_CHUNK = 2048
#: A rank already begun whose records in a batch are at most this many is ingested with the
#: others like it (``TraceModel._live_begins``: a live poll brings a few records a rank, and
#: numpy's cost per call, not per row, was ~90 us a rank); more go together only where they
#: are plain (``TraceModel._plain``: the together path takes no step per row; the others take
#: a Python step per row), else rank by rank.  (A console behind a full-rate job reads ~50
#: records a rank a poll: rank by rank it cost ~5 times as much per event, and fell further behind.)
LIVE_ROWS = 32
#: Ops whose per-rank tensors must agree in shape across the group, and those whose tensors
#: carry no comparable dtype (``optable``).


def _ints(values: list) -> np.ndarray:
    """int64 column from event values; anything that is not an int becomes -1."""
    try:
        return np.array(values, np.int64)
    except (TypeError, ValueError, OverflowError):
        return np.array([v if isinstance(v, int) and -(1 << 62) < v < (1 << 62) else -1 for v in values], np.int64)


def _column(values: Iterator) -> np.ndarray:
    """int64 column of event values (see ``_ints``)."""
    return _ints(list(values))


def _split_by_rank(ranks: np.ndarray) -> list[tuple[int, np.ndarray | None]]:
    """(rank, positions of its events in batch order) per rank; None: the whole batch."""
    first = int(ranks[0])
    if bool((ranks == first).all()):
        return [(first, None)]
    small = int(ranks.min()) >= 0 and int(ranks.max()) < 1 << 16
    order = np.argsort(ranks.astype(np.uint16) if small else ranks, kind="stable")  # uint16: a radix sort
    sr = ranks[order]
    cuts = (np.flatnonzero(sr[1:] != sr[:-1]) + 1).tolist()
    return [(int(sr[a]), order[a:b]) for a, b in zip([0, *cuts], [*cuts, len(order)], strict=True)]


def _apart_early(events: list[Event], ops: Sequence[OpRecords], spans: Spans | None, held: Callable[[int], bool]
                 ) -> tuple[list[Event], list[Event]]:
    """(the rest, the early) of a batch's events: of each rank with JSON op events and op
    records in the batch and no ops held yet (``held``), the events at the head of its own
    (in their order) older than every record it begins in the batch, but for a phase of an op
    one of those records begins.  That is a window's first batch of a stream: its carry (the
    ops in flight and each group's last op, as JSON events, older than the records after
    them) and then its records.  A batch takes its records' begins before its events (a
    ``done`` event of the Python recorder refers to one), so a carry came after them, and
    every rank read from a window turned out of time order for good (its own sort buffers,
    and painted rank by rank: a heatmap of 16k ranks ~1.6 s a frame).  Its head is taken
    first, as the stream has it.  Not a rank that holds ops: a Flight Recorder op merged
    later is older than the records beside it, and is no carry."""
    if not events or not ops:
        return events, []
    ranks = {r for e in events if e.get("type") == "op" and not held(r := e["rank"])}
    if not ranks:
        return events, []
    first: dict[int, int] = {}  # rank -> its records' first begin in the batch
    begun: dict[int, list[np.ndarray]] = {}  # ... and the ids they begin
    if spans is not None and spans.of(ops):  # (a poll's records as arrays: no record made of them)
        w = spans.whole
        for k in np.flatnonzero(np.isin(spans.ranks, np.fromiter(ranks, np.int64, len(ranks)))).tolist():
            a, b = int(spans.start[k]), int(spans.start[k + 1])
            rows = np.flatnonzero(w.phase[a:b] == PH_BEGIN) + a
            if rows.shape[0]:
                r, t = int(spans.ranks[k]), int(w.ts[rows].min())
                first[r] = min(first.get(r, t), t)
                begun.setdefault(r, []).append(w.id[rows])
    else:
        for recs in ops:
            r = recs.rank
            if r in ranks:
                rows = recs.begins()
                if rows.shape[0]:
                    t = int(recs.ts[rows].min())
                    first[r] = min(first.get(r, t), t)
                    begun.setdefault(r, []).append(recs.id[rows])
    if not first:
        return events, []
    ids = {r: set(np.concatenate(v).tolist()) for r, v in begun.items()}
    rest, early = [], []
    over: set[int] = set()  # (ranks whose head is past)
    for e in events:
        r = e["rank"]
        f = first.get(r)
        if f is None:
            rest.append(e)
        elif r in over or e["ts"] >= f or (e.get("type") == "op" and e.get("phase") != "begin" and e.get("id") in ids[r]):
            over.add(r)
            rest.append(e)
        else:
            early.append(e)
    return rest, early


def _stream_of(meta: dict | None) -> tuple:
    """The job, run and incarnation a stream's meta names (what tells one run's group
    statements from another's: ``TraceModel._said_groups``)."""
    return (meta.get("job"), meta.get("run"), meta.get("inc", 0)) if meta else (None, None, 0)


def _runs(ufunc: np.ufunc, values: np.ndarray, run: np.ndarray, nruns: int, empty: int) -> np.ndarray:
    """``ufunc.reduce`` over each run of ``values`` (``run``: each value's run, ascending);
    ``empty`` for the runs with no value."""
    out = np.full(nruns, empty, np.int64)
    if values.shape[0]:
        at = np.flatnonzero(np.r_[True, run[1:] != run[:-1]])
        out[run[at]] = ufunc.reduceat(values, at)
    return out


def _positions(pos: np.ndarray | None, mask: np.ndarray) -> np.ndarray:
    return np.flatnonzero(mask) if pos is None else pos[mask]


def _aligned(ids: np.ndarray, start: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``RankTrace.align`` of ranks whose ops are all new, rank ``j``'s ids ``ids[start[j]:
    start[j + 1]]`` (one at least), all at once: each one's ``aligned_from`` (its last run of
    consecutive ids starts there) and ``idoff`` (int64, wrapping as ``align``'s)."""
    breaks = np.flatnonzero(np.diff(ids) != 1) + 1  # rows whose id does not follow the one before
    a, b = start[:-1], start[1:]
    at = np.searchsorted(breaks, b, side="left") - 1  # each rank's last break before its end
    last = breaks[np.maximum(at, 0)] if breaks.shape[0] else a
    j = np.where((at >= 0) & (last > a), last - a, 0)  # (a break at a rank's first row is the rank before's)
    return j, ids[a + j] - j


def _take(events: list[dict], positions: np.ndarray) -> Sequence[dict]:
    """events[positions] in one C call."""
    k = positions.shape[0]
    if k == len(events):
        return events  # positions are sorted and unique: all of them, in order
    if k == 1:
        return [events[int(positions[0])]]
    return itemgetter(*positions.tolist())(events)


class _Begins:
    """The begin rows of each record of a batch, found when first asked: those of the
    records a live batch ingests together are never asked (``_together_begins`` finds
    them in the records' concatenated columns, for all at once)."""

    __slots__ = ("_recs", "_rows")

    def __init__(self, recs_list: Sequence[OpRecords]) -> None:
        self._recs = recs_list
        self._rows: list[np.ndarray | None] = [None] * len(recs_list)

    def __getitem__(self, k: int) -> np.ndarray:
        b = self._rows[k]
        if b is None:
            b = self._rows[k] = self._recs[k].begins()
        return b


_RANK_OF_RECORDS = attrgetter("rank")
_PHASE_OF_RECORDS = attrgetter("phase")


class _Records(NamedTuple):
    """A batch's records described in arrays, a row each (a poll of thousands of streams is
    sorted out with no Python step per record where it can be)."""

    ranks: np.ndarray
    sizes: np.ndarray
    once: np.ndarray  # its rank comes once in the batch (a rank twice goes rank by rank)
    slot: np.ndarray  # its rank's slot in the model's table (-1: none)

    @classmethod
    def of(cls, recs_list: Sequence[OpRecords], table: RankTable, spans: Spans | None = None) -> _Records:
        """``spans``: the records as arrays already (a reader's poll)."""
        k = len(recs_list)
        if spans is not None:
            ranks, sizes = spans.ranks, np.diff(spans.start)
        else:
            ranks = np.fromiter(map(_RANK_OF_RECORDS, recs_list), np.int64, k)
            sizes = np.fromiter(map(len, map(_PHASE_OF_RECORDS, recs_list)), np.int64, k)
        if k and int(ranks.min()) >= 0 and int(ranks.max()) < 4 * k + (1 << 16):  # (a count per rank: small)
            once = np.bincount(ranks)[ranks] == 1
        else:
            _, at, counts = np.unique(ranks, return_inverse=True, return_counts=True)
            once = counts[at.reshape(-1)] == 1
        return cls(ranks, sizes, once, table.slots(ranks))


class PhaseExtra(NamedTuple):
    """What a phase says beyond its time (``TraceModel._phases``): the row among the
    phases, whether it is an ``end``, and what it carries (None: nothing)."""

    row: int
    end: bool
    exc: str | None
    approx: bool
    gpu: int | None
    peer: int | None  # an any-source recv's source, resolved at its end
    seq: int  # with it (-1: none)
    unissued: bool = False  # an end saying the backend refused the op: its begin's seq withdrawn


def _record_extras(recs: OpRecords, rows: np.ndarray) -> list[PhaseExtra]:
    """The ``PhaseExtra`` of op records' phases (``rows``): flagged ones and those with an
    exception text."""
    flags = recs.flags[rows]
    extra = np.flatnonzero(flags != 0).tolist()
    if recs.exc:
        at = {int(r): j for j, r in enumerate(rows.tolist())}
        extra = sorted(set(extra) | {at[r] for r in recs.exc if r in at})
    out = []
    for j in extra:
        row, f = int(rows[j]), int(flags[j])
        out.append(PhaseExtra(j, int(recs.phase[row]) == PH_END, recs.exc.get(row), bool(f & F_APPROX),
                              int(recs.gpu[row]) if f & F_GPU else None,
                              int(recs.peer[row]) if f & F_SOURCE else None, int(recs.seq[row]),
                              bool(f & F_UNISSUED)))
    return out


def _extras(phase_events: Sequence[dict]) -> list[PhaseExtra]:
    """The ``PhaseExtra`` of phase events with more keys than type, ts, rank, phase, id (and
    v): an exception, a peer, a device time ..."""
    k = len(phase_events)
    extra = np.fromiter(map(len, phase_events), np.int64, k) - np.fromiter(
        map(dict.__contains__, phase_events, repeat("v")), np.int64, k)
    out = []
    for j in np.flatnonzero(extra > 5).tolist():
        e = phase_events[j]
        seq = e.get("seq")
        out.append(PhaseExtra(j, e["phase"] == "end", str(e["exc"]) if "exc" in e else None, bool(e.get("approx")),
                              int(e["gpu_ns"]) if "gpu_ns" in e else None,
                              int(e["peer"]) if "peer" in e else None, int(seq) if isinstance(seq, int) else -1,
                              e.get("unissued") is True))
    return out


class _ChunkSamples(NamedTuple):
    """A chunk's sample events in columns, made once for all its ranks."""

    slot: np.ndarray  # chunk position -> row in ``cols`` (-1: not a sample)
    cols: dict[str, np.ndarray]

    @classmethod
    def of(cls, events: list[Event], kind: np.ndarray) -> _ChunkSamples | None:
        rows = np.flatnonzero(kind == K_SAMPLE)
        if not rows.shape[0]:
            return None
        slot = np.full(kind.shape[0], -1, np.int64)
        slot[rows] = np.arange(rows.shape[0])
        return cls(slot, Samples.columns_of(_take(events, rows)))


class _Fresh(NamedTuple):
    """Ranks new to the model ingested together (``TraceModel._fresh_begins``): their
    begins in one set of columns, rank after rank, of which each rank's are views."""

    pos: list[int]  # the records' positions in the batch
    ranks: list[int]
    start: np.ndarray  # each rank's first row in ``cols`` (and the total last)
    cols: dict[str, np.ndarray]
    views: list[np.ndarray]  # each rank's ``begin`` as adopted: still it, the rank is still in ``cols``
    lo: int
    hi: int


class _LiveRank(NamedTuple):
    """What one rank's phases in a live batch changed (``TraceModel._live_phase``), for the
    completions computed for all such ranks at once."""

    rt: RankTrace
    updated: list[int]  # op indices whose completion may have changed
    t0: int  # the phases' first and last timestamps
    t1: int
    first: int  # the earliest begin among the ops they name


class _Live(NamedTuple):
    """Records of ranks already begun, a few rows each (a live poll: ``TraceModel._live``),
    their columns concatenated once for all of them; record j's rows are [start[j],
    start[j + 1])."""

    pos: list[int]  # the records' positions in the batch
    start: list[int]
    cols: dict[str, np.ndarray]  # OpRecords' columns
    who: np.ndarray  # the record (j) of each begin row
    begun: np.ndarray  # the begin rows
    ranks: np.ndarray  # each record's rank
    exc: np.ndarray  # each record: whether it has exception texts
    phase: list[int]  # phase, ts, id and flags as lists, for the phases' scalar steps (``part``)
    ts: list[int]
    id: list[int]
    flags: list[int]

    COLUMNS = ("phase", "ts", "id", "static", "seq", "parent", "tid", "peer", "flags", "gpu")

    @classmethod
    def of(cls, recs_list: Sequence[OpRecords], pos: list[int], described: _Records,
           spans: Spans | None = None) -> _Live:
        """Without the lists (``part`` makes them for the records that need them).
        ``spans``: the batch's records as arrays (a reader's poll)."""
        every = len(pos) == len(recs_list)
        records = recs_list if every else [recs_list[k] for k in pos]
        start = [0, *np.cumsum(described.sizes[pos]).tolist()]
        exc: np.ndarray | None = None
        if spans is not None and every:  # (the records' columns are one slice of the poll's)
            a, b = int(spans.start[0]), int(spans.start[-1])
            cols: dict[str, np.ndarray] | None = {c: getattr(spans.whole, c)[a:b] for c in cls.COLUMNS}
            # (those of a poll decoded together have none; a piece a read process packed has
            # its streams' texts: taken as none, a console reading ahead lost every failure's
            # exception, and ranks that crashed of a dead rank's failure were its root: helper-193)
            exc = np.zeros(len(records), np.bool_)
            if spans.whole.exc:
                rows = np.fromiter(spans.whole.exc, np.int64, len(spans.whole.exc))
                rows = rows[(rows >= a) & (rows < b)]
                exc[np.searchsorted(spans.start, rows, side="right") - 1] = True
        else:
            cols = _spanned(records, start)
        if cols is None:
            cols = dict(zip(cls.COLUMNS, map(np.concatenate, zip(*map(_COLUMNS_OF_RECORDS, records), strict=True)),
                            strict=True))
        if exc is None:
            exc = np.fromiter(map(bool, map(_EXC_OF_RECORDS, records)), np.bool_, len(records))
        begun = np.flatnonzero(cols["phase"] == PH_BEGIN)
        who = np.searchsorted(np.array(start), begun, side="right") - 1
        return cls(pos, start, cols, who, begun, described.ranks[pos], exc, [], [], [], [])

    def part(self, js: np.ndarray, lists: bool) -> _Live:
        """The records ``js`` (ascending) alone; ``lists``: with the lists."""
        start = np.asarray(self.start)
        sizes = np.diff(start)
        keep = np.zeros(len(self.pos), np.bool_)
        keep[js] = True
        rows = np.repeat(keep, sizes)
        cols = {c: v[rows] for c, v in self.cols.items()}
        sub = [0, *np.cumsum(sizes[js]).tolist()]
        begun = np.flatnonzero(cols["phase"] == PH_BEGIN)
        who = np.searchsorted(np.array(sub), begun, side="right") - 1
        listed = [cols[c].tolist() for c in ("phase", "ts", "id", "flags")] if lists else [[], [], [], []]
        return _Live([self.pos[j] for j in js.tolist()], sub, cols, who, begun, self.ranks[js], self.exc[js], *listed)

    def counts(self) -> np.ndarray:
        """Begins per record."""
        return np.bincount(self.who, minlength=len(self.pos))


_COLUMNS_OF_RECORDS = attrgetter(*_Live.COLUMNS)
_EXC_OF_RECORDS = attrgetter("exc")
_SPAN_OF_RECORDS = attrgetter("span")
_WHOLE_OF_SPAN = attrgetter("whole")
_STATICS_OF_RECORDS = attrgetter("statics")


class _Every(Set[int]):
    """Every position of a batch's records, as a set that is not built (a poll of 10k
    streams all ingested together asks ``in`` of it, and its size)."""

    __slots__ = ("n",)

    def __init__(self, n: int) -> None:
        self.n = n

    def __contains__(self, k: object) -> bool:
        return isinstance(k, int) and 0 <= k < self.n

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.n))


def _every_or_set(pos: list[int], n: int) -> Set[int]:
    """Positions ``pos`` (distinct) as a set: ``_Every`` when they are all ``n``."""
    return _Every(n) if len(pos) == n else set(pos)


def _spanned(records: list[OpRecords], start: list[int]) -> dict[str, np.ndarray] | None:
    """The records' columns as slices of the one set of columns they lie in back to back
    (a reader that decoded their streams together: ``OpRecords.span``); None where they
    do not (gather them then)."""
    spans = list(map(_SPAN_OF_RECORDS, records))
    first = spans[0] if spans else None
    if first is None or None in spans:
        return None
    whole = first.whole
    if not all(map(is_, map(_WHOLE_OF_SPAN, spans), repeat(whole))):
        return None
    at = np.fromiter(map(itemgetter(1), spans), np.int64, len(spans))
    if not np.array_equal(at - first.start, start[:-1]):
        return None
    a, b = first.start, first.start + start[-1]
    return {c: getattr(whole, c)[a:b] for c in _Live.COLUMNS}


class _PairCodes:
    """The signature codes of (signature key, thread id) pairs in sorted arrays, so that a
    live batch of thousands of ranks, each its own thread, finds its begins' codes with a
    few numpy calls (``TraceModel._known_codes``), not a dict lookup per rank."""

    MULT = np.uint64(0x9E3779B97F4A7C15)

    def __init__(self) -> None:
        self.keys = np.zeros(0, np.uint64)
        self.sk = np.zeros(0, np.int64)
        self.tid = np.zeros(0, np.uint64)
        self.code = np.zeros(0, np.int32)
        self._new: list[tuple[int, int, int]] = []

    def add(self, sk: Any, tid: Any, code: int) -> None:
        if type(sk) is int and type(tid) is int and -(1 << 63) <= sk < 1 << 63 and 0 <= tid < 1 << 64:
            self._new.append((sk, tid, code))

    def _key(self, sk: np.ndarray, tid: np.ndarray) -> np.ndarray:
        return (sk.astype(np.uint64) * self.MULT) ^ tid  # (wraps: a hash; a hit is checked)

    def find(self, sk: np.ndarray, tid: np.ndarray) -> np.ndarray | None:
        """The codes of the pairs, or None unless every one is known (the caller looks
        them up one by one then)."""
        at, hit = self._look(sk, tid)
        return self.code[at] if hit is not None and bool(hit.all()) else None

    def known(self, sk: np.ndarray, tid: np.ndarray) -> np.ndarray:
        """Whether each pair is held here (a pair not held may still be known to the model:
        one whose key is not an int64, ``add``)."""
        hit = self._look(sk, tid)[1]
        return hit if hit is not None else np.zeros(sk.shape[0], np.bool_)

    def _look(self, sk: np.ndarray, tid: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """Where each pair would be in the sorted arrays, and whether it is there (None: they
        are empty), the pairs added since merged in first."""
        if self._new:
            sk_new, tid_new, code_new = (np.array(c, t) for c, t in zip(zip(*self._new, strict=True),
                                                                        (np.int64, np.uint64, np.int32), strict=True))
            self._new = []
            keys = np.concatenate([self.keys, self._key(sk_new, tid_new)])
            order = np.argsort(keys, kind="stable")
            self.keys = keys[order]
            self.sk = np.concatenate([self.sk, sk_new])[order]
            self.tid = np.concatenate([self.tid, tid_new])[order]
            self.code = np.concatenate([self.code, code_new])[order]
        if not self.keys.shape[0]:
            return np.zeros(sk.shape[0], np.int64), None
        key = self._key(sk, tid)
        at = np.minimum(np.searchsorted(self.keys, key), self.keys.shape[0] - 1)
        return at, (self.keys[at] == key) & (self.sk[at] == sk) & (self.tid[at] == tid)


class _FreshPhases(NamedTuple):
    """The phases of the ranks a batch ingested together (``TraceModel._fresh_phases``), in
    one set of arrays: part ``n`` (a rank's record with phases) is rows ``bounds[n]:
    bounds[n + 1]``."""

    part_of: dict[int, int]  # record position -> its part
    js: np.ndarray  # each part's rank's place in ``_Fresh``
    bounds: np.ndarray
    rows: np.ndarray  # each phase's row in its record
    idx: np.ndarray  # the op index each names (-1: none)
    ts: np.ndarray
    phase: np.ndarray
    extras: set[int]  # the record positions with a phase that says more than its time


#: The call site of an op issued from C++ with no Python caller.
CPP_CALLER = "C++ (DDP reducer or another C++ caller)"


@dataclasses.dataclass(slots=True)
class Sig:
    """Everything about an op that is shared by its repeated calls."""

    code: int
    op: str
    group: str
    site: str | None
    redop: str | None
    root: int | None
    is_async: bool
    nested: bool
    src: str | None
    dir: str | None
    tid: int | None
    in_shapes: tuple
    in_dtypes: tuple
    in_bytes: int
    out_shapes: tuple
    out_dtypes: tuple
    out_bytes: int
    tag: Any = None
    device: Any = None
    flags: int = 0
    space: int = SPACE_NATIVE
    match: int = 0  # interned key of what must agree across ranks at one (group, seq)

    def match_key(self) -> tuple:
        """What must agree across ranks at its (group, seq) (``histories.match_key``)."""
        return histories.match_key(self.op, self.in_shapes, self.out_shapes, self.in_dtypes, self.out_dtypes,
                                   self.redop, self.root)

    def where(self) -> str:
        """Its call site, or who issued it when no Python frame did: a collective the native
        hook saw issued from C++ (DDP's reducer, its start-up broadcasts) has no site."""
        if self.site:
            return self.site
        return CPP_CALLER if self.src == "c10d" else "unknown call site"

    def describe(self) -> dict:
        d = {"op": self.op, "group": self.group, "site": self.site, "in_shapes": [list(s) for s in self.in_shapes],
             "in_dtypes": list(self.in_dtypes), "in_bytes": self.in_bytes,
             "out_shapes": [list(s) for s in self.out_shapes], "out_dtypes": list(self.out_dtypes),
             "out_bytes": self.out_bytes}
        for k, v in (("redop", self.redop), ("root", self.root), ("async", self.is_async), ("nested", self.nested),
                     ("src", self.src), ("dir", self.dir), ("tid", self.tid), ("tag", self.tag),
                     ("device", self.device)):
            if v is not None and v is not False:
                d[k] = v
        return d


_SIG_KEYS = ("op", "group", "site", "redop", "root", "async", "nested", "src", "dir", "tid", "in_bytes",
             "out_bytes", "tag", "device")
_SIG_LISTS = ("in_shapes", "out_shapes", "in_dtypes", "out_dtypes")


class CarriedHistory(NamedTuple):
    """A rank's history of a group's collectives as a carry said it, and when."""

    history: histories.History
    ts: int


class Stated(NamedTuple):
    """What one ``group`` event of a rank stated of the group past its members: the p2p
    channels it passed (``p2p_passed``'s rows) and its carried history (``histories``)."""

    group: str
    rows: np.ndarray | None
    history: CarriedHistory | None


class ModelLike(Protocol):
    """What a ``TraceModel`` and its published ``ModelView`` both answer: the painters, the
    rank table and the queries that work on either are typed against this.  Anything else
    (exits, failures, cross-rank indexes, the rank-state judgements) needs the model."""

    @property
    def version(self) -> int: ...
    @property
    def lineage(self) -> int: ...
    @property
    def start_ns(self) -> int: ...
    @property
    def end_ns(self) -> int: ...
    @property
    def ranks(self) -> Mapping[int, RankColumns]: ...
    @property
    def sigs(self) -> Sequence[Sig]: ...

    def rank_ids(self) -> list[int]: ...

    def bounds(self) -> tuple[int, int]: ...

    def total_ops(self) -> int: ...

    def sig_flags(self, codes: np.ndarray) -> np.ndarray: ...

    def ops_in_window(self, rank: int, t0: int, t1: int) -> np.ndarray: ...

    def touched_since(self, version: int) -> int | None: ...


class ModelView(NamedTuple):
    """The model as published after an ingest batch (``TraceModel.view``): immutable, read
    without a lock while the next batch is ingested.  Holds what the console paints from:
    per-rank ``RankView``s, the signatures seen so far, and each rank's state at ``now``."""

    version: int
    start_ns: int
    end_ns: int
    ranks: dict[int, RankView]
    sigs: tuple[Sig, ...]
    flag_table: np.ndarray  # sig code -> Sig flags
    now: int
    states: dict[int, RankState]  # at ``now`` (``rankstate.rank_state``); empty if not asked
    #: ``TraceModel.foreign_streams`` as published: streams read but not the job's (the
    #: console's timeline draws them apart, last, as the rank table lists them)
    foreign: Mapping[int, Foreign] = MappingProxyType({})
    #: ``TraceModel.touched_since``'s log as published: (version, earliest begin changed) a batch
    touch_log: tuple[tuple[int, int], ...] = ()
    lineage: int = 0  # ``TraceModel.lineage`` (0: none)

    def rank_ids(self) -> list[int]:
        return sorted(self.ranks)

    def touched_since(self, version: int) -> int | None:
        """``TraceModel.touched_since`` as the model stood when published: a painter keeping
        what it counted over one view repaints only from there after the next."""
        return touched_since(self.touch_log, self.version, version)

    def bounds(self) -> tuple[int, int]:
        return self.start_ns, self.end_ns

    def own_bounds(self) -> tuple[int, int]:
        """``TraceModel.own_bounds`` of the view: the job's own ranks' (first, last) timestamp."""
        if not self.foreign:
            return self.start_ns, self.end_ns
        own = [rv for r, rv in self.ranks.items() if r not in self.foreign and rv.last_ts]
        return (min(rv.first_ts for rv in own), max(rv.last_ts for rv in own)) if own else (0, 0)

    def trace_end(self) -> int:
        """``TraceModel.trace_end`` of the view (read without the model's lock)."""
        return self.own_bounds()[1] or self.end_ns

    def total_ops(self) -> int:
        return sum(rv.n for rv in self.ranks.values())

    def sig_flags(self, codes: np.ndarray) -> np.ndarray:
        return self.flag_table[codes]

    def ops_in_window(self, rank: int, t0: int, t1: int) -> np.ndarray:
        rv = self.ranks.get(rank)
        return rv.window(t0, t1) if rv else np.zeros(0, np.int64)


#: The ranks ``TraceModel.op_rate`` asks at most (a median of a thousand is the job's rate; a
#: step a rank for 16k of them, ~80 ms at every restart at the tail, is not needed)
RATE_SAMPLE = 1024
#: ``TraceModel.lineage``s: a console that swaps in a new model (a restart at the tail) has
#: versions counted again from the start
_LINEAGES = itertools.count(1)


def touched_since(log: Sequence[tuple[int, int]], current: int, version: int) -> int | None:
    """``TraceModel.touched_since`` by its log of (version, earliest begin changed) a batch,
    oldest first, at version ``current``."""
    if version >= current:
        return I64_MAX
    if not log or log[0][0] > version + 1:
        return None
    low = min((first for v, first in log if v > version), default=I64_MAX)
    return None if low == I64_MIN else low


EMPTY_VIEW = ModelView(0, 0, 0, {}, (), np.zeros(0, np.int32), 0, {})


#: A group's members as a rank stated them, in little: their count, first, last, and a hash
#: of them all where they are few enough to hash at every rank's statement
MembersPrint = tuple[int, int, int, int]
#: Groups past this many members are told apart by count, first and last alone: 16,384 ranks
#: each hashing a world of 16,384 would cost seconds of load (subgroups made in different
#: orders are the tp and dp groups, well under it)
HASHED_MEMBERS = 1024


def members_print(granks: list) -> MembersPrint:
    """``MembersPrint`` of a ``group`` event's members: statements that differ in a middle
    member only ({0,1,3} against {0,2,3}) were the same (helper-192)."""
    whole = hash(tuple(granks)) if len(granks) <= HASHED_MEMBERS else 0
    return len(granks), int(granks[0]), int(granks[-1]), whole


class TraceModel:
    """The whole trace; see the module docstring.  Build with ``ingest`` (repeatedly)."""

    #: Ingest the records of ranks new to the model together (``_fresh_begins``); the rank
    #: by rank path leaves the same model (tests compare the two)
    batch_ranks = True
    #: Ranks already begun with at most this many records in a batch go together
    #: (``_live_begins``); 0: rank by rank (``bench large`` compares the two)
    live_rows = LIVE_ROWS
    #: Batches ``touched_since`` remembers (a console asks about the few since its last diagnosis)
    TOUCHES = 256

    def __init__(self) -> None:
        self.ranks: dict[int, RankTrace] = {}
        #: every rank's scalars in arrays, and the blocks holding its op columns
        self.table = RankTable()
        self.sigs: list[Sig] = []
        self._sig_cache: dict[tuple, list] = {}
        self._sig_by_sk: dict[tuple, int] = {}  # (sk, tid) -> sig code, see events.signature_key
        self._pairs = _PairCodes()  # the same, in arrays
        self._statics_sk: tuple[object, np.ndarray] = ((), np.zeros(0, np.int64))  # a decoder table's keys
        self._sig_flags = np.zeros(256, np.int32)
        self._sig_match = np.zeros(256, np.int32)
        self._unnamed: list[int] = []  # sig codes of ops whose names their streams could not say
        self._sig_gkey = np.zeros(256, np.int32)  # sig code -> index of its (space, group) in _gkeys
        self._gkeys: dict[tuple[int, str], int] = {}
        self._match_codes: dict[tuple, int] = {}
        self._match_hashes: list[int] = []  # match code -> ``histories.key_hash`` of its key
        #: group -> rank -> the rank's history of the group's collectives before what was read,
        #: as its carry said it (``histories``; a window's, or a reader's after retention)
        self.histories: dict[str, dict[int, CarriedHistory]] = {}
        #: (group, rank) -> seq -> key hash of collectives whose end withdrew their number
        #: (``_unissue``): taken off a carried history that counted them (``_retract``)
        self.withdrawn: dict[tuple[str, int], dict[int, int]] = {}
        #: group -> rows [src, dst, side (0: send, 1: recv), the last seq that side completed]
        #: of p2p channels before what was read, where a carry kept no op of the channel
        #: (``inflight.Replayed.channels_passed``), as carries stated them
        self.p2p_passed: dict[str, list[np.ndarray]] = {}
        #: group -> (the parts of ``p2p_passed`` it was made of, its sorted keys, their highest seqs)
        self._passed_index: dict[str, tuple[int, np.ndarray, np.ndarray]] = {}
        self.groups: dict[str, list[int]] = {}  # name -> global ranks in group-rank order
        self.group_backend: dict[str, str] = {}
        self.coll: dict[tuple[int, str], GroupIndex] = {}  # (space, group) -> index
        self.p2p: dict[tuple[int, str, int, int], SeqIndex] = {}  # (space, group, src, dst) -> [send, recv]
        self.job: dict | None = None
        self.failed: list[tuple[int, int]] = []  # (rank, op index) of ops that raised, in arrival order
        #: Exit events ingested, of every rank (0: no rank has one, and none is looked for)
        self.exits_seen = 0
        self._metas_seen = 0  # meta events ingested: what ``hosts`` was made of
        self._hosts: tuple[int, dict[int, str]] = (-1, {})
        self.request_ns = 0  # latest cross-rank stack request seen (see record/hangsignal.py)
        self._exc_kinds: dict[tuple[int, int], Any] = {}
        self.events = 0  # (every stream's; per rank: ``events_of``, the job's own: ``own_events``)
        self._loose: dict[int, int] = {}  # rank -> events counted to no slot (``_tally``)
        #: What the reader skipped, per rank: {"damaged": lines, "invalid": events, "missing": entries}
        #: (see ``note_read_stats``); rank -1 is the job metadata.
        self.read_losses: dict[int, dict[str, int]] = {}
        #: Begins per rank that reused an op id the rank had begun (``opids``): a damaged or
        #: foreign trace, whose phases went to the latest begin of their id before them
        self.reused: dict[int, int] = {}
        self.start_ns = 0
        self.end_ns = 0
        self.version = 0
        #: This model among every one made in the process: what a version counts on
        self.lineage = next(_LINEAGES)
        self._said_world: tuple[int, int | None] = (-1, None)  # (version, ``said_world_size`` then)
        self._foreign: tuple[int, dict[int, Foreign]] = (-1, {})  # (metas seen, ``foreign_streams`` then)
        #: what the store's job metadata says of the run (``note_job``; None: nothing)
        self.reference: JobReference | None = None
        #: the ranks kept out of the matching: ``foreign_streams`` as the indexes were last made
        #: to agree with it (``_keep_apart``)
        self._apart: frozenset[int] = frozenset()
        #: rank -> what its group events stated (``Stated``) while it was kept apart, or when it
        #: was put apart: taken into ``p2p_passed`` and ``histories`` if it stops being foreign
        self._stated_apart: dict[int, list[Stated]] = {}
        #: group -> (job, run, incarnation) of a stream -> the members the first of its ranks to
        #: state the group said (``groups`` is the first statement of a stream kept in)
        self._said_groups: dict[str, dict[tuple, list[int]]] = {}
        #: group -> (job, run, incarnation) -> rank -> the members that rank stated, by their
        #: fingerprint (``members_print``: each rank's world of 16,384 members kept whole was
        #: 2 GiB, helper-190): ranks that disagree made their groups in different orders, or
        #: some skipped one (``collectives.find_group_disagreements``)
        self.group_views: dict[str, dict[tuple, dict[int, MembersPrint]]] = {}
        #: the (group, run)s whose ranks' fingerprints differ, and each fingerprint's members
        #: as its first rank stated them: the few ``find_group_disagreements`` looks at
        self.group_disputes: set[tuple[str, tuple]] = set()
        self.group_members_of: dict[tuple[str, tuple, MembersPrint], list[int]] = {}
        self._group_by: dict[str, tuple] = {}  # group -> whose statement ``groups`` holds
        self.changed: frozenset[int] = frozenset()
        #: (version, the earliest begin among the ops its batch changed; I64_MIN: not known) of
        #: the latest batches, every rank's at once (``touched_since``)
        self._touches: deque[tuple[int, int]] = deque(maxlen=self.TOUCHES)
        self._published: ModelView = EMPTY_VIEW
        #: ``rankstate``'s cache of its judgements for one version (the model stores; rankstate judges)
        self.judged: object = None

    # ------------------------------------------------------------------ building
    @classmethod
    def from_events(cls, events: Iterable[Event]) -> TraceModel:
        m = cls()
        m.ingest(list(events))
        return m

    def ingest(self, events: list[Event], ops: Sequence[OpRecords] = (), spans: Spans | None = None,
               beats: Beats | None = None) -> frozenset[int]:
        """Add a batch of events (any ranks, per-rank order preserved) and of op records in
        columns (``oprecords.OpRecords``, what a reader's ``poll_batch`` returns); returns
        the ranks changed.  ``spans``: the records as arrays, where the reader has them
        (``Batch.spans``: a poll of thousands of streams then takes no pass over them).
        ``beats``: streams' heartbeats and samples in columns (``Batch.beats``, a whole
        read's or a poll's), taken after the events, all streams at once (``_beats``).

        The per-event work is a few C-level ``map`` passes that pull whole columns
        (rank, phase, ts, id) out of the dicts at once; only begins whose signature is
        new, and the rare misc events, are looked at one by one in Python.  Op records are
        columns already: their begins are interned once per distinct signature.  The
        records' begins go first (a ``done`` event of the Python recorder refers to one),
        their other phases last.
        """
        if not events and not ops and beats is None:
            self.changed = frozenset()
            return self.changed
        try:
            try:
                return self._ingest(events, ops, spans, beats)
            finally:
                self.withdrawn.clear()  # (a carry read later was made after the end: its replay withdrew it)
        except BaseException:
            # (changed partway, by a bug or a lack of memory: no judgement kept for the version
            # before, ``rankstate._memo``, may stand for what the model holds now)
            self.version += 1
            self.changed = frozenset(self.ranks)
            self._touched(I64_MIN)
            self._recount_tops()
            raise

    def _holds_ops(self, rank: int) -> bool:
        rt = self.ranks.get(rank)
        return rt is not None and rt.n > 0

    def _ingest(self, events: list[Event], ops: Sequence[OpRecords], spans: Spans | None,
                beats: Beats | None) -> frozenset[int]:
        lo, hi, changed = I64_MAX, 0, set()
        events, early = _apart_early(events, ops, spans, self._holds_ops)
        if early:  # (a window's carries: in stream order, before their ranks' records)
            for r in sorted({*map(_RANK_OF, early)} - self.ranks.keys()):  # (no columns yet: the records' sized)
                self.ranks[r] = RankTrace(r, cap=0, table=self.table)
            for k in range(0, len(early), INGEST_CHUNK):
                a, b = self._ingest_chunk(early[k:k + INGEST_CHUNK], changed)
                lo, hi = min(lo, a), max(hi, b)
            self.events += len(early)
        recs_list = ops if isinstance(ops, list | Unpacked) else list(ops)  # (Unpacked: each made when asked)
        if spans is not None and not spans.of(recs_list):
            spans = None
        if spans is None and not all(map(len, map(_PHASE_OF_RECORDS, recs_list))):
            recs_list = [recs for recs in ops if recs.phase.shape[0]]
        described = _Records.of(recs_list, self.table, spans)
        recs_list, spans, described, tops, cut = self._cut_at_reuse(recs_list, spans, described)
        rows = _Begins(recs_list)
        fresh = self._fresh(recs_list, rows, described) if self.batch_ranks else []
        live_pos = self._live(recs_list, fresh, described) if self.batch_ranks else []
        live = _Live.of(recs_list, live_pos, described, spans) if live_pos else None
        # signatures interned in the records' order, whichever path ingests them: the live
        # ranks' looked up all at once unless one is new (a poll's new ones interned first)
        if live is not None and spans is not None:
            self._intern_new(spans)
        known = self._known_codes(recs_list, live, spans is not None) if live else None
        if live is not None and known is None:  # (the scalar way, a step per row: the long ones rank by rank)
            short = [k for k in live_pos if described.sizes[k] <= self.live_rows]
            if len(short) < len(live_pos):
                live_pos = short if len(short) > 1 else []
                live = _Live.of(recs_list, live_pos, described, spans) if live_pos else None
        n_recs = len(recs_list)
        skip = _every_or_set(live_pos, n_recs) if known is not None else set()
        codes = [None] * n_recs if len(skip) == n_recs else self._codes_known(recs_list, rows, skip, spans is not None) or [
            self._codes(recs.statics, recs.static[b], recs.tid[b]) if k not in skip and (b := rows[k]).shape[0]
            else None for k, recs in enumerate(recs_list)]
        together = _every_or_set(fresh + live_pos, n_recs)  # (disjoint)
        for k in np.flatnonzero(described.slot < 0).tolist():  # ranks made in the records' order, as rank by rank
            recs = recs_list[k]
            if recs.rank not in self.ranks and rows[k].shape[0]:
                self.ranks[recs.rank] = RankTrace(recs.rank, cap=0 if k in together else 256, table=self.table)
        regular, live, known = self._regular(live, known)
        if together and (len(together) < len(recs_list) or (fresh and (live or regular)) or (live and regular)):
            self._index_order(recs_list, rows, codes, known, live, regular)
        batch = None
        if fresh:
            batch = self._fresh_begins(recs_list, fresh, rows, codes, changed)
            lo, hi = min(lo, batch.lo), max(hi, batch.hi)
        if live:
            a, b = self._live_begins(recs_list, live, codes, known, changed)
            lo, hi = min(lo, a), max(hi, b)
        if regular:
            a, b = self._together_begins(regular, changed)
            lo, hi = min(lo, a), max(hi, b)
        for k, recs in enumerate(recs_list) if len(together) < len(recs_list) else ():
            if k not in together and rows[k].shape[0]:
                a, b = self._record_begins(recs, rows[k], codes[k], changed)
                lo, hi = min(lo, a), max(hi, b)
        for recs in cut:
            a, b = self._ingest_cut(recs, changed)
            lo, hi = min(lo, a), max(hi, b)
        if tops is not None:  # (before the events: a begin among them is checked against these)
            self._raise_tops(*tops)
        if beats is not None:  # (ranks made in rank order, as one chunk of their events makes them)
            for r in sorted({*beats.rank.tolist(), *map(_RANK_OF, events)} - self.ranks.keys()):
                self._rank(r)
        for k in range(0, len(events), INGEST_CHUNK):
            a, b = self._ingest_chunk(events[k:k + INGEST_CHUNK] if len(events) > INGEST_CHUNK else events, changed)
            lo, hi = min(lo, a), max(hi, b)
        if beats is not None:
            a, b = self._beats(beats, changed)
            lo, hi = min(lo, a), max(hi, b)
        a, b = self._batch_phases(recs_list, batch, live, changed,
                                  _every_or_set(regular[0].pos, n_recs) if regular else set())
        lo, hi = min(lo, a), max(hi, b)
        if regular:
            a, b = self._together_phases(regular[0], changed)
            lo, hi = min(lo, a), max(hi, b)
        if hi:
            self.start_ns = lo if not self.start_ns else min(self.start_ns, lo)
            self.end_ns = max(self.end_ns, hi)
        self.events += len(events) + int(described.sizes.sum()) + (beats.events() if beats is not None else 0) + sum(
            len(recs) for recs in cut)
        self._tally(described.ranks, described.sizes)  # (the events list's: ``_ingest_chunk``)
        if beats is not None:
            self._tally(beats.rank, beats.count)
        for recs in cut:
            self._tally(np.array([recs.rank], np.int64), np.array([len(recs)], np.int64))
        self.table.compact()  # (between batches: nothing holds a rank's columns now)
        self.version += 1
        self.changed = frozenset(changed)
        self._touched(self.table.touched_low)
        return self.changed

    def _cut_at_reuse(self, recs_list: Sequence[OpRecords], spans: Spans | None, described: _Records
                      ) -> tuple[Sequence[OpRecords], Spans | None, _Records, tuple[np.ndarray, np.ndarray] | None,
                                 list[OpRecords]]:
        """Set apart the records in which a begin reuses an op id its rank has begun
        (``opids``), for ``_ingest_cut``; the rest go the usual way, with (ranks, the
        highest id each record begins) for ``_raise_tops`` once their begins are in.  A
        batch that reuses none, all but a foreign or damaged trace's, is returned as it
        came."""
        got = opids.begun(recs_list, spans)
        if not got.ids.shape[0]:
            return recs_list, spans, described, None, []
        t = self.table
        slot = described.slot.copy()
        for k in np.flatnonzero(slot < 0).tolist():  # (ranks beyond the table's array of slots: their own)
            rt = self.ranks.get(int(described.ranks[k]))
            if rt is not None:
                slot[k] = rt._s
        at = np.maximum(slot, 0)
        top = np.where((slot >= 0) & (t.n[at] > 0), t.top_id[at], opids.NONE)
        tops = (described.ranks, opids.highest(got, len(recs_list)))
        odd = opids.suspects(got, top, described.once)
        if not odd.any():
            return recs_list, spans, described, tops, []
        cut: list[int] = []
        seen: dict[int, set[int]] = {}
        for k in np.flatnonzero(odd).tolist():
            recs = recs_list[k]
            rows = recs.begins()
            if not rows.shape[0]:
                continue
            ids = recs.id[rows]
            rt = self.ranks.get(recs.rank)
            known = rt.lookup(ids) >= 0 if rt is not None and rt.n else np.zeros(ids.shape[0], np.bool_)
            again = opids.repeated(ids, known, seen.setdefault(recs.rank, set()))
            if again.any():
                cut.append(k)
                self.reused[recs.rank] = self.reused.get(recs.rank, 0) + int(np.count_nonzero(again))
        if not cut:
            return recs_list, spans, described, tops, []
        # (a rank's other records of the batch too, in their order: its phases pair across them)
        cut = np.flatnonzero(np.isin(described.ranks, [recs_list[k].rank for k in cut])).tolist()
        keep = np.ones(len(recs_list), np.bool_)
        keep[cut] = False
        rest = [recs for k, recs in enumerate(recs_list) if keep[k]]
        return rest, None, _Records.of(rest, t), (tops[0][keep], tops[1][keep]), [recs_list[k] for k in cut]

    def _ingest_cut(self, recs: OpRecords, changed: set[int]) -> tuple[int, int]:
        """A record in which a begin reuses an op id, rank by rank, its phases paired in
        stream order: each with the latest begin of its id before it in the record, else
        with the rank's op of that id before the record (``opids.paired``; a batch takes
        its begins before its phases, and the end of the op an id first named closed the
        op it named next).  Returns the (first, last) timestamp."""
        rt = self._rank(recs.rank)
        begins = recs.begins()
        phases = np.flatnonzero(recs.phase > PH_BEGIN)
        idx = self._in_order(rt, begins, recs.id[begins], phases, recs.id[phases])
        lo, hi = I64_MAX, 0
        if begins.shape[0]:
            codes = self._codes(recs.statics, recs.static[begins], recs.tid[begins])
            lo, hi = self._record_begins(recs, begins, codes, changed, in_order=True)
            self._raise_top(rt, recs.id[begins])
        if phases.shape[0]:
            a, b, first = self._phases(rt, recs.ts[phases], recs.id[phases], recs.phase[phases],
                                       _record_extras(recs, phases), idx)
            self._seen(rt, a, b, first)
            changed.add(rt.rank)
            lo, hi = min(lo, a), max(hi, b)
        return lo, hi

    def _raise_tops(self, ranks: np.ndarray, top: np.ndarray) -> None:
        """Raise the ranks' highest op id begun to ``top`` (a record's each, once its begins
        are in the model: ``_cut_at_reuse``)."""
        some = top > opids.NONE
        if not some.any():
            return
        ranks, top = ranks[some], top[some]
        slot = self.table.slots(ranks)
        for k in np.flatnonzero(slot < 0).tolist():
            slot[k] = self.ranks[int(ranks[k])]._s
        np.maximum.at(self.table.top_id, slot, top)

    @staticmethod
    def _in_order(rt: RankTrace, at: np.ndarray, ids: np.ndarray, where: np.ndarray, named: np.ndarray) -> np.ndarray:
        """The op each of a rank's events at ``where`` in its stream names by id (``named``),
        as the stream put them: the latest of the begins about to be appended (at ``at``,
        ids ``ids``) of that id before it, else the rank's op of that id before them
        (``opids.paired``); -1 where none.  Asked before the begins are in."""
        k = opids.paired(at, ids, where, named)
        before = rt.lookup(named) if rt.n else np.full(k.shape[0], -1, np.int32)
        return np.where(k >= 0, rt.n + k, before).astype(np.int32)

    def _parents_in_order(self, rt: RankTrace, at: np.ndarray, ids: np.ndarray, parents: np.ndarray
                          ) -> np.ndarray | None:
        """The op each begin's parent names (``parents``: ids, -1: none), in stream order
        (``_in_order``); None where no begin has a parent."""
        has = parents >= 0
        if not has.any():
            return None
        out = np.full(parents.shape[0], -1, np.int32)
        out[has] = self._in_order(rt, at, ids, at[has], parents[has])
        return out

    def _raise_top(self, rt: RankTrace, ids: np.ndarray) -> None:
        """Raise a rank's highest op id begun (``RankTable.top_id``) to the highest of ``ids``
        (a rank with no ops yet: set it)."""
        top = int(ids.max())
        if top > opids.NONE and (not rt.n or top > self.table.top_id[rt._s]):
            self.table.top_id[rt._s] = top

    def _recount_tops(self) -> None:
        """Every rank's highest op id begun, from its ops (after an ingest that failed
        partway: some may be in without their rank's top raised)."""
        for rt in self.ranks.values():
            n = rt.n
            if n:
                self.table.top_id[rt._s] = max(int(rt.id[:n].max()), opids.NONE)

    def _touched(self, low: int) -> None:
        """Log the batch that made ``version`` (``touched_since``)."""
        self._touches.append((self.version, low))
        self.table.touched_low = I64_MAX

    def touched_since(self, version: int) -> int | None:
        """The earliest begin among the ops of any rank changed after ``version`` (I64_MAX:
        none), or None where the log of the latest ``TOUCHES`` batches no longer reaches back
        that far: what a console asks each step of 16k ranks instead of walking them all."""
        return touched_since(self._touches, self.version, version)

    def _rank(self, r: int) -> RankTrace:
        rt = self.ranks.get(r)
        if rt is None:  # (no columns yet: grown as ops come, 16 rows first, as the records' are sized)
            rt = self.ranks[r] = RankTrace(r, cap=0, table=self.table)
        return rt

    def _record_begins(self, recs: OpRecords, rows: np.ndarray, codes: np.ndarray,
                       changed: set[int], in_order: bool = False) -> tuple[int, int]:
        """The begins among op records (``rows``, their signature ``codes``; ``in_order``:
        their parents paired in stream order, ``_ingest_cut``); returns their (first, last)
        timestamp."""
        rt = self._rank(recs.rank)
        ts = recs.ts[rows]
        ids, parents = recs.id[rows], recs.parent[rows]
        resolved = self._parents_in_order(rt, rows, ids, parents) if in_order else None
        a, b = self._add_ops(rt, ts, ids, codes, recs.seq[rows], recs.peer[rows], parents, resolved)
        self._seen(rt, a, b, a)
        changed.add(rt.rank)
        return a, b

    def _record_phases(self, recs: OpRecords, changed: set[int]) -> tuple[int, int]:
        """The other phases among op records; returns their (first, last) timestamp."""
        rows = np.flatnonzero(recs.phase > PH_BEGIN)
        if not rows.shape[0]:
            return I64_MAX, 0
        rt = self._rank(recs.rank)
        a, b, first = self._phases(rt, recs.ts[rows], recs.id[rows], recs.phase[rows], _record_extras(recs, rows))
        self._seen(rt, a, b, first)
        changed.add(rt.rank)
        return a, b

    # -- ranks new to the model, ingested together (the bulk of a whole read)
    def _fresh(self, recs_list: Sequence[OpRecords], rows: _Begins, described: _Records) -> list[int]:
        """Positions of the records whose rank has no ops yet and comes once in this batch:
        those ``_fresh_begins`` ingests together (none when fewer than two)."""
        slot = described.slot
        empty = (slot < 0) | (self.table.n[np.maximum(slot, 0)] == 0)  # (a rank with no ops has nothing open)
        out = []
        for k in np.flatnonzero(described.once & empty).tolist():
            if (slot[k] >= 0 or recs_list[k].rank not in self.ranks or self.ranks[recs_list[k].rank].n == 0) \
                    and rows[k].shape[0]:
                out.append(k)
        return out if len(out) > 1 else []

    def _index_order(self, recs_list: Sequence[OpRecords], rows: _Begins, codes: list,
                     known: np.ndarray | None, live: _Live | None,
                     regular: tuple[_Live, np.ndarray] | None) -> None:
        """Create the collective indexes, and their members' columns, in the order the rank by
        rank path would (records in batch order): the indexes are iterated, so their order
        shows in what is judged.  ``known``: the live records' codes, concatenated (and the
        regular ones' theirs)."""
        parts = [(live, known)] if known is not None and live is not None else []
        if regular is not None:
            parts.append(regular)
        if parts:
            codes = list(codes)
        for lv, kn in parts:
            cuts = np.cumsum(lv.counts())[:-1]
            for k, part in zip(lv.pos, np.split(kn, cuts), strict=True):
                codes[k] = part if part.shape[0] else None
        for k, (recs, code) in enumerate(zip(recs_list, codes, strict=True)):
            if code is None or recs.rank in self._apart:
                continue
            b = rows[k]
            coll = ((self._sig_flags[code] & COLL) != 0) & (recs.seq[b] >= 0)
            if coll.any():
                names = list(self._gkeys)
                for g in np.unique(self._sig_gkey[code[coll]]).tolist():
                    self._group_index(*names[g]).column(recs.rank)

    def _fresh_begins(self, recs_list: Sequence[OpRecords], fresh: list[int], rows: _Begins,
                      codes: list, changed: set[int]) -> _Fresh:
        """``_record_begins`` for many new ranks at once: their begins in one set of columns,
        rank after rank, each rank's columns views of them, and the indexes filled in one
        pass per group.  What it leaves is what the rank by rank path leaves."""
        ks = [rows[k].shape[0] for k in fresh]
        start = np.zeros(len(fresh) + 1, np.int64)
        np.cumsum(ks, out=start[1:])
        n = int(start[-1])

        def cat(name: str) -> np.ndarray:
            return np.concatenate([getattr(recs_list[k], name)[rows[k]] for k in fresh])

        ts, seq, parents = cat("ts"), cat("seq"), cat("parent")
        sig = np.concatenate([codes[k] for k in fresh]).astype(np.int32, copy=False)
        cols = {"begin": ts, "id": cat("id"), "sig": sig, "seq": seq, "peer": cat("peer").astype(np.int32),
                "parent": np.full(n, -1, np.int32), "flags": np.zeros(n, np.uint8)}
        for c in ("end", "wb", "we", "done", "gpu", "comp"):
            cols[c] = np.zeros(n, np.int64)
        who = np.repeat(np.arange(len(fresh), dtype=np.int64), ks)  # the position in ``fresh`` of each row
        local = (np.arange(n, dtype=np.int64) - start[who]).astype(np.int32)
        first = np.minimum.reduceat(ts, start[:-1])
        last = np.maximum.reduceat(ts, start[:-1])
        unsorted = set()
        if n > 1:
            back = np.flatnonzero(np.diff(ts) < 0) + 1  # rows earlier than the row before them
            back = back[local[back] > 0]  # within a rank
            unsorted = set(who[back].tolist())
        has_parent = parents >= 0
        with_parent = set(who[has_parent].tolist()) if has_parent.any() else set()
        t = self.table
        block = t.add_block(cols)
        rts = [self.ranks[recs_list[k].rank] for k in fresh]
        ranks = [rt.rank for rt in rts]
        ids = cols["id"]
        bounds = start.tolist()
        # ids mapped when asked (``RankTrace._fold``), as ``_together_begins`` leaves them, but
        # where that would not map them as mapping them now does (a negative id, or one large
        # enough to move the dense map's start or make it a dict): those now, before their rows are theirs (as
        # ``_add_ops``).  A first live round mapped 16k ranks' ids, ~10 us a rank.
        odd = RankTrace.mapped_at_once(ids, local)
        for j in np.unique(who[odd]).tolist() if odd.any() else ():
            rts[j].map_ids(ids[bounds[j]:bounds[j + 1]], local[bounds[j]:bounds[j + 1]])
        slots = t.adopt(rts, block, start)
        t.aligned_from[slots], t.idoff[slots] = _aligned(ids, start)
        for j in sorted(with_parent):
            rt = rts[j]
            a, b = int(start[j]), int(start[j + 1])
            hp = has_parent[a:b]
            rt.parent[hp] = rt.lookup(parents[a:b][hp])
            t.parents[rt._s] = True
        if unsorted:
            t.ordered[slots[sorted(unsorted)]] = False
        last_begin = np.maximum(t.last_begin[slots], last)
        t.last_begin[slots] = last_begin
        t.last_op_ts[slots] = np.maximum(t.last_op_ts[slots], last_begin)
        # (their ops are open: ``RankTrace.open`` folds them in when asked, from ``open_from``)
        self._seen_many(slots, first, last_begin, first)
        changed.update(ranks)
        self._fresh_index(ranks, cols, who, local)
        return _Fresh(fresh, ranks, start, cols, [rt.begin for rt in rts], int(first.min()), int(last.max()))

    def _fresh_index(self, ranks: list[int] | np.ndarray, cols: dict[str, np.ndarray], who: np.ndarray,
                     local: np.ndarray) -> None:
        """``_index`` for ranks ingested together: one ``put`` per group for all of them."""
        rank_of = np.asarray(ranks, np.int64)
        sig, seq, peer = cols["sig"], cols["seq"], cols["peer"]
        if self._apart:  # (a rank kept apart: its rows out, a pass only where some rank is)
            kept = ~np.isin(rank_of, np.fromiter(self._apart, np.int64))[who]
            if not kept.all():
                sig, seq, peer, who, local = sig[kept], seq[kept], peer[kept], who[kept], local[kept]
        flags = self._sig_flags[sig]
        coll = np.flatnonzero(((flags & COLL) != 0) & (seq >= 0))
        if coll.shape[0]:
            gk, cw = self._sig_gkey[sig[coll]], who[coll]
            present = np.flatnonzero(np.bincount(gk)).tolist()  # (a few groups; no sort of the rows)
            masks = {g: gk == g for g in present} if len(present) > 1 else {present[0]: slice(None)}
            # made in the order rank by rank makes them: by the first rank using each, then group
            first = {g: int(cw[np.argmax(m)]) if len(present) > 1 else 0 for g, m in masks.items()}
            names = list(self._gkeys)
            column = np.empty(len(ranks), np.int32)
            cseq, cloc = seq[coll], local[coll]
            for g in sorted(present, key=lambda g: (first[g], g)):
                m = masks[g]
                gi = self._group_index(*names[g])
                members = np.flatnonzero(np.bincount(cw[m], minlength=len(ranks)))
                column[members] = gi.columns(rank_of[members])
                gi.seqs.put(cseq[m], column[cw[m]], cloc[m])
        p2p = ((flags & P2P) != 0) & (seq >= 0) & (peer >= 0) & ((flags & NESTED) == 0)
        if p2p.any():
            prow = np.flatnonzero(p2p)
            pwho = who[prow]  # ascending: the rows are rank after rank
            cuts = np.flatnonzero(np.r_[True, pwho[1:] != pwho[:-1], True])
            for a, b in zip(cuts[:-1].tolist(), cuts[1:].tolist(), strict=True):
                j, rows = int(pwho[a]), prow[a:b]
                key = sig[rows].astype(np.int64) * (1 << 32) + peer[rows]
                for kv in np.unique(key).tolist():
                    m = key == kv
                    self._channel(int(rank_of[j]), kv >> 32, kv & 0xFFFFFFFF).put(seq[rows][m], *self._side(kv >> 32),
                                                                         local[rows][m])

    # -- ranks already begun, a few records each (a live poll)
    def _live(self, recs_list: Sequence[OpRecords], fresh: list[int], described: _Records) -> list[int]:
        """Positions of the records whose rank the model has, that come once in this batch
        and hold at most ``live_rows`` rows, or more where they are plain (``_plain``): those
        ingested together (``_regular``; none when fewer than two)."""
        ok = described.once & (described.sizes <= self.live_rows)
        long = described.once & (described.sizes > self.live_rows) & (described.slot >= 0)
        if self.live_rows and long.any():  # (0: every rank begun rank by rank)
            t = self.table
            ok[long] = [not t.parents[described.slot[k]] and self._plain(recs_list[k])
                        for k in np.flatnonzero(long).tolist()]
        ok[fresh] = False
        huge = ok & (described.slot < 0)  # (ranks beyond the table's: the dict says)
        if huge.any():
            ok[huge] = [recs_list[k].rank in self.ranks for k in np.flatnonzero(huge).tolist()]
        out = np.flatnonzero(ok).tolist()
        return out if len(out) > 1 else []

    @staticmethod
    def _plain(recs: OpRecords) -> bool:
        """Whether a record of a rank with no nested op is one ``_regular`` finds regular: no
        exception text, no flag on a phase, no parent on a begin."""
        return not recs.exc and not _irregular_rows(recs.phase, recs.flags, recs.parent).any()

    def _known_codes(self, recs_list: Sequence[OpRecords], live: _Live, one_table: bool = False) -> np.ndarray | None:
        """The signature codes of the live records' begins, in their order, looked up all at
        once; None when one is new to the model (then every record's are interned one record
        after another, as rank by rank) or the records differ in their decoder's table.
        ``one_table``: they are slices of one set of columns, so they share it (``Spans``)."""
        if not live.begun.shape[0]:
            return np.zeros(0, np.int32)
        statics = recs_list[live.pos[0]].statics
        if not one_table:
            records = recs_list if len(live.pos) == len(recs_list) else [recs_list[k] for k in live.pos]
            if not all(map(is_, map(_STATICS_OF_RECORDS, records), repeat(statics))):
                return None
        st, tid = live.cols["static"][live.begun], live.cols["tid"][live.begun]
        get = self._sig_by_sk.get
        span = int(st.max()) + 1
        if bool((tid == tid[0]).all()):
            t = int(tid[0])
            table = np.full(span, -1, np.int32)
            for s in np.flatnonzero(np.bincount(st)).tolist():
                code = get((statics[s].sk, t))
                if code is None:
                    return None
                table[s] = code
            return table[st]
        # a thread id per process (a rank's own): all at once where every pair is known
        found = self._pairs.find(self._sks(statics, span)[st], tid)
        if found is not None:
            return found
        # else the distinct (static, thread) pairs, each once
        tids, tid_at = np.unique(tid, return_inverse=True)
        pairs, pair_at = np.unique(tid_at.astype(np.int64) * span + st, return_inverse=True)
        tids_l = tids.tolist()
        codes = np.empty(pairs.shape[0], np.int32)
        for j, pair in enumerate(pairs.tolist()):
            code = get((statics[pair % span].sk, tids_l[pair // span]))
            if code is None:
                return None
            codes[j] = code
        return codes[pair_at.reshape(-1)]

    def _codes_known(self, recs_list: Sequence[OpRecords], rows: _Begins, skip: Set[int],
                     one_table: bool) -> list[np.ndarray | None] | None:
        """Each record's begins' signature codes, as ``_codes`` gives them, looked up for the
        batch at once where every (static, thread) pair is known (a whole read's batches
        after its first: a call of ``_codes`` a rank was ~0.1 s of a 4,096-rank read's reading
        process); None where one is new (then each record's are interned in the records'
        order, ``_codes``), or the records differ in their decoder's table.  ``one_table``:
        they are slices of one set of columns (``Spans``)."""
        ks = [k for k in range(len(recs_list)) if k not in skip and rows[k].shape[0]]
        if len(ks) < 2:
            return None
        statics = recs_list[ks[0]].statics
        if not one_table and not all(recs_list[k].statics is statics for k in ks):
            return None
        st = np.concatenate([recs_list[k].static[rows[k]] for k in ks])
        tid = np.concatenate([recs_list[k].tid[rows[k]] for k in ks])
        found = self._pairs.find(self._sks(statics, int(st.max()) + 1)[st], tid)
        if found is None:
            return None
        out: list[np.ndarray | None] = [None] * len(recs_list)
        bounds = np.cumsum([0] + [rows[k].shape[0] for k in ks]).tolist()
        for j, k in enumerate(ks):
            out[k] = found[bounds[j]:bounds[j + 1]]
        return out

    def _sks(self, statics: Sequence[Static], span: int) -> np.ndarray:
        """The signature keys of a decoder's table (its first ``span`` statics at least), as an
        array, kept for the table last asked."""
        table, sks = self._statics_sk
        if table is not statics or sks.shape[0] < span:
            sks = np.array([x.sk for x in statics], np.int64)
            self._statics_sk = (statics, sks)
        return sks

    def _intern_new(self, spans: Spans) -> None:
        """Intern the (static, thread) pairs of a poll's begins that are new to the model, in
        the order the scalar way meets them (record after record, each record's in order of
        static and thread: ``_codes``), so that its begins are then looked up all at once
        (``_known_codes``).  A pair new to the model (a rank's first op of a kind, and each
        rank its own thread) sent the whole poll, thousands of ranks, the scalar way: most
        of a live console's second round."""
        w, a, b = spans.whole, int(spans.start[0]), int(spans.start[-1])
        begun = np.flatnonzero(w.phase[a:b] == PH_BEGIN)
        if not begun.shape[0]:
            return
        st, tid = w.static[a:b][begun], w.tid[a:b][begun]
        new = np.flatnonzero(~self._pairs.known(self._sks(w.statics, int(st.max()) + 1)[st], tid))
        if not new.shape[0]:
            return
        rec = np.searchsorted(spans.start, begun[new] + a, side="right") - 1
        st, tid = st[new], tid[new]
        statics = w.statics
        for j in np.lexsort((tid, st, rec)).tolist():  # (a pair met again: known by then, as the scalar way finds it)
            self._code(statics[int(st[j])], int(tid[j]))

    def _live_begins(self, recs_list: Sequence[OpRecords], live: _Live, codes: list, known: np.ndarray | None,
                     changed: set[int]) -> tuple[int, int]:
        """``_record_begins`` for ranks already begun, a few begins each: the batch's begins
        written to each rank's columns a scalar at a time, the indexes filled in one pass per
        group.  What it leaves is what rank by rank leaves; returns the (first, last) begin."""
        rows = live.begun
        n = rows.shape[0]
        if not n:
            return I64_MAX, 0
        has = np.flatnonzero(live.counts())  # the records with begins (j)
        ts, ids, seq, peer, parents = (live.cols[c][rows] for c in ("ts", "id", "seq", "peer", "parent"))
        sig = (known if known is not None else
               np.concatenate([codes[k] for k in live.pos if codes[k] is not None])).astype(np.int32, copy=False)
        # re-numbered over the records with begins: who[i] is the rank of begin row i in ``rts``
        renum = np.full(len(live.pos), -1, np.int64)
        renum[has] = np.arange(has.shape[0])
        who = renum[live.who]
        bounds = np.flatnonzero(np.r_[True, who[1:] != who[:-1], True])  # each rank's rows, in order
        rts = [self.ranks[recs_list[live.pos[j]].rank] for j in has.tolist()]
        within = np.arange(n, dtype=np.int64) - bounds[who]
        n0 = np.array([rt.n for rt in rts], np.int64)
        local = (n0[who] + within).astype(np.int32)
        first = np.minimum.reduceat(ts, bounds[:-1]).tolist()
        last = np.maximum.reduceat(ts, bounds[:-1]).tolist()
        head = ts[bounds[:-1]].tolist()
        unsorted = set()
        if n > 1:
            back = np.flatnonzero(np.diff(ts) < 0) + 1  # rows earlier than the row before them
            unsorted = set(who[back[within[back] > 0]].tolist())  # within a rank
        with_parent = set(who[parents >= 0].tolist())
        bounds_l = bounds.tolist()
        ts_l, id_l, sig_l, seq_l, peer_l, par_l = (c.tolist() for c in (ts, ids, sig, seq, peer, parents))
        lo, hi = I64_MAX, 0
        for j, rt in enumerate(rts):
            a, b = bounds_l[j], bounds_l[j + 1]
            m0 = rt.n
            if m0 + b - a > rt.begin.shape[0]:
                rt.reserve(m0 + b - a)
            begin, op_id, code, op_seq, op_peer = rt.begin, rt.id, rt.sig, rt.seq, rt.peer
            for i, r in enumerate(range(a, b), m0):
                begin[i], op_id[i], code[i], op_seq[i], op_peer[i] = ts_l[r], id_l[r], sig_l[r], seq_l[r], peer_l[r]
            rt.map_few(id_l[a:b], m0)
            rt.align(ids[a:b], m0)
            if j in with_parent:
                self.table.parents[rt._s] = True
                parent = rt.parent
                for i, r in enumerate(range(a, b), m0):
                    if par_l[r] >= 0:
                        p = rt.index_of(par_l[r])
                        parent[i] = -1 if p is None else p
            if rt._sorted and (head[j] < rt._last_begin or j in unsorted):
                rt._sorted = False
            rt._last_begin = max(rt._last_begin, last[j])
            rt.last_op_ts = max(rt.last_op_ts, rt._last_begin)
            rt.n = m0 + b - a
            rt.open.update(range(m0, rt.n))
            self._seen(rt, first[j], rt._last_begin, first[j])
            changed.add(rt.rank)
            lo, hi = min(lo, first[j]), max(hi, rt._last_begin)
        self._fresh_index([rt.rank for rt in rts], {"sig": sig, "seq": seq, "peer": peer}, who, local)
        return lo, hi

    def _regular(self, live: _Live | None, known: np.ndarray | None
                 ) -> tuple[tuple[_Live, np.ndarray] | None, _Live | None, np.ndarray | None]:
        """Split the live records: the regular ones (their rank has a slot and never had a
        nested op; no exception, flag or parent), ingested with no Python step per rank
        (``_together_begins``, ``_together_phases``), with their signature codes; and the
        rest, a few scalar steps a rank (``_live_begins``), with theirs."""
        if live is None:
            return None, None, known
        if known is None:  # (a signature new to the model: everything the way that interns in order)
            return None, live.part(np.arange(len(live.pos)), True), None
        t = self.table
        slot = t.slots(live.ranks)
        ph, cols = live.cols["phase"], live.cols
        bad = _irregular_rows(ph, cols["flags"], cols["parent"])
        nrec = len(live.pos)
        odd = live.exc | (slot < 0) | t.parents[np.maximum(slot, 0)]
        if bad.any():
            odd |= np.bincount(np.searchsorted(np.asarray(live.start), np.flatnonzero(bad), side="right") - 1,
                               minlength=nrec) > 0
        if not odd.any():
            return (live, known), None, None
        begun_odd = odd[live.who]
        reg, rest = np.flatnonzero(~odd), np.flatnonzero(odd)
        regular = (live.part(reg, False), known[~begun_odd]) if reg.shape[0] else None
        return regular, live.part(rest, True), known[begun_odd]

    def _seen_many(self, slots: np.ndarray, t0: np.ndarray, t1: np.ndarray, touched: np.ndarray) -> None:
        """``_seen`` of many ranks (``slots`` distinct)."""
        t = self.table
        ft, lt = t.first_ts[slots], t.last_ts[slots]
        nz = t1 != 0
        t.first_ts[slots] = np.where(nz, np.where(ft == 0, t0, np.minimum(ft, t0)), ft)
        t.last_ts[slots] = np.where(nz, np.maximum(lt, t1), lt)
        t.version[slots] += 1
        t.touch(slots, touched)

    def _together_begins(self, regular: tuple[_Live, np.ndarray], changed: set[int]) -> tuple[int, int]:
        """``_live_begins`` of regular records with no Python step per rank: rows appended to
        each rank's block with one numpy call per column (ranks without room first move
        together, ``RankTable.relocate``), the rank scalars written in the table's arrays,
        the indexes filled in one pass per group.  The ids are mapped when asked
        (``RankTrace._fold``); open ops are those from ``open_from`` on (``RankTrace.open``)."""
        lv, sig = regular
        rows = lv.begun
        nb = rows.shape[0]
        if not nb:
            return I64_MAX, 0
        t = self.table
        nrec = len(lv.pos)
        slot_rec = t.slots(lv.ranks)
        cnt = lv.counts()
        has = np.flatnonzero(cnt)
        who = lv.who
        ts, ids, seq = lv.cols["ts"][rows], lv.cols["id"][rows], lv.cols["seq"][rows]
        n0 = t.n[slot_rec]
        need = n0 + cnt
        over = np.flatnonzero(need > t.cap[slot_rec])
        if over.shape[0]:
            t.relocate([self.ranks[r] for r in lv.ranks[over].tolist()], need[over].tolist())
        bstart = np.searchsorted(who, np.arange(nrec))  # each record's first begin row
        within = np.arange(nb, dtype=np.int64) - bstart[who]
        local = n0[who] + within
        s_row = slot_rec[who]
        t.scatter({"begin": ts, "id": ids, "sig": sig.astype(np.int32, copy=False), "seq": seq,
                   "peer": lv.cols["peer"][rows].astype(np.int32, copy=False)}, t.block[s_row], t.base[s_row] + local)
        # ids: a record whose begins go on from the rank's run of consecutive ids needs nothing
        off_ok = (ids - local) == t.idoff[s_row]
        cont = (n0 > 0) & (t.aligned_from[slot_rec] < n0)
        if not off_ok.all():
            cont &= np.bincount(who[~off_ok], minlength=nrec) == 0
        for j in np.flatnonzero(~cont[has]).tolist():
            j = int(has[j])
            a = int(bstart[j])
            self.ranks[int(lv.ranks[j])].align(ids[a:a + int(cnt[j])], int(n0[j]))
        # ids mapped when asked (``RankTrace._fold``) only where that maps them as batch by batch
        # would: none negative, none large enough for a batch to have moved the map's start or made it a dict
        odd = RankTrace.mapped_at_once(ids, local)
        if odd.any():
            for j in np.unique(who[odd]).tolist():
                a = int(bstart[j])
                self.ranks[int(lv.ranks[j])].map_few(ids[a:a + int(cnt[j])].tolist(), int(n0[j]))
        s_has = slot_rec[has]
        starts = bstart[has]
        first = np.minimum.reduceat(ts, starts)
        last = np.maximum.reduceat(ts, starts)
        late = ts[starts] < t.last_begin[s_has]
        if nb > 1:
            back = np.flatnonzero(np.diff(ts) < 0) + 1  # rows earlier than the row before them
            back = back[within[back] > 0]  # within a rank
            if back.shape[0]:
                t.ordered[slot_rec[who[back]]] = False
        t.ordered[s_has[late]] = False
        t.last_begin[s_has] = top = np.maximum(t.last_begin[s_has], last)
        t.last_op_ts[s_has] = np.maximum(t.last_op_ts[s_has], top)
        t.n[s_has] += cnt[has]
        self._seen_many(s_has, first, top, first)
        changed.update(lv.ranks[has].tolist())
        renum = np.full(nrec, -1, np.int64)
        renum[has] = np.arange(has.shape[0])
        self._fresh_index(lv.ranks[has], {"sig": sig, "seq": seq, "peer": lv.cols["peer"][rows]}, renum[who],
                          local.astype(np.int32))
        return int(first.min()), int(top.max())

    def _together_phases(self, lv: _Live, changed: set[int]) -> tuple[int, int]:
        """``_live_phase`` and ``_live_complete`` of regular records, for all of them at once:
        an id's op found by a subtraction where the rank's ids run on (``RankTrace.align``;
        else its id map), times and completions written with a numpy call per column."""
        t = self.table
        phase = lv.cols["phase"]
        rows = np.flatnonzero(phase > PH_BEGIN)
        if not rows.shape[0]:
            return I64_MAX, 0
        who = np.searchsorted(np.asarray(lv.start), rows, side="right") - 1
        slot_rec = t.slots(lv.ranks)
        s_row = slot_rec[who]
        ids, ts, ph = lv.cols["id"][rows], lv.cols["ts"][rows], phase[rows]
        guess = ids - t.idoff[s_row]
        idx = np.full(rows.shape[0], -1, np.int64)
        block, base = t.block[s_row], t.base[s_row]
        cand = np.flatnonzero((ids >= 0) & (guess >= t.aligned_from[s_row]) & (guess < t.n[s_row]))
        (got,) = t.gather(("id",), block[cand], base[cand] + guess[cand])
        hit = cand[got == ids[cand]]
        idx[hit] = guess[hit]
        if hit.shape[0] < rows.shape[0]:  # ids off the run: the rank's id map
            miss = np.ones(rows.shape[0], np.bool_)
            miss[hit] = False
            for q in np.flatnonzero(miss).tolist():
                i = self.ranks[int(lv.ranks[who[q]])].index_of(int(ids[q]))
                idx[q] = -1 if i is None else i
        ok = idx >= 0
        pos = base + idx
        flagged = lv.cols["flags"][rows]
        if flagged.any():  # (as ``_apply_extras``: an approximate end, a device time)
            m = np.flatnonzero(ok & ((flagged & F_APPROX) != 0))
            if m.shape[0]:
                (f,) = t.gather(("flags",), block[m], pos[m])
                t.scatter({"flags": f | APPROX}, block[m], pos[m])
            m = np.flatnonzero(ok & ((flagged & F_GPU) != 0))
            if m.shape[0]:
                t.scatter({"gpu": lv.cols["gpu"][rows][m]}, block[m], pos[m])
        for code, name in ((PH_END, "end"), (PH_WAIT_BEGIN, "wb"), (PH_WAIT_END, "we"), (PH_DONE, "done")):
            m = np.flatnonzero(ok & (ph == code))
            if m.shape[0]:
                t.scatter({name: ts[m]}, block[m], pos[m])
        done = ph == PH_DONE
        if done.any():
            t.device_seen[s_row[done]] = True
            m = np.flatnonzero(ok & done)
            (f,) = t.gather(("flags",), block[m], pos[m])
            t.scatter({"flags": f | DONE}, block[m], pos[m])
        u = np.flatnonzero(ok & (ph != PH_WAIT_BEGIN))  # an op may come twice (end and wait_end): harmless
        if u.shape[0]:
            bu, pu, su = block[u], pos[u], s_row[u]
            cols = t.gather(("sig", "end", "we", "done", "flags", "comp"), bu, pu)
            new = self._completion(*cols)
            t.scatter({"comp": new}, bu, pu)
            np.maximum.at(t.last_comp, su, new)
            iu, old = idx[u], cols[5]
            finished = new > 0
            t.stale[su[finished & (iu < t.open_from[su])]] = True  # in a rank's open set: no longer open
            back = ~finished & (old > 0)  # a completion back to 0 or below (hostile times): open again
            if back.any():
                np.minimum.at(t.open_from, su[back], iu[back])
            # a nested op begun by this batch's events (JSON) closes with its outer op, as rank by rank
            nested = np.unique(su[finished & t.parents[su]])
            for s in nested.tolist():
                self._close_nested(t.traces[s])
        # per record with phases: as ``_seen`` after ``_live_complete``
        at = np.flatnonzero(np.r_[True, who[1:] != who[:-1]])
        recs = who[at]
        lo, hi = np.minimum.reduceat(ts, at), np.maximum.reduceat(ts, at)
        run = np.cumsum(np.r_[False, who[1:] != who[:-1]])  # each row's record among ``recs``
        okr = np.flatnonzero(ok)
        (begins,) = t.gather(("begin",), block[okr], pos[okr])
        first = _runs(np.minimum, begins, run[okr], recs.shape[0], I64_MAX)
        self._seen_many(slot_rec[recs], lo, hi, first)
        changed.update(lv.ranks[recs].tolist())
        return int(lo.min()), int(hi.max())

    def _live_phase(self, rt: RankTrace, recs: OpRecords, flat: _Live, j: int) -> _LiveRank | None:
        """``_phases`` of a live rank's record (the ``j``-th live one) but its completions,
        which ``_live_complete`` computes for every live rank at once; None: no phases."""
        a, b = flat.start[j], flat.start[j + 1]
        phase, ts, ids, flags = flat.phase, flat.ts, flat.id, flat.flags
        column = {PH_END: rt.end, PH_WAIT_BEGIN: rt.wb, PH_WAIT_END: rt.we, PH_DONE: rt.done}
        idx: list[int] = []
        phs: list[int] = []
        times: list[int] = []
        extra = bool(recs.exc)
        for r in range(a, b):
            ph = phase[r]
            if ph <= PH_BEGIN:
                continue
            i = rt.index_of(ids[r])
            i = -1 if i is None else i
            idx.append(i)
            phs.append(ph)
            times.append(ts[r])
            extra = extra or flags[r] != 0
            col = column.get(ph)
            if col is not None and i >= 0:
                col[i] = ts[r]
        if not idx:
            return None
        if extra:
            self._apply_extras(rt, np.array(idx, np.int32), _record_extras(recs, np.flatnonzero(recs.phase > PH_BEGIN)))
        if PH_DONE in phs:
            rt.device_seen = True
        op_flags, begin = rt.flags, rt.begin
        updated, first = [], I64_MAX
        for i, ph in zip(idx, phs, strict=True):
            if i < 0:
                continue
            if ph == PH_DONE:
                op_flags[i] |= DONE
            if ph != PH_WAIT_BEGIN:  # an op may come twice (end and wait_end): harmless
                updated.append(i)
            first = min(first, begin.item(i))
        return _LiveRank(rt, updated, min(times), max(times), first)

    def _live_complete(self, ranks: list[_LiveRank], changed: set[int]) -> tuple[int, int]:
        """``_complete`` of the ops the live ranks' phases changed, computed all at once;
        then what ``_record_phases`` notes of each rank.  Returns the phases' (first, last)."""
        sig, end, we, done, op_flags, comp = [], [], [], [], [], []
        for x in ranks:
            rt = x.rt
            if x.updated:  # (``item``: a Python int, which np.array takes faster than numpy's scalars)
                c_sig, c_end, c_we, c_done, c_flags, c_comp = rt.sig.item, rt.end.item, rt.we.item, rt.done.item, \
                    rt.flags.item, rt.comp.item
                for i in x.updated:
                    sig.append(c_sig(i))
                    end.append(c_end(i))
                    we.append(c_we(i))
                    done.append(c_done(i))
                    op_flags.append(c_flags(i))
                    comp.append(c_comp(i))
        new = self._completion(np.array(sig, np.int32), np.array(end, np.int64), np.array(we, np.int64),
                               np.array(done, np.int64), np.array(op_flags, np.uint8),
                               np.array(comp, np.int64)).tolist()
        lo, hi, k = I64_MAX, 0, 0
        for x in ranks:
            rt = x.rt
            if x.updated:
                values = new[k:k + len(x.updated)]
                k += len(x.updated)
                column = rt.comp
                for i, v in zip(x.updated, values, strict=True):
                    column[i] = v
                rt.last_comp = max(rt.last_comp, max(values))
                finished = [i for i, v in zip(x.updated, values, strict=True) if v > 0]
                if len(finished) < len(values):  # (a completion back to 0 or below: open again)
                    rt.open.update(i for i, v in zip(x.updated, values, strict=True) if v <= 0)
                if finished:
                    rt.open.difference_update(finished)
                    self._close_nested(rt)
            self._seen(rt, x.t0, x.t1, x.first)
            changed.add(rt.rank)
            lo, hi = min(lo, x.t0), max(hi, x.t1)
        return lo, hi

    def _batch_phases(self, recs_list: Sequence[OpRecords], batch: _Fresh | None, live: _Live | None,
                      changed: set[int], regular: Set[int]) -> tuple[int, int]:
        """``_record_phases`` of every record in the batch: those of the ranks ingested
        together (``batch``) in the batch's columns, those of ``live`` ranks a few scalar
        steps each, their completions computed all at once (``_live_complete``), the rest
        rank by rank.  Exceptions are noted in the records' order (``failed`` keeps arrival
        order); a rank whose columns the batch's events outgrew goes rank by rank."""
        lo, hi = I64_MAX, 0
        together: dict[int, int] = {}
        fp: _FreshPhases | None = None  # the phases of the ranks still together
        if batch is not None:
            cols = batch.cols
            together = {k: j for j, k in enumerate(batch.pos) if self.ranks[batch.ranks[j]].begin is batch.views[j]}
            fp = self._fresh_phases(recs_list, batch, together)
            if fp is not None:
                ts, ph = fp.ts, fp.phase
                ok = fp.idx >= 0
                row = np.repeat(batch.start[fp.js], np.diff(fp.bounds)) + fp.idx
                for code, name in ((PH_END, "end"), (PH_WAIT_BEGIN, "wb"), (PH_WAIT_END, "we"), (PH_DONE, "done")):
                    m = ok & (ph == code)
                    if m.any():
                        cols[name][row[m]] = ts[m]
        part_of = fp.part_of if fp is not None else {}
        at = {k: j for j, k in enumerate(live.pos)} if live is not None else {}
        done_live: list[_LiveRank] = []
        for k in range(len(recs_list)) if not regular else [] if len(regular) == len(recs_list) else [
                k for k in range(len(recs_list)) if k not in regular]:
            recs = recs_list[k]  # exceptions and the rare extras, in the records' order
            n = part_of.get(k)
            if n is not None:
                if fp is not None and batch is not None and k in fp.extras:
                    a, b = int(fp.bounds[n]), int(fp.bounds[n + 1])
                    self._apply_extras(self.ranks[batch.ranks[int(fp.js[n])]], fp.idx[a:b],
                                       _record_extras(recs, fp.rows[a:b]))
            elif k in at:
                got = self._live_phase(self.ranks[recs.rank], recs, live, at[k])
                if got is not None:
                    done_live.append(got)
            elif k not in together:  # (the regular: ``_together_phases``)
                a, b = self._record_phases(recs, changed)
                lo, hi = min(lo, a), max(hi, b)
        if done_live:
            a, b = self._live_complete(done_live, changed)
            lo, hi = min(lo, a), max(hi, b)
        if fp is None or batch is None:
            return lo, hi
        done = ph == PH_DONE
        if done.any():
            cols["flags"][row[ok & done]] |= DONE
        upd = ok & (ph != PH_WAIT_BEGIN)
        if upd.any():
            r = row[upd]
            cols["comp"][r] = self._completion(cols["sig"][r], cols["end"][r], cols["we"][r], cols["done"][r],
                                               cols["flags"][r], cols["comp"][r])
        # per rank, all at once: its phases are one run of the batch's (``part``, in order)
        lens = np.diff(fp.bounds)
        nparts = lens.shape[0]
        part = np.repeat(np.arange(nparts), lens)
        starts = fp.bounds[:-1]
        tmin = np.minimum.reduceat(ts, starts)
        tmax = np.maximum.reduceat(ts, starts)
        comp, begin = cols["comp"], cols["begin"]
        device = np.bincount(part[done], minlength=nparts) > 0
        cu = comp[row[upd]]
        last_comp = _runs(np.maximum, cu, part[upd], nparts, 0)
        finished = np.bincount(part[upd][cu > 0], minlength=nparts) > 0
        first = _runs(np.minimum, begin[row[ok]], part[ok], nparts, I64_MAX)
        rts = [self.ranks[batch.ranks[j]] for j in fp.js.tolist()]
        slots = np.fromiter((rt._s for rt in rts), np.int64, nparts)
        t = self.table
        t.device_seen[slots[device]] = True
        t.last_comp[slots] = np.maximum(t.last_comp[slots], last_comp)
        # each one's open set (``RankTrace.open``): its ops of the batch not complete; a nested
        # op closes with its parent, as _complete closes it, where one finished
        js = fp.js
        zero = np.flatnonzero(comp <= 0)  # the batch's ops not complete
        z0, z1 = np.searchsorted(zero, batch.start[js]).tolist(), np.searchsorted(zero, batch.start[js + 1]).tolist()
        local = (zero - batch.start[np.searchsorted(batch.start, zero, side="right") - 1]).tolist()
        for rt, a, b in zip(rts, z0, z1, strict=True):
            rt._open = set(local[a:b])
        t.open_from[slots] = t.n[slots]
        t.stale[slots] = False
        for n in np.flatnonzero((np.array(z1) > np.array(z0)) & finished & t.parents[slots]).tolist():
            self._close_nested(rts[n])
        self._seen_many(slots, tmin, tmax, first)
        changed.update(rt.rank for rt in rts)
        return min(lo, int(tmin.min())), max(hi, int(tmax.max()))

    def _fresh_phases(self, recs_list: Sequence[OpRecords], batch: _Fresh,
                      together: dict[int, int]) -> _FreshPhases | None:
        """The phases (ends, waits, dones) of the records of the ranks ``_fresh_begins``
        ingested that are still together (``together``: record position -> the rank's place
        in ``batch``), in one set of arrays, each one's op found for all at once where its
        rank's ids run on (``RankTable.idoff``: the latest op with that id, as the id map
        finds it), the others by the rank's id map (``RankTrace.lookup``).  None: none."""
        ks = list(together)
        if not ks:
            return None
        counts = np.fromiter((recs_list[k].phase.shape[0] for k in ks), np.int64, len(ks))
        cum = np.zeros(len(ks) + 1, np.int64)
        np.cumsum(counts, out=cum[1:])
        phase = np.concatenate([recs_list[k].phase for k in ks])
        at = np.flatnonzero(phase > PH_BEGIN)
        if not at.shape[0]:
            return None
        owner = np.searchsorted(cum, at, side="right") - 1  # each phase's record's place in ``ks``
        ids = np.concatenate([recs_list[k].id for k in ks])[at]
        j_of = np.fromiter((together[k] for k in ks), np.int64, len(ks))
        slot_of = np.fromiter((self.ranks[batch.ranks[j]]._s for j in j_of.tolist()), np.int64, len(ks))
        t, s, j = self.table, slot_of[owner], j_of[owner]
        # (op i has id i + idoff from aligned_from on, wrapping as int64 arithmetic does, so
        # an id whose op would lie there is that op's; a negative one the id map never holds)
        guess = ids - t.idoff[s]
        hit = (ids >= 0) & (guess >= t.aligned_from[s]) & (guess < batch.start[j + 1] - batch.start[j])
        idx = np.where(hit, guess, -1)
        miss = np.flatnonzero(~hit)
        if miss.shape[0]:  # (ids that do not run on, negative ones: as the rank's id map finds them)
            for o, rows in _split_by_rank(owner[miss]):
                m = miss if rows is None else miss[rows]
                idx[m] = self.ranks[batch.ranks[int(j_of[o])]].lookup(ids[m])
        present = np.flatnonzero(np.r_[True, owner[1:] != owner[:-1]])  # each part's first phase
        bounds = np.append(present, at.shape[0])
        keys = [ks[o] for o in owner[present].tolist()]
        flagged = np.concatenate([recs_list[k].flags for k in ks])[at] != 0
        extras = {keys[n] for n in np.unique(np.searchsorted(bounds, np.flatnonzero(flagged), side="right") - 1)
                  .tolist()} | {k for k in keys if recs_list[k].exc}  # (flagged or failed: a PhaseExtra)
        return _FreshPhases(dict(zip(keys, range(len(keys)), strict=True)), j_of[owner[present]], bounds,
                            at - cum[owner], idx, np.concatenate([recs_list[k].ts for k in ks])[at], phase[at], extras)

    def _seen(self, rt: RankTrace, t0: int, t1: int, touched: int) -> None:
        if t1:
            rt.first_ts = t0 if not rt.first_ts else min(rt.first_ts, t0)
            rt.last_ts = max(rt.last_ts, t1)
        rt.version += 1
        rt.touch(touched)

    def _codes(self, statics: Sequence[Static], st: np.ndarray, tid: np.ndarray) -> np.ndarray:
        """Signature codes of begins given as (static index, thread id): interned once per
        distinct pair, looked up by the static's key (``Static.sk``) like a begin event's."""
        if bool((tid == tid[0]).all()):
            t = int(tid[0])
            distinct = sorted(set(st.tolist()))  # a handful: cheaper than np.unique on small batches
            if len(distinct) == 1:
                return np.full(st.shape[0], self._code(statics[distinct[0]], t), np.int32)
            table = np.full(distinct[-1] + 1, -1, np.int32)
            for s in distinct:
                table[s] = self._code(statics[s], t)
            return table[st]
        pairs = np.stack([st.astype(np.uint64), tid])
        u, inv = np.unique(pairs, axis=1, return_inverse=True)
        table = np.array([self._code(statics[int(s)], int(t)) for s, t in u.T.tolist()], np.int32)
        return table[inv.reshape(-1)]

    def _remember(self, key: tuple, code: int) -> None:
        """(signature key, thread id) -> code, in the dict and its arrays (``_PairCodes``)."""
        self._sig_by_sk[key] = code
        self._pairs.add(key[0], key[1], code)

    def _code(self, static: Static, tid: int) -> int:
        key = (static.sk, tid)
        code = self._sig_by_sk.get(key)
        if code is None:
            code = self._intern(dict(static.fields, tid=tid))
            self._remember(key, code)
        return code

    def note_read_stats(self, stats: Any) -> None:
        """Take the reader's running loss counts (``store.ReadStats``), so that diagnose() can
        tell an incomplete trace from a healthy one."""
        losses: dict[int, dict[str, int]] = {}
        for key, per_rank in (("damaged", stats.corrupt_by_rank), ("invalid", stats.invalid_by_rank),
                              ("missing", stats.missing_by_rank), ("unsettled", stats.unsettled_by_rank),
                              ("emptied", stats.emptied_by_rank), ("uncarried", stats.uncarried_by_rank),
                              ("refused", stats.refused_by_rank), ("unread", stats.unread_by_rank)):
            for r, n in per_rank.items():
                if n:
                    losses.setdefault(int(r), {})[key] = int(n)
        self.read_losses = losses

    def _ingest_chunk(self, events: list[Event], changed: set[int]) -> tuple[int, int]:
        """Ingest one chunk; add its ranks to ``changed``; return its (first, last) timestamp."""
        ranks = _column(map(_RANK_OF, events))
        got = self._chunk(events, ranks, changed)
        self._tally(ranks, None)  # (its ranks made now)
        return got

    def _tally(self, ranks: np.ndarray, counts: np.ndarray | None) -> None:
        """Count ``counts`` events (None: one each) to each of ``ranks`` (``events_of``): a
        numpy call a batch, none a stream (a rank with no slot, never made, apart)."""
        if not ranks.shape[0]:
            return
        slots = self.table.slots(ranks)
        if (slots < 0).any():  # (a rank past ``RANK_SLOTS``, or one no event of it made)
            for k in np.flatnonzero(slots < 0).tolist():
                r = int(ranks[k])
                if r in self.ranks:
                    slots[k] = self.ranks[r]._s
                else:
                    self._loose[r] = self._loose.get(r, 0) + (1 if counts is None else int(counts[k]))
            keep = slots >= 0
            ranks, slots, counts = ranks[keep], slots[keep], counts if counts is None else counts[keep]
        np.add.at(self.table.events, slots, 1 if counts is None else counts)

    def events_of(self, ranks: Iterable[int]) -> int:
        """The events read of ``ranks`` (every kind: ops' phases, heartbeats, samples, metas)."""
        n, loose = self.table.events, self._loose
        return sum((int(n[rt._s]) if (rt := self.ranks.get(r)) is not None else 0) + loose.get(r, 0) for r in ranks)

    def own_events(self) -> int:
        """The events of the job's own ranks, those ``kept_apart`` left out: what ``check``
        counts beside ``own_ops`` (``events`` counts every stream read)."""
        apart = self.kept_apart
        return self.events - self.events_of(apart) if apart else self.events

    def _chunk(self, events: list[Event], ranks: np.ndarray, changed: set[int]) -> tuple[int, int]:
        n = len(events)
        lo, hi = I64_MAX, 0
        dget = dict.get
        phase = np.fromiter(map(PHASE_CODE.get, map(dget, events, repeat("phase")), repeat(-1)), np.int8, n)
        ts = _column(map(_TS_OF, events))
        ids = _column(map(dget, events, repeat("id"), repeat(-1)))
        kind = np.fromiter(map(_KIND.get, map(dget, events, repeat("type")), repeat(K_OTHER)), np.int8, n)
        samples = _ChunkSamples.of(events, kind)
        if bool((phase < 0).all()) and bool((kind >= K_OTHER).all()):
            got = self._misc_only(events, ranks, changed)
            if got is not None:
                return got
        if bool((phase < 0).all()):
            live = kind <= K_HEARTBEAT
            if bool(live.all()):  # a live poll's: samples, heartbeats
                got = self._liveness_together(events, ranks, ts, kind, samples, changed)
                if got is not None:
                    return got
            elif 2 * int(np.count_nonzero(live)) >= n:
                # mostly those, and a meta or a group a rank (a poll's first round): they
                # together, the rest rank by rank (a rank's own way takes them apart too)
                got = self._liveness_apart(events, ranks, ts, kind, samples, live, changed)
                if got is not None:
                    return got
        for r, pos in _split_by_rank(ranks):
            rt = self._rank(r)
            ph = phase if pos is None else phase[pos]
            in_order = False
            begins = ph == PH_BEGIN
            if begins.any():
                again = self._reusing(rt, ids[_positions(pos, begins)])
                if again.any():  # (its phases paired in stream order: ``_ingest_cut``)
                    in_order = True
                    self.reused[r] = self.reused.get(r, 0) + int(np.count_nonzero(again))
            t0, t1, touched = self._rank_events(rt, events, pos, phase, ts, ids, kind, samples, in_order)
            if t1:
                lo, hi = min(lo, t0), max(hi, t1)
            self._seen(rt, t0, t1, touched)
            changed.add(r)
        return lo, hi

    def _rank_events(self, rt: RankTrace, events: list[Event], pos: np.ndarray | None, phase: np.ndarray,
                     ts: np.ndarray, ids: np.ndarray, kind: np.ndarray, samples: _ChunkSamples | None,
                     in_order: bool) -> tuple[int, int, int]:
        """A rank's events of a chunk (``pos``: their positions, None: all of it): its
        liveness, then its begins, then its other phases (``in_order``: paired with the
        begins in stream order, where one reuses an op id: ``_ingest_cut``); returns their
        (first, last) timestamp and the earliest begin among the ops added or changed."""
        ph = phase if pos is None else phase[pos]
        misc, begins, phases = ph < 0, ph == PH_BEGIN, ph > PH_BEGIN
        t0, t1 = I64_MAX, 0
        touched = I64_MAX
        bpos = _positions(pos, begins)
        opos = _positions(pos, phases)
        idx = self._in_order(rt, bpos, ids[bpos], opos, ids[opos]) if in_order else None
        if misc.any():
            t0, t1 = self._liveness(rt, events, pos, misc, kind if pos is None else kind[pos], ts, samples)
        if begins.any():
            a, b = self._begins(rt, _take(events, bpos), ts[bpos], ids[bpos], bpos if in_order else None)
            t0, t1 = min(t0, a), max(t1, b)
            touched = a
        if phases.any():
            a, b, first = self._phases(rt, ts[opos], ids[opos], phase[opos], _extras(_take(events, opos)), idx)
            t0, t1 = min(t0, a), max(t1, b)
            touched = min(touched, first)
        return t0, t1, touched

    def _misc_only(self, events: list[Event], ranks: np.ndarray, changed: set[int]) -> tuple[int, int] | None:
        """A chunk of neither ops nor heartbeats nor samples (a whole read's: each stream's
        meta), each rank's events as ``_ingest_chunk``'s way rank by rank takes them
        (``_liveness`` hands them all to ``_misc``), without its masks: ~15 us a rank of numpy
        calls on one row.  Returns its (first, last) timestamp."""
        lo, hi = I64_MAX, 0
        slots, firsts, lasts = [], [], []
        for r, pos in _split_by_rank(ranks):
            rt = self._rank(r)
            t0, t1 = self._misc(rt, events if pos is None else _take(events, pos))
            if t1:  # (as the general way: a rank whose times are all 0 sets no bound)
                lo, hi = min(lo, t0), max(hi, t1)
            slots.append(rt._s)
            firsts.append(t0)
            lasts.append(t1)
            changed.add(r)
        k = len(slots)  # (``_seen`` of each, at once: a first live round's metas are 16k ranks')
        self._seen_many(np.array(slots, np.int64), np.array(firsts, np.int64), np.array(lasts, np.int64),
                        np.full(k, I64_MAX, np.int64))
        return lo, hi

    def _liveness_apart(self, events: list[Event], ranks: np.ndarray, ts: np.ndarray, kind: np.ndarray,
                        samples: _ChunkSamples | None, live: np.ndarray, changed: set[int]) -> tuple[int, int] | None:
        """``_ingest_chunk`` of a chunk of no ops, mostly heartbeats and samples: those
        together (``_liveness_together``), then the others (metas, groups, stacks ...) rank
        by rank, as ``_liveness`` takes a rank's apart (heartbeats and samples in columns,
        the rest one by one).  None, nothing done, where they cannot go together."""
        if int(ranks.min()) < 0 or int(ranks.max()) >= RANK_SLOTS:
            return None
        uniq = np.unique(ranks)
        for r in uniq[self.table.slots(uniq) < 0].tolist():  # (ranks made in rank order, as rank by rank)
            self._rank(r)
        at, rest = np.flatnonzero(live), np.flatnonzero(~live)
        sub = None if samples is None else samples._replace(slot=samples.slot[at])
        got = self._liveness_together(_take(events, at), ranks[at], ts[at], kind[at], sub, changed)
        if got is None:
            return None  # (it changed nothing: the caller goes rank by rank)
        lo, hi = got
        seen = set(ranks[at].tolist())
        for r, pos in _split_by_rank(ranks[rest]):
            rt = self._rank(r)
            t0, t1 = self._misc(rt, _take(events, rest if pos is None else rest[pos]))
            if t1:
                lo, hi = min(lo, t0), max(hi, t1)
            if r not in seen:
                self._seen(rt, t0, t1, I64_MAX)
            elif t1:  # (seen once in this chunk already, as rank by rank sees a rank once)
                rt.first_ts = min(rt.first_ts, t0)
                rt.last_ts = max(rt.last_ts, t1)
            changed.add(r)
        return lo, hi

    def _liveness_together(self, events: list[Event], ranks: np.ndarray, ts: np.ndarray, kind: np.ndarray,
                           samples: _ChunkSamples | None, changed: set[int]) -> tuple[int, int] | None:
        """``_ingest_chunk`` of a chunk of heartbeats and samples only (what a live poll's
        events are, one or two a rank): what rank by rank leaves, in arrays (every rank's
        latest heartbeat, a sample a rank), with a step a rank only for one with several
        samples or a GPU error.  None: a rank beyond the table's slots (the caller goes rank
        by rank)."""
        uniq, inv = np.unique(ranks, return_inverse=True)
        inv = inv.reshape(-1)
        if int(uniq[0]) < 0 or int(uniq[-1]) >= RANK_SLOTS:
            return None
        t = self.table
        slot = t.slots(uniq)
        for r in uniq[slot < 0].tolist():  # (ranks made in rank order, as rank by rank)
            self._rank(r)
        slot = t.slots(uniq)
        if (slot < 0).any():  # (a rank far past the others has no slot in the array)
            return None
        order = np.argsort(inv, kind="stable")
        starts = np.flatnonzero(np.r_[True, inv[order][1:] != inv[order][:-1]])
        t0 = np.minimum.reduceat(ts[order], starts)
        t1 = np.maximum.reduceat(ts[order], starts)
        # per rank (its place in ``uniq``): its latest heartbeat, the last of equals, and its
        # sample where it has one (-1: none); a rank with several samples takes them apart
        k = uniq.shape[0]
        beat_row = np.full(k, -1, np.int64)
        hb = np.flatnonzero(kind == K_HEARTBEAT)
        if hb.shape[0]:
            last = hb[np.lexsort((hb, ts[hb], inv[hb]))]
            ends = np.flatnonzero(np.r_[inv[last][1:] != inv[last][:-1], True])
            beat_row[inv[last[ends]]] = last[ends]
        sample_row = np.full(k, -1, np.int64)
        several: dict[int, list[int]] = {}
        if samples is not None:
            rows = np.flatnonzero(samples.slot >= 0)
            counts = np.bincount(inv[rows], minlength=k)
            one = counts[inv[rows]] == 1
            sample_row[inv[rows[one]]] = rows[one]
            for j, at in zip(inv[rows[~one]].tolist(), rows[~one].tolist(), strict=True):
                several.setdefault(j, []).append(at)
        beat = np.flatnonzero(beat_row >= 0)
        if beat.shape[0]:
            at = beat_row[beat]
            t.beat(slot[beat], ts[at], np.fromiter((events[b].get("inflight", 0) for b in at.tolist()), np.int64,
                                                   at.shape[0]))
        traces = t.traces
        if samples is not None:  # (a rank's samples are its own: the ranks in any order)
            one = np.flatnonzero(sample_row >= 0)
            if one.shape[0]:  # (a sample a rank: appended for all at once)
                at = sample_row[one]
                rows = samples.slot[at]
                evs = [events[a] for a in at.tolist()]
                t.sample_rows.append(slot[one], np.ones(one.shape[0], np.int64),
                                     np.column_stack([samples.cols[f][rows] for f in SAMPLE_FIELDS]), evs)
                for s, e in zip(slot[one].tolist(), evs, strict=True):
                    if e.get("gpu_error"):
                        traces[s].samples.note_gpu_error([e])
            for j, rows in several.items():
                at = samples.slot[rows]
                traces[int(slot[j])].samples.add([events[i] for i in rows], {f: c[at] for f, c in samples.cols.items()})
        self._seen_many(slot, t0, t1, np.full(slot.shape[0], I64_MAX, np.int64))
        changed.update(uniq.tolist())
        return int(t0.min()), int(t1.max())

    def _beats(self, beats: Beats, changed: set[int]) -> tuple[int, int]:
        """Streams' heartbeats and samples in columns (``beats.Beats``), as ``_liveness``
        takes them as events: each stream's latest heartbeat, its samples appended, its first
        and last times seen.  Written for all streams at once (a poll's: 16k of them a
        second), their samples too (``SampleRows.append``); a read where a rank has several
        entries, or one past the table's slots, goes stream by stream.  Returns their
        (first, last) timestamp."""
        ranks = beats.rank
        t = self.table
        slots = t.slots(ranks)
        if (slots < 0).any() or np.unique(slots).shape[0] != slots.shape[0]:
            return self._beats_apart(beats, changed)
        beat = np.flatnonzero(beats.beat_ts >= 0)
        if beat.shape[0]:
            t.beat(slots[beat], beats.beat_ts[beat], beats.inflight[beat])
        start = beats.start
        counts = np.diff(start)
        some = np.flatnonzero(counts)
        if some.shape[0]:  # (the entries' rows, in their order: those with none have none)
            cols = beats.cols
            rows = np.column_stack([np.asarray(cols[f], np.float64)[start[0]:start[-1]] for f in SAMPLE_FIELDS])
            t.sample_rows.append(slots[some], counts[some], rows, [beats.last[k] for k in some.tolist()])
        self._seen_many(slots, beats.t0, beats.t1, np.full(slots.shape[0], I64_MAX, np.int64))
        changed.update(ranks.tolist())
        return int(beats.t0.min()), int(beats.t1.max())

    def _beats_apart(self, beats: Beats, changed: set[int]) -> tuple[int, int]:
        """``_beats`` stream by stream, in order."""
        cols, start = beats.cols, beats.start.tolist()
        for k, (r, t0, t1, bt, inflight) in enumerate(zip(beats.rank.tolist(), beats.t0.tolist(), beats.t1.tolist(),
                                                          beats.beat_ts.tolist(), beats.inflight.tolist(),
                                                          strict=True)):
            rt = self._rank(r)
            if bt >= 0:
                rt.beat(bt, inflight)
            a, b = start[k], start[k + 1]
            last = beats.last[k]
            if b > a and last is not None:
                rt.samples.extend({f: c[a:b] for f, c in cols.items()}, last)
            self._seen(rt, t0, t1, I64_MAX)
            changed.add(r)
        return int(beats.t0.min()), int(beats.t1.max())

    def _liveness(self, rt: RankTrace, events: list[Event], pos: np.ndarray | None, misc: np.ndarray,
                  kind: np.ndarray, ts: np.ndarray, samples: _ChunkSamples | None) -> tuple[int, int]:
        """A rank's events other than ops (``misc``): its heartbeats and samples, most of
        them, in columns; the rest one by one (``_misc``).  Returns their (first, last)
        timestamp, a retention summary's left out."""
        t0, t1 = I64_MAX, 0
        own = ts if pos is None else ts[pos]
        timed = misc & (kind != K_SUMMARY)
        if timed.any():
            t0, t1 = int(own[timed].min()), int(own[timed].max())
        beats = misc & (kind == K_HEARTBEAT)
        if beats.any():
            bts = own[beats]
            top = int(bts.max())
            if top >= rt.last_hb:  # (the event is looked up only then)
                rt.beat(top, events[int(_positions(pos, beats)[np.flatnonzero(bts == top)[-1]])].get("inflight", 0))
        sampled = misc & (kind == K_SAMPLE)
        if sampled.any() and samples is not None:
            rows = _positions(pos, sampled)
            at = samples.slot[rows]
            rt.samples.add(_take(events, rows), {f: c[at] for f, c in samples.cols.items()})
        rest = misc & (kind >= K_OTHER)
        if rest.any():
            a, b = self._misc(rt, _take(events, _positions(pos, rest)))
            t0, t1 = min(t0, a), max(t1, b)
        return t0, t1

    def _misc(self, rt: RankTrace, evs: Sequence[dict]) -> tuple[int, int]:
        samples = []
        t0, t1 = I64_MAX, 0
        for e in evs:
            ts = e["ts"]
            t = e["type"]
            if t != "summary":  # (a deleted segment's: history, not part of what the trace shows)
                t0 = min(t0, ts)
                t1 = max(t1, ts)
            if t == "heartbeat":
                rt.beat(ts, e.get("inflight", 0))
            elif t == "sample":
                samples.append(e)
            elif t == "group":
                name = str(e.get("group"))
                granks = e.get("granks")
                said = self._said_groups.setdefault(name, {})
                who = _stream_of(rt.meta)
                if who not in said and isinstance(granks, list):  # (a statement per stream's run, kept)
                    said[who] = [int(x) for x in granks]
                    if name not in self.groups and rt.rank not in self._apart:
                        self._adopt(name, who)
                if isinstance(granks, list) and granks:  # (each rank's, first: ``find_group_disagreements``)
                    views = self.group_views.setdefault(name, {}).setdefault(who, {})
                    if rt.rank not in views:
                        fp = members_print(granks)
                        if views and fp != next(iter(views.values())):
                            self.group_disputes.add((name, who))
                        views[rt.rank] = fp
                        if (name, who, fp) not in self.group_members_of:  # (built once a fingerprint)
                            self.group_members_of[name, who, fp] = [int(x) for x in granks]
                if e.get("backend"):
                    self.group_backend[name] = e["backend"]
                passed = e.get("channels")
                rows = None
                if passed:  # (as rows: a rank may state thousands, and thousands of ranks do)
                    peer = np.array([c[0] for c in passed], np.int64)
                    send = np.array([c[1] == "send" for c in passed])
                    rows = np.stack([np.where(send, rt.rank, peer), np.where(send, peer, rt.rank), ~send,
                                     np.array([c[2] for c in passed], np.int64)], axis=1)
                history = histories.History.of_event(e)
                carried = CarriedHistory(history, ts) if history is not None else None
                if rows is None and carried is None:
                    continue
                if rt.rank in self._apart:  # (a foreign stream's: not this run's, kept aside for if it stops being foreign)
                    self._stated_apart.setdefault(rt.rank, []).append(Stated(name, rows, carried))
                else:
                    self._take_stated(rt.rank, Stated(name, rows, carried))
            elif t == "stack":
                rt.stacks[e.get("id", -1)] = e
                rt.captures.append(e)
                if len(rt.captures) > 16:
                    del rt.captures[0]
                if rt.last_stack is None or ts >= rt.last_stack["ts"]:
                    rt.last_stack = e
                if e.get("reason") == "request" and isinstance(e.get("request_ns"), int):
                    self.request_ns = max(self.request_ns, e["request_ns"])
            elif t == "exit":
                rt.exits.append(e)
                self.exits_seen += 1
            elif t == "summary":  # a deleted segment, as retention kept it
                rt.summaries.append(e)
            elif t == "meta":
                rt.meta = e
                self._metas_seen += 1
            elif t == "dropped":  # count: this report; total: the recorder's running total
                if str(e.get("reason", "")).startswith(FR_OVERWRITE):
                    rt.fr_overwritten = running_drops(rt.fr_overwritten, e)
                else:
                    was, rt.dropped = rt.dropped, running_drops(rt.dropped, e)
                    if rt.dropped > was and e.get("reason"):
                        rt.drop_reason = str(e["reason"])[:DROP_REASON_CHARS]
        if samples:
            rt.samples.add(samples)
        return t0, t1

    def _intern(self, e: dict) -> int:
        get = e.get
        k = tuple(map(get, _SIG_KEYS))
        lists = tuple(map(get, _SIG_LISTS))
        ins, outs, idt, odt = lists
        cands = self._sig_cache.get(k)
        if cands is not None:
            for c in cands:
                if c[0] == lists:
                    return c[1]
        code = len(self.sigs)
        op = str(k[0] or optable.UNNAMED)
        src = k[7]
        direction = k[8]
        sig = Sig(code, op, str(k[1] if k[1] is not None else "?"), k[2], k[3], k[4], bool(k[5]), bool(k[6]),
                  src, direction, k[9], histories.shapes(ins), tuple(idt or ()), int(k[10] or 0), histories.shapes(outs),
                  tuple(odt or ()), int(k[11] or 0), k[12], k[13])
        flags = 0
        if sig.is_async:
            flags |= ASYNC
        if sig.nested:
            flags |= NESTED
        if src == "fr":
            flags |= FR
            sig.space = SPACE_FR
        if sig.device is not None:
            flags |= DEVICE
        kind = histories.kind_of(op, direction, sig.nested)
        if kind == histories.P2P:
            flags |= P2P | (SEND if direction == "send" else RECV if direction == "recv" else 0)
        elif kind == histories.CONTAINER:
            flags |= CONTAINER
        elif kind == histories.COLLECTIVE:
            flags |= COLL
        sig.flags = flags
        mk = sig.match_key()
        sig.match = self._match_codes.setdefault(mk, len(self._match_codes))
        if sig.match == len(self._match_hashes):
            self._match_hashes.append(histories.key_hash(mk))
        self.sigs.append(sig)
        if op == optable.UNNAMED:
            self._unnamed.append(code)
        if code >= self._sig_flags.shape[0]:
            self._sig_flags = grown(self._sig_flags, code + 1)
            self._sig_match = grown(self._sig_match, code + 1)
            self._sig_gkey = grown(self._sig_gkey, code + 1)
        self._sig_flags[code] = flags
        self._sig_match[code] = sig.match
        self._sig_gkey[code] = self._gkeys.setdefault((sig.space, sig.group), len(self._gkeys))
        self._sig_cache.setdefault(k, []).append((lists, code))
        return code

    def _reusing(self, rt: RankTrace, ids: np.ndarray) -> np.ndarray:
        """Which of a rank's begins (``ids``, in stream order, none in the model yet) reuse
        an op id (``opids``): by comparisons alone where they rise from above its highest."""
        top = int(self.table.top_id[rt._s]) if rt.n else opids.NONE
        if ids[0] > top and (ids.shape[0] == 1 or bool((ids[1:] > ids[:-1]).all())):
            return np.zeros(ids.shape[0], np.bool_)
        known = rt.lookup(ids) >= 0 if rt.n else np.zeros(ids.shape[0], np.bool_)
        return opids.repeated(ids, known, set())

    def _begins(self, rt: RankTrace, begin_events: Sequence[dict], ts: np.ndarray, ids: np.ndarray,
                at: np.ndarray | None = None) -> tuple[int, int]:
        """Begin events of a rank (``at``: their places in the stream, where their parents
        are paired in stream order: ``_rank_events``)."""
        self._raise_top(rt, ids)
        dget = dict.get
        k = len(begin_events)
        by_sk = self._sig_by_sk
        try:  # the recorder's key of the static fields (events.signature_key): one lookup per begin
            keys = list(zip(map(dget, begin_events, repeat("sk")), map(dget, begin_events, repeat("tid")), strict=True))
            codes = np.fromiter(map(by_sk.get, keys, repeat(-1)), np.int32, k)
        except TypeError:  # an unhashable tid: a foreign or damaged trace
            keys = [(None, None)] * k
            codes = np.full(k, -1, np.int32)
        for j in np.flatnonzero(codes < 0).tolist():
            key = keys[j]
            code = by_sk.get(key, -1) if key[0] is not None else -1
            if code < 0:  # a signature key not seen yet (or none): intern the fields
                code = self._intern(begin_events[j])
                if key[0] is not None:
                    self._remember(key, code)
            codes[j] = code
        seq = _ints(list(map(dget, begin_events, repeat("seq"), repeat(-1))))
        peer = _ints(list(map(dget, begin_events, repeat("peer"), repeat(-1))))
        parents = _ints(list(map(dget, begin_events, repeat("parent"), repeat(-1))))
        resolved = self._parents_in_order(rt, at, ids, parents) if at is not None else None
        return self._add_ops(rt, ts, ids, codes, seq, peer, parents, resolved)

    def _add_ops(self, rt: RankTrace, ts: np.ndarray, ids: np.ndarray, codes: np.ndarray, seq: np.ndarray,
                 peer: np.ndarray, parents: np.ndarray, resolved: np.ndarray | None = None) -> tuple[int, int]:
        """Append begun ops to a rank's columns and the cross-rank indexes (``parents``: op
        ids, -1: none; ``resolved``: their ops, paired in stream order, else the ops of
        those ids once these are in); returns the (first, last) begin of the rank so far."""
        k = ts.shape[0]
        n0 = rt.n
        n1 = n0 + k
        rt.reserve(n1)
        rt.begin[n0:n1] = ts
        rt.id[n0:n1] = ids
        rt.sig[n0:n1] = codes
        rt.seq[n0:n1] = seq
        rt.peer[n0:n1] = peer
        idx = np.arange(n0, n1, dtype=np.int32)
        rt.map_ids(ids, idx)
        rt.align(ids, n0)
        has_parent = parents >= 0
        if has_parent.any():
            rt.parent[n0:n1][has_parent] = rt.lookup(parents[has_parent]) if resolved is None else resolved[has_parent]
            self.table.parents[rt._s] = True
        if rt._sorted and (ts[0] < rt._last_begin or (k > 1 and bool((np.diff(ts) < 0).any()))):
            rt._sorted = False
        rt._last_begin = max(rt._last_begin, int(ts.max()))
        rt.last_op_ts = max(rt.last_op_ts, rt._last_begin)
        rt.n = n1
        rt.open.update(range(n0, n1))
        self._index(rt, n0, n1)
        return int(ts.min()), rt._last_begin

    def _index(self, rt: RankTrace, n0: int, n1: int) -> None:
        """Add ops [n0, n1) of a rank to the collective and p2p indexes (none of a rank kept
        apart: ``_keep_apart``)."""
        if rt.rank in self._apart:
            return
        sig = rt.sig[n0:n1]
        flags = self._sig_flags[sig]
        seq = rt.seq[n0:n1]
        idx = np.arange(n0, n1, dtype=np.int32)
        coll = ((flags & COLL) != 0) & (seq >= 0)
        if coll.any():
            csig, cseq, cidx = sig[coll], seq[coll], idx[coll]
            gk = self._sig_gkey[csig]
            present = [int(gk[0])] if bool((gk == gk[0]).all()) else np.flatnonzero(np.bincount(gk)).tolist()
            names = list(self._gkeys)
            for g in present:
                m = gk == g if len(present) > 1 else slice(None)
                gi = self._group_index(*names[g])
                gi.seqs.put(cseq[m], gi.column(rt.rank), cidx[m])
        p2p = ((flags & P2P) != 0) & (seq >= 0) & (rt.peer[n0:n1] >= 0) & ((flags & NESTED) == 0)
        if p2p.any():
            psig, ppeer, pseq, pidx = sig[p2p], rt.peer[n0:n1][p2p], seq[p2p], idx[p2p]
            key = psig.astype(np.int64) * (1 << 32) + ppeer
            uniq = np.unique(key).tolist()
            for kv in uniq:
                m = key == kv if len(uniq) > 1 else slice(None)
                self._channel(rt.rank, kv >> 32, kv & 0xFFFFFFFF).put(pseq[m], *self._side(kv >> 32), pidx[m])

    def _side(self, code: int) -> tuple[int]:
        return (0 if self.sigs[code].flags & SEND else 1,)

    def _channel(self, rank: int, code: int, peer: int) -> SeqIndex:
        s = self.sigs[code]
        key = (s.space, s.group, rank, peer) if s.flags & SEND else (s.space, s.group, peer, rank)
        ch = self.p2p.get(key)
        if ch is None:
            ch = self.p2p[key] = SeqIndex(2)
        return ch

    def _index_p2p(self, rt: RankTrace, i: int) -> None:
        if rt.rank in self._apart:
            return
        code = int(rt.sig[i])
        self._channel(rt.rank, code, int(rt.peer[i])).put(np.array([rt.seq[i]]), *self._side(code),
                                                           np.array([i], np.int32))

    def _group_index(self, space: int, group: str) -> GroupIndex:
        gi = self.coll.get((space, group))
        if gi is None:
            gi = self.coll[(space, group)] = GroupIndex(group, space, self.groups.get(group, []))
        return gi

    def _phases(self, rt: RankTrace, ts: np.ndarray, ids: np.ndarray, ph: np.ndarray,
                extras: list[PhaseExtra], idx: np.ndarray | None = None) -> tuple[int, int, int]:
        """Apply phases (``ph``) to the ops they name (``idx``: each one's op, where already
        paired; else the op of its id); ``extras``: what some say beyond their time
        (exception, approximate end, device time, resolved source).  Returns the (first,
        last) timestamp of the phases and the earliest begin among the ops changed."""
        if idx is None:
            idx = rt.lookup(ids)
        ok = idx >= 0
        for code, col in ((PH_END, rt.end), (PH_WAIT_BEGIN, rt.wb), (PH_WAIT_END, rt.we), (PH_DONE, rt.done)):
            m = ok & (ph == code)
            if m.any():
                col[idx[m]] = ts[m]
        self._apply_extras(rt, idx, extras)
        if (ph == PH_DONE).any():
            rt.device_seen = True
            rt.flags[idx[ok & (ph == PH_DONE)]] |= DONE
        updated = idx[ok & (ph != PH_WAIT_BEGIN)]  # an op may come twice (end and wait_end): harmless below
        if updated.shape[0]:
            self._complete(rt, updated)
        first = int(rt.begin[idx[ok]].min()) if ok.any() else I64_MAX
        return int(ts.min()), int(ts.max()), first

    def _apply_extras(self, rt: RankTrace, idx: np.ndarray, extras: list[PhaseExtra]) -> None:
        """What phases say beyond their time (``idx``: the op index of each phase row)."""
        for x in extras:
            i = int(idx[x.row])
            if i < 0:
                continue
            if x.exc is not None:
                rt.flags[i] |= EXC if x.end else WAIT_EXC
                if i not in rt.exc:  # (its first text stays: a retention summary's says less, ``retention.RAISED``)
                    self.failed.append((rt.rank, i))
                    rt.exc[i] = x.exc
            if x.approx:
                rt.flags[i] |= APPROX
            if x.gpu is not None:
                rt.gpu[i] = x.gpu
            if x.unissued and x.end and x.exc is not None:
                self._unissue(rt, i)
            if x.end and x.peer is not None and rt.peer[i] < 0 and self._sig_flags[rt.sig[i]] & (P2P | SEND) == P2P:
                rt.peer[i] = x.peer  # an any-source recv resolved (a source on any other op: refused)
                if x.seq >= 0:
                    rt.seq[i] = x.seq
                    if not self._sig_flags[rt.sig[i]] & NESTED:
                        self._index_p2p(rt, i)

    def _take_stated(self, rank: int, s: Stated) -> None:
        """What a group event of ``rank`` stated of the group ``s.group`` (channels passed,
        its carried history: the latest said stands) into ``p2p_passed`` and ``histories``."""
        if s.rows is not None:
            self.p2p_passed.setdefault(s.group, []).append(s.rows)
        if s.history is not None:
            per = self.histories.setdefault(s.group, {})
            was = per.get(rank)
            if was is None or s.history.ts >= was.ts:
                per[rank] = s.history
                self._retract(s.group, rank)

    def _retract(self, group: str, rank: int) -> None:
        """A rank's carried history of a group without the collectives whose number was
        withdrawn (``_unissue``: a segment ended between such an op's begin and its end,
        and the carry counted it as its last), whichever of the two came first
        (``histories.withdrawn``)."""
        gone = self.withdrawn.get((group, rank))
        per = self.histories.get(group)
        was = per.get(rank) if gone and per else None
        if was is None:
            return
        del self.withdrawn[(group, rank)]  # (each comes off one history: the carry read before its end)
        history: histories.History | None = was.history
        for seq, khash in sorted(gone.items(), reverse=True):
            history = histories.withdrawn(history, seq, khash)
            if history is None:
                del per[rank]
                return
        if history != was.history:
            per[rank] = CarriedHistory(history, was.ts)

    def _unissue(self, rt: RankTrace, i: int) -> None:
        """Op ``i`` of a rank was refused by the backend as it was called (its end says so,
        ``F_UNISSUED``): it took no seq.  The recorder writes its begin without one, unless
        its drain took the begin first; then it is withdrawn here, and the op leaves the
        indexes where it still holds its seq's place (the rank's next op of the same counter,
        which took the same number, may have taken it already)."""
        seq = int(rt.seq[i])
        if seq < 0:
            return
        code = int(rt.sig[i])
        flags = int(self._sig_flags[code])
        rt.seq[i] = -1
        if flags & NESTED:
            return
        if flags & COLL:
            s = self.sigs[code]
            if s.space == SPACE_NATIVE:
                self.withdrawn.setdefault((s.group, rt.rank), {})[seq] = int(self.sig_hashes(np.array([code]))[0])
                self._retract(s.group, rt.rank)
            gi = self.coll.get((s.space, s.group))
            index, col = (gi.seqs, gi.col.get(rt.rank)) if gi is not None else (None, None)
        elif flags & P2P and rt.peer[i] >= 0:
            index, col = self._channel(rt.rank, code, int(rt.peer[i])), self._side(code)[0]
        else:
            return
        row = index.get(seq) if index is not None and col is not None else None
        if row is not None and row[col] == i:
            row[col] = -1

    def _completion(self, sig: np.ndarray, end: np.ndarray, we: np.ndarray, done: np.ndarray,
                    op_flags: np.ndarray, comp: np.ndarray) -> np.ndarray:
        """Completion times from ops' columns (``comp``: the ones they have): the rule of
        ``oprecords.completes`` (which the stores use without the model), vectorized.  A
        completion inferred from a parent's end (``INFERRED``) stays until the op's own
        phases complete it: a phase that does not (an async op's end) reopens nothing."""
        kept = np.where((op_flags & INFERRED) != 0, comp, 0)
        signature_flags = self._sig_flags[sig]
        comp = np.where((signature_flags & ASYNC) != 0, we, end)
        failed = (op_flags & EXC) != 0
        comp = np.where(failed & (comp == 0), end, comp)
        dev = (signature_flags & DEVICE) != 0
        comp = np.where(dev & (done > 0), done, np.where(dev & ~failed, 0, comp))
        comp = np.where((~dev) & (done > 0) & (comp > 0), np.maximum(comp, done), comp)
        return np.where(comp == 0, kept, comp)

    def _complete(self, rt: RankTrace, updated: np.ndarray) -> None:
        """Recompute the completion times of ops whose phases changed."""
        comp = self._completion(rt.sig[updated], rt.end[updated], rt.we[updated], rt.done[updated],
                                rt.flags[updated], rt.comp[updated])
        rt.comp[updated] = comp
        if comp.shape[0]:
            rt.last_comp = max(rt.last_comp, int(comp.max()))
        finished = updated[comp > 0].tolist()
        if len(finished) < updated.shape[0]:  # (a completion back to 0 or below: open again)
            rt.open.update(updated[comp <= 0].tolist())
        if finished:
            rt.open.difference_update(finished)
            self._close_nested(rt)

    def _close_nested(self, rt: RankTrace) -> None:
        """Nested ops (inner traffic of a logical op) end at the latest when their parent ends.
        In index order: a parent, begun before its inner ops, is judged first (a nested op
        inside a nested op closes in the same pass)."""
        for i in sorted(rt.open):
            p = int(rt.parent[i])
            if p >= 0 and rt.comp[p] > 0 and self._sig_flags[rt.sig[i]] & NESTED:
                rt.comp[i] = max(int(rt.comp[p]), int(rt.begin[i]))
                rt.flags[i] |= INFERRED
                rt.open.discard(i)

    def view(self, now: int | None = None, states: dict[int, RankState] | None = None) -> ModelView:
        """Publish the model as it stands: an immutable ``ModelView`` (see ``RankView`` for
        what stays shared).  Builds the lazy per-rank caches (begin order, running max of
        ends) here, on the writer's side, so readers of the view never write.  ``states``:
        each rank's state at ``now``, as the caller judged it (``rankstate.rank_states``).
        Costs the ranks changed since the last view."""
        foreign = self.foreign_streams  # (first: finding one may move the version on)
        old = self._published
        self.table.views()
        ranks = {r: rt._view for r, rt in self.ranks.items()}
        sigs = old.sigs if len(old.sigs) == len(self.sigs) else tuple(self.sigs)
        table = old.flag_table
        if table.shape[0] != len(sigs):
            table = self._sig_flags[: len(sigs)].copy()
            table.flags.writeable = False
        v = self._published = ModelView(self.version, self.start_ns, self.end_ns, ranks, sigs, table,
                                        now or 0, states or {}, foreign, tuple(self._touches), self.lineage)
        return v

    # ------------------------------------------------------------------ queries
    def rank_ids(self) -> list[int]:
        return sorted(self.ranks)

    @property
    def world_size(self) -> int:
        said = self.said_world_size
        if said is not None:
            return said
        apart = self.foreign_streams
        own = [r for r in self.ranks if r not in apart]
        return max(own) + 1 if own else 0

    @property
    def said_world_size(self) -> int | None:
        """The world size where a rank's ``meta`` says it (never below the ranks seen); None
        where none does: a rank past those seen may then be one that recorded nothing.  A
        foreign stream (``foreign_streams``) says nothing of it, nor counts as a rank seen.
        Once per version (every rank's meta is looked at; each failed p2p instance asks)."""
        apart = self.foreign_streams  # (first: it may move the version on)
        if self._said_world[0] != self.version:
            own = [r for r in self.ranks if r not in apart] if apart else self.ranks
            ws = [int(rt.meta["world_size"]) for r in own
                  if (rt := self.ranks[r]).meta and isinstance(rt.meta.get("world_size"), int)]
            self._said_world = (self.version, max([max(own) + 1, *ws]) if ws else None)
        return self._said_world[1]

    def note_job(self, job: Mapping[str, Any] | None) -> None:
        """Take the store's job metadata (a reader's ``job()``): what ``foreign_streams``
        compares each stream's meta with before the vote of the metas."""
        ref = JobReference.of(job)
        if ref != self.reference:
            self.reference = ref
            self._foreign = (-1, {})

    @property
    def foreign_streams(self) -> dict[int, Foreign]:
        """The ranks whose stream is not of the run the others are, with why (``runs.foreign``,
        typed: ``Foreign.cause``, its ``message`` made of it:
        its meta names another job, or, at its incarnation, another run of the job or a world
        size its rank is past, against the store's job metadata, ``note_job``, else what most
        ranks' metas say).  They are kept out of the matching (``_keep_apart``): their ops
        match none of the job's, and the job's groups are what its own streams state.
        Looked at again only when a meta (or the job metadata) came (each rank's: ~8 ms at 4k
        ranks, which a live console's every judgement paid when it was once per model
        version)."""
        if self._foreign[0] != self._metas_seen:
            metas = {r: rt.meta for r in sorted(self.ranks) if (rt := self.ranks[r]).meta}
            out = runs.foreign(metas, self.reference)
            self._foreign = (self._metas_seen, out)
            if out.keys() != self._apart:
                self._keep_apart(frozenset(out))
        return self._foreign[1]

    @property
    def kept_apart(self) -> frozenset[int]:
        """The ranks of ``foreign_streams``: no detector looks at their waits or failures."""
        _ = self.foreign_streams
        return self._apart

    def _adopt(self, name: str, who: tuple) -> None:
        """The members of group ``name`` are what a stream of ``who`` (job, run,
        incarnation) stated: the groups' indexes take them (ops may have come first)."""
        self.groups[name] = self._said_groups[name][who]
        self._group_by[name] = who
        for space in (SPACE_NATIVE, SPACE_FR):
            gi = self.coll.get((space, name))
            if gi is not None:  # ops came first: adopt the real membership
                for r in self.groups[name]:
                    gi.add_member(r)

    def _keep_apart(self, apart: frozenset[int]) -> None:
        """Make the matching agree with ``foreign_streams``: a rank found foreign leaves the
        collective and p2p indexes (and what its group events stated: the members of a
        group, channels and histories carried: kept aside, ``_stated_apart``), a rank no
        longer foreign enters them again, with what its group events stated while it was
        apart (a console's vote that turned).  Rare (a stream found
        foreign, the vote changed), so it rebuilds what it touches; the version moves on."""
        out, back = apart - self._apart, self._apart - apart
        self._apart = apart
        if out:
            for key, gi in list(self.coll.items()):
                if not out.isdisjoint(gi.col):
                    self.coll[key] = self._without(gi, out)
            for key, ch in list(self.p2p.items()):
                _, _, src, dst = key
                if src in out or dst in out:
                    kept = SeqIndex(2)
                    rows, seqs = ch.rows(), ch.keys[: ch.n]
                    for side, r in ((0, src), (1, dst)):
                        has = rows[:, side] >= 0
                        if r not in out and has.any():
                            kept.put(seqs[has], side, rows[has, side])
                    if kept.n:
                        self.p2p[key] = kept
                    else:
                        del self.p2p[key]
            for name, parts in self.p2p_passed.items():
                kept = []
                for p in parts:
                    stater = np.where(p[:, 2] == 0, p[:, 0], p[:, 1])
                    theirs = np.isin(stater, list(out))
                    for r in np.unique(stater[theirs]).tolist():  # (kept aside: it may stop being foreign)
                        self._stated_apart.setdefault(r, []).append(Stated(name, p[stater == r], None))
                    if not theirs.all():
                        kept.append(p[~theirs])
                self.p2p_passed[name] = kept
            self._passed_index.clear()
            for name, per in list(self.histories.items()):
                for r in out & per.keys():
                    self._stated_apart.setdefault(r, []).append(Stated(name, None, per.pop(r)))
                if not per:  # (no group's history is said by nobody: ``find_history_mismatches`` votes)
                    del self.histories[name]
        own = {_stream_of(rt.meta) for r, rt in self.ranks.items() if r not in apart}
        for name, said in self._said_groups.items():
            if name in self.groups and self._group_by.get(name) in own:
                continue
            pick = next((who for who in said if who in own), None)
            if pick is not None:
                self._adopt(name, pick)
            elif name in self.groups:
                del self.groups[name], self._group_by[name]
        for key, gi in list(self.coll.items()):  # (members as the groups now say)
            if set(gi.members) - set(self.groups.get(gi.name, ())) - set(gi.ranks):
                self.coll[key] = self._without(gi, frozenset())
        for r in sorted(back):
            rt = self.ranks.get(r)
            if rt is not None and rt.n:
                self._index(rt, 0, rt.n)
            for s in self._stated_apart.pop(r, ()):  # (what it stated while it was apart, in order)
                self._take_stated(r, s)
        if back:
            self._passed_index.clear()
        self.version += 1
        self._touched(I64_MIN)

    def _without(self, gi: GroupIndex, out: frozenset[int]) -> GroupIndex:
        """A group's index made again without the columns of the ranks ``out``, its members
        as ``groups`` says with the ranks that ran its ops."""
        new = GroupIndex(gi.name, gi.space, self.groups.get(gi.name, []))
        rows, seqs = gi.seqs.rows(), gi.seqs.keys[: gi.seqs.n]
        for c, r in enumerate(gi.ranks):
            has = rows[:, c] >= 0
            if r not in out and has.any():
                new.seqs.put(seqs[has], new.column(r), rows[has, c])
        return new

    def settle(self) -> None:
        """Put the ranks in rank order (what a whole read ends with: the order a read came in,
        streams in parallel or taking turns, must not show in what is judged of them)."""
        if list(self.ranks) != sorted(self.ranks):
            self.ranks = dict(sorted(self.ranks.items()))

    def nbytes(self) -> int:
        """Bytes the model's arrays hold (their capacity; of the samples' shared block, the
        rows handed out: ``SampleRows.nbytes``): what the console bounds."""
        shared: dict[int, int] = {}
        total = sum(rt.nbytes(shared) for rt in self.ranks.values()) + sum(shared.values()) + self.table.nbytes()
        total += sum(gi.seqs.mat.nbytes + gi.seqs.keys.nbytes + gi.colmap.nbytes for gi in self.coll.values())
        return total + sum(ch.mat.nbytes + ch.keys.nbytes for ch in self.p2p.values())

    def op_rate(self, since_ns: int | None = None) -> float:
        """Ops a second the job adds, from each rank's own ops from ``since_ns`` on (a window's
        start: the ops its carry holds began before it, and its meta and group events bear
        their first times): a rank's ops over their span, the median over the job's ranks
        with two or more (one rank's two ops a microsecond apart does not make it; at most
        ``RATE_SAMPLE`` ranks, evenly spread, are asked), counted for the job's world size (a
        first read in workers holds some ranks' whole window, not every rank's first
        seconds).  Streams kept apart (``kept_apart``) are not the job's."""
        apart = self.kept_apart
        own = [rt for r, rt in self.ranks.items() if r not in apart]
        rates = []
        for rt in own[:: max(1, len(own) // RATE_SAMPLE)]:
            begins = rt.begin[: rt.n]
            if since_ns is not None:
                begins = begins[begins >= since_ns]
            if begins.shape[0] >= 2 and (span := int(begins.max()) - int(begins.min())) > 0:
                rates.append((begins.shape[0] - 1) / span)
        if not rates:
            return 0.0
        return float(np.median(rates)) * 1e9 * max(self.world_size, len(own))

    def n_ops(self, rank: int) -> int:
        rt = self.ranks.get(rank)
        return rt.n if rt else 0

    def total_ops(self) -> int:
        return sum(rt.n for rt in self.ranks.values())

    def own_ops(self) -> int:
        """The ops of the job's own ranks, those ``kept_apart`` left out: what ``check`` and
        ``report`` count beside the job's world size (a stream copied in holds no op of the job)."""
        apart = self.kept_apart
        return sum(rt.n for r, rt in self.ranks.items() if r not in apart) if apart else self.total_ops()

    def bounds(self) -> tuple[int, int]:
        """(first, last) timestamp of the trace in ns."""
        return self.start_ns, self.end_ns

    def own_bounds(self) -> tuple[int, int]:
        """(first, last) timestamp of the job's own ranks' events in ns, those ``kept_apart``
        left out: the span ``check`` and ``report`` state (a stream copied in from a job of
        the day before made it a day long)."""
        apart = self.kept_apart
        if not apart:
            return self.start_ns, self.end_ns
        t = self.table  # (columns, not a step per rank: a replay's feed asks at every step)
        own = t.last_ts[: t.size] > 0
        own[[rt._s for r in apart if (rt := self.ranks.get(r)) is not None]] = False
        if not own.any():
            return 0, 0
        return int(t.first_ts[: t.size][own].min()), int(t.last_ts[: t.size][own].max())

    def trace_end(self) -> int:
        """The last timestamp of the job's own ranks (``own_bounds``; the trace's, where they
        have none): the time a stored trace is judged at (``diagnose.trace_now``), and a
        replay's cursor starts at.  A foreign stream's later events made it later: a rank of
        the job still in an op then looked hung for as long as the other job ran on."""
        return self.own_bounds()[1] or self.end_ns

    def sig_of(self, rank: int, i: int) -> Sig:
        return self.sigs[int(self.ranks[rank].sig[i])]

    def sig_flags(self, codes: np.ndarray) -> np.ndarray:
        return self._sig_flags[codes]

    def sig_match(self, codes: np.ndarray) -> np.ndarray:
        return self._sig_match[codes]

    def unknown_sigs(self) -> np.ndarray:
        """The sig codes whose op name is not known (``optable.UNNAMED``: a block decoded without its
        stream's op names, its ``meta`` line lost or torn): such an op cannot be compared
        (``find_mismatches``: it votes for nothing; before, a rank whose meta line was lost
        was named in a ``collective_mismatch`` at every collective, "rank 1: ?") and is said
        (``find_incomplete``)."""
        return np.asarray(self._unnamed, np.int64)

    def sig_hashes(self, codes: np.ndarray) -> np.ndarray:
        """``histories.key_hash`` of each sig's match key (uint64), for digests."""
        return np.asarray(self._match_hashes, np.uint64)[self._sig_match[codes]]

    def ops_in_window(self, rank: int, t0: int, t1: int) -> np.ndarray:
        """Indices of the rank's ops overlapping [t0, t1), sorted by begin time."""
        rt = self.ranks.get(rank)
        return rt.window(t0, t1) if rt else np.zeros(0, np.int64)

    def op_index(self, rank: int, op_id: int) -> int | None:
        rt = self.ranks.get(rank)
        return rt.index_of(op_id) if rt else None

    def op(self, rank: int, i: int) -> dict:
        """Everything recorded about op ``i`` of ``rank`` as one JSON-ready dict."""
        rt = self.ranks[rank]
        s = self.sigs[int(rt.sig[i])]
        d = s.describe()
        d.update(rank=rank, index=int(i), id=int(rt.id[i]), begin_ns=int(rt.begin[i]))
        for key, col in (("end_ns", rt.end), ("wait_begin_ns", rt.wb), ("wait_end_ns", rt.we),
                         ("done_ns", rt.done), ("gpu_ns", rt.gpu), ("complete_ns", rt.comp)):
            v = int(col[i])
            if v:
                d[key] = v
        if rt.seq[i] >= 0:
            d["seq"] = int(rt.seq[i])
        if rt.peer[i] >= 0:
            d["peer"] = int(rt.peer[i])
        if rt.parent[i] >= 0:
            d["parent_index"] = int(rt.parent[i])
            d["parent_id"] = int(rt.id[rt.parent[i]])
        f = int(rt.flags[i])
        if f & APPROX:
            d["approx"] = True
        if f & INFERRED:
            d["inferred_end"] = True
        if i in rt.exc:
            d["exc"] = rt.exc[i]
        d["in_flight"] = bool(rt.comp[i] == 0)
        st = rt.stacks.get(int(rt.id[i]))
        if st is not None:
            d["stack"] = st.get("threads")
        return d

    def label(self, rank: int, i: int) -> str:
        """Short human name: 'all_reduce #42 (group 0)' / 'recv #3 from 1 (group 0)'."""
        rt = self.ranks[rank]
        return self.label_of(int(rt.sig[i]), int(rt.seq[i]), int(rt.peer[i]))

    def label_of(self, sig: int, seq: int, peer: int) -> str:
        """``label`` of an op given its signature code, seq and peer."""
        s = self.sigs[sig]
        text = s.op + (f" #{seq}" if seq >= 0 and s.src != SNAPSHOT else "")  # a snapshot's seq means nothing
        if s.flags & P2P and peer >= 0:
            text += f" {'to' if s.flags & SEND else 'from'} {peer}"
        elif s.flags & RECV:
            text += " from any"
        elif s.flags & SEND:  # (a group rank the recorder could not place; a send refused before its
            text += " to ?"  # peer was known has no direction either, and says nothing)
        return f"{text} (group {s.group}{', fr' if s.space == SPACE_FR else ''})"

    def group_index(self, group: str, space: int = SPACE_NATIVE) -> GroupIndex | None:
        return self.coll.get((space, group))

    def collective(self, group: str, seq: int, space: int = SPACE_NATIVE) -> dict[int, int]:
        """rank -> op index of collective #seq of ``group`` on every member that ran it."""
        gi = self.coll.get((space, group))
        return gi.at(seq) if gi else {}

    def p2p_pair(self, group: str, src: int, dst: int, seq: int,
                 space: int = SPACE_NATIVE) -> tuple[int | None, int | None]:
        """(send op index on src, recv op index on dst) of p2p message #seq src->dst."""
        ch = self.p2p.get((space, group, src, dst))
        row = ch.get(seq) if ch else None
        if row is None:
            return None, None
        return (int(row[0]) if row[0] >= 0 else None), (int(row[1]) if row[1] >= 0 else None)

    def p2p_posted_before(self, group: str, src: int, dst: int, seq: int, send: bool) -> bool:
        """Whether the send (``send``) or the recv of p2p message #seq src->dst of Python's seq
        space, not read, was posted all the same: that side holds a later message of the
        channel (their seqs follow the order they were posted in), or a carry said that side
        completed that seq or a later one before what was read, keeping no op of the channel
        (``inflight.Replayed.channels_passed``)."""
        side = 0 if send else 1
        ch = self.p2p.get((SPACE_NATIVE, group, src, dst))
        if ch is not None and ch.n and bool((ch.keys[: ch.n][ch.mat[: ch.n, side] >= 0] > seq).any()):
            return True
        parts = self.p2p_passed.get(group)
        if not parts:
            return False
        made = self._passed_index.get(group)
        if made is None or made[0] != len(parts):  # (one sort per change, then a lookup a question)
            rows = np.concatenate(parts)
            keys = ((rows[:, 0] << 25) | rows[:, 1]) << 1 | rows[:, 2]
            order = np.lexsort((rows[:, 3], keys))
            keys, seqs = keys[order], rows[order, 3]
            last = np.r_[keys[1:] != keys[:-1], True]  # (each key's highest seq, sorted last)
            made = self._passed_index[group] = (len(parts), keys[last], seqs[last])
        _, keys, top = made
        key = ((src << 25) | dst) << 1 | side
        at = int(np.searchsorted(keys, key))
        return at < keys.shape[0] and int(keys[at]) == key and int(top[at]) >= seq

    def matching(self, rank: int, i: int) -> dict[int, int]:
        """The same logical op on other ranks: rank -> op index (collective members or p2p peer)."""
        rt = self.ranks[rank]
        s = self.sigs[int(rt.sig[i])]
        seq = int(rt.seq[i])
        if seq < 0 or s.nested:
            return {}
        if s.flags & P2P:
            peer = int(rt.peer[i])
            if peer < 0:
                return {}
            send = bool(s.flags & SEND)
            a, b = self.p2p_pair(s.group, rank if send else peer, peer if send else rank, seq, s.space)
            other = b if send else a
            return {peer: other} if other is not None else {}
        out = self.collective(s.group, seq, s.space)
        out.pop(rank, None)
        return out

    def oldest_in_flight(self, after: int) -> int | None:
        """The earliest begin after ``after`` among every rank's ops in flight (None: none)."""
        return self.table.oldest_in_flight(after)

    def inflight(self, rank: int) -> list[int]:
        """Op indices begun and not complete, by begin time."""
        rt = self.ranks.get(rank)
        if not rt or not rt.open:
            return []
        if len(rt.open) == 1:  # the usual case: the op a rank is in
            i = next(iter(rt.open))
            return [i] if rt.comp[i] == 0 else []
        return sorted((i for i in rt.open if rt.comp[i] == 0), key=lambda i: (int(rt.begin[i]), i))  # (ties: by index)

    def last_op(self, rank: int, *, completed: bool = True) -> int | None:
        rt = self.ranks.get(rank)
        if not rt or rt.n == 0:
            return None
        order = rt.order()
        if not completed:
            return int(order[-1])
        k = 64  # the last completed op is nearly always among the last few begun: look there first
        while True:
            tail = order[-k:]
            done = tail[rt.comp[tail] > 0]
            if done.shape[0]:
                return int(done[-1])
            if k >= order.shape[0]:
                return None
            k *= 16

    def samples(self, rank: int) -> dict[str, np.ndarray]:
        """Sample history for sparklines: ts, cpu, rss, gpu_util, gpu_mem, gpu_mem_total (NaN = absent)."""
        rt = self.ranks.get(rank)
        return rt.samples.arrays() if rt else no_samples()

    def latest_sample(self, rank: int) -> dict | None:
        rt = self.ranks.get(rank)
        return rt.samples.last if rt else None

    def sample_interval(self, rank: int) -> float:
        rt = self.ranks.get(rank)
        try:
            return float((rt.meta or {}).get("sample_interval") or DEFAULT_SAMPLE_INTERVAL)
        except (TypeError, ValueError, AttributeError):
            return DEFAULT_SAMPLE_INTERVAL

    def hang_after(self) -> float | None:
        """The largest hang_after the ranks were recorded with, if any said."""
        vals = [float(rt.meta["hang_after"]) for rt in self.ranks.values()
                if rt.meta and isinstance(rt.meta.get("hang_after"), int | float)]
        return max(vals) if vals else None

    def hosts(self) -> Mapping[int, str]:
        """Each rank's host, as its meta names it (a rank whose meta names none is left out):
        made again only once a meta came (a diagnosis of 16k ranks asked every meta)."""
        if self._hosts[0] != self._metas_seen:
            self._hosts = (self._metas_seen, {r: rt.meta["host"] for r, rt in self.ranks.items()
                                              if rt.meta and isinstance(rt.meta.get("host"), str)})
        return MappingProxyType(self._hosts[1])

    def slots_of(self, ranks: np.ndarray) -> np.ndarray:
        """The table's slots of ``ranks`` (each in the model): read off its array by rank, or
        from each rank's trace where a rank is beyond that array (``RANK_SLOTS``)."""
        slots = self.table.slots(ranks)
        miss = np.flatnonzero(slots < 0)
        if miss.shape[0]:
            slots[miss] = [self.ranks[r]._s for r in ranks[miss].tolist()]
        return slots

    def last_seen(self, rank: int) -> int:
        """The rank's latest timestamp of any kind (0: never seen)."""
        rt = self.ranks.get(rank)
        return int(max(rt.last_hb, rt.last_ts)) if rt else 0

    # ------------------------------------------------------------------ failures and departures
    def failed_ns(self, rank: int, i: int) -> int:
        """When op ``i`` raised (its end, or the end of its wait)."""
        rt = self.ranks[rank]
        return int(rt.comp[i] or rt.we[i] or rt.end[i])

    def exc_kind(self, rank: int, i: int):
        """The classified exception of a failed op (``errors.classify``), cached."""
        key = (rank, i)
        k = self._exc_kinds.get(key)
        if k is None:
            k = self._exc_kinds[key] = classify(self.ranks[rank].exc.get(i, ""))
        return k

    def members(self, rank: int, i: int) -> list[int]:
        """The ranks op ``i`` involves: its group for a collective or an any-source recv, else
        the two ends of a p2p op (a send with no peer: its rank alone, ``unplaced``)."""
        s = self.sig_of(rank, i)
        peer = int(self.ranks[rank].peer[i])
        if s.flags & P2P and peer >= 0:
            return sorted({rank, peer})
        if self.unplaced(rank, i):
            return [rank]
        gi = self.coll.get((s.space, s.group))
        return list(self.groups.get(s.group) or (gi.members if gi else [rank]))

    def unplaced(self, rank: int, i: int) -> bool:
        """A send the recorder gave no peer: a group rank out of its group's range
        (``group_dst=99``; torch does not refuse it), never an any-source op.  Flight
        Recorder's sends may name none (``nccl:send``): those are not said to be."""
        s = self.sig_of(rank, i)
        return bool(s.flags & SEND) and s.space == SPACE_NATIVE and int(self.ranks[rank].peer[i]) < 0

    def counterparts(self, rank: int, i: int) -> dict[int, int]:
        """rank -> op index of the same instance on every rank that ran it, this one included."""
        out = dict(self.matching(rank, i))
        out[rank] = i
        return out
