"""One op table (``commscope.optable``): every op the recorder can record has a row, and
every layer's set of op names is derived from the table, so a row reaches them all."""

from __future__ import annotations

from commscope import blocks, events, flightfmt, optable
from commscope.analysis import model
from commscope.record import nativeops, ops
from commscope.tui import paintcode


def test_every_recordable_op_has_a_row():
    recordable = {*ops.TORCH_OPS, *ops.VARLEN_OPS, *nativeops.NAMES, *(name for _, name in blocks.C10D_OPS)}
    assert recordable - set(optable.OPS) == set()
    assert all(not optable.OPS[n].alias for n in recordable)  # aliases are other tools' names only


def test_every_layer_reads_the_table():
    assert blocks.REDUCING is optable.REDUCING and ops.REDUCING is optable.REDUCING
    assert model.SAME_SHAPE is optable.SAME_SHAPE and model.NO_DTYPE is optable.DTYPE_FREE
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
    """commscope_native.cpp static_asserts each packed struct's size; those sizes are
    blocks' struct formats', and the C++ flags and roles are blocks' (distinct names)."""
    import re
    from pathlib import Path

    src = (Path(blocks.__file__).parent / "record" / "native" / "commscope_native.cpp").read_text()
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
