"""Per-rank resource sparklines from ``sample`` events: GPU utilization and memory, or CPU
and RSS for CPU-only jobs (and the panel says why), so idle GPUs stand out next to busy ones.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from rich.segment import Segment
from rich.style import Style
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

from commscope.tui import palette
from commscope.tui.fmt import percent, size

LABEL = 7


def spark(values: np.ndarray, lo: float, hi: float, width: int) -> str:
    """The last ``width`` values as block characters scaled to [lo, hi]; gaps are blank."""
    v = values[-width:]
    out = []
    for x in v.tolist():
        if x != x:
            out.append(" ")
            continue
        frac = 0.0 if hi <= lo else (x - lo) / (hi - lo)
        out.append(palette.SPARK[max(1, min(8, round(frac * 8)))])
    return "".join(out).rjust(width)


class GpuPanel(ScrollView):
    DEFAULT_CSS = "GpuPanel { height: 1fr; }"

    def __init__(self, feed: Any, **kwargs: Any):
        super().__init__(**kwargs)
        self.feed = feed
        self.ranks: list[int] = []
        self.apart: frozenset[int] = frozenset()  # (foreign streams: rows last, marked)
        self.mode = "gpu"
        self.reason = ""

    def refresh_ranks(self) -> None:
        """The rows: the job's ranks, then the foreign streams (``TraceModel.kept_apart``:
        another job's or launch's) apart, last and marked, as the rank table and the
        timeline list them (before, rows like the job's, in rank order); whether the job
        uses GPUs is its own ranks' say."""
        m = self.feed.model
        with self.feed.lock:
            apart = m.kept_apart
            own = [r for r in m.rank_ids() if r not in apart]
            self.apart = apart
            self.ranks = own + sorted(apart)
            has_gpu = any(not np.all(np.isnan(m.samples(r)["gpu_util"])) for r in own or self.ranks
                          if m.samples(r)["gpu_util"].shape[0])
            errors = {e for r in own or self.ranks if (e := m.ranks[r].samples.gpu_error)}
        self.mode = "gpu" if has_gpu else "cpu"
        if not has_gpu:
            self.reason = (min(errors) if errors else "no GPU samples: a CPU-only job (no CUDA device in use)")
        self.virtual_size = Size(self.size.width, len(self.ranks) + 1)
        self.refresh()

    def render_line(self, y: int) -> Strip:
        width = self.scrollable_content_region.width or self.size.width  # (less a scrollbar's columns)
        ri = y + self.scroll_offset.y
        if ri == 0:
            if self.mode == "gpu":
                text = "GPU utilization · memory"
            else:
                text = f"CPU % · RSS  ({self.reason})"
            if len(text) > width:
                text = text[: max(0, width - 1)] + "…"
            return Strip([Segment(text, Style(color="grey62", italic=True))]).crop_extend(0, width, None)
        ri -= 1
        if ri >= len(self.ranks):
            return Strip.blank(width)
        r = self.ranks[ri]
        with self.feed.lock:
            s = self.feed.model.samples(r)
        avail = max(4, width - LABEL - 22)
        w1 = max(2, avail * 2 // 3)
        w2 = max(2, avail - w1)
        if self.mode == "gpu":
            a, b = s["gpu_util"], s["gpu_mem"]
            total = s["gpu_mem_total"]
            hi2 = float(np.nanmax(total)) if total.shape[0] and not np.all(np.isnan(total)) else float(np.nanmax(b) if b.shape[0] else 1)
            last_a = percent(a[-1] if a.shape[0] else None)
            last_b = size(b[-1] if b.shape[0] else None)
            s1, s2 = spark(a, 0, 100, w1), spark(b, 0, hi2, w2)
        else:
            a, b = s["cpu"], s["rss"]
            hi1 = max(100.0, float(np.nanmax(a)) if a.shape[0] and not np.all(np.isnan(a)) else 100.0)
            hi2 = float(np.nanmax(b)) if b.shape[0] and not np.all(np.isnan(b)) else 1.0
            last_a = percent(a[-1] if a.shape[0] else None)
            last_b = size(b[-1] if b.shape[0] else None)
            s1, s2 = spark(a, 0, hi1, w1), spark(b, 0, hi2, w2)
        idle = self.mode == "gpu" and a.shape[0] and a[-1] == a[-1] and a[-1] < 5
        label = Segment(f"⊘r{r}".ljust(LABEL), palette.FOREIGN_STYLE) if r in self.apart \
            else Segment(f"r{r}".ljust(LABEL), Style(bold=True))
        segs = [label,
                Segment(s1, Style(color="#e0a030" if idle else "#3fa58f")),
                Segment(f" {last_a:>4} ", Style(color="grey70")),
                Segment(s2, Style(color="#4f8fd6")),
                Segment(f" {last_b:>9}", Style(color="grey70"))]
        # cut and padded to the width: a shorter line would leave the last frame's cells there
        return Strip(segs).crop_extend(0, width, None)
