"""The pure-Python op source: used where the native recorder cannot be built.

Hot path (the training thread, inside each wrapped call, see ``patch.make_wrapper``):
resolve the group, bump a sequence counter, note shapes/dtypes/bytes and the call site,
append a ``Queued*`` record to a bounded deque.  No I/O, no locks, no device syncs.

The recorder thread then turns queued records into schema events (``collect``), tracks
ops in flight, and merges what Flight Recorder saw of C++-issued collectives (DDP's
reducer, functional collectives), which this path cannot see otherwise.  It costs
several times the native path per op (docs/recorder.md has the figures).
"""

from __future__ import annotations

import itertools
import threading
import time
import weakref
from collections import OrderedDict, deque
from threading import get_ident
from typing import Any, NamedTuple

import orjson
import torch
import torch.distributed as dist

from commscope import events as E
from commscope.events import encode as _dumps
from commscope.events import signature_key
from commscope.record import callsite, flight, patch
from commscope.record.cuda_timing import CudaTimer
from commscope.record.ops import begin_fields

_time_ns = time.time_ns
_weakref = weakref.ref


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


class Token(NamedTuple):
    """What ``end`` needs of a ``begin``."""

    op_id: int
    parent: int | None
    async_op: bool
    recv_any: str | None  # the group of an any-source recv
    cuda: tuple | None
    nests: bool


class GroupInfo(NamedTuple):
    name: str
    granks: tuple[int, ...]
    backend: str


class InFlight:
    """An op (or a wait) the thread has seen begin and not end."""

    __slots__ = ("ts", "name", "tid", "parent", "reported", "is_async")

    def __init__(self, ts: int, name: str, tid: int, parent: int | None, is_async: bool):
        self.ts, self.name, self.tid, self.parent, self.is_async = ts, name, tid, parent, is_async
        self.reported = False


class _OpStack(threading.local):
    """The op a thread is inside (its nested traffic gets it as parent).  A class default:
    ``getattr(local, "cur", None)`` on an unset attribute raises internally (~300 ns)."""

    cur: int | None = None


def fmt_exc(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class PythonOps:
    """Op capture in Python: the hot path the wrappers call, and its conversion to events."""

    name = "python"
    QUEUE_CAP = 100_000  # hot-path records waiting for the thread (about 50 MB at most)
    UNWAITED_CAP = 10_000
    FR_INTERVAL = 1.0  # at least this far apart ...
    FR_DUTY = 0.005  # ... and far enough that dumps take at most 0.5% of the time

    def __init__(self, rec: Any, flight_recorder: bool):
        self.rec = rec
        self.q: deque = deque()
        self.hot_dropped = 0
        self.convert_failed = 0
        self._next_id = itertools.count(1).__next__
        self._seq: dict[Any, int] = {}
        self._groups: dict[Any, GroupInfo] = {}
        self._tls = _OpStack()
        self.works: dict[int, tuple] = {}
        self._inflight: dict[int, InFlight] = {}
        self._waiting: dict[int, InFlight] = {}
        self._unwaited: OrderedDict[int, str] = OrderedDict()
        self._windows = flight.WrapperWindows()
        self._top_windows: dict[int, list] = {}
        self._frags: dict[tuple, bytes] = {}
        self._group_names: set[str] = set()
        self._fr = flight.FlightRecorderMerge(self._next_id, self._group_ranks) if flight_recorder else None
        self._fr_next = 0.0
        self._fr_missed_reported = 0
        self.cuda: CudaTimer | None = None
        self.gpu_index: int | None = None
        self._failed_ns: int | None = None  # when an op last raised (for stack requests)

    # ------------------------------------------------------------------ install
    def install(self) -> None:
        patch.install_python(self)

    def uninstall(self) -> None:
        patch.uninstall()

    @property
    def need_job(self) -> bool:
        return self.rec.need_job

    def settle_job(self) -> None:
        self.rec.settle_job()

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
            self.q.append(QueuedGroup(time.time_ns(), name, granks, backend))
        return info

    def begin(self, name: str, a: tuple, frame: Any, child_of: int | None = None,
              container: bool = False, nests: bool = False) -> Token | None:
        """Queue a ``begin`` and return the token ``end`` needs, or None to not record.

        ``a`` is an extractor tuple (see ``ops.OpArgs``).  ``container`` ops
        (batch_isend_irecv) take no sequence number.  ``nests``: the op calls other wrapped
        ops (varlen), so it becomes their parent; torch's own functions call unwrapped
        globals and never nest, which saves them two thread-local writes.
        """
        q = self.q
        if len(q) >= self.QUEUE_CAP:
            self.hot_dropped += 1
            return None
        pg, peer, direction, root, redop, async_op, ins, outs = a
        if pg is None:
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
                if len(ins) == 1:  # one tensor: a flat (shape, dtype); see ops.describe_pairs
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
        q.append(QueuedBegin(op_id, _time_ns(), name, gname, seq, peer, direction, root, redop, idesc, ib,
                             odesc, ob, async_op, site, get_ident(), parent, nested,
                             None if cuda is None else cuda[1]))
        if nests:
            tls.cur = op_id
        return Token(op_id, parent, async_op, recv_any, cuda, nests)

    def end(self, tok: Token, exc: BaseException | None, ret: Any) -> None:
        ts = time.time_ns()
        op_id, parent, async_op, recv_any, cuda, nests = tok
        if nests:
            self._tls.cur = parent
        source = None
        if recv_any is not None and exc is None and isinstance(ret, int) and ret >= 0:
            key = (recv_any, ret, "recv")
            seq = self._seq[key] = self._seq.get(key, 0) + 1
            source = (ret, seq)
        self.q.append(QueuedEnd(op_id, ts, None if exc is None else fmt_exc(exc), source))
        if self.rec.need_job:
            self.rec.settle_job()
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
        if cls not in patch._wait_patched:
            patch.ensure_wait_patched(cls)

    def wait_begin(self, op_ids: tuple) -> None:
        self.q.append(QueuedWait(op_ids, time.time_ns(), None, threading.get_ident(), True))

    def wait_end(self, op_ids: tuple, exc: BaseException | None, cuda: tuple | None) -> None:
        self.q.append(QueuedWait(op_ids, time.time_ns(), None if exc is None else fmt_exc(exc), 0, False))
        if cuda is not None and exc is None:
            self._cuda_stop(op_ids, cuda)

    def _cuda_start(self, t: Any) -> tuple | None:
        try:
            if self.cuda is None:
                self.cuda = CudaTimer()
            dev = t.device.index
            if self.gpu_index is None:
                self.gpu_index = dev
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

    # ------------------------------------------------------------------ the thread's side
    def collect(self, now: int, final: bool, emit, out, rank: int | None) -> None:
        """Move what the hot path queued (and Flight Recorder's new entries) to the store queue."""
        fr_entries = self._poll_fr_entries(final, rank)  # before draining: see flight.py
        self._drain(emit, out, rank)
        if fr_entries is not None:
            for ev in self._fr.poll(fr_entries, self._windows, now):
                if ev.get("phase") == E.BEGIN and ev["group"] not in self._group_names:
                    self._describe_group(ev["group"], now, emit)
                emit(ev)
            self._windows.prune(now)
            missed = self._fr.missed
            if missed > self._fr_missed_reported:
                emit({"type": E.DROPPED, "ts": now, "count": missed - self._fr_missed_reported, "total": missed,
                      "reason": flight.RING_OVERWRITTEN})
                self._fr_missed_reported = missed
        if self.cuda is not None:
            for op_id, gpu_ns in self.cuda.poll():
                emit({"type": E.OP, "ts": time.time_ns(), "phase": E.DONE, "id": op_id, "gpu_ns": gpu_ns})

    def dropped(self) -> int:
        return self.hot_dropped + self.convert_failed + (self.cuda.dropped if self.cuda else 0)

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

    def unwaited(self) -> list[int]:
        return list(self._unwaited)

    def meta(self) -> dict:
        return {"fr": bool(self._fr is not None and flight.fr_env_enabled())}

    def on_destroy(self, whole_job: bool) -> None:
        self._groups.clear()
        if whole_job:
            self._seq.clear()

    def after_fork(self) -> None:
        self.q.clear()

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
        q = self.q
        frags = self._frags
        if len(frags) > 20_000:
            frags.clear()
        for _ in range(len(q)):
            item = q.popleft()
            try:
                self._convert(item, emit, out, rank)
            except Exception as exc:  # one odd item must not cost the rest of the batch
                self.convert_failed += 1
                self.rec.drop_note = "an event could not be encoded"
                self.rec.warn("convert", f"commscope: could not record an event ({exc!r}); recording continues")

    def _convert(self, item: Any, emit, out, rank: int | None) -> None:
        inflight, waiting, unwaited = self._inflight, self._waiting, self._unwaited
        cls = type(item)
        if cls is QueuedBegin:
            # Everything but ts/id/seq/parent/tid repeats step after step in a training
            # loop: encode that part once and format the rest straight into the line.
            key = (item.name, item.group, item.peer, item.direction, item.root, item.redop, item.ins,
                   item.in_bytes, item.outs, item.out_bytes, item.async_op, item.site, item.nested, item.device)
            frag = self._frags.get(key)
            if frag is None:
                frag = self._begin_fragment(key)
            if rank is None:  # rare: keep it as a dict until the rank is known
                ev = orjson.loads(b"{" + frag + b"}")
                ev.update(type=E.OP, ts=item.ts, phase=E.BEGIN, id=item.op_id, tid=item.tid)
                if item.seq is not None:
                    ev["seq"] = item.seq
                if item.parent is not None:
                    ev["parent"] = item.parent
                emit(ev)
            else:
                line = b'{"type":"op","ts":%d,"phase":"begin","id":%d,' % (item.ts, item.op_id)
                if item.seq is not None:
                    line += b'"seq":%d,' % item.seq
                if item.parent is not None:
                    line += b'"parent":%d,' % item.parent
                out(line + frag + b',"tid":%d,"v":%d,"rank":%d}' % (item.tid, E.SCHEMA_VERSION, rank))
            inflight[item.op_id] = InFlight(item.ts, item.name, item.tid, item.parent, item.async_op)
            if item.parent is None and self._fr is not None:
                self._top_windows[item.op_id] = self._windows.open(item.tid, item.group, item.ts)
        elif cls is QueuedEnd:
            if item.exc is None and item.source is None and rank is not None:
                out(b'{"type":"op","ts":%d,"phase":"end","id":%d,"v":%d,"rank":%d}'
                    % (item.ts, item.op_id, E.SCHEMA_VERSION, rank))
            else:
                ev = {"type": E.OP, "ts": item.ts, "phase": E.END, "id": item.op_id}
                if item.exc is not None:
                    ev["exc"] = item.exc
                if item.source is not None:
                    ev["peer"], ev["seq"] = item.source
                emit(ev)
            if item.exc is not None:
                self._failed_ns = item.ts
            info = inflight.pop(item.op_id, None)
            win = self._top_windows.pop(item.op_id, None)
            if win is not None:
                win[1] = item.ts
            if info is not None and info.is_async and item.exc is None:
                unwaited[item.op_id] = info.name
                if len(unwaited) > self.UNWAITED_CAP:
                    unwaited.popitem(last=False)
        elif cls is QueuedWait:
            phase = E.WAIT_BEGIN if item.begin else E.WAIT_END
            if item.exc is not None:
                self._failed_ns = item.ts
            for op_id in item.op_ids:
                ev = {"type": E.OP, "ts": item.ts, "phase": phase, "id": op_id}
                if item.exc is not None:
                    ev["exc"] = item.exc
                emit(ev)
                if item.begin:
                    name = unwaited.pop(op_id, "?")
                    waiting[op_id] = InFlight(item.ts, name, item.tid, None, False)
                else:
                    waiting.pop(op_id, None)
        elif cls is QueuedGroup:
            emit({"type": E.GROUP, "ts": item.ts, "group": item.name, "granks": list(item.granks),
                  "backend": item.backend})

    def _begin_fragment(self, key: tuple) -> bytes:
        """The JSON members of a begin event that repeat across steps, encoded once."""
        name, group, peer, direction, root, redop, idesc, ib, odesc, ob, async_op, site, nested, device = key
        ev = begin_fields(name, group, peer, direction, root, redop, idesc, ib, odesc, ob, async_op,
                          callsite.format_site(site), nested, device)
        frag = _dumps(ev)[1:-1]
        # A key for readers: equal exactly when these static fields are equal, so a model
        # can intern a begin's signature with one lookup instead of comparing every field.
        frag = b'"sk":%d,%s' % (signature_key(frag), frag)
        self._frags[key] = frag
        return frag

    def _group_ranks(self, name: str) -> tuple[int, ...] | None:
        """A group's global ranks by name (the recorder thread's side: Flight Recorder
        names a p2p peer as a group rank); None when the group is unknown here."""
        for info in list(self._groups.values()):
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
                    emit({"type": E.GROUP, "ts": now, "group": name,
                          "granks": list(dist.get_process_group_ranks(pg)), "backend": str(dist.get_backend(pg))})
                    return
        except Exception:
            pass  # unknown to Python (already destroyed): members are inferred from the trace


_internal_cache = callsite._internal_cache

try:
    from torch.distributed.distributed_c10d import _world as _c10d_world
except ImportError:  # very old torch
    _c10d_world = None

__all__ = ["PythonOps", "fmt_exc", "torch"]
