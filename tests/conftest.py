"""Shared test setup: the tests directory is importable from every test package (tests/gpu too),
and the ranks the tests start keep their spools in a directory of this test session's own
(``store/spool.py``), removed at its end, never in the user's."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

#: Room the suite's spools take at once: a whole run held up to ~680 MiB of them (16 MiB
#: rings: the live ranks of two files, the dead ones waiting to be forwarded).  Where
#: /dev/shm has less room (a container's 64 MiB), a rank's spool would fail and the rank
#: record without one, and tests that kill ranks would fail for it: the disk's temporary
#: directory then.
SPOOL_ROOM = 2 << 30


def _spool_parent() -> str | None:
    try:
        return "/dev/shm" if shutil.disk_usage("/dev/shm").free >= SPOOL_ROOM else None
    except OSError:
        return None


_SPOOLS = tempfile.mkdtemp(prefix="commscope-test-spools-", dir=_spool_parent())
os.chmod(_SPOOLS, 0o700)
os.environ["COMMSCOPE_SPOOL_DIR"] = _SPOOLS  # inherited by every rank the tests start


def pytest_terminal_summary(terminalreporter):
    """Where the ranks' spools went, and the room there (a CI log then says it, -q too)."""
    try:
        free = f"{shutil.disk_usage(os.path.dirname(_SPOOLS)).free >> 20:,} MiB free"
    except OSError as exc:
        free = str(exc)
    terminalreporter.write_line(f"commscope spools: {os.path.dirname(_SPOOLS)} ({free})")


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(_SPOOLS, ignore_errors=True)
