"""``commscope bench store`` runs end to end on every store, a Redis Cluster included.

Its writer measurement records and reads the same store in one process: that once made the
reader forward the recorder's live spool into its own stream and remove it under the
recorder (a SIGBUS, tests/test_spool.py holds the cause).  Figures are the benchmark's
business; this only checks that each measurement ran and the live reader read every event
written (whether it caught up within the bench's time is a figure: a loaded machine makes it
late, never wrong).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

from redis_fixture import require_redis_server


def test_bench_store_runs_on_a_directory_redis_and_a_redis_cluster():
    require_redis_server()
    done = subprocess.run([sys.executable, "-m", "commscope", "bench", "store", "--quick", "--redis",
                           "--redis-cluster"], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    for store in ("directory", "redis ", "redis-cluster"):
        assert f"│ {store}" in out, out
    follows = re.findall(r"live follow: .*?([\d,]+) events written in [\d.]+ s, the reader polled ([\d,]+) of them",
                         out.replace("\n", " "))
    assert len(follows) == 2 and all(written == polled for written, polled in follows), out
    assert "a follower's look at the ends of 16,384 closed ranks" in out.replace("\n", " "), out
    assert "requests per second per master" in out and "refusing to mix" not in done.stderr, done.stderr[-2000:]
    where = re.search(r"files under (\S+),", out)
    assert where and not os.path.exists(where.group(1))  # its stores removed (a CI run made 33 MB of them each time)
