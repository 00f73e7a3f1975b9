"""Running a command that starts processes of its own (a launcher and its ranks) from a test,
so that none of them outlives the test: ``subprocess.run`` kills only its own child on a
timeout, and nothing at all when pytest-timeout stops the test, so a hung job's ranks went on
spinning on the machine's two cores under the next tests."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterable, Sequence
from pathlib import Path


def run_session(cmd: Sequence[str], *, timeout: float, capture_output: bool = False, **kwargs
            ) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, timeout=timeout, ...)`` in a session of its own, whose every process
    is killed when it ends, times out, or the test is stopped meanwhile (pytest-timeout's
    exception in the main thread, a Ctrl-C) once it is started: a stop inside ``Popen`` itself,
    before it returns the session's pid, leaves nothing to kill by (pytest-timeout's minutes
    never land there)."""
    if capture_output:
        kwargs.setdefault("stdout", subprocess.PIPE)
        kwargs.setdefault("stderr", subprocess.PIPE)
    proc = subprocess.Popen(list(cmd), start_new_session=True, **kwargs)
    try:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(proc.pid)
            proc.communicate()
            raise
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    finally:
        kill_group(proc.pid)  # (what it left behind: a rank its launcher never waited for)
        if proc.returncode is None:
            proc.kill()
            proc.wait()


def kill_group(pgid: int) -> None:
    """SIGKILL to every process of session ``pgid`` still there."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def stop(pids: Iterable[int]) -> None:
    """SIGSTOP to each of ``pids``, returning once every thread of each is stopped: ``kill``
    returns with the signal only queued, and a thread in a write, or running on the other
    core, finishes it first, so what a test counted right after could still change
    (``test_store_losses``' line counts).  A process gone is as good as stopped."""
    pids = list(pids)
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    for pid in pids:
        while not _all_stopped(pid):
            time.sleep(0.001)


def state_of(pid: int | str) -> str:
    """A process's (or a thread's: ``PID/task/TID``) state letter, from ``/proc``; "gone"
    where there is none."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return "gone"


def gone(pid: int) -> bool:
    """Whether ``pid`` has ended (gone, or a zombie its parent has not waited for yet)."""
    return state_of(pid) in ("Z", "X", "gone")


def _all_stopped(pid: int) -> bool:
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except FileNotFoundError:
        return True
    # (a thread that ended meanwhile: "gone")
    return all(state_of(f"{pid}/task/{task.name}") in ("T", "t", "Z", "X", "gone") for task in tasks)
