"""The per-rank timeline: one row per rank (or per collapsed group of ranks), time across.

Drawn with Textual's Line API: ``render_line`` paints one row into a ``Strip``.  A row's
cells are computed with numpy over the ops in view (coverage of each traffic category
via ``bincount``/``cumsum``, highest priority wins), never one widget or one Python loop
iteration per op, and strips are cached by (row, rank versions, viewport, selection,
clock cell), so a model update re-renders only the rows whose ranks changed, and of a row
only the part from the earliest op changed (``repaint_rank``).

Painting is pure (``paint_rank``, ``paint_group``, ``render_row`` over a ``Window``) and
reads the model's published view (``feed.view``), never the live model: no lock.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections import OrderedDict, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Any, NamedTuple

import numpy as np
from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from commscope.analysis.columns import I64_MAX, RankView
from commscope.analysis.model import APPROX, CONTAINER, NESTED
from commscope.analysis.rankstate import rank_state, top_level_ops
from commscope.tui import palette
from commscope.tui.feed import REPLAY
from commscope.tui.paintcode import ASYNC_BIT, CAT_MASK, HIDDEN_BIT, VARLEN_OPS, categories  # noqa: F401
from commscope.tui.spanindex import SpanIndex

MIN_NPC = 100  # ns per cell at the deepest zoom
MAX_NPC = 3600 * 10**9
GUTTER = 11
#: Windows with fewer ops beginning in them are painted from the ops: below about this many
#: (200 cells), the span index's fixed cost is no smaller (``bench tui`` compares both).
INDEX_MIN_OPS = 2500


class Row(NamedTuple):
    key: str
    label: str
    ranks: tuple[int, ...]


class Timeline(ScrollView, can_focus=True):
    """Rows of ranks against time.  ``feed`` provides ``view``, the model as of its last
    batch, which this widget reads without a lock (painting: ``paint_rank``, ``render_row``)."""

    BINDINGS = [
        Binding("left", "select_prev", "Prev op", show=False),
        Binding("right", "select_next", "Next op", show=False),
        Binding("up", "row_up", "Rank up", show=False),
        Binding("down", "row_down", "Rank down", show=False),
        Binding("plus,equals_sign,i", "zoom_in", "Zoom in"),
        Binding("minus,o", "zoom_out", "Zoom out"),
        Binding("h,shift+left", "pan_left", "Pan ←", show=False),
        Binding("l,shift+right", "pan_right", "Pan →", show=False),
        Binding("f", "follow", "Follow"),
        Binding("c", "collapse", "Collapse"),
        Binding("x", "filter_findings", "Findings only"),
        Binding("enter", "open_op", "Op detail", show=False),
    ]

    DEFAULT_CSS = """
    Timeline { height: 1fr; }
    """
    FAST_OVERVIEW = True  # the overview path (bench tui compares it with the detailed one)
    SPAN_INDEX = True  # the overview painted from span indexes (bench tui compares it with painting from the ops)

    class OpSelected(Message):
        def __init__(self, rank: int, index: int):
            super().__init__()
            self.rank = rank
            self.index = index

    class ViewChanged(Message):
        """The time window moved (the ruler follows)."""

    def __init__(self, feed: Any, *, name: str | None = None, id: str | None = None,
                 classes: str | None = None):
        super().__init__(name=name, id=id, classes=classes)
        self.feed = feed
        self.t0 = 0
        self.npc = 20_000_000  # ns per cell
        self.follow = True
        self.rows: list[Row] = []
        self.mode = "ranks"  # ranks | nodes | blocks
        self.only_findings = False
        self.flagged: set[int] = set()  # ranks named in findings
        self._flagged_rows: set[str] = set()
        self.sel: tuple[int, int] | None = None
        self.sel_row = 0
        self.cursor_ns: int | None = None  # replay cursor
        self.now_ns = 0
        self.hang_after_ns = 30 * 10**9
        self._cache: OrderedDict[tuple, Strip] = OrderedDict()  # finished lines
        self._painted: OrderedDict[tuple, Painted] = OrderedDict()  # rows' cells, repainted in part on changes
        self._frame_token: tuple | None = None  # (view, window) the rows below were painted for
        self._frame_rows: dict[tuple, Painted] = {}  # this frame's visible rows, painted together
        self._cat_table = np.zeros(0, np.int8)
        # per rank, the overview's span index (spanindex), kept across frames and views: it
        # is data, not a painted cache, so clear_caches leaves it
        self._spans: defaultdict[int, SpanIndex] = defaultdict(lambda: SpanIndex(deferred=True))
        self._building = False  # a build of wanted span indexes is scheduled
        self._dots_key: tuple[int, int] | None = None  # (view version, replay cursor) of _dots
        self._dots: dict[int, str] = {}
        self._placed = False
        self.empty_text: str | None = None  # why there is nothing to show (set by the app)

    def reset(self) -> None:
        """Forget everything about the previous source (the feed was switched)."""
        self.rows = []
        self.sel = None
        self.sel_row = 0
        self.cursor_ns = None
        self.follow = True
        self._placed = False
        self.empty_text = None
        self.clear_caches(indexes=True)
        self._cat_table = np.zeros(0, np.int8)
        self._dots_key, self._dots = None, {}
        self.set_flagged(set())
        self.virtual_size = Size(self.size.width, 0)

    # ------------------------------------------------------------------ data
    @property
    def model(self):
        """The model as of the feed's last batch (``TraceModel.view``): read without a lock."""
        return self.feed.view

    def timeline_width(self) -> int:
        return max(1, self.size.width - GUTTER)

    def t1(self) -> int:
        return self.t0 + self.timeline_width() * self.npc

    def rebuild_rows(self) -> None:
        m = self.model
        ranks = m.rank_ids()
        if self.only_findings and self.flagged:
            ranks = [r for r in ranks if r in self.flagged]
        rows: list[Row] = []
        if self.mode == "ranks":
            rows = [Row(f"r{r}", f"r{r}", (r,)) for r in ranks]
        elif self.mode == "nodes":
            hosts: dict[str, list[int]] = {}
            for r in ranks:
                meta = m.ranks[r].meta or {}
                hosts.setdefault(str(meta.get("host", "?")), []).append(r)
            rows = [Row(f"n:{h}", f"{h[:GUTTER - 3]}", tuple(rs)) for h, rs in hosts.items()]
        else:
            size = max(1, -(-len(ranks) // 32)) if len(ranks) > 32 else 1
            for i in range(0, len(ranks), size):
                chunk = tuple(ranks[i:i + size])
                label = f"r{chunk[0]}" if len(chunk) == 1 else f"r{chunk[0]}-{chunk[-1]}"
                rows.append(Row(f"b:{label}", label, chunk))
        if [r.key for r in rows] != [r.key for r in self.rows]:
            self.rows = rows
            self.sel_row = min(self.sel_row, max(0, len(rows) - 1))
            self._cache.clear()
            self.set_flagged(self.flagged)
        self.virtual_size = Size(self.size.width, len(self.rows))

    def on_model_update(self, now_ns: int, changed: set[int] | None = None) -> None:
        """Called by the app after each feed update (UI thread)."""
        self.now_ns = now_ns
        self.rebuild_rows()
        self.ensure_placed()
        if self._placed and self.follow and self.cursor_ns is None:
            self._follow_now()
        self.refresh()

    def clear_caches(self, *, indexes: bool = False) -> None:
        """Forget every painted line and row (the next frame paints everything); with
        ``indexes``, the span indexes too (the next overview builds them again)."""
        self._cache.clear()
        self._painted.clear()
        self._frame_token, self._frame_rows = None, {}
        if indexes:
            self._spans.clear()

    def unplace(self) -> None:
        """Fit the view to the whole trace again at the next update or paint (a replay
        finished loading: what was placed while it loaded saw only a part)."""
        self._placed = False
        self._cache.clear()

    def ensure_placed(self) -> bool:
        """Fit the view to the trace once both exist: events in the model and a laid-out
        width.  Called on updates and resizes, and by the paint paths (this widget's rows
        and the ruler), so that the first painted frame shows the trace whatever order the
        feed's first update and the first layout arrive in."""
        if self._placed:
            return True
        if not self.model.end_ns or self.size.width <= GUTTER + 8:
            return False
        self._place_initial()
        if self.follow and self.cursor_ns is None:
            self._follow_now()
        return True

    def _place_initial(self) -> None:
        start, end = self.model.bounds()
        span = max(end - start, 10**9)
        self.npc = _clamp(span // max(1, int(self.timeline_width() * 0.8)))
        self.t0 = start - self.npc * 2
        self._placed = True
        self._cache.clear()
        self.post_message(self.ViewChanged())

    def _follow_now(self) -> None:
        w = self.timeline_width() * self.npc
        edge = self.now_ns if self.cursor_ns is None else self.cursor_ns
        if not edge:  # no clock reading yet (a resize before the first update): keep the fit
            return
        if not (self.t0 + w * 0.1 <= edge <= self.t0 + w * 0.9):
            # jump in pages (now at 60%) so most updates leave the cached rows valid
            self.t0 = edge - int(w * 0.6)
            self.post_message(self.ViewChanged())

    # ------------------------------------------------------------------ rendering
    def render_line(self, y: int) -> Strip:
        if not self._placed:
            self.ensure_placed()
        width = self.size.width
        ri = y + self.scroll_offset.y
        if not self.rows:
            if y == self.size.height // 2:
                if self.empty_text:
                    return Strip([Segment(self.empty_text.center(width)[:width], Style(color="#e05050", bold=True))],
                                 width)
                text = "waiting for the job to write its first events…"
                return Strip([Segment(text.center(width)[:width], Style(color="grey50"))], width)
            if y == self.size.height // 2 + 1 and self.feed.hint and not self.empty_text:
                return Strip([Segment(self.feed.hint.center(width)[:width], Style(color="#e0a030"))], width)
            return Strip.blank(width)
        if ri >= len(self.rows):
            if y == self.size.height - 1:
                return self._legend(width)
            return Strip.blank(width)
        row = self.rows[ri]
        m = self.model  # one published view for the whole row: no lock, nothing written
        rviews = [m.ranks.get(r) for r in row.ranks]
        versions = tuple(-1 if rv is None else rv.version for rv in rviews)
        live = any(rv is not None and rv.open for rv in rviews)
        focused = ri == self.sel_row
        kind = self._row_kind(m, row)
        win = self.window(width - GUTTER)
        sel = win.sel if win.sel and win.sel[0] in row.ranks else None
        now_cell = (win.now - self.t0) // self.npc if live else None
        key = (row.key, versions, self.t0, self.npc, width, sel, self.cursor_ns, now_cell, focused,
               self.hang_after_ns, row.key in self._flagged_rows, kind)
        strip = self._cache.get(key)
        if strip is None:
            cats = self._categories(m)
            painted = None
            if len(row.ranks) == 1:  # repaint only what changed since this row was last painted here
                r = row.ranks[0]
                pkey = self._painted_key(r, win)
                token = (id(m), m.version, win)
                p = self._frame_rows.get(pkey) if self._frame_token == token else None
                if p is None:  # the first row of a frame: every visible row, in one pass
                    self._repaint_visible(m, win, cats, token)
                    p = self._frame_rows.get(pkey)
                if p is None:  # (a row outside the visible ones)
                    p = repaint_rank(m, r, win, self._painted.get(pkey), cats, self._spans_of(r))
                    self._keep_painted(pkey, p)
                painted = (p.cells, p.labels)
            strip = render_row(m, row, win, kind=kind, focused=focused, flagged=row.key in self._flagged_rows,
                               cats=cats, painted=painted, spans=self._spans if self.SPAN_INDEX else None)
            if len(row.ranks) > 1:  # a collapsed row's ranks may want their indexes too
                self._build_wanted(self._spans[r] for r in row.ranks)
            self._cache[key] = strip
            if len(self._cache) > 2000:
                self._cache.popitem(last=False)
        return strip

    def _painted_key(self, rank: int, win: Window) -> tuple:
        sel = win.sel if win.sel and win.sel[0] == rank else None
        return (rank, self.t0, self.npc, win.width, self.cursor_ns, sel, self.hang_after_ns, win.overview)

    def _spans_of(self, rank: int) -> SpanIndex | None:
        return self._spans[rank] if self.SPAN_INDEX else None

    def _keep_painted(self, pkey: tuple, p: Painted) -> None:
        self._painted[pkey] = p
        self._painted.move_to_end(pkey)
        if len(self._painted) > 512:
            self._painted.popitem(last=False)

    def _repaint_visible(self, m: Any, win: Window, cats: np.ndarray, token: tuple) -> None:
        """Bring every visible one-rank row's painting up to date (``repaint_ranks``: in one
        pass, which costs much less than row by row), for the frame ``token``."""
        top = self.scroll_offset.y
        keys, asks = [], []
        for row in self.rows[top:top + self.size.height]:
            if len(row.ranks) == 1:
                r = row.ranks[0]
                pkey = self._painted_key(r, win)
                keys.append(pkey)
                asks.append((r, self._painted.get(pkey), self._spans_of(r)))
        done = repaint_ranks(m, asks, win, cats)
        for pkey, p in zip(keys, done, strict=True):
            self._keep_painted(pkey, p)
        self._frame_token, self._frame_rows = token, dict(zip(keys, done, strict=True))
        self._build_wanted(sp for _, _, sp in asks)

    def _build_wanted(self, spans: Iterable[SpanIndex | None]) -> None:
        """Schedule ``build_indexes`` if one of ``spans`` was wanted by a frame."""
        if not self._building and any(sp is not None and sp.wanted for sp in spans):
            self._building = True
            self.call_later(self.build_indexes)

    def build_indexes(self, budget_s: float = 0.015) -> bool:
        """Build the span indexes the last frames wanted, for ``budget_s`` at most, then yield
        to the event loop and go on: the UI stays responsive while a large trace's indexes
        are built.  The picture does not change (the index draws what the ops draw), so
        nothing is repainted.  Returns whether all are built."""
        self._building = False
        m = self.model
        cats = self._categories(m)
        t = time.perf_counter()
        for r, sp in list(self._spans.items()):
            if not sp.wanted:
                continue
            if time.perf_counter() - t > budget_s:
                self._building = True
                self.set_timer(0.001, self.build_indexes)
                return False
            rv = m.ranks.get(r)
            if rv is not None:
                sp.update(rv, cats)
            sp.wanted = False
        return True

    def window(self, width: int | None = None) -> Window:
        """What a row is painted for now: the time window, ``width`` cells of it (default: the
        timeline's), the clock or replay cursor, the hang threshold and the selection."""
        return Window(self.t0, self.npc, max(1, self.timeline_width() if width is None else width), self._now(),
                      self.cursor_ns, self.hang_after_ns, self.sel, self.FAST_OVERVIEW)

    def _legend(self, width: int) -> Strip:
        segs = [Segment(" " * GUTTER)]
        for cat, name in palette.LEGEND:
            segs += [Segment(palette.GLYPH[cat] * 2, palette.STYLE[cat]), Segment(f" {name}   ", Style(color="grey50"))]
        # padded to the full width: a shorter line leaves what the terminal showed there before
        return Strip(segs).crop_extend(0, width, None)

    def set_flagged(self, ranks: set[int]) -> None:
        """Ranks named in findings: marked in the gutter, and kept by the findings filter."""
        self.flagged = ranks
        self._flagged_rows = {r.key for r in self.rows if ranks.intersection(r.ranks)}

    def _now(self) -> int:
        return self.cursor_ns if self.cursor_ns is not None else self.now_ns

    def _row_kind(self, m: Any, row: Row) -> str:
        """The gutter dot of a row: its rank's state, the worst of its ranks' when collapsed.
        Live: the states the feed published with the view.  Replay cursor: as of the cursor
        (the trace is loaded and no longer changes), cached per cursor position."""
        if self.cursor_ns is not None and self.feed.mode == REPLAY:
            key = (m.version, self.cursor_ns)
            if self._dots_key != key:
                self._dots_key, self._dots = key, {}
            dots = self._dots

            def kind_of(r: int) -> str:
                k = dots.get(r)
                if k is None:
                    k = dots[r] = rank_state(self.feed.model, r, self.cursor_ns, as_of=True).kind
                return k
        else:
            def kind_of(r: int) -> str:
                st = m.states.get(r)
                return st.kind if st is not None else "unknown"
        if len(row.ranks) == 1:
            return kind_of(row.ranks[0])
        kinds = {kind_of(r) for r in row.ranks}
        return next((k for k in ("dead", "crashed", "blocked", "running", "idle", "exited") if k in kinds), "unknown")

    def _categories(self, m: Any) -> np.ndarray:
        """Traffic category per signature code, grown as signatures appear (they only append)."""
        if self._cat_table.shape[0] < len(m.sigs):
            self._cat_table = categories(m.sigs, self._cat_table)
        return self._cat_table

    # ------------------------------------------------------------------ navigation
    def _row_rank(self) -> int | None:
        if not self.rows:
            return None
        return self.rows[min(self.sel_row, len(self.rows) - 1)].ranks[0]

    def select(self, rank: int, index: int, *, reveal: bool = True) -> None:
        self.sel = (rank, index)
        for i, row in enumerate(self.rows):
            if rank in row.ranks:
                self.sel_row = i
                break
        rt = self.model.ranks.get(rank)
        if rt is not None and index >= rt.n:  # (an op newer than the view: shown once published)
            rt = None
        if reveal and rt is not None and self.ensure_placed():  # not laid out: the first fit shows it all
            b = int(rt.begin[index])
            e = int(rt.comp[index]) or self._now()
            if not (self.t0 <= b < self.t1()) or e - b > (self.t1() - self.t0):
                self.follow = False
                if e - b > (self.t1() - self.t0) * 0.8:
                    self.npc = _clamp(int((e - b) / (self.timeline_width() * 0.6)))
                self.t0 = b - (self.t1() - self.t0) // 4
                self.post_message(self.ViewChanged())
            self.scroll_to(y=max(0, self.sel_row - self.size.height // 2), animate=False)
        self.refresh()
        self.post_message(self.OpSelected(rank, index))

    def _neighbor(self, forward: bool) -> None:
        """←/→: the previous/next op in time on the focused row's rank, in-flight ops included.
        On the selected op's rank, one op along; on another row (or with nothing selected),
        the op at or before (←) / at or after (→) the selected op's begin, else the replay
        cursor or now: ← with nothing selected takes the latest op, the one still running."""
        rank = self._row_rank()
        if rank is None:
            return
        m = self.model
        order = top_level_ops(m, rank)
        begins = m.ranks[rank].begin[order] if order.shape[0] else order
        n = order.shape[0]
        if n == 0:
            return
        here = np.flatnonzero(order == self.sel[1]) if self.sel and self.sel[0] == rank else np.zeros(0, np.int64)
        if here.shape[0]:
            j = int(here[0]) + (1 if forward else -1)
            if not 0 <= j < n:
                self.notify(f"{'last' if forward else 'first'} op of rank {rank}", timeout=2)
                return
        else:
            if self.sel and self.sel[0] in m.ranks and self.sel[1] < m.ranks[self.sel[0]].n:
                ref = int(m.ranks[self.sel[0]].begin[self.sel[1]])
            elif self.cursor_ns is not None:
                ref = self.cursor_ns
            elif self.follow:
                ref = self.now_ns or int(begins[-1])
            else:
                ref = self.t0 + (self.t1() - self.t0) // 2
            j = int(np.searchsorted(begins, ref, side="left")) if forward else \
                int(np.searchsorted(begins, ref, side="right")) - 1
            j = min(max(j, 0), n - 1)
        target = int(order[j])
        self.select(rank, target)

    def action_select_next(self) -> None:
        self._neighbor(True)

    def action_select_prev(self) -> None:
        self._neighbor(False)

    def _move_row(self, delta: int) -> None:
        if not self.rows:
            return
        self.sel_row = max(0, min(len(self.rows) - 1, self.sel_row + delta))
        top = self.scroll_offset.y
        if self.sel_row < top:
            self.scroll_to(y=self.sel_row, animate=False)
        elif self.sel_row >= top + self.size.height:
            self.scroll_to(y=self.sel_row - self.size.height + 1, animate=False)
        self.refresh()

    def action_row_up(self) -> None:
        self._move_row(-1)

    def action_row_down(self) -> None:
        self._move_row(1)

    def _zoom(self, factor: float) -> None:
        w = self.t1() - self.t0
        sel_rt = self.model.ranks.get(self.sel[0]) if self.sel else None
        if self.sel and sel_rt is not None and self.sel[1] < sel_rt.n:
            center = int(sel_rt.begin[self.sel[1]])
        elif self.cursor_ns is not None:
            center = self.cursor_ns
        elif self.follow:
            center = self.now_ns
        else:
            center = self.t0 + w // 2
        frac = (center - self.t0) / w if w else 0.5
        frac = min(max(frac, 0.0), 1.0)
        self.npc = _clamp(int(self.npc * factor))
        self.t0 = center - int(frac * self.timeline_width() * self.npc)
        self.post_message(self.ViewChanged())
        self.refresh()

    def action_zoom_in(self) -> None:
        self._zoom(0.5)

    def action_zoom_out(self) -> None:
        self._zoom(2.0)

    def _pan(self, cells: int) -> None:
        self.follow = False  # any manual pan stops following
        self.t0 += cells * self.npc
        self.post_message(self.ViewChanged())
        self.refresh()

    def action_pan_left(self) -> None:
        self._pan(-max(1, self.timeline_width() // 4))

    def action_pan_right(self) -> None:
        self._pan(max(1, self.timeline_width() // 4))

    def action_follow(self) -> None:
        """Follow live (or the replay cursor) and jump to now."""
        self.follow = True
        self.t0 = self._now() - int(self.timeline_width() * self.npc * 0.6)
        self.post_message(self.ViewChanged())
        self.refresh()

    def action_collapse(self) -> None:
        self.mode = {"ranks": "nodes", "nodes": "blocks", "blocks": "ranks"}[self.mode]
        self.rebuild_rows()
        self.notify(f"timeline rows: {self.mode}", timeout=2)
        self.refresh()

    def action_filter_findings(self) -> None:
        self.only_findings = not self.only_findings
        self.rebuild_rows()
        self.notify("showing only ranks named in findings" if self.only_findings else "showing all ranks",
                    timeout=2)
        self.refresh()

    def action_open_op(self) -> None:
        if self.sel:
            self.post_message(self.OpSelected(*self.sel))

    def on_click(self, event: events.Click) -> None:
        ri = event.y + self.scroll_offset.y
        if not 0 <= ri < len(self.rows):
            return
        self.sel_row = ri
        x = event.x - GUTTER
        if x < 0:
            self.refresh()
            return
        t = self.t0 + x * self.npc
        rank = self.rows[ri].ranks[0]
        idx = self.model.ops_in_window(rank, t - self.npc, t + 2 * self.npc)
        rt = self.model.ranks.get(rank)
        if idx.shape[0] == 0 or rt is None:
            self.refresh()
            return
        keep = (self.model.sig_flags(rt.sig[idx]) & (NESTED | CONTAINER)) == 0
        idx = idx[keep] if keep.any() else idx
        best = int(idx[np.argmin(np.abs(rt.begin[idx] - t))])
        self.select(rank, best, reveal=False)

    def on_resize(self, event: events.Resize) -> None:
        self._cache.clear()
        self.virtual_size = Size(self.size.width, len(self.rows))
        self.ensure_placed()


# ---------------------------------------------------------------------- painting (pure)
class Window(NamedTuple):
    """What a row is painted for: the time window (``width`` cells of ``npc`` ns from ``t0``),
    the clock (``now``) or the replay cursor (the future hidden), the hang threshold, the
    selected op (rank, index), and whether far zoomed out takes the cheaper overview path."""

    t0: int
    npc: int
    width: int
    now: int
    cursor_ns: int | None = None
    hang_after_ns: int = 30 * 10**9
    sel: tuple[int, int] | None = None
    overview: bool = True


def render_row(m: Any, row: Row, win: Window, *, kind: str = "unknown", focused: bool = False,
               flagged: bool = False, cats: np.ndarray | None = None,
               painted: tuple[np.ndarray, list] | None = None,
               spans: Mapping[int, SpanIndex] | None = None) -> Strip:
    """A whole timeline line: the gutter (state dot ``kind``, label, findings mark) and the
    row's cells over ``win`` (``painted``: a one-rank row's cells and labels, already
    painted), with the replay cursor drawn on top.  ``spans``: span indexes by rank (for
    the overview; see ``paint_rank``)."""
    w = win.width
    width = w + GUTTER
    if len(row.ranks) == 1:
        r = row.ranks[0]
        cells, labels = painted if painted is not None else paint_rank(m, r, win, cats,
                                                                        None if spans is None else spans[r])
        segs = _segments(cells, labels)
    else:
        segs = paint_group(m, row.ranks, win, cats, spans)
    strip = Strip(_gutter(row, kind, focused, flagged) + segs, width)
    if win.cursor_ns is not None:
        c = (win.cursor_ns - win.t0) // win.npc
        if 0 <= c < w:
            x = GUTTER + int(c)
            strip = Strip.join([strip.crop(0, x), Strip([_CURSOR], 1),
                                strip.crop(x + 1, width)])
    return strip.crop(0, width)


def _gutter(row: Row, kind: str, focused: bool, flagged: bool) -> list[Segment]:
    label = row.label[: GUTTER - 4].ljust(GUTTER - 4)
    return [Segment(palette.STATE_DOT[kind], palette.STATE_STYLE[kind]), _SPACE,
            Segment(label, _FOCUSED if focused else _BOLD), _FLAG if flagged else _NO_FLAG, _BAR]


_BOLD, _FOCUSED = Style(bold=True), Style(bold=True, reverse=True)
_CURSOR = Segment("│", Style(color="#ffd75f", bold=True))
_SPACE, _BAR = Segment(" "), Segment("│", Style(color="grey30"))
_FLAG, _NO_FLAG = Segment("!", Style(color="#e05050", bold=True)), Segment(" ", Style(color="#e05050", bold=True))


def paint_rank(m: Any, rank: int, win: Window, cats: np.ndarray | None = None,
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


def repaint_rank(m: Any, rank: int, win: Window, prev: Painted | None,
                 cats: np.ndarray | None = None, spans: SpanIndex | None = None) -> Painted:
    """``paint_rank`` given the same row painted earlier over the same window (``prev``):
    only the cells from the earliest op changed since (``RankView.touched_since``) or in
    flight are painted again, from the ops overlapping them; the cells before are kept.
    A cell depends only on the ops that touch it, and the drawing (overview or detailed)
    on how many ops the window holds, which only grows by the ops added: so the result is
    what ``paint_rank`` gives."""
    return repaint_ranks(m, [(rank, prev, spans)], win, cats)[0]


def repaint_ranks(m: Any, rows: Sequence[tuple[int, Painted | None, SpanIndex | None]], win: Window,
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
        open_min = min((int(rt.begin[i]) for i in rt.open), default=I64_MAX) if rt is not None else I64_MAX
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


def _labels(cells: np.ndarray, cands: list[tuple[int, int, int, int, str]]) -> list[tuple[int, int, str, int]]:
    """Labels on the wide spans (the first 40 by begin), each only over a run of one colour:
    a label must not straddle wait/issue parts."""
    labels = []
    for _, _, a, b, text in cands[:40]:
        if b - a + 1 >= len(text) + 2 and (cells[a + 1:a + 1 + len(text)] == cells[a + 1]).all():
            labels.append((a + 1, len(text), text, int(cells[a + 1])))
    return labels


def _paint(m: Any, rank: int, win: Window, cats: np.ndarray | None = None, from_t: int | None = None,
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
    rt: Any  # the rank's trace (RankView or RankTrace)
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


def _paint_rows(m: Any, win: Window, jobs: Sequence[Job], cats: np.ndarray | None = None
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


def _draw_rows(m: Any, win: Window, jobs: Sequence[Job], rows: list[RowOps]) -> list:
    """The drawing of ``_paint_rows``: every row's ops (by begin) as intervals of categories,
    their coverage per cell, and the label candidates, all rows at once."""
    w = win.width
    t0, npc, now = win.t0, win.npc, win.now
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
    # Ops whose end is only approximately known (Flight Recorder on Gloo) are drawn like
    # async work: a mark at the start, then a thin line, not a solid bar.
    is_async = ((code & ASYNC_BIT) | flags) != 0
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

    ai = np.flatnonzero(is_async)
    wb = we = issue_end = None
    if ai.shape[0]:  # the issue/wait parts of async work: only where there is some
        issue_end, wb, we = begin.copy(), np.zeros_like(begin), np.zeros_like(begin)
        for j, r in enumerate(rows):
            lo, hi = int(offsets[j]), int(offsets[j + 1])
            sub = ai[(ai >= lo) & (ai < hi)]
            if sub.shape[0]:
                ops = r.idx[sub - lo]
                rt = r.rt
                end = rt.end[ops]
                issue_end[sub] = np.where(flags[sub] != 0, begin[sub], np.where(end > 0, end, begin[sub]))
                wb[sub], we[sub] = rt.wb[ops], rt.we[ops]
        if win.cursor_ns is not None:
            wb = np.where(wb > now, 0, wb)
            we = np.where(we > now, 0, we)
            issue_end = np.minimum(issue_end, stop)
        ov = overview[row[ai]]
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
        blocked = inflight & (~is_async | (wb > 0)) if ai.shape[0] else inflight
        since = np.where(is_async, wb, begin) if ai.shape[0] else begin
        warn_at = since + max(win.hang_after_ns // 3, 1)
        err_at = since + win.hang_after_ns
        add(blocked & (warn_at < now), warn_at, stop, palette.WARN)
        add(blocked & (err_at < now), err_at, stop, palette.ERROR)
    if win.sel:
        for j, r in enumerate(rows):
            idx = r.idx
            if jobs[r.job].rank != win.sel[0]:
                continue
            hit = np.flatnonzero(idx == win.sel[1])
            if hit.shape[0]:
                at = int(offsets[j]) + int(hit[0])
                e = int(stop[at]) if not is_async[at] else max(int(stop[at]), int(issue_end[at]))
                starts.append(begin[at:at + 1])
                stops.append(np.array([e], np.int64))
                kinds.append(np.array([palette.SELECTED], np.int8))
                rows_of.append(row[at:at + 1])
    if len(rows) == 1:
        one = [_cover(np.concatenate(starts), np.concatenate(stops), np.concatenate(kinds), t0, npc, w)
               if len(starts) > 1 else _cover(starts[0], stops[0], kinds[0], t0, npc, w)]
    else:
        one = _cover_rows(np.concatenate(starts), np.concatenate(stops), np.concatenate(kinds),
                          np.concatenate(rows_of), len(rows), t0, npc, w)
    cands = _candidates(m, [(r.rt, r.idx) for r in rows], begin, stop, row, win)
    return [(one[j], cands[j], bool(overview[j]), int(counts[j])) for j in range(len(rows))]


def _candidates(m: Any, rows: Sequence[tuple[Any, np.ndarray]], begin: np.ndarray, stop: np.ndarray,
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
    for q in np.flatnonzero((c1 - c0) >= 8).tolist():
        j = int(cand[q])
        r = 0 if row is None else int(row[j])
        if len(out[r]) >= 40:
            continue
        rt, idx = rows[r]
        i = int(idx[j - int(first[r])])
        seq = int(rt.seq[i])
        text = m.sigs[int(rt.sig[i])].op + (f" #{seq}" if seq >= 0 else "")
        out[r].append((int(begin[j]), i, max(int(c0[q]), 0), min(int(c1[q]), w - 1), text))
    return out


def _drawn(rt: Any, idx: np.ndarray, cats: np.ndarray, win: Window
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


def _position(rv: RankView, i: int) -> int:
    """Where op ``i`` stands in the rank's begin order."""
    p = int(np.searchsorted(rv.sb, rv.begin[i], side="left"))
    order = rv.order_
    while p < order.shape[0] and order[p] != i:  # (ties in begin: a few)
        p += 1
    return p


def _paint_indexed(m: Any, rv: RankView, rank: int, win: Window, cats: np.ndarray,
                   spans: SpanIndex) -> tuple[np.ndarray, list[tuple[int, int, int, int, str]], int] | None:
    """The overview of a whole window from the rank's span index (brought up to date with
    ``rv`` here): (cells, label candidates, ops drawn), or None when the window holds too
    few ops for an overview, or too few for the index to pay.

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
    i0 = int(np.searchsorted(rv.pmax, t0, side="right"))
    if cursor is not None:
        i1 = min(i1, int(np.searchsorted(sb, now, side="right")))
    lo = max(s0, i0)
    hi = max(i1, lo)
    if hi - lo < INDEX_MIN_OPS or spans.build_later():  # from the ops: no dearer, or no index yet
        return None
    spans.update(rv, cats)
    parts = []  # ops of the window drawn from the ops
    if i0 < s0:  # begun before the window, ending in it or in flight
        early = order[i0:s0]
        ends = rv.comp[early]
        parts.append(early[(ends > t0) | (ends == 0)])
    flight = [i for i in rv.open if rv.begin[i] < t1]
    outside = [i for i in flight if not lo <= _position(rv, i) < hi]
    if outside:
        parts.append(np.array(outside, np.int64))
    extra = np.unique(np.concatenate(parts)) if parts else np.zeros(0, np.int64)
    if extra.shape[0]:
        extra = extra[np.argsort(rv.begin[extra], kind="stable")]
        extra = _drawn(rv, extra, cats, win)[0]
    count = spans.drawn(lo, hi) + extra.shape[0]
    if count <= 4 * w:
        return None
    cells, rest = spans.cells(lo, hi, t0, npc, w, cursor)
    parts = [extra, order[spans.in_flight(lo, hi)], *(order[p] for p in rest)]
    if flight:
        parts.append(np.array(flight, np.int64))
    if win.sel and win.sel[0] == rank and 0 <= win.sel[1] < rv.n and lo <= _position(rv, win.sel[1]) < hi:
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


def _paint_overview(m: Any, rt: Any, rank: int, win: Window, idx: np.ndarray, code: np.ndarray,
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

def paint_group(m: Any, ranks: tuple[int, ...], win: Window, cats: np.ndarray | None = None,
                spans: Mapping[int, SpanIndex] | None = None) -> list[Segment]:
    """Collapsed rows: how many of the ranks are busy in each cell, as shades."""
    w = win.width
    if cats is None or cats.shape[0] < len(m.sigs):
        cats = categories(m.sigs)
    busy = np.zeros(w, np.int32)
    worst = np.zeros(w, np.int8)
    for r in ranks:
        cells, _ = paint_rank(m, r, win, cats, None if spans is None else spans[r])
        busy += cells >= palette.COLL
        np.maximum(worst, np.where(cells >= palette.WARN, cells, 0), out=worst)
    frac = busy / max(1, len(ranks))
    level = np.where(busy > 0, np.maximum(1, np.round(frac * 4)), 0).astype(np.int8)
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
    # Cell numbers in float64: true division is several times faster than int64 floor
    # division, and exact here.  A quotient q = (t - t0) / npc is correctly rounded, so its
    # error is below q * 2**-53, smaller than the 1 / npc that separates a non-integer q from
    # the next integer for every q that decides anything (|q| <= w, npc <= MAX_NPC): the
    # comparisons and the truncation of non-negative values give what floor division gives.
    fa = (a - t0) / npc  # subtract in int64 first: timestamps themselves do not fit a float exactly
    fb = (b - t0) / npc
    if fb.min() < 0 or fa.max() >= w:  # (two reductions: cheaper than a mask when all are in view)
        ok = (fb >= 0) & (fa < w)
        fa, fb, cat = fa[ok], fb[ok], cat[ok]
    # one flat index per (category, cell): category * (w + 1) + cell, built in place
    k = np.multiply(cat, w + 1, dtype=np.int64)
    np.maximum(fa, 0, out=fa)
    c0 = fa.astype(np.int64)  # truncate first: adding k to the float could round a cell up
    c0 += k
    np.minimum(fb, w - 1, out=fb)
    c1 = fb.astype(np.int64)
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
    fa = (a - t0) / npc  # (exact: see _cover)
    fb = (b - t0) / npc
    if fb.min() < 0 or fa.max() >= w:
        ok = (fb >= 0) & (fa < w)
        fa, fb, cat, row = fa[ok], fb[ok], cat[ok], row[ok]
    k = np.multiply(row, N_CATEGORIES, dtype=np.int64)
    k += cat
    k *= w + 1
    np.maximum(fa, 0, out=fa)
    c0 = fa.astype(np.int64)
    c0 += k
    np.minimum(fb, w - 1, out=fb)
    c1 = fb.astype(np.int64)
    c1 += k
    c1 += 1
    n = rows * N_CATEGORIES * (w + 1)
    diff = np.bincount(c0, minlength=n) - np.bincount(c1, minlength=n)
    cov = diff.reshape(rows, N_CATEGORIES, w + 1)[:, :, :w].cumsum(axis=2) > 0
    top = N_CATEGORIES - 1 - cov[:, ::-1, :].argmax(axis=1)  # the highest category covering each cell
    return np.where(cov.any(axis=1), top, 0).astype(np.int8)


def _clamp(npc: int) -> int:
    return int(min(max(npc, MIN_NPC), MAX_NPC))


@lru_cache(maxsize=4096)
def _run(cat: int, n: int) -> Segment:
    """A run of ``n`` cells of one category (rows repeat the same few: made once)."""
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
