"""What a rank is in every few seconds of its stream, so a window starts inside a segment.

A segment holds ~93 minutes of a rank at 25 ops a second, and a reader of a window used to
start at the segment holding the window's start: a console's ``--since 10m`` read up to 93
minutes of every rank, and a restart at the tail read back about what its model held.  So a
child process beside the writers (``children.Keeper``: one per writing process and job directory,
at the lowest priority; LTTng's consumer daemon) tails each stream's open segment and, every
``EVERY_S`` seconds that it grew by ``MIN_BYTES``, appends a keyframe to the segment's
``rank-00003.keys.000004.bin``: what the rank is in at a line's end (the carry
``inflight.replay`` makes of the keyframe before and the lines since: the rules of a
segment's carry), where that is, and the lines before it.  Not the rank's meta (~1.5 KB of
tables, most of a keyframe): a reader takes it from the segment's first line.  A reader
starts each stream at the newest keyframe written before the window (``at_or_before``): the
bytes before it are skipped as the segments before a window are, and the carry stands for
them.

A keyframe is appended only once ``MIN_BYTES`` more are written past it, so a reader always
reads the stream's last lines itself: a rank that exited, crashed or went silent says so in
lines of its own, not only in a carry (which keeps what is in flight, not how a rank ended).

File: records, each a carry (ended JSON lines) followed by a ``FOOTER``: magic, the carry's
length, the segment offset, the stream's lines before the segment and within it before the
offset, the time of the newest line before it (ns), a CRC32 of all of it.  Read from the
end, a chunk at a time: a window of the last minutes reads a few of them, not the file.
A torn or damaged record (a keeper killed mid-write, a full disk) hides from readers every
record before it (they walk back from the end, one footer at a time); newer ones a keeper
appended after it still serve, and where none does a window starts at the segment's start.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import struct
import sys
import time
import warnings
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, NamedTuple

import numpy as np

from commscope.store import children, inflight
from commscope.store.base import Stream
from commscope.store.files import O_NOFOLLOW, create_file, mode_of, read_from
from commscope.store.segments import MAX_RANK, TS_FIELD, lines_before, list_segments, stream_prefix
from commscope.store.segments import parse as parse_segment

#: magic, carry bytes, offset in the segment, lines before the segment, lines of it before the
#: offset, newest time before the offset (ns), CRC32 of the carry and the fields before it
FOOTER = struct.Struct("<4sIQQQqI")
MAGIC = b"CSK1"
#: A keyframe no more often than this (s; ``$COMMSCOPE_KEYFRAME_S``, 0 or ``off``: none) ...
EVERY_S = 2.0
ENV_EVERY = "COMMSCOPE_KEYFRAME_S"
#: ... and only once the stream grew this much past the last: a reader reads at most about
#: twice it of a stream before its window (16k ranks: ~0.25 GiB in all), and at least it.
#: At 25 collectives a second (~4.7 KB a rank a second) a keyframe comes every ~2 s, its
#: carry (~0.7-1 KB with a few groups; a group's members as runs, whatever the ranks) ~2-3%
#: of the stream; at most ~1/8 of a slow one
MIN_BYTES = 8 << 10
#: A carry holds the ops in flight of one rank: far less than this, or the record is damaged
MAX_CARRY = 64 << 20
#: A writer names its stream to the keeper once its segment holds this much (a stream of less is
#: read from its segment's start at no great cost)
FOLLOW_AFTER = 4 * MIN_BYTES
#: The bytes of a segment a step replays at most (a keeper started late catches up in steps)
READ_BYTES = 8 << 20
#: The bytes before where the keeper goes on that it reads again, to know the file is the one it
#: replayed (``DirectoryReader.SAME_FILE_BYTES``)
SAME_FILE_BYTES = 32
#: The footers a reader walks back at most looking for a window's start: ~9 h of keyframes
#: at ``EVERY_S`` (a segment holds ~1.5 h at 25 collectives a second); one further back is as
#: good as the segment's start ...
MAX_WALK = 16384
#: ... reading the file back this much at a time (~64 keyframes: a window of the last
#: minutes reads one chunk)
WALK_CHUNK = 64 << 10

#: How often a writer makes sure its keeper runs (``children.Keeper.ensure``)
CHECK_S = 5.0

KEYS_FILE = re.compile(r"^rank-(\d{1,8})(?:\+(\d{1,6}))?\.keys\.(\d{6,9})\.bin$")


class Keyframe(NamedTuple):
    """Where a reader may start a stream inside a segment, and what the rank is in there."""

    offset: int  # the bytes of the segment before it (a line's end)
    lines_before: int  # the lines of the stream before the segment (its meta says them)
    lines: int  # the lines of the segment before ``offset``
    last_ns: int  # the time of the newest line before it (a window from after it starts here)
    carry: bytes  # what the rank is in there (``inflight.Replayed.carry``, no meta), ended lines


def keys_name(stream: Stream, number: int) -> str:
    return f"{stream_prefix(*stream)}.keys.{number:06d}.bin"


def keys_path(directory: Path, stream: Stream, number: int) -> Path:
    """The keyframes of segment ``number`` of ``stream`` (deleted with it by retention)."""
    return directory / keys_name(stream, number)


def parse_keys(name: str) -> tuple[Stream, int] | None:
    """(stream, segment number) of a keyframe file's name as ``keys_name`` spells it; None for
    any other name."""
    m = KEYS_FILE.match(name)
    if m is None or int(m.group(1)) > MAX_RANK:
        return None
    stream, number = (int(m.group(1)), int(m.group(2) or 0)), int(m.group(3))
    return (stream, number) if name == keys_name(stream, number) else None


def record(k: Keyframe) -> bytes:
    """A keyframe as its file holds it: its carry, then its footer."""
    fields = struct.pack("<QQQq", k.offset, k.lines_before, k.lines, k.last_ns)
    crc = zlib.crc32(fields, zlib.crc32(k.carry))
    return k.carry + FOOTER.pack(MAGIC, len(k.carry), k.offset, k.lines_before, k.lines, k.last_ns, crc)


def at_or_before(path: Path | str, since_ns: int, segment_size: int | None = None) -> Keyframe | None:
    """The newest keyframe of a segment's file whose lines before it are all older than
    ``since_ns`` (a window from then on starts there), None where there is none (no file, a
    window before the first, a damaged or torn record at the end).  ``segment_size``: where
    the segment is smaller (written again under its name, truncated), no keyframe of it is
    trusted."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        end = os.fstat(fd).st_size
        at, buf = end, b""  # (the file's bytes [at, at + len(buf)), read back a chunk at a time)
        for _ in range(MAX_WALK):
            if end < FOOTER.size:
                return None
            if end - FOOTER.size < at:
                at = max(0, end - WALK_CHUNK)
                buf = os.pread(fd, end - at, at)
                if len(buf) < end - at:
                    return None
            foot = buf[end - FOOTER.size - at:end - at]
            magic, n, offset, before, lines, last_ns, crc = FOOTER.unpack(foot)
            start = end - FOOTER.size - n
            if magic != MAGIC or n > MAX_CARRY or start < 0:
                return None  # (a torn or damaged record: nothing before it is found either)
            if last_ns < since_ns:
                if segment_size is not None and offset > segment_size:
                    return None
                carry = buf[start - at:start - at + n] if start >= at else os.pread(fd, n, start)
                k = Keyframe(offset, before, lines, last_ns, carry)
                return k if len(carry) == n and record(k)[-FOOTER.size:] == foot else None
            end = start
        return None
    except OSError:
        return None
    finally:
        os.close(fd)


def newest_ns(data: bytes) -> int:
    """The time of the newest of the ended lines ``data`` (the largest ``ts`` among all of them:
    not their last few, a last line may be a stack of many frames or a busy tick's block of
    kilobytes, and a merged Flight Recorder line may come late; 0 where none says one).  A
    block line's is its tick's, after its records'."""
    return max(map(int, TS_FIELD.findall(data)), default=0)


class _Followed:
    """A stream's open segment as the keeper follows it."""

    __slots__ = ("stream", "number", "path", "offset", "lines_before", "lines", "before", "last_ns", "due",
                 "pending", "carry", "tail")

    def __init__(self, stream: Stream, number: int, path: Path) -> None:
        self.stream = stream
        self.number = number
        self.path = path
        self.offset = 0  # the bytes of the segment replayed into ``before``
        self.lines_before: int | None = 0 if number == 0 else None  # (its meta says, read at its start)
        self.lines = 0  # the segment's lines before ``offset``
        #: what the rank is in at ``offset``, its meta first (what decodes its blocks there)
        self.before: bytes | None = b"" if number == 0 else None
        self.carry = b""  # ... without its meta: what a keyframe there holds
        self.last_ns = 0
        self.due = 0.0  # (monotonic) no keyframe before then
        self.pending: Keyframe | None = None  # made, appended once the segment grew past it
        self.tail = b""  # the last bytes replayed (``SAME_FILE_BYTES``): another file under its name differs there

    def keyframe(self) -> Keyframe:
        assert self.lines_before is not None and self.before is not None
        return Keyframe(self.offset, self.lines_before, self.lines, self.last_ns, self.carry)


def parse_every(text: str) -> float | None:
    """Seconds between a stream's keyframes as a user writes them (``5``, ``0.5``; ``0``,
    ``off`` or ``none``: none); ValueError for anything else."""
    text = text.strip().lower()
    if text in ("0", "off", "none"):
        return None
    try:
        every = float(text)
    except ValueError:
        every = math.nan
    if not math.isfinite(every) or every <= 0:
        raise ValueError(f"{text[:40]!r} cannot be read: give seconds above 0, such as 2, or off")
    return every


def every_s_from_env() -> float | None:
    """``$COMMSCOPE_KEYFRAME_S`` (``parse_every``; None: none written, no keeper started);
    ``EVERY_S`` where unset, and where it cannot be read (said once: ``abc``, ``-1``, ``inf``)."""
    text = os.environ.get(ENV_EVERY, "").strip()
    if not text:
        return EVERY_S
    try:
        return parse_every(text)
    except ValueError as exc:
        warnings.warn(f"commscope: ${ENV_EVERY}: {exc}: a keyframe every {EVERY_S:g} s", RuntimeWarning,
                      stacklevel=2)
        return EVERY_S


def step(f: _Followed, directory: Path, now: float, final: bool = False, every_s: float = EVERY_S) -> bool:
    """Replay what the followed segment grew by and keep a keyframe there; append the one
    kept before once the segment holds ``MIN_BYTES`` past it.  ``final``: the writer moved on
    (the segment is complete): replayed to its end, no keyframe kept.  False where the
    segment cannot be followed any more (gone, smaller than replayed, another file under its
    name, no count of its lines)."""
    if f.before is None:  # (its closer's carry of the segment before: there once it ran)
        f.before = inflight.carried(directory, f.stream, f.number - 1)
        if f.before is None:
            return True  # (looked at again next time)
    try:
        size = os.stat(f.path).st_size
    except OSError:
        return False
    if size < f.offset:
        return False
    publish = f.pending is not None and size >= f.pending.offset + MIN_BYTES
    due = final or (now >= f.due and size - f.offset >= MIN_BYTES and (f.pending is None or publish))
    if not due and not publish:
        return True
    # (the bytes before where it goes on read again: another file under its name, written
    # again after its store lost what it held, differs there; not its inode: a file deleted
    # and made again at once often gets the same one back)
    back = len(f.tail)
    want = (size - f.offset if final else min(size - f.offset, READ_BYTES)) if due else 0
    try:
        data = read_from(f.path, f.offset - back, back + want)
        if due and data.find(b"\n", back) < 0 and want < size - f.offset:  # (a line longer than a step's read)
            data = read_from(f.path, f.offset - back, back + size - f.offset)
    except OSError:
        return False
    if data[:back] != f.tail:
        return False
    _publish(f, directory, size)
    if not due:
        return True
    if not _advance(f, data[back:]):
        return False
    f.due = now + every_s
    if not final and f.offset < size:  # (not read to its end: the rest first, next step)
        f.due = now
    elif not final:
        f.pending = f.keyframe()
    return True


def _publish(f: _Followed, directory: Path, size: int) -> None:
    """Append the keyframe kept (``pending``) once the segment (``size`` bytes) holds
    ``MIN_BYTES`` past it."""
    if f.pending is not None and size >= f.pending.offset + MIN_BYTES:
        append(directory, f.stream, f.number, f.pending, f.path)
        f.pending = None


def _advance(f: _Followed, data: bytes) -> bool:
    """Replay ``data`` (the segment's bytes from ``f.offset``; an incomplete last line left
    for later) onto what the rank is in.  False where its lines cannot be counted: a file
    its writer started again after a loss (a window skipping its marker would not count
    it), a segment whose meta does not say the lines before it (a writer from before)."""
    cut = data.rfind(b"\n") + 1
    if not cut:
        return True
    if f.offset == 0 and inflight.starts_again(data):
        return False
    if f.lines_before is None:  # (the segment's meta says, at its start)
        f.lines_before = lines_before(data) if f.offset == 0 else None
        if f.lines_before is None:
            return False
    assert f.before is not None
    replayed = inflight.replay(f.before, data[:cut], f.stream[0])
    f.before, f.carry = replayed.carry(with_meta=True), replayed.carry()
    f.tail = (f.tail + data[:cut])[-SAME_FILE_BYTES:]
    f.offset += cut
    f.lines += data.count(b"\n", 0, cut)
    f.last_ns = max(f.last_ns, newest_ns(data[:cut]))
    return True


def write_along(directory: Path, stream: Stream, every_s: float = EVERY_S) -> None:
    """Write the keyframes of a stream's segments as a keeper that followed it from its start
    would have, every ``every_s`` of the lines' own time rather than the keeper's (a
    synthetic job of days, written in seconds: ``bench/synthstore.py``)."""
    before: bytes | None = b""
    for seg in list_segments(directory).get(stream, []):
        f = _Followed(stream, seg.number, seg.path)
        f.before = before
        try:
            data = read_from(seg.path, 0, sys.maxsize)
        except OSError:
            return
        at = 0
        next_ns = None
        for line_end in _line_ends(data):
            ts = newest_ns(data[at:line_end])
            if next_ns is None:
                next_ns = ts + int(every_s * 1e9)
            if ts >= next_ns and line_end - f.offset >= MIN_BYTES:
                _publish(f, directory, line_end)
                if not _advance(f, data[f.offset:line_end]):
                    return
                f.pending = f.keyframe()
                next_ns = ts + int(every_s * 1e9)
            at = line_end
        _publish(f, directory, len(data))
        if not _advance(f, data[f.offset:]):
            return
        before = f.before


def _line_ends(data: bytes) -> list[int]:
    return (np.flatnonzero(np.frombuffer(data, np.uint8) == 10) + 1).tolist()


def append(directory: Path, stream: Stream, number: int, k: Keyframe, segment: Path) -> None:
    """Append a keyframe to its segment's file (made with the segment's mode), in one write."""
    path = keys_path(directory, stream, number)
    try:
        fd = create_file(path, os.O_WRONLY | os.O_APPEND | O_NOFOLLOW, mode_of(segment))
    except OSError:
        return
    try:
        os.write(fd, record(k))
    except OSError:
        pass
    finally:
        os.close(fd)


def keep(directory: Path, commands: BinaryIO, every_s: float = EVERY_S,
         now: Callable[[], float] = time.monotonic) -> int:
    """The keeper's loop: follow the segments the writers name on ``commands`` (a binary
    stream of lines ``RANK INCARNATION NUMBER NAME``: a stream's newest segment), a step of
    each every half ``every_s``, until ``commands`` ends (every writer of the process gone)."""
    followed: dict[Stream, _Followed] = {}
    sent = children.Commands(commands)
    idle = children.Idle(now)
    while True:
        lines = sent.wait(every_s / 2)
        if lines is None or not lines and idle.over():  # (a command come meanwhile is taken first)
            return 0
        ended = False
        for line in lines:
            gone = children.ended(line)
            if gone is not None:  # (its writer closed: the process's next may name another)
                ended = followed.pop(gone, None) is not None or ended
                continue
            named = _named(line)
            if named is None:
                continue
            stream, number, name = named
            old = followed.get(stream)
            if old is not None and old.number == number:
                continue
            new = _Followed(stream, number, directory / name)
            if old is not None and old.number == number - 1 and step(old, directory, now(), final=True, every_s=every_s):
                new.before = old.before  # (its end replayed here: no wait for its closer)
            followed[stream] = new
        idle.note(len(followed), ended)
        t = now()
        for stream, f in list(followed.items()):
            if not step(f, directory, t, every_s=every_s):
                del followed[stream]


def _named(line: bytes) -> tuple[Stream, int, str] | None:
    """A writer's command line, read as ``follow`` writes it; None for anything else."""
    try:
        rank, inc, number, name = line.decode().split()
        parsed = parse_segment(name)
    except ValueError:
        return None
    if parsed is None or parsed[0] != (int(rank), int(inc)) or parsed[1] != int(number):
        return None
    return parsed[0], parsed[1], name


def keeper(directory: Path, every_s: float) -> children.Keeper:
    """The writing process's keeper of ``directory``'s keyframes (``keep`` in a child)."""
    return children.Keeper.of("commscope.store.keyframes", str(directory), repr(every_s))


def follow(keeper: children.Keeper, stream: Stream, number: int, name: str) -> None:
    """Keyframes for ``stream`` from its segment ``number`` (``name``) on."""
    keeper.follow(stream, f"{stream[0]} {stream[1]} {number} {name}\n".encode())


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m commscope.store.keyframes JOB_DIR EVERY_S (segments named on stdin)", file=sys.stderr)
        return 2
    with contextlib.suppress(KeyboardInterrupt, BrokenPipeError):
        return keep(Path(argv[0]), sys.stdin.buffer, float(argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
