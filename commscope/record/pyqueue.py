"""The records the Python hot path (``pyhot.PythonOps``) queues for the recorder thread.

The training thread appends them to ``PythonOps.q``, a bounded deque; the thread's
``pyencode.QueueEncoder`` reads them by name and turns them into schema events.
"""

from __future__ import annotations

from typing import Any, NamedTuple


# Records the hot path queues for the thread.  Plain tuples would be a little cheaper to
# build; NamedTuples are built with tuple.__new__ and read by name, so they cost no more.
class QueuedBegin(NamedTuple):
    op_id: int
    ts: int
    name: str
    group: str
    seq: int | None
    peer: int | None
    direction: str | None
    root: int | None
    redop: Any
    ins: tuple | None  # (shape, dtype) or ((shape, dtype), ...): see ops.describe_pairs
    in_bytes: int | None
    outs: tuple | None
    out_bytes: int | None
    async_op: bool
    site: tuple[int, int] | None
    tid: int
    parent: int | None
    nested: bool
    device: int | None


class QueuedEnd(NamedTuple):
    op_id: int
    ts: int
    exc: str | None
    source: tuple[int, int] | None  # (peer, seq) an any-source recv resolved


class QueuedWait(NamedTuple):
    op_ids: tuple
    ts: int
    exc: str | None
    tid: int
    begin: bool


class QueuedGroup(NamedTuple):
    ts: int
    name: str
    granks: tuple[int, ...]
    backend: str


class QueuedTaken(NamedTuple):
    """The ops' Work was handed to a future (``Work.get_future``): completion is taken
    there, so never waiting on the Work is no mistake."""

    op_ids: tuple
