"""Run a demo scenario as a real multi-process job: ``DemoJob`` and ``run_headless``.

    job = DemoJob("missing-rank", ranks=4).start()   # non-blocking; job.store is the live trace
    ...                                               # console: open_source(job.store, wait=True)
    job.stop()                                        # SIGTERM, then SIGKILL; no process left

    code = run_headless("straggler", json=False)      # run, diagnose, print `commscope check`

Each ``DemoJob`` records into a fresh directory (``.store``), so a new run never mixes
with an old one, and a run is not restartable: make a new ``DemoJob`` to restart.

Worker processes come from ``commscope.launch`` (a forkserver with torch preloaded).  Each
one joins the process group, switches ``commscope.instrument`` on and runs the scenario's
``worker(rank, world_size, ctx)``.  Nothing outlives the demo:

* ``stop()`` sends SIGTERM to every worker and its child processes, then SIGKILL to what is
  left after ``timeout``; it is idempotent, thread-safe, and runs at interpreter exit for
  every job not stopped yet.
* every worker has a watchdog: at the demo's deadline (``time_limit`` after ``start()``)
  all ranks leave together (exit code ``EXIT_TIME_LIMIT``), so a hung scenario ends on its
  own.  Each ends its recording first and leaves once all have (or ``LEAVE_WAIT`` later,
  when one is gone already, which never began to end; one whose last tick runs long on a
  loaded host is waited for): a rank leaving first would fail the waiting ops of the others
  in their traces, and a hang would read as an ``op_failed``.  A worker whose launching
  process died exits at once (``EXIT_ORPHANED``; on Linux the kernel also kills it when
  the forkserver goes); an ``alarm()`` backstop kills a worker that could not run Python
  at all ``leave_wait_ending()`` + 10 s after the deadline.

Worker stdout/stderr go to ``<store>/logs/rank-N.log`` (the console owns the terminal).
"""

from __future__ import annotations

import atexit
import math
import os
import secrets
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from commscope.private import make_dirs
from commscope.scenarios.base import MAX_RANKS, DemoContext, Scenario

#: Exit code of a worker ended by the demo's time limit (the normal end of a hanging scenario).
EXIT_TIME_LIMIT = 124
#: Exit code of a worker whose launching process disappeared.
EXIT_ORPHANED = 125
#: Default time limit of hanging scenarios: the hang stays visible this long after start.
HANG_TIME_LIMIT = 40.0
#: Default time limit of the others (they end on their own well before).
RUN_TIME_LIMIT = 180.0
#: At the deadline, how long a rank that has ended its recording waits for the others to
#: begin to end theirs before it leaves (the whole wait only when a rank is gone already;
#: one that began is waited for until its last tick ends: ``leave_wait_ending``).
LEAVE_WAIT = 5.0
#: A rank's flag in ``ended``: its last tick runs; its recording has ended
ENDING, ENDED = 1, 2


def get_scenario(scenario: str | Scenario) -> Scenario:
    """The Scenario for a name (ValueError listing the names when unknown)."""
    if isinstance(scenario, Scenario):
        return scenario
    from commscope.scenarios import SCENARIOS

    try:
        return SCENARIOS[scenario]
    except KeyError:
        raise ValueError(f"unknown scenario {scenario!r}; choose one of: {', '.join(SCENARIOS)}") from None


def cuda_devices() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        return 0


# ---------------------------------------------------------------------- rank side
def _native_ready() -> bool:
    """Whether the ranks will record natively (built here once, not in every rank)."""
    from commscope.record import native

    try:
        return native.enabled() and native.load(build=True) is not None
    except Exception:
        return False


def _rank_main(rank: int, world_size: int, worker: Any, ctx: DemoContext, pg_timeout: float,
               ended: Any) -> Any:
    """Runs in each worker process (launched by commscope.launch.Job with init=False);
    ``ended``: a flag a rank, shared, each set once its recording ended at the deadline."""
    from datetime import timedelta

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launching process decides when we stop
    _redirect_output(ctx, rank)
    _start_watchdog(ctx, rank, ended)
    import torch
    import torch.distributed as dist

    import commscope

    if ctx.backend == "nccl":
        torch.cuda.set_device(rank)
    # N ranks share this machine's cores: one intra-op thread each avoids oversubscription.
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    dist.init_process_group(ctx.backend, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=pg_timeout))
    commscope.instrument(ctx.store, hang_after=ctx.hang_after, sample_interval=ctx.sample_interval)
    try:
        result = worker(rank, world_size, ctx)
        print(f"[rank {rank}] scenario {ctx.scenario} completed", flush=True)
        return result
    except Exception:
        _stay_if_time_is_up()
        _uncaught(*sys.exc_info())
        raise
    finally:
        _stay_if_time_is_up()
        commscope.uninstrument()  # writes the `exit` event (with any unwaited async work)
        try:
            dist.destroy_process_group()
        except Exception:
            pass
        sys.stdout.flush()
        sys.stderr.flush()


def _uncaught(exc_type: Any, exc: Any, tb: Any) -> None:
    """Report a worker's exception as the interpreter reports an uncaught one (``sys.last_*``,
    ``sys.excepthook``): the launcher catches it, but the trace should say the rank crashed."""
    sys.last_type, sys.last_value, sys.last_traceback = exc_type, exc, tb
    if sys.version_info >= (3, 12):
        sys.last_exc = exc
    try:
        sys.excepthook(exc_type, exc, tb)
    except Exception:
        pass


def _redirect_output(ctx: DemoContext, rank: int) -> None:
    if not ctx.log_dir:
        return
    try:
        fd = os.open(os.path.join(ctx.log_dir, f"rank-{rank}.log"),  # (the owner's alone, as the trace beside it)
                     os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    except OSError:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)  # C++ output (Gloo, NCCL) too
    os.dup2(fd, 2)
    os.close(fd)


def process_started(pid: int) -> float:
    """When process ``pid`` started, as a value no clock step moves: on Linux its start in
    clock ticks since boot (``/proc/<pid>/stat``), elsewhere psutil's ``create_time``.  That
    one adds the boot time, which Linux derives from the wall clock at each read: when the
    clock was stepped in a long CI run it moved by a second, every demo worker took its
    live launcher for another process under a reused pid, and left as orphans (exit 125,
    both ranks at once)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return float(f.read().rpartition(b")")[2].split()[19])
    except (OSError, IndexError, ValueError):
        import psutil

        return psutil.Process(pid).create_time()


def _owner_alive(ctx: DemoContext) -> bool:
    if not ctx.owner_pid:
        return True
    try:
        import psutil

        return (process_started(ctx.owner_pid) == ctx.owner_started
                and psutil.Process(ctx.owner_pid).status() != psutil.STATUS_ZOMBIE)
    except Exception:
        return False


#: Set when the watchdog begins to leave at the deadline.
_time_is_up = threading.Event()


def _stay_if_time_is_up() -> None:
    """Once the watchdog is leaving, the rank's main thread stays (its worker returned, or
    its op failed because the other ranks are leaving too): the watchdog's exit
    (``EXIT_TIME_LIMIT``) is the rank's, and no teardown of the process group comes before
    the other ranks ended their recordings."""
    while _time_is_up.is_set():
        time.sleep(60.0)


def _leave_at_deadline(rank: int, ended: Any) -> None:
    """The time limit: end the recording (its ``exit`` written), wait until every rank has
    ended its own (``ended``, its flags: ``ENDING`` while a rank's last tick runs, then
    ``ENDED``), then leave.  A rank that never began to end within ``LEAVE_WAIT`` is gone
    (it never sets its flag); one ending is waited for as long as its last tick may take
    (``leave_wait_ending``): a rank that left first would fail the other's waiting op while
    it is still recorded, and a hang would read as an ``op_failed``.  Ops that fail after
    every rank ended (a rank that left without waiting) are not recorded, so the trace
    keeps the hang it showed."""
    _time_is_up.set()
    print(f"commscope demo: time limit reached, rank exiting (code {EXIT_TIME_LIMIT})", flush=True)
    from commscope.record.recorder import end_before_exit

    began = time.monotonic()
    try:
        ended[rank] = ENDING
    except Exception:
        pass
    end_before_exit(EXIT_TIME_LIMIT)
    try:
        ended[rank] = ENDED
        while True:
            flags = ended[:]
            waited = time.monotonic() - began
            if all(f == ENDED for f in flags) or waited >= leave_wait_ending() or (
                    waited >= LEAVE_WAIT and ENDING not in flags):
                break
            time.sleep(0.01)
    except Exception:  # (the leaving goes on: this wait is the others' good, not this rank's)
        pass
    os._exit(EXIT_TIME_LIMIT)


def leave_wait_ending() -> float:
    """How long, from the deadline, a rank waits for one whose last tick runs: as long as
    ``end_before_exit`` may hold it (``Recorder.FINAL_HOLD_S``, a loaded host's last tick),
    and a second more."""
    from commscope.record.recorder import Recorder

    return Recorder.FINAL_HOLD_S + 1.0


def _start_watchdog(ctx: DemoContext, rank: int, ended: Any) -> None:
    if sys.platform.startswith("linux"):
        try:  # the kernel kills us when our parent (the forkserver, which dies with the owner) dies
            import ctypes

            ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except Exception:
            pass
    if ctx.deadline:
        # Backstop that needs no Python: SIGALRM's default action terminates the process.
        signal.alarm(max(1, math.ceil(ctx.deadline - time.time() + leave_wait_ending()) + 10))

    def watch() -> None:
        while True:
            now = time.time()
            if ctx.deadline and now >= ctx.deadline:
                _leave_at_deadline(rank, ended)
            if not _owner_alive(ctx):
                os._exit(EXIT_ORPHANED)
            time.sleep(min(0.5, ctx.deadline - now) if ctx.deadline else 0.5)

    threading.Thread(target=watch, name="commscope-demo-watchdog", daemon=True).start()


# ---------------------------------------------------------------------- DemoJob
_LIVE: set = set()  # started and not stopped: stopped at interpreter exit
_ATEXIT = False


def _stop_all() -> None:
    for job in list(_LIVE):
        try:
            job.stop(timeout=2.0)
        except Exception:
            pass


class DemoJob:
    """N worker processes running one scenario with instrumentation on, recording to ``store``.

    ``store``: None records into a fresh temporary directory; a directory path gets a fresh
    ``<store>/<scenario>-<timestamp>-<id>/`` subdirectory per run; a ``redis://`` URL is
    used as is (the run is told apart by its job id, ``job_id``).  ``.store`` is the path to
    open (``open_source(job.store, wait=True)``).  ``hang_after`` and ``sample_interval``
    go to ``commscope.instrument`` on every rank.

    Knobs beyond the console's: ``pace`` scales the scenario's deliberate pauses (1.0 is
    watchable, tests use ~0), ``steps`` overrides its iteration count, ``time_limit`` is
    how long after ``start()`` every worker is gone at the latest (default 40 s for
    hanging scenarios, 180 s otherwise), ``seed`` varies the random sizes, ``logs=False``
    leaves worker output on this terminal.  ``discard()`` removes what the job made in the
    temporary directory (``temporary``: the trace when no ``store`` was given, the logs).
    """

    def __init__(self, scenario: str | Scenario, *, ranks: int | None = None, backend: str = "gloo",
                 store: str | None = None, hang_after: float = 3.0, sample_interval: float = 0.2,
                 pace: float = 1.0, steps: int | None = None, time_limit: float | None = None,
                 seed: int = 0, logs: bool = True):
        self.scenario = get_scenario(scenario)
        sc = self.scenario
        self.ranks = sc.default_ranks if ranks is None else int(ranks)
        if self.ranks < sc.min_ranks:
            raise ValueError(f"scenario {sc.name} needs at least {sc.min_ranks} ranks, got {self.ranks}")
        if self.ranks > MAX_RANKS:
            raise ValueError(f"a demo runs at most {MAX_RANKS} ranks on this machine (a process each), "
                             f"not {self.ranks}")
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"unknown backend {backend!r}; use gloo or nccl")
        if backend == "nccl":
            found = cuda_devices()
            if found < self.ranks:
                raise ValueError(f"nccl backend needs {self.ranks} GPUs, found {found}; use --backend gloo")
        if hang_after <= 0 or sample_interval <= 0:
            raise ValueError("hang_after and sample_interval must be > 0")
        self.backend = backend
        self.hang_after = float(hang_after)
        self.sample_interval = float(sample_interval)
        self.pace, self.steps, self.seed = float(pace), steps, int(seed)
        self.time_limit = float(time_limit if time_limit is not None else
                                HANG_TIME_LIMIT if sc.hangs else RUN_TIME_LIMIT)
        self.job_id = f"{sc.name}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
        from commscope.store import backend_for

        self.temporary: list[str] = []  # what discard() removes
        if store is not None and not backend_for(store).local:  # a server: the run is its job there
            self.store = store
            self.log_dir: str | None = tempfile.mkdtemp(prefix=f"commscope-demo-{sc.name}-logs-") if logs else None
            self.temporary += [self.log_dir] if self.log_dir else []
        else:
            if store is None:
                run_dir = Path(tempfile.mkdtemp(prefix=f"commscope-demo-{sc.name}-"))
                self.temporary.append(str(run_dir))
            else:
                from commscope.store.directory import PRIVATE

                run_dir = Path(store).resolve() / self.job_id
                make_dirs(run_dir, PRIVATE.dir)  # the owner's alone, as every store is (logs too)
            self.store = str(run_dir)
            self.log_dir = str(run_dir / "logs") if logs else None
        if self.log_dir:
            make_dirs(Path(self.log_dir), 0o700)  # (0700 whatever the umask: a rank's output is the program's text)
        self.started_at: float | None = None
        self.deadline: float | None = None
        self._job: Any = None
        self._ended: Any = None
        self._lock = threading.RLock()
        self._stopped = False

    def __repr__(self) -> str:
        state = "not started" if self._job is None else "finished" if self.finished else f"alive {self.alive()}"
        return f"<DemoJob {self.scenario.name} ranks={self.ranks} {self.backend} {state} store={self.store}>"

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> DemoJob:
        """Launch the workers; returns at once."""
        global _ATEXIT

        from commscope.launch import Job, shared_flags

        with self._lock:
            if self._job is not None or self._stopped:
                raise RuntimeError("a DemoJob runs once; create a new one to restart the scenario")
            now = time.time()
            self.started_at, self.deadline = now, now + self.time_limit
            ctx = DemoContext(
                scenario=self.scenario.name, backend=self.backend, store=self.store, hang_after=self.hang_after,
                sample_interval=self.sample_interval, pace=self.pace, steps=self.steps, seed=self.seed,
                deadline=self.deadline, owner_pid=os.getpid(), owner_started=process_started(os.getpid()),
                log_dir=self.log_dir)
            # Hanging scenarios keep their ops blocked until the deadline, so the trace they
            # leave still shows the hang; the others get the usual generous timeout.
            pg_timeout = self.time_limit + 60.0 if self.scenario.hangs else max(60.0, self.time_limit)
            env = {"COMMSCOPE_JOB": self.job_id, "COMMSCOPE_STORE": self.store,
                   "COMMSCOPE_HANG_AFTER": str(self.hang_after)}
            if not _native_ready():  # the Python recorder sees C++-issued collectives only this way
                env["TORCH_FR_BUFFER_SIZE"] = os.environ.get("TORCH_FR_BUFFER_SIZE", "2000")
            self._ended = shared_flags(self.ranks)  # (held while the workers start: shared memory)
            self._job = Job(_rank_main, self.ranks, args=(self.scenario.worker, ctx, pg_timeout, self._ended),
                            backend=self.backend, env=env, init=False)
            if not _ATEXIT:
                atexit.register(_stop_all)
                _ATEXIT = True
            _LIVE.add(self)
            self._job.start()
        return self

    @property
    def started(self) -> bool:
        return self._job is not None

    @property
    def pids(self) -> list[int]:
        return list(self._job.pids) if self._job is not None else []

    def alive(self) -> list[int]:
        """Ranks whose process is still running."""
        return self._job.alive() if self._job is not None else []

    @property
    def finished(self) -> bool:
        """Started, and every worker has ended (on its own or stopped)."""
        return self._job is not None and not self.alive()

    @property
    def exitcodes(self) -> list[int | None]:
        """Per rank: None while running, else the exit code (negative: killed by that signal)."""
        if self._job is None:
            return [None] * self.ranks
        return [p.exitcode for p in self._job.procs]

    def errors(self) -> dict[int, str]:
        """Tracebacks of workers that raised (collected so far)."""
        if self._job is None:
            return {}
        try:
            self._job._drain()
        except Exception:
            pass
        return {r: res.error for r, res in self._job.results.items() if res.error}

    def log_path(self, rank: int) -> str | None:
        return os.path.join(self.log_dir, f"rank-{rank}.log") if self.log_dir else None

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the workers to end on their own; True when they all did."""
        if self._job is None:
            return False
        end = None if timeout is None else time.monotonic() + timeout
        while self.alive():
            self.errors()  # drain results so no worker blocks on a full pipe
            if end is not None and time.monotonic() >= end:
                return False
            time.sleep(0.05)
        for p in self._job.procs:
            p.join(1.0)
        self.errors()
        _LIVE.discard(self)
        return True

    def discard(self) -> None:
        """Stop the workers and remove what this job made in the temporary directory (its
        trace when no store was given, its logs): a demo leaves nothing behind unless asked.
        A store the user named is never touched."""
        import shutil

        self.stop()
        for path in self.temporary:
            shutil.rmtree(path, ignore_errors=True)
        self.temporary = []

    def stop(self, timeout: float = 5.0) -> None:
        """Kill every worker (and its child processes): SIGTERM, then SIGKILL after ``timeout``.

        Idempotent and safe from any thread or at exit; returns once all are gone."""
        with self._lock:
            self._stopped = True
            _LIVE.discard(self)
            if self._job is None:
                return
            procs = [p for p in self._job.procs if p.pid is not None]
            victims = _family([p.pid for p in procs if p.is_alive()])
            if victims:
                for proc in victims:
                    _signal(proc, signal.SIGTERM)
                gone_by = time.monotonic() + max(0.0, timeout)
                victims = _wait_gone(victims, gone_by)
                for proc in victims:
                    _signal(proc, signal.SIGKILL)
                _wait_gone(victims, time.monotonic() + 5.0)
            for p in procs:
                p.join(1.0)
            self.errors()


def _family(pids: list[int]) -> list[Any]:
    """psutil.Process for each pid and all its descendants (looked up before any is killed)."""
    import psutil

    out, seen = [], set()
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            kids = proc.children(recursive=True)
        except psutil.Error:
            continue
        for p in [proc, *kids]:
            if p.pid not in seen:
                seen.add(p.pid)
                out.append(p)
    return out


def _signal(proc: Any, sig: int) -> None:
    try:
        proc.send_signal(sig)  # psutil checks the pid still names the same process
    except Exception:
        pass


def _wait_gone(procs: list[Any], until: float) -> list[Any]:
    """Wait until ``until`` (monotonic) for the processes to end; returns those still alive."""
    import psutil

    left = list(procs)
    while left:
        try:
            _, left = psutil.wait_procs(left, timeout=max(0.0, min(0.1, until - time.monotonic())))
        except Exception:
            pass
        left = [p for p in left if _running(p)]
        if time.monotonic() >= until:
            break
    return left


def _running(proc: Any) -> bool:
    import psutil

    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


# ---------------------------------------------------------------------- headless
def _satisfied(findings: list[Any], expected: tuple) -> bool:
    """Every expected (kind, culprits) is among the findings (as a multiset)."""
    pool = [(f.kind, tuple(sorted(f.culprits))) for f in findings]
    for kind, culprits in expected:
        hit = next((x for x in pool if x[0] == kind and (culprits is None or x[1] == tuple(sorted(culprits)))), None)
        if hit is None:
            return False
        pool.remove(hit)
    return True


def watch_until_diagnosed(job: DemoJob, timeout: float) -> list[Any]:
    """Follow the live store the way the console does until the hang is diagnosed: every
    expected finding is present, or some error finding has been standing for 2 s (other
    rank counts), or the workers are gone, or ``timeout``.  Returns the last findings."""
    from commscope.analysis import TraceModel, diagnose
    from commscope.analysis.source import open_source
    from commscope.store import StoreError

    expected = job.scenario.expect(job.ranks)
    model = TraceModel()
    reader = None
    findings: list[Any] = []
    first_error: float | None = None
    end = time.monotonic() + timeout
    try:
        while time.monotonic() < end:
            time.sleep(0.25)
            if reader is None:
                try:
                    reader = open_source(job.store)
                except (StoreError, OSError):
                    if not job.alive():
                        break
                    continue
            model.ingest(reader.poll())
            findings = diagnose(model, now=time.time_ns(), hang_after=job.hang_after)
            errors = [f for f in findings if f.severity == "error"]
            if errors and first_error is None:
                first_error = time.monotonic()
            if expected and _satisfied(findings, expected):
                break
            if first_error is not None and time.monotonic() - first_error > 2.0 + (5.0 if expected else 0.0):
                break
            if not job.alive():
                break
        # a little more trace past the diagnosis, so `check` (judged at the trace's last
        # timestamp) sees every wait beyond hang_after too
        time.sleep(max(0.5, 3 * job.sample_interval))
    finally:
        if reader is not None:
            try:
                reader.close()
            except Exception:
                pass
    return findings


def run_headless(name: str | Scenario, *, ranks: int | None = None, backend: str = "gloo", store: str | None = None,
                 hang_after: float = 3.0, json: bool = False, timeout: float = 120.0, console: Any = None,
                 pace: float = 1.0, steps: int | None = None, time_limit: float | None = None,
                 sample_interval: float = 0.2, check: Callable[..., int] | None = None, keep: bool = True) -> int:
    """Run a scenario to its end (a hanging one until its hang is diagnosed from the live
    store, then stop it), then print what ``commscope check STORE [--json]`` prints:
    ``check(store, json=, console=)`` does (``commands.check.check_store``; passed in, as
    nothing below ``commands`` imports it).

    Returns check's exit code: 0 no error-level finding, 1 errors, 2 bad input (unknown
    scenario, too few ranks, nccl without GPUs, empty trace); 130 when interrupted.
    The header line goes to stderr with ``json`` (stdout is the JSON object alone).
    ``keep=False``: a trace in the temporary directory is removed once checked."""
    from rich.console import Console
    from rich.markup import escape

    con = console or Console()
    # with --json, stdout carries the JSON object alone: everything else goes to stderr
    err = Console(stderr=True) if json or console is None else console
    try:
        job = DemoJob(name, ranks=ranks, backend=backend, store=store, hang_after=hang_after,
                      sample_interval=sample_interval, pace=pace, steps=steps, time_limit=time_limit)
    except ValueError as exc:
        err.print(f"[red]commscope demo:[/] {escape(str(exc))}", highlight=False)
        return 2
    sc = job.scenario
    head = (f"commscope demo {sc.name}: {job.ranks} ranks on {job.backend}"
            f"{', hangs until diagnosed' if sc.hangs else ''}; trace: {job.store}")
    (err if json else con).print(head, highlight=False, soft_wrap=True, markup=False)
    job.start()
    try:
        if sc.hangs:
            watch_until_diagnosed(job, timeout)
        elif not job.wait(timeout):
            err.print(f"[yellow]commscope demo:[/] {sc.name} still running after {timeout:g} s; stopping it",
                      highlight=False)
    except KeyboardInterrupt:
        job.stop()
        if not keep:
            job.discard()
        return 130
    finally:
        job.stop()
    if check is None:
        raise TypeError("run_headless needs check= (commscope.commands.check.check_store)")
    try:
        return check(job.store, json=json, console=con)
    finally:
        if job.temporary and not keep:
            # (a server's trace is its job there, kept: only the run's logs were temporary; helper-163)
            said = f"removed the temporary trace {job.store}" if job.store in job.temporary else \
                f"removed its temporary logs; the trace stays in {job.store}"
            job.discard()
            err.print(f"commscope demo: {said} (--keep keeps it)", highlight=False,
                      soft_wrap=True, style="grey50", markup=False)
