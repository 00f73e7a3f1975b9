"""``procs.run_session``: no process a test's job started outlives the test, whether the job
ends, times out or the test is stopped while it runs (as pytest-timeout stops it)."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
from procs import gone, run_session


def _wait_gone(pid: int) -> None:
    while not gone(pid):  # (SIGKILL sent: gone as soon as the kernel has it; pytest-timeout bounds it)
        time.sleep(0.01)


def test_a_process_the_job_left_behind_is_killed_when_it_ends():
    got = run_session(["sh", "-c", "sleep 300 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True, timeout=60)
    assert got.returncode == 0
    _wait_gone(int(got.stdout))


def test_every_process_of_the_job_is_killed_when_the_test_is_stopped(tmp_path):
    pid_file = tmp_path / "pid"

    class Stopped(Exception):
        pass

    def stop(*_: object) -> None:
        raise Stopped  # (as pytest-timeout's SIGALRM handler fails the test in the main thread)

    def waiting_for_the_job() -> bool:  # (the main thread in ``communicate``: past starting it)
        frame = sys._current_frames().get(threading.main_thread().ident)
        while frame is not None and frame.f_code.co_name != "communicate":
            frame = frame.f_back
        return frame is not None

    def stop_when_started() -> None:
        while not (pid_file.exists() and pid_file.read_text().endswith("\n") and waiting_for_the_job()):
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGALRM)

    old = signal.signal(signal.SIGALRM, stop)
    stopper = threading.Thread(target=stop_when_started)
    stopper.start()
    try:
        with pytest.raises(Stopped):
            run_session(["sh", "-c", f"sleep 300 & echo $! > {pid_file}; wait"], timeout=120)
    finally:
        stopper.join()
        signal.signal(signal.SIGALRM, old)
    _wait_gone(int(pid_file.read_text()))



SPINNING = """
import threading
def spin():
    while True:
        pass
for _ in range(3):
    threading.Thread(target=spin, daemon=True).start()
print("spinning", flush=True)
spin()
"""


def test_stop_returns_once_every_thread_of_the_process_is_stopped():
    """``procs.stop``: a process whose four threads spin is stopped, every thread, when it returns
    (``kill`` alone returns with SIGSTOP queued: a running thread goes on a while)."""
    import subprocess

    from procs import stop

    proc = subprocess.Popen([sys.executable, "-c", SPINNING], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "spinning\n"
        stop([proc.pid])
        states = [(task / "stat").read_text().rsplit(")", 1)[1].split()[0]
                  for task in Path(f"/proc/{proc.pid}/task").iterdir()]
        assert len(states) == 4 and set(states) == {"T"}, states
    finally:
        proc.kill()
        proc.wait()
