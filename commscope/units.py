"""Numbers as people read them: bytes in KiB/MiB/GiB, durations, and a resource sample in words.
The one formatter of sizes and of durations for the console, the findings and the benchmarks.  Torch-free leaf."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: Fields of a ``sample`` event that hold bytes, and those that hold percentages.
BYTE_FIELDS = frozenset({"rss", "gpu_mem", "gpu_mem_total"})
PERCENT_FIELDS = frozenset({"cpu", "gpu_util"})


def size(n: float | None) -> str:
    """'234.1 MiB' (binary units); '–' for no value."""
    if n is None or n != n:
        return "–"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def duration(ns: float) -> str:
    """'307 µs', '1.4 ms', '2.5 s', '3.0 min', '2.1 h': a duration in the unit that reads."""
    s = ns / 1e9
    if s < 0:
        return "-" + duration(-ns)
    if s < 1e-3:
        return f"{s * 1e6:.0f} µs"
    if s < 1:
        return f"{s * 1e3:.1f} ms"
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def sample_text(sample: Mapping[str, Any]) -> str:
    """'cpu 12%, rss 223.3 MiB, gpu_util 40%, gpu_mem 10.0 GiB': a sample's fields, each in
    its unit (the event's bookkeeping fields left out)."""
    parts = []
    for k, v in sample.items():
        if k in ("ts", "v", "type", "rank", "src"):
            continue
        if k in BYTE_FIELDS and isinstance(v, int | float):
            parts.append(f"{k} {size(v)}")
        elif k in PERCENT_FIELDS and isinstance(v, int | float):
            parts.append(f"{k} {v:.0f}%")
        else:
            parts.append(f"{k} {v}")
    return ", ".join(parts)
