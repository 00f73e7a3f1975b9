"""Which streams are of the run a trace is of, and which are foreign (``TraceModel.foreign_streams``).

A stream is one rank incarnation; its ``meta`` names its job, its run (the nonce rank 0
draws at each init, ``record.jobid.settle``) and the world size.  A rank file copied in from
another job, or a second launch under a job id reused by hand, puts streams of another run
next to the job's own.  What they are compared with is the store's job metadata where it
says the run (``job.json`` / the Redis job key, which rank 0 writes at its open:
``JobReference``), else what most ranks' metas say (the lowest rank's on a tie).  The
metadata wins over the vote: four streams copied into a two-rank job's directory outvote
its own two, and the vote alone named the job's own ranks foreign.  No module of the
analysis is imported here (``model`` imports it).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from enum import Enum
from typing import Any, NamedTuple


class JobReference(NamedTuple):
    """What the store's job metadata says of the job's run (rank 0 writes it at its open)."""

    job: str | None  # the job id it was written under
    inc: int  # the incarnation ``run`` and ``world_size`` are of
    run: str | None  # None: metadata written before it said the run (only the job id is used then)
    world_size: int | None

    @classmethod
    def of(cls, job: Mapping[str, Any] | None) -> JobReference | None:
        """From a reader's ``job()`` (None: the store has none, or it was invalid)."""
        if not job:
            return None
        run, inc, world = job.get("run"), job.get("inc"), job.get("world_size")
        return cls(job["job"] if isinstance(job.get("job"), str) else None,
                   inc if _count(inc) is not None else 0, run if isinstance(run, str) else None,
                   world if _count(world) else None)


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def most(values: Iterable[object]) -> str | int | None:
    """The string or int said most often (the first said of those said as often; None: none)."""
    said = Counter(v for v in values if isinstance(v, (str, int)) and not isinstance(v, bool))
    return said.most_common(1)[0][0] if said else None


class Cause(Enum):
    """Why a stream is not of the run (its value: what ``--json`` says, ``per_rank``'s
    ``foreign_cause``)."""

    JOB = "another_job"  # its meta names another job
    LAUNCH = "another_launch"  # another run of the job at its incarnation: a job id reused by another launch
    WORLD = "past_world_size"  # its rank is past the world size

    @property
    def words(self) -> str:
        """What the stream is, in a few words: the console's rank table and timeline."""
        return _WORDS[self]


_WORDS = {Cause.JOB: "another job", Cause.LAUNCH: "another launch", Cause.WORLD: "past the world size"}


class Foreign(NamedTuple):
    """A stream not of the run (``foreign``): its cause, what its meta says against what the
    job's is, and the message made of them (before, the message alone was kept,
    and the console told the cause back from its text: a run or job id that held the words
    of another cause was shown as that one)."""

    cause: Cause
    said: str | int  # its meta's job (``JOB``) or run (``LAUNCH``), or its rank (``WORLD``)
    job: str | int  # the job's: its id, its run, or its world size
    by: str  # who says the job's: "the job's metadata says", "its peers' metas say"
    inc: int  # the incarnation the run and world size are of

    @property
    def message(self) -> str:
        """Why, in a sentence: ``trace_incomplete``'s ``per_rank`` ``foreign``, and warnings."""
        at = f" (incarnation {self.inc})" if self.inc else ""
        if self.cause is Cause.JOB:
            return f"its meta names job {self.said!r}, not {self.job!r}"
        if self.cause is Cause.LAUNCH:
            return f"its meta names run {self.said!r} of the job, not {self.job!r}{at}: another launch"
        return f"rank {self.said} is past the world size {self.job} {self.by}{at}"


def foreign(metas: Mapping[int, Mapping[str, Any]], ref: JobReference | None) -> dict[int, Foreign]:
    """The ranks (of ``metas``: rank -> its meta, in rank order) whose stream is not of the
    run, with why: its meta names another job, or at its incarnation another run of the job
    or a world size its rank is past.  The job is the job metadata's where some meta names it
    (a copy under a new id keeps its ranks' metas: the vote then); the run and world size at
    the metadata's incarnation are its own where some meta of that incarnation names its run."""
    out: dict[int, Foreign] = {}
    job, by = None, "its peers' metas say"
    if ref is not None and ref.job is not None and any(m.get("job") == ref.job for m in metas.values()):
        job, by = ref.job, "the job's metadata says"
    job = job if job is not None else most(m.get("job") for m in metas.values())
    for r, m in metas.items():
        if job is not None and isinstance(m.get("job"), str) and m["job"] != job:
            out[r] = Foreign(Cause.JOB, m["job"], job, by, 0)
    by_inc: dict[int, list[int]] = {}
    for r, m in metas.items():
        if r not in out:
            by_inc.setdefault(m.get("inc", 0) if _count(m.get("inc")) is not None else 0, []).append(r)
    for inc, rs in by_inc.items():
        if (ref is not None and ref.run is not None and ref.inc == inc
                and any(metas[r].get("run") == ref.run for r in rs)):
            run, world, by = ref.run, ref.world_size, "the job's metadata says"
        else:
            run, world, by = most(metas[r].get("run") for r in rs), most(metas[r].get("world_size") for r in rs), \
                "its peers' metas say"
        for r in rs:
            said = metas[r].get("run")
            if run is not None and isinstance(said, str) and said != run:
                out[r] = Foreign(Cause.LAUNCH, said, run, by, inc)
            elif _count(world) is not None and r >= world:
                out[r] = Foreign(Cause.WORLD, r, world, by, inc)
    return dict(sorted(out.items()))
