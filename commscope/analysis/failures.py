"""Failure findings: ops that raised (``op_failed``) and ranks that crashed (``rank_crashed``).

An op that raised is blamed on the rank that caused it, never on the ranks it hurt.  The
failures of one cross-rank instance (a collective's (group, seq), a p2p message) are
judged together, from the ones that happened while every member that had arrived was
still there ("primary" failures; a rank arriving at an instance that already broke fails
as a consequence):

* ``monitored_barrier`` names the ranks that did not arrive: those;
* the group's timeout fired: the members that had not entered the instance by then, but
  for one kept away by a send or recv whose peer had not posted its side: that peer;
* a connection closed: the members that left first (an exit, a crash, or silence since
  the failure; see ``TraceModel.peers_gone``), or, while more than one member could have
  left and none is known yet, nobody (the finding says it is waiting to hear from them);
* any other exception: the op raised on its own rank, which is then the culprit;
* at an instance where the ranks called mismatched collectives: the mismatch (merged into
  that finding by ``rootcause``).

A crash is a consequence when the rank died of the exception a failed op raised and that
failure is blamed on other ranks; ``rootcause`` then folds it into the root finding.
"""

from __future__ import annotations

import bisect
import re
from typing import Any, NamedTuple

from rich.console import RenderableType
from rich.text import Text

from commscope.analysis import evidence, rankstate, stacks
from commscope.analysis.errors import (
    FAULTED,
    INTERRUPTED,
    NAMED,
    PEER_GONE,
    RAISED_FROM,
    RELAYED,
    TIMEOUT,
    first_line,
)
from commscope.analysis.evidence import ABSENT, Evidence, record
from commscope.analysis.findings import (
    WARNING,
    Finding,
    activity,
    doing_instead,
    no_such_peer_text,
    op_brief,
    rank_stack,
    ranks_text,
    secs,
)
from commscope.analysis.model import (
    CONTAINER,
    NESTED,
    P2P,
    SEND,
    SPACE_FR,
    SPACE_NATIVE,
    TraceModel,
    signal_label,
)
from commscope.analysis.rankstate import ARRIVAL_SLACK_NS, SLACK_NS, snapshot
from commscope.analysis.vocab import describe_kill
from commscope.events import DESTROYED

#: Failed instances reported in full per finding; more with the same blame are counted.
FAILED_REPORT = 5


@record
class OpFailed(Evidence):
    """op_failed: the first failed instance on each rank, whom it is blamed on and why."""

    failed: dict[str, dict[str, Any]]  # rank -> findings.op_brief + failure, failed_ns, after_s
    blame: dict[str, Any]  # reason, culprits, text
    culprit_activity: dict[str, dict[str, Any]]  # culprit -> findings.activity
    later_failures: int = ABSENT  # later failed instances with the same blame
    later: list[dict[str, Any]] = ABSENT  # the first FAILED_REPORT of them: instance, ranks, exc

    def render(self, f: Finding) -> list[RenderableType]:
        failed = evidence.values(self.failed)
        parts: list[RenderableType] = [
            evidence.table("failed on", ["rank", "op", "seq", "kind", "after", "exception"],
                    [[x.get("rank"), x.get("op"), x.get("seq"), x.get("failure"), f"{float(x.get('after_s', 0)):.2f} s",
                      first_line(x.get("exc") or "", 100)] for x in failed])]
        parts.append(Text("blame  ", style=evidence.DIM)
                     + Text(f"{self.blame.get('text', '?')}", style=f"bold {evidence.WARN}"))
        for c, act in self.culprit_activity.items():
            parts.append(Text(doing_instead([int(c)], {str(c): {"text": act.get("text", "?")}}), style=evidence.GREY))
        if self.later_failures:
            parts.append(Text(f"{self.later_failures} later failed instances with the same blame",
                              style=evidence.FAINT))
        return parts


@record
class Crashed(Evidence):
    """rank_crashed: how the rank exited, what it was doing, where it ran."""

    exit_ns: int
    reason: str | None  # the exit event's reason: "exception", "signal"
    activity: dict[str, Any]  # findings.activity (in_op: the op it crashed in)
    exc: str = ABSENT
    signal: str = ABSENT
    host: str | None = ABSENT
    pid: int | None = ABSENT
    caused_by: dict[str, Any] = ABSENT  # the failure blamed on others it crashed on: instance, culprits, reason

    def render(self, f: Finding) -> list[RenderableType]:
        act = self.activity or {}
        rows = [("signal", Text(self.signal, style=evidence.BAD) if self.signal else None),
                ("exception", Text(first_line(self.exc, 300), style=evidence.BAD)
                 if self.exc and not self.signal else None),
                ("where", self.get("culprit_where")),
                ("in", evidence.brief(act.get("in_op")) if act.get("in_op") else None),
                ("last op", evidence.brief(act.get("last_completed_op")) if act.get("last_completed_op")
                 and not act.get("in_op") else None),
                ("host / pid", f"{self.get('host', '?')} / {self.get('pid', '?')}")]
        return [evidence.kv(rows)]


def instance_key(model: TraceModel, rank: int, i: int) -> tuple:
    """The cross-rank instance op ``i`` belongs to: ("coll", space, group, seq),
    ("p2p", space, group, src, dst, seq), or ("op", rank, id) for ops matched with nobody."""
    rt = model.ranks[rank]
    s = model.sigs[int(rt.sig[i])]
    seq, peer = int(rt.seq[i]), int(rt.peer[i])
    if seq < 0 or s.nested:
        return ("op", rank, int(rt.id[i]))
    if s.flags & P2P:
        if peer < 0:
            return ("op", rank, int(rt.id[i]))
        src, dst = (rank, peer) if s.flags & SEND else (peer, rank)
        return ("p2p", s.space, s.group, src, dst, seq)
    return ("coll", s.space, s.group, seq)


class Blame(NamedTuple):
    culprits: tuple[int, ...]
    reason: str  # named | absent | blocked | left | local | mismatch | pending | unknown
    text: str


class Failure(NamedTuple):
    """One failed instance: who failed, and who is to blame."""

    key: tuple
    failed: dict[int, int]  # rank -> op index that raised
    first_ns: int
    blame: Blame


def _departure(model: TraceModel, m: int, now: int) -> str:
    if m not in model.ranks:  # (``rankstate.went_first``: a member that never came)
        return "had never come (it wrote nothing to this trace)"
    snap = snapshot(model, now)[m]
    if snap.crashed:
        ex = snap.exit or {}
        return f"crashed ({ex.get('signal') or first_line(ex.get('exc') or ex.get('reason', ''), 80)})"
    if snap.exit is not None:
        return f"exited ({rankstate.exit_words(snap.exit)})"
    killed = rankstate.killed(model, m) if snap.dead else None
    if killed is not None:  # (how it went, where something saw: a launcher, its spool, a snapshot)
        return f"was gone: {describe_kill(killed)}"
    if snap.dead:
        return "vanished (no exit; nothing from it since)"
    return "has not been heard from since"


class _Arrivals:
    """Who had entered one failed instance by when, worked out once for it, when a timeout
    first asks: the members that never entered it, and those that did in order of entry.  A
    timeout's absentees are those, and the ones that entered after it fired; ranks whose
    timeouts see the same absentees share one ``Blame`` (each of 16k ranks that timed out
    walked every member: ~230 s a diagnosis of a 16k job whose all_reduce timed out)."""

    def __init__(self, model: TraceModel, r: int, i: int, ops: dict[int, int]) -> None:
        self.model, self.r, self.i, self.ops = model, r, i, ops
        self.key_p2p = bool(model.sig_of(r, i).flags & P2P)
        self.members: list[int] | None = None
        self.begins: list[int] = []  # when each member that entered it did, in order
        self.entered: list[int] = []  # those members, in that order
        self.order: dict[int, int] = {}  # member -> where in ``entered``
        self._blames: dict[tuple[int, str], Blame] = {}  # (how many had entered by then, why) -> its blame

    def timeout(self, r: int, t: int, when: str = "the timeout fired") -> Blame:
        """The blame of rank ``r``'s timeout at ``t`` (or of what else ended its wait then,
        ``when``): the members that had not entered by then."""
        if self.members is None:
            m, ops = self.model, self.ops
            self.members = m.members(self.r, self.i)
            got = sorted((int(m.ranks[p].begin[ops[p]]), p) for p in dict.fromkeys(self.members) if p in ops)
            self.begins, self.entered = [b for b, _ in got], [p for _, p in got]
            self.order = {p: k for k, p in enumerate(self.entered)}
        cut = bisect.bisect_right(self.begins, t + ARRIVAL_SLACK_NS)
        if self.order.get(r, cut) >= cut:  # (not entered by its own timeout: hostile times, a blame of its own)
            return self._blame(r, cut, when, t)
        got = self._blames.get((cut, when))
        if got is None:  # (judged at the first of these timeouts: they fire within moments)
            got = self._blames[cut, when] = self._blame(None, cut, when, t)
        return got

    def _blame(self, r: int | None, cut: int, when: str, t: int) -> Blame:
        assert self.members is not None
        came = set(self.entered[:cut])
        absent = [m for m in self.members if m != r and m not in came]
        # (a send to rank 99 of 2, or to a group rank out of range: never there; the world
        # size asked only of members that recorded nothing)
        if self.model.unplaced(self.r, self.i):
            return Blame((self.r,), "local", f"rank {self.r}'s send: " + no_such_peer_text(-1, None))
        world = self.model.said_world_size if any(m not in self.model.ranks for m in absent) else None
        if world is not None and any(m >= world for m in absent):
            nowhere = min(m for m in absent if m >= world)
            return Blame((self.r,), "local", f"rank {self.r}'s peer: " + no_such_peer_text(nowhere, world))
        if not absent and self.key_p2p and bisect.bisect_right(self.begins, t) >= cut:  # (none came just after)
            # (a send and a recv that pair up by order, each posted, each waited out: they did
            # not match; a send with tag 1 and a recv with tag 2 said "every member had
            # entered it", helper-191.  Which side is wrong, nothing recorded says.)
            return Blame((), "unknown", f"both sides were posted when {when}, and they did not match "
                                        "(their tags, not recorded, or sizes differ)")
        if not absent:
            return Blame((), "unknown", f"every member had entered it when {when}")
        if not self.model.p2p:
            return Blame(tuple(absent), "absent", f"{ranks_text(absent)} had not entered it when {when}")
        since = self.begins[0] if self.begins else t  # (when the first member entered it)
        first: dict[int, int | None] = {}  # (each held rank's own peer: the first link of its chain)
        kept = _kept_away(self.model, absent, t, came, since, first)
        if self.key_p2p:  # (a p2p op's own timeout: a chain back to its own ranks is a deadlock, its peer's)
            kept = {m: ends for m, ends in kept.items() if not set(ends) & came}
        if not kept:
            return Blame(tuple(absent), "absent", f"{ranks_text(absent)} had not entered it when {when}")
        # A member kept away by a send or recv its peer never posted: that peer is the cause
        # (rank 2 sends to 3, which went into this barrier instead; 3's timeout is its own).
        culprits = sorted({c for m in absent for c in kept.get(m, (m,))})
        rest = [m for m in absent if m not in kept]
        by_peers: dict[tuple[int, ...], list[int]] = {}
        for m in kept:
            by_peers.setdefault(kept[m], []).append(m)
        texts = []
        for peers, held in list(by_peers.items())[:TEXT_PEERS]:
            if len(held) == 1:
                texts.append(f"rank {held[0]} had not entered it when {when}: " + _held_text(self.model, held[0], peers, t, came, since))
            elif set(held) == set(peers):
                texts.append(f"{ranks_text(held)} had not entered it when {when}: each held in a send or recv "
                             "the others of them had not posted (a p2p deadlock)")
            elif all(first.get(m) in peers for m in held):
                texts.append(f"{ranks_text(held)} had not entered it when {when}: each held in a send or recv "
                             f"that {ranks_text(peers)} had not posted")
            else:  # (a chain: rank 0 sends to 1, which receives from 2; 0 was not held by 2, helper-191)
                # (the links that reach the chain's end first: past TEXT_PEERS, the one that
                # names where it ends was cut, helper-199)
                kept = set(sorted(held, key=lambda m: first.get(m) not in peers)[:TEXT_PEERS])
                said = [m for m in held if m in kept]
                each = [_of_rank(m, _held_text(self.model, m, peers, t, came, since)) for m in said]
                texts.append(f"{ranks_text(held)} had not entered it when {when}: each held in a send or recv "
                             f"whose peer had not posted its side, a chain that ends at {ranks_text(peers)} ("
                             + "; ".join(each) + ("; ..." if len(held) > TEXT_PEERS else "") + ")")
        if len(by_peers) > TEXT_PEERS:
            texts.append(f"and {len(by_peers) - TEXT_PEERS} more sets of ranks held so")
        if rest:
            texts.append(f"{ranks_text(rest)} had not entered it either")
        return Blame(tuple(culprits), "blocked" if not rest else "absent+blocked", "; ".join(texts))


#: Sets of ranks held by the same peers said in a blame's text; past this, a count
TEXT_PEERS = 4


def _kept_away(model: TraceModel, absent: list[int], t: int, came: set[int], since: int,
               peer: dict[int, int | None] | None = None) -> dict[int, tuple[int, ...]]:
    """Of the members absent at a timeout ``t`` (``came``: those that had entered), those
    held away by a send or recv whose peer never posted its side (``held_by_peer``), each
    with where its chain of such waits ends: the rank that was not held (rank 1 waits on 2,
    which waits on 3, in the barrier: 3), or the ranks of a cycle of them (two absent ranks
    each in a recv from the other).  Each rank's end is found once (a 16k-rank chain).
    ``peer``, where given, is filled with each rank's own peer (None: not held)."""
    if peer is None:
        peer = {}

    def next_of(m: int) -> int | None:
        if m not in peer:
            w = held_by_peer(model, m, t, came, since)
            peer[m] = w[0] if w is not None else None
        return peer[m]

    ends: dict[int, tuple[int, ...]] = {}
    out: dict[int, tuple[int, ...]] = {}
    for m in absent:
        if next_of(m) is None:
            continue
        path, on = [m], {m}
        while (q := next_of(path[-1])) is not None and q not in on and q not in ends:
            path.append(q)
            on.add(q)
        if q is None:
            end: tuple[int, ...] = (path[-1],)
        elif q in ends:
            end = ends[q]
        else:  # (back to a rank of the path: a cycle of such waits)
            end = tuple(sorted(path[path.index(q):]))
        for r in path:
            ends[r] = end
        out[m] = end
    return out


def _held_text(model: TraceModel, m: int, ends: tuple[int, ...], t: int, came: set[int], since: int) -> str:
    """What held rank ``m`` away at ``t``, in words: the op, the peer that never posted its
    side, and where the chain of such waits ended (``ends``) if past that peer."""
    w = held_by_peer(model, m, t, came, since)
    if w is None:
        return f"held by {ranks_text(ends)}"
    peer, i = w
    via = f", itself held so by {ranks_text(ends)}" if (peer,) != ends else ""
    if i in rankstate.blocked_at(model, m, t):
        return f"it was blocked in {model.label(m, i)}, which rank {peer} had not posted{via}"
    return f"its {model.label(m, i)} had failed, rank {peer} never having posted its side{via}"


def _of_rank(m: int, held: str) -> str:
    """``_held_text`` said of rank ``m``: 'rank 0 was blocked in ...', "rank 0's send #1 ..."."""
    if held.startswith("its "):
        return f"rank {m}'s {held[4:]}"
    return f"rank {m} {held[3:] if held.startswith('it ') else held}"


#: Links of a chain asked whether a peer that posted after a timeout was held itself
LATE_CHAIN = 64


def held_by_peer(model: TraceModel, m: int, t: int, came: set[int] | frozenset[int] = frozenset(),
                 since: int | None = None, seen: frozenset[int] = frozenset()) -> tuple[int, int] | None:
    """(peer, op index) where rank ``m`` was, at ``t``, blocked in a send or recv whose peer
    never posted its side while it waited, or had last done one that failed so (its
    timeout, or the peer's leaving, came first): what kept ``m`` from anything else.  A
    peer that posted while it waited holds nothing, even after ``t`` (the op then completed,
    and ``m`` stayed away by itself: it began that wait in the latter half of the time the
    others waited in the op that timed out, from ``since``, so late already), unless the
    peer was then in the op that timed out
    (``came``: it posted once the timeout let it go) or held so itself (down a chain), or
    ``m`` had waited on it since before that op began (the peer kept it away all along)."""
    rt = model.ranks.get(m)
    if rt is None:
        return None
    held = rankstate.blocked_at(model, m, t)
    if not held:
        # (the op that failed last by then, where it began nothing after: of a batch_isend_irecv,
        # the isend that timed out, its irecv begun after it and never done; the last op begun,
        # the irecv, had not failed, and rank 0 was blamed for the all_reduce it never reached:
        # helper-186)
        last = rankstate.last_op_before(model, m, t)
        failed = max((i for i in rt.exc if model.failed_ns(m, i) <= t), key=lambda i: model.failed_ns(m, i),
                     default=None)
        if failed is None or (last is not None and int(rt.begin[last]) > model.failed_ns(m, failed)) or \
                model.exc_kind(m, failed).kind not in (TIMEOUT, PEER_GONE):
            return None  # (an op that raised on its own rank: its own doing, no wait)
        if since is not None and model.failed_ns(m, failed) < since:
            return None  # (it failed before the others began to wait: it sat idle since, helper-192)
        held = [failed]
    for i in held:
        s = model.sig_of(m, i)
        peer = int(rt.peer[i])
        if not s.flags & P2P or s.nested or peer < 0 or peer == m or int(rt.seq[i]) < 0:
            continue  # (an any-source recv, a send to no rank: its own doing or anyone's)
        other = model.matching(m, i).get(peer)
        if other is not None:
            posted = int(model.ranks[peer].begin[other])
            failed = model.failed_ns(m, i) if i in rt.exc else None
            if posted <= (t if failed is None else min(t, failed)):
                continue  # (posted while it waited, before the timeout)
            if (failed is None or posted <= failed) and peer not in came and (
                    since is None or rankstate.blocked_since(model, m, i) > (since + t) // 2) and (
                    m in seen or len(seen) >= LATE_CHAIN or held_by_peer(model, peer, t, came, since, seen | {m}) is None):
                continue  # (posted a moment after, free then, to a rank already late: not held)
        if other is None and s.space == SPACE_NATIVE:
            send = bool(s.flags & SEND)
            src, dst = (m, peer) if send else (peer, m)
            if model.p2p_posted_before(s.group, src, dst, int(rt.seq[i]), send=not send):
                continue  # (posted before what was read: a window's)
        return peer, i
    return None


def _crashed_of_a_failure(model: TraceModel, m: int) -> bool:
    """Whether rank ``m`` crashed after an op of its own failed saying a peer went, its timeout
    fired or another rank's op failed (``errors.classify``): it went because something else
    did.  Judged by its failed ops, not by its crash's words: a TimeoutError reading a file
    outside any op is its own doing, and a rank that wrapped a closed connection in an error
    of its own (torch's pipelining) crashed of that failure all the same (helper-200)."""
    if rankstate.crash(model, m) is None:
        return False
    rt = model.ranks[m]
    return any(model.exc_kind(m, i).kind in (PEER_GONE, TIMEOUT, RELAYED) for i in rt.exc)


def _blame_one(model: TraceModel, r: int, i: int, now: int, arrivals: _Arrivals, hang_ns: int) -> Blame | None:
    """Blame for one primary failure (None: it only relays another rank's failure)."""
    kind = model.exc_kind(r, i)
    t = model.failed_ns(r, i)
    if kind.kind == NAMED:  # (the text's ranks are its group's: global rank 3 of group [1, 2, 3] is
        # "Rank 2"; read as global, a monitored_barrier of a subgroup blamed a rank that came, helper-196)
        group = model.sig_of(r, i).group
        members = model.groups.get(group)  # (as its group stated them: the ranks seen in it are no order)
        if members is None or any(not 0 <= k < len(members) for k in kind.ranks):
            return Blame((), "unknown", f"{ranks_text(kind.ranks)} of group {group}, in its own numbering, never "
                                        "arrived (named by the exception; which ranks those are, the group's "
                                        "members, this trace does not hold)")
        named = tuple(members[k] for k in kind.ranks)
        return Blame(named, "named", f"{ranks_text(named)} never arrived (named by the exception)")
    if kind.kind == FAULTED:
        return Blame(kind.ranks, "faulted", f"{ranks_text(kind.ranks)} passed what the op refused (named by the "
                                            "exception every rank raised)")
    if kind.kind == RELAYED:
        return None
    if kind.kind == TIMEOUT:
        return arrivals.timeout(r, t)
    if kind.kind == INTERRUPTED:
        waited = t - rankstate.blocked_since(model, r, i)  # (an async op: since its wait began)
        if waited >= hang_ns:  # (Ctrl-C on a hung job: its waiting ranks are not the cause)
            return arrivals.timeout(r, t, "its ranks waiting there were interrupted")
        return Blame((), "interrupted", f"the user interrupted rank {r} {secs(waited):.1f} s into it, before "
                                        "hang_after: a job stopped, not a hang (nobody to blame)")
    if kind.kind == PEER_GONE:
        left, silent = rankstate.peers_gone(model, r, i)
        gone_too = {*rankstate.vanished(model, now), *rankstate.never_came_to(model, r, i)}
        gone = rankstate.went_first(model, rankstate.awaited_first(
            model, r, i, sorted({*left, *(m for m in silent if m in gone_too)})))
        # (a rank that crashed of a failure of its own, a connection closed or a timeout,
        # beside one that went by itself, went because that one did: rank 2 raised at DDP's
        # check, rank 1's all_reduce then failed and it crashed, and rank 0's broadcast, failing
        # after both, blamed them both; rank 1's failure, blamed on 0 and 2, closed a cycle)
        own = [m for m in gone if not _crashed_of_a_failure(model, m)]
        if own:
            gone = own
        if gone:
            return Blame(tuple(gone), "left", "; ".join(f"rank {m} {_departure(model, m, now)}" for m in gone)
                         + " before the op failed")
        if len(silent) == 1:
            return Blame(tuple(silent), "left", f"its connection to rank {silent[0]} closed, and rank "
                                                f"{silent[0]} has not been heard from since")
        if silent:
            return Blame((), "pending", f"a connection closed: one of {ranks_text(silent)} left; waiting to hear "
                                        "which (none has been heard from since)")
        return Blame((), "unknown", "a connection closed, but every other member is still there")
    return Blame((r,), "local", f"the op raised on rank {r} itself")


def _combine(blames: list[Blame]) -> Blame:
    named = list({id(b): b for b in blames if b.culprits}.values())  # (thousands of ranks may share one)
    if named:
        culprits = tuple(sorted({c for b in named for c in b.culprits}))
        reasons = sorted({part for b in named for part in b.reason.split("+")})
        texts = list(dict.fromkeys(b.text for b in named))
        return Blame(culprits, "+".join(reasons), "; ".join(texts))
    if any(b.reason == "pending" for b in blames):
        return next(b for b in blames if b.reason == "pending")
    return blames[0] if blames else Blame((), "unknown", "no rank to blame")


def failed_instances(model: TraceModel, now: int, mismatch_rows: dict[tuple, list[int]],
                     hang_ns: int) -> list[Failure]:
    """Every instance with a failed op, with its blame, in order of first failure.
    ``hang_ns``: how long an op interrupted by the user was waited in before the members
    that had not come are blamed (sooner, a job stopped: nobody is)."""
    by_key: dict[tuple, dict[int, int]] = {}
    apart = model.kept_apart  # (a foreign stream's failures are not this run's)
    for r, i in model.failed:
        rt = model.ranks.get(r)
        if rt is None or i not in rt.exc or r in apart:
            continue
        s = model.sigs[int(rt.sig[i])]
        if s.flags & CONTAINER or s.space == SPACE_FR:
            continue
        if s.flags & NESTED and rt.parent[i] >= 0 and int(rt.parent[i]) in rt.exc:
            continue  # the logical op that contains it failed too: that one is reported
        by_key.setdefault(instance_key(model, r, i), {})[r] = i
    out = []
    for key, failed in by_key.items():
        r0, i0 = next(iter(failed.items()))
        ops = model.counterparts(r0, i0)
        first = min(model.failed_ns(r, i) for r, i in failed.items())
        row = (key[1], key[2], key[3]) if key[0] == "coll" else None
        if row is not None and row in mismatch_rows:
            culprits = tuple(mismatch_rows[row])
            out.append(Failure(key, failed, first, Blame(culprits, "mismatch",
                                                         "the ranks called mismatched collectives here")))
            continue
        primary = [(r, i) for r, i in failed.items() if int(model.ranks[r].begin[i]) <= first + ARRIVAL_SLACK_NS]
        arrivals = _Arrivals(model, r0, i0, ops)
        blames = [b for r, i in primary if (b := _blame_one(model, r, i, now, arrivals, hang_ns)) is not None]
        out.append(Failure(key, failed, first, _combine(blames)))
    out.sort(key=lambda f: f.first_ns)
    return out


#: the distinct exceptions an op_failed's message quotes, with their ranks (the rest in its evidence)
SAID_EXCEPTIONS = 3
#: what varies between ranks' words for one failure: a peer's address and port, a duration, an
#: address in memory (not every number: "from rank 1" and "from rank 3" blame others, and
#: "64 vs 32" against "4096 vs 256" are other sizes, helper-209)
_VARYING = re.compile(r"\[[^\]]*\]:\d+|\b\d+(?:\.\d+)?\s?(?:ms|us|µs|ns|s|(?:milli|micro|nano)?seconds?)\b"
                      r"|0x[0-9a-fA-F]+|\[(?:PG [^\]]*?)?Rank \d+\]")  # (NCCL's watchdog: "[Rank 3] ... ran for
# 600020 milliseconds", one line per rank, helper-210)


def _each_said(excs: dict[int, str]) -> str:
    """The ranks that failed with what they raised: "ranks 0, 1, 2 (X)" where all raised
    alike, else each exception once with its ranks, "rank 0 (X) and ranks 1, 2 (Y)": the
    first rank's was quoted for all, and rank 0's wrong list size read as what ranks 1 and 2
    raised, where their connection closed (helper-203)."""
    said: dict[str, tuple[str, list[int]]] = {}  # (its words, what varies masked: a peer's address and port,
    for r in sorted(excs):                        # a timeout's 998 ms split one failure in seven, helper-207)
        line = first_line(excs[r], 120)
        said.setdefault(_VARYING.sub("#", line), (line, []))[1].append(r)
    parts = [f"{ranks_text(rs)} ({line})" for line, rs in list(said.values())[:SAID_EXCEPTIONS]]
    more = sum(len(rs) for _, rs in list(said.values())[SAID_EXCEPTIONS:])
    return " and ".join(parts) + (f" and {more:,} rank(s) more, each in the evidence" if more else "")


def find_failed_ops(model: TraceModel, now: int, failures: list[Failure]) -> list[Finding]:
    """One ``op_failed`` per blame: the first failed instance in full, later ones counted."""
    groups: dict[tuple, list[Failure]] = {}
    for f in failures:
        groups.setdefault((f.blame.culprits, f.blame.reason), []).append(f)
    out = []
    for fs in groups.values():
        f = fs[0]
        r0 = min(f.failed)
        i0 = f.failed[r0]
        s = model.sig_of(r0, i0)
        seq = int(model.ranks[r0].seq[i0])
        where = model.label(r0, i0)
        ops = sorted({model.sig_of(r, i).op for r, i in f.failed.items()})
        if f.key[0] == "coll" and len(ops) > 1:  # (ranks that called different ops there: a mismatch's)
            where = f"collective #{seq} of group {s.group} ({', '.join(ops)})"
        excs = {r: model.ranks[r].exc[i] for r, i in f.failed.items()}
        msg = (f"{where} failed on {_each_said(excs)}; "
               + (f"blamed on {ranks_text(f.blame.culprits)}: " if f.blame.culprits else
                  "not blamed yet: " if f.blame.reason == "pending" else "no rank to blame: ")
               + f.blame.text)
        failed_ev = {}
        for r, i in sorted(f.failed.items()):
            b = op_brief(model, r, i, now)
            b["failure"] = model.exc_kind(r, i).kind
            b["failed_ns"] = model.failed_ns(r, i)
            b["after_s"] = secs(model.failed_ns(r, i) - int(model.ranks[r].begin[i]))
            failed_ev[str(r)] = b
        ev = OpFailed(failed=failed_ev, blame={"reason": f.blame.reason, "culprits": list(f.blame.culprits),
                                               "text": f.blame.text},
                      culprit_activity={str(c): activity(model, c, now) for c in f.blame.culprits})
        if len(fs) > 1:
            ev.later_failures = len(fs) - 1
            ev.later = [{"instance": list(x.key), "ranks": sorted(x.failed),
                         "exc": first_line(model.ranks[min(x.failed)].exc[x.failed[min(x.failed)]], 120)}
                        for x in fs[1:1 + FAILED_REPORT]]
        # (a rank that caught the failure and went on waits on nobody for it: its stale edge
        # blamed a later hang of a group it is not in on the failure's culprit, helper-192;
        # unless it went on into a later failure of the same blame, as monitored_barrier again)
        stays = {r for x in fs for r, i in x.failed.items() if r in f.failed and not _went_on(model, r, i)}
        victims = {r: f.blame.culprits for r in f.failed if r not in f.blame.culprits and r in stays}
        members = sorted(set(model.members(r0, i0)) | set(f.failed))
        # (the user stopped a running job: nothing failed that anyone should mend, so no error,
        # and check exits 0 on it, not 1 (helper-176); one stopped while hung names the hang)
        stopped = f.blame.reason == "interrupted" and not f.blame.culprits
        out.append(Finding("op_failed", s.group, seq if seq >= 0 else None, s.op, members,
                           list(f.blame.culprits), msg, ev, ts=f.first_ns, victims=victims,
                           instances=tuple(x.key for x in fs), severity=WARNING if stopped else ""))
    return out


def _went_on(model: TraceModel, r: int, i: int) -> bool:
    """Whether rank ``r`` began another op after its op ``i`` failed (it caught the error),
    not the same op again, in flight (a retry waits on what the first attempt waited on)."""
    rt = model.ranks[r]
    last = model.last_op(r, completed=False)
    if last is None or last == i or int(rt.begin[last]) <= model.failed_ns(r, i):
        return False
    failed, then = model.sig_of(r, i), model.sig_of(r, last)
    return not (rt.comp[last] == 0 and (then.op, then.group) == (failed.op, failed.group))


def death_message(ex: dict, limit: int = 140) -> str:
    """The first line of what a dying rank said (its exception, or the C++ exception that
    ``std::terminate`` was called with); empty for faulthandler's header, which only
    repeats the signal."""
    text = str(ex.get("exc") or "")
    exc = first_line(text, limit)
    if exc.startswith("Fatal Python error"):
        return ""
    if RAISED_FROM in text:  # (torch's pipelining: "[Stage 1] failed to run forward:", its cause below, helper-191)
        cause = text.split(RAISED_FROM, 1)[1].rstrip().removesuffix(")")
        exc += f" (raised from {first_line(cause, max(40, limit - len(exc)))})"
    return exc


def crash_cause(ex: dict) -> str:
    """How a rank died, in words: the backend's C++ exception (through ``std::terminate``) is
    the most useful line of an abort, so it comes before the signal it raised."""
    exc = death_message(ex)
    if ex.get("signal"):
        sig = signal_label(ex["signal"])
        return f"{exc} (then {sig})" if exc else f"a fatal signal: {sig}"
    return exc


def find_crashes(model: TraceModel, now: int, failures: list[Failure]) -> list[Finding]:
    """``rank_crashed`` for every rank that died of an uncaught exception or a fatal signal.

    A crash caused by a failed op blamed on others is still reported here, with the
    failure as its ``cause``; ``rootcause`` folds it into the root finding."""
    blame_of = {(r, i): f for f in failures for r, i in f.failed.items()}
    out = []
    for r in model.rank_ids() if model.exits_seen else ():  # (a crash is an exit: none, no walk of 16k ranks)
        ex = rankstate.crash(model, r)
        if ex is None:
            continue
        rt = model.ranks[r]
        t = int(ex["ts"])
        cause = None
        failed = sorted((i for i in rt.exc if model.failed_ns(r, i) <= t + SLACK_NS),
                        key=lambda i: model.failed_ns(r, i))
        if failed and ex.get("reason") != "signal":
            i = failed[-1]
            last = model.last_op(r, completed=False)
            if rt.exc[i] == ex.get("exc") or i == last or (last is not None and rt.parent[last] == i):
                cause = blame_of.get((r, i))
        act = activity(model, r, now)
        # (where it crashed: in the op whose failure it crashed of, else the last op in flight
        # it was blocked in, not an async op it posted and had not waited for: "crashed in
        # irecv #1 ... (inside all_reduce)" where all_reduce #2 raised, helper-186; an async op
        # whose wait() it was in is one, helper-190)
        pending = model.inflight(r)
        blocking = [i for i in pending if rankstate.is_blocked_in(model, r, i)]
        at_op = failed[-1] if cause is not None else (blocking or pending or [None])[-1]
        what = crash_cause(ex)
        if at_op is not None:
            act["in_op"] = op_brief(model, r, at_op, now)
            where = f"in {model.label(r, at_op)}"
        elif any(e.get("reason") == DESTROYED and not e.get("raising") and rt.last_op_ts <= e["ts"] <= t
                 for e in rt.exits):  # (not one a propagating exception passed through: it is the crash)
            where = "after its process group ended (destroy_process_group)"  # (a checkpoint's save, say)
        elif act.get("last_completed_op"):
            where = f"after {model.label(r, model.op_index(r, act['last_completed_op']['id']))}"
        else:
            where = "before any op"
        doing = act.get("in_op") or act.get("last_completed_op") or {}
        msg = f"rank {r} crashed {where}: {what}"
        at = stacks.one_line(rank_stack(model, r, now)[0])
        if at:
            msg += f", at {at}"
        if cause is not None and r in cause.blame.culprits and "blocked" in cause.blame.reason:
            msg += f"; its own doing: {cause.blame.text}"  # (its timeout, in a wait it made a cycle of)
        ev = Crashed(exit_ns=t, reason=ex.get("reason"), activity=act, exc=ex.get("exc") or ABSENT,
                     signal=ex.get("signal") or ABSENT)
        if rt.meta:
            ev.host, ev.pid = rt.meta.get("host"), rt.meta.get("pid")
        victims: dict[int, tuple[int, ...]] = {}
        instances: tuple = (cause.key,) if cause is not None else ()
        if cause is not None and r not in cause.blame.culprits:
            ev.caused_by = {"instance": list(cause.key), "culprits": list(cause.blame.culprits),
                            "reason": cause.blame.text}
            victims = {r: cause.blame.culprits}
        out.append(Finding("rank_crashed", doing.get("group"), doing.get("seq"), doing.get("op"), [r], [r], msg,
                           ev, ts=t, victims=victims, instances=instances))
    return out


def cause_of_departure(model: TraceModel, r: int, failures: list[Failure]) -> Failure | None:
    """The failed op a vanished rank had just before it went (blamed on others), if any:
    the launcher killing survivors after a failure makes them consequences, not causes."""
    rt = model.ranks.get(r)
    if rt is None or not rt.exc:
        return None
    seen = model.last_seen(r)
    for f in reversed(failures):
        i = f.failed.get(r)
        if i is not None and model.failed_ns(r, i) <= seen + SLACK_NS and r not in f.blame.culprits:
            return f
    return None
