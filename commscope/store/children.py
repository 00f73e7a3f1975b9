"""How a directory writer starts the children that work beside it (the closer of a segment,
``store/retention.py``; the keeper of keyframes, ``store/keyframes.py``): at the lowest
priority, apart from the rank's session, so the rank never waits on them."""

from __future__ import annotations

import functools
import shutil
import subprocess
import sys


@functools.cache
def lowest_priority() -> tuple[str, ...]:
    """What runs a child at the lowest priority (``nice``, looked up once, not at every new
    segment; nothing where there is none)."""
    nice = shutil.which("nice")
    return (nice, "-n", "19") if nice else ()


def start(module: str, *args: str, stdin: int | None = subprocess.DEVNULL) -> subprocess.Popen | None:
    """``python -m module args`` at the lowest priority, in a session of its own, its output
    discarded; None when it cannot be started."""
    try:
        return subprocess.Popen([*lowest_priority(), sys.executable, "-m", module, *args], stdin=stdin,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True,
                                start_new_session=True)
    except OSError:
        return None
