"""How a writer starts the children that work beside it (the closer of a segment,
``store/retention.py``; the keeper of a directory's keyframes, ``store/keyframes.py``; the
keeper of a Redis job's keyframes, ``store/redis_keeper.py``): at the lowest priority, apart
from the rank's session, so the rank never waits on them."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import select
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, BinaryIO

if TYPE_CHECKING:
    from commscope.store.base import Stream

#: Linux's fcntl that sets a pipe's size (``fcntl.F_SETPIPE_SZ`` from Python 3.10 on some builds only)
F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)


@functools.cache
def lowest_priority() -> tuple[str, ...]:
    """What runs a child at the lowest priority (``nice``, looked up once, not at every new
    segment; nothing where there is none)."""
    nice = shutil.which("nice")
    return (nice, "-n", "19") if nice else ()


def start(module: str, *args: str, stdin: int | None = subprocess.DEVNULL) -> subprocess.Popen | None:
    """``python -m module args`` at the lowest priority, in a session of its own, its output
    discarded; None when it cannot be started."""
    try:
        return subprocess.Popen([*lowest_priority(), sys.executable, "-m", module, *args], stdin=stdin,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True,
                                start_new_session=True)
    except OSError:
        return None


def end_line(stream: Stream) -> bytes:
    """The command that tells a keeper to stop following ``stream`` (its writer closed)."""
    return b"%d %d end\n" % stream


def ended(line: bytes) -> Stream | None:
    """The stream an ``end_line`` names; None for any other line."""
    parts = line.split()
    if len(parts) != 3 or parts[2] != b"end" or not (parts[0].isdigit() and parts[1].isdigit()):
        return None
    stream = int(parts[0]), int(parts[1])
    return stream if line.rstrip(b"\n") == end_line(stream).rstrip(b"\n") else None


#: A keeper whose writers all closed waits this long for the process's next one (s)
LINGER_S = 5.0


class Idle:
    """When a keeper's last followed stream was ended (``end_line``), and whether it has
    waited ``LINGER_S`` since with none named: then it ends (``Keeper.done``)."""

    def __init__(self, now: Callable[[], float] = time.monotonic) -> None:
        self.now = now
        self.since: float | None = None

    def note(self, following: int, ended: bool) -> None:
        """After a batch of commands: ``following`` streams followed, ``ended``: one was ended."""
        if following:
            self.since = None
        elif ended and self.since is None:
            self.since = self.now()

    def over(self) -> bool:
        return self.since is not None and self.now() - self.since >= LINGER_S


class Commands:
    """A keeper's end of its writers' pipe (``Keeper``): the command lines they send."""

    def __init__(self, pipe: BinaryIO) -> None:
        self.fd = pipe.fileno()
        self._buf = b""

    def wait(self, timeout: float) -> list[bytes] | None:
        """The whole lines sent within ``timeout`` seconds (none where nothing came); None once
        every writer is gone (the pipe ended: the keeper's cue to end)."""
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return []
        got = os.read(self.fd, 1 << 16)
        if not got:
            return None
        self._buf += got
        *lines, self._buf = self._buf.split(b"\n")
        self._buf = self._buf[-4096:]  # (a command is one short line: no more is ever kept of one)
        return lines


class Keeper:
    """A writing process's keeper of one store (``python -m module args`` in a child): the
    writers of its streams name them to it, one command line each, on its standard input.
    One a process and store, not a stream: a process writing many ranks (``bench scale``)
    starts one child, not thousands.  ``preamble``: what the child reads first, at each
    start (a Redis URL, which may hold a password: never on a command line others can list)."""

    _of: dict[tuple, Keeper] = {}
    _of_lock = threading.Lock()
    #: A keeper that died is started again at most this often (s)
    RESPAWN_S = 30.0

    def __init__(self, module: str, args: tuple[str, ...], preamble: bytes = b"") -> None:
        self.module = module
        self.args = args
        self.preamble = preamble
        self._child: subprocess.Popen | None = None
        self._started = -1e18
        #: each followed stream's newest command line: a keeper started again is told them
        #: all; the child ends when the last stream is done
        self._streams: dict[Stream, bytes] = {}
        self._lock = threading.Lock()  # (the class's guards ``_of``: a spawn here holds up no other store's writers)

    @classmethod
    def of(cls, module: str, *args: str, preamble: bytes = b"", secret: bytes = b"") -> Keeper:
        """The keeper of this process for ``module args`` and ``secret`` (what the child is
        told, apart from its command line: a store's URL), made at the first call, with the
        ``preamble`` of that call."""
        key = (os.getpid(), module, args, secret)  # (a forked child starts its own: the pipe is the parent's)
        with cls._of_lock:
            got = cls._of.get(key)
            if got is None:
                got = cls._of[key] = cls(module, args, preamble)
            return got

    def follow(self, stream: Stream, line: bytes) -> None:
        """Tell the keeper ``line`` (a command ended by a newline) about ``stream``; it stands
        for the stream from now on, told again to a keeper started again."""
        with self._lock:
            self._streams[stream] = line
            self._send([line])

    def ensure(self) -> None:
        """A keeper that died (killed, out of memory) started again, told every stream's
        line (at most every ``RESPAWN_S``): a writer asks now and then."""
        with self._lock:
            if self._streams and (self._child is None or self._child.poll() is not None):
                self._send([])

    def _send(self, lines: list[bytes]) -> None:
        """Tell the keeper ``lines`` (every stream's, where it is a new one), each whole or not
        at all, never waiting: a line a keeper behind has no room for is dropped (its
        stream gets no keyframes, and windows start there as without them)."""
        for _ in range(2):
            child, fresh = self._running()
            if child is None or child.stdin is None:
                return
            fd = child.stdin.fileno()
            try:
                for line in [self.preamble, *self._streams.values()] if fresh else lines:
                    if line:
                        os.write(fd, line)  # (a line well under PIPE_BUF: written whole or not at all)
                return
            except BlockingIOError:
                return
            except OSError:
                self._child = None  # (died: started again, once)

    def cpu_s(self) -> float:
        """CPU seconds its child has used so far (0 where none runs; a child started again
        counts from its start)."""
        import psutil

        child = self._child
        if child is None:
            return 0.0
        try:
            t = psutil.Process(child.pid).cpu_times()
        except psutil.Error:
            return 0.0
        return t.user + t.system

    def done(self, stream: Stream) -> None:
        """``stream``'s writer closed: the child stops following it (``end_line``).  A child
        whose streams all ended so waits ``LINGER_S`` for the process's next writer, then ends
        by itself (``Idle``): a process writing stream after stream (``commscope copy``, a
        synthetic store) starts one child, not one a stream (256 ranks written one after
        another started 256, ~0.2 s of CPU each: 35 s to write against 5.3 s now).  No thread
        waits for it here (a thread a closed writer, living 5 s, made the readers' workers
        start afresh rather than forked: ``bulkread.start_method``); it is reaped when the
        next writer asks, or with the process."""
        with self._lock:
            self._streams.pop(stream, None)
            child = self._child
            if child is None:
                return
            if child.stdin is not None and child.poll() is None:
                with contextlib.suppress(OSError):  # (a line well under PIPE_BUF: whole or not at all)
                    os.write(child.stdin.fileno(), end_line(stream))
            if not self._streams:
                self._started = -1e18  # (the next writer starts one at once where this one ended idle)

    def _running(self) -> tuple[subprocess.Popen | None, bool]:
        """The child, and whether it was started just now."""
        if self._child is not None and self._child.poll() is None:
            return self._child, False
        now = time.monotonic()
        if now - self._started < self.RESPAWN_S:
            return None, False
        self._started = now
        self._child = start(self.module, *self.args, stdin=subprocess.PIPE)
        if self._child is not None and self._child.stdin is not None:
            fd = self._child.stdin.fileno()
            os.set_blocking(fd, False)  # (a keeper that stopped reading never blocks a writer)
            with contextlib.suppress(OSError):  # (room for 16k streams' lines at once, where Linux allows)
                fcntl.fcntl(fd, F_SETPIPE_SZ, 1 << 20)
        return self._child, True
