"""A whole read of a large directory store, its streams decoded in worker processes.

Decoding is most of a read (a job of 16k ranks writes millions of blocks), and each rank's
stream decodes alone, so ``DirectoryReader.bulk`` hands chunks of streams to workers: plain
child processes (``python -m commscope.store.bulkread``), so nothing of the caller's program
is imported or forked in them.  Each reads its streams to their ends exactly as a reader
would (``read_streams``) and sends back the events, the op records in columns, its stats
and where each stream stopped; the reader ingests a chunk while the workers decode the
next and then goes on from where they stopped.  A worker that fails leaves its chunk to
the reader itself: a parallel read never reads less than a sequential one.

The protocol: pickles, each behind its length (8 bytes, little-endian), a job down the
worker's stdin, its ``StreamsRead`` up its stdout; an empty job ends the worker.  The
worker reads only files of the job directory it is given, like any reader.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import selectors
import struct
import subprocess
import sys
from collections.abc import Iterator
from typing import IO, Any, NamedTuple

from commscope.events import Event, gc_paused

_LEN = struct.Struct("<Q")


class Job(NamedTuple):
    """Streams of a job directory to read, with their segments (the worker lists nothing)."""

    job_dir: str
    since_ns: int | None
    streams: dict[tuple[int, int], list[Any]]  # stream -> its segments (store.segments.Segment)


class StreamsRead(NamedTuple):
    """What a worker read of some streams: the batch, the reader's stats, where each stream
    stopped, and what its block decoder keeps (op names, dtypes, the ring position decoded up
    to)."""

    batch: Any  # store.base.Batch
    stats: Any  # store.base.ReadStats
    reading: dict[tuple[int, int], int]
    offsets: dict[tuple[int, int], int]
    partial: dict[tuple[int, int], bool]
    decoders: dict[tuple[int, int], tuple[list[str] | None, list[str], int]]


def read_streams(job: Job) -> StreamsRead:
    """Read ``job.streams`` of a job directory to their ends."""
    from commscope.store.base import Batch
    from commscope.store.directory import DirectoryReader

    r = DirectoryReader(job.job_dir, since_ns=job.since_ns)
    r.columnar = True
    events: list[Event] = []
    with gc_paused():
        for stream, segs in job.streams.items():
            while True:
                got, used = r._read_stream(stream, segs, None)
                events.extend(got)
                if not used:
                    break
    decoders = {s: (d.names, d.dtypes, d.seen_end) for s, d in getattr(r, "_block_decoders", {}).items()}
    return StreamsRead(Batch(r._carried + events, r._take_ops()), r.stats, dict(r._reading), dict(r._offsets),
                       dict(r._partial), decoders)


def _send(f: IO[bytes], obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    f.write(_LEN.pack(len(data)))
    f.write(data)
    f.flush()


def _recv(f: IO[bytes]) -> Any:
    head = f.read(_LEN.size)
    if len(head) < _LEN.size:
        raise EOFError("worker gone")
    n = _LEN.unpack(head)[0]
    data = f.read(n)
    if len(data) < n:
        raise EOFError("worker gone")
    return pickle.loads(data)


class Workers:
    """Worker processes reading chunks of streams; ``run`` yields what each chunk gave, and
    the chunks no worker could read (to be read by the caller), in the order they finish."""

    #: How a worker starts
    COMMAND = (sys.executable, "-m", "commscope.store.bulkread")

    def __init__(self, n: int) -> None:
        env = dict(os.environ, COMMSCOPE_NO_PROGRESS="1")
        self.procs: list[subprocess.Popen] = []
        for _ in range(n):
            try:
                self.procs.append(subprocess.Popen(list(self.COMMAND),
                                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                                   stderr=subprocess.DEVNULL, env=env, close_fds=True))
            except OSError:
                break

    def run(self, jobs: list[Job]) -> Iterator[StreamsRead | Job]:
        todo = list(reversed(jobs))
        busy: dict[int, Job] = {}
        sel = selectors.DefaultSelector()
        try:
            for i, p in enumerate(self.procs):
                if todo and self._give(p, todo[-1]):
                    busy[i] = todo.pop()
                    sel.register(p.stdout, selectors.EVENT_READ, i)
            while busy:
                for key, _ in sel.select():
                    i = key.data
                    p = self.procs[i]
                    job = busy.pop(i)
                    try:
                        got = _recv(p.stdout)
                    except Exception:  # (EOF, a torn or foreign pickle: the worker is done for)
                        sel.unregister(p.stdout)
                        yield job  # the caller reads it
                        continue
                    yield got
                    if todo and self._give(p, todo[-1]):
                        busy[i] = todo.pop()
                    else:
                        sel.unregister(p.stdout)
            yield from reversed(todo)  # (no worker left to take them)
        finally:
            sel.close()
            self.close()

    @staticmethod
    def _give(p: subprocess.Popen, job: Job) -> bool:
        try:
            _send(p.stdin, job)
            return True
        except OSError:
            return False

    def close(self) -> None:
        for p in self.procs:
            with contextlib.suppress(OSError):
                _send(p.stdin, None)
                p.stdin.close()
        for p in self.procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
            with contextlib.suppress(OSError):
                p.stdout.close()
        self.procs = []


def main() -> int:
    """A worker: jobs from stdin, what each read to stdout, until an empty job."""
    # (by the module's own name, not __main__'s: what it sends must unpickle in the reader)
    from commscope.store import bulkread

    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while True:
        try:
            job = _recv(stdin)
        except EOFError:
            return 0
        if job is None:
            return 0
        _send(stdout, bulkread.read_streams(bulkread.Job(*job)))


if __name__ == "__main__":
    sys.exit(main())
