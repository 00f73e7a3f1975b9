"""Marks: where a reader may start a rank's Redis stream, and what the rank was in there.

A Redis stream has no segments to start a window at (``--since``), and its entry ids are
the writer's own counters, not times.  So while a rank writes, a child process (never the
training process: ``spawn``) adds a *mark* to a small stream beside the rank's own, every
``MARK_EVERY_S`` of the rank's time or ``MARK_BYTES`` written::

    commscope:{J/S}:marks:N     entry id <ms>-<K>: after entry K of rank N's stream, whose
                                newest event is from <ms>; fields k (K), b (bytes of entries
                                1..K), x (1: inexact, see below), c (the carry)

The carry is what the rank was in after entry K (``store/inflight.py``): its meta, its
groups, its drops so far, the last ops it completed and that raised
(``Replayed.carried_out``) and the phases so far of every op still in flight, as JSON event
lines, found by replaying the previous mark's carry and the entries after it.  A
reader of a window starts each stream after the newest mark at or before the window's start
and reads its carry first, so the state there is exact: a rank that has waited in an
all_reduce for an hour is still in it, and a rank that went silent before the window (its
newest mark is older) is read from its newest mark, still dead.  A stream whose marks all
come after the window's start (or that has none) is read from its start.

A chain needs every entry after the previous mark: when ``maxlen`` trimmed some before a
mark was taken, the next mark starts again from the stream's first entry and says it is
inexact (``x``), and a reader starting at it says what it may miss.  The marks stream keeps
its newest ``MARKS_KEPT`` marks (a week at the default pace).

Five minutes of a rank is a lot to read again: a console past its memory budget starts again
at the tail, reading a window of seconds at a large job's rate, and a stream starting at its
last mark made it read up to five minutes of every rank.  So the writing process's keeper
(``store/redis_keeper.py``, one child a process and job; the directory store's keeper of
keyframes, ``store/keyframes.py``, does the same for segments) also takes *keyframes*
(``frame``): marks, in ``commscope:{J/S}:frames:N``, every ``keyframes.EVERY_S`` that the
stream grew by ``keyframes.MIN_BYTES`` (``$COMMSCOPE_KEYFRAME_S``; ``off``: none), the newest
``FRAMES_KEPT`` of them kept.  Each chains on the one before, kept by the keeper; its chain
starts (and starts again, where Redis lost the entry it would go on after: ``Gone``) at the
newer of the stream's newest keyframe and mark.  A reader starts a stream at the newer of
the two that precedes its window.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from typing import NamedTuple

import orjson

from commscope.store import inflight, keyframes
from commscope.store.base import Stream, is_store_lost
from commscope.store.cluster import Nodes
from commscope.store.redis_keys import Keys, entry_number
from commscope.store.redis_url import parse_url
from commscope.store.resp import Connection, pack
from commscope.store.segments import TS_FIELD

#: How often a mark is taken, in the rank's own time, and after how many bytes written
MARK_EVERY_S = 300.0
MARK_BYTES = 16 << 20
#: Marks kept per stream (``XADD MAXLEN ~``): a week of marks five minutes apart
MARKS_KEPT = 2048
#: Keyframes kept per stream: at one every 2 s, ~17 minutes of a rank (``attach``'s first
#: window, the last 10 minutes, starts at one); a window further back starts at a mark
FRAMES_KEPT = 512
#: Entries and bytes one mark reads at most: a writer far ahead is marked in steps, the
#: child's memory bounded
MAX_ENTRIES = 200_000
MAX_READ = 4 * MARK_BYTES
PAGE = 10_000
_ID = re.compile(rb"(\d{1,18})-(\d{1,18})")  # a mark's id: <ms>-<K>
_NUMBER = re.compile(rb"\d{1,18}")


class Mark(NamedTuple):
    """One mark as a reader uses it (module docstring)."""

    entry: int  # K: the stream's entries 1..K come before it
    ms: int  # the time of its newest event (ms)
    bytes: int  # bytes of the entries 1..K
    exact: bool  # False: entries were trimmed before the chain reached them
    carry: bytes  # ended JSON lines

    @classmethod
    def parse(cls, entry: list) -> Mark | None:
        """A mark from an XRANGE reply's entry ``[id, [field, value, ...]]``; None when it is
        not one commscope wrote (readers trust nothing: a mark is data like any other)."""
        try:
            eid, flat = entry
            fields = dict(zip(flat[::2], flat[1::2], strict=True))
            m = _ID.fullmatch(eid)
            k, size, carry = fields[b"k"], fields[b"b"], fields[b"c"]
            if (m is None or k != m.group(2) or not _NUMBER.fullmatch(size) or not isinstance(carry, bytes)
                    or len(carry) > inflight.MAX_CARRY):
                return None
            return cls(int(k), int(m.group(1)), int(size), fields.get(b"x") != b"1", carry)
        except (ValueError, TypeError, KeyError):
            return None


def entry_ns(value: bytes) -> int:
    """The time (ns) of a stream entry: its event's ``ts`` (a block's: when it was
    written); 0 when it has none."""
    m = TS_FIELD.search(value[:256])
    return int(m.group(1)) if m else 0


def newest(nodes: Nodes, key: bytes | str) -> Mark | None:
    """The newest mark of ``key`` (a marks stream)."""
    reply = nodes.call(key, "XREVRANGE", key, "+", "-", "COUNT", 1)
    return Mark.parse(reply[0]) if reply else None


def starting(reply: object, top: int) -> Mark | None:
    """Where a window starts a stream whose top entry is ``top``: of ``reply`` (``XREVRANGE
    marks <ms> - COUNT 2``: the newest marks at or before the window's start), the newest
    with entries after it.  A mark on the top (the rank's last write was marked) would leave
    nothing after it, so the rank's end (its exit, its last heartbeat) is read from the one
    before, as a directory store reads a stream's newest segment whatever the window."""
    if not isinstance(reply, list):
        return None
    for entry in reply:
        mark = Mark.parse(entry)
        if mark is not None and mark.entry < top:
            return mark
    return None


def _keep_state(carry: bytes) -> bytes:
    """Of a carry, what a broken chain still knows: the rank's meta and its groups (the ops
    in flight are not known past the entries trimmed)."""
    kept = []
    for line in carry.splitlines(keepends=True):
        try:
            ev = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(ev, dict) and ev.get("type") in ("meta", "group"):
            kept.append(line)
    return b"".join(kept)


def take(nodes: Nodes, stream: bytes, marks: bytes, rank: int) -> Mark | None:
    """Add the next mark of ``stream`` (rank ``rank``'s) to ``marks``: replay the newest mark's
    carry and the entries after it.  None when there is nothing new to mark."""
    last = newest(nodes, marks)
    mark = following(nodes, stream, last, rank)
    if mark is not None:
        add(nodes, marks, stream, mark, MARKS_KEPT)
    return mark


class Gone(Exception):
    """The entry a chain would go on after is no longer in its stream (Redis lost the tail
    it was in: a failover to a replica behind, a restart from an older save)."""


def following(nodes: Nodes, stream: bytes, last: Mark | None, rank: int, least: int = 1,
              max_read: int = MAX_READ, check: bool = False) -> Mark | None:
    """The mark after ``last`` (None: the stream's start): its carry replayed with the entries
    of ``stream`` after it, ``max_read`` bytes of them at most.  None where they are fewer than
    ``least`` bytes (or none).  ``check``: ``last`` was kept, not read from the store just now:
    its own entry is read too, and Gone raised where the stream no longer holds it."""
    after = last.entry if last is not None else 0
    check = check and after > 0
    values: list[bytes] = []
    first = top = -1
    size = 0
    while len(values) < MAX_ENTRIES and size < max_read:
        lo = (after if check else after + 1) if first < 0 else top + 1
        got = nodes.run(stream, pack("XRANGE", stream, b"0-%d" % lo, "+", "COUNT",
                                     min(PAGE, MAX_ENTRIES - len(values))), Connection.read_entries)
        paged = len(got)  # (a page as asked: a full one may have more after it)
        if first < 0 and check:
            if not got or entry_number(got[0][0]) != after:
                raise Gone(f"entry {after} of {stream!r}")
            got = got[1:]
        if not got:
            break
        if first < 0:
            first = entry_number(got[0][0])
        top = entry_number(got[-1][0])
        values.extend(v or b"" for _, v in got)
        size += sum(len(v or b"") for _, v in got)
        if paged < PAGE:
            break
    if not values or top <= after or size < least:
        return None
    # A gap after ``last``: entries trimmed before this mark reached them (start again from
    # the first one left, what the rank was in not known: inexact), or lost by Redis after
    # ``last``, whose entry it still holds (``check``: trimming takes the oldest first) or
    # whose writer stated the loss (its marker first, then what the lost entries had begun):
    # what ``last`` says still holds, exact where the writer stated it.
    gap = first != after + 1
    stated = gap and is_store_lost(values[0])
    whole = (last is None or last.exact) and (not gap or stated)
    if last is None:
        before = b""
    else:
        before = last.carry if not gap or stated or check else _keep_state(last.carry)
    carry = inflight.replay(before, b"\n".join(values) + b"\n", rank).carry(with_meta=True)
    # (rounded up: every entry up to the mark is from at or before its ms)
    ms = max(-(-max(map(entry_ns, values)) // 1_000_000), last.ms if last is not None else 0)
    size += last.bytes if last is not None else 0
    return Mark(top, ms, size, whole, carry)


def add(nodes: Nodes, key: bytes, stream: bytes, mark: Mark, kept: int) -> None:
    """Append ``mark`` to ``key`` (``stream``'s marks) keeping about ``kept``, where the stream
    is still there (``ADD_MARK``)."""
    nodes.call(key, "EVAL", ADD_MARK, 2, key, stream, kept, *_fields(mark))


def _fields(mark: Mark) -> tuple:
    return (f"{mark.ms}-{mark.entry}", "k", mark.entry, "b", mark.bytes, "x", 0 if mark.exact else 1, "c", mark.carry)


#: A mark or keyframe appended only while its stream is there (a job deleted meanwhile:
#: ``delete_job`` between a marker's or keeper's read and its append would leave a key of it
#: no one deletes; a mark child did, under load); both keys in one slot
ADD_MARK = ("if redis.call('EXISTS', KEYS[2]) == 0 then return 0 end "
            "redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[1], unpack(ARGV, 2)) return 1")


def add_frame(nodes: Nodes, f: Framed, mark: Mark) -> None:
    """Append keyframe ``mark`` of ``f``'s stream, the newest ``FRAMES_KEPT`` kept, where the
    stream is still there (``ADD_MARK``)."""
    nodes.call(f.frames, "EVAL", ADD_MARK, 2, f.frames, f.key, FRAMES_KEPT, *_fields(mark))


class Framed:
    """A stream as the keeper of keyframes follows it."""

    __slots__ = ("key", "frames", "marks", "rank", "last", "due", "known")

    def __init__(self, job: str, stream: Stream) -> None:
        self.key = Keys.stream(job, *stream).encode()
        self.frames = Keys.frames(job, *stream).encode()
        self.marks = Keys.marks(job, *stream).encode()
        self.rank = stream[0]
        self.last: Mark | None = None  # the newest keyframe (or mark) of the stream, its chain's start
        self.known = False  # (``last`` read from the store: once, at the keeper's start)
        self.due = 0.0  # (monotonic) no keyframe before then


def frame(nodes: Nodes, f: Framed, max_read: int = keyframes.READ_BYTES) -> None:
    """The next keyframe of a followed stream, where it grew by ``keyframes.MIN_BYTES`` since
    the last (``max_read`` bytes of it read at most: a keeper behind catches up in steps):
    its chain starts at the newest keyframe or mark the store holds (the newer), read once,
    and again where the keyframe kept here is gone from the stream (``Gone``)."""
    fresh = not f.known
    if fresh:
        f.last, f.known = _start(nodes, f), True
    try:
        got = following(nodes, f.key, f.last, f.rank, keyframes.MIN_BYTES, max_read, check=not fresh)
    except Gone:
        f.last = _start(nodes, f)
        got = following(nodes, f.key, f.last, f.rank, keyframes.MIN_BYTES, max_read)
    if got is not None:
        add_frame(nodes, f, got)
        f.last = got


def _start(nodes: Nodes, f: Framed) -> Mark | None:
    """Where ``f``'s chain starts: the newer of its stream's newest keyframe and mark."""
    marks = [m for m in (newest(nodes, f.frames), newest(nodes, f.marks)) if m is not None]
    return max(marks, key=lambda m: m.entry, default=None)


def mark(url: str, job: str, rank: int, incarnation: int = 0, known: Sequence[tuple[str, int]] = ()) -> Mark | None:
    """Take the next mark of one rank's stream (what ``spawn``'s child does).  ``known``: the
    cluster's nodes the writer knows, asked when the URL's is down or left the cluster."""
    target = parse_url(url)
    nodes = Nodes(target, target.display())
    nodes.know(known)
    nodes.connect()
    try:
        return take(nodes, Keys.stream(job, rank, incarnation).encode(), Keys.marks(job, rank, incarnation).encode(),
                    rank)
    finally:
        nodes.close()


def spawn(url: str, job: str, rank: int, incarnation: int,
          known: Sequence[tuple[str, int]] = ()) -> subprocess.Popen | None:
    """Run ``mark`` in a child process at the lowest priority; the URL (it may hold a
    password) goes on its standard input, never on a command line others can list, and on
    the next line the cluster nodes the writer knows (``host:port`` ...: the URL's node may be
    down, or have left the cluster, since the writer opened).  None when it cannot be started."""
    cmd = [sys.executable, "-m", "commscope.store.redis_marks", job, str(rank), str(incarnation)]
    nice = shutil.which("nice")
    if nice:
        cmd = [nice, "-n", "19", *cmd]
    try:
        child = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                 close_fds=True, start_new_session=True)
    except OSError:
        return None
    try:
        nodes = " ".join(f"{h}:{p}" for h, p in known[:64])
        child.stdin.write(f"{url}\n{nodes}".encode())  # (a few KB at most: never blocks on the pipe)
        child.stdin.close()
    except OSError:
        pass
    return child


def address(word: str) -> tuple[str, int] | None:
    """A node as a writer tells it (``host:port``); None for anything else."""
    host, _, port = word.rpartition(":")
    return (host, int(port)) if host and port.isdigit() else None


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: python -m commscope.store.redis_marks JOB RANK INCARNATION  (the store URL on standard input)",
              file=sys.stderr)
        return 2
    url, _, rest = sys.stdin.read().strip().partition("\n")
    known = [a for a in map(address, rest.split()) if a]
    try:
        mark(url.strip(), argv[0], int(argv[1]), int(argv[2]), known)
    except Exception as exc:  # a mark not taken now is taken by the next child
        print(f"commscope: no mark taken: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
