"""``commscope bench SUITE``: benchmarks that measure ratios side by side in one run.

Each suite is a module here with ``add_arguments(parser)`` and ``run(args) -> int``,
and a module docstring whose first line is the suite's one-line description.
"""

from __future__ import annotations

SUITES: dict[str, str] = {
    "overhead": "commscope.bench.overhead",
    "store": "commscope.bench.store",
    "varlen": "commscope.bench.varlen",
    "analysis": "commscope.bench.analysis",
    "large": "commscope.bench.large",
    "scale": "commscope.bench.scale",
    "tui": "commscope.bench.tui",
    "fuzz": "commscope.bench.fuzz",
    "deaths": "commscope.bench.deaths",
    "redact": "commscope.bench.redact",
    "snapshot": "commscope.bench.snapshot",
}
