"""Scanning a stream's heartbeat and sample lines, compiled: what ``blockscan`` is to blocks.

Every rank writes a heartbeat and a sample a second or so: a third of a native stream's
lines.  Decoded as JSON (msgspec, the schema's checks, then ``beats.of_events`` picking
them out of the dicts) they cost a whole read's worker ~1.2 us each, a sixth of its time
on a job of 400 ops a rank, for what the model keeps of them: a few numbers
(``beats.Entry``).  ``scan`` reads the lines a block scan left in one compiled pass: a line
that is exactly how the recorders write a heartbeat (``{"type":"heartbeat","ts":T,
"inflight":N,"v":V,"rank":R}``) or a sample (``{"type":"sample","ts":T`` then any of
``cpu``, ``rss``, ``gpu_util``, ``gpu_mem``, ``gpu_mem_total``, ``gpu_power``,
``gpu_temp`` in that order, then ``"v"`` and ``"rank"``), with values the schema accepts,
becomes a row; every other line (a ``gpu_error``, another key or order, a time of 0, a
number written otherwise) is left for the JSON path, which decides what it means.

A whole read's worker takes a stream's rows (``Taken``, ``entries``); a live poll decoded
together takes those of all its streams in one pass (``Gathered``, ``polled``): half a
poll's lines, which as JSON dicts cost its read process ~11% and the console ~27% of
their time catching up on 16k ranks.

A number of a sample is read only where reading it is exact (a float parsed as JSON parses
it): no exponent, not ``-0``, at most 18 digits whose integer is at most 2 ** 53; it is that
integer divided by a power of ten, both exact as doubles, so the division rounds once, as
parsing does.

Without numba (or with ``COMMSCOPE_SCAN=0``) ``scan`` returns None.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from commscope import beats, blockscan, compiled, schema
from commscope.schema import MAX_INT, MAX_RANK, SCHEMA_VERSION

#: A line's kind: not a row (the JSON path), a heartbeat, a sample
OTHER, HEARTBEAT, SAMPLE = 0, 1, 2
#: A sample's values that the model keeps in columns (``Rows.values``' rows), in the order a
#: line holds them; then the keys a line may hold after them, checked and not kept (only
#: the last sample keeps them: it is decoded as JSON)
VALUES = beats.SAMPLE_FIELDS[1:]
_OPTIONAL = tuple(b',"%s":' % key.encode() for key in (*VALUES, "gpu_power", "gpu_temp"))
_REAL = np.array([schema.RawEvent.__annotations__[k[2:-2].decode()] == schema.Real for k in _OPTIONAL])  # (else a Count)
_KEY_AT = np.zeros((len(_OPTIONAL), max(map(len, _OPTIONAL))), np.uint8)
_KEY_LEN = np.array([len(k) for k in _OPTIONAL], np.int64)
for _k, _key in enumerate(_OPTIONAL):
    _KEY_AT[_k, :len(_key)] = np.frombuffer(_key, np.uint8)
_HEARTBEAT = np.frombuffer(b'{"type":"heartbeat","ts":', np.uint8)
_SAMPLE = np.frombuffer(b'{"type":"sample","ts":', np.uint8)
_INFLIGHT = np.frombuffer(b',"inflight":', np.uint8)
_V = np.frombuffer(b',"v":', np.uint8)
_RANK = np.frombuffer(b',"rank":', np.uint8)
_block_lit = blockscan._lit  # (the block scanner's helpers, compiled by ``_load``)
_block_num = blockscan._num
_POW10 = np.array([10.0 ** k for k in range(19)], np.float64)  # (each exact: up to 10 ** 22 is)
_EXACT = 1 << 53  # (an integer up to this is a double exactly)


class Rows(NamedTuple):
    """The lines of a chunk that ``scan`` read: ``kind`` per line given (``OTHER``,
    ``HEARTBEAT``, ``SAMPLE``), and per line its ``ts``, a heartbeat's ``inflight`` and a
    sample's ``values`` (a row of each of ``VALUES``, NaN: not on the line)."""

    kind: np.ndarray
    ts: np.ndarray
    inflight: np.ndarray
    values: np.ndarray


class Taken(NamedTuple):
    """The heartbeats and samples a chunk's decode took out of its events (``Decoded.beats``):
    their ``rows``, each one's ``line`` in the chunk and its bytes (``data[start:end]``), and
    the line of each event the decode kept (``event_lines``): what puts them back among the
    events, as dicts, where a stream's heartbeats and samples must stay events (``back``)."""

    rows: Rows
    line: np.ndarray
    data: bytes
    start: np.ndarray
    end: np.ndarray
    event_lines: list[int]


class _Summed(NamedTuple):
    """What the model keeps of streams' rows, an array a stream (``_summed``)."""

    t0: np.ndarray
    t1: np.ndarray
    beat_ts: np.ndarray  # its latest heartbeat's time (-1: none), the last of equals
    inflight: np.ndarray  # and its count of ops in flight
    start: np.ndarray  # its samples are ``cols``' rows ``start[k]:start[k + 1]``
    cols: dict[str, np.ndarray]  # (``beats.SAMPLE_FIELDS``)
    sample: np.ndarray  # each sample's row among all the rows


def _summed(rows: Sequence[Rows], of: np.ndarray, bounds: np.ndarray) -> _Summed:
    """``rows`` (in order, joined) of streams, row k of stream ``of[k]`` (ascending: stream
    k's rows are ``bounds[k]:bounds[k + 1]``, none empty), as what the model keeps of each
    stream: its first and last times, its latest heartbeat, its samples' columns."""
    n = bounds.shape[0] - 1
    kind, ts, inflight = (np.concatenate(c) for c in ([r.kind for r in rows], [r.ts for r in rows],
                                                        [r.inflight for r in rows]))
    values = np.concatenate([r.values for r in rows], axis=1)
    t0, t1 = np.minimum.reduceat(ts, bounds[:-1]), np.maximum.reduceat(ts, bounds[:-1])
    beat_ts, beat_inflight = np.full(n, -1, np.int64), np.zeros(n, np.int64)
    beat = np.flatnonzero(kind == HEARTBEAT)
    if beat.shape[0]:  # each stream's latest heartbeat, the last of equals
        order = np.lexsort((beat, ts[beat], of[beat]))
        who = of[beat][order]
        last = np.flatnonzero(np.append(who[1:] != who[:-1], True))
        at = beat[order[last]]
        beat_ts[who[last]], beat_inflight[who[last]] = ts[at], inflight[at]
    sample = np.flatnonzero(kind == SAMPLE)
    start = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(of[sample], minlength=n), out=start[1:])
    cols = {"ts": ts[sample].astype(np.float64), **dict(zip(VALUES, values[:, sample], strict=True))}
    return _Summed(t0, t1, beat_ts, beat_inflight, start, cols, sample)


def entries(streams: Sequence[tuple[int, list[Taken]]]) -> list[beats.Entry]:
    """``beats.of_events`` of streams whose heartbeats and samples are all in their
    ``Taken`` (per stream: its rank, its chunks' in order; none among its events): what
    the model keeps of them, an entry a stream.  Only each stream's last sample is
    decoded as JSON (the model keeps it as it was).  All streams' rows in one pass: a
    whole read's worker spent ~40 us a stream on ~15 numpy calls over a few dozen rows
    and a JSON decode of one line."""
    n = len(streams)
    if not n:
        return []
    sizes = np.fromiter((sum(t.rows.kind.shape[0] for t in taken) for _, taken in streams), np.int64, n)
    bounds = np.zeros(n + 1, np.int64)
    np.cumsum(sizes, out=bounds[1:])
    got = _summed([t.rows for _, taken in streams for t in taken], np.repeat(np.arange(n), sizes), bounds)
    t0, t1, beat_ts, beat_inflight, starts, cols_all, sample = got
    with_samples = np.flatnonzero(starts[1:] > starts[:-1])
    last_rows = sample[starts[1:][with_samples] - 1] - bounds[:-1][with_samples]  # (in its stream's rows)
    lasts = _last_samples(streams, with_samples.tolist(), last_rows.tolist())
    out = []
    last_of = dict(zip(with_samples.tolist(), lasts, strict=True))
    for k, (rank, _) in enumerate(streams):
        a, b = int(starts[k]), int(starts[k + 1])
        cols = {f: c[a:b] for f, c in cols_all.items()} if b > a else None
        out.append(beats.Entry(rank, int(sizes[k]), int(t0[k]), int(t1[k]), int(beat_ts[k]), int(beat_inflight[k]),
                               cols, last_of.get(k)))
    return out


def _last_samples(streams: Sequence[tuple[int, list[Taken]]], which: list[int], rows: list[int]) -> list[dict]:
    """The sample at row ``rows[k]`` of stream ``which[k]`` (its rows over its chunks),
    each decoded as JSON: in one call, or each apart where one is not what its row says
    (a row is one valid event of its rank)."""
    lines, ranks = [], []
    for k, at in zip(which, rows, strict=True):
        rank, taken = streams[k]
        for t in taken:  # (the chunk it is in)
            if at < t.line.shape[0]:
                lines.append(t.data[int(t.start[at]):int(t.end[at])])
                ranks.append(rank)
                break
            at -= t.line.shape[0]
    got = schema.decode_many(lines, ranks) if lines else []
    if got is None:
        got = []
        for line, rank in zip(lines, ranks, strict=True):
            one = schema.decode_lines(line, rank).events
            assert len(one) == 1  # (a row is one valid event)
            got.append(one[0])
    return got


class Gathered(NamedTuple):
    """The heartbeat and sample lines of a poll's chunks decoded together
    (``blocks.decode_chunks``) that ``scan`` read, taken out of their chunks' events: their
    ``rows``, each one's ``chunk`` (ascending, a chunk's rows in line order), its ``line``
    (in its pass's scan) and its bytes (``data[start:end]``, a copy of those lines alone:
    what puts one back among the events, as a dict, ``TraceReader._beats_apart``).
    ``among``: for a chunk with events too, how many of them come before its rows (its
    head's, ``learn_head``) and the line of each after those, so rows put back go where
    they were."""

    rows: Rows
    chunk: np.ndarray
    line: np.ndarray
    data: bytes
    start: np.ndarray
    end: np.ndarray
    among: dict[int, tuple[int, list[int]]]

    def only(self, keep: np.ndarray) -> Gathered:
        """The rows ``keep`` says (a bool a row)."""
        r = self.rows
        return self._replace(rows=Rows(r.kind[keep], r.ts[keep], r.inflight[keep], r.values[:, keep]),
                             chunk=self.chunk[keep], line=self.line[keep], start=self.start[keep],
                             end=self.end[keep])

    def compact(self) -> Gathered:
        """Its lines copied out of the chunks' data (a poll holds its rows to its end, not
        every chunk it decoded: ``QUEUE_BYTES`` bounds what a poll holds at once)."""
        sizes = self.end - self.start
        start = np.zeros(sizes.shape[0], np.int64)
        np.cumsum(sizes[:-1], out=start[1:])
        total = int(sizes.sum())
        at = np.repeat(self.start - start, sizes) + np.arange(total, dtype=np.int64)
        data = np.frombuffer(self.data, np.uint8)[at].tobytes()
        return self._replace(data=data, start=start, end=start + sizes)

    def of(self, chunk: int) -> slice:
        """Its rows of ``chunk``."""
        return slice(*np.searchsorted(self.chunk, [chunk, chunk + 1]).tolist())

    def lines(self, at: slice) -> list[bytes]:
        """The lines of rows ``at``."""
        return [self.data[a:b] for a, b in zip(self.start[at].tolist(), self.end[at].tolist(), strict=True)]


def polled(parts: Sequence[tuple[Gathered, np.ndarray]]) -> beats.Beats | None:
    """A poll's rows (``Gathered``, each with the rank of each of its chunks) as streams'
    heartbeats and samples, an entry a chunk that has rows, in the order given: what
    ``entries`` makes of a whole read's, with no Python step a stream.  Each entry's last
    sample is its line as written (``beats.Beats.last``), decoded only where asked: a
    poll of 16k streams brings 16k of them a second, and the model asks for few."""
    parts = [(g, ranks) for g, ranks in parts if g.chunk.shape[0]]
    if not parts:
        return None
    base, ofs = 0, []
    for g, ranks in parts:  # (each chunk of each part a stream of its own, numbered in order)
        ofs.append(g.chunk + base)
        base += ranks.shape[0]
    of = np.concatenate(ofs)
    rank_of = np.concatenate([ranks for _, ranks in parts])
    first = np.flatnonzero(np.r_[True, of[1:] != of[:-1]])
    n = first.shape[0]
    stream = of[first]
    count = np.diff(np.append(first, of.shape[0]))
    t0, t1, beat_ts, beat_inflight, start, cols, sample = _summed(
        [g.rows for g, _ in parts], np.cumsum(np.r_[False, of[1:] != of[:-1]]), np.append(first, of.shape[0]))
    lasts: list[bytes | None] = [None] * n
    with_samples = np.flatnonzero(start[1:] > start[:-1])
    if with_samples.shape[0]:
        at = sample[start[1:][with_samples] - 1]  # each one's last sample, a row of ``of``
        bounds = np.cumsum([0, *(g.chunk.shape[0] for g, _ in parts)])
        part = np.searchsorted(bounds, at, side="right") - 1
        for p in np.unique(part).tolist():
            mine = part == p
            g = parts[p][0]
            for k, a, b in zip(with_samples[mine].tolist(), g.start[at[mine] - bounds[p]].tolist(),
                               g.end[at[mine] - bounds[p]].tolist(), strict=True):
                lasts[k] = g.data[a:b]
    return beats.Beats(rank_of[stream], count, t0, t1, beat_ts, beat_inflight, start, cols, lasts)


def kept(events: list[dict], several: bool) -> frozenset[int]:
    """The kinds of rows a stream's read must put back among its ``events`` (as
    ``of_events`` of them all would leave those kinds as events): both where the rank has
    ``several`` streams in the read or where an event of a kind is one ``of_events`` would
    take with the rows (it is then taken from the events, rows back); a kind ``beats.keeps``
    keeps."""
    if several:
        return _BOTH
    heartbeats = [e for e in events if e["type"] == "heartbeat"]
    samples = [e for e in events if e["type"] == "sample"]
    keep_beats, keep_samples = beats.keeps(heartbeats, samples)
    if (heartbeats and not keep_beats) or (samples and not keep_samples):
        return _BOTH
    return frozenset((HEARTBEAT,) * keep_beats + (SAMPLE,) * keep_samples)


_BOTH = frozenset({HEARTBEAT, SAMPLE})


def back(events: list[dict], taken: Taken, rank: int, kinds: frozenset[int] = _BOTH) -> tuple[list[dict],
                                                                                              Taken | None]:
    """(A chunk's ``events`` with its rows of ``kinds`` put back, as dicts in line order, as
    a decode that took none of them gives them; the rows left, None: none)."""
    put = np.isin(taken.rows.kind, list(kinds))
    if not put.any():
        return events, taken
    sel, keep = np.flatnonzero(put), np.flatnonzero(~put)
    lines = [taken.data[a:b] for a, b in zip(taken.start[sel].tolist(), taken.end[sel].tolist(), strict=True)]
    got, at = schema.decode_indexed(lines, rank)
    assert len(got.events) == len(lines) and at == list(range(len(lines)))  # (each row is one valid event)
    both = sorted(zip(taken.event_lines + taken.line[sel].tolist(), range(len(events) + len(lines)),
                      events + got.events, strict=True), key=lambda x: (x[0], x[1]))
    out = [e for _, _, e in both]
    if not keep.shape[0]:
        return out, None
    r = taken.rows
    return out, taken._replace(rows=Rows(r.kind[keep], r.ts[keep], r.inflight[keep], r.values[:, keep]),
                               line=taken.line[keep], start=taken.start[keep], end=taken.end[keep],
                               event_lines=[k for k, _, _ in both])


_kernel: Callable[..., tuple] | None = None


def available() -> bool:
    """Whether ``scan`` scans (numba is there, ``COMMSCOPE_SCAN`` does not say no)."""
    return blockscan.available() and _load() is not None


def scan(data: bytes, starts: np.ndarray, ends: np.ndarray, rank: int | np.ndarray) -> Rows | None:
    """The lines ``data[starts[k]:ends[k]]`` of ``rank``'s stream (without their newlines;
    an array: line k of stream ``rank[k]``, a poll's lines of many streams) read where each
    is a heartbeat or a sample as the recorders write them; None when the scanner is not
    available."""
    if not available():
        return None
    assert _kernel is not None
    ranks = np.full(starts.shape[0], rank, np.int64) if isinstance(rank, int) else np.ascontiguousarray(rank, np.int64)
    return Rows(*_kernel(np.frombuffer(data, np.uint8), starts, ends, ranks))


def _load() -> Callable[..., tuple] | None:
    global _kernel
    if _kernel is None and blockscan._load() is not None:
        # (the block scanner's helpers as they are now: compiled where it was compiled here;
        # else ``compiled._compile_here`` compiles them before this kernel, if it must)
        globals().update(_block_lit=blockscan._lit, _block_num=blockscan._num)
        _kernel = compiled.jit(globals(), ("_lit", "_count", "_real", "_scan"),  # (called: they borrow)
                               args=("const uint8[::1]", "const int64[::1]", "const int64[::1]", "const int64[::1]"))
    return _kernel


def _lit(d: np.ndarray, p: int, stop: int, lit: np.ndarray, n: int) -> int:
    """Where the first ``n`` bytes of ``lit`` end if they are at ``p`` (-1: they are not, or
    ``p`` is -1): the block scanner's ``_lit``."""
    return -1 if p < 0 else _block_lit(d, p, stop, lit[:n])


def _count(d: np.ndarray, p: int, stop: int, most: int) -> tuple[int, int]:
    """The block scanner's ``_num`` (a JSON integer from 0 to ``most``), or (-1, -1) if
    ``p`` is -1."""
    return (-1, -1) if p < 0 else _block_num(d, p, stop, most)


def _real(d: np.ndarray, p: int, stop: int) -> tuple[float, int]:
    """(value, where it ends) of the JSON number at ``p`` where it reads exactly as a double
    (``-?digits[.digits]``, 18 digits at most whose integer is at most 2 ** 53, not ``-0``:
    that integer over a power of ten, both exact, one rounding); (0, -1) if not, or if
    ``p`` is -1."""
    if p < 0 or p >= stop:
        return 0.0, -1
    neg = d[p] == 45
    q = p + 1 if neg else p
    s = q
    m = np.int64(0)
    while q < stop and 48 <= d[q] <= 57:
        m = m * 10 + np.int64(d[q] - 48)
        q += 1
    digits = q - s
    if digits == 0 or (d[s] == 48 and digits > 1):
        return 0.0, -1
    frac = 0
    if q < stop and d[q] == 46:
        q += 1
        f = q
        while q < stop and 48 <= d[q] <= 57:
            m = m * 10 + np.int64(d[q] - 48)
            q += 1
        frac = q - f
        if frac == 0:
            return 0.0, -1
    if digits + frac > 18 or m > _EXACT or (q < stop and (d[q] == 101 or d[q] == 69)) or (neg and m == 0):
        return 0.0, -1
    v = np.float64(m) / _POW10[frac]
    return (-v if neg else v), q


def _scan(d, starts, ends, ranks):  # type: ignore[no-untyped-def]  # noqa: ANN001, ANN202
    """``scan``'s work, line by line (line k of rank ``ranks[k]``)."""
    n = starts.shape[0]
    kind = np.zeros(n, np.int8)
    ts = np.zeros(n, np.int64)
    inflight = np.zeros(n, np.int64)
    values = np.full((len(VALUES), n), np.nan, np.float64)
    for k in range(n):
        a, stop = starts[k], ends[k]
        if stop - a < 20 or d[stop - 1] != 125:
            continue
        p = _lit(d, a, stop, _HEARTBEAT, _HEARTBEAT.shape[0])
        what = HEARTBEAT
        if p < 0:
            p = _lit(d, a, stop, _SAMPLE, _SAMPLE.shape[0])
            what = SAMPLE
        t, p = _count(d, p, stop, MAX_INT)
        if p < 0 or t == 0:  # (a time of 0: the JSON path's, as the model takes it)
            continue
        if what == HEARTBEAT:
            busy, p = _count(d, _lit(d, p, stop, _INFLIGHT, _INFLIGHT.shape[0]), stop, MAX_INT)
        else:
            busy = 0
            for j in range(_KEY_LEN.shape[0]):  # the optional keys, each at most once, in order
                q = _lit(d, p, stop, _KEY_AT[j], _KEY_LEN[j])
                if q < 0:
                    continue
                if _REAL[j]:
                    x, p = _real(d, q, stop)
                else:
                    c, p = _count(d, q, stop, MAX_INT)
                    x = np.float64(c)
                if p < 0:
                    break
                if j < values.shape[0]:
                    values[j, k] = x
            if p < 0:
                values[:, k] = np.nan
                continue
        _v, p = _count(d, _lit(d, p, stop, _V, _V.shape[0]), stop, SCHEMA_VERSION)
        r, p = _count(d, _lit(d, p, stop, _RANK, _RANK.shape[0]), stop, MAX_RANK)
        if p != stop - 1 or r != ranks[k]:
            values[:, k] = np.nan
            continue
        kind[k], ts[k], inflight[k] = what, t, busy
    return kind, ts, inflight, values
