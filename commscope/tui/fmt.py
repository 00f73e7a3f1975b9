"""Short human formats for times, durations, sizes and rates used across the console."""

from __future__ import annotations

import time

from commscope.units import duration as duration  # the one duration formatter, re-exported
from commscope.units import size as size  # the one size formatter, re-exported for the console


def count(n: int, one: str = "", many: str = "") -> str:
    """'4,096', or with a noun '4,096 ranks' / '1 rank' (``many`` defaults to ``one`` + 's'):
    the one way the console writes a count, thousands separated ("4096 ranks" beside
    "4,095 ranks" in the findings read as two formats; helper-202)."""
    text = f"{n:,}"
    if not one:
        return text
    return f"{text} {one if n == 1 else many or one + 's'}"


def compact_size(n: float | None) -> str:
    """'291M', '31.2G': sizes for narrow table columns."""
    if n is None or n != n:
        return "–"
    for unit in ("B", "K", "M", "G", "T"):
        if abs(n) < 1000 or unit == "T":
            return f"{n:.0f}{unit}" if unit in ("B", "K", "M") or n >= 100 else f"{n:.1f}{unit}"
        n /= 1024
    return f"{n:.0f}T"


def rate(per_s: float) -> str:
    if per_s >= 1e6:
        return f"{per_s / 1e6:.1f}M/s"
    if per_s >= 1e3:
        return f"{per_s / 1e3:.1f}k/s"
    return f"{per_s:.0f}/s"


def clock(ns: int) -> str:
    """Wall-clock time of day with milliseconds (local time)."""
    t = ns / 1e9
    return time.strftime("%H:%M:%S", time.localtime(t)) + f".{int(ns // 1_000_000) % 1000:03d}"


def percent(x: float | None) -> str:
    if x is None or x != x:
        return "–"
    return f"{x:.0f}%"
