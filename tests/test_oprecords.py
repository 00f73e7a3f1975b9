"""Op records in columns (commscope.oprecords): blocks decode straight into numpy columns,
and the model built from the columns is the model built from the events.

Every record type is decoded both ways (columns, and events in stream order) and checked
against the events it stands for; a table redefined mid-stream resolves the records
before it with the old table; records a forwarded spool repeats are kept once; groups
of 16k ranks travel as runs; a reader's streams share what they decode; and a load
streams in bounded steps whatever the trace's size.
"""

from __future__ import annotations

import base64
import struct
from collections import Counter

import numpy as np
import orjson
import pytest
from readers import by_workers, stand_in_workers

from commscope import blocks, schema
from commscope.analysis.diagnose import default_hang_after, diagnose, trace_now
from commscope.analysis.model import TraceModel
from commscope.bench.synthstore import JobShape, write_store
from commscope.blocks import BlockDecoder, StaticTable, decode_stream
from commscope.events import Decoded
from commscope.oprecords import PH_BEGIN, PH_END, OpRecords, merged, packed
from commscope.schema import SCHEMA_VERSION
from commscope.store import open_reader

NAMES = ["all_reduce", "broadcast", "isend", "irecv", "all_gather"]
T = 1_700_000_000_000_000_000


def meta(rank: int = 0) -> dict:
    return {"type": "meta", "ts": T, "v": SCHEMA_VERSION, "rank": rank, "world_size": 4, "names": NAMES,
            "recorder": "native"}


def block(data: bytes, rank: int = 0, pos: int | None = None, end: int | None = None, ts: int = T) -> dict:
    ev = {"type": "block", "ts": ts, "v": SCHEMA_VERSION, "rank": rank, "n": blocks.count_records(data),
          "data": base64.b64encode(data).decode()}
    if pos is not None:
        ev.update(pos=pos, end=end)
    return ev


def tables(sid: int = 0, name: int = 0, site: str = "train.py:10 in step", granks=(0, 1, 2, 3), **sig) -> bytes:
    return (blocks.pack_group(0, "0", "gloo", list(granks)) + blocks.pack_site(0, site)
            + blocks.pack_sig(sid, name=name, site=0, gid=0, ins=[(6, [8])], outs=[(6, [8])], in_bytes=32,
                              out_bytes=32, **sig))


def both(events: list[dict], rank: int = 0) -> tuple[list[dict], Decoded]:
    """(the events, as an event reader returns them; the columns' batch)."""
    as_events = decode_stream(Decoded([dict(e) for e in events], 0, Counter()), BlockDecoder(rank), columns=False)
    as_columns = decode_stream(Decoded([dict(e) for e in events], 0, Counter()), BlockDecoder(rank), columns=True)
    assert as_events.invalid == as_columns.invalid
    return as_events.events, as_columns


def ops_of(events: list[dict]) -> list[dict]:
    return [e for e in events if e["type"] == "op"]


def test_every_record_type_decodes_to_the_events_it_stands_for():
    recs = (tables(direction=0, redop=0)
            + blocks.pack_sig_begin(1, T + 10, 0, seq=1, tid=7)
            + blocks.pack_end(1, T + 20)
            + blocks.pack_begin(2, T + 30, name=2, site=0, gid=0, seq=1, peer=1, direction=1, flags=blocks.FLAG_ASYNC,
                                ins=[(6, [4])], in_bytes=16, tid=7)
            + blocks.pack_end(2, T + 40, approx=True)
            + blocks.pack_wait_begin(2, T + 50)
            + blocks.pack_end(2, T + 60, wait=True, exc="peer closed: token=hunter2")
            + blocks.pack_begin(3, T + 70, name=3, site=0, gid=0, peer=-1, direction=3, outs=[(6, [4])], out_bytes=16)
            + blocks.pack_source(3, T + 80, 2, 5)
            + blocks.pack_rbegin(4, T + 90, b'"op":"all_gather_v","group":"0","in_shapes":[[3]],"in_dtypes":["float32"]',
                                 kind=blocks.KIND_RICH, site=0, gid=0, seq=2, tid=7)
            + blocks.pack_sig_begin(5, T + 100, 0, seq=-1, parent=4, tid=7)
            + blocks.pack_end(5, T + 110)
            + blocks.pack_end(4, T + 120))
    got, cols = both([meta(), block(recs, pos=0, end=10_000)])
    ops = ops_of(got)
    assert [(e["phase"], e["id"]) for e in ops] == [
        ("begin", 1), ("end", 1), ("begin", 2), ("end", 2), ("wait_begin", 2), ("wait_end", 2), ("begin", 3),
        ("end", 3), ("begin", 4), ("begin", 5), ("end", 5), ("end", 4)]
    b1 = ops[0]
    assert (b1["op"], b1["group"], b1["seq"], b1["tid"], b1["redop"], b1["in_shapes"], b1["in_dtypes"], b1["site"]) == (
        "all_reduce", "0", 1, 7, "sum", [[8]], ["float32"], "train.py:10 in step")
    assert isinstance(b1["sk"], int) and b1["v"] == SCHEMA_VERSION and b1["rank"] == 0
    assert ops[2]["op"] == "isend" and ops[2]["peer"] == 1 and ops[2]["dir"] == "send" and ops[2]["async"] is True
    assert ops[3].get("approx") is True
    assert ops[5]["exc"] == "peer closed: token=***"  # redacted like any text read
    assert ops[6]["op"] == "irecv" and "peer" not in ops[6] and ops[7]["peer"] == 2 and ops[7]["seq"] == 5
    assert ops[8]["op"] == "all_gather_v" and ops[8]["seq"] == 2 and "sk" not in ops[8]
    assert ops[9]["parent"] == 4 and "seq" not in ops[9]
    assert [e["type"] for e in got if e["type"] != "op"] == ["meta", "group"]
    # the columns stand for exactly these events
    assert cols.ops is not None and len(cols.ops) == 12
    assert cols.ops.events() == ops
    assert [e["type"] for e in cols.events] == ["meta", "group"]
    assert cols.count() == len(got)


def test_a_redefined_signature_decodes_the_records_before_it_with_the_old_one():
    first = tables(name=0) + blocks.pack_sig_begin(1, T + 1, 0, seq=1) + blocks.pack_end(1, T + 2)
    again = tables(name=1) + blocks.pack_sig_begin(2, T + 3, 0, seq=2) + blocks.pack_end(2, T + 4)
    # in the middle of a block too: the records before the table record are the old signature's
    mixed = (blocks.pack_sig_begin(3, T + 5, 0, seq=3)
             + blocks.pack_sig(0, name=0, site=0, gid=0, ins=[(6, [8])], outs=[(6, [8])], in_bytes=32, out_bytes=32)
             + blocks.pack_sig_begin(4, T + 6, 0, seq=4))
    got, cols = both([meta(), block(first), block(again), block(mixed)])
    begins = [e for e in ops_of(got) if e["phase"] == "begin"]
    assert [(e["id"], e["op"]) for e in begins] == [(1, "all_reduce"), (2, "broadcast"), (3, "broadcast"),
                                                     (4, "all_reduce")]
    assert cols.ops.events() == ops_of(got)


def test_a_new_site_or_group_resolves_what_referred_to_it_before_it_was_known():
    sig = blocks.pack_sig(0, name=0, site=5, gid=3, ins=[(6, [8])], outs=[(6, [8])], in_bytes=32, out_bytes=32)
    early = sig + blocks.pack_sig_begin(1, T + 1, 0, seq=1)
    late = blocks.pack_group(3, "dp", "gloo", [0, 2]) + blocks.pack_site(5, "model.py:7 in fwd") + sig \
        + blocks.pack_sig_begin(2, T + 2, 0, seq=2)
    got, cols = both([meta(), block(early), block(late)])
    b1, b2 = [e for e in ops_of(got) if e["phase"] == "begin"]
    assert b1["group"] == "#3" and "site" not in b1  # what the stream said at the time
    assert b2["group"] == "dp" and b2["site"] == "model.py:7 in fwd"
    assert cols.ops.events() == ops_of(got)


def test_records_a_forwarded_spool_repeats_are_kept_once():
    a = blocks.pack_sig_begin(1, T + 1, 0, seq=1)
    b = blocks.pack_end(1, T + 2)
    c = blocks.pack_sig_begin(2, T + 3, 0, seq=2)
    ta = tables()
    # ring positions count op records only: a=[0,52) b=[52,78) c=[78,130)
    first = block(ta + a + b, pos=0, end=78)
    repeat = block(ta + b + c, pos=52, end=130)  # b again (a dead rank's spool forwarded after its recorder sent it)
    dec = BlockDecoder(0)
    got = decode_stream(Decoded([meta(), first, repeat], 0, Counter()), dec, columns=True)
    assert [(int(i), int(p)) for i, p in zip(got.ops.id, got.ops.phase, strict=True)] == [
        (1, PH_BEGIN), (1, PH_END), (2, PH_BEGIN)]
    assert dec.duplicates == 1


def test_damaged_records_are_counted_by_reason_and_skipped_alone():
    good = tables() + blocks.pack_sig_begin(1, T + 1, 0, seq=1)
    unknown_sig = blocks.pack_sig_begin(2, T + 2, 9, seq=2)  # its signature was never stated
    bad_ts = blocks.HEADER.pack(blocks.END, 0, 0, 26, -5, 1) + b"\0\0"
    odd_type = blocks.HEADER.pack(77, 0, 0, 24, T, 1)
    truncated = blocks.HEADER.pack(blocks.END, 0, 0, 999, T, 1)  # longer than what is left
    events = [meta(), block(good + unknown_sig + bad_ts + odd_type + truncated), {"type": "block", "ts": T, "v": 3,
                                                                                   "rank": 0, "n": 1, "data": "!!"}]
    got, cols = both(events)
    assert [(e["phase"], e["id"]) for e in ops_of(got)] == [("begin", 1)]
    inv = cols.invalid
    assert inv["block: bad record"] == 2 and inv["block: unknown record"] == 1
    assert inv["block: truncated record"] == 1 and inv["block: not base64"] == 1


@pytest.mark.parametrize("granks", [list(range(16384)), [0, 8, 16, 24, 1, 9], [5], [3, 1, 2], []])
def test_groups_travel_as_runs_and_read_back_exactly(granks):
    rec = blocks.pack_group(0, "world", "nccl", granks)
    if len(granks) > 8:
        assert len(rec) < 100  # 16k ranks in a few bytes, restated in every block
    got, _ = both([meta(), block(rec + blocks.pack_site(0, "x.py:1 in f"))])
    group = next(e for e in got if e["type"] == "group")
    assert group.get("granks", []) == granks and group["group"] == "world"


def test_runs_that_would_expand_past_the_cap_are_refused():
    body = blocks._u16_text("g") + blocks._u16_text("") + struct.pack("<ii", blocks.RUNS, 1) + struct.pack(
        "<iii", 0, 1, schema.MAX_RUN_MEMBERS + 1)
    rec = blocks.HEADER.pack(blocks.GROUP_REC, 0, 0, blocks.HEADER.size + len(body), 0, 0) + body
    got, cols = both([meta(), block(rec)])
    assert not [e for e in got if e["type"] == "group"]
    assert cols.invalid["block: bad table record"] == 1


def test_streams_share_what_they_decode_only_where_it_decodes_the_same():
    table = StaticTable()
    a, b, c = BlockDecoder(0, table), BlockDecoder(1, table), BlockDecoder(2, table)
    recs = tables() + blocks.pack_sig_begin(1, T, 0, seq=1)
    ra = decode_stream(Decoded([meta(0), block(recs, 0)], 0, Counter()), a, columns=True).ops
    rb = decode_stream(Decoded([meta(1), block(recs, 1)], 0, Counter()), b, columns=True).ops
    # the same bytes, but a group whose members differ: the root resolves to another global rank
    other = tables(granks=(3, 2, 1, 0), root=1) + blocks.pack_sig_begin(1, T, 0, seq=1)
    same = tables(root=1) + blocks.pack_sig_begin(1, T, 0, seq=1)
    rc = decode_stream(Decoded([meta(2), block(other, 2)], 0, Counter()), c, columns=True).ops
    rd = decode_stream(Decoded([meta(3), block(same, 3)], 0, Counter()), BlockDecoder(3, table), columns=True).ops
    assert int(ra.static[0]) == int(rb.static[0])
    assert table.statics[int(rc.static[0])].fields["root"] == 2
    assert table.statics[int(rd.static[0])].fields["root"] == 1


def test_whether_a_prefix_states_each_entry_once_is_worked_out_once_for_all_streams(monkeypatch):
    table = StaticTable()
    once = tables()
    twice = blocks.pack_site(0, "a.py:1 in f") + blocks.pack_site(1, "b.py:2 in g") + blocks.pack_site(0, "c.py:3 in h")
    asked: list[bytes] = []
    real = blocks._states_once
    monkeypatch.setattr(blocks, "_states_once", lambda prefix: asked.append(prefix) or real(prefix))
    assert [table.states_once(p) for p in (once, twice, once, twice)] == [True, False, True, False]
    assert asked == [once, twice]  # (the second stream to ask is told)
    monkeypatch.setattr(StaticTable, "ONCE_KEPT", 4 * len(once))
    for k in range(9):  # bounded: a job whose ranks state thousands of prefixes keeps ONCE_KEPT bytes of them
        assert table.states_once(tables(site=f"x.py:{k} in f"))
        assert sum(map(len, table._once)) <= 4 * len(once)
    assert table.states_once(twice) is False
    huge = blocks.pack_site(9, "y" * 5 * len(once))
    assert table.states_once(huge) and huge not in table._once  # (one past the bound is not kept)


def test_merged_puts_records_back_where_they_came_in_the_stream():
    recs = tables() + blocks.pack_sig_begin(1, T, 0, seq=1)
    hb = {"type": "heartbeat", "ts": T + 5, "v": 3, "rank": 0, "inflight": 1}
    out: list[dict] = []
    ops = BlockDecoder(0).decode([meta(), block(recs), hb, block(blocks.pack_end(1, T + 9))], out, where=True)
    assert [e["type"] + ":" + e.get("phase", "") for e in merged(out, ops)] == [
        "meta:", "group:", "op:begin", "heartbeat:", "op:end"]


# ------------------------------------------------------------------ the model from columns
def _model(reader, columns: bool) -> TraceModel:
    m = TraceModel()
    while True:
        if columns:
            batch = reader.poll_batch(1 << 16)
            got = batch.count()
            m.ingest(batch.events, batch.ops, beats=batch.beats)
        else:
            events = reader.poll(1 << 16)
            got = len(events)
            m.ingest(events)
        if not got:
            break
    m.note_read_stats(reader.stats)
    return m


@pytest.mark.parametrize("fault", ["missing", "dead", "mismatch", "healthy"])
def test_the_model_from_columns_is_the_model_from_events(tmp_path, fault):
    store = str(tmp_path / "trace")
    written = write_store(store, JobShape(12, 40, fault=fault, hang_after=2.0))
    a, b = _model(open_reader(store), False), _model(open_reader(store), True)
    assert a.events == b.events == written.events + 12  # and one group event per rank, from its GROUP record
    assert a.rank_ids() == b.rank_ids() == list(range(12))
    for r in a.rank_ids():
        assert a.n_ops(r) == b.n_ops(r)
        for i in range(a.n_ops(r)):
            assert a.op(r, i) == b.op(r, i)
    fa = diagnose(a, trace_now(a), default_hang_after(a))
    fb = diagnose(b, trace_now(b), default_hang_after(b))
    assert [f.to_json() for f in fa] == [f.to_json() for f in fb]
    errors = [f for f in fb if f.severity == "error"]
    if written.kind is None:
        assert errors == []
    else:  # the exact kind and culprit, no victim blamed, nothing lost
        assert [(f.kind, f.culprits) for f in errors] == [(written.kind, [written.shape.culprit_rank])]
        assert b.read_losses == {}


def test_columns_keep_what_the_model_reads_of_failures(tmp_path):
    """Exceptions, approximate ends and resolved sources reach the model from columns."""
    recs = (tables() + blocks.pack_sig_begin(1, T + 1, 0, seq=1) + blocks.pack_end(1, T + 2, exc="boom")
            + blocks.pack_begin(2, T + 3, name=3, site=0, gid=0, peer=-1, direction=3, outs=[(6, [4])], out_bytes=16)
            + blocks.pack_source(2, T + 4, 2, 1))
    got, cols = both([meta(), block(recs)])
    a, b = TraceModel(), TraceModel()
    a.ingest(got)
    b.ingest(cols.events, [cols.ops])
    for m in (a, b):
        assert m.failed == [(0, 0)] and m.ranks[0].exc == {0: "boom"}
        assert int(m.ranks[0].peer[1]) == 2 and int(m.ranks[0].seq[1]) == 1
    assert a.op(0, 1) == b.op(0, 1)


def test_a_load_reads_in_bounded_steps(tmp_path, monkeypatch):
    """load_trace holds the model and one step, never the trace: each poll reads at most its
    budget plus one stream's minimum read."""
    from commscope.analysis import source
    from commscope.store.directory import DirectoryReader

    store = str(tmp_path / "trace")
    written = write_store(store, JobShape(32, 60, fault="missing", hang_after=2.0))
    steps: list[int] = []
    real = DirectoryReader.poll_batch

    def spy(self, max_bytes=None):
        before = self.stats.bytes
        got = real(self, max_bytes)
        steps.append(self.stats.bytes - before)
        return got

    monkeypatch.setattr(DirectoryReader, "poll_batch", spy)
    monkeypatch.setattr(source, "LOAD_STEP", 1 << 16)
    seen = []
    model, reader, _ = source.load_trace(store, progress=seen.append)
    assert max(steps) <= (1 << 16) + DirectoryReader.MIN_READ
    assert sum(steps) == reader.stats.bytes and len(steps) > 10
    assert model.events == written.events + 32
    assert seen and seen[-1].events == model.events and seen[-1].ranks == 32
    assert [s.read for s in seen] == sorted(s.read for s in seen) and seen[-1].read == seen[-1].total


def test_a_budgeted_poll_lets_streams_take_turns(tmp_path):
    store = str(tmp_path / "trace")
    write_store(store, JobShape(8, 200, fault="healthy"))
    reader = open_reader(store)
    first = reader.poll_batch(1)  # one stream's minimum read, then the next poll goes on with the next stream
    ranks_first = {o.rank for o in first.ops}
    second = reader.poll_batch(1)
    assert len(ranks_first) == 1 and {o.rank for o in second.ops} and not ({o.rank for o in second.ops} & ranks_first)


def test_ops_columns_are_numpy_not_dicts(tmp_path):
    store = str(tmp_path / "trace")
    write_store(store, JobShape(4, 30, fault="healthy"))
    batch = open_reader(store).read_all_batch()
    assert batch.ops and all(isinstance(o.ts, np.ndarray) for o in batch.ops)
    assert not [e for e in batch.events if e["type"] in ("op", "block")]  # no op event became a dict
    assert orjson.dumps(batch.ops[0].events()[0])  # and they still read as events on request


@pytest.fixture
def parallel(monkeypatch):
    """Whole reads of any size read streams in 2 worker processes."""
    from commscope.store.directory import DirectoryReader

    monkeypatch.setattr(DirectoryReader, "PARALLEL_MIN_BYTES", 0)
    by_workers(monkeypatch)


def _loaded(store: str):
    from commscope.analysis.source import load_trace

    model, reader, warnings = load_trace(store)
    # as text: what ``check --json`` prints is the same whichever order the workers' chunks came in
    found = orjson.dumps([f.to_json() for f in diagnose(model, trace_now(model), default_hang_after(model))])
    per_rank = {r: [model.op(r, i) for i in range(model.n_ops(r))] for r in model.rank_ids()}
    return model.events, per_rank, found, warnings, reader.stats.bytes


@pytest.mark.parametrize("start", ["fork", "spawn"])
@pytest.mark.parametrize("fault", ["missing", "dead"])
def test_a_parallel_read_is_the_sequential_read(tmp_path, monkeypatch, fault, start):
    """Whichever way the workers start (``bulkread.start_method``)."""
    from commscope.store import bulkread

    store = str(tmp_path / "trace")
    write_store(store, JobShape(24, 80, fault=fault, hang_after=2.0))
    monkeypatch.setenv("COMMSCOPE_READ_WORKERS", "1")
    one = _loaded(store)
    by_workers(monkeypatch)
    monkeypatch.setenv(bulkread.ENV_START, start)
    from commscope.analysis import source
    from commscope.store.directory import DirectoryReader

    monkeypatch.setattr(DirectoryReader, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(source, "LOAD_STEP", 1 << 16)  # many chunks
    assert _loaded(store) == one


def test_a_chunk_the_reading_process_fails_to_read_is_read_whole_and_not_counted_as_its_own(tmp_path, monkeypatch):
    """The reading process reads chunks too (``Workers.run``'s ``here``); one whose read
    fails (its job directory changed under a fresh reader) is read by its own reader as a
    failed worker's is, the read the sequential one, and ``jobs_here`` counts the chunks it
    did read that way, not that one."""
    import sys

    from test_bulkread import GATE

    from commscope.analysis import source
    from commscope.store import directory
    from commscope.store.directory import DirectoryReader

    store = str(tmp_path / "trace")
    write_store(store, JobShape(24, 80, fault="missing", hang_after=2.0))
    monkeypatch.setenv("COMMSCOPE_READ_WORKERS", "1")
    one = _loaded(store)
    monkeypatch.setenv("COMMSCOPE_READ_WORKERS", "2")  # (a worker and the reading process)
    monkeypatch.setattr(DirectoryReader, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(source, "LOAD_STEP", 1 << 15)  # many chunks
    # (the worker starts once the reading process read two chunks: it reads one at least)
    gate = tmp_path / "gate"
    stand_in_workers(monkeypatch, (sys.executable, "-c", GATE + "from commscope.store import bulkread\n"
                                   "sys.exit(bulkread.main())\n", str(gate)))
    read_streams, calls = directory.read_streams, []

    def fails_first(job):
        calls.append(job)
        if len(calls) == 1:
            raise OSError("the job directory changed")
        gate.touch()
        return read_streams(job)

    monkeypatch.setattr(directory, "read_streams", fails_first)
    counted: list[int] = []
    load = source.load_trace
    monkeypatch.setattr(source, "load_trace", lambda *a, **k: (lambda got: counted.append(
        (got[1].stats.jobs, got[1].stats.jobs_here)) or got)(load(*a, **k)))
    assert _loaded(store) == one
    [(jobs, jobs_here)] = counted
    assert len(calls) >= 2 and jobs_here == len(calls) - 1 and jobs > jobs_here


def test_a_job_of_many_streams_is_read_apart_however_small(tmp_path, monkeypatch):
    """Streams cost a read per stream however short: a whole read of a job of many is read
    apart below the bytes bound too (``PARALLEL_MIN_STREAMS``, here 12: the job's own
    count), one of fewer is not, nor a console's first read."""
    from commscope.store.directory import DirectoryReader

    store = str(tmp_path / "trace")
    write_store(store, JobShape(12, 20, fault="missing", hang_after=2.0))
    by_workers(monkeypatch)
    apart: list[int] = []
    real = DirectoryReader._bulk_parallel
    monkeypatch.setattr(DirectoryReader, "_bulk_parallel", lambda self, *a: apart.append(1) or real(self, *a))
    monkeypatch.setattr(DirectoryReader, "PARALLEL_MIN_STREAMS", 13)
    want = _loaded(store)
    assert not apart
    monkeypatch.setattr(DirectoryReader, "PARALLEL_MIN_STREAMS", 12)
    assert _loaded(store)[:3] == want[:3] and apart  # (the same events, ops and findings)
    # a console's first read keeps the bytes bound alone (at a large job's start, apart was slower)
    job = next(p for p in (tmp_path / "trace").iterdir() if p.is_dir())
    assert list(DirectoryReader(job).read_apart(1 << 20)) == [] and len(apart) == 1


def test_a_parallel_read_whose_workers_fail_reads_everything_itself(tmp_path, monkeypatch, parallel):
    import sys


    store = str(tmp_path / "trace")
    write_store(store, JobShape(12, 60, fault="missing", hang_after=2.0))
    want = _loaded(store)
    stand_in_workers(monkeypatch, (sys.executable, "-c", "import sys; sys.exit(3)"))
    assert _loaded(store) == want


def _records(rank: int, n: int, statics: list, exc: dict[int, str] | None = None) -> OpRecords:
    """``n`` records of ``rank``: a begin then ends, each column its own values."""
    k = np.arange(n, dtype=np.int64)
    return OpRecords(rank, np.where(k == 0, PH_BEGIN, PH_END).astype(np.int8), T + 100 * rank + k, k + 1,
                     np.where(k == 0, 0, -1).astype(np.int32), np.where(k == 0, rank, -1), np.full(n, -1, np.int64),
                     np.full(n, rank + 1, np.uint64), np.full(n, -1, np.int32), k * 7, (k % 2).astype(np.uint8),
                     dict(exc or {}), statics)


def test_a_workers_records_travel_in_one_piece_and_come_back_as_they_went():
    import pickle

    from commscope.store.base import Batch, ReadStats
    from commscope.store.bulkread import StreamsRead

    statics: list = []
    sent = [_records(3, 4, statics, {2: "boom"}), _records(5, 1, statics), _records(4, 6, statics, {0: "a", 5: "b"})]
    spans = packed(sent)
    assert spans is not None and spans.ranks.tolist() == [3, 5, 4] and spans.start.tolist() == [0, 4, 5, 11]
    got = pickle.loads(pickle.dumps(StreamsRead(Batch([], sent), ReadStats(), {}, {}, {}, {}, {}).sent()))
    assert got.batch.ops == [] and got.packed is not None  # (one piece: ten arrays, not ten a stream)
    batch = got.received()
    assert batch.spans is got.packed and batch.spans.of(batch.ops)
    ops = got.received().ops  # (each stream's made when asked, once: a model asks for few)
    assert len(ops) == 3 and ops[-1] is ops[2] and ops[-1].exc == {0: "a", 5: "b"} and ops[0].exc == {2: "boom"}
    with pytest.raises(IndexError):
        ops[3]  # noqa: B018
    for want, have in zip(sent, batch.ops, strict=True):
        assert have.rank == want.rank and have.exc == want.exc and have.span.whole is got.packed.whole
        for name in ("phase", "ts", "id", "static", "seq", "parent", "tid", "peer", "gpu", "flags"):
            assert np.array_equal(getattr(have, name), getattr(want, name)) and getattr(have, name).dtype == \
                getattr(want, name).dtype
    # what one piece cannot say goes as it is
    assert packed([]) is None
    assert packed([sent[0], _records(6, 0, statics)]) is None  # (Spans hold no empty stream)
    assert packed([sent[0], _records(6, 2, [])]) is None  # (two tables of statics)
    where = _records(6, 2, statics)
    where.where = np.zeros(2, np.int64)
    assert packed([sent[0], where]) is None
    alone = StreamsRead(Batch([], [sent[0], where]), ReadStats(), {}, {}, {}, {}, {})
    assert alone.sent() is alone and alone.received() is alone.batch


def _bulkread_children() -> list:
    """This process's read workers still running: started afresh (their command), forked
    (their name), or stand-ins that sleep.  A zombie (ended, not waited for yet) is none."""
    import psutil

    from commscope.store.bulkread import FORKED_NAME

    def worker(p: psutil.Process) -> bool:
        try:
            command = " ".join(p.cmdline())
            return "commscope.store.bulkread" in command or "time.sleep" in command or p.name() == FORKED_NAME
        except (psutil.ZombieProcess, psutil.NoSuchProcess):
            return False

    return [p for p in psutil.Process().children(recursive=True) if worker(p)]


def test_stopping_a_parallel_read_early_leaves_no_worker(tmp_path, parallel):
    from commscope.analysis.source import open_source

    store = str(tmp_path / "trace")
    write_store(store, JobShape(32, 60, fault="healthy"))
    reader = open_source(store)
    batches = reader.bulk(1 << 15)
    assert next(batches).count()
    assert _bulkread_children()
    batches.close()  # (a reader given up on: Ctrl-C, an error while ingesting)
    assert _bulkread_children() == []


def test_a_stuck_worker_gives_its_chunk_back(tmp_path, monkeypatch, parallel):
    import sys

    from commscope.store import bulkread

    store = str(tmp_path / "trace")
    write_store(store, JobShape(12, 60, fault="missing", hang_after=2.0))
    monkeypatch.setenv("COMMSCOPE_READ_WORKERS", "1")
    want = _loaded(store)
    by_workers(monkeypatch)
    stand_in_workers(monkeypatch, (sys.executable, "-c", "import time; time.sleep(120)"))
    monkeypatch.setattr(bulkread.Workers, "STALL_S", 0.5)
    assert _loaded(store) == want
    assert _bulkread_children() == []


#: A worker that takes its job and stops in the middle of its answer (stuck, or stopped by a
#: tracer), alive: the header says more bytes than ever come
_TORN = ("import sys, time; from commscope.store import bulkread; bulkread.receive(sys.stdin.buffer); "
         "sys.stdout.buffer.write((1000).to_bytes(8, 'little') + (0).to_bytes(8, 'little') + b'half'); "
         "sys.stdout.buffer.flush(); time.sleep(10**6)")


def test_a_worker_stopped_in_the_middle_of_its_answer_gives_its_chunk_back(tmp_path, monkeypatch, parallel):
    """Its chunk goes back to the reading process once ``STALL_S`` passes with the message
    unfinished (it was waited for until the worker died), the worker is killed, and the
    read is what a read without workers gives."""
    import sys

    from commscope.store import bulkread

    store = str(tmp_path / "trace")
    write_store(store, JobShape(12, 60, fault="missing", hang_after=2.0))
    monkeypatch.setenv("COMMSCOPE_READ_WORKERS", "1")
    want = _loaded(store)
    by_workers(monkeypatch)
    stand_in_workers(monkeypatch, (sys.executable, "-c", _TORN))
    monkeypatch.setattr(bulkread.Workers, "STALL_S", 0.5)
    assert _loaded(store) == want
    assert _bulkread_children() == []


def _gathers_alike(model, gi, names, rows, monkeypatch) -> list[np.ndarray]:
    """``gather_many`` member by member, wide (from the blocks) and through one flat copy
    (what a member past ``RANK_SLOTS`` takes): asserts the three equal; returns the first."""
    from commscope.analysis import collectives

    monkeypatch.setattr(collectives, "GATHER_FLAT", 10**9)
    narrow = collectives.gather_many(model, gi, names, rows)
    monkeypatch.setattr(collectives, "GATHER_FLAT", 0)
    wide = collectives.gather_many(model, gi, names, rows)
    monkeypatch.setattr(model.table, "slots", lambda r: np.full(r.shape[0], -1, np.int64))
    flat = collectives.gather_many(model, gi, names, rows)
    monkeypatch.undo()
    for a, b, c in zip(narrow, wide, flat, strict=True):
        assert np.array_equal(a, b) and np.array_equal(a, c)
    return narrow


def test_a_wide_group_s_columns_come_from_the_blocks_as_member_by_member(tmp_path, monkeypatch):
    """``gather_many`` of a wide group reads its members' rows straight from the column
    blocks they live in; member by member, and through one flat copy (what a member past
    ``RANK_SLOTS`` takes), the same matrices."""
    from commscope.analysis.source import load_trace

    store = str(tmp_path / "trace")
    write_store(store, JobShape(20, 90, fault="missing", hang_after=2.0))
    model, _, _ = load_trace(store)
    names = ("begin", "comp", "sig", "seq", "peer", "flags", "end", "wb", "we")
    for gi in model.coll.values():
        narrow = _gathers_alike(model, gi, names, np.arange(gi.seqs.rows().shape[0])[::3], monkeypatch)
        assert narrow[0].any()


def test_a_wide_group_gathers_from_blocks_its_members_share_out_of_order(monkeypatch):
    """A live model's ranks move to blocks with room as they grow, so a wide group's members
    live in several blocks, some shared by members far apart (every fifth rank here, moved
    together by one batch): the wide gather, a block at a time, still equals member by
    member and the flat copy.  (Arenas of a few rows: many blocks, as a job of 16k ranks
    has its few.)"""
    import sys

    from commscope.analysis.columns import RankTable

    monkeypatch.setattr(RankTable, "ARENA_MIN_ROWS", 16)

    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
    from test_model_batch import T, _rows, _static

    statics = [_static("all_reduce")]

    def ops(a: int, b: int, who) -> list:
        return [_rows(r, [x for j in range(a, b) for x in ((PH_BEGIN, T + j * 1000 + r, j + 1, 0, j + 1, -1, 0),
                                                           (PH_END, T + j * 1000 + 500 + r, j + 1, -1, -1, -1, 0))],
                      statics) for r in who]

    model = TraceModel()
    model.live_rows = 0  # (rank by rank: each rank that outgrows its rows moves on its own)
    ranks = 80
    model.ingest([], ops(0, 5, range(ranks)))
    model.ingest([], ops(5, 40, range(1, ranks, 2)))
    model.ingest([], ops(5, 40, range(0, ranks, 3)))
    model.ingest([], ops(5, 40, [r for r in range(ranks) if r % 2 == 0 and r % 3]))
    model.ingest([], ops(40, 41, range(0, ranks, 5)))
    (gi,) = model.coll.values()
    t = model.table
    where = t.block[t.slots(np.asarray(gi.ranks, np.int64))]
    shared = [np.flatnonzero(where == b) for b in np.unique(where)]
    assert any(len(m) > 1 and m[-1] - m[0] + 1 > len(m) for m in shared)  # (members far apart in one block)
    assert len(shared) > 10
    names = ("begin", "comp", "sig", "seq", "flags")
    for rows in (slice(None), np.arange(gi.seqs.rows().shape[0])[::-4], np.array([40])):
        narrow = _gathers_alike(model, gi, names, rows, monkeypatch)
        assert narrow[0].any() and (narrow[0] == 0).any()  # (ranks with and without an op in the rows)


@pytest.mark.parametrize("fault", ["missing", "mismatch", "healthy"])
def test_a_wide_group_gathers_as_a_narrow_one_does(tmp_path, monkeypatch, fault):
    """Diagnosis reads a column of every member at once for a wide group (one flat copy)
    and member by member for a narrow one: the same findings either way."""
    from commscope.analysis import collectives
    from commscope.analysis.source import load_trace

    store = str(tmp_path / "trace")
    write_store(store, JobShape(20, 120, fault=fault, hang_after=2.0))
    model, _, _ = load_trace(store)
    monkeypatch.setattr(collectives, "GATHER_FLAT", 10**9)
    narrow = [f.to_json() for f in diagnose(model, trace_now(model), default_hang_after(model))]
    monkeypatch.setattr(collectives, "GATHER_FLAT", 0)
    wide = [f.to_json() for f in diagnose(model, trace_now(model), default_hang_after(model))]
    assert wide == narrow
    if fault != "healthy":
        assert narrow
