"""Modern training stacks on 2 real Gloo ranks: every collective they issue is recorded.

FSDP2, tensor parallel (DTensor), pipelining and distributed checkpointing each issue
their collectives their own way (torch.distributed calls, functional collectives from
C++, c10d helpers, batched p2p, object collectives).  For each: the trace holds as many
collectives as Flight Recorder counted in the backend, each with its group, sequence
number and a real duration, and the check is healthy; and a rank that stops mid-training
is named as the culprit while the job still hangs.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest
import stack_workers as W
from trace_helpers import ops, read_events

from commscope.analysis import TraceModel, diagnose
from commscope.analysis.source import open_source
from commscope.launch import Job, run_ranks
from commscope.store import AsOf

pytestmark = pytest.mark.timeout(240)

STACKS = ["fsdp2", "tensor_parallel", "pipeline", "checkpoint"]
#: Ops that are not collectives themselves but describe the ones inside them.
LOGICAL_ONLY = {"batch_isend_irecv"}


def _args(name: str, store: str, tmp_path, hang_step=None) -> tuple:
    if name == "checkpoint":
        return (store, str(tmp_path / "ckpt"), hang_step)
    return (store, hang_step)


@pytest.mark.parametrize("name", STACKS)
def test_every_collective_is_recorded_with_group_seq_and_a_real_duration(tmp_path, name):
    store = str(tmp_path / "trace")
    results = run_ranks(getattr(W, name), 2, args=_args(name, store, tmp_path), timeout=180,
                        env={"TORCH_FR_BUFFER_SIZE": "2000"})
    events = read_events(store)
    per_rank = {}
    for rank in (0, 1):
        all_ops = ops(events, rank)
        assert all_ops, "nothing recorded"
        collectives = [o for o in all_ops if o["op"] not in LOGICAL_ONLY]
        fr = results[rank].value
        if fr:  # Flight Recorder logs Gloo's collectives (not its p2p): the same number, per group
            assert Counter(o["group"] for o in collectives) == Counter(fr), (name, fr)
        for o in all_ops:
            end = o["phases"].get("end")
            assert end is not None, o
            assert o["group"] and (o.get("nested") or "seq" in o or o["op"] in LOGICAL_ONLY), o
            if not o.get("nested"):
                assert end["ts"] > o["ts"] and not end.get("approx"), o  # measured, not inferred
                assert o.get("site"), o  # where in the training code it was issued
        per_rank[rank] = [(o["group"], o["op"], o.get("seq"), o.get("dir")) for o in all_ops
                          if not o.get("nested") and "seq" in o]
    if name == "pipeline":  # every send has its receive, by (group, seq), on the other rank
        sends = {(g, s) for g, _, s, d in per_rank[0] if d == "send"}
        recvs = {(g, s) for g, _, s, d in per_rank[1] if d == "recv"}
        assert sends and sends == recvs
    else:  # both ranks ran the same collectives in the same order
        assert per_rank[0] == per_rank[1]
    model = TraceModel.from_events(events)
    assert [f.kind for f in diagnose(model) if f.severity == "error"] == []


def _hang_found(findings):
    for f in findings:
        if f.kind in ("missing_ranks", "unmatched_p2p") and f.culprits == [1]:
            return f
    return None


@pytest.mark.parametrize("name", STACKS)
def test_a_rank_that_stops_is_named_while_the_job_hangs(tmp_path, name):
    store = str(tmp_path / "trace")
    job = Job(getattr(W, name), 2, args=_args(name, store, tmp_path, hang_step=1), pg_timeout=300.0).start()
    model, reader, found, seen, as_of = TraceModel(), None, None, [], AsOf()
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline and found is None:
            time.sleep(0.25)
            if reader is None:
                try:
                    reader = open_source(store)
                except Exception:
                    continue
            model.ingest(reader.poll())
            seen = diagnose(model, now=as_of.now(reader, time.time_ns()), hang_after=W.HANG_AFTER)
            found = _hang_found(seen)
        assert found is not None, [f.to_json() for f in seen]
        assert job.alive(), "the job should still hang when diagnosed"
        errors = [f for f in seen if f.severity == "error"]
        assert all(f.culprits == [1] for f in errors), [f.to_json() for f in errors]  # no victim blamed
    finally:
        job.kill()
