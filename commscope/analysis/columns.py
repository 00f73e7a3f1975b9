"""Columnar op storage of one rank (``RankTrace``) and the growth helper every array uses.

Ops are stored per rank in numpy columns (begin/end/wait/done times, id, seq, peer,
parent, signature code, flags), so a million ops take 90-130 MB and window queries are
binary searches; ``order``/``window`` keep a begin-time order and a running max of op
ends incrementally.  Ingest (``model.TraceModel.ingest``) writes these columns; the
cross-rank indexes live in ``indexes``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import repeat
from typing import Any, NamedTuple, Protocol

import numpy as np

I64_MAX = np.iinfo(np.int64).max
#: A rank's op ids are looked up in a dense array while they stay below this multiple of its
#: op count (plus DENSE_ID_SLACK); sparse or huge ids (foreign, trimmed or hostile traces)
#: switch it to a dict, so an id costs memory by the ops held, never by its value.
DENSE_ID_FACTOR = 4
DENSE_ID_SLACK = 1 << 12
TOUCH_LOG = 64  # batches a rank remembers the changes of (RankTrace.touched)


def grown(arr: np.ndarray, need: int, keep: int | None = None, fill: Any = 0, minimum: int = 0,
          axis: int = 0) -> np.ndarray:
    """``arr`` if it holds ``need`` entries along ``axis``; else a new array of
    max(need, twice as many, ``minimum``) there, its first ``keep`` entries (default: all)
    copied and the rest ``fill``.  Always a new array, never a resize in place, so views
    already handed out stay valid; doubling keeps appends amortized O(1).  Paths run per
    rank per batch compare the capacity themselves first: the comparison costs less than
    the call."""
    cap = arr.shape[axis]
    if need <= cap:
        return arr
    shape = list(arr.shape)
    shape[axis] = max(need, 2 * cap, minimum)
    out = np.full(shape, fill, arr.dtype)
    keep = cap if keep is None else keep
    if axis == 0:
        out[:keep] = arr[:keep]
    else:
        out[:, :keep] = arr[:, :keep]
    return out


#: Empty columns, shared: nothing can be written into them, and growing one makes a new array
_NONE_I8, _NONE_I4, _NONE_U1, _NONE_F8 = (np.zeros(0, t) for t in (np.int64, np.int32, np.uint8, np.float64))

_COLS_I8 = ("begin", "end", "wb", "we", "done", "gpu", "comp", "id", "seq")
_COLS_I4 = ("peer", "parent", "sig")


class RankColumns(Protocol):
    """One rank's op columns as the console and the rank-state judgements read them: a
    ``RankTrace`` (the model's own) or a ``RankView`` (published)."""

    @property
    def n(self) -> int: ...
    @property
    def begin(self) -> np.ndarray: ...
    @property
    def end(self) -> np.ndarray: ...
    @property
    def wb(self) -> np.ndarray: ...
    @property
    def we(self) -> np.ndarray: ...
    @property
    def comp(self) -> np.ndarray: ...
    @property
    def sig(self) -> np.ndarray: ...
    @property
    def seq(self) -> np.ndarray: ...
    @property
    def peer(self) -> np.ndarray: ...
    @property
    def flags(self) -> np.ndarray: ...
    @property
    def first_ts(self) -> int: ...
    @property
    def last_ts(self) -> int: ...
    @property
    def last_hb(self) -> int: ...
    @property
    def meta(self) -> dict | None: ...

    def order(self) -> np.ndarray: ...

    def window(self, t0: int, t1: int) -> np.ndarray: ...


class RankTrace:
    """One rank: op columns plus liveness, samples, stacks and exits."""

    def __init__(self, rank: int, cap: int = 256):
        """``cap`` 0: no columns yet (the rank will ``adopt`` some, or grow its own)."""
        self.rank = rank
        self.n = 0
        for c in _COLS_I8:
            setattr(self, c, np.zeros(cap, np.int64) if cap else _NONE_I8)
        for c in _COLS_I4:
            setattr(self, c, np.full(cap, -1, np.int32) if cap else _NONE_I4)
        self.flags = np.zeros(cap, np.uint8) if cap else _NONE_U1
        self.id2idx = np.full(1024, -1, np.int32) if cap else _NONE_I4
        self.id_dict: dict[int, int] | None = None
        self.open: set[int] = set()  # op indices not yet complete
        self.exc: dict[int, str] = {}  # op index -> exception text
        self.meta: dict | None = None
        self.exits: list[dict] = []
        self.summaries: list[dict] = []  # what retention kept of the segments it deleted (``summary`` events)
        self.stacks: dict[int, dict] = {}  # op id -> stack event
        self.captures: list[dict] = []  # the latest stack events, any reason, in arrival order
        self.last_stack: dict | None = None
        self.last_hb = 0
        self.hb_inflight = 0
        self.first_ts = 0
        self.last_ts = 0
        self.last_op_ts = 0
        self.last_comp = 0  # latest completion time of any op
        self.dropped = 0  # events the recorder lost (backpressure, store failures)
        self.fr_overwritten = 0  # Flight Recorder entries overwritten before a poll: not losses
        self.device_seen = False
        self.samples = Samples()
        self._order: np.ndarray | None = None
        self._order_n = 0
        self._sorted = True
        self._last_begin = 0
        self._pmax: np.ndarray | None = None
        self._pmax_version = -1
        self._sb = np.zeros(0, np.int64)  # begin times in ``order``
        self._ord_buf = self._sb_buf = self._pmax_buf = np.zeros(0, np.int64)  # capacity behind them
        self._ins_min = 0  # first order position changed by insertions since the last prefix max
        self._open_min_begin = I64_MAX  # earliest begin among ops open at the last prefix max
        self._pmax_shared = False  # a published RankView holds the prefix max: rewrite a copy
        self._view: RankView | None = None
        self.version = 0
        #: (version, earliest begin among the ops that batch added or changed), the latest
        #: TOUCH_LOG batches: what a painter needs to repaint only the part of a row that changed.
        self.touched: list[tuple[int, int]] = []

    # -- storage
    def nbytes(self, shared: dict[int, int] | None = None) -> int:
        """Bytes its arrays hold (capacity, the index buffers and the id map included).
        Columns it took from ranks ingested together (``adopt``) are views: their whole
        block goes into ``shared`` (by id, so the model counts it once, for as long as any
        rank still holds part of it), or into the total without one."""
        arrays = [getattr(self, c) for c in (*_COLS_I8, *_COLS_I4, "flags", "id2idx")]
        arrays += [self._ord_buf, self._sb_buf, self._pmax_buf, *self.samples.cols.values()]
        total = 0
        for a in arrays:
            base = a.base
            if base is None or not isinstance(base, np.ndarray):
                total += a.nbytes
            elif shared is None:
                total += base.nbytes
            else:
                shared[id(base)] = base.nbytes
        return total

    def adopt(self, cols: Mapping[str, np.ndarray], a: int, b: int) -> None:
        """Take rows [a, b) of columns shared by ranks ingested together as this (empty)
        rank's op columns: views, not copies (``TraceModel._fresh_begins``).  A later append
        that outgrows them copies them out, as for any full column."""
        for c in (*_COLS_I8, *_COLS_I4, "flags"):
            setattr(self, c, cols[c][a:b])
        self.n = b - a

    def reserve(self, n: int) -> None:
        if n <= self.begin.shape[0]:
            return
        for c in (*_COLS_I8, *_COLS_I4, "flags"):
            setattr(self, c, grown(getattr(self, c), n, self.n, fill=-1 if c in _COLS_I4 else 0))

    def _dense_map(self, hi: int, k: int) -> np.ndarray | None:
        """The dense id map, grown to hold id ``hi`` (``k`` ids coming); None once ids are
        sparse or huge (foreign traces): ``id_dict`` holds them instead."""
        if self.id_dict is None and hi >= DENSE_ID_FACTOR * (self.n + k) + DENSE_ID_SLACK:
            self.id_dict = {int(k): int(v) for k, v in enumerate(self.id2idx.tolist()) if v >= 0}
        if self.id_dict is not None:
            return None
        if hi >= self.id2idx.shape[0]:  # (checked here too: this runs per rank per batch)
            self.id2idx = grown(self.id2idx, hi + 1, fill=-1)
        return self.id2idx

    def map_ids(self, ids: np.ndarray, idx: np.ndarray) -> None:
        if not ids.shape[0]:
            return
        id2idx = self._dense_map(int(ids.max()), ids.shape[0])
        if id2idx is None:
            self.id_dict.update(zip(ids.tolist(), idx.tolist(), strict=True))
            return
        ok = ids >= 0
        id2idx[ids[ok]] = idx[ok]

    def map_few(self, ids: list[int], first: int) -> None:
        """``map_ids`` of a few ids, as a list, of ops ``first``, ``first + 1`` ...: a live
        batch's handful a rank, where Python's scalar steps cost less than numpy's calls."""
        if not ids:
            return
        id2idx = self._dense_map(max(ids), len(ids))
        if id2idx is None:
            self.id_dict.update(zip(ids, range(first, first + len(ids)), strict=True))
            return
        for i, op_id in enumerate(ids, first):
            if op_id >= 0:
                id2idx[op_id] = i

    def lookup(self, ids: np.ndarray) -> np.ndarray:
        if self.id_dict is not None:
            get = self.id_dict.get
            return np.array([get(k, -1) for k in ids.tolist()], np.int32)
        out = np.full(ids.shape[0], -1, np.int32)
        ok = (ids >= 0) & (ids < self.id2idx.shape[0])
        out[ok] = self.id2idx[ids[ok]]
        return out

    def index_of(self, op_id: int) -> int | None:
        if self.id_dict is not None:
            return self.id_dict.get(op_id)
        if 0 <= op_id < self.id2idx.shape[0]:
            i = int(self.id2idx[op_id])
            return i if i >= 0 else None
        return None

    # -- time queries
    def order(self) -> np.ndarray:
        """Op indices sorted by begin time (ops may arrive out of time order, e.g. Flight Recorder).

        Maintained incrementally: new ops are merged into the sorted order (one
        ``searchsorted`` and ``insert``), so a live trace never re-sorts a whole rank.
        """
        n = self.n
        if self._order is not None and self._order_n == n:
            return self._order
        if self._order is None or self._order_n > n:
            # begins that came in time order (the usual case) are their own order
            self._order = np.arange(n, dtype=np.int64) if self._sorted else np.argsort(self.begin[:n], kind="stable")
            self._sb = self.begin[self._order]
            self._ord_buf, self._sb_buf = self._order, self._sb
            self._ins_min = 0
        else:
            new = np.arange(self._order_n, n, dtype=np.int64)
            nb = self.begin[self._order_n:n]
            if nb.shape[0] > 1 and bool((np.diff(nb) < 0).any()):
                k = np.argsort(nb, kind="stable")
                new, nb = new[k], nb[k]
            pos = np.searchsorted(self._sb, nb, side="right")
            m = self._order.shape[0]
            if pos[0] == m:  # the usual case: everything new comes last; append in place
                k = new.shape[0]
                if self._ord_buf.shape[0] < m + k:
                    self._ord_buf = grown(self._ord_buf, m + k, m, minimum=1024)
                    self._sb_buf = grown(self._sb_buf, m + k, m, minimum=1024)
                self._ord_buf[m:m + k] = new
                self._sb_buf[m:m + k] = nb
                self._order, self._sb = self._ord_buf[: m + k], self._sb_buf[: m + k]
            else:
                self._order = np.insert(self._order, pos, new)
                self._sb = np.insert(self._sb, pos, nb)
                self._ord_buf, self._sb_buf = self._order, self._sb
            self._ins_min = min(self._ins_min, int(pos[0]))
        self._order_n = n
        return self._order

    def window(self, t0: int, t1: int) -> np.ndarray:
        """Indices of ops overlapping [t0, t1), by begin time; ops in flight extend to +inf."""
        if self.n == 0:
            return np.zeros(0, np.int64)
        order = self.order()
        pmax = self._prefix_max(order, self._sb)
        return _window(order, self._sb, pmax, self.begin, self.comp, self.open, t0, t1)

    def _prefix_max(self, order: np.ndarray, begins: np.ndarray) -> np.ndarray:
        """Running max of op ends in begin order (in-flight ops count with their begin).

        Recomputed only from the first position that can have changed: where ops were
        inserted, or where the earliest op that was still open last time begins.
        """
        n = order.shape[0]
        if self._pmax is not None and self._pmax_version == self.version and self._pmax.shape[0] == n:
            return self._pmax
        start = 0
        if self._pmax is not None:
            start = min(self._ins_min, int(np.searchsorted(begins, self._open_min_begin, side="left")),
                        self._pmax.shape[0])
        ends = self.comp[order[start:]]
        ends = np.where(ends == 0, begins[start:], ends)
        if start and start <= self._pmax.shape[0]:
            if ends.shape[0]:
                ends[0] = max(int(ends[0]), int(self._pmax[start - 1]))
            if self._pmax_buf.shape[0] < n:
                self._pmax_buf = grown(self._pmax, n, start, minimum=1024)
            elif self._pmax_shared and start < self._pmax.shape[0]:  # never rewrite what a view holds
                buf = np.empty(self._pmax_buf.shape[0], np.int64)
                buf[:start] = self._pmax[:start]
                self._pmax_buf = buf
            self._pmax_shared = False
            np.maximum.accumulate(ends, out=self._pmax_buf[start:n])
            self._pmax = self._pmax_buf[:n]
        else:
            self._pmax_buf = np.maximum.accumulate(ends)
            self._pmax = self._pmax_buf
            self._pmax_shared = False
        self._pmax_version = self.version
        self._ins_min = n
        self._open_min_begin = min((int(self.begin[i]) for i in self.open), default=I64_MAX)
        return self._pmax


    def touch(self, first_begin: int) -> None:
        """Note that the batch that made ``version`` changed ops beginning at ``first_begin``
        or later (I64_MAX: none, only liveness or samples)."""
        self.touched.append((self.version, int(first_begin)))
        if len(self.touched) > TOUCH_LOG:
            del self.touched[: len(self.touched) - TOUCH_LOG]

    def view(self) -> RankView:
        """This rank as an immutable ``RankView`` (the same object while nothing changed)."""
        v = self._view
        if v is not None and v.version == self.version and v.n == self.n:
            return v
        n = self.n
        order = self.order()
        pmax = self._prefix_max(order, self._sb) if n else np.zeros(0, np.int64)
        self._pmax_shared = True
        cols = [_frozen(getattr(self, c)[:n]) for c in RankView.COLUMNS]
        v = self._view = RankView(self.rank, self.version, n, *cols, _frozen(order), _frozen(self._sb),
                                  _frozen(pmax), tuple(sorted(i for i in self.open if self.comp[i] == 0)),
                                  self.first_ts, self.last_ts, self.last_hb, self.meta, tuple(self.exits),
                                  tuple(self.touched))
        return v


def _frozen(a: np.ndarray) -> np.ndarray:
    v = a.view()
    v.flags.writeable = False
    return v


class RankView(NamedTuple):
    """One rank as published after an ingest batch: what the console paints from, with no lock.

    The index arrays (``order``, ``sb``: begins in that order, ``pmax``: running max of op
    ends) are never written again once published: the writer appends past them or rewrites a
    copy.  The op columns are the model's own, read-only here: after publishing, the writer
    only appends past ``n`` and fills in the completion of ops listed in ``open`` (0 -> a
    time, once), so a reader may see such an op complete a moment early, never an index
    out of order.  The column names are those of ``RankTrace``, so painting and queries take
    either.
    """

    rank: int
    version: int
    n: int
    begin: np.ndarray
    end: np.ndarray
    wb: np.ndarray
    we: np.ndarray
    comp: np.ndarray
    sig: np.ndarray
    seq: np.ndarray
    peer: np.ndarray
    flags: np.ndarray
    order_: np.ndarray
    sb: np.ndarray
    pmax: np.ndarray
    open: tuple[int, ...]  # ops in flight at publishing, by index
    first_ts: int
    last_ts: int
    last_hb: int
    meta: dict | None
    exits: tuple[dict, ...]
    touched: tuple[tuple[int, int], ...] = ()  # see RankTrace.touched

    COLUMNS = ("begin", "end", "wb", "we", "comp", "sig", "seq", "peer", "flags")

    def order(self) -> np.ndarray:
        """Op indices sorted by begin time."""
        return self.order_

    def touched_since(self, version: int) -> int | None:
        """The earliest begin among the ops changed after ``version`` (I64_MAX: none), or
        None when the log no longer reaches back that far."""
        log = self.touched
        if version >= self.version:
            return I64_MAX
        if not log or log[0][0] > version + 1:
            return None
        first = I64_MAX
        for v, b in reversed(log):  # the latest batches last: only those after ``version``
            if v <= version:
                break
            if b < first:
                first = b
        return first

    def window(self, t0: int, t1: int) -> np.ndarray:
        """``RankTrace.window`` on the published arrays."""
        return _window(self.order_, self.sb, self.pmax, self.begin, self.comp, self.open, t0, t1)


def _window(order: np.ndarray, begins: np.ndarray, pmax: np.ndarray, begin: np.ndarray, comp: np.ndarray,
            open_ops: Any, t0: int, t1: int) -> np.ndarray:
    """Indices of ops overlapping [t0, t1), by begin time; ops in flight extend to +inf."""
    if order.shape[0] == 0:
        return np.zeros(0, np.int64)
    i1 = int(np.searchsorted(begins, t1, side="left"))
    i0 = int(np.searchsorted(pmax, t0, side="right"))
    cand = order[i0:i1]
    if cand.shape[0] and t0 > begins[i0]:  # (from before the first op on: every one overlaps)
        ends = comp[cand]
        cand = cand[(ends > t0) | (ends == 0) | (begin[cand] >= t0)]
    if open_ops:  # (only ops in flight: a view's list was taken when it was published)
        extra = [i for i in open_ops if begin[i] < t1]
        if extra:
            cand = np.union1d(cand, np.array(extra, np.int64))
            cand = cand[np.argsort(begin[cand], kind="stable")]
    return cand


class Samples:
    """Per-rank resource samples for sparklines: ts, cpu, rss, gpu_util, gpu_mem, gpu_mem_total."""

    FIELDS = ("ts", "cpu", "rss", "gpu_util", "gpu_mem", "gpu_mem_total")

    def __init__(self) -> None:
        self.n = 0
        self.cols = dict.fromkeys(self.FIELDS, _NONE_F8)  # (grown on the first add)
        self.last: dict | None = None
        #: Why GPU samples are missing, as the rank's probe said (once: ``gpu_error``)
        self.gpu_error: str | None = None

    @classmethod
    def columns_of(cls, evs: Sequence[dict]) -> dict[str, np.ndarray]:
        """Sample events as columns (None, a field a sample lacks, becomes NaN)."""
        return {f: np.array(list(map(dict.get, evs, repeat(f))), np.float64) for f in cls.FIELDS}

    def add(self, evs: Sequence[dict], cols: Mapping[str, np.ndarray] | None = None) -> None:
        """Append sample events (``cols``: their ``columns_of``, when the caller has them)."""
        k = len(evs)
        need = self.n + k
        if need > self.cols["ts"].shape[0]:
            for f in self.FIELDS:
                self.cols[f] = grown(self.cols[f], need, self.n, fill=np.nan, minimum=64)
        if cols is None:
            cols = self.columns_of(evs)
        for f in self.FIELDS:
            self.cols[f][self.n: need] = cols[f]
        self.n = need
        self.last = evs[-1]
        err = next((e["gpu_error"] for e in evs if e.get("gpu_error")), None)
        if err is not None:
            self.gpu_error = str(err)

    def arrays(self) -> dict[str, np.ndarray]:
        return {f: self.cols[f][: self.n] for f in self.FIELDS}
