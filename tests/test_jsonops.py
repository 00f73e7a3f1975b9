"""JSON op events as columns (commscope.jsonops): a worker of a whole read turns a stream's
op events into ``OpRecords`` where columns say every one of them exactly, and the model
built from those columns is the model built from the events.

Every form columns take is turned into them and back (``OpRecords.events``) unchanged; every
form they do not take leaves the stream's events as they are; a model ingesting the columns
equals one ingesting the dicts (any-source recvs, async waits, device times, exceptions,
approximate ends, nested ops); and a JSON trace read in parallel gives ``check --json``
byte for byte what the sequential read gives.
"""

from __future__ import annotations

import orjson
import pytest
from model_compare import differences, model_state
from readers import by_workers

from commscope import jsonops
from commscope.analysis.diagnose import default_hang_after, diagnose, trace_now
from commscope.analysis.model import TraceModel
from commscope.bench.synthstore import JobShape, write_store
from commscope.blocks import StaticTable
from commscope.schema import SCHEMA_VERSION

T = 1_700_000_000_000_000_000
V = SCHEMA_VERSION


def op(rank: int, ts: int, phase: str, op_id: int, **more) -> dict:
    return {"type": "op", "ts": ts, "phase": phase, "id": op_id, **more, "v": V, "rank": rank}


def begin(rank: int, ts: int, op_id: int, name: str = "all_reduce", *, sk: int = 11, tid: int = 7, **more) -> dict:
    fields = {"op": name, "group": "0", "in_shapes": [[4]], "in_dtypes": ["float32"], "in_bytes": 16,
              "site": "train.py:9 in step", **more}
    return op(rank, ts, "begin", op_id, **fields, tid=tid, sk=sk)


def stream(rank: int) -> list[dict]:
    """One rank's op events in every form columns take: a collective, an async send and its
    wait, an any-source recv resolved at its end, a nested op, a device time, an exception,
    an approximate end, an op the backend refused (``unissued``)."""
    peer = 1 - rank
    return [
        begin(rank, T, 1, seq=1),
        op(rank, T + 10, "end", 1),
        begin(rank, T + 20, 2, "isend", sk=12, seq=1, peer=peer, dir="send", **{"async": True}),  # (one key)
        op(rank, T + 21, "end", 2),
        op(rank, T + 22, "wait_begin", 2),
        op(rank, T + 30, "wait_end", 2),
        begin(rank, T + 40, 3, "irecv", sk=13, dir="recv", **{"async": True}),  # (any source)
        op(rank, T + 45, "end", 3, peer=peer, seq=1),
        begin(rank, T + 50, 4, "all_gather", sk=14, seq=2, device="cuda:0"),
        begin(rank, T + 51, 5, "all_gather", sk=15, parent=4, nested=True),
        op(rank, T + 52, "end", 5),
        op(rank, T + 60, "end", 4, approx=True),
        op(rank, T + 61, "done", 4, gpu_ns=9000),
        begin(rank, T + 70, 6, seq=3),
        op(rank, T + 71, "end", 6, exc="RuntimeError: boom"),
        op(rank, T + 72, "wait_begin", 6, exc="RuntimeError: again"),
        # a broadcast the backend refused, its begin written out with seq 4 before the refusal:
        # its end withdraws the number, which the next collective takes
        begin(rank, T + 75, 7, "broadcast", sk=16, seq=4, root=99),
        op(rank, T + 76, "end", 7, exc="RuntimeError: invalid root rank", unissued=True),
        begin(rank, T + 80, 8, seq=4, tid=8),  # (another thread: its own signature in the model)
    ]


def _without_v(events: list[dict]) -> list[dict]:
    return [{k: v for k, v in e.items() if k != "v"} for e in events]


def test_every_form_columns_take_comes_back_as_it_went():
    table = StaticTable()
    for rank in (0, 1):
        events = stream(rank)
        recs = jsonops.of_events(rank, events, table)
        assert recs is not None and len(recs) == len(events)
        assert _without_v(recs.events()) == _without_v(events)
    # one static per (signature key, thread id, peer), shared by the streams of one reader
    # (the isend's key is the same on both ranks, its peer not: each keeps its own)
    assert len(table.statics) == len({(e["sk"], e["tid"], e.get("peer")) for r in (0, 1) for e in stream(r)
                                      if "sk" in e}) == 8


@pytest.mark.parametrize("odd", [
    begin(0, T, 1, sk=None),  # no signature key: the model interns its fields each time
    {k: v for k, v in begin(0, T, 1).items() if k != "sk"},
    begin(0, T, 1, tid=-1),  # (a thread id columns cannot hold)
    begin(0, T, 1, exc="x"),  # (a phase's key on a begin)
    op(0, T, "end", 1, seq=3),  # a source's seq without its peer
    op(0, T, "end", 1, approx=False),
    op(0, T, "end", 1, unissued=False),
    op(0, T, "wait_end", 1, exc="x", unissued=True),  # (a wait is of an issued op)
    op(0, T, "end", 1, gpu_ns=5),  # (a device time on an end)
    op(0, T, "wait_end", 1, peer=1),
    op(0, T, "done", 1, approx=True),
    op(0, T, "end", 1, tag=3),
    {**op(0, T, "end", 1), "phase": "resume"},
])
def test_a_stream_with_one_event_of_another_form_keeps_its_events(odd):
    events = [*stream(0), odd]
    assert jsonops.of_events(0, events, StaticTable()) is None
    assert jsonops.of_events(0, [], StaticTable()) is None


def test_the_model_of_the_columns_is_the_model_of_the_events():
    events = [e for rank in (0, 1) for e in stream(rank)]
    extra = [{"type": "heartbeat", "ts": T + 90, "inflight": 1, "v": V, "rank": 0},
             {"type": "group", "ts": T, "group": "0", "granks": [0, 1], "v": V, "rank": 1}]
    as_events = TraceModel()
    as_events.ingest(events + extra)
    table = StaticTable()
    as_columns = TraceModel()
    as_columns.ingest(extra, [jsonops.of_events(rank, stream(rank), table) for rank in (0, 1)])
    got, want = model_state(as_columns), model_state(as_events)
    for s in (got, want):  # (how many ingests and in what steps: not what the trace says)
        del s["version"]
        for d in s["ranks"].values():
            del d["version"], d["touched"]
    assert differences(got, want) == []
    for model in (as_columns, as_events):  # the refused broadcast: no seq; the all_reduce #4 matched
        ops = {model.op(0, i)["id"]: model.op(0, i) for i in range(model.ranks[0].n)}
        assert "seq" not in ops[7] and ops[8]["seq"] == 4
        assert model.collective("0", 4) == {r: model.op_index(r, 8) for r in (0, 1)}
    now = T + 10**12
    assert [f.to_json() for f in diagnose(as_columns, now, 5.0)] == [f.to_json() for f in diagnose(as_events, now, 5.0)]


def _checked(store: str) -> tuple[bytes, int]:
    from commscope.analysis.source import load_trace

    model, reader, _ = load_trace(store)
    found = [f.to_json() for f in diagnose(model, trace_now(model), default_hang_after(model))]
    return orjson.dumps(found), model.events


@pytest.mark.parametrize("fault", ["missing", "mismatch"])
def test_a_json_trace_read_apart_is_the_sequential_read(tmp_path, monkeypatch, fault):
    from commscope.analysis import source
    from commscope.store.directory import DirectoryReader

    store = str(tmp_path / "trace")
    write_store(store, JobShape(24, 80, fault=fault, hang_after=2.0, json=True))
    monkeypatch.setenv("COMMSCOPE_READ_WORKERS", "1")
    one = _checked(store)
    by_workers(monkeypatch)
    monkeypatch.setattr(DirectoryReader, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(source, "LOAD_STEP", 1 << 16)  # many chunks
    columns: list[int] = []
    adopt = DirectoryReader._adopt
    monkeypatch.setattr(DirectoryReader, "_adopt", lambda self, got: columns.append(
        0 if got.packed is None else len(got.packed.ranks)) or adopt(self, got))
    assert _checked(store) == one
    assert len(columns) > 1 and sum(columns) == 24  # (every stream's ops came back as columns)
