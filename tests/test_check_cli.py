"""`commscope check`: exit codes, the --json contract, warnings for damaged input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from commscope import errors
from commscope.analysis.synth import S, TraceBuilder, healthy_trace
from commscope.cli import main as cli
from commscope.events import SCHEMA_VERSION, encode
from commscope.store import open_writer

JOB = "job-1"


def write_store(root: Path, events: list[dict]) -> Path:
    by: dict[int, list[bytes]] = {}
    for e in events:
        by.setdefault(e["rank"], []).append(encode(e))
    for r, lines in sorted(by.items()):
        w = open_writer(str(root), JOB, r, job_meta={"world_size": len(by)})
        w.write(lines)
        w.close()
    return root


def hung_trace() -> list[dict]:
    b = TraceBuilder(3)
    t = b.t0 + S
    t = b.collective(t, "all_reduce")
    b.sync(0, t, None, "all_reduce")
    b.sync(1, t, None, "all_reduce")
    b.heartbeats(t, t + 5 * S)
    return b.sorted_events()


def run_json(capsys, *argv) -> tuple[int, dict]:
    capsys.readouterr()
    rc = cli(["check", *argv, "--json"])
    return rc, json.loads(capsys.readouterr().out)


def test_healthy_exit_0_and_json_shape(tmp_path, capsys):
    store = write_store(tmp_path / "s", healthy_trace(4, 200))
    rc, out = run_json(capsys, str(store))
    assert rc == 0
    assert out["ranks"] == 4 and out["events"] > 0 and out["findings"] == [] and out["warnings"] == []
    assert cli(["check", str(store)]) == 0
    assert "no findings" in capsys.readouterr().out


def test_hang_exit_1_with_contract_fields(tmp_path, capsys):
    store = write_store(tmp_path / "s", hung_trace())
    rc, out = run_json(capsys, str(store))
    assert rc == 1
    (f,) = out["findings"]
    assert set(f) == {"kind", "severity", "group", "seq", "op", "ranks", "culprits", "message", "evidence"}
    assert (f["kind"], f["severity"], f["group"], f["seq"], f["op"]) == ("missing_ranks", "error", "0", 2, "all_reduce")
    assert f["ranks"] == [0, 1, 2] and f["culprits"] == [2]
    # a longer hang_after than the wait: nothing to report
    rc, out = run_json(capsys, str(store), "--hang-after", "60")
    assert rc == 0 and out["findings"] == []
    assert cli(["check", str(store)]) == 1
    text = capsys.readouterr().out
    assert "missing_ranks" in text and "never entered" in text


def test_warnings_exit_0(tmp_path, capsys):
    b = TraceBuilder(2)
    t = b.t0 + S
    a = [b.async_op(r, t, None, None, "all_reduce") for r in range(2)]
    b.exit(0, t + S, unwaited=[a[0]])
    b.exit(1, t + S, unwaited=[a[1]])
    store = write_store(tmp_path / "s", b.sorted_events())
    rc, out = run_json(capsys, str(store))
    assert rc == 0 and [f["kind"] for f in out["findings"]] == ["unwaited_work"] * 2


def test_bad_input_exit_2(tmp_path, capsys):
    assert cli(["check", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "error:" in err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli(["check", str(empty)]) == 2
    store = tmp_path / "junk"
    w = open_writer(str(store), JOB, 0)
    w.write([b"garbage", b"{not json", b"[1,2]"])
    w.close()
    assert cli(["check", str(store)]) == 2
    assert "corrupt beyond use" in capsys.readouterr().err
    good = write_store(tmp_path / "ok", healthy_trace(2, 50))
    with pytest.raises(SystemExit) as refused:  # (argparse's usage error)
        cli(["check", str(good), "--hang-after", "-1"])
    assert refused.value.code == 2


def test_corrupt_and_truncated_lines_are_warnings(tmp_path, capsys):
    store = write_store(tmp_path / "s", hung_trace())
    files = sorted((store / JOB).glob("rank-*.jsonl"))
    with open(files[0], "ab") as f:
        f.write(b"{this is not json}\n")
    with open(files[1], "ab") as f:
        f.write(b'{"type":"heartbeat","ts":')  # torn last line
    rc, out = run_json(capsys, str(store))
    assert rc == 1 and out["findings"][0]["culprits"] == [2]
    text = " ".join(out["warnings"])
    assert "damaged" in text and "truncated" in text


def test_py_spy_dump_of_a_culprit_that_cannot_run_python(tmp_path, capsys, monkeypatch):
    """Rank 2 never arrives and never answers the stack request: with --py-spy, check takes a
    native dump of its pid on this host (a stand-in py-spy here) and shows it."""
    import os
    import socket

    b = TraceBuilder(3)
    for r in range(3):  # this host, a pid of our own (py-spy is a stand-in)
        b.events[r]["host"], b.events[r]["pid"] = socket.gethostname(), os.getpid()
    t = b.t0 + S
    t = b.collective(t, "all_reduce")
    for r in (0, 1):
        b.sync(r, t, None, "all_reduce")
        b.add(r, t + 2 * S + 300_000_000, "stack", reason="request", trigger=0, request_ns=t + 2 * S,
              threads=[{"tid": 1, "name": "MainThread", "op_thread": True, "frames": [["train.py", 9, "step"]]}])
    b.heartbeats(t, t + 8 * S)
    store = write_store(tmp_path / "trace", b.sorted_events())
    fake = tmp_path / "bin" / "py-spy"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho \"Thread 42 (active): MainThread\"\necho \"    spin (native.c:12)\"\necho \"$@\"\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    rc, out = run_json(capsys, str(store), "--py-spy")
    assert rc == 1
    (f,) = out["findings"]
    info = f["evidence"]["stack_info"]["2"]
    assert f["culprits"] == [2] and "GIL" in info["missing"]
    assert "spin (native.c:12)" in info["native_dump"] and f"--pid {os.getpid()} --native" in info["native_dump"]
    rc, _ = run_json(capsys, str(store))
    capsys.readouterr()
    assert cli(["check", str(store), "--py-spy"]) == 1
    assert "py-spy dump of rank 2" in capsys.readouterr().out


def test_a_check_run_in_process_leaves_nothing_frozen(tmp_path, capsys):
    """A command's load freezes what is alive out of the collector's sight (the program exits
    right after); called in a process that goes on, it gives it all back."""
    import gc
    import subprocess
    import sys

    store = write_store(tmp_path / "s", hung_trace())
    rc, out = run_json(capsys, str(store))
    assert rc == 1 and out["findings"] and gc.get_freeze_count() == 0
    # the program itself keeps it frozen to its exit
    code = ("import gc, io, contextlib, commscope.commands.progress as p\n"
            f"p.load({str(store)!r}, False)\nprint(gc.get_freeze_count() > 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "True", proc.stderr


def _closed_pipe_run(*argv: str) -> subprocess.CompletedProcess:
    """``python *argv`` writing its output into a pipe whose reader is gone already."""
    r, w = os.pipe()
    os.close(r)
    try:
        return subprocess.run([sys.executable, *argv], stdout=w, stderr=subprocess.PIPE, text=True, timeout=300)
    finally:
        os.close(w)


def test_a_command_whose_output_reader_went_away_exits_quietly(tmp_path):
    """``commscope export --chrome - | head``, ``check`` / ``report`` ``| head`` and ``python
    -m commscope.compiled status | head``: the reader of the output gone, the command stops
    with the shell's status for a closed pipe (128 + SIGPIPE, none of ``check``'s: a healthy
    trace's check does not say "errors found"), no traceback."""
    store = write_store(tmp_path / "t", healthy_trace())
    for argv in (["export", str(store), "--chrome", "-"], ["check", str(store)], ["check", str(store), "--json"],
                 ["report", str(store)]):  # (check's and report's tables: rich's console, its own exit 1 before)
        got = _closed_pipe_run("-m", "commscope", *argv)
        assert got.returncode == errors.CLOSED_PIPE == 141, (argv, got.stderr)
        assert "Traceback" not in got.stderr and "BrokenPipe" not in got.stderr
    got = _closed_pipe_run("-m", "commscope.compiled", "status")
    assert got.returncode == errors.CLOSED_PIPE, got.stderr
    assert "Traceback" not in got.stderr and "BrokenPipe" not in got.stderr


def test_a_broken_pipe_that_is_not_the_output_is_a_failure_not_a_quiet_exit(monkeypatch, capsys):
    """A command that broke another pipe or socket (a Redis connection) while its output is
    fine: the error goes on up, it is not taken for ``| head``."""
    import commscope.commands.check as check

    def broken(args):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(check, "main", broken)
    with pytest.raises(BrokenPipeError):
        cli(["check", "anything"])


def test_the_header_folds_after_the_source_and_reads_names_as_text(tmp_path):
    """What was read says each figure whole at 80 columns (a terminal folded "hang_after
    10" from its "s"), and a store's name or a warning is text, not markup: "[b]" in a path
    was taken for bold and lost, and "[/]" in a warning raised rich's MarkupError."""
    import io

    from rich.console import Console

    from commscope.analysis import TraceModel
    from commscope.commands.check import render

    model = TraceModel.from_events(hung_trace())

    def shown(source: str, width: int, warnings: list[str]) -> list[str]:
        con = Console(width=width, file=io.StringIO(), record=True)
        render(model, [], warnings, 10.0, source, console=con)
        return con.export_text().splitlines()

    what = f"3 ranks, {model.events:,} events, {model.total_ops():,} ops, "
    wide = shown("/data/run[b]1", 200, [])
    assert wide[0].startswith(f"/data/run[b]1: {what}") and wide[0].endswith("; hang_after 10 s")
    long = "/data/" + "x" * 60 + "/run[b]1"
    narrow = shown(long, 80, ["cannot list /data/a[/]b"])
    assert narrow[0] == f"{long}:"
    assert narrow[1].startswith(f"  {what}") and narrow[1].endswith("; hang_after 10 s")
    assert all(len(line) <= 80 for line in narrow)
    assert "warning: cannot list /data/a[/]b" in narrow
    wide_chars = "/d/" + "甲" * 17  # (17 characters, 34 cells)
    assert len(wide_chars) + 2 + len(narrow[1]) - 2 <= 80
    folded = shown(wide_chars, 80, [])
    assert folded[0] == f"{wide_chars}:" and folded[1].endswith("; hang_after 10 s")


def test_a_crash_of_commscope_itself_exits_3_not_check_s_errors_found(tmp_path, capsys, monkeypatch):
    """An exception no command expected: its traceback and exit 3 where commscope runs as a
    program (Python's own status, 1, read as "errors found" in CI); raised where a caller
    in the same process (a test, a tool) passes argv."""
    import importlib

    diagnose = importlib.import_module("commscope.analysis.diagnose")  # (the package's name is the function)
    store = write_store(tmp_path / "s", healthy_trace(2))

    def broken(*args, **kwargs):
        raise RuntimeError("a bug in the diagnosis")

    monkeypatch.setattr(diagnose, "diagnose", broken)
    monkeypatch.setattr(sys, "argv", ["commscope", "check", str(store)])
    assert cli() == errors.INTERNAL == 3
    err = capsys.readouterr().err
    assert "RuntimeError: a bug in the diagnosis" in err and "Traceback" in err
    assert "commscope check: internal error: this is a bug in commscope (exit 3)" in err
    with pytest.raises(RuntimeError, match="a bug in the diagnosis"):
        cli(["check", str(store)])


def test_an_error_of_the_machine_is_said_and_exits_2_not_taken_for_a_bug(monkeypatch, capsys):
    """A full disk under standard output, another pipe or socket broken: the error's words and
    exit 2, no traceback (exit 3 is commscope's own failure)."""
    import commscope.commands.check as check

    for exc in (OSError(28, "No space left on device"), BrokenPipeError(32, "Broken pipe")):
        def failing(args, exc=exc):
            raise exc

        monkeypatch.setattr(check, "main", failing)
        monkeypatch.setattr(sys, "argv", ["commscope", "check", "anything"])
        assert cli() == 2
        err = capsys.readouterr().err
        assert err == f"commscope check: error: {exc}\n"


def test_a_progress_bar_runs_no_thread_so_a_read_under_it_forks_its_workers(monkeypatch, capsys):
    """``check`` on a terminal: the bar is drawn as the read goes, and a step's line once, not
    by a thread of their own, so a read's workers are forked under either
    (``bulkread.start_method``: no other thread running), as without them; what the bar was
    told last is shown."""
    import threading
    import time

    from commscope.analysis.source import Loading
    from commscope.commands import progress
    from commscope.store import bulkread

    monkeypatch.setenv("FORCE_COLOR", "1")  # (rich draws the bar as on a terminal)
    monkeypatch.setenv("TERM", "xterm")
    monkeypatch.delenv(bulkread.ENV_START, raising=False)
    # (the keepers of keyframes that earlier tests' writers started end once those closed, each
    # reaped by a thread of its own: run after them in one process, this test saw their
    # threads, not the bar's)
    deadline = time.monotonic() + 120
    while any(t.name == "commscope-keeper-reaper" for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.05)
    with progress.bar("reading the trace", True) as update:
        assert update is not None
        assert threading.active_count() == 1 and bulkread.start_method() == "fork"
        update(Loading(1 << 20, 4 << 20, 1234, 5))
        assert threading.active_count() == 1
    err = capsys.readouterr().err
    assert "reading the trace" in err and "1,234 events, 5 ranks" in err
    with progress.status("judging the run's earlier attempts", True):  # (a read of them may go on under it)
        assert threading.active_count() == 1 and bulkread.start_method() == "fork"
    assert "judging the run's earlier attempts" in capsys.readouterr().err


def test_a_trace_of_another_schema_version_is_said_so_not_corrupt(tmp_path, capsys):
    """A trace recorded by a newer commscope read "corrupt beyond use (0 damaged line(s), 835
    invalid event(s))": the version, which the reader knew, said nowhere (helper-198)."""
    events = [dict(e, v=9, type="op2" if e["type"] == "op" and k % 3 == 0 else e["type"])
              for k, e in enumerate(healthy_trace(2, 20))]  # (and a kind of event this one does not know)
    store = write_store(tmp_path / "newer", events)
    capsys.readouterr()
    assert cli(["check", str(store)]) == 2
    err = capsys.readouterr().err
    assert "written by another version of commscope" in err and "corrupt" not in err, err
    assert f"it reads version {SCHEMA_VERSION}" in err, err
