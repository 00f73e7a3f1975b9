"""Typed evidence keeps ``check --json`` as it was: every finding's JSON, key for key and in
the same order, on the scenarios of ``evidence_scenarios`` (golden captured before the change)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from evidence_scenarios import final_findings, findings_json

GOLDEN = json.loads((Path(__file__).parent / "golden" / "evidence.json").read_text())
NOW = findings_json()


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_finding_json_is_byte_identical(name):
    assert NOW[name] == GOLDEN[name]


def test_every_kind_is_covered():
    from commscope.analysis.findings import KINDS

    seen = {f["kind"] for text in GOLDEN.values() for run in json.loads(text) for f in run}
    assert seen == set(KINDS)


def test_each_kind_has_a_typed_record_that_draws_itself():
    """One renderer: check's panel and the detail pane both show ``evidence.render``."""
    import io

    from rich.console import Console

    from commscope.analysis import TraceModel
    from commscope.analysis.evidence import Evidence, RawEvidence
    from commscope.analysis.findings import KINDS
    from commscope.commands.check import render
    from commscope.tui.detail import finding_detail

    seen = set()
    for f in final_findings():
        kind = type(f.evidence)
        assert kind is not RawEvidence and kind.render is not Evidence.render, f.kind
        f.evidence.render(f)  # raises on a bad record (evidence.render would fall back to a plain dump)
        seen.add(f.kind)
        con = Console(width=100, file=io.StringIO(), record=True)
        con.print(finding_detail(f))
        detail = con.export_text()
        con = Console(width=100, file=io.StringIO(), record=True)
        render(TraceModel(), [f], [], 2.0, "x", console=con)
        check = con.export_text()
        for part in f.evidence.render(f):  # the same evidence, word for word, in both
            c = Console(width=100, file=io.StringIO(), record=True)
            c.print(part)
            first = c.export_text().strip().splitlines()[0].strip()
            assert first[:40] in detail and first[:40] in check, (f.kind, first)
    assert seen == set(KINDS)


def test_ranks_with_the_same_stack_share_one_block():
    import io

    from rich.console import Console

    from commscope.analysis.evidence import stacks_block

    def threads(fn: str) -> list[dict]:
        return [{"thread": "MainThread", "frames": [["train.py", 12, fn]], "inside": "all_reduce", "folded": 3}]

    ev = {"stacks": {"3": threads("hold"), "0": threads("step"), "1": threads("step"), "2": threads("log")},
          "stack_info": {"3": {"role": "culprit", "age_s": 0.6, "reason": "request"},
                         "0": {"role": "waiting", "age_s": 0.5, "reason": "request"},
                         "1": {"role": "waiting", "age_s": 0.7, "reason": "request"},
                         "2": {"role": "waiting", "age_s": 0.5, "reason": "request"},
                         "5": {"role": "waiting", "missing": "rank 5 wrote no stack"}}}
    con = Console(file=io.StringIO(), width=100)
    for block in stacks_block(ev):
        con.print(block)
    heads = [ln for ln in con.file.getvalue().splitlines() if ln.startswith("stack of")]
    assert heads == ["stack of rank 3  culprit · 0.6 s ago on request",
                     "stack of ranks 0, 1  waiting · 0.5-0.7 s ago on request",
                     "stack of rank 2  waiting · 0.5 s ago on request",
                     "stack of rank 5  waiting: no stack: rank 5 wrote no stack"]
