"""A directory reader holds its streams' newest files open between polls (``files.OpenFiles``):
it reads what a reader that opens each file every time reads, through replacements,
truncations, rotations and deletions, and lets go of what it no longer reads."""

from __future__ import annotations

import os
import subprocess
import sys

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
    small._files.capacity = 2
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
    files = OpenFiles(capacity=1)
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
    files.capacity = 5
    assert files.size(str(tmp_path / "c")) == 0 and not files.holds(str(tmp_path / "c"))
    files.forget(str(f))
    assert len(files) == 0


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
