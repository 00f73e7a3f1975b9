"""The writer side of the recorder thread: encoded events on their way to the store.

``Recorder`` (``recorder.py``) decides what to write and when; an ``Outbox`` holds the
encoded lines until the store takes them, and owns the store's writer once it is open.
A slow, full or missing store never reaches training: lines wait here, bounded (past
``PENDING_CAP`` the oldest is dropped and counted), and a failing store is retried with
backoff from 0.5 s to 10 s.  Only the recorder thread touches an outbox.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from commscope import blocks
from commscope.store import StoreError


class Outbox:
    PENDING_CAP = 100_000  # encoded events waiting for a writable store (about 30 MB)
    FINAL_WRITE_S = 0.8  # the last write's retries at shutdown; exit is never held longer than ~1 s

    def __init__(self, warn: Callable[[str, str], None]):
        """``warn(key, message)``: warns once per key (``Recorder.warn``)."""
        self.pending: deque[bytes] = deque()  # encoded events not yet in the store
        self.writer: Any = None  # a ``StoreWriter`` once the store is open
        self.dropped = 0  # events (lines) given up on
        self.dropped_records = 0  # op records inside the ``block`` events among them
        self.error: str | None = None  # why the store last failed, while it fails
        self._warn = warn
        self._retry_at = 0.0
        self._retry_delay = 0.5

    def put(self, line: bytes) -> None:
        """Queue an encoded event (bounded: the oldest is dropped and counted)."""
        pending = self.pending
        if len(pending) >= self.PENDING_CAP:
            self.dropped += 1
            self.dropped_records += blocks.records_in_line(pending.popleft())
        pending.append(line)

    def backing_off(self) -> bool:
        """The store failed a moment ago: not yet time to try it again."""
        return time.monotonic() < self._retry_at

    def opened(self, writer: Any, first: bytes) -> None:
        """The store is open; ``first`` (the ``meta`` event) goes before everything queued."""
        self.writer = writer
        self.pending.appendleft(first)

    def failed(self, message: str) -> None:
        self.error = message
        self._warn("store", f"commscope: {message}; training continues, trace events are buffered "
                            "(bounded) and dropped if the store stays unavailable")
        self._retry_at = time.monotonic() + self._retry_delay
        self._retry_delay = min(self._retry_delay * 2, 10.0)

    def write_once(self) -> bool:
        """Hand everything queued to the open writer; on failure, keep what it did not take."""
        pending = self.pending
        try:
            self.writer.write(list(pending))
        except StoreError as exc:
            for _ in range(min(exc.written, len(pending))):
                pending.popleft()
            self.failed(str(exc))
            return False
        pending.clear()
        if self.error is not None:
            self.error = None
            self._retry_delay = 0.5
        return True

    def write_final(self, open_writer: Callable[[], bool], who: str, store: str) -> None:
        """A last, bounded attempt; what still cannot be written is reported on stderr.
        ``open_writer()`` opens the store if needed (True: ``writer`` is set)."""
        deadline = time.monotonic() + self.FINAL_WRITE_S
        while self.pending:
            self._retry_at = 0.0
            if open_writer() and self.write_once():
                break
            if time.monotonic() >= deadline:
                break
            time.sleep(0.1)
        if self.pending:
            lost = len(self.pending)
            records = sum(blocks.records_in_line(line) for line in self.pending)
            what = f"{lost} trace events" + (f" ({records} op records in blocks)" if records else "")
            print(f"commscope: {who}: {what} could not be written at exit to {store}: "
                  f"{self.error or 'the store is unavailable'}", file=sys.stderr)
            self.pending.clear()
        if self.writer is not None:
            try:
                self.writer.close()
            except Exception:
                pass

    def forget(self) -> None:
        """In a forked child: nothing queued or open here belongs to it."""
        self.pending.clear()
        self.writer = None
