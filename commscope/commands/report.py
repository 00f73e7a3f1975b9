"""Summary tables per op, group and rank: count, bytes, latency p50/p99, algbw/busbw
(nccl-tests definitions, group size), async wait, arrival skew; and the call sites
where ranks spend the most time waiting.  Accepts trace stores and Flight Recorder dumps.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from commscope.analysis.report import compute_report
from commscope.bench.stats import fmt_bytes, fmt_time
from commscope.store import redact


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("store", nargs="?", default=None,
                   help="trace store (directory or redis://...) or Flight Recorder dump directory")
    p.add_argument("--json", action="store_true", help="the tables as one JSON object")
    p.add_argument("--top", type=int, default=10, help="call sites to list (default 10)")


def _t(v: float | None) -> str:
    return "" if v is None else fmt_time(v)


def _bw(v: float | None) -> str:
    return "" if v is None or v != v else f"{v / 1e9:.3f}"


def main(args: argparse.Namespace) -> int:
    from commscope.commands.check import load, read_summary

    model, reader, warnings = load(args.store)
    rep = compute_report(model, top_sites=args.top)
    if args.json:
        rep["warnings"] = warnings
        rep["skipped"] = read_summary(reader.stats)
        rep["source"] = redact(reader.description)
        sys.stdout.write(json.dumps(rep, default=str) + "\n")
        return 0
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    con = Console()
    con.print(f"[bold]{redact(reader.description)}[/]: {model.world_size} ranks, {rep['ops_total']:,} ops over "
              f"{rep['span_s']:.2f} s")
    for w in warnings:
        con.print(f"[yellow]warning:[/] {w}")

    def table(title: str, key: str, rows: dict[str, dict[str, Any]]) -> Table:
        t = Table(title=title, title_justify="left")
        for c in (key, "count", "bytes", "lat p50", "lat p99", "algbw GB/s", "busbw GB/s", "wait", "async wait",
                  "skew p50", "skew p99", "failed"):
            t.add_column(c, justify="left" if c == key else "right")
        for k, r in rows.items():
            t.add_row(k, f"{r['count']:,}", fmt_bytes(r["bytes"]), _t(r["latency_p50_s"]), _t(r["latency_p99_s"]),
                      _bw(r["algbw_p50"]), _bw(r["busbw_p50"]), _t(r["wait_s"]), _t(r["async_wait_s"]),
                      _t(r["skew_p50_s"]), _t(r["skew_p99_s"]), f"{r['failed']:,}" if r["failed"] else "")
        return t

    con.print(table("per op (collectives: per instance, true latency = last end - last begin)", "op", rep["ops"]))
    con.print(table("per group", "group", rep["groups"]))
    t = Table(title="per rank", title_justify="left")
    for c in ("rank", "ops", "bytes", "busy", "op p50", "op p99", "waiting for others", "async wait", "failed", "end"):
        t.add_column(c, justify="left" if c == "end" else "right")
    for r, row in rep["ranks"].items():
        t.add_row(r, f"{row['count']:,}", fmt_bytes(row["bytes"]), _t(row["busy_s"]), _t(row["latency_p50_s"]),
                  _t(row["latency_p99_s"]), _t(row["wait_s"]), _t(row["async_wait_s"]),
                  f"{row['failed']:,}" if row["failed"] else "", Text(row["end"]))
    con.print(t)
    t = Table(title="top call sites by time waiting", title_justify="left")
    for c in ("site", "waiting", "ops"):
        t.add_column(c, justify="left" if c == "site" else "right")
    for s in rep["sites"]:
        t.add_row(s["site"], _t(s["wait_s"]), f"{s['count']:,}")
    con.print(t)
    if rep["incomplete_collectives"]:
        con.print(f"{rep['incomplete_collectives']} collective instance(s) not complete on every member "
                  "are left out of the latency columns")
    return 0
