"""Finding the rank processes of ``torch.distributed`` jobs on this host, from outside.

A rank is told by what its launcher put in its environment (``/proc/PID/environ``: the
environment it started with):

- torchrun and any launcher that exports ``RANK`` and ``WORLD_SIZE`` (``LOCAL_RANK`` and
  ``LOCAL_WORLD_SIZE`` too, with torchrun);
- Slurm's ``srun``: ``SLURM_PROCID`` and ``SLURM_NTASKS`` beside ``MASTER_ADDR``;
- ``torch.multiprocessing.spawn``: a ``--multiprocessing-fork`` child whose stack is inside
  torch's ``spawn._wrap``: its rank is ``_wrap``'s ``i`` and the world its parent's ``nprocs``
  (read with py-spy, which the snapshot runs anyway).

Processes are grouped into jobs by ``TORCHELASTIC_RUN_ID``, the Slurm job and step,
``MASTER_ADDR:MASTER_PORT`` or the spawning parent.  A process below a rank of the same job
(DataLoader workers inherit the rank's environment) is not a rank.  The ranks a job should
have on this host (``LOCAL_WORLD_SIZE``, ``nprocs``) and did not show are ``gone``.
"""

from __future__ import annotations

import dataclasses
import os
import socket

import psutil

from commscope.analysis.ranks import ranges
from commscope.redact import Redactor, default
from commscope.snapshot import pyspy


@dataclasses.dataclass(frozen=True, slots=True)
class RankProcess:
    pid: int
    rank: int
    world_size: int
    local_rank: int | None
    launcher: str  # "torchrun", "env", "slurm", "spawn"
    job: str  # the key its job is grouped by
    argv: tuple[str, ...]
    user: str | None
    create_time: float
    #: from its environment, read once here: the job's store (``MASTER_ADDR``, ``MASTER_PORT``)
    #: and where its Flight Recorder dump goes (``flight.dump_path``)
    master: tuple[str | None, int | None] = (None, None)
    fr_prefix: str | None = None
    #: the values of its environment's secrets (``Redactor.from_environ``): what its own
    #: recorder would hide, which the snapshot (run from another shell) does not know
    secrets: tuple[str, ...] = ()

    def redactor(self) -> Redactor:
        """The redaction for this rank's text: this process's, knowing the rank's secrets too."""
        return Redactor([*default().known, *self.secrets]) if self.secrets else default()


@dataclasses.dataclass(slots=True)
class Job:
    key: str
    launcher: str
    world_size: int
    ranks: list[RankProcess]  # by rank
    local_ranks: list[int] | None  # the ranks this host should hold, where the launcher says
    leader: int | None = None  # the launcher's pid (torchrun's agent, spawn's parent), when known
    #: the ranks the launcher put on this host (LOCAL_WORLD_SIZE), even where ``local_ranks``
    #: is None because only some of its processes were given (``--pid``)
    here: list[int] | None = None

    @property
    def gone(self) -> list[int]:
        """Ranks this host should hold whose process is not there (exited or killed)."""
        have = {p.rank for p in self.ranks}
        return [r for r in self.local_ranks or [] if r not in have]

    def pids(self) -> set[int]:
        return {p.pid for p in self.ranks} | ({self.leader} if self.leader else set())

    def describe(self) -> str:
        have = sorted(p.rank for p in self.ranks)
        cmd = " ".join(self.ranks[0].redactor().args(list(self.ranks[0].argv)))[:60] if self.ranks else ""
        return (f"{self.key}: {len(have)} of {self.world_size} ranks here ({ranges(have)}), "
                f"{self.launcher}, pids {ranges(sorted(p.pid for p in self.ranks))}: {cmd}")


@dataclasses.dataclass(frozen=True, slots=True)
class Unreadable:
    pid: int
    name: str
    user: str | None
    why: str


@dataclasses.dataclass(slots=True)
class Found:
    jobs: list[Job]
    unreadable: list[Unreadable]  # python processes whose environment this user may not read
    absent: list[int] = dataclasses.field(default_factory=list)  # pids given that no process has
    given: int = 0  # how many pids were given (0: the whole host was looked at)
    host: str = dataclasses.field(default_factory=socket.gethostname)


def count_of(text: str | None) -> int | None:
    """A non-negative int written in ASCII digits (an environment value, a repr py-spy read)."""
    v = (text or "").strip()
    return int(v) if v.isascii() and v.isdigit() and len(v) < 10 else None


def _int(env: dict[str, str], name: str) -> int | None:
    return count_of(env.get(name))


def _pythonish(p: psutil.Process) -> bool:
    try:
        name = p.name().lower()
        cmd = p.cmdline()
    except (psutil.Error, OSError):
        return False
    return "python" in name or bool(cmd and "python" in os.path.basename(cmd[0]).lower())


def classify(env: dict[str, str], cmdline: list[str]) -> tuple[str, str, int | None, int | None, int | None] | None:
    """(launcher, job key, rank, world size, local rank) from a process's environment, or
    None when it is no rank; a spawn child's rank and world come later (from stacks)."""
    master = f"{env.get('MASTER_ADDR', '?')}:{env.get('MASTER_PORT', '?')}"
    rank, world = _int(env, "RANK"), _int(env, "WORLD_SIZE")
    if rank is not None and world is not None and 0 <= rank < world:
        run = env.get("TORCHELASTIC_RUN_ID")
        launcher = "torchrun" if run or "TORCHELASTIC_RESTART_COUNT" in env else "env"
        key = f"{master}/{run}" if run else master
        return launcher, key, rank, world, _int(env, "LOCAL_RANK")
    proc, ntasks = _int(env, "SLURM_PROCID"), _int(env, "SLURM_NTASKS")
    if proc is not None and ntasks is not None and "MASTER_ADDR" in env and proc < ntasks:
        key = f"slurm:{env.get('SLURM_JOB_ID', '?')}.{env.get('SLURM_STEP_ID', '?')}"
        return "slurm", key, proc, ntasks, _int(env, "SLURM_LOCALID")
    if "--multiprocessing-fork" in cmdline:
        return "spawn", "", None, None, None
    return None


def find(pids: list[int] | None = None) -> Found:
    """Every job with a rank on this host (or among ``pids``, with the processes below them:
    then a job's ranks that are not there are called gone only when its launcher was among
    them, since the others may simply not have been given)."""
    me = os.getpid()
    procs: list[psutil.Process] = []
    absent: list[int] = []
    if pids:
        for pid in pids:
            try:
                root = psutil.Process(pid)
            except (psutil.NoSuchProcess, ValueError, OverflowError):  # (ValueError: a pid below 0)
                absent.append(pid)
                continue
            procs.append(root)
            try:
                procs.extend(root.children(recursive=True))
            except psutil.Error:
                pass
    else:
        procs = [p for p in psutil.process_iter() if p.pid != me]
    unreadable: list[Unreadable] = []
    seen: dict[int, RankProcess] = {}
    spawn: list[psutil.Process] = []
    for p in procs:
        try:
            env = p.environ()
            cmd = p.cmdline()
        except psutil.AccessDenied:
            if _pythonish(p):
                unreadable.append(Unreadable(p.pid, _name(p), _user(p), "its environment is not readable"))
            continue
        except (psutil.NoSuchProcess, psutil.ZombieProcess, OSError):
            continue
        got = classify(env, cmd)
        if got is None or not _pythonish(p):
            continue  # (a shell or a launcher that passes the environment on is not the rank)
        launcher, key, rank, world, local = got
        if launcher == "spawn":
            spawn.append(p)
            continue
        assert rank is not None and world is not None
        seen[p.pid] = RankProcess(p.pid, rank, world, local, launcher, key, tuple(cmd), _user(p), _ctime(p),
                                  *_env_facts(env))
    ranks = _drop_descendants(seen)
    unsure: set[str] = set()
    ranks += _spawned(spawn, unreadable, unsure)
    jobs: dict[str, Job] = {}
    envs: dict[str, dict[str, str]] = {}
    for rp in sorted(ranks, key=lambda r: (r.job, r.rank)):
        job = jobs.get(rp.job)
        if job is None:
            job = jobs[rp.job] = Job(rp.job, rp.launcher, rp.world_size, [], None)
            envs[rp.job] = _environ(rp.pid)
        if any(x.rank == rp.rank for x in job.ranks):
            continue  # two processes claim one rank: keep the older (the newer is its child or a restart's)
        job.ranks.append(rp)
    scanned = {p.pid for p in procs}
    for key, job in jobs.items():
        _local_ranks(job, envs.get(key) or {})
        job.here = job.local_ranks
        if pids and (job.leader is None or job.leader not in scanned):
            job.local_ranks = None
        if key in unsure:
            job.local_ranks = None  # a child py-spy could not read may be a live rank
    return Found(sorted(jobs.values(), key=lambda j: j.key), unreadable, absent=absent, given=len(pids or ()))


def _drop_descendants(seen: dict[int, RankProcess]) -> list[RankProcess]:
    """The ranks: not below a rank of the same job (a DataLoader worker inherits its rank's
    environment), and not above a rank of another job (torchrun's agent under ``srun`` has
    Slurm's variables; its workers are the ranks)."""
    ancestors: dict[int, list[int]] = {}
    for pid in seen:
        try:
            ancestors[pid] = [a.pid for a in psutil.Process(pid).parents()]
        except psutil.Error:
            ancestors[pid] = []
    above_other = {a for pid, up in ancestors.items() for a in up if a in seen and seen[a].job != seen[pid].job}
    return [rp for pid, rp in seen.items() if pid not in above_other
            and not any(a in seen and seen[a].job == rp.job for a in ancestors[pid])]


def _spawned(children: list[psutil.Process], unreadable: list[Unreadable], unsure: set[str]) -> list[RankProcess]:
    """``torch.multiprocessing.spawn`` workers (one host: a rank is ``_wrap``'s ``i``, the
    world the parent's ``nprocs``).  A worker's own forks (DataLoader workers) keep its command
    line and stack: only the outermost counts.  ``unsure`` gets the jobs with a child py-spy
    could not read (it may be a live rank)."""
    out = []
    worlds: dict[int, int | None] = {}
    pids = {p.pid for p in children}
    for p in children:
        try:
            if any(a.pid in pids for a in p.parents()):
                continue
        except psutil.Error:
            continue
        try:
            threads = pyspy.dump(p.pid, locals_=True)
        except pyspy.DumpError as exc:
            if exc.kind == pyspy.PERMISSION:
                unreadable.append(Unreadable(p.pid, _name(p), _user(p), str(exc)))
            if exc.kind != pyspy.GONE:
                unsure.add(f"spawn:{_ppid(p)}")
            continue
        rank = _spawn_index(threads)
        if rank is None:
            continue
        try:
            parent = p.ppid()
            cmd = p.cmdline()
        except psutil.Error:
            continue
        if parent not in worlds:
            worlds[parent] = _nprocs(parent)
        world = worlds[parent] or sum(1 for c in children if _ppid(c) == parent)
        if rank >= world:
            continue
        out.append(RankProcess(p.pid, rank, world, rank, "spawn", f"spawn:{parent}", tuple(cmd), _user(p), _ctime(p),
                               *_env_facts(_environ(p.pid))))
    return out


def _spawn_index(threads: list[pyspy.PyThread]) -> int | None:
    for t in threads:
        for f in t.frames:
            if f.func == "_wrap" and f.file.replace("\\", "/").endswith("torch/multiprocessing/spawn.py"):
                v = count_of(f.local("i"))
                if v is not None:
                    return v
    return None


def _nprocs(parent: int) -> int | None:
    try:
        threads = pyspy.dump(parent, locals_=True)
    except pyspy.DumpError:
        return None
    for t in threads:
        for f in t.frames:
            if f.func in ("start_processes", "spawn") and "multiprocessing" in f.file:
                v = count_of(f.local("nprocs"))
                if v is not None:
                    return v
    return None


def _local_ranks(job: Job, env: dict[str, str]) -> None:
    """The ranks the launcher put on this host, and its pid."""
    first = job.ranks[0]
    if job.launcher == "spawn":
        job.local_ranks = list(range(job.world_size))
        job.leader = int(job.key.split(":", 1)[1])
        return
    lws = _int(env, "LOCAL_WORLD_SIZE") if job.launcher != "slurm" else _tasks_here(env)
    if lws is not None and first.local_rank is not None:
        base = first.rank - first.local_rank
        if all(p.rank - (p.local_rank or 0) == base for p in job.ranks) and base >= 0 and base + lws <= job.world_size:
            job.local_ranks = list(range(base, base + lws))
    if job.launcher == "torchrun":
        try:
            job.leader = psutil.Process(first.pid).ppid()
        except psutil.Error:
            job.leader = None


def _tasks_here(env: dict[str, str]) -> int | None:
    """Slurm's tasks on this node: ``SLURM_NTASKS_PER_NODE`` or this node's entry of
    ``SLURM_STEP_TASKS_PER_NODE`` ("4(x2)" means 4 on each of 2 nodes)."""
    n = _int(env, "SLURM_NTASKS_PER_NODE")
    if n is not None:
        return n
    spec = env.get("SLURM_STEP_TASKS_PER_NODE", "")
    node = _int(env, "SLURM_NODEID") or 0
    at = 0
    for part in spec.split(","):
        count, _, rep = part.partition("(x")
        reps = count_of(rep.rstrip(")")) or 1
        n = count_of(count)
        if n is not None and node < at + reps:
            return n
        at += reps
    return None


#: Where a rank's Flight Recorder dump goes: its environment's prefix (the newer name
#: first), else torch's default, and the rank number after it.
FR_PREFIX_ENV = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
FR_DEFAULT_PREFIX = "/tmp/nccl_trace_rank_"


def _env_facts(env: dict[str, str]) -> tuple[tuple[str | None, int | None], str, tuple[str, ...]]:
    """(MASTER_ADDR, MASTER_PORT), the Flight Recorder dump prefix and the secrets' values of
    a rank's environment."""
    prefix = next((env[k] for k in FR_PREFIX_ENV if env.get(k)), FR_DEFAULT_PREFIX)
    return (env.get("MASTER_ADDR") or None, count_of(env.get("MASTER_PORT"))), prefix, Redactor.from_environ(env).known


def _environ(pid: int) -> dict[str, str]:
    try:
        return psutil.Process(pid).environ()
    except psutil.Error:
        return {}


def _ppid(p: psutil.Process) -> int | None:
    try:
        return p.ppid()
    except psutil.Error:
        return None


def _name(p: psutil.Process) -> str:
    try:
        return p.name()
    except psutil.Error:
        return "?"


def _user(p: psutil.Process) -> str | None:
    try:
        return p.username()
    except (psutil.Error, KeyError):
        return None


def _ctime(p: psutil.Process) -> float:
    try:
        return p.create_time()
    except psutil.Error:
        return 0.0
