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


def test_a_cost_above_the_target_by_more_than_the_spread_is_a_miss():
    # As measured on an H200 with the Python recorder: +50 µs ± 15 µs against 8 µs.
    assert verdict(50.3 * US, 52.0 * US, 15.4 * US, 8.0) == "NO"
    assert verdict(3.3 * US, 7.7 * US, 22.0 * US, 8.0) == "?"  # within its spread of the target
    assert verdict(1.35 * US, 1.24 * US, 6.8 * US, 8.0) == "yes"


def test_the_overhead_bench_builds_the_native_recorder_it_measures(monkeypatch):
    """A bench is a launcher: its ranks never build, so without a build first it measured
    the Python recorder on a fresh machine (seen on a lent H200).  It builds, and says why
    when it cannot; asked for Python, it builds nothing."""
    from commscope.bench.overhead import _native_ready
    from commscope.record import native

    asked: list[bool] = []

    def load(build: bool = False, verbose: bool = False):
        asked.append(build)
        return None

    monkeypatch.setattr(native, "load", load)
    monkeypatch.setattr(native, "error", lambda: "no compiler")
    monkeypatch.setattr(native, "enabled", lambda: True)
    assert _native_ready(None) == "no compiler"
    assert asked == [True]
    assert _native_ready("python") is None
    assert asked == [True]
