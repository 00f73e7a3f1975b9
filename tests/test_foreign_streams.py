"""A stream that is not of the run the others are (another job's rank file copied in,
another launch under a reused job id) is named with its cause: ``check`` never calls such
a mix healthy (``TraceModel.foreign_streams``, ``completeness.find_incomplete``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from commscope.launch import Job


def _steps(rank: int, world: int, store: str) -> None:
    """A short healthy recording: 20 all_reduces and a barrier."""
    import torch
    import torch.distributed as dist

    import commscope

    x = torch.ones(4)
    with commscope.instrumented(store, sample_interval=0.2, flight_recorder=False):
        for _ in range(20):
            dist.all_reduce(x)
        dist.barrier()


def _launch(store: Path, world: int, spools: Path, job: str | None = None) -> None:
    env = {"COMMSCOPE_SOURCE": "native", "COMMSCOPE_SPOOL_DIR": str(spools)}
    if job is not None:
        env["COMMSCOPE_JOB"] = job
    results = Job(_steps, world, args=(str(store),), env=env).start().join(120)
    assert all(r.ok for r in results.values()), {k: r.error for k, r in results.items()}


def _check(target: Path, spools: Path) -> tuple[int, dict]:
    got = subprocess.run([sys.executable, "-m", "commscope", "check", "--json", str(target)], capture_output=True,
                         text=True, timeout=300, env={**os.environ, "COMMSCOPE_SPOOL_DIR": str(spools)})
    return got.returncode, json.loads(got.stdout)


def _named(store: Path, spools: Path, ranks: list[int], why: dict[int, str]) -> dict:
    """``check --json`` of ``store``: exit 1, one ``trace_incomplete`` error naming exactly
    ``ranks``, each with ``why``, nothing counted lost, and no other rank blamed by any
    finding.  The report."""
    rc, out = _check(store, spools)
    assert rc == 1, out
    [finding] = [f for f in out["findings"] if f["kind"] == "trace_incomplete"]
    assert (finding["severity"], finding["culprits"], finding["ranks"]) == ("error", ranks, ranks), finding
    assert finding["evidence"]["lost_events"] == 0
    assert finding["evidence"]["per_rank"] == {str(r): {"foreign": why[r]} for r in ranks}
    assert all(set(f["culprits"]) <= set(ranks) for f in out["findings"]), out["findings"]
    return out


def test_a_healthy_job_has_no_foreign_stream(tmp_path):
    spools = tmp_path / "spools"
    _launch(tmp_path / "a", 2, spools)
    rc, out = _check(tmp_path / "a", spools)
    assert rc == 0 and out["findings"] == [], out["findings"]


def test_rank_files_copied_in_from_another_job_are_named(tmp_path):
    """Ranks 2 and 3 of a 4-rank job copied into a 2-rank job's directory: before, they were
    matched with the job's own ranks, ``check`` blamed rank 2 as a straggler and exited 0.
    Now a ``trace_incomplete`` error names exactly ranks 2 and 3, each with the job its meta
    names; the job's own ranks are blamed for nothing and nothing is counted lost."""
    spools = tmp_path / "spools"
    _launch(tmp_path / "a", 2, spools)
    _launch(tmp_path / "b", 4, spools)
    [a] = [p for p in (tmp_path / "a").iterdir() if p.is_dir()]
    [b] = [p for p in (tmp_path / "b").iterdir() if p.is_dir()]
    for r in (2, 3):
        shutil.copy(b / f"rank-0000{r}.jsonl", a)
    why = f"its meta names job {b.name!r}, not {a.name!r}"
    out = _named(a, spools, [2, 3], {2: why, 3: why})
    said = f"rank(s) 2-3: not of the run the others are, read with them all the same (rank 2: {why}; rank 3: {why})"
    assert said in out["warnings"], out["warnings"]
    report = subprocess.run([sys.executable, "-m", "commscope", "report", "--json", str(a)], capture_output=True,
                            text=True, timeout=300, env={**os.environ, "COMMSCOPE_SPOOL_DIR": str(spools)})
    assert report.returncode == 0 and said in json.loads(report.stdout)["warnings"], report.stdout + report.stderr


def test_a_second_launch_under_a_reused_job_id_is_named(tmp_path):
    """``COMMSCOPE_JOB`` set by hand to the same id for two launches, 2 ranks then 4: the
    second launch's ranks 0 and 1 find their files taken and refuse to write, its ranks 2
    and 3 write new files next to the first launch's.  Before, ``check`` read it as one
    4-rank job (a straggler on rank 2, exit 0); now the two launches' streams are told apart
    by the run their metas name, and ranks 2 and 3 are named, from another launch."""
    spools = tmp_path / "spools"
    store = tmp_path / "s"
    _launch(store, 2, spools, job="samejob")
    _launch(store, 4, spools, job="samejob")
    metas = {r: json.loads((store / "samejob" / f"rank-0000{r}.jsonl").read_bytes().split(b"\n")[0])
             for r in range(4)}
    first, second = metas[0]["run"], metas[2]["run"]
    assert first != second and metas[1]["run"] == first and metas[3]["run"] == second  # (the premise)
    why = f"its meta names run {second!r} of the job, not {first!r}: another launch"
    _named(store, spools, [2, 3], {2: why, 3: why})


def test_a_rank_past_the_world_size_is_named(tmp_path):
    """A rank file of rank 7 (its meta: world size 4) next to a 2-rank job's own, of the same
    job and run (rank 1's stream, relabelled by hand): before, it was read as an eighth rank
    and ``check`` exited 0; now it is named, past the world size its peers' metas say."""
    import orjson

    spools = tmp_path / "spools"
    _launch(tmp_path / "a", 2, spools)
    [a] = [p for p in (tmp_path / "a").iterdir() if p.is_dir()]
    lines = []
    for line in (a / "rank-00001.jsonl").read_bytes().splitlines():
        ev = orjson.loads(line)
        ev["rank"] = 7
        if ev["type"] == "meta":
            ev["world_size"] = 4
        lines.append(orjson.dumps(ev))
    (a / "rank-00007.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    _named(a, spools, [7], {7: "rank 7 is past the world size 2 its peers' metas say"})
