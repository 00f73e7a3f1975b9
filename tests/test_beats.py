"""Heartbeats and samples in columns (commscope.beats): what a whole read's worker sends
back instead of their dicts, and the model built from them equals the model built from the
events (latest heartbeat, last of equals; samples in order, the last as it was; first and
last times; the count of events), a rank's two incarnations and ranks with nothing else
included.  A stream whose heartbeats carry another key, or whose samples say why GPU
samples are missing, keeps those as dicts.  A parallel read of a job gives the same model.
"""

from __future__ import annotations

import sys

import numpy as np
import orjson
import pytest
from model_compare import differences, model_state
from readers import by_workers, stand_in_workers

from commscope import beats
from commscope.analysis.model import TraceModel

T = 1_780_000_000_000_000_000


def hb(rank: int, ts: int, inflight: int | None = 0, **more) -> dict:
    e = {"type": "heartbeat", "ts": ts, **({} if inflight is None else {"inflight": inflight}), **more}
    return {**e, "v": 3, "rank": rank}


def sample(rank: int, ts: int, **fields) -> dict:
    return {"type": "sample", "ts": ts, "cpu": 50.0, "rss": 1 << 30, **fields, "v": 3, "rank": rank}


def op(rank: int, ts: int, phase: str, op_id: int, **more) -> dict:
    return {"type": "op", "ts": ts, "phase": phase, "id": op_id, **more, "v": 3, "rank": rank}


def stream(rank: int, shift: int = 0) -> list[dict]:
    s = T + shift
    return [
        {"type": "meta", "ts": s, "host": "h", "pid": 1, "world_size": 4, "v": 3, "rank": rank},
        hb(rank, s + 5, 0),
        sample(rank, s + 6, gpu_util=30.0, gpu_mem=5, gpu_mem_total=80),
        op(rank, s + 10, "begin", 1, op="all_reduce", group="0", seq=1, tid=1),
        hb(rank, s + 20, 1),
        sample(rank, s + 21),  # (no GPU fields: NaN)
        hb(rank, s + 20, 2),  # (an equal time: the last of equals counts)
        op(rank, s + 30, "end", 1),
        hb(rank, s + 15, 9),  # (older than the latest: not it)
        sample(rank, s + 40, gpu_power=300.0, gpu_temp=60.0),  # (the last as it was: fields past the columns)
    ]


def test_the_columns_say_what_the_model_keeps_of_them():
    events = stream(3)
    entry, rest = beats.of_events(3, events)
    assert rest == [events[0], events[3], events[7]]
    assert entry is not None
    assert (entry.count, entry.t0, entry.t1, entry.beat_ts, entry.inflight) == (7, T + 5, T + 40, T + 20, 2)
    assert entry.last is events[-1]
    assert entry.cols is not None and np.isnan(entry.cols["gpu_util"][1]) and entry.cols["gpu_util"][0] == 30.0
    b = beats.joined([entry, beats.of_events(5, [hb(5, T + 1, 4)])[0]])
    assert b is not None and b.events() == 8 and b.start.tolist() == [0, 3, 3] and b.last[1] is None


@pytest.mark.parametrize("odd", [
    [hb(0, T + 1, 0, unwaited=[3])],  # (a key the columns leave out)
    [sample(0, T + 2, gpu_error="NVML: not found")],  # (the model keeps the text)
])
def test_a_stream_keeps_the_kind_it_cannot_say_in_columns(odd):
    events = [*stream(0), *odd]
    entry, rest = beats.of_events(0, events)
    taken = {"heartbeat", "sample"} - {odd[0]["type"]}
    assert rest == [e for e in events if e["type"] not in taken]  # (the kind kept, in its place)
    assert entry is not None and entry.count == sum(e["type"] in taken for e in events)


def test_a_stream_with_a_time_of_0_keeps_them():
    """(The model takes a time of 0 as none: with its other events, as they come.)"""
    events = [hb(0, 0, 1), {"type": "meta", "ts": 5, "host": "h", "pid": 1, "world_size": 4, "v": 3, "rank": 0}]
    assert beats.of_events(0, events) == (None, events)


def _state(m: TraceModel) -> dict:
    s = model_state(m)
    del s["version"]  # (how many ingests and in what steps: not what the trace says)
    for d in s["ranks"].values():
        del d["version"], d["touched"]
    return s


def test_the_model_of_the_columns_is_the_model_of_the_events():
    streams = {(0, 0): stream(0), (1, 0): stream(1), (1, 1): stream(1, shift=1000),  # (an incarnation)
               (2, 0): [hb(2, T + 7, 3), sample(2, T + 8)],  # (nothing else)
               (3, 0): [hb(3, T + 9, 1, unwaited=[1]), sample(3, T + 9, gpu_error="no GPU"), *stream(3)]}
    as_events = TraceModel()
    as_events.ingest([e for evs in streams.values() for e in evs])
    entries, rest = [], []
    for (rank, _), evs in streams.items():
        entry, left = beats.of_events(rank, evs)
        rest += left
        if entry is not None:
            entries.append(entry)
    as_columns = TraceModel()
    as_columns.ingest(rest, beats=beats.joined(entries))
    got, want = _state(as_columns), _state(as_events)
    assert differences(got, want) == []
    assert got["ranks"][1]["samples"]["ts"][-1] == float(T + 1040) and got["ranks"][2]["hb_inflight"] == 3


@pytest.mark.parametrize("itself", [False, True], ids=["by workers", "the reading process too"])
def test_a_job_read_apart_gives_the_model_of_a_sequential_read(tmp_path, monkeypatch, itself):
    """Read apart by two workers, or by one and the reading process (which reads chunks
    itself while the worker starts: ``DirectoryReader.READS_ITSELF``), a job gives the model
    of a sequential read."""
    from test_bulkread import GATE
    from test_store_history import wait_for

    from commscope.analysis import source
    from commscope.bench.synthstore import JobShape, write_store
    from commscope.store import directory
    from commscope.store.directory import DirectoryReader

    store = str(tmp_path / "trace")
    write_store(store, JobShape(12, 60, fault="missing", hang_after=2.0))
    # rank 0 again (an incarnation): a sample saying why GPU samples are missing, a heartbeat
    # with another key; their times those of incarnation 0's last (a rank's, in stream order)
    job = next(p for p in (tmp_path / "trace").iterdir() if p.is_dir())
    last = max(orjson.loads(x)["ts"] for x in (job / "rank-00000.jsonl").read_bytes().splitlines())
    (job / "rank-00000+1.jsonl").write_bytes(b"\n".join(orjson.dumps(e) for e in [
        {"type": "meta", "ts": last, "host": "h", "pid": 2, "world_size": 12, "inc": 1, "v": 3, "rank": 0},
        sample(0, last, gpu_error="NVML: not found"), sample(0, last + 1), hb(0, last, 7, unwaited=[1]),
        hb(0, last, 8)]) + b"\n")
    monkeypatch.setenv("COMMSCOPE_READ_WORKERS", "1")
    model, reader, _ = source.load_trace(store)
    one = _state(model)
    assert reader.stats.workers == 0  # (the read workers it started: none)
    here: list[int] = []  # (the chunks the reading process read itself)
    if itself:  # (one worker, started once the reading process read two chunks itself; it waits then for the worker's first)
        gate, done = tmp_path / "gate", tmp_path / "done"
        monkeypatch.setenv("COMMSCOPE_READ_WORKERS", "2")
        stand_in_workers(monkeypatch, (sys.executable, "-c", GATE + (
            "import pathlib; from commscope.store import bulkread, directory\n"
            "read = directory.read_streams\n"
            "directory.read_streams = lambda job: (read(job), pathlib.Path(sys.argv[-2]).touch())[0]\n"
            "sys.exit(bulkread.main())\n"), str(done), str(gate)))
        read_streams = directory.read_streams

        def read_here(job):
            here.append(1)
            if len(here) == 2:
                gate.touch()
            elif len(here) > 2:
                wait_for(done.exists, "the worker's first chunk")
            return read_streams(job)

        monkeypatch.setattr(directory, "read_streams", read_here)
    else:
        by_workers(monkeypatch)
    monkeypatch.setattr(DirectoryReader, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(source, "LOAD_STEP", 1 << 15)
    seen: list[int] = []
    adopt = DirectoryReader._adopt
    monkeypatch.setattr(DirectoryReader, "_adopt", lambda self, got: seen.append(
        got.batch.beats.events() if got.batch.beats is not None else 0) or adopt(self, got))
    model, reader, _ = source.load_trace(store)
    apart = _state(model)
    assert reader.stats.workers == 1 + (not itself)
    assert reader.stats.jobs_here == len(here) >= 2 * itself and reader.stats.jobs > reader.stats.jobs_here
    assert len(seen) > 1 and sum(seen) > 12 * 10  # (the heartbeats and samples came back as columns)
    # (each rank's state; which chunk finished first orders the group indexes' ranks)
    assert differences({k: apart[k] for k in ("ranks", "events", "groups", "start", "end")},
                       {k: one[k] for k in ("ranks", "events", "groups", "start", "end")}) == []
