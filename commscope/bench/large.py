"""Large traces: check's time and memory, the reader and model's rate, and a live batch's cost, at 1k-16k ranks.

Each job is written first (``bench/synthstore.py``: R ranks x N collectives, FSDP-like,
one rank missing from the last all_reduce) through the real directory store writer, in
the native recorder's block format and, for the JSON figure, as JSON op events.  Then,
side by side in one run, alternating A and B, each measurement in a fresh process (its
peak RSS is its own):

    events   the path before columns: the reader returns every event as a dict (blocks
             expanded), all of them at once (``read_all``), and the model is built from
             them (``TraceModel.from_events``).  Its blocks decode through the same
             decoder as the columns now (then become dicts), so it runs faster than the
             code before this path existed did
    columns  ``analysis.source.load_trace``: op records stay in numpy columns, read and
             ingested in 8 MiB steps (``source.LOAD_STEP``), the model frozen out of the
             collector's sight at the end as ``check`` freezes it

each followed by ``diagnose()``, as ``commscope check`` runs.  Both must name the same
finding (kind and culprit), or the run fails.  The columns' load says where its CPU went:
the reading process (listing the streams, receiving the workers' columns, the model), the
read workers (``store/bulkread.py``, a large job's streams decoded apart), and what one
worker takes to start and read a stream; on a machine of few cores the load is bound by
their sum, not by the wall clock of any one of them.  The events path holds every event of the
trace at once: where it would not fit (``--events-max-ranks``), it runs on the same job
with fewer ops (``--events-fraction``), and its figures are labelled so.

Then a live console's batch: the model built from all but the last events, the rest
ingested in 10k-event batches drawn from every rank in turn (a poll of a job this wide
sees a few events from each of many ranks), as event dicts and as columns (one
``OpRecords`` per rank in each batch, as a reader's poll hands them over), the columns
both rank by rank and with the ranks already begun ingested together, into two models
built alike, each batch into both, alternating which goes first.

Then a live reader's poll (``polls``): a block line appended to every stream of a job
through the real writers, then polled by a reader that decodes the streams' chunks
together and by one that decodes each alone, alternating.

Last, a week-long job (``week``): its bytes on disk with and without retention, and a read
of all of it against a read of its last 30 minutes, which must find the same; then the same
week in a private redis-server, its streams marked (``store/redis_marks.py``), read whole
and from the marks.

Targets (docs/large.md): check 4,096 ranks x 400 ops <= 5 s and 1.5 GiB, 16,384 ranks <= 15 s
and 4 GiB; reader + model >= 2 M events/s (native), >= 1 M/s (JSON); a 10k-event batch <= 5 ms
at 16,384 ranks.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from commscope import compiled
from commscope.bench.stats import fmt_bytes, fmt_time, median, quantile
from commscope.store.bulkread import cores

if TYPE_CHECKING:
    from commscope.bench.synthstore import JobShape
    from commscope.window import Since

TARGETS = {4096: (5.0, 1.5 * 2**30), 16384: (15.0, 4 * 2**30)}
#: Reader + model, M events/s, by the trace's format (issue 25)
RATE_TARGETS = {"native": 2.0, "json": 1.0}


#: The core counts ``extrapolated`` speaks for
EXTRAPOLATED_CORES = (4, 8, 16)


def extrapolated(events: int, main_cpu: float, workers_cpu: float, workers: int, start_cpu: float,
                 cores: int, max_readers: int, jobs: int = 0, jobs_here: int = 0) -> float:
    """Reader + model, events a second, on a machine of ``cores`` cores, from the CPU times
    of a whole read measured with ``workers`` read workers (each paid ``start_cpu`` to
    start) that read ``jobs - jobs_here`` of its ``jobs`` chunks, the reading process the
    rest: an extrapolation, not a measurement.  A chunk costs the reading process what it
    cost a worker; the rest of its CPU is ingesting (and listing).  There the read takes
    ``min(max_readers, cores)`` readers (``DirectoryReader.MAX_READERS``): the reading
    process and a worker for each other, each paying its start again, the decoding the same
    CPU as here, shared perfectly; the read lasts at least the reading process's ingesting
    and all the CPU over the readers."""
    decode = decoding(workers_cpu, workers, start_cpu)
    ingest = ingesting(main_cpu, decode, jobs, jobs_here)
    if math.isnan(ingest):
        return math.nan
    here = main_cpu - ingest
    readers = max(1, min(max_readers, cores))
    work = ingest + decode + here + (readers - 1) * start_cpu
    wall = max(ingest, work / readers)
    return events / wall if wall > 0 else float("inf")


def decoding(workers_cpu: float, workers: int, start_cpu: float) -> float:
    """The read workers' CPU less what ``workers`` of them paid to start (``start_cpu`` each)."""
    return max(0.0, workers_cpu - workers * start_cpu)


def ingesting(main_cpu: float, workers_decode: float, jobs: int, jobs_here: int) -> float:
    """Of the reading process's CPU, what was not reading chunks itself (listing, receiving,
    the model), each of its ``jobs_here`` chunks taken to cost what the workers' others
    did (``workers_decode`` over ``jobs - jobs_here``).  NaN where it read every chunk:
    no worker's chunk tells what one costs."""
    by_workers = jobs - jobs_here
    if jobs_here and by_workers <= 0:
        return math.nan
    here = workers_decode * jobs_here / by_workers if by_workers > 0 else 0.0
    return max(0.0, main_cpu - here)


def _rank_counts(text: str) -> list[int]:
    """``--ranks``: whole numbers of ranks, at least 2 each (one goes missing), comma-separated."""
    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 2:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of rank counts, each 2 or more "
                                         "(e.g. 1024,4096)")
    return counts


def _formats(text: str) -> list[str]:
    """``--formats``: trace formats, comma-separated, each one ``RATE_TARGETS`` names."""
    formats = list(dict.fromkeys(f.strip() for f in text.split(",") if f.strip()))  # (each once)
    if not formats or any(f not in RATE_TARGETS for f in formats):
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of trace formats: "
                                         f"{', '.join(RATE_TARGETS)}")
    return formats


def _positive(text: str) -> int:
    """``--ops``: a whole number, 1 or more."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not 1 or more")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ranks", type=_rank_counts, default="1024,4096,16384",
                   help="rank counts, comma-separated (default 1024,4096,16384)")
    p.add_argument("--ops", type=_positive, default=400, help="collectives per rank (default 400)")
    p.add_argument("--rate", type=float, default=25.0,
                   help="collectives per second on each rank (default 25: ~1 op per 50 ms recorder tick)")
    p.add_argument("--repeat", type=int, default=3, help="alternating runs of each path (default 3; medians)")
    p.add_argument("--formats", type=_formats, default="native,json",
                   help="trace formats to measure, comma-separated (default native,json)")
    p.add_argument("--events-max-ranks", type=int, default=4096,
                   help="above this many ranks the events path reads a smaller job (default 4096)")
    p.add_argument("--events-fraction", type=float, default=0.25,
                   help="the fraction of ops the events path reads above --events-max-ranks (default 0.25)")
    p.add_argument("--no-batch", action="store_true", help="skip the live-batch measurement")
    p.add_argument("--no-week", action="store_true", help="skip the week-long job (segments, retention, windows)")
    p.add_argument("--week-ranks", type=int, default=256, help="ranks of the week-long job (default 256)")
    p.add_argument("--dir", default=None, help="where to write the jobs (default: a temporary directory, removed)")
    p.add_argument("--quick", action="store_true", help="256 and 1024 ranks x 100 ops, once (a smoke run)")


# ------------------------------------------------------------------ one measurement, in its own process
def measure(path: str, store: str) -> dict[str, Any]:
    """Run ``commscope check``'s work one way on ``store``: load, then diagnose."""
    from commscope.analysis.diagnose import default_hang_after, diagnose, trace_now
    from commscope.analysis.source import load_trace
    from commscope.events import gc_paused

    t0 = time.perf_counter()
    c0 = (_cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN))
    if path == "columns":
        # (as check loads: the model frozen out of the collector's sight, whose first pass after
        # the load walked all of it, ~40 ms at 4k ranks, a cost check never pays)
        model, reader, _ = load_trace(store, freeze=True)
    else:
        from commscope.analysis.model import TraceModel
        from commscope.store import open_reader

        reader = open_reader(store)
        with gc_paused():
            events = reader.read_all()
            model = TraceModel.from_events(events)
        model.note_read_stats(reader.stats)
        del events
    t1 = time.perf_counter()
    main_cpu, workers_cpu = _cpu(resource.RUSAGE_SELF) - c0[0], _cpu(resource.RUSAGE_CHILDREN) - c0[1]
    found = diagnose(model, trace_now(model), default_hang_after(model))
    t2 = time.perf_counter()
    errors = [(f.kind, f.culprits) for f in found if f.severity == "error"]
    return {"load_s": t1 - t0, "diag_s": t2 - t1, "events": model.events, "ranks": len(model.ranks),
            "ops": model.total_ops(), "rss": peak_rss(),
            "errors": errors, "bytes": reader.stats.bytes, "main_cpu_s": main_cpu, "workers_cpu_s": workers_cpu,
            "workers": reader.stats.workers, "jobs": reader.stats.jobs, "jobs_here": reader.stats.jobs_here,
            "start_cpu_s": _worker_start(store) if reader.stats.workers else 0.0}


def _worker_start(store: str) -> float:
    """CPU seconds a read worker (``store/bulkread.py``) takes to start and read one stream
    (a fresh one's imports and kernels, the install's build, else numba's; a forked one's
    copied pages, as this single-threaded process forks them): what each worker of a whole
    read pays before it decodes."""
    from commscope.store.bulkread import Job, Workers
    from commscope.store.directory import DirectoryReader

    reader = DirectoryReader(store)
    stream, segs = next(iter(reader.streams().items()))
    reader.close()
    before = _cpu(resource.RUSAGE_CHILDREN)
    got = list(Workers(1).run([Job(str(reader.job_dir), None, {stream: segs})]))  # (it ends its worker)
    if len(got) != 1 or isinstance(got[0], Job):  # (no worker read it: nothing to say)
        return float("nan")
    return _cpu(resource.RUSAGE_CHILDREN) - before


def peak_rss() -> int:
    """This process's peak resident bytes: its memory's high-water mark (``VmHWM``), where
    the system says it.  Not ``ru_maxrss``: Linux keeps it across ``exec``, so a measuring
    process started by a bench that had grown (its live batches' models, ~3 GiB at 16k
    ranks) reported the bench's size, not its own.  Else ``ru_maxrss``."""
    with contextlib.suppress(OSError, ValueError, IndexError), open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _cpu(who: int) -> float:
    """CPU seconds (user and system) of this process or of its waited-for children."""
    use = resource.getrusage(who)
    return use.ru_utime + use.ru_stime


def _run(path: str, store: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-m", "commscope.bench.large", path, store], capture_output=True,
                         text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{path} on {store} failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------ the live batch
#: Thread ids like a Linux process's main thread (``pthread_self``), one per rank
THREAD_BASE = 0x7F00_0000_0000
def batches(store: str, columns: bool, tail_events: int, batch: int) -> tuple[dict[str, list[float]], int]:
    """Ingest times of ``batch``-event batches drawn round-robin from every rank's last
    events, into a model built from the rest; ({path: times}, ranks touched per batch).
    Columns go two ways into two models built alike, each batch into both, alternating
    which first: ``rank by rank`` (``TraceModel.live_rows`` 0, the path before) and
    ``together`` (ranks already begun ingested together)."""
    import numpy as np

    from commscope.analysis.model import TraceModel
    from commscope.events import gc_paused
    from commscope.oprecords import OpRecords, Spans, concat
    from commscope.store import open_reader

    reader = open_reader(store)
    with gc_paused():
        if columns:
            b = reader.read_all_batch()
            parts: dict[int, list[OpRecords]] = {}
            for o in b.ops:
                parts.setdefault(o.rank, []).append(o)
            per = {r: concat(p) for r, p in parts.items()}  # (a rank's records may come in several)
            for r, o in per.items():  # a thread id per rank, as processes have (the synthetic job's are all 1)
                o.tid = np.full(len(o), THREAD_BASE + r * 4096, np.uint64)
            head_ops, tails = [], []
            share = max(1, tail_events // max(1, len(per)))
            for o in per.values():
                n = len(o)
                k = min(share, n)
                head_ops.append(o.take(np.arange(0, n - k)))
                tails.append([o.take(np.arange(j, j + 1)) for j in range(n - k, n)])
            models: dict[str, TraceModel] = {}
            for path, rows in (("rank by rank", 0), ("together", TraceModel.live_rows)):
                models[path] = TraceModel()
                models[path].live_rows = rows
                models[path].ingest(b.events, head_ops, beats=b.beats)

            def per_stream(part: list[OpRecords]) -> tuple[list[OpRecords], Spans | None]:
                """A poll's records as a reader hands them over (``blocks.decode_chunks``): one
                ``OpRecords`` per stream, each a slice of one set of columns, and their
                ``Spans`` where every one is."""
                by_rank: dict[int, list[OpRecords]] = {}
                for o in part:
                    by_rank.setdefault(o.rank, []).append(o)
                streams = [concat(p) for p in by_rank.values()]
                whole = concat([dataclasses.replace(o, rank=-1, where=None, exc={}) for o in streams])
                bounds = np.cumsum([0, *map(len, streams)])
                given = [o if o.exc else whole.rows_of(o.rank, a, b)  # (a reader decodes one with texts alone)
                         for o, a, b in zip(streams, bounds.tolist(), bounds[1:].tolist(), strict=False)]
                alone = any(o.exc for o in streams)
                return given, None if alone else Spans(whole, bounds, np.array([o.rank for o in streams], np.int64))

            units = _interleaved(tails)
            times: dict[str, list[float]] = {path: [] for path in models}
            touched = []
            for i, k in enumerate(range(0, len(units), batch)):
                part = units[k:k + batch]
                given, spans = per_stream(part)
                for path in (list(models) if i % 2 == 0 else list(models)[::-1]):
                    t0 = time.perf_counter()
                    models[path].ingest([], given, spans)
                    times[path].append(time.perf_counter() - t0)
                touched.append(len({u.rank for u in part}))
            return times, int(median(touched)) if touched else 0
        events = reader.read_all()
        by: dict[int, list[dict]] = {}
        for e in events:
            by.setdefault(e["rank"], []).append(e)
        share = max(1, tail_events // max(1, len(by)))
        head, tails2 = [], []
        for evs in by.values():
            ops_at = [i for i, e in enumerate(evs) if e["type"] == "op"]
            cut = ops_at[-share] if len(ops_at) >= share else len(evs)
            head.extend(evs[:cut])
            tails2.append(evs[cut:])
        model = TraceModel()
        model.ingest(head)
        event_times, touched = _batches(_interleaved(tails2), batch, model.ingest, lambda e: e["rank"])
    return {"events": event_times}, int(median(touched)) if touched else 0


def polls(root: Path, ranks: int, rounds: int) -> dict[str, list[float]]:
    """A live reader's poll of ``ranks`` streams that each grew by one block line (a begin
    and an end, its table prefix restated, as the native recorder writes) since the last:
    the times of ``rounds`` polls by two readers of the same job, alternating which polls
    first: ``together`` (the streams' chunks decoded together, ``blocks.decode_chunks``)
    and ``alone`` (each chunk decoded as it is read, the path before)."""
    import numpy as np

    from commscope import blocks
    from commscope.bench.synthstore import BEGIN_SIG_DT, END_DT, JobShape, _meta, _sigs, _Tables
    from commscope.store import open_reader, open_writer

    store = tempfile.mkdtemp(prefix="polls-", dir=root)
    shape = JobShape(ranks, 2)
    tables = _Tables(shape, _sigs(shape))
    t0 = time.time_ns()
    writers = [open_writer(store, "j", r, {"world_size": ranks}) for r in range(ranks)]
    for r, w in enumerate(writers):
        w.write([_meta(shape, r, "j", store, t0)])
    dt = np.dtype([("b", BEGIN_SIG_DT), ("e", END_DT)])
    ring = np.zeros(ranks, np.int64)

    def tick(k: int) -> None:
        arr = np.zeros(ranks, dt)
        b, e = arr["b"], arr["e"]
        b["typ"], b["len"], b["id"], b["seq"], b["tid"], b["sid"], b["ts"] = (
            blocks.BEGIN_SIG, BEGIN_SIG_DT.itemsize, k + 1, k + 1, 1, k % 2, t0 + k * 40_000_000)
        e["typ"], e["len"], e["id"], e["ts"] = blocks.END, END_DT.itemsize, k + 1, t0 + k * 40_000_000 + 500_000
        raw, prefix, now = arr.tobytes(), tables.for_sids({0, 1}), time.time_ns()
        for r, w in enumerate(writers):
            data = raw[r * dt.itemsize:(r + 1) * dt.itemsize]
            w.write([blocks.encode_block(prefix + data, r, now, 2, int(ring[r]), int(ring[r]) + len(data))])
            ring[r] += len(data)

    readers = {"together": open_reader(f"{store}/j"), "alone": open_reader(f"{store}/j")}
    readers["alone"].queue_chunks = lambda: None  # type: ignore[method-assign]  # (each chunk as it is read)
    times: dict[str, list[float]] = {name: [] for name in readers}
    try:
        for k in range(rounds + 3):  # (the first polls learn the tables and signatures: not timed)
            tick(k)
            for name in (list(readers) if k % 2 == 0 else list(readers)[::-1]):
                t = time.perf_counter()
                got = readers[name].poll_batch(None)
                if k >= 3:
                    times[name].append(time.perf_counter() - t)
                if sum(map(len, got.ops)) != 2 * ranks:
                    raise RuntimeError(f"a poll of {name} read {sum(map(len, got.ops))} records, not {2 * ranks}")
    finally:
        for w in writers:
            w.close()
        shutil.rmtree(store, ignore_errors=True)
    return times


#: Files ``polls`` holds a rank (its writer's segment and two readers'), and beside them
POLL_FILES_A_RANK, POLL_FILES_BESIDE = 3, 512


def _print_polls(root: Path, ranks: int, rounds: int) -> None:
    """``polls``, printed; not run (and why) where this process may not open the files it
    holds at once: a 16k-rank poll holds ~49k, where a system's hard limit may be 20k, and
    a reader short of descriptors reads part of a poll (warning of each stream it could not)."""
    need = POLL_FILES_A_RANK * ranks + POLL_FILES_BESIDE
    allowed = files_short_of(need)
    if allowed is not None:
        print(f"    live poll: not run at {ranks:,} ranks: it holds a writer's file and two readers' a rank "
              f"at once, ~{need:,}, and this process may open {allowed:,} (ulimit -Hn)")
        return
    got = polls(root, ranks, rounds)
    for what, times in got.items():
        print(f"    live poll, {what:<9} a block line from each of {ranks:,} streams: median "
              f"{fmt_time(median(times))} ({median(times) / ranks * 1e6:.1f} us a stream)")
    alone, together = median(got["alone"]), median(got["together"])
    print(f"    live poll, together against alone: {alone / together:.1f}x")


def files_short_of(need: int) -> int | None:
    """None where this process may open ``need`` files at once (its soft limit raised as
    far, and its hard limit too where it is allowed that: root), else how many it may."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    infinity = resource.RLIM_INFINITY
    if soft == infinity or soft >= need:
        return None
    short = hard != infinity and hard < need
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, need if short else hard))
    except (OSError, ValueError):
        return hard if short else soft
    return None


def _interleaved(tails: list[list[Any]]) -> list[Any]:
    """The ranks' tails round-robin, the order a live console receives them in."""
    depth = max((len(t) for t in tails), default=0)
    return [t[j] for j in range(depth) for t in tails if j < len(t)]


def _batches(units: list[Any], batch: int, ingest: Callable[[list[Any]], object],
             rank_of: Callable[[Any], int],
             prepare: Callable[[list[Any]], list[Any]] = lambda part: part) -> tuple[list[float], list[int]]:
    """Times ``ingest`` on each batch of ``units`` (made what a reader hands over by
    ``prepare``, untimed: the reader's work); with the ranks each batch touched."""
    times, touched = [], []
    for k in range(0, len(units), batch):
        part = units[k:k + batch]
        given = prepare(part)
        t0 = time.perf_counter()
        ingest(given)
        times.append(time.perf_counter() - t0)
        touched.append(len({rank_of(u) for u in part}))
    return times, touched


# ------------------------------------------------------------------ the suite
def _write(root: Path, ranks: int, ops: int, rate: float, fmt: str) -> tuple[str, Any]:
    from commscope.bench.synthstore import JobShape, write_store

    store = root / f"{fmt}-{ranks}x{ops}"
    shape = JobShape(ranks, ops, fault="missing", rate=rate, json=fmt == "json")
    t0 = time.perf_counter()
    last = [0.0]

    tty = sys.stdout.isatty()

    def tick(done: int) -> None:
        now = time.perf_counter()
        if tty and (now - last[0] > 1.0 or done == ranks):
            last[0] = now
            print(f"\r  writing {fmt} {ranks:,} ranks x {ops} ops: {done:,}/{ranks:,}", end="", flush=True)

    written = write_store(str(store), shape, progress=tick)
    # (on disk before the reads are timed: a 16k job's 3 GiB was still being written back
    # while they ran, the system's flusher on the same cores; a trace is read long after)
    os.sync()
    print(f"{chr(13) if tty else ''}  wrote {fmt} {ranks:,} ranks x {ops} ops: {written.events:,} events, "
          f"{fmt_bytes(written.bytes)} in {time.perf_counter() - t0:.1f} s (synced)", flush=True)
    return str(store), written


def run(args: argparse.Namespace) -> int:
    ranks_list = [256, 1024] if args.quick else list(args.ranks)
    ops = 100 if args.quick else args.ops
    repeat = 1 if args.quick else max(1, args.repeat)
    formats = list(args.formats)
    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="commscope-bench-large-"))
    root.mkdir(parents=True, exist_ok=True)
    print(f"jobs in {root}; {repeat} alternating run(s) of each path, medians; each run a fresh process")
    print(f"kernels: {compiled.summary()}")  # (a figure says which it was measured with)
    rows: list[dict[str, Any]] = []
    failed = False
    try:
        for ranks in ranks_list:
            for fmt in formats:
                store, written = _write(root, ranks, ops, args.rate, fmt)
                expected = [(written.kind, [written.shape.culprit_rank])]
                ev_store, ev_note = store, ""
                if ranks > args.events_max_ranks:
                    frac_ops = max(2, int(ops * args.events_fraction))
                    ev_store, _ = _write(root, ranks, frac_ops, args.rate, fmt)
                    ev_note = f" ({frac_ops} ops, {args.events_fraction:g} of the job)"
                results: dict[str, list[dict]] = {"events": [], "columns": []}
                for i in range(repeat):
                    for path in (("events", "columns") if i % 2 == 0 else ("columns", "events")):
                        r = _run(path, ev_store if path == "events" else store)
                        if r["errors"] != [list(x) for x in expected]:
                            print(f"  {path}: WRONG findings {r['errors']} (expected {expected})")
                            failed = True
                        results[path].append(r)
                rows.append({"ranks": ranks, "fmt": fmt, "results": results, "note": ev_note,
                             "scale": (ops / max(2, int(ops * args.events_fraction))) if ev_note else 1.0})
                _print_row(rows[-1])
                if fmt == "native" and not args.no_batch:
                    for columns in (False, True):
                        got, touched = batches(store, columns, tail_events=min(400_000, written.events // 4),
                                               batch=10_000)
                        for what, times in got.items():
                            print(f"    live batch, {what:<12} 10k events over {touched:,} ranks: median "
                                  f"{fmt_time(median(times))}, p99 {fmt_time(quantile(times, 0.99))}"
                                  f" ({len(times)} batches; target <= 5 ms at 16,384 ranks)")
                            rows[-1][f"batch_{what}"] = (median(times), quantile(times, 0.99), touched)
                        if len(got) == 2:
                            slow, fast = (median(t) for t in got.values())
                            print(f"    live batch, together against rank by rank: {slow / fast:.1f}x")
                    _print_polls(root, ranks, 5 if args.quick else 10)
                shutil.rmtree(store, ignore_errors=True)
                if ev_store != store:
                    shutil.rmtree(ev_store, ignore_errors=True)
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)
    print()
    _print_summary(rows)
    if not args.no_week:
        print()
        failed |= week(root if args.dir else Path(tempfile.mkdtemp(prefix="commscope-bench-week-")),
                       16 if args.quick else args.week_ranks, keep=bool(args.dir))
    return 1 if failed else 0


def week(root: Path, ranks: int, keep: bool = False) -> bool:
    """A week-long job, simulated: ops in bursts over 7 days, the fault an hour before the
    end, 512 KiB segments.  Side by side: the bytes it leaves with and without retention (2 MiB
    per rank), and check's read of all of it, kept whole and retained, against ``--since 30m``:
    time, bytes read, and whether the findings are the same.  Returns whether any differs."""
    from commscope.analysis.diagnose import default_hang_after, diagnose, trace_now
    from commscope.analysis.source import load_trace
    from commscope.bench.synthstore import JobShape, du, write_store
    from commscope.store import retention
    from commscope.window import Since

    shape = JobShape(ranks, 8000, fault="dead", days=7, tail_s=3600, hang_after=10.0, segment_bytes=512 << 10,
                     keyframe_s=2.0)
    print(f"a week-long job: {ranks:,} ranks x {shape.ops:,} ops over 7 days, 512 KiB segments with keyframes "
          f"every 2 s of a rank's time (as its keeper writes them), rank {shape.culprit_rank} dead an hour before "
          "the end")

    def check(store: str, since: Since | None) -> tuple[float, int, list[dict], int, int]:
        t0 = time.perf_counter()
        model, reader, _ = load_trace(store, since=since)
        found = diagnose(model, trace_now(model), default_hang_after(model))
        return (time.perf_counter() - t0, reader.stats.bytes, [f.to_json() for f in found],
                reader.stats.summarized, model.nbytes())

    try:
        store = str(root / "week")
        written = write_store(store, shape)
        unbounded = du(store)
        whole = check(store, None)
        job = Path(store) / "synthetic"
        limit = retention.parse("2MiB")
        t0 = time.perf_counter()
        for r in range(ranks):
            retention.close_stream(job, r, 0, limit)
        spent = time.perf_counter() - t0
        bounded = du(store)
        print(f"  on disk: {fmt_bytes(unbounded)} kept whole, {fmt_bytes(bounded)} with --retain 2MiB "
              f"({unbounded / max(bounded, 1):.1f}x less; summarizing and deleting took {fmt_time(spent)} of "
              f"child-process time, {fmt_time(spent / ranks)} per rank)")
        kept = check(store, None)
        tail = check(store, Since(ago_s=1800))
        keys = list(job.glob("*.keys.*.bin"))
        keyed = sum(p.stat().st_size for p in keys)
        for p in keys:  # (the same window from each segment's start: as before keyframes)
            p.unlink()
        bare = check(store, Since(ago_s=1800))
        for name, (t, nbytes, _f, summ, mem) in (("check, all kept", whole), ("check, retained", kept),
                                                  ("check --since 30m", tail),
                                                  ("... no keyframes", bare)):
            extra = f", {summ:,} events summarized" if summ else ""
            print(f"  {name:<18} {fmt_time(t):>9}, {fmt_bytes(nbytes)} read, model {fmt_bytes(mem)}{extra} "
                  f"({whole[0] / t:.1f}x)")
        print(f"  keyframes: {fmt_bytes(keyed)} on disk, retained ({keyed / max(bounded, 1):.1%} of the store)")
        expect = [(written.kind, [shape.culprit_rank])]
        kinds = [(f["kind"], f["culprits"]) for f in tail[2] if f["severity"] == "error"]
        same = whole[2] == kept[2] == tail[2] == bare[2]
        print(f"  findings: {kinds} ({'the same in' if same else 'NOT the same in'} all four; expected {expect})")
        return not same or kinds != expect or week_redis(dataclasses.replace(shape, segment_bytes=None, keyframe_s=None,
                                                                             mark_every_s=3600.0), check)
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)


def week_redis(shape: JobShape, check: Callable[[str, Since | None], tuple[float, int, list[dict], int, int]]) -> bool:
    """The same week in a private redis-server, its streams marked every hour of the job's
    time (``store/redis_marks.py``; here by the writing process, as ``copy`` does, where a live
    job's child would): check of everything against ``--since 30m``.  Returns whether the
    findings differ; a machine without redis-server skips it, saying so."""
    from commscope.bench.redis_server import RedisServer, RedisServerMissing
    from commscope.bench.synthstore import EXPECTED, write_store
    from commscope.window import Since

    try:
        server = RedisServer().start()
    except (RedisServerMissing, RuntimeError, OSError) as exc:
        print(f"  on Redis: skipped ({exc})")
        return False
    try:
        url = f"redis://127.0.0.1:{server.port}/0"
        t0 = time.perf_counter()
        write_store(url, shape)
        spent = time.perf_counter() - t0
        whole = check(url, None)
        tail = check(url, Since(ago_s=1800))
        print(f"  on Redis (one redis-server, marks every hour of the job's time; writing and marking took "
              f"{fmt_time(spent)}):")
        for name, (t, nbytes, _f, _s, mem) in (("check, everything", whole), ("check --since 30m", tail)):
            print(f"  {name:<18} {fmt_time(t):>9}, {fmt_bytes(nbytes)} read, model {fmt_bytes(mem)} "
                  f"({whole[0] / t:.1f}x)")
        same = whole[2] == tail[2]
        kinds = [(f["kind"], f["culprits"]) for f in tail[2] if f["severity"] == "error"]
        print(f"  findings: {kinds} ({'the same in both' if same else 'NOT the same'}; expected "
              f"{[(EXPECTED[shape.fault], [shape.culprit_rank])]})")
        return not same or kinds != [(EXPECTED[shape.fault], [shape.culprit_rank])]
    finally:
        server.close()


def _med(results: list[dict], key: str) -> float:
    return median([r[key] for r in results])


def _print_row(row: dict[str, Any]) -> None:
    res = row["results"]
    for path in ("events", "columns"):
        rs = res[path]
        load, diag, rss = _med(rs, "load_s"), _med(rs, "diag_s"), _med(rs, "rss")
        events = rs[0]["events"]
        note = row["note"] if path == "events" else ""
        print(f"    {path:<8} load {fmt_time(load):>9} ({events / load / 1e6:.2f} M events/s)  diagnose "
              f"{fmt_time(diag):>9}  check {fmt_time(load + diag):>9}  peak RSS {fmt_bytes(rss):>9}{note}")
    rate = res["columns"][0]["events"] / _med(res["columns"], "load_s") / 1e6
    want = RATE_TARGETS[row["fmt"]]
    print(f"    reader + model {rate:.2f} M events/s: target >= {want:g} M/s for {row['fmt']}, "
          f"{'met' if rate >= want else 'not met'}")
    cols = res["columns"]
    workers = _med(cols, "workers_cpu_s")
    n, jobs, jobs_here = int(_med(cols, "workers")), int(_med(cols, "jobs")), int(_med(cols, "jobs_here"))
    print(f"    columns' CPU: {fmt_time(_med(cols, 'main_cpu_s'))} reading process (listing, receiving, model; "
          f"{jobs_here} of {jobs} chunks read itself)")
    print(f"                  {fmt_time(workers)} {n} read worker(s) (each one's start and first stream: "
          f"{fmt_time(_med(cols, 'start_cpu_s'))}); {cores()} core(s)" if n else
          f"                  no read worker; {cores()} core(s)")
    if n:
        from commscope.store.directory import DirectoryReader

        here = cores()
        ingest = ingesting(_med(cols, "main_cpu_s"), decoding(workers, n, _med(cols, "start_cpu_s")), jobs, jobs_here)
        if math.isnan(ingest):
            print("    not extrapolated: the reading process read every chunk (no worker's chunk tells what one costs)")
            return
        rates = [extrapolated(cols[0]["events"], _med(cols, "main_cpu_s"), workers, n, _med(cols, "start_cpu_s"), c,
                              DirectoryReader.MAX_READERS, jobs, jobs_here) / 1e6 for c in (here, *EXTRAPOLATED_CORES)]
        print("    extrapolated from these CPU times, not measured (perfect overlap): " +
              ", ".join(f"{r:.2f} M/s on {c} cores" for r, c in zip(rates[1:], EXTRAPOLATED_CORES, strict=True)) +
              f" (on this machine's {here}: {rates[0]:.2f}, measured {rate:.2f})" +
              (f"; the reading process's ingesting alone {cols[0]['events'] / ingest / 1e6:.2f} M/s" if ingest else ""))


def _print_summary(rows: list[dict[str, Any]]) -> None:
    print(f"{'job':<22}{'check, events':>15}{'check, columns':>16}{'ratio':>8}{'RSS events':>12}"
          f"{'RSS columns':>13}{'target':>16}")
    for row in rows:
        res = row["results"]
        te = _med(res["events"], "load_s") + _med(res["events"], "diag_s")
        tc = _med(res["columns"], "load_s") + _med(res["columns"], "diag_s")
        re_, rc = _med(res["events"], "rss"), _med(res["columns"], "rss")
        scale = row["scale"]
        te_full = te * scale
        mark = "*" if scale != 1.0 else ""
        target = TARGETS.get(row["ranks"])
        tgt = f"{target[0]:g} s, {fmt_bytes(target[1])}" if target and row["fmt"] == "native" else ""
        print(f"{row['fmt'] + ' ' + format(row['ranks'], ',') + ' ranks':<22}{fmt_time(te_full) + mark:>15}"
              f"{fmt_time(tc):>16}{te_full / tc:>7.1f}x{fmt_bytes(re_) + mark:>12}{fmt_bytes(rc):>13}{tgt:>16}")
    if any(r["scale"] != 1.0 for r in rows):
        print("* the events path read a smaller job (see above); its time is scaled to the whole job by ops "
              "(extrapolated), its RSS is what the smaller job took")


if __name__ == "__main__":  # one measurement: python -m commscope.bench.large PATH STORE
    os.environ.setdefault("COMMSCOPE_NO_PROGRESS", "1")
    print(json.dumps(measure(sys.argv[1], sys.argv[2])))
