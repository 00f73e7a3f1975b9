"""Keyframes: a window starts inside a segment, at what its rank was in there.

A segment holds ~93 minutes of a rank at 25 ops a second; a window of the last minutes
(``--since``, a console's restart at the tail) read from the segment's start.  A keeper
beside the writers appends a keyframe every few seconds (``store/keyframes.py``); a reader
starts each stream at the newest one before its window, and finds what a full read finds:
a rank dead for an hour, a hang that began before the window, every line counted.
"""

from __future__ import annotations

import os
import struct
import time
from pathlib import Path

import orjson
import pytest
from readers import by_workers

from commscope.analysis.diagnose import default_hang_after, diagnose, trace_now
from commscope.analysis.source import load_trace
from commscope.bench.synthstore import JobShape, write_store
from commscope.store import children, keyframes, retention
from commscope.store.directory import DirectoryReader, DirectoryWriter
from commscope.store.keyframes import FOOTER, Keyframe, at_or_before, keys_path, record
from commscope.store.segments import list_segments
from commscope.window import Since

S = 1_000_000_000
T0 = 1_780_000_000 * S


def _findings(model) -> list[dict]:
    return [f.to_json() for f in diagnose(model, trace_now(model), default_hang_after(model))]


def _week(tmp_path: Path, fault: str, **kw) -> tuple[str, JobShape]:
    """A week of 8 ranks in one segment each, the fault an hour before the end, keyframes
    every 5 s of the job's time (as its keeper would have written them)."""
    store = str(tmp_path / "trace")
    shape = JobShape(8, 6000, fault=fault, days=7, tail_s=3600, hang_after=10.0, keyframe_s=5.0, **kw)
    write_store(store, shape)
    return store, shape


@pytest.mark.parametrize("workers", [False, True])
@pytest.mark.parametrize("fault", ["dead", "missing", "mismatch"])
def test_a_window_starts_at_a_keyframe_and_finds_what_a_full_read_finds(tmp_path, monkeypatch, fault, workers):
    """--since 30m of a week in one segment a stream reads ~1/200 of it, from each stream's
    newest keyframe before the window; findings, evidence and culprit as a full read's, no
    victim blamed, no line lost.  Without its keyframes the same window reads the whole
    segment (what it did before).  ``workers``: read apart, each worker finding its streams'
    keyframes itself."""
    store, shape = _week(tmp_path, fault)
    job = Path(store) / "synthetic"
    assert len(list_segments(job)[(0, 0)]) == 1 and len(list(job.glob("*.keys.*.bin"))) == 8
    if workers:
        monkeypatch.setattr(DirectoryReader, "PARALLEL_MIN_BYTES", 0)
        by_workers(monkeypatch)
    full, fr, _ = load_trace(store)
    part, pr, warnings = load_trace(store, since=Since(ago_s=1800))
    assert pr.stats.bytes < fr.stats.bytes / 100
    assert pr.stats.bytes + pr.stats.skipped_bytes == fr.stats.bytes  # (every byte read or skipped)
    assert any("not read" in w for w in warnings)
    assert not pr.stats.missing_by_rank and not fr.stats.missing_by_rank
    assert _findings(part) == _findings(full)
    errors = [(f["kind"], f["culprits"]) for f in _findings(part) if f["severity"] == "error"]
    assert errors == [({"dead": "dead_rank", "missing": "missing_ranks", "mismatch": "collective_mismatch"}[fault],
                       [shape.culprit_rank])]
    for p in job.glob("*.keys.*.bin"):
        p.unlink()
    whole, wr, _ = load_trace(store, since=Since(ago_s=1800))
    assert wr.stats.bytes == fr.stats.bytes and _findings(whole) == _findings(full)


@pytest.mark.parametrize("workers", [False, True])
def test_a_window_s_ranks_stay_in_time_order_with_their_carries(tmp_path, monkeypatch, workers):
    """Each stream's carry (its ops in flight and each group's last op, as JSON op events,
    older than the records after it) is taken before its rank's records: the ranks of a
    window of the last minute stay in time order (one block's columns, painted all at once),
    where before every rank of a window turned out of order for good (its own sort buffers;
    a heatmap painted rank by rank: ~1.6 s a frame at 16k ranks).  The culprit as a whole
    read's."""
    from commscope.analysis import rankstate
    from commscope.analysis.model import TraceModel
    from commscope.analysis.source import open_source
    from commscope.tui import painter
    from commscope.tui.feed import Feed

    store = str(tmp_path / "trace")
    shape = JobShape(8, 6000, fault="missing", rate=50.0, hang_after=10.0, keyframe_s=5.0)  # (2 min, native)
    write_store(store, shape)
    full, _, _ = load_trace(store)
    for where, _, names in os.walk(store):  # (dated to the job's end: a window counts back from the newest write)
        for name in names:
            os.utime(os.path.join(where, name), ns=(full.end_ns, full.end_ns))
    if workers:
        monkeypatch.setattr(DirectoryReader, "PARALLEL_MIN_BYTES", 0)
        by_workers(monkeypatch)
    reader = open_source(store, since=Since(ago_s=60))
    part = TraceModel()  # (as a console reads a window: its first read, then polls)
    for batch in reader.read_apart(Feed.BUDGET):
        part.ingest(batch.events, batch.ops, batch.spans, batch.beats)
    while (batch := reader.poll_batch(Feed.BUDGET)).count():
        part.ingest(batch.events, batch.ops, batch.spans, batch.beats)
    assert reader.stats.skipped_bytes > 0 and part.total_ops() < full.total_ops()
    t = part.table
    assert t.size == 8 and t.ordered[:t.size].all()
    now = part.end_ns
    view = part.view(now, rankstate.rank_states(part, now))
    assert painter._ranked(view, view.rank_ids()).ordered.all()
    errors = [(f["kind"], f["culprits"]) for f in _findings(part) if f["severity"] == "error"]
    assert errors == [(f["kind"], f["culprits"]) for f in _findings(full) if f["severity"] == "error"] == [
        ("missing_ranks", [shape.culprit_rank])]


def test_a_window_from_a_keyframe_counts_the_lines_before_it_as_accounted_for(tmp_path):
    """A reader starting at a keyframe takes the stream's lines before it as accounted for
    (what a ``store_lost`` marker read later is counted against): those it then reads make
    the stream's every line, as they do for a reader from the start."""
    store, _ = _week(tmp_path, "missing")
    job = Path(store) / "synthetic"
    reader = DirectoryReader(job, since_ns=None)
    reader.start_at(Since(ago_s=600))
    reader.read_all()
    whole = DirectoryReader(job)
    whole.read_all()
    for r in range(8):
        lines = (job / f"rank-{r:05d}.jsonl").read_bytes().count(b"\n")
        assert reader._lines_read[(r, 0)] == whole._lines_read[(r, 0)] == lines
        assert reader._read_of[((r, 0), 0)] == whole._read_of[((r, 0), 0)]
    assert reader.stats.skipped_bytes > 0.99 * whole.stats.bytes


def test_a_restart_of_a_window_reads_again_only_from_its_keyframes(tmp_path):
    """``read_again``: one segment a stream, so without keyframes any later window reads
    again all a window read (a console past its budget could not restart); with them, a
    window 100 s later reads again what the last 85 s of ops hold of the window's 185."""
    store = str(tmp_path / "trace")
    write_store(store, JobShape(8, 6000, fault="missing", hang_after=10.0, keyframe_s=5.0))  # (240 s of ops)
    job = Path(store) / "synthetic"
    end = load_trace(store)[0].end_ns
    reader = DirectoryReader(job)
    reader.start_at(Since(at_ns=end - 200 * S))
    again = reader.read_again(Since(at_ns=end - 100 * S))
    assert again == pytest.approx(85 / 185, abs=0.05)
    assert reader.read_again(Since(at_ns=end - 200 * S)) == 1.0
    for p in job.glob("*.keys.*.bin"):
        p.unlink()
    bare = DirectoryReader(job)
    bare.start_at(Since(at_ns=end - 200 * S))
    assert bare.read_again(Since(at_ns=end - 100 * S)) == 1.0


def _kf(offset: int, last_ns: int, carry: bytes = b'{"type":"meta"}\n') -> Keyframe:
    return Keyframe(offset, 7, offset // 10, last_ns, carry)


def test_a_keyframe_file_is_read_from_its_end_and_a_damaged_end_trusts_nothing(tmp_path):
    path = tmp_path / "rank-00000.keys.000000.bin"
    frames = [_kf(1000 * k, T0 + k * 5 * S, b'{"k":%d}\n' % k) for k in range(1, 6)]
    path.write_bytes(b"".join(map(record, frames)))
    assert at_or_before(path, T0) is None  # (a window before the first: from the segment's start)
    assert at_or_before(path, T0 + 5 * S) is None  # (its lines before it are not all older)
    assert at_or_before(path, T0 + 5 * S + 1) == frames[0]
    assert at_or_before(path, T0 + 17 * S) == frames[2]
    assert at_or_before(path, T0 + 3600 * S) == frames[4]
    assert at_or_before(path, T0 + 3600 * S, segment_size=4999) is None  # (a segment smaller than it)
    assert at_or_before(tmp_path / "none.bin", T0 + 3600 * S) is None
    data = path.read_bytes()
    path.write_bytes(data[:-3])  # torn: a keeper killed mid-write
    assert at_or_before(path, T0 + 3600 * S) is None
    bad = bytearray(data)
    bad[-FOOTER.size - 2] ^= 1  # a carry's byte flipped: its CRC says so
    path.write_bytes(bytes(bad))
    assert at_or_before(path, T0 + 3600 * S) is None
    assert at_or_before(path, T0 + 17 * S) == frames[2]  # (those before it stand)
    huge = struct.pack("<4sIQQQqI", b"CSK1", 1 << 30, 0, 0, 0, 0, 0)
    path.write_bytes(data + huge)
    assert at_or_before(path, T0 + 17 * S) is None  # (nothing past a damaged record is found either)


def test_a_window_hours_back_walks_the_file_a_chunk_at_a_time(tmp_path):
    """A window hours back walks thousands of footers: read back ``WALK_CHUNK`` at a time (a
    carry across two chunks read whole), each keyframe found where its time says."""
    path = tmp_path / "rank-00000.keys.000000.bin"
    frames = [_kf(1000 * k, T0 + k * 2 * S, b'{"k":%d,"pad":"%s"}\n' % (k, b"x" * (300 + k % 500)))
              for k in range(1, 3001)]
    path.write_bytes(b"".join(map(record, frames)))
    assert path.stat().st_size > 20 * keyframes.WALK_CHUNK
    for k in [*range(1, 3001, 7), 3000]:  # (some of them a carry across two chunks)
        assert at_or_before(path, T0 + k * 2 * S + 1) == frames[k - 1]
    assert at_or_before(path, T0 + 2 * S) is None


def test_a_keyframe_file_s_name_is_spelled_one_way():
    assert keyframes.parse_keys("rank-00003.keys.000004.bin") == ((3, 0), 4)
    assert keyframes.parse_keys("rank-00003+2.keys.000004.bin") == ((3, 2), 4)
    for name in ("rank-3.keys.000004.bin", "rank-00003.keys.0000004.bin", "rank-00003.keys.000004.jsonl",
                 "rank-00003.jsonl"):
        assert keyframes.parse_keys(name) is None


def test_retention_deletes_a_segment_s_keyframes_with_it(tmp_path):
    store, _ = _week(tmp_path, "missing", segment_bytes=512 << 10)
    job = Path(store) / "synthetic"
    segs = list_segments(job)[(0, 0)]
    assert len(segs) > 4 and all(keys_path(job, (0, 0), s.number).exists() for s in segs)
    retention.close_stream(job, 0, 0, retention.parse("1MiB"))
    left = list_segments(job)[(0, 0)]
    assert 1 < len(left) < len(segs)
    assert sorted(p.name for p in job.glob("rank-00000.keys.*.bin")) == [
        keys_path(job, (0, 0), s.number).name for s in left]


def _line(k: int, rank: int = 0) -> bytes:
    return orjson.dumps({"type": "heartbeat", "ts": T0 + k * S // 10, "v": 3, "rank": rank, "inflight": k,
                         "pad": "x" * 200})


def _meta(rank: int = 0) -> bytes:
    return orjson.dumps({"type": "meta", "ts": T0, "v": 3, "rank": rank, "world_size": 1, "host": "h",
                         "sample_interval": 1.0})


def test_a_writer_s_keeper_writes_keyframes_beside_it_and_ends_with_it(tmp_path, monkeypatch):
    """The real child: a writer whose segment passed ``FOLLOW_AFTER`` names it to its
    process's keeper, which appends keyframes as the stream grows, into the next segment
    too, and ends once the writer closed.  A window from the newest keyframe reads from it
    and gets every event after it.  (Every 0.2 s: a segment here lives about a second.)"""
    monkeypatch.setenv(keyframes.ENV_EVERY, "0.2")
    w = DirectoryWriter(tmp_path, "job", 0, {"world_size": 1}, segment_bytes=256 << 10)
    w.write([_meta()])
    keeper = None
    k = 0
    deadline = time.monotonic() + 120  # (a bound for a failure, not a margin: met in seconds)
    job = tmp_path / "job"
    while time.monotonic() < deadline:
        w.write([_line(j) for j in range(k, k + 20)])
        k += 20
        keeper = w._keeper
        segs = list_segments(job)[(0, 0)]
        if len(segs) >= 2 and keys_path(job, (0, 0), segs[-1].number).exists() and \
                keys_path(job, (0, 0), segs[0].number).exists():
            break
        time.sleep(0.02)
    assert keeper is not None
    child = keeper._child
    assert child is not None and child.poll() is None
    segs = list_segments(job)[(0, 0)]
    newest = segs[-1]
    key = at_or_before(keys_path(job, (0, 0), newest.number), T0 + 10 ** 12 * S)
    assert key is not None and 0 < key.offset <= os.path.getsize(newest.path) - keyframes.MIN_BYTES
    w.close()
    assert child.wait(60) == 0  # (its commands ended with the last writer of its process)
    head = newest.path.read_bytes()[:key.offset]
    reader = DirectoryReader(job, since_ns=key.last_ns + 1)
    events = reader.read_all()
    beats = [e["inflight"] for e in events if e["type"] == "heartbeat"]
    first = orjson.loads(newest.path.read_bytes()[key.offset:].split(b"\n", 1)[0])["inflight"]
    assert beats == list(range(first, k))
    assert reader.stats.skipped_bytes == sum(os.path.getsize(s.path) for s in segs[:-1]) + len(head)
    assert reader._lines_read[(0, 0)] == k + len(segs)  # (its metas and every heartbeat: none lost)


def test_a_process_writing_stream_after_stream_starts_one_keeper(tmp_path, monkeypatch):
    """``commscope copy`` and a synthetic store write one rank after another: each writer's
    stream passes ``FOLLOW_AFTER`` and closes.  The process's keeper stays for the next
    writer (told each closed stream is done) and ends ``LINGER_S`` after the last; before,
    each close ended it and the next writer started another (256 ranks: 256 children)."""
    import threading

    monkeypatch.setenv(keyframes.ENV_EVERY, "0.2")
    children_seen = []
    threads = threading.active_count()
    for rank in range(3):
        w = DirectoryWriter(tmp_path, "job", rank, {"world_size": 3})
        w.write([_meta(rank)])
        k = 0
        while w._keeper is None:  # (past FOLLOW_AFTER: a few hundred lines)
            w.write([_line(j, rank) for j in range(k, k + 50)])
            k += 50
        children_seen.append(w._keeper._child)
        w.close()
    assert children_seen[0] is not None and children_seen[0].poll() is None
    assert children_seen[1:] == children_seen[:1] * 2
    # (no thread waits for it: one a closed writer, living LINGER_S, made this process's
    # readers start their workers afresh, not forked; CI at cb7a9b6)
    assert threading.active_count() == threads
    assert children_seen[0].wait(60) == 0  # (no writer came: it ended by itself)


def test_a_keepers_end_line_names_its_stream_and_nothing_else():
    assert children.ended(children.end_line((3, 1))) == (3, 1)
    assert children.ended(b"3 1 end") == (3, 1)
    for line in (b"3 1\n", b"3 1 4 rank-00003+1.s000004.t1.jsonl\n", b"03 1 end\n", b"3 1 end x\n", b"-3 1 end\n"):
        assert children.ended(line) is None, line
    assert keyframes._named(children.end_line((3, 1))) is None


@pytest.mark.parametrize(("text", "want"), [("", keyframes.EVERY_S), ("2.5", 2.5), ("0", None), ("off", None),
                                            ("OFF", None)])
def test_keyframes_every_so_many_seconds_or_none(monkeypatch, text, want):
    monkeypatch.setenv(keyframes.ENV_EVERY, text)
    assert keyframes.every_s_from_env() == want


@pytest.mark.parametrize("text", ["abc", "-1", "inf", "nan"])
def test_a_keyframe_interval_that_cannot_be_read_takes_the_default_and_says_so(monkeypatch, text):
    monkeypatch.setenv(keyframes.ENV_EVERY, text)
    with pytest.warns(RuntimeWarning, match="cannot be read"):
        assert keyframes.every_s_from_env() == keyframes.EVERY_S


def test_run_keyframes_reaches_the_ranks_and_a_bad_value_is_a_usage_error():
    """``commscope run --keyframes``: as ``--retain``, checked before the command runs and set
    for its ranks."""
    import argparse

    from commscope.commands.run import build_env
    from commscope.errors import UsageError

    args = argparse.Namespace(store="t", hang_after=None, job=None, sample_interval=None, no_flight_recorder=False,
                              keyframes="off")
    assert build_env(args, base={})[keyframes.ENV_EVERY] == "off"
    args.keyframes = "0.5"
    assert build_env(args, base={})[keyframes.ENV_EVERY] == "0.5"
    args.keyframes = None
    assert keyframes.ENV_EVERY not in build_env(args, base={})
    args.keyframes = "soon"
    with pytest.raises(UsageError, match="--keyframes: 'soon' cannot be read: give seconds above 0"):
        build_env(args, base={})
    args.keyframes, args.retain = None, "bogus"  # (--retain, read by the same table)
    with pytest.raises(UsageError, match="--retain: cannot read 'bogus'"):
        build_env(args, base={})
    args.retain = "2GiB"
    assert build_env(args, base={})["COMMSCOPE_RETAIN"] == "2GiB"


def test_a_writer_with_keyframes_off_starts_no_keeper(tmp_path, monkeypatch):
    monkeypatch.setenv(keyframes.ENV_EVERY, "off")
    w = DirectoryWriter(tmp_path, "job", 0, {"world_size": 1})
    w.write([_meta()])
    w.write([_line(j) for j in range(4 * keyframes.FOLLOW_AFTER // 200)])
    assert w._keeper is None
    w.close()


def _grow(path: Path, k0: int, n: int) -> int:
    with open(path, "ab") as f:
        f.write(b"".join(_line(j) + b"\n" for j in range(k0, k0 + n)))
    return k0 + n


def _followed(tmp_path: Path, beats: int) -> tuple[Path, Path, keyframes._Followed, int]:
    """A job directory whose rank 0 wrote its meta and ``beats`` heartbeats, followed by a
    keeper's step (a keyframe kept there, appended once the segment grows past it): the
    directory, the segment, what the keeper follows, the next heartbeat."""
    job = tmp_path / "job"
    job.mkdir()
    seg = job / "rank-00000.jsonl"
    seg.write_bytes(_meta() + b"\n")
    k = _grow(seg, 0, beats)
    f = keyframes._Followed((0, 0), 0, seg)
    keyframes.step(f, job, now=0.0)
    return job, seg, f, k


def test_the_keeper_stops_following_a_file_written_again_under_its_name(tmp_path):
    """A segment deleted and made again (its writer found its store gone) is another file:
    the keeper stops at it, rather than replaying the new lines onto the old ones' state
    (its keyframes' offsets would fall anywhere in the new file)."""
    seg = tmp_path / "rank-00000.jsonl"
    seg.write_bytes(_meta() + b"\n")
    k = _grow(seg, 0, 200)
    f = keyframes._Followed((0, 0), 0, seg)
    assert keyframes.step(f, tmp_path, now=0.0) and f.pending is not None
    k = _grow(seg, k, 100)
    assert keyframes.step(f, tmp_path, now=10.0)  # (the one kept appended: the segment grew past it)
    path = keys_path(tmp_path, (0, 0), 0)
    written = path.read_bytes()
    assert at_or_before(path, T0 + 10 ** 6 * S) is not None
    seg.unlink()  # (made again at once: on ext4 it often gets the same inode back)
    seg.write_bytes(b'{"type":"dropped","reason":"store_lost: gone"}\n' + _meta() + b"\n")
    _grow(seg, 0, 600)
    assert not keyframes.step(f, tmp_path, now=20.0)
    assert path.read_bytes() == written


def test_a_reader_takes_no_keyframe_of_a_segment_that_starts_again(tmp_path):
    """A segment its writer started again after a loss begins with its ``store_lost`` marker,
    not the rank's meta: a window reads it from its start, marker and all, whatever
    keyframes lie beside it (the old file's)."""
    job, seg, f, k = _followed(tmp_path, 300)
    _grow(seg, k, 100)
    keyframes.step(f, job, now=10.0)
    key = at_or_before(keys_path(job, (0, 0), 0), T0 + 10 ** 6 * S)
    assert key is not None
    reader = DirectoryReader(job, since_ns=key.last_ns + 1)
    reader.read_all()
    assert reader.stats.skipped_bytes == key.offset  # (from the keyframe)
    lost = orjson.dumps({"type": "dropped", "v": 3, "rank": 0, "ts": T0, "count": 0, "entries": 401,
                         "reason": "store_lost: the job directory was deleted"})
    seg.unlink()
    seg.write_bytes(lost + b"\n" + _meta() + b"\n" + b"".join(_line(j) + b"\n" for j in range(500, 900)))
    again = DirectoryReader(job, since_ns=key.last_ns + 1)
    events = again.read_all()
    assert again.stats.skipped_bytes == 0
    assert [e["inflight"] for e in events if e["type"] == "heartbeat"] == list(range(500, 900))


def _stack(k: int) -> bytes:
    frames = [["/job/train.py", i, f"f{i}"] for i in range(150)]  # (~4.5 KB of frames after its ts)
    return orjson.dumps({"type": "stack", "ts": T0 + k * S // 10, "v": 3, "rank": 0, "reason": "request",
                         "threads": [{"tid": 1, "name": "MainThread", "frames": frames}]})


def test_a_keyframe_after_a_long_last_line_says_that_line_s_time(tmp_path):
    """A keyframe's time is the newest of every line before it, not of its last few KiB: the
    writer's last line there a stack of many frames (or a busy tick's block), its ``ts`` at
    its head.  Before, the keyframe kept the time of the one before, and a window from after
    it skipped lines of its own (helper-149)."""
    job, seg, f, k = _followed(tmp_path, 100)
    k = _grow(seg, k, 100)
    with open(seg, "ab") as out:
        out.write(_stack(k) + b"\n")
    assert len(_stack(k)) > 4096
    keyframes.step(f, job, now=10.0)
    assert f.pending is not None and f.pending.last_ns == T0 + k * S // 10
    _grow(seg, k + 1, 100)
    keyframes.step(f, job, now=20.0)
    since = T0 + 150 * S // 10  # (after the first keyframe, before the second's lines end)
    key = at_or_before(keys_path(job, (0, 0), 0), since)
    assert key is not None and key.last_ns < since
    beats = {e["inflight"] for e in DirectoryReader(job, since_ns=since).read_all() if e["type"] == "heartbeat"}
    assert set(range(150, 301)) - {200} <= beats


def test_a_line_longer_than_a_step_s_read_is_replayed_whole(tmp_path, monkeypatch):
    """A line past ``READ_BYTES`` (a stack of thousands of frames) is read whole by the step
    that meets it; before, the keeper read the same bytes each step and never went on."""
    monkeypatch.setattr(keyframes, "READ_BYTES", 4096)
    seg = tmp_path / "rank-00000.jsonl"
    seg.write_bytes(_meta() + b"\n")
    f = keyframes._Followed((0, 0), 0, seg)
    k = _grow(seg, 0, 10)
    with open(seg, "ab") as out:
        out.write(_stack(k) * 2 + b"\n")  # (one line of ~9 KB: not JSON, as a damaged one would be)
    _grow(seg, k, 40)
    size = seg.stat().st_size
    for t in range(1, 20):
        keyframes.step(f, tmp_path, now=float(t))
    assert f.offset == size


def test_a_keyframe_past_its_segment_s_end_is_not_taken(tmp_path):
    """Keyframes beside a segment that is shorter than their offsets (another file under its
    name, begun with a meta line) are another file's: a window reads it from its start."""
    job, seg, f, k = _followed(tmp_path, 300)
    _grow(seg, k, 100)
    keyframes.step(f, job, now=10.0)
    key = at_or_before(keys_path(job, (0, 0), 0), T0 + 10 ** 6 * S)
    assert key is not None
    seg.write_bytes(_meta() + b"\n" + b"".join(_line(j) + b"\n" for j in range(900, 950)))
    assert seg.stat().st_size < key.offset
    reader = DirectoryReader(job, since_ns=key.last_ns + 1)
    beats = [e["inflight"] for e in reader.read_all() if e["type"] == "heartbeat"]
    assert beats == list(range(900, 950)) and reader.stats.skipped_bytes == 0


_KILLED_WRITER = """
import os, sys, time, orjson
sys.path.insert(0, {tests!r})
from test_keyframes import _line, _meta
from commscope.store.directory import DirectoryWriter
w = DirectoryWriter({root!r}, "job", 0, {{"world_size": 1}})
w.write([_meta()])
k = 0
while w._keeper is None or w._keeper._child is None:
    w.write([_line(j) for j in range(k, k + 20)])
    k += 20
print(w._keeper._child.pid, flush=True)
while True:
    w.write([_line(j) for j in range(k, k + 20)])
    k += 20
    time.sleep(0.01)
"""


def test_a_keeper_ends_when_its_writing_process_is_killed(tmp_path):
    """A rank killed (SIGKILL: no ``close``) leaves no keeper behind: its commands end with the
    process (the pipe's last writer gone), and it exits, whatever it was doing."""
    import signal
    import subprocess
    import sys

    import psutil

    code = _KILLED_WRITER.format(tests=str(Path(__file__).parent), root=str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        pid = int(proc.stdout.readline())
        keeper = psutil.Process(pid)
        deadline = time.monotonic() + 60  # (just started, through ``nice``, it can read empty)
        while "commscope.store.keyframes" not in " ".join(keeper.cmdline()):
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(60)
    deadline = time.monotonic() + 60  # (a bound for a failure: it ends within a second)
    while _alive(keeper) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(keeper)


def _alive(proc) -> bool:
    """Running, and not a zombie (ended, not yet reaped by whoever adopted it)."""
    import psutil

    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_keeper_that_died_is_started_again_and_told_every_stream(tmp_path, monkeypatch):
    """A keeper killed while its writers write (out of memory, by hand) is started again by
    the next writer that looks (``CHECK_S``, at most every ``RESPAWN_S``), told each stream's
    segment, and keyframes go on."""
    import signal

    monkeypatch.setenv(keyframes.ENV_EVERY, "0.2")
    monkeypatch.setattr(keyframes, "CHECK_S", 0.0)
    monkeypatch.setattr(children.Keeper, "RESPAWN_S", 0.0)
    job = tmp_path / "job"
    writers = [DirectoryWriter(tmp_path, "job", r, {"world_size": 2}) for r in range(2)]
    for r, w in enumerate(writers):
        w.write([_meta(r)])
    k = 0

    def keyframes_of(r: int) -> int:
        path = keys_path(job, (r, 0), 0)
        return len(path.read_bytes()) if path.exists() else 0

    def write_until(done) -> None:
        nonlocal k
        deadline = time.monotonic() + 120  # (a bound for a failure, not a margin: met in seconds)
        while not done() and time.monotonic() < deadline:
            for r, w in enumerate(writers):
                w.write([_line(j, r) for j in range(k, k + 20)])
            k += 20
            time.sleep(0.02)
        assert done()

    write_until(lambda: all(keyframes_of(r) for r in range(2)))
    keeper = writers[0]._keeper
    assert keeper is not None and keeper is writers[1]._keeper and keeper._child is not None
    first = keeper._child
    first.send_signal(signal.SIGKILL)
    first.wait(60)
    had = [keyframes_of(r) for r in range(2)]
    write_until(lambda: keeper._child is not first and all(keyframes_of(r) > had[r] for r in range(2)))
    second = keeper._child
    for w in writers:
        w.close()
    assert second is not None and second.wait(60) == 0  # (``LINGER_S`` after the last writer closed)
