"""Summary statistics per op, group and rank, and the call sites where ranks wait most.

Collectives are measured per instance (one (group, seq) on every member): true latency,
arrival skew, per-rank waits, algbw/busbw from the true latency.  P2p ops and ops not
run by every member count with their own duration.  Ops that raised are counted per op
and group as the count counts them (a collective's instance once), and per rank
(``failed``), and each rank says how it ended (``end``: exited, crashed,
dead, or still running at the trace's end).  Ops completed without a measured duration
(Flight Recorder on Gloo, ends at the begin's timestamp) are counted (``untimed``) and left
out of latency, bandwidth and busy time; their arrival skew and waits still count.
Plain dicts, ready for JSON or tables.
"""

from __future__ import annotations

import bisect
import itertools
import warnings
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np

from commscope.analysis.bandwidth import busbw_factor, instances, sig_size
from commscope.analysis.model import ASYNC, NESTED, P2P, SPACE_FR, TraceModel, untimed
from commscope.analysis.rankstate import ending
from commscope.store.retention import BUCKETS, bucket_mid_s


def _pct(xs: list[float] | np.ndarray, q: float) -> float | None:
    if len(xs) == 0:
        return None
    return float(np.percentile(np.asarray(xs, dtype=np.float64), q))


class _Acc:
    def __init__(self) -> None:
        self.count = 0
        self.bytes = 0
        self.lat: list[np.ndarray] = []
        self.alg: list[np.ndarray] = []
        self.bus: list[np.ndarray] = []
        self.skew: list[np.ndarray] = []
        self.async_wait = 0
        self.wait = 0
        self.failed = 0
        self.untimed = 0

    def row(self) -> dict[str, Any]:
        lat = np.concatenate(self.lat) if self.lat else np.zeros(0)
        alg = np.concatenate(self.alg) if self.alg else np.zeros(0)
        bus = np.concatenate(self.bus) if self.bus else np.zeros(0)
        skew = np.concatenate(self.skew) if self.skew else np.zeros(0)
        alg, bus = alg[np.isfinite(alg)], bus[np.isfinite(bus)]
        return {"count": self.count, "bytes": int(self.bytes),
                "latency_p50_s": _s(_pct(lat, 50)), "latency_p99_s": _s(_pct(lat, 99)),
                "algbw_p50": _pct(alg, 50), "busbw_p50": _pct(bus, 50),
                "async_wait_s": round(self.async_wait / 1e9, 6), "wait_s": round(self.wait / 1e9, 6),
                "skew_p50_s": _s(_pct(skew, 50)), "skew_p99_s": _s(_pct(skew, 99)), "failed": self.failed,
                "untimed": self.untimed}


def _s(ns: float | None) -> float | None:
    return None if ns is None else round(ns / 1e9, 9)


def _end_of(model: TraceModel, r: int) -> str:
    """How the rank's stream ends, in a few words (``rankstate.ending``), or 'running'."""
    return ending(model, r, model.trace_end()) or "running"


def group_row(group: str, *, p2p: bool, fr: bool) -> str:
    """The row of the per-group table an op counts in: its group's, its p2p ops apart, and
    Flight Recorder's ops apart from the recorder's."""
    return group + (" (p2p)" if p2p else " (fr)" if fr else "")


def _group_key(s: Any) -> str:
    """``group_row`` of an op's signature."""
    return group_row(s.group, p2p=bool(s.flags & P2P), fr=s.space == SPACE_FR)


def compute_report(model: TraceModel, top_sites: int = 10) -> dict[str, Any]:
    by_op: dict[str, _Acc] = defaultdict(_Acc)
    by_group: dict[str, _Acc] = defaultdict(_Acc)
    by_rank: dict[int, _Acc] = defaultdict(_Acc)
    apart = model.foreign_streams  # (not of the run: kept out of every table, as out of the matching)
    for r in model.ranks:  # (every rank a row: one that ran no op too)
        if r not in apart:
            by_rank[r] = _Acc()
    site_wait: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # site -> [wait ns, count]
    incomplete = 0
    # collectives, per complete instance
    for (space, name), gi in model.coll.items():
        inst = instances(model, gi)
        total_rows = int((gi.seqs.rows() >= 0).any(axis=1).sum())
        incomplete += total_rows - inst.n
        if inst.n == 0:
            continue
        n = len(gi.members)
        codes = inst.sig[:, 0]
        gkey = name + (" (fr)" if space == SPACE_FR else "")
        for code in np.unique(codes).tolist():
            m = codes == code
            s = model.sigs[code]
            S = sig_size(s)
            timed = ~inst.untimed[m].any(axis=1)  # instances with a measured latency
            lat = inst.latency[m][timed].astype(np.float64)
            with np.errstate(divide="ignore", invalid="ignore"):
                alg = np.where(lat > 0, S / (lat / 1e9), np.nan)
            bus = alg * busbw_factor(s.op, n)
            for acc in (by_op[s.op], by_group[gkey]):
                acc.count += int(m.sum())
                acc.untimed += int((~timed).sum())
                acc.bytes += S * int(m.sum())
                acc.lat.append(lat)
                acc.skew.append(inst.skew[m].astype(np.float64))
                if S:
                    acc.alg.append(alg)
                    acc.bus.append(bus)
            waits = inst.waits[m]
            for col, r in enumerate(gi.ranks):
                w = int(waits[:, col].sum())
                by_rank[r].wait += w
                by_op[s.op].wait += w
                by_group[gkey].wait += w
                if w:
                    for c2 in np.unique(inst.sig[m, col]).tolist():
                        site = model.sigs[c2].where()
                        sel = inst.sig[m, col] == c2
                        site_wait[site][0] += int(waits[sel, col].sum())
                        site_wait[site][1] += int(sel.sum())
    # per rank: counts, bytes, busy time; p2p ops and async waits
    sizes = np.array([sig_size(s) for s in model.sigs] or [0], np.int64)
    for r, rt in model.ranks.items():
        n = rt.n
        if not n or r in apart:
            continue
        sig = rt.sig[:n]
        flags = model.sig_flags(sig)
        top = (flags & NESTED) == 0
        comp, begin = rt.comp[:n], rt.begin[:n]
        acc = by_rank[r]
        acc.count += int(top.sum())
        size = sizes[sig]
        acc.bytes += int(size[top].sum())
        unt = untimed(rt.flags[:n], begin, comp)
        acc.untimed += int((top & unt).sum())
        done = top & (comp > 0) & ~unt
        dur = (comp - begin)[done].astype(np.float64)
        acc.lat.append(dur)
        aw = ((flags & ASYNC) != 0) & (rt.we[:n] > 0) & (rt.wb[:n] > 0)
        wait_ns = (rt.we[:n] - rt.wb[:n])[aw]
        acc.async_wait += int(wait_ns.sum())
        for code in np.unique(sig[aw]).tolist():
            s = model.sigs[code]
            v = int(wait_ns[sig[aw] == code].sum())
            by_op[s.op].async_wait += v
            by_group[_group_key(s)].async_wait += v
            site_wait[s.where()][0] += v
            site_wait[s.where()][1] += int((sig[aw] == code).sum())
        p2p = top & (comp > 0) & ((flags & P2P) != 0)
        if p2p.any():
            for code in np.unique(sig[p2p]).tolist():
                s = model.sigs[code]
                m = p2p & (sig == code)
                d = (comp - begin)[m & ~unt].astype(np.float64)
                S = sig_size(s)
                for a in (by_op[s.op], by_group[_group_key(s)]):
                    a.count += int(m.sum())
                    a.untimed += int((m & unt).sum())
                    a.bytes += S * int(m.sum())
                    a.lat.append(d)
                    if S:
                        alg = np.where(d > 0, S / (d / 1e9), np.nan)
                        a.alg.append(alg)
                        a.bus.append(alg)
    counted: set[tuple] = set()  # (a collective's instances failed, counted once, as its count counts them)
    for r, i in model.failed:
        s = model.sig_of(r, i)
        if s.nested or r in apart:
            continue
        by_rank[r].failed += 1
        seq = int(model.ranks[r].seq[i])
        key = (s.space, s.group, seq) if not s.flags & P2P and seq >= 0 else (r, i)
        if key in counted:
            continue  # (an all_reduce that raised on 2 ranks read "count 1 ... failed 2": helper-203)
        counted.add(key)
        by_op[s.op].failed += 1
        by_group[_group_key(s)].failed += 1
    ranks_rows = {}
    for r in sorted(by_rank):
        row = by_rank[r].row()
        lat = np.concatenate(by_rank[r].lat) if by_rank[r].lat else np.zeros(0)
        row["busy_s"] = None if row["untimed"] and not lat.size else round(float(lat.sum()) / 1e9, 6)
        row["end"] = _end_of(model, r)
        ranks_rows[str(r)] = row
    sites = sorted(site_wait.items(), key=lambda kv: -kv[1][0])[:top_sites]
    history = summarized_history(model)
    if history:  # (each rank's part of it: how many ops retention summarized of it, helper-204)
        for r, row in ranks_rows.items():
            rt = model.ranks.get(int(r))
            row["summarized"] = sum(op.get("count", 0) for s in (rt.summaries if rt else ())
                                    for op in s.get("ops", ()))
    first, last = model.own_bounds()  # (the job's own ranks' span: a foreign stream's may be a day off)
    return {
        **({"history": history} if history else {}),
        "ops": {k: v.row() for k, v in sorted(by_op.items())},
        "groups": {k: v.row() for k, v in sorted(by_group.items())},
        "ranks": ranks_rows,
        "sites": [{"site": s, "wait_s": round(w / 1e9, 6), "count": c} for s, (w, c) in sites if w > 0],
        "incomplete_collectives": incomplete,
        "span_s": round((last - first) / 1e9, 6),
        "ops_total": model.own_ops(),
        "ops_untimed": sum(r["untimed"] for r in ranks_rows.values()),
        "foreign_streams": len(apart),  # (streams read but kept out of every table: their count)
        "foreign_ops": sum(model.n_ops(r) for r in apart),  # (and their ops, counted in no figure above)
    }


#: The measures of a rank's row that ``unusual_ranks`` compares with every other rank's:
#: those most ranks share where they do the same (its ending, its counts), and times, which
#: no two ranks share
RANK_KINDS = ("end", "count", "bytes", "failed", "untimed")
RANK_TIMES = ("busy_s", "latency_p50_s", "latency_p99_s", "wait_s", "async_wait_s")
RANK_MEASURES = RANK_KINDS[1:] + RANK_TIMES
#: A value of a rank's ending or counts is odd where most ranks share another and at most
#: this share of them (at least one rank) has it: stages of a pipeline that run fewer ops
#: are not, a rank that died or ran an op fewer among thousands is
ODD_SHARE = 0.05
#: The least spread a time is measured in (s): a few microseconds of async wait on ranks
#: that mostly wait none are not far from the rest
TIME_FLOOR_S = 1e-4


def _most_common(values: list) -> Any:
    """The value most of ``values`` have, the first in sorted order on a tie (the same in
    every run: a set's order is not)."""
    seen = Counter(values)
    return min(seen, key=lambda v: (-seen[v], str(v)))


def unusual_ranks(ranks: dict[str, dict[str, Any]], n: int, first: Sequence[str] = ()) -> list[str]:
    """The ``n`` ranks (keys of ``ranks``, ``compute_report``'s rows) that matter most, in
    that order: ``first`` (the findings' culprits), then those whose ending or a count is
    odd (a value most ranks do not share, held by at most ``ODD_SHARE`` of them: a rank that
    died where the others run, or ran an op fewer, or raised; the rarest first, as the
    console's "rarest behaviour first"), then by how far their furthest time lies from all
    ranks' median, in robust deviations (1.4826 median absolute deviations, at least a
    hundredth of the median and ``TIME_FLOOR_S``); ties in rank order.  Among 16,384 rows,
    the few that matter.  What the rows cannot tell apart (a rank that ran another op than
    the rest) only the findings can: hence ``first``."""
    keys = list(ranks)
    pinned = [k for k in dict.fromkeys(first) if k in ranks][:n]
    if len(keys) <= n:
        return pinned + [k for k in keys if k not in pinned]
    limit = max(1, int(ODD_SHARE * len(keys)))
    rare = np.full(len(keys), len(keys))
    for m in RANK_KINDS:
        values = [ranks[k].get(m) for k in keys]
        seen = Counter(values)
        usual = _most_common(values)
        if seen[usual] * 2 < len(keys):
            continue  # (most ranks differ here anyway: uneven splits)
        rare = np.minimum(rare, [len(keys) if v == usual or seen[v] > limit else seen[v] for v in values])
    x = np.array([[np.nan if (v := ranks[k].get(m)) is None else float(v) for m in RANK_TIMES] for k in keys])
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # (a time no rank has: all NaN)
        med = np.nanmedian(x, axis=0)
        mad = np.nanmedian(np.abs(x - med), axis=0)
        scale = np.maximum(np.nan_to_num(np.maximum(1.4826 * mad, 0.01 * np.abs(med))), TIME_FLOOR_S)
        far = np.nan_to_num(np.abs(x - med) / scale).max(axis=1)
    order = sorted(range(len(keys)), key=lambda i: (rare[i], -far[i], i))
    return pinned + [keys[i] for i in order if keys[i] not in pinned][:n - len(pinned)]


def waited_groups(groups: dict[str, dict[str, Any]], n: int, first: Sequence[str] = ()) -> list[str]:
    """The ``n`` groups (keys of ``groups``, ``compute_report``'s rows) that matter most, in
    that order: ``first`` (the findings'), then those with ops that raised, then by the
    time their ranks waited in them (for the others, and on async ops), then by their
    order.  A job of 16,384 ranks in 3D parallelism has thousands of groups (a
    tensor-parallel group a host, a pipeline pair a stage); the few where time goes are what
    a table of them is for."""
    keys = list(groups)
    pinned = [k for k in dict.fromkeys(first) if k in groups][:n]
    order = sorted(range(len(keys)), key=lambda i: (
        -(groups[keys[i]].get("failed") or 0),
        -((groups[keys[i]].get("wait_s") or 0.0) + (groups[keys[i]].get("async_wait_s") or 0.0)), i))
    return pinned + [keys[i] for i in order if keys[i] not in pinned][:n - len(pinned)]


def median_row(ranks: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Every rank's measures as one row: each one's median over the ranks, and the ending
    most ranks have (what ``unusual_ranks``' rows are told apart from)."""
    out: dict[str, Any] = {}
    rows = list(ranks.values())
    for m in RANK_MEASURES:
        xs = [r[m] for r in rows if r.get(m) is not None]
        out[m] = float(np.median(xs)) if xs else None
    for m in ("count", "bytes", "failed", "untimed"):
        if out[m] is not None:
            out[m] = int(round(out[m]))
    out["end"] = _most_common([r.get("end") for r in rows]) if rows else None
    return out


def summarized_history(model: TraceModel) -> dict[str, dict[str, Any]]:
    """What retention kept of the history it deleted (``summary`` events), per op over every
    rank: ops, bytes, failures, latency p50 and p99 (from the per-minute histograms: the
    power-of-two bucket holding them, its middle) and max, and the span it covers."""
    acc: dict[str, dict[str, Any]] = {}
    apart = model.foreign_streams
    for r, rt in model.ranks.items():
        for s in rt.summaries if r not in apart else ():
            for op in s.get("ops", ()):
                row = acc.setdefault(op["op"], {"count": 0, "bytes": 0, "failed": 0, "unfinished": 0, "max_ns": 0,
                                                "hist": [0] * BUCKETS, "first_ns": 0, "last_ns": 0})
                row["count"] += op.get("count", 0)
                row["bytes"] += max(op.get("in_bytes", 0), op.get("out_bytes", 0))
                row["failed"] += op.get("failed", 0)
                row["unfinished"] += op.get("unfinished", 0)
                for minute, _n, _sum, mx, buckets in op.get("minutes", ()):
                    row["max_ns"] = max(row["max_ns"], mx)
                    for b, c in buckets:
                        row["hist"][min(b, BUCKETS - 1)] += c
                    row["first_ns"] = minute if not row["first_ns"] else min(row["first_ns"], minute)
                    row["last_ns"] = max(row["last_ns"], minute)
    out = {}
    for name, row in sorted(acc.items()):
        hist = row.pop("hist")
        row["latency_p50_s"], row["latency_p99_s"] = (_bucket_quantile(hist, q) for q in (0.5, 0.99))
        row["latency_max_s"] = round(row.pop("max_ns") / 1e9, 6)
        out[name] = row
    return out


def _bucket_quantile(hist: list[int], q: float) -> float | None:
    """The middle of the histogram bucket (``store/retention.py``) that holds quantile ``q``.
    Counts as Python's integers: summed over ranks and minutes, counts a trace may state
    (up to 2^62 each) overflowed int64 silently and gave a wrong bucket."""
    total = sum(hist)
    if not total:
        return None
    b = bisect.bisect_left(list(itertools.accumulate(hist)), q * total)
    return round(bucket_mid_s(min(b, len(hist) - 1)), 6)
