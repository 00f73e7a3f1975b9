"""The per-rank timeline widget: one row per rank (or per collapsed group of ranks), time
across; navigation, zoom, selection and the replay cursor.

Drawn with Textual's Line API: ``render_line`` paints one row into a ``Strip``, with the
pure painter (``tui/painter.py``: ``render_row``, ``repaint_ranks`` over a ``Window``).
Strips are cached by (row, its rank's version or, collapsed, the view's, viewport,
selection, clock cell), so a model update re-renders only the one-rank rows whose rank
changed; each one-rank row's painting is kept too, so that of a row only the part from the
earliest op changed is painted again, and a frame's collapsed rows are counted again only
from what changed since the last frame (``painter.count_levels``).
Painting reads the model's published view (``feed.view``), never the live model: no lock.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence

import numpy as np
from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding
from textual.cache import LRUCache
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from commscope.analysis.findings import Finding, ranks_text
from commscope.analysis.model import CONTAINER, NESTED, ModelLike, ModelView, TraceModel
from commscope.analysis.rankstate import rank_state, top_level_ops
from commscope.analysis.vocab import RankState
from commscope.events import DEFAULT_HANG_AFTER
from commscope.tui import palette
from commscope.tui.feed import REPLAY, Feed
from commscope.tui.fmt import count
from commscope.tui.paintcode import categories
from commscope.tui.painter import (
    GUTTER,
    Counted,
    Painted,
    Row,
    Window,
    fit_label,
    follow,
    render_row,
    repaint_rank,
    repaint_ranks,
    row_gone,
    rows_levels,
)
from commscope.tui.spanindex import SpanIndex

MIN_NPC = 100  # ns per cell at the deepest zoom
MAX_NPC = 3600 * 10**9  # (the painter's cell arithmetic is exact up to this: painter._cover)


#: A job of more ranks than this has the ranks its findings name on top (the timeline's
#: rows, one each in every mode, and the rank table's): among thousands, the culprit is on
#: the first screen
PIN_MIN_RANKS = 32
#: A job of more ranks than this opens with its rows summarized by behaviour (``behaviours``)
SUMMARY_MIN_RANKS = 64
#: The legend's categories that say most, first where not all fit the width
LEGEND_FIRST = (palette.ERROR, palette.WARN, palette.COLL, palette.P2P, palette.WAIT, palette.PENDING)


def flagged_ranks(findings: Sequence[Finding], ranks: int) -> set[int]:
    """The ranks the findings point at, marked and (past ``PIN_MIN_RANKS``) pinned: each
    finding's culprits, or its ranks where it names none.  Not those of a finding naming
    more than half of such a job's ``ranks``: it points at none of them (a job killed as a
    whole: every rank's end unrecorded, ``trace_incomplete``), and pinned all 4,096 rows
    one by one, the summary gone and the straggler host below the fold (helper-188)."""
    out: set[int] = set()
    for f in findings:
        named = f.culprits or f.ranks
        if ranks <= PIN_MIN_RANKS or len(named) * 2 <= ranks:
            out.update(named)
    return out
#: A behaviour row is shaded from at most this many of its ranks, evenly spread: they do the
#: same thing now, and 16,384 of them painted one by one take ~1 s a frame (64: ~5 ms)
BEHAVIOUR_SAMPLE = 64
#: The row modes, in the order ``c`` cycles through them
MODES = ("ranks", "behaviour", "nodes", "blocks", "heat")
_GREY = Style(color="grey50")


def behaviour_groups(m: ModelView, ranks: list[int]) -> list[tuple[tuple, list[int]]]:
    """The ranks doing the same thing: the same state, in (or last done with) the same op of
    the same group at the same sequence number; keyed (kind, op, group, seq), the rarest
    first.  How far a rank is from the rest, for the timeline's rows and the rank table."""
    groups: dict[tuple, list[int]] = {}
    for r in ranks:
        st = m.states.get(r)
        if st is None or st.op is None or r not in m.ranks:
            key: tuple = (st.kind if st is not None else "unknown", "", "", -1)
        else:
            rt = m.ranks[r]
            sig = m.sigs[int(rt.sig[st.op])]
            key = (st.kind, sig.op, sig.group, int(rt.seq[st.op]))
        groups.setdefault(key, []).append(r)
    return sorted(groups.items(), key=lambda kv: (len(kv[1]), kv[0][0], kv[1][0]))


def farthest_first(m: ModelView, ranks: list[int]) -> list[int]:
    """``ranks`` by how far each is from the rest: the rarest behaviour first
    (``behaviour_groups``), and in a behaviour of more than two ranks, those that entered its
    op farthest from the behaviour's median first (ties in rank order): among 16k ranks waiting
    in one all_reduce, the one that came 2 s late into it is first of them, though it does
    what they do."""
    out: list[int] = []
    for (_, op, _, _), rs in behaviour_groups(m, ranks):
        if not op or len(rs) <= 2:
            out.extend(rs)
            continue
        begins = np.fromiter((m.ranks[r].begin[m.states[r].op] for r in rs), np.int64, len(rs))
        begins -= begins.min()  # (exact as floats: a median of raw ns rounds to 256 ns)
        far = np.abs(begins - np.median(begins))
        rank = np.asarray(rs)
        out.extend(rank[np.lexsort((rank, -far))].tolist())
    return out


def heat_rows(ranks: list[int], lines: int) -> list[Row]:
    """The heatmap: ``ranks`` in 2 x ``lines`` blocks of consecutive ranks (or one each, when
    fewer), two blocks a line, one above the other in each cell: 16,384 ranks in 40 lines
    are blocks of 205."""
    if not ranks:
        return []
    per = -(-len(ranks) // max(1, 2 * lines))
    blocks = [tuple(ranks[i:i + per]) for i in range(0, len(ranks), per)]
    rows = []
    for i in range(0, len(blocks), 2):
        upper, lower = blocks[i], blocks[i + 1] if i + 1 < len(blocks) else ()
        last = (lower or upper)[-1]
        # (labelled with its ranks' range, as a block's: "r2" read as rank 2 alone, where the
        # line held ranks 2 and 3, the culprit 3; helper-188)
        rows.append(Row(f"h:{upper[0]}-{last}", f"r{upper[0]}" if last == upper[0] else f"r{upper[0]}-{last}",
                        upper + lower,
                        "" if i else f"{count(per, 'rank')} a half-cell", len(upper)))
    return rows


def times(n: int) -> str:
    """'×4,088': a collapsed row's gutter, its count written as every count is (``fmt.count``;
    "×4088" beside the note's "4,088 ranks" read as two numbers); 16,384 fit the gutter."""
    return f"×{count(n)}"


def doing(key: tuple) -> str:
    """A behaviour (``behaviour_groups``' key) in words: 'in all_reduce #4 (group 0)'."""
    kind, op, group, seq = key
    what = f"{op}{f' #{seq}' if seq >= 0 else ''} (group {group})" if op else ""
    return f"{ {'blocked': 'in', 'running': 'in', 'idle': 'idle after'}.get(kind, kind)} {what}".strip()


def behaviours(m: ModelView, ranks: list[int]) -> list[Row]:
    """One row per behaviour (``behaviour_groups``) with its count: among 16k ranks waiting
    in one all_reduce, the few elsewhere are on top."""
    rows = []
    for key, rs in behaviour_groups(m, ranks):
        kind, op, group, seq = key
        note = f"{ranks_text(rs)}: {doing(key)}" if len(rs) > 1 else doing(key)
        rows.append(Row(f"s:{kind}:{op}:{group}:{seq}:{len(rs)}", times(len(rs)) if len(rs) > 1 else f"r{rs[0]}",
                        tuple(rs), note, sample=BEHAVIOUR_SAMPLE))
    return rows


def host_of(m: ModelView, rank: int) -> str:
    """A rank's host, as its meta names it ("?": none said)."""
    return str((m.ranks[rank].meta or {}).get("host", "?"))


def host_rows(m: ModelView, ranks: list[int], apart: Iterable[str] = (), summarize: bool = True) -> list[Row]:
    """By host, then by behaviour: the hosts whose ranks do the same things (as many ranks in
    each ``behaviour_groups`` behaviour) are one row with their count of hosts and what
    their ranks do (2,047 hosts of 8 ranks waiting in all_reduce #4 are one line, the host
    whose ranks are elsewhere another), the rarest first; the hosts of ``apart`` (those the
    findings' ranks sit on) a row each, first, and the ranks no meta named a host for ("?")
    a row of their own.  Not ``summarize`` (a job of at most ``SUMMARY_MIN_RANKS`` ranks):
    one row per host, as it reads best."""
    hosts: dict[str, list[int]] = {}
    for r in ranks:
        hosts.setdefault(host_of(m, r), []).append(r)
    if not summarize:
        return [Row(f"n:{h}", fit_label(h, tail=True), tuple(rs)) for h, rs in hosts.items()]
    behaviour = {r: key for key, rs in behaviour_groups(m, ranks) for r in rs}
    alike: dict[tuple, list[str]] = {}  # what a host's ranks do (behaviour, ranks in it) -> its hosts
    for h, rs in hosts.items():
        alike.setdefault(tuple(sorted(Counter(behaviour[r] for r in rs).items(), key=lambda kv: (-kv[1], kv[0]))),
                         []).append(h)
    first = set(apart) | {"?"}
    rows, own = [], []
    for does, hs in sorted(alike.items(), key=lambda kv: (len(kv[1]), hosts[kv[1][0]][0])):
        what = ", ".join(f"{count(n)} {doing(key)}" for key, n in does)
        for h in [h for h in hs if h in first]:
            row = Row(f"n:{h}", fit_label(h, tail=True), tuple(hosts[h]),
                      f"{h}: {what}" if h != "?" else f"no host said: {what}")
            (rows if h == "?" else own).append(row)
        hs = [h for h in hs if h not in first]
        if len(hs) == 1:
            rows.append(Row(f"n:{hs[0]}", fit_label(hs[0], tail=True), tuple(hosts[hs[0]]), f"{hs[0]}: {what}"))
        elif hs:
            named = f"{hs[0]}, {hs[1]}" if len(hs) == 2 else f"{hs[0]} … {hs[-1]}"
            rows.append(Row(f"H:{does}", times(len(hs)), tuple(r for h in hs for r in hosts[h]),
                            f"{count(len(hs), 'host')} ({named}): {what}", sample=BEHAVIOUR_SAMPLE))
    return own + rows


def apart_rows(m: ModelView, ranks: list[int], each: bool) -> list[Row]:
    """The streams of ``ranks``, not of the job's run (``ModelView.foreign``), after the
    job's rows, marked (``Row.apart``): one row each (``each``), else one row for them all.
    Before, they were drawn among the job's ranks, as if the job had them."""
    if not ranks:
        return []
    if each:
        return [Row(f"f{r}", f"r{r}", (r,), f"⊘ foreign · {m.foreign[r].cause.words}", apart=True) for r in ranks]
    words = sorted({m.foreign[r].cause.words for r in ranks})
    return [Row(f"f:{len(ranks)}", times(len(ranks)), tuple(ranks),
                f"{ranks_text(ranks)}: ⊘ foreign · {', '.join(words)}", sample=BEHAVIOUR_SAMPLE, apart=True)]


class Timeline(ScrollView, can_focus=True):
    """Rows of ranks against time.  ``feed`` provides ``view``, the model as of its last
    batch, which this widget reads without a lock (painting: ``paint_rank``, ``render_row``)."""

    # (none in the footer: at 80 columns its zoom and follow keys cut "? Help" and hid the quit,
    # next-error and panel keys, helper-188; ? lists them)
    BINDINGS = [
        Binding("left", "select_prev", "Prev op", show=False),
        Binding("right", "select_next", "Next op", show=False),
        Binding("up", "row_up", "Rank up", show=False),
        Binding("down", "row_down", "Rank down", show=False),
        Binding("plus,equals_sign,i", "zoom_in", "Zoom in", show=False),
        Binding("minus,o", "zoom_out", "Zoom out", show=False),
        Binding("h,shift+left", "pan_left", "Pan ←", show=False),
        Binding("l,shift+right", "pan_right", "Pan →", show=False),
        Binding("f", "follow", "Follow", show=False),
        Binding("enter", "open_op", "Op detail", show=False),
        # (the replay's start and end, as the help says, whether or not its rows scroll: a
        # scroll view takes them where it can scroll, and at 4,096 ranks they scrolled the rows
        # and left the cursor, helper-188)
        Binding("home", "app.jump_start", "Start", show=False),
        Binding("end", "app.jump_end", "End", show=False),
    ]

    # (never a horizontal scrollbar: time pans by keys; shrunk from 200 columns, a stale one took
    # the legend's line, helper-188)
    DEFAULT_CSS = """
    Timeline { height: 1fr; overflow-x: hidden; }
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

    def __init__(self, feed: Feed, *, name: str | None = None, id: str | None = None,
                 classes: str | None = None):
        super().__init__(name=name, id=id, classes=classes)
        self.feed = feed
        self.t0 = 0
        self.npc = 20_000_000  # ns per cell
        self.follow = True
        self.rows: list[Row] = []
        self.mode = "ranks"  # MODES; a large job starts in "behaviour" (SUMMARY_MIN_RANKS)
        self._mode_chosen = False  # the user pressed c: the job's size no longer picks the mode
        self.only_findings = False
        self.flagged: set[int] = set()  # ranks named in findings
        self._flagged_rows: set[str] = set()
        self.sel: tuple[int, int] | None = None
        self.sel_row = 0
        #: the first rows, the findings' ranks pinned (``rebuild_rows``), stay on screen while the
        #: rest scrolls under them (``_frozen``)
        self.pinned_rows = 0
        self.cursor_ns: int | None = None  # replay cursor
        self.now_ns = 0
        self.hang_after_ns = int(DEFAULT_HANG_AFTER * 10**9)
        # finished lines, by the row and everything drawn on it (least recently used ones dropped)
        self._cache: LRUCache[tuple, Strip] = LRUCache(2000)
        # one-rank rows' paintings by rank and window, repainted in part after changes (``repaint_rank``)
        self._painted: LRUCache[tuple, Painted] = LRUCache(512)
        self._frame_token: tuple | None = None  # (view, window) the rows below were painted for
        self._frame_rows: dict[tuple, Painted] = {}  # this frame's visible rows, painted together
        self._levels_token: tuple | None = None  # (view, window, rows, scroll, height, version) of the levels below
        self._frame_levels: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}  # collapsed rows' (count_levels)
        self._counted: Counted | None = None  # what they were counted from (``count_levels``)
        self._cat_table = np.zeros(0, np.int8)
        # per rank, the overview's span index (spanindex), kept across frames and views: it
        # is data, not a painted cache, so clear_caches leaves it
        self._spans: defaultdict[int, SpanIndex] = defaultdict(lambda: SpanIndex(deferred=True))
        self._building = False  # a build of wanted span indexes is scheduled
        self._dots_key: tuple[int, int] | None = None  # (view version, replay cursor) of _dots
        self._kinds_token: tuple[ModelLike, int | None] | None = None  # (view, replay cursor) of _kinds
        self._rows_token: tuple | None = None  # what ``rebuild_rows`` made ``rows`` from
        self._kinds: dict[str, tuple[Row, str]] = {}  # collapsed rows' kinds (``_row_kind``)
        self._dots: Mapping[int, RankState] = {}
        self._placed = False
        self.empty_text: str | None = None  # why there is nothing to show (set by the app)
        self._own: tuple[ModelView | None, tuple[int, int]] = (None, (0, 0))  # (view, ``own_span`` of it)

    def reset(self) -> None:
        """Forget everything about the previous source (the feed was switched)."""
        self.rows = []
        self.sel = None
        self.sel_row = 0
        self.pinned_rows = 0
        self.cursor_ns = None
        self.follow = True
        self._placed = False
        self.empty_text = None
        self.clear_caches(indexes=True)
        self._cat_table = np.zeros(0, np.int8)
        self._dots_key, self._dots = None, {}
        self._kinds_token, self._kinds = None, {}
        self._rows_token = None
        self.set_flagged(set())
        self.virtual_size = Size(self.size.width, 0)

    # ------------------------------------------------------------------ data
    @property
    def model(self):
        """The model as of the feed's last batch (``TraceModel.view``): read without a lock."""
        return self.feed.view

    def own_span(self) -> tuple[int, int]:
        """The job's own (start, end) in the published view (``ModelView.own_bounds``, the
        trace's where the job has no timed event yet): what the ruler and the header count
        time from and ``g``/``G`` go to (before, the trace's first and last event: a foreign
        stream copied in from a job launched earlier made the job's first op "+1.1 s").  Once
        per view: ``own_bounds`` walks every rank where there are foreign streams, and the
        header asks ten times a second."""
        v = self.model
        if self._own[0] is not v:
            start, end = v.own_bounds() if v.foreign else v.bounds()
            self._own = (v, (start, end) if end else v.bounds())
        return self._own[1]

    def timeline_width(self) -> int:
        return max(1, self.size.width - GUTTER)

    def t1(self) -> int:
        return self.t0 + self.timeline_width() * self.npc

    def rebuild_rows(self) -> None:
        """The rows for the mode, the view and the findings' ranks: made again only when one
        of them (or, for the heatmap, the height) changed since (the app asks ten times a
        second; at 16,384 ranks by host or behaviour they take ~15-25 ms)."""
        m = self.model
        token = (m, self.mode, self.only_findings, frozenset(self.flagged), self.size.height)
        if self._rows_token is not None and self._rows_token[0] is m and self._rows_token[1:] == token[1:]:
            return
        ranks = m.rank_ids()
        apart = [r for r in ranks if r in m.foreign] if m.foreign else []  # (drawn apart, last: ``apart_rows``)
        if apart:
            ranks = [r for r in ranks if r not in m.foreign]
        if not self._mode_chosen and self.mode == "ranks" and len(ranks) > SUMMARY_MIN_RANKS:
            self.mode = "behaviour"  # (once: a live job's ranks appear one by one)
        if self.only_findings and self.flagged:
            ranks = [r for r in ranks if r in self.flagged]
            apart = [r for r in apart if r in self.flagged]
        every = len(ranks)  # (the job's, the findings' among them)
        rows: list[Row] = []
        pinned: list[int] = []
        if len(ranks) > PIN_MIN_RANKS and self.flagged:
            pinned = [r for r in ranks if r in self.flagged]
            rows = [Row(f"r{r}", f"r{r}", (r,)) for r in pinned]
            ranks = [r for r in ranks if r not in self.flagged]
            if self.mode == "behaviour":  # the hosts the flagged ranks sit on, expanded below them
                hosts = {host_of(m, r) for r in pinned} - {"?"}
                near = [r for r in ranks if host_of(m, r) in hosts]
                rows += [Row(f"r{r}", f"r{r}", (r,)) for r in near]
                ranks = [r for r in ranks if r not in set(near)]
        after = apart_rows(m, apart, self.mode == "ranks" or len(apart) <= PIN_MIN_RANKS // 4)
        if self.mode == "ranks" or (self.mode == "behaviour" and len(ranks) <= PIN_MIN_RANKS):
            rows += [Row(f"r{r}", f"r{r}", (r,)) for r in ranks]  # (a few ranks read best one by one)
        elif self.mode == "behaviour":
            rows += behaviours(m, ranks)
        elif self.mode == "heat":  # the whole job in the lines left (less the legend's and the streams' apart)
            rows += heat_rows(ranks, max(4, (self.size.height or 24) - len(rows) - len(after) - 1))
        elif self.mode == "nodes":  # (the hosts the flagged ranks sit on first, each its own row)
            rows += host_rows(m, ranks, {host_of(m, r) for r in self.flagged if r in m.ranks} - {"?"},
                              summarize=every > SUMMARY_MIN_RANKS)
        else:
            size = max(1, -(-len(ranks) // 32)) if len(ranks) > 32 else 1
            for i in range(0, len(ranks), size):
                chunk = tuple(ranks[i:i + size])
                label = f"r{chunk[0]}" if len(chunk) == 1 else f"r{chunk[0]}-{chunk[-1]}"
                rows.append(Row(f"b:{label}", label, chunk))
        rows += after
        self.pinned_rows = len(pinned)
        self._rows_token = (m, self.mode, *token[2:])  # (the mode as it is now: a large job's first rows switch it)
        if rows != self.rows:  # (a behaviour row keeps its key while its ranks change)
            old = self.rows[min(self.sel_row, len(self.rows) - 1)] if self.rows else None
            # (the focus follows its rank: the selected op's, or a one-rank row's; after ``c`` the
            # row at its old index held other ranks, and ← went to rank 0's op, helper-188.  A
            # summary row's is its key while it lasts: following its first rank, the focus jumped
            # rows as that rank changed state live, helper-189)
            focused = None if old is None else self.sel[0] if self.sel is not None and self.sel[0] in old.ranks \
                else old.ranks[0] if len(old.ranks) == 1 else None
            self.rows = rows
            at = next((i for i, row in enumerate(rows) if focused in row.ranks), None) if focused is not None else None
            if at is None and old is not None:
                at = next((i for i, row in enumerate(rows) if row.key == old.key), None)
            self.sel_row = at if at is not None else min(self.sel_row, max(0, len(rows) - 1))
            self._cache.clear()
            self.set_flagged(self.flagged)
        self.virtual_size = Size(self.size.width, len(self.rows))

    def on_model_update(self, now_ns: int, changed: set[int] | None = None) -> None:
        """Called by the app after each feed update (UI thread)."""
        self.now_ns = now_ns
        self.rebuild_rows()
        self.ensure_placed()
        if self._placed and self.follow:  # (now, or the replay cursor: g, G, playback, helper-198)
            self._follow_now()
        self.refresh()

    def clear_caches(self, *, indexes: bool = False) -> None:
        """Forget every painted line and row (the next frame paints everything); with
        ``indexes``, the span indexes too (the next overview builds them again)."""
        self._cache.clear()
        self._painted.clear()
        self._frame_token, self._frame_rows = None, {}
        self._levels_token, self._frame_levels = None, {}
        self._counted = None
        self._kinds_token, self._kinds = None, {}
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
        if self.follow:
            self._follow_now()
        return True

    def _place_initial(self) -> None:
        start, end = self.own_span()  # (the job's: a foreign stream's may be a day off)
        width = max(1, int(self.timeline_width() * 0.8))
        # (a window read: from where it starts; a week-long job read --since its last 30 min
        # opened on its first day, every row blank, helper-198.  Not a whole trace whose ops
        # began late: a crash during a long init was then off screen, helper-201)
        window = self.feed.reader.window_start_ns()
        if window is not None and start < window < end:  # (one past the trace's end holds nothing of it)
            start = window
        want = max(end - start, 10**9) // width
        self.npc = _clamp(want)
        if self.npc < want:  # (longer still: its end, where the trouble is)
            self.t0 = end - int(self.timeline_width() * 0.9) * self.npc
        else:
            self.t0 = start - self.npc * 2
        self._placed = True
        self._cache.clear()
        self.post_message(self.ViewChanged())

    def _follow_now(self) -> None:
        edge = self.now_ns if self.cursor_ns is None else self.cursor_ns
        if not edge:  # no clock reading yet (a resize before the first update): keep the fit
            return
        if self.cursor_ns is not None and self.t0 <= edge < self.t1():
            return  # (a replay's cursor on screen: the view stays; off it, it follows, helper-198)
        t0 = follow(self.t0, self.npc, self.timeline_width(), edge)
        if t0 != self.t0:
            self.t0 = t0
            self.post_message(self.ViewChanged())

    # ------------------------------------------------------------------ rendering
    def _frozen(self) -> int:
        """How many of the first rows (the findings' ranks, pinned) stay on screen while the
        rest scrolls: at most half the height.  At 80x24 a 4,096-rank job's first screen
        selected the waiting ranks' row at the bottom and scrolled its culprits off
        (helper-165)."""
        return min(self.pinned_rows, self.size.height // 2)

    def _row_at(self, y: int) -> int:
        """The row drawn on line ``y``: a frozen row, else one scrolled."""
        frozen = self._frozen()
        return y if y < frozen else y + self.scroll_offset.y

    def _visible(self) -> list[Row]:
        """The rows on screen, the frozen ones first."""
        frozen, top = self._frozen(), self.scroll_offset.y
        return self.rows[:frozen] + self.rows[frozen + top:top + self.size.height]

    def _reveal(self, center: bool) -> None:
        """Scroll so the selected row is on screen (``center``: in the middle of the rows
        that scroll), a frozen one being there already."""
        frozen, top, height = self._frozen(), self.scroll_offset.y, self.size.height
        if self.sel_row < frozen:
            return
        if center:
            self.scroll_to(y=max(0, self.sel_row - frozen - (height - frozen) // 2), animate=False)
        elif self.sel_row < top + frozen:
            self.scroll_to(y=self.sel_row - frozen, animate=False)
        elif self.sel_row >= top + height:
            self.scroll_to(y=self.sel_row - height + 1, animate=False)

    def action_page_down(self) -> None:
        """A page of the rows that scroll: a whole height skipped those the frozen rows hide
        (helper-168)."""
        self.scroll_to(y=self.scroll_offset.y + max(1, self.size.height - self._frozen()), animate=False)

    def action_page_up(self) -> None:
        self.scroll_to(y=max(0, self.scroll_offset.y - max(1, self.size.height - self._frozen())), animate=False)

    def render_line(self, y: int) -> Strip:
        if not self._placed:
            self.ensure_placed()
        width = self.size.width
        ri = self._row_at(y)
        if not self.rows:
            if y == self.size.height // 2:
                if self.empty_text:
                    return Strip([Segment(self.empty_text.center(width)[:width], Style(color="#e05050", bold=True))],
                                 width)
                text = ("reading the trace…" if self.feed.mode == REPLAY else
                        "waiting for the job to write its first events…")
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
        if row.alone:
            rv = m.ranks.get(row.ranks[0])
            versions, live = -1 if rv is None else rv.version, rv is not None and bool(rv.open)
        else:  # (counted again at each view, from what changed: ``_collapsed_levels``; no walk of 16k ranks here)
            versions, live = m.version, True
        focused = ri == self.sel_row
        kind = self._row_kind(m, row)
        win = self.window(width - GUTTER)
        sel = win.sel if win.sel and win.sel[0] in row.ranks else None
        now_cell = (win.now - self.t0) // self.npc if live else None
        # (a heatmap line's states, in its key: a rank judged dead by its silence changes no version)
        gone = row_gone(self._states(m), row, win)
        key = (row.key, versions, self.t0, self.npc, width, sel, self.cursor_ns, now_cell, focused,
               self.hang_after_ns, row.key in self._flagged_rows, kind,
               None if gone is None else b"".join(g.tobytes() for g in gone))
        strip = self._cache.get(key)
        if strip is None:
            cats = self._categories(m)
            painted = None
            if row.alone:  # repaint only what changed since this row was last painted here
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
            levels = None if row.alone else self._collapsed_levels(m, win, cats, row)
            strip = render_row(m, row, win, kind=kind, focused=focused, flagged=row.key in self._flagged_rows,
                               cats=cats, painted=painted, spans=self._spans if self.SPAN_INDEX else None,
                               levels=levels, gone=gone)
            if not row.alone:  # a collapsed row's ranks may want their indexes too
                self._build_wanted(self._spans[r] for r in row.painted_ranks())
            self._cache[key] = strip
        return strip

    def _collapsed_levels(self, m: ModelLike, win: Window, cats: np.ndarray,
                          row: Row) -> list[tuple[np.ndarray, np.ndarray]]:
        """A collapsed row's levels (``count_levels``), made for every visible collapsed row of
        the frame at once the first time the frame asks for one (a heatmap of 16,384 ranks
        is 40 lines, each painted alone a numpy pass of its own over 410 ranks), from what
        changed since the last frame's."""
        top = self.scroll_offset.y
        token = (m, win, self.rows, top, self.size.height, m.version)  # (the view, the rows by identity: ``_same``)
        if not _same(self._levels_token, token):
            rows = [r for r in self._visible() if not r.alone]
            # (only what changed since the last frame's counts, where it was over the same rows and window)
            got, self._counted = rows_levels(m, rows, win, cats, self._spans if self.SPAN_INDEX else None,
                                             self._counted)
            self._frame_levels = {r.key: levels for r, levels in zip(rows, got, strict=True)}
            self._levels_token = token
        levels = self._frame_levels.get(row.key)
        if levels is None:  # (a row outside the visible ones)
            levels = rows_levels(m, [row], win, cats, self._spans if self.SPAN_INDEX else None)[0][0]
        return levels

    def _painted_key(self, rank: int, win: Window) -> tuple:
        sel = win.sel if win.sel and win.sel[0] == rank else None
        return (rank, self.t0, self.npc, win.width, self.cursor_ns, sel, self.hang_after_ns, win.overview)

    def _spans_of(self, rank: int) -> SpanIndex | None:
        return self._spans[rank] if self.SPAN_INDEX else None

    def _keep_painted(self, pkey: tuple, p: Painted) -> None:
        """Keep ``p`` as the painting of ``pkey``, replacing the one kept before: discarded
        first, as ``LRUCache.set`` leaves a key it already holds as it was."""
        self._painted.discard(pkey)
        self._painted[pkey] = p

    def _repaint_visible(self, m: ModelLike, win: Window, cats: np.ndarray, token: tuple) -> None:
        """Bring every visible one-rank row's painting up to date (``repaint_ranks``: in one
        pass, which costs much less than row by row), for the frame ``token``."""
        keys, asks = [], []
        for row in self._visible():
            if row.alone:
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
        if self.mode == "heat":  # (a cell's colours: busy shares, then the states over them)
            segs += [Segment("█", Style(color=c)) for c in palette.HEAT] + [Segment(" busy  ", _GREY)]
            for colour, name in palette.HEAT_LEGEND:
                segs += [Segment("██", Style(color=colour)), Segment(f" {name}  ", _GREY)]  # (80 columns: all of it)
            return Strip(segs).crop_extend(0, width, None)
        # (whole items only, those that say most first where not all fit: at 80 columns "slow"
        # and "past hang_after" went, cut, helper-188; shown in the legend's order)
        room = width - GUTTER
        shown = set()
        for cat, name in sorted(palette.LEGEND, key=lambda item: LEGEND_FIRST.index(item[0])
                                if item[0] in LEGEND_FIRST else len(LEGEND_FIRST)):
            if len(name) + 6 <= room:
                shown.add(cat)
                room -= len(name) + 6
        for cat, name in palette.LEGEND:
            if cat in shown:
                segs += [Segment(palette.GLYPH[cat] * 2, palette.STYLE[cat]), Segment(f" {name}   ", _GREY)]
        # padded to the full width: a shorter line leaves what the terminal showed there before
        return Strip(segs).crop_extend(0, width, None)

    def set_flagged(self, ranks: set[int]) -> None:
        """Ranks named in findings: marked in the gutter, kept by the findings filter, and
        on top in a job of more than ``PIN_MIN_RANKS`` ranks."""
        moved = ranks != self.flagged and len(self.model.rank_ids()) > PIN_MIN_RANKS
        self.flagged = ranks
        self._flagged_rows = {r.key for r in self.rows if ranks.intersection(r.ranks)}
        if moved:
            self.rebuild_rows()

    def _now(self) -> int:
        return self.cursor_ns if self.cursor_ns is not None else self.now_ns

    def _states(self, m: ModelView) -> Mapping[int, RankState]:
        """Each rank's state as the rows show it: live, the states the feed published with
        the view; at a replay cursor, as of the cursor (the trace is loaded and no longer
        changes; judged as asked, cached per cursor position: the future stays hidden)."""
        if self.cursor_ns is None or self.feed.mode != REPLAY:
            return m.states
        key = (m.version, self.cursor_ns)
        if self._dots_key != key:
            self._dots_key, self._dots = key, _StatesAsOf(self.feed.model, self.cursor_ns, m.ranks)
        return self._dots

    def _row_kind(self, m: ModelView, row: Row) -> str:
        """The gutter dot of a row: its rank's state (``_states``), the worst of its ranks'
        when collapsed."""
        states = self._states(m)

        def kind_of(r: int) -> str:
            st = states.get(r)
            return st.kind if st is not None else "unknown"
        if row.alone:
            return kind_of(row.ranks[0])
        # (a collapsed row's: once a view and cursor, not at every line painted: 16k ranks a frame)
        if self._kinds_token is None or self._kinds_token[0] is not m or self._kinds_token[1] != self.cursor_ns:
            self._kinds_token, self._kinds = (m, self.cursor_ns), {}
        got = self._kinds.get(row.key)
        if got is None or got[0] is not row:  # (a row of the same key may hold other ranks: by identity)
            ranks = row.ranks
            if isinstance(states, _StatesAsOf) and len(ranks) > BEHAVIOUR_SAMPLE:
                # (as of a replay cursor each rank is judged alone, ~60 us: 4,096 a cursor step made
                # playback lag seconds behind its keys, helper-165; an even sample, as the row's shading)
                ranks = ranks[::-(-len(ranks) // BEHAVIOUR_SAMPLE)]
            kinds = {kind_of(r) for r in ranks}
            got = self._kinds[row.key] = (row, next((k for k in ("dead", "crashed", "blocked", "running", "idle",
                                                                  "exited") if k in kinds), "unknown"))
        return got[1]

    def _categories(self, m: ModelLike) -> np.ndarray:
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
            self._reveal(center=True)
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
        self._reveal(center=False)
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
        self.mode = MODES[(MODES.index(self.mode) + 1) % len(MODES)]
        self._mode_chosen = True
        self.rebuild_rows()
        self.notify(f"timeline rows: {self.mode}", timeout=2)
        self.refresh()

    def pane_title(self) -> str:
        """The timeline pane's title: while ``x`` hides ranks, saying so (only a toast said
        it, gone in 2 s while the rows stayed few: helper-188)."""
        if not self.only_findings:
            return "timeline"
        shown = f"only the {count(len(self.flagged), 'rank')} named in findings" if self.flagged else \
            "ranks named in findings only: none named, all shown"
        return f"timeline  [dim](x: {shown})[/]"

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
        ri = self._row_at(event.y)
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
        if self.mode == "heat":
            self.rebuild_rows()
        self.virtual_size = Size(self.size.width, len(self.rows))
        was, self._width_seen = self._width_seen, self.timeline_width()
        if self._placed and was and was != self._width_seen:
            # (the same time in view, its cells narrower or wider: shrunk from 200 to 80 columns the
            # view kept its scale, and the trace's end and the replay cursor went off it, helper-188;
            # the span kept from the first of a run of resizes, not each step's rounded one, which
            # drifted, dragged a column at a time: helper-189)
            span = self._span_seen[0] if self._span_seen[1] == self.npc else was * self.npc
            self.npc = _clamp(max(1, round(span / self._width_seen)))
            self._span_seen = (span, self.npc)
            self.post_message(self.ViewChanged())
        self.ensure_placed()

    _width_seen = 0  # (the timeline's width at the last resize: ``on_resize`` keeps the time in view)
    _span_seen = (0, -1)  # (the span a resize kept, and the scale it made: a zoom since makes another)


class _StatesAsOf(Mapping[int, RankState]):
    """The ranks' states as of a replay cursor, each judged the first time it is asked
    (``rank_state(..., as_of=True)``) and kept: a screen's rows ask only for theirs."""

    def __init__(self, model: TraceModel, at: int, ranks: Mapping[int, object]) -> None:
        self._model, self._at, self._ranks = model, at, ranks
        self._got: dict[int, RankState] = {}

    def __getitem__(self, rank: int) -> RankState:
        st = self._got.get(rank)
        if st is None:
            if rank not in self._ranks:
                raise KeyError(rank)
            st = self._got[rank] = rank_state(self._model, rank, self._at, as_of=True)
        return st

    def __iter__(self) -> Iterator[int]:
        return iter(self._ranks)

    def __len__(self) -> int:
        return len(self._ranks)


def _same(a: tuple | None, b: tuple) -> bool:
    """Whether two frames' tokens are the same: the published view and the rows list the
    same objects (an id may be another's once the first is gone; equal rows would be
    compared rank by rank), the rest equal."""
    return a is not None and a[0] is b[0] and a[2] is b[2] and a[1] == b[1] and a[3:] == b[3:]


def _clamp(npc: int) -> int:
    """``npc`` within the zoom limits."""
    return int(min(max(npc, MIN_NPC), MAX_NPC))
