"""Demo scenarios on real Gloo ranks: expected findings, stopping, bounded hangs, no orphans.

Every scenario runs headless with small knobs (few steps, short pauses) and the findings
``commscope check --json`` prints must be exactly the scenario's ``expect(ranks)``.
"""

from __future__ import annotations

import functools
import io
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest
from rich.console import Console

from commscope.analysis import TraceModel, diagnose
from commscope.analysis.source import open_source
from commscope.commands.check import check_store
from commscope.record.recorder import Recorder
from commscope.scenarios import EXIT_TIME_LIMIT, SCENARIOS, DemoJob, Scenario, run_headless
from commscope.scenarios.runner import LEAVE_WAIT
from commscope.store import AsOf

pytestmark = pytest.mark.timeout(120)

ORDER = ["healthy-training", "varlen-tour", "pipeline", "straggler", "missing-rank", "collective-mismatch",
         "p2p-deadlock", "dead-rank", "async-leak"]

# scenario -> (ranks, knobs): small enough for 2 cores, still the real workload
RUNS = {
    "healthy-training": (2, dict(steps=12, pace=0)),
    "varlen-tour": (3, dict(steps=1, pace=0)),
    "pipeline": (3, dict(steps=1, pace=0)),
    "straggler": (3, dict(steps=12, pace=0.2)),
    "missing-rank": (3, dict(steps=4, pace=0.1, hang_after=1.0)),
    "collective-mismatch": (3, dict(steps=2, pace=0.1, hang_after=1.0)),
    "p2p-deadlock": (3, dict(steps=1, pace=0.1, hang_after=1.0)),
    "dead-rank": (3, dict(steps=4, pace=0.1, hang_after=1.0)),
    "async-leak": (2, dict(steps=6, pace=0)),
}


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_gone(pids, limit: float = 10.0) -> list[int]:
    end = time.monotonic() + limit
    while time.monotonic() < end:
        left = [p for p in pids if not gone(p)]
        if not left:
            return []
        time.sleep(0.05)
    return [p for p in pids if not gone(p)]


def test_registry_lists_the_issue_scenarios_in_order():
    assert list(SCENARIOS) == ORDER
    for name, sc in SCENARIOS.items():
        assert isinstance(sc, Scenario) and sc.name == name
        assert sc.title and len(sc.summary) > 80 and len(sc.look_for) > 60
        assert sc.default_ranks == 4 and 2 <= sc.min_ranks <= sc.default_ranks
        assert sc.worker.__module__ == "commscope.scenarios.workloads"  # module level: picklable
        assert sc.expect() == sc.expected
    healthy = {n for n, s in SCENARIOS.items() if not s.expected}
    assert healthy == {"healthy-training", "varlen-tour", "pipeline"}
    assert {n for n, s in SCENARIOS.items() if s.hangs} == {"missing-rank", "collective-mismatch", "p2p-deadlock"}
    assert SCENARIOS["missing-rank"].expected == (("missing_ranks", (3,)),)
    assert SCENARIOS["p2p-deadlock"].expect(3) == (("p2p_deadlock", (0, 1, 2)),)


@pytest.mark.parametrize("name", ORDER)
def test_scenario_headless_reports_its_expected_findings(name, tmp_path, capsys):
    ranks, knobs = RUNS[name]
    out = io.StringIO()
    code = run_headless(name, ranks=ranks, store=str(tmp_path), json=True, timeout=60,
                        console=Console(file=out), check=check_store, **knobs)
    report = json.loads(out.getvalue())
    got = Counter((f["kind"], tuple(f["culprits"])) for f in report["findings"])
    want = Counter((k, tuple(c)) for k, c in SCENARIOS[name].expect(ranks))
    assert got == want, json.dumps(report["findings"], indent=1)[:4000]
    errors = any(f["severity"] == "error" for f in report["findings"])
    assert code == (1 if errors else 0)
    assert report["ranks"] == ranks and report["ops"] > 0
    header = capsys.readouterr().err
    assert f"commscope demo {name}" in header and str(tmp_path) in header
    # every run records into its own fresh directory under the given store
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert run_dir.name.startswith(name + "-") and (run_dir / "logs").is_dir()


def test_healthy_training_trace_has_ddp_async_and_varlen_ops(tmp_path):
    job = DemoJob("healthy-training", ranks=2, store=str(tmp_path), steps=8, pace=0).start()
    assert job.wait(60), job.errors()
    assert job.exitcodes == [0, 0] and job.finished and not job.errors()
    model = TraceModel.from_events(open_source(job.store).read_all())
    for r in (0, 1):
        names = Counter((model.sig_of(r, i).op, model.sig_of(r, i).src, model.sig_of(r, i).is_async)
                        for i in range(model.n_ops(r)) if not model.sig_of(r, i).nested)
        assert names[("all_reduce", "c10d", False)] >= 8  # DDP's reducer, seen at the dispatcher
        assert names[("all_reduce", None, True)] == 8  # the overlapped metric all_reduce
        assert names[("scatter_v", None, False)] == 1
        assert names[("all_gather_v", None, False)] >= 1
    with open(job.log_path(0)) as f:
        assert "scenario healthy-training completed" in f.read()


def test_text_report_is_what_check_prints(tmp_path):
    out = io.StringIO()
    code = run_headless("async-leak", ranks=2, store=str(tmp_path), steps=3, pace=0,
                        console=Console(file=out, width=120), check=check_store)
    text = out.getvalue()
    assert code == 0
    assert text.splitlines()[0].startswith("commscope demo async-leak: 2 ranks on gloo")
    assert "unwaited_work" in text and "0 error(s), 1 warning(s)" in text


def test_stop_kills_hung_workers_and_is_idempotent(tmp_path):
    job = DemoJob("p2p-deadlock", ranks=3, store=str(tmp_path), steps=1, pace=0, hang_after=1.0).start()
    pids = job.pids
    assert len(pids) == 3
    model, reader, as_of = TraceModel(), None, AsOf()
    end = time.monotonic() + 30
    found = []
    while time.monotonic() < end and not found:  # wait until it really hangs
        time.sleep(0.25)
        reader = reader or open_source(job.store, wait=True)
        model.ingest(reader.poll())
        now = as_of.now(reader, time.time_ns())
        found = [f for f in diagnose(model, now=now, hang_after=1.0) if f.kind == "p2p_deadlock"]
    assert found and job.alive() == [0, 1, 2]
    stopper = threading.Thread(target=job.stop)  # from another thread, as the console does
    stopper.start()
    job.stop()
    stopper.join(20)
    assert wait_gone(pids) == []
    assert job.finished and job.alive() == [] and all(c is not None for c in job.exitcodes)
    job.stop()  # again: nothing to do
    with pytest.raises(RuntimeError):
        job.start()  # a run is not restartable: a new DemoJob is


def test_stop_also_kills_child_processes_of_workers(tmp_path):
    sc = Scenario(name="spawner", title="t", summary="s", look_for="l", worker=spawn_and_wait)
    job = DemoJob(sc, ranks=2, store=str(tmp_path), pace=0).start()
    kids: list[int] = []
    end = time.monotonic() + 30
    while time.monotonic() < end and len(kids) < 2:
        time.sleep(0.1)
        kids = [c.pid for pid in job.pids if not gone(pid) for c in psutil.Process(pid).children()
                if "sleep" in " ".join(c.cmdline())]
    assert len(kids) == 2
    job.stop(timeout=2)
    assert wait_gone(job.pids + kids) == []


def spawn_and_wait(rank: int, ws: int, ctx) -> None:
    """A worker that starts a child process and waits on it (module level: picklable)."""
    subprocess.run(["sleep", "300"])


def test_a_worker_takes_its_launcher_for_alive_whatever_the_clock_does(monkeypatch):
    """A demo worker leaves as an orphan (EXIT_ORPHANED) when its launcher is gone: the pid
    no longer runs, or runs a process started at another time.  That time was psutil's
    ``create_time``, which adds the boot time Linux derives from the wall clock: a clock
    step moved it, and a live launcher's workers left at once (CI: exit codes [125, 125]
    where [124, 124]).  Here the boot time moves by a second."""
    import dataclasses

    from commscope.scenarios.base import DemoContext
    from commscope.scenarios.runner import _owner_alive, process_started

    ctx = DemoContext(scenario="missing-rank", owner_pid=os.getpid(), owner_started=process_started(os.getpid()))
    assert _owner_alive(ctx)
    boot = psutil.boot_time()
    for where in (psutil, psutil._pslinux):  # (the clock stepped: the boot time read since moved)
        monkeypatch.setattr(where, "boot_time", lambda: boot + 1.0)
    assert _owner_alive(ctx)
    assert not _owner_alive(dataclasses.replace(ctx, owner_started=ctx.owner_started + 1))  # (a pid reused)


@pytest.mark.parametrize("slow", [0.0, 0.5, 7.0],
                         ids=["missing-rank", "rank-0-slow-to-end", "rank-0-slower-than-the-leave-wait"])
def test_hanging_scenario_ends_on_its_own_and_keeps_the_diagnosis(tmp_path, slow):
    """Every rank leaves at the time limit and the trace keeps the hang.  ``slow``: rank 0
    is slow to end its recording there (0.5 s; 7 s, past ``LEAVE_WAIT``, as a last tick on a
    loaded host may be, within ``Recorder.FINAL_HOLD_S``); had rank 1 left without waiting
    for it, rank 0's waiting all_reduce would fail in its trace (an op_failed)."""
    assert LEAVE_WAIT < 7.0 < Recorder.FINAL_HOLD_S
    sc = Scenario(name="missing-rank-slow-end", title="t", summary="s", look_for="l",
                  worker=functools.partial(slow_to_end, slow)) if slow else "missing-rank"
    # (the limit counts from start(): two ranks importing torch on 2 loaded cores took ~5 s of
    # a 6 s limit once, so rank 0 had waited under hang_after when it came and no hang showed)
    job = DemoJob(sc, ranks=2, store=str(tmp_path), steps=4, pace=0.1, hang_after=1.0, time_limit=15.0).start()
    pids = job.pids
    assert job.wait(90), "the workers should leave at the time limit"
    assert wait_gone(pids) == []
    assert job.exitcodes == [EXIT_TIME_LIMIT, EXIT_TIME_LIMIT]
    out = io.StringIO()
    assert check_store(job.store, json=True, console=Console(file=out)) == 1
    report = json.loads(out.getvalue())
    assert [(f["kind"], f["culprits"]) for f in report["findings"]] == [("missing_ranks", [1])]
    assert report["findings"][0]["evidence"]["waited_s"].keys() == {"0"}


def slow_to_end(delay: float, rank: int, ws: int, ctx) -> None:
    """missing-rank, with rank 0 ending its recording ``delay`` s late at the time limit,
    its last tick slow (the others wait for it)."""
    from commscope.record import recorder
    from commscope.scenarios.workloads import missing_rank

    if rank == 0:
        end = recorder.end_before_exit

        def late(code: int) -> None:
            time.sleep(delay)
            end(code)

        recorder.end_before_exit = late
    missing_rank(rank, ws, ctx)


def test_a_worker_that_returns_while_its_rank_leaves_at_the_time_limit_leaves_with_the_others(tmp_path):
    """Rank 0's worker returns while its watchdog waits for the others to end their
    recordings (they are slow to): the rank stays until all leave, with the time limit's
    code, not its own 0 (a rank that tore its process group down first, and a wait the
    others could never finish)."""
    sc = Scenario(name="returns-while-leaving", title="t", summary="s", look_for="l", worker=returns_while_leaving)
    job = DemoJob(sc, ranks=3, store=str(tmp_path), pace=0, hang_after=1.0, time_limit=4.0).start()
    pids = job.pids
    assert job.wait(60), "the workers should leave at the time limit"
    assert wait_gone(pids) == []
    assert job.exitcodes == [EXIT_TIME_LIMIT] * 3


def returns_while_leaving(rank: int, ws: int, ctx) -> None:
    """Rank 0 returns once its watchdog began to leave; ranks 1 and 2 end their recordings
    2.5 s late."""
    from commscope.record import recorder
    from commscope.scenarios import runner

    if rank == 0:
        while not runner._time_is_up.is_set():
            time.sleep(0.05)
        return
    end = recorder.end_before_exit

    def late(code: int) -> None:
        time.sleep(2.5)
        end(code)

    recorder.end_before_exit = late
    ctx.hold()


ORPHAN = textwrap.dedent("""
    import os, sys
    from commscope.scenarios import DemoJob
    if __name__ == "__main__":
        job = DemoJob("p2p-deadlock", ranks=2, store=sys.argv[1], steps=1, pace=0).start()
        print(" ".join(map(str, job.pids)), flush=True)
        job.wait(4)
        if sys.argv[2] == "crash":
            os._exit(1)  # the launching process dies: no atexit, no stop()
        sys.exit(0)      # normal exit without stop(): atexit stops the job
""")


@pytest.mark.parametrize("how", ["crash", "exit"])
def test_no_orphans_when_the_launching_process_goes(tmp_path, how):
    script = tmp_path / "owner.py"
    script.write_text(ORPHAN)
    root = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "store"), how], capture_output=True,
                          text=True, timeout=90, env=env)
    pids = [int(p) for p in proc.stdout.split()]
    assert len(pids) == 2, proc.stderr
    assert wait_gone(pids, 15) == []


def test_bad_input(tmp_path, capsys):
    import torch

    if torch.cuda.device_count() < 4:
        with pytest.raises(ValueError, match=r"nccl backend needs 4 GPUs, found \d+; use --backend gloo"):
            DemoJob("healthy-training", backend="nccl", store=str(tmp_path))
        assert run_headless("healthy-training", backend="nccl", store=str(tmp_path)) == 2
        assert "nccl backend needs 4 GPUs" in capsys.readouterr().err
    with pytest.raises(ValueError, match="unknown scenario"):
        DemoJob("nope")
    assert run_headless("nope") == 2
    with pytest.raises(ValueError, match="at least 3 ranks"):
        DemoJob("collective-mismatch", ranks=2)
    with pytest.raises(ValueError, match="backend"):
        DemoJob("pipeline", backend="mpi")
    assert list(tmp_path.iterdir()) == []  # nothing started, nothing written
