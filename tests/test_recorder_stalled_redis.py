"""A Redis that accepts connections but never answers (a redis-server stopped with SIGSTOP)
holds neither a new incarnation's ``init_process_group`` nor ``uninstrument()``.

The recorder thread's tick holds the tick lock while it writes.  Before, ``attach`` (a new
incarnation, inside ``init_process_group``) waited for that lock, so for the write's reply
timeout, then wrote the last incarnation's rest with the URL's timeout again; the last write
at ``uninstrument()`` also waited for a whole reply timeout, past ``Outbox.FINAL_WRITE_S``.
The URL here asks for a 600 s reply timeout, so such a wait cannot end while the test
waits: the assertions are about what happened while Redis stayed stopped, not about how
many seconds it took.  Then Redis answers again, and nothing is lost: what could not be
written waited in the spools, and a reader on this host forwards it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest
from redis_fixture import require_redis_server

from commscope.bench.redis_server import RedisServer
from commscope.cli import main as cli
from commscope.events import incarnation_ids
from commscope.launch import free_port
from commscope.store import open_reader

pytestmark = pytest.mark.timeout(240)

#: ops of each incarnation (different counts: a mix-up would show)
OPS = (5, 7)

RANK = r"""
import os, sys, time
from pathlib import Path
import torch, torch.distributed as dist
import commscope

url, flags = sys.argv[1], Path(sys.argv[2])
ports = sys.argv[3].split(",")
rec = commscope.instrument(url, sample_interval=0.1, hang_after=60.0, flight_recorder=False)
x = torch.ones(4)
os.environ["MASTER_ADDR"] = "127.0.0.1"
os.environ["MASTER_PORT"] = ports[0]
dist.init_process_group("gloo", rank=0, world_size=1)
for _ in range(OPS[0]):
    dist.all_reduce(x)
dist.destroy_process_group()
(flags / "first").touch()
while not (flags / "stopped").exists():
    time.sleep(0.01)
# Until the recorder thread is inside a write to the stopped server (its ticks stop: it
# holds the tick lock), at most 20 s; past that the test goes on (its attach then waits for
# no tick, and its own last write of the first incarnation is what is tested).
until = time.monotonic() + 20
while time.monotonic() < until:
    ticks = rec._ticks
    time.sleep(0.5)
    if rec._ticks == ticks and rec._tick_lock.locked():
        break
(flags / "stuck").write_text(str(rec._ticks == ticks))
os.environ["MASTER_PORT"] = ports[1]
dist.init_process_group("gloo", rank=0, world_size=1)
(flags / "attached").touch()
for _ in range(OPS[1]):
    dist.all_reduce(x)
dist.destroy_process_group()
commscope.uninstrument()
(flags / "uninstrumented").write_text(str(not rec._thread.is_alive()))
""".replace("OPS[0]", str(OPS[0])).replace("OPS[1]", str(OPS[1]))


def _wait_for(path, proc, timeout: float) -> bool:
    """``path`` exists (True), or the rank ended or ``timeout`` passed first (False)."""
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        if path.exists():
            return True
        if proc.poll() is not None:
            return path.exists()
        time.sleep(0.02)
    return False


def test_a_stopped_redis_holds_neither_a_new_incarnation_nor_uninstrument(tmp_path, capsys):
    server = RedisServer(binary=require_redis_server()).start()
    url = f"{server.url}?job=stalled&timeout=600"  # (a reply waited for is one that never comes while stopped)
    flags = tmp_path / "flags"
    flags.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", RANK, url, str(flags), f"{free_port()},{free_port()}"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    stopped = False
    try:
        assert _wait_for(flags / "first", proc, 120), "the rank did not get through its first incarnation"
        os.kill(server.proc.pid, signal.SIGSTOP)
        stopped = True
        (flags / "stopped").touch()
        # Generous: the rank needs ~3 s (2 s to open the store at attach, FINAL_WRITE_S at the end);
        # a wait on the stopped Redis lasts 600 s.
        attached = _wait_for(flags / "attached", proc, 90)
        ended = attached and _wait_for(flags / "uninstrumented", proc, 90)
        assert server.proc.poll() is None  # (still there, still stopped: nothing above had an answer)
        assert attached, "init_process_group of the new incarnation waited for the stopped Redis"
        assert ended, "uninstrument() waited for the stopped Redis"
        assert (flags / "stuck").read_text() == "True"  # (attach came while the thread's write waited)
        # the last tick ran to its end (not cut by FINAL_HOLD_S): what it could not write is
        # in the spool, with the exit, for a forwarder
        assert (flags / "uninstrumented").read_text() == "True"
    finally:
        if stopped:
            os.kill(server.proc.pid, signal.SIGCONT)
        try:
            out = proc.communicate(timeout=120)[0]
        except subprocess.TimeoutExpired:
            proc.kill()
            out = proc.communicate()[0]
        if proc.returncode != 0 or not (flags / "uninstrumented").exists():
            print(out)
    try:
        assert proc.returncode == 0, out
        # each loss said on stderr with its true cause: no answer in the time the write had
        assert out.count("could not be written at exit") == 2, out
        assert "no answer within" in out and "for a forwarder" in out, out
        # Redis answers again: a reader on this host forwards both spools, and nothing is missing
        capsys.readouterr()
        assert cli(["check", url, "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["findings"] == [] and report["ops"] == sum(OPS), report
        events = open_reader(url).read_all()
        begun = Counter(inc for e in events if e["type"] == "op" and e["phase"] == "begin"
                        for inc in range(len(OPS)) if e["id"] in incarnation_ids(inc))
        assert begun == dict(enumerate(OPS))
        assert [e["reason"] for e in events if e["type"] == "exit"] == ["destroy_process_group"] * 2
        # incarnation 1 never opened the store: its meta came from its spool
        assert sorted(e.get("inc", 0) for e in events if e["type"] == "meta") == [0, 1]
        assert not [e for e in events if e["type"] == "dropped"]
    finally:
        server.close()
