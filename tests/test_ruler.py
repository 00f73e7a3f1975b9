"""The timeline's time axis: round ticks whose labels read whole at any span."""

from __future__ import annotations

import re

import pytest

from commscope.tui.ruler import axis

S = 10**9
LABEL = re.compile(r"┆[+-]\d+(\.\d+)?(d|h|min|s|ms|µs|ns)$")


@pytest.mark.parametrize(("span_s", "width"), [(20, 80), (3600, 80), (6 * 3600, 80), (2 * 86400, 80),
                                               (2 * 86400, 189), (30 * 86400, 80), (400 * 86400, 189)])
def test_every_tick_label_reads_whole_and_in_order(span_s, width):
    _whole_and_in_order(axis(0, span_s * S / width, 0, width), width)


@pytest.mark.parametrize(("at_s", "span_s"), [(0.19, 0.0006), (2.5, 0.002), (3700, 0.5), (0.0004, 0.00002)])
def test_zoomed_in_far_from_the_start_the_labels_say_the_time_in_its_unit(at_s, span_s):
    """Zoomed in 190 ms from the trace's start a tick read "+190000µs" (helper-188): the
    label is in the unit of its size, to the step's precision ("+190.01ms")."""
    line = axis(int(at_s * S), span_s * S / 80, 0, 80)
    _whole_and_in_order(line, 80)
    labels = [x.rstrip() for x in re.findall(r"┆[^┆]*", line)]
    assert all(len(x) <= 12 for x in labels), labels
    if at_s == 0.19:
        assert any(x.startswith("┆+190.") and x.endswith("ms") for x in labels), labels


def _whole_and_in_order(line: str, width: int) -> None:
    """A replay of days: past 5,000 s a cell every step was closer than a label, and each
    label overwrote the one before it ("+10" for +10000 s, "+105" twice; helper-181).
    Every label is whole, its times increase, and the ticks are at least two apart."""
    assert len(line) == width
    labels = [x.rstrip() for x in re.findall(r"┆[^┆]*", line)]
    assert len(labels) >= 2, line
    for label in labels:
        assert LABEL.match(label), (label, line)
    unit = {"d": 86400, "h": 3600, "min": 60, "s": 1, "ms": 1e-3, "µs": 1e-6, "ns": 1e-9}
    times = [float(m.group(1)) * unit[m.group(2)] for m in (re.match(r"┆\+([\d.]+)(\D+)$", x) for x in labels)]
    assert times == sorted(times) and len(set(times)) == len(times), line
