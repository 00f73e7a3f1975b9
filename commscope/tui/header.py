"""The one-line status header: finding counts, job, world size, backend, clock, ingest rate, events
(the job's own, the foreign streams' apart)."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from commscope.tui import palette
from commscope.tui.feed import REPLAY, FeedInfo
from commscope.tui.fmt import clock, duration, rate, size


class StatusHeader(Static):
    DEFAULT_CSS = "StatusHeader { height: 1; background: $panel; }"

    def show(self, info: FeedInfo, *, job: str, world: int, backend: str, errors: int, warnings: int,
             cursor_ns: int | None = None, start_ns: int = 0, playing: bool = False, speed: float = 1.0,
             problem: str | None = None, untimed: int = 0) -> None:
        """``problem``: what keeps the trace from being read (shown in red, before anything
        else can be cut); ``untimed``: ops without a measured duration."""
        error = problem or info.error
        t = Text(no_wrap=True, overflow="ellipsis")
        t.append(" commscope ", style="bold white on #4f8fd6")
        # the finding counts first: last, a long store path or an 80-column terminal cut them (helper-165)
        t.append(f" ✖ {errors}", style="bold #e05050" if errors else "grey42")
        t.append(f" ▲ {warnings} ", style="bold #e0a030" if warnings else "grey42")
        t.append(f" {job or info.source} ", style="bold")
        t.append(f"· {world} rank{'s' if world != 1 else ''} · {backend} ", style="grey70")
        if info.mode == REPLAY:
            t.append("· REPLAY ", style="bold #ffd75f")
            if not info.loaded:
                t.append(f"loading {info.progress * 100:.0f}% ", style="#ffd75f")
            elif cursor_ns is not None:
                t.append(f"{'▶' if playing else '❚❚'} x{speed:g} +{duration(cursor_ns - start_ns)} ", style="#ffd75f")
            if error:
                t.append(f"· {error} ", style="bold #e05050")
        else:
            if error:
                t.append(f"· {error} ", style="bold #e05050")
            elif info.waiting:
                t.append("· waiting for the job… ", style="#e0a030")
            elif info.ended:
                t.append("· ENDED ", style="bold grey62")
            else:
                t.append("· LIVE ", style="bold #3fa58f")
            if info.window:  # (a first window shorter than asked: attach's, ``feed.first_window``)
                t.append(f"· {info.window} ", style="#e0a030")
            if info.now_ns:
                t.append(f"{clock(info.now_ns)} ", style="grey62")
            if start_ns and info.now_ns:
                t.append(f"(+{duration(info.now_ns - start_ns)}) ", style="grey50")
            t.append(f"· {rate(info.rate)} ", style="grey70")
            if info.catching_up:
                t.append("· catching up: judged once every rank is read ", style="bold #e0a030")
            elif info.behind:
                what = f"{info.lag_s:.0f} s behind" if info.lag_s >= 1 else f"{size(info.behind_bytes)} unread"
                t.append(f"· falling behind ({what}) ", style="bold #e0a030")
        # (the job's own events; the foreign streams' apart, as ``check`` counts them)
        t.append(f"· {info.events - info.foreign_events:,} events ", style="grey62")
        if info.foreign_events:
            t.append(f"(+{info.foreign_events:,} foreign) ", style=palette.FOREIGN_STYLE)
        if info.trimmed:
            t.append("· trimmed ", style="#e0a030")
        if info.corrupt:
            t.append(f"· {info.corrupt} damaged lines skipped ", style="#e0a030")
        if info.invalid:
            t.append(f"· {info.invalid} invalid events skipped ", style="#e0a030")
        if info.reused:
            t.append(f"· {info.reused} reused op ids ", style="#e0a030")
        if untimed:
            t.append(f"· {untimed:,} ops without timings ", style="grey62")
        if info.warnings_total:  # (what the reader said: ``w`` shows it)
            t.append(f"· {info.warnings_total:,} read warning{'s' if info.warnings_total != 1 else ''} (w)",
                     style="#e0a030")
        self.update(t)
