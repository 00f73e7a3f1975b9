"""Per-rank span index: the far-zoomed-out timeline row in O(cells x log ops), not O(ops).

With the whole trace in view a row holds tens of thousands of ops, each drawn as one span
(begin to its overview end) in its traffic category, and a cell shows the highest category
whose spans touch it.  Per category, with the spans in begin order and the running max of
their ends, "does a span touch cell k" is one binary search per cell: the spans beginning
at or before the cell's last ns, and whether the latest-ending of them reaches the cell's
first ns.  ``SpanIndex`` keeps those arrays for one rank's published ``RankView``, updated
from the first op a new view changed (``RankView.touched_since``), on the painting thread:
the views it reads are immutable and the index is its own.

What the index cannot draw exactly, the painter draws from the ops themselves
(``painter._paint``): ops in flight when the index was built (``pending``), and with the
replay cursor, the ops not over by the cursor (``cells`` returns them).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from commscope.analysis.model import APPROX
from commscope.tui.paintcode import ASYNC_BIT, CAT_MASK, HIDDEN_BIT

BLOCK = 64  # positions per block of the label index (longest span per block)


class _Spans:
    """One category's spans in begin order: their positions in the rank's begin order and
    begins, and the running maxima of their overview ends and of their latest timestamps,
    each led by a -1 (``end_max[j]``: the latest end among the first j spans)."""

    __slots__ = ("n", "pos", "begin", "end_max", "last_max")

    def __init__(self) -> None:
        self.n = 0
        self.pos = np.zeros(0, np.int64)
        self.begin = np.zeros(0, np.int64)
        self.end_max = np.full(1, -1, np.int64)
        self.last_max = np.full(1, -1, np.int64)

    def truncate(self, p0: int) -> None:
        """Forget the spans at positions >= p0."""
        self.n = int(np.searchsorted(self.pos[: self.n], p0, side="left"))

    def extend(self, pos: np.ndarray, begin: np.ndarray, end: np.ndarray, last: np.ndarray) -> None:
        k = pos.shape[0]
        if not k:
            return
        n = self.n
        if self.pos.shape[0] < n + k:
            cap = max(n + k, 2 * self.pos.shape[0], 256)
            for name, extra in (("pos", 0), ("begin", 0), ("end_max", 1), ("last_max", 1)):
                old = getattr(self, name)
                new = np.empty(cap + extra, np.int64)
                new[:n + extra] = old[:n + extra]
                setattr(self, name, new)
        self.pos[n:n + k] = pos
        self.begin[n:n + k] = begin
        end = end.copy()  # the running maxima go on from the spans kept
        last = last.copy()
        end[0] = max(int(end[0]), int(self.end_max[n]))
        last[0] = max(int(last[0]), int(self.last_max[n]))
        np.maximum.accumulate(end, out=self.end_max[n + 1:n + k + 1])
        np.maximum.accumulate(last, out=self.last_max[n + 1:n + k + 1])
        self.n = n + k


class SpanIndex:
    """The overview's spans of one rank (see the module docstring), for ``RankView``s of
    that rank as they are published: ``update`` brings it to a newer view."""

    def __init__(self, *, deferred: bool = False) -> None:
        #: build the first time later (``build_later``): the painter paints from the ops and
        #: sets ``wanted``, and the console builds it when idle, so the first frame of a large
        #: trace costs no more than painting it from the ops
        self.deferred = deferred
        self.wanted = False
        self.version = -1
        self.n = 0  # ops (positions) indexed
        self.spans: dict[int, _Spans] = {}  # by category
        self.shown = np.zeros(1, np.int64)  # ops drawn (not hidden) before each position (to n; capacity past)
        self.pending = np.zeros(0, np.int64)  # positions of ops in flight when indexed, ascending
        self.longest = np.zeros(0, np.int64)  # per BLOCK positions: longest completed drawn span (capacity past)

    def build_later(self) -> bool:
        """Whether the painter should leave this index unbuilt for now (and mark it wanted)."""
        if self.deferred and self.version < 0:
            self.wanted = True
            return True
        return False

    def update(self, rv: Any, cats: np.ndarray) -> SpanIndex:
        """Index ``rv`` (a ``RankView`` of this rank, the same or newer than the last one),
        re-indexing from the first position its changes since then touched.  ``cats``: the
        paint codes of ``rv``'s signatures (``paintcode.categories``)."""
        if rv.version == self.version and rv.n == self.n:
            return self
        n = rv.n
        first = None  # a first view, or one of another model: everything
        if 0 <= self.version < rv.version and self.n <= n:
            first = rv.touched_since(self.version)
        if first is None:
            p0 = 0
        else:
            p0 = min(int(np.searchsorted(rv.sb, first, side="left")), self.n, n)
        self._index(rv, cats, p0)
        self.version = rv.version
        return self

    def _index(self, rv: Any, cats: np.ndarray, p0: int) -> None:
        n = rv.n
        if p0 == 0:
            self.spans = {}
        for sp in self.spans.values():
            sp.truncate(p0)
        idx = rv.order_[p0:n]
        code = cats[rv.sig[idx]]
        shown = code < HIDDEN_BIT
        begin = rv.begin[idx]
        comp = rv.comp[idx]
        wb, we = rv.wb[idx], rv.we[idx]
        flight = comp == 0
        is_async = ((code & ASYNC_BIT) != 0) | ((rv.flags[idx] & APPROX) != 0)
        # the overview's span of a completed op: to its completion, or for async work waited
        # on, to the end of the wait (to completion while the wait has not ended)
        end = np.where(is_async & (wb > 0), np.where(we > 0, we, comp), comp)
        last = np.maximum(np.maximum(begin, comp), np.maximum(wb, we))
        end[flight] = 0  # drawn from the op itself (pending), see _paint
        pos = np.arange(p0, n, dtype=np.int64)
        cat = code & CAT_MASK
        for c in np.unique(cat[shown]).tolist():
            sel = shown & (cat == c)
            sp = self.spans.get(c)
            if sp is None:
                sp = self.spans[c] = _Spans()
                self.spans = dict(sorted(self.spans.items()))  # low categories first, see cells
            sp.extend(pos[sel], begin[sel], end[sel], last[sel])
        counts = self.shown  # grown in place: the index is the painting thread's own
        if counts.shape[0] < n + 1:
            counts = np.empty(max(n + 1, 2 * counts.shape[0]), np.int64)
            counts[: p0 + 1] = self.shown[: p0 + 1]
        np.cumsum(shown, out=counts[p0 + 1:n + 1])
        counts[p0 + 1:n + 1] += counts[p0]
        self.shown = counts
        keep = int(np.searchsorted(self.pending, p0, side="left"))
        self.pending = np.concatenate([self.pending[:keep], pos[flight & shown]])
        # label index: the longest completed drawn span per block, from p0's block on
        b0 = p0 // BLOCK
        lo = b0 * BLOCK
        ids = rv.order_[lo:n]
        dur = np.where((rv.comp[ids] > 0) & (cats[rv.sig[ids]] < HIDDEN_BIT), rv.comp[ids] - rv.begin[ids], -1)
        nb = -(-n // BLOCK)
        longest = self.longest
        if longest.shape[0] < nb:
            longest = np.empty(max(nb, 2 * longest.shape[0]), np.int64)
            longest[:b0] = self.longest[:b0]
        if dur.shape[0]:
            pad = np.full((nb - b0) * BLOCK, -1, np.int64)
            pad[: dur.shape[0]] = dur
            longest[b0:nb] = pad.reshape(-1, BLOCK).max(axis=1)
        self.longest = longest
        self.n = n

    # ------------------------------------------------------------------ queries
    def drawn(self, lo: int, hi: int) -> int:
        """Ops drawn (not hidden) at positions [lo, hi)."""
        return int(self.shown[hi] - self.shown[lo]) if hi > lo else 0

    def in_flight(self, lo: int, hi: int) -> np.ndarray:
        """Positions in [lo, hi) of ops that were in flight when indexed."""
        p = self.pending
        return p[np.searchsorted(p, lo, side="left"):np.searchsorted(p, hi, side="left")]

    def wide(self, rv: Any, cats: np.ndarray, lo: int, hi: int, longer_than: int) -> np.ndarray:
        """Positions in [lo, hi) of completed drawn ops longer than ``longer_than`` ns."""
        if hi <= lo:
            return np.zeros(0, np.int64)
        b = np.flatnonzero(self.longest[lo // BLOCK:(hi - 1) // BLOCK + 1] > longer_than)
        if not b.shape[0]:
            return np.zeros(0, np.int64)
        b += lo // BLOCK
        pos = (b[:, None] * BLOCK + np.arange(BLOCK)).ravel()
        pos = pos[(pos >= lo) & (pos < hi)]
        ids = rv.order_[pos]
        comp = rv.comp[ids]
        return pos[(comp > 0) & (comp - rv.begin[ids] > longer_than) & (cats[rv.sig[ids]] < HIDDEN_BIT)]

    def cells(self, lo: int, hi: int, t0: int, npc: int, w: int,
              cursor: int | None) -> tuple[np.ndarray, list[np.ndarray]]:
        """The cells drawn by the completed spans at positions [lo, hi), as categories, and
        the positions among them the index could not draw, to be drawn from their ops:
        with the replay ``cursor``, those not over by it; and next to the window's start,
        those whose cells spans beginning before ``lo`` could reach (the running max
        would mix them in)."""
        cells = np.zeros(w, np.int8)
        rest: list[np.ndarray] = []
        c_first = t0 + np.arange(w, dtype=np.int64) * npc  # each cell's first and last ns
        c_last = c_first + (npc - 1)
        bounds = np.array([lo, hi], np.int64)
        for c, sp in self.spans.items():  # low categories first: the highest drawn wins
            pos = sp.pos[: sp.n]
            j_lo, j_hi = np.searchsorted(pos, bounds, side="left").tolist()
            if j_hi <= j_lo:
                continue
            q = j_hi
            if cursor is not None:  # spans not over by the cursor: drawn from the ops
                q = min(max(int(np.searchsorted(sp.last_max[1:sp.n + 1], cursor, side="right")), j_lo), j_hi)
                if q < j_hi:
                    rest.append(pos[q:j_hi])
            if q <= j_lo:
                continue
            # spans begun by each cell's last ns, and whether the latest-ending reaches its
            # first.  (Those before j_lo begin before the window: counting them changes nothing
            # when none reaches into it; where they do, below.)
            j = np.searchsorted(sp.begin[:q], c_last, side="right")
            hit = sp.end_max[j] >= c_first
            reach = int(sp.end_max[j_lo])
            if reach >= t0:  # earlier spans reach into the window: its first cells from the ops
                k = min((reach - t0) // npc, w - 1)
                hit[: k + 1] = False
                rest.append(pos[j_lo:int(j[k])])
            cells[hit] = c
        return cells, rest
