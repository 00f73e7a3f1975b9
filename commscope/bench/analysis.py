"""Analysis: model build rate, full diagnose() and incremental 1k-event updates on a synthetic job.

The trace is generated in memory (64 ranks x 20k ops by default; see
commscope.analysis.synth.healthy_trace) and then, measured side by side in this run:
a bare loop that touches every event once (the floor any Python consumer pays), the
model build from the decoded events (round-tripped through the store encoding rank by
rank, as a reader hands them over), diagnose() on the whole model, ingesting 1k-event
batches into the built model, and the TUI's window and op-detail queries.
Targets: build >= 1M events/s, diagnose <= 1 s, 1k-event batch <= 10 ms.

Then the model build from op records in columns, as a whole read hands them over (a job
of ``--column-ranks`` ranks x 400 collectives written through the real directory store in
the native block format, read once): the ranks new to the model ingested together against
rank by rank (``TraceModel.batch_ranks``), alternating, medians; both must give the same
model size.

Then ``diagnose`` on wide jobs that stopped (``--stopped-ranks`` ranks, 16,384 by default), in
each of the ways ``analysis.synth.STOPS`` lists: half a second after the stop and when a
console judges it (a minute after; a job stopped as a whole, at its end), the slower shown,
with whether the findings are exactly those the way must give (one per root cause: a
fault on half the ranks is one finding, not one a rank).  Each of these once took minutes
at 16k ranks (a question about one rank that walked every member, asked by every rank).
"""

from __future__ import annotations

import argparse
import gc
import time

from commscope.bench.stats import fmt_time, median, quantile
from commscope.commands import options


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ranks", type=options.positive, default=64)
    p.add_argument("--ops", type=options.positive, default=20_000, help="ops per rank")
    p.add_argument("--repeat", type=options.positive, default=3)
    p.add_argument("--column-ranks", type=options.positive, default=4096,
                   help="ranks of the job whose op records are ingested from columns (0: skip; default 4096)")
    p.add_argument("--stopped-ranks", type=options.positive, default=16384,
                   help="ranks of the stopped jobs diagnose() is timed on (0: skip; default 16384)")
    p.add_argument("--quick", action="store_true", help="8 ranks x 2k ops, 16 column ranks, 256 stopped (smoke run)")


def _bare(events: list[dict]) -> float:
    t0 = time.perf_counter()
    n = 0
    for e in events:
        if e["type"] == "op":
            n += 1
    return time.perf_counter() - t0


def _as_decoded(events: list[dict]) -> list[dict]:
    """Round-trip through the store encoding, rank by rank, as a reader's poll() hands them over."""
    from commscope.events import decode_lines, encode_lines

    out: list[dict] = []
    start = 0
    for k in range(1, len(events) + 1):
        if k == len(events) or events[k]["rank"] != events[start]["rank"]:
            chunk = events[start:k]
            for j in range(0, len(chunk), 20_000):
                out.extend(decode_lines(encode_lines(chunk[j:j + 20_000]))[0])
            start = k
    return out


def _columns_build(ranks: int, repeat: int) -> tuple[int, list[float], list[float]] | None:
    """(records, build times together, build times rank by rank) from a written job's op
    records: one read, then each build of the model from what it gave, alternating."""
    import shutil
    import tempfile

    from commscope.analysis import TraceModel
    from commscope.bench.synthstore import JobShape, write_store
    from commscope.events import gc_paused
    from commscope.store import open_reader

    root = tempfile.mkdtemp(prefix="commscope-bench-analysis-")
    try:
        write_store(root, JobShape(ranks, 400))
        reader = open_reader(root)
        with gc_paused():
            steps = list(reader.bulk(8 << 20))
        reader.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    records = sum(len(o) for b in steps for o in b.ops)
    if not records:
        return None
    times: dict[bool, list[float]] = {True: [], False: []}
    sizes: dict[bool, int] = {}
    for k in range(repeat):
        for together in (True, False) if k % 2 == 0 else (False, True):
            gc.collect()
            m = TraceModel()
            m.batch_ranks = together
            with gc_paused():
                t0 = time.perf_counter()
                for b in steps:
                    m.ingest(b.events, b.ops, b.spans, b.beats)
                times[together].append(time.perf_counter() - t0)
            sizes[together] = m.total_ops()
    if sizes[True] != sizes[False]:
        raise RuntimeError(f"the two builds disagree: {sizes[True]} against {sizes[False]} ops")
    return records, times[True], times[False]


def run(args: argparse.Namespace) -> int:
    from commscope.analysis import TraceModel, diagnose
    from commscope.analysis.synth import healthy_trace

    ranks, ops = (8, 2000) if args.quick else (args.ranks, args.ops)
    print(f"generating a healthy synthetic trace: {ranks} ranks x {ops} ops ...", flush=True)
    events = _as_decoded(healthy_trace(ranks, ops))
    n = len(events)
    print(f"{n:,} events")
    gc.collect()
    gc.freeze()  # the generated events are long-lived; keep the collector off them
    bare = [_bare(events) for _ in range(args.repeat)]
    builds = []
    model = None
    for _ in range(args.repeat):
        model = None
        gc.collect()
        t0 = time.perf_counter()
        m = TraceModel()
        m.ingest(events)
        builds.append(time.perf_counter() - t0)
        model = m
    assert model is not None
    nops = model.total_ops()
    col_bytes = sum(getattr(rt, c).nbytes for rt in model.ranks.values()
                    for c in ("begin", "end", "wb", "we", "done", "gpu", "comp", "id", "seq", "peer", "parent",
                              "sig", "flags", "id2idx"))
    idx_bytes = sum(gi.seqs.mat.nbytes for gi in model.coll.values()) + sum(ch.mat.nbytes for ch in model.p2p.values())
    diag = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        found = diagnose(model, hang_after=30.0)
        diag.append(time.perf_counter() - t0)
    # incremental: rebuild without the tail, then feed the tail in 1k-event batches as a poll would
    tail = min(n // 4, 200_000)
    head, rest = events[: n - tail], events[n - tail:]
    by_rank: dict[int, list[dict]] = {}
    for e in rest:
        by_rank.setdefault(e["rank"], []).append(e)
    inter: list[dict] = []
    pos = dict.fromkeys(by_rank, 0)
    step = max(1, 1000 // max(1, len(by_rank)))
    while any(pos[r] < len(v) for r, v in by_rank.items()):
        for r, v in by_rank.items():
            inter.extend(v[pos[r]: pos[r] + step])
            pos[r] += step
    inc = TraceModel()
    inc.ingest(head)
    batch_times = []
    for k in range(0, len(inter), 1000):
        batch = inter[k: k + 1000]
        t0 = time.perf_counter()
        inc.ingest(batch)
        batch_times.append(time.perf_counter() - t0)
    diag_inc = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        diagnose(inc, hang_after=30.0)
        diag_inc.append(time.perf_counter() - t0)
    # TUI queries
    t_lo, t_hi = model.bounds()
    span = (t_hi - t_lo) // 200
    win = []
    det = []
    for k in range(200):
        r = k % ranks
        a = t_lo + k * span
        t0 = time.perf_counter()
        idx = model.ops_in_window(r, a, a + span)
        win.append(time.perf_counter() - t0)
        if idx.shape[0]:
            t0 = time.perf_counter()
            model.op(r, int(idx[0]))
            model.matching(r, int(idx[0]))
            det.append(time.perf_counter() - t0)
    gc.unfreeze()

    def rate(sec: float) -> str:
        return f"{n / sec / 1e6:.2f} M events/s"

    b_med, f_med = median(bare), median(builds)
    print()
    print(f"{'measure':<44}{'median':>14}{'rate / note':>34}")
    print(f"{'bare loop over events (floor)':<44}{fmt_time(b_med):>14}{rate(b_med):>34}")
    print(f"{'model build from decoded events':<44}{fmt_time(f_med):>14}{rate(f_med):>34}")
    print(f"{'  build / bare loop':<44}{f_med / b_med:>13.1f}x{'target >= 1 M events/s':>34}")
    print(f"{'diagnose(), full model':<44}{fmt_time(median(diag)):>14}{'target <= 1 s':>34}")
    print(f"{'diagnose(), incrementally built model':<44}{fmt_time(median(diag_inc)):>14}{'':>34}")
    print(f"{'ingest 1k-event batch (median)':<44}{fmt_time(median(batch_times)):>14}{'target <= 10 ms':>34}")
    print(f"{'ingest 1k-event batch (p99)':<44}{fmt_time(quantile(batch_times, 0.99)):>14}"
          f"{f'{len(batch_times)} batches':>34}")
    print(f"{'ops_in_window (1/200 of trace)':<44}{fmt_time(median(win)):>14}{'':>34}")
    print(f"{'op detail + matching ops':<44}{fmt_time(median(det) if det else float('nan')):>14}{'':>34}")
    print(f"{'model arrays':<44}{col_bytes / 2**20:>11.1f} MiB"
          f"{f'{col_bytes / max(nops, 1):.0f} B/op, {nops:,} ops':>34}")
    print(f"{'cross-rank indexes':<44}{idx_bytes / 2**20:>11.1f} MiB{'':>34}")
    print(f"{'findings on the healthy trace':<44}{len(found):>14}{'expected 0':>34}")
    column_ranks = 16 if args.quick else args.column_ranks
    if column_ranks:
        print(f"\nwriting and reading a job of {column_ranks:,} ranks x 400 collectives (native blocks) ...",
              flush=True)
        got = _columns_build(column_ranks, args.repeat)
        if got is not None:
            records, together, alone = got
            t1, t2 = median(together), median(alone)
            print(f"{'model build from columns, new ranks together':<44}{fmt_time(t1):>14}"
                  f"{f'{records / t1 / 1e6:.2f} M records/s':>34}")
            print(f"{'model build from columns, rank by rank':<44}{fmt_time(t2):>14}"
                  f"{f'{records / t2 / 1e6:.2f} M records/s':>34}")
            print(f"{'  rank by rank / together':<44}{t2 / t1:>13.2f}x{f'{column_ranks:,} ranks, {records:,} records':>34}")
    stopped_ranks = min(args.stopped_ranks, 256) if args.quick else args.stopped_ranks
    wrong = _stopped(stopped_ranks) if stopped_ranks else 0
    return 0 if not found and not wrong else 1


def _stopped(world: int) -> int:
    """Time ``diagnose`` on each way a job of ``world`` ranks stops; return how many gave
    other findings than the way must."""
    from commscope.analysis import TraceModel, diagnose
    from commscope.analysis.synth import STOPS, S, stopped_job

    print(f"\ndiagnose() of jobs of {world:,} ranks that stopped, half a second after and when a console "
          f"judges them ...", flush=True)
    print(f"{'way the job stopped':<50}{'diagnose':>10}  findings")
    wrong = 0
    for way, stop in STOPS.items():
        events, t = stopped_job(world, way)
        model = TraceModel.from_events(events)
        del events
        times = []
        found = []
        for now in (t + S // 2, model.end_ns if stop.whole else t + 60 * S):
            model.judged = None  # each judged afresh, as a new moment is
            t0 = time.perf_counter()
            found = diagnose(model, now, 2.0)
            times.append(time.perf_counter() - t0)
        got = [(f.kind, f.culprits) for f in found]
        ok = got == stop.expect(world)
        wrong += not ok
        said = ", ".join(f"{k} ({len(c):,})" if c else k for k, c in got) or "none"
        print(f"{way:<50}{fmt_time(max(times)):>10}  {said}{'' if ok else '  WRONG: expected ' + str(stop.expect(world))}",
              flush=True)
    return wrong
