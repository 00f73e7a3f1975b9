"""Two models of one trace compared field by field (the batched ingest against the rank by
rank one): what the detectors and the console read of a model."""

from __future__ import annotations

import numpy as np

from commscope.analysis.columns import _COLS_I4, _COLS_I8

RANK_FIELDS = ("n", "open", "exc", "meta", "exits", "summaries", "stacks", "captures", "last_stack", "last_hb",
               "hb_inflight", "first_ts", "last_ts", "last_op_ts", "last_comp", "dropped", "fr_overwritten",
               "device_seen", "_sorted", "_last_begin", "version", "touched")


def model_state(m) -> dict:
    """Everything of a model that ingest sets, as plain values (arrays as lists)."""
    ranks = {}
    for r, rt in m.ranks.items():
        n = rt.n
        d = {c: getattr(rt, c)[:n].tolist() for c in (*_COLS_I8, *_COLS_I4, "flags")}
        d.update({f: getattr(rt, f) for f in RANK_FIELDS})
        d["ids"] = [rt.index_of(int(i)) for i in rt.id[:n].tolist()]
        d["top_id"] = int(m.table.top_id[rt._s]) if n else None
        sm = rt.samples
        d["samples"] = {k: np.nan_to_num(v, nan=-1.0).tolist() for k, v in sm.arrays().items()}
        d["samples_last"] = (sm.last, sm.gpu_error)
        ranks[r] = d
    coll = {k: (gi.members, gi.ranks, gi.seqs.keys[: gi.seqs.n].tolist(), gi.seqs.rows().tolist())
            for k, gi in m.coll.items()}
    p2p = {k: (ch.keys[: ch.n].tolist(), ch.rows().tolist()) for k, ch in m.p2p.items()}
    return {"rank_order": list(m.ranks), "ranks": ranks, "coll_order": list(m.coll), "coll": coll, "p2p": p2p,
            "sigs": [(s.op, s.group, s.flags, s.match) for s in m.sigs], "failed": list(m.failed),
            "groups": m.groups, "events": m.events, "start": m.start_ns, "end": m.end_ns, "version": m.version,
            "job": m.job, "reused": m.reused, "read_losses": m.read_losses}


def differences(a: dict, b: dict, path: str = "") -> list[str]:
    """Where two ``model_state``s differ (empty: nowhere)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{path}: keys {sorted(map(str, set(a) ^ set(b)))[:5]}"] if set(a) != set(b) else []
        for k in a:
            if k in b:
                out += differences(a[k], b[k], f"{path}.{k}")
        return out
    return [] if a == b else [f"{path}: {str(a)[:200]} != {str(b)[:200]}"]
