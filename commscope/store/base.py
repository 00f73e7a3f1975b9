"""What every store backend provides: a per-rank writer and a whole-job reader."""

from __future__ import annotations

import abc
import dataclasses
import re
import time
from collections.abc import Mapping
from typing import Protocol

import orjson

from commscope.events import Decoded, Event
from commscope.schema import SCHEMA_VERSION

#: Distinct invalid-event reasons kept; more are counted as "other" (a hostile trace cannot
#: grow the stats without bound).
MAX_REASONS = 64


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
    partial_tail: int = 0  # ranks whose last line is still incomplete
    trimmed: bool = False  # the backend dropped old events (Redis maxlen)
    warnings: list[str] = dataclasses.field(default_factory=list)

    def count_corrupt(self, rank: int, n: int) -> None:
        if n:
            self.corrupt += n
            self.corrupt_by_rank[rank] = self.corrupt_by_rank.get(rank, 0) + n

    def count_invalid(self, rank: int, reasons: Mapping[str, int]) -> None:
        """Add skipped invalid events of ``rank`` by reason (at most MAX_REASONS distinct)."""
        for reason, n in reasons.items():
            if not n:
                continue
            self.invalid += n
            self.invalid_by_rank[rank] = self.invalid_by_rank.get(rank, 0) + n
            if reason not in self.invalid_by_reason and len(self.invalid_by_reason) >= MAX_REASONS:
                reason = "other"
            self.invalid_by_reason[reason] = self.invalid_by_reason.get(reason, 0) + n

    def count_decoded(self, rank: int, decoded: Decoded) -> None:
        """Account one decoded batch of ``rank``: its events, damaged lines and invalid events."""
        self.events += len(decoded.events)
        self.count_corrupt(rank, decoded.damaged)
        self.count_invalid(rank, decoded.invalid)

    def count_store_lost(self, rank: int, raw: bytes, decoded: Decoded) -> None:
        """Count what a writer's ``store_lost`` markers in ``raw`` say the store lost (a
        directory store deleted and recreated under a running rank)."""
        if STORE_LOST.encode() not in raw:
            return
        for e in decoded.events:
            if e["type"] == "dropped" and str(e.get("reason", "")).startswith(STORE_LOST) and e.get("entries"):
                n = int(e["entries"])
                self.missing_by_rank[rank] = self.missing_by_rank.get(rank, 0) + n
                self.warnings.append(f"rank {rank}: {n} line(s) of its stream were lost: "
                                     f"{str(e['reason'])[len(STORE_LOST) + 2:]}")

    def lost_by_rank(self) -> dict[int, int]:
        """Damaged plus invalid events skipped, per rank."""
        out = dict(self.corrupt_by_rank)
        for r, n in self.invalid_by_rank.items():
            out[r] = out.get(r, 0) + n
        return out


#: A ``dropped`` event whose reason starts so was written by a writer that found its
#: stream gone or shorter than what it had written (the store restarted empty, the job
#: directory was deleted): ``entries`` lines were lost, not dropped by the recorder.
STORE_LOST = "store_lost"


def store_lost(rank: int, entries: int, why: str) -> bytes:
    """The marker a writer puts first in a stream it had to start again."""
    return orjson.dumps({"type": "dropped", "v": SCHEMA_VERSION, "rank": rank, "ts": time.time_ns(), "count": 0,
                         "entries": entries, "reason": f"{STORE_LOST}: {why}"})


def meta_line(lines: list[bytes]) -> bytes | None:
    """The rank's ``meta`` among the first lines a writer is given (it comes first), kept
    to be stated again after a ``store_lost`` marker."""
    return next((x for x in lines[:4] if b'"type":"meta"' in x), None)


def is_store_lost(line: bytes) -> bool:
    return b'"reason":"' + STORE_LOST.encode() in line


class StoreWriter(Protocol):
    """Owned by one rank's recorder thread; never called from the training hot path."""

    description: str

    def write(self, lines: list[bytes]) -> None:
        """Persist encoded events (``events.encode``, no newline) in order.

        Raises StoreError on failure; its ``written`` says how many leading lines landed.
        """

    def close(self) -> None: ...


class TraceReader(abc.ABC):
    """Reads one job.  Every reader (directory, Redis, Flight Recorder dumps, test and
    placeholder readers) derives from this class, so consumers (``tui/feed.py``,
    ``commands/copy.py``) call every method directly, never probing for one.

    ``poll`` returns only events not returned before, in per-rank order, reading about
    ``max_bytes`` of stored data at most (None: everything there is; a reader that cannot
    bound its reads returns everything).  ``read_all`` also returns what ``poll`` holds
    back (an incomplete last line, taken as truncated): call it once, at the end.
    """

    description: str = ""
    stats: ReadStats

    @abc.abstractmethod
    def poll(self, max_bytes: int | None = None) -> list[Event]: ...

    def read_all(self) -> list[Event]:
        return self.poll()

    def job(self) -> dict | None:
        """Job metadata once known (job id, world size, ...), else None."""
        return None

    def total_bytes(self) -> int:
        """Bytes stored for the job now, for progress bars; 0 when the store cannot say."""
        return 0

    def backlog_bytes(self) -> int:
        """Bytes stored but not yet returned by ``poll`` (how far behind a follower is);
        0 when the store cannot say."""
        return 0

    def close(self) -> None:  # noqa: B027 (a reader without resources has nothing to close)
        pass


class EmptyReader(TraceReader):
    """A reader of nothing: a console before any job exists (the demo), benchmarks."""

    def __init__(self, description: str = "") -> None:
        self.description = description
        self.stats = ReadStats()

    def poll(self, max_bytes: int | None = None) -> list[Event]:
        return []
