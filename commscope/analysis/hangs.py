"""Waits drawn into a hang: a rank that a hung wait waits on, itself blocked a moment less
than hang_after in a send, a recv or a collective whose other end is absent, is part of it.

Ranks that began waiting a few milliseconds apart pass hang_after a few milliseconds apart.
For those milliseconds the first wait named a rank that was blocked itself (a victim: in a
send to an idle rank) where, a moment later, it named the rank the chain ends at: the
console flashed a victim.  So a hung wait's absent ranks (a collective's missing members,
a send's or recv's peer) that are blocked in a wait with an absent other end are judged
hung too, and so on down the chain, where that wait began in the first half of the hung
one (from its start to when the rank stopped waiting: now, in a job still running).  A
rank late by itself that now waits a moment (a pipeline's routine send, posted long after
the others began to wait for it) is still the one late.
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
    hung already).  A rank is walked from every wait that reaches it whose start is later
    than those it was walked from (a later start is a later midpoint: a wait drawn in from
    one path is drawn in; helper-97), so at most once per such start; a rank already
    waiting past hang_after is its findings' own, and not walked through.  The midpoint is
    taken between the start and when the rank stopped waiting (``waited_until``: a job
    stopped is judged as it stopped, however late ``now``)."""
    best: dict[int, int] = {}  # rank -> the latest start of a wait that reached it
    for f in found:
        if f.kind in WAITED_ON and "no_such_peer" not in f.evidence:
            for c in f.culprits:
                if f.ts > best.get(c, -1):
                    best[c] = f.ts
    if not best:
        return {}
    heap = [(-since, r) for r, since in best.items()]  # (latest first: fewer walks again)
    heapq.heapify(heap)
    blocked = rankstate.blocked_ranks(model)
    walked: dict[int, int] = {}  # rank -> the start it was walked from
    pushed: dict[tuple[int, str, int], int] = {}  # a collective -> the latest start its absent ranks got
    absent: dict[tuple[int, str, int], list[int]] = {}  # a collective -> its absent members (once: 16k of them)
    out: dict[int, set[int]] = {}
    while heap:
        since, r = heapq.heappop(heap)
        since = -since
        if walked.get(r, -1) >= since or best[r] > since:
            continue  # (walked from a later start already, or about to be)
        walked[r] = since
        ops = blocked.get(r)
        if not ops:
            continue
        until = rankstate.waited_until(model, r, now)
        for i in ops:
            begun = rankstate.blocked_since(model, r, i)
            if until - begun >= hang_ns or begun > (since + until) // 2:
                continue  # (judged already; or began late in the hang: late by itself)
            if rankstate.left_early(model, r, now):
                break  # (a rank that is gone no longer waits; asked last: 16k ranks judged already)
            key = _collective(model, r, i)
            if key is not None:
                if pushed.get(key, -1) >= begun:
                    if absent[key]:
                        out.setdefault(r, set()).add(i)
                    continue  # (its absent members got a start as late already)
                pushed[key] = begun
                if key not in absent:
                    absent[key] = _absent(model, key, r)
                on = absent[key]
            else:
                on = _p2p_waits(model, r, i)
            if on:
                out.setdefault(r, set()).add(i)
                for p in on:
                    if begun > best.get(p, -1):
                        best[p] = begun
                        heapq.heappush(heap, (-begun, p))
    return {r: frozenset(ops) for r, ops in out.items()}


def _collective(model: TraceModel, r: int, i: int) -> tuple[int, str, int] | None:
    """(space, group, seq) of rank ``r``'s op ``i`` where it is a collective."""
    s = model.sig_of(r, i)
    seq = int(model.ranks[r].seq[i])
    if s.nested or not s.flags & COLL or seq < 0 or (s.space, s.group) not in model.coll:
        return None
    return s.space, s.group, seq


def _absent(model: TraceModel, key: tuple[int, str, int], r: int) -> list[int]:
    """The members of a collective that have not entered it."""
    gi = model.coll[(key[0], key[1])]
    entered = gi.at(key[2])
    return [m for m in gi.members if m not in entered and m != r]


def _p2p_waits(model: TraceModel, r: int, i: int) -> list[int]:
    """The ranks a send or recv waits for (``p2p.waits_for``); none for another op."""
    s = model.sig_of(r, i)
    return waits_for(model, r, i) if s.flags & P2P and not s.nested else []
