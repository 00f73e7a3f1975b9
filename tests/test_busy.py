"""The heatmap's count of busy ranks (``analysis/busy.py``): the compiled loop, numpy and a count
cell by cell agree, a rank counted once in a cell however many of its intervals cover it,
and a rank in several groups counted in each."""

from __future__ import annotations

import numpy as np
import pytest

from commscope import compiled
from commscope.analysis import busy
from commscope.tui import painter


def _by_hand(c0: np.ndarray, c1: np.ndarray, row: np.ndarray, groups: list[tuple[int, ...]],
             w: int) -> np.ndarray:
    """Each group's ranks busy in each cell, counted one cell at a time."""
    cover: dict[int, set[int]] = {}
    for a, b, r in zip(c0.tolist(), c1.tolist(), row.tolist(), strict=True):
        cover.setdefault(r, set()).update(range(a, b + 1))
    return np.array([[sum(c in cover.get(r, ()) for r in g) for c in range(w)] for g in groups],
                    np.int64).reshape(len(groups), w)


def _case(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[tuple[int, ...]], int]:
    rng = np.random.default_rng(seed)
    rows, w = int(rng.integers(1, 40)), int(rng.integers(1, 30))
    n = int(rng.integers(0, 200))
    row = rng.integers(0, rows, n)
    c0 = rng.integers(0, w, n)
    c1 = np.minimum(c0 + rng.integers(0, 4 if seed % 2 else w, n), w - 1)  # (short, or up to the window: in flight)
    # groups over the rows' ranks, some sharing ranks, some empty (the places are the ranks here)
    groups = [tuple(sorted(set(rng.integers(0, rows, int(rng.integers(0, 6))).tolist()))) for _ in range(5)]
    named = sorted({r for g in groups for r in g})
    keep = np.isin(row, named)
    return c0[keep], c1[keep], row[keep], groups, w


@pytest.mark.parametrize("seed", range(30))
def test_the_compiled_count_and_numpy_s_count_each_rank_once_a_cell_in_each_of_its_groups(seed: int) -> None:
    c0, c1, row, groups, w = _case(seed)
    members = painter._members(groups)
    place = np.array([members.place.get(r, -1) for r in range(int(row.max(initial=0)) + 1)], np.int64)
    at = place[row]  # (the intervals' rows as the places ``_members`` gives the ranks)
    want = _by_hand(c0, c1, row, groups, w)
    for fast in (True, False):
        got = busy.busy_counts(c0, c1, at, len(members.ranks), members.laid, members.first, members.first_group,
                               len(groups), w, compiled=fast)
        assert got.shape == (len(groups), w)
        assert np.array_equal(got, want), (fast, got, want)


def test_the_count_is_compiled_where_numba_is() -> None:
    pytest.importorskip("numba")
    assert busy._load() is not None
    assert "commscope.analysis.busy:_load" in compiled.LOADERS
