"""Run a benchmark suite.  Each prints ratios measured side by side in one run and medians.

Suites: overhead (recorder cost), store (trace store throughput), varlen (variable-length
collectives vs hand-written recipes), analysis (model build and diagnose), tui (frame times,
idle CPU), fuzz (readers against hostile input), deaths (records lost per death, per cause),
redact (what hiding credentials costs), snapshot (an uninstrumented job's time to a
finding, and what a snapshot costs it).
"""

from __future__ import annotations

import argparse
import importlib

from commscope import helpformat
from commscope.bench import SUITES


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="suite", metavar="SUITE")
    for name, module in SUITES.items():
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
            continue
        doc = (mod.__doc__ or name).strip()
        sp = sub.add_parser(name, help=doc.splitlines()[0], description=doc,
                            formatter_class=helpformat.Formatter)
        mod.add_arguments(sp)
        sp.set_defaults(_suite=mod.run)


def main(args: argparse.Namespace) -> int:
    if not getattr(args, "_suite", None):
        from commscope.errors import UsageError

        raise UsageError("name a suite: " + ", ".join(SUITES))
    return int(args._suite(args) or 0)
