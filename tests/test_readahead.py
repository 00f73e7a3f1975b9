"""A console whose polls a child process makes ahead (``store/readahead.py``): it holds what a
console reading in its own process holds, live, on a directory and on Redis; a read process
killed at any moment, or sending what is not a batch, leaves the job read again in the
console's process with nothing lost or counted twice; the child ends with its console."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import errno
import os
import pickle
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
from procs import gone
from redis_fixture import *  # noqa: F403  (redis_server, redis_url)
from redis_fixture import require_redis_server

from commscope.analysis import diagnose
from commscope.analysis.flight_import import FlightRecorderReader
from commscope.analysis.source import load_trace, open_source
from commscope.bench.redis_server import RedisServer
from commscope.bench.synthstore import JobShape, write_store
from commscope.store import ReadStats, StoreError, bulkread, open_reader, open_writer, readahead
from commscope.store.directory import DirectoryWriter
from commscope.store.readahead import ReadAhead, ReadAheadLost
from commscope.tui.feed import Feed, read_ahead
from commscope.window import Since

RANKS, OPS = 8, 60
PACING = Feed.pacing()
SMALL = PACING._replace(budget=16 << 10)  # (many batches: a first read a process can die inside)
BOUND_S = 120.0  # (a bound on waiting for a condition, never a margin: a loaded machine takes long)


def _lines(tmp_path: Path) -> dict[int, list[bytes]]:
    """Each rank's lines of a native synthetic job (blocks, heartbeats, samples), written
    through the real writers into a store of its own, as a live job writes them."""
    src = tmp_path / "src"
    write_store(str(src), JobShape(RANKS, OPS))
    return {r: (src / "synthetic" / f"rank-{r:05d}.jsonl").read_bytes().splitlines() for r in range(RANKS)}


class _Job:
    """The job written again, live, through a writer a rank into ``store``, in parts."""

    def __init__(self, store: str, lines: dict[int, list[bytes]]):
        self.lines = lines
        self.writers = {r: open_writer(store, "synthetic", r, {"world_size": RANKS}) for r in lines}
        self.at = dict.fromkeys(lines, 0)

    def write(self, fraction: float) -> None:
        for r, w in self.writers.items():
            upto = int(len(self.lines[r]) * fraction)
            w.write(self.lines[r][self.at[r]:upto])
            self.at[r] = upto

    def close(self) -> None:
        for w in self.writers.values():
            w.close()


def _until(feed: Feed, done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + BOUND_S
    while not done():
        assert time.monotonic() < deadline, f"not reached within {BOUND_S} s: {feed.info}"
        feed.step()
        time.sleep(feed.pause_s(False) if not feed.reader.paces_itself else 0)


def _summary(model, now: int) -> tuple:
    """What a model holds, as a console shows it: events, ops and records per rank, and the
    findings (kind, culprits) judged at ``now``."""
    findings = sorted((f.kind, tuple(sorted(f.culprits))) for f in diagnose(model, now, 10.0))
    per_rank = tuple((r, model.n_ops(r)) for r in model.rank_ids())
    return model.events, model.total_ops(), per_rank, findings


def _reference(store: str) -> tuple:
    model, _, _ = load_trace(store)
    return _summary(model, model.end_ns)


def _ahead(store: str, pacing: readahead.Pacing = PACING, processes: int = 1) -> ReadAhead:
    reader = open_reader(store, wait=True)
    ahead = ReadAhead(readahead.pinned(store, reader.job_name()), None, pacing, reader.description, processes)
    reader.close()
    return ahead




def test_a_read_process_s_backlog_counts_what_it_read_since_it_measured_it(tmp_path):
    """The backlog is measured at most every twenty polls' time: what was read since counts
    against it (a restart's window, read in a few polls, said "falling behind" for
    seconds after, in 20% of the steps of a 1,024-rank console on Redis)."""
    store = str(tmp_path / "live")
    job = _Job(store, _lines(tmp_path))
    job.write(1.0)
    job.close()
    ahead = _ahead(store, PACING._replace(budget=16 << 10, backlog_s=3600.0))  # (measured once)
    feed = Feed(ahead, hang_after=10.0)
    _until(feed, lambda: ahead.backlog_bytes() > 0)
    first = ahead.backlog_bytes()
    _until(feed, lambda: ahead.backlog_bytes() < first)
    want = _reference(store)
    _until(feed, lambda: feed.model.events == want[0] and ahead.backlog_bytes() == 0)


def test_a_backlog_read_down_is_measured_again_where_it_would_say_the_reader_caught_up():
    """Between measures the figure is less what was read since; where that says the reader
    came under a poll's budget from above, it is measured again once ``backlog_s`` passed
    (helper-160: a reader the writes kept 11 MiB behind said 0), and no sooner; a figure
    still above the budget waits for the measures' pace (twenty times what one took)."""
    pacing = PACING._replace(budget=8 << 20, backlog_s=1.0)
    b = readahead.Backlog()
    assert b.due(0.0, 0, pacing)
    b.measured(11 << 20, 0, 0.0, 0.5, pacing)  # (the measure took half a second: the next in 10 s)
    assert b.said(2 << 20) == 9 << 20 and not b.due(5.0, 2 << 20, pacing)  # (above the budget: at its pace)
    assert b.said(8 << 20) == 3 << 20
    assert not b.due(1.4, 8 << 20, pacing)  # (under it, from above: again once backlog_s passed)
    assert b.due(1.5, 8 << 20, pacing)
    b.measured(11 << 20, 8 << 20, 1.5, 1.6, pacing)  # (the writes kept it behind)
    assert b.said(8 << 20) == 11 << 20 and b.said(30 << 20) == 0
    b.measured(1 << 20, 0, 20.0, 20.01, pacing)  # (caught up: under the budget, at the pace)
    assert not b.due(21.0, 1 << 20, pacing) and b.due(21.01, 1 << 20, pacing)


@pytest.mark.parametrize("processes", [1, 3])
def test_a_console_reading_ahead_holds_what_one_reading_in_its_own_process_holds(tmp_path, processes):
    """Half of a native job written, followed; the rest written, followed: the console's
    model (events, ops per rank, findings) is what ``check`` reads of the finished store,
    and the child ends with the console, by itself.  ``processes``: as many children, each
    reading a part of the ranks (8 ranks: 3, 3 and 2)."""
    store = str(tmp_path / "live")
    job = _Job(store, _lines(tmp_path))
    job.write(0.5)
    feed = Feed(_ahead(store, processes=processes), hang_after=10.0)
    ahead = feed.reader
    assert isinstance(ahead, ReadAhead) and ahead.paces_itself and len(ahead.procs) == processes
    _until(feed, lambda: ahead.read_once and feed.model.events)
    half = feed.model.events
    job.write(1.0)
    job.close()
    want = _reference(store)
    _until(feed, lambda: feed.model.events == want[0])
    assert feed.model.events > half
    assert _summary(feed.model, feed.model.end_ns) == want
    assert feed.reader is ahead and feed.restarts == 0 and not feed.error
    assert ahead.stats.events == want[0] and ahead.cpu_s > 0
    assert ahead.watermark_ns() and ahead.watermark_ns() > 0
    # what each child held as it started, before it read (an interpreter and its imports:
    # tens of MiB; ``bench scale`` counts it once a process)
    assert len(ahead.started_rss) == processes and all(10 << 20 < b < 1 << 30 for b in ahead.started_rss)
    plain = open_reader(store)
    # (the job its children read, and its metadata: what the console's model compares the streams' metas with)
    assert ahead.job_name() == "synthetic" and ahead.job() == plain.job() == {"job": "synthetic", "world_size": 8}
    plain.close()
    ahead.close(grace_s=BOUND_S)
    for proc in ahead.procs:
        assert gone(proc.pid) and proc.returncode == 0  # (it saw its pipes end: not killed)


def test_a_console_reading_ahead_keeps_what_each_failed_op_raised(tmp_path):
    """A real job: rank 1 SIGKILLed, the others' all_reduce failed.  A console reading ahead
    that first read the job without those failures, then the blocks that hold them, lost
    their exception texts (a read process's piece of the poll was taken as one decoded
    together, which holds none): the survivors' crashes were the root, "ranks 0, 1 crashed
    together", where check named the dead rank (helper-193).  It holds what check holds."""
    import failure_workers as W

    from commscope.launch import Job

    src, release = tmp_path / "src", tmp_path / "release"
    release.touch()
    job = Job(W.killed, 3, args=(str(src), str(release)), pg_timeout=60).start()
    try:
        job.join(BOUND_S)
    finally:
        job.kill()
    (job_dir,) = [d for d in src.iterdir() if d.is_dir()]
    store = tmp_path / "live"
    live_dir = store / job_dir.name
    shutil.copytree(job_dir, live_dir)
    rest: dict[Path, bytes] = {}
    for path in live_dir.glob("rank-*.jsonl"):  # (each stream cut before its last block, as a console first reads it)
        lines = path.read_bytes().splitlines(keepends=True)
        cut = max(k for k, line in enumerate(lines) if line.startswith(b'{"type":"block"'))
        path.write_bytes(b"".join(lines[:cut]))
        rest[path] = b"".join(lines[cut:])
    feed = Feed(_ahead(str(store)), hang_after=10.0)
    assert isinstance(feed.reader, ReadAhead)
    _until(feed, lambda: feed.reader.read_once and feed.model.events)
    assert not any(feed.model.ranks[r].exc for r in feed.model.ranks)  # (the failures come after)
    for path, data in rest.items():
        with path.open("ab") as f:
            f.write(data)
    want = _reference(str(store))
    _until(feed, lambda: feed.model.events == want[0])
    assert _summary(feed.model, feed.model.end_ns) == want
    assert want[3] == [("dead_rank", (1,))], want[3]
    assert sorted(r for r in feed.model.ranks if feed.model.ranks[r].exc) == [0, 2]
    feed.reader.close()


@pytest.mark.parametrize(("processes", "when"), [(1, "at_start"), (1, "inside_the_first_read"), (1, "mid_run"),
                                                  (3, "at_start"), (3, "inside_the_first_read"), (3, "mid_run")])
def test_a_read_process_killed_is_read_again_here_nothing_lost_or_counted_twice(tmp_path, processes, when):
    """The child SIGKILLed before its first batch, after the first of many batches of its
    first read, or once the job is followed: the console reads the job again in its own
    process into a new model, says so (how the child ended), and ends holding exactly what
    the finished store holds.  With three children (a part of the ranks each), the second
    killed: the others are ended, and the job read again whole."""
    store = str(tmp_path / "live")
    job = _Job(store, _lines(tmp_path))
    job.write(0.5)
    feed = Feed(_ahead(store, SMALL, processes), hang_after=10.0)
    ahead = feed.reader
    assert isinstance(ahead, ReadAhead)
    victim = ahead.procs[processes // 2].pid
    if when == "at_start":
        os.kill(victim, signal.SIGKILL)
    elif when == "inside_the_first_read":
        _until(feed, lambda: feed.model.events > 0)
        assert not ahead.read_once  # (its first read goes on in batches of 16 KiB)
        os.kill(victim, signal.SIGKILL)
    else:
        _until(feed, lambda: ahead.read_once)
        os.kill(victim, signal.SIGKILL)
    job.write(1.0)
    job.close()
    want = _reference(store)
    _until(feed, lambda: feed.restarts == 1 and feed.model.events == want[0])
    assert not isinstance(feed.reader, ReadAhead)  # (not started again: read here from now on)
    assert _summary(feed.model, feed.model.end_ns) == want
    assert feed.reader.stats.events == want[0]
    said = [w for w in feed.reader.stats.warnings if "read process" in w]
    assert len(said) == 1 and "killed by signal 9" in said[0] and "read again in the console's process" in said[0]
    assert ("read process 2 of 3 ended (killed" in said[0]) == (processes == 3)
    assert all(gone(proc.pid) for proc in ahead.procs)
    with pytest.raises(ReadAheadLost):  # (the lost reader stays lost)
        ahead.poll_batch()
    feed.reader.close()


def test_a_read_process_that_sends_what_is_not_a_batch_is_read_again_here(tmp_path, monkeypatch):
    """A child that answers with something else than a batch (a foreign program): lost,
    said so, the job read here."""
    store = str(tmp_path / "job")
    write_store(store, JobShape(RANKS, 20))
    says = ("import sys; from commscope.store import bulkread; bulkread.receive(sys.stdin.buffer); "
            "bulkread.send(sys.stdout.buffer, {'not': 'a batch'}); sys.stdin.buffer.read()")
    monkeypatch.setattr(ReadAhead, "COMMAND", (sys.executable, "-c", says))
    feed = Feed(_ahead(store), hang_after=10.0)
    want = _reference(store)
    _until(feed, lambda: feed.restarts == 1 and feed.model.events == want[0])
    said = [w for w in feed.reader.stats.warnings if "read process" in w]
    assert len(said) == 1 and "sent a dict, not a batch" in said[0]
    assert _summary(feed.model, feed.model.end_ns) == want
    feed.reader.close()


def test_a_redis_job_is_read_ahead_and_its_url_never_reaches_a_command_line(tmp_path, redis_url, monkeypatch):
    """On Redis: the child reads the job the console's reader found (pinned: ``job=``), what
    it holds is what ``check`` reads, and the store's URL went down the child's stdin, not
    into its command line."""
    monkeypatch.setattr(bulkread, "cores", lambda: 2)  # (whatever cores this machine has)
    lines = _lines(tmp_path)
    job = _Job(redis_url, lines)
    job.write(1.0)
    job.close()
    reader = open_reader(redis_url, wait=True)
    assert readahead.pinned(redis_url, reader.job_name()) == redis_url + "?job=synthetic"
    feed = Feed(read_ahead(reader, redis_url, None), hang_after=10.0)
    ahead = feed.reader
    assert isinstance(ahead, ReadAhead)
    with open(f"/proc/{ahead.pid}/cmdline", "rb") as f:
        argv = f.read().split(b"\0")
    assert not any(b"redis://" in a for a in argv)
    want = _reference(redis_url)
    _until(feed, lambda: feed.model.events == want[0])
    assert _summary(feed.model, feed.model.end_ns) == want
    ahead.close()


@pytest.mark.parametrize("how", ["stop", "kill"])
def test_a_redis_outage_while_read_ahead_is_said_and_the_job_followed_after_it_exact(tmp_path, monkeypatch, how):
    """Redis (appendonly, every write synced) stops or is SIGKILLed while a console follows a job through a read process: the
    console says so (the child's reader lost its connection and keeps trying; the child
    stays), nothing is read again or restarted; the server comes back on its port with its data, the job writes its rest,
    and the console ends holding what ``check`` reads of the finished store."""
    monkeypatch.setattr(bulkread, "cores", lambda: 2)
    server = RedisServer(binary=require_redis_server(), appendonly=True, data_dir=tmp_path / "redis")
    server.start()
    try:
        url = server.url
        job = _Job(url, _lines(tmp_path))
        job.write(0.5)
        reader = open_reader(url, wait=True)
        feed = Feed(read_ahead(reader, url, None), hang_after=10.0)
        ahead = feed.reader
        assert isinstance(ahead, ReadAhead)
        _until(feed, lambda: ahead.read_once and feed.model.events > 0)
        half = feed.model.events
        server.stop() if how == "stop" else server.kill()
        _until(feed, lambda: any("lost the connection" in w for w in feed.info.warnings))
        assert feed.reader is ahead and not gone(ahead.pid) and feed.model.events == half
        server.start()
        job.write(1.0)
        job.close()
        want = _reference(url)
        _until(feed, lambda: feed.model.events == want[0] and feed.error is None)
        assert _summary(feed.model, feed.model.end_ns) == want
        assert feed.reader is ahead and feed.restarts == 0 and ahead.stats.events == want[0]
        ahead.close()
    finally:
        server.close()


def test_a_console_reads_in_its_own_process_where_reading_ahead_is_not_worth_it(tmp_path, monkeypatch):
    """``COMMSCOPE_READ_AHEAD=0``, one core, or a directory of Flight Recorder dumps: the
    reader as it was; else a ``ReadAhead`` pinned to the job found."""
    store = str(tmp_path / "job")
    write_store(store, JobShape(RANKS, 4))
    monkeypatch.setenv(readahead.ENV, "0")
    reader = open_reader(store)
    assert read_ahead(reader, store, None) is reader
    monkeypatch.delenv(readahead.ENV)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    assert read_ahead(reader, store, None) is reader
    monkeypatch.undo()
    monkeypatch.setattr(bulkread, "cores", lambda: 2)  # (whatever cores this machine has)
    dumps = FlightRecorderReader(tmp_path)
    assert read_ahead(dumps, str(tmp_path), None) is dumps
    ahead = read_ahead(reader, store, None)
    assert isinstance(ahead, ReadAhead) and ahead.source == str(Path(store) / "synthetic")
    ahead.close()


def test_a_store_the_read_process_cannot_read_is_said_and_tried_again():
    """A Redis nobody listens on: the child says why at each poll (the console shows it as
    its reader's error, ``Feed.error``), and keeps trying; it is not lost."""
    ahead = ReadAhead("redis://127.0.0.1:1/0", None, PACING._replace(poll_s=0.05))
    try:
        said = []
        deadline = time.monotonic() + BOUND_S
        while len(said) < 2:
            assert time.monotonic() < deadline
            try:
                ahead.poll_batch()
            except ReadAheadLost:
                raise
            except StoreError as exc:
                said.append(str(exc))
        assert all("127.0.0.1:1" in s for s in said), said
        assert ahead.procs[0].poll() is None  # (still there, trying)
    finally:
        ahead.close()


def test_after_a_read_process_is_lost_a_restart_at_the_tail_reads_here_too(tmp_path):
    """Once a read process was lost, the console starts none again: a restart at the tail
    (its model past its budget) whose reopen gives a read process reads in the console's
    process instead, and that process is ended."""
    store = str(tmp_path / "job")
    write_store(store, JobShape(RANKS, 20))
    started: list[ReadAhead] = []

    def reopen(window):
        started.append(_ahead(store))
        return started[-1]

    feed = Feed(_ahead(store), hang_after=10.0, reopen=reopen)
    os.kill(feed.reader.pid, signal.SIGKILL)
    want = _reference(store)
    _until(feed, lambda: feed.restarts == 1 and feed.model.events == want[0])
    feed.RESTART_READS_AGAIN = 1.0  # (made though its one segment a stream holds the whole job: what it reads with is tested)
    feed._restart_at_tail()
    assert feed.restarts == 2 and not isinstance(feed.reader, ReadAhead) and len(started) == 1
    assert gone(started[0].pid)
    assert feed.model.events == want[0]  # (the window is a minute at least: the whole job)
    feed.reader.close()


S = 1_000_000_000
T0 = 1_780_000_000 * S


def _beats(writer: DirectoryWriter, first: int, last: int, job: Path) -> None:
    """Heartbeats ``first`` to ``last`` (one a second of trace time from ``T0``) written in
    rotating segments, and the job's files dated at the last: the job's end is its newest
    write (``latest_ns``), which a duration counts back from."""
    for k in range(first, last, 50):
        writer.write([orjson.dumps({"type": "heartbeat", "ts": T0 + j * S, "v": 3, "rank": 0, "inflight": j})
                      for j in range(k, min(k + 50, last))])
    for f in job.iterdir():
        os.utime(f, ns=(T0 + last * S, T0 + last * S))


def test_a_window_read_again_after_a_loss_starts_where_the_console_counted_it(tmp_path, monkeypatch):
    """attach --since 1500s at a job's end; the job writes 3,000 s more, and the read
    process is lost: the job is read again from the window's start counted at attach
    (``window_start_ns``), not 1,500 s back from the job's new end, which would drop half
    of what the console showed."""
    monkeypatch.setattr(bulkread, "cores", lambda: 2)
    writer = DirectoryWriter(tmp_path, "job", 0, {"world_size": 1}, segment_bytes=16 << 10, closer=False)
    writer.write([orjson.dumps({"type": "meta", "ts": T0, "v": 3, "rank": 0, "world_size": 1, "host": "h"})])
    job = tmp_path / "job"
    _beats(writer, 0, 3000, job)
    since = Since(ago_s=1500)
    counted = T0 + 1500 * S
    reader = open_source(str(tmp_path), since=since)
    assert reader.window_start_ns() == counted
    feed = Feed(read_ahead(reader, str(tmp_path), since), hang_after=10.0)
    ahead = feed.reader
    assert isinstance(ahead, ReadAhead) and ahead.since == Since(at_ns=counted)
    before, _, _ = load_trace(str(tmp_path), since=since)
    _until(feed, lambda: ahead.read_once and feed.model.events == before.events)
    assert before.events < 3000  # (from the segment holding the window's start, not the job's)
    _beats(writer, 3000, 6000, job)
    writer.close()
    os.kill(ahead.pid, signal.SIGKILL)
    want, _, _ = load_trace(str(tmp_path), since=Since(at_ns=counted))
    _until(feed, lambda: feed.restarts == 1 and feed.model.events == want.events)
    assert feed.reader.window_start_ns() == counted
    later, _, _ = load_trace(str(tmp_path), since=since)  # (counted from the new end: what the bug read)
    assert later.events < want.events
    feed.reader.close()


def test_a_window_the_console_could_not_count_is_counted_once_by_the_read_process(tmp_path):
    """A read process started on a duration (the console's reader could not count it: its
    store out of reach then) counts it itself, once: its first batch says where, and a
    stand-in for it reads from there (``ReadAhead.here``), not from a later count."""
    writer = DirectoryWriter(tmp_path, "job", 0, {"world_size": 1}, segment_bytes=16 << 10, closer=False)
    writer.write([orjson.dumps({"type": "meta", "ts": T0, "v": 3, "rank": 0, "world_size": 1, "host": "h"})])
    job = tmp_path / "job"
    _beats(writer, 0, 3000, job)
    ahead = ReadAhead(str(job), Since(ago_s=1500), PACING)
    feed = Feed(ahead, hang_after=10.0)
    _until(feed, lambda: ahead.read_once)
    assert ahead.since == Since(at_ns=T0 + 1500 * S)
    _beats(writer, 3000, 6000, job)
    writer.close()
    here = ahead.here()
    assert here.window_start_ns() == T0 + 1500 * S
    here.close()
    ahead.close()


def test_a_console_quit_while_it_reads_a_job_again_stops_at_the_next_batch(tmp_path, monkeypatch):
    """The read process lost, the console reads the job again here in batches; it is quit
    (``run``'s stop) after its second: the feed's thread ends there, the reader read again
    is closed, and nothing is swapped in (not read to the end first)."""
    store = str(tmp_path / "job")
    write_store(store, JobShape(RANKS, OPS))
    monkeypatch.setattr(Feed, "BUDGET", 16 << 10)  # (many batches)
    stop = threading.Event()
    polls: list[int] = []
    closed: list[bool] = []
    here = ReadAhead.here

    def counted(self):
        reader = here(self)
        poll_batch, close = reader.poll_batch, reader.close

        def poll(max_bytes=None):
            polls.append(max_bytes)
            if len(polls) == 2:
                stop.set()  # (quit, while the second batch is read)
            return poll_batch(max_bytes)

        def closing():
            closed.append(True)
            close()

        reader.poll_batch, reader.close = poll, closing
        return reader

    monkeypatch.setattr(ReadAhead, "here", counted)
    feed = Feed(_ahead(store), hang_after=10.0)
    os.kill(feed.reader.pid, signal.SIGKILL)
    thread = threading.Thread(target=feed.run, args=(lambda message: None, stop))
    thread.start()
    thread.join(BOUND_S)
    assert not thread.is_alive()
    assert len(polls) == 2 and closed == [True]  # (the whole job is many more batches)
    assert feed.restarts == 0 and isinstance(feed.reader, ReadAhead) and feed.model.events == 0
    feed.reader.close()


def test_a_read_process_sends_what_changed_of_its_stats_and_the_console_holds_them_all():
    """A reader's stats changed step by step (counts per rank and per reason, warnings,
    numbers), each step's changes taken: the console's stats equal the reader's after each;
    a step that changed nothing but numbers sends no per-rank count and no warning (a
    window over 16k ranks: their skipped bytes and warnings once, not every batch)."""
    rng = random.Random(7)
    reader, sent, console = ReadStats(), ReadStats(), ReadStats()
    for rank in range(16384):
        reader.count_skipped(rank, 1000 + rank)
        reader.warnings.append(f"rank {rank}: what it was in when segment 3 ended is not known")
    first = reader.changes(sent)
    sent.take(first)
    console.take(first)
    assert console == reader and len(first.skipped_by_rank) == 16384
    for step in range(200):
        kind = rng.randrange(7)
        rank = rng.randrange(16384)
        if kind == 0:
            reader.count_corrupt(rank, rng.randrange(1, 4))
        elif kind == 1:
            reader.count_invalid(rank, {f"reason {rng.randrange(3)}": 2})
        elif kind == 2:
            reader.count_missing(rank, 5)
        elif kind == 3:
            reader.count_summarized(rank, 7)
        elif kind == 4:
            reader.warnings.append(f"warning {step}")
        elif kind == 5:
            reader.count_skipped(rank, 1)
        reader.events += rng.randrange(100)
        reader.partial_tail = rng.randrange(3)
        reader.trimmed = reader.trimmed or kind == 6
        changes = reader.changes(sent)
        sent.take(changes)
        console.take(changes)
        assert console == reader
        assert len(pickle.dumps(changes)) < 2000  # (the 16k counts and warnings not again)
    quiet = reader.changes(sent)
    assert not any(getattr(quiet, name) for name in ("corrupt_by_rank", "invalid_by_rank", "invalid_by_reason",
                                                     "missing_by_rank", "summarized_by_rank", "skipped_by_rank",
                                                     "warnings"))


@pytest.mark.parametrize("segment_bytes, made", [(64 << 10, True), (None, False)], ids=["segments", "one"])
def test_a_console_reading_ahead_restarts_at_the_tail_where_its_window_reads_less_again(tmp_path, segment_bytes,
                                                                                       made):
    """The console's own reader (a read process) past its budget: over a store in 64 KiB
    segments its window starts in later ones, and the restart is made
    (``ReadAhead.read_again`` asks a reader of its window in the console's process); over one
    segment a stream the same job's restart would read it all back, and is not."""
    store = str(tmp_path / "job")
    write_store(store, JobShape(8, 6000, fault="missing", rate=50.0, hang_after=10.0, segment_bytes=segment_bytes))
    full, _, _ = load_trace(store)
    for where, _, names in os.walk(store):  # (a window counts back from the newest write: the job's end)
        for name in names:
            os.utime(os.path.join(where, name), ns=(full.end_ns, full.end_ns))
    feed = Feed(_ahead(store), hang_after=10.0, clock=lambda: full.end_ns,
                reopen=lambda w: read_ahead(open_source(store, wait=True, since=w), store, w, 1))
    feed.MODEL_BUDGET = full.nbytes() // 4
    try:
        _until(feed, lambda: feed.restarts + feed.restarts_skipped >= 1 and feed.caught_up())
        assert (feed.restarts >= 1, feed.restarts_skipped >= 1) == ((True, False) if made else (False, True))
    finally:
        feed.close()
        feed.reader.close()


def test_a_console_quit_during_a_restart_at_the_tail_swaps_nothing_in(tmp_path):
    """A restart at the tail reads its window into a new model (``Feed._swap_in``); the feed
    to end (``run``'s stop set: the console quit) stops it before its first batch: the
    reader it opened is closed, the model and reader followed so far stay."""
    store = str(tmp_path / "job")
    write_store(store, JobShape(RANKS, 20))
    opened: list = []

    def reopen(window):
        reader = open_reader(store, wait=True)
        close = reader.close
        reader.close = lambda: opened.append("closed") or close()
        opened.append(reader)
        return reader

    reader = open_reader(store, wait=True)
    feed = Feed(reader, hang_after=10.0, reopen=reopen)
    _until(feed, lambda: feed.model.events > 0)
    model = feed.model
    feed._stop.set()  # (as ``run``'s stop, once the console quits)
    feed.RESTART_READS_AGAIN = 1.0  # (made though its one segment a stream holds the whole job)
    feed._restart_at_tail()
    assert len(opened) == 2 and opened[1] == "closed" and opened[0].stats.bytes == 0
    assert feed.restarts == 0 and feed.model is model and feed.reader is reader and not feed.error
    reader.close()


_CONSOLE = """
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], str(__import__("os").getpid())],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
assert child.stdout.readline() == b"armed\\n"
print(child.pid, flush=True)
"""
_STUCK = """
import sys, time
from commscope.store import readahead
assert readahead.die_with(int(sys.argv[1]))
print("armed", flush=True)
time.sleep(600)  # (a read process inside a long read: it looks at no pipe)
"""


def test_a_read_process_that_looks_at_no_pipe_ends_with_its_console():
    """A console that ends (a crash: no close) while its read process is inside a long read
    that looks at neither pipe (a first read's workers, a stuck store): the read process
    ends with it, not minutes later, and never lives on alone."""
    got = subprocess.run([sys.executable, "-c", _CONSOLE, _STUCK], capture_output=True, text=True, timeout=BOUND_S)
    assert got.returncode == 0, got.stderr
    pid = int(got.stdout.split()[-1])
    deadline = time.monotonic() + BOUND_S
    try:
        while not gone(pid):
            assert time.monotonic() < deadline, "the read process outlived its console"
            time.sleep(0.05)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_the_stats_of_read_processes_each_reading_a_part_add_up_as_they_change():
    """Three readers of parts of a job, their stats changed step by step (counts per rank,
    per reason, numbers that go down as well as up, warnings), each step's changes taken
    from one of them: the console's stats are the three merged after every step."""
    rng = random.Random(11)
    readers = [ReadStats() for _ in range(3)]
    sent = [ReadStats() for _ in range(3)]
    console = ReadStats()
    for step in range(300):
        k = rng.randrange(3)
        reader = readers[k]
        rank = 3 * rng.randrange(100) + k  # (its part's ranks)
        kind = rng.randrange(6)
        if kind == 0:
            reader.count_corrupt(rank, rng.randrange(1, 4))
        elif kind == 1:
            reader.count_invalid(rank, {f"reason {rng.randrange(3)}": 2})  # (reasons shared by all parts)
        elif kind == 2:
            reader.count_missing(rank, 5)
        elif kind == 3:
            reader.warnings.append(f"part {k}: warning {step}")
        elif kind == 4:
            reader.trimmed = True
        reader.events += rng.randrange(100)
        reader.partial_tail = rng.randrange(3)  # (a number as it is now: down as well as up)
        changes = reader.changes(sent[k])
        console.add_changes(changes, sent[k])
        sent[k].take(changes)
        want = ReadStats()
        for r in readers:
            want.merge(r)
        assert dataclasses.replace(console, warnings=[]) == dataclasses.replace(want, warnings=[]), step
        assert sorted(console.warnings) == sorted(want.warnings)


def test_invalid_reasons_of_several_parts_are_kept_as_one_reader_keeps_them():
    """Past 64 distinct reasons a reader counts the rest as "other" (a hostile trace cannot
    grow its stats); three parts of 40 reasons each, merged (a parallel read's workers) or
    taken as they change (a console's read processes), keep 64 and "other" too, every
    invalid event counted."""
    from commscope.store.base import MAX_REASONS

    parts = []
    for k in range(3):
        part = ReadStats()
        for j in range(40):
            part.count_invalid(3 * j + k, {f"part {k} reason {j}": j + 1})
        parts.append(part)
    merged, taken = ReadStats(), ReadStats()
    for part in parts:
        merged.merge(part)
        taken.add_changes(part.changes(ReadStats()), ReadStats())
    for stats in (merged, taken):
        assert len(stats.invalid_by_reason) == MAX_REASONS + 1 and "other" in stats.invalid_by_reason
        assert sum(stats.invalid_by_reason.values()) == stats.invalid == 3 * sum(range(1, 41))
    assert merged == taken
    # the parts' changes interleaved, each part's reasons growing as it reads: first come,
    # first kept by name; a reason once "other" stays so; every event counted
    rng = random.Random(5)
    parts, sent, console = [ReadStats() for _ in range(3)], [ReadStats() for _ in range(3)], ReadStats()
    folded: set[str] = set()
    for step in range(3000):
        k = rng.randrange(3)
        parts[k].count_invalid(3 * rng.randrange(50) + k, {f"reason {rng.randrange(100)}": 1})
        changes = parts[k].changes(sent[k])
        console.add_changes(changes, sent[k])
        sent[k].take(changes)
        reasons = console.invalid_by_reason
        assert len(reasons) <= MAX_REASONS + 1 and sum(reasons.values()) == console.invalid, step
        assert not folded & set(reasons), step
        folded |= {r for part in parts for r in part.invalid_by_reason if r not in reasons}
    assert console.invalid == sum(p.invalid for p in parts) == 3000 and "other" in console.invalid_by_reason


def _damaged(store: Path, ranks: tuple[int, ...]) -> None:
    """Lines no reader can decode appended to some ranks' streams, and a crash file of
    rank 5 (a faulthandler dump): counted, and read, by the part each rank is in."""
    job = store / "synthetic"
    for r in ranks:
        with open(job / f"rank-{r:05d}.jsonl", "ab") as f:
            f.write(b'{"type": "heartbeat", "rank": 1\n' + b"\xff\xfe not json\n" * r)
    (job / "rank-00005.crash").write_text('Fatal Python error: Segmentation fault\n\n'
                                          'Current thread 0x00007f0000000001 (most recent call first):\n'
                                          '  File "train.py", line 12 in step\n')


def test_read_processes_each_reading_a_part_of_the_ranks_read_and_count_what_one_reads(tmp_path):
    """A finished job with damaged lines in three ranks' streams, a crash file of one rank
    and job metadata that is not JSON, read ahead by one process and by three (a part of
    the ranks each): the models (events, ops per rank, findings, the crash's among them),
    every count of the stats (per rank, per reason, bytes, records) and the warnings are the
    same (the job's metadata counted and said once, not once a part)."""
    store = tmp_path / "job"
    write_store(str(store), JobShape(RANKS, 30))
    _damaged(store, (1, 2, 6))
    (store / "synthetic" / "job.json").write_bytes(b'{"world_size": "eight"')  # (every part reads it)
    got = {}
    for processes in (1, 3):
        feed = Feed(_ahead(str(store), processes=processes), hang_after=10.0)
        ahead = feed.reader
        assert isinstance(ahead, ReadAhead) and len(ahead.procs) == processes
        want = _reference(str(store))
        _until(feed, lambda: ahead.read_once and feed.model.events == want[0])  # noqa: B023
        got[processes] = (_summary(feed.model, feed.model.end_ns), dataclasses.replace(ahead.stats, warnings=[]),
                          sorted(ahead.stats.warnings))
        assert got[processes][0] == want
        ahead.close()
    assert got[1] == got[3]
    summary, stats, warnings = got[3]
    assert stats.corrupt_by_rank == {1: 2, 2: 3, 6: 7} and stats.corrupt == 12
    assert stats.invalid_by_rank == {-1: 1} and [w for w in warnings if w.startswith("job.json")] == [
        "job.json skipped (job metadata: bad world_size)"]
    assert any(5 in culprits for _, culprits in summary[3]), summary[3]  # (its crash, read once)


def _polled(reader) -> list[dict]:
    """A reader's polls until two in a row bring nothing (a crash file is read once it
    stopped growing: at the poll after the one that first saw it): their events."""
    events, quiet = [], 0
    while quiet < 2:
        batch = reader.poll_batch()
        events += batch.events
        quiet = 0 if batch.count() else quiet + 1
    return events


def test_a_part_of_the_streams_is_its_ranks_on_a_directory_and_on_redis(tmp_path, redis_url):
    """Readers of the three parts of a job (``take_shard``) on a directory and on Redis:
    each reads its ranks' events, all of them, and the three together are the job's; a
    crash file is read by its rank's part alone, and job metadata that fails its schema is
    counted by one part."""
    from redis_fixture import redis_client

    from commscope.store.base import Shard
    from commscope.store.redis_store import Keys

    lines = _lines(tmp_path)
    for store in (str(tmp_path / "live"), redis_url):
        job = _Job(store, lines)
        job.write(1.0)
        job.close()
        if not store.startswith("redis"):
            _damaged(Path(store), ())  # (rank 5's crash file)
        whole = open_reader(store)
        crashes = sorted(e["rank"] for e in _polled(whole) if e["type"] == "exit")
        total = (whole.stats.events, whole.stats.records, whole.stats.bytes)
        whole.close()
        parts, crashed = [0, 0, 0], []
        for k in range(3):
            reader = open_reader(store)
            reader.take_shard(Shard(k, 3))
            events = _polled(reader)
            ranks = {e["rank"] for e in events}
            assert ranks == {r for r in range(RANKS) if r % 3 == k}, (store, k)
            crashed += [e["rank"] for e in events if e["type"] == "exit"]
            for j, n in enumerate((reader.stats.events, reader.stats.records, reader.stats.bytes)):
                parts[j] += n
            reader.close()
        assert tuple(parts) == total and total[1] > 0
        assert sorted(crashed) == crashes == ([] if store.startswith("redis") else [5])
        # job metadata that is not JSON: every part reads it (a Redis reader for its
        # maxlen), one counts it and says so, as a reader of all the streams does
        if store.startswith("redis"):
            c = redis_client(store)
            c.set(Keys.meta("synthetic"), b'{"world_size": "eight"')
            c.close()
        else:
            (Path(store) / "synthetic" / "job.json").write_bytes(b'{"world_size": "eight"')
        counted = []
        for shard in (None, Shard(0, 3), Shard(1, 3), Shard(2, 3)):
            reader = open_reader(store)
            if shard is not None:
                reader.take_shard(shard)
            assert reader.job() is None and reader.job() is None  # (asked twice: counted once)
            counted.append((dict(reader.stats.invalid_by_rank), len(reader.stats.warnings)))
            reader.close()
        assert counted == [({-1: 1}, 1), ({}, 0), ({}, 0), ({-1: 1}, 1)], counted  # (the part of rank -1: 2 of 3)


def test_a_console_starts_a_read_process_per_part_of_a_wide_job(tmp_path, monkeypatch):
    """One read process per ``SHARD_RANKS`` ranks of the job's world (its metadata's), at
    most one less than the cores and ``MAX_PROCESSES``; ``COMMSCOPE_READ_PROCESSES`` or
    ``attach --read-processes`` says how many instead; one for a reader that reads a job
    whole (Flight Recorder dumps)."""
    store = str(tmp_path / "job")
    write_store(store, JobShape(RANKS, 4))
    reader = open_reader(store)
    monkeypatch.setattr(bulkread, "cores", lambda: 8)
    assert readahead.processes_for(reader) == 1  # (8 ranks)
    monkeypatch.setattr(type(reader), "job", lambda self: {"world_size": 16384})
    assert readahead.processes_for(reader) == 4
    monkeypatch.setattr(bulkread, "cores", lambda: 3)
    assert readahead.processes_for(reader) == 2
    monkeypatch.setattr(type(reader), "job", lambda self: {"world_size": 5000})
    assert readahead.processes_for(reader) == 1
    monkeypatch.setenv(readahead.ENV_PROCESSES, "3")
    assert readahead.processes_for(reader) == 3
    assert readahead.processes_for(FlightRecorderReader(tmp_path)) == 1
    monkeypatch.setenv(readahead.ENV_PROCESSES, "0")  # (none: read in the console's process)
    assert readahead.processes_for(reader) == 0 and readahead.processes_for(FlightRecorderReader(tmp_path)) == 0
    with pytest.raises(ValueError, match="at least one"):
        ReadAhead(store, None, PACING, processes=0)
    with pytest.raises(StoreError, match="cannot read a part"):
        from commscope.store.base import Shard

        FlightRecorderReader(tmp_path).take_shard(Shard(0, 2))
    # (``attach --read-processes N``: as many, whatever the job's width; 0: none)
    monkeypatch.setattr(bulkread, "cores", lambda: 2)
    assert read_ahead(reader, store, None) is reader  # (``COMMSCOPE_READ_PROCESSES=0``)
    monkeypatch.delenv(readahead.ENV_PROCESSES)
    assert read_ahead(reader, store, None, 0) is reader
    monkeypatch.undo()
    monkeypatch.setattr(bulkread, "cores", lambda: 2)
    ahead = read_ahead(reader, store, None, 12)  # (``reader`` closed: the children read; 8 ranks, 8 parts)
    assert isinstance(ahead, ReadAhead) and len(ahead.procs) == RANKS
    ahead.close()


def test_the_watermark_of_read_processes_is_the_lowest_of_theirs():
    """0 while a part has not read each of its streams once, or cannot tell (no stream of
    it listed yet, or its store not listed) while another can: it holds the others back,
    as a stream not read yet holds a single reader's; else the lowest; None where none can
    tell."""
    assert readahead.lowest_watermark([5, 0, 7]) == 0
    assert readahead.lowest_watermark([9, 5, 7]) == 5
    assert readahead.lowest_watermark([None, 8, 6]) == 0
    assert readahead.lowest_watermark([None, None]) is None
    assert readahead.lowest_watermark([0, None]) == 0
    assert readahead.lowest_watermark([4]) == 4 and readahead.lowest_watermark([None]) is None
    assert readahead.lowest_watermark([0]) == 0


def test_one_read_process_lost_ends_the_others_at_once(tmp_path):
    """Three read processes, the second SIGKILLed: the poll that finds it gone raises
    ``ReadAheadLost`` naming it, and the other two are ended then (not left reading until
    the console has read the job again and closes the reader: minutes at 16k ranks)."""
    store = str(tmp_path / "job")
    write_store(store, JobShape(RANKS, 20))
    ahead = _ahead(store, SMALL, processes=3)
    try:
        os.kill(ahead.procs[1].pid, signal.SIGKILL)
        deadline = time.monotonic() + BOUND_S
        with pytest.raises(ReadAheadLost, match="read process 2 of 3 ended"):  # noqa: PT012
            while True:
                assert time.monotonic() < deadline
                ahead.poll_batch()
        deadline = time.monotonic() + BOUND_S
        while not all(gone(p.pid) for p in ahead.procs):  # (killed: each a zombie at once, or reaped)
            assert time.monotonic() < deadline, [p.pid for p in ahead.procs if not gone(p.pid)]
            time.sleep(0.01)
    finally:
        ahead.close()


def test_a_part_whose_ranks_wrote_nothing_holds_the_watermark_back_only_while_it_cannot_tell(tmp_path, redis_url):
    """More parts than the ranks that write (a 2-rank job read by three processes, as
    ``--read-processes 3`` asks before the job's width is known): the part with no stream
    says each of its streams (none) is read as of its listing, so the console's watermark
    is set and the console judges; a reader of that part on a directory or on Redis says
    the same, and a directory that cannot be listed cannot tell."""
    from commscope.store.base import Shard

    store = str(tmp_path / "job")
    write_store(store, JobShape(2, 20))
    ahead = _ahead(store, processes=3)
    try:
        deadline = time.monotonic() + BOUND_S
        while not (ahead.read_once and ahead.watermark_ns()):
            assert time.monotonic() < deadline, ahead.watermark_ns()
            ahead.poll_batch()
    finally:
        ahead.close()
    job = _Job(redis_url, {r: lines for r, lines in _lines(tmp_path).items() if r < 2})
    job.write(1.0)
    job.close()
    for source in (store, redis_url):
        reader = open_reader(source)
        reader.take_shard(Shard(2, 3))
        before = time.time_ns()
        assert not reader.poll_batch().count()
        mark = reader.watermark_ns()
        assert mark is not None and mark >= before, source
        reader.close()
    reader = open_reader(store)
    reader.take_shard(Shard(2, 3))
    reader.poll_batch()
    assert reader.watermark_ns()
    shutil.rmtree(reader.job_dir)  # (a listing that fails: the job's directory gone)
    assert reader.watermark_ns() is None
    reader.close()


def test_what_every_read_process_says_of_the_whole_job_is_said_once(tmp_path):
    """The job's directory gone from under a console read ahead by three processes (a part
    of the ranks each): each says it cannot list it, the console once, as one reader does;
    back (each reads its ranks' new lines, from the listing it trusts), then gone again:
    said again, once."""
    store = tmp_path / "job"
    write_store(str(store), JobShape(RANKS, 10))
    job, gone = store / "synthetic", tmp_path / "away"
    old = time.time() - 3600  # (a directory not changed lately: listed once, then trusted while it stays so)
    os.utime(job, (old, old))
    cannot = f"cannot list {job}: No such file or directory"
    said = {}
    for processes in (1, 3):
        feed = Feed(_ahead(str(store), processes=processes), hang_after=10.0)
        ahead = feed.reader
        _until(feed, lambda: ahead.read_once)  # noqa: B023
        for turn in (1, 2):
            job.rename(gone)
            _until(feed, lambda: all(c.stats.warnings.count(cannot) == turn for c in ahead._children))  # noqa: B023
            gone.rename(job)
            events = feed.model.events
            for r in range(RANKS):  # (a line for each rank: every part reads again)
                with open(job / f"rank-{r:05d}.jsonl", "ab") as f:
                    f.write(b'{"type":"heartbeat","v":3,"rank":%d,"ts":%d,"inflight":0}\n'
                            % (r, feed.model.end_ns + turn))
            _until(feed, lambda: feed.model.events == events + RANKS)  # noqa: B023
        said[processes] = [w for w in ahead.stats.warnings if "synthetic" in w]
        ahead.close()
    assert said[1] == said[3] == [cannot, cannot]


def test_a_warning_of_the_whole_job_is_said_as_often_as_the_read_process_that_says_it_most():
    """Three read processes' warnings of the whole job (a Redis connection lost, again):
    an outage all of them meet is said once; one that a process meets again, whichever,
    is said again; a part's own (naming its ranks) is always said."""
    from commscope.store.readahead import _Child

    ahead = ReadAhead.__new__(ReadAhead)  # (its children's pipes apart: what it makes of what they say)
    children = [_Child.__new__(_Child) for _ in range(3)]
    for child in children:
        child.said = collections.Counter()
    ahead._children, ahead._said = children, collections.Counter()
    lost, back = "lost the connection to redis://h:6379; still trying", "reconnected to redis://h:6379"

    def says(k: int, *warnings: str) -> list[str]:
        return ahead._first_said(ReadStats(warnings=list(warnings)), children[k]).warnings

    assert says(0, lost) == [lost] and says(1, lost) == [] and says(2, lost) == []  # (all three met it: once)
    assert says(1, back) == [back] and says(0, back) == [] and says(2, back) == []
    assert says(2, lost, back) == [lost, back]  # (the third met another: said again)
    assert says(0, lost) == [] and says(1, lost, back) == []  # (as often as the one that said it most: 2)
    assert says(1, lost) == [lost]  # (its third)
    assert says(0, "rank 3: cannot read rank-00003.jsonl") == ["rank 3: cannot read rank-00003.jsonl"]
    assert says(1, "rank 3: cannot read rank-00003.jsonl") == ["rank 3: cannot read rank-00003.jsonl"]


def test_a_job_directory_that_is_there_but_cannot_be_listed_is_said_once(tmp_path, monkeypatch):
    """The job's directory stat'ed but not listed (no descriptor left, a directory its
    reader may enter but not list): said once, not at every poll; listed again, then not
    listed: said again."""
    from commscope.store import directory

    store = tmp_path / "job"
    write_store(str(store), JobShape(RANKS, 4))
    reader = open_reader(str(store))
    _polled(reader)
    real = os.scandir

    def refused(path):
        raise OSError(errno.EMFILE, "Too many open files")

    cannot = f"cannot list {store / 'synthetic'}: Too many open files"
    for turn in (1, 2):
        monkeypatch.setattr(directory.os, "scandir", refused)
        os.utime(store / "synthetic")  # (changed: listed again, not trusted)
        for _ in range(5):
            reader.poll_batch()
            reader.watermark_ns()
        assert reader.stats.warnings.count(cannot) == turn, reader.stats.warnings
        monkeypatch.setattr(directory.os, "scandir", real)
        os.utime(store / "synthetic")
        reader.poll_batch()
    reader.close()
