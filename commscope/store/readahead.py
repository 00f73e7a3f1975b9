"""A live reader's polls made in a child process, a batch ahead of the console.

A console that follows a job reads and decodes its streams, ingests what came into the
model, publishes views and diagnoses, all in one process: following 16,384 ranks (``bench
scale``, a sixteenth of the rate) reading and decoding were ~42% of its one saturated core.
``ReadAhead`` moves the reading into a child process (``python -m
commscope.store.readahead``) that opens the same job and polls it as the console did: its
first read in workers where the store can (``read_apart``), then polls of ``budget``
bytes, the next at once after one that stopped at the budget, ``round_s`` after the last
began after one that read all there was, ``poll_s`` after one that brought nothing (or
failed), ``idle_s`` once polls brought nothing for that long (an ended job's pace).  Each
batch goes up the pipe with what changed of the reader's stats, its watermark and backlog
as of it, its op records in one piece (``oprecords.packed``, arrays out of band:
``bulkread.send``); the console ingests one batch while the child reads the next, and the
pipe holds the child back when the console is slower (it reads about one batch ahead, and
what the pipe holds).

What the console sees of the reader is as of the batch it took last: the watermark (every
stream read to its end by then, so the model holds all of it), the stats, the backlog.
The source goes down the child's stdin, with the job the console's reader found pinned (a
store's newest job may change meanwhile): a URL's password never reaches a command line.
The child runs in a session of its own (a Ctrl-C at the terminal is the console's to
handle) and ends when its stdin does.

A child that dies, or sends what is not a batch, is not started again: ``poll_batch``
raises ``ReadAheadLost`` (with how it ended and the last line it wrote on stderr) and the
console reads the job again in its own process from then on (``here``: a reader of the
job the child read, from the start of the window it was started on, counted once;
``Feed._read_here``), into a new model, saying so.  Nothing is lost or counted twice: what
the child sent was ingested whole (a message is taken whole or not at all), and the new
reader reads everything again into a new model.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from typing import IO, NamedTuple

from commscope.compiled import says_no
from commscope.events import gc_paused
from commscope.memory import map_large_apart, resident_bytes
from commscope.redact import redact as redact_text
from commscope.store import bulkread
from commscope.store.base import Batch, ReadStats, Shard, StoreError, TraceReader
from commscope.store.directory import ENV_WORKERS, DirectoryReader
from commscope.store.registry import backend_for, redact_store
from commscope.window import Since

#: ``COMMSCOPE_READ_AHEAD=0`` keeps a console's reading in its own process
ENV = "COMMSCOPE_READ_AHEAD"


class ReadAheadLost(StoreError):
    """The read process died or sent what is not a batch: read the job again elsewhere."""


class Pacing(NamedTuple):
    """How the child reads (the console's own pacing, ``tui/feed.Feed``): bytes a poll at
    most, the pause after a poll that brought nothing, the time from one round that read
    everything to the next, how often at most the backlog is measured (it stats every
    stream: at most every twenty times what that costs, too), and the pause once polls
    brought nothing for that long (an ended job's, which the console polled so)."""

    budget: int
    poll_s: float
    round_s: float
    backlog_s: float
    idle_s: float


class Open(NamedTuple):
    """What the child reads: ``source`` (a store's name, its job pinned) from ``since`` on;
    ``console``: the process it reads for (it ends with it: ``die_with``); ``shard``: the
    part of the job's streams it reads (None: all)."""

    source: str
    since: Since | None
    pacing: Pacing
    console: int
    shard: Shard | None = None


class Polled(NamedTuple):
    """One poll of the child's: the batch (as sent: its op records in one piece, ``spans``,
    where they go so), what changed of the reader's stats (``ReadStats.changes``), its
    watermark and backlog after it, whether it stopped at the budget, why it failed (None:
    it did not; then the batch is empty), the child's CPU seconds so far, the job it
    reads (None: not found yet), where its reader's window starts as it counted it
    (``TraceReader.window_start_ns``: one the console could not count, a store it could
    not reach then, is counted once, by the child), and the job's metadata (``job()``:
    what the console's model compares the streams' metas with, ``TraceModel.note_job``)."""

    batch: Batch
    stats: ReadStats
    watermark: int | None
    backlog: int
    cut_short: bool
    error: str | None
    cpu_s: float
    job: str | None
    window: int | None = None
    job_meta: dict | None = None
    #: the child's resident bytes as it started, before it read: its interpreter's and its
    #: imports' (what does not grow with the ranks it reads: ``bench scale`` extrapolates the rest)
    started_rss: int = 0

    def sent(self) -> Polled:
        """As the child sends it: the op records in one piece where they go so (their
        ``Spans``: those of a poll decoded together, else ``packed``), not each apart."""
        b = self.batch
        piece = b.in_one_piece()
        return self if piece is None else self._replace(batch=Batch(b.events, [], piece, b.beats))

    def received(self) -> Batch:
        """The batch as read, each stream's records a view of the piece they came in."""
        b = self.batch
        return b if b.ops or b.spans is None else Batch.of_piece(b.events, b.spans, b.beats)


class _Child:
    """One read process of a ``ReadAhead``: its pipes and stderr, and what its last batch
    said (its reader's stats as it held them, watermark, backlog, CPU)."""

    def __init__(self, command: list[str], env: dict[str, str], opened: Open) -> None:
        self.stats = ReadStats()
        self.watermark: int | None = 0
        self.backlog = 0
        self.cut_short = False
        self.read_once = False  # a batch came that read all there was (every stream to its end once)
        self.cpu_s = 0.0
        self.started_rss = 0  # (``Polled.started_rss``, once it sent a batch)
        self.said: Counter[str] = Counter()  # how often it said each warning of the whole job
        try:
            self.stderr = tempfile.TemporaryFile()  # noqa: SIM115 (the child's, for its life: ``close``)
        except OSError as exc:  # (no file left to open, no temporary directory)
            raise StoreError(f"the read process did not start: {exc}") from None
        try:
            # (its stdout unbuffered: whether the pipe is readable is then all there is to read)
            self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=self.stderr, env=env, close_fds=True, bufsize=0,
                                         start_new_session=True)
        except OSError as exc:
            self.stderr.close()
            raise StoreError(f"the read process did not start: {exc}") from None
        try:
            bulkread.send(self.proc.stdin, opened)
        except OSError:
            pass  # (gone at once: the first poll says how)
        except Exception as exc:  # (what it was to read could not be sent: it is no one's)
            self.let_go()
            self.proc.kill()
            self.end(time.monotonic())
            raise StoreError(f"the read process did not start: {exc}") from None

    def let_go(self) -> None:
        """Its pipes closed: it stops at its next write or look (one blocked writing a batch
        at once)."""
        for pipe in (self.proc.stdout, self.proc.stdin):
            with contextlib.suppress(OSError):
                pipe.close()

    def end(self, deadline: float) -> None:
        """Waited for until ``deadline`` (``time.monotonic``), then killed."""
        try:
            self.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.stderr.close()


class ReadAhead(TraceReader):
    """A live reader whose polls a child process makes ahead (see the module docstring):
    ``poll_batch`` waits up to ``wait_s`` for the child's next batch (an empty one if none
    came: the console diagnoses and publishes meanwhile), and raises ``ReadAheadLost`` once
    the child is gone.

    ``processes`` > 1: as many children, each reading a part of the job's streams
    (``Shard``: a wide job's first read, and its polls, at the speed of as many cores); a
    poll takes the batch of whichever is ready (the one after the last taken first), and
    what the console sees of the reader is theirs together: the stats summed
    (``ReadStats.add_changes``), the lowest watermark (0 while any has not read each of
    its streams once), the backlogs summed.  One gone is all gone (the job is read again
    in the console's process, ``here``)."""

    columnar = True
    paces_itself = True
    #: How the child starts
    COMMAND = (sys.executable, "-m", "commscope.store.readahead")
    #: What ``ReadAheadLost`` quotes of the child's stderr, at most (its last bytes)
    STDERR_TAIL = 2000

    def __init__(self, source: str, since: Since | None, pacing: Pacing, description: str = "",
                 processes: int = 1) -> None:
        self.source, self.since, self.pacing = source, since, pacing
        self.description = description or redact_store(source)
        self._job_name: str | None = None  # the job the children read, once one found one
        self._job: dict | None = None  # its metadata, once a child read it
        self.stats = ReadStats()
        self.wait_s = pacing.poll_s
        self.receive_s = 0.0  # seconds of CPU this thread spent taking the children's batches (not waiting for them)
        self._lost: ReadAheadLost | None = None
        self._next = 0  # the child looked at first by the next poll (they take turns)
        self._said: Counter[str] = Counter()  # how often the console said each warning (``_first_said``)
        env = dict(os.environ, COMMSCOPE_NO_PROGRESS="1", OPENBLAS_NUM_THREADS="1")
        if processes < 1:
            raise ValueError(f"ReadAhead: {processes} read processes (at least one)")
        if processes > 1 and ENV_WORKERS not in env:  # (a large first read's workers: the cores shared out)
            env[ENV_WORKERS] = str(max(1, min(DirectoryReader.MAX_READERS, bulkread.cores() // processes)))
        self._children: list[_Child] = []
        try:
            for k in range(processes):
                shard = Shard(k, processes) if processes > 1 else None
                self._children.append(_Child(list(self.COMMAND), env, Open(source, since, pacing, os.getpid(), shard)))
        except StoreError:
            self.close()
            raise

    @property
    def pid(self) -> int:
        """The (first) read process's."""
        return self._children[0].proc.pid

    @property
    def procs(self) -> list[subprocess.Popen]:
        """The read processes, one a part of the streams where there are several."""
        return [c.proc for c in self._children]

    @property
    def cut_short(self) -> bool:
        """Whether a child's last batch stopped at the budget (it has more to read)."""
        return any(c.cut_short for c in self._children)

    @property
    def read_once(self) -> bool:
        """Whether every child sent a batch that read all there was (each of its streams to
        its end once)."""
        return all(c.read_once for c in self._children)

    @property
    def cpu_s(self) -> float:
        """The children's CPU seconds, as of their last batches."""
        return sum(c.cpu_s for c in self._children)

    @property
    def started_rss(self) -> tuple[int, ...]:
        """Each child's resident bytes as it started, before it read (of those that sent a
        batch): what of their memory does not grow with the ranks."""
        return tuple(c.started_rss for c in self._children if c.started_rss)

    def poll(self, max_bytes: int | None = None) -> list:
        raise TypeError("ReadAhead reads op records in columns: call poll_batch")

    def poll_batch(self, max_bytes: int | None = None) -> Batch:
        """A child's next batch, waiting up to ``wait_s`` for one (``max_bytes``: the
        child's budget rules); an empty batch where none came."""
        if self._lost is not None:
            raise self._lost
        child = self._ready()
        if child is None:
            return Batch([], [])
        out = child.proc.stdout
        assert out is not None
        t0 = time.thread_time()
        try:
            got = bulkread.receive(out)
        except EOFError:  # (its end: waited for a moment, so that how it ended is what it says)
            raise self._gone(child, "ended", wait_s=self.EXIT_WAIT_S) from None
        except Exception as exc:  # (a torn or foreign pickle)
            raise self._gone(child, f"sent what is not a batch ({type(exc).__name__}: {exc})") from None
        if not isinstance(got, Polled):
            raise self._gone(child, f"sent a {type(got).__name__}, not a batch")
        self.stats.add_changes(self._first_said(got.stats, child), child.stats)
        child.stats.take(got.stats)
        child.watermark, child.backlog, child.cut_short, child.cpu_s = got.watermark, got.backlog, got.cut_short, got.cpu_s
        child.started_rss = got.started_rss
        self._job_name = got.job or self._job_name
        self._job = got.job_meta or self._job
        if got.window is not None and self.since is not None and self.since.at_ns is None:
            self.since = Since(at_ns=got.window)  # (``here`` reads from there: counted once)
        if got.error is not None:
            raise StoreError(got.error)
        if not got.cut_short:
            child.read_once = True
        batch = got.received()
        self.receive_s += time.thread_time() - t0  # (its records unpacked too)
        return batch

    def job_name(self) -> str | None:
        return self._job_name

    def job(self) -> dict | None:
        return self._job

    def _first_said(self, changes: ReadStats, child: _Child) -> ReadStats:
        """``changes`` less the warnings other children said as often already: what is said
        of the whole job (a store that cannot be listed, a connection lost, again, ...)
        comes from each part's reader, and the console says it as often as the child that
        says it most (an outage all of them met: once; one that one child met again: again).
        What one part says of its own ranks names them, and is always its own."""
        if len(self._children) < 2 or not changes.warnings:
            return changes
        kept = []
        for w in changes.warnings:
            if w.startswith("rank "):  # (a part's own: never said by another)
                kept.append(w)
                continue
            child.said[w] += 1
            if child.said[w] > self._said[w]:
                self._said[w] = child.said[w]
                kept.append(w)
        return changes if len(kept) == len(changes.warnings) else dataclasses.replace(changes, warnings=kept)

    def _ready(self) -> _Child | None:
        """A child with a batch to take (or whose pipe ended), waiting up to ``wait_s`` for
        one: the first ready from the one after the last taken, so each goes on."""
        children = self._children
        n = len(children)
        try:
            ready = set(bulkread.ready([c.proc.stdout for c in children], self.wait_s))  # type: ignore[misc]
        except (OSError, ValueError):
            ready = set(range(n))
        for k in range(n):
            j = (self._next + k) % n
            if j in ready:
                self._next = j + 1
                return children[j]
        return None

    #: How long a child whose pipe ended is waited for before it is taken for stopped: its
    #: pipe closes as it exits, a moment before it can be waited for
    EXIT_WAIT_S = 5.0

    def _gone(self, child: _Child, what: str, wait_s: float = 0.0) -> ReadAheadLost:
        """The child gone (waited for up to ``wait_s``; still there: stopped here), and how
        it ended said, with the last line it wrote on stderr (a traceback's says what it
        was), its store's credentials hidden."""
        try:
            code = child.proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                child.proc.kill()
            child.proc.wait()
            code = None
        how = "stopped by the console" if code is None else \
            f"killed by signal {-code}" if code < 0 else f"exit status {code}"
        last: list[str] = []
        with contextlib.suppress(OSError, ValueError):
            size = child.stderr.seek(0, os.SEEK_END)
            child.stderr.seek(max(0, size - self.STDERR_TAIL))
            last = child.stderr.read().decode("utf-8", "replace").strip().splitlines()[-1:]
        which = f" {self._children.index(child) + 1} of {len(self._children)}" if len(self._children) > 1 else ""
        said = f"the read process{which} {what} ({how})" + (f": {last[0]}" if last else "")
        self._lost = ReadAheadLost(redact_text(backend_for(self.source).redact(said)))
        for other in self._children:  # (the job is read again whole: theirs would only compete with it)
            if other is not child:
                other.let_go()
                with contextlib.suppress(OSError):
                    other.proc.kill()
        return self._lost

    def watermark_ns(self) -> int | None:
        return lowest_watermark([c.watermark for c in self._children])

    def backlog_bytes(self) -> int:
        return sum(c.backlog for c in self._children)

    def window_start_ns(self) -> int | None:
        """Where the window starts, as the console counted it (``around``) or a child did
        (``Polled.window``); None where neither did, or the job is read whole."""
        return self.since.at_ns if self.since is not None else None

    def read_again(self, since: Since) -> float | None:
        """(``TraceReader.read_again``) As a reader of the same job and window in this
        process says it (``here``: a listing, nothing read); None at once for a store that
        is no path here (a Redis reader cannot tell before reading its marks: no connection
        and 16k requests for nothing)."""
        if not backend_for(self.source).local:
            return None
        reader = self.here()
        try:
            return reader.read_again(since)
        finally:
            reader.close()

    def here(self) -> TraceReader:
        """A reader of the same job and window in this process (the children's stand-in once
        one is gone), of all its streams: the job the children read, where one found one,
        from the start of the window they were started on, as the console counted it
        (``around``) or, where the console could not, as a child did (``Polled.window``)."""
        source = pinned(self.source, self._job_name)
        reader = backend_for(source).reader(source, wait=True)
        if self.since is not None:
            reader.start_at(self.since)
        return reader

    def close(self, grace_s: float = 5.0) -> None:
        """End the children: their pipes closed (each stops at its next write or look: one
        blocked writing a batch at once), waited for up to ``grace_s`` in all, then killed."""
        children = getattr(self, "_children", [])
        for child in children:
            child.let_go()
        deadline = time.monotonic() + grace_s
        for child in children:
            child.end(deadline)


def lowest_watermark(marks: list[int | None]) -> int | None:
    """The watermark of readers of the parts of a job's streams, from theirs: 0 while one
    has not read each of its streams once (its 0), or cannot tell (None: its store could
    not be listed, or has no job yet) while another can, as a stream not read yet holds a
    single reader's back; else the lowest; None where none can tell.  (A part whose ranks
    wrote nothing yet tells: each of its streams, none, read as of its listing.)"""
    known = [m for m in marks if m]
    if len(known) == len(marks):
        return min(known) if known else None
    return None if all(m is None for m in marks) else 0


def around(reader: TraceReader, source: str, since: Since | None, pacing: Pacing,
           processes: int | None = None) -> TraceReader:
    """``reader`` (a store's, just opened on ``source`` from ``since`` on) read ahead in a
    child process where that is worth it, else ``reader`` itself: not with one core, nor
    where ``COMMSCOPE_READ_AHEAD`` says no, nor where the child does not start.  The child
    reads the job ``reader`` found (``pinned``) from the window's start as ``reader``
    counted it (``window_start_ns``: a duration back from the job's end counts from now,
    not from when the child, or a stand-in for it, opens the job); ``reader`` is closed.
    ``processes``: how many children, each a part of the ranks (0: none, ``reader``
    itself; None: ``processes_for``; one where the reader reads a job whole)."""
    if processes == 0 or (processes is None and says_no(ENV)) or bulkread.cores() < 2:
        return reader
    n = processes_for(reader) if processes is None else processes if reader.shards else 1
    if n == 0:
        return reader
    width = (reader.job() or {}).get("world_size")
    if isinstance(width, int) and not isinstance(width, bool) and width >= 1:
        n = min(n, width)  # (no part without a rank)
    start = reader.window_start_ns()
    if start is not None:
        since = Since(at_ns=start)
    try:
        ahead = ReadAhead(pinned(source, reader.job_name()), since, pacing, reader.description, n)
    except StoreError:  # (it did not start: read here)
        return reader
    reader.close()
    return ahead


#: ``COMMSCOPE_READ_PROCESSES=N``: how many read processes a console starts, each reading
#: a part of the job's streams (default: ``processes_for``)
ENV_PROCESSES = "COMMSCOPE_READ_PROCESSES"
#: A console starts a read process per this many ranks of the job ...
SHARD_RANKS = 4096
#: ... and at most this many (nor more than one less than the cores)
MAX_PROCESSES = 4
#: The most read processes a console starts, however many are asked for
MOST_PROCESSES = 64


def processes_for(reader: TraceReader) -> int:
    """How many read processes a console starts for ``reader``'s job: one per
    ``SHARD_RANKS`` ranks of its world (as its metadata says when the console opens it),
    where the reader can read a part of the streams (``TraceReader.shards``), at most
    ``MAX_PROCESSES`` and one less than the cores (the console's own work needs one);
    ``COMMSCOPE_READ_PROCESSES`` says how many instead (0: none, the reading in the
    console's process; at most ``MOST_PROCESSES``; one where the reader reads a job
    whole)."""
    said = os.environ.get(ENV_PROCESSES, "").strip()
    if said.isdigit():
        n = min(int(said), MOST_PROCESSES)
        return n if reader.shards else min(n, 1)
    if not reader.shards:
        return 1
    width = (reader.job() or {}).get("world_size")
    if not isinstance(width, int) or isinstance(width, bool):
        return 1
    return max(1, min(MAX_PROCESSES, bulkread.cores() - 1, width // SHARD_RANKS))


def pinned(source: str, job: str | None) -> str:
    """``source`` naming job ``job`` of the store exactly (a store's newest job may change
    between two opens: ``Backend.with_job``); ``source`` where no job is known yet."""
    return source if job is None else backend_for(source).with_job(source, job)


# ---------------------------------------------------------------------- the child
def _stopped(stdin: IO[bytes], wait_s: float) -> bool:
    """Whether the console closed the child's stdin, looking for up to ``wait_s``."""
    return bulkread.readable(stdin, wait_s) and not stdin.read(1)


#: ``prctl``'s option: the signal a process gets when the thread that started it ends
_PR_SET_PDEATHSIG = 1


def die_with(console: int) -> bool:
    """This process killed when ``console`` (the process that started it) ends, where the
    system can say so (Linux: ``prctl(PR_SET_PDEATHSIG)``; strictly, when the thread that
    started it ends: a console's main or feed thread, which live as long as it does):
    though a console that ends closes the pipes the child looks at, a child inside a long
    first read, or waiting on a worker, looks at none for minutes.  False where ``console``
    ended already (the child is then no one's)."""
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    return os.getppid() == console


class Backlog:
    """What a read process says of its reader's backlog (``main``).  Measured at most every
    twenty times what a poll and the measure took (``Pacing.backlog_s`` at least: a stat of
    every stream not at its end, two requests of each on Redis); between, the figure less
    what was read since: a restart's window, read in a few polls, said "falling behind" for
    seconds after (14-38 of 141-192 steps at 1k ranks on Redis).  What was written meanwhile
    is not in it, so where it says the reader came under a poll's budget from above, it is
    measured again once ``backlog_s`` passed (helper-160: a reader kept behind by the writes
    said 0 until then)."""

    def __init__(self) -> None:
        self.bytes = 0  # as last measured
        self.read_then = 0  # the reader's bytes read then
        self.at = float("-inf")  # when (``time.monotonic``)
        self.next_at = 0.0  # the next measure, at the latest pace

    def said(self, read: int) -> int:
        """The backlog to say, the reader having read ``read`` bytes."""
        return max(0, self.bytes - (read - self.read_then))

    def due(self, now: float, read: int, pacing: Pacing) -> bool:
        return now >= self.next_at or (self.said(read) <= pacing.budget < self.bytes
                                       and now >= self.at + pacing.backlog_s)

    def measured(self, backlog: int, read: int, began: float, done: float, pacing: Pacing) -> None:
        self.bytes, self.read_then, self.at = backlog, read, done
        self.next_at = done + max(pacing.backlog_s, 20 * (done - began))


def main() -> int:
    """The child: what to read from stdin, then batches to stdout until stdin ends."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # (the console's to handle; stdin's end stops this)
    map_large_apart()  # (its polls' replies and columns given back as freed: ``memory``)
    started_rss = resident_bytes()  # (its imports done, nothing read)
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    try:
        how = bulkread.receive(stdin)
    except EOFError:
        return 0
    if not isinstance(how, Open):
        return 2
    if not die_with(how.console):
        return 0
    pacing = how.pacing
    reader: TraceReader | None = None
    sent = ReadStats()  # the reader's stats as the console holds them (``ReadStats.changes``)
    first = None
    backlog = Backlog()
    quiet_since = time.monotonic()  # (since when polls brought nothing)
    while True:
        began = time.monotonic()
        batch, got, error, cut = Batch([], []), None, None, False
        # (the collector paused from the poll until its batch is sent and let go: resumed with
        # the batch held, its first pass walked every dict of a 16k poll)
        with gc_paused():
            try:
                if reader is None:
                    opened = backend_for(how.source).reader(how.source, wait=True)
                    if how.shard is not None:
                        opened.take_shard(how.shard)
                    if how.since is not None:
                        opened.start_at(how.since)
                    opened.job()  # (metadata that fails its schema: counted and said, by one part)
                    reader, first = opened, opened.read_apart(pacing.budget)
                got = next(first, None) if first is not None else None
                if got is not None:
                    batch, cut = got, True
                else:
                    first = None
                    read = reader.stats.bytes
                    batch = reader.poll_batch(max_bytes=pacing.budget)
                    cut = reader.stats.bytes - read >= pacing.budget
            except Exception as exc:  # (a store gone, a connection refused ...: said, and tried again)
                first = None
                error = str(exc) or type(exc).__name__
            if reader is not None and error is None and backlog.due(began, reader.stats.bytes, pacing):
                try:
                    backlog.measured(reader.backlog_bytes(), reader.stats.bytes, began, time.monotonic(), pacing)
                except Exception:  # (kept as it was: a backlog is for a header, not worth a batch)
                    pass
            brought = batch.count()
            if reader is None:  # (the store not opened yet: nothing to say of it)
                polled = Polled(batch, ReadStats(), 0, 0, cut, error, time.process_time(), None,
                                started_rss=started_rss)
            else:
                changes = reader.stats.changes(sent)
                sent.take(changes)
                polled = Polled(batch, changes, reader.watermark_ns(), backlog.said(reader.stats.bytes), cut, error,
                                time.process_time(),
                                reader.job_name(), reader.window_start_ns(), reader.job(), started_rss=started_rss)
            try:
                bulkread.send(stdout, polled.sent())
            except OSError:  # (the console gone)
                return 0
            del batch, got, polled  # (not held while the next poll reads)
        now = time.monotonic()
        if brought:
            quiet_since = now
        if cut and error is None:
            pause = 0.0
        elif error is not None:
            pause = pacing.poll_s
        elif not brought:
            pause = pacing.idle_s if now - quiet_since >= pacing.idle_s else pacing.poll_s
        else:
            pause = began + pacing.round_s - now
        if _stopped(stdin, pause):
            return 0


if __name__ == "__main__":  # (run as the module the console pickled its ``Open`` from, not as __main__)
    import importlib

    code = importlib.import_module("commscope.store.readahead").main()
    sys.stdout.flush()
    os._exit(code)
