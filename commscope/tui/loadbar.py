"""The line that shows a replay still loading: bar, events read, ranks seen, time left.

A line under the header, it replaces a modal loading screen: the console paints the part
of the trace already read at once (a trace of 16k ranks takes seconds to read), and says
how far the rest is.  Hidden once the whole trace is in.
"""

from __future__ import annotations

import time

from rich.text import Text
from textual.widgets import Static

from commscope.analysis.source import Loading
from commscope.tui.fmt import count, duration

WIDTH = 24  # cells of the bar


class LoadBar(Static):
    DEFAULT_CSS = "LoadBar { height: 1; background: $panel; display: none; }"

    def __init__(self, *args, clock=time.monotonic, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.clock = clock
        self._started: float | None = None
        self.at: Loading | None = None

    def start(self) -> None:
        self._started = self.clock()
        self.at = None
        self.display = True
        self.update(self.text())

    def set(self, at: Loading) -> None:
        """How far the load is now."""
        if self._started is None:
            self._started = self.clock()
        self.at = at
        self.update(self.text())

    def done(self) -> None:
        self.display = False

    def text(self) -> Text:
        at = self.at
        t = Text(no_wrap=True, overflow="ellipsis")
        t.append(" loading ", style="bold #ffd75f")
        frac = at.fraction if at is not None else 0.0
        filled = int(frac * WIDTH)
        t.append("━" * filled, style="#ffd75f")
        t.append("━" * (WIDTH - filled), style="grey30")
        t.append(f" {frac * 100:3.0f}%", style="#ffd75f")
        if at is not None:
            t.append(f"  {count(at.events, 'event')} · {count(at.ranks, 'rank')}", style="grey70")
            elapsed = self.clock() - (self._started or self.clock())
            if 0.02 < frac < 1.0 and elapsed > 0.5:
                left = elapsed * (1 - frac) / frac
                t.append(f" · {duration(int(left * 1e9))} left", style="grey62")
        t.append("  (the timeline shows what is read; findings when all is in)", style="grey50")
        return t
