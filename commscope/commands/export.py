"""Export a trace (store or Flight Recorder dumps) as Chrome/Perfetto trace JSON.

Open the file in https://ui.perfetto.dev or chrome://tracing: one process per rank,
one track per group plus one for p2p, op spans with their args, findings as instant
events, GPU/CPU counters.  Streams in the store that are not of the job's run (another
job's rank file copied in, another launch's, a rank past the world size: the ones
``check`` names foreign) are no process of the job's: left out, their count said, unless
``--ranks`` asks for them, then written as processes of their own marked foreign, after
the job's ranks; the time range is the job's own.

    commscope export runs/trace --chrome trace.json
    commscope export runs/trace --chrome trace.json --ranks culprits,0-7

A viewer holds the whole file in memory, ~350 bytes a trace event (660 MB for 4,096 ranks
of 400 ops): a job of thousands of ranks is exported more usefully in part, ``--ranks`` the
culprits the findings name and a few ranks to compare them with.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import stat
import tempfile
from collections.abc import Callable
from typing import IO

from commscope.analysis.chrome import write_chrome
from commscope.analysis.diagnose import default_hang_after, judged
from commscope.analysis.model import TraceModel
from commscope.analysis.ranks import ranges
from commscope.commands import options


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("store", nargs="?", default=None,
                   help="trace store (directory or redis://...) or Flight Recorder dump directory")
    p.add_argument("--chrome", metavar="FILE", required=True,
                   help="write Chrome trace JSON here ('-' = stdout), readable by you alone (0600, also "
                        "where it replaces a file); a symbolic link, FIFO or device there is refused")
    p.add_argument("--hang-after", type=options.seconds, default=None, metavar="SECONDS",
                   help="for the findings marked in the trace")
    p.add_argument("--ranks", type=options.ranks, default=None, metavar="RANKS",
                   help="export only these ranks: ranks and ranges, comma-separated (0-7,2049), and "
                        "'culprits' for the ranks the findings blame (default: every rank of the job; "
                        "streams not of the job's run, which check names foreign, only when asked for, "
                        "marked foreign)")
    options.add_since(p)
    options.add_max_memory(p)


def main(args: argparse.Namespace) -> int:
    import sys

    from commscope.commands import progress
    from commscope.commands.check import read_summary
    from commscope.errors import UsageError

    model, reader, warnings = progress.load(args.store, progress.wanted(args.chrome == "-" and sys.stdout.isatty()),
                                            since=options.since_of(args), max_memory=options.max_memory_of(args))
    hang = args.hang_after if args.hang_after is not None else default_hang_after(model)
    now, findings = judged(model, hang)
    skipped = {"skipped": read_summary(reader.stats)}
    ranks = None
    if args.ranks is not None:
        ranks = args.ranks.of(r for f in findings for r in f.culprits) & set(model.ranks)
        if not ranks:
            raise UsageError(f"none of the ranks asked for is in the trace (it has {len(model.ranks):,}: "
                             f"{ranges(sorted(model.ranks), limit=6) or 'none'})"
                             + ("; no finding blames a rank" if args.ranks.culprits else ""))
    if args.chrome == "-":
        sys.stdout.flush()
        out = getattr(sys.stdout, "buffer", None) or _Text(sys.stdout)
        write_chrome(out, model, findings, now, skipped, ranks)
        out.write(b"\n")
        sys.stdout.flush()
        return 0
    try:
        n = _write_file(args.chrome, lambda f: write_chrome(f, model, findings, now, skipped, ranks))
    except OSError as exc:
        raise UsageError(f"cannot write {args.chrome}: {exc.strerror or exc}") from None
    for w in warnings:
        print(options.warning(w).plain, file=sys.stderr)
    print(f"wrote {args.chrome}: {n:,} trace events, {_ranks_written(model, ranks)}, {len(findings)} finding(s)",
          file=sys.stderr)
    return 0


def _ranks_written(model: TraceModel, ranks: set[int] | None) -> str:
    """The ranks written, the job's own (of how many where ``--ranks`` chose) and the foreign
    streams (``TraceModel.kept_apart``) apart: left out unless asked for, then marked."""
    apart = model.kept_apart
    own = len(model.ranks) - len(apart)
    if ranks is None:
        return f"{own:,} ranks" + (f" (+{len(apart):,} foreign stream(s) kept apart, not written: "
                                   f"--ranks {ranges(sorted(apart), limit=4)} writes them, marked)" if apart else "")
    asked = len(ranks & apart)
    return f"{len(ranks) - asked:,} ranks of {own:,}" + (f" (+{asked:,} foreign stream(s), marked)" if asked else "")


class _Text:
    """Bytes written to a text stream (a caller that put a ``StringIO`` in ``sys.stdout``)."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream

    def write(self, data: bytes, /) -> int:
        return self.stream.write(data.decode())


def _write_file(path: str, write: Callable[[IO[bytes]], int]) -> int:
    """``write`` into ``path`` whole or not at all: a trace written as its events come (memory a
    rank's, not the trace's) goes to a file beside it, put in place once complete, so a full
    disk, an interrupt or a failure leaves no half-written trace and the file that was there
    as it was.  The file written is the owner's alone (0600), as the store it came from, even
    where it replaces one of another mode: share it as the store is shared, on purpose.  A
    symbolic link, a FIFO or a device at ``path`` is refused (``OSError``), never followed or
    written into: the trace would land where the link's maker chose, with their file's mode
    (``--chrome -`` writes to stdout, for a pipe)."""
    try:
        st: os.stat_result | None = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None and stat.S_ISLNK(st.st_mode):
        raise OSError(errno.ELOOP, "it is a symbolic link, which is not followed (name the file itself, "
                                   "or use --chrome - to write to stdout)")
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise OSError(errno.EINVAL, "not a regular file (use --chrome - to write to stdout, a pipe)")
    folder, name = os.path.split(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".part", dir=folder or ".")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o600)
            n = write(f)
        os.replace(tmp, path)  # (a link put at ``path`` meanwhile is replaced, not followed)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return n
