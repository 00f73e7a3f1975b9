"""Rank lists as short text: '0-3,7'."""

from __future__ import annotations


def ranges(rs: list[int] | list[tuple[int, int]], limit: int | None = 64) -> str:
    """'0-3,7' from ranks or from inclusive (first, last) ranges; at most ``limit`` ranges
    shown (None: all)."""
    if rs and not isinstance(rs[0], tuple):
        singles = sorted(rs)
        spans: list[tuple[int, int]] = []
        for r in singles:
            if spans and r == spans[-1][1] + 1:
                spans[-1] = (spans[-1][0], r)
            else:
                spans.append((r, r))
    else:
        spans = list(rs)  # type: ignore[arg-type]
    if limit is None:
        limit = len(spans)
    out = [str(a) if a == b else f"{a}-{b}" for a, b in spans[:limit]]
    if len(spans) > limit:
        out.append(f"... ({len(spans) - limit} more)")
    return ",".join(out)


def absent(present: list[int], ws: int) -> list[tuple[int, int]]:
    """Ranks in [0, ws) not in ``present`` (sorted), as inclusive ranges: O(len(present))."""
    out, lo = [], 0
    for r in present:
        if r >= ws:
            break
        if r > lo:
            out.append((lo, r - 1))
        lo = r + 1
    if lo < ws:
        out.append((lo, ws - 1))
    return out
