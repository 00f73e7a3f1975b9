"""How many ranks of each group are busy in each cell: the count a heatmap and collapsed rows
are coloured by (``tui.painter.count_levels``), in one compiled loop.

A rank is counted once in a cell however many of its intervals cover it, so the count
needs every rank's coverage of the cells, a (ranks, cells) table: with numpy that is a
difference array per rank, two ``bincount``s, a ``cumsum`` and a ``reduceat`` over 16k
ranks x the cells counted, ~5-90 ms a frame at 16,384 ranks (the most where a frame counts
many cells: a page turned, an old op in flight).  The loop writes each row's difference
array and sums each group's rows as it runs along them: ~1 ns a cell of the groups' rows,
and an interval's cost whatever its length (ops in flight span the window).

Without numba the same is done with numpy.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from commscope import compiled

_kernel: Callable[..., None] | None = None


def busy_counts(c0: np.ndarray, c1: np.ndarray, row: np.ndarray, rows: int, laid: np.ndarray,
                first: np.ndarray, first_group: np.ndarray, groups: int, w: int,
                compiled: bool = True) -> np.ndarray:
    """(groups, w): per cell, how many of each group's ranks one of the intervals of cells
    [c0, c1] of their row (0 <= c0 <= c1 < w, row < rows) covers.  ``laid``: the rows of
    the groups' members, group after group; ``first``: where each group with members
    starts in it, ``first_group``: which group that is.  ``compiled``: False to use numpy
    (the tests compare the two)."""
    out = np.zeros((groups, w), np.int64)
    if not first.shape[0] or not w:
        return out
    kernel = _load() if compiled else None
    if kernel is not None:
        diff = np.zeros((rows, w + 1), np.int32)
        kernel(*(np.ascontiguousarray(a, np.int64) for a in (c0, c1, row, laid, first, first_group)), diff, out)
        return out
    k = row.astype(np.int64) * (w + 1)
    n = rows * (w + 1)
    diff = np.bincount(c0 + k, minlength=n) - np.bincount(c1 + k + 1, minlength=n)
    table = diff.reshape(rows, w + 1)[:, :w].cumsum(axis=1) > 0
    out[first_group] = np.add.reduceat(table[laid], first, axis=0, dtype=np.int64)
    return out


def _count(c0: np.ndarray, c1: np.ndarray, row: np.ndarray, laid: np.ndarray, first: np.ndarray,
           first_group: np.ndarray, diff: np.ndarray, out: np.ndarray) -> None:
    """``busy_counts``' loop (compiled by ``_load``): ``diff`` zeros of (rows, w + 1), each
    row's difference array (an interval +1 at its first cell, -1 past its last: linear in
    the intervals, however many cells each covers), ``out`` zeros of (groups, w) to count in."""
    w = out.shape[1]
    for j in range(c0.shape[0]):
        r = row[j]
        diff[r, c0[j]] += 1
        diff[r, c1[j] + 1] -= 1
    k = first.shape[0]
    for q in range(k):
        end = first[q + 1] if q + 1 < k else laid.shape[0]
        g = first_group[q]
        for i in range(first[q], end):
            r = laid[i]
            covering = 0
            for c in range(w):
                covering += diff[r, c]
                if covering > 0:
                    out[g, c] += 1


def _load() -> Callable[..., None] | None:
    """The compiled loop (``compiled.jit``, on first use)."""
    global _kernel
    if _kernel is None:
        _kernel = compiled.jit(globals(), ("_count",), args=(
            "const int64[::1]", "const int64[::1]", "const int64[::1]",  # c0, c1, row
            "const int64[::1]", "const int64[::1]", "const int64[::1]",  # laid, first, first_group
            "int32[:, ::1]", "int64[:, ::1]"))  # diff, out (written)
    return _kernel
