"""diagnose(model, now, hang_after) -> findings: every check of docs/analysis.md, as a pure function.

``now`` is the time the trace is judged at.  The live console passes the wall clock;
``check`` on a stored trace passes ``trace_now(model)``, the last timestamp in the trace (of its own ranks),
so a job that was killed while hung is judged as it was when it last wrote.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from commscope import events
from commscope.analysis.collectives import (
    find_group_disagreements,
    find_history_mismatches,
    find_mismatches,
    find_missing,
    find_stragglers,
)
from commscope.analysis.completeness import find_incomplete, job_stopped
from commscope.analysis.failures import failed_instances, find_crashes, find_failed_ops
from commscope.analysis.findings import Finding
from commscope.analysis.hangs import drawn_in
from commscope.analysis.liveness import find_dead, find_unwaited
from commscope.analysis.model import TraceModel
from commscope.analysis.modelcheck import find_model_mismatches
from commscope.analysis.p2p import find_p2p, find_p2p_sizes
from commscope.analysis.rankstate import snapshot
from commscope.analysis.rootcause import resolve
from commscope.analysis.snapshots import qualify

DEFAULT_HANG_AFTER = events.DEFAULT_HANG_AFTER


def trace_now(model: TraceModel) -> int:
    """The judging time for a stored trace: the last timestamp of the job's own ranks
    (``TraceModel.trace_end``: a foreign stream's left out)."""
    return model.trace_end()


def default_hang_after(model: TraceModel) -> float:
    """The hang_after the ranks were recorded with, else DEFAULT_HANG_AFTER."""
    return model.hang_after() or DEFAULT_HANG_AFTER


def judged(model: TraceModel, hang_after: float, clock: Callable[[], int] = time.time_ns
           ) -> tuple[int, list[Finding]]:
    """A stored trace judged as ``check`` judges it: at its end (returned), with the wall
    ``clock`` to tell a job that stopped writing, and a trace read to its end.  The one
    judgment of ``check``, ``report``, ``export`` and ``replay`` (``check_store`` judged
    without the clock, and missed both: helper-65; replay too, and said "no problems found"
    of a trace ``check`` found a rank missing from: helper-165)."""
    now = trace_now(model)
    return now, diagnose(model, now, hang_after, wall_ns=clock())


def diagnose(model: TraceModel, now: int | None = None, hang_after: float | None = None,
             wall_ns: int | None = None) -> list[Finding]:
    """All findings, errors first, one error finding per root cause (``rootcause``).
    A healthy trace yields an empty list.  ``wall_ns`` (the clock now, for a stored trace
    judged at its end) lets a job that stopped writing without any exit be told apart from
    one still running: see ``completeness.job_stopped``."""
    if now is None:
        now = trace_now(model)
    if hang_after is None:
        hang_after = default_hang_after(model)
    hang_ns = int(hang_after * 1e9)
    apart = model.foreign_streams  # (first: the matching leaves the foreign streams out)
    snapshot(model, now).judge_plain()  # every rank's state, computed once for all the detectors below
    findings: list[Finding] = []
    mismatches, mismatch_rows = find_mismatches(model, now)
    before, replaced = find_history_mismatches(model, mismatches)
    gone = {id(f) for f in replaced}
    findings += [f for f in mismatches if id(f) not in gone] + before + find_group_disagreements(model)
    findings += find_model_mismatches(model)
    hangs = find_missing(model, now, hang_ns, mismatch_rows) + find_p2p(model, now, hang_ns)
    drawn = drawn_in(model, now, hang_ns, hangs)
    if drawn:  # (ranks a hang waits on, blocked a moment less than hang_after: part of it)
        hangs = find_missing(model, now, hang_ns, mismatch_rows, drawn) + find_p2p(model, now, hang_ns, drawn)
    findings += hangs + find_p2p_sizes(model, now)
    failures = failed_instances(model, now, mismatch_rows, hang_ns)
    findings += find_failed_ops(model, now, failures)
    findings += find_crashes(model, now, failures)
    findings += find_dead(model, now, failures)
    findings += find_stragglers(model)
    findings += find_unwaited(model, now)
    if apart:  # (a foreign stream's own end, crash or wait is not this run's: trace_incomplete names it)
        findings = [f for f in findings if not (f.culprits and apart.keys() >= set(f.culprits))]
    stopped = (wall_ns is not None and not any(f.severity == "error" for f in findings)
               and job_stopped(model, wall_ns))
    findings += find_incomplete(model, now, stopped, wall_ns)
    return qualify(model, resolve(model, findings, now, mismatch_rows))
