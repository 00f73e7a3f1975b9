"""Merge PyTorch Flight Recorder entries the Python wrapper never saw.

Collectives issued from C++ (DDP's gradient all-reduce, ``_broadcast_coalesced``) bypass
``torch.distributed``'s Python functions.  Flight Recorder (enabled by
``TORCH_FR_BUFFER_SIZE`` > 0 before the process group is created) logs every collective
of every process group.  The recorder thread polls it and records each entry that falls
outside the wrapper's own ops, as ops with ``src: "fr"`` and Flight Recorder's sequence
ids.  An entry is the wrapper's own when it was created on the same thread and group
during a top-level wrapped op (that also covers the inner traffic of object and varlen
ops).  The dump comes from this very process, so reading its pickle is safe.

What an entry means (op, direction, the peer as a global rank, dtypes, bytes) is read by
``commscope.flightfmt``, the translator the dump import (``analysis/flight_import.py``)
uses too; the recorder passes it the ranks of its groups (``pyhot.PythonOps._group_ranks``).
"""

from __future__ import annotations

import os
import pickle
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from commscope.events import FR_OVERWRITE
from commscope.flightfmt import FrOp, completed_ns, finished, group_of, parse_name, tensor_fields, thread_id

#: The reason of ``dropped`` events that count Flight Recorder ring overwrites: entries the
#: merge never saw, not events the recorder lost (most are ops the wrapper recorded).
RING_OVERWRITTEN = f"{FR_OVERWRITE} between polls (C++-issued collectives missing)"


def fr_env_enabled() -> bool:
    for name in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        try:
            if int(os.environ.get(name, "0")) > 0:
                return True
        except ValueError:
            pass
    return False


def dump_entries() -> list[dict[str, Any]]:
    """This process's Flight Recorder entries (oldest first), without stack traces."""
    import torch._C._distributed_c10d as c10d

    if hasattr(c10d, "_dump_fr_trace"):
        raw = c10d._dump_fr_trace(includeCollectives=True, includeStackTraces=False, onlyActive=False)
        data = pickle.loads(raw)  # our own process's dump, not a file: trusted
    else:
        import json

        data = json.loads(c10d._dump_fr_trace_json(includeCollectives=True, onlyActive=False))
    return list(data.get("entries") or [])


def op_name(profiling_name: str) -> tuple[str, str | None, int | None]:
    """'nccl:send 0->1' -> ('send', 'send', 1); 'gloo:all_reduce' -> ('all_reduce', None, None).
    The peer is a group rank (``flightfmt.parse_name`` without the backend)."""
    return parse_name(profiling_name)[1:]


class Window:
    """When a top-level wrapper op ran: from its begin to its end (None while in flight)."""

    __slots__ = ("begin", "end")

    def __init__(self, begin: int) -> None:
        self.begin = begin
        self.end: int | None = None


class WrapperWindows:
    """Recent top-level wrapper ops per (thread, group), to tell our ops from C++ ones."""

    KEEP_NS = 120 * 10**9
    MAX = 8192

    def __init__(self) -> None:
        self._by_key: dict[tuple[int, str], deque[Window]] = {}

    def open(self, tid: int, group: str, ts: int) -> Window:
        """A window from ``ts``; the caller sets its ``end`` when the op ends."""
        win = Window(ts)
        q = self._by_key.get((tid, group))
        if q is None:
            q = self._by_key.setdefault((tid, group), deque(maxlen=self.MAX))
        q.append(win)
        return win

    def covers(self, tid: int | None, group: str, ts: int) -> bool:
        keys = [(tid, group)] if tid is not None else [k for k in self._by_key if k[1] == group]
        for key in keys:
            for win in reversed(self._by_key.get(key, ())):
                end = win.end
                if win.begin <= ts and (end is None or ts <= end):
                    return True
                if end is not None and end < ts:
                    break  # windows are in time order; older ones end even earlier
        return False

    def prune(self, now: int) -> None:
        for q in self._by_key.values():
            while q and q[0].end is not None and now - q[0].end > self.KEEP_NS:
                q.popleft()


class FlightRecorderMerge:
    """Turns new Flight Recorder entries into schema events (without rank/v, like the rest)."""

    def __init__(self, next_id, ranks_of: Callable[[str], Sequence[int] | None] | None = None) -> None:
        """``ranks_of``: a group's global ranks by group name (to map a p2p entry's group
        peer to a global rank, as the wrapper records it); None: peers stay group ranks."""
        self._next_id = next_id
        self._ranks_of = ranks_of
        self.last_record_id = -1
        self._open: dict[int, tuple[int, int]] = {}  # record_id -> (op id, when seen unfinished)
        self.errors = 0
        self.seen = 0
        self.missed = 0  # entries the ring overwrote before a poll read them

    def poll(self, entries: list[dict], windows: WrapperWindows, now: int) -> list[dict]:
        out: list[dict] = []
        by_record = {}
        ids = [e.get("record_id") for e in entries if isinstance(e.get("record_id"), int)]
        if ids and self.last_record_id >= 0 and min(ids) > self.last_record_id + 1:
            self.missed += min(ids) - self.last_record_id - 1
        for entry in entries:
            rid = entry.get("record_id")
            if not isinstance(rid, int):
                continue
            by_record[rid] = entry
            if rid <= self.last_record_id:
                continue
            self.last_record_id = rid
            self.seen += 1
            group = group_of(entry)[0]
            if group == "":  # TORCH_DISTRIBUTED_DEBUG=DETAIL's hidden helper groups: not user ops
                continue
            created = int(entry.get("time_created_ns") or now)
            if windows.covers(thread_id(entry), group, created):
                continue
            out.extend(self._begin(entry, group, created, now))
        # Close entries that finished (or fell out of the ring buffer) since last time.
        # Without a completion time (Gloo), the best bound is when it was last seen running.
        for rid in list(self._open):
            entry = by_record.get(rid)
            if entry is None:
                op_id, seen = self._open.pop(rid)
                out.append(self._end(op_id, seen, approx=True))
            elif finished(entry):
                op_id, seen = self._open.pop(rid)
                out.append(self._end_from(op_id, entry, seen))
            else:
                self._open[rid] = (self._open[rid][0], now)
        return out

    def _begin(self, entry: dict, group: str, created: int, now: int) -> list[dict]:
        op_id = self._next_id()
        fr = FrOp(entry, self._ranks_of)
        seq = entry.get("p2p_seq_id") if fr.is_p2p else entry.get("collective_seq_id")
        begin: dict[str, Any] = {"type": "op", "ts": created, "phase": "begin", "id": op_id, "op": fr.op,
                                 "group": group, "src": "fr"}
        if isinstance(seq, int):
            begin["seq"] = seq
        if fr.direction:
            begin["dir"] = fr.direction
        if fr.peer is not None:
            begin["peer"] = fr.peer
        begin.update(tensor_fields(entry))
        events = [begin]
        if finished(entry):
            events.append(self._end_from(op_id, entry, created))
        else:
            self._open[entry["record_id"]] = (op_id, now)
        return events

    def _end_from(self, op_id: int, entry: dict, fallback_ts: int) -> dict:
        completed = completed_ns(entry)
        ev = self._end(op_id, completed or fallback_ts, approx=not completed)
        dur = entry.get("duration_ms")
        if isinstance(dur, int | float) and dur >= 0:
            ev["gpu_ns"] = int(dur * 1e6)
        return ev

    @staticmethod
    def _end(op_id: int, ts: int, approx: bool) -> dict:
        ev: dict[str, Any] = {"type": "op", "ts": ts, "phase": "end", "id": op_id}
        if approx:
            ev["approx"] = True
        return ev
