"""How the benchmarks judge and print figures: a pure part, tested directly."""

from __future__ import annotations

from commscope.bench.overhead import TARGET_US, verdict
from commscope.bench.stats import fmt_time

US = 1e-6


def test_negative_differences_read_as_times():
    assert fmt_time(-41.5 * US) == "-41.50 µs"
    assert fmt_time(-250e-9) == "-250 ns"
    assert fmt_time(1.29e-3) == "1.29 ms"


def test_an_added_cost_within_the_spread_is_neither_met_nor_missed():
    t = TARGET_US * US
    assert verdict(0.8 * t, 0.9 * t, 0.5 * t) == "yes"
    assert verdict(0.8 * t, 1.1 * t, 0.5 * t) == "NO"  # CPU counts as much as wall
    assert verdict(1.5 * t, 0.5 * t, 0.5 * t) == "NO"
    assert verdict(-14 * t, -10 * t, 80 * t) == "?"  # two ranks on two cores: ±233 µs
    assert verdict(5 * t, 5 * t, 20 * t) == "?"
