"""Records lost per death, per cause: what a rank that dies keeps of what it recorded.

Each run is a real 2-rank Gloo job whose rank 1 dies of the cause right after an op,
with no pause for the recorder to catch up (the worst moment: its last records are still
in the ring, not yet in the store).  Rank 1 writes how many ops it issued just before it
dies; the trace is then read as ``check`` reads it (the launcher, rank 0's recorder or
the reader forwards the dead rank's spool, whichever comes first), and "lost" is that
count minus the ops of rank 1 in the trace.  "diagnosed" counts runs whose only error
finding is the expected kind naming rank 1.  The target is 0 lost for every cause,
SIGKILL included.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import tempfile
import time

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from commscope.bench.stats import median
from commscope.commands import options

#: cause -> the finding kind it must give.
CAUSES = {"abort": "rank_crashed", "segfault": "rank_crashed", "sigkill": "dead_rank", "os_exit": "dead_rank",
          "exception": "rank_crashed", "terminate": "rank_crashed", "sigterm": "dead_rank"}


def die(cause: str) -> None:
    """Die of ``cause`` now (in a rank process)."""
    if cause == "abort":
        os.abort()
    elif cause == "segfault":
        ctypes.string_at(0)
    elif cause == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif cause == "os_exit":
        os._exit(3)
    elif cause == "exception":
        raise RuntimeError("rank 1 gave up")
    elif cause == "terminate":  # what Gloo's and NCCL's threads do on an EnforceNotMet
        from commscope.record import native

        native.load()._die_of_cpp_exception("gloo::EnforceNotMet: sizes differ")
    elif cause == "sigterm":
        os.kill(os.getpid(), signal.SIGTERM)
    raise AssertionError(f"still alive after {cause}")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs", type=options.positive, default=3, help="jobs per cause, store and recorder (default 3)")
    p.add_argument("--ops", type=options.positive, default=200, help="ops rank 1 makes before it dies (default 200)")
    p.add_argument("--redis", action="store_true", help="also on a private redis-server (needs redis-server)")
    p.add_argument("--quick", action="store_true", help="one run per case, directory store, native only")


def _dying(rank: int, ws: int, store: str, cause: str, ops: int, count_path: str) -> None:
    import torch
    import torch.distributed as dist

    import commscope

    commscope.instrument(store, sample_interval=0.2, hang_after=60.0, flight_recorder=False)
    t = torch.ones(16)
    for step in range(ops + 1000):
        if rank == 1 and step == ops:
            with open(count_path, "w") as f:
                f.write(str(step))
            die(cause)
        dist.all_reduce(t)
    commscope.uninstrument()


def one_run(store: str, cause: str, recorder: str, ops: int, tmp: str, job: str) -> tuple[int, bool]:
    """(records lost, diagnosed as expected) for one job."""
    from commscope.analysis.diagnose import diagnose, trace_now
    from commscope.analysis.source import load_trace
    from commscope.launch import Job

    count = os.path.join(tmp, f"{job}.count")
    env = {"COMMSCOPE_JOB": job, "COMMSCOPE_SOURCE": recorder}
    results = Job(_dying, 2, args=(store, cause, ops, count), env=env, pg_timeout=30).start().join(120)
    if not os.path.exists(count):
        raise RuntimeError(f"job {job}: rank 1 never reached op {ops}: " + "; ".join(
            f"rank {r}: exit {x.exitcode} {(x.error or '').strip().splitlines()[-1:]}" for r, x in results.items()))
    model, _reader, _w = load_trace(store if "://" in store else os.path.join(store, job))
    errors = [f for f in diagnose(model, trace_now(model), 60.0) if f.severity == "error"]
    ok = [(f.kind, f.culprits) for f in errors] == [(CAUSES[cause], [1])]
    with open(count) as f:
        own = int(f.read())
    return own - model.n_ops(1), ok


def run(args: argparse.Namespace) -> int:
    console = Console()
    tmp = tempfile.mkdtemp(prefix="commscope-bench-deaths-")
    recorders = ["native"] if args.quick else ["native", "python"]
    runs = 1 if args.quick else args.runs
    stores: dict[str, str] = {"directory": os.path.join(tmp, "trace")}
    server = None
    if args.redis and not args.quick:
        from commscope.bench.redis_server import RedisServer

        server = RedisServer().start()
        stores["redis"] = server.url
    console.print(f"[bold]commscope bench deaths[/] (traces in {escape(tmp)}): rank 1 of 2 dies right after "
                  f"op {args.ops}; {runs} run(s) per row")
    table = Table(title="Records lost per death (own count - ops in the trace); target 0",
                  box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for col in ("cause", "recorder", "store", "lost median", "lost max", "diagnosed", "s/run"):
        table.add_column(col, justify="left" if col in ("cause", "recorder", "store") else "right", no_wrap=True)
    missed = False
    n = 0
    try:
        for cause in CAUSES:
            for recorder in recorders:
                for store_name, store in stores.items():
                    lost, good = [], 0
                    t0 = time.perf_counter()
                    for _ in range(runs):
                        n += 1
                        job = f"d{n}-{cause}"
                        url = f"{store}?job={job}" if store_name == "redis" else store
                        k, ok = one_run(url, cause, recorder, args.ops, tmp, job)
                        lost.append(k)
                        good += ok
                    missed |= max(lost) > 0 or good < runs
                    table.add_row(cause, recorder, store_name, f"{median(lost):g}", str(max(lost)),
                                  f"{good}/{runs}", f"{(time.perf_counter() - t0) / runs:.1f}")
    finally:
        if server is not None:
            server.close()
    console.print(table)
    console.print("[red]records lost or a death misdiagnosed[/]" if missed else
                  "[green]nothing lost, every death named[/]")
    return 0
