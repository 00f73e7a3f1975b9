"""What every store backend provides: a per-rank writer and a whole-job reader."""

from __future__ import annotations

import abc
import dataclasses
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import numpy as np
import orjson

from commscope import beatscan
from commscope.beats import Beats
from commscope.blocks import (
    LINE_PREFIX,
    BlockDecoder,
    Joined,
    StaticTable,
    Together,
    decode_alone,
    decode_stream,
    decode_together,
)
from commscope.blockscan import Scan
from commscope.events import FR_OVERWRITE, Decoded, Event, decode_lines, running_drops
from commscope.oprecords import OpRecords, Spans, Unpacked, packed
from commscope.schema import MAX_REASONS, SCHEMA_VERSION, decode_indexed
from commscope.window import Since


class StoreError(Exception):
    """A store cannot be opened, written or read.  Messages never contain secrets.

    ``written`` counts the leading events of a failed batch that did reach the store,
    so a retry neither loses nor duplicates them.
    """

    def __init__(self, message: str, written: int = 0):
        super().__init__(message)
        self.written = written


#: A job id: a single path component / key part that cannot name anything outside its store
#: ('.', '..', separators, absolute paths): letters, digits, '_', '.', '-', not starting with '.'.
JOB_NAME = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,119}$")


def is_job_name(job: object) -> bool:
    return isinstance(job, str) and JOB_NAME.fullmatch(job) is not None


def check_job_name(job: str) -> str:
    """``job`` if it is a valid job id, else StoreError (a job may never escape its store)."""
    if not is_job_name(job):
        raise StoreError(f"bad job id {str(job)[:130]!r}: use 1-120 letters, digits, '_', '.', '-', "
                         "not starting with '.'")
    return job


@dataclasses.dataclass
class ReadStats:
    """What a reader has seen so far; shown by the console and ``check``."""

    events: int = 0
    bytes: int = 0
    corrupt: int = 0  # damaged lines/entries skipped (not JSON: torn writes, corruption)
    corrupt_by_rank: dict[int, int] = dataclasses.field(default_factory=dict)
    invalid: int = 0  # well-formed JSON that failed the schema (commscope.schema), skipped
    invalid_by_rank: dict[int, int] = dataclasses.field(default_factory=dict)
    invalid_by_reason: dict[str, int] = dataclasses.field(default_factory=dict)
    missing_by_rank: dict[int, int] = dataclasses.field(default_factory=dict)  # entries the store lost or trimmed
    #: streams of a rank whose store may have lost entries it cannot count yet (a Redis Cluster
    #: master that failed over since the writer last wrote: the writer says what it lost when it
    #: writes again); the trace is not whole meanwhile.  A follower takes a stream back out once
    #: it is settled (its writer wrote again)
    unsettled_by_rank: dict[int, int] = dataclasses.field(default_factory=dict)
    #: streams of a rank that the store holds less of than a follower read (Redis restarted
    #: without persistence, or flushed, since): what it lost that was not read yet is not known
    #: until the writer writes again (and says it); taken back out then
    emptied_by_rank: dict[int, int] = dataclasses.field(default_factory=dict)
    #: streams of a rank whose read began at a later segment (the oldest left, a window's
    #: first) with what the rank was in there not known (the carry of the segment before, and
    #: that segment, gone): an op begun before may be missing, so the trace is not whole
    uncarried_by_rank: dict[int, int] = dataclasses.field(default_factory=dict)
    #: streams of a rank whose writer said no end, on a Redis node that refuses writes for lack
    #: of memory or refused some since it started: their last events may never have reached
    #: it (a rank gone so has lost some, how many not known); found again on every look
    refused_by_rank: dict[int, int] = dataclasses.field(default_factory=dict)
    #: streams of a rank a whole read could not read to their end (retention deleted their
    #: segments as fast as the read reached them): what the rank did after is not known
    unread_by_rank: dict[int, int] = dataclasses.field(default_factory=dict)
    partial_tail: int = 0  # ranks whose last line is still incomplete
    #: events of segments retention deleted (store/retention.py), which their summaries stand for
    summarized: int = 0
    summarized_by_rank: dict[int, int] = dataclasses.field(default_factory=dict)
    #: bytes of segments before the window the reader was asked to read (``since``): not read
    skipped_bytes: int = 0
    skipped_by_rank: dict[int, int] = dataclasses.field(default_factory=dict)
    #: events before the window still in the store and not read, of streams whose bytes there
    #: are not known (a Redis stream that ``maxlen`` trimmed before its mark: the mark's bytes
    #: count the trimmed part too); ``skipped_bytes`` counts the others'
    skipped_events: int = 0
    skipped_events_by_rank: dict[int, int] = dataclasses.field(default_factory=dict)
    #: events before the window no longer in the store (trimmed by Redis ``maxlen``, or lost):
    #: not skipped, gone; a read without the window would not read them either
    gone_before_window: int = 0
    gone_before_window_by_rank: dict[int, int] = dataclasses.field(default_factory=dict)
    trimmed: bool = False  # the backend dropped old events (Redis maxlen)
    warnings: list[str] = dataclasses.field(default_factory=list)
    chunks: int = 0  # reads of a stream that brought something (a poll of 16k streams: up to 16k)
    records: int = 0  # of ``events``, the op records read in columns (the rest: event dicts)
    workers: int = 0  # worker processes a whole read started (``store/bulkread.py``)
    jobs: int = 0  # chunks of streams a whole read handed out (``bulkread.Job``) ...
    jobs_here: int = 0  # ... of which the reading process read these itself (``Workers.run``'s ``here``)

    def count_corrupt(self, rank: int, n: int) -> None:
        if n:
            self.corrupt += n
            self.corrupt_by_rank[rank] = self.corrupt_by_rank.get(rank, 0) + n

    def count_summarized(self, rank: int, events: int) -> None:
        self.summarized += events
        self.summarized_by_rank[rank] = self.summarized_by_rank.get(rank, 0) + events

    def count_missing(self, rank: int, n: int) -> None:
        self.missing_by_rank[rank] = self.missing_by_rank.get(rank, 0) + n

    def count_skipped(self, rank: int, nbytes: int) -> None:
        if nbytes > 0:  # (a rank in ``skipped_by_rank`` is one with bytes skipped: ``_ZERO_IS_NONE``)
            self.skipped_bytes += nbytes
            self.skipped_by_rank[rank] = self.skipped_by_rank.get(rank, 0) + nbytes

    def count_skipped_events(self, rank: int, n: int) -> None:
        if n > 0:
            self.skipped_events += n
            self.skipped_events_by_rank[rank] = self.skipped_events_by_rank.get(rank, 0) + n

    def count_gone_before_window(self, rank: int, n: int) -> None:
        if n > 0:
            self.gone_before_window += n
            self.gone_before_window_by_rank[rank] = self.gone_before_window_by_rank.get(rank, 0) + n

    def uncount_skipped(self, rank: int, nbytes: int) -> int:
        """``nbytes`` of ``rank``'s skipped bytes (``count_skipped``) taken back out, at most
        what the rank has skipped: a segment before the window that retention deleted since,
        whose summary now stands for it (counted once, as summarized: reading without the
        window would not read it now).  Returns the bytes taken out."""
        had = self.skipped_by_rank.get(rank, 0)
        out = min(max(nbytes, 0), had)
        if out:
            self.skipped_bytes -= out
            if had == out:
                del self.skipped_by_rank[rank]
            else:
                self.skipped_by_rank[rank] = had - out
        return out

    def count_invalid(self, rank: int, reasons: Mapping[str, int]) -> None:
        """Add skipped invalid events of ``rank`` by reason (at most MAX_REASONS distinct)."""
        for reason, n in reasons.items():
            if not n:
                continue
            self.invalid += n
            self.invalid_by_rank[rank] = self.invalid_by_rank.get(rank, 0) + n
            self._add_reason(reason, n)

    def _add_reason(self, reason: str, n: int) -> None:
        """``n`` more invalid events of ``reason``: past MAX_REASONS distinct ones, "other"'s
        (what one reader counts, and readers of parts merged: a hostile trace cannot grow
        the stats)."""
        if reason not in self.invalid_by_reason and len(self.invalid_by_reason) >= MAX_REASONS:
            reason = "other"
        self.invalid_by_reason[reason] = self.invalid_by_reason.get(reason, 0) + n

    def count_decoded(self, rank: int, decoded: Decoded) -> None:
        """Account one decoded batch of ``rank``: its events, damaged lines and invalid events."""
        self.events += decoded.count()
        self.records += len(decoded.ops) if decoded.ops is not None else 0
        self.count_corrupt(rank, decoded.damaged)
        self.count_invalid(rank, decoded.invalid)

    def count_store_lost(self, rank: int, dropped: list[Event]) -> None:
        """Count what a writer's ``store_lost`` markers among ``dropped`` events say the store
        lost (a directory store deleted and recreated under a running rank)."""
        for e in dropped:
            if said_by_store(e) and e.get("entries"):
                self.count_lost_lines(rank, int(e["entries"]), str(e["reason"])[len(STORE_LOST) + 2:])

    def count_uncarried(self, rank: int, number: int) -> None:
        """What ``rank`` was in when its segment ``number`` ended, where its read began, is not
        known (``uncarried_by_rank``).  Before, a warning alone: a hang begun before, its
        carry deleted by hand, read healthy, exit 0 (helper-177)."""
        self.uncarried_by_rank[rank] = self.uncarried_by_rank.get(rank, 0) + 1
        self.warnings.append(f"rank {rank}: what it was in when segment {number} ended is not known (not carried, "
                             "and a segment before it is gone): an op begun before may be missing")

    def count_lost_lines(self, rank: int, n: int, why: str) -> None:
        """``n`` lines of ``rank``'s stream the store lost, as a writer's ``store_lost`` marker
        says (read, or kept by the summary of a segment retention deleted), and why."""
        self.count_missing(rank, n)
        self.warnings.append(f"rank {rank}: {n} line(s) of its stream were lost: {why}")

    def count_gaps(self, rank: int, n: int, nbytes: int, where: str = "") -> None:
        """``n`` gaps in the ring positions of ``rank``'s blocks, ``nbytes`` of op records in
        all: each a line gone from its file (``blocks.gaps_not_counted``), ``where`` if not
        in what was read."""
        self.count_lost_lines(rank, n, f"{'a gap' if n == 1 else f'{n} gaps'} in its ring positions: {nbytes:,} "
                                       f"bytes of op records missing (a line gone from its file{where})")

    def count_cut(self, rank: int, summary: Event) -> None:
        """The lines a ``summary`` says were cut off the end of its segment (``cut``), which
        retention deleted since."""
        self.count_lost_lines(rank, int(summary["cut"]), f"cut off the end of segment {summary['seg']} (which "
                                                          "retention deleted since)")

    def count_summary(self, rank: int, summary: Event) -> None:
        """What a ``summary`` (a segment retention deleted, which this reader never read)
        stands for: its events, and what the segment lost, as a read of it would count it."""
        self.count_summarized(rank, int(summary.get("events") or 0))
        self.count_corrupt(rank, int(summary.get("damaged") or 0))
        self.count_invalid(rank, summary.get("invalid") or {})
        deleted = f"in segment {summary['seg']}, which retention deleted since"
        if summary.get("entries"):
            self.count_lost_lines(rank, int(summary["entries"]), f"{str(summary.get('reason') or 'unknown')} ({deleted})")
        if summary.get("gaps"):
            self.count_gaps(rank, int(summary["gaps"]), int(summary.get("gap_bytes") or 0), f"; {deleted}")
        if summary.get("cut"):
            self.count_cut(rank, summary)

    def merge(self, other: ReadStats) -> None:
        """Add what another reader of other streams of the same job saw (a parallel read)."""
        for f in dataclasses.fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if isinstance(mine, bool):
                setattr(self, f.name, mine or theirs)
            elif isinstance(mine, int):
                setattr(self, f.name, mine + theirs)
            elif f.name == "invalid_by_reason":
                for k, v in theirs.items():
                    self._add_reason(k, v)
            elif isinstance(mine, dict):
                for k, v in theirs.items():
                    mine[k] = mine.get(k, 0) + v
            elif isinstance(mine, list):
                mine.extend(theirs)

    def changes(self, sent: ReadStats) -> ReadStats:
        """What changed since ``sent`` (this reader's stats as they were, kept by ``take``):
        the numbers as they are now, each per-rank or per-reason count that changed, the
        warnings added after ``sent``'s.  Counts only grow and warnings are only added, so a
        read process sends this after each batch, not the whole: a window over 16k ranks
        counts each one's skipped bytes and may warn about each, 2 MB a batch to pickle.  A
        count taken back out (``uncount_skipped``) is sent as it is now, one gone as 0."""
        out = dataclasses.replace(self)
        for name in _COUNTS_OF:
            mine, was = getattr(self, name), getattr(sent, name)
            if mine == was:
                setattr(out, name, {})
                continue
            changed = {k: v for k, v in mine.items() if was.get(k) != v}
            changed.update((k, 0) for k in was.keys() - mine.keys())
            setattr(out, name, changed)
        out.warnings = self.warnings[len(sent.warnings):]
        return out

    def add_changes(self, changes: ReadStats, was: ReadStats) -> None:
        """What ``changes`` (``ReadStats.changes`` of one of several readers of other
        streams of the job, whose stats were ``was`` before them) adds to these, the sum of
        those readers' (``merge``, as their numbers change): a console's read processes,
        each reading a part of a wide job's streams (``readahead``)."""
        for f in dataclasses.fields(self):
            mine, theirs, before = getattr(self, f.name), getattr(changes, f.name), getattr(was, f.name)
            if isinstance(mine, bool):
                setattr(self, f.name, mine or theirs)
            elif isinstance(mine, int):
                setattr(self, f.name, mine + theirs - before)
            elif f.name == "invalid_by_reason":
                for k, v in theirs.items():
                    self._add_reason(k, v - before.get(k, 0))
            elif isinstance(mine, dict):
                for k, v in theirs.items():
                    mine[k] = mine.get(k, 0) + v - before.get(k, 0)
                    if not mine[k] and f.name in _ZERO_IS_NONE:
                        del mine[k]
            elif isinstance(mine, list):
                mine.extend(theirs)

    def take(self, changes: ReadStats) -> None:
        """What ``changes`` says changed (``ReadStats.changes`` of the reader these stats
        stand for), taken: these stats are then that reader's."""
        for f in dataclasses.fields(self):
            theirs = getattr(changes, f.name)
            if isinstance(theirs, dict):
                mine = getattr(self, f.name)
                mine.update(theirs)
                if f.name in _ZERO_IS_NONE:
                    for k in [k for k, v in theirs.items() if not v]:
                        del mine[k]
            elif isinstance(theirs, list):
                getattr(self, f.name).extend(theirs)
            else:
                setattr(self, f.name, theirs)

    def lost_by_rank(self) -> dict[int, int]:
        """Damaged plus invalid events skipped, per rank."""
        out = dict(self.corrupt_by_rank)
        for r, n in self.invalid_by_rank.items():
            out[r] = out.get(r, 0) + n
        return out


#: ``ReadStats``' counts per rank or per reason (dicts that only grow)
_COUNTS_OF = tuple(f.name for f in dataclasses.fields(ReadStats) if str(f.type).startswith("dict"))
#: of those, the ones where a rank counted is a rank with some (its count taken back out to
#: 0 is no entry: ``check`` says how many ranks skipped bytes)
_ZERO_IS_NONE = frozenset({"skipped_by_rank", "unsettled_by_rank", "emptied_by_rank", "refused_by_rank"})


#: A ``dropped`` event whose reason starts so was written by a writer that found its
#: stream gone or shorter than what it had written (the store restarted empty, the job
#: directory was deleted): ``entries`` lines were lost, not dropped by the recorder.
STORE_LOST = "store_lost"


def store_lost(rank: int, entries: int, why: str, ts: int | None = None) -> bytes:
    """The marker a writer puts first in a stream it had to start again (``ts``: now), or a
    copy where its source had lost lines (``ts``: where it stands among the rank's events)."""
    return orjson.dumps({"type": "dropped", "v": SCHEMA_VERSION, "rank": rank, "ts": time.time_ns() if ts is None else ts,
                         "count": 0, "entries": entries, "reason": f"{STORE_LOST}: {why}"})


def meta_line(lines: list[bytes]) -> bytes | None:
    """The rank's ``meta`` among the first lines a writer is given (it comes first), kept
    to be stated again after a ``store_lost`` marker."""
    return next((x for x in lines[:4] if b'"type":"meta"' in x), None)


def said_by_store(e: Event) -> bool:
    """Whether a ``dropped`` event is a writer's ``store_lost`` marker (``store_lost``)."""
    return str(e.get("reason", "")).startswith(STORE_LOST)


def is_recorder_drop(e: Event) -> bool:
    """Whether a ``dropped`` event says the recorder dropped events: not a writer's
    ``store_lost`` marker (what the store lost: ``ReadStats.count_store_lost``) nor Flight
    Recorder's ring overwritten (no event lost)."""
    return not str(e.get("reason", "")).startswith((FR_OVERWRITE, STORE_LOST))


def recorder_drops(so_far: int, dropped: Iterable[Event]) -> int:
    """The recorder's drops so far (``so_far``) with ``dropped`` events taken
    (``events.running_drops``), those that are its (``is_recorder_drop``)."""
    for e in dropped:
        if is_recorder_drop(e):
            so_far = running_drops(so_far, e)
    return so_far


def is_store_lost(line: bytes) -> bool:
    return b'"reason":"' + STORE_LOST.encode() in line


class StoreWriter(Protocol):
    """Owned by one rank's recorder thread; never called from the training hot path."""

    description: str
    #: the job it writes (a store URL may pin it: ``redis://...?job=NAME``)
    job: str
    #: a directory of this machine beside the stream, where a crash file may go (None: a server)
    crash_dir: Path | None
    #: seconds the recorder lets pass between writes (0: every tick): a server shared by a
    #: wide job asks its ranks to write less often, so it sees a bounded rate of requests
    write_every: float
    #: what the user should know about the store, found at open (a Redis that evicts keys when
    #: full); the recorder warns it once.  None: nothing
    warning: str | None

    @property
    def stored(self) -> int:
        """Lines (entries) this writer has put into its stream so far."""

    def write(self, lines: list[bytes]) -> None:
        """Persist encoded events (``events.encode``, no newline) in order.

        Raises StoreError on failure; its ``written`` says how many leading lines landed.
        """

    def first_event(self) -> dict | None:
        """The stream's first event (its meta), None when empty or unreadable."""

    def close(self) -> None: ...


#: A stream: (rank, incarnation).  A rank that initialises its process group again in one
#: process starts a new incarnation, and a stream of its own.
Stream = tuple[int, int]


class Shard(NamedTuple):
    """The part of a job's streams one of ``count`` readers reads (a console's read
    processes, ``readahead``: a wide job's first read and polls at the speed of several
    cores): the ranks ``rank % count == index``, every incarnation of a rank together.
    Another part's streams are not its to read, nor their crash files, nor what their dead
    ranks left in spools that could not be forwarded (``TraceReader.spool_remnants``)."""

    index: int
    count: int

    def owns(self, rank: int) -> bool:
        return rank % self.count == self.index


class Size(NamedTuple):
    """How much a job holds, for a progress bar: ``amount`` in ``unit``, "bytes" (the bar
    counts ``ReadStats.bytes``) or "events" (it counts the events read)."""

    amount: int
    unit: str


class Batch(NamedTuple):
    """What one read returned, for a consumer that takes op records in columns
    (``TraceReader.poll_batch``): the events, and the op records of the blocks, one
    ``OpRecords`` per stream read (in its order)."""

    events: list[Event]
    ops: Sequence[OpRecords]
    #: Where every op record is a slice of one set of columns (a poll decoded together): the
    #: records as arrays (``TraceModel.ingest`` takes them so); None otherwise
    spans: Spans | None = None
    #: Heartbeats and samples in columns (``beats.Beats``: not among the events), a whole
    #: read's or a poll's (``TraceReader.poll_batch``)
    beats: Beats | None = None

    def in_one_piece(self) -> Spans | None:
        """Its op records in one set of columns, as a process sends them to another (ten
        arrays, not ten a stream): their ``spans`` where those are them, else packed
        (``oprecords.packed``); None where there are none or they cannot go so."""
        if not self.ops:
            return None
        return self.spans if self.spans is not None and self.spans.of(self.ops) else packed(self.ops)

    @staticmethod
    def of_piece(events: list[Event], piece: Spans, beats: Beats | None) -> Batch:
        """A batch whose op records came in one piece (``in_one_piece``): each stream's a
        view of it, made when asked (``Unpacked``), the piece its ``spans`` (the model takes
        them as arrays)."""
        return Batch(events, Unpacked(piece), piece, beats)

    def count(self) -> int:
        n = len(self.events) + (self.beats.events() if self.beats is not None else 0)
        if self.spans is not None and self.spans.of(self.ops):
            return n + int(self.spans.start[-1] - self.spans.start[0])
        return n + sum(len(o) for o in self.ops)


#: The type of a mark ``decode_queued_streams`` puts where a chunk's rows were taken, its
#: chunk's events after it, together in every reader's poll (``TraceReader._beats_apart``
#: takes them out): compared by identity, no event's type is it
_ROWS = "rows taken"


def _spans_of(records: list[OpRecords]) -> Spans | None:
    """``records`` as ``Spans`` where they lie back to back, in order, in one set of
    columns (a poll decoded together: ``blocks.decode_together``); None otherwise."""
    first = records[0].span if records else None
    if first is None:
        return None
    whole = first.whole
    k = len(records)
    starts = np.fromiter((o.span.start if o.span is not None and o.span.whole is whole else -1 for o in records),
                         np.int64, k)
    sizes = np.fromiter(map(len, records), np.int64, k)
    if (starts < 0).any() or not np.array_equal(starts[1:], starts[:-1] + sizes[:-1]):
        return None
    return Spans(whole, np.append(starts, starts[-1] + sizes[-1]), np.fromiter((o.rank for o in records), np.int64, k))


class TraceReader(abc.ABC):
    """Reads one job.  Every reader (directory, Redis, Flight Recorder dumps, test and
    placeholder readers) derives from this class, so consumers (``tui/feed.py``,
    ``commands/copy.py``) call every method directly, never probing for one.

    ``poll_batch``/``read_all_batch`` return the same as ``Batch``es: the op records of
    blocks stay in numpy columns (``oprecords.OpRecords``), not one dict each, and so do
    the heartbeats and samples of the streams a poll decoded together (``Batch.beats``,
    taken by the model after the events: ``_beats_apart`` keeps that exact); the model
    ingests them as they are.  A reader is read one way or the other, not both.

    ``poll`` returns only events not returned before, in per-rank order, reading about
    ``max_bytes`` of stored data at most (None: everything there is; a reader that cannot
    bound its reads returns everything).  ``read_all`` also returns what ``poll`` holds
    back (an incomplete last line, taken as truncated): call it once, at the end.

    A store's reader only fetches each stream's raw data and hands it to ``ingest``, the
    one pipeline every store shares: validate and redact (``events.decode_lines``), decode
    ``block`` events (``blocks.decode_stream``, with one decoder per stream) and count what
    was skipped or lost in ``stats``.
    """

    description: str = ""
    stats: ReadStats
    #: Whether a writer's ``store_lost`` marker is what counts the events a store lost (a
    #: directory: nothing else numbers its lines).  A store that numbers its entries sees
    #: the gap and counts it itself (Redis).
    counts_lost_markers: bool = False
    #: Whether its polls are made ahead elsewhere and paced there (``readahead.ReadAhead``):
    #: a poll waits for the next batch, and a follower does not pause between them
    paces_itself: bool = False
    #: Whether it can read a part of the job's streams (``take_shard``)
    shards = False
    #: The part of the job's streams it reads (None: all of them)
    shard: Shard | None = None
    #: Seconds between looks at the spools dead ranks left on this host, while following.
    SPOOL_LOOK_S = 2.0
    _next_spool_look = 0.0
    #: (rank, incarnation, line) of what unforwarded spools held besides records, handed on once
    _remnants_said: set[tuple[int, int, bytes]] | None = None
    _block_decoders: dict[Stream, BlockDecoder]  # per stream, made by ``ingest``: see commscope.blocks
    _statics: StaticTable  # what the streams' decoders share (every rank restates the same signatures)
    #: Op records stay in columns (``poll_batch``): ``ingest`` keeps them in ``_ops`` (a
    #: poll's streams decoded together: their columns as they came, ``Unpacked``)
    columnar = False
    _ops: list[OpRecords] | Unpacked
    _max_ids: dict[Stream, int]  # per stream, kept by ``ingest``: see ``max_op_id``
    _drops_read: dict[Stream, int]  # per stream, kept by ``ingest``: see ``drops_read``
    #: Chunks a columnar poll read, waiting to be decoded together (``ingest_later``); None:
    #: each is decoded as it is read
    _queued: dict[Stream, list[tuple[bytes, int]]] | None = None
    _queued_bytes = 0
    #: Bytes queued at most before they are decoded (``queue_full``): a poll without a budget
    #: reads a whole store
    QUEUE_BYTES = 32 << 20
    #: While ``poll_batch`` reads: the heartbeats and samples its chunks decoded together gave
    #: as rows (``blocks.decode_together``'s ``take``), each part with its chunks' ranks;
    #: None: none are taken (``poll`` hands every event over as a dict)
    _rows: list[tuple[beatscan.Gathered, np.ndarray]] | None = None

    @abc.abstractmethod
    def poll(self, max_bytes: int | None = None) -> list[Event]: ...

    def read_all(self) -> list[Event]:
        return self.poll()

    def poll_batch(self, max_bytes: int | None = None) -> Batch:
        """``poll``, with the op records of blocks in columns, and the heartbeats and samples
        of the streams decoded together in columns (``Batch.beats``)."""
        self.columnar = True
        self._rows = []
        try:
            events = self.poll(max_bytes)
            events, beats = self._beats_apart(events)
        finally:
            self._rows = None
        return Batch(events, *self._take_ops(), beats)

    def read_all_batch(self) -> Batch:
        """``read_all``, with the op records of blocks in columns (and the heartbeats and
        samples, as ``poll_batch``)."""
        self.columnar = True
        self._rows = []
        try:
            events = self.read_all()
            events, beats = self._beats_apart(events)
        finally:
            self._rows = None
        return Batch(events, *self._take_ops(), beats)

    def _beats_apart(self, events: list[Event]) -> tuple[list[Event], Beats | None]:
        """(``events`` without the marks of the rows taken, ``_rows`` as ``Beats``).  The model
        takes a batch's ``Beats`` after its events: exact for a rank none of whose heartbeats
        or samples among them is a dict, and whose rows came from one chunk.  Any other
        rank's rows (a rank whose heartbeats or samples were read as dicts in another chunk
        of the poll: a segment's last line, another incarnation queued apart, a spool's
        remnants; rows of two chunks) go back among the events as dicts, each where its line
        was among its chunk's events (which follow the chunk's mark)."""
        parts = self._rows or []
        if not parts:
            return events, None
        marked: dict[int, int] = {}  # rank -> its marks
        dicts: set[int] = set()  # ranks with a heartbeat or a sample as a dict
        for e in events:
            t = e["type"]
            if t is _ROWS:
                marked[e["rank"]] = marked.get(e["rank"], 0) + 1
            elif t == "heartbeat" or t == "sample":
                dicts.add(e["rank"])
        back = {r for r, n in marked.items() if n > 1 or r in dicts}
        if not back:
            return [e for e in events if e["type"] is not _ROWS], beatscan.polled(parts)
        out: list[Event] = []
        i, n = 0, len(events)
        while i < n:
            e = events[i]
            i += 1
            if e["type"] is not _ROWS:
                out.append(e)
            elif e["rank"] in back:
                p, c = e["at"]
                g = parts[p][0]
                at = g.of(c)
                got, _ = decode_indexed(g.lines(at), e["rank"])
                assert len(got.events) == at.stop - at.start  # (each row is one valid event of its rank)
                lead, lines = g.among.get(c, (0, []))
                out.extend(events[i:i + lead])  # (its head's: before every row)
                mine = sorted(zip([*lines, *g.line[at].tolist()], range(len(lines) + len(got.events)),
                                  [*events[i + lead:i + lead + len(lines)], *got.events], strict=True),
                              key=lambda x: (x[0], x[1]))
                out.extend(x for _, _, x in mine)
                i += lead + len(lines)
        kept = []
        for g, ranks in parts:
            stay = ~np.isin(ranks[g.chunk], list(back))
            kept.append((g if stay.all() else g.only(stay), ranks))
        return out, beatscan.polled(kept)

    def bulk(self, step: int) -> Iterator[Batch]:
        """Everything stored now, as batches of about ``step`` bytes, op records in columns:
        a whole read (``check``, a replay).  The last batch is what polls hold back
        (``read_all_batch``: a torn last line, what dead ranks left)."""
        yield from self._bulk(step)
        batch = self.read_all_batch()
        if batch.count():
            yield batch

    def read_apart(self, step: int) -> Iterator[Batch]:
        """A live reader's first read: everything stored now, its streams read apart in worker
        processes where the store can (``DirectoryReader``: a large job of packed records, not
        read yet), as batches of about ``step`` bytes, and polls go on from where it stopped;
        nothing where it cannot (the polls read it all).  Not ``bulk``'s last batch: what the
        polls hold back (a torn last line) stays theirs."""
        return iter(())

    def _bulk(self, step: int) -> Iterator[Batch]:
        """``bulk`` but its last batch.  A store whose streams can be read apart may read them
        in parallel (the directory store does); this default polls until nothing new comes."""
        while True:
            before = self.stats.bytes
            batch = self.poll_batch(step)
            if batch.count():
                yield batch
            if not batch.count() and self.stats.bytes == before:
                return

    def watermark_ns(self) -> int | None:
        """The wall time up to which every stream of the job has been read to its end: what
        it holds from before then is all in (0: some stream not yet; None: this reader cannot
        tell).  A live console judges silence against it, never against the wall clock
        alone: a reader behind on 16k streams must not take its own lag for ranks gone quiet."""
        return None

    def _read_to_end(self, stream: Stream, since_ns: int) -> None:
        """``stream`` was read to its end by a read that began at ``since_ns`` (one stream:
        a poll's per-stream path, so not through ``_read_to_end_all``)."""
        self._reads = getattr(self, "_reads", 0) + 1
        try:
            self._ends[stream] = since_ns
        except AttributeError:
            self._ends: dict[Stream, int] = {stream: since_ns}

    def _read_to_end_all(self, streams: Sequence[Stream], since_ns: int) -> None:
        """``_read_to_end`` of many streams at once (those a poll found with nothing new)."""
        if streams:
            self._reads = getattr(self, "_reads", 0) + 1
            try:
                self._ends.update(dict.fromkeys(streams, since_ns))
            except AttributeError:
                self._ends = dict.fromkeys(streams, since_ns)

    def _watermark_of(self, streams: Iterable[Stream]) -> int:
        """The watermark over ``streams``, computed once per read (``_ends`` changed)."""
        ends = getattr(self, "_ends", {})
        key = (len(ends), getattr(self, "_reads", 0))
        memo = getattr(self, "_mark_memo", None)
        if memo is not None and memo[0] == key and memo[1] is streams:
            return memo[2]
        mark = min((ends.get(s, 0) for s in streams), default=0)
        self._mark_memo = (key, streams, mark)
        return mark

    def max_op_id(self, stream: Stream) -> int:
        """The highest op id of the stream's ops read so far, as records or as events (-1:
        none); ids grow within a stream, so an op with a smaller id was read already."""
        return getattr(self, "_max_ids", {}).get(stream, -1)

    def _raise_max_id(self, stream: Stream, top: int) -> None:
        try:
            tops = self._max_ids
        except AttributeError:
            tops = self._max_ids = {}
        if top > tops.get(stream, -1):
            tops[stream] = top

    def _decoder(self, stream: Stream) -> BlockDecoder:
        """The stream's block decoder, made on first use (all share one table of statics:
        every rank restates the same signatures)."""
        try:
            decoders = self._block_decoders
        except AttributeError:
            decoders = self._block_decoders = {}
        decoder = decoders.get(stream)
        if decoder is None:
            try:
                table = self._statics
            except AttributeError:
                table = self._statics = StaticTable()
            decoder = decoders[stream] = BlockDecoder(stream[0], table)
        return decoder

    def _take_ops(self) -> tuple[Sequence[OpRecords], Spans | None]:
        """The op records read since the last call, and their ``Spans`` where they are one
        poll's streams decoded together (``decode_queued``)."""
        ops = getattr(self, "_ops", None) or []
        spans = getattr(self, "_spans", None)
        self._ops, self._spans = [], None
        return ops, spans

    def job(self) -> dict | None:
        """Job metadata once known (job id, world size, ...), else None."""
        return None

    def first_event(self, stream: Stream) -> dict | None:
        """A stream's first event (its meta, which names its run), read apart from the
        stream's reading; None where the store has no such stream or cannot say."""
        return None

    def job_name(self) -> str | None:
        """The id of the job being read, once known (a store may know it before it can read
        the job's metadata); None when it cannot say."""
        return None

    def shared_with_group(self) -> bool:
        """Whether the job is readable by its owner's group (a copy keeps it so)."""
        return False

    def total_bytes(self) -> int:
        """Bytes stored for the job now, for progress bars; 0 when the store cannot say."""
        return 0

    def size(self) -> Size:
        """How much the job holds now, for a progress bar: ``total_bytes()`` bytes by
        default, ``Size(0, "events")`` when the store cannot say."""
        n = self.total_bytes()
        return Size(n, "bytes") if n else Size(0, "events")

    def backlog_bytes(self) -> int:
        """Bytes stored but not yet returned by ``poll`` (how far behind a follower is);
        0 when the store cannot say."""
        return 0

    def least_backlog_bytes(self) -> int:
        """The least ``backlog_bytes`` may be: the same where the store says its bytes; the
        low end of an estimate's (``RedisReader``).  What a read is refused by
        (``source._fits``): only where even this much would not fit."""
        return self.backlog_bytes()

    def rank_count(self) -> int:
        """The ranks whose streams this reader reads, as the store lists them now (a rank's
        incarnations one: the model holds a rank once); 0 where it cannot say.  What a
        model's part that grows with its ranks, whatever their bytes, is sized by
        (``source.fitting_window``)."""
        return 0

    def close(self) -> None:  # noqa: B027 (a reader without resources has nothing to close)
        pass

    def owns(self, rank: int) -> bool:
        """Whether ``rank``'s streams are this reader's to read (its ``shard``'s, or all)."""
        return self.shard is None or self.shard.owns(rank)

    def job_invalid(self, why: str, warning: str) -> None:
        """The job's metadata failed its schema: counted (as rank -1's) and said by the one
        reader of a job's parts that owns rank -1 (each part reads the job's metadata; a
        console's read processes would count it once each)."""
        if self.owns(-1):
            self.stats.count_invalid(-1, {why: 1})
            self.stats.warnings.append(warning)

    def take_shard(self, shard: Shard) -> None:
        """Read only ``shard``'s streams (before the first read), where the reader can
        (``shards``)."""
        if not self.shards:
            raise StoreError(f"{type(self).__name__} reads a job whole: it cannot read a part of its streams")
        self.shard = shard

    def start_at(self, since: Since) -> None:
        """Read from the start of the window ``since`` on (``window.py``), not from each
        stream's start: call before the first read.  A store that cannot skip (this default)
        reads everything and says so."""
        self.stats.warnings.append(f"{since.describe()} asked for: this store is read from its start")

    def window_start_ns(self) -> int | None:
        """Where the window ``start_at`` was given starts, as this reader counted it (None:
        not counted, no window or a store it could not reach; one it could not skip to is
        read from each stream's start, and still counted).  A duration counts back from the
        job's newest write as of that call: another reader of the same window later (a
        lost read process's stand-in) starts here, not a duration back from a later end."""
        return None

    def read_again(self, since: Since) -> float | None:
        """Of the bytes this reader's window reads (from where the store started each stream
        to its end), the share a window from ``since`` would read too, told without reading
        any: a read starts where the store can start a stream (a directory's segment), and
        that is what it costs (None: the store cannot tell before reading; a Redis mark is
        found by reading the stream's marks)."""
        return None

    # ------------------------------------------------------------ the shared pipeline
    def queue_chunks(self) -> None:
        """From now until ``decode_queued``, a columnar reader's ``ingest_later`` queues the
        chunks it is given: a poll over thousands of streams decodes them together."""
        self._queued = {} if self.columnar else None
        self._queued_bytes = 0

    def queue_full(self) -> bool:
        """Whether the chunks queued hold ``QUEUE_BYTES`` or more: decode them (between two
        streams) before reading on."""
        return self._queued_bytes >= self.QUEUE_BYTES

    def ingest_later(self, stream: Stream, raw: bytes, size: int) -> list[Event]:
        """``ingest(stream, raw, size).events`` of complete lines; while chunks are queued,
        nothing yet: ``decode_queued`` decodes them (and returns their events)."""
        if self._queued is None:
            return self.ingest(stream, raw, size).events
        self._queued.setdefault(stream, []).append((raw, size))
        self._queued_bytes += len(raw)
        return []

    def ingest_after_queued(self, stream: Stream, raw: bytes, size: int = 0) -> tuple[list[Event], Decoded]:
        """``ingest`` of ``raw`` now, after everything queued (the stream's chunks, and the other
        streams' read before it: a rank's earlier incarnation comes first): (the queued chunks'
        events, what ``raw`` decoded to).  Queueing goes on after."""
        if self._queued is None:
            return [], self.ingest(stream, raw, size)
        before = self.decode_queued()
        self.queue_chunks()
        return before, self.ingest(stream, raw, size)

    def decode_queued(self) -> list[Event]:
        """The queued chunks decoded, and queueing ended: a stream's one chunk with the other
        streams' together where it is the common case (``blocks.decode_chunks``), every other
        chunk alone, in its stream's order; events in the order their streams were queued."""
        return [e for events in self.decode_queued_streams().values() for e in events]

    def decode_queued_streams(self) -> dict[Stream, list[Event]]:
        """``decode_queued``, each stream's events apart (a reader that returns them by stream)."""
        queued, self._queued = self._queued, None
        if not queued:
            return {}
        first = not getattr(self, "_ops", None)  # (no records before these: they may be the poll's Spans)
        together = [stream for stream, chunks in queued.items() if len(chunks) == 1]
        take = None
        if self._rows is not None and len(together) > 1:  # (a rank's one stream queued: its rows in order)
            ranks = np.fromiter((stream[0] for stream in queued), np.int64, len(queued))
            once = set(ranks[np.bincount(ranks - ranks.min())[ranks - ranks.min()] == 1].tolist())
            take = np.fromiter((stream[0] in once for stream in together), np.bool_, len(together))
        joined: list[Joined] = []
        got = decode_together([(queued[stream][0][0], self._decoder(stream)) for stream in together], take, joined) \
            if len(together) > 1 else Together([None] * len(together), [False] * len(together), [None] * len(together))
        marks: dict[Stream, Event] = {}
        if got.gathered and self._rows is not None:  # (each chunk's mark, before its events)
            chunk_ranks = np.fromiter((stream[0] for stream in together), np.int64, len(together))
            for rows in got.gathered:
                at = np.flatnonzero(np.r_[True, rows.chunk[1:] != rows.chunk[:-1]])
                self.stats.events += rows.chunk.shape[0]
                part = len(self._rows)
                self._rows.append((rows, chunk_ranks))
                for c in rows.chunk[at].tolist():
                    marks[together[c]] = {"type": _ROWS, "rank": together[c][0], "at": (part, c)}
        decoded = dict(zip(together, got.decoded, strict=True))
        scans = dict(zip(together, got.alone, strict=True))  # (the scan of each chunk left alone: not scanned again)
        learnt = {stream for stream, taught in zip(together, got.learnt, strict=True) if taught}
        # (other records come too, or two sets of columns: each stream's a view, in its turn, as a
        # poll not decoded together hands them over)
        apart = bool(joined) and (not first or len(joined) > 1 or len(together) != len(queued) or any(
            d is None or d.ops is not None for d in got.decoded))
        views: dict[Stream, OpRecords] = {}
        for columns in joined:  # (the records of the chunks decoded together, in columns as they were)
            sp = columns.spans
            streams = [together[c] for c in columns.chunks.tolist()]
            # the highest id of each stream's records, in one call
            for stream, top in zip(streams, np.maximum.reduceat(sp.whole.id, sp.start[:-1]).tolist(), strict=True):
                self._raise_max_id(stream, top)
            records = int(sp.start[-1] - sp.start[0])
            self.stats.events += records
            self.stats.records += records
            if apart:
                views.update(zip(streams, Unpacked(sp), strict=True))
        out: dict[Stream, list[Event]] = {}
        for stream, chunks in queued.items():
            d = decoded.get(stream)
            if d is None:
                evs = out[stream] = []
                for chunk, size in chunks:
                    evs.extend(self.ingest(stream, chunk, size, scans.get(stream)).events)
                continue
            top = _last_begin(d.events)  # (JSON op events among the blocks)
            if stream in learnt and d.ops is not None and len(d.ops):
                top = max(top, int(d.ops.id.max()))
            if top >= 0:
                self._raise_max_id(stream, top)
            self._account(stream, d, size=chunks[0][1])
            view = views.get(stream)
            if view is not None:
                self._keep_ops(view)
            mark = marks.get(stream)
            out[stream] = d.events if mark is None else [mark, *d.events]
        if joined and not apart:  # (the poll's records, all in one set of columns)
            self._ops, self._spans = Unpacked(joined[0].spans), joined[0].spans
        elif first:  # (the poll's records: as arrays where they lie back to back in one set of columns)
            self._spans = _spans_of(list(getattr(self, "_ops", [])))
        return out

    def ingest(self, stream: Stream, raw: bytes | Sequence[bytes], size: int = 0, scanned: Scan | None = None,
               summaries: bool = True) -> Decoded:
        """Events of ``raw``, data of one stream: complete lines (bytes), or entries that
        each hold one event (a sequence).  Validated and redacted, blocks expanded; damaged,
        invalid and (``counts_lost_markers``) lost events counted in ``stats``, and ``size``
        stored bytes added to ``stats.bytes``.  Blocks are decoded with the tables the
        stream's earlier data defined, so call it in stream order.  A ``columnar`` reader
        keeps the op records of blocks in columns (``poll_batch`` hands them over): they are
        not among the events returned.  ``scanned``: ``raw``'s scan, where ``decode_chunks`` made it.
        ``summaries``: count the ``summary`` events among them (``_account``)."""
        rank = stream[0]
        if self.columnar and isinstance(raw, bytes):
            got = self._decode_columns(stream, raw, scanned)
        else:
            got = decode_lines(raw, rank) if isinstance(raw, bytes) else decode_entries(raw, rank)
            got = decode_stream(got, self._decoder(stream), columns=self.columnar)
        top = _last_begin(got.events)  # (op events: JSON ones, and a reader of events' records)
        if got.ops is not None and len(got.ops):
            top = max(top, int(got.ops.id.max()))
        if top >= 0:
            self._raise_max_id(stream, top)
        self._account(stream, got, size, lost_markers=isinstance(raw, bytes), summaries=summaries)
        return got

    def _decode_columns(self, stream: Stream, raw: bytes, scanned: Scan | None) -> Decoded:
        """``ingest``'s decode of complete lines for a columnar reader (a store's whole read
        may put JSON op events in columns too: ``DirectoryReader``)."""
        return decode_alone(raw, self._decoder(stream), scanned)

    def _account(self, stream: Stream, got: Decoded, size: int, lost_markers: bool = True,
                 summaries: bool = True) -> None:
        """What ``ingest`` keeps of a decoded chunk but the highest op id: its op records,
        and in ``stats`` what it held, skipped and (``counts_lost_markers``) says was lost
        (records left in a poll's columns, ``blocks.Joined``, are not its: its caller
        counts them).  ``summaries``: a ``summary`` among the stream's own events (a copy
        of a trace that retention kept, ``commscope copy``) stands for what the source's
        did, counted as its reader counted it; a summary file's, read apart, is decided
        by its reader (``DirectoryReader._read_summaries``)."""
        if got.ops is not None:
            self._keep_ops(got.ops)
        rank = stream[0]
        stats = self.stats
        stats.count_decoded(rank, got)
        # (fewer than the bytes by far: a block stands for many records)
        dropped = []
        for e in got.events:
            kind = e["type"]
            if kind == "dropped":
                dropped.append(e)
            elif kind == "summary" and summaries:
                stats.count_summary(rank, e)
        if dropped:
            if self.counts_lost_markers and lost_markers:
                self._count_store_lost(stream, dropped)
            read = self.drops_read_of()
            read[stream] = recorder_drops(read.get(stream, 0), dropped)
        stats.bytes += size
        stats.chunks += 1

    def _count_store_lost(self, stream: Stream, dropped: list[Event]) -> None:
        """Count what a writer's ``store_lost`` markers among ``dropped`` events say the store
        lost (``counts_lost_markers``): all of it, where this reader read none of it."""
        self.stats.count_store_lost(stream[0], dropped)

    def drops_read(self, stream: Stream) -> int:
        """The recorder's drops this reader read of ``stream`` so far (its ``dropped`` events:
        ``recorder_drops``), so a carry read after a jump adds only those it did not
        (``inflight.as_read``)."""
        return getattr(self, "_drops_read", {}).get(stream, 0)

    def drops_read_of(self) -> dict[Stream, int]:
        """``drops_read`` of every stream, as this reader keeps it (a reader that goes on
        from a worker's read takes the worker's: ``DirectoryReader._adopt``)."""
        try:
            return self._drops_read
        except AttributeError:
            self._drops_read = {}
            return self._drops_read

    def _keep_ops(self, ops: OpRecords) -> None:
        """Keep a stream's op records for the batch (``_take_ops``), after those kept before."""
        self._spans = None  # (``decode_queued`` says, after its records, whether they are all)
        kept = getattr(self, "_ops", None)
        if kept is None:
            self._ops = [ops]
        elif isinstance(kept, list):
            kept.append(ops)
        else:  # (a poll's columns, as they came: each stream's view from now on)
            self._ops = [*kept, ops]

    def spool_remnants(self, job: str | None, store: str, writer: Callable[[int, int], Any],
                       final: bool) -> tuple[int, dict[Stream, list[Event]]]:
        """What ranks of ``job`` that died on this host left in their spools and nobody
        forwarded yet: (how many spools were forwarded to their streams with ``writer(rank,
        incarnation)``, where this reader may write: read them again; the events of those it
        could not forward, by stream).  Looked at most every ``SPOOL_LOOK_S`` while
        following (``final``: at the end, always).  A reader of a part of the streams
        (``Shard``) forwards any (a spool is claimed by one forwarder), and reads only what
        its own ranks left that could not be: by the decoder of the rank's stream, which
        keeps each record once however often the stream and the spool hold it."""
        now = time.monotonic()
        if job is None or (not final and now < self._next_spool_look):
            return 0, {}
        self._next_spool_look = now + self.SPOOL_LOOK_S
        from commscope.store import spool

        forwarded = spool.forward_dead(job, store, writer)
        left: dict[Stream, list[Event]] = {}
        if self._remnants_said is None:
            self._remnants_said = set()
        said = self._remnants_said
        meta = self.job() or {}  # (another run's spools under this job id are not its)

        def run_of(rank: int, inc: int) -> str | None:
            """The run the store holds of this stream: its meta's, else, for the incarnation
            the job's metadata describes, the job's (rank 0 draws a run at each incarnation)."""
            first = self.first_event((rank, inc)) or {}
            stated = first.get("run") if first.get("type") == "meta" else None
            if stated is None and meta.get("inc", 0) == inc:
                stated = meta.get("run")
            return stated if isinstance(stated, str) and stated != "?" else None

        for rank, inc, lines in spool.remnant_events(job, store, run_of):
            if self.owns(rank):
                # (read again at each look: records are kept once by the stream's decoder, the
                # other lines, its exit among them, by what was handed on already)
                new = [line for line in lines if line.startswith(LINE_PREFIX) or (rank, inc, line) not in said]
                said.update((rank, inc, line) for line in new if not line.startswith(LINE_PREFIX))
                if new:
                    left.setdefault((rank, inc), []).extend(self.ingest((rank, inc), b"\n".join(new)).events)
        return forwarded, left


class AsOf:
    """The moment a live follower judges a job as of: the wall clock held back to its
    reader's watermark (``TraceReader.watermark_ns``: every stream read to its end by a read
    that began then), the last one set while a stream new to the reader is read for the
    first time (the watermark is 0 then).  A follower behind on its streams, or starved
    between its read and its judgement, never takes its own lag for ranks gone quiet: the
    console (``tui/feed.py``) and every test that follows a live job judge so."""

    def __init__(self) -> None:
        self.mark: int | None = None  # the reader's last watermark (None: none set yet)

    def now(self, reader: TraceReader, wall: int) -> int:
        mark = reader.watermark_ns()
        if mark:
            self.mark = mark
        return wall if self.mark is None else min(wall, self.mark)


def _last_begin(events: list[Event]) -> int:
    """The highest id of an op begun among a stream's ``events`` (-1: none).  Not the last
    begun's: ids grow within a stream as the ops began, but two threads' begins may reach it
    in the other order (an id is taken a moment before its begin is queued)."""
    return max((e["id"] for e in events if e["type"] == "op" and e["phase"] == "begin"), default=-1)


def decode_entries(values: Sequence[bytes], rank: int) -> Decoded:
    """Entries that each hold one event (a Redis stream's) to validated events: one
    C-speed pass when every entry is one clean line; an entry that is empty, or holds other
    than exactly one event, is one damaged event."""
    if not values:
        return Decoded([], 0, Counter())
    joined = b"\n".join(values)
    if joined.count(b"\n") == len(values) - 1:
        got = decode_lines(joined, rank)
        if len(got.events) + got.damaged + sum(got.invalid.values()) == len(values):
            return got
    kept: list[Event] = []
    damaged, invalid = 0, Counter()  # empty or multi-line entries: judge each on its own
    for v in values:
        one = decode_lines(v.replace(b"\n", b" "), rank) if v.strip() else Decoded([], 1, Counter())
        if len(one.events) + one.damaged + sum(one.invalid.values()) != 1:  # not exactly one event
            damaged += 1
            continue
        kept.extend(one.events)
        damaged += one.damaged
        invalid.update(one.invalid)
    return Decoded(kept, damaged, invalid)


class EmptyReader(TraceReader):
    """A reader of nothing: a console before any job exists (the demo), benchmarks."""

    def __init__(self, description: str = "") -> None:
        self.description = description
        self.stats = ReadStats()

    def poll(self, max_bytes: int | None = None) -> list[Event]:
        return []
