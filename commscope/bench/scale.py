"""Live at scale: simulated ranks write a job as it runs, a console follows it and finds the fault.

Writer processes emit the streams of ``--ranks`` simulated ranks in real time, in the
native ``block`` format, through the real store writers (a directory, Redis, or a Redis
Cluster of three local masters): an FSDP-like job (per step an all_gather and a
reduce_scatter per layer, then an all_reduce) at ``--rate`` collectives per second on every
rank, ranks 8 to a host, a heartbeat and a sample every second, one block per rank per
recorder tick (50 ms, or the store's pace: ``StoreWriter.write_every``); with
``--device-times``, a done record after each end (its device time, as a GPU job's recorder
reads it from CUDA events).  The job runs for ``--seconds``, and on until the console is
done with it (its finding, or a bound past it), so a console slowed by a loaded machine
still judges a running job.  A third of the way in, the fault is injected:

    missing         the culprit never enters the next collective (it spins in Python, still
                    heartbeating); the others wait in it           -> missing_ranks
    dead            the culprit goes silent (a killed rank)          -> dead_rank
    host-lost       the culprit's host (its 8 ranks) goes silent at once (a lost host)
                                                                     -> one dead_rank, the host
    mismatch        the culprit calls broadcast where the others all_reduce
                                                                     -> collective_mismatch
    straggler-host  the culprit's host (its 8 ranks) arrives 20 ms late at every
                    collective from then on                          -> straggler, the host
    two-hosts       the culprit's host and the next take turns: one is 20 ms late at
                    every collective from then on, alternately       -> straggler, each host
    none            nothing

Where the fault hangs a collective (all but the stragglers), each rank in it captures every
thread's stack once its op passed hang_after, as the recorder does: a 16k-rank hang is 16k
stacks for the console to read, and for its finding to fold into the distinct ones (the
ranks waiting; a mismatch names none waiting, its culprit's stack apart).

The console's data side (``tui/feed.Feed``: the reader's polls, the model, diagnose every
0.5 s) follows the job in this process, as ``commscope attach`` does, and the timeline
paints from its published view every half second, in turn 60 rows of 189 cells and the
heatmap of every rank (40 lines following the live edge, each frame counted from the last;
every 4th also counted whole, as a jump or a zoom counts it).  Measured in one run: events
written per second (against the job's rate), the reader's lag (how far the model's newest
event is behind the wall clock), the time from the fault to its finding naming the culprit
(target: hang_after + 5 s; a straggler needs its window of late collectives), the frame
times, the console process's RSS (its read processes' with it), its model's bytes an op and
its restarts at the tail (past ``--model-budget``, as ``attach``'s console restarts past its
1 GiB) and those not made (where it would read again most of what the model's window read),
and on Redis each node's requests per second (Redis's own count).  The RSS the
target's job would hold is extrapolated from a run of at least 1/16 of its ranks (``memory``),
with what a restart would read again from where the store can start a stream.

What 2 cores cannot run at full rate runs at a stated fraction of the rate (``--rate``) or
of the ranks (``--ranks``), and is extrapolated to the target's job, labelled as such, from
the costs fitted over the console's polls once it caught up (``costs_of``: per op record,
per stream read, per poll), with the fit's 95% interval, and what of it falls in the
console's own process (one thread, whatever its read processes share).  A fraction of the
ranks at full rate measures the records' cost as full rate packs them (a block line each
tick holds ~2.5), and tightly; at a fraction of the rate a stream's read holds ~2 records,
whose cost is told from the read's by little more than the machine's noise.
Targets (16,384 ranks at 25 collectives/s): lag <= 2 s, fault -> finding <= hang_after +
5 s, frame <= 50 ms, console RSS <= 4 GiB, each Redis node's requests bounded and stated.
The verdict at the end names the targets this run missed; a finding that blamed a victim
misses one whatever the figures, and the run then exits 1 (a wrong diagnosis at any speed;
a slow one is the machine's, exit 0).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import resource
import shutil
import tempfile
import textwrap
import time
from collections.abc import Callable, Sequence
from statistics import median
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from commscope.bench.stats import fmt_time, quantile, t95
from commscope.commands import options
from commscope.store import readahead
from commscope.store.readahead import ReadAhead
from commscope.units import size

if TYPE_CHECKING:
    from commscope.store import TraceReader
    from commscope.tui.feed import Feed

S = 1_000_000_000
FAULTS = ("missing", "dead", "host-lost", "mismatch", "straggler-host", "two-hosts", "none")
#: Faults that make hosts late (a straggler needs its window of late collectives)
SLOW_HOSTS = ("straggler-host", "two-hosts")
#: What the console must find, and whether it names the host's ranks
EXPECTED = {"missing": "missing_ranks", "dead": "dead_rank", "host-lost": "dead_rank", "mismatch": "collective_mismatch",
            "straggler-host": "straggler", "two-hosts": "straggler", "none": None}
TARGET_LAG_S = 2.0
#: The target's job: what a run of fewer ranks or a lower rate is extrapolated to
TARGET_RANKS, FULL_RATE = 16_384, 25.0
EXTRAPOLATE_FROM = 16  # (a run of fewer than 1/16 of the target's ranks says too little of them)
#: Files in the sync directory: the console is done with the job; writer ``w`` closed its streams
DONE, CLOSED = "done", "closed-"
#: How long past its end plus hang_after the job waits at most for the console to be done
STOP_WAIT_S = 45.0
TARGET_FRAME_S = 0.050
TARGET_RSS = 4 << 30
HOST_LATE_NS = 20_000_000  # a straggler host's lateness (a collective takes 0.5 ms; one starts every 40 ms)
TICK_S = 0.05
#: The threads of a hang's stack capture (``Recorder._capture_stuck``: every thread but the
#: recorder's, the op's marked): the main thread inside the collective (``hang_threads``: the
#: call of the op that hung, from its site), a data loader's pin-memory thread and a watchdog
_TORCH = "/usr/lib/python3.11/site-packages/torch"
_OTHER_THREADS = (
    {"tid": 2, "name": "pin_memory", "frames": [
        ["/usr/lib/python3.11/threading.py", 1002, "_bootstrap"],
        ["/usr/lib/python3.11/threading.py", 1045, "_bootstrap_inner"],
        [f"{_TORCH}/utils/data/_utils/pin_memory.py", 59, "_pin_memory_loop"],
        ["/usr/lib/python3.11/queue.py", 180, "get"]]},
    {"tid": 3, "name": "watchdog", "frames": [
        ["/usr/lib/python3.11/threading.py", 1002, "_bootstrap"], ["train.py", 40, "watch"],
        ["/usr/lib/python3.11/threading.py", 331, "wait"]]},
)


def hang_threads(op: str, site: str) -> list[dict]:
    """A capture's threads where the main thread is stuck in ``op``, called at ``site``
    ('fsdp.py:412 in _all_gather', the op's signature's): a training step's frames, the
    site's, then torch's down to the collective."""
    file, _, rest = site.partition(":")
    line, _, func = rest.partition(" in ")
    main = [["train.py", 212, "<module>"], ["train.py", 160, "main"], ["train.py", 98, "train_step"],
            [f"{_TORCH}/nn/modules/module.py", 1773, "_wrapped_call_impl"],
            [f"{_TORCH}/nn/modules/module.py", 1784, "_call_impl"], ["model.py", 77, "forward"],
            [file, int(line), func], [f"{_TORCH}/distributed/c10d_logger.py", 81, "wrapper"],
            [f"{_TORCH}/distributed/distributed_c10d.py", 2820, op]]
    return [{"tid": 1, "name": "MainThread", "op_thread": True, "frames": main}, *_OTHER_THREADS]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ranks", type=int, default=1024, help="simulated ranks (default 1,024)")
    p.add_argument("--rate", type=options.amount, default=FULL_RATE,
                   help="collectives per second on each rank (default 25, the target's; lower it to run a "
                        "wide job at a fraction of its rate: the report extrapolates)")
    p.add_argument("--seconds", type=options.amount, default=30.0,
                   help="how long the job runs (default 30; at least 2 x hang_after + 6 s, for the fault's "
                        "hang to be found and the job to go on after it)")
    p.add_argument("--fault", choices=FAULTS, default="missing", metavar="FAULT",
                   help=f"what goes wrong a third of the way in: {', '.join(FAULTS)} (default missing)")
    p.add_argument("--hang-after", type=options.seconds, default=5.0, help="the job's hang_after (default 5 s)")
    p.add_argument("--store", choices=("directory", "redis", "redis-cluster"), default="directory",
                   help="where the job writes (Redis ones are started here)")
    p.add_argument("--writers", type=options.positive, default=1, help="writer processes (default 1)")
    p.add_argument("--device-times", action="store_true",
                   help="a GPU job's records: each collective also ends with a done record holding its device "
                        "time (three records a collective, not two)")
    p.add_argument("--read-processes", type=int, metavar="N",
                   help="the console's read processes, each a part of the ranks (default: as attach starts them; "
                        "0: it reads in its own process)")
    p.add_argument("--model-budget", type=options.byte_size, metavar="SIZE",
                   help="the console's model budget, past which it starts again at the tail (default 1 GiB, "
                        "attach's), unless it would read again most of what the model's window read (one "
                        "segment a stream with keyframes off, $COMMSCOPE_KEYFRAME_S: the report counts those not "
                        "made); at a fraction f of the target's rate, f x 1 GiB restarts it as often as "
                        "the target's job would, e.g. 64MiB at --rate 1.5625 with 16,384 ranks")
    p.add_argument("--quick", action="store_true",
                   help="64 ranks for 12 s (16 s with the default --hang-after: the least --seconds): a smoke test")


# ------------------------------------------------------------------ the simulated job
@dataclasses.dataclass(frozen=True)
class Plan:
    """The job every writer simulates its share of."""

    ranks: int
    rate: float
    t_start: int  # wall ns of collective 0 (0 until every writer is ready: ``sync``)
    seconds: float
    fault: str
    culprit: int
    fault_k: int  # the first collective the fault changes
    hang_after: float
    job: str
    store: str
    sync: str = ""  # a directory where writers say they are ready and read the job's start
    layers: int = 4
    ranks_per_host: int = 8
    device_times: bool = False  # a done record (a device time) after each end
    read_processes: int | None = None  # the console's (None: as ``attach`` starts them)

    @property
    def records(self) -> int:
        """Op records a collective makes on a rank: a begin, an end (and a done)."""
        return 3 if self.device_times else 2

    @property
    def period(self) -> int:
        return int(S / self.rate)

    def base(self, k: int) -> int:
        return self.t_start + k * self.period

    def host_ranks(self, turn: int = 0) -> range:
        """The culprit's host's ranks (``turn`` 1: the next host's, which takes turns with it)."""
        h = (self.culprit // self.ranks_per_host + turn) % max(1, -(-self.ranks // self.ranks_per_host))
        return range(h * self.ranks_per_host, min(self.ranks, (h + 1) * self.ranks_per_host))

    def culprit_sets(self) -> list[list[int]]:
        """The culprits the findings must name: one list per finding."""
        if self.fault == "two-hosts":
            return [sorted(self.host_ranks(0)), sorted(self.host_ranks(1))]
        return [sorted(self.host_ranks())] if self.fault in ("straggler-host", "host-lost") else [[self.culprit]]


def _sid(plan: Plan, k: int) -> int:
    per_step = 2 * plan.layers + 1
    pos = k % per_step
    return 2 if pos == per_step - 1 else (0 if pos % 2 == 0 else 1)


def _started(plan: Plan, w: int) -> Plan:
    """Say this writer is ready, and wait for the job's start (``run`` writes it once every
    writer is): ranks that open their streams over many seconds would look missing."""
    from pathlib import Path

    Path(plan.sync, f"ready-{w}").touch()
    go = Path(plan.sync, "go")
    while not go.exists():
        time.sleep(0.01)
    return dataclasses.replace(plan, t_start=int(go.read_text()))


def write_share(w: int, _ws: int, plan: Plan, writers: int) -> dict[str, Any]:
    """One writer process: ranks ``w``, ``w + writers``, ... of the job, in real time, through
    the store's writers; returns what it wrote and what that cost."""
    import orjson

    from commscope import blocks
    from commscope.bench.synthstore import BEGIN_SIG_DT, DONE_DT, END_DT, JobShape, _meta, _sigs, _Tables
    from commscope.schema import SCHEMA_VERSION
    from commscope.store import open_writer

    mine = np.arange(w, plan.ranks, writers)
    shape = JobShape(plan.ranks, 2, rate=plan.rate, hang_after=plan.hang_after, layers=plan.layers)
    tables = _Tables(shape, _sigs(shape))
    outs = [open_writer(plan.store, plan.job, int(r), {"world_size": plan.ranks}) for r in mine.tolist()]
    for o in outs:
        # A Redis stream is marked every 5 min of its rank's time, the first mark spread over
        # that by rank, by a child process: one a rank is nothing, but here one process is
        # thousands of ranks (4,096: 14 Python children a second, which starved the job).
        # Marked between two writes instead (``RedisWriter``'s "inline": synthetic jobs).
        if getattr(o, "marks", None) == "child":
            o.marks = "inline"
        # Nor does each keep what restates its ops in flight after Redis lost them (a real rank
        # keeps up to 32 MiB, ~3 KB a second here: 4,096 ranks' a minute are ~700 MB).
        if getattr(o, "restate", None):
            o.restate = False
    every = max(TICK_S, max(o.write_every for o in outs))
    plan = _started(plan, w)  # every stream open (16k take a while): then the job's clock runs
    rnd = np.random.default_rng(w + 1)  # each rank's arrival: up to 0.2 ms after the collective's time
    culprit_at = int(np.flatnonzero(mine == plan.culprit)[0]) if plan.culprit in mine.tolist() else -1
    hosts = [np.isin(mine, np.array(list(plan.host_ranks(turn)))) for turn in (0, 1)]
    pos = np.zeros(mine.shape[0], np.int64)  # each stream's ring position
    begun = ended = 0  # collectives whose begins / ends every rank has written
    lines_out = events = before = 0
    op_bytes = beat_bytes = 0  # (before the fault: the store's bytes of op records, and of the rest)
    fault_at = plan.base(plan.fault_k)
    pending = [[_meta(shape, int(r), plan.job, plan.store, plan.t_start)] for r in mine.tolist()]
    next_beat = plan.t_start
    cpu0 = time.process_time()
    end_at = plan.t_start + int(plan.seconds * S)
    # the job goes on past ``seconds`` until the console is done with it (``follow``), so a
    # console slowed by a loaded machine still finds the fault in a running job
    stop, last = os.path.join(plan.sync, DONE), end_at + int((plan.hang_after + STOP_WAIT_S) * S)
    hung = plan.fault in ("missing", "dead", "host-lost", "mismatch")
    dead_from = plan.base(plan.fault_k) if plan.fault in ("dead", "host-lost") else last + S
    # the streams that stop at the fault: the culprit's (missing, dead), its host's (host-lost)
    quiet = hosts[0] if plan.fault == "host-lost" else mine == plan.culprit
    # a hang's stack captures, once its op passed hang_after: every rank in the hung collective
    # (the culprit too where it is in one: a mismatch's broadcast)
    capture_at = plan.base(plan.fault_k) + int(plan.hang_after * S) if hung else None
    in_hang = np.ones(mine.shape[0], np.bool_) if plan.fault == "mismatch" else ~quiet
    sigs = _sigs(shape)
    stuck_in = sigs[_sid(plan, plan.fault_k)]  # (the op that hangs; a mismatch's culprit in its broadcast)
    threads = {False: hang_threads(stuck_in["op"], stuck_in["site"]), True: hang_threads("broadcast", sigs[3]["site"])}
    while True:
        now = time.time_ns()
        if now >= end_at and (now >= last or os.path.exists(stop)):
            break
        due = now - 2_000_000  # (arrivals are up to 0.2 ms after a collective's time; late hosts 20 ms)
        k_hi = max(0, (due - plan.t_start) // plan.period + 1)
        if hung:
            k_hi = min(k_hi, plan.fault_k + 1)
        late = plan.fault in SLOW_HOSTS
        k_end = max(0, (due - plan.t_start - (HOST_LATE_NS if late else 0) - 600_000) // plan.period + 1)
        if hung:
            k_end = min(k_end, plan.fault_k)  # the fault's collective never ends
        # this tick's records, in time order: begins of [begun, k_hi), ends (and dones) of [ended, k_end)
        recs = sorted([("b", k) for k in range(begun, k_hi)] + [("e", k) for k in range(ended, k_end)]
                      + ([("d", k) for k in range(ended, k_end)] if plan.device_times else []),
                      key=lambda x: (x[1], "bed".index(x[0])))
        if recs:
            dt = np.dtype([(f"r{j}", {"b": BEGIN_SIG_DT, "e": END_DT, "d": DONE_DT}[kind])
                           for j, (kind, _) in enumerate(recs)])
            arr = np.zeros(mine.shape[0], dt)
            used: set[int] = set()
            for j, (kind, k) in enumerate(recs):
                f = arr[f"r{j}"]
                base = plan.base(k)
                late_k = late and k >= plan.fault_k
                if kind == "b":
                    sid = _sid(plan, k)
                    f["typ"], f["len"], f["id"], f["seq"], f["tid"], f["sid"] = (
                        blocks.BEGIN_SIG, BEGIN_SIG_DT.itemsize, k + 1, k + 1, 1, sid)
                    host = hosts[k % 2 if plan.fault == "two-hosts" else 0]
                    f["ts"] = base + rnd.integers(0, 200_000, mine.shape[0]) + np.where(host & late_k, HOST_LATE_NS, 0)
                    used.add(sid)
                    if plan.fault == "mismatch" and k == plan.fault_k and culprit_at >= 0:
                        f["sid"][culprit_at] = 3
                elif kind == "e":
                    f["typ"], f["len"], f["id"] = blocks.END, END_DT.itemsize, k + 1
                    f["ts"] = base + (HOST_LATE_NS if late_k else 0) + 500_000
                else:  # its done: the device time a GPU job's recorder reads from its CUDA events
                    f["typ"], f["len"], f["id"] = blocks.DONE, DONE_DT.itemsize, k + 1
                    f["ts"] = base + (HOST_LATE_NS if late_k else 0) + 600_000
                    f["gpu"] = 450_000
            raw = arr.tobytes()
            size = dt.itemsize
            prefix = {False: tables.for_sids(used), True: tables.for_sids(used | {3})}
            for i in range(mine.shape[0]):
                if quiet[i] and hung and plan.fault != "mismatch" and k_hi > plan.fault_k:
                    # the culprit: in nothing past the fault (missing), or silent (dead, its host lost)
                    keep = [(kind, k) for kind, k in recs if k < plan.fault_k]
                    if not keep:
                        continue
                    data = b"".join(arr[f"r{j}"][i].tobytes() for j, x in enumerate(recs) if x in keep)
                    n = len(keep)
                else:
                    data, n = raw[i * size:(i + 1) * size], len(recs)
                body = prefix[i == culprit_at and plan.fault == "mismatch"] + data
                pending[i].append(blocks.encode_block(body, int(mine[i]), now, n, int(pos[i]),
                                                      int(pos[i]) + len(data)))
                if now < fault_at:
                    op_bytes += len(pending[i][-1]) + 1
                pos[i] += len(data)
                events += n
            begun = max(begun, k_hi)
            ended = max(ended, k_end)
        if now >= next_beat:
            next_beat = now + S
            for i, r in enumerate(mine.tolist()):
                if quiet[i] and now >= dead_from:
                    continue
                pending[i].append(b'{"type":"sample","ts":%d,"cpu":97.0,"rss":%d,"v":%d,"rank":%d}'
                                  % (now, 12 << 30, SCHEMA_VERSION, r))
                stuck = hung and begun > plan.fault_k and in_hang[i]  # (a missing culprit spins in no op)
                pending[i].append(b'{"type":"heartbeat","ts":%d,"inflight":%d,"v":%d,"rank":%d}'
                                  % (now, 1 if stuck else 0, SCHEMA_VERSION, r))
                events += 2
                if now < fault_at:
                    beat_bytes += len(pending[i][-1]) + len(pending[i][-2]) + 2
        if capture_at is not None and now >= capture_at and begun > plan.fault_k:
            capture_at = None
            for i, r in enumerate(mine.tolist()):
                if in_hang[i]:
                    odd = i == culprit_at and plan.fault == "mismatch"
                    pending[i].append(orjson.dumps({"type": "stack", "ts": now, "id": plan.fault_k + 1,
                                                    "threads": threads[odd], "v": SCHEMA_VERSION, "rank": r}))
                    events += 1
        if now < fault_at:
            before = events
        for i, lines in enumerate(pending):
            if lines:
                outs[i].write(lines)
                lines_out += len(lines)
                pending[i] = []
        time.sleep(max(0.0, every - (time.time_ns() - now) / S))
    # (their keepers of keyframes: children at the lowest priority, one a process and store,
    # whose CPU is not the writers'; looked at before they end, as their streams close)
    keepers = {id(k): k for o in outs if (k := getattr(o, "_keeper", None)) is not None}
    keeper_cpu = sum(k.cpu_s() for k in keepers.values())
    for o in outs:
        o.close()
    with open(os.path.join(plan.sync, f"{CLOSED}{w}"), "w"):
        pass
    return {"events": events, "before": before, "lines": lines_out, "cpu_s": time.process_time() - cpu0,
            "keepers": len(keepers), "keeper_cpu_s": keeper_cpu,
            "op_bytes": op_bytes, "beat_bytes": beat_bytes,
            "ranks": int(mine.shape[0]), "wall_s": (time.time_ns() - plan.t_start) / S, "every": every}


# ------------------------------------------------------------------ the console following it
def _rows_painted(feed: Any, culprit: int, now: int) -> float:
    """One frame of the timeline's data: 60 rows (the culprit's among them) of 189 cells over
    the last 10 s, painted from the published view; seconds."""
    from commscope.tui import painter

    view = feed.view
    ranks = view.rank_ids()[:59] + [culprit]
    win = painter.Window(t0=now - 10 * S, npc=10 * S // 189, width=189, now=now)
    t0 = time.perf_counter()
    for r in ranks:
        if r in view.ranks:
            painter.render_row(view, painter.Row(str(r), f"r{r}", (r,)), win)
    return time.perf_counter() - t0


class HeatFrames:
    """The timeline's heatmap (``c`` to it) as the console paints it: every rank, in 40 lines of
    189 cells over 10 s, from the published view, following the live edge in pages
    (``painter.follow``) and each frame counted again from what changed since the last
    (``painter.rows_levels`` given what it counted then), its blocks coloured by their ranks'
    states (``painter.row_gone``).  Every ``WHOLE_EVERY``th frame
    (the first among them) is counted whole as well, as a jump or a zoom counts it (timed
    apart)."""

    WHOLE_EVERY = 4
    DEEPER_EVERY = 2  # (every other frame, the odd ones, counted again from further back: ``HeatFrame.deeper``)

    def __init__(self) -> None:
        self.t0: int | None = None
        self.counted: Any = None  # (``painter.Counted``)
        self.frames = 0

    def paint(self, feed: Any, now: int) -> HeatFrame:
        """One frame (``HeatFrame``)."""
        from commscope.tui import painter
        from commscope.tui.timeline import heat_rows

        view = feed.view
        npc = 10 * S // 189
        self.t0 = painter.follow(now - 10 * S if self.t0 is None else self.t0, npc, 189, now)
        win = painter.Window(t0=self.t0, npc=npc, width=189, now=now)

        def painted(prev: Any) -> tuple[float, Any]:
            """The frame's lines painted, counted from ``prev`` (None: whole): (seconds, counts)."""
            began = time.perf_counter()
            rows = heat_rows(view.rank_ids(), HEAT_LINES)
            got, counted = painter.rows_levels(view, rows, win, prev=prev)
            for row, levels in zip(rows, got, strict=True):
                painter.render_row(view, row, win, levels=levels, gone=painter.row_gone(view.states, row, win))
            return time.perf_counter() - began, counted

        whole = painted(None)[0] if self.frames % self.WHOLE_EVERY == 0 else None  # (the first among them)
        prev, deeper = self.counted, None
        if prev is not None and self.frames % self.DEEPER_EVERY == 1:
            # the same frame counted from further back as well (what its clock before says
            # to count from: the earlier of the two clocks), before or after its own in turn
            back = prev._replace(win=prev.win._replace(now=prev.win.now - int(DEEPER_S * S)))
            before = self.frames // self.DEEPER_EVERY % 2 == 0
            if before:
                deep_s, deep = painted(back)
            took, self.counted = painted(prev)
            if not before:
                deep_s, deep = painted(back)
            deeper = (deep_s - took, deep.ops - self.counted.ops)
        else:
            took, self.counted = painted(prev)
        self.frames += 1
        return HeatFrame(None if prev is None else took, self.counted.ops, whole, deeper)


class HeatFrame(NamedTuple):
    """A heatmap frame of ``bench scale`` (``HeatFrames.paint``)."""

    took: float | None  # seconds counted from the last frame (None: the first, which has none)
    ops: int  # ... the ops it counted so (``painter.Counted.ops``)
    whole: float | None  # seconds counted whole, where it was (every ``HeatFrames.WHOLE_EVERY``th frame)
    #: where it was (every other frame: ``HeatFrames.DEEPER_EVERY``), the same frame counted from
    #: ``DEEPER_S`` further back as well: (seconds, ops) more than its own count
    deeper: tuple[float, int] | None


#: How much further back ``HeatFrames`` counts a frame again, to tell what an op counted costs
#: from what the frame costs whatever it counts (its ranks read, its lines painted): ~5x
#: the ops a frame counts at the live edge
DEEPER_S = 5.0


#: The heatmap's lines in ``bench scale``'s frame of it (a 200x60 terminal's timeline holds ~40)
HEAT_LINES = 40


def _stacks_shown(f: Any) -> tuple[int, int, int, int]:
    """(the culprits whose captured stack a finding shows, its culprits, the waiting ranks
    whose captured stack it shows, in how many distinct stacks): 16k ranks waiting in one
    collective are one stack and a count (``attach_stacks``)."""
    info = [n for n in (f.evidence.get("stack_info") or {}).values() if "captured_ns" in n]
    waiting = [n for n in info if n.get("role") == "waiting"]
    return (sum(n.get("role") == "culprit" for n in info), len(set(f.culprits)),
            sum(n.get("count", 1) for n in waiting), len(waiting))


class Poll(NamedTuple):
    """One step of the console with events, after every stream was read once: what its poll
    read, and what reading it and ingesting it cost (``Spent``)."""

    records: int  # op records
    reads: int  # streams read (``ReadStats.chunks``)
    read_s: float  # (in the read processes where there are some)
    ingest_s: float  # (in the console's own process)

    @property
    def seconds(self) -> float:
        return self.read_s + self.ingest_s


@dataclasses.dataclass(frozen=True)
class Followed:
    """What the console's data side saw of the job (``follow``), for the report."""

    lags: list[float]  # seconds the newest event read was behind the clock, sampled from 3 s on
    behind: list[float]  # what every stream was read up to (the watermark), behind the clock
    first_round_s: float | None  # when every stream had been read once, after the job's start
    caught_s: float | None  # when the watermark first came within the target past the job's start
    after_caught: list[float]  # ``behind`` from then on
    found_s: float | None  # from the fault to its finding naming every culprit set
    wrong: list[str]  # findings blaming a victim
    early: list[str]  # findings naming only culprits, of another kind or some of them
    wall_s: float  # from the job's start to the end of the follow, its drain apart
    frames: list[float]  # seconds to paint the timeline's rows
    heat_frames: list[float]  # ... its heatmap of every rank (every other frame: ``HeatFrames``; the first apart)
    heat_ops: list[int]  # ... the ops each of those counted (``painter.Counted.ops``)
    heat_whole: list[float]  # ... counted whole, as a jump or a zoom counts it (``HeatFrames.WHOLE_EVERY``)
    heat_deeper: list[tuple[float, int]]  # ... counted from further back as well: (seconds, ops) more (``HeatFrame``)
    rss: int  # the console's, its read processes' with it (the most sampled), or its own peak if more
    rss_end: int  # ... at the follow's end
    #: the console's own before its first read: the interpreter's and its imports' (what does
    #: not grow with the ranks)
    rss_start: int
    #: its read processes' at the follow's end, as they started (``ReadAhead.started_rss``):
    #: theirs that does not grow with the ranks either; and how many of them said
    read_started_rss: int
    read_processes_end: int
    model_bytes: int  # the model's arrays then (``TraceModel.nbytes``)
    model_ops: int  # the ops they held
    model_budget: int  # past which the model started again at the tail (``Feed.MODEL_BUDGET``)
    restarts: int  # how many times it did
    restarts_skipped: int  # ... and did not, reading again most of what the model's window read
    restart_reads: list[tuple[float, int]]  # each restart's window (s) and the model it read (``Feed.restart_reads``)
    events: int  # read
    cpu_s: float  # the console's, its read processes' with it
    read_process_cpu_s: float | None  # theirs (None: read in the console's process)
    read_process_lost: list[str]  # the warnings of read processes lost
    read_processes: int
    ranks_seen: int
    stacks: tuple[int, int, int, int]  # the expected finding's (``_stacks_shown``)
    #: each step with events once the watermark was sampled, with the first reader (until a read
    #: process was lost or the first restart at the tail: costs of another shape)
    polls: list[Poll]
    settled: int | None  # the first of ``polls`` after the console caught up
    settled_s: float  # seconds from then to the last of them (the follow's end, or a read process lost)
    judging_s: float  # diagnose and publish
    #: each step with events after the console caught up: whether its header said "falling
    #: behind" (``FeedInfo.behind``: unread bytes past a poll's budget, or the watermark past
    #: ``Feed.LAG_SHOWN_S``), and the unread bytes the reader said (``backlog_bytes``)
    said_behind: list[tuple[bool, int]] = dataclasses.field(default_factory=list)


def follow(plan: Plan, fault_ns: int, until: float, writers: int, model_budget: int | None = None) -> Followed:
    """The console's data side on the job until ``until`` (monotonic; longer, bounded, while
    the expected finding is not there yet): lag samples, when the expected finding first
    named the culprit, frame times, RSS.  Past ``model_budget`` (None: the console's) its
    model starts again at the tail, as ``attach``'s does."""
    import psutil

    from commscope.analysis.ranks import ranges
    from commscope.analysis.source import open_source
    from commscope.store import backend_for, open_reader
    from commscope.tui.feed import Feed, read_ahead

    expect = EXPECTED[plan.fault]
    want = plan.culprit_sets()  # each named by one finding of the expected kind
    named_at: dict[int, int] = {}
    source = backend_for(plan.store).with_job(plan.store, plan.job)
    # (as ``commscope attach`` reads: its polls made ahead in a read process, where that is worth it)
    feed = Feed(read_ahead(open_reader(source, wait=True), source, None, plan.read_processes),
                hang_after=plan.hang_after,
                reopen=lambda window: read_ahead(open_source(source, wait=True, since=window), source, window,
                                                 plan.read_processes))
    if model_budget is not None:
        feed.MODEL_BUDGET = model_budget
    ahead = feed.reader if isinstance(feed.reader, ReadAhead) else None  # (its CPU counted, even once lost)
    aheads = [ahead] if ahead is not None else []  # (and a restart's at the tail, theirs)
    readers = [feed.reader]  # every reader it had (a restart's at the tail, one reading here)
    lags: list[float] = []  # the newest event read, behind the clock
    behind: list[float] = []  # what every stream was read up to (the watermark), behind the clock
    first_round: int | None = None  # when every stream had been read once
    caught_ns, caught = 0, 0  # when the console caught up, and the watermark samples before then
    frames: list[float] = []
    heat_frames: list[float] = []
    heat_ops: list[int] = []
    heat_whole: list[float] = []
    heat_deeper: list[tuple[float, int]] = []
    heat = HeatFrames()
    found_ns = 0
    stacks_shown = (0, 0, 0, 0)  # the expected finding's, as last judged (``_stacks_shown``)
    wrong: list[str] = []
    # findings naming only culprits: of another kind (a dead rank missing from a collective
    # before it is judged dead: the hang is found first, then its cause), or some of them (a
    # lost host's ranks, before the last of them is judged dead)
    early: list[str] = []
    culprits = {r for rs in want for r in rs}
    rss = 0
    next_frame = 0.0
    cpu0 = time.process_time()
    proc = psutil.Process()
    rss_start = proc.memory_info().rss  # (nothing read yet)
    hard = until + plan.hang_after + 30.0  # a loaded machine: wait longer for the finding, never forever
    # each step with events once the watermark was first sampled (every stream read once,
    # past the first 3 s), while the reader is the one it began with (a read process lost, the
    # job is read in this process: costs of another shape)
    polls: list[Poll] = []
    settled: int | None = None  # the first of them after the console caught up
    settled_mono = 0.0
    reading, polls_end = feed.reader, None
    said_behind: list[tuple[bool, int]] = []
    while time.monotonic() < until or (expect is not None and not found_ns and time.monotonic() < hard):
        records, chunks, spent = feed.reader.stats.records, feed.reader.stats.chunks, _spent(feed)
        info, got = feed.step()
        if polls_end is None and feed.reader is not reading:
            polls_end = time.monotonic()
        if all(feed.reader is not r for r in readers):  # (a restart's, or one reading here)
            readers.append(feed.reader)
            if isinstance(feed.reader, ReadAhead):
                aheads.append(feed.reader)
        if got and behind and polls_end is None:  # (once every stream was read: a first chunk's cost is once a stream)
            stats = feed.reader.stats
            now = _spent(feed)
            polls.append(Poll(stats.records - records, stats.chunks - chunks, now.read - spent.read,
                              now.ingest - spent.ingest))
        wall = time.time_ns()
        if got and not caught_ns:  # caught up: every stream read past the job's start, and within the target
            mark = feed.reader.watermark_ns() or 0
            if mark > plan.t_start and wall - mark <= TARGET_LAG_S * S:
                caught_ns, caught = wall, len(behind)
                settled, settled_mono = len(polls), time.monotonic()  # (the poll that caught up not among them)
        if got and caught_ns:
            said_behind.append((info.behind, info.behind_bytes))
        if got and first_round is None and feed.reader.watermark_ns():
            first_round = wall  # (every stream read once: however soon, not only past the first 3 s)
        if got and feed.model.end_ns and wall > plan.t_start + 3 * S:
            lags.append((wall - feed.model.end_ns) / S)
            mark = feed.reader.watermark_ns()
            if mark:
                behind.append((wall - mark) / S)
        for f in feed.findings:
            if f.severity == "error" or f.kind == expect:
                named = f.kind == expect and sorted(f.culprits) in want
                if named and wall >= fault_ns:
                    named_at.setdefault(want.index(sorted(f.culprits)), wall)
                    stacks_shown = _stacks_shown(f)
                    if not found_ns and len(named_at) == len(want):
                        found_ns = wall  # (when the last of them was named)
                elif not named:
                    text = f"{f.kind} {ranges(f.culprits, limit=4)}"
                    into = early if f.culprits and set(f.culprits) <= culprits else wrong
                    if text not in into:
                        into.append(text)
        mono = time.monotonic()
        if mono >= next_frame and feed.view.rank_ids():
            if len(frames) > heat.frames:  # (in turn)
                painted = heat.paint(feed, wall)
                if painted.took is not None:
                    heat_frames.append(painted.took)
                    heat_ops.append(painted.ops)
                if painted.whole is not None:
                    heat_whole.append(painted.whole)
                if painted.deeper is not None:
                    heat_deeper.append(painted.deeper)
            else:
                frames.append(_rows_painted(feed, plan.culprit, wall))
            next_frame = mono + 0.5
            rss = max(rss, proc.memory_info().rss + _read_process_rss(feed.reader))
        pause = feed.pause_s(got)  # (as ``Feed.run`` paces its steps)
        if pause:
            time.sleep(pause)
    settled_s = max(0.0, (polls_end or time.monotonic()) - settled_mono) if settled is not None else 0.0
    rss_end = proc.memory_info().rss + _read_process_rss(feed.reader)
    ending = feed.reader if isinstance(feed.reader, ReadAhead) else None
    told = ending.started_rss if ending is not None else ()
    read_started = (sum(told), len(told))
    model_bytes, model_ops = feed.model.nbytes(), feed.model.total_ops()
    # done: the writers stop; what they wrote to the end is read (every event written is read)
    with open(os.path.join(plan.sync, DONE), "w"):
        pass
    drain = time.monotonic() + plan.hang_after + STOP_WAIT_S + 30.0
    while time.monotonic() < drain:
        closed = sum(name.startswith(CLOSED) for name in os.listdir(plan.sync)) >= writers
        _, got = feed.step()
        if closed and not got:
            break
        if not got:
            time.sleep(Feed.POLL_S)
    lost = list(dict.fromkeys(w for r in readers for w in r.stats.warnings  # (``Feed._read_here``)
                              if w.startswith("the read process")))
    # (a restart at the tail holds the old model and the new at once, inside a step: the
    # samples between steps miss it; the process's own peak does not)
    rss = max(rss, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    feed.reader.close()
    for f in feed.findings:  # (as last judged: the captures read by then)
        if f.kind == expect and sorted(f.culprits) in want:
            stacks_shown = _stacks_shown(f)
    return Followed(
        lags=lags, behind=behind,
        first_round_s=(first_round - plan.t_start) / S if first_round is not None else None,
        caught_s=(caught_ns - plan.t_start) / S if caught_ns else None,
        after_caught=behind[caught:] if caught_ns else [],
        found_s=(found_ns - fault_ns) / S if found_ns else None, wrong=wrong, early=early,
        wall_s=(time.time_ns() - plan.t_start) / S, frames=frames, heat_frames=heat_frames, heat_ops=heat_ops,
        heat_whole=heat_whole, heat_deeper=heat_deeper, rss=rss, rss_end=rss_end, rss_start=rss_start,
        read_started_rss=read_started[0],
        read_processes_end=read_started[1], model_bytes=model_bytes, model_ops=model_ops,
        model_budget=feed.MODEL_BUDGET, restarts=feed.restarts,
        restarts_skipped=feed.restarts_skipped, restart_reads=list(feed.restart_reads), events=feed.model.events,
        cpu_s=time.process_time() - cpu0 + sum(a.cpu_s for a in aheads),
        read_process_cpu_s=sum(a.cpu_s for a in aheads) if aheads else None, read_process_lost=lost,
        read_processes=len(ahead.procs) if ahead is not None else 0, ranks_seen=len(feed.model.ranks),
        stacks=stacks_shown, polls=polls, settled=settled, settled_s=settled_s,
        judging_s=feed.costs.diagnose + feed.costs.publish, said_behind=said_behind)


class Spent(NamedTuple):
    """Seconds the console has spent so far reading (with read processes, their CPU time)
    and ingesting (taking their batches, the model's work on them)."""

    read: float
    ingest: float


def _spent(feed: Feed) -> Spent:
    """What the console has spent so far (``Spent``), not the time it waited for batches."""
    reader = feed.reader
    if isinstance(reader, ReadAhead):
        return Spent(reader.cpu_s, reader.receive_s + feed.costs.ingest)
    return Spent(feed.costs.read, feed.costs.ingest)


def _read_process_rss(reader: TraceReader) -> int:
    """The resident memory of the console's read processes (0: none), part of its own."""
    import psutil

    if not isinstance(reader, ReadAhead):
        return 0
    rss = 0
    for proc in reader.procs:
        with contextlib.suppress(psutil.Error):
            rss += psutil.Process(proc.pid).memory_info().rss
    return rss


@dataclasses.dataclass(frozen=True, eq=False)
class Costs:
    """What a poll's reading and ingesting is made of, fitted over a run's polls: seconds per
    op record, per stream read (its heartbeat and sample with it) and per poll (the listing,
    the batch's hand-over, the model's work once a batch), with the fit's covariance (robust
    to polls whose noise grows with what they read) and the multiplier of a 95% interval
    for as many polls as it was fitted over."""

    per_record: float
    per_read: float
    per_poll: float
    covariance: np.ndarray  # (3, 3), of the three above; a cost taken as none has none
    polls: int  # fitted over (those left once the outliers are set aside)
    outliers: int
    t95: float  # (Student's t, two-sided 95%, at the fit's degrees of freedom)

    def record_within(self) -> float:
        """The half-width of the fit's 95% interval around the cost per op record."""
        return self.t95 * float(np.sqrt(max(0.0, self.covariance[0, 0])))

    def cores(self, records_s: float, reads_s: float, polls_s: float) -> tuple[float, float]:
        """The cores a console needs at these rates, and the half-width of the fit's 95%
        interval around it."""
        g = np.array([records_s, reads_s, polls_s])
        spread = float(np.sqrt(max(0.0, g @ self.covariance @ g)))
        return float(g @ [self.per_record, self.per_read, self.per_poll]), self.t95 * spread


#: A poll whose residual (as a fit without it would leave it) is more than this many robust
#: standard deviations (1.4826 MAD) off is set aside, and the fit made again without it:
#: something else's time.  Only gross ones: a poll that reads more is noisier, and setting
#: the noisy ones aside at 3.5 held the truth in 74% of such fits' intervals, not 95%
OUTLIER_SD = 10.0


def costs_of(polls: Sequence[Poll], part: Callable[[Poll], float] = lambda p: p.seconds) -> Costs | None:
    """The costs that explain the seconds each poll spent reading and ingesting (or on
    ``part`` of it: ``Poll.ingest_s``, the console's own process), by least squares over
    the polls after the console caught up (before the fault a stream's read holds a few
    records, after it none; a poll reads all streams or a few: the three apart), made again
    without the outliers.  A stream's heartbeat and sample lines go with its read: a rank
    writes them once a second whatever its rate.  No cost is negative (``_least_squares``);
    the covariance is HC3's (a poll that reads more is noisier: the plain one's interval
    held the truth in ~80% of such fits, not 95%).  None with fewer than 8 polls, or no
    cost at all."""
    if len(polls) < 8:
        return None
    a = np.array([(p.records, p.reads, 1.0) for p in polls], np.float64)
    y = np.array([part(p) for p in polls], np.float64)
    keep = np.ones(len(y), bool)
    fit, fitted = _least_squares(a, y, keep)
    for _ in range(5):  # (set the outliers aside, fit again, until the same polls are kept)
        # each poll's residual as a fit without it would leave it (a poll that pulls the fit
        # its way hides its own residual), the polls set aside as they are
        deleted = y - a @ fit
        deleted[keep] /= 1.0 - np.minimum(_leverage(a[np.ix_(keep, fitted)]), 1.0 - 1e-9)
        spread = 1.4826 * float(np.median(np.abs(deleted[keep] - np.median(deleted[keep]))))
        # (a fit that explains every poll to rounding sets nothing aside)
        kept = np.abs(deleted) <= max(OUTLIER_SD * spread, 1e-9 * float(np.abs(y).mean()))
        if kept.sum() < 8 or (kept == keep).all():
            break
        keep = kept
        fit, fitted = _least_squares(a, y, keep)
    if not fitted.any():
        return None
    n, k = int(keep.sum()), int(fitted.sum())
    x = a[np.ix_(keep, fitted)]
    residual = y[keep] - a[keep] @ fit
    covariance = np.zeros((3, 3))
    bread = np.linalg.pinv(x.T @ x)
    weight = residual**2 / np.maximum(1.0 - _leverage(x), 1e-9) ** 2  # (HC3)
    covariance[np.ix_(fitted, fitted)] = bread @ (x.T * weight) @ x @ bread
    return Costs(float(fit[0]), float(fit[1]), float(fit[2]), covariance, n, len(y) - n, t95(n - k))


def _leverage(x: np.ndarray) -> np.ndarray:
    """Each row's leverage in a least-squares fit over the rows of ``x`` (the hat matrix's
    diagonal): how far the fit follows that row."""
    return np.einsum("ij,jk,ik->i", x, np.linalg.pinv(x.T @ x), x)


def _least_squares(a: np.ndarray, y: np.ndarray, keep: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The costs that explain the kept polls (per record, per read, per poll), none
    negative: the least squares over each set of the three costs (seven; a cost left out is
    none), the closest of those whose costs are all positive.  With which were fitted."""
    best, best_fitted, best_rss = np.zeros(a.shape[1]), np.zeros(a.shape[1], bool), float("inf")
    x, z = a[keep], y[keep]
    for bits in range(1, 1 << a.shape[1]):
        fitted = np.array([bool(bits >> j & 1) for j in range(a.shape[1])])
        fit = np.zeros(a.shape[1])
        fit[fitted], *_ = np.linalg.lstsq(x[:, fitted], z, rcond=None)
        if (fit[fitted] <= 0).any():
            continue
        rss = float(((z - x @ fit) ** 2).sum())
        if rss < best_rss * (1 - 1e-12):  # (among equals, the first found)
            best, best_fitted, best_rss = fit, fitted, rss
    return best, best_fitted


def heat_per_op(deeper: Sequence[tuple[float, int]]) -> tuple[float, float, float] | None:
    """What an op a heatmap frame counts costs, from frames counted again from further back
    (``HeatFrame.deeper``: seconds and ops more, each beside the frame's own count of the same
    view): the median of their seconds an op, and its quartiles (a lower quartile at or
    below 0 says the pairs are noise: ``extrapolation`` then states the bound).  The cells
    counted again are charged to the ops (~4 ns of ~40 at 16k ranks and 1/16 of the rate,
    fewer at the full rate): it errs high.  None from fewer than 4 that counted more ops."""
    costs = [t / k for t, k in deeper if k > 0]
    if len(costs) < 4:
        return None
    return median(costs), quantile(costs, 0.25), quantile(costs, 0.75)


def extrapolation(plan: Plan, seen: Followed) -> str:
    """The report's extrapolation of a run of fewer ranks or a lower rate to the target's job
    (none for a run at its size): the cores its console needs, from the costs fitted over
    the run's polls once the console caught up (per op record, per stream read, per poll), at
    the reads and polls a second measured then, each as many times more as there are more
    ranks (``wider``); judging and publishing as measured, grown at most as the ranks are
    (they pace themselves by what they cost).  Beside it, the upper bound of the run's own
    cost per event at the full rate.  The fit's 95% interval is stated: at a sixteenth of
    the rate a stream's read holds ~2 records, and what they cost is told from the read's
    own by little more than this machine's noise.  The heatmap's frame likewise: what an op
    it counts costs, told apart from the rest of the frame by counting some frames again
    from further back (``heat_per_op``), the ops grown as the ranks and the rate are, the
    rest as the ranks are (a run of every rank at a sixteenth of the rate measures it
    nearly whole); without that, the run's frame grown as its ops are (a bound, loose below
    the full rate)."""
    target = max(plan.ranks, TARGET_RANKS)
    full = target * FULL_RATE * plan.records
    if plan.ranks * EXTRAPOLATE_FROM < target:
        return f"  not extrapolated to {target:,} ranks: fewer than 1/{EXTRAPOLATE_FROM} of them ran"
    if plan.rate >= FULL_RATE and plan.ranks >= target:
        return ""
    wider = target / plan.ranks
    times = f"; x {wider:g} for the ranks" if wider > 1 else ""
    judging = seen.judging_s / seen.wall_s * wider
    polls = seen.polls[seen.settled:] if seen.settled is not None and seen.settled_s > 0 else []
    fit = costs_of(polls)
    per_event = seen.cpu_s / max(1, seen.events)
    text = [f"  EXTRAPOLATED, not run: {target:,} ranks at {FULL_RATE:g} collectives/s ({full:,.0f} events/s)"]
    stated = False
    if fit is not None and fit.per_record > 0:  # (records that cost nothing measurable say nothing of a higher rate)
        reads_s = sum(p.reads for p in polls) / seen.settled_s * wider
        polls_s = len(polls) / seen.settled_s
        cores, within = fit.cores(full, reads_s, polls_s * wider)
        cores += judging
        lines = ("each block line's own cost in it: lines hold more records at full rate"
                 if plan.rate < FULL_RATE else "block lines as full rate writes them")
        aside = f", {fit.outliers} set aside as outliers" if fit.outliers else ""
        stated = cores < per_event * full  # (else no tighter than the upper bound below)
        if stated:
            text.append(_wrapped(
                f"the console needs at most {cores:.2f} cores (+/- {within:.2f}: the fit's 95% interval): "
                f"{fit.per_record * 1e6:.2f} us per op record ({lines}); {fit.per_read * 1e6:.1f} us per "
                f"stream read (its new lines, heartbeats and samples among them), at {reads_s / target:.1f} "
                f"reads a rank a second; {fit.per_poll * 1e3:.1f} ms per poll (its listing, its batch "
                f"handed over), at {polls_s:.1f} polls a second{times}; {judging:.2f} of a core judging "
                f"and publishing (paced by its cost{times}); fitted over the {fit.polls} polls after the "
                f"console caught up{aside}"))
            own = costs_of(polls, lambda p: p.ingest_s) if seen.read_processes else fit
            if own is not None:
                ingest, ingest_within = own.cores(full, reads_s, polls_s * wider)
                what = ("in the console's own process (its read processes' apart): {} taking their batches into "
                        "the model" if seen.read_processes else "all in the console's own process: {} reading "
                        "and taking what it read into the model")
                text.append(_wrapped(
                    what.format(f"{ingest:.2f} cores (+/- {ingest_within:.2f})") + f", and up to {judging:.2f} "
                    f"judging and publishing (they pace themselves by what they cost, and take less as they cost "
                    f"more); that process is one thread: past a core for the model alone, a console falls behind "
                    f"however many read processes it has"))
    text.append(_wrapped(f"{'all in, ' if stated else ''}{per_event * full:.2f} cores at its "
                         f"{per_event * 1e6:.2f} us per event (an upper bound: a rank's own costs counted per event)"))
    per_op = heat_per_op(seen.heat_deeper)
    op_told = per_op is not None and per_op[1] > 0  # (a quarter of the pairs at or below 0: noise, not a cost)
    if op_told and per_op is not None and len(seen.heat_ops) == len(seen.heat_frames) and seen.heat_frames:
        # (the ops it counts grow with the ranks and the rate; the rest, with the ranks at most)
        grown, wider = target * FULL_RATE / (plan.ranks * plan.rate), target / plan.ranks
        cost, low, high = per_op
        ops = median(seen.heat_ops)
        rest = max(0.0, median([t - cost * k for t, k in zip(seen.heat_frames, seen.heat_ops, strict=True)]))
        whole = (f"; counted whole, at most {fmt_time(median(seen.heat_whole) * grown)} (x {grown:g})"
                 if seen.heat_whole else "")
        text.append(_wrapped(
            f"its heatmap of every rank: ~{fmt_time(rest * wider + cost * ops * grown)} a frame (target <= "
            f"{TARGET_FRAME_S * 1e3:g} ms): {cost * 1e9:.0f} ns per op counted (quartiles {low * 1e9:.0f}-"
            f"{high * 1e9:.0f}: {len(seen.heat_deeper)} frames counted again from {DEEPER_S:g} s further back, "
            f"each beside its own), at ~{ops * grown:,.0f} ops a frame ({ops:,.0f} here x {grown:g}), and "
            f"{fmt_time(rest)} a frame for the rest (its ranks read, its lines painted)"
            + (f", x {wider:g} for the ranks (an upper bound: its lines' part does not grow)" if wider > 1 else "")
            + whole))
    elif seen.heat_frames:  # (its ops in view grow with the ranks and the rate; its per-rank part, with the ranks)
        grown = target * FULL_RATE / (plan.ranks * plan.rate)
        whole = (f", {fmt_time(median(seen.heat_whole) * grown)} counted whole" if seen.heat_whole else "")
        text.append(_wrapped(
            f"its heatmap of every rank: at most {fmt_time(median(seen.heat_frames) * grown)} a frame{whole} "
            f"(x {grown:g}: the ops in view grow with the ranks and the rate; target <= {TARGET_FRAME_S * 1e3:g} ms)"
            + (f"; a frame's per-rank part does not grow with the rate, so this bound is loose below it: a "
               f"fraction of the ranks at the full rate states it closer, e.g. --ranks {target // 4} --rate "
               f"{FULL_RATE:g}" if plan.rate < FULL_RATE else "")
            + (f" (what an op it counts costs is not told from the {len(seen.heat_deeper)} frames counted again "
               f"from {DEEPER_S:g} s further back: their lower quartile is {per_op[1] * 1e9:.0f} ns an op)"
               if per_op is not None and not op_told else "")))
    loose = fit is None or fit.per_record <= 0 or fit.record_within() > fit.per_record / 2
    if plan.rate < FULL_RATE and loose and polls:
        told = ("is not told from the read's" if fit is None or fit.per_record <= 0
                else f"is told from the read's only to +/- {fit.record_within() * 1e6:.2f} us")
        held = sum(p.records for p in polls) / max(1, sum(p.reads for p in polls))
        text.append(_wrapped(
            f"(at this rate a stream's read holds ~{held:.1f} op records, whose cost {told}: a fraction of the "
            f"ranks at the full rate measures it, e.g. --ranks {target // 4} --rate {FULL_RATE:g})"))
    return "\n".join(text)


class Stored(NamedTuple):
    """A rank's bytes a second in the store before the fault, as its writer wrote them: of
    its op records (block lines, which grow with the rate), and of the rest (its heartbeat
    and sample, a second each, which do not)."""

    ops: float
    other: float

    def at(self, rate: float) -> float:
        """A rank's bytes a second at ``rate`` collectives a second."""
        return self.ops * rate + self.other


def stored_of(plan: Plan, wrote: list[dict]) -> Stored:
    """``Stored`` from the writers' counts (per collective a second: ``Stored.ops`` is per
    unit of rate)."""
    before_s = max(1e-9, (plan.base(plan.fault_k) - plan.t_start) / S) * plan.ranks
    return Stored(sum(x["op_bytes"] for x in wrote) / before_s / plan.rate,
                  sum(x["beat_bytes"] for x in wrote) / before_s)


def _duration(seconds: float) -> str:
    """'17 min', '2.5 h', '40 s': a span as it reads best."""
    return (f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min" if seconds < 7200
            else f"{seconds / 3600:.1f} h")


def memory(plan: Plan, seen: Followed, store: str, stored: Stored) -> str:
    """The report's lines on the console's memory: its model at the end (bytes an op, the
    restarts at the tail past its budget), and the RSS the target's job would hold
    (EXTRAPOLATED where this run is smaller): what is not the model, but the console's own
    as it started (``Followed.rss_start``) and its read processes' as they started (as many as
    the target's job starts), as many times more as there are more ranks; the model at the
    console's budget (``Feed.MODEL_BUDGET``, sized as
    it grows by an eighth), and at a restart a tail of half that beside it, where the restart
    reads only its window.  A restart's window starts where the store can start a stream (a
    directory's or a Redis stream's newest keyframe before it; with keyframes off a segment, a
    Redis mark),
    and what it reads from there is stated: ``stored`` tells how long a segment lasts, or how
    far apart keyframes are, at the target's rate."""
    from commscope.store import keyframes
    from commscope.store.redis_marks import MARK_EVERY_S
    from commscope.store.segments import segment_bytes_from_env
    from commscope.tui.feed import Feed

    per_op = seen.model_bytes / max(1, seen.model_ops)
    restarts = f"{seen.restarts} restart(s)" if seen.restarts else "no restart"
    skipped = (f"\n    and {seen.restarts_skipped} not made: it would read again most of what the\n"
               f"    model's window read (the store starts its streams at segments or marks)"
               if seen.restarts_skipped else "")
    reads = ""
    if seen.restart_reads:
        spans = sorted(s for s, _ in seen.restart_reads)
        got = sorted(n for _, n in seen.restart_reads)
        reads = (f"\n    each read a window of {spans[0]:.1f}-{spans[-1]:.1f} s into a model of {size(got[0])}-"
                 f"{size(got[-1])} (median {size(got[len(got) // 2])})")
    text = [f"  its model: {size(seen.model_bytes)} of {seen.model_ops:,} ops at the end ({per_op:.0f} B an op);\n"
            f"    its budget {size(seen.model_budget)}, {restarts} at the tail past it{reads}{skipped}"]
    target = max(plan.ranks, TARGET_RANKS)
    wider = target / plan.ranks
    if wider > EXTRAPOLATE_FROM:  # (what is not the model is mostly the interpreter's at a few ranks)
        return text[0]
    budget = Feed.MODEL_BUDGET
    base = min(seen.rss_start, seen.rss_end)  # (the interpreter's and its imports': not x the ranks)
    # (its read processes' as they started: not x the ranks, but x as many as the target's start)
    started = seen.read_started_rss if seen.read_processes_end else 0
    # (as many as a console starts for the target's job on a machine of 5 cores or more; a run
    # of the target's ranks: its own)
    processes = (0 if not started else seen.read_processes_end if wider == 1 else
                 min(readahead.MAX_PROCESSES, max(1, target // readahead.SHARD_RANKS)))
    reads_base = started / seen.read_processes_end * processes if started else 0.0
    rest = base + reads_base + max(0, seen.rss_end - seen.model_bytes - base - started) * wider
    held = rest + budget * 9 / 8 + budget / 2
    ops_s = target * FULL_RATE
    label = "EXTRAPOLATED" if wider > 1 or plan.rate < FULL_RATE else "computed"
    theirs = (f", {size(int(reads_base))} its {processes} read processes' as they started (as many as "
              f"{target:,} ranks start on 5+ cores: one per {readahead.SHARD_RANKS:,}, at most "
              f"{readahead.MAX_PROCESSES})" if started else "")
    times = (f" ({size(base)} of it the interpreter's and its imports' as the console started{theirs}, the rest x "
             f"{wider:g} for the ranks)" if wider > 1 else "")
    text.append(_wrapped(
        f"RSS at {target:,} ranks and {FULL_RATE:g} collectives/s ({label}, from this run's): at most "
        f"{size(int(held))} (target <= {size(TARGET_RSS)}) where a restart at the tail reads only its "
        f"window: {size(int(rest))} besides the model{times}, the model at the console's "
        f"{size(budget)} budget (x 9/8: sized as it grows by an eighth), and at a restart a tail of half the "
        f"budget beside it; at {per_op:.0f} B an op the model fills its budget in "
        f"{budget / (per_op * ops_s):.0f} s there"))
    per_rank = stored.at(FULL_RATE)
    every = keyframes.every_s_from_env()  # (a directory's keyframes, and a Redis stream's)
    if every is not None:
        start_s = max(every, keyframes.MIN_BYTES / per_rank)
        where = (f"its newest keyframe before the window (one every {every:g} s that a stream grew by "
                 f"{size(keyframes.MIN_BYTES)})")
        how = f" ({label}: at {per_rank / 1e3:,.1f} KB a rank a second, its op records' grown to the rate)"
    elif store == "directory":
        segment = segment_bytes_from_env()
        start_s, where = segment / per_rank, f"a segment ({size(segment)} a rank; keyframes off)"
        how = f" ({label}: at {per_rank / 1e3:,.1f} KB a rank a second, its op records' grown to the rate)"
    else:
        start_s, where = MARK_EVERY_S, f"a mark (every {MARK_EVERY_S / 60:g} min of a rank's time; keyframes off)"
        how = ""
    more = start_s * ops_s * per_op
    text.append(_wrapped(
        f"but a restart reads from where the store can start a stream: {where}, up to "
        f"{_duration(start_s)} of a rank there{how}, so up to {size(int(more))} more of model "
        f"read again{' (NOT within the target)' if held + more > TARGET_RSS else ''}; a restart that "
        f"reads more than its window sets the next one's floor at twice what it read, and one that would "
        f"read again most of what the model's window read is not made (the model grows on)"))
    return "\n".join(text)


def _wrapped(text: str) -> str:
    """A paragraph of the report: indented, within 80 columns."""
    return textwrap.fill(text, width=78, initial_indent="    ", subsequent_indent="    ")


def _report_loads(loads: list[NodeLoad], every: float, store: str, ranks: int, busiest: int) -> None:
    """Requests per second per Redis node, and what bounds them: how often a rank appends
    (``every``: its writer's pace, the store URL's ``rate=``); and the clients a job of
    ``ranks`` ranks, each its own process, would hold (here a writer process holds many),
    ``busiest`` of them on one master (``redis_keeper.busiest``)."""
    from commscope.store import keyframes, redis_keeper
    from commscope.store.cluster import DEFAULT_MAXCLIENTS
    from commscope.store.redis_keys import Keys
    from commscope.store.redis_url import parse_url

    rate = parse_url(store).rate
    every_frame = keyframes.every_s_from_env()
    print("  store requests per second per node (Redis's own count, INFO commandstats):")
    for x in loads:
        print(f"    {x.node:<16} {x.requests:>8,.0f}: appends {x.appends:,.0f}, reads {x.reads:,.0f}, "
              f"other {x.other:,.0f}")
    # (wrapped: at 80 columns a keyframe's clause ran to 82, helper-181's width check)
    print(_wrapped(f"bounded: a rank appends every {every:.2f} s (world_size / rate=, {rate:,} appends/s for "
                   f"the job at most, from {rate * TICK_S:,.0f} ranks on), a poll sends one XREAD per shard "
                   f"({Keys.SHARDS} shards over the nodes)" + (
                       "" if every_frame is None else
                       f"; a keyframe of a rank (an XRANGE and a script, in other) at most every {every_frame:g} s "
                       f"that its stream grew by {size(keyframes.MIN_BYTES)}")))
    if every_frame is not None:
        most = DEFAULT_MAXCLIENTS
        held = redis_keeper.holds(busiest, most)
        print(_wrapped(f"a real job of {ranks:,} ranks (a process each; here a writer process is many): "
                       f"{ranks * (2 if held else 1):,} clients over the nodes, a writer a rank"
                       + (" and its keeper of keyframes" if held else
                          f"; its keepers connect for each pass (the busiest node's {busiest:,} ranks' writers "
                          f"and keepers past 7/8 of maxclients {most:,}, Redis's default), "
                          f"~{ranks / every_frame:,.0f} connects/s over the nodes")))


# ------------------------------------------------------------------ the suite
def _store(kind: str, root: str, ranks: int) -> tuple[str, Any]:
    """The store the job writes: ``root``, or a private Redis taking a client a simulated
    rank (a writer process holds each one's connection, as a real rank does), past Redis's
    10,000 by default (16k ranks on one Redis failed to open their streams)."""
    if kind == "directory":
        return root, None
    from commscope.bench.redis_server import RedisCluster, start_redis

    if kind == "redis":
        server = start_redis(extra={"maxclients": max(10_000, ranks + 1_024)})
        return server.url, server
    cluster = RedisCluster(3).start()
    return cluster.url, cluster


def _nodes(server: Any) -> list[Any]:
    """The Redis servers (``RedisServer``) a store of ``_store`` runs on; none for a directory."""
    if server is None:
        return []
    return list(server.servers) if hasattr(server, "servers") else [server.server]


@dataclasses.dataclass(frozen=True)
class NodeLoad:
    """What one Redis node was asked per second over the job, from its own count
    (``INFO commandstats``): the requests clients sent, apart from what the writers' append
    script runs inside (an XREVRANGE, and an XADD per event: not requests)."""

    node: str
    appends: float  # EVAL: a writer's append (a batch of a rank's events)
    reads: float  # XREAD: a poll's read of a shard of streams
    other: float  # anything else a client sent (a count, a mark, a keyframe, a registration)

    @property
    def requests(self) -> float:
        return self.appends + self.reads + self.other


def node_load(node: str, before: dict[str, int], after: dict[str, int], seconds: float, frames: int = 0) -> NodeLoad:
    """``NodeLoad`` of one node from two ``RedisServer.commands`` counts ``seconds`` apart (the
    second ``INFO`` call itself is left out).  ``frames``: the keyframes the node took
    meanwhile (``frames_by_node``): a keeper's script each (``redis_marks.ADD_MARK``), an
    ``EVAL`` as an append is, counted with the other requests."""
    d = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    scripts = d.pop("eval", 0) + d.pop("evalsha", 0)
    frames = min(frames, scripts)
    evals = scripts - frames
    reads = d.pop("xread", 0)
    d["xrevrange"] = max(0, d.get("xrevrange", 0) - evals)  # (one inside each append)
    d["exists"] = max(0, d.get("exists", 0) - frames)  # (one inside each keyframe's script)
    d.pop("xadd", 0)  # (inside the scripts; with them go the marks' own, a rank's every 5 min: <1%)
    d["keyframes"] = frames
    d["info"] = max(0, d.get("info", 0) - 1)
    return NodeLoad(node, evals / seconds, reads / seconds, sum(d.values()) / seconds)


def busiest_master(store: str, job: str, ranks: int) -> int:
    """The ranks of ``job`` on its busiest master (``redis_keeper.busiest``)."""
    from commscope.store import redis_keeper
    from commscope.store.cluster import Nodes
    from commscope.store.redis_url import parse_url

    target = parse_url(store)
    nodes = Nodes(target, target.display())
    nodes.connect()
    try:
        return redis_keeper.busiest(nodes, job, ranks) or ranks  # (never None for the bench's own user)
    finally:
        nodes.close()


def frames_by_node(store: str, job: str, ranks: int) -> dict[str, int]:
    """The keyframes each node took of ``job``'s streams (``Keys.frames``), by "host:port":
    every one added (Redis 7's ``entries-added``, which a stream's trim leaves as it was), not
    only the newest ``FRAMES_KEPT`` a stream keeps (~17 minutes of a rank).  Before Redis 7:
    those kept (a longer run's older ones' scripts then count as appends)."""
    from commscope.store.cluster import Nodes
    from commscope.store.redis_keys import Keys
    from commscope.store.redis_url import parse_url
    from commscope.store.resp import pack

    target = parse_url(store)
    nodes = Nodes(target, target.display())
    nodes.connect()
    try:
        keys = [Keys.frames(job, r) for r in range(ranks)]
        out: dict[str, int] = {}
        # (routed by the key, which is not XINFO's first argument: ``pipeline`` would route by "STREAM")
        infos = nodes.many([(k, pack("XINFO", "STREAM", k)) for k in keys])
        for key, info in zip(keys, infos, strict=True):
            host, port = nodes.node(key)
            out[f"{host}:{port}"] = out.get(f"{host}:{port}", 0) + _added(info)
        return out
    finally:
        nodes.close()


def _added(info: object) -> int:
    """The entries ever added to a stream, from its ``XINFO STREAM`` reply (a flat list of
    names and values): ``entries-added``, else (before Redis 7) its ``length``; 0 where
    there is no stream (an error reply: no keyframe taken)."""
    if not isinstance(info, list):
        return 0
    said = dict(zip(info[::2], info[1::2], strict=False))
    n = said.get(b"entries-added", said.get(b"length"))
    return n if isinstance(n, int) else 0


def run(args: argparse.Namespace) -> int:
    from commscope.analysis.ranks import ranges
    from commscope.launch import Job
    from commscope.record.jobid import new_job_id

    if args.quick:
        args.ranks, args.seconds = 64, 12.0
    if args.read_processes is not None and not 0 <= args.read_processes <= readahead.MOST_PROCESSES:
        raise SystemExit(f"bench scale: --read-processes {args.read_processes} is not between 0 and "
                         f"{readahead.MOST_PROCESSES}")
    if args.ranks < 16:
        raise SystemExit("bench scale: at least 16 ranks (two hosts of 8)")
    root = tempfile.mkdtemp(prefix="commscope-bench-scale-")
    store, server = _store(args.store, root, args.ranks)
    seconds = max(args.seconds, args.hang_after * 2 + 6)
    sync = tempfile.mkdtemp(prefix="commscope-bench-scale-sync-")
    plan = Plan(ranks=args.ranks, rate=args.rate, t_start=0, seconds=seconds, fault=args.fault,
                culprit=args.ranks // 2 + 3, fault_k=int(seconds / 3 * args.rate) + 1,
                hang_after=args.hang_after, job="scale-" + new_job_id(), store=store, sync=sync,
                device_times=args.device_times, read_processes=args.read_processes)
    print(f"bench scale: {args.ranks:,} ranks x {args.rate:g} collectives/s for {seconds:.0f} s"
          f"{', device times' if args.device_times else ''}\n"
          f"  into {args.store} ({store if args.store != 'directory' else root}), {args.writers} writer(s);\n"
          + ("  no fault (a healthy job: nothing is to be found)" if args.fault == "none" else
             f"  fault {args.fault!r} at {seconds / 3:.0f} s on " + (
                 f"rank {plan.culprit}'s host (ranks {ranges(list(plan.host_ranks()))})"
                 if args.fault in ("straggler-host", "two-hosts", "host-lost") else f"rank {plan.culprit}")),
          flush=True)
    writers = Job(write_share, args.writers, args=(plan, args.writers), init=False).start()
    try:
        opened = time.monotonic()
        while len(os.listdir(sync)) < args.writers:  # every stream open
            if not writers.alive() or time.monotonic() - opened > 600:
                why = [r.error.strip().splitlines()[-1] for r in writers.join(10).values() if r.error and r.error.strip()]
                raise SystemExit("bench scale: the writers did not open their streams"
                                 + (f": {why[0]}" if why else ""))
            time.sleep(0.05)
        print(f"  {args.ranks:,} streams opened in {time.monotonic() - opened:.1f} s", flush=True)
        plan = dataclasses.replace(plan, t_start=time.time_ns() + S // 2)
        with open(os.path.join(sync, "go.tmp"), "w") as f:
            f.write(str(plan.t_start))
        os.rename(os.path.join(sync, "go.tmp"), os.path.join(sync, "go"))
        fault_ns = plan.base(plan.fault_k)
        nodes = _nodes(server)
        counted = [(n.commands(), time.monotonic()) for n in nodes]
        seen = follow(plan, fault_ns, time.monotonic() + (plan.t_start - time.time_ns()) / S + seconds + 1.0,
                      args.writers, args.model_budget)
        results = list(writers.join(60).values())
        took = [(n.commands(), time.monotonic()) for n in nodes]
        frames = frames_by_node(store, plan.job, plan.ranks) if nodes else {}
        busiest = busiest_master(store, plan.job, plan.ranks) if nodes else plan.ranks
        loads = [node_load(f"127.0.0.1:{n.port}", c0, c1, t1 - t0, frames.get(f"127.0.0.1:{n.port}", 0))
                 for n, (c0, t0), (c1, t1) in zip(nodes, counted, took, strict=True)]
    finally:
        writers.kill()
        if server is not None:
            (server.stop if hasattr(server, "stop") else server.close)()
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(sync, ignore_errors=True)
    failed = [r for r in results if r.error]
    if failed:
        print(f"  a writer failed: {failed[0].error}")
        return 1
    wrote = [r.value for r in results]
    return _report(args, plan, seconds, wrote, seen, loads, busiest)


def _report(args: argparse.Namespace, plan: Plan, seconds: float, wrote: list[dict], seen: Followed,
            loads: list[NodeLoad], busiest: int) -> int:
    events = sum(x["events"] for x in wrote)
    writer_cpu = sum(x["cpu_s"] for x in wrote)
    want = plan.ranks * (plan.rate * plan.records + 2)  # a begin, an end (a done) a collective; a heartbeat, a sample
    rate = sum(x["before"] for x in wrote) / ((plan.base(plan.fault_k) - plan.t_start) / S)
    lags = seen.lags
    lag_med = median(lags) if lags else float("nan")
    lag_p99 = quantile(lags, 0.99) if lags else float("nan")
    frame = median(seen.frames) if seen.frames else float("nan")
    heat = median(seen.heat_frames) if seen.heat_frames else float("nan")
    found = seen.found_s
    limit = plan.hang_after + 5.0
    wall = max(x["wall_s"] for x in wrote)
    keepers = sum(x["keepers"] for x in wrote)
    kept = (f"; their keepers of keyframes' {sum(x['keeper_cpu_s'] for x in wrote) / wall * 100:.0f}%\n"
            f"    ({keepers} process(es) at the lowest priority: a rank of a real job has its own)" if keepers else "")
    print(f"  written: {events:,} events; {rate:,.0f} events/s before the fault\n"
          f"    (the job's: {want:,.0f});\n    writers' CPU {writer_cpu / wall * 100:.0f}% of a core{kept}")
    if loads:
        _report_loads(loads, max(x["every"] for x in wrote), plan.store, plan.ranks, busiest)
    read = seen.read_process_cpu_s
    procs = seen.read_processes
    which = "its read process, which makes" if procs == 1 else \
        f"its {procs} read processes (a part of the ranks each), which make"
    where = ("\n" + _wrapped(f"({read / seen.wall_s * 100:.0f}% in {which} its polls ahead)")
             if read is not None else "\n" + _wrapped(f"(reading in its own process: --read-processes 0, "
                                                       f"{readahead.ENV}=0, or one core)"))
    for why in seen.read_process_lost:  # (read here from then on)
        where += "\n" + _wrapped(f"LOST: {why}")
    print(f"  console: read {seen.events:,} events of {seen.ranks_seen:,} ranks;\n"
          f"    its CPU {seen.cpu_s / seen.wall_s * 100:.0f}% of a core, RSS {seen.rss / 2**20:,.0f} MiB"
          + where)
    marks = seen.behind
    mark_med = median(marks) if marks else float("nan")
    mark_p99 = quantile(marks, 0.99) if marks else float("nan")
    print(f"  reader lag: newest event median {lag_med:.2f} s, p99 {lag_p99:.2f} s\n"
          f"    watermark (every stream read up to; diagnosis judges there): median {mark_med:.2f} s,\n"
          f"    p99 {mark_p99:.2f} s behind (target <= {TARGET_LAG_S:g} s), from the first full read\n"
          + (f"    ({seen.first_round_s:.1f} s after the job's start; sampled from 3 s on)"
             if seen.first_round_s is not None else "    (never: not every stream was read once)"))
    after = seen.after_caught
    if seen.caught_s is None:
        print(f"    never caught up (every stream read past the job's start, within {TARGET_LAG_S:g} s)")
    else:  # (the start apart: a console that attaches first reads every rank's start, its tables)
        print(f"    caught up (every stream read past the job's start, within {TARGET_LAG_S:g} s)\n"
              f"    {seen.caught_s:.1f} s after the job's start; from then on "
              + (f"median {median(after):.2f} s, p99 {quantile(after, 0.99):.2f} s" if after else "no sample"))
        if seen.said_behind:
            said = sum(b for b, _ in seen.said_behind)
            unread = [n for _, n in seen.said_behind]
            print(f'    the header said "falling behind" at {said:,} of {len(unread):,} steps from then on\n'
                  f"    (unread, as the reader said: median {size(int(median(unread)))}, most {size(max(unread))})")
    if EXPECTED[plan.fault]:
        note = "\n    (a straggler needs its window of late collectives)" if plan.fault in SLOW_HOSTS else ""
        took = f"{found:.1f} s" if found is not None else "NOT FOUND"
        print(f"  fault -> finding: {took} (target <= hang_after + 5 = {limit:g} s){note}")
        captured, culprits, waiting, distinct = seen.stacks
        if found is not None and plan.fault not in SLOW_HOSTS:  # (a hang: every rank in it captured its stack)
            print(f"    its stacks, as last judged: {captured} of {culprits} culprit(s) captured;\n"
                  f"    {waiting:,} waiting rank(s) shown as {distinct} distinct stack(s)")
    if seen.early:
        print(textwrap.fill(f"also, naming only culprits first (another kind, or some of them): "
                            f"{'; '.join(seen.early[:5])}", width=80, initial_indent="  ", subsequent_indent="    "))
    if seen.wrong:
        more = f" and {len(seen.wrong) - 5} more" if len(seen.wrong) > 5 else ""
        print(textwrap.fill(f"other findings (WRONG: a victim blamed): {'; '.join(seen.wrong[:5])}{more}",
                            width=80, initial_indent="  ", subsequent_indent="    "))
    print(f"  frame (60 timeline rows, from the published view): median {fmt_time(frame)};\n"
          f"    its heatmap of every rank ({HEAT_LINES} lines)"
          + (f", each frame counted from the last:\n    median {fmt_time(heat)} (target <= 50 ms)" if seen.heat_frames
             else ": not followed (one frame only)")
          + (f";\n    counted whole, as a jump or a zoom counts it (every {HeatFrames.WHOLE_EVERY}th frame, "
             f"as well):\n    median {fmt_time(median(seen.heat_whole))} over {len(seen.heat_whole)} frames"
             if seen.heat_whole else ""))
    extrapolated = extrapolation(plan, seen)
    if extrapolated:
        print(extrapolated)
    print(memory(plan, seen, args.store, stored_of(plan, wrote)))
    missed = [what for what, met in (
        ("lag", mark_p99 <= TARGET_LAG_S), ("frame", frame <= TARGET_FRAME_S),
        ("heatmap frame", heat <= TARGET_FRAME_S or not seen.heat_frames), ("RSS", seen.rss <= TARGET_RSS),
        ("fault -> finding", EXPECTED[plan.fault] is None or (found is not None and found <= limit + (
            60 / plan.rate if plan.fault in SLOW_HOSTS else 0))),
        ("no victim blamed", not seen.wrong)) if not met]
    # (a run's own figures: an extrapolation above says "NOT within the target" apart)
    print(textwrap.fill("met at this run's scale (its measured figures, not the EXTRAPOLATED ones): "
                        + ("yes" if not missed else f"NO ({', '.join(missed)})"), width=80, initial_indent="  ",
                        subsequent_indent="    ", break_on_hyphens=False))
    return 1 if seen.wrong else 0  # (a victim blamed is a wrong diagnosis at any speed; a slow one is the machine's)
