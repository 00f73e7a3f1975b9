"""Fault scenarios on real Gloo ranks, diagnosed from the live store while the job hangs.

Each test polls the store from this process the way the live console does (incremental
ingest, wall-clock ``now``), and must see the right finding within hang_after + 5 s of
the moment the hang began, then kills the job.
"""

from __future__ import annotations

import json
import time

import analysis_workers as W
import pytest

from commscope.analysis import TraceModel, diagnose
from commscope.analysis.source import open_source
from commscope.cli import main as cli
from commscope.launch import Job
from commscope.store import AsOf

pytestmark = pytest.mark.timeout(90)
SLACK = 5.0


def watch(tmp_path, fn, world: int, want, *, limit: float = 40.0, linger: float = 0.0):
    """Run ``fn`` on ``world`` ranks; poll until ``want(findings)`` returns the finding.

    ``linger``: keep the hung job alive that much longer before killing it, so the
    trace itself (heartbeats every 0.2 s, flushed every 50 ms) covers the hang past
    hang_after when a post-mortem check judges it by the trace's last timestamps."""
    store = str(tmp_path / "trace")
    job = Job(fn, world, args=(store,), pg_timeout=300.0).start()
    model = TraceModel()
    reader = None
    as_of = AsOf()  # (as the console judges: never past what the reader has read)
    found = None
    seen: list = []
    deadline = time.monotonic() + limit
    try:
        while time.monotonic() < deadline:
            time.sleep(0.25)
            if reader is None:
                try:
                    reader = open_source(store)
                except Exception:
                    continue
            model.ingest(reader.poll())
            now = as_of.now(reader, time.time_ns())
            seen = diagnose(model, now=now, hang_after=W.HANG_AFTER)
            found = want(seen)
            if found is not None:
                break
        assert found is not None, f"not diagnosed; findings were {[f.to_json() for f in seen]}"
        assert job.alive(), "the job should still be hung when diagnosed"
        if found.ts:  # seconds from the moment the hang began
            assert (now - found.ts) / 1e9 <= W.HANG_AFTER + SLACK + 1.0, found.to_json()
        time.sleep(linger)
        return found, seen, store
    finally:
        job.kill()


def first(kind: str, culprits: list[int] | None = None):
    def pick(findings):
        for f in findings:
            if f.kind == kind and (culprits is None or sorted(f.culprits) == culprits):
                return f
        return None
    return pick


def test_skip_one_all_reduce(tmp_path, capsys):
    f, seen, store = watch(tmp_path, W.skip_one, 3, first("missing_ranks", [2]), linger=1.0)
    assert f.group == "0" and f.op == "all_reduce" and f.seq == 5
    assert f.evidence["missing_activity"]["2"]["last_seq_in_group"] == 4
    assert not [x for x in seen if x.kind in ("collective_mismatch", "p2p_deadlock", "dead_rank")]
    # the job is killed now: check on the leftover trace still names the hang
    capsys.readouterr()
    assert cli(["check", store, "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    kinds = [(x["kind"], x["culprits"]) for x in out["findings"]]
    assert kinds == [("missing_ranks", [2])], kinds


def test_all_reduce_vs_broadcast(tmp_path):
    f, seen, _ = watch(tmp_path, W.disagree, 3, first("collective_mismatch", [1]))
    assert f.seq == 4  # (until every rank's call is in, the odd one out is not named: no innocent is)
    assert not [x for x in seen if x.severity == "error" and set(x.culprits) - {1}]
    assert f.evidence["per_rank"]["1"]["op"] == "broadcast"


def test_shape_mismatch(tmp_path):
    f, _, _ = watch(tmp_path, W.shape_mismatch, 3, first("collective_mismatch", [1]))
    assert f.evidence["differs"] == ["shape"]
    assert f.evidence["per_rank"]["1"]["in_shapes"] == [[12]]


def test_p2p_cycle(tmp_path):
    f, _, _ = watch(tmp_path, W.p2p_cycle, 3, first("p2p_deadlock", [0, 1, 2]))
    assert len(f.evidence["cycle"]) == 3
    assert all(step["op"] == "recv" for step in f.evidence["cycle"])
    assert "stacks" in f.evidence


def test_rank_exits_mid_run(tmp_path):
    f, seen, _ = watch(tmp_path, W.exit_mid_run, 3, first("dead_rank", [1]))
    assert f.evidence["activity"]["state"] == "dead"


def test_straggler(tmp_path):
    f, seen, _ = watch(tmp_path, W.straggler, 3, first("straggler", [2]))
    assert f.severity == "warning" and f.evidence["median_lateness_s"] >= 0.05
    assert not [x for x in seen if x.severity == "error"]


def test_healthy_job_has_no_findings(tmp_path):
    from commscope.launch import run_ranks

    store = str(tmp_path / "trace")
    run_ranks(W.healthy, 4, args=(store,), timeout=60)
    reader = open_source(store)
    model = TraceModel.from_events(reader.read_all())
    assert model.total_ops() > 50
    findings = diagnose(model, hang_after=W.HANG_AFTER)
    assert findings == [], [f.to_json() for f in findings]
