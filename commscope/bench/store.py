"""Trace store throughput: events/s one rank's recorder writes, and events/s a reader parses.

Writer: a rank's recorder thread turning queued hot-path records into stored events
(convert, encode, write), timed alone; then a producer thread calling a wrapped stand-in
op as fast as it can while the recorder runs, to show the sustained rate and that memory
stays bounded (the queue is capped; the excess is dropped and counted).
Reader: ``open_reader(...).read_all()`` over a multi-rank trace written the same way.
With ``--redis URL``: the same for the Redis Streams store (needs redis-server); with
``--redis-cluster``: on a Redis Cluster (three local masters, or a node's URL), with the
requests per second each master served while the reader followed the writers.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import threading
import time
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from commscope.commands import options
from commscope.events import SCHEMA_VERSION

TARGET_WRITE = 200_000
TARGET_READ = 500_000
TARGET_WRITE_REDIS = 100_000  # events/s one rank pushes into Redis
REDIS_FOLLOW_RANKS = 8
REDIS_FOLLOW_RATE = 20_000  # events/s per rank that a live reader must keep up with
TARGET_READ_REDIS = REDIS_FOLLOW_RANKS * REDIS_FOLLOW_RATE


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--events", type=options.positive, default=400_000, help="events per measurement (default 400k)")
    p.add_argument("--ranks", type=options.positive, default=4, help="rank files in the read test (default 4)")
    p.add_argument("--seconds", type=options.amount, default=3.0, help="duration of the saturation run (default 3 s)")
    p.add_argument("--redis", metavar="URL", nargs="?", const="auto", default=None,
                   help="also measure the Redis store (a URL, or start a local redis-server)")
    p.add_argument("--redis-cluster", metavar="URL", nargs="?", const="auto", default=None,
                   help="also measure the Redis store on a Redis Cluster (a node's URL, or start three local "
                        "masters)")
    p.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    p.add_argument("--keep", action="store_true", help="keep the stores written (default: removed at the end)")


def _writer_rate(rank: int, ws: int, store: str, n_ops: int, seconds: float) -> dict[str, Any]:
    import psutil
    import torch

    from commscope.record import ops, patch, pyhot
    from commscope.record.jobid import new_job_id
    from commscope.record.recorder import Recorder

    proc = psutil.Process()
    # The Python recorder: one JSON event per op through the thread, the heavier pipeline
    # (the native recorder moves whole blocks instead).
    rec = Recorder(store, flight_recorder=False, sample_interval=1.0, source="python")
    rec.rank, rec.job = rank, "bench-writer-" + new_job_id()  # a store given by URL may hold earlier runs
    hot = rec.ops
    patch.ACTIVE = hot
    wrapped = pyhot.make_wrapper("all_reduce", lambda *a, **k: None, ops.all_reduce)
    x = torch.ones(256)
    # 1. the recorder thread's pipeline alone
    hot.QUEUE_CAP = 2 * n_ops + 10
    for _ in range(n_ops):
        wrapped(x)
    queued = len(hot.q)
    assert rec._open_writer()
    t0 = time.perf_counter()
    rec._tick()
    alone = queued / (time.perf_counter() - t0)
    # 2. a producer saturating the hot path while the thread runs normally
    hot.QUEUE_CAP = type(hot).QUEUE_CAP
    rss0 = proc.memory_info().rss
    stop = threading.Event()
    produced = [0]
    stored0 = _op_events(store, rec.job)  # what phase 1 wrote

    def produce():
        n = 0
        while not stop.is_set():
            for _ in range(1000):
                wrapped(x)
            n += 2000
        produced[0] = n

    rec.start()
    t = threading.Thread(target=produce)
    t0 = time.perf_counter()
    t.start()
    peak = rss0
    while time.perf_counter() - t0 < seconds:
        time.sleep(0.05)
        peak = max(peak, proc.memory_info().rss)
    stop.set()
    t.join()
    elapsed = time.perf_counter() - t0
    rec.stop("bench")
    written = _op_events(store, rec.job) - stored0
    patch.ACTIVE = None
    return {"alone": alone, "produced": produced[0] / elapsed, "written": written / elapsed,
            "dropped": hot.hot_dropped, "peak_rss_delta": peak - rss0}


def _op_events(store: str, job: str) -> int:
    """Op events (a begin and an end per op) the store holds for ``job``: the records the
    blocks pack, counted one by one as the reader unpacks them."""
    from commscope.store import open_reader

    reader = open_reader(store)
    try:
        assert (reader.job() or {}).get("job") == job, (reader.job(), job)
        return sum(1 for e in reader.read_all() if e["type"] == "op")
    finally:
        reader.close()


def _paced_writer(_rank: int, _ws: int, url: str, job: str, ranks: int, rate: int, seconds: float) -> dict:
    """Write ``ranks`` Redis streams at ``rate`` events/s each, in 50 ms batches, like recorders do."""
    from commscope.store.redis_store import RedisWriter

    writers = [RedisWriter(url, job, r, {"world_size": ranks}) for r in range(ranks)]
    frag = (b'"op":"all_reduce","group":"0","redop":"sum","in_shapes":[[256]],"in_dtypes":["float32"],'
            b'"in_bytes":1024,"out_shapes":[[256]],"out_dtypes":["float32"],"out_bytes":1024,'
            b'"site":"train.py:42 in step","tid":1,"v":%d' % SCHEMA_VERSION)
    done = 0
    t0 = time.monotonic()
    while True:
        elapsed = time.monotonic() - t0
        due = int(min(elapsed, seconds) * rate)
        if due > done:
            for r, w in enumerate(writers):
                w.write([b'{"type":"op","ts":%d,"phase":"begin","id":%d,"seq":%d,%s,"rank":%d}'
                         % (time.time_ns(), i, i, frag, r) for i in range(done + 1, due + 1)])
            done = due
        if elapsed >= seconds:
            break
        time.sleep(0.05)
    for w in writers:
        w.close()
    return {"per_rank": done, "seconds": time.monotonic() - t0}


def _requests(ports: list[int]) -> list[tuple[int, int]]:
    """(appends, XREADs) each local Redis (by port) has served since it started: the
    requests a job and its console send (INFO commandstats; the XADDs inside an append
    script are not requests)."""
    from commscope.store.redis_url import parse_url
    from commscope.store.resp import Connection

    out = []
    for port in ports:
        conn = Connection(parse_url(f"redis://127.0.0.1:{port}/0"), f"127.0.0.1:{port}")
        conn.connect()
        text = conn.call("INFO", "commandstats").decode()
        conn.close()
        calls = {line.split(":", 1)[0]: int(line.split("calls=", 1)[1].split(",", 1)[0])
                 for line in text.splitlines() if line.startswith("cmdstat_") and "calls=" in line}
        out.append((calls.get("cmdstat_eval", 0), calls.get("cmdstat_xread", 0)))
    return out


def _redis_follow(url: str, ranks: int, rate: int, seconds: float) -> dict[str, Any]:
    """A reader polling a live job that ``ranks`` writers feed at ``rate`` events/s each."""
    from commscope.launch import Job
    from commscope.record.jobid import new_job_id
    from commscope.store import redis_url
    from commscope.store.redis_store import RedisReader, delete_job

    job = "bench-follow-" + new_job_id()
    reader = RedisReader(redis_url.with_job(url, job), wait=True)
    writer = Job(_paced_writer, 1, args=(url, job, ranks, rate, seconds), init=False).start()
    seen = 0
    t0 = time.perf_counter()
    done_at = None
    while True:
        n = len(reader.poll())
        seen += n
        alive = bool(writer.alive())
        if not alive and done_at is None:
            done_at = time.perf_counter()
        if not alive and n == 0:
            break
        if n == 0:
            time.sleep(0.01)
    caught_up = time.perf_counter() - (done_at or time.perf_counter())
    res = writer.join(30)[0]
    reader.close()
    delete_job(url, job)
    written = res.value["per_rank"] * ranks if res.value else 0
    return {"written": written, "write_s": res.value["seconds"] if res.value else 0.0, "read": seen,
            "catch_up_s": caught_up, "read_rate": seen / (time.perf_counter() - t0)}


ENDS_RANKS = 16_384  # the ends a follower looks at (``_ends_look``): a job of this many ranks, all closed
ENDS_LOOKS = 20


def _ends_look(url: str, ranks: int = ENDS_RANKS, looks: int = ENDS_LOOKS) -> dict[str, float]:
    """What a live follower's look at the ends of a job of ``ranks`` closed ranks costs
    (``RedisReader._ends_changed``, every ``TAIL_LOOK_S``) against reading the four ``ends``
    copies whole each time, as it did before: per look, its wall time, the bytes Redis sent
    and the CPU Redis spent (``INFO``), nothing changed between looks."""
    from commscope.record.jobid import new_job_id
    from commscope.store import redis_url
    from commscope.store.redis_store import Keys, RedisReader, RedisWriter, delete_job

    job = "bench-ends-" + new_job_id()
    w = RedisWriter(url, job, 0, {"world_size": ranks}, marks="off")
    w.write([b'{"v":1,"type":"heartbeat","rank":0,"ts":1}'])
    w.close()
    reader = RedisReader(redis_url.with_job(url, job))
    nodes = reader._nodes_ok()
    key = Keys.ends(job)  # (one Redis: every writer says its end in the first copy)
    for lo in range(0, ranks, 4096):
        nodes.call(key, "HSET", key, *[x for r in range(lo, min(ranks, lo + 4096)) for x in (Keys.member(r), 1000 + r)])

    def server() -> tuple[int, float]:
        info = nodes.call(key, "INFO", "all").decode()
        field = dict(line.split(":", 1) for line in info.splitlines() if ":" in line and not line.startswith("#"))
        return int(field["total_net_output_bytes"]), float(field["used_cpu_sys"]) + float(field["used_cpu_user"])

    out: dict[str, float] = {}
    reader._ends_changed(nodes)  # (the first look reads every copy: what a follower does once)
    for name, look in (("whole", lambda: reader._ends_said(nodes)), ("changed", lambda: reader._ends_changed(nodes))):
        (b0, c0), t0 = server(), time.perf_counter()
        for _ in range(looks):
            assert len(look()) == ranks
        t1 = time.perf_counter()
        b1, c1 = server()
        info_bytes = (b1 - b0) and server()[0] - b1  # (what one INFO reply itself costs, taken out)
        out[f"{name}_ms"] = (t1 - t0) / looks * 1e3
        out[f"{name}_bytes"] = (b1 - b0 - info_bytes) / looks
        out[f"{name}_cpu_ms"] = (c1 - c0) / looks * 1e3
    reader.close()
    delete_job(url, job)
    return out


def write_trace(store: str, ranks: int, per_rank: int, job: str = "bench") -> None:
    """A synthetic ``ranks``-rank job ``job`` in any store, for the reader measurements.
    In Redis it replaces an earlier job of that name (the URL must not name another job)."""
    from commscope.events import encode
    from commscope.store import StoreError, backend_for, open_writer

    backend = backend_for(store)
    if backend.pinned_job(store) not in (None, job):
        raise StoreError(f"give the benchmark a URL without ?job= (it writes job {job!r})")
    if backend.delete_job is not None:  # else a fresh store (the directories are)
        backend.delete_job(store, job)

    template = {"v": SCHEMA_VERSION, "type": "op", "phase": "begin", "op": "all_reduce", "group": "0", "redop": "sum",
                "in_shapes": [[256]], "in_dtypes": ["float32"], "in_bytes": 1024, "out_shapes": [[256]],
                "out_dtypes": ["float32"], "out_bytes": 1024, "site": "train.py:42 in step", "tid": 1}
    for r in range(ranks):
        w = open_writer(store, job, r, {"world_size": ranks})
        batch = []
        for i in range(per_rank):
            if i % 2 == 0:
                ev = dict(template, rank=r, ts=10**18 + i, id=i // 2 + 1, seq=i // 2 + 1)
            else:
                ev = {"v": SCHEMA_VERSION, "type": "op", "rank": r, "ts": 10**18 + i, "phase": "end", "id": i // 2 + 1}
            batch.append(encode(ev))
            if len(batch) == 10_000:
                w.write(batch)
                batch = []
        w.write(batch)
        w.close()


def _reader_rate(store: str) -> tuple[float, int]:
    from commscope.store import open_reader

    best = 0.0
    n = 0
    for _ in range(3):
        reader = open_reader(store)
        t0 = time.perf_counter()
        events = reader.read_all()
        elapsed = time.perf_counter() - t0  # before freeing them: that is the consumer's cost
        n = len(events)
        best = max(best, n / elapsed)
        del events
    return best, n


def _fmt_rate(x: float) -> str:
    return f"{x / 1000:,.0f}k/s"


def run(args: argparse.Namespace) -> int:
    from commscope.launch import run_ranks
    from commscope.store import redis_url

    if args.quick:
        args.events, args.seconds = 20_000, 0.5
    console = Console()
    tmp = tempfile.mkdtemp(prefix="commscope-bench-store-")
    console.print(f"[bold]commscope bench store[/] (files under {escape(tmp)}, {'kept' if args.keep else 'removed at the end'})")
    targets = [("directory", tmp)]
    redis_server = None
    cluster = None
    if args.redis:
        from commscope.bench.redis_server import start_redis

        url = args.redis
        if url == "auto":
            redis_server = start_redis()
            url = redis_server.url
        targets.append(("redis", url))
    if args.redis_cluster:
        from commscope.bench.redis_server import RedisCluster

        url = args.redis_cluster
        if url == "auto":
            cluster = RedisCluster(3).start()
            url = cluster.url
        targets.append(("redis-cluster", url))
    notes: list[str] = []
    table = Table(title="Trace store throughput, events/s (one process per measurement)")
    for col in ("store", "thread alone", "produced", "written", "dropped", "RSS Δ", "reader", "met"):
        table.add_column(col, justify="right" if col != "store" else "left")
    try:
        for name, base in targets:
            redis = name != "directory"
            store = os.path.join(base, "w") if name == "directory" else base
            w = run_ranks(_writer_rate, 1, args=(store, args.events // 2, args.seconds), timeout=600)[0].value
            rstore = os.path.join(base, "r") if name == "directory" else redis_url.with_job(base, "bench")
            read_ranks = args.ranks if name == "directory" else max(args.ranks, REDIS_FOLLOW_RANKS)
            per_rank = args.events // read_ranks
            write_trace(rstore if name == "directory" else base, read_ranks, per_rank)
            rate, n = _reader_rate(rstore)
            write_target = TARGET_WRITE if name == "directory" else TARGET_WRITE_REDIS
            read_target = TARGET_READ if name == "directory" else TARGET_READ_REDIS
            met = w["written"] >= write_target and rate >= read_target
            if redis:
                ports = [s.port for s in cluster.servers] if name == "redis-cluster" and cluster is not None else []
                before, t0 = _requests(ports), time.perf_counter()
                f = _redis_follow(base, REDIS_FOLLOW_RANKS, REDIS_FOLLOW_RATE, max(args.seconds, 1.0))
                spent = time.perf_counter() - t0
                if ports:
                    per_node = [((b[0] - a[0]) / f["write_s"], (b[1] - a[1]) / spent)
                                for a, b in zip(before, _requests(ports), strict=True)]
                    notes.append(f"{name}: requests per second per master: appends while the writers wrote + XREADs "
                                 "while the reader followed: " + ", ".join(f"{x:,.0f} + {y:,.0f}" for x, y in per_node))
                kept_up = f["read"] >= f["written"] and f["catch_up_s"] < 1.0
                met = met and kept_up
                notes.append(f"{name} live follow: {REDIS_FOLLOW_RANKS} ranks x {REDIS_FOLLOW_RATE // 1000}k events/s: "
                             f"{f['written']:,} events written in {f['write_s']:.1f} s, the reader polled "
                             f"{f['read']:,} of them and caught up {f['catch_up_s'] * 1e3:.0f} ms after the "
                             f"writers stopped: {'kept up' if kept_up else 'FELL BEHIND'}")
                if name == "redis":  # (one server: its INFO counts every reply)
                    e = _ends_look(base)
                    notes.append(f"{name} a follower's look at the ends of {ENDS_RANKS:,} closed ranks (every 5 s): "
                                 f"{e['changed_ms']:.2f} ms, {e['changed_bytes']:,.0f} bytes from Redis, "
                                 f"{e['changed_cpu_ms']:.2f} ms of its CPU when nothing changed; reading every copy whole "
                                 f"(as before): {e['whole_ms']:.1f} ms, {e['whole_bytes']:,.0f} bytes, "
                                 f"{e['whole_cpu_ms']:.1f} ms of its CPU")
            table.add_row(name, _fmt_rate(w["alone"]), _fmt_rate(w["produced"]), _fmt_rate(w["written"]),
                          f"{w['dropped']:,}", f"{w['peak_rss_delta'] / 2**20:.0f} MiB",
                          _fmt_rate(rate), "yes" if met else "NO")
            notes.append(f"{name}: targets write ≥ {write_target // 1000}k/s, read ≥ {read_target // 1000}k/s "
                         f"(read {n:,} events from {read_ranks} ranks)")
    finally:
        if redis_server is not None:
            redis_server.stop()
        if cluster is not None:
            cluster.close()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)  # (tens of MiB a run: CI runs it every time)
    console.print(table)
    for note in notes:
        console.print(note)
    console.print("produced/written/dropped/RSS Δ: a producer thread calls a wrapped stand-in op in a tight loop; the "
                  "recorder thread competes with it for the GIL, so 'written' is what one rank "
                  "sustains while its training thread does nothing but communicate.")
    return 0
