"""The time window a reader is asked for: ``--since``.

``--since`` takes a duration back from the trace's end (``90s``, ``10m``, ``2h``, ``1h30m``: the
end is the job's newest write, so a live job's is now), a wall-clock time (``2026-11-26T14:00``,
``14:00`` today, UTC unless it says otherwise), or ``all``.  A reader asked for a window
starts each rank's stream at the segment holding its start (``store/segments.py``): what
came before is not read, and says so; the summaries retention kept are read whatever the
window.  Torch-free, a format: the commands and the console parse with it.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from typing import NamedTuple

#: Units of a duration, in seconds (``--retain`` ages too; ``--since`` also takes ``m`` for
#: minutes, which ``--retain`` refuses as ambiguous: a size or an age)
DURATION_UNITS = {"s": 1, "sec": 1, "min": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_SECONDS = {**DURATION_UNITS, "m": 60}
_UNIT = "|".join(sorted(_SECONDS, key=len, reverse=True))  # (longest first: "min" before "m")
_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(" + _UNIT + r")", re.IGNORECASE)
#: one duration or several summed: 90s, 10m, 1h30m, 2d 12h (helper-163: "1h30m" was refused)
_DURATION = re.compile(r"^\s*(?:(?:\d+(?:\.\d+)?)\s*(?:" + _UNIT + r")\s*)+$", re.IGNORECASE)


class Since(NamedTuple):
    """A window's start: ``ago_s`` before the trace's end, or at ``at_ns``."""

    ago_s: float | None = None
    at_ns: int | None = None

    def start_ns(self, end_ns: int) -> int:
        """The window's start for a trace that ends at ``end_ns``."""
        if self.at_ns is not None:
            return self.at_ns
        return end_ns - int((self.ago_s or 0) * 1e9)

    def describe(self) -> str:
        if self.at_ns is not None:
            return f"since {dt.datetime.fromtimestamp(self.at_ns / 1e9, dt.timezone.utc):%Y-%m-%d %H:%M:%S} UTC"
        s = self.ago_s or 0
        for unit, n in (("d", 86400), ("h", 3600), ("min", 60)):
            if s >= n and s % n == 0:
                return f"the last {s / n:g} {unit}"
        return f"the last {s:g} s"


def parse_since(text: str | None, now: dt.datetime | None = None) -> Since | None:
    """``--since``'s value: None for everything (``all``, or not given); ValueError when
    unreadable or empty (``--since "$WINDOW"`` with the variable unset read a week-long
    job whole, as ``all``)."""
    if text is None or text.strip().lower() == "all":
        return None
    if not text.strip():
        raise ValueError("cannot read --since '': empty; give a duration back from the trace's end (90s, 10m, 2h), "
                         "a UTC time (14:00, 2026-11-26T14:00) or all")
    m = _DURATION.match(text)
    if m and math.isfinite(ago := sum(float(n) * _SECONDS[unit.lower()] for n, unit in _PART.findall(text))) \
            and 0 < ago < 1e12:
        return Since(ago_s=ago)  # (a duration past ~30,000 years, or inf, is no window: an internal error before)
    if m and not ago:  # ("0" is refused as no duration: "0s" read as good as nothing, helper-204)
        raise ValueError(f"cannot read --since {text!r}: a window of no time; give a duration back from the trace's "
                         "end (90s, 10m, 2h) or all")
    if m:
        raise ValueError(f"cannot read --since {text!r}: a duration too large")
    now = now or dt.datetime.now(dt.timezone.utc)
    t = text.strip()
    try:
        if re.fullmatch(r"\d{1,2}:\d{2}(:\d{2})?", t):  # a time today
            clock = dt.time.fromisoformat(t if t.count(":") == 2 else t + ":00")
            when = dt.datetime.combine(now.date(), clock, tzinfo=dt.timezone.utc)
        else:
            when = dt.datetime.fromisoformat(t)
            if when.tzinfo is None:
                when = when.replace(tzinfo=dt.timezone.utc)
    except ValueError:
        raise ValueError(f"cannot read --since {text!r}: give a duration back from the trace's end (90s, 10m, 2h, "
                         "1h30m), a UTC time (14:00, 2026-11-26T14:00) or all") from None
    return Since(at_ns=int(when.timestamp() * 1e9))
