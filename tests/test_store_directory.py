"""The directory store: layout, tailing, damaged files and job separation (no processes)."""

from __future__ import annotations

import errno
import os

import orjson
import pytest

from commscope import events as E
from commscope.store import StoreError, default_store, open_reader, open_writer
from commscope.store.directory import DirectoryReader, DirectoryWriter, list_jobs


def ev(rank: int, i: int, **kw) -> dict:
    return {"v": 1, "type": "op", "rank": rank, "ts": 1000 + i, "phase": "begin", "id": i, "op": "all_reduce",
            **kw}


def lines(*events: dict) -> list[bytes]:
    return [E.encode(e) for e in events]


def test_round_trip_layout_and_job_metadata(tmp_path):
    w0 = open_writer(tmp_path, "job-a", 0, {"world_size": 2})
    w1 = open_writer(tmp_path, "job-a", 1)
    w0.write(lines(ev(0, 1), ev(0, 2)))
    w1.write(lines(ev(1, 1)))
    assert (tmp_path / "LATEST").read_text().strip() == "job-a"
    assert sorted(os.listdir(tmp_path / "job-a")) == ["job.json", "rank-00000.jsonl", "rank-00001.jsonl"]
    reader = open_reader(tmp_path)
    got = reader.read_all()
    assert [(e["rank"], e["id"]) for e in got] == [(0, 1), (0, 2), (1, 1)]
    assert reader.job() == {"world_size": 2, "job": "job-a"}
    assert reader.stats.corrupt == 0 and reader.stats.events == 3
    assert list_jobs(tmp_path) == ["job-a"]


def test_tail_returns_only_complete_new_lines(tmp_path):
    w = DirectoryWriter(tmp_path, "j", 0)
    reader = DirectoryReader(tmp_path)
    assert reader.poll() == []
    w.write(lines(ev(0, 1)))
    assert [e["id"] for e in reader.poll()] == [1]
    assert reader.poll() == []
    path = tmp_path / "j" / "rank-00000.jsonl"
    whole = E.encode(ev(0, 2)) + b"\n"
    with open(path, "ab") as f:
        f.write(whole[:10])  # a writer caught mid-line
    assert reader.poll() == [] and reader.stats.partial_tail == 1
    with open(path, "ab") as f:
        f.write(whole[10:])
    assert [e["id"] for e in reader.poll()] == [2]
    assert reader.stats.corrupt == 0


def test_reader_waits_for_a_store_that_does_not_exist_yet(tmp_path):
    store = tmp_path / "later"
    with pytest.raises(StoreError, match="no trace store"):
        open_reader(store)
    reader = open_reader(store, wait=True)
    assert reader.poll() == [] and reader.job() is None
    open_writer(store, "j", 0).write(lines(ev(0, 1)))
    assert [e["id"] for e in reader.poll()] == [1]


def test_corrupt_lines_are_counted_and_skipped(tmp_path):
    job = tmp_path / "j"
    job.mkdir()
    good = [E.encode(ev(3, i)) for i in range(1, 5)]
    data = b"\n".join([good[0], b"{not json", good[1], b'{"type": "op"}', b"[1,", b"2]", good[2],
                       b'{"v": 99, "type": "meta", "rank": 3, "ts": 1}', good[3]]) + b"\n"
    (job / "rank-00003.jsonl").write_bytes(data)
    reader = open_reader(tmp_path)
    got = reader.read_all()
    assert [e["id"] for e in got] == [1, 2, 3, 4]
    assert reader.stats.corrupt == 3 and reader.stats.corrupt_by_rank == {3: 3}  # not JSON
    assert reader.stats.invalid == 2 and reader.stats.invalid_by_reason == {  # JSON, not an event
        "op: no ts": 1, "meta: unsupported schema version": 1}


def test_truncated_file_reports_its_torn_last_line(tmp_path):
    job = tmp_path / "j"
    job.mkdir()
    (job / "rank-00000.jsonl").write_bytes(E.encode(ev(0, 1)) + b"\n" + E.encode(ev(0, 2))[:-7])
    reader = open_reader(tmp_path)
    got = reader.read_all()
    assert [e["id"] for e in got] == [1]
    assert reader.stats.corrupt == 1
    assert any("truncated" in w for w in reader.stats.warnings)


def test_a_complete_last_line_without_newline_still_counts(tmp_path):
    job = tmp_path / "j"
    job.mkdir()
    (job / "rank-00000.jsonl").write_bytes(E.encode(ev(0, 1)) + b"\n" + E.encode(ev(0, 2)))
    reader = open_reader(tmp_path)
    assert [e["id"] for e in reader.read_all()] == [1, 2] and reader.stats.corrupt == 0


def test_shrunk_file_is_reread_with_a_warning(tmp_path):
    w = DirectoryWriter(tmp_path, "j", 0)
    w.write(lines(ev(0, 1), ev(0, 2)))
    reader = DirectoryReader(tmp_path)
    assert len(reader.poll()) == 2
    (tmp_path / "j" / "rank-00000.jsonl").write_bytes(E.encode(ev(0, 9)) + b"\n")
    assert [e["id"] for e in reader.poll()] == [9]
    assert any("shrank" in w for w in reader.stats.warnings)


def test_a_segment_read_with_the_size_its_read_gives_reads_as_one_asked_first(tmp_path, monkeypatch):
    """A segment the reader reads without asking its size first (an older segment of a
    stream that moved on, a whole read's) takes it from its read's fstat, never a stat of
    its path: what it read, and a segment cut short under it (read again from its start,
    said once).  (A file gone or not a regular file: the stat-then-read path, as before,
    ``test_open_files``.)"""
    real = os.path.getsize

    def no_stat(path):  # (the segments' sizes come from their reads)
        assert "rank-" not in os.fspath(path), path
        return real(path)

    monkeypatch.setattr(os.path, "getsize", no_stat)
    w = DirectoryWriter(tmp_path, "j", 0, segment_bytes=300)
    w.write(lines(*(ev(0, i) for i in range(1, 4))))
    reader = DirectoryReader(tmp_path)
    assert [e["id"] for e in reader.poll()] == [1, 2, 3]
    first = tmp_path / "j" / "rank-00000.jsonl"
    with open(first, "ab") as f:  # (more of it, then cut short under the reader)
        f.write(lines(ev(0, 4))[0] + b"\n")
    first.write_bytes(lines(ev(0, 8))[0] + b"\n")
    w.write(lines(*(ev(0, i) for i in range(10, 14))))  # (the stream moves on to its next segment)
    assert sorted((tmp_path / "j").glob("rank-00000.s*.jsonl"))
    assert [e["id"] for e in reader.poll()] == [8, 10, 11, 12, 13]
    assert sum("shrank" in x for x in reader.stats.warnings) == 1
    whole = DirectoryReader(tmp_path)
    assert [e["id"] for e in whole.read_all()] == [8, 10, 11, 12, 13] and not whole.stats.warnings


def test_new_job_never_mixes_with_an_old_one(tmp_path):
    old = [open_writer(tmp_path, "old", r) for r in range(4)]
    for r, w in enumerate(old):
        w.write(lines(ev(r, 1)))
    new = [open_writer(tmp_path, "new", r) for r in range(2)]
    for r, w in enumerate(new):
        w.write(lines(ev(r, 7)))
    got = open_reader(tmp_path).read_all()
    assert sorted((e["rank"], e["id"]) for e in got) == [(0, 7), (1, 7)]
    old_again = open_reader(tmp_path / "old").read_all()
    assert sorted(e["rank"] for e in old_again) == [0, 1, 2, 3]
    with pytest.raises(StoreError, match="refusing to mix jobs"):
        open_writer(tmp_path, "new", 1)


def test_disk_full_raises_store_error_and_leaves_no_torn_line(tmp_path, monkeypatch):
    w = DirectoryWriter(tmp_path, "j", 0)
    w.write(lines(ev(0, 1)))
    real_write = os.write
    calls = {"n": 0}

    def half_then_full(fd, data):
        calls["n"] += 1
        if calls["n"] == 1:
            return real_write(fd, bytes(data[: len(data) // 2 + 3]))
        raise OSError(errno.ENOSPC, "No space left on device")

    batch = lines(ev(0, 2), ev(0, 3), ev(0, 4))
    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(StoreError, match="No space left") as info:
        w.write(batch)
    monkeypatch.setattr(os, "write", real_write)
    assert info.value.written == 1  # one whole line landed before the disk filled
    w.write(batch[info.value.written:])  # what a retry sends
    reader = open_reader(tmp_path)
    got = reader.read_all()
    assert [e["id"] for e in got] == [1, 2, 3, 4]
    # (the torn copy of event 3 was cut off: left, it read as a damaged line, a loss counted
    # of a line the retry wrote whole, and check said ERROR trace_incomplete: helper-166)
    assert reader.stats.corrupt == 0 and not reader.stats.warnings
    assert w.path.read_bytes().count(b"\n") == 4


def test_dev_full_is_a_store_error(tmp_path):
    w = DirectoryWriter(tmp_path, "j", 0)
    os.close(w._fd)
    w._fd = os.open("/dev/full", os.O_WRONLY)
    with pytest.raises(StoreError) as info:
        w.write(lines(ev(0, 1)))
    assert info.value.written == 0
    w.close()


def test_default_store_follows_env(monkeypatch):
    monkeypatch.delenv("COMMSCOPE_STORE", raising=False)
    assert default_store(None) == "./commscope-trace"
    monkeypatch.setenv("COMMSCOPE_STORE", "/x/y")
    assert default_store(None) == "/x/y"
    assert default_store("/given") == "/given"


def test_decode_lines_never_glues_two_broken_lines_into_one_event():
    a = b'{"v":1,"type":"op","rank":0,"ts":1,"phase":"begin","id":1,"x":[1'
    b = b'2]}'
    got = E.decode_lines(a + b"\n" + b + b"\n")
    assert got.events == [] and got.damaged == 2 and not got.invalid


@pytest.mark.parametrize("event, problem", [
    ({"type": "nope", "rank": 0, "ts": 1}, "unknown event type"),
    ({"type": "op", "ts": 1, "phase": "begin", "id": 1}, "op: no rank"),
    ({"type": "op", "rank": 0, "ts": 1, "phase": "middle", "id": 1}, "bad phase"),
    ({"type": "meta", "rank": 0, "ts": 1, "v": E.SCHEMA_VERSION + 1}, "unsupported schema version"),
    ([1, 2], "not an object"),
    ({"type": "sample", "rank": 0, "ts": 1, "rss": "x"}, "sample: bad rss"),
    ({"type": "dropped", "rank": 0, "ts": 1, "count": None}, "dropped: bad count"),
])
def test_event_validation_names_the_problem(event, problem):
    with pytest.raises(E.TraceFormatError, match=problem):
        E.decode(orjson.dumps(event))


def test_a_listing_takes_regular_files_and_symlinks_to_them_and_refuses_the_rest(tmp_path):
    """``DirectoryReader.streams`` reads a file's kind from its directory entry (no stat per
    file of a 16k-rank job) and keeps what each name means: a regular segment and a symlink
    to one are streams, a dangling symlink is skipped without a word, a FIFO is refused with
    a warning once; a name that changes kind between listings is judged again."""
    w = open_writer(tmp_path, "job", 0)
    w.write(lines(ev(0, 1)))
    job = tmp_path / "job"
    os.symlink(job / "rank-00000.jsonl", job / "rank-00001.jsonl")
    os.symlink(job / "nowhere.jsonl", job / "rank-00002.jsonl")
    os.mkfifo(job / "rank-00003.jsonl")
    reader = open_reader(tmp_path)
    assert [s for s, _ in reader.streams().items()] == [(0, 0), (1, 0)]
    assert reader.stats.warnings == ["rank-00003.jsonl is not a regular file; skipped"]
    os.unlink(job / "rank-00001.jsonl")
    os.mkfifo(job / "rank-00001.jsonl")
    (job / "nowhere.jsonl").write_bytes(b"")
    reader._listed = None  # (listed again: the directory changed)
    assert [s for s, _ in reader.streams().items()] == [(0, 0), (2, 0)]
    assert reader.stats.warnings[1:] == ["rank-00001.jsonl is not a regular file; skipped"]


def test_a_poll_reads_only_the_streams_that_grew_and_counts_the_rest_read(tmp_path, monkeypatch):
    """Streams read to their end cost a poll one stat each and are not read again (16k of
    them, most with nothing new, are a live console's every poll), yet each counts as read
    up to when the poll began: the watermark moves on.  A stream that grew, one whose file
    shrank, one that moved to a new segment and one with a torn last line are read as
    before."""
    writers = [DirectoryWriter(tmp_path, "j", r, segment_bytes=400) for r in range(8)]
    for r, w in enumerate(writers):
        w.write(lines(ev(r, 1)))
    reader = DirectoryReader(tmp_path)
    assert len(reader.poll()) == 8
    first = reader.watermark_ns()
    assert first
    read: list[int] = []
    real = DirectoryReader._read_stream
    monkeypatch.setattr(DirectoryReader, "_read_stream",
                        lambda self, stream, *a, **k: read.append(stream[0]) or real(self, stream, *a, **k))
    assert reader.poll() == [] and read == []
    assert reader.watermark_ns() > first
    writers[3].write(lines(ev(3, 2)))
    assert [(e["rank"], e["id"]) for e in reader.poll()] == [(3, 2)] and read == [3]
    read.clear()
    writers[5].write(lines(*(ev(5, i) for i in range(2, 8))))  # past 400 bytes: the next write starts segment 1
    writers[5].write(lines(ev(5, 8)))
    assert len(list((tmp_path / "j").glob("rank-00005.s000001.*.jsonl"))) == 1
    assert [e["id"] for e in reader.poll()] == [2, 3, 4, 5, 6, 7, 8] and read == [5]
    read.clear()
    (tmp_path / "j" / "rank-00001.jsonl").write_bytes(b"")
    assert reader.poll() == [] and read == [1]
    read.clear()
    assert reader.poll() == [] and read == []  # (said once: it is read from its new size on)
    assert sum("rank 1: rank-00001.jsonl shrank" in w for w in reader.stats.warnings) == 1
    whole = E.encode(ev(6, 2)) + b"\n"
    with open(tmp_path / "j" / "rank-00006.jsonl", "ab") as f:
        f.write(whole[:10])
    assert reader.poll() == [] and read == [6] and reader.stats.partial_tail == 1
    read.clear()
    assert reader.poll() == [] and read == [6]  # (a torn line: the stream is looked at until it is whole)
    with open(tmp_path / "j" / "rank-00006.jsonl", "ab") as f:
        f.write(whole[10:])
    assert [e["id"] for e in reader.poll()] == [2] and reader.stats.partial_tail == 0
    read.clear()
    assert reader.poll() == [] and read == []
