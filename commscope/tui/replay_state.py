"""What a rank was doing at a past moment: the rank table and gutter during replay.

The model's ``state`` describes the present (latest events); a replay cursor needs the
same answer as of time ``t``, ignoring everything recorded later.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from commscope.analysis.model import ASYNC, CONTAINER, NESTED, RankState

STARTUP_SLACK_NS = 2 * 10**9  # ranks whose streams begin this close to the job's start started with it


def state_at(m: Any, rank: int, t: int) -> RankState:
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
        running = (begin <= t) & ((comp == 0) | (comp > t)) & ((flags & (NESTED | CONTAINER)) == 0)
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
        if ex.get("exc") or ex.get("reason") in ("exception", "signal"):
            return RankState("crashed", f"crashed ({ex.get('signal') or ex.get('exc') or ex.get('reason')})", None,
                             int(ex["ts"]))
        return RankState("exited", f"exited ({ex.get('reason', 'exit')})", None, int(ex["ts"]))
    if rt.last_hb and t >= max(rt.last_hb, rt.last_ts) and m.is_dead(rank, t):
        return m.state(rank, t)
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
    cand = cand[(m.sig_flags(rt.sig[cand]) & (NESTED | CONTAINER)) == 0]
    return int(cand[-1]) if cand.shape[0] else None


def _last_done_before(m: Any, rank: int, t: int) -> int | None:
    rt = m.ranks[rank]
    cand = _candidates(m, rank, t)
    if not cand.shape[0]:
        return None
    comp = rt.comp[cand]
    ok = (comp > 0) & (comp <= t) & ((m.sig_flags(rt.sig[cand]) & (NESTED | CONTAINER)) == 0)
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
