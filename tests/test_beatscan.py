"""The compiled reading of heartbeat and sample lines (commscope.beatscan): a line it takes
as a row decodes as JSON to exactly that event (its time, count of ops in flight and
sample values, bit for bit), whatever the line (common forms, odd ones, one byte changed,
numbers of every length); what it leaves, the JSON path reads.  A whole read that takes
them as rows gives the batch a read that takes none gives: the same events, heartbeat and
sample columns and counts, where a stream's chunks split between the two ways (a
``gpu_error``, another key, a time of 0, a rank's incarnations) too.
"""

from __future__ import annotations

import random
import struct

import numpy as np
import orjson
import pytest

from commscope import beats, beatscan, blockscan
from commscope.schema import decode_lines

pytestmark = pytest.mark.skipif(not blockscan.available(), reason="numba is not installed")

T = 1_780_000_000_000_000_000

COMMON = [
    b'{"type":"heartbeat","ts":%d,"inflight":0,"v":3,"rank":5}' % T,
    b'{"type":"heartbeat","ts":%d,"inflight":12,"v":2,"rank":5}' % (T + 1),
    b'{"type":"sample","ts":%d,"cpu":97.0,"rss":12884901888,"v":3,"rank":5}' % T,
    b'{"type":"sample","ts":%d,"cpu":0.5,"rss":1,"gpu_util":40,"gpu_mem":1073741824,"gpu_mem_total":85899345920,'
    b'"gpu_power":301.25,"gpu_temp":61,"v":3,"rank":5}' % T,
    b'{"type":"sample","ts":%d,"cpu":12.3,"rss":7,"gpu_util":99.9,"v":3,"rank":5}' % T,
    b'{"type":"sample","ts":%d,"rss":7,"v":3,"rank":5}' % T,
    b'{"type":"sample","ts":%d,"v":3,"rank":5}' % T,
    b'{"type":"sample","ts":%d,"cpu":-3.25,"rss":0,"v":0,"rank":5}' % T,
    b'{"type":"sample","ts":%d,"cpu":123456789012345,"v":3,"rank":5}' % T,
    b'{"type":"sample","ts":%d,"cpu":0.000000000000001,"v":3,"rank":5}' % T,
    b'{"type":"heartbeat","ts":4611686018427387903,"inflight":4611686018427387903,"v":3,"rank":5}',
]

ODD = [
    b'{"type":"heartbeat","ts":0,"inflight":0,"v":3,"rank":5}',  # (a time of 0: the model's way)
    b'{"type":"heartbeat","ts":%d,"inflight":0,"v":3,"rank":6}' % T,  # another rank's
    b'{"type":"heartbeat","ts":%d,"inflight":0,"v":4,"rank":5}' % T,  # a version to come
    b'{"type":"heartbeat","ts":%d,"inflight":0,"unwaited":[1],"v":3,"rank":5}' % T,
    b'{"type":"heartbeat","ts":%d,"v":3,"rank":5}' % T,  # no count
    b'{"type":"heartbeat","ts":%d,"inflight":-1,"v":3,"rank":5}' % T,
    b'{"type":"heartbeat","ts":%d,"inflight":01,"v":3,"rank":5}' % T,  # not JSON
    b'{"type":"heartbeat","ts":4611686018427387904,"inflight":0,"v":3,"rank":5}',  # past MAX_INT
    b'{"type":"heartbeat","ts":99999999999999999999,"inflight":0,"v":3,"rank":5}',
    b'{"type":"heartbeat", "ts":%d,"inflight":0,"v":3,"rank":5}' % T,  # a blank between tokens
    b'{"type":"heartbeat","ts":%d,"inflight":0,"v":3,"rank":5} ' % T,
    b'{"type":"heartbeat","ts":%d,"inflight":0,"rank":5,"v":3}' % T,  # another order
    b'{"type":"heartbeat","ts":%d,"inflight":0,"v":3,"rank":5}}' % T,
    b'{"type":"heartbeat","ts":%d,"inflight":0,"v":3,"rank":5,"rank":5}' % T,
    b'{"type":"sample","ts":%d,"cpu":50.0,"gpu_error":"NVML: not found","v":3,"rank":5}' % T,
    b'{"type":"sample","ts":%d,"rss":1,"cpu":50.0,"v":3,"rank":5}' % T,  # another order
    b'{"type":"sample","ts":%d,"cpu":50.0,"cpu":51.0,"v":3,"rank":5}' % T,  # a key twice
    b'{"type":"sample","ts":%d,"cpu":1e2,"v":3,"rank":5}' % T,  # an exponent
    b'{"type":"sample","ts":%d,"cpu":-0.0,"v":3,"rank":5}' % T,
    b'{"type":"sample","ts":%d,"cpu":-0,"v":3,"rank":5}' % T,
    b'{"type":"sample","ts":%d,"cpu":9007199254740993,"v":3,"rank":5}' % T,  # past 2 ** 53
    b'{"type":"sample","ts":%d,"cpu":0.1234567890123456789,"v":3,"rank":5}' % T,  # 19 digits
    b'{"type":"sample","ts":%d,"cpu":1.,"v":3,"rank":5}' % T,
    b'{"type":"sample","ts":%d,"cpu":.5,"v":3,"rank":5}' % T,
    b'{"type":"sample","ts":%d,"cpu":01.5,"v":3,"rank":5}' % T,
    b'{"type":"sample","ts":%d,"cpu":"50","v":3,"rank":5}' % T,
    b'{"type":"sample","ts":%d,"rss":1.0,"v":3,"rank":5}' % T,  # a count written as a float
    b'{"type":"sample","ts":%d,"cpu":50.0,"v":3,"rank":5,"x":1}' % T,
    b'{"type":"sample","ts":%d,"cpu":50.0,"v":3,"rank":5' % T,  # torn
    b'{"type":"sample","ts":%d,"cpu":5\xff.0,"v":3,"rank":5}' % T,  # not UTF-8
    b'{"type":"sample","ts":%d,"cpu":50.0,"v":3,"rank":16777216}' % T,
    b'{"type":"stack","ts":%d,"v":3,"rank":5}' % T,
    b"",
    b"}",
]


def _bits(x: float) -> bytes:
    return struct.pack("<d", x)


def _check(lines: list[bytes], rank: int = 5) -> list[int]:
    """Each line the scanner takes decodes as JSON to one event it says exactly; returns the
    kind it gave each line."""
    data = b"\n".join(lines)
    starts, at = [], 0
    for line in lines:
        starts.append(at)
        at += len(line) + 1
    lo = np.array(starts, np.int64)
    hi = lo + np.array([len(x) for x in lines], np.int64)
    rows = beatscan.scan(data, lo, hi, rank)
    assert rows is not None
    for k, line in enumerate(lines):
        kind = int(rows.kind[k])
        if kind == beatscan.OTHER:
            assert np.isnan(rows.values[:, k]).all()
            continue
        got = decode_lines(line, rank)
        assert len(got.events) == 1 and not got.damaged and not got.invalid, line
        e = got.events[0]
        assert e["type"] == ("heartbeat" if kind == beatscan.HEARTBEAT else "sample"), line
        assert int(rows.ts[k]) == e["ts"] > 0, line
        if kind == beatscan.HEARTBEAT:
            assert set(e) == set(beats._BEAT_KEYS) and int(rows.inflight[k]) == e["inflight"], line
            assert np.isnan(rows.values[:, k]).all()
        else:
            assert "gpu_error" not in e
            for j, f in enumerate(beatscan.VALUES):
                want = e.get(f)
                got_v = float(rows.values[j, k])
                assert (np.isnan(got_v) if want is None else _bits(got_v) == _bits(float(want))), (line, f)
    return rows.kind.tolist()


def test_the_common_lines_are_taken_and_read_as_json_reads_them():
    assert _check(COMMON) == [1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 1]


def test_odd_lines_are_left_to_json_or_read_as_it_reads_them():
    kinds = _check(ODD)
    assert kinds == [0] * len(ODD)  # (none of these is how a recorder writes them)


def test_one_byte_changed_anywhere_is_left_or_read_as_json_reads_it():
    rng = random.Random(11)
    alphabet = b'0123456789.-,:"{}e aE+\xff'
    lines = []
    for _ in range(1500):
        line = bytearray(rng.choice(COMMON))
        for _ in range(rng.randrange(1, 3)):
            k = rng.randrange(len(line))
            op = rng.random()
            if op < 0.6:
                line[k] = rng.choice(alphabet)
            elif op < 0.8:
                del line[k]
            else:
                line.insert(k, rng.choice(alphabet))
        lines.append(bytes(line))
    kinds = _check(lines)
    assert 0 < kinds.count(0) < len(lines)  # (some taken, some left)


def test_numbers_of_every_length_read_as_json_reads_them():
    """A sample's numbers: taken only where the reading is exact, then bit for bit what
    JSON's reading gives (an integer of up to 2 ** 53 over a power of ten)."""
    rng = random.Random(5)
    texts = []
    for _ in range(3000):
        whole = str(rng.randrange(10 ** rng.randrange(0, 17))) if rng.random() < 0.9 else "0"
        frac = "".join(rng.choice("0123456789") for _ in range(rng.randrange(0, 18)))
        text = whole + ("." + frac if frac else "")
        texts.append(("-" if rng.random() < 0.2 else "") + text)
    lines = [b'{"type":"sample","ts":%d,"cpu":%s,"gpu_util":%s,"v":3,"rank":5}' % (T, t.encode(), t.encode())
             for t in texts]
    kinds = _check(lines)
    for text, kind in zip(texts, kinds, strict=True):
        digits = text.lstrip("-").replace(".", "")
        exact = len(digits) <= 18 and int(digits) <= 1 << 53 and not (text.startswith("-") and float(text) == 0)
        assert (kind == beatscan.SAMPLE) == exact, text  # (what is exact is taken, and only that)


# ---------------------------------------------------------------------------- a whole read


def _store(tmp_path, odd: dict[str, list[dict]]) -> str:
    """A native store of 6 ranks in segments of ~32 KiB, with ``odd`` events appended to the
    named segment files (``rank-00001.jsonl``: the first segment; ``last:1``: rank 1's last)."""
    from commscope.bench.synthstore import JobShape, write_store

    store = str(tmp_path / "trace")
    write_store(store, JobShape(6, 120, fault="missing", hang_after=2.0, segment_bytes=32 << 10))
    job = next(p for p in (tmp_path / "trace").iterdir() if p.is_dir())
    for name, events in odd.items():
        if name.startswith("last:"):
            rank = int(name[5:])
            path = sorted(job.glob(f"rank-{rank:05d}.*jsonl"))[-1]
        else:
            path = job / name
        with path.open("ab") as f:
            f.write(b"".join(orjson.dumps(e) + b"\n" for e in events))
    return store


def _whole(store: str, take: bool, monkeypatch) -> tuple:
    from commscope.store.directory import DirectoryReader

    with monkeypatch.context() as m:
        if not take:
            m.setattr(beatscan, "scan", lambda *a: None)
        seen: list[int] = []
        entries = beatscan.entries
        m.setattr(beatscan, "entries", lambda streams: seen.extend(r for r, _ in streams) or entries(streams))
        r = DirectoryReader(store)
        batch = r.read_whole(r.streams())
    b = batch.beats
    cols = {f: b.cols[f].tolist() for f in beats.SAMPLE_FIELDS} if b is not None else None
    state = (batch.events, None if b is None else (b.rank.tolist(), b.count.tolist(), b.t0.tolist(), b.t1.tolist(),
             b.beat_ts.tolist(), b.inflight.tolist(), b.start.tolist(), b.last),
             [(o.rank, o.phase.tolist(), o.ts.tolist(), o.id.tolist()) for o in batch.ops],
             r.stats.events, r.stats.records, r.stats.invalid, r.stats.corrupt, r.stats.chunks)
    return state, cols, sorted(seen)


def _same(tmp_path, monkeypatch, odd: dict[str, list[dict]]) -> list[int]:
    store = _store(tmp_path, odd)
    (want, want_cols, none), (got, got_cols, taken) = _whole(store, False, monkeypatch), _whole(store, True,
                                                                                                    monkeypatch)
    assert none == []
    assert got == want
    if want_cols is not None:  # (NaN where a sample has no such field: equal as NaN)
        for f in beats.SAMPLE_FIELDS:
            assert np.array_equal(np.array(got_cols[f]), np.array(want_cols[f]), equal_nan=True), f
    return taken


def _hb(rank: int, ts: int, inflight: int = 0, **more) -> dict:
    return {"type": "heartbeat", "ts": ts, "inflight": inflight, **more, "v": 3, "rank": rank}


def _sample(rank: int, ts: int, **more) -> dict:
    return {"type": "sample", "ts": ts, "cpu": 50.0, "rss": 1 << 30, **more, "v": 3, "rank": rank}


def test_a_whole_read_takes_them_as_rows_and_gives_the_same_batch(tmp_path, monkeypatch):
    taken = _same(tmp_path, monkeypatch, {"last:2": [_hb(2, T + 10 ** 12, 4), _hb(2, T + 10 ** 12, 5),
                                                     _sample(2, T + 10 ** 12, gpu_util=3.5, gpu_power=1.0)]})
    assert taken == list(range(6))  # (every stream's as rows)


@pytest.mark.parametrize(("odd", "rows"), [
    # (a kind kept as events: its rows go back, the other kind's stay rows)
    ({"rank-00001.jsonl": [_sample(1, T + 1, gpu_error="NVML: not found")]}, True),  # (its first segment)
    ({"last:1": [_hb(1, T + 10 ** 12, 1, unwaited=[3])]}, True),  # (its last: rows of earlier segments back)
    ({"last:1": [_hb(1, T + 10 ** 12, 1, unwaited=[3]), _sample(1, T + 10 ** 12, gpu_error="no GPU")]}, False),
    # (an event of a kind that the rows' entry would take: every row back)
    ({"last:1": [_hb(1, 0, 1)]}, False),  # (a time of 0)
    ({"rank-00001.jsonl": [{"ts": T + 1, "type": "heartbeat", "inflight": 0, "v": 3, "rank": 1}]}, False),
    ({"last:1": [_sample(1, T + 10 ** 12, cpu=1e-7)]}, False),  # (a number the scanner leaves: an exponent)
    ({"rank-00001+1.jsonl": [{"type": "meta", "ts": T + 10 ** 12, "host": "h", "pid": 2, "world_size": 6, "inc": 1,
                              "v": 3, "rank": 1}, _hb(1, T + 10 ** 12, 2)]}, False),  # (an incarnation)
])
def test_a_stream_whose_heartbeats_or_samples_stay_events_keeps_them_in_order(tmp_path, monkeypatch, odd, rows):
    """Rank 1's odd events: the batch is a read's that takes no rows; rank 1 has an entry
    made of rows only where a kind of its rows is left to take."""
    taken = _same(tmp_path, monkeypatch, odd)
    assert taken == ([0, 1, 2, 3, 4, 5] if rows else [0, 2, 3, 4, 5])


def test_rows_put_back_a_kind_at_a_time_are_all_put_back_at_once(tmp_path):
    """``back`` of the heartbeats, then of the samples left, gives the events ``back`` of
    both gives: each rows' line among the events is kept up to date."""
    from commscope.blocks import BlockDecoder, StaticTable, decode_alone

    store = _store(tmp_path, {"rank-00000.jsonl": [_hb(0, T + 10 ** 12, 3), {"type": "exit", "ts": T + 10 ** 12 + 1,
                                                                            "v": 3, "rank": 0}]})
    job = next(p for p in (tmp_path / "trace").iterdir() if p.is_dir())
    assert store
    got = decode_alone((job / "rank-00000.jsonl").read_bytes(), BlockDecoder(0, StaticTable()), beats=True)
    taken = got.beats
    assert taken is not None and {1, 2} <= set(taken.rows.kind.tolist())
    once, none = beatscan.back(got.events, taken, 0)
    half, rest = beatscan.back(got.events, taken, 0, frozenset({beatscan.HEARTBEAT}))
    assert rest is not None and set(rest.rows.kind.tolist()) == {beatscan.SAMPLE}
    twice, gone = beatscan.back(half, rest, 0, frozenset({beatscan.SAMPLE}))
    assert none is None and gone is None and twice == once
    assert [e["type"] for e in once].count("heartbeat") == int((taken.rows.kind == beatscan.HEARTBEAT).sum())


def _taken(lines: list[bytes], rank: int, chunk: int) -> list[beatscan.Taken]:
    """A stream's heartbeat and sample lines as a whole read takes them, ``chunk`` lines a
    chunk."""
    from commscope.blocks import _json_lines

    out = []
    for i in range(0, len(lines), chunk):
        data = b"\n".join(lines[i:i + chunk]) + b"\n"
        scan = blockscan.scan(data, rank)
        assert scan is not None
        got, _, taken = _json_lines(data, scan, rank, True)
        assert taken is not None and not got.events  # (every line a row)
        out.append(taken)
    return out


@pytest.mark.parametrize("apart", [False, True])
def test_streams_entries_made_together_are_what_json_gives_each(apart, monkeypatch):
    """``entries`` of many streams at once (heartbeats only, samples only, both; heartbeats
    of equal times, the latest not last; one chunk or several) against ``beats.of_events``
    of each stream's lines decoded as JSON.  ``apart``: the last samples decoded one by
    one (where decoding them together fails)."""
    if apart:
        monkeypatch.setattr(beatscan.schema, "decode_many", lambda lines, ranks: None)
    rnd = random.Random(5)
    streams, want = [], []
    for rank in range(40):
        kinds = ["heartbeat", "sample", "both"][rank % 3]
        events = []
        for k in range(rnd.randint(1, 30)):
            ts = T + rnd.choice([k, 7, 7, 100 - k]) * 10 ** 6
            if kinds == "heartbeat" or (kinds == "both" and rnd.random() < 0.5):
                events.append(_hb(rank, ts, rnd.randint(0, 9)))
            else:
                events.append(_sample(rank, ts, **({"gpu_util": float(k)} if rnd.random() < 0.5 else {})))
        lines = [orjson.dumps(e) for e in events]
        streams.append((rank, _taken(lines, rank, rnd.choice([1, 3, 100]))))
        entry, rest = beats.of_events(rank, decode_lines(b"\n".join(lines) + b"\n", rank).events)
        assert entry is not None and not rest
        want.append(entry)
    got = beatscan.entries(streams)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g[:6] == w[:6] and g.last == w.last, g.rank
        assert (g.cols is None) == (w.cols is None), g.rank
        for f in (w.cols or {}):
            assert np.array_equal(g.cols[f], w.cols[f], equal_nan=True), (g.rank, f)


def test_a_whole_read_makes_its_entries_in_pieces_as_at_once(tmp_path, monkeypatch):
    """``read_whole`` lets the chunks go every ``ENTRIES_HELD`` bytes (their entries made
    then): the batch is the one made at once."""
    from commscope.store.directory import DirectoryReader

    store = _store(tmp_path, {"last:2": [_hb(2, T + 10 ** 12, 4), _sample(2, T + 10 ** 12, gpu_util=3.5)],
                              "rank-00001.jsonl": [_sample(1, T + 1, gpu_error="NVML: not found")]})
    once, once_cols, taken = _whole(store, True, monkeypatch)
    assert len(taken) >= 5  # (most streams' as rows)
    monkeypatch.setattr(DirectoryReader, "ENTRIES_HELD", 0)
    pieces, pieces_cols, _ = _whole(store, True, monkeypatch)
    assert pieces == once
    for f in beats.SAMPLE_FIELDS:
        assert np.array_equal(np.array(pieces_cols[f]), np.array(once_cols[f]), equal_nan=True), f


def _poll(streams: list[tuple[int, list[bytes]]], parts: int) -> list[tuple[beatscan.Gathered, np.ndarray]]:
    """Streams' lines as a poll decoded together takes them: their chunks in ``parts``
    (flushes of the queue), each part scanned in one pass, a line's rank its own."""
    out = []
    step = -(-len(streams) // parts)
    for p in range(0, len(streams), step):
        mine = streams[p:p + step]
        data = b"".join(b"".join(line + b"\n" for line in lines) for _, lines in mine)
        lo, hi, chunk, at = [], [], [], 0
        for c, (_, lines) in enumerate(mine):
            for line in lines:
                lo.append(at)
                hi.append(at + len(line))
                chunk.append(c)
                at += len(line) + 1
        ranks = np.array([r for r, _ in mine], np.int64)
        lo_, hi_, chunk_ = (np.array(x, np.int64) for x in (lo, hi, chunk))
        rows = beatscan.scan(data, lo_, hi_, ranks[chunk_])
        assert rows is not None and (rows.kind != beatscan.OTHER).all()
        out.append((beatscan.Gathered(rows, chunk_, np.arange(chunk_.shape[0]), data, lo_, hi_, {}).compact(), ranks))
    return out


@pytest.mark.parametrize("parts", [1, 3])
def test_a_poll_s_rows_are_what_json_gives_each_stream_and_the_same_model(parts):
    """``polled``: many streams' rows (heartbeats only, samples only, both; equal times,
    the latest not last; a stream that is the same rank's again: an incarnation) against
    ``beats.of_events`` of each stream's lines decoded as JSON, and the model of those
    entries against the model of the events: with a rank twice, stream by stream
    (``TraceModel._beats_apart``), else all at once; the last sample decoded when asked."""
    from model_compare import differences
    from test_beats import _state

    from commscope.analysis.model import TraceModel

    rnd = random.Random(7)
    streams, want, events = [], [], []
    for k in range(60):
        rank = 1 if k == 59 and parts == 3 else k  # (rank 1 twice: its second stream after the first)
        kinds = ["heartbeat", "sample", "both"][k % 3]
        evs = []
        for j in range(rnd.randint(1, 12)):
            ts = T + rnd.choice([j, 7, 7, 100 - j]) * 10 ** 6 + (10 ** 9 if k == 59 else 0)
            if kinds == "heartbeat" or (kinds == "both" and rnd.random() < 0.5):
                evs.append(_hb(rank, ts, rnd.randint(0, 9)))
            else:
                evs.append(_sample(rank, ts, **({"gpu_util": float(j), "gpu_temp": 50.0} if rnd.random() < 0.5
                                                else {})))
        lines = [orjson.dumps(e) for e in evs]
        streams.append((rank, lines))
        decoded = decode_lines(b"\n".join(lines) + b"\n", rank).events
        events += decoded
        entry, rest = beats.of_events(rank, decoded)
        assert entry is not None and not rest
        want.append(entry)
    got = beatscan.polled(_poll(streams, parts))
    assert got is not None and got.rank.tolist() == [e.rank for e in want]
    for k, w in enumerate(want):
        assert (int(got.count[k]), int(got.t0[k]), int(got.t1[k]), int(got.beat_ts[k]), int(got.inflight[k])) == \
            (w.count, w.t0, w.t1, w.beat_ts, w.inflight), w.rank
        a, b = int(got.start[k]), int(got.start[k + 1])
        assert (b == a) == (w.cols is None) and (got.last[k] is None) == (w.last is None)
        if w.last is not None:
            assert decode_lines(got.last[k], w.rank).events == [w.last]
        for f in (w.cols or {}):
            assert np.array_equal(got.cols[f][a:b], w.cols[f], equal_nan=True), (w.rank, f)
    as_events, as_rows = TraceModel(), TraceModel()
    as_events.ingest(events)
    as_rows.ingest([], beats=got)
    assert differences(_state(as_rows), _state(as_events)) == []
    assert as_rows.ranks[1].samples.last == as_events.ranks[1].samples.last
