"""What each wrapped function means: its tensors, group, peer, root and reduce op.

Every extractor mirrors the signature of the function it describes, so Python's own
argument binding does the parsing (the cheapest way on the hot path).  It returns an
plain tuple in ``OpArgs`` field order (a NamedTuple's Python-level ``__new__`` would
cost a third of the budget); ``peer``/``root`` are global ranks, or ``("g", r)`` for a group rank
that the recorder resolves with the group's rank list.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from commscope import optable
from commscope.redact import redact

SUM: Any = None  # an omitted reduce op means SUM; the recorder writes "sum"


class OpArgs(NamedTuple):
    """The field order of the plain tuples extractors return (documentation and slow paths)."""

    group: Any
    peer: Any
    dir: str | None
    root: Any
    redop: Any
    async_op: bool
    ins: tuple | list
    outs: tuple | list


_E: tuple = ()


def _rank(glob, grp):
    return glob if glob is not None else (None if grp is None else ("g", grp))


def all_reduce(tensor, op=SUM, group=None, async_op=False):
    ts = (tensor,)
    return (group, None, None, None, op, async_op, ts, ts)


def all_reduce_coalesced(tensors, op=SUM, group=None, async_op=False):
    ts = (tensors,) if not isinstance(tensors, list | tuple) else tensors
    return (group, None, None, None, op, async_op, ts, ts)


def reduce(tensor, dst=None, op=SUM, group=None, async_op=False, group_dst=None, **_):
    ts = (tensor,)
    return (group, None, None, _rank(dst, group_dst), op, async_op, ts, ts)


def broadcast(tensor, src=None, group=None, async_op=False, group_src=None, **_):
    ts = (tensor,)
    return (group, None, None, _rank(src, group_src), None, async_op, ts, ts)


def all_gather(tensor_list, tensor, group=None, async_op=False):
    return (group, None, None, None, None, async_op, (tensor,), tensor_list)


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False):
    return (group, None, None, None, None, async_op, (input_tensor,), (output_tensor,))


def all_gather_single(output_tensor, input_tensor, group=None, async_op=False):
    return (group, None, None, None, None, async_op, (input_tensor,), (output_tensor,))


def reduce_scatter_single(output, input, op=SUM, group=None, async_op=False):
    return (group, None, None, None, op, async_op, (input,), (output,))


def all_gather_coalesced(output_tensor_lists, input_tensor_list, group=None, async_op=False):
    outs = [t for lst in output_tensor_lists for t in lst]
    return (group, None, None, None, None, async_op, input_tensor_list, outs)


def gather(tensor, gather_list=None, dst=None, group=None, async_op=False, group_dst=None, **_):
    return (group, None, None, _rank(dst, group_dst), None, async_op, (tensor,), gather_list or _E)


def scatter(tensor, scatter_list=None, src=None, group=None, async_op=False, group_src=None, **_):
    return (group, None, None, _rank(src, group_src), None, async_op, scatter_list or _E, (tensor,))


def reduce_scatter(output, input_list, op=SUM, group=None, async_op=False):
    return (group, None, None, None, op, async_op, input_list, (output,))


def reduce_scatter_tensor(output, input, op=SUM, group=None, async_op=False):
    return (group, None, None, None, op, async_op, (input,), (output,))


def all_to_all(output_tensor_list, input_tensor_list, group=None, async_op=False):
    return (group, None, None, None, None, async_op, input_tensor_list, output_tensor_list)


def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None, group=None,
                      async_op=False):
    return (group, None, None, None, None, async_op, (input,), (output,))


def barrier(group=None, async_op=False, device_ids=None, timeout=None, **_):
    return (group, None, None, None, None, async_op, _E, _E)


def monitored_barrier(group=None, timeout=None, wait_all_ranks=False):
    return (group, None, None, None, None, False, _E, _E)


def send(tensor, dst=None, group=None, tag=0, group_dst=None, **_):
    return (group, _rank(dst, group_dst), "send", None, None, False, (tensor,), _E)


def recv(tensor, src=None, group=None, tag=0, group_src=None, **_):
    return (group, _rank(src, group_src), "recv", None, None, False, _E, (tensor,))


def isend(tensor, dst=None, group=None, tag=0, group_dst=None, **_):
    return (group, _rank(dst, group_dst), "send", None, None, True, (tensor,), _E)


def irecv(tensor, src=None, group=None, tag=0, group_src=None, **_):
    return (group, _rank(src, group_src), "recv", None, None, True, _E, (tensor,))


def all_gather_object(object_list, obj, group=None):
    return (group, None, None, None, None, False, _E, _E)


def gather_object(obj, object_gather_list=None, dst=None, group=None, group_dst=None, **_):
    return (group, None, None, _rank(dst, group_dst), None, False, _E, _E)


def broadcast_object_list(object_list, src=None, group=None, device=None, group_src=None, **_):
    return (group, None, None, _rank(src, group_src), None, False, _E, _E)


def scatter_object_list(scatter_object_output_list, scatter_object_input_list=None, src=None, group=None,
                        group_src=None, **_):
    return (group, None, None, _rank(src, group_src), None, False, _E, _E)


def send_object_list(object_list, dst=None, group=None, device=None, group_dst=None, use_batch=False, **_):
    return (group, _rank(dst, group_dst), "send", None, None, False, _E, _E)


def recv_object_list(object_list, src=None, group=None, device=None, group_src=None, use_batch=False, **_):
    return (group, _rank(src, group_src), "recv", None, None, False, _E, _E)


#: torch.distributed functions recorded as one logical op each.
TORCH_OPS = {
    f.__name__: f for f in (
        all_reduce, all_reduce_coalesced, reduce, broadcast, all_gather, all_gather_into_tensor,
        all_gather_single, all_gather_coalesced, gather, scatter, reduce_scatter, reduce_scatter_tensor,
        reduce_scatter_single, all_to_all,
        all_to_all_single, barrier, monitored_barrier, send, recv, isend, irecv,
        all_gather_object, gather_object, broadcast_object_list, scatter_object_list,
        send_object_list, recv_object_list,
    )
}


# --- commscope.varlen: one logical op each; their inner collectives are nested ---------

def _as_list(x):
    if x is None:
        return _E
    return x if isinstance(x, list | tuple) else (x,)


def all_gather_v(tensor, *, dim=0, sizes=None, cat=False, group=None, async_op=False, **_):
    return (group, None, None, None, None, async_op, (tensor,), _E)


def gather_v(tensor, dst=0, *, dim=0, sizes=None, cat=False, group=None, **_):
    return (group, None, None, dst, None, False, (tensor,), _E)


def scatter_v(chunks_or_tensor=None, src=0, *, split_sizes=None, dim=0, group=None, **_):
    return (group, None, None, src, None, False, _as_list(chunks_or_tensor), _E)


def all_to_all_v(tensors_per_dst, *, dim=0, group=None, **_):
    return (group, None, None, None, None, False, _as_list(tensors_per_dst), _E)


def reduce_scatter_v(tensor, split_sizes=None, op=SUM, *, dim=0, group=None, **_):
    return (group, None, None, None, op, False, (tensor,), _E)


def broadcast_v(tensor_or_none=None, src=0, *, group=None, **_):
    return (group, None, None, src, None, False, _as_list(tensor_or_none), _E)


def send_tensors(tensors, dst, *, group=None, **_):
    return (group, dst, "send", None, None, False, _as_list(tensors), _E)


def recv_tensors(src, *, group=None, **_):
    return (group, src, "recv", None, None, False, _E, _E)


def isend_tensors(tensors, dst, *, group=None, **_):
    return (group, dst, "send", None, None, True, _as_list(tensors), _E)


def irecv_tensors(src, *, group=None, **_):
    return (group, src, "recv", None, None, True, _E, _E)


VARLEN_OPS = {
    f.__name__: f for f in (
        all_gather_v, gather_v, scatter_v, all_to_all_v, reduce_scatter_v, broadcast_v,
        send_tensors, recv_tensors, isend_tensors, irecv_tensors,
    )
}


# --- describing a begin's static fields (both recorder paths write these) ---------------

#: Ops whose reduce op defaults to SUM: their begin says "sum" when none was passed.
REDUCING = optable.REDUCING
_DTYPE_NAMES: dict[Any, str] = {}


def redop_name(op: Any) -> str:
    name = getattr(op, "name", None) or str(op)
    return name.rsplit(".", 1)[-1].lower()


def dtype_name(dt: Any) -> str:
    name = _DTYPE_NAMES.get(dt)
    if name is None:
        name = _DTYPE_NAMES[dt] = str(dt).replace("torch.", "")
    return name


def describe_pairs(desc: tuple) -> tuple:
    """Tensor descriptions: the hot path writes one tensor as a flat (shape, dtype) to save
    an allocation, several as ((shape, dtype), ...)."""
    return (desc,) if type(desc[1]) is not tuple else desc


def begin_fields(name: str, group: str, peer: Any, direction: str | None, root: Any, redop: Any,
                 idesc: tuple | None, ib: int | None, odesc: tuple | None, ob: int | None, async_op: bool,
                 site: str | None, nested: bool, device: int | None) -> dict[str, Any]:
    """The fields of a begin event that repeat from call to call (see commscope/events.py)."""
    ev: dict[str, Any] = {"op": name, "group": group}
    if peer is not None:
        ev["peer"] = peer
    if direction is not None:
        ev["dir"] = direction
    if root is not None:
        ev["root"] = root
    if redop is not None:
        ev["redop"] = redop_name(redop)
    elif name in REDUCING:
        ev["redop"] = "sum"
    if idesc is not None:
        pairs = describe_pairs(idesc)
        ev["in_shapes"] = [list(s) for s, _ in pairs]
        ev["in_dtypes"] = [dtype_name(d) for _, d in pairs]
        ev["in_bytes"] = ib
    if odesc is not None:
        pairs = describe_pairs(odesc)
        ev["out_shapes"] = [list(s) for s, _ in pairs]
        ev["out_dtypes"] = [dtype_name(d) for _, d in pairs]
        ev["out_bytes"] = ob
    if async_op:
        ev["async"] = True
    if site is not None:
        ev["site"] = site
    if nested:
        ev["nested"] = True
    if device is not None:
        ev["device"] = f"cuda:{device}"  # completion comes from a later ``done``
    return ev


def fmt_exc(exc: BaseException) -> str:
    """``Type: message`` of an exception, redacted: its message may quote a credential;
    then, on a last line, what it was raised from where it says (``raise ... from``, or
    raised while handling another): torch's pipelining said only "RuntimeError: [Stage 1]
    failed to run forward", the stage's own error in its cause (helper-186)."""
    said = _said(exc)
    cause = exc.__cause__ if exc.__cause__ is not None else None if exc.__suppress_context__ else exc.__context__
    return said + (f"\n(raised from {_said(cause)})" if cause is not None else "")  # (``errors.RAISED_FROM``)


def _said(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:  # a broken __str__ must not break the op that raised
        text = ""
    return redact(f"{type(exc).__name__}: {text}") if text else type(exc).__name__
