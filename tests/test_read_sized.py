"""A one-shot read (check, report, export) sized before it reads: one whose model would not
fit in memory (``--max-memory``, by default what the machine has available) is refused with a
window that would, instead of reading for minutes and running out of memory."""

from __future__ import annotations

import argparse
import re
import time

import psutil
import pytest

from commscope import memory
from commscope.analysis.source import (
    MODEL_PER_RANK_LEAST,
    MODEL_PER_STORED_LEAST,
    load_trace,
    open_source,
)
from commscope.analysis.synth import S
from commscope.bench.synthstore import JobShape, write_store
from commscope.cli import main as cli
from commscope.commands import options
from commscope.commands.check import judged
from commscope.errors import UsageError
from commscope.store.directory import DirectoryReader
from commscope.window import Since


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp("sized") / "store")
    write_store(root, JobShape(8, 60, fault="missing", hang_after=2.0), job="sized")
    return root


def _least(store: str, since: Since | None = None) -> float:
    reader = open_source(store, since=since)
    try:
        return reader.backlog_bytes() * MODEL_PER_STORED_LEAST + reader.rank_count() * MODEL_PER_RANK_LEAST
    finally:
        reader.close()


@pytest.fixture(scope="module")
def keyed(tmp_path_factory) -> str:
    """A job of the last ~35 s with keyframes every second: a window starts near its start."""
    root = str(tmp_path_factory.mktemp("keyed") / "store")
    write_store(root, JobShape(64, 600, fault="missing", hang_after=2.0, keyframe_s=1.0,
                               t0=time.time_ns() - 35 * S), job="keyed")
    return root


def test_a_read_that_would_not_fit_is_refused_before_a_byte_is_read(store, monkeypatch):
    least = _least(store)
    assert least > 0
    read = []
    real = DirectoryReader.bulk

    def bulk(self, *args, **kwargs):
        read.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(DirectoryReader, "bulk", bulk)
    with pytest.raises(UsageError) as e:
        load_trace(store, max_model=int(least) - 1)
    said = str(e.value)
    assert read == []  # (refused before reading)
    assert "all of it would hold at least" in said and "stored x 0.2" in said and "--max-memory none" in said
    # (one segment a stream, no keyframes: a window of its last second reads it whole)
    assert "no window of it fits" in said
    model, _, _ = load_trace(store, max_model=int(least) + 1)  # (it fits: read whole)
    assert read == [1] and model.events > 0 and len(model.ranks) == 8


def _said(text: str) -> float:
    """The window a refusal says to try, in seconds."""
    n, unit = re.search(r"try --since (\d+)([smh])\b", text).groups()
    return int(n) * {"s": 1, "m": 60, "h": 3600}[unit]


@pytest.mark.parametrize("since", [None, Since(ago_s=3600), Since(ago_s=86400)])
def test_a_read_that_would_not_fit_is_told_a_window_that_does(keyed, since):
    """The window said is looked at before it is said, at the most a stored byte makes: read,
    its model fits the limit, and it finds what the whole read finds.  A window asked longer
    than the job (a day of a 30 s job) is told one too (helper-157: its bytes never shrank,
    and the search gave up: "no window")."""
    limit = int(_least(keyed, since) / 1.5)
    with pytest.raises(UsageError) as e:
        load_trace(keyed, since=since, max_model=limit)
    said = str(e.value)
    assert f"{'all' if since is None else since.describe()} of it would hold at least" in said
    ago = _said(said)
    assert 1 <= ago < 35
    model, _, _ = load_trace(keyed, since=Since(ago_s=ago), max_model=limit)
    assert 0 < model.nbytes() <= limit
    _, findings = judged(model, 2.0)
    assert [(f.kind, f.culprits) for f in findings if f.severity == "error"] == [("missing_ranks", [33])]


def test_a_long_job_read_whole_is_told_a_window_of_what_fits_not_of_ten_minutes(tmp_path):
    """A whole read of a job longer than ten minutes: the window said is grown past the ten
    minutes tried first while longer ones fit (helper-157: scaled by the whole job's bytes,
    it said 149 s where 15 minutes fit)."""
    root = str(tmp_path / "long")
    write_store(root, JobShape(16, 1600, fault="missing", hang_after=2.0, rate=0.4, keyframe_s=1.0,
                               t0=time.time_ns() - 4020 * S), job="long")
    limit = int(_least(root) / 1.05)
    with pytest.raises(UsageError) as e:
        load_trace(root, max_model=limit)
    ago = _said(str(e.value))
    assert 600 < ago < 4000
    model, _, _ = load_trace(root, since=Since(ago_s=ago), max_model=limit)
    assert model.nbytes() <= limit


@pytest.fixture(scope="module")
def wide(tmp_path_factory) -> str:
    """256 ranks of JSON op events, 400 ops each over the last ~7 minutes, keyframes every
    second that a stream grew by 8 KiB: a few KB a rank in a short window."""
    root = str(tmp_path_factory.mktemp("wide") / "store")
    write_store(root, JobShape(256, 400, fault="missing", hang_after=2.0, rate=1.0, json=True, keyframe_s=1.0,
                               t0=time.time_ns() - 420 * S), job="wide")
    return root


def test_a_window_said_of_many_ranks_fits_with_what_each_rank_holds(wide):
    """What a model holds for each rank, whatever its bytes, is counted: at 256 JSON ranks the
    window said built 8.5 MiB against a 5 MiB limit (helper-158: its stored bytes alone
    counted, and a JSON rank's columns began at 256 ops, 36 KB).  Each window said, read,
    fits; a rank of a few ops holds a few KB."""
    reader = open_source(wide)
    streams = reader.rank_count()
    reader.close()
    assert streams == 256
    for share in (0.5, 0.9):
        limit = int(_least(wide) * share)
        with pytest.raises(UsageError) as e:
            load_trace(wide, max_model=limit)
        assert "for each of 256 ranks),\n  more than --max-memory" in str(e.value)
        ago = _said(str(e.value))
        model, _, _ = load_trace(wide, since=Since(ago_s=ago), max_model=limit)
        assert len(model.ranks) == 256 and model.nbytes() <= limit, (share, ago, model.nbytes(), limit)
    few, _, _ = load_trace(wide, since=Since(ago_s=10))
    assert few.nbytes() / 256 < 16 << 10  # (~9 KB; 36 KB a rank before)


class _Streams:
    """A reader of ``n`` streams that says ``stored`` bytes whatever the window (``fitting_window``)."""

    def __init__(self, n: int, stored: int):
        self.n, self.stored = n, stored

    def backlog_bytes(self) -> int:
        return self.stored

    def rank_count(self) -> int:
        return self.n

    def close(self) -> None:
        pass


def test_a_window_is_sized_with_what_each_of_its_streams_holds():
    """16k streams of a few KB each: their ranks' columns and rows (~64 MiB), not their
    stored bytes (~16 MiB of model), decide what fits."""
    from commscope.analysis.source import fitting_window

    wide = _Streams(16384, 2 << 20)
    assert fitting_window(lambda since: wide, Since(ago_s=60), 32 << 20) is None
    assert fitting_window(lambda since: wide, Since(ago_s=60), 32 << 20, per_rank=0) == 60
    assert fitting_window(lambda since: wide, Since(ago_s=60), 80 << 20) == 60


def test_a_read_whose_ranks_alone_would_not_fit_is_refused(wide):
    """Its stored bytes at the least would fit; its 256 ranks at the least a rank holds would not."""
    reader = open_source(wide, since=Since(ago_s=10))
    stored = reader.backlog_bytes()
    reader.close()
    limit = int(stored * MODEL_PER_STORED_LEAST) + 256 * MODEL_PER_RANK_LEAST // 2
    with pytest.raises(UsageError) as e:
        load_trace(wide, since=Since(ago_s=10), max_model=limit)
    assert "would hold at least" in str(e.value) and "256 ranks" in str(e.value)


@pytest.mark.parametrize("limit, told", [
    (3 << 18, "no window of it is sure to fit (its 256 ranks may hold up to 4.0 KiB\n  each, 1.0 MiB, whatever "
              "they read)"),
    (200 << 10, "no window of it fits (its 256 ranks hold at least 1.0 KiB each,\n  256.0 KiB, whatever they "
                "read)")])
def test_a_read_whose_ranks_alone_hold_more_than_the_limit_is_told_so(wide, limit, told):
    """What is sure (the least a rank holds) said as sure, what may be (the most) as may
    (helper-160: the most stated as certain)."""
    with pytest.raises(UsageError) as e:
        load_trace(wide, max_model=limit)
    said = str(e.value)
    assert told in said, said
    assert max(map(len, said.splitlines()[1:])) <= 80, said


@pytest.mark.parametrize("json", [False, True])
def test_the_least_a_read_is_said_to_hold_is_no_more_than_its_model(tmp_path, json):
    """Many ranks of few ops, native and JSON: "at least" is a lower bound, so a limit just
    above the model is read (helper-159: 2 KiB a rank beside 0.2 a stored byte counted a
    native rank's bytes twice, and refused 2,048 ranks' 4.8 MiB model at 5.5 MiB)."""
    root = str(tmp_path / "few")
    write_store(root, JobShape(1024, 2, fault="missing", hang_after=2.0, json=json), job="few")
    model, _, _ = load_trace(root)
    assert _least(root) <= model.nbytes()
    again, _, _ = load_trace(root, max_model=int(model.nbytes() * 1.05))
    assert again.nbytes() == model.nbytes()


def test_a_ranks_incarnations_are_one_rank_of_the_model(tmp_path):
    from commscope.store import open_writer

    for rank, incarnation in ((0, 0), (0, 1), (0, 2), (1, 0)):
        w = open_writer(str(tmp_path), "inc", rank, {"world_size": 2}, incarnation=incarnation)
        w.write([b'{"type":"heartbeat","ts":1700000000000000000,"v":3,"rank":%d,"inflight":0}' % rank])
        w.close()
    reader = open_source(str(tmp_path))
    try:
        assert len(reader.streams()) == 4 and reader.rank_count() == 2
    finally:
        reader.close()


@pytest.mark.parametrize("command", ["check", "report", "export"])
def test_each_one_shot_command_is_sized_by_the_memory_available(store, command, monkeypatch, capsys, tmp_path):
    """By default the limit is the memory available as the command starts; ``none`` reads anyway."""
    monkeypatch.setattr(memory, "available_bytes", lambda: 1 << 10)
    extra = ["--chrome", str(tmp_path / "out.json")] if command == "export" else []
    assert cli([command, store, *extra]) == 2
    err = capsys.readouterr().err
    assert "would hold at least" in err and "more than --max-memory 1.0 KiB" in err
    got = cli([command, store, *extra, "--max-memory", "none"])
    assert got == (1 if command == "check" else 0)  # (read: check finds the missing rank)
    assert "would hold" not in capsys.readouterr().err


def test_max_memory_reads_a_size_or_none():
    assert options.memory_size("8GiB") == 8 << 30
    assert options.memory_size(" None ") == "none"
    with pytest.raises(argparse.ArgumentTypeError):
        options.memory_size("lots")
    assert options.max_memory_of(argparse.Namespace(max_memory=64 << 20)) == 64 << 20
    assert options.max_memory_of(argparse.Namespace(max_memory="none")) is None


def _group(root, path: str, **files: str) -> None:
    d = root / path
    d.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (d / name.replace("_", ".", 1)).write_text(text)


def test_the_memory_available_is_a_cgroups_where_it_leaves_less(tmp_path, monkeypatch):
    """A container's, a batch job's slot's or a systemd slice's limit, on this process's own
    cgroup or any above it (``/proc/self/cgroup``), less its working set (what it uses less
    the inactive file cache the kernel drops first), where that is less than the system's
    available memory; "max" (v2) or v1's ~2^63 limit nothing (helper-157: the root's files
    were read, not the process's group's, and page cache counted as used)."""
    mib = 1 << 20
    system = 8 << 30
    monkeypatch.setattr(psutil, "virtual_memory", lambda: argparse.Namespace(available=system))
    proc = tmp_path / "cgroup"
    root = tmp_path / "fs"
    monkeypatch.setattr(memory, "PROC_CGROUP", str(proc))
    monkeypatch.setattr(memory, "CGROUP_ROOT", str(root))
    assert memory.available_bytes() == system  # (no /proc/self/cgroup: the system's)
    proc.write_text("0::/slice/job\n")
    _group(root, "", memory_max="max\n", memory_current="5\n")
    _group(root, "slice/job", memory_max="max\n", memory_current=f"{100 * mib}\n")
    assert memory.available_bytes() == system  # (no limit anywhere)
    # the slice above the job: 1 GiB, 900 MiB used of which 600 MiB inactive file cache
    _group(root, "slice", memory_max=f"{1024 * mib}\n", memory_current=f"{900 * mib}\n",
           memory_stat=f"anon {300 * mib}\ninactive_file {600 * mib}\nactive_file 0\n")
    assert memory.available_bytes() == 724 * mib
    _group(root, "slice/job", memory_max=f"{500 * mib}\n")  # (the job's own: less)
    assert memory.available_bytes() == 400 * mib
    # cgroup v1: the memory controller's group, its parents' limits too
    proc.write_text("4:memory:/a/b\n3:cpu:/\n0::/\n")
    _group(root, "memory", memory_limit_in_bytes="9223372036854771712\n", memory_usage_in_bytes="7\n")
    _group(root, "memory/a", memory_limit_in_bytes=f"{300 * mib}\n", memory_usage_in_bytes=f"{200 * mib}\n",
           memory_stat=f"cache 1\ntotal_inactive_file {150 * mib}\n")
    _group(root, "memory/a/b", memory_limit_in_bytes="9223372036854771712\n", memory_usage_in_bytes="1\n")
    assert memory.available_bytes() == 250 * mib
