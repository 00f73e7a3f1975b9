"""Snapshot: time from a hung job to its finding, and what a snapshot costs the job.

Part 1 starts a real uninstrumented 4-rank Gloo job that hangs (``commscope.bench.hungjob
missing``: rank 2 spins in Python, the others wait in all_reduce), waits until every rank
is there, and runs ``commscope snapshot`` as a user does (a new process: discovery, py-spy
dumps, the store, the printed diagnosis), alternating its settings; each row is the
median wall time from the command's start to its exit, and whether it named rank 2.

Part 2 runs a healthy job (``hungjob steps``: 20 all_reduces of 4 KB per step on 4
ranks) and alternates phases without and with a snapshot running (the default: 3
samples 1 s apart, native frames); the ratio is the job's median step time with over
without.  On this machine the job, py-spy and the command share the same cores, so the
ratio counts the command's CPU as well as the pauses of each dump.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

from rich.console import Console
from rich.table import Table

from commscope.bench.stats import median
from commscope.commands import options
from commscope.launch import free_port

#: the job's script, run by path: importing it here would import torch into every command
#: (``commands/bench`` imports each suite to build the parser)
HUNGJOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hungjob.py")

SETTINGS = {"default (3 samples, 1 s apart, native)": [],
            "one sample, native": ["--count", "1"],
            "one sample, Python frames only": ["--count", "1", "--no-native"],
            "3 samples, 0.2 s apart, Python frames only": ["--interval", "0.2", "--no-native"]}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs", type=options.positive, default=3, help="snapshots per setting, and phases per side (default 3)")
    p.add_argument("--ranks", type=int, default=4, help="ranks of the job (default 4)")


def start(mode: str, ranks: int, stdout: int | None = subprocess.DEVNULL) -> list[subprocess.Popen]:
    """The job's ranks as plain processes with RANK/WORLD_SIZE, as any launcher starts them."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COMMSCOPE_", "TORCH_FR"))}
    out = []
    for r in range(ranks):
        e = dict(env, RANK=str(r), WORLD_SIZE=str(ranks), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(ranks),
                 MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), STEPS="1000000", PYTHONUNBUFFERED="1")
        out.append(subprocess.Popen([sys.executable, HUNGJOB, mode], env=e,
                                    stdout=stdout if r == 0 else subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                    text=True))
    return out


def stop(ps: list[subprocess.Popen]) -> None:
    for p in ps:
        try:
            p.send_signal(signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()


def settled(ps: list[subprocess.Popen], timeout: float = 180.0) -> None:
    """Until ranks 0, 1, 3 are in all_reduce and rank 2 spins (polled with py-spy)."""
    from commscope.snapshot import infer, pyspy

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            ops = [infer.in_flight(pyspy.dump(p.pid)) for p in ps]
        except pyspy.DumpError:
            ops = []
        if ops and all((o is None) == (r == 2) for r, o in enumerate(ops)):
            return
        time.sleep(0.2)
    raise RuntimeError("the job never reached its hang")


def snapshot(store: str, extra: list[str], pids: list[int]) -> tuple[float, bool, str]:
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "commscope", "snapshot", "--out", store, "--pid", *map(str, pids),
                          *extra], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, COMMSCOPE_NO_PROGRESS="1"))
    took = time.perf_counter() - t0
    named = out.returncode == 0 and "ERROR missing_ranks" in out.stdout and "culprits: 2 " in out.stdout
    return took, named, out.stderr.strip()[-200:]


def run(args: argparse.Namespace) -> int:
    from commscope.snapshot import pyspy

    console = Console()
    if pyspy.executable() is None:
        console.print(pyspy.INSTALL)
        return 2
    if args.ranks < 3:
        console.print("--ranks must be at least 3 (rank 2 is the one that never arrives)")
        return 2
    tmp = tempfile.mkdtemp(prefix="commscope-bench-snapshot-")
    job = start("missing", args.ranks)
    times: dict[str, list[float]] = {k: [] for k in SETTINGS}
    right: dict[str, int] = {k: 0 for k in SETTINGS}
    try:
        settled(job)
        n = 0
        for _ in range(max(1, args.runs)):
            for name, extra in SETTINGS.items():  # alternating the settings, run after run
                n += 1
                took, named, err = snapshot(os.path.join(tmp, f"s{n}"), extra, [p.pid for p in job])
                times[name].append(took)
                right[name] += named
                if err and not named:
                    console.print(f"{name}: {err}", style="yellow", markup=False)
    finally:
        stop(job)
    table = Table(title=f"time to a finding: a hung {args.ranks}-rank Gloo job (rank 2 spins), "
                        "`commscope snapshot` start to exit, median of "
                        f"{args.runs}", title_justify="left")
    for col in ("setting", "median s", "min s", "named rank 2"):
        table.add_column(col, justify="left" if col == "setting" else "right")
    for name in SETTINGS:
        table.add_row(name, f"{median(times[name]):.2f}", f"{min(times[name]):.2f}",
                      f"{right[name]}/{len(times[name])}")
    console.print(table)
    _cost(console, tmp, args)
    return 0 if all(right[k] == len(times[k]) for k in SETTINGS) else 1


def _cost(console: Console, tmp: str, args: argparse.Namespace) -> None:
    job = start("steps", args.ranks, stdout=subprocess.PIPE)
    steps: list[tuple[float, float]] = []

    def read() -> None:
        assert job[0].stdout is not None
        for line in job[0].stdout:
            if line.startswith("step "):
                steps.append((time.monotonic(), float(line.split()[1])))

    threading.Thread(target=read, daemon=True).start()
    phases: list[tuple[str, float, float]] = []
    try:
        while len(steps) < 20:  # warmed up
            time.sleep(0.1)
        for i in range(max(1, args.runs)):
            t0 = time.monotonic()
            took, _, _ = snapshot(os.path.join(tmp, f"c{i}"), [], [p.pid for p in job])
            t1 = time.monotonic()
            phases.append(("with", t0, t1))
            time.sleep(took)
            phases.append(("without", t1, time.monotonic()))
    finally:
        stop(job)
    side = {k: [ms for t, ms in steps for kind, a, b in phases if kind == k and a <= t < b] for k in ("with", "without")}
    table = Table(title="what a snapshot costs the job: step time (20 all_reduces of 4 KB, "
                        f"{args.ranks} ranks), phases alternating", title_justify="left")
    for col in ("phase", "steps", "median ms", "ratio"):
        table.add_column(col, justify="left" if col == "phase" else "right")
    base = median(side["without"]) if side["without"] else float("nan")
    for k in ("without", "with"):
        m = median(side[k]) if side[k] else float("nan")
        table.add_row(f"{k} a snapshot running", str(len(side[k])), f"{m:.2f}", f"{m / base:.2f}x")
    console.print(table)
