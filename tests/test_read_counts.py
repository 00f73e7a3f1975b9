"""Each byte and event a reader did not read is counted once, with its true cause.

* A window's segments before its start are "before the window, not read" while they exist;
  once retention summarizes and deletes them, their summaries stand for them ("retention
  summarized"), and they are no longer counted as skipped (dropping ``--since`` would not
  read them now): the reader's counts are then a fresh reader's of the same window, per
  rank, in one process, with its streams read apart by workers, and summed over a
  console's read processes (``ReadStats.changes`` / ``add_changes``)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from readers import by_workers

from commscope.analysis.source import load_trace, open_source
from commscope.bench.synthstore import JobShape, write_store
from commscope.schema import SCHEMA_VERSION
from commscope.store import ReadStats, open_reader, open_writer, retention, segments
from commscope.store.directory import DirectoryReader
from commscope.store.files import size_of
from commscope.store.readahead import around
from commscope.tui.feed import Feed
from commscope.window import Since

BOUND_S = 120.0  # (a bound on waiting for a condition, never a margin)
SINCE = Since(ago_s=60)


def _windowed_store(tmp_path: Path, ranks: int) -> Path:
    """A finished job of small segments (64 KiB: ~80 a rank over ~8 minutes), none deleted."""
    store = tmp_path / "store"
    write_store(str(store), JobShape(ranks=ranks, ops=6000 if ranks == 2 else 3000, fault="missing",
                                     segment_bytes=64 << 10, retain="none", rate=25.0))
    return store


def _delete_before_window(job: Path, since_ns: int, keep_before: dict[int, int]) -> dict[int, int]:
    """Retention run on each rank's stream, keeping ``keep_before[rank]`` of its segments
    before the window's first (the rest of those before it summarized and deleted); how
    many went, per rank."""
    gone = {}
    for (rank, inc), segs in segments.list_segments(job).items():
        start = segments.window_start(segs, since_ns / 1e9)
        first_kept = start - keep_before.get(rank, 0)
        assert 0 < first_kept <= start, (rank, start)
        keep = sum(size_of(s.path) for s in segs[first_kept:])
        gone[rank] = retention.enforce(job, rank, inc, retention.Retention(keep, None), segs)
        assert gone[rank] == first_kept
    return gone


def _counts(stats: ReadStats) -> tuple:
    return (stats.skipped_bytes, stats.skipped_by_rank, stats.summarized, stats.summarized_by_rank)


def _fresh(store: Path) -> ReadStats:
    r = open_source(str(store), since=SINCE)
    r.read_all()
    r.close()
    return r.stats


@pytest.mark.parametrize("workers", [False, True])
def test_segments_skipped_before_the_window_then_deleted_are_counted_once_as_summarized(
        tmp_path, monkeypatch, workers):
    """A ``--since`` reader that counted segments as skipped before its window, then polled
    after retention summarized and deleted them (all of rank 1's before the window, all but 3
    of rank 0's): the bytes of the segments left are skipped, the deleted ones' events are
    summarized (before, they stayed in ``skipped_bytes`` too: 5.6 MiB said "not read, drop
    --since to read it" where 1.9 MiB was left), per rank, as a fresh reader counts them, and
    rank 1, which skips nothing now, is not counted among the ranks that skipped."""
    store = _windowed_store(tmp_path, 2)
    job = store / "synthetic"
    if workers:  # (the streams read apart in worker processes: each counts what it skipped)
        by_workers(monkeypatch)
        monkeypatch.setattr(DirectoryReader, "PARALLEL_MIN_BYTES", 0)
    r = open_source(str(store), since=SINCE)
    assert isinstance(r, DirectoryReader)
    if workers:
        for _ in r.bulk(1 << 20):
            pass
        assert r.stats.workers >= 1
    else:
        r.read_all()
    before = r.stats.skipped_bytes
    assert r.stats.summarized == 0 and set(r.stats.skipped_by_rank) == {0, 1}
    gone = _delete_before_window(job, r.since_ns, {0: 3})
    assert gone[0] > 0 and gone[1] > 0
    r._listed = None  # (listed again at the next poll, whatever the directory's mtime says)
    r.poll()
    want = _fresh(store)
    assert want.summarized > 0 and want.skipped_by_rank.keys() == {0}
    assert _counts(r.stats) == _counts(want)
    assert r.stats.skipped_bytes < before
    left = sum(size_of(s.path) for s in segments.list_segments(job)[(0, 0)][:3])
    assert r.stats.skipped_bytes == left
    r.close()


def test_a_count_taken_back_out_reaches_a_console_summing_its_read_processes():
    """Readers of parts whose skipped bytes are counted, then taken back out (in part, and
    to none: the rank is then no rank that skipped), their changes sent step by step: the
    console's stats are the readers' merged after every step."""
    readers = [ReadStats(), ReadStats()]
    sent = [ReadStats(), ReadStats()]
    console = ReadStats()
    steps = [(0, 0, 100), (1, 1, 50), (0, 2, 30), (0, 0, -40), (1, 1, -50), (0, 0, -60), (0, 2, -30),
             (1, 3, 7), (0, 0, 5)]
    for k, rank, n in steps:
        if n > 0:
            readers[k].count_skipped(rank, n)
        else:
            assert readers[k].uncount_skipped(rank, -n) == -n
        changes = readers[k].changes(sent[k])
        console.add_changes(changes, sent[k])
        sent[k].take(changes)
        assert sent[k] == readers[k]
        want = ReadStats()
        for reader in readers:
            want.merge(reader)
        assert dataclasses.replace(console, warnings=[]) == dataclasses.replace(want, warnings=[]), (k, rank, n)
    assert console.skipped_by_rank == {0: 5, 3: 7} and console.skipped_bytes == 12


def test_read_processes_of_a_window_count_deleted_segments_once(tmp_path):
    """A console's read processes (two, a part of the ranks each) reading a window, then
    retention deleting segments before it: the stats they sum are a fresh reader's."""
    store = _windowed_store(tmp_path, 4)
    job = store / "synthetic"
    r0 = open_source(str(store), since=SINCE)
    since_ns = r0.since_ns
    ahead = around(r0, str(store), SINCE, Feed.pacing(), processes=2)
    try:
        want = _fresh(store)

        def until(done):
            deadline = time.monotonic() + BOUND_S
            while not done():
                assert time.monotonic() < deadline, _counts(ahead.stats)
                ahead.poll_batch(max_bytes=8 << 20)

        until(lambda: _counts(ahead.stats) == _counts(want))
        _delete_before_window(job, since_ns, {0: 2, 2: 1})
        want = _fresh(store)
        assert want.summarized > 0 and want.skipped_by_rank.keys() == {0, 2}
        until(lambda: _counts(ahead.stats) == _counts(want))
    finally:
        ahead.close()


@pytest.mark.parametrize("value", ["inf", "1e400", "-inf", "nan", "abc", "0", "-3", "1e-12"])
def test_a_segment_size_that_cannot_be_read_takes_the_default_and_says_so(tmp_path, monkeypatch, value):
    """``$COMMSCOPE_SEGMENT_MB`` not a finite size above 0: a writer made through the store's
    registry (as a rank registers) warns naming the variable, writes segments of the default
    size, and what it wrote is read (before, ``inf`` raised OverflowError in every writer
    made: the rank recorded nothing, its recorder thread retrying for good)."""
    monkeypatch.setenv(segments.ENV_SEGMENT_MB, value)
    with pytest.warns(RuntimeWarning, match=r"\$COMMSCOPE_SEGMENT_MB=.*cannot be read.*64 MiB"):
        w = open_writer(str(tmp_path), "job", 0, {"world_size": 1})
    assert w.segment_bytes == segments.DEFAULT_SEGMENT_BYTES
    w.write([orjson.dumps({"type": "meta", "v": SCHEMA_VERSION, "rank": 0, "ts": time.time_ns(), "world_size": 1,
                           "pid": 1, "host": "h"})])
    w.close()
    r = open_reader(str(tmp_path))
    assert [e["type"] for e in r.read_all()] == ["meta"]
    r.close()


def test_a_segment_size_that_can_be_read_is_taken(monkeypatch):
    monkeypatch.setenv(segments.ENV_SEGMENT_MB, " 0.5 ")
    assert segments.segment_bytes_from_env() == 512 << 10
    monkeypatch.setenv(segments.ENV_SEGMENT_MB, "")
    assert segments.segment_bytes_from_env() == segments.DEFAULT_SEGMENT_BYTES


# -- a line gone from a rank's file: the gap in its ring positions


def _ring_job(tmp_path: Path, ranks: int = 2, ops: int = 400, **shape) -> Path:
    store = tmp_path / "g"
    write_store(str(store), JobShape(ranks=ranks, ops=ops, **shape))
    return store


def _remove_block(path: Path, how: str = "delete", which: float = 0.5) -> int:
    """One block line of a rank's file removed (``delete``) or damaged (``garbage``): the
    bytes of records its ring positions said it held."""
    lines = path.read_bytes().split(b"\n")
    at = [i for i, line in enumerate(lines) if b'"type":"block"' in line]
    k = at[int(len(at) * which)]
    ev = orjson.loads(lines[k])
    if how == "delete":
        del lines[k]
    else:
        lines[k] = lines[k][:40] + b"#garbage"
    path.write_bytes(b"\n".join(lines))
    return ev["end"] - ev["pos"]


def _assert_one_line_lost(store: Path, read: str, nbytes: int, monkeypatch) -> None:
    """Rank 1 lost exactly one block line of ``nbytes`` bytes of op records, as a read of
    ``store`` counts it and says it: whole (``check``), in polls (a console), in polls of a
    few KiB (the gap between two chunks), or read apart by workers (``read``)."""
    if read == "workers":
        by_workers(monkeypatch)
        monkeypatch.setattr(DirectoryReader, "PARALLEL_MIN_BYTES", 0)
    if read in ("whole", "workers"):
        _, reader, warnings = load_trace(str(store))
        stats = reader.stats
        if read == "workers":
            assert stats.workers >= 1
    else:
        reader = open_source(str(store))
        _polled_all(reader, None if read == "polls" else 4096)
        stats = reader.stats
        reader.close()
        warnings = stats.warnings
    assert stats.missing_by_rank == {1: 1} and stats.corrupt == 0 and stats.invalid == 0, warnings
    assert [w for w in warnings if "ring positions" in w] == [
        f"rank 1: 1 line(s) of its stream were lost: a gap in its ring positions: {nbytes:,} bytes "
        "of op records missing (a line gone from its file)"], warnings


def _polled_all(reader, budget: int | None) -> None:
    quiet = 0
    while quiet < 2:
        quiet = 0 if reader.poll(budget) else quiet + 1
    reader.read_all()


@pytest.mark.parametrize("read", ["whole", "polls", "small_polls", "workers"])
def test_a_block_line_gone_from_a_rank_file_is_counted_lost_with_its_cause(tmp_path, monkeypatch, read):
    """A healthy job, one block line (4 records) deleted from rank 1's file: before, ``check``
    said nothing and ``report`` counted rank 1 at 398 ops of 400.  The jump in its ring
    positions is one line lost by the store, said with its bytes, however the stream is
    read: whole (``check``), in polls (a console), in polls of a few KiB (the gap between
    two chunks), read apart by workers."""
    store = _ring_job(tmp_path)
    nbytes = _remove_block(store / "synthetic" / "rank-00001.jsonl")
    _assert_one_line_lost(store, read, nbytes, monkeypatch)
    if read == "whole":  # (a line of blocks, not an event: it held 4 op records)
        out = subprocess.run([sys.executable, "-m", "commscope", "check", "--json", str(store)], capture_output=True,
                             text=True)
        gone = [f for f in json.loads(out.stdout)["findings"] if f["kind"] == "trace_incomplete"]
        assert len(gone) == 1 and "1 line(s) of their streams lost by the store (rank 1: 1)" \
            in gone[0]["message"], gone


@pytest.mark.parametrize("number, which", [(3, 0.5), (0, 0.5), (3, 0.0)],
                         ids=["inside_a_later_segment", "inside_the_first", "first_of_a_later_segment"])
def test_a_block_line_gone_from_a_segment_retention_deleted_is_counted_by_its_summary(tmp_path, number, which):
    """A block line gone from a segment that retention then summarized and deleted, before
    any reader read it: the summary keeps the gap (``gaps``, ``gap_bytes``), and a reader
    counts it as a read of the segment would have, once, with its segment (before, a
    summary kept a segment's damaged lines and a writer's losses but not its gaps: nothing
    said the line went).  The first block line of a later segment too (the carry of the
    one before says where the ring was: ``RingEnd``); the other rank loses nothing."""
    store = _windowed_store(tmp_path, 2)
    job = store / "synthetic"
    segs = segments.list_segments(job)[(1, 0)]
    seg = segs[number]
    nbytes = _remove_block(seg.path, which=which)
    keep = sum(size_of(s.path) for s in segs[-20:])
    assert retention.enforce(job, 1, 0, retention.Retention(keep, None), segs) == len(segs) - 20
    summary = orjson.loads(next(line for line in (job / segments.summary_name(1, 0)).read_bytes().splitlines()
                                if orjson.loads(line)["seg"] == seg.number))
    assert (summary["gaps"], summary["gap_bytes"]) == (1, nbytes), summary
    _, reader, warnings = load_trace(str(store))
    assert reader.stats.missing_by_rank == {1: 1} and reader.stats.corrupt == 0, warnings
    assert [w for w in warnings if "ring positions" in w] == [
        f"rank 1: 1 line(s) of its stream were lost: a gap in its ring positions: {nbytes:,} bytes of op records "
        f"missing (a line gone from its file; in segment {seg.number}, which retention deleted since)"], warnings


def test_a_block_line_gone_first_in_a_window_is_counted(tmp_path):
    """A ``--since`` read that starts at a later segment whose first block line is gone: the
    gap is counted (the carry it reads first says where the ring was at the end of the
    segment before; before, a window took its first block for the ring's start)."""
    store = _windowed_store(tmp_path, 2)
    r = open_source(str(store), since=SINCE)
    segs = r.streams()[(1, 0)]
    seg = r._current((1, 0), segs)
    assert seg.number > 0
    nbytes = _remove_block(seg.path, which=0.0)
    r.read_all()
    r.close()
    assert r.stats.skipped_bytes > 0 and r.stats.missing_by_rank == {1: 1}, r.stats.warnings
    assert [w for w in r.stats.warnings if "ring positions" in w] == [
        f"rank 1: 1 line(s) of its stream were lost: a gap in its ring positions: {nbytes:,} bytes of op records "
        "missing (a line gone from its file)"]


def _records_twice(rank: int, world: int, store: str) -> None:
    """Two recordings in one process (``commscope.instrumented`` twice): two jobs."""
    import torch
    import torch.distributed as dist

    import commscope

    x = torch.ones(4)
    for _ in range(2):
        with commscope.instrumented(store, sample_interval=0.2, flight_recorder=False):
            for _ in range(50):
                dist.all_reduce(x)
            dist.barrier()


def test_a_process_that_records_twice_counts_no_gap_in_its_second_job(tmp_path):
    """The native recorder's ring is the process's: a second recording in one process (a new
    job, incarnation 0) goes on where the first ended, so its stream's first block starts
    past 0, and nothing was lost (helper-101: a read that took a stream of incarnation 0 to
    start at 0 said a line of each rank's was lost, and ``check`` exited 1 on a healthy
    job).  Where a read starts, only a block, or a carry, says where the ring was."""
    from commscope.launch import Job

    store = tmp_path / "trace"
    results = Job(_records_twice, 2, args=(str(store),), env={"COMMSCOPE_SOURCE": "native"}).start().join(120)
    assert all(r.ok for r in results.values()), {k: r.error for k, r in results.items()}
    # (the ranks agree on the second job's id through the c10d store, where the first one's is
    # still written: a loaded host may have a rank's second recording join the first job)
    jobs = [p for p in store.iterdir() if p.is_dir()]
    firsts = [orjson.loads(next(line for line in f.read_bytes().splitlines() if b'"type":"block"' in line))
              for job in jobs for f in job.glob("rank-*.jsonl")]
    assert any(b["pos"] > 0 for b in firsts), firsts  # (the premise: a stream whose ring did not start at 0)
    for job in jobs:
        _, reader, warnings = load_trace(str(job))
        assert not reader.stats.missing_by_rank and reader.stats.corrupt == 0, warnings


def test_a_block_line_gone_makes_check_say_the_trace_is_incomplete(tmp_path):
    """``check`` never exits 0 over the ops it could not read: rank 1's stream is incomplete."""
    store = _ring_job(tmp_path)
    _remove_block(store / "synthetic" / "rank-00001.jsonl")
    got = subprocess.run([sys.executable, "-m", "commscope", "check", "--json", str(store)], capture_output=True,
                         text=True, timeout=300)
    assert got.returncode != 0, got.stdout
    out = json.loads(got.stdout)
    assert out["skipped"]["store_missing"] == 1 and out["skipped"]["damaged"] == 0, out["skipped"]

    def incomplete(node) -> bool:  # (a finding of its own, or a consequence of another)
        if isinstance(node, dict):
            if node.get("kind") == "trace_incomplete" and 1 in node.get("culprits", ()):
                return True
            return any(incomplete(v) for v in node.values())
        return isinstance(node, list) and any(incomplete(v) for v in node)

    assert incomplete(out["findings"]), out["findings"]


def test_a_damaged_block_line_is_counted_once(tmp_path):
    """A block line damaged (not JSON) leaves the same jump: counted as the damaged line it
    is, not a second time as a gap."""
    store = _ring_job(tmp_path)
    _remove_block(store / "synthetic" / "rank-00001.jsonl", "garbage")
    for budget in (None, 4096):
        reader = open_source(str(store))
        _polled_all(reader, budget)
        assert reader.stats.corrupt_by_rank == {1: 1} and not reader.stats.missing_by_rank, reader.stats.warnings
        reader.close()


def test_reads_that_start_or_go_on_mid_stream_count_no_gap(tmp_path):
    """No gap where nothing went: a full read of a stream of many segments (positions go on
    from one to the next), a window starting mid-stream, and a reader that jumped over
    segments retention deleted under it (what they held, their summaries count)."""
    store = _windowed_store(tmp_path, 2)
    job = store / "synthetic"
    _, reader, _ = load_trace(str(store))
    assert not reader.stats.missing_by_rank and reader.stats.corrupt == 0
    r = open_source(str(store), since=SINCE)
    r.read_all()
    assert r.stats.skipped_bytes > 0 and not r.stats.missing_by_rank, r.stats.warnings
    r.close()
    r = open_source(str(store))
    while r.poll(256 << 10):  # (part of the way: then retention deletes what it has not read)
        if all(n > 2 for n in r._reading.values()):
            break
    for (rank, inc), segs in segments.list_segments(job).items():
        retention.enforce(job, rank, inc, retention.Retention(sum(size_of(s.path) for s in segs[-20:]), None), segs)
    r._listed = None
    _polled_all(r, 256 << 10)
    assert r._jumps and r.stats.summarized > 0 and not r.stats.missing_by_rank, r.stats.warnings
    r.close()


def _records_in_steps(rank: int, world: int, store: str) -> None:
    """A short recording whose ops reach the store in several blocks (a flush after each step)."""
    import torch
    import torch.distributed as dist

    import commscope

    x = torch.ones(4)
    with commscope.instrumented(store, sample_interval=0.2, flight_recorder=False) as rec:
        for _ in range(4):
            for _ in range(10):
                dist.all_reduce(x)
            assert rec.flush(timeout=60.0)
        dist.barrier()


@pytest.mark.parametrize("source", ["native", "python"])
@pytest.mark.parametrize("read", ["whole", "polls", "small_polls", "workers"])
def test_a_stream_first_block_line_gone_is_counted_lost(tmp_path, monkeypatch, source, read):
    """A real 2-rank job, the first block line of rank 1's stream deleted: before, nothing said
    a line went (a read takes a stream's first block for where its ring starts) and ``check``
    counted no loss.  The rank's meta says where its stream's first block starts (``ring``):
    the line is one lost, with its bytes, however the stream is read; rank 0 loses nothing,
    counted in bytes from its ring positions, as a line gone later in the stream is."""
    from commscope.launch import Job

    store = tmp_path / "trace"
    env = {"COMMSCOPE_SOURCE": source}
    results = Job(_records_in_steps, 2, args=(str(store),), env=env).start().join(120)
    assert all(r.ok for r in results.values()), {k: r.error for k, r in results.items()}
    job = next(p for p in store.iterdir() if p.is_dir())
    path = job / "rank-00001.jsonl"
    lines = path.read_bytes().split(b"\n")
    at = [i for i, line in enumerate(lines) if b'"type":"block"' in line]
    assert len(at) >= 2, at  # (the premise: the stream goes on after its first block)
    meta, first = orjson.loads(lines[0]), orjson.loads(lines[at[0]])
    assert meta["type"] == "meta" and meta["ring"] == first["pos"], (meta, first)
    _, before, _ = load_trace(str(job))
    assert not before.stats.missing_by_rank and before.stats.corrupt == 0
    del lines[at[0]]
    path.write_bytes(b"\n".join(lines))
    _assert_one_line_lost(job, read, first["end"] - first["pos"], monkeypatch)


def test_a_stream_first_block_line_gone_makes_check_count_it(tmp_path):
    """``check --json`` over a real job whose rank 1 lost its stream's first block line: not
    healthy, the loss counted once (``store_missing``), rank 1 the culprit of a
    ``trace_incomplete`` finding, rank 0 blamed for nothing."""
    from commscope.launch import Job

    store = tmp_path / "trace"
    results = Job(_records_in_steps, 2, args=(str(store),), env={"COMMSCOPE_SOURCE": "native"}).start().join(120)
    assert all(r.ok for r in results.values()), {k: r.error for k, r in results.items()}
    job = next(p for p in store.iterdir() if p.is_dir())
    path = job / "rank-00001.jsonl"
    lines = path.read_bytes().split(b"\n")
    k = next(i for i, line in enumerate(lines) if b'"type":"block"' in line)
    first = orjson.loads(lines.pop(k))
    path.write_bytes(b"\n".join(lines))
    got = subprocess.run([sys.executable, "-m", "commscope", "check", "--json", str(job)], capture_output=True,
                         text=True, timeout=300)
    assert got.returncode == 1, got.stdout + got.stderr
    out = json.loads(got.stdout)
    assert out["skipped"]["store_missing"] == 1 and out["skipped"]["damaged"] == 0, out["skipped"]
    [finding] = out["findings"]
    assert (finding["kind"], finding["culprits"], finding["ranks"]) == ("trace_incomplete", [1], [1]), finding
    assert finding["evidence"]["lost_events"] == 1 and finding["evidence"]["per_rank"] == {"1": {"missing": 1}}
    assert f"rank 1: 1 line(s) of its stream were lost: a gap in its ring positions: " \
           f"{first['end'] - first['pos']:,} bytes of op records missing (a line gone from its file)" in out["warnings"]


@pytest.mark.parametrize("source", ["native", "python"])
@pytest.mark.parametrize("how", ["damaged", "refused"])
def test_a_stream_first_block_line_damaged_or_refused_is_counted_lost_once(tmp_path, monkeypatch, source, how):
    """A real 2-rank job, the first block line of rank 1's stream damaged (not JSON) or
    refused by the schema (JSON whose ``data`` is no string): one line lost, counted once as
    what it is, damaged or invalid, and not a second time as the gap its ring positions
    leave, however the stream is read; ``check --json`` says one event lost, rank 1's, and
    rank 0 loses nothing.  Before, the refused line was counted invalid and its gap lost as
    well: two lines for one (``blocks.gaps_not_counted`` took every ``block:`` reason for the
    decoder's, whose lines leave no gap)."""
    from commscope.launch import Job

    store = tmp_path / "trace"
    results = Job(_records_in_steps, 2, args=(str(store),), env={"COMMSCOPE_SOURCE": source}).start().join(120)
    assert all(r.ok for r in results.values()), {k: r.error for k, r in results.items()}
    job = next(p for p in store.iterdir() if p.is_dir())
    path = job / "rank-00001.jsonl"
    lines = path.read_bytes().split(b"\n")
    k = next(i for i, line in enumerate(lines) if b'"type":"block"' in line)
    first = orjson.loads(lines[k])
    assert orjson.loads(lines[0])["ring"] == first["pos"]  # (the premise: the read counts from where the ring starts)
    lines[k] = lines[k][:40] + b"#garbage" if how == "damaged" else orjson.dumps(dict(first, data=12))
    path.write_bytes(b"\n".join(lines))
    counted = {"damaged": "corrupt_by_rank", "refused": "invalid_by_rank"}[how]
    for read in ("whole", "polls", "small_polls", "workers"):
        with monkeypatch.context() as m:
            if read == "workers":
                by_workers(m)
                m.setattr(DirectoryReader, "PARALLEL_MIN_BYTES", 0)
            if read in ("whole", "workers"):
                _, reader, _ = load_trace(str(job))
                assert reader.stats.workers >= (read == "workers")
            else:
                reader = open_source(str(job))
                _polled_all(reader, None if read == "polls" else 4096)
                reader.close()
        stats = reader.stats
        assert getattr(stats, counted) == {1: 1}, (read, stats)
        assert stats.corrupt + stats.invalid == 1 and not stats.missing_by_rank, (read, stats.warnings)
    got = subprocess.run([sys.executable, "-m", "commscope", "check", "--json", str(job)], capture_output=True,
                         text=True, timeout=300)
    assert got.returncode == 1, got.stdout + got.stderr
    out = json.loads(got.stdout)
    assert out["skipped"]["store_missing"] == 0, out["skipped"]
    [finding] = out["findings"]
    assert (finding["kind"], finding["culprits"], finding["ranks"]) == ("trace_incomplete", [1], [1]), finding
    kind = {"damaged": "damaged", "refused": "invalid"}[how]
    assert finding["evidence"]["lost_events"] == 1 and finding["evidence"]["per_rank"] == {"1": {kind: 1}}


@pytest.mark.parametrize("before", ["a segment gone", "a damaged line", "its meta only"])
def test_a_console_whose_first_read_went_to_workers_counts_the_next_gap_once(tmp_path, monkeypatch, before):
    """A console's first read goes to read workers (``read_apart``), each stopping at a
    stream's end: rank 1's there is a line torn in two (a write under way).  What the worker
    read before it says what the next gap in the ring positions, read by the console, stands
    for: a segment gone by hand just before (counted with the segment: its lines), a
    damaged block line (counted damaged), or nothing read but the meta, which says where the
    ring starts (the first block line gone is a line lost).  Before, the hand-off dropped
    them (``_gone_excuse``, ``_excused``, and the decoder's ``ring_open``, taken again as
    ``not seen_end``, a ring from 0 as not known): 66 lines lost for a segment of 65, a
    damaged line counted twice, a first block line gone not counted at all."""
    store = _ring_job(tmp_path, ops=2000 if before == "a segment gone" else 400,
                      segment_bytes=50000 if before == "a segment gone" else None)
    job = store / "synthetic"
    segs = segments.list_segments(job)[(1, 0)]
    path = segs[-1].path
    lines = path.read_bytes().split(b"\n")
    blocks = [i for i, line in enumerate(lines) if b'"type":"block"' in line]
    held = corrupt = 0
    if before == "a segment gone":
        held = segs[-2].path.read_bytes().count(b"\n")
        segs[-2].path.unlink()
        cut = 0  # (the segment after it torn at its first line)
    elif before == "a damaged line":
        k = blocks[len(blocks) // 2]
        lines[k] = lines[k][:40] + b"\0\0\0\0" + lines[k][44:]
        corrupt, cut = 1, k + 1
    else:
        k = blocks[0]
        del lines[k]  # (the stream's first block line gone)
        held, cut = 1, k
    data = b"\n".join(lines)
    torn = len(b"\n".join(lines[:cut])) + (1 if cut else 0) + 10
    path.write_bytes(data[:torn])
    by_workers(monkeypatch)
    monkeypatch.setattr(DirectoryReader, "PARALLEL_MIN_BYTES", 0)
    reader = open_source(str(store))
    try:
        assert sum(b.count() for b in reader.read_apart(1 << 12)) > 0 and reader.stats.workers == 2
        with path.open("ab") as f:  # (the write goes on)
            f.write(data[torn:])
        _polled_all(reader, None)
        stats = reader.stats
    finally:
        reader.close()
    assert (stats.missing_by_rank, stats.corrupt_by_rank) == ({1: held} if held else {}, {1: corrupt} if corrupt else {}), \
        stats.warnings
    gaps = [w for w in stats.warnings if "ring positions" in w]
    assert len(gaps) == (before == "its meta only"), stats.warnings
