"""What a whole read's worker and the reading process send each other (store/bulkread.py):
any object, its arrays' memory after the pickle (out of band), read back equal and
writable; a message cut anywhere is the worker gone, never a wrong object."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import threading

import numpy as np
import psutil
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from procs import state_of
from readers import by_workers, stand_in_workers
from test_blocks_equivalence import SETTINGS, needs_scanner, regular_streams, streams
from test_store_history import wait_for

from commscope.snapshot import pyspy
from commscope.store import bulkread


def _round(obj: object) -> object:
    f = io.BytesIO()
    bulkread.send(f, obj)
    f.seek(0)
    got = bulkread.receive(io.BufferedReader(f))
    return got


def test_objects_and_their_arrays_come_back_equal_and_writable():
    a = np.arange(1000, dtype=np.int64)
    obj = {"c": a, "f": np.asfortranarray(np.arange(12.0).reshape(3, 4)), "strided": a[::3], "empty": np.zeros(0),
           "objects": np.array([{"x": 1}, None], dtype=object), "events": [{"type": "meta", "ts": 1}], "n": 5}
    got = _round(obj)
    assert isinstance(got, dict) and got.keys() == obj.keys()
    for k, v in obj.items():
        if isinstance(v, np.ndarray):
            assert got[k].dtype == v.dtype and np.array_equal(got[k], v) if v.dtype != object else \
                got[k].tolist() == v.tolist()
            assert got[k].flags.writeable
        else:
            assert got[k] == v
    got["c"][0] = 7  # (its own memory: the sender's is untouched)
    assert a[0] == 0


def test_a_message_cut_anywhere_is_the_worker_gone():
    f = io.BytesIO()
    bulkread.send(f, {"c": np.arange(100, dtype=np.int64), "e": [1, 2, 3]})
    whole = f.getvalue()
    for cut in sorted({0, 1, 8, 15, 16, 23, 24, len(whole) // 2, len(whole) - 1}):
        with pytest.raises(EOFError):
            bulkread.receive(io.BufferedReader(io.BytesIO(whole[:cut])))


#: A worker that notes each job it takes (a file named by the job's ``job_dir`` in the
#: directory given) and answers it at once with that name
_NOTING = ("import pathlib, sys; from commscope.store import bulkread\n"
           "while (job := bulkread.receive(sys.stdin.buffer)) is not None:\n"
           "    (pathlib.Path(sys.argv[1]) / job.job_dir).touch()\n"
           "    bulkread.send(sys.stdout.buffer, job.job_dir)\n")


def test_workers_go_on_while_the_caller_ingests(tmp_path, monkeypatch):
    """What a worker sends is taken off its pipe, and its next job given, while the caller
    is still busy with an earlier message (``Workers._pump``): before, the worker waited for
    the caller's next step, blocked in its write, then for a job, and at 16k ranks both
    workers sat so while the caller ingested (one core idle, ~6% of a read)."""
    stand_in_workers(monkeypatch, (sys.executable, "-c", _NOTING, str(tmp_path)))
    pool = bulkread.Workers(1)
    names = [f"job{k}" for k in range(4)]
    got = pool.run([bulkread.Job(name, None, {}) for name in names])
    assert next(got) == "job0"
    # the caller holds: the worker still reads every job (up to AHEAD waiting for it)
    wait_for(lambda: all((tmp_path / name).exists() for name in names), "the worker to take every job")
    assert list(got) == names[1:]
    assert pool.procs == []  # (ended: ``run`` closes its workers)


def test_a_caller_that_stops_early_ends_the_workers(tmp_path, monkeypatch):
    """The caller stops while the pump waits to hand it more than ``AHEAD`` a worker allows:
    the pump ends, and so do the workers."""
    stand_in_workers(monkeypatch, (sys.executable, "-c", _NOTING, str(tmp_path)))
    monkeypatch.setattr(bulkread.Workers, "AHEAD", 1)
    pool = bulkread.Workers(1)
    procs = list(pool.procs)
    got = pool.run([bulkread.Job(f"job{k}", None, {}) for k in range(6)])
    assert next(got) == "job0"
    wait_for(lambda: (tmp_path / "job2").exists(), "the worker to read on")  # (job1 waits, job2 is being put)
    got.close()
    assert [p.wait(60) is not None for p in procs] == [True] and pool.procs == []
    assert [t.name for t in threading.enumerate() if t.name == "commscope-bulkread"] == []


#: What a worker does first to start late: it waits for the file named last (60 s at most)
GATE = ("import os, sys, time\n"
        "deadline = time.monotonic() + 60\n"
        "while not os.path.exists(sys.argv[-1]) and time.monotonic() < deadline:\n"
        "    time.sleep(0.01)\n")


def test_a_caller_with_nothing_to_ingest_reads_jobs_itself(tmp_path, monkeypatch):
    """``run``'s ``here``: while no message waits (the worker still starting, ~0.13 s of
    imports), the caller reads the jobs not given yet itself, so the reading process is a
    reader too (1k ranks on 2 cores: 0.47 s against 0.57).  Every job comes back once, from
    the caller or from the worker."""
    gate = tmp_path / "gate"
    stand_in_workers(monkeypatch, (sys.executable, "-c", GATE + _NOTING, str(tmp_path), str(gate)))
    read_here: list[str] = []

    def here(job: bulkread.Job) -> str:
        read_here.append(job.job_dir)
        if len(read_here) == 3:
            gate.touch()  # (the worker starts only now: the first three were the caller's)
        return f"here {job.job_dir}"

    names = [f"job{k}" for k in range(8)]
    pool = bulkread.Workers(1)
    got = list(pool.run([bulkread.Job(name, None, {}) for name in names], here))
    assert got[:3] == [f"here {name}" for name in read_here[:3]]
    assert sorted(x.removeprefix("here ") for x in got) == names  # (each once)
    by_worker = [x for x in got if not x.startswith("here ")]
    assert sorted(by_worker + read_here) == names and pool.procs == []


def test_a_job_larger_than_a_pipe_waits_for_the_message_before_it(tmp_path, monkeypatch):
    """A worker writing its message reads no job: the pump gives it the next one only once
    it has read the message.  Given first (a trial), a job larger than the worker's stdin
    pipe (thousands of short streams) and a message larger than its stdout pipe left each
    side waiting for the other, forever."""
    sends = ("import sys; from commscope.store import bulkread\n"
             "while (job := bulkread.receive(sys.stdin.buffer)) is not None:\n"
             "    bulkread.send(sys.stdout.buffer, (job.job_dir[-1], bytes(3 << 20)))\n")
    stand_in_workers(monkeypatch, (sys.executable, "-c", sends))
    got = _read_to_its_end(bulkread.Workers(1), [bulkread.Job("x" * (1 << 20) + str(k), None, {}) for k in range(3)])
    assert [name for name, _ in got] == ["0", "1", "2"]


def _read_to_its_end(pool: bulkread.Workers, jobs: list[bulkread.Job]) -> list:
    """What ``pool.run(jobs)`` gives, read by a thread: its end waited for (a read that
    never ends fails the test, its workers killed), not the test's own thread stuck in it."""
    procs = list(pool.procs)
    got: list = []
    reading = threading.Thread(target=lambda: got.extend(pool.run(jobs)))
    reading.start()
    try:
        wait_for(lambda: not reading.is_alive(), "the read to end")
    finally:
        for p in procs:
            p.kill()
        reading.join()
    return got


def test_a_worker_that_takes_no_job_holds_no_one(tmp_path, monkeypatch):
    """A worker that stops taking its job (stuck, stopped) where the job is larger than its
    stdin's pipe (thousands of short streams): the pump waited in the write forever, and
    the read with it.  Now the write has ``STALL_S`` as a message has: the worker is
    killed and its job comes back, here for the caller's own reader."""
    stand_in_workers(monkeypatch, (sys.executable, "-c", "import time; time.sleep(600)"))
    monkeypatch.setattr(bulkread.Workers, "STALL_S", 1.0)
    pool = bulkread.Workers(1)
    procs = list(pool.procs)
    job = bulkread.Job("x" * (1 << 20), None, {})
    assert _read_to_its_end(pool, [job]) == [job]
    assert procs[0].wait(60) == -signal.SIGKILL and pool.procs == []


def test_a_job_the_caller_fails_to_read_comes_back_as_a_job(tmp_path, monkeypatch):
    """``here`` failing (the job directory deleted under a fresh reader) is a worker failing:
    the job comes back for the caller's own reader, not the end of the read."""
    gate = tmp_path / "gate"
    stand_in_workers(monkeypatch, (sys.executable, "-c", GATE + _NOTING, str(tmp_path), str(gate)))

    def here(job: bulkread.Job) -> str:
        gate.touch()
        raise OSError("gone")

    pool = bulkread.Workers(1)
    got = list(pool.run([bulkread.Job(f"job{k}", None, {}) for k in range(4)], here))
    jobs = [x.job_dir for x in got if isinstance(x, bulkread.Job)]
    assert jobs and sorted(jobs + [x for x in got if isinstance(x, str)]) == [f"job{k}" for k in range(4)]


def _pump_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "commscope-bulkread"]


def test_a_pump_that_cannot_start_is_the_callers_error(tmp_path, monkeypatch):
    """The pump's first step failing (its selector, out of descriptors where a reader holds
    a 16k-rank job's files) reaches the caller as that error: the caller waited forever."""
    stand_in_workers(monkeypatch, (sys.executable, "-c", _NOTING, str(tmp_path)))

    def no_descriptors() -> None:
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(bulkread.selectors, "DefaultSelector", no_descriptors)
    pool = bulkread.Workers(1)
    procs = list(pool.procs)
    with pytest.raises(OSError, match="Too many open files"):
        list(pool.run([bulkread.Job(f"job{k}", None, {}) for k in range(3)]))
    assert [p.wait(60) is not None for p in procs] == [True] and pool.procs == []
    assert _pump_threads() == []


def test_a_read_collected_on_the_pumps_thread_ends_it(tmp_path, monkeypatch):
    """``run``'s generator dropped in a reference cycle is closed by whichever thread's
    allocations start the collection, often the pump's (it unpickles): its end must not wait
    for the pump, its own thread (it did, forever, and the workers were never closed)."""
    stand_in_workers(monkeypatch, (sys.executable, "-c", _NOTING, str(tmp_path)))
    pool = bulkread.Workers(1)
    procs = list(pool.procs)
    got = pool.run([bulkread.Job(f"job{k}", None, {}) for k in range(6)])
    receive, calls, taken = bulkread.receive, [], threading.Event()

    def collected_here(*args, **kwargs):  # (as a collection on the pump's thread would)
        calls.append(threading.current_thread().name)
        if len(calls) == 3:
            taken.wait(60)  # (the caller out of the generator: it may be closed)
            got.close()
        return receive(*args, **kwargs)

    monkeypatch.setattr(bulkread, "receive", collected_here)
    assert next(got) == "job0"
    taken.set()
    wait_for(lambda: len(calls) >= 3 and not _pump_threads(), "the pump to end")
    assert calls[2] == "commscope-bulkread"
    assert [p.wait(60) is not None for p in procs] == [True] and pool.procs == []


def test_a_worker_starts_with_one_openblas_thread(monkeypatch):
    """A worker does no linear algebra: it is started with one OpenBLAS thread, whatever the
    reading process has (numpy's import started a thread a core that spun ~0.1 s of CPU a
    worker, taken from the workers beside it)."""
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "8")
    says = ("import os, sys; from commscope.store import bulkread; bulkread.receive(sys.stdin.buffer); "
            "bulkread.send(sys.stdout.buffer, os.environ.get('OPENBLAS_NUM_THREADS'))")
    stand_in_workers(monkeypatch, (sys.executable, "-c", says))
    pool = bulkread.Workers(1)
    assert list(pool.run([bulkread.Job("job", None, {})])) == ["1"]


_NO_CYCLES = """
import gc, sys
from commscope.store.bulkread import Job
from commscope.store.directory import DirectoryReader, read_streams

job_dir = sys.argv[1]
streams = list(DirectoryReader(job_dir).streams().items())
gc.collect()
gc.disable()  # (as a worker runs)
found = []
for j in range(9):
    part = dict(streams[(j % 3) * 8:(j % 3) * 8 + 8])
    sent = read_streams(Job(job_dir, None, part)).sent()
    assert len(sent.reading) == 8
    del sent
    found.append(gc.collect())  # the cycles this job left: what a worker would keep
print(*found)
"""


@pytest.mark.parametrize("json", [False, True], ids=["native", "json"])
def test_a_workers_jobs_leave_nothing_for_the_collector(tmp_path, json):
    """A worker runs without the cyclic collector (``bulkread.main``): what each job builds
    (the reader, its decoders, the batch it sends) must be freed by reference counts, or a
    worker of a 16k-rank read would grow with every job.  In a process of its own (no other
    thread allocating meanwhile)."""
    import subprocess

    from commscope.bench.synthstore import JobShape, write_store

    write_store(str(tmp_path), JobShape(24, 200, json=json))
    got = subprocess.run([sys.executable, "-c", _NO_CYCLES, str(tmp_path / "synthetic")], capture_output=True,
                         text=True, timeout=600)
    assert got.returncode == 0, got.stderr
    found = [int(x) for x in got.stdout.split()]
    assert len(found) == 9
    assert found[2:] == [0] * 7, found  # (the first jobs: their lazy imports and caches)


_TRACED = '''
import subprocess, sys
import numpy as np
from commscope.store import bulkread
N = 150
if sys.argv[1:] == ["child"]:
    for i in range(N):  # (through its stdout's buffered writer, as a worker and a read process send)
        bulkread.send(sys.stdout.buffer, {"i": i, "a": np.arange(200_000 + i), "e": [{"x": j} for j in range(2000)]})
    sys.exit(0)
p = subprocess.Popen([sys.executable, "-c", sys.argv[1], "child"], stdout=subprocess.PIPE)
for i in range(N):
    m = bulkread.receive(p.stdout)
    assert m["i"] == i and np.array_equal(m["a"], np.arange(200_000 + i)) and m["e"][-1] == {"x": 1999}, i
print("all", N)
'''


def test_messages_arrive_whole_while_a_tracer_stops_the_sender_mid_write(tmp_path):
    """py-spy sampling a sender (a read worker, a console's read process) stops it in the
    middle of its writes, many times a second: every message still arrives whole and
    exact.  Written through Python's buffered writer, messages were torn or their arrays'
    bytes wrong within the first dozen (a console lost its read process under py-spy)."""
    exe = pyspy.executable()
    assert exe is not None, "py-spy is a dependency (pip install py-spy)"
    got = subprocess.run([exe, "record", "-r", "250", "--subprocesses", "-f", "raw", "-o", str(tmp_path / "samples"),
                          "--", sys.executable, "-c", _TRACED, _TRACED], capture_output=True, text=True, timeout=600)
    assert got.returncode == 0 and "all 150" in got.stdout, got.stdout + got.stderr


@pytest.fixture
def descriptors_past_select():
    """More than 1,024 descriptors open (a reader holding a 16k-rank job's files): pipes
    opened now are numbered past what ``select.select`` takes."""
    import os
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 2048 if hard == resource.RLIM_INFINITY else min(hard, 2048)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, want), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        yield
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_pipe_numbered_past_1024_is_waited_on(descriptors_past_select):
    import os

    r, w = os.pipe()
    assert r > 1024
    with os.fdopen(r, "rb", buffering=0) as f:
        assert not bulkread.readable(f, 0.0)
        os.write(w, b"x")
        assert bulkread.readable(f, 0.0)
        os.close(w)


def test_a_worker_whose_pipes_are_numbered_past_1024_is_heard(descriptors_past_select, monkeypatch):
    """Its message is read with a deadline (``receive``): waiting on its pipe must not fail
    for the pipe's number (it did through ``select``, and every worker's chunk came back to
    be read by the reading process)."""
    says = ("import sys; from commscope.store import bulkread; bulkread.receive(sys.stdin.buffer); "
            "bulkread.send(sys.stdout.buffer, 'read')")
    stand_in_workers(monkeypatch, (sys.executable, "-c", says))
    pool = bulkread.Workers(1)
    assert pool.procs[0].stdout.fileno() > 1024
    assert list(pool.run([bulkread.Job("job", None, {})])) == ["read"]


# -- a worker's table of statics, kept from one job to the next (``directory._worker_table``)

def _write_job(job_dir, per_rank) -> None:
    job_dir.mkdir(parents=True, exist_ok=True)
    for rank, lines in per_rank:
        (job_dir / f"rank-{rank:05d}.jsonl").write_bytes(b"".join(x + b"\n" for x in lines))


def _as_read(sent) -> tuple:
    """What a worker's job read, statics resolved (a kept table numbers them otherwise)."""
    batch = sent.received()
    return (batch.events, [(r.rank, r.events()) for r in batch.ops], sent.stats, sent.reading, sent.read_of,
            sent.partial, sent.decoders, sent.max_ids, sent.drops_read, sent.lines_read, sent.last_read)


def _jobs_read(job_dir, per_job: int, kept: bool) -> list[tuple]:
    """Each job of ``per_job`` streams read as a worker reads it, one after another in this
    process: with the table kept from job to job, or each with a table of its own."""
    from commscope.store import directory
    from commscope.store.directory import DirectoryReader, read_streams

    streams = list(DirectoryReader(str(job_dir)).streams().items())
    directory._TABLES.kept = None
    out = []
    for i in range(0, len(streams), per_job):
        if not kept:
            directory._TABLES.kept = None
        out.append(_as_read(read_streams(bulkread.Job(str(job_dir), None, dict(streams[i:i + per_job]))).sent()))
    directory._TABLES.kept = None
    return out


def test_a_worker_s_next_job_learns_no_table_prefix_its_last_job_learnt(tmp_path, monkeypatch):
    """A worker keeps its table of statics from one job to the next of one job directory:
    the next job's streams replay the table prefixes the last one walked and take the
    signatures it decoded (each job's first stream learnt them all again, ~1.5 ms); another
    directory, or a table past ``TABLE_KEPT_STATICS``, starts afresh."""
    from commscope.bench.synthstore import JobShape, write_store
    from commscope.blocks import StaticTable
    from commscope.store import directory
    from commscope.store.directory import DirectoryReader, read_streams

    write_store(str(tmp_path), JobShape(8, 60))
    job_dir = str(tmp_path / "synthetic")
    streams = list(DirectoryReader(job_dir).streams().items())
    walked, decoded = [0], [0]
    learn, keep = StaticTable.learn, StaticTable.keep_sid_static

    def counted_learn(self, *args):
        walked[0] += 1
        return learn(self, *args)

    def counted_keep(self, *args):
        decoded[0] += 1
        return keep(self, *args)

    monkeypatch.setattr(StaticTable, "learn", counted_learn)
    monkeypatch.setattr(StaticTable, "keep_sid_static", counted_keep)
    monkeypatch.setattr(directory._TABLES, "kept", None, raising=False)

    def job(part: dict) -> int:
        walked[0] = 0
        read_streams(bulkread.Job(job_dir, None, part))
        return walked[0]

    assert job(dict(streams[:4])) > 0 and decoded[0] > 0
    decoded[0] = 0
    assert job(dict(streams[4:])) == 0 and decoded[0] == 0  # (all learnt by the job before)
    assert job(dict(streams[4:])) == 0
    walked[0] = 0  # another thread of this process: a table of its own (not one two threads share)
    other_thread = threading.Thread(target=read_streams, args=(bulkread.Job(job_dir, None, dict(streams[4:])),))
    other_thread.start()
    other_thread.join()
    assert walked[0] > 0 and job(dict(streams[4:])) == 0  # (and this thread's is still its own)
    other = tmp_path / "other"
    other.mkdir()
    for path in (tmp_path / "synthetic").iterdir():
        (other / path.name).write_bytes(path.read_bytes())
    walked[0] = 0
    read_streams(bulkread.Job(str(other), None, dict(list(DirectoryReader(str(other)).streams().items())[:4])))
    assert walked[0] > 0  # (another job directory: a table of its own)
    monkeypatch.setattr(directory, "TABLE_KEPT_STATICS", 0)
    assert job(dict(streams[:4])) > 0  # (a new table: the other directory's held statics)
    assert job(dict(streams[4:])) > 0  # (past the bound: afresh)


@needs_scanner
@settings(SETTINGS, max_examples=60)
@given(st.lists(st.one_of(streams(mode="upfront", rank=1), streams(mode="late", rank=1),
                          streams(mode="wild", rank=1), regular_streams(1)), min_size=2, max_size=6),
       st.sampled_from([1, 2, 3]))
def test_a_worker_s_jobs_read_with_its_kept_table_as_each_with_its_own(many, per_job):
    """Jobs read one after another by one worker, its table kept, read what each reads with
    a table of its own: streams whose tables differ, state their prefixes late, change them
    mid-stream, with damaged records and lines among them."""
    import tempfile
    from pathlib import Path

    per_rank = [(rank, [x.replace(b'"rank":1', b'"rank":%d' % rank) for x in lines]) for rank, lines in enumerate(many, 1)]
    with tempfile.TemporaryDirectory() as d:
        job_dir = Path(d) / "job"
        _write_job(job_dir, per_rank)
        assert _jobs_read(job_dir, per_job, kept=True) == _jobs_read(job_dir, per_job, kept=False)


def test_a_whole_read_s_last_poll_finds_quiet_streams_by_size_and_reads_what_came_after(tmp_path, monkeypatch):
    """After its workers, a whole read polls every stream once more (what was written
    meanwhile).  It opened every file for it, the 4,096 a worker had read to their ends
    included (~50 ms of a 4k-rank check, its last step, one core idle).  Each worker now says
    where its streams ended (``StreamsRead.tails``): the last poll asks each quiet one's
    size, holds none of them open, and still reads a stream that went on after the workers."""
    from commscope.bench.synthstore import T0, JobShape, write_store
    from commscope.store.directory import DirectoryReader

    store = tmp_path / "trace"
    write_store(str(store), JobShape(6, 40, fault="healthy", hang_after=2.0))
    by_workers(monkeypatch)
    monkeypatch.setattr(DirectoryReader, "PARALLEL_MIN_BYTES", 0)
    r = DirectoryReader(str(store))
    list(r._bulk(1 << 10))  # (the workers' part of ``bulk``, several chunks)
    assert r.stats.workers == 2
    assert sorted(r._tails) == [(rank, 0) for rank in range(6)]
    grown = r.job_dir / "rank-00003.jsonl"
    with open(grown, "ab") as f:  # (rank 3 goes on: its exit, after the workers read it)
        f.write(b'{"type":"exit","ts":%d,"reason":"exit","code":0,"v":3,"rank":3}\n' % (T0 + 60 * 10**9))
    opened: list[str] = []
    open_file = r._files._open
    monkeypatch.setattr(r._files, "_open", lambda path: opened.append(path) or open_file(path))
    last = r.read_all_batch()
    assert [(e["rank"], e["reason"]) for e in last.events if e["type"] == "exit"] == [(3, "exit")]
    assert opened == []  # (rank 3's rest read as a whole read's are: no file held for it)
    r.close()


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_a_worker_s_pipe_holds_half_a_chunk(start):
    """A worker's chunk (~2 MB for 43 streams of 400 ops) came back in 64 KiB reads, a poll
    and a read each; its pipe now holds ``PIPE_BYTES`` (Linux lets a process set up to
    /proc/sys/fs/pipe-max-size, 1 MiB by default)."""
    import fcntl

    pool = bulkread.Workers(1, start)
    try:
        assert fcntl.fcntl(pool.procs[0].stdout.fileno(), fcntl.F_GETPIPE_SZ) == bulkread.PIPE_BYTES
    finally:
        pool.close()


def test_workers_are_forked_only_where_no_other_thread_runs(monkeypatch):
    """A forked worker pays none of a fresh one's imports, but a lock another thread held at
    the fork would stay held in it: a process running another thread (a console, a pump)
    starts them afresh.  ``COMMSCOPE_READ_START`` says which where set."""
    monkeypatch.delenv(bulkread.ENV_START, raising=False)
    assert threading.active_count() == 1 and bulkread.start_method() == "fork"
    pool = bulkread.Workers(1)
    assert [type(p) for p in pool.procs] == [bulkread.Forked]
    pool.close()
    hold = threading.Event()
    other = threading.Thread(target=hold.wait, args=(60,))
    other.start()
    try:
        assert bulkread.start_method() == "spawn"
        pool = bulkread.Workers(1)
        assert [type(p) for p in pool.procs] == [subprocess.Popen]
        pool.close()
        monkeypatch.setenv(bulkread.ENV_START, "fork")  # (as asked)
        assert bulkread.start_method() == "fork"
    finally:
        hold.set()
        other.join()
    monkeypatch.setenv(bulkread.ENV_START, "spawn")
    assert bulkread.start_method() == "spawn"


def test_a_forked_worker_holds_only_its_own_pipes(tmp_path):
    """A forked worker inherits every descriptor of its reader (a 16k-rank job's files, the
    pipes of the workers forked before it) and keeps only its own pipes and /dev/null: a
    worker holding an earlier one's pipes would keep that one's end from being seen (its
    output never ending when it dies, its input never ending when the reader closes it)."""
    held = [open(tmp_path / f"f{k}", "wb") for k in range(50)]  # noqa: SIM115 (a reader's files)
    pool = bulkread.Workers(2, "fork")
    try:
        first, second = pool.procs
        for p in (first, second):  # (once it has closed what it inherited, then named itself: it
            # closes first, and a look between the two saw its caller's name, CI at bc8c562)
            wait_for(lambda p=p: sorted(os.listdir(f"/proc/{p.pid}/fd"), key=int) == ["0", "1", "2"]
                     and psutil.Process(p.pid).name() == bulkread.FORKED_NAME,
                     "the worker to close what it inherited and name itself")
        first.kill()  # its output ends though the second (forked after it) lives on
        assert bulkread.readable(first.stdout, 60) and first.stdout.read(1) == b""
        assert first.wait(60) == -signal.SIGKILL and second.poll() is None
        second.stdin.close()  # its input ends: it leaves as a worker does
        assert second.wait(60) == 0
    finally:
        for f in held:
            f.close()
        pool.close()


def test_a_forked_worker_waited_for_elsewhere_is_ended():
    """A forked worker reaped by someone else (a SIGCHLD handler of the caller's program):
    waiting for it ends, with 0 as ``Popen`` gives, where it looped forever."""
    pool = bulkread.Workers(1, "fork")
    p = pool.procs[0]
    p.stdin.close()
    os.waitpid(p.pid, 0)  # (reaped here, not by ``p``)
    codes: list = []
    waiting = threading.Thread(target=lambda: codes.extend([p.wait(), p.poll()]), daemon=True)
    waiting.start()
    wait_for(lambda: not waiting.is_alive(), "the wait to end")
    assert codes == [0, 0]
    pool.close()


class _Raised(Exception):
    """What a handler of the reader's raises (``_raising``)."""


def _raising(*_) -> None:
    raise _Raised


@pytest.mark.parametrize("sig, handler, raised", [(signal.SIGINT, signal.default_int_handler, KeyboardInterrupt),
                                                  (signal.SIGUSR1, _raising, _Raised)],
                         ids=["ctrl-c", "a-handler-that-raises"])
def test_a_signal_landing_just_after_the_fork_leaves_nothing_behind(monkeypatch, sig, handler, raised):
    """Every signal is held back across the fork and lands when the reader's mask is
    restored, once the parent knows its child: the worker half made is killed and waited
    for, its pipes closed, and the mask is the reader's again.  Before: for Ctrl-C, four
    descriptors and a child waiting on its stdin for ever (a REPL's each time); for a
    handler of the reader's that raised between the fork and ``self.pid`` (only SIGINT and
    SIGTERM were held back), the child, for good."""
    fork, forked = os.fork, []

    def signalled_fork() -> int:
        pid = fork()
        if pid:
            forked.append(pid)
            # (to this thread, which holds it back: it lands once the mask is restored; one sent
            # to the process goes to any other thread a test left running, and lands at once)
            signal.pthread_kill(threading.get_ident(), sig)
        return pid

    before = signal.signal(sig, handler)
    try:
        fds = set(os.listdir("/proc/self/fd"))
        monkeypatch.setattr(os, "fork", signalled_fork)
        with pytest.raises(raised):
            bulkread.Workers(1, "fork")
        monkeypatch.undo()
        assert sig not in signal.pthread_sigmask(signal.SIG_BLOCK, ())
        assert set(os.listdir("/proc/self/fd")) <= fds
        [pid] = forked
        assert not os.path.exists(f"/proc/{pid}")  # (killed and waited for: no zombie either)
    finally:
        signal.signal(sig, before)


def test_a_forked_worker_dropped_running_is_waited_for_by_the_next_fork():
    """A worker whose ``Workers`` was dropped without ``close`` (its caller raised) ends at
    its stdin's end, and is waited for by the next fork, as ``Popen`` does: not a zombie for
    as long as the reader runs."""
    import gc

    worker = bulkread.Forked()
    pid = worker.pid
    del worker
    gc.collect()  # (its pipes closed with it: it leaves)
    wait_for(lambda: state_of(pid) == "Z", "the dropped worker to end")
    pool = bulkread.Workers(1, "fork")
    try:
        assert state_of(pid) == "gone"
    finally:
        pool.close()


def test_a_signal_the_reader_ignores_stays_ignored_in_its_forked_worker():
    """As ``exec`` leaves it: a signal ignored by the reader (a console's read process
    ignores SIGINT, the console handles it) is ignored by its worker too."""
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        pool = bulkread.Workers(1, "fork")
    finally:
        signal.signal(signal.SIGINT, before)
    try:
        pid = pool.procs[0].pid
        wait_for(lambda: sorted(os.listdir(f"/proc/{pid}/fd"), key=int) == ["0", "1", "2"], "the worker to start")
        with open(f"/proc/{pid}/status") as f:
            ignored = int(next(line for line in f if line.startswith("SigIgn:")).split()[1], 16)
        assert ignored & (1 << (signal.SIGINT - 1))
    finally:
        pool.close()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP], ids=lambda s: s.name)
def test_a_forked_worker_takes_signals_as_a_fresh_one(sig):
    """The reader's own signal handlers are not the worker's: each signal a handler of the
    reader's takes ends the worker, as it ends a fresh one (the handler, here one that does
    nothing, would keep it alive)."""
    before = signal.signal(sig, lambda *_: None)
    try:
        pool = bulkread.Workers(1, "fork")
    finally:
        signal.signal(sig, before)
    try:
        p = pool.procs[0]
        os.kill(p.pid, sig)
        assert p.wait(60) == -sig
    finally:
        pool.close()


def _spy_on_starts(monkeypatch) -> tuple[list[str], list]:
    """What a read does in order ("workers" started; "sizes of N" streams asked), and the
    worker processes it started."""
    from commscope.store.directory import DirectoryReader

    steps: list[str] = []
    procs: list = []
    start, window = bulkread.Workers.__init__, DirectoryReader._window

    def started(self, n):
        steps.append("workers")
        start(self, n)
        procs.extend(self.procs)

    monkeypatch.setattr(bulkread.Workers, "__init__", started)
    monkeypatch.setattr(DirectoryReader, "_window",
                        lambda self, streams: steps.append(f"sizes of {len(streams)}") or window(self, streams))
    return steps, procs


def test_a_large_read_s_workers_start_while_the_sizes_are_asked(tmp_path, monkeypatch):
    """A worker takes ~0.13 s to start (its imports), and was started only once every
    segment's size was asked (~20 ms at 4k ranks, the reading process alone).  Where a
    sample of the sizes says the read goes apart for sure, they start first; the read is
    the one a reader reading alone makes."""
    from commscope.analysis.source import load_trace
    from commscope.bench.synthstore import JobShape, write_store
    from commscope.store.directory import DirectoryReader

    store = str(tmp_path / "trace")
    write_store(store, JobShape(6, 40, hang_after=2.0))
    alone, _r, _w = load_trace(store)
    by_workers(monkeypatch)
    monkeypatch.setattr(DirectoryReader, "PARALLEL_MIN_BYTES", 1)
    monkeypatch.setattr(DirectoryReader, "SIZE_SAMPLE", 1)  # (a sample of one stream in six)
    steps, _procs = _spy_on_starts(monkeypatch)
    apart, reader, _w = load_trace(store)
    assert reader.stats.workers == 1  # (as many as the chunks the guess makes: one of 8 MiB)
    assert steps == ["sizes of 1", "workers", "sizes of 6"], steps
    assert (apart.events, apart.total_ops(), sorted(apart.ranks)) == (alone.events, alone.total_ops(), sorted(alone.ranks))


def test_workers_started_for_a_read_whose_sizes_cannot_be_asked_are_ended(tmp_path, monkeypatch):
    """Workers start before every segment's size is asked; asking them failing ends the
    read, and the workers with it (they were left waiting for jobs until collected)."""
    from test_oprecords import _bulkread_children

    from commscope.analysis.source import load_trace
    from commscope.bench.synthstore import JobShape, write_store
    from commscope.errors import UsageError
    from commscope.store.directory import DirectoryReader

    store = str(tmp_path / "trace")
    write_store(store, JobShape(6, 40, hang_after=2.0))
    by_workers(monkeypatch)
    monkeypatch.setattr(DirectoryReader, "PARALLEL_MIN_BYTES", 1)
    monkeypatch.setattr(DirectoryReader, "SIZE_SAMPLE", 1)
    steps, procs = _spy_on_starts(monkeypatch)
    window = DirectoryReader._window

    def fails_for_all(self, streams):
        if len(streams) > 1:
            raise PermissionError(13, "Permission denied")
        return window(self, streams)

    monkeypatch.setattr(DirectoryReader, "_window", fails_for_all)
    with pytest.raises((PermissionError, UsageError)):
        load_trace(store)
    assert steps[:2] == ["sizes of 1", "workers"] and procs
    assert _bulkread_children() == [] and all(p.poll() is not None for p in procs)


def test_workers_started_for_a_read_that_then_stays_alone_are_ended(tmp_path, monkeypatch):
    """A sample that took the one large stream of six for the rule: the workers started,
    then every size said the read is too small to go apart.  They are ended, and the read
    is made alone."""
    from commscope.analysis.source import load_trace
    from commscope.bench.synthstore import T0, JobShape, write_store
    from commscope.store.directory import DirectoryReader

    store = tmp_path / "trace"
    write_store(str(store), JobShape(6, 40, hang_after=2.0))
    job = store / "synthetic"
    others = sum((job / f"rank-{rank:05d}.jsonl").stat().st_size for rank in range(1, 6))
    with open(job / "rank-00000.jsonl", "ab") as f:  # (rank 0 the large one: 5x the others together)
        line = 0
        while (job / "rank-00000.jsonl").stat().st_size < 5 * others:
            f.write(b"".join(b'{"type":"heartbeat","ts":%d,"inflight":0,"v":3,"rank":0}\n'
                             % (T0 + 100 * 10**9 + (line + k) * 10**6) for k in range(1000)))
            f.flush()
            line += 1000
    big = (job / "rank-00000.jsonl").stat().st_size
    by_workers(monkeypatch)
    monkeypatch.setattr(DirectoryReader, "PARALLEL_MIN_BYTES", int(2.5 * big))  # (guessed 6x, all 1.2x)
    monkeypatch.setattr(DirectoryReader, "SIZE_SAMPLE", 1)
    steps, procs = _spy_on_starts(monkeypatch)
    model, reader, _w = load_trace(str(store))
    assert steps == ["sizes of 1", "workers", "sizes of 6"], steps
    assert reader.stats.workers == 0 and len(model.ranks) == 6
    assert procs and [p.poll() for p in procs] == [0] * len(procs)  # (asked to end, and ended)
