"""Console frame times (the timeline at 200x60, 64 ranks, 1M ops) and idle CPU on an ended job.

Offscreen (Textual's headless driver).  Measured in one run:
a full frame of the timeline with an empty strip cache, at two zoom levels (the whole
trace in view, every op of every visible rank in the window; and a working zoom of about
2,000 ops per row); a frame after 1k new events arrive (ingest timed separately: it runs
on the feed thread); and the app process's RSS holding the model.  The first frame, which
is painted from the ops while the rows' span indexes (``tui/spanindex.py``) are built when
the UI is idle: both are shown apart, and so are full frames painted from the ops alone,
alternated with the measured ones, for comparison.
Targets: full frame <= 30 ms median, frame after 1k events <= 10 ms, RSS <= 400 MB.

Idle CPU: the real `commscope attach` on a job that has ended, side by side with a paused
`commscope replay` of the same trace (each in its own pseudo-terminal, 120x40, written
through the directory store's writer), alternated, CPU seconds per minute once loaded.
Target: attach on an ended job idles like a paused replay (<= 1 CPU s per minute).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import time

from rich.console import Console
from rich.table import Table

from commscope.bench.stats import fmt_time, median
from commscope.commands import options
from commscope.store import Batch, EmptyReader

TARGET_FRAME = 0.030
TARGET_UPDATE = 0.010
TARGET_RSS = 400 * 2**20
TARGET_IDLE = 1.0  # CPU seconds per minute


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ranks", type=options.positive, default=64)
    p.add_argument("--ops", type=options.positive, default=1_000_000, help="ops in total (default 1M)")
    p.add_argument("--frames", type=options.positive, default=20, help="frames per measurement")
    p.add_argument("--quick", action="store_true", help="8 ranks x 20k ops, for a smoke test")
    p.add_argument("--idle-window", type=options.amount, default=20.0, metavar="S",
                   help="seconds of idle CPU measured per run (default 20; 5 with --quick)")
    p.add_argument("--idle-rounds", type=options.positive, default=2, help="attach/replay pairs, alternated (default 2)")


def _frame(tl, index: bool = True, *, first: bool = False) -> float:
    tl.SPAN_INDEX = index
    tl.clear_caches(indexes=first)  # every line and row painted from scratch (span indexes: data, kept)
    t0 = time.perf_counter()
    for y in range(tl.size.height):
        tl.render_line(y)
    return time.perf_counter() - t0


def _more_events(model, n: int) -> list[dict]:
    """n new events at the end of the trace: begin/end pairs of all_reduce on every rank."""
    out = []
    ranks = model.rank_ids()
    ts = model.end_ns + 1_000_000
    ids = {r: int(model.ranks[r].id[: model.ranks[r].n].max()) + 1 for r in ranks}
    k = 0
    while len(out) < n:
        r = ranks[k % len(ranks)]
        out.append({"v": 1, "type": "op", "rank": r, "ts": ts, "phase": "begin", "id": ids[r], "op": "all_reduce",
                    "group": "0", "in_shapes": [[1024]], "in_dtypes": ["float32"], "in_bytes": 4096,
                    "out_shapes": [[1024]], "out_dtypes": ["float32"], "out_bytes": 4096, "site": "train.py:1 in f"})
        out.append({"v": 1, "type": "op", "rank": r, "ts": ts + 500_000, "phase": "end", "id": ids[r]})
        ids[r] += 1
        k += 1
        if k % len(ranks) == 0:
            ts += 1_000_000
    return out


async def _measure(model, frames: int) -> dict:
    from commscope.tui.app import CommscopeApp
    from commscope.tui.feed import REPLAY, Feed

    feed = Feed(EmptyReader("synthetic"), mode=REPLAY)
    feed.model = model
    info = feed.load_all()
    app = CommscopeApp(feed, clock=lambda: model.end_ns, start_feed=False, bell=False)
    out: dict = {}
    async with app.run_test(size=(200, 60)) as pilot:
        app.apply(info, feed.findings)
        await pilot.pause()
        app.query_one("#top").styles.height = 60  # the timeline gets all 60 rows for this
        await pilot.pause()
        tl = app.timeline
        tl.cursor_ns = None
        app.cursor_ns = None
        tl.follow = False
        start, end = model.bounds()
        w = tl.timeline_width()
        out["rows"] = tl.size.height
        # whole trace in view: the first frame builds the span indexes; then frames from the
        # indexes alternate with frames painted from the ops alone
        tl.npc = max(1, (end - start) // w + 1)
        tl.t0 = start
        spent = [0.0]  # time the UI thread spends building the indexes, in steps between events
        build = tl.build_indexes

        def timed_build(*args):
            t = time.perf_counter()
            try:
                return build(*args)
            finally:
                spent[0] += time.perf_counter() - t

        tl.build_indexes = timed_build
        out["first"] = [_frame(tl, first=True)]  # painted from the ops; the indexes are built after
        while tl._building or any(sp.wanted for sp in tl._spans.values()):
            await pilot.pause()
        tl.build_indexes = build
        out["build"] = [spent[0]]
        pairs = [(_frame(tl, k % 2 == 0), _frame(tl, k % 2 == 1)) for k in range(frames)]
        out["full"] = [a if k % 2 == 0 else b for k, (a, b) in enumerate(pairs)]
        out["full_ops"] = [b if k % 2 == 0 else a for k, (a, b) in enumerate(pairs)]
        # a working zoom: ~2k ops per row, panning through the trace
        per_rank = model.total_ops() / max(1, len(model.rank_ids()))
        span = int((end - start) * min(1.0, 2000 / per_rank))
        tl.npc = max(1, span // w)
        step = max(1, (end - start - span) // max(1, frames))
        zoom = []
        for i in range(frames):
            tl.t0 = start + i * step
            zoom.append(_frame(tl))
        out["zoom"] = zoom
        # a frame after 1k new events: view at the end of the trace, strips cached
        updates, ingests = [], []
        for _ in range(frames):
            tl.t0 = model.end_ns - span // 2
            for y in range(tl.size.height):
                tl.render_line(y)
            batch = _more_events(model, 1000)
            t0 = time.perf_counter()
            feed.ingest(Batch(batch, []))  # ingest and publish the view the timeline paints from
            t1 = time.perf_counter()
            tl.t0 = tl.t0  # same view: only rows whose ranks changed are re-rendered
            for y in range(tl.size.height):
                tl.render_line(y)
            t2 = time.perf_counter()
            ingests.append(t1 - t0)
            updates.append(t2 - t1)
        out["update"], out["ingest"] = updates, ingests
        out["update_rows"] = sum(1 for r in tl.rows[: tl.size.height] if r.ranks[0] in model.changed)
    return out


def _ended_store(root: str) -> str:
    """A 4-rank job that ran and exited, written through the directory store's writer."""
    from commscope.analysis.synth import healthy_trace
    from commscope.events import encode
    from commscope.store import open_writer

    events = healthy_trace(4, 2000)
    for r in range(4):
        w = open_writer(root, "ended", r, {"world_size": 4})
        w.write([encode(e) for e in events if e["rank"] == r])
        w.close()
    return root


def _idle_cpu(argv: list[str], window: float) -> float:
    """CPU seconds per minute the console ``argv`` spends once it has drawn its first
    screen, in a pseudo-terminal whose output is drained (as a terminal would)."""
    import fcntl
    import os
    import pty
    import struct
    import subprocess
    import sys
    import termios
    import threading

    import psutil

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    env = dict(os.environ, TERM="xterm-256color", COLUMNS="120", LINES="40")
    proc = subprocess.Popen([sys.executable, "-m", "commscope", *argv], stdin=slave, stdout=slave, stderr=slave,
                            env=env, start_new_session=True)
    os.close(slave)
    seen = bytearray()
    drained = threading.Event()

    def drain() -> None:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            seen.extend(chunk[-4096:])
            del seen[:-8192]
        drained.set()

    threading.Thread(target=drain, daemon=True).start()
    try:
        p = psutil.Process(proc.pid)
        deadline = time.monotonic() + 60
        while b"events" not in seen and time.monotonic() < deadline:  # the header is drawn
            time.sleep(0.1)
        time.sleep(2.0)  # let the first diagnosis and table refresh settle
        c0 = p.cpu_times()
        time.sleep(window)
        c1 = p.cpu_times()
        return (c1.user + c1.system - c0.user - c0.system) / window * 60
    finally:
        os.write(master, b"q")
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        os.close(master)
        drained.wait(5)


def idle_cpu(window: float, rounds: int) -> dict[str, list[float]]:
    """attach on an ended job vs a paused replay of it, alternated: CPU s per minute each."""
    import tempfile

    out: dict[str, list[float]] = {"attach": [], "replay": []}
    with tempfile.TemporaryDirectory(prefix="commscope-bench-idle-") as tmp:
        store = _ended_store(tmp)
        for _ in range(rounds):
            out["attach"].append(_idle_cpu(["attach", "--no-bell", store], window))
            out["replay"].append(_idle_cpu(["replay", store], window))
    return out


def run(args: argparse.Namespace) -> int:
    import psutil

    from commscope.analysis import TraceModel
    from commscope.analysis.synth import healthy_trace
    from commscope.events import gc_paused

    ranks, total = (8, 20_000 * 8) if args.quick else (args.ranks, args.ops)
    console = Console()
    console.print(f"[bold]commscope bench tui[/]: building a synthetic trace, {ranks} ranks x "
                  f"{total // ranks:,} ops ...")
    proc = psutil.Process()
    rss0 = proc.memory_info().rss
    with gc_paused():
        events = healthy_trace(ranks, total // ranks)
        model = TraceModel.from_events(events)
        n_events = len(events)
        del events
    gc.collect()
    rss_model = proc.memory_info().rss
    res = asyncio.run(_measure(model, args.frames))
    rss_app = proc.memory_info().rss
    table = Table(title=f"Timeline at 200x60 ({res['rows']} rows) over {model.total_ops():,} ops "
                        f"({n_events:,} events, {ranks} ranks)")
    for col in ("measure", "median", "max", "target", "met"):
        table.add_column(col, justify="right" if col != "measure" else "left")
    ok = True

    def row(name, xs, target):
        nonlocal ok
        med = median(xs)
        met = target is None or med <= target
        ok &= met
        table.add_row(name, fmt_time(med), fmt_time(max(xs)), "–" if target is None else f"≤ {fmt_time(target)}",
                      "–" if target is None else ("yes" if met else "NO"))

    row("first frame, whole trace (from the ops)", res["first"], None)
    row("  then building the span indexes, when idle (15 ms steps)", res["build"], None)
    row("full frame, whole trace in view", res["full"], TARGET_FRAME)
    row("  the same painted from the ops (no index)", res["full_ops"], None)
    row("full frame, ~2k ops per row, panning", res["zoom"], TARGET_FRAME)
    row(f"frame after 1k new events ({res['update_rows']} rows changed)", res["update"], TARGET_UPDATE)
    row("ingest + publish of those 1k events (feed thread)", res["ingest"], None)
    console.print(table)
    met = rss_app <= TARGET_RSS
    ok &= met
    console.print(f"RSS: {rss0 / 2**20:.0f} MiB at start, {rss_model / 2**20:.0f} MiB holding the model, "
                  f"{rss_app / 2**20:.0f} MiB with the app running (target ≤ {TARGET_RSS // 2**20} MB): "
                  + ("met" if met else "MISSED"))
    window = 5.0 if args.quick else args.idle_window
    console.print(f"idle CPU: attach on an ended job and a paused replay, {args.idle_rounds} rounds of "
                  f"{window:g} s each, alternated ...")
    idle = idle_cpu(window, args.idle_rounds)
    attach, replay = median(idle["attach"]), median(idle["replay"])
    met = attach <= TARGET_IDLE
    ok &= met
    console.print(f"idle CPU, s per minute (median): attach on an ended job {attach:.2f}, paused replay "
                  f"{replay:.2f} (target ≤ {TARGET_IDLE:g}): " + ("met" if met else "MISSED"))
    console.print("[green]all targets met[/]" if ok else "[red]some targets missed[/]")
    return 0
