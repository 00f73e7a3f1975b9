"""How tests have a whole read of a large directory store read by its workers, or by stand-ins."""

from __future__ import annotations

import pytest

from commscope.store import bulkread
from commscope.store.directory import ENV_WORKERS, DirectoryReader


def by_workers(mp: pytest.MonkeyPatch, workers: int = 2) -> None:
    """A whole read (or a console's first read) of a large job read by ``workers`` worker
    processes alone: ``COMMSCOPE_READ_WORKERS`` counts the reading process too, and here it
    reads no chunk itself (``DirectoryReader.READS_ITSELF``), so what the test checks is what
    the workers sent.  (The reading process's own chunks: test_bulkread.)"""
    mp.setenv(ENV_WORKERS, str(workers + 1))
    mp.setattr(DirectoryReader, "READS_ITSELF", False)


def stand_in_workers(mp: pytest.MonkeyPatch, command: tuple[str, ...]) -> None:
    """Read workers that run ``command`` (a stand-in: one that fails, stalls, tears its
    message): started afresh, as a forked worker runs the real loop (``bulkread.serve``)."""
    mp.setattr(bulkread.Workers, "COMMAND", command)
    mp.setenv(bulkread.ENV_START, "spawn")
