"""Redaction cost: what hiding credentials adds per text, and to reading a trace.

Text from the user's program is redacted where it enters a trace (off the hot path: once
per call site, per exception, per stack, per meta) and again in every reader
(``schema.redact_event``: call sites, exception texts, argv, stacks).  This suite times
``commscope.redact`` on typical texts, then reads the same in-memory trace with the
readers' redaction on and off, alternating, for a JSON trace (a call site on every begin)
and a native one (packed blocks restating their call sites).  The off side is a baseline
only: the readers' loop as it was before they redacted.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

from rich.console import Console
from rich.table import Table

from commscope.bench.stats import fmt_time, median
from commscope.commands import options

SITE = "/home/alice/project/train.py:42 in step"
TEXTS: dict[str, str] = {
    "call site": SITE,
    "Gloo error": "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Read error [10.0.0.7]:43210: "
                  "Connection reset by peer",
    "exception with a URL": "RuntimeError: cannot reach postgres://admin:hunter2@db:5432/runs (timeout 30 s)",
    "traceback line": 'File "/home/alice/.venv/lib/python3.11/site-packages/torch/distributed/'
                      'distributed_c10d.py", line 2501, in all_reduce',
}
#: 100 KB each, repeating what starts a rule: the worst case of each rule's scan.
HOSTILE: dict[str, str] = {name: (unit * (100_000 // len(unit) + 1))[:100_000] for name, unit in {
    "key=": "key=", "key=( ": "key=( ", "url key=": "a://u:p@h key=x ", "key: x": "key: x\n",
    "--key '": "--key '", "'password': '": "'password': '", "@": "a://" + "@" * 40, "Authorization: ": "Authorization: ",
    "--key:x": "--api-key:x ", "sshpass -p '": "sshpass -p '", "AKIA… ": "AKIAIOSFODNN7EXAMPLE " + "a" * 39 + " ",
}.items()}
ARGV = ["train.py", "--model", "llama-7b", "--hf-token", "hf_" + "a" * 34, "--lr", "3e-4", "--batch-size", "32",
        "--output=/scratch/alice/run7", "--api-key=sk-" + "b" * 40, "--tokenizer", "gpt2", "--max-tokens", "512",
        "--wandb-project", "ablations"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--events", type=options.positive, default=200_000, help="events in each read measurement (default 200k)")
    p.add_argument("--rounds", type=options.positive, default=7, help="A/B rounds, alternating (default 7)")
    p.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")


def _per_call(fn: Callable[[], Any], n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n


def _sift_plain(objs: list, rank: int | None, invalid: Any) -> list[dict]:
    """``schema._sift`` as it was before readers redacted: the baseline's loop."""
    from commscope import schema

    out = []
    append = out.append
    required = schema.REQUIRED
    for e in objs:
        typ = e.get("type")
        if (typ is not None and "ts" in e and (e.get("rank") == rank if rank is not None else "rank" in e)
                and (typ not in required or all(k in e for k in required[typ]))):
            append(e)
        else:
            invalid[schema._check(e, rank) or "event: invalid"] += 1
    return out


@contextlib.contextmanager
def _redaction_off() -> Iterator[None]:
    """The readers without redaction (the baseline side only)."""
    from commscope import blocks, schema

    saved = schema._sift, blocks.redact
    schema._sift = _sift_plain  # type: ignore[assignment]
    blocks.redact = lambda s: s  # type: ignore[assignment]
    try:
        yield
    finally:
        schema._sift, blocks.redact = saved


def json_trace(n: int) -> bytes:
    """``n`` op events as the Python recorder writes them: a call site on every begin."""
    from commscope.events import SCHEMA_VERSION, encode

    begin = {"v": SCHEMA_VERSION, "type": "op", "phase": "begin", "op": "all_reduce", "group": "0", "redop": "sum",
             "in_shapes": [[256]], "in_dtypes": ["float32"], "in_bytes": 1024, "out_shapes": [[256]],
             "out_dtypes": ["float32"], "out_bytes": 1024, "tid": 1, "rank": 0}
    lines = []
    for i in range(n):
        if i % 2 == 0:
            lines.append(encode(dict(begin, ts=10**18 + i, id=i // 2 + 1, seq=i // 2 + 1, site=f"{SITE[:-5]}{i % 50}")))
        else:
            lines.append(encode({"v": SCHEMA_VERSION, "type": "op", "rank": 0, "ts": 10**18 + i, "phase": "end",
                                 "id": i // 2 + 1}))
    return b"\n".join(lines) + b"\n"


def native_trace(n: int, per_block: int = 2000) -> bytes:
    """``n`` op records in blocks as the native recorder writes them (v3: each block
    restates its call sites)."""
    import orjson

    from commscope import blocks

    meta = {"type": "meta", "rank": 0, "ts": 1, "v": 3, "world_size": 1, "recorder": "native",
            "names": ["all_reduce"], "argv": ARGV}
    group = {"type": "group", "rank": 0, "ts": 1, "v": 3, "group": "0", "gid": 0, "granks": [0]}
    lines = [orjson.dumps(meta), orjson.dumps(group)]
    sites = b"".join(blocks.pack_site(s, f"{SITE[:-5]}{s}") for s in range(8))
    op_id, t = 0, 10**18
    while op_id * 2 < n:
        recs = bytearray(sites)
        for _ in range(per_block // 2):
            op_id += 1
            recs += blocks.pack_begin(op_id, t, name=0, site=op_id % 8, seq=op_id, ins=[(6, [256])],
                                      outs=[(6, [256])], in_bytes=1024, out_bytes=1024)
            recs += blocks.pack_end(op_id, t + 1000)
            t += 2000
        lines.append(blocks.encode_block(bytes(recs), 0, t, blocks.count_records(bytes(recs))))
    return b"\n".join(lines) + b"\n"


def _read_json(data: bytes) -> int:
    from commscope.events import decode_lines, gc_paused

    with gc_paused():  # as the readers decode
        return len(decode_lines(data, 0).events)


def _read_native(data: bytes) -> int:
    from commscope.blocks import BlockDecoder, decode_stream
    from commscope.events import decode_lines, gc_paused

    with gc_paused():  # as the readers decode: op records in columns
        return decode_stream(decode_lines(data, 0), BlockDecoder(0), columns=True).count()


def _ab(read: Callable[[bytes], int], data: bytes, rounds: int) -> tuple[float, float, int]:
    """Median seconds per read with redaction on and off, alternating; events read."""
    on, off = [], []
    n = 0
    for i in range(rounds):
        for side in (("on", "off") if i % 2 == 0 else ("off", "on")):  # neither side always goes first
            ctx = _redaction_off() if side == "off" else contextlib.nullcontext()
            with ctx:
                t0 = time.perf_counter()
                n = read(data)
                (on if side == "on" else off).append(time.perf_counter() - t0)
    return median(on), median(off), n


def run(args: argparse.Namespace) -> int:
    from commscope.redact import Redactor
    from commscope.schema import redact_event

    if args.quick:
        args.events, args.rounds = 20_000, 3
    console = Console()
    console.print("[bold]commscope bench redact[/]")
    r = Redactor()  # no environment secrets: the same work on every machine
    calls = 2_000 if args.quick else 20_000
    table = Table(title="Redacting one text (median of 5 runs)")
    for col in ("text", "chars", "first time", "again (cached)"):
        table.add_column(col, justify="left" if col == "text" else "right")
    for name, text in TEXTS.items():
        fresh = median([_per_call(lambda t=text: r.spans(t), calls) for _ in range(5)])
        r.redact(text)
        cached = median([_per_call(lambda t=text: r.redact(t), calls) for _ in range(5)])
        table.add_row(name, str(len(text)), fmt_time(fresh), fmt_time(cached))
    argv = median([_per_call(lambda: Redactor().args(ARGV), calls // 10) for _ in range(5)])  # (no memo)
    table.add_row(f"argv ({len(ARGV)} arguments)", str(sum(map(len, ARGV))), fmt_time(argv), "")
    frames = [[f"/home/alice/project/layer{i}.py", i, f"forward_{i}"] for i in range(40)]

    def stack() -> None:
        redact_event({"type": "stack", "threads": [{"tid": 1, "name": "MainThread",
                                                   "frames": [list(f) for f in frames]}]})
    st = median([_per_call(stack, calls // 10) for _ in range(5)])
    table.add_row("stack event (40 frames)", "", "", fmt_time(st))
    worst, recipe = 0.0, ""
    for name, text in HOSTILE.items():  # text built to make each rule work hardest
        t = median([_per_call(lambda t=text: r.spans(t), 1) for _ in range(3)])
        if t > worst:
            worst, recipe = t, name
    table.add_row(f"hostile text, worst of {len(HOSTILE)} ({recipe})", "100 KB", fmt_time(worst), "")
    console.print(table)

    reads = Table(title=f"Reading a trace with redaction on and off ({args.rounds} rounds alternating, medians)")
    for col in ("trace", "events", "on", "off", "added per event", "added"):
        reads.add_column(col, justify="left" if col == "trace" else "right")
    for name, data, read in (("JSON (site on every begin)", json_trace(args.events), _read_json),
                             ("native blocks", native_trace(args.events), _read_native)):
        on, off, n = _ab(read, data, args.rounds)
        reads.add_row(name, f"{n:,}", f"{n / on / 1e6:.2f} M/s", f"{n / off / 1e6:.2f} M/s",
                      fmt_time((on - off) / max(n, 1)), f"{(on - off) / off * 100:+.1f} %")
    console.print(reads)
    console.print("Writers redact off the hot path: a call site once when first seen, an error message "
                  "only when an op fails (the native drain masks a block only if it holds one), stacks and "
                  "exits when they are taken.  'off' is the readers' loop as it was before they redacted "
                  "(a baseline, never a configuration).")
    return 0
