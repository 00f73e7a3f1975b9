"""Agreeing on one job id across ranks, so each job gets its own trace directory.

Order: ``$COMMSCOPE_JOB`` (set by ``commscope run``/``demo``, or by hand); else rank 0
proposes an id through the process group's own c10d key-value store (a TCP store, not a
collective) and the other ranks read it; else an id derived from the launcher's
environment.  Under torchrun every attempt of a run (``--max-restarts``) is a job of its own,
whose id says which attempt of which run it is (``attempt_job_id``), so that a reader of
the newest one can find the earlier ones (``analysis.source.restarts``).
``settle`` runs on the training thread inside ``init_process_group`` (or
``instrument()`` after it), so a rank is in the store before training code runs: rank 0
publishes, the others wait for it, bounded.  Should that fail, ``publish`` is retried
without waiting: at the end of the rank's first completed op (rank 0 has published by
then), or by the recorder thread each tick.

The c10d store client is shared with the training thread (``new_group`` rendezvous
uses it), so the recorder thread only issues short requests (``set``, ``check``,
``get``), never a blocking ``wait`` that could hold the client while training needs it.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import socket
import time
from typing import NamedTuple

ENV_JOB = "COMMSCOPE_JOB"


def new_job_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


#: The environment variables of torchrun (torch.distributed.elastic) that name an attempt and a run.
ENV_RESTART = "TORCHELASTIC_RESTART_COUNT"
ENV_RUN = "TORCHELASTIC_RUN_ID"


def attempt() -> int | None:
    """Which attempt of a torchrun run this process belongs to (0 first, one more per
    restart), or None when torchrun did not start it."""
    value = os.environ.get(ENV_RESTART, "")
    return int(value) if value.isdigit() and len(value) < 9 else None


def _started(pid: int) -> str:
    """When process ``pid`` started (clock ticks since boot; "" where /proc cannot say): a
    pid and its start time name one process, never a later one given the same pid."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError, UnicodeDecodeError):
        return ""


def run_key() -> str:
    """Six hex digits naming this torchrun run, the same in each of its attempts: a hash of
    ``$TORCHELASTIC_RUN_ID`` (``--rdzv-id``; ``--standalone`` draws a fresh uuid), or, when
    it is torchrun's default "none", of the torchrun process that started this one (its
    host, pid and start time: the agent restarts the workers, it is not restarted itself)."""
    run = os.environ.get(ENV_RUN, "")
    if run and run != "none":
        seed = "run:" + run
    else:
        parent = os.getppid()
        seed = f"agent:{socket.gethostname()}:{parent}:{_started(parent)}"
    return hashlib.sha256(seed.encode()).hexdigest()[:6]


def attempt_job_id(base: str | None = None) -> str:
    """A job id for this process's job: ``new_job_id()`` outside torchrun; under it, attempt N
    of a run is ``<time>-<run key>-a<N>`` (``run_key``), or ``<base>-a<N>`` from a given id
    (``$COMMSCOPE_JOB``: attempt 0 keeps it as given, so ``--job`` names the first attempt).
    ``analysis.source.parse_attempt`` reads these ids back (the analysis imports no recorder)."""
    n = attempt()
    if base is not None:
        base = sanitize(base)
        return base if not n else sanitize(base[:120 - len(f"-a{n}")] + f"-a{n}")
    if n is None:
        return new_job_id()
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{run_key()}-a{n}"


def sanitize(job: str) -> str:
    """A valid job id (store.base.JOB_NAME) from any text: no separators, no leading '.'."""
    job = re.sub(r"[^A-Za-z0-9_.-]", "_", job)[:120]
    return job if job and not job.startswith(".") else ("job" + job)[:120]


def _key() -> str:
    return "commscope/job/" + os.environ.get(ENV_RESTART, "0")


#: Where rank 0 also publishes, whatever its attempt: a rank whose own attempt count is lower
#: than rank 0's (a replacement node's torchrun agent counts from 0 while the others' went
#: on: ``TORCHELASTIC_RESTART_COUNT`` is per agent) reads rank 0's id here.
LAST_KEY = "commscope/job/last"

#: The attempt this process's job is, as rank 0 stated it (``settle``/``publish``); None:
#: not agreed yet (``job_attempt`` then says this process's own).
_agreed: int | None = None


def job_attempt() -> int | None:
    """Which attempt of its torchrun run this process's job is (the recorder writes it in each
    rank's meta, ``attempt``): rank 0's count once agreed, else this process's own; None
    outside torchrun."""
    return _agreed if _agreed is not None else attempt()


def _store():
    from torch.distributed import distributed_c10d as c10d

    return c10d._get_default_store()


class Published(NamedTuple):
    job: str
    incarnation: int
    run: str
    attempt: int | None  # rank 0's attempt count (None: not torchrun, or an older commscope)


def _value(job: str, incarnation: int, run: str) -> str:
    n = attempt()
    return f"{job} {incarnation} {run} {'-' if n is None else n}"


def _parse(raw: bytes) -> Published:
    value = raw.decode(errors="replace").split()
    n = value[3] if len(value) > 3 else ""
    return Published(sanitize(value[0]) if value else "",
                     int(value[1]) if len(value) > 1 and value[1].isdigit() and len(value[1]) < 12 else 0,
                     value[2][:32] if len(value) > 2 else "?",
                     int(n) if n.isdigit() and len(n) < 9 else None)


def _publish0(store, value: str) -> None:
    """Rank 0: under its own attempt's key (a store that outlives an attempt, torchrun's agent
    store, keeps earlier attempts' keys: the others read theirs) and under ``LAST_KEY``."""
    store.set(_key(), value)
    store.set(LAST_KEY, value)


def _newer(store, mine: Published | None) -> Published | None:
    """Rank 0's value under ``LAST_KEY`` when its attempt is later than this process's own
    (this rank's agent counted from 0 again: rank 0's count decides), else ``mine``."""
    own = attempt()
    if own is None or not store.check([LAST_KEY]):
        return mine
    last = _parse(store.get(LAST_KEY))
    return last if last.attempt is not None and last.attempt > own else mine


def _take(theirs: Published) -> Published:
    global _agreed
    _agreed = theirs.attempt if theirs.attempt is not None else attempt()
    return theirs


def publish(rank: int) -> str | None:
    """Called once the process group exists: rank 0 publishes a new id (quick ``set``s);
    other ranks take it if it is already there.  Never waits."""
    global _agreed
    env = os.environ.get(ENV_JOB)
    try:
        store = _store()
        if rank == 0:
            job = attempt_job_id(env) if env else attempt_job_id()
            _publish0(store, _value(job, 0, "?"))
            _agreed = attempt()
            return job
        mine = _parse(store.get(_key())) if store.check([_key()]) else None
        theirs = _newer(store, mine)
        if theirs is not None and theirs.job:
            return _take(theirs).job
    except Exception:
        pass
    return attempt_job_id(env) if env else None


class Settled(NamedTuple):
    job: str | None  # None: rank 0 said nothing in time (the recorder thread derives one)
    incarnation: int
    run: str  # this run of the job (a nonce rank 0 draws): forwarders keep runs apart


#: How long one wait for rank 0's key lasts before ``LAST_KEY`` is looked at again.
SLICE_S = 0.5


def settle(rank: int, job: str | None, incarnation: int, timeout: float = 5.0) -> Settled:
    """The job id, incarnation and run agreed with rank 0, right after ``init_process_group``,
    on the training thread (the only place a blocking ``wait`` on the c10d store is safe:
    nobody else uses the client then).  Rank 0 publishes "<job> <incarnation> <run>
    <attempt>" (its job, or a new one; with ``--job`` too, so that a rank whose torchrun agent
    counts attempts from 0 again, a replacement node's, records into rank 0's attempt, not a
    job of its own); the others wait for it, at most ``timeout``.  The incarnation is the
    larger of this process's own count and rank 0's, so ranks that restart together agree."""
    global _agreed
    from datetime import timedelta

    env = os.environ.get(ENV_JOB)
    try:
        store = _store()
        if rank == 0:
            job = attempt_job_id(env) if env else (job or attempt_job_id())
            run = secrets.token_hex(6)
            _publish0(store, _value(job, incarnation, run))
            _agreed = attempt()
            return Settled(job, incarnation, run)
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                store.wait([_key()], timedelta(seconds=max(0.01, min(SLICE_S, left))))
                theirs = _newer(store, _parse(store.get(_key())))
                break
            except Exception:
                # (not there: rank 0 is slower, or publishes under an attempt count of its own)
                theirs = _newer(store, None)
                if theirs is not None or left <= SLICE_S:
                    break
        if theirs is None or not theirs.job:
            raise LookupError("rank 0 published no job id in time")
        _take(theirs)
        return Settled(theirs.job, max(incarnation, theirs.incarnation), theirs.run)
    except Exception:
        return Settled(attempt_job_id(env) if env else job, incarnation, "?")


def fallback_job_id() -> str:
    """An id from the launcher's environment, when rank 0's could not be read."""
    parts = [os.environ.get(k) for k in ("SLURM_JOB_ID", "TORCHELASTIC_RUN_ID", "MASTER_PORT")]
    n = attempt()
    return sanitize("job-" + "-".join(p for p in parts if p and p != "none") + time.strftime("-%Y%m%d")
                    + (f"-a{n}" if n is not None else ""))
