"""One root cause, one error finding: fold the consequences of a fault into the finding of its cause.

The detectors each see one symptom.  When rank 1 dies, rank 0 and 2's all_reduce fails
(``op_failed``), they may crash on that exception (``rank_crashed``), or hang waiting
for rank 1 (``missing_ranks``); all of these are consequences of rank 1's death.  The
rules, applied to one snapshot of the model (so they hold at every moment of a live job):

1. A collective mismatch is the root of everything at its instances: the ops that failed
   there, and the ranks that died in it (Gloo aborts a process on mismatched sizes); and,
   as a departure is (rule 3), of what later names only ranks that died in it (a world
   collective failing after a subgroup's mismatch aborted its ranks) or that it holds
   (waiting there, or failed there: ``_held_in``).
2. Every finding says which ranks it shows as victims and whom they wait on
   (``Finding.victims``; an any-source recv on any one of its members, not all: those
   waiting on it in turn are dropped where others can send, ``_either``).  A culprit
   that is itself a victim is followed to the ranks it
   waits on, transitively (a cycle stops the walk: those ranks are each other's culprits).
   Hangs in different groups that wait on each other (a collective called on the wrong
   group) are a cycle too: those whose ranks did most as the rest of their group did are
   the root, one finding naming all their absentees, the others its consequences
   (``_crossed``).  A cycle of send/recv timeouts, each blamed on the next
   rank, is the p2p deadlock they ended (``_timed_out``), and the crashes of those timeouts
   its consequences.  A finding whose culprits lead elsewhere is a consequence of
   the finding that names the ranks they lead to; but an ``op_failed`` that raised on its rank itself (refused as
   it was called, a peer the job does not have) is its rank's own doing, whatever that
   rank waits on later.  A victim whose blame is not known yet makes its finding a
   consequence of the failure it waits to have explained, never a culprit.
3. A rank that is dead or crashed is the root of every other finding that names it (but
   one that crashed of a failure blamed on it and on others besides is that failure's
   consequence, and the failure the root of what its departure caused:
   ``_crashed_of_failures``):
   ``missing_ranks`` (even beside living absentees: a collective a dead member never
   entered can never complete), ``op_failed``, ``unmatched_p2p``.  A ``missing_ranks``
   naming the same ranks as an ``op_failed`` (the wait that then timed out; one that raised
   on its rank itself only where it is that wait) folds into it, and one whose absentees
   are all stuck in a ``p2p_deadlock`` folds into the deadlock, or in ``unmatched_p2p`` ops
   whose peers wait in that collective (a wait cycle through it) into the first of those,
   as do the same absentees' hangs in other groups (a send or recv that timed out so is
   that wait too); where only some absentees are in such cycles, both stand, the hang
   naming the others (``_split_cycle``), and so where only some are in a deadlock
   (``_split_deadlock``).  Ranks blocked in sends or recvs whose peers (the
   same ones) never posted theirs are one ``unmatched_p2p``, the first; a ``missing_ranks``
   naming its peers folds into it, and it into a ``p2p_deadlock`` holding them, or an
   ``op_failed`` blamed on them (a timeout whose blame went through its wait).  A
   rank blocked in a send or recv with a peer the job does not have (an ``unmatched_p2p``
   with ``no_such_peer`` evidence) is, likewise, the root of the findings that name it.

4. Ranks that departed together are one finding: deaths or crashes of the same manner (the
   same signal and what it said, digits aside; killed the same way, or gone), each within
   ``TOGETHER_NS`` of the one before (a lost host, one fault on many ranks).  Its culprits
   are all of them, the first to go first; its ``together`` evidence names that first and
   lists them all by host, and the rest of its evidence is the first one's.  16k ranks
   never give 8k findings of one fault.

A consequence is listed in its root's ``consequences`` evidence (kind, instance, ranks,
message, per-rank exceptions), its victims join the root's waiting ranks, and the root's
message says what followed.  Every error finding left then gets the stacks of its
culprits and waiting ranks (``findings.attach_stacks``).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from commscope.analysis import rankstate
from commscope.analysis.components import strongly_connected
from commscope.analysis.errors import first_line
from commscope.analysis.failures import death_message, instance_key
from commscope.analysis.findings import DEPARTED, ERROR, Finding, attach_stacks, ranks_text
from commscope.analysis.model import TraceModel
from commscope.analysis.p2p import timed_out
from commscope.analysis.rankstate import SLACK_NS
from commscope.analysis.vocab import signal_name

#: Which finding absorbs another naming the same culprits: earlier wins.
PRIORITY = ["collective_mismatch", "rank_crashed", "dead_rank", "op_failed", "p2p_deadlock", "unmatched_p2p",
            "missing_ranks"]
_RANK = {k: i for i, k in enumerate(PRIORITY)}


def _consequence(f: Finding) -> dict[str, Any]:
    d: dict[str, Any] = {"kind": f.kind, "group": f.group, "seq": f.seq, "op": f.op, "ranks": sorted(f.ranks),
                         "culprits": sorted(f.culprits), "message": f.message, "ts": f.ts}
    for k in ("failed", "waited_s", "exc", "signal", "blame", "later_failures"):
        if k in f.evidence:
            d[k] = f.evidence[k]
    return d


def _absorb(root: Finding, f: Finding, *more: Finding) -> None:
    """Fold ``f`` (and ``more``) into ``root``: its consequences, its victims, its
    instances (merged once for all: thousands folded one at a time copied them each time)."""
    culprits = tuple(root.culprits)
    named = set(culprits) if more else culprits  # (thousands of victims against thousands of culprits)
    for g in (f, *more):
        root.evidence.setdefault("consequences", []).append(_consequence(g))
        root.evidence["consequences"].extend(g.evidence.pop("consequences", []))
        for v in g.victims:
            if v not in named:
                root.victims.setdefault(v, culprits)
    root.instances = tuple(dict.fromkeys(root.instances + tuple(k for g in (f, *more) for k in g.instances)))


def _say(c: dict[str, Any], culprits: set[int], group: str | None = None) -> str:
    """One consequence in a few words: 'all_reduce #6 failed on ranks 0, 2' (its group named
    where it is not the root's own ``group``)."""
    ops = sorted({str(b.get("op")) for b in (c.get("failed") or {}).values() if isinstance(b, dict)})
    op = c.get("op") if len(ops) < 2 else "collective"  # (ranks that failed in different ops: a mismatch's)
    where = f"{op} #{c['seq']}" if op and c.get("seq") is not None else op or "an op"
    if c.get("group") is not None and c["group"] != group and c.get("op"):
        where += f" (group {c['group']})"
    hit = ranks_text(sorted(set(c["ranks"]) - culprits) or c["ranks"])
    if c["kind"] == "op_failed" and c.get("failed"):  # the ranks whose op raised, as its table lists them
        return f"{where} failed on {ranks_text(int(r) for r in c['failed'])}"
    if c["kind"] == "missing_ranks" and c.get("waited_s"):  # the ranks that entered and waited
        return f"{ranks_text(int(r) for r in c['waited_s'])} waited in {where}"
    if c["kind"] == "op_failed":
        return f"{where} failed on {hit}"
    if c["kind"] == "missing_ranks":
        return f"{hit} waited in {where}"
    if c["kind"] == "rank_crashed":
        who = ", ".join(map(str, c["culprits"]))
        said = death_message(c, 160)
        if c.get("signal") and said:  # the backend aborted it: its message is the best clue
            return f"the backend aborted rank {who} ({said})"
        return f"rank {who} crashed on that failure"
    if c["kind"] == "dead_rank":
        return f"rank {', '.join(map(str, c['culprits']))} went away"
    if c["kind"] == "unmatched_p2p":  # (the ranks that wait in it, not the peer it names: "ranks 0, 1
        # blocked in send #1" said so of rank 1, in a recv, helper-191)
        waiting = sorted(set(c["ranks"]) - set(c.get("culprits") or ()) - culprits)
        return f"{ranks_text(waiting) if waiting else hit} blocked in {where}"
    return f"{c['kind']} {where}"


def _summary(root: Finding) -> None:
    cons = sorted(root.evidence.get("consequences") or [], key=lambda c: c.get("ts") or 0)
    if not cons:
        return
    root.evidence["consequences"] = cons
    culprits = set(root.culprits)
    parts = list(dict.fromkeys(_say(c, culprits, root.group) for c in cons))
    more = f" and {len(parts) - 4} more" if len(parts) > 4 else ""
    root.message += f". Then: {'; '.join(parts[:4])}{more}"


def _departure_instances(model: TraceModel, f: Finding) -> tuple:
    """The instances a dead or crashed rank was in when it went."""
    r = f.culprits[0]
    if r not in model.ranks:
        return ()
    return tuple(instance_key(model, r, i) for i in model.inflight(r))


def resolve(model: TraceModel, findings: list[Finding], now: int,
            mismatch_rows: dict[tuple[int, str, int], list[int]]) -> list[Finding]:
    """Fold consequences into their root findings (see the module docstring)."""
    # (what the trace lost is no fault of the job's: never a consequence of one, nor a root,
    # whatever ranks it names; rank 0's loss led through its wait to the rank it waited on,
    # and the loss was folded into that hang: "Then: trace_incomplete an op", helper h203)
    errors = [f for f in findings if f.severity == ERROR and f.kind != "trace_incomplete"]
    rest = [f for f in findings if f.severity != ERROR or f.kind == "trace_incomplete"]
    gone: set[int] = set()
    # 1. mismatches absorb what happened at their instances
    mism = {("coll", 1 if f.evidence.get("src") == "fr" else 0, f.group, f.seq): f
            for f in errors if f.kind == "collective_mismatch"}
    by_group = {(k[1], k[2]): f for k, f in mism.items()}
    #: a send and a recv whose sizes differ (``p2p.find_p2p_sizes``), by its pairs' instances:
    #: as a mismatch, the root of what happened there (the receiver Gloo aborted: helper-203)
    sized = {k: f for f in errors if _sized(f) for k in f.instances}
    keep: list[Finding] = []
    #: a rank whose departure a mismatch absorbed -> that mismatch: the root of what names the
    #: rank later, as a departure finding is (rule 3; a world collective failing after a
    #: subgroup's mismatch aborted its ranks stood beside it, blamed on them, helper-176)
    died_in: dict[int, Finding] = {}
    for f in errors:
        if f.kind == "collective_mismatch" or _sized(f):
            keep.append(f)
            continue
        insts = f.instances + (_departure_instances(model, f) if f.kind in DEPARTED else ())
        target = None
        for k in insts:
            if k[0] == "coll" and (k[1], k[2], k[3]) in mismatch_rows:
                target = by_group.get((k[1], k[2]))
                break
            if k in sized:
                target = sized[k]
                break
        if target is None and f.kind in DEPARTED:
            target = next((m for m in mism.values() if f.culprits[0] in m.evidence.get("died_in_it", ())), None)
        if target is not None:
            _absorb(target, f)
            if f.kind in DEPARTED:
                died_in.setdefault(f.culprits[0], target)
        else:
            keep.append(f)
    for k, m in mism.items():  # (and the ranks it holds, stuck in it or failed there: helper-182)
        for r in _held_in(model, k):
            died_in.setdefault(r, m)
    errors = _timed_out(model, _crossed(model, keep))
    _either(errors)
    # (who each rank blocked in a send or recv waits on, as first found: rule 2 may fold its
    # finding into another's, and ``_p2p_cycle`` follows chains of them)
    p2p_peers: dict[int, tuple[int, ...]] = {}
    for f in errors:
        if _p2p_wait(f):
            for v in f.victims:
                p2p_peers.setdefault(v, tuple(f.culprits))
    # 2. follow victims to the ranks they wait on
    chased = _chase(_waits(errors))

    def went_on(c: int, t: int) -> bool:
        """Whether rank ``c`` waits now, or last began an op, only since ``t``."""
        now_in = rankstate.blocked(model, c)
        if now_in:
            return min(rankstate.blocked_since(model, c, i) for i in now_in) > t
        last = model.last_op(c, completed=False)
        return last is not None and int(model.ranks[c].begin[last]) > t

    def roots_of(f: Finding) -> set[int] | None:
        if f.kind == "op_failed" and f.evidence.get("blame", {}).get("reason") == "local":
            return set(f.culprits)  # (its own doing: what its rank waits on later explains none of it)
        if "wait_cycle" in f.evidence:
            # (its ranks wait on each other: one that timed out and crashed led the walk to the
            # other, and the finding named one of them, the other its victim: helper-205)
            return set(f.culprits)
        out: set[int] = set()
        for c in f.culprits:
            if (f.kind in ("op_failed", "collective_mismatch") or _sized(f)) and went_on(c, f.ts):
                # (where it went after the failure, or the call that did not match, explains
                # none of it: a broadcast's root that passed the wrong size went on to the next
                # all_reduce, which failed on the ranks the mismatch aborted, and the mismatch
                # was folded into that failure blamed on them: helper-191, helper-192)
                out.add(c)
                continue
            got = chased(c)
            if got is None:
                return None
            out |= got
        return out

    roots, consequences = [], []
    for f in errors:
        r = roots_of(f)
        if r is not None and r == set(f.culprits):
            roots.append(f)
        else:
            consequences.append((f, r))
    roots.sort(key=lambda f: (_RANK.get(f.kind, 99), f.ts))
    departed = {f.culprits[0] for f in errors if f.kind in DEPARTED}
    # (a failure led elsewhere but to ranks not all gone may hold a crash of it too: rank 1,
    # crashed of W's timeout blamed on ranks 0, 1 and 2, took W's failure in, and rank 2, idle
    # and alive, was named nowhere: helper-192)
    led = [(f, want) for f, want in consequences if f.kind == "op_failed" and want and not want <= departed]
    roots, held = _crashed_of_failures(model, roots + [f for f, _ in led], departed)
    took = {id(t) for t in held.values()}
    for f, want in led:
        if id(f) not in took:  # (no crash of it: a consequence still, as found)
            roots = [t for t in roots if t is not f]
        else:  # (a crash folded into it: the root, naming where it led)
            consequences = [(g, w) for g, w in consequences if g is not f]
            f.evidence["named_through"] = sorted(f.culprits)
            f.culprits = sorted(want)
    roots.sort(key=lambda f: (_RANK.get(f.kind, 99), f.ts))
    rooted = {id(f) for f in roots}
    died_in = {r: t for r, t in died_in.items() if id(t) in rooted}  # (a mismatch folded elsewhere: not)
    gone = {f.culprits[0] for f in roots if f.kind in DEPARTED} | held.keys()
    # A rank blocked for good in a p2p op with a peer the job does not have is, for what
    # waits on it, as a departed rank: their root (it would never come).
    stuck = {f.culprits[0]: f for f in roots
             if f.kind == "unmatched_p2p" and f.evidence.get("no_such_peer") is not None}

    unblamed = [t for t in roots if t.kind == "op_failed" and not t.culprits]  # (few: a lost message's)

    def blameless(f: Finding) -> Finding | None:
        """The failure no rank is to blame for that ``f``'s ranks waited in: the barrier
        blamed on rank 0, held in a recv whose message was lost, stood beside it naming
        nobody, its message "blamed on rank 0" (helper-186)."""
        if f.kind in DEPARTED:  # (a departure is its own, and names its rank)
            return None

        def held(t: Finding) -> bool:  # (in it when ``f`` came: not one begun after, helper-192)
            failed = t.evidence.get("failed") or {}
            return all(int(failed.get(str(c), {}).get("begin_ns", f.ts + 1)) <= f.ts for c in f.culprits)

        return next((t for t in unblamed if t is not f and f.culprits and set(f.culprits) <= t.victims.keys()
                     and held(t)), None)

    def home(f: Finding, want: set[int] | None) -> Finding | None:
        if want is None:  # waiting for its blame: belongs with the failure that will give it
            return next((t for t in roots if t is not f and set(t.instances) & set(f.instances)), None) or \
                blameless(f)
        if not want:
            return blameless(f)
        return next((t for t in roots if t is not f and want <= set(t.culprits)), None) or \
            next((t for t in roots if t is not f and t.kind in DEPARTED and set(t.culprits) & want), None)

    consequences = _roots_first(consequences)
    for f, want in consequences:
        t = home(f, want)
        if t is not None:
            _absorb(t, f)
            continue
        if not want and f.kind in DEPARTED:
            # (a rank that crashed or died while its wait's blame is not known, or none is
            # to blame: its going is its own, and a departure always names its rank; before,
            # it was left naming nobody and the diagnosis failed on it)
            roots.append(f)
            continue
        # no finding names its root yet: keep it, naming the roots instead of victims
        f.evidence["named_through"] = sorted(f.culprits)
        f.culprits = sorted(want or ())
        roots.append(f)
    # 3. departed ranks and timed-out waits absorb the findings that name them
    final: list[Finding] = []
    missing: dict[frozenset[int], dict[str | None, Finding]] = {}  # the missing_ranks kept, by culprits, then group
    unmatched: dict[frozenset[int], Finding] = {}  # the unmatched_p2p kept, by culprits (the peers that never posted)
    failed_on: dict[frozenset[int], Finding] = {}  # the op_failed kept, by culprits (not of its rank's own doing)
    order = {id(t): k for k, t in enumerate(roots)}
    blocked_p2p: dict[int, list[Finding]] = {}  # a rank -> the unmatched_p2p it is blocked in (``_p2p_cycle``)
    for t in roots:  # (or the p2p op it waited in that timed out, blamed on its peer: the same wait, ended)
        if _p2p_wait(t):
            for v in t.victims:
                blocked_p2p.setdefault(v, []).append(t)
    through: dict[frozenset[int], tuple[Finding, frozenset[int], list[int], list[Finding]]] | None = None
    deadlocked: dict[int, Finding] | None = None  # a rank -> the p2p_deadlock naming it (``deadlock_of``)

    def deadlock_of(ranks: list[int]) -> Finding | None:
        """The first p2p_deadlock naming all of ``ranks`` (indexed by rank once: thousands of
        unmatched sends and hangs asked every root)."""
        nonlocal deadlocked
        if not ranks:
            return None
        if deadlocked is None:
            deadlocked = {}
            for t in roots:
                if t.kind == "p2p_deadlock":
                    for r in t.culprits:
                        deadlocked.setdefault(r, t)
        d = deadlocked.get(ranks[0])
        return d if d is not None and set(ranks) <= set(d.culprits) else None
    kept_failed: set[int] = set()  # the p2p timeouts kept (``_p2p_timeout``), by id

    crossing = [t for t in roots if "wait_cycle" in t.evidence]  # (``_crossed``'s cycles of groups, few)

    def crossing_of(ranks: list[int]) -> Finding | None:
        """The first cycle of groups' collectives (``_crossed``) naming all of ``ranks``: what
        names only ranks held in it is its (a barrier of the world timed out on rank 2, its
        ranks 0 and 1 each in another group's all_reduce, stood as the root: helper-196)."""
        return next((t for t in crossing if ranks and set(ranks) <= set(t.culprits)), None)

    def kept_p2p(t: Finding) -> Finding | None:
        """The finding kept for a p2p wait ``t``: the first unmatched_p2p blocked on the same
        peers, or a p2p timeout itself where it is kept."""
        if t.kind == "unmatched_p2p":
            return unmatched.get(frozenset(t.culprits))
        return t if id(t) in kept_failed else None

    def cycles(absent: frozenset[int]) -> tuple[Finding, frozenset[int], list[int], list[Finding]] | None:
        """The unmatched_p2p that ranks missing from a collective fold into, where they are
        in a wait cycle through it (``_p2p_cycle``), or through another group's collective
        they are missing from (rank 2, blocked in the cycle, never comes to either).  Found
        for every missing_ranks at once, when the first is judged (every unmatched_p2p
        judged before it: ``PRIORITY``), so the groups' order does not matter."""
        nonlocal through
        if through is None:
            through = {}
            for g in roots:
                if g.kind == "missing_ranks":
                    t = _p2p_cycle(g, blocked_p2p, order, kept_p2p, p2p_peers)
                    if t is not None:
                        through.setdefault(frozenset(g.culprits), t)
        return through.get(absent)

    departure: dict[int, Finding] = {}  # a rank -> the first departure finding of it
    for t in roots:
        if t.kind in DEPARTED:
            departure.setdefault(t.culprits[0], t)
    # what folds into a departure (or the failure holding one), folded after all: thousands of
    # ranks' failures into one failure naming them all, each fold copied its instances
    gone_into: dict[int, tuple[Finding, list[Finding]]] = {}
    for f in roots:
        target = None
        if f.kind not in DEPARTED and f.kind != "collective_mismatch" and f.culprits and (
                set(f.culprits) <= gone or (f.kind == "missing_ranks" and set(f.culprits) & gone)):
            # (a collective a dead member never entered can never complete, whoever else is late)
            target = min((departure[c] for c in f.culprits if c in departure), key=lambda t: order[id(t)],
                         default=None) or next(held[c] for c in f.culprits if c in held)
            if target is not f:
                gone_into.setdefault(id(target), (target, []))[1].append(f)
                continue
        elif f.kind not in DEPARTED and f.kind != "collective_mismatch" and f.culprits and \
                set(f.culprits) <= died_in.keys() and f.ts >= died_in[f.culprits[0]].ts and \
                f.evidence.get("blame", {}).get("reason") != "local":
            # (what names only ranks a mismatch aborted, after it: its; not a failure of their own
            # before it, helper-180)
            target = died_in[f.culprits[0]]
            gone_into.setdefault(id(target), (target, []))[1].append(f)
            continue
        elif f.kind not in DEPARTED and f.kind != "collective_mismatch" and f.culprits and (
                set(f.culprits) <= stuck.keys() or (f.kind == "missing_ranks" and set(f.culprits) & stuck.keys())):
            target = stuck[next(c for c in f.culprits if c in stuck)]  # (itself, for a stuck rank's own: kept)
        elif f.kind == "missing_ranks":
            # (an op_failed of its rank's own doing, refused as called, only where it is this wait)
            target = crossing_of(f.culprits) or next(
                (t for t in roots if t.kind == "op_failed" and set(t.culprits) == set(f.culprits)
                 and (t.evidence.get("blame", {}).get("reason") != "local" or set(t.instances) & set(f.instances))),
                None) or deadlock_of(f.culprits)
            if target is None:
                _split_deadlock(f, [c for c in f.culprits if deadlock_of([c]) is not None])
                _split_deadlock(f, [c for c in f.culprits if crossing_of([c]) is not None], "in a wait cycle of "
                                "groups' collectives")  # (named twice besides a rank idle: helper-205)
            if target is None and (cycle := cycles(frozenset(f.culprits))) is not None:
                target, peers, idle, chosen = cycle
                if idle:  # (others never came besides, idle: the hang is theirs; the blocked are not)
                    _split_cycle(f, peers, idle, chosen)
                    target = None
                else:
                    _absorb(target, f)
                    for r in peers - set(target.culprits):  # (another cycle's peer, the culprit of its own finding)
                        target.victims.pop(r, None)
                    continue
            target = target or unmatched.get(frozenset(f.culprits)) or next(
                (t for g, t in missing.get(frozenset(f.culprits), {}).items() if g != f.group), None)
            # (the same ranks missing from collectives of several groups, as a 2-d mesh's tp and dp
            # groups both wait on the rank that never came, or never posting the recv of a send
            # besides: one cause, the first finding)
        elif f.kind == "unmatched_p2p" and "no_such_peer" not in f.evidence:
            # (ranks blocked on the same peers: one cause; a send to a rank of a p2p deadlock: its;
            # a send or recv on the ranks a failure is blamed on: rank 1's recv from 2 timed out,
            # blamed on rank 3, which never received 2's send, in the barrier 2 never reaches)
            target = unmatched.get(frozenset(f.culprits)) or deadlock_of(f.culprits) or \
                failed_on.get(frozenset(f.culprits))
            if target is not None and target.kind == "op_failed":
                unmatched.setdefault(frozenset(f.culprits), target)  # (what the send explains, it does)
        elif f.kind == "op_failed" and f.evidence.get("blame", {}).get("reason") != "local":
            # (a failure blamed on ranks held in a p2p deadlock, each other's: the deadlock's;
            # it stood beside it, helper-182: rank 2's all_reduce timed out on ranks 0 and 1;
            # not one that fired before they were in it, helper-185)
            target = deadlock_of(f.culprits) or crossing_of(f.culprits)
            if target is not None and target is not f and _fired(f) < target.ts:
                target = None
        if target is not None and target is not f:
            _absorb(target, f)
        else:
            final.append(f)
            if f.kind == "missing_ranks":  # (looked up by each later one: thousands of groups' hangs)
                missing.setdefault(frozenset(f.culprits), {}).setdefault(f.group, f)
            elif f.kind == "unmatched_p2p" and "no_such_peer" not in f.evidence:
                unmatched.setdefault(frozenset(f.culprits), f)
            elif f.kind == "op_failed" and f.evidence.get("blame", {}).get("reason") != "local":
                failed_on.setdefault(frozenset(f.culprits), f)
            if _p2p_timeout(f):
                kept_failed.add(id(f))
    for target, folded in gone_into.values():
        _absorb(target, *folded)
    final = _chains(final)
    final = _together(final)
    for f in final:
        _summary(f)
        attach_stacks(model, f, now)
    for f in rest:
        if f.severity == ERROR:  # (a trace_incomplete: its ranks' stacks as every error finding has them)
            attach_stacks(model, f, now)
    return sorted(final + rest, key=Finding.sort_key)


def _sized(f: Finding) -> bool:
    """A send and a recv whose sizes differ (``p2p.find_p2p_sizes``): a mismatch of a pair."""
    return f.kind == "unmatched_p2p" and "sizes" in f.evidence


def _held_in(model: TraceModel, key: tuple) -> list[int]:
    """The ranks a mismatch (at ``key``: "coll", space, group, seq) holds: those whose op
    there never completed (still waiting in it, or failed in it).  What later names only
    them is its consequence, as for the ranks it aborted (rule 1): ranks 2 and 3 of a
    subgroup disagreed and waited there; the world all_reduce ranks 0 and 1 then waited in
    timed out, blamed on 2 and 3, an error beside the mismatch (helper-182)."""
    gi = model.coll.get((key[1], key[2]))
    out = []
    for r, i in (gi.at(key[3]) if gi is not None and key[3] is not None else {}).items():
        rt = model.ranks.get(r)
        if rt is not None and (not rt.comp[i] or i in rt.exc):
            out.append(r)
    return out


def _crossed(model: TraceModel, errors: list[Finding]) -> list[Finding]:
    """Hangs in different groups that wait on each other (a collective called on the wrong
    group: rank 0 called a subgroup's all_reduce where ranks 1 and 2 called the world's; 0
    waits in the subgroup's for 1, which waits in the world's for 0): the cycle stops rule
    2's walk, and each named the other's victim (helper-176: rank 1, which did as the
    majority did).  In each such cycle (a strongly connected part of "its culprits wait in
    that hang", over every group: a rank per 8-rank group calling the world's is 513 hangs,
    helper-180), the hangs whose ranks did most as the rest of their group did (waiters less
    absentees held in the cycle) are the root, one finding naming all their absentees; the
    others are its consequences, folded before the walk, so what else waits on rank 1 is led
    through its wait to rank 0 (helper-180: a recv from rank 1 still named it).  Every
    culprit of a consequence waits in a root, or is another hang's outside the cycle (an idle
    rank its own group's hang names; the root may name such an absentee besides).  Where
    every hang of a cycle stands as well as the others and waits only on ranks the cycle
    holds (two ranks that called two groups' collectives in different orders), they are one
    finding naming all their absentees, none of them a victim (``wait_cycle``: the groups);
    before, each stood naming the other's victim (helper-196).  Before, the hang more
    ranks waited in was the root: the world's, whose four waiters outnumbered each group's
    three, named the twelve ranks that did right (a rank per 4-rank group of 16).

    The backend's timeouts end such waits the same way: a collective's failure blamed on
    ranks absent from it (or gone) is the hang it ended, its ranks those that waited, where
    the ranks it blames had entered the other's before it fired; an
    instance's hang and failure (some of its ranks timed out, the rest still wait) are one
    node of the cycle, and a group's nodes score together; the crashes of a consequence's
    failure go with it (``_crashed_of``).  Before, each failure's blame led to the other's
    ranks: two rank_crashed roots, each the other's consequence (helper-182: rank 1 skipped
    one of a pair's all_reduce calls, and rank 0 was left in it)."""
    hangs = [f for f in errors if _hang_like(f)]
    if len(hangs) < 2:
        return errors
    at: dict[tuple, int] = {}  # an instance -> its node: its hang and its failure (part timed out, part waits)
    nodes: list[list[Finding]] = []
    for f in hangs:
        k = at.setdefault(f.instances[0], len(nodes))
        if k == len(nodes):
            nodes.append([])
        nodes[k].append(f)
    victims = [{v for f in fs for v in f.victims} for fs in nodes]
    culprits = [sorted({c for f in fs for c in f.culprits}) for fs in nodes]
    group = [fs[0].group for fs in nodes]
    fired = [None if any(f.kind == "missing_ranks" for f in fs) else min(map(_fired, fs)) for fs in nodes]
    waiting_in: dict[int, list[int]] = {}  # a rank -> the nodes it waits in
    for k, vs in enumerate(victims):
        for v in vs:
            waiting_in.setdefault(v, []).append(k)

    by_rank: dict[int, list[int]] | None = None

    def named_by(r: int) -> list[int]:
        """The nodes that name rank ``r``, waiting or absent (indexed once, when first asked)."""
        nonlocal by_rank
        if by_rank is None:
            by_rank = {}
            for k in range(len(nodes)):
                for x in dict.fromkeys((*culprits[k], *victims[k])):
                    by_rank.setdefault(x, []).append(k)
        return by_rank.get(r, [])

    def held(k: int) -> list[int]:
        """The nodes of other groups that node ``k``'s absentees wait in (had entered before
        ``k``'s failure fired, where it is one: a hang never fires)."""
        return sorted({j for c in culprits[k] for j in waiting_in.get(c, ()) if group[j] != group[k]
                       and (fired[k] is None or entered(j, c) <= fired[k])})

    ops_of: dict[int, dict[int, int]] = {}  # a node -> its instance's ops by rank (``GroupIndex.at``, once)

    def entered(j: int, r: int) -> int:
        """When rank ``r`` entered node ``j``'s collective (0: not known).  Each instance's
        ops looked up once: per culprit, ``at`` made a world's dict each time, and a rank per
        8-rank group of 16,384 calling the world's all_reduce cost 8.5 s (helper-189)."""
        got = ops_of.get(j)
        if got is None:
            k = nodes[j][0].instances[0]
            gi = model.coll.get((k[1], k[2]))
            got = ops_of[j] = gi.at(k[3]) if gi is not None and k[3] is not None else {}
        i, rt = got.get(r), model.ranks.get(r)
        return int(rt.begin[i]) if i is not None and rt is not None else 0

    groups_of: dict[int, list[str]] | None = None  # a rank -> the groups it is a member of (made once, when asked)
    whole_in: dict[tuple[int, int], list[str]] = {}  # (a node, a size) -> the groups of that size waiting whole in it

    def siblings_took(k: int) -> bool:
        """Whether node ``k``'s collective is a step its sibling groups took: groups of as
        many ranks, none of them its (``new_subgroups``' partition of the world), each member
        of one having completed that seq of it as its newest, and waiting now where ``k``'s
        absentees wait.  Then those absentees skipped the step, whatever more ranks wait
        elsewhere: rank 3 skipped its subgroup {2, 3}'s third all_reduce, which {0, 1} ran,
        and went into the world's, where ranks 0, 1 and 3 waited for rank 2, and rank 2,
        which did as its sibling group did, was named (helper-203).  Groups that run apart
        (a pipeline's stages, each with its own tp group, some seqs ahead) are not siblings
        (helper-207: any group of that size, seqs past the step, named the rank that did
        right); found from the ranks waiting where the absentees wait, not every group for
        every node (4,096 ranks: 1.5 s a diagnosis)."""
        nonlocal groups_of
        key = nodes[k][0].instances[0]
        members = model.groups.get(group[k]) if key[0] == "coll" and key[3] is not None else None
        if not members or len(members) >= len(model.ranks):
            return False
        if groups_of is None:
            groups_of = {}
            for name, ms in model.groups.items():
                for r in ms:
                    groups_of.setdefault(r, []).append(name)
        mine, seq = set(members), key[3]
        for j in {j for c in culprits[k] for j in waiting_in.get(c, ())}:
            got = whole_in.get((j, len(members)))
            if got is None:
                count = Counter(name for v in victims[j] for name in groups_of.get(v, ())
                                if len(model.groups[name]) == len(members))
                got = whole_in[(j, len(members))] = [name for name, n in count.items() if n == len(members)]
            for name in got:
                if name == group[k] or mine.intersection(model.groups[name]):
                    continue
                gi = model.coll.get((key[1], name))
                if gi is None or not gi.seqs.n or int(gi.seqs.keys[gi.seqs.n - 1]) != seq:
                    continue  # (not in step: its newest seq is not this one)
                at = gi.at(seq)
                if len(at) == len(members) and all((rt := model.ranks.get(r)) is not None and rt.comp[i]
                                                   and i not in rt.exc for r, i in at.items()):
                    return True
        return False

    elsewhere = {v for f in errors if not _hang_like(f) for v in f.victims}  # (waiting, but in no node)
    folded: set[int] = set()
    crashes: dict[tuple, list[Finding]] | None = None  # an instance -> the crashes in it
    for part in strongly_connected(range(len(nodes)), held):
        if len(part) < 2:
            continue
        inside = {v for k in part for v in victims[k]}
        of_group: dict[str | None, list[int]] = {}
        for k in part:
            of_group.setdefault(group[k], []).append(k)
        score = {g: len({v for k in ks for v in victims[k]}) - len({c for k in ks for c in culprits[k] if c in inside})
                 for g, ks in of_group.items()}
        # (a step its sibling groups took: the hang's absentees skipped it; and so every hang of
        # the cycle that waits on those alone, as a 2-d mesh's tp and dp hangs on the rank that
        # skipped a step of both, helper-186)
        skipped = {c for k in part if siblings_took(k) for c in culprits[k]}
        for g, ks in of_group.items() if skipped else ():
            if all(set(culprits[k]) <= skipped for k in ks):
                score[g] += len(model.ranks) + 1
        best = max(score.values())
        chosen = sorted(k for k in part if score[group[k]] == best)  # (in the errors' order)
        # (of those, one whose absentees all wait in another of them is its consequence: rank 3
        # skipped a step of a 2-d mesh, rank 2 waits for it in tp {2,3}, rank 0 for rank 2 in dp
        # {0,2}; the tie named rank 2 too, helper-186.  Where each waits in another, all stand.)
        waited = {v: k for k in chosen for v in victims[k]}
        held_in = [k for k in chosen if all(waited.get(c, k) != k for c in culprits[k])]
        waits = set(waited)  # (the demoted's waiters too: they wait, through them, on the rest)
        if held_in and len(held_in) < len(chosen):
            chosen = [k for k in chosen if k not in held_in]
        grew = True  # (and those of a hang that waits only on ranks that wait, through others, on the root)
        while grew:
            grew = False
            for k in part:
                if k not in chosen and set(culprits[k]) <= waits and not victims[k] <= waits:
                    waits |= victims[k]
                    grew = True
        others = [k for k in part if k not in chosen]
        # (a consequence's absentee the root does not hold may be another hang's, outside the
        # cycle: an idle rank 4 whose group waits for it; helper-184: the cycle was skipped; or
        # wait elsewhere, as a rank that crashed of a failure blamed on the root's: helper-186)
        inner = set(part)
        if not others and not all(c in inside for k in chosen for c in culprits[k]):
            continue  # (a tie whose absentees are not all held in it: another's hang may explain them)
        if any(not (c in waits or c in elsewhere or any(j not in inner for j in named_by(c)))
               for k in others for c in culprits[k]):
            continue
        root, *more = (f for k in chosen for f in nodes[k])
        then = [f for k in others for f in nodes[k]]
        if more and not others:  # (each waits in one for another: the ranks of the cycle are each other's)
            blamed = sorted({c for f in (root, *more) for c in f.culprits})
            groups = sorted({str(group[k]) for k in chosen})
            root.message = (f"{ranks_text(blamed)} called the collectives of groups {', '.join(groups)} in different "
                            f"orders: each waits in one for another (a wait cycle); first: {root.message}")
            _absorb(root, *more)
            root.culprits = blamed
            root.evidence["wait_cycle"] = groups
            for c in blamed:
                root.victims.pop(c, None)
        elif more:
            blamed = sorted({c for f in (root, *more) for c in f.culprits})
            if len(waiting := {group[k] for k in chosen}) > 1:
                root.message = (f"{ranks_text(blamed)} is in another group's collective while {len(waiting)} groups "
                                f"wait for it; first: {root.message}" if len(blamed) == 1 else
                                f"{ranks_text(blamed)} are each in another group's collective while "
                                f"{len(waiting)} groups wait for them; first: {root.message}")
            _absorb(root, *more)
            root.culprits = blamed
        if crashes is None:  # (indexed once: a cycle per 8-rank group of 4,096 ranks)
            crashes = {}
            for f in errors:
                if f.kind == "rank_crashed" and f.instances:
                    crashes.setdefault(f.instances[0], []).append(f)
        # (a cycle's own failures too: its ranks timed out in it and crashed of it, together)
        crashed = [c for f in (then if others else (root, *more, *then)) if f.kind == "op_failed"
                   for c in crashes.get(f.instances[0], ()) if _crashed_of(model, c)]
        if then or crashed:
            _absorb(root, *then, *crashed)
        folded |= {id(f) for f in (*more, *then, *crashed)}
    return [f for f in errors if id(f) not in folded] if folded else errors


def _hang_like(f: Finding) -> bool:
    """A collective's hang, or its failure blamed on ranks that never came or left (the
    hang its timeout ended): what ``_crossed`` finds cycles of.  Not a failure of its
    rank's own doing, a mismatch's, or one not blamed yet."""
    if f.kind == "missing_ranks":
        return bool(f.culprits)
    return f.kind == "op_failed" and bool(f.culprits) and bool(f.instances) and f.instances[0][0] == "coll" and \
        f.evidence.get("blame", {}).get("reason") not in ("local", "mismatch", "pending", "unknown")


def _timed_out(model: TraceModel, errors: list[Finding]) -> list[Finding]:
    """A p2p deadlock the backend's timeouts ended (each rank's recv from the next timed out):
    each failed op is blamed on its peer, whose own failed op is blamed on the next, back to
    the first, waits that overlapped.  The cycle stops rule 2's walk, and each stood as an
    error naming the next rank (helper-182: live, one p2p_deadlock; after, an op_failed per
    rank).  They are one ``p2p_deadlock`` of those ranks (``p2p.timed_out``), the failures its
    consequences, found before the walk; so are the crashes of those failures (``_crashed_of``:
    the ranks whose exception was not caught; their crash together was the root, and the
    deadlock its consequence; where some ranks crashed, a crash names the next rank it waited
    on, and the walk blamed a rank that never crashed: helper-185), but not a crash of
    something else later."""
    outs: dict[int, Finding] = {}  # a failed rank -> its p2p timeout
    for f in errors:
        failed = f.evidence.get("failed") if _p2p_timeout(f) else None
        if isinstance(failed, dict) and len(failed) == 1:
            (r, brief), = failed.items()
            if isinstance(brief, dict) and "begin_ns" in brief and "failed_ns" in brief:
                outs.setdefault(int(r), f)
    if len(outs) < 2:
        return errors
    crashes: dict[int, list[Finding]] = {}  # a rank -> its crashes (looked up by rank: 8k deadlocked pairs)
    for f in errors:
        if f.kind == "rank_crashed" and f.culprits:
            crashes.setdefault(f.culprits[0], []).append(f)
    folded: set[int] = set()
    made: list[Finding] = []
    for part in strongly_connected(sorted(outs), lambda r: [c for c in outs[r].culprits if c in outs]):
        fs = [outs[r] for r in sorted(part)]
        briefs = {r: outs[r].evidence["failed"][str(r)] for r in part}
        if len(part) < 2 or any(not set(f.culprits) <= set(part) for f in fs) or \
                max(b["begin_ns"] for b in briefs.values()) >= min(b["failed_ns"] for b in briefs.values()):
            continue  # (not each other's alone, or not waiting at once)
        seen: list[int] = []  # (from the lowest rank, each to the peer its timeout is blamed on)
        r = min(part)
        while r not in seen:
            seen.append(r)
            r = outs[r].culprits[0]
        cycle = seen[seen.index(r):]
        d = timed_out([briefs[c] for c in cycle], sorted(part))
        ops = {k for f in fs for k in f.instances[:1]}
        crashed = []
        for f in (f for r in sorted(part) for f in crashes.get(r, ())):
            if f.instances[:1] and f.instances[0] in ops:
                if _crashed_of(model, f):
                    crashed.append(f)
                else:  # (a crash of something else after its wait ended: it waits on nobody, its own)
                    f.victims.pop(f.culprits[0], None)
        _absorb(d, *fs, *crashed)
        folded |= {id(f) for f in (*fs, *crashed)}
        made.append(d)
    return [f for f in errors if id(f) not in folded] + made if made else errors


def _fired(f: Finding) -> int:
    """When a failure fired: the first of its ranks' ops to fail (its own time where its
    evidence does not say)."""
    failed = f.evidence.get("failed")
    times = [int(b["failed_ns"]) for b in failed.values() if isinstance(b, dict) and "failed_ns" in b] \
        if isinstance(failed, dict) else []
    return min(times) if times else f.ts


def _either(findings: list[Finding]) -> None:
    """An any-source recv waits on whichever member sends first (``Finding.any_of``).  A
    member whose own wait leads back to the recv's rank (the two in one strongly connected
    part of the wait graph) cannot be that one before the recv is served: where some member
    outside can, the recv waits on those alone, and names them alone (rank 0's any-source
    recv, rank 2 in the barrier rank 0 never reaches, rank 1 idle: rank 1, one error;
    before, the recv named ranks 1 and 2 and the barrier's hang ranks 0 and 1, two errors
    each naming a victim).  Where every member waits back on it, they wait on each other:
    all stay.  One walk of the graph from the recvs' ranks (``strongly_connected``)."""
    ors = [f for f in findings if f.any_of]
    if not ors:
        return
    waits_on = _waits(findings)
    comp = {w: k for k, part in enumerate(strongly_connected(
        sorted({v for f in ors for v in f.any_of}), lambda v: sorted(waits_on.get(v, ())))) for w in part}
    for f in ors:
        for v in sorted(f.any_of):
            on = f.victims.get(v, ())
            out = tuple(p for p in on if comp.get(p) != comp[v])
            if not out or len(out) == len(on):
                continue
            back = [p for p in on if p not in out]
            f.victims[v] = out
            f.culprits = sorted(set(f.culprits) - set(back))
            f.message += (f"; {ranks_text(back)} {'waits' if len(back) == 1 else 'wait'} on rank {v} in turn"
                          " and cannot send first")


def _crashed_of_failures(model: TraceModel, roots: list[Finding], departed: set[int]
                         ) -> tuple[list[Finding], dict[int, Finding]]:
    """A rank that crashed on a failure blamed on it and on others besides (its timeout, in
    a wait it made a cycle of, while another rank never came at all) crashed of that
    failure: its crash folds into the failure's ``op_failed``, which names it already (it
    stood beside it, naming rank 3 twice).  Alone to blame, its crash is the root
    (``failures.find_crashes``: "its own doing"), and so where every other rank blamed
    departed too (``departed``: the ranks of every crash or death found, folded or not):
    their departures explain the failure, and the failure folded into one of them took the
    crash with it (helper-98, helper-99).  Only a crash of that failure (``_crashed_of``).
    Returns the roots left, and each such rank's failure: the root of what its departure
    caused."""
    failed: dict[tuple, Finding] = {}
    for t in roots:
        if t.kind == "op_failed":
            for k in t.instances:
                failed.setdefault(k, t)
    if not failed:
        return roots, {}
    keep: list[Finding] = []
    held: dict[int, Finding] = {}
    blamed: dict[int, tuple[set[int], bool]] = {}  # a failure -> its culprits, and whether one did not depart
    for f in roots:
        t = next((failed[k] for k in f.instances if k in failed), None) \
            if f.kind == "rank_crashed" and not f.victims else None
        if t is not None and id(t) not in blamed:  # (once a failure: 8k ranks crashed of one)
            blamed[id(t)] = set(t.culprits), any(c not in departed for c in t.culprits)
        if t is not None and set(f.culprits) < blamed[id(t)][0] and blamed[id(t)][1] and _crashed_of(model, f):
            _absorb(t, f)
            held.setdefault(f.culprits[0], t)
        else:
            keep.append(f)
    return keep, held


def _crashed_of(model: TraceModel, crash: Finding) -> bool:
    """Whether a rank crashed of the failed op its crash names (its instance: a failure
    finding lists only its first instance's ops, and a rank may fail there and again later):
    it raised what the op raised, or went as the op failed (a handler that raised its own
    exception); not a different exception long after (it went on, and crashed of
    something else)."""
    r = crash.culprits[0]
    rt = model.ranks.get(r)
    i = next((i for i in rt.exc if instance_key(model, r, i) == crash.instances[0]), None) \
        if rt is not None and crash.instances else None
    if i is None:
        return False
    said, raised = _said(crash.evidence.get("exc") or ""), _said(rt.exc[i])
    if said and raised and (said.startswith(raised) or raised.startswith(said)):
        return True
    return int(crash.evidence.get("exit_ns") or crash.ts) - model.failed_ns(r, i) <= SLACK_NS


def _said(exc: str) -> str:
    """What an exception said, as its op's record and its crash's both hold it: the first
    line without its type (the native hook records a C++ ``what()``, the crash Python's
    ``DistBackendError: ...``) and without Gloo's source location."""
    return re.sub(r"^[\w.]+: ", "", first_line(exc, 10_000))


def _roots_first(consequences: list[tuple[Finding, set[int] | None]]) -> list[tuple[Finding, set[int] | None]]:
    """Of the consequences that lead to the same roots, the first kept (the others fold
    into it) is one naming those roots itself, where one does: of a chain of sends into a
    wait cycle, the link at the cycle (rank 3 sends to 1, which waits in the all_reduce rank
    4 never enters, sending to 1), not one further out naming a blocked rank (rank 2 sends
    to 3: rank 3 was named; helper-96), and of those a hang last: a cycle's unmatched send
    before another group's hang on the rank it sends to (which, kept, took the send in and
    left the cycle unseen; helper-94); a departure after all (``_first_of``).  Each keeps
    its place otherwise (a failure before the crashes of it: by ``PRIORITY`` a crash went
    first, and named through the others' blame, a crash of ranks that never crashed;
    helper-97's fuzzer)."""
    slots: dict[frozenset[int] | None, list[int]] = {}
    for k, (_, want) in enumerate(consequences):
        slots.setdefault(None if want is None else frozenset(want), []).append(k)
    out = list(consequences)
    for want, at in slots.items():
        if want is not None and len(at) > 1:
            ranked = sorted(at, key=lambda k: _first_of(consequences[k][0], want))
            for k, j in zip(at, ranked, strict=True):
                out[k] = consequences[j]
    return out


def _first_of(f: Finding, want: frozenset[int]) -> int:
    """``_roots_first``'s order: a finding naming the roots itself, a hang after the rest;
    then one naming others; a departure last (kept first, it took its roots' names: a crash
    of ranks that never crashed; helper-98)."""
    if f.kind in DEPARTED:
        return 3
    if not set(f.culprits) <= want:
        return 2
    return int(f.kind == "missing_ranks")


def _chains(final: list[Finding]) -> list[Finding]:
    """An ``unmatched_p2p`` whose peers are themselves blocked in another's send or recv
    that its peer never posted (rank 1 sends to 2, which sends to 3, which waits in a
    collective) is that one's consequence, followed to the chain's end: rule 2 cannot
    walk it where the chain closes through a collective (a cycle stops its walk).  Each
    finding's end is found once (a 16k-rank chain: linear); a cycle of them (a deadlock's,
    judged apart) folds nothing."""
    chain = [g for g in final if g.kind == "unmatched_p2p" and "no_such_peer" not in g.evidence]
    if len(chain) < 2:
        return final
    stuck_on: dict[int, Finding] = {}
    for g in chain:
        for v in g.victims:
            if v not in g.culprits:
                stuck_on.setdefault(v, g)

    def step(g: Finding) -> Finding | None:
        peers = _peers(g)
        nxt = stuck_on.get(peers[0]) if peers else None
        return nxt if nxt is not None and nxt is not g and all(stuck_on.get(c) is nxt for c in peers) else None

    end_of: dict[int, Finding | None] = {}  # id -> the chain's end (None: a cycle, no fold)
    for f in chain:
        path: list[Finding] = []
        on: set[int] = set()
        g: Finding | None = f
        while True:
            assert g is not None
            if id(g) in end_of:
                end = end_of[id(g)]
                break
            if id(g) in on:
                end = None
                break
            on.add(id(g))
            path.append(g)
            nxt = step(g)
            if nxt is None:
                end = g
                break
            g = nxt
        for h in path:
            end_of[id(h)] = end
    links: dict[int, list[Finding]] = {}  # id of a chain's end -> its links, in order
    ends: dict[int, Finding] = {}
    for f in chain:
        end = end_of[id(f)]
        if end is not None and end is not f:
            links.setdefault(id(end), []).append(f)
            ends[id(end)] = end
    gone: set[int] = set()
    for k, folded in links.items():
        _absorb(ends[k], *folded)
        gone.update(map(id, folded))
    return [f for f in final if id(f) not in gone]


def _peers(t: Finding) -> list[int]:
    """The peers an ``unmatched_p2p`` names as never posting: its culprits, or those it was
    named through (rule 2 led them on to where their wait ends)."""
    return t.evidence.get("named_through") or t.culprits


def _p2p_wait(f: Finding) -> bool:
    """A finding of a rank blocked in a send or recv whose peer never posted its side: an
    ``unmatched_p2p`` (but for a peer the job does not have) or such a wait timed out."""
    return f.kind == "unmatched_p2p" and "no_such_peer" not in f.evidence or _p2p_timeout(f)


def _p2p_timeout(f: Finding) -> bool:
    """An ``op_failed`` of a send or recv whose timeout is blamed on its peer that never
    posted: the wait an ``unmatched_p2p`` named, ended by the timeout."""
    return f.kind == "op_failed" and bool(f.instances) and f.instances[0][0] == "p2p" and \
        "absent" in f.evidence.get("blame", {}).get("reason", "")


def _p2p_cycle(f: Finding, blocked_p2p: dict[int, list[Finding]], order: dict[int, int],
               kept: Callable[[Finding], Finding | None], p2p_peers: dict[int, tuple[int, ...]]
               ) -> tuple[Finding, frozenset[int], list[int], list[Finding]] | None:
    """The ``unmatched_p2p`` a ``missing_ranks`` (``f``) folds into where they are one wait
    cycle: every rank that never entered the collective is blocked in a send or recv whose
    peers, which never posted the matching op, wait in that collective (rank 2 sends to 3,
    which went into the barrier rank 2 never reaches), or are blocked so in turn (2 sends to
    3, 3 to 4, in the barrier).  The p2p finding says why they never came: the first of
    those findings that is kept (``kept``: the first of those blocked on the same peers; a
    send or recv that timed out so, ``_p2p_timeout``), not one folded elsewhere; and the
    ranks waiting in the collective those waits end at (several cycles through one
    collective: each other's finding names its own peer, no victim of the one the hang
    folds into); the ranks that never came otherwise (idle: then the hang is theirs,
    ``_split_cycle``); and the p2p findings of the blocked ones.  ``blocked_p2p``: rank ->
    the unmatched_p2p it is blocked in; ``order``: the roots' order; ``p2p_peers``: rank ->
    the peers its send or recv waits on, as first found (a link of a chain whose finding
    rule 2 folded away).  None: no such cycle.  Judges; changes nothing (it is asked of
    every hang, some later folded elsewhere)."""
    waiting = f.victims.keys()
    memo: dict[int, tuple[Finding | None, frozenset[int]] | None] = {}

    def waits_of(a: int) -> list[tuple[Finding | None, tuple[int, ...]]]:
        got: list[tuple[Finding | None, tuple[int, ...]]] = [
            (t, tuple(_peers(t))) for t in sorted(blocked_p2p.get(a, ()), key=lambda t: order[id(t)])]
        if a in p2p_peers:
            got.append((None, p2p_peers[a]))
        return got

    def into(a: int) -> tuple[Finding | None, frozenset[int]] | None:
        """Where ``a``'s first p2p wait that ends in the collective ends: the finding at
        that end (the send or recv whose peers wait in it; None: known only from
        ``p2p_peers``) and those peers.  None: no such wait (idle, or a cycle of waits
        outside the collective).  A walk with its own stack: a chain of any length."""
        if a in memo:
            return memo[a]
        on = {a}
        # frames: [rank, its waits, which wait, which peer of it, ends so far, end finding]
        stack: list[list[Any]] = [[a, waits_of(a), 0, 0, set(), None]]
        while stack:
            fr = stack[-1]
            node, waits, k, j = fr[0], fr[1], fr[2], fr[3]
            if k >= len(waits):  # (no wait of it ends in the collective)
                memo[node] = None
                on.discard(node)
                stack.pop()
                continue
            t, peers = waits[k]
            if j >= len(peers):  # (every peer of this wait ends in it)
                memo[node] = (fr[5] if fr[5] is not None else t, frozenset(fr[4]))
                on.discard(node)
                stack.pop()
                continue
            p = peers[j]
            if p in waiting or p in memo:
                res = (t, frozenset((p,))) if p in waiting else memo[p]
                if res is None:  # (this wait leads nowhere in it: the next one)
                    fr[2], fr[3], fr[4], fr[5] = k + 1, 0, set(), None
                else:
                    fr[4] |= res[1]
                    if fr[5] is None:
                        fr[5] = res[0] if res[0] is not None else t
                    fr[3] = j + 1
            elif p in on:  # (back to a rank on the way: a cycle outside the collective)
                fr[2], fr[3], fr[4], fr[5] = k + 1, 0, set(), None
            else:
                on.add(p)
                stack.append([p, waits_of(p), 0, 0, set(), None])
        return memo[a]

    chosen: list[Finding] = []
    idle: list[int] = []
    peers: set[int] = set()
    for a in f.culprits:
        got = into(a)
        if got is None:
            idle.append(a)
            continue
        if got[0] is not None:
            chosen.append(got[0])
        peers |= got[1]
    if not chosen:
        return None
    if idle:
        return chosen[0], frozenset(peers), idle, chosen
    if len(chosen) + len(idle) < len(f.culprits):
        return None  # (a blocked rank known only from its folded finding: no p2p finding says why here)
    first = next((k for t in sorted(chosen, key=lambda t: order[id(t)]) if (k := kept(t)) is not None), None)
    if first is None:
        return None
    return first, frozenset(peers), idle, chosen


def _split_cycle(f: Finding, peers: frozenset[int], idle: list[int], chosen: list[Finding]) -> None:
    """A ``missing_ranks`` some of whose absent ranks are blocked in a wait cycle through it
    (``_p2p_cycle``) and the rest idle: it names the idle ones; the blocked ones are the
    cycle's victims, and the cycle's peers (waiting here) its culprits, not this one's
    victims (rank 2 sends to 3, which waits in the barrier; rank 1 never came: two causes,
    and the hang named ranks 1 and 2, rank 2 blocked).  The p2p findings stand on their
    own: named through the idle ranks, they name their peers again (``chosen``)."""
    for t in chosen:
        if "named_through" in t.evidence:
            t.culprits = t.evidence.pop("named_through")
    blocked = [r for r in f.culprits if r not in idle]
    _narrow(f, list(idle), peers, f"{ranks_text(blocked)} {'is' if len(blocked) == 1 else 'are'} blocked in a wait cycle through it")


def _split_deadlock(f: Finding, held: list[int], where: str = "in a p2p deadlock") -> None:
    """A ``missing_ranks`` some of whose culprits are ranks of a ``p2p_deadlock`` (``held``;
    or of a wait cycle of groups' collectives, ``_crossed``) and the rest not (idle): it
    names the rest; the deadlock's ranks are that finding's culprits, not this one's (rank 0
    in the barrier; ranks 1 and 2 send to each other, rank 3 to 2, rank 4 idle: the hang
    named ranks 1, 2 and 4 beside the deadlock naming 1 and 2).  All of them held: it folds
    into the deadlock instead (``deadlock_of``, ``crossing_of``)."""
    if not held or len(held) == len(f.culprits):
        return
    rest = [r for r in f.culprits if r not in held]
    _narrow(f, rest, held, f"{ranks_text(held)} {'is' if len(held) == 1 else 'are'} {where}")


def _narrow(f: Finding, culprits: list[int], elsewhere: Iterable[int], why: str) -> None:
    """Name only ``culprits`` in ``f``: the ranks another finding holds (``elsewhere``) are
    no victims here either, every victim left waits on the culprits kept, and the message
    says ``why`` the others are not named (one rewrite for ``_split_cycle`` and
    ``_split_deadlock``)."""
    f.culprits = culprits
    for r in elsewhere:
        f.victims.pop(r, None)
    on = tuple(culprits)
    for v in f.victims:
        f.victims[v] = on
    f.message += f"; {why}"


#: Departures of one manner each within this of the one before are one finding (``_together``);
#: a dead rank's time is its last sign of life, up to a sample interval before it went: added.
TOGETHER_NS = 2_000_000_000
#: Hosts named in a together finding's message; past this, a count.
NAMED_HOSTS = 3


def _manner(f: Finding) -> tuple | None:
    """How a departed rank went, as ranks going together share it: for a crash, its signal
    (however the record names it) and what it said (digits aside: devices, addresses and
    ports differ); for a dead rank, killed and how, or gone (silent or vanished: how it was
    noticed, not how it went).  None for a finding that is not one rank's own departure."""
    if f.kind not in DEPARTED or len(f.culprits) != 1 or "named_through" in f.evidence:
        return None
    ev = f.evidence
    if f.kind == "rank_crashed":
        said = death_message({"exc": ev.get("exc") or ""}, 200)
        return (f.kind, ev.get("reason"), signal_name(ev.get("signal") or ""), re.sub(r"\d+", "#", said))
    return (f.kind, "killed", ev.get("cause")) if ev.get("how") == "killed" else (f.kind, "gone")


def went_together(a: Finding, b: Finding) -> bool:
    """Two departure findings (of two diagnoses) are one: the same kind, and a rank in
    common that went at the same moment in both, within ``TOGETHER_NS`` (its departure may
    move as its stream is read).  The ranks' streams are read in any order: the last of a
    long run may be read first, alone, and the run found later starts seconds before it; a
    rank that crashes again after a restart is a new finding, whichever rank of a run it is."""
    if a.kind != b.kind or a.kind not in DEPARTED:
        return False
    blur = max(_blur(a), _blur(b))
    when_a, when_b = _gone(a), _gone(b)
    small, large = (when_a, when_b) if len(when_a) <= len(when_b) else (when_b, when_a)
    return any(r in large and abs(t - large[r]) <= blur for r, t in small.items())


def _gone(f: Finding) -> dict[int, int]:
    """When each culprit of a departure finding went."""
    return f.gone or dict.fromkeys(f.culprits, f.ts)


def _blur(f: Finding) -> int:
    every = f.evidence.get("sample_interval_s") if f.kind == "dead_rank" else None
    return TOGETHER_NS + int(float(every or 0) * 1e9)


def _together(findings: list[Finding]) -> list[Finding]:
    """Rule 4 (module docstring): departures of one manner, in runs of ``TOGETHER_NS``."""
    out: list[Finding] = []
    manners: dict[tuple, list[Finding]] = {}
    for f in findings:
        m = _manner(f)
        if m is None:
            out.append(f)
        else:
            manners.setdefault(m, []).append(f)
    for fs in manners.values():
        fs.sort(key=lambda f: (f.ts, f.culprits[0]))
        run = [fs[0]]
        for f in fs[1:]:
            if f.ts - run[-1].ts <= max(_blur(f), _blur(run[-1])):
                run.append(f)
            else:
                out.append(_fold(run))
                run = [f]
        out.append(_fold(run))
    return out


def _fold(run: list[Finding]) -> Finding:
    """One finding for ranks that departed together: the first one's, naming them all."""
    first = run[0]
    if len(run) == 1:
        return first
    hosts: dict[str, list[int]] = {}
    for f in run:
        hosts.setdefault(str(f.evidence.get("host") or "?"), []).extend(f.culprits)
    culprits = sorted(r for rs in hosts.values() for r in rs)
    folded = set(culprits)
    victims: dict[int, tuple[int, ...]] = {}
    for f in run:
        victims.update((v, w) for v, w in f.victims.items() if v not in folded)
    cons = [c for f in run for c in f.evidence.get("consequences") or []]
    first_rank = first.culprits[0]
    # the first to go first (its stack is shown first, the console goes to its op), the rest
    # in order; the JSON sorts them all
    first.culprits = [first_rank, *(r for r in culprits if r != first_rank)]
    first.ranks = sorted({r for f in run for r in f.ranks})
    first.victims = victims
    first.instances = tuple(dict.fromkeys(k for f in run for k in f.instances))
    first.gone = {r: f.ts for f in run for r in f.culprits}
    if cons:
        first.evidence["consequences"] = cons
    by_host = {h: sorted(rs) for h, rs in sorted(hosts.items(), key=lambda kv: min(kv[1]))}
    first.evidence["together"] = {"first": first_rank, "hosts": by_host}
    named = [h for h in by_host if h != "?"]
    on = ("" if not named else f" on host {named[0]}" if len(named) == 1 else
          f" on hosts {', '.join(named)}" if len(named) <= NAMED_HOSTS else f" on {len(named):,} hosts")
    if named and "?" in by_host:
        on += " and hosts not known"
    verb = "crashed" if first.kind == "rank_crashed" else "went away"
    first.message = f"{ranks_text(culprits)} {verb} together{on}; first {first.message}"
    return first


#: A wait set larger than this is one node of the wait graph (``_waits``)
SHARED_WAIT = 16


def _waits(findings: list[Finding]) -> dict[int, set[int]]:
    """The wait graph of the findings' victims: rank -> the ranks it waits on.  A large wait
    set that victims share (one object: every rank waiting in a collective that thousands
    never entered) is a node of its own, numbered below 0 (no rank is), that they all wait
    on and that waits on its ranks: the graph grows with the ranks, not with their product
    (a 16k job killed in a collective half its ranks had entered: 64 M edges, ~36 s a
    diagnosis).  Who waits on whom through it is what the edges themselves would say."""
    waits_on: dict[int, set[int]] = {}
    shared: dict[int, int] = {}  # id of a wait set -> its node
    for f in findings:
        for v, on in f.victims.items():
            if len(on) > SHARED_WAIT:
                node = shared.get(id(on))
                if node is None:  # (each set is alive while ``findings`` are: ids stay theirs)
                    node = shared[id(on)] = -1 - len(shared)
                    waits_on[node] = set(on)
                waits_on.setdefault(v, set()).add(node)
            else:
                waits_on.setdefault(v, set()).update(on)
    return waits_on


def _chase(waits_on: dict[int, set[int]]) -> Callable[[int], set[int] | None]:
    """Rule 2's walk, for every rank at once: a function from a rank to the ranks its wait
    ends at (itself when it waits on nobody), or None when a rank on the way waits with
    its blame not known yet.

    The wait graph's strongly connected components, in the order Tarjan's algorithm
    finishes them (a component after every one it waits on), each judged once: a rank
    outside any cycle ends where the ranks it waits on end; a rank in a cycle is its own
    culprit (the cycle stops the walk there) and also ends where the cycle's ranks wait
    outside it.  Linear in the graph, where following every path from every culprit was
    exponential once thousands of ranks waited on each other (a wide job's hang).  A
    cycle met from outside stops at the rank it is entered by.

    A rank no rank waits on (16k ranks waiting in one collective, but the ranks they wait
    on) is in no cycle and nothing depends on it: a component of its own, judged after all
    the rest, with no step of the walk (that was most of a 16k-rank hang's diagnosis)."""
    waited_on: set[int] = set()
    for on in waits_on.values():
        waited_on.update(on)
    comps = strongly_connected((r for r in waits_on if r in waited_on), lambda v: sorted(waits_on.get(v, ())))
    comp = {w: k for k, members in enumerate(comps) for w in members}
    for v in waits_on:  # (the ranks no rank waits on, last: they wait on components judged before)
        if v not in waited_on:
            comp[v] = len(comps)
            comps.append([v])
    # per component: where its ranks' waits outside it end (None: a blame not known yet)
    exits: list[set[int] | None] = []
    cyclic: list[bool] = []
    through: dict[int, set[int] | None] = {}  # a shared wait set's node -> ``ends`` of it

    def ends(w: int) -> set[int] | None:
        """Where rank ``w``'s wait ends, its component judged already (never to be changed:
        it may be a component's own set)."""
        if w not in waits_on:
            return {w}
        out = exits[comp[w]]
        if out is None or not cyclic[comp[w]]:
            return out
        if w >= 0:
            return {w} | out
        got = through.get(w)
        if got is None:  # (a cycle entered through a shared set: at its ranks in the cycle)
            got = through[w] = out | {r for r in waits_on[w] if comp[r] == comp[w]}
        return got

    for k, members in enumerate(comps):
        cyclic.append(len(members) > 1 or members[0] in waits_on.get(members[0], ()))
        out: set[int] | None = set()
        for v in members:
            if v not in waits_on:
                continue  # (a rank waiting on nobody: a component of its own)
            if not waits_on[v]:
                out = None
                break
            for w in waits_on[v]:
                if comp.get(w) == k:  # (a rank waiting on nobody may have none: ``ends`` needs none)
                    continue
                got = ends(w)
                if got is None:
                    out = None
                    break
                if len(members) == 1 and len(waits_on[v]) == 1:
                    out = got  # (all it waits on: shared, not copied, as thousands may wait on one set)
                else:
                    out |= got
            if out is None:
                break
        exits.append(out)
    return ends
