"""Flight Recorder merge: which entries the wrapper already saw, and how the rest become ops."""

from __future__ import annotations

import itertools

from commscope.record.flight import FlightRecorderMerge, WrapperWindows, op_name


def entry(rid, ts, name="gloo:all_reduce", seq=None, tid=7, group="0", retired=True, **kw):
    return {"record_id": rid, "time_created_ns": ts, "profiling_name": name, "collective_seq_id": seq or rid,
            "p2p_seq_id": 0, "thread_id": str(tid), "process_group": [group, "default_pg"], "retired": retired,
            "state": "scheduled", "input_sizes": [[4]], "input_dtypes": ["Float"], "output_sizes": [[4]],
            "output_dtypes": ["Float"], **kw}


def test_entries_inside_a_wrapped_op_are_skipped_and_the_rest_become_ops():
    windows = WrapperWindows()
    win = windows.open(7, "0", 100)
    win.end = 200  # a wrapped op on thread 7, group 0, from t=100 to t=200
    merge = FlightRecorderMerge(itertools.count(1000).__next__)
    out = merge.poll([entry(0, 150), entry(1, 250), entry(2, 160, tid=8), entry(3, 170, group="1")], windows, 300)
    begins = [e for e in out if e["phase"] == "begin"]
    # 0 is the wrapped op's own; 1 is later; 2 runs on another thread (autograd); 3 on another group
    assert [b["seq"] for b in begins] == [1, 2, 3]
    assert all(b["src"] == "fr" and b["in_bytes"] == 16 and b["in_dtypes"] == ["float32"] for b in begins)
    ends = [e for e in out if e["phase"] == "end"]
    assert len(ends) == 3 and all(e.get("approx") for e in ends)  # Gloo: no completion time


def test_unfinished_entries_end_at_the_last_time_they_were_seen_running():
    merge = FlightRecorderMerge(itertools.count(1).__next__)
    windows = WrapperWindows()
    first = merge.poll([entry(0, 100, retired=False)], windows, now=500)
    assert [e["phase"] for e in first] == ["begin"]
    second = merge.poll([entry(0, 100, retired=False)], windows, now=900)
    assert second == []  # still running
    third = merge.poll([entry(0, 100, retired=True, state="completed", time_discovered_completed_ns=950,
                              duration_ms=0.5)], windows, now=1500)
    assert third == [{"type": "op", "ts": 950, "phase": "end", "id": 1, "gpu_ns": 500_000}]
    # an entry that falls out of the ring before finishing ends, approximately, when last seen
    merge.poll([entry(1, 1000, retired=False)], windows, now=1600)
    gone = merge.poll([entry(5, 2000)], windows, now=2500)
    assert {"type": "op", "ts": 1600, "phase": "end", "id": 2, "approx": True} in gone


def test_a_wrapped_ring_is_counted_as_missed():
    merge = FlightRecorderMerge(itertools.count(1).__next__)
    windows = WrapperWindows()
    merge.poll([entry(0, 1), entry(1, 2)], windows, 10)
    merge.poll([entry(7, 8), entry(8, 9)], windows, 20)
    assert merge.missed == 5


def test_profiling_names():
    assert op_name("nccl:send 0->1") == ("send", "send", 1)
    assert op_name("nccl:recv 3->0") == ("recv", "recv", 3)
    assert op_name("gloo:all_reduce") == ("all_reduce", None, None)
