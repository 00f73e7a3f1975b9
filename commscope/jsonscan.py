"""Scanning a stream's lines for JSON op events, compiled: what ``blockscan`` is to blocks.

A trace of the Python recorder before it wrote blocks holds one JSON line per op phase.
Decoding them as JSON (msgspec, then the schema's checks, then columns: ``jsonops``)
costs ~2.3 us an event in a reader's worker, most of it building dicts whose fields are
the same on every begin of a call.  ``scan`` reads a chunk of lines in one compiled pass:
a line that is a compact op event (``{"key":value,...}`` with no blank between tokens,
how every recorder writes them) whose per-call keys (ts, id, seq, parent, tid, peer,
sk, rank, v, phase, approx, gpu_ns) hold values the schema accepts becomes a row of
columns; a begin's other keys (its static fields: op, group, shapes, site ...) are
compared as bytes, so only the first begin of each distinct set of them is decoded as
JSON (``jsonops.decode_chunk``), and it vouches for the rest (equal bytes decode and
validate alike).  Every other line (another event type, an exception text to redact, a
number written otherwise) is left for the JSON path: what a line means is decided there,
and this only finds the common case faster.

Without numba (or with ``COMMSCOPE_SCAN=0``, as for blocks) ``scan`` returns None.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from commscope import blockscan, compiled
from commscope.blockscan import _FNV, _FNV_PRIME  # (one hash for equal bytes, as the block scanner's)
from commscope.compiled import same_bytes
from commscope.oprecords import (
    F_APPROX,
    F_GPU,
    F_SOURCE,
    PH_BEGIN,
    PH_DONE,
    PH_END,
    PH_WAIT_BEGIN,
    PH_WAIT_END,
)
from commscope.schema import MAX_INT, MAX_RANK, SCHEMA_VERSION

#: A line's row: -1, decode it as JSON; -2, blank (nothing)
JSON, BLANK = -1, -2
#: Most runs of static keys a begin may have for the scanner (more: the JSON path)
MOST_STATIC = 48
#: Groups of static bytes tried first, as a begin's static run is read (the latest first)
MOST_RECENT = 8

# the keys the scanner reads: their codes
(_K_OTHER, _K_TYPE, _K_TS, _K_PHASE, _K_ID, _K_RANK, _K_V, _K_TID, _K_SEQ, _K_PARENT, _K_SK, _K_PEER,
 _K_EXC, _K_APPROX, _K_GPU) = range(15)
_KEYS = {_K_TYPE: b"type", _K_TS: b"ts", _K_PHASE: b"phase", _K_ID: b"id", _K_RANK: b"rank", _K_V: b"v",
         _K_TID: b"tid", _K_SEQ: b"seq", _K_PARENT: b"parent", _K_SK: b"sk", _K_PEER: b"peer", _K_EXC: b"exc",
         _K_APPROX: b"approx", _K_GPU: b"gpu_ns"}
# (key bytes, padded to 8, as one word: a key is matched by its length and one compare)
_KEY_LEN = np.array([len(_KEYS.get(k, b"")) for k in range(15)], np.int64)
_KEY_WORD = np.array([int.from_bytes(_KEYS.get(k, b"").ljust(8, b"\0"), "little") for k in range(15)], np.uint64)
_PHASE_WORD = np.array([int.from_bytes(p.ljust(16, b"\0")[:8], "little") for p in
                        (b"begin", b"end", b"wait_begin", b"wait_end", b"done")], np.uint64)
_PHASE_LEN = np.array([5, 3, 10, 8, 4], np.int64)
_PHASE_OF = np.array([PH_BEGIN, PH_END, PH_WAIT_BEGIN, PH_WAIT_END, PH_DONE], np.int8)
_OP = np.frombuffer(b'"op"', np.uint8)
_WAIT_BEGIN_TAIL = np.frombuffer(b"in", np.uint8)  # ("wait_begin" past its first 8 bytes)


class Scan(NamedTuple):
    """A chunk of lines scanned.  Lines: ``line_start``/``line_end`` (byte offsets, without the
    newline) and ``row`` (the line's row of the columns; ``JSON``, ``BLANK``).  Rows, in line
    order: ``line``, ``phase``, ``ts``, ``id``, ``seq``/``parent``/``peer`` (-1: none),
    ``tid``, ``sk`` (a begin's), ``gpu``, ``flags`` (oprecords' F_*), and ``group``: a
    begin's first row with the same static bytes (-1: not a begin)."""

    line_start: np.ndarray
    line_end: np.ndarray
    row: np.ndarray
    line: np.ndarray
    phase: np.ndarray
    ts: np.ndarray
    id: np.ndarray
    seq: np.ndarray
    parent: np.ndarray
    peer: np.ndarray
    tid: np.ndarray
    sk: np.ndarray
    gpu: np.ndarray
    flags: np.ndarray
    group: np.ndarray


_kernel: Callable[..., tuple] | None = None


def available() -> bool:
    """Whether ``scan`` scans (numba is there, ``COMMSCOPE_SCAN`` does not say no)."""
    return blockscan.available() and _load() is not None


def scan(data: bytes, rank: int) -> Scan | None:
    """``data`` (complete lines of ``rank``'s stream) scanned for op events; None when the
    scanner is not available."""
    if not data or not available():
        return None
    assert _kernel is not None
    return Scan(*_kernel(np.frombuffer(data, np.uint8), rank, data.count(b"\n") + 1))


def _load() -> Callable[..., tuple] | None:
    global _kernel
    if _kernel is None:
        _kernel = compiled.jit(globals(), ("_word", "_key", "_int", "_string", "_value", "_equal", "_scan"),
                               args=("const uint8[::1]", "int64", "int64"))
    return _kernel


def _word(d: np.ndarray, a: int, n: int) -> np.uint64:
    """Bytes ``d[a:a + n]`` (n <= 8) as one little-endian word, zero-padded."""
    w = np.uint64(0)
    for k in range(n):
        w |= np.uint64(d[a + k]) << np.uint64(8 * k)
    return w


def _key(d: np.ndarray, a: int, b: int) -> int:
    """The code of the key ``d[a:b]`` (without its quotes)."""
    n = b - a
    if n > 6:
        return _K_OTHER
    w = _word(d, a, n)
    for k in range(1, 15):
        if _KEY_LEN[k] == n and _KEY_WORD[k] == w:
            return k
    return _K_OTHER


def _int(d: np.ndarray, p: int, stop: int, low: int, most: int) -> tuple[int, int]:
    """(value, where it ends) of the JSON integer at ``p`` if it is one from ``low`` to
    ``most`` written as JSON writes it (no leading zero; a sign only below zero) and
    followed by ``,`` or ``}``; (0, -1) if not."""
    neg = p < stop and d[p] == 45
    q = p + 1 if neg else p
    if neg and low >= 0:
        return 0, -1
    v = np.uint64(0)
    s = q
    while q < stop and 48 <= d[q] <= 57 and q - s < 19:
        v = v * np.uint64(10) + np.uint64(d[q] - 48)
        q += 1
    if q == s or (d[s] == 48 and q - s > 1) or q >= stop or (d[q] != 44 and d[q] != 125):
        return 0, -1
    if v > np.uint64(most if not neg else -low):
        return 0, -1
    x = np.int64(v)
    if neg:
        if x == 0:  # ("-0": the JSON path decides)
            return 0, -1
        x = -x
    return x, q


def _string(d: np.ndarray, p: int, stop: int) -> int:
    """Where the JSON string whose opening quote is at ``p`` ends (-1: it does not)."""
    q = p + 1
    while q < stop:
        c = d[q]
        if c == 92:
            q += 2
        elif c == 34:
            return q + 1
        else:
            q += 1
    return -1


def _value(d: np.ndarray, p: int, stop: int) -> int:
    """Where the JSON value at ``p`` ends, followed by ``,`` or ``}`` (-1: not found).  Only
    where it ends: what it is, the JSON decode of an equal line says.  Each kind ends where
    its own grammar says (a string at its closing quote, brackets where they match, a number
    or a literal at its last character), never at the next comma: so static bytes read back
    to back split into their keys one way only, and equal bytes are equal keys."""
    if p >= stop:
        return -1
    c = d[p]
    if c == 34:
        q = _string(d, p, stop)
    elif c == 91 or c == 123:
        depth = 0
        q = p
        while q < stop:
            c = d[q]
            if c == 34:
                q = _string(d, q, stop)
                if q < 0:
                    return -1
                continue
            if c == 91 or c == 123:
                depth += 1
            elif c == 93 or c == 125:
                depth -= 1
                if depth == 0:
                    q += 1
                    break
            q += 1
        if depth:
            return -1
    else:  # a number, true, false or null: its characters (what they say, the JSON decode judges)
        q = p
        while q < stop and (48 <= d[q] <= 57 or 65 <= d[q] <= 90 or 97 <= d[q] <= 122 or d[q] == 43 or d[q] == 45
                            or d[q] == 46):
            q += 1
        if q == p:
            return -1
    if q < 0 or q >= stop or (d[q] != 44 and d[q] != 125):
        return -1
    return q


def _equal(d: np.ndarray, span_a: np.ndarray, span_b: np.ndarray, ns: int, statics: np.ndarray, at: int) -> bool:
    """Whether the spans ``d[span_a[k]:span_b[k]]``, back to back, are ``statics`` from ``at``."""
    for k in range(ns):
        n = span_b[k] - span_a[k]
        if not same_bytes(d, span_a[k], statics, at, n):
            return False
        at += n
    return True


def _scan(d, rank, lines):  # type: ignore[no-untyped-def]  # noqa: ANN001, ANN202, C901
    """``scan``'s work, in one pass over the ``lines`` lines (see ``Scan``)."""
    n = d.shape[0]
    ls, le, row = np.empty(lines, np.int64), np.empty(lines, np.int64), np.empty(lines, np.int64)
    r_line, r_phase = np.empty(lines, np.int64), np.empty(lines, np.int8)
    r_ts, r_id, r_seq = np.empty(lines, np.int64), np.empty(lines, np.int64), np.empty(lines, np.int64)
    r_parent, r_peer, r_tid = np.empty(lines, np.int64), np.empty(lines, np.int64), np.empty(lines, np.int64)
    r_sk, r_gpu, r_flags = np.empty(lines, np.int64), np.empty(lines, np.int64), np.empty(lines, np.uint8)
    r_group = np.empty(lines, np.int64)
    span_a, span_b = np.empty(MOST_STATIC, np.int64), np.empty(MOST_STATIC, np.int64)
    statics = np.empty(n, np.uint8)  # each distinct static part's bytes, back to back
    seen = dict()  # static hash -> its first row
    seen[np.uint64(0)] = np.int64(-1)
    g_at, g_len = np.empty(lines, np.int64), np.empty(lines, np.int64)  # each row's static bytes in ``statics``
    g_peer = np.empty(lines, np.int64)  # (a group's first row: the peer its run holds, -1: none)
    recent = np.empty(MOST_RECENT, np.int64)  # the groups of one run tried first, the latest first
    nrecent = 0
    nst = 0
    nl = nr = 0
    i = 0
    while i < n:
        j = i
        while j < n and d[j] != 10:
            j += 1
        a, b = i, j
        i = j + 1
        ls[nl], le[nl] = a, b
        nl += 1
        row[nl - 1] = BLANK if a == b else JSON
        if b - a < 2 or d[a] != 123 or d[b - 1] != 125:
            continue
        # the keys, one by one: a per-call key's value read, a static one's bytes kept
        seen_keys = 0
        typ_ok = False
        ph = -1
        ts = op_id = r = -1
        seq = parent = peer = -1
        tid = sk = gpu = 0
        has_tid = has_sk = False
        flags = 0
        ns = 0
        other = False  # (a key only the JSON path reads)
        fast = -1  # (the group whose run the line's static run is, found as it was read)
        p = a + 1
        ok = True
        while True:
            if p >= b or d[p] != 34:
                ok = False
                break
            k0 = p + 1
            q = k0
            while q < b and d[q] != 34 and d[q] != 92:
                q += 1
            if q + 1 >= b or d[q] != 34 or d[q + 1] != 58:
                ok = False
                break
            key = _key(d, k0, q)
            v = q + 2
            if key != _K_OTHER:
                if seen_keys & (1 << key):  # (a key twice: the JSON path says which one counts)
                    ok = False
                    break
                seen_keys |= 1 << key
            if key == _K_TYPE:
                if v + 4 > b:
                    ok = False
                    break
                for k in range(4):
                    if d[v + k] != _OP[k]:
                        ok = False
                if not ok:
                    break
                typ_ok = True
                e = v + 4
            elif key == _K_PHASE:
                e = _string(d, v, b) if v < b and d[v] == 34 else -1
                if e < 0:
                    ok = False
                    break
                m = e - v - 2
                w = _word(d, v + 1, min(m, 8))
                for k in range(5):
                    if _PHASE_LEN[k] == m and _PHASE_WORD[k] == w and (
                            m <= 8 or (d[v + 9] == _WAIT_BEGIN_TAIL[0] and d[v + 10] == _WAIT_BEGIN_TAIL[1])):
                        ph = _PHASE_OF[k]
                if ph < 0:
                    ok = False
                    break
            elif key == _K_TS:
                ts, e = _int(d, v, b, 0, MAX_INT)
            elif key == _K_ID:
                op_id, e = _int(d, v, b, 0, MAX_INT)
            elif key == _K_RANK:
                r, e = _int(d, v, b, 0, MAX_RANK)
                if e >= 0 and r != rank:
                    e = -1
            elif key == _K_V:
                _version, e = _int(d, v, b, 0, SCHEMA_VERSION)
            elif key == _K_TID:
                tid, e = _int(d, v, b, -MAX_INT, MAX_INT)
                has_tid = True
            elif key == _K_SEQ:
                seq, e = _int(d, v, b, 0, MAX_INT)
            elif key == _K_PARENT:
                parent, e = _int(d, v, b, 0, MAX_INT)
            elif key == _K_SK:
                sk, e = _int(d, v, b, 0, MAX_INT)
                has_sk = True
            elif key == _K_GPU:
                gpu, e = _int(d, v, b, 0, MAX_INT)
                flags |= F_GPU
            elif key == _K_APPROX:
                e = v + 4
                if e > b or d[v] != 116 or d[v + 1] != 114 or d[v + 2] != 117 or d[v + 3] != 101:
                    e = -1  # (false, or not a bool: the JSON path)
                flags |= F_APPROX
            elif key == _K_EXC:
                e = -1  # (a text to redact: the JSON path)
            else:  # a static key: its bytes kept, in runs (keys back to back, with their commas)
                e = -1
                if ph == PH_BEGIN and ns == 0:  # (first, the run of a recent begin: most are one of a few)
                    for c in range(nrecent):
                        g = recent[c]
                        size = g_len[g]
                        if p + size < b and (d[p + size] == 44 or d[p + size] == 125) and same_bytes(
                                d, p, statics, g_at[g], size):
                            if g_peer[g] >= 0:
                                if seen_keys & (1 << _K_PEER):
                                    break
                                seen_keys |= 1 << _K_PEER
                                peer = g_peer[g]
                            e = p + size
                            fast = g
                            for y in range(c, 0, -1):
                                recent[y] = recent[y - 1]
                            recent[0] = g
                            break
                if e < 0:
                    if key == _K_PEER:
                        peer, e = _int(d, v, b, 0, MAX_RANK)
                    else:
                        e = _value(d, v, b)
                    other = other or key == _K_OTHER
                else:
                    other = True
                if e >= 0:
                    if ns and span_b[ns - 1] + 1 == p:
                        span_b[ns - 1] = e
                    elif ns == MOST_STATIC:
                        e = -1
                    else:
                        span_a[ns], span_b[ns] = p, e
                        ns += 1
            if e < 0 or e >= b or (d[e] != 44 and d[e] != 125):
                ok = False
                break
            if d[e] == 125:
                ok = e == b - 1
                break
            p = e + 1  # (a comma)
        if not ok or not typ_ok or ph < 0 or ts < 0 or op_id < 0 or r < 0:
            continue
        if ph == PH_BEGIN:
            if not has_tid or not has_sk or tid < 0 or flags:
                continue
        else:
            if other or parent >= 0 or has_tid or has_sk:  # (a key columns do not hold for this phase)
                continue
            if ph == PH_END:
                if (seq >= 0 or peer >= 0) and peer < 0:
                    continue
                if peer >= 0:
                    flags |= F_SOURCE
            elif seq >= 0 or peer >= 0 or (flags & F_APPROX):
                continue
            if (flags & F_GPU) and ph != PH_DONE:
                continue
        x = nr
        group = -1
        if ph == PH_BEGIN:  # its static bytes: the first row with the same ones
            size = 0
            for k in range(ns):
                size += span_b[k] - span_a[k]
            if fast >= 0 and ns == 1 and size == g_len[fast]:
                group = fast
                g_at[x], g_len[x] = g_at[fast], size
            else:
                h = _FNV
                for k in range(ns):
                    for y in range(span_a[k], span_b[k]):
                        h = (h ^ np.uint64(d[y])) * _FNV_PRIME
                first = np.int64(-1)
                if h in seen:
                    first = seen[h]
                if first >= 0 and g_len[first] == size and _equal(d, span_a, span_b, ns, statics, g_at[first]):
                    group = r_group[first]
                    g_at[x], g_len[x] = g_at[first], size
                else:
                    group = x
                    g_at[x], g_len[x], g_peer[x] = nst, size, peer
                    for k in range(ns):
                        for y in range(span_a[k], span_b[k]):
                            statics[nst] = d[y]
                            nst += 1
                    if first < 0:
                        seen[h] = x
                    if ns == 1:  # (a run the next begins may start with)
                        if nrecent < MOST_RECENT:
                            nrecent += 1
                        for y in range(nrecent - 1, 0, -1):
                            recent[y] = recent[y - 1]
                        recent[0] = x
        row[nl - 1] = x
        r_line[x], r_phase[x], r_ts[x], r_id[x] = nl - 1, ph, ts, op_id
        r_seq[x], r_parent[x], r_peer[x], r_tid[x] = seq, parent, peer, tid
        r_sk[x], r_gpu[x], r_flags[x], r_group[x] = sk, gpu, flags, group
        nr += 1
    return (ls[:nl], le[:nl], row[:nl], r_line[:nr], r_phase[:nr], r_ts[:nr], r_id[:nr], r_seq[:nr],
            r_parent[:nr], r_peer[:nr], r_tid[:nr], r_sk[:nr], r_gpu[:nr], r_flags[:nr], r_group[:nr])
