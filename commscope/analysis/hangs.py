"""Waits drawn into a hang: a rank that a hung wait waits on, itself blocked a moment less
than hang_after in a send, a recv or a collective whose other end is absent, is part of it.

Ranks that began waiting a few milliseconds apart pass hang_after a few milliseconds apart.
For those milliseconds the first wait named a rank that was blocked itself (a victim: in a
send to an idle rank) where, a moment later, it named the rank the chain ends at: the
console flashed a victim.  So a hung wait's absent ranks (a collective's missing members,
a send's or recv's peer) that are blocked in a wait with an absent other end are judged
hung too, and so on down the chain, where that wait began in the first half of the hung
one (from its start to now).  A rank late by itself that now waits a moment (a pipeline's
routine send, posted long after the others began to wait for it) is still the one late.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

from commscope.analysis import rankstate
from commscope.analysis.findings import Finding
from commscope.analysis.model import COLL, P2P, TraceModel
from commscope.analysis.p2p import waits_for

#: The findings whose culprits a hung wait waits on (a no_such_peer unmatched_p2p blames
#: its own rank, which waits on nobody that exists).
WAITED_ON = ("missing_ranks", "unmatched_p2p", "p2p_deadlock")


def drawn_in(model: TraceModel, now: int, hang_ns: int, found: Iterable[Finding]) -> dict[int, frozenset[int]]:
    """rank -> the ops it is blocked in that the hangs of ``found`` draw in (none judged
    hung already).  Each rank is reached from the earliest wait that names it; a rank
    already waiting past hang_after is its findings' own, and not walked through."""
    heap = [(f.ts, c) for f in found if f.kind in WAITED_ON and "no_such_peer" not in f.evidence
            for c in f.culprits]
    if not heap:
        return {}
    heapq.heapify(heap)
    blocked = rankstate.blocked_ranks(model)
    seen: set[int] = set()
    out: dict[int, set[int]] = {}
    while heap:
        since, r = heapq.heappop(heap)
        if r in seen:
            continue
        seen.add(r)
        ops = blocked.get(r)
        if not ops:
            continue
        until = rankstate.waited_until(model, r, now)
        for i in ops:
            begun = rankstate.blocked_since(model, r, i)
            if until - begun >= hang_ns or begun > (since + now) // 2:
                continue  # (judged already; or began late in the hang: late by itself)
            if rankstate.left_early(model, r, now):
                break  # (a rank that is gone no longer waits; asked last: 16k ranks judged already)
            on = _waits_on(model, r, i)
            if on:
                out.setdefault(r, set()).add(i)
                for p in on:
                    if p not in seen:
                        heapq.heappush(heap, (begun, p))
    return {r: frozenset(ops) for r, ops in out.items()}


def _waits_on(model: TraceModel, r: int, i: int) -> list[int]:
    """The ranks rank ``r``'s op ``i`` waits for: a send's or recv's peer that has not
    posted its side, a collective's members that have not entered it."""
    s = model.sig_of(r, i)
    seq = int(model.ranks[r].seq[i])
    if s.nested:
        return []
    if s.flags & P2P:
        return waits_for(model, r, i)
    if s.flags & COLL and seq >= 0:
        gi = model.coll.get((s.space, s.group))
        if gi is None:
            return []
        entered = gi.at(seq)
        return [m for m in gi.members if m not in entered and m != r]
    return []
