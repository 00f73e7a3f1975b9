"""Smoke test of ``commscope bench varlen --quick``: it runs, prints its tables, exits 0."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.timeout(120)
def test_bench_varlen_quick_prints_tables():
    proc = subprocess.run([sys.executable, "-m", "commscope", "bench", "varlen", "--quick"],
                          capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    for title in ("all_gather_v vs recipes", "send_tensors: 10 mixed tensors", "strategies forced one by one",
                  "targets (issue 3)"):
        assert title in out, out
    for row in ("all_gather_object", "seed002_pickle", "all_gather_v[p2p]", "reduce_scatter_v[allreduce]",
                "metadata[p2p]", "send_tensors ≤ 1.3x raw send"):
        assert row in out, out
