"""Multi-tensor point-to-point: send_tensors / recv_tensors / isend_tensors / irecv_tensors.

Wire format (no pickle).  A header of int64 words

    [MAGIC, count, payload_bytes, header_words, payload_device, mode, (dtype, ndim, *shape) * count]

and a payload: every tensor's bytes at 16-byte aligned offsets of one flat buffer, so the
receiver views each tensor straight out of it (bit-exact for any dtype: bool, bfloat16,
complex, float8).

Gloo sends are rendezvous: data move only once the receiver has posted its receive, so a
header-then-payload protocol pays a full extra round trip before the payload can start.
Gloo does accept a message shorter than the posted buffer, so the receiver posts one
``EAGER_CAP``-byte buffer up front and the sender puts header and payload in one message
when they fit ("eager": one message, one rendezvous).  Bigger transfers, and NCCL (whose
receives must match the send size exactly), send the header first (NCCL: a fixed 512-byte
block, plus a second message for long headers), then the payload as one packed message
(one copy on the sender) or one message per tensor (no copy); ``choose_mode`` picks.
"""

from __future__ import annotations

import ctypes
import threading
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from commscope.varlen import _meta as meta

MAGIC = 0x766C7432  # "vlt2": payloads on PAYLOAD_TAG (a "vlt1" peer is refused, never waited for)
HEAD = 6            # fixed header words before the per-tensor entries
BLOCK = 64          # NCCL: header words in the first (fixed-size) message
ALIGN = 16          # payload alignment: enough for every dtype (complex128) and vector loads
#: Gloo: bytes of the receive posted up front; header + payload that fit go as one message.
#: Past 1 MiB the extra round trip of header-then-payload is small next to the transfer, and
#: a 1 MiB staging buffer measured ~20% faster than a 4 MiB one for a 1 MB payload (fewer
#: fresh pages to fault in).
EAGER_CAP = 1 << 20
P2P_TAG = 0x7662    # Gloo tag, keeps our messages apart from the user's tag-0 traffic
#: Gloo tag of the payload messages.  Headers (P2P_TAG) and payloads travel in two queues, so
#: the first buffers of several outstanding ``irecv_tensors`` from one peer can all be posted
#: at once: each takes the next header, never a payload (``_Lane`` orders the payloads).
PAYLOAD_TAG = 0x7664
PACKED, SPLIT, EAGER = 1, 2, 3
#: Eager payloads up to this size are copied out of the staging buffer (which is recycled);
#: bigger ones are returned as views of it (no copy; the buffer goes to the caller).
COPY_OUT_MAX = 64 << 10
#: Above this average tensor size a per-tensor message costs less than packing it.
SPLIT_MIN_AVG_BYTES = 1 << 20

#: How many 1-d tensors one Gloo header describes (``EAGER_CAP`` bytes; each tensor takes 2 + ndim words).
MAX_1D_TENSORS = (EAGER_CAP // 8 - HEAD) // 3
_ERR_NOT_TENSOR, _ERR_DTYPE, _ERR_LAYOUT, _ERR_TOO_MANY, _ERR_NESTED, _ERR_NO_DATA, _ERR_UNREADABLE, \
    _ERR_NOT_LIST, _ERR_PACK, _ERR_ITER = range(1, 11)
_TOO_MANY_HINT = (f"at most {MAX_1D_TENSORS} 1-d tensors fit, fewer with more dims; concatenate them "
                  "(torch.cat) or send them in several calls")
_ERR_TEXT = {
    _ERR_NOT_TENSOR: "an item that is not a torch.Tensor",
    _ERR_DTYPE: "a tensor of an unsupported dtype (quantized?)",
    _ERR_LAYOUT: "a sparse or otherwise non-strided tensor",
    _ERR_TOO_MANY: f"more tensors than one {EAGER_CAP >> 20} MiB Gloo header can describe ({_TOO_MANY_HINT})",
    _ERR_NOT_LIST: "something other than a list or tuple of tensors (a bare tensor? wrap it: [t])",
    _ERR_PACK: "tensors it failed to read while packing them",
    _ERR_ITER: "an iterable of tensors that raised while it was read (its own error says why)",
    _ERR_NESTED: meta.STATUS_TEXT[meta.NESTED],
    _ERR_NO_DATA: meta.STATUS_TEXT[meta.NO_DATA],
    _ERR_UNREADABLE: meta.STATUS_TEXT[meta.UNREADABLE],
}


class _Pool:
    """A few reusable ``EAGER_CAP``-byte CPU staging buffers.

    A fresh MiB-sized allocation is often a fresh mmap, and every page the transfer then
    touches is a page fault: on the 2-core VM this was measured at up to ~6 us per 4 KiB page,
    i.e. ~1.5 ms per MiB, several times the transfer itself.  Reusing the staging buffers
    keeps their pages mapped.  At most ``keep`` buffers (4 MiB) stay cached."""

    def __init__(self, keep: int = 4):
        self._free: list[torch.Tensor] = []
        self._keep = keep
        self._lock = threading.Lock()

    def take(self) -> torch.Tensor:
        with self._lock:
            if self._free:
                return self._free.pop()
        return torch.empty(EAGER_CAP, dtype=torch.uint8)

    def give(self, buf: torch.Tensor | None) -> None:
        """Keep ``buf`` for a later ``take``: one of this pool's, never another buffer (an
        NCCL receive's 512-byte header block, on its GPU, given back here made the next Gloo
        send copy past its end, a segfault, and the next receive abort: helper-169)."""
        if buf is None or buf.device.type != "cpu" or buf.dtype != torch.uint8 or buf.numel() != EAGER_CAP:
            return
        with self._lock:
            if len(self._free) < self._keep:
                self._free.append(buf)


POOL = _Pool()


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def layout(specs: Sequence[tuple[torch.dtype, Sequence[int]]]) -> tuple[list[int], int]:
    """Byte offset of each tensor in the payload, and the payload size."""
    offsets, pos = [], 0
    for dtype, shape in specs:
        offsets.append(pos)
        pos = _aligned(pos + meta.numel(shape) * dtype.itemsize)
    return offsets, pos


def choose_mode(tensors: Sequence[torch.Tensor], header_bytes: int, payload_bytes: int, eager: bool) -> int:
    """One eager message when header and payload fit the receiver's first buffer (Gloo);
    else one packed payload message for many small tensors, or a message per tensor when
    they are big (or there is one), because then the pack copy costs more than the messages."""
    if eager and _aligned(header_bytes) + payload_bytes <= EAGER_CAP:
        return EAGER
    nonempty = [t for t in tensors if t.numel()]
    if len(nonempty) <= 1:
        return SPLIT
    avg = sum(t.numel() * t.element_size() for t in nonempty) / len(nonempty)
    return SPLIT if avg >= SPLIT_MIN_AVG_BYTES else PACKED


def _segment(buf: torch.Tensor, offset: int, dtype: torch.dtype, shape: Sequence[int]) -> torch.Tensor:
    nbytes = meta.numel(shape) * dtype.itemsize
    return buf[offset:offset + nbytes].view(dtype).view(tuple(shape))


def _pack(buf: torch.Tensor, start: int, tensors: Sequence[torch.Tensor], offsets: Sequence[int]) -> None:
    """Copy the tensors into ``buf``.  Plain contiguous CPU tensors go by ``memmove``: a third
    of the time of ``copy_`` for ten 100 KiB tensors (22 vs 67 us), which pays TensorIterator
    set-up per tensor and may wake intra-op threads on cores the peer rank needs."""
    base = buf.data_ptr() + start if buf.device.type == "cpu" and buf.is_contiguous() else None
    for t, off in zip(tensors, offsets, strict=True):
        n = t.numel()
        if not n:
            continue
        if base is not None and t.device.type == "cpu" and t.is_contiguous() and not t.is_conj() \
                and not t.is_neg():
            ctypes.memmove(base + off, t.data_ptr(), n * t.element_size())
        else:
            meta.raw(_segment(buf, start + off, t.dtype, t.shape)).copy_(meta.raw(t))


def _views(buf: torch.Tensor, start: int, specs: Sequence[tuple[torch.dtype, Sequence[int]]],
           offsets: Sequence[int]) -> list[torch.Tensor]:
    """Tensors viewed out of ``buf`` (contiguous, offset 0 in its storage) at ``start + offset``:
    one ``set_`` each, half the cost of slice + two views; offsets are ALIGN-aligned."""
    storage = buf.untyped_storage()
    return [torch.empty(0, dtype=dt, device=buf.device).set_(storage, (start + off) // dt.itemsize, tuple(shape))
            if meta.numel(shape) else torch.empty(tuple(shape), dtype=dt, device=buf.device)
            for (dt, shape), off in zip(specs, offsets, strict=True)]


def _describe(tensors: Sequence[torch.Tensor]) -> tuple[tuple[int, int] | None, list[int], list[int], int, set[str]]:
    """One pass over the tensors: (first bad one as (index, error code) or None, the header's
    per-tensor words, payload offsets, payload size, device types)."""
    words: list[int] = []
    offsets: list[int] = []
    pos = 0
    kinds: set[str] = set()
    for i, t in enumerate(tensors):
        code = _error_code(t)
        if code:
            return (i, code), words, offsets, pos, kinds
        shape = t.shape
        words += (meta.dtype_code(t.dtype), len(shape), *shape)
        offsets.append(pos)
        pos = _aligned(pos + t.numel() * t.element_size())
        kinds.add(t.device.type)
    return None, words, offsets, pos, kinds


#: _meta's tensor status -> this header's error code (0: fine)
_FROM_STATUS = {meta.OK: 0, meta.NOT_TENSOR: _ERR_NOT_TENSOR, meta.BAD_DTYPE: _ERR_DTYPE, meta.BAD_LAYOUT: _ERR_LAYOUT,
                meta.NESTED: _ERR_NESTED, meta.NO_DATA: _ERR_NO_DATA, meta.UNREADABLE: _ERR_UNREADABLE}


def _error_code(t: object) -> int:
    """A problem the receiver must learn about (it raises too), from the one local check."""
    return _FROM_STATUS.get(meta.tensor_status(t, None, allow_0d=True), 0)


def _peer(g: meta.Group, rank: int, what: str, fn: str) -> int:
    peer = g.group_rank(rank)
    if peer < 0:
        raise ValueError(f"{fn}: {what} {rank} is not a member of the group")
    if peer == g.rank:
        raise ValueError(f"{fn}: {what} {rank} is this rank itself")
    return peer


def _eager(g: meta.Group) -> bool:
    """Gloo: the header travels on a CPU Gloo backend, which takes short messages."""
    return g.backend_for(g.meta_device) == "gloo"


def _isend(t: torch.Tensor, g: meta.Group, peer: int, tag: int = P2P_TAG):
    return dist.isend(t, dst=g.global_rank(peer), group=g.pg, tag=tag)


def _irecv(t: torch.Tensor, g: meta.Group, peer: int, tag: int = P2P_TAG):
    return dist.irecv(t, src=g.global_rank(peer), group=g.pg, tag=tag)


class SendWork:
    """Handle of ``isend_tensors``: ``wait()`` returns when every message left (Gloo: once
    the receiver posted its receives) or is enqueued on the device (NCCL).  It keeps the
    buffers alive until then."""

    def __init__(self, works: list[Any], keep: list[torch.Tensor], pooled: torch.Tensor | None = None):
        self._works, self._keep, self._pooled = works, keep, pooled

    def is_completed(self) -> bool:
        return all(w.is_completed() for w in self._works)

    def wait(self) -> None:
        for w in self._works:
            w.wait()
        self._works, self._keep = [], []
        POOL.give(self._pooled)  # the send is done with it
        self._pooled = None

#: Error headers posted and not yet known to be delivered (``_refuse``): kept alive until then.
#: Gloo's sends say they completed only once waited on, so those stay (a few bytes an error)
_REFUSED: list[_HeaderSend] = []


def _refuse(g: meta.Group, peer: int, eager: bool, wait: bool, code: int, message: str) -> ValueError:
    """Tell the receiver (an error header), so it raises too instead of waiting for a
    payload that never comes; return the sender's own error.  ``wait``: until the header
    left, as a blocking ``send_tensors`` waits for its payload (on Gloo, until the receiver
    posted: a sender that leaves at once would otherwise close the connection first, and its
    receiver read a connection error).  Not ``isend_tensors``: it held the caller until the
    receiver posted, and a sender that went on to a collective before its receiver's recv
    never got its error, both ranks hung until the group's timeout (helper-178); its header
    is kept until it left, and its receiver raises when it posts, while the sender is still
    in the group."""
    header = _send_header([MAGIC, -code, 0, HEAD, 0, 0], g, peer, eager)
    if wait:
        header.wait()
    else:
        _REFUSED[:] = [w for w in _REFUSED if not w.is_completed()]
        _REFUSED.append(header)
    return ValueError(message)


def post_send(tensors: Sequence[torch.Tensor], dst: int, group, *, mode: int | None = None,
              fn: str = "isend_tensors", blocking: bool = False) -> SendWork:
    """Post the header and the payload; the pack copy (if any) happens here, synchronously.

    Everything that can fail on the caller's input (not a list, a bad tensor, too many, a
    failing copy) runs before the first message, and becomes an error header."""
    g = meta.Group.of(group)
    peer = _peer(g, dst, "dst", fn)
    eager = _eager(g)
    kind = type(tensors).__name__
    if isinstance(tensors, torch.Tensor):  # iterating it would send its rows as separate tensors
        raise _refuse(g, peer, eager, blocking, _ERR_NOT_LIST,
                      f"{fn}: expected a list or tuple of tensors, got a bare tensor (wrap it: [t])")
    try:
        tensors = list(tensors)
    except Exception as exc:  # None, an int, a generator that raises
        iterable = hasattr(tensors, "__iter__")  # (one that raised: not "not a list", helper-178)
        raise _refuse(g, peer, eager, blocking, _ERR_ITER if iterable else _ERR_NOT_LIST,
                      f"{fn}: reading the tensors from the {kind} failed: {exc}" if iterable
                      else f"{fn}: expected a list or tuple of tensors, got {kind}") from exc
    bad, entries, offsets, total, kinds = _describe(tensors)
    if bad is None and eager and 8 * (HEAD + len(entries)) > EAGER_CAP:
        raise _refuse(g, peer, eager, blocking, _ERR_TOO_MANY,
                      f"{fn}: {len(tensors)} tensors need a {8 * (HEAD + len(entries))}-byte header, more than "
                      f"one {EAGER_CAP >> 20} MiB Gloo header holds ({_TOO_MANY_HINT})")
    if bad is not None:
        raise _refuse(g, peer, eager, blocking, bad[1], f"{fn}: tensor #{bad[0]} is {_ERR_TEXT[bad[1]]}")
    dev = g.data_device(kinds.pop()) if len(kinds) == 1 else g.meta_device
    header = [MAGIC, len(tensors), total, HEAD + len(entries), meta.device_code(dev), 0, *entries]
    fits = eager and _aligned(8 * len(header)) + total <= EAGER_CAP
    if mode is None or (mode == EAGER and not fits):
        mode = choose_mode(tensors, 8 * len(header), total, eager)
    header[5] = mode
    pooled = None
    try:
        if mode == EAGER:  # Gloo, so CPU: header and payload in one pooled staging buffer
            start = _aligned(8 * len(header))
            pooled = POOL.take()
            buf = pooled[:start + total]
            pooled.numpy()[:8 * len(header)].view(np.int64)[:] = header  # no tensor round trip
            _pack(buf, start, tensors, offsets)
            payload = [buf]
        elif mode == PACKED and total:
            buf = torch.empty(total, dtype=torch.uint8, device=dev)
            _pack(buf, 0, tensors, offsets)
            payload = [buf]
        elif mode == SPLIT:
            payload = [meta.as_bytes(meta.raw(t).to(dev).contiguous()) for t in tensors if t.numel()]
        else:
            payload = []
    except Exception as exc:
        POOL.give(pooled)
        raise _refuse(g, peer, eager, blocking, _ERR_PACK, f"{fn}: copying the tensors failed: {exc}") from exc
    if mode == EAGER:
        return SendWork([_isend(payload[0], g, peer)], payload, pooled)
    head = _send_header(header, g, peer, eager)
    return SendWork([head, *(_isend(b, g, peer, PAYLOAD_TAG) for b in payload)], [head.keep, *payload])


class _HeaderSend:
    """The header message(s) as one work."""

    def __init__(self, works: list[Any], keep: torch.Tensor):
        self.works, self.keep = works, keep

    def is_completed(self) -> bool:
        return all(w.is_completed() for w in self.works)

    def wait(self) -> None:
        for w in self.works:
            w.wait()


def _send_header(header: list[int], g: meta.Group, peer: int, eager: bool) -> _HeaderSend:
    if eager:  # any length: the receiver's first buffer is EAGER_CAP bytes
        words = torch.tensor(header, dtype=torch.int64)
        return _HeaderSend([_isend(words.view(torch.uint8), g, peer)], words)
    words = torch.tensor(header + [0] * (BLOCK - len(header)), dtype=torch.int64).to(g.meta_device)
    works = [_isend(words[:BLOCK], g, peer)]
    if len(header) > BLOCK:
        works.append(_isend(words[BLOCK:], g, peer))
    return _HeaderSend(works, words)


#: group -> global rank of the peer -> its unsettled RecvWorks, in posting order (see RecvWork)
_LANES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _lane(g: meta.Group, peer: int) -> list[RecvWork]:
    try:
        lanes = _LANES.setdefault(g.pg, {})
    except TypeError:  # not weak-referenceable (a stand-in group): no ordering across receives
        return []
    return lanes.setdefault(g.global_rank(peer), [])


class RecvWork:
    """Handle of ``irecv_tensors``.

    Only the first receive is posted up front (Gloo: a 1 MiB buffer that takes header and
    payload at once when they fit; NCCL: the 512-byte header block).  Anything else needs the
    sizes the header carries.  ``is_completed()`` moves things along without blocking (it
    posts the payload receive as soon as the header is in), so on NCCL polling it during
    compute lets the payload overlap too.  Gloo's point-to-point works only report completion
    once waited on (a torch limitation), so there ``is_completed()`` stays False until
    ``wait()``, which finishes the rest and returns the tensors.

    Several outstanding receives from one peer match its messages in posting order, as with
    ``dist.irecv``.  Messages match receives in posting order, so a receive posts its payload
    receives only after every earlier one from that peer posted theirs ("settled"), and waiting
    on a later one first settles the earlier ones.  On Gloo headers and payloads use separate
    tags, so every first buffer is posted at once; elsewhere (NCCL matches by order alone) a
    receive's first buffer also waits until the earlier ones settled."""

    def __init__(self, g: meta.Group, peer: int, fn: str):
        self._g, self._peer, self._fn = g, peer, fn
        self._eager = _eager(g)
        self._first: torch.Tensor | None = None
        self._work: Any = []
        self._words: list[int] = []
        self._result: list[torch.Tensor] | None = None
        self._error: BaseException | None = None
        self._lane = _lane(g, peer)
        behind = bool(self._lane)
        self._lane.append(self)
        self._stage = "queued"
        if self._eager or not behind:
            self._post_first()

    def _post_first(self) -> None:
        if self._eager:
            self._first = POOL.take()
        else:
            self._first = torch.empty(8 * BLOCK, dtype=torch.uint8, device=self._g.meta_device)
        self._work, self._stage = _irecv(self._first, self._g, self._peer), "first"

    def _settle(self) -> None:
        """Every receive of this message is posted (or it failed): the next one may go on."""
        if any(w is self for w in self._lane):
            self._lane.remove(self)
            if self._lane and self._lane[0]._stage == "queued":
                self._lane[0]._post_first()

    def _reached(self, goal: str) -> bool:
        return self._stage in ("done", "failed") or (goal == "settled" and self._stage == "payload")

    def _step(self, block: bool, goal: str = "done") -> bool:
        """Advance while possible, up to ``goal`` ("settled" or "done"); True once there.  A
        failure is kept for this receive's own ``wait()``, never raised into another's."""
        ahead = next((i for i, w in enumerate(self._lane) if w is self), 0)
        for earlier in self._lane[:ahead]:
            if not earlier._step(block, "settled"):
                return False
        while not self._reached(goal):
            pending = self._work if isinstance(self._work, list) else [self._work]
            if not block and not all(w.is_completed() for w in pending):
                return False
            try:
                for w in pending:
                    w.wait()
                self._work = []  # never wait twice on a Gloo work: a second wait blocks forever
                getattr(self, f"_after_{self._stage}")()
            except Exception as exc:
                self._work, self._stage, self._error = [], "failed", exc
                self._settle()
        return True

    def _src(self) -> int:
        return self._g.global_rank(self._peer)

    def _after_first(self) -> None:
        words = self._first.view(torch.int64)
        head = words[:HEAD].tolist()
        if head[0] != MAGIC:
            raise ValueError(f"{self._fn}: the message from rank {self._src()} is not a send_tensors "
                             "header (mismatched send/recv?)")
        if head[1] < 0:
            raise ValueError(f"{self._fn}: the sender (rank {self._src()}) failed: it passed "
                             f"{_ERR_TEXT.get(-head[1], 'bad input')}")
        if self._eager:
            self._words = words[:head[3]].tolist()
        else:
            self._words = words.tolist()[:head[3]]
            if head[3] > BLOCK:
                self._extra = torch.empty(head[3] - BLOCK, dtype=torch.int64, device=self._g.meta_device)
                self._work, self._stage = _irecv(self._extra, self._g, self._peer), "extra"
                return
        self._post_payload()

    def _after_extra(self) -> None:
        self._words = self._words[:BLOCK] + self._extra.tolist()
        self._post_payload()

    def _specs(self) -> list[tuple[torch.dtype, list[int]]]:
        w, specs, pos = self._words, [], HEAD
        for _ in range(w[1]):
            ndim = w[pos + 1]
            specs.append((meta.CODE_DTYPES[w[pos]], w[pos + 2:pos + 2 + ndim]))
            pos += 2 + ndim
        return specs

    def _post_payload(self) -> None:
        _, count, total, nwords, dev_code, mode = self._words[:HEAD]
        specs = self._specs()
        offsets, size = layout(specs)
        if size != total:
            raise ValueError(f"{self._fn}: corrupt header from rank {self._src()}")
        if mode == EAGER:
            base, start = self._first, _aligned(8 * nwords)
            if total <= COPY_OUT_MAX:  # small: copy out and recycle the staging buffer
                base, start = base[start:start + total].clone(), 0
                POOL.give(self._first)
        else:
            dev = self._g.data_device(meta.CODE_DEVICES.get(dev_code, "cpu"))
            base, start = torch.empty(total, dtype=torch.uint8, device=dev), 0
            if self._eager:  # (the pool's; a header block of NCCL's protocol is not)
                POOL.give(self._first)
        buf = base[start:start + total]
        self._first = None
        self._result = _views(base, start, specs, offsets)
        if mode == PACKED and total:
            self._work = [_irecv(buf, self._g, self._peer, PAYLOAD_TAG)]
        elif mode == SPLIT:
            self._work = [_irecv(meta.as_bytes(t), self._g, self._peer, PAYLOAD_TAG)
                          for t in self._result if t.numel()]
        self._stage = "payload"
        self._settle()

    def _after_payload(self) -> None:
        self._work, self._stage = [], "done"

    def is_completed(self) -> bool:
        return self._step(block=False)

    def wait(self) -> list[torch.Tensor]:
        self._step(block=True)
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result


def post_recv(src: int, group, *, fn: str = "irecv_tensors") -> RecvWork:
    g = meta.Group.of(group)
    return RecvWork(g, _peer(g, src, "src", fn), fn)


# ---------------------------------------------------------------------------------------
# public functions (they never call each other: a wrapper around one must not see another)
# ---------------------------------------------------------------------------------------

def send_tensors(tensors: Sequence[torch.Tensor], dst: int, *, group: dist.ProcessGroup | None = None) -> None:
    """Send a list (or tuple) of tensors of any shapes and dtypes to ``dst`` (a global rank).

    The receiver calls ``recv_tensors`` and needs to know nothing in advance.  A bare tensor
    is refused (iterating it would send its rows); on Gloo one 1 MiB header describes the
    list, so at most ``MAX_1D_TENSORS`` 1-d tensors (fewer with more dims).  Any refusal
    reaches the receiver as an error header, so it raises too.  On Gloo one
    message when everything fits in 1 MiB, else a header and the payload; on NCCL a
    512-byte header block and the payload (see ``choose_mode``).  On NCCL a pair's
    point-to-point ops run in posting order on one stream: two ranks that send to each
    other at the same time must order it (one sends while the other receives), exactly as
    with ``dist.send``/``dist.recv``."""
    post_send(tensors, dst, group, fn="send_tensors", blocking=True).wait()


def recv_tensors(src: int, *, group: dist.ProcessGroup | None = None) -> list[torch.Tensor]:
    """Receive the tensors ``src`` (a global rank) sent with ``send_tensors``/``isend_tensors``.

    They come back as views into one receive buffer, on this rank's device of the sender's
    device type (CPU for Gloo, the current CUDA device for NCCL)."""
    return post_recv(src, group, fn="recv_tensors").wait()


def isend_tensors(tensors: Sequence[torch.Tensor], dst: int, *,
                  group: dist.ProcessGroup | None = None) -> SendWork:
    """Start sending; return a handle whose ``wait()`` completes the send.

    Overlaps with compute: every message is posted before this returns, so the transfer
    proceeds while the caller computes (on Gloo as soon as the receiver has posted its
    receives).  Not overlapped: packing tensors into one buffer (a copy done here, after
    which the caller may reuse them).  When each tensor goes as its own message (large
    tensors), do not modify them before ``wait()``."""
    return post_send(tensors, dst, group, fn="isend_tensors")


def irecv_tensors(src: int, *, group: dist.ProcessGroup | None = None) -> RecvWork:
    """Start receiving; ``wait()`` returns the tensors.

    Overlaps with compute: the first receive, posted here, which on Gloo takes the whole
    transfer when it fits in 1 MiB.  Larger payloads can only be received once the header has
    arrived (it carries the sizes); that happens inside ``wait()``, or inside
    ``is_completed()`` on NCCL, so poll ``is_completed()`` during compute there to overlap
    the payload too.  On Gloo the rest is received in ``wait()`` (Gloo p2p works report
    completion only when waited).  On NCCL, reading the header is a device-to-host copy that
    synchronizes.  Several outstanding receives from one peer take its messages in posting
    order, as ``dist.irecv`` does.

    Limit: unlike ``dist.irecv``, a message over 1 MiB (Gloo) is not received until
    ``wait()``, so a collective, or any other blocking op with the sender (a
    ``send_tensors`` back to it), between this call and ``wait()`` deadlocks against a sender
    blocked in ``send_tensors`` (docs/varlen.md, "What overlaps with compute").  Wait first,
    or let the sender use ``isend_tensors`` and wait after the collective.  A receive dropped
    unwaited stays with its peer's queue (its 1 MiB buffer and its group held) until a later
    receive from that peer is waited."""
    return post_recv(src, group, fn="irecv_tensors")
