"""Scanning a stream's lines for native blocks, compiled: the hot part of reading a trace.

A native trace is mostly ``block`` lines, each the same template (``blocks.encode_block``,
record/native/drain.h) around base64 data: one block per recorder tick, a few records each,
most of them table records restating what a recent block stated.  Decoding them one by one
in Python costs ~3.3 us a line (JSON, base64, the record walk, the restatements): a reader
reads ~0.56 M events/s a core.  ``scan`` reads a whole chunk of lines in one compiled pass
(numba, ~0.8 us a line; 0.9 M events/s with the rest): each line that is exactly the
template, with values the schema accepts, becomes a block (its fields, its bytes decoded
into one buffer, its op records' offsets, where its table prefix ends, and which earlier
block of the chunk has the same prefix, so the decoder looks at each distinct prefix
once); every other line is left for the JSON path, so what a block line means is decided
in one place (``blocks.BlockDecoder``) and this only finds the common case faster.

The base64 was nearly half of a scan (~0.5 ns a character in the compiled loop).  With pybase64
(a SIMD decoder) a long chunk is scanned in three steps instead (``_split``): ``_find``
reads the lines and templates and gathers every block's data back to back, pybase64
decodes it all in one call (~22 GB/s; it refuses anything that is not base64, and the
chunk is then scanned in the one pass, which leaves such a line to JSON), and ``_place``
walks the blocks' records in it: a stream of 4,096 ranks' store 145 us against 180 us
(300 streams, a script).  Both ways find the same lines, blocks and records
(``tests/test_blockscan.py`` compares them on every kind of line).

Without numba (or with ``COMMSCOPE_SCAN=0``) ``scan`` returns None and readers decode
every line as JSON: the same events, slower.
"""

from __future__ import annotations

import binascii
from collections.abc import Callable
from typing import Literal, NamedTuple

import numpy as np

from commscope import compiled
from commscope.compiled import copy_bytes, find_byte, same_bytes
from commscope.schema import MAX_BLOCK, MAX_INT, MAX_RANK, SCHEMA_VERSION

ENV_SCAN = "COMMSCOPE_SCAN"
ENV_SPLIT = "COMMSCOPE_SCAN_SPLIT"
#: Data this long or longer has its base64 decoded apart (``_split``): below, the one pass
#: costs less than the decode's three calls (~5 us more; even at ~16 KiB, a script)
SPLIT_FROM = 32 << 10

#: A block's flag: a truncated record, or a table record after an op record (decode it record by record)
BAD = 1

_TABLE = np.zeros(256, np.bool_)
_TABLE[[8, 10, 11, 12, 13]] = True  # blocks.TABLE_RECORDS (a test holds them equal)
_B64 = np.full(256, -1, np.int64)  # (-1: not base64, "=" included: its place is checked apart)
for _i, _c in enumerate(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"):
    _B64[_c] = _i
_HEAD = np.frombuffer(b'{"type":"block","v":', np.uint8)
_RANK = np.frombuffer(b',"rank":', np.uint8)
_TS = np.frombuffer(b',"ts":', np.uint8)
_N = np.frombuffer(b',"n":', np.uint8)
_POS = np.frombuffer(b',"pos":', np.uint8)
_END = np.frombuffer(b',"end":', np.uint8)
_DATA = np.frombuffer(b',"data":"', np.uint8)
RECENT = 8  # prefixes a block's is compared with before it is hashed (a job's ranks state ~6)
_FNV = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)


class Scan(NamedTuple):
    """A chunk of lines scanned.  Lines: ``line_start``/``line_end`` (byte offsets of each,
    without its newline) and ``block`` (its block's index; -1: decode it as JSON).  Blocks,
    in line order: ``ts``, ``pos`` and ``end`` (-1: none), ``start``/``stop`` (their bytes in
    ``raw``, in order, with bytes of no block between them where the base64 was decoded
    apart; ``raw`` is then read-only), ``prefix_end`` (where their table prefix ends in
    ``raw``), ``prefix_id`` (the first block of the chunk with the same table prefix; -1:
    none), ``flags`` (BAD); their op records' offsets in ``raw`` are
    ``ops[op_first[b]:op_first[b + 1]]``."""

    raw: np.ndarray
    line_start: np.ndarray
    line_end: np.ndarray
    block: np.ndarray
    ts: np.ndarray
    pos: np.ndarray
    end: np.ndarray
    start: np.ndarray
    stop: np.ndarray
    prefix_end: np.ndarray
    prefix_id: np.ndarray
    flags: np.ndarray
    ops: np.ndarray
    op_first: np.ndarray


_kernel: Callable[..., tuple] | None = None
_find_kernel: Callable[..., tuple] | None = None
_place_kernel: Callable[..., tuple] | None = None
_b64decode: Callable[..., bytes] | None | Literal[False] = None  # (False: pybase64 is missing)


def available() -> bool:
    """Whether ``scan`` scans: numba is there and ``COMMSCOPE_SCAN`` does not say no."""
    if compiled.says_no(ENV_SCAN):
        return False
    return _load() is not None


def scan(data: bytes, rank: int) -> Scan | None:
    """``data`` (lines of ``rank``'s stream) scanned for blocks; None when the scanner is
    not available."""
    return scan_many(data, np.zeros(1, np.int64), np.array([rank], np.int64))


def scan_many(data: bytes, starts: np.ndarray, ranks: np.ndarray) -> Scan | None:
    """Chunks of lines of several streams, back to back in ``data``, scanned in one call:
    chunk ``c`` (complete lines of ``ranks[c]``'s stream) starts at byte ``starts[c]``.  A
    prefix's first block may lie in another chunk (``Scan.prefix_id``).  None when the
    scanner is not available."""
    if not data or not available():
        return None
    assert _kernel is not None
    d = np.frombuffer(data, np.uint8)
    if len(data) >= SPLIT_FROM and _split():
        assert _find_kernel is not None and _place_kernel is not None
        found = _find_kernel(d, starts, ranks)
        try:
            raw = np.frombuffer(_b64decode(found[-1], validate=True), np.uint8)
        except binascii.Error:  # (not all base64: the one pass, which leaves such a line to JSON)
            pass
        else:
            start, stop = found[6:8]
            return Scan(raw, *found[:6], start, stop, *_place_kernel(raw, start, stop))
    return Scan(*_kernel(d, starts, ranks))


def prefix_firsts(prefix_id: np.ndarray, b0: int = 0) -> np.ndarray:
    """The positions, in order, of each table prefix's first block among ``prefix_id``, the
    run of a scan's blocks from block ``b0`` on (-1: no prefix): where a decoder asks whether
    a prefix is in effect, the later blocks restating it (equal bytes).  A scan's prefix id is
    the block where its bytes first came (``Scan.prefix_id``), so a block whose id is its
    own is its prefix's first; only the prefixes first seen before the run are sorted out
    (a whole stream's run starts at its first block: ~0.1 ms a stream of 300 blocks, against
    sorting them all)."""
    n = prefix_id.shape[0]
    if n <= 64:  # (a stream's poll: a dict walk, where numpy's calls cost ~7 us)
        first: dict[int, int] = {}
        for i, p in enumerate(prefix_id.tolist()):
            if p >= 0 and p not in first:
                first[p] = i
        return np.fromiter(first.values(), np.int64, len(first))
    own = np.flatnonzero(prefix_id == np.arange(b0, b0 + n))
    if not b0:
        return own
    before = np.flatnonzero((prefix_id >= 0) & (prefix_id < b0))
    if not before.shape[0]:
        return own
    return np.sort(np.concatenate([own, before[np.unique(prefix_id[before], return_index=True)[1]]]))


class _Chunks(NamedTuple):
    """Where each chunk of ``scan_many``'s scan lies in it (``_chunks``)."""

    of_line: np.ndarray  # each line's chunk
    lines: np.ndarray  # chunk c's lines are lines[c] to lines[c + 1]
    blocks: np.ndarray  # chunk c's blocks are blocks[c] to blocks[c + 1]


def _chunks(s: Scan, starts: np.ndarray) -> _Chunks:
    """Each chunk's lines and blocks in ``s`` (chunk ``c`` at byte ``starts[c]``)."""
    of_line = np.searchsorted(starts, s.line_start, side="right") - 1
    lines = np.searchsorted(of_line, np.arange(starts.shape[0] + 1), side="left")
    before = np.zeros(s.block.shape[0] + 1, np.int64)  # blocks on the lines before each
    np.cumsum(s.block >= 0, out=before[1:])
    return _Chunks(of_line, lines, before[lines])


def parts(s: Scan, starts: np.ndarray, want: np.ndarray) -> list[Scan | None]:
    """The scan of each chunk ``c`` of ``scan_many`` with ``want[c]`` (None for the others,
    and for a chunk with no line) as ``scan`` of its bytes alone would give it: a chunk that
    is to be decoded alone needs no second scan.  Its blocks' offsets stay in the whole
    ``raw``; each prefix's first block is its first in the chunk (the blocks of a prefix
    are the same ones: equal bytes).  The work common to all is done at once, so a chunk's
    part is slices (a live poll's first round has thousands of one-block chunks)."""
    n = starts.shape[0]
    where = _chunks(s, starts)
    line_chunk, lines, bounds = where.of_line, where.lines.tolist(), where.blocks.tolist()
    is_block = s.block >= 0
    nb = s.ts.shape[0]
    bc = line_chunk[is_block]  # each block's chunk
    local = np.full(nb, -1, np.int64)
    has = np.flatnonzero(s.prefix_id >= 0)
    if has.shape[0]:  # a prefix's first block in each chunk: the first of its (chunk, prefix) pair
        _, first, at = np.unique(bc[has] * nb + s.prefix_id[has], return_index=True, return_inverse=True)
        local[has] = has[first][at.reshape(-1)] - where.blocks[bc[has]]
    out: list[Scan | None] = [None] * n
    chosen = np.flatnonzero(want)
    if not chosen.shape[0]:
        return out
    # each line's offsets and block index within its own chunk, for every chunk at once (a
    # chunk's part is then slices)
    at = np.asarray(starts, np.int64)[line_chunk]
    line_start, line_end = s.line_start - at, s.line_end - at
    block = np.where(is_block, s.block - where.blocks[line_chunk], -1).astype(s.block.dtype)
    for c in chosen.tolist():
        l0, l1, b0, b1 = lines[c], lines[c + 1], bounds[c], bounds[c + 1]
        if l0 == l1:
            continue
        o0, o1 = int(s.op_first[b0]), int(s.op_first[b1])
        out[c] = Scan(s.raw, line_start[l0:l1], line_end[l0:l1], block[l0:l1], s.ts[b0:b1], s.pos[b0:b1],
                      s.end[b0:b1], s.start[b0:b1], s.stop[b0:b1], s.prefix_end[b0:b1], local[b0:b1],
                      s.flags[b0:b1], s.ops[o0:o1], s.op_first[b0:b1 + 1] - o0)
    return out


def rests(s: Scan, starts: np.ndarray, sizes: np.ndarray, chunks: np.ndarray, cut: np.ndarray) -> Scan:
    """The scan of chunks ``chunks`` (ascending) of ``scan_many``'s ``s`` (chunk ``c`` at byte
    ``starts[c]``, ``sizes[c]`` bytes long), each from byte ``cut[k]`` of its own on (where a
    line starts; no block's line before it), back to back in that order: what ``scan_many``
    of those rests would find, made from ``s`` at once, nothing read again (a live poll's
    first round decodes each stream's rest after its head together with the others',
    ``blocks.decode_together``: joining 16k parts cut so took ~0.15 s).  Each prefix's id
    stays the first block with it in its own chunk."""
    n = starts.shape[0]
    where = _chunks(s, starts)
    line_chunk, bounds = where.of_line, where.blocks
    k = chunks.shape[0]
    origin = np.asarray(starts, np.int64)[chunks] + cut  # where each rest starts in the poll's bytes
    at = np.zeros(k, np.int64)  # ... and in the rests'
    np.cumsum((np.asarray(sizes, np.int64)[chunks] - cut)[:-1], out=at[1:])
    rest_of = np.full(n, -1, np.int64)
    rest_of[chunks] = np.arange(k)
    lr = rest_of[line_chunk]  # each line's rest (-1: a chunk not chosen)
    keep = lr >= 0
    keep[keep] = s.line_start[keep] >= origin[lr[keep]]
    kept = np.flatnonzero(keep)
    lr = lr[kept]
    shift = at[lr] - origin[lr]
    first, count = bounds[chunks], bounds[chunks + 1] - bounds[chunks]
    b0 = np.zeros(k, np.int64)  # each rest's first block among the rests'
    np.cumsum(count[:-1], out=b0[1:])
    blocks = _ranges(first, count)
    rest_block = np.repeat(np.arange(k), count)
    line_block = s.block[kept]
    block = np.where(line_block >= 0, line_block - first[lr] + b0[lr], -1).astype(s.block.dtype)
    pid = s.prefix_id[blocks]
    prefix_id = np.full(blocks.shape[0], -1, np.int64)
    has = np.flatnonzero(pid >= 0)
    if has.shape[0]:  # a prefix's first block in each rest: the first of its (rest, prefix) pair
        _, firsts, pair = np.unique(rest_block[has] * (s.ts.shape[0] + 1) + pid[has], return_index=True,
                                    return_inverse=True)
        prefix_id[has] = has[firsts][pair.reshape(-1)]
    op_lo = s.op_first[first]
    op_count = s.op_first[first + count] - op_lo
    o0 = np.zeros(k, np.int64)
    np.cumsum(op_count[:-1], out=o0[1:])
    op_first = np.append(s.op_first[blocks] - op_lo[rest_block] + o0[rest_block], int(op_count.sum()))
    return Scan(s.raw, s.line_start[kept] + shift, s.line_end[kept] + shift, block, s.ts[blocks], s.pos[blocks],
                s.end[blocks], s.start[blocks], s.stop[blocks], s.prefix_end[blocks], prefix_id.astype(s.prefix_id.dtype),
                s.flags[blocks], s.ops[_ranges(op_lo, op_count)], op_first.astype(s.op_first.dtype))


def _ranges(first: np.ndarray, count: np.ndarray) -> np.ndarray:
    """``first[k], first[k] + 1, ... first[k] + count[k] - 1`` for each ``k``, back to back."""
    total = int(count.sum())
    if not total:
        return np.zeros(0, np.int64)
    ends = np.cumsum(count)
    return np.repeat(np.asarray(first, np.int64) - (ends - count), count) + np.arange(total)


#: The helpers of the scanner's kernels (each kernel is given them all: numba compiles
#: those it calls), those merged into their callers (the same for every kernel: a helper
#: is compiled once, by the first kernel compiled here) and the one that allocates (every
#: other borrows its kernel's arrays, ``compiled.jit``).  Merged, a helper is compiled as
#: its caller is: the integers into the template, which borrows; ``_lit``, ``_b64`` and
#: ``_records`` are called (merged into a kernel, their arrays were counted at every line)
_HELPERS = ("_hash", "_lit", "_num", "_field", "_template", "_count_lines", "_line_end", "_records",
            "_prefix_table")
_INLINE = ("_num", "_field")
_ALLOCATES = ("_prefix_table",)


def _load() -> Callable[..., tuple] | None:
    """The compiled scanner (``compiled.jit``, on first use)."""
    global _kernel
    if _kernel is None:
        _kernel = compiled.jit(globals(), (*_HELPERS, "_b64", "_scan"), inline=_INLINE, allocates=_ALLOCATES,
                               args=("const uint8[::1]", "const int64[::1]", "const int64[::1]"))
    return _kernel


def _load_find() -> Callable[..., tuple] | None:
    """``_find`` compiled (``compiled.jit``, on first use)."""
    global _find_kernel
    if _find_kernel is None and _load() is not None:
        _find_kernel = compiled.jit(globals(), (*_HELPERS, "_find"), inline=_INLINE,
                                    allocates=_ALLOCATES,
                                    args=("const uint8[::1]", "const int64[::1]", "const int64[::1]"))
    return _find_kernel


def _load_place() -> Callable[..., tuple] | None:
    """``_place`` compiled (``compiled.jit``, on first use)."""
    global _place_kernel
    if _place_kernel is None and _load() is not None:
        _place_kernel = compiled.jit(globals(), (*_HELPERS, "_place"), inline=_INLINE, allocates=_ALLOCATES,
                                     args=("const uint8[::1]", "const int64[::1]", "const int64[::1]"))
    return _place_kernel


def _split() -> bool:
    """Whether a scan decodes its base64 apart, all of it in one call (``_find``, then
    pybase64's SIMD decoder, then ``_place``): ~10x faster than the scanner's own loop
    (~0.5 ns a character, nearly half of a scan).  Not without pybase64, nor with
    ``COMMSCOPE_SCAN_SPLIT=0``."""
    global _b64decode
    if _b64decode is None:
        try:
            import pybase64
        except ImportError:  # (asked once: an import that fails costs a 32 KiB scan's time)
            _b64decode = False
        else:
            _b64decode = pybase64.b64decode
    if not _b64decode or compiled.says_no(ENV_SPLIT):
        return False
    return _load_find() is not None and _load_place() is not None


def _hash(b: np.ndarray, lo: int, hi: int) -> np.uint64:
    """FNV-1a over 8-byte words of ``b[lo:hi]`` (only to find equal prefixes: equal bytes
    are compared after)."""
    h = _FNV
    m = (hi - lo) // 8
    if m:  # (8 bytes a step, read as one word: a third of the prefix work, byte by byte)
        words = b[lo:lo + 8 * m].view(np.uint64)
        for k in range(m):
            h = (h ^ words[k]) * _FNV_PRIME
    i = lo + 8 * m
    while i < hi:
        h = (h ^ np.uint64(b[i])) * _FNV_PRIME
        i += 1
    return h


def _lit(d: np.ndarray, p: int, stop: int, lit: np.ndarray) -> int:
    """Where ``lit`` ends if it is at ``p`` (-1: it is not)."""
    n = lit.shape[0]
    if p + n > stop:
        return -1
    for k in range(n):
        if d[p + k] != lit[k]:
            return -1
    return p + n


def _num(d: np.ndarray, p: int, stop: int, most: int) -> tuple[int, int]:
    """(value, where it ends) of the JSON integer at ``p`` if it is one from 0 to ``most``
    (at most ``MAX_INT``) written as JSON writes it (no sign, no leading zero); (-1, -1) if
    not.  In int64: 18 digits cannot pass it, a 19th is taken only where the value stays
    within ``most`` (in uint64, each digit cost a conversion: a tenth of a block line's
    template)."""
    v = 0
    q = p
    first = min(stop, p + 18)
    while q < first:
        c = np.int64(d[q]) - 48
        if c < 0 or c > 9:
            break
        v = v * 10 + c
        q += 1
    if q == p or (d[p] == 48 and q - p > 1):
        return -1, -1
    if q < stop and 48 <= d[q] <= 57:  # a 19th digit
        c = np.int64(d[q]) - 48
        if v > (most - c) // 10:
            return -1, -1
        v = v * 10 + c
        q += 1
        if q < stop and 48 <= d[q] <= 57:
            return -1, -1
    if v > most:
        return -1, -1
    return v, q


def _field(d: np.ndarray, p: int, stop: int, lit: np.ndarray, most: int) -> tuple[int, int]:
    """``_num`` of the integer after the literal ``lit`` at ``p`` (a key and its value);
    (-1, -1) if either is not there, or ``p`` is already -1."""
    if p < 0:
        return -1, -1
    p = _lit(d, p, stop, lit)
    if p < 0:
        return -1, -1
    return _num(d, p, stop, most)


def _b64(d: np.ndarray, p: int, stop: int, out: np.ndarray, at: int) -> tuple[int, int]:
    """Decode the base64 at ``d[p:]`` that a block line's ``"}`` ends (before ``stop``, the
    data's end) into ``out`` at ``at`` as ``binascii.a2b_base64(strict_mode=True)`` would;
    returns (the bytes written, where the base64 ends: its ``"``), or (-1, -1) where that is
    not so (not base64, bad padding, longer than ``MAX_BLOCK``, no ``"}``).  The line's end
    is found by the data: no pass looks for a block line's newline."""
    w = at
    k = p
    most = p + MAX_BLOCK
    while k + 4 <= stop:  # the quartets without padding (a padded or bad one makes v < 0)
        v = (_B64[d[k]] << 18) | (_B64[d[k + 1]] << 12) | (_B64[d[k + 2]] << 6) | _B64[d[k + 3]]
        if v < 0:
            break
        if k + 4 > most:
            return -1, -1
        out[w] = (v >> 16) & 255
        out[w + 1] = (v >> 8) & 255
        out[w + 2] = v & 255
        w += 3
        k += 4
    if k < stop and d[k] != 34 and k + 4 <= stop and k + 4 <= most:  # the last quartet: "xxx=" or "xx=="
        keep = 2 if d[k + 3] == 61 and d[k + 2] != 61 else (1 if d[k + 3] == 61 else 3)
        v = (_B64[d[k]] << 18) | (_B64[d[k + 1]] << 12)
        if keep >= 2:
            v |= _B64[d[k + 2]] << 6
        if v < 0 or keep == 3:  # (keep 3 here: a bad character, as the quartet without padding did not decode)
            return -1, -1
        out[w] = (v >> 16) & 255
        if keep == 2:
            out[w + 1] = (v >> 8) & 255
        w += keep
        k += 4
    if k + 1 >= stop or d[k] != 34 or d[k + 1] != 125 or (k + 2 < stop and d[k + 2] != 10):
        return -1, -1
    return w - at, k


def _template(d, i, n, rank):  # type: ignore[no-untyped-def]  # noqa: ANN001, ANN202
    """The block template of the line at ``i``, field by field (none holds a newline), for
    ``rank``'s stream: (ts, pos, end, where its data starts), the last -1 where the line is
    not the template up to its data (it is left for the JSON path)."""
    _version, p = _field(d, i, n, _HEAD, SCHEMA_VERSION)
    r, p = _field(d, p, n, _RANK, MAX_RANK)
    if r != rank:
        p = -1
    ts, p = _field(d, p, n, _TS, MAX_INT)
    _count, p = _field(d, p, n, _N, MAX_INT)
    pos = end = -1
    if p >= 0 and _lit(d, p, n, _POS) >= 0:  # the ring position and end: both or neither
        pos, q = _field(d, p, n, _POS, MAX_INT)
        end, p = _field(d, q, n, _END, MAX_INT)
    if p >= 0:
        p = _lit(d, p, n, _DATA)
    return ts, pos, end, p


def _count_lines(d):  # type: ignore[no-untyped-def]  # noqa: ANN001, ANN202
    """Newlines in ``d``, plus one: the most lines it can hold."""
    n = d.shape[0]
    lines = 1
    i = find_byte(d, 0, n, 10)
    while i < n:
        lines += 1
        i = find_byte(d, i + 1, n - i - 1, 10)
    return lines


def _line_end(d, i, n):  # type: ignore[no-untyped-def]  # noqa: ANN001, ANN202
    """Where the line at ``i`` ends (its newline, or ``n``)."""
    return find_byte(d, i, n - i, 10)


def _records(raw, b, stop, ops, nops, op_first, bstart, bpend, bflag, bpid, hkeys, hfirst, recent):  # type: ignore[no-untyped-def]  # noqa: ANN001, ANN202, E501
    """Block ``b``'s records walked (``raw[bstart[b]:stop]``; a record's length says where
    the next starts): its op records' offsets appended to ``ops`` from ``nops`` (returns
    the new count), where its table prefix ends, its flags, and the first block with the
    same prefix (a hash table of open addressing, ``hkeys``/``hfirst``: numba's dict costs
    more; a hash another prefix holds: itself).  The latest prefixes first in the hash
    table (``recent``, the latest first) are compared first: a block mostly restates one
    of them, and comparing costs half of hashing (their hash would find them: the same
    answer)."""
    start = bstart[b]
    op_first[b] = nops
    flag = 0
    pend = start
    o = start
    while o + 24 <= stop:
        length = (np.int64(raw[o + 4]) | (np.int64(raw[o + 5]) << 8) | (np.int64(raw[o + 6]) << 16)
                  | (np.int64(raw[o + 7]) << 24))
        if length < 24 or o + length > stop:
            flag |= BAD
            break
        if _TABLE[raw[o]]:
            if nops > op_first[b]:
                flag |= BAD  # a table record after an op record: in order, record by record
            else:
                pend = o + length
        else:
            ops[nops] = o
            nops += 1
        o += length
    bpend[b], bflag[b], bpid[b] = pend, flag, -1
    if pend > start:
        size = pend - start
        for k in range(recent.shape[0]):  # (a recent prefix's bytes, compared: no hash)
            first = recent[k]
            if first < 0:
                break
            if bpend[first] - bstart[first] == size and same_bytes(raw, bstart[first], raw, start, size):
                bpid[b] = first
                return nops
        cap = hkeys.shape[0]
        h = _hash(raw, start, pend)
        slot = np.int64(h & np.uint64(cap - 1))
        while hfirst[slot] >= 0 and hkeys[slot] != h:
            slot = (slot + 1) & (cap - 1)
        first = hfirst[slot]
        if first < 0:
            hkeys[slot] = h
            hfirst[slot] = b
            bpid[b] = b
            for k in range(recent.shape[0] - 1, 0, -1):
                recent[k] = recent[k - 1]
            recent[0] = b
        elif bpend[first] - bstart[first] == size and same_bytes(raw, bstart[first], raw, start, size):
            bpid[b] = first
        else:
            bpid[b] = b
    return nops


def _prefix_table(blocks: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``_records``' hash table for ``blocks`` blocks (a power of two, at most half full)
    and its recent prefixes."""
    cap = 64
    while cap < 2 * blocks:
        cap *= 2
    return np.zeros(cap, np.uint64), np.full(cap, -1, np.int64), np.full(RECENT, -1, np.int64)


def _scan(d, starts, ranks):  # type: ignore[no-untyped-def]  # noqa: ANN001, ANN202
    """``scan_many``'s work, in one pass over the lines (see ``Scan`` for what it returns)."""
    n = d.shape[0]
    chunks = starts.shape[0]
    c = 0  # the chunk of the line at i
    lines = _count_lines(d)
    ls, le, blk = np.empty(lines, np.int64), np.empty(lines, np.int64), np.empty(lines, np.int32)
    bts, bpos, bend = np.empty(lines, np.int64), np.empty(lines, np.int64), np.empty(lines, np.int64)
    bstart, bstop = np.empty(lines, np.int64), np.empty(lines, np.int64)
    bpend, bpid = np.empty(lines, np.int64), np.empty(lines, np.int64)
    bflag = np.empty(lines, np.uint8)
    raw = np.empty(n * 3 // 4 + 3, np.uint8)
    ops = np.empty(raw.shape[0] // 24 + 1, np.int64)
    op_first = np.empty(lines + 1, np.int64)
    hkeys, hfirst, recent = _prefix_table(lines)
    nl = nb = nraw = nops = 0
    i = 0
    while i < n:
        ls[nl], blk[nl] = i, -1
        nl += 1
        while c + 1 < chunks and i >= starts[c + 1]:
            c += 1
        ts, pos, end, p = _template(d, i, n, ranks[c])
        size = -1
        if p >= 0:  # the data, up to the line's '"}' (no '"' can be in base64)
            size, q = _b64(d, p, n, raw, nraw)
        if size < 0:
            le[nl - 1] = i = _line_end(d, i, n)
            i += 1
            continue
        le[nl - 1] = q + 2
        i = q + 3
        # a block: its records walked
        start, stop = nraw, nraw + size
        nraw = stop
        b = nb
        nb += 1
        blk[nl - 1] = b
        bts[b], bpos[b], bend[b], bstart[b], bstop[b] = ts, pos, end, start, stop
        nops = _records(raw, b, stop, ops, nops, op_first, bstart, bpend, bflag, bpid, hkeys, hfirst, recent)
    op_first[nb] = nops
    return (raw[:nraw], ls[:nl], le[:nl], blk[:nl], bts[:nb], bpos[:nb], bend[:nb], bstart[:nb], bstop[:nb],
            bpend[:nb], bpid[:nb], bflag[:nb], ops[:nops], op_first[:nb + 1])


def _find(d, starts, ranks):  # type: ignore[no-untyped-def]  # noqa: ANN001, ANN202
    """``scan_many``'s first half where the base64 is decoded apart (``_split``): the lines
    and block templates as ``_scan`` finds them, each block's data (up to the '"}' that
    ends its line) gathered back to back (``text``, one decode for all), a padded last
    quartet with its '=' as 'A' (a whole quartet, whose first bytes are the padded one's:
    the bytes after them, to the next block's, are not the block's).  Data that is not all
    base64 (a '"' in it, say: the line is not the template) is found so by the decode: the
    chunk is then scanned by ``_scan``, which leaves such a line to JSON.  Returns the lines
    (start, end, block), the blocks (ts, pos, end, start and stop in the decoded text) and
    ``text``."""
    n = d.shape[0]
    lines = _count_lines(d)
    chunks = starts.shape[0]
    c = 0  # the chunk of the line at i
    ls, le, blk = np.empty(lines, np.int64), np.empty(lines, np.int64), np.empty(lines, np.int32)
    bts, bpos, bend = np.empty(lines, np.int64), np.empty(lines, np.int64), np.empty(lines, np.int64)
    bstart, bstop = np.empty(lines, np.int64), np.empty(lines, np.int64)
    text = np.empty(n, np.uint8)
    nlines = nb = ntext = 0
    i = 0
    while i < n:
        j = _line_end(d, i, n)
        ls[nlines], le[nlines], blk[nlines] = i, j, -1
        nlines += 1
        while c + 1 < chunks and i >= starts[c + 1]:
            c += 1
        ts, pos, end, p = _template(d, i, n, ranks[c])
        e = j - 2
        size = e - p
        if p < 0 or size & 3 or size > MAX_BLOCK or d[e] != 34 or d[e + 1] != 125:
            i = j + 1
            continue
        b = nb
        nb += 1
        blk[nlines - 1] = b
        copy_bytes(text, ntext, d, p, size)
        start = ntext // 4 * 3
        stop = start + size // 4 * 3
        if size and d[e - 1] == 61:  # "xxx=" or "xx==": 2 bytes or 1
            text[ntext + size - 1] = 65
            stop -= 1
            if d[e - 2] == 61:
                text[ntext + size - 2] = 65
                stop -= 1
        ntext += size
        bts[b], bpos[b], bend[b], bstart[b], bstop[b] = ts, pos, end, start, stop
        i = j + 1
    return (ls[:nlines], le[:nlines], blk[:nlines], bts[:nb], bpos[:nb], bend[:nb], bstart[:nb], bstop[:nb], text[:ntext])


def _place(raw, bstart, bstop):  # type: ignore[no-untyped-def]  # noqa: ANN001, ANN202
    """``scan_many``'s second half (``_split``): the blocks' records walked in the decoded
    text ``raw`` (``bstart``/``bstop``: their bytes), as ``_scan`` walks them.  Returns
    ``Scan``'s prefix_end, prefix_id, flags, ops and op_first."""
    nb = bstart.shape[0]
    bpend, bpid = np.empty(nb, np.int64), np.empty(nb, np.int64)
    bflag = np.empty(nb, np.uint8)
    ops = np.empty(raw.shape[0] // 24 + 1, np.int64)
    op_first = np.empty(nb + 1, np.int64)
    hkeys, hfirst, recent = _prefix_table(nb)
    nops = 0
    for b in range(nb):
        nops = _records(raw, b, bstop[b], ops, nops, op_first, bstart, bpend, bflag, bpid, hkeys, hfirst, recent)
    op_first[nb] = nops
    return bpend, bpid, bflag, ops[:nops], op_first
