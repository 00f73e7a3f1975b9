"""A rank started by ``torch.multiprocessing.spawn`` (``mp.spawn``) that dies of an exception.

``mp.spawn``'s ``_wrap`` catches the exception the rank's function raised, hands its
traceback to the parent and leaves with ``sys.exit(1)``: the exception never reaches
``sys.excepthook``.  The recorder's ``sys.exit`` hook (``recorder.EXCEPTION_EXITS``) still
records it as the rank's crash, under ``commscope run`` (whose bootstrap instruments every
spawned child) and with ``commscope.instrument()`` called inside the spawned function
alike; ``sys.exit(n)`` puts its code on the ``exit`` event.

Real processes: ``mp.spawn`` of Gloo CPU ranks; rank 1 fails, the others are its victims
(their next collective fails, or the parent stops them).  Each case asserts the exact
finding, its culprit, that no victim is blamed, and what the trace says of rank 1.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from procs import run_session
from trace_helpers import of_type, read_events

pytestmark = pytest.mark.timeout(240)

SECRET = "hunter2"
MESSAGE = f"boom in rank 1 https://alice:{SECRET}@example.com/data"

JOB = textwrap.dedent("""
    import datetime, os, socket, sys
    import torch, torch.distributed as dist, torch.multiprocessing as mp

    WORLD, STORE, MODE = int(sys.argv[1]), sys.argv[2], sys.argv[3]

    def fail(rank):
        if rank != 1:
            return
        if MODE == "raise":
            raise RuntimeError(MESSAGE)
        if MODE == "exit3":
            sys.exit(3)

    def worker(rank, port):
        if STORE != "-":  # instrumented from inside the spawned function: _wrap already runs
            import commscope
            commscope.instrument(STORE)
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=WORLD,
                                timeout=datetime.timedelta(seconds=60))
        x = torch.ones(4)
        for _ in range(3):
            dist.all_reduce(x)
        fail(rank)
        dist.all_reduce(x)  # rank 1 never joins: the others fail here (or are stopped)
        dist.destroy_process_group()

    if __name__ == "__main__":
        s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
        mp.spawn(worker, args=(port,), nprocs=WORLD, join=True)
""").replace("MESSAGE", repr(MESSAGE))


def run_job(tmp_path: Path, world: int, mode: str, *, under_run: bool) -> tuple[subprocess.CompletedProcess, Path]:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    store = tmp_path / "trace"
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMMSCOPE_") or k == "COMMSCOPE_SPOOL_DIR"}
    if under_run:
        cmd = [sys.executable, "-m", "commscope", "run", "--store", str(store), "--",
               sys.executable, str(script), str(world), "-", mode]
    else:
        cmd = [sys.executable, str(script), str(world), str(store), mode]
    proc = run_session(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=200)
    return proc, store


def check_json(store: Path) -> tuple[int, dict]:
    proc = subprocess.run([sys.executable, "-m", "commscope", "check", str(store), "--json", "--hang-after", "60"],
                          capture_output=True, text=True, timeout=120)
    return proc.returncode, json.loads(proc.stdout)


def assert_rank1_crashed(store: Path, world: int, proc: subprocess.CompletedProcess) -> None:
    # what mp.spawn told the user, as torch formats it (nothing changed): the error of the
    # first failed process it finds, rank 1's RuntimeError, or, where rank 0 failed too
    # before mp.spawn looked (a loaded machine), rank 0's (mp.spawn takes the lowest index)
    said = re.findall(r"-- Process (\d+) terminated with the following error:", proc.stderr)
    assert said in (["0"], ["1"]), proc.stderr
    assert (f"RuntimeError: {MESSAGE}" if said == ["1"] else "Connection closed by peer") in proc.stderr, proc.stderr

    events = read_events(store)
    exits = of_type(events, "exit", 1)
    assert len(exits) == 1, exits
    assert exits[0]["reason"] == "exception" and exits[0]["code"] == 1, exits
    assert exits[0]["exc"].startswith("RuntimeError: boom in rank 1 "), exits  # redacted, still there
    stacks = [e for e in of_type(events, "stack", 1) if e.get("reason") == "exception"]
    assert len(stacks) == 1, stacks
    frames = [f for t in stacks[0]["threads"] for f in t["frames"]]
    assert [f[2] for f in frames if f[0].endswith("job.py")] == ["worker", "fail"], frames  # the raise's own stack
    assert SECRET not in json.dumps(events)  # the exception text passed redaction

    rc, out = check_json(store)
    assert rc == 1, out
    errors = [f for f in out["findings"] if f["severity"] == "error"]
    assert [(f["kind"], f["culprits"]) for f in errors] == [("rank_crashed", [1])], errors
    assert "RuntimeError: boom in rank 1" in errors[0]["message"], errors[0]["message"]
    assert SECRET not in json.dumps(out)
    victims = set(range(world)) - {1}
    assert all(not set(f["culprits"]) & victims for f in out["findings"]), out["findings"]
    assert not [f for f in out["findings"] if f["kind"] == "trace_incomplete"], out["findings"]


def test_spawned_rank_exception_under_commscope_run_is_its_crash(tmp_path):
    proc, store = run_job(tmp_path, 3, "raise", under_run=True)
    assert proc.returncode == 1, proc.stderr
    assert_rank1_crashed(store, 3, proc)


def test_spawned_rank_exception_with_instrument_inside_the_function_is_its_crash(tmp_path):
    proc, store = run_job(tmp_path, 2, "raise", under_run=False)
    assert proc.returncode == 1, proc.stderr
    assert_rank1_crashed(store, 2, proc)


def test_sys_exit_code_is_on_the_exit_event(tmp_path):
    """A deliberate ``sys.exit(3)`` is no crash: its code is on the ``exit``; the failed op of
    the ranks it left behind is blamed on it, and they are not blamed."""
    proc, store = run_job(tmp_path, 2, "exit3", under_run=False)
    assert proc.returncode == 1 and "process 1 terminated with exit code 3" in proc.stderr, proc.stderr
    exits = of_type(read_events(store), "exit", 1)
    assert [(e["reason"], e["code"], e.get("exc")) for e in exits] == [("atexit", 3, None)], exits
    rc, out = check_json(store)
    errors = [f for f in out["findings"] if f["severity"] == "error"]
    assert rc == 1
    assert errors and all(f["culprits"] == [1] for f in errors), errors
    assert not [f for f in errors if f["kind"] == "rank_crashed"], errors
    assert all(0 not in f["culprits"] for f in out["findings"]), out["findings"]


def test_sys_exit_under_the_recorder_raises_what_it_raises_without_it():
    """The recorder's ``sys.exit`` notes the code and calls the one it replaced: a keyword
    argument, or two, raise the built-in's TypeError as ever (helper-80: SystemExit)."""
    import sys

    from commscope.record import recorder

    recorder._install_exit_hook()
    try:
        for args, kwargs in (((), {"status": 2}), ((1, 2), {})):
            with pytest.raises(TypeError):
                sys.exit(*args, **kwargs)
        with pytest.raises(SystemExit) as got:
            sys.exit(3)
        assert got.value.code == 3
    finally:
        recorder._remove_exit_hooks()
    assert sys.exit is recorder._builtin_sys_exit
