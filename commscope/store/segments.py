"""A directory store's stream as a sequence of segment files.

    rank-00003.jsonl                       segment 0 (the one file of traces before segments)
    rank-00003.s000001.t1780001234.jsonl   segment 1, begun at 1780001234 s (its first line's ts)
    rank-00003+1.s000002.t1780009999.jsonl incarnation 1's segment 2
    rank-00003.summary.jsonl               what retention summarized of the segments it deleted

A writer appends to its stream's newest segment and starts the next one once the current
one holds ``segment_bytes`` (``COMMSCOPE_SEGMENT_MB``, default 64 MiB).  Each segment begins
with the rank's ``meta`` line and blocks restate their own tables, so a segment decodes
alone: a reader may start at any of them (``--since``), and retention may delete the oldest
(``store/retention.py``).  A segment with a newer one is complete.  The name carries the
segment's start, so a reader picks the segments of a time window without opening any.
"""

from __future__ import annotations

import math
import os
import re
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

import orjson

from commscope.schema import MAX_RANK
from commscope.store.base import Stream
from commscope.store.files import read_from

#: Every file of a stream: its rank, incarnation, and (segments after the first) number and start
SEGMENT_FILE = re.compile(r"^rank-(\d{1,8})(?:\+(\d{1,6}))?(?:\.s(\d{6,9})\.t(\d{1,12}))?\.jsonl$")
SUMMARY_FILE = re.compile(r"^rank-(\d{1,8})(?:\+(\d{1,6}))?\.summary\.jsonl$")
#: An encoded event's time (ns), as its ``ts`` field reads (one pattern for every reader of it)
TS_FIELD = re.compile(rb'"ts":(\d{1,19})')

DEFAULT_SEGMENT_BYTES = 64 << 20
ENV_SEGMENT_MB = "COMMSCOPE_SEGMENT_MB"


class Segment(NamedTuple):
    """One file of a stream."""

    number: int
    start_s: int  # when its first line was written (s; 0: segment 0, from the stream's start)
    path: Path


def stream_prefix(rank: int, incarnation: int = 0) -> str:
    return f"rank-{rank:05d}" if not incarnation else f"rank-{rank:05d}+{incarnation}"


def segment_name(rank: int, incarnation: int, number: int, start_s: int = 0) -> str:
    base = stream_prefix(rank, incarnation)
    return f"{base}.jsonl" if number == 0 else f"{base}.s{number:06d}.t{start_s}.jsonl"


def summary_name(rank: int, incarnation: int = 0) -> str:
    return f"{stream_prefix(rank, incarnation)}.summary.jsonl"


def parse(name: str) -> tuple[Stream, int, int] | None:
    """(stream, segment number, start s) of a segment file's name, as ``segment_name`` spells
    it; None for any other name.  Another spelling of one is not one: ``rank-0.jsonl``
    beside ``rank-00000.jsonl`` was read as rank 0's first segment instead of it (its events
    lost, uncounted), and ``.s0000001`` beside ``.s000001`` as a second copy."""
    m = SEGMENT_FILE.match(name)
    if m is None or int(m.group(1)) > MAX_RANK:
        return None
    stream, number, start = (int(m.group(1)), int(m.group(2) or 0)), int(m.group(3) or 0), int(m.group(4) or 0)
    return (stream, number, start) if name == segment_name(*stream, number, start) else None


def parse_summary(name: str) -> Stream | None:
    """The stream of a summary file's name, as ``summary_name`` spells it; None for any other."""
    m = SUMMARY_FILE.match(name)
    if m is None or int(m.group(1)) > MAX_RANK:
        return None
    stream = int(m.group(1)), int(m.group(2) or 0)
    return stream if name == summary_name(*stream) else None


def segments_of(names: Iterable[str], directory: Path) -> dict[Stream, list[Segment]]:
    """The streams among ``names`` (files of ``directory``) with their segments, oldest first."""
    return grouped(segment_of(got, name, directory) for name in names if (got := parse(name)) is not None)


def segment_of(parsed: tuple[Stream, int, int], name: str, directory: Path) -> tuple[Stream, Segment]:
    """A segment file's stream and segment, from its name as ``parse`` read it."""
    stream, number, start = parsed
    return stream, Segment(number, start, directory / name)


def grouped(segs: Iterable[tuple[Stream, Segment]]) -> dict[Stream, list[Segment]]:
    """Segments by stream, oldest first, in stream order (a caller that made them already,
    ``segment_of``, makes nothing twice)."""
    out: dict[Stream, list[Segment]] = {}
    for stream, seg in segs:
        out.setdefault(stream, []).append(seg)
    for got in out.values():
        got.sort()
    return dict(sorted(out.items()))


def list_segments(directory: Path) -> dict[Stream, list[Segment]]:
    try:
        return segments_of(os.listdir(directory), directory)
    except OSError:
        return {}


def start_of(line: bytes) -> int | None:
    """The time (s) of an encoded event (its ``ts``), None when it has none."""
    m = TS_FIELD.search(line[:256])
    return int(m.group(1)) // 1_000_000_000 if m else None


#: What a segment's first line, the rank's meta, says of the lines its writer wrote before it
#: (``opening_meta``): a reader starting there takes them as accounted for (read, skipped by a
#: window, summarized), not as lost when a ``store_lost`` marker counts them with the rest
_LINES_BEFORE = re.compile(rb'"lines_before":(\d{1,18})[,}]')
_META = b'"type":"meta"'


def opening_meta(meta: bytes, lines_before: int) -> bytes:
    """The rank's ``meta`` line as a segment after the first begins with it: saying the lines
    its writer wrote to the stream before the segment (``lines_before``, the count a writer's
    ``store_lost`` marker says, ``DirectoryWriter.stored``).  ``meta`` as it is where it is
    not a JSON object."""
    try:
        e = orjson.loads(meta)
    except orjson.JSONDecodeError:
        return meta
    return orjson.dumps(e | {"lines_before": lines_before}) if isinstance(e, dict) else meta


def lines_before(head: bytes) -> int | None:
    """The lines written before a segment whose first bytes are ``head``, as its meta says
    (``opening_meta``); None where it does not (segment 0, a writer from before, a file its
    writer started again after a loss: its ``store_lost`` marker comes first)."""
    end = head.find(b"\n")  # (not a split: ``head`` may be a whole chunk)
    if end < 0:
        return None
    line = head[:end]
    if _META not in line:
        return None
    m = _LINES_BEFORE.search(line)
    return int(m.group(1)) if m else None


#: A meta line is far shorter than this (its op names and dtypes tables: ~1.5 KB)
META_BYTES = 1 << 16


def meta_of(path: Path) -> bytes | None:
    """A segment's first line where it is the rank's meta (ended), what decodes its blocks
    anywhere in it; None where it is not (a file its writer started again after a loss
    begins with its marker), or cannot be read."""
    try:
        head = read_from(path, 0, META_BYTES)
    except OSError:
        return None
    end = head.find(b"\n")
    return head[:end + 1] if end > 0 and _META in head[:end] else None


def segment_bytes_from_env() -> int:
    """``$COMMSCOPE_SEGMENT_MB`` in bytes, else ``DEFAULT_SEGMENT_BYTES``.  A value that is
    not a finite number of MiB of at least a byte (``abc``, ``0``, ``-1``, ``inf``, ``1e400``,
    ``nan``) takes the default and says so, as ``$COMMSCOPE_RETAIN`` does: before, ``inf``
    raised in every writer made, and a rank recorded nothing, retrying for good."""
    text = os.environ.get(ENV_SEGMENT_MB, "").strip()
    if not text:
        return DEFAULT_SEGMENT_BYTES
    try:
        mb = float(text)
    except ValueError:
        mb = math.nan
    nbytes = mb * (1 << 20)
    if not math.isfinite(nbytes) or nbytes < 1:
        warnings.warn(f"commscope: ${ENV_SEGMENT_MB}={text[:40]!r} cannot be read (give a number of MiB above 0, "
                      f"such as 64): segments of {DEFAULT_SEGMENT_BYTES >> 20} MiB", RuntimeWarning, stacklevel=2)
        return DEFAULT_SEGMENT_BYTES
    return int(nbytes)


def window_start(segs: list[Segment], since_s: float | None) -> int:
    """The index of the first of ``segs`` (oldest first) a read of the window from
    ``since_s`` needs: the last segment begun at or before it (it holds the window's start),
    else the first.  A segment's name says when it began in whole seconds, rounded down: one
    named within the second before ``since_s`` may have begun after it, so the one before
    it, which may hold the window's first events, is read too.  The stream's newest
    segment is read whatever the window, so a rank that went silent before it still shows
    its end."""
    if since_s is None or not segs:
        return 0
    k = 0
    for i, s in enumerate(segs):
        if s.number == 0 or s.start_s + 1 <= since_s:
            k = i
        else:
            break
    return k
