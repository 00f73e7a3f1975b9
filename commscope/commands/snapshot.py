"""Snapshot a running torch.distributed job that was never started with commscope.

    commscope snapshot                      # every rank of the job on this host
    commscope snapshot --out /shared/snap   # several nodes: each adds its ranks
    commscope snapshot --job-pid 4242       # one of several jobs (any pid of it)

It finds the job's rank processes (RANK/WORLD_SIZE from torchrun or any launcher,
SLURM_PROCID under srun, torch.multiprocessing.spawn workers), takes each one's Python
stacks with py-spy --count times, --interval seconds apart (native frames too, where
py-spy can), samples CPU and memory, reads from the frames which collective each rank is
inside, and writes an ordinary trace store: `commscope check`, `report`, `replay` and the
console read it.  Flight Recorder buffers are read beside the stacks: the dumps the job
wrote (TORCH_FR_DUMP_TEMP_FILE), else torch's debug server when the job runs one.  The job
is only read: py-spy pauses each process for the few milliseconds of a dump.  See
docs/snapshot.md.

py-spy attaches with ptrace: run as the job's user or root; in a container, add the
SYS_PTRACE capability.  Exit 0 when the snapshot was written (its findings are printed),
2 when nothing could be read (no job, no permission, py-spy missing).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import textwrap
import time
from typing import TYPE_CHECKING

from commscope.commands import options
from commscope.errors import UsageError
from commscope.redact import redact
from commscope.store import StoreError, default_store, redact_store, refuse_url_like
from commscope.visible import visible

if TYPE_CHECKING:
    from commscope.snapshot.procs import Found, Job
    from commscope.snapshot.pyspy import DumpError
    from commscope.snapshot.take import Cycle


#: Columns ``commscope snapshot: error: `` takes before a usage error's first line (cli.py)
ERROR_PREFIX = len("commscope snapshot: error: ")


def wrap(text: str, first: int = ERROR_PREFIX, indent: str = "  ") -> str:
    """``text`` in lines of at most 80 columns, for a terminal (``first``: the columns already
    used on its first line; later lines indented); a word longer than a line (a path) stays whole."""
    out = textwrap.fill(text, 80, initial_indent="\0" * first, subsequent_indent=indent, break_long_words=False,
                        break_on_hyphens=False)
    return out[first:]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", metavar="STORE", help="trace store to write (directory or redis:// URL; "
                   "default $COMMSCOPE_STORE, then ./commscope-trace)")
    p.add_argument("--pid", type=int, nargs="+", metavar="PID", default=None,
                   help="look only at these processes and those below them (a launcher's pid will do)")
    p.add_argument("--job-pid", type=int, metavar="PID",
                   help="with several jobs on this host: the one this process belongs to, or started "
                   "(commscope run, a script)")
    p.add_argument("--count", type=int, default=3, metavar="N",
                   help="stack samples per rank (default 3): a rank in the same place at every sample "
                        "is stuck there; one sample cannot tell stuck from busy")
    p.add_argument("--interval", type=options.seconds, default=1.0, metavar="S", help="seconds between samples (default 1)")
    p.add_argument("--id", metavar="NAME", help="the snapshot's job id in the store (several nodes writing one "
                   "snapshot must agree; default snap-<the job's id>-<UTC time>, to the minute when other "
                   "hosts hold ranks of the job)")
    p.add_argument("--no-native", action="store_true", help="Python frames only (native ones cost more per dump)")
    p.add_argument("--no-flight-recorder", action="store_true", help="leave the job's Flight Recorder dumps out")


def main(args: argparse.Namespace) -> int:
    from commscope.commands import progress
    from commscope.snapshot import procs, pyspy
    from commscope.snapshot.take import Snapshotter

    try:
        refuse_url_like(args.out)
    except StoreError as exc:
        raise UsageError(str(exc)) from None
    if args.count < 1:
        raise UsageError("--count must be at least 1")
    if args.interval < 0:
        raise UsageError("--interval must be >= 0")
    if pyspy.executable() is None:
        raise UsageError(pyspy.INSTALL)
    shown = progress.wanted()
    with progress.status("looking for torch.distributed ranks", shown):
        found = procs.find(args.pid)
    job = choose(found, args.job_pid)
    if found.absent:
        print(wrap(f"note: no process has pid(s) {', '.join(map(str, found.absent))} (given with --pid)", 0),
              file=sys.stderr)
    store = default_store(args.out)
    job_id = args.id or default_id(job)
    snap = Snapshotter(job, store, job_id, count=args.count, interval=args.interval, native=not args.no_native,
                       use_flight=not args.no_flight_recorder, host=found.host)
    try:
        with _bar(shown) as update:
            cycle = snap.cycle(update)
    except StoreError as exc:
        again = " (give this snapshot its own --id)" if "refusing to mix" in str(exc) else ""
        raise UsageError(wrap(f"cannot write the snapshot: {exc}{again}")) from None
    finally:
        snap.close()
    denied = [r for r, e in cycle.failed.items() if e.kind == pyspy.PERMISSION]
    if denied and len(denied) == len(job.ranks):
        raise UsageError(wrap(permission_help(cycle.failed[denied[0]], job.ranks[0].pid)))
    summary(job, cycle, store, job_id, snap.span_s)
    if denied:
        from commscope.analysis.ranks import ranges

        pid = next(p.pid for p in job.ranks if p.rank == denied[0])
        print(wrap(f"rank(s) {ranges(sorted(denied))} not read: {permission_help(cycle.failed[denied[0]], pid)}",
                   0))
    return report(store, job, set(cycle.failed), job_id)


def choose(found: Found, job_pid: int | None) -> Job:
    """The job to snapshot: the only one, the one ``job_pid`` belongs to, or the user's pick."""
    import psutil

    jobs = found.jobs
    if job_pid is not None:
        if not psutil.pid_exists(job_pid):
            raise UsageError(wrap(f"--job-pid {job_pid}: no process has that pid on this host"))
        mine = [j for j in jobs if job_pid in j.pids() or _below(job_pid, j)]
        if not mine:  # (the process that started its launcher: ``commscope run``, a shell script, srun)
            mine = [j for j in jobs if _above(job_pid, j)]
            if len(mine) > 1:
                raise UsageError(wrap(f"pid {job_pid} started {len(mine)} of the torch.distributed jobs found on "
                                      "this host; give a pid of the one to take with --job-pid (e.g. "
                                      f"{', '.join(str(j.ranks[0].pid) for j in mine)})"))
        if not mine:
            raise UsageError(wrap(f"pid {job_pid} belongs to no torch.distributed job found on this host"))
        jobs = mine
    if not jobs and found.absent:
        raise UsageError(wrap(f"no process has pid(s) {', '.join(map(str, found.absent))} on this host "
                              "(given with --pid); the others given hold no torch.distributed rank"
                              if found.given > len(found.absent) else
                              f"no process has pid(s) {', '.join(map(str, found.absent))} on this host "
                              "(given with --pid)"))
    if not jobs:
        if found.unreadable:
            users = sorted({u.user or "?" for u in found.unreadable})
            raise UsageError(wrap(
                f"found no job this user may read, but {len(found.unreadable)} Python process(es) of "
                f"{', '.join(users)} whose environment is not readable (pids "
                f"{', '.join(str(u.pid) for u in found.unreadable[:8])}): run commscope snapshot as their user or "
                "root (sudo), or give it CAP_SYS_PTRACE"))
        where = "among the processes given with --pid and those below them" if found.given else "on this host"
        raise UsageError(wrap(f"no torch.distributed job found {where} (a rank has RANK and WORLD_SIZE, or "
                         "SLURM_PROCID with MASTER_ADDR, in its environment, or is a torch.multiprocessing.spawn "
                         "worker)" + ("" if found.given else "; give its processes with --pid")))
    if len(jobs) == 1:
        return jobs[0]
    listing = "\n".join("  " + wrap(f"[{i + 1}] {visible(j.describe())}", 2, "      ") for i, j in enumerate(jobs))
    if sys.stdin.isatty() and sys.stdout.isatty():
        print(f"{len(jobs)} jobs on this host:\n{listing}")
        answer = input(f"which one [1-{len(jobs)}]? ").strip()
        if answer.isdigit() and 1 <= int(answer) <= len(jobs):
            return jobs[int(answer) - 1]
        raise UsageError("no job chosen")
    first = ", ".join(str(j.ranks[0].pid) for j in jobs)
    raise UsageError(wrap(f"{len(jobs)} jobs on this host; choose one with --job-pid PID (e.g. {first}):")
                     + f"\n{listing}")


def _above(pid: int, job: Job) -> bool:
    """Whether ``pid`` started ``job``'s launcher or ranks, however far up (``commscope run``
    above torchrun: --job-pid refused it, helper-171)."""
    import psutil

    for member in job.pids():
        try:
            if any(a.pid == pid for a in psutil.Process(member).parents()):
                return True
        except psutil.Error:
            continue
    return False


def _below(pid: int, job: Job) -> bool:
    import psutil

    try:
        return any(job.leader == a.pid or a.pid in job.pids() for a in psutil.Process(pid).parents())
    except psutil.Error:
        return False


def default_id(job: Job) -> str:
    """snap-<job identity>-<UTC time>: to the minute when other hosts hold ranks of the job (the
    same on every node that snapshots it then), to the second when this host holds them all."""
    ident = job.key.rsplit("/", 1)[-1] if "/" in job.key else job.key
    ident = re.sub(r"[^A-Za-z0-9_.-]+", "_", ident).strip("_")[:60] or "job"
    whole = len(job.ranks) + len(job.gone) >= job.world_size
    return f"snap-{ident}-{time.strftime('%Y%m%d-%H%M%S' if whole else '%Y%m%d-%H%M', time.gmtime())}"


def permission_help(exc: DumpError, pid: int) -> str:
    scope = _read("/proc/sys/kernel/yama/ptrace_scope")
    hint = {"1": " (/proc/sys/kernel/yama/ptrace_scope is 1: only a parent may attach; run with sudo, or set it "
                 "to 0)", "2": " (ptrace_scope is 2: only root with CAP_SYS_PTRACE may attach)",
            "3": " (ptrace_scope is 3: attaching is disabled until reboot)"}.get(scope or "", "")
    return (f"py-spy may not attach to pid {pid}: {exc}{hint}. Run commscope snapshot as the job's user or root "
            "(sudo); in a container, start it with --cap-add SYS_PTRACE (docker) or the SYS_PTRACE capability "
            "(Kubernetes securityContext)")


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


class _bar:
    """A transient bar over the dumps (ranks x samples), on a terminal only."""

    def __init__(self, shown: bool):
        self.shown = shown

    def __enter__(self):
        if not self.shown:
            return None
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        self.progress = Progress(TextColumn("sampling stacks"), BarColumn(bar_width=24), MofNCompleteColumn(),
                                 console=Console(stderr=True), transient=True)
        self.progress.__enter__()
        task = self.progress.add_task("", total=None)
        return lambda done, total: self.progress.update(task, completed=done, total=total)

    def __exit__(self, *exc):
        if self.shown:
            self.progress.__exit__(*exc)
        return False


def summary(job: Job, cycle: Cycle, store: str, job_id: str, span: float) -> None:
    from commscope.analysis.ranks import ranges

    print(wrap(f"job {job.key} ({job.launcher}): {len(job.ranks)} of {job.world_size} ranks on this host; "
               f"{len(cycle.ops)} inside a collective"
               + (f" at the last of samples over {span:g} s" if span else " (one sample)"), 0))
    width = max((len(str(r)) for r in range(job.world_size)), default=1)
    for p in job.ranks:
        op = cycle.ops.get(p.rank)
        err = cycle.failed.get(p.rank)
        inside = None
        if op is not None:
            where = f" at {os.path.basename(op.site)}" if op.site else ""
            group = f"group {op.group}" if op.group else "a group passed by object"
            via = f", {op.via}" if op.via else ""
            inside = f"in {op.op} ({group}{f', peer {op.peer}' if op.peer is not None else ''}{via}){where}"
        if err is not None:
            what = f"no stack: {err}" + (f" (last seen {inside})" if inside else "")
        elif p.rank in cycle.gone:
            what = "gone: its process ended while the snapshot looked"
        elif inside is not None:
            what = inside
        elif p.rank in cycle.backward:
            site, native = cycle.backward[p.rank]
            what = f"in autograd's backward{f' at {os.path.basename(site)}' if site else ''}" + (
                "" if native else " (no native frames: a DDP all_reduce inside it would not show)")
        else:
            what = "in no collective"
        head = f"  rank {p.rank:>{width}}  pid {p.pid:<8} "
        print(wrap(head + visible(redact(what))[:400], 0, " " * len(head)))  # (a stack's paths)
    if cycle.gone:
        print(wrap(f"  gone: rank(s) {ranges(cycle.gone)} (this host should hold them; their processes are not "
                   "there)", 0, "    "))
    if cycle.flight_note:
        print(wrap(f"  {cycle.flight_note}", 0, "    "))
    print(wrap(f"written to {redact_store(store)} (job {job_id})", 0))


def report(store: str, job: Job, unread: set[int], job_id: str = "") -> int:
    """The snapshot's findings, as ``commscope check`` prints them, once every rank is in the
    store or known here (``unread``: ranks of this host py-spy could not read)."""
    from commscope.analysis.ranks import ranges
    from commscope.analysis.source import load_trace
    from commscope.commands.check import check_store

    model, _, _ = load_trace(store)
    missing = sorted(set(range(job.world_size)) - set(model.ranks) - unread)
    here = [r for r in missing if r in (job.here or ())]
    elsewhere = [r for r in missing if r not in here]
    if here:
        print(wrap(f"rank(s) {ranges(here)} are on this host (LOCAL_WORLD_SIZE) but were not given with --pid: "
                   f"give their pids too (or no --pid) with --out {redact_store(store)}" + (f" --id {job_id}" if job_id else "")
                   + f", then commscope "
                   f"check {redact_store(store)}", 0))
    if elsewhere:
        print(wrap(f"rank(s) {ranges(elsewhere)} are on other hosts: run commscope snapshot --out {redact_store(store)} "
                   f"there (same --id), then commscope check {redact_store(store)}", 0))
    if missing:
        return 0
    check_store(store)
    return 0
