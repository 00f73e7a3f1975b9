"""The one table of communication ops: what every layer needs to know about an op's name.

Torch-free leaf of the formats layer.  The recorder (default reduce op, p2p direction),
the readers (the native recorder's c10d names, Flight Recorder's names), the analysis
(which tensors must agree across ranks, which carry no comparable dtype) and the console
(varlen ops' colour) all derive their sets from ``OPS``; a name used anywhere has one row
here (``tests/test_optable.py`` checks every registered op).

Adding an op: its extractor in ``record/ops.py`` (how to read its arguments), and its row
here.  docs/architecture.md walks through an example.
"""

from __future__ import annotations

import dataclasses

COLLECTIVE, P2P, OBJECT = "collective", "p2p", "object"


@dataclasses.dataclass(frozen=True, slots=True)
class Op:
    """What an op name means, whoever recorded it."""

    kind: str = COLLECTIVE  # COLLECTIVE, P2P (between exactly two ranks) or OBJECT (pickled objects)
    direction: str | None = None  # "send" / "recv" for p2p ops
    reducing: bool = False  # its reduce op is "sum" when none is recorded
    same_shape: tuple[str, ...] = ()  # sides ("in", "out") whose shapes must agree across the group
    dtype_free: bool = False  # its tensors carry no dtype comparable across ranks
    varlen: bool = False  # a commscope.varlen op (its inner collectives are nested)
    exchange: bool = False  # what its ranks send in all, they receive in all (bytes in = bytes out over the group)
    alias: bool = False  # a name only other tools use (Flight Recorder, c10d internals)


_SEND, _RECV = Op(kind=P2P, direction="send"), Op(kind=P2P, direction="recv")

#: Every op name, with its traits.
OPS: dict[str, Op] = {
    # torch.distributed collectives
    "all_reduce": Op(reducing=True, same_shape=("in",)),
    "all_reduce_coalesced": Op(reducing=True, same_shape=("in",)),
    "reduce": Op(reducing=True, same_shape=("in",)),
    "broadcast": Op(same_shape=("in",)),
    "all_gather": Op(same_shape=("in",)),
    "all_gather_into_tensor": Op(same_shape=("in", "out")),
    "all_gather_single": Op(same_shape=("in", "out")),
    "all_gather_coalesced": Op(same_shape=("in",)),
    "gather": Op(same_shape=("in",)),
    "scatter": Op(same_shape=("out",)),
    "reduce_scatter": Op(reducing=True, same_shape=("out",)),
    "reduce_scatter_tensor": Op(reducing=True, same_shape=("in", "out")),
    "reduce_scatter_single": Op(reducing=True, same_shape=("in", "out")),
    "all_to_all": Op(exchange=True),
    "all_to_all_single": Op(exchange=True),
    "barrier": Op(dtype_free=True),
    "monitored_barrier": Op(dtype_free=True),
    # collectives only c10d issues by these names (coalesced variants)
    "all_gather_into_tensor_coalesced": Op(),
    "reduce_scatter_tensor_coalesced": Op(reducing=True),
    # torch.distributed point-to-point
    "send": _SEND, "isend": _SEND, "recv": _RECV, "irecv": _RECV,
    "batch_isend_irecv": Op(kind=P2P),  # a container: its isend/irecv children say the direction
    # object ops
    "all_gather_object": Op(kind=OBJECT, dtype_free=True),
    "gather_object": Op(kind=OBJECT, dtype_free=True),
    # (every rank passes a list of as many objects: the root its objects, the others places for them)
    "broadcast_object_list": Op(kind=OBJECT, dtype_free=True, same_shape=("in",)),
    "scatter_object_list": Op(kind=OBJECT, dtype_free=True),
    "send_object_list": Op(kind=OBJECT, direction="send"),
    "recv_object_list": Op(kind=OBJECT, direction="recv"),
    # commscope.varlen
    "all_gather_v": Op(varlen=True, dtype_free=True),
    "gather_v": Op(varlen=True, dtype_free=True),
    "scatter_v": Op(varlen=True, dtype_free=True),
    "all_to_all_v": Op(varlen=True, dtype_free=True),
    "reduce_scatter_v": Op(varlen=True, dtype_free=True, reducing=True),
    "broadcast_v": Op(varlen=True, dtype_free=True),
    "send_tensors": Op(kind=P2P, direction="send", varlen=True),
    "recv_tensors": Op(kind=P2P, direction="recv", varlen=True),
    "isend_tensors": Op(kind=P2P, direction="send", varlen=True),
    "irecv_tensors": Op(kind=P2P, direction="recv", varlen=True),
    # other tools' names for the same ops
    "allreduce": Op(same_shape=("in",), alias=True),
    "_allgather_base": Op(same_shape=("in", "out"), alias=True),
    "_reduce_scatter_base": Op(same_shape=("in", "out"), alias=True),
    "recv_anysource": Op(kind=P2P, direction="recv", alias=True),
}

@dataclasses.dataclass(frozen=True, slots=True)
class C10dOp:
    """A c10d operator the native recorder observes (in opcode order, ``C10D``)."""

    operator: str  # its name in the c10d dispatcher namespace
    name: str  # the torch.distributed function that issues it (the op's name when nothing wraps it)
    direction: int = 0  # DIR_NONE, DIR_SEND, DIR_RECV or DIR_RECV_ANY: where its peer and tensors are
    describe: bool = True  # its tensors are the op's data (a barrier's is a dummy)


#: Directions as the native recorder takes them (``record/native/layout.h``'s ``Dir``).
DIR_NONE, DIR_SEND, DIR_RECV, DIR_RECV_ANY = 0, 1, 2, 3

#: The c10d operators the native recorder observes; a row's index is its opcode.
C10D: tuple[C10dOp, ...] = (
    C10dOp("allreduce_", "all_reduce"), C10dOp("allgather_", "all_gather"),
    C10dOp("_allgather_base_", "all_gather_into_tensor"), C10dOp("reduce_scatter_", "reduce_scatter"),
    C10dOp("_reduce_scatter_base_", "reduce_scatter_tensor"), C10dOp("broadcast_", "broadcast"),
    C10dOp("reduce_", "reduce"), C10dOp("gather_", "gather"), C10dOp("scatter_", "scatter"),
    C10dOp("alltoall_", "all_to_all"), C10dOp("alltoall_base_", "all_to_all_single"),
    C10dOp("barrier", "barrier", describe=False), C10dOp("monitored_barrier_", "monitored_barrier", describe=False),
    C10dOp("send", "send", DIR_SEND), C10dOp("recv_", "recv", DIR_RECV),
    C10dOp("recv_any_source_", "recv", DIR_RECV_ANY), C10dOp("allgather_coalesced_", "all_gather_coalesced"),
    C10dOp("allgather_into_tensor_coalesced_", "all_gather_into_tensor_coalesced"),
    C10dOp("allreduce_coalesced_", "all_reduce_coalesced"),
    C10dOp("reduce_scatter_tensor_coalesced_", "reduce_scatter_tensor_coalesced"),
)

#: Ops whose reduce op is "sum" when none is recorded.
REDUCING = frozenset(n for n, o in OPS.items() if o.reducing)

#: The name of an op whose stream could not say it (a block decoded without its meta's op names:
#: the meta line lost or torn): compared with no rank's, said as a loss
UNNAMED = "?"
#: Ops whose per-rank tensors must agree in shape across the group: name -> sides compared.
SAME_SHAPE = {n: o.same_shape for n, o in OPS.items() if o.same_shape}
#: Ops whose tensors carry no comparable dtype: object ops, barriers, and varlen ops, whose
#: non-root ranks may pass no tensor at all and which check dtypes across ranks themselves.
DTYPE_FREE = frozenset(n for n, o in OPS.items() if o.dtype_free)
#: Ops that move data between exactly two ranks (``batch_isend_irecv`` is a container of them).
P2P_OPS = frozenset(n for n, o in OPS.items() if o.direction is not None and not o.alias)
#: Ops whose ranks' split sizes must agree: every byte one rank sends, another receives.
EXCHANGES = frozenset(n for n, o in OPS.items() if o.exchange)
#: commscope.varlen's ops.
VARLEN = frozenset(n for n, o in OPS.items() if o.varlen)
#: Names of plain tensor sends and receives, as torch and Flight Recorder write them.
SENDS = frozenset(n for n, o in OPS.items() if o.kind == P2P and o.direction == "send" and not o.varlen)
RECVS = frozenset(n for n, o in OPS.items() if o.kind == P2P and o.direction == "recv" and not o.varlen)
