"""The progress of a long read on a terminal: what ``check``, ``report`` and ``export``
show while a large trace loads and is diagnosed.

Shown on standard error, and only when it is a terminal and the output is not ``--json``:
a CI log or a pipe gets the report alone.  The bar counts bytes read of the store's size
(or events, where the store cannot say), with the events ingested, the ranks seen and an
estimate of the time left; it disappears when the report starts.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator

from commscope.analysis.model import TraceModel
from commscope.analysis.source import Loading, load_trace
from commscope.store import TraceReader
from commscope.window import Since


def wanted(json_output: bool = False) -> bool:
    """Whether to show progress: on a terminal, not for --json, not when asked not to
    (``COMMSCOPE_NO_PROGRESS``, and ``TERM=dumb``)."""
    if json_output or os.environ.get("COMMSCOPE_NO_PROGRESS") or os.environ.get("TERM") == "dumb":
        return False
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


@contextlib.contextmanager
def bar(description: str, enabled: bool) -> Iterator[Callable[[Loading], None] | None]:
    """A transient progress bar on standard error, updated by the ``Loading`` it is given;
    None (and nothing shown) when not ``enabled``."""
    if not enabled:
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    console = Console(stderr=True)
    columns = (TextColumn("{task.description}", markup=False), BarColumn(bar_width=24),
               TextColumn("{task.percentage:>3.0f}%"), TextColumn("{task.fields[what]}"), TimeRemainingColumn())
    # (drawn as the read goes, up to 8 times a second, not by a thread of rich's: a process
    # running no other thread forks its read workers, ``bulkread.start_method``)
    with Progress(*columns, console=console, transient=True, auto_refresh=False) as progress:
        task = progress.add_task(description, total=None, what="")
        progress.refresh()
        drawn = time.monotonic()

        def update(at: Loading) -> None:
            nonlocal drawn
            what = f"{at.events:,} events, {at.ranks:,} ranks"
            progress.update(task, completed=at.read, total=at.total or None, what=what)
            if time.monotonic() - drawn >= 0.125:
                progress.refresh()
                drawn = time.monotonic()

        yield update


@contextlib.contextmanager
def status(text: str, enabled: bool) -> Iterator[None]:
    """A transient line on standard error while a step without a measure runs.  Drawn once,
    not a spinner turned by a thread of rich's: a read under it (``check``'s earlier
    attempts of a restarted job) forks its workers only where no other thread runs."""
    if not enabled:
        yield
        return
    from rich.console import Console
    from rich.live import Live
    from rich.text import Text

    with Live(Text(f"{text} ..."), console=Console(stderr=True), transient=True, auto_refresh=False) as live:
        live.refresh()
        yield


def load(store: str | os.PathLike | None, shown: bool, since: Since | None = None,
         max_memory: int | None = None) -> tuple[TraceModel, TraceReader, list[str]]:
    """``analysis.source.load_trace`` (of the window ``since``) with a progress bar when
    ``shown``, for commands that load once and exit (check, report, export): the model lives
    as long as the process, so the load freezes it out of the collector's sight.
    ``max_memory``: the most its model may hold (``options.max_memory_of``; None: any)."""
    from commscope.store import redact_store

    with bar(f"reading {redact_store(str(store or 'trace'))[-40:]}", shown) as update:
        return load_trace(store, progress=update, since=since, freeze=True, max_model=max_memory)
