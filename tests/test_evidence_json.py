"""Typed evidence keeps ``check --json`` as it was: every finding's JSON, key for key and in
the same order, on the scenarios of ``evidence_scenarios`` (golden captured before the change)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from evidence_scenarios import findings_json

GOLDEN = json.loads((Path(__file__).parent / "golden" / "evidence.json").read_text())
NOW = findings_json()


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_finding_json_is_byte_identical(name):
    assert NOW[name] == GOLDEN[name]


def test_every_kind_is_covered():
    from commscope.analysis.findings import KINDS

    seen = {f["kind"] for text in GOLDEN.values() for run in json.loads(text) for f in run}
    assert seen == set(KINDS)
