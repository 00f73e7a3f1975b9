"""Chrome / Perfetto trace JSON (the 'JSON Object Format' of the Trace Event Format).

One process per rank; one thread (track) per group, one for p2p and one per group for
Flight Recorder ops; op spans ('X') with args (sizes, dtypes, bytes, seq, site, busbw),
async waits as child spans, instant events ('i') for findings, and counter tracks ('C')
for GPU utilization/memory, CPU and RSS.  Timestamps are microseconds since the trace
start (``metadata.start_ns`` gives the epoch).  Spans that overlap without nesting on
one track (async overlap, threads) are moved to extra lanes, so every track nests
properly as both viewers require.

Streams not of the job's run (``TraceModel.foreign_streams``: another job's rank file copied
in, another launch's, a rank past the world size) are no process of the job's: left out
unless ``ranks`` asks for them, then processes of their own, named and labelled foreign and
sorted after the job's ranks; the time range is the job's own (``own_bounds``), widened
only to the foreign streams asked for, and ``metadata.foreign_streams`` says which there
were, why, and whether they were exported.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterator
from typing import Any, Protocol

import numpy as np
import orjson

from commscope.analysis.bandwidth import op_busbw
from commscope.analysis.errors import first_line
from commscope.analysis.findings import LISTED_RANKS, Finding, ranks_text
from commscope.analysis.model import ASYNC, P2P, SPACE_FR, TraceModel
from commscope.analysis.ranks import ranges
from commscope.analysis.runs import Foreign


def _us(ns: int, t0: int) -> float:
    return round((ns - t0) / 1000.0, 3)


def _track_name(model: TraceModel, sig) -> str:
    if sig.flags & P2P:
        return "p2p"
    return f"group {sig.group}" + (" (fr)" if sig.space == SPACE_FR else "")


def exported(model: TraceModel, ranks: Collection[int] | None = None) -> list[int]:
    """The ranks an export writes, in order: ``ranks`` (those the trace has), else the job's
    own, the foreign streams (``kept_apart``) left out: they are not ranks of the job, and
    another job's events a day off stretched the viewer's range to a day (before, each was
    a process like the job's, as if the job had those ranks)."""
    if ranks is not None:
        return [r for r in model.rank_ids() if r in ranks]
    apart = model.kept_apart
    return [r for r in model.rank_ids() if r not in apart] if apart else model.rank_ids()


def span(model: TraceModel, now: int | None = None, ranks: Collection[int] | None = None) -> tuple[int, int]:
    """(start, end) of an export in ns: the job's own ranks' (``own_bounds``: a foreign
    stream's may be a day off), widened to the foreign streams ``ranks`` asks for (their
    events never before the start: timestamps count from it); ``now`` the end where given."""
    start, end = model.own_bounds()
    if not end:  # (no own rank wrote a timed event)
        start, end = model.bounds()
    apart = model.kept_apart
    if ranks is not None and apart:
        for r in apart:
            rt = model.ranks.get(r)
            if r in ranks and rt is not None and rt.last_ts:
                start, end = min(start, rt.first_ts), max(end, rt.last_ts)
    return start, (now if now is not None else end)


def _process(model: TraceModel, r: int, why: Foreign | None, after: int) -> Iterator[dict[str, Any]]:
    """A rank's process: named by rank and host; a foreign stream's named and labelled so,
    sorted ``after`` the job's ranks."""
    host = (model.ranks[r].meta or {}).get("host")
    name = f"rank {r}" + (f" ({host})" if host else "")
    if why is not None:
        name += f" ⊘ foreign · {why.cause.words}"
        yield {"ph": "M", "name": "process_labels", "pid": r, "tid": 0,
               "args": {"labels": f"not of the job's run: {why.message}"}}
    yield {"ph": "M", "name": "process_name", "pid": r, "tid": 0, "args": {"name": name}}
    yield {"ph": "M", "name": "process_sort_index", "pid": r, "tid": 0,
           "args": {"sort_index": r if why is None else after + r}}


def chrome_events(model: TraceModel, findings: list[Finding] | None = None,
                  now: int | None = None, ranks: Collection[int] | None = None) -> Iterator[dict[str, Any]]:
    """The trace's events, a rank's at a time (``write_chrome`` writes them as they come);
    ``ranks``: only those ranks' (None: the job's own, ``exported``)."""
    t0, t_end = span(model, now, ranks)
    shown = exported(model, ranks)
    foreign = model.foreign_streams
    after = max(model.ranks, default=0) + 1
    instances: dict[tuple, tuple[int, int | None]] = {}  # (op_busbw's: each instance walked once)
    for r in shown:
        rt = model.ranks[r]
        yield from _process(model, r, foreign.get(r), after)
        tracks: dict[str, int] = {}
        lanes: dict[tuple[str, int], list[int]] = {}  # (track, lane) -> stack of span ends
        order = rt.order()
        for i in order.tolist():
            s = model.sigs[int(rt.sig[i])]
            name = _track_name(model, s)
            b = int(rt.begin[i])
            e = int(rt.comp[i]) or t_end
            e = max(e, b)
            lane = 0
            while True:
                stack = lanes.setdefault((name, lane), [])
                while stack and stack[-1] <= b:
                    stack.pop()
                if not stack or e <= stack[-1]:
                    stack.append(e)
                    break
                lane += 1
            tname = name if lane == 0 else f"{name} #{lane + 1}"
            tid = tracks.get(tname)
            if tid is None:
                tid = tracks[tname] = len(tracks) + 1
                yield {"ph": "M", "name": "thread_name", "pid": r, "tid": tid, "args": {"name": tname}}
                yield {"ph": "M", "name": "thread_sort_index", "pid": r, "tid": tid, "args": {"sort_index": tid}}
            args: dict[str, Any] = {"id": int(rt.id[i]), "group": s.group}
            if rt.seq[i] >= 0:
                args["seq"] = int(rt.seq[i])
            if rt.peer[i] >= 0:
                args["peer"] = int(rt.peer[i])
            for k, v in (("in_shapes", s.in_shapes), ("in_dtypes", s.in_dtypes), ("out_shapes", s.out_shapes),
                         ("out_dtypes", s.out_dtypes)):
                if v:
                    args[k] = [list(x) if isinstance(x, tuple) else x for x in v]
            if s.in_bytes:
                args["in_bytes"] = s.in_bytes
            if s.out_bytes:
                args["out_bytes"] = s.out_bytes
            for k, v in (("site", s.site), ("redop", s.redop), ("root", s.root), ("async", s.is_async or None),
                         ("nested", s.nested or None), ("src", s.src)):
                if v is not None:
                    args[k] = v
            if not rt.comp[i]:
                args["in_flight"] = True
            if i in rt.exc:
                args["exc"] = rt.exc[i]
                yield {"ph": "i", "s": "t", "name": f"failed: {first_line(rt.exc[i], 80)}", "cat": "failure",
                       "pid": r, "tid": tid, "ts": _us(model.failed_ns(r, i), t0), "args": {"id": int(rt.id[i])}}
            if rt.gpu[i] > 0:
                args["gpu_ms"] = round(int(rt.gpu[i]) / 1e6, 3)
            if rt.comp[i]:
                bw = op_busbw(model, r, i, instances)
                if bw:
                    args["algbw_GBps"] = round(bw["algbw"] / 1e9, 4)
                    args["busbw_GBps"] = round(bw["busbw"] / 1e9, 4)
            label = s.op + (f" #{int(rt.seq[i])}" if rt.seq[i] >= 0 else "")
            yield {"ph": "X", "name": label, "cat": "p2p" if s.flags & P2P else "collective", "pid": r,
                   "tid": tid, "ts": _us(b, t0), "dur": round((e - b) / 1000.0, 3), "args": args}
            if s.flags & ASYNC and rt.wb[i]:
                wb = max(int(rt.wb[i]), b)
                we = min(int(rt.we[i]) or e, e)
                if we >= wb:
                    yield {"ph": "X", "name": "wait", "cat": "wait", "pid": r, "tid": tid, "ts": _us(wb, t0),
                           "dur": round((we - wb) / 1000.0, 3), "args": {"id": int(rt.id[i])}}
        samples = rt.samples.arrays()
        for j in range(samples["ts"].shape[0]):
            ts = _us(int(samples["ts"][j]), t0)
            for cname, fields in (("GPU util %", ("gpu_util",)), ("GPU memory (MiB)", ("gpu_mem",)),
                                  ("CPU %", ("cpu",)), ("RSS (MiB)", ("rss",))):
                v = samples[fields[0]][j]
                if np.isnan(v):
                    continue
                if "MiB" in cname:
                    v = v / 2**20
                yield {"ph": "C", "name": cname, "pid": r, "tid": 0, "ts": ts,
                       "args": {fields[0]: round(float(v), 3)}}
    marked = set(shown)
    for f in findings or []:
        ts = _us(f.ts or t_end, t0)
        # (every culprit's track gets the mark and its args: thousands of culprits are a count
        # and ranges there, not a list repeated on each of thousands of marks)
        args: dict[str, Any] = {"message": f.message, "group": f.group, "seq": f.seq,
                                "culprits": sorted(f.culprits) if len(f.culprits) <= LISTED_RANKS
                                else ranks_text(f.culprits)}
        if f.evidence.get("culprit_where"):
            args["culprit_where"] = f.evidence["culprit_where"]
        if f.evidence.get("consequences"):
            args["consequences"] = [c["message"] for c in f.evidence["consequences"][:10]]
        for r in sorted(set(f.culprits) or set(f.ranks)):
            if r not in marked:  # (a rank not exported, a foreign stream left out among them: no process)
                continue
            yield {"ph": "i", "s": "p", "name": f"{f.severity}: {f.kind}", "cat": "finding", "pid": r,
                   "tid": 0, "ts": ts, "args": args}


def chrome_metadata(model: TraceModel, now: int | None = None, ranks: Collection[int] | None = None
                    ) -> dict[str, Any]:
    """The trace's metadata: its span (``span``), the job's own ranks read, (``ranks``) those
    exported, as ranges, and the foreign streams: each one's rank, cause, why, and whether
    it was exported."""
    shown = {} if ranks is None else {"ranks_exported": ranges(sorted(r for r in ranks if r in model.ranks),
                                                               limit=None)}
    foreign = model.foreign_streams
    apart = {} if not foreign else {"foreign_streams": [
        {"rank": r, "cause": why.cause.value, "why": why.message, "exported": ranks is not None and r in ranks}
        for r, why in foreign.items()]}
    start, end = span(model, now, ranks)
    return {"source": "commscope", "start_ns": start, "end_ns": end, "ranks": len(model.ranks) - len(foreign),
            **shown, **apart}


def chrome_trace(model: TraceModel, findings: list[Finding] | None = None, now: int | None = None) -> dict[str, Any]:
    """The whole trace as one object (tests, a small trace); ``write_chrome`` streams it."""
    return {"traceEvents": list(chrome_events(model, findings, now)), "displayTimeUnit": "ms",
            "metadata": chrome_metadata(model, now)}


#: Events serialized before a write
WRITE_EVENTS = 8192


class Sink(Protocol):
    """Where ``write_chrome`` writes: a binary file, or anything taking bytes."""

    def write(self, data: bytes, /) -> int: ...


def write_chrome(out: Sink, model: TraceModel, findings: list[Finding] | None = None, now: int | None = None,
                 metadata: dict[str, Any] | None = None, ranks: Collection[int] | None = None) -> int:
    """Write the trace to ``out`` as ``chrome_trace`` would give it (the same object, as JSON),
    its events serialized a few thousand at a time as they come: memory a rank's events, not
    the whole trace's (a 4,096-rank job's 1.9 M events took 4.2 GiB as one object).  Returns
    the events written.  ``ranks``: only those ranks (None: every rank)."""
    out.write(b'{"traceEvents":[')
    n = 0
    pending: list[bytes] = []
    for e in chrome_events(model, findings, now, ranks):
        try:
            pending.append(orjson.dumps(e))
        except orjson.JSONEncodeError:  # (text orjson refuses, a lone surrogate from a dump: escaped)
            pending.append(json.dumps(e, separators=(",", ":")).encode())
        if len(pending) >= WRITE_EVENTS:
            out.write((b"," if n else b"") + b",".join(pending))
            n += len(pending)
            pending = []
    if pending:
        out.write((b"," if n else b"") + b",".join(pending))
        n += len(pending)
    meta = {**chrome_metadata(model, now, ranks), **(metadata or {})}
    out.write(b'],"displayTimeUnit":"ms","metadata":' + orjson.dumps(meta) + b"}")
    return n
