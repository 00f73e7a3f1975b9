"""Copy a trace between stores: a Redis job to a directory for archiving or sharing, or a
directory trace (or Flight Recorder dumps) into Redis.

    commscope copy redis://host:6379/0 ./archive           newest Redis job -> ./archive/JOB/
    commscope copy 'redis://host:6379/0?job=J' ./archive   a named job
    commscope copy ./commscope-trace redis://host:6379/0   newest directory job -> Redis

Events keep their per-rank order and content, with any credential in their text redacted
(as every reader does, so an older trace is cleaned on the way); the job keeps its id
(--job renames it).  A directory copy is yours alone unless its source job was readable by
your group, or --share-with-group is given.
The destination refuses to mix with a job of the same id that is already there.  Damaged
events in the source are skipped, and every line the source lost (trimmed, deleted, cut,
damaged) is counted in the copy too.  A directory copy keeps every segment (no retention).
The trace is read in pages, so a large one never sits in memory whole.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from commscope import events
from commscope.commands import options
from commscope.events import Event
from commscope.redact import redact
from commscope.store import (
    Size,
    StoreError,
    StoreWriter,
    TraceReader,
    backend_for,
    default_store,
    open_writer,
    refuse_url_like,
)
from commscope.store.base import STORE_LOST, is_job_name, said_by_store, store_lost
from commscope.store.redis_store import RedisReader, RedisWriter

#: Lines a write holds at most: a Redis destination takes its marks between writes
#: (``store/redis_marks.py``), so a window of the copy starts near its start
WRITE_LINES = 2048
PAGE_BYTES = 16 << 20
PROGRESS_MIN = 50_000  # events (or ~their bytes): smaller copies finish before a bar helps


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("src", help="source: trace directory, redis://... URL, or Flight Recorder dump directory")
    p.add_argument("dst", help="destination: directory (the job goes to DST/JOB/) or redis://... URL")
    p.add_argument("--job", metavar="NAME", default=None,
                   help="job id in the destination (default: the source's job id)")
    p.add_argument("--share-with-group", action="store_true",
                   help="make the copy (a directory store) readable by your group; without it the copy keeps "
                        "the source's modes (a Redis source: private to you)")
    p.add_argument("--progress", choices=("auto", "always", "never"), default="auto",
                   help="progress bar on stderr (auto: large traces on a terminal)")
    p.add_argument("-q", "--quiet", action="store_true", help="no summary line")


def _dest_job(args: argparse.Namespace, meta: dict, src_reader: TraceReader) -> str:
    from commscope.errors import UsageError
    from commscope.record.jobid import new_job_id, sanitize

    url_job = backend_for(args.dst).pinned_job(args.dst)
    if args.job is not None and not is_job_name(args.job):
        raise UsageError(f"bad --job {args.job[:130]!r}: use 1-120 letters, digits, '_', '.', '-', not starting "
                         "with '.' (a job id names a directory or key inside the store)")
    if args.job and url_job and args.job != url_job:
        raise UsageError(f"--job {args.job!r} contradicts ?job={url_job} in the destination URL")
    job = args.job or url_job or meta.get("job") or src_reader.job_name() or new_job_id()
    return sanitize(str(job))


def _share(args: argparse.Namespace, reader: TraceReader) -> bool:
    """Whether the copy is group-readable: asked for, or a source job that was."""
    return args.share_with_group or reader.shared_with_group()


def _size(reader: TraceReader) -> Size:
    """What the progress bar counts to (``TraceReader.size``): stored entries or bytes."""
    try:
        return reader.size()
    except (OSError, StoreError):
        return Size(0, "events")


def _losses(src: TraceReader) -> tuple[dict[int, int], ...]:
    """The source reader's counts, per rank, of what the copy cannot hold: lines gone from
    the store, damaged, invalid; and, a line each, losses of a count not known: what a rank
    was in where its read began (``uncarried``: its copy starts the stream afresh, and read
    healthy, exit 0, helper-179), a Redis stream failed over or emptied since its writer
    last wrote, one whose end a whole read could not read (``unread``: the copy read
    healthy, helper-210)."""
    stats = src.stats
    return (stats.missing_by_rank, stats.corrupt_by_rank, stats.invalid_by_rank, stats.uncarried_by_rank,
            stats.unsettled_by_rank, stats.emptied_by_rank, stats.unread_by_rank)


def _lost(src: TraceReader, rank: int) -> int:
    """The lines of ``rank``'s stream the source's reader counted lost so far (``_losses``):
    what the copy says it lacks."""
    return sum(counts.get(rank, 0) for counts in _losses(src))


def _new_loss(src: TraceReader, seen: dict[int, int]) -> set[int]:
    """Ranks whose lines the reader counted lost since the copy last said so."""
    ranks = {r for counts in _losses(src) for r in counts}
    return {r for r in ranks if r >= 0 and _lost(src, r) > seen.get(r, 0)}


#: A ``summary``'s keys for what its segment lost (``retention._lost``): left out of a copy's,
#: whose markers say every loss its source's reader counted, those too
SUMMARY_LOSSES = ("damaged", "invalid", "entries", "reason", "gaps", "gap_bytes", "cut")


def _write(w: StoreWriter, lines: list[bytes]) -> None:
    for k in range(0, len(lines), WRITE_LINES):  # (a Redis stream is marked between writes)
        w.write(lines[k:k + WRITE_LINES])


def _lost_why(src: TraceReader, gap: int, marker: Event | None) -> str:
    """Why the copy lacks ``gap`` entries of a rank: its source's marker's reason, else what
    the source's reader found.  (A directory copy of a trimmed Redis trace, copied into Redis
    again, held its marker as an entry with no gap, and check said healthy, helper-172.)"""
    if marker is not None:
        return str(marker.get("reason") or "")[len(STORE_LOST) + 2:]
    if isinstance(src, RedisReader):
        return (f"the source of this copy ({redact(src.description)}) no longer held {gap} events of this rank "
                "(trimmed by maxlen, or lost by Redis) when it was copied")
    return (f"the source of this copy ({redact(src.description)}) had lost {gap} line(s) of this rank's stream, "
            "or could not say what the rank was in where its read began, when it was copied (its check says why)")


def _open(dst: str, job: str, rank: int, job_meta: dict, share: bool | None) -> StoreWriter:
    """The copy's writer of one rank.  Into Redis: a history in seconds, marked by the writer,
    not by a child per rank, and no keyframes (a keeper's pace would mean nothing in it).
    Into a directory: every segment kept (an archive: ``$COMMSCOPE_RETAIN`` and its 1 GiB
    default deleted what the copy wrote, helper-177)."""
    if backend_for(dst).local:
        from commscope.store import retention
        from commscope.store.directory import DirectoryWriter

        return DirectoryWriter(default_store(dst), job, rank, job_meta, share=share, retain=retention.NONE)
    w = open_writer(dst, job, rank, job_meta, share=share)
    if isinstance(w, RedisWriter):
        w.marks = "inline"
        w.keyframe_s = None
    return w


def copy_trace(src: TraceReader, dst: str, job: str, meta: dict, progress: Any = None, task: Any = None,
               unit: str = "events", share: bool | None = None) -> dict[int, int]:
    """Copy every event ``src`` still has into job ``job`` of store ``dst``; events per rank.
    ``share``: the copy is readable by the group (``open_writer``)."""
    writers: dict[int, StoreWriter] = {}
    copied: dict[int, int] = {}
    job_meta = {k: v for k, v in meta.items() if k not in ("job", "maxlen")}
    job_meta["copied_from"] = redact(src.description)
    encode = events.encode
    # What the source lost of a rank (a Redis stream trimmed, a segment deleted or cut short,
    # damaged or invalid lines: what its reader counted) would read whole in the copy, whose
    # numbering closes the gap: it is said as a gap of as many entries into Redis
    # (``RedisWriter.skip``, whose readers count gaps in entry numbers) or a ``store_lost``
    # marker of as many lines into a directory (one inside a file: ``DirectoryReader._count_store_lost``),
    # where the rank's first marker of the page was, with its reason, else before its events.
    # The source's own markers are not copied: a directory writer's counts every line it
    # wrote (copied, 607 were counted where 41 were lost, helper-175), nor its summaries'
    # losses, which the markers say.  Before, a directory copy carried no loss of a directory
    # source, and read healthy (helper-177).
    said: dict[int, int] = {}  # rank -> the lines lost the copy said so far
    last_ts: dict[int, int] = {}  # rank -> the timestamp of its last line copied
    try:
        done_reading = False
        while True:
            page = src.poll(max_bytes=PAGE_BYTES) if not done_reading else []
            if not page:
                if done_reading:
                    break
                page = src.read_all()  # what poll leaves behind: torn last lines
                done_reading = True
                if not page and not _new_loss(src, said):
                    break
            by_rank: dict[int, list[bytes]] = {}
            stamps: dict[int, list[int]] = {}  # rank -> its lines' timestamps
            markers: dict[int, tuple[int, Event]] = {}  # rank -> where its first store_lost marker was, and it
            for ev in page:
                lines = by_rank.setdefault(ev["rank"], [])
                if ev["type"] == "dropped" and said_by_store(ev):
                    markers.setdefault(ev["rank"], (len(lines), ev))
                    continue
                if ev["type"] == "summary" and any(k in ev for k in SUMMARY_LOSSES):
                    ev = {k: v for k, v in ev.items() if k not in SUMMARY_LOSSES}
                lines.append(encode(ev))
                stamps.setdefault(ev["rank"], []).append(int(ev.get("ts") or 0))
            # (a rank whose loss the reader counted without a later event of it: the tail of its
            # stream that Redis lost after its writer closed, counted at the end of ``read_all``)
            for rank in sorted(set(by_rank) | _new_loss(src, said)):
                lines = by_rank.setdefault(rank, [])
                w = writers.get(rank)
                first = w is None
                if w is None:
                    w = writers[rank] = _open(dst, job, rank, job_meta, share)
                lost = _lost(src, rank)
                gap = lost - said.get(rank, 0)
                at, marker = markers.get(rank, (0, None))
                if gap > 0:
                    said[rank] = lost
                    why = _lost_why(src, gap, marker)
                    if not isinstance(w, RedisWriter):  # (after the meta a stream starts with: one
                        # first is a file its writer started again)
                        at = max(at, int(first and bool(lines) and b'"type":"meta"' in lines[0]))
                    # (timed where it stands in the stream, not now: a marker of today among a
                    # week-old trace's events made its rank the one heard from last, helper-179)
                    near = stamps.get(rank, [])
                    ts = int((marker.get("ts") if marker is not None else None)
                             or (near[at] if at < len(near) else near[-1] if near else last_ts.get(rank, 0)))
                    if isinstance(w, RedisWriter):
                        _write(w, lines[:at])
                        w.skip(gap, why, ts)
                        _write(w, lines[at:])
                    else:
                        _write(w, [*lines[:at], store_lost(rank, gap, why, ts=ts), *lines[at:]])
                else:
                    _write(w, lines)
                if stamps.get(rank):
                    last_ts[rank] = stamps[rank][-1]
                copied[rank] = copied.get(rank, 0) + len(lines)  # (the source's events)
            if progress is not None:
                done = src.stats.bytes if unit == "bytes" else sum(copied.values())
                progress.update(task, completed=done)
    finally:
        for w in writers.values():
            try:
                w.close()
            except Exception:
                pass
    return copied


def main(args: argparse.Namespace) -> int:
    from commscope.analysis.source import open_source
    from commscope.errors import UsageError

    t0 = time.perf_counter()
    try:
        refuse_url_like(args.dst)
        reader = open_source(args.src)
    except StoreError as exc:
        raise UsageError(str(exc)) from None
    try:
        meta = reader.job() or {}
        job = _dest_job(args, meta, reader)
        share = _share(args, reader)
        total, unit = _size(reader)
        show = args.progress == "always" or (args.progress == "auto" and total >= PROGRESS_MIN * (
            300 if unit == "bytes" else 1) and sys.stderr.isatty())
        if show:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            columns = [TextColumn("copying {task.description}"), BarColumn(), MofNCompleteColumn(),
                       TimeRemainingColumn()]
            with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
                task = progress.add_task(f"job {job}", total=total or None)
                copied = copy_trace(reader, args.dst, job, meta, progress, task, unit, share=share)
        else:
            copied = copy_trace(reader, args.dst, job, meta, share=share)
    except StoreError as exc:
        if "refusing to mix" in str(exc):
            raise UsageError(f"{exc} (use --job NEW to copy under another id)") from None
        raise UsageError(f"copy incomplete: {exc}") from None
    finally:
        reader.close()
    stats = reader.stats
    if not copied:
        raise UsageError(f"{redact(reader.description)}: no events to copy")
    if not args.quiet:
        n = sum(copied.values())
        where = backend_for(args.dst).job_location(args.dst, job)
        print(f"copied {n:,} events of {len(copied)} rank(s), job {job}, from {redact(reader.description)} "
              f"to {where} in {time.perf_counter() - t0:.1f} s")
        for warning in stats.warnings:
            print(options.warning(warning).plain, file=sys.stderr)
        if stats.corrupt:
            print(f"warning: skipped {stats.corrupt} damaged event(s) in the source", file=sys.stderr)
        if stats.trimmed:
            print("warning: the source was trimmed (maxlen): its oldest events were already gone", file=sys.stderr)
    return 0
