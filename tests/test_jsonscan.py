"""The compiled scanner of JSON op lines (commscope.jsonscan, jsonops.decode_chunk): a
chunk it decodes is what the JSON path decodes, line for line.

The reference is the JSON path itself: ``decode_lines`` (validated, redacted, counted),
then ``jsonops.of_events`` on the op events.  Every line below, placed among ordinary op
lines, decodes to the same events, the same op records, the same damaged and invalid
counts, or the scanner declines the chunk (None: the caller decodes it as JSON).  The
common forms must go through the scanner (a test that always declined would pass the
rest).  A stream whose chunks split between columns and an op form columns do not say
is read as all dicts, in line order.
"""

from __future__ import annotations

import os

import orjson
import pytest

from commscope import jsonops, jsonscan
from commscope.blocks import StaticTable
from commscope.events import decode_lines

pytestmark = pytest.mark.skipif(not jsonscan.available(), reason="numba is not installed")

T = 1_780_000_000_000_000_000


def line(**e) -> bytes:
    return orjson.dumps(e)


def begin(op_id: int, ts: int, *, rank: int = 0, **more) -> bytes:
    fields = {"type": "op", "ts": ts, "phase": "begin", "id": op_id, "seq": op_id, "tid": 7, "op": "all_reduce",
              "group": "0", "in_shapes": [[4, 2]], "in_dtypes": ["float32"], "in_bytes": 32,
              "site": "train.py:9 in step", "sk": 11}
    fields.update(more)
    return line(**{k: v for k, v in fields.items() if v is not None}, v=1, rank=rank)


def end(op_id: int, ts: int, phase: str = "end", *, rank: int = 0, **more) -> bytes:
    return line(type="op", ts=ts, phase=phase, id=op_id, **more, v=1, rank=rank)


def ordinary(n: int = 8, first: int = 1) -> list[bytes]:
    out = [line(type="meta", ts=T, host="node0", pid=1, world_size=2, v=3, rank=0)]
    for k in range(first, first + n):
        out += [begin(k, T + 100 * k), end(k, T + 100 * k + 50)]
    return out


def reference(data: bytes, rank: int):
    got = decode_lines(data, rank)
    ops, rest = jsonops.split(got.events)
    return got, rest, jsonops.of_events(rank, ops, StaticTable()) if ops else None


def same_as_json(data: bytes, rank: int = 0) -> jsonops.Chunk | None:
    """``decode_chunk`` of ``data``, asserted equal to the JSON path's decode where it is not None."""
    chunk = jsonops.decode_chunk(data, rank, StaticTable())
    got, rest, recs = reference(data, rank)
    if chunk is None:
        return None
    assert recs is not None, "columns where the JSON path keeps dicts"
    mine = chunk.decoded
    assert mine.events == rest
    assert (mine.damaged, dict(mine.invalid)) == (got.damaged, dict(got.invalid))
    assert mine.ops is not None and mine.ops.events() == recs.events()
    assert sorted([*chunk.event_lines.tolist(), *chunk.op_lines.tolist()]) == sorted(
        set(chunk.event_lines.tolist()) | set(chunk.op_lines.tolist()))
    return chunk


SECRET = "ghp_" + "a1B2" * 9  # (a GitHub token's form: redacted wherever it is read)

COMMON = {  # forms every recorder writes: the scanner reads them, in columns
    "a begin": begin(50, T + 9000),
    "a begin with its peer (p2p)": begin(50, T + 9000, op="send", peer=1, sk=12),
    "a nested begin": begin(50, T + 9000, parent=3, seq=None, nested=True, sk=13),
    "a begin without seq": begin(50, T + 9000, seq=None),
    "static bytes of the same length": begin(50, T + 9000, op="all_gather", in_bytes=64, sk=19),
    "a begin of another thread": begin(50, T + 9000, tid=-0 + 99),
    "an end resolving an any-source recv": end(3, T + 9000, peer=1, seq=4),
    "an approximate end": end(3, T + 9000, approx=True),
    "a wait": end(3, T + 9000, "wait_begin"),
    "a wait's end": end(3, T + 9000, "wait_end"),
    "a done with its device time": end(3, T + 9000, "done", gpu_ns=12345),
    "an end without v": line(type="op", ts=T + 9000, phase="end", id=3, rank=0),
    "keys in another order": line(rank=0, id=3, phase="end", ts=T + 9000, type="op"),
    "strings with brackets, commas and escapes": begin(50, T + 9000, site='a "q" [x], {y}\\ z', sk=14),
    "a secret in a call site": begin(50, T + 9000, site=f"train.py:{SECRET}", sk=15),
    "nested shapes": begin(50, T + 9000, in_shapes=[[1, 2], [], [3]], sk=16),
    "an unknown static key": begin(50, T + 9000, flavour={"a": [1, "]"]}, sk=17),
}

ODD = {  # the scanner leaves these to the JSON path (or declines the chunk): what it says, counts
    "blanks between tokens": begin(50, T + 9000).replace(b",", b", "),
    "an exception text (redacted)": end(3, T + 9000, exc=f"RuntimeError: {SECRET}"),
    "a begin's exception": begin(50, T + 9000, exc="x"),
    "ts past the bound": end(3, (1 << 62)),
    "ts of 20 digits": end(3, T).replace(b'"ts":1', b'"ts":11'),
    "a negative id": end(3, T).replace(b'"id":3', b'"id":-3'),
    "a leading zero": end(3, T).replace(b'"id":3', b'"id":03'),
    "a float": end(3, T).replace(b'"id":3', b'"id":3.0'),
    "an exponent": end(3, T).replace(b'"id":3', b'"id":3e0'),
    "-0": begin(50, T, tid=5).replace(b'"tid":5', b'"tid":-0'),
    "a negative thread id": begin(50, T, tid=-5),
    "another rank": end(3, T, rank=1),
    "no rank": line(type="op", ts=T, phase="end", id=3, v=1),
    "no id": line(type="op", ts=T, phase="end", v=1, rank=0),
    "a newer schema": end(3, T).replace(b'"v":1', b'"v":4'),
    "an unknown phase": end(3, T, "resume"),
    "type opx": end(3, T).replace(b'"op"', b'"opx"', 1),
    "an id twice": end(3, T).replace(b'"id":3', b'"id":3,"id":4'),
    "a peer twice": begin(50, T, peer=1, sk=12).replace(b'"sk":', b'"peer":0,"sk":'),
    "a torn line": end(3, T)[:-7],
    "bytes not UTF-8 in a site": begin(50, T, site="X").replace(b'"X"', b'"\xff\xfe"'),
    "a control byte in a site": begin(50, T, site="X").replace(b'"X"', b'"a\x01b"'),
    "a static of the wrong type": begin(50, T, in_bytes="x", sk=18),
    "an escaped key": end(3, T).replace(b'"phase"', b'"ph\\u0061se"'),
    "a seq without its peer": end(3, T, seq=4),
    "approx false": end(3, T, approx=False),
    "a device time on an end": end(3, T, gpu_ns=5),
    "an unknown key on an end": end(3, T, tag=3),
    "no signature key": begin(50, T, sk=None),
    "a carriage return": end(3, T) + b"\r",
    "not JSON": b"{oops",
    "an empty object": b"{}",
    "a blank line": b"   ",
}


@pytest.mark.parametrize("name", COMMON)
def test_the_common_forms_go_to_columns_as_the_json_path_reads_them(name):
    for at in (1, 9, 17):  # (after the meta, in the middle, last)
        lines = ordinary()
        lines.insert(at, COMMON[name])
        data = b"\n".join(lines) + b"\n"
        s = jsonscan.scan(data, 0)
        assert s is not None and (s.row[:len(lines)] >= 0).sum() == len(lines) - 1  # (all but the meta)
        assert same_as_json(data) is not None


@pytest.mark.parametrize("name", ODD)
def test_any_other_line_decodes_as_the_json_path_decodes_it(name):
    for at in (1, 9, 17):
        lines = ordinary()
        lines.insert(at, ODD[name])
        data = b"\n".join(lines) + b"\n"
        s = jsonscan.scan(data, 0)
        chunk = same_as_json(data)
        # the JSON path's line; or the scanner's, whose static bytes a JSON decode then refused
        assert s is not None and (s.row[at] < 0 or chunk is None)


def test_begins_of_one_key_take_the_first_ones_fields_and_equal_bytes_are_decoded_once(monkeypatch):
    lines = ordinary(40)
    lines.insert(5, begin(90, T + 1, site="elsewhere.py:1 in f"))  # (same sk and tid: the model trusts the key)
    lines.insert(9, begin(91, T + 2, tid=8))
    data = b"\n".join(lines) + b"\n"
    decoded = []
    real = jsonops.decode_lines
    monkeypatch.setattr(jsonops, "decode_lines", lambda data, rank: decoded.append(data) or real(data, rank))
    table = StaticTable()
    chunk = jsonops.decode_chunk(data, 0, table)
    assert chunk is not None
    assert len(decoded) == 2  # the first begin, the one with another site (the other thread's: equal bytes)
    assert same_as_json(data) is not None
    s = jsonscan.scan(data, 0)
    assert len(set(s.group[s.group >= 0].tolist())) == 2
    assert [(table.get(("json", 11, tid, -1)), table.statics[k].fields["site"]) for k, tid in enumerate((7, 8))] == [
        (0, "train.py:9 in step"), (1, "train.py:9 in step")]


def test_a_chunk_of_other_events_is_left_to_json_and_one_mostly_of_them_is_not():
    beats = [line(type="heartbeat", ts=T + k, inflight=0, v=3, rank=0) for k in range(30)]
    assert jsonops.decode_chunk(b"\n".join(beats) + b"\n", 0, StaticTable()) is None
    assert same_as_json(b"\n".join(beats + ordinary(2)) + b"\n") is not None  # (its ops in columns all the same)


def test_static_bytes_split_into_other_keys_are_not_taken_for_equal():
    """Static runs read back to back: ``"in_bytes":32`` then ``"async":true`` (two keys, split
    by a per-call one) against ``"in_bytes":32"async":true`` (one key, not JSON)."""
    a = b'{"type":"op","ts":5,"phase":"begin","id":1,"tid":7,"sk":11,"in_bytes":32,"rank":0,"async":true}'
    b = b'{"type":"op","ts":6,"phase":"begin","id":2,"tid":7,"sk":11,"rank":0,"in_bytes":32"async":true}'
    for data in (a + b"\n" + b + b"\n", b"\n".join([a, *ordinary()[1:], b]) + b"\n"):
        s = jsonscan.scan(data, 0)
        assert s.row[0] >= 0 and s.row[data.count(b"\n") - 1] == jsonscan.JSON
        same_as_json(data)


def test_a_chunk_left_to_json_leaves_the_table_as_it_was():
    """A chunk the scanner gives back (a begin written with blanks) teaches its table nothing:
    the stream's first begin of a key is the JSON path's."""
    first = begin(70, T + 1, sk=999, site="A.py:1").replace(b'"tid":7', b'"tid": 7')
    data = b"\n".join([first, begin(71, T + 2, sk=999, site="B.py:2"), *ordinary()[1:]]) + b"\n"
    table = StaticTable()
    assert jsonops.decode_chunk(data, 0, table) is None
    assert table.statics == []


def test_without_the_scanner_nothing_is_scanned(monkeypatch):
    monkeypatch.setenv("COMMSCOPE_SCAN", "0")
    assert jsonscan.scan(b"\n".join(ordinary()), 0) is None


def _store(tmp_path, odd: bytes | None, *, carried: bool = False, beats: bool = False):
    """A JSON job of 2 ranks in segments; ``odd`` appended to rank 0's second segment;
    ``carried``: its first segment deleted, what was in flight at its end (a group event
    first) carried into the read; ``beats``: its third segment mostly heartbeats."""
    from commscope.bench.synthstore import JobShape, write_store
    from commscope.store.segments import list_segments

    store = tmp_path / "trace"
    write_store(str(store), JobShape(2, 120, json=True, segment_bytes=8 << 10))
    job = next(p for p in store.iterdir() if p.is_dir())
    segs = list_segments(job)[(0, 0)]
    assert len(segs) > 3
    if odd is not None:
        with open(segs[1].path, "ab") as f:
            f.write(odd + b"\n")
    if carried:
        carry = job / "rank-00000.open.000000.jsonl"
        group = line(type="group", ts=T, group="0", granks=[0, 1], desc="default_pg", v=1, rank=0)
        carry.write_bytes(group + b"\n" + carry.read_bytes())
        os.unlink(segs[0].path)
    if beats:
        with open(segs[2].path, "ab") as f:
            f.write(b"".join(line(type="heartbeat", ts=T + k, inflight=0, v=3, rank=0) + b"\n" for k in range(400)))
    return job


def _read(job, scan: bool) -> tuple[list[dict], list[dict]]:
    from commscope.store.directory import DirectoryReader

    old = os.environ.get("COMMSCOPE_SCAN")
    os.environ["COMMSCOPE_SCAN"] = "1" if scan else "0"
    try:
        r = DirectoryReader(job)
        batch = r.read_whole(r.streams())
    finally:
        os.environ.pop("COMMSCOPE_SCAN") if old is None else os.environ.__setitem__("COMMSCOPE_SCAN", old)
    ops = [e for recs in batch.ops for e in recs.events()]
    return batch.events, ops


def _without_v(events: list[dict]) -> list[dict]:
    return [{k: v for k, v in e.items() if k != "v"} for e in events]


@pytest.mark.parametrize("carried", [False, True], ids=["", "carried"])
@pytest.mark.parametrize("odd", [None, end(3, T + 1, tag=3)], ids=["columns", "one op form columns do not say"])
def test_a_stream_read_whole_is_the_json_paths_read(tmp_path, odd, carried):
    job = _store(tmp_path, odd, carried=carried, beats=True)
    events, ops = _read(job, scan=True)
    want_events, want_ops = _read(job, scan=False)
    assert _without_v(events) == _without_v(want_events)
    assert _without_v(ops) == _without_v(want_ops)
    carry = (job / "rank-00000.open.000000.jsonl").read_bytes().count(b'"type":"op"') if carried else 0
    if odd is None:  # (what was carried in stays dicts: read as it always was)
        assert sum(e["type"] == "op" for e in events) == carry and ops
    else:  # rank 0's op events all dicts, in line order (its other segments' columns put back among them)
        assert {e["rank"] for e in events if e["type"] == "op"} == {0} == {0, 1} - {e["rank"] for e in ops}
        assert sum(e["type"] == "op" for e in events) > 150 + carry


def test_lines_damaged_byte_by_byte_decode_as_the_json_path_decodes_them():
    """Seeded: 600 chunks, each with one ordinary line changed at one byte (a digit, a quote,
    a comma, a bracket, a letter, a high byte...).  Whatever the scanner makes of it, the
    chunk decodes as the JSON path decodes it, or the scanner declines it."""
    import random

    rng = random.Random(25)
    base = ordinary(6)
    alphabet = b'0123456789-+.eE",:{}[]\\ atrufn\x00\x7f\xc3\xff'
    taken = declined = 0
    for _ in range(600):
        lines = list(base)
        k = rng.randrange(1, len(lines))
        b = bytearray(lines[k])
        at = rng.randrange(len(b))
        how = rng.randrange(3)
        if how == 0:
            b[at] = rng.choice(alphabet)
        elif how == 1:
            b.insert(at, rng.choice(alphabet))
        else:
            del b[at]
        lines[k] = bytes(b).replace(b"\n", b"")
        chunk = same_as_json(b"\n".join(lines) + b"\n")
        taken += chunk is not None
        declined += chunk is None
    assert taken > 300 and declined > 10  # (both ways were taken)
