"""What every store backend provides: a per-rank writer and a whole-job reader."""

from __future__ import annotations

import dataclasses
from typing import Protocol

from commscope.events import Event


class StoreError(Exception):
    """A store cannot be opened, written or read.  Messages never contain secrets.

    ``written`` counts the leading events of a failed batch that did reach the store,
    so a retry neither loses nor duplicates them.
    """

    def __init__(self, message: str, written: int = 0):
        super().__init__(message)
        self.written = written


@dataclasses.dataclass
class ReadStats:
    """What a reader has seen so far; shown by the console and ``check``."""

    events: int = 0
    bytes: int = 0
    corrupt: int = 0  # damaged lines/entries skipped
    corrupt_by_rank: dict[int, int] = dataclasses.field(default_factory=dict)
    partial_tail: int = 0  # ranks whose last line is still incomplete
    trimmed: bool = False  # the backend dropped old events (Redis maxlen)
    warnings: list[str] = dataclasses.field(default_factory=list)

    def count_corrupt(self, rank: int, n: int) -> None:
        if n:
            self.corrupt += n
            self.corrupt_by_rank[rank] = self.corrupt_by_rank.get(rank, 0) + n


class StoreWriter(Protocol):
    """Owned by one rank's recorder thread; never called from the training hot path."""

    description: str

    def write(self, lines: list[bytes]) -> None:
        """Persist encoded events (``events.encode``, no newline) in order.

        Raises StoreError on failure; its ``written`` says how many leading lines landed.
        """

    def close(self) -> None: ...


class TraceReader(Protocol):
    """Reads one job.  ``poll`` returns only events not returned before, in per-rank order."""

    description: str
    stats: ReadStats

    def poll(self) -> list[Event]: ...

    def read_all(self) -> list[Event]: ...

    def job(self) -> dict | None:
        """Job metadata once known (job id, world size, ...), else None."""

    def close(self) -> None: ...
