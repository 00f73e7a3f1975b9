"""Smoke test of ``commscope bench analysis --quick``: it runs, builds the model both ways
from a written job's columns, and exits 0 on the healthy trace."""

from __future__ import annotations

import subprocess
import sys


def test_bench_analysis_quick_runs_and_compares_the_two_builds():
    proc = subprocess.run([sys.executable, "-m", "commscope", "bench", "analysis", "--quick"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "findings on the healthy trace" in out
    for row in ("model build from columns, new ranks together", "model build from columns, rank by rank",
                "rank by rank / together"):
        assert row in out, out
    assert "16 ranks" in out and "M records/s" in out
