"""The op sources and the recorder agree on one interface (``record/opsource.OpSource``):
both sources have every member it names, and the recorder asks for nothing else."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from trace_helpers import missing_members, protocol_members

from commscope.record.nativeops import NativeOps
from commscope.record.opsource import OpSource
from commscope.record.pyhot import PythonOps

RECORDER = Path(__file__).resolve().parent.parent / "commscope" / "record" / "recorder.py"


def test_both_sources_have_every_member_the_protocol_names():
    members = protocol_members(OpSource)
    assert {"install", "collect", "request_settle", "spools", "rec"} <= members
    for source in (NativeOps, PythonOps):
        missing = missing_members(source, OpSource)
        assert not missing, (source.__name__, missing)
        for name in members:
            proto_fn, fn = vars(OpSource).get(name), getattr(source, name, None)
            if inspect.isfunction(proto_fn):
                want = list(inspect.signature(proto_fn).parameters)
                assert list(inspect.signature(fn).parameters) == want, (source.__name__, name)


def test_the_recorder_asks_its_source_only_for_what_the_protocol_names():
    asked = set()
    for node in ast.walk(ast.parse(RECORDER.read_text())):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and node.value.attr == "ops":
            asked.add(node.attr)
    assert {"install", "collect", "request_settle"} <= asked
    assert asked <= protocol_members(OpSource), asked - protocol_members(OpSource)
    assert "hasattr(self.ops" not in RECORDER.read_text()
