"""Run any command with commscope recording every process that joins a process group.

    commscope run -- torchrun --nproc-per-node 4 train.py
    commscope run --store redis://host:6379/0 -- python train.py

No code change: a bootstrap on PYTHONPATH (a sitecustomize that chains to any existing
one) instruments each Python process when it calls init_process_group.  Processes that
never do are not touched.  Watch the job live with the printed `commscope attach` line.

Ctrl-C (or SIGTERM) is passed to the command.  Ranks blocked inside a collective cannot
act on it (they are in C++), and torchrun waits 30 s before it kills them; so ranks still
running 5 s later get SIGTERM from commscope (a second Ctrl-C: at once).  What they
recorded, the stacks captured while they hung included, stays in the trace.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from commscope.commands import options
from commscope.errors import UsageError
from commscope.store import (
    ENV_STORE,
    StoreError,
    backend_for,
    default_store,
    keyframes,
    redact_store,
    refuse_url_like,
    retention,
    spool,
)
from commscope.store.base import is_job_name
from commscope.store.directory import ENV_SHARE
from commscope.store.segments import segment_bytes_from_env
from commscope.units import size

if TYPE_CHECKING:
    import psutil

BOOTSTRAP_DIR = Path(__file__).resolve().parent.parent / "record" / "bootstrap"
#: Seconds a stop request (Ctrl-C, SIGTERM) is left to the command before its ranks get SIGTERM.
STOP_GRACE_S = 5.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", help="trace store: a directory or redis:// URL "
                                   "(default $COMMSCOPE_STORE, then ./commscope-trace)")
    p.add_argument("--hang-after", type=options.seconds, metavar="SECONDS",
                   help="capture stacks of ops in flight longer than this (default 30)")
    p.add_argument("--job", help="job id shared by all ranks (default: agreed automatically per job)")
    p.add_argument("--sample-interval", type=options.seconds, metavar="SECONDS",
                   help="resource sample period (default 1; at least 0.05: shorter is taken as 0.05)")
    p.add_argument("--no-flight-recorder", action="store_true",
                   help="never enable PyTorch's Flight Recorder (only the Python recorder uses it, for "
                        "collectives issued from C++ such as DDP's)")
    p.add_argument("--share-with-group", action="store_true",
                   help="a directory store's trace is readable by your group (default: by you alone; "
                        "sets $COMMSCOPE_SHARE_WITH_GROUP for the ranks)")
    p.add_argument("--retain", metavar="LIMIT",
                   help="the history a directory store keeps of each rank: a size (2GiB, 500MiB), an age (7d, "
                        "90min: segments that ended that long before the newest), both (2GiB,7d) or none; older "
                        "segments are "
                        "summarized (counts, bytes, latency per minute: commscope report) and deleted; the "
                        "segment being written is kept besides (64 MiB at most, a quarter of a size limit "
                        f"past 4 MiB) (default {retention.DEFAULT.describe()}; sets $COMMSCOPE_RETAIN)")
    p.add_argument("--keyframes", metavar="SECONDS",
                   help="how often a directory store's streams say what each rank is in (a child beside the "
                        "ranks follows their segments): a window (--since, a console's restart at the tail) "
                        "starts within that much of its start, not at its segment's start (a 64 MiB segment "
                        f"holds ~1.5 h of a rank); off for none (default {keyframes.EVERY_S:g}; sets "
                        f"${keyframes.ENV_EVERY})")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command to run, after --")


#: The directory store's settings ``run`` passes to its ranks as they are written, once read:
#: (flag, what reads it, the variable the ranks read)
_STORE_SETTINGS: tuple[tuple[str, Callable[[str], object], str], ...] = (
    ("retain", retention.parse, retention.ENV_RETAIN),
    ("keyframes", keyframes.parse_every, keyframes.ENV_EVERY),
)


def build_env(args: argparse.Namespace, base: dict[str, str] | None = None, native: bool = True) -> dict[str, str]:
    """The command's environment.  ``native``: the native recorder is ready, so Flight Recorder
    (the Python recorder's only view of C++-issued collectives) stays off."""
    env = dict(os.environ if base is None else base)
    store = default_store(args.store)
    row = backend_for(store)
    env[ENV_STORE], apart = row.credentials_apart(row.absolute(store))  # (the command may change directory)
    env.update(apart)
    env["COMMSCOPE_AUTO"] = "1"
    env[spool.ENV_LAUNCH] = secrets.token_hex(8)  # (its ranks' spools say it: ``spool.stranded``)
    if args.hang_after is not None:
        env["COMMSCOPE_HANG_AFTER"] = str(args.hang_after)
    if args.job:
        env["COMMSCOPE_JOB"] = args.job
    if args.sample_interval is not None:
        env["COMMSCOPE_SAMPLE_INTERVAL"] = str(args.sample_interval)
    if getattr(args, "share_with_group", False):
        env[ENV_SHARE] = "1"
    for flag, parse, name in _STORE_SETTINGS:
        value = getattr(args, flag, None)
        if value is not None:  # (an empty one is refused: the default applied, unsaid, helper-173)
            try:
                parse(value)
            except ValueError as exc:
                raise UsageError(f"--{flag}: {exc}") from None
            env[name] = value
        elif env.get(name, "").strip():  # (the ranks read it: one they cannot keeps all history, each rank
            try:  # saying so apart, and run said "keeping all", no reason given: helper-204)
                parse(env[name])
            except ValueError as exc:
                raise UsageError(f"${name}={env[name]!r}: {exc} (set it to what --{flag} takes, or unset it)") from None
    if args.no_flight_recorder:
        env["COMMSCOPE_FLIGHT_RECORDER"] = "0"
    elif not native:
        env.setdefault("TORCH_FR_BUFFER_SIZE", "2000")  # before any process group exists
    paths = [str(BOOTSTRAP_DIR)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def _refuse_unwritable(store: str) -> None:
    """A directory store no rank could create (a file in its place, or above it; a directory
    not ours to write) is said now, not after the job ran unrecorded ("nothing was recorded:
    no process of the command got through init_process_group")."""
    if not backend_for(store).local:
        return
    path = os.path.abspath(store)
    while not os.path.lexists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    shown = redact_store(path)
    if not os.path.isdir(path):
        what = "one rank's stream" if os.path.basename(path).startswith("rank-") else "a file"
        raise UsageError(f"cannot record to {redact_store(store)}: {shown} is {what}, not a directory")
    if not os.access(path, os.W_OK | os.X_OK):
        raise UsageError(f"cannot record to {redact_store(store)}: {shown} is not writable by you")


def _native_ready() -> bool:
    """Build the native recorder here, once, rather than in every rank at its first op."""
    from commscope.record import native

    if not native.enabled():
        return False
    try:
        return native.load(build=True) is not None
    except Exception:
        return False


def _forward_spools(store: str, pid: int, code: int) -> int:
    """As a launcher: forward the spools ranks of this store left on this host when they
    died, with the exit status of the process we started (a rank killed outright)."""
    sid = spool.store_id(store)
    try:
        return spool.forward_orphans(exit_status={pid: code}.get, stores=lambda s: store if s == sid else None,
                                     only=sid)
    except Exception as exc:  # never turn the command's own exit into ours
        print(f"commscope: could not forward the spools of dead ranks: {exc}", file=sys.stderr)
        return 0


def _stranded(store: str, launch: str) -> list[Path]:
    """The spools of this command's ranks that the store refused (``spool.stranded``)."""
    try:
        return spool.stranded(store, launch)
    except Exception:  # (a look, never the command's exit)
        return []


def main(args: argparse.Namespace) -> int:
    from commscope.errors import UsageError

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UsageError("give the command to run after --, e.g. commscope run -- torchrun --nproc-per-node 2 train.py")
    if args.job is not None and not is_job_name(args.job):
        raise UsageError(f"bad --job {args.job[:130]!r}: use 1-120 letters, digits, '_', '.', '-', not starting "
                         "with '.' (a job id names a directory or key inside the store)")
    try:  # (a URL the ranks could not open: said now, its password hidden, not after the job)
        pinned = backend_for(default_store(args.store)).pinned_job(default_store(args.store))
        refuse_url_like(args.store)
    except StoreError as exc:
        raise UsageError(str(exc)) from None
    if args.job is not None and pinned is not None and pinned != args.job:  # (the URL's won, unsaid: helper-197)
        raise UsageError(f"--job {args.job!r} and the store's ?job={pinned} name different jobs: give one")
    _refuse_unwritable(default_store(args.store))
    row, named = backend_for(default_store(args.store)), default_store(args.store)
    why = row.refusal(row.absolute(named)) if row.refusal is not None else None
    if why is not None:  # (a store the ranks could never write: the job would run unrecorded)
        raise UsageError(why)
    if shutil.which(command[0]) is None:  # before saying "recording to": nothing will be
        raise UsageError(f"command not found: {command[0]}")
    env = build_env(args, native=_native_ready())
    store = default_store(args.store)
    store = backend_for(store).absolute(store)  # (with its credentials: this process's environment has them not)
    shown = redact_store(store)
    before = _jobs(store)
    # (a server's jobs are not listed: its job is --job's where one is given; the bare URL
    # opened the newest job there, another launch's: helper-183)
    named = redact_store(backend_for(store).with_job(store, args.job)) if args.job and before is None else shown
    print(f"commscope: recording to {shown}{_kept(env) if backend_for(store).local else ''}", file=sys.stderr)
    print(f"commscope: watch it with:  commscope attach {named}", file=sys.stderr)
    _adopt_orphans()
    try:
        proc = subprocess.Popen(command, env=env)
    except FileNotFoundError:
        raise UsageError(f"command not found: {command[0]}") from None

    stop = _Stop(proc)
    old = {s: signal.signal(s, stop.request) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = stop.wait()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    n = _forward_spools(store, proc.pid, code)
    if n:
        print(f"commscope: sent what {n} rank(s) that died left in their spools to the store", file=sys.stderr)
    left = _stranded(store, env[spool.ENV_LAUNCH])
    if left:
        print(f"commscope: what {len(left)} rank(s) recorded is not in the trace: it could not be written to the "
              f"store (their warnings above say why), and waits in their spools, in {left[0].parent}", file=sys.stderr)
    if left and before is not None and _jobs(store) == before:
        print(f"commscope: done (exit code {code}); nothing of this run is in the store", file=sys.stderr)
    elif before is not None and _jobs(store) == before:
        # (one rank that died before init_process_group leaves the others waiting there, never
        # through it: "no process called it" was untrue of them, helper-182)
        print(f"commscope: done (exit code {code}); nothing was recorded: no process of the command got "
              "through init_process_group (none called it, or not all its ranks came to it)", file=sys.stderr)
    else:
        made = _made(args.job, _own(store, (_jobs(store) or set()) - (before or set()), env[spool.ENV_LAUNCH]))
        job_shown = redact_store(backend_for(store).with_job(store, made)) if made else named
        print(f"commscope: done (exit code {code}); diagnose with:  commscope check {job_shown}", file=sys.stderr)
    return code if code >= 0 else 128 - code


def _made(job: str | None, new: set[str]) -> str | None:
    """The job a run's ``check`` names, of the ``new`` jobs a directory store holds since it
    began: ``--job``'s newest attempt (torchrun's restarts record ``JOB-aN``; check reads the
    attempts before the one it opens, never after: naming ``JOB`` read attempt 0 alone,
    helper-175), else the one job it made; None where that is not known (a bare store then
    opens its newest job, which may be another launch's: helper-172)."""
    if job is not None:
        tries = [(0, j) for j in new if j == job] + [
            (int(j[len(job) + 2:]), j) for j in new if j.startswith(f"{job}-a") and j[len(job) + 2:].isdigit()]
        return max(tries)[1] if tries else None
    return next(iter(new)) if len(new) == 1 else None


def _own(store: str, new: set[str], launch: str) -> set[str]:
    """Of the ``new`` jobs of ``store``, those this launch made, as their job files say
    (``Backend.launch_of``): a concurrent launch's job, new too, was named in this one's
    ``check`` line (helper-175).  All of them where none says (a recorder from before)."""
    launch_of = backend_for(store).launch_of
    mine = {j for j in new if launch_of(store, j) == launch} if launch_of is not None else set()
    return mine or new


def _kept(env: dict[str, str]) -> str:
    """What a directory store keeps of each rank's history, as its writers will read it
    (``retention.from_env``: a value they cannot read keeps everything)."""
    text = env.get(retention.ENV_RETAIN, "").strip()
    try:
        limit = retention.parse(text) if text else retention.DEFAULT
    except ValueError:
        limit = retention.NONE
    if not limit.bounded:
        return " (keeping all of each rank's history: --retain)"
    # (``describe`` says "per rank" itself: "of each rank's history" said it twice, helper-177;
    # and the segment being written, never deleted, besides: helper-187)
    segment = retention.segment_bytes_for(segment_bytes_from_env(), limit)
    return (f" (keeping at most {limit.describe()} of history, and the segment being written, up to "
            f"{size(segment)}: --retain)")


def _adopt_orphans() -> None:
    """Become the parent of the command's processes whose parent dies (Linux's child
    subreaper): a shell launcher ended by Ctrl-C leaves its ranks to init at once, before a
    look at what ran below it can see them (helper-168); adopted, they are still below this
    process for ``_Stop`` to end."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


class _Stop:
    """Passes a stop request on to the command, and ends ranks that cannot act on it: the
    command and every process below it get SIGTERM ``STOP_GRACE_S`` after the first request,
    or at the second.  The processes below it are looked up at the first request too, so
    those left running once the command itself has exited (a shell launcher ended by Ctrl-C
    whose background ranks ignore SIGINT) still get theirs (helper-166: they ran on,
    orphaned, writing to the store)."""

    def __init__(self, proc: subprocess.Popen):
        import psutil  # noqa: F401  (here, before any signal: a second SIGTERM while the first's
        # handler imported it found it half made, and the run died, its job left running: helper-183)

        self.proc = proc
        self.asked: float | None = None
        self.terminated = False
        self.family: list = []  # (psutil.Process) below the command at the first request

    def request(self, signum: int, _frame: object) -> None:
        if self.asked is None:  # (before the signal: a launcher it ends leaves its ranks to init at once)
            self.family = self._family()
        try:
            self.proc.send_signal(signum)
        except ProcessLookupError:
            pass
        if self.asked is None:
            self.asked = time.monotonic()
            print(f"commscope: stopping the job; ranks still running in {STOP_GRACE_S:g} s get SIGTERM "
                  "(Ctrl-C again: now)", file=sys.stderr)
        else:
            self.terminate()

    def _family(self) -> list:
        """The command's processes, those below it first (psutil.Process: a pid reused since
        is never signalled)."""
        import psutil

        try:
            top = psutil.Process(self.proc.pid)
            return [*top.children(recursive=True), top]
        except psutil.Error:
            return []

    def terminate(self) -> None:
        """SIGTERM to every process below the command, then to the command: the ranks under a
        launcher, or the command itself when it is the rank (with its helper processes)."""
        self.terminated = True
        # (looked up before any is signalled; not once the command is reaped: its pid may be another's;
        # and what this process adopted, the command's orphans, beside it: helper-170)
        adopted = self._adopted()
        family = [*self._family(), *adopted] if self.proc.returncode is None else adopted
        for p in [*(p for p in self.family if p not in family), *family]:
            _end(p)

    def wait(self) -> int:
        while True:
            try:
                code = self.proc.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                self._reap()
                if self.asked is not None and not self.terminated and time.monotonic() - self.asked >= STOP_GRACE_S:
                    print("commscope: ranks still running: sending them SIGTERM", file=sys.stderr)
                    self.terminate()
                continue
            if self.asked is not None and not self.terminated:
                self._orphans()
            return code

    def _reap(self) -> None:
        """Collect the adopted orphans that exited (each a zombie of this process until then:
        a job's whole life of them, and a daemon's pid that looked alive: helper-170), never
        the command, which ``Popen.wait`` collects."""
        while True:
            try:
                got = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except (ChildProcessError, OSError):
                return
            if got is None or got.si_pid == self.proc.pid:
                return
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(got.si_pid, 0)

    def _adopted(self) -> list:
        """This process's children but the command: what ran below the command and lost its
        parent (``_adopt_orphans``)."""
        import psutil

        try:
            return [p for p in psutil.Process().children(recursive=True) if p.pid != self.proc.pid]
        except psutil.Error:
            return []

    def _orphans(self) -> None:
        """The command exited on a stop request: what ran below it and still runs gets its
        SIGTERM when the grace period ends, as it would have under the command, and is waited
        for (a grace period more at most), so that its spool is dead and forwarded next."""
        import psutil

        left = [p for p in self.family if p.pid != self.proc.pid]
        left += [p for p in self._adopted() if p not in left]
        try:
            _, alive = psutil.wait_procs(left, timeout=max(0.0, STOP_GRACE_S - (time.monotonic() - self.asked)))
        except psutil.Error:
            return
        if not alive:
            return
        print(f"commscope: {len(alive)} process(es) of the job still running after it exited: sending them "
              "SIGTERM", file=sys.stderr)
        for p in alive:
            _end(p)
        with contextlib.suppress(psutil.Error):
            psutil.wait_procs(alive, timeout=STOP_GRACE_S)


def _end(p: psutil.Process) -> None:
    """SIGTERM to a process of the job (a ``psutil.Process``), then SIGCONT: a stopped one
    (SIGSTOP, a debugger) holds the SIGTERM until continued, and was left running after run
    exited (helper-196)."""
    import psutil

    for act in (p.terminate, p.resume):
        with contextlib.suppress(psutil.Error):
            act()


def _jobs(store: str) -> set[str] | None:
    """The jobs the store holds (None: a server, not asked: a store that is down would hold
    the command's start for its connect timeout)."""
    row = backend_for(store)
    return row.jobs(store) if row.jobs is not None and row.local else None
