"""The time axis above the timeline: ticks at round intervals, relative to the trace start."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widget import Widget

from commscope.tui.painter import GUTTER

_STEPS = [k * 10**e for e in range(2, 13) for k in (1, 2, 5)]


def _tick(offset: int, step: int) -> str:
    """A tick label with just the precision the tick spacing needs: +1.5s, +250ms, +40µs."""
    sign = "+" if offset >= 0 else "-"
    x = abs(offset)
    if step >= 10**9:
        return f"{sign}{x / 1e9:.0f}s" if x % 10**9 == 0 else f"{sign}{x / 1e9:.1f}s"
    if step >= 10**8:
        return f"{sign}{x / 1e9:.1f}s"
    if step >= 10**6:
        return f"{sign}{x / 1e6:.0f}ms"
    if step >= 10**3:
        return f"{sign}{x / 1e3:.0f}µs"
    return f"{sign}{x}ns"


class Ruler(Widget):
    DEFAULT_CSS = "Ruler { height: 1; color: $text-muted; }"

    def __init__(self, timeline: Any, **kwargs: Any):
        super().__init__(**kwargs)
        self.timeline = timeline

    def render(self) -> Text:
        tl = self.timeline
        if not tl.ensure_placed():  # the ruler may paint before the rows: never label an unplaced view
            return Text("")
        width = self.size.width
        w = max(1, width - GUTTER)
        origin = tl.own_span()[0] or tl.t0  # (the job's start: a foreign stream's may be a day before)
        step = next((s for s in _STEPS if s >= tl.npc * 14), _STEPS[-1])
        line = [" "] * w
        first = -(-(tl.t0 - origin) // step) * step + origin
        t = first
        while t < tl.t0 + w * tl.npc:
            c = int((t - tl.t0) // tl.npc)
            label = "┆" + _tick(t - origin, step)
            for k, ch in enumerate(label):
                if 0 <= c + k < w:
                    line[c + k] = ch
            t += step
        head = ("follow " if tl.follow and tl.cursor_ns is None else "").ljust(GUTTER)
        text = Text(head[:GUTTER], style="bold #4f8fd6")
        text.append("".join(line), style="grey62")
        return text
