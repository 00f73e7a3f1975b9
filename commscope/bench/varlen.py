"""Varlen collectives vs hand-written recipes: all_gather_v and send_tensors on local Gloo ranks.

all_gather_v, per payload (4 KiB, 1 MiB, 16 MiB of float32 per rank) and skew (balanced;
rank 0 holding 8x the others), against: the limit (all_gather_into_tensor of equal,
max-sized shards, sizes known; it allocates its output per call like every other variant,
and a second column shows it with the output reused); seed 000 Example 2 (length exchanges,
then all_reduce of zero-padded buffers); the Lightning/torchmetrics recipe (barrier, shape
all_gather, pad every dim to the max, all_gather, trim); all_gather_object.  Also
all_gather_v with sizes= given.

send_tensors of 10 tensors of mixed shapes and dtypes (100 KiB each) from rank 0 to rank 1,
against send_object_list, seed 002's pickle recipe (pickle -> torch.tensor(list(bytes)),
plus the length message it needs to work at all) and one raw send of the same total bytes
with the size known (the limit; the receiver allocates per call, and a second row reuses it).

Strategy tables: every strategy of all_gather_v, gather_v, scatter_v and reduce_scatter_v
forced in turn, and the two metadata exchanges, which is the evidence behind the Gloo rules
in commscope.varlen.

Method: all variants of a case run interleaved (A B C A B C ...) in the same processes after
warmup; each iteration starts after a barrier, its time is the slowest rank's, and the
figure is the median over iterations.
"""

from __future__ import annotations

import argparse
import json
import pickle
import sys
import time
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from commscope.bench.stats import fmt_bytes, fmt_time, median
from commscope.commands import options

KIB, MIB = 1 << 10, 1 << 20
SKEW = 8
TARGET_V_LIMIT = 1.3          # all_gather_v / limit at >= 1 MiB per rank
TARGET_SIZES_LIMIT = 1.1      # all_gather_v(sizes=) / limit at >= 1 MiB per rank
TARGET_VS_ALLREDUCE = 2.0     # speedup over seed 000 Example 2 at 1 MiB
TARGET_VS_OBJECT = 3.0        # speedup over all_gather_object at 1 MiB
TARGET_SEND_RAW = 1.3         # send_tensors / raw send
TARGET_VS_SEND_OBJECT = 5.0   # speedup over send_object_list
P2P_DTYPES = ("float32", "bfloat16", "int64", "bool", "complex64", "float16", "int32", "uint8", "float64", "int8")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ranks", type=options.positive, default=4, help="Gloo ranks (default 4)")
    p.add_argument("--iters", type=options.positive, default=None,
                   help="timed iterations per case (default: 40 at 4 KiB, 20 at 1 MiB, 5 at 16 MiB)")
    p.add_argument("--warmup", type=options.count, default=2, help="untimed iterations per case (default 2)")
    p.add_argument("--no-strategies", action="store_true", help="skip the per-strategy tables")
    p.add_argument("--quick", action="store_true", help="tiny payloads and few iterations (smoke test)")
    p.add_argument("--json", metavar="FILE", help="also write the medians as JSON")
    p.add_argument("--timeout", type=options.amount, default=3600.0, help="seconds before the ranks are killed")


# =========================================================================== plan
def _plan(args: argparse.Namespace) -> dict[str, Any]:
    quick = args.quick
    sizes = [4 * KIB, 64 * KIB] if quick else [4 * KIB, MIB, 16 * MIB]

    def iters(nbytes: int) -> int:
        if args.iters:
            return args.iters
        if quick:
            return 3
        return 40 if nbytes <= 64 * KIB else 20 if nbytes <= MIB else 5

    return {
        "sizes": sizes,
        "iters": {s: iters(s) for s in sizes},
        "warmup": 1 if quick else args.warmup,
        "p2p_bytes": 4 * KIB if quick else 100 * KIB,
        "p2p_iters": 3 if quick else (args.iters or 30),
        "strategy_sizes": [4 * KIB] if quick else [4 * KIB, MIB],
        "strategies": not args.no_strategies,
    }


# =========================================================================== rank side
def _timeit(dist, variants: dict[str, Callable[[], Any]], iters: int, warmup: int) -> dict[str, list[float]]:
    """Interleaved A B C ... rounds, each op after a barrier; this rank's times per variant."""
    times: dict[str, list[float]] = {k: [] for k in variants}
    for it in range(warmup + iters):
        for name, fn in variants.items():
            dist.barrier()
            t0 = time.perf_counter()
            fn()
            dt = time.perf_counter() - t0
            if it >= warmup:
                times[name].append(dt)
    return times


def _all_gather_variants(dist, torch, rank: int, ws: int, sizes: list[int]) -> dict[str, Callable[[], Any]]:
    import torch.nn.functional as F

    from commscope import varlen

    x = torch.randn(sizes[rank])
    width = max(sizes)
    lim_in, lim_out = torch.randn(width), torch.empty(ws * width)
    ag_into = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

    def limit():  # what a caller who knows the sizes does: allocate the output, one collective
        out = torch.empty(ws * width)
        ag_into(out, lim_in)
        return out

    def limit_reused():  # and with the output buffer kept from call to call
        ag_into(lim_out, lim_in)

    def seed000_example2():
        # two length exchanges (as in the seed), then an all_reduce of zero-padded buffers
        lengths = torch.zeros(ws, dtype=torch.int32)
        ag_into(lengths, torch.tensor([1], dtype=torch.int32))
        lens = torch.zeros(ws, dtype=torch.int32)
        ag_into(lens, torch.tensor([x.numel()], dtype=torch.int32))
        total = int(lens.sum())
        offsets = [int(lens[:i].sum()) for i in range(ws)]
        parts = torch.zeros(total)
        parts[offsets[rank]:offsets[rank] + x.numel()] = x
        dist.all_reduce(parts)
        return parts

    def lightning():
        # torchmetrics.utilities.distributed.gather_all_tensors
        result = x.contiguous()
        dist.barrier()
        local_size = torch.tensor(result.shape)
        local_sizes = [torch.zeros_like(local_size) for _ in range(ws)]
        dist.all_gather(local_sizes, local_size)
        max_size = torch.stack(local_sizes).max(dim=0).values
        if all(bool((ls == max_size).all()) for ls in local_sizes):
            out = [torch.zeros_like(result) for _ in range(ws)]
            dist.all_gather(out, result)
            return out
        pad = []
        for val in reversed((max_size - local_size).tolist()):
            pad += [0, val]
        padded = F.pad(result, pad)
        out = [torch.zeros_like(padded) for _ in range(ws)]
        dist.all_gather(out, padded)
        return [o[tuple(slice(int(s)) for s in ls)] for o, ls in zip(out, local_sizes, strict=True)]

    def gather_object():
        out: list[Any] = [None] * ws
        dist.all_gather_object(out, x)
        return out

    return {
        "limit": limit,
        "limit(out reused)": limit_reused,
        "all_gather_v": lambda: varlen.all_gather_v(x),
        "all_gather_v(sizes=)": lambda: varlen.all_gather_v(x, sizes=sizes),
        "seed000_allreduce": seed000_example2,
        "lightning": lightning,
        "all_gather_object": gather_object,
    }


def _p2p_tensors(torch, nbytes: int) -> list:
    out = []
    for i, name in enumerate(P2P_DTYPES):
        dtype = getattr(torch, name)
        n = nbytes // dtype.itemsize
        rows = [1, 4, 16, 2, 8][i % 5]
        shape = (rows, n // rows) if i % 3 else (n,)
        t = torch.randn(shape).to(dtype) if dtype.is_floating_point or dtype.is_complex else \
            torch.randint(0, 2, shape).to(dtype)
        out.append(t)
    return out


def _send_variants(dist, torch, rank: int, nbytes: int) -> dict[str, Callable[[], Any]]:
    from commscope import varlen
    from commscope.varlen import _p2p

    tensors = _p2p_tensors(torch, nbytes)
    total = sum(t.numel() * t.element_size() for t in tensors)
    raw = torch.zeros(total, dtype=torch.uint8)

    def raw_recv():  # size known: allocate, one receive
        out = torch.empty(total, dtype=torch.uint8)
        dist.recv(out, 0)
        return out

    def on(send: Callable[[], Any], recv: Callable[[], Any]) -> Callable[[], Any]:
        return send if rank == 0 else recv if rank == 1 else (lambda: None)

    def pickle_send():
        data = torch.tensor(list(pickle.dumps({"tensors": tensors})), dtype=torch.uint8)
        dist.send(torch.tensor([data.numel()]), 1)
        dist.send(data, 1)

    def pickle_recv():
        n = torch.empty(1, dtype=torch.int64)
        dist.recv(n, 0)
        data = torch.empty(int(n), dtype=torch.uint8)
        dist.recv(data, 0)
        return pickle.loads(bytes(data.tolist()))["tensors"]

    def object_recv():
        box: list[Any] = [None]
        dist.recv_object_list(box, 0)
        return box[0]

    return {
        "raw_send": on(lambda: dist.send(raw, 1), raw_recv),
        "raw_send(buffer reused)": on(lambda: dist.send(raw, 1), lambda: dist.recv(raw, 0)),
        "send_tensors": on(lambda: varlen.send_tensors(tensors, 1), lambda: varlen.recv_tensors(0)),
        "send_tensors[packed]": on(lambda: _p2p.post_send(tensors, 1, None, mode=_p2p.PACKED).wait(),
                                   lambda: varlen.recv_tensors(0)),
        "send_tensors[split]": on(lambda: _p2p.post_send(tensors, 1, None, mode=_p2p.SPLIT).wait(),
                                  lambda: varlen.recv_tensors(0)),
        "send_object_list": on(lambda: dist.send_object_list([tensors], 1), object_recv),
        "seed002_pickle": on(pickle_send, pickle_recv),
    }


def _strategy_variants(dist, torch, rank: int, ws: int, sizes: list[int]) -> dict[str, Callable[[], Any]]:
    from commscope import varlen
    from commscope.varlen import _meta
    from commscope.varlen._plan import SUPPORTED

    x = torch.randn(sizes[rank])
    whole = torch.randn(sum(sizes))
    out: dict[str, Callable[[], Any]] = {}
    equal = len(set(sizes)) == 1
    for op, names in SUPPORTED.items():
        for s in names:
            if s == "native" and not equal:
                continue
            if op == "all_gather_v":
                out[f"{op}[{s}]"] = lambda s=s: varlen.all_gather_v(x, sizes=sizes, strategy=s)
            elif op == "gather_v":
                out[f"{op}[{s}]"] = lambda s=s: varlen.gather_v(x, 0, sizes=sizes, strategy=s)
            elif op == "scatter_v":
                out[f"{op}[{s}]"] = lambda s=s: varlen.scatter_v(whole if rank == 0 else None, 0, split_sizes=sizes,
                                                             strategy=s)
            else:
                out[f"{op}[{s}]"] = lambda s=s: varlen.reduce_scatter_v(whole, sizes, strategy=s)
    g = _meta.Group.of(None)
    rec = _meta.new_record("all_gather_v")
    mine = torch.tensor(rec, dtype=torch.int64)
    meta_out = torch.empty(ws * _meta.WIDTH, dtype=torch.int64)
    out["metadata[p2p]"] = lambda: _meta.exchange(g, rec)  # what every varlen op runs on Gloo
    out["metadata[all_gather]"] = lambda: (_meta._all_gather_into(meta_out, mine, None), meta_out.tolist())
    return out


def _worker(rank: int, ws: int, plan: dict[str, Any]) -> dict[str, list[float]]:
    import warnings

    import torch
    import torch.distributed as dist

    warnings.simplefilter("ignore", FutureWarning)
    torch.manual_seed(rank)
    results: dict[str, list[float]] = {}
    for nbytes in plan["sizes"]:
        base = nbytes // 4
        for skew in (1, SKEW):
            sizes = [base * (skew if r == 0 else 1) for r in range(ws)]
            variants = _all_gather_variants(dist, torch, rank, ws, sizes)
            times = _timeit(dist, variants, plan["iters"][nbytes], plan["warmup"])
            results.update({f"ag|{nbytes}|{skew}|{k}": v for k, v in times.items()})
    variants = _send_variants(dist, torch, rank, plan["p2p_bytes"])
    times = _timeit(dist, variants, plan["p2p_iters"], plan["warmup"])
    results.update({f"p2p|{plan['p2p_bytes']}|1|{k}": v for k, v in times.items()})
    if plan["strategies"]:
        for nbytes in plan["strategy_sizes"]:
            base = nbytes // 4
            for skew in (1, SKEW):
                sizes = [base * (skew if r == 0 else 1) for r in range(ws)]
                variants = _strategy_variants(dist, torch, rank, ws, sizes)
                times = _timeit(dist, variants, plan["iters"].get(nbytes, 5), plan["warmup"])
                results.update({f"strat|{nbytes}|{skew}|{k}": v for k, v in times.items()})
    return results


# =========================================================================== parent side
def _medians(per_rank: list[dict[str, list[float]]]) -> dict[str, float]:
    """Per iteration the slowest rank's time, then the median over iterations."""
    out = {}
    for key in per_rank[0]:
        slowest = [max(ts) for ts in zip(*(r[key] for r in per_rank), strict=True)]
        out[key] = median(slowest)
    return out


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b > 0 else "n/a"


def _mark(ok: bool) -> str:
    return "[green]met[/green]" if ok else "[red]not met[/red]"


def _ag_table(med: dict[str, float], plan: dict[str, Any], ws: int) -> Table:
    t = Table(title=f"all_gather_v vs recipes ({ws} Gloo ranks, float32, median of the slowest rank)",
              caption="(x limit) = time / limit;  (v faster) = recipe time / all_gather_v time")
    for col in ("payload/rank", "skew", "limit", "limit, out reused", "all_gather_v (x limit)", "sizes= (x limit)",
                "seed000 all_reduce (v faster)", "lightning (v faster)", "all_gather_object (v faster)"):
        t.add_column(col, justify="right")
    for nbytes in plan["sizes"]:
        for skew in (1, SKEW):
            k = f"ag|{nbytes}|{skew}|"
            lim, v, vs = med[k + "limit"], med[k + "all_gather_v"], med[k + "all_gather_v(sizes=)"]
            ar, lt, ob = med[k + "seed000_allreduce"], med[k + "lightning"], med[k + "all_gather_object"]
            t.add_row(fmt_bytes(nbytes), "balanced" if skew == 1 else f"rank0 {skew}x", fmt_time(lim),
                      fmt_time(med[k + "limit(out reused)"]),
                      f"{fmt_time(v)} ({_ratio(v, lim)})", f"{fmt_time(vs)} ({_ratio(vs, lim)})",
                      f"{fmt_time(ar)} ({_ratio(ar, v)})", f"{fmt_time(lt)} ({_ratio(lt, v)})",
                      f"{fmt_time(ob)} ({_ratio(ob, v)})")
    return t


def _p2p_table(med: dict[str, float], plan: dict[str, Any]) -> Table:
    nbytes = plan["p2p_bytes"]
    t = Table(title=f"send_tensors: 10 mixed tensors of {fmt_bytes(nbytes)} each, rank 0 -> rank 1")
    for col in ("variant", "median", "÷ raw send", "send_tensors faster by"):
        t.add_column(col, justify="right")
    k = f"p2p|{nbytes}|1|"
    raw, st = med[k + "raw_send"], med[k + "send_tensors"]
    for name in ("raw_send", "raw_send(buffer reused)", "send_tensors", "send_tensors[packed]",
                 "send_tensors[split]", "send_object_list", "seed002_pickle"):
        x = med[k + name]
        t.add_row(escape(name), fmt_time(x), _ratio(x, raw), _ratio(x, st))
    return t


def _targets(med: dict[str, float], plan: dict[str, Any]) -> Table:
    t = Table(title="targets (issue 3)")
    for col in ("target", "case", "measured", "status"):
        t.add_column(col)
    big = [s for s in plan["sizes"] if s >= MIB] or plan["sizes"][-1:]
    for nbytes in big:
        for skew in (1, SKEW):
            k = f"ag|{nbytes}|{skew}|"
            case = f"{fmt_bytes(nbytes)} {'balanced' if skew == 1 else 'skewed'}"
            r = med[k + "all_gather_v"] / med[k + "limit"]
            t.add_row(f"all_gather_v ≤ {TARGET_V_LIMIT}x limit", case, f"{r:.2f}x", _mark(r <= TARGET_V_LIMIT))
            r = med[k + "all_gather_v(sizes=)"] / med[k + "limit"]
            t.add_row(f"all_gather_v(sizes=) ≤ {TARGET_SIZES_LIMIT}x limit", case, f"{r:.2f}x",
                      _mark(r <= TARGET_SIZES_LIMIT))
    one = MIB if MIB in plan["sizes"] else plan["sizes"][-1]
    for skew in (1, SKEW):
        k = f"ag|{one}|{skew}|"
        case = f"{fmt_bytes(one)} {'balanced' if skew == 1 else 'skewed'}"
        s = med[k + "seed000_allreduce"] / med[k + "all_gather_v"]
        t.add_row(f"all_gather_v ≥ {TARGET_VS_ALLREDUCE}x faster than all_reduce recipe", case, f"{s:.2f}x",
                  _mark(s >= TARGET_VS_ALLREDUCE))
        s = med[k + "all_gather_object"] / med[k + "all_gather_v"]
        t.add_row(f"all_gather_v ≥ {TARGET_VS_OBJECT}x faster than all_gather_object", case, f"{s:.2f}x",
                  _mark(s >= TARGET_VS_OBJECT))
    k = f"p2p|{plan['p2p_bytes']}|1|"
    r = med[k + "send_tensors"] / med[k + "raw_send"]
    t.add_row(f"send_tensors ≤ {TARGET_SEND_RAW}x raw send", "10 tensors", f"{r:.2f}x", _mark(r <= TARGET_SEND_RAW))
    s = med[k + "send_object_list"] / med[k + "send_tensors"]
    t.add_row(f"send_tensors ≥ {TARGET_VS_SEND_OBJECT}x faster than send_object_list", "10 tensors", f"{s:.2f}x",
              _mark(s >= TARGET_VS_SEND_OBJECT))
    return t


def _strategy_table(med: dict[str, float], plan: dict[str, Any], ws: int) -> Table:
    t = Table(title=f"strategies forced one by one ({ws} Gloo ranks, float32; ÷ = vs the fastest in its op)")
    cases = [(n, s) for n in plan["strategy_sizes"] for s in (1, SKEW)]
    t.add_column("op[strategy]")
    for n, s in cases:
        t.add_column(f"{fmt_bytes(n)} {'bal' if s == 1 else 'skew'}", justify="right")
    names = sorted({k.split("|", 3)[3] for k in med if k.startswith("strat|")},
                   key=lambda n: (n.split("[")[0], n))
    for name in names:
        cells = []
        for n, s in cases:
            key = f"strat|{n}|{s}|{name}"
            if key not in med:
                cells.append("-")
                continue
            op = name.split("[")[0]
            best = min(v for k, v in med.items() if k.startswith(f"strat|{n}|{s}|{op}["))
            cells.append(f"{fmt_time(med[key])} ({med[key] / best:.2f})")
        t.add_row(escape(name), *cells)
    return t


def run(args: argparse.Namespace) -> int:
    from commscope.launch import run_ranks

    plan = _plan(args)
    console = Console() if sys.stdout.isatty() else Console(width=160)
    console.print(f"varlen bench: {args.ranks} Gloo ranks, payloads {', '.join(fmt_bytes(s) for s in plan['sizes'])}"
                  f"{' (quick)' if args.quick else ''} ...")
    t0 = time.perf_counter()
    results = run_ranks(_worker, args.ranks, args=(plan,), timeout=args.timeout)
    med = _medians([r.value for r in results])
    console.print(_ag_table(med, plan, args.ranks))
    console.print(_p2p_table(med, plan))
    if plan["strategies"]:
        console.print(_strategy_table(med, plan, args.ranks))
    console.print(_targets(med, plan))
    console.print(f"took {time.perf_counter() - t0:.1f} s")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"ranks": args.ranks, "plan": plan, "medians_s": med}, fh, indent=1)
    return 0
