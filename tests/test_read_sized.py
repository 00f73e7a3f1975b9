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
from commscope.analysis.source import MODEL_PER_STORED_LEAST, load_trace, open_source
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
        return reader.backlog_bytes() * MODEL_PER_STORED_LEAST
    finally:
        reader.close()


@pytest.fixture(scope="module")
def keyed(tmp_path_factory) -> str:
    """A job of the last 30 s with keyframes every second: a window starts near its start."""
    root = str(tmp_path_factory.mktemp("keyed") / "store")
    write_store(root, JobShape(16, 400, fault="missing", hang_after=2.0, keyframe_s=1.0,
                               t0=time.time_ns() - 30 * S), job="keyed")
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
    assert "all of it would hold at least" in said and "x 0.2" in said and "--max-memory none" in said
    # (one segment a stream, no keyframes: a window of its last second reads it whole)
    assert "no window of it does" in said
    model, _, _ = load_trace(store, max_model=int(least) + 1)  # (it fits: read whole)
    assert read == [1] and model.events > 0 and len(model.ranks) == 8


@pytest.mark.parametrize("since", [None, Since(ago_s=3600)])
def test_a_read_that_would_not_fit_is_told_a_window_that_does(keyed, since):
    """The window said is looked at before it is said: read with the same limit, it fits,
    and finds what the whole read finds."""
    limit = int(_least(keyed, since) / 3)
    with pytest.raises(UsageError) as e:
        load_trace(keyed, since=since, max_model=limit)
    said = str(e.value)
    assert ("all of it" if since is None else "the last 1 h of it") + " would hold at least" in said
    ago = int(re.search(r"--since (\d+)s fits", said).group(1))
    assert 1 <= ago < 30
    model, _, _ = load_trace(keyed, since=Since(ago_s=ago), max_model=limit)
    assert model.events > 0
    _, findings = judged(model, 2.0)
    assert [(f.kind, f.culprits) for f in findings if f.severity == "error"] == [("missing_ranks", [9])]


@pytest.mark.parametrize("command", ["check", "report", "export"])
def test_each_one_shot_command_is_sized_by_the_memory_available(store, command, monkeypatch, capsys, tmp_path):
    """By default the limit is the memory available as the command starts; ``none`` reads anyway."""
    monkeypatch.setattr(memory, "available_bytes", lambda: 1 << 10)
    extra = ["--chrome", str(tmp_path / "out.json")] if command == "export" else []
    assert cli([command, store, *extra]) == 2
    err = capsys.readouterr().err
    assert "would hold at least" in err and "more than 1.0 KiB" in err
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


def test_the_memory_available_is_a_cgroups_where_it_limits_to_less(tmp_path, monkeypatch):
    """A container's or a batch slot's limit (cgroup v2, else v1) less what it uses, where
    that is less than the system's available memory; "max" (v2) or v1's ~2^63 limit nothing."""
    system = 8 << 30
    monkeypatch.setattr(psutil, "virtual_memory", lambda: argparse.Namespace(available=system))
    v2 = (tmp_path / "memory.max", tmp_path / "memory.current")
    v1 = (tmp_path / "limit_in_bytes", tmp_path / "usage_in_bytes")
    monkeypatch.setattr(memory, "CGROUP_FILES", ((str(v2[0]), str(v2[1])), (str(v1[0]), str(v1[1]))))
    assert memory.available_bytes() == system  # (neither readable: the system's)
    v1[0].write_text("9223372036854771712\n")
    v1[1].write_text("1000\n")
    assert memory.available_bytes() == system  # (v1 unlimited)
    v1[0].write_text(f"{300 << 20}\n")
    assert memory.available_bytes() == (300 << 20) - 1000
    v2[0].write_text("max\n")
    v2[1].write_text("5\n")
    assert memory.available_bytes() == system  # (v2 read first: no limit there)
    v2[0].write_text(f"{100 << 20}\n")
    assert memory.available_bytes() == (100 << 20) - 5
