"""A torchrun run that restarted (``--max-restarts``): each attempt records a job of its own,
and ``check``/``report`` of the store (its newest job, the last attempt) say which earlier
attempts there were and how they ended (helper-76: a run whose first attempt crashed was
"healthy", exit 0, with nothing about the crash)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from commscope.analysis.source import parse_attempt, restarts
from commscope.commands.check import restart_warnings, restarted
from commscope.record import jobid

pytestmark = pytest.mark.timeout(240)

#: Two ranks on Gloo; in attempt 0 rank 1 fails ($FAULT) before its third all_reduce, and
#: torchrun restarts both; attempt 1 completes.  Each attempt's group uses a store prefix of
#: its own: torch 2.13's Gloo, restarted on torchrun's agent store, reads the last attempt's
#: addresses and fails to connect (an attempt that dies inside init_process_group).
TRAIN = textwrap.dedent("""
    import datetime, os, signal
    import torch, torch.distributed as dist
    attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    timeout = datetime.timedelta(seconds=60)
    master = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" and rank == 0
    base = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                         is_master=master, timeout=timeout)
    dist.init_process_group("gloo", store=dist.PrefixStore("attempt" + attempt, base), rank=rank,
                            world_size=world, timeout=timeout)
    x = torch.ones(4)
    for step in range(4):
        if attempt == "0" and rank == 1 and step == 2:
            if os.environ["FAULT"] == "raise":
                raise RuntimeError("boom from rank 1")
            os.kill(os.getpid(), signal.SIGKILL)
        dist.all_reduce(x)
    dist.barrier()
    dist.destroy_process_group()
""")


def commscope(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "500", **(env or {})}
    return subprocess.run([sys.executable, "-m", "commscope", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=200)


def run_restarting(tmp_path: Path, fault: str, *job: str) -> Path:
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    proc = commscope("run", "--store", "trace", *job, "--", sys.executable, "-m", "torch.distributed.run",
                     "--nproc-per-node", "2", "--max-restarts", "1", "--monitor-interval", "0.1", str(script),
                     cwd=tmp_path, env={"FAULT": fault})
    assert proc.returncode == 0, proc.stderr[-3000:]  # (the run recovered)
    return tmp_path / "trace"


def jobs_of(store: Path) -> list[str]:
    return sorted(d.name for d in store.iterdir() if d.is_dir())


def test_check_of_a_restarted_run_names_the_attempt_that_crashed(tmp_path):
    store = run_restarting(tmp_path, "raise")
    first, last = jobs_of(store)
    assert (parse_attempt(first).number, parse_attempt(last).number) == (0, 1)
    run = parse_attempt(last).run
    assert parse_attempt(first).run == run and first.endswith(f"-{run}-a0") and last.endswith(f"-{run}-a1")
    assert (store / "LATEST").read_text() == last + "\n"

    proc = commscope("check", str(store), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr  # the run recovered: its last attempt is healthy
    lines = proc.stdout.splitlines()
    assert lines[1:] == [
        f"warning: this is attempt 1 of torchrun run {run}, which restarted: the findings and the exit code are "
        "this attempt's; its earlier attempts:",
        f"warning: attempt 0 (job {first}) failed: rank_crashed, culprits 1: rank 1 crashed after all_reduce #2 "
        f"(group 0): RuntimeError: boom from rank 1, at {tmp_path / 'train.py'}:16 in <module>; "
        f"commscope check {store / first}",
        "no findings: attempt 1 looks healthy (the run restarted 1 time(s): its earlier attempts are in the "
        "warnings above)",
    ]

    out = json.loads(commscope("check", "--json", str(store), cwd=tmp_path).stdout)
    assert out["findings"] == []
    assert out["warnings"] == [w.removeprefix("warning: ") for w in lines[1:3]]
    (earlier,) = out["restarts"]["earlier"]
    assert {k: out["restarts"][k] for k in ("attempt", "run")} == {"attempt": 1, "run": run}
    assert {k: v for k, v in earlier.items() if k != "findings"} == {
        "attempt": 0, "job": first, "store": str(store / first), "ranks": 2, "errors": 1, "warnings": 0}
    assert [(f["kind"], f["culprits"]) for f in earlier["findings"]] == [("rank_crashed", [1])]
    # the attempt's own check says the same, and fails
    alone = commscope("check", "--json", str(store / first), cwd=tmp_path)
    assert alone.returncode == 1
    assert json.loads(alone.stdout)["findings"] == earlier["findings"]
    assert json.loads(alone.stdout)["restarts"] is None  # (attempt 0: nothing before it)

    report = commscope("report", str(store), cwd=tmp_path)
    assert report.returncode == 0
    assert report.stdout.splitlines()[1] == (
        f"warning: this is attempt 1 of torchrun run {run}, which restarted: these tables are this attempt's "
        f"(attempt 0: commscope check {store / first})")
    rep = json.loads(commscope("report", "--json", str(store), cwd=tmp_path).stdout)
    assert rep["restarts"] == {"attempt": 1, "run": run,
                               "earlier": [{"attempt": 0, "job": first, "store": str(store / first)}]}


def test_a_job_id_given_names_each_attempt_after_the_first(tmp_path):
    """``--job NAME``: attempt 0 records NAME, attempt 1 NAME-a1 (it was refused before: "already
    holds events of an earlier job")."""
    store = run_restarting(tmp_path, "kill", "--job", "myrun")
    assert jobs_of(store) == ["myrun", "myrun-a1"]
    proc = commscope("check", str(store), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[1:] == [
        "warning: this is attempt 1 of torchrun run myrun, which restarted: the findings and the exit code are "
        "this attempt's; its earlier attempts:",
        "warning: attempt 0 (job myrun) failed: dead_rank, culprits 1: rank 1 was gone without a clean exit (after "
        "all_reduce #2 (group 0)): its process ended without a word (SIGKILL, the OOM killer, or a signal nothing "
        f"noted); commscope check {store / 'myrun'}",
        "no findings: attempt 1 looks healthy (the run restarted 1 time(s): its earlier attempts are in the "
        "warnings above)",
    ]


# ---------------------------------------------------------------------- ids and grouping
def test_attempt_ids_share_the_run_key_and_read_back(monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    assert parse_attempt(jobid.attempt_job_id()) is None  # (not under torchrun: as before)
    assert jobid.attempt_job_id("given") == "given"
    for run_id in ("none", "5c2b7d0e-uuid"):
        monkeypatch.setenv("TORCHELASTIC_RUN_ID", run_id)
        got = []
        for n in (0, 1, 12):
            monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", str(n))
            got.append(parse_attempt(jobid.attempt_job_id()))
            assert jobid.attempt_job_id("given") == ("given" if n == 0 else f"given-a{n}")
            assert parse_attempt(jobid.attempt_job_id("given")) == (
                None if n == 0 else ("given", n, "", "given"))
        assert [a.number for a in got] == [0, 1, 12] and len({a.run for a in got}) == 1
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "another")
    assert parse_attempt(jobid.attempt_job_id()).run != got[0].run
    assert jobid.attempt_job_id("x" * 120) == "x" * 116 + "-a12"  # (within 120 characters)


def fake_store(root: Path, *jobs: str) -> None:
    for job in jobs:
        (root / job).mkdir(parents=True)
        (root / job / "job.json").write_text(json.dumps({"job": job}))


def reading(root: Path, job: str) -> SimpleNamespace:
    return SimpleNamespace(job_name=lambda: job, job_dir=root / job)


def test_earlier_attempts_are_walked_back_through_the_run(tmp_path):
    k = "abc123"
    fake_store(tmp_path, f"20260101-000000-{k}-a0", f"20260101-000100-{k}-a1",  # an older run, same --rdzv-id
               f"20260102-000000-{k}-a0", f"20260102-000200-{k}-a2", f"20260102-000300-{k}-a3",
               "20260102-000100-ffffff-a1", "20260102-000100-0a1b2c", "other")
    r = restarts(None, reading(tmp_path, f"20260102-000300-{k}-a3"))
    assert (r.attempt, r.run, r.listed) == (3, k, True)
    assert [(e.number, e.job, e.name) for e in r.earlier] == [
        (2, f"20260102-000200-{k}-a2", str(tmp_path / f"20260102-000200-{k}-a2")),
        (1, None, None),  # (it left no trace: the older run's attempt 1 is not taken for it)
        (0, f"20260102-000000-{k}-a0", str(tmp_path / f"20260102-000000-{k}-a0"))]
    # the older run's own attempt 1 stops at its own attempt 0
    older = restarts(str(tmp_path / f"20260101-000100-{k}-a1"), reading(tmp_path, f"20260101-000100-{k}-a1"))
    assert [(e.number, e.job) for e in older.earlier] == [(0, f"20260101-000000-{k}-a0")]
    for job in (f"20260102-000000-{k}-a0", "20260102-000100-0a1b2c", "other"):
        assert restarts(None, reading(tmp_path, job)) is None


def test_attempts_without_a_readable_trace_are_said_so(tmp_path):
    fake_store(tmp_path, "myrun", "myrun-a2")  # attempt 0's job holds no events; attempt 1 none at all
    restart = restarted(None, reading(tmp_path, "myrun-a2"))
    assert restart["earlier"][0] == {"attempt": 1, "job": None, "store": None, "note": (
        "no trace in this store: the attempt ended before init_process_group returned, or was recorded elsewhere")}
    assert restart_warnings(restart) == [
        "this is attempt 2 of torchrun run myrun, which restarted: the findings and the exit code are this "
        "attempt's; its earlier attempts:",
        "attempt 1: no trace in this store: the attempt ended before init_process_group returned, or was recorded "
        "elsewhere",
        f"attempt 0 (job myrun): could not be read: {tmp_path / 'myrun'}: no events recorded; "
        f"commscope check {tmp_path / 'myrun'}",
    ]
