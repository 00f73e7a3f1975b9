"""Synthetic traces that between them give every finding kind, for the evidence golden test.

``findings_json()`` replays each trace in time-ordered batches, diagnoses after every
batch and at the end, and returns every finding's ``to_json()`` as one JSON text per
scenario.  ``tests/golden/evidence.json`` holds what it returned before evidence became
typed records; ``python tests/evidence_scenarios.py > tests/golden/evidence.json``
rewrites it (only when a change of the contract is meant).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from commscope.analysis import TraceModel, diagnose  # noqa: E402
from commscope.analysis.synth import S, TraceBuilder  # noqa: E402

MS = 1_000_000
CLOSED = "RuntimeError: [../pair.cc:553] Connection closed by peer [127.0.0.1]:17102."
TIMED_OUT = "RuntimeError: [../unbound_buffer.cc:78] Timed out waiting 1000ms for recv operation to complete"
MONITORED = ("RuntimeError: [Rank 0]: Rank 1 failed to pass monitoredBarrier in 1000 ms\n Original exception: \n"
             "[../unbound_buffer.cc:78] Timed out waiting 998ms for recv operation to complete")



def _stack(func: str, line: int = 30, *, inside: bool = False) -> list[dict]:
    frames = [["/job/train.py", 100, "<module>"], ["/job/train.py", line, func]]
    if inside:
        frames += [["/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", 2500, "all_reduce"]]
    return [{"tid": 1, "name": "MainThread", "op_thread": True, "frames": frames}]


def missing_ranks() -> TraceBuilder:
    b = TraceBuilder(4)
    t = b.warmup()
    for r in (0, 1, 3):
        b.sync(r, t, None, "all_reduce")
    b.add(2, t + 2 * S + 300 * MS, "stack", reason="request", trigger=0, request_ns=t + 2 * S,
          threads=_stack("spin_forever", 9))
    b.heartbeats(t, t + 10 * S)
    return b


def mismatch() -> TraceBuilder:
    b = TraceBuilder(4)
    t = b.warmup()
    for r in (0, 1, 3):
        b.sync(r, t, None, "all_reduce")
    b.sync(2, t, None, "broadcast", root=0)
    b.heartbeats(t, t + 5 * S)
    return b


def mismatch_tie() -> TraceBuilder:
    b = TraceBuilder(2)
    t = b.warmup()
    a = b.sync(0, t, None, "all_reduce", shape=(10,))
    c = b.sync(1, t, None, "all_reduce", shape=(12,))
    b.end(0, a, t + MS, exc="RuntimeError: size mismatch")
    b.end(1, c, t + MS, exc="RuntimeError: size mismatch")
    b.exit(0, t + 2 * MS, exc="RuntimeError: size mismatch", reason="exception")
    b.exit(1, t + 2 * MS, exc="RuntimeError: size mismatch", reason="exception")
    return b


def mismatch_abort() -> TraceBuilder:
    b = TraceBuilder(3)
    t = b.warmup()
    b.heartbeats(b.t0, t)
    b.add(0, t + 3 * MS, "stack", reason="signal", threads=_stack("step", 42, inside=True))
    b.exit(0, t + 3 * MS, reason="signal", signal="Aborted", exc="Fatal Python error: Aborted")
    ids = {1: b.begin(1, t, "all_reduce", shape=(100000,)), 2: b.begin(2, t, "all_reduce", shape=(1000,))}
    for r in (1, 2):
        b.end(r, ids[r], t + 5 * MS, exc=CLOSED)
    b.heartbeats(t + 10 * MS, t + 3 * S, ranks=[1, 2])
    return b


def p2p_deadlock() -> TraceBuilder:
    b = TraceBuilder(3)
    t = b.warmup()
    for r in range(3):
        i = b.sync(r, t + r * MS, None, "recv", peer=(r - 1) % 3, dir="recv", shape=(4,))
        b.add(r, t + 2 * S + 10 * MS, "stack", id=i, threads=_stack("stage", 30))
    b.heartbeats(t, t + 5 * S)
    return b


def unmatched_p2p() -> TraceBuilder:
    b = TraceBuilder(2)
    t = b.warmup()
    b.sync(0, t, None, "send_tensors", peer=1, dir="send")
    b.exit(1, t + MS)
    b.heartbeats(t, t + 5 * S, ranks=[0])
    return b


def dead_rank() -> TraceBuilder:
    b = TraceBuilder(3)
    t = b.warmup()
    b.heartbeats(t, t + 10 * S, ranks=[0, 1])
    b.heartbeats(t, t + 1 * S, ranks=[2])
    for r in (0, 1):
        b.sync(r, t + 2 * S, None, "all_reduce")
    return b


def vanished() -> TraceBuilder:
    b = TraceBuilder(3)
    t = b.warmup()
    b.heartbeats(b.t0, t)
    ids = {r: b.begin(r, t + MS, "all_reduce") for r in (0, 2)}
    for k, r in enumerate((0, 2)):
        b.end(r, ids[r], t + 20 * MS + k * MS, exc=CLOSED)
    b.heartbeats(t + 22 * MS, t + 6 * S, ranks=[0, 2])
    return b


def crashed() -> TraceBuilder:
    b = TraceBuilder(3)
    t = b.warmup()
    b.heartbeats(b.t0, t)
    b.add(1, t + MS, "stack", reason="exception", threads=_stack("load_batch", 77))
    b.exit(1, t + 2 * MS, reason="exception", exc="ValueError: bad data")
    ids = {r: b.begin(r, t, "all_reduce") for r in (0, 2)}
    for r in (0, 2):
        b.end(r, ids[r], t + 10 * MS, exc=CLOSED)
        b.exit(r, t + 20 * MS, reason="exception", exc=CLOSED)
    return b


def segfault() -> TraceBuilder:
    b = TraceBuilder(3)
    t = b.warmup()
    b.heartbeats(b.t0, t)
    b.add(1, t + MS, "stack", reason="signal", threads=_stack("parse", 12))
    b.exit(1, t + MS, reason="signal", signal="Segmentation fault", exc="Fatal Python error: Segmentation fault")
    ids = {r: b.begin(r, t, "all_reduce") for r in (0, 2)}
    for r in (0, 2):
        b.end(r, ids[r], t + 5 * MS, exc=CLOSED)
    b.heartbeats(t + 10 * MS, t + 3 * S, ranks=[0, 2])
    return b


def crashed_together() -> TraceBuilder:
    """Host node01's three ranks segfault a millisecond apart; the others' all_reduce fails."""
    b = TraceBuilder(6, ranks_per_host=3)
    t = b.warmup()
    b.heartbeats(b.t0, t)
    ids = {r: b.begin(r, t, "all_reduce") for r in range(6)}
    for r in (3, 4, 5):
        b.exit(r, t + (r - 2) * MS, reason="signal", signal="Segmentation fault",
               exc="Fatal Python error: Segmentation fault")
    for r in (0, 1, 2):
        b.end(r, ids[r], t + 5 * MS, exc=CLOSED)
    b.heartbeats(t + 10 * MS, t + 3 * S, ranks=[0, 1, 2])
    return b


def pg_timeout() -> TraceBuilder:
    b = TraceBuilder(3)
    t = b.warmup()
    ids = {r: b.begin(r, t, "all_reduce") for r in (0, 2)}
    b.add(1, t + 3 * S + 400 * MS, "stack", reason="request", trigger=0, request_ns=t + 3 * S + 100 * MS,
          threads=_stack("spin_forever", 9))
    for r in (0, 2):
        b.end(r, ids[r], t + 3 * S + r * MS, exc=TIMED_OUT)
    late = b.begin(1, t + 5 * S, "all_reduce")
    b.end(1, late, t + 5 * S + MS, exc=CLOSED)
    b.heartbeats(b.t0, t + 6 * S)
    return b


def monitored_barrier() -> TraceBuilder:
    b = TraceBuilder(3)
    t = b.warmup()
    for _ in range(2):  # two failed instances with the same blame: the later one counted
        ids = {r: b.begin(r, t, "monitored_barrier") for r in (0, 2)}
        b.end(0, ids[0], t + S, exc=MONITORED)
        b.end(2, ids[2], t + S + 2 * MS, exc=MONITORED)
        t += 2 * S
    b.heartbeats(b.t0, t + 3 * S)
    return b


def straggler() -> TraceBuilder:
    b = TraceBuilder(4)
    b.group("1", [1, 3])
    t = b.t0 + S // 10
    for _ in range(20):
        t = b.collective(t, "all_reduce", skew={3: 50 * MS, 1: 2 * MS}, latency=MS) + MS
        t = b.collective(t, "all_gather", group="1", skew={3: 20 * MS}, latency=MS) + MS
    b.heartbeats(b.t0, t)
    return b


def unwaited() -> TraceBuilder:
    b = TraceBuilder(2)
    t = b.warmup()
    ids = [b.async_op(r, t, None, None, "all_reduce") for r in range(2)]
    b.exit(0, t + MS, unwaited=[ids[0], 999])
    b.exit(1, t + MS)
    return b


def incomplete() -> TraceBuilder:
    b = TraceBuilder(3)
    t = b.t0 + S // 10
    for _ in range(5):
        t = b.collective(t, "all_reduce") + MS
    b.heartbeats(t, t)
    for r in (0, 2):
        b.exit(r, t + MS)
    b.add(1, b.t0 + S, "dropped", count=40, total=40, reason="queue full (backpressure)")
    for r in range(3):
        b.add(r, b.t0 + S, "dropped", count=13_000, total=13_000,
              reason="Flight Recorder ring overwritten between polls (C++-issued collectives missing)")
    return b


def flight_recorder() -> TraceBuilder:
    b = TraceBuilder(3)
    t = b.warmup()
    for r in range(3):  # a Flight Recorder mismatch, and a Flight Recorder wait rank 2 never enters
        b.sync(r, t, t + MS, "all_reduce", seq=1, src="fr")
    b.sync(0, t + 2 * MS, None, "all_reduce", seq=2, src="fr")
    b.sync(1, t + 2 * MS, None, "all_reduce", seq=2, src="fr")
    b.sync(2, t + 2 * MS, None, "broadcast", seq=2, src="fr", root=0)
    b.group("1", [0, 1])
    i = b.sync(0, t + 3 * MS, None, "all_gather", group="1", seq=1, src="fr")
    b.end(0, i, t + 3 * S, exc=TIMED_OUT)
    b.heartbeats(t, t + 5 * S)
    return b


SCENARIOS: dict[str, tuple[Callable[[], TraceBuilder], float]] = {
    "missing_ranks": (missing_ranks, 2.0), "mismatch": (mismatch, 2.0), "mismatch_tie": (mismatch_tie, 2.0),
    "mismatch_abort": (mismatch_abort, 2.0), "p2p_deadlock": (p2p_deadlock, 2.0),
    "unmatched_p2p": (unmatched_p2p, 2.0), "dead_rank": (dead_rank, 2.0), "vanished": (vanished, 2.0),
    "crashed": (crashed, 2.0), "segfault": (segfault, 2.0), "crashed_together": (crashed_together, 2.0), "pg_timeout": (pg_timeout, 1.0),
    "monitored_barrier": (monitored_barrier, 60.0), "straggler": (straggler, 2.0), "unwaited": (unwaited, 2.0),
    "incomplete": (incomplete, 2.0), "flight_recorder": (flight_recorder, 2.0),
}


def tui_traces() -> dict[str, tuple[list[dict], int]]:
    import tui_scenarios as T

    return {"tui_hung_missing_rank": T.hung_missing_rank(), "tui_p2p_deadlock": T.p2p_deadlock(),
            "tui_crashed_rank": T.crashed_rank(), "tui_fsdp2_hang": T.fsdp2_hang()}


def _replay(events: list[dict], hang_after: float, end: int | None, step: int = 20) -> list[list[dict]]:
    m = TraceModel()
    out: list[list[dict]] = []

    def keep(fs: list) -> None:
        js = [f.to_json() for f in fs]
        if not out or js != out[-1]:  # the golden keeps each change only
            out.append(js)

    for k in range(0, len(events), step):
        batch = events[k:k + step]
        m.ingest(batch)
        keep(diagnose(m, now=batch[-1]["ts"], hang_after=hang_after))
    keep(diagnose(m, now=end, hang_after=hang_after, wall_ns=(end or m.end_ns) + 60 * S))
    return out


def findings_json() -> dict[str, str]:
    """Scenario -> the JSON of every diagnosis along its replay (findings only)."""
    out = {}
    for name, (build, hang_after) in SCENARIOS.items():
        events = sorted(build().events, key=lambda e: e["ts"])
        out[name] = json.dumps(_replay(events, hang_after, None), default=str)
    for name, (events, now) in tui_traces().items():
        out[name] = json.dumps(_replay(events, 2.0, now), default=str)
    return out


def final_findings() -> list:
    """Every scenario's findings at its end (Finding objects)."""
    out = []
    for build, hang_after in SCENARIOS.values():
        out += diagnose(TraceModel.from_events(build().sorted_events()), hang_after=hang_after)
    for events, now in tui_traces().values():
        out += diagnose(TraceModel.from_events(events), now=now, hang_after=2.0)
    return out


if __name__ == "__main__":
    json.dump(findings_json(), sys.stdout, indent=0)
    sys.stdout.write("\n")
