"""Export a trace (store or Flight Recorder dumps) as Chrome/Perfetto trace JSON.

Open the file in https://ui.perfetto.dev or chrome://tracing: one process per rank,
one track per group plus one for p2p, op spans with their args, findings as instant
events, GPU/CPU counters.
"""

from __future__ import annotations

import argparse
import contextlib
import os

from commscope.analysis.chrome import write_chrome
from commscope.analysis.diagnose import default_hang_after, diagnose, trace_now


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("store", nargs="?", default=None,
                   help="trace store (directory or redis://...) or Flight Recorder dump directory")
    p.add_argument("--chrome", metavar="FILE", required=True, help="write Chrome trace JSON here ('-' = stdout); a new file is readable by you alone")
    p.add_argument("--hang-after", type=float, default=None, metavar="SECONDS",
                   help="for the findings marked in the trace")
    from commscope.commands import options

    options.add_since(p)


def main(args: argparse.Namespace) -> int:
    import sys
    import time

    from commscope.commands import options, progress
    from commscope.commands.check import read_summary
    from commscope.errors import UsageError

    model, reader, warnings = progress.load(args.store, progress.wanted(args.chrome == "-" and sys.stdout.isatty()),
                                            since=options.since_of(args))
    now = trace_now(model)
    hang = args.hang_after if args.hang_after is not None else default_hang_after(model)
    findings = diagnose(model, now, hang, wall_ns=time.time_ns())
    skipped = {"skipped": read_summary(reader.stats)}
    if args.chrome == "-":
        sys.stdout.flush()
        write_chrome(sys.stdout.buffer, model, findings, now, skipped)
        sys.stdout.buffer.write(b"\n")
        sys.stdout.buffer.flush()
        return 0
    try:
        # a new file is the owner's alone, as the store it came from (one that exists keeps its mode)
        created = not os.path.lexists(args.chrome)
        fd = os.open(args.chrome, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    except OSError as exc:
        raise UsageError(f"cannot write {args.chrome}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as f:  # (written as the events come: memory a rank's, not the trace's)
            n = write_chrome(f, model, findings, now, skipped)
    except OSError as exc:  # (a full disk: no half-written trace of ours is left to mislead a viewer)
        if created:
            with contextlib.suppress(OSError):
                os.unlink(args.chrome)
        raise UsageError(f"cannot write {args.chrome}: {exc.strerror or exc}") from None
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    print(f"wrote {args.chrome}: {n:,} trace events, {len(model.ranks)} ranks, "
          f"{len(findings)} finding(s)", file=sys.stderr)
    return 0
