"""The time axis above the timeline: ticks at round intervals, relative to the trace start."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widget import Widget

from commscope.tui.painter import GUTTER

_MIN, _HOUR, _DAY = 60 * 10**9, 3600 * 10**9, 86400 * 10**9
#: Tick spacings (ns): 1-2-5 steps up to 1,000 s, then minutes, hours and days (a replay of
#: days: past 5,000 s a cell, every step was closer than a label, and labels cut each other
#: into wrong numbers: "+10" for +10000 s, helper-181)
_STEPS = [k * 10**e for e in range(2, 12) for k in (1, 2, 5)] + [10**12, 30 * _MIN] + \
    [h * _HOUR for h in (1, 2, 6, 12)] + [d * _DAY for d in (1, 2, 7, 30, 90, 365)]


def _tick(offset: int, step: int) -> str:
    """A tick label with just the precision the tick spacing needs: +1.5s, +250ms, +40µs,
    +190.01ms, +30min, +6h, +2d."""
    sign = "+" if offset >= 0 else "-"
    x = abs(offset)
    for unit, size in (("d", _DAY), ("h", _HOUR), ("min", _MIN)):
        if step >= 30 * _MIN and step % size == 0:
            return f"{sign}{x / size:.0f}{unit}" if x % size == 0 else f"{sign}{x / size:.1f}{unit}"
    if step >= 10**9:
        return f"{sign}{x / 1e9:.0f}s" if x % 10**9 == 0 else f"{sign}{x / 1e9:.1f}s"
    # (in the step's unit, or a larger one where the time is a thousand of it, to the step's
    # precision: zoomed in 190 ms from the start, a step of 10 µs read "+190000µs"; now
    # "+190.01ms", helper-188)
    k = 3 if step >= 10**8 else 2 if step >= 10**6 else 1 if step >= 10**3 else 0
    while k < 3 and x >= 1000 * _UNITS[k][1]:
        k += 1
    unit, size = _UNITS[k]
    places = 0
    while size > step * 10**places and places < 9:
        places += 1
    return f"{sign}{x / size:.{places}f}{unit}"


_UNITS = (("ns", 1), ("µs", 10**3), ("ms", 10**6), ("s", 10**9))


class Ruler(Widget):
    DEFAULT_CSS = "Ruler { height: 1; color: $text-muted; }"

    def __init__(self, timeline: Any, **kwargs: Any):
        super().__init__(**kwargs)
        self.timeline = timeline

    def render(self) -> Text:
        tl = self.timeline
        if not tl.ensure_placed():  # the ruler may paint before the rows: never label an unplaced view
            return Text("")
        w = max(1, self.size.width - GUTTER)
        origin = tl.own_span()[0] or tl.t0  # (the job's start: a foreign stream's may be a day before)
        head = ("follow " if tl.follow and tl.cursor_ns is None else "").ljust(GUTTER)
        text = Text(head[:GUTTER], style="bold #4f8fd6")
        text.append(axis(tl.t0, tl.npc, origin, w), style="grey62")
        return text


def axis(t0: int, npc: float, origin: int, width: int) -> str:
    """``width`` cells from ``t0``, ``npc`` ns a cell: a tick at each round step (at least 14
    cells apart), labelled by its time from ``origin``."""
    step = next((s for s in _STEPS if s >= npc * 14), _STEPS[-1])
    line = [" "] * width
    t = -(-(t0 - origin) // step) * step + origin
    free = 0  # (the first cell a label may take: one never overwrites the one before it)
    while t < t0 + width * npc:
        c = int((t - t0) // npc)
        label = "┆" + _tick(t - origin, step)
        if c >= free and c + len(label) <= width:  # (nor is cut at the edge: "+390" for +390d)
            line[c:c + len(label)] = label
            free = c + len(label) + 1
        t += step
    return "".join(line)
