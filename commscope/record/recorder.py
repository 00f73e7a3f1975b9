"""The Recorder: a cheap hot path that appends tuples, and one thread that does the rest.

Hot path (the training thread, inside each wrapped call): resolve the group, bump a
sequence counter, note shapes/dtypes/bytes and the call site, append a tuple to a
bounded deque.  No I/O, no locks, no device syncs.

Recorder thread (every ``TICK``): turn tuples into schema events, track ops in flight,
capture stacks of ops stuck past ``hang_after``, sample CPU/GPU, write heartbeats, poll
CUDA events and Flight Recorder, and write to the store.  A slow, full or missing store
never blocks training: events wait in a bounded buffer, then are dropped and counted.
"""

from __future__ import annotations

import atexit
import itertools
import os
import socket
import sys
import threading
import time
import warnings
import weakref
from collections import OrderedDict, deque
from threading import get_ident
from typing import Any, NamedTuple

import orjson
import torch
import torch.distributed as dist

from commscope import __version__
from commscope import events as E
from commscope.events import encode as _dumps
from commscope.events import signature_key
from commscope.record import callsite, crashlog, flight, hangsignal, patch
from commscope.record.cuda_timing import CudaTimer
from commscope.record.ops import (
    TAG_BEGIN,
    TAG_END,
    TAG_EXIT,
    TAG_GROUP,
    TAG_WAIT_BEGIN,
    TAG_WAIT_END,
)
from commscope.record.probes import ResourceProbe
from commscope.store import StoreError, default_store, open_writer, redact

ENV_HANG_AFTER = "COMMSCOPE_HANG_AFTER"
ENV_JOB = "COMMSCOPE_JOB"
DEFAULT_HANG_AFTER = 30.0

_B, _E, _WB, _WE, _G, _X = TAG_BEGIN, TAG_END, TAG_WAIT_BEGIN, TAG_WAIT_END, TAG_GROUP, TAG_EXIT

_REDUCING = frozenset({"all_reduce", "all_reduce_coalesced", "reduce", "reduce_scatter",
                       "reduce_scatter_tensor", "reduce_scatter_single", "reduce_scatter_v"})


class _OpStack(threading.local):
    """The op a thread is inside (its nested traffic gets it as parent).  A class default:
    ``getattr(local, "cur", None)`` on an unset attribute raises internally (~300 ns)."""

    cur: int | None = None


class GroupInfo(NamedTuple):
    name: str
    granks: tuple[int, ...]
    backend: str


def _fmt_exc(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _redop_name(op: Any) -> str:
    name = getattr(op, "name", None) or str(op)
    return name.rsplit(".", 1)[-1].lower()


def _pairs(desc: tuple) -> tuple:
    """Tensor descriptions: the hot path writes one tensor as a flat (shape, dtype) to
    save an allocation, several as ((shape, dtype), ...)."""
    return (desc,) if type(desc[0]) is torch.Size else desc


_time_ns = time.time_ns
_weakref = weakref.ref
_WAIT_PATCHED = patch._wait_patched
_DTYPE_NAMES: dict[Any, str] = {}


def _dtype_name(dt: Any) -> str:
    name = _DTYPE_NAMES.get(dt)
    if name is None:
        name = _DTYPE_NAMES[dt] = str(dt).replace("torch.", "")
    return name


class Recorder:
    TICK = 0.05  # seconds between drains; a begin reaches the store within ~2 ticks
    QUEUE_CAP = 100_000  # hot-path tuples waiting for the thread (about 50 MB at most)
    PENDING_CAP = 100_000  # encoded events waiting for a writable store (about 30 MB)
    EARLY_CAP = 1_000
    FR_INTERVAL = 1.0  # at least this far apart ...
    FR_DUTY = 0.005  # ... and far enough that dumps take at most 0.5% of the time
    UNWAITED_CAP = 10_000

    def __init__(self, store: Any = None, *, hang_after: float | None = None, capture_stacks: bool = True,
                 sample_interval: float = 1.0, flight_recorder: bool = True):
        self.store = default_store(store)
        if hang_after is None:
            try:
                hang_after = float(os.environ.get(ENV_HANG_AFTER) or DEFAULT_HANG_AFTER)
            except ValueError:
                hang_after = DEFAULT_HANG_AFTER
        self.hang_after = float(hang_after)
        self.capture_stacks = capture_stacks
        self.sample_interval = max(0.05, float(sample_interval))
        self.flight_recorder = flight_recorder
        # hot path state
        self.q: deque = deque()
        self.hot_dropped = 0
        self._next_id = itertools.count(1).__next__
        self._seq: dict[Any, int] = {}
        self._groups: dict[Any, GroupInfo] = {}
        self._tls = _OpStack()
        self.works: dict[int, tuple] = {}
        # thread state
        self.rank: int | None = None
        self.job: str | None = None
        self.writer: Any = None
        self.pending: deque[bytes] = deque()  # encoded events not yet in the store
        self._early: deque[dict] = deque()  # events from before the rank is known
        self.store_dropped = 0
        self._dropped_reported = 0
        self._store_error: str | None = None
        self._warned: set[str] = set()
        self._retry_at = 0.0
        self._retry_delay = 0.5
        self._inflight: dict[int, list] = {}  # id -> [ts, name, tid, parent, stacked, group, seq]
        self._waiting: dict[int, list] = {}
        self._unwaited: OrderedDict[int, str] = OrderedDict()
        self._windows = flight.WrapperWindows()
        self._frags: dict[tuple, bytes] = {}
        self._group_names: set[str] = set()
        self._drop_note: str | None = None
        self._top_windows: dict[int, list] = {}
        self._fr = flight.FlightRecorderMerge(self._next_id) if flight_recorder else None
        self._fr_next = 0.0
        self._fr_missed_reported = 0
        self._next_sample = 0.0
        self._probe: ResourceProbe | None = None
        self.cuda: CudaTimer | None = None
        self._gpu_index: int | None = None
        self.crash: str | None = None
        self.failed_ns: int | None = None  # when an op of this rank last raised (see hangsignal)
        self.exited = False
        self._thread: threading.Thread | None = None
        self.need_job = False  # the job id is still unknown: see settle_job
        self._job_wait_since: float | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._ticks = 0
        self._tick_lock = threading.Lock()
        self.started_ns = time.time_ns()

    # ------------------------------------------------------------------ hot path
    def _group(self, pg: Any) -> GroupInfo | None:
        info = self._groups.get(pg)
        if info is None:
            try:
                name = str(pg.group_name)
                granks = tuple(dist.get_process_group_ranks(pg))
                try:
                    backend = str(dist.get_backend(pg))
                except Exception:
                    backend = "?"
            except Exception:
                return None  # not a group of ours (e.g. NON_GROUP_MEMBER): torch decides
            info = GroupInfo(name, granks, backend)
            self._groups[pg] = info
            self.q.append((_G, time.time_ns(), name, granks, backend))
        return info

    def begin(self, name: str, a: tuple, frame: Any, child_of: int | None = None,
              container: bool = False, nests: bool = False) -> tuple | None:
        """Queue a ``begin`` and return the token ``end`` needs, or None to not record.

        ``a`` is an extractor tuple (see ``ops.OpArgs``).  ``container`` ops
        (batch_isend_irecv) take no sequence number.  ``nests``: the op calls other wrapped
        ops (varlen), so it becomes their parent; torch's own functions call unwrapped
        globals and never nest, which saves them two thread-local writes.  The token is a
        plain tuple (id, parent, async, recv_any, cuda, nests): this runs on every call.
        """
        q = self.q
        if len(q) >= self.QUEUE_CAP:
            self.hot_dropped += 1
            return None
        pg, peer, direction, root, redop, async_op, ins, outs = a
        if pg is None:
            try:
                pg = _c10d_world._default_pg
            except AttributeError:
                pg = patch.default_group()
            if pg is None:
                return None
        info = self._groups.get(pg) or self._group(pg)
        if info is None:
            return None
        tls = self._tls
        parent = tls.cur if child_of is None else child_of
        nested = parent is not None and child_of is None
        gname = info[0]
        if peer is not None and type(peer) is tuple:
            peer = info[1][peer[1]] if 0 <= peer[1] < len(info[1]) else None
        if root is not None and type(root) is tuple:
            root = info[1][root[1]] if 0 <= root[1] < len(info[1]) else None
        recv_any = seq = site = None
        if not nested:
            if direction is None:
                key: Any = gname
            elif peer is None:
                key = None
                recv_any = gname
            else:
                key = (gname, peer, direction)
            if key is not None and not container:
                seqs = self._seq
                seq = seqs[key] = seqs.get(key, 0) + 1
            code = frame.f_code
            hit = _internal_cache.get(id(code))
            if hit is not None and not hit[1]:  # the usual case: called from user code
                site = (id(code), frame.f_lasti)
            else:
                site = callsite.user_frame(frame)
        t0 = idesc = ib = odesc = ob = None
        try:
            if ins:
                t0 = ins[0]
                if len(ins) == 1:  # one tensor: a flat (shape, dtype); see _pairs
                    idesc, ib = (t0.shape, t0.dtype), t0.nbytes
                else:
                    idesc = tuple([(t.shape, t.dtype) for t in ins])
                    ib = sum([t.nbytes for t in ins])
            if outs is ins:
                odesc, ob = idesc, ib
            elif outs:
                t = outs[0]
                if len(outs) == 1:
                    odesc, ob = (t.shape, t.dtype), t.nbytes
                else:
                    odesc = tuple([(t.shape, t.dtype) for t in outs])
                    ob = sum([t.nbytes for t in outs])
                if t0 is None:
                    t0 = t
            cuda = self._cuda_start(t0) if t0 is not None and t0.is_cuda else None
        except Exception:
            t0 = idesc = ib = odesc = ob = cuda = None
        op_id = self._next_id()
        q.append((_B, op_id, _time_ns(), name, gname, seq, peer, direction, root, redop, idesc, ib,
                  odesc, ob, async_op, site, get_ident(), parent, nested, None if cuda is None else cuda[1]))
        if nests:
            tls.cur = op_id
        return (op_id, parent, async_op, recv_any, cuda, nests)

    def end(self, tok: tuple, exc: BaseException | None, ret: Any) -> None:
        ts = time.time_ns()
        op_id, parent, async_op, recv_any, cuda, nests = tok
        if nests:
            self._tls.cur = parent
        extra = None
        if recv_any is not None and exc is None and isinstance(ret, int) and ret >= 0:
            key = (recv_any, ret, "recv")
            seq = self._seq[key] = self._seq.get(key, 0) + 1
            extra = (ret, seq)
        self.q.append((_E, op_id, ts, None if exc is None else _fmt_exc(exc), extra))
        if self.need_job:
            self.settle_job()
        if exc is not None:
            return
        if async_op:
            if ret is not None:
                self.track(ret, (op_id,), cuda)
        elif cuda is not None:
            self._cuda_stop((op_id,), cuda)

    def track(self, work: Any, op_ids: tuple, cuda: tuple | None) -> None:
        """Remember which ops a Work (or varlen handle) completes when waited on."""
        works = self.works
        if len(works) > 4096:
            for k, v in list(works.items()):
                if v[0]() is None:
                    del works[k]
        try:
            works[id(work)] = (_weakref(work), op_ids, cuda)
        except TypeError:
            return
        cls = type(work)
        if cls not in _WAIT_PATCHED:
            patch.ensure_wait_patched(cls)

    def wait_begin(self, op_ids: tuple) -> None:
        self.q.append((_WB, op_ids, time.time_ns(), None, threading.get_ident()))

    def wait_end(self, op_ids: tuple, exc: BaseException | None, cuda: tuple | None) -> None:
        self.q.append((_WE, op_ids, time.time_ns(), None if exc is None else _fmt_exc(exc), None))
        if cuda is not None and exc is None:
            self._cuda_stop(op_ids, cuda)

    def _cuda_start(self, t: Any) -> tuple | None:
        try:
            if self.cuda is None:
                self.cuda = CudaTimer()
            dev = t.device.index
            if self._gpu_index is None:
                self._gpu_index = dev
            return (self.cuda.record(dev), dev)
        except Exception:
            return None

    def _cuda_stop(self, op_ids: tuple, cuda: tuple) -> None:
        try:
            start, dev = cuda
            end = self.cuda.record(dev)
            self.cuda.finish(op_ids[0], start, end, dev)
        except Exception:
            pass

    # ------------------------------------------------------------------ lifecycle
    def on_group_created(self) -> None:
        """The default process group now exists: settle the job id while rank 0 is surely up."""
        if self.job is None:
            from commscope.record.jobid import publish

            try:
                self.job = publish(dist.get_rank())
            except Exception:
                self.job = None
            self.need_job = self.job is None

    JOB_WAIT = 15.0  # seconds to wait for rank 0's job id before deriving one

    def _settle_job_from_thread(self) -> bool:
        """One quick, non-blocking try per tick (the training thread may settle it first)."""
        from commscope.record.jobid import fallback_job_id, publish

        job = publish(self.rank)
        if self.job is None and job:
            self.job = job
        if self.job is not None:
            return True
        mono = time.monotonic()
        if self._job_wait_since is None:
            self._job_wait_since = mono
        if mono - self._job_wait_since < self.JOB_WAIT:
            return False
        self.job = fallback_job_id()
        self._warn("job", f"commscope: rank {self.rank} could not learn the job id from rank 0; "
                          f"recording to {self.job}")
        return True

    def settle_job(self) -> None:
        """Called by the wrapper right after an op completed while the job id is unknown.

        A completed op means rank 0 has created its process group and so published the
        id: one short check/get on the c10d store, from the training thread itself (so no
        contention with it), makes even very short jobs agree before rank 0 can exit.
        """
        self.need_job = False
        if self.job is None:
            from commscope.record.jobid import publish

            try:
                self.job = publish(dist.get_rank())
            except Exception:
                pass

    def start(self) -> None:
        """Start the thread (once); settles the job id if the process group exists."""
        if self._thread is not None:
            return
        if dist.is_available() and dist.is_initialized():
            self.on_group_created()
        self._thread = threading.Thread(target=self._run, name="commscope-recorder", daemon=True)
        self._thread.start()

    def flush(self, timeout: float = 1.0) -> bool:
        """Ask the thread for a full tick (Flight Recorder included) and wait, bounded."""
        if self._thread is None or not self._thread.is_alive():
            return False
        self._fr_next = 0.0
        self._fr_missed_reported = 0
        target = self._ticks + 2
        deadline = time.monotonic() + timeout
        while self._ticks < target and time.monotonic() < deadline:
            self._wake.set()
            time.sleep(0.002)
        return self._ticks >= target

    def mark_exit(self, reason: str) -> None:
        """Queue the ``exit`` event (clean shutdown) once; later ops re-open the rank."""
        if self.exited:
            return
        self.exited = True
        self.q.append((_X, time.time_ns(), reason))

    def stop(self, reason: str = "uninstrument", timeout: float = 3.0) -> None:
        self.mark_exit(reason)
        self._stop.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        elif self._thread is None:
            self._tick(final=True)

    # ------------------------------------------------------------------ thread
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._tick()
            except Exception as exc:  # the recorder must never take the process down
                self._warn("internal", f"commscope recorder error (recording continues): {exc!r}")
            self._wake.wait(self.TICK)
            self._wake.clear()
        try:
            self._tick(final=True)
        except Exception as exc:
            self._warn("internal", f"commscope recorder error at shutdown: {exc!r}")

    def _warn(self, key: str, message: str) -> None:
        if key in self._warned:
            return
        self._warned.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=2)

    def _tick(self, final: bool = False) -> None:
        with self._tick_lock:
            now = time.time_ns()
            if self.rank is None and dist.is_available() and dist.is_initialized():
                self.rank = dist.get_rank()
                for ev in self._early:
                    self._emit(ev)
                self._early.clear()
            emit = self._emit
            fr_entries = self._poll_fr_entries(now, final)  # before draining: see flight.py
            exit_ev = self._drain(emit)
            if fr_entries is not None:
                for ev in self._fr.poll(fr_entries, self._windows, now):
                    if ev.get("phase") == E.BEGIN and ev["group"] not in self._group_names:
                        self._describe_group(ev["group"], now, emit)
                    emit(ev)
                self._windows.prune(now)
            if self.cuda is not None:
                for op_id, gpu_ns in self.cuda.poll():
                    emit({"type": E.OP, "ts": time.time_ns(), "phase": E.DONE, "id": op_id, "gpu_ns": gpu_ns})
            if self.capture_stacks:
                stuck_ns = self._check_hangs(now, emit)
                hangsignal.tick(self, now, max(stuck_ns or 0, self.failed_ns or 0) or None, emit, final)
            crashlog.tick(self, emit, final)
            if final or time.monotonic() >= self._next_sample:
                self._next_sample = time.monotonic() + self.sample_interval
                self._samples(now, emit)
            fr_missed = self._fr.missed if self._fr is not None else 0
            if fr_missed > self._fr_missed_reported:
                emit({"type": E.DROPPED, "ts": now, "count": fr_missed - self._fr_missed_reported,
                      "total": fr_missed, "reason": "Flight Recorder ring overwritten between polls "
                                                    "(C++-issued collectives missing)"})
                self._fr_missed_reported = fr_missed
            dropped = self.hot_dropped + self.store_dropped + (self.cuda.dropped if self.cuda else 0)
            if dropped > self._dropped_reported:
                reason = self._drop_reason()
                emit({"type": E.DROPPED, "ts": now, "count": dropped - self._dropped_reported,
                      "total": dropped, "reason": reason})
                self._dropped_reported = dropped
                self._warn("dropped", f"commscope: dropped {dropped} trace events ({reason}); training is unaffected")
            if exit_ev is not None:
                emit(exit_ev)  # last, after any Flight Recorder ops of the same tick
            self._write(final)
            self._ticks += 1

    def _emit(self, ev: dict) -> None:
        """Stamp and encode one event at once, so no batch of dicts outlives the tick."""
        if self.rank is None:
            if len(self._early) >= self.EARLY_CAP:
                self._early.popleft()
                self.store_dropped += 1
            self._early.append(ev)
            return
        ev["v"] = E.SCHEMA_VERSION
        ev["rank"] = self.rank
        pending = self.pending
        if len(pending) >= self.PENDING_CAP:
            pending.popleft()
            self.store_dropped += 1
        pending.append(_dumps(ev))

    def _drop_reason(self) -> str:
        if self._store_error:
            return self._store_error
        if self._drop_note:
            note, self._drop_note = self._drop_note, None
            return note
        return "recorder buffer full"

    def _poll_fr_entries(self, now: int, final: bool) -> list | None:
        if self._fr is None or self.rank is None:
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
                self._warn("fr", f"commscope: Flight Recorder merge disabled: {exc!r}")
            return None

    def _drain(self, append) -> dict | None:
        """Convert queued tuples to events; returns the ``exit`` event, held back."""
        q = self.q
        exit_ev = None
        frags, top_windows, fr_on = self._frags, self._top_windows, self._fr is not None
        rank = self.rank
        out = self._out
        if len(frags) > 20_000:
            frags.clear()
        for _ in range(len(q)):
            item = q.popleft()
            try:
                exit_ev = self._convert(item, append, out, rank, frags, top_windows, fr_on) or exit_ev
            except Exception as exc:  # one odd item must not cost the rest of the batch
                self.store_dropped += 1
                self._drop_note = "an event could not be encoded"
                self._warn("convert", f"commscope: could not record an event ({exc!r}); recording continues")
        return exit_ev

    def _convert(self, item: tuple, append, out, rank, frags, top_windows, fr_on) -> dict | None:
        """One queued tuple into its event(s); returns an ``exit`` event instead of emitting it."""
        inflight, waiting, unwaited = self._inflight, self._waiting, self._unwaited
        exit_ev = None
        tag = item[0]
        if tag == _B:
            (_, op_id, ts, name, group, seq, peer, direction, root, redop, idesc, ib, odesc, ob, async_op,
             site, tid, parent, nested, device) = item
            # Everything but ts/id/seq/parent/tid repeats step after step in a training
            # loop: encode that part once and format the rest straight into the line.
            key = (name, group, peer, direction, root, redop, idesc, ib, odesc, ob, async_op, site, nested,
                   device)
            frag = frags.get(key)
            if frag is None:
                frag = self._begin_fragment(key)
            if rank is None:  # rare: keep it as a dict until the rank is known
                ev = orjson.loads(b"{" + frag + b"}")
                ev.update(type=E.OP, ts=ts, phase=E.BEGIN, id=op_id, tid=tid)
                if seq is not None:
                    ev["seq"] = seq
                if parent is not None:
                    ev["parent"] = parent
                append(ev)
            else:
                line = b'{"type":"op","ts":%d,"phase":"begin","id":%d,' % (ts, op_id)
                if seq is not None:
                    line += b'"seq":%d,' % seq
                if parent is not None:
                    line += b'"parent":%d,' % parent
                out(line + frag + b',"tid":%d,"v":1,"rank":%d}' % (tid, rank))
            inflight[op_id] = [ts, name, tid, parent, False, group, seq, async_op]
            if parent is None and fr_on:
                top_windows[op_id] = self._windows.open(tid, group, ts)
        elif tag == _E:
            _, op_id, ts, exc, extra = item
            if exc is not None:
                self.failed_ns = ts
            if exc is None and extra is None and rank is not None:
                out(b'{"type":"op","ts":%d,"phase":"end","id":%d,"v":1,"rank":%d}' % (ts, op_id, rank))
            else:
                ev = {"type": E.OP, "ts": ts, "phase": E.END, "id": op_id}
                if exc is not None:
                    ev["exc"] = exc
                if extra is not None:
                    ev["peer"], ev["seq"] = extra
                append(ev)
            info = inflight.pop(op_id, None)
            if fr_on:
                win = top_windows.pop(op_id, None)
                if win is not None:
                    win[1] = ts
            if info is not None and info[7] and exc is None:
                unwaited[op_id] = info[1]
                if len(unwaited) > self.UNWAITED_CAP:
                    unwaited.popitem(last=False)
        elif tag in (_WB, _WE):
            _, op_ids, ts, exc, tid = item
            if exc is not None:
                self.failed_ns = ts
            phase = E.WAIT_BEGIN if tag == _WB else E.WAIT_END
            for op_id in op_ids:
                ev = {"type": E.OP, "ts": ts, "phase": phase, "id": op_id}
                if exc is not None:
                    ev["exc"] = exc
                append(ev)
                if tag == _WB:
                    name = unwaited.pop(op_id, "?")
                    waiting[op_id] = [ts, name, tid, None, False, None, None, False]
                else:
                    waiting.pop(op_id, None)
        elif tag == _G:
            _, ts, name, granks, backend = item
            append({"type": E.GROUP, "ts": ts, "group": name, "granks": list(granks), "backend": backend})
        else:  # exit
            _, ts, reason = item
            exit_ev = {"type": E.EXIT, "ts": ts, "reason": reason}
            if unwaited:
                exit_ev["unwaited"] = list(unwaited)
            if self.crash:
                exit_ev["exc"] = self.crash
        return exit_ev

    def _begin_fragment(self, key: tuple) -> bytes:
        """The JSON members of a begin event that repeat across steps, encoded once."""
        name, group, peer, direction, root, redop, idesc, ib, odesc, ob, async_op, site, nested, device = key
        ev: dict[str, Any] = {"op": name, "group": group}
        if peer is not None:
            ev["peer"] = peer
        if direction is not None:
            ev["dir"] = direction
        if root is not None:
            ev["root"] = root
        if redop is not None:
            ev["redop"] = _redop_name(redop)
        elif name in _REDUCING:
            ev["redop"] = "sum"
        if idesc is not None:
            pairs = _pairs(idesc)
            ev["in_shapes"] = [list(s) for s, _ in pairs]
            ev["in_dtypes"] = [_dtype_name(d) for _, d in pairs]
            ev["in_bytes"] = ib
        if odesc is not None:
            pairs = _pairs(odesc)
            ev["out_shapes"] = [list(s) for s, _ in pairs]
            ev["out_dtypes"] = [_dtype_name(d) for _, d in pairs]
            ev["out_bytes"] = ob
        if async_op:
            ev["async"] = True
        if site is not None:
            ev["site"] = callsite.format_site(site)
        if nested:
            ev["nested"] = True
        if device is not None:
            ev["device"] = f"cuda:{device}"  # completion comes from a later ``done``
        frag = _dumps(ev)[1:-1]
        # A key for readers: equal exactly when these static fields are equal, so a model
        # can intern a begin's signature with one lookup instead of comparing every field.
        frag = b'"sk":%d,%s' % (signature_key(frag), frag)
        self._frags[key] = frag
        return frag

    def _describe_group(self, name: str, now: int, emit) -> None:
        """A ``group`` event for a group used only from C++ (seen via Flight Recorder)."""
        self._group_names.add(name)
        try:
            for pg, pg_name in list(_c10d_world.pg_names.items()):
                if str(pg_name) == name:
                    emit({"type": E.GROUP, "ts": now, "group": name,
                          "granks": list(dist.get_process_group_ranks(pg)), "backend": str(dist.get_backend(pg))})
                    return
        except Exception:
            pass  # unknown to Python (already destroyed): members are inferred from the trace

    def _out(self, line: bytes) -> None:
        """Queue an already encoded event for the store (bounded like ``_emit``)."""
        pending = self.pending
        if len(pending) >= self.PENDING_CAP:
            pending.popleft()
            self.store_dropped += 1
        pending.append(line)

    def _check_hangs(self, now: int, emit) -> int | None:
        """Capture the stack of each op newly stuck past hang_after; returns the begin of the
        oldest op stuck past it (None: none), for ``hangsignal``."""
        limit = int(self.hang_after * 1e9)
        oldest = None
        for table in (self._inflight, self._waiting):
            for op_id, info in table.items():
                if now - info[0] >= limit and (oldest is None or info[0] < oldest):
                    oldest = info[0]
                if info[4] or now - info[0] < limit:
                    continue
                info[4] = True
                parent = info[3]
                if parent is not None and (parent in self._inflight or parent in self._waiting):
                    continue  # the outer op gets the stack
                me = threading.get_ident()
                threads = [t for t in callsite.all_stacks() if t["tid"] != me]
                for t in threads:
                    if t["tid"] == info[2]:
                        t["op_thread"] = True
                emit({"type": E.STACK, "ts": now, "id": op_id, "threads": threads})
        return oldest

    def _samples(self, now: int, emit) -> None:
        if self._probe is None:
            self._probe = ResourceProbe()
        if self._gpu_index is None:
            self._gpu_index = _current_cuda_device()
        if self._gpu_index is not None:
            self._probe.use_gpu(self._gpu_index)
        sample = {"type": E.SAMPLE, "ts": now}
        sample.update(self._probe.sample())
        emit(sample)
        emit({"type": E.HEARTBEAT, "ts": now, "inflight": len(self._inflight) + len(self._waiting)})

    # ------------------------------------------------------------------ writing
    def _open_writer(self) -> bool:
        if self.writer is not None:
            return True
        if self.rank is None:
            if not (dist.is_available() and dist.is_initialized()):
                return False
            self.rank = dist.get_rank()
        if time.monotonic() < self._retry_at:
            return False
        if self.job is None and not self._settle_job_from_thread():
            return False
        meta = self._meta()
        try:
            self.writer = open_writer(self.store, self.job, self.rank, job_meta={
                "created": self.started_ns, "world_size": meta["world_size"], "backend": meta["backend"],
                "schema": E.SCHEMA_VERSION, "commscope": __version__, "host": meta["host"],
            })
        except StoreError as exc:
            self._store_failed(str(exc))
            return False
        # A store URL may name the job (redis://...?job=NAME): the events must say the same.
        self.job = meta["job"] = getattr(self.writer, "job", self.job)
        meta["v"], meta["rank"] = E.SCHEMA_VERSION, self.rank
        self.pending.appendleft(_dumps(meta))
        return True

    def _meta(self) -> dict:
        try:
            world = dist.get_world_size()
            backend = str(dist.get_backend())
        except Exception:
            world, backend = None, "?"
        meta = {"type": E.META, "ts": self.started_ns, "host": socket.gethostname(), "pid": os.getpid(),
                "world_size": world, "backend": backend, "torch": torch.__version__, "commscope": __version__,
                "python": sys.version.split()[0], "job": self.job, "hang_after": self.hang_after,
                "sample_interval": self.sample_interval,
                "argv": [redact(a) if "://" in a else a for a in sys.argv[:16]],  # no passwords in traces
                "store": redact(self.store), "fr": bool(self._fr is not None and flight.fr_env_enabled())}
        if os.environ.get("LOCAL_RANK", "").isdigit():
            meta["local_rank"] = int(os.environ["LOCAL_RANK"])
        return meta

    def _store_failed(self, message: str) -> None:
        self._store_error = message
        self._warn("store", f"commscope: {message}; training continues, trace events are buffered "
                            "(bounded) and dropped if the store stays unavailable")
        self._retry_at = time.monotonic() + self._retry_delay
        self._retry_delay = min(self._retry_delay * 2, 10.0)

    def _write(self, final: bool) -> None:
        pending = self.pending
        if not pending or not self._open_writer():
            return
        if time.monotonic() < self._retry_at and not final:
            return
        batch = list(pending)
        try:
            self.writer.write(batch)
        except StoreError as exc:
            for _ in range(min(exc.written, len(pending))):
                pending.popleft()
            self._store_failed(str(exc))
            return
        pending.clear()
        if self._store_error is not None:
            self._store_error = None
            self._retry_delay = 0.5
        if final:
            try:
                self.writer.close()
            except Exception:
                pass


_internal_cache = callsite._internal_cache


try:
    from torch.distributed.distributed_c10d import _world as _c10d_world
except ImportError:  # very old torch
    _c10d_world = None


def _current_cuda_device() -> int | None:
    try:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            return torch.cuda.current_device()
    except Exception:
        pass
    return None


# ---------------------------------------------------------------------- module API
_lock = threading.Lock()
_active: Recorder | None = None
_atexit_registered = False


def active() -> Recorder | None:
    return _active


def instrument(store: Any = None, *, hang_after: float | None = None, capture_stacks: bool = True,
               sample_interval: float = 1.0, flight_recorder: bool = True) -> Recorder:
    rec = prepare(store, hang_after=hang_after, capture_stacks=capture_stacks,
                  sample_interval=sample_interval, flight_recorder=flight_recorder)
    rec.start()
    return rec


def prepare(store: Any = None, *, hang_after: float | None = None, capture_stacks: bool = True,
            sample_interval: float = 1.0, flight_recorder: bool = True) -> Recorder:
    """Install the wrappers without starting the thread (``commscope run`` does this at
    import time, so early ``from torch.distributed import ...`` bindings are wrapped too);
    ``Recorder.start`` follows when the process creates its process group."""
    global _active, _atexit_registered
    with _lock:
        if _active is not None:
            return _active
        if flight_recorder:
            # Must be set before the first process group exists to take effect.
            os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")
        rec = Recorder(store, hang_after=hang_after, capture_stacks=capture_stacks,
                       sample_interval=sample_interval, flight_recorder=flight_recorder)
        patch.install(rec)
        _install_excepthook()
        _active = rec
        if not _atexit_registered:
            atexit.register(_at_exit)
            os.register_at_fork(after_in_child=_after_fork_child)
            _atexit_registered = True
        return rec


def uninstrument() -> None:
    global _active
    with _lock:
        rec = _active
        if rec is None:
            return
        patch.uninstall()
        _remove_excepthook()
        _active = None
    rec.stop("uninstrument")


_prev_excepthook: Any = None


def _excepthook(exc_type, exc, tb):
    """Note an unhandled exception so the ``exit`` event says the process crashed."""
    rec = _active
    if rec is not None and not issubclass(exc_type, KeyboardInterrupt | SystemExit):
        rec.crash = _fmt_exc(exc) if exc is not None else exc_type.__name__
    (_prev_excepthook or sys.__excepthook__)(exc_type, exc, tb)


def _install_excepthook() -> None:
    global _prev_excepthook
    if sys.excepthook is not _excepthook:
        _prev_excepthook = sys.excepthook
        sys.excepthook = _excepthook


def _remove_excepthook() -> None:
    global _prev_excepthook
    if sys.excepthook is _excepthook:
        sys.excepthook = _prev_excepthook or sys.__excepthook__
    _prev_excepthook = None


def _at_exit() -> None:
    global _active
    rec = _active
    if rec is None:
        return
    patch.uninstall()
    _active = None
    rec.stop("atexit" if rec.crash is None else "exception")


def _after_fork_child() -> None:
    """A forked child (e.g. a DataLoader worker) must not write into its parent's trace."""
    global _active
    rec = _active
    if rec is None:
        return
    _active = None
    patch.uninstall()
    rec.q.clear()
    rec.pending.clear()
    rec.writer = None
