"""Small statistics helpers shared by the benchmark suites."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from commscope.units import size


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def quantile(xs: Sequence[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def fmt_time(seconds: float) -> str:
    if seconds != seconds:
        return "n/a"
    if seconds < 0:  # (a difference of medians can be)
        return "-" + fmt_time(-seconds)
    if seconds < 1e-6:
        return f"{seconds * 1e9:.0f} ns"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.2f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


fmt_bytes = size  # the one size formatter (commscope.units), under the benchmarks' name
