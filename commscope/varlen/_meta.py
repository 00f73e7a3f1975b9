"""Metadata for varlen ops: dtype/device codes, fixed-width records, their exchange and validation.

Every rank encodes what it was asked to do (op, root, dim, dtype, device type, shape, and
any local problem as a status code) into one fixed-width int64 record.  One small collective
gives every rank the records of the whole group and one host read (``tolist``) brings them
to Python.  Because every rank then decides from the same numbers, a disagreement raises
the same ``ValueError`` everywhere instead of a hang on some ranks and garbage on others.
"""

from __future__ import annotations

import dataclasses
import math
import operator
import os
import weakref
from collections import Counter
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

# ---------------------------------------------------------------------------------------
# Stable codes.  Append only: the numbers travel between processes (and versions).
# ---------------------------------------------------------------------------------------

_DTYPE_NAMES = (
    "bool", "uint8", "int8", "int16", "int32", "int64",
    "float16", "bfloat16", "float32", "float64",
    "complex32", "complex64", "complex128",
    "uint16", "uint32", "uint64",
    "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu",
    "float4_e2m1fn_x2",
    "bits8", "bits16", "bits1x8", "bits2x4", "bits4x2",
    "uint1", "uint2", "uint3", "uint4", "uint5", "uint6", "uint7",
    "int1", "int2", "int3", "int4", "int5", "int6", "int7",
)
#: dtype -> code (1-based; 0 means "unsupported").  Dtypes missing from this torch are skipped
#: but keep their number.  Quantized dtypes are left out on purpose: their bytes alone do not
#: carry scale and zero point.
DTYPE_CODES: dict[torch.dtype, int] = {
    getattr(torch, name): i + 1 for i, name in enumerate(_DTYPE_NAMES) if hasattr(torch, name)
}
CODE_DTYPES: dict[int, torch.dtype] = {c: d for d, c in DTYPE_CODES.items()}

_DEVICE_TYPES = ("cpu", "cuda", "xpu", "mps", "hpu", "meta", "privateuseone", "mtia")
DEVICE_CODES: dict[str, int] = {name: i + 1 for i, name in enumerate(_DEVICE_TYPES)}
_OTHER_DEVICE = 99
CODE_DEVICES: dict[int, str] = {c: n for n, c in DEVICE_CODES.items()}

MAGIC = 0x766C6E31  # "vln1"

OPS = ("all_gather_v", "gather_v", "scatter_v", "all_to_all_v", "reduce_scatter_v", "broadcast_v")
OP_CODES = {name: i + 1 for i, name in enumerate(OPS)}

#: strategy name -> code (0 = chosen automatically)
STRATEGIES = ("native", "padded", "p2p", "bcast", "a2a", "list", "allreduce")
STRATEGY_CODES = {name: i + 1 for i, name in enumerate(STRATEGIES)}
_BAD_STRATEGY = -1

# status codes: a local problem that every rank must learn about
OK, ZERO_DIM, TOO_MANY_DIMS, BAD_DTYPE, BAD_DIM, NOT_TENSOR, CHUNKS_DISAGREE, BAD_SPLITS, \
    BAD_ROOT, BAD_STRATEGY, BAD_LAYOUT, NO_DATA, NESTED, UNREADABLE, BAD_SIZES, BAD_OP, NOT_A_LIST, \
    WRONG_COUNT, NO_CHUNKS, STRATEGY_NEEDS_EQUAL, STRATEGY_UNSUPPORTED = range(21)
STATUS_TEXT = {
    ZERO_DIM: "a 0-d tensor (varlen ops need a dimension to vary along; use t.reshape(1))",
    TOO_MANY_DIMS: "a tensor with more than {maxd} dims",
    BAD_DTYPE: "a tensor of an unsupported dtype (quantized?)",
    BAD_DIM: "a `dim` out of range for its tensor",
    NOT_TENSOR: "something that is not a torch.Tensor",
    CHUNKS_DISAGREE: "chunks that disagree with each other in dtype, device, ndim or trailing dims",
    BAD_SPLITS: "split sizes that do not fit (one non-negative size per rank, summing to the length)",
    BAD_ROOT: "a src/dst that is not a member of the group",
    BAD_STRATEGY: "an unknown strategy",
    BAD_LAYOUT: "a sparse or otherwise non-strided tensor",
    NO_DATA: "a tensor without data (on the meta device)",
    NESTED: "a nested tensor (pass its components, e.g. t.unbind(), or a padded tensor)",
    UNREADABLE: "a tensor whose shape or layout cannot be read",
    BAD_SIZES: "sizes= that do not fit (one non-negative length per rank; its own entry must be its tensor's length)",
    BAD_OP: "a reduce op that is not a torch.distributed.ReduceOp (e.g. dist.ReduceOp.SUM)",
    NOT_A_LIST: "something that is not a list or tuple of tensors (one per rank)",
    WRONG_COUNT: "a list whose length is not the group size (one tensor per rank)",
    NO_CHUNKS: "neither a list of chunks (one per rank) nor a tensor with split_sizes",
    STRATEGY_NEEDS_EQUAL: "strategy 'native', which needs equal lengths, with chunks of unequal lengths",
    STRATEGY_UNSUPPORTED: "a strategy this op does not implement",
}

# record layout
F_MAGIC, F_OP, F_ROOT, F_STATUS, F_DTYPE, F_DEV, F_NDIM, F_DIM, F_STRAT, F_AUX0, F_AUX1, F_SHAPE = range(12)
MAX_NDIM = 14
WIDTH = F_SHAPE + MAX_NDIM  # int64 words per rank


def dtype_code(dtype: torch.dtype) -> int:
    return DTYPE_CODES.get(dtype, 0)


def device_code(device: torch.device) -> int:
    return DEVICE_CODES.get(device.type, _OTHER_DEVICE)


def hash_ints(xs: Sequence[int]) -> int:
    """FNV-1a over ints, folded into a positive int64: a cheap fingerprint of split sizes."""
    h = 1469598103934665603
    for x in xs:
        h = ((h ^ (int(x) & 0xFFFFFFFFFFFFFFFF)) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h & 0x7FFFFFFFFFFFFFFF


def is_reduce_op(op: object) -> bool:
    """A ReduceOp member or instance (premul-sum); anything else (a string, an int) is refused
    through the record, so every rank raises instead of this one alone."""
    return isinstance(op, (dist.ReduceOp, dist.ReduceOp.RedOpType))


def reduce_op_code(op) -> int:
    """Small int for a ReduceOp (``-1`` for opaque ones such as a premul-sum instance)."""
    try:
        return int(op)
    except Exception:
        for name in ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"):
            member = getattr(dist.ReduceOp, name, None)
            if member is not None and op == member:
                return int(member)
        return -1


# ---------------------------------------------------------------------------------------
# Process group facts
# ---------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Group:
    """What a varlen op needs to know about its process group."""

    pg: dist.ProcessGroup
    rank: int                      # this process's rank in the group
    size: int
    ranks: tuple[int, ...]         # group rank -> global rank
    backends: dict[str, str]       # device type -> backend name

    @classmethod
    def of(cls, group: dist.ProcessGroup | None) -> Group:
        """The facts are fixed for a group's lifetime, and asking torch for them costs ~25 us
        (a tenth of a small send): they are cached per group object, weakly."""
        pg = group if group is not None else dist.group.WORLD
        try:
            facts = _GROUP_FACTS.get(pg)
        except TypeError:  # not weak-referenceable (None before init, a stand-in): no cache
            facts = None
        if facts is None:
            rank = dist.get_rank(pg)
            if rank < 0:
                raise ValueError("this process is not a member of the process group it passed")
            size = dist.get_world_size(pg)
            ranks = tuple(range(size)) if pg is dist.group.WORLD else tuple(dist.get_process_group_ranks(pg))
            facts = (rank, size, ranks, _backends(pg))
            try:
                _GROUP_FACTS[pg] = facts
            except TypeError:
                pass
        return cls(pg, *facts)

    def global_rank(self, group_rank: int) -> int:
        return self.ranks[group_rank]

    def group_rank(self, global_rank: int) -> int:
        """Group rank of a global rank, or -1 when it is not a member."""
        if not is_index(global_rank):
            return -1
        try:
            return self.ranks.index(operator.index(global_rank))
        except ValueError:
            return -1

    @property
    def meta_device(self) -> torch.device:
        """Where metadata travels.  It depends on the group only, so every rank agrees on it
        even when their data sit on different device types (which is then reported)."""
        if self.backends.get("cuda") == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        if "cpu" in self.backends:
            return torch.device("cpu")
        kind = next(iter(self.backends), "cpu")
        mod = getattr(torch, kind, None)
        index = mod.current_device() if mod is not None and hasattr(mod, "current_device") else None
        return torch.device(kind, index)

    def data_device(self, device_type: str) -> torch.device:
        """The device data of this type travel on: itself when the group has a real backend for
        it, else the metadata device (staging copy).  Gloo is treated as CPU-only."""
        backend = self.backends.get(device_type)
        if backend is None or (backend == "gloo" and device_type != "cpu"):
            return self.meta_device
        if device_type == "cpu":
            return torch.device("cpu")
        mod = getattr(torch, device_type, None)
        index = mod.current_device() if mod is not None and hasattr(mod, "current_device") else None
        return torch.device(device_type, index)

    def backend_for(self, device: torch.device) -> str:
        return self.backends.get(device.type, "gloo")

    def fmt_ranks(self, group_ranks: Sequence[int]) -> str:
        rs = sorted(group_ranks)
        glob = [self.ranks[r] for r in rs]
        return f"{rs}" if glob == rs else f"{rs} (global {glob})"


#: ProcessGroup -> (rank, size, ranks, backends); weak, so a destroyed group is never kept alive.
_GROUP_FACTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _backends(pg: dist.ProcessGroup) -> dict[str, str]:
    try:
        config = dist.get_backend_config(pg)
    except (AttributeError, RuntimeError, ValueError):
        config = str(dist.get_backend(pg))
    out: dict[str, str] = {}
    for part in str(config).split(","):
        part = part.strip().lower()
        if not part:
            continue
        if ":" in part:
            device, backend = part.split(":", 1)
            out[device] = backend
        elif part == "nccl":
            out["cuda"] = "nccl"
        elif part == "gloo":
            out.update(cpu="gloo", cuda="gloo")
        else:
            out.setdefault("cpu", part)
            out.setdefault("cuda", part)
    return out


# ---------------------------------------------------------------------------------------
# Records
# ---------------------------------------------------------------------------------------

def new_record(op: str, *, root: int = -1, strategy: str | None = None) -> list[int]:
    rec = [0] * WIDTH
    rec[F_MAGIC], rec[F_OP], rec[F_ROOT] = MAGIC, OP_CODES[op], root
    rec[F_DIM] = -1
    if strategy is not None:
        rec[F_STRAT] = STRATEGY_CODES.get(strategy, _BAD_STRATEGY) if isinstance(strategy, str) else _BAD_STRATEGY
        if rec[F_STRAT] == _BAD_STRATEGY:
            rec[F_STATUS] = BAD_STRATEGY
    return rec


def is_index(x: object) -> bool:
    """Whether ``x`` is an integer as an index must be (an int or numpy integer; not a bool,
    nor a float or string that ``int()`` would take: ``src=1.7`` was rank 1)."""
    if isinstance(x, bool):
        return False
    try:
        operator.index(x)
    except TypeError:
        return False
    return True


def whole(x: object) -> int:
    """A length given as a size: an integer (``is_index``), or a float or 0-d tensor whose
    value is whole; anything else raises ValueError or TypeError (``int()`` made 1.5 a 1)."""
    if is_index(x):
        return operator.index(x)
    if isinstance(x, bool):
        raise TypeError(f"a size is an integer, not {x!r}")
    f = float(x)  # (TypeError for what is no number)
    if not f.is_integer():
        raise ValueError(f"a size is a whole number, not {x!r}")
    return int(f)


def tensor_status(t: object, dim: int | None, *, allow_0d: bool = False) -> int:
    """Local problems with one input tensor, as a status code (OK when fine).

    Never raises: a problem found here travels in the metadata record, so that every rank
    raises the same error instead of this one raising alone and the others hanging."""
    if not isinstance(t, torch.Tensor):
        return NOT_TENSOR
    try:
        return _tensor_status(t, dim, allow_0d)
    except Exception:  # a subclass or layout whose shape or strides raise
        return UNREADABLE


def _tensor_status(t: torch.Tensor, dim: int | None, allow_0d: bool) -> int:
    if t.is_nested:
        return NESTED
    if t.layout != torch.strided or t.is_quantized:
        return BAD_LAYOUT if t.layout != torch.strided else BAD_DTYPE
    if dtype_code(t.dtype) == 0:
        return BAD_DTYPE
    if t.dim() == 0 and not allow_0d:
        return ZERO_DIM
    if t.dim() > MAX_NDIM:
        return TOO_MANY_DIMS
    if dim is not None and (not is_index(dim) or not -t.dim() <= dim < t.dim()):
        return BAD_DIM  # (an int: a float that compares in range read as one, then raised on its rank alone)
    if t.device.type == "meta":
        return NO_DATA
    tuple(t.shape)  # readable (raises for exotic subclasses: UNREADABLE)
    return OK


#: ``COMMSCOPE_VARLEN_CHECK=1``: ops given ``sizes=`` still exchange metadata and check them.
ENV_CHECK = "COMMSCOPE_VARLEN_CHECK"


def checking(check_sizes: bool | None) -> bool:
    """Whether a call given ``sizes=`` verifies them with a metadata exchange."""
    if check_sizes is not None:
        return bool(check_sizes)
    return os.environ.get(ENV_CHECK, "").strip().lower() in ("1", "true", "yes", "on")


def note_sizes(rec: list[int], sizes: Sequence[int] | None, t: object, dim: int, group_size: int,
               rank: int) -> list[int]:
    """Checking mode: put the caller's ``sizes=`` into the record (passed or not, and a
    fingerprint) and a status when they do not fit this rank's tensor.  ``validate`` with
    ``SIZES_AUX`` then raises the same error on every rank when they disagree."""
    if sizes is None:
        return rec
    rec[F_AUX0] = 1
    try:
        sizes = [whole(s) for s in sizes]
        ok = len(sizes) == group_size and min(sizes) >= 0
    except Exception:  # TypeError, ValueError, OverflowError, a tensor's RuntimeError: all a status
        ok = False
    if ok:
        rec[F_AUX1] = hash_ints(sizes)
        if rec[F_STATUS] == OK and rec[F_NDIM] and rec[F_DIM] >= 0 and length(rec) != sizes[rank]:
            ok = False
    if not ok and rec[F_STATUS] == OK:
        rec[F_STATUS] = BAD_SIZES
    return rec


SIZES_AUX = ((F_AUX0, "whether sizes= was passed", lambda v: "passed" if v else "not passed"),
             (F_AUX1, "sizes= (fingerprint)", lambda h: f"#{h:x}"))


def sizes_aux(check: bool, recs: Sequence[Sequence[int]]) -> Sequence[tuple[int, str, Callable]]:
    """``validate``'s ``aux`` for an op that takes ``sizes=``: ``SIZES_AUX`` where this rank
    checks, or any rank does (one that passed ``sizes=`` and still exchanged records is
    checking them): every rank then raises the same error.  Before, only the checking ranks
    compared them, and a rank not checking went on into the transfer (helper-106)."""
    return SIZES_AUX if check or any(r[F_AUX0] for r in recs) else ()


def describe(rec: list[int], t: torch.Tensor, dim: int | None, *, allow_0d: bool = False,
             size: int | None = None) -> list[int]:
    """Fill ``rec`` with ``t``'s dtype, device, ndim, dim and shape, or a status code.

    ``size`` overrides the length along ``dim`` (a chunk of a split tensor)."""
    status = tensor_status(t, dim, allow_0d=allow_0d)
    if status != OK:
        if rec[F_STATUS] == OK:
            rec[F_STATUS] = status
        return rec
    nd = t.dim()
    rec[F_DTYPE], rec[F_DEV], rec[F_NDIM] = dtype_code(t.dtype), device_code(t.device), nd
    shape = list(t.shape)
    if dim is not None:
        rec[F_DIM] = dim % nd
        if size is not None:
            shape[rec[F_DIM]] = size
    rec[F_SHAPE:F_SHAPE + nd] = shape
    return rec


def shape_of(rec: Sequence[int]) -> list[int]:
    return list(rec[F_SHAPE:F_SHAPE + rec[F_NDIM]])


def trailing(rec: Sequence[int]) -> tuple[int, ...]:
    """Shape without the varying dim."""
    shape = shape_of(rec)
    if rec[F_DIM] >= 0:
        del shape[rec[F_DIM]]
    return tuple(shape)


def length(rec: Sequence[int]) -> int:
    return rec[F_SHAPE + rec[F_DIM]]


# ---------------------------------------------------------------------------------------
# Exchange
# ---------------------------------------------------------------------------------------

def _all_gather_into(out: torch.Tensor, inp: torch.Tensor, group, async_op: bool = False):
    """``all_gather_single`` where this torch has it (``all_gather_into_tensor`` is deprecated
    in 2.13 and warns on every call), looked up at call time so wrappers see it."""
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return fn(out, inp, group=group, async_op=async_op)


def _reduce_scatter_into(out: torch.Tensor, inp: torch.Tensor, op, group, async_op: bool = False):
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return fn(out, inp, op=op, group=group, async_op=async_op)


def exchange(g: Group, record: list[int]) -> list[list[int]]:
    """Every rank's record, on every rank: one small collective and one host read.

    Gloo: one point-to-point message per pair (see ``exchange_p2p``), or for groups of more
    than ``P2P_METADATA_MAX_RANKS`` an all_to_all_single of the replicated record (Gloo's
    all_gather is a ring of size - 1 dependent steps, measured 7x slower for this payload).
    Others: an all_gather on the metadata device."""
    if p2p_metadata(g):
        return exchange_p2p(g, [record] * g.size)[0]
    dev = g.meta_device
    mine = torch.tensor(record, dtype=torch.int64).to(dev)
    out = torch.empty(g.size * WIDTH, dtype=torch.int64, device=dev)
    if g.backend_for(dev) == "gloo":  # Gloo's all_gather is a ring of size - 1 dependent steps
        dist.all_to_all_single(out, mine.repeat(g.size), group=g.pg)
    else:
        _all_gather_into(out, mine, g.pg)
    flat = out.tolist()
    return [flat[i * WIDTH:(i + 1) * WIDTH] for i in range(g.size)]


def exchange_per_dst(g: Group, records: list[list[int]]) -> list[list[int]]:
    """Send ``records[j]`` to group rank j; return the record each rank sent here."""
    if p2p_metadata(g):
        return exchange_p2p(g, records)[0]
    dev = g.meta_device
    inp = torch.tensor(records, dtype=torch.int64).reshape(-1).to(dev)
    out = torch.empty(g.size * WIDTH, dtype=torch.int64, device=dev)
    dist.all_to_all_single(out, inp, group=g.pg)
    flat = out.tolist()
    return [flat[i * WIDTH:(i + 1) * WIDTH] for i in range(g.size)]


# ---- Gloo: records as point-to-point messages, with room for all_gather_v's data ---------
#
# Every varlen op on a Gloo group exchanges its metadata as exactly one message per ordered
# pair of ranks, with the same tag, whatever the op: so ranks that disagree about the op
# still exchange records, and validation raises the same error on all of them.  (An
# all_to_all_single of the records, used before, cost the same; Gloo's all_gather is a ring
# of size - 1 dependent steps, measured 7x slower for this payload.)
#
# The message also carries data.  A Gloo receive accepts a message shorter than its buffer,
# so each rank makes room, after the record from rank s, for as many bytes as rank s sent in
# the group's previous all_gather_v (``payload_caps``: computed from the records of that
# call, which every rank holds alike, so every rank agrees on them).  all_gather_v sends as
# much of its tensor as fits there; when no rank grew, that was the whole op: one round of
# messages instead of a metadata round and then a data round.  Other ops send the record
# only.  A Gloo receive never takes a longer message, and nothing else is posted before
# the records are validated, so a disagreement can neither hang nor corrupt later messages.

RECORD_TAG = 0x7663
_PAYLOAD_CAPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


#: Above this many ranks, 2(n-1) Python-level isend/irecv calls per op cost more than one
#: all_to_all_single of the records, which bigger Gloo groups use instead (no data riding along).
P2P_METADATA_MAX_RANKS = 64
#: The room made for all_gather_v data in the metadata messages, summed over the group's ranks;
#: a bigger previous call gets none (a metadata round is small next to such a transfer, and
#: every other varlen op on the group would allocate that room too).
SPECULATE_MAX_BYTES = 64 << 20


def p2p_metadata(g: Group) -> bool:
    """Metadata travel as p2p messages (a small Gloo group carries them); every rank agrees:
    it depends on the group only."""
    return 1 < g.size <= P2P_METADATA_MAX_RANKS and g.backend_for(g.meta_device) == "gloo"


def payload_caps(g: Group) -> list[int]:
    caps = _PAYLOAD_CAPS.get(g.pg)
    return list(caps) if caps is not None and len(caps) == g.size else [0] * g.size


def set_payload_caps(g: Group, nbytes: Sequence[int]) -> None:
    """Call with values every rank computes alike (from the exchanged records), at the same
    point of the same op on every rank, or the ranks' message sizes stop agreeing."""
    caps = [int(b) for b in nbytes]
    _PAYLOAD_CAPS[g.pg] = caps if sum(caps) <= SPECULATE_MAX_BYTES else [0] * len(caps)


def exchange_p2p(g: Group, records: list[list[int]], payload: torch.Tensor | None = None
                 ) -> tuple[list[list[int]], list[torch.Tensor | None]]:
    """Send ``records[j]`` (plus up to ``payload_caps[me]`` bytes of ``payload``, a flat uint8
    CPU tensor) to each rank j; return the records received (own one included) and, per
    rank, the bytes of room its payload had here (None for this rank)."""
    n, me = g.size, g.rank
    caps = payload_caps(g)
    rec_bytes = -(-8 * WIDTH // 16) * 16  # the record, padded so the payload and slots are 16-aligned
    slot = [0 if s == me else rec_bytes + -(-caps[s] // 16) * 16 for s in range(n)]
    start = [0] * n
    for s in range(1, n):
        start[s] = start[s - 1] + slot[s - 1]
    inbox = torch.empty(start[-1] + slot[-1], dtype=torch.uint8)
    k = min(payload.numel(), caps[me]) if payload is not None else 0

    def message(record: list[int]) -> torch.Tensor:
        buf = torch.empty(rec_bytes + k, dtype=torch.uint8)
        buf[:8 * WIDTH].view(torch.int64).copy_(torch.tensor(record, dtype=torch.int64))
        if k:
            buf[rec_bytes:].copy_(payload[:k])
        return buf

    shared = message(records[0]) if all(r is records[0] for r in records) else None  # one copy for all
    works = []
    for step in range(1, n):
        dst, src = (me + step) % n, (me - step) % n
        sbuf = shared if shared is not None else message(records[dst])
        works.append(dist.isend(sbuf, dst=g.global_rank(dst), group=g.pg, tag=RECORD_TAG))
        works.append(dist.irecv(inbox[start[src]:start[src] + slot[src]], src=g.global_rank(src), group=g.pg,
                                tag=RECORD_TAG))
    for w in works:
        w.wait()
    recs, arrived = [], []
    for s in range(n):
        if s == me:
            recs.append(list(records[me]))
            arrived.append(None)
        else:
            recs.append(inbox[start[s]:start[s] + 8 * WIDTH].view(torch.int64).tolist())
            arrived.append(inbox[start[s] + rec_bytes:start[s] + rec_bytes + caps[s]])
    return recs, arrived


# ---------------------------------------------------------------------------------------
# Validation: same records in, same ValueError out, on every rank
# ---------------------------------------------------------------------------------------

def _dtype_name(code: int) -> str:
    d = CODE_DTYPES.get(code)
    return str(d).removeprefix("torch.") if d is not None else f"dtype#{code}"


def _device_name(code: int) -> str:
    return CODE_DEVICES.get(code, "other")


def _strategy_name(code: int) -> str:
    return "auto" if code == 0 else STRATEGIES[code - 1] if 0 < code <= len(STRATEGIES) else "?"


def _root_name(g: Group, code: int) -> str:
    return "none" if code < 0 else f"{code} (global {g.ranks[code]})" if code < g.size else f"#{code}"


def _disagreement(g: Group, op: str, what: str, values: dict[int, object],
                  fmt: Callable[[object], str] = str) -> str | None:
    """Message naming the ranks off the majority value (all ranks on a tie), or None."""
    by_value: dict[object, list[int]] = {}
    for r, v in values.items():
        by_value.setdefault(v, []).append(r)
    if len(by_value) <= 1:
        return None
    counts = Counter({v: len(rs) for v, rs in by_value.items()})
    (top, n_top), *rest = counts.most_common()
    tie = bool(rest) and rest[0][1] == n_top
    offending = sorted(values) if tie else sorted(r for r, v in values.items() if v != top)
    parts = "; ".join(f"{fmt(v)} on ranks {g.fmt_ranks(rs)}"
                      for v, rs in sorted(by_value.items(), key=lambda kv: min(kv[1])))
    return f"{op}: {what} differs across ranks ({parts}); offending ranks {g.fmt_ranks(offending)}"


def validate(g: Group, op: str, records: list[list[int]], *, data_ranks: Sequence[int] | None = None,
             compare_length: bool = False, aux: Sequence[tuple[int, str, Callable]] = ()) -> None:
    """Raise the same ValueError on every rank if the records disagree or report a problem.

    ``data_ranks``: the ranks whose records describe data (default all).  ``compare_length``:
    the length along ``dim`` must agree too.  ``aux``: extra (field, description, formatter)
    that must agree among data ranks."""
    everyone = dict(enumerate(records))
    # Ranks in different ops must word this the same: no op name in front.
    msg = (_disagreement(g, "varlen", "record header (not all ranks are in a varlen op)",
                         {r: rec[F_MAGIC] for r, rec in everyone.items()}, hex)
           or _disagreement(g, "varlen", "the operation", {r: rec[F_OP] for r, rec in everyone.items()},
                            lambda c: OPS[c - 1] if 0 < c <= len(OPS) else f"op#{c}")
           or _disagreement(g, op, "src/dst", {r: rec[F_ROOT] for r, rec in everyone.items()},
                            lambda c: _root_name(g, c))
           or _status_message(g, op, records)
           or _disagreement(g, op, "strategy", {r: rec[F_STRAT] for r, rec in everyone.items()},
                            _strategy_name))
    if msg:
        raise ValueError(msg)
    data = {r: records[r] for r in (range(g.size) if data_ranks is None else data_ranks)}
    checks: list[tuple[str, Callable[[list[int]], object], Callable]] = [
        ("device type", lambda rec: rec[F_DEV], _device_name),
        ("dtype", lambda rec: rec[F_DTYPE], _dtype_name),
        ("number of dims", lambda rec: rec[F_NDIM], str),
        ("dim", lambda rec: rec[F_DIM], str),
        ("shape" if compare_length else "shape apart from `dim`",
         (lambda rec: tuple(shape_of(rec))) if compare_length else trailing,
         lambda s: f"({', '.join(map(str, s))}{',' if len(s) == 1 else ''})"),
    ]
    checks += [(what, (lambda rec, f=field: rec[f]), fmt) for field, what, fmt in aux]
    for what, get, fmt in checks:
        msg = _disagreement(g, op, what, {r: get(rec) for r, rec in data.items()}, fmt)
        if msg:
            raise ValueError(msg)


def _status_message(g: Group, op: str, records: list[list[int]]) -> str | None:
    bad: dict[int, list[int]] = {}
    for r, rec in enumerate(records):
        if rec[F_STATUS] != OK:
            bad.setdefault(rec[F_STATUS], []).append(r)
    if not bad:
        return None
    members = ", ".join(map(str, g.ranks[:16])) + (", ..." if len(g.ranks) > 16 else "")
    parts = [f"ranks {g.fmt_ranks(rs)} passed "
             + STATUS_TEXT.get(code, f"status {code}").format(maxd=MAX_NDIM)
             # (a group's index given for a global rank is the usual slip, and said nowhere: helper-169)
             + (f" (src/dst is a global rank: the group's are {members})" if code == BAD_ROOT else "")
             for code, rs in sorted(bad.items())]
    return f"{op}: " + "; ".join(parts)


def numel(shape: Sequence[int]) -> int:
    return math.prod(shape)


_RAW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def raw(t: torch.Tensor) -> torch.Tensor:
    """``t`` reinterpreted as a plain integer dtype of the same width (any strides).

    Moving data as such keeps every dtype bit-exact and lets copy/cat/repeat work for dtypes
    whose own kernels are missing (float8, bits*, sub-byte ints).  16-byte dtypes (complex128)
    have full kernel coverage and stay as they are.  A conjugate or negative-bit view (``z.conj()``,
    ``z.conj().imag``) is materialized first: its bits are not its values, and ``view`` refuses it.
    Detached: the results have no autograd history, and a tensor that requires grad copied into
    a view of a result raised on its rank alone (complex128, which keeps its dtype: its peers
    then waited in their receive until the group's timeout; helper-106)."""
    t = t.detach()
    if t.is_conj() or t.is_neg():
        t = t.resolve_conj().resolve_neg()
    to = _RAW.get(t.element_size())
    return t if to is None or t.dtype == to else t.view(to)


def raw_dtype(dtype: torch.dtype) -> torch.dtype:
    return _RAW.get(dtype.itemsize, dtype)


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """Flat uint8 view of a contiguous tensor (same memory, so it can be received into).

    A one-element tensor counts as contiguous whatever its stride, and ``reshape(-1)`` keeps
    that stride, which ``view(uint8)`` rejects: re-stride it explicitly."""
    flat = t.reshape(-1)
    if flat.numel() <= 1 and flat.stride(0) != 1:
        flat = flat.as_strided((flat.numel(),), (1,))
    return flat.view(torch.uint8)
