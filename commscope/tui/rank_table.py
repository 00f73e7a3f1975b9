"""The rank table: state, last op and resources per rank; sortable by any column."""

from __future__ import annotations

import math
from typing import Any

from rich.text import Text
from textual.widgets import DataTable

from commscope.analysis.model import RankState, TraceModel
from commscope.analysis.rankstate import ending, last_op_before, rank_state, sample_at
from commscope.tui import palette
from commscope.tui.feed import REPLAY
from commscope.tui.fmt import compact_size, duration, percent
from commscope.tui.timeline import PIN_MIN_RANKS, SUMMARY_MIN_RANKS, behaviour_groups

COLUMNS = [("rank", "Rank", 4), ("host", "Host", 10), ("state", "State", 30), ("last", "Last op", 16),
           ("gpu", "GPU%", 4), ("gmem", "GPU mem", 8), ("cpu", "CPU%", 4), ("rss", "RSS", 8)]
FLEX = "state"  # takes whatever width the others leave
#: The sort that is no column: the rarest behaviour first (``timeline.behaviour_groups``), what a
#: job of more than SUMMARY_MIN_RANKS ranks opens with: how far a rank is from the rest
UNUSUAL = "unusual"
LABELS = {k: label for k, label, _ in COLUMNS} | {UNUSUAL: "how unusual (the rarest behaviour first)"}
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
_REASONS = {"destroy_process_group": "destroy_pg"}


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


def compact_state(m: TraceModel, r: int, st: RankState, now: int) -> str:
    if st.kind == "blocked" and st.op is not None:
        verb = "waiting" if st.text.startswith("waiting") else "in"
        return f"{verb} {short_label(m, r, st.op)} · {duration(now - st.since_ns)}"
    if st.kind == "idle":
        return f"idle · {duration(now - st.since_ns)}" if st.op is not None else "idle"
    if st.kind == "dead":
        words = ending(m, r, now, st) or "dead (silent)"
        if words == "dead (silent)":
            return f"dead · silent {duration(now - st.since_ns)}"
        how, _, why = words.partition(" (")  # 'job stopped (SIGTERM)' -> 'stopped · SIGTERM'
        return f"{how.removeprefix('job ')} · {why[:-1]}" if why else how
    if st.kind == "exited":
        for long, short in _REASONS.items():
            if f"({long})" in st.text:
                return st.text.replace(long, short)
        return st.text
    return st.text


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


class RankTable(DataTable):
    """One row per rank.  Click a column header (or press s) to sort by it; s also offers
    "how unusual" (the rarest behaviour first), which a large job opens with."""

    BINDINGS = [("s", "cycle_sort", "Sort")]

    def __init__(self, feed: Any, **kwargs: Any):
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self.feed = feed
        self._rows: set[int] = set()
        self._sort_col = "rank"
        self._sort_chosen = False  # the user sorted: the job's size no longer picks the sort
        #: ranks named in findings: first, whatever the sort, in a job of more than PIN_MIN_RANKS
        self.flagged: set[int] = set()
        self._sort_reverse = False
        self._values: dict[int, dict[str, Any]] = {}
        self._cols: list[tuple[str, str, int]] = []
        self._last_width = 16  # the last-op column: as wide as its longest label

    def reset(self) -> None:
        self.clear(columns=True)
        self._rows.clear()
        self._values.clear()
        self._cols = []

    def _wanted(self) -> list[tuple[str, str, int]]:
        """Host only when ranks span hosts; GPU columns only when some rank sampled a GPU."""
        m = self.feed.model
        hosts = {str((rt.meta or {}).get("host", "")) for rt in m.ranks.values()}
        gpu = any((m.latest_sample(r) or {}).get("gpu_util") is not None for r in m.rank_ids())
        cols = [c if c[0] != "last" else (c[0], c[1], self._last_width) for c in COLUMNS
                if (c[0] != "host" or len(hosts) > 1) and (c[0] not in ("gpu", "gmem") or gpu)]
        # Narrow panes keep the most telling columns; the state text names the op anyway.
        budget = self._room() - (STATE_MIN + 2) - (COLUMNS[0][2] + 2) if self.size.width else 10**6
        keep = {FLEX, "rank"}  # the rank number and its state always show
        for key in PRIORITY[1:]:
            col = next((c for c in cols if c[0] == key), None)
            if col is not None and col[2] + 2 <= budget:
                keep.add(key)
                budget -= col[2] + 2
        return [c for c in cols if c[0] in keep]

    def _room(self) -> int:
        """Columns of text the table can show without scrolling sideways."""
        bar = self.scrollbar_size_vertical if self.show_vertical_scrollbar else 0
        return self.size.width - bar - 1  # the vertical scrollbar when shown, and a margin

    def _layout(self, cols: list[tuple[str, str, int]]) -> None:
        if [c[0] for c in cols] != [str(k.value) for k in self.columns] or not self._cols:
            self.clear(columns=True)
            self._rows.clear()
            self._values.clear()
            for key, label, width in cols:
                self.add_column(label, key=key, width=width)
        self._cols = cols
        self.call_after_refresh(self.on_resize)

    def on_resize(self) -> None:
        cols = getattr(self, "_cols", None)
        if not cols:
            return
        with self.feed.lock:  # (a replay's loader ingests while the table shows what is in)
            wanted = self._wanted()
        if [c[0] for c in wanted] != [c[0] for c in cols]:
            self._layout(wanted)
            self.refresh_ranks(getattr(self.app, "_now", lambda: 0)())
            return
        fixed = sum(w + 2 for k, _, w in cols if k != FLEX)
        col = self.columns.get(FLEX)  # type: ignore[call-overload]
        if col is not None:
            width = max(8, self._room() - fixed - 2)  # below STATE_MIN only when no other column is left
            changed = col.width != width
            col.width = width
            col.auto_width = False
            if changed and self._values:  # re-fit the state cells to the new width (cut between words)
                self.refresh_ranks(getattr(self.app, "_now", lambda: 0)())
            self.refresh()

    def _fit_last(self, rows: dict[int, dict[str, tuple[Any, Any]]]) -> None:
        """The last-op column as wide as its longest label (within LAST_MIN..LAST_MAX)."""
        col = self.columns.get("last")  # type: ignore[call-overload]
        if col is None:
            return
        want = self._last_width
        if col.width != want:
            col.width = want
            col.auto_width = False
            self.call_after_refresh(self.on_resize)

    def refresh_ranks(self, now: int) -> None:
        m = self.feed.model
        with self.feed.lock:
            rows = {r: self._row_values(r, now) for r in m.rank_ids()}
            want = max([LAST_MIN, *(len(_plain(v["last"][1])) for v in rows.values())])
            self._last_width = min(want, LAST_MAX)
            self._layout(self._wanted())
        self._fit_last(rows)
        state_col = self.columns.get(FLEX)  # type: ignore[call-overload]
        room = state_col.width if state_col is not None and state_col.width else None
        last_col = self.columns.get("last")  # type: ignore[call-overload]
        for vals in rows.values():
            if room is not None:
                key, cell = vals["state"]
                if len(cell.plain) > room:
                    vals["state"] = (key, Text(fit_words(cell.plain, room), style=cell.style))
            if last_col is not None and len(_plain(vals["last"][1])) > last_col.width:
                vals["last"] = (vals["last"][0], fit_words(_plain(vals["last"][1]), last_col.width))
        for r, vals in rows.items():
            if r not in self._rows:
                self.add_row(*[vals[k][1] for k, _, _ in self._cols], key=str(r))
                self._rows.add(r)
            else:
                old = self._values.get(r, {})
                for k, _, _ in self._cols:
                    was = old.get(k)
                    if was is None or was[0] != vals[k][0] or _plain(was[1]) != _plain(vals[k][1]):
                        self.update_cell(str(r), k, vals[k][1])
            self._values[r] = vals
        self._apply_sort()

    def _row_values(self, r: int, now: int) -> dict[str, tuple[Any, Any]]:
        """column -> (sort key, cell renderable)."""
        m = self.feed.model
        replay = self.feed.mode == REPLAY  # as of the replay cursor, not the end of the trace
        st = rank_state(m, r, now, as_of=replay)
        s = sample_at(m, r, now) if replay else m.latest_sample(r) or {}
        # the op it is in, else the last one it began (also for ranks that exited or died)
        last = st.op if st.op is not None else last_op_before(m, r, now)
        meta = m.ranks[r].meta or {}
        gutil, gmem, cpu, rss = s.get("gpu_util"), s.get("gpu_mem"), s.get("cpu"), s.get("rss")
        order = {"dead": 0, "crashed": 0, "blocked": 1, "running": 2, "idle": 3, "exited": 4, "unknown": 5}
        return {
            "rank": (r, Text(str(r), style="bold")),
            "host": (str(meta.get("host", "")), str(meta.get("host", ""))),
            "state": ((order.get(st.kind, 9), -(now - st.since_ns)),
                      Text(f"{palette.STATE_DOT[st.kind]} {compact_state(m, r, st, now)}", style=palette.STATE_STYLE[st.kind])),
            "last": (m.label(r, last) if last is not None else "", short_label(m, r, last) if last is not None else "–"),
            "gpu": (gutil if gutil is not None else -1, percent(gutil)),
            "gmem": (gmem if gmem is not None else -1, compact_size(gmem)),
            "cpu": (cpu if cpu is not None else -1, percent(cpu)),
            "rss": (rss if rss is not None else -1, compact_size(rss)),
        }

    def _apply_sort(self) -> None:
        col, vals = self._sort_col, self._values
        if not self._sort_chosen and col == "rank" and len(vals) > SUMMARY_MIN_RANKS:
            col = self._sort_col = UNUSUAL
        if col == UNUSUAL:
            order = [r for _, rs in behaviour_groups(self.feed.view, sorted(vals)) for r in rs]
            order = order[::-1] if self._sort_reverse else order
        else:
            order = sorted(vals, key=lambda r: (sort_key(vals[r][col][0]), r), reverse=self._sort_reverse)
        if len(order) > PIN_MIN_RANKS and self.flagged:  # among thousands, the culprit on top
            order = [r for r in order if r in self.flagged] + [r for r in order if r not in self.flagged]
        if [int(row.key.value) for row in self.ordered_rows] != order:
            pos = {r: i for i, r in enumerate(order)}
            self.sort("rank", key=lambda cell: pos.get(int(cell.plain), 0))

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        self._sort_chosen = True
        key = event.column_key.value
        if key == self._sort_col:
            self._sort_reverse = not self._sort_reverse
        else:
            self._sort_col, self._sort_reverse = key, False
        self._apply_sort()

    def action_cycle_sort(self) -> None:
        self._sort_chosen = True
        keys = [k for k, _, _ in getattr(self, "_cols", COLUMNS)] + [UNUSUAL]
        self._sort_col = keys[(keys.index(self._sort_col) + 1) % len(keys)] if self._sort_col in keys else "rank"
        self._sort_reverse = False
        self.notify(f"ranks sorted by {LABELS[self._sort_col]}", timeout=2)
        self._apply_sort()
