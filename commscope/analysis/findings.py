"""Findings (the output of diagnose) and the evidence helpers every detector shares."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from commscope.analysis import stacks
from commscope.analysis.evidence import Evidence, RawEvidence
from commscope.analysis.model import SPACE_FR, TraceModel
from commscope.analysis.ranks import ranges
from commscope.analysis.rankstate import crash, exited, is_blocked_in, killed, snapshot, waited_until
from commscope.analysis.vocab import describe_kill

ERROR, WARNING = "error", "warning"

#: kind -> severity: the `check --json` contract (docs/analysis.md, README exit codes).
KINDS: dict[str, str] = {
    "missing_ranks": ERROR,
    "collective_mismatch": ERROR,
    "p2p_deadlock": ERROR,
    "unmatched_p2p": ERROR,
    "dead_rank": ERROR,
    "rank_crashed": ERROR,
    "op_failed": ERROR,
    "straggler": WARNING,
    "unwaited_work": WARNING,
    "trace_incomplete": WARNING,
}
_ORDER = {k: i for i, k in enumerate(KINDS)}
#: The kinds whose culprit left the job (a crash, a death): the others' ops are consequences
DEPARTED = ("rank_crashed", "dead_rank")


@dataclasses.dataclass
class Finding:
    kind: str
    group: str | None
    seq: int | None
    op: str | None
    ranks: list[int]
    culprits: list[int]
    message: str
    #: The kind's typed evidence record (``analysis.evidence``); a plain dict is taken as ``RawEvidence``.
    evidence: Evidence
    severity: str = ""
    ts: int = 0  # when the problem became visible (for timelines); not part of the JSON contract
    #: Ranks this finding shows waiting or failing because of others: victim -> the ranks it
    #: waits on (empty: not known yet).  Drives the root-cause merge; not part of the JSON.
    victims: dict[int, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    #: Cross-rank instances (``failures.instance_key``) this finding is about or caused by.
    instances: tuple = ()
    #: When each of ranks that went together went (``rootcause._fold``; empty: each culprit
    #: at ``ts``).  Not part of the JSON.
    gone: dict[int, int] = dataclasses.field(default_factory=dict)
    #: Victims whose wait ends when any one of the ranks they wait on comes, not all of them
    #: (an any-source recv; ``rootcause._either``).  Not part of the JSON.
    any_of: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        if not self.severity:
            self.severity = KINDS[self.kind]
        if not isinstance(self.evidence, Evidence):
            self.evidence = RawEvidence(self.evidence)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "severity": self.severity, "group": self.group, "seq": self.seq,
                "op": self.op, "ranks": sorted(self.ranks), "culprits": sorted(self.culprits),
                "message": self.message, "evidence": self.evidence.to_json()}

    def sort_key(self) -> tuple:
        return (self.severity != ERROR, _ORDER.get(self.kind, 99), self.ts)

    @property
    def place(self) -> str:
        """Where it happened, as a title says it: "group 0 #17 all_reduce"; a rank that left
        while in no op names the last op it did, "after group 0 #4 all_reduce" (its title
        named an op that had completed well); one that left before any op says so."""
        where = " ".join(x for x in (f"group {self.group}" if self.group is not None else "",
                                     f"#{self.seq}" if self.seq is not None else "", self.op or "") if x)
        if where and self.kind in DEPARTED and not (self.evidence.get("activity") or {}).get("in_op"):
            return f"after {where}"
        if not where and self.kind in DEPARTED:  # (its title said nothing there: helper-176)
            return "before any op"
        return where


#: Ranks named one by one in a sentence; more are counted and given as ranges
LISTED_RANKS = 8


def ranks_text(ranks: Any) -> str:
    """'rank 3' / 'ranks 0, 2' / '4,095 ranks (0-2048,2050-4095)': ranks named in a sentence,
    sorted; thousands of them are a count and ranges, not a list that fills the screen."""
    rs = sorted(ranks)
    if len(rs) > LISTED_RANKS:
        return f"{len(rs):,} ranks ({ranges(rs, limit=6)})"
    return ("rank " if len(rs) == 1 else "ranks ") + ", ".join(map(str, rs))


def culprits_text(culprits: Any, sep: str = " ") -> str:
    """'culprit 3' / 'culprits 0, 2' (``sep`` after the word) / '8,192 culprits (0-8191)': a
    line, however many."""
    rs = sorted(culprits)
    if len(rs) > LISTED_RANKS:
        return f"{len(rs):,} culprits ({ranges(rs, limit=4)})"
    return f"culprit{'s' if len(rs) > 1 else ''}{sep}{', '.join(map(str, rs))}"


def rank_list(ranks: Any) -> str:
    """'rank(s) 0, 2' (as many messages word it) / '4,095 ranks (0-2048,2050-4095)'."""
    rs = sorted(ranks)
    return ranks_text(rs) if len(rs) > LISTED_RANKS else "rank(s) " + ", ".join(map(str, rs))


def doing_instead(ranks: list[int], activities: dict[str, dict[str, Any]]) -> str:
    """What ``ranks`` do instead (their ``activity``, by rank as a string), in words: ranks
    doing the same said once ("ranks 1, 2, 3 are idle (...)"), at
    most ``LISTED_RANKS`` such sayings and then how many ranks more (the evidence has each
    rank's).  A sentence a rank made a group of 5,000 absent members 8,000 lines of
    ``check``, one toast, one message (``missing_ranks``; ``unmatched_p2p``'s peers of an
    any-source recv likewise)."""
    same: dict[str, list[int]] = {}
    for m in ranks:
        same.setdefault(activities[str(m)]["text"], []).append(m)
    said = [f"rank {rs[0]} {_verb(text, 1)} {text}" if len(rs) == 1 else f"{rank_list(rs)} {_verb(text, 2)} {text}"
            for text, rs in same.items()]
    if len(said) > LISTED_RANKS:
        more = sum(len(rs) for rs in list(same.values())[LISTED_RANKS:])
        said = [*said[:LISTED_RANKS], f"and {more:,} rank(s) more, each in the evidence"]
    return "; ".join(said)


#: The states said as something a rank did, not something it is ("rank 1 has exited (...)")
_DONE_STATES = ("exited", "crashed", "left its process group")


def _verb(text: str, n: int) -> str:
    """'is'/'are' before a state ("is idle", "are waiting in ..."), 'has'/'have' before one it
    reached ("has exited", "have crashed"); a rank that recorded nothing "has" nothing."""
    if text.startswith(_DONE_STATES):
        return "has" if n == 1 else "have"
    if text.startswith("no events"):
        return "has" if n == 1 else "have"
    return "is" if n == 1 else "are"


def no_such_peer_text(peer: int, world: int | None) -> str:
    """How a peer the job does not have is said (``peer`` -1: a group rank out of range,
    ``TraceModel.unplaced``)."""
    if peer < 0:
        return "its peer is no rank of its group (a group rank out of range)"
    return f"the job has no rank {peer}" + (f" (world size {world})" if world is not None else "")


def secs(ns: int | float) -> float:
    return round(float(ns) / 1e9, 3)


def _gone(model: TraceModel, rank: int) -> str | None:
    """How a rank left while blocked in an op, as the op's state says it ("crashed", "killed",
    "exited"; None: it did not): the backend that aborted a rank in a mismatched
    collective left it "waiting" in the table beside the words that said it died."""
    if crash(model, rank) is not None:
        return "crashed"
    if killed(model, rank) is not None:
        return "killed"
    return "exited" if exited(model, rank) is not None else None


#: The tensors an op's evidence quotes (shapes, dtypes; ``op_brief``): one op of 3 million
#: tensors (a 12 MB line) made a finding of 30 MB (its message and table quoted every shape)
BRIEF_TENSORS = 64


def op_brief(model: TraceModel, rank: int, i: int, now: int | None = None) -> dict[str, Any]:
    """The evidence view of one op: what, where, when, state."""
    rt = model.ranks[rank]
    s = model.sigs[int(rt.sig[i])]
    d: dict[str, Any] = {"rank": rank, "op": s.op, "group": s.group, "id": int(rt.id[i])}
    if rt.seq[i] >= 0:
        d["seq"] = int(rt.seq[i])
    if rt.peer[i] >= 0:
        d["peer"] = int(rt.peer[i])
    if s.dir:
        d["dir"] = s.dir
    if s.space == SPACE_FR:
        d["src"] = "fr"
    d["site"] = s.site
    for key, got in (("in_shapes", s.in_shapes), ("in_dtypes", s.in_dtypes), ("out_shapes", s.out_shapes),
                     ("out_dtypes", s.out_dtypes)):
        d[key] = [list(x) if key.endswith("shapes") else x for x in got[:BRIEF_TENSORS]]
        if len(got) > BRIEF_TENSORS:  # (the rest counted, not quoted)
            d[key + "_total"] = len(got)
    if s.redop:
        d["redop"] = s.redop
    if s.root is not None:
        d["root"] = s.root
    d["begin_ns"] = int(rt.begin[i])
    if rt.comp[i]:
        d["state"] = "failed" if i in rt.exc else "completed"
        d["duration_s"] = secs(rt.comp[i] - rt.begin[i])
    else:
        d["state"] = (_gone(model, rank) or "waiting") if is_blocked_in(model, rank, i) else "issued"
        if now is not None:  # (until it left, where it did: as its wait is judged)
            d["for_s"] = secs(waited_until(model, rank, now) - int(rt.begin[i]))
    if i in rt.exc:
        d["exc"] = rt.exc[i]
    return d


def _op_stack(model: TraceModel, rank: int, i: int | None) -> dict | None:
    rt = model.ranks.get(rank)
    if rt is None or i is None:
        return None
    st = rt.stacks.get(int(rt.id[i]))
    if st is None and rt.parent[i] >= 0:
        st = rt.stacks.get(int(rt.id[rt.parent[i]]))
    return st


#: A rank that has not answered a stack request this long after it was made cannot run Python.
ANSWER_GRACE_NS = 3_000_000_000


def rank_stack(model: TraceModel, rank: int, now: int,
               during: tuple[int, int] | None = None) -> tuple[list[dict] | None, dict[str, Any]]:
    """The rank's most telling captured stack at ``now``, folded, and a note on where it came from.

    Newest first: a capture taken after the rank's last op began or finished (a stack
    request, a crash) shows where it is *now*; else the capture of the op it is blocked
    in.  ``during`` (t0, t1) asks for where it was in that window instead (a failure:
    where the culprit was when the others gave up), when a capture falls in it.  Without
    one the note says why: it exited, it is gone, or it did not answer a stack request
    (its Python threads cannot run: native code holding the GIL).
    """
    return _shown(model, rank, *_stack_choice(model, rank, now, during), now)


def _shown(model: TraceModel, rank: int, chosen: dict | None, missing: str,
           now: int) -> tuple[list[dict] | None, dict[str, Any]]:
    """What ``rank_stack`` gives for its choice (``_stack_choice``): the capture's folded
    threads, a copy of the rank's own, and its note; or None and why none."""
    if chosen is None:
        return None, {"missing": missing}
    return stacks.view(chosen, model.ranks[rank].stacks_folded), _capture_note(chosen, now)


def _stack_choice(model: TraceModel, rank: int, now: int,
                  during: tuple[int, int] | None) -> tuple[dict | None, str]:
    """``rank_stack``'s choice: the capture it shows, or None and why none (its note's
    ``missing``), before anything is folded or copied."""
    rt = model.ranks.get(rank)
    if rt is None:
        return None, "no events from this rank"
    st = snapshot(model, now).state(rank)
    latest = rt.last_stack
    fresh = latest is not None and latest["ts"] >= max(rt.last_op_ts, rt.last_comp)
    chosen = latest if fresh else _op_stack(model, rank, st.op) if st.kind == "blocked" else None
    if during is not None:
        inside = [c for c in rt.captures if during[0] <= c["ts"] <= during[1]]
        if inside:
            chosen = max(inside, key=lambda c: c["ts"])
    if chosen is None and latest is not None and st.kind in ("dead", "crashed"):
        chosen = latest  # its last words, even if older than its last op
    if chosen is not None:
        return chosen, ""
    if st.kind == "exited":
        return None, "exited"
    if st.kind == "dead" and (k := killed(model, rank)) is not None:  # (how it went is known: said so, not
        return None, f"{describe_kill(k)}; no stack was captured before"  # "silent", helper-176)
    if st.kind == "dead":
        return None, ("silent: the process is gone, or cannot run Python (stuck in native code holding the GIL); "
                      "no stack was captured before it went silent")
    req = model.request_ns
    if req and now - req > ANSWER_GRACE_NS and (latest is None or latest["ts"] < req):
        return None, (f"did not answer the stack request made {secs(now - req):.1f} s ago: none of its Python "
                      "threads could run (stuck in native code holding the GIL?)")
    return None, "no stack captured yet (every rank captures one when an op passes hang_after or fails)"


def _capture_note(chosen: dict, now: int) -> dict[str, Any]:
    """A shown capture's note: when it was taken, how long ago, why, at whose request."""
    info: dict[str, Any] = {"captured_ns": int(chosen["ts"]), "age_s": secs(now - int(chosen["ts"])),
                            "reason": chosen.get("reason", "hang")}
    if chosen.get("trigger") is not None:
        info["requested_by"] = chosen.get("trigger")
    return info


#: The CPU (% of a core, the median of a rank's latest samples since its last op) from which
#: a rank outside any op is said to be computing, not idle: a rank spinning in Python was
#: "idle" while its samples said 70% (helper-191); one waiting on a lock or I/O reads a few
#: per cent
BUSY_CPU_PERCENT = 60.0

#: The samples ``busy_cpu`` judges by: the latest, what the rank does now (a rank that
#: computed for 30 s and then stuck on a lock read "computing" by all of them, helper-199)
BUSY_SAMPLES = 3


def busy_cpu(model: TraceModel, rank: int, since: int, now: int) -> float | None:
    """The median CPU of the rank's latest ``BUSY_SAMPLES`` samples taken between ``since``
    and ``now`` where it is ``BUSY_CPU_PERCENT`` or more; None otherwise, or where no sample
    was taken then."""
    rt = model.ranks[rank]
    if not rt.samples.n:
        return None
    a = rt.samples.arrays()
    ts, cpu = a["ts"], a["cpu"]
    lo, hi = np.searchsorted(ts, [since, now], side="right")  # (a rank's samples in time order)
    cpu = cpu[max(int(lo), int(hi) - BUSY_SAMPLES):int(hi)]
    cpu = cpu[~np.isnan(cpu)]
    if not cpu.shape[0]:
        return None
    median = float(np.median(cpu))
    return median if median >= BUSY_CPU_PERCENT else None


def activity(model: TraceModel, rank: int, now: int) -> dict[str, Any]:
    """What a rank is doing instead: its state, current or last op, stack."""
    snap = snapshot(model, now)[rank]
    st = snap.state
    d: dict[str, Any] = {"rank": rank, "state": st.kind, "text": st.text}
    rt = model.ranks.get(rank)
    if rt is None:
        d["state"] = "unknown"
        d["text"] = "no events recorded"
        return d
    if st.kind == "idle" and st.text.startswith("idle (") and (cpu := busy_cpu(model, rank, st.since_ns, now)):
        # (its figure in the evidence alone: ranks doing the same are said once, ``doing_instead``)
        d["text"] = f"computing, not communicating (busy on CPU; {st.text[len('idle ('):]}"
        d["cpu"] = round(cpu)
    if st.kind in ("blocked", "dead") and st.op is not None:
        d["in_op"] = op_brief(model, rank, st.op, now)
    last = snap.last_done
    if last is not None:
        d["last_completed_op"] = op_brief(model, rank, last, now)
    if st.kind in ("exited", "crashed"):
        ex = snap.exit or {}
        d["exit"] = {k: ex[k] for k in ("reason", "exc", "signal", "ts") if k in ex}
    if st.kind == "dead":
        d["last_seen_ns"] = model.last_seen(rank)
    if st.kind != "exited":
        threads, info = rank_stack(model, rank, now)
        if threads:
            d["stack"] = threads
            d["stack_info"] = info
    return d


def attach_stacks(model: TraceModel, f: Finding, now: int, limit: int = 8) -> None:
    """Give an error finding the culprits' and the waiting ranks' stacks: ``stacks`` (rank ->
    folded threads, culprits first) and ``stack_info`` (rank -> role, capture time or why none).

    Culprits are shown one by one (at most ``limit``).  Waiting ranks are folded: each
    distinct stack (or reason for none) once, under the first rank that has it, its note
    saying how many ranks share it (``count``) and which (``ranks``, as ranges): 16k ranks
    waiting in one all_reduce are one stack and a count.  At most ``limit`` distinct ones;
    the ranks past them are counted in ``stacks_more``."""
    culprits = list(dict.fromkeys(f.culprits))[:limit]
    named = set(f.culprits)
    waiting = [v for v in dict.fromkeys(f.victims) if v not in named]
    out: dict[str, Any] = {}
    info: dict[str, Any] = {}
    during = None
    if f.kind == "op_failed":  # where everyone was when the op failed, if captured then
        begins = [int(x["begin_ns"]) for x in (f.evidence.get("failed") or {}).values() if "begin_ns" in x]
        during = (min(begins, default=f.ts), f.ts + ANSWER_GRACE_NS)
    for r in culprits:
        threads, note = rank_stack(model, r, now, during)
        info[str(r)] = {"role": "culprit", **note}
        if threads:
            out[str(r)] = threads
    shared: dict[tuple, list[int]] = {}  # what a waiting rank shows -> the ranks showing it
    # (the folded threads a capture shows are shared by equal threads, ``stacks.folded``: so
    # their text to compare by is made once per distinct set of them, held here so that no
    # id is reused meanwhile; 16k ranks waiting in one collective made it 16k times)
    texts: dict[tuple[int, ...], tuple[list[dict], bytes | str]] = {}
    none = stacks.same_key(None)
    more = 0
    for r in waiting:
        chosen, missing = _stack_choice(model, r, now, during)
        if chosen is None:
            key: tuple = (None, missing, none)
        else:
            folded = stacks.folded(chosen, model.ranks[r].stacks_folded)
            got = texts.get(ids := tuple(map(id, folded)))
            if got is None:
                got = texts[ids] = (folded, stacks.same_key(folded))
            key = (chosen.get("reason", "hang"), None, got[1])
        if key in shared:
            shared[key].append(r)
        elif len(shared) < limit:
            shared[key] = [r]
            threads, note = _shown(model, r, chosen, missing, now)
            info[str(r)] = {"role": "waiting", **note}
            if threads:
                out[str(r)] = threads
        else:
            more += 1
    for ranks in shared.values():
        if len(ranks) > 1:
            info[str(ranks[0])].update(count=len(ranks), ranks=ranges(sorted(ranks)))  # (64 runs at most)
    f.evidence["stacks"] = out
    f.evidence["stack_info"] = info
    if more:
        f.evidence["stacks_more"] = more
    culprit_where = [stacks.one_line(out.get(str(c))) for c in f.culprits]
    if len(f.culprits) == 1 and culprit_where[0]:
        f.evidence["culprit_where"] = culprit_where[0]
