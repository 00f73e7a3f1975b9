"""DistributedDataParallel's check that every rank holds the same model, said as the mismatch it is.

DDP's constructor broadcasts its group's rank 0's parameter sizes, and each rank compares
its own with them (``_verify_params_across_processes``, in C++).  A rank whose model differs
raises "[1]: params[0] in this process with sizes [4, 8] appears not to match sizes of the
same param in process 0." (or "... but Rank 1 has 2 params, while rank 0 has inconsistent 3
params."); rank 0 itself never raises.  Each text says only that its rank and rank 0 differ:
where every other member raised, each saying the same of its own model, rank 0 is the odd
one.  It read "ranks 1, 2 crashed together", rank 0, the one whose model was wrong, named
nowhere (helper-191).

The models vote as a collective's calls do (``collectives._mismatch``): the ranks that raised
saying the same of their models one vote each for theirs, rank 0 and the members that did
not raise one each for rank 0's; the odd ones out are named by majority, every member on a
tie.  The finding is a ``collective_mismatch`` at the broadcast the check made, its raising
ranks ``died_in_it``: their crashes, and what the others then failed in, are its
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

#: What a rank whose parameters differ from its group's rank 0's raises (torch 2.4-2.13,
#: ``reducer.cpp``), and what it says of its own model: the claim the ranks vote with
_CLAIMS = (
    re.compile(r"\bparams\[(\d+)\] in this process with (sizes|strides) (\[[^\]]*\]) appears not to match \2 of the "
               r"same param in process 0"),
    re.compile(r"\bDDP expects same model across all ranks, but Rank \d+ has (\d+) params, while rank 0 has "
               r"inconsistent \d+ params"),
)


def claim(text: str) -> str | None:
    """What a crash's exception says of its rank's model where it is DDP's check failing
    ("params[0] sizes [4, 8]", "2 params"); None for any other exception."""
    words = own_words(text)
    m = _CLAIMS[0].search(words)
    if m:
        return f"params[{m.group(1)}] {m.group(2)} {m.group(3)}"
    m = _CLAIMS[1].search(words)
    return f"{m.group(1)} params" if m else None


def find_model_mismatches(model: TraceModel) -> list[Finding]:
    """One ``collective_mismatch`` per broadcast of DDP's check that ranks crashed after,
    saying their models differ from their group's rank 0's (module docstring)."""
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
        zero = members[0]  # (its group's rank 0: "process 0")
        votes = {m: raised[m][0] if m in raised else "rank 0's" for m in members}
        top = Counter(votes.values()).most_common()
        tie = len(top) > 1 and top[0][1] == top[1][1]
        culprits = sorted(members) if tie else sorted(m for m in members if votes[m] != top[0][0])
        raisers = sorted(raised)
        alike = len({raised[m][0] for m in raisers}) == 1
        said = (f"{ranks_text(raisers)} raised that {'its' if len(raisers) == 1 else 'their'} model differs from rank "
                f"{zero}'s" + (f" ({raised[raisers[0]][0]})" if alike else ""))
        verdict = ("; tie, so every rank is named" if tie else
                   f"; rank {zero}'s model differs from the majority's" if culprits == [zero] else
                   f"; {ranks_text(culprits)} differ{'s' if len(culprits) == 1 else ''} from the majority")
        op = model.sig_of(r, i).op
        site = op_brief(model, r, i).get("site")
        msg = (f"the ranks' models differ at DistributedDataParallel's check of them ({op} #{key[2]} of group "
               f"{key[1]}{f', at {site}' if site else ''}): {said}{verdict}")
        per_rank = {str(m): {"op": op, "state": f"crashed: {raised[m][1]}" if m in raised else "passed the check"}
                    for m in members}
        ev = Mismatch(per_rank=per_rank, differs=["model"], majority=None if tie else {"model": top[0][0]},
                      absent_ranks=[], later_mismatches=0, died_in_it=raisers)
        # (when the check's broadcast was entered, as a collective's mismatch is dated: where
        # rank 0 went on to from there explains none of it, ``rootcause``)
        ts = max(int(model.ranks[m].begin[model.last_op(m)]) for m in raisers)  # type: ignore[index]
        out.append(Finding("collective_mismatch", key[1], key[2], op, list(members), culprits, msg, ev, ts=ts))
    return out
