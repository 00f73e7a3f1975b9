"""Findings from a snapshot (``commscope snapshot``): said as what they are, and no more.

A snapshot's ops come from stacks, not from a recorder: their ``seq`` is the snapshot's
cycle, the same on every rank, which lets the detectors match them with each other and
means nothing else.  So a finding over them carries no ``seq``, says it comes from a
snapshot, and never names as culprit a rank the snapshot did not see: a rank with no
stream at all sits on a host nobody snapshotted yet (several nodes add their ranks one by
one), which is unknown, not missing.  Ops read from Flight Recorder dumps keep their seq.
"""

from __future__ import annotations

import re

from commscope.analysis.findings import Finding
from commscope.analysis.model import TraceModel
from commscope.analysis.ranks import ranges
from commscope.analysis.vocab import FR_IMPORT, SNAPSHOT


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
    out = []
    for f in findings:
        if missing and set(f.culprits) & missing:
            f.culprits = [r for r in f.culprits if r not in missing]
            if not f.culprits:
                continue  # nothing but ranks nobody looked at: the warning below says so
            f.message += f" (ranks {ranges(sorted(missing))} were not snapshotted and are not blamed)"
        if stacks_only:
            f.message = re.sub(r"\s?#\d+\b", "", f.message)  # (its own and its consequences' seq)
            f.seq = None
            for c in f.evidence.get("consequences", ()):
                c["seq"] = None
        elif f.seq is not None and _from_stacks(model, f):
            f.message = re.sub(rf"\s?#{f.seq}\b", "", f.message)
            f.seq = None
        f.message += f" [{note}]"
        f.evidence["snapshot"] = {"span_s": span, "unseen": sorted(missing)}
        out.append(f)
    if missing:
        out.append(Finding("trace_incomplete", None, None, None, sorted(missing), sorted(missing),
                           f"ranks {ranges(sorted(missing))} of {model.world_size} are not in the snapshot: run "
                           "commscope snapshot --out STORE on their hosts (same --id)",
                           {"unseen": sorted(missing)}))
    return out


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
