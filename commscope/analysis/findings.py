"""Findings (the output of diagnose) and the evidence helpers every detector shares."""

from __future__ import annotations

import dataclasses
from typing import Any

from commscope.analysis.model import ASYNC, SPACE_FR, TraceModel

ERROR, WARNING = "error", "warning"

#: kind -> severity, as fixed by DESIGN.md.
KINDS: dict[str, str] = {
    "missing_ranks": ERROR,
    "collective_mismatch": ERROR,
    "p2p_deadlock": ERROR,
    "unmatched_p2p": ERROR,
    "dead_rank": ERROR,
    "straggler": WARNING,
    "unwaited_work": WARNING,
    "trace_incomplete": WARNING,
}
_ORDER = {k: i for i, k in enumerate(KINDS)}


@dataclasses.dataclass
class Finding:
    kind: str
    group: str | None
    seq: int | None
    op: str | None
    ranks: list[int]
    culprits: list[int]
    message: str
    evidence: dict[str, Any]
    severity: str = ""
    ts: int = 0  # when the problem became visible (for timelines); not part of the JSON contract

    def __post_init__(self) -> None:
        if not self.severity:
            self.severity = KINDS[self.kind]

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "severity": self.severity, "group": self.group, "seq": self.seq,
                "op": self.op, "ranks": sorted(self.ranks), "culprits": sorted(self.culprits),
                "message": self.message, "evidence": self.evidence}

    def sort_key(self) -> tuple:
        return (self.severity != ERROR, _ORDER.get(self.kind, 99), self.ts)


def secs(ns: int | float) -> float:
    return round(float(ns) / 1e9, 3)


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
    d["in_shapes"] = [list(x) for x in s.in_shapes]
    d["in_dtypes"] = list(s.in_dtypes)
    d["out_shapes"] = [list(x) for x in s.out_shapes]
    d["out_dtypes"] = list(s.out_dtypes)
    if s.redop:
        d["redop"] = s.redop
    if s.root is not None:
        d["root"] = s.root
    d["begin_ns"] = int(rt.begin[i])
    if rt.comp[i]:
        d["state"] = "failed" if i in rt.exc else "completed"
        d["duration_s"] = secs(rt.comp[i] - rt.begin[i])
    else:
        waiting = bool(model.sig_flags(rt.sig[i:i + 1])[0] & ASYNC) and rt.wb[i] and not rt.we[i]
        d["state"] = "waiting" if waiting or not (s.flags & ASYNC) else "issued"
        if now is not None:
            d["for_s"] = secs(now - int(rt.begin[i]))
    if i in rt.exc:
        d["exc"] = rt.exc[i]
    return d


def stack_of(model: TraceModel, rank: int, i: int | None) -> list | None:
    """The stack the rank captured for op ``i`` (or its latest capture), compacted."""
    rt = model.ranks.get(rank)
    if rt is None:
        return None
    st = rt.stacks.get(int(rt.id[i])) if i is not None else None
    if st is None and i is not None and rt.parent[i] >= 0:
        st = rt.stacks.get(int(rt.id[rt.parent[i]]))
    if st is None:
        return None
    threads = st.get("threads") or []
    main = [t for t in threads if t.get("op_thread")] or threads[:1]
    return [{"thread": t.get("name"), "frames": [f"{f[0]}:{f[1]} in {f[2]}" for f in (t.get("frames") or [])
                                                  if isinstance(f, list | tuple) and len(f) >= 3]} for t in main]


def activity(model: TraceModel, rank: int, now: int) -> dict[str, Any]:
    """What a rank is doing instead: its state, current or last op, stack."""
    st = model.state(rank, now)
    d: dict[str, Any] = {"rank": rank, "state": st.kind, "text": st.text}
    rt = model.ranks.get(rank)
    if rt is None:
        d["state"] = "unknown"
        d["text"] = "no events recorded for this rank"
        return d
    if st.kind in ("blocked", "dead") and st.op is not None:
        d["in_op"] = op_brief(model, rank, st.op, now)
        stack = stack_of(model, rank, st.op)
        if stack:
            d["stack"] = stack
    last = model.last_op(rank)
    if last is not None:
        d["last_completed_op"] = op_brief(model, rank, last, now)
    if st.kind == "exited":
        ex = model.exited(rank) or {}
        d["exit"] = {k: ex[k] for k in ("reason", "exc", "ts") if k in ex}
    if st.kind == "dead":
        d["last_seen_ns"] = int(max(rt.last_hb, rt.last_ts))
    if "stack" not in d and rt.last_stack is not None and st.kind != "exited":
        idx = model.op_index(rank, rt.last_stack.get("id", -1))
        stack = stack_of(model, rank, idx)
        if stack:
            d["stack"] = stack
    return d
