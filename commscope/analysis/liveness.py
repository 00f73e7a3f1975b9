"""Liveness findings: ranks whose heartbeat stopped, async work never waited."""

from __future__ import annotations

from typing import Any

from rich.console import RenderableType
from rich.text import Text

from commscope.analysis import evidence, rankstate
from commscope.analysis.evidence import ABSENT, Evidence, record
from commscope.analysis.failures import cause_of_departure
from commscope.analysis.findings import Finding, activity, op_brief, secs
from commscope.analysis.model import TraceModel, describe_kill
from commscope.analysis.rankstate import snapshot
from commscope.analysis.vocab import is_kill, stopped
from commscope.units import sample_text


@record
class Dead(Evidence):
    """dead_rank: how long the rank has been silent, against which threshold, what it did last."""

    how: str  # "silent" (heartbeats stopped), "vanished" (its peers' ops failed, then nothing came) or
    # "killed" (its exit says it was killed, or cut itself off with os._exit: ``cause``)
    last_seen_ns: int
    silent_s: float
    threshold_s: float
    sample_interval_s: float | None
    activity: dict[str, Any]  # findings.activity
    last_sample: dict[str, Any] = ABSENT  # its last CPU/GPU sample
    host: str | None = ABSENT
    pid: int | None = ABSENT
    caused_by: dict[str, Any] = ABSENT  # the failure blamed on others it had just before: instance, culprits, reason
    cause: str = ABSENT  # how it was killed: "killed (Killed) (its launcher saw it)", "left through os._exit(3)"
    no_spool: str = ABSENT  # why it recorded without a spool (its meta's): its last records may have died with it

    def render(self, f: Finding) -> list[RenderableType]:
        act = self.activity or {}
        how = {"vanished": "vanished while its peers' ops failed", "killed": self.get("cause", "killed")}
        rows = [("how", how.get(self.how, "heartbeat stopped")),
                ("gone for", f"{float(self.silent_s or 0):.1f} s (its exit said how: no silence was waited for)")
                if self.how == "killed" else
                ("silent for", f"{float(self.silent_s or 0):.1f} s (threshold {float(self.threshold_s or 0):.1f} s)"),
                ("was", act.get("text")), ("in", evidence.brief(act.get("in_op")) if act.get("in_op") else None),
                ("last op", evidence.brief(act.get("last_completed_op")) if act.get("last_completed_op") else None),
                ("last sample", Text(sample_text(self.last_sample), style=evidence.FAINT)
                 if self.last_sample else None),
                ("host / pid", f"{self.get('host') or '?'} / {self['pid']}") if "pid" in self else
                ("host", self.get("host") or "?"),
                ("no spool", self.get("no_spool"))]
        return [evidence.kv(rows)]


@record
class Unwaited(Evidence):
    """unwaited_work: the async ops the rank never waited on before it exited."""

    count: int
    ops: list[dict[str, Any]]  # findings.op_brief (or just the id), the first 20
    exit_ns: int

    def render(self, f: Finding) -> list[RenderableType]:
        ops = evidence.values(self.ops)
        return [evidence.table(f"{self.count} async ops never waited", ["op", "group", "seq", "site"],
                        [[o.get("op"), o.get("group"), o.get("seq"), o.get("site")] for o in ops[:50]])]


def outlived(model: TraceModel, rank: int) -> bool:
    """Peers completed the next collective of the rank's last group after its last recorded
    op: the rank took part, so it was alive after its stream stopped (a full disk, a store
    gone).  Only a collective can prove it: it completes on no member unless every member
    joined.  It proves the rank lived past its stream's end, not that it never died: one
    that vanished later (``rankstate.vanished``) is dead all the same (``find_dead``)."""
    i = model.last_op(rank, completed=False)
    if i is None:
        return False
    key = rankstate.collective_of(model, rank, i)
    if key is None:
        return False
    space, group, seq = key
    done = rankstate.completed_by(model, group, seq + 1, space)
    return len(done) > (rank in done)  # (a peer completed it)


def gone(model: TraceModel, rank: int, now: int) -> bool:
    """Dead as ``find_dead`` judges it: silent past its threshold (``rankstate``), unless its
    peers completed a collective it took part in after its stream stopped (``outlived``:
    alive past its stream's end, the silence its store's, as while its master fails over),
    where it did not vanish (its peers' ops failing on its closed connection)."""
    return snapshot(model, now).state(rank).kind == "dead" and (
        rank in rankstate.vanished(model, now) or not outlived(model, rank))


def find_dead(model: TraceModel, now: int, failures: list | None = None) -> list[Finding]:
    """Ranks gone without an ``exit``: silent for longer than the dead threshold while other
    ranks kept writing (ranks that all stop together were killed together: no finding), or
    vanished while their peers' ops failed (``TraceModel.vanished``)."""
    out = []
    vanished = rankstate.vanished(model, now)
    snap = snapshot(model, now)
    for r in model.rank_ids():
        if not gone(model, r, now):
            continue  # alive, or alive past its stream's end: trace_incomplete tells that (one that
            # vanished after it, its peers' ops failing on its closed connection, died all the same)
        rt = model.ranks[r]
        seen = model.last_seen(r)
        killed = rankstate.killed(model, r)
        how = "killed" if killed is not None else "vanished" if r in vanished else "silent"
        if not rankstate.left_early(model, r, now):
            continue  # everyone stopped at about the same time: the job was stopped, nobody died first
        act = activity(model, r, now)
        doing = act.get("in_op") or act.get("last_completed_op")
        # (named by the ops' indexes, as ``activity`` found them: an id need not find its op,
        # a negative one never does, a repeated one finds the latest)
        in_op, last = snap.state(r).op, snap[r].last_done
        what = (f"in {model.label(r, in_op)}" if act.get("in_op") and in_op is not None else
                f"after {model.label(r, last)}" if doing and last is not None else "before any op")
        if killed is not None:
            msg = f"rank {r} was gone without a clean exit ({what}): {describe_kill(killed)}"
        elif how == "vanished":
            msg = (f"rank {r} vanished without a clean exit ({what}): its peers' ops failed because their "
                   f"connection to it closed, and nothing came from it since; it crashed or was killed")
        else:
            msg = (f"rank {r} stopped sending heartbeats {secs(now - seen):.1f} s ago without a clean exit "
                   f"({what}); it crashed, was killed, is stopped (SIGSTOP, a debugger), or cannot run Python "
                   "(native code holding the GIL)")  # (a stopped one was not said, helper-196)
        ev = Dead(how=how, last_seen_ns=seen, silent_s=secs(now - seen),
                  threshold_s=secs(rankstate.dead_after_ns(model, r) if how == "silent" else rankstate.vanish_after_ns(model, r)),
                  sample_interval_s=model.sample_interval(r), activity=act)
        if killed is not None:
            ev.cause = describe_kill(killed)
        if rt.samples.last:
            ev.last_sample = {k: v for k, v in rt.samples.last.items() if k not in ("v", "type", "rank")}
        if rt.meta:
            ev.host = rt.meta.get("host")
            if isinstance(pid := rt.meta.get("pid"), int):  # (not known of a rank a snapshot found gone)
                ev.pid = pid
            if isinstance(no_spool := rt.meta.get("no_spool"), str):
                # (the cause of its death and its last records would have been in the spool)
                ev.no_spool = no_spool
                msg += f"; it recorded without a spool ({no_spool}): what it did last may be missing"
        victims: dict[int, tuple[int, ...]] = {}
        instances: tuple = ()
        cause = cause_of_departure(model, r, failures or [])
        if cause is not None:
            ev.caused_by = {"instance": list(cause.key), "culprits": list(cause.blame.culprits),
                            "reason": cause.blame.text}
            victims = {r: cause.blame.culprits}
            instances = (cause.key,)
        group = doing["group"] if doing else None
        out.append(Finding("dead_rank", group, doing.get("seq") if doing else None, doing["op"] if doing else None,
                           [r], [r], msg, ev, ts=seen, victims=victims, instances=instances))
    return out


def find_unwaited(model: TraceModel, now: int) -> list[Finding]:
    """unwaited_work for each rank that left of its own accord with async ops it never
    waited on.  Not for a rank that crashed or was killed or stopped: the exception or the
    signal cut the program short of its waits (ranks crashed of another's failure were
    warned of irecvs their code does wait on: helper-186)."""
    out = []
    for r in model.rank_ids() if model.exits_seen else ():  # (exits list them: none, no walk of 16k ranks)
        rt = model.ranks[r]
        seen: dict[int, None] = {}  # ordered set: an exit may list thousands of ids
        ex_ts = 0
        counted = 0  # the recorder's count of them all (an exit lists the first 1,000)
        for ex in rt.exits:
            if rankstate.is_crash(ex) or is_kill(ex) or stopped(ex) or ex.get("stop_signal") or ex.get("raising"):
                # (cut short: not what it left of its own accord, at destroy_process_group say; one
                # called in a ``finally`` as an exception propagated is cut short too, helper-195)
                continue
            listed = ex.get("unwaited") or []
            seen.update(dict.fromkeys(listed))
            counted += int(ex.get("unwaited_count") or len(listed))
            ex_ts = ex["ts"]
        ids = list(seen)
        if not ids:
            continue
        ops = []
        for op_id in ids:
            i = model.op_index(r, op_id)
            if i is not None and rt.we[i] == 0:
                ops.append(op_brief(model, r, i, now))
            elif i is None:
                ops.append({"id": op_id})
        if not ops:
            continue
        names = sorted({o.get("op", "?") for o in ops})
        sites = sorted({o["site"] for o in ops if o.get("site")})
        total = max(counted - (len(ids) - len(ops)), len(ops))  # less those the trace shows waited
        msg = (f"rank {r} exited with {total:,} async op(s) never waited on ({', '.join(names)}"
               + (f" at {', '.join(sites[:3])}" if sites else "") + "): call .wait() on the returned Work")
        first = ops[0]
        out.append(Finding("unwaited_work", first.get("group"), first.get("seq"), first.get("op"), [r], [r], msg,
                           Unwaited(count=total, ops=ops[:20], exit_ns=ex_ts), ts=ex_ts))
    return out
