"""The op sources and the recorder agree on one interface (``record/opsource.OpSource``):
both sources have every member it names, and the recorder asks for nothing else."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

from commscope.record.nativeops import NativeOps
from commscope.record.opsource import OpSource
from commscope.record.pyhot import PythonOps

RECORDER = Path(__file__).resolve().parent.parent / "commscope" / "record" / "recorder.py"


def _members(proto: type) -> set[str]:
    names = {n for n, v in vars(proto).items() if inspect.isfunction(v) and not n.startswith("_")}
    return names | set(proto.__annotations__)


def test_both_sources_have_every_member_the_protocol_names():
    members = _members(OpSource)
    assert {"install", "collect", "request_settle", "spools", "rec"} <= members
    for source in (NativeOps, PythonOps):
        init = inspect.getsource(source.__init__)
        missing = {n for n in members if not hasattr(source, n) and not re.search(rf"self\.{n}\b\s*[:=]", init)}
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
    assert asked <= _members(OpSource), asked - _members(OpSource)
    assert "hasattr(self.ops" not in RECORDER.read_text()
