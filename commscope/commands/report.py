"""Summary tables per op, group and rank: count, bytes, latency p50/p99, algbw/busbw
(nccl-tests definitions, group size), async wait, arrival skew; and the call sites
where ranks wait most.  Accepts trace stores and Flight Recorder dumps.

The tables fit the terminal (80 columns in a pipe or a CI log): columns are dropped,
least useful first, until they fit, never truncated; ``--wide`` keeps every column
(the lines then run past the terminal's width).  ``--json`` and ``--csv`` for tools.

A job of more than 32 ranks lists 16: the culprits its findings name (as ``check`` finds
them), then the ranks furthest from the rest (an ending or a count few ranks share: a rank
that died, ran an op fewer or raised; then the time furthest from all ranks' median), and
that median; one of more than 32 groups, 16: the findings' groups, then those with ops that
raised, then where ranks waited most.  ``--all`` lists every rank and group; ``--json`` and
``--csv`` hold them all.

A job that is attempt N > 0 of a torchrun run that restarted says so in a warning naming
each earlier attempt's job in the same store (``restarts`` in ``--json``): the tables are
this attempt's; ``commscope check`` says how the earlier ones ended.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import shlex
import sys
import textwrap
from typing import TYPE_CHECKING, Any, NamedTuple

from commscope.analysis import snapshots
from commscope.analysis.report import compute_report, group_row, median_row, unusual_ranks, waited_groups
from commscope.bench.stats import fmt_bytes, fmt_time
from commscope.commands import options
from commscope.optable import OPS, P2P
from commscope.redact import redact
from commscope.store import redact_store

if TYPE_CHECKING:
    from commscope.analysis.model import TraceModel

NONE = "—"  # no value: no timed op, or nothing to measure
SEP = "  "
#: A job of up to this many ranks (groups) lists every one; a wider one, the ``SHOWN`` ranks
#: that matter most (``analysis.report.unusual_ranks``: the findings' culprits, then those
#: furthest from the rest) and their median, the ``SHOWN`` groups (``waited_groups``: the
#: findings', then those ranks waited in most), unless --all
WHOLE = 32
SHOWN = 16
MEDIAN = "median"  # the key of the row of every rank's medians


class Column(NamedTuple):
    """One table column.  ``priority``: a lower one is dropped first when the table does not fit;
    ALWAYS is never dropped."""

    header: str
    key: str  # key in the report's row
    kind: str  # formatter: n count, n0 count shown only when non-zero, b bytes, t time, bw bandwidth, s text
    priority: int


ALWAYS = 9
#: Counts of ops that could not be measured or failed, at the end of every table.
_PROBLEM_COLS = [Column("untimed", "untimed", "n0", 8), Column("failed", "failed", "n0", ALWAYS)]
_STAT_COLS = [
    Column("count", "count", "n", ALWAYS),
    Column("bytes", "bytes", "b", 8),
    Column("lat p50", "latency_p50_s", "t", ALWAYS),
    Column("lat p99", "latency_p99_s", "t", 7),
    Column("algbw", "algbw_p50", "bw", 2),
    Column("busbw", "busbw_p50", "bw", 6),
    Column("wait", "wait_s", "t", 5),
    Column("async wait", "async_wait_s", "t", 3),
    Column("skew p50", "skew_p50_s", "t", 4),
    Column("skew p99", "skew_p99_s", "t", 1),
    *_PROBLEM_COLS,
]
_RANK_COLS = [
    Column("ops", "count", "n", ALWAYS),
    Column("summarized", "summarized", "n0", 7),  # (ops of deleted segments: a trace with history only)
    Column("bytes", "bytes", "b", 6),
    Column("busy", "busy_s", "t", 4),
    Column("op p50", "latency_p50_s", "t", 7),
    Column("op p99", "latency_p99_s", "t", 3),
    Column("waiting", "wait_s", "t", 8),
    Column("async wait", "async_wait_s", "t", 5),
    *_PROBLEM_COLS,
    Column("end", "end", "s", ALWAYS),
]
_SITE_COLS = [Column("waiting", "waiting", "t", ALWAYS), Column("ops", "ops", "n", ALWAYS)]
_HISTORY_COLS = [
    Column("count", "count", "n", ALWAYS),
    Column("bytes", "bytes", "b", 8),
    Column("lat p50", "latency_p50_s", "t", ALWAYS),
    Column("lat p99", "latency_p99_s", "t", 6),
    Column("lat max", "latency_max_s", "t", 7),
    Column("unfinished", "unfinished", "n0", 5),
    Column("failed", "failed", "n0", ALWAYS),
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("store", nargs="?", default=None,
                   help="trace store (directory or redis://...) or Flight Recorder dump directory")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="the tables as one JSON object")
    out.add_argument("--csv", action="store_true",
                     help="the per op, group and rank tables as CSV (a 'table' column names each row's table)")
    p.add_argument("--wide", action="store_true",
                   help="every column, however wide the terminal (default: the columns that fit)")
    p.add_argument("--top", type=options.count, default=10, help="call sites to list (default 10)")
    p.add_argument("--all", action="store_true",
                   help=f"list every rank and group (default: up to {WHOLE} of each, every one; beyond that "
                        f"{SHOWN}: the findings' culprits and groups, then the ranks furthest from the rest and the "
                        "groups ranks waited in most)")

    options.add_since(p)
    options.add_max_memory(p)


def _cell(kind: str, v: Any) -> str:
    if kind == "s":
        return str(v)
    if kind in ("n", "n0"):
        return f"{v:,}" if v else ("" if kind == "n0" else "0")
    if v is None or v != v:
        return NONE
    if kind == "t":
        return fmt_time(v)
    if kind == "b":
        return fmt_bytes(v)
    return _bw(v)


def _bw(v: float) -> str:
    """Bytes/s, decimal units (GB/s as nccl-tests prints it), 3 significant digits."""
    for unit, f in (("GB/s", 1e9), ("MB/s", 1e6), ("KB/s", 1e3)):
        if v >= f:
            return f"{v / f:.3g} {unit}" if v / f < 1000 else f"{v / f:.0f} {unit}"
    return f"{v:.0f} B/s"


def _layout(key: str, rows: dict[str, dict[str, Any]], cols: list[Column], width: int,
            wide: bool) -> tuple[list[str], list[list[str]], list[str]]:
    """Headers, cells and the names of the columns left out so that the table fits ``width``.
    Columns with no value in any row (no failures, no untimed ops) are always left out."""
    cells = {c.header: [_cell(c.kind, r.get(c.key)) for r in rows.values()] for c in cols}
    keep = [c for c in cols
            if any(v not in ("", NONE) for v in cells[c.header]) or c.priority == ALWAYS and c.kind != "n0"]
    dropped: list[str] = []

    def need(cs: list[Column]) -> int:
        ws = [max([len(key), *(len(k) for k in rows)])] + [max([len(c.header), *(len(v) for v in cells[c.header])])
                                                            for c in cs]
        return sum(ws) + len(SEP) * (len(ws) - 1)

    if not wide:
        while need(keep) > width:
            cand = [c for c in keep if c.priority < ALWAYS]
            if not cand:
                break
            low = min(cand, key=lambda c: c.priority)
            keep.remove(low)
            dropped.append(low.header)
    heads = [key] + [c.header for c in keep]
    body = [[k] + [cells[c.header][i] for c in keep] for i, k in enumerate(rows)]
    return heads, body, dropped


def _common_dir(sites: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The directory every call site's file shares, and the sites relative to it (other
    keys, such as the C++ caller, unchanged): keeps the table in 80 columns."""
    import os

    files = [k.split(":")[0] for k in sites if k.startswith("/") and ":" in k]
    if len(files) < 2:
        return "", sites
    under = os.path.dirname(os.path.commonpath(files)) if len(set(files)) == 1 else os.path.commonpath(files)
    if under in ("", "/"):
        return "", sites
    cut = len(under) + 1
    return under, {(k[cut:] if k.startswith(under + "/") else k): v for k, v in sites.items()}


def _widths(heads: list[str], body: list[list[str]]) -> list[int]:
    return [max([len(h), *(len(r[i]) for r in body)]) for i, h in enumerate(heads)]


def _table_lines(title: str, heads: list[str], body: list[list[str]], left: set[str]) -> list[str]:
    """Plain fixed-width lines: every cell whole, numbers right-aligned, names left-aligned."""
    ws = _widths(heads, body)

    def line(cells: list[str]) -> str:
        return SEP.join(c.ljust(w) if heads[i] in left else c.rjust(w)
                        for i, (c, w) in enumerate(zip(cells, ws, strict=True))).rstrip()

    return [title, line(heads), "─" * (sum(ws) + len(SEP) * (len(ws) - 1)), *(line(r) for r in body)]


class Pinned(NamedTuple):
    """What the findings name, listed first where a table lists only some of its rows."""

    ranks: list[str]  # their culprits
    groups: list[str]  # their groups, as the per-group table keys them


NOTHING = Pinned([], [])


def pinned(model: TraceModel) -> Pinned:
    """The culprits and groups of the trace's findings (judged as ``check`` judges them),
    errors first; a finding that blames every rank of the job (killed as a whole) singles
    out no rank (its group, if it names one, still goes first)."""
    from commscope.analysis.diagnose import default_hang_after, judged

    found = sorted(judged(model, default_hang_after(model))[1], key=lambda f: f.severity != "error")
    everyone = set(range(model.world_size)) if model.world_size else set(model.ranks)
    groups = [group_row(f.group, p2p=f.kind in ("p2p_deadlock", "unmatched_p2p") or (f.op in OPS and OPS[f.op].kind == P2P),
                        fr=f.evidence.get("src") == "fr") for f in found if f.group is not None]
    return Pinned([str(r) for f in found if not set(f.culprits) >= everyone for r in sorted(f.culprits)], groups)


def render(rep: dict[str, Any], description: str, world_size: int, warnings: list[str], con, *,
           wide: bool = False, every: bool = False, first: Pinned = NOTHING, windowed: bool = False,
           span: str | None = None) -> None:
    """The report as tables on a rich console, fitted to its width (``wide``: every column).
    Cells are never cut: a table whose names alone are too wide runs past the width.  A job
    of more than ``WHOLE`` ranks lists those that matter most and their median, one of more
    than ``WHOLE`` groups those that matter most (``first``: the findings' culprits and
    groups, on top; ``every``: every rank and group).  ``windowed``: read with ``--since``,
    whose start leaves out the parts of instances ranks ran before it; ``span``: what the
    read spans, in words (``options.span_text``; default: the report's ``span_s``)."""
    from rich.text import Text

    width = con.width

    def out(text: str, style: str = "") -> None:
        con.print(Text(text, style=style, no_wrap=True, overflow="ignore"), crop=False, soft_wrap=True)

    ranks = options.ranks_read(world_size, rep.get("foreign_streams", 0))
    span = span or options.span_text(0, int(rep["span_s"] * 1e9))
    for line in options.headline(description, f"{ranks}, {rep['ops_total']:,} ops over {span}", width):
        con.print(line, soft_wrap=True)
    for w in warnings:  # (wrapped at the width, as check's: unwrapped, one ran to 155 columns, helper-166)
        con.print(options.warning(w))
    hidden: set[str] = set()

    def show(title: str, key: str, rows: dict[str, dict[str, Any]], cols: list[Column]) -> None:
        heads, body, dropped = _layout(key, rows, cols, width, wide)
        hidden.update(dropped)
        lines = _table_lines(title, heads, body, {key, "end"})
        out("")
        out(lines[0], "italic")
        out(lines[1], "bold")
        for ln in lines[2:]:
            out(ln)

    show("per op (collectives: per instance, true latency = last end - last begin)", "op", rep["ops"], _STAT_COLS)
    groups = rep["groups"]
    if every or len(groups) <= WHOLE:
        show("per group", "group", groups, _STAT_COLS)
    else:
        show(f"per group: {SHOWN} of {len(groups):,}: the findings', then where ranks waited most (--all)", "group",
             {k: groups[k] for k in waited_groups(groups, SHOWN, first.groups)}, _STAT_COLS)
    ranks = rep["ranks"]
    if every or len(ranks) <= WHOLE:
        show("per rank", "rank", ranks, _RANK_COLS)
    else:
        shown = {k: ranks[k] for k in unusual_ranks(ranks, SHOWN, first.ranks)} | {MEDIAN: median_row(ranks)}
        show(f"per rank: {SHOWN} of {len(ranks):,}: culprits, then the furthest from the rest (--all)", "rank",
             shown, _RANK_COLS)
    history = rep.get("history")
    if history:
        show("summarized history (deleted by retention; per op, all ranks)", "op", history, _HISTORY_COLS)
    sites = {s["site"]: {"waiting": s["wait_s"], "ops": s["count"]} for s in rep["sites"]}
    if sites:
        under, sites = _common_dir(sites)
        show("top call sites by time waiting" + (f", in {under}/" if under else ""), "site", sites, _SITE_COLS)
    notes = []
    if rep.get("ops_untimed"):
        notes.append(f"{rep['ops_untimed']:,} ops without timings (Flight Recorder on Gloo, or no end time) are "
                     f"shown as {NONE} and left out of latency and bandwidth.")
    if rep["incomplete_collectives"]:
        why = ("a rank that died or hung in it, one whose part retention deleted, or one some ranks ran before "
               "the window read" if windowed else "a rank that died or hung in it, or one whose part retention deleted")
        notes.append(f"{rep['incomplete_collectives']:,} collective instance(s) not complete on every member ({why}) "
                     "are left out of the per-op and per-group tables, counts and bytes included (their failed ops "
                     "are counted).")
    if hidden:
        order = [c.header for c in _STAT_COLS + _RANK_COLS]
        notes.append(f"Left out to fit {width} columns: " + ", ".join(sorted(hidden, key=order.index))
                     + " (--wide, --json or --csv show them).")
    if notes:
        out("")
    for n in notes:  # (wrapped here: rich ends each line it wraps with the space it broke at)
        for line in textwrap.wrap(n, max(width, 20), break_on_hyphens=False):
            out(line)


def to_csv(rep: dict[str, Any]) -> str:
    buf = io.StringIO()
    fields: list[str] = []
    tables = [t for t in ("ops", "groups", "ranks", "history") if t in rep]
    for tab in tables:
        for row in rep[tab].values():
            fields += [k for k in row if k not in fields]
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["table", "key", *fields])
    for tab in tables:
        for key, row in rep[tab].items():
            w.writerow([tab[:-1] if tab != "history" else "history", key,
                        *("" if row.get(f) is None else row.get(f) for f in fields)])
    for s in rep["sites"]:
        w.writerow(["site", s["site"], *(s["count"] if f == "count" else s["wait_s"] if f == "wait_s" else ""
                                        for f in fields)])
    return buf.getvalue()


def restart_note(store: Any, reader: Any, model: Any = None) -> tuple[dict[str, Any] | None, list[str]]:
    """For a job that is attempt N > 0 of a torchrun run (``analysis.source.restarts``): its
    earlier attempts found in the store, the newest few named, the others counted (for
    ``--json``) and a warning naming them; (None, []) for any other job."""
    from commscope.analysis.source import restarts

    r = restarts(store, reader, model)
    if r is None:
        return None, []
    earlier = [{"attempt": e.number, "job": e.job, "store": redact_store(e.name)} for e in r.earlier]
    parts = [f"attempt {e['attempt']}: commscope check {shlex.quote(e['store'])}" for e in earlier]
    if r.untraced:
        parts.append(f"{r.untraced:,} with no trace in this store")
    if r.unlisted:
        parts.append(f"{r.unlisted:,} older not listed" if r.listed else f"{r.unlisted:,} not looked for")
    return ({"attempt": r.attempt, "run": r.run, "earlier": earlier, "untraced": r.untraced,
             "unlisted": r.unlisted, "listed": r.listed},
            [f"this is attempt {r.attempt} of torchrun run {r.run}, which restarted: these tables are this "
             f"attempt's ({'; '.join(parts)})"])


def main(args: argparse.Namespace) -> int:
    from commscope.commands import progress
    from commscope.commands.check import read_summary

    shown = progress.wanted(args.json or args.csv)
    model, reader, warnings = progress.load(args.store, shown, since=options.since_of(args),
                                            max_memory=options.max_memory_of(args))
    with progress.status(f"summarizing {len(model.ranks):,} ranks", shown):
        rep = compute_report(model, top_sites=args.top)
    restart, restart_warnings = restart_note(args.store, reader, model)
    warnings = [*warnings, *restart_warnings]
    if snapshots.is_snapshot(model):  # (its tables were empty or 0 ns, unexplained: helper-67)
        warnings = [*warnings, "this is a snapshot (commscope snapshot): it holds where each rank was, not "
                               "how long its ops took, so its ops have no timings; "
                               f"commscope check {shlex.quote(redact_store(args.store))} says what is wrong"]
    if args.json:
        rep["warnings"] = warnings
        rep["skipped"] = read_summary(reader.stats)
        rep["source"] = redact(reader.description)
        rep["restarts"] = restart
        sys.stdout.write(json.dumps(rep, default=str) + "\n")
        return 0
    if args.csv:
        sys.stdout.write(to_csv(rep))
        for w in warnings:
            print(options.warning(w).plain, file=sys.stderr)
        return 0
    cut = not args.all and max(len(rep["ranks"]), len(rep["groups"])) > WHOLE
    with progress.status("judging the trace (its findings' ranks and groups go first)", shown and cut):
        first = pinned(model) if cut else NOTHING
    render(rep, redact(reader.description), model.world_size, warnings, options.stdout_console(), wide=args.wide,
           every=args.all, first=first, windowed=reader.window_start_ns() is not None,
           span=options.span_text(*model.own_bounds(), reader.window_start_ns()))
    return 0
