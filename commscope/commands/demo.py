"""Run a demo workload on local ranks and watch it live in the console.

    commscope demo                          # pick a scenario in the console
    commscope demo missing-rank             # start one right away
    commscope demo p2p-deadlock --ranks 3
    commscope demo healthy-training --headless   # no console: print the diagnosis, exit with its code

Each scenario is real work on real process groups (Gloo on CPU by default, so it runs on
any laptop; --backend nccl needs a GPU per rank).  Hanging scenarios end on their own.
"""

from __future__ import annotations

import argparse

from commscope.commands import options


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("scenario", nargs="?", help="scenario name (omit to pick one in the console)")
    p.add_argument("--ranks", type=int, help="worker processes, a few dozen at most (default: the scenario's, usually 4)")
    p.add_argument("--backend", choices=("gloo", "nccl"), default="gloo", help="process group backend (default gloo)")
    p.add_argument("--store", help="trace store root (default: a fresh temporary directory per run, removed when "
                                   "the demo ends unless --keep)")
    p.add_argument("--keep", action="store_true", help="keep the temporary traces the demo records (their paths are "
                                                       "shown while they run)")
    p.add_argument("--hang-after", type=options.seconds, default=3.0, metavar="SECONDS",
                   help="report ops stuck longer than this (default 3)")
    p.add_argument("--headless", action="store_true",
                   help="no console: run to the end (or until the hang is diagnosed), print the check report "
                        "and exit with its code")
    p.add_argument("--json", action="store_true", help="with --headless: print check's JSON")
    p.add_argument("--list", action="store_true", help="list the scenarios and exit")


def main(args: argparse.Namespace) -> int:
    from commscope.errors import UsageError
    from commscope.scenarios import SCENARIOS
    from commscope.scenarios.base import MAX_RANKS

    if args.list:
        for name, sc in SCENARIOS.items():
            print(f"{name:22} {sc.title}")
        return 0
    if args.scenario is not None and args.scenario not in SCENARIOS:
        raise UsageError(f"unknown scenario {args.scenario!r}; choose one of: {', '.join(SCENARIOS)}")
    if args.ranks is not None and not 1 <= args.ranks <= MAX_RANKS:
        raise UsageError(f"--ranks must be from 1 to {MAX_RANKS} (a worker process each), not {args.ranks}")
    if args.headless:
        from commscope.commands.check import check_store
        from commscope.scenarios import run_headless

        if args.scenario is None:
            raise UsageError("--headless needs a scenario name (see commscope demo --list)")
        try:
            return run_headless(args.scenario, ranks=args.ranks, backend=args.backend, store=args.store,
                                hang_after=args.hang_after, json=args.json, check=check_store, keep=args.keep)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    if args.backend == "nccl":
        _check_gpus(args)
    from commscope.scenarios import SCENARIOS, DemoJob
    from commscope.tui.demo_app import DemoApp

    DemoApp(scenarios=SCENARIOS, job_factory=DemoJob, scenario=args.scenario, ranks=args.ranks,
            backend=args.backend, store=args.store, hang_after=args.hang_after, keep=args.keep).run()
    return 0


def _check_gpus(args: argparse.Namespace) -> None:
    """Fail before the console opens rather than inside it."""
    import torch

    from commscope.errors import UsageError
    from commscope.scenarios import SCENARIOS

    need = args.ranks or (SCENARIOS[args.scenario].default_ranks if args.scenario else 1)
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if have < need:
        raise UsageError(f"--backend nccl needs {need} GPUs (one per rank), found {have}; use --backend gloo")
