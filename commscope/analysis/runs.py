"""Which streams are of the run a trace is of, and which are foreign (``TraceModel.foreign_streams``).

A stream is one rank incarnation; its ``meta`` names its job, its run (the nonce rank 0
draws at each init, ``record.jobid.settle``) and the world size.  A rank file copied in from
another job, or a second launch under a job id reused by hand, puts streams of another run
next to the job's own.  What they are compared with is what most ranks' metas say (the
lowest rank's on a tie).  No module of the analysis is imported here (``model`` imports it).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def most(values: Iterable[object]) -> str | int | None:
    """The string or int said most often (the first said of those said as often; None: none)."""
    said = Counter(v for v in values if isinstance(v, (str, int)) and not isinstance(v, bool))
    return said.most_common(1)[0][0] if said else None


def foreign(metas: Mapping[int, Mapping[str, Any]]) -> dict[int, str]:
    """The ranks (of ``metas``: rank -> its meta, in rank order) whose stream is not of the
    run, with why: its meta names another job, or at its incarnation another run of the job
    or a world size its rank is past, than most metas (at that incarnation) say."""
    out: dict[int, str] = {}
    job = most(m.get("job") for m in metas.values())
    for r, m in metas.items():
        if job is not None and isinstance(m.get("job"), str) and m["job"] != job:
            out[r] = f"its meta names job {m['job']!r}, not {job!r}"
    by_inc: dict[int, list[int]] = {}
    for r, m in metas.items():
        if r not in out:
            by_inc.setdefault(m.get("inc", 0) if _count(m.get("inc")) is not None else 0, []).append(r)
    for inc, rs in by_inc.items():
        run, world = most(metas[r].get("run") for r in rs), most(metas[r].get("world_size") for r in rs)
        at = f" (incarnation {inc})" if inc else ""
        for r in rs:
            said = metas[r].get("run")
            if run is not None and isinstance(said, str) and said != run:
                out[r] = f"its meta names run {said!r} of the job, not {run!r}{at}: another launch"
            elif _count(world) is not None and r >= world:
                out[r] = f"rank {r} is past the world size {world} its peers' metas say{at}"
    return dict(sorted(out.items()))
