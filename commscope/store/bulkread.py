"""A whole read of a large directory store, its streams decoded in worker processes.

Decoding is most of a read (a job of 16k ranks writes millions of blocks), and each rank's
stream decodes alone, so ``DirectoryReader.bulk`` hands chunks of streams to workers: child
processes forked from the reader where that is safe (``start_method``: a process running no
other thread, on Linux; no imports to pay, ~0.13 s of CPU a worker) and plain ones
(``python -m commscope.store.bulkread``) elsewhere, nothing of the caller's program imported
in them.  Each reads its streams to their ends exactly as a reader
would (``DirectoryReader.read_streams``, named to the worker by ``TARGET``, so this module
imports no store) and sends back what it read; the reader ingests a chunk while the
workers decode the next (a thread of the reader takes their messages as they come) and
then goes on from where they stopped.  A worker that fails,
or gives nothing for ``STALL_S``, leaves its chunk to the reader: a parallel read never
reads less than a sequential one.

The protocol: pickles, each behind its length (8 bytes, little-endian), a job down the
worker's stdin, what it read up its stdout; ``None`` ends the worker.  The worker reads only
files of the job directory it is given, like any reader.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import importlib
import math
import os
import pickle
import queue
import select
import selectors
import signal
import struct
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from typing import IO, Any, NamedTuple, NoReturn

from commscope.oprecords import Spans
from commscope.store.base import Batch, ReadStats, Stream
from commscope.store.segments import Segment

_LEN = struct.Struct("<Q")
#: How read workers start (``start_method``): "fork" or "spawn"; unset, the safe fastest
ENV_START = "COMMSCOPE_READ_START"
#: A forked worker's process name (``ps -o comm``, ``top``): its command line is its caller's
FORKED_NAME = "commscope-read"
#: What a worker runs on each job: "module:function", called with the ``Job``
TARGET = "commscope.store.directory:read_streams"


class Job(NamedTuple):
    """Streams of a job directory to read, with their segments (the worker lists nothing)."""

    job_dir: str
    since_ns: int | None
    streams: dict[Stream, list[Segment]]
    #: count the lines read (``DirectoryReader.counts_lines``): for a reader that goes on
    #: reading (a console's first read), which takes a later ``store_lost`` marker against them
    counts_lines: bool = False


class DecoderState(NamedTuple):
    """What a stream's block decoder keeps from one reader to the next: op names, dtypes,
    the ring position decoded up to, its groups and sites, the any-source recvs waiting for
    their source."""

    names: list[str] | None
    dtypes: list[str]
    seen_end: int
    groups: dict[int, Any]
    sites: dict[int, str]
    waiting: dict[int, int]
    #: whether the ring position is still to be taken (from the first block found, or the
    #: meta's ``ring`` where the read starts at the stream's first line): ``seen_end`` 0 does
    #: not say it (a meta saying ``ring`` 0 read, no block yet)
    ring_open: bool = True
    from_start: bool = False


class StreamsRead(NamedTuple):
    """What a worker read of some streams: the batch, the reader's stats, where each stream
    stopped (segment, bytes read of each segment, an incomplete last line), each stream's
    decoder state, highest op id and the recorder's drops read (``TraceReader.drops_read``).
    ``packed``: the batch's op records in one piece (``oprecords.packed``; the batch then
    holds none), as a worker sends them."""

    batch: Batch
    stats: ReadStats
    reading: dict[Stream, int]
    read_of: dict[tuple[Stream, int], int]
    partial: dict[Stream, bool]
    decoders: dict[Stream, DecoderState]
    max_ids: dict[Stream, int]
    packed: Spans | None = None
    drops_read: dict[Stream, int] | None = None
    #: each stream's lines read, the segments below which a marker it read counted those gone,
    #: and the last bytes read of each segment (``DirectoryReader._lines_read``, ``_gone_upto``,
    #: ``_last_read``: what a reader going on from the worker's read takes a loss against, and
    #: tells a file written again under its name by)
    lines_read: dict[Stream, int] | None = None
    gone_upto: dict[Stream, int] | None = None
    last_read: dict[tuple[Stream, int], bytes] | None = None
    #: the streams entered at a later segment whose meta's ``lines_before`` is not taken yet (no
    #: complete line read there: a segment just rotated into, a torn first write), the segment
    #: whose meta was taken last, and the segments not listed when each was entered
    #: (``DirectoryReader._rebase``, ``_rebased_at``, ``_unlisted``): a reader going on from
    #: the worker's read takes them as its own
    rebase: frozenset[Stream] | None = None
    rebased_at: dict[Stream, tuple[int, int]] | None = None
    unlisted: dict[Stream, list[tuple[int, int]]] | None = None
    #: the lines counted lost otherwise (segments gone, passed over; a damaged line) that the
    #: next gap in each stream's ring positions stands for, not counted yet
    #: (``DirectoryReader._gone_excuse``, ``_excused``): a reader going on counts it once
    gone_excuse: dict[Stream, int] | None = None
    excused: dict[Stream, int] | None = None
    #: the segment each stream went on from to the next, and the one it entered passing over
    #: segments gone (``DirectoryReader._moved_on``, ``_resync``): a reader going on counts a
    #: cut end, and takes its lines again, as the worker would have
    moved_on: dict[Stream, int] | None = None
    resync: dict[Stream, int] | None = None
    #: the segments whose cut end it counted (``DirectoryReader._cut_counted``): not again
    #: from their summaries once retention deletes them
    cut_counted: frozenset[tuple[Stream, int]] | None = None
    #: the streams read to their ends with no line torn: their newest segment's number and
    #: size then (``DirectoryReader._tails``: a poll after it finds one quiet by its size)
    tails: dict[Stream, tuple[int, int]] | None = None

    def sent(self) -> StreamsRead:
        """As a worker sends it: the op records in one piece where they go so."""
        piece = self.batch.in_one_piece()
        return self if piece is None else self._replace(batch=self.batch._replace(ops=[], spans=None), packed=piece)

    def received(self) -> Batch:
        """The batch as read, each stream's records a view of the piece they came in
        (``Batch.spans``: the model takes them as arrays)."""
        if self.packed is None:
            return self.batch
        return Batch.of_piece(self.batch.events, self.packed, self.batch.beats)


def send(f: IO[bytes], obj: Any, deadline: float | None = None) -> None:
    """``obj`` pickled, its arrays' memory written as it is after the pickle (protocol 5's
    buffers out of band): neither side copies a column into or out of the pickle, which
    cost a 16k-rank read's reading process ~0.7 s of its ~14.  ``deadline``
    (``time.monotonic``; ``f`` a pipe set non-blocking): TimeoutError where the reader stops
    taking it before then."""
    buffers: list[pickle.PickleBuffer] = []
    data = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    try:
        raws = [b.raw() for b in buffers]
    except BufferError:  # (a buffer not in one piece: all in the pickle)
        data, raws = pickle.dumps(obj, protocol=5), []
    head = _LEN.pack(len(data)) + _LEN.pack(len(raws)) + b"".join(_LEN.pack(r.nbytes) for r in raws)
    try:
        fd = f.fileno()
    except (AttributeError, OSError):  # (not a file: written through it)
        for part in (head, data, *raws):
            f.write(part)
        f.flush()
        return
    f.flush()  # (what it holds goes first)
    for part in (head, data, *raws):
        _write_all(fd, part, deadline)


def _write_all(fd: int, data: bytes | memoryview, deadline: float | None = None) -> None:
    """All of ``data`` to a file descriptor, a write at a time as each takes part of it.
    Not through a buffered file: a pipe written through Python's buffered writer lost and
    repeated bytes when a tracer stopped the writer mid-write (py-spy sampling a worker or
    a read process: the next message was torn, or an array's bytes wrong).  A non-blocking
    descriptor is waited on until ``deadline`` (None: for as long as it takes)."""
    view = memoryview(data).cast("B")
    while view.nbytes:
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:
            poller = select.poll()
            poller.register(fd, select.POLLOUT)
            wait_ms = -1 if deadline is None else math.ceil(max(0.0, deadline - time.monotonic()) * 1000)
            if not poller.poll(wait_ms):
                raise TimeoutError(f"a message stopped being taken with {view.nbytes} bytes left") from None


def readable(f: IO[bytes], timeout_s: float) -> bool:
    """Whether ``f`` (a pipe) has bytes to read or has ended, waiting up to ``timeout_s``.
    Through ``poll``, not ``select``: ``select`` refuses a descriptor numbered past 1,023,
    and a reader holding a 16k-rank job's files opens its pipes past there."""
    return bool(ready([f], timeout_s))


def ready(files: list[IO[bytes]], timeout_s: float) -> list[int]:
    """Which of ``files`` (pipes) have bytes to read or have ended, waiting up to
    ``timeout_s`` for one (``readable`` of several at once)."""
    poller = select.poll()
    for f in files:
        poller.register(f, select.POLLIN)
    got = {fd for fd, _ in poller.poll(max(0, math.ceil(timeout_s * 1000)))}
    return [k for k, f in enumerate(files) if f.fileno() in got]


def _read(f: IO[bytes], n: int, deadline: float | None = None) -> bytearray:
    """``n`` bytes of ``f``, over as many reads as an unbuffered pipe takes (``ReadAhead``'s:
    64 KiB a read), into one buffer.  ``deadline`` (``time.monotonic``; ``f`` an unbuffered
    pipe): TimeoutError where the bytes stop coming before it."""
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        if deadline is not None and not readable(f, deadline - time.monotonic()):
            raise TimeoutError(f"a message stopped coming after {got} of {n} bytes")
        step = f.readinto(view[got:])  # type: ignore[attr-defined]
        if not step:
            raise EOFError("worker gone")
        got += step
    return buf


def receive(f: IO[bytes], deadline: float | None = None) -> Any:
    """What ``send`` wrote to ``f``.  ``deadline``: as ``_read``'s, for the whole message (a
    worker that stops in the middle of one, stuck or stopped, is not waited for past it)."""
    n, k = struct.unpack("<QQ", _read(f, 2 * _LEN.size, deadline))
    if k > 1 << 24:  # (~10 a stream's records, when they are not packed in one piece)
        raise EOFError("not a worker's message")
    sizes = struct.unpack(f"<{k}Q", _read(f, k * _LEN.size, deadline))
    data = _read(f, n, deadline)
    buffers = [_read(f, size, deadline) for size in sizes]
    return pickle.loads(data, buffers=buffers)


def cores() -> int:
    """The cores this process may run on (its affinity, where the system says it): how many
    worker processes are worth starting, and whether a console's read process is."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


#: What a worker's pipe holds (Linux: ``F_SETPIPE_SZ``, up to /proc/sys/fs/pipe-max-size,
#: 1 MiB by default): a chunk's ~2 MB (43 streams of 400 ops) came over in 64 KiB reads, a
#: poll and a read each
PIPE_BYTES = 1 << 20


def _widen(pipe: IO[bytes] | None) -> None:
    """``pipe`` holds ``PIPE_BYTES`` where the system lets it (else as it was)."""
    op = getattr(fcntl, "F_SETPIPE_SZ", None)
    if pipe is None or op is None:
        return
    with contextlib.suppress(OSError):
        fcntl.fcntl(pipe.fileno(), op, PIPE_BYTES)


def start_method() -> str:
    """How workers start: forked ("fork") where the process runs no other Python thread, on
    Linux, else started afresh ("spawn"); ``COMMSCOPE_READ_START`` says which where set.
    A forked worker has every module the reader imported and starts in a few milliseconds,
    where a fresh one pays ~0.13 s of CPU of imports (1k ranks on 2 cores: a whole read
    0.40-0.45 s against 0.45-0.54 s).  With another thread running (a console, a reader's
    own pump) a lock it held would stay held in the child: such a process starts them afresh."""
    asked = os.environ.get(ENV_START, "")
    if asked in ("fork", "spawn"):
        return asked if asked == "spawn" or hasattr(os, "fork") else "spawn"
    return "fork" if sys.platform == "linux" and threading.active_count() == 1 else "spawn"


class Forked:
    """A worker forked from this process, with the face of ``subprocess.Popen`` that
    ``Workers`` uses (``stdin``, ``stdout``, ``pid``, ``poll``, ``wait``, ``kill``).  The child
    keeps only its two pipes and /dev/null (every other descriptor closed: a worker forked
    later holding an earlier one's pipe would hide that worker's end), takes the signals as a
    fresh worker would, and leaves by ``os._exit`` (none of the caller's exit handlers, none
    of its buffers flushed twice)."""

    def __init__(self) -> None:
        _reap_abandoned()
        self.pid = 0
        self.returncode: int | None = None
        # (one thread waits for it at a time, as ``Popen``'s lock has it: the pump and the
        # caller may both end a worker, and an exit waited for twice is an exit code lost)
        self._waiting = threading.Lock()
        fds: list[int] = []
        # (every signal waits until the child has a fresh worker's handlers, and the parent
        # its ``pid``: a handler of the reader's run in the child might keep it alive, and one
        # that raised in the parent between the fork and ``self.pid`` left the child for good;
        # the mask as it was read first, so that one landing while it is blocked leaves
        # nothing blocked)
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, ())
        restored = False
        try:
            fds.extend(os.pipe())
            fds.extend(os.pipe())
            job_read, job_write, out_read, out_write = fds
            signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
            with warnings.catch_warnings():  # (Python 3.12's warning counts the OS's threads: an
                # idle BLAS pool, which takes care of a fork itself; no other Python thread runs)
                warnings.simplefilter("ignore", DeprecationWarning)
                self.pid = os.fork()
            if self.pid == 0:
                _forked_worker(job_read, out_write, mask)
            for fd in (job_read, out_write):
                fds.remove(fd)
                os.close(fd)
            self.stdin: IO[bytes] = open(job_write, "wb", buffering=0)  # noqa: SIM115 (closed by ``Workers.close``)
            fds.remove(job_write)
            self.stdout: IO[bytes] = open(out_read, "rb", buffering=0)  # noqa: SIM115
            fds.remove(out_read)
            restored = True
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # (a signal that waited lands here: below)
        except BaseException:  # (an interrupt among them: nothing of it left open, no child left waiting)
            self._discard(fds)
            raise
        finally:
            if not restored:
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)

    def _discard(self, fds: list[int]) -> None:
        """What a start cut short made: its descriptors closed, its child killed and waited for."""
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        for name in ("stdin", "stdout"):
            if (f := self.__dict__.get(name)) is not None:
                f.close()
        if self.pid > 0:
            self.kill()
            self.wait()

    def __del__(self) -> None:
        # (one dropped still running, its caller gone without ``Workers.close``: waited for
        # by the next fork, as ``Popen`` does, not left a zombie)
        try:
            if self.pid > 0 and self.returncode is None and self.poll() is None:
                _abandoned.append(self.pid)
        except Exception:  # (at the interpreter's exit, what it uses may be gone already)
            pass

    def poll(self) -> int | None:
        """Its exit code, None while it runs.  One waited for elsewhere already (a
        SIGCHLD handler of the caller's) counts as ended with 0, as ``Popen`` has it."""
        if self.returncode is None and self._waiting.acquire(blocking=False):  # (else another waits: not yet)
            try:
                if self.returncode is None:
                    pid, status = os.waitpid(self.pid, os.WNOHANG)
                    if pid:
                        self.returncode = os.waitstatus_to_exitcode(status)
            except ChildProcessError:
                self.returncode = 0
            finally:
                self._waiting.release()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Its exit code; ``subprocess.TimeoutExpired`` where it has not ended within ``timeout``."""
        if timeout is None:
            with self._waiting:
                if self.returncode is None:
                    try:
                        _, status = os.waitpid(self.pid, 0)
                    except ChildProcessError:
                        self.returncode = 0
                    else:
                        self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode
        deadline, pause = time.monotonic() + timeout, 0.0005
        while (code := self.poll()) is None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(f"read worker {self.pid}", timeout)
            time.sleep(min(pause, left))
            pause = min(2 * pause, 0.05)
        return code

    def kill(self) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)


#: Forked workers dropped while running (``Forked.__del__``), waited for by the next fork
_abandoned: list[int] = []


def _reap_abandoned() -> None:
    for pid in list(_abandoned):
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done = pid
        if done:
            _abandoned.remove(pid)


def _forked_worker(job_read: int, out_write: int, mask: set[signal.Signals]) -> NoReturn:
    """The child of ``Forked``: a worker on the two pipes, then gone.  ``mask``: the signal
    mask to restore once its handlers are a fresh worker's."""
    code = 1
    try:
        # (as ``exec`` leaves them: an ignored signal stays ignored, a handled one is the
        # default; SIGINT Python's own, as a fresh worker has it)
        for sig in signal.valid_signals():
            with contextlib.suppress(OSError, ValueError):
                handler = signal.getsignal(sig)
                if sig == signal.SIGINT and handler is not signal.SIG_IGN:
                    signal.signal(sig, signal.default_int_handler)
                elif callable(handler):
                    signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        os.dup2(job_read, 0)
        os.dup2(out_write, 1)
        os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
        _close_all_but_stdio()
        # (its own stdio objects, on /dev/null: the caller's, and their locks, are not touched)
        sys.stdout = sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
        os.environ["COMMSCOPE_NO_PROGRESS"] = "1"
        # (its command line is the caller's: ps and top tell it by this)
        with contextlib.suppress(OSError), open("/proc/self/comm", "w") as comm:
            comm.write(FORKED_NAME)
        code = serve(open(0, "rb", buffering=0), open(1, "wb", buffering=0))  # noqa: SIM115
    finally:
        os._exit(code)


def _close_all_but_stdio() -> None:
    """Every descriptor but 0-2 closed: those ``/proc/self/fd`` lists (a reader may hold 16k
    files), else all up to the limit."""
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        return
    for fd in fds:
        if fd > 2:
            with contextlib.suppress(OSError):
                os.close(fd)


def _fit(p: subprocess.Popen | Forked) -> None:
    """A worker's output pipe widened (``_widen``) and its input written with a deadline
    (non-blocking: a worker that stops taking a job larger than its pipe holds no one)."""
    _widen(p.stdout)
    if p.stdin is not None:
        os.set_blocking(p.stdin.fileno(), False)


class _Failed(NamedTuple):
    """What ended ``Workers._pump`` other than the end of its jobs."""

    error: BaseException


#: ``Workers._pump``: no more to come
_END = object()


class _Todo:
    """The jobs no one has taken yet, shared by ``Workers._pump`` (for the workers) and its
    caller (who reads one itself rather than wait)."""

    def __init__(self, jobs: list[Job]) -> None:
        self._jobs = list(reversed(jobs))
        self._lock = threading.Lock()

    def take(self) -> Job | None:
        with self._lock:
            return self._jobs.pop() if self._jobs else None

    def put_back(self, job: Job) -> None:
        with self._lock:
            self._jobs.append(job)


class Workers:
    """Worker processes reading chunks of streams; ``run`` yields what each chunk gave, and
    the chunks no worker could read (for the caller to read), in the order they finish."""

    #: How a worker starts
    COMMAND = (sys.executable, "-m", "commscope.store.bulkread")
    #: A worker that sends nothing for this long, or does not finish a message within it, is
    #: taken for stuck: it is killed, and its chunk goes back
    STALL_S = 300.0
    #: Messages a worker may have waiting for the caller (``run``)
    AHEAD = 4

    def __init__(self, n: int, start: str | None = None) -> None:
        """``n`` workers, started as ``start`` says ("fork" or "spawn"; None: ``start_method``)."""
        self.procs: list[subprocess.Popen | Forked] = []
        try:
            self._start(n, start or start_method())
        except BaseException:  # (an interrupt: the workers started so far ended, not left waiting)
            self.close()
            raise

    def _start(self, n: int, start: str) -> None:
        make: Callable[[], subprocess.Popen | Forked] = Forked
        if start != "fork":
            # (one OpenBLAS thread, numpy's BLAS as pip installs it: a worker does no linear
            # algebra, and numpy's import started a thread a core that spun ~0.1 s of CPU a
            # worker, taken from the workers beside it)
            env = dict(os.environ, COMMSCOPE_NO_PROGRESS="1", OPENBLAS_NUM_THREADS="1")
            # (unbuffered: a message is read with a deadline, ``receive``, a read at a time)
            make = lambda: subprocess.Popen(list(self.COMMAND), stdin=subprocess.PIPE,  # noqa: E731
                                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
                                            close_fds=True, bufsize=0)
        for _ in range(n):
            try:
                self.procs.append(make())
            except OSError:
                break
            _fit(self.procs[-1])

    def run(self, jobs: list[Job], here: Callable[[Job], StreamsRead] | None = None) -> Iterator[StreamsRead | Job]:
        """What each job gave, read off the workers' pipes by a thread of its own (``_pump``)
        while the caller ingests: a worker whose message waited for the caller to finish
        ingesting sat blocked in its write, and then waited for its next job; at 16k ranks
        both workers sat so ~6% of a read, one core idle (``/proc`` states sampled).  At most
        ``AHEAD`` messages a worker wait for the caller (each a chunk: memory stays bounded).

        ``here``: the caller reads a job itself with it (as a worker would) whenever no
        message waits for it, so the reading process is a reader too: one worker fewer
        to start (~0.13 s of CPU each) and to send its columns through a pipe, and no core
        idle while the workers start or the caller waits (1k ranks on 2 cores: 0.47 s
        against 0.57 with two workers and a caller that only ingested)."""
        out: queue.Queue = queue.Queue(maxsize=self.AHEAD * max(1, len(self.procs)))
        stop, orphaned = threading.Event(), threading.Event()
        todo = _Todo(jobs)
        pump = threading.Thread(target=self._pump, args=(todo, out, stop, orphaned), daemon=True,
                                name="commscope-bulkread")
        pump.start()
        ended = False
        try:
            while True:
                try:
                    got = out.get_nowait()
                except queue.Empty:  # nothing to ingest: the caller reads a job itself, if one is left
                    if here is not None and (job := todo.take()) is not None:
                        try:
                            read = here(job)
                        except Exception:  # (as a worker that failed: the job goes back, read by the caller's reader)
                            read = job
                        yield read
                        continue
                    try:
                        got = out.get(timeout=1.0)
                    except queue.Empty:
                        if pump.is_alive() or not out.empty():
                            continue
                        raise RuntimeError("the read workers' thread ended without a word") from None
                if got is _END:
                    ended = True
                    return
                if isinstance(got, _Failed):
                    raise got.error
                yield got
        finally:
            stop.set()
            if not ended:  # the caller stopped early: what the workers read is not wanted
                for p in self.procs:
                    with contextlib.suppress(OSError):
                        p.kill()
            if threading.current_thread() is pump:
                # (the generator dropped in a cycle, collected by the pump's own allocations:
                # waiting here for the pump would wait for itself; it closes them as it ends)
                orphaned.set()
            else:
                while pump.is_alive():  # (the pump may wait to put: it sees ``stop`` then)
                    with contextlib.suppress(queue.Empty):
                        out.get(timeout=0.05)
                pump.join()
                self.close()

    def _pump(self, todo: _Todo, out: queue.Queue, stop: threading.Event, orphaned: threading.Event) -> None:
        """``run``'s thread: jobs to the workers, what they send (or the jobs none read) to
        ``out``, then ``_END``; it ends early once ``stop`` is set, and closes the workers
        where ``run`` ended on this thread (``orphaned``)."""

        def put(item: object) -> bool:
            while not stop.is_set():
                with contextlib.suppress(queue.Full):
                    out.put(item, timeout=0.1)
                    return True
            return False

        busy: dict[int, tuple[Job, float]] = {}
        sel: selectors.BaseSelector | None = None
        try:
            sel = selectors.DefaultSelector()  # (it may fail too, out of descriptors: said to the caller)
            for i, p in enumerate(self.procs):
                job = self._give_next(p, todo)
                if job is not None:
                    busy[i] = (job, time.monotonic())
                    sel.register(p.stdout, selectors.EVENT_READ, i)
            while busy and not stop.is_set():
                ready = sel.select(timeout=min(self.STALL_S, 1.0))
                now = time.monotonic()
                for i, (job, since) in list(busy.items()):  # a stuck worker: its chunk goes back
                    if now - since > self.STALL_S and all(key.data != i for key, _ in ready):
                        del busy[i]
                        sel.unregister(self.procs[i].stdout)
                        self.procs[i].kill()
                        if not put(job):
                            return
                for key, _ in ready:
                    i = key.data
                    if i not in busy:
                        continue
                    p = self.procs[i]
                    job, _since = busy.pop(i)
                    try:  # (a message begun is whole within ``STALL_S``, or the worker is stuck)
                        got = receive(p.stdout, time.monotonic() + self.STALL_S)
                    except Exception:  # (EOF, a torn or foreign pickle, a stall: the worker is done for)
                        sel.unregister(p.stdout)
                        with contextlib.suppress(OSError):
                            p.kill()
                        if not put(job):
                            return
                        continue
                    # the next job only now: a worker writing a message reads no job meanwhile,
                    # and a job larger than its stdin's pipe (thousands of short streams) would
                    # wait for it while it waits for this thread to read on
                    job = self._give_next(p, todo)
                    if job is not None:
                        busy[i] = (job, time.monotonic())
                    else:
                        sel.unregister(p.stdout)
                    if not put(got):
                        return
            while (job := todo.take()) is not None:  # (no worker left to take them)
                if not put(job):
                    return
            put(_END)
        except BaseException as exc:  # (for the caller to raise: a thread's error is no one's)
            put(_Failed(exc))
        finally:
            if sel is not None:
                sel.close()
            if orphaned.is_set():
                self.close()

    def _give_next(self, p: subprocess.Popen | Forked, todo: _Todo) -> Job | None:
        """The next job, given to worker ``p``; None where none is left, or ``p`` cannot take
        it (gone, or taking none of a job larger than its pipe for ``STALL_S``: it is killed,
        and the job stays for another)."""
        job = todo.take()
        if job is None:
            return None
        try:
            send(p.stdin, job, time.monotonic() + self.STALL_S)
            return job
        except OSError:  # (TimeoutError among them: a stuck worker, the pump not held by it)
            todo.put_back(job)
            with contextlib.suppress(OSError):
                p.kill()
            return None

    def close(self, grace_s: float = 2.0) -> None:
        """End every worker: asked first, then killed, all within one ``grace_s``."""
        deadline = time.monotonic() + grace_s
        for p in self.procs:
            with contextlib.suppress(OSError, ValueError):  # (one whose pipe is full is not waited for)
                send(p.stdin, None, deadline)
            with contextlib.suppress(OSError, ValueError):  # (closed even where the worker is gone)
                p.stdin.close()
        for p in self.procs:
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            with contextlib.suppress(OSError):
                p.stdout.close()
        self.procs = []


def main() -> int:
    """A worker started afresh: jobs from stdin, what each read to stdout, until ``None``."""
    return serve(sys.stdin.buffer, sys.stdout.buffer)


def serve(stdin: IO[bytes], stdout: IO[bytes]) -> int:
    """A worker's loop, forked or fresh: jobs from ``stdin``, what each read to ``stdout``,
    until ``None`` or the end of ``stdin``."""
    module, name = TARGET.split(":")
    read = getattr(importlib.import_module(module), name)
    # (no cyclic collector: a read pauses it and turned it back on after each job, and the
    # collection that followed walked the job's events and the worker's modules, ~1.4% of a
    # worker's time; what a job builds is freed by reference counts when it is sent)
    gc.disable()
    while True:
        try:
            job = receive(stdin)
        except EOFError:
            return 0
        if job is None:
            return 0
        send(stdout, read(job).sent())


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    # (no interpreter teardown: freeing what the worker decoded, object by object, kept the
    # reading process waiting in ``Workers.close`` ~0.15 s at 4k ranks)
    os._exit(code)
