"""The one-line status header: finding counts, job, world size, backend, clock, ingest rate, events
(the job's own, the foreign streams' apart)."""

from __future__ import annotations

from typing import NamedTuple

from rich.cells import cell_len, set_cell_size
from rich.text import Text
from textual.widgets import Static

from commscope.tui import palette
from commscope.tui.feed import REPLAY, FeedInfo
from commscope.tui.fmt import clock, count, duration, rate, size

#: What a part of the header is worth keeping where the line is too narrow for all of it:
#: ``ALWAYS`` (the counts, the mode and its clock or cursor, what keeps the trace from being
#: read, falling behind), then the read's losses, then the job's name (cut, not dropped),
#: then the world and backend, then the rest (rate, events) dropped first
ALWAYS, LOSSES, NAME, WORLD, REST = range(5)
#: The least of the job's name kept where it is cut (with its "…")
NAME_MIN = 12


def read_losses(info: FeedInfo) -> list[tuple[str, str]]:
    """What the read lost or doubted, as the header counts it and as ``w`` explains it:
    (the header's words, the pane's).  One list for both: ``w`` said "the reader has said
    nothing: no event ... skipped" under a header counting "5 damaged lines skipped"
    (helper-202)."""
    out: list[tuple[str, str]] = []
    if info.window:  # (attach's first window shorter than asked: the header said it, ``w`` not, helper-208)
        out.append((info.window, f"{info.window}: the first window read is shorter than the one asked for, so "
                                 "the model fits in memory; what is before it is not read"))
    if info.trimmed:  # (not "past its maxlen": the reader does not know that, a restart loses them too)
        out.append(("trimmed", "trimmed: the store no longer holds the oldest events of some ranks (a Redis "
                               "stream's maxlen, or lost: each rank's warning says which)"))
    if info.corrupt:
        said = f"{count(info.corrupt, 'damaged line')} skipped"
        out.append((said, f"{said}: not a readable event (cut short, overwritten, not JSON); the "
                          "trace_incomplete finding names their ranks"))
    if info.invalid:
        said = f"{count(info.invalid, 'invalid event')} skipped"
        out.append((said, f"{said}: events that failed the schema; the trace_incomplete finding names "
                          "their ranks"))
    if info.reused:
        said = count(info.reused, "reused op id")
        out.append((said, f"{said}: an op began under an id its rank had used (a damaged or foreign "
                          "trace); its phases are paired in stream order, as check does"))
    return out


class _Part(NamedTuple):
    text: str
    style: str
    keep: int


class StatusHeader(Static):
    """One line whatever the width: where it does not fit, the least worth keeping goes
    first (``_Part.keep``), and the job's name is cut with an ellipsis.  At 80 columns the
    line was cut at its end: a replay's state, play or pause, speed and cursor went, and a
    live clock was cut mid-value, the job's long name kept whole (helper-188)."""

    DEFAULT_CSS = "StatusHeader { height: 1; background: $panel; }"
    _parts: tuple[_Part, ...] = ()

    def show(self, info: FeedInfo, *, job: str, world: int, backend: str, errors: int, warnings: int,
             cursor_ns: int | None = None, start_ns: int = 0, playing: bool = False, speed: float = 1.0,
             problem: str | None = None, untimed: int = 0) -> None:
        """``problem``: what keeps the trace from being read (shown in red, before anything
        else can be cut); ``untimed``: ops without a measured duration."""
        error = problem or info.error
        parts: list[_Part] = []

        def add(text: str, style: str, keep: int = ALWAYS) -> None:
            parts.append(_Part(text, style, keep))

        add(" commscope ", "bold white on #4f8fd6")
        # the finding counts first: last, a long store path or an 80-column terminal cut them (helper-165)
        add(f" ✖ {errors}", "bold #e05050" if errors else "grey42")
        add(f" ▲ {warnings} ", "bold #e0a030" if warnings else "grey42")
        add(f" {job or info.source} ", "bold", NAME)
        add(f"· {count(world, 'rank')} ", "grey70", WORLD)
        add(f"· {backend} ", "grey70", REST)
        if info.mode == REPLAY:
            add("· REPLAY ", "bold #ffd75f")
            if not info.loaded:
                add(f"loading {info.progress * 100:.0f}% ", "#ffd75f")
            elif cursor_ns is not None:
                add(f"{'▶' if playing else '❚❚'} x{speed:g} +{duration(cursor_ns - start_ns)} ", "#ffd75f")
            if error:
                add(f"· {error} ", "bold #e05050")
        else:
            if error:
                add(f"· {error} ", "bold #e05050")
            elif info.waiting:
                add("· waiting for the job… ", "#e0a030")
            elif info.ended:
                add("· ENDED ", "bold grey62")
            else:
                add("· LIVE ", "bold #3fa58f")
            if info.window:  # (a first window shorter than asked: attach's, ``feed.first_window``)
                add(f"· {info.window} ", "#e0a030", LOSSES)
            if info.now_ns:
                add(f"{clock(info.now_ns)} ", "grey62")
            if start_ns and info.now_ns:
                add(f"(+{duration(info.now_ns - start_ns)}) ", "grey50")
            add(f"· {rate(info.rate)} ", "grey70", REST)
            if info.catching_up:
                add("· catching up: judged once every rank is read ", "bold #e0a030")
            elif info.behind:
                what = f"{info.lag_s:.0f} s behind" if info.lag_s >= 1 else f"{size(info.behind_bytes)} unread"
                add(f"· falling behind ({what}) ", "bold #e0a030")
        # (the job's own events; the foreign streams' apart, as ``check`` counts them)
        add(f"· {count(info.events - info.foreign_events, 'event')} ", "grey62", REST)
        if info.foreign_events:
            add(f"(+{count(info.foreign_events)} foreign) ", palette.FOREIGN_STYLE, REST)
        for said, _ in read_losses(info):  # (``w`` explains each; the window is said beside the state, above)
            if said != info.window:
                add(f"· {said} ", "#e0a030", LOSSES)
        if untimed:
            add(f"· {count(untimed, 'op')} without timings ", "grey62", REST)
        if info.warnings_total:  # (what the reader said: ``w`` shows it)
            add(f"· {count(info.warnings_total, 'read warning')} (w)", "#e0a030", LOSSES)
        self._parts = tuple(parts)
        self.refresh()

    def render(self) -> Text:
        return line(self._parts, self.size.width)


def _cut_name(kept: list[_Part], over: int, least: int) -> int:
    """Cut the job's name (in ``kept``) by ``over`` cells, to ``least`` at most, with "…";
    returns the cells still over.  By cells, not characters: a name of wide characters cut
    by characters ran the line to 114 cells at 80 (helper-189)."""
    at = next((i for i, p in enumerate(kept) if p.keep == NAME), None)
    if over <= 0 or at is None:
        return over
    name = kept[at].text.strip()
    room = max(least, cell_len(name) - over)
    if room >= cell_len(name):
        return over
    cut = set_cell_size(name, room - 1).rstrip() + "…"
    kept[at] = kept[at]._replace(text=f" {cut} ")
    return over - (cell_len(name) - cell_len(cut))


def line(parts: tuple[_Part, ...], width: int) -> Text:
    """The header's parts in ``width`` columns (0: all of them): the least worth keeping
    dropped first, the last first of those alike; then the job's name cut to fit."""
    kept = list(parts)
    over = sum(cell_len(p.text) for p in kept) - width if width > 0 else 0
    for worth in (REST, WORLD):
        for p in reversed([p for p in kept if p.keep == worth]):
            if over <= 0:
                break
            kept.remove(p)
            over -= cell_len(p.text)
    over = _cut_name(kept, over, NAME_MIN)
    for p in reversed([p for p in kept if p.keep == LOSSES]):
        if over <= 0:
            break
        kept.remove(p)
        over -= cell_len(p.text)
    _cut_name(kept, over, 2)  # (then the name to its first letter: the mode and its clock stay whole)
    t = Text(no_wrap=True, overflow="ellipsis")
    for p in kept:
        t.append(p.text, style=p.style)
    return t
