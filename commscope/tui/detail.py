"""The detail pane: everything about the selected op, or the evidence of a finding."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.containers import VerticalScroll
from textual.widgets import Static

from commscope.analysis import Finding
from commscope.analysis.bandwidth import op_busbw
from commscope.analysis.errors import first_line
from commscope.analysis.model import untimed
from commscope.analysis.stacks import fold
from commscope.tui import palette as P
from commscope.tui.fmt import clock, duration, size


def _kv(rows: list[tuple[str, Any]]) -> Table:
    t = Table.grid(padding=(0, 1))
    t.add_column(style="grey62", no_wrap=True)
    t.add_column(overflow="fold")
    for k, v in rows:
        if v is None or v == "" or v == []:
            continue
        t.add_row(k, v if isinstance(v, Text) else str(v))
    return t


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


def _stack(threads: list[dict] | None, limit: int = 12) -> RenderableType | None:
    """Folded thread views (``analysis.stacks.fold``): the user's frames, innermost last, and
    what they are inside; torch's, commscope's and the standard library's frames folded."""
    if not threads:
        return None
    out = []
    for th in threads:
        frames = th.get("frames") or []
        text = Text()
        text.append(f"thread {th.get('thread') or th.get('name')}", style="bold")
        shown = frames[-limit:]
        if len(frames) > limit:
            text.append(f"\n  … {len(frames) - limit} outer frames", style="grey50")
        for k, f in enumerate(shown):
            line = f if isinstance(f, str) else f"{f[0]}:{f[1]} in {f[2]}"
            text.append(f"\n  {line}", style="bold #e0e0e0" if k == len(shown) - 1 else "grey70")
        if th.get("inside"):
            folded = th.get("folded")
            text.append(f"\n    └ inside {th['inside']}" + (f"  ({folded} frames of torch, commscope and the "
                                                             "standard library folded)" if folded else ""),
                        style="grey50")
        out.append(text)
    return Group(*out)


SPARK_BARS = "▁▂▃▄▅▆▇█"
_best_cache: dict[tuple, tuple[int, float, float | None]] = {}


def site_latency(model: Any, rank: int, i: int, width: int = 36) -> tuple[Text, str] | None:
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
    summary = (f"{d.shape[0]:,} ops · p50 {duration(float(np.median(d)))} · max {duration(float(d.max()))}"
               + (f" · this one {duration(float(d[here[0]]))}" if here.shape[0] else ""))
    return text, summary


BEST_OF = 4096  # instances the group's best busbw is taken from (the latest)


def group_best_busbw(model: Any, rank: int, i: int) -> float | None:
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


def op_detail(model: Any, rank: int, i: int, now: int) -> RenderableType:
    d = model.op(rank, i)
    title = Text(model.label(rank, i), style="bold")
    title.append(f"  rank {rank}", style="grey62")
    start = model.start_ns
    begin = d["begin_ns"]
    rows: list[tuple[str, Any]] = [
        ("group", f"{d.get('group')}  ranks {model.groups.get(d.get('group'), [])}"[:120]),
        ("seq", d.get("seq")),
        ("peer", d.get("peer")),
        ("root", d.get("root")),
        ("reduce", d.get("redop")),
        ("inputs", _shapes(d.get("in_shapes"), d.get("in_dtypes"))),
        ("outputs", _shapes(d.get("out_shapes"), d.get("out_dtypes"))),
        ("bytes", f"in {size(d.get('in_bytes'))} · out {size(d.get('out_bytes'))}"
         if d.get("in_bytes") is not None or d.get("out_bytes") is not None else None),
        ("async", "yes" if d.get("async") else None),
        ("call site", d.get("site")),
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
        first = min(begins.values())
        t = Table(title="same op on the other ranks", title_justify="left", title_style="bold grey70",
                  box=None, padding=(0, 1), show_edge=False)
        for col in ("rank", "arrived", "state", "duration"):
            t.add_column(col, style="grey70" if col != "rank" else "bold")
        for r in sorted(everyone):
            j = everyone[r]
            rt = model.ranks[r]
            comp = int(rt.comp[j])
            skew = begins[r] - first
            state = "done" if comp else "in flight"
            last = len(set(begins.values())) > 1 and begins[r] == max(begins.values())
            dur = "—" if comp and untimed(rt.flags[j], rt.begin[j], rt.comp[j]) else \
                duration(comp - begins[r]) if comp else duration(now - begins[r])
            t.add_row(str(r) + (" ◀" if r == rank else ""), f"+{duration(skew)}" + (" (last)" if last else ""),
                      state, dur)
        group_size = len(model.groups.get(d.get("group"), [])) or len(everyone)
        if len(everyone) < group_size:
            missing = sorted(set(model.groups.get(d.get("group"), [])) - set(everyone))
            t.caption = f"not entered by rank{'s' if len(missing) > 1 else ''} {missing}"
            t.caption_style = "bold #e05050"
        parts.append(t)
    stack = _stack([fold(th.get("name"), th.get("frames")) for th in (d.get("stack") or [])
                     if th.get("op_thread")] or None)
    if stack is not None:
        parts.append(Text("captured stack", style="bold grey70"))
        parts.append(stack)
    return Group(*parts)


def _brief(op: dict | None) -> str:
    """'all_reduce #61 (group 0) at train.py:19 in step' from an evidence op."""
    if not op:
        return "–"
    text = str(op.get("op", "?"))
    if op.get("seq") is not None:
        text += f" #{op['seq']}"
    if op.get("peer") is not None:
        text += f" {'to' if op.get('dir') == 'send' else 'from'} {op['peer']}"
    if op.get("group") is not None:
        text += f" (group {op['group']})"
    if op.get("site"):
        text += f" at {op['site']}"
    return text


def _table(title: str, columns: list[str], rows: list[list[Any]], bad: set[int] | None = None,
           key_col: int = 0) -> Table:
    t = Table(title=title, title_justify="left", title_style="bold grey70", box=None, padding=(0, 1),
              show_edge=False, header_style="grey62")
    for c in columns:
        t.add_column(c, overflow="fold")
    for row in rows:
        style = "bold #e05050" if bad and row[key_col] in bad else ""
        t.add_row(*[_cell(x) for x in row], style=style)
    return t


def _values(x: Any) -> list:
    """Evidence collections come as lists or as dicts keyed by rank: their items either way."""
    if isinstance(x, dict):
        return [dict(v, rank=v.get("rank", k)) if isinstance(v, dict) else v for k, v in x.items()]
    return list(x or [])


_WHY = {"request": "on request", "hang": "stuck in its op", "exception": "at its exception",
        "signal": "at its fatal signal"}


def _stacks_block(ev: dict) -> list[RenderableType]:
    """The culprits' and waiting ranks' stacks (evidence ``stacks`` and ``stack_info``), or
    why a rank has none."""
    out: list[RenderableType] = []
    stacks = ev.get("stacks") or {}
    info = ev.get("stack_info") or {str(r): {} for r in stacks}
    for r, note in info.items():
        role = note.get("role")
        head = Text(f"stack of rank {r}", style="bold #e05050" if role == "culprit" else "bold grey70")
        if role:
            head.append(f"  {role}", style="grey62")
        if r in stacks:
            if note.get("age_s") is not None:
                head.append(f" · {float(note['age_s']):.1f} s ago {_WHY.get(note.get('reason'), '')}", style="grey50")
            out.append(head)
            block = _stack(stacks[r])
            if block is not None:
                out.append(block)
        else:
            head.append(f": no stack: {note.get('missing', '?')}", style="grey50")
            out.append(head)
    return out


def _consequences(ev: dict) -> list[RenderableType]:
    cons = ev.get("consequences") or []
    if not cons:
        return []
    t = Text()
    for c in cons[:12]:
        t.append(f"  {c['kind']}", style="#e0a030")
        t.append(f"  {c['message']}\n", style="grey70")
    if len(cons) > 12:
        t.append(f"  … {len(cons) - 12} more\n", style="grey50")
    return [Text(f"consequences ({len(cons)}): folded into this finding", style="bold grey70"), t]


def _missing_ranks(f: Finding, ev: dict) -> list[RenderableType]:
    waited = {int(r): float(v) for r, v in (ev.get("waited_s") or {}).items()}
    parts: list[RenderableType] = []
    if waited:
        vals = sorted(waited.values())
        if vals[-1] - vals[0] < 0.1:
            line = f"ranks {', '.join(map(str, sorted(waited)))} waited {vals[-1]:.1f} s"
        else:
            line = ", ".join(f"{r}: {v:.1f} s" for r, v in sorted(waited.items()))
        parts.append(Text("waiting  ", style="grey62") + Text(line))
    if ev.get("op"):
        parts.append(Text("in       ", style="grey62") + Text(_brief(ev["op"])))
    acts = _values(ev.get("missing_activity"))
    if acts:
        parts.append(Text("never entered: what they do instead", style="bold grey70"))
    for act in acts:
        op = act.get("in_op") or act.get("last_completed_op")
        t = Text()
        t.append(f"rank {act.get('rank')}  ", style="bold #e05050")
        t.append(str(act.get("text", act.get("state"))))
        if op and op.get("site"):
            t.append(f"\n  at {op['site']}", style="grey70")
        if act.get("last_seq_in_group") is not None:
            t.append(f"\n  last collective of the group it ran: #{act['last_seq_in_group']}", style="grey70")
        parts.append(t)
    if ev.get("failed_on"):
        parts.append(Text(f"the waiting op raised: {_cell(ev['failed_on'])}", style="#e05050"))
    return parts


def _mismatch(f: Finding, ev: dict) -> list[RenderableType]:
    per = _values(ev.get("per_rank"))
    cols = [c for c in ("rank", "op", "in_shapes", "in_dtypes", "redop", "root", "state", "site")
            if any(c in row for row in per)]
    parts: list[RenderableType] = [
        _table("per rank at this (group, seq)", cols, [[row.get(c) for c in cols] for row in per], set(f.culprits))]
    if ev.get("differs"):
        parts.append(Text(f"differs in: {_cell(ev['differs'])}", style="bold #e0a030"))
    if ev.get("absent_ranks"):
        parts.append(Text(f"not there yet: ranks {_cell(ev['absent_ranks'])}", style="grey70"))
    if ev.get("later_mismatches"):
        parts.append(Text(f"{ev['later_mismatches']} later mismatched instances not shown", style="grey50"))
    return parts


def _deadlock(f: Finding, ev: dict) -> list[RenderableType]:
    chain = ev.get("chain") or []
    steps = chain.split(" → ") if isinstance(chain, str) else [
        s if isinstance(s, str) else _one_line(s) for s in chain]
    t = Text()
    for k, step in enumerate(steps):
        t.append(("   " if k == 0 else " → ") + step + ("\n" if k < len(steps) - 1 else ""), style="#e0a030")
    parts: list[RenderableType] = [Text("wait-for cycle", style="bold grey70"), t]
    cyc = _values(ev.get("cycle"))
    if cyc:
        parts.append(_table("blocked", ["rank", "op", "peer", "seq", "blocked"],
                            [[c.get("rank"), c.get("op"), c.get("peer"), c.get("seq"),
                              f"{float(c.get('blocked_s', 0)):.1f} s"] for c in cyc], set(f.culprits)))
    return parts


def _unmatched(f: Finding, ev: dict) -> list[RenderableType]:
    parts: list[RenderableType] = [Text(f"blocked: {_brief(ev.get('blocked_op'))}", style="#e0a030")]
    if ev.get("expected"):
        parts.append(Text(f"needs a matching {ev['expected']} from the peer", style="grey70"))
    peers = ev.get("peer_activity")
    peers = _values(peers) if not (isinstance(peers, dict) and "rank" in peers) else [peers]
    if peers:
        parts.append(_table("the peer instead", ["rank", "doing"], [[p.get("rank"), p.get("text")] for p in peers],
                            set(f.culprits)))
    return parts


def _dead(f: Finding, ev: dict) -> list[RenderableType]:
    act = ev.get("activity") or {}
    rows = [("how", "vanished while its peers' ops failed" if ev.get("how") == "vanished" else "heartbeat stopped"),
            ("silent for", f"{float(ev.get('silent_s', 0)):.1f} s (threshold {float(ev.get('threshold_s', 0)):.1f} s)"),
            ("was", act.get("text")), ("in", _brief(act.get("in_op")) if act.get("in_op") else None),
            ("last op", _brief(act.get("last_completed_op")) if act.get("last_completed_op") else None),
            ("host / pid", f"{ev.get('host', '?')} / {ev.get('pid', '?')}")]
    return [_kv(rows)]


def _crashed(f: Finding, ev: dict) -> list[RenderableType]:
    act = ev.get("activity") or {}
    rows = [("signal", Text(ev["signal"], style="#e05050") if ev.get("signal") else None),
            ("exception", Text(first_line(ev["exc"], 300), style="#e05050") if ev.get("exc") and not ev.get("signal")
             else None),
            ("where", ev.get("culprit_where")),
            ("in", _brief(act.get("in_op")) if act.get("in_op") else None),
            ("last op", _brief(act.get("last_completed_op")) if act.get("last_completed_op") and not act.get("in_op")
             else None),
            ("host / pid", f"{ev.get('host', '?')} / {ev.get('pid', '?')}")]
    return [_kv(rows)]


def _failed(f: Finding, ev: dict) -> list[RenderableType]:
    failed = _values(ev.get("failed"))
    parts: list[RenderableType] = [
        _table("failed on", ["rank", "op", "seq", "kind", "after", "exception"],
               [[x.get("rank"), x.get("op"), x.get("seq"), x.get("failure"), f"{float(x.get('after_s', 0)):.2f} s",
                 first_line(x.get("exc") or "", 100)] for x in failed])]
    blame = ev.get("blame") or {}
    parts.append(Text("blame  ", style="grey62") + Text(f"{blame.get('text', '?')}", style="bold #e0a030"))
    for c, act in (ev.get("culprit_activity") or {}).items():
        parts.append(Text(f"rank {c} is {act.get('text', '?')}", style="grey70"))
    if ev.get("later_failures"):
        parts.append(Text(f"{ev['later_failures']} later failed instances with the same blame", style="grey50"))
    return parts


def _straggler(f: Finding, ev: dict) -> list[RenderableType]:
    rows = [("arrived last", f"{float(ev.get('last_share', 0)) * 100:.0f}% of {ev.get('collectives', '?')} collectives"),
            ("median lateness", f"{float(ev.get('median_lateness_s', 0)) * 1e3:.1f} ms"),
            ("p90 lateness", f"{float(ev.get('p90_lateness_s', 0)) * 1e3:.1f} ms"),
            ("median latency", f"{float(ev.get('median_latency_s', 0)) * 1e3:.1f} ms"),
            ("other groups", _cell(ev.get("other_groups")) if ev.get("other_groups") else None)]
    return [_kv(rows)]


def _unwaited(f: Finding, ev: dict) -> list[RenderableType]:
    ops = _values(ev.get("ops"))
    return [_table(f"{ev.get('count', len(ops))} async ops never waited", ["op", "group", "seq", "site"],
                   [[o.get("op"), o.get("group"), o.get("seq"), o.get("site")] for o in ops[:50]])]


_BY_KIND = {"missing_ranks": _missing_ranks, "collective_mismatch": _mismatch, "p2p_deadlock": _deadlock,
            "unmatched_p2p": _unmatched, "dead_rank": _dead, "rank_crashed": _crashed, "op_failed": _failed,
            "straggler": _straggler, "unwaited_work": _unwaited}


def finding_detail(f: Finding) -> RenderableType:
    head = Text()
    head.append(f"{P.SEVERITY_ICON[f.severity]} {f.kind}", style=P.SEVERITY_STYLE[f.severity])
    if f.group is not None:
        head.append(f" · group {f.group}" + (f" #{f.seq}" if f.seq is not None else "") + (f" {f.op}" if f.op else ""),
                    style="grey70")
    parts: list[RenderableType] = [head, Text(f.message)]
    if f.culprits:
        parts.append(Text(f"culprit{'s' if len(f.culprits) > 1 else ''}: {', '.join(map(str, f.culprits))}",
                          style="bold #e05050"))
    ev = f.evidence or {}
    render = _BY_KIND.get(f.kind)
    try:
        parts += render(f, ev) if render else [_evidence_block(ev)]
        parts += _consequences(ev) + _stacks_block(ev)
    except Exception:  # evidence of an unexpected shape: still show it, plainly
        parts += [_evidence_block(ev)]
    return Group(*parts)


def _one_line(step: Any) -> str:
    if isinstance(step, dict):
        return " ".join(f"{k}={v}" for k, v in step.items() if k not in ("stack",))
    return str(step)


def _cell(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, list | tuple):
        return ", ".join(_cell(x) for x in v) if not all(isinstance(x, int) for x in v) else str(list(v))
    return str(v)


def _evidence_block(val: Any, depth: int = 0) -> RenderableType:
    if isinstance(val, dict):
        rows = []
        for k, v in val.items():
            if k in ("stack", "stacks", "stack_info", "consequences"):
                continue  # shown by _stacks_block and _consequences
            if isinstance(v, dict | list) and v and depth < 2 and not (isinstance(v, list) and all(
                    isinstance(x, int | float | str) for x in v)):
                rows.append((str(k), _evidence_block(v, depth + 1)))
            else:
                rows.append((str(k), _cell(v)))
        t = Table.grid(padding=(0, 1))
        t.add_column(style="grey62", no_wrap=True)
        t.add_column(overflow="fold")
        for k, v in rows:
            t.add_row(k, v)
        return t
    if isinstance(val, list):
        return Group(*[_evidence_block(v, depth + 1) for v in val[:32]])
    return Text(_cell(val))


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
