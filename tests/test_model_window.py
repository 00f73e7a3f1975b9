"""TraceModel window queries stay exact while the model is updated incrementally.

The order and prefix-max behind ``ops_in_window`` are maintained incrementally (new ops
merged in, recomputation from the first changed position); this checks them against a
brute-force scan after every batch, with ops arriving out of time order (as Flight
Recorder merges do) and completing in later batches.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from commscope.analysis import TraceModel


def _brute(ops: dict[int, list], t0: int, t1: int) -> list[int]:
    out = []
    for op_id, (b, e) in ops.items():
        if b < t1 and (e is None or e > t0 or b >= t0):
            out.append(op_id)
    return sorted(out)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_window_matches_brute_force_under_incremental_ingest(seed):
    rng = random.Random(seed)
    model = TraceModel()
    truth: dict[int, list] = {}  # op id -> [begin, end or None]
    open_ids: list[int] = []
    next_id = 1
    clock = 1_000_000
    for _batch in range(40):
        events = []
        for _ in range(rng.randint(1, 30)):
            clock += rng.randint(1, 1000)
            late = rng.random() < 0.15  # a Flight Recorder style op from the past
            begin = clock - rng.randint(1_000, 50_000) if late else clock
            events.append({"v": 1, "type": "op", "rank": 0, "ts": begin, "phase": "begin", "id": next_id,
                           "op": "all_reduce", "group": "0", "seq": next_id})
            if rng.random() < 0.6:
                end = begin + rng.randint(0, 5_000)
                events.append({"v": 1, "type": "op", "rank": 0, "ts": end, "phase": "end", "id": next_id})
                truth[next_id] = [begin, end]
            else:
                truth[next_id] = [begin, None]
                open_ids.append(next_id)
            next_id += 1
        # some earlier ops finish now
        for op_id in list(open_ids):
            if rng.random() < 0.3:
                end = max(truth[op_id][0], clock) + rng.randint(0, 3_000)
                events.append({"v": 1, "type": "op", "rank": 0, "ts": end, "phase": "end", "id": op_id})
                truth[op_id][1] = end
                open_ids.remove(op_id)
        model.ingest(events)
        rt = model.ranks[0]
        for _ in range(15):
            a = rng.randint(0, clock + 5_000)
            b = a + rng.randint(1, 60_000)
            got = sorted(int(rt.id[i]) for i in model.ops_in_window(0, a, b))
            assert got == _brute(truth, a, b), (a, b)
        begins = [int(rt.begin[i]) for i in rt.order()]
        assert begins == sorted(begins)


def test_the_jobs_rate_is_told_from_the_ops_in_the_window():
    """``TraceModel.op_rate(since)``: every rank holds an isend begun an hour before the
    window and never waited (a carry keeps it), then 100 ops at 10 a second there; the job's
    rate is 10 a rank, not the hundred ops over the hour and more; nor is it one rank's whose
    ops came a nanosecond apart."""
    from commscope.analysis.synth import T0, TraceBuilder

    S, MS = 1_000_000_000, 1_000_000
    b = TraceBuilder(4)
    for r in range(4):
        b.async_op(r, T0, None, None, "isend", peer=(r + 1) % 4, dir="send", shape=(8,))
    start = T0 + 3600 * S
    for k in range(100):
        for r in range(4):
            b.sync(r, start + k * 100 * MS + r, start + k * 100 * MS + MS + r, "all_reduce", shape=(8,))
    m = TraceModel()
    m.ingest(b.sorted_events())
    assert m.op_rate(start) == pytest.approx(40, rel=0.02)  # (10 a second, for the 4 ranks)
    assert m.op_rate() < 1  # (the hour in it)
    rt = m.ranks[0]
    rt.begin[: rt.n] = start + np.arange(rt.n)
    assert m.op_rate(start) == pytest.approx(40, rel=0.02)
