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
