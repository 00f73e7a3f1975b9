"""Smoke test of ``commscope bench analysis --quick``: it runs, builds the model both ways
from a written job's columns, times every way a wide job stops, and exits 0 on the healthy
trace with every stopped job's findings as they must be."""

from __future__ import annotations

import subprocess
import sys

from commscope.analysis.synth import STOPS


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
    assert "jobs of 256 ranks that stopped" in out, out
    for way in STOPS:
        assert way in out, out
    assert "WRONG" not in out and "rank_crashed (128)" in out, out
