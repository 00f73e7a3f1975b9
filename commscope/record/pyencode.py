"""The recorder thread's side of the Python op source (``pyhot.PythonOps``).

The hot path packs each op's records into the spool ring (``pyspool``), which the thread
drains as blocks, and queues a note of it (``pyqueue``).  Each tick, ``QueueEncoder.collect``
reads those notes to track the ops in flight (for stacks past ``hang_after``, the
heartbeat's count and the ``unwaited`` list at exit), and merges what Flight Recorder saw
of C++-issued collectives (DDP's reducer, functional collectives), which the Python
wrappers cannot see otherwise.  Only the recorder thread calls it.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any

import torch.distributed as dist

from commscope import events
from commscope.record import flight
from commscope.record.pyqueue import QueuedBegin, QueuedEnd, QueuedTaken, QueuedWait


class InFlight:
    """An op (or a wait) the thread has seen begin and not end."""

    __slots__ = ("ts", "name", "tid", "parent", "reported", "is_async")

    def __init__(self, ts: int, name: str, tid: int, parent: int | None, is_async: bool):
        self.ts, self.name, self.tid, self.parent, self.is_async = ts, name, tid, parent, is_async
        self.reported = False


class QueueEncoder:
    """Queued records to events, ops in flight, and the Flight Recorder merge."""

    UNWAITED_CAP = 10_000
    FR_INTERVAL = 1.0  # at least this far apart ...
    FR_DUTY = 0.005  # ... and far enough that dumps take at most 0.5% of the time

    def __init__(self, hot: Any, flight_recorder: bool):
        """``hot``: the ``PythonOps`` whose queue (``q``), groups and CUDA timer this reads."""
        self.hot = hot
        self.rec = hot.rec
        self.convert_failed = 0
        self._inflight: dict[int, InFlight] = {}
        self._waiting: dict[int, InFlight] = {}
        self._unwaited: OrderedDict[int, str] = OrderedDict()  # the latest UNWAITED_CAP of them
        self.unwaited_count = 0  # all of them
        self._windows = flight.WrapperWindows()
        self._top_windows: dict[int, flight.Window] = {}
        self._group_names: set[str] = set()
        self._fr = flight.FlightRecorderMerge(hot.next_id, self._group_ranks) if flight_recorder else None
        self._fr_next = 0.0
        self._fr_missed_reported = 0
        self._failed_ns: int | None = None  # when an op last raised (for stack requests)

    def collect(self, now: int, final: bool, emit, out, rank: int | None) -> None:
        """Move what the hot path queued (and Flight Recorder's new entries) to the store queue."""
        fr_entries = self._poll_fr_entries(final, rank)  # before draining: see flight.py
        self._drain(emit, out, rank)
        if fr_entries is not None:
            for ev in self._fr.poll(fr_entries, self._windows, now):
                if ev.get("phase") == events.BEGIN and ev["group"] not in self._group_names:
                    self._describe_group(ev["group"], now, emit)
                emit(ev)
            self._windows.prune(now)
            missed = self._fr.missed
            if missed > self._fr_missed_reported:
                emit({"type": events.DROPPED, "ts": now, "count": missed - self._fr_missed_reported, "total": missed,
                      "reason": flight.RING_OVERWRITTEN})
                self._fr_missed_reported = missed

    def stuck(self, now: int, limit: int) -> tuple[list[tuple[int, int]], int | None]:
        """(op id, thread id) of ops and waits newly in flight longer than ``limit`` ns (an
        op whose outer op is also in flight leaves the stack to it), and the begin of the
        oldest op past the limit."""
        hits = []
        oldest = None
        inflight, waiting = self._inflight, self._waiting
        for table in (inflight, waiting):
            for op_id, info in table.items():
                if now - info.ts < limit:
                    continue
                if oldest is None or info.ts < oldest:
                    oldest = info.ts
                if info.reported:
                    continue
                info.reported = True
                parent = info.parent
                if parent is not None and (parent in inflight or parent in waiting):
                    continue
                hits.append((op_id, info.tid))
        return hits, oldest

    def failed_ns(self) -> int | None:
        return self._failed_ns

    def inflight(self) -> int:
        return len(self._inflight) + len(self._waiting)

    def unwaited(self) -> tuple[list[int], int]:
        return list(self._unwaited), self.unwaited_count

    def meta(self) -> dict:
        return {"fr": bool(self._fr is not None and flight.fr_env_enabled())}

    def _poll_fr_entries(self, final: bool, rank: int | None) -> list | None:
        if self._fr is None or rank is None:
            return None
        mono = time.monotonic()
        if not final and mono < self._fr_next:
            return None
        try:
            entries = flight.dump_entries()
            # A dump of a full ring costs ~15-20 ms with the GIL held: space them out so
            # the training thread loses at most FR_DUTY of its time to them.
            spent = time.monotonic() - mono
            self._fr_next = time.monotonic() + max(self.FR_INTERVAL, spent / self.FR_DUTY)
            return entries
        except Exception as exc:
            self._fr_next = mono + self.FR_INTERVAL
            self._fr.errors += 1
            if self._fr.errors >= 3:
                self._fr = None  # unavailable here; stop asking
                self.rec.warn("fr", f"commscope: Flight Recorder merge disabled: {exc!r}")
            return None

    def poll_fr_soon(self) -> None:
        self._fr_next = 0.0

    def _drain(self, emit, out, rank: int | None) -> None:
        q = self.hot.q
        for _ in range(len(q)):
            item = q.popleft()
            try:
                self._convert(item, emit, out, rank)
            except Exception as exc:  # one odd item must not cost the rest of the batch
                self.convert_failed += 1
                self.rec.drop_note = "an event could not be encoded"
                self.rec.warn("convert", f"commscope: could not record an event ({exc!r}); recording continues")

    def _convert(self, item: Any, emit, out, rank: int | None) -> None:
        """Bookkeeping of one queued record (the record itself is in the spool ring)."""
        inflight, waiting, unwaited = self._inflight, self._waiting, self._unwaited
        cls = type(item)
        if cls is QueuedBegin:
            inflight[item.op_id] = InFlight(item.ts, item.name, item.tid, item.parent, item.async_op)
            if item.parent is None and self._fr is not None:
                self._top_windows[item.op_id] = self._windows.open(item.tid, item.group, item.ts)
        elif cls is QueuedEnd:
            if item.exc is not None:
                self._failed_ns = item.ts
            info = inflight.pop(item.op_id, None)
            win = self._top_windows.pop(item.op_id, None)
            if win is not None:
                win.end = item.ts
            if info is not None and info.is_async and item.exc is None:
                unwaited[item.op_id] = info.name
                self.unwaited_count += 1
                if len(unwaited) > self.UNWAITED_CAP:
                    unwaited.popitem(last=False)
        elif cls is QueuedWait:
            if item.exc is not None:
                self._failed_ns = item.ts
            for op_id in item.op_ids:
                if item.begin:
                    name = unwaited.pop(op_id, None)
                    if name is not None:
                        self.unwaited_count -= 1
                    waiting[op_id] = InFlight(item.ts, name or "?", item.tid, None, False)
                else:
                    waiting.pop(op_id, None)
        elif cls is QueuedTaken:
            for op_id in item.op_ids:
                if unwaited.pop(op_id, None) is not None:
                    self.unwaited_count -= 1

    def _group_ranks(self, name: str) -> tuple[int, ...] | None:
        """A group's global ranks by name (the recorder thread's side: Flight Recorder
        names a p2p peer as a group rank); None when the group is unknown here."""
        for info in list(self.hot._groups.values()):
            if info.name == name:
                return info.granks
        try:
            for pg, pg_name in list(_c10d_world.pg_names.items()):
                if str(pg_name) == name:
                    return tuple(dist.get_process_group_ranks(pg))
        except Exception:
            pass
        return None

    def _describe_group(self, name: str, now: int, emit) -> None:
        """A ``group`` event for a group used only from C++ (seen via Flight Recorder)."""
        self._group_names.add(name)
        try:
            for pg, pg_name in list(_c10d_world.pg_names.items()):
                if str(pg_name) == name:
                    emit({"type": events.GROUP, "ts": now, "group": name,
                          "granks": list(dist.get_process_group_ranks(pg)), "backend": str(dist.get_backend(pg))})
                    return
        except Exception:
            pass  # unknown to Python (already destroyed): members are inferred from the trace


try:
    from torch.distributed.distributed_c10d import _world as _c10d_world
except ImportError:  # very old torch
    _c10d_world = None
