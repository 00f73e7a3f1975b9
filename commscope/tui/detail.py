"""The detail pane: everything about the selected op, or the evidence of a finding (drawn by
``analysis.evidence.render``, as ``commscope check`` draws it)."""

from __future__ import annotations

import datetime as dt
import io
from collections.abc import Sequence
from typing import Any

import numpy as np
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.containers import VerticalScroll
from textual.widgets import Static

from commscope.analysis import Finding, evidence
from commscope.analysis.bandwidth import op_busbw
from commscope.analysis.evidence import kv as _kv
from commscope.analysis.evidence import stack as _stack
from commscope.analysis.findings import culprits_text, ranks_text
from commscope.analysis.model import TraceModel, untimed
from commscope.analysis.stacks import fold
from commscope.tui import palette
from commscope.tui.fmt import clock, count, duration, size
from commscope.visible import visible


def _shapes(shapes: Any, dtypes: Any) -> str:
    if not shapes:
        return ""
    parts = []
    for i, s in enumerate(shapes):
        dt = dtypes[i] if dtypes and i < len(dtypes) else ""
        parts.append(f"{list(s)} {dt}".strip())
    if len(parts) > 6:
        parts = parts[:6] + [f"… ({len(shapes)} tensors)"]
    return ", ".join(parts)


SPARK_BARS = "▁▂▃▄▅▆▇█"
_best_cache: dict[tuple, tuple[int, float, float | None]] = {}


def site_latency(model: TraceModel, rank: int, i: int, width: int = 36) -> tuple[Text, str] | None:
    """Durations of this rank's ops of the same op, group and call site over the trace, in
    time order, as a sparkline (the bar holding op ``i`` in yellow) and a summary; None if
    fewer than two such ops have timings."""
    rt = model.ranks[rank]
    s = model.sigs[int(rt.sig[i])]
    codes = [c for c, x in enumerate(model.sigs) if x.op == s.op and x.group == s.group and x.site == s.site
             and x.space == s.space]
    n = rt.n
    sig, begin, comp = rt.sig[:n], rt.begin[:n], rt.comp[:n]
    sel = np.isin(sig, codes) & (comp > 0) & ~untimed(rt.flags[:n], begin, comp)
    idx = np.flatnonzero(sel)
    if idx.shape[0] < 2:
        return None
    idx = idx[np.argsort(begin[idx], kind="stable")]
    d = (comp[idx] - begin[idx]).astype(np.float64)
    k = min(width, d.shape[0])
    chunks = np.array_split(np.arange(d.shape[0]), k)
    peaks = np.array([d[c].max() for c in chunks])  # the slowest of each bucket: spikes stay visible
    hi = float(peaks.max()) or 1.0
    here = np.flatnonzero(idx == i)
    mine = next((b for b, c in enumerate(chunks) if here.shape[0] and int(here[0]) in c), None)
    text = Text()
    for b, v in enumerate(peaks.tolist()):
        ch = SPARK_BARS[min(len(SPARK_BARS) - 1, int(v / hi * (len(SPARK_BARS) - 1) + 0.5))]
        text.append(ch, style="bold #ffd75f" if b == mine else "#6fa8dc")
    summary = (f"{count(d.shape[0], 'op')} · p50 {duration(float(np.median(d)))} · max {duration(float(d.max()))}"
               + (f" · this one {duration(float(d[here[0]]))}" if here.shape[0] else ""))
    return text, summary


BEST_OF = 4096  # instances the group's best busbw is taken from (the latest)


def group_best_busbw(model: TraceModel, rank: int, i: int) -> float | None:
    """The best busbw this op (same name) reached in its group, over its latest BEST_OF
    complete, timed instances.  Cached per model version, and for 2 s while a live model
    keeps changing (the op detail is redrawn on every update)."""
    import time

    from commscope.analysis.bandwidth import busbw_factor, instances, sig_size

    s = model.sig_of(rank, i)
    gi = model.coll.get((s.space, s.group))
    if gi is None or not s.flags & 8:  # COLL only
        return None
    key = (id(model), s.space, s.group, s.op)
    hit = _best_cache.get(key)
    if hit is not None and (hit[0] == model.version or time.monotonic() - hit[1] < 2.0):
        return hit[2]
    inst = instances(model, gi, last=BEST_OF)
    best = None
    if inst.n:
        timed = ~inst.untimed.any(axis=1) & (inst.latency > 0)
        codes = inst.sig[:, 0]
        for code in np.unique(codes[timed]).tolist():
            sg = model.sigs[code]
            S = sig_size(sg)
            if sg.op != s.op or not S:
                continue
            lat = inst.latency[timed & (codes == code)].astype(np.float64)
            bw = float((S / (lat.min() / 1e9)) * busbw_factor(sg.op, len(gi.members)))
            best = bw if best is None else max(best, bw)
    if len(_best_cache) > 256:
        _best_cache.clear()
    _best_cache[key] = (model.version, time.monotonic(), best)
    return best


def _meter(frac: float, width: int = 10) -> Text:
    """A bar of ``width`` cells filled to ``frac`` (0..1)."""
    full = max(0, min(width, int(round(frac * width))))
    return Text.assemble(("█" * full, "#3fa58f"), ("░" * (width - full), "grey35"))


def _bw(bytes_per_s: float) -> str:
    for unit, scale in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if bytes_per_s >= scale:
            return f"{bytes_per_s / scale:.2f} {unit}"
    return f"{bytes_per_s:.0f} B/s"


#: Rows of the "same op on the other ranks" table; more ranks are summarized, the last to
#: arrive listed (what the others waited on)
SAME_OP_ROWS = 16


def op_detail(model: TraceModel, rank: int, i: int, now: int) -> RenderableType:
    d = model.op(rank, i)
    title = Text(model.label(rank, i), style="bold")
    title.append(f"  rank {rank}", style="grey62")
    start = model.start_ns
    begin = d["begin_ns"]
    rows: list[tuple[str, Any]] = [
        ("group", f"{d.get('group')}  {ranks_text(model.groups.get(d.get('group'), []))}"),
        ("seq", d.get("seq")),
        ("peer", d.get("peer")),
        ("root", d.get("root")),
        ("reduce", d.get("redop")),
        ("inputs", _shapes(d.get("in_shapes"), d.get("in_dtypes"))),
        ("outputs", _shapes(d.get("out_shapes"), d.get("out_dtypes"))),
        ("bytes", f"in {size(d.get('in_bytes'))} · out {size(d.get('out_bytes'))}"
         if d.get("in_bytes") is not None or d.get("out_bytes") is not None else None),
        ("async", "yes" if d.get("async") else None),
        ("call site", model.sig_of(rank, i).where()),
        ("source", "PyTorch Flight Recorder (issued from C++)" if d.get("space") == 1 or d.get("src") == "fr" else None),
        ("begin", f"{clock(begin)}  (+{duration(begin - start)})"),
    ]
    rt = model.ranks[rank]
    no_timing = bool(untimed(rt.flags[i], rt.begin[i], rt.comp[i]))
    if d.get("end_ns") and not no_timing:
        rows.append(("returned", f"+{duration(d['end_ns'] - begin)}"))
    if d.get("wait_begin_ns"):
        rows.append(("wait()", f"+{duration(d['wait_begin_ns'] - begin)} → "
                     + (f"+{duration(d['wait_end_ns'] - begin)}" if d.get("wait_end_ns") else "still waiting")))
    if d.get("gpu_ns"):
        rows.append(("GPU time", duration(d["gpu_ns"])))
    if d.get("in_flight"):
        rows.append(("state", Text(f"in flight for {duration(now - begin)}", style="bold #e0a030")))
    elif no_timing:
        rows.append(("duration", Text("— no timing recorded (completed; Flight Recorder on Gloo or an old trace)",
                                      style="grey62")))
    elif d.get("complete_ns"):
        rows.append(("duration", duration(d["complete_ns"] - begin) + ("  (approx.)" if d.get("approx") else "")))
    bw = op_busbw(model, rank, i)
    if bw:
        rows.append(("bandwidth", f"algbw {_bw(bw.get('algbw', 0))} · busbw {_bw(bw.get('busbw', 0))}"))
        best = group_best_busbw(model, rank, i)
        if best:
            share = bw.get("busbw", 0) / best
            rows.append(("best bw", Text.assemble(f"busbw {_bw(best)}  ", _meter(share),
                                                     f" this op at {share * 100:.0f}%")))
    trend = site_latency(model, rank, i)
    if trend is not None:
        rows.append(("at site", Text.assemble(trend[0], "\n", (trend[1], "grey62"))))
    if d.get("exc"):
        rows.append(("raised", Text(d["exc"], style="#e05050")))
    parts: list[RenderableType] = [title, _kv(rows)]
    matches = model.matching(rank, i)
    if matches:
        everyone = dict(matches)
        everyone[rank] = i
        begins = {r: int(model.ranks[r].begin[j]) for r, j in everyone.items()}
        first, latest = min(begins.values()), max(begins.values())
        shown = sorted(everyone)
        title = "same op on the other ranks"
        if len(everyone) > SAME_OP_ROWS:  # (4,096 rows took Rich ~10 s to lay out, a frozen console: helper-165)
            late = sorted(everyone, key=lambda r: (-begins[r], r))[:SAME_OP_ROWS - 1]
            shown = late + ([rank] if rank not in late else [])
            title += f": the last {count(len(late))} of {count(len(everyone))} to arrive"
        parts.append(Text(title, style="bold grey70"))  # (a line of its own: a table's title wraps at its width)
        t = Table(box=None, padding=(0, 1), show_edge=False)
        for col in ("rank", "arrived", "state", "duration"):
            t.add_column(col, style="grey70" if col != "rank" else "bold")
        for r in shown:
            j = everyone[r]
            rt = model.ranks[r]
            comp = int(rt.comp[j])
            skew = begins[r] - first
            state = "done" if comp else "in flight"
            last = latest != first and begins[r] == latest
            dur = "—" if comp and untimed(rt.flags[j], rt.begin[j], rt.comp[j]) else \
                duration(comp - begins[r]) if comp else duration(now - begins[r])
            t.add_row(str(r) + (" ◀" if r == rank else ""), f"+{duration(skew)}" + (" (last)" if last else ""),
                      state, dur)
        if len(everyone) > SAME_OP_ROWS:
            skews = np.fromiter((b - first for b in begins.values()), dtype=np.int64, count=len(begins))
            flying = sum(not int(model.ranks[r].comp[j]) for r, j in everyone.items())
            parts.append(Text(f"{count(len(everyone), 'rank')} arrived over +{duration(latest - first)} (p50 "
                              f"+{duration(float(np.median(skews)))}, p99 +{duration(float(np.percentile(skews, 99)))}"
                              f"); {count(len(everyone) - flying)} done, {count(flying)} in flight", style="grey70"))
        missing = sorted(set(model.members(rank, i)) - set(everyone))  # a p2p op: its two ends
        if missing:
            t.caption = f"not entered by {ranks_text(missing)}"
            t.caption_style = "bold #e05050"
        parts.append(t)
    stack = _stack([fold(th.get("name"), th.get("frames")) for th in (d.get("stack") or [])
                     if th.get("op_thread")] or None)
    if stack is not None:
        parts.append(Text("captured stack", style="bold grey70"))
        parts.append(stack)
    return Group(*parts)


def finding_detail(f: Finding) -> RenderableType:
    head = Text()
    head.append(f"{palette.SEVERITY_ICON[f.severity]} {f.kind}", style=palette.SEVERITY_STYLE[f.severity])
    if f.group is not None:
        head.append(f" · {f.place}", style="grey70")
    parts: list[RenderableType] = [head, Text(f.message)]
    if f.culprits:
        parts.append(Text(culprits_text(f.culprits, ": "), style="bold #e05050"))
    parts += evidence.render(f)
    return Group(*parts)


class DetailPane(VerticalScroll):
    """Scrollable pane holding either an op's detail or a finding's evidence."""

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self.current: RenderableType = self.placeholder()
        self.body = Static(self.current)

    @staticmethod
    def placeholder() -> Text:
        return Text("select an op (←/→ on the timeline, or click) or a finding", style="grey50 italic")

    def compose(self):
        yield self.body

    def show(self, renderable: RenderableType, title: str) -> None:
        self.border_title = title
        self.current = renderable
        self.body.update(renderable)
        self.scroll_home(animate=False)

    def text(self, width: int = 100) -> str:
        """The pane's content as plain text (for tests and copy/paste)."""
        from rich.console import Console

        console = Console(width=width, record=True, file=io.StringIO())
        console.print(self.current)
        return console.export_text()


def warnings_detail(warnings: Sequence[str], total: int, losses: Sequence[str] = (),
                    problem: str | None = None) -> RenderableType:
    """What reading the store said (``FeedInfo.warnings``, the last of ``total``), oldest
    first: where events were lost or trimmed, and why; under what kept the trace from being
    read (``problem``) and what the header counts as skipped (``losses``,
    ``header.read_losses``), so the pane never says "nothing" where the header counts some."""
    parts: list[RenderableType] = []
    if problem:
        parts.append(Text(f"✖ {visible(problem)}", style="bold #e05050"))
    parts.extend(Text(f"▲ {visible(w)}", style="#e0a030") for w in losses)
    if not total:
        if not parts:
            return Text("the reader has said nothing: no event lost, trimmed or skipped, no reconnection",
                        style="grey50 italic")
        parts.append(Text("the store's reader said nothing more (no events lost by the store, no reconnection)",
                          style="grey50 italic"))
        return Group(*parts)
    if total > len(warnings):
        parts.append(Text(f"{count(total - len(warnings))} earlier warning(s) not kept here; the last "
                          f"{count(len(warnings))}:", style="grey70"))
    parts.extend(Text(f"▲ {visible(w)}", style="#e0a030") for w in warnings)
    return Group(*parts)


class HistoryTable:
    """The summarized history's rows (op, count, bytes, p50, max, failed) in the width they
    are drawn at: a table where it fits, else a card per op, its name on a line and its
    figures as "count 20,520" pairs, wrapped between pairs, never inside one.  A table alone
    was cut to "all_gather_into_…  …  85.…  …" in the detail pane at 120x40 and 80x24
    (helper-202)."""

    COLUMNS = ("op", "count", "bytes", "p50", "max", "failed")

    def __init__(self, rows: list[list[str]]):
        self.rows = rows

    def __rich_console__(self, console: Any, options: Any) -> Any:
        from rich.cells import cell_len

        width = options.max_width
        widths = [max(cell_len(c), *(cell_len(row[i]) for row in self.rows)) for i, c in enumerate(self.COLUMNS)]
        if sum(widths) + 2 * len(widths) <= width:  # (a cell of padding either side of each)
            t = Table(box=None, padding=(0, 1), show_edge=False, header_style="bold")
            for i, col in enumerate(self.COLUMNS):
                t.add_column(col, justify="left" if i == 0 else "right", no_wrap=True)
            for row in self.rows:
                t.add_row(*(Text(c) for c in row))
            yield t
            return
        for row in self.rows:
            yield Text(row[0], style="bold", overflow="fold")
            line = Text("  ")
            for col, value in zip(self.COLUMNS[1:], row[1:], strict=True):
                if not value:
                    continue
                pair = Text.assemble((col, "grey62"), " ", value)
                if line.cell_len > 2 and line.cell_len + 3 + pair.cell_len > width:
                    yield line
                    line = Text("  ")
                if line.cell_len > 2:
                    line.append(" · ", style="grey50")
                line.append_text(pair)
            yield line


def history_detail(rows: dict[str, dict[str, Any]], skipped_bytes: int, summarized_events: int,
                   skipped_events: int = 0, gone_events: int = 0) -> RenderableType:
    """The history the timeline does not hold: what retention summarized of the deleted
    segments (``analysis.report.summarized_history``), what the window did not read
    (``ReadStats.skipped_bytes``, and ``skipped_events`` of streams whose bytes are not known)
    and what before it is gone from the store (``gone_before_window``: trimmed by Redis maxlen)."""
    parts: list[RenderableType] = []
    if skipped_bytes or skipped_events:
        what = " and ".join(x for x in (size(skipped_bytes) if skipped_bytes else "",
                                        count(skipped_events, "event") if skipped_events else "") if x)
        parts.append(Text(f"{what} before the window not read (attach --since all, or replay "
                          "without --since, reads it)", style="grey70"))
    if gone_events:
        parts.append(Text(f"{count(gone_events)} older events before the window are gone from the store (trimmed by "
                          "maxlen, or lost): no read brings them back", style="grey70"))
    if not rows:
        parts.append(Text("no summarized history: retention deleted nothing" + (
            "" if skipped_bytes or skipped_events or gone_events else ", and the timeline holds the whole job"),
            style="grey50 italic"))
        return Group(*parts)
    parts.append(Text(f"retention summarized {count(summarized_events, 'event')} before deleting them:", style="bold"))
    first = min((r["first_ns"] for r in rows.values() if r["first_ns"]), default=0)
    last = max((r["last_ns"] for r in rows.values()), default=0)
    cells = []
    for name, r in rows.items():
        p50 = r["latency_p50_s"]
        cells.append([name, count(r["count"]), size(r["bytes"]), "—" if p50 is None else duration(p50 * 1e9),
                      duration(r["latency_max_s"] * 1e9), count(r["failed"]) if r["failed"] else ""])
    parts.append(HistoryTable(cells))
    if first:
        def day(ns: int) -> str:
            return dt.datetime.fromtimestamp(ns / 1e9, dt.timezone.utc).strftime("%Y-%m-%d %H:%M")

        parts.append(Text(f"from {day(first)} to {day(last)} UTC (latency: power-of-two buckets; commscope "
                          "report lists it too)", style="grey62"))
    return Group(*parts)
