"""Synthetic trace stores of any size, written through the real store writers.

A job of R ranks x N collectives is written rank by rank with ``store.open_writer`` in
the format the native recorder writes: a ``meta`` line with its tables, then one ``block``
line per recorder tick (every ``tick`` seconds) holding the records of that tick, each
block restating the signature, site and group table records its records refer to, and a
``sample`` and a ``heartbeat`` every ``sample_interval``.  ``json=True`` writes every op
phase as its own JSON line instead (the Python recorder of schema version 1; readers read
both).  The job is FSDP-like: per step, an all_gather and a reduce_scatter per layer and
an all_reduce, at ``rate`` collectives per second; ranks sit ``ranks_per_host`` to a host.

Faults, on ``culprit`` at the last collective:

    healthy    every rank finishes and exits
    missing    the culprit never enters the last collective (it spins in Python, still
               heartbeating); the others wait in it -> missing_ranks
    dead       the culprit's stream stops before the last collective (SIGKILL, a lost host):
               no exit, no heartbeat; the others wait -> dead_rank
    mismatch   the culprit calls broadcast where the others all_reduce -> collective_mismatch

``days`` spreads the job over that many days (a week-long job simulated, not waited for):
the ops keep their rate in bursts, with idle gaps between, so timestamps cover the span;
``tail_s`` keeps the job going that long after the fault (a rank dead for an hour);
``segment_bytes`` and ``retain`` are the directory writer's (``store/segments.py``,
``store/retention.py``).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

import numpy as np
import orjson

from commscope import blocks, dtypes, optable
from commscope.events import DESTROYED, signature_key
from commscope.schema import SCHEMA_VERSION
from commscope.store import open_writer

S = 1_000_000_000
T0 = 1_780_000_000 * S
FAULTS = ("healthy", "missing", "dead", "mismatch")
#: What ``check`` must say of each fault: (kind, whether the culprit is named)
EXPECTED = {"healthy": None, "missing": "missing_ranks", "dead": "dead_rank", "mismatch": "collective_mismatch"}

#: The op names table the native recorder's meta carries (its wrappers by id).
NAMES = tuple(optable.OPS)
_BF16, _F32 = 15, 6  # c10 ScalarType codes

# Packed record layouts (record/native/layout.h): a BEGIN_SIG and an END without text.
BEGIN_SIG_DT = np.dtype(blocks.HEAD_DT.descr + blocks.SIG_DT.descr)
END_DT = np.dtype([*blocks.HEAD_DT.descr, ("text", "<u2")])
DONE_DT = np.dtype([*blocks.HEAD_DT.descr, ("gpu", "<i8")])  # a done record: its device time
PAIR_DT = np.dtype([("b", BEGIN_SIG_DT), ("e", END_DT)])


@dataclasses.dataclass(frozen=True)
class JobShape:
    """What to write (see the module docstring)."""

    ranks: int
    ops: int
    fault: str = "missing"
    culprit: int = -1  # -1: ranks // 2 + 1 (mod ranks)
    rate: float = 25.0  # collectives per second on each rank
    tick: float = 0.05  # the recorder's drain interval: one block per tick with records
    sample_interval: float = 1.0
    hang_after: float = 10.0
    ranks_per_host: int = 8
    layers: int = 4  # all_gather + reduce_scatter per layer, then one all_reduce: a step
    json: bool = False
    days: float = 0.0  # spread the ops over this many days (bursts with idle gaps)
    tail_s: float = 0.0  # how long the job goes on after the fault (0: hang_after + 5 s)
    segment_bytes: int | None = None  # the directory writer's segment size (None: its default)
    retain: str = "none"  # the history the directory writer keeps (store/retention.py)
    mark_every_s: float | None = None  # a Redis stream's marks, taken by its writer (None: none)
    keyframe_s: float | None = None  # a directory stream's keyframes, every so many s of its time (None: none)
    t0: int = T0
    seed: int = 1

    @property
    def culprit_rank(self) -> int:
        return self.culprit if self.culprit >= 0 else (self.ranks // 2 + 1) % self.ranks


@dataclasses.dataclass
class Written:
    """What ``write_store`` wrote: the job and its expected diagnosis."""

    shape: JobShape
    events: int = 0  # every line written (op phases counted one each, as readers count them)
    ops: int = 0
    bytes: int = 0

    @property
    def kind(self) -> str | None:
        return EXPECTED[self.shape.fault]


def _sigs(shape: JobShape) -> list[dict]:
    """The signatures of one step: all_gather and reduce_scatter (bf16, per layer size) and
    the step's all_reduce; the mismatch fault's broadcast is the last."""
    ag = {"op": "all_gather_into_tensor", "ins": [(_BF16, [1 << 20])], "outs": [(_BF16, [shape.ranks << 20])],
          "site": "fsdp.py:412 in _all_gather"}
    rs = {"op": "reduce_scatter_tensor", "ins": [(_BF16, [shape.ranks << 20])], "outs": [(_BF16, [1 << 20])],
          "site": "fsdp.py:530 in _reduce_scatter", "redop": 0}
    ar = {"op": "all_reduce", "ins": [(_F32, [1024])], "outs": [(_F32, [1024])], "site": "train.py:88 in step",
          "redop": 0}
    bc = {"op": "broadcast", "ins": [(_F32, [1024])], "outs": [(_F32, [1024])], "site": "train.py:91 in step",
          "root": 0}
    return [ag, rs, ar, bc]


def _nbytes(tensors: list) -> int:
    out = 0
    for code, dims in tensors:
        n = dtypes.itemsize(dtypes.CODES[code])
        for d in dims:
            n *= d
        out += n
    return out


def _schedule(shape: JobShape) -> np.ndarray:
    """The begin time of each collective (before jitter), bursts spread over ``days``."""
    period = int(S / shape.rate)
    k = np.arange(shape.ops, dtype=np.int64)
    base = shape.t0 + S + k * period
    if shape.days > 0:
        span = int(shape.days * 86400 * S)
        busy = shape.ops * period
        if span > busy:
            bursts = max(1, min(shape.ops // 8, 2000))
            gap = (span - busy) // bursts
            base = base + (k * bursts // shape.ops) * gap
    return base


def _op_sids(shape: JobShape) -> np.ndarray:
    per_step = 2 * shape.layers + 1
    pos = np.arange(shape.ops) % per_step
    sid = np.where(pos == per_step - 1, 2, np.where(pos % 2 == 0, 0, 1))
    sid[-1] = 2  # the last collective is the step's all_reduce (the faults happen there)
    return sid.astype(np.int64)


def _meta(shape: JobShape, rank: int, job: str, store: str, t: int) -> bytes:
    return orjson.dumps({
        "type": "meta", "ts": t, "host": f"node{rank // shape.ranks_per_host:05d}", "pid": 10_000 + rank,
        "world_size": shape.ranks, "backend": "nccl", "torch": "2.13.0", "commscope": "synthetic",
        "python": "3.11", "job": job, "hang_after": shape.hang_after, "sample_interval": shape.sample_interval,
        "argv": ["train.py"], "store": store, "recorder": "python" if shape.json else "native", "run": "synthetic",
        **({} if shape.json else {"names": list(NAMES), "dtypes": list(dtypes.CODES), "ring": 0}),
        "v": SCHEMA_VERSION, "rank": rank})


def _liveness(shape: JobShape, rank: int, t_from: int, t_to: int) -> list[tuple[int, bytes]]:
    """A sample and a heartbeat every sample_interval in [t_from, t_to]."""
    step = int(shape.sample_interval * S)
    out = []
    for t in range(t_from, t_to + 1, step):
        out.append((t, b'{"type":"sample","ts":%d,"cpu":97.0,"rss":%d,"v":%d,"rank":%d}' % (
            t, 12 << 30, SCHEMA_VERSION, rank)))
        out.append((t, b'{"type":"heartbeat","ts":%d,"inflight":0,"v":%d,"rank":%d}' % (t, SCHEMA_VERSION, rank)))
    return out


def _live_times(base: np.ndarray, shape: JobShape, t_end: int) -> list[tuple[int, int]]:
    """The spans in which a rank is running (bursts of a long job, and the trailing wait):
    liveness is written only inside them, the way a job idle between bursts still beats."""
    if shape.days <= 0:
        return [(int(base[0]) - S // 2, t_end)]
    spans: list[tuple[int, int]] = []
    gaps = np.flatnonzero(np.diff(base) > 60 * S)
    starts = [0, *(gaps + 1).tolist()]
    ends = [*gaps.tolist(), base.shape[0] - 1]
    for a, b in zip(starts, ends, strict=True):
        spans.append((int(base[a]) - S // 2, int(base[b]) + S))
    spans[-1] = (spans[-1][0], t_end)
    return spans


class _Tables:
    """The table records of one rank's blocks (sig, site and group records by id)."""

    def __init__(self, shape: JobShape, sigs: list[dict]):
        self.group = blocks.pack_group(0, "0", "nccl", list(range(shape.ranks)))
        sites = sorted({s["site"] for s in sigs})
        self.site_id = {s: i for i, s in enumerate(sites)}
        self.sites = [blocks.pack_site(i, s) for i, s in enumerate(sites)]
        self.sig = []
        for sid, s in enumerate(sigs):
            self.sig.append(blocks.pack_sig(
                sid, name=NAMES.index(s["op"]), opcode=-1, gid=0, site=self.site_id[s["site"]],
                redop=s.get("redop", -1), root=s.get("root", -1), role=blocks.ROLE_MERGED, ins=s["ins"],
                outs=s["outs"], in_bytes=_nbytes(s["ins"]), out_bytes=_nbytes(s["outs"])))
        self.sig_site = [self.site_id[s["site"]] for s in sigs]

    def for_sids(self, sids: set[int]) -> bytes:
        if not sids:
            return b""
        sites = sorted({self.sig_site[s] for s in sids})
        return self.group + b"".join(self.sites[i] for i in sites) + b"".join(self.sig[s] for s in sorted(sids))


def _json_static(s: dict) -> dict:
    names = dtypes.CODES
    f: dict = {"op": s["op"], "group": "0"}
    if "root" in s:
        f["root"] = s["root"]
    if "redop" in s:
        f["redop"] = "sum"
    f["in_shapes"] = [d for _, d in s["ins"]]
    f["in_dtypes"] = [dtypes.torch_name(names[c]) for c, _ in s["ins"]]
    f["in_bytes"] = _nbytes(s["ins"])
    f["out_shapes"] = [d for _, d in s["outs"]]
    f["out_dtypes"] = [dtypes.torch_name(names[c]) for c, _ in s["outs"]]
    f["out_bytes"] = _nbytes(s["outs"])
    f["site"] = s["site"]
    return f


def rank_lines(shape: JobShape, rank: int, job: str, store: str, base: np.ndarray, sids: np.ndarray,
               t_end: int, tables: _Tables | None, statics: list[bytes] | None) -> tuple[list[bytes], int, int]:
    """The lines of one rank's stream, in order; (lines, events, ops)."""
    rnd = np.random.default_rng(shape.seed * 1_000_003 + rank)
    n = shape.ops
    c = shape.culprit_rank
    jitter = rnd.integers(0, 200_000, n, dtype=np.int64)
    begins = base + jitter
    ends = base + 200_000 + 300_000  # every rank leaves a collective together, after the last arrived
    my_sids = sids.copy()
    ops = n
    open_last = shape.fault != "healthy"  # the last collective hangs
    silent_from = t_end
    if rank == c and shape.fault in ("missing", "dead"):
        ops = n - 1
        open_last = False
        if shape.fault == "dead":
            silent_from = int(ends[n - 2]) + S // 10
    elif rank == c and shape.fault == "mismatch":
        my_sids[-1] = 3
    items: list[tuple[int, bytes]] = []
    events = 0
    if shape.json:
        dumps = orjson.dumps
        for k in range(ops):
            static = statics[my_sids[k]]
            b = b'{"type":"op","ts":%d,"phase":"begin","id":%d,"seq":%d,"tid":1,%s,"v":1,"rank":%d}' % (
                begins[k], k + 1, k + 1, static, rank)
            items.append((int(begins[k]), b))
            events += 1
            if k < ops - 1 or not open_last:
                items.append((int(ends[k]), dumps({"type": "op", "ts": int(ends[k]), "phase": "end", "id": k + 1,
                                                   "v": 1, "rank": rank})))
                events += 1
    else:
        assert tables is not None
        pairs = np.zeros(ops, PAIR_DT)
        b, e = pairs["b"], pairs["e"]
        b["typ"], b["len"], b["ts"], b["id"] = blocks.BEGIN_SIG, BEGIN_SIG_DT.itemsize, begins[:ops], np.arange(1, ops + 1)
        b["sid"], b["seq"], b["tid"] = my_sids[:ops], np.arange(1, ops + 1), 1
        e["typ"], e["len"], e["ts"], e["id"] = blocks.END, END_DT.itemsize, ends[:ops], np.arange(1, ops + 1)
        data = pairs.tobytes()
        # record i: its offset, length and time (begin, end, begin, end ...)
        lens = np.tile(np.array([BEGIN_SIG_DT.itemsize, END_DT.itemsize], np.int64), ops)
        ts = np.empty(2 * ops, np.int64)
        ts[0::2], ts[1::2] = begins[:ops], ends[:ops]
        if open_last:  # the last collective never ends here
            lens, ts = lens[:-1], ts[:-1]
            data = data[: int(lens.sum())]
        offs = np.concatenate([[0], np.cumsum(lens)])
        tick = int(shape.tick * S)
        drain = (ts - shape.t0) // tick + 1  # the tick that drains each record
        cuts = np.flatnonzero(np.diff(drain)) + 1
        starts = [0, *cuts.tolist()]
        stops = [*cuts.tolist(), ts.shape[0]]
        rec_sid = np.full(ts.shape[0], -1, np.int64)
        rec_sid[0::2] = my_sids[: (ts.shape[0] + 1) // 2]
        for a, z in zip(starts, stops, strict=True):
            used = {int(x) for x in rec_sid[a:z].tolist() if x >= 0}
            at = shape.t0 + int(drain[a]) * tick + 1_000_000
            pos, end = int(offs[a]), int(offs[z])
            items.append((at, blocks.encode_block(tables.for_sids(used) + data[pos:end], rank, at, z - a, pos, end)))
            events += z - a
    for lo, hi in _live_times(base, shape, min(t_end, silent_from)):
        beats = _liveness(shape, rank, lo, hi)
        items.extend(beats)
        events += len(beats)
    items.sort(key=lambda x: x[0])
    lines = [_meta(shape, rank, job, store, shape.t0), *(line for _, line in items)]
    events += 1
    if shape.fault == "healthy":
        lines.append(b'{"type":"exit","ts":%d,"reason":"%s","v":%d,"rank":%d}' % (
            t_end + 1000, DESTROYED.encode(), SCHEMA_VERSION, rank))
        events += 1
    return lines, events, ops


def write_store(store: str, shape: JobShape, *, job: str = "synthetic",
                progress: Callable[[int], None] | None = None) -> Written:
    """Write the job to ``store`` (a directory or redis:// URL) through ``open_writer``, one
    rank at a time; ``progress(ranks written)`` after each."""
    if shape.fault not in FAULTS:
        raise ValueError(f"unknown fault {shape.fault!r}: one of {', '.join(FAULTS)}")
    if shape.ranks < 2 or shape.ops < 2:
        raise ValueError("a synthetic job needs at least 2 ranks and 2 ops")
    base = _schedule(shape)
    sids = _op_sids(shape)
    sigs = _sigs(shape)
    t_end = int(base[-1]) + 500_000 + int((shape.tail_s or shape.hang_after + 5) * S)
    tables = None if shape.json else _Tables(shape, sigs)
    statics = None
    if shape.json:
        statics = []
        for s in sigs:
            st = _json_static(s)
            raw = orjson.dumps(st)
            statics.append(raw[1:-1] + b',"sk":%d' % signature_key(raw))
    out = Written(shape)
    meta = {"world_size": shape.ranks, "backend": "nccl", "synthetic": True}
    for r in range(shape.ranks):
        lines, events, ops = rank_lines(shape, r, job, store, base, sids, t_end, tables, statics)
        w = _writer(store, job, r, meta, shape)
        # (a writer starts a segment, or takes a mark, between writes)
        step = 4096 if shape.segment_bytes is None and shape.mark_every_s is None else 64
        try:
            for k in range(0, len(lines), step):
                w.write(lines[k:k + step])
        finally:
            w.close()
        if getattr(w, "closer", True) is False:  # the directory writer's children, run here
            from commscope.store import keyframes
            from commscope.store.retention import close_stream, parse

            if shape.keyframe_s is not None:  # (as its keeper would, by the lines' time: ``keyframes``)
                keyframes.write_along(w.dir, (r, 0), shape.keyframe_s)
            if shape.segment_bytes is not None or shape.retain != "none":
                close_stream(w.dir, r, 0, parse(shape.retain))
        out.events += events
        out.ops += ops
        out.bytes += sum(len(x) + 1 for x in lines)
        if progress is not None:
            progress(r + 1)
    return out


def _writer(store: str, job: str, rank: int, meta: dict, shape: JobShape):
    """The store's writer; for a directory, with the shape's segment size and retention."""
    from commscope.store import backend_for
    from commscope.store.directory import DirectoryWriter
    from commscope.store.retention import parse

    if backend_for(store).local and (shape.segment_bytes is not None or shape.retain != "none" or
                                     shape.keyframe_s is not None):
        return DirectoryWriter(store, job, rank, meta, segment_bytes=shape.segment_bytes, retain=parse(shape.retain),
                               closer=False)
    if backend_for(store).name == "redis":  # (written in seconds, a job of days: marks by its own clock, here)
        from commscope.store.redis_store import RedisWriter

        if shape.mark_every_s is None:
            return RedisWriter(store, job, rank, meta, marks="off")
        return RedisWriter(store, job, rank, meta, marks="inline", mark_every_s=shape.mark_every_s, frames=False)
    return open_writer(store, job, rank, meta)


def du(path: str) -> int:
    """Bytes under ``path``."""
    total = 0
    for d, _, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(d, f))
            except OSError:
                pass
    return total
