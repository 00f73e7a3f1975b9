"""The trace event schema (version 3), shared by the recorder, the stores and analysis.

A trace is, per rank, an ordered stream of JSON objects (one per line in the
directory store, one per stream entry in Redis).  Every event carries:

    v      schema version (int, currently 3; readers read versions 1 and 2 too)
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
                [unissued] the backend refused the call before issuing anything and the op
                gave its number back: it took no ``seq`` after all, whatever its begin says
                (the recorder rewrites the begin, unless it was already written out: readers
                withdraw the begin's seq)
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
               Flight Recorder saw, before their first merged op); in a carry, granks
               may be {"runs": [[start, stride, count], ...]} (``schema.with_runs``)
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
                 "snapshot"  taken from outside by ``commscope snapshot`` (py-spy): frames may
                             include native ones (file: the shared library, line 0)
               Readers treat a stack without ``reason`` as "hang".
    exit       reason, [unwaited: [op ids of async work never waited]], [exc] the unhandled
               exception the process died of; reason "signal": [signal] ("Segmentation fault",
               "Aborted", ...), [src: "faulthandler"] (written by the reader from the crash file,
               not by the rank); [approx] its ts is a file's mtime (the crash file's, the
               Python recorder's SIGTERM note's): the kernel's coarse clock, which may read a few
               ms before the rank's last op (readers allow for it)
    dropped    count (this batch), total, reason, [records: op records inside the dropped
               ``block`` events, which count once each in ``count``]

Version 2 (the native recorder) adds, see ``commscope.blocks``:

    block      n, data: many op events packed in binary; readers expand them into the op
               events above before anything else sees them
    site       sid (id), text: a call site the blocks refer to by id
    group      [gid]: the id blocks use for the group
    meta       [recorder] "native" or "python", [names], [dtypes]: the tables blocks use
    begin      [src] "c10d": a collective issued from C++ (DDP's reducer, functional
               collectives): its seq counts in the same per-group sequence as the rest

Version 3 (spools, self-describing streams, incarnations):

    block      pos, end: the ring positions of its records (readers drop a block, or the
               part of one, they have already seen: a dead rank's spool may be forwarded
               after its recorder sent part of it); each block restates the signatures,
               sites and groups its records use, so any suffix of a stream decodes alone
    meta       inc: the incarnation (the process initialised a process group again after
               destroying one: a new stream, its groups named "0@1", ...); run: a nonce
               rank 0 draws at init, so a forwarder never mixes two runs of one job id;
               [ring]: the ring position the stream's first block starts at (a reader that
               reads the stream from its first line counts a first block line gone); [no_spool]: why the rank records without a spool (a full /dev/shm, say):
               killed outright, it loses what its last tick had not stored, and says
               nothing of its death
    exit       code (os._exit's or the process's exit code); reason "killed": a launcher
               saw the process die of [signal] (src "launcher"); reason "os._exit";
               reason "signal" with [exc]: the C++ exception std::terminate was called
               with (src "spool": read from the dead rank's spool header);
               unwaited_count: all async work never waited (``unwaited`` lists 1,000);
               [stop_signal, stop_ts] (native recorder): a SIGTERM a handler of the program's
               own took (the rank lived on), and when, whatever ended it after (an exception,
               an exit, a SIGKILL).  Who sent it and why is unknown (a scancel, a preemption
               notice after which training goes on); such an exit is never ``vocab.stopped``
               (a rank killed by a stop signal), but it dates a stop (rankstate);
               [term_unwatched] (reason "gone", native recorder): a SIGTERM could have come
               unnoted (the program replaced the death handler after init, or ignores it)
    snapshot   (``commscope snapshot``, a job never instrumented; ``commscope/snapshot``)
               meta recorder "snapshot", hang_after the span of the snapshot's samples; op
               src "snapshot": the collective a stack shows the rank inside, its seq the
               snapshot's cycle (the same on every rank: matched only within the cycle);
               exit reason "gone", src "snapshot": a rank its host should hold had no process
    exit       reason "gone", src "spool": a dead rank's spool held no word of its death
               (SIGKILL, the OOM killer): ts its last record's, or when it was found
    dropped    entries, reason "store_lost: ...": a writer found its stream gone or
               shorter than what had landed (Redis restarted empty, the job directory
               deleted); ``entries`` lines were lost by the store, not the recorder
    summary    what retention kept of a segment of the stream it deleted (not written by
               the rank: ``store/retention.py``, in ``rank-*.summary.jsonl``): seg (its
               number), first_ns, last_ns, events, size (bytes), ops: per op and group
               {op, group, count, in_bytes, out_bytes, unfinished, failed, minutes: [[minute
               start ns, ops, latency sum ns, latency max ns, [[log2 us bucket, ops]]]]}
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
from collections.abc import Iterator
from typing import Any

import orjson

from commscope import optable, schema
from commscope.schema import SCHEMA_VERSION, Decoded

#: The hang_after (seconds) a rank records in its meta, and readers judge with, where nobody set one
DEFAULT_HANG_AFTER = 30.0

__all__ = ["DEFAULT_HANG_AFTER", "SCHEMA_VERSION", "Decoded", "Event", "TraceFormatError", "decode", "decode_lines", "encode",
           "encode_lines", "gc_paused", "signature_key"]

OP = "op"
META = "meta"
GROUP = "group"
SAMPLE = "sample"
HEARTBEAT = "heartbeat"
STACK = "stack"
EXIT = "exit"
DROPPED = "dropped"
BLOCK = "block"
SITE = "site"
SUMMARY = "summary"
TYPES = frozenset({OP, META, GROUP, SAMPLE, HEARTBEAT, STACK, EXIT, DROPPED, BLOCK, SITE, SUMMARY})
#: The ``exit`` reason of a rank whose process ended and nobody saw how: ``commscope snapshot``
#: found it gone, or its spool was left without a word of its death (SIGKILL, the OOM killer)
GONE = "gone"
#: The ``exit`` reason of a rank whose default process group was destroyed: its incarnation
#: ended (a later ``exit`` of the same stream says how the process itself ended, if not cleanly)
DESTROYED = "destroy_process_group"
#: ``dropped`` events whose reason starts so count Flight Recorder ring overwrites: entries of
#: collectives the wrapper mostly recorded itself, so they are not lost trace events.
FR_OVERWRITE = "Flight Recorder ring overwritten"


def running_drops(so_far: int, e: dict) -> int:
    """A count of drops with ``dropped`` event ``e`` taken: its ``count`` (this report) added,
    or its ``total`` (the recorder's running total), whichever says more (the model's count
    of a rank's, and a segment's carry, ``store/inflight.py``)."""
    return max(so_far + int(e.get("count") or 0), int(e.get("total") or 0))


#: A rank's op ids in incarnation ``n`` are numbered from ``(n << INCARNATION_ID_SHIFT) + 1``
#: on (the native recorder's ``new_incarnation`` too), so they are unique within a rank
INCARNATION_ID_SHIFT = 40


def incarnation_ids(incarnation: int) -> range:
    """The op ids the recorder gives a rank's ops in ``incarnation``."""
    return range((incarnation << INCARNATION_ID_SHIFT) + 1, (incarnation + 1) << INCARNATION_ID_SHIFT)


BEGIN = "begin"
END = "end"
WAIT_BEGIN = "wait_begin"
WAIT_END = "wait_end"
DONE = "done"
PHASES = frozenset({BEGIN, END, WAIT_BEGIN, WAIT_END, DONE})

SEND = "send"
RECV = "recv"

#: Ops that move data between exactly two ranks.
P2P_OPS = optable.P2P_OPS

Event = dict[str, Any]


class TraceFormatError(ValueError):
    """An event that is not valid schema JSON."""


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


def decode(line: bytes | str, rank: int | None = None) -> Event:
    """Parse and validate one event (``schema``); raises TraceFormatError on anything malformed."""
    data = line.encode() if isinstance(line, str) else bytes(line)
    if b"\n" in data.strip():
        raise TraceFormatError("more than one line")
    got = schema.decode_lines(data.strip(), rank)
    if got.damaged:
        raise TraceFormatError("not JSON")
    if not got.events:
        reason = next(iter(got.invalid), "empty")
        raise TraceFormatError(f"invalid event: {reason}")
    return got.events[0]


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


def decode_lines(data: bytes, rank: int | None = None) -> Decoded:
    """Decode newline-separated events read from ``rank``'s stream (None: any), each validated
    against ``schema``; returns (events, damaged lines, invalid events by reason).

    The one entry point every reader decodes through.
    """
    return schema.decode_lines(data, rank)
