"""The trace event schema (version 1), shared by the recorder, the stores and analysis.

A trace is, per rank, an ordered stream of JSON objects (one per line in the
directory store, one per stream entry in Redis).  Every event carries:

    v      schema version (int, currently 1)
    type   one of TYPES below
    rank   global rank of the writer
    ts     wall-clock time in ns (``time.time_ns()``; the same clock Flight Recorder uses)

Keys whose value would be ``None``/``False``/empty are omitted; readers use ``.get``.

``op`` events (``type == "op"``) describe one logical operation by ``id`` (unique per
rank, increasing) and ``phase``:

    begin       op, group, seq, [peer, dir, root, redop], in_shapes, in_dtypes, in_bytes,
                out_shapes, out_dtypes, out_bytes, [async], site, [tid], [device],
                [nested, parent], [src], [tag]
    end         [exc] -- the exception text when the call raised; [peer, seq] resolved source
                of an any-source recv; [approx] the end time is only a bound (Flight Recorder
                on Gloo gives no completion time); [gpu_ns] GPU time Flight Recorder measured
    wait_begin  Work.wait() entered (async ops)
    wait_end    Work.wait() returned; [exc]
    done        device-side completion seen via CUDA events: gpu_ns.  CPU backends write no
                ``done``: completion is ``end`` (sync) or ``wait_end`` (async).

``sk`` on a begin is a 48-bit key of its static fields (op, group, peer, dir, root, redop,
shapes, dtypes, bytes, async, site, nested, device): equal exactly when those are, up to
hash collisions, so readers may intern signatures by (sk, tid) without comparing them.

``seq`` is the rank's per-group collective counter, or for p2p (``dir`` in send/recv)
the counter per (group, peer, dir).  ``nested`` ops are traffic inside another logical
op (``parent``); they carry no ``seq`` and are never matched across ranks.  Children of
``batch_isend_irecv`` are not nested: they are real p2p ops with their own seq and a
``parent``.  ``src == "fr"`` marks ops merged from PyTorch's Flight Recorder; their seq
is Flight Recorder's own (``collective_seq_id`` / ``p2p_seq_id``) and is matched only
against other Flight Recorder ops; their events may appear in a rank's stream later than
their ``ts``.  ``src == "fr-import"`` marks ops read from a Flight Recorder dump file.
``device`` ("cuda:N") marks ops timed with CUDA events: they complete at ``done``.

Other types:

    meta       host, pid, world_size, backend, torch, commscope, python, job, hang_after,
               sample_interval, argv, [local_rank], [device], [fr]
    group      group, granks (global ranks in group-rank order), [backend], [desc]
               -- written once per process group, before its first op (for groups only
               Flight Recorder saw, before their first merged op)
    sample     cpu (%), rss (bytes), [gpu_util (%), gpu_mem, gpu_mem_total (bytes),
               gpu_power (W), gpu_temp (C)], [gpu_error]
    heartbeat  inflight (ops begun and not finished)
    stack      [id] (the stuck op), threads: [{tid, name, frames: [[file, line, func], ...]
               outermost first, [op_thread]}], [reason]: why it was captured --
                 "hang"      (the default) an op of this rank passed hang_after; op_thread is the
                             thread blocked in op ``id``
                 "request"   another rank asked every rank for its stacks (one of its ops passed
                             hang_after or failed; see record/hangsignal.py): [trigger] the asking
                             rank, [request_ns] when it asked; no ``id``; op_thread is the main thread
                 "exception" the uncaught exception the rank is dying of: [exc], one thread (its
                             traceback)
                 "signal"    the fatal signal it died of, read from faulthandler's crash file by
                             the directory reader (store/crashlog.py); op_thread: the crashing thread
               Readers treat a stack without ``reason`` as "hang".
    exit       reason, [unwaited: [op ids of async work never waited]], [exc] the unhandled
               exception the process died of; reason "signal": [signal] ("Segmentation fault",
               "Aborted", ...), [src: "faulthandler"] (written by the reader from the crash file,
               not by the rank)
    dropped    count (this batch), total, reason
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
from collections.abc import Iterator
from typing import Any

import orjson

SCHEMA_VERSION = 1

OP = "op"
META = "meta"
GROUP = "group"
SAMPLE = "sample"
HEARTBEAT = "heartbeat"
STACK = "stack"
EXIT = "exit"
DROPPED = "dropped"
TYPES = frozenset({OP, META, GROUP, SAMPLE, HEARTBEAT, STACK, EXIT, DROPPED})

BEGIN = "begin"
END = "end"
WAIT_BEGIN = "wait_begin"
WAIT_END = "wait_end"
DONE = "done"
PHASES = frozenset({BEGIN, END, WAIT_BEGIN, WAIT_END, DONE})

SEND = "send"
RECV = "recv"

#: Ops that move data between exactly two ranks.
P2P_OPS = frozenset({
    "send", "recv", "isend", "irecv", "send_object_list", "recv_object_list",
    "send_tensors", "recv_tensors", "isend_tensors", "irecv_tensors",
})

Event = dict[str, Any]


class TraceFormatError(ValueError):
    """An event that is not valid schema-1 JSON."""


def signature_key(static_json: bytes) -> int:
    """The ``sk`` of a begin: 48 bits of BLAKE2b over its canonical static fields (exact in
    JSON doubles too)."""
    return int.from_bytes(hashlib.blake2b(static_json, digest_size=6).digest(), "big")


def encode(event: Event) -> bytes:
    """One event as a compact JSON line without the trailing newline."""
    return orjson.dumps(event)


def encode_lines(events: list[Event]) -> bytes:
    """Events as newline-terminated JSON lines, ready to append to a file."""
    if not events:
        return b""
    dumps = orjson.dumps
    return b"\n".join([dumps(e) for e in events]) + b"\n"


def decode(line: bytes | str) -> Event:
    """Parse and validate one event; raises TraceFormatError on anything malformed."""
    try:
        event = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise TraceFormatError(f"not JSON: {exc}") from None
    check(event)
    return event


def check(event: Any) -> None:
    """Raise TraceFormatError unless ``event`` looks like a schema-1 event."""
    if not isinstance(event, dict):
        raise TraceFormatError("event is not a JSON object")
    typ = event.get("type")
    if typ not in TYPES:
        raise TraceFormatError(f"unknown event type {typ!r}")
    if not isinstance(event.get("rank"), int) or not isinstance(event.get("ts"), int):
        raise TraceFormatError("event lacks an integer rank or ts")
    v = event.get("v", SCHEMA_VERSION)
    if not isinstance(v, int) or v > SCHEMA_VERSION:
        raise TraceFormatError(f"unsupported schema version {v!r}")
    if typ == OP and (event.get("phase") not in PHASES or not isinstance(event.get("id"), int)):
        raise TraceFormatError("op event lacks a valid phase or id")


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic GC while building many small objects at once.

    Decoding a large batch allocates millions of dicts and lists that all survive, and
    the collector would traverse them again and again (3x slower).  Only readers use
    this, never the training process.
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _valid(e: Any) -> bool:
    if type(e) is not dict:
        return False
    typ = e.get("type")
    if typ not in TYPES or type(e.get("rank")) is not int or type(e.get("ts")) is not int:
        return False
    v = e.get("v", SCHEMA_VERSION)
    if type(v) is not int or v > SCHEMA_VERSION:
        return False
    return typ != OP or (e.get("phase") in PHASES and type(e.get("id")) is int)


def decode_lines(data: bytes) -> tuple[list[Event], int]:
    """Decode newline-separated events; returns (events, number of damaged lines).

    Fast path: parse every line in one C-level ``map``; only when a line is damaged does
    it fall back to line-by-line parsing, so one bad line costs only itself.
    """
    if not data:
        return [], 0
    lines = data.split(b"\n")
    if not lines[-1]:
        lines.pop()
    with gc_paused():
        try:
            parsed = list(map(orjson.loads, lines))
        except orjson.JSONDecodeError:
            parsed = None
        if parsed is None:
            parsed = []
            bad = 0
            for line in lines:
                if not line.strip():
                    continue
                try:
                    parsed.append(orjson.loads(line))
                except orjson.JSONDecodeError:
                    bad += 1
        else:
            bad = 0
        # _valid, inlined: a function call per event is a tenth of the whole read
        events = []
        append = events.append
        types, phases, version = TYPES, PHASES, SCHEMA_VERSION
        for e in parsed:
            if type(e) is dict:
                typ = e.get("type")
                if (typ in types and type(e.get("rank")) is int and type(e.get("ts")) is int
                        and (typ != "op" or (e.get("phase") in phases and type(e.get("id")) is int))):
                    v = e.get("v", version)
                    if type(v) is int and v <= version:
                        append(e)
    return events, bad + len(parsed) - len(events)
