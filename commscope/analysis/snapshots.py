"""Findings from a snapshot (``commscope snapshot``): said as what they are, and no more.

A snapshot's ops come from stacks, not from a recorder: their ``seq`` is the snapshot's
cycle, the same on every rank, which lets the detectors match them with each other and
means nothing else.  So a finding over them carries no ``seq``, says it comes from a
snapshot, and never names as culprit a rank the snapshot did not see: a rank with no
stream at all sits on a host nobody snapshotted yet (several nodes add their ranks one by
one), which is unknown, not missing.  Ops read from Flight Recorder dumps keep their seq.

A rank of the snapshot's host that py-spy could not read (no permission to attach, py-spy
failing) is in the store with a ``stack`` without threads whose reason says why
(``unread_reason``): it is alive and unread.  Ranks waiting in a collective it was not seen
in wait on it: the finding names it, says that where it is is not known and how to read it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, MutableMapping
from typing import Any

from commscope.analysis.findings import ERROR, Finding, doing_instead
from commscope.analysis.model import TraceModel
from commscope.analysis.ranks import ranges
from commscope.analysis.vocab import FR_IMPORT, SNAPSHOT, unread_of

#: What lets py-spy attach (ptrace), where it may not
PTRACE_ADVICE = ("py-spy attaches with ptrace: run commscope snapshot as the job's user or root (sudo), or let "
                 "processes of one user attach: sudo sysctl kernel.yama.ptrace_scope=0; in a container, add the "
                 "SYS_PTRACE capability (see py-spy's README, 'When do you need to run as sudo?')")


def unread(model: TraceModel) -> dict[int, tuple[str, str]]:
    """Ranks a snapshot found but could not read: rank -> (py-spy's error kind, its text).
    A rank read at a later cycle (``attach --pid``) is read."""
    out = {}
    for r, rt in model.ranks.items():
        got = unread_of(rt.last_stack)
        if got is not None:
            out[r] = got
    return out


def _advice(kind: str) -> str:
    """What to do about a rank py-spy could not read, by its error's kind (``pyspy.classify``)."""
    if kind == "permission":
        return PTRACE_ADVICE
    if kind == "stopped":
        return "resume it (kill -CONT PID), then run commscope snapshot again"
    return "run commscope snapshot again (py-spy failed on it)"


def is_snapshot(model: TraceModel) -> bool:
    return any(rt.meta and rt.meta.get("recorder") == SNAPSHOT for rt in model.ranks.values())


def unseen(model: TraceModel) -> list[int]:
    """Ranks of the world with no stream: on a host not snapshotted (yet)."""
    return sorted(set(range(model.world_size or 0)) - set(model.ranks))


def qualify(model: TraceModel, findings: list[Finding]) -> list[Finding]:
    if not is_snapshot(model):
        return findings
    missing = set(unseen(model))
    meta = next(rt.meta for rt in model.ranks.values() if rt.meta and rt.meta.get("recorder") == SNAPSHOT)
    span = float(meta.get("hang_after") or 0)
    stacks_only = not any(s.src == FR_IMPORT for s in model.sigs)
    samples = "one sample" if span < 0.001 else f"samples over {span:g} s"
    note = (f"from a snapshot of the ranks' stacks ({samples}): no op history, sequence numbers unknown"
            if stacks_only else f"from a snapshot of the ranks' stacks ({samples}) and their Flight Recorder dumps")
    unreadable = unread(model)
    out = []
    for f in findings:
        if unreadable and set(f.culprits) & unreadable.keys():
            _say_unread(f, unreadable)
        if missing and set(f.culprits) & missing:
            f.culprits = [r for r in f.culprits if r not in missing]
            if not f.culprits:
                continue  # nothing but ranks nobody looked at: the warning below says so
            f.message += f" (ranks {ranges(sorted(missing))} were not snapshotted and are not blamed)"
        # (a wait seen over the snapshot's samples began before them: how long it lasted is not
        # known, it is at least that; "waited up to 2.0 s" said less, helper-203)
        f.message = f.message.replace(" entered and waited up to ", " entered and waited at least ", 1)
        if stacks_only:
            f.message = _no_seq(f.message)  # (its own and its consequences' seq)
            f.seq = None
            for op in _ops(f.evidence):
                op.pop("seq", None)
            for c in f.evidence.get("consequences", ()):
                c["seq"] = None
                c["message"] = _no_seq(str(c.get("message", "")))
        elif f.seq is not None and _from_stacks(model, f):
            f.message = _no_seq(f.message, f.seq)
            f.seq = None
        f.message += f" [{note}]"
        f.evidence["snapshot"] = {"span_s": span, "unseen": sorted(missing)}
        out.append(f)
    if missing:
        out.append(Finding("trace_incomplete", None, None, None, sorted(missing), sorted(missing),
                           f"ranks {ranges(sorted(missing))} of {model.world_size} are not in the snapshot: run "
                           "commscope snapshot --out STORE on their hosts (same --id)",
                           {"unseen": sorted(missing)}))
    if unreadable:
        rs = sorted(unreadable)
        whys = sorted({f"{why} ({_advice(kind)})" for kind, why in unreadable.values()})
        # (an error: check never exits 0 over ranks it could not read, helper-71)
        out.append(Finding("trace_incomplete", None, None, None, rs, rs,
                           f"rank(s) {ranges(rs)} could not be read by py-spy: {'; '.join(whys)}",
                           {"unread": {str(r): why for r, (_, why) in sorted(unreadable.items())}}, severity=ERROR))
    return out


def _say_unread(f: Finding, unreadable: dict[int, tuple[str, str]]) -> None:
    """A finding blaming a rank py-spy could not read: it is the rank the others wait on as far
    as the snapshot tells, and where it is, is not known."""
    culprits = sorted(set(f.culprits) & unreadable.keys())
    why = "; ".join(sorted({unreadable[r][1] for r in culprits}))
    advice = "; ".join(sorted({_advice(unreadable[r][0]) for r in culprits}))
    said = f"not readable by py-spy ({why}): where it is, is not known"
    activity = f.evidence.get("missing_activity") if f.kind == "missing_ranks" else None
    if activity is not None and " never entered: " in f.message:
        for r in culprits:
            activity[str(r)] = {"rank": r, "state": "unknown", "text": said}
        head = f.message.split(" never entered: ", 1)[0]
        verb = " were not seen in it: " if set(f.culprits) <= unreadable.keys() else " never entered: "
        f.message = head + verb + doing_instead(list(f.culprits), activity)
    else:
        f.message += f" (rank(s) {ranges(culprits)} {said})"
    f.message += f". To read {'it' if len(culprits) == 1 else 'them'}: {advice}"


def _no_seq(text: str, seq: int | None = None) -> str:
    """The message without sequence numbers a snapshot does not know: '#3', and the
    '(#3 of group 0)' of a p2p op as '(group 0)'."""
    num = r"\d+" if seq is None else str(seq)
    text = re.sub(rf"\(#(?:{num}|\?) of (group [^)]*)\)", r"(\1)", text)
    return re.sub(rf"\s?#{num}\b", "", text)


def _ops(ev: Any) -> Iterator[MutableMapping]:
    """The op views (``findings.op_brief``) inside an evidence record: dicts with an op and a seq."""
    stack: list[Any] = [ev]
    while stack:
        x = stack.pop()
        if isinstance(x, MutableMapping):
            if "op" in x and "seq" in x and not isinstance(x, Finding):
                yield x
            stack.extend(x.values())
        elif isinstance(x, list | tuple):
            stack.extend(x)


def _from_stacks(model: TraceModel, f: Finding) -> bool:
    """The finding's op is one the snapshot read from stacks (not from a Flight Recorder dump)."""
    for r in f.ranks:
        rt = model.ranks.get(r)
        if rt is None or not rt.n:
            continue
        for i in range(rt.n):
            if int(rt.seq[i]) == f.seq:
                return model.sigs[int(rt.sig[i])].src == SNAPSHOT
    return True
