"""The trace_incomplete finding: a trace that lost events is never called healthy.

Its severity is an error when events were lost (dropped by a full recorder buffer, damaged
or invalid lines, entries the store lost or trimmed), or may have been without being counted
yet (a Redis Cluster master that failed over since a rank's writer last wrote: ``unsettled``):
they may have held ops, and ``check`` never exits 0 over ops it could not read.  A stream that only ends without ``exit`` is a
warning.

A rank's stream is incomplete when the recorder dropped events (Flight Recorder ring
overwrites excepted: those are collectives the wrapper recorded itself), when the reader
skipped damaged lines or invalid events of it, when the store lost entries of it, or
when it ends without an ``exit`` while another rank exited after its last event (the
job went on; its tail never reached the store, and peers completing its collectives
afterwards prove it was alive: ``liveness.outlived``).  A dead rank's missing exit is left to
``dead_rank``, which already explains it.  When no rank wrote an exit and the whole trace
stopped well before the clock's now (``job_stopped``), the job was killed as a whole or its
tail never reached the store (a store that went down and never came back): that too is
incomplete, unless an error finding already explains the end.  And a trace read to its end
that holds nothing of a rank its peers completed collectives with (``unseen``) lost that
rank's whole stream: a directory store its host does not share, a stream deleted.  A
stream that is not of the run the others are (``TraceModel.foreign_streams``: another job's,
another launch's under a reused job id, a rank past the world size) is named, an error: the
trace mixes runs.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from rich.console import RenderableType
from rich.text import Text

from commscope.analysis import evidence, liveness, rankstate
from commscope.analysis.evidence import ABSENT, Evidence, record
from commscope.analysis.findings import ERROR, WARNING, Finding
from commscope.analysis.liveness import outlived
from commscope.analysis.model import TraceModel
from commscope.analysis.ranks import ranges
from commscope.analysis.rankstate import snapshot

#: a loss not counted yet (the writer says it when it writes again) -> the cause a
#: ``lost_unknown`` names where the rank is gone: what the store did to its stream (a third
#: cause, ``full``, is of a stream ``refused``: its writes were refused, nothing to wait on)
_GONE_THEN = {"unsettled": "failover", "emptied": "restart"}

_LOSS_WORDS = {"dropped": "event(s) dropped by the recorder", "damaged": "damaged line(s) skipped",
               "invalid": "invalid event(s) skipped",
               # (a native stream's line is a block of many op records: what it held, where known, in
               # the warnings; helper-163 read "129 event(s)" for ~950 events gone)
               "missing": "line(s) of their streams lost by the store"}


@record
class Incomplete(Evidence):
    """trace_incomplete: what each rank's stream lost, and the Flight Recorder ring overwrites
    (not losses: shown so the numbers add up)."""

    lost_events: int
    #: rank -> dropped, damaged, invalid, missing, unsettled, lost_unknown, uncarried, unread, no_exit,
    #: last_event_ns, no_events
    per_rank: dict[str, dict[str, Any]]
    more_ranks: int = ABSENT  # incomplete ranks beyond the first 256
    fr_ring_overwritten: dict[str, int] = ABSENT

    def render(self, f: Finding) -> list[RenderableType]:
        rows = [[r, d.get("dropped"), d.get("damaged"), d.get("invalid"), d.get("missing"),
                 "no events" if d.get("no_events") else "no exit" if d.get("no_exit") else
                 "not counted yet" if d.get("unsettled") or d.get("emptied") else
                 f"lost, count unknown ({d['lost_unknown']})" if d.get("lost_unknown") else
                 "start not known" if d.get("uncarried") else "end not read" if d.get("unread") else ""]
                for r, d in self.per_rank.items()]
        parts: list[RenderableType] = [evidence.table("lost per rank", ["rank", "dropped", "damaged", "invalid",
                                                                "store lost", "end"], rows)]
        if self.more_ranks:
            parts.append(Text(f"… and {self.more_ranks:,} more ranks", style=evidence.FAINT))
        if self.fr_ring_overwritten:
            parts.append(Text("Flight Recorder ring overwrites (not losses): " + ", ".join(
                f"rank {r}: {n:,}" for r, n in list(self.fr_ring_overwritten.items())[:16]), style=evidence.FAINT))
        return parts


@record
class ReaderProblem(Evidence):
    """trace_incomplete as the console raises it when the reader itself failed or skipped lines."""

    reader_error: str = ABSENT
    damaged: int = ABSENT
    invalid: int = ABSENT


def job_stopped(model: TraceModel, wall_ns: int) -> bool:
    """No rank exited or was killed (a rank whose end was noted, by itself, its launcher or
    its spool, says how it went), and every rank sent heartbeats (a recorder was writing), stopped
    between ops (a rank stopped inside an op is judged as waiting there, like any snapshot
    of a stuck job) and is silent, at ``wall_ns``, for longer than its dead threshold:
    nobody writes to this trace any more.  A trace without heartbeats (synthetic,
    converted) is not judged this way."""
    ranks = model.rank_ids()
    return bool(ranks) and all(
        rankstate.exited(model, r) is None and rankstate.killed(model, r) is None and model.ranks[r].last_hb > 0
        and not model.inflight(r)
        and wall_ns - model.last_seen(r) > rankstate.dead_after_ns(model, r) for r in ranks)


def unseen(model: TraceModel) -> list[int]:
    """The ranks of the world that wrote nothing to this trace though a collective their
    peers completed needed them (every member enters a collective that completes): their
    streams are not in this store (``rankstate.elsewhere``).  None are named for a trace read
    from outside (a snapshot of one host's ranks, the dumps a user had)."""
    return sorted(rankstate.elsewhere(model)[1])


def _why_dropped(per_rank: dict[int, dict[str, Any]]) -> str:
    """Why the recorders dropped what they did, each reason once with its ranks (a lost
    event is shown with its cause: the count alone said none, helper-197)."""
    by_why: dict[str, list[int]] = {}
    for r, d in sorted(per_rank.items()):
        if d.get("dropped") and d.get("dropped_why"):
            by_why.setdefault(d["dropped_why"], []).append(r)
    said = [f"rank(s) {ranges(rs, limit=8)}: {why}" for why, rs in list(by_why.items())[:3]]
    return f", why: {'; '.join(said)}{'; ...' if len(by_why) > 3 else ''}" if said else ""


def find_incomplete(model: TraceModel, now: int, stopped: bool = False, wall_ns: int | None = None) -> list[Finding]:
    """``stopped``: the caller found ``job_stopped`` and no error finding explaining it.
    ``wall_ns`` (the clock now) given: the trace is read to its end (not a live job whose
    ranks' streams a reader may not have listed yet): ranks it does not hold that their
    peers' collectives needed (``unseen``) are incomplete too, and a rank whose store
    refused its writes is judged silent by that clock, not by the trace's end (the ranks
    of a job whose every last event was refused all stop together)."""
    ended = wall_ns is not None
    per_rank: dict[int, dict[str, Any]] = {}
    for r, losses in model.read_losses.items():
        if r >= 0:
            per_rank.setdefault(r, {}).update(losses)
    foreign = model.foreign_streams
    for r, why in foreign.items():  # (the message, and the cause it is made of: additions only)
        per_rank.setdefault(r, {}).update(foreign=why.message, foreign_cause=why.cause.value)
    absent = unseen(model) if ended else []
    for r in absent:  # (what was read of it and lost stays said: helper-65)
        per_rank.setdefault(r, {})["no_events"] = True
    ranks = model.rank_ids()
    unknown = model.unknown_sigs()
    unnamed: dict[int, int] = {}  # rank -> its ops whose names its stream could not say (none: no walk)
    for r in ranks if unknown.shape[0] else ():
        rt = model.ranks[r]
        n = int(np.isin(rt.sig[:rt.n], unknown).sum())
        if n:
            unnamed[r] = per_rank.setdefault(r, {})["unnamed"] = n
    # (a rank's exit is looked at only where it has one: 16k ranks, none exited, cost ~18 us
    # each in every diagnosis; and no rank at all where none has: ``exits_seen``)
    exits = {r: ex for r in ranks if model.ranks[r].exits
             and (ex := rankstate.exited(model, r)) is not None} if model.exits_seen else {}
    last_exit = max((int(ex["ts"]) for ex in exits.values()), default=None)
    for r in ranks:
        rt = model.ranks[r]
        d = per_rank.get(r)
        if d and d.pop("refused", None):  # (its store refuses writes: what it shows of a rank gone so is short)
            if r not in exits and (snapshot(model, now)[r].dead or wall_ns is not None and wall_ns
                                   - model.last_seen(r) > rankstate.dead_after_ns(model, r)):
                d["lost_unknown"] = "full"
            elif not d:
                del per_rank[r]
                d = None
        waits = [k for k in _GONE_THEN if d and d.get(k)]
        if waits and (r in exits or liveness.gone(model, r, now)):
            # (its writer will never write again to count what the store lost: a stated loss, not a wait)
            for k in waits:
                del d[k]
            d["lost_unknown"] = _GONE_THEN[waits[0]]
        if rt.dropped:
            per_rank.setdefault(r, {})["dropped"] = int(rt.dropped)
            if rt.drop_reason:
                per_rank[r]["dropped_why"] = rt.drop_reason
        went_on = (last_exit is not None and r not in exits and rt.last_ts <= last_exit
                   and (not snapshot(model, now)[r].dead or outlived(model, r)))
        if went_on or stopped:
            per_rank.setdefault(r, {})["no_exit"] = True
            per_rank[r]["last_event_ns"] = int(rt.last_ts)
    for r in [r for r, d in per_rank.items() if d.get("refused")]:  # (a stream listed, nothing of it read)
        d = per_rank[r]
        del d["refused"]
        if ended:  # (every write of it refused, maybe: it is read to its end; helper-205)
            d["lost_unknown"] = "full"
        elif not d:
            del per_rank[r]
    if not per_rank:
        return []
    ranks = sorted(per_rank)  # (the ranks the finding names)
    lost = sum(v for d in per_rank.values() for k, v in d.items() if k in _LOSS_WORDS)
    parts = []
    for kind, words in _LOSS_WORDS.items():
        counts = {r: d[kind] for r, d in per_rank.items() if d.get(kind)}
        if counts:
            parts.append(f"{sum(counts.values()):,} {words} (" +
                         ", ".join(f"rank {r}: {n:,}" for r, n in sorted(counts.items())[:8]) +
                         (", ..." if len(counts) > 8 else "") + ")" + (_why_dropped(per_rank) if kind == "dropped" else ""))
    if unnamed:
        parts.append(f"{sum(unnamed.values()):,} op(s) whose names their streams could not say (" +
                     ", ".join(f"rank {r}: {n:,}" for r, n in sorted(unnamed.items())[:8]) +
                     (", ..." if len(unnamed) > 8 else "") + "): the op names of a stream's meta line, which "
                     "was lost or damaged; they are compared with no rank's")
    unsettled = sorted(r for r, d in per_rank.items() if d.get("unsettled"))
    if unsettled:
        parts.append(f"the store's node of the stream of rank(s) {ranges(unsettled, limit=8)} failed over since their "
                     "writers last wrote: what its replica had not received is not counted yet (each writer says "
                     "it when it writes again)")
    emptied = sorted(r for r, d in per_rank.items() if d.get("emptied"))
    if emptied:
        parts.append(f"the store holds less of the stream of rank(s) {ranges(emptied, limit=8)} than was read (Redis "
                     "restarted without persistence, or was flushed): what it lost that was not read is not counted "
                     "yet (each writer says it when it writes again)")
    for cause, words in (("failover", "the store's node of the stream of rank(s) {} failed over after the rank(s) "
                                      "were gone (dead or exited, their writers never to write again): the last "
                                      "events its replica had not received are lost, how many is not known (maybe "
                                      "none)"),
                         ("restart", "the store lost the stream of rank(s) {} after the rank(s) were gone (dead or "
                                     "exited, their writers never to write again: Redis restarted without "
                                     "persistence, or was flushed): what was not read is lost, how many is not known "
                                     "(maybe none)"),
                         ("full", "the store refused writes for lack of memory (a Redis at its maxmemory) and rank(s) "
                                  "{} went silent without an exit: their last events may never have reached it (they "
                                  "wait in their hosts' spools, which a commscope command on the host forwards once "
                                  "the store has room), how many is not known (maybe none)")):
        gone = sorted(r for r, d in per_rank.items() if d.get("lost_unknown") == cause)
        if gone:
            parts.append(words.format(ranges(gone, limit=8)))
    gone = [r for r, d in per_rank.items() if d.get("lost_unknown")]
    unread = sorted(r for r, d in per_rank.items() if d.get("unread"))
    if unread:  # (its end, not its start: helper-209)
        parts.append(f"the rest of the stream of rank(s) {ranges(unread, limit=8)} was not read (retention deleted its "
                     "segments as fast as this read reached them): what they did after is not known")
    uncarried = sorted(r for r, d in per_rank.items() if d.get("uncarried"))
    if uncarried:
        parts.append(f"what rank(s) {ranges(uncarried, limit=8)} were in where the read of their streams began is not "
                     "known (the carry of the segment before, and that segment, are gone from the store): an op "
                     "begun before may be missing")
    if foreign:
        parts.append(f"the stream(s) of rank(s) {ranges(sorted(foreign), limit=8)} are not of the run the others are "
                     "(a rank file copied in from another job, or a job id reused by another launch), kept out of "
                     "the matching, the diagnosis and the report (" +
                     "; ".join(f"rank {r}: {why.message}" for r, why in sorted(foreign.items())[:4]) +
                     ("; ..." if len(foreign) > 4 else "") + ")")
    if absent:
        parts.append(f"no events from rank(s) {ranges(absent, limit=8)}, though their peers completed collectives "
                     "with them: their streams are not in this store (a directory store their hosts do not share, "
                     "streams deleted, or ranks not instrumented)")
    ended = sorted(r for r, d in per_rank.items() if d.get("no_exit"))
    if ended and stopped:
        parts.append("no rank wrote an exit event and every rank stopped writing: the job was killed "
                     "as a whole, or its last events never reached the store (a store that went "
                     "down and did not come back)")
    elif ended:
        parts.append(f"the stream of rank(s) {ranges(ended, limit=None)} ends without an exit event while other ranks "
                     "exited later: its last events never reached the store")
    msg = "the trace is incomplete: " + "; ".join(parts)
    if model.read_losses.get(-1):
        msg += "; the job metadata was skipped as invalid"
    fr = {str(r): int(rt.fr_overwritten) for r, rt in model.ranks.items() if rt.fr_overwritten}
    ev = Incomplete(lost_events=lost, per_rank={str(r): per_rank[r] for r in ranks[:256]},
                    more_ranks=len(ranks) - 256 if len(ranks) > 256 else ABSENT, fr_ring_overwritten=fr or ABSENT)
    ts = max((int(model.ranks[r].last_ts) for r in ranks if r in model.ranks), default=model.end_ns)
    # Lost events may have held ops: never a healthy exit (check exits 1).
    return [Finding("trace_incomplete", None, None, None, ranks, ranks, msg, ev, ts=ts,
                    severity=ERROR if lost or absent or unnamed or unsettled or emptied or gone or foreign or uncarried
                    or unread else WARNING)]
