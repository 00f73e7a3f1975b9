"""Agreeing on one job id across ranks, so each job gets its own trace directory.

Order: ``$COMMSCOPE_JOB`` (set by ``commscope run``/``demo``, or by hand); else rank 0
proposes an id through the process group's own c10d key-value store (a TCP store, not a
collective) and the other ranks read it; else an id derived from the launcher's
environment.  Runs on the recorder thread, never on the training thread.
"""

from __future__ import annotations

import os
import re
import secrets
import time
from datetime import timedelta

ENV_JOB = "COMMSCOPE_JOB"
_WAIT = timedelta(seconds=15)


def new_job_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


def sanitize(job: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", job)[:120] or "job"


def resolve_job_id(rank: int) -> str:
    env = os.environ.get(ENV_JOB)
    if env:
        return sanitize(env)
    try:
        from torch.distributed import distributed_c10d as c10d

        store = c10d._get_default_store()
        key = "commscope/job/" + os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        if rank == 0:
            job = new_job_id()
            store.set(key, job)
            return job
        store.wait([key], _WAIT)
        return sanitize(store.get(key).decode())
    except Exception:
        pass
    parts = [os.environ.get(k) for k in ("SLURM_JOB_ID", "TORCHELASTIC_RUN_ID", "MASTER_PORT")]
    return sanitize("job-" + "-".join(p for p in parts if p and p != "none") + time.strftime("-%Y%m%d"))
