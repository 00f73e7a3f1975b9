"""Console on a finished trace, or on a directory of PyTorch Flight Recorder dumps.

    commscope replay runs/trace
    commscope replay /tmp/fr-dumps/

A time cursor walks through the job: space plays/pauses, ] and [ change speed, n and p
step to the next/previous op, g/G jump to start/end.  Press ? for every key.
"""

from __future__ import annotations

import argparse

from commscope.commands import options
from commscope.store import StoreError, redact_store


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("store", help="trace store (directory or redis:// URL) or a Flight Recorder dump directory")
    p.add_argument("--hang-after", type=options.seconds, metavar="SECONDS",
                   help="flag ops in flight longer than this (default: as recorded, else 30)")
    options.add_since(p)


def main(args: argparse.Namespace) -> int:
    from commscope.analysis.source import open_source
    from commscope.errors import UsageError
    from commscope.tui.app import CommscopeApp
    from commscope.tui.feed import REPLAY, Feed

    since = options.since_of(args)
    try:
        reader = open_source(args.store, since=since)
    except StoreError as exc:
        raise UsageError(str(exc)) from None
    feed = Feed(reader, mode=REPLAY, hang_after=args.hang_after, source=redact_store(args.store))
    CommscopeApp(feed, bell=False).run()
    return 0
