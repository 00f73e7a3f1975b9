"""One Flight Recorder translator: the live merge and the dump import read entries alike."""

from __future__ import annotations

import itertools

from commscope.analysis.flight_import import dumps_to_events
from commscope.flightfmt import FrOp, group_peer, nbytes, parse_name, tensor_fields
from commscope.record.flight import FlightRecorderMerge, WrapperWindows

# Group "3" holds global ranks [2, 5, 7, 9]; this is global rank 9 (group rank 3) receiving
# from group rank 0, i.e. global rank 2.  Fields as an NCCL dump (version 2.x) writes them.
SUBGROUP = [2, 5, 7, 9]


def nccl_entry(rid=4, name="nccl:recv 3<-0", dtype="Float8_e4m3fn", **kw):
    return {"record_id": rid, "pg_id": 1, "process_group": ["3", "undefined"], "collective_seq_id": 0,
            "p2p_seq_id": 2, "op_id": 2, "profiling_name": name, "time_created_ns": 1_700_000_000_000_000_000 + rid,
            "input_sizes": [[16, 8]], "input_dtypes": [dtype], "output_sizes": [[16, 8]], "output_dtypes": [dtype],
            "state": "completed", "time_discovered_started_ns": 1_700_000_000_000_000_500,
            "time_discovered_completed_ns": 1_700_000_000_000_009_000, "retired": True, "timeout_ms": 600000,
            "is_p2p": True, "duration_ms": 0.25, "thread_id": "140031", "thread_name": "pt_main_thread",
            "frames": [], **kw}


def test_profiling_names_both_arrows_and_backends():
    assert parse_name("nccl:recv 3<-0") == ("nccl", "recv", "recv", 0)
    assert parse_name("nccl:recv 0->3") == ("nccl", "recv", "recv", 0)
    assert parse_name("nccl:send 3->1") == ("nccl", "send", "send", 1)
    assert parse_name("nccl:send 1<-3") == ("nccl", "send", "send", 1)
    assert parse_name("gloo:irecv 2<-1") == ("gloo", "irecv", "recv", 1)
    assert parse_name("xccl:all_gather_into_tensor_coalesced") == ("xccl", "all_gather_into_tensor_coalesced",
                                                                   None, None)
    assert parse_name("") == ("", "unknown", None, None)
    assert parse_name("nccl:send") == ("nccl", "send", "send", None)


def test_group_peers_become_global_ranks():
    assert group_peer(SUBGROUP, 0) == 2 and group_peer(SUBGROUP, 3) == 9
    assert group_peer(None, 3) == 3 and group_peer(SUBGROUP, 7) == 7 and group_peer(SUBGROUP, None) is None
    op = FrOp(nccl_entry(), {"3": SUBGROUP}.get)
    assert (op.group, op.op, op.direction, op.peer, op.is_p2p) == ("3", "recv", "recv", 2, True)


def test_dtypes_and_bytes_include_float8():
    f = tensor_fields(nccl_entry())
    assert f["in_dtypes"] == ["float8_e4m3fn"] and f["in_bytes"] == 128 and f["out_bytes"] == 128
    assert tensor_fields(nccl_entry(dtype="BFloat16"))["in_bytes"] == 256
    assert nbytes([[2, 3]], ["Float8_e5m2"]) == 6 and nbytes([[2, "x"]], ["Float"]) > (1 << 62) - 1


def test_live_merge_and_dump_import_agree_on_a_subgroup_recv():
    entry = nccl_entry()
    live = FlightRecorderMerge(itertools.count(1).__next__, {"3": SUBGROUP}.get)
    live_begin = next(e for e in live.poll([entry], WrapperWindows(), now=entry["time_created_ns"] + 10**6)
                      if e["phase"] == "begin")
    dump = {"version": "2.4", "pg_config": {"3": {"name": "3", "desc": "undefined", "ranks": str(SUBGROUP)}},
            "entries": [entry]}
    imported = next(e for e in dumps_to_events({9: dump}) if e["type"] == "op" and e["phase"] == "begin")
    same = ("op", "group", "dir", "peer", "in_shapes", "in_dtypes", "in_bytes", "out_shapes", "out_dtypes",
            "out_bytes")
    assert {k: live_begin[k] for k in same} == {k: imported[k] for k in same}
    assert live_begin["peer"] == 2 and live_begin["dir"] == "recv" and live_begin["in_dtypes"] == ["float8_e4m3fn"]
