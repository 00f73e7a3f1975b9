"""Launch N local ranks as real processes (tests, benchmarks, demos).

Children come from a forkserver that has already imported torch, so a 4-rank job
starts in tens of milliseconds instead of seconds per rank.  Each child takes its
caller's environment as of ``Job()`` (the forkserver's is frozen when it starts: a
variable set or removed since, a test's ``monkeypatch.setenv``, would never reach the
ranks, or would reach every later job's), joins a process group and calls
``fn(rank, world_size, *args)``; its return value travels back through a queue.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import random
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

_CTX: Any = None


def _context():
    global _CTX
    if _CTX is None:
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["torch", "torch.distributed", "commscope.events"])
        _CTX = ctx
    return _CTX


def warm_up() -> None:
    """Start the forkserver and multiprocessing's resource tracker now.

    Both are spawned with the current stderr's file descriptor; inside a Textual app
    stderr is replaced by an object without a real one and the spawn fails, so an app
    that launches ranks calls this before it starts.
    """
    from multiprocessing import forkserver, resource_tracker

    _context()
    resource_tracker.ensure_running()
    forkserver.ensure_running()


def shared_flags(n: int) -> Any:
    """``n`` flags (bytes, 0) the ranks of a ``Job`` share (pass them in ``args``): each
    rank sets its own, and a rank that died never wedges the others (a ``Barrier`` whose
    sleeper died blocks its waker for good)."""
    return _context().RawArray("b", n)


#: Where ``free_port`` looks first: below the system's ephemeral ports, from here
LOW_PORT = 12_000


def _ephemeral_low() -> int:
    """The lowest port the system hands out to a bind of port 0 or an outgoing connection
    (Linux: /proc/sys/net/ipv4/ip_local_port_range; its default elsewhere)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def free_port() -> int:
    """A port free now on 127.0.0.1, for a server that binds it a moment later (a job's
    TCPStore, a Redis server), taken below the system's ephemeral ports: a port the
    system handed out is its to hand out again, to a gloo pair's listener or an outgoing
    connection, before the server binds it.  Two failures of a loaded test run fit that:
    a job's rank 1 waited on a TCPStore at an ephemeral port that never answered and closed
    60 s later, to the second, as the other test, whose 5-rank job hung in its init at the
    same moment, gave up.  The system's choice where no port below its range is free."""
    low = _ephemeral_low()
    if low - LOW_PORT >= 1024:
        pick = random.Random(os.urandom(8))
        for _ in range(64):
            port = pick.randrange(LOW_PORT, low)
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclasses.dataclass
class RankResult:
    rank: int
    exitcode: int | None = None
    value: Any = None
    error: str | None = None  # traceback text when fn raised
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None and not self.timed_out and self.exitcode == 0


class RanksFailed(AssertionError):
    pass


def _child(fn, rank, world_size, args, port, backend, env, queue, init, pg_timeout):
    for name in os.environ.keys() - env.keys():  # (the forkserver's, removed from the caller's since)
        del os.environ[name]
    os.environ.update(env)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size))
    import torch.distributed as dist

    status, value = "ok", None
    try:
        if init:
            dist.init_process_group(backend, rank=rank, world_size=world_size,
                                    timeout=timedelta(seconds=pg_timeout))
        value = fn(rank, world_size, *args)
    except BaseException as exc:
        status, value = "error", traceback.format_exc()
        if "commscope.record.recorder" in sys.modules:  # the rank dies of it, as if uncaught
            sys.modules["commscope.record.recorder"].note_uncaught(exc)
    try:
        queue.put((rank, status, value))
    except Exception:
        queue.put((rank, "error", "result could not be sent back:\n" + traceback.format_exc()))
    if init and status == "ok":
        try:
            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:
            pass
    queue.close()
    queue.join_thread()
    # Skip interpreter teardown: a rank whose peers hang or died must not block here.
    os._exit(0 if status == "ok" else 1)


class Job:
    """N rank processes running one function; killable as a whole."""

    def __init__(self, fn: Callable, world_size: int, *, args: tuple = (), backend: str = "gloo",
                 env: dict[str, str] | None = None, init: bool = True, pg_timeout: float = 120.0):
        """``env``: set in the ranks over this process's environment, which they take whole."""
        self.world_size = world_size
        self.port = free_port()
        ctx = _context()
        self._queue = ctx.Queue()
        self.procs = [
            ctx.Process(target=_child, name=f"commscope-rank{r}",
                        args=(fn, r, world_size, args, self.port, backend, {**os.environ, **(env or {})},
                              self._queue, init, pg_timeout), daemon=True)
            for r in range(world_size)
        ]
        self.results = {r: RankResult(r) for r in range(world_size)}

    def start(self) -> Job:
        for p in self.procs:
            p.start()
        return self

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p.pid is not None]

    def alive(self) -> list[int]:
        return [r for r, p in enumerate(self.procs) if p.is_alive()]

    def _drain(self) -> None:
        while True:
            try:
                rank, status, value = self._queue.get_nowait()
            except Exception:
                return
            res = self.results[rank]
            if status == "ok":
                res.value = value
            else:
                res.error = value

    def join(self, timeout: float | None = None) -> dict[int, RankResult]:
        """Wait for all ranks (collecting results); kill whatever is left at the timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while any(p.is_alive() for p in self.procs):
            self._drain()
            if deadline is not None and time.monotonic() > deadline:
                for r in self.alive():
                    self.results[r].timed_out = True
                self.kill()
                break
            time.sleep(0.02)
        time.sleep(0.01)
        self._drain()
        for r, p in enumerate(self.procs):
            p.join(5)
            self.results[r].exitcode = p.exitcode
        self._drain()
        self.forward_spools()
        return self.results

    def forward_spools(self) -> int:
        """Send what ranks that died left in their spools to the store (as a launcher does
        when its command ends), with the exit status each died of."""
        from commscope.store import spool

        status = {p.pid: p.exitcode for p in self.procs if p.pid is not None}
        try:
            return spool.forward_orphans(exit_status=status.get)
        except Exception:
            return 0

    def kill(self, sig: int = signal.SIGKILL) -> None:
        for p in self.procs:
            if p.is_alive() and p.pid:
                try:
                    os.kill(p.pid, sig)
                except ProcessLookupError:
                    pass
        for p in self.procs:
            p.join(5)


def run_ranks(fn: Callable, world_size: int, *, args: tuple = (), backend: str = "gloo",
              env: dict[str, str] | None = None, timeout: float = 60.0, init: bool = True,
              check: bool = True) -> list[RankResult]:
    """Run ``fn(rank, world_size, *args)`` on every rank; results in rank order.

    With ``check`` (the default) any rank that raised, timed out or exited badly makes
    this raise RanksFailed carrying every rank's traceback.
    """
    job = Job(fn, world_size, args=args, backend=backend, env=env, init=init,
              pg_timeout=max(timeout, 30.0)).start()
    results = [job.join(timeout)[r] for r in range(world_size)]
    if check and not all(r.ok for r in results):
        parts = []
        for r in results:
            if r.ok:
                continue
            why = "timed out" if r.timed_out else f"exit code {r.exitcode}"
            parts.append(f"--- rank {r.rank}: {why}\n{r.error or ''}")
        raise RanksFailed("ranks failed:\n" + "\n".join(parts))
    return results
