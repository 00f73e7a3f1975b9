"""The running max of op ends kept in place (``analysis/runmax.py``): the compiled loop and
numpy agree, values only rise, and a window finds exactly the ops the exact running max
finds, however completions came and went."""

from __future__ import annotations

import numpy as np
import pytest

from commscope.analysis import runmax
from commscope.analysis.columns import _window
from commscope.analysis.model import TraceModel
from commscope.analysis.synth import TraceBuilder
from commscope.oprecords import PHASE_CODE

I64_MIN = runmax.I64_MIN
I64_MAX = int(np.iinfo(np.int64).max)


def _exact(begin: np.ndarray, comp: np.ndarray) -> np.ndarray:
    return np.maximum.accumulate(runmax.ends_of(begin, comp)) if begin.shape[0] else begin


class _Block:
    """Ranks sharing one block's rows, changed at random: ops appended, completions set,
    raised, lowered (an inferred completion replaced by the op's own) or cleared."""

    def __init__(self, rng: np.random.Generator, ranks: int, cap: int) -> None:
        self.rng, self.cap = rng, cap
        self.base = np.arange(ranks, dtype=np.int64) * cap
        self.n = np.zeros(ranks, np.int64)
        self.valid = np.zeros(ranks, np.int64)
        self.begin = np.zeros(ranks * cap, np.int64)
        self.comp = np.zeros(ranks * cap, np.int64)
        self.since = np.full(ranks, I64_MIN, np.int64)
        self.last = np.full(ranks, 1_000, np.int64)

    def change(self) -> None:
        rng = self.rng
        for j in range(self.base.shape[0]):
            b, k = int(self.base[j]), int(self.n[j])
            earliest = I64_MAX
            for _ in range(int(rng.integers(0, 3))):  # completions changed
                if not k:
                    break
                i = int(rng.integers(0, k))
                x = int(self.begin[b + i])
                self.comp[b + i] = int(rng.choice([0, x + int(rng.integers(0, 5_000)), x - 7]))
                earliest = min(earliest, x)
            for _ in range(int(rng.integers(0, 4))):  # ops appended, in time order
                if k == self.cap:
                    break
                self.last[j] += int(rng.integers(0, 300))
                self.begin[b + k] = self.last[j]
                self.comp[b + k] = 0 if rng.random() < 0.3 else self.last[j] + int(rng.integers(0, 3_000))
                earliest = min(earliest, int(self.last[j]))
                k += 1
            self.n[j] = k
            self.since[j] = earliest if self.valid[j] else I64_MIN

    def updated(self, pmax: np.ndarray, compiled: bool) -> None:
        runmax.update(self.begin, self.comp, pmax, self.base, self.n, self.valid, self.since, compiled=compiled)

    def rows(self, j: int, a: np.ndarray) -> np.ndarray:
        b = int(self.base[j])
        return a[b:b + int(self.n[j])]


@pytest.mark.parametrize("seed", range(40))
def test_in_place_running_max_rises_only_and_windows_stay_exact(seed):
    rng = np.random.default_rng(seed)
    blk = _Block(rng, ranks=int(rng.integers(1, 6)), cap=64)
    compiled, plain = (np.zeros(blk.begin.shape[0], np.int64) for _ in range(2))
    for _ in range(12):
        before = compiled.copy()
        valid = blk.valid.copy()
        blk.change()
        blk.updated(compiled, True)
        blk.updated(plain, False)
        assert np.array_equal(compiled, plain)  # the compiled loop is numpy's
        for j in range(blk.base.shape[0]):
            begin, comp, pmax = blk.rows(j, blk.begin), blk.rows(j, blk.comp), blk.rows(j, compiled)
            exact = _exact(begin, comp)
            assert bool((np.diff(pmax) >= 0).all()) and bool((pmax >= exact).all())
            v = int(valid[j])
            assert bool((pmax[:v] >= blk.rows(j, before)[:v]).all())  # never lowered where a view may hold it
            order = np.arange(begin.shape[0])
            open_ops = [int(i) for i in np.flatnonzero(comp == 0)]
            for t0, t1 in rng.integers(800, int(blk.last[j]) + 4_000, size=(6, 2)).tolist():
                t0, t1 = min(t0, t1), max(t0, t1) + 1
                got = _window(order, begin, pmax, begin, comp, open_ops, t0, t1)
                want = _window(order, begin, exact, begin, comp, open_ops, t0, t1)
                assert got.tolist() == want.tolist()
        blk.valid = blk.n.copy()


@pytest.mark.parametrize("seed", range(30))
def test_a_bisection_while_the_rows_rise_lands_between_the_old_and_the_new_answer(seed):
    """A reader bisecting rows being rewritten (a prefix new, the rest old, every value
    risen) gets a position between the new rows' and the old rows': at least the ops the
    old rows gave it."""
    rng = np.random.default_rng(seed)
    old = np.maximum.accumulate(rng.integers(0, 1_000, 50))
    new = np.maximum.accumulate(old + rng.integers(0, 200, 50) * (rng.random(50) < 0.3))
    for cut in range(51):
        mixed = np.concatenate([new[:cut], old[cut:]])
        for t0 in rng.integers(0, 1_300, 20).tolist():
            p = int(np.searchsorted(mixed, t0, side="right"))
            assert int(np.searchsorted(new, t0, side="right")) <= p <= int(np.searchsorted(old, t0, side="right"))


def test_a_published_rank_s_windows_match_a_model_read_whole():
    """Views of a rank in time order published batch after batch (the block's running max
    updated in place, from the touch log) answer every window as a model read whole does."""
    ms = 1_000_000
    b = TraceBuilder(3, meta=False)
    for k in range(120):
        for r in range(3):
            end = None if (k, r) == (100, 1) else b.t0 + k * ms + (7 if k % 9 == 0 else 1) * ms // 2
            b.sync(r, b.t0 + k * ms, end, "all_reduce")
    events = b.sorted_events()
    m = TraceModel()
    cuts = [b.t0 + k * ms for k in (0, 10, 30, 31, 60, 90, 119, 10_000)]
    for lo, hi in zip(cuts[:-1], cuts[1:], strict=True):
        m.ingest([e for e in events if lo <= e["ts"] < hi])
        v = m.view()
        for r, rv in v.ranks.items():  # (what is in flight, listed for all the ranks at once)
            rt = m.ranks[r]
            assert rv.open == tuple(sorted(i for i in rt.open if rt.comp[i] == 0))
    assert v.ranks[1].open == (100,) and not v.ranks[0].open
    whole = TraceModel.from_events(events)
    for r in range(3):
        assert m.ranks[r]._sorted and v.ranks[r].n == whole.ranks[r].n
        for k in range(0, 125, 3):
            t0, t1 = b.t0 + k * ms, b.t0 + (k + 2) * ms
            assert v.ranks[r].window(t0, t1).tolist() == whole.ranks[r].window(t0, t1).tolist()
            assert m.ranks[r].window(t0, t1).tolist() == whole.ranks[r].window(t0, t1).tolist()


@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("in_order", [True, False])
def test_an_op_closed_by_a_later_parent_reaches_the_running_max(batched, in_order):
    """A nested op whose parent begins after it: the parent's end closes it
    (``_close_nested``) with no change of its own in the touch log.  The running max is
    recomputed from the earliest op open at its last update too, so a window finds it
    (found by review), in its block's rows or, for a rank out of time order, its own."""
    from test_model_batch import _rows, _static

    t = 1_000_000
    statics = [_static("all_reduce"), _static("all_reduce", nested=True)]
    first = [(PHASE_CODE["begin"], t, 1, 1, -1, 2, 0), (PHASE_CODE["begin"], t + 10, 2, 0, 1, -1, 0),
             (PHASE_CODE["begin"], t + 20, 3, 0, 2, -1, 0)]
    if not in_order:  # (an op begun later recorded first)
        first.insert(0, (PHASE_CODE["begin"], t + 30, 4, 0, 3, -1, 0))
    m = TraceModel()
    m.batch_ranks = batched
    m.ingest([], [_rows(0, first, statics)])
    rt = m.ranks[0]
    nested = rt.index_of(1)
    assert rt._sorted == in_order and int(rt.parent[nested]) == rt.index_of(2)
    rt.window(t + 50, t + 60)  # (the running max computed, as a view or a query does)
    m.ingest([], [_rows(0, [(PHASE_CODE["end"], t + 100, 2, -1, -1, -1, 0)], statics)])
    assert int(rt.comp[nested]) == t + 100
    want = sorted(range(rt.n), key=lambda i: int(rt.begin[i]))  # (every op reaches into the window)
    assert rt.window(t + 50, t + 60).tolist() == want
    assert m.view().ranks[0].window(t + 50, t + 60).tolist() == want


def test_a_view_of_ranks_whose_every_open_op_has_a_hostile_end_lists_none_in_flight():
    """An op whose end came before its begin (a completion below 0) stays in the open set
    but is not in flight: the view lists none (found by review: it raised)."""
    from test_model_batch import _rows, _static

    statics = [_static("all_reduce")]
    m = TraceModel()
    m.ingest([], [_rows(0, [(PHASE_CODE["begin"], 100, 1, 0, 1, -1, 0), (PHASE_CODE["end"], -5, 1, -1, -1, -1, 0)],
                        statics)])
    assert m.ranks[0].open and int(m.ranks[0].comp[0]) < 0
    assert m.view().ranks[0].open == ()
