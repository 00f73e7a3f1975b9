"""What rank r is doing at time t: the one implementation, for the detectors, the report
and the console (rank table, timeline gutter, replay cursor).

``rank_state(model, rank, t)`` describes the present: the rank's latest events, judged at
``t`` (a live clock, or a stored trace's end).  ``as_of=True`` gives the same answer as of
time ``t``, ignoring everything recorded later (a replay cursor).

``RankSnapshot`` holds what diagnose() asks about each rank (its state, exit, whether it
is dead) computed once per (model version, judging time), so the detectors read one typed
record per rank instead of calling back into the model: see ``snapshot``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from commscope.analysis.vocab import ASYNC, CONTAINER, NESTED, RankState, describe_kill, is_kill, signal_label

STARTUP_SLACK_NS = 2 * 10**9  # ranks whose streams begin this close to the job's start started with it
_TOP = NESTED | CONTAINER  # inner traffic and containers: never "the op a rank is in"


def top_level_ops(m: Any, rank: int) -> np.ndarray:
    """The rank's ops a user issued (no inner traffic, no containers), in begin order: what
    the console steps through and selects.  ``m``: a TraceModel or a published view."""
    rt = m.ranks.get(rank)
    if rt is None or rt.n == 0:
        return np.zeros(0, np.int64)
    order = rt.order()
    return order[(m.sig_flags(rt.sig[order]) & _TOP) == 0]


def rank_state(m: Any, rank: int, t: int, *, as_of: bool = False) -> RankState:
    """What ``rank`` is doing at ``t``: '<op> for 12.3 s', idle, exited, crashed or dead.
    ``as_of``: as of ``t``, events recorded later ignored (replay)."""
    return _as_of(m, rank, t) if as_of else _present(m, rank, t)


def _present(m: Any, rank: int, now: int) -> RankState:
    rt = m.ranks.get(rank)
    if rt is None:
        return RankState("unknown", "no events", None, 0)
    cur = m.current_op(rank)
    if m.is_dead(rank, now):
        seen = max(rt.last_hb, rt.last_ts)
        where = f", was in {m.label(rank, cur)}" if cur is not None else ""
        k = m.killed(rank)
        if k is not None:
            kt = int(k["ts"])
            if not m.left_early(rank, now):  # stopped with the whole job: say what it was doing
                return RankState("dead", f"{_doing(m, rank, cur, kt)} when the job was stopped "
                                 f"({describe_kill(k)})", cur, kt)
            return RankState("dead", f"dead ({describe_kill(k)}{where})", cur, kt)
        return RankState("dead", f"dead (last seen {(now - seen) / 1e9:.1f} s ago{where})", cur, seen)
    ex = m.exited(rank)
    if ex is not None:
        if m.crash(rank) is not None:
            what = ex.get("signal") or ex.get("exc") or ex.get("reason")
            return RankState("crashed", f"crashed ({what})", m.last_op(rank, completed=False), int(ex["ts"]))
        why = EXIT_WORDS.get(ex.get("reason", ""), ex.get("reason", "exit"))
        return RankState("exited", f"exited ({why})", m.last_op(rank), int(ex["ts"]))
    if cur is not None:
        since = m.blocked_since(rank, cur)
        verb = "waiting on" if m.sig_flags(rt.sig[cur:cur + 1])[0] & ASYNC else "in"
        return RankState("blocked", f"{verb} {m.label(rank, cur)} for {(now - since) / 1e9:.1f} s", cur, since)
    last = m.last_op(rank)
    if last is None:
        return RankState("idle", "idle (no ops yet)", None, rt.first_ts)
    done = int(rt.comp[last])
    return RankState("idle", f"idle (last {m.label(rank, last)} {(now - done) / 1e9:.1f} s ago)", last, done)


#: Exit reasons in words (the ``exit`` event keeps the recorder's own names).
EXIT_WORDS = {"uninstrument": "recording stopped"}


def _short_signal(name: str) -> str:
    """'SIGTERM' for 'Terminated' / 'SIGTERM (Terminated)'."""
    return signal_label(name).split(" (")[0]


def ending(m: Any, rank: int, now: int, state: RankState | None = None) -> str | None:
    """How a rank that is gone ended, in a few words for a table cell: 'exited (at exit)',
    'crashed (SIGSEGV)', 'crashed (RuntimeError)', 'killed (SIGKILL)', 'job stopped
    (SIGTERM)' for ranks stopped together with their job, 'dead (silent)'.  None while it
    runs.  ``state``: the rank's state when the caller has it (as of a replay cursor).  The
    whole story (the exception, the stack) is in the findings."""
    st = state or rank_state(m, rank, now)
    if st.kind == "exited":
        ex = m.exited(rank) or {}
        return f"exited ({EXIT_WORDS.get(ex.get('reason', ''), ex.get('reason', 'exit'))})"
    if st.kind == "crashed":
        ex = m.exited(rank) or {}
        if ex.get("signal"):
            return f"crashed ({_short_signal(str(ex['signal']))})"
        lines = [x for x in str(ex.get("exc") or ex.get("reason") or "").splitlines() if x.strip()]
        line = lines[-1] if lines and lines[0].startswith("Traceback") else lines[0] if lines else ""
        words = line.split(":")[0].split()
        return f"crashed ({words[-1][:32] if words else 'exception'})"  # the exception's type
    if st.kind == "dead":
        k = m.killed(rank)
        if k is None or int(k["ts"]) > now:  # (as of a replay cursor: not killed yet)
            return "dead (silent)"
        how = _short_signal(str(k["signal"])) if k.get("signal") else f"os._exit({k.get('code')})"
        return f"job stopped ({how})" if not m.left_early(rank, now) else f"killed ({how})"
    return None


def _doing(m: Any, rank: int, cur: int | None, t: int) -> str:
    """'in all_reduce #12 (group 0) for 22.1 s' / 'idle, 22.2 s after all_reduce #11 (group 0)'
    at ``t``: what a rank was doing when the job around it was stopped."""
    if cur is not None:
        since = m.blocked_since(rank, cur)
        return f"in {m.label(rank, cur)} for {(t - since) / 1e9:.1f} s"
    last = m.last_op(rank)
    if last is None:
        return "idle (no ops yet)"
    return f"idle, {(t - int(m.ranks[rank].comp[last])) / 1e9:.1f} s after {m.label(rank, last)},"


def _as_of(m: Any, rank: int, t: int) -> RankState:
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
    idx = m.ops_in_window(rank, t, t + 1)
    if idx.shape[0]:
        flags = m.sig_flags(rt.sig[idx])
        comp = rt.comp[idx]
        begin = rt.begin[idx]
        running = (begin <= t) & ((comp == 0) | (comp > t)) & ((flags & _TOP) == 0)
        is_async = (flags & ASYNC) != 0
        waiting = is_async & (rt.wb[idx] > 0) & (rt.wb[idx] <= t)
        running &= ~is_async | waiting
        if running.any():
            j = int(np.flatnonzero(running)[-1])
            i = int(idx[j])
            since = int(rt.wb[i]) if is_async[j] else int(begin[j])
            verb = "waiting on" if is_async[j] else "in"
            return RankState("blocked", f"{verb} {m.label(rank, i)} for {(t - since) / 1e9:.1f} s", i, since)
    if exits and (not rt.n or exits[-1]["ts"] >= _last_begin_before(m, rank, t)):
        ex = exits[-1]
        if is_kill(ex):
            if ex is m.killed(rank) and not m.left_early(rank, t):
                return _present(m, rank, t)  # stopped with the job: read as the present does
            return RankState("dead", f"dead ({describe_kill(ex)})", None, int(ex["ts"]))
        if ex.get("exc") or ex.get("reason") in ("exception", "signal"):
            return RankState("crashed", f"crashed ({ex.get('signal') or ex.get('exc') or ex.get('reason')})", None,
                             int(ex["ts"]))
        why = EXIT_WORDS.get(ex.get("reason", ""), ex.get("reason", "exit"))
        return RankState("exited", f"exited ({why})", None, int(ex["ts"]))
    if rt.last_hb and t >= max(rt.last_hb, rt.last_ts) and m.is_dead(rank, t):
        return _present(m, rank, t)  # past its last word: the present answer is the answer
    last = _last_done_before(m, rank, t)
    if last is None:
        return RankState("idle", "idle (no ops yet)", None, rt.first_ts)
    done = int(rt.comp[last])
    return RankState("idle", f"idle (last {m.label(rank, last)} {(t - done) / 1e9:.1f} s ago)", last, done)


def _candidates(m: Any, rank: int, t: int, k: int = 256) -> np.ndarray:
    rt = m.ranks[rank]
    order = rt.order()
    n = int(np.searchsorted(rt.begin[order], t, side="right"))
    return order[max(0, n - k):n]


def _last_begin_before(m: Any, rank: int, t: int) -> int:
    cand = _candidates(m, rank, t, 1)
    return int(m.ranks[rank].begin[cand[-1]]) if cand.shape[0] else 0


def last_op_before(m: Any, rank: int, t: int) -> int | None:
    """The last top-level op the rank began at or before ``t`` (running, done or failed)."""
    rt = m.ranks.get(rank)
    if rt is None or rt.n == 0:
        return None
    cand = _candidates(m, rank, t, 64)
    cand = cand[(m.sig_flags(rt.sig[cand]) & _TOP) == 0]
    return int(cand[-1]) if cand.shape[0] else None


def _last_done_before(m: Any, rank: int, t: int) -> int | None:
    rt = m.ranks[rank]
    cand = _candidates(m, rank, t)
    if not cand.shape[0]:
        return None
    comp = rt.comp[cand]
    ok = (comp > 0) & (comp <= t) & ((m.sig_flags(rt.sig[cand]) & _TOP) == 0)
    if not ok.any():
        return None
    return int(cand[ok][np.argmax(comp[ok])])


def sample_at(m: Any, rank: int, t: int) -> dict:
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

    __slots__ = ("_m", "_snaps", "now", "version")

    def __init__(self, m: Any, now: int):
        self._m = m
        self.now = now
        self.version = m.version
        self._snaps: dict[int, RankSnap] = {}

    def __getitem__(self, rank: int) -> RankSnap:
        s = self._snaps.get(rank)
        if s is None:
            m = self._m
            st = _present(m, rank, self.now)
            ex = m.exited(rank) if rank in m.ranks else None
            s = self._snaps[rank] = RankSnap(
                rank, st, ex, st.kind == "crashed", st.kind == "dead",
                m.last_op(rank) if rank in m.ranks else None)
        return s

    def state(self, rank: int) -> RankState:
        return self[rank].state


def snapshot(m: Any, now: int) -> RankSnapshot:
    """The model's rank snapshot at ``now``: one per (model version, now), shared by every
    detector of one diagnose() (``diagnose`` makes it first; later calls find it)."""
    snap = getattr(m, "_rank_snapshot", None)
    if snap is None or snap.version != m.version or snap.now != now:
        snap = RankSnapshot(m, now)
        m._rank_snapshot = snap
    return snap
