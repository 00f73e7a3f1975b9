"""Headless diagnosis of a trace store or a directory of Flight Recorder dumps.

Exit 0: no error-level finding.  Exit 1: error-level findings.  Exit 2: bad input or usage.
Exit 3: commscope itself failed (a bug; its traceback is printed).

The trace is judged at its last timestamp, so a job killed while hung still shows the
hang that was in progress.  --hang-after defaults to the value the ranks recorded with
(else 30 s).  Damaged or truncated lines are skipped and reported as warnings.

A job that is attempt N > 0 of a torchrun run (``--max-restarts``: each attempt records a
job of its own, and the store's newest is the last attempt) has its earlier attempts in the
same store judged too (``restarted``; with --since, each read with the same window): each
is named in a warning with its first error finding and the command that shows it whole,
and in ``--json`` under ``restarts``.  They never change the exit code, which is the
attempt read's: a run that recovered exits 0.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from typing import TYPE_CHECKING, Any

from commscope.analysis import evidence
from commscope.analysis.diagnose import default_hang_after, judged
from commscope.analysis.findings import ERROR, Finding
from commscope.analysis.model import TraceModel
from commscope.analysis.ranks import ranges
from commscope.analysis.rankstate import stopped_by
from commscope.analysis.source import MAX_EARLIER, MAX_LISTED, load_trace, restarts
from commscope.commands import options, progress
from commscope.errors import UsageError
from commscope.redact import redact
from commscope.store import redact_store

if TYPE_CHECKING:
    from rich.text import Text

    from commscope.window import Since


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("store", nargs="?", default=None,
                   help="trace store (directory or redis://...) or Flight Recorder dump directory")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.add_argument("--hang-after", type=options.seconds, default=None, metavar="SECONDS",
                   help="how long a rank must wait before it counts as hung")
    options.add_since(p)
    options.add_max_memory(p)
    p.add_argument("--py-spy", action="store_true",
                   help="for a culprit running on this host whose Python threads cannot answer (native code "
                        "holding the GIL), take a native+Python stack dump with py-spy (pip install py-spy)")


def read_summary(stats: Any) -> dict[str, Any]:
    """What the reader skipped, for --json: damaged lines, invalid events by reason, store gaps."""
    return {"damaged": stats.corrupt, "invalid": stats.invalid,
            "invalid_by_reason": dict(stats.invalid_by_reason),
            "store_missing": sum(stats.missing_by_rank.values()), "trimmed": stats.trimmed,
            "summarized": stats.summarized, "before_window_bytes": stats.skipped_bytes,
            "before_window_events": stats.skipped_events, "gone_before_window": stats.gone_before_window}


def to_json(model: TraceModel, findings: list[Finding], warnings: list[str], hang_after: float,
            now: int, source: str, stats: Any = None, restart: dict[str, Any] | None = None) -> dict[str, Any]:
    apart = model.kept_apart  # (every count the job's own; the foreign streams' apart)
    out = {"ranks": model.world_size, "events": model.own_events(), "findings": [f.to_json() for f in findings],
           "warnings": warnings, "hang_after": hang_after, "now_ns": now, "source": source,
           "ops": model.own_ops(), "restarts": restart, "foreign_streams": len(apart),
           "foreign_events": model.events_of(apart), "foreign_ops": sum(model.n_ops(r) for r in apart)}
    if stats is not None:
        out["skipped"] = read_summary(stats)
    return out


# ---------------------------------------------------------------------- torchrun restarts
def restarted(store: Any, reader: Any, hang_after: float | None = None, model: TraceModel | None = None,
              since: Since | None = None, max_memory: int | None = None) -> dict[str, Any] | None:
    """When the job read (``model``: what was read of it) is attempt N > 0 of a torchrun run:
    its earlier attempts found in the same store, the newest ``MAX_LISTED`` named and the
    newest ``MAX_EARLIER`` of those judged as ``check`` judges a trace, the others counted
    (``untraced``: no job of theirs in the store; ``unlisted``: found but older, or not
    looked for), for ``--json``'s ``restarts``; None for any other job.  ``hang_after``: as
    given (None: each attempt's own recorded value).  ``since``: the window the job was
    read with (``--since``), each earlier attempt read with it too, so a check asked to
    read the tail of a restarted 16k-rank run does not read its earlier attempts whole
    (what ended each is found as a full read finds it; ``before_window_bytes`` says what
    was not read).  ``max_memory``: what the models may hold (``--max-memory``; None: any):
    an earlier attempt whose model would not fit beside ``model`` is not read, and says so."""
    r = restarts(store, reader, model)
    if r is None:
        return None
    earlier: list[dict[str, Any]] = []
    for i, e in enumerate(r.earlier):
        row: dict[str, Any] = {"attempt": e.number, "job": e.job, "store": redact_store(e.name)}
        if i >= MAX_EARLIER:
            row["note"] = f"not read: check judges the {MAX_EARLIER} newest earlier attempts"
        else:
            try:
                room = None if max_memory is None else max(0, max_memory - (model.nbytes() if model else 0))
                loaded, read, _ = load_trace(e.name, since=since, max_model=room)
            except UsageError as exc:
                row["note"] = f"could not be read: {exc}"
            else:
                _, findings = judged(loaded, hang_after if hang_after is not None else default_hang_after(loaded))
                errors = [f for f in findings if f.severity == ERROR]
                row.update(ranks=loaded.world_size, errors=len(errors), warnings=len(findings) - len(errors),
                           findings=[f.to_json() for f in findings])
                if since is not None:
                    row["before_window_bytes"] = read.stats.skipped_bytes
        earlier.append(row)
    return {"attempt": r.attempt, "run": r.run, "earlier": earlier, "untraced": r.untraced,
            "unlisted": r.unlisted, "listed": r.listed}


#: Characters of an earlier attempt's finding message a warning quotes at most.
QUOTED = 240


def restart_warnings(restart: dict[str, Any] | None) -> list[str]:
    """One line per earlier attempt listed: how it ended (its first error finding, or why
    there is none to show) and the command that checks it whole; then one line each for
    the attempts that left no trace and those not listed, counted."""
    if restart is None:
        return []
    lines = [f"this is attempt {restart['attempt']} of torchrun run {restart['run']}, which restarted: the findings "
             "and the exit code are this attempt's; its earlier attempts:"]
    for row in restart["earlier"]:
        n, job = row["attempt"], row["job"]
        named = f"attempt {n} (job {job})"
        see = f"; commscope check {shlex.quote(row['store'])}" if row.get("store") else ""
        if "findings" not in row:
            lines.append(f"{named}: {row['note']}{see}")
            continue
        errors = [f for f in row["findings"] if f["severity"] == ERROR]
        if not errors:
            lines.append(f"{named}: no error finding in its trace (what restarted it left no trace: a rank that "
                         f"exited with an error after its last op, a rank or host not recorded, the launcher){see}")
            continue
        first = errors[0]
        message = first["message"].split(". Then: ")[0]  # (the cause; its consequences are in the attempt's check)
        message = message if len(message) <= QUOTED else message[:QUOTED - 1] + "…"
        culprits = ranges(first["culprits"]) or "-"
        more = f" (and {len(errors) - 1} more error finding(s))" if len(errors) > 1 else ""
        lines.append(f"{named} failed: {first['kind']}, culprits {culprits}: {message}{more}{see}")
    if restart.get("untraced"):
        lines.append(f"{restart['untraced']:,} earlier attempt(s) left no trace in this store: they ended before "
                     "init_process_group returned, or were recorded elsewhere")
    if restart.get("unlisted"):
        lines.append(f"{restart['unlisted']:,} older attempt(s) not listed (check names the {MAX_LISTED} newest found)"
                     if restart.get("listed", True) else
                     f"{restart['unlisted']:,} earlier attempt(s) not looked for: this store cannot list its jobs")
    return lines


def main(args: argparse.Namespace) -> int:
    shown = progress.wanted(args.json)
    since = options.since_of(args)
    max_memory = options.max_memory_of(args)
    model, reader, warnings = progress.load(args.store, shown, since=since, max_memory=max_memory)
    hang_after = args.hang_after if args.hang_after is not None else default_hang_after(model)
    with progress.status(f"diagnosing {len(model.ranks):,} ranks", shown):
        now, findings = judged(model, hang_after)
    with progress.status("judging the run's earlier attempts", shown):
        restart = restarted(args.store, reader, args.hang_after, model, since, max_memory)
    warnings = [*warnings, *restart_warnings(restart)]
    if getattr(args, "py_spy", False):
        native_dumps(model, findings)
    if args.json:
        out = to_json(model, findings, warnings, hang_after, now, redact(reader.description), reader.stats, restart)
        sys.stdout.write(json.dumps(out, default=str) + "\n")
    else:
        render(model, findings, warnings, hang_after, redact(reader.description), restart=restart,
               window_ns=reader.window_start_ns())
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
    now, findings = judged(model, hang_after)
    restart = restarted(store, reader, model=model)
    warnings = [*warnings, *restart_warnings(restart)]
    if json:
        out = to_json(model, findings, warnings, hang_after, now, redact(reader.description), reader.stats, restart)
        stream = console.file if console is not None else sys.stdout
        stream.write(_json.dumps(out, default=str) + "\n")
        stream.flush()
    else:
        render(model, findings, warnings, hang_after, redact(reader.description), console=console, restart=restart)
    return 1 if any(f.severity == ERROR for f in findings) else 0


# ---------------------------------------------------------------------- py-spy
def native_dumps(model: TraceModel, findings: list[Finding], exe: str | None = None) -> None:
    """Add ``native_dump`` to the ``stack_info`` of each culprit without a Python stack that
    runs on this host: py-spy's native+Python dump of its pid, or why there is none.

    Only on request (``--py-spy``): py-spy attaches to the process with ptrace."""
    import socket

    from commscope.snapshot import pyspy

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
                else:
                    try:
                        done[rank] = pyspy.dump_text(pid, native=True, exe=exe)[-20000:]
                    except pyspy.DumpError as exc:
                        done[rank] = str(exc) if exc.kind == pyspy.MISSING else f"py-spy failed: {exc}"
            info["native_dump"] = done[rank]


# ---------------------------------------------------------------------- rich rendering
def render(model: TraceModel, findings: list[Finding], warnings: list[str], hang_after: float,
           source: str, console: Any = None, restart: dict[str, Any] | None = None,
           window_ns: int | None = None) -> None:
    """``restart``: the run's earlier attempts (``restarted``), which ``warnings`` name;
    ``window_ns``: where the read's window began (``--since``)."""
    con = console or options.stdout_console()
    for line in header(model, hang_after, source, con.width, window_ns):
        con.print(line, highlight=False)
    for w in warnings:
        con.print(options.warning(w), highlight=False)
    if not findings:
        if restart is not None:
            con.print(f"[green]no findings: attempt {restart['attempt']} looks healthy[/] (the run restarted "
                      f"{restart['attempt']} time(s): its earlier attempts are in the warnings above)")
        elif signals := stopped_by(model):  # (Ctrl-C or scancel on a job that ran well)
            con.print(f"[green]no findings: the trace looks healthy[/] until every rank was stopped by "
                      f"{' or '.join(signals)}")
        else:
            con.print("[green]no findings: the trace looks healthy[/]")
        return
    for f in findings:
        con.print(_panel(f))
    errors = sum(f.severity == ERROR for f in findings)
    con.print(f"[bold]{errors} error(s), {len(findings) - errors} warning(s)[/]")


def header(model: TraceModel, hang_after: float, source: str, width: int, window_ns: int | None = None) -> list[Text]:
    """What was read (``options.headline``); ``window_ns``: where the read's window began."""
    first, last = model.own_bounds()  # (the job's own: a foreign stream's counted apart)
    what = (f"{options.ranks_read(model.world_size, len(model.kept_apart))}, {model.own_events():,} events, "
            f"{model.own_ops():,} ops, {options.span_text(first, last, window_ns)}; hang_after {hang_after:g} s")
    return options.headline(source, what, width)


def _panel(f: Finding) -> Any:
    from rich.console import Group
    from rich.panel import Panel
    from rich.text import Text

    color = "red" if f.severity == ERROR else "yellow"
    title = Text.assemble((f.severity.upper(), f"{color} bold"), f" {f.kind}  {f.place}")  # (a group or op as named)
    parts: list[Any] = [Text(f.message)]
    parts.append(Text(f"culprits: {ranges(f.culprits) or '-'}   ranks: "
                      f"{ranges(f.ranks)}", style="bold"))
    parts.extend(evidence.render(f))
    return Panel(Group(*parts), title=title, title_align="left", border_style=color)
