"""The Python recorder's spool ring: its op records packed as the native recorder packs them.

The fallback recorder (``pyhot``) has no C of its own, yet its records can live where a
death cannot reach them.  Each begin, end and wait is packed at the moment of the call
(``blocks`` records: a begin as RBEGIN with the JSON fragment of its static fields, as
the native recorder writes ops described in Python) into a ring of the same spool
layout the native recorder uses (``store/spool.py``).  The recorder thread drains the
ring into ``block`` events like the native one; whoever finds the spool of a dead rank
forwards what the store lacks.  Readers decode both recorders' blocks the same way.

What the native recorder's C handlers note in the spool's header (the fatal signal, the
C++ exception) the Python recorder cannot; faulthandler's crash file next to the spool
still tells a fatal signal and where it hit.
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
import time
from collections.abc import Iterable

from commscope import blocks
from commscope.store import spool

_U64 = struct.Struct("<Q")
_I32 = struct.Struct("<i")
_I64 = struct.Struct("<q")
#: Where an RBEGIN record's seq lies (``blocks.RBEGIN_BODY``: tid, parent, site, gid, seq)
_RBEGIN_SEQ = blocks.HEADER.size + 24


class PyRing:
    """One process's ring (see the module docstring); every method is thread-safe."""

    def __init__(self, ring: int | None = None) -> None:
        self._lock = threading.Lock()
        self.dropped = 0  # records that did not fit
        self.frags: dict[tuple, bytes] = {}  # a begin's static fields -> JSON fragment (``PythonOps``)
        self._groups: dict[int, bytes] = {}  # gid -> GROUP record
        self._gids: dict[str, int] = {}
        self._used: set[int] = set()  # gids the records since the last drain refer to
        self._meta: bytes | None = None
        self.drained = 0
        self._taken = 0  # the last drain took records up to here
        self._wrap_at = -1  # position where the ring last went back to its start
        self.file = False
        size = ring or spool.ring_bytes()
        m = mmap.mmap(-1, spool.HEADER_SIZE + size + spool.SLACK + spool.TABLE_SIZE)
        m[:spool.HEADER_SIZE] = spool.header_bytes(size, spool.TABLE_SIZE)
        self._use(m, 0, 0)

    def _use(self, m: mmap.mmap, head: int, tail: int) -> None:
        _magic, _v, _h, self.ring_off, self.ring_size, _s, self.table_off, self.table_size = \
            spool._STATIC.unpack_from(m, 0)
        self.m = m
        self.mask = self.ring_size - 1
        self.head = head
        _U64.pack_into(m, spool.OFF_HEAD, head)
        _U64.pack_into(m, spool.OFF_TAIL, tail)
        self.table_used = 0
        _U64.pack_into(m, spool.OFF_TABLE_USED, 0)
        for rec in [*self._groups.values(), *([self._meta] if self._meta else [])]:
            self._table_put(rec)

    # ------------------------------------------------------------------ the hot path
    def put(self, rec: bytes, gid: int = -1) -> int:
        """Append one record (``gid``: the group it refers to, restated in its block); returns
        its position (-1: dropped)."""
        n = len(rec)
        m = self.m
        with self._lock:
            head = self.head
            if head + n - _U64.unpack_from(m, spool.OFF_TAIL)[0] > self.ring_size or n > spool.SLACK:
                self.dropped += 1
                return -1
            off = head & self.mask
            at = self.ring_off + off
            m[at:at + n] = rec  # a record near the ring's end runs on into the slack
            self.head = head + n
            if off + n >= self.ring_size:
                self._wrap_at = self.head
            if gid >= 0:
                self._used.add(gid)
            _U64.pack_into(m, spool.OFF_HEAD, self.head)
        return head

    def unissue(self, pos: int, op_id: int) -> None:
        """The RBEGIN of op ``op_id`` at ``pos`` says seq -1 (its op was never issued,
        ``PythonOps.end``), unless a drain has taken it already (or it was dropped)."""
        m = self.m
        with self._lock:
            if pos < self._taken or pos < _U64.unpack_from(m, spool.OFF_TAIL)[0] or pos + _RBEGIN_SEQ + 8 > self.head:
                return
            at = self.ring_off + (pos & self.mask)
            typ, _flags, _aux, length, _ts, rid = blocks.HEADER.unpack_from(m, at)
            if typ == blocks.RBEGIN and rid == op_id and length >= _RBEGIN_SEQ + 8:
                _I64.pack_into(m, at + _RBEGIN_SEQ, -1)

    def put_many(self, recs: Iterable[bytes]) -> None:
        for rec in recs:
            self.put(rec)

    def group(self, name: str, backend: str, granks: tuple[int, ...] | None) -> int:
        """The id of a group (a GROUP record in the table, restated in blocks)."""
        with self._lock:
            gid = self._gids.get(name)
            if gid is None:
                gid = self._gids[name] = len(self._gids)
            rec = blocks.pack_group(gid, name, backend, granks)
            if self._groups.get(gid) != rec:
                self._groups[gid] = rec
                self._table_put(rec)
            return gid

    def note_meta(self, line: bytes) -> None:
        with self._lock:
            self._meta = blocks.pack_meta(line)
            self._table_put(self._meta)

    def keep_event(self, line: bytes) -> None:
        """An event the store did not take at the end, kept for the forwarder."""
        with self._lock:
            self._table_put(blocks.pack_event(line))

    def note_exit(self, code: int) -> None:
        """``os._exit(code)``: noted in the header, as the native recorder does."""
        m = self.m
        m[spool.OFF_DEATH + 36:spool.OFF_DEATH + 48] = _I32.pack(code) + _I64.pack(time.time_ns())
        m[spool.OFF_DEATH + 32:spool.OFF_DEATH + 36] = _I32.pack(1)

    def _table_put(self, rec: bytes) -> None:
        used = self.table_used
        if used + len(rec) > self.table_size:
            return
        at = self.table_off + used
        self.m[at:at + len(rec)] = rec
        self.table_used = used + len(rec)
        _U64.pack_into(self.m, spool.OFF_TABLE_USED, self.table_used)

    # ------------------------------------------------------------------ the recorder thread
    def _slices(self, start: int, end: int) -> bytes:
        """The records in [start, end), contiguous (they sit in at most two runs)."""
        m, base, mask = self.m, self.ring_off, self.mask
        w = self._wrap_at
        if start < w <= end:
            a = base + (start & mask)
            first = m[a:a + (w - start)]
            b = base + (w & mask)
            return first + m[b:b + (end - w)]
        a = base + (start & mask)
        return m[a:a + (end - start)]

    def drain_block(self, rank: int, ts: int) -> tuple[bytes | None, int, int]:
        """(the ``block`` line of the records since the last drain, or None; their count; its end)."""
        with self._lock:
            start, end = self.drained, self.head
            self._taken = end  # (records before it are no longer changed in place: ``unissue``)
            if start == end:
                return None, 0, start
            data = self._slices(start, end)
            tables = b"".join(self._groups[g] for g in sorted(self._used) if g in self._groups)
            self._used.clear()
        self.drained = end
        n = sum(1 for _ in spool._records(data))
        return blocks.encode_block(tables + data, rank, ts, n, pos=start, end=end), n, end

    def forwarded(self, end: int) -> None:
        with self._lock:
            if _U64.unpack_from(self.m, spool.OFF_TAIL)[0] < end <= self.drained:
                _U64.pack_into(self.m, spool.OFF_TAIL, end)
                _I64.pack_into(self.m, spool.OFF_FORWARDED, time.time_ns())

    # ------------------------------------------------------------------ spools
    def attach(self, fd: int) -> None:
        """Records go to the spool file on ``fd`` from now on (what the store lacks moves along)."""
        head = os.pread(fd, spool.HEADER_SIZE, 0)
        _magic, _v, _h, _ro, ring, _s, table_off, table_size = spool._STATIC.unpack_from(head, 0)
        m = mmap.mmap(fd, table_off + table_size)
        self._switch(m, ring)
        self.file = True

    def detach(self) -> None:
        """Back to anonymous memory."""
        size = self.ring_size
        m = mmap.mmap(-1, spool.HEADER_SIZE + size + spool.SLACK + spool.TABLE_SIZE)
        m[:spool.HEADER_SIZE] = spool.header_bytes(size, spool.TABLE_SIZE)
        self._switch(m, size)
        self.file = False

    def _switch(self, m: mmap.mmap, ring: int) -> None:
        with self._lock:
            tail = _U64.unpack_from(self.m, spool.OFF_TAIL)[0]
            pending = self._slices(tail, self.head)
            old = self.m
            if len(pending) > ring:  # the new ring is smaller: keep what fits (whole records)
                keep = 0
                for _typ, off, _length in spool._records(pending):
                    if len(pending) - off <= ring:
                        keep = off
                        break
                    self.dropped += 1
                tail += keep
                pending = pending[keep:]
            self._use(m, tail, tail)
            self._wrap_at = -1
            pos = tail
            for _typ, off, length in spool._records(pending):
                rec = pending[off:off + length]
                at = self.ring_off + (pos & self.mask)
                m[at:at + length] = rec
                if (pos & self.mask) + length >= self.ring_size:
                    self._wrap_at = pos + length
                pos += length
            self.head = pos
            _U64.pack_into(m, spool.OFF_HEAD, pos)
            self.drained = min(max(self.drained, tail), pos)
            self._used.update(self._gids.values())
        old.close()
