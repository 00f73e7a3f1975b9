"""The timeline's painter: a row of ranks over a time window as a category per cell, then as
Rich segments behind a gutter.  Pure (no widget, no Textual app, never the widget module):
it reads a model's published view (``feed.view``) or the model itself and nothing else, so
the widget (``tui/timeline.py``) and the tests paint the same rows the same way, without
a running app, and the painting can be read and tested apart from the widget's state.

A row's cells are computed with numpy over the ops in view (coverage of each traffic
category via ``bincount``/``cumsum``, highest priority wins), never one Python loop
iteration per op.  Far zoomed out, each op is one span (the overview), painted from the
rank's span index (``tui/spanindex.py``) when the window holds enough ops for the index to
pay.  A row painted before over the same window is repainted only from the earliest op
changed since (``repaint_rank``), and a frame's rows are painted together
(``repaint_ranks``): one set of numpy calls per frame, not per row.

Entry points: ``render_row`` (a whole line), ``paint_rank`` and ``paint_group`` (the cells
of one rank / a collapsed group), ``count_levels`` (a frame's collapsed groups counted over
all their ranks at once, and from what changed since the last frame), ``repaint_rank(s)``
(a rank's row painted from what changed), all over a ``Window``; ``follow`` (where a live
window starts).
"""

from __future__ import annotations

import itertools
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from functools import lru_cache
from operator import attrgetter, is_
from typing import Any, NamedTuple

import numpy as np
from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style
from textual.strip import Strip

from commscope.analysis import runsearch
from commscope.analysis.busy import busy_counts
from commscope.analysis.columns import I64_MAX, RankColumns, RankView, _within
from commscope.analysis.model import APPROX, ModelLike, ModelView
from commscope.analysis.vocab import RankState
from commscope.events import DEFAULT_HANG_AFTER
from commscope.tui import palette
from commscope.tui.paintcode import ASYNC_BIT, CAT_MASK, HIDDEN_BIT, categories
from commscope.tui.spanindex import SpanIndex

#: Cells left of the time axis on every line: state dot, label, findings mark, bar.
GUTTER = 11
#: The default of ``Window.index_min_ops``: windows with fewer ops beginning in them are
#: painted from the ops: below about this many (200 cells), the span index's fixed cost is
#: no smaller (``bench tui`` compares both).
INDEX_MIN_OPS = 2500


class Row(NamedTuple):
    """One timeline line: a rank, or a collapsed group of ranks (a node, a block, ranks doing
    the same thing).  ``note``: what the row's ranks do, written over the start of its time
    axis (a behaviour row: its gutter holds only the count)."""

    key: str
    label: str
    ranks: tuple[int, ...]
    note: str = ""
    #: a heatmap row: its first ``upper`` ranks are the upper half of each cell, the rest the lower
    upper: int = 0
    #: paint at most this many of its ranks, evenly spread (0: all of them): a row of ranks
    #: doing the same thing (a behaviour row) is shaded from a sample, whatever its count
    sample: int = 0
    #: streams not of the job's run (``TraceModel.foreign_streams``): drawn apart, after the
    #: job's rows, their gutter "⊘" and greyed as the rank table's rows of them
    apart: bool = False

    @property
    def alone(self) -> bool:
        """A row of one rank's own ops (a heatmap line of one rank is still a heatmap line)."""
        return len(self.ranks) == 1 and not self.upper

    def painted_ranks(self) -> tuple[int, ...]:
        """The ranks its cells are painted from (``sample``)."""
        if not self.sample or len(self.ranks) <= self.sample:
            return self.ranks
        step = -(-len(self.ranks) // self.sample)
        return self.ranks[::step]


def row_groups(row: Row) -> list[tuple[int, ...]]:
    """The groups of ranks a collapsed row's cells are counted over (``count_levels``): a
    heatmap line's two blocks, another row's painted ranks."""
    return [row.ranks[:row.upper], row.ranks[row.upper:]] if row.upper else [row.painted_ranks()]


class Window(NamedTuple):
    """What a row is painted for: the time window (``width`` cells of ``npc`` ns from ``t0``),
    the clock (``now``) or the replay cursor (the future hidden), the hang threshold, the
    selected op (rank, index), whether far zoomed out takes the cheaper overview path, and
    from how many ops beginning in the window an overview with a span index is painted
    from it (fewer: from the ops; 0: whenever there is an index).  The last two choose
    only how a row is painted, never what: every choice gives the same picture, so tests
    compare the paths through them."""

    t0: int
    npc: int
    width: int
    now: int
    cursor_ns: int | None = None
    hang_after_ns: int = int(DEFAULT_HANG_AFTER * 10**9)
    sel: tuple[int, int] | None = None
    overview: bool = True
    index_min_ops: int = INDEX_MIN_OPS


#: The narrowest window ``follow`` turns by whole cells (the edge then within 60-80% of it)
FOLLOW_CELLS = 5


def follow(t0: int, npc: int, width: int, edge: int) -> int:
    """Where a window of ``width`` cells of ``npc`` ns following the live ``edge`` starts:
    where it is while the edge lies within 10-90% of it, else the edge at 60% (or just
    past, by up to a cell).  In pages, so that most frames keep their window and what was painted over it
    (``repaint_ranks``, ``count_levels``), and by whole cells, so that a page turned keeps
    the cells it still shows (``count_levels``)."""
    span = npc * width
    if t0 + span * 0.1 <= edge <= t0 + span * 0.9:
        return t0
    if width < FOLLOW_CELLS:  # (a cell a fifth of the window or more: whole cells could pass the edge by)
        return edge - int(span * 0.6)
    return t0 + (edge - int(span * 0.6) - t0) // npc * npc


def render_row(m: ModelLike, row: Row, win: Window, *, kind: str = "unknown", focused: bool = False,
               flagged: bool = False, cats: np.ndarray | None = None,
               painted: tuple[np.ndarray, list] | None = None,
               spans: Mapping[int, SpanIndex] | None = None,
               levels: Sequence[tuple[np.ndarray, np.ndarray]] | None = None,
               gone: Sequence[np.ndarray] | None = None) -> Strip:
    """A whole timeline line: the gutter (state dot ``kind``, label, findings mark) and the
    row's cells over ``win`` (``painted``: a one-rank row's cells and labels, already
    painted; ``levels``: a collapsed row's, its ``row_groups``' levels, made with a frame's
    other rows by ``count_levels``; ``gone``: a heatmap line's blocks' ``gone_cells``), with the
    replay cursor drawn on top.  ``spans``: span
    indexes by rank (for the overview; see ``paint_rank``)."""
    w = win.width
    width = w + GUTTER
    if row.alone:
        r = row.ranks[0]
        cells, labels = painted if painted is not None else paint_rank(m, r, win, cats,
                                                                        None if spans is None else spans[r])
        segs = _segments(cells, labels)
    elif row.upper:
        segs = paint_heat(m, row.ranks[:row.upper], row.ranks[row.upper:], win, cats, spans, levels, gone)
    else:
        segs = paint_group(m, row.painted_ranks(), win, cats, spans, None if levels is None else levels[0])
    strip = Strip(_gutter(row, kind, focused, flagged) + segs, width)
    noted = 0  # (the cells the note covers: the cursor is not drawn over its words, helper-188)
    if row.note and w > 8:
        note = f" {row.note} "[:w - 2]
        noted = cell_len(note)
        strip = Strip.join([strip.crop(0, GUTTER), Strip([Segment(note, _NOTE)], noted),
                            strip.crop(GUTTER + noted, width)])
    if win.cursor_ns is not None:
        c = (win.cursor_ns - win.t0) // win.npc
        if noted <= c < w:
            x = GUTTER + int(c)
            strip = Strip.join([strip.crop(0, x), Strip([_CURSOR], 1),
                                strip.crop(x + 1, width)])
    return strip.crop(0, width)


#: The characters of a row's label in the gutter
LABEL = GUTTER - 4


def fit_label(text: str, tail: bool = False) -> str:
    """A row's label in ``LABEL`` characters, a cut one saying so: its head and "…" ("r128-…",
    not "r128-25", which read as a range of its own: helper-165), or, ``tail``, "…" and its
    tail (a host's: "…e00256", not "node002", another host's name)."""
    if len(text) <= LABEL:
        return text
    if tail:
        return "…" + text[-(LABEL - 1):]
    head = text[:LABEL - 1]
    dash = head.find("-")  # (a range whose end does not fit: cut after its dash, "r512-…", not "r512-1…")
    return (head[:dash + 1] if 0 < dash < len(head) - 1 else head) + "…"


def _gutter(row: Row, kind: str, focused: bool, flagged: bool) -> list[Segment]:
    label = fit_label(row.label).ljust(LABEL)
    if row.apart:  # (no rank of the job's: no state of the job's either)
        return [_APART, _SPACE, Segment(label, _APART_FOCUSED if focused else palette.FOREIGN_STYLE),
                _FLAG if flagged else _NO_FLAG, _BAR]
    return [Segment(palette.STATE_DOT[kind], palette.STATE_STYLE[kind]), _SPACE,
            Segment(label, _FOCUSED if focused else _BOLD), _FLAG if flagged else _NO_FLAG, _BAR]


_BOLD, _FOCUSED = Style(bold=True), Style(bold=True, reverse=True)
_APART, _APART_FOCUSED = Segment("⊘", palette.FOREIGN_STYLE), palette.FOREIGN_STYLE + Style(reverse=True)
_NOTE = Style(color="grey85", bgcolor="grey23")
#: A heatmap cell's colours: the busy levels (0-4), then slow, past hang_after, all exited, one down
_HEAT_COLOURS = [*palette.HEAT, *(colour for colour, _ in palette.HEAT_LEGEND)]
_HEAT_WARN, _HEAT_ERROR, _HEAT_EXITED, _HEAT_DOWN = range(len(palette.HEAT), len(_HEAT_COLOURS))
_HEAT_STYLES = [[Style(color=a, bgcolor=b) for b in _HEAT_COLOURS] for a in _HEAT_COLOURS]
_CURSOR = Segment("│", Style(color="#ffd75f", bold=True))
_SPACE, _BAR = Segment(" "), Segment("│", Style(color="grey30"))
_FLAG, _NO_FLAG = Segment("!", Style(color="#e05050", bold=True)), Segment(" ", Style(color="#e05050", bold=True))


def paint_rank(m: ModelLike, rank: int, win: Window, cats: np.ndarray | None = None,
               spans: SpanIndex | None = None) -> tuple[np.ndarray, list[tuple[int, int, str, int]]]:
    """One rank's row as a category per cell, and (start cell, length, text, category)
    labels for wide spans.  Pure but for ``spans``: reads ``m`` (a ``TraceModel`` or its
    published ``ModelView``) and nothing else; ``cats`` is ``categories(m.sigs)`` if the
    caller keeps one.  ``spans``: the rank's span index, which the overview of a published
    view paints from (brought up to date here); the picture is the same without it."""
    cells, cands, _, _ = _paint(m, rank, win, cats, spans=spans)
    return cells, _labels(cells, cands)


class Painted(NamedTuple):
    """A painted row and what repainting it after a change needs (``repaint_rank``)."""

    version: int  # the rank's version painted
    n: int  # its op count then
    now: int
    open_min: int  # earliest begin among the ops in flight then (their spans grow with the clock)
    count: int  # ops drawn (in the window, top-level, not in the future): picks the drawing
    overview: bool  # drawn by the overview path
    cells: np.ndarray
    cands: list[tuple[int, int, int, int, str]]  # label candidates, see _paint
    labels: list[tuple[int, int, str, int]]


def repaint_rank(m: ModelLike, rank: int, win: Window, prev: Painted | None,
                 cats: np.ndarray | None = None, spans: SpanIndex | None = None) -> Painted:
    """``paint_rank`` given the same row painted earlier over the same window (``prev``):
    only the cells from the earliest op changed since (``RankView.touched_since``) or in
    flight are painted again, from the ops overlapping them; the cells before are kept.
    A cell depends only on the ops that touch it, and the drawing (overview or detailed)
    on how many ops the window holds, which only grows by the ops added: so the result is
    what ``paint_rank`` gives."""
    return repaint_ranks(m, [(rank, prev, spans)], win, cats)[0]


def repaint_ranks(m: ModelLike, rows: Sequence[tuple[int, Painted | None, SpanIndex | None]], win: Window,
                  cats: np.ndarray | None = None) -> list[Painted]:
    """``repaint_rank`` for several rows (rank, painted before, span index) over one window,
    painted together (``_paint_rows``): what a frame after a batch of events needs."""
    if cats is None or cats.shape[0] < len(m.sigs):
        cats = categories(m.sigs)
    out: list[Any] = [None] * len(rows)
    plans = []  # (row, version, n, open_min, cells kept)
    jobs: list[Job] = []
    for k, (rank, prev, spans) in enumerate(rows):
        rt = m.ranks.get(rank)
        version, n = (-1, 0) if rt is None else (rt.version, rt.n)
        open_min = I64_MAX if rt is None else _open_min(rt)
        dirty = None
        if prev is not None and rt is not None and hasattr(rt, "touched_since") and len(prev.cands) < 40:
            dirty = rt.touched_since(prev.version)  # (at the label cap: everything again, below)
            if dirty is not None and (win.now != prev.now or version != prev.version):
                dirty = min(dirty, open_min, prev.open_min)
        d = 0 if dirty is None else min(max((dirty - win.t0) // win.npc, 0), win.width) if dirty < I64_MAX else win.width
        if prev is not None and d >= win.width:  # nothing in view changed
            out[k] = prev._replace(version=version, n=n, now=win.now, open_min=open_min)
            continue
        if prev is None or d == 0:
            jobs.append(Job(rank, spans=spans))
        else:
            jobs.append(Job(rank, win.t0 + d * win.npc - 1, (prev.count, prev.n)))
        plans.append((k, version, n, open_min, d))
    again = []  # rows whose drawing the ops added switched: all of it changes
    for (k, version, n, open_min, d), job, (cells, cands, overview, count) in zip(
            plans, jobs, _paint_rows(m, win, jobs, cats), strict=True):
        prev = rows[k][1]
        if job.from_t is not None:
            if overview != prev.overview:
                again.append((k, version, n, open_min))
                continue
            cells = np.concatenate([prev.cells[:d], cells[d:]])
            # candidates of spans ending before the repainted part are as they were; the others are new
            cands = sorted([c for c in prev.cands if c[3] < d] + [c for c in cands if c[3] >= d])[:40]
        out[k] = Painted(version, n, win.now, open_min, count, overview, cells, cands, _labels(cells, cands))
    if again:
        redone = _paint_rows(m, win, [Job(rows[k][0], spans=rows[k][2]) for k, *_ in again], cats)
        for (k, version, n, open_min), (cells, cands, overview, count) in zip(again, redone, strict=True):
            out[k] = Painted(version, n, win.now, open_min, count, overview, cells, cands, _labels(cells, cands))
    return out


def _open_min(rt: RankColumns) -> int:
    """The earliest begin among a rank's ops in flight (I64_MAX: none): their spans grow with
    the clock, and their ends may be written after a view was published."""
    return int(rt.begin[list(rt.open)].min()) if rt.open else I64_MAX


def _labels(cells: np.ndarray, cands: list[tuple[int, int, int, int, str]]) -> list[tuple[int, int, str, int]]:
    """Labels on the wide spans (the first 40 by begin), each only over a run of one colour:
    a label must not straddle wait/issue parts."""
    labels = []
    for _, _, a, b, text in cands[:40]:
        if b - a + 1 >= len(text) + 2 and (cells[a + 1:a + 1 + len(text)] == cells[a + 1]).all():
            labels.append((a + 1, len(text), text, int(cells[a + 1])))
    return labels


def _paint(m: ModelLike, rank: int, win: Window, cats: np.ndarray | None = None, from_t: int | None = None,
           base: tuple[int, int] = (0, 0), spans: SpanIndex | None = None
           ) -> tuple[np.ndarray, list[tuple[int, int, int, int, str]], bool, int]:
    """(cells, label candidates, whether drawn as an overview (one span per op: more than 4
    ops per cell), ops drawn).  A candidate
    is a span at least 8 cells wide: (begin, op index, first cell, last cell, text), by begin.
    ``from_t``: only the ops overlapping [from_t, end of window), so only the cells from
    ``from_t`` on are right; ``base``: (ops drawn, op count) of the same window painted
    before, so that the count, and the drawing it picks, is the whole window's.
    ``spans``: the rank's span index: a whole overview of a published view is painted from
    it (``_paint_indexed``), the same picture in O(cells x log ops)."""
    return _paint_rows(m, win, [Job(rank, from_t, base, spans)], cats)[0]


class Job(NamedTuple):
    """One row for ``_paint_rows``: ``_paint``'s arguments but the window."""

    rank: int
    from_t: int | None = None
    base: tuple[int, int] = (0, 0)
    spans: SpanIndex | None = None


class RowOps(NamedTuple):
    """One row's drawn ops (``_drawn``), as ``_paint_rows`` hands them to ``_draw_rows``."""

    job: int  # its place in the jobs
    rt: RankColumns  # the rank's trace (RankView or RankTrace)
    idx: np.ndarray  # op indices, by begin
    code: np.ndarray
    begin: np.ndarray
    stop: np.ndarray
    inflight: np.ndarray
    count: int  # ops the whole window draws (picks the drawing)


def _blank(w: int) -> np.ndarray:
    cells = _EMPTY.get(w)
    if cells is None:
        cells = _EMPTY[w] = np.zeros(w, np.int8)
        cells.flags.writeable = False
    return cells


def _paint_rows(m: ModelLike, win: Window, jobs: Sequence[Job], cats: np.ndarray | None = None
                ) -> list[tuple[np.ndarray, list[tuple[int, int, int, int, str]], bool, int]]:
    """``_paint`` for several rows over one window: each row's ops are found and filtered on
    its own, then drawn together (intervals per op, coverage, labels), so the fixed cost of
    the numpy calls is paid once per frame, not once per row."""
    w = win.width
    t0, npc = win.t0, win.npc
    if cats is None or cats.shape[0] < len(m.sigs):
        cats = categories(m.sigs)
    out: list[Any] = [None] * len(jobs)
    rows: list[RowOps] = []
    for k, job in enumerate(jobs):
        rt = m.ranks.get(job.rank)
        if rt is None or rt.n == 0:
            out[k] = (_blank(w), [], False, 0)
            continue
        if job.spans is not None and job.from_t is None and win.overview and isinstance(rt, RankView):
            done = _paint_indexed(m, rt, job.rank, win, cats, job.spans)
            if done is not None:
                out[k] = (*done[:2], True, done[2])
                continue
        idx = rt.window(t0 if job.from_t is None else max(t0, job.from_t), t0 + w * npc)
        if idx.shape[0]:
            idx, code, begin, _, inflight, stop = _drawn(rt, idx, cats, win)
        if idx.shape[0] == 0:
            out[k] = (_blank(w), [], job.base[0] > 4 * w, job.base[0])
            continue
        count = idx.shape[0] if job.from_t is None else job.base[0] + int((idx >= job.base[1]).sum())
        if win.overview and count > 4 * w and (len(jobs) == 1 or idx.shape[0] > 256):
            # many ops, one span each: the drawing that does per op only what it must
            out[k] = (*_paint_overview(m, rt, job.rank, win, idx, code, begin, stop, inflight), True, count)
            continue
        rows.append(RowOps(k, rt, idx, code, begin, stop, inflight, count))
    if rows:
        for k, row_out in zip((r.job for r in rows), _draw_rows(m, win, jobs, rows), strict=True):
            out[k] = row_out
    return out


def _draw_rows(m: ModelLike, win: Window, jobs: Sequence[Job], rows: list[RowOps]) -> list:
    """The drawing of ``_paint_rows``: every row's ops (by begin) as intervals of categories,
    their coverage per cell, and the label candidates, all rows at once."""
    w = win.width
    sizes = [r.idx.shape[0] for r in rows]
    offsets = np.cumsum([0, *sizes])  # where each row's ops start
    row = np.repeat(np.arange(len(rows)), sizes)
    code = np.concatenate([r.code for r in rows]) if len(rows) > 1 else rows[0].code
    begin = np.concatenate([r.begin for r in rows]) if len(rows) > 1 else rows[0].begin
    stop = np.concatenate([r.stop for r in rows]) if len(rows) > 1 else rows[0].stop
    inflight = np.concatenate([r.inflight for r in rows]) if len(rows) > 1 else rows[0].inflight
    flags = np.concatenate([r.rt.flags[r.idx] for r in rows]) & APPROX
    counts = np.array([r.count for r in rows])
    overview = counts > 4 * w  # far zoomed out the issue/wait breakdown is invisible: one span per op
    ai = np.flatnonzero(((code & ASYNC_BIT) | flags) != 0)
    end = wb = we = None
    if ai.shape[0]:  # the issue/wait parts of async work: only where there is some
        end, wb, we = (np.zeros(ai.shape[0], np.int64) for _ in range(3))
        for j, r in enumerate(rows):
            lo, hi = int(offsets[j]), int(offsets[j + 1])
            sub = np.flatnonzero((ai >= lo) & (ai < hi))
            if sub.shape[0]:
                ops = r.idx[ai[sub] - lo]
                end[sub], wb[sub], we[sub] = r.rt.end[ops], r.rt.wb[ops], r.rt.we[ops]
    sel: list[int] = []
    if win.sel:
        for j, r in enumerate(rows):
            if jobs[r.job].rank != win.sel[0]:
                continue
            hit = np.flatnonzero(r.idx == win.sel[1])
            if hit.shape[0]:
                sel.append(int(offsets[j]) + int(hit[0]))
    starts, stops, kinds, rows_of = _intervals(win, row, code, begin, stop, inflight, flags, overview[row],
                                               ai, end, wb, we, sel)
    t0, npc = win.t0, win.npc
    if len(rows) == 1:
        one = [_cover(starts, stops, kinds, t0, npc, w)]
    else:
        one = _cover_rows(starts, stops, kinds, rows_of, len(rows), t0, npc, w)
    cands = _candidates(m, [(r.rt, r.idx) for r in rows], begin, stop, row, win)
    return [(one[j], cands[j], bool(overview[j]), int(counts[j])) for j in range(len(rows))]


def _intervals(win: Window, row: np.ndarray, code: np.ndarray, begin: np.ndarray, stop: np.ndarray,
               inflight: np.ndarray, approx: np.ndarray, overview: np.ndarray, ai: np.ndarray,
               end: np.ndarray | None, wb_ai: np.ndarray | None, we_ai: np.ndarray | None,
               sel: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """What drawn ops cover, as intervals (start, stop, category, row): each op's span in
    its traffic category; for async work (``ai``: its positions; ``end``, ``wb_ai``,
    ``we_ai``: its end and wait's, there) the issue, then a thin line while it runs, then
    its wait, or far zoomed out (``overview``: each op's row's) one span to the wait's end;
    the part of an op in flight past the hang thresholds; the selected ops (``sel``: their
    positions).  One drawing for a row of one rank and for a row of thousands
    (``count_levels``): the arrays hold the rows' ops laid end to end, ``row`` telling whose."""
    now = win.now
    is_async = ((code & ASYNC_BIT) | approx) != 0
    cat = code & CAT_MASK
    starts: list[np.ndarray] = [begin]
    stops: list[np.ndarray] = []
    kinds: list[np.ndarray] = [cat]
    rows_of: list[np.ndarray] = [row]

    def add(mask: np.ndarray, a: np.ndarray, b: np.ndarray, kind: int) -> None:
        if mask.any():
            starts.append(a[mask])
            stops.append(b[mask])
            kinds.append(np.full(int(mask.sum()), kind, np.int8))
            rows_of.append(row[mask])

    wb = issue_end = None
    if ai.shape[0]:
        assert end is not None and wb_ai is not None and we_ai is not None
        issue_end, wb, we = begin.copy(), np.zeros_like(begin), np.zeros_like(begin)
        issue_end[ai] = np.where(approx[ai] != 0, begin[ai], np.where(end > 0, end, begin[ai]))
        wb[ai], we[ai] = wb_ai, we_ai
        if win.cursor_ns is not None:
            wb = np.where(wb > now, 0, wb)
            we = np.where(we > now, 0, we)
        # an op is drawn within its span, from its begin to its completion (or the clock, in
        # flight): a GPU op's wait() called after the GPU had done (its completion), an issue
        # returning after it, a wait begun before the op (hostile) are drawn where they fall
        # in it.  So an op's drawing starts at its begin, which its changes are logged by, and
        # ends by its completion, which windows find it by (``count_levels`` keeps the rest)
        last = np.maximum(stop, begin)
        issue_end = np.minimum(np.maximum(issue_end, begin), last)
        wb = np.where(wb > 0, np.minimum(np.maximum(wb, begin), last), 0)
        we = np.where(we > 0, np.minimum(we, stop), 0)
        ov = overview[ai]
        wb_a, we_a, stop_a = wb[ai], we[ai], stop[ai]
        waited = wb_a > 0
        # sync ops, the issue part of async ones (overview: the whole op, to the wait's end)
        stops.append(stop.copy())
        stops[0][ai] = np.where(ov, np.where(waited, np.where(we_a > 0, we_a, stop_a), stop_a), issue_end[ai])
        # async issue -> wait: a thin line while the op runs in the background; then the wait
        detail = ~ov
        pend = ai[detail]
        if pend.shape[0]:
            starts.append(issue_end[pend])
            stops.append(np.where(waited[detail], wb_a[detail], stop_a[detail]))
            kinds.append(np.full(pend.shape[0], palette.PENDING, np.int8))
            rows_of.append(row[pend])
            wi = ai[detail & waited]
            if wi.shape[0]:
                we_w = we[wi]
                starts.append(wb[wi])
                stops.append(np.where(we_w > 0, we_w, stop[wi]))
                kinds.append(np.full(wi.shape[0], palette.WAIT, np.int8))
                rows_of.append(row[wi])
    else:
        stops.append(stop)
    # blocked too long: the part of the span past the thresholds
    if inflight.any():
        blocked = inflight & (~is_async | (wb > 0)) if wb is not None else inflight
        since = np.where(is_async, wb, begin) if wb is not None else begin
        warn_at = since + max(win.hang_after_ns // 3, 1)
        err_at = since + win.hang_after_ns
        add(blocked & (warn_at < now), warn_at, stop, palette.WARN)
        add(blocked & (err_at < now), err_at, stop, palette.ERROR)
    for at in sel:
        e = int(stop[at]) if not is_async[at] or issue_end is None else max(int(stop[at]), int(issue_end[at]))
        starts.append(begin[at:at + 1])
        stops.append(np.array([e], np.int64))
        kinds.append(np.array([palette.SELECTED], np.int8))
        rows_of.append(row[at:at + 1])
    if len(starts) == 1:
        return starts[0], stops[0], kinds[0], rows_of[0]
    return np.concatenate(starts), np.concatenate(stops), np.concatenate(kinds), np.concatenate(rows_of)


def _candidates(m: ModelLike, rows: Sequence[tuple[Any, np.ndarray]], begin: np.ndarray, stop: np.ndarray,
                row: np.ndarray | None, win: Window) -> list[list[tuple[int, int, int, int, str]]]:
    """Label candidates of each row: its first 40 spans (``begin``..``stop``, by begin; rows'
    ops one after the other, ``row`` telling whose) at least 8 cells wide, as (begin, op
    index, first cell, last cell, text).  ``rows``: (rank trace, op indices) of each."""
    t0, npc, w = win.t0, win.npc, win.width
    out: list[list[tuple[int, int, int, int, str]]] = [[] for _ in rows]
    cand = np.flatnonzero(stop - begin > 7 * npc)  # c1 - c0 >= 8 needs a span longer than 7 cells
    if not cand.shape[0]:
        return out
    c0 = np.minimum(np.maximum((begin[cand] - t0) // npc, -1), w)
    c1 = np.minimum(np.maximum((stop[cand] - t0) // npc, -1), w)
    first = np.cumsum([0, *(idx.shape[0] for _, idx in rows)])
    columns: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # (a published view's columns are sliced when read)
    for q in np.flatnonzero((c1 - c0) >= 8).tolist():
        j = int(cand[q])
        r = 0 if row is None else int(row[j])
        if len(out[r]) >= 40:
            continue
        rt, idx = rows[r]
        seqs, sigs = columns.get(r) or columns.setdefault(r, (rt.seq, rt.sig))
        i = int(idx[j - int(first[r])])
        seq = int(seqs[i])
        text = m.sigs[int(sigs[i])].op + (f" #{seq}" if seq >= 0 else "")
        out[r].append((int(begin[j]), i, max(int(c0[q]), 0), min(int(c1[q]), w - 1), text))
    return out


def _drawn(rt: RankColumns, idx: np.ndarray, cats: np.ndarray, win: Window
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Of the ops ``idx`` (by begin), those drawn: not inner traffic (drawn as its outer op)
    and, with the replay cursor, begun by then.  Returns (idx, paint code, begin, completion,
    in flight, drawn end), completion 0 and the end at the clock for the ops in flight
    (with the cursor: not complete by then)."""
    code = cats[rt.sig[idx]]  # category, async, hidden: see categories
    hidden = code >= HIDDEN_BIT  # inner traffic is drawn as its outer op
    if hidden.any():
        keep = ~hidden
        idx, code = idx[keep], code[keep]
    now = win.now
    begin = rt.begin[idx]
    comp = rt.comp[idx]
    if win.cursor_ns is not None:  # replay: the future has not happened yet
        comp = np.where(comp > now, 0, comp)
        visible = begin <= now
        idx, code, begin, comp = idx[visible], code[visible], begin[visible], comp[visible]
    inflight = comp == 0
    stop = np.where(inflight, max(now, 1), comp) if inflight.any() else comp
    return idx, code, begin, comp, inflight, stop


def _position(sb: np.ndarray, order: np.ndarray, begin: np.ndarray, i: int) -> int:
    """Where op ``i`` stands in a rank's begin order (its ``sb``, ``order_`` and ``begin``:
    a published view's columns are sliced when read, so a caller reads them once)."""
    p = int(np.searchsorted(sb, begin[i], side="left"))
    while p < order.shape[0] and order[p] != i:  # (ties in begin: a few)
        p += 1
    return p


def _paint_indexed(m: ModelLike, rv: RankView, rank: int, win: Window, cats: np.ndarray,
                   spans: SpanIndex) -> tuple[np.ndarray, list[tuple[int, int, int, int, str]], int] | None:
    """The overview of a whole window from the rank's span index (brought up to date with
    ``rv`` here): (cells, label candidates, ops drawn), or None when the window holds too
    few ops for an overview, or too few for the index to pay (``win.index_min_ops``).

    The window's ops (``RankView.window``) are those beginning in it (positions [lo, hi) of
    the begin order, counted by the index), those straddling its start and those in flight.
    The index draws the completed ones of the first kind; the others, the selection and
    (replay cursor) the ops not over by the cursor are drawn from the ops, as
    ``_paint_overview`` draws any: the highest category of the two pictures is the one
    ``_paint`` draws from all of them.  Labels: the spans wide enough, from both."""
    t0, npc, w, now = win.t0, win.npc, win.width, win.now
    t1 = t0 + w * npc
    cursor = win.cursor_ns
    sb, order = rv.sb, rv.order_
    s0, i1 = np.searchsorted(sb, np.array([t0, t1], np.int64), side="left").tolist()
    i0 = int(np.searchsorted(rv.pmax, t0, side="left"))  # (as ``RankView.window``)
    if cursor is not None:
        i1 = min(i1, int(np.searchsorted(sb, now, side="right")))
    lo = max(s0, i0)
    hi = max(i1, lo)
    if hi - lo < win.index_min_ops or spans.build_later():  # from the ops: no dearer, or no index yet
        return None
    spans.update(rv, cats)
    parts = []  # ops of the window drawn from the ops
    if i0 < s0:  # begun before the window, ending in it or in flight
        early = order[i0:s0]
        ends = rv.comp[early]
        parts.append(early[(ends > t0) | (ends == 0)])
    begin = rv.begin
    flight = [i for i in rv.open if begin[i] < t1]
    outside = [i for i in flight if not lo <= _position(sb, order, begin, i) < hi]
    if outside:
        parts.append(np.array(outside, np.int64))
    extra = np.unique(np.concatenate(parts)) if parts else np.zeros(0, np.int64)
    if extra.shape[0]:
        extra = extra[np.argsort(begin[extra], kind="stable")]
        extra = _drawn(rv, extra, cats, win)[0]
    count = spans.drawn(lo, hi) + extra.shape[0]
    if count <= 4 * w:
        return None
    cells, rest = spans.cells(lo, hi, t0, npc, w, cursor)
    parts = [extra, order[spans.in_flight(lo, hi)], *(order[p] for p in rest)]
    if flight:
        parts.append(np.array(flight, np.int64))
    if win.sel and win.sel[0] == rank and 0 <= win.sel[1] < rv.n and lo <= _position(sb, order, begin, win.sel[1]) < hi:
        parts.append(np.array([win.sel[1]], np.int64))
    slow = np.unique(np.concatenate(parts))
    cands: list[tuple[int, int, int, int, str]] = []
    if slow.shape[0]:
        slow = slow[np.argsort(rv.begin[slow], kind="stable")]
        idx, code, begin, _, inflight, stop = _drawn(rv, slow, cats, win)
        if idx.shape[0]:
            drawn, cands = _paint_overview(m, rv, rank, win, idx, code, begin, stop, inflight)
            np.maximum(cells, drawn, out=cells)
            slow = idx
    wide = order[spans.wide(rv, cats, lo, hi, 7 * npc)]
    if wide.shape[0]:
        wide = wide[~np.isin(wide, slow)]
        begin, stop = rv.begin[wide], rv.comp[wide]
        c0 = np.minimum(np.maximum((begin - t0) // npc, -1), w)
        c1 = np.minimum(np.maximum((stop - t0) // npc, -1), w)
        for k in np.flatnonzero((c1 - c0) >= 8).tolist():
            i = int(wide[k])
            seq = int(rv.seq[i])
            text = m.sigs[int(rv.sig[i])].op + (f" #{seq}" if seq >= 0 else "")
            cands.append((int(begin[k]), i, max(int(c0[k]), 0), min(int(c1[k]), w - 1), text))
        cands.sort(key=lambda c: (c[0], c[1]))
    return cells, cands[:40], count


def _paint_overview(m: ModelLike, rt: RankColumns, rank: int, win: Window, idx: np.ndarray, code: np.ndarray,
                    begin: np.ndarray, stop: np.ndarray,
                    inflight: np.ndarray) -> tuple[np.ndarray, list[tuple[int, int, int, int, str]]]:
    """Far zoomed out (several ops per cell): each op one span, the issue/wait breakdown
    left out.  The same picture as the detailed path draws there, with the per-op work
    done only on the few ops that need it: async ops (their span ends at wait_end),
    in-flight ones (thresholds), the selection and spans wide enough for a label."""
    t0, npc, w, now = win.t0, win.npc, win.width, win.now
    approx = (rt.flags[idx] & APPROX) != 0
    is_async = ((code & ASYNC_BIT) != 0) | approx
    ai = np.flatnonzero(is_async)
    end = stop
    wb_a = we_a = None
    if ai.shape[0]:
        sub = idx[ai]
        wb_a, we_a = rt.wb[sub], rt.we[sub]
        if win.cursor_ns is not None:
            wb_a = np.where(wb_a > now, 0, wb_a)
            we_a = np.where(we_a > now, 0, we_a)
        end = stop.copy()
        end[ai] = np.where(wb_a > 0, np.where(we_a > 0, we_a, stop[ai]), stop[ai])
    span_kind = code & CAT_MASK
    starts, stops, kinds = [begin], [end], [span_kind]
    fi = np.flatnonzero(inflight)
    if fi.shape[0]:  # blocked too long: the part of the span past the thresholds
        fa = is_async[fi]
        wb_f = np.zeros(fi.shape[0], np.int64)
        if ai.shape[0] and fa.any():
            wb_f[fa] = wb_a[np.searchsorted(ai, fi[fa])]
        blocked = ~fa | (wb_f > 0)
        since = np.where(fa, wb_f, begin[fi])
        for at, cat in ((since + max(win.hang_after_ns // 3, 1), palette.WARN), (since + win.hang_after_ns, palette.ERROR)):
            mk = blocked & (at < now)
            if mk.any():
                starts.append(at[mk])
                stops.append(stop[fi][mk])
                kinds.append(np.full(int(mk.sum()), cat, np.int8))
    if win.sel and win.sel[0] == rank:
        one = np.flatnonzero(idx == win.sel[1])
        if one.shape[0]:
            j = int(one[0])
            e = int(stop[j])
            if is_async[j]:
                i = int(idx[j])
                ie = int(begin[j]) if approx[j] else (int(rt.end[i]) if rt.end[i] > 0 else int(begin[j]))
                if win.cursor_ns is not None:
                    ie = min(ie, e)
                e = max(e, ie)
            starts.append(begin[j:j + 1])
            stops.append(np.array([e], np.int64))
            kinds.append(np.array([palette.SELECTED], np.int8))
    if len(starts) == 1:
        cells = _cover(begin, end, span_kind, t0, npc, w)
    else:
        cells = _cover(np.concatenate(starts), np.concatenate(stops), np.concatenate(kinds), t0, npc, w)
    return cells, _candidates(m, [(rt, idx)], begin, stop, None, win)[0]


def group_levels(m: ModelLike, ranks: tuple[int, ...], win: Window, cats: np.ndarray | None = None,
                 spans: Mapping[int, SpanIndex] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per cell, how many of the ranks are busy (level 0: none, 1-4: up to all) and the worst
    category among them (0, or WARN / ERROR / SELECTED): what a collapsed row shows."""
    return levels_of(m, [ranks], win, cats, spans)[0]


def rows_levels(m: ModelLike, rows: Sequence[Row], win: Window, cats: np.ndarray | None = None,
                spans: Mapping[int, SpanIndex] | None = None, prev: Counted | None = None
                ) -> tuple[list[list[tuple[np.ndarray, np.ndarray]]], Counted]:
    """Each collapsed row's levels (its ``row_groups``'), all of ``rows`` counted together
    (``count_levels``; ``prev``: what the last call returned, to count only what changed
    since): what ``render_row`` takes as ``levels``, and what to pass as ``prev`` next."""
    groups = [row_groups(row) for row in rows]
    counted = count_levels(m, [g for gs in groups for g in gs], win, cats, spans, prev)
    got = counted.levels
    out, at = [], 0
    for gs in groups:
        out.append(got[at:at + len(gs)])
        at += len(gs)
    return out, counted


def levels_of(m: ModelLike, groups: Sequence[tuple[int, ...]], win: Window, cats: np.ndarray | None = None,
              spans: Mapping[int, SpanIndex] | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
    """``group_levels`` of each of ``groups`` over one window, every rank's ops drawn together
    (``count_levels``)."""
    return count_levels(m, groups, win, cats, spans).levels


class Counted(NamedTuple):
    """Collapsed rows counted over one window (``count_levels``), and what counting them again
    over a later view of the model needs."""

    groups: Sequence[tuple[int, ...]]
    win: Window
    lineage: int  # the model's (``TraceModel.lineage``)
    version: int  # and its version counted
    busy: np.ndarray  # (groups, width): per cell, how many of the group's ranks are busy
    worst: np.ndarray  # (groups, width): the worst category among them (0, WARN, ERROR, SELECTED)
    drawn: np.ndarray  # per rank (in the order ``groups`` first name them): ops the window draws (picks the drawing)
    n: np.ndarray  # per rank: its op count then
    members: Members
    start: int = 0  # the first cell counted this time (0: all of them; the width: none)
    ops: int = 0  # the ops counted this time (drawn together; those of ranks painted alone apart)

    @property
    def levels(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """Each group's (level per cell: 0 none busy, 1-4 up to all; worst category)."""
        out = []
        for g, n_busy, worst in zip(self.groups, self.busy, self.worst, strict=True):
            frac = n_busy / max(1, len(g))
            out.append((np.where(n_busy > 0, np.maximum(1, np.round(frac * 4)), 0).astype(np.int8), worst))
        return out


def count_levels(m: ModelLike, groups: Sequence[tuple[int, ...]], win: Window, cats: np.ndarray | None = None,
                 spans: Mapping[int, SpanIndex] | None = None, prev: Counted | None = None) -> Counted:
    """How many of each group's ranks are busy in each cell of ``win``, and the worst category
    among them, every rank's ops drawn together (``_intervals``, as a rank's own row draws
    them): a heatmap of 16,384 ranks painted rank by rank took ~1.6 s a frame, a numpy call or
    two dozen per rank.  A rank whose view lies in a block in time order (most: ``RankView``)
    finds its window's ops with the other ranks of its block (``runsearch.first_at_least``); any other
    rank, and one whose window holds enough ops for its span index to pay (``spans``, far
    zoomed out), is painted on its own (``paint_rank``) and counted the same way.  The same
    levels as painting each rank.

    ``prev``: the same groups counted over the same window (but the clock), or one moved on
    by whole cells (``follow`` turning a page), from an earlier view of the same model.  Then
    only the cells from the earliest begin among the ops changed since (``touched_since``),
    the earlier of the two clocks (where ops in flight grow) or the end of the earlier window
    are counted again, from the ops reaching them; the cells before are kept, as
    ``repaint_ranks`` keeps a row's.  At the live edge that is the last second or so of the
    window's ops, not all of them: a heatmap of 16k ranks at 25 collectives a second holds
    ~3M ops.  A window moved on keeps them only where every rank was drawn op by op and
    still is, which a bound of its ops in the new window tells (the ops that left it are not
    counted).  The same counts as counting all again (the tests compare the two)."""
    w = win.width
    if cats is None or cats.shape[0] < len(m.sigs):
        cats = categories(m.sigs)
    start = 0  # the first cell counted again
    shift = 0  # cells the window moved on by since ``prev`` (a page turned at the live edge)
    kept = prev is not None and prev.lineage == m.lineage and prev.version <= m.version \
        and prev.win._replace(t0=0, now=0) == win._replace(t0=0, now=0) \
        and (win.cursor_ns is None or prev.win.now == win.now) and (prev.groups is groups or prev.groups == groups)
    members = prev.members if kept and prev is not None else _members(groups)
    ranks, place, member_rank, member_group = members.ranks, members.place, members.rank, members.group
    ranked = _ranked(m, ranks)
    if kept and prev is not None:
        moved, npc = win.t0 - prev.win.t0, win.npc
        if 0 < moved < w * npc and moved % npc == 0 and (prev.drawn <= 4 * w).all():
            shift = moved // npc  # (each rank drawn op by op: what picks the drawing is bounded below)
        since = m.touched_since(prev.version) if moved == 0 or shift else None
        if since is not None:
            # ops in flight grow from the earlier clock on, and those in flight at publishing may
            # have completed since in the columns the view shares (before any batch says so);
            # the cells past the last window are new
            since = min(since, prev.win.now, win.now, ranked.open_min, prev.win.t0 + w * npc)
            start = int(min(max((since - win.t0) // npc, 0), w)) if since < I64_MAX else w
        if start >= w:  # nothing in view changed (ops added past it are never drawn in it)
            return prev._replace(win=win, version=m.version, start=w, ops=0)
    if start:
        assert prev is not None
        # (ops reaching the cells from ``start`` on; no span index: painted from the ops, the same picture)
        ops = _window_ops(m, ranks, win, cats, None, win.t0 + start * win.npc - 1, bound=shift > 0, ranked=ranked)
        if shift:  # (ops left the window: their count is not known, a bound of it is)
            drawn = ops.bound
        else:
            drawn = prev.drawn + np.bincount(ops.row[ops.index >= prev.n[ops.row]], minlength=len(ranks))
    else:
        ops = _window_ops(m, ranks, win, cats, spans, ranked=ranked)
        drawn = np.bincount(ops.row, minlength=len(ranks))
    for k, _, count in ops.alone:
        drawn[k] = count
    if start and prev is not None and ((drawn > 4 * w) != (prev.drawn > 4 * w)).any():
        return count_levels(m, groups, win, cats, spans)  # some row's drawing switched: all of it changes
    ww = w - start
    busy = np.zeros((len(groups), ww), np.int64)
    worst = np.zeros((len(groups), ww), np.int8)
    for k, cells, _ in ops.alone:
        cells = cells[start:]
        for g in member_group[np.searchsorted(member_rank, k):np.searchsorted(member_rank, k, side="right")].tolist():
            busy[g] += cells >= palette.COLL
            np.maximum(worst[g], np.where(cells >= palette.WARN, cells, 0), out=worst[g])
    if ops.row.shape[0]:
        sel: list[int] = []
        if win.sel and win.sel[0] in place:
            hit = np.flatnonzero((ops.row == place[win.sel[0]]) & (ops.index == win.sel[1]))
            sel = hit[:1].tolist()
        a, b, kind, row = _intervals(win, ops.row, ops.code, ops.begin, ops.stop, ops.inflight, ops.approx,
                                     drawn[ops.row] > 4 * w, ops.asynchronous, ops.end, ops.wb, ops.we, sel)
        c0, c1, row, kind = _cells(a, b, row, kind, win)
        if start:  # (the cells from ``start`` on)
            on = c1 >= start
            c0, c1, row, kind = np.maximum(c0[on], start) - start, c1[on] - start, row[on], kind[on]
        on = kind >= palette.COLL
        busy += _busy_ranks(c0[on], c1[on], row[on], members, len(groups), ww)
        for c in (palette.WARN, palette.ERROR, palette.SELECTED):  # (a group's worst: any of its ranks')
            at = kind == c
            if at.any():
                hit = _counted(c0[at], c1[at], *_by_group(row[at], member_rank, member_group), len(groups), ww) > 0
                np.maximum(worst, np.where(hit, c, 0).astype(np.int8), out=worst)
    if start:
        assert prev is not None
        busy = np.concatenate((prev.busy[:, shift:shift + start], busy), axis=1)
        worst = np.concatenate((prev.worst[:, shift:shift + start], worst), axis=1)
    return Counted(groups, win, m.lineage, m.version, busy, worst, drawn, ops.n, members, start,
                   int(ops.row.shape[0]))


def _cells(a: np.ndarray, b: np.ndarray, row: np.ndarray, kind: np.ndarray,
           win: Window) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Intervals [a, b] as the cells they cover, first and last (``_cell_bounds``: those out
    of view and reversed left out), with their rows and kinds."""
    c0, c1, ok = _cell_bounds(a, b, win.t0, win.npc, win.width)
    return (c0, c1, row, kind) if ok is None else (c0[ok], c1[ok], row[ok], kind[ok])


def _busy_ranks(c0: np.ndarray, c1: np.ndarray, row: np.ndarray, members: Members, groups: int,
                w: int) -> np.ndarray:
    """(groups, w): per cell, how many of each group's ranks one of the ranges [c0, c1] of
    their row covers (a rank counted once, however many cover it: ``busy_counts``)."""
    return busy_counts(c0, c1, row, len(members.ranks), members.laid, members.first, members.first_group,
                       groups, w)


class Members(NamedTuple):
    """Groups of ranks as ``count_levels`` counts them (``_members``)."""

    ranks: list[int]  # each once, in the order the groups first name them
    place: dict[int, int]  # rank -> its place among them
    rank: np.ndarray  # each (rank place, group) pair's rank place, ascending (a rank may be in several groups)
    group: np.ndarray  # ... and its group
    laid: np.ndarray  # the pairs' rank places by group
    first: np.ndarray  # where each group with ranks begins among them
    first_group: np.ndarray  # ... which group that is


def _members(groups: Sequence[tuple[int, ...]]) -> Members:
    """``groups`` as ``Members``: made once for a frame's rows, and kept while they stay."""
    ranks = list(dict.fromkeys(r for g in groups for r in g))
    place = {r: k for k, r in enumerate(ranks)}
    rank = np.array([place[r] for g in groups for r in g], np.int64)
    group = np.repeat(np.arange(len(groups)), [len(g) for g in groups])
    first = np.flatnonzero(np.r_[True, group[1:] != group[:-1]]) if group.shape[0] else group
    order = np.argsort(rank, kind="stable")
    return Members(ranks, place, rank[order], group[order], rank, first, group[first])  # (the pairs come by group)


def _by_group(row: np.ndarray, member_rank: np.ndarray,
              member_group: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(which of the intervals, each group of its rank): an interval of a rank in several
    groups once for each.  ``member_rank`` ascending, ``member_group`` beside it."""
    lo = np.searchsorted(member_rank, row, side="left")
    n = np.searchsorted(member_rank, row, side="right") - lo
    which = np.repeat(np.arange(row.shape[0]), n)
    return which, member_group[_within(n) + np.repeat(lo, n)]


def _counted(c0: np.ndarray, c1: np.ndarray, which: np.ndarray, group: np.ndarray, groups: int,
             w: int) -> np.ndarray:
    """(groups, w): per cell, how many of the ranges [c0, c1] (``which`` of them, in
    ``group``) cover it."""
    k = group * (w + 1)
    n = groups * (w + 1)
    diff = np.bincount(c0[which] + k, minlength=n) - np.bincount(c1[which] + k + 1, minlength=n)
    return diff.reshape(groups, w + 1)[:, :w].cumsum(axis=1)


class WindowOps(NamedTuple):
    """The ops drawn in a window, of many ranks laid end to end (``_window_ops``): each one's
    rank (its place in the ranks asked), index among the rank's ops, paint code, begin, drawn
    end, whether in flight and whether its end is approximate (``APPROX``); the async ones'
    positions with their ends and waits' (``end``, ``wb``, ``we``, at those positions); and
    the ranks painted on their own (place, cells, ops drawn); per rank (by place), its op
    count and, where asked, a bound of the ops the whole window draws of it (those the
    bisection finds, and those in flight)."""

    row: np.ndarray
    index: np.ndarray
    code: np.ndarray
    begin: np.ndarray
    stop: np.ndarray
    inflight: np.ndarray
    approx: np.ndarray
    asynchronous: np.ndarray
    end: np.ndarray
    wb: np.ndarray
    we: np.ndarray
    alone: list[tuple[int, np.ndarray, int]]
    n: np.ndarray
    bound: np.ndarray


class Ranked(NamedTuple):
    """The ranks of a frame's collapsed rows read from their views (``_ranked``), once a frame."""

    views: list[Any]  # each rank's view (None: none), by place
    ordered: np.ndarray  # whether its view lies in a block in time order (with ops)
    place: np.ndarray  # the places of those, ascending
    block: np.ndarray  # ... each one's block (by id: the views of a block share its columns)
    blocks: dict[int, Mapping[str, np.ndarray]]  # block id -> its columns
    at: np.ndarray  # ... where each one's rows start in it
    n: np.ndarray  # ... its op count
    flying: np.ndarray  # ... its ops in flight at publishing (``RankView.open``): how many
    flight_rank: np.ndarray  # ... and which: each one's rank (among those in time order)
    flight_index: np.ndarray  # ... and index
    counts: np.ndarray  # every rank's op count, by place
    open_min: int  # the earliest begin among every rank's ops in flight at publishing (I64_MAX: none)


def _ranked(m: ModelLike, ranks: Sequence[int]) -> Ranked:
    """``ranks``' views read into arrays: a Python step a rank, the least there is (16k ranks
    each frame), and no object made a rank, which the cyclic collector would count and walk."""
    views = list(map(m.ranks.get, ranks))
    if isinstance(m, ModelView) and None not in views:
        # (a published view: loops in C over the ranks, which hold the GIL where the Python
        # steps below let the feed's thread take it every few ms; a view in time order has
        # neither copy of its own, one out of order has both)
        ordered = np.fromiter(map(is_, map(_OWN_SB, views), itertools.repeat(None)), np.bool_, len(views))
        ordered &= np.fromiter(map(_N, views), np.int64, len(views)) > 0
    else:
        ordered = np.fromiter((type(rv) is RankView and rv.n > 0 and rv.own_sb is None and rv.own_pmax is None
                               for rv in views), np.bool_, len(views))
    place_all = np.flatnonzero(ordered)
    counts = np.zeros(len(ranks), np.int64)
    open_min = I64_MAX
    for k in np.flatnonzero(~ordered).tolist():
        rv = views[k]
        if rv is not None and rv.n:
            counts[k] = rv.n
            open_min = min(open_min, _open_min(rv))
    picked = list(itertools.compress(views, ordered))
    p = len(picked)
    rows = list(map(_ROWS, picked))
    block = np.fromiter(map(id, rows), np.int64, p)
    blocks = {b: rows[k] for b, k in zip(*np.unique(block, return_index=True), strict=True)}
    at_all = np.fromiter(map(_AT, picked), np.int64, p)
    n_all = np.fromiter(map(_N, picked), np.int64, p)
    opens = list(map(_OPEN, picked))
    flying = np.fromiter(map(len, opens), np.int64, p)
    flight_rank = np.repeat(np.arange(p), flying)
    flight_index = np.fromiter(itertools.chain.from_iterable(opens), np.int64, flight_rank.shape[0])
    counts[place_all] = n_all
    if flight_rank.shape[0]:
        of = block[flight_rank]
        for key, cols in blocks.items():
            mine = of == key
            if mine.any():
                open_min = min(open_min, int(cols["begin"][at_all[flight_rank[mine]] + flight_index[mine]].min()))
    return Ranked(views, ordered, place_all, block, blocks, at_all, n_all, flying, flight_rank, flight_index,
                  counts, open_min)


def _window_ops(m: ModelLike, ranks: Sequence[int], win: Window, cats: np.ndarray,
                spans: Mapping[int, SpanIndex] | None, from_t: int | None = None, bound: bool = False,
                ranked: Ranked | None = None) -> WindowOps:
    """What ``_paint_rows`` finds and filters rank by rank (``RankView.window``, ``_drawn``),
    for the ranks in time order of each block at once: their window's ops by a binary search
    over all of them (a rank's begins and running max of ends are its block's rows), the
    ops in flight added, inner traffic and (replay) the future left out.  ``from_t``: only
    the ops reaching it or past it (``Job.from_t``); the ranks painted on their own are
    painted whole.  ``bound``: each rank's bound of the ops the whole window draws.
    ``ranked``: ``_ranked(m, ranks)``, where the caller has it."""
    t0, t1, now = win.t0 if from_t is None else max(win.t0, from_t), win.t0 + win.width * win.npc, win.now
    if ranked is None:
        ranked = _ranked(m, ranks)
    views, ordered, counts = ranked.views, ranked.ordered, ranked.counts
    block, blocks, place_all, at_all, n_all = ranked.block, ranked.blocks, ranked.place, ranked.at, ranked.n
    flying, flight_rank, flight_index = ranked.flying, ranked.flight_rank, ranked.flight_index
    bounds = np.zeros(len(ranks), np.int64)
    alone: list[tuple[int, np.ndarray, int]] = []
    if place_all.shape[0] < len(ranks):
        alone = [(k, *_painted_alone(m, ranks[k], win, cats, spans))
                 for k in np.flatnonzero(~ordered).tolist() if views[k] is not None and views[k].n]
    # (each block's ops: their ranks' places, indices, rows in its columns, its columns, and
    # their begins and completions, read once)
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray, Mapping[str, np.ndarray], np.ndarray, np.ndarray]] = []
    for key, cols in blocks.items():
        mine = np.flatnonzero(block == key)
        place, at, n = place_all[mine], at_all[mine], n_all[mine]
        i1 = runsearch.first_at_least(cols["begin"], at, n, t1)
        i0 = runsearch.first_at_least(cols["pmax"], at, n, t0)
        if bound:
            i0_all = i0 if t0 == win.t0 else runsearch.first_at_least(cols["pmax"], at, n, win.t0)
            bounds[place] = np.maximum(i1 - i0_all, 0) + flying[mine]
        sizes = np.maximum(i1 - i0, 0)
        solo = np.zeros(place.shape[0], np.bool_)
        if spans is not None and win.overview:  # enough ops for a span index: painted from it
            solo = sizes >= max(win.index_min_ops, 1)
            for j in np.flatnonzero(solo).tolist():
                alone.append((int(place[j]), *_painted_alone(m, ranks[int(place[j])], win, cats, spans)))
            sizes[solo] = 0
        first = np.cumsum(sizes) - sizes  # where each rank's ops start among the candidates
        who = np.repeat(np.arange(place.shape[0]), sizes)
        index = _within(sizes) + np.repeat(i0, sizes)
        offset = at[who] + index  # (each op's place in its block's columns)
        begin, comp = cols["begin"][offset], cols["comp"][offset]
        keep = (comp > t0) | (comp == 0) | (begin >= t0)
        # in flight at publishing: in, whatever their end says now (``RankView.window``)
        j = np.searchsorted(mine, flight_rank)
        ours = (j < mine.shape[0]) & (mine[np.minimum(j, mine.shape[0] - 1)] == flight_rank)
        j, fi = j[ours], flight_index[ours]
        j, fi = j[~solo[j]], fi[~solo[j]]
        inside = (fi >= i0[j]) & (fi < i1[j])
        keep[first[j[inside]] + fi[inside] - i0[j[inside]]] = True
        who, index, offset, begin, comp = who[keep], index[keep], offset[keep], begin[keep], comp[keep]
        ew, ei = j[~inside], fi[~inside]
        if ew.shape[0]:
            er = at[ew] + ei
            eb = cols["begin"][er]
            fits = eb < t1
            ec = cols["comp"][er[fits]]
            who, index, offset, begin, comp = (np.concatenate([x, y]) for x, y in (
                (who, ew[fits]), (index, ei[fits]), (offset, er[fits]), (begin, eb[fits]), (comp, ec)))
        parts.append((place[who], index, offset, cols, begin, comp))
    empty = np.zeros(0, np.int64)
    if not parts:
        return WindowOps(empty, empty, empty.astype(np.uint8), empty, empty, empty.astype(np.bool_), empty, empty,
                         empty, empty, empty, alone, counts, bounds)
    place = np.concatenate([p[0] for p in parts])
    index = np.concatenate([p[1] for p in parts])
    source = np.repeat(np.arange(len(parts)), [p[2].shape[0] for p in parts])  # (each op's block)
    offset = np.concatenate([p[2] for p in parts])
    begin = parts[0][4] if len(parts) == 1 else np.concatenate([p[4] for p in parts])
    comp = parts[0][5] if len(parts) == 1 else np.concatenate([p[5] for p in parts])

    def gathered(column: str, at: np.ndarray, of: np.ndarray) -> np.ndarray:
        """``column`` at rows ``at`` of the blocks ``of`` (ascending: the parts' ops in turn)."""
        if len(parts) == 1:
            return parts[0][3][column][at]
        out = np.empty(at.shape[0], parts[0][3][column].dtype)
        bounds = np.searchsorted(of, np.arange(len(parts) + 1)).tolist()
        for q, p in enumerate(parts):
            a, b = bounds[q], bounds[q + 1]
            if b > a:
                out[a:b] = p[3][column][at[a:b]]
        return out

    code = cats[gathered("sig", offset, source)]
    shown = code < HIDDEN_BIT  # inner traffic is drawn as its outer op
    if win.cursor_ns is not None:  # replay: the future has not happened yet
        comp = np.where(comp > now, 0, comp)
        shown &= begin <= now
    if not shown.all():
        place, index, source, offset, begin, comp, code = (x[shown] for x in (place, index, source, offset, begin, comp, code))
    approx = gathered("flags", offset, source) & APPROX
    inflight = comp == 0
    stop = np.where(inflight, max(now, 1), comp) if inflight.any() else comp
    asynchronous = np.flatnonzero(((code & ASYNC_BIT) | approx) != 0)
    end = wb = we = empty
    if asynchronous.shape[0]:
        at, of = offset[asynchronous], source[asynchronous]
        end, wb, we = (gathered(c, at, of).astype(np.int64, copy=False) for c in ("end", "wb", "we"))
    return WindowOps(place, index, code, begin, stop, inflight, approx, asynchronous, end, wb, we, alone, counts,
                     bounds)


_ROWS, _AT, _N, _OPEN, _OWN_SB = (attrgetter(c) for c in ("rows", "at", "n", "open", "own_sb"))


def _painted_alone(m: ModelLike, rank: int, win: Window, cats: np.ndarray,
                   spans: Mapping[int, SpanIndex] | None) -> tuple[np.ndarray, int]:
    """A rank of ``_window_ops`` painted on its own: (cells, ops drawn)."""
    cells, _, _, count = _paint(m, rank, win, cats, spans=None if spans is None else spans[rank])
    return cells, count


#: What a heatmap block's ranks' states add to a cell (``gone_cells``): nothing; every rank of
#: the block had exited by then; one of them had died or crashed by then
GONE_NONE, GONE_EXITED, GONE_DOWN = 0, 1, 2
_GONE_KINDS = frozenset({"dead", "crashed", "exited"})


def gone_cells(states: Mapping[int, RankState], ranks: Sequence[int], win: Window) -> np.ndarray:
    """Per cell of ``win`` (up to its clock), what the states of ``ranks`` say of it:
    ``GONE_DOWN`` from the moment the first of them died or crashed (its state's
    ``since_ns``: the death, or when it was last seen), else ``GONE_EXITED`` from the moment
    the last of them exited, where every one has.  A heatmap block of 205 ranks shows the one
    that died in it from then on, not only its busy share (the others wait, as the living
    ones of every other block do)."""
    out = np.zeros(win.width, np.int8)
    down: int | None = None
    ended, gone = 0, 0
    for r in ranks:
        st = states.get(r)
        if st is None or st.kind not in _GONE_KINDS:
            continue
        gone += 1
        ended = max(ended, st.since_ns)
        if st.kind != "exited":
            down = st.since_ns if down is None else min(down, st.since_ns)
    upto = min(win.width, max(0, (win.now - win.t0) // win.npc + 1))
    for at, what in ((ended if ranks and gone == len(ranks) else None, GONE_EXITED), (down, GONE_DOWN)):
        if at is not None:
            out[min(upto, max(0, (at - win.t0) // win.npc)):upto] = what
    return out


def row_gone(states: Mapping[int, RankState], row: Row, win: Window) -> list[np.ndarray] | None:
    """A heatmap line's two blocks' ``gone_cells`` (None: not a heatmap line), as
    ``render_row`` takes them."""
    if not row.upper:
        return None
    return [gone_cells(states, row.ranks[:row.upper], win), gone_cells(states, row.ranks[row.upper:], win)]


def paint_heat(m: ModelLike, upper: tuple[int, ...], lower: tuple[int, ...], win: Window,
               cats: np.ndarray | None = None, spans: Mapping[int, SpanIndex] | None = None,
               levels: Sequence[tuple[np.ndarray, np.ndarray]] | None = None,
               gone: Sequence[np.ndarray] | None = None) -> list[Segment]:
    """A heatmap line: two blocks of ranks, one above the other in each cell (``▀``: the upper
    block's colour on the lower's), coloured by how many of each block's ranks are busy, or
    amber / red where one of them is slow or past hang_after, grey once all of them exited,
    magenta once one of them died or crashed (``gone``: both blocks' ``gone_cells``).
    ``levels``: both blocks', made already (``count_levels``)."""
    if levels is None:
        levels = levels_of(m, [upper, lower], win, cats, spans)

    def colours(ranks: tuple[int, ...], got: tuple[np.ndarray, np.ndarray], went: np.ndarray | None) -> np.ndarray:
        if not ranks:
            return np.zeros(win.width, np.int16)
        level, worst = got
        c = np.where(worst >= palette.ERROR, _HEAT_ERROR, np.where(worst == palette.WARN, _HEAT_WARN, level))
        if went is not None:
            c = np.where(went == GONE_DOWN, _HEAT_DOWN, np.where((went == GONE_EXITED) & (c == 0), _HEAT_EXITED, c))
        return c.astype(np.int16)

    top = colours(upper, levels[0], None if gone is None else gone[0])
    bottom = colours(lower, levels[1], None if gone is None else gone[1])
    key = top * 16 + bottom
    starts = np.concatenate(([0], np.flatnonzero(np.diff(key)) + 1))
    ends = np.concatenate((starts[1:], [win.width]))
    segs = []
    for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
        segs.append(Segment("▀" * (b - a), _HEAT_STYLES[int(top[a])][int(bottom[a])]))
    return segs


def paint_group(m: ModelLike, ranks: tuple[int, ...], win: Window, cats: np.ndarray | None = None,
                spans: Mapping[int, SpanIndex] | None = None,
                levels: tuple[np.ndarray, np.ndarray] | None = None) -> list[Segment]:
    """Collapsed rows: how many of the ranks are busy in each cell, as shades (``levels``:
    made already, ``count_levels``)."""
    w = win.width
    level, worst = group_levels(m, ranks, win, cats, spans) if levels is None else levels
    segs: list[Segment] = []
    key = level * 16 + worst
    starts = np.concatenate(([0], np.flatnonzero(np.diff(key)) + 1))
    ends = np.concatenate((starts[1:], [w]))
    for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
        lv, wr = int(level[a]), int(worst[a])
        style = palette.STYLE[wr] if wr else palette.STYLE[palette.COLL]
        segs.append(Segment(palette.SHADES[lv] * (b - a), style))
    return segs


N_CATEGORIES = palette.SELECTED + 1
_EMPTY: dict[int, np.ndarray] = {}  # read-only blank rows by width


def _cell_bounds(a: np.ndarray, b: np.ndarray, t0: int, npc: int,
                 w: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Intervals [a, b] as the first and last of the ``w`` cells of ``npc`` ns from ``t0``
    they touch, clipped to the window, and which of them are drawn (None: all): those in
    view, and not ending in a cell before the one they begin in (such an interval covers
    nothing, as a slice would have it; counted, its -1 before its +1 took a cell from
    another interval's cover).

    In float64 where the window spans less than 2**53 ns: true division is several times
    faster than int64 floor division, and exact there.  A quotient q = (t - t0) / npc is
    correctly rounded, so its error is below q * 2**-53, smaller than the 1 / npc that
    separates a non-integer q from the next integer for every q that decides anything
    (0 <= q <= w: those outside are clipped, and rounding keeps them outside): the
    comparisons and the truncation of non-negative values give what floor division gives.
    A wider window (past ``timeline.MAX_NPC`` x ~2,500 cells: no terminal) in integers."""
    if w * npc < 1 << 53:
        fa = (a - t0) / npc  # subtract in int64 first: timestamps themselves do not fit a float exactly
        fb = (b - t0) / npc
    else:
        fa, fb = (a - t0) // npc, (b - t0) // npc
    ok = None
    if a.shape[0] and (fb.min() < 0 or fa.max() >= w or (fa > fb).any()):  # (cheaper than the masks)
        ok = (fb >= 0) & (fa < w) & (np.floor(fa) <= np.floor(fb))
    return np.maximum(fa, 0).astype(np.int64), np.minimum(fb, w - 1).astype(np.int64), ok


def _cover(a: np.ndarray, b: np.ndarray, cat: np.ndarray, t0: int, npc: int, w: int) -> np.ndarray:
    """Per cell, the highest category among the intervals [a, b] that touch it.

    One 2D bincount of interval starts and ends (+1) per category, a cumulative sum along
    time, then the highest covered category: a handful of numpy calls whatever the number
    of ops or categories.  Category numbers are their priorities.
    """
    if a.shape[0] <= 32:  # a few intervals: one slice each, low categories first, exact integers
        cells = np.zeros(w, np.int8)
        for c, x, y in sorted(zip(cat.tolist(), a.tolist(), b.tolist(), strict=True)):
            c0, c1 = (x - t0) // npc, (y - t0) // npc
            if c1 >= 0 and c0 < w:
                cells[max(c0, 0):min(c1, w - 1) + 1] = c
        return cells
    c0, c1, ok = _cell_bounds(a, b, t0, npc, w)
    if ok is not None:
        c0, c1, cat = c0[ok], c1[ok], cat[ok]
    # one flat index per (category, cell): category * (w + 1) + cell
    k = np.multiply(cat, w + 1, dtype=np.int64)
    c0 += k
    c1 += k
    c1 += 1
    n = N_CATEGORIES * (w + 1)
    starts = np.bincount(c0, minlength=n)
    diff = starts - np.bincount(c1, minlength=n)
    cov = diff.reshape(N_CATEGORIES, w + 1)[:, :w].cumsum(axis=1) > 0
    cells = np.zeros(w, np.int8)
    present = starts.reshape(N_CATEGORIES, w + 1).any(axis=1)  # every drawn interval has a start
    for c in np.flatnonzero(present).tolist():  # few, low to high
        cells[cov[c]] = c
    return cells


def _cover_rows(a: np.ndarray, b: np.ndarray, cat: np.ndarray, row: np.ndarray, rows: int,
                t0: int, npc: int, w: int) -> np.ndarray:
    """``_cover`` for several rows at once (``row``: each interval's), as (rows, w) cells."""
    c0, c1, ok = _cell_bounds(a, b, t0, npc, w)
    if ok is not None:
        c0, c1, cat, row = c0[ok], c1[ok], cat[ok], row[ok]
    k = np.multiply(row, N_CATEGORIES, dtype=np.int64)
    k += cat
    k *= w + 1
    c0 += k
    c1 += k
    c1 += 1
    n = rows * N_CATEGORIES * (w + 1)
    diff = np.bincount(c0, minlength=n) - np.bincount(c1, minlength=n)
    cov = diff.reshape(rows, N_CATEGORIES, w + 1)[:, :, :w].cumsum(axis=2) > 0
    top = N_CATEGORIES - 1 - cov[:, ::-1, :].argmax(axis=1)  # the highest category covering each cell
    return np.where(cov.any(axis=1), top, 0).astype(np.int8)


@lru_cache(maxsize=4096)
def _run(cat: int, n: int) -> Segment:
    """A run of ``n`` cells of one category (rows repeat the same few: made once).  A pure
    function of two small ints called for every run of every row painted: the stdlib's
    C-implemented cache suits it better than ``textual.cache.LRUCache``."""
    return Segment(palette.GLYPH[cat] * n, palette.STYLE[cat])


def _segments(cells: np.ndarray, labels: list[tuple[int, int, str, int]]) -> list[Segment]:
    """Run-length encode the cells into segments, with labels written over wide spans."""
    w = cells.shape[0]
    segs: list[Segment] = []
    label_at = {a: (n, text, cat) for a, n, text, cat in labels}
    keys = sorted(label_at)
    starts = np.concatenate(([0], np.flatnonzero(cells[1:] != cells[:-1]) + 1)).tolist()
    ends = starts[1:] + [w]
    cats = cells[starts].tolist()
    if not keys:
        return [_run(c, b - a) for a, b, c in zip(starts, ends, cats, strict=True)]
    for a, b, cat in zip(starts, ends, cats, strict=True):
        x = a
        while x < b:
            k = bisect_left(keys, x)
            lab = keys[k] if k < len(keys) and keys[k] < b else None
            if lab is None:
                segs.append(_run(cat, b - x))
                break
            if lab > x:
                segs.append(_run(cat, lab - x))
            n, text, lcat = label_at[lab]
            n = min(n, b - lab)
            segs.append(Segment(text[:n], palette.LABEL_STYLE.get(cat, palette.LABEL_STYLE[palette.COLL])))
            x = lab + n
    return segs
