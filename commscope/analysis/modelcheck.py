"""DistributedDataParallel's check that every rank holds the same model, said as the mismatch it is.

DDP's constructor checks its ranks' parameters (``_verify_params_across_processes``, in
C++) two ways.  Their count: every rank gathers every rank's (an all_gather), and each
raises where another's differs: "DDP expects same model across all ranks, but Rank 1 has 2
params, while rank 0 has inconsistent 3 params" (its own count first).  Their sizes and
strides: the group's rank 0 broadcasts its own, and each rank compares its own with them:
one that differs raises "[1]: params[0] in this process with sizes [4, 8] appears not to
match sizes (or strides) of the same param in process 0."; rank 0 itself never raises.  A
text says only that its rank and another differ: where every other member raised, each
saying the same of its own model, rank 0 is the odd one.  It read "ranks 1, 2 crashed
together", rank 0, the one whose model was wrong, named nowhere (helper-191).

The models vote as a collective's calls do (``collectives._mismatch``): each rank that
raised for what it said of its own model; each member that did not raise, and went on past
the check (a later op begun), for rank 0's.  A member not seen past it yet (its exit not
read, or an exit that says nothing of the check: a launcher's SIGTERM) has a vote not
known: while those could make it a tie or turn it, nobody is named (a live poll named the
ranks that had raised first, helper-200).  The odd ones out are named by majority, every
member on a tie.  The finding is a ``collective_mismatch`` at the op the check made, its
raising ranks ``died_in_it``: their crashes, and what the others then failed in, are its
consequences (``rootcause``, rule 1).
"""

from __future__ import annotations

import re
from collections import Counter

from commscope.analysis import rankstate
from commscope.analysis.collectives import Mismatch
from commscope.analysis.errors import first_line, own_words
from commscope.analysis.findings import Finding, op_brief, ranks_text
from commscope.analysis.model import TraceModel

#: What a rank whose parameters differ from another's raises (torch 2.4-2.13, ``reducer.cpp``),
#: and what it says of its own model: the claim the ranks vote with
_SHAPES = re.compile(r"\bparams\[(\d+)\] in this process with sizes (\[[^\]]*\]) appears not to match "
                     r"(sizes|strides) of the same param in process 0")
_COUNT = re.compile(r"\bDDP expects same model across all ranks, but Rank \d+ has (\d+) params, while rank \d+ has "
                    r"inconsistent \d+ params")

#: The vote of a member that did not raise and went on past the check
ZERO = "rank 0's model"


def claim(text: str) -> str | None:
    """What a crash's exception says of its rank's model where it is DDP's check failing
    ("params[0] sizes [4, 8]", "params[0] strides (sizes [4, 8])", "2 params"); None for any
    other exception."""
    words = own_words(text)
    m = _SHAPES.search(words)
    if m:
        return f"params[{m.group(1)}] sizes {m.group(2)}" if m.group(3) == "sizes" else \
            f"params[{m.group(1)}] strides (sizes {m.group(2)})"
    m = _COUNT.search(words)
    return f"{m.group(1)} params" if m else None


def find_model_mismatches(model: TraceModel) -> list[Finding]:
    """One ``collective_mismatch`` per op of DDP's check (its broadcast of rank 0's sizes, its
    all_gather of the counts) that ranks crashed after, saying their models differ (module
    docstring)."""
    if not model.exits_seen:
        return []
    checks: dict[tuple[int, str, int], dict[int, tuple[str, str]]] = {}  # instance -> rank -> claim, text
    at: dict[tuple[int, str, int], tuple[int, int]] = {}  # instance -> a rank's op there (rank, index)
    for r in model.rank_ids():
        ex = rankstate.crash(model, r)
        said = claim(str(ex.get("exc") or "")) if ex is not None else None
        if said is None:
            continue
        i = model.last_op(r)
        key = rankstate.collective_of(model, r, i) if i is not None else None
        if key is None:
            continue
        assert ex is not None
        checks.setdefault(key, {})[r] = (said, first_line(str(ex.get("exc")), 200))
        at.setdefault(key, (r, i))
    out = []
    for key, raised in checks.items():
        r, i = at[key]
        members = model.members(r, i)
        if len(members) < 2:
            continue
        inst = model.collective(key[1], key[2], key[0])
        votes: dict[int, str] = {}
        unknown: list[int] = []
        for m in members:
            if m in raised:
                votes[m] = raised[m][0]
            elif m in inst and model.last_op(m, completed=False) != inst[m]:
                votes[m] = ZERO  # (went on past the check: its model passed)
            else:
                unknown.append(m)
        top = Counter(votes.values()).most_common()
        margin = top[0][1] - (top[1][1] if len(top) > 1 else 0)
        undecided = len(unknown) >= margin and bool(unknown)
        tie = not undecided and len(top) > 1 and top[0][1] == top[1][1]
        culprits = [] if undecided else sorted(members) if tie else \
            sorted(m for m in members if votes.get(m) != top[0][0])
        raisers = sorted(raised)
        by_claim: dict[str, list[int]] = {}
        for m, v in votes.items():
            by_claim.setdefault(v, []).append(m)
        said = "; ".join(f"{ranks_text(sorted(rs))} passed it" if v == ZERO else
                         f"{ranks_text(sorted(rs))} raised, {'its' if len(rs) == 1 else 'their'} {v}"
                         for v, rs in sorted(by_claim.items(), key=lambda kv: min(kv[1])))
        verdict = (f"; {ranks_text(unknown)} not seen past it yet, whose models could turn it: nobody named yet"
                   if undecided else "; tie, so every rank is named" if tie else
                   f"; {ranks_text(culprits)} differ{'s' if len(culprits) == 1 else ''} from the majority")
        op = model.sig_of(r, i).op
        site = op_brief(model, r, i).get("site")
        msg = (f"the ranks' models differ at DistributedDataParallel's check of them ({op} #{key[2]} of group "
               f"{key[1]}{f', at {site}' if site else ''}): {said}{verdict}")
        per_rank = {str(m): {"op": op, "state": f"crashed: {raised[m][1]}" if m in raised else
                             "passed the check" if votes.get(m) == ZERO else "not seen past the check"}
                    for m in members}
        ev = Mismatch(per_rank=per_rank, differs=["model"], majority=None if tie or undecided else
                      {"model": top[0][0]}, absent_ranks=[], later_mismatches=0, died_in_it=raisers)
        if undecided:
            ev.undecided = {"died_in_it": [], "not_yet": unknown}
        # (when the check's op was entered, as a collective's mismatch is dated: where rank 0
        # went on to from there explains none of it, ``rootcause``)
        ts = max(int(model.ranks[m].begin[model.last_op(m)]) for m in raisers)  # type: ignore[index]
        out.append(Finding("collective_mismatch", key[1], key[2], op, list(members), culprits, msg, ev, ts=ts))
    return out
