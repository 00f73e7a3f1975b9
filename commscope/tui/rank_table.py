"""The rank table: state, last op and resources per rank; sortable by any column."""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any

from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

from commscope.analysis.model import RankState, TraceModel
from commscope.analysis.rankstate import ending, last_op_before, rank_state, sample_at
from commscope.events import DESTROYED
from commscope.tui import palette
from commscope.tui.feed import REPLAY
from commscope.tui.fmt import compact_size, duration, percent
from commscope.tui.timeline import PIN_MIN_RANKS, SUMMARY_MIN_RANKS, farthest_first

COLUMNS = [("rank", "Rank", 4), ("host", "Host", 10), ("state", "State", 30), ("last", "Last op", 16),
           ("gpu", "GPU%", 4), ("gmem", "GPU mem", 8), ("cpu", "CPU%", 4), ("rss", "RSS", 8)]
FLEX = "state"  # takes whatever width the others leave
#: The sort that is no column: the rarest behaviour first, and in one, the ranks that entered
#: its op farthest from the rest (``timeline.farthest_first``), what a job of more than
#: SUMMARY_MIN_RANKS ranks opens with: how far a rank is from the rest
UNUSUAL = "unusual"
LABELS = {k: label for k, label, _ in COLUMNS} | {
    UNUSUAL: "how unusual (the rarest behaviour first; in one, who entered it farthest from the rest)"}
PRIORITY = ["rank", "gpu", "cpu", "gmem", "rss", "last", "host"]
STATE_MIN = 26  # room for "● in all_reduce #7 · 6.0 s" before any optional column


def _plain(cell: Any) -> str:
    return cell.plain if isinstance(cell, Text) else str(cell)


LAST_MIN, LAST_MAX = 9, 24  # the last-op column fits its longest (abbreviated) label within these
NAME_ROOM = 12  # op names longer than this are abbreviated, deliberately, never cut
# Deliberate abbreviations, applied in order until a name fits: all_gather_single -> ag_single,
# all_gather_into_tensor -> ag_tensor, reduce_scatter_tensor -> rs_tensor, all_to_all_single -> a2a_single.
_ABBREV = [("all_gather", "ag"), ("reduce_scatter", "rs"), ("all_to_all", "a2a"), ("all_reduce", "ar"),
           ("_into_tensor", "_tensor"), ("_coalesced", "_coal"), ("broadcast", "bcast"), ("_tensors", "_t")]
_REASONS = {DESTROYED: "destroy_pg"}


def abbreviate(name: str, room: int = NAME_ROOM) -> str:
    """An op name in at most ``room`` characters where the abbreviations allow, else whole."""
    for long, short in _ABBREV:
        if len(name) <= room:
            break
        name = name.replace(long, short)
    return name


def short_label(m: TraceModel, r: int, i: int) -> str:
    """'all_reduce #42' / 'send #3 → 1' / 'ag_tensor #7': the label without its group suffix,
    long op names abbreviated."""
    text = m.label(r, i).split(" (")[0]
    name, _, rest = text.partition(" ")
    text = abbreviate(name) + (" " + rest if rest else "")
    return text.replace(" to ", " → ").replace(" from ", " ← ")


def fit_words(text: str, width: int) -> str:
    """``text`` in ``width`` columns, cut only between words (with '…'), never inside one."""
    if len(text) <= width:
        return text
    cut = text.rfind(" ", 0, max(1, width))
    return (text[:cut].rstrip(" ·(") if cut > 0 else text[: max(1, width - 1)]) + "…"


def compact_state(m: TraceModel, r: int, st: RankState, now: int, whole: bool = False) -> str:
    """The state cell.  ``whole``: the model holds the rank's whole record (a replay), so a
    rank idle since its last op that recorded nothing after it is said to have stopped
    recording ("idle · trace ends", or "silent" past its end): its idle time was never
    measured.  A straggler trace ending at its last collective read "idle · 0 µs" on every
    rank at its end (helper-202)."""
    if st.kind == "blocked" and st.op is not None:
        verb = "waiting" if st.text.startswith("waiting") else "in"
        return f"{verb} {short_label(m, r, st.op)} · {duration(max(0, now - st.since_ns))}"
    if st.kind == "idle":
        if st.op is None:
            return "idle"
        if whole and m.last_seen(r) <= st.since_ns:  # (nothing of it after its last op's end)
            return "idle · trace ends" if now <= st.since_ns else f"idle · silent {duration(now - st.since_ns)}"
        return f"idle · {duration(max(0, now - st.since_ns))}"
    if st.kind == "dead":
        words = ending(m, r, now, st) or "dead (silent)"
        if words == "dead (silent)":
            return f"dead · silent {duration(max(0, now - st.since_ns))}"
        how, _, why = words.partition(" (")  # 'job stopped (SIGTERM)' -> 'stopped · SIGTERM'
        return f"{how.removeprefix('job ')} · {why[:-1]}" if why else how
    if st.kind == "exited":
        text = ending(m, r, now, st) or st.text  # (a cell's words: "exited (destroy_pg)", not the sentence's)
        for long, short in _REASONS.items():
            if f"({long})" in text:
                return text.replace(long, short)
        return text
    return st.text


#: The state column's sort: the ranks in trouble first
_STATE_ORDER = {"dead": 0, "crashed": 0, "blocked": 1, "running": 2, "idle": 3, "exited": 4, "unknown": 5}


def order_of(kind: str) -> int:
    return _STATE_ORDER.get(kind, 9)


def _sampled(v: float | None) -> float:
    """A sample's value as its column sorts it: none sampled first (-1)."""
    return v if v is not None else -1


def sort_key(v: Any) -> tuple:
    """A key any two cell values compare by without raising: numbers (NaN last), then text,
    then tuples of such keys, then anything else by its repr."""
    if isinstance(v, int | float):
        return (0, v if v == v else math.inf, "")
    if isinstance(v, str):
        return (1, 0, v)
    if isinstance(v, tuple):
        return (2, 0, "", tuple(sort_key(x) for x in v))
    return (3, 0, repr(v))


#: The columns that show a resource sample, and the sample's field: sorting by one reads only
#: the samples (``RankTable._sort_keys``), not every rank's state
SAMPLED = {"gpu": "gpu_util", "gmem": "gpu_mem", "cpu": "cpu", "rss": "rss"}

#: Jobs up to this many ranks size the last-op column to every rank's label; larger ones to the
#: labels of the rows shown so far (never narrowing): a label costs a model lookup per rank
ALL_LABELS = 1024
#: Rows' cells kept between refreshes of the values (the rows on screen, and those scrolled past;
#: every rank's where the last-op column is sized to all of them)
CELL_CACHE = 2 * ALL_LABELS


class RankTable(ScrollView, can_focus=True):
    """One row per rank.  Click a column header (or press s) to sort by it; s also offers
    "how unusual" (``farthest_first``), which a large job opens with.

    Virtual: the order is kept for every rank, but a rank's cells (its state, last op and
    samples) are computed only when its row is on screen, and painted a line at a time
    (``render_line``), so 16,384 ranks cost what the 20-60 rows shown cost, not a widget row
    per rank.  The header stays on the first line; arrows, page keys and home/end move the
    cursor, the mouse wheel scrolls and a click on a row puts the cursor there."""

    BINDINGS = [Binding("up", "cursor_up", "Up", show=False), Binding("down", "cursor_down", "Down", show=False),
                Binding("pageup", "page_up", "Page up", show=False),
                Binding("pagedown", "page_down", "Page down", show=False),
                Binding("home", "first", "First", show=False), Binding("end", "last", "Last", show=False)]
    COMPONENT_CLASSES = {"rank-table--header", "rank-table--cursor", "rank-table--even-row"}
    DEFAULT_CSS = """
    RankTable {
        background: $surface;
        color: $foreground;
        &:focus {
            background-tint: $foreground 5%;
            & > .rank-table--cursor {
                background: $block-cursor-background;
                color: $block-cursor-foreground;
                text-style: $block-cursor-text-style;
            }
        }
        &:dark {
            & > .rank-table--even-row {
                background: $surface-darken-1 40%;
            }
        }
        & > .rank-table--header {
            text-style: bold;
            background: $panel;
            color: $foreground;
        }
        & > .rank-table--even-row {
            background: $surface-lighten-1 50%;
        }
        & > .rank-table--cursor {
            background: $block-cursor-blurred-background;
            color: $block-cursor-blurred-foreground;
            text-style: $block-cursor-blurred-text-style;
        }
    }
    """

    def __init__(self, feed: Any, **kwargs: Any):
        super().__init__(**kwargs)
        self.feed = feed
        self.order: list[int] = []  # every rank, in the order shown
        self.cursor_row = 0
        self._sort_col = "rank"
        self._sort_chosen = False  # the user sorted: the job's size no longer picks the sort
        #: ranks named in findings: first, whatever the sort, in a job of more than PIN_MIN_RANKS
        self.flagged: set[int] = set()
        self._sort_reverse = False
        self._now = 0
        self._cells: OrderedDict[int, dict[str, tuple[Any, Any]]] = OrderedDict()  # rank -> its row's cells
        self._cols: list[tuple[str, str, int]] = []
        self._flex_width = STATE_MIN
        self._last_width = LAST_MIN  # the last-op column: as wide as its longest label
        self._stamp: tuple | None = None  # what the order was sorted as of (``_sort_stamp``)
        self.sorts = 0  # how many times the order was sorted (tests count them)

    # -- what the table holds
    def reset(self) -> None:
        self.order = []
        self._stamp = None
        self._cells.clear()
        self._cols = []
        self._last_width = LAST_MIN
        self.cursor_row = 0
        self.virtual_size = Size(self.size.width, 1)
        self.refresh()

    @property
    def row_count(self) -> int:
        return len(self.order)

    def column_keys(self) -> list[str]:
        return [key for key, _, _ in self._cols]

    def cells(self, rank: int) -> dict[str, str]:
        """The text of rank ``rank``'s row, by column key, as shown (fitted to its column)."""
        with self.feed.lock:
            vals = self._values(rank)
        if vals is None:
            return {}
        return {key: self._fitted(key, width, vals[key][1]).plain for key, _, width in self._shown()}

    def column_span(self, key: str) -> tuple[int, int]:
        """Where column ``key`` is across the widget (its padding included)."""
        x = 0
        for k, width in ((k, w) for k, _, w in self._shown()):
            if k == key:
                return x, x + width + 2
            x += width + 2
        raise KeyError(key)

    def _shown(self) -> list[tuple[str, str, int]]:
        """The columns with the widths they are drawn at (the state column takes the rest)."""
        return [(k, label, self._width(k, w)) for k, label, w in self._cols]

    def _width(self, key: str, width: int) -> int:
        """A column's drawn width: the state column's what the others leave, the last op's its
        longest label."""
        return self._flex_width if key == FLEX else self._last_width if key == "last" else width

    def _wanted(self) -> list[tuple[str, str, int]]:
        """Host only when ranks span hosts; GPU columns only when some rank sampled a GPU."""
        m = self.feed.model
        hosts = {str((rt.meta or {}).get("host", "")) for rt in m.ranks.values()}
        gpu = any((m.latest_sample(r) or {}).get("gpu_util") is not None for r in m.rank_ids())
        cols = [c for c in COLUMNS if (c[0] != "host" or len(hosts) > 1) and (c[0] not in ("gpu", "gmem") or gpu)]
        # Narrow panes keep the most telling columns; the state text names the op anyway.
        budget = self._room() - (STATE_MIN + 2) - (COLUMNS[0][2] + 2) if self.size.width else 10**6
        keep = {FLEX, "rank"}  # the rank number and its state always show
        for key in PRIORITY[1:]:
            col = next((c for c in cols if c[0] == key), None)
            if col is not None and self._width(key, col[2]) + 2 <= budget:
                keep.add(key)
                budget -= self._width(key, col[2]) + 2
        return [c for c in cols if c[0] in keep]

    def _room(self) -> int:
        """Columns of text the table can show without scrolling sideways."""
        bar = self.scrollbar_size_vertical if self.show_vertical_scrollbar else 0
        return self.size.width - bar - 1  # the vertical scrollbar when shown, and a margin

    def _fit_flex(self) -> None:
        fixed = sum(w + 2 for k, _, w in self._shown() if k != FLEX)
        self._flex_width = max(8, self._room() - fixed - 2)  # below STATE_MIN only when no other column is left

    def on_resize(self) -> None:
        if not self._cols:
            return
        with self.feed.lock:
            self._cols = self._wanted()
        self._fit_flex()
        self._strips_changed()

    # -- refreshing: the order of every rank, the cells of the rows shown
    def refresh_ranks(self, now: int) -> None:
        m = self.feed.model
        self._now = now
        with self.feed.lock:
            ranks = m.rank_ids()
            self._cells.clear()
            self.order = self._sorted(ranks)
            labels = ranks if len(ranks) <= ALL_LABELS else self._visible()
            want = max([self._last_width if len(ranks) > ALL_LABELS else LAST_MIN,
                        *(len(_plain(self._values(r)["last"][1])) for r in labels)])
            self._last_width = min(want, LAST_MAX)
            self._cols = self._wanted()  # (with the last-op column's width: it may fit now, or no longer)
        self._fit_flex()
        if self.order:
            self.cursor_row = min(self.cursor_row, len(self.order) - 1)
        self._strips_changed()

    def _strips_changed(self) -> None:
        width = sum(w + 2 for _, _, w in self._shown())
        self.virtual_size = Size(width, len(self.order) + 1)
        self.refresh()

    def _visible(self) -> list[int]:
        top = int(self.scroll_offset.y)
        return self.order[top: top + max(1, self.size.height - 1)]  # (under the header)

    def _values(self, r: int) -> dict[str, tuple[Any, Any]] | None:
        """Rank ``r``'s cells as of the last refresh (computed once it is wanted; the caller
        holds the feed's lock); None when the model no longer has it (a live feed that started
        again at the tail, before the app's reset)."""
        vals = self._cells.get(r)
        if vals is None:
            if r not in self.feed.model.ranks:
                return None
            vals = self._cells[r] = self._row_values(r, self._now)
            if len(self._cells) > CELL_CACHE:
                self._cells.popitem(last=False)
        else:
            self._cells.move_to_end(r)
        return vals

    def _row_values(self, r: int, now: int) -> dict[str, tuple[Any, Any]]:
        """column -> (sort key, cell renderable)."""
        m = self.feed.model
        replay = self.feed.mode == REPLAY  # as of the replay cursor, not the end of the trace
        whole = replay and self.feed.info.loaded and not self.feed.info.error
        st = rank_state(m, r, now, as_of=replay)
        s = self._sample(r, now)
        why = m.foreign_streams.get(r)  # (not of the job's run: named so, never given a state of the job's)
        state = ((10, r), Text(f"⊘ foreign · {why.cause.words}", style=palette.FOREIGN_STYLE)) if why is not None \
            else ((order_of(st.kind), -(now - st.since_ns)),
                  Text(f"{palette.STATE_DOT[st.kind]} {compact_state(m, r, st, now, whole)}",
                       style=palette.STATE_STYLE[st.kind]))
        # the op it is in, else the last one it began (also for ranks that exited or died)
        last = st.op if st.op is not None else last_op_before(m, r, now)
        meta = m.ranks[r].meta or {}
        gutil, gmem, cpu, rss = s.get("gpu_util"), s.get("gpu_mem"), s.get("cpu"), s.get("rss")
        return {
            "rank": (r, Text(str(r), style="bold" if why is None else palette.FOREIGN_STYLE)),
            "host": (str(meta.get("host", "")), str(meta.get("host", ""))),
            "state": state,
            "last": (m.label(r, last) if last is not None else "", short_label(m, r, last) if last is not None else "–"),
            "gpu": (_sampled(gutil), percent(gutil)),
            "gmem": (_sampled(gmem), compact_size(gmem)),
            "cpu": (_sampled(cpu), percent(cpu)),
            "rss": (_sampled(rss), compact_size(rss)),
        }

    def _sample(self, r: int, now: int) -> dict:
        """Rank ``r``'s resource sample as the table shows it: as of the replay cursor in a
        replay, else its latest."""
        m = self.feed.model
        return sample_at(m, r, now) if self.feed.mode == REPLAY else m.latest_sample(r) or {}

    def _sort_keys(self, col: str, ranks: list[int]) -> dict[int, tuple]:
        """Every rank's sort key of column ``col``, as ``_row_values`` gives it: a column of
        samples or hosts from those alone (sorting 4,096 ranks by CPU computed every rank's
        whole row, its state first: 0.5 s), the state and last op from the rows."""
        m = self.feed.model
        if col in SAMPLED:
            field = SAMPLED[col]
            return {r: sort_key(_sampled(self._sample(r, self._now).get(field))) for r in ranks}
        if col == "host":
            return {r: sort_key(str((m.ranks[r].meta or {}).get("host", ""))) for r in ranks}
        return {r: sort_key(self._row_values(r, self._now)[col][0]) for r in ranks}

    def _sort_stamp(self, ranks: list[int]) -> tuple:
        """What the order depends on: the sort, the model's version, the ranks named in
        findings, and the time the values are as of where the column's values move with it
        (the state and last op; a replay's samples, as of its cursor).  A refresh with the
        same stamp keeps the order: a replay's steps sorted by host, or any refresh of a job
        that did not change, sorted 4,096 ranks again each time (helper-202)."""
        m, col = self.feed.model, self._sort_col
        timed = col in (FLEX, "last") or (col in SAMPLED and self.feed.mode == REPLAY)
        v = self.feed.view
        view = (v.version, v.now) if col == UNUSUAL or (not self._sort_chosen and len(ranks) > SUMMARY_MIN_RANKS) \
            else None
        return (col, self._sort_reverse, self._sort_chosen, id(m), m.version, len(ranks), frozenset(self.flagged),
                self._now if timed else None, view)

    def _sorted(self, ranks: list[int]) -> list[int]:
        """Every rank in the order of the chosen sort (a value column computes that column's
        value for every rank: the user asked for it; the table's refresh is paced by its
        cost), the ranks named in findings first in a large job, the foreign streams
        (``TraceModel.foreign_streams``) last, apart from the job's ranks, whatever the sort.
        Sorted once per ``_sort_stamp``: a refresh that changed none of it keeps the order."""
        stamp = self._sort_stamp(ranks)
        if stamp == self._stamp and len(self.order) == len(ranks):
            return self.order
        self._stamp = stamp
        self.sorts += 1
        apart = self.feed.model.kept_apart
        if apart:
            own = self._sorted_own([r for r in ranks if r not in apart])
            return own + sorted(r for r in ranks if r in apart)
        return self._sorted_own(ranks)

    def _sorted_own(self, ranks: list[int]) -> list[int]:
        col = self._sort_col
        if not self._sort_chosen and col == "rank" and len(ranks) > SUMMARY_MIN_RANKS:
            col = self._sort_col = UNUSUAL
        if col == UNUSUAL:
            order = farthest_first(self.feed.view, sorted(ranks))
            order = order[::-1] if self._sort_reverse else order
        elif col == "rank":
            order = sorted(ranks, reverse=self._sort_reverse)
        else:
            key = self._sort_keys(col, ranks)
            order = sorted(ranks, key=lambda r: (key[r], r), reverse=self._sort_reverse)
        if len(order) > PIN_MIN_RANKS and self.flagged:  # among thousands, the culprit on top
            order = [r for r in order if r in self.flagged] + [r for r in order if r not in self.flagged]
        return order

    def _apply_sort(self) -> None:
        with self.feed.lock:
            self.order = self._sorted(list(self.order))
        self._strips_changed()

    def action_cycle_sort(self) -> None:
        self._sort_chosen = True
        keys = [k for k, _, _ in (self._cols or COLUMNS)] + [UNUSUAL]
        self._sort_col = keys[(keys.index(self._sort_col) + 1) % len(keys)] if self._sort_col in keys else "rank"
        self._sort_reverse = False
        self.notify(f"ranks sorted by {LABELS[self._sort_col]}", timeout=2)
        self._apply_sort()

    def sort_by(self, key: str) -> None:
        """Sort by column ``key``, or reverse the sort when it is already by ``key`` (a click
        on its header)."""
        self._sort_chosen = True
        if key == self._sort_col:
            self._sort_reverse = not self._sort_reverse
        else:
            self._sort_col, self._sort_reverse = key, False
        self._apply_sort()

    # -- moving
    def _move(self, row: int) -> None:
        if not self.order:
            return
        self.cursor_row = max(0, min(row, len(self.order) - 1))
        rows = max(1, self.size.height - 1)  # the lines under the header
        top = int(self.scroll_offset.y)
        if self.cursor_row < top:
            self.scroll_to(y=self.cursor_row, animate=False)
        elif self.cursor_row >= top + rows:
            self.scroll_to(y=self.cursor_row - rows + 1, animate=False)
        self.refresh()

    def action_cursor_up(self) -> None:
        self._move(self.cursor_row - 1)

    def action_cursor_down(self) -> None:
        self._move(self.cursor_row + 1)

    def action_page_up(self) -> None:
        self._move(self.cursor_row - max(1, self.size.height - 1))

    def action_page_down(self) -> None:
        self._move(self.cursor_row + max(1, self.size.height - 1))

    def action_first(self) -> None:
        self._move(0)

    def action_last(self) -> None:
        self._move(len(self.order) - 1)

    def on_click(self, event: events.Click) -> None:
        if event.y == 0:  # the header: sort by the column clicked
            for key, _, _ in self._shown():
                x0, x1 = self.column_span(key)
                if x0 <= event.x + int(self.scroll_offset.x) < x1:
                    self.sort_by(key)
                    return
            return
        row = int(self.scroll_offset.y) + event.y - 1
        if row < len(self.order):  # (a click under the last row selects nothing)
            self._move(row)

    # -- painting
    def _fitted(self, key: str, width: int, cell: Any) -> Text:
        """A cell cut to its column's width: the state and last op between words."""
        text = cell if isinstance(cell, Text) else Text(str(cell))
        if text.cell_len > width:
            text = Text(fit_words(text.plain, width), style=text.style) if key in (FLEX, "last") else text[:width]
        return text

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        if y == 0:
            style = self.get_component_rich_style("rank-table--header")
            line = Text("".join(" " + label[:w].ljust(w) + " " for _, label, w in self._shown()))
        else:
            row = int(self.scroll_offset.y) + y - 1
            if row >= len(self.order):
                return Strip.blank(width, self.rich_style)
            r = self.order[row]
            vals = self._cells.get(r)  # (the feed's lock only to compute: ingest holds it)
            if vals is None:
                with self.feed.lock:
                    vals = self._values(r)
            if vals is None:  # the feed started a fresh model without it: until the next refresh
                return Strip.blank(width, self.rich_style)
            line = Text()
            for key, _, w in self._shown():
                cell = self._fitted(key, w, vals[key][1])
                line.append(" ")
                line.append_text(cell)
                line.append(" " * (w - cell.cell_len + 1))
            style = self.rich_style
            if row % 2 == 0:  # (zebra stripes: the DataTable's, from the first row)
                style = style + self.get_component_rich_style("rank-table--even-row")
            if row == self.cursor_row:
                cursor = self.get_component_rich_style("rank-table--cursor")
                line.stylize(cursor)  # over the cells' own colours, as the focused cursor is
                style = style + cursor
        line.stylize_before(style)
        strip = Strip(list(line.render(self.app.console)))
        return strip.crop_extend(int(self.scroll_offset.x), int(self.scroll_offset.x) + width, style)
