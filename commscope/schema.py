"""The typed schema every reader validates events against before they reach the model.

Readers trust nothing (docs/analysis.md): a trace may come from a crashed job, a copy, a
hostile file.  Each event is decoded by one msgspec ``TypedDict`` decoder that checks,
at C speed, every known key's type and range: names and texts have length caps,
ranks, sequence numbers, ids, byte counts and timestamps are non-negative and bounded,
shapes are lists of lists of sizes, floats are finite.  Unknown keys are skipped
without being built.  A short Python pass then checks what depends on the event type
(required keys) and on the trace itself: an event must carry the rank of the stream it
was read from, so a trace can never name more ranks than it has streams.  Quantities the
model indexes by value (seqs, ids) are bounded there by the number of ops it holds.

An invalid event is skipped and counted by a reason such as ``"sample: bad rss"``;
a line that is not JSON at all is *damaged* (torn writes, corruption), counted apart.

Measured on a 230k-event healthy trace (one process, shared 2-core machine): orjson
plus the old minimal checks read ~0.29-0.36 M events/s; orjson plus a hand validator
of every field ~0.17-0.22 M/s; this decoder with full validation ~0.45-0.50 M/s.
"""

from __future__ import annotations

import re
import typing
from collections import Counter
from collections.abc import Callable, Iterable
from operator import itemgetter, ne
from typing import TYPE_CHECKING, Annotated, Any, Literal, NamedTuple, TypedDict

import msgspec
import numpy as np
from msgspec import Meta

from commscope.redact import Redactor, known_texts, redact, redact_args
from commscope.visible import may_hold_control, visible_event

if TYPE_CHECKING:
    from commscope.beatscan import Taken
    from commscope.oprecords import OpRecords

SCHEMA_VERSION = 3

#: Bounds no real job reaches and every count, size and time fits in (int64 with room).
MAX_INT = (1 << 62) - 1
#: Ranks (and world sizes) above this are not a job but a damaged or hostile value.
MAX_RANK = (1 << 24) - 1
MAX_NAME = 4096  # op, group, dtype, host, backend ... names
MAX_TEXT = 1 << 20  # exception text, call sites, argv entries, reasons
MAX_DIMS = 64  # per shape
MAX_SECONDS = 1e9  # hang_after, sample_interval

Count = Annotated[int, Meta(ge=0, le=MAX_INT)]
AnyInt = Annotated[int, Meta(ge=-MAX_INT, le=MAX_INT)]
Rank = Annotated[int, Meta(ge=0, le=MAX_RANK)]
WorldSize = Annotated[int, Meta(ge=1, le=MAX_RANK + 1)]
Name = Annotated[str, Meta(max_length=MAX_NAME)]
Text = Annotated[str, Meta(max_length=MAX_TEXT)]
Shape = Annotated[list[Count], Meta(max_length=MAX_DIMS)]
#: Distinct invalid-event reasons a reader keeps; more are counted as "other" (a hostile
#: trace cannot grow its stats without bound).
MAX_REASONS = 64
#: What a reason for an invalid event may say (``reason_of``, ``_check``, the block decoder's): a
#: summary states them, and a reader prints them, so no other text passes as one
REASON = re.compile(r"[A-Za-z0-9_ :]{1,64}")
Reason = Annotated[str, Meta(pattern=f"^{REASON.pattern}$")]
Real = Annotated[float, Meta(ge=-1e18, le=1e18)]  # finite: rejects 1e400 (inf)
Seconds = Annotated[float, Meta(ge=0, le=MAX_SECONDS)]
Frame = tuple[Text, AnyInt | None, Text]

TYPES = ("op", "meta", "group", "sample", "heartbeat", "stack", "exit", "dropped", "block", "site", "summary")
#: A block holds at most the native recorder's buffer (16 MiB), base64-encoded.
MAX_BLOCK = 24 << 20
PHASES = ("begin", "end", "wait_begin", "wait_end", "done")


class StackThread(TypedDict, total=False):
    tid: AnyInt
    name: Name
    frames: list[Frame]
    op_thread: bool


class SummaryOp(TypedDict, total=False):
    """One op and group of a ``summary`` (what retention kept of a deleted segment)."""

    op: Name
    group: Name
    count: Count
    in_bytes: Count
    out_bytes: Count
    unfinished: Count  # begun in the segment, not finished in it (no latency)
    failed: Count
    #: per minute: (minute start ns, ops, latency sum ns, latency max ns, [(log2 us bucket, ops)])
    minutes: Annotated[list[tuple[Count, Count, Count, Count, Annotated[list[tuple[Count, Count]], Meta(
        max_length=64)]]], Meta(max_length=100_000)]


# Every key of every event type in one TypedDict: msgspec then decodes straight into the
# plain dicts the model reads (a union of per-type Structs would need a second pass to
# become dicts, which costs more than it saves).  No key has two meanings across types.
#: The most runs a group's members are stated in (``GroupRuns``)
MAX_RUNS = 1 << 16
#: The most members one group's runs may name, and that a reader expands out of runs (a run of
#: 12 bytes may name millions: ``members_of``, and a block's GROUP records, ``blocks.StaticTable``):
#: a hostile trace cannot make a reader allocate past it
MAX_RUN_MEMBERS = 1 << 22


class GroupRuns(TypedDict):
    """A group's members as (start, stride, count) runs (``runs_of``)."""

    runs: Annotated[list[tuple[Rank, Annotated[int, Meta(ge=-MAX_RANK, le=MAX_RANK)],
                               Annotated[int, Meta(ge=1, le=MAX_RUN_MEMBERS)]]], Meta(max_length=MAX_RUNS)]


RawEvent = TypedDict("RawEvent", {
    # every event
    "type": Literal[TYPES], "rank": Rank, "ts": Count, "v": Annotated[int, Meta(ge=0, le=SCHEMA_VERSION)],
    # op
    "phase": Literal[PHASES], "id": Count, "op": Name, "group": Name, "seq": Count, "peer": Rank,
    "dir": Literal["send", "recv"], "root": Rank, "redop": Name, "in_shapes": list[Shape],
    "in_dtypes": list[Name], "in_bytes": Count, "out_shapes": list[Shape], "out_dtypes": list[Name],
    "out_bytes": Count, "async": bool, "site": Text, "tid": AnyInt, "sk": Count, "device": Name,
    "nested": bool, "parent": Count, "src": Name, "tag": AnyInt, "exc": Text, "approx": bool, "gpu_ns": Count,
    "unissued": bool,
    # meta
    # (the recorder writes null where it does not know: before init_process_group, no hang_after)
    "host": Name | None, "pid": Count | None, "world_size": WorldSize | None, "backend": Name | None,
    "torch": Name | None, "commscope": Name | None, "python": Name | None, "job": Name | None,
    "hang_after": Seconds | None, "sample_interval": Seconds | None, "argv": list[Text] | None,
    "store": Text | None, "fr": bool | None, "local_rank": Count | None, "fr_version": Name | None,
    "recorder": Name | None, "names": Annotated[list[Name], Meta(max_length=4096)] | None,
    "dtypes": Annotated[list[Name], Meta(max_length=4096)] | None,
    # (which attempt of a torchrun run the job is, 0 first: rank 0's TORCHELASTIC_RESTART_COUNT;
    # absent outside torchrun and in traces recorded before it was written)
    "attempt": Count | None,
    # (why the rank records without a spool: its last records may die with it)
    "no_spool": Text | None,
    # group
    # (a group's members: listed, or as (start, stride, count) runs where that is shorter, as a
    # carry states them in every keyframe, ``with_runs``: read as the list, ``members_of``; a
    # reader from before runs refuses such a line, counted, rather than read no members)
    "granks": list[Rank] | GroupRuns, "desc": Name, "gid": Annotated[int, Meta(ge=0, le=MAX_RANK)],
    # (a carried group: the rank's collectives of it so far, seqs dfrom to dseq, as one digest:
    # commscope/histories.py)
    "dfrom": Count, "dseq": Count, "digest": Count,
    # (and the p2p channels whose last op it does not carry: [peer, direction, seq done last, when])
    "channels": Annotated[list[tuple[Rank, Literal["send", "recv"], Count, Count]], Meta(max_length=1 << 16)],
    # sample
    "cpu": Real, "rss": Count, "gpu_util": Real, "gpu_mem": Count, "gpu_mem_total": Count, "gpu_power": Real,
    "gpu_temp": Real, "gpu_error": Text,
    # heartbeat, stack, exit, dropped
    "inflight": Count, "threads": list[StackThread], "reason": Text, "unwaited": list[Count],
    "trigger": Rank, "request_ns": Count, "signal": Name, "code": AnyInt, "unwaited_count": Count,
    "stop_signal": Name, "stop_ts": Count, "term_unwatched": bool,
    # exit (destroy_process_group's): the exception propagating through it, called in a ``finally``
    "raising": Name,
    "count": Count, "total": Count, "records": Count,
    # block (version 2): packed op records, see commscope.blocks; site: a call site by id
    "n": Count, "data": Annotated[str, Meta(max_length=MAX_BLOCK)], "sid": Annotated[int, Meta(ge=0, le=MAX_INT)],
    "text": Text,
    # version 3: a block's ring positions; meta: the incarnation (the process initialised its
    # process group again) the stream belongs to, and the run (a nonce rank 0 draws at init)
    "pos": Count, "end": Count, "inc": Count, "run": Name,
    # meta: the ring position the stream's first block starts at (a reader reading the stream
    # from its first line counts a first block line gone against it)
    "ring": Count,
    # meta (a directory store's segment after the first begins with it): the lines its writer
    # wrote to the stream before the segment (``segments.opening_meta``)
    "lines_before": Count,
    # dropped (version 3): entries (lines) of the stream the store lost before this one; the
    # writer that found its stream gone or shorter says so (``store.base.store_lost``)
    "entries": Count,
    # summary: what retention kept of a segment it deleted (store/retention.py): its number,
    # its first and last timestamps, how many events and bytes it held, per op and group
    "seg": Count, "first_ns": Count, "last_ns": Count, "events": Count, "size": Count,
    "ops": Annotated[list[SummaryOp], Meta(max_length=100_000)],
    # (the ops carried into the segment that it counts, listed too: id, op, group, in_bytes,
    # out_bytes, failed, begin ns, done ns (0: not done), the phase that completed it ("":
    # none), whether that phase's time is a bound; ``retention.Carried``.  A carry may hold
    # millions of ops in flight: the bound is the line's own size, a few bytes an op)
    "carried": Annotated[list[tuple[Count, Name, Name, Count, Count, bool, Count, Count,
                                    Literal["", "end", "wait_end", "done"], bool]], Meta(max_length=1 << 22)],
    # (the ids of those whose end said the backend refused the op and its number went back:
    # a reader that read the begin with its number withdraws it, ``TraceModel._unissue``)
    "unissued_ids": Annotated[list[Count], Meta(max_length=1 << 22)],
    # (and what the segment lost: its damaged lines, its invalid events by reason, in
    # ``entries`` and ``reason`` the lines its ``store_lost`` markers said the store lost, and
    # the gaps in its blocks' ring positions, lines gone from its file, with their bytes)
    "damaged": Count, "invalid": Annotated[dict[Reason, Count], Meta(max_length=MAX_REASONS + 1)],
    "gaps": Count, "gap_bytes": Count,
    # (the lines written to the stream up to the segment's end, where its meta said those before
    # it: a reader counts the lines of the segments gone by hand after it, ``_lines_gone``)
    "lines_upto": Count,
    # (the whole lines cut off the segment's end, as the next segment's meta says them)
    "cut": Count,
}, total=False)



def _text_keys() -> tuple[str, ...]:
    """The keys typed ``Text`` (free text from the user's program: exception messages, call
    sites, argv, reasons): every one is redacted when read (``redact_event``)."""
    keys = []
    for key, hint in RawEvent.__annotations__.items():
        args = typing.get_args(hint)
        if hint == Text or Text in args or list[Text] in args or hint == list[Text]:
            keys.append(key)
    return tuple(keys)


#: Keys holding free text (``Text``), derived from ``RawEvent``; ``argv`` is a list of it.
TEXT_KEYS = _text_keys()
_TEXT_STR_KEYS = tuple(k for k in TEXT_KEYS if k != "argv")
_TEXT_KEY_SET = frozenset([*TEXT_KEYS, "threads"])
#: ``Name`` keys whose value the user's program chose: a rank's host and a group's
#: description (``new_group(group_desc=…)``, read from Flight Recorder dumps).  Redacted
#: like ``Text``; a group's name is torch's number, and ops repeat it, so it is not.
_SHOWN_NAME_KEYS = ("host", "desc")

#: Keys each type must carry besides type, rank and ts.
REQUIRED: dict[str, tuple[str, ...]] = {"op": ("phase", "id"), "group": ("group",),
                                        "block": ("data",), "site": ("sid", "text"),
                                        "summary": ("seg", "events", "ops")}


class JobMeta(TypedDict, total=False):
    """``job.json`` of the directory store / the job key of the Redis store."""

    job: Name
    created: Count | None
    world_size: WorldSize | None
    backend: Name | None
    schema: Count | None
    commscope: Name | None
    host: Name | None
    maxlen: Count | None
    source: Name | None
    copied_from: Text | None
    attempt: Count | None  # (as each rank's meta states it: ``RawEvent``)
    run: Name | None  # the run rank 0 drew at incarnation ``inc`` (``analysis.runs.JobReference``)
    inc: Count | None
    launch: Name | None  # the ``commscope run`` that made it (its ``$COMMSCOPE_LAUNCH``: ``run._made``)


_DECODER = msgspec.json.Decoder(RawEvent)
#: A meta's two long lists (op names, dtype codes: ~1.5 KB of ~90 strings), which every rank's
#: meta states alike: ``_decode_objs`` decodes each distinct one once
_LISTS = ("names", "dtypes")
_LISTS_RAW = msgspec.json.Decoder(TypedDict(
    "RawEventListsRaw", {**RawEvent.__annotations__, **dict.fromkeys(_LISTS, msgspec.Raw)}, total=False))
_LIST_DECODERS = {key: msgspec.json.Decoder(RawEvent.__annotations__[key]) for key in _LISTS}
#: Lists ``_decode_objs`` decoded, by key and bytes, kept across calls (a whole read's worker
#: decodes one meta a stream: its lists were ~12 us of its ~22); at most ``_LISTS_KEPT``
_LISTS_SEEN: dict[tuple[str, bytes], list[str]] = {}
_LISTS_KEPT = 256
_JOB_DECODER = msgspec.json.Decoder(JobMeta)
_ANY = msgspec.json.Decoder()
_TYPE_IN_LINE = re.compile(rb'"type"\s*:\s*"([A-Za-z_]{1,24})"')
_PHASE_IN_LINE = re.compile(rb'"phase"\s*:\s*"([A-Za-z_]{1,24})"')
_FIELD = re.compile(r"at `\$\.?([A-Za-z_]*)")


class _Nothing(Counter):
    """The empty ``Counter`` that every ``Decoded`` with nothing invalid may share (a live
    poll makes thousands: ~1 us each to make one); counting into it raises, as sharing it
    would spread the counts (count into a copy: ``Counter(decoded.invalid)``)."""

    def __setitem__(self, key: object, value: object) -> None:
        raise TypeError("NO_INVALID is shared: count into a copy of it")

    def __delitem__(self, key: object) -> None:
        raise TypeError("NO_INVALID is shared: count into a copy of it")

    def setdefault(self, key: object, default: object = None) -> object:
        raise TypeError("NO_INVALID is shared: count into a copy of it")

    def update(self, iterable: object = None, /, **kwargs: object) -> None:  # (an empty Counter's is dict's)
        if kwargs or (iterable is not None and next(iter(iterable), _NONE) is not _NONE):  # type: ignore
            raise TypeError("NO_INVALID is shared: count into a copy of it")

    def copy(self) -> Counter:
        """A Counter of its own (``Counter.copy`` would make another shared one)."""
        return Counter()

    def __reduce__(self) -> tuple:
        return Counter, ()


_NONE = object()


#: Nothing invalid, shared (``Decoded.invalid``; never counted into)
NO_INVALID: Counter = _Nothing()


class Decoded(NamedTuple):
    """What a batch of lines held: valid events, damaged lines, invalid events by reason,
    and (a reader that keeps op records in columns: ``blocks.decode_stream``) the op
    records of its blocks, an ``oprecords.OpRecords``, and (a whole read's) its heartbeats
    and samples as rows."""

    events: list[dict[str, Any]]
    damaged: int
    invalid: Counter
    ops: OpRecords | None = None
    #: A whole read's heartbeats and samples taken out of ``events`` as rows (``beatscan``)
    beats: Taken | None = None

    def count(self) -> int:
        """Events read: the dicts, the op records and the heartbeats and samples taken."""
        return (len(self.events) + (len(self.ops) if self.ops is not None else 0)
                + (len(self.beats.line) if self.beats is not None else 0))


def _what(line: bytes) -> str:
    """'sample', 'op begin', or 'event': the kind an invalid line claims to be, for its reason."""
    m = _TYPE_IN_LINE.search(line)
    if m is None:
        return "event"
    kind = m.group(1).decode()
    if kind == "op":
        p = _PHASE_IN_LINE.search(line)
        if p is not None:
            kind += " " + p.group(1).decode()
    return kind


#: Why an event of a schema version this commscope does not read was skipped (``reason_of``)
VERSION_REFUSED = "unsupported schema version"


def reason_of(exc: msgspec.ValidationError, kind: str) -> str:
    """A short, bounded reason from a validation error: 'sample: bad rss', 'event: not an object'."""
    m = _FIELD.search(str(exc))
    field = m.group(1) if m else ""
    if not field:
        return f"{kind}: not an object"
    if field == "type":
        return "unknown event type"
    if field == "v":
        return f"{kind}: {VERSION_REFUSED}"
    return f"{kind}: bad {field}"


def _is_json(line: bytes) -> bool:
    try:
        _ANY.decode(line)
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
        return False
    return True


def _check(e: dict, rank: int | None) -> str | None:
    """The checks msgspec cannot express: required keys per type, the stream's rank."""
    typ = e.get("type")
    if typ is None:
        return "event: no type"
    if "ts" not in e or "rank" not in e:
        return f"{typ}: no {'ts' if 'ts' not in e else 'rank'}"
    if rank is not None and e["rank"] != rank:
        return f"{typ}: rank differs from its stream"
    for key in REQUIRED.get(typ, ()):
        if key not in e:
            return f"{typ}: no {key}"
    return None


def redact_event(e: dict, hide: Redactor | None = None) -> dict:
    """``e`` (a decoded event), its free text redacted in place: ``TEXT_KEYS``, a host and a
    group's description, and the threads of a ``stack`` (names and frames).  ``hide``: a
    redaction that knows more secrets than this process's (a snapshot's rank's environment).
    Returns ``e``."""
    text, args = (hide.redact, hide.args) if hide is not None else (redact, redact_args)
    for key in _TEXT_STR_KEYS:
        v = e.get(key)
        if v.__class__ is str:
            e[key] = text(v)
    for key in _SHOWN_NAME_KEYS:  # (names, not free text, but shown and copied like it: a foreign trace's)
        v = e.get(key)
        if v.__class__ is str:
            e[key] = text(v)
    argv = e.get("argv")
    if isinstance(argv, list):
        e["argv"] = args([a if isinstance(a, str) else str(a) for a in argv])
    threads = e.get("threads")
    if isinstance(threads, list):
        for t in threads:
            if not isinstance(t, dict):
                continue
            if isinstance(t.get("name"), str):
                t["name"] = text(t["name"])
            frames = t.get("frames")
            if isinstance(frames, list):
                t["frames"] = [_redact_frame(f, text) for f in frames]
    return e


def _redact_frame(f: Any, text: Callable[[str], str]) -> Any:
    if isinstance(f, list | tuple) and len(f) == 3:
        file, line, func = f
        return type(f)((text(file) if isinstance(file, str) else file, line,
                        text(func) if isinstance(func, str) else func))
    return f


def _sift(objs: list, rank: int | None, invalid: Counter) -> list[dict]:
    """Keep the events that pass ``_check``, their text redacted; count the rest."""
    out = []
    append = out.append
    required = REQUIRED
    known = known_texts()  # call sites repeat: most are looked up, not redacted again
    for e in objs:
        # _check, inlined for the common case: a call per event is a tenth of the read
        typ = e.get("type")
        if typ == "block":  # the native recorder's: most lines of a trace, and nothing to redact
            if "data" in e and "ts" in e and (e.get("rank") == rank if rank is not None else "rank" in e):
                append(e)
            else:
                invalid[_check(e, rank) or "event: invalid"] += 1
            continue
        if typ == "op":  # JSON op events (older recorders, Flight Recorder merges): only a call site or an exception
            if "phase" in e and "id" in e and "ts" in e and (
                    e.get("rank") == rank if rank is not None else "rank" in e):
                site = e.get("site")
                if site is not None:
                    hit = known.get(site)
                    e["site"] = hit if hit is not None else redact(site)
                if "exc" in e:
                    e["exc"] = redact(e["exc"])
                append(e)
            else:
                invalid[_check(e, rank) or "event: invalid"] += 1
            continue
        if (typ is not None and "ts" in e and (e.get("rank") == rank if rank is not None else "rank" in e)
                and (typ not in required or all(k in e for k in required[typ]))):
            if typ == "summary" and not all("op" in o for o in e["ops"]):
                invalid["summary: an op without its name"] += 1  # (its rows are by op: report's history)
                continue
            if typ == "group" and e.get("granks").__class__ is dict:
                members = members_of(e["granks"]["runs"])
                if members is None:
                    invalid["group: runs of members out of range, or more than a reader expands"] += 1
                    continue
                e["granks"] = members
            if (typ != "sample" and typ != "heartbeat") or not _TEXT_KEY_SET.isdisjoint(e):
                redact_event(e)  # (samples and heartbeats carry no text but a GPU probe's error)
            append(e)
        else:
            invalid[_check(e, rank) or "event: invalid"] += 1
    return out


def runs_of(granks: list[int] | tuple[int, ...]) -> list[tuple[int, int, int]]:
    """``granks`` as (start, stride, length) runs, in order (``record/native/buffer.h``'s
    ``group_runs`` splits them the same way; a block's GROUP record and a group event's
    ``GroupRuns`` hold them so)."""
    out: list[tuple[int, int, int]] = []
    i, n = 0, len(granks)
    while i < n:
        if i + 1 == n:
            out.append((granks[i], 1, 1))
            break
        stride = granks[i + 1] - granks[i]
        j = i + 1
        while j + 1 < n and granks[j + 1] - granks[j] == stride:
            j += 1
        out.append((granks[i], stride, j - i + 1))
        i = j + 1
    return out


#: Members ``members_of`` expanded, by their runs: one list for every stream that states a
#: group alike (a world of 16k ranks carried by each of 16k streams was 16k lists of 16k:
#: ~10 GB), read, never written; at most ``MAX_RUN_MEMBERS`` members in all are kept
_MEMBERS_SEEN: dict[tuple, list[int]] = {}
_members_held = 0  # (in ``_MEMBERS_SEEN``)
#: The most members this process expands out of runs it had not kept, in all: the streams of a
#: job state few distinct groups (16k ranks in a world, 2k hosts and their parallel groups:
#: ~100k members), so a trace that names more is hostile, and refused past it
RUNS_BUDGET = 1 << 24
_runs_spent = 0


def members_of(runs: list) -> list[int] | None:
    """A group's members from their (start, stride, count) runs (``GroupRuns``, as the schema
    checked them), one list for all who state the same runs; None where a member falls
    outside the ranks, a run repeats one member, or they name more than ``MAX_RUN_MEMBERS``
    (or this process has expanded ``RUNS_BUDGET`` members already)."""
    global _members_held, _runs_spent
    key = tuple(map(tuple, runs))
    got = _MEMBERS_SEEN.get(key)
    if got is not None:
        return got
    total = sum(n for _, _, n in key)
    if total > MAX_RUN_MEMBERS or _runs_spent + total > RUNS_BUDGET:
        return None
    for start, stride, n in key:
        if not 0 <= start + stride * (n - 1) <= MAX_RANK or (stride == 0 and n > 1):
            return None
    _runs_spent += total
    out: list[int] = []
    for start, stride, n in key:
        out.extend(range(start, start + stride * n, stride) if n > 1 else (start,))
    if _members_held + total > MAX_RUN_MEMBERS:
        _MEMBERS_SEEN.clear()
        _members_held = 0
    _MEMBERS_SEEN[key] = out
    _members_held += total
    return out


def with_runs(group: dict) -> dict:
    """A group event with its members as runs (``GroupRuns``) where that is shorter than
    listing them (a world of 16k ranks: ~30 bytes, not ~90 KB), as a carry writes it."""
    granks = group.get("granks")
    if not isinstance(granks, list) or len(granks) < 8:
        return group
    runs = runs_of(granks)
    if (3 * len(runs) >= len(granks) or len(runs) > MAX_RUNS or len(granks) > MAX_RUN_MEMBERS
            or any(stride == 0 and n > 1 for _, stride, n in runs)):  # (a member repeated: ``members_of`` refuses it)
        return group
    return group | {"granks": {"runs": runs}}


def decode_lines(data: bytes, rank: int | None = None) -> Decoded:
    """Decode and validate newline-separated events read from ``rank``'s stream (None: any).

    Fast path: the whole batch in one C call; only when a line fails does it go line by
    line, so one bad line costs only itself.
    """
    invalid: Counter = Counter()
    if not data:
        return Decoded([], 0, invalid)
    try:
        objs = _DECODER.decode_lines(data)
        damaged = 0
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError, UnicodeDecodeError):
        objs, damaged = [], 0
        decode = _DECODER.decode
        for line in data.split(b"\n"):
            if not line.strip():
                continue
            try:
                objs.append(decode(line))
            except msgspec.ValidationError as exc:
                # msgspec validates while it parses: a torn line may fail validation before
                # its end is reached.  Only well-formed JSON counts as invalid.
                if _is_json(line):
                    invalid[reason_of(exc, _what(line))] += 1
                else:
                    damaged += 1
            except (msgspec.DecodeError, UnicodeDecodeError):  # not JSON, or not UTF-8 (bit flips)
                damaged += 1
            except RecursionError:
                invalid[f"{_what(line)}: nested too deeply"] += 1
    return Decoded(_sift(_shown(objs, data), rank, invalid), damaged, invalid)


def _shown(objs: list, data: bytes) -> list:
    """``objs``, decoded from ``data``, with the control characters of their strings made
    visible where ``data`` may hold any (``visible``: a trace's text reaches a terminal)."""
    if may_hold_control(data):
        for obj in objs:
            if isinstance(obj, dict):
                visible_event(obj)
    return objs


def _decode_objs(data: bytes) -> list:
    """``_DECODER.decode_lines(data)``, raising where it would (a ``msgspec.ValidationError``
    where only a meta's list is not valid), for lines of many streams' first events: their
    metas' lists of op names and dtype codes are decoded and checked once per distinct list
    (``_LISTS``; ``_LISTS_SEEN``, across calls) and shared by the events, read and never
    written: a meta decoded takes ~1.3 KB so, ~7.6 KB with lists of its own (1,000 metas,
    tracemalloc).
    Not faster than the full decoder (100 metas: ~8.6 us a meta against ~5.8 us, a
    script, 2026-12-04).  Lines that name neither list go straight through the full
    decoder."""
    if b'"names"' not in data and b'"dtypes"' not in data:  # (an escaped key: the full decoder)
        return _shown(_DECODER.decode_lines(data), data)
    objs = _LISTS_RAW.decode_lines(data)
    seen = _LISTS_SEEN
    held = dict.fromkeys(_LISTS, 0)
    for obj in objs:
        for key in _LISTS:
            raw = obj.get(key)
            if raw is not None:
                held[key] += 1
                text = bytes(raw)
                got = seen.get((key, text))
                if got is None:
                    got = _LIST_DECODERS[key].decode(text)
                    if len(seen) >= _LISTS_KEPT:
                        seen.clear()
                    seen[key, text] = got
                obj[key] = got
    if b"\\u" in data or any(data.count(b'"%s"' % key.encode()) != n for key, n in held.items()):
        # (a key stated twice in one event, whose first value msgspec checks but a raw value
        # skips, or the word elsewhere, or perhaps escaped: the full decoder, as it would have it)
        return _shown(_DECODER.decode_lines(data), data)
    return _shown(objs, data)


def decode_indexed(lines: list[bytes], rank: int | None = None) -> tuple[Decoded, list[int]]:
    """``decode_lines`` of ``lines`` (none of them blank), with the index of the line each
    event came from: for a reader that decodes the other lines of a chunk another way and
    must put these back among them (``blocks.decode_chunk``)."""
    if not lines:
        return Decoded([], 0, Counter()), []
    try:
        objs = _decode_objs(b"\n".join(lines))
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError, UnicodeDecodeError):
        objs = None
    if objs is None or len(objs) != len(lines):  # a line that fails: each on its own
        events, at, damaged, invalid = [], [], 0, Counter()
        for k, line in enumerate(lines):
            got = decode_lines(line, rank)
            events += got.events
            at += [k] * len(got.events)
            damaged += got.damaged
            invalid.update(got.invalid)
        return Decoded(events, damaged, invalid), at
    invalid = Counter()
    kept = _sift(objs, rank, invalid)  # (keeps the very dicts it was given)
    line_of = {id(o): k for k, o in enumerate(objs)}
    return Decoded(kept, 0, invalid), [line_of[id(e)] for e in kept]


_RANK_OF = itemgetter("rank")


def decode_many(lines: list[bytes], ranks: list[int]) -> list[dict] | None:
    """Lines of several streams (line k of rank ``ranks[k]``, none blank) decoded and
    validated in one call, their events in line order; None where a line is not exactly
    one valid event of its own rank: decode those stream by stream then (``decode_lines``
    counts what it skips, by rank)."""
    data = b"\n".join(lines)
    if not _an_object_a_line(data, lines):
        return None
    try:
        objs = _decode_objs(data)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError, UnicodeDecodeError):
        return None
    if len(objs) != len(lines):
        return None
    invalid: Counter = Counter()
    kept = _sift(objs, None, invalid)
    if len(kept) != len(objs) or any(map(ne, map(_RANK_OF, kept), ranks)):
        return None
    return kept


def _an_object_a_line(data: bytes, lines: list[bytes]) -> bool:
    """Whether each of ``lines`` (``data``: joined by newlines), blank space about it aside,
    runs from a "{" to a "}": msgspec reads values apart by any whitespace, so a line cut
    short could read on into the next stream's first line, a line of two values making the
    count come out right; an object that ends its line and one that starts the next are
    never one value.  (A line that does not goes the way that reads each stream alone.)"""
    u8 = np.frombuffer(data, np.uint8)
    nl = np.flatnonzero(u8 == 10)
    if nl.shape[0] != len(lines) - 1:
        return False
    starts = np.r_[0, nl + 1]
    ends = np.r_[nl, u8.shape[0]]
    odd = ends <= starts  # (an empty line; the rest looked at by their first and last bytes)
    odd[~odd] = (u8[starts[~odd]] != ord("{")) | (u8[ends[~odd] - 1] != ord("}"))
    for j in np.flatnonzero(odd).tolist():  # (blank space about it, or no object)
        line = lines[j].strip()
        if not (line[:1] == b"{" and line[-1:] == b"}"):
            return False
    return True


def validate_events(objs: Iterable[Any], rank: int | None = None) -> tuple[list[dict], Counter]:
    """Validate events that are already Python objects (Flight Recorder imports, expanded
    blocks) against the same schema; returns (valid events, invalid counts by reason)."""
    invalid: Counter = Counter()
    good = []
    convert = msgspec.convert
    for obj in objs:
        try:
            good.append(visible_event(convert(obj, RawEvent)))
        except RecursionError:
            invalid["event: nested too deeply"] += 1
        except msgspec.ValidationError as exc:
            kind = "event"
            if isinstance(obj, dict):
                kind = str(obj.get("type"))[:24]
                if kind == "op":
                    kind += " " + str(obj.get("phase"))[:24]
            invalid[reason_of(exc, kind)] += 1
    return _sift(good, rank, invalid), invalid


def decode_job(data: bytes) -> tuple[dict | None, str | None]:
    """Job metadata from ``job.json``; (None, reason) when it is damaged or invalid."""
    try:
        job = visible_event(_JOB_DECODER.decode(data))
        for key, value in job.items():  # (copied_from, host, backend ...: shown and copied)
            if isinstance(value, str) and key != "job":
                job[key] = redact(value)
        return job, None
    except RecursionError:
        return None, "job metadata: nested too deeply"
    except msgspec.ValidationError as exc:
        m = _FIELD.search(str(exc))
        return None, f"job metadata: bad {m.group(1) if m and m.group(1) else 'document'}"
    except (msgspec.DecodeError, UnicodeDecodeError):
        return None, "job metadata: not JSON"
