"""The varlen collectives: all_gather_v, gather_v, scatter_v, all_to_all_v, reduce_scatter_v,
broadcast_v.

Shape of every op: local checks become a status in this rank's metadata record; one small
collective exchanges the records; ``validate`` raises the same ValueError everywhere or lets
every rank pick the same strategy; then the data move as raw bytes (``view(torch.uint8)``,
so bool, bfloat16, complex and float8 travel bit-exactly on backends that lack them) or, for
reductions, in their own dtype.  The varying dim is moved to the front so each rank's piece
is one contiguous row block.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from commscope.varlen import _meta as meta
from commscope.varlen import _orphans
from commscope.varlen._plan import EQUAL_ONLY, SUPPORTED, choose_strategy

#: Gloo tag for the isend/irecv that emulate collectives (keeps them apart from user p2p on tag 0).
COLLECTIVE_TAG = 0x7661

Pieces = tuple[list[torch.Tensor], "torch.Tensor | None"]  # per-rank row blocks, and their concat if free


class VarlenWork:
    """Handle of an async varlen op: ``wait()`` blocks until the data arrived and returns the
    result (the same object on every call); ``is_completed()`` polls without blocking.  Gloo's
    point-to-point works (the "p2p" strategy) only report completion once waited on."""

    def __init__(self, works: Sequence[Any], finish: Callable[[], Any]):
        self._works = [w for w in works if w is not None]
        self._finish = finish
        self._done = False
        self._result: Any = None

    def is_completed(self) -> bool:
        return self._done or all(w.is_completed() for w in self._works)

    def wait(self) -> Any:
        if not self._done:
            for w in self._works:
                w.wait()
            self._works = []
            self._result = self._finish()
            self._done = True
        return self._result

    def __del__(self) -> None:
        # dropped before wait(): its works, with the buffers ``finish`` holds, end in the
        # background (a pending Gloo p2p work destroyed left its pair of ranks stuck)
        if getattr(self, "_works", None):
            _orphans.adopt(self._works, self._finish)


# ---------------------------------------------------------------------------------------
# small helpers
# ---------------------------------------------------------------------------------------

_bytes = meta.as_bytes


def _dense(t: torch.Tensor, dev: torch.device) -> torch.Tensor:
    """``t`` contiguous on ``dev`` with at most one copy (no copy when it already is)."""
    if t.device == dev:
        return t.contiguous()
    return torch.empty(t.shape, dtype=t.dtype, device=dev).copy_(t)


def _row_bytes(rest: Sequence[int], dtype: torch.dtype) -> int:
    return meta.numel(rest) * dtype.itemsize


def _p2p(g: meta.Group, ops: list[tuple[str, torch.Tensor, int]], tag: int = COLLECTIVE_TAG) -> list[Any]:
    """Post isend/irecv ops ``(kind, tensor, group_peer)``; return their works.

    NCCL needs them grouped (two ranks that both send first would deadlock otherwise), so it
    gets ``batch_isend_irecv`` (whose P2POp insists on torch's own isend/irecv); Gloo gets
    plain async isend/irecv (already concurrent, and visible one by one to wrappers)."""
    if not ops:
        return []
    if g.backend_for(ops[0][1].device) in ("nccl", "xccl"):
        p2p = [dist.P2POp(c10d.isend if kind == "send" else c10d.irecv, t, g.global_rank(peer), g.pg, tag)
               for kind, t, peer in ops]
        return list(dist.batch_isend_irecv(p2p))
    works = []
    for kind, t, peer in ops:
        fn = dist.isend if kind == "send" else dist.irecv
        peer_kw = {"dst": g.global_rank(peer)} if kind == "send" else {"src": g.global_rank(peer)}
        works.append(fn(t, group=g.pg, tag=tag, **peer_kw))
    return works


def _resolve(op: str, forced: str | None, sizes: Sequence[int], row_bytes: int, backend: str) -> str:
    """The plan every rank will run; ValueError (identical on all ranks) when a forced one can't."""
    if forced is None:
        return choose_strategy(op, sizes, row_bytes, backend)
    if forced not in SUPPORTED[op]:
        raise ValueError(f"{op}: strategy {forced!r} is not one of {SUPPORTED[op]}")
    if forced in EQUAL_ONLY and len(set(sizes)) > 1:
        raise ValueError(f"{op}: strategy {forced!r} needs equal lengths on all ranks, got {list(sizes)}")
    return forced


def _finish_pieces(pieces: list[torch.Tensor], flat: torch.Tensor | None, *, cat: bool, dim: int,
                   home: torch.device, dtype: torch.dtype) -> torch.Tensor | list[torch.Tensor]:
    """Row blocks (varying dim in front, raw dtype) -> the caller's layout, dtype and device."""
    if cat:
        whole = flat if flat is not None else torch.cat(pieces)
        return whole.movedim(0, dim).to(home).view(dtype)
    return [p.movedim(0, dim).to(home).view(dtype) for p in pieces]


def _check_known_sizes(g: meta.Group, op: str, tensor: torch.Tensor, dim: int, sizes: Sequence[int],
                       strategy: str | None) -> list[int]:
    """``sizes=`` skips the metadata exchange, so these checks are local: a rank that fails
    them raises alone (the caller vouched that sizes, dtype and trailing dims agree)."""
    status = meta.tensor_status(tensor, dim)
    if status != meta.OK:
        raise ValueError(f"{op}: this rank passed " + meta.STATUS_TEXT[status].format(maxd=meta.MAX_NDIM))
    try:
        sizes = [meta.whole(s) for s in sizes]
    except (TypeError, ValueError, OverflowError) as exc:
        raise ValueError(f"{op}: sizes must hold one non-negative length per rank ({g.size}): {exc}") from None
    if len(sizes) != g.size or any(s < 0 for s in sizes):
        raise ValueError(f"{op}: sizes must hold one non-negative length per rank ({g.size}), got {sizes}")
    if sizes[g.rank] != tensor.shape[dim]:
        raise ValueError(f"{op}: sizes[{g.rank}] = {sizes[g.rank]} but this rank's tensor has "
                         f"{tensor.shape[dim]} along dim {dim}")
    if strategy is not None and strategy not in meta.STRATEGY_CODES:
        raise ValueError(f"{op}: unknown strategy {strategy!r}")
    return sizes


def _gathered_layout(tensor: torch.Tensor, dim: int) -> tuple[int, torch.Tensor, tuple[int, ...]]:
    """(normalized dim, the tensor as raw row blocks with ``dim`` in front, the other dims)."""
    d = dim % tensor.dim()
    front = meta.raw(tensor).movedim(d, 0)
    return d, front, tuple(front.shape[1:])


# ---------------------------------------------------------------------------------------
# all_gather_v
# ---------------------------------------------------------------------------------------

def all_gather_v(tensor: torch.Tensor, *, dim: int = 0, sizes: Sequence[int] | None = None, cat: bool = False,
                 group: dist.ProcessGroup | None = None, async_op: bool = False,
                 strategy: str | None = None, check_sizes: bool | None = None) -> list[torch.Tensor] | torch.Tensor | VarlenWork:
    """Gather tensors that differ in length along ``dim`` from every rank of ``group``.

    Returns every rank's tensor in group-rank order (views of one receive buffer), or their
    concatenation along ``dim`` with ``cat=True``.  ``sizes`` (every rank's length, same on
    all ranks) skips the metadata exchange and its checks, unless ``check_sizes`` (default:
    ``$COMMSCOPE_VARLEN_CHECK``) asks to verify them: then every rank raises the same error
    when sizes= disagree across ranks or with a tensor, or were passed on some ranks only.
    With ``async_op=True`` the metadata exchange still completes before the call returns;
    the data transfer does not, and the returned handle's ``wait()`` yields the result.
    ``strategy`` forces one of "native" (equal lengths), "padded", "p2p", "bcast", "a2a" (all
    ranks must pass the same).
    """
    op = "all_gather_v"
    g = meta.Group.of(group)
    given = sizes
    check = meta.checking(check_sizes)
    if sizes is not None and check:
        sizes = None  # exchange after all, with the caller's sizes in the record
    if sizes is None and meta.p2p_metadata(g):
        rec = meta.note_sizes(meta.describe(meta.new_record(op, strategy=strategy), tensor, dim), given, tensor, dim,
                           g.size, g.rank)
        mine = _bytes(_dense(meta.raw(tensor), torch.device("cpu"))) if rec[meta.F_STATUS] == meta.OK else None
        recs, arrived = meta.exchange_p2p(g, [rec] * g.size, payload=mine)
        meta.validate(g, op, recs, aux=meta.sizes_aux(check, recs))
        got = _speculated(g, tensor, dim, recs, arrived, mine)
        if got is not None and strategy is None:
            pieces, d = got
            return _done([], lambda: (pieces, None), cat, d, tensor, async_op)
        sizes = [meta.length(r) for r in recs]
    elif sizes is None:
        rec = meta.note_sizes(meta.describe(meta.new_record(op, strategy=strategy), tensor, dim), given, tensor, dim,
                           g.size, g.rank)
        recs = meta.exchange(g, rec)
        meta.validate(g, op, recs, aux=meta.sizes_aux(check, recs))
        sizes = [meta.length(r) for r in recs]
    else:
        sizes = _check_known_sizes(g, op, tensor, dim, sizes, strategy)
    d, front, rest = _gathered_layout(tensor, dim)
    dev = g.data_device(tensor.device.type)
    plan = _resolve(op, strategy, sizes, _row_bytes(rest, tensor.dtype), g.backend_for(dev))
    if _row_bytes(rest, tensor.dtype) * sum(sizes) == 0:
        works, pieces = [], ([front.new_empty((s, *rest), device=dev) for s in sizes], None)
        return _done(works, lambda: pieces, cat, d, tensor, async_op)
    works, finish = _AG[plan](g, front, sizes, rest, dev)
    return _done(works, finish, cat, d, tensor, async_op)


def _speculated(g: meta.Group, tensor: torch.Tensor, dim: int, recs: list[list[int]],
                arrived: list[torch.Tensor | None], mine: torch.Tensor | None) -> tuple[list[torch.Tensor], int] | None:
    """The row blocks, if every rank's whole tensor came with its metadata record (see
    ``_meta.exchange_p2p``), else None; and remember this call's sizes for the next one."""
    need = [meta.numel(meta.shape_of(r)) * meta.CODE_DTYPES[r[meta.F_DTYPE]].itemsize for r in recs]
    caps = meta.payload_caps(g)  # what this call made room for (the same on every rank)
    hit = all(n <= c for n, c in zip(need, caps, strict=True))
    meta.set_payload_caps(g, need)
    if not hit or mine is None:
        return None
    d = dim % tensor.dim()
    rd = meta.raw_dtype(tensor.dtype)
    pieces = []
    for s, r in enumerate(recs):
        b = mine.clone() if s == g.rank else arrived[s][:need[s]]
        if b.storage_offset() % 16 or b.data_ptr() % 16:  # views need itemsize-aligned offsets
            b = b.clone()
        rows = b.view(rd).view(meta.shape_of(r))  # the sender's layout: its own dim order
        pieces.append(rows.movedim(d, 0))
    return pieces, d


def _done(works, finish: Callable[[], Pieces], cat: bool, d: int, like: torch.Tensor, async_op: bool):
    home, dtype = like.device, like.dtype
    handle = VarlenWork(works, lambda: _finish_pieces(*finish(), cat=cat, dim=d, home=home, dtype=dtype))
    return handle if async_op else handle.wait()


def _ag_native(g, x, sizes, rest, dev):
    n = sizes[g.rank]
    out = torch.empty((g.size * n, *rest), dtype=x.dtype, device=dev)
    if x.device == dev and x.is_contiguous():
        inp = x
    else:  # copy straight into our own slot and gather in place: one copy, no extra buffer
        inp = out[g.rank * n:(g.rank + 1) * n]
        inp.copy_(x)
    work = meta._all_gather_into(_bytes(out), _bytes(inp), g.pg, async_op=True)
    return [work], lambda: (list(out.split(n)), out)


def _ag_padded(g, x, sizes, rest, dev):
    width = max(sizes)
    buf = torch.empty((g.size, width, *rest), dtype=x.dtype, device=dev)
    buf[g.rank, :sizes[g.rank]].copy_(x)
    work = meta._all_gather_into(_bytes(buf), _bytes(buf[g.rank]), g.pg, async_op=True)
    return [work], lambda: ([buf[i, :s] for i, s in enumerate(sizes)], None)


def _exact_buffer(g, x, sizes, rest, dev):
    out = torch.empty((sum(sizes), *rest), dtype=x.dtype, device=dev)
    pieces = list(out.split(sizes))
    pieces[g.rank].copy_(x)
    return out, pieces


def _ag_p2p(g, x, sizes, rest, dev):
    out, pieces = _exact_buffer(g, x, sizes, rest, dev)
    ops = []
    for k in range(1, g.size):
        dst, src = (g.rank + k) % g.size, (g.rank - k) % g.size
        if sizes[g.rank]:
            ops.append(("send", _bytes(pieces[g.rank]), dst))
        if sizes[src]:
            ops.append(("recv", _bytes(pieces[src]), src))
    return _p2p(g, ops), lambda: (pieces, out)


def _ag_bcast(g, x, sizes, rest, dev):
    out, pieces = _exact_buffer(g, x, sizes, rest, dev)
    if g.backend_for(dev) == "nccl":
        # NCCL runs an uneven list all_gather as one group of broadcasts.
        works = [dist.all_gather([_bytes(p) for p in pieces], _bytes(pieces[g.rank]), group=g.pg,
                                 async_op=True)]
    else:
        works = [dist.broadcast(_bytes(p), src=g.global_rank(i), group=g.pg, async_op=True)
                 for i, p in enumerate(pieces) if sizes[i]]
    return works, lambda: (pieces, out)


def _ag_a2a(g, x, sizes, rest, dev):
    out = torch.empty((sum(sizes), *rest), dtype=x.dtype, device=dev)
    rb = _row_bytes(rest, x.dtype)
    mine = _bytes(_dense(x, dev))
    work = dist.all_to_all_single(_bytes(out), mine.repeat(g.size), [s * rb for s in sizes],
                                  [sizes[g.rank] * rb] * g.size, group=g.pg, async_op=True)
    return [work], lambda: (list(out.split(sizes)), out)


_AG = {"native": _ag_native, "padded": _ag_padded, "p2p": _ag_p2p, "bcast": _ag_bcast, "a2a": _ag_a2a}


# ---------------------------------------------------------------------------------------
# gather_v
# ---------------------------------------------------------------------------------------

def gather_v(tensor: torch.Tensor, dst: int = 0, *, dim: int = 0, sizes: Sequence[int] | None = None,
             cat: bool = False, group: dist.ProcessGroup | None = None,
             strategy: str | None = None, check_sizes: bool | None = None) -> list[torch.Tensor] | torch.Tensor | None:
    """Gather tensors that differ in length along ``dim`` onto ``dst`` (a global rank, as in
    torch.distributed).  Returns the list in group-rank order (or the concatenation with
    ``cat=True``) on ``dst`` and None elsewhere.  ``sizes`` skips the metadata exchange unless
    ``check_sizes`` (default: ``$COMMSCOPE_VARLEN_CHECK``) verifies them, as in all_gather_v.
    ``strategy`` forces "native" (equal lengths), "padded", "p2p" or "a2a"."""
    op = "gather_v"
    g = meta.Group.of(group)
    root = g.group_rank(dst)
    given = sizes
    check = meta.checking(check_sizes)
    if sizes is None or check:
        rec = meta.new_record(op, root=root, strategy=strategy)
        if root < 0:
            rec[meta.F_STATUS] = meta.BAD_ROOT
        rec = meta.note_sizes(meta.describe(rec, tensor, dim), given, tensor, dim, g.size, g.rank)
        recs = meta.exchange(g, rec)
        meta.validate(g, op, recs, aux=meta.sizes_aux(check, recs))
        sizes = [meta.length(r) for r in recs]
    else:
        sizes = _check_known_sizes(g, op, tensor, dim, sizes, strategy)
        if root < 0:
            raise ValueError(f"{op}: dst {dst} is not a member of the group")
    d, front, rest = _gathered_layout(tensor, dim)
    dev = g.data_device(tensor.device.type)
    rb = _row_bytes(rest, tensor.dtype)
    plan = _resolve(op, strategy, sizes, rb, g.backend_for(dev))
    if rb * sum(sizes) == 0:
        pieces = [front.new_empty((s, *rest), device=dev) for s in sizes]
        result = _finish_pieces(pieces, None, cat=cat, dim=d, home=tensor.device, dtype=tensor.dtype)
    else:
        works, finish = _GATHER[plan](g, root, front, sizes, rest, dev)
        for w in works:
            w.wait()
        result = (_finish_pieces(*finish(), cat=cat, dim=d, home=tensor.device, dtype=tensor.dtype)
                  if g.rank == root else None)
    return result if g.rank == root else None


def _g_native(g, root, x, sizes, rest, dev):
    n = sizes[g.rank]
    out = torch.empty((g.size * n, *rest), dtype=x.dtype, device=dev) if g.rank == root else None
    gl = [_bytes(p) for p in out.split(n)] if out is not None else None
    work = dist.gather(_bytes(_dense(x, dev)), gather_list=gl, dst=g.global_rank(root), group=g.pg,
                       async_op=True)
    return [work], lambda: (list(out.split(n)), out)


def _g_padded(g, root, x, sizes, rest, dev):
    width = max(sizes)
    mine = torch.empty((width, *rest), dtype=x.dtype, device=dev)
    mine[:sizes[g.rank]].copy_(x)
    buf = torch.empty((g.size, width, *rest), dtype=x.dtype, device=dev) if g.rank == root else None
    gl = [_bytes(buf[i]) for i in range(g.size)] if buf is not None else None
    work = dist.gather(_bytes(mine), gather_list=gl, dst=g.global_rank(root), group=g.pg, async_op=True)
    return [work], lambda: ([buf[i, :s] for i, s in enumerate(sizes)], None)


def _g_p2p(g, root, x, sizes, rest, dev):
    if g.rank != root:
        ops = [("send", _bytes(_dense(x, dev)), root)] if sizes[g.rank] else []
        return _p2p(g, ops), lambda: ([], None)
    out, pieces = _exact_buffer(g, x, sizes, rest, dev)
    ops = [("recv", _bytes(p), i) for i, p in enumerate(pieces) if i != root and sizes[i]]
    return _p2p(g, ops), lambda: (pieces, out)


def _g_a2a(g, root, x, sizes, rest, dev):
    rb = _row_bytes(rest, x.dtype)
    is_root = g.rank == root
    out = torch.empty((sum(sizes) if is_root else 0, *rest), dtype=x.dtype, device=dev)
    out_splits = [s * rb for s in sizes] if is_root else [0] * g.size
    in_splits = [sizes[g.rank] * rb if j == root else 0 for j in range(g.size)]
    work = dist.all_to_all_single(_bytes(out), _bytes(_dense(x, dev)), out_splits, in_splits,
                                  group=g.pg, async_op=True)
    return [work], lambda: (list(out.split(sizes)), out)


_GATHER = {"native": _g_native, "padded": _g_padded, "p2p": _g_p2p, "a2a": _g_a2a}


# ---------------------------------------------------------------------------------------
# scatter_v
# ---------------------------------------------------------------------------------------

def scatter_v(chunks_or_tensor: Sequence[torch.Tensor] | torch.Tensor | None, src: int = 0, *,
              split_sizes: Sequence[int] | None = None, dim: int = 0, group: dist.ProcessGroup | None = None,
              strategy: str | None = None) -> torch.Tensor:
    """Scatter chunks that differ in length along ``dim`` from ``src`` (a global rank).

    On ``src``: a list with one chunk per group rank, or one tensor plus ``split_sizes``.
    Other ranks pass anything (None); their chunk's shape, dtype and ``dim`` come from ``src``,
    so they need not know them.  Returns this rank's chunk (a fresh tensor, also on src).
    ``strategy`` forces "native" (equal lengths), "padded", "p2p" or "a2a"."""
    op = "scatter_v"
    g = meta.Group.of(group)
    root = g.group_rank(src)
    base = meta.new_record(op, root=root, strategy=strategy)
    if root < 0:
        base[meta.F_STATUS] = meta.BAD_ROOT
    chunks: list[torch.Tensor] | None = None
    if g.rank == root and base[meta.F_STATUS] == meta.OK:
        chunks, records = _scatter_records(g, base, chunks_or_tensor, split_sizes, dim, strategy)
    else:
        records = [base] * g.size
    recs = meta.exchange_per_dst(g, records)
    meta.validate(g, op, recs, data_ranks=[root] if root >= 0 else [])
    info = recs[root]
    d, plan = info[meta.F_DIM], meta.STRATEGIES[info[meta.F_AUX1] - 1]
    shape = meta.shape_of(info)
    n = shape[d]
    rest = tuple(shape[:d] + shape[d + 1:])
    dtype = meta.CODE_DTYPES[info[meta.F_DTYPE]]
    dev = g.data_device(meta.CODE_DEVICES.get(info[meta.F_DEV], "cpu"))
    out = torch.empty((n, *rest), dtype=meta.raw_dtype(dtype), device=dev)
    if info[meta.F_AUX0] * _row_bytes(rest, dtype) > 0:
        for w in _SCATTER[plan](g, root, chunks, out, info[meta.F_AUX0], dev):
            w.wait()
    home = chunks[root].device if chunks is not None else dev
    return out.movedim(0, d).to(home).view(dtype)


def _scatter_records(g: meta.Group, base: list[int], chunks_or_tensor, split_sizes, dim, strategy):
    """On src: the row-block chunks and one record per destination (status on trouble)."""
    status, chunks = meta.OK, None
    if isinstance(chunks_or_tensor, torch.Tensor):
        t = chunks_or_tensor
        status = meta.tensor_status(t, dim)
        if status == meta.OK:
            sizes = _splits_or_none(split_sizes, g.size)
            status = meta.OK if sizes is not None and sum(sizes) == t.shape[dim] else meta.BAD_SPLITS
        if status == meta.OK:
            chunks = list(t.split(sizes, dim))
    elif isinstance(chunks_or_tensor, (list, tuple)):
        chunks = list(chunks_or_tensor)
        status = _chunks_status(chunks, dim) if len(chunks) == g.size else meta.WRONG_COUNT
    else:
        status = meta.NO_CHUNKS
    if status != meta.OK:
        base = list(base)
        base[meta.F_STATUS] = status
        return None, [base] * g.size
    d = dim % chunks[0].dim()
    sizes = [c.shape[d] for c in chunks]
    rest = tuple(s for i, s in enumerate(chunks[0].shape) if i != d)
    dev = g.data_device(chunks[0].device.type)
    # Only src knows the lengths, so a forced strategy that cannot run is a status, not a raise.
    trouble = (meta.STRATEGY_UNSUPPORTED if strategy is not None and strategy not in SUPPORTED["scatter_v"] else
               meta.STRATEGY_NEEDS_EQUAL if strategy in EQUAL_ONLY and len(set(sizes)) > 1 else meta.OK)
    if trouble != meta.OK:
        base = list(base)
        base[meta.F_STATUS] = trouble
        return None, [base] * g.size
    plan = _resolve("scatter_v", strategy, sizes, _row_bytes(rest, chunks[0].dtype), g.backend_for(dev))
    records = []
    for c in chunks:
        rec = meta.describe(list(base), c, d)
        rec[meta.F_AUX0], rec[meta.F_AUX1] = max(sizes), meta.STRATEGY_CODES[plan]
        records.append(rec)
    return [meta.raw(c).movedim(d, 0) for c in chunks], records


def _chunks_status(chunks: Sequence[Any], dim: int) -> int:
    """OK when every chunk is a usable tensor and they agree on all but the length along dim."""
    for c in chunks:
        status = meta.tensor_status(c, dim)
        if status != meta.OK:
            return status
    first = chunks[0]
    d = dim % first.dim()

    def key(c):
        return (c.dtype, c.device.type, c.dim(), tuple(s for i, s in enumerate(c.shape) if i != d))

    return meta.OK if all(key(c) == key(first) for c in chunks) else meta.CHUNKS_DISAGREE


def _s_native(g, root, chunks, out, width, dev):
    sl = [_bytes(_dense(c, dev)) for c in chunks] if chunks is not None else None
    return [dist.scatter(_bytes(out), scatter_list=sl, src=g.global_rank(root), group=g.pg, async_op=True)]


def _s_padded(g, root, chunks, out, width, dev):
    slot = torch.empty((width, *out.shape[1:]), dtype=out.dtype, device=dev)
    sl = None
    if chunks is not None:
        buf = torch.empty((g.size, *slot.shape), dtype=out.dtype, device=dev)
        for i, c in enumerate(chunks):
            buf[i, :c.shape[0]].copy_(c)
        sl = [_bytes(buf[i]) for i in range(g.size)]
    work = dist.scatter(_bytes(slot), scatter_list=sl, src=g.global_rank(root), group=g.pg, async_op=True)
    return [_Then(work, lambda: out.copy_(slot[:out.shape[0]]))]


def _s_p2p(g, root, chunks, out, width, dev):
    if chunks is None:
        return _p2p(g, [("recv", _bytes(out), root)] if out.numel() else [])
    out.copy_(chunks[root])
    return _p2p(g, [("send", _bytes(_dense(c, dev)), i) for i, c in enumerate(chunks)
                    if i != root and c.numel()])


def _s_a2a(g, root, chunks, out, width, dev):
    if chunks is not None:
        inp = _bytes(torch.cat([_dense(c, dev) for c in chunks]))
        in_splits = [c.numel() * c.element_size() for c in chunks]
    else:
        inp, in_splits = _bytes(out.new_empty(0)), [0] * g.size
    out_splits = [out.numel() * out.element_size() if j == root else 0 for j in range(g.size)]
    return [dist.all_to_all_single(_bytes(out), inp, out_splits, in_splits, group=g.pg, async_op=True)]


class _Then:
    """A work followed by a local step once it completed."""

    def __init__(self, work, then: Callable[[], Any]):
        self._work, self._then = work, then

    def is_completed(self) -> bool:
        return self._work.is_completed()

    def wait(self) -> None:
        self._work.wait()
        self._then()


_SCATTER = {"native": _s_native, "padded": _s_padded, "p2p": _s_p2p, "a2a": _s_a2a}


# ---------------------------------------------------------------------------------------
# all_to_all_v
# ---------------------------------------------------------------------------------------

def all_to_all_v(tensors_per_dst: Sequence[torch.Tensor], *, dim: int = 0,
                 group: dist.ProcessGroup | None = None) -> list[torch.Tensor]:
    """Send ``tensors_per_dst[j]`` to group rank j; return the tensors received, indexed by
    source group rank.  Lengths along ``dim`` may differ per pair; dtype and the other dims
    must agree across everything.  Data move as one exact-size ``all_to_all_single``."""
    op = "all_to_all_v"
    g = meta.Group.of(group)
    base = meta.new_record(op)
    chunks = list(tensors_per_dst) if isinstance(tensors_per_dst, (list, tuple)) else None
    status = (meta.NOT_A_LIST if chunks is None else meta.WRONG_COUNT if len(chunks) != g.size
              else _chunks_status(chunks, dim))
    if status != meta.OK:
        base[meta.F_STATUS] = status
        records = [base] * g.size
    else:
        d = dim % chunks[0].dim()
        records = [meta.describe(list(base), c, d) for c in chunks]
    recs = meta.exchange_per_dst(g, records)
    meta.validate(g, op, recs)
    d = recs[0][meta.F_DIM]
    recv = [meta.length(r) for r in recs]
    home = chunks[0].device
    dev = g.data_device(home.type)
    fronts = [meta.raw(c).movedim(d, 0) for c in chunks]
    rest = tuple(fronts[0].shape[1:])
    rb = _row_bytes(rest, chunks[0].dtype)
    inp = torch.cat([f.to(dev) for f in fronts])
    out = torch.empty((sum(recv), *rest), dtype=inp.dtype, device=dev)
    dist.all_to_all_single(_bytes(out), _bytes(inp), [n * rb for n in recv],
                           [f.shape[0] * rb for f in fronts], group=g.pg)
    return [p.movedim(0, d).to(home).view(chunks[0].dtype) for p in out.split(recv)]


# ---------------------------------------------------------------------------------------
# reduce_scatter_v
# ---------------------------------------------------------------------------------------

def reduce_scatter_v(tensor: torch.Tensor, split_sizes: Sequence[int], op=dist.ReduceOp.SUM, *, dim: int = 0,
                     group: dist.ProcessGroup | None = None, strategy: str | None = None) -> torch.Tensor:
    """Reduce ``tensor`` (same shape on every rank) across ``group`` with ``op`` and return
    this rank's chunk: chunk j has ``split_sizes[j]`` entries along ``dim``.  ``strategy``
    forces "native" (equal splits), "padded", "list" or "allreduce".  The result is detached
    (no autograd history), like every varlen op's."""
    name = "reduce_scatter_v"
    g = meta.Group.of(group)
    rec = meta.describe(meta.new_record(name, strategy=strategy), tensor, dim)
    splits = _splits_or_none(split_sizes, g.size)
    if rec[meta.F_STATUS] == meta.OK and (splits is None or sum(splits) != tensor.shape[dim]):
        rec[meta.F_STATUS] = meta.BAD_SPLITS
    if rec[meta.F_STATUS] == meta.OK and not meta.is_reduce_op(op):
        rec[meta.F_STATUS] = meta.BAD_OP
    rec[meta.F_AUX0] = meta.reduce_op_code(op) if meta.is_reduce_op(op) else -2
    rec[meta.F_AUX1] = meta.hash_ints(splits or [])
    recs = meta.exchange(g, rec)
    meta.validate(g, name, recs, compare_length=True,
               aux=[(meta.F_AUX0, "reduce op", _op_name),
                    (meta.F_AUX1, "split_sizes (fingerprint)", lambda h: f"#{h:x}")])
    d = dim % tensor.dim()
    # Reductions need the real dtype, not raw bytes: so resolve conj/neg views here (``raw`` does
    # it for the others), and detach, or the internal copies would carry autograd history.
    front = tensor.detach().resolve_conj().resolve_neg().movedim(d, 0)
    rest = tuple(front.shape[1:])
    dev = g.data_device(tensor.device.type)
    backend = g.backend_for(dev)
    op, pre, post = _reduce_op(name, op, tensor.dtype, backend, g.size)
    front = pre(front)
    plan = _resolve(name, strategy, splits, _row_bytes(rest, tensor.dtype), backend)
    out = _RS[plan](g, front, splits, op, dev) if meta.numel(front.shape) else \
        front.new_empty((splits[g.rank], *rest), device=dev)
    return post(out).movedim(0, d).to(tensor.device)


def _splits_or_none(split_sizes, size: int) -> list[int] | None:
    """One non-negative int per rank, or None.  Never raises (a bad value becomes a status)."""
    try:
        splits = [meta.whole(s) for s in split_sizes]
    except Exception:  # TypeError, ValueError, OverflowError, a multi-element tensor's RuntimeError
        return None
    return splits if len(splits) == size and min(splits, default=0) >= 0 else None


def _op_name(code: int) -> str:
    names = {int(getattr(dist.ReduceOp, n)): n for n in ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR")
             if hasattr(dist.ReduceOp, n)}
    return names.get(code, "custom")


#: The dtypes Gloo reduces (its others raise "Invalid scalar type", naming neither the op nor
#: the dtype: int16, uint16/32/64, the float8s)
GLOO_REDUCES = frozenset({torch.bool, torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16,
                          torch.bfloat16, torch.float32, torch.float64, torch.complex32, torch.complex64,
                          torch.complex128})
#: Dtypes averaged on Gloo by scaling each rank's part first, as NCCL's AVG does: their sum may
#: overflow where their average fits (40000 on 2 ranks in float16 was inf)
_SCALED_FIRST = frozenset({torch.float16, torch.bfloat16, torch.complex32})


#: The bitwise reduce ops: integer and bool dtypes only, and none on NCCL
_BITWISE = frozenset(int(getattr(dist.ReduceOp, n)) for n in ("BAND", "BOR", "BXOR") if hasattr(dist.ReduceOp, n))


def _identity(t: torch.Tensor) -> torch.Tensor:
    return t


def _reduce_op(name: str, op, dtype: torch.dtype, backend: str, size: int):
    """(op to run, pre-step, post-step).  Gloo has no AVG: run SUM, then divide (floating and
    complex dtypes only), or scale each part by 1/size first where the sum may overflow
    (``_SCALED_FIRST``; the pre-step makes a new tensor: an input is never written).  Checked
    alike on every rank (the dtypes agree), so all raise together."""
    if dtype.is_complex and not dist.supports_complex(op):
        raise ValueError(f"{name}: reduce op {_op_name(meta.reduce_op_code(op))} does not support complex tensors")
    if meta.reduce_op_code(op) in _BITWISE:
        if backend == "nccl":  # (ProcessGroupNCCL: "Cannot use ReduceOp.BAND with NCCL")
            raise ValueError(f"{name}: nccl has no ReduceOp.{_op_name(meta.reduce_op_code(op))}")
        if dtype.is_floating_point:  # (Gloo: "Cannot use ReduceOp.BAND with non-integral dtype", on one rank)
            raise ValueError(f"{name}: ReduceOp.{_op_name(meta.reduce_op_code(op))} needs an integer or bool "
                             f"dtype, got {dtype}")
    if backend == "gloo" and meta.reduce_op_code(op) == -1:  # (a premul-sum: Gloo raised its RuntimeError)
        raise ValueError(f"{name}: gloo has no premul-sum reduce op (dist._make_nccl_premul_sum is NCCL's): scale "
                         "the input, then ReduceOp.SUM")
    if backend == "gloo" and dtype not in GLOO_REDUCES:
        raise ValueError(f"{name}: gloo cannot reduce {dtype} tensors (it reduces "
                         + ", ".join(sorted(str(d).removeprefix("torch.") for d in GLOO_REDUCES)) + ")")
    if backend == "gloo" and meta.reduce_op_code(op) == int(dist.ReduceOp.AVG):
        if not (dtype.is_floating_point or dtype.is_complex):
            raise ValueError(f"{name}: ReduceOp.AVG on gloo needs a floating or complex dtype, got {dtype}")
        if dtype in _SCALED_FIRST:
            return dist.ReduceOp.SUM, lambda t: t * (1.0 / size), _identity
        return dist.ReduceOp.SUM, _identity, lambda t: t.div_(size)
    return op, _identity, _identity


def _rs_native(g, x, splits, op, dev):
    out = torch.empty((splits[g.rank], *x.shape[1:]), dtype=x.dtype, device=dev)
    meta._reduce_scatter_into(out, _dense(x, dev), op, g.pg)
    return out


def _rs_padded(g, x, splits, op, dev):
    width = max(splits)
    buf = torch.zeros((g.size, width, *x.shape[1:]), dtype=x.dtype, device=dev)
    for i, chunk in enumerate(x.split(splits)):
        buf[i, :splits[i]].copy_(chunk)
    out = torch.empty(buf.shape[1:], dtype=x.dtype, device=dev)
    meta._reduce_scatter_into(out, buf.reshape(g.size * width, *x.shape[1:]), op, g.pg)
    return out[:splits[g.rank]]


def _rs_list(g, x, splits, op, dev):
    out = torch.empty((splits[g.rank], *x.shape[1:]), dtype=x.dtype, device=dev)
    dist.reduce_scatter(out, list(_dense(x, dev).split(splits)), op=op, group=g.pg)
    return out


def _rs_allreduce(g, x, splits, op, dev):
    buf = torch.empty(x.shape, dtype=x.dtype, device=dev).copy_(x)  # never reduce into the caller's tensor
    dist.all_reduce(buf, op=op, group=g.pg)
    start = sum(splits[:g.rank])
    return buf[start:start + splits[g.rank]].clone()  # don't pin the whole buffer


_RS = {"native": _rs_native, "padded": _rs_padded, "list": _rs_list, "allreduce": _rs_allreduce}


# ---------------------------------------------------------------------------------------
# broadcast_v
# ---------------------------------------------------------------------------------------

def broadcast_v(tensor_or_none: torch.Tensor | None, src: int = 0, *,
                group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Broadcast a tensor whose shape and dtype only ``src`` (a global rank) knows.

    Receivers pass None (anything they pass is ignored) and get a new tensor on the group's
    device for that device type; ``src`` gets its own tensor back.  0-d tensors are fine."""
    op = "broadcast_v"
    g = meta.Group.of(group)
    root = g.group_rank(src)
    rec = meta.new_record(op, root=root)
    if root < 0:
        rec[meta.F_STATUS] = meta.BAD_ROOT
    elif g.rank == root:
        meta.describe(rec, tensor_or_none, None, allow_0d=True)
    recs = meta.exchange(g, rec)
    meta.validate(g, op, recs, data_ranks=[root] if root >= 0 else [])
    info = recs[root]
    dtype = meta.CODE_DTYPES[info[meta.F_DTYPE]]
    dev = g.data_device(meta.CODE_DEVICES.get(info[meta.F_DEV], "cpu"))
    if g.rank == root:
        buf = _dense(meta.raw(tensor_or_none), dev)
    else:
        buf = torch.empty(meta.shape_of(info), dtype=meta.raw_dtype(dtype), device=dev)
    if buf.numel():
        dist.broadcast(_bytes(buf), src=g.global_rank(root), group=g.pg)
    return tensor_or_none if g.rank == root else buf.view(dtype)
