"""Where a value goes in each of many sorted runs of one column (``analysis/runsearch.py``):
the compiled loop and numpy agree with ``searchsorted`` run by run, equal values and empty
runs among them."""

from __future__ import annotations

import numpy as np
import pytest

from commscope import compiled
from commscope.analysis import runsearch


@pytest.mark.parametrize("seed", range(30))
def test_each_run_is_bisected_as_searchsorted_bisects_it(seed: int) -> None:
    rng = np.random.default_rng(seed)
    sizes = rng.integers(0, 12, int(rng.integers(1, 20)))
    runs = [np.sort(rng.integers(0, 50, k)) for k in sizes.tolist()]  # (repeated values among them)
    gaps = rng.integers(0, 3, len(runs))  # (rows between the runs: other ranks' in a block)
    column, at = [], []
    for run, gap in zip(runs, gaps.tolist(), strict=True):
        column.extend(rng.integers(-99, 99, gap).tolist())
        at.append(len(column))
        column.extend(run.tolist())
    col = np.array(column, np.int64)
    for x in (-1, 0, 17, 25, 49, 50, 1 << 62, 1 << 63, 1 << 64, -(1 << 63), -(1 << 63) - 1, 24.5, -0.5,
              np.int64(25), np.int32(-1)):
        want = np.array([np.searchsorted(run, x, side="left") for run in runs], np.int64)
        for fast in (True, False):
            got = runsearch.first_at_least(col, np.array(at, np.int64), sizes.astype(np.int64), x, compiled=fast)
            assert np.array_equal(got, want), (fast, x, got, want)


def test_the_search_is_compiled_where_numba_is() -> None:
    pytest.importorskip("numba")
    assert runsearch._load() is not None
    assert "commscope.analysis.runsearch:_load" in compiled.LOADERS


def test_a_numpy_integer_past_a_float_s_precision_is_searched_exactly() -> None:
    """A wall clock's nanoseconds (~1.8e18, past 2**53) as a numpy integer: not rounded
    through a float, which would land 256 ns off."""
    t = 1_764_000_000_123_456_789
    col = np.arange(t - 300, t + 300, dtype=np.int64)
    for x in (t, np.int64(t), np.int64(t + 100)):
        want = int(np.searchsorted(col, x, side="left"))
        for fast in (True, False):
            got = runsearch.first_at_least(col, np.zeros(1, np.int64), np.array([col.shape[0]]), x, compiled=fast)
            assert got.tolist() == [want], (fast, x, got, want)
