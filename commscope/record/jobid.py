"""Agreeing on one job id across ranks, so each job gets its own trace directory.

Order: ``$COMMSCOPE_JOB`` (set by ``commscope run``/``demo``, or by hand); else rank 0
proposes an id through the process group's own c10d key-value store (a TCP store, not a
collective) and the other ranks read it; else an id derived from the launcher's
environment.  Rank 0 publishes when its process group is created; the others take it
then, at the end of their first completed op (rank 0 has published by then), or from
the recorder thread's per-tick retry.

The c10d store client is shared with the training thread (``new_group`` rendezvous
uses it), so this only issues short requests (``set``, ``check``, ``get``), never a
blocking ``wait`` that could hold the client while training needs it.
"""

from __future__ import annotations

import os
import re
import secrets
import time

ENV_JOB = "COMMSCOPE_JOB"


def new_job_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


def sanitize(job: str) -> str:
    """A valid job id (store.base.JOB_NAME) from any text: no separators, no leading '.'."""
    job = re.sub(r"[^A-Za-z0-9_.-]", "_", job)[:120]
    return job if job and not job.startswith(".") else ("job" + job)[:120]


def _key() -> str:
    return "commscope/job/" + os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")


def _store():
    from torch.distributed import distributed_c10d as c10d

    return c10d._get_default_store()


def publish(rank: int) -> str | None:
    """Called once the process group exists: rank 0 publishes a new id (one quick ``set``);
    other ranks take it if it is already there.  Never waits."""
    env = os.environ.get(ENV_JOB)
    if env:
        return sanitize(env)
    try:
        store = _store()
        if rank == 0:
            job = new_job_id()
            store.set(_key(), job)
            return job
        if store.check([_key()]):
            return sanitize(store.get(_key()).decode())
    except Exception:
        pass
    return None


def fallback_job_id() -> str:
    """An id from the launcher's environment, when rank 0's could not be read."""
    parts = [os.environ.get(k) for k in ("SLURM_JOB_ID", "TORCHELASTIC_RUN_ID", "MASTER_PORT")]
    return sanitize("job-" + "-".join(p for p in parts if p and p != "none") + time.strftime("-%Y%m%d"))
