"""JSON op events as columns: a worker of a whole read hands a JSON trace's ops over as
``OpRecords``, as it does a native trace's blocks.

A trace of the Python recorder before it wrote blocks holds its ops as JSON events, one dict
each once decoded.  Read in worker processes, dicts cost as much to pickle back as to
decode, and the model takes a dict a step where it takes columns at once; so a worker turns
a stream's op events into columns (``of_events``) where every one of them is of a form the
columns say exactly (``OpRecords.events`` gives each back): a begin with its signature key
(``sk``, which the model keys a begin's fields by: ``TraceModel._begins``) and a thread id;
an end with its exception, approximate time, an any-source recv's peer and seq; a wait's
exception; a done's device time and exception.  A stream with one op event of another form
keeps its events as they are.

A worker reads a stream's chunks through ``decode_chunk``: the compiled scanner
(``jsonscan``) puts the op lines it reads straight into columns, and only the rest (other
events, exception texts) is decoded as JSON.

Torch-free, numpy only: a format, below the stores.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat
from typing import NamedTuple

import numpy as np

from commscope import jsonscan
from commscope.blocks import LINE_PREFIX, PER_CALL, StaticTable
from commscope.events import Decoded, decode_lines
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
    PHASE_CODE,
    OpRecords,
    Static,
)
from commscope.schema import decode_indexed

#: A begin's keys that its static fields leave out (what it carries per call, and the key)
NOT_STATIC = frozenset((*PER_CALL, "sk"))
_BASE = frozenset({"type", "ts", "phase", "id", "rank", "v"})
#: The keys each phase but a begin may carry in columns (``OpRecords.events`` writes them)
_PHASE_KEYS = {PH_END: _BASE | {"exc", "approx", "peer", "seq", "unissued"}, PH_WAIT_BEGIN: _BASE | {"exc"},
               PH_WAIT_END: _BASE | {"exc"}, PH_DONE: _BASE | {"exc", "gpu_ns"}}
#: Keys a begin never carries in columns (a phase's)
_PHASE_ONLY = frozenset({"exc", "approx", "gpu_ns", "unissued"})


def split(events: Sequence[dict]) -> tuple[list[dict], list[dict]]:
    """(the op events, the others), each in stream order."""
    ops, rest = [], []
    for e in events:
        (ops if e.get("type") == "op" else rest).append(e)
    return ops, rest


def of_events(rank: int, ops: Sequence[dict], table: StaticTable) -> OpRecords | None:
    """``rank``'s op events (valid, as the JSON path decodes them, in stream order) as
    columns, or None where one is of a form columns do not say (see the module docstring).
    A begin's static fields are ``table``'s, one per (signature key, thread id) as the model
    interns them (the first begin's fields with that pair), and peer (a per-op column the
    model reads off each begin).  The columns are pulled out a key at a time (C-level maps);
    only a phase with more than its base keys, and a begin of a new key, take a Python step."""
    k = len(ops)
    if not k:
        return None
    dget = dict.get
    phase = np.fromiter(map(PHASE_CODE.get, map(dget, ops, repeat("phase")), repeat(-1)), np.int8, k)
    if (phase < 0).any():
        return None
    ts = np.fromiter(map(dict.__getitem__, ops, repeat("ts")), np.int64, k)
    ids = np.fromiter(map(dict.__getitem__, ops, repeat("id")), np.int64, k)
    static = np.full(k, -1, np.int32)
    seq = np.full(k, -1, np.int64)
    parent = np.full(k, -1, np.int64)
    tid = np.zeros(k, np.uint64)
    peer = np.full(k, -1, np.int32)
    gpu = np.zeros(k, np.int64)
    flags = np.zeros(k, np.uint8)
    exc: dict[int, str] = {}
    rows = np.flatnonzero(phase == PH_BEGIN)
    if rows.shape[0]:
        begins = [ops[j] for j in rows.tolist()]
        sks = list(map(dget, begins, repeat("sk")))
        tids = list(map(dget, begins, repeat("tid")))
        peers = list(map(dget, begins, repeat("peer"), repeat(-1)))
        if {*map(type, sks), *map(type, tids)} != {int} or not all(map(_PHASE_ONLY.isdisjoint, begins)):
            return None
        try:
            tid[rows] = tids
        except OverflowError:  # (a thread id columns cannot hold)
            return None
        keys = list(zip(repeat("json"), sks, tids, peers))
        at = list(map(table.get, keys))
        for j in [j for j, a in enumerate(at) if a is None]:
            a = at[j] = table.get(keys[j])  # (an earlier begin of this call may have added it)
            if a is None:
                p = peers[j]
                fields = {name: v for name, v in begins[j].items() if name not in NOT_STATIC}
                at[j] = table.add(keys[j], Static(fields, sks[j], p if p.__class__ is int else -1, None))
        static[rows] = at
        peer[rows] = table.peer[static[rows]]
        seq[rows] = np.fromiter(map(dget, begins, repeat("seq"), repeat(-1)), np.int64, len(begins))
        parent[rows] = np.fromiter(map(dget, begins, repeat("parent"), repeat(-1)), np.int64, len(begins))
    # the other phases with more than their base keys (type, ts, phase, id, rank, v)
    extra = np.fromiter(map(len, ops), np.int64, k) - np.fromiter(map(dict.__contains__, ops, repeat("v")),
                                                                   np.int64, k) > len(_BASE) - 1
    for row in np.flatnonzero(extra & (phase != PH_BEGIN)).tolist():
        e, ph = ops[row], int(phase[row])
        if not e.keys() <= _PHASE_KEYS[ph]:
            return None
        if "exc" in e:
            exc[row] = e["exc"]
        if ph == PH_END:
            if "approx" in e:
                if e["approx"] is not True:
                    return None
                flags[row] |= F_APPROX
            if "unissued" in e:
                if e["unissued"] is not True:
                    return None
                flags[row] |= F_UNISSUED
            if "peer" in e:
                peer[row] = e["peer"]
                flags[row] |= F_SOURCE
                if "seq" in e:
                    seq[row] = e["seq"]
            elif "seq" in e:
                return None
        elif ph == PH_DONE and "gpu_ns" in e:
            gpu[row] = e["gpu_ns"]
            flags[row] |= F_GPU
    return OpRecords(rank, phase, ts, ids, static, seq, parent, tid, peer, gpu, flags, exc, table.statics)


class Chunk(NamedTuple):
    """A chunk of lines decoded by ``decode_chunk``: ``decoded`` (its other events, in line
    order, with the chunk's damaged and invalid counts; ``ops``: its op records), and the
    line each event and each record came from (``event_lines``, ``op_lines``), to put them
    back in one order where a stream's other chunks keep op events as dicts."""

    decoded: Decoded
    event_lines: np.ndarray
    op_lines: np.ndarray


def decode_chunk(data: bytes, rank: int, table: StaticTable) -> Chunk | None:
    """Complete lines of ``rank``'s stream with its op events in columns: what
    ``of_events(split(decode_lines(data, rank).events))`` gives, the op lines the scanner
    reads (``jsonscan``) never built as dicts.  None, ``table`` untouched, where that is not
    the way: no scanner, blocks among the lines, no op line the scanner reads, or an op event
    columns do not say (a stream's chunk that the caller then decodes as JSON)."""
    if data.find(LINE_PREFIX, 0, 1 << 16) >= 0:
        return None
    s = jsonscan.scan(data, rank)
    if s is None or not s.line.shape[0]:
        return None
    # the lines left to JSON first: where they make it JSON's chunk, nothing is learnt of it
    others = np.flatnonzero(s.row == jsonscan.JSON)
    lines = [data[a:b] for a, b in zip(s.line_start[others].tolist(), s.line_end[others].tolist(), strict=True)]
    full = [j for j, line in enumerate(lines) if line.strip()]
    if len(full) < len(lines):
        lines = [lines[j] for j in full]
        others = others[full]
    got, at = decode_indexed(lines, rank)
    lines_of = others[np.asarray(at, np.int64)] if at else np.zeros(0, np.int64)
    ops, rest, op_at, rest_at = [], [], [], []
    for e, line in zip(got.events, lines_of.tolist(), strict=True):
        typ = e["type"]
        if typ == "op":
            if e["phase"] == "begin":  # (a begin the scanner left: its static fields' order is the JSON path's)
                return None
            ops.append(e)
            op_at.append(line)
        elif typ == "block" or typ == "site":
            return None
        else:
            rest.append(e)
            rest_at.append(line)
    more = of_events(rank, ops, table) if ops else None  # (no begin among them: the table is not touched)
    if ops and more is None:
        return None
    k = s.line.shape[0]
    static = np.full(k, -1, np.int32)
    begins = np.flatnonzero(s.phase == PH_BEGIN)
    if begins.shape[0] and not _begins(data, s, rank, begins, table, static):
        return None
    recs = OpRecords(rank, s.phase, s.ts, s.id, static, s.seq, s.parent, s.tid.astype(np.uint64),
                     s.peer.astype(np.int32), s.gpu, s.flags, {}, table.statics)
    if begins.shape[0]:
        recs.peer[begins] = table.peer[static[begins]]
    op_lines = s.line
    if more is not None:
        recs, op_lines = _merged(recs, s.line, more, np.asarray(op_at, np.int64))
    return Chunk(Decoded(rest, got.damaged, got.invalid, recs), np.asarray(rest_at, np.int64), op_lines)


def _begins(data: bytes, s: jsonscan.Scan, rank: int, begins: np.ndarray, table: StaticTable,
            static: np.ndarray) -> bool:
    """Fill ``static`` for the scanned begins: each distinct set of static bytes decoded once
    (its first line, as the JSON path does: validated, its text redacted), each (signature
    key, thread id, peer) looked up in ``table`` once and added, the first time, with the
    fields of its first begin (``of_events``).  False where a first line is not a valid
    event (the JSON path counts it, and the lines equal to it)."""
    fields_of: dict[int, dict] = {}
    for g in np.unique(s.group[begins]).tolist():
        line = int(s.line[g])
        got = decode_lines(data[int(s.line_start[line]):int(s.line_end[line])], rank)
        if len(got.events) != 1 or got.events[0].get("type") != "op":
            return False
        fields_of[g] = {name: v for name, v in got.events[0].items() if name not in NOT_STATIC}
    code: dict[tuple[int, int, int], int] = {}
    firsts: list[int] = []
    keys = zip(s.sk[begins].tolist(), s.tid[begins].tolist(), s.peer[begins].tolist(), strict=True)
    codes = []
    for j, key in enumerate(keys):
        c = code.get(key)
        if c is None:
            c = code[key] = len(firsts)
            firsts.append(j)
        codes.append(c)
    at = np.empty(len(firsts), np.int32)
    for (sk, tid, peer), c in code.items():
        key = ("json", sk, tid, peer)
        a = table.get(key)
        if a is None:
            fields = fields_of[int(s.group[begins[firsts[c]]])]
            a = table.add(key, Static(fields, sk, peer, None))
        at[c] = a
    static[begins] = at[np.asarray(codes, np.int64)]
    return True


def _merged(a: OpRecords, a_lines: np.ndarray, b: OpRecords, b_lines: np.ndarray) -> tuple[OpRecords, np.ndarray]:
    """Two sets of one stream's records as one, in line order; and its lines."""
    lines = np.concatenate([a_lines, b_lines])
    order = np.argsort(lines, kind="stable")
    cat = np.concatenate
    where = np.empty_like(order)
    where[order] = np.arange(order.shape[0])
    exc = {int(where[row]): text for row, text in a.exc.items()}
    exc.update({int(where[len(a) + row]): text for row, text in b.exc.items()})
    return OpRecords(a.rank, *(cat([getattr(a, c), getattr(b, c)])[order] for c in
                               ("phase", "ts", "id", "static", "seq", "parent", "tid", "peer", "gpu", "flags")),
                     exc, a.statics), lines[order]
