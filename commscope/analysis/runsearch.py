"""Where a value would go in each of many sorted runs of one column (``searchsorted``, left),
all at once: the heatmap finds the window of each of 16k ranks in its block's columns this
way every frame (``tui.painter._window_ops``).

The runs are bisected together, in one compiled loop.  With numpy that was a dozen array
operations for each of the ~20 halvings, each over every run (~2 ms a frame at 16,384
ranks, and up to 5 ms more where another thread took the interpreter at each of them: a
live console's feed).

Without numba the same is done with numpy.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable

import numpy as np

from commscope import compiled

I64_MIN, I64_MAX = int(np.iinfo(np.int64).min), int(np.iinfo(np.int64).max)

_kernel: Callable[..., None] | None = None


def first_at_least(column: np.ndarray, at: np.ndarray, n: np.ndarray, x: int, compiled: bool = True) -> np.ndarray:
    """For each run ``column[at[j]:at[j] + n[j]]`` (ascending), where ``x`` would go in it:
    the first position whose value is at least ``x`` (``n[j]``: none).  ``compiled``: False
    to use numpy (the tests compare the two)."""
    out = np.zeros(n.shape[0], np.int64)
    kernel = _load() if compiled else None
    if kernel is not None and column.dtype == np.int64:
        try:
            x = operator.index(x)  # (exact: numpy's integers too, which ``math.ceil`` takes through a float)
        except TypeError:
            x = math.ceil(x)  # (an integer column's first value at least x is its first at least x's ceiling)
        if x > I64_MAX:
            return n.astype(np.int64, copy=True)
        if x > I64_MIN:  # (at most the least int64: every run's start, as ``out`` says)
            kernel(np.ascontiguousarray(column), np.ascontiguousarray(at, np.int64),
                   np.ascontiguousarray(n, np.int64), x, out)
        return out
    lo, hi = out, n.astype(np.int64, copy=True)
    last = column.shape[0] - 1
    while True:
        going = lo < hi
        if not going.any():
            return lo
        mid = (lo + hi) >> 1
        below = column[np.minimum(at + mid, last)] < x
        lo = np.where(going & below, mid + 1, lo)
        hi = np.where(going & ~below, mid, hi)


def _search(column: np.ndarray, at: np.ndarray, n: np.ndarray, x: int, out: np.ndarray) -> None:
    """``first_at_least``'s loop (compiled by ``_load``)."""
    for j in range(at.shape[0]):
        a = at[j]
        lo, hi = 0, n[j]
        while lo < hi:
            mid = (lo + hi) >> 1
            if column[a + mid] < x:
                lo = mid + 1
            else:
                hi = mid
        out[j] = lo


def _load() -> Callable[..., None] | None:
    """The compiled loop (``compiled.jit``, on first use)."""
    global _kernel
    if _kernel is None:
        _kernel = compiled.jit(globals(), ("_search",), args=(
            "const int64[::1]", "const int64[::1]", "const int64[::1]", "int64", "int64[::1]"))  # ..., out (written)
    return _kernel
