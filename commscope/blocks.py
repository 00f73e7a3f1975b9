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
import struct
from collections import Counter
from typing import Any, NamedTuple

import msgspec
import orjson

from commscope import dtypes, optable, schema
from commscope.events import Decoded, signature_key
from commscope.redact import mask, redact
from commscope.schema import MAX_INT, SCHEMA_VERSION

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
_U16 = struct.Struct("<H")

#: The c10d operators the native recorder observes, in opcode order, with the name of the
#: torch.distributed function that issues each (the name ops get when no wrapped call
#: names them, e.g. DDP's all-reduces).
C10D_OPS: tuple[tuple[str, str], ...] = tuple((c.operator, c.name) for c in optable.C10D)

#: Reduce ops by c10d::ReduceOp::RedOpType.
REDOPS = ("sum", "avg", "product", "min", "max", "band", "bor", "bxor", "premul_sum", "unused")

#: Ops whose reduce op is "sum" when none is recorded (as the Python recorder writes it).
REDUCING = optable.REDUCING


#: How every encoded ``block`` line starts (``encode_block`` and record/native/drain.h's
#: ``drain_block`` write the same template).
LINE_PREFIX = b'{"type":"block",'


def encode_block(data: bytes, rank: int, ts: int, count: int, pos: int | None = None, end: int | None = None) -> bytes:
    """One ``block`` event as a JSON line (without newline); ``pos``/``end``: the ring
    positions of its records (version 3)."""
    where = b'"pos":%d,"end":%d,' % (pos, end) if pos is not None and end is not None else b""
    return LINE_PREFIX + b'"v":%d,"rank":%d,"ts":%d,"n":%d,%s"data":"%s"}' % (
        SCHEMA_VERSION, rank, ts, count, where, base64.b64encode(data))


def records_in_line(line: bytes) -> int:
    """The ``n`` of an encoded block event (0 if it cannot be read, or is another event)."""
    if not line.startswith(LINE_PREFIX):
        return 0
    head = line[:96]
    at = head.find(b'"n":')
    if at < 0:
        return 0
    digits = head[at + 4:].split(b",", 1)[0]
    return int(digits) if digits.isdigit() else 0


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


class StaticBegin(NamedTuple):
    """What a begin record's repeating part decodes to (``BlockDecoder._static_of``)."""

    fields: dict  # the op event's fields but ts/id/seq/parent/tid
    sk: int  # their signature key (``events.signature_key``)
    any_source_gid: int | None  # an any-source recv's group id: its peer comes with a SOURCE record


class GroupEntry(NamedTuple):
    """A group as a rank's ``group`` event describes it, by the id its blocks use."""

    name: str
    granks: list[int] | None  # global ranks by group rank; None when the event had none (or bad ones)


class BlockDecoder:
    """Unpacks one stream's blocks into op events; keeps that stream's site and group tables."""

    def __init__(self) -> None:
        self.seen_end = 0  # ring position after the last record decoded (version 3 blocks)
        self.duplicates = 0  # records skipped because an earlier block held them
        self.sites: dict[int, str] = {}
        self.groups: dict[int, GroupEntry] = {}
        self.names: list[str] | None = None
        self.dtypes: list[str] = [dtypes.torch_name(n) for n in dtypes.CODES]
        self.c10d_names = [n for _, n in C10D_OPS]
        self.invalid: Counter = Counter()  # records (or whole blocks) that could not be decoded, by reason
        self._static: dict[bytes, StaticBegin | bool] = {}  # begin's static bytes -> decoded, False: invalid
        self._gid_of_id: dict[int, int] = {}  # any-source recvs waiting for their source
        self._sigs: dict[int, tuple[int, int, bytes]] = {}  # signature id -> (flags, aux, its body)
        self._by_sig: dict[int, StaticBegin | bool] = {}  # signature id -> decoded (see _static_of)

    # -- tables, from the rank's other events
    def note(self, ev: dict) -> None:
        """Learn from a non-block event of this rank (site, group, meta)."""
        typ = ev.get("type")
        if typ == SITE:
            sid, text = ev.get("sid"), ev.get("text")
            if isinstance(sid, int) and isinstance(text, str):
                self.sites[sid] = text
        elif typ == "group":
            gid = ev.get("gid")
            if isinstance(gid, int):
                granks = ev.get("granks")
                ok = isinstance(granks, list) and all(isinstance(r, int) for r in granks)
                self.groups[gid] = GroupEntry(str(ev.get("group")), list(granks) if ok else None)
                self._static.clear()  # peers and roots may now resolve to global ranks
                self._by_sig.clear()
        elif typ == "meta":
            names = ev.get("names")
            if isinstance(names, list) and all(isinstance(x, str) for x in names):
                self.names = names
            codes = ev.get("dtypes")
            if isinstance(codes, list) and all(isinstance(x, str) for x in codes):
                self.dtypes = [dtypes.torch_name(x) for x in codes]

    def _table(self, typ: int, raw: bytes, body: int, end: int, flags: int, aux: int, key: int, ev: dict,
               out: list[dict]) -> None:
        """A table record: remembered (a restatement that changes nothing costs a compare)."""
        if typ == SIG:
            rec = (flags, aux, raw[body:end])
            if self._sigs.get(key) != rec and (key in self._sigs or len(self._sigs) < 200_000):
                self._sigs[key] = rec
                self._by_sig.pop(key, None)
        elif typ == SITE_REC:
            n = _U16.unpack_from(raw, body)[0]
            text = redact(raw[body + 2:body + 2 + n].decode("utf-8", "replace"))
            if self.sites.get(key) != text and (key in self.sites or len(self.sites) < 200_000):
                self.sites[key] = text
                self._static.clear()  # decoded begins carry the text
                self._by_sig.clear()
        elif typ == GROUP_REC:
            n = _U16.unpack_from(raw, body)[0]
            name = raw[body + 2:body + 2 + n].decode("utf-8", "replace")
            pos = body + 2 + n
            nb = _U16.unpack_from(raw, pos)[0]
            backend = raw[pos + 2:pos + 2 + nb].decode("utf-8", "replace")
            pos += 2 + nb
            count = struct.unpack_from("<i", raw, pos)[0]
            granks = list(struct.unpack_from(f"<{count}i", raw, pos + 4)) if 0 <= count <= (end - pos - 4) // 4 else None
            if granks is not None and any(not 0 <= r <= schema.MAX_RANK for r in granks):
                raise ValueError("group ranks")
            if len(name) > schema.MAX_NAME or len(backend) > schema.MAX_NAME:
                raise ValueError("group name")
            entry = GroupEntry(name, granks)
            if self.groups.get(key) == entry or (key not in self.groups and len(self.groups) >= 100_000):
                return
            self.groups[key] = entry
            self._static.clear()  # peers and roots may now resolve to global ranks
            self._by_sig.clear()
            group = {"type": "group", "ts": ev.get("ts", 0), "group": name, "gid": key}
            if granks is not None:
                group["granks"] = granks
            if backend:
                group["backend"] = backend
            out.append(group)  # the model learns the group's members from it

    # -- blocks
    def expand(self, ev: dict) -> list[dict]:
        """The op events of one ``block`` event; what cannot be decoded is counted in ``invalid``."""
        rank, data = ev.get("rank"), ev.get("data")
        try:
            raw = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError, TypeError):
            self.invalid["block: not base64"] += 1
            return []
        out: list[dict] = []
        off, size = 0, len(raw)
        append = out.append
        unpack_header = HEADER.unpack_from
        invalid = self.invalid
        # Ring positions (version 3): records below seen_end were decoded from an earlier block.
        pos = ev.get("pos")
        skip_below = self.seen_end if isinstance(pos, int) else -1
        if isinstance(pos, int) and isinstance(ev.get("end"), int):
            self.seen_end = max(self.seen_end, ev["end"])
        while off + HEADER.size <= size:
            typ, flags, aux, length, ts, op_id = unpack_header(raw, off)
            if length < HEADER.size or off + length > size:
                invalid["block: truncated record"] += 1
                break
            off += length
            body = off - length + HEADER.size
            if typ in TABLE_RECORDS:
                try:
                    if op_id <= MAX_INT:
                        self._table(typ, raw, body, off, flags, aux, op_id, ev, out)
                except (struct.error, ValueError):
                    invalid["block: bad table record"] += 1
                continue
            if skip_below >= 0:
                at = pos
                pos += length
                if at < skip_below:
                    self.duplicates += 1
                    continue
            if not (0 <= ts <= MAX_INT and op_id <= MAX_INT):
                invalid["block: bad record"] += 1
                continue
            try:
                if typ in (END, WAIT_END):
                    e = {"type": "op", "ts": ts, "phase": "end" if typ == END else "wait_end", "id": op_id}
                    if flags & FLAG_ERROR:
                        n = _U16.unpack_from(raw, body)[0]
                        e["exc"] = redact(raw[body + 2:body + 2 + n].decode("utf-8", "replace")) or "error"
                    if flags & FLAG_APPROX:
                        e["approx"] = True
                elif typ == BEGIN_SIG:
                    e = self._sig_begin(raw, body, ts, op_id)
                elif typ == BEGIN:
                    e = self._begin(raw, body, off, ts, op_id, flags, aux)
                elif typ == WAIT_BEGIN:
                    e = {"type": "op", "ts": ts, "phase": "wait_begin", "id": op_id}
                elif typ == DONE:
                    e = {"type": "op", "ts": ts, "phase": "done", "id": op_id}
                    gpu = DONE_BODY.unpack_from(raw, body)[0]
                    if 0 <= gpu <= MAX_INT:
                        e["gpu_ns"] = gpu
                    if flags & FLAG_ERROR:
                        e["exc"] = "the device reported an error"
                elif typ == RBEGIN:
                    e = self._rbegin(raw, body, ts, op_id, aux, rank)
                elif typ == SOURCE:
                    peer, seq = SOURCE_BODY.unpack_from(raw, body)
                    e = {"type": "op", "ts": ts, "phase": "end", "id": op_id}
                    src = self._global(self._gid_of_id.get(op_id, -1), peer)
                    if src is not None:
                        e["peer"] = src
                        if 0 <= seq <= MAX_INT:
                            e["seq"] = seq
                else:
                    e = None
                    invalid["block: unknown record"] += 1
                if e is None:
                    continue
            except (struct.error, ValueError, msgspec.ValidationError, msgspec.DecodeError, IndexError, KeyError):
                e = None
                invalid["block: bad record"] += 1
            if e is not None:
                append(e)
        for e in out:
            e["v"] = SCHEMA_VERSION
            e["rank"] = rank
        return out

    def _sig_begin(self, raw: bytes, body: int, ts: int, op_id: int) -> dict:
        sid, seq, parent, tid = SIG_BEGIN_BODY.unpack_from(raw, body)
        hit = self._by_sig.get(sid)
        if hit is None:
            sig = self._sigs.get(sid)
            if sig is None:
                raise KeyError("unknown signature")  # its SIG record was lost (a trimmed stream)
            flags, aux, static = sig
            # a SIG body is a BeginBody (tid, parent and seq left out) followed by the tensors
            hit = self._by_sig[sid] = self._static_of(static, 0, len(static), flags, aux)
        return self._begin_event(hit, ts, op_id, seq, parent, tid)

    def _begin_event(self, hit: StaticBegin | bool, ts: int, op_id: int, seq: int, parent: int, tid: int) -> dict:
        """The op event of a begin record: its static fields (``_static_of``) and what differs
        per call (``seq`` < 0: none; ``parent`` 0: none)."""
        if hit is False:
            raise ValueError("invalid begin fields")
        if seq > MAX_INT or parent > MAX_INT:
            raise ValueError("bad begin record")
        e = {"type": "op", "ts": ts, "phase": "begin", "id": op_id}
        if seq >= 0:
            e["seq"] = seq
        if parent:
            e["parent"] = parent
        e.update(hit.fields)
        e["tid"] = tid
        e["sk"] = hit.sk
        if hit.any_source_gid is not None:
            self._note_any_source(op_id, hit.any_source_gid)
        return e

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

    def _begin(self, raw: bytes, body: int, end: int, ts: int, op_id: int, flags: int, aux: int) -> dict:
        """A self-contained BEGIN record (written when the signature table is full)."""
        tid, parent, seq = struct.unpack_from("<QQ", raw, body) + (struct.unpack_from("<q", raw, body + 32)[0],)
        hit = self._static_of(raw, body, end, flags, aux)
        return self._begin_event(hit, ts, op_id, seq, parent, tid)

    def _static_of(self, raw: bytes, body: int, end: int, flags: int, aux: int) -> StaticBegin | bool:
        """A BeginBody and its tensors, decoded once per distinct content; False when invalid
        (remembered too)."""
        # Everything but ts/id/seq/parent/tid repeats call after call.
        key = bytes((flags, aux & 0xFF)) + raw[body + 16:body + 32] + raw[body + 40:end]
        hit = self._static.get(key)
        if hit is None:
            (_tid, _parent, name, site, opcode, gid, _seq, peer, root, redop, role, device, nin, nout,
             _ntin, _ntout, bin_, bout) = BEGIN_BODY.unpack_from(raw, body)
            try:
                fields, sk = self._static_fields(raw, body + BEGIN_BODY.size, end, flags, aux, name, site, opcode,
                                                 gid, peer, root, redop, role, device, nin, nout, bin_, bout)
                hit = StaticBegin(fields, sk, gid if aux == 3 and role != ROLE_NESTED else None)
            except (struct.error, ValueError, IndexError, msgspec.ValidationError):
                hit = False  # remembered: every record with these fields is invalid
            if len(self._static) > 50_000:
                self._static.clear()
            self._static[key] = hit
        return hit

    def _static_fields(self, raw: bytes, pos: int, end: int, flags: int, aux: int, name: int, site: int, opcode: int,
                       gid: int, peer: int, root: int, redop: int, role: int, device: int, nin: int, nout: int,
                       bin_: int, bout: int) -> tuple[dict, int | None]:
        names = self.names
        if name >= 0 and names is not None and name < len(names):
            op = names[name]
        elif role == ROLE_CHILD and aux in (1, 2):  # the p2p ops of batch_isend_irecv
            op = "isend" if aux == 1 else "irecv"
        elif 0 <= opcode < len(self.c10d_names):
            op = self.c10d_names[opcode]
        else:
            op = "?"
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

    def _rbegin(self, raw: bytes, body: int, ts: int, op_id: int, kind: int, rank: Any) -> dict:
        tid, parent, site, gid, seq, n = RBEGIN_BODY.unpack_from(raw, body)
        start = body + RBEGIN_BODY.size
        e = orjson.loads(b"{" + raw[start:start + n] + b"}")
        if not isinstance(e, dict) or seq > MAX_INT or parent > MAX_INT:
            raise ValueError("fragment")
        e.update(type="op", ts=ts, phase="begin", id=op_id, tid=tid, rank=rank)
        if gid in self.groups:  # the stream's name for the group (an incarnation's own)
            e["group"] = self.groups[gid].name
        e = msgspec.convert(e, schema.RawEvent)  # a fragment is JSON like any event: checked like one
        if seq >= 0:
            e["seq"] = seq
        if parent:
            e["parent"] = parent
            if seq < 0 and kind == KIND_RICH:
                e["nested"] = True
        if site >= 0 and self.sites.get(site):
            e["site"] = self.sites[site]
        return e


def expand(events: list[dict], decoders: dict[int, BlockDecoder]) -> tuple[list[dict], Counter]:
    """Replace every ``block`` event by its op events (tables from ``site``/``group``/``meta``
    events are learnt on the way); ``decoders`` holds one decoder per rank across calls.
    Returns (events, records that could not be decoded, by reason)."""
    invalid: Counter = Counter()
    if not any(e.get("type") in (BLOCK, SITE) for e in events):
        for e in events:  # cheap: only tables matter here
            if e.get("type") in ("group", "meta") and ("gid" in e or "names" in e or "dtypes" in e):
                _decoder(decoders, e).note(e)
        return events, invalid
    out: list[dict] = []
    for e in events:
        typ = e.get("type")
        if typ == BLOCK:
            dec = _decoder(decoders, e)
            out.extend(dec.expand(e))
            if dec.invalid:
                invalid.update(dec.invalid)
                dec.invalid.clear()
            continue
        if typ in (SITE, "group", "meta"):
            _decoder(decoders, e).note(e)
            if typ == SITE:
                continue
        out.append(e)
    return out, invalid


def expand_decoded(got: Decoded, decoders: dict[int, BlockDecoder]) -> Decoded:
    """A reader's decoded batch with its blocks expanded (and their bad records counted)."""
    events, invalid = expand(got.events, decoders)
    if invalid:
        merged = Counter(got.invalid)
        merged.update(invalid)
        return Decoded(events, got.damaged, merged)
    return got if events is got.events else Decoded(events, got.damaged, got.invalid)


def _decoder(decoders: dict[int, BlockDecoder], e: dict) -> BlockDecoder:
    rank = e.get("rank")
    dec = decoders.get(rank)  # type: ignore[arg-type]
    if dec is None:
        dec = decoders[rank] = BlockDecoder()  # type: ignore[index]
    return dec


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


def pack_end(op_id: int, ts: int, *, exc: str | None = None, wait: bool = False, approx: bool = False) -> bytes:
    text = (exc or "").encode()[:4096]
    flags = (FLAG_ERROR if exc is not None else 0) | (FLAG_APPROX if approx else 0)
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
    """A GROUP table record (what ``put_group_locked`` writes in C++)."""
    ranks = b"" if granks is None else struct.pack(f"<{len(granks)}i", *granks)
    body = _u16_text(name) + _u16_text(backend) + struct.pack("<i", -1 if granks is None else len(granks)) + ranks
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
