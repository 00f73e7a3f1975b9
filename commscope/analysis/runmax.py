"""The running max of op ends (``pmax``) of many ranks in time order, brought up to date in
one compiled call per column block.

A rank whose begins came in time order keeps its running max in its block's ``pmax``
column, beside its op columns (``columns.RankTable``): rows ``[base, base + n)``, position
``i`` the max over ops ``0..i`` of their end (their completion; their begin while in
flight).  A window query bisects it for the first op that can reach into the window
(``columns._window``), so publishing a view of 16k changed ranks needs every one brought
up to date: rank by rank that was ~18 us of numpy calls a rank, here it is one loop.

Each rank is recomputed from the first op changed since it was last (``since``: the
earliest begin its touch log names, found by bisection) to its end.  The values are
written in place and never lowered where they were valid before (``valid`` rows): a
published view holds these rows, and a completion that fell (one inferred from a parent,
then its own) would otherwise break the order a reader bisects.  So ``pmax`` is an upper
bound of the running max, exact unless a completion fell, and the window filters its
candidates by their own ends: the same ops either way.  A reader bisecting while the rows
are rewritten lands between where the old and the new rows would send it (every value
only rises), so it still gets at least the ops the old rows gave.

Without numba the same is done with numpy, a rank at a time.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from commscope import compiled

I64_MIN = np.iinfo(np.int64).min

_kernel: Callable[..., None] | None = None


def update(begin: np.ndarray, comp: np.ndarray, pmax: np.ndarray, base: np.ndarray, n: np.ndarray,
           valid: np.ndarray, since: np.ndarray, compiled: bool = True) -> None:
    """Bring rows ``[base[j], base[j] + n[j])`` of ``pmax`` up to date for each rank ``j``
    of one block (its columns ``begin``, ``comp``, ``pmax``): ``valid[j]`` of its rows held
    the running max as of its last update, and ``since[j]`` is the earliest begin among its
    ops changed after that (I64_MIN: any).  ``compiled``: False to use numpy (the tests
    compare the two)."""
    kernel = _load() if compiled else None
    if kernel is not None:
        kernel(begin, comp, pmax, base, n, valid, since)
        return
    for b, k, v, s in zip(base.tolist(), n.tolist(), valid.tolist(), since.tolist(), strict=True):
        v = min(v, k)
        st = int(np.searchsorted(begin[b:b + v], s, side="left"))
        if st >= k:
            continue
        ends = ends_of(begin[b + st:b + k], comp[b + st:b + k])
        if st < v:
            np.maximum(ends[:v - st], pmax[b + st:b + v], out=ends[:v - st])
        if st:
            ends[0] = max(int(ends[0]), int(pmax[b + st - 1]))
        np.maximum.accumulate(ends, out=pmax[b + st:b + k])


def ends_of(begin: np.ndarray, comp: np.ndarray) -> np.ndarray:
    """Ops' ends as the running max counts them: the completion, or the begin while in
    flight (or where a hostile completion comes before it)."""
    return np.where((comp != 0) & (comp > begin), comp, begin)


def _update(begin: np.ndarray, comp: np.ndarray, pmax: np.ndarray, base: np.ndarray, n: np.ndarray,
            valid: np.ndarray, since: np.ndarray) -> None:
    """``update``'s loop (compiled by ``_load``)."""
    for j in range(base.shape[0]):
        b, k, s = base[j], n[j], since[j]
        v = min(valid[j], k)
        lo, hi = 0, v
        while lo < hi:  # the first op beginning at ``s`` or later
            mid = (lo + hi) >> 1
            if begin[b + mid] < s:
                lo = mid + 1
            else:
                hi = mid
        m = pmax[b + lo - 1] if lo > 0 else I64_MIN
        for i in range(lo, k):
            e = begin[b + i]
            c = comp[b + i]
            if c != 0 and c > e:
                e = c
            if i < v and pmax[b + i] > e:
                e = pmax[b + i]
            if e > m:
                m = e
            pmax[b + i] = m


def _load() -> Callable[..., None] | None:
    """The compiled loop (``compiled.jit``, on first use)."""
    global _kernel
    if _kernel is None:
        _kernel = compiled.jit(globals(), ("_update",), args=(
            "const int64[::1]", "const int64[::1]", "int64[::1]",  # begin, comp, pmax (written)
            "const int64[::1]", "const int64[::1]", "const int64[::1]", "const int64[::1]"))  # base, n, valid, since
    return _kernel
