"""Headless diagnosis of a trace store or a directory of Flight Recorder dumps.

Exit 0: no error-level finding.  Exit 1: error-level findings.  Exit 2: bad input or usage.
The trace is judged at its last timestamp, so a job killed while hung still shows the
hang that was in progress.  --hang-after defaults to the value the ranks recorded with
(else 30 s).  Damaged or truncated lines are skipped and reported as warnings.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from commscope.analysis.diagnose import default_hang_after, diagnose, trace_now
from commscope.analysis.errors import first_line
from commscope.analysis.findings import ERROR, Finding
from commscope.analysis.model import TraceModel
from commscope.analysis.ranks import ranges
from commscope.analysis.source import load_trace
from commscope.errors import UsageError
from commscope.store import redact


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("store", nargs="?", default=None,
                   help="trace store (directory or redis://...) or Flight Recorder dump directory")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.add_argument("--hang-after", type=float, default=None, metavar="SECONDS",
                   help="how long a rank must wait before it counts as hung")
    p.add_argument("--py-spy", action="store_true",
                   help="for a culprit running on this host whose Python threads cannot answer (native code "
                        "holding the GIL), take a native+Python stack dump with py-spy (pip install py-spy)")


def read_summary(stats: Any) -> dict[str, Any]:
    """What the reader skipped, for --json: damaged lines, invalid events by reason, store gaps."""
    return {"damaged": stats.corrupt, "invalid": stats.invalid,
            "invalid_by_reason": dict(stats.invalid_by_reason),
            "store_missing": sum(stats.missing_by_rank.values()), "trimmed": stats.trimmed}


def to_json(model: TraceModel, findings: list[Finding], warnings: list[str], hang_after: float,
            now: int, source: str, stats: Any = None) -> dict[str, Any]:
    out = {"ranks": model.world_size, "events": model.events, "findings": [f.to_json() for f in findings],
           "warnings": warnings, "hang_after": hang_after, "now_ns": now, "source": source,
           "ops": model.total_ops()}
    if stats is not None:
        out["skipped"] = read_summary(stats)
    return out


#: The shared loader (commands/report.py and export.py import it from here).
load = load_trace


def main(args: argparse.Namespace) -> int:
    if args.hang_after is not None and args.hang_after < 0:
        raise UsageError("--hang-after must be >= 0")
    model, reader, warnings = load(args.store)
    hang_after = args.hang_after if args.hang_after is not None else default_hang_after(model)
    now = trace_now(model)
    findings = diagnose(model, now, hang_after, wall_ns=time.time_ns())
    if getattr(args, "py_spy", False):
        native_dumps(model, findings)
    if args.json:
        out = to_json(model, findings, warnings, hang_after, now, redact(reader.description), reader.stats)
        sys.stdout.write(json.dumps(out, default=str) + "\n")
    else:
        render(model, findings, warnings, hang_after, redact(reader.description))
    return 1 if any(f.severity == ERROR for f in findings) else 0


def check_store(store: str, *, json: bool = False, console: Any = None) -> int:
    """Exactly ``commscope check STORE [--json]``: prints the report, returns its exit code
    (the headless demo's last step: ``scenarios.run_headless(check=check_store)``)."""
    import json as _json

    try:
        model, reader, warnings = load_trace(store)
    except UsageError as exc:
        print(f"commscope check: error: {exc}", file=sys.stderr)
        return 2
    hang_after = default_hang_after(model)
    now = trace_now(model)
    findings = diagnose(model, now, hang_after)
    if json:
        out = to_json(model, findings, warnings, hang_after, now, redact(reader.description))
        stream = console.file if console is not None else sys.stdout
        stream.write(_json.dumps(out, default=str) + "\n")
        stream.flush()
    else:
        render(model, findings, warnings, hang_after, redact(reader.description), console=console)
    return 1 if any(f.severity == ERROR for f in findings) else 0


# ---------------------------------------------------------------------- py-spy
PY_SPY_TIMEOUT = 20.0


def native_dumps(model: TraceModel, findings: list[Finding], exe: str | None = None) -> None:
    """Add ``native_dump`` to the ``stack_info`` of each culprit without a Python stack that
    runs on this host: py-spy's native+Python dump of its pid, or why there is none.

    Only on request (``--py-spy``): py-spy attaches to the process with ptrace."""
    import shutil
    import socket
    import subprocess

    exe = exe or shutil.which("py-spy")
    host = socket.gethostname()
    done: dict[int, str] = {}
    for f in findings:
        for r, info in (f.evidence.get("stack_info") or {}).items():
            if f.severity != ERROR or info.get("role") != "culprit" or "missing" not in info:
                continue
            rank = int(r)
            if rank not in done:
                meta = (model.ranks[rank].meta or {}) if rank in model.ranks else {}
                pid = meta.get("pid")
                if meta.get("host") != host or not isinstance(pid, int):
                    done[rank] = f"runs on {meta.get('host', 'another host')}: run py-spy dump --native there"
                elif exe is None:
                    done[rank] = "py-spy is not installed (pip install py-spy)"
                else:
                    try:
                        out = subprocess.run([exe, "dump", "--native", "--pid", str(pid)], capture_output=True,
                                             text=True, timeout=PY_SPY_TIMEOUT)
                        done[rank] = (out.stdout or out.stderr or f"py-spy exited {out.returncode}")[-20000:]
                    except (OSError, subprocess.TimeoutExpired) as exc:
                        done[rank] = f"py-spy failed: {exc}"
            info["native_dump"] = done[rank]


# ---------------------------------------------------------------------- rich rendering
def render(model: TraceModel, findings: list[Finding], warnings: list[str], hang_after: float,
           source: str, console: Any = None) -> None:
    from rich.console import Console

    con = console or Console()
    con.print(f"[bold]{source}[/]: {model.world_size} ranks, {model.events:,} events, {model.total_ops():,} ops, "
              f"{(model.end_ns - model.start_ns) / 1e9:.1f} s; hang_after {hang_after:g} s")
    for w in warnings:
        con.print(f"[yellow]warning:[/] {w}")
    if not findings:
        con.print("[green]no findings: the trace looks healthy[/]")
        return
    for f in findings:
        con.print(_panel(f))
    errors = sum(f.severity == ERROR for f in findings)
    con.print(f"[bold]{errors} error(s), {len(findings) - errors} warning(s)[/]")


def _panel(f: Finding) -> Any:
    from rich.console import Group
    from rich.panel import Panel
    from rich.text import Text

    color = "red" if f.severity == ERROR else "yellow"
    where = " ".join(x for x in (f"group {f.group}" if f.group is not None else "",
                                 f"#{f.seq}" if f.seq is not None else "", f.op or "") if x)
    title = f"[{color} bold]{f.severity.upper()}[/] {f.kind}  {where}"
    parts: list[Any] = [Text(f.message)]
    parts.append(Text(f"culprits: {ranges(f.culprits) or '-'}   ranks: "
                      f"{ranges(f.ranks)}", style="bold"))
    parts.extend(_evidence(f))
    return Panel(Group(*parts), title=title, title_align="left", border_style=color)


def _table(title: str, cols: list[str], rows: list[list[Any]]) -> Any:
    from rich.table import Table
    from rich.text import Text

    t = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    for c in cols:
        t.add_column(c, overflow="fold")
    for r in rows:
        t.add_row(*[Text("" if v is None else str(v)) for v in r])  # Text: exception texts hold [brackets]
    return t


def _stack_lines(stack: list | None, limit: int = 8) -> list[str]:
    """Folded thread views (``analysis.stacks.fold``): the user's frames, innermost last."""
    lines = []
    for th in stack or []:
        frames = th.get("frames") or []
        lines.append(f"  thread {th.get('thread')}:")
        if len(frames) > limit:
            lines.append(f"    … {len(frames) - limit} outer frames")
        lines.extend(f"    {fr}" for fr in frames[-limit:])
        folded = th.get("folded")
        if th.get("inside"):
            lines.append(f"      └ inside {th['inside']}" + (f" ({folded} frames of torch, commscope and the "
                                                             "standard library folded)" if folded else ""))
    return lines


def _stacks(f: Finding) -> list[Any]:
    """Every error finding: the culprits' and the waiting ranks' stacks, or why there is none."""
    from rich.text import Text

    ev = f.evidence
    out: list[Any] = []
    stacks = ev.get("stacks") or {}
    for r, info in (ev.get("stack_info") or {}).items():
        role = info.get("role", "")
        if r in stacks:
            when = f"captured {info.get('age_s')} s ago" if info.get("age_s") is not None else "captured"
            why = {"request": "on request", "hang": "stuck in its op", "exception": "at its exception",
                   "signal": "at its fatal signal"}.get(info.get("reason"), info.get("reason") or "")
            out.append(Text("\n".join([f"stack of rank {r} ({role}, {when} {why}):".replace(" )", ")"),
                                       *_stack_lines(stacks[r])]), style="dim" if role != "culprit" else ""))
        else:
            out.append(Text(f"rank {r} ({role}): no stack: {info.get('missing')}", style="dim"))
        if info.get("native_dump"):
            out.append(Text(f"py-spy dump of rank {r}:\n{info['native_dump'].rstrip()}"))
    return out


def _consequences(f: Finding) -> list[Any]:
    cons = f.evidence.get("consequences") or []
    if not cons:
        return []
    rows = [[c["kind"], f"{c.get('op') or ''} #{c.get('seq')}" if c.get("seq") is not None else c.get("op"),
             ranges(c.get("ranks") or []), c["message"][:160]] for c in cons[:12]]
    return [_table(f"consequences ({len(cons)})", ["kind", "op", "ranks", "what"], rows)]


def _evidence(f: Finding) -> list[Any]:
    from rich.text import Text

    ev = f.evidence
    out: list[Any] = []
    if f.kind == "missing_ranks":
        out.append(_table("waiting ranks", ["rank", "waited s"], [[r, s] for r, s in ev["waited_s"].items()]))
        rows = []
        for r, a in ev["missing_activity"].items():
            op = a.get("in_op") or a.get("last_completed_op") or {}
            rows.append([r, a.get("text"), op.get("site"), a.get("last_seq_in_group")])
        out.append(_table("ranks that never entered", ["rank", "doing instead", "site", "last seq in group"], rows))
    elif f.kind == "collective_mismatch":
        rows = [[r, d.get("op"), d.get("in_shapes"), d.get("in_dtypes"), d.get("redop"), d.get("root"),
                 d.get("site"), d.get("state")] for r, d in ev["per_rank"].items()]
        out.append(_table(f"per rank at #{f.seq} (differs: {', '.join(ev['differs']) or '?'})",
                          ["rank", "op", "shapes", "dtypes", "redop", "root", "site", "state"], rows))
        if ev.get("later_mismatches"):
            out.append(Text(f"{ev['later_mismatches']} later instance(s) of this group also differ"))
    elif f.kind == "p2p_deadlock":
        rows = [[s["rank"], s["op"], s.get("dir"), s.get("peer"), s.get("seq"), s.get("site"), s.get("blocked_s")]
                for s in ev["cycle"]]
        out.append(_table("wait-for cycle", ["rank", "op", "dir", "peer", "seq", "site", "blocked s"], rows))
    elif f.kind == "unmatched_p2p":
        b = ev["blocked_op"]
        out.append(Text(f"blocked: rank {b['rank']} {b['op']} {b.get('dir')} peer {b.get('peer')} "
                        f"#{b.get('seq')} at {b.get('site')} for {b.get('blocked_s')} s"))
        for p, a in ev["peer_activity"].items():
            out.append(Text(f"peer {p}: {a.get('text')}"))
    elif f.kind == "dead_rank":
        a = ev["activity"]
        how = "vanished while its peers' ops failed; " if ev.get("how") == "vanished" else ""
        out.append(Text(f"{how}silent for {ev['silent_s']} s (threshold {ev['threshold_s']} s); {a.get('text')}"))
        if ev.get("last_sample"):
            out.append(Text(f"last sample: {ev['last_sample']}", style="dim"))
    elif f.kind == "rank_crashed":
        a = ev["activity"]
        op = a.get("in_op") or a.get("last_completed_op") or {}
        what = ev.get("signal") and f"fatal signal: {ev['signal']}" or f"exception: {ev.get('exc')}"
        out.append(Text(f"{what}\n{'in' if a.get('in_op') else 'after'} {op.get('op', '-')} #{op.get('seq', '-')} "
                        f"(group {op.get('group', '-')}) at {op.get('site') or '?'}; host {ev.get('host', '?')} "
                        f"pid {ev.get('pid', '?')}"))
    elif f.kind == "op_failed":
        rows = [[r, d.get("op"), d.get("seq"), d.get("failure"), d.get("after_s"), first_line(d.get("exc") or "")]
                for r, d in ev["failed"].items()]
        out.append(_table("failed on", ["rank", "op", "seq", "kind", "after s", "exception"], rows))
        out.append(Text(f"blame ({ev['blame']['reason']}): {ev['blame']['text']}", style="bold"))
        if ev.get("later_failures"):
            out.append(Text(f"{ev['later_failures']} later failed instance(s) with the same blame"))
    elif f.kind == "straggler":
        rows = [[g["group"], g["collectives"], f"{g['last_share'] * 100:.0f}%", g["median_lateness_s"],
                 g["p90_lateness_s"], g["median_latency_s"]] for g in [ev, *(ev.get("other_groups") or [])]]
        out.append(_table("arrival", ["group", "collectives", "last", "median late s", "p90 late s",
                                      "median latency s"], rows))
    elif f.kind == "trace_incomplete":
        rows = [[r, d.get("dropped"), d.get("damaged"), d.get("invalid"), d.get("missing"),
                 "no exit" if d.get("no_exit") else ""] for r, d in ev["per_rank"].items()]
        out.append(_table("lost per rank", ["rank", "dropped", "damaged", "invalid", "store lost", "end"], rows))
        if ev.get("fr_ring_overwritten"):
            out.append(Text("Flight Recorder ring overwrites (not losses): " + ", ".join(
                f"rank {r}: {n:,}" for r, n in list(ev["fr_ring_overwritten"].items())[:16]), style="dim"))
    elif f.kind == "unwaited_work":
        rows = [[o.get("id"), o.get("op"), o.get("group"), o.get("seq"), o.get("site")] for o in ev["ops"]]
        out.append(_table("never waited", ["id", "op", "group", "seq", "site"], rows))
    else:
        out.append(Text(json.dumps(ev, indent=1, default=str)))
    if f.severity == ERROR:
        out.extend(_consequences(f))
        out.extend(_stacks(f))
    return out
