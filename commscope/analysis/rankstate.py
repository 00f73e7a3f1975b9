"""Judging ranks: whether a rank is gone, crashed, killed or blocked, and what it is doing
at time t.  The one implementation, for the detectors, the report and the console (rank
table, timeline gutter, replay cursor).  The model (``model.TraceModel``) stores; this
module judges what it stores.

``rank_state(model, rank, t)`` describes the present: the rank's latest events, judged at
``t`` (a live clock, or a stored trace's end).  ``as_of=True`` gives the same answer as of
time ``t``, ignoring everything recorded later (a replay cursor).

``RankSnapshot`` holds what diagnose() asks about each rank (its state, exit, whether it
is dead) computed once per (model version, judging time), so the detectors read one typed
record per rank instead of judging again: see ``snapshot``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from itertools import islice, repeat
from operator import attrgetter, itemgetter

import numpy as np

from commscope.analysis import stacks
from commscope.analysis.columns import RankTable, RankTrace
from commscope.analysis.errors import PEER_GONE
from commscope.analysis.model import SPACE_FR, ModelLike, TraceModel
from commscope.analysis.vocab import (
    ASYNC,
    CONTAINER,
    FR_IMPORT,
    NESTED,
    P2P,
    SNAPSHOT,
    TERM_SIGNALS,
    RankState,
    describe_kill,
    is_kill,
    signal_label,
    stopped,
    unread_of,
    unseen_death,
)
from commscope.events import DEFAULT_HANG_AFTER

STARTUP_SLACK_NS = 2 * 10**9  # ranks whose streams begin this close to the job's start started with it
_TOP = NESTED | CONTAINER  # inner traffic and containers: never "the op a rank is in"
#: A rank whose heartbeat is older than max(DEAD_INTERVALS x sample_interval, DEAD_MIN_S) is dead.
DEAD_INTERVALS = 5
DEAD_MIN_S = 2.0
#: A peer's op failed because a connection closed, and this rank has been silent since: it left
#: (vanished) once it stays silent for max(VANISH_INTERVALS x sample_interval, VANISH_MIN_S),
#: or at once when it is the only member of that op that could have left.
VANISH_INTERVALS = 3
VANISH_MIN_S = 1.5
#: Clock slack when comparing when one rank was last heard from with another's events
#: (heartbeats come every sample interval, writes lag a tick).
SLACK_NS = 200_000_000
#: Clock slack when comparing when ranks entered an op with when another's op failed.
ARRIVAL_SLACK_NS = 20_000_000
#: How far behind the clock a file's mtime may lag (the kernel's coarse clock: a jiffy or two)
COARSE_MTIME_NS = 50_000_000


def clock_slack(ex: dict) -> int:
    """How early an exit's time may read against the rank's own events: a time taken from a
    file's mtime (``approx``: the Python recorder's SIGTERM note; a crash file's exit,
    ``src`` "faulthandler", marked so since) is kept by the kernel's coarse clock, up to
    a jiffy or more behind the clock the rank timed its ops by."""
    return COARSE_MTIME_NS if ex.get("approx") or ex.get("src") == "faulthandler" else 0


@dataclasses.dataclass(slots=True)
class _Memo:
    """A model's judgements, cached for one model version."""

    version: int
    blocked: dict[int, tuple[int, ...]] | None = None  # rank -> ``blocked`` (every rank's, made at once)
    open_ops: tuple[np.ndarray, np.ndarray] | None = None  # ``RankTable.open_ops``: (slots, op indices)
    vanished: tuple[int, frozenset[int]] | None = None  # (now, ranks)
    survivors: tuple[int, int] | None = None  # see _survivors_last
    acted: tuple[tuple[int, int], ...] | None = None  # see _last_acts
    stops: _Stops | None = None  # see _stops
    #: rank -> ``_last_exit`` (asked ~27 times a rank by one ``diagnose`` of a stopped job)
    exits: dict[int, dict | None] = dataclasses.field(default_factory=dict)
    #: (now, rank -> ``left_early`` at now): asked by several finders and by the rank's state
    left: tuple[int, dict[int, bool]] = (-1, {})
    snapshot: RankSnapshot | None = None
    #: (space, group, seq) -> the members that completed that collective (``completed_by``)
    completed: dict[tuple[int, str, int], frozenset[int]] = dataclasses.field(default_factory=dict)
    #: ``elsewhere``: (read from outside, the ranks proven running with their streams elsewhere)
    elsewhere: tuple[bool, frozenset[int]] | None = None
    #: (space, group, seq) -> ``_bystanders`` of that collective
    bystanders: dict[tuple[int, str, int], list[tuple[int, int | None, int]]] = dataclasses.field(
        default_factory=dict)


def _memo(m: TraceModel) -> _Memo:
    """The model's judgements cache for its current version (``TraceModel.judged``: kept on
    the model so that it goes with it)."""
    memo = m.judged
    if not isinstance(memo, _Memo) or memo.version != m.version:
        memo = m.judged = _Memo(m.version)
    return memo


# ---------------------------------------------------------------------- blocked in an op
def blocked_mask(flags: np.ndarray, begin: np.ndarray, comp: np.ndarray, wb: np.ndarray, we: np.ndarray,
                 t: int | None = None) -> np.ndarray:
    """Of some ops (their sig flags and time columns), those a thread is blocked in at ``t``
    (None: as the latest events say): a sync op begun and not complete, an async op inside
    its ``wait()``.  The one definition of "blocked in op i"."""
    is_async = (flags & ASYNC) != 0
    if t is None:
        running = comp == 0
        waiting = (wb > 0) & (we == 0)
    else:
        running = (begin <= t) & ((comp == 0) | (comp > t))
        waiting = (wb > 0) & (wb <= t) & ((we == 0) | (we > t))
    return running & (~is_async | waiting)


def _since(flags: np.ndarray, begin: np.ndarray, wb: np.ndarray) -> np.ndarray:
    """When a thread blocked in each op began waiting: its wait() for an async op."""
    return np.where(((flags & ASYNC) != 0) & (wb > 0), wb, begin)


def is_blocked_in(m: ModelLike, rank: int, i: int) -> bool:
    """Whether the rank's thread is blocked in op ``i`` now (see ``blocked_mask``)."""
    rt, k = m.ranks[rank], slice(i, i + 1)
    return bool(blocked_mask(m.sig_flags(rt.sig[k]), rt.begin[k], rt.comp[k], rt.wb[k], rt.we[k])[0])


def blocked_since(m: ModelLike, rank: int, i: int) -> int:
    """Since when the rank has been blocked in op ``i``."""
    rt, k = m.ranks[rank], slice(i, i + 1)
    return int(_since(m.sig_flags(rt.sig[k]), rt.begin[k], rt.wb[k])[0])


def blocked(m: TraceModel, rank: int) -> list[int]:
    """Ops the rank's threads are blocked in now, by begin time.  Outer logical ops win over
    their nested inner traffic; containers are never "the op a rank is in".  Kept for the
    model's version (``_Memo``): the detectors and the rank states ask for every rank."""
    return list(blocked_ranks(m).get(rank, ()))


def blocked_ranks(m: TraceModel) -> dict[int, tuple[int, ...]]:
    """``blocked`` of every rank blocked in an op (others are not in it): a detector that
    looks only at those skips the rest of 16k ranks.  Read only."""
    memo = _memo(m)
    if memo.blocked is None:
        memo.blocked = _all_blocked(m)
    return memo.blocked


def open_ops(m: TraceModel) -> tuple[np.ndarray, np.ndarray]:
    """Every rank's open ops as (slots, op indices) (``RankTable.open_ops``), gathered once
    for the model's version: the blocked ranks and the plain ranks' states both start there.
    Read only."""
    memo = _memo(m)
    if memo.open_ops is None:
        memo.open_ops = m.table.open_ops()
    return memo.open_ops


def _all_blocked(m: TraceModel) -> dict[int, tuple[int, ...]]:
    """``_blocked`` of every rank with an op in flight, at once: their open ops gathered
    from the model's blocks (``open_ops``) and judged in one numpy pass, where asking rank
    by rank cost ~10 numpy calls a rank (a fifth of a 16k-rank console's time)."""
    t = m.table
    slots, ops = open_ops(m)
    out: dict[int, tuple[int, ...]] = {}
    if not ops.shape[0]:
        return out
    block, base = t.block[slots], t.base[slots]
    sig, begin, comp, wb, we, parent = t.gather(("sig", "begin", "comp", "wb", "we", "parent"), block, base + ops)
    order = np.lexsort((ops, begin, slots))  # (``TraceModel.inflight``'s order: by begin, ties by index)
    slots, ops, sig, begin, comp, wb, we, parent, block, base = (
        x[order] for x in (slots, ops, sig, begin, comp, wb, we, parent, block, base))
    f = m.sig_flags(sig)
    ok = blocked_mask(f, begin, comp, wb, we) & ((f & CONTAINER) == 0)
    nested = np.flatnonzero(((f & NESTED) != 0) & (parent >= 0))
    if nested.shape[0]:
        (outer,) = t.gather(("comp",), block[nested], base[nested] + parent[nested])
        ok[nested[outer == 0]] = False  # its outer op runs
    slots, ops = slots[ok], ops[ok]
    if not ops.shape[0]:
        return out
    cuts = np.flatnonzero(np.r_[True, slots[1:] != slots[:-1], True]).tolist()
    ops_l = ops.tolist()
    ranks = map(_RANK_OF_TRACE, map(t.traces.__getitem__, slots[cuts[:-1]].tolist()))
    return {r: tuple(ops_l[a:b]) for r, a, b in zip(ranks, cuts[:-1], cuts[1:], strict=True)}


def current_op(m: TraceModel, rank: int) -> int | None:
    """The op the rank is in right now (the most recent blocked one), if any."""
    b = blocked(m, rank)
    return b[-1] if b else None


def completed_by(m: TraceModel, group: str, seq: int, space: int) -> frozenset[int]:
    """The members that completed collective #seq of ``group`` without an error, worked out
    once per model version: the dead ranks of a 16k job ask it of the same few collectives
    (asked rank by rank, each walked every member: ~30 s a diagnosis of 16k silent ranks)."""
    memo = _memo(m)
    key = (space, group, seq)
    got = memo.completed.get(key)
    if got is None:
        ranks = m.ranks
        got = memo.completed[key] = frozenset(p for p, j in m.collective(group, seq, space).items()
                                              if ranks[p].comp[j] > 0 and j not in ranks[p].exc)
    return got


def group_ran(m: TraceModel, space: int, group: str) -> bool:
    """Whether a collective among the group's first few completed: every member ran it,
    wherever its stream is (a member that wrote nothing here writes to another store)."""
    gi = m.coll.get((space, group))
    return gi is not None and any(completed_by(m, group, gi.seqs.seq_of(row), space)
                                  for row in range(min(gi.seqs.n, PROOF_ROWS)))


#: ``group_ran`` looks for a completed collective among each group's first this many
PROOF_ROWS = 8


#: ``elsewhere`` names at most this many ranks (a hostile group of millions of members cost
#: a diagnosis seconds and ``check --json`` tens of MB)
MAX_UNSEEN = 1 << 16


def elsewhere(m: TraceModel) -> tuple[bool, frozenset[int]]:
    """(whether the trace was read from outside, the ranks of the world that wrote nothing to
    it though a collective their peers completed needed them: running, their streams in
    another store), once per version.  Judged from each group's first few collectives
    (``group_ran``).  Read from outside (a snapshot of one host's ranks, the Flight Recorder
    dumps a user had, whose groups list the world), who wrote nothing tells nothing."""
    memo = _memo(m)
    if memo.elsewhere is None:
        memo.elsewhere = _elsewhere(m)
    return memo.elsewhere


def _elsewhere(m: TraceModel) -> tuple[bool, frozenset[int]]:
    ws, ranks = m.world_size, m.ranks
    if sum(1 for r in ranks if r < ws) >= ws:
        return False, frozenset()
    if any(rt.meta and (rt.meta.get("recorder") == SNAPSHOT or rt.meta.get("src") == FR_IMPORT)
           for rt in ranks.values()):
        return True, frozenset()
    proven: set[int] = set()
    for (space, name), gi in m.coll.items():
        if space == SPACE_FR:  # (Flight Recorder's groups list the world, whoever wrote here)
            continue
        hit = [p for p in islice(gi.members, MAX_UNSEEN + len(ranks)) if p not in ranks and p not in proven
               and 0 <= p < ws]
        if hit and group_ran(m, space, name):
            proven.update(hit[:MAX_UNSEEN - len(proven)])
            if len(proven) >= MAX_UNSEEN:
                break
    return False, frozenset(proven)


def never_came(m: TraceModel, members: Sequence[int], space: int, group: str) -> list[int]:
    """Of a collective's ``members``, those of the world that wrote nothing to this trace and
    that no group proves running (``elsewhere``: a completed collective of any group they
    belong to; helper-107 found one proven by the world's group taken for absent from a new
    group's first collective): they never came (a rank dead before its ``instrument()``)."""
    ws = m.world_size
    if len(m.ranks) >= ws:
        return []
    unseen = [p for p in members if p not in m.ranks and 0 <= p < ws]
    if not unseen:
        return []
    outside, proven = elsewhere(m)
    return [] if outside or group_ran(m, space, group) else [p for p in unseen if p not in proven]


def collective_of(m: TraceModel, rank: int, i: int) -> tuple[int, str, int] | None:
    """(space, group, seq) of the collective instance op ``i`` of ``rank`` is in; None for a
    point-to-point, nested or unnumbered op."""
    s = m.sig_of(rank, i)
    seq = int(m.ranks[rank].seq[i])
    return (s.space, s.group, seq) if seq >= 0 and not s.nested and not s.flags & P2P else None


def never_came_to(m: TraceModel, rank: int, i: int) -> list[int]:
    """``never_came`` of the members of op ``i`` of ``rank``, a collective."""
    if len(m.ranks) >= m.world_size or (key := collective_of(m, rank, i)) is None:
        return []
    return never_came(m, m.members(rank, i), key[0], key[1])


# ---------------------------------------------------------------------- exits and deaths
def _last_exit(m: TraceModel, rank: int) -> dict | None:
    """The rank's last exit event if it came after its last op (else the rank went on: it
    initialised again), whatever kind; once per rank and version."""
    rt = m.ranks.get(rank)
    if not rt or not rt.exits:
        return None
    exits = _memo(m).exits
    if rank not in exits:
        exits[rank] = _find_last_exit(rt)
    return exits[rank]


def _find_last_exit(rt: RankTrace) -> dict | None:
    ex = rt.exits[-1]
    if len(rt.exits) > 1 and unseen_death(ex) and rt.exits[-2]["ts"] + clock_slack(rt.exits[-2]) >= rt.last_op_ts:
        # (its spool was left unclosed after the rank's own last word: the forwarder found no
        # exit in what it held, and that says nothing of how the rank went)
        ex = rt.exits[-2]
    # An exit timed by a file's mtime (``clock_slack``): ops just before it may look later.
    slack = clock_slack(ex)
    if unseen_death(ex):  # (timed by the last record its spool held, which may be older than its last op
        return ex         # forwarded: a process that died unseen was not initialised again)
    return ex if ex["ts"] + slack >= rt.last_op_ts else None  # ops after an exit: the rank re-initialized


def exited(m: TraceModel, rank: int) -> dict | None:
    """The rank's exit event if it left after its last op, cleanly or on a crash (not when
    it was killed: see ``killed``), else None."""
    ex = _last_exit(m, rank)
    return None if ex is None or is_kill(ex) else ex


def killed(m: TraceModel, rank: int) -> dict | None:
    """The exit event of a rank that was killed, or cut itself off, after its last op
    (``is_kill``): gone without leaving, like a rank that vanished, but with its cause."""
    ex = _last_exit(m, rank)
    return ex if ex is not None and is_kill(ex) else None


def is_crash(ex: dict) -> bool:
    """An exit on an uncaught exception or a fatal signal (the one crash test)."""
    return bool(ex.get("exc")) or ex.get("reason") in ("exception", "signal")


def crash(m: TraceModel, rank: int) -> dict | None:
    """The exit event if the rank died of an uncaught exception or a fatal signal."""
    ex = exited(m, rank)
    return ex if ex is not None and is_crash(ex) else None


def waited_until(m: TraceModel, rank: int, now: int) -> int:
    """Until when a rank with an op open waited in it: its departure where it left (a rank
    that left cleanly inside an op, or was killed, with the whole job is judged still
    waiting, but it waited no longer than it was there), else ``now``."""
    if not m.exits_seen or not m.ranks[rank].exits:
        return now
    left = departed_ns(m, rank)
    return now if left is None else min(now, left)


def departed_ns(m: TraceModel, rank: int) -> int | None:
    """When the rank left with an ``exit`` event (clean, crash or killed); None if it did not."""
    ex = _last_exit(m, rank)
    if ex is None:
        return None
    if ex.get("src") == "launcher" or unseen_death(ex):
        # It went after its last word: a launcher's exit is timed when it noticed (later), the
        # spool's of an unseen death by its last record (no later than its last heartbeat,
        # which the recorder thread writes apart: a rank killed after 15 s idle in a hang)
        rt = m.ranks[rank]
        last = max(rt.last_hb, rt.last_op_ts, int(rt.meta["ts"]) if rt.meta else 0)
        if not last:
            return int(ex["ts"])
        return int(max(ex["ts"], last) if unseen_death(ex) else min(ex["ts"], last))
    return int(ex["ts"])


def dead_after_ns(m: TraceModel, rank: int) -> int:
    return int(max(DEAD_INTERVALS * m.sample_interval(rank), DEAD_MIN_S) * 1e9)


def vanish_after_ns(m: TraceModel, rank: int) -> int:
    return int(max(VANISH_INTERVALS * m.sample_interval(rank), VANISH_MIN_S) * 1e9)


def is_dead(m: TraceModel, rank: int, now: int) -> bool:
    """Gone without an exit: killed (``killed``), its heartbeat stopped for several sample
    intervals, or it vanished while its peers' ops failed (see ``vanished``)."""
    rt = m.ranks.get(rank)
    if not rt or exited(m, rank) is not None:
        return False
    if killed(m, rank) is not None:
        return True
    if rt.last_hb and now - max(rt.last_hb, rt.last_ts) > dead_after_ns(m, rank):
        return True
    return rank in vanished(m, now)


def left_early(m: TraceModel, rank: int, now: int) -> bool:
    """Gone while the job went on: exited or crashed, vanished, or silent past the dead
    threshold while other ranks kept writing.  Ranks that all stopped together (a job killed
    as a whole, or ended by its own deadline: every rank's ``os._exit(0)`` while some
    waited in a hang) are judged as they were when they stopped: still waiting; but one they
    waited for that went before them went first (``_stops``): gone otherwise, or killed by a
    stop signal sent to it alone long before them (``_stopped_first``).  Once per rank,
    moment and version."""
    memo = _memo(m)
    if memo.left[0] != now:
        memo.left = (now, {})
    known = memo.left[1]
    if rank not in known:
        known[rank] = _left_early(m, rank, now)
    return known[rank]


def _left_early(m: TraceModel, rank: int, now: int) -> bool:
    ex = exited(m, rank)
    if ex is not None:
        if is_crash(ex) or current_op(m, rank) is None:
            return True  # (left after its last op, or crashed: gone, whoever stopped after)
        # (left cleanly inside an op: gone where the job went on after it; a rank that stayed
        # asleep a moment longer, as a loaded machine wakes one, did not make it go on)
        t = departed_ns(m, rank) or int(ex["ts"])
        return _survivors_last(m)[0] >= t or any(
            r != rank and act > t + SLACK_NS for act, r in _last_acts(m))
    if not is_dead(m, rank, now):
        return False
    if rank in vanished(m, now):
        return True
    k = killed(m, rank)
    if k is not None and k.get("src") == SNAPSHOT:  # gone while a snapshot saw others still there
        return _survivors_last(m)[1] > int(k["ts"])
    if k is not None:  # killed while others went on (ranks killed together are a job stopped)
        t = departed_ns(m, rank) or int(k["ts"])
        if _went_on_after(m, t):
            return True
        if stopped(k):  # (stopped by a signal too: only where it went by itself, long before)
            return _stopped_first(m, rank, k, t)
        stops = _stops(m)  # (went first, and the others were stopped because it went: some of them waited for it)
        return (stops.latest > t and rank in stops.awaited) or _unstopped_before(m, rank, k, t, stops)
    return m.end_ns - m.last_seen(rank) > dead_after_ns(m, rank)


def awaited_first(m: TraceModel, rank: int, i: int, gone: Sequence[int]) -> list[int]:
    """Of the members gone before op ``i`` of ``rank`` (a collective) failed on a closed
    connection, those that never entered its instance, where each went before any of the
    others, which left no word of how (an unseen death, timed by its last sign of life: a
    SIGKILL, or a launcher's SIGTERM nothing noted): those entered it and
    waited there for the absent ones, and were stopped because they went (mp.spawn SIGTERMs
    the ranks left when one dies; helper-105: a SIGKILLed rank and the victim stopped while
    waiting for it were blamed together).  Otherwise ``gone`` as it is."""
    if len(gone) < 2 or (key := collective_of(m, rank, i)) is None:
        return list(gone)
    inst = m.collective(key[1], key[2], key[0])
    absent = [p for p in gone if p not in inst]
    inside = [p for p in gone if p in inst]
    if not absent or not inside or not all((k := killed(m, p)) is not None and unseen_death(k) for p in inside):
        return list(gone)
    first_in = min(departed_ns(m, p) or 0 for p in inside)
    went = max(d if (d := departed_ns(m, p)) is not None else -1 for p in absent)
    # (every absent one before any inside: a rank inside killed first, while an absent one
    # was still heard from, is the failure's cause; helper-107 found a slack that hid it)
    return absent if went < first_in else list(gone)


def went_first(m: TraceModel, ranks: Sequence[int]) -> list[int]:
    """Of ranks that left before an op failed, those that went by themselves where some did:
    a rank stopped by a signal (``vocab.stopped``) beside one that died, crashed or left was
    stopped because that one went (a launcher ending the job), and is no culprit."""
    stops = _stops(m)
    own = [r for r in ranks if r not in stops.ranks]
    if own:
        return own
    # (only stopped ranks left: the one they were stopped for is a rank they waited for that
    # went otherwise, or never came (``_Stops.never_came``), a member whose connection the
    # failing one may not have had yet)
    first = sorted(r for r in stops.awaited
                   if r in stops.never_came or (k := killed(m, r)) is not None and not stopped(k))
    return first or list(ranks)


def stopped_by(m: TraceModel) -> list[str]:
    """The signals that stopped every rank of the job (``vocab.stopped``: Ctrl-C, scancel, a
    launcher's SIGTERM), short names, where each rank's end was one; else []."""
    if not m.exits_seen:
        return []
    signals: set[str] = set()
    for r, rt in m.ranks.items():
        ex = _last_exit(m, r) if rt.exits else None
        if ex is None or not stopped(ex):
            return []
        signals.add(_short_signal(str(ex["signal"])))
    return sorted(signals)


#: The name torch gives the default (world) process group
WORLD = "0"


@dataclasses.dataclass(frozen=True)
class _Stops:
    """The ranks stopped by a signal (``vocab.stopped``): who, when the last of them
    departed (-1: none did), and the ranks they waited for when stopped (members of the op
    each was blocked in, or had just failed in, that had not entered it)."""

    ranks: frozenset[int]
    latest: int
    awaited: frozenset[int]
    #: Per rank awaited, for each op it was absent from: when the last of the stopped ranks
    #: waiting there departed, and since when the first of them had waited
    waits: Mapping[int, tuple[tuple[int, int], ...]]
    #: When the first rank that went otherwise (a crash, ``os._exit``, unseen, an exit)
    #: departed (-1: none did)
    first_own: int
    #: hang_after as the ranks recorded it (``TraceModel.hang_after`` asks every meta)
    hang_ns: int
    #: The stopped ranks whose wait in a collective was a hang cut short (``cut_short``):
    #: rank -> (that op, the members absent from it that had left by themselves)
    cut_short: Mapping[int, tuple[int, frozenset[int]]] = dataclasses.field(default_factory=dict)
    #: When the first SIGTERM (``vocab.TERM_SIGNALS``) came: the departure of a rank it killed,
    #: or the ``stop_ts`` of one whose own handler took it and that left (-1: none came)
    earliest_term: int = -1
    #: Members of the world that wrote nothing to this trace, absent from a collective the
    #: stopped ranks waited in, that no group proves running (``never_came``): they never
    #: came, dead before they recorded anything (a rank that dies before ``instrument()``,
    #: the launcher stopping the rest while they wait in their first collective)
    never_came: frozenset[int] = frozenset()


def _stops(m: TraceModel) -> _Stops:
    """``_Stops``, once per version.  A rank that went otherwise (SIGKILLed, ``os._exit``)
    before them, and that they waited for, went first and the others were stopped because
    it went: a launcher ends the rest of a job whose rank died (mp.spawn and torchrun send
    SIGTERM within ~40 ms, inside the slack of ranks killed together).  Time alone does not
    say it: an unseen death is timed by the rank's last sign of life, up to a sample
    interval early, so a rank SIGKILLed in the same stop as the others reads as gone first;
    but the ranks it left behind wait for it, and those stopped together with it do not."""
    memo = _memo(m)
    if memo.stops is None:
        ranks: set[int] = set()
        latest = first_own = earliest_term = -1
        absent: dict[tuple, list[int]] = {}
        spans: dict[tuple, list[int]] = {}  # per op waited in: [last departure, first wait began]
        waiting: dict[tuple, list[tuple[int, int]]] = {}  # per op waited in: the stopped ranks in it, their op
        if m.exits_seen:
            for r, rt in m.ranks.items():
                if not rt.exits:
                    continue
                if (k := killed(m, r)) is None or not stopped(k):
                    if (ex := _last_exit(m, r)) is not None:
                        t = departed_ns(m, r) or int(ex["ts"])
                        first_own = t if first_own < 0 else min(first_own, t)
                        if ex.get("stop_signal") in TERM_SIGNALS and (ts := ex.get("stop_ts", -1)) >= 0:
                            # (its own handler took the SIGTERM and it left gracefully: when it came)
                            earliest_term = ts if earliest_term < 0 else min(earliest_term, ts)
                    continue
                ranks.add(r)
                dep = departed_ns(m, r) or -1
                latest = max(latest, dep)
                if dep >= 0 and k.get("signal") in TERM_SIGNALS:
                    earliest_term = dep if earliest_term < 0 else min(earliest_term, dep)
                i = current_op(m, r)
                if i is None and (i := m.last_op(r)) is not None and i not in rt.exc:
                    continue  # (between ops: waiting for nobody; an op that failed was waiting)
                if i is None:
                    continue
                s = m.sig_of(r, i)
                seq = int(rt.seq[i])
                key = (s.space, s.group, seq) if seq >= 0 and not s.flags & P2P else (r, i)
                since = blocked_since(m, r, i)
                waiting.setdefault(key, []).append((r, i))
                if (span := spans.get(key)) is not None:  # (16k ranks stopped in one collective: its members asked once)
                    span[0], span[1] = max(span[0], dep), min(span[1], since)
                    continue
                spans[key] = [dep, since]
                came = m.collective(s.group, seq, s.space) if len(key) == 3 else m.counterparts(r, i)
                out = [p for p in m.members(r, i) if p not in came]
                if s.group == WORLD and len(key) == 3 and not m.groups.get(WORLD):
                    # (the world's group whose members no record listed: known by the ranks
                    # that ran it, which leaves out one that never came to any of its ops)
                    out += [p for p in m.ranks if p not in came]
                absent[key] = out
        waits: dict[int, list[tuple[int, int]]] = {}
        for key, out in absent.items():
            span = (spans[key][0], spans[key][1])
            for p in out:
                waits.setdefault(p, []).append(span)
        never: set[int] = set()
        if len(m.ranks) < m.world_size:  # (a member of the world wrote nothing here)
            for key, out in absent.items():
                if len(key) == 3:
                    never.update(never_came(m, out, key[0], key[1]))
        cut: dict[int, tuple[int, frozenset[int]]] = {}
        if first_own >= 0 or never:  # (some rank went by itself, or never came: were any stopped waiting for it?)
            for key, out in absent.items():
                if len(key) != 3 or not out:
                    continue
                first = min((d for r, _ in waiting[key] if (d := departed_ns(m, r)) is not None), default=-1)
                left = frozenset(p for p in out if p in never or _went_before(m, p, ranks, first))
                if left:
                    cut.update((r, (i, left)) for r, i in waiting[key])
        memo.stops = _Stops(frozenset(ranks), latest, frozenset(waits), {p: tuple(w) for p, w in waits.items()},
                            first_own, int((m.hang_after() or DEFAULT_HANG_AFTER) * 1e9), cut, earliest_term,
                            frozenset(never))
    return memo.stops


def _unstopped_before(m: TraceModel, rank: int, k: dict, t: int, stops: _Stops) -> bool:
    """Whether a rank whose death nothing recorded (``k``: an unseen death, SIGKILL or the
    OOM killer, last heard from at ``t``), or that cut itself off (``os._exit`` with a
    failing code, timed by its own exit), went before a SIGTERM ended the others: none
    reached it, and it was last heard from no later than the first of them was stopped.  A launcher that ends a job (mp.spawn, torchrun, SLURM, Kubernetes) sends every
    rank it stops SIGTERM first; a rank that got none was gone already, and the others were
    stopped because it went (before, with none of them waiting in an op, a rank SIGKILLed
    between ops, the launcher stopping the rest, read "no findings", exit 0).  The recorder
    says that none reached it: the native one's death handler notes a SIGTERM in the spool
    as the signal comes, whatever ends the process after (``stop_signal``, or an exit by the
    signal), the Python one's faulthandler in a file next to it (only while SIGTERM has its
    default action); unless the program took the signal from it or ignores it, which the
    spool then says (``term_unwatched``: a program's own ``signal.signal(SIGTERM, ...)``
    after init, SIGTERMed with the rest, read as gone before them; the Python recorder's
    said so from its first tick until it noted SIGTERM, helper-121).  The first SIGTERM is that
    of a rank killed by it or of one whose own handler took it and left (``stop_ts``)."""
    meta = m.ranks[rank].meta
    # (os._exit: mp.spawn SIGTERMed the other while it was between ops, or in the op the
    # leaver had entered, waiting for nobody; before, "no findings", exit 0)
    return ((unseen_death(k) or k.get("reason") == "os._exit") and not k.get("stop_signal")
            and not k.get("term_unwatched") and meta is not None
            and meta.get("recorder") in NOTES_TERM and 0 <= t <= stops.earliest_term)


#: The recorders (``meta.recorder``) whose spools say whether a SIGTERM could have come unnoted
NOTES_TERM = frozenset({"native", "python"})


def _went_before(m: TraceModel, p: int, stopped_ranks: set[int], first: int) -> bool:
    """Whether rank ``p``, absent from an op that ranks stopped by a signal waited in (the
    first of them stopped at ``first``), had left before, by itself: an ``exit`` it wrote (a
    clean one, ``sys.exit(3)``, a crash; exactly timed), with no stop signal its own handler
    took (``stop_signal``: stopped with the job, gracefully), nor ``uninstrument()`` (only
    its recording ended: the process went on).  A kill is ``killed``'s and ``dead_rank``'s
    to judge (a SIGKILL is timed by the rank's last sign of life)."""
    if p in stopped_ranks or first < 0 or (ex := exited(m, p)) is None or ex.get("stop_signal") or \
            ex.get("reason") == "uninstrument":
        return False
    return int(ex["ts"]) < first


def cut_short(m: TraceModel) -> Mapping[int, tuple[int, frozenset[int]]]:
    """The ranks stopped by a signal (a launcher ending the job) while they waited in a
    collective that a member had left the job without entering, by an exit of its own
    (``sys.exit(3)``, a clean exit, a crash; ``_went_before``): a hang however short, since
    it could never have completed.  Rank -> (the op it waited in, those members: the hang's
    culprits; members stopped with the job were only a moment behind).  A whole job
    stopped while its ranks were a moment into a collective is no hang; this is."""
    if not m.exits_seen:
        return {}
    ends = [stopped(rt.exits[-1]) for rt in m.ranks.values() if rt.exits]
    if not any(ends) or all(ends) and len(m.ranks) >= m.world_size:
        return {}  # (no rank stopped, or none left by itself nor never came: the stops not asked for, 16k ranks ~0.2 s)
    return _stops(m).cut_short


def _stopped_first(m: TraceModel, rank: int, k: dict, t: int) -> bool:
    """Whether a rank stopped by a signal (``k``, at ``t``) went by itself, before the job
    was stopped: a rank SIGTERMed by hand while the others hung on it until a scancel.  Only
    where its spool header recorded the signal it died of (``src`` "spool", ``reason``
    "signal": exactly timed; a launcher's note is timed when it looked, or by a silent
    rank's last sign of life), no rank went otherwise before it
    (a launcher stopping the rest of a job after a death stops it too), and some op it was
    absent from held stopped ranks that were stopped more than the recorded hang_after
    (``TraceModel.hang_after``, not the caller's) after it and had
    not been waiting there hang_after already when it went (a hang before it is that hang's;
    one stop of the whole job, even node by node, lands within hang_after)."""
    if k.get("src") != "spool" or k.get("reason") != "signal":
        return False
    stops = _stops(m)
    if 0 <= stops.first_own <= t + SLACK_NS:
        return False
    hang = stops.hang_ns
    return any(last > t + hang and since >= t - hang for last, since in stops.waits.get(rank, ()))


def _last_acts(m: TraceModel) -> tuple[tuple[int, int], ...]:
    """The two latest (time, rank) of any rank's last op begun or completed, once per
    version (whether a rank other than one did something after it, asked of every rank)."""
    memo = _memo(m)
    if memo.acted is None:  # (the table's columns: 16k ranks asked one by one cost ~0.14 s)
        t = m.table
        acts = np.maximum(t.last_begin[:t.size], t.last_comp[:t.size])
        top = np.argsort(acts)[-2:][::-1].tolist() if t.size else []
        memo.acted = tuple((int(acts[s]), t.traces[s].rank) for s in top)
    return memo.acted


def _went_on_after(m: TraceModel, t: int) -> bool:
    """Whether the job went on after a rank left in the middle of things at ``t``: an op of
    a rank not killed failed since, or one was heard from past the slack."""
    last_failed, last_seen = _survivors_last(m)
    return last_failed >= t or last_seen > t + SLACK_NS


def gone_early(m: TraceModel, ranks: Sequence[int], now: int) -> set[int]:
    """Those of ``ranks`` (each in the model) that ``left_early``: a rank with no exit,
    heard from within the shortest dead threshold and not vanished is not, judged for all
    at once (``_heard``); only the others are asked one by one (16k ranks waiting in a hang:
    ~14 us a rank asked)."""
    if not ranks:
        return set()
    arr = np.fromiter(ranks, np.int64, len(ranks))
    ask = ~_heard(m.table, m.slots_of(arr), now)[0] | _alone(m, arr, now)
    return {r for r in arr[ask].tolist() if left_early(m, r, now)}


def _alone(m: TraceModel, ranks: np.ndarray, now: int) -> np.ndarray:
    """Which of ``ranks`` (each in the model) have an exit event or vanished: judged one by
    one wherever ranks are judged together (their exits are walked only where some rank
    has one, ``exits_seen``)."""
    out = np.zeros(ranks.shape[0], np.bool_)
    if m.exits_seen:
        out |= np.fromiter((bool(m.ranks[r].exits) for r in ranks.tolist()), np.bool_, ranks.shape[0])
    gone = vanished(m, now)
    if gone:
        out |= np.isin(ranks, np.fromiter(gone, np.int64, len(gone)))
    return out


def _heard(t: RankTable, slots: np.ndarray, now: int) -> tuple[np.ndarray, np.ndarray]:
    """Whether each slot's rank was heard from within ``DEAD_MIN_S`` of ``now`` (or never
    sent a heartbeat): no dead threshold is shorter, so such a rank is not silent past its
    own (``is_dead``); and how long each has been silent (``is_dead``'s measure)."""
    hb = t.last_hb[slots]
    silent = now - np.maximum(hb, t.last_ts[slots])
    return (hb == 0) | (silent <= int(DEAD_MIN_S * 1e9)), silent


def _survivors_last(m: TraceModel) -> tuple[int, int]:
    """Over the ranks not killed: the latest failure of an op and the latest sign of life
    (what "killed while others went on" compares with), once per version."""
    memo = _memo(m)
    if memo.survivors is None:
        failed = [m.failed_ns(p, i) for p, i in m.failed[-1000:] if killed(m, p) is None]
        seen = [m.last_seen(r) for r in m.ranks if killed(m, r) is None]
        memo.survivors = (max(failed, default=-1), max(seen, default=-1))
    return memo.survivors


def peers_gone(m: TraceModel, rank: int, i: int) -> tuple[list[int], list[int]]:
    """For an op that failed because a connection closed: the other members that (left with
    an exit by then, stayed silent since).  Members whose own op of this instance failed too
    are fellow victims, and members heard from after the failure are around."""
    t = m.failed_ns(rank, i) + SLACK_NS
    left, silent = [], []
    for p, dep, seen in _bystanders(m, rank, i):
        if p == rank:
            continue
        if dep is not None:
            if dep <= t:
                left.append(p)
        elif seen <= t:
            silent.append(p)
    return left, silent


def _bystanders(m: TraceModel, rank: int, i: int) -> list[tuple[int, int | None, int]]:
    """The members of op ``i``'s instance whose own op of it did not fail, in member order,
    with when each departed (None: it did not) and was last heard from; worked out once per
    collective instance and model version (each of 16k ranks whose op failed asked it, and
    each walked every member: ~250 s a diagnosis of a 16k job whose all_reduce failed)."""
    key = collective_of(m, rank, i)
    memo = _memo(m)
    got = memo.bystanders.get(key) if key is not None else None
    if got is None:
        # (the instance's own row, not ``counterparts``: that puts the asking rank's op in it,
        # which a rank with two ops of one seq would make differ by who asked first)
        inst = m.collective(key[1], key[2], key[0]) if key is not None else m.counterparts(rank, i)
        got = [(p, departed_ns(m, p), m.last_seen(p)) for p in m.members(rank, i)
               if not (p in inst and inst[p] in m.ranks[p].exc)]
        if key is not None:
            memo.bystanders[key] = got
    return got


def vanished(m: TraceModel, now: int) -> frozenset[int]:
    """Ranks that left without an ``exit`` while their peers' ops failed.

    A peer's op failed because a connection closed, and this rank has been silent since the
    failure: it vanished when it is the only member of that op that could have left, or once
    it has stayed silent for ``vanish_after_ns``.  Judged from the trace alone, so a finished
    trace (every rank gone together) reads the same as the live job did.
    """
    memo = _memo(m)
    if memo.vanished is not None and memo.vanished[0] == now:
        return memo.vanished[1]
    out: set[int] = set()
    for p, i in m.failed[-1000:]:
        if m.exc_kind(p, i).kind != PEER_GONE:
            continue
        left, silent = peers_gone(m, p, i)
        for r in silent:
            if r in out or exited(m, r) is not None or r not in m.ranks:
                continue
            if (silent == [r] and not left) or now - m.last_seen(r) > vanish_after_ns(m, r):
                out.add(r)
    res = frozenset(out)
    memo.vanished = (now, res)
    return res


# ---------------------------------------------------------------------- what a rank is doing
def top_level_ops(m: ModelLike, rank: int) -> np.ndarray:
    """The rank's ops a user issued (no inner traffic, no containers), in begin order: what
    the console steps through and selects.  ``m``: a TraceModel or a published view."""
    rt = m.ranks.get(rank)
    if rt is None or rt.n == 0:
        return np.zeros(0, np.int64)
    order = rt.order()
    return order[(m.sig_flags(rt.sig[order]) & _TOP) == 0]


def rank_state(m: TraceModel, rank: int, t: int, *, as_of: bool = False) -> RankState:
    """What ``rank`` is doing at ``t``: '<op> for 12.3 s', idle, exited, crashed or dead.
    ``as_of``: as of ``t``, events recorded later ignored (replay)."""
    return _as_of(m, rank, t) if as_of else _present(m, rank, t)


def _present(m: TraceModel, rank: int, now: int) -> RankState:
    rt = m.ranks.get(rank)
    if rt is None:
        return RankState("unknown", "no events", None, 0)
    cur = current_op(m, rank)
    if is_dead(m, rank, now):
        seen = max(rt.last_hb, rt.last_ts)
        where = f", was in {m.label(rank, cur)}" if cur is not None else ""
        k = killed(m, rank)
        if k is not None:
            kt = int(k["ts"])
            if not left_early(m, rank, now):  # stopped with the whole job: say what it was doing
                return RankState("dead", f"{_doing(m, rank, cur, kt)} when the job was stopped "
                                 f"({describe_kill(k)})", cur, kt)
            return RankState("dead", f"dead ({describe_kill(k)}{where})", cur, kt)
        return RankState("dead", f"dead (last seen {(now - seen) / 1e9:.1f} s ago{where})", cur, seen)
    ex = exited(m, rank)
    if ex is not None:
        if crash(m, rank) is not None:
            what = ex.get("signal") or ex.get("exc") or ex.get("reason")
            return RankState("crashed", f"crashed ({what})", m.last_op(rank, completed=False), int(ex["ts"]))
        return RankState("exited", exited_text(ex), m.last_op(rank), int(ex["ts"]))
    if cur is not None:
        return _blocked_state(m, rank, cur, now)
    last = m.last_op(rank)
    if last is None:
        return RankState("idle", _outside(rt) or "idle (no ops yet)", None, rt.first_ts)
    return _idle(m.label(rank, last), last, int(rt.comp[last]), now)


def _idle(label: str, last: int, done: int, t: int) -> RankState:
    """'idle (last all_reduce #3 (group 0) 2.0 s ago)' (``_state_text``)."""
    return RankState("idle", _state_text(IDLE, label, f"{(t - done) / 1e9:.1f}"), last, done)


def _blocked(flags: int, label: str, i: int, since: int, t: int) -> RankState:
    """'in all_reduce #3 (group 0) for 2.0 s' / 'waiting on …' (``_state_text``; ``flags``:
    the op's signature flags)."""
    return RankState("blocked", _state_text(WAITING if flags & ASYNC else BLOCKED, label, f"{(t - since) / 1e9:.1f}"),
                     i, since)


#: How a plain rank's state reads, by its wording (``_state_text``)
IDLE, BLOCKED, WAITING = 0, 1, 2


def _state_text(wording: int, label: str, secs: str) -> str:
    """'idle (last all_reduce #3 (group 0) 2.0 s ago)' / 'in all_reduce #3 (group 0) for
    2.0 s' / 'waiting on …' (an async op's wait()): the one wording, whoever judged it."""
    if wording == IDLE:
        return f"idle (last {label} {secs} s ago)"
    return f"{'waiting on' if wording == WAITING else 'in'} {label} for {secs} s"


_KINDS = np.array(["blocked", "idle"], object)  # (a plain rank's kind: whether idle)

#: Below this many ns (2**23 s, ~97 days), an interval's seconds to one decimal
#: (``f"{ns / 1e9:.1f}"``) are read off the integer exactly (``_tenths``): half the float's
#: step there, 2**-31 s, is under a nanosecond
_TENTHS_EXACT_NS = 2**23 * 10**9
#: Bits of a plain rank's text key that hold its tenths (``_plain_states``: a label's
#: number above them, the wording's two bits in between); all ones: formatted as a float
_TENTHS_BITS = 28
assert _TENTHS_EXACT_NS // 100_000_000 < (1 << _TENTHS_BITS) - 1  # (every exact tenths fits below the mark)


def _tenths(ns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each interval's ``f"{ns / 1e9:.1f}"`` as tenths of a second, computed on the integers,
    and where that is not sure to be what the float formats to (a negative interval, one
    exactly halfway between two tenths, or one too long: those are formatted as floats).
    An interval off a halfway point by a nanosecond or more is off it in the float too,
    while the float's error is under a nanosecond (below ``_TENTHS_EXACT_NS``)."""
    tenths = (ns + 50_000_000) // 100_000_000
    odd = (ns < 0) | (ns >= _TENTHS_EXACT_NS) | (ns % 100_000_000 == 50_000_000)
    return tenths, odd


def _outside(rt: RankTrace) -> str | None:
    """Where a rank ``commscope snapshot`` saw in no collective is instead: its last stack's
    innermost user frame, and whether it was busy (CPU) or waiting."""
    if not rt.meta or rt.meta.get("recorder") != SNAPSHOT or rt.last_stack is None:
        return None
    unread = unread_of(rt.last_stack)
    if unread is not None:  # (not "in no collective: at ?": nothing is known of where it is)
        return f"not read by py-spy ({unread[1]})"
    where = stacks.one_line(stacks.view(rt.last_stack, rt.stacks_folded)) or "?"
    cpu = (rt.samples.last or {}).get("cpu")
    busy = f", {cpu:.0f}% CPU" if isinstance(cpu, int | float) else ""
    return f"in no collective: at {where}{busy}"


def _blocked_state(m: TraceModel, rank: int, i: int, t: int) -> RankState:
    """'in all_reduce #3 (group 0) for 2.0 s' / 'waiting on …' (an async op's wait())."""
    return _blocked(int(m.sig_flags(m.ranks[rank].sig[i:i + 1])[0]), m.label(rank, i), i,
                    blocked_since(m, rank, i), t)


#: Exit reasons in words (the ``exit`` event keeps the recorder's own names).
EXIT_WORDS = {"uninstrument": "recording stopped"}


def exited_text(ex: dict) -> str:
    """A rank's state after its exit, in words: a rank that destroyed its process group
    "left its process group", which is not its process exiting: it may run on, as one
    that destroyed its group early did while its peers went on ("rank 1 is exited
    (destroy_process_group)", helper-203)."""
    if left_group(ex):
        return "left its process group (destroy_process_group)"
    return f"exited ({exit_words(ex)})"


def left_group(ex: dict) -> bool:
    """Whether an exit is a rank destroying its process group, not its process ending."""
    return ex.get("reason") == "destroy_process_group" and not ex.get("code") and not ex.get("stop_signal")


def exit_words(ex: dict) -> str:
    """How a rank left, in words ('atexit', 'atexit, code 3'): its reason, and its exit
    code where it is not 0 (``sys.exit(3)``: the code the launcher reports); stopped by a
    signal it took (Ctrl-C's SIGINT), that signal ("exited (atexit)" for a rank stopped by
    Ctrl-C while it sat in native code: helper-186)."""
    why = str(ex.get("reason") or "exit")
    code = ex.get("code")
    why = EXIT_WORDS.get(why, why)
    if ex.get("stop_signal"):
        why = f"stopped by {signal_label(str(ex['stop_signal']))}"
    return f"{why}, code {code}" if isinstance(code, int) and not isinstance(code, bool) and code else why


def _short_signal(name: str) -> str:
    """'SIGTERM' for 'Terminated' / 'SIGTERM (Terminated)'."""
    return signal_label(name).split(" (")[0]


def ending(m: TraceModel, rank: int, now: int, state: RankState | None = None) -> str | None:
    """How a rank that is gone ended, in a few words for a table cell: 'exited (at exit)',
    'crashed (SIGSEGV)', 'crashed (RuntimeError)', 'killed (SIGKILL)', 'job stopped
    (SIGTERM)' for ranks stopped together with their job, 'dead (silent)'.  None while it
    runs.  ``state``: the rank's state when the caller has it (as of a replay cursor).  The
    whole story (the exception, the stack) is in the findings."""
    st = state or rank_state(m, rank, now)
    if st.kind == "exited":  # (the exit the state is of: a replay's cursor may be before a later one)
        rt = m.ranks.get(rank)
        ex = next((e for e in reversed(rt.exits) if int(e["ts"]) == st.since_ns), None) if rt else None
        ex = ex or exited(m, rank) or {}
        # (a cell's words; "exited" said of a rank that ran on after destroying its group, helper-207)
        return f"left its group ({exit_words(ex)})" if left_group(ex) else f"exited ({exit_words(ex)})"
    if st.kind == "crashed":
        ex = exited(m, rank) or {}
        if ex.get("signal"):
            return f"crashed ({_short_signal(str(ex['signal']))})"
        lines = [x for x in str(ex.get("exc") or ex.get("reason") or "").splitlines() if x.strip()]
        line = lines[-1] if lines and lines[0].startswith("Traceback") else lines[0] if lines else ""
        words = line.split(":")[0].split()
        return f"crashed ({words[-1][:32] if words else 'exception'})"  # the exception's type
    if st.kind == "dead":
        k = killed(m, rank)
        if k is None or int(k["ts"]) > now:  # (as of a replay cursor: not killed yet)
            return "dead (silent)"
        alone = left_early(m, rank, now)
        if unseen_death(k):  # (nothing said how: SIGKILL, the OOM killer)
            return "died (no word)" if alone else "job stopped (no word)"
        how = _short_signal(str(k["signal"])) if k.get("signal") else f"os._exit({k.get('code')})"
        return f"killed ({how})" if alone else f"job stopped ({how})"
    return None


def _doing(m: TraceModel, rank: int, cur: int | None, t: int) -> str:
    """'in all_reduce #12 (group 0) for 22.1 s' / 'idle, 22.2 s after all_reduce #11 (group 0)'
    at ``t``: what a rank was doing when the job around it was stopped."""
    if cur is not None:
        since = blocked_since(m, rank, cur)
        return f"in {m.label(rank, cur)} for {(t - since) / 1e9:.1f} s"
    last = m.last_op(rank)
    if last is None:
        return "idle (no ops yet)"
    return f"idle, {(t - int(m.ranks[rank].comp[last])) / 1e9:.1f} s after {m.label(rank, last)},"


def _as_of(m: TraceModel, rank: int, t: int) -> RankState:
    rt = m.ranks.get(rank)
    if rt is None:
        return RankState("unknown", "not started yet", None, 0)
    if rt.first_ts > t:
        # At the replay's start every rank of a job that started together reads the same:
        # "idle", not "not started yet" for the ones whose first event came a moment later.
        if rt.first_ts - m.start_ns > STARTUP_SLACK_NS:
            return RankState("unknown", "not started yet", None, 0)
        return RankState("idle", "idle (no ops yet)", None, rt.first_ts)
    exits = [e for e in rt.exits if e["ts"] <= t]
    running = blocked_at(m, rank, t)
    if running:
        return _blocked_state(m, rank, running[-1], t)
    if exits and (not rt.n or exits[-1]["ts"] + clock_slack(exits[-1]) >= _last_begin_before(m, rank, t)):
        ex = exits[-1]
        if is_kill(ex):
            if ex is killed(m, rank) and not left_early(m, rank, t):
                return _present(m, rank, t)  # stopped with the job: read as the present does
            return RankState("dead", f"dead ({describe_kill(ex)})", None, int(ex["ts"]))
        if is_crash(ex):
            return RankState("crashed", f"crashed ({ex.get('signal') or ex.get('exc') or ex.get('reason')})", None,
                             int(ex["ts"]))
        return RankState("exited", exited_text(ex), None, int(ex["ts"]))
    if rt.last_hb and t >= max(rt.last_hb, rt.last_ts) and is_dead(m, rank, t):
        return _present(m, rank, t)  # past its last word: the present answer is the answer
    last = _last_done_before(m, rank, t)
    if last is None:
        return RankState("idle", "idle (no ops yet)", None, rt.first_ts)
    return _idle(m.label(rank, last), last, int(rt.comp[last]), t)


def blocked_at(m: ModelLike, rank: int, t: int) -> list[int]:
    """The top-level ops the rank's threads were blocked in at ``t`` (``blocked_mask``), by
    their place in its window index: what it was doing then, whatever it did after."""
    rt = m.ranks.get(rank)
    if rt is None:
        return []
    idx = m.ops_in_window(rank, t, t + 1)
    if not idx.shape[0]:
        return []
    flags = m.sig_flags(rt.sig[idx])
    running = blocked_mask(flags, rt.begin[idx], rt.comp[idx], rt.wb[idx], rt.we[idx], t) & ((flags & _TOP) == 0)
    return idx[running].tolist()


def _candidates(m: ModelLike, rank: int, t: int, k: int = 256) -> np.ndarray:
    rt = m.ranks[rank]
    order = rt.order()
    n = int(np.searchsorted(rt.begin[order], t, side="right"))
    return order[max(0, n - k):n]


def _last_begin_before(m: ModelLike, rank: int, t: int) -> int:
    cand = _candidates(m, rank, t, 1)
    return int(m.ranks[rank].begin[cand[-1]]) if cand.shape[0] else 0


def last_op_before(m: ModelLike, rank: int, t: int) -> int | None:
    """The last top-level op the rank began at or before ``t`` (running, done or failed)."""
    rt = m.ranks.get(rank)
    if rt is None or rt.n == 0:
        return None
    cand = _candidates(m, rank, t, 64)
    cand = cand[(m.sig_flags(rt.sig[cand]) & _TOP) == 0]
    return int(cand[-1]) if cand.shape[0] else None


def _last_done_before(m: TraceModel, rank: int, t: int) -> int | None:
    rt = m.ranks[rank]
    cand = _candidates(m, rank, t)
    if not cand.shape[0]:
        return None
    comp = rt.comp[cand]
    ok = (comp > 0) & (comp <= t) & ((m.sig_flags(rt.sig[cand]) & _TOP) == 0)
    if not ok.any():
        return None
    return int(cand[ok][np.argmax(comp[ok])])


def sample_at(m: TraceModel, rank: int, t: int) -> dict:
    """The latest resource sample at or before ``t``."""
    s = m.samples(rank)
    ts = s["ts"]
    k = int(np.searchsorted(ts, t, side="right")) - 1
    if k < 0:
        return {}
    out = {}
    for key in ("cpu", "rss", "gpu_util", "gpu_mem", "gpu_mem_total"):
        v = s[key][k]
        if v == v:
            out[key] = float(v)
    return out


# ---------------------------------------------------------------------- per-diagnose snapshot
@dataclasses.dataclass(frozen=True, slots=True)
class RankSnap:
    """One rank as diagnose() sees it at one judging time."""

    rank: int
    state: RankState
    exit: dict | None  # its exit event, if it exited after its last op (clean or crash)
    crashed: bool  # that exit was an uncaught exception or a fatal signal
    dead: bool  # gone without an exit (``TraceModel.is_dead``)
    last_done: int | None  # its last completed op


class RankSnapshot:
    """Every rank's ``RankSnap`` at ``now``, each computed on first use and then kept: a
    detector asking about a rank costs one dict lookup after the first."""

    __slots__ = ("_m", "_plain", "_snaps", "_states", "now", "version")

    def __init__(self, m: TraceModel, now: int):
        self._m = m
        self._plain = False
        self.now = now
        self.version = m.version
        self._snaps: dict[int, RankSnap] = {}
        self._states: dict[int, RankState] = {}

    def __getitem__(self, rank: int) -> RankSnap:
        s = self._snaps.get(rank)
        if s is None:
            m = self._m
            st = self.state(rank)
            ex = exited(m, rank) if rank in m.ranks else None
            s = self._snaps[rank] = RankSnap(
                rank, st, ex, st.kind == "crashed", st.kind == "dead",
                m.last_op(rank) if rank in m.ranks else None)
        return s

    def judge_plain(self) -> None:
        """The plain ranks' states, judged together once (``_plain_states``): what
        ``state`` then finds, as it would have computed it."""
        if not self._plain:
            self._plain = True
            plain = _plain_states(self._m, self.now)
            plain.update(self._states)  # (those judged before stand: the same states)
            self._states = plain

    def judged(self) -> Mapping[int, RankState]:
        """The states judged so far, by rank (read only; the mapping ``judge_plain`` leaves
        is a new one: ask again after it)."""
        return self._states

    def state(self, rank: int) -> RankState:
        """The rank's state alone (what ``rank_states`` publishes; a detector's ``[]`` adds
        the rest), computed once per snapshot either way."""
        st = self._states.get(rank)
        if st is None:
            st = self._states[rank] = _present(self._m, rank, self.now)
        return st


def snapshot(m: TraceModel, now: int) -> RankSnapshot:
    """The model's rank snapshot at ``now``: one per (model version, now), shared by every
    detector of one diagnose() (``diagnose`` makes it first; later calls find it)."""
    memo = _memo(m)
    if memo.snapshot is None or memo.snapshot.now != now:
        memo.snapshot = RankSnapshot(m, now)
    return memo.snapshot


def rank_states(m: TraceModel, now: int) -> dict[int, RankState]:
    """Every rank's state at ``now`` (what a published ``ModelView`` carries): from the
    model's snapshot, so a console that diagnosed this version at this ``now`` (the
    watermark moves only with reads) judges no rank twice.  The plain ranks are judged
    together first (``_plain_states``)."""
    snap = snapshot(m, now)
    snap.judge_plain()
    judged = snap.judged()
    for r in [r for r in m.ranks if r not in judged]:  # (the ranks not plain, each judged alone)
        snap.state(r)
    return dict(zip(m.ranks, map(judged.__getitem__, m.ranks), strict=True))


def _plain_states(m: TraceModel, now: int) -> dict[int, RankState]:
    """``_present`` of the plain ranks, judged together: a rank with ops and no exit, heard
    from within its dead threshold, not vanished, that is either blocked in an op
    or idle with every op complete and its begins in order (its last op is its newest).
    Their ops' columns are gathered at once; what is left per rank is its text.  Asked
    rank by rank, a state cost ~10 us of Python and numpy calls: most of a 16k-rank
    console's publishing.  Every other rank is judged by ``_present``."""
    t = m.table
    ranks = list(m.ranks)
    n = len(ranks)
    if not n:
        return {}
    rank_arr = np.array(ranks, np.int64)
    slots = m.slots_of(rank_arr)
    plain = (t.n[slots] > 0) & ~_alone(m, rank_arr, now)
    # heard from within its dead threshold: within DEAD_MIN_S (no threshold is shorter), else
    # asked of the rank's own (a console catching up judges ranks seconds after they were
    # last heard from; judged alone, 16k of them cost a publish ~0.2 s)
    heard, silent = _heard(t, slots, now)
    ask = np.flatnonzero(plain & ~heard)
    if ask.shape[0]:  # (as Python ints: a hostile sample interval's threshold passes int64)
        heard[ask] = [x <= dead_after_ns(m, ranks[i]) for x, i in zip(silent[ask].tolist(), ask.tolist(), strict=True)]
    plain &= heard
    where = np.flatnonzero(plain)
    if not where.shape[0]:
        return {}
    blocked_now = blocked_ranks(m)
    open_slots = np.unique(open_ops(m)[0])
    rank_of = rank_arr[where]
    cur_of = np.full(t.size, -1, np.int64)  # the op each slot's rank is blocked in (-1: none)
    if blocked_now:
        cur_of[m.slots_of(np.fromiter(blocked_now, np.int64, len(blocked_now)))] = np.fromiter(
            map(itemgetter(-1), blocked_now.values()), np.int64, len(blocked_now))
    cur = cur_of[slots[where]]
    idle = (cur < 0) & t.ordered[slots[where]] & ~np.isin(slots[where], open_slots)
    take = (cur >= 0) | idle
    where, rank_of, cur, idle = where[take], rank_of[take], cur[take], idle[take]
    ss = slots[where]
    ops = np.where(idle, t.n[ss] - 1, cur)
    sig, seq, peer, begin, wb, comp = t.gather(("sig", "seq", "peer", "begin", "wb", "comp"), t.block[ss],
                                              t.base[ss] + ops)
    flags = m.sig_flags(sig)
    since = np.where(idle, comp, _since(flags, begin, wb))
    # Ranks in step read alike: their texts are made once per distinct (op label, wording,
    # tenths of a second), and each rank's state is a tuple of shared strings (16k ranks
    # in one collective: a handful of texts, not 16k formattings, ~40% of the judging).
    tenths, odd = _tenths(now - since)
    is_async = (flags & ASYNC) != 0
    label_keys, label_of = _groups(sig.astype(np.int64), seq.astype(np.int64), peer.astype(np.int64))
    labels = [m.label_of(*key) for key in label_keys]
    wording = np.where(idle, IDLE, np.where(is_async, WAITING, BLOCKED))
    # (label, wording, tenths) in one int64 (``_TENTHS_BITS``)
    mark, bits = (1 << _TENTHS_BITS) - 1, _TENTHS_BITS
    keys, text_of = np.unique(label_of << (bits + 4) | wording << bits | np.where(odd, mark, tenths),
                              return_inverse=True)
    texts = []
    for key in keys.tolist():
        k = key & mark
        texts.append(_state_text(key >> bits & 3, labels[key >> (bits + 4)], f"{k // 10}.{k % 10}"))
    text = np.array(texts, object)[text_of.reshape(-1)]
    for j in np.flatnonzero(odd).tolist():  # (as the float formats it)
        text[j] = _state_text(int(wording[j]), labels[int(label_of[j])], f"{int(now - since[j]) / 1e9:.1f}")
    # (``tuple.__new__`` makes each RankState as its own ``__new__`` would, without a
    # Python call a rank)
    return dict(zip(rank_of.tolist(), map(tuple.__new__, repeat(RankState),
                                          zip(_KINDS[idle.astype(np.intp)].tolist(), text.tolist(), ops.tolist(),
                                              since.tolist(), strict=True)),
                    strict=True))


def _groups(*columns: np.ndarray) -> tuple[list[tuple[int, ...]], np.ndarray]:
    """The distinct rows of ``columns`` (as tuples of Python ints) and each row's group in
    them: one sort of every column, as ``np.unique(axis=...)`` but a tenth of its cost."""
    n = columns[0].shape[0]
    order = np.lexsort(columns[::-1])
    cols = [c[order] for c in columns]
    change = np.zeros(n, np.bool_)
    change[:1] = True
    for c in cols:
        change[1:] |= c[1:] != c[:-1]
    group = np.cumsum(change) - 1
    of = np.empty(n, np.int64)
    of[order] = group
    firsts = np.flatnonzero(change)
    return list(zip(*(c[firsts].tolist() for c in cols), strict=True)), of


_RANK_OF_TRACE = attrgetter("rank")
