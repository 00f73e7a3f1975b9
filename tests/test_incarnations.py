"""Three in-process restarts with swapped ranks: each ``init_process_group`` after a
``destroy_process_group`` starts a new incarnation of the rank in the trace, with its own
groups, sequence numbers, rank and world size.  Analysis matches ops within an
incarnation, ``report`` counts every op, and a clean destroy and exit is not incomplete."""

from __future__ import annotations

import json
from collections import Counter
from datetime import timedelta

import pytest

from commscope.analysis.source import load_trace
from commscope.cli import main as cli
from commscope.events import incarnation_ids
from commscope.launch import Job, free_port
from commscope.store import open_reader

pytestmark = pytest.mark.timeout(120)

#: Ops per incarnation (a different count each time: a mix-up would show).
OPS = (7, 11, 5)


def restarting(slot: int, _ws: int, store: str, ports: list[int]) -> list[int]:
    """Process ``slot`` is rank ``slot`` in incarnations 0 and 2 and the other rank in 1."""
    import os

    import torch
    import torch.distributed as dist

    import commscope

    commscope.instrument(store, sample_interval=0.2, hang_after=60.0, flight_recorder=False)
    ranks = []
    for inc, n in enumerate(OPS):
        rank = slot if inc % 2 == 0 else 1 - slot
        os.environ["MASTER_PORT"] = str(ports[inc])
        dist.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(seconds=60))
        x = torch.ones(4)
        for _ in range(n):
            dist.all_reduce(x)
        sub = dist.new_group([0, 1])
        dist.broadcast(x, src=0, group=sub)
        dist.barrier()
        dist.destroy_process_group()
        ranks.append(rank)
    commscope.uninstrument()
    return ranks


def test_three_restarts_with_swapped_ranks(tmp_path, capsys):
    store = str(tmp_path / "trace")
    ports = [free_port() for _ in OPS]
    results = Job(restarting, 2, args=(store, ports), init=False, env={"COMMSCOPE_JOB": "restarts"}).start().join(90)
    assert all(r.ok for r in results.values()), {k: r.error for k, r in results.items()}
    assert results[0].value == [0, 1, 0] and results[1].value == [1, 0, 1]

    reader = open_reader(store)
    events = reader.read_all()
    streams = sorted({(e["rank"], e.get("inc", 0)) for e in events if e["type"] == "meta"})
    assert streams == [(r, i) for r in range(2) for i in range(3)]
    for e in events:
        if e["type"] == "meta":
            assert e["world_size"] == 2
    # each incarnation numbers its ops from its own ``incarnation_ids`` on (the native recorder
    # as events.py says: a reader behind retention completes an op by its id alone)
    for r in range(2):
        begun = Counter(inc for e in events if e["type"] == "op" and e["rank"] == r and e["phase"] == "begin"
                        for inc in range(3) if e["id"] in incarnation_ids(inc))
        assert begun == {inc: OPS[inc] + 2 for inc in range(3)}
    model, _reader, _w = load_trace(store)
    per_rank_ops = sum(n + 2 for n in OPS)  # all_reduce, broadcast, barrier in each incarnation
    assert {r: model.n_ops(r) for r in range(2)} == {0: per_rank_ops, 1: per_rank_ops}

    capsys.readouterr()
    assert cli(["check", store, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["findings"] == [], out["findings"]  # matched within incarnations; clean ends are not incomplete
    assert cli(["report", store, "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    counts = {op: row["count"] for op, row in rep["ops"].items()}
    assert counts == {"all_reduce": sum(OPS), "broadcast": len(OPS), "barrier": len(OPS)}  # per instance
    # each incarnation's default group is its own: "0", "0@1", "0@2"
    assert {"0", "0@1", "0@2"} <= set(rep["groups"])
    assert sum(rep["groups"][g]["count"] for g in ("0", "0@1", "0@2")) == sum(OPS) + len(OPS)


def unwaiting(rank: int, ws: int, store: str) -> None:
    import torch
    import torch.distributed as dist

    import commscope

    commscope.instrument(store, sample_interval=0.2, hang_after=60.0, flight_recorder=False)
    x = torch.ones(1)
    kept = [dist.all_reduce(x, async_op=True) for _ in range(UNWAITED)]  # never waited
    for _ in range(100):
        dist.all_reduce(x, async_op=True).wait()
    for _ in range(100):  # completed through its future: not unwaited
        dist.all_reduce(x, async_op=True).get_future().wait()
    dist.barrier()
    commscope.uninstrument()
    del kept


UNWAITED = 3000  # past the 1,000 ids an exit event lists


def test_unwaited_work_counts_every_work_never_waited(tmp_path, capsys):
    store = str(tmp_path / "trace")
    for recorder in ("native", "python"):
        job = f"unwaited-{recorder}"
        env = {"COMMSCOPE_JOB": job, "COMMSCOPE_SOURCE": recorder}
        results = Job(unwaiting, 2, args=(store,), env=env).start().join(120)
        assert all(r.ok for r in results.values()), {k: r.error for k, r in results.items()}
        events = open_reader(f"{store}/{job}").read_all()
        exits = [e for e in events if e["type"] == "exit"]
        assert sorted(e["unwaited_count"] for e in exits) == [UNWAITED, UNWAITED], recorder
        assert all(len(e["unwaited"]) == 1000 for e in exits)
        capsys.readouterr()
        assert cli(["check", f"{store}/{job}", "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert [(f["kind"], f["evidence"]["count"]) for f in out["findings"]] == [("unwaited_work", UNWAITED)] * 2
        assert f"{UNWAITED:,} async op(s) never waited on" in out["findings"][0]["message"]
