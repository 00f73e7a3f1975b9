"""Bandwidth and per-instance timing with the nccl-tests definitions (doc/PERFORMANCE.md).

algbw = S / t.  busbw = algbw x factor, with n the size of the op's *group* (not the
world): all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n with S the
total size; broadcast, reduce, send, recv (and anything else) 1.

Per collective instance (one (group, seq) across its members):
true latency = last completion - last begin; wait of a rank = last begin - its begin.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from commscope.analysis.collectives import complete_rows, gather_many, seq_of_row
from commscope.analysis.indexes import GroupIndex
from commscope.analysis.model import Sig, TraceModel, untimed

_ALL_REDUCE = ("all_reduce", "all_reduce_coalesced", "allreduce", "allreduce_coalesced")
_ALL_GATHER = ("all_gather", "all_gather_into_tensor", "all_gather_single", "all_gather_coalesced", "all_gather_v",
               "_allgather_base",
               "allgather", "all_gather_base", "allgather_into_tensor_coalesced")
_REDUCE_SCATTER = ("reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single", "reduce_scatter_v",
                   "_reduce_scatter_base",
                   "reduce_scatter_tensor_coalesced")
_ALL_TO_ALL = ("all_to_all", "all_to_all_single", "all_to_all_v", "alltoall", "alltoall_base")
_NO_DATA = ("barrier", "monitored_barrier")


def busbw_factor(op: str, n: int) -> float:
    if n <= 0:
        return 1.0
    if op in _ALL_REDUCE:
        return 2 * (n - 1) / n
    if op in _ALL_GATHER or op in _REDUCE_SCATTER or op in _ALL_TO_ALL:
        return (n - 1) / n
    return 1.0


def size_bytes(op: str, in_bytes: int, out_bytes: int) -> int:
    """S of nccl-tests: the tensor size (all_reduce, broadcast, ...), the total size
    (all_gather: the gathered output; reduce_scatter: the full input; all_to_all: all data)."""
    if op in _NO_DATA:
        return 0
    if op in _ALL_GATHER:
        return out_bytes or in_bytes
    if op in _REDUCE_SCATTER or op in _ALL_TO_ALL:
        return max(in_bytes, out_bytes)
    return max(in_bytes, out_bytes)


def algbw(nbytes: float, seconds: float) -> float:
    """Bytes per second (NaN when t is 0 or unknown)."""
    return nbytes / seconds if seconds > 0 else float("nan")


def busbw(op: str, nbytes: float, seconds: float, n: int) -> float:
    return algbw(nbytes, seconds) * busbw_factor(op, n)


def sig_size(sig: Sig) -> int:
    return size_bytes(sig.op, sig.in_bytes, sig.out_bytes)


@dataclasses.dataclass
class Instances:
    """Complete instances of one group's collectives, as arrays over instances."""

    group: GroupIndex
    seqs: np.ndarray  # seq per instance
    begin: np.ndarray  # [instances x members]
    comp: np.ndarray
    sig: np.ndarray  # sig code of each member's op
    latency: np.ndarray  # ns, last completion - last begin
    skew: np.ndarray  # ns, last begin - first begin
    waits: np.ndarray  # [instances x members] ns, last begin - own begin
    untimed: np.ndarray  # [instances x members] bool: completed without a measured duration

    @property
    def n(self) -> int:
        return int(self.seqs.shape[0])


def instances(model: TraceModel, gi: GroupIndex, last: int | None = None) -> Instances:
    rows = complete_rows(model, gi)
    if last is not None:
        rows = rows[-last:]
    b, c, s, f = gather_many(model, gi, ("begin", "comp", "sig", "flags"), rows)
    u = untimed(f, b, c)
    if rows.shape[0]:
        lastb = b.max(axis=1)
        lat = np.maximum(c.max(axis=1) - lastb, 0)
        skew = lastb - b.min(axis=1)
        waits = lastb[:, None] - b
    else:
        lat = skew = np.zeros(0, np.int64)
        waits = np.zeros((0, b.shape[1]), np.int64)
    seqs = np.array([seq_of_row(gi, int(r)) for r in rows.tolist()], np.int64)
    return Instances(gi, seqs, b, c, s, lat, skew, waits, u)


def op_busbw(model: TraceModel, rank: int, i: int,
             instances: dict[tuple, tuple[int, int | None]] | None = None) -> dict[str, float] | None:
    """algbw/busbw (bytes/s) of one op, from its collective instance's true latency (or its own
    duration for p2p and ops not matched on every member).  ``instances``: a cache of each
    instance's (members, latency) for a caller that asks of every op (an export): an
    instance's members are walked once, not once per member (16k ranks: 16k times)."""
    rt = model.ranks[rank]
    s = model.sigs[int(rt.sig[i])]
    S = sig_size(s)
    if not S or not rt.comp[i] or untimed(rt.flags[i], rt.begin[i], rt.comp[i]):
        return None
    t = int(rt.comp[i] - rt.begin[i])
    n = 2
    if s.flags & 8:  # COLL
        seq = int(rt.seq[i])
        key = (s.space, s.group, seq)
        if instances is not None and seq >= 0 and _own_row(model, rank, i, s, seq):
            got = instances.get(key)
            if got is None:
                got = instances[key] = _instance_latency(model, rank, i, s)
        else:
            got = _instance_latency(model, rank, i, s)
        n, latency = got
        if latency is None:
            return None
        t = latency or t
    if t <= 0:
        return None
    return {"algbw": algbw(S, t / 1e9), "busbw": busbw(s.op, S, t / 1e9, n), "bytes": S, "group_size": n}


def _own_row(model: TraceModel, rank: int, i: int, s: Sig, seq: int) -> bool:
    """The op is its rank's row of instance #seq (a rank that stated one seq twice, a hostile
    trace, has an op that is not: it asks for itself, not for the instance)."""
    gi = model.coll.get((s.space, s.group))
    c = gi.col.get(rank) if gi is not None else None
    row = gi.seqs.get(seq) if gi is not None and c is not None else None
    return row is not None and int(row[c]) == i


def _instance_latency(model: TraceModel, rank: int, i: int, s: Sig) -> tuple[int, int | None]:
    """A collective op's instance: (members, its true latency: last completion - last begin);
    latency None where a member's times are not real, 0 where not every member completed it
    (the op's own duration stands)."""
    peers = model.matching(rank, i)
    if not peers:
        return len(model.groups.get(s.group, [])) or 1, 0
    gi = model.coll.get((s.space, s.group))
    n = len(gi.members) if gi else len(peers) + 1
    members = {rank: i, **peers}
    if any(untimed(model.ranks[r].flags[j], model.ranks[r].begin[j], model.ranks[r].comp[j])
           for r, j in members.items()):
        return n, None
    if len(members) == n and all(model.ranks[r].comp[j] for r, j in members.items()):
        lastb = max(int(model.ranks[r].begin[j]) for r, j in members.items())
        return n, max(int(model.ranks[r].comp[j]) for r, j in members.items()) - lastb
    return n, 0
