"""Shared test setup: the tests directory is importable from every test package (tests/gpu too),
and the ranks the tests start keep their spools in a directory of this test session's own
(``store/spool.py``), removed at its end, never in the user's."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

_SPOOLS = tempfile.mkdtemp(prefix="commscope-test-spools-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
os.chmod(_SPOOLS, 0o700)
os.environ["COMMSCOPE_SPOOL_DIR"] = _SPOOLS  # inherited by every rank the tests start


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(_SPOOLS, ignore_errors=True)
