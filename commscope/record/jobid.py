"""Agreeing on one job id across ranks, so each job gets its own trace directory.

Order: ``$COMMSCOPE_JOB`` (set by ``commscope run``/``demo``, or by hand); else rank 0
proposes an id through the process group's own c10d key-value store (a TCP store, not a
collective) and the other ranks read it; else an id derived from the launcher's
environment.  Runs on the recorder thread, never on the training thread.

The c10d store client is shared with the training thread (``new_group`` rendezvous
uses it), so this only issues short requests (``set``, ``check``, ``get``) and polls,
never a blocking ``wait`` that could hold the client while training needs it.
"""

from __future__ import annotations

import os
import re
import secrets
import time

ENV_JOB = "COMMSCOPE_JOB"
_WAIT_S = 15.0
_POLL_S = 0.05


def new_job_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


def sanitize(job: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", job)[:120] or "job"


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


def resolve_job_id(rank: int) -> str:
    """The recorder thread's fallback when ``publish`` found nothing yet: poll, bounded."""
    job = publish(rank)
    if job:
        return job
    if rank != 0:
        deadline = time.monotonic() + _WAIT_S
        while time.monotonic() < deadline:
            try:
                if _store().check([_key()]):
                    return sanitize(_store().get(_key()).decode())
            except Exception:
                break  # the store is gone (rank 0 exited): derive an id instead
            time.sleep(_POLL_S)
    parts = [os.environ.get(k) for k in ("SLURM_JOB_ID", "TORCHELASTIC_RUN_ID", "MASTER_PORT")]
    return sanitize("job-" + "-".join(p for p in parts if p and p != "none") + time.strftime("-%Y%m%d"))
