"""The embedded default store: a directory, one sequence of segment files per rank stream.

Layout::

    ROOT/LATEST                      id of the newest job (rank 0 replaces it atomically)
    ROOT/<job>/job.json              job metadata, written by rank 0
    ROOT/<job>/rank-00003.jsonl      rank 3's stream, one JSON event per line: its first segment
    ROOT/<job>/rank-00003.s000001.t1780001234.jsonl   its next segments (store/segments.py)
    ROOT/<job>/rank-00003+1.jsonl    the same rank's next incarnation (its process group
                                     initialised again in one process): a stream of its own
    ROOT/<job>/rank-00003.open.000000.jsonl   what it was in when segment 0 ended (store/inflight.py)
    ROOT/<job>/rank-00003.open.000004.partial.jsonl   the same, replayed past a segment gone uncarried
    ROOT/<job>/rank-00003.summary.jsonl       what retention kept of deleted segments (store/retention.py)
    ROOT/<job>/rank-00003.keys.000004.bin     what it was in every few seconds of segment 4 (store/keyframes.py)
    ROOT/<job>/rank-00003.crash      what faulthandler wrote if rank 3 died of a fatal signal
                                     (traces of earlier versions; read back as events: see
                                     store/crashlog.py)

Each job gets its own directory, so a new job never mixes with an old one, and each
rank writes only its own files, so the layout is safe on a shared filesystem.  Readers
tail segments from byte offsets and leave an incomplete last line for the next poll; a
whole read of a large job decodes in worker processes (store/bulkread.py).
"""

from __future__ import annotations

import errno
import os
import re
import stat
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from operator import itemgetter
from pathlib import Path
from typing import NamedTuple

import numpy as np
import orjson

from commscope import beats, beatscan, jsonops
from commscope.blocks import BlockDecoder, StaticTable, decode_alone, decode_stream, gaps_not_counted
from commscope.blockscan import Scan
from commscope.events import Decoded, Event, decode_lines, gc_paused, incarnation_ids
from commscope.oprecords import OpRecords
from commscope.private import make_dirs
from commscope.redact import redact
from commscope.schema import decode_job
from commscope.store import children, inflight, keyframes, retention, segments
from commscope.store.base import (
    STORE_LOST,
    Batch,
    ReadStats,
    Shard,
    StoreError,
    Stream,
    TraceReader,
    check_job_name,
    is_job_name,
    meta_line,
    said_by_store,
    store_lost,
)
from commscope.store.bulkread import DecoderState, Job, StreamsRead, Workers, cores
from commscope.store.crashlog import CRASH_FILE, CrashFiles
from commscope.store.files import (
    O_NOFOLLOW,
    OpenFiles,
    atomic_write,
    create_file,
    read_from,
    read_open,
    read_regular,
    size_of,
)
from commscope.store.redis_url import SCHEMES as URL_SCHEMES  # (the schemes the registry's other rows claim)
from commscope.store.retention import Retention
from commscope.store.segments import (
    Segment,
    list_segments,
    segment_bytes_from_env,
    segment_name,
    window_start,
)
from commscope.window import Since

LATEST = "LATEST"
JOB_FILE = "job.json"
MAX_JOB_FILE = 1 << 20  # job.json is a few hundred bytes; never read more than this


def rank_file_name(rank: int, incarnation: int = 0) -> str:
    """The stream's first segment (``store/segments.py``): the one file of a short job."""
    return segment_name(rank, incarnation, 0)


#: Processes a whole read of a large job may read with: the reading process and its workers
#: (default: one per core, at most 8; 0 or 1: the reading process alone)
ENV_WORKERS = "COMMSCOPE_READ_WORKERS"

#: ``commscope run --share-with-group`` sets it for the ranks: stores they create are
#: readable by the owner's group.  Otherwise a store is its owner's alone.
ENV_SHARE = "COMMSCOPE_SHARE_WITH_GROUP"


class Jump(NamedTuple):
    """A reader's jump over segments of a stream deleted under it (by retention, or by hand):
    from the segment it was reading to the oldest one left, having read the ops up to
    ``after_id``, and ``lines`` of the stream (read, or counted as skipped or summarized:
    ``DirectoryReader._position``; None: not known), so the lines of those segments gone
    without a summary are counted exactly (``DirectoryReader._lines_gone``)."""

    left: int
    entered: int
    after_id: int
    lines: int | None = None


class Rebased(NamedTuple):
    """The segment of a stream whose meta's ``lines_before`` a reader took last
    (``DirectoryReader._rebase``), and those lines."""

    segment: int
    lines: int


class _Summary(NamedTuple):
    """A stream's summary file (``DirectoryReader._name``)."""

    stream: Stream
    path: Path


class _Keys(NamedTuple):
    """A segment's keyframes file (``DirectoryReader._name``, ``store/keyframes.py``)."""

    stream: Stream
    number: int


#: A file of the job directory that is neither a segment, a summary nor keyframes (``DirectoryReader._name``)
_OTHER = object()


class Modes(NamedTuple):
    """Permission bits of what a directory store creates (never changed on what exists)."""

    dir: int
    file: int


PRIVATE = Modes(0o700, 0o600)
GROUP = Modes(0o750, 0o640)


#: A chunk this long or longer has its lines counted by numpy, ~3x ``bytes.count``'s speed
#: (a 1 MB stream: ~95 us against ~290; below it numpy's call costs more than it saves) ...
_COUNT_BY_NUMPY = 64 << 10
#: ... in pieces of this many bytes (the comparison's temporary array stays small)
_COUNT_PIECE = 1 << 20


def count_lines(data: bytes, end: int) -> int:
    """The newlines in ``data[:end]``: the lines a reader read, which a ``store_lost`` marker
    read later is taken against (``DirectoryReader._lines_read``)."""
    if end < _COUNT_BY_NUMPY:
        return data.count(b"\n", 0, end)
    view = np.frombuffer(data, np.uint8, count=end)
    return sum(int(np.count_nonzero(view[i:i + _COUNT_PIECE] == 10)) for i in range(0, end, _COUNT_PIECE))


def share_from_env() -> bool:
    return os.environ.get(ENV_SHARE, "").strip().lower() in ("1", "true", "yes", "on")


def modes_of(directory: Path) -> Modes:
    """The modes of a job directory's files: its own group bits say (the directory is
    what its creator chose; every later writer follows it)."""
    try:
        return GROUP if os.stat(directory).st_mode & stat.S_IRGRP else PRIVATE
    except OSError:
        return PRIVATE


def check_owner(root: Path, job_dir: Path) -> None:
    """Refuse (``StoreError``) to write into a job directory that is not ours, or into a store
    whose root anyone may write without the sticky bit: the files made there take the job
    directory's modes (``modes_of``), so its owner's choice (their group, a 0750 made ahead)
    would open the trace to others, and whoever may write a root without the sticky bit (as
    /tmp has) can put a directory of theirs in place of ours.  A root of a colleague's that
    their group writes (a team's store, ``--share-with-group``) is fine."""
    from commscope.private import owner_name

    me = os.getuid()
    try:
        st = os.stat(root)
        if st.st_uid != me and st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
            raise StoreError(f"refusing to write trace store {root}: it belongs to {owner_name(st.st_uid)} and "
                             f"anyone may write it (mode {stat.S_IMODE(st.st_mode):04o}, no sticky bit), so "
                             "another user could put a directory of theirs in place of this job's (choose a "
                             "store of your own, or set the sticky bit: chmod +t)")
        uid = os.stat(job_dir).st_uid
    except OSError:
        return  # (what cannot be seen is not written either: that error says itself)
    if uid != me:
        raise StoreError(f"refusing to write trace store {job_dir}: it belongs to {owner_name(uid)}, not to you "
                         f"({owner_name(me)}), who could read or replace what is written there "
                         "(choose a store of your own, or another job id)")


class DirectoryWriter:
    """Appends one rank's events; owned by that rank's recorder thread."""

    write_every = 0.0  # a local file: every tick
    PREV_KEPT = 8  # segments kept open while their closers lag (``_prev``)
    warning = None  # (nothing to say at open: a full disk is said when a write fails)

    def __init__(self, root: str | os.PathLike, job: str, rank: int, job_meta: dict | None = None, *,
                 incarnation: int = 0, resume: bool = False, connect_timeout: float | None = None,
                 share: bool | None = None, segment_bytes: int | None = None, retain: Retention | None = None,
                 closer: bool = True):
        """``resume``: append to the stream of a rank that died (a forwarder sending what its
        spool kept), instead of refusing a stream that holds events already.  ``share``:
        a job directory this writer creates is readable by the group (None:
        ``$COMMSCOPE_SHARE_WITH_GROUP``); one that exists keeps its modes.  ``connect_timeout``:
        a directory connects to nothing (``store.open_writer`` passes it to every store).
        ``segment_bytes``: start a new segment past this size (None: ``$COMMSCOPE_SEGMENT_MB``,
        default 64 MiB, at most a quarter of a size limit: ``retention.segment_bytes_for``); ``retain``: the history kept (None: ``$COMMSCOPE_RETAIN``, see
        ``store/retention.py``); ``closer``: run the child that closes a segment after each
        new one (False: the caller runs ``retention.close_stream`` itself)."""
        self.root = Path(root)
        self.job = check_job_name(job)
        self.rank = rank
        self.incarnation = incarnation
        self.dir = self.root / job
        self.retain = retain if retain is not None else retention.from_env()
        self.segment_bytes = segment_bytes if segment_bytes is not None else \
            retention.segment_bytes_for(segment_bytes_from_env(), self.retain)
        self.closer = closer and not resume  # (a forwarder never bounds a history: the rank's settings do)
        self._retainer: subprocess.Popen | None = None  # the child closing the last segment
        self._owed = False  # a segment closed while a closer ran, not closed by it (``close``)
        #: the process's keeper of keyframes, once this stream's segment grew past
        #: ``keyframes.FOLLOW_AFTER``: it is told each new segment (``_next_segment``)
        self._keeper: children.Keeper | None = None
        self.keyframe_s = keyframes.every_s_from_env() if self.closer else None  # (None: no keyframes)
        self._keeper_check = 0.0  # (monotonic) when to make sure the keeper runs next
        self._segment_size = 0  # (``_open`` says)
        # (a forwarder lists the directory to find the newest segment, to go on in it; a rank
        # starting never does: 16k ranks listing a directory of 16k files at once is a metadata storm)
        gone = resume and not self.dir.is_dir()
        existing = list_segments(self.dir).get((rank, incarnation), []) if resume and not gone else []
        self._segment = existing[-1].number if existing else 0
        self.path = existing[-1].path if existing else self.dir / segment_name(rank, incarnation, 0)
        self.description = str(self.path)
        self._fd: int | None = None
        self._torn = False  # the file ends mid-line: a failed write stopped there
        self._job_meta = dict(job_meta or {}, job=job)
        self._meta_line: bytes | None = None  # the rank's meta, written again into a recreated store
        self._lines = 0  # lines this writer put into the file (what a deleted store lost)
        #: The lines the stream held before this writer (a forwarder's: ``resume``), which the
        #: meta of each segment it starts counts too (``_next_segment``); None: not known
        self._resumed: int | None = 0
        #: The carry of the segment before the current one, read once its closer wrote it (b"":
        #: segment 0, or a file started again after a loss, which restated it): what replays
        #: the segment when it is deleted (``_restated``).  None: not read yet
        self._before: bytes | None = b"" if self._segment == 0 else None
        #: The segments before whose carry is not read yet (their closers still run): the
        #: carry before the first of them and their files (open) and sizes, what replays
        #: them when the job directory goes before a closer ends (``_restated``); at most
        #: ``PREV_KEPT`` of them
        self._prev: tuple[bytes, list[tuple[int, int]]] | None = None
        self.modes = GROUP if (share_from_env() if share is None else share) else PRIVATE
        try:
            if gone:  # the store is gone: never recreate it for a dead rank
                raise StoreError(f"no job {job!r} in {self.root} any more")
            make_dirs(self.dir, self.modes.dir)
            check_owner(self.root, self.dir)
            self.modes = modes_of(self.dir)
            self._open()
            size = self._segment_size
            if size > 0 and not resume:
                raise StoreError(
                    f"{self.path} already holds events of an earlier job with id {job!r}; "
                    "refusing to mix jobs (choose a new COMMSCOPE_JOB or another store)"
                )
            if resume and size > 0:  # a line the dead rank left half-written is ended
                self._torn = read_from(self.path, size - 1, 1) != b"\n"
            if resume:
                self._resumed = self._lines_held()
            if rank == 0 and incarnation == 0 and not resume:
                meta = dict(job_meta or {}, job=job)
                atomic_write(self.dir / JOB_FILE, orjson.dumps(meta, option=orjson.OPT_INDENT_2), self.modes.file)
                atomic_write(self.root / LATEST, job.encode() + b"\n", modes_of(self.root).file)
        except OSError as exc:
            self.close()
            raise StoreError(f"cannot write trace store {self.dir}: {exc.strerror or exc}") from None
        except StoreError:
            self.close()
            raise

    @property
    def crash_dir(self) -> Path:
        return self.dir

    @property
    def stored(self) -> int:
        return self._lines

    def first_event(self) -> dict | None:
        """The stream's first event (its meta: every segment starts with it), None when empty
        or unreadable."""
        first = self.dir / segment_name(self.rank, self.incarnation, 0)
        if not first.exists():  # (retention deleted it: the oldest left starts with the meta too)
            segs = list_segments(self.dir).get((self.rank, self.incarnation), [])
            first = segs[0].path if segs else self.path
        try:
            with open(first, "rb") as f:
                line = f.readline(1 << 20)
            ev = orjson.loads(line)
        except (OSError, orjson.JSONDecodeError):
            return None
        return ev if isinstance(ev, dict) else None

    def _open(self) -> None:
        """Open the rank file for appending without ever blocking: a FIFO (or any file that is
        not a regular file) in its place is refused at once instead of hanging the thread.
        The segment's size is what the file holds (a recreated store's starts again).  Open
        for reading too: what it held is restated once it is deleted (``_restated``)."""
        try:
            fd = create_file(self.path, os.O_RDWR | os.O_APPEND | os.O_NONBLOCK | O_NOFOLLOW, self.modes.file)
        except OSError as exc:
            if exc.errno in (errno.ENXIO, errno.ELOOP):  # a FIFO with no reader; a symlink
                raise StoreError(f"cannot write trace store {self.path}: not a regular file") from None
            raise
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise StoreError(f"cannot write trace store {self.path}: not a regular file")
        os.set_blocking(fd, True)
        self._fd = fd
        self._segment_size = st.st_size

    def write(self, lines: list[bytes]) -> None:
        if not lines:
            return
        done = 0
        lead = b""
        extra: list[bytes] = []
        if self._meta_line is None:
            self._meta_line = meta_line(lines)
        if self._before is None and self._retainer is not None and self._retainer.poll() is not None:
            self._retainer = None  # (its carry is read now, while it is there: the job directory may go)
            self._before = inflight.carried(self.dir, (self.rank, self.incarnation), self._segment - 1)
            if self._before is not None:
                self._drop_prev()
        try:
            if self._fd is None or os.fstat(self._fd).st_nlink == 0:
                # The store was deleted under us: recreate it rather than write into an
                # unlinked file nobody can read, and say so first: what it held is lost,
                # and what the rank was in went with it (``_restated``).
                restated, known = self._restated()
                self.close()
                self._before = b""  # (the file starts again with what the rank was in)
                make_dirs(self.dir, self.modes.dir)
                check_owner(self.root, self.dir)  # (another user's, made meanwhile: not written into)
                if not (self.dir / JOB_FILE).exists():
                    atomic_write(self.dir / JOB_FILE, orjson.dumps(self._job_meta, option=orjson.OPT_INDENT_2),
                                  self.modes.file)
                self._open()
                self._torn = False
                if self._lines:
                    why = "the job directory was deleted while the rank was writing; its earlier events went with it"
                    if not known:
                        why += (f"; what it was in before segment {self._segment} is not known (an op begun before "
                                "may be missing)")
                    extra = [store_lost(self.rank, self._lines, why)]
                    extra += [self._meta_line] if self._meta_line is not None else []
                    extra += restated
            if self._segment_size and not extra and self._segment_size + sum(map(len, lines)) > self.segment_bytes:
                extra = self._next_segment(lines)
            lead = b"\n" if self._torn else b""  # end a torn line from a failed write
            # One copy of the lines (a block line is most of a tick's bytes): the lead and
            # the last newline are joined in, not concatenated after.
            parts = [*extra, *lines, b""]
            if lead:
                parts.insert(0, b"")
            data = b"\n".join(parts)
            view = memoryview(data)
            while done < len(data):
                n = os.write(self._fd, view[done:])
                if n <= 0:
                    raise OSError(errno.EIO, "short write")
                done += n
        except (OSError, StoreError) as exc:
            # Whole lines that landed count as written; a torn tail is cut off (the retry
            # writes its line whole: left, it was a damaged line, a loss counted of a line
            # that was not lost, and an ERROR trace_incomplete on a disk that filled:
            # helper-166), or, where it cannot be, ended next time.  A retry that wrote
            # nothing leaves the file as torn as it was.
            if done:
                whole = data.rfind(b"\n", 0, done) + 1
                if whole < done:
                    try:
                        os.ftruncate(self._fd, self._segment_size + whole)
                        done = whole
                    except OSError:
                        pass
            if done:  # (none left: the file as it was before, torn or not)
                self._torn = data[done - 1] != 0x0A
                self._segment_size += done
            landed = data[len(lead):done].count(b"\n") if done > len(lead) else 0
            self._lines += landed
            why = exc.strerror or exc if isinstance(exc, OSError) else exc
            raise StoreError(f"cannot append to {self.path}: {why}", max(landed - len(extra), 0)) from None
        self._torn = False
        self._lines += len(extra) + len(lines)
        self._segment_size += len(data)
        if self._keeper is None and self._segment_size >= keyframes.FOLLOW_AFTER and self.keyframe_s is not None:
            self._keeper = keyframes.keeper(self.dir, self.keyframe_s)
            keyframes.follow(self._keeper, (self.rank, self.incarnation), self._segment, self.path.name)
            self._keeper_check = time.monotonic() + keyframes.CHECK_S
        elif self._keeper is not None and (now := time.monotonic()) >= self._keeper_check:
            self._keeper_check = now + keyframes.CHECK_S
            self._keeper.ensure()  # (one that died, started again)

    def _restated(self) -> tuple[list[bytes], bool]:
        """What the rank was in at the end of its segment (its groups, the ops it still has in
        flight, the stacks that say where it is: ``inflight.restatement``, as a Redis writer
        restates after a flush), replayed from the file it still holds open once deleted and
        the carry of the segment before (``_before``, read when its closer ended, else now:
        only the rank's file deleted): stated after the ``store_lost`` marker, so a hang that
        began before the loss is still found; and whether that carry was known.  Where it
        is not (the job directory deleted before the closer wrote it, or read: a closer
        still running), what the segment alone says, and the marker says the rest is not
        known: the file is read from its start whatever came before (``inflight.starts_again``),
        so that is the one place that says it.  Nothing when the file is not open."""
        if self._fd is None:
            return [], False
        before = self._before
        if before is None:
            before = inflight.carried(self.dir, (self.rank, self.incarnation), self._segment - 1)
        if before is None and self._prev is not None:  # (those carries are not written yet: made here)
            before = self._prev[0]
            for fd, size in self._prev[1]:
                try:
                    prev = inflight.restatement(before, read_open(fd, size), self.rank)
                except OSError:
                    prev = None
                before = b"".join(x + b"\n" for x in prev.lines) if prev is not None else None
                if before is None:
                    break
        known = before is not None
        try:
            data = read_open(self._fd, self._segment_size)
        except OSError:
            return [], False
        restated = inflight.restatement(before or b"", data, self.rank)
        return (restated.lines, known) if restated is not None else ([], False)

    def _next_segment(self, lines: list[bytes]) -> list[bytes]:
        """Close the current segment and start the next one (named by the time of its first
        line); returns what it must begin with: the rank's meta, so it decodes alone, saying
        the lines written before it (``segments.opening_meta``).  Then let a child bound the
        history (``store/retention.py``)."""
        start = segments.start_of(lines[0]) or time.time_ns() // 1_000_000_000
        if self._fd is not None:  # (kept open until a closer's carry after it is read)
            if self._before is not None:
                self._drop_prev()
                self._prev = (self._before, [])
            if self._prev is not None and len(self._prev[1]) < self.PREV_KEPT:
                self._prev[1].append((self._fd, self._segment_size))
                self._fd = None
            else:
                self._drop_prev()
        self._close_file()
        self._segment += 1
        self._before = None  # (its closer writes it: ``write`` reads it once that ends)
        self.path = self.dir / segment_name(self.rank, self.incarnation, self._segment, start)
        self.description = str(self.path)
        self._open()
        self._torn = False
        self._retire()
        if self._keeper is not None:
            keyframes.follow(self._keeper, (self.rank, self.incarnation), self._segment, self.path.name)
        if self._meta_line is None or lines[0] is self._meta_line:
            return []
        # (saying the lines before it: a reader starting here, at a window or after retention,
        # does not count those as lost when a ``store_lost`` marker counts them all)
        if self._resumed is None:  # (says nothing: a reader counts as for a writer from before)
            return [self._meta_line]
        return [segments.opening_meta(self._meta_line, self._resumed + self._lines)]

    def _lines_held(self) -> int | None:
        """The lines of the stream before a forwarder resumes it (``resume``): those before its
        newest segment (0 before segment 0, else as that segment's meta says) and the
        segment's own, a half-written one the writer ends included; None where the meta says
        none (a writer from before ``lines_before``) or the file cannot be read.  Read once,
        when the forwarder starts: before, its next segment's meta counted only the
        forwarder's own lines, and a reader counted too few lines lost (or none) where a
        segment after it went."""
        try:
            data = read_from(self.path, 0, self._segment_size)
        except OSError:
            return None
        before = 0 if self._segment == 0 else segments.lines_before(data)
        if before is None:
            return None
        return before + count_lines(data, len(data)) + self._torn

    def _retire(self) -> None:
        """Start the child that closes the last segment (carries what is in flight, bounds
        the history: ``retention.close_stream``) unless one still runs: the next one then
        closes every segment left open."""
        if not self.closer:
            return
        self._owed = self._retainer is not None and self._retainer.poll() is None
        if not self._owed:
            self._retainer = retention.spawn(self.dir, self.rank, self.incarnation, self.retain)

    def close(self) -> None:
        """Let go of the file; where a segment closed while a closer ran (which closes only
        what it listed) and no next segment started another, start one now: no carry of it
        was ever written otherwise, and each window read of the finished job made it again
        from the segments (``inflight.made``: ~2 s a 64 MiB segment)."""
        self._close_file()
        self._drop_prev()
        if self._keeper is not None:
            self._keeper.done((self.rank, self.incarnation))
            self._keeper = None
        if self._owed:
            self._owed = False
            self._retainer = retention.spawn(self.dir, self.rank, self.incarnation, self.retain)

    def _close_file(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None

    def _drop_prev(self) -> None:
        """The segments before are no longer needed to restate (``_prev``)."""
        if self._prev is not None:
            for fd, _ in self._prev[1]:
                try:
                    os.close(fd)
                except OSError:
                    pass
            self._prev = None


def resolve_job_dir(path: str | os.PathLike) -> Path | None:
    """The job directory a path names: itself, ROOT/LATEST, or the newest job under it."""
    p = Path(path)
    if not p.is_dir():
        return None
    if (p / JOB_FILE).exists() or any(segments.parse(n) for n in os.listdir(p)):
        return p
    latest = p / LATEST
    if latest.exists():
        try:
            name = read_regular(latest, 4096).decode("utf-8", "replace").strip()
        except OSError:
            name = ""
        if is_job_name(name) and (p / name).is_dir():
            return p / name
    jobs = [d for d in p.iterdir() if d.is_dir() and ((d / JOB_FILE).exists() or any(
        segments.parse(n) for n in os.listdir(d)))]
    if not jobs:
        return None
    return max(jobs, key=lambda d: d.stat().st_mtime_ns)


def list_jobs(path: str | os.PathLike) -> list[str]:
    p = Path(path)
    if not p.is_dir():
        return []
    return sorted(d.name for d in p.iterdir() if d.is_dir() and (d / JOB_FILE).exists())


def launch_of(path: str, job: str) -> str | None:
    """The ``commscope run`` launch that made ``job`` of the store at ``path``, as its job file
    says (``$COMMSCOPE_LAUNCH``); None where it says none or cannot be read."""
    try:
        got, _ = decode_job(read_regular(Path(path) / job / JOB_FILE, MAX_JOB_FILE))
    except OSError:
        return None
    launch = got.get("launch") if got is not None else None
    return launch if isinstance(launch, str) else None


def jobs(path: str) -> set[str] | None:
    """The jobs the store holds now, never raising (None: it cannot be listed)."""
    try:
        return set(list_jobs(path))
    except (OSError, StoreError):
        return None


def absolute(path: str) -> str:
    """The store's path from anywhere on this host (a command may change directory)."""
    return str(Path(path).resolve())


def job_location(path: str, job: str) -> str:
    """Where job ``job`` of the store lies."""
    return f"{path.rstrip('/')}/{job}"


def with_job(path: str, job: str) -> str:
    """The path naming job ``job`` of a store exactly, as a reader opens it (made or not
    yet): the job's directory in the store, or the path itself where it is that directory."""
    p = Path(path)
    return path if p.name == job and not (p / job).is_dir() else str(p / job)


class Piece(NamedTuple):
    """One chunk of a stream in a whole read (``DirectoryReader.read_whole``): how many
    events it returned, its ``jsonops`` decode (where its JSON op lines went to columns),
    and the heartbeats and samples its block decode took out of its events, as rows."""

    events: int
    chunk: jsonops.Chunk | None
    taken: beatscan.Taken | None


_SCHEME_LIKE = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):(?=/|[^/]*@)")


def not_a_path(name: str) -> str | None:
    """Why a store name that no backend claims and that is no path here is taken for a
    mistyped URL (``http://u:pw@h``, ``redis:/:pw@h``), without echoing it: Path's normalising
    (``http:/u:pw@h``) hides its credentials from the redaction.  None: a path."""
    m = _SCHEME_LIKE.match(name)
    if m is None or os.path.lexists(name):
        return None
    scheme = m.group(1)
    if scheme.lower() in URL_SCHEMES:
        return f"{scheme}:…: a {scheme.lower()} store's URL starts {scheme.lower()}://"
    schemes = [f"{s}://" for s in URL_SCHEMES]
    return (f"{scheme}:…: a store is a directory or a {', '.join(schemes[:-1])} or {schemes[-1]} URL, and "
            f"{scheme!r} is not one of those schemes")


def _no_store(name: str) -> str:
    """What to say of a store name that is no path here."""
    why = not_a_path(name)
    return f"no trace store at {why}" if why is not None else f"no trace store at {redact(str(Path(name)))}"


class DirectoryReader(TraceReader):
    """Reads or tails one job directory.  Tolerates torn tails, corrupt lines, truncation.

    A stream is read segment after segment (``store/segments.py``); ``since_ns`` starts each
    at the segment that holds that time (its newest, if it ended before), so a read of the
    last minutes of a week-long job costs those minutes.  What retention summarized before
    deleting (``rank-*.summary.jsonl``) is read with the streams."""

    CHUNK = 8 << 20
    MIN_READ = 1 << 16  # bytes a budgeted poll reads of a stream at least
    counts_lost_markers = True  # a writer that found its file deleted says what went with it
    shards = True

    def __init__(self, path: str | os.PathLike, *, wait: bool = False, since_ns: int | None = None):
        self.path = Path(path)
        self.description = str(self.path)
        self.stats = ReadStats()
        self._wait = wait
        self.since_ns = since_ns
        self.job_dir: Path | None = resolve_job_dir(self.path)
        # (waiting, for a job that has not written yet: not on what can never become a store, a
        # file or a mistyped URL; attach waited on them for good, helper-171)
        if self.job_dir is None and (not wait or self.path.is_file() or not_a_path(os.fspath(path)) is not None):
            if not self.path.exists():
                raise StoreError(_no_store(os.fspath(path)))
            if self.path.is_file() and self.path.name.startswith("rank-"):  # (a rank's stream)
                raise StoreError(f"{self.path} is one rank's stream: give the directory that holds the job's "
                                 f"rank-*.jsonl files ({self.path.parent}) or the store above it")
            if self.path.is_file():
                raise StoreError(f"{self.path} is a file, not a trace store (a directory, or a redis:// URL)")
            raise StoreError(f"{self.path} holds no commscope trace (no rank-*.jsonl files)")
        self._reading: dict[Stream, int] = {}  # the number of the segment being read
        self._partial: dict[Stream, bool] = {}
        self._next = 0  # the stream a budgeted poll starts with (they take turns)
        self._streams: dict[Stream, list[Segment]] = {}
        #: the streams a whole read's worker was given to read (``read_whole``), with their segments
        self._given: dict[Stream, list[Segment]] = {}
        self._segment_names: frozenset[str] = frozenset()  # the names ``_streams`` was grouped from
        self._summaries: dict[Stream, Path] = {}
        self._crash_names: list[str] = []  # crash files (``crashlog``) as the directory was last listed
        self._summary_offsets: dict[Stream, int] = {}
        #: what comes first in the next poll: what streams starting at a later segment were in
        #: (``_carry``), and the rest of segments deleted while they were read (``_rescue``)
        self._carried: list[Event] = []
        self._read_of: dict[tuple[Stream, int], int] = {}  # (stream, segment) -> bytes of it read (where it goes on)
        #: stream -> (its newest segment, that file's path, its size) when last read to its end
        #: with no line torn: while the stream has that newest segment of that size, a poll
        #: has nothing to read in it (``poll``'s one stat)
        self._tails: dict[Stream, tuple[Segment, str, int]] = {}
        #: how a poll asks a tail's size (None: through the file it holds, ``OpenFiles.size``)
        self._quiet_size: Callable[[str], int] | None = None
        self._pending: dict[tuple[Stream, int], Event] = {}  # summaries not decided yet
        self._decided: set[tuple[Stream, int]] = set()
        self._jumps: dict[Stream, list[Jump]] = {}  # per stream, over segments deleted under this reader
        #: per stream, the numbers of the segments counted as skipped before the window when it
        #: was entered (``_enter``), [first, last), ``last`` the window's first (none skipped
        #: where the window starts in the oldest segment listed: what is before it is not asked
        #: for, ``_asked_from``, whatever retention deletes later): once retention deletes one,
        #: its summary stands for it and its bytes are taken back out (``_read_summaries``)
        self._skipped: dict[Stream, tuple[int, int]] = {}
        #: per stream, lines of its last chunk counted lost (damaged, invalid, dropped) that a
        #: gap in the ring positions in the next may stand for (``_account``)
        self._excused: dict[Stream, int] = {}
        #: per stream, segments passed over as gone (no file, ``_read_stream``): the next gap in
        #: its ring positions is theirs, counted with them (``_count_segments_gone``)
        self._gone_excuse: dict[Stream, int] = {}
        #: per stream, the segment it read to its end and went on from to the next one
        #: (``_read_stream``): the next one's meta says the lines written before it, so those
        #: cut off the end of this one are counted (``_count_cut``)
        self._moved_on: dict[Stream, int] = {}
        #: per stream, the segment it entered passing over segments gone (counted with them,
        #: ``_count_segments_gone``): its lines read fell behind, and are taken again from that
        #: segment's meta when it is read from its start (``_read_segment``)
        self._resync: dict[Stream, int] = {}
        #: the segments whose cut end this reader counted (``_count_cut``): their summaries'
        #: ``cut`` is not counted again (``_read_summaries``)
        self._cut_counted: set[tuple[Stream, int]] = set()
        #: per stream, the segment numbers below this are counted as gone (``_count_segments_gone``),
        #: or by a writer's ``store_lost`` marker (``_count_store_lost``)
        self._gone_upto: dict[Stream, int] = {}
        #: per stream, the lines of it this reader read, those a ``store_lost`` marker it read
        #: said were lost, and those before the segment it started at (``_rebase``):
        #: what the next marker's count is taken against (``_count_store_lost``)
        self._lines_read: dict[Stream, int] = {}
        #: whether reads count their lines into ``_lines_read`` (a whole read's workers do not:
        #: ``read_streams``)
        self.counts_lines = True
        #: the streams entered at a later segment than the one read last (a window's first, the
        #: oldest left by retention, one after segments deleted under this reader): the lines
        #: before it are taken as accounted for (skipped, summarized) from what its meta says
        #: when it is read from its start (``segments.lines_before``; a file its writer started
        #: again has none: as the segment before or its summary says, ``_lines_up_to``), so a ``store_lost``
        #: marker read later counts as lost only the lines neither read nor counted so
        self._rebase: set[Stream] = set()
        #: per stream, the ranges [first, last) of segment numbers asked for but not listed when
        #: it was entered (``_enter``: below the oldest left, jumped over): those neither
        #: summarized are gone, counted so by ``_count_segments_gone``, or when a writer's
        #: ``store_lost`` marker comes first (the listing then lost), by ``_count_store_lost``
        self._unlisted: dict[Stream, list[tuple[int, int]]] = {}
        #: the streams a whole read's workers read without counting their lines (``read_streams``):
        #: a ``store_lost`` marker its last read meets (the job directory deleted during the read)
        #: counts at most what was lost, and says so; an exact count would cost each stream a
        #: line count (~176 us of a stream's ~800) for a deletion in the seconds of a read
        self._uncounted: set[Stream] = set()
        #: per stream, the segment whose meta's ``lines_before`` the reader took last, with them
        #: (``_rebase``): a ``store_lost`` marker counts none of the lines before it
        self._rebased_at: dict[Stream, Rebased] = {}
        #: per stream, the lines read before a file its writer started again (``_started_again``),
        #: until its marker is counted
        self._lines_before: dict[Stream, int] = {}
        #: (stream, segment) -> the last bytes read of it (``SAME_FILE_BYTES``): a file written again
        #: under its name is read from its start (``_read_segment``)
        self._last_read: dict[tuple[Stream, int], bytes] = {}
        self._listed: tuple[int, float] | None = None  # (directory mtime, when) of the last listing
        self._names: dict[str, tuple[Stream, Segment] | _Summary | _Keys | object] = {}  # file name -> ``_name``
        #: (stream, segment number) of the keyframe files the last listing named (None: not listed,
        #: a whole read's worker: each looked for)
        self._keyed: set[tuple[Stream, int]] | None = None
        #: stream -> (segment number, window start, its keyframe there): looked up once a window
        self._keyframes: dict[Stream, tuple[int, int, keyframes.Keyframe | None]] = {}
        self._summaries_due = False  # listed again since the summaries were last read
        #: streams whose segment being read was deleted since the listing (retention): not read
        #: on past it until the next listing, which ``read_all`` makes at once
        self._vanished: set[Stream] = set()
        self._job: dict | None = None
        self._job_failed = False
        self._refused: set[str] = set()  # rank files that are not regular files (warned once)
        self._list_error: str | None = None  # why the job's directory could not be listed (warned once)
        self._crashes = CrashFiles()
        #: the streams' newest segments, held open between polls (``files.OpenFiles``), room
        #: for this many streams reserved (``OpenFiles.reserve``)
        self._files = OpenFiles()
        self._room_asked = 0

    def job(self) -> dict | None:
        if self._job is None and self.job_dir is not None and not self._job_failed:
            try:
                data = read_regular(self.job_dir / JOB_FILE, MAX_JOB_FILE)
            except FileNotFoundError:
                return None
            except OSError as exc:
                data, why = None, f"job metadata: {exc.strerror or exc}"
            if data is not None:
                self._job, why = decode_job(data)
            if self._job is None:
                self._job_failed = True
                self.job_invalid(why, f"{JOB_FILE} skipped ({why})")
        return self._job

    def job_name(self) -> str | None:
        return self.job_dir.name if self.job_dir is not None else None

    def first_event(self, stream: Stream) -> dict | None:
        """(``TraceReader.first_event``) The first line of the stream's oldest segment (every
        segment starts with the meta)."""
        segs = self.streams().get(stream)
        if not segs:
            return None
        try:
            with open(segs[0].path, "rb") as f:
                ev = orjson.loads(f.readline(MAX_JOB_FILE))
        except (OSError, orjson.JSONDecodeError):
            return None
        return ev if isinstance(ev, dict) else None

    def take_shard(self, shard: Shard) -> None:
        super().take_shard(shard)
        self._listed, self._segment_names, self._streams = None, frozenset(), {}  # (listed again, as a part)

    def shared_with_group(self) -> bool:
        return self.job_dir is not None and modes_of(self.job_dir) == GROUP

    #: A listing is trusted while the directory's mtime stays put and is older than this when
    #: listed (a filesystem with coarse timestamps may not move it for a file made within)
    LIST_TRUST_S = 2.0
    #: ... and no longer than this: a file written again under its name while the directory's
    #: mtime did not move (a network filesystem's clock, a touched-back directory) is seen
    #: within it, though the reader holds its files open (``OpenFiles``: a listing lets go
    #: of a file its name no longer names).  16k streams: a listing of ~30 ms, this often
    LIST_AGAIN_S = 30.0

    def streams(self) -> dict[Stream, list[Segment]]:
        """The job's streams, (rank, incarnation) -> its segments oldest first, in stream
        order.  Listed again only when the directory changed (a job of 16k ranks is not 16k
        stats per poll)."""
        if self.job_dir is None:
            self.job_dir = resolve_job_dir(self.path)
            if self.job_dir is None:
                return {}
        try:
            mtime = os.stat(self.job_dir).st_mtime_ns
        except OSError as exc:
            self._lost_sight(exc)
            return {}
        now = time.time()
        if self._listed is not None and self._listed[0] == mtime and \
                self._listed[1] - mtime / 1e9 > self.LIST_TRUST_S and now - self._listed[1] < self.LIST_AGAIN_S:
            self._list_error = None  # (there again, its listing trusted: a later failure is said again)
            return self._streams
        try:
            with os.scandir(self.job_dir) as it:
                entries = list(it)
        except OSError as exc:
            self._lost_sight(exc)
            return {}
        self._list_error = None
        parsed = []
        names = []  # (the names of ``parsed``)
        self._summaries = {}
        self._crash_names = []
        keyed: set[tuple[Stream, int]] = set()
        known = self._names
        if len(known) > 4 * len(entries) + 1024:  # (names long gone: forgotten)
            known.clear()
        shard = self.shard
        for entry in entries:
            name = entry.name
            got = known.get(name)
            if got is None:
                got = known[name] = self._name(name)
            if got is _OTHER:
                crash = CRASH_FILE.match(name)
                if crash and self.owns(int(crash.group(1))):
                    self._crash_names.append(name)
                continue
            if isinstance(got, _Keys):
                keyed.add((got.stream, got.number))
                continue
            summary = isinstance(got, _Summary)
            if shard is not None and not shard.owns((got.stream if summary else got[0])[0]):
                continue  # (another part's: ``Shard``)
            try:  # a regular file, or a symlink to one: the directory entry says so without a stat
                ok = entry.is_file() or stat.S_ISREG(os.stat(entry.path).st_mode)
            except OSError:
                continue
            if not ok:
                if name not in self._refused:  # a FIFO would block the reader: never open it
                    self._refused.add(name)
                    self.stats.warnings.append(f"{name} is not a regular file; skipped")
            elif summary:
                self._summaries[got.stream] = got.path
            else:
                parsed.append(got)
                names.append(name)
        self._let_go(entries)
        self._keyed = keyed
        listed = frozenset(names)
        if listed != self._segment_names:  # (the same segments: grouped as they were, ~half a listing's cost)
            self._streams = segments.grouped(parsed)
            self._segment_names = listed
        self._listed = (mtime, now)
        self._summaries_due = True
        return self._streams

    def _lost_sight(self, exc: OSError) -> None:
        """The job's directory cannot be looked at: every file held is let go (the space of
        deleted ones goes with them).  Gone, the rest of each segment this reader was part of
        the way through is read first, through what it holds (``_rescue``), as when a listing
        no longer names it: what it reads there is not lost.  Before, a reader that found the
        directory gone lost it, and one that first looked once some writers had started their
        files again read it: the count depended on when it looked."""
        if exc.errno == errno.ENOENT:
            self._let_go([])
        self._files.drop_all()
        self._cannot_list(exc)

    def _cannot_list(self, exc: OSError) -> None:
        """The job's directory could not be listed (gone, no permission, no descriptors
        left): said once until it is listed again, or fails otherwise (a poll reads nothing
        meanwhile, and a console would otherwise just wait)."""
        why = f"cannot list {self.job_dir}: {exc.strerror or exc}"
        if why != self._list_error:
            self._list_error = why
            self.stats.warnings.append(why)

    def _let_go(self, entries: list[os.DirEntry]) -> None:
        """The files held open (``_files``) that a new listing no longer names, or names with
        another inode than the one held (a file written again under its name: an atomic
        replace), let go of; a segment retention deleted while this reader was part of the
        way through it is read to its end first, through what is held (``_rescue``)."""
        if not len(self._files):
            return
        for path in self._files.stale({entry.name: entry.inode() for entry in entries}):
            self._rescue(path)
            self._files.forget(path)

    def _rescue(self, path: str) -> None:
        """The rest of a segment deleted while this reader was reading it (held open since it
        read part of it, ``_read_segment``), read now, before its file is let go: its events
        come first in the next poll, with what the stream was in when it ended (``_carried``).
        Without it, an op begun in the part read and done in the rest stayed in flight for
        good, and a console behind blamed its peers for a hang (helper-63); what is not held
        (no descriptor left for it) is still counted as lost, in proportion, when its
        summary is read.  A file written again under its name is not one."""
        got = self._names.get(os.path.basename(path))
        if not isinstance(got, tuple):
            return
        stream, seg = got
        if self._reading.get(stream) != seg.number or str(seg.path) != path or os.path.exists(path):
            return
        self._carried.extend(self._read_segment(stream, seg.path, None, final=True)[0])

    def _name(self, name: str) -> tuple[Stream, Segment] | _Summary | _Keys | object:
        """What a file of the job directory is, by its name: a segment of a stream (with
        its segment), a stream's summary, or ``_OTHER``; kept by ``streams`` per name, so a
        listing of 16k files that changed parses and joins only the new names."""
        assert self.job_dir is not None
        seg = segments.parse(name)
        if seg is not None:
            return segments.segment_of(seg, name, self.job_dir)
        summary = segments.parse_summary(name)
        if summary is not None:
            return _Summary(summary, self.job_dir / name)
        keys = keyframes.parse_keys(name)
        return _OTHER if keys is None else _Keys(*keys)

    def _current(self, stream: Stream, segs: list[Segment]) -> Segment:
        """The segment of ``stream`` being read: the oldest one left from the one last read on
        (retention deletes segments under a reader that is behind), or before the stream is
        read, the one the window starts with.  A lookup: reading moves on (``_enter``)."""
        number = self._reading.get(stream)
        if number is None:
            return segs[window_start(segs, self._since_s())]
        last = segs[-1]
        if last.number == number and (len(segs) == 1 or segs[-2].number < number):  # (16k streams a poll)
            return last
        return next((seg for seg in segs if seg.number >= number), last)

    def _enter(self, stream: Stream, segs: list[Segment]) -> Segment:
        """The segment to read ``stream`` in (``_current``), entered if it is new to this
        reader: the window's first (those before it counted as skipped), or the one left after
        those deleted under it (what was not read of them, their summaries say).  What the
        stream was in when the segment before it ended is carried in first."""
        number = self._reading.get(stream)
        cur = self._current(stream, segs)
        if number is None:
            for seg in segs:
                if seg is cur:
                    break
                self.stats.count_skipped(stream[0], size_of(seg.path))
            if segs[0] is not cur:
                self._skipped[stream] = (segs[0].number, cur.number)
            elif cur.number and (first := self._asked_from(stream, segs)) == cur.number:
                self._skipped[stream] = (first, first)  # (the window starts in it: none before it is asked for)
            elif cur.number and first < cur.number:
                self._unlisted[stream] = [(first, cur.number)]
            # (its first segment, from its first line: the meta's ``ring`` says where its blocks start)
            self._decoder(stream).from_start = cur.number == 0 and not self._read_of.get((stream, 0))
            after_id = -1
        elif cur.number > number:
            after_id = self.max_op_id(stream)
            self._jumps.setdefault(stream, []).append(Jump(number, cur.number, after_id, self._position(stream)))
            self._unlisted.setdefault(stream, []).append((number, cur.number))
            self._decoder(stream).ring_open = True  # (what it jumped over, the summaries count)
        else:
            return cur
        key = self._keyframe(stream, cur) if number is None else None
        meta = segments.meta_of(cur.path) if key is not None else None
        if key is not None and meta is not None:  # (the window starts at a keyframe: ``_start_at_key``)
            self._reading[stream] = cur.number
            self._start_at_key(stream, cur, key, meta)
            return cur
        if cur.number > 0:  # (the lines before it are skipped or summarized, not read: ``_rebase``)
            self._rebase.add(stream)
        self._reading[stream] = cur.number
        if cur.number > 0:
            self._carry(stream, cur, segs, after_id)
        return cur

    def _keyframe(self, stream: Stream, seg: Segment) -> keyframes.Keyframe | None:
        """The keyframe of ``seg`` a window starts ``stream`` at (``store/keyframes.py``): the
        newest written before the window's start; None without a window, or where the segment
        has none (the listing names its file), or none before it."""
        since = self.since_ns
        if since is None:
            return None
        got = self._keyframes.get(stream)
        if got is None or got[:2] != (seg.number, since):
            got = self._keyframes[stream] = (seg.number, since, self._keyframe_at(stream, seg, since))
        return got[2]

    def _keyframe_at(self, stream: Stream, seg: Segment, since_ns: int) -> keyframes.Keyframe | None:
        """(``_keyframe``) of a window from ``since_ns``, looked up."""
        if self.job_dir is None or (self._keyed is not None and (stream, seg.number) not in self._keyed):
            return None
        return keyframes.at_or_before(keyframes.keys_path(self.job_dir, stream, seg.number), since_ns,
                                      size_of(seg.path))

    def _start_at_key(self, stream: Stream, seg: Segment, key: keyframes.Keyframe, meta: bytes) -> None:
        """Read ``stream`` from a keyframe of ``seg``: the rank's ``meta`` (the segment's first
        line) and what the rank is in there (its carry) first, then the segment from its
        offset; the bytes before it skipped as a window's segments before are, and its lines
        taken as accounted for, as a segment's meta says them where a reader starts at it
        (``_rebase``)."""
        self._read_of[(stream, seg.number)] = key.offset
        self._decoder(stream).from_start = False
        self.stats.count_skipped(stream[0], key.offset)
        if self.counts_lines:
            self._lines_read[stream] = key.lines_before + key.lines
            self._rebased_at[stream] = Rebased(seg.number, key.lines_before)
        self._take_carry(stream, meta + key.carry)

    def _carry(self, stream: Stream, entered: Segment, segs: list[Segment], after_id: int = -1) -> None:
        """The ops in flight when the segment before ``entered`` ended (``store/inflight.py``):
        the stream is read after it, so what they are in comes first.  Where its closer has
        not written that carry (yet, or ever: a rank that died just after a new segment), it
        is made here from the segments before (``inflight.made``, of ``segs``): a window on
        a job's tail, read as soon as the job ended, blamed the rank whose peer crashed as
        crashed itself, its last all_reduce not known (CI, test_restarts).  ``after_id``: the
        stream's ops up to this id are read already (a reader jumping over deleted segments):
        their begins are not read twice, what else they reached is, and the recorder's drops
        it read are not counted again (``inflight.as_read``).  Where there is no carry, a
        segment its writer started again after a loss needs none (``inflight.starts_again``:
        it restates what the rank was in, and its marker says the loss, and what it could not
        restate): before, a read after a deleted job directory warned that segment 0's was
        not known, beside the deletion its marker stated."""
        number = entered.number - 1
        data = inflight.carried(self.job_dir, stream, number) if self.job_dir is not None else None
        if data is not None and not inflight.whole(data):
            # (cut or damaged: made again, as a missing one is; retention reads it as it is)
            self.stats.warnings.append(f"rank {stream[0]}: the carry of segment {number} is damaged (not as its "
                                       f"closer wrote it, {len(data):,} bytes): made again from the segments "
                                       "before it, where they are")
            data = None
        if data is None:
            try:
                again = inflight.starts_again(read_from(entered.path, 0, inflight.HEAD_BYTES))
            except OSError:
                again = False
            if not again and self.job_dir is not None:
                data = inflight.made(self.job_dir, stream, segs, number)
        if data is None:
            if not again and os.path.exists(entered.path):
                self.stats.count_uncarried(stream[0], number)
            # (else retention deleted the segment entered, then the carry before it, since the
            # listing: the next listing jumps over it with the carry it kept; a check of a
            # healthy live job said what a rank was in not known, exit 1, helper-204)
            return
        self._take_carry(stream, data, after_id)

    def _take_carry(self, stream: Stream, data: bytes, after_id: int = -1) -> None:
        """A carry's events, to come first in the next poll (``_carry``, ``_start_at_key``)."""
        if data:
            pieces, self._pieces = self._pieces, None  # (its events are not the stream's read: ``_in_one_order``)
            read = self.drops_read(stream)  # (before the carry's own line counts)
            try:
                events = inflight.as_read(self.ingest(stream, data).events, read)
            finally:
                self._pieces = pieces
            self._carried.extend(e for e in events if not (
                e["type"] == "op" and e["phase"] == "begin" and e["id"] <= after_id))

    def _decoder(self, stream: Stream) -> BlockDecoder:
        """The stream's block decoder, which notes the gaps in its ring positions
        (``BlockDecoder.gaps``): nothing else says that a line of a directory's stream went
        (deleted or lost from its file), where a Redis stream's entry numbers do."""
        decoder = super()._decoder(stream)
        decoder.counts_gaps = True
        return decoder

    def _count_store_lost(self, stream: Stream, dropped: list[Event]) -> None:
        """What a ``store_lost`` marker says the store lost.  One inside a file (a copy's) says
        the lines lost there.  A writer's, first in the file it started again, says every line its writer
        wrote before it (``DirectoryWriter.write``), in the segment it starts again and in
        those before, which are its lines and not counted again as segments gone
        (``_count_segments_gone``); less the lines of the stream this reader read before it
        (``_lines_before``: a console that read them before the job directory was deleted
        lost only those it had not), and those before the segment it started at, which it
        skipped or counted as summarized (``_rebase``).  Counted once, and from then on all of them accounted
        for.  Before, a store of several segments counted the segments gone besides the
        marker's count (19 for 18), and a console counted what it had read as lost."""
        for e in dropped:
            if not (said_by_store(e) and e.get("entries")):
                continue
            if stream not in self._lines_before and stream not in self._uncounted:
                # (inside a file: a copy's, the lines its source had lost, ``commands/copy.py``; a
                # writer's comes first in a file it started again.  Taken as a writer's, it set the
                # lines read to its count, and the next segment's meta counted lines cut: 184 of 189)
                self.stats.count_lost_lines(stream[0], int(e["entries"]), str(e["reason"])[len(STORE_LOST) + 2:])
                continue
            number = self._reading.get(stream, 0)  # (the segment it starts again: those before are its)
            self._count_unlisted_gone(stream)  # (but those before the lines it takes against: ``_rebase``)
            self._gone_upto[stream] = max(self._gone_upto.get(stream, 0), number)
            rank, entries = stream[0], int(e["entries"])
            read = min(self._lines_before.pop(stream, 0), entries)
            why = str(e["reason"])[len(STORE_LOST) + 2:]
            if stream in self._uncounted:
                self._uncounted.discard(stream)
                why += " (at most: the workers of this whole read did not count the lines they read before it)"
            if entries > read:
                self.stats.count_lost_lines(rank, entries - read, why)
            else:
                self.stats.warnings.append(f"rank {rank}: {why} (this reader had read all {entries:,} line(s) "
                                           "before: none lost)")
            self._lines_read[stream] = entries

    def _account(self, stream: Stream, got: Decoded, size: int, lost_markers: bool = True,
                 summaries: bool = True) -> None:
        """``TraceReader._account``, and the gaps the stream's decoder found in its ring
        positions counted as lines lost (``ReadStats.count_lost_lines``), but one a line
        counted otherwise stands for: a damaged or invalid line, or a ``dropped`` event (the
        recorder's drops, a writer's ``store_lost`` marker), among these lines or the last
        chunk's (a block's line, damaged, leaves a gap after it).  Their order within a chunk
        is not known here: a gap and such a line of another kind in one chunk count once."""
        super()._account(stream, got, size, lost_markers, summaries)
        decoder = self._block_decoders.get(stream) if hasattr(self, "_block_decoders") else None
        if decoder is None:
            return
        gone = self._gone_excuse.get(stream, 0) if decoder.gaps else 0  # (the first gap after them)
        if gone:
            del self._gone_excuse[stream]
        left, lost = gaps_not_counted(decoder.gaps, got, self._excused.pop(stream, 0) + gone)
        decoder.gaps = []
        if left:
            self.stats.count_gaps(stream[0], len(left), sum(left))
            if self.counts_lines:  # (lines accounted for: a segment's end cut off counts past them, ``_count_cut``)
                self._lines_read[stream] = self._lines_read.get(stream, 0) + len(left)
        if lost:  # (kept for the next chunk's: a block's line damaged at the end of this one)
            self._excused[stream] = lost

    def _window(self, streams: dict[Stream, list[Segment]]) -> dict[Stream, tuple[int, list[int]]]:
        """Per stream, the segment it is read in (``_current``) and the sizes of the segments
        from it on: what is left to read, for sizes and the split of a parallel read."""
        out = {}
        for stream, segs in streams.items():
            if segs:
                seg = self._current(stream, segs)
                sizes = [size_of(s.path) for s in segs if s.number >= seg.number]
                key = self._keyframe(stream, seg) if stream not in self._reading else None
                if key is not None:  # (read from there: ``_enter``)
                    sizes[0] = max(0, sizes[0] - key.offset)
                out[stream] = (seg.number, sizes)
        return out

    def total_bytes(self) -> int:
        """Bytes to read in the job's streams now, from the segment each is read in (for
        progress bars: ask before reading)."""
        return sum(sum(sizes) for _, sizes in self._window(self.streams()).values())

    def backlog_bytes(self) -> int:
        """Bytes written but not yet returned by ``poll`` (how far behind a follower is).  A
        stream the last poll found read to its end counts nothing until a poll looks again
        (``_tails``): no stat of each of 16k streams to say a follower that keeps up is."""
        rest = {stream: segs for stream, segs in self.streams().items() if self._tail(stream, segs) is None}
        return sum(sum(sizes) - min(sizes[0], self._read_of.get((stream, cur), 0))
                   for stream, (cur, sizes) in self._window(rest).items())

    def rank_count(self) -> int:
        return len({rank for rank, _ in self.streams()})

    def _tail(self, stream: Stream, segs: list[Segment]) -> tuple[Segment, str, int] | None:
        """The stream's tail (``_tails``) while it is still in its newest segment, else None."""
        tail = self._tails.get(stream)
        return tail if tail is not None and segs and tail[0] is segs[-1] else None

    def start_at(self, since: Since) -> None:
        """Start each stream at the segment holding the window's start; a duration counts
        back from the job's newest write."""
        self.since_ns = self._start_of(since)

    def _start_of(self, since: Since) -> int:
        """Where a window starts: its time, or a duration back from the job's newest write
        (``latest_ns``: a stat of each stream, asked only where the window has no time)."""
        return since.at_ns if since.at_ns is not None else since.start_ns(self.latest_ns() or time.time_ns())

    def window_start_ns(self) -> int | None:
        return self.since_ns

    def read_again(self, since: Since) -> float | None:
        """(``TraceReader.read_again``) From the listing and the segments' sizes: each
        stream's segments from the one holding this reader's window's start to its newest,
        against those from the one holding ``since``'s (counted as ``start_at`` counts it).
        Every stream weighs what it costs: a rank's stopped incarnation, or one that exited,
        is read again whole by any window (its newest segment is read whatever the window)."""
        streams = self.streams()
        theirs = self._start_of(since)
        mine = self.since_ns
        read = again = 0
        for stream, segs in streams.items():
            if segs:
                a, b = window_start(segs, self._since_s()), window_start(segs, theirs / 1e9)
                sizes = [size_of(seg.path) for seg in segs[a:]]
                at = self._keyframe(stream, segs[a]) if mine is not None else None
                sizes[0] -= min(sizes[0], at.offset if at is not None else 0)
                read += sum(sizes)
                later = sizes[max(0, b - a):]
                if later and b >= a:  # (where in its first segment the new window starts: a keyframe of it)
                    key = self._keyframe_at(stream, segs[b], theirs)
                    skip = key.offset - (at.offset if at is not None and b == a else 0) if key is not None else 0
                    later[0] -= min(later[0], max(0, skip))
                again += sum(later)
        return again / read if read else None

    def watermark_ns(self) -> int | None:
        asked = time.time_ns()
        streams = self.streams()
        if streams:
            return self._watermark_of(streams)
        # a part of the streams (``Shard``) whose listing holds none of its own: each of them
        # (none) read as of then; a listing that failed cannot tell
        listed = self.shard is not None and self.job_dir is not None and self._list_error is None
        return asked if listed and self._listed is not None else None

    def latest_ns(self) -> int:
        """When the job last wrote (the newest segment's mtime over its streams), 0 if never:
        what a window relative to the trace's end counts from."""
        latest = 0
        for segs in self.streams().values():
            if segs:
                try:
                    latest = max(latest, os.stat(segs[-1].path).st_mtime_ns)
                except OSError:
                    pass
        return latest

    def poll(self, max_bytes: int | None = None) -> list[Event]:
        """New complete events from the rank files since the last call.  With a budget, the
        streams take turns: a poll stops once ``max_bytes`` are read (at least 64 KiB of a
        stream, so each goes on), and the next starts with the stream after the last read.
        A stream read to its end whose newest file kept its size costs one look at that size
        (``_tails``; an lseek of the file held): a poll of 16k streams with nothing new takes
        ~45 ms here."""
        out: list[Event] = []
        budget = max_bytes
        self._vanished.clear()  # (those of this poll)
        with gc_paused():  # see events.gc_paused: 2x faster on large batches
            streams = list(self.streams().items())
            n = len(streams)
            start = self._next % n if n and budget is not None else 0
            self.queue_chunks()  # (the streams' new lines decoded together, after the round)
            began, quiet, size_of_file = time.time_ns(), [], self._quiet_size or self._files.size
            if n > self._room_asked:
                self._room_asked = n
                self._files.reserve(n)
            try:
                tails = self._tails
                for k in range(n):
                    stream, segs = streams[(start + k) % n]
                    tail = tails.get(stream)  # (``_tail``, inline: 16k streams a round)
                    size = None
                    if tail is not None and segs and tail[0] is segs[-1]:
                        try:
                            size = size_of_file(tail[1])
                        except OSError:
                            pass
                        if size == tail[2]:
                            quiet.append(stream)
                            continue
                    events, used = self._read_stream(stream, segs, budget, size=size)
                    out.extend(events)
                    if self.queue_full():
                        out.extend(self.decode_queued())
                        self.queue_chunks()
                    if budget is not None:
                        budget -= used
                        if budget <= 0:
                            self._next = start + k + 1
                            break
            finally:
                out.extend(self.decode_queued())
                self._read_to_end_all(quiet, began)
            out.extend(self._read_summaries())
            if self._carried:
                out[:0] = self._carried  # (what streams read from a later segment were in first)
                self._carried = []
            out.extend(self._crashes.poll(self.job_dir, self._caught_up, names=self._crash_names))
            out.extend(self._remnants(final=False))
        self.stats.partial_tail = sum(self._partial.values())
        return out

    #: A stream's summary file holds a line per deleted segment: never read more than this a poll
    MAX_SUMMARY_READ = 64 << 20

    def _read_summaries(self) -> list[Event]:
        """``summary`` events (what retention deleted), each decided once: one whose segment
        this reader never read stands for that segment (counted with what it lost,
        ``ReadStats.count_summary``, and handed on); one whose
        segment it read all of stands for nothing; one whose segment went while being read
        stands for the part not read (counted as lost, its events in proportion to the
        bytes); one whose segment still exists waits (``_pending``).  Looked at only once the
        directory was listed again (``_summaries_due``): retention writes a summary before it
        deletes the segment, and every deletion changes the directory; until then a summary
        waits or stands for nothing either way."""
        if not self._summaries_due:
            return []
        self._summaries_due = False
        out: list[Event] = []
        for stream, path in list(self._summaries.items()):
            offset = self._summary_offsets.get(stream, 0)
            try:
                data = read_from(path, offset, self.MAX_SUMMARY_READ)
            except OSError:
                continue
            if len(data) == self.MAX_SUMMARY_READ:
                self._summaries_due = True  # (more next poll)
            cut = data.rfind(b"\n") + 1
            if not cut:
                continue
            self._summary_offsets[stream] = offset + cut
            for e in self.ingest(stream, data[:cut], cut, summaries=False).events:
                if e["type"] == "summary" and isinstance(e.get("seg"), int):
                    self._pending.setdefault((stream, e["seg"]), e)
        restarted: dict[int, list[Stream]] | None = None  # ranks with several incarnations listed (once a call)
        for key, e in list(self._pending.items()):
            stream, seg = key
            alive = any(s.number == seg for s in self._streams.get(stream, []))
            read = self._read_of.get(key, 0)
            if alive and read < int(e.get("size") or 0):
                continue  # the segment is still there, and this reader may still read it
            del self._pending[key]
            if key in self._decided:
                continue  # (a second line for one segment: a child stopped between its two steps)
            self._decided.add(key)
            size = int(e.get("size") or 0)
            events = int(e.get("events") or 0) + int(e.get("damaged") or 0) + sum((e.get("invalid") or {}).values())
            if not read:
                upto = self._read_before(stream, seg)
                if upto >= 0:
                    if restarted is None:
                        restarted = self._restarted()
                    ids = self._own_ids(stream, restarted.get(stream[0], ()))
                    if ids is not None:
                        out.extend(retention.completions(e, upto, ids))
                e = retention.counted(e, upto)
                skipped = self._skipped.get(stream)
                if skipped is not None and skipped[0] <= seg < skipped[1]:
                    # counted as skipped before the window while it was there; deleted since, it is
                    # what its summary says (reading without the window would not read it now)
                    self.stats.uncount_skipped(stream[0], size)
                self.stats.count_summary(stream[0], e)
                out.append(e)
            else:
                if read < size:
                    lost = round(events * (size - read) / size)
                    self.stats.count_missing(stream[0], lost)
                    self.stats.warnings.append(f"rank {stream[0]}: retention deleted segment {seg} while this "
                                               f"reader was reading it: about {lost:,} of its {events:,} events not read")
                if e.get("cut") and key not in self._cut_counted:  # (its end cut off: not counted on the way on)
                    self._cut_counted.add(key)
                    self.stats.count_cut(stream[0], e)
        return out

    def _restarted(self) -> dict[int, list[Stream]]:
        """The streams of each rank with more than one incarnation listed; asked once for all
        the summaries a call decides (a rank at a time, 16k streams each)."""
        of: dict[int, list[Stream]] = {}
        for stream in self._streams:
            of.setdefault(stream[0], []).append(stream)
        return {rank: streams for rank, streams in of.items() if len(streams) > 1}

    def _own_ids(self, stream: Stream, incarnations: Sequence[Stream]) -> range | None:
        """The op ids a completion from ``stream``'s summaries may name (None: none): any,
        where the rank has one incarnation; where it has several (``incarnations``), those
        of the stream's own incarnation (the recorder numbers them from ``incarnation << 40``
        on), while no other incarnation of the rank read so far reached into them: a
        completion is paired by rank and id, and closing another incarnation's op in flight
        would hide its hang."""
        if len(incarnations) < 2:
            return retention.ANY_ID  # (ids as the trace has them)
        if stream[1] < 0:
            return None
        own = incarnation_ids(stream[1])
        if any(self.max_op_id(other) in own for other in incarnations if other != stream):
            return None
        return own

    def _read_before(self, stream: Stream, seg: int) -> int:
        """The highest op id of ``stream`` this reader read before the deleted segment ``seg``
        (-1: none), which it read none of: it jumped over the segment or left it unread (or
        will, having read the stream up to it), with every id up to the one it had read then
        read.  A stream's ops are read in the order of their ids, and an op carried into
        ``seg`` was carried from every segment since its begin, the carry the reader started
        with included."""
        for jump in self._jumps.get(stream, ()):
            if jump.left <= seg < jump.entered:  # (the one it left too: none of it was read)
                return jump.after_id
        number = self._reading.get(stream)
        return self.max_op_id(stream) if number is not None and number <= seg else -1

    def _remnants(self, final: bool) -> list[Event]:
        """What ranks of this job that died on this host left in their spools
        (``TraceReader.spool_remnants``): forwarded to their rank files where this reader may
        write (then gone from the spool directory, and in the trace for every reader), else
        only read."""
        if self.job_dir is None:
            return []
        job, root = self.job_dir.name, str(self.job_dir.parent)

        def writer(rank: int, inc: int) -> DirectoryWriter:
            return DirectoryWriter(root, job, rank, incarnation=inc, resume=True)

        forwarded, left = self.spool_remnants(job, root, writer, final)
        out: list[Event] = []
        if forwarded:
            self._listed = None  # a stream may be new
            out.extend(self._read_each())
        for events in left.values():
            out.extend(events)
        return out

    def _read_each(self, final: bool = False) -> list[Event]:
        """The rest of every stream (``final``: of those with a torn last line only, read as
        it is), outside a poll: what ``_carried`` holds first (the rest of a segment a new
        listing found deleted while it was read, ``_rescue``), each stream's carry before its
        events (``_enter``)."""
        out: list[Event] = []
        for stream, segs in self.streams().items():
            if final and not self._partial.get(stream):
                continue
            got = self._read_stream(stream, segs, None, final=final)[0]
            out.extend(self._carried)
            self._carried = []
            out.extend(got)
        out.extend(self._carried)
        self._carried = []
        return out

    def _caught_up(self, rank: int) -> bool:
        """Everything of the rank's stream is read (a crash file's events come after it)."""
        segs = self.streams().get((rank, 0))
        if not segs:
            return True
        cur = self._current((rank, 0), segs)
        return cur.number == segs[-1].number and size_of(cur.path) <= self._read_of.get(((rank, 0), cur.number), 0)

    #: listings again a whole read makes at most for streams whose segment vanished as it was
    #: read (each a retention pass that deleted the next oldest as this reader reached it),
    #: while they move on
    RELISTS = 1000

    def read_all(self) -> list[Event]:
        """Everything in the job (from the window on), treating an incomplete last line as
        truncated."""
        self._summaries_due = True
        events = self.poll()
        for _ in range(self.RELISTS):
            if not self._vanished:
                break
            # (a segment retention deleted as it was read: listed again, the stream jumps over
            # it and reads on; before, a whole read stopped the stream there, helper-204; and
            # again while it moves on, retention deleting the next as it reached it)
            at = {st: self._reading.get(st) for st in self._vanished}
            events.extend(self.poll())
            if all(self._reading.get(st) == n for st, n in at.items() if st in self._vanished):
                break  # (no stream moved on: listing again will not either)
        for stream in sorted(self._vanished):  # (not read to its end: what it missed is not known; helper-207)
            self.stats.unread_by_rank[stream[0]] = self.stats.unread_by_rank.get(stream[0], 0) + 1
            self.stats.warnings.append(f"rank {stream[0]}: retention deleted its segments as this read reached them, "
                                       "and the rest of its stream was not read: what it holds after is not known")
        while self._summaries_due:  # (summary files longer than a poll reads: all of them, before any is gone)
            offsets = dict(self._summary_offsets)
            events.extend(self._read_summaries())
            if self._summary_offsets == offsets:
                break  # (a line longer than ``MAX_SUMMARY_READ``: never read)
        events.extend(self._read_each(final=True))
        events.extend(self._crashes.poll(self.job_dir, self.owns, final=True))
        events.extend(self._remnants(final=True))
        self._count_segments_gone()
        self.stats.partial_tail = 0
        return events

    def _summarized_in_file(self, stream: Stream) -> set[int]:
        """The segment numbers ``stream``'s summary file names after what this reader read of
        it (``_summary_offsets``: those are in ``_pending`` or ``_decided``), read apart from
        the summaries' reading (nothing counted), to its end; empty where it has none or
        cannot be read.  Before, only its first ``MAX_SUMMARY_READ`` bytes: the newest
        summaries, those written since the reader read, were never among them."""
        return {e["seg"] for e in self._in_summary_file(stream, self._summary_offsets.get(stream, 0))}

    def _in_summary_file(self, stream: Stream, offset: int) -> Iterator[Event]:
        """The summaries of ``stream``'s summary file from ``offset`` to its end (decoded as
        they are read, ``MAX_SUMMARY_READ`` bytes at a time; none where it cannot be read)."""
        if self.job_dir is None:
            return
        path = self.job_dir / segments.summary_name(*stream)
        while True:
            try:
                data = read_from(path, offset, self.MAX_SUMMARY_READ)
            except OSError:
                return
            cut = data.rfind(b"\n") + 1
            for e in decode_lines(data[:cut], stream[0]).events:  # (the summaries' one decoder)
                if e["type"] == "summary" and isinstance(e.get("seg"), int):
                    yield e
            if len(data) < self.MAX_SUMMARY_READ or not cut:
                return
            offset += cut

    def _count_segments_gone(self) -> None:
        """Segments of a stream that are neither on disk nor summarized by retention (which
        writes a segment's summary before it deletes it): the store lost them, with all they
        held, and says so.  Segment numbers go up by one at each rotation, so a number below
        the newest listed that no file and no summary has is such a segment: before, the
        read went on to the next listed without a word (a rank's first segment gone, 68 of
        its ops, and ``check`` said the trace looked healthy).  Those before a window's
        first segment are not asked for; each is counted once."""
        upto = self._gone_upto
        summarized: dict[Stream, set[int]] = {}
        for stream, n in (*self._decided, *self._pending):
            summarized.setdefault(stream, set()).add(n)
        keyed: dict[Stream, int] = {}  # a stream -> the newest segment its keyframes name
        for stream, n in self._keyed:
            keyed[stream] = max(keyed.get(stream, -1), n)
        for stream, segs in self._streams.items():
            if not segs:
                continue
            first, last = max(self._asked_from(stream, segs), upto.get(stream, 0)), segs[-1].number
            # (the newest gone too, where the store still names it: the keyframes of a segment
            # after the newest listed, or the newest's carry, written once the next began, before
            # the listing: a carry written since may be a rotation the listing did not see,
            # helper-190; its rank read dead, the segment unsaid: helper-187)
            named = max(keyed.get(stream, -1), last + 1 if self._carried_before_listing(stream, last) else -1)
            if named > last:
                last = named + 1
            if last <= first:
                continue
            upto[stream] = last
            self._count_gone(stream, first, last, {s.number for s in segs} | summarized.get(stream, set()))

    def _carried_before_listing(self, stream: Stream, number: int) -> bool:
        """Whether segment ``number`` of ``stream`` has a carry written before this reader's
        listing was made (one stat): its closer writes it once the next segment began, so
        that segment existed when the listing was made."""
        if self.job_dir is None or self._listed is None:
            return False
        try:
            return os.stat(inflight.carry_path(self.job_dir, stream, number)).st_mtime < self._listed[1]
        except OSError:
            return False

    def _asked_from(self, stream: Stream, segs: list[Segment]) -> int:
        """The first segment number of ``stream`` whose absence counts as gone: 0, or where
        the window starts (those before it are not asked for)."""
        first = self._skipped[stream][1] if stream in self._skipped else segs[0].number
        since_s = self._since_s()
        if since_s is not None and first == segs[0].number and first and segs[0].start_s + 1 <= since_s:
            return first  # the window starts in the first segment listed: what was before is not asked for
        return 0 if first == segs[0].number else first  # (0: every segment from the stream's start)

    def _count_unlisted_gone(self, stream: Stream) -> None:
        """The segments of ``stream`` not listed when it was entered (``_unlisted``) and not
        summarized, counted gone before a ``store_lost`` marker takes the segments before its
        own as its lines: it counts only those after the lines this reader took as accounted
        for (``_rebase``), so those before were counted nowhere (the job directory deleted
        after segments deleted by hand: its listing no longer says which were there)."""
        ranges, rebased = self._unlisted.pop(stream, None), self._rebased_at.get(stream)
        if not ranges or rebased is None or not rebased.segment:
            self._rebased_at.pop(stream, None)
            return  # (none taken off: the marker counts the lines of the segments gone)
        upto = self._gone_upto.get(stream, 0)
        known = {n for s, n in (*self._decided, *self._pending) if s == stream}
        for first, last in ranges:  # (those after, into the segment it starts again: the marker's)
            first, last = max(first, upto), min(last, rebased.segment)
            if first < last:
                self._count_gone(stream, first, last, known)
                upto = last
        self._gone_upto[stream] = upto
        del self._rebased_at[stream]

    def _count_gone(self, stream: Stream, first: int, last: int, known: set[int]) -> None:
        """Count as gone the segments of ``stream`` numbered [first, last) that ``known``
        (listed, summarized) and its summary file do not name: each run of them by the lines
        it held that this reader did not read (``_lines_gone``), where the metas around it
        say them, else (no later meta says: a writer from before ``lines_before``, a store
        gone) as one line a segment.  Before, a segment gone counted as one line whatever
        it held (a 2 KiB segment of 21 lines: 1)."""
        count = (last - first) - sum(1 for n in known if first <= n < last)  # (a name may say 10^9)
        if count > 0:  # retention may have summarized and deleted them since the summaries were read,
            # and this reader may have read them before they went
            known = known | self._summarized_in_file(stream) | self._read_past(stream, first, last)
            count = (last - first) - sum(1 for n in known if first <= n < last)
        if count <= 0:
            return
        shown = []
        for n in range(first, last):  # the first few, named
            if n not in known:
                shown.append(n)
                if len(shown) == 8:
                    break
        lines, unknown = 0, 0
        at = first
        for n in [*sorted(n for n in known if first <= n < last), last]:  # (each run of numbers gone: [at, n))
            if at < n:
                held = self._lines_gone(stream, at, n)
                if held is None:
                    unknown += n - at
                else:
                    lines += held
            at = max(at, n + 1)
        self.stats.count_missing(stream[0], lines + unknown)
        names = ", ".join(map(str, shown)) + (f" and {count - len(shown):,} more" if count > len(shown) else "")
        if not unknown:
            what = f"{lines:,} line(s) of them not read are lost"
        elif unknown == count:
            what = "what they held is lost"
        else:
            what = (f"{lines:,} line(s) of them not read are lost, and what {unknown:,} of them held (not known: "
                    "counted as a line each)")
        self.stats.warnings.append(
            f"rank {stream[0]}: {count:,} segment(s) of its stream gone from the store (segment {names}): "
            f"neither on disk nor summarized by retention; {what}")

    def _read_past(self, stream: Stream, first: int, last: int) -> set[int]:
        """The segments of ``stream`` numbered [first, last) that this reader read to their
        end and went on from: none of theirs is lost to it, whatever went since (before, a
        window's segments read, then deleted by hand, were counted gone).  One it jumped
        from is not among them: what it had not read of it is (``Jump.lines``)."""
        reading = self._reading.get(stream, -1)
        left = {jump.left for jump in self._jumps.get(stream, ())}
        if last - first <= len(self._read_of):
            read = [n for n in range(first, last) if (stream, n) in self._read_of]
        else:  # (a name may say 10^9)
            read = [n for s, n in self._read_of if s == stream and first <= n < last]
        return {n for n in read if n < reading and n not in left}

    def _lines_gone(self, stream: Stream, first: int, last: int) -> int | None:
        """The lines of ``stream`` that its segments [first, last), all gone, held and this
        reader did not read: those before ``last`` (its meta's ``lines_before``) less those
        before ``first``, or read of it where this reader jumped from it (``Jump.lines``).
        None where either is not known, or where the metas say fewer lines than the run
        holds segments (each begins with its meta line: a file renamed, another stream's)."""
        end = self._lines_before_segment(stream, last)
        if end is None:
            return None
        jump = next((j for j in reversed(self._jumps.get(stream, ())) if j.left == first), None)
        start = jump.lines if jump is not None else self._lines_up_to(stream, first)
        least = last - first - (jump is not None)  # (the one it jumped from: read, part or all)
        return end - start if start is not None and end - start >= least else None

    def _lines_up_to(self, stream: Stream, number: int) -> int | None:
        """The lines of ``stream`` before its segment ``number`` (gone): 0 before segment 0,
        else the segment before's ``lines_before`` and lines, where it is on disk, or as its
        summary says them (``lines_upto``) where retention deleted it."""
        if number == 0:
            return 0
        prev = next((s for s in self._segments_of(stream) if s.number == number - 1), None)
        if prev is None:
            upto = next((e.get("lines_upto") for e in self._in_summary_file(stream, 0) if e["seg"] == number - 1), None)
            return upto if isinstance(upto, int) else None
        before = self._lines_before_segment(stream, number - 1)
        if before is None:
            return None
        try:
            data = read_from(prev.path, 0, size_of(prev.path))
        except OSError:
            return None
        return before + count_lines(data, len(data)) + (bool(data) and not data.endswith(b"\n"))  # (a torn last line)

    def _segments_of(self, stream: Stream) -> list[Segment]:
        """The segments of ``stream`` as listed, or as a whole read's worker was given them
        (``read_whole``: it lists nothing)."""
        return self._streams.get(stream) or self._given.get(stream, [])

    #: The bytes of a segment's head read for its meta's ``lines_before`` (``_lines_before_segment``)
    HEAD_BYTES = 1 << 16

    def _lines_before_segment(self, stream: Stream, number: int) -> int | None:
        """The lines written to ``stream`` before its segment ``number``: 0 before segment 0,
        else as its meta says (``segments.lines_before``), taken when it was read from its
        start (``_rebased_at``) or read now from the segment on disk, or as its summary says
        where retention deleted it (before, segments deleted by hand before one retention
        deleted since counted a line each: 3 where 194 were lost, helper-173); None where
        nothing says."""
        if number == 0:
            return 0
        rebased = self._rebased_at.get(stream)
        if rebased is not None and rebased.segment == number:
            return rebased.lines
        seg = next((s for s in self._segments_of(stream) if s.number == number), None)
        if seg is None:
            said = next((e.get("lines_before") for e in self._in_summary_file(stream, 0) if e["seg"] == number), None)
            return said if isinstance(said, int) else None
        try:
            return segments.lines_before(read_from(seg.path, 0, self.HEAD_BYTES))
        except OSError:
            return None

    def _position(self, stream: Stream) -> int | None:
        """The lines of ``stream`` before where this reader is in it (read, or taken as
        skipped or summarized: ``_lines_read``), where that is known: it counts lines, and
        does not wait for the meta of a segment it entered to say the lines before
        (``_rebase``)."""
        if not self.counts_lines or stream in self._rebase or stream in self._uncounted:
            return None
        return self._lines_read.get(stream, 0)

    def _read_stream(self, stream: Stream, segs: list[Segment], budget: int | None,
                     final: bool = False, size: int | None = None) -> tuple[list[Event], int]:
        """New events of one stream, going on into its next segments while the budget lasts.
        ``final``: its newest segment gets no more either (``_read_segment``); ``size``: the
        newest segment's, just asked (``poll``)."""
        if not segs:
            return [], 0
        out: list[Event] = []
        used = 0
        began = time.time_ns()
        while True:
            cur = self._enter(stream, segs)
            newer = None if cur is segs[-1] else next((seg for seg in segs if seg.number > cur.number), None)
            events, n, at_end = self._read_segment(stream, cur.path, None if budget is None else budget - used,
                                                   final or newer is not None, size if newer is None else None)
            out.extend(events)
            used += n
            if at_end and newer is None:
                self._read_to_end(stream, began)
                if not self._partial.get(stream):
                    self._tails[stream] = (cur, str(cur.path), self._read_of.get((stream, cur.number), 0))
                    return out, used
            self._tails.pop(stream, None)
            if not at_end or newer is None or (budget is not None and used >= budget):
                return out, used
            self._files.forget(str(cur.path))  # (read to its end: the stream goes on in the next)
            if newer.number > cur.number + 1:
                # segments between gone: the gap in the ring positions they leave is theirs,
                # counted with them on the final read (``_count_segments_gone``), not twice
                self._gone_excuse[stream] = self._gone_excuse.get(stream, 0) + 1
            if newer.number == cur.number + 1:
                self._moved_on[stream] = cur.number
            else:  # (the lines of those gone between are counted with them, at the end: not read here)
                self._resync[stream] = newer.number
            self._reading[stream] = newer.number
            self._partial[stream] = False

    def _read_segment(self, stream: Stream, path: Path, budget: int | None,
                      final: bool = False, size: int | None = None) -> tuple[list[Event], int, bool]:
        """(new complete events of one segment, bytes of them, whether all of it is read now but
        an incomplete last line).  ``final``: the segment gets no more (the writer moved on to
        a newer one): an incomplete last line is read too, as what it is (damaged, and said).
        ``size``: the file's, just asked."""
        rank = stream[0]
        key = (stream, self._reading.get(stream, 0))
        offset = self._read_of.get(key, 0)
        # (the bytes before ``offset`` read again with the rest: the file read on is the one read)
        back = len(self._last_read.get(key, b"")) if offset else 0
        asked = size is not None  # (by ``poll``, of the file it holds if any: read without asking again)
        data: bytes | None = None
        if size is None:  # (read with its size, asked once)
            self._files.hold(str(path))  # (should retention delete it before it is read to its end: ``_rescue``)
            try:
                data, size = self._files.read_sized(str(path), offset - back, back + (
                    sys.maxsize if budget is None else max(budget, self.MIN_READ)))
            except OSError:  # (gone, or not a regular file: as a stat, then a read, say it)
                try:
                    size = os.path.getsize(path)
                except FileNotFoundError:
                    # deleted since the listing (retention): not read to its end, so the stream
                    # is not moved on past it here but by the next listing, which jumps over it
                    # with its carry and what it read before (``_enter``)
                    self._vanished.add(stream)
                    return [], 0, False
                except OSError:
                    return [], 0, True
        if size < offset:
            data = None
            self.stats.warnings.append(f"rank {rank}: {path.name} shrank from {offset} to {size} bytes; "
                                       "re-reading it from the start")
            offset = self._read_of[key] = back = 0
        if size == offset:
            return [], 0, True
        want = size - offset
        if budget is not None:
            want = min(want, max(budget, self.MIN_READ))
        if data is None:
            try:
                data = self._files.read(str(path), offset - back, back + want, sized=asked)
            except OSError as exc:
                self.stats.warnings.append(f"rank {rank}: cannot read {path}: {exc}")
                return [], 0, True
        replaced = bool(back) and data[:back] != self._last_read[key]
        if replaced:  # (written again under its name: read from its start, ``_started_again``)
            offset = self._read_of[key] = 0
            try:
                data = self._files.read(str(path), 0, size if budget is None else min(size, max(budget, self.MIN_READ)),
                                        sized=asked)
            except OSError as exc:
                self.stats.warnings.append(f"rank {rank}: cannot read {path}: {exc}")
                return [], 0, True
        elif back:
            data = data[back:]
        cut = data.rfind(b"\n") + 1
        at_end = offset + len(data) >= size
        torn = at_end and cut < len(data)  # an incomplete last line
        self._partial[stream] = torn and not final
        end = len(data) if torn and final else cut
        if not end:
            return [], 0, at_end
        if not offset and self._rebase and stream in self._rebase:
            self._rebase.discard(stream)
            before = segments.lines_before(data) if self.counts_lines else None
            if before is None and self.counts_lines and inflight.starts_again(data):
                before = self._lines_up_to(stream, key[1])  # (no meta first: as the segment before says)
            if before is not None:
                self._lines_read[stream] = before
                self._rebased_at[stream] = Rebased(key[1], before)
        flushed = self._count_cut(stream, key[1] - 1, data) if not offset and self._moved_on.get(stream) == key[1] - 1 \
            else []
        if not offset and self._resync.get(stream) == key[1]:
            del self._resync[stream]
            before = segments.lines_before(data) if self._position(stream) is not None else None
            if before is not None:
                self._lines_read[stream] = before
        if not offset and cut and inflight.starts_again(data):
            events = self._started_again(stream, key[1], data[:cut], cut)
        else:
            if replaced:
                self.stats.warnings.append(f"rank {rank}: {path.name} was written again under its name; "
                                           "re-reading it from the start")
            events = self.ingest_later(stream, data[:cut], cut) if cut else []
        if flushed:  # (the chunks decoded before this one's: ``_count_cut``)
            events = flushed + events
        if self.counts_lines:
            lines = data.count(b"\n", 0, cut) if cut < _COUNT_BY_NUMPY else count_lines(data, cut)  # (a poll's: inline)
            self._lines_read[stream] = self._lines_read.get(stream, 0) + lines + (end > cut)
        if end > cut:  # (all that line will be)
            before, got = self.ingest_after_queued(stream, data[cut:])
            if got.damaged:
                self.stats.warnings.append(f"rank {rank}: last line of {path.name} is truncated "
                                           f"({end - cut} bytes skipped)")
            events.extend(before)
            events.extend(got.events)
        self._read_of[key] = offset + end
        if end >= self.SAME_FILE_BYTES:
            self._last_read[key] = data[end - self.SAME_FILE_BYTES:end]
        return events, cut, at_end

    def _count_cut(self, stream: Stream, number: int, head: bytes) -> list[Event]:
        """The lines cut off the end of segment ``number`` of ``stream``, which this reader
        read to its end (``_moved_on``): the next one's meta says the lines written before
        it (``segments.lines_before``), and those past the lines read are lost.  Before, a segment
        truncated in its middle counted as one damaged line (its torn last one), and one
        truncated to nothing as one line (its gap): 34 and 65 lines were gone (helper-173).
        Lines gone inside it are its gaps, counted as they are read (``_account``): where its
        chunks wait to be decoded together, they are decoded first, and their events
        returned (to come before this segment's).  The gap the cut leaves in the ring
        positions is at this segment's first block: the ring is opened there (an excuse for
        the next gap anywhere hid a later one where the lines cut held no block, helper-174)."""
        del self._moved_on[stream]
        read = self._position(stream)
        before = segments.lines_before(head) if read is not None else None
        if before is None or read is None or before <= read:
            return []
        if (stream, number) in self._cut_counted:  # (its summary's ``cut`` counted them: helper-175)
            self._lines_read[stream] = before
            self._decoder(stream).ring_open = True
            self._excused.pop(stream, None)
            return []
        flushed: list[Event] = []
        if self._queued and stream in self._queued:
            flushed = self.decode_queued()
            self.queue_chunks()
            read = self._position(stream)
            if read is None or before <= read:
                return flushed
        self.stats.count_lost_lines(stream[0], before - read, f"cut off the end of segment {number} (the next "
                                    f"segment's meta says {before:,} line(s) were written before it; {read:,} read "
                                    "or counted lost)")
        self._lines_read[stream] = before
        self._cut_counted.add((stream, number))
        self._decoder(stream).ring_open = True
        self._excused.pop(stream, None)  # (a torn last line's excuse was for that gap: none now, helper-175)
        return flushed

    #: The bytes a segment's read ends with that its next read reads again: where they differ,
    #: the file is another than the one read (``_read_segment``).  Not its inode: a file deleted
    #: and made again at once often gets the same one back
    SAME_FILE_BYTES = 32

    def _started_again(self, stream: Stream, number: int, raw: bytes, size: int) -> list[Event]:
        """The first chunk of a file its writer started again after the store lost what it
        held (``DirectoryWriter.write``: a ``store_lost`` marker, the rank's meta, what the
        rank was in).  The begins this reader read before it are not read twice (a stream's
        op ids grow: those up to the highest read, ``inflight.without_begins``), what else
        the ops reached is, as the Redis reader takes a restatement (``_take_restated``);
        and its marker's count is taken against the lines read before (``_count_store_lost``).
        Before, a console that had read the file went on at its old offset in the new one (a
        line cut in two, the marker never read), or, the new one shorter, read it again and
        took the restated begins as ops begun again under their ids."""
        before: list[Event] = []
        if self._queued is not None:  # (the stream's chunks queued before it, decoded first)
            before = self.decode_queued()
            self.queue_chunks()
        read = self.max_op_id(stream)
        # (a whole read's worker counts no lines: those before the file, as the segment before or
        # its summary says them; it counted every line the writer wrote, 315 for 21, helper-179)
        self._lines_before[stream] = self._lines_read.get(stream, 0) if self.counts_lines else \
            self._lines_up_to(stream, number) or 0
        return before + self.ingest(stream, inflight.without_begins(raw, read) if read >= 0 else raw, size).events

    def close(self) -> None:
        self._files.close()
        self._room_asked = 0  # (room given back: asked again if polled again)

    # ------------------------------------------------------------------ a whole read, in parallel
    #: Below this many bytes, or with one core, a whole read polls in this process (the workers'
    #: start costs what they save: a job of blocks breaks even at ~100 MB on 2 cores, one of
    #: JSON op events far below) ...
    PARALLEL_MIN_BYTES = 96 << 20
    #: ... or, for a whole read (``bulk``: check, replay, report), this many streams whatever
    #: their bytes: a stream costs a read ~0.35 ms in decoders and tables however short it is
    #: (16k ranks' few events each: check 4.8 s apart on 2 cores against 5.6 s, and apart
    #: takes every core).  Not a console's first read (``read_apart``): at a 16k-rank job's
    #: start its first full read came after 21 s apart against ~8 s polling (bench scale)
    PARALLEL_MIN_STREAMS = 8192
    #: Processes that read a whole read at most: the reading process and its workers
    MAX_READERS = 8
    #: The reading process reads a chunk itself whenever no worker's message waits for it
    #: (``Workers.run``'s ``here``), as a worker would (``read_streams``); else it only ingests
    READS_ITSELF = True
    #: A console's first read of more than four times this many streams looks at the sizes
    #: of this many of them first (every n-th): a job whose bytes they put below a quarter of
    #: ``PARALLEL_MIN_BYTES`` goes to the polls without a stat of every stream (16k streams:
    #: ~0.3 s before the first poll).  A decision about workers only: a job whose bytes lie
    #: in the few streams the sample skips is polled, and reads the same
    SIZE_SAMPLE = 256

    def _bulk(self, step: int) -> Iterator[Batch]:
        """With several cores and a large job, the streams are read apart in worker processes
        (each decodes whole streams into columns, which come back as they are done), so a job
        of 16k ranks is read at the speed of all the cores; ``bulk`` then goes on from where
        they stopped (``read_all_batch``)."""
        apart = self._apart(step, whole=True)
        if apart is None:
            yield from super()._bulk(step)
            return
        yield from apart
        # (what follows is the whole read's last poll: it looks at each stream's size without
        # holding the files, where opening the 4,096 a worker read to their ends cost ~50 ms)
        self._quiet_size = os.path.getsize

    def read_apart(self, step: int) -> Iterator[Batch]:
        apart = self._apart(step, whole=False)
        return apart if apart is not None else iter(())

    def _apart(self, step: int, whole: bool) -> Iterator[Batch] | None:
        """The streams read apart in workers (``_bulk_parallel``), or None where that is not
        worth it: one core, a small job (of few streams, for a ``whole`` read), or one read
        already.  The reading process is one of the readers (``Workers.run``'s ``here``): a
        worker a core but one."""
        readers = min(self.MAX_READERS, cores())
        if os.environ.get(ENV_WORKERS, "").isdigit():
            readers = int(os.environ[ENV_WORKERS])
        workers = readers - 1
        streams = self.streams()
        if workers < 1 or self._reading or len(streams) < 2:
            return None  # (read apart only a job not read yet: each worker starts its streams afresh)
        pool = None
        if len(streams) > 4 * self.SIZE_SAMPLE:
            some = dict(list(streams.items())[::len(streams) // self.SIZE_SAMPLE])
            guess = sum(sum(sizes) for _, sizes in self._window(some).values()) * len(streams) / len(some)
            if not whole and guess < self.PARALLEL_MIN_BYTES / 4:
                return None
            if guess >= 2 * self.PARALLEL_MIN_BYTES or (whole and len(streams) >= self.PARALLEL_MIN_STREAMS):
                # (now: they start, ~0.13 s of imports, while every segment's size is asked;
                # as many as the chunks of about ``step`` bytes the guess makes)
                pool = Workers(min(workers, int(guess // max(step, 1)) + 1))
        try:
            window = self._window(streams)
        except BaseException:  # (the workers started are ended, not left waiting for jobs)
            if pool is not None:
                pool.close()
            raise
        if sum(sum(sizes) for _, sizes in window.values()) < self.PARALLEL_MIN_BYTES and (
                not whole or len(streams) < self.PARALLEL_MIN_STREAMS):
            if pool is not None:
                pool.close()
            return None
        return self._bulk_parallel(streams, window, step, workers, not whole, pool)

    def _bulk_parallel(self, streams: dict[Stream, list[Segment]], window: dict[Stream, tuple[int, list[int]]],
                       step: int, workers: int, counts_lines: bool = False,
                       pool: Workers | None = None) -> Iterator[Batch]:
        """``counts_lines``: the workers count the lines they read (``Job.counts_lines``), for a
        reader that goes on reading (``read_apart``); a whole read reads nothing after them.
        ``pool``: workers started already (as many as a guess of the chunks: one may get none).
        Such a read ends with the summaries (``_read_summaries``), as a poll does: before, they
        waited for the console's first poll, and a job directory deleted meanwhile (a
        ``store_lost`` marker) counted every segment retention had summarized before the
        segment a worker entered as gone, with its lines."""
        jobs: list[Job] = []
        chunk: dict[Stream, list[Segment]] = {}
        size = 0
        for stream, segs in streams.items():
            if size >= step and chunk:
                jobs.append(Job(str(self.job_dir), self.since_ns, chunk, counts_lines))
                chunk, size = {}, 0
            chunk[stream] = segs
            size += sum(window.get(stream, (0, []))[1])
        if chunk:
            jobs.append(Job(str(self.job_dir), self.since_ns, chunk, counts_lines))
        for stream, segs in streams.items():  # (what each worker counts as skipped: ``_enter``)
            if stream in window and segs[0].number < window[stream][0]:
                self._skipped[stream] = (segs[0].number, window[stream][0])
            elif stream in window and (first := window[stream][0]) and self._asked_from(stream, segs) == first:
                self._skipped[stream] = (first, first)
        if pool is None:
            pool = Workers(min(workers, len(jobs)))
        self.stats.workers += len(pool.procs)
        self.stats.jobs += len(jobs)

        def here(job: Job) -> StreamsRead:  # (a job this reader takes, read as a worker reads it)
            read = read_streams(job)
            self.stats.jobs_here += 1  # (one that failed comes back to ``read_whole``, not counted)
            return read

        for got in pool.run(jobs, here if self.READS_ITSELF else None):
            if isinstance(got, Job):  # no worker could read it: this reader does
                batch = self.read_whole(got.streams)
                if batch.count():
                    yield batch
                continue
            self._adopt(got)
            yield got.received()
        if counts_lines:  # (a console's: what retention deleted read with the streams, as a poll does)
            summaries = self._read_summaries()
            if summaries:
                yield Batch(summaries, [])

    def _since_s(self) -> float | None:
        return self.since_ns / 1e9 if self.since_ns is not None else None

    def read_whole(self, streams: dict[Stream, list[Segment]]) -> Batch:
        """Read ``streams`` (with their segments) to their ends, op records in columns (what is
        written meanwhile, the whole read's last batch reads: ``read_all_batch``): a stream's
        JSON op events too, where columns say them exactly (``jsonops``: a worker sends them
        back as arrays, not dicts), and its heartbeats and samples (``Batch.beats``)."""
        self.columnar = True
        self._given = streams
        events: list[Event] = []
        entries: list[beats.Entry | None] = []  # (None: the next of ``rows``' entries)
        rows: list[tuple[int, list[beatscan.Taken]]] = []  # the streams whose heartbeats and samples are rows
        made: list[beats.Entry] = []  # their entries, made ``ENTRIES_HELD`` bytes of chunks at a time
        held = 0
        ranks = Counter(stream[0] for stream in streams)  # (a rank's incarnations keep theirs as dicts: in order)
        self._pieces = {}
        try:
            with gc_paused():
                for stream, segs in streams.items():
                    had = len(getattr(self, "_ops", ()))
                    got = self._read_stream(stream, segs, None)[0]
                    pieces = self._pieces.pop(stream, [])
                    if any(p.taken is not None for p in pieces):
                        kinds = beatscan.kept(got, several=ranks[stream[0]] > 1)
                        if kinds:
                            got, pieces = self._beats_back(stream, got, pieces, kinds)
                    taken = [p.taken for p in pieces if p.taken is not None]
                    got = self._in_one_order(got, pieces)
                    if len(getattr(self, "_ops", ())) == had:  # (no records: its op events, if any, are dicts)
                        got = self._columns_of_events(stream, got)
                    if taken:  # (its heartbeats and samples taken by ``of_events``' rules are all rows)
                        rows.append((stream[0], taken))
                        entries.append(None)
                        held += sum(len(t.data) for t in taken)
                        if held > self.ENTRIES_HELD:  # (their chunks' bytes let go)
                            made += beatscan.entries(rows)
                            rows.clear()
                            held = 0
                    elif ranks[stream[0]] == 1:
                        entry, got = beats.of_events(stream[0], got)
                        if entry is not None:
                            entries.append(entry)
                    events.extend(got)
        finally:
            self._pieces = None
        made += beatscan.entries(rows)
        one = iter(made)
        batch = Batch(self._carried + events, *self._take_ops(),
                      beats.joined([e if e is not None else next(one) for e in entries]))
        self._carried = []
        return batch

    #: ``read_whole`` makes the entries of streams whose heartbeats and samples are rows
    #: together (``beatscan.entries``) once their chunks hold this many bytes, and lets the
    #: chunks go
    ENTRIES_HELD = 4 << 20

    #: While ``read_whole`` reads: per stream, each chunk's ``Piece``
    _pieces: dict[Stream, list[Piece]] | None = None

    def _decode_columns(self, stream: Stream, raw: bytes, scanned: Scan | None) -> Decoded:
        """A whole read's chunk with its JSON op lines in columns (``jsonops.decode_chunk``),
        where the scanner reads them, and its heartbeats and samples as rows
        (``beatscan``); else as ``ingest`` decodes it."""
        if self._pieces is None:
            return super()._decode_columns(stream, raw, scanned)
        decoder = self._decoder(stream)
        chunk = jsonops.decode_chunk(raw, stream[0], decoder.table) if scanned is None else None
        if chunk is None:
            got = decode_alone(raw, decoder, scanned, beats=True)
        else:
            rest = chunk.decoded
            got = decode_stream(rest._replace(ops=None), decoder, columns=True)._replace(ops=rest.ops)
        self._pieces.setdefault(stream, []).append(Piece(len(got.events), chunk, got.beats))
        return got

    @staticmethod
    def _beats_back(stream: Stream, events: list[Event], pieces: list[Piece], kinds: frozenset[int]
                    ) -> tuple[list[Event], list[Piece]]:
        """A stream's events with the rows of ``kinds`` its chunks took put back among them,
        as dicts (``beatscan.back``), and its pieces with their new counts and the rows left:
        where a kind stays events (``beatscan.kept``), so the model takes them in the order
        they were written."""
        out: list[Event] = []
        again = []
        at = 0
        for n, chunk, taken in pieces:
            part = events[at:at + n]
            at += n
            if taken is not None:
                part, taken = beatscan.back(part, taken, stream[0], kinds)
            out.extend(part)
            again.append(Piece(len(part), chunk, taken))
        assert at == len(events)  # (every event of the stream's read came from one of its pieces)
        return out, again

    def _in_one_order(self, events: list[Event], pieces: list[Piece]) -> list[Event]:
        """A stream's events as read, where some chunks put their op events in columns and
        another kept op events as dicts (one columns do not say): those records back to
        dicts among the events in line order, so the stream's op events are all dicts, in
        order, as a read without the scanner gives them; else ``events``."""
        if not any(p.chunk is not None for p in pieces) or not any(
                p.chunk is None and any(e["type"] == "op" for e in events[at - p.events:at])
                for p, at in zip(pieces, np.cumsum([p.events for p in pieces]).tolist(), strict=True)):
            return events
        out: list[Event] = []
        gone: list[OpRecords] = []
        at = 0
        for n, chunk, _ in pieces:
            part = events[at:at + n]
            at += n
            if chunk is None:
                out.extend(part)
                continue
            recs = chunk.decoded.ops
            assert recs is not None
            gone.append(recs)
            both = sorted(zip([*chunk.event_lines.tolist(), *chunk.op_lines.tolist()], range(n + len(recs)),
                              [*part, *recs.events()], strict=True), key=itemgetter(0, 1))
            out.extend(e for _, _, e in both)
        assert at == len(events)  # (every event of the stream's read came from one of its pieces)
        self._ops = [o for o in self._ops if not any(o is g for g in gone)]
        return out

    def _columns_of_events(self, stream: Stream, events: list[Event]) -> list[Event]:
        """A stream's events with its op events taken out as its records (``jsonops``), where
        columns say every one of them; else as they are."""
        ops, rest = jsonops.split(events)
        recs = jsonops.of_events(stream[0], ops, self._decoder(stream).table) if ops else None
        if recs is None:
            return events
        self._keep_ops(recs)
        return rest

    def decoder_states(self) -> dict[Stream, DecoderState]:
        return {s: DecoderState(d.names, d.dtypes, d.seen_end, d.groups, d.sites, d._gid_of_id, d.ring_open,
                                d.from_start)
                for s, d in getattr(self, "_block_decoders", {}).items()}

    def _adopt(self, got: StreamsRead) -> None:
        """Go on from where a worker stopped reading its streams (this reader read none of them)."""
        self.stats.merge(got.stats)
        # (where each stream ended: a poll after it finds the quiet ones by their size alone,
        # the segment as this reader listed it)
        listed = self._streams
        for stream, (number, size) in (got.tails or {}).items():
            segs = listed.get(stream)
            if segs and segs[-1].number == number:
                self._tails[stream] = (segs[-1], str(segs[-1].path), size)
        self._reading.update(got.reading)
        self._read_of.update(got.read_of)
        self._partial.update(got.partial)
        for stream, top in got.max_ids.items():
            self._raise_max_id(stream, top)
        self.drops_read_of().update(got.drops_read or {})
        if got.lines_read is None:  # (a whole read's workers: ``read_streams``)
            self._uncounted.update(got.reading)
        else:
            self._lines_read.update(got.lines_read)
        self._gone_upto.update(got.gone_upto or {})
        self._last_read.update(got.last_read or {})
        self._rebase.update(got.rebase or ())
        self._rebased_at.update(got.rebased_at or {})
        self._unlisted.update(got.unlisted or {})
        self._gone_excuse.update(got.gone_excuse or {})
        self._excused.update(got.excused or {})
        self._moved_on.update(got.moved_on or {})
        self._resync.update(got.resync or {})
        self._cut_counted.update(got.cut_counted or ())
        for stream, st in got.decoders.items():
            decoder = self._decoder(stream)
            decoder.adopt(st.names, st.dtypes, st.seen_end, st.groups, st.sites, st.waiting)
            decoder.ring_open, decoder.from_start = st.ring_open, st.from_start  # (not ``not seen_end``: a ring from 0)


def read_streams(job: Job) -> StreamsRead:
    """Read a job's streams to their ends, as a worker of ``DirectoryReader.bulk`` does
    (``bulkread.TARGET``): what it read, and where each stream stopped."""
    r = DirectoryReader(job.job_dir, since_ns=job.since_ns)
    r._statics = _worker_table(job.job_dir)
    # (a whole read's counts no lines: ~1 GB/s, a fifth of a worker's time at 4k ranks, for a
    # ``store_lost`` marker read after it, which a whole read does not read; one it reads, first
    # in a file its writer started again, is taken against the lines before that file as the
    # segment before says them, ``_started_again``; a console's first read does count them, its
    # polls going on: ``_count_store_lost`` takes a marker against them)
    r.counts_lines = job.counts_lines
    batch = r.read_whole(job.streams)
    going_on = job.counts_lines  # (what a marker read after it is taken against: not a whole read's)
    return StreamsRead(batch, r.stats, dict(r._reading), dict(r._read_of), dict(r._partial), r.decoder_states(),
                       dict(getattr(r, "_max_ids", {})), drops_read=dict(r.drops_read_of()),
                       lines_read=dict(r._lines_read) if going_on else None, gone_upto=dict(r._gone_upto),
                       last_read=dict(r._last_read),
                       rebase=frozenset(r._rebase) if going_on else None,
                       rebased_at=dict(r._rebased_at) if going_on else None,
                       unlisted=dict(r._unlisted) if going_on else None,
                       gone_excuse=dict(r._gone_excuse), excused=dict(r._excused),
                       moved_on=dict(r._moved_on) if going_on else None,
                       resync=dict(r._resync) if going_on else None,
                       cut_counted=frozenset(r._cut_counted) if going_on else None,
                       tails={stream: (seg.number, size) for stream, (seg, _path, size) in r._tails.items()})


#: A worker's table of statics (``read_streams``), kept from one job to the next of one job
#: directory: ``kept``, (job directory, table), a thread's own (two threads of one process
#: reading apart at once would otherwise share one table, which is not made for that)
_TABLES = threading.local()
#: ... while it holds no more statics than this (each job's message carries them all: a job
#: whose every rank has signatures of its own starts each job afresh, as before)
TABLE_KEPT_STATICS = 256


def _worker_table(job_dir: str) -> StaticTable:
    """The table of statics a worker's job starts from: the last job's, where that read the
    same job directory and holds few statics, else a new one.  Its table prefixes walked and
    its signatures decoded then serve the next job's streams too (a table is content-keyed:
    ``StaticTable``): each job's first stream learnt them all again, ~1.5 ms where a stream
    takes ~0.6.  The reading process keeps one too, for the chunks it reads itself
    (``_bulk_parallel``'s ``here``): one table a thread of at most ``TABLE_KEPT_STATICS`` statics."""
    kept: tuple[str, StaticTable] | None = getattr(_TABLES, "kept", None)
    if kept is None or kept[0] != job_dir or len(kept[1].statics) > TABLE_KEPT_STATICS:
        kept = _TABLES.kept = (job_dir, StaticTable())
    return kept[1]
