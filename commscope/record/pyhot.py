"""The pure-Python op source: used where the native recorder cannot be built.

Hot path (the training thread, inside each wrapped call, see ``make_wrapper``):
resolve the group, bump a sequence counter, note shapes/dtypes/bytes and the call site,
append a ``Queued*`` record to a bounded deque.  No I/O, no locks, no device syncs.

The recorder thread then turns queued records into schema events, tracks ops in flight,
and merges what Flight Recorder saw of C++-issued collectives (DDP's reducer, functional
collectives), which this path cannot see otherwise: ``pyencode.QueueEncoder``, which
``PythonOps`` hands the recorder's calls to.  The records themselves are ``pyqueue``'s.
It costs several times the native path per op (docs/recorder.md has the figures).
"""

from __future__ import annotations

import functools
import itertools
import sys
import threading
import time
import weakref
from collections import deque
from threading import get_ident
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from commscope import blocks, events
from commscope.blocks import pack_end, pack_rbegin, pack_source, pack_wait_begin
from commscope.events import encode as _dumps
from commscope.events import signature_key
from commscope.record import callsite, crashlog, ops, patch
from commscope.record.cuda_timing import CudaTimer
from commscope.record.ops import begin_fields, fmt_exc
from commscope.record.pyencode import QueueEncoder
from commscope.record.pyqueue import QueuedBegin, QueuedEnd, QueuedTaken, QueuedWait
from commscope.record.pyspool import PyRing
from commscope.store import spool

_time_ns = time.time_ns
_weakref = weakref.ref


class CudaStart(NamedTuple):
    """The CUDA event recorded when an op on a device began (``PythonOps._cuda_start``)."""

    event: Any
    device: int


class Token(NamedTuple):
    """What ``end`` needs of a ``begin``."""

    op_id: int
    parent: int | None
    async_op: bool
    recv_any: str | None  # the group of an any-source recv
    cuda: CudaStart | None
    nests: bool
    # Ended inline by the wrapper (``make_wrapper``): a synchronous op with no
    # any-source peer to note and no CUDA timing to stop.  One field to read on the hot path.
    plain: bool
    # A numbered op's counter key, number, begin's ring position and ``_WAITS`` at its begin,
    # for ``end`` to give the number back if the call raised before issuing it (``_refused``).
    seq_key: Any = None
    seq: int | None = None
    pos: int = -1
    waits: int = 0


class TrackedWork(NamedTuple):
    """An async op's Work (or varlen handle), by ``id`` in ``PythonOps.works``, until waited on."""

    ref: Any  # a weak reference: the Work is the user's, never kept alive by the recorder
    op_ids: tuple
    cuda: CudaStart | None


class GroupInfo(NamedTuple):
    """What the hot path keeps of a process group (``PythonOps._groups``, by the group object)."""

    name: str
    granks: tuple[int, ...]
    backend: str
    gid: int  # its id in the spool ring's records (``PyRing.group``)


_END = blocks.HEADER.size + 2
_HEADER_PACK = blocks.HEADER.pack


def pack_plain_end(ts: int, op_id: int) -> bytes:
    """The END record of an op that returned (``blocks.pack_end`` without an exception)."""
    return _HEADER_PACK(blocks.END, 0, 0, _END, ts, op_id) + b"\0\0"


class _OpStack(threading.local):
    """The op a thread is inside (its nested traffic gets it as parent).  A class default:
    ``getattr(local, "cur", None)`` on an unset attribute raises internally (~300 ns)."""

    cur: int | None = None


class PythonOps:
    """Op capture in Python: the hot path the wrappers call (``begin``, ``end``, ``track``,
    ``wait_begin``, ``wait_end``).  The recorder thread's side is ``encoder``."""

    name = "python"
    spools = True  # its records are packed into a spool ring as they are made (``pyspool``)
    QUEUE_CAP = 100_000  # hot-path records waiting for the thread (about 50 MB at most)

    def __init__(self, rec: Any, flight_recorder: bool):
        self.rec = rec
        self.q: deque = deque()
        self.hot_dropped = 0
        self.ring = PyRing()  # the records themselves, in the spool (see pyspool)
        self._armed = False  # the death path is armed (``arm_death``): a SIGTERM is watched once a spool is there
        self._term_path: Any = None  # the spool's ``.term`` file
        self._ids = itertools.count(1)
        self.suffix = ""  # added to group names from the second incarnation on
        self.next_id = self._next_id  # op ids (the Flight Recorder merge takes them too)
        self._seq: dict[Any, int] = {}
        self._groups: dict[Any, GroupInfo] = {}
        self._tls = _OpStack()
        self.works: dict[int, TrackedWork] = {}
        self.cuda: CudaTimer | None = None
        self.gpu_index: int | None = None
        self.encoder = QueueEncoder(self, flight_recorder)  # the recorder thread's side

    def _next_id(self) -> int:
        return next(self._ids)

    # ------------------------------------------------------------------ install
    def install(self) -> None:
        install_python(self)

    def uninstall(self) -> None:
        patch.uninstall()

    @property
    def need_job(self) -> bool:
        return self.rec.need_job

    def settle_job(self) -> None:
        self.rec.settle_job()

    def request_settle(self) -> None:
        """Nothing to arm: while ``need_job``, every wrapped call takes the full path
        (``end``), which settles the job id."""

    # ------------------------------------------------------------------ hot path
    def _group(self, pg: Any) -> GroupInfo | None:
        info = self._groups.get(pg)
        if info is None:
            try:
                name = str(pg.group_name) + self.suffix
                granks = tuple(dist.get_process_group_ranks(pg))
                try:
                    backend = str(dist.get_backend(pg))
                except Exception:
                    backend = "?"
            except Exception:
                return None  # not a group of ours (e.g. NON_GROUP_MEMBER): torch decides
            info = GroupInfo(name, granks, backend, self.ring.group(name, backend, granks))
            self._groups[pg] = info
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
        gname = info.name
        if peer is not None and type(peer) is tuple:  # ("g", group rank)
            granks = info.granks
            peer = granks[peer[1]] if 0 <= peer[1] < len(granks) else None
        if root is not None and type(root) is tuple:
            granks = info.granks
            root = granks[root[1]] if 0 <= root[1] < len(granks) else None
        recv_any = seq = site = seq_key = None
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
                seq_key = key
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
        op_id = self.next_id()
        ts = _time_ns()
        tid = get_ident()
        dev = None if cuda is None else cuda.device
        key = (name, gname, peer, direction, root, redop, idesc, ib, odesc, ob, async_op, site, nested, dev)
        ring = self.ring
        frag = ring.frags.get(key) or self._fragment(key)
        pos = ring.put(pack_rbegin(op_id, ts, frag, tid=tid, parent=parent or 0, gid=info.gid,
                                   seq=-1 if seq is None else seq), info.gid)
        q.append(QueuedBegin(op_id, ts, name, gname, seq, peer, direction, root, redop, idesc, ib,
                             odesc, ob, async_op, site, tid, parent, nested, dev))
        if nests:
            tls.cur = op_id
        plain = not async_op and recv_any is None and cuda is None
        if seq is None or child_of is not None or name in _DISPATCH_COMMUNICATES:
            return Token(op_id, parent, async_op, recv_any, cuda, nests, plain)
        return Token(op_id, parent, async_op, recv_any, cuda, nests, plain, seq_key, seq, pos, _WAITS[0])

    def _fragment(self, key: tuple) -> bytes:
        """The JSON members of a begin that repeat across steps, encoded once, with their
        signature key (readers intern a begin's signature with one lookup)."""
        name, group, peer, direction, root, redop, idesc, ib, odesc, ob, async_op, site, nested, device = key
        ev = begin_fields(name, group, peer, direction, root, redop, idesc, ib, odesc, ob, async_op,
                          callsite.format_site(site), nested, device)
        frag = _dumps(ev)[1:-1]
        frag = b'"sk":%d,%s' % (signature_key(frag), frag)
        frags = self.ring.frags
        if len(frags) > 20_000:
            frags.clear()
        frags[key] = frag
        return frag

    def end(self, tok: Token, exc: BaseException | None, ret: Any) -> None:
        ts = time.time_ns()
        op_id, parent, async_op, recv_any, cuda, nests = tok[:6]
        if nests:
            self._tls.cur = parent
        source = None
        if recv_any is not None and exc is None and isinstance(ret, int) and ret >= 0:
            key = (recv_any, ret, "recv")
            seq = self._seq[key] = self._seq.get(key, 0) + 1
            source = (ret, seq)
            self.ring.put(pack_source(op_id, ts, ret, seq))
        text = None if exc is None else fmt_exc(exc)
        # (its END says so only where the number went back: readers withdraw the begin's seq on it)
        unissued = exc is not None and tok.seq is not None and _refused(tok, exc) and self._unissue(tok)
        self.ring.put(pack_plain_end(ts, op_id) if text is None else pack_end(op_id, ts, exc=text, unissued=unissued))
        self.q.append(QueuedEnd(op_id, ts, text, source))
        if self.rec.need_job:
            self.rec.settle_job()
        if exc is not None:
            return
        if async_op:
            if ret is not None:
                self.track(ret, (op_id,), cuda)
        elif cuda is not None:
            self._cuda_stop((op_id,), cuda)

    def _unissue(self, tok: Token) -> bool:
        """An op that raised before it was issued (``_refused``) gives its number back, unless
        a later op of the same counter took one meanwhile (another thread: the number then
        stays); its begin in the ring says seq -1 unless a drain has taken it already.
        Returns whether the number went back."""
        seqs = self._seq
        if seqs.get(tok.seq_key) != tok.seq:
            return False
        seqs[tok.seq_key] = tok.seq - 1
        self.ring.unissue(tok.pos, tok.op_id)
        return True

    def track(self, work: Any, op_ids: tuple, cuda: CudaStart | None) -> None:
        """Remember which ops a Work (or varlen handle) completes when waited on."""
        works = self.works
        if len(works) > 4096:
            for k, v in list(works.items()):
                if v.ref() is None:
                    del works[k]
        try:
            works[id(work)] = TrackedWork(_weakref(work), op_ids, cuda)
        except TypeError:
            return
        patch.ensure_wait_patched(type(work), _make_wait)

    def wait_begin(self, op_ids: tuple) -> None:
        ts, tid = time.time_ns(), threading.get_ident()
        self.ring.put_many(pack_wait_begin(op_id, ts, tid) for op_id in op_ids)
        self.q.append(QueuedWait(op_ids, ts, None, tid, True))

    def wait_end(self, op_ids: tuple, exc: BaseException | None, cuda: CudaStart | None) -> None:
        ts = time.time_ns()
        text = None if exc is None else fmt_exc(exc)
        self.ring.put_many(pack_end(op_id, ts, exc=text, wait=True) for op_id in op_ids)
        self.q.append(QueuedWait(op_ids, ts, text, 0, False))
        if cuda is not None and exc is None:
            self._cuda_stop(op_ids, cuda)

    def _cuda_start(self, t: Any) -> CudaStart | None:
        try:
            if self.cuda is None:
                self.cuda = CudaTimer()
            dev = t.device.index
            if self.gpu_index is None:
                self.gpu_index = dev
            return CudaStart(self.cuda.record(dev), dev)
        except Exception:
            return None

    def _cuda_stop(self, op_ids: tuple, cuda: CudaStart) -> None:
        try:
            end = self.cuda.record(cuda.device)
            self.cuda.finish(op_ids[0], cuda.event, end, cuda.device)
        except Exception:
            pass

    # ------------------------------------------------------------------ the thread's side
    # The recorder calls these on its op source; ``QueueEncoder`` does that work.
    def collect(self, now: int, final: bool, emit, out, rank: int | None, drain: bool = True) -> None:
        """Bookkeeping and Flight Recorder's entries (``encoder``), then (unless the store is
        failing) the records since the last drain as one block, to ``out(line, end)``, then
        the ``done`` events of CUDA ops whose event pairs completed.  The pairs are polled
        before the drain, so every op they finish has its begin in this block or an
        earlier one: a ``done`` never precedes its op's begin in the stream."""
        cuda = self.cuda
        finished = cuda.poll() if cuda is not None and rank is not None and drain else ()
        self.encoder.collect(now, final, emit, out, rank)
        if rank is not None and drain:
            line, _n, end = self.ring.drain_block(rank, now)
            if line is not None:
                out(line, end)
        for op_id, gpu_ns in finished:
            emit({"type": events.OP, "ts": time.time_ns(), "phase": events.DONE, "id": op_id, "gpu_ns": gpu_ns})

    def stuck(self, now: int, limit: int) -> tuple[list[tuple[int, int]], int | None]:
        return self.encoder.stuck(now, limit)

    def failed_ns(self) -> int | None:
        return self.encoder.failed_ns()

    def inflight(self) -> int:
        return self.encoder.inflight()

    def unwaited(self) -> tuple[list[int], int]:
        return self.encoder.unwaited()

    def untrack(self, work: Any) -> None:
        """``Work.get_future()``: completion is taken through the future."""
        entry = self.works.pop(id(work), None)
        if entry is not None and entry.ref() is work:
            self.q.append(QueuedTaken(entry.op_ids))

    def meta(self) -> dict:
        return self.encoder.meta()

    def poll_fr_soon(self) -> None:
        self.encoder.poll_fr_soon()

    def drained(self) -> int:
        return self.ring.drained

    def dropped(self) -> int:
        return (self.hot_dropped + self.ring.dropped + self.encoder.convert_failed
                + (self.cuda.dropped if self.cuda else 0))

    def on_destroy(self, whole_job: bool) -> None:
        self._groups.clear()
        if whole_job:
            self._seq.clear()

    # ------------------------------------------------------------------ the spool
    def attach_spool(self, sp: Any) -> None:
        self.ring.attach(sp.fd)
        self._term_path = sp.term_path
        if self._armed:  # (a spool opened after the rank attached: once the job id is settled)
            crashlog.watch_term(sp.term_path)

    def detach_spool(self) -> None:
        self.ring.detach()
        self._term_path = None

    def forwarded(self, end: int) -> None:
        self.ring.forwarded(end)

    def keep_event(self, line: bytes) -> None:
        self.ring.keep_event(line)

    def note_meta(self, line: bytes) -> None:
        self.ring.note_meta(line)

    def arm_death(self) -> None:
        """No C here: faulthandler's crash file tells a fatal signal (``recorder._arm``), and
        its ``.term`` file next to the spool a SIGTERM (``crashlog.watch_term``)."""
        self._armed = True
        if self._term_path is not None:
            crashlog.watch_term(self._term_path)

    def disarm_death(self) -> None:
        self._armed = False
        crashlog.unwatch_term()

    def term_watched(self) -> bool:
        return crashlog.term_watched()

    def note_exit(self, code: int) -> None:
        self.ring.note_exit(code)

    def new_incarnation(self, number: int, suffix: str) -> None:
        """A new incarnation: groups and sequence numbers afresh, group names with
        ``suffix``, op ids from ``events.incarnation_ids`` (unique within a rank)."""
        self._groups.clear()
        self._seq.clear()
        self.suffix = suffix
        self._ids = itertools.count(events.incarnation_ids(number).start)

    def after_fork(self) -> None:
        self.q.clear()
        self.ring = PyRing(spool.MIN_RING)  # never the parent's spool
        self._armed, self._term_path = False, None  # (crashlog let go of the parent's SIGTERM watch)


_internal_cache = callsite._internal_cache

#: Ops whose call communicates before it returns without a Work to wait on: a raise from one
#: is no proof that nothing was issued (``_refused``)
_DISPATCH_COMMUNICATES = frozenset({"monitored_barrier"})
#: How many times ``Work.wait`` has been entered, by any thread (``_make_wait``)
_WAITS = [0]
_DIST_ERRORS = tuple(t for t in (getattr(dist, "DistError", None),) if isinstance(t, type))


def _refused(tok: Token, exc: BaseException) -> bool:
    """Whether a call that raised was refused before it issued anything, so its op takes
    no sequence number (as torch's own does not advance): it raised an ``Exception`` that is
    no distributed error (a timeout, a closed connection, a store or NCCL failure:
    ``DistError``), no thread entered ``Work.wait`` since it began (a wrapped call waits on
    what it issued: object collectives too), and TORCH_DISTRIBUTED_DEBUG is not DETAIL (its
    checks run collectives before the backend sees the op).  A raise after an issue with no
    wait (another thread's wait in between only keeps the number) is what this cannot tell;
    docs/recorder.md."""
    if _WAITS[0] != tok.waits or not isinstance(exc, Exception):
        return False
    if isinstance(exc, _DIST_ERRORS):
        return False
    try:
        return dist.get_debug_level() != dist.DebugLevel.DETAIL
    except Exception:
        return False

__all__ = ["PythonOps", "torch"]


# --------------------------------------------------------------------------- the wrappers
def _record_raise(end: Any, what: Any, exc: BaseException) -> None:
    """Record that a call raised; whatever happens here, the caller re-raises ``exc``."""
    try:
        end(what, exc, None)
    except Exception:
        pass


def make_wrapper(name: str, orig: Any, extract: Any, nests: bool = False) -> Any:
    """``nests``: the wrapped function calls other wrapped ones (the varlen ops)."""
    getframe = sys._getframe
    time_ns = time.time_ns

    @functools.wraps(orig)
    def wrapper(*args, **kwargs):
        rec = patch.ACTIVE
        if rec is None:
            return orig(*args, **kwargs)
        try:
            tok = rec.begin(name, extract(*args, **kwargs), getframe(1), None, False, nests)
        except Exception:
            tok = None  # arguments torch will reject itself, or an unknown group
        if tok is None:
            return orig(*args, **kwargs)
        try:
            ret = orig(*args, **kwargs)
        except BaseException as exc:
            _record_raise(rec.end, tok, exc)
            raise
        try:
            if not tok.plain or rec.need_job:
                rec.end(tok, None, ret)  # async, any-source recv, CUDA, job id unknown: full path
            else:  # the common case, inlined: a plain synchronous op ended
                if nests:
                    rec._tls.cur = tok.parent
                ts = time_ns()
                rec.ring.put(pack_plain_end(ts, tok.op_id))
                rec.q.append(QueuedEnd(tok.op_id, ts, None, None))
        except Exception:
            pass  # recording must never change what the call returns
        return ret

    return patch.wrapped(wrapper, orig)


def _batch_wrapper(orig: Any) -> Any:
    orig_isend = dist.distributed_c10d.isend

    @functools.wraps(orig)
    def batch_isend_irecv(p2p_op_list):
        rec = patch.ACTIVE
        if rec is None:
            return orig(p2p_op_list)
        try:
            items = list(p2p_op_list)
            frame = sys._getframe(1)
            outer = rec.begin("batch_isend_irecv", ops.OpArgs(items[0].group, None, None, None, None, False, (), ()),
                              frame, container=True)  # its children get child_of, not nesting
        except Exception:
            outer = None
        if outer is None:
            return orig(p2p_op_list)
        children = []
        try:
            for p in items:
                send = patch.unwrap(p.op) is orig_isend
                ts = (p.tensor,)
                a = ops.OpArgs(p.group, p.peer, "send" if send else "recv", None, None, True,
                               ts if send else (), () if send else ts)
                tok = rec.begin("isend" if send else "irecv", a, frame, child_of=outer.op_id)
                if tok is not None:
                    children.append(tok)
        except Exception:
            pass
        try:
            works = orig(p2p_op_list)
        except BaseException as exc:
            for tok in children:
                _record_raise(rec.end, tok, exc)
            _record_raise(rec.end, outer, exc)
            raise
        for tok in children:
            rec.end(tok, None, None)
        rec.end(outer, None, None)
        try:
            if works:
                if len(works) == len(children):
                    for w, tok in zip(works, children, strict=True):
                        rec.track(w, (tok.op_id,), tok.cuda)
                else:  # coalesced: one Work completes the whole batch
                    ids = tuple(t.op_id for t in children)
                    for w in works:
                        rec.track(w, ids, children[0].cuda if children else None)
        except Exception:
            pass
        return works

    return patch.wrapped(batch_isend_irecv, orig)


def _make_wait(orig_wait: Any) -> Any:
    @functools.wraps(orig_wait)
    def wait(self, *args, **kwargs):
        _WAITS[0] += 1  # (a call that waited issued something: ``_refused``)
        rec = patch.ACTIVE
        if rec is None or not rec.works:
            return orig_wait(self, *args, **kwargs)
        entry = rec.works.pop(id(self), None)
        if entry is None or entry.ref() is not self:
            return orig_wait(self, *args, **kwargs)
        op_ids, cuda = entry.op_ids, entry.cuda
        rec.wait_begin(op_ids)
        try:
            ret = orig_wait(self, *args, **kwargs)
        except BaseException as exc:
            _record_raise(rec.wait_end, op_ids, exc)
            raise
        rec.wait_end(op_ids, None, cuda)
        return ret

    return wait


def install_python(source: PythonOps) -> None:
    """Install the Python wrappers of every op, reporting to ``source``."""
    varlen = patch.install_common()
    for name, extract in ops.TORCH_OPS.items():
        orig = getattr(dist, name, None)
        if orig is None:
            continue  # older torch
        patch.replace(dist, name, make_wrapper(name, patch.unwrap(orig), extract))
    patch.replace(dist, "batch_isend_irecv", _batch_wrapper(patch.unwrap(dist.batch_isend_irecv)))
    patch.ensure_wait_patched(dist.Work, _make_wait)
    if varlen is not None:
        for name, extract in ops.VARLEN_OPS.items():
            orig = getattr(varlen, name, None)
            if orig is not None:
                patch.replace(varlen, name, make_wrapper(name, patch.unwrap(orig), extract, nests=True))
    patch.activate(source)
