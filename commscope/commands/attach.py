"""Live console on a running job: per-rank timelines, GPU use, findings as they appear.

    commscope attach                      # $COMMSCOPE_STORE, then ./commscope-trace
    commscope attach runs/trace
    commscope attach redis://host:6379/0
    commscope attach --pid 4242           # a job never started with commscope

It opens before the job has written anything and waits for it, keeps up while the job
runs, and shows when the job has ended or a rank went silent.  Press ? for keys.

It starts at the job's last ten minutes (--since); where those would not fit the console's
memory (1 GiB of model: ten minutes of ~1,000 ranks at full speed do not), it reads a shorter
stretch and says so in its header.

With --pid it follows a job that was never instrumented: repeated snapshots of its
ranks' stacks (``commscope snapshot``: py-spy, --interval seconds apart, two samples a
cycle) written to STORE (default: a new temporary directory, removed on exit).
"""

from __future__ import annotations

import argparse
import os
import shutil

from commscope.commands import options
from commscope.store import StoreError, backend_for, default_store, redact_store
from commscope.store.readahead import MOST_PROCESSES

#: Where attach starts by default: the tail of a job, however long it has run (the history
#: before it is summarized, not read: --since all reads it)
TAIL = "10m"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("store", nargs="?", help="trace store: directory or redis:// URL")
    p.add_argument("--hang-after", type=options.seconds, metavar="SECONDS",
                   help="flag ops in flight longer than this (default: what the job was recorded with, else 30)")
    p.add_argument("--no-bell", action="store_true", help="do not ring the terminal bell on new errors")
    options.add_since(p, default=TAIL)
    p.add_argument("--pid", type=int, nargs="+", metavar="PID",
                   help="follow an uninstrumented job through repeated snapshots of its ranks' stacks (any pid of "
                        "it: a rank or its launcher)")
    p.add_argument("--read-processes", type=int, metavar="N",
                   help="processes reading the store, each a part of the ranks (default: one per 4,096 ranks of "
                        "the job, at most 4 and one less than the cores; 0: read in the console's process)")
    p.add_argument("--job-pid", type=int, metavar="PID", help="with --pid and several jobs: the one this pid is of, or started "
                   "(commscope run, a script)")
    p.add_argument("--interval", type=options.seconds, default=1.0, metavar="S",
                   help="with --pid: seconds between stack samples (default 1)")


def waiting_hint(store: str) -> str:
    """What to say while no job has written to ``store``: a directory that does not exist
    is most likely a typo, or a job not started yet; so is a job a server's URL names
    (``?job=``) where the server holds others (helper-163: attach waited, saying nothing)."""
    row = backend_for(store)
    if not row.local:
        pinned = row.pinned_job(store)
        held = row.jobs(row.unpinned(store)) if pinned and row.jobs is not None else None
        if not held or pinned in held:
            return ""
        shown = redact_store(row.unpinned(store))
        return (f"no job {pinned!r} in {shown} yet, which holds {len(held):,} other job(s): a typo?  "
                f"commscope attach {shown} follows the newest  (q quits)")
    if os.path.exists(store):
        return ""
    shown = redact_store(store)
    return f"{shown} does not exist yet: start a job with  commscope run --store {shown} -- …  (q quits)"


def main(args: argparse.Namespace) -> int:
    from commscope.analysis.source import open_source
    from commscope.errors import UsageError
    from commscope.tui.app import CommscopeApp
    from commscope.tui.feed import LIVE, Feed, first_window, read_ahead

    processes = args.read_processes
    if processes is not None and not 0 <= processes <= MOST_PROCESSES:  # (before any snapshot is started)
        raise UsageError(f"--read-processes: {processes} is not between 0 and {MOST_PROCESSES}")
    snapshots = None
    if args.pid:
        snapshots, store, temporary = _start_snapshots(args)
    else:
        store, temporary = default_store(args.store), None
    since = options.since_of(args)
    try:
        try:
            # (a window whose model would not fit the budget: a shorter one, not read and then
            # started again at the tail)
            reader, since, why = first_window(lambda window: open_source(store, wait=True, since=window), since,
                                              Feed.MODEL_BUDGET)
        except StoreError as exc:
            raise UsageError(str(exc)) from None
        # (its polls made ahead in a process of their own, where that is worth it: the console's
        # process ingests, publishes and diagnoses meanwhile)
        feed = Feed(read_ahead(reader, store, since, processes), mode=LIVE, hang_after=args.hang_after,
                    source=redact_store(store),
                    hint=waiting_hint(store) if snapshots is None else "taking the first snapshot of the job's stacks",
                    reopen=lambda window: read_ahead(open_source(store, wait=True, since=window), store, window,
                                                     processes))
        feed.window = f"{why} (memory)" if why else ""  # (the header's: what would not fit the console's budget)
        try:
            CommscopeApp(feed, bell=not args.no_bell).run()
        finally:
            feed.reader.close()
    finally:
        if snapshots is not None:
            snapshots.stop()
            if snapshots.error:
                print(f"commscope attach: {snapshots.error}")
        if temporary is not None:
            shutil.rmtree(temporary, ignore_errors=True)
    return 0


def _start_snapshots(args: argparse.Namespace):
    """Find the job (as ``commscope snapshot`` does) and start snapshotting it into the store."""
    import tempfile

    from commscope.commands.snapshot import choose, default_id
    from commscope.errors import UsageError
    from commscope.snapshot import procs, pyspy
    from commscope.snapshot.take import Repeating, Snapshotter

    if pyspy.executable() is None:
        raise UsageError(pyspy.INSTALL)
    if args.interval <= 0:
        raise UsageError("--interval must be > 0")
    found = procs.find(args.pid)
    job = choose(found, args.job_pid)
    temporary = None if args.store else tempfile.mkdtemp(prefix="commscope-attach-")
    store = default_store(args.store or temporary)
    # (no Flight Recorder: its ops carry their own sequence numbers, which later cycles cannot end or match)
    snap = Snapshotter(job, store, default_id(job) + "-live", count=2, interval=args.interval, use_flight=False,
                       host=found.host)
    return Repeating(snap).start(), store, temporary
