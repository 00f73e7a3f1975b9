"""PyTorch Flight Recorder entries, read: the one translator of an entry's fields.

Both the live merge (``record/flight.py``, entries of this very process) and the dump
import (``analysis/flight_import.py``, untrusted files of every rank) turn Flight Recorder
entries into commscope ops.  What an entry *means* is decided here, once:

- ``profiling_name`` ('nccl:all_reduce', 'nccl:send 0->1', 'nccl:recv 3<-0') -> backend,
  op, direction and the peer, which the name gives as a rank *of the group*;
- ``group_peer`` maps that group rank to a global rank through the group's ranks;
- ``input_sizes``/``output_sizes`` and c10 dtype names -> shapes, torch dtype names and
  bytes (``commscope.dtypes`` holds the dtype table);
- ``process_group``, ``thread_id``, completion (``time_discovered_completed_ns``,
  ``retired``/``state``) read defensively: a dump holds anything.

Torch-free, so the recorder (``record``) and the readers (``analysis``) can both use it.
Modelled on PyTorch's ``torch/distributed/flight_recorder/components/types.py``, where
one class owns the parsing of an entry.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from commscope import dtypes, optable
from commscope.schema import MAX_INT

BACKENDS = ("nccl:", "gloo:", "ucc:", "mpi:", "xccl:")
_SENDS, _RECVS = optable.SENDS, optable.RECVS
_PAIR = re.compile(r"(\d{1,8})(->|<-)(\d{1,8})")


def parse_name(profiling_name: str) -> tuple[str, str, str | None, int | None]:
    """'nccl:send 0->1' -> ('nccl', 'send', 'send', 1); 'nccl:recv 3<-0' -> ('nccl', 'recv', 'recv', 0).

    (backend, op, direction, peer): direction is 'send', 'recv' or None (a collective);
    peer is the other side as a rank of the group (``group_peer`` maps it to a global
    rank), None when the name does not say.  'a->b' sends from a to b; 'a<-b' is b to a.
    """
    name = profiling_name or "unknown"
    backend = ""
    for prefix in BACKENDS:
        if name.startswith(prefix):
            backend, name = prefix[:-1], name[len(prefix):]
            break
    parts = name.split()
    op = parts[0] if parts else "unknown"
    direction = "send" if op in _SENDS else "recv" if op in _RECVS else None
    peer = None
    if direction and len(parts) > 1:
        m = _PAIR.match(parts[1])
        if m:
            a, arrow, b = int(m.group(1)), m.group(2), int(m.group(3))
            src, dst = (a, b) if arrow == "->" else (b, a)
            peer = dst if direction == "send" else src
    return backend, op, direction, peer


def group_peer(ranks: Sequence[int] | None, peer: int | None) -> int | None:
    """A group rank as a global rank: ``ranks[peer]`` where the group's ranks are known,
    else ``peer`` unchanged (the default group, where both are the same)."""
    if peer is not None and ranks and 0 <= peer < len(ranks):
        return ranks[peer]
    return peer


def as_int(v: Any, lo: int = 0, hi: int = MAX_INT) -> int | None:
    """``v`` if it is an int (not a bool) in [lo, hi], else None: dumps hold anything."""
    return v if type(v) is int and lo <= v <= hi else None


def group_of(entry: dict) -> tuple[str, str | None]:
    """(group name, description or None) of an entry's ``process_group`` ([name, desc]).
    Raises TypeError/KeyError/IndexError when it is no sequence (a hostile dump)."""
    pg = entry.get("process_group") or ("?",)
    return str(pg[0]), (str(pg[1]) if len(pg) > 1 else None)


def thread_id(entry: dict) -> int | None:
    """The entry's ``thread_id`` (a decimal string in dumps) as an int, or None."""
    tid = entry.get("thread_id")
    if isinstance(tid, str) and tid.isdigit() and len(tid) <= 18:
        tid = int(tid)
    return as_int(tid)


def dtype_names(names: Sequence[Any]) -> list[str]:
    """c10 dtype names ('Float', 'Float8_e4m3fn') as torch names ('float32', 'float8_e4m3fn')."""
    return [dtypes.torch_name(str(x)) for x in names]


def nbytes(shapes: Sequence[Any], dtype_list: Sequence[Any]) -> int:
    """Bytes of the tensors; MAX_INT + 1 (which the schema rejects) when a size is no size."""
    total = 0
    for shape, dt in zip(shapes, dtype_list, strict=False):
        n = 1
        for d in shape if isinstance(shape, list | tuple) else (None,):
            d = as_int(d)
            if d is None:
                return MAX_INT + 1
            n *= d
            if n > MAX_INT:
                return MAX_INT + 1
        total += n * dtypes.itemsize(str(dt))
        if total > MAX_INT:
            return MAX_INT + 1
    return total


def tensor_fields(entry: dict) -> dict[str, Any]:
    """in/out shapes, dtypes (torch names) and bytes of an entry, as op begin fields."""
    ins, outs = list(entry.get("input_sizes") or []), list(entry.get("output_sizes") or [])
    idt, odt = list(entry.get("input_dtypes") or []), list(entry.get("output_dtypes") or [])
    return {"in_shapes": [list(s) for s in ins], "in_dtypes": dtype_names(idt), "in_bytes": nbytes(ins, idt),
            "out_shapes": [list(s) for s in outs], "out_dtypes": dtype_names(odt), "out_bytes": nbytes(outs, odt)}


def finished(entry: dict) -> bool:
    """Whether the entry's work has completed (or been retired from the ring's active set)."""
    return bool(entry.get("retired")) or entry.get("state") == "completed"


def completed_ns(entry: dict) -> int:
    """When the watchdog saw the work complete; 0 when unknown (Gloo, or not yet)."""
    return as_int(entry.get("time_discovered_completed_ns")) or 0


class FrOp:
    """What one entry says about its op: name, group, direction, peer as a global rank.

    ``ranks_of`` gives a group's global ranks by group name (None where unknown: the peer
    is then left as the group rank the name gives).
    """

    __slots__ = ("backend", "op", "group", "desc", "direction", "peer", "is_p2p")

    def __init__(self, entry: dict, ranks_of: Callable[[str], Sequence[int] | None] | None = None) -> None:
        self.group, self.desc = group_of(entry)
        self.backend, self.op, self.direction, gpeer = parse_name(str(entry.get("profiling_name") or ""))
        self.peer = group_peer(ranks_of(self.group) if ranks_of and gpeer is not None else None, gpeer)
        self.is_p2p = bool(entry.get("is_p2p")) or self.direction is not None
