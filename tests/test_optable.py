"""One op table (``commscope.optable``): every op the recorder can record has a row, and
every layer's set of op names is derived from the table, so a row reaches them all."""

from __future__ import annotations

from commscope import blocks, events, flightfmt, histories, optable
from commscope.record import nativeops, ops
from commscope.tui import paintcode


def test_every_recordable_op_has_a_row():
    recordable = {*ops.TORCH_OPS, *ops.VARLEN_OPS, *nativeops.NAMES, *(name for _, name in blocks.C10D_OPS)}
    assert recordable - set(optable.OPS) == set()
    assert all(not optable.OPS[n].alias for n in recordable)  # aliases are other tools' names only


def test_every_layer_reads_the_table():
    assert blocks.REDUCING is optable.REDUCING and ops.REDUCING is optable.REDUCING
    assert histories.optable is optable  # (the match key, the model's too: SAME_SHAPE, DTYPE_FREE)
    assert events.P2P_OPS is optable.P2P_OPS
    assert paintcode.VARLEN_OPS is optable.VARLEN and set(ops.VARLEN_OPS) == optable.VARLEN
    assert (flightfmt._SENDS, flightfmt._RECVS) == (optable.SENDS, optable.RECVS)


def test_the_traits_read_as_the_ops_behave():
    o = optable.OPS
    assert o["all_reduce"].reducing and o["reduce_scatter_v"].reducing and not o["broadcast"].reducing
    assert o["isend"].direction == "send" and o["irecv_tensors"].direction == "recv"
    assert o["batch_isend_irecv"].direction is None  # a container: its children are the p2p ops
    assert flightfmt.parse_name("nccl:recv_anysource")[2] == "recv"
    assert "barrier" in optable.DTYPE_FREE and "all_gather_v" in optable.DTYPE_FREE
    assert optable.SAME_SHAPE["all_gather_into_tensor"] == ("in", "out")


def test_the_packed_record_layout_is_checked_on_both_sides():
    """record/native/layout.h static_asserts each packed struct's size; those sizes are
    blocks' struct formats', and the C++ flags and roles are blocks' (distinct names)."""
    import re

    from commscope.record import native

    src = "".join(p.read_text() for p in native.source_files())
    found = re.findall(r'static_assert\(sizeof\(\w+\) == (\d+), "blocks\.(\w+)"\)', src)
    asserted = {name: int(size) for size, name in found}
    assert asserted == {name: getattr(blocks, name).size for name in
                        ("HEADER", "BEGIN_BODY", "SIG_BEGIN_BODY", "DONE_BODY", "SOURCE_BODY")}
    flags = dict(re.findall(r"FLAG_(\w+) = (\d+)", src.split("enum Flag", 1)[1].split("};", 1)[0]))
    assert {k: int(v) for k, v in flags.items()} == {k[5:]: getattr(blocks, k) for k in dir(blocks)
                                                      if k.startswith("FLAG_")}
    roles = dict(re.findall(r"ROLE_(\w+) = (\d+)", src.split("enum Role", 1)[1].split("};", 1)[0]))
    assert {k: int(v) for k, v in roles.items()} == {k[5:]: getattr(blocks, k) for k in dir(blocks)
                                                      if k.startswith("ROLE_")}
    dirs = dict(re.findall(r"DIR_(\w+) = (\d+)", src.split("enum Dir", 1)[1].split("};", 1)[0]))
    assert {k: int(v) for k, v in dirs.items()} == {k[4:]: getattr(optable, k) for k in dir(optable)
                                                     if k.startswith("DIR_")}


_ONE_ROW = r'''
import importlib.util, sys
from pathlib import Path

import commscope
path = Path(commscope.__file__).with_name("optable.py")
text = path.read_text()
head = "OPS: dict[str, Op] = {\n"
assert head in text
text = text.replace(head, head + '    "frob_v": Op(varlen=True, dtype_free=True, reducing=True),\n')
spec = importlib.util.spec_from_loader("commscope.optable", loader=None)
assert "commscope.optable" not in sys.modules
table = sys.modules["commscope.optable"] = commscope.optable = importlib.util.module_from_spec(spec)
exec(compile(text, str(path), "exec"), table.__dict__)  # the row, added in one place

from commscope.record import ops
ops.VARLEN_OPS["frob_v"] = ops.all_gather_v  # its extractor (how to read its arguments)

from types import SimpleNamespace
from commscope import blocks, events, histories
from commscope.analysis import model
from commscope.record import nativeops
from commscope.tui import palette, paintcode

assert "frob_v" in nativeops.NAMES  # the native recorder's names
assert ops.begin_fields("frob_v", "0", None, None, None, None, None, None, None, None, False, None, False,
                        None) == {"op": "frob_v", "group": "0", "redop": "sum"}  # the recorder: reducing
assert "frob_v" in blocks.REDUCING  # the block reader
assert histories.match_key("frob_v", (), (), ("float32",), (), "sum", None)[1] == ()  # the analysis: no dtype
assert "frob_v" not in events.P2P_OPS
sig = SimpleNamespace(op="frob_v", space=model.SPACE_NATIVE, flags=model.COLL)
assert paintcode.categories([sig])[0] & paintcode.CAT_MASK == palette.VARLEN  # the console's colour
print("reached every layer")
'''


def test_a_row_added_in_one_place_reaches_every_layer():
    """Adding an op is its extractor plus one row: the native recorder's names, the
    recorder's begin fields, the block reader, the analysis and the console's colours all
    take the new row, with nothing else edited."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _ONE_ROW], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "reached every layer"
