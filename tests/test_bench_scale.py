"""``commscope bench scale`` end to end: simulated ranks write a live job through the real
store writers, the console's data side follows it and finds the injected fault naming the
culprit.  Figures are the benchmark's business; this checks the finding, and that the job's
events were written and read."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from redis_fixture import require_redis_server


@pytest.mark.parametrize("store, fault", [("directory", "dead"), ("redis-cluster", "mismatch"),
                                          ("directory", "two-hosts")])
def test_bench_scale_finds_the_fault_it_injects(store, fault):
    if store != "directory":
        require_redis_server()
    done = subprocess.run([sys.executable, "-m", "commscope", "bench", "scale", "--quick", "--store", store,
                           "--fault", fault], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "COLUMNS": "200"})
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-3000:]
    assert re.search(r"fault -> finding: \d+\.\d s", out), out  # found, naming the culprit
    assert "other findings" not in out, out  # and nothing else: no victim blamed
    written = int(re.search(r"written: ([\d,]+) events", out).group(1).replace(",", ""))
    read = int(re.search(r"console: read ([\d,]+) events of 64 ranks", out).group(1).replace(",", ""))
    assert written > 0 and read >= written  # every event written was read (and the writers' meta lines)
