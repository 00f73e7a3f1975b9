"""Live console on a running job: per-rank timelines, GPU use, findings as they appear.

    commscope attach                      # $COMMSCOPE_STORE, then ./commscope-trace
    commscope attach runs/trace
    commscope attach redis://host:6379/0

It opens before the job has written anything and waits for it, keeps up while the job
runs, and shows when the job has ended or a rank went silent.  Press ? for keys.
"""

from __future__ import annotations

import argparse
import os

from commscope.commands import options
from commscope.store import StoreError, backend_for, default_store, redact_store

#: Where attach starts by default: the tail of a job, however long it has run (the history
#: before it is summarized, not read: --since all reads it)
TAIL = "10m"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("store", nargs="?", help="trace store: directory or redis:// URL")
    p.add_argument("--hang-after", type=float, metavar="SECONDS",
                   help="flag ops in flight longer than this (default: what the job was recorded with, else 30)")
    p.add_argument("--no-bell", action="store_true", help="do not ring the terminal bell on new errors")
    options.add_since(p, default=TAIL)


def waiting_hint(store: str) -> str:
    """What to say while no job has written to ``store``: a directory that does not exist
    is most likely a typo, or a job not started yet."""
    if not backend_for(store).local or os.path.exists(store):
        return ""
    return f"{store} does not exist yet: start a job with  commscope run --store {store} -- …  (q quits)"


def main(args: argparse.Namespace) -> int:
    from commscope.analysis.source import open_source
    from commscope.errors import UsageError
    from commscope.tui.app import CommscopeApp
    from commscope.tui.feed import LIVE, Feed

    store = default_store(args.store)
    since = options.since_of(args)
    try:
        reader = open_source(store, wait=True, since=since)
    except StoreError as exc:
        raise UsageError(str(exc)) from None
    feed = Feed(reader, mode=LIVE, hang_after=args.hang_after, source=redact_store(store), hint=waiting_hint(store),
                reopen=lambda window: open_source(store, wait=True, since=window))
    CommscopeApp(feed, bell=not args.no_bell).run()
    return 0
