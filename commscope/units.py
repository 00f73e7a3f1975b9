"""Numbers as people read them: bytes in KiB/MiB/GiB, and a resource sample in words.
The one formatter of sizes for the console, the findings and the benchmarks.  Torch-free leaf."""

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
