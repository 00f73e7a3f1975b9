"""The ops in flight at the end of a segment, carried to whoever starts reading after it.

A reader that starts a rank's stream at a later segment (``--since``, or after retention
deleted the older ones) would not see the begin of an op the rank entered before and is
still in: the all_reduce a hung rank has waited in for an hour.  So when a writer closes a
segment, a child process (the one that enforces retention, ``store/retention.py``) writes
``rank-00003.open.000004.jsonl``: the groups the stream described (their members, and the
rank's history of each one's collectives as one digest, ``histories``), the
last op it completed in each group and in the p2p channels it used last (of those before,
the seq done last), each group's
first op that raised and the last ones, the recorder's drops so far, the phases so far of
every op still in flight at the segment's end (``Replayed.carried_out``), the stacks
that say where the rank is (``Stacks``) and where its recorder's ring was (``RingEnd``),
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

from commscope import schema
from commscope.events import running_drops
from commscope.histories import COLLECTIVE, P2P, History, extended, key_hash, kind_of, match_key_of, withdrawn
from commscope.oprecords import completes
from commscope.store.base import STORE_LOST, Stream, is_recorder_drop, is_store_lost, said_by_store
from commscope.store.files import atomic_write, mode_of, read_from, read_regular
from commscope.store.segments import Segment, stream_prefix


def carry_path(directory: Path, stream: Stream, number: int) -> Path:
    """Where the ops in flight at the end of segment ``number`` of ``stream`` go
    (``rank-00003.open.000004.jsonl``: kept while the next segment exists, even once retention
    deleted this one)."""
    return directory / f"{stream_prefix(*stream)}.open.{number:06d}.jsonl"


def partial_path(directory: Path, stream: Stream, number: int) -> Path:
    """Where the closer puts the carry of segment ``number`` replayed past a gap (a segment
    before it deleted by hand or lost before its carry was written): what began after the
    gap, not what the rank was in before it.  Apart from ``carry_path``, so a reader never
    takes it for a whole carry (it still warns that what the rank was in is not known);
    retention takes it as carried, so a stream with a gap is still bounded."""
    return directory / f"{stream_prefix(*stream)}.open.{number:06d}.partial.jsonl"


#: What ``starts_again`` is given of a segment: its first line, a ``store_lost`` marker, at least
HEAD_BYTES = 4096
#: A carry holds the ops in flight of one rank: far less than this, or it is not one
MAX_CARRY = 64 << 20
#: The ops that raised a carry keeps (the latest): what ``op_failed`` judges by
FAILED_KEPT = 4
#: The p2p channels whose last op done a carry keeps (those used last)
DONE_KEPT = 8
#: The p2p channels past those whose last seq done a carry states (``channels_passed``):
#: ~30 bytes each, where an op is ~500 (a Redis stream keeps a carry in each of its marks)
CHANNELS_PASSED = 256


#: What an op's begin says that its match key is made of (``histories.match_key_of``)
_KEY_FIELDS = ("op", "in_shapes", "out_shapes", "in_dtypes", "out_dtypes", "redop", "root")
#: The keys a carry adds to a group's line: its history (``histories.History.fields``) and
#: its channels passed (``Replayed.channels_passed``)
CARRIED_KEYS = frozenset([*History(0, 0, 0).fields(), "channels"])


def group_of(begin: dict) -> str:
    """An op's group, by name, as the model names it (an op without one: "?")."""
    group = begin.get("group")
    return str(group) if group is not None else "?"


def carried(directory: Path, stream: Stream, number: int, partial: bool = False) -> bytes | None:
    """The carry of segment ``number``, its lines as stored, each ended (None: it has none, or
    what is there is not one: not a regular file, or larger than any carry).  ``partial``:
    the one replayed past a gap (``partial_path``) instead."""
    try:
        data = read_regular((partial_path if partial else carry_path)(directory, stream, number), MAX_CARRY)
    except OSError:
        return None
    return data if data.endswith(b"\n") or not data else data + b"\n"


def whole(data: bytes) -> bool:
    """Whether a carry is as its closer wrote it (at once, ``atomic_write``): every line
    ended and an event.  One cut to 100 bytes was taken as read: its rank had lost its meta
    and ops, was "idle (no ops yet)", and a window blamed it, a rank only waiting, and lost
    the mismatch (helper-187); a damaged one is made again as a missing one is."""
    if not data:
        return True
    # (each line an object, told by its ends: the reader decodes it next, and 16k ranks' carries
    # decoded twice cost a window's read)
    return data.endswith(b"\n") and all(line.startswith(b"{") and line.rstrip().endswith(b"}")
                                         for line in data.splitlines() if line.strip())


def read_segment(path: Path) -> bytes:
    """All of a closed segment (OSError: gone, or not a regular file)."""
    return read_from(path, 0, sys.maxsize)


class Losses(NamedTuple):
    """What a run of a stream's lines lost: damaged lines, invalid events by reason, the
    lines a writer's ``store_lost`` markers among them say the store lost (``entries``),
    with the first one's reason, and the gaps in its blocks' ring positions that no line
    counted otherwise stands for (bytes each: lines gone from the file)."""

    damaged: int
    invalid: dict[str, int]
    entries: int
    reason: str
    gaps: tuple[int, ...] = ()


class RingEnd(NamedTuple):
    """Where a rank's recorder ring was at the end of a run of its stream's lines: the
    position its blocks reached, and the time of the run's last event."""

    rank: int
    position: int
    ts: int


class Stacks:
    """The stacks a rank captured, as a run of its lines says: each op's latest, the latest
    of all, and the latest a stack request asked for (what ``findings.rank_stack`` shows:
    where the rank is now, where it is stuck, whether it answered a request)."""

    def __init__(self) -> None:
        self.of_op: dict[int, dict] = {}
        self.last: dict | None = None
        self.requested: dict | None = None

    def take(self, e: dict) -> None:
        if isinstance(e.get("id"), int):
            self.of_op[e["id"]] = e
        if self.last is None or e["ts"] >= self.last["ts"]:
            self.last = e
        if e.get("reason") == "request" and (self.requested is None or e["ts"] >= self.requested["ts"]):
            self.requested = e

    def carried(self, inflight: list[int]) -> list[dict]:
        """What a carry keeps, in time order: the stacks of the ops still in flight
        (``inflight``), the latest, the latest requested; a few, whatever the rank captured."""
        kept = [self.of_op[i] for i in inflight if i in self.of_op] + [self.last, self.requested]
        return sorted({id(e): e for e in kept if e is not None}.values(), key=lambda e: e["ts"])


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
    #: Per group, the rank's collectives of it so far as one digest (``histories``), carried
    #: on its group line
    histories: dict[str, History] | None = None
    #: The stacks the rank captured (``Stacks``)
    stacks: Stacks | None = None
    #: The channels the carry replayed said were passed: (group, peer, direction) -> the
    #: seq done last there and when (``channels_passed``)
    passed: dict[tuple[str, int, str], tuple[int, int]] | None = None
    #: The ops whose begin the carry replayed, not the lines after it (``retention.summarize``
    #: lists those it counts apart: a reader that read them before it jumped takes them out)
    carried_in: frozenset[int] = frozenset()
    #: Per op done, the phase event that completed it (none for a nested op done because its
    #: parent was)
    done_by: dict[int, dict] | None = None
    #: Where the ring was at the lines' end (None: not known, where no block said)
    ring_end: RingEnd | None = None

    def carry(self, with_meta: bool = False) -> bytes:
        """What a reader starting after these lines reads first, as ended lines: (the rank's
        meta,) the groups, the recorder's drops so far, the phases of the ops carried on
        (``carried_out``), the stacks that say where the rank is (``Stacks.carried``), and
        where the ring was (``ring_end``: a block of no records there, so a reader or summary
        starting at the next segment counts a gap before its first block, as a reader that
        read this one does)."""
        lines = [orjson.dumps(self.meta)] if with_meta and self.meta is not None else []
        kept = self.histories or {}
        last = self._last_done()  # (what both ``carried_out`` and ``channels_passed`` start from)
        passed = self.channels_passed(last)
        for name, g in self.groups.items():
            more = kept[name].fields() if name in kept else {}
            if name in passed:
                more["channels"] = passed[name]
            lines.append(orjson.dumps(schema.with_runs(g | more)))  # (a world of 16k ranks: ~20 bytes, not ~90 KB)
        if self.dropped is not None:
            lines.append(orjson.dumps(self.dropped))
        ops = self.carried_out(last)
        for op_id in ops:
            lines.extend(orjson.dumps(e) for e in self.phases[op_id])
        if self.stacks is not None:
            lines.extend(orjson.dumps(e) for e in self.stacks.carried([i for i in ops if i not in self.done]))
        if self.ring_end is not None:
            from commscope.blocks import encode_block

            rank, end, ts = self.ring_end
            lines.append(encode_block(b"", rank, ts, 0, pos=end, end=end))
        return b"".join(x + b"\n" for x in lines)

    def carried_out(self, last: tuple[dict[tuple, int], dict[tuple, int]] | None = None) -> list[int]:
        """The ops a carry takes on past the lines' end, in their order: those in flight
        there; the last one done of each group's collectives in each seq space (a group's
        line is carried anyway) and of the ``DONE_KEPT`` p2p channels (group, peer,
        direction; an any-source recv's peer is the source its end named) used last, so
        a reader starting after it knows what the rank entered (the root of a broadcast that
        returned while the others still wait in it is no rank that "never entered"; the last
        of them all is what the rank last completed); and each group's first op that raised
        and the last ``FAILED_KEPT`` (an op that failed an hour before the window is still an
        ``op_failed``, and the first is what its finding names).
        Bounded by the groups and those few: a carry is read by every window, and kept in
        every Redis mark (a rank that sent to 16k peers carried 9 MB).  ``last``: its
        ``_last_done``, where the caller made it."""
        done, begins = self.done, self.begins
        collective, channels = last if last is not None else self._last_done()
        keep = {*collective.values(), *self._kept_channels(channels)}
        raised = sorted(self.failed, key=lambda i: (done.get(i, 0), i))
        first: dict[tuple, int] = {}  # (space, group) -> its first op that raised
        for i in raised:
            first.setdefault((begins[i].get("src") == "fr", group_of(begins[i])), i)
        keep.update(raised[-FAILED_KEPT:], first.values())
        return [i for i in begins if i in keep or i not in done]

    def _last_done(self) -> tuple[dict[tuple, int], dict[tuple, int]]:
        """The op done last of each group's collectives, by (space, group), and of each p2p
        channel, by (space, group, peer, direction; an any-source recv by the source its end
        named).  A container (its ops are in their channels) and a nested op (in its
        parent) are in neither."""
        done, begins = self.done, self.begins
        collective: dict[tuple, int] = {}
        channels: dict[tuple, int] = {}
        for i, t in done.items():
            b = begins[i]
            kind = kind_of(str(b.get("op") or "?"), b.get("dir"), bool(b.get("nested")))
            if kind == COLLECTIVE:
                last, key = collective, (b.get("src") == "fr", group_of(b))
            elif kind == P2P:
                last, key = channels, (b.get("src") == "fr", group_of(b), self._peer(i), b.get("dir"))
            else:
                continue
            j = last.get(key)
            if j is None or (done[j], j) < (t, i):
                last[key] = i
        return collective, channels

    def channels_passed(self, last_done: tuple[dict[tuple, int], dict[tuple, int]] | None = None
                        ) -> dict[str, list[list]]:
        """Per group, the p2p channels of Python's seq space whose last op done a carry does
        not keep (past the ``DONE_KEPT`` used last), each as [peer, direction, its seq, when
        it was done]: a reader knows the rank posted and completed that seq there (a send
        that returned while its recv waits is no send "never posted").  The
        ``CHANNELS_PASSED`` done last, those the carry replayed said included."""
        done = self.done
        _, channels = last_done if last_done is not None else self._last_done()
        last = dict(self.passed or {})  # (group, peer, direction) -> (seq, done at)
        whole = self._kept_channels(channels)
        for (fr, group, peer, direction), i in channels.items():
            seq = self.begins[i].get("seq")
            if fr:
                continue
            key = (group, peer, direction)
            last.pop(key, None)  # (a channel used since: its place is now)
            if i not in whole and isinstance(peer, int) and isinstance(seq, int) and direction in ("send", "recv"):
                last[key] = (seq, done[i])
        out: dict[str, list[list]] = {}
        for (group, peer, direction), (seq, ts) in sorted(last.items(), key=lambda kv: kv[1][1])[-CHANNELS_PASSED:]:
            out.setdefault(group, []).append([peer, direction, seq, ts])
        return out

    def _kept_channels(self, channels: dict[tuple, int]) -> set[int]:
        """The ops of ``channels`` (``_last_done``) a carry keeps whole: those used last."""
        return set(sorted(channels.values(), key=lambda i: (self.done[i], i))[-DONE_KEPT:])

    def _peer(self, op_id: int) -> object:
        """An op's peer: its begin's, or (an any-source recv) the one a later phase named."""
        peer = self.begins[op_id].get("peer")
        if peer is None:
            peer = next((p["peer"] for p in self.phases[op_id][1:] if p.get("peer") is not None), None)
        return peer


def _withdraw(out: Replayed, op_id: int, ran: dict[str, list[tuple[int, int, int]]],
              kept: dict[str, History]) -> None:
    """Op ``op_id``'s end says the backend refused it and it gave its number back
    (``unissued``), its begin written with the number: the begin loses it, and so do the
    group's collectives read (its last entry of them) and, where a carry's history counted
    it (a segment ended between its begin and its end), that history (``withdrawn``)."""
    b = out.begins[op_id]
    seq, name = b["seq"], group_of(b)
    out.begins[op_id] = out.phases[op_id][0] = {k: v for k, v in b.items() if k != "seq"}
    read = ran.get(name, [])
    at = next((j for j in range(len(read) - 1, -1, -1) if read[j][0] == op_id), None)
    if at is not None:
        del read[at]
    if name in kept and isinstance(seq, int) and kind_of(str(b.get("op") or "?"), b.get("dir"),
                                                           bool(b.get("nested"))) == COLLECTIVE:
        history = withdrawn(kept[name], seq, key_hash(match_key_of(b)))
        if history is None:
            del kept[name]
        else:
            kept[name] = history


def replay(before: bytes, data: bytes, rank: int) -> Replayed:
    """Replay a carry (``before``: ended lines) and the lines of the segment after it (an
    incomplete last line is left out).  An op is done as the model judges it: a sync op at
    its end, an async one at the end of its wait (or an end that raised), one timed on the
    device when the device says so; a nested op no later than its parent.  Gaps in the
    lines' ring positions are found from where the carry says the ring was (``RingEnd``),
    else from their first block."""
    from commscope.blocks import BlockDecoder, decode_stream, gaps_not_counted
    from commscope.events import decode_lines, gc_paused

    data = data[: data.rfind(b"\n") + 1]
    decoder = BlockDecoder(rank)
    with gc_paused():  # (the carry apart: what it lost, if damaged, is not the segment's)
        head = decode_stream(decode_lines(before, rank), decoder, columns=False)
        decoder.counts_gaps, decoder.gaps = True, []  # (a carry that says where the ring was closed it there)
        got = decode_stream(decode_lines(data, rank), decoder, columns=False)
    lost = [e for e in got.events if e["type"] == "dropped" and said_by_store(e)]
    losses = Losses(got.damaged, dict(got.invalid), sum(int(e.get("entries") or 0) for e in lost),
                    str(lost[0]["reason"])[len(STORE_LOST) + 2:] if lost else "",
                    tuple(gaps_not_counted(decoder.gaps, got)[0]))
    out = Replayed({}, {}, {}, set(), {}, got.count(), None)
    meta = dropped = None
    kept: dict[str, History] = {}  # group -> the rank's history of its collectives (``histories``)
    ran: dict[str, list[tuple[int, int, int]]] = {}  # group -> (op id, seq, key hash) of its collectives read
    passed: dict[tuple[str, int, str], tuple[int, int]] = {}  # a carry's channels passed (``channels_passed``)
    stacks = Stacks()
    hashes: dict[bytes, int] = {}  # what a begin's match key is made of -> its hash (a stream repeats a few)
    done_by: dict[int, dict] = {}  # op id -> the phase event that completed it
    for e in head.events + got.events:
        typ = e.get("type")
        if typ == "meta":
            meta = e
        elif typ == "group":
            name = str(e.get("group"))
            out.groups[name] = {k: v for k, v in e.items() if k not in CARRIED_KEYS}
            history = History.of_event(e)  # (a carry's)
            if history is not None:
                kept[name] = history
            for peer, direction, seq, ts in e.get("channels") or ():
                passed[(name, peer, direction)] = (seq, ts)
        elif typ == "dropped":
            dropped = _dropped(dropped, e)
        elif typ == "stack":
            stacks.take(e)
        if typ != "op":
            continue
        op_id, ph = e["id"], e["phase"]
        if ph == "begin":
            out.begins[op_id] = e
            out.phases[op_id] = [e]
            seq = e.get("seq")
            if not isinstance(seq, int) or e.get("src") == "fr":
                continue
            kind = kind_of(str(e.get("op") or "?"), e.get("dir"), bool(e.get("nested")))
            name = group_of(e)
            if kind == COLLECTIVE:
                raw = orjson.dumps(tuple(map(e.get, _KEY_FIELDS)))  # (cheaper than the key)
                khash = hashes.get(raw)
                if khash is None:
                    khash = hashes[raw] = key_hash(match_key_of(e))
                ran.setdefault(name, []).append((op_id, seq, khash))
            if kind in (COLLECTIVE, P2P) and name not in out.groups:  # (its line carries the history, the channels)
                out.groups[name] = {"type": "group", "v": e["v"], "rank": rank, "ts": e["ts"], "group": name}
            continue
        b = out.begins.get(op_id)
        if b is None:
            continue
        out.phases[op_id].append(e)
        if "exc" in e:
            out.failed.add(op_id)
            if ph == "end" and e.get("unissued") is True and "seq" in b:
                _withdraw(out, op_id, ran, kept)
                b = out.begins[op_id]
        if completes(ph, failed="exc" in e, is_async=bool(b.get("async")), device=b.get("device") is not None) and (
                op_id not in out.done):
            out.done[op_id] = e["ts"]
            done_by[op_id] = e
    for op_id, b in out.begins.items():  # nested ops end no later than their parent
        parent = b.get("parent")
        if b.get("nested") and op_id not in out.done and (parent not in out.begins or parent in out.done):
            out.done[op_id] = out.done.get(parent, b["ts"])
    for name, read in ran.items():
        history = extended(kept.get(name), [s for _, s, _ in read], [k for _, _, k in read])
        if history is not None:
            kept[name] = history
    carried_in = frozenset(e["id"] for e in head.events if e.get("type") == "op" and e.get("phase") == "begin")
    ring_end = None if decoder.ring_open else RingEnd(rank, decoder.seen_end,
                                                      max((e["ts"] for e in got.events), default=0))
    return out._replace(meta=meta, dropped=dropped, losses=losses, histories=kept, stacks=stacks, passed=passed,
                        carried_in=carried_in, done_by=done_by, ring_end=ring_end)


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


class Restated(NamedTuple):
    """What a writer states after a ``store_lost`` marker once its store lost what it held
    (``restatement``)."""

    #: what the rank was in (``Replayed.carry`` as lines): its groups, its drops so far, the
    #: last ops it completed, the phases of every op still in flight, the stacks that say
    #: where it is, where its ring was
    lines: list[bytes]
    #: the same with the rank's meta, as ended lines: what the rank is in from here (a Redis
    #: writer's new base)
    carry: bytes


def restatement(before: bytes, data: bytes, rank: int) -> Restated | None:
    """What the rank was in at the end of ``data`` (ended lines its writer stored after the
    carry ``before``), restated after a store lost them, so that a hang that began before the
    loss is still found: one meaning for every store (``RedisWriter._restated``: from a
    mark's carry and the lines kept since; ``DirectoryWriter.write``: from the segment its
    open file still holds once deleted).  None when the lines do not replay (a writer's
    own: never expected)."""
    try:
        replayed = replay(before, data, rank)
        return Restated(replayed.carry().splitlines(), replayed.carry(with_meta=True))
    except Exception:
        return None


def starts_again(head: bytes) -> bool:
    """Whether a segment whose first bytes are ``head`` is a file its writer started again
    after the store lost what it held (``DirectoryWriter.write``): a ``store_lost`` marker
    first, then the rank's meta and what the rank was in (``restatement``), so it needs no
    carry of the segment before, and its own carry is replayed from none."""
    end = head.find(b"\n")  # (not a split: ``head`` may be a whole read's chunk, copied past the line)
    return is_store_lost(head if end < 0 else head[:end])


#: How an op's begin reads in a JSON line (a restatement's are JSON: ``Replayed.carry``)
_BEGIN = b'"phase":"begin"'


def without_begins(lines: bytes, upto: int) -> bytes:
    """``lines`` (ended) without the op begins of ids up to ``upto``: a restatement's begins
    of ops a reader read already (a stream's op ids grow) are not read twice, what else the
    ops reached is (``DirectoryReader._started_again``).  Cut from the lines, not the events:
    a whole read may put JSON op events in columns."""
    if _BEGIN not in lines:
        return lines
    kept = []
    for line in lines.split(b"\n"):
        if _BEGIN in line:
            try:
                e = orjson.loads(line)
            except orjson.JSONDecodeError:
                e = None
            if isinstance(e, dict) and e.get("type") == "op" and e.get("phase") == "begin" and \
                    isinstance(e.get("id"), int) and e["id"] <= upto:
                continue
        kept.append(line)
    return b"\n".join(kept)


def open_at_end(seg: Segment, before: bytes, rank: int) -> bytes:
    """The carry of ``seg`` given the one of the segment before (``before``), as ended lines
    (``Replayed.carry``)."""
    return replay(before, read_segment(seg.path), rank).carry()


def _start_of(directory: Path, stream: Stream, seg: Segment, before: bytes | None = None) -> bytes | None:
    """What the carry of ``seg`` is replayed from: none for a stream's first segment and for
    one its writer started again (``starts_again``), else the carry of the segment before
    (``before``, where the caller made it; None: not there).  OSError: ``seg`` is gone."""
    if seg.number == 0 or starts_again(read_from(seg.path, 0, HEAD_BYTES)):
        return b""
    return before if before is not None else carried(directory, stream, seg.number - 1)


def made(directory: Path, stream: Stream, segs: list[Segment], number: int) -> bytes | None:
    """The carry of segment ``number``, made from the segments (``segs``: the stream's, oldest
    first) where none is written: its closer (the writer's child) has not written it yet, or
    never will (the rank died before a next segment started one: a closer still running
    when the last one began closes only what it listed).  Replayed from the nearest segment
    before whose start is known (``_start_of``), as the closer would; None where a segment
    on the way is gone (then what was in flight is not known)."""
    by_number = {seg.number: seg for seg in segs}
    chain: list[Segment] = []  # newest first
    before: bytes | None = None
    while before is None:
        seg = by_number.get(number - len(chain))
        if seg is None:
            return None
        chain.append(seg)
        try:
            before = _start_of(directory, stream, seg)
        except OSError:
            return None
    try:
        for seg in reversed(chain):
            before = open_at_end(seg, before, stream[0])
    except OSError:
        return None
    return before


def write_carries(directory: Path, stream: Stream, segs: list[Segment], names: set[str]) -> None:
    """Write the carry of each closed one of a stream's segments (``segs``, oldest first) that
    has none (``names``: the files of ``directory``), oldest first: each starts from the one
    before, a segment its writer started again after a loss from none (``starts_again``: it
    restates what the rank was in).  A segment whose predecessor is gone with no carry
    (deleted by hand or lost before one was written) is replayed from none, and it and the
    ones after it get a partial carry (``partial_path``): retention goes on bounding the
    stream (before, it stopped there for good and the stream filled the disk), and readers
    starting after the gap still say that what was in flight there is unknown."""
    numbers = {seg.number for seg in segs}
    last: tuple[int, bytes, bool] | None = None  # the carry this call wrote last (not read back), partial
    for seg in segs[:-1]:  # (the newest is being written)
        path = carry_path(directory, stream, seg.number)
        if path.name in names or partial_path(directory, stream, seg.number).name in names:
            continue
        partial = last is not None and last[0] == seg.number - 1 and last[2]
        try:
            before = _start_of(directory, stream, seg, last[1] if last is not None and last[0] == seg.number - 1
                               else None)
        except OSError:
            break
        if before is None:
            before = carried(directory, stream, seg.number - 1, partial=True)
            partial = True
            if before is None and seg.number - 1 not in numbers:
                before = b""  # (the gap: what was in flight before it is not known)
        if before is None:
            break
        try:
            data = open_at_end(seg, before, stream[0])
        except OSError:
            break
        atomic_write((partial_path if partial else carry_path)(directory, stream, seg.number), data,
                     mode_of(seg.path))
        last = (seg.number, data, partial)


def as_read(events: list[dict], read: int) -> list[dict]:
    """A carry's events as a reader takes them in: its ``dropped`` line (``_dropped``) says
    the stream's drops so far, of which the reader read ``read`` (``TraceReader.drops_read``:
    none, unless it read some of the stream and jumped over segments retention deleted), so
    it counts the rest: none twice, none missed, and each incarnation's of the rank adding
    to the others' (the model adds a ``dropped`` event's ``count``, and takes its ``total``
    as the least the rank dropped: a running total of one incarnation is not that)."""
    return [{k: v for k, v in e.items() if k != "total"} | {"count": max(0, e["total"] - read)}
            if e["type"] == "dropped" and e.get("count") == 0 and "total" in e else e for e in events]
