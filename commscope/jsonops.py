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

Torch-free, numpy only: a format, below the stores.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat

import numpy as np

from commscope.blocks import PER_CALL, StaticTable
from commscope.oprecords import (
    F_APPROX,
    F_GPU,
    F_SOURCE,
    PH_BEGIN,
    PH_DONE,
    PH_END,
    PH_WAIT_BEGIN,
    PH_WAIT_END,
    PHASE_CODE,
    OpRecords,
    Static,
)

#: A begin's keys that its static fields leave out (what it carries per call, and the key)
NOT_STATIC = frozenset((*PER_CALL, "sk"))
_BASE = frozenset({"type", "ts", "phase", "id", "rank", "v"})
#: The keys each phase but a begin may carry in columns (``OpRecords.events`` writes them)
_PHASE_KEYS = {PH_END: _BASE | {"exc", "approx", "peer", "seq"}, PH_WAIT_BEGIN: _BASE | {"exc"},
               PH_WAIT_END: _BASE | {"exc"}, PH_DONE: _BASE | {"exc", "gpu_ns"}}
#: Keys a begin never carries in columns (a phase's)
_PHASE_ONLY = frozenset({"exc", "approx", "gpu_ns"})


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
