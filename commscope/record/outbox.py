"""The writer side of the recorder thread: encoded events on their way to the store.

``Recorder`` (``recorder.py``) decides what to write and when; an ``Outbox`` holds the
encoded lines until the store takes them, and owns the store's writer once it is open.
A slow, full or missing store never reaches training.  Lines wait here, bounded in
bytes (``$COMMSCOPE_OUTBOX_MB``, default 32 MiB): past the bound the oldest is dropped
and counted.  A failing store is retried with backoff from 0.5 s to 10 s.

Op records are bounded by the spool's ring (``store/spool.py``), not by this cap: a
``block`` line is an encoded view of records that stay in the ring until the store has
the line (``on_forwarded(end)`` then frees their room), and while the store fails the
recorder drains no more (so the ring fills, and drops and counts what does not fit).
Only the recorder thread touches an outbox (or the caller holding its tick lock), but for
``interrupt``: another thread about to cut the thread's store I/O short says so first.
"""

from __future__ import annotations

import os
import sys
import time
from collections import deque
from collections.abc import Callable
from typing import NamedTuple

from commscope import blocks
from commscope.store import StoreError, StoreWriter

ENV_OUTBOX_MB = "COMMSCOPE_OUTBOX_MB"


def _cap_bytes() -> int:
    try:
        mb = float(os.environ.get(ENV_OUTBOX_MB) or 32)
    except ValueError:
        mb = 32.0
    return max(1 << 16, int(mb * (1 << 20)))


class Line(NamedTuple):
    data: bytes
    ring_end: int  # a block's end position in the spool's ring; -1: not a block of the ring (or EXIT_RING_END)


#: ``Line.ring_end`` of the incarnation's ``exit`` line: its landing is said (``on_exit_stored``).
EXIT_RING_END = -2
#: ``Line.ring_end`` of the rank's ``meta`` line (``opened``): its landing is said (``on_meta_stored``).
META_RING_END = -3


class Outbox:
    FINAL_WRITE_S = 0.8  # the last write's retries at shutdown (a store that is down holds exit ~1 s)

    def __init__(self, warn: Callable[[str, str], None], on_forwarded: Callable[[int], None] | None = None,
                 on_exit_stored: Callable[[bytes], None] | None = None,
                 on_meta_stored: Callable[[], None] | None = None):
        """``warn(key, message)``: warns once per key (``Recorder.warn``); ``on_forwarded(end)``:
        the store holds the ring's records before ``end``; ``on_exit_stored(line)``: it holds
        that ``exit`` (put with ``ring_end=EXIT_RING_END``); ``on_meta_stored()``: it holds the
        ``meta`` (``opened``), whichever write took it: attach's or a later tick's."""
        self.pending: deque[Line] = deque()  # encoded events not yet in the store
        self.cap_bytes = _cap_bytes()
        self.bytes = 0  # of the pending lines that are not ring blocks (those the ring bounds)
        self.writer: StoreWriter | None = None  # once the store is open
        self.dropped = 0  # events (lines) given up on
        self.dropped_records = 0  # op records inside the ``block`` events among them
        self.error: str | None = None  # why the store last failed, while it fails
        self._warn = warn
        self._on_forwarded = on_forwarded
        self._on_exit_stored = on_exit_stored
        self._on_meta_stored = on_meta_stored
        self._retry_at = 0.0
        self._retry_delay = 0.5
        self._cut = False  # ``interrupt``: no write but ``write_final``'s from now on

    def put(self, line: bytes, ring_end: int = -1) -> None:
        """Queue an encoded event (a ring block with its end position).  Past the byte cap
        the oldest lines that are not ring blocks are dropped and counted."""
        self.pending.append(Line(line, ring_end))
        if ring_end >= 0:
            return
        self.bytes += len(line)
        if self.bytes > self.cap_bytes:
            self._shed()

    def _shed(self) -> None:
        keep: deque[Line] = deque()
        while self.pending and self.bytes > self.cap_bytes:
            item = self.pending.popleft()
            if item.ring_end >= 0:
                keep.append(item)
                continue
            self.bytes -= len(item.data)
            self.dropped += 1
            self.dropped_records += blocks.records_in_line(item.data)
        keep.extend(self.pending)
        self.pending = keep

    def backing_off(self) -> bool:
        """The store failed a moment ago: not yet time to try it again."""
        return time.monotonic() < self._retry_at

    def opened(self, writer: StoreWriter, first: bytes) -> None:
        """The store is open; ``first`` (the ``meta`` event) goes before everything queued."""
        self.writer = writer
        self.pending.appendleft(Line(first, META_RING_END))
        self.bytes += len(first)

    def failed(self, message: str) -> None:
        if self._cut:
            return  # (interrupted: the store did not fail)
        self.error = message
        self._warn("store", f"commscope: {message}; training continues, trace events are buffered "
                            "(bounded) and dropped if the store stays unavailable")
        self._retry_at = time.monotonic() + self._retry_delay
        self._retry_delay = min(self._retry_delay * 2, 10.0)

    def _landed(self, k: int) -> None:
        """The first ``k`` pending lines are in the store."""
        end = -1
        for _ in range(min(k, len(self.pending))):
            item = self.pending.popleft()
            if item.ring_end >= 0:
                end = max(end, item.ring_end)
            else:
                self.bytes -= len(item.data)
                if item.ring_end == EXIT_RING_END and self._on_exit_stored is not None:
                    self._on_exit_stored(item.data)
                elif item.ring_end == META_RING_END and self._on_meta_stored is not None:
                    self._on_meta_stored()
        if end >= 0 and self._on_forwarded is not None:
            self._on_forwarded(end)

    def interrupt(self) -> None:
        """From another thread, which is about to cut the recorder thread's store I/O short
        (``Recorder._make_way``): a write or an opening that fails from now on keeps what it
        did not write, in order, and is no failure of the store (no backoff, no warning).
        Only ``write_final`` writes after this, with time of its own."""
        self._cut = True

    def write_once(self, deadline: float | None = None) -> bool:
        """Hand everything queued to the open writer; on failure, keep what it did not take,
        in order (a retry then neither loses nor duplicates a line: see the writers).
        ``deadline`` (``time.monotonic``): no wait of the writer lasts past it."""
        if self._cut and deadline is None:
            return False
        pending = self.pending
        limit = getattr(self.writer, "set_deadline", None) if deadline is not None else None
        try:
            if limit is not None:
                limit(deadline)
            self.writer.write([item.data for item in pending])
        except StoreError as exc:
            self._landed(exc.written)
            self.failed(str(exc))
            return False
        finally:
            if limit is not None:
                try:
                    limit(None)
                except Exception:
                    pass
        self._landed(len(pending))
        if self.error is not None:
            self.error = None
            self._retry_delay = 0.5
        return True

    def write_final(self, open_writer: Callable[[float], bool], who: str, store: str, kept: str | None = None,
                    keep: Callable[[bytes, bool], None] | None = None, deadline: float | None = None) -> None:
        """A last attempt, bounded: it ends by ``FINAL_WRITE_S`` from now (or ``deadline``,
        ``time.monotonic``, if sooner), and no wait of the store's, opening included, lasts
        past that.  What still cannot be written is reported on stderr.
        ``open_writer(timeout)`` opens the store if needed, within ``timeout`` seconds (True:
        ``writer`` is set); ``kept``: where what did not make it waits for a forwarder (the
        spool), if anywhere: the op records are there already, and ``keep(line, is_exit)``
        puts each other event there too."""
        end = time.monotonic() + self.FINAL_WRITE_S
        deadline = end if deadline is None else min(deadline, end)
        self._cut = False  # (the write an ``interrupt`` made way for)
        # what kept them pending, said at the end: a try at the deadline fails for want of time
        # ("no answer within 0 s"), which hid a refusal's own words (helper-163)
        cause = self.error
        while self.pending:  # (one try at least: a store that does not wait, a directory, needs no time)
            self._retry_at = 0.0
            if open_writer(max(deadline - time.monotonic(), 0.0)) and self.write_once(deadline):
                break
            cause = cause or self.error
            left = deadline - time.monotonic()
            if left <= 0:
                break
            time.sleep(min(0.1, left))
        if self.pending:
            lost = len(self.pending)
            records = sum(blocks.records_in_line(item.data) for item in self.pending)
            what = f"{lost} trace events" + (f" ({records} op records in blocks)" if records else "")
            tail = ""
            if kept:
                if keep is not None:
                    for item in self.pending:
                        if item.ring_end < 0:
                            keep(item.data, item.ring_end == EXIT_RING_END)
                tail = f"; they wait in {kept} for a forwarder (any commscope command on this host)"
            print(f"commscope: {who}: {what} could not be written at exit to {store}: "
                  f"{cause or self.error or 'the store is unavailable'}{tail}", file=sys.stderr)
            self.pending.clear()
            self.bytes = 0
        if self.writer is not None:
            try:
                self.writer.close()
            except Exception:
                pass

    def forget(self) -> None:
        """In a forked child: nothing queued or open here belongs to it."""
        self.pending.clear()
        self.bytes = 0
        self.writer = None
