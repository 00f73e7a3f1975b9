"""Synthetic traces shaped exactly like the recorder's output: for tests and the benchmark.

``TraceBuilder`` hands out op ids and sequence numbers the way the recorder does (one
counter per group for collectives, one per (group, peer, dir) for p2p), so unit tests
can write any scenario in a few lines.  ``healthy_trace`` generates a large, busy and
healthy job (collectives, async overlap, subgroups, p2p rings, batch_isend_irecv,
varlen ops with nested traffic, Flight Recorder ops).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from typing import Any

import orjson

from commscope.events import DESTROYED, signature_key

S = 1_000_000_000  # ns per second
T0 = 1_700_000_000 * S


class TraceBuilder:
    def __init__(self, world_size: int, *, hang_after: float = 2.0, sample_interval: float = 0.2,
                 t0: int = T0, meta: bool = True, ranks_per_host: int = 0, recorder: str | None = None):
        """``ranks_per_host``: ranks r*k..r*k+k-1 on host ``node{r:02d}`` (0: all on host "h");
        ``recorder``: the meta's (``"native"``: what only the native recorder notes is read)."""
        self.world = world_size
        self.events: list[dict] = []
        self._ids = dict.fromkeys(range(world_size), 0)
        self._seq: dict[tuple, int] = {}
        self._groups: dict[str, list[int]] = {}
        self._announced: set[tuple[int, str]] = set()
        self.t0 = t0
        if meta:
            for r in range(world_size):
                host = f"node{r // ranks_per_host:02d}" if ranks_per_host else "h"
                self.add(r, t0, "meta", host=host, pid=1000 + r, world_size=world_size, backend="gloo",
                         hang_after=hang_after, sample_interval=sample_interval, recorder=recorder)
        self.group("0", list(range(world_size)))

    def add(self, rank: int, ts: int, typ: str, **kw: Any) -> dict:
        e = {"type": typ, "ts": int(ts), **{k: v for k, v in kw.items() if v is not None and v is not False},
             "v": 1, "rank": rank}
        self.events.append(e)
        return e

    def group(self, name: str, granks: list[int]) -> None:
        self._groups[name] = list(granks)

    def _announce(self, rank: int, group: str, ts: int) -> None:
        if (rank, group) not in self._announced and group in self._groups:
            self._announced.add((rank, group))
            self.add(rank, ts, "group", group=group, granks=self._groups[group], backend="gloo")

    def begin(self, rank: int, ts: int, op: str, group: str = "0", *, seq: Any = "auto", peer: int | None = None,
              dir: str | None = None, shape: tuple = (1024,), dtype: str = "float32", site: str | None = None,
              **kw: Any) -> int:
        self._announce(rank, group, ts)
        self._ids[rank] = self._ids.get(rank, 0) + 1
        op_id = self._ids[rank]
        if seq == "auto":
            if kw.get("nested") or op == "batch_isend_irecv" or (dir == "recv" and peer is None):
                seq = None
            else:
                key = (rank, group) if dir is None else (rank, group, peer, dir)
                seq = self._seq[key] = self._seq.get(key, 0) + 1
        nbytes = 4
        for d in shape:
            nbytes *= d
        shapes = [list(shape)] if shape is not None else None
        io: dict[str, Any] = {}
        if shape is not None and dir != "recv":
            io.update(in_shapes=shapes, in_dtypes=[dtype], in_bytes=nbytes)
        if shape is not None and dir != "send":
            io.update(out_shapes=shapes, out_dtypes=[dtype], out_bytes=nbytes)
        if op in ("all_reduce", "reduce", "reduce_scatter") and "redop" not in kw:
            kw["redop"] = "sum"
        parent = kw.pop("parent", None)  # per op, like seq and ts: not part of the static fields
        static = {"op": op, "group": group, "peer": peer, "dir": dir,
                  "site": site or f"train.py:{10 + len(op)} in step", **io, **kw}
        static = {k: v for k, v in static.items() if v is not None and v is not False}
        sk = signature_key(orjson.dumps(static)) if "src" not in static else None  # as the recorder does
        self.add(rank, ts, "op", phase="begin", id=op_id, seq=seq, parent=parent, tid=1, sk=sk, **static)
        return op_id

    def phase(self, rank: int, op_id: int, ts: int, phase: str, **kw: Any) -> None:
        self.add(rank, ts, "op", phase=phase, id=op_id, **kw)

    def end(self, rank: int, op_id: int, ts: int, **kw: Any) -> None:
        self.phase(rank, op_id, ts, "end", **kw)

    def sync(self, rank: int, t_begin: int, t_end: int | None, op: str, group: str = "0", **kw: Any) -> int:
        """A blocking op; ``t_end`` None leaves it in flight."""
        i = self.begin(rank, t_begin, op, group, **kw)
        if t_end is not None:
            self.end(rank, i, t_end)
        return i

    def async_op(self, rank: int, t_begin: int, t_wait: int | None, t_done: int | None, op: str,
                 group: str = "0", **kw: Any) -> int:
        i = self.begin(rank, t_begin, op, group, **{"async": True}, **kw)
        self.end(rank, i, t_begin + 1000)
        if t_wait is not None:
            self.phase(rank, i, t_wait, "wait_begin")
            if t_done is not None:
                self.phase(rank, i, t_done, "wait_end")
        return i

    def collective(self, t: int, op: str = "all_reduce", group: str = "0", *, skew: dict[int, int] | None = None,
                   latency: int = 100_000, ranks: list[int] | None = None, **kw: Any) -> int:
        """All members run one sync collective; returns the time it ends."""
        members = ranks if ranks is not None else self._groups[group]
        skew = skew or {}
        begins = {r: t + skew.get(r, 0) for r in members}
        end = max(begins.values()) + latency
        for r in members:
            self.sync(r, begins[r], end, op, group, **kw)
        return end

    def warmup(self, n: int = 3) -> int:
        """``n`` healthy all_reduces from shortly after the start (a job that ran before its
        trouble); returns when the next op may begin."""
        t = self.t0 + S // 10
        for _ in range(n):
            t = self.collective(t, "all_reduce") + 1_000_000
        return t

    def heartbeat(self, rank: int, ts: int, **sample: Any) -> None:
        self.add(rank, ts, "sample", cpu=sample.get("cpu", 50.0), rss=sample.get("rss", 1 << 30),
                 gpu_util=sample.get("gpu_util"), gpu_mem=sample.get("gpu_mem"))
        self.add(rank, ts, "heartbeat", inflight=0)

    def heartbeats(self, t_from: int, t_to: int, interval: int = S // 5, ranks: list[int] | None = None) -> None:
        for r in ranks if ranks is not None else range(self.world):
            t = t_from
            while t <= t_to:
                self.heartbeat(r, t)
                t += interval

    def exit(self, rank: int, ts: int, reason: str = "atexit", **kw: Any) -> None:
        self.add(rank, ts, "exit", reason=reason, **kw)

    def sorted_events(self) -> list[dict]:
        """Events in per-rank file order (ranks concatenated), as a reader returns them."""
        out: list[dict] = []
        by: dict[int, list[dict]] = {}
        for e in self.events:
            by.setdefault(e["rank"], []).append(e)
        for r in sorted(by):
            out.extend(by[r])
        return out


def liveness_trace() -> tuple[TraceBuilder, int, int]:
    """Four ranks in every state a rank table shows, 10 s after ``t``: rank 0 stuck in a sync
    all_reduce from t + 1 s, rank 1 waiting on an async one from t + 2 s, rank 2 exited at
    t + 3 s, rank 3 silent since t + 2 s.  Returns (builder, t, the async op's id)."""
    b = TraceBuilder(4, sample_interval=0.2)
    t = b.t0 + S
    b.heartbeats(t, t + 10 * S, ranks=[0, 1, 2])
    b.heartbeats(t, t + 2 * S, ranks=[3])
    b.collective(t, "all_reduce")
    waiting = b.async_op(1, t + S, t + 2 * S, None, "all_reduce")
    b.sync(0, t + S, None, "all_reduce")
    b.exit(2, t + 3 * S, reason=DESTROYED)
    return b, t, waiting


def healthy_trace(world: int = 8, ops_per_rank: int = 2000, *, seed: int = 1, fr: bool = True,
                  sub: int = 8) -> list[dict]:
    """A long healthy job: every pattern diagnose() must stay silent on.

    Per step and rank: a sync all_reduce, an async all_reduce waited later (overlap), a
    subgroup all_reduce, a p2p ring through batch_isend_irecv, a broadcast, an
    all_gather_v with nested inner all_gathers, and every few steps a Flight Recorder
    DDP all_reduce.  Ranks arrive with random jitter; nobody straggles systematically.
    """
    rnd = random.Random(seed)
    b = TraceBuilder(world)
    sub = max(1, min(sub, world))
    subgroups = [list(range(i, min(i + sub, world))) for i in range(0, world, sub)]
    for k, members in enumerate(subgroups):
        b.group(f"sub{k}", members)
    t = b.t0 + S // 10
    step = 0
    ops = 0
    next_hb = b.t0
    fr_seq: dict[int, int] = {}
    while ops < ops_per_rank:
        jit = {r: rnd.randrange(0, 200_000) for r in range(world)}
        # 1. sync all_reduce
        t = b.collective(t, "all_reduce", skew=jit, latency=150_000) + 50_000
        # 2. async all_reduce, waited after some compute
        ta = t
        tw = ta + 2_000_000
        for r in range(world):
            b.async_op(r, ta + jit[r] // 4, tw + jit[r], tw + 400_000, "all_reduce", shape=(256,))
        # 3. subgroup all_reduce (runs during the async op's overlap window)
        for k, members in enumerate(subgroups):
            if len(members) > 1:
                b.collective(ta + 100_000, "all_reduce", f"sub{k}", skew=jit, latency=80_000, ranks=members)
        t = tw + 500_000
        # 4. p2p ring with batch_isend_irecv
        if world > 1:
            for r in range(world):
                nxt, prv = (r + 1) % world, (r - 1) % world
                tb = t + jit[r] // 10
                c = b.begin(r, tb, "batch_isend_irecv", seq=None)
                s_id = b.begin(r, tb + 100, "isend", peer=nxt, dir="send", parent=c, **{"async": True})
                r_id = b.begin(r, tb + 200, "irecv", peer=prv, dir="recv", parent=c, **{"async": True})
                b.end(r, s_id, tb + 300)
                b.end(r, r_id, tb + 350)
                b.end(r, c, tb + 400)
                b.phase(r, s_id, tb + 500, "wait_begin")
                b.phase(r, s_id, t + 300_000, "wait_end")
                b.phase(r, r_id, t + 300_100, "wait_begin")
                b.phase(r, r_id, t + 320_000, "wait_end")
            t += 400_000
        # 5. broadcast
        t = b.collective(t, "broadcast", skew=jit, latency=90_000, root=0) + 30_000
        # 6. varlen all_gather_v: one logical op with nested inner all_gathers
        tv = t
        end = tv + max(jit.values()) + 300_000
        for r in range(world):
            outer = b.begin(r, tv + jit[r], "all_gather_v", shape=(100 + r * 7,))
            for j in range(2):
                inner = b.begin(r, tv + jit[r] + 1000 + j * 100_000, "all_gather", shape=(1,) if j == 0 else
                                (100 + r * 7,), nested=True, parent=outer, seq=None)
                b.end(r, inner, tv + jit[r] + 50_000 + j * 100_000)
            b.end(r, outer, end)
        t = end + 50_000
        ops += 9 if world > 1 else 6
        # 7. Flight Recorder DDP all_reduce (C++ side), appended late like the merge does
        if fr and step % 4 == 0:
            tf = t - 1_000_000  # earlier than ops already written: FR merges arrive late
            for r in range(world):
                fr_seq[r] = fr_seq.get(r, 0) + 1
                op_id = b._ids[r] = b._ids[r] + 1
                b.add(r, tf + jit[r], "op", phase="begin", id=op_id, op="all_reduce", group="0",
                      seq=fr_seq[r] + 1000, src="fr", in_shapes=[[4096]], in_dtypes=["float32"], in_bytes=16384,
                      out_shapes=[[4096]], out_dtypes=["float32"], out_bytes=16384)
                b.add(r, tf + jit[r], "op", phase="end", id=op_id, approx=True)
            ops += 1
        while next_hb <= t:
            for r in range(world):
                b.heartbeat(r, next_hb)
            next_hb += S // 5
        step += 1
    for r in range(world):
        b.heartbeat(r, t)
        b.exit(r, t + 1000)
    return b.sorted_events()


TIMEOUT_TEXT = ("RuntimeError: Watchdog caught collective operation timeout: WorkNCCL(SeqNum=3, "
                "OpType=ALLREDUCE) ran for 600000 milliseconds before timing out")
CLOSED_TEXT = "RuntimeError: Connection closed by peer [10.0.0.1]:1234"


@dataclasses.dataclass(frozen=True)
class Stop:
    """A way a wide job stops (``stopped_job``) and what ``diagnose`` must say of it."""

    #: its error findings as (kind, culprits), for a job of ``world`` ranks
    expect: Callable[[int], list[tuple[str, list[int]]]]
    #: the whole job stopped at once: judged at its end, as ``check`` and the console judge
    #: a job whose every rank is gone (else a minute after the stop, as a console watching)
    whole: bool = False
    #: traced by the native recorder, whose death handler notes each SIGTERM in the spool
    native: bool = False


#: Ways a wide job stops.  ``commscope bench analysis`` times ``diagnose`` on them at 16k
#: ranks and ``tests/test_together.py`` checks their findings at a few hundred.  Each once
#: took time quadratic in the ranks, or gave one finding a rank.
STOPS: dict[str, Stop] = {
    # every member entered: no rank to blame, one finding that says so
    "every all_reduce timed out": Stop(lambda w: [("op_failed", [])]),
    "every all_reduce failed on a closed connection": Stop(lambda w: [("op_failed", [])]),
    "one rank gone, the others failed on it": Stop(lambda w: [("dead_rank", [0])]),
    "half the ranks crashed together": Stop(lambda w: [("rank_crashed", list(range(w // 2)))]),
    "a host lost, the others wait for it": Stop(lambda w: [("dead_rank", list(range(8, 16)))]),
    "killed with half the ranks inside an all_reduce": Stop(lambda w: [], whole=True),
    "one rank never entered, the others wait": Stop(lambda w: [("missing_ranks", [0])]),
    # every rank left through os._exit(0) at the job's own deadline, the others inside the
    # all_reduce rank 0 never entered: the hang it ended (it was "healthy" once they left)
    "a deadline ended it, one rank never entered": Stop(lambda w: [("missing_ranks", [0])], whole=True),
    # the native recorder's traces (its death handler notes each SIGTERM): rank 0 SIGKILLed
    # unseen (the OOM killer), then the launcher SIGTERMed the rest, in the all_reduce it
    # never entered or between ops; and a scancel of every rank, half inside an all_reduce
    "rank 0 SIGKILLed, the rest SIGTERMed waiting": Stop(lambda w: [("dead_rank", [0])], whole=True, native=True),
    "rank 0 SIGKILLed, the rest SIGTERMed between ops": Stop(lambda w: [("dead_rank", [0])], whole=True,
                                                             native=True),
    "SIGTERMed with half inside an all_reduce": Stop(lambda w: [], whole=True, native=True),
}

#: How the native recorder's spool ends a rank: gone unseen, or SIGTERMed (its death handler's note)
GONE = {"reason": "gone", "src": "spool"}
SIGTERMED = {"reason": "signal", "signal": "Terminated", "src": "spool"}


def after_two(world: int, ranks_per_host: int = 8, recorder: str | None = None) -> tuple[TraceBuilder, int]:
    """A job of ``world`` ranks (0.2 s samples, ``ranks_per_host`` a host; 0: one host) that
    ran two all_reduces: the builder, and the time after them, where a scenario goes on."""
    b = TraceBuilder(world, sample_interval=0.2, ranks_per_host=ranks_per_host, recorder=recorder)
    t = b.t0 + S // 10
    for _ in range(2):
        t = b.collective(t, "all_reduce") + 1_000_000
    return b, t


def stopped_job(world: int, way: str) -> tuple[list[dict], int]:
    """A job of ``world`` ranks (8 a host, 0.2 s samples) that ran two all_reduces and then
    stopped in ``way`` (a key of ``STOPS``) at ``t``; returns its events and ``t``.  A minute
    after ``t`` the waits have passed hang_after (2 s) and the silent are dead."""
    if way not in STOPS:
        raise ValueError(f"unknown way a job stops: {way!r}; known: {', '.join(STOPS)}")
    b, t = after_two(world, recorder="native" if STOPS[way].native else None)
    half = world // 2
    ms = S // 1000
    beating = list(range(world))  # the ranks that go on sending heartbeats after t
    for r in range(world):
        if way == "every all_reduce timed out":
            i = b.begin(r, t + (r % 7) * 1000, "all_reduce")
            b.end(r, i, t + 600 * S // 1000 + r, exc=TIMEOUT_TEXT)
        elif way == "every all_reduce failed on a closed connection":
            i = b.begin(r, t, "all_reduce")
            b.end(r, i, t + 5000, exc=CLOSED_TEXT)
        elif way == "one rank gone, the others failed on it":
            i = b.begin(r, t, "all_reduce")
            if r:
                b.end(r, i, t + 5000 + r, exc=CLOSED_TEXT)
        elif way == "half the ranks crashed together":
            b.begin(r, t, "all_reduce")
            if r < half:
                b.exit(r, t + 1000 + r, reason="signal", signal="SIGSEGV")
        elif way == "a host lost, the others wait for it":
            if not 8 <= r < 16:
                b.begin(r, t + S, "all_reduce")
        elif way == "killed with half the ranks inside an all_reduce":
            if r < half:
                b.begin(r, t, "all_reduce")
        elif way == "one rank never entered, the others wait" and r:
            b.begin(r, t, "all_reduce")
        elif way == "a deadline ended it, one rank never entered":
            if r:
                b.begin(r, t, "all_reduce")
            b.exit(r, t + 5 * S + (r % 13) * 1000, reason="os._exit", code=0)
        elif way == "rank 0 SIGKILLed, the rest SIGTERMed waiting":
            if r:
                b.begin(r, t + (r % 7) * 1000, "all_reduce")
                b.exit(r, t + 3 * S + 40 * ms + (r % 11) * 1000, **SIGTERMED)
            else:
                b.exit(r, t - ms, **GONE)
        elif way == "rank 0 SIGKILLed, the rest SIGTERMed between ops":
            if r:
                b.exit(r, t + S + 40 * ms + (r % 11) * 1000, **SIGTERMED)
            else:
                b.exit(r, t - ms, **GONE)
        elif way == "SIGTERMed with half inside an all_reduce":
            if r < half:
                b.begin(r, t, "all_reduce")
            b.exit(r, t + S + (r % 11) * 1000, **SIGTERMED)
    if way == "one rank gone, the others failed on it":
        beating.remove(0)
    elif way == "a host lost, the others wait for it":
        beating = [r for r in beating if not 8 <= r < 16]
        b.heartbeats(t, t + S // 2, interval=S // 5, ranks=list(range(8, 16)))
    if way == "killed with half the ranks inside an all_reduce":
        for r in beating:
            b.heartbeat(r, t + 3000)  # then the whole job stopped
    elif way == "a deadline ended it, one rank never entered":
        b.heartbeats(t, t + 5 * S, interval=S, ranks=beating)
    elif way == "rank 0 SIGKILLed, the rest SIGTERMed waiting":
        b.heartbeats(t, t + 3 * S, interval=S // 5, ranks=beating[1:])
    elif way == "rank 0 SIGKILLed, the rest SIGTERMed between ops":
        b.heartbeats(t, t + S, interval=S // 5, ranks=beating[1:])
    elif way == "SIGTERMed with half inside an all_reduce":
        b.heartbeats(t, t + S, interval=S // 5)
    else:
        b.heartbeats(t, t + 70 * S, interval=10 * S, ranks=beating)
    return b.sorted_events(), t
