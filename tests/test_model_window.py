"""TraceModel window queries stay exact while the model is updated incrementally.

The order and prefix-max behind ``ops_in_window`` are maintained incrementally (new ops
merged in, recomputation from the first changed position); this checks them against a
brute-force scan after every batch, with ops arriving out of time order (as Flight
Recorder merges do) and completing in later batches.
"""

from __future__ import annotations

import random

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
