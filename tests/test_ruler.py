"""The timeline's time axis: round ticks whose labels read whole at any span."""

from __future__ import annotations

import re

import pytest

from commscope.tui.ruler import axis

S = 10**9
LABEL = re.compile(r"┆[+-]\d+(\.\d)?(d|h|min|s|ms|µs|ns)$")


@pytest.mark.parametrize(("span_s", "width"), [(20, 80), (3600, 80), (6 * 3600, 80), (2 * 86400, 80),
                                               (2 * 86400, 189), (30 * 86400, 80), (400 * 86400, 189)])
def test_every_tick_label_reads_whole_and_in_order(span_s, width):
    """A replay of days: past 5,000 s a cell every step was closer than a label, and each
    label overwrote the one before it ("+10" for +10000 s, "+105" twice; helper-181).
    Every label is whole, its times increase, and the ticks are at least two apart."""
    line = axis(0, span_s * S / width, 0, width)
    assert len(line) == width
    labels = [x.rstrip() for x in re.findall(r"┆[^┆]*", line)]
    assert len(labels) >= 2, line
    for label in labels:
        assert LABEL.match(label), (label, line)
    unit = {"d": 86400, "h": 3600, "min": 60, "s": 1, "ms": 1e-3, "µs": 1e-6, "ns": 1e-9}
    times = [float(m.group(1)) * unit[m.group(2)] for m in (re.match(r"┆\+([\d.]+)(\D+)$", x) for x in labels)]
    assert times == sorted(times) and len(set(times)) == len(times), line
