"""Merge PyTorch Flight Recorder entries the Python wrapper never saw.

Collectives issued from C++ (DDP's gradient all-reduce, ``_broadcast_coalesced``) bypass
``torch.distributed``'s Python functions.  Flight Recorder (enabled by
``TORCH_FR_BUFFER_SIZE`` > 0 before the process group is created) logs every collective
of every process group.  The recorder thread polls it and records each entry that falls
outside the wrapper's own ops, as ops with ``src: "fr"`` and Flight Recorder's sequence
ids.  An entry is the wrapper's own when it was created on the same thread and group
during a top-level wrapped op (that also covers the inner traffic of object and varlen
ops).  The dump comes from this very process, so reading its pickle is safe.
"""

from __future__ import annotations

import os
import pickle
from collections import deque
from typing import Any

_BACKENDS = ("nccl:", "gloo:", "ucc:", "mpi:", "xccl:")

#: The reason of ``dropped`` events that count Flight Recorder ring overwrites: entries the
#: merge never saw, not events the recorder lost (most are ops the wrapper recorded).
RING_OVERWRITTEN = "Flight Recorder ring overwritten between polls (C++-issued collectives missing)"


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
    """'nccl:send 0->1' -> ('send', 'send', 1); 'gloo:all_reduce' -> ('all_reduce', None, None)."""
    name = profiling_name or "unknown"
    for prefix in _BACKENDS:
        if name.startswith(prefix):
            name = name[len(prefix):]
            break
    parts = name.split()
    base = parts[0] if parts else "unknown"
    direction = "send" if base in ("send", "isend") else "recv" if base in ("recv", "irecv", "recv_anysource") else None
    peer = None
    if direction and len(parts) > 1 and "->" in parts[1]:
        src, _, dst = parts[1].partition("->")
        try:
            peer = int(dst if direction == "send" else src)
        except ValueError:
            peer = None
    return base, direction, peer


def _finished(entry: dict) -> bool:
    return bool(entry.get("retired")) or entry.get("state") == "completed"


class WrapperWindows:
    """Recent top-level wrapper ops per (thread, group), to tell our ops from C++ ones."""

    KEEP_NS = 120 * 10**9
    MAX = 8192

    def __init__(self) -> None:
        self._by_key: dict[tuple[int, str], deque[list]] = {}

    def open(self, tid: int, group: str, ts: int) -> list:
        win = [ts, None]
        q = self._by_key.get((tid, group))
        if q is None:
            q = self._by_key.setdefault((tid, group), deque(maxlen=self.MAX))
        q.append(win)
        return win

    def covers(self, tid: int | None, group: str, ts: int) -> bool:
        keys = [(tid, group)] if tid is not None else [k for k in self._by_key if k[1] == group]
        for key in keys:
            for begin, end in reversed(self._by_key.get(key, ())):
                if begin <= ts and (end is None or ts <= end):
                    return True
                if end is not None and end < ts:
                    break  # windows are in time order; older ones end even earlier
        return False

    def prune(self, now: int) -> None:
        for q in self._by_key.values():
            while q and q[0][1] is not None and now - q[0][1] > self.KEEP_NS:
                q.popleft()


class FlightRecorderMerge:
    """Turns new Flight Recorder entries into schema events (without rank/v, like the rest)."""

    def __init__(self, next_id) -> None:
        self._next_id = next_id
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
            group = str((entry.get("process_group") or ["?"])[0])
            if group == "":  # TORCH_DISTRIBUTED_DEBUG=DETAIL's hidden helper groups: not user ops
                continue
            created = int(entry.get("time_created_ns") or now)
            tid = entry.get("thread_id")
            try:
                tid = int(tid) if tid is not None else None
            except (TypeError, ValueError):
                tid = None
            if windows.covers(tid, group, created):
                continue
            out.extend(self._begin(entry, group, created, now))
        # Close entries that finished (or fell out of the ring buffer) since last time.
        # Without a completion time (Gloo), the best bound is when it was last seen running.
        for rid in list(self._open):
            entry = by_record.get(rid)
            if entry is None:
                op_id, seen = self._open.pop(rid)
                out.append(self._end(op_id, seen, approx=True))
            elif _finished(entry):
                op_id, seen = self._open.pop(rid)
                out.append(self._end_from(op_id, entry, seen))
            else:
                self._open[rid] = (self._open[rid][0], now)
        return out

    def _begin(self, entry: dict, group: str, created: int, now: int) -> list[dict]:
        op_id = self._next_id()
        name, direction, peer = op_name(str(entry.get("profiling_name") or ""))
        is_p2p = bool(entry.get("is_p2p")) or direction is not None
        seq = entry.get("p2p_seq_id") if is_p2p else entry.get("collective_seq_id")
        begin: dict[str, Any] = {"type": "op", "ts": created, "phase": "begin", "id": op_id, "op": name,
                                 "group": group, "src": "fr"}
        if isinstance(seq, int):
            begin["seq"] = seq
        if direction:
            begin["dir"] = direction
        if peer is not None:
            begin["peer"] = peer
        ins, outs = entry.get("input_sizes") or [], entry.get("output_sizes") or []
        idt, odt = entry.get("input_dtypes") or [], entry.get("output_dtypes") or []
        begin.update(in_shapes=ins, in_dtypes=[_dtype(d) for d in idt], in_bytes=_nbytes(ins, idt),
                     out_shapes=outs, out_dtypes=[_dtype(d) for d in odt], out_bytes=_nbytes(outs, odt))
        events = [begin]
        if _finished(entry):
            events.append(self._end_from(op_id, entry, created))
        else:
            self._open[entry["record_id"]] = (op_id, now)
        return events

    def _end_from(self, op_id: int, entry: dict, fallback_ts: int) -> dict:
        completed = entry.get("time_discovered_completed_ns") or 0
        ev = self._end(op_id, int(completed) if completed else fallback_ts, approx=not completed)
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


_DTYPE_BYTES = {
    "Float": ("float32", 4), "Double": ("float64", 8), "Half": ("float16", 2), "BFloat16": ("bfloat16", 2),
    "Long": ("int64", 8), "Int": ("int32", 4), "Short": ("int16", 2), "Char": ("int8", 1),
    "Byte": ("uint8", 1), "Bool": ("bool", 1), "ComplexFloat": ("complex64", 8),
    "ComplexDouble": ("complex128", 16),
}


def _dtype(name: str) -> str:
    return _DTYPE_BYTES.get(name, (str(name).lower(), 0))[0]


def _nbytes(shapes: list, dtypes: list) -> int:
    total = 0
    for shape, dt in zip(shapes, dtypes, strict=False):
        n = 1
        for d in shape:
            n *= int(d)
        total += n * _DTYPE_BYTES.get(dt, ("", 0))[1]
    return total
