"""A directory reader holds its streams' newest files open between polls (``files.OpenFiles``):
it reads what a reader that opens each file every time reads, through replacements,
truncations, rotations and deletions, and lets go of what it no longer reads."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import orjson

from commscope import events as E
from commscope.store.directory import DirectoryReader, DirectoryWriter
from commscope.store.files import OpenFiles


def ev(rank: int, i: int) -> dict:
    return {"v": 1, "type": "op", "rank": rank, "ts": 1000 + i, "phase": "begin", "id": i, "op": "all_reduce"}


def lines(rank: int, ids: range) -> list[bytes]:
    return [E.encode(ev(rank, i)) for i in ids]


def open_fds() -> set[int]:
    return {int(n) for n in os.listdir("/proc/self/fd")}


def holding_none(path) -> DirectoryReader:
    r = DirectoryReader(path)
    r._room_asked = 1 << 30  # (never asks for room: holds nothing, opens each file for each read)
    return r


def test_a_reader_holding_its_files_reads_what_one_holding_none_reads(tmp_path):
    writers = [DirectoryWriter(tmp_path, "j", r, segment_bytes=600) for r in range(5)]
    job = tmp_path / "j"
    held, plain = DirectoryReader(tmp_path), holding_none(tmp_path)
    seen: list[list[tuple]] = []

    def both() -> None:
        got = [[(e["rank"], e.get("id"), e["type"]) for e in r.poll()] for r in (held, plain)]
        assert got[0] == got[1]
        assert held.stats.warnings == plain.stats.warnings
        assert held.stats.events == plain.stats.events and held.stats.corrupt == plain.stats.corrupt
        seen.append(got[0])

    for r, w in enumerate(writers):
        w.write(lines(r, range(1, 3)))
    both()
    both()  # (read to their ends: the holding reader opens each one now)
    assert len(held._files) == 5 and len(plain._files) == 0
    writers[0].write(lines(0, range(3, 5)))
    both()
    assert seen[-1] == [(0, 3, "op"), (0, 4, "op")]
    # a file written again under its name (an atomic replace: another inode), longer than what was read
    path = job / "rank-00001.jsonl"
    tmp = job / ".replace.tmp"
    tmp.write_bytes(b"".join(x + b"\n" for x in lines(1, range(10, 16))))
    os.replace(tmp, path)
    both()
    assert seen[-1] and all(rank == 1 for rank, _, _ in seen[-1])
    # truncated in place, then written again
    (job / "rank-00002.jsonl").write_bytes(b"")
    both()
    assert any("rank 2: rank-00002.jsonl shrank" in w for w in held.stats.warnings)
    with open(job / "rank-00002.jsonl", "ab") as f:
        f.write(E.encode(ev(2, 20)) + b"\n")
    both()
    assert seen[-1] == [(2, 20, "op")]
    # rotated to a new segment: the old one is let go of
    old = str(job / "rank-00003.jsonl")
    assert held._files.holds(old)
    writers[3].write(lines(3, range(3, 12)))
    writers[3].write(lines(3, range(12, 13)))
    later = sorted(job.glob("rank-00003.s*.jsonl"))
    assert later
    both()
    assert [i for _, i, _ in seen[-1]] == list(range(3, 13))
    assert not held._files.holds(old)
    both()
    assert held._files.holds(str(later[-1])) and not any(held._files.holds(str(p)) for p in later[:-1])
    # a stream's file deleted (its space is not held by the reader), another replaced by a FIFO
    gone = str(job / "rank-00004.jsonl")
    assert held._files.holds(gone)
    os.unlink(gone)
    both()
    assert not held._files.holds(gone)
    fifo = str(job / "rank-00000.jsonl")
    os.unlink(fifo)
    os.mkfifo(fifo)
    both()
    assert not held._files.holds(fifo)
    assert any("rank-00000.jsonl is not a regular file" in w for w in held.stats.warnings)
    writers[1].close()


def test_held_files_are_closed_with_the_reader_and_never_past_its_room(tmp_path):
    writers = [DirectoryWriter(tmp_path, "j", r) for r in range(5)]
    for r, w in enumerate(writers):
        w.write(lines(r, range(1, 2)))
    before = open_fds()
    r = DirectoryReader(tmp_path)
    assert len(r.poll()) == 5
    r.poll()
    assert len(r._files) == 5 and len(open_fds() - before) == 5
    r.close()
    assert len(r._files) == 0 and open_fds() <= before
    small = DirectoryReader(tmp_path)
    small._room_asked = 1 << 30
    small._files.reserve(2)
    assert len(small.poll()) == 5
    assert small.poll() == []
    assert len(small._files) == 2
    for k, w in enumerate(writers):
        w.write(lines(k, range(2, 3)))
    assert sorted(e["rank"] for e in small.poll()) == [0, 1, 2, 3, 4]
    assert len(small._files) == 2
    del small  # (a reader never closed: its files are closed when it is collected)
    assert open_fds() <= before


def test_open_files_read_like_read_from_and_refuse_what_is_not_regular(tmp_path):
    f = tmp_path / "a"
    f.write_bytes(b"0123456789")
    files = OpenFiles()
    files.reserve(1)
    assert files.size(str(f)) == 10 and files.holds(str(f))
    assert files.read(str(f), 3, 4) == b"3456" and files.read(str(f), 8, 100) == b"89"
    assert files.read(str(f), 10, 5) == b"" and files.read(str(f), 12, 5) == b""
    assert files.read(str(f), 2, 3, sized=True) == b"234"
    f.write_bytes(b"01234")  # (cut short after its size was asked: what is there)
    assert files.read(str(f), 2, 6, sized=True) == b"234"
    g = tmp_path / "b"
    g.write_bytes(b"xy")
    assert files.size(str(g)) == 2 and not files.holds(str(g))  # (no room: read as read_from reads)
    assert files.read(str(g), 0, 5) == b"xy"
    os.mkfifo(tmp_path / "c")
    files.reserve(5)
    assert files.size(str(tmp_path / "c")) == 0 and not files.holds(str(tmp_path / "c"))
    os.symlink(g, tmp_path / "d")
    assert files.size(str(tmp_path / "d")) == 2 and not files.holds(str(tmp_path / "d"))  # (a symlink: never)
    assert files.size(str(g)) == 2 and files.holds(str(g))
    files.let_go({"a": os.stat(f).st_ino, "b": os.stat(g).st_ino + 1})  # (b: another file under its name now)
    assert files.holds(str(f)) and not files.holds(str(g))
    files.let_go({})
    assert len(files) == 0
    files.close()
    assert files.capacity == 0


def test_a_stream_that_is_a_symlink_is_read_through_its_path_and_never_held(tmp_path):
    """Found by review: a stream's file may be a symlink to a file elsewhere, whose target is
    written again where no listing of the job's directory sees it: it is never held, and
    reads what its path names, as a reader that holds nothing does."""
    job, elsewhere = tmp_path / "store" / "j", tmp_path / "elsewhere"
    DirectoryWriter(tmp_path / "store", "j", 1).write(lines(1, range(1, 2)))
    elsewhere.mkdir()
    target = elsewhere / "rank.jsonl"
    target.write_bytes(b"".join(x + b"\n" for x in lines(0, range(1, 3))))
    os.symlink(target, job / "rank-00000.jsonl")
    held, plain = DirectoryReader(tmp_path / "store"), holding_none(tmp_path / "store")
    for _ in range(2):
        assert [(e["rank"], e["id"]) for e in held.poll()] == [(e["rank"], e["id"]) for e in plain.poll()]
    tmp = elsewhere / ".tmp"
    tmp.write_bytes(b"".join(x + b"\n" for x in lines(0, range(1, 6))))
    os.replace(tmp, target)
    got = [(e["rank"], e["id"]) for e in held.poll()]
    assert got == [(e["rank"], e["id"]) for e in plain.poll()] == [(0, 3), (0, 4), (0, 5)]
    assert held._files.holds(str(job / "rank-00001.jsonl")) and not held._files.holds(str(job / "rank-00000.jsonl"))


def test_a_file_replaced_between_a_listing_and_its_open_is_let_go_of_when_replaced_again(tmp_path):
    """Found by review: the file held is compared with what a listing names by the inode it
    was opened with, not by the listing before: a file replaced between a poll's listing and
    its open, then replaced again by a file that reuses the first one's inode number, is
    let go of (compared with the listing before, it was held, deleted, for ever)."""
    w = DirectoryWriter(tmp_path, "j", 0)
    w.write(lines(0, range(1, 3)))
    path = tmp_path / "j" / "rank-00000.jsonl"
    r = DirectoryReader(tmp_path)
    assert [e["id"] for e in r.poll()] == [1, 2]
    r._files.forget(str(path))  # (held since its read: opened again by the next poll's look at its size)
    replaced: list[int] = []

    def replace(ids: range) -> None:
        tmp = tmp_path / "j" / ".tmp"
        tmp.write_bytes(b"".join(x + b"\n" for x in lines(0, ids)))
        os.replace(tmp, path)
        replaced.append(os.stat(path).st_ino)

    real = r._files.size
    r._files.size = lambda p: (replace(range(1, 4)) if not replaced else None) or real(p)  # (after the listing)
    assert [e["id"] for e in r.poll()] == [3]
    r._files.size = real
    assert r._files.holds(str(path))
    replace(range(1, 9))  # (ext4 gives it the first file's inode number again, freed by the first replace)
    assert [e["id"] for e in r.poll()] == [4, 5, 6, 7, 8]
    held = os.fstat(r._files._held[str(path)][0])
    assert held.st_ino == os.stat(path).st_ino and held.st_nlink == 1  # (the file the path names, not a deleted one)


def test_a_job_directory_deleted_under_the_reader_frees_its_files(tmp_path):
    """Found by review: with the job's directory gone, the reader holds none of its files
    (deleted, their space would stay taken as long as the console runs)."""
    for r in range(4):
        DirectoryWriter(tmp_path, "j", r).write(lines(r, range(1, 2)))
    before = open_fds()
    reader = DirectoryReader(tmp_path)
    reader.poll()
    reader.poll()
    assert len(reader._files) == 4
    shutil.rmtree(tmp_path / "j")
    assert reader.poll() == [] and len(reader._files) == 0 and open_fds() <= before


def test_a_reader_opened_on_a_relative_path_keeps_its_files_across_listings(tmp_path, monkeypatch):
    """Found by review: a reader of "." held paths spelt "rank-...", its listings' entries
    "./rank-...": every listing let go of every file.  Entries are matched by name."""
    DirectoryWriter(tmp_path, "j", 0).write(lines(0, range(1, 2)))
    monkeypatch.chdir(tmp_path / "j")
    r = DirectoryReader(".")
    r.poll()
    r.poll()
    assert len(r._files) == 1
    r._listed = None
    assert r.poll() == [] and len(r._files) == 1


ROOM = """
import json, resource
from commscope.store.files import room_for
soft, hard = {soft}, {hard}
resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
out = []
for n in {asks}:
    got = room_for(n)
    out.append([got, resource.getrlimit(resource.RLIMIT_NOFILE)[0]])
print(json.dumps(out))
"""


def room(soft: int, hard: int, asks: list[int]) -> list[list[int]]:
    code = ROOM.format(soft=soft, hard=hard, asks=asks)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return orjson.loads(done.stdout)


def test_room_for_raises_the_soft_limit_only_as_far_as_needed_and_never_past_the_hard_one():
    assert room(512, 4096, [100, 1000, 10_000]) == [[100, 1124], [1000, 2024], [3072, 4096]]
    assert room(800, 800, [100]) == [[0, 800]]  # (no room past what the rest of the process needs)


LEDGER = """
import gc, json, resource
from commscope.store.files import OpenFiles
resource.setrlimit(resource.RLIMIT_NOFILE, (512, 4096))
a, b, c = OpenFiles(), OpenFiles(), OpenFiles()
out = []
def note(f, n):
    f.reserve(n)
    out.append([f.capacity, resource.getrlimit(resource.RLIMIT_NOFILE)[0]])
note(a, 1000); note(b, 1000); note(c, 2000)
del a
gc.collect()
note(c, 2000)  # (a soft limit raised is never lowered)
b.close()
note(c, 3000)
print(json.dumps(out))
"""


def test_the_room_to_hold_files_is_shared_by_every_reader_of_the_process():
    """Found by review: two readers in one process (a console starting again at the tail
    reads a new one while the old holds its files) each counted on the whole room and ran
    the process out of descriptors.  Each reserves its room in one ledger, given back when
    it is closed or collected."""
    done = subprocess.run([sys.executable, "-c", LEDGER], capture_output=True, text=True, check=True)
    assert orjson.loads(done.stdout) == [[1000, 2024], [1000, 3024], [1072, 4096], [2000, 4096], [3000, 4096]]


def test_a_directory_that_cannot_be_listed_is_said_once_until_it_can(tmp_path, monkeypatch):
    """Found by review: a listing that failed (no descriptors left, no permission) read as an
    empty job, without a word: a console just waited.  It is said once, and again after
    the directory was listed and then failed again."""
    DirectoryWriter(tmp_path, "j", 0).write(lines(0, range(1, 2)))
    r = DirectoryReader(tmp_path)
    assert len(r.poll()) == 1
    real = os.scandir

    def refused(path):
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(os, "scandir", refused)
    for _ in range(3):
        r._listed = None
        assert r.poll() == []
    assert r.stats.warnings == [f"cannot list {tmp_path / 'j'}: Too many open files"]
    monkeypatch.setattr(os, "scandir", real)
    r._listed = None
    assert r.poll() == []
    monkeypatch.setattr(os, "scandir", refused)
    r._listed = None
    r.poll()
    assert len(r.stats.warnings) == 2


def test_a_file_replaced_where_the_directory_time_did_not_move_is_seen_at_the_next_listing(tmp_path):
    """A held file is let go of by a listing; a listing is trusted while the directory's
    mtime stays put (``LIST_TRUST_S``).  A file written again under its name without moving
    that mtime (a network filesystem's clock, a touched-back directory) was seen at once by
    the stat of each poll; a reader that holds it sees it once the listing is made again,
    ``LIST_AGAIN_S`` at most after the last."""
    DirectoryWriter(tmp_path, "j", 0).write(lines(0, range(1, 3)))
    job, path = tmp_path / "j", tmp_path / "j" / "rank-00000.jsonl"
    old = 1_000_000_000 * (int(time.time()) - 100)
    os.utime(job, ns=(old, old))
    r = DirectoryReader(tmp_path)
    assert [e["id"] for e in r.poll()] == [1, 2]
    r.poll()
    assert r._files.holds(str(path))
    tmp = job / ".tmp"
    tmp.write_bytes(b"".join(x + b"\n" for x in lines(0, range(1, 5))))
    os.replace(tmp, path)
    os.utime(job, ns=(old, old))
    assert r.poll() == []  # (the listing trusted: the file held is the one replaced)
    r._listed = (r._listed[0], r._listed[1] - DirectoryReader.LIST_AGAIN_S)
    assert [e["id"] for e in r.poll()] == [3, 4]
