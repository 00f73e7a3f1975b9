"""The compiled block scanner (``commscope.blockscan``): it takes a line for a block only
where the JSON path would read the same block, and leaves every other line to JSON.
(That whole streams decode alike both ways: tests/test_blocks_equivalence.py.)"""

from __future__ import annotations

import base64
import binascii
import random
import struct
import subprocess
import sys

import numpy as np
import pytest

from commscope import blocks, blockscan
from commscope.schema import MAX_INT, MAX_RANK

pytestmark = pytest.mark.skipif(not blockscan.available(), reason="numba is not installed")

T = 1_700_000_000_000_000_000


@pytest.fixture(params=["apart", "one pass"])
def either_way(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """The scanner with its base64 decoded apart (``_find``, pybase64, ``_place``), and in
    its one pass (``_scan``)."""
    apart = request.param == "apart"
    monkeypatch.setenv(blockscan.ENV_SPLIT, "1" if apart else "0")
    monkeypatch.setattr(blockscan, "SPLIT_FROM", 0)  # (the tests' chunks are short)
    if apart and not blockscan._split():
        pytest.skip("pybase64 is not installed")
    return apart


def _strict(text: bytes) -> bytes | None:
    try:
        return binascii.a2b_base64(text, strict_mode=True)
    except binascii.Error:
        return None


def _scan_b64(text: bytes) -> bytes | None:
    """The scanner's decoding of ``text`` as a block line's data (its ``"}`` after it)."""
    blockscan._load()
    out = np.zeros(len(text), np.uint8)
    line = text + b'"}'
    n, end = blockscan._b64(np.frombuffer(line, np.uint8), 0, len(line), out, 0)
    if n < 0:
        return None
    assert end == len(text)  # (the data ends where the base64 does)
    return out[:n].tobytes()


def test_base64_is_read_as_python_s_strict_mode_reads_it_or_left_to_it():
    """Where the scanner refuses, the line goes to the JSON path (strict base64): so it may
    refuse more than Python does (``QUJD====``, which Python reads), never read otherwise."""
    rng = random.Random(7)
    alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/="
    cases = [b"", b"=", b"==", b"QQ==", b"QUI=", b"QUJD", b"Q===", b"QQ=", b"Q=Q=", b"QUJD====", b"QQ==QQ==",
             b"QU I=", b"QUJD\n", b"-_-_"]
    for n in range(1, 40):
        good = base64.b64encode(rng.randbytes(n))
        cases.append(good)
        for _ in range(20):  # one byte changed, anywhere, to anything of the alphabet or not
            bad = bytearray(good)
            bad[rng.randrange(len(bad))] = rng.choice(alphabet) if rng.random() < 0.8 else rng.randrange(256)
            cases.append(bytes(bad))
        assert _scan_b64(good) == base64.b64decode(good)  # what encoders write is always read
    for text in cases:
        got = _scan_b64(text)
        assert got is None or got == _strict(text), text
    assert _scan_b64(b"QUJD====") is None and _strict(b"QUJD====") == b"ABC"


def _line(**kw: object) -> bytes:
    data = kw.pop("data", blocks.pack_end(1, T))
    return blocks.encode_block(data, kw.pop("rank", 0), kw.pop("ts", T), 1, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(("line", "block"), [
    (_line(), True),
    (_line(pos=0, end=26), True),
    (_line(rank=1), False),  # another rank's: the JSON path counts it invalid
    (_line(ts=MAX_INT), True),
    (_line(ts=MAX_INT + 1), False),  # out of the schema's range
    (_line(ts=0), True),
    (_line(ts=10 ** 18 - 1), True),  # (18 digits: the last that cannot pass the range)
    (_line(ts=10 ** 18), True),  # (a 19th digit, taken within the range)
    (b'{"type":"block","v":3,"rank":0,"ts":9223372036854775808,"n":1,"data":"AAAA"}', False),  # past int64
    (b'{"type":"block","v":3,"rank":0,"ts":18446744073709551617,"n":1,"data":"AAAA"}', False),  # past uint64
    (b'{"type":"block","v":3,"rank":0,"ts":%d0,"n":1,"data":"AAAA"}' % (MAX_INT // 100), True),  # (18 digits, the last a 0)
    (b'{"type":"block","v":3,"rank":0,"ts":%d0,"n":1,"data":"AAAA"}' % MAX_INT, False),  # 20 digits
    (b'{"type":"block","v":3,"rank":0,"ts":00,"n":1,"data":"AAAA"}', False),
    (b'{"type":"block","v":3,"rank":0,"ts":01,"n":1,"data":"AAAA"}', False),  # not JSON
    (b'{"type":"block","v":9,"rank":0,"ts":1,"n":1,"data":"AAAA"}', False),  # a version to come
    (b'{"type":"block","v":3,"rank":0,"ts":1,"n":1,"data":"AAA"}', False),  # not base64
    (b'{"type":"block", "v":3,"rank":0,"ts":1,"n":1,"data":"AAAA"}', False),  # valid JSON, not the template
    (b'{"type":"block","v":3,"rank":0,"ts":1,"n":1,"data":"AAAA","x":1}', False),
    (b'{"type":"block","v":3,"rank":0,"ts":1,"n":1,"data":"AAAA"} ', False),
    (b'{"type":"block","v":3,"rank":%d,"ts":1,"n":1,"data":"AAAA"}' % (MAX_RANK + 1), False),
    (b'{"type":"block","v":3,"rank":0,"ts":1,"n":1,"data":"AAAA"}\r', False),
    (b'{"type":"block","v":3,"rank":0,"ts":1,"n":1,"data":"AAAA"}"}', False),
    (b'{"type":"block","v":3,"rank":0,"ts":1,"n":1,"data":"AAAA"', False),
    (b'{"type":"block","v":3,"rank":0,"ts":1,"n":1,"data":"AA=="}', True),
    (b'{"type":"block","v":3,"rank":0,"ts":1,"n":1,"data":"AA==AAAA"}', False),
    (b'{"type":"block","v":3,"rank":0,"ts":1,"n":1,"data":"AAA="}', True),
    (b'{"type":"block","v":3,"rank":0,"ts":1,"n":1,"data":""}', True),
])
@pytest.mark.usefixtures("either_way")
def test_a_line_is_a_block_only_when_it_is_exactly_the_template(line, block):
    rank = 1 if b'"rank":1,' in line else 0
    got = blockscan.scan(line + b"\n", rank if block else 0)
    assert got is not None
    assert (got.block >= 0).tolist() == [block]


@pytest.mark.usefixtures("either_way")
def test_a_line_s_end_is_where_its_data_says_and_other_lines_end_at_their_newline():
    """A block line's end is found from its data (``"}`` then a newline or the chunk's
    end), never by looking for its newline: lines around it, a block line with no newline
    at the chunk's end and lines the template refuses halfway keep their bounds."""
    good = _line(pos=0, end=26)
    lines = [b'{"type":"heartbeat","ts":1,"rank":0}', good, b"", good[:-3], b'{"x":"}"}', good, good + b" x", good]
    data = b"\n".join(lines)  # (no newline after the last)
    got = blockscan.scan(data, 0)
    starts = [0]
    for line in lines[:-1]:
        starts.append(starts[-1] + len(line) + 1)
    assert got.line_start.tolist() == starts
    assert got.line_end.tolist() == [s + len(line) for s, line in zip(starts, lines, strict=True)]
    assert (got.block >= 0).tolist() == [False, True, False, False, False, True, False, True]


@pytest.mark.usefixtures("either_way")
def test_a_block_s_data_is_at_most_max_block_long():
    """Data longer than the schema allows (``MAX_BLOCK``) is left to the JSON path, which
    refuses it; data of exactly that length is a block."""
    from commscope.schema import MAX_BLOCK
    head = b'{"type":"block","v":3,"rank":0,"ts":1,"n":1,"data":"'
    record = blocks.pack_end(1, T) * 3  # (whole base64 quartets)
    assert MAX_BLOCK % 4 == 0
    fill = base64.b64encode(record * (MAX_BLOCK // 4 * 3 // len(record)))
    fill += b"A" * (MAX_BLOCK - len(fill))
    for data, block in ((fill, True), (fill + b"AAAA", False), (fill[:-4] + b"AA==", True),
                        (fill + b"AA==", False)):
        got = blockscan.scan(head + data + b'"}\n', 0)
        assert (got.block >= 0).tolist() == [block], len(data)


@pytest.mark.usefixtures("either_way")
def test_a_block_s_records_prefix_and_ring_positions_are_found():
    sig = blocks.pack_sig(5, opcode=1)
    group = blocks.pack_group(0, "0", "gloo", [0, 1])
    ops = blocks.pack_sig_begin(1, T, 5) + blocks.pack_end(1, T + 1)
    lines = [_line(data=group + sig + ops, pos=0, end=100), b'{"type":"sample","ts":1,"rank":0}',
             _line(data=group + sig + ops, pos=100, end=200), _line(data=ops + sig)]
    s = blockscan.scan(b"\n".join(lines), 0)
    assert s is not None
    assert s.block.tolist() == [0, -1, 1, 2]
    assert s.pos.tolist() == [0, 100, -1] and s.end.tolist() == [100, 200, -1]
    prefix = len(group) + len(sig)
    assert (s.prefix_end - s.start).tolist() == [prefix, prefix, 0]
    assert s.prefix_id.tolist() == [0, 0, -1]  # the second restates the first's prefix
    assert s.flags.tolist() == [0, 0, blockscan.BAD]  # a table record after an op record
    assert (s.ops - s.start[np.repeat(np.arange(3), np.diff(s.op_first))]).tolist() == \
        [prefix, prefix + 52, prefix, prefix + 52, 0, 52]
    assert s.raw[s.start[1]:s.stop[1]].tobytes() == group + sig + ops


@pytest.mark.usefixtures("either_way")
def test_prefixes_that_differ_in_one_byte_are_told_apart_and_equal_ones_found():
    """A block's table prefix is compared whole (``compiled.same_bytes``; hashed 8 bytes a
    step, then byte by byte): one byte changed anywhere (in a word, in the tail; in the
    prefix's first block or a later one) makes another prefix, and a prefix stated again is
    the first one's."""
    blockscan._load()
    ops = blocks.pack_sig_begin(1, T, 5)
    site = blocks.pack_site(3, "train.py:1 in step")  # (an odd length: a tail after the words)
    group = blocks.pack_group(0, "0", "gloo", [0, 1])
    prefix = group + blocks.pack_sig(5, opcode=1) + site
    assert len(prefix) % 8
    # bytes no record walk reads: a time in the second word, one in a later, a letter of the
    # site in the last word, its last letter (in the tail)
    last_word = 8 * (len(prefix) // 8) - 1
    assert last_word >= len(prefix) - len("train.py:1 in step")
    for at in (9, len(group) + 12, last_word, len(prefix) - 1):
        other = bytearray(prefix)
        other[at] ^= 0x01
        for order in ((prefix, bytes(other), prefix), (bytes(other), prefix, bytes(other))):
            lines = [_line(data=p + ops, pos=i * 100, end=i * 100 + 50) for i, p in enumerate(order)]
            s = blockscan.scan(b"\n".join(lines), 0)
            assert s is not None and (s.prefix_end - s.start).tolist() == [len(prefix)] * 3, at
            assert s.prefix_id.tolist() == [0, 1, 0], at
            raw = s.raw.tobytes()
            first, changed, again = (raw[int(a):int(a) + len(prefix)] for a in s.start)
            assert first == again != changed and {first, changed} == {prefix, bytes(other)}


def test_a_recording_rank_never_imports_numba():
    code = "import sys, commscope.record.recorder, commscope.blocks; print('numba' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_chunk_of_mostly_json_events_is_left_to_the_json_path():
    sample = b'{"type":"sample","ts":1,"rank":0}'
    assert blocks.decode_chunk(sample + b"\n", 0, blocks.BlockDecoder()) is None  # no block: numba not asked
    assert blocks.decode_chunk(b"\n".join([_line(), sample, sample, sample]), 0, blocks.BlockDecoder()) is None
    got = blocks.decode_chunk(b"\n".join([_line(), _line(), sample]), 0, blocks.BlockDecoder())
    assert got is not None and got.events == [{"type": "sample", "ts": 1, "rank": 0}]


def _same_scan(a: blockscan.Scan, b: blockscan.Scan) -> None:
    """Two scans of the same lines equal but for where their raw bytes lie."""
    for name in ("line_start", "line_end", "block", "ts", "pos", "end", "flags", "op_first", "prefix_id"):
        assert getattr(a, name).tolist() == getattr(b, name).tolist(), name
    for s in (a, b):
        assert s.op_first[0] == 0 and s.op_first[-1] == s.ops.shape[0]
    assert (a.prefix_end - a.start).tolist() == (b.prefix_end - b.start).tolist()
    owner_a = np.repeat(np.arange(a.start.shape[0]), np.diff(a.op_first))
    owner_b = np.repeat(np.arange(b.start.shape[0]), np.diff(b.op_first))
    assert (a.ops - a.start[owner_a]).tolist() == (b.ops - b.start[owner_b]).tolist()
    for k in range(a.start.shape[0]):
        assert a.raw[a.start[k]:a.stop[k]].tobytes() == b.raw[b.start[k]:b.stop[k]].tobytes()


@pytest.mark.usefixtures("either_way")
@pytest.mark.parametrize("chosen", [(0, 1, 2), (0, 2), (1,)])
def test_the_rests_of_chunks_cut_from_their_scan_are_what_scanning_the_rests_finds(chosen):
    """``blockscan.rests``: the rests of chunks after their first block line (what
    ``blocks.learn_head`` leaves), cut from the scan of the whole poll, are what a scan of
    those rests back to back finds: each chunk's part of one is its part of the other, and
    every block's prefix id names a block with its prefix, the first of its chunk."""
    sig = blocks.pack_sig(5, opcode=1)
    g0, g1 = blocks.pack_group(0, "0", "gloo", [0, 1]), blocks.pack_group(1, "1", "gloo", [1, 2])
    ops = blocks.pack_sig_begin(1, T, 5) + blocks.pack_end(1, T + 1)
    sample = b'{"type":"sample","ts":1,"rank":%d}'
    chunks = {
        3: [sample % 3, _line(rank=3, data=g0 + sig + ops), sample % 3, _line(rank=3, data=g1 + sig + ops),
            _line(rank=3, data=g0 + sig + ops), _line(rank=3, data=ops + sig)],
        6: [_line(rank=6, data=g1 + sig + ops), _line(rank=6, data=g1 + sig + ops), _line(rank=6, data=ops),
            _line(rank=6, data=g0 + sig + ops), b'{"type":"block", "v":3}'],
        7: [sample % 7, sample % 7, _line(rank=7, data=g0 + sig + ops, pos=0, end=100), _line(rank=3, data=ops)],
    }
    datas = [b"\n".join(lines) + b"\n" for lines in chunks.values()]
    sizes = np.array([len(d) for d in datas], np.int64)
    starts = np.zeros(len(datas), np.int64)
    np.cumsum(sizes[:-1], out=starts[1:])
    ranks = np.array(list(chunks), np.int64)
    whole = blockscan.scan_many(b"".join(datas), starts, ranks)
    assert whole is not None
    rests, cut = [], []
    for c, (data, part) in enumerate(zip(datas, blockscan.parts(whole, starts, np.ones(len(datas), bool)),
                                         strict=True)):
        assert part is not None
        if c in chosen:
            at = int(part.line_start[int(np.flatnonzero(part.block >= 0)[0])])
            rests.append(data[at:])
            cut.append(at)
    rest_starts = np.zeros(len(rests), np.int64)
    np.cumsum([len(d) for d in rests[:-1]], out=rest_starts[1:])
    got = blockscan.rests(whole, starts, sizes, np.array(chosen, np.int64), np.array(cut, np.int64))
    again = blockscan.scan_many(b"".join(rests), rest_starts, ranks[list(chosen)])
    assert again is not None and got.raw is whole.raw  # (nothing decoded again)
    every = np.ones(len(rests), bool)
    for a, b in zip(blockscan.parts(got, rest_starts, every), blockscan.parts(again, rest_starts, every),
                    strict=True):
        assert a is not None and b is not None
        _same_scan(a, b)
    chunk_of = np.searchsorted(rest_starts, got.line_start[got.block >= 0], side="right") - 1
    for b, pid in enumerate(got.prefix_id.tolist()):
        prefix = got.raw[got.start[b]:got.prefix_end[b]].tobytes()
        if pid < 0:
            assert not prefix
            continue
        assert got.raw[got.start[pid]:got.prefix_end[pid]].tobytes() == prefix
        same = [k for k in range(b + 1) if chunk_of[k] == chunk_of[b]
                and got.raw[got.start[k]:got.prefix_end[k]].tobytes() == prefix]
        assert pid == same[0]


@pytest.mark.usefixtures("either_way")
def test_a_chunk_s_part_of_a_scan_of_many_is_its_scan_alone():
    """``blockscan.parts``: what ``decode_chunks`` hands over for a chunk it leaves alone
    equals scanning the chunk by itself, prefixes first seen in another chunk included."""
    sig = blocks.pack_sig(5, opcode=1)
    g0 = blocks.pack_group(0, "0", "gloo", [0, 1])
    g1 = blocks.pack_group(1, "1", "gloo", [1, 2])
    ops = blocks.pack_sig_begin(1, T, 5) + blocks.pack_end(1, T + 1)
    sample = b'{"type":"sample","ts":1,"rank":%d}'
    chunks = {
        3: [_line(rank=3, data=g0 + sig + ops), sample % 3, _line(rank=3, data=g1 + sig + ops),
            _line(rank=3, data=g0 + sig + ops), _line(rank=3, data=ops + sig)],
        4: [],  # (a stream with nothing new)
        5: [sample % 5, sample % 5],  # (no block)
        6: [_line(rank=6, data=g1 + sig + ops), _line(rank=6, data=g1 + sig + ops), _line(rank=6, data=ops),
            _line(rank=6, data=g0 + sig + ops), b'{"type":"block", "v":3}'],
        7: [_line(rank=7, data=g0 + sig + ops, pos=0, end=100), _line(rank=3, data=ops)],  # (another rank's line)
    }
    datas = [b"\n".join(lines) + b"\n" if lines else b"" for lines in chunks.values()]
    starts = np.zeros(len(datas), np.int64)
    np.cumsum([len(d) for d in datas[:-1]], out=starts[1:])
    whole = blockscan.scan_many(b"".join(datas), starts, np.array(list(chunks), np.int64))
    assert whole is not None
    line_chunk = np.searchsorted(starts, whole.line_start, side="right") - 1
    lines = np.searchsorted(line_chunk, np.arange(len(datas) + 1), side="left")
    want = np.array([True, True, True, True, False])
    got = blockscan.parts(whole, starts, want)
    assert got[4] is None and got[1] is None  # (not wanted; no line)
    shared = 0
    for c, (rank, data) in enumerate(zip(chunks, datas, strict=True)):
        if not want[c] or not data:
            continue
        part = got[c]
        alone = blockscan.scan(data, rank)
        assert part is not None and alone is not None
        _same_scan(part, alone)
        blk = whole.block[lines[c]:lines[c + 1]]
        if (blk >= 0).any():  # (a prefix whose first block lies in an earlier chunk)
            b0, b1 = int(blk[blk >= 0].min()), int(blk.max()) + 1
            pid = whole.prefix_id[b0:b1]
            shared += int(((pid >= 0) & (pid < b0)).sum())
    assert shared  # (some prefix was first seen in an earlier chunk)


def test_the_compiled_fixed_fields_are_numpy_s():
    """``blocks._fixed_rows`` (compiled) gives every column ``_fixed_numpy`` gives, on
    records of every type with headers at and past every bound (times, ids, lengths, device
    times, signature bodies), anywhere in a buffer."""
    rng = random.Random(3)
    edges = [0, 1, MAX_INT, MAX_INT + 1, (1 << 63) - 1, 1 << 63, (1 << 64) - 1]
    recs, offs, at = [], [], 0
    for _ in range(4000):
        typ = rng.choice([blocks.BEGIN, blocks.END, blocks.WAIT_BEGIN, blocks.WAIT_END, blocks.DONE, blocks.RBEGIN,
                          blocks.SOURCE, blocks.BEGIN_SIG, 0, 99])
        size = rng.choice([24, 31, 32, 51, 52, 60])
        ts, op_id = rng.choice(edges + [rng.randrange(1 << 64)]), rng.choice(edges + [rng.randrange(1 << 64)])
        body = bytes(rng.randrange(256) for _ in range(size - 24))
        if rng.random() < 0.5 and size >= 32:  # (a device time or a signature id at a bound)
            body = rng.choice(edges).to_bytes(8, "little") + body[8:]
        head = struct.pack("<BBHIQQ", typ, rng.randrange(256), rng.randrange(1 << 16), size, ts, op_id)
        recs.append(head + body)
        offs.append(at)
        at += size
    u8 = np.frombuffer(b"".join(recs), np.uint8)
    where = np.array(offs, np.int64)
    blocks._fixed_kernel()
    assert blocks._fixed is not None
    for got, want in zip(blocks._fixed(u8, where), blocks._fixed_numpy(u8, where), strict=True):
        assert got.dtype == want.dtype and np.array_equal(got, want)


def _sig_record(sid: int, seq: int, parent: int, *, typ: int = blocks.BEGIN_SIG, flags: int = 0, size: int = 52,
                ts: int = T, op_id: int = 1) -> bytes:
    """A record with a BEGIN_SIG's body (``size`` bytes of it, whatever ``typ`` says)."""
    body = struct.pack("<IqQQ", sid, seq, parent, 3)
    return (struct.pack("<BBHIQQ", typ, flags, 0, size, ts, op_id) + body + bytes(8))[:size]


def _both_sig_passes(u8: np.ndarray, where: np.ndarray, statics: np.ndarray, since: np.ndarray, gathered: int,
                     peer_of: np.ndarray, any_source_of: np.ndarray) -> list[tuple[blocks._Fixed, tuple]]:
    """``_sig_rows`` (compiled) and ``_sig_numpy`` on the records at ``where``, signatures 0-7
    known as ``statics`` says: each one's columns (``_Fixed``, written in place) and answer."""
    blocks._fixed_kernel()  # (``_Fixed.of`` reads the records compiled, as a worker does)
    kernel = blocks._sig_kernel()
    assert kernel is not None
    distinct = np.arange(8, dtype=np.int64)  # (ids 0-7: every signature a begin names)
    out = []
    for fn in (kernel, blocks._sig_numpy):
        c = blocks._Fixed.of(u8, where)
        out.append((c, fn(c.typ, c.rflags, c.ok, c.sig, c.phase, c.static, c.seq, c.parent, c.tid, c.peer,
                          c.body_sid, c.body_seq, c.body_parent, c.body_tid, distinct, statics, since, gathered,
                          peer_of, any_source_of)))
    return out


_STATICS = np.array([0, 1, 2, -1, -2, 1, 3, 0], np.int32)  # (signatures 0-7; -1: unknown, -2: invalid)
_PEER_OF = np.array([-1, 3, 7, 2], np.int32)
_ANY_SOURCE_OF = np.array([False, False, True, False])


def test_the_compiled_signature_pass_is_numpy_s():
    """``blocks._sig_rows`` (compiled) resolves the begins through a signature as
    ``_sig_numpy`` does, and leaves the same rows to Python with the same counts: on records
    of every type (errors, device errors, any-source recvs, unknown types), signatures known,
    unknown, invalid or stated after their begin, seqs and parents at and past every bound."""
    rng = random.Random(5)
    edges = [0, 1, MAX_INT - 1, MAX_INT, MAX_INT + 1, MAX_INT + 2, (1 << 62) + 200, (1 << 63) - 1, 1 << 63,
             (1 << 64) - 1]
    seqs = [-1, -5, 5] + [e if e < 1 << 63 else e - (1 << 64) for e in edges]  # (signed)
    parents = [0, 7] + edges  # (unsigned)
    types = [blocks.BEGIN, blocks.END, blocks.WAIT_BEGIN, blocks.WAIT_END, blocks.DONE, blocks.RBEGIN, blocks.SOURCE,
             blocks.BEGIN_SIG, blocks.BEGIN_SIG, blocks.BEGIN_SIG, 0, 99]
    recs, offs, at = [], [], 0
    for _ in range(4000):
        size = rng.choice([24, 32, 52, 52, 60])
        rec = _sig_record(rng.randrange(8), rng.choice(seqs), rng.choice(parents), typ=rng.choice(types),
                          flags=rng.choice([0, 0, blocks.FLAG_ERROR, 255]), size=size,
                          ts=rng.choice([T, T, rng.choice(edges)]),
                          op_id=rng.choice([rng.randrange(1 << 20), rng.choice(edges)]))
        recs.append(rec)
        offs.append(at)
        at += size
    u8 = np.frombuffer(b"".join(recs), np.uint8)
    where = np.array(offs, np.int64)
    probe = blocks._Fixed.of(u8, where)
    rows_1 = np.flatnonzero(probe.sig & (probe.body_sid == 1))  # (signature 1 stated at one of its begins)
    for gathered in (0, 1200):
        stated = np.array([0, gathered + rows_1[len(rows_1) // 2], 2500, 0, 0, 1 << 62, 10, 3999], np.int64)
        for since in (np.zeros(8, np.int64), stated):
            (c1, got1), (c2, got2) = _both_sig_passes(u8, where, _STATICS, since, gathered, _PEER_OF, _ANY_SOURCE_OF)
            for a, b in zip(got1[:3], got2[:3], strict=True):
                assert np.array_equal(a, b)
            assert (int(got1[3]), int(got1[4])) == (int(got2[3]), int(got2[4]))
            for a, b in zip(c1, c2, strict=True):
                assert a.dtype == b.dtype and np.array_equal(a, b)
            assert got1[2].shape[0] and got1[0].shape[0] and got1[1].shape[0] and got1[4]  # (each kind is there)
            assert 0 < int(np.count_nonzero(c1.phase == blocks.PH_BEGIN)) < int(np.count_nonzero(c1.sig))


def test_the_signature_pass_takes_seqs_and_parents_up_to_the_bound_and_none_past_it():
    """A begin through a signature whose seq or parent lies past ``MAX_INT`` is invalid (by
    one, and where a float could not tell it from the bound); one at it decodes, as it was
    written; a seq below zero and a parent of 0 are none (-1).  Both passes, written out."""
    cases = [  # (seq, parent written) -> (phase, seq, parent)
        ((MAX_INT, MAX_INT), (blocks.PH_BEGIN, MAX_INT, MAX_INT)),
        ((MAX_INT + 1, 7), (-1, -1, -1)),
        ((5, MAX_INT + 1), (-1, -1, -1)),
        ((5, MAX_INT + 2), (-1, -1, -1)),
        ((5, (1 << 62) + 200), (-1, -1, -1)),
        ((5, (1 << 64) - 1), (-1, -1, -1)),
        ((-(1 << 63), 0), (blocks.PH_BEGIN, -1, -1)),
        ((-1, 1), (blocks.PH_BEGIN, -1, 1)),
    ]
    recs = [_sig_record(0, seq, parent, op_id=k + 1) for k, ((seq, parent), _) in enumerate(cases)]
    u8 = np.frombuffer(b"".join(recs), np.uint8)
    where = np.arange(len(recs), dtype=np.int64) * 52
    for c, got in _both_sig_passes(u8, where, _STATICS, np.zeros(8, np.int64), 0, _PEER_OF, _ANY_SOURCE_OF):
        assert [(int(p), int(q), int(r)) for p, q, r in zip(c.phase, c.seq, c.parent, strict=True)] == \
            [want for _, want in cases]
        assert int(got[3]) == 3 and int(got[4]) == 0  # (kept; none unknown: invalid begins are bad records)


def test_prefix_firsts_finds_each_prefix_s_first_block_in_order_at_any_length():
    """``blockscan.prefix_firsts``: a dict walk for a poll's few blocks, numpy past them; both
    give each prefix id's first position in a run of a scan's blocks, in order, with -1 (no
    prefix) left out, for a run from the scan's first block or from a later one (a prefix
    first seen before the run: its first block in the run).  The ids are a scan's: the
    block where a prefix's bytes first came, or the block itself (a hash another prefix
    holds: equal bytes then have two ids)."""
    rng = np.random.default_rng(3)
    for n in [*range(0, 70), 64, 65, 200, 1000]:
        for _ in range(3 if n < 70 else 2):
            kind = rng.integers(-1, max(1, n // 6), n)
            alone = rng.random(n) < 0.05  # (its hash held by another prefix: its own id)
            first_of: dict[int, int] = {}
            pid = np.full(n, -1, np.int64)
            for j, k in enumerate(kind.tolist()):
                if k >= 0:
                    pid[j] = j if alone[j] else first_of.setdefault(k, j)
            for b0 in sorted({0, n // 3, n // 2}):
                run = pid[b0:]
                first: dict[int, int] = {}
                for i, p in enumerate(run.tolist()):
                    first.setdefault(p, i)
                want = sorted(i for p, i in first.items() if p >= 0)
                got = blockscan.prefix_firsts(run, b0)
                assert got.dtype == np.int64 and got.tolist() == want, (n, b0, pid.tolist())


def test_the_compiled_plan_of_a_run_of_blocks_is_numpy_s():
    """``BlockDecoder.scanned``'s plan of a run of a scan's blocks (``_plan_rows``, compiled;
    ``_plan_numpy`` without numba): which blocks are plain, the ring's end before each, the
    blocks asked about (those not plain, each prefix's first in the run), where the ring read
    starts; the same both ways on runs of every length from the scan's first block or a later
    one, with bad blocks, blocks of no ring position, overlaps, gaps counted or not, a ring
    open or not, and prefix ids of a scan (a block's own, or the first block of its bytes)."""
    kernel = blocks._plan_kernel()
    assert kernel is not None
    rng = np.random.default_rng(7)
    for n in [*range(1, 40), 64, 65, 300]:
        for _ in range(4):
            size = rng.integers(0, 60, n)
            end = np.cumsum(size)
            pos = end - size
            pos[rng.random(n) < 0.1] -= rng.integers(1, 80)  # (an overlap, or a start anew)
            pos[rng.random(n) < 0.1] += rng.integers(1, 80)  # (a gap)
            none = rng.random(n) < 0.1  # (no ring position: an older block)
            pos[none], end[none] = -1, -1
            flags = (rng.random(n) < 0.1).astype(np.uint8) * blockscan.BAD
            kind = rng.integers(-1, max(1, n // 5), n)
            first_of: dict[int, int] = {}
            pid = np.array([-1 if k < 0 else j if rng.random() < 0.05 else first_of.setdefault(k, j)
                            for j, k in enumerate(kind.tolist())], np.int64)
            for b0 in sorted({0, n // 3, n // 2}):
                for seen_end, ring_open, gaps in [(0, 1, 0), (0, 0, 1), (int(end.max()) // 2, 1, 1), (5, 0, 0)]:
                    args = (pos, end, flags, pid, b0, n, seen_end, ring_open, gaps)
                    want, got = blocks._plan_numpy(*args), kernel(*args)
                    assert [x.tolist() if isinstance(x, np.ndarray) else int(x) for x in got] == \
                        [x.tolist() if isinstance(x, np.ndarray) else int(x) for x in want], (n, b0, args)
                    assert got[2].dtype == want[2].dtype == np.int64


@pytest.mark.usefixtures("either_way")
def test_what_learn_head_asks_of_the_op_records_is_worked_out_for_all_chunks_as_for_each():
    """``blocks._ahead``: the signature each op record's begin names and each chunk's first
    record with fields of its own (a begin of its own, a recv's source), worked out once
    for the parts of a scan of many chunks, are what each part alone gives (a chunk with
    none, with several, with no op record at all)."""
    sig = blocks.pack_sig(5, opcode=1)
    own = blocks.pack_begin(9, T, name=0, opcode=1)
    src = blocks.pack_source(9, T + 2, 1, 4)
    plain = blocks.pack_sig_begin(1, T, 5) + blocks.pack_end(1, T + 1)
    far = blocks.pack_sig_begin(2, T, 0xFFFF_FFFF) + blocks.pack_sig_begin(3, MAX_INT + 1, 7)  # (a ts past range)
    sample = b'{"type":"sample","ts":1,"rank":%d}'
    chunks = {
        1: [_line(rank=1, data=sig + plain), _line(rank=1, data=plain + own + plain)],
        2: [sample % 2],  # (no block)
        3: [_line(rank=3, data=sig + plain + far), sample % 3, _line(rank=3, data=src + plain)],
        4: [_line(rank=4, data=sig)],  # (a block of table records only)
        5: [_line(rank=5, data=own + plain), _line(rank=5, data=plain + src)],
    }
    datas = [b"\n".join(lines) + b"\n" for lines in chunks.values()]
    starts = np.zeros(len(datas), np.int64)
    np.cumsum([len(d) for d in datas[:-1]], out=starts[1:])
    whole = blockscan.scan_many(b"".join(datas), starts, np.array(list(chunks), np.int64))
    assert whole is not None
    parts = [p for p in blockscan.parts(whole, starts, np.ones(len(datas), bool)) if p is not None]
    assert len(parts) == len(datas)
    together = blocks._ahead(parts)
    apart = [blocks._ahead([p])[0] for p in parts]
    alone = [blocks._ahead([blockscan.scan(d, r)])[0] for d, r in zip(datas, chunks, strict=True)]  # (other raws)
    firsts = []
    for part, a, b, c in zip(parts, together, apart, alone, strict=True):
        want_sids = blocks._begin_sigs(part, part.ops).tolist()
        own_at = [k for k, t in enumerate(part.raw[part.ops].tolist()) if t in (blocks.BEGIN, blocks.RBEGIN,
                                                                                 blocks.SOURCE)]
        want_first = own_at[0] if own_at else part.ops.shape[0]
        for got in (a, b, c):
            assert got.sids.tolist() == want_sids and got.first_own == want_first
        firsts.append(want_first)
    assert firsts == [4, 0, 4, 0, 0]
    assert together[0].sids.tolist() == [5, -1, 5, -1, -1, 5, -1]
    assert together[2].sids.tolist() == [5, -1, 0xFFFF_FFFF, -1, -1, 5, -1]


def _scan_both(data: bytes, starts: np.ndarray, ranks: np.ndarray,
               monkeypatch: pytest.MonkeyPatch) -> tuple[blockscan.Scan, blockscan.Scan, bool]:
    """``scan_many`` with its base64 decoded apart and in its one pass, and whether the
    first was decoded apart (its raw is the decode of the blocks' data back to back)."""
    got = []
    monkeypatch.setattr(blockscan, "SPLIT_FROM", 0)  # (the tests' chunks are short)
    for apart in ("1", "0"):
        monkeypatch.setenv(blockscan.ENV_SPLIT, apart)
        s = blockscan.scan_many(data, starts, ranks)
        assert s is not None
        got.append(s)
    return got[0], got[1], got[0].raw.base is not None and not got[0].raw.flags.writeable


def test_the_base64_decoded_apart_gives_the_one_pass_s_scan(monkeypatch: pytest.MonkeyPatch):
    """``_find`` + pybase64 + ``_place`` find what ``_scan`` finds, on chunks of every kind
    of line: blocks of every data length (each padding), with and without ring positions,
    restating and changing prefixes, other events, empty lines, a last line without its
    newline, lines cut short, and block lines with one byte changed anywhere (to a byte of
    base64's alphabet, '=', '"', a newline, or any): a chunk whose gathered data is not
    all base64 is scanned in the one pass, so either way every line is read alike."""
    monkeypatch.setenv(blockscan.ENV_SPLIT, "1")
    if not blockscan._split():
        pytest.skip("pybase64 is not installed")
    rng = random.Random(11)
    sig, site = blocks.pack_sig(5, opcode=1), blocks.pack_site(3, "train.py:1 in step")
    groups = [blocks.pack_group(g, str(g), "gloo", [0, 1]) for g in range(3)]
    alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    apart = fallback = 0
    for trial in range(300):
        chunks: dict[int, list[bytes]] = {}
        for rank in rng.sample(range(8), rng.randint(1, 3)):
            lines = []
            for k in range(rng.randint(0, 12)):
                roll = rng.random()
                if roll < 0.15:
                    lines.append(rng.choice([b'{"type":"heartbeat","ts":1,"rank":%d}' % rank, b"", b"  ",
                                             b'{"type":"sample","ts":2,"rank":%d,"cpu":1.0}' % rank]))
                    continue
                prefix = rng.choice([b"", groups[rng.randrange(3)] + sig, groups[0] + sig + site])
                ops = b"".join(blocks.pack_sig_begin(k * 10 + j, T + j, 5) for j in range(rng.randint(0, 3)))
                data = prefix + ops + bytes(rng.randrange(256) for _ in range(rng.randrange(3)))  # (a torn tail)
                ring = {"pos": 100 * k, "end": 100 * k + 50} if rng.random() < 0.7 else {}
                lines.append(_line(data=data, rank=rank, **ring))
            if lines and trial % 3 == 0:  # one byte of a line changed
                at = rng.randrange(len(lines))
                line = bytearray(lines[at])
                if line:
                    line[rng.randrange(len(line))] = rng.choice(
                        [rng.choice(alphabet), ord("="), ord('"'), 10, rng.randrange(256)])
                    lines[at] = bytes(line)
            if lines and trial % 5 == 1:  # a line cut short
                at = rng.randrange(len(lines))
                lines[at] = lines[at][:rng.randrange(len(lines[at]) + 1)]
            chunks[rank] = lines
        datas = [b"\n".join(lines) + (b"\n" if lines and rng.random() < 0.8 else b"") for lines in chunks.values()]
        if not any(datas):
            continue
        datas = [d if d.endswith(b"\n") or d is datas[-1] else d + b"\n" for d in datas]  # (whole lines but the last)
        starts = np.zeros(len(datas), np.int64)
        np.cumsum([len(d) for d in datas[:-1]], out=starts[1:])
        split, one, was_apart = _scan_both(b"".join(datas), starts, np.array(list(chunks), np.int64), monkeypatch)
        _same_scan(split, one)  # (lines, blocks, their bytes and records)
        apart += was_apart
        fallback += not was_apart
    assert apart > 100 and fallback > 10  # (both ways taken)


def test_a_block_line_with_any_byte_changed_is_read_alike_either_way(monkeypatch: pytest.MonkeyPatch):
    """Each byte of block lines (data of each padding, with and without ring positions, the
    chunk's last line with and without its newline) changed to each of the bytes a
    template's check turns on: both ways find the same lines and blocks.  And data whose
    length is not whole quartets, in lines whose lengths together are (what one decode
    of them all would take)."""
    monkeypatch.setenv(blockscan.ENV_SPLIT, "1")
    if not blockscan._split():
        pytest.skip("pybase64 is not installed")
    site = blocks.pack_site(3, "x")
    lines = [_line(data=blocks.pack_sig(5, opcode=1) + site[:len(site) - k] + blocks.pack_sig_begin(1, T, 5),
                   **({"pos": 0, "end": 40} if k % 2 else {})) for k in range(3)]
    assert {line.split(b'"data":"')[1].count(b"=") for line in lines} == {0, 1, 2}  # (each padding)
    heartbeat = b'{"type":"heartbeat","ts":1,"rank":0}'
    for line in lines:
        for at in range(len(line)):
            for byte in b'A=/"}\n x':
                changed = bytearray(line)
                changed[at] = byte
                for data in (heartbeat + b"\n" + bytes(changed) + b"\n" + line, bytes(changed),
                             bytes(changed) + b"\n"):
                    split, one, _ = _scan_both(data, np.zeros(1, np.int64), np.zeros(1, np.int64), monkeypatch)
                    _same_scan(split, one)
    head = b'{"type":"block","v":3,"rank":0,"ts":1,"n":1,"data":"'
    for a, b in ((b"AAAAAA", b"AAAAAA"), (b"AAAAA", b"AAA"), (b"AAAAAAA", b"A"), (b"AA", b"AAAAAA"), (b"A", b"AAA")):
        data = head + a + b'"}\n' + head + b + b'"}\n' + _line()
        split, one, _ = _scan_both(data, np.zeros(1, np.int64), np.zeros(1, np.int64), monkeypatch)
        _same_scan(split, one)
        assert split.block.tolist() == [-1, -1, 0]


def test_without_pybase64_a_long_chunk_is_scanned_in_the_one_pass(monkeypatch: pytest.MonkeyPatch):
    """pybase64 missing: ``_split`` says no (asked once, not at every scan) and a chunk past
    ``SPLIT_FROM`` is scanned by ``_scan``, finding what the split finds."""
    import sys

    data = b"\n".join(_line(data=blocks.pack_sig(5, opcode=1) + blocks.pack_sig_begin(k, T, 5), pos=60 * k,
                            end=60 * k + 60) for k in range(400)) + b"\n"
    assert len(data) >= blockscan.SPLIT_FROM
    monkeypatch.setenv(blockscan.ENV_SPLIT, "1")
    with_it = blockscan.scan(data, 0)
    assert with_it is not None and not with_it.raw.flags.writeable  # (decoded apart)
    monkeypatch.setattr(blockscan, "_b64decode", None)
    monkeypatch.setitem(sys.modules, "pybase64", None)  # (its import fails)
    without = blockscan.scan(data, 0)
    assert without is not None and without.raw.flags.writeable and blockscan._b64decode is False
    _same_scan(with_it, without)
    monkeypatch.delitem(sys.modules, "pybase64")
    assert not blockscan._split()  # (not asked again)
