"""A ``Job``'s ranks take their caller's environment as of ``Job()``: they come from a
forkserver started earlier (by whichever test launched ranks first), whose environment
was frozen then, so a ``COMMSCOPE_*`` variable a test set with ``monkeypatch.setenv``
never reached its ranks, and one set while the forkserver started reached every later
job's.  A test that thinks it set something and did not cannot fail."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from procs import run_session

from commscope.launch import run_ranks


def environ_of(rank: int, world_size: int, *names: str) -> dict[str, str | None]:
    """The rank's values of ``names`` (module level: pickled by reference)."""
    return {name: os.environ.get(name) for name in names}


def test_a_variable_set_after_the_forkserver_started_reaches_the_ranks(monkeypatch):
    run_ranks(environ_of, 1, init=False, timeout=60)  # (the forkserver runs from here on, if not before)
    monkeypatch.setenv("COMMSCOPE_PROBE_SET", "set after")
    monkeypatch.setenv("COMMSCOPE_PROBE_GIVEN", "the caller's")
    results = run_ranks(environ_of, 2, args=("COMMSCOPE_PROBE_SET", "COMMSCOPE_PROBE_GIVEN", "RANK"),
                        env={"COMMSCOPE_PROBE_GIVEN": "env="}, init=False, timeout=60)
    assert [r.value for r in results] == [
        {"COMMSCOPE_PROBE_SET": "set after", "COMMSCOPE_PROBE_GIVEN": "env=", "RANK": str(r)} for r in range(2)]


#: A fresh process: the forkserver starts while the variable is set, which is then removed.
LEAK = """
import os, sys
sys.path.insert(0, sys.argv[1])
from test_launch_env import environ_of
from commscope.launch import run_ranks
os.environ["COMMSCOPE_PROBE_GONE"] = "set when the forkserver started"
first = run_ranks(environ_of, 1, args=("COMMSCOPE_PROBE_GONE",), init=False, timeout=60)[0].value
del os.environ["COMMSCOPE_PROBE_GONE"]
then = run_ranks(environ_of, 1, args=("COMMSCOPE_PROBE_GONE",), init=False, timeout=60)[0].value
print(first["COMMSCOPE_PROBE_GONE"], "|", then["COMMSCOPE_PROBE_GONE"])
"""


def test_a_variable_removed_after_the_forkserver_started_is_gone_from_the_ranks(tmp_path):
    proc = run_session([sys.executable, "-c", LEAK, str(Path(__file__).parent)], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "set when the forkserver started | None", proc.stdout


def test_a_free_port_is_below_the_ports_the_system_hands_out():
    """A job's TCPStore port (``free_port``) is chosen below the system's ephemeral ports,
    which a gloo pair's listener or an outgoing connection may take between the choice and
    the bind; and it is free."""
    import socket

    from commscope.launch import LOW_PORT, _ephemeral_low, free_port

    low = _ephemeral_low()
    ports = [free_port() for _ in range(20)]
    assert all(LOW_PORT <= p < low for p in ports), (ports, low)
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[-1]))
