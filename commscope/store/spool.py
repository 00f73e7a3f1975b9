"""Spools: a rank's records in a local file that outlives the rank, forwarded if it dies.

The native recorder appends its records to a ring inside a spool file (layout:
``SpoolHeader`` in ``record/native/layout.h``), in a local directory private to the user
(``/dev/shm/commscope-<uid>``, else the temporary directory; ``$COMMSCOPE_SPOOL_DIR``).
Its thread moves ``[tail, head)`` to the store every tick and advances ``tail``.  When the
rank dies (SIGKILL, the OOM killer, a fatal signal, ``os._exit``) the records it made
since are still in the file, with what the process saw of its death in the header: the
signal, the C++ exception that reached ``std::terminate``, the exit code.

A spool is *dead* when nobody holds its lock: the rank takes a POSIX record lock on it
for its whole life (released by the kernel however the process dies, and not inherited by
a forked child).  ``forward_dead`` sends a dead spool's last records (one self-describing
``block``), the stacks faulthandler wrote next to it, and an ``exit`` event saying how the
rank died to the rank's own stream, then removes the spool.  It is called by the other
ranks' recorder threads on the same host, by ``commscope run`` and the local launcher
when their command ends, and, read-only (``remnant_events``), by readers on the host.
Readers keep each record once (``blocks.BlockDecoder`` tracks ring positions), so a
remnant read twice, or forwarded after the rank had sent part of it, is harmless.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import hashlib
import os
import signal
import stat
import struct
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import orjson

from commscope import blocks
from commscope.events import GONE
from commscope.schema import SCHEMA_VERSION, redact_event
from commscope.store import crashlog

if TYPE_CHECKING:  # (base reads spools: a type is all this module needs of it)
    from commscope.store.base import StoreWriter

ENV_SPOOL_DIR = "COMMSCOPE_SPOOL_DIR"
ENV_BUFFER_MB = "COMMSCOPE_BUFFER_MB"
#: Set by ``commscope run`` for its command: each spool of its ranks says it (identity
#: ``launch``), so the launcher tells its own ranks' spools from another launch's
ENV_LAUNCH = "COMMSCOPE_LAUNCH"
MAGIC = b"CSSPOOL1"
VERSION = 1
HEADER_SIZE = 4096
SLACK = 64 << 10  # record/native/layout.h kMaxRecord
DEFAULT_RING = 16 << 20
TABLE_SIZE = 4 << 20
MIN_RING = 64 << 10
SUFFIX = ".spool"
CRASH_SUFFIX = ".crash"
#: Where faulthandler writes the stacks of a SIGTERM as it comes, for the Python recorder,
#: which has no C handler to note it in the header (``record/crashlog.watch_term``): a
#: written file is the death, at its mtime
TERM_SUFFIX = ".term"
CLOSED = 1  # SPOOL_CLOSED: the owner forwarded everything and left
META_STORED = 2  # the rank's meta reached the store: a forwarder need not send it again
FORWARDED = 4  # a tombstone: records forwarded, how the rank died still unknown (for its launcher)
EXIT_STORED = 8  # the rank's own exit reached the store: a forwarder adds none (the owner left before closing)
#: A SIGTERM could have come unnoted: the program replaced the recorder's death handler
#: (``signal.signal(SIGTERM, ...)`` after init) or ignores the signal; set by the recorder's
#: tick, and said by a ``gone`` exit (``term_unwatched``)
TERM_UNWATCHED = 16
#: The exit ``destroy_process_group`` wrote reached the store: the rank's group ended, its
#: process may go on.  A forwarder sends how it then died where the spool says (a fatal
#: signal, an exit kept for it), and adds no ``gone`` exit where it says nothing: a crash
#: after the group ended read as a clean leaving (helper-194)
GROUP_ENDED = 32
_FLAG_LOCK = threading.Lock()  # the process's own writes of its spool's flags
TOMBSTONE_AGE_S = 3600.0  # a tombstone no launcher claimed by then is removed

#: Header fields by offset (SpoolHeader; ``commscope_native.spool_layout()`` agrees, tested).
_STATIC = struct.Struct("<8sIIQQQQQ")  # magic .. table_size, at 0
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")
_I32 = struct.Struct("<i")
OFF_HEAD, OFF_TAIL, OFF_TABLE_USED, OFF_DROPPED = 56, 64, 72, 80
OFF_PID, OFF_CREATED, OFF_FORWARDED = 88, 96, 104
OFF_RANK, OFF_INC, OFF_FLAGS = 112, 116, 120
_DEATH = struct.Struct("<iiQQqiiqiHHqQ")  # sig, code, addr, tid, ns; exit set, code, ns; term set, lens, ns, tid
OFF_DEATH = 128
_STOP = struct.Struct("<iiq")  # stop_sig, reserved, stop_ns: a stop signal the program's own handler took
OFF_STOP = 200
OFF_TERM_TYPE, OFF_TERM_WHAT, OFF_IDENTITY = 256, 512, 2560
#: Entries the rank's stream held when it last wrote (the first 8 bytes of SpoolHeader's
#: ``reserved1``, which only this module writes): a forwarder that finds the stream shorter
#: (a Redis restarted empty while the rank was gone) states the loss before the remnant.
OFF_STORED = 216
IDENTITY_SIZE = HEADER_SIZE - OFF_IDENTITY
LAYOUT = {"size": HEADER_SIZE, "head": OFF_HEAD, "tail": OFF_TAIL, "flags": OFF_FLAGS, "sig": OFF_DEATH,
          "exit_set": OFF_DEATH + 32, "term_set": OFF_DEATH + 48, "stop_sig": OFF_STOP, "term_type": OFF_TERM_TYPE,
          "term_what": OFF_TERM_WHAT, "identity": OFF_IDENTITY}

#: What faulthandler calls each signal (so an exit read from a spool and one read from a
#: crash file say the same).
SIGNAL_NAMES = {signal.SIGSEGV: "Segmentation fault", signal.SIGBUS: "Bus error",
                signal.SIGFPE: "Floating point exception", signal.SIGILL: "Illegal instruction",
                signal.SIGABRT: "Aborted", signal.SIGTERM: "Terminated", signal.SIGKILL: "Killed"}

#: What a launcher or a user stops a job with, as ``signal_name`` says them: after its group
#: ended, a rank stopped so died of no fault of its own (``remnant_lines``)
_STOPS = frozenset({SIGNAL_NAMES[signal.SIGTERM], SIGNAL_NAMES[signal.SIGKILL], "SIGINT", "SIGHUP"})


def signal_name(sig: int) -> str:
    try:
        return SIGNAL_NAMES.get(sig) or signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def store_id(store: str) -> str:
    """Which store a spool belongs to, without its credentials: forwarders only forward
    spools of the store they write to (and can reach with their own URL)."""
    from commscope.store import backend_for

    return hashlib.sha256(backend_for(store).identity(store).encode()).hexdigest()[:24]


# ------------------------------------------------------------------------------ the directory
def _usable(d: Path) -> bool:
    """A private directory of ours: created 0700, never a link or someone else's."""
    try:
        d.mkdir(mode=0o700, parents=False, exist_ok=True)
        st = os.lstat(d)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077


def spool_dirs() -> list[Path]:
    """Where spools may be: $COMMSCOPE_SPOOL_DIR, else /dev/shm (memory: no disk I/O on the
    hot path's pages), then the temporary directory."""
    env = os.environ.get(ENV_SPOOL_DIR)
    if env:
        return [Path(env)]
    name = f"commscope-{os.getuid()}"
    out = []
    if os.path.isdir("/dev/shm"):
        out.append(Path("/dev/shm") / name)
    out.append(Path(tempfile.gettempdir()) / name)
    return out


def ring_bytes() -> int:
    """The ring's size: $COMMSCOPE_BUFFER_MB (default 16), a power of two."""
    try:
        want = int(float(os.environ.get(ENV_BUFFER_MB) or 0) * (1 << 20)) or DEFAULT_RING
    except ValueError:
        want = DEFAULT_RING
    want = max(MIN_RING, min(want, 1 << 34))
    return 1 << (want.bit_length() - 1)


# ------------------------------------------------------------------------------ the owner's side
def header_bytes(ring: int, table: int, identity: dict[str, Any] | None = None) -> bytes:
    """A new spool's header: sizes, this process, and ``identity`` (job, rank, store ...)."""
    identity = identity or {}
    ident = orjson.dumps(identity) if identity else b""
    if len(ident) >= IDENTITY_SIZE:
        raise ValueError("spool identity too long")
    head = bytearray(HEADER_SIZE)
    _STATIC.pack_into(head, 0, MAGIC, VERSION, HEADER_SIZE, HEADER_SIZE, ring, SLACK, HEADER_SIZE + ring + SLACK, table)
    _I64.pack_into(head, OFF_PID, os.getpid())
    _I64.pack_into(head, OFF_CREATED, time.time_ns())
    _I32.pack_into(head, OFF_RANK, int(identity.get("rank", -1)))
    _I32.pack_into(head, OFF_INC, int(identity.get("inc", 0)))
    head[OFF_IDENTITY:OFF_IDENTITY + len(ident)] = ident
    return bytes(head)


@dataclasses.dataclass
class Spool:
    """A spool file this process owns (locked for its whole life)."""

    path: Path
    fd: int
    size: int

    @property
    def crash_path(self) -> Path:
        return self.path.with_suffix(CRASH_SUFFIX)

    @property
    def term_path(self) -> Path:
        return self.path.with_suffix(TERM_SUFFIX)

    @classmethod
    def create(cls, identity: dict[str, Any], ring: int | None = None, table: int = TABLE_SIZE) -> Spool:
        """A new spool for this process in the first usable spool directory; OSError when
        there is none (the caller records without one)."""
        ring = ring or ring_bytes()
        header_bytes(ring, table, identity)  # ValueError now, before any file exists
        size = HEADER_SIZE + ring + SLACK + table
        last: OSError | None = None
        for d in spool_dirs():
            if not _usable(d):
                last = OSError(errno.EACCES, f"{d} is not a private directory")
                continue
            path = d / f"{os.getpid()}-{identity.get('inc', 0)}-{os.urandom(3).hex()}{SUFFIX}"
            _HELD.add(path)  # before it exists: a scan of this process's never opens it (see _HELD)
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
            except OSError as exc:
                _HELD.discard(path)
                last = exc
                continue
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # ours while we live
                # Every page now: a full /dev/shm fails here, never later as a SIGBUS in training.
                os.posix_fallocate(fd, 0, size)
                os.pwrite(fd, header_bytes(ring, table, identity), 0)
            except OSError as exc:
                os.close(fd)
                with contextlib.suppress(OSError):
                    os.unlink(path)
                _HELD.discard(path)
                last = exc
                continue
            return cls(path, fd, size)
        raise last or OSError(errno.ENOENT, "no spool directory")

    def drained(self) -> bool:
        """Everything recorded is in the store (``tail == head``)."""
        try:
            raw = os.pread(self.fd, 16, OFF_HEAD)
        except OSError:
            return False
        head, tail = struct.unpack("<QQ", raw)
        return head == tail

    def set_flag(self, flag: int) -> None:
        """Note a fact for a forwarder (META_STORED, EXIT_STORED, TERM_UNWATCHED): one thread at
        a time (the recorder's tick and the outbox's landing both may), so none is lost."""
        with _FLAG_LOCK:
            try:
                flags = struct.unpack("<I", os.pread(self.fd, 4, OFF_FLAGS))[0]
                os.pwrite(self.fd, struct.pack("<I", flags | flag), OFF_FLAGS)
            except OSError:
                pass

    def note_stored(self, entries: int) -> None:
        """The rank's stream holds ``entries`` entries (``OFF_STORED``)."""
        try:
            os.pwrite(self.fd, _U64.pack(max(0, int(entries))), OFF_STORED)
        except (OSError, ValueError, TypeError, struct.error):
            pass

    def stop_noted(self) -> dict[str, Any]:
        """``Death.stop_fields`` of this process: a stop signal its own handler took."""
        try:
            sig, _, ns = _STOP.unpack(os.pread(self.fd, _STOP.size, OFF_STOP))
        except (OSError, struct.error):
            return {}
        return Death(stop_signal=sig, stop_ns=ns).stop_fields()

    def close(self, remove: bool) -> None:
        """Leave the spool: removed when the store has everything (``remove``), else kept
        (unlocked) for a forwarder."""
        if self.fd < 0:
            return
        if remove:
            os.pwrite(self.fd, struct.pack("<I", CLOSED), OFF_FLAGS)
            for p in (self.path, self.crash_path, self.term_path):
                with contextlib.suppress(OSError):
                    os.unlink(p)
        with contextlib.suppress(OSError):
            os.close(self.fd)  # releases the lock
        self.fd = -1
        _HELD.discard(self.path)


# ------------------------------------------------------------------------------ reading a spool
@dataclasses.dataclass
class Death:
    """What the process saw of its death (the spool header's last words)."""

    signal: int = 0
    signal_code: int = 0
    signal_tid: int = 0
    signal_ns: int = 0
    exit_code: int | None = None
    exit_ns: int = 0
    terminate_type: str | None = None
    terminate_what: str | None = None
    terminate_ns: int = 0
    stop_signal: int = 0  # a SIGTERM a handler of the program's own took (it lived on), and when
    stop_ns: int = 0
    #: ``signal_ns`` is a file's mtime (the Python recorder's ``.term`` note): the kernel's
    #: coarse clock, which may read a few ms before the rank's last op (``exit_event``: approx)
    coarse: bool = False

    def stop_fields(self) -> dict[str, Any]:
        """What its ``exit`` says of a SIGTERM the program's own handler took (``stop_signal``,
        ``stop_ts``), whatever ended it after; nothing for none or a garbled header."""
        if not 0 < self.stop_signal < 65 or not 0 < self.stop_ns < 1 << 62:  # (none, or a garbled header)
            return {}
        return {"stop_signal": signal_name(self.stop_signal), "stop_ts": self.stop_ns}


@dataclasses.dataclass
class Image:
    """A spool as read from its file."""

    path: Path
    identity: dict[str, Any]
    pid: int
    rank: int
    incarnation: int
    head: int
    tail: int
    dropped: int
    flags: int
    tables: bytes  # the table records the blocks use (meta and kept events left out)
    meta: bytes | None  # the meta event line, if the rank noted one
    kept: list[bytes]  # events the store did not take at the end, kept for the forwarder
    ring: bytes  # records [tail, head), whole records only
    end: int  # position after the last whole record in ``ring``
    death: Death
    stored: int = 0  # entries the rank's stream held when it last wrote (``OFF_STORED``)


def _records(data: bytes) -> Iterator[tuple[int, int, int]]:
    """(type, offset, length) of each whole record."""
    off = 0
    while off + blocks.HEADER.size <= len(data):
        length = blocks.HEADER.unpack_from(data, off)[3]
        if length < blocks.HEADER.size or off + length > len(data):
            return
        yield data[off], off, length
        off += length


class _Layout(NamedTuple):
    """A spool's regions and positions, from its header (``_layout``)."""

    ring_off: int
    ring_size: int
    table_off: int
    table_used: int
    head: int
    tail: int
    start: int  # the first position past the tail the ring still holds (``head`` - what it holds)


def _layout(head: bytes) -> _Layout | None:
    """The layout a header says (None: not a spool's header, or not a sound one)."""
    if len(head) < HEADER_SIZE:
        return None
    magic, version, hsize, ring_off, ring_size, slack, table_off, table_size = _STATIC.unpack_from(head)
    if magic != MAGIC or version != VERSION or hsize != HEADER_SIZE or ring_off != HEADER_SIZE:
        return None
    if ring_size & (ring_size - 1) or slack < SLACK or table_off != HEADER_SIZE + ring_size + slack:
        return None
    hd, tl, used = (_U64.unpack_from(head, o)[0] for o in (OFF_HEAD, OFF_TAIL, OFF_TABLE_USED))
    n = min(hd - tl, ring_size) if hd >= tl else 0
    return _Layout(ring_off, ring_size, table_off, min(used, table_size), hd, tl, hd - n)


def read(path: Path, fd: int | None = None) -> Image | None:
    """The spool at ``path`` (None when it is not one, or is damaged beyond use).  ``fd``: a
    descriptor of it that holds this process's claim (``_claimed``), read through and left
    open: closing any other descriptor of the file would drop every POSIX lock the process
    holds on it, and another forwarder could take the spool meanwhile (it did: a forwarder's
    claim ended as it read the spool, before it wrote a line)."""
    try:
        with open(path, "rb") if fd is None else open(fd, "rb", closefd=False) as f:
            head = f.read(HEADER_SIZE)
            lay = _layout(head)
            if lay is None:
                return None
            ring_off, hd, start = lay.ring_off, lay.head, lay.start
            f.seek(lay.table_off)
            table = f.read(lay.table_used)
            ring = bytearray()
            pos = start
            mask = lay.ring_size - 1
            while pos < hd:  # record by record: one may run on into the slack
                f.seek(ring_off + (pos & mask))
                hdr = f.read(blocks.HEADER.size)
                if len(hdr) < blocks.HEADER.size:
                    break
                length = blocks.HEADER.unpack_from(hdr)[3]
                if length < blocks.HEADER.size or length > SLACK or pos + length > hd:
                    break
                ring += hdr + f.read(length - blocks.HEADER.size)
                pos += length
    except OSError:
        return None
    try:
        ident = orjson.loads(head[OFF_IDENTITY:].split(b"\0", 1)[0] or b"{}")
    except orjson.JSONDecodeError:
        ident = {}
    if not isinstance(ident, dict):
        ident = {}
    (sig, code, _addr, tid, sig_ns, exit_set, exit_code, exit_ns, term_set, tlen, wlen, term_ns,
     _term_tid) = _DEATH.unpack_from(head, OFF_DEATH)
    stop_sig, _, stop_ns = _STOP.unpack_from(head, OFF_STOP)
    death = Death(signal=sig, signal_code=code, signal_tid=tid, signal_ns=sig_ns,
                  exit_code=exit_code if exit_set else None, exit_ns=exit_ns, terminate_ns=term_ns,
                  stop_signal=stop_sig, stop_ns=stop_ns)
    if term_set:
        death.terminate_type = head[OFF_TERM_TYPE:OFF_TERM_TYPE + min(tlen, 256)].decode("utf-8", "replace")
        death.terminate_what = head[OFF_TERM_WHAT:OFF_TERM_WHAT + min(wlen, 2048)].decode("utf-8", "replace")
    elif not sig and not exit_set and (came := term_noted(Path(path))):
        death.signal, death.signal_ns, death.coarse = signal.SIGTERM, came, True  # (the Python recorder's note)
    tables, meta, kept = bytearray(), None, []
    for typ, off, length in _records(table):
        if typ == blocks.META_REC:
            meta = table[off + blocks.HEADER.size:off + length]
        elif typ == blocks.EVENT_REC:
            kept.append(table[off + blocks.HEADER.size:off + length])
        else:
            tables += table[off:off + length]
    return Image(path=Path(path), identity=ident, pid=_I64.unpack_from(head, OFF_PID)[0],
                 rank=_I32.unpack_from(head, OFF_RANK)[0], incarnation=_I32.unpack_from(head, OFF_INC)[0],
                 head=hd, tail=lay.tail, dropped=_U64.unpack_from(head, OFF_DROPPED)[0],
                 flags=struct.unpack_from("<I", head, OFF_FLAGS)[0], tables=bytes(tables), meta=meta, kept=kept,
                 ring=bytes(ring), end=start + len(ring), death=death, stored=_U64.unpack_from(head, OFF_STORED)[0])


def term_noted(path: Path) -> int:
    """When a SIGTERM came to the Python recorder's rank whose spool is ``path``: the mtime of
    the stacks faulthandler wrote as it came (``TERM_SUFFIX``), else 0.  Registered only while
    SIGTERM had its default action, so the signal ended the process."""
    try:
        st = os.stat(Path(path).with_suffix(TERM_SUFFIX))
    except OSError:
        return 0
    return st.st_mtime_ns if st.st_size > 0 else 0


def exit_event(img: Image, rank: int) -> dict | None:
    """The ``exit`` event of the death the header records (None: it recorded none, e.g. a
    rank killed outright)."""
    d = img.death
    base: dict[str, Any] = {"type": "exit", "v": SCHEMA_VERSION, "rank": rank, "src": "spool"}
    if d.signal:
        ev = dict(base, ts=d.signal_ns, reason="signal", signal=signal_name(d.signal))
        if d.coarse:
            ev["approx"] = True  # (readers allow for it: ``rankstate.clock_slack``)
        if d.signal_tid:
            ev["tid"] = d.signal_tid & ((1 << 62) - 1)
    elif d.terminate_type is not None:
        ev = dict(base, ts=d.terminate_ns, reason="signal", signal=signal_name(signal.SIGABRT))
    elif d.exit_code is not None:
        return dict(base, ts=d.exit_ns, reason="os._exit", code=d.exit_code, **d.stop_fields())
    else:
        return None
    ev.update(d.stop_fields())
    if d.terminate_type is not None:
        what = d.terminate_what or ""
        ev["exc"] = f"{d.terminate_type}: {what}" if what else d.terminate_type
    return ev


def remnant_lines(img: Image, rank: int, *, with_meta: bool = False) -> list[bytes]:
    """The events a dead rank's spool adds to its stream, encoded: its meta (if asked and
    noted), the records the store lacks as one self-describing block, the stacks
    faulthandler wrote, and how it died."""
    out: list[bytes] = []
    if with_meta and img.meta:
        out.append(_redacted(bytes(img.meta)))
    now = max(img.death.signal_ns, img.death.exit_ns, img.death.terminate_ns) or last_record_ns(img) or time.time_ns()
    if img.ring:  # error messages the rank never sent are redacted here (the live drain does its own)
        n = sum(1 for _ in _records(img.ring))
        out.append(blocks.encode_block(blocks.mask_texts(img.tables + img.ring), rank, now, n,
                                       pos=img.end - len(img.ring), end=img.end))
    # An exit kept for a forwarder and then stored after all is not sent; of several kept
    # (a process can keep only one; a spool is untrusted input), the last.
    stored = bool(img.flags & EXIT_STORED)
    ended = bool(img.flags & GROUP_ENDED) and not stored
    exits = [k for k, line in enumerate(img.kept) if _is_exit(line)]
    unsent = set(exits if stored else exits[:-1])
    out.extend(_redacted(line) for k, line in enumerate(img.kept) if k not in unsent)
    stack = crash_stack(img, rank)
    if stack is not None:
        out.append(orjson.dumps(redact_event(stack)))
    if stored:
        return out  # its own exit is in the store: another one would be a second ending
    ex = exit_event(img, rank)
    if ex is None and stack is not None:  # faulthandler saw a fatal signal the header missed
        ex = crashlog.exit_from(stack, img.death.signal_ns or stack["ts"], rank)
        ex.update(img.death.stop_fields())
    if ex is not None and not exits:  # (a kept exit, sent above, is the rank's own word)
        if ended and not (ex.get("reason") == "signal" and ex.get("signal") not in _STOPS
                          or ex.get("reason") == "os._exit" and ex.get("code")):
            return out  # (its group ended, and it left, or its launcher stopped it: no death of its own)
        out.append(orjson.dumps(redact_event(ex)))  # std::terminate's what() is the program's text
    return out


def last_record_ns(img: Image) -> int:
    """The time of the spool's last record (0: none): a rank's last sign of life where its
    death left no word.  A remnant timed when it was forwarded, seconds later, made a rank
    killed outright look heard from after its peers failed on it, and nobody was blamed."""
    ring = img.ring
    return max((blocks.HEADER.unpack_from(ring, off)[4] for _, off, _ in _records(ring)), default=0)


def gone_exit(img: Image, rank: int) -> dict:
    """The ``exit`` of a rank whose spool holds no word of its death (SIGKILL, the OOM
    killer): timed at its last record, else at the spool's last change (the same each time
    a reader that may not forward reads it; readers take the rank's last word where that is
    earlier, as for a launcher's)."""
    try:
        changed = img.path.stat().st_mtime_ns
    except OSError:
        changed = time.time_ns()
    return {"type": "exit", "v": SCHEMA_VERSION, "rank": rank, "ts": last_record_ns(img) or changed,
            "src": "spool", "reason": GONE, **img.death.stop_fields(),
            **({"term_unwatched": True} if img.flags & TERM_UNWATCHED else {})}


def _redacted(line: bytes) -> bytes:
    """A line a spool kept, its text redacted (it was when made; a spool may be older)."""
    if line.startswith(blocks.LINE_PREFIX):
        return blocks.mask_line(line)
    try:
        ev = orjson.loads(line)
    except orjson.JSONDecodeError:
        return line
    return orjson.dumps(redact_event(ev)) if isinstance(ev, dict) else line


def crash_stack(img: Image, rank: int) -> dict | None:
    """The ``stack`` event of the crash file faulthandler wrote next to the spool."""
    crash = img.path.with_suffix(CRASH_SUFFIX)
    try:
        st = os.stat(crash)
        if st.st_size == 0:
            return None
        with open(crash, "rb") as f:
            text = f.read(crashlog.MAX_BYTES).decode("utf-8", "replace")
    except OSError:
        return None
    error, threads = crashlog.parse(text, tid=img.death.signal_tid or None)
    if not threads:
        return None
    ts = img.death.signal_ns or st.st_mtime_ns
    ev: dict[str, Any] = {"type": "stack", "v": SCHEMA_VERSION, "rank": rank, "ts": ts, "reason": "signal",
                          "threads": threads}
    if error:
        ev["exc"] = f"Fatal Python error: {error}"
    return ev


# ------------------------------------------------------------------------------ finding dead spools
#: The spools this process holds (created, not yet closed).  Its own forwarders and readers
#: never open them: closing any other descriptor of a file drops every POSIX lock the
#: process holds on it, so a live spool would look dead to everyone (and, in this process,
#: the lock test succeeds anyway: a recording process that read its own store forwarded its
#: live spool to its own stream, then removed it under the recorder, a SIGBUS).
_HELD: set[Path] = set()


def _spools(directory: Path) -> list[Path]:
    """The spools in ``directory``, but those this process holds."""
    try:
        return sorted(p for p in directory.iterdir() if p.name.endswith(SUFFIX) and p not in _HELD)
    except OSError:
        return []


@contextlib.contextmanager
def _claimed(path: Path) -> Iterator[int | None]:
    """The spool's lock if its owner is gone (None while it lives, or another forwarder
    holds it).  Never called on a spool of this process: closing a second descriptor of a
    file drops every POSIX lock the process holds on it."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        yield None
        return
    try:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            yield None
            return
        yield fd
    finally:
        os.close(fd)


#: A dead spool nobody could forward for this long is given up (its store is gone or out of
#: reach for good); it is removed so that dead spools never fill /dev/shm.
MAX_AGE_S = 3 * 86400


def dead_spools(job: str, store: str, own: set[Path] = frozenset(), run: str | None = None) -> list[Path]:
    """Spools of this job and store (and run, if given) whose owner is gone, in every spool
    directory.  Dead spools of any job older than MAX_AGE_S, and tombstones of any job older
    than TOMBSTONE_AGE_S (a header only, left for a launcher that by then has said what it
    saw), are removed on the way: a tombstone was removed only by a forwarder of its own job,
    and one nobody read again stayed, its empty crash file beside it (helper-193)."""
    sid = store_id(store)
    out = []
    for d in spool_dirs():
        for p in _spools(d):
            if p in own:
                continue
            img_ident = _identity(p)
            mine = (img_ident.get("job") == job and img_ident.get("store_id") == sid
                    and (run is None or img_ident.get("run") == run))
            age = _age(p)
            old = age > MAX_AGE_S or age > TOMBSTONE_AGE_S and _size(p) == HEADER_SIZE
            if not mine and not old:
                continue
            with _claimed(p) as fd:
                if fd is None:
                    continue
                if mine:
                    out.append(p)
                else:
                    _remove(p)
    return out


def _identity(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            f.seek(OFF_IDENTITY)
            raw = f.read(IDENTITY_SIZE).split(b"\0", 1)[0]
        ident = orjson.loads(raw or b"{}")
    except (OSError, orjson.JSONDecodeError):
        return {}
    return ident if isinstance(ident, dict) else {}


def forward_dead(job: str, store: str, open_writer: Callable[[int, int], Any], own: set[Path] = frozenset(),
                 exit_status: Callable[[int], int | None] | None = None, run: str | None = None) -> int:
    """Forward every dead spool of this job and store to its rank's stream; returns how
    many.  ``open_writer(rank, incarnation)`` gives a writer appending to that stream;
    ``exit_status(pid)`` the launcher's view of a process's exit (negative: the signal that
    killed it), which names a death the process could not record itself (SIGKILL).  A
    rank of a running job forwards its own run's spools only (``run``): an earlier run
    under the same job id is not its to mix in."""
    done = 0
    for path in dead_spools(job, store, own, run):
        with _claimed(path) as fd:
            if fd is None:
                continue  # another forwarder took it meanwhile
            img = read(path, fd)
            if img is None or img.flags & CLOSED:
                _remove(path)
                continue
            rank = img.rank if img.rank >= 0 else img.identity.get("rank")
            if not isinstance(rank, int) or rank < 0:
                _remove(path)
                continue
            if img.flags & FORWARDED:  # records already in the store: only the launcher can add more
                lines = []
            else:
                lines = remnant_lines(img, rank, with_meta=not img.flags & META_STORED)
            known = _says_its_end(img, lines)
            if exit_status is not None and not known:
                status = exit_status(img.pid)
                if status is not None:
                    lines.append(orjson.dumps(launcher_exit(rank, status)))
                    known = True
            if not known and not img.flags & FORWARDED:
                # (a launcher that sees its exit status may say how, later: the tombstone stays)
                lines.append(orjson.dumps(gone_exit(img, rank)))
            try:
                sent = not lines or _send(lines, img, open_writer, rank)
            except _Unreachable:  # (the store will not open for the job's other spools either: one try a pass)
                give_back_room(fd)
                break
            if not sent:
                give_back_room(fd)  # (left for someone else: only what they will read is kept)
                continue
            os.pwrite(fd, _U64.pack(img.end), OFF_TAIL)
            if known or _age(path) > TOMBSTONE_AGE_S:
                os.pwrite(fd, struct.pack("<I", img.flags | CLOSED), OFF_FLAGS)
                _remove(path)
            elif not img.flags & FORWARDED:
                # SIGKILL or the OOM killer: nothing in the process could say so.  Keep the header
                # (its pid) as a tombstone so the launcher, which sees the exit status, can.
                os.pwrite(fd, struct.pack("<I", img.flags | FORWARDED | META_STORED), OFF_FLAGS)
                os.ftruncate(fd, HEADER_SIZE)
            else:
                continue
            done += 1
    return done


class _Unreachable(Exception):
    """The store would not open for a spool (out of reach, full, refusing this user)."""


def _send(lines: list[bytes], img: Image, open_writer: Callable[[int, int], Any], rank: int) -> bool:
    """Append a dead spool's ``lines`` to its rank's stream; False where they could not go:
    the stream is another run's (a job id used twice: not ours to mix in), or the store
    may not be written; _Unreachable where it would not open."""
    try:
        writer = open_writer(rank, img.incarnation)
    except Exception:
        raise _Unreachable from None
    try:
        if not _same_run(writer, img.identity.get("run")):
            return False
        date_job = getattr(writer, "date_job", None)
        if date_job is not None:  # (a job first put in the store's index now: by its rank's start, even
            date_job(_started_ns(img))  # should the write fail: helper-164)
        resume_after = getattr(writer, "resume_after", None)
        if resume_after is not None:  # (a stream now shorter than the rank left it: said first)
            resume_after(img.stored, _redacted(bytes(img.meta)) if img.meta else None)
        writer.write(lines)
        return True
    except Exception:
        return False
    finally:
        writer.close()


def stranded(store: str, launch: str) -> list[Path]:
    """The dead spools of ``store`` that ranks of the launch ``launch`` left (``ENV_LAUNCH``)
    and whose records no forwarder could send (the store refused them: a job id another run
    holds, say): a launcher says they are not in the trace (helper-166: it said "diagnose
    with" of a run the store had refused whole).  Another launch's are not its to say
    (helper-167: a launcher running beside the refused one said so of its own job)."""
    sid = store_id(store)
    out = []
    for d in spool_dirs():
        for p in _spools(d):
            ident = _identity(p)
            if ident.get("store_id") != sid or ident.get("launch") != launch:
                continue
            with _claimed(p) as fd:
                img = read(p, fd) if fd is not None else None
                if img is not None and not img.flags & (CLOSED | FORWARDED):
                    out.append(p)
    return out


def _started_ns(img: Image) -> int:
    """When the spool's rank started, as its meta says (0 where it does not)."""
    try:
        ts = orjson.loads(bytes(img.meta)).get("ts") if img.meta else 0
    except (orjson.JSONDecodeError, AttributeError):
        return 0
    return ts if isinstance(ts, int) and ts > 0 else 0


def _says_its_end(img: Image, lines: list[bytes]) -> bool:
    """The rank's end is known: its own exit is in the store, or among ``lines`` (its
    remnant) there is one; else a forwarder adds one."""
    return bool(img.flags & (EXIT_STORED | GROUP_ENDED)) or any(map(_is_exit, lines))


def _is_exit(line: bytes) -> bool:
    """An encoded ``exit`` event (as this module's and the recorder's lines spell it)."""
    return b'"type":"exit"' in line


def _size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return -1


def _age(path: Path) -> float:
    try:
        return time.time() - os.stat(path).st_mtime
    except OSError:
        return 0.0


def forward_orphans(exit_status: Callable[[int], int | None] | None = None,
                    stores: Callable[[str], str | None] | None = None, only: str | None = None) -> int:
    """Forward every dead spool on this host whose store can be named: a launcher whose
    command ended.  ``stores(store_id)`` gives the launcher's own store (with its
    credentials) when it is that one; otherwise the spool's own record of its store is
    used, unless it had to hide a password.  ``only``: spools of that store (a reader of
    it: a job whose ranks never reached it is found so).  Returns how many were
    forwarded."""
    from commscope.store import backend_for, open_writer

    done = 0
    seen: set[tuple[str, str]] = set()
    for d in spool_dirs():
        for p in _spools(d):
            ident = _identity(p)
            job, sid = ident.get("job"), ident.get("store_id")
            if not isinstance(job, str) or not isinstance(sid, str) or (job, sid) in seen:
                continue
            if only is not None and sid != only:
                continue
            store = (stores(sid) if stores is not None else None) or ident.get("store")
            if not isinstance(store, str) or "***" in store or store_id(store) != sid:
                with _claimed(p) as fd:  # (dead: a forwarder that holds its store's password may come)
                    if fd is not None:
                        give_back_room(fd)
                continue
            seen.add((job, sid))

            # (the job its rank wrote: the one its own store's name pinned (``?job=``), else its
            # id; never the pinning reader's or launcher's: helper-164 found another job's rank
            # in it.  The store opened without a pin, the job given)
            own = ident.get("store")
            try:
                pinned = backend_for(own).pinned_job(own) if isinstance(own, str) else None
            except Exception:
                pinned = None

            def writer(rank: int, inc: int, store: str = backend_for(store).unpinned(store),
                       job: str = pinned or job) -> Any:
                return open_writer(store, job, rank, incarnation=inc, resume=True, connect_timeout=2.0)

            done += forward_dead(job, store, writer, exit_status=exit_status)
    return done


#: fallocate(2)'s FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE (Linux): pages given back, the
#: file's size and layout kept, zeros read where they were
_PUNCH = 0x01 | 0x02
_fallocate: list[Any] = []


def give_back_room(fd: int) -> int:
    """Give back the memory of a dead spool that cannot be forwarded yet (its store out of
    reach, or named without its password), but for what a forwarder reads of it: the header,
    the records past the tail, the slack they may run into, the table's used part.  Holes
    are punched, so the layout stays.  Before, each such spool held its whole ring (16 MiB)
    and table (4 MiB) in /dev/shm until MAX_AGE_S: the ranks of a host that died against an
    unreachable store filled it, and the ranks after them had no spool.  Returns the bytes
    given back (0 where the filesystem cannot punch holes)."""
    import ctypes
    import ctypes.util
    import mmap

    lay = _layout(os.pread(fd, HEADER_SIZE, 0))
    if lay is None:
        return 0
    ring_off, ring_size, n = lay.ring_off, lay.ring_size, lay.head - lay.start
    keep = [(0, ring_off), (ring_off + ring_size, lay.table_off + lay.table_used)]  # (the slack with it)
    if n:
        start = lay.start & (ring_size - 1)
        if start + n <= ring_size:
            keep.append((ring_off + start, ring_off + start + n))
        else:
            keep += [(ring_off + start, ring_off + ring_size), (ring_off, ring_off + start + n - ring_size)]
    if not _fallocate:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        call = getattr(libc, "fallocate", None)
        if call is not None:
            call.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
        _fallocate.append(call)
    punch = _fallocate[0]
    if punch is None:
        return 0
    st = os.fstat(fd)
    page, given, at, end = mmap.PAGESIZE, 0, 0, st.st_size
    try:
        for lo, hi in [*sorted(keep), (end, end)]:
            first, last = -(-at // page) * page, min(lo, end) // page * page  # (whole pages: a part is zeroed)
            if last > first:
                if punch(fd, _PUNCH, first, last - first) != 0:
                    break
                given += last - first
            at = max(at, hi)
    finally:
        if given:  # (its mtime dates the rank's last record where it holds none: ``gone_exit``)
            with contextlib.suppress(OSError):
                os.utime(fd, ns=(st.st_atime_ns, st.st_mtime_ns))
    return given


def _same_run(writer: StoreWriter, run: Any) -> bool:
    """The stream the writer appends to is empty, or belongs to ``run`` (its meta says so)."""
    if not isinstance(run, str) or run == "?":
        return True
    ev = writer.first_event()
    return ev is None or ev.get("run") in (None, run)


def launcher_exit(rank: int, status: int) -> dict:
    """The ``exit`` a launcher writes for a rank it saw die: negative status, a signal."""
    ev: dict[str, Any] = {"type": "exit", "v": SCHEMA_VERSION, "rank": rank, "ts": time.time_ns(), "src": "launcher"}
    if status < 0:
        ev.update(reason="killed", signal=signal_name(-status))
    else:
        ev.update(reason="exit", code=status)
    return ev


def _remove(path: Path) -> None:
    for p in (path, path.with_suffix(CRASH_SUFFIX), path.with_suffix(TERM_SUFFIX)):
        with contextlib.suppress(OSError):
            os.unlink(p)


def remnant_events(job: str, store: str, run_of: Callable[[int, int], str | None] | None = None
                   ) -> list[tuple[int, int, list[bytes]]]:
    """(rank, incarnation, encoded events) of every dead spool of this job and store, read
    without forwarding (a reader that may not write to the store).  ``run_of(rank,
    incarnation)``: the run the store holds of that stream (None: it cannot say): a spool of
    another run (the same job id given to two runs at once, the second refused by the store)
    is not this job's, as forwarding would not mix it in (``_same_run``); helper-166 found
    its failures read as the first run's.  A spool whose rank never learnt its run ("?") is
    read."""
    out = []
    for path in dead_spools(job, store):
        img = read(path)
        if img is None or img.flags & (CLOSED | FORWARDED):
            continue
        theirs = img.identity.get("run")
        rank = img.rank if img.rank >= 0 else img.identity.get("rank")
        if run_of is not None and isinstance(theirs, str) and theirs != "?" and isinstance(rank, int) \
                and run_of(rank, img.incarnation) not in (None, theirs):
            continue
        if isinstance(rank, int) and rank >= 0:
            lines = remnant_lines(img, rank, with_meta=False)
            if not _says_its_end(img, lines):
                lines.append(orjson.dumps(gone_exit(img, rank)))
            out.append((rank, img.incarnation, lines))
    return out

