"""The ops in flight at the end of a segment, carried to whoever starts reading after it.

A reader that starts a rank's stream at a later segment (``--since``, or after retention
deleted the older ones) would not see the begin of an op the rank entered before and is
still in: the all_reduce a hung rank has waited in for an hour.  So when a writer closes a
segment, a child process (the one that enforces retention, ``store/retention.py``) writes
``rank-00003.open.000004.jsonl``: the groups the stream described (their members), the
last op it completed in each group and in the p2p channels it used last, the last ops that
raised, the recorder's drops so far, and the phases so far of every op still in flight at
the segment's end (``Replayed.carried_out``),
as JSON events, found by replaying the previous segment's carry and this segment
(``replay``: an op is done when the model would judge it done).  A
reader starting at segment 5 reads segment 4's carry first: the rank's state at the window's
start is exact, not guessed.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NamedTuple

import orjson

from commscope.events import running_drops
from commscope.oprecords import completes
from commscope.store.base import STORE_LOST, Stream, is_recorder_drop
from commscope.store.files import atomic_write, mode_of, read_from, read_regular
from commscope.store.segments import Segment, stream_prefix


def carry_path(directory: Path, stream: Stream, number: int) -> Path:
    """Where the ops in flight at the end of segment ``number`` of ``stream`` go
    (``rank-00003.open.000004.jsonl``: kept while the next segment exists, even once retention
    deleted this one)."""
    return directory / f"{stream_prefix(*stream)}.open.{number:06d}.jsonl"


#: A carry holds the ops in flight of one rank: far less than this, or it is not one
MAX_CARRY = 64 << 20
#: The ops that raised a carry keeps (the latest): what ``op_failed`` judges by
FAILED_KEPT = 4
#: The p2p channels whose last op done a carry keeps (those used last)
DONE_KEPT = 8


def carried(directory: Path, stream: Stream, number: int) -> bytes | None:
    """The carry of segment ``number``, its lines as stored, each ended (None: it has none, or
    what is there is not one: not a regular file, or larger than any carry)."""
    try:
        data = read_regular(carry_path(directory, stream, number), MAX_CARRY)
    except OSError:
        return None
    return data if data.endswith(b"\n") or not data else data + b"\n"


def read_segment(path: Path) -> bytes:
    """All of a closed segment (OSError: gone, or not a regular file)."""
    return read_from(path, 0, sys.maxsize)


class Losses(NamedTuple):
    """What a run of a stream's lines lost: damaged lines, invalid events by reason, and the
    lines a writer's ``store_lost`` markers among them say the store lost (``entries``),
    with the first one's reason."""

    damaged: int
    invalid: dict[str, int]
    entries: int
    reason: str


class Replayed(NamedTuple):
    """A stream's ops as a run of its lines says (``replay``): each op's phases, when it was
    done (0: not done), whether one raised, and the groups described."""

    begins: dict[int, dict]
    phases: dict[int, list[dict]]
    done: dict[int, int]
    failed: set[int]
    groups: dict[str, dict]
    events: int  # the valid events of the lines after the carry (a block's records each one)
    meta: dict | None  # the rank's last ``meta`` among them
    dropped: dict | None = None  # the recorder's drops so far, as one ``dropped`` event (``_dropped``)
    #: What the lines after the carry lost, as a reader of them would count it (a summary
    #: keeps it: ``retention.summarize``)
    losses: Losses | None = None

    def carry(self, with_meta: bool = False) -> bytes:
        """What a reader starting after these lines reads first, as ended lines: (the rank's
        meta,) the groups, the recorder's drops so far, and the phases of the ops carried on
        (``carried_out``)."""
        lines = [orjson.dumps(self.meta)] if with_meta and self.meta is not None else []
        lines += [orjson.dumps(g) for g in self.groups.values()]
        if self.dropped is not None:
            lines.append(orjson.dumps(self.dropped))
        for op_id in self.carried_out():
            lines.extend(orjson.dumps(e) for e in self.phases[op_id])
        return b"".join(x + b"\n" for x in lines)

    def carried_out(self) -> list[int]:
        """The ops a carry takes on past the lines' end, in their order: those in flight
        there; the last one done of each group's collectives (a group's line is carried
        anyway) and of the ``DONE_KEPT`` p2p channels (group, peer, direction) used last, so
        a reader starting after it knows what the rank entered (the root of a broadcast that
        returned while the others still wait in it is no rank that "never entered"; the last
        of them all is what the rank last completed); and the last ``FAILED_KEPT`` ops that
        raised (an op that failed an hour before the window is still an ``op_failed``).
        Bounded by the groups and those few: a carry is read by every window, and kept in
        every Redis mark (a rank that sent to 16k peers carried 9 MB)."""
        done, begins = self.done, self.begins
        last: dict[tuple, int] = {}  # (group, peer, direction) -> the op done last there
        for i, t in done.items():
            b = begins[i]
            if b.get("nested"):
                continue
            key = (b.get("group"), b.get("peer"), b.get("dir"))
            j = last.get(key)
            if j is None or (done[j], j) < (t, i):
                last[key] = i
        collective = [i for key, i in last.items() if key[1] is None and key[2] is None]
        channels = [i for key, i in last.items() if key[1] is not None or key[2] is not None]
        keep = {*collective, *sorted(channels, key=lambda i: (done[i], i))[-DONE_KEPT:]}
        keep.update(sorted(self.failed, key=lambda i: (done.get(i, 0), i))[-FAILED_KEPT:])
        return [i for i in begins if i in keep or i not in done]


def replay(before: bytes, data: bytes, rank: int) -> Replayed:
    """Replay a carry (``before``: ended lines) and the lines of the segment after it (an
    incomplete last line is left out).  An op is done as the model judges it: a sync op at
    its end, an async one at the end of its wait (or an end that raised), one timed on the
    device when the device says so; a nested op no later than its parent."""
    from commscope.blocks import BlockDecoder, decode_stream
    from commscope.events import decode_lines, gc_paused

    data = data[: data.rfind(b"\n") + 1]
    decoder = BlockDecoder(rank)
    with gc_paused():  # (the carry apart: what it lost, if damaged, is not the segment's)
        head = decode_stream(decode_lines(before, rank), decoder, columns=False)
        got = decode_stream(decode_lines(data, rank), decoder, columns=False)
    lost = [e for e in got.events if e["type"] == "dropped" and str(e.get("reason", "")).startswith(STORE_LOST)]
    losses = Losses(got.damaged, dict(got.invalid), sum(int(e.get("entries") or 0) for e in lost),
                    str(lost[0]["reason"])[len(STORE_LOST) + 2:] if lost else "")
    out = Replayed({}, {}, {}, set(), {}, got.count(), None)
    meta = dropped = None
    for e in head.events + got.events:
        typ = e.get("type")
        if typ == "meta":
            meta = e
        elif typ == "group":
            out.groups[str(e.get("group"))] = e
        elif typ == "dropped":
            dropped = _dropped(dropped, e)
        if typ != "op":
            continue
        op_id, ph = e["id"], e["phase"]
        if ph == "begin":
            out.begins[op_id] = e
            out.phases[op_id] = [e]
            continue
        b = out.begins.get(op_id)
        if b is None:
            continue
        out.phases[op_id].append(e)
        if "exc" in e:
            out.failed.add(op_id)
        if completes(ph, failed="exc" in e, is_async=bool(b.get("async")), device=b.get("device") is not None):
            out.done.setdefault(op_id, e["ts"])
    for op_id, b in out.begins.items():  # nested ops end no later than their parent
        parent = b.get("parent")
        if b.get("nested") and op_id not in out.done and (parent not in out.begins or parent in out.done):
            out.done[op_id] = out.done.get(parent, b["ts"])
    return out._replace(meta=meta, dropped=dropped, losses=losses)


def _dropped(so_far: dict | None, e: dict) -> dict | None:
    """The recorder's drops so far (``so_far``: as one ``dropped`` event, None: none) with
    ``e`` counted: its ``total`` says them all, its ``count`` is 0 (``as_read`` makes it what
    a reader counts).  Ring overwrites of Flight Recorder (no lost events) and a writer's
    ``store_lost`` markers (what the store lost: the reader counts those where it reads
    them) are left out."""
    if not is_recorder_drop(e):
        return so_far
    total = running_drops(so_far["total"] if so_far is not None else 0, e)
    return {"type": "dropped", "v": e["v"], "rank": e["rank"], "ts": e["ts"], "count": 0, "total": total,
            "reason": str(e.get("reason", ""))}


def open_at_end(seg: Segment, before: bytes, rank: int) -> bytes:
    """The carry of ``seg`` given the one of the segment before (``before``), as ended lines
    (``Replayed.carry``)."""
    return replay(before, read_segment(seg.path), rank).carry()


def write_carries(directory: Path, stream: Stream, segs: list[Segment], names: set[str]) -> None:
    """Write the carry of each closed one of a stream's segments (``segs``, oldest first) that
    has none (``names``: the files of ``directory``), oldest first: each starts from the one
    before.  A segment whose predecessor has no carry (deleted before one was written) stops
    it: readers starting after it say that what was in flight there is unknown."""
    last: tuple[int, bytes] | None = None  # the carry this call wrote last (not read back)
    for seg in segs[:-1]:  # (the newest is being written)
        path = carry_path(directory, stream, seg.number)
        if path.name in names:
            continue
        if seg.number == 0:
            before: bytes | None = b""
        elif last is not None and last[0] == seg.number - 1:
            before = last[1]
        else:
            before = carried(directory, stream, seg.number - 1)
        if before is None:
            break
        try:
            data = open_at_end(seg, before, stream[0])
        except OSError:
            break
        atomic_write(path, data, mode_of(seg.path))
        last = (seg.number, data)


def as_read(events: list[dict], read: int) -> list[dict]:
    """A carry's events as a reader takes them in: its ``dropped`` line (``_dropped``) says
    the stream's drops so far, of which the reader read ``read`` (``TraceReader.drops_read``:
    none, unless it read some of the stream and jumped over segments retention deleted), so
    it counts the rest: none twice, none missed, and each incarnation's of the rank adding
    to the others' (the model adds a ``dropped`` event's ``count``, and takes its ``total``
    as the least the rank dropped: a running total of one incarnation is not that)."""
    return [{k: v for k, v in e.items() if k != "total"} | {"count": max(0, e["total"] - read)}
            if e["type"] == "dropped" and e.get("count") == 0 and "total" in e else e for e in events]
