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


def t95(df: int) -> float:
    """Student's t for a two-sided 95% interval at ``df`` degrees of freedom (the
    Cornish-Fisher expansion about 1.96: within 1% from 5 on, exact in the limit)."""
    z = 1.959964
    df = max(1, df)
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


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
