"""What every store backend provides: a per-rank writer and a whole-job reader."""

from __future__ import annotations

import dataclasses
from typing import Protocol

from commscope.events import Event


class StoreError(Exception):
    """A store cannot be opened, written or read.  Messages never contain secrets."""


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

    def write(self, events: list[Event]) -> None:
        """Persist events in order.  Raises StoreError (events not written) on failure."""

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
