"""Binary op blocks: how the native recorder packs op events, and how readers unpack them.

Schema version 3 makes every block self-describing: the signatures, call sites and groups
its records refer to are restated as table records (SIG, SITE, GROUP) at its head, so any
suffix of a stream decodes on its own (a trimmed, restarted or recreated store loses only
what it lost), and the block carries the ring positions of its records (``pos``, ``end``),
so a reader keeps each record once when a dead rank's last records are forwarded again
from its spool (``commscope.store.spool``).

Schema version 2 adds three event types to the JSONL/stream trace (see ``events``):

    block   data (base64 of packed records), n (records)
    site    sid (id), text ("file:line in function"): a call site, before the blocks using it
    group   (as in version 1) plus gid, the id blocks use for the group

and two ``meta`` fields, ``names`` (wrapper op names by id) and ``dtypes`` (c10 type
names by ScalarType code), so a block never depends on this module's defaults.

A block holds the records one rank's native recorder appended since the last tick (its
layout is ``record/native/layout.h``'s, little-endian, packed).  Each record starts with

    u8 type, u8 flags, u16 aux, u32 len (whole record), i64 ts, u64 id

``BlockDecoder`` turns records into ordinary schema op events (``begin``/``end``/
``wait_begin``/``wait_end``/``done``), so everything after the reader is unchanged.  One
decoder per rank, fed that rank's events in order: it keeps the site and group tables.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import functools
import operator
import struct
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import msgspec
import numpy as np
import orjson

from commscope import beatscan, blockscan, compiled, dtypes, optable, schema
from commscope.events import Decoded, decode_lines, signature_key
from commscope.oprecords import (
    F_APPROX,
    F_GPU,
    F_SOURCE,
    F_UNISSUED,
    PH_BEGIN,
    PH_DONE,
    PH_END,
    PH_WAIT_BEGIN,
    PH_WAIT_END,
    OpRecords,
    Spans,
    Static,
    concat,
    merged,
)
from commscope.redact import mask, redact
from commscope.schema import MAX_INT, SCHEMA_VERSION
from commscope.visible import visible, visible_event

BLOCK = "block"
SITE = "site"

# Record types
BEGIN, END, WAIT_BEGIN, WAIT_END, DONE, RBEGIN, SOURCE, SIG, BEGIN_SIG = 1, 2, 3, 4, 5, 6, 7, 8, 9
# Table records (version 3): restated at the head of every block that refers to them.
SITE_REC, GROUP_REC, META_REC, EVENT_REC = 10, 11, 12, 13
TABLE_RECORDS = frozenset({SIG, SITE_REC, GROUP_REC, META_REC, EVENT_REC})
# Begin roles (record/native/layout.h's ``Role``: not the model's op flags of similar names)
ROLE_TOP, ROLE_MERGED, ROLE_ANNOTATED, ROLE_NESTED, ROLE_CHILD, ROLE_LOGICAL = range(6)
# Record flags (record/native/layout.h's ``Flag``)
FLAG_ERROR, FLAG_APPROX, FLAG_ASYNC, FLAG_ENDS_AT_COMPLETION = 1, 2, 4, 8
#: An END's: the backend refused the op as it was called, so it took no sequence number (its
#: begin says seq -1 unless a drain had taken the begin before it raised; docs/recorder.md)
FLAG_UNISSUED = 16
# Begin directions (header aux)
_DIRS = (None, "send", "recv", "recv")
# Logical-op kinds (RBEGIN header aux)
KIND_PLAIN, KIND_ANNOTATE, KIND_RICH, KIND_CONTAINER = range(4)

HEADER = struct.Struct("<BBHIqQ")
BEGIN_BODY = struct.Struct("<QQiiiiqiihBbHHIIqq")
DONE_BODY = struct.Struct("<q")
SOURCE_BODY = struct.Struct("<iq")
RBEGIN_BODY = struct.Struct("<QQiiqH")
SIG_BEGIN_BODY = struct.Struct("<IqQQ")
#: A BeginBody's (a SIG record's) site and group ids, 20 bytes into it (``BEGIN_BODY``)
_SITE_GROUP = struct.Struct("<i4xi")
_U16 = struct.Struct("<H")

#: The c10d operators the native recorder observes, in opcode order, with the name of the
#: torch.distributed function that issues each (the name ops get when no wrapped call
#: names them, e.g. DDP's all-reduces).
C10D_OPS: tuple[tuple[str, str], ...] = tuple((c.operator, c.name) for c in optable.C10D)

#: Reduce ops by c10d::ReduceOp::RedOpType.
REDOPS = ("sum", "avg", "product", "min", "max", "band", "bor", "bxor", "premul_sum", "unused")

#: Ops whose reduce op is "sum" when none is recorded (as the Python recorder writes it).
REDUCING = optable.REDUCING


#: Why the decoder counts records of a block it read invalid (``BlockDecoder.invalid``): the
#: block's line was read and its ring positions taken, so it leaves no gap.  A ``block`` line
#: the schema refused (``block: bad data``) never reached the decoder and leaves one
#: (``gaps_not_counted``)
NOT_BASE64 = "block: not base64"
TRUNCATED_RECORD = "block: truncated record"
BAD_TABLE_RECORD = "block: bad table record"
UNKNOWN_RECORD = "block: unknown record"
BAD_RECORD = "block: bad record"
DECODER_REASONS = frozenset({NOT_BASE64, TRUNCATED_RECORD, BAD_TABLE_RECORD, UNKNOWN_RECORD, BAD_RECORD})

#: How every encoded ``block`` line starts (``encode_block`` and record/native/drain.h's
#: ``drain_block`` write the same template).
LINE_PREFIX = b'{"type":"block",'


def encode_block(data: bytes, rank: int, ts: int, count: int, pos: int | None = None, end: int | None = None) -> bytes:
    """One ``block`` event as a JSON line (without newline); ``pos``/``end``: the ring
    positions of its records (version 3)."""
    where = b'"pos":%d,"end":%d,' % (pos, end) if pos is not None and end is not None else b""
    return LINE_PREFIX + b'"v":%d,"rank":%d,"ts":%d,"n":%d,%s"data":"%s"}' % (
        SCHEMA_VERSION, rank, ts, count, where, base64.b64encode(data))


def _head_count(line: bytes, key: bytes) -> int | None:
    """A count the fixed prefix of an encoded block event says (``key``: ``b'"n":'``,
    ``b'"pos":'``), before its data; None if it says none, or the line is another event."""
    if not line.startswith(LINE_PREFIX):
        return None
    head = line[:160]
    at = head.find(key)
    if at < 0:
        return None
    digits = head[at + len(key):].split(b",", 1)[0]
    return int(digits) if digits.isdigit() else None


def records_in_line(line: bytes) -> int:
    """The ``n`` of an encoded block event (0 if it cannot be read, or is another event)."""
    return _head_count(line, b'"n":') or 0


def block_pos(line: bytes) -> int | None:
    """The ring position an encoded block event's records start at (None: it says none)."""
    return _head_count(line, b'"pos":')


#: Records whose body is a u16-length text (an error message, a call site).
_TEXT_RECORDS = frozenset({END, WAIT_END, SITE_REC})


def mask_texts(data: bytes) -> bytes:
    """Packed records with the credentials in their texts (error messages, call sites)
    masked in place (``redact.mask``): no record changes length, so ring positions and
    counts hold."""
    out: bytearray | None = None
    off, size = 0, len(data)
    while off + HEADER.size <= size:
        typ, _flags, _aux, length = HEADER.unpack_from(data, off)[:4]
        if length < HEADER.size or off + length > size:
            break
        body = off + HEADER.size
        if typ in _TEXT_RECORDS and body + 2 <= off + length:
            n = min(_U16.unpack_from(data, body)[0], off + length - body - 2)
            text = bytes(data[body + 2:body + 2 + n])
            hidden = mask(text)
            if hidden != text:
                if out is None:
                    out = bytearray(data)
                out[body + 2:body + 2 + n] = hidden
        off += length
    return data if out is None else bytes(out)


def mask_line(line: bytes) -> bytes:
    """An encoded ``block`` line (``encode_block``, the native drain) with ``mask_texts``
    applied to its records; any other line unchanged."""
    at = line.find(b'"data":"')
    if not line.startswith(LINE_PREFIX) or at < 0 or not line.endswith(b'"}'):
        return line
    try:
        data = base64.b64decode(line[at + 8:-2], validate=True)
    except (binascii.Error, ValueError):
        return line
    hidden = mask_texts(data)
    return line if hidden is data else line[:at + 8] + base64.b64encode(hidden) + b'"}'


def count_records(data: bytes) -> int:
    n = off = 0
    size = len(data)
    while off + HEADER.size <= size:
        length = HEADER.unpack_from(data, off)[3]
        if length < HEADER.size:
            break
        off += length
        n += 1
    return n


class GroupEntry(NamedTuple):
    """A group as a rank's ``group`` event describes it, by the id its blocks use."""

    name: str
    granks: list[int] | None  # global ranks by group rank; None when the event had none (or bad ones)


#: A GROUP record's member count that says runs follow: (start, stride, length) triples
#: (``pack_group``), so a group of 16k ranks restated in every block costs 12 bytes, not 64k.
RUNS = -2
_TYPE_LEN = struct.Struct("<BxxxI")
_FLAGS_AUX = struct.Struct("<BH")
#: base64 to bytes, refusing anything else (strict where Python can: 3.11 and later)
_b64 = functools.partial(binascii.a2b_base64, strict_mode=True) if sys.version_info >= (3, 11) else \
    functools.partial(base64.b64decode, validate=True)
PER_CALL = ("type", "ts", "phase", "id", "rank", "tid", "seq", "parent", "v")  # an event's keys no static holds
_NO_STATIC = -1  # sid -> static index: not defined
_NEVER = 1 << 62  # sid -> since: never defined
_BAD_STATIC = -2  # defined, but its fields are invalid: every record of it is invalid


class _Walk:
    """The op records of a run of blocks, gathered while walking them (``BlockDecoder``):
    their offsets in the joined buffers, those of the blocks walked record by record one by
    one (``offs``), those of the blocks a scan hands over as they are in arrays (``runs``,
    ``add``: a Python int a record, there and back, cost a stream's read ~35 us)."""

    __slots__ = ("bufs", "offs", "runs", "in_runs", "unchecked", "where", "base", "current", "want_where", "own")

    def __init__(self, want_where: bool = False) -> None:
        self.want_where = want_where
        self.own = False  # a gathered record refers to sites and groups itself (``_has_own_fields``)
        self.bufs: list[bytes | memoryview] = []
        self.offs: list[int] = []  # offsets of op records in the joined buffers, gathered after ``runs``
        self.runs: list[np.ndarray] = []  # offsets gathered before ``offs``, in order
        self.in_runs = 0  # the records in ``runs``
        self.unchecked: list[tuple[np.ndarray, np.ndarray]] = []  # runs not looked at for ``own``: (bytes, offsets)
        self.where: list[tuple[int, int]] = []  # (records so far, event position) per block
        self.base = 0  # where the next block's buffer starts in the joined buffers
        self.current = b""  # the block being walked

    def count(self) -> int:
        """The op records gathered."""
        return self.in_runs + len(self.offs)

    def add(self, offsets: np.ndarray, raw: np.ndarray, at: np.ndarray) -> None:
        """A run of op records gathered at once: ``offsets`` in the joined buffers, their
        types at ``at`` of ``raw`` (looked at for ``own`` only when asked)."""
        if self.offs:
            self.runs.append(np.array(self.offs, np.int64))
            self.in_runs += len(self.offs)
            self.offs.clear()
        self.runs.append(offsets)
        self.in_runs += offsets.shape[0]
        if not self.own:
            self.unchecked.append((raw, at))

    def offsets(self) -> np.ndarray:
        """Every op record gathered, in order, as one array."""
        if not self.runs:
            return np.array(self.offs, np.int64)
        parts = (self.runs + [np.array(self.offs, np.int64)]) if self.offs else self.runs
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def clear(self) -> None:
        """Nothing gathered (``BlockDecoder._flush``)."""
        self.bufs.clear()
        self.offs.clear()
        self.runs.clear()
        self.unchecked.clear()
        self.where.clear()
        self.in_runs = self.base = 0
        self.own = False


class Learnt(NamedTuple):
    """What walking a table prefix record by record taught a decoder whose tables stood in a
    given state (``StaticTable.learnt``): another stream's decoder in that state replays it
    instead of walking the prefix again (every rank of a job states the same few prefixes
    in the same order: their walks were ~8% of a whole read's worker).  Only additions:
    a prefix that changes or forgets an entry is walked each time."""

    sigs: tuple[tuple[int, bytes], ...]  # new signatures: (id, SIG record)
    refs: tuple[tuple[int, int], ...]  # (SITE_REC, id) and (GROUP_REC, id) they refer to
    defined: tuple[tuple[int, int], ...]  # (SITE_REC or GROUP_REC, id) of the new sites and groups
    sites: tuple[tuple[int, str], ...]  # new sites: (id, text)
    groups: tuple[tuple[int, GroupEntry, str], ...]  # new groups: (id, entry, backend), in order
    records: tuple[bytes, ...]  # the records now in effect
    referred: bool  # a new site or group was one a signature refers to (``_define`` resolves first)
    after: int  # the tables' state after it


class _Learning:
    """What a walk of a table prefix learns, noted as it goes (``Learnt``)."""

    __slots__ = ("sigs", "refs", "defined", "sites", "groups", "records", "referred")

    def __init__(self) -> None:
        self.sigs: list[tuple[int, bytes]] = []
        self.refs: list[tuple[int, int]] = []
        self.defined: list[tuple[int, int]] = []
        self.sites: list[tuple[int, str]] = []
        self.groups: list[tuple[int, GroupEntry, str]] = []
        self.records: list[bytes] = []
        self.referred = False


class StaticTable:
    """The distinct begins a reader decoded, shared by its streams' decoders: every rank of
    a job restates the same few signatures, decoded (validated, keyed) once for all of
    them.  A static is found by its begin bytes and by what they resolve to in the stream's
    tables (op name, group name, global peer and root, call site, dtype table), so two
    streams share one only when it decodes the same in both."""

    def __init__(self) -> None:
        self.statics: list[Static] = []
        self.peer = np.zeros(64, np.int32)  # each static's global peer (-1: none), for begins at once
        self.any_source = np.zeros(64, bool)  # whether it is an any-source recv (its peer comes later)
        self._index: dict[tuple, int] = {}
        self._dtypes: dict[tuple[str, ...], int] = {}
        self._torch_names: dict[tuple[str, ...], list[str]] = {}
        self._texts: list[list[str]] = []  # lists of strings checked (``texts``), the last few
        self._codes_named: list[str] | None = None  # the last list ``torch_names`` was asked of ...
        self._named: list[str] = []  # ... and its answer
        self._groups: dict[bytes, tuple[GroupEntry, str]] = {}
        self._members: dict[tuple, list[int]] = {}  # a group's members -> the one list (``members``)
        self._members_held = 0
        self._member_ids: dict[int, list[int]] = {}  # id(members ``members`` gave) -> them
        self._run_members = 0  # members expanded out of runs, all groups (see schema.MAX_RUN_MEMBERS)
        self._once: dict[bytes, bool] = {}  # table prefix -> ``_states_once``
        self._once_bytes = 0
        self._learnt: dict[tuple[int, bytes], Learnt] = {}  # (tables' state, prefix) -> what it taught
        self._learnt_bytes = 0
        self._states = 0  # the last state numbered (0: a new decoder's empty tables)
        self._names: dict[tuple[str, ...], int] = {}
        self._tokens = 0  # the next number ``_token`` gives
        self._sid_statics: dict[tuple[int, int, int, int], tuple[int, tuple[tuple[int, int], ...]]] = {}

    #: The bytes of table prefixes whose ``states_once`` is kept (a job's ranks restate a few
    #: hundred of a few hundred bytes each)
    ONCE_KEPT = 256 << 10

    def states_once(self, prefix: bytes) -> bool:
        """``_states_once`` of a table prefix, worked out once per distinct prefix for all the
        streams (each of 4k asked it of the same few at its first blocks: 2-3% of a live
        poll's first round)."""
        got = self._once.get(prefix)
        if got is None:
            got = _states_once(prefix)
            if len(prefix) <= self.ONCE_KEPT:
                if self._once_bytes + len(prefix) > self.ONCE_KEPT:
                    self._once.clear()  # (only costs working them out again)
                    self._once_bytes = 0
                self._once[prefix] = got
                self._once_bytes += len(prefix)
        return got

    #: The bytes of prefixes whose walks are kept (``learnt``), as for ``states_once``
    LEARNT_KEPT = 256 << 10

    def learnt(self, state: int, prefix: bytes) -> Learnt | None:
        """What ``prefix`` taught a decoder whose tables were in ``state``, if one walked it."""
        return self._learnt.get((state, prefix))

    def learn(self, state: int, prefix: bytes, learning: _Learning) -> int:
        """Keep what walking ``prefix`` from tables in ``state`` taught (``learning``); the
        number of the state it left them in.  Every state is numbered once: two decoders
        with one number hold the same tables between walks, as both got there by the same
        walks from empty tables (``BlockDecoder._state``)."""
        hit = self._learnt.get((state, prefix))
        if hit is not None:  # (walked again where replaying it could not be: the same tables)
            return hit.after
        if learning.records:
            self._states += 1
            after = self._states
        else:  # each record was in effect (or the spool's): the tables stand as they were
            after = state
        got = Learnt(tuple(learning.sigs), tuple(learning.refs), tuple(learning.defined), tuple(learning.sites),
                     tuple(learning.groups), tuple(learning.records), learning.referred, after)
        if len(prefix) <= self.LEARNT_KEPT:
            if self._learnt_bytes + len(prefix) > self.LEARNT_KEPT:
                self._learnt.clear()  # (only costs walking them again, in new states)
                self._learnt_bytes = 0
            self._learnt[state, prefix] = got
            self._learnt_bytes += len(prefix)
        return got.after

    def group_of(self, body: bytes) -> tuple[GroupEntry, str] | None:
        """A GROUP record's body as (entry, backend), parsed once per distinct body (a group
        of 16k ranks restated by 16k streams is one list); raises ValueError when invalid,
        None past the cap on distinct groups."""
        hit = self._groups.get(body)
        if hit is not None:
            return hit
        if len(self._groups) >= 100_000:
            return None
        n = _U16.unpack_from(body, 0)[0]
        name = visible(body[2:2 + n].decode("utf-8", "replace"))
        pos = 2 + n
        nb = _U16.unpack_from(body, pos)[0]
        backend = visible(body[pos + 2:pos + 2 + nb].decode("utf-8", "replace"))
        pos += 2 + nb
        count = struct.unpack_from("<i", body, pos)[0]
        if count == RUNS:
            granks = self._runs(body, pos + 4)
        else:
            granks = list(struct.unpack_from(f"<{count}i", body, pos + 4)) \
                if 0 <= count <= (len(body) - pos - 4) // 4 else None
        if granks and not (min(granks) >= 0 and max(granks) <= schema.MAX_RANK):
            raise ValueError("group ranks")
        if len(name) > schema.MAX_NAME or len(backend) > schema.MAX_NAME:
            raise ValueError("group name")
        hit = self._groups[body] = (GroupEntry(name, granks), backend)
        return hit

    def _runs(self, body: bytes, pos: int) -> list[int]:
        """Members given as runs (``RUNS``): i32 count, then (start, stride, length) each."""
        nruns = struct.unpack_from("<i", body, pos)[0]
        if not 0 <= nruns <= (len(body) - pos - 4) // 12:
            raise ValueError("group runs")
        out: list[int] = []
        for start, stride, length in struct.iter_unpack("<iii", body[pos + 4:pos + 4 + 12 * nruns]):
            if length < 0 or self._run_members + len(out) + length > schema.MAX_RUN_MEMBERS:
                raise ValueError("group runs")
            out.extend(range(start, start + stride * length, stride) if stride else [start] * length)
        self._run_members += len(out)
        return out

    def members(self, value: object) -> list[int] | None:
        """A group event's members (``granks``) where they are a list of ranks, else None;
        checked once per distinct list, and the streams that state the same members share
        one (each stream's group line is decoded into a list of its own: a world of 16k ranks
        in each of 16k streams' carries held ~10 GB).  Read, never written."""
        if not isinstance(value, list):
            return None
        if self._member_ids.get(id(value)) is value:  # (the schema's runs give one list: ``members_of``)
            return value
        try:
            key = tuple(value)
            known = self._members.get(key)
        except TypeError:  # (a member that is no rank: unhashable)
            known, key = None, None
        if known is None:
            if key is None or not all(isinstance(r, int) for r in value):
                return None
            if self._members_held + len(value) > schema.MAX_RUN_MEMBERS:
                self._members.clear()
                self._members_held = 0
            known = self._members[key] = value
            self._members_held += len(value)
        if len(self._member_ids) >= 64:
            self._member_ids.clear()
        self._member_ids[id(known)] = known  # (held: its id not reused meanwhile; one-off lists not kept)
        return known

    def texts(self, value: object) -> list[str] | None:
        """``value`` where it is a list of strings (a meta's op names or dtype codes), else
        None; checked once per distinct list, and the streams that state the same list share
        one (every rank's meta states the same two: 16k ranks each checked ~90 strings in a
        live poll's first round).  Read, never written."""
        if not isinstance(value, list):
            return None
        for known in self._texts:
            if value == known:  # (no value JSON gives is equal to a string but a string)
                return known
        if not all(isinstance(x, str) for x in value):
            return None
        if len(self._texts) >= 8:
            del self._texts[0]
        value = list(value)  # (its own: the event's list goes on to the model)
        self._texts.append(value)
        return value

    def torch_names(self, codes: list[str]) -> list[str]:
        """A meta's dtype codes as torch names, worked out once per distinct list (every
        rank's meta states the same one, ``texts`` gives it as one list); the names are one
        list for all the streams: read, never written."""
        if codes is self._codes_named:
            return self._named
        key = tuple(codes)
        names = self._torch_names.get(key)
        if names is None:
            names = [dtypes.torch_name(x) for x in codes]
            if len(self._torch_names) < 1024:
                self._torch_names[key] = names
        self._codes_named, self._named = codes, names
        return names

    #: Distinct dtype tables and op name lists numbered before the numbering starts afresh
    #: (a hostile store's metas may each state another: memory stays bounded)
    TOKENS_KEPT = 4096

    def dtypes_token(self, table: list[str]) -> int:
        """A number for a dtype table, the same for equal tables while kept: what a static
        was decoded with (``get``, ``add``)."""
        return self._token(self._dtypes, tuple(table))

    def names_token(self, names: list[str]) -> int:
        """A number for a list of op names (a meta's), the same for equal lists while kept:
        what a signature's static was decoded with (``sid_static``)."""
        return self._token(self._names, tuple(names))

    def _token(self, tokens: dict[tuple[str, ...], int], key: tuple[str, ...]) -> int:
        """``key``'s number in ``tokens``; a number is never given twice, so forgetting them
        (past ``TOKENS_KEPT``) only costs decoding again what equal lists share."""
        got = tokens.get(key)
        if got is None:
            if len(tokens) >= self.TOKENS_KEPT:
                tokens.clear()
            got = tokens[key] = self._tokens
            self._tokens += 1
        return got

    def sid_static(self, key: tuple[int, int, int, int]) -> tuple[int, tuple[tuple[int, int], ...]] | None:
        """What a signature id decoded to (``BlockDecoder._static_of_sid``) in a decoder
        whose tables were in a state (``StaticTable.learn``), with op names and dtypes of
        given tokens: (static index, the site and group ids it referred to that the tables
        lacked).  Every rank of a job decodes the same signatures in the same tables."""
        return self._sid_statics.get(key)

    def keep_sid_static(self, key: tuple[int, int, int, int], got: tuple[int, tuple[tuple[int, int], ...]]) -> None:
        """Keep what a signature id decoded to (``sid_static``), up to 100k of them."""
        if len(self._sid_statics) >= 100_000:
            self._sid_statics.clear()  # (only costs decoding them again)
        self._sid_statics[key] = got

    def get(self, key: tuple) -> int | None:
        return self._index.get(key)

    def add(self, key: tuple, static: Static | None) -> int:
        """``static``'s index (None: invalid, remembered as ``_BAD_STATIC``)."""
        if static is None:
            at = _BAD_STATIC
        else:
            at = len(self.statics)
            self.statics.append(static)
            if at >= self.peer.shape[0]:
                self.peer = np.concatenate([self.peer, np.zeros(at + 1, np.int32)])
                self.any_source = np.concatenate([self.any_source, np.zeros(at + 1, bool)])
            self.peer[at] = static.peer
            self.any_source[at] = static.any_source_gid is not None
        self._index[key] = at
        return at


#: The dtype table a stream has until its meta says otherwise (torch names by c10 code).
_DTYPES = tuple(dtypes.torch_name(n) for n in dtypes.CODES)


class BlockDecoder:
    """Decodes one stream's blocks into ``OpRecords`` columns; keeps that stream's tables
    (signatures, sites, groups, op names, dtypes) and the ring position read up to."""

    def __init__(self, rank: int = 0, table: StaticTable | None = None) -> None:
        self.rank = rank
        self.table = table if table is not None else StaticTable()
        self.seen_end = 0  # ring position after the last record decoded (version 3 blocks)
        #: A block past ``seen_end`` is a gap in the ring positions (records lost with a line
        #: of the stream), noted in ``gaps`` (bytes each) where a reader asks (``counts_gaps``:
        #: one whose store says no other way that a line went, a directory); not while the
        #: ring is ``ring_open`` (the read starts here, or jumped over what the store deleted
        #: and counted; a carry that says where the ring was closes it there,
        #: ``inflight.RingEnd``), nor up to ``_bad_end`` (a block that could not be decoded,
        #: counted)
        self.counts_gaps = False
        self.gaps: list[int] = []
        self.ring_open = True
        #: The read starts at the stream's first line (a reader that knows says so): a meta's
        #: ``ring`` then closes the ring where the stream's first block starts, so a first
        #: block line gone is a gap too (a meta restated later in the stream says nothing)
        self.from_start = False
        self._bad_end = 0
        self.duplicates = 0  # records skipped because an earlier block held them
        self.sites: dict[int, str] = {}
        self.groups: dict[int, GroupEntry] = {}
        self.names: list[str] | None = None
        self.dtypes: list[str] = list(_DTYPES)
        self._token_of: list[str] | None = None  # the ``dtypes`` list ``_dtypes_token`` was worked out for
        self._dtypes_token = -1
        self._names_token = -1  # ``names``' (``StaticTable.names_token``; -1: none)
        self.c10d_names = [n for _, n in C10D_OPS]
        self.invalid: Counter = Counter()  # records (or whole blocks) that could not be decoded, by reason
        #: Every distinct begin decoded so far (``OpRecords.static`` indexes it; only grows)
        self.statics: list[Static] = self.table.statics
        self._static_at: dict[bytes, int] = {}  # a begin's static bytes (or fragment key) -> index, _BAD_STATIC
        #: Site and group ids that decoded statics referred to before the tables had them
        self._unresolved: set[tuple[int, int]] = set()
        self._sigs: dict[int, bytes] = {}  # signature id -> its SIG record
        self._sid: dict[int, int] = {}  # signature id -> static index (or _BAD_STATIC), once decoded
        #: signature id -> how many op records this stream had when its SIG record came (a
        #: begin before that names it is invalid, as its SIG record was lost)
        self._sid_since: dict[int, int] = {}
        self._gathered = 0  # op records resolved so far
        self._sig_refs: set[tuple[int, int]] = set()  # (SITE_REC, id) and (GROUP_REC, id) signatures refer to
        self._in_effect: set[bytes] = set()  # table records restating only what is known: skipped
        self._prefixes: set[bytes] = set()  # table prefixes of recent blocks, all in effect (at most 64)
        self._epoch = 0  # how often _prefixes lost entries (``scanned`` asks again after)
        self._gid_of_id: dict[int, int] = {}  # any-source recvs waiting for their source
        #: The state of the tables (signatures, sites, groups, records in effect and the ids
        #: signatures refer to) as ``StaticTable.learn`` numbers it, while they only changed
        #: by walks of whole table prefixes from empty; None once anything else changed them.
        #: During a walk it names the tables as they were before it (``_learning`` is set)
        self._state: int | None = 0
        self._learning: _Learning | None = None  # what the prefix being walked teaches

    # -- tables, from the rank's other events
    def note(self, ev: dict) -> bool:
        """Learn from a non-block event of this rank (site, group, meta); whether the tables
        changed (begins decoded before must then be resolved first: ``decode`` does)."""
        typ = ev.get("type")
        if typ == SITE:
            sid, text = ev.get("sid"), ev.get("text")
            if isinstance(sid, int) and isinstance(text, str) and self.sites.get(sid) != text:
                self._state = None
                changed = self._define(SITE_REC, sid, sid in self.sites)
                self.sites[sid] = text
                return changed
        elif typ == "group":
            gid = ev.get("gid")
            if isinstance(gid, int):
                granks = self.table.members(ev.get("granks"))
                if granks is not None:
                    ev["granks"] = granks  # (the streams' one list: a batch of them pickled once)
                entry = GroupEntry(str(ev.get("group")), granks)
                if self.groups.get(gid) != entry:
                    self._state = None
                    changed = self._define(GROUP_REC, gid, gid in self.groups)
                    self.groups[gid] = entry
                    return changed
        elif typ == "meta":
            ring = ev.get("ring")
            if self.from_start and self.ring_open and ring.__class__ is int and ring >= 0:
                self.seen_end, self.ring_open = ring, False
            self.from_start = False
            changed = False
            names = self.table.texts(ev.get("names"))
            if names is not None and names != self.names:
                self.names = names
                self._names_token = self.table.names_token(names)
                changed = True
            codes = self.table.texts(ev.get("dtypes"))
            if codes is not None:
                table = self.table.torch_names(codes)
                if table != self.dtypes:
                    self.dtypes = table
                    changed = True
            if changed:
                self._forget()
            return changed
        return False

    def _forget(self) -> None:
        """The tables changed: begins decode anew (what they decoded to may differ now)."""
        self._static_at.clear()
        self._sid.clear()

    def _define(self, typ: int, key: int, replaces: bool, walk: _Walk | None = None,
                before: Callable[[], None] | None = None) -> bool:
        """A site or group is about to be (re)defined: whether that changes what begins
        decode to.  Begins decode with the tables as they stood at the begin, so what was
        gathered and may refer to this one is resolved first (``before``): everything when
        one replaces another, else when a signature refers to it or a begin that carries
        its own fields was gathered.  A new one changes nothing decoded unless a begin
        referred to it before it was known."""
        if replaces:
            if before is not None:
                before()
            self._superseded()
            self._forget()
            return True
        if before is not None and walk is not None and walk.count() and (
                (typ, key) in self._sig_refs or _has_own_fields(walk)):
            before()
        if (typ, key) in self._unresolved:
            self._unresolved.discard((typ, key))
            self._forget()
            return True
        return False

    def _superseded(self) -> None:
        """A table entry changed: the records that restated the old one no longer restate
        what is in effect (all are forgotten: changes are rare, restatements common)."""
        self._in_effect.clear()
        self._prefixes.clear()
        self._epoch += 1
        self._state = None

    def adopt(self, names: list[str] | None, dtypes: list[str], seen_end: int, groups: dict[int, GroupEntry],
              sites: dict[int, str], waiting: dict[int, int]) -> None:
        """Go on from where another reader's decoder of this stream stopped (its op names,
        dtypes, ring position, groups, sites and any-source recvs waiting)."""
        self.names, self.dtypes, self.seen_end = names, dtypes, seen_end
        self.ring_open = not seen_end
        self._names_token = self.table.names_token(names) if names is not None else -1
        self.groups, self.sites, self._gid_of_id = groups, sites, waiting
        self._state = None

    def _table(self, typ: int, raw: bytes, off: int, length: int, events: list[dict], ts: int, walk: _Walk,
               parts: list[OpRecords]) -> None:
        """A table record: remembered; what ``walk`` gathered before it is resolved first when
        it changes what begins decode to (a restatement that changes nothing costs a compare)."""

        def before() -> None:
            if walk.count():
                self._flush(walk, parts, carry=walk.current)

        _t, flags, aux, _len, _ts, key = HEADER.unpack_from(raw, off)
        if key > MAX_INT:
            return
        body, end = off + HEADER.size, off + length
        learning = self._learning
        if typ == SIG:
            if key > 0xFFFFFFFF:
                return  # no begin can name it (a BEGIN_SIG's id is 32 bits)
            rec = raw[off:end]
            old = self._sigs.get(key)
            if old == rec or (old is None and len(self._sigs) >= 200_000):
                return
            if old is not None:
                before()  # begins of the old signature resolve with it
                self._superseded()
            else:  # begins before this record that name it are invalid (its SIG record was lost)
                self._sid_since[key] = self._gathered + walk.count()
            if length >= HEADER.size + 32:  # the site and group it refers to are watched for
                site, gid = _SITE_GROUP.unpack_from(raw, body + 20)
                refs = ((SITE_REC, site), (GROUP_REC, gid))
                self._sig_refs.update(refs)
                if learning is not None:
                    learning.refs.extend(refs)
            self._sigs[key] = rec
            self._sid.pop(key, None)
            if learning is not None:
                learning.sigs.append((key, rec))
        elif typ == SITE_REC:
            if end - body < 2:
                raise ValueError("site record")
            n = min(_U16.unpack_from(raw, body)[0], end - body - 2)  # (never read past the record)
            text = visible(redact(raw[body + 2:body + 2 + n].decode("utf-8", "replace")))
            if self.sites.get(key) == text or (key not in self.sites and len(self.sites) >= 200_000):
                return
            self._note_defined(SITE_REC, key)
            self._define(SITE_REC, key, key in self.sites, walk, before)
            self.sites[key] = text
            if learning is not None:
                learning.sites.append((key, text))
        elif typ == GROUP_REC:
            got = self.table.group_of(raw[body:end])
            if got is None:
                return
            entry, backend = got
            if self.groups.get(key) == entry or (
                    key not in self.groups and len(self.groups) >= 100_000):
                return
            self._note_defined(GROUP_REC, key)
            self._define(GROUP_REC, key, key in self.groups, walk, before)
            self.groups[key] = entry
            if learning is not None:
                learning.groups.append((key, entry, backend))
            events.append(self._group_event(key, entry, backend, ts))  # the model learns the group's members from it

    def _group_event(self, gid: int, entry: GroupEntry, backend: str, ts: int) -> dict:
        group = {"type": "group", "ts": ts, "group": entry.name, "gid": gid}
        if entry.granks is not None:
            group["granks"] = entry.granks  # (shared by every stream that has the group: read, never written)
        if backend:
            group["backend"] = backend
        group["v"] = SCHEMA_VERSION
        group["rank"] = self.rank
        return group

    def _note_defined(self, typ: int, key: int) -> None:
        """A site or group about to be defined, noted while a prefix is learnt (whether a
        signature refers to it decides whether ``_define`` resolves what came before)."""
        learning = self._learning
        if learning is not None:
            learning.defined.append((typ, key))
            if (typ, key) in self._sig_refs:
                learning.referred = True

    # -- blocks
    def decode(self, events: list[dict], out: list[dict], where: bool = False) -> OpRecords | None:
        """The op records of the ``block`` events among ``events`` (one stream's, in order)
        as columns; every other event goes to ``out`` in order (``site`` events only teach
        tables), and so do the ``group`` events that GROUP records define.  ``where``: note
        each record's place among ``out`` (``OpRecords.where``).  What cannot be decoded is
        counted in ``invalid``.

        Each block's records are walked in Python (``_block``: a record's length says where
        the next starts), gathering only the offsets of its op records; ``_resolve`` then
        reads their fields for all of them at once.  Table records restating what is known
        cost a set lookup, and a block whose table records repeat a recent block's byte for
        byte skips them with one compare.  A table record that changes something first
        resolves the records gathered before it, with the tables they were written under.
        (``decode_chunk`` finds the common blocks faster, compiled, and walks the rest here.)"""
        parts: list[OpRecords] = []
        walk = _Walk(where)
        for ev in events:
            typ = ev.get("type")
            if typ == BLOCK:
                self._block(ev, None, walk, parts, out)
                continue
            if teaches(ev) and not self._learn(ev, walk, parts):
                continue
            out.append(ev)
        self._flush(walk, parts)
        if not parts:
            return None
        return concat(parts)

    def _learn(self, ev: dict, walk: _Walk, parts: list[OpRecords]) -> bool:
        """An event that teaches the tables (``teaches``), learnt after what ``walk``
        gathered before it is resolved; whether it goes among the events too (a ``site``
        event only teaches)."""
        if walk.count():
            self._flush(walk, parts)
        self.note(ev)
        return ev.get("type") != SITE

    def _block(self, ev: dict, raw: bytes | None, walk: _Walk, parts: list[OpRecords], out: list[dict]) -> None:
        """One ``block`` event walked record by record (``raw``: its data, when decoded)."""
        invalid = self.invalid
        if raw is None:
            try:
                raw = _b64(ev["data"])
            except (binascii.Error, ValueError, TypeError):
                invalid[NOT_BASE64] += 1
                if ev.get("end").__class__ is int:  # (its records counted: no gap after it)
                    self._bad_end = max(self._bad_end, ev["end"])
                return
        offs, wh = walk.offs, walk.where
        append = offs.append
        type_len = _TYPE_LEN.unpack_from
        want_where = walk.want_where
        # Ring positions (version 3): records below seen_end were decoded from an earlier block.
        pos = ev.get("pos")
        skip_below = -1
        if pos.__class__ is int:
            if pos < self.seen_end:
                skip_below = self.seen_end
            elif pos > max(self.seen_end, self._bad_end) and self.counts_gaps and not self.ring_open:
                self.gaps.append(pos - max(self.seen_end, self._bad_end))
            self.ring_open = False
            end = ev.get("end")
            if end.__class__ is int and end > self.seen_end:
                self.seen_end = end
        size = len(raw)
        walk.bufs.append(raw)
        if want_where:
            wh.append((walk.count(), len(out)))
        base = walk.base
        walk.base = base + size
        walk.current = raw
        off = 0
        if size and raw[0] in TABLE_RECORDS:  # the block's table prefix: where does it end?
            while off + 24 <= size:
                typ, length = type_len(raw, off)
                if typ not in TABLE_RECORDS or length < 24 or off + length > size:
                    break
                off += length
            prefix = raw[:off]
            if prefix not in self._prefixes:  # (restated as a recent block did it: nothing to learn)
                off = self._head(raw, ev, walk, parts, out, prefix)  # learnt
                base = walk.base - size  # (a change resolved what came before: offsets restart)
        if skip_below < 0 and not want_where:  # the common case, in its own loop
            while off + 24 <= size:
                typ, length = type_len(raw, off)
                if length < 24 or off + length > size:
                    invalid[TRUNCATED_RECORD] += 1
                    break
                if typ in TABLE_RECORDS:  # (one after the block's op records: rare)
                    self._table_record(typ, raw, off, length, ev, walk, parts, out)
                    base = walk.base - size
                else:
                    append(base + off)
                    if typ in _OWN_TYPES:
                        walk.own = True
                off += length
            return
        while off + 24 <= size:
            typ, length = type_len(raw, off)
            if length < 24 or off + length > size:
                invalid[TRUNCATED_RECORD] += 1
                break
            if typ in TABLE_RECORDS:
                n_out = len(out)
                self._table_record(typ, raw, off, length, ev, walk, parts, out)
                base = walk.base - size
                if want_where and len(out) != n_out:  # a group among the records keeps its place
                    wh[-1] = (wh[-1][0], n_out)
                    wh.append((walk.count(), len(out)))
            elif skip_below >= 0 and pos < skip_below:
                self.duplicates += 1
                pos += length
            else:
                append(base + off)
                if typ in _OWN_TYPES:
                    walk.own = True
                if skip_below >= 0:
                    pos += length
            off += length
        if want_where:
            wh[-1] = (wh[-1][0], len(out))  # the block's records come after the groups it defined

    def scanned(self, s: blockscan.Scan, b0: int, b1: int, walk: _Walk, parts: list[OpRecords],
                out: list[tuple[int, dict]]) -> None:
        """Blocks ``b0`` to ``b1`` (excluded) of a chunk the scanner read (``decode_chunk``),
        as ``_block`` would decode them one by one: those with no bad record, no ring
        overlap and a table prefix in effect hand their op records over as they are; the
        others are walked record by record (the group events they define go to ``out``
        with their block).  Whether a prefix is in effect is asked once per distinct prefix
        and call, at its first block here: the answer holds for its later blocks until a
        walked block changes the tables (``_epoch``); then each block is asked."""
        if b1 <= b0:
            return
        start, pend, pid = s.start[b0:b1], s.prefix_end[b0:b1], s.prefix_id[b0:b1]
        kernel = _plan_kernel()
        plan = (kernel or _plan_numpy)(s.pos, s.end, s.flags, s.prefix_id, b0, b1, self.seen_end,
                                       int(self.ring_open), int(self.counts_gaps))
        plain, upto, asked, seen_end, started = plan
        if started:  # (the read starts at the first block's: ``_block``)
            self.seen_end, self.ring_open = int(seen_end), False
        mv = memoryview(s.raw)
        epoch, a, n = self._epoch, 0, b1 - b0
        for k in asked.tolist():
            prefix = bytes(mv[int(start[k]):int(pend[k])])
            if plain[k] and prefix in self._prefixes:
                continue
            # (a replayed block's records, and the run's before it, go over with the run after
            # it: one hand-over for a stream's first blocks, each of which replays a prefix)
            if not (plain[k] and self._replayed(s, prefix, b0 + k, walk, out, Pending(s, b0 + a, b0 + k))):
                if k > a:
                    self._hand_over(s, mv, b0 + a, b0 + k, walk)
                self._walk_one(s, mv, b0 + k, int(upto[k]), walk, parts, out)
                a = k + 1
            if self._epoch != epoch or (pid[k] >= 0 and prefix not in self._prefixes):
                if a <= k:
                    self._hand_over(s, mv, b0 + a, b0 + k + 1, walk)
                    a = k + 1
                break  # (what was known may not be now, or its later blocks are not: ask each)
        else:
            if n > a:
                self._hand_over(s, mv, b0 + a, b1, walk)
            self.seen_end = max(self.seen_end, int(upto[-1]))
            return
        for k in range(a, n):  # each block asked
            if plain[k] and (pend[k] == start[k] or bytes(mv[int(start[k]):int(pend[k])]) in self._prefixes):
                continue
            if k > a:
                self._hand_over(s, mv, b0 + a, b0 + k, walk)
            if plain[k] and self._replayed(s, bytes(mv[int(start[k]):int(pend[k])]), b0 + k, walk, out):
                self._hand_over(s, mv, b0 + k, b0 + k + 1, walk)
            else:
                self._walk_one(s, mv, b0 + k, int(upto[k]), walk, parts, out)
            a = k + 1
        if n > a:
            self._hand_over(s, mv, b0 + a, b1, walk)
        self.seen_end = max(self.seen_end, int(upto[-1]))

    def _replayed(self, s: blockscan.Scan, prefix: bytes, b: int, walk: _Walk, out: list[tuple[int, dict]],
                  pending: Pending | None = None) -> bool:
        """Block ``b`` of a scan, one with no bad record and no ring overlap, whose table
        prefix (``prefix``, its bytes) is new here: taught by replaying another stream's walk
        of it (``_head``), where one was kept; then its op records go over as they are, not
        walked.  ``pending``: the blocks before it not handed over yet (their records come
        before it)."""
        if self._state is None or walk.want_where or not prefix:
            return False
        defined: list[dict] = []
        if not self._taught(prefix, {"ts": int(s.ts[b])}, walk, defined, pending):
            return False
        out.extend((b, e) for e in defined)
        return True

    def _walk_one(self, s: blockscan.Scan, mv: memoryview, b: int, seen_end: int, walk: _Walk,
                  parts: list[OpRecords], out: list[tuple[int, dict]]) -> None:
        """Block ``b`` of a scan, record by record (``_block``), read after ``seen_end``."""
        ev = {"type": BLOCK, "rank": self.rank, "ts": int(s.ts[b])}
        if s.pos[b] >= 0:
            ev["pos"], ev["end"] = int(s.pos[b]), int(s.end[b])
        self.seen_end = seen_end
        defined: list[dict] = []
        self._block(ev, bytes(mv[int(s.start[b]):int(s.stop[b])]), walk, parts, defined)
        out.extend((b, e) for e in defined)

    @staticmethod
    def _hand_over(s: blockscan.Scan, mv: memoryview, a: int, b: int, walk: _Walk) -> None:
        """Blocks ``a`` to ``b`` (excluded) of a scan, as they are: their bytes join the
        walk's buffers, their op records its offsets."""
        lo, hi = int(s.start[a]), int(s.stop[b - 1])
        walk.bufs.append(mv[lo:hi])
        at = s.ops[s.op_first[a]:s.op_first[b]]
        if at.shape[0]:
            walk.add(at + (walk.base - lo), s.raw, at)
        walk.base += hi - lo

    def _head(self, raw: bytes, ev: dict, walk: _Walk, parts: list[OpRecords], out: list[dict],
              prefix: bytes) -> int:
        """Walk a block's table prefix (its records up to the first op record) record by record,
        learning what they say; note the prefix when all went well (a block that repeats it
        skips it at once); returns where the op records start.  ``prefix``: those records'
        bytes (the caller found where they end): what another stream's decoder learnt from
        them in the same state of the tables is replayed instead (``StaticTable.learnt``)."""
        if self._taught(prefix, ev, walk, out):
            return len(prefix)
        state = self._state
        off, size, ok = 0, len(raw), True
        type_len = _TYPE_LEN.unpack_from
        if state is not None:
            self._learning = _Learning()
        try:
            while off + 24 <= size:
                typ, length = type_len(raw, off)
                if typ not in TABLE_RECORDS:
                    break
                if length < 24 or off + length > size:
                    self._state = None
                    return off  # (the record loop counts it truncated)
                if not self._table_record(typ, raw, off, length, ev, walk, parts, out):
                    ok = False
                off += length
            learning = self._learning
        finally:
            self._learning = None
        if ok and off:
            self._note_prefix(raw[:off])
            if learning is not None and self._state == state:
                self._state = self.table.learn(state, raw[:off], learning)
        elif not ok:
            self._state = None
        return off

    def _taught(self, prefix: bytes, ev: dict, walk: _Walk, out: list[dict], pending: Pending | None = None) -> bool:
        """Whether what another decoder learnt walking ``prefix`` from this one's state of the
        tables was kept, and replayed here (``_replay``)."""
        state = self._state
        if state is None:
            return False
        got = self.table.learnt(state, prefix)
        return got is not None and self._replay(got, prefix, ev, walk, out, pending)

    def _replay(self, got: Learnt, prefix: bytes, ev: dict, walk: _Walk, out: list[dict],
                pending: Pending | None = None) -> bool:
        """What a walk of ``prefix`` from this decoder's state of the tables taught another
        decoder (``got``), taught this one as the walk would: whether it could be (not where
        the walk would resolve the records gathered before it first, nor past the bound on
        records in effect; then the prefix is walked).  ``pending``: records gathered before
        it that the walk does not hold yet (a scan's blocks not handed over)."""
        count = walk.count() + (pending.count() if pending is not None else 0)
        if got.defined and count and (got.referred or _has_own_fields(walk)
                                      or (pending is not None and pending.own_fields())):
            return False
        in_effect = self._in_effect
        if len(in_effect) + len(got.records) > 100_000:
            return False
        since = self._gathered + count
        sigs, known, when = self._sigs, self._sid, self._sid_since
        for key, rec in got.sigs:
            when[key] = since
            sigs[key] = rec
            known.pop(key, None)
        self._sig_refs.update(got.refs)
        if self._unresolved:
            for name in got.defined:
                if name in self._unresolved:  # (``_define``: a begin referred to it before it was known)
                    self._unresolved.discard(name)
                    self._forget()
        self.sites.update(got.sites)
        ts = ev.get("ts", 0)
        for key, entry, backend in got.groups:
            self.groups[key] = entry
            out.append(self._group_event(key, entry, backend, ts))
        in_effect.update(got.records)
        self._state = got.after
        self._note_prefix(prefix)
        return True

    def _table_record(self, typ: int, raw: bytes, off: int, length: int, ev: dict, walk: _Walk,
                      parts: list[OpRecords], out: list[dict]) -> bool:
        """One table record of a block: skipped when it restates what is in effect, else
        learnt (``_table``); whether it was read (a bad one is counted)."""
        if typ >= META_REC:  # (spool-only tables: nothing for a reader to learn)
            return True
        rec = raw[off:off + length]
        in_effect = self._in_effect
        if rec in in_effect:
            return True
        learning = self._learning
        if learning is None:
            self._state = None  # (not a whole prefix's walk: ``_state`` no longer says what the tables hold)
        try:
            self._table(typ, raw, off, length, out, ev.get("ts", 0), walk, parts)
        except (struct.error, ValueError):
            self.invalid[BAD_TABLE_RECORD] += 1
            return False
        if len(in_effect) > 100_000:
            in_effect.clear()  # (only costs reading restatements again)
            self._state = None
        in_effect.add(rec)
        if learning is not None:
            learning.records.append(rec)
        return True

    def _note_prefix(self, prefix: bytes) -> None:
        """A block's table records, all in effect now: a block that starts with the same
        bytes skips them at once.  Not one that states an entry twice (A then B): applied
        again, it would change the tables and back, which skipping it would not say."""
        if prefix in self._prefixes or not self.table.states_once(prefix):
            return
        if len(self._prefixes) >= 64:
            self._prefixes.clear()
            self._epoch += 1
        self._prefixes.add(prefix)

    def _flush(self, walk: _Walk, parts: list[OpRecords], carry: bytes | None = None) -> None:
        """Resolve what ``walk`` gathered into a part.  ``carry``: the block being walked
        goes on (its buffer starts the next walk, so the offsets gathered next stay valid)."""
        n = walk.count()
        if n:
            buf = bytes(walk.bufs[0]) if len(walk.bufs) == 1 else b"".join(walk.bufs)
            part = self._resolve(buf, walk.offsets(), walk.where if walk.want_where else [])
            self._gathered += n
            if part is not None:
                parts.append(part)
        at = walk.where[-1][1] if walk.where else 0
        walk.clear()
        if carry is not None:
            walk.bufs.append(carry)
            walk.where.append((0, at))
            walk.base = len(carry)

    # -- columns
    def _resolve(self, buf: bytes, offs: np.ndarray, where: list[tuple[int, int]]) -> OpRecords | None:
        """The records at ``offs`` of ``buf`` as columns: fixed fields gathered at once,
        begins mapped to statics through their signature ids (``_Fixed``, ``_Rows``); the
        rare records (self-contained or JSON-described begins, errors, sources) one by one."""
        u8 = np.frombuffer(buf, np.uint8)
        c = _Fixed.of(u8, offs)
        typ, lens, phase = c.typ, c.lens, c.phase
        static, seq, parent, tid, peer, flags = c.static, c.seq, c.parent, c.tid, c.peer, c.flags
        k = offs.shape[0]
        rows = self._rows(c)
        exc: dict[int, str] = {}
        for row in rows.errors.tolist():  # (an END's text is read only when it says it has one)
            o, room = int(offs[row]) + HEADER.size, int(lens[row]) - HEADER.size - 2
            if room < 0:
                phase[row] = -1  # says it has a text, and has no room for one
                continue
            n = min(int.from_bytes(buf[o:o + 2], "little"), room)
            exc[row] = visible(redact(buf[o + 2:o + 2 + n].decode("utf-8", "replace"))) or "error"
            if phase[row] == PH_END and c.rflags[row] & FLAG_UNISSUED:  # (its begin's seq withdrawn)
                flags[row] |= F_UNISSUED
        for row in rows.device_errors.tolist():
            exc[row] = "the device reported an error"
        # the rare records one by one, in stream order (a SOURCE sees the any-source begins before it)
        for row in rows.rare.tolist():
            o = int(offs[row])
            r_typ, r_flags, aux, length, r_ts, op_id = HEADER.unpack_from(buf, o)
            body = o + HEADER.size
            if r_typ == BEGIN_SIG:  # an any-source recv's: its peer comes with a SOURCE record
                self._note_any_source(op_id, self.statics[int(static[row])].any_source_gid)
                continue
            if length < _MIN_LEN[r_typ]:
                phase[row] = -1  # (its body is not all there: never read into what follows)
                continue
            try:
                if r_typ == SOURCE:
                    p, s = SOURCE_BODY.unpack_from(buf, body)
                    phase[row] = PH_END
                    src = self._global(self._gid_of_id.get(op_id, -1), p)
                    if src is not None:
                        peer[row] = src
                        flags[row] |= F_SOURCE
                        if 0 <= s <= MAX_INT:
                            seq[row] = s
                    continue
                if r_typ == BEGIN:
                    t, par, s, st = self._begin(buf, body, o + length, flags=r_flags, aux=aux)
                else:
                    t, par, s, st = self._rbegin(buf, body, o + length, aux)
                if par > MAX_INT or s > MAX_INT:
                    raise ValueError("bad begin record")
                phase[row] = PH_BEGIN
                static[row] = st
                seq[row] = s if s >= 0 else -1
                parent[row] = par if par else -1
                tid[row] = t
                peer[row] = self.statics[st].peer
                gid = self.statics[st].any_source_gid
                if gid is not None:
                    self._note_any_source(op_id, gid)
            except (struct.error, ValueError, msgspec.ValidationError, msgspec.DecodeError, IndexError, KeyError,
                    orjson.JSONDecodeError):
                phase[row] = -1
        kept, n_unknown = rows.kept, rows.unknown
        if rows.errors.shape[0] or rows.rare.shape[0]:  # (phases those rows changed: counted again)
            kept, n_unknown = _tally(typ, c.ok, phase)
        if n_unknown:
            self.invalid[UNKNOWN_RECORD] += n_unknown
        bad = k - kept - n_unknown
        if bad:
            self.invalid[BAD_RECORD] += bad
        if not kept:
            return None
        at = None
        if where:  # (only events want it: columns go to the model as they are)
            counts = np.diff(np.array([w for w, _ in where] + [k], np.int64))
            at = np.repeat(np.array([p for _, p in where], np.int64), counts)
        ops = OpRecords(self.rank, phase, c.ts, c.id, static, seq, parent, tid, peer, c.gpu, flags, exc, self.statics,
                        at)
        return ops if kept == k else ops.take(np.flatnonzero(phase >= 0))

    def _rows(self, c: _Fixed) -> _Rows:
        """``c``'s begins through a signature resolved in place (static, seq, parent, tid and
        peer; a begin whose signature is unknown, invalid or stated after it stays invalid),
        and the rows left to ``_resolve`` one by one: compiled in one pass (``_sig_rows``),
        or in numpy calls without numba (``_sig_numpy``)."""
        sid = c.body_sid[c.sig] if c.sig.any() else _NO_SIDS
        distinct = _distinct(sid) if sid.shape[0] else _NO_SIDS
        statics, since = self._statics_of(distinct)
        kernel = _sig_kernel()
        got = (kernel or _sig_numpy)(c.typ, c.rflags, c.ok, c.sig, c.phase, c.static, c.seq, c.parent, c.tid, c.peer,
                                     c.body_sid, c.body_seq, c.body_parent, c.body_tid, distinct, statics, since,
                                     self._gathered, self.table.peer, self.table.any_source)
        errors, device_errors, rare, kept, unknown = got
        return _Rows(errors, device_errors, rare, int(kept), int(unknown))

    def _statics_of(self, distinct: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(static indices, since) of distinct signature ids, in order, each looked up and
        decoded the first time; a static < 0: unknown or invalid.  Memory follows the
        signatures a stream stated, never their ids' values."""
        n = distinct.shape[0]
        statics = np.empty(n, np.int32)
        since = np.empty(n, np.int64)
        known, when = self._sid, self._sid_since
        for k, s in enumerate(distinct.tolist()):  # (in order: statics are numbered as they come)
            got = known.get(s)
            statics[k] = got if got is not None else self._static_of_sid(s)
            since[k] = when.get(s, _NEVER)
        return statics, since

    def _static_of_sid(self, sid: int) -> int:
        """A signature id's static index, decoded now (``_NO_STATIC``: its SIG record was lost,
        as in a trimmed stream; the begins that name it are invalid)."""
        rec = self._sigs.get(sid)
        if rec is None:
            return _NO_STATIC
        # (decoded by another stream's decoder in the same state, maybe; not in the middle
        # of a prefix's walk, which resolves what came before it with some of its records
        # learnt: ``_state`` names the tables as they were before it)
        key = None
        if self._state is not None and self._learning is None:
            if self._token_of is not self.dtypes:
                self._token_of, self._dtypes_token = self.dtypes, self.table.dtypes_token(self.dtypes)
            key = (self._state, self._names_token, self._dtypes_token, sid)
            hit = self.table.sid_static(key)
            if hit is not None:
                static, missing = hit
                if missing:
                    self._unresolved.update(missing)
                self._sid[sid] = static
                return static
        _t, flags, aux, length, _ts, _key = HEADER.unpack_from(rec, 0)
        # a SIG body is a BeginBody (tid, parent and seq left out) followed by the tensors
        got = self._sid[sid] = self._static_index(rec, HEADER.size, length, flags, aux)
        if key is not None:
            self.table.keep_sid_static(key, (got, self._lacks(rec, length)))
        return got

    def _lacks(self, rec: bytes, length: int) -> tuple[tuple[int, int], ...]:
        """The site and group a SIG record refers to that the tables lack (``_static_index``
        notes them as unresolved)."""
        if length - HEADER.size < BEGIN_BODY.size:
            return ()
        site, gid = _SITE_GROUP.unpack_from(rec, HEADER.size + 20)
        lacks = []
        if gid >= 0 and gid not in self.groups:
            lacks.append((GROUP_REC, gid))
        if site >= 0 and site not in self.sites:
            lacks.append((SITE_REC, site))
        return tuple(lacks)

    def _note_any_source(self, op_id: int, gid: int) -> None:
        """An any-source recv: its peer arrives with a SOURCE record."""
        if len(self._gid_of_id) > 100_000:
            self._gid_of_id.clear()
        self._gid_of_id[op_id] = gid

    def _global(self, gid: int, group_rank: int) -> int | None:
        if group_rank < 0:
            return None
        g = self.groups.get(gid)
        granks = g.granks if g else None
        if granks is None:
            return group_rank  # membership unknown: the group rank (right for the default group)
        return granks[group_rank] if group_rank < len(granks) else None

    def _begin(self, raw: bytes, body: int, end: int, *, flags: int, aux: int) -> tuple[int, int, int, int]:
        """A self-contained BEGIN record (written when the signature table is full):
        (tid, parent, seq, static index)."""
        t, par = struct.unpack_from("<QQ", raw, body)
        s = struct.unpack_from("<q", raw, body + 32)[0]
        st = self._static_index(raw, body, end, flags, aux)
        if st < 0:
            raise ValueError("invalid begin fields")
        return t, par, s, st

    def _static_index(self, raw: bytes, body: int, end: int, flags: int, aux: int) -> int:
        """A BeginBody and its tensors as a static index, decoded once per distinct content
        and context (``StaticTable``); _BAD_STATIC when invalid (remembered too)."""
        # Everything but ts/id/seq/parent/tid repeats call after call.
        if end - body < BEGIN_BODY.size:
            return _BAD_STATIC  # too short for a begin: every begin naming it is invalid
        key = _FLAGS_AUX.pack(flags, aux) + raw[body + 16:body + 32] + raw[body + 40:end]
        hit = self._static_at.get(key)
        if hit is not None:
            return hit
        (_tid, _parent, name, site, opcode, gid, _seq, peer, root, redop, role, device, nin, nout,
         _ntin, _ntout, bin_, bout) = BEGIN_BODY.unpack_from(raw, body)
        op = self._op_name(name, role, aux, opcode)
        group = self.groups.get(gid)
        if gid >= 0 and group is None:
            self._unresolved.add((GROUP_REC, gid))
        if site >= 0 and site not in self.sites:
            self._unresolved.add((SITE_REC, site))
        if self._token_of is not self.dtypes:  # (a list replaced, never changed in place)
            self._token_of, self._dtypes_token = self.dtypes, self.table.dtypes_token(self.dtypes)
        context = (key, op, group.name if group else None, self._global(gid, peer), self._global(gid, root),
                   self.sites.get(site), self._dtypes_token)
        hit = self.table.get(context)
        if hit is None:
            try:
                fields, sk = self._static_fields(raw, body + BEGIN_BODY.size, end, flags, aux, op, site, gid,
                                                 peer, root, redop, role, device, nin, nout, bin_, bout)
                hit = self.table.add(context, Static(fields, sk, fields.get("peer", -1),
                                                     gid if aux == 3 and role != ROLE_NESTED else None))
            except (struct.error, ValueError, IndexError, msgspec.ValidationError):
                hit = self.table.add(context, None)  # remembered: every record with these fields is invalid
        if len(self._static_at) > 50_000:
            self._static_at.clear()
        self._static_at[key] = hit
        return hit

    def _op_name(self, name: int, role: int, aux: int, opcode: int) -> str:
        names = self.names
        if name >= 0 and names is not None and name < len(names):
            return names[name]
        if role == ROLE_CHILD and aux in (1, 2):  # the p2p ops of batch_isend_irecv
            return "isend" if aux == 1 else "irecv"
        if 0 <= opcode < len(self.c10d_names):
            return self.c10d_names[opcode]
        return optable.UNNAMED

    def _static_fields(self, raw: bytes, pos: int, end: int, flags: int, aux: int, op: str, site: int,
                       gid: int, peer: int, root: int, redop: int, role: int, device: int, nin: int, nout: int,
                       bin_: int, bout: int) -> tuple[dict, int]:
        f: dict[str, Any] = {"op": op}
        if gid >= 0:
            f["group"] = self.groups[gid].name if gid in self.groups else f"#{gid}"
        p = self._global(gid, peer)
        if p is not None:
            f["peer"] = p
        direction = _DIRS[aux] if aux < len(_DIRS) else None
        if direction:
            f["dir"] = direction
        r = self._global(gid, root)
        if r is not None:
            f["root"] = r
        if 0 <= redop < len(REDOPS):
            f["redop"] = REDOPS[redop]
        elif op in REDUCING:
            f["redop"] = "sum"
        ins, pos = self._tensors(raw, pos, nin)
        outs, pos = self._tensors(raw, pos, nout)
        if pos != end:
            raise ValueError("begin record length")
        if ins is not None:
            f["in_shapes"] = [s for s, _ in ins]
            f["in_dtypes"] = [d for _, d in ins]
            f["in_bytes"] = bin_
        if outs is not None:
            f["out_shapes"] = [s for s, _ in outs]
            f["out_dtypes"] = [d for _, d in outs]
            f["out_bytes"] = bout
        if (flags & FLAG_ASYNC and role == ROLE_MERGED) or role == ROLE_CHILD:  # a batch's p2p ops are isend/irecv
            f["async"] = True
        if site >= 0 and self.sites.get(site):
            f["site"] = self.sites[site]
        if role == ROLE_NESTED:
            f["nested"] = True
        if device >= 0:
            f["device"] = f"cuda:{device}"
        if role == ROLE_TOP:
            f["src"] = "c10d"
        # The same checks as any event's (shape sizes, lengths, ranks), once per signature.
        msgspec.convert(dict(f, type="op", phase="begin", id=0, ts=0), schema.RawEvent)
        static = orjson.dumps(f)
        return f, signature_key(static[1:-1])

    def _tensors(self, raw: bytes, pos: int, n: int) -> tuple[list | None, int]:
        if n == 0:
            return None, pos
        out = []
        dt = self.dtypes
        for _ in range(n):
            code, nd = raw[pos], raw[pos + 1]
            dims = list(struct.unpack_from(f"<{nd}q", raw, pos + 2)) if nd else []
            pos += 2 + 8 * nd
            out.append((dims, dt[code] if code < len(dt) else f"dtype{code}"))
        return out, pos

    def _rbegin(self, raw: bytes, body: int, end: int, kind: int) -> tuple[int, int, int, int]:
        """An RBEGIN record (a begin described by a JSON fragment): (tid, parent, seq, static index)."""
        t, par, site, gid, s, n = RBEGIN_BODY.unpack_from(raw, body)
        if t > MAX_INT:
            raise ValueError("bad tid")
        start = body + RBEGIN_BODY.size
        if start + n > end:
            raise ValueError("fragment past its record")
        nested = bool(par) and s < 0 and kind == KIND_RICH
        key = b"R%d,%d,%d," % (site, gid, nested) + raw[start:start + n]
        hit = self._static_at.get(key)
        if hit is None:
            group = self.groups.get(gid)
            if site >= 0 and site not in self.sites:
                self._unresolved.add((SITE_REC, site))
            if gid >= 0 and group is None:
                self._unresolved.add((GROUP_REC, gid))
            context = (key, group.name if group else None, self.sites.get(site))
            hit = self.table.get(context)
        if hit is None:
            try:
                e = orjson.loads(b"{" + raw[start:start + n] + b"}")
                if not isinstance(e, dict):
                    raise ValueError("fragment")
                for k in PER_CALL:  # (what a record carries per call, never its fragment)
                    e.pop(k, None)
                e.update(type="op", ts=0, phase="begin", id=0, rank=self.rank)
                if gid in self.groups:  # the stream's name for the group (an incarnation's own)
                    e["group"] = self.groups[gid].name
                e = visible_event(msgspec.convert(e, schema.RawEvent))  # a fragment is JSON like any event: checked like one
                for k in PER_CALL:
                    e.pop(k, None)
                if nested:
                    e["nested"] = True
                if site >= 0 and self.sites.get(site):
                    e["site"] = self.sites[site]
                sk = signature_key(orjson.dumps(e)[1:-1])
                peer = e.get("peer", -1)
                hit = self.table.add(context, Static(e, sk, peer if isinstance(peer, int) else -1, None, keyed=False))
            except (ValueError, TypeError, msgspec.ValidationError, orjson.JSONDecodeError):
                hit = self.table.add(context, None)
        if key not in self._static_at:
            if len(self._static_at) > 50_000:
                self._static_at.clear()
            self._static_at[key] = hit
        if hit < 0:
            raise ValueError("invalid begin fields")
        return t, par, s, hit


#: A header and a BEGIN_SIG body as numpy reads them out of gathered bytes (``_gather``)
HEAD_DT = np.dtype([("typ", "u1"), ("flags", "u1"), ("aux", "<u2"), ("len", "<u4"), ("ts", "<i8"), ("id", "<u8")])
SIG_DT = np.dtype([("sid", "<u4"), ("seq", "<i8"), ("parent", "<u8"), ("tid", "<u8")])
_I64 = np.dtype("<i8")
assert HEAD_DT.itemsize == HEADER.size and SIG_DT.itemsize == SIG_BEGIN_BODY.size
_SIG_LEN = HEADER.size + SIG_BEGIN_BODY.size  # (a BEGIN_SIG long enough to read)
#: The phase each fixed-size record type stands for (-1: none), and the length it needs
_PHASE_OF_TYPE = np.full(256, -1, np.int8)
_NEED = np.zeros(256, np.uint32)
for _code, _ph, _need in ((END, PH_END, 24), (WAIT_BEGIN, PH_WAIT_BEGIN, 24), (WAIT_END, PH_WAIT_END, 24),
                          (DONE, PH_DONE, HEADER.size + DONE_BODY.size)):
    _PHASE_OF_TYPE[_code], _NEED[_code] = _ph, _need

#: The shortest a record of each type may be to be read (past it: the next record, or block)
_MIN_LEN = {BEGIN: HEADER.size + BEGIN_BODY.size, RBEGIN: HEADER.size + RBEGIN_BODY.size,
            SOURCE: HEADER.size + SOURCE_BODY.size}
_KNOWN = np.zeros(256, bool)  # record types an op record may have
_KNOWN[[BEGIN, END, WAIT_BEGIN, WAIT_END, DONE, RBEGIN, SOURCE, BEGIN_SIG]] = True


def _states_once(prefix: bytes) -> bool:
    """Whether a table prefix states each entry once (walked twice, one that states A then B
    would change the tables and back)."""
    seen, off = set(), 0
    while off + HEADER.size <= len(prefix):
        typ, _f, _a, length, _ts, key = HEADER.unpack_from(prefix, off)
        if (typ, key) in seen or length < HEADER.size:
            return False
        seen.add((typ, key))
        off += length
    return True


def _has_own_fields(walk: _Walk) -> bool:
    """Whether ``walk`` gathered a record that refers to sites and groups directly, not
    through a signature: a begin that carries its own fields (BEGIN, RBEGIN), or a SOURCE
    (its peer is a group rank).  A record gathered one by one is looked at as it is
    (``BlockDecoder._block``), the runs a scan handed over only when asked, once."""
    if not walk.own and walk.unchecked:
        unchecked = walk.unchecked
        raw = unchecked[0][0]
        if all(x is raw for x, _ in unchecked):  # (one scan's runs, the common case: looked at at once)
            at = unchecked[0][1] if len(unchecked) == 1 else np.concatenate([at for _, at in unchecked])
            walk.own = bool(_OWN_FIELDS[raw[at]].any())
        else:
            walk.own = any(_OWN_FIELDS[raw[at]].any() for raw, at in unchecked)
        unchecked.clear()
    return walk.own


def _plan_numpy(pos: np.ndarray, end: np.ndarray, flags: np.ndarray, prefix_id: np.ndarray, b0: int, b1: int,
                seen_end: int, ring_open: int, counts_gaps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, bool]:
    """``_plan_rows`` in numpy (no numba): the same plan."""
    pos, end = pos[b0:b1], end[b0:b1]
    has = pos >= 0  # (a block of version 3 has both)
    started = bool(ring_open) and bool(has.any())
    if started:
        seen_end = max(seen_end, int(pos[np.argmax(has)]))
    upto = np.maximum.accumulate(np.concatenate([[seen_end], np.where(has, end, -1)]))
    plain = ((flags[b0:b1] & blockscan.BAD) == 0) & ~(has & (pos < upto[:-1]))
    if counts_gaps:  # (a gap, or a start, in the ring positions: ``_block`` decides)
        plain &= ~(has & (pos > upto[:-1]))
    # each prefix's first block here (its first in the chunk may lie before b0, in a run
    # of blocks that a line between changed the tables after)
    firsts = blockscan.prefix_firsts(prefix_id[b0:b1], b0)
    odd = np.flatnonzero(~plain)
    return plain, upto, np.union1d(odd, firsts) if odd.shape[0] else firsts, seen_end, started


_SCAN_BAD = blockscan.BAD


def _plan_rows(pos, end, flags, prefix_id, b0, b1, seen_end, ring_open, counts_gaps):  # type: ignore[no-untyped-def]  # noqa: ANN001, ANN202, E501
    """``BlockDecoder.scanned``'s plan of blocks ``b0`` to ``b1`` of a scan, compiled in one pass
    (~20 numpy calls, ~15 us a stream, in ``_plan_numpy``): which are plain (no bad record, no
    ring overlap, nor a gap where gaps are counted), the ring's end read before each and after
    the last (``upto``), the blocks to ask about in order (those not plain, and each prefix's
    first), the ring's end the read starts from and whether it started here (``ring_open``
    and a block with a ring position)."""
    n = b1 - b0
    plain, upto, asked = np.empty(n, np.bool_), np.empty(n + 1, np.int64), np.empty(n, np.int64)
    top = -1
    for i in range(b0, b1):
        top = max(top, prefix_id[i])
    seen = np.zeros(top + 1, np.bool_)
    started = False
    if ring_open:
        for i in range(b0, b1):
            if pos[i] >= 0:
                seen_end = max(seen_end, pos[i])
                started = True
                break
    u = seen_end
    upto[0] = u
    m = 0
    for j in range(n):
        i = b0 + j
        p = pos[i]
        ok = (flags[i] & _SCAN_BAD) == 0 and not (p >= 0 and (p < u or (counts_gaps != 0 and p > u)))
        plain[j] = ok
        u = max(u, end[i] if p >= 0 else -1)
        upto[j + 1] = u
        q = prefix_id[i]
        first = q >= 0 and not seen[q]
        if q >= 0:
            seen[q] = True
        if first or not ok:
            asked[m] = j
            m += 1
    return plain, upto, asked[:m], seen_end, started


_plan: Callable[..., tuple] | None = None


def _plan_kernel() -> Callable[..., tuple] | None:
    """The compiled ``_plan_rows`` (on first use); None without numba or where
    ``COMMSCOPE_SCAN`` says no (as for the scanner)."""
    global _plan
    if not blockscan.available():
        return None
    if _plan is None:
        _plan = compiled.jit(globals(), ("_plan_rows",), args=(
            "const int64[::1]", "const int64[::1]", "const uint8[::1]", "const int64[::1]",  # pos, end, flags, prefix_id
            "int64", "int64", "int64", "int64", "int64"))  # b0, b1, seen_end, ring_open, counts_gaps
    return _plan


class Pending(NamedTuple):
    """Blocks ``a`` to ``b`` (excluded) of a scan that a decoder has not handed over to its walk
    yet (``BlockDecoder.scanned``): their op records come before the block it decodes now."""

    s: blockscan.Scan
    a: int
    b: int

    def count(self) -> int:
        return int(self.s.op_first[self.b]) - int(self.s.op_first[self.a])

    def own_fields(self) -> bool:
        """Whether one of their records refers to sites and groups itself (``_has_own_fields``)."""
        at = self.s.ops[self.s.op_first[self.a]:self.s.op_first[self.b]]
        return bool(at.shape[0]) and bool(_OWN_FIELDS[self.s.raw[at]].any())


class _Fixed(NamedTuple):
    """Op records' columns as their headers and fixed-size bodies give them: the phases of
    END, WAIT_BEGIN, WAIT_END and DONE (-1 for the rest: begins, sources, bad or unknown
    records), approximate ends, device times, and a BEGIN_SIG's body (``body_*``: zero on the
    other rows); what the rest need their own steps for is left at its default
    (``BlockDecoder._resolve``, ``decode_chunks``).  One compiled pass over the records
    (``_fixed_rows``), or without numba a gather of every header and one of each body."""

    typ: np.ndarray
    rflags: np.ndarray  # the records' own flags (FLAG_*)
    lens: np.ndarray
    ok: np.ndarray  # ts and id in range
    sig: np.ndarray  # a BEGIN_SIG long enough to read
    phase: np.ndarray
    ts: np.ndarray
    id: np.ndarray
    static: np.ndarray
    seq: np.ndarray
    parent: np.ndarray
    tid: np.ndarray
    peer: np.ndarray
    gpu: np.ndarray
    flags: np.ndarray  # F_*
    body_sid: np.ndarray  # a BEGIN_SIG's signature id, its seq, parent and tid as written
    body_seq: np.ndarray
    body_parent: np.ndarray
    body_tid: np.ndarray

    @classmethod
    def of(cls, u8: np.ndarray, offs: np.ndarray) -> _Fixed:
        k = offs.shape[0]
        kernel = _fixed_kernel()
        if kernel is not None:
            typ, rflags, lens, ok, sig, phase, ts, ids, gpu, flags, *body = kernel(u8, offs)
        else:
            typ, rflags, lens, ok, sig, phase, ts, ids, gpu, flags, *body = _fixed_numpy(u8, offs)
        return cls(typ, rflags, lens, ok, sig, phase, ts, ids, _unset(k, np.int32), _unset(k, np.int64),
                   _unset(k, np.int64), np.zeros(k, np.uint64), _unset(k, np.int32), gpu, flags, *body)


def _unset(k: int, dtype: type) -> np.ndarray:
    """``np.full(k, -1, dtype)`` without ``np.full``'s Python (~1.3 us a call, four a stream)."""
    a = np.empty(k, dtype)
    a.fill(-1)
    return a


def _fixed_numpy(u8: np.ndarray, offs: np.ndarray) -> tuple[np.ndarray, ...]:
    """``_fixed_rows`` in numpy (no numba): every header in one gather, ``[k x 24]`` bytes
    viewed as its fields (a record near the end of the buffer is read no further than it:
    its length is >= 24), then the bodies of those that have one."""
    k = offs.shape[0]
    head = _gather(u8, offs, HEAD_DT)
    typ, rflags, lens, ts, ids = head["typ"], head["flags"], head["len"], head["ts"], head["id"]
    ok = (ts >= 0) & (ts <= MAX_INT) & (ids <= MAX_INT)
    phase = np.where(ok & (lens >= _NEED[typ]), _PHASE_OF_TYPE[typ], -1).astype(np.int8)
    flags = np.zeros(k, np.uint8)
    flags[(phase == PH_END) & ((rflags & FLAG_APPROX) != 0)] |= F_APPROX
    gpu = np.zeros(k, np.int64)
    done = np.flatnonzero(phase == PH_DONE)
    if done.shape[0]:
        g = _gather(u8, offs[done] + HEADER.size, _I64)
        good = (g >= 0) & (g <= MAX_INT)
        gpu[done[good]] = g[good]
        flags[done[good]] |= F_GPU
    sig = (typ == BEGIN_SIG) & ok & (lens >= _SIG_LEN)
    sid, seq, parent, tid = np.zeros(k, np.int64), np.zeros(k, np.int64), np.zeros(k, np.uint64), np.zeros(k, np.uint64)
    rows = np.flatnonzero(sig)
    if rows.shape[0]:
        body = _gather(u8, offs[rows] + HEADER.size, SIG_DT)
        sid[rows], seq[rows], parent[rows], tid[rows] = body["sid"], body["seq"], body["parent"], body["tid"]
    return typ, rflags, lens, ok, sig, phase, ts, ids.astype(np.int64), gpu, flags, sid, seq, parent, tid


def _u64(b: np.ndarray, o: int) -> np.uint64:
    """The little-endian 8 bytes at ``b[o:]`` (compiled: one load)."""
    v = np.uint64(0)
    for j in range(8):
        v |= np.uint64(b[o + j]) << np.uint64(8 * j)
    return v


def _fixed_rows(u8, offs):  # type: ignore[no-untyped-def]  # noqa: ANN001, ANN202
    """``_Fixed``'s columns of the records at ``offs``, compiled: one pass, each record's
    header and body read where it lies (what ``_fixed_numpy`` computes, the same way)."""
    k = offs.shape[0]
    typ, rflags = np.empty(k, np.uint8), np.empty(k, np.uint8)
    lens = np.empty(k, np.uint32)
    ok, sig = np.empty(k, np.bool_), np.zeros(k, np.bool_)
    phase = np.empty(k, np.int8)
    ts, ids, gpu = np.empty(k, np.int64), np.empty(k, np.int64), np.zeros(k, np.int64)
    flags = np.zeros(k, np.uint8)
    sid, seq = np.zeros(k, np.int64), np.zeros(k, np.int64)
    parent, tid = np.zeros(k, np.uint64), np.zeros(k, np.uint64)
    for i in range(k):
        o = offs[i]
        t = u8[o]
        typ[i], rflags[i] = t, u8[o + 1]
        n = np.uint32(u8[o + 4]) | (np.uint32(u8[o + 5]) << 8) | (np.uint32(u8[o + 6]) << 16) | (np.uint32(u8[o + 7]) << 24)
        lens[i] = n
        when = np.int64(_u64(u8, o + 8))
        key = _u64(u8, o + 16)
        good = when >= 0 and when <= MAX_INT and key <= np.uint64(MAX_INT)
        ok[i] = good
        ts[i], ids[i] = when, np.int64(key)
        ph = _PHASE_OF_TYPE[t] if good and n >= _NEED[t] else np.int8(-1)
        phase[i] = ph
        if ph == PH_END and (u8[o + 1] & FLAG_APPROX) != 0:
            flags[i] |= F_APPROX
        elif ph == PH_DONE:
            g = np.int64(_u64(u8, o + 24))
            if g >= 0 and g <= MAX_INT:
                gpu[i] = g
                flags[i] |= F_GPU
        elif t == BEGIN_SIG and good and n >= _SIG_LEN:
            sig[i] = True
            sid[i] = np.int64(u8[o + 24]) | (np.int64(u8[o + 25]) << 8) | (np.int64(u8[o + 26]) << 16) | (
                np.int64(u8[o + 27]) << 24)
            seq[i] = np.int64(_u64(u8, o + 28))
            parent[i] = _u64(u8, o + 36)
            tid[i] = _u64(u8, o + 44)
    return typ, rflags, lens, ok, sig, phase, ts, ids, gpu, flags, sid, seq, parent, tid


_fixed: Callable[..., tuple] | None = None


def _fixed_kernel() -> Callable[..., tuple] | None:
    """The compiled ``_fixed_rows`` (``compiled.jit``, on first use); None without numba or
    where ``COMMSCOPE_SCAN`` says no (as for the scanner)."""
    global _fixed
    if not blockscan.available():
        return None
    if _fixed is None:
        _fixed = compiled.jit(globals(), ("_u64", "_fixed_rows"),  # (called: it borrows)
                              args=("const uint8[::1]", "const int64[::1]"))
    return _fixed


class _Rows(NamedTuple):
    """What ``BlockDecoder._rows`` leaves to ``_resolve``: the rows it reads one by one, and
    the counts of records kept (a phase) and of unknown types before it reads them (reading
    one may change its phase: ``_resolve`` then counts again)."""

    errors: np.ndarray  # an END or WAIT_END that says it has an exception text
    device_errors: np.ndarray  # a DONE that says the device failed
    rare: np.ndarray  # a BEGIN, RBEGIN or SOURCE, or an any-source recv's begin, in order
    kept: int
    unknown: int


_NO_SIDS = np.zeros(0, np.int64)


def _distinct(sid: np.ndarray) -> np.ndarray:
    """``np.unique`` of signature ids (int64, not empty), counted where they are small, as a
    recorder numbers them from 0 (a third of ``np.unique``'s time on a stream's few
    hundred begins); small against how many there are, so the count is never much larger."""
    if int(sid.max()) < max(4096, 64 * sid.shape[0]) and int(sid.min()) >= 0:
        return np.bincount(sid).nonzero()[0]
    return np.unique(sid)


def _tally(typ: np.ndarray, ok: np.ndarray, phase: np.ndarray) -> tuple[int, int]:
    """(records with a phase, records of a type no op record has), as ``_sig_rows`` counts."""
    return int(np.count_nonzero(phase >= 0)), int(np.count_nonzero(ok & (phase < 0) & ~_KNOWN[typ]))


def _sig_rows(typ, rflags, ok, sig, phase, static, seq, parent, tid, peer, body_sid, body_seq, body_parent,  # type: ignore[no-untyped-def]  # noqa: ANN001, ANN202, E501
              body_tid, distinct, statics, since, gathered, peer_of, any_source_of):
    """``BlockDecoder._rows``, compiled: one pass over ``_Fixed``'s columns, each begin
    through a signature resolved where it lies (its signature's static looked up among the
    ``distinct`` ids, sorted), the rows left to Python gathered, the kept and unknown counted
    (what its numpy way computes, the same way)."""
    k = typ.shape[0]
    errors, device_errors, rare = np.empty(k, np.int64), np.empty(k, np.int64), np.empty(k, np.int64)
    errors_n = device_n = rare_n = kept = unknown = 0
    for i in range(k):
        t, ph = typ[i], phase[i]
        failed = (rflags[i] & FLAG_ERROR) != 0
        if (ph == PH_END or ph == PH_WAIT_END) and failed:  # noqa: SIM109 (compiled: no tuple)
            errors[errors_n] = i
            errors_n += 1
        elif ph == PH_DONE and failed:
            device_errors[device_n] = i
            device_n += 1
        elif sig[i]:
            j = np.searchsorted(distinct, body_sid[i])
            index, written_seq, written_parent = statics[j], body_seq[i], body_parent[i]
            # (the parent is unsigned: compared as one, never as a float)
            if (index >= 0 and written_seq <= MAX_INT and written_parent <= np.uint64(MAX_INT)
                    and since[j] <= gathered + i):
                phase[i] = PH_BEGIN
                ph = phase[i]  # (not ``ph = PH_BEGIN``: numba's compiler ahead of time types ``ph`` by its first value)
                static[i] = index
                seq[i] = written_seq if written_seq >= 0 else -1
                parent[i] = -1 if written_parent == 0 else np.int64(written_parent)
                tid[i] = body_tid[i]
                peer[i] = peer_of[index]
                if any_source_of[index]:
                    rare[rare_n] = i
                    rare_n += 1
        elif ok[i] and _OWN_FIELDS[t]:
            rare[rare_n] = i
            rare_n += 1
        if ph >= 0:
            kept += 1
        elif ok[i] and not _KNOWN[t]:
            unknown += 1
    return errors[:errors_n], device_errors[:device_n], rare[:rare_n], kept, unknown


def _sig_numpy(typ: np.ndarray, rflags: np.ndarray, ok: np.ndarray, sig: np.ndarray, phase: np.ndarray,
               static: np.ndarray, seq: np.ndarray, parent: np.ndarray, tid: np.ndarray, peer: np.ndarray,
               body_sid: np.ndarray, body_seq: np.ndarray, body_parent: np.ndarray, body_tid: np.ndarray,
               distinct: np.ndarray, statics: np.ndarray, since: np.ndarray, gathered: int, peer_of: np.ndarray,
               any_source_of: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int]:
    """``_sig_rows`` in numpy (no numba): the same columns written, the same rows and counts."""
    failed = (rflags & FLAG_ERROR) != 0
    errors = np.flatnonzero(((phase == PH_END) | (phase == PH_WAIT_END)) & failed)
    device_errors = np.flatnonzero((phase == PH_DONE) & failed)
    rows = np.flatnonzero(sig)
    any_source = _NO_SIDS
    if rows.shape[0]:
        written_seq, written_parent = body_seq[rows], body_parent[rows]
        at = np.searchsorted(distinct, body_sid[rows])
        index = statics[at]
        good = (index >= 0) & (written_seq <= MAX_INT) & (written_parent <= MAX_INT) & (since[at] <= gathered + rows)
        rows, index, written_seq, written_parent = rows[good], index[good], written_seq[good], written_parent[good]
        phase[rows] = PH_BEGIN
        static[rows] = index
        seq[rows] = np.where(written_seq >= 0, written_seq, -1)
        parent[rows] = np.where(written_parent == 0, -1, written_parent.astype(np.int64))
        tid[rows] = body_tid[rows]
        peer[rows] = peer_of[index]
        any_source = rows[any_source_of[index]]
    rare = np.flatnonzero(ok & _OWN_FIELDS[typ])
    if any_source.shape[0]:
        rare = np.union1d(rare, any_source)
    return (errors, device_errors, rare, *_tally(typ, ok, phase))


_sig: Callable[..., tuple] | None = None


def _sig_kernel() -> Callable[..., tuple] | None:
    """The compiled ``_sig_rows`` (on first use); None without numba or where
    ``COMMSCOPE_SCAN`` says no (as for the scanner)."""
    global _sig
    if not blockscan.available():
        return None
    if _sig is None:
        _sig = compiled.jit(globals(), ("_sig_rows",), args=(
            "const uint8[::1]", "const uint8[::1]", "const boolean[::1]", "const boolean[::1]",  # typ, rflags, ok, sig
            "int8[::1]", "int32[::1]", "int64[::1]", "int64[::1]", "uint64[::1]", "int32[::1]",  # what it writes
            "const int64[::1]", "const int64[::1]", "const uint64[::1]", "const uint64[::1]",  # the bodies' fields
            "const int64[::1]", "const int32[::1]", "const int64[::1]", "int64",  # distinct, statics, since, gathered
            "const int32[::1]", "const boolean[::1]"))  # peer_of, any_source_of
    return _sig


def _gather(u8: np.ndarray, at: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """The values of ``dtype`` (little-endian, a record's fields or one integer) at byte
    offsets ``at`` of ``u8``, unaligned: one gather of ``[len(at) x itemsize]`` bytes."""
    return u8[at[:, None] + np.arange(dtype.itemsize)].view(dtype).reshape(-1)


_TYPE = operator.itemgetter("type")  # (every event a reader keeps has one)


def teaches(ev: dict) -> bool:
    """Whether an event (not a block) says something a decoder's tables hold: a site, a
    group with its id, a meta with the op names or dtypes tables, or where the stream's ring
    starts (``BlockDecoder.note``)."""
    typ = ev.get("type")
    return typ == SITE or typ in ("group", "meta") and ("gid" in ev or "names" in ev or "dtypes" in ev
                                                         or "ring" in ev)


def gaps_not_counted(gaps: list[int], got: Decoded, before: int = 0) -> tuple[list[int], int]:
    """Of the gaps a decoder found in a run of a stream's ring positions (``BlockDecoder.gaps``,
    bytes each), those no line counted otherwise stands for, and how many such lines are left
    for the next run's gaps (a block's line damaged at the end of one run leaves its gap in
    the next).  Each stands for one gap: a damaged line, an invalid event but the records the
    decoder refused of a block it read (``DECODER_REASONS``: their line leaves no gap), and
    with a gap in the run, a ``dropped`` event of it that says lines or records went.  A
    ``block`` line the schema refused (``block: bad data``) is such a line: its gap is its.
    ``before``: the lines the run before left.  One rule for a reader's runs
    (``DirectoryReader._account``) and a segment's summary (``inflight.replay``), so a line
    is counted once, read or summarized."""
    lost = got.damaged + sum(n for why, n in got.invalid.items() if why not in DECODER_REASONS)
    if gaps:
        lost += sum(1 for e in got.events if e["type"] == "dropped" and (e.get("count") or e.get("entries")))
    used = min(len(gaps), before + lost)
    return gaps[used:], lost - max(0, used - before)


def decode_stream(got: Decoded, decoder: BlockDecoder, columns: bool) -> Decoded:
    """A reader's decoded batch of one stream with its blocks decoded (their bad records
    counted): as ``OpRecords`` in ``Decoded.ops`` (``columns``), or as op events in stream
    order among the others."""
    events = got.events
    types = set(map(_TYPE, events))  # (one C-level pass)
    if BLOCK not in types and SITE not in types:
        for e in events:  # cheap: only tables matter here
            if teaches(e):
                decoder.note(e)
        return got
    out: list[dict] = []
    ops = decoder.decode(events, out, where=not columns)
    invalid = got.invalid
    if decoder.invalid:
        invalid = Counter(got.invalid)
        invalid.update(decoder.invalid)
        decoder.invalid.clear()
    if columns:
        return Decoded(out, got.damaged, invalid, ops)
    return Decoded(merged(out, ops), got.damaged, invalid)


def decode_chunk(data: bytes, rank: int, decoder: BlockDecoder, scanned: blockscan.Scan | None = None,
                 beats: bool = False) -> Decoded | None:
    """Complete lines of ``rank``'s stream decoded as ``decode_stream(decode_lines(data,
    rank), decoder, columns=True)`` decodes them, the block lines found by the compiled
    scanner (``blockscan``) and the rest as JSON; None where the scanner is not available
    or the chunk is mostly other events.  ``scanned``: the scan of ``data`` already made
    (``decode_chunks`` hands over its scan of each chunk it leaves alone).
    Blocks are decoded in runs between the events that teach the decoder's tables (and
    the blocks the scanner left to JSON); the events keep their line order, the group
    events that blocks define included.  ``beats``: the heartbeat and sample lines that
    ``beatscan`` reads are taken out of the events, as rows (``Decoded.beats``), where no
    other line of the chunk is a heartbeat or a sample."""
    if data.find(LINE_PREFIX, 0, 1 << 16) < 0:  # (JSON events: numba is not even loaded)
        return None
    s = blockscan.scan(data, rank) if scanned is None else scanned
    if s is None or len(s.ts) * 2 < len(s.line_start):  # (mostly JSON events: JSON's way is faster)
        return None
    return decode_scanned(data, s, rank, decoder, beats)


def decode_alone(data: bytes, decoder: BlockDecoder, scanned: blockscan.Scan | None = None,
                 beats: bool = False) -> Decoded:
    """Complete lines of the decoder's stream decoded alone, op records in columns: the
    scanner's way (``decode_chunk``; ``scanned``: its scan, made already), or JSON's where
    that is not available or faster."""
    got = decode_chunk(data, decoder.rank, decoder, scanned, beats)
    return got if got is not None else decode_stream(decode_lines(data, decoder.rank), decoder, columns=True)


def _json_lines(data: bytes, s: blockscan.Scan, rank: int, beats: bool
                ) -> tuple[Decoded, list[int], beatscan.Taken | None]:
    """The lines of a scanned chunk that are not blocks, decoded as JSON: (their events,
    each one's line in the chunk, the heartbeats and samples ``beatscan`` took as rows
    where ``beats`` asks: whether they stay rows, the reader decides for the whole stream)."""
    other = (s.block < 0).nonzero()[0]  # (``nonzero`` of 1-D: ``np.flatnonzero``'s ~2.5 us of Python less a call)
    lo, hi = s.line_start[other], s.line_end[other]
    rows = beatscan.scan(data, lo, hi, rank) if beats and other.shape[0] else None
    taken = np.zeros(other.shape[0], np.bool_) if rows is None else rows.kind != beatscan.OTHER
    lines, line_at = [], []
    rest = (~taken).nonzero()[0]  # (a whole stream's: its meta, most of its heartbeats and samples taken)
    for k, a, b in zip(other[rest].tolist(), lo[rest].tolist(), hi[rest].tolist(), strict=True):
        line = data[a:b]
        if line.strip():
            lines.append(line)
            line_at.append(k)
    got, at = schema.decode_indexed(lines, rank)
    line_of = [line_at[k] for k in at]
    if rows is None or not taken.any():
        return got, line_of, None
    keep = taken.nonzero()[0]
    return got, line_of, beatscan.Taken(beatscan.Rows(rows.kind[keep], rows.ts[keep], rows.inflight[keep],
                                                      rows.values[:, keep]), other[keep], data, lo[keep], hi[keep], [])


def decode_scanned(data: bytes, s: blockscan.Scan, rank: int, decoder: BlockDecoder, beats: bool = False) -> Decoded:
    """``decode_chunk``'s work, given the scan ``s`` of ``data``."""
    is_block = s.block >= 0
    got, line_at, taken = _json_lines(data, s, rank, beats)
    blocks_before = np.cumsum(is_block) - is_block  # blocks on the lines before each
    walk, parts = _Walk(False), []
    out: list[dict] = []
    out_line: list[int] = []  # the line of each event in ``out``
    defined: list[tuple[int, dict]] = []  # (block, group event) of the scanned blocks
    b = 0
    for e, line in zip(got.events, line_at, strict=True):
        typ = e.get("type")
        if typ == BLOCK or teaches(e):
            nb = int(blocks_before[line])
            decoder.scanned(s, b, nb, walk, parts, defined)
            b = nb
            if typ == BLOCK:
                n0 = len(out)
                decoder._block(e, None, walk, parts, out)
                out_line += [line] * (len(out) - n0)
                continue
            if not decoder._learn(e, walk, parts):
                continue
        out.append(e)
        out_line.append(line)
    decoder.scanned(s, b, len(s.ts), walk, parts, defined)
    decoder._flush(walk, parts)
    if defined:  # each among the events at its block's line
        block_line = is_block.nonzero()[0].tolist()
        merged, lines, i = [], [], 0
        for blk, e in defined:
            while i < len(out) and out_line[i] < block_line[blk]:
                merged.append(out[i])
                lines.append(out_line[i])
                i += 1
            merged.append(e)
            lines.append(block_line[blk])
        out = merged + out[i:]
        out_line = lines + out_line[i:]
    invalid = got.invalid
    if decoder.invalid:
        invalid = Counter(got.invalid)
        invalid.update(decoder.invalid)
        decoder.invalid.clear()
    if taken is not None:
        taken = taken._replace(event_lines=out_line)
    return Decoded(out, got.damaged, invalid, concat(parts) if parts else None, taken)


def _first_block(s: blockscan.Scan) -> int:
    """A scan's first block line (-1: none)."""
    return next((line for line, b in enumerate(s.block.tolist()) if b >= 0), -1)


def _lines_before(data: bytes, s: blockscan.Scan, fb: int) -> list[bytes]:
    """The lines of a chunk (``s`` its scan) before line ``fb``, but the blank ones."""
    return [line for line in (data[lo:hi] for lo, hi in zip(s.line_start[:fb].tolist(), s.line_end[:fb].tolist(),
                                                            strict=True)) if line.strip()]


class HeadLines(NamedTuple):
    """A chunk's first block line (-1: none) and the events of the lines before it (None:
    not decoded yet), as ``_heads_decoded`` found them for ``learn_head``."""

    fb: int
    events: Decoded | None


def _heads_decoded(todo: Sequence[tuple[bytes, blockscan.Scan, int]]) -> list[HeadLines]:
    """For chunks ``(data, scan, rank)`` about to learn their heads (``learn_head``), each
    one's first block line and the events of the lines before it, decoded and checked in one
    call for all (``schema.decode_many``: a stream's first chunk starts with its meta, 16k of
    them in a live poll's first round, a call each ~20 us).  Where any of those lines is not
    exactly one valid event of its stream, no chunk's are (each chunk's then decoded alone,
    counting what it skips)."""
    lines: list[bytes] = []
    ranks: list[int] = []
    firsts: list[tuple[int, int]] = []
    for data, s, rank in todo:
        fb = _first_block(s)
        got = _lines_before(data, s, fb) if fb > 0 else []
        lines += got
        ranks += [rank] * len(got)
        firsts.append((fb, len(got)))
    events = schema.decode_many(lines, ranks) if lines else []
    out: list[HeadLines] = []
    at = 0
    for fb, k in firsts:
        out.append(HeadLines(fb, None if events is None else Decoded(events[at:at + k], 0, schema.NO_INVALID)))
        at += k
    return out


class Head(NamedTuple):
    """What ``learn_head`` learnt of a chunk: the events of its lines before its first block
    line and the group events that block's table prefix defined (``decoded``: with what was
    damaged or invalid among those lines), and the chunk from that block's line on
    (``rest``)."""

    decoded: Decoded
    rest: bytes
    scan: blockscan.Scan  # the chunk's
    first: int  # the chunk's first block line, where the rest starts

    def scanned(self) -> blockscan.Scan:
        """The rest's scan, a slice of the chunk's: made only for a rest decoded alone (most
        are decoded together, their scan cut from the poll's, ``blockscan.rests``: slicing
        16k heads' scans cost a live poll's first round ~0.05 s)."""
        s, fb = self.scan, self.first
        at = int(s.line_start[fb])
        if fb == 0 and at == 0:
            return s
        return s._replace(line_start=s.line_start[fb:] - at, line_end=s.line_end[fb:] - at, block=s.block[fb:])


def learn_head(data: bytes, s: blockscan.Scan, decoder: BlockDecoder, ahead: Ahead,
               before: HeadLines | None = None) -> Head | None:
    """Learn now what a chunk (complete lines of the decoder's stream, ``s`` its scan)
    teaches before its first op record: the events on the lines before its first block
    line (a meta with the op names and dtypes; sites; groups), that block's table prefix
    (unless it states an entry twice: the rest walks it) and the later blocks' where that
    is exact (``_learn_later_prefixes``), with the signatures their begins name decoded; so the rest may be
    decoded together with other streams' (``decode_chunks``), as a stream's first chunk
    otherwise never is: it teaches its decoder everything (~200 us a stream alone, in a
    live poll's first round of thousands).

    Decoding the rest after this gives what decoding the whole chunk gives: nothing before
    the first op record depends on an op record, the prefix is what the block's decoding
    would learn first, and a signature is decoded with the tables it would be decoded
    with at its first begin (a change to them after that decodes it anew, ``_forget``).
    A prefix that does not go cleanly (a bad table record) is walked again with the rest,
    its count given back here.  None, with nothing learnt, where the chunk has no block
    line the scanner read or a line before it is a block the JSON path reads.  ``ahead``:
    what it asks of the chunk's op records, worked out with other chunks' (``_ahead``);
    ``before``: its first block line, and the events of the lines before it where they
    were decoded with other chunks' (``_heads_decoded``)."""
    # (lists, not numpy: a head is a few dozen lines, and a numpy call on a few rows costs
    # more than a Python step a line; 16k streams each learn one in a live poll's rounds)
    fb = before.fb if before is not None else _first_block(s)
    if fb < 0:
        return None
    line_start, line_end = s.line_start.tolist(), s.line_end.tolist()
    got = before.events if before is not None and before.events is not None else schema.decode_indexed(
        _lines_before(data, s, fb), decoder.rank)[0]
    if any(e.get("type") == BLOCK for e in got.events):
        return None
    walk, parts, out = _Walk(False), [], []
    for e in got.events:
        if teaches(e) and not decoder._learn(e, walk, parts):
            continue
        out.append(e)
    start, pend = int(s.start[0]), int(s.prefix_end[0])
    raw = bytes(s.raw[start:int(s.stop[0])])
    prefix = raw[:pend - start]
    if pend > start and prefix not in decoder._prefixes and decoder.table.states_once(prefix):
        invalid = Counter(decoder.invalid) if decoder.invalid else None
        decoder._head(raw, {"type": BLOCK, "rank": decoder.rank, "ts": int(s.ts[0])}, walk, parts, out, prefix)
        if prefix not in decoder._prefixes:  # (a bad record: walked again with the rest, counted there)
            decoder.invalid = invalid if invalid is not None else Counter()
    run = _learn_later_prefixes(data, s, fb, decoder, walk, parts, ahead, (line_start, line_end))
    # the signatures named by the begins of the blocks up to there: none of them can come
    # after a table changed what it means
    upto = int(s.op_first[run])
    sigs, decoded = decoder._sigs, decoder._sid
    for x in sorted(set(ahead.sids[:upto].tolist())):  # (in order: statics are numbered as they come)
        if x in sigs and x not in decoded:
            decoder._static_of_sid(x)
    assert not walk.count() and not parts  # (no op record was read)
    return Head(Decoded(out, got.damaged, got.invalid), data[line_start[fb]:], s, fb)


#: Op records that refer to sites and groups themselves, not through a signature
_OWN_TYPES = frozenset({BEGIN, RBEGIN, SOURCE})
_OWN_FIELDS = np.zeros(256, np.bool_)
_OWN_FIELDS[sorted(_OWN_TYPES)] = True
#: Lines between blocks that teach no table (``_learn_later_prefixes`` looks no further)
_PLAIN_LINES = (b'{"type":"heartbeat"', b'{"type":"sample"')


def _begin_sigs(s: blockscan.Scan, offs: np.ndarray) -> np.ndarray:
    """Per op record at ``offs``, the signature id its begin names (-1: not a begin
    through a signature that ``_Fixed`` reads: ts and id in range, long enough), as
    ``_Fixed`` reads it (its compiled pass: a first round's ~20 op records a stream, of
    16k streams, were two numpy gathers of every header's bytes, ~110 ns a record)."""
    if not offs.shape[0]:
        return np.full(0, -1, np.int64)
    f = _Fixed.of(s.raw, offs)
    return np.where(f.sig, f.body_sid, -1)


class Ahead(NamedTuple):
    """What ``learn_head`` asks of a chunk's op records, worked out for many chunks at once
    (``_ahead``): a first round of thousands of streams paid ~25 us of numpy calls a stream
    on a few rows for it."""

    sids: np.ndarray  # the signature each op record's begin names (``_begin_sigs``; -1: none)
    first_own: int  # the first op record that refers to sites and groups itself (``_OWN_FIELDS``)


def _ahead(scans: Sequence[blockscan.Scan]) -> list[Ahead]:
    """``Ahead`` of each scan's op records: in one pass for all where they are parts of
    one scan (one ``raw``: ``blockscan.parts``), else each apart."""
    if not scans:
        return []
    if any(x.raw is not scans[0].raw for x in scans):
        return [_ahead([x])[0] for x in scans]
    n = len(scans)
    sizes = np.fromiter((x.ops.shape[0] for x in scans), np.int64, n)
    bounds = np.zeros(n + 1, np.int64)
    np.cumsum(sizes, out=bounds[1:])
    ops = np.concatenate([x.ops for x in scans]) if n > 1 else scans[0].ops
    sids = _begin_sigs(scans[0], ops)
    own = np.append(np.flatnonzero(_OWN_FIELDS[scans[0].raw[ops]]), bounds[-1])
    nxt = own[np.searchsorted(own, bounds[:-1])]  # each scan's first at or after its start
    first = np.where(nxt < bounds[1:], nxt - bounds[:-1], sizes).tolist()
    return [Ahead(sids[a:b], f) for a, b, f in zip(bounds[:-1].tolist(), bounds[1:].tolist(), first, strict=True)]


#: Past this many lines from the first block, ``_blocks_before_other_line`` finds the lines
#: between blocks with numpy (a whole read's first chunk: thousands); up to it, in a list (a
#: live poll's chunk, a few lines: the numpy calls cost twice the walk)
_WALK_LINES = 64


def _blocks_before_other_line(data: bytes, block: np.ndarray, fb: int, line_start: list[int],
                              line_end: list[int]) -> int | None:
    """How many block lines there are from line ``fb`` to the first line after it that is
    neither a block, a heartbeat, a sample nor blank (None: there is none).  The lines
    between blocks are found first (``block``: a line's block, -1 for none), and only they
    are looked at: not every line of 16k streams' first chunks."""
    if block.shape[0] - fb <= _WALK_LINES:
        between = [line for line, b in enumerate(block[fb:].tolist(), fb) if b < 0]
    else:
        between = (np.flatnonzero(block[fb:] < 0) + fb).tolist()
    for j, line in enumerate(between):
        lo = line_start[line]
        if not data.startswith(_PLAIN_LINES, lo) and data[lo:line_end[line]].strip():
            return line - fb - j  # (the lines before it, but the j between blocks)
    return None


def _learn_later_prefixes(data: bytes, s: blockscan.Scan, fb: int, decoder: BlockDecoder, walk: _Walk,
                          parts: list[OpRecords], ahead: Ahead, lines: tuple[list[int], list[int]]) -> int:
    """``learn_head``'s second part: the table prefixes of the chunk's later blocks learnt
    now too, as long as learning one early changes nothing an earlier record decodes to:
    each of its records restates what is in effect or states a signature no begin before
    it named, or a site nothing decoded before refers to (``_restates_or_adds``: a
    recorder's blocks restate the tables of the ops they hold, so a step of several kinds
    of ops has several prefixes, all new in a stream's first chunk).  Stops at a block cut
    short or with a table record among its ops, at a line between blocks that is not a
    heartbeat or a sample, and at a prefix that is not so; only in a chunk short enough to
    go together (``TOGETHER_REST``).  Returns how many blocks from the first are learnt or
    restate what is (their begins' signatures may be decoded now).  ``lines``: the scan's
    ``line_start`` and ``line_end`` as lists."""
    nb = s.ts.shape[0]
    if s.flags[0] != 0:
        return 0
    if nb == 1:
        return 1
    if s.prefix_end[0] > s.start[0] and bytes(s.raw[int(s.start[0]):int(s.prefix_end[0])]) not in decoder._prefixes:
        return 1  # (the first prefix is walked again with the rest: nothing after it goes first)
    if len(data) > TOGETHER_REST:
        return 1
    # blocks up to the first one cut short, or after a line that is not a heartbeat or a sample
    flags = s.flags.tolist()
    limit = next((k for k in range(1, nb) if flags[k]), nb)
    line_start, line_end = lines
    before = _blocks_before_other_line(data, s.block, fb, line_start, line_end)
    if before is not None:
        limit = min(limit, before)
    # a prefix's later blocks restate it (equal bytes: ``Scan.prefix_id``), learnt or in effect
    # by then, unless the decoder's recent prefixes were forgotten meanwhile (``_epoch``)
    starts, pends = s.start.tolist(), s.prefix_end.tolist()
    first: dict[int, int] = {}  # (``blockscan.prefix_firsts``, on a list)
    for k, p in enumerate(s.prefix_id[1:limit].tolist(), 1):
        if p >= 0 and p not in first:
            first[p] = k
    firsts = list(first.values())
    epoch = decoder._epoch
    named: set[int] = set()
    known = 0  # the ops whose begins' signatures are in ``named``
    sids, first_own = ahead
    j = 0
    while j < len(firsts):
        k = firsts[j]
        j += 1
        start, pend = starts[k], pends[k]
        prefix = bytes(s.raw[start:pend])
        if pend > start and prefix not in decoder._prefixes:
            upto = int(s.op_first[k])
            named.update(sids[known:upto].tolist())
            known = upto
            if not (decoder.table.states_once(prefix) and _restates_or_adds(prefix, decoder, named, first_own < upto)):
                return k
            out: list[dict] = []
            decoder._head(bytes(s.raw[start:int(s.stop[k])]), {"type": BLOCK, "rank": decoder.rank,
                                                              "ts": int(s.ts[k])}, walk, parts, out, prefix)
            if out or prefix not in decoder._prefixes:  # (cannot be: it only adds signatures and sites)
                raise AssertionError("a later prefix learnt ahead taught more than signatures and sites")
        if decoder._epoch != epoch:  # (forgotten: every later block's prefix is looked at)
            epoch = decoder._epoch
            firsts[j:] = range(k + 1, limit)
    return limit


def _restates_or_adds(prefix: bytes, decoder: BlockDecoder, named: set[int], own: bool) -> bool:
    """Whether each record of a table prefix restates what ``decoder`` has in effect, or
    states a signature it does not have that no begin in ``named`` names yet, or a site it
    does not have that no signature it has refers to and no begin decoded before it
    referred to (none with its own fields before it: ``own``).  A group is never learnt
    early: its event goes at its block's line."""
    off = 0
    while off + HEADER.size <= len(prefix):
        typ, _f, _a, length, _ts, key = HEADER.unpack_from(prefix, off)
        rec = prefix[off:off + length]
        off += length
        if typ >= META_REC or rec in decoder._in_effect:
            continue
        if typ == SITE_REC:
            if (own or key > MAX_INT or length < HEADER.size + 2 or key in decoder.sites
                    or (SITE_REC, key) in decoder._sig_refs or (SITE_REC, key) in decoder._unresolved):
                return False
            continue
        if typ != SIG or key > 0xFFFFFFFF:
            return False
        old = decoder._sigs.get(key)
        if old != rec and (old is not None or key in named):
            return False
    return True


def _joined(head: Decoded, rest: Decoded) -> Decoded:
    """A chunk's head (``learn_head``) and its rest decoded after it, as one."""
    invalid = head.invalid + rest.invalid if head.invalid else rest.invalid
    return Decoded(head.events + rest.events, head.damaged + rest.damaged, invalid, rest.ops)


#: A rest longer than this (``learn_head``) is decoded alone through its slice of the
#: scan: a whole stream read at once goes alone in any case (its blocks restate a prefix
#: once learnt, but its begins name more signatures than its first blocks), and scanning
#: it again for ``decode_chunks`` would cost what reading it together saves
TOGETHER_REST = 64 << 10


class Together(NamedTuple):
    """What ``decode_together`` made of each chunk: its ``Decoded`` (None: decode it alone,
    nothing of its decoder changed), whether its decoder learnt its head first (its
    records then lie in the rests' columns, not those of the chunks that learnt none), and
    its part of the scan where it is None (``decode_chunk(..., scanned=)``)."""

    decoded: list[Decoded | None]
    learnt: list[bool]
    alone: list[blockscan.Scan | None]
    #: The heartbeats and samples taken out of the chunks' events as rows (``take``), a
    #: ``beatscan.Gathered`` a pass (its chunks numbered as given), a chunk's in one of them
    gathered: Sequence[beatscan.Gathered] = ()


def decode_together(chunks: Sequence[tuple[bytes, BlockDecoder]], take: np.ndarray | None = None,
                    joined: list[Joined] | None = None) -> Together:
    """``decode_chunks``, then the chunks it left that start by teaching their decoder (a
    stream's first: its meta, its first table prefix) decoded together after all: each
    decoder learns its chunk's head (``learn_head``), the rests go through
    ``decode_chunks`` again, and a rest it leaves is decoded alone (it may not be left:
    its decoder learnt the head).  ``take``: the chunks whose heartbeats and samples
    ``decode_chunks`` may take out as rows (``Together.gathered``; a stream's first chunk
    takes those of its rest, where its head has none).  ``joined``: the records of the
    chunks each ``decode_chunks`` returned stay in its columns (a ``Joined`` each: those of
    the chunks that learnt no head, then those of the rests; a rest decoded alone has its
    records as its ``Decoded.ops``)."""
    n = len(chunks)
    alone: list[blockscan.Scan | None] = []
    rows: list[beatscan.Gathered] = []
    made: list[blockscan.Scan] = []
    decoded = decode_chunks(chunks, alone, take=take, gathered=rows, joined=joined, made=made)
    if len(alone) != n:
        alone = [None] * n
    learnt = [False] * n
    heads: dict[int, Head] = {}
    todo = [(c, part) for c, part in enumerate(alone) if part is not None and decoded[c] is None]
    before = _heads_decoded([(chunks[c][0], part, chunks[c][1].rank) for c, part in todo])
    for (c, part), ahead, lines in zip(todo, _ahead([part for _, part in todo]), before, strict=True):
        head = learn_head(chunks[c][0], part, chunks[c][1], ahead, lines)
        if head is not None:
            heads[c] = head
            learnt[c] = True
            alone[c] = None
    if not heads:
        return Together(decoded, learnt, alone, rows)
    which = [c for c, head in heads.items() if len(head.rest) <= TOGETHER_REST]
    parts: list[blockscan.Scan | None] = []
    rest_take = None if take is None else np.fromiter(  # (a head's heartbeats and samples are dicts: its rest's too)
        (bool(take[c]) and not any(e["type"] in _LIVENESS for e in heads[c].decoded.events) for c in which),
        np.bool_, len(which))
    rest_rows: list[beatscan.Gathered] = []
    rest_joined: list[Joined] | None = None if joined is None else []
    of = np.asarray(which, np.int64)
    if len(which) > 1:  # (the rests' scan cut from the poll's, not joined from each head's)
        sizes = np.fromiter((len(data) for data, _ in chunks), np.int64, n)
        starts = np.zeros(n, np.int64)
        np.cumsum(sizes[:-1], out=starts[1:])
        cut = sizes[of] - np.fromiter((len(heads[c].rest) for c in which), np.int64, len(which))
        rests = decode_chunks([(heads[c].rest, chunks[c][1]) for c in which], parts,
                              blockscan.rests(made[0], starts, sizes, of, cut), rest_take, rest_rows, rest_joined)
    else:
        rests = [None] * len(which)
    if joined is not None and rest_joined:  # (numbered as the chunks given)
        joined.append(rest_joined[0]._replace(chunks=of[rest_joined[0].chunks]))
    for g in rest_rows:  # (numbered as the chunks given; a head's events come before its rest's rows)
        among = {int(of[c]): (len(heads[int(of[c])].decoded.events), lines) for c, (_, lines) in g.among.items()}
        for c in np.unique(of[g.chunk]).tolist():
            if c not in among and heads[c].decoded.events:
                among[c] = (len(heads[c].decoded.events), [])
        rows.append(g._replace(chunk=of[g.chunk], among=among))
    again = dict(zip(which, rests, strict=True))
    scans = dict(zip(which, parts, strict=True)) if len(parts) == len(which) else {}
    for c, head in heads.items():
        rest = again.get(c)
        if rest is None:
            rest = decode_alone(head.rest, chunks[c][1], scans.get(c) if c in again else head.scanned())
        decoded[c] = _joined(head.decoded, rest)
    return Together(decoded, learnt, alone, rows)


class Joined(NamedTuple):
    """The op records of the chunks ``decode_chunks`` returned, left in the columns they were
    resolved into: span ``k`` of ``spans`` (none empty, back to back) is the records of
    chunk ``chunks[k]``, whose ``Decoded.ops`` is then None.  A reader hands a poll's
    records on as these arrays (``Spans``): making each of 16k chunks its view
    (``OpRecords.rows_of``, ~3 us) and counting them one by one was a fifth of a live
    poll's time in a read process."""

    spans: Spans
    chunks: np.ndarray


def decode_chunks(chunks: Sequence[tuple[bytes, BlockDecoder]], alone: list[blockscan.Scan | None] | None = None,
                  scanned: blockscan.Scan | None = None, take: np.ndarray | None = None,
                  gathered: list[beatscan.Gathered] | None = None, joined: list[Joined] | None = None,
                  made: list[blockscan.Scan] | None = None) -> list[Decoded | None]:
    """``decode_chunk`` of several streams' chunks (complete lines; one chunk a stream, its
    decoder with it), the common case for all of them at once: one scan, and the records
    resolved in one pass into one set of columns, each stream's a slice of them
    (``OpRecords.span``).  A live poll of thousands of streams, a block or two each, spent
    ~100 us a stream in numpy calls on a few rows.  ``alone``, where given, is filled with
    each chunk's own part of the scan where it is None (``decode_chunk(..., scanned=)``: a
    stream's first chunk, every one in a whole read, is not scanned twice).  ``scanned``: the
    chunks' scan, back to back, made already (``blockscan.rests``): not scanned again.
    ``made``: the scan (made or given) is appended to it.

    The common case is what ``decode_chunk`` hands over as it is, nothing learnt: every line
    a block the scanner read whole, in ring order after what its decoder read, whose table
    prefix its decoder has in effect (or none); every record a phase (no error) or a begin
    through a signature its decoder decoded (not an any-source recv); the other lines events
    that teach its tables nothing (heartbeats, samples ...: decoded as JSON, all chunks' in
    one call, ``_other_lines``).  Any other chunk is None: nothing of its decoder changed,
    decode it alone (``decode_chunk``).

    ``take`` (a bool a chunk): of those chunks, the heartbeats and samples ``beatscan``
    reads are taken out of the events as rows, appended to ``gathered`` (one
    ``beatscan.Gathered``, of the chunks returned: none of whose events is then a heartbeat
    or a sample).  They are half a live poll's lines: as JSON, ~11% of a read process's
    time catching up on 16k ranks, and as dicts ~27% of the console's.

    ``joined`` (a list): the records of the chunks returned are not made into views each,
    but appended to it as one ``Joined`` (where there are any): their ``Decoded.ops`` is
    None, and ``Decoded.count`` does not count them."""
    n = len(chunks)
    out: list[Decoded | None] = [None] * n
    if take is not None and gathered is None:
        raise ValueError("decode_chunks: rows taken (take) need a list to go in (gathered)")
    if not n or not blockscan.available():
        return out
    decoders = [dec for _, dec in chunks]
    if len(set(map(id, decoders))) != n:
        raise ValueError("decode_chunks: one chunk per stream (a decoder was given twice)")
    table = decoders[0].table
    sizes = np.fromiter(map(len, (d for d, _ in chunks)), np.int64, n)
    starts = np.zeros(n, np.int64)
    np.cumsum(sizes[:-1], out=starts[1:])
    data = b"".join(d for d, _ in chunks)
    ranks = np.fromiter((dec.rank for dec in decoders), np.int64, n)
    s = scanned if scanned is not None else blockscan.scan_many(data, starts, ranks)
    if s is None:
        return out
    if made is not None:
        made.append(s)
    ok = (sizes > 0) & np.fromiter((dec.table is table for dec in decoders), np.bool_, n)
    line_chunk = np.searchsorted(starts, s.line_start, side="right") - 1
    bc = line_chunk[s.block >= 0]  # each block's chunk
    nb = bc.shape[0]
    seen = np.fromiter((dec.seen_end for dec in decoders), np.int64, n)
    if nb:
        first = np.r_[True, bc[1:] != bc[:-1]]
        floor = np.where(first, seen[bc], np.r_[0, s.end[:-1]])  # what the block's records must come after
        odd = ((s.flags & blockscan.BAD) != 0) | (s.pos < 0) | (s.end < s.pos) | (s.pos < floor)
        gaps = np.fromiter((dec.counts_gaps for dec in decoders), np.bool_, n)
        if gaps.any():  # (a gap, or a start, in the ring positions: alone, where ``_block`` decides)
            odd |= (s.pos > floor) & gaps[bc]
        ok[bc[odd]] = False
        withp = np.flatnonzero(s.prefix_end > s.start)
        if withp.shape[0]:
            mv, prefixes = memoryview(s.raw), {}
            for pair in np.unique(bc[withp] * nb + s.prefix_id[withp]).tolist():
                c, b = divmod(pair, nb)
                pb = prefixes.get(b)
                if pb is None:
                    pb = prefixes[b] = bytes(mv[int(s.start[b]):int(s.prefix_end[b])])
                if pb not in decoders[c]._prefixes:
                    ok[c] = False
    op_chunk = np.repeat(bc, np.diff(s.op_first))
    rows = np.flatnonzero(ok[op_chunk])
    offs, oc = s.ops[rows], op_chunk[rows]
    f = _Fixed.of(s.raw, offs)
    phase, static, seq, parent, tid, peer = f.phase, f.static, f.seq, f.parent, f.tid, f.peer
    ok[oc[(phase >= 0) & ((f.rflags & FLAG_ERROR) != 0)]] = False  # (an exception text: alone)
    sigm = np.flatnonzero(f.sig)
    if sigm.shape[0]:
        bseq, bparent = f.body_seq[sigm], f.body_parent[sigm]
        sid = f.body_sid[sigm]
        # (a signature's ``since`` needs no look: one decoded in an earlier chunk came before these)
        pairs, at = np.unique(oc[sigm] << 32 | sid, return_inverse=True)
        st = np.empty(pairs.shape[0], np.int32)
        for j, pair in enumerate(pairs.tolist()):
            got = decoders[pair >> 32]._sid.get(pair & 0xFFFFFFFF)
            st[j] = _NO_STATIC if got is None else got  # (not decoded yet: alone, where it is)
        st = st[at.reshape(-1)]
        usable = st >= 0
        any_source = table.any_source[np.maximum(st, 0)] & usable
        usable &= ~any_source & (bseq <= MAX_INT) & (bparent <= MAX_INT)
        ok[oc[sigm[~usable]]] = False
        phase[sigm] = PH_BEGIN
        static[sigm] = st
        seq[sigm] = np.where(bseq >= 0, bseq, -1)
        parent[sigm] = np.where(bparent == 0, -1, bparent.astype(np.int64))
        tid[sigm] = f.body_tid[sigm]
        peer[sigm] = table.peer[np.maximum(st, 0)]
    ok[oc[phase < 0]] = False  # (a begin of its own, a source, a bad or unknown record: alone)
    events, taken = _other_lines(data, ranks, s, line_chunk, ok, take)
    cols = (phase, f.ts, f.id, static, seq, parent, tid, peer, f.gpu, f.flags)
    keep = ok[oc]
    if not keep.all():
        oc = oc[keep]
        cols = tuple(a[keep] for a in cols)
    whole = OpRecords(-1, *cols, {}, table.statics)
    counts = np.bincount(oc, minlength=n)
    bounds = np.zeros(n + 1, np.int64)
    np.cumsum(counts, out=bounds[1:])
    last_end = np.full(n, -1, np.int64)
    if nb:  # (ends grow within an ok chunk: its last block's is the highest)
        last = np.flatnonzero(np.r_[bc[1:] != bc[:-1], True])
        last_end[bc[last]] = s.end[last]
    if alone is not None:
        alone[:] = blockscan.parts(s, starts, ~ok)
    if taken is not None and gathered is not None:  # (those of the chunks returned)
        mine = ok[taken.chunk]
        if mine.any():
            gathered.append((taken if mine.all() else taken.only(mine)).compact())
    for c, a, b, end in zip(np.flatnonzero(ok).tolist(), bounds[:-1][ok].tolist(), bounds[1:][ok].tolist(),
                            last_end[ok].tolist(), strict=True):
        dec = decoders[c]
        if end > dec.seen_end:
            dec.seen_end = end
        if end >= 0:
            dec.ring_open = False
        json = events.get(c)
        evs, damaged, invalid = (json.events, json.damaged, json.invalid) if json is not None else (
            [], 0, schema.NO_INVALID)
        if b == a:
            out[c] = Decoded(evs, damaged, invalid)
            continue
        dec._gathered += b - a
        out[c] = Decoded(evs, damaged, invalid, None if joined is not None else whole.rows_of(dec.rank, a, b))
    if joined is not None:
        has = np.flatnonzero(counts)  # (only chunks returned have records: ``keep``)
        if has.shape[0]:
            joined.append(Joined(Spans(whole, np.append(bounds[has], bounds[-1]), ranks[has]), has))
    return out


def _other_lines(data: bytes, rank_of: np.ndarray, s: blockscan.Scan, line_chunk: np.ndarray, ok: np.ndarray,
                 take: np.ndarray | None = None
                 ) -> tuple[dict[int, Decoded], beatscan.Gathered | None]:
    """The lines ``decode_chunks`` leaves to JSON (heartbeats, samples ...) of the chunks
    still ``ok``, decoded in one call for all of them (``schema.decode_many``), or per
    chunk where one line of them is not a valid event of its stream (that path counts
    what it skips); a chunk where one is a block or says what a decoder's tables hold
    (``teaches``) is no longer ok (it goes alone: its tables change).  Of the chunks
    ``take`` names, the heartbeats and samples ``beatscan`` reads are rows instead, where
    none of the chunk's lines decoded as JSON is one (else all of its are events, in
    line order, as without ``take``)."""
    other = np.flatnonzero((s.block < 0) & ok[line_chunk])
    if not other.shape[0]:
        return {}, None
    lo, hi = s.line_start[other], s.line_end[other]
    # a blank line (nothing, or only spaces) is no event: only a line that starts with a
    # space or ends at once may be one
    u8 = np.frombuffer(data, np.uint8)
    maybe = (hi <= lo) | _SPACE[u8[np.minimum(lo, max(0, len(data) - 1))]]
    if maybe.any():
        keep = ~maybe
        keep[maybe] = [bool(data[a:b].strip()) for a, b in zip(lo[maybe].tolist(), hi[maybe].tolist(), strict=True)]
        other, lo, hi = other[keep], lo[keep], hi[keep]
        if not other.shape[0]:
            return {}, None
    chunk = line_chunk[other]
    rows = None
    if take is not None and (may := np.flatnonzero(take[chunk])).shape[0]:
        got = beatscan.scan(data, lo[may], hi[may], rank_of[chunk[may]])
        hit = np.flatnonzero(got.kind != beatscan.OTHER) if got is not None else may[:0]
        if hit.shape[0]:
            at = may[hit]
            rows = beatscan.Gathered(got, chunk[may], other[may], data, lo[may], hi[may], {}).only(
                got.kind != beatscan.OTHER)
            rest = np.ones(other.shape[0], np.bool_)
            rest[at] = False
            other, lo, hi, chunk = other[rest], lo[rest], hi[rest], chunk[rest]
    out: dict[int, Decoded] = {}
    with_rows = set(np.unique(rows.chunk).tolist()) if rows is not None else set()
    if other.shape[0]:
        lines = [data[a:b] for a, b in zip(lo.tolist(), hi.tolist(), strict=True)]
        cuts = np.flatnonzero(chunk[1:] != chunk[:-1]) + 1
        keys = chunk[np.r_[0, cuts]].tolist()
        bounds = [0, *cuts.tolist(), len(lines)]
        ranks = np.repeat(rank_of[keys], np.diff(bounds)).tolist()
        events = schema.decode_many(lines, ranks)
        odd: list[int] = []  # (the chunks with a heartbeat or a sample among these)
        if events is None:  # (chunk by chunk: that path counts what it skips)
            for n, c in enumerate(keys):
                got, at = schema.decode_indexed(lines[bounds[n]:bounds[n + 1]], int(rank_of[c]))
                if any(e.get("type") == BLOCK or teaches(e) for e in got.events):
                    ok[c] = False
                else:
                    out[c] = got
                if c in with_rows:
                    rows.among[c] = (0, other[bounds[n] + np.array(at, np.int64)].tolist())
                    if any(e.get("type") in _LIVENESS for e in got.events):
                        odd.append(c)
        else:
            # (one look at each event's type for all chunks: a block or a table's event is rare)
            for i in [i for i, e in enumerate(events) if e.get("type") in _ODD_OTHER]:
                e = events[i]
                if e.get("type") == BLOCK or teaches(e):
                    ok[keys[bisect.bisect_right(bounds, i) - 1]] = False
            if rows is not None:
                odd = [keys[bisect.bisect_right(bounds, i) - 1] for i, e in enumerate(events)
                       if e.get("type") in _LIVENESS]
            for n, c in enumerate(keys):
                if ok[c]:
                    out[c] = Decoded(events[bounds[n]:bounds[n + 1]], 0, schema.NO_INVALID)
                if c in with_rows:  # (each event's line: rows put back go among them, ``Gathered``)
                    rows.among[c] = (0, other[bounds[n]:bounds[n + 1]].tolist())
        if odd and np.isin(rows.chunk, odd).any():  # (those keep theirs as events: decoded again without)
            again = take.copy()
            again[odd] = False
            return _other_lines(data, rank_of, s, line_chunk, ok, again)
    return out, rows


#: The events ``beatscan`` may take as rows: a chunk with one of them as JSON keeps its as events
_LIVENESS = frozenset(("heartbeat", "sample"))


#: The types of event ``_other_lines`` looks at twice: a block, or one that may teach tables
_ODD_OTHER = frozenset((BLOCK, SITE, "group", "meta"))
#: The bytes ``bytes.strip`` takes for spaces (a line that starts with one may be blank)
_SPACE = np.zeros(256, np.bool_)
_SPACE[list(b" \t\n\r\x0b\x0c")] = True


# ------------------------------------------------------------------------------ reference encoder
# The recorder packs records in C++; these build the same bytes in Python, for tests and
# for the reader fuzzer (commscope/bench/fuzz.py).

def pack_begin(op_id: int, ts: int, *, tid: int = 1, parent: int = 0, name: int = -1, site: int = -1,
               opcode: int = 0, gid: int = 0, seq: int = -1, peer: int = -1, root: int = -1, redop: int = -1,
               role: int = ROLE_MERGED, device: int = -1, direction: int = 0, flags: int = 0,
               ins: list[tuple[int, list[int]]] = (), outs: list[tuple[int, list[int]]] = (),
               in_bytes: int = 0, out_bytes: int = 0) -> bytes:
    """A BEGIN record; ``ins``/``outs`` are (dtype code, dims) per tensor."""
    tensors = b"".join(bytes((code, len(dims))) + struct.pack(f"<{len(dims)}q", *dims) for code, dims in [*ins, *outs])
    body = BEGIN_BODY.pack(tid, parent, name, site, opcode, gid, seq, peer, root, redop, role, device, len(ins),
                           len(outs), len(ins), len(outs), in_bytes, out_bytes)
    length = HEADER.size + len(body) + len(tensors)
    return HEADER.pack(BEGIN, flags, direction, length, ts, op_id) + body + tensors


#: The most bytes of a record's text (the native recorder's ``kMaxText``) and the mark a
#: longer one ends in where it was cut (``kCutMark``)
MAX_RECORD_TEXT = 4096
CUT_MARK = "\u2026".encode()


def cut_text(text: bytes) -> bytes:
    """``text`` as a record holds it (the native recorder's ``cut_text``): whole when it
    fits ``MAX_RECORD_TEXT``; else its whole words before the cut and ``CUT_MARK``.  The word
    the cut falls in is dropped whole: credentials are masked after the cut (``mask_texts``),
    and half of one is no longer recognisable (a URL's password without its ``@host``)."""
    if len(text) <= MAX_RECORD_TEXT:
        return text
    k = MAX_RECORD_TEXT - len(CUT_MARK)
    while k > 0 and text[k] not in b" \t\n\r\x0b\x0c":
        k -= 1
    return text[:k] + CUT_MARK


def pack_end(op_id: int, ts: int, *, exc: str | None = None, wait: bool = False, approx: bool = False,
             unissued: bool = False) -> bytes:
    text = cut_text((exc or "").encode())
    flags = (FLAG_ERROR if exc is not None else 0) | (FLAG_APPROX if approx else 0) | (FLAG_UNISSUED if unissued else 0)
    body = _U16.pack(len(text)) + text
    return HEADER.pack(WAIT_END if wait else END, flags, 0, HEADER.size + len(body), ts, op_id) + body


def pack_wait_begin(op_id: int, ts: int, tid: int = 1) -> bytes:
    return HEADER.pack(WAIT_BEGIN, 0, 0, HEADER.size + 8, ts, op_id) + struct.pack("<Q", tid)


def pack_sig(sid: int, *, flags: int = 0, direction: int = 0, **fields: Any) -> bytes:
    """A SIG record: the repeating part of a begin (``pack_begin``'s fields but ts/id/seq/parent/tid)."""
    begin = pack_begin(0, 0, **fields)
    body = begin[HEADER.size:]
    return HEADER.pack(SIG, flags, direction, HEADER.size + len(body), 0, sid) + body


def pack_sig_begin(op_id: int, ts: int, sid: int, *, seq: int = -1, parent: int = 0, tid: int = 1) -> bytes:
    return HEADER.pack(BEGIN_SIG, 0, 0, HEADER.size + SIG_BEGIN_BODY.size, ts, op_id) + \
        SIG_BEGIN_BODY.pack(sid, seq, parent, tid)


def pack_source(op_id: int, ts: int, peer: int, seq: int) -> bytes:
    """A SOURCE record: an any-source recv learned its peer (and seq)."""
    return HEADER.pack(SOURCE, 0, 0, HEADER.size + SOURCE_BODY.size, ts, op_id) + SOURCE_BODY.pack(peer, seq)


def pack_rbegin(op_id: int, ts: int, fragment: bytes, *, kind: int = KIND_PLAIN, tid: int = 1, parent: int = 0,
                site: int = -1, gid: int = -1, seq: int = -1) -> bytes:
    """An RBEGIN record: a begin described by a JSON fragment of its static fields."""
    frag = fragment[:60000]
    body = RBEGIN_BODY.pack(tid & ((1 << 64) - 1), parent, site, gid, seq, len(frag)) + frag
    return HEADER.pack(RBEGIN, 0, kind, HEADER.size + len(body), ts, op_id) + body


def _u16_text(text: str) -> bytes:
    raw = text.encode("utf-8", "replace")[:0xFFFF]
    return _U16.pack(len(raw)) + raw


def pack_group(gid: int, name: str, backend: str = "", granks: list[int] | tuple[int, ...] | None = None) -> bytes:
    """A GROUP table record (what ``put_group_locked`` writes in C++): the members as runs
    (``RUNS``) when that is shorter than listing them (a world of 16k ranks: 16 bytes, not 64k)."""
    if granks is None:
        ranks = struct.pack("<i", -1)
    else:
        runs = schema.runs_of(granks)
        if 4 + 12 * len(runs) < 4 * len(granks):
            ranks = struct.pack("<ii", RUNS, len(runs)) + b"".join(struct.pack("<iii", *r) for r in runs)
        else:
            ranks = struct.pack(f"<i{len(granks)}i", len(granks), *granks)
    body = _u16_text(name) + _u16_text(backend) + ranks
    return HEADER.pack(GROUP_REC, 0, 0, HEADER.size + len(body), 0, gid) + body


def pack_site(sid: int, text: str) -> bytes:
    """A SITE table record."""
    body = _u16_text(text)
    return HEADER.pack(SITE_REC, 0, 0, HEADER.size + len(body), 0, sid) + body


def pack_meta(line: bytes) -> bytes:
    """A META table record: the rank's meta event (spools only)."""
    return HEADER.pack(META_REC, 0, 0, HEADER.size + len(line), 0, 0) + line


def pack_event(line: bytes) -> bytes:
    """An EVENT table record: an event the store did not take at the end (spools only)."""
    return HEADER.pack(EVENT_REC, 0, 0, HEADER.size + len(line), 0, 0) + line
