"""Errors a newcomer makes get a clear message (issue 23, item 6): the command's own name in
every error, no "recording to" for a command that does not exist, no "diagnose with" for a
run that recorded nothing, and a hint while attach waits on a store that does not exist."""

from __future__ import annotations

import subprocess
import sys

import pytest
from tui_scenarios import StaticReader, drive

from commscope.cli import main as cli
from commscope.commands.attach import waiting_hint
from commscope.tui.app import CommscopeApp
from commscope.tui.feed import LIVE, Feed


def test_run_without_a_command_names_itself(capsys):
    assert cli(["run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("commscope run: error: give the command to run after --")


def test_run_of_a_missing_program_says_so_before_recording_anything(tmp_path, capsys):
    assert cli(["run", "--store", str(tmp_path / "t"), "--", "no-such-program-xyz"]) == 2
    err = capsys.readouterr().err
    assert err == "commscope run: error: command not found: no-such-program-xyz\n"
    assert not (tmp_path / "t").exists()


def test_a_run_that_recorded_nothing_does_not_send_you_to_check(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "commscope", "run", "--store", "t", "--", sys.executable, "-c",
                           "print('hi')"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout == "hi\n"
    assert ("nothing was recorded: no process of the command got through init_process_group (none called it, or "
            "not all its ranks came to it)") in proc.stderr  # (one that died before it: the others never got through)
    assert "diagnose with" not in proc.stderr


def test_attach_on_a_store_that_does_not_exist_says_how_one_gets_there(tmp_path):
    store = str(tmp_path / "typo")
    hint = waiting_hint(store)
    assert hint.startswith(f"{store} does not exist yet: start a job with  commscope run --store {store}")
    assert waiting_hint(str(tmp_path)) == "" and waiting_hint("redis://h:6379/0") == ""
    app = CommscopeApp(Feed(StaticReader([]), mode=LIVE, hint=hint), start_feed=False, bell=False)

    async def check(pilot):
        h = app.timeline.size.height
        assert "waiting for the job to write its first events" in app.timeline.render_line(h // 2).text
        assert "does not exist yet" in app.timeline.render_line(h // 2 + 1).text

    drive(app, check, size=(200, 40), loaded=False)


def test_attach_on_what_can_never_become_a_store_is_an_error_not_a_wait(tmp_path, capsys):
    """A file, or a URL of a scheme no store has: check, replay and run refuse them, and attach
    opened the console and waited on them for good (helper-171)."""
    (tmp_path / "notes.txt").write_text("hi\n")
    said = {str(tmp_path / "notes.txt"): f"{tmp_path / 'notes.txt'} is a file, not a trace store",
            "http://x": "no trace store at http:…: a store is a directory or a redis://"}
    for store, why in said.items():
        assert cli(["attach", store]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"commscope attach: error: {why}"), err


def test_run_refuses_an_empty_retention_limit_and_says_the_one_it_keeps(tmp_path, capsys):
    """``--retain ""`` applied the default unsaid; run said no limit at all (helper-173)."""
    assert cli(["run", "--store", str(tmp_path / "t"), "--retain", "", "--", "true"]) == 2
    assert "--retain: cannot read ''" in capsys.readouterr().err
    assert cli(["run", "--store", str(tmp_path / "t"), "--retain", "2GiB,7d", "--", "true"]) == 0
    err = capsys.readouterr().err
    assert f"recording to {tmp_path / 't'} (keeping at most 2.0 GiB per rank, 7 d of history" in err, err
    # (an age as given, not "0.00416667 h"; and the segment being written besides, capped by a
    # size limit so the limit holds: 64 MiB segments kept 62 MB under 1 MiB, helper-187)
    assert cli(["run", "--store", str(tmp_path / "t"), "--retain", "1MiB,15s", "--", "true"]) == 0
    assert ("(keeping at most 1.0 MiB per rank, 15 s of history, and the segment being written, up to 1.0 MiB: "
            "--retain)") in capsys.readouterr().err
    assert cli(["run", "--store", str(tmp_path / "t"), "--retain", "none", "--", "true"]) == 0
    assert "(keeping all of each rank's history: --retain)" in capsys.readouterr().err  # ('everything of')


def test_run_refuses_a_retention_limit_in_the_environment_its_ranks_cannot_read(tmp_path, capsys, monkeypatch):
    """``COMMSCOPE_RETAIN=100KiB`` without ``--retain``: run said "keeping all of each rank's
    history", no reason given, and each rank warned apart (helper-204).  Refused, the
    variable named; a --retain given overrides it."""
    from commscope.store import retention

    monkeypatch.setenv(retention.ENV_RETAIN, "100KiB")
    assert cli(["run", "--store", str(tmp_path / "t"), "--", "true"]) == 2
    err = capsys.readouterr().err
    assert f"${retention.ENV_RETAIN}='100KiB': keep at least 1 MiB per rank" in err and "set it to what --retain takes" in err, err
    assert cli(["run", "--store", str(tmp_path / "t"), "--retain", "2GiB", "--", "true"]) == 0


def test_attach_asked_for_read_processes_it_will_not_start_says_so(tmp_path, capsys):
    for n in ("-1", "65"):
        assert cli(["attach", "--read-processes", n, str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert err == f"commscope attach: error: --read-processes: {n} is not between 0 and 64\n"


def test_bench_large_refuses_formats_and_rank_counts_it_cannot_measure(capsys):
    """A format it does not know measured nothing and said nothing (an empty table); a rank
    count that is not a number was a traceback."""
    from commscope.bench.large import _formats

    refused = {
        ("--formats", "block"): "--formats: 'block' is not a comma-separated list of trace formats: native, json",
        ("--ranks", "abc"): "--ranks: 'abc' is not a comma-separated list of rank counts, each 2 or more",
        ("--ranks", "1024,1"): "--ranks: '1024,1' is not a comma-separated list of rank counts",
        ("--ops", "0"): "--ops: 0 is not 1 or more",
        ("--ops", "many"): "--ops: many is not 1 or more",
    }
    for argv, message in refused.items():
        try:
            code = cli(["bench", "large", *argv])
        except SystemExit as exc:
            code = exc.code
        assert code == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("usage: commscope bench large"), err
        assert f"commscope bench large: error: argument {message}" in err, err
    assert _formats("native,") == ["native"]  # (a trailing comma names no format)
    assert _formats("json,native,json") == ["json", "native"]  # (each measured once)


def refused(argv: list[str], capsys) -> str:
    """What the command said on stderr as it refused ``argv`` with exit 2 (a usage error)."""
    try:
        code = cli(argv)
    except SystemExit as exc:
        code = exc.code
    assert code == 2, argv
    return capsys.readouterr().err


def test_a_hang_after_that_is_no_duration_is_refused_by_every_command_that_takes_one(tmp_path, capsys):
    """"inf", "nan" and 1e300 were taken: diagnosing raised (OverflowError making them ns) or
    the console's worker died; export and replay took a negative one."""
    for verb in ("check", "export", "replay", "attach", "demo", "run"):
        extra = {"export": ["--chrome", str(tmp_path / "x.json")], "run": ["--", "true"]}.get(verb, [])
        for value in ("inf", "nan", "1e300", "-5", "soon"):
            argv = [verb, *([] if verb in ("demo", "run") else [str(tmp_path)]), f"--hang-after={value}", *extra]
            err = refused(argv, capsys)
            assert err.startswith(f"usage: commscope {verb}"), err
            assert "argument --hang-after:" in err and repr(value) in err, err
    from commscope.commands.options import seconds

    assert (seconds("0"), seconds("30"), seconds("2.5"), seconds("1e9")) == (0.0, 30.0, 2.5, 1e9)


def test_a_rank_s_stream_a_negative_top_or_sample_interval_get_a_clear_error(tmp_path, capsys):
    """A rank's stream file given as the store was said to hold "no rank-*.jsonl files";
    ``report --top -3`` silently dropped the call sites' table and ``run --sample-interval
    -1`` was taken as 0.05 (helper-62)."""
    from commscope.store import open_writer

    w = open_writer(str(tmp_path), "job", 0, job_meta={"world_size": 1})
    w.close()
    stream = next((tmp_path / "job").glob("rank-00000*.jsonl"))
    (tmp_path / "notes.txt").write_text("x")
    for argv, said in ((["check", str(stream)], f"is one rank's stream: give the directory that holds the job's "
                                                f"rank-*.jsonl files ({stream.parent})"),
                       (["check", str(tmp_path / "notes.txt")], "is a file, not a trace store"),
                       (["report", str(tmp_path), "--top", "-3"], "argument --top: a number from 0 on, not '-3'"),
                       (["run", "--sample-interval", "-1", "--", "true"], "argument --sample-interval: seconds from 0")):
        err = refused(argv, capsys)
        assert said in err and "Traceback" not in err, err


def test_a_store_url_of_no_backend_s_scheme_is_refused_without_its_credentials(tmp_path, capsys, monkeypatch):
    # Path() turns ``http://u:pw@h`` into ``http:/u:pw@h``, which no redaction rule sees as a URL:
    # the error and attach's hint echoed the password.
    monkeypatch.chdir(tmp_path)
    for name in ("http://u:hunter2pass@h/x", "redis:/:hunter2pass@127.0.0.1:1/0", "postgres://u:hunter2pass@h/db"):
        for command in ("check", "report", "replay"):
            assert cli([command, name]) == 2
            err = capsys.readouterr().err
            assert "hunter2pass" not in err and "no trace store at" in err, err
    assert "hunter2pass" not in waiting_hint("http://u:hunter2pass@h/x")


def test_a_negative_pid_is_no_process_not_a_bug(capsys):
    # psutil.Process(-1) raises ValueError: snapshot and attach --pid -1 ended in a traceback (exit 3).
    for argv in (["snapshot", "--pid", "-1"], ["attach", "--pid", "-1"]):
        assert cli(argv) == 2
        err = capsys.readouterr().err
        assert "no process has pid(s) -1" in err and "Traceback" not in err, err


def test_a_store_to_write_that_looks_like_a_url_of_no_backend_is_refused(tmp_path, capsys, monkeypatch):
    # run/copy/snapshot made a directory 'http:/u:pw@h/x' here and printed its path, password and all.
    monkeypatch.chdir(tmp_path)
    src = tmp_path / "src"
    src.mkdir()
    for argv in (["run", "--store", "http://u:hunter2pass@h/x", "--", "true"],
                 ["run", "--store", "redis:/:hunter2pass@h:1/0", "--", "true"],
                 ["copy", str(src), "http://u:hunter2pass@h/x"]):
        assert cli(argv) == 2
        err = capsys.readouterr().err
        assert "hunter2pass" not in err and "not a trace store" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_run_to_a_store_that_is_a_file_is_refused_before_the_command_starts(tmp_path, capsys):
    # The job ran unrecorded, every rank warned, and run said "no process of the command got
    # through init_process_group".
    (tmp_path / "afile").write_text("x")
    marker = tmp_path / "ran"
    for store in ("afile", "afile/sub"):
        assert cli(["run", "--store", str(tmp_path / store), "--", "touch", str(marker)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("commscope run: error: cannot record to") and "is a file, not a directory" in err
    assert not marker.exists()


def test_an_error_naming_a_file_sends_no_control_sequence_to_the_terminal(tmp_path, capsys):
    # `commscope check *` in a directory others write: a file name holding ESC [ 2 J / OSC 0 was echoed raw.
    evil = tmp_path / "evil\x1b[2J\x1b]0;pwn\x07name"
    evil.write_text("x")
    assert cli(["check", str(evil)]) == 2
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\x07" not in err and "evil\\x1b[2J" in err, err
    assert cli(["run", "--", "nosuch\x1b[2J"]) == 2
    assert "\x1b" not in capsys.readouterr().err


def test_bench_counts_and_durations_that_measure_nothing_are_refused(capsys):
    # Each was a traceback (exit 3: ZeroDivisionError, IndexError, OverflowError, ValueError on nan),
    # ran forever (--iters -1, --rate -1) or printed a table of nothing (--calls -1, --rounds 0).
    for argv in (["overhead", "--calls", "0"], ["overhead", "--rounds", "0"], ["store", "--ranks", "0"],
                 ["store", "--seconds", "nan"], ["varlen", "--ranks", "0"], ["varlen", "--iters", "-1"],
                 ["analysis", "--ranks", "-1"], ["scale", "--seconds", "inf"], ["scale", "--hang-after", "nan"],
                 ["scale", "--rate", "-1"], ["tui", "--ranks", "0"], ["deaths", "--runs", "0"],
                 ["redact", "--rounds", "-1"], ["snapshot", "--runs", "0"]):
        err = refused(["bench", *argv], capsys)
        assert f"commscope bench {argv[0]}: error: argument {argv[1]}: " in err and "Traceback" not in err, err


def test_a_demo_of_more_ranks_than_a_machine_runs_is_refused(capsys):
    # demo --ranks 5000 started 5000 Python processes with torch, until the machine gave out.
    from commscope.scenarios.base import MAX_RANKS
    from commscope.scenarios.runner import DemoJob

    for ranks in ("0", str(MAX_RANKS + 1), "5000"):
        err = refused(["demo", "missing-rank", "--headless", "--ranks", ranks], capsys)
        assert f"--ranks must be from 1 to {MAX_RANKS} (a worker process each), not {ranks}" in err, err
    import pytest

    with pytest.raises(ValueError, match=f"at most {MAX_RANKS} ranks"):
        DemoJob("missing-rank", ranks=MAX_RANKS + 1)


def test_a_sampling_interval_that_is_no_duration_is_refused(capsys):
    # snapshot --interval inf/1e308 was an OverflowError (exit 3) once the job was found; nan went through.
    for verb in ("snapshot", "attach"):
        for value in ("nan", "inf", "1e308"):
            err = refused([verb, "--pid", "1", "--interval", value], capsys)
            assert f"commscope {verb}: error: argument --interval: seconds from 0 to" in err, err


def test_a_hang_after_or_sample_interval_that_is_no_duration_falls_back_with_a_warning(tmp_path, monkeypatch):
    # instrument(hang_after=-1) wrote a meta every reader skipped (check: trace_incomplete, exit 1);
    # nan, inf and 1e300 made every tick raise before its heartbeat and sample.
    import pytest

    from commscope.record.recorder import DEFAULT_HANG_AFTER, Recorder

    for bad in (-1, float("nan"), float("inf"), 1e300):
        with pytest.warns(RuntimeWarning, match="hang_after"):
            assert Recorder(str(tmp_path / "s"), hang_after=bad).hang_after == DEFAULT_HANG_AFTER
        with pytest.warns(RuntimeWarning, match="sample_interval"):
            assert Recorder(str(tmp_path / "s"), sample_interval=bad).sample_interval == 1.0
    monkeypatch.setenv("COMMSCOPE_HANG_AFTER", "nan")
    with pytest.warns(RuntimeWarning, match="hang_after"):
        assert Recorder(str(tmp_path / "s")).hang_after == DEFAULT_HANG_AFTER
    assert Recorder(str(tmp_path / "s"), hang_after=0, sample_interval=0).hang_after == 0


def test_attach_on_a_job_a_redis_does_not_hold_says_it_may_be_a_typo():
    """``attach redis://...?job=NAME`` where Redis holds other jobs but not NAME waited with
    no word (helper-163); a job it holds, or a store holding none yet, gets no hint."""
    from redis_fixture import require_redis_server

    from commscope.bench.redis_server import RedisServer
    from commscope.store import open_writer

    require_redis_server()
    with RedisServer() as server:
        server.start()
        assert waiting_hint(server.url + "?job=nosuchjob") == ""  # (nothing there yet: a job to come)
        w = open_writer(server.url, "real", 0, job_meta={"world_size": 1})
        w.write([b'{"type":"meta","v":3,"rank":0,"ts":1,"world_size":1}'])
        w.close()
        assert waiting_hint(server.url + "?job=nosuchjob") == (
            f"no job 'nosuchjob' in {server.url} yet, which holds 1 other job(s): a typo?  commscope attach "
            f"{server.url} follows the newest  (q quits)")
        assert waiting_hint(server.url + "?job=real") == ""


@pytest.mark.parametrize("argv", [["check", "x", "--since=--"], ["report", "x", "--since=--"],
                                  ["run", "--retain=--", "--", "true"], ["check", "x", "--max-memory=--"]])
def test_an_option_given_a_lone_double_dash_is_a_usage_error(argv, capsys):
    """``--since=--``: argparse gives the option an empty list, unconverted; check crashed on
    it (exit 3), and ``--max-memory=--`` took the default unsaid (helper-187)."""
    with pytest.raises(SystemExit) as done:
        cli(argv)
    assert done.value.code == 2
    option = argv[2].split("=")[0] if argv[0] != "run" else "--retain"
    assert f"argument {option}: expected a value, not '--'" in capsys.readouterr().err


def test_a_negative_value_after_its_option_is_read_as_its_value(tmp_path, capsys):
    """``--since -5m`` read "-5m" as an option: "expected one argument"; ``--since=-5m``
    said what is wrong with it (helper-204).  Both say it alike; a command after ``--`` is
    left as it is."""
    from commscope.cli import _negative_values

    for args in (["--since", "-5m"], ["--since=-5m"]):
        assert cli(["check", str(tmp_path), *args]) == 2
        assert "cannot read --since '-5m'" in capsys.readouterr().err
    assert _negative_values(["run", "--", "train.py", "--lr", "-1"]) == ["run", "--", "train.py", "--lr", "-1"]
