"""Deterministic traces and app factories for the console tests (frozen clocks)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

from commscope.analysis.synth import T0, S, TraceBuilder
from commscope.store import ReadStats, TraceReader
from commscope.tui.app import CommscopeApp
from commscope.tui.feed import LIVE, REPLAY, Feed

os.environ["TZ"] = "UTC"  # the header shows wall-clock times
time.tzset()

MS = S // 1000


class StaticReader(TraceReader):
    """A reader that hands over a fixed list of events, once, like a store poll would."""

    description = "synthetic-job"

    def __init__(self, events: list[dict]):
        self.events = list(events)
        self.stats = ReadStats()

    def poll(self, max_bytes=None):
        out, self.events = self.events, []
        return out


def _stack(op_id: int, func: str, line: int) -> list[dict]:
    return [{"tid": 1, "name": "MainThread", "op_thread": True,
             "frames": [["train.py", 80, "<module>"], ["train.py", 61, "main"], ["train.py", line, func]]},
            {"tid": 2, "name": "commscope-recorder", "frames": [["threading.py", 1002, "run"]]}]


def healthy(steps: int = 12) -> tuple[list[dict], int]:
    """4 ranks: async all_reduce overlapped with compute, broadcast, a p2p ring, varlen, GPU samples."""
    b = TraceBuilder(4, hang_after=2.0)
    t = T0 + 100 * MS
    for _ in range(steps):
        for r in range(4):
            i = b.async_op(r, t, t + 40 * MS, t + 55 * MS, "all_reduce", shape=(4096,))
            assert i
        t += 60 * MS
        t = b.collective(t, "broadcast", root=0, latency=5 * MS, shape=(256,))
        for r in range(4):
            j = b.sync(r, t, t + 8 * MS, "send", peer=(r + 1) % 4, dir="send", shape=(2048,))
            k = b.sync(r, t + 8 * MS, t + 16 * MS, "recv", peer=(r - 1) % 4, dir="recv", shape=(2048,))
            assert j and k
        t += 20 * MS
        for r in range(4):
            outer = b.begin(r, t, "all_gather_v", shape=(100 + 10 * r,))
            inner = b.begin(r, t + MS, "all_gather_into_tensor", shape=(400,), nested=True, parent=outer)
            b.end(r, inner, t + 9 * MS)
            b.end(r, outer, t + 10 * MS)
        t += 15 * MS
    for r in range(4):
        ts = T0
        while ts <= t:
            b.heartbeat(r, ts, cpu=90.0 - 5 * r, rss=(2 + r) << 30, gpu_util=float(20 + 20 * r + (ts // S) % 7),
                        gpu_mem=(10 + r) << 30)
            ts += S // 5
        b.exit(r, t + 5 * MS, reason="destroy_process_group")
    return b.sorted_events(), t + 5 * MS


def hung_missing_rank(refused: bool = False) -> tuple[list[dict], int]:
    """Ranks 0, 1, 3 wait in all_reduce #7; rank 2 is stuck in a recv from 0 (stack captured),
    whose send rank 0 posted (an isend, not waited on yet) before its last two all_reduces.
    (Without that isend, rank 0 in the all_reduce never sent what rank 2 waits for: a wait
    cycle through the collective, one unmatched_p2p naming rank 0,
    ``test_diagnose_kinds``.)  ``refused``: also a broadcast rank 3 called with a root the job
    does not have, after all_reduce #3, which raised on rank 3 itself (caught): a second error."""
    b = TraceBuilder(4, hang_after=2.0)
    t = T0 + 100 * MS
    for k in range(6):
        if refused and k == 3:
            i = b.begin(3, t, "broadcast", seq=None, root=99, shape=(4096,), site="train.py:40 in sync_params")
            b.end(3, i, t + MS, exc="RuntimeError: invalid root rank", unissued=True)
            t += 2 * MS
        if k == 5:
            b.async_op(0, t, None, None, "isend", peer=2, dir="send", shape=(128,), site="train.py:51 in send_labels")
            t += MS
        t = b.collective(t, "all_reduce", latency=20 * MS, shape=(4096,), site="train.py:42 in step") + 10 * MS
    stuck = {}
    for r in (0, 1, 3):
        stuck[r] = b.sync(r, t + r * MS, None, "all_reduce", shape=(4096,), site="train.py:42 in step")
    recv = b.sync(2, t + 2 * MS, None, "recv", peer=0, dir="recv", shape=(128,), site="train.py:57 in fetch_labels")
    now = t + 6 * S
    for r in (0, 1, 3):
        b.add(r, t + 2 * S + 50 * MS, "stack", id=stuck[r], threads=_stack(stuck[r], "step", 42))
    b.add(2, t + 2 * S + 50 * MS, "stack", id=recv, threads=_stack(recv, "fetch_labels", 57))
    b.heartbeats(T0, now, interval=S // 5)
    return b.sorted_events(), now


def p2p_deadlock() -> tuple[list[dict], int]:
    """Each of 3 ranks receives from the next before sending: a wait-for cycle."""
    b = TraceBuilder(3, hang_after=2.0)
    t = T0 + 100 * MS
    t = b.collective(t, "barrier", latency=2 * MS, shape=())
    ids = {}
    for r in range(3):
        ids[r] = b.sync(r, t + r * MS, None, "recv", peer=(r + 1) % 3, dir="recv", shape=(64,),
                        site="pipeline.py:30 in stage")
    now = t + 5 * S
    for r in range(3):
        b.add(r, t + 2 * S + 10 * MS, "stack", id=ids[r], threads=_stack(ids[r], "stage", 30))
    b.heartbeats(T0, now, interval=S // 5)
    return b.sorted_events(), now


#: How long an alert stays up in a test's app: a day (Textual times toasts by the wall clock,
#: which the app's frozen clock does not hold; 4,096 ranks painted on 2 loaded cores took
#: longer than the 8 s a console's alert stays, and the snapshot lost its toast)
HELD_S = 86_400.0


def foreign_streams() -> tuple[list[dict], int]:
    """``healthy``'s 4 ranks, of job "synthetic-job", and ranks 2 and 3 of another job's (a
    rank file copied in, as ranks 4 and 5, its ops 30 ms later): streams kept apart, last."""
    events, now = healthy(steps=6)
    own = [{**e, "job": "synthetic-job", "run": "r0"} if e["type"] == "meta" else e for e in events]
    theirs = [{**e, "rank": e["rank"] + 2, "ts": e["ts"] + 30 * MS,
               **({"job": "another-job", "run": "r9"} if e["type"] == "meta" else {})}
              for r in (2, 3) for e in events if e["rank"] == r]  # (in file order, as a reader returns them)
    return own + theirs, now + 30 * MS


def make_app(events: list[dict], now: int, *, mode: str = LIVE, size_hint: str = "") -> CommscopeApp:
    """An app over fixed events whose clocks are frozen at ``now`` (no feed thread)."""
    feed = Feed(StaticReader(events), mode=mode, clock=lambda: now, source="synthetic-job")
    app = CommscopeApp(feed, clock=lambda: now, start_feed=False, bell=False, title="synthetic-job")
    app.ALERT_S = HELD_S  # (an alert's toast is in a snapshot however long the machine took to paint it)
    return app


def load(app: CommscopeApp) -> None:
    """Feed everything in, diagnose, and show it (what the feed thread would do)."""
    feed = app.feed
    if feed.mode == REPLAY:
        info = feed.load_all()
    else:
        feed.step()
        feed._diagnosed_at = float("-inf")
        feed._dirty = True
        info, _ = feed.step()
    app.apply(info, feed.findings)


def drive(app: CommscopeApp, check: Callable[[Any], Awaitable[None]], *, size: tuple[int, int] = (120, 40),
          loaded: bool = True) -> None:
    """Run ``app`` headless at ``size``; with ``loaded``, feed it everything first (``load``) and
    let it paint; then ``await check(pilot)``."""

    async def run() -> None:
        async with app.run_test(size=size) as pilot:
            if loaded:
                load(app)
                await pilot.pause()
            await check(pilot)

    asyncio.run(run())


def crashed_rank() -> tuple[list[dict], int]:
    """3 ranks: rank 1 segfaults in parse_record; ranks 0 and 2's all_reduce fails and they hang on."""
    b = TraceBuilder(3, hang_after=2.0)
    t = T0 + 100 * MS
    for _ in range(4):
        t = b.collective(t, "all_reduce", latency=5 * MS) + MS
    b.heartbeats(T0, t, interval=S // 5)
    frames = [["train.py", 80, "<module>"], ["train.py", 61, "main"], ["data.py", 12, "parse_record"],
              ["/usr/lib/python3.11/ctypes/__init__.py", 519, "string_at"]]
    b.add(1, t + 2 * MS, "stack", reason="signal",
          threads=[{"tid": 1, "name": "crashing thread", "op_thread": True, "frames": frames}])
    b.exit(1, t + 2 * MS, reason="signal", signal="Segmentation fault", exc="Fatal Python error: Segmentation fault")
    for r in (0, 2):
        i = b.begin(r, t, "all_reduce")
        b.end(r, i, t + 5 * MS, exc="RuntimeError: [../pair.cc:553] Connection closed by peer [127.0.0.1]:4242.")
    now = t + 4 * S
    b.heartbeats(t + 10 * MS, now, interval=S // 5, ranks=[0, 2])
    return b.sorted_events(), now


def fsdp2_hang(steps: int = 3, layers: int = 4) -> tuple[list[dict], int]:
    """FSDP2-style: per layer an all_gather_into_tensor (forward) and, backward, a
    reduce_scatter_tensor, on 4 ranks; in the last step rank 3 never reaches layer 2's
    all_gather (stuck in its data loader) while ranks 0-2 wait in it."""
    b = TraceBuilder(4, hang_after=2.0)
    t = T0 + 100 * MS
    site_ag, site_rs = "fsdp/_fully_shard/_fsdp_collectives.py:246 in foreach_all_gather", \
        "fsdp/_fully_shard/_fsdp_collectives.py:370 in foreach_reduce"
    for _ in range(steps):
        for _ in range(layers):
            t = b.collective(t, "all_gather_into_tensor", latency=3 * MS, shape=(1 << 20,), dtype="bfloat16",
                             site=site_ag, skew={1: MS // 2}) + MS
        for _ in range(layers):
            t = b.collective(t, "reduce_scatter_tensor", latency=4 * MS, shape=(1 << 20,), dtype="float32",
                             site=site_rs) + MS
        t += 20 * MS
    for _ in range(2):
        t = b.collective(t, "all_gather_into_tensor", latency=3 * MS, shape=(1 << 20,), dtype="bfloat16",
                         site=site_ag) + MS
    stuck = {r: b.sync(r, t + r * MS, None, "all_gather_into_tensor", shape=(1 << 20,), dtype="bfloat16",
                       site=site_ag) for r in (0, 1, 2)}
    now = t + 8 * S
    for r, i in stuck.items():
        b.add(r, t + 2 * S + 50 * MS, "stack", id=i, threads=_stack(i, "forward", 120))
    b.add(3, t + 2 * S + 50 * MS, "stack", reason="request",
          threads=[{"tid": 1, "name": "MainThread", "op_thread": True,
                    "frames": [["train.py", 80, "<module>"], ["train.py", 61, "main"],
                               ["data.py", 33, "next_batch"]]}])
    b.heartbeats(T0, now, interval=S // 5)
    return b.sorted_events(), now


def mismatch_after_failure() -> tuple[list[dict], int]:
    """3 ranks: rank 1 broadcasts where ranks 0 and 2 all_reduce (long call sites); the
    all_reduce then fails on rank 2 with a long Gloo error.  Its finding holds two per-rank
    tables (the mismatch's, and the failure's with the exception) to lay out."""
    b = TraceBuilder(3, hang_after=2.0)
    t = T0 + 100 * MS
    site = "/home/alice/projects/llm-pretrain/src/llm_pretrain/parallel/data_parallel.py:412 in sync_gradients"
    for _ in range(3):
        t = b.collective(t, "all_reduce", latency=5 * MS, shape=(4096,), site=site) + MS
    stuck = {r: b.sync(r, t + r * MS, None, "all_reduce", shape=(4096,), site=site) for r in (0, 2)}
    odd = b.sync(1, t + MS, None, "broadcast", root=0, shape=(4096,),
                 site="/home/alice/projects/llm-pretrain/src/llm_pretrain/parallel/checkpoint.py:88 in load_shard")
    gloo = ("RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:534] Read error "
            "[127.0.0.1]:29500: Connection reset by peer; the process group is unusable from here on")
    b.end(2, stuck[2], t + 3 * S, exc=gloo)
    for r, i in ((0, stuck[0]), (1, odd)):
        b.add(r, t + 2 * S + 50 * MS, "stack", id=i, threads=_stack(i, "sync_gradients", 412))
    now = t + 5 * S
    b.heartbeats(T0, now, interval=S // 5)
    return b.sorted_events(), now


def wide_missing_rank(world: int = 4096, culprit: int = 2050, late: int | None = None) -> tuple[list[dict], int]:
    """``world`` ranks, 8 per host: all but ``culprit`` wait in all_reduce #4; it is stuck in
    a data loader (its stack captured).  What the console must make readable at 80x24.
    ``late``: a rank that entered the all_reduce 1.5 s after the others (no finding's)."""
    b = TraceBuilder(world, hang_after=2.0, ranks_per_host=8)
    t = T0 + 100 * MS
    for _ in range(3):
        t = b.collective(t, "all_reduce", latency=20 * MS, shape=(4096,), site="train.py:42 in step") + 10 * MS
    stuck = {r: b.sync(r, t + (r % 7) * MS + (1500 * MS if r == late else 0), None, "all_reduce", shape=(4096,),
                       site="train.py:42 in step")
             for r in range(world) if r != culprit}
    now = t + 6 * S
    b.add(culprit, t + 2 * S + 50 * MS, "stack", reason="request", trigger=0,
          threads=[{"tid": 1, "name": "MainThread", "op_thread": True,
                    "frames": [["train.py", 30, "<module>"], ["train.py", 51, "next_batch"]]}])
    for r in (0, 1):
        b.add(r, t + 2 * S + 50 * MS, "stack", id=stuck[r], threads=_stack(stuck[r], "step", 42))
    b.heartbeats(T0, now, interval=S)
    return b.sorted_events(), now


def wide_fault(fault: str, world: int = 4096, culprit: int = 2050) -> tuple[list[dict], int]:
    """``world`` ranks, 8 per host, and one ``fault``: ``dead`` (the culprit goes silent before
    all_reduce #4, which the others wait in), ``crashed`` (it segfaults there, its exit said)
    or ``straggler-host`` (its host's 8 ranks arrive 40-50 ms late at every all_reduce)."""
    b = TraceBuilder(world, hang_after=2.0, ranks_per_host=8)
    host = list(range(culprit - culprit % 8, culprit - culprit % 8 + 8))
    t = T0 + 100 * MS
    for k in range(24 if fault == "straggler-host" else 3):
        slow = None
        if fault == "straggler-host":  # (a different one of them last each time)
            slow = {r: 40 * MS for r in host}
            slow[host[k % 8]] = 50 * MS
        t = b.collective(t, "all_reduce", skew=slow, latency=MS, shape=(4096,), site="train.py:42 in step") + MS
    if fault == "straggler-host":
        b.heartbeats(T0, t + 100 * MS, interval=S)
        return b.sorted_events(), t + 100 * MS
    for r in range(world):
        if r != culprit:
            b.sync(r, t + (r % 7) * MS, None, "all_reduce", shape=(4096,), site="train.py:42 in step")
    now = t + 6 * S
    if fault == "crashed":
        b.exit(culprit, t + 2 * MS, reason="signal", signal="Segmentation fault",
               exc="Fatal Python error: Segmentation fault")
    b.heartbeats(T0, t, interval=S, ranks=[culprit])
    b.heartbeats(T0, now, interval=S, ranks=[r for r in range(world) if r != culprit])
    return b.sorted_events(), now
