"""The one growth helper behind the model's columns and indexes."""

from __future__ import annotations

import numpy as np

from commscope.analysis.columns import grown
from commscope.analysis.model import TraceModel


def test_grown_keeps_a_prefix_doubles_and_never_resizes_in_place():
    a = np.arange(4, dtype=np.int32)
    assert grown(a, 4) is a  # fits: the same array
    view = a[:2]
    b = grown(a, 5, keep=3, fill=-1)
    assert b.dtype == np.int32 and b.tolist() == [0, 1, 2, -1, -1, -1, -1, -1]  # twice the capacity
    assert view.tolist() == [0, 1] and a.tolist() == [0, 1, 2, 3]  # the old array and its views untouched
    assert grown(a, 100).shape == (100,) and grown(a, 5, minimum=1024).shape == (1024,)
    m = np.zeros((2, 3), np.int32)
    g = grown(m, 4, fill=-1, axis=1)
    assert g.shape == (2, 6) and g[:, :3].tolist() == [[0, 0, 0]] * 2 and (g[:, 3:] == -1).all()
    f = grown(np.full(2, np.nan), 3, keep=1, fill=np.nan)
    assert f.shape == (4,) and np.isnan(f).all()


def test_a_model_grows_past_every_initial_capacity():
    evs = []
    for i in range(1, 3001):  # past 256 op rows, 1024 dense ids, 64 seq rows, 256 sigs, 64 samples
        evs.append({"v": 1, "type": "op", "rank": 0, "ts": 10 * i, "phase": "begin", "id": i, "op": "all_reduce",
                    "group": "0", "seq": i, "site": f"train.py:{i % 300} in step"})
        evs.append({"v": 1, "type": "op", "rank": 0, "ts": 10 * i + 5, "phase": "end", "id": i})
        evs.append({"v": 1, "type": "sample", "rank": 0, "ts": 10 * i, "cpu": 1.0})
    m = TraceModel()
    for k in range(0, len(evs), 700):
        m.ingest(evs[k:k + 700])
    rt = m.ranks[0]
    assert m.total_ops() == 3000 and rt.n == 3000 and rt.index_of(2999) == 2998
    assert rt.order().tolist() == list(range(3000))
    assert rt.window(10 * 2000, 10 * 2001).tolist() == [1999]
    assert rt.samples.n == 3000


def test_a_published_view_says_what_changed_since_an_older_one():
    """``RankView.touched_since``: the earliest begin among the ops changed after a version,
    from the rank's log of its last TOUCH_LOG batches (kept in the model's rank table, a
    ring), None once the log no longer reaches back that far."""
    from commscope.analysis.columns import TOUCH_LOG, RankTrace

    rt = RankTrace(3)
    for k in range(1, 101):  # batch k changed ops beginning at 1000 * k (batch 50: one at 10)
        rt.version = k
        rt.touch(10 if k == 50 else 1000 * k)
    v = rt.view()
    assert sorted(v.touched[0].tolist()) == list(range(101 - TOUCH_LOG, 101))  # the last 64, as a ring
    assert v.touches == 100
    assert v.touched_since(100) == np.iinfo(np.int64).max  # nothing after the view's own
    assert v.touched_since(98) == 99_000  # batches 99 and 100
    assert v.touched_since(45) == 10  # batch 50's op, the earliest
    assert v.touched_since(101 - TOUCH_LOG - 2) is None  # batch 36 fell off the log
    assert rt.touched[-1] == (100, 100_000) and len(rt.touched) == TOUCH_LOG
