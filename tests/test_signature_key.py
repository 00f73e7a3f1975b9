"""Begins carry a key of their static fields; interning by it must change nothing."""

from __future__ import annotations

import torch
import torch.distributed as dist
from trace_helpers import ops, read_events

import commscope
from commscope.analysis import TraceModel
from commscope.analysis.synth import healthy_trace
from commscope.launch import run_ranks


def test_interning_by_key_gives_the_same_model_as_comparing_fields():
    events = healthy_trace(4, 400)
    assert sum(1 for e in events if e.get("sk") is not None) > 1000
    plain = [{k: v for k, v in e.items() if k != "sk"} for e in events]
    a, b = TraceModel.from_events(events), TraceModel.from_events(plain)
    assert [s.describe() for s in a.sigs] == [s.describe() for s in b.sigs]
    for r in a.rank_ids():
        n = a.ranks[r].n
        assert (a.ranks[r].sig[:n] == b.ranks[r].sig[:n]).all()


def keyed(rank: int, ws: int, store: str) -> None:
    commscope.instrument(store, sample_interval=0.5, flight_recorder=False)
    for n in (4, 4, 8):
        dist.all_reduce(torch.ones(n))


def test_recorded_begins_share_a_key_exactly_when_their_static_fields_match(tmp_path):
    run_ranks(keyed, 2, args=(str(tmp_path),))
    events = read_events(tmp_path)
    keys = {rank: [o["sk"] for o in ops(events, rank) if o["op"] == "all_reduce"] for rank in (0, 1)}
    for rank in (0, 1):
        assert keys[rank][0] == keys[rank][1] != keys[rank][2]  # one call site; the shape differs
    assert keys[0] == keys[1]  # the same static fields on every rank
