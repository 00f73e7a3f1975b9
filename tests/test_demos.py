"""The example scripts in demos/: under `commscope run` with torchrun, and without it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from trace_helpers import of_type, ops, read_events

pytestmark = pytest.mark.timeout(180)

DEMOS = Path(__file__).resolve().parents[1] / "demos"


def torchrun(n: int = 2) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(n)]


def clean_env() -> dict[str, str]:
    """This environment minus anything that would switch commscope on."""
    return {k: v for k, v in os.environ.items() if not k.startswith("COMMSCOPE_") and k != "TORCH_FR_BUFFER_SIZE"}


def run(cmd: list[str], cwd: Path, timeout: float = 150) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=clean_env(), capture_output=True, text=True, timeout=timeout)


def commscope(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "commscope", *args], cwd)


def test_train_ddp_under_commscope_run_records_every_rank_and_ddp(tmp_path):
    steps = 12
    proc = commscope("run", "--store", "trace", "--", *torchrun(2), str(DEMOS / "train_ddp.py"),
                     "--steps", str(steps), "--pause", "0", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"train_ddp: completed {steps} steps on 2 ranks" in proc.stdout
    events = read_events(tmp_path / "trace")
    for rank in (0, 1):
        assert len(of_type(events, "meta", rank)) == 1
        kinds = Counter((o["op"], o.get("src")) for o in ops(events, rank) if not o.get("nested"))
        assert kinds[("all_reduce", "c10d")] >= steps  # DDP's gradient all-reduces, from C++
        assert kinds[("all_reduce", None)] == steps  # the async loss all_reduce
        assert kinds[("scatter_v", None)] == 1 and kinds[("all_gather_v", None)] >= 1


def test_train_ddp_without_commscope_runs_uninstrumented(tmp_path):
    proc = run([*torchrun(2), str(DEMOS / "train_ddp.py"), "--steps", "5", "--pause", "0"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "train_ddp: completed 5 steps on 2 ranks" in proc.stdout
    assert list(tmp_path.iterdir()) == []  # no trace anywhere: nothing was recorded
    assert "commscope" not in proc.stderr


@pytest.mark.parametrize("late", ["-1", "1"], ids=["together", "rank-1-late"])
def test_deadlock_mismatch_hangs_is_diagnosed_and_ends_on_its_own(tmp_path, late):
    """The hang held, then every rank leaves at the deadline with code 0, also the culprit
    when it wakes after the others left (a loaded machine: its broadcast then fails)."""
    proc = commscope("run", "--store", "trace", "--hang-after", "1", "--", *torchrun(3),
                     str(DEMOS / "deadlock_mismatch.py"), "--bug", "mismatch", "--hold", "4", "--late-rank", late,
                     cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("held the mismatch hang until the deadline") == 3
    check = commscope("check", "trace", "--json", cwd=tmp_path)
    assert check.returncode == 1, check.stderr
    findings = json.loads(check.stdout)["findings"]
    assert [(f["kind"], f["culprits"]) for f in findings] == [("collective_mismatch", [1])]


def test_pipeline_p2p_under_commscope_run_is_healthy(tmp_path):
    proc = commscope("run", "--store", "trace", "--", *torchrun(2), str(DEMOS / "pipeline_p2p.py"),
                     "--iters", "2", "--pause", "0", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "pipeline_p2p: completed 2 iterations on 2 stages" in proc.stdout
    events = read_events(tmp_path / "trace")
    names = Counter(o["op"] for o in ops(events, 1) if not o.get("nested"))
    assert names["recv_tensors"] == 12 and names["isend_tensors"] == 12 and names["batch_isend_irecv"] == 12
    check = commscope("check", "trace", "--json", cwd=tmp_path)
    assert check.returncode == 0 and json.loads(check.stdout)["findings"] == []
