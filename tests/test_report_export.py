"""`commscope report` numbers and `commscope export --chrome` structure."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest
from test_check_cli import hung_trace, write_store

from commscope.analysis import TraceModel, diagnose
from commscope.analysis.chrome import chrome_trace
from commscope.analysis.synth import S, TraceBuilder, healthy_trace
from commscope.cli import main as cli

MS = 1_000_000


def validate_chrome(data: dict) -> dict[str, int]:
    """The JSON Object Format as Perfetto and chrome://tracing read it; spans nest per track."""
    assert isinstance(data, dict) and isinstance(data["traceEvents"], list)
    json.dumps(data)
    counts: dict[str, int] = defaultdict(int)
    spans: dict[tuple, list[tuple[float, float]]] = defaultdict(list)
    named_threads = set()
    for e in data["traceEvents"]:
        ph = e["ph"]
        counts[ph] += 1
        assert ph in ("M", "X", "i", "C"), e
        assert isinstance(e["pid"], int) and isinstance(e.get("tid", 0), int) and isinstance(e["name"], str)
        if ph == "M":
            assert e["name"] in ("process_name", "process_sort_index", "thread_name", "thread_sort_index")
            if e["name"] == "thread_name":
                named_threads.add((e["pid"], e["tid"]))
            continue
        assert isinstance(e["ts"], int | float) and e["ts"] >= 0
        if ph == "X":
            assert e["dur"] >= 0
            spans[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
            assert (e["pid"], e["tid"]) in named_threads
        if ph == "C":
            assert e["args"] and all(isinstance(v, int | float) for v in e["args"].values())
        if ph == "i":
            assert e["s"] in ("g", "p", "t")
    for track, xs in spans.items():
        xs.sort(key=lambda x: (x[0], -x[1]))
        stack: list[float] = []
        for b, end in xs:
            while stack and stack[-1] <= b + 1e-6:
                stack.pop()
            assert not stack or end <= stack[-1] + 1e-6, f"improper nesting on {track}"
            stack.append(end)
    return counts


def test_report_numbers(tmp_path, capsys):
    b = TraceBuilder(4)
    t = b.t0 + S
    for _ in range(10):
        t = b.collective(t, "all_reduce", skew={3: 4 * MS}, latency=2 * MS, shape=(250_000,), site="x.py:3 in f")
        t += MS
    for r in range(4):
        b.async_op(r, t, t + MS, t + 3 * MS, "all_reduce")
    store = write_store(tmp_path / "s", b.sorted_events())
    capsys.readouterr()
    assert cli(["report", str(store), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    ar = rep["ops"]["all_reduce"]
    assert ar["count"] == 11
    assert ar["latency_p50_s"] == pytest.approx(0.002)
    assert ar["busbw_p50"] == pytest.approx(1e6 / 0.002 * 1.5)
    assert ar["skew_p50_s"] == pytest.approx(0.004)
    assert ar["async_wait_s"] == pytest.approx(4 * 0.002)
    assert rep["ranks"]["0"]["wait_s"] == pytest.approx(10 * 0.004)
    assert rep["ranks"]["3"]["wait_s"] == 0
    assert rep["sites"][0]["site"] == "x.py:3 in f" and rep["sites"][0]["wait_s"] == pytest.approx(30 * 0.004)
    assert cli(["report", str(store)]) == 0
    assert "per op" in capsys.readouterr().out


def test_chrome_export_structure(tmp_path, capsys):
    m = TraceModel.from_events(healthy_trace(4, 300))
    counts = validate_chrome(chrome_trace(m, diagnose(m)))
    assert counts["X"] > 300 and counts["C"] > 0
    store = write_store(tmp_path / "s", hung_trace())
    out = tmp_path / "t.json"
    assert cli(["export", str(store), "--chrome", str(out)]) == 0
    data = json.loads(out.read_text())
    counts = validate_chrome(data)
    assert counts["i"] >= 1  # the missing_ranks finding
    names = {e["args"]["name"] for e in data["traceEvents"] if e["name"] == "thread_name"}
    assert "group 0" in names
    x = [e for e in data["traceEvents"] if e["ph"] == "X" and e["args"].get("in_flight")]
    assert len(x) == 2 and x[0]["args"]["seq"] == 2
    done = [e for e in data["traceEvents"] if e["ph"] == "X" and e["args"].get("seq") == 1]
    assert all("busbw_GBps" in e["args"] for e in done)


def test_chrome_export_overlapping_async_ops_get_lanes():
    b = TraceBuilder(1)
    t = b.t0 + S
    b.async_op(0, t, t + 5 * MS, t + 6 * MS, "all_reduce")
    b.async_op(0, t + MS, t + 6 * MS, t + 8 * MS, "all_reduce")  # overlaps without nesting
    b.add(0, t, "sample", cpu=10.0, rss=1 << 20, gpu_util=55.0, gpu_mem=1 << 30)
    m = TraceModel.from_events(b.sorted_events())
    data = chrome_trace(m)
    validate_chrome(data)
    names = {e["args"]["name"] for e in data["traceEvents"] if e["name"] == "thread_name"}
    assert names == {"group 0", "group 0 #2"}
    cn = {e["name"] for e in data["traceEvents"] if e["ph"] == "C"}
    assert {"GPU util %", "GPU memory (MiB)"} <= cn


def test_failures_in_report_and_chrome_export():
    from tui_scenarios import crashed_rank

    from commscope.analysis.report import compute_report

    events, now = crashed_rank()
    m = TraceModel.from_events(events)
    rep = compute_report(m)
    assert rep["ranks"]["1"]["end"] == "crashed (SIGSEGV)"
    assert rep["ranks"]["0"]["end"] == "running" and rep["ranks"]["0"]["failed"] == 1
    # (one all_reduce, failed on ranks 0 and 2: counted once per op, as its count counts it,
    # where "count 1 ... failed 2" read before, helper-203; once per rank per rank)
    assert rep["ops"]["all_reduce"]["failed"] == rep["groups"]["0"]["failed"] == 1
    assert [rep["ranks"][r]["failed"] for r in ("0", "1", "2")] == [1, 0, 1]
    findings = diagnose(m)
    trace = chrome_trace(m, findings)
    validate_chrome(trace)
    marks = [e for e in trace["traceEvents"] if e["ph"] == "i"]
    (crash,) = [e for e in marks if e["cat"] == "finding"]
    assert crash["pid"] == 1 and crash["name"] == "error: rank_crashed"
    assert crash["args"]["culprit_where"] == "data.py:12 in parse_record (inside string_at)"
    assert crash["args"]["consequences"] and crash["args"]["culprits"] == [1]
    failed = sorted(e["pid"] for e in marks if e["cat"] == "failure")
    assert failed == [0, 2] and all("Connection closed" in e["name"] for e in marks if e["cat"] == "failure")


# ---------------------------------------------------------------------- report layout
def _report_text(events: list[dict], width: int, wide: bool = False, source: str = "synthetic-job",
                 windowed: bool = False) -> str:
    import io

    from rich.console import Console

    from commscope.analysis.report import compute_report
    from commscope.commands.report import render

    m = TraceModel.from_events(events)
    buf = io.StringIO()
    con = Console(file=buf, width=width, force_terminal=False, color_system=None)
    render(compute_report(m), source, m.world_size, [], con, wide=wide, windowed=windowed)
    return buf.getvalue()


def _fr_dump_events(rank_delay_ns: int = 3 * MS, n: int = 40, completed: str = "zero") -> list[dict]:
    """Gloo-style Flight Recorder dumps of 3 ranks: rank 1 enters every all_reduce 3 ms late, and the
    entries carry no duration (completion at creation, or none at all)."""
    from commscope.analysis.flight_import import dumps_to_events

    def entry(rank: int, rid: int) -> dict:
        created = 10**18 + rid * 10 * MS + (rank_delay_ns if rank == 1 else 0)
        return {"record_id": rid, "pg_id": 0, "process_group": ("0", "default_pg"), "collective_seq_id": rid + 1,
                "p2p_seq_id": 0, "op_id": rid, "profiling_name": "gloo:all_reduce", "time_created_ns": created,
                "input_sizes": [[1024]], "input_dtypes": ["Float"], "output_sizes": [[1024]],
                "output_dtypes": ["Float"], "state": "completed", "time_discovered_started_ns": None,
                "time_discovered_completed_ns": created if completed == "zero" else None, "retired": True,
                "is_p2p": False, "frames": [{"name": "step", "filename": "train.py", "line": 7}]}

    cfg = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2]"}}
    dumps = {r: {"version": "2.10", "pg_config": cfg, "entries": [entry(r, i) for i in range(n)]} for r in range(3)}
    return dumps_to_events(dumps, {r: 10**18 + 60 * S for r in range(3)})


def test_report_fits_80_columns_with_a_long_exception_and_a_stopped_job():
    """A rank that crashed on a long Gloo error and ranks stopped together by SIGTERM: the
    per-rank table's end column says how each ended in a few words (the whole exception is
    in the findings), and no line runs past 80 columns."""
    from commscope.analysis.synth import T0, TraceBuilder

    b = TraceBuilder(3)
    t = b.collective(T0 + 10 * MS, "all_reduce", latency=5 * MS)
    gloo = ("RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
            "[127.0.0.1]:29500 while waiting for the all_reduce of 4096 floats to complete; the process group "
            "is unusable from here on, and every later collective on it will fail the same way")
    i = b.begin(1, t, "all_reduce")
    b.end(1, i, t + 5 * MS, exc=gloo)
    b.exit(1, t + 6 * MS, reason="exception", exc=gloo)
    for r in (0, 2):
        b.heartbeats(T0, t + S, ranks=[r])
        b.exit(r, t + S, reason="signal", signal="Terminated", src="spool")
    text = _report_text(b.sorted_events(), 80)
    assert max(map(len, text.splitlines())) <= 80, text
    assert "crashed (RuntimeError)" in text and "job stopped (SIGTERM)" in text and "running" not in text


def test_report_reads_in_80_columns(snapshot):
    from tui_scenarios import healthy

    events, _ = healthy()
    text = _report_text(events, 80)
    assert max(map(len, text.splitlines())) <= 80
    for name in ("all_gather_v", "all_reduce", "broadcast", "recv", "send", "left its group (destroy_process_group)"):
        assert name in text  # whole, never "all…"
    assert "…" not in text
    assert "Left out to fit 80 columns" in text
    assert not [line for line in text.splitlines() if line.endswith(" ")]  # (a wrapped note ended in its space)
    assert text == snapshot
    wide = _report_text(events, 80, wide=True)
    assert "skew p99" in wide and "algbw" in wide and "…" not in wide
    assert "skew p99" in _report_text(events, 200)  # a wide terminal shows every column
    assert "Left out" not in _report_text(events, 200)


def test_the_report_s_header_folds_after_a_long_store_url():
    """A long store URL put the header's figures past 80 columns, folded by the terminal
    mid-figure: they go on a line of their own, as ``check``'s do."""
    from tui_scenarios import healthy

    events, _ = healthy()
    url = "redis://:***@redis-primary.training-cluster.internal.example.com:6379/0?job=llama-70b-run-42"
    lines = _report_text(events, 80, source=url).splitlines()
    assert lines[0] == f"{url}:"
    assert lines[1].startswith("  4 ranks, ") and " ops over " in lines[1] and len(lines[1]) <= 80
    assert _report_text(events, 200, source=url).splitlines()[0].startswith(f"{url}: 4 ranks, ")


def test_the_report_s_warnings_wrap_at_its_width():
    """(helper-166) A reader's warning ran to 155 columns in an 80-column report."""
    import io

    from rich.console import Console
    from tui_scenarios import healthy

    from commscope.analysis.report import compute_report
    from commscope.commands.report import render

    events, _ = healthy()
    m = TraceModel.from_events(events)
    buf = io.StringIO()
    con = Console(file=buf, width=80, force_terminal=False, color_system=None)
    said = ("rank 3: 12 line(s) of its stream were lost: retention deleted segment 4 while this reader was "
            "reading it: about 12 of its 4,096 events not read")
    render(compute_report(m), "synthetic-job", m.world_size, [said], con)
    lines = buf.getvalue().splitlines()
    assert max(map(len, lines)) <= 80 and " ".join(lines[1:4]).startswith("warning: rank 3: 12 line(s)"), lines[:4]


def test_a_read_s_span_is_said_in_the_unit_that_reads_and_a_window_s_apart():
    """``report --since 2h`` of a week-long job said "1,152 ops over 606787.70 s", its carried
    events dating from the job's start (check alike, helper-187): the span in the unit that
    reads, and a window's own span beside the whole's."""
    from commscope.commands.options import span_text

    day = 86400 * 10**9
    assert span_text(0, 7 * day) == "168.0 h"
    assert span_text(0, 19 * 10**9) == "19.0 s"
    assert span_text(0, 7 * day, 7 * day - 2 * 3600 * 10**9) == "2.0 h read (of 168.0 h)"
    assert span_text(5, 19 * 10**9, 0) == span_text(5, 19 * 10**9)  # (a window before the read: the whole)


def test_the_report_says_what_it_leaves_out_of_incomplete_collectives():
    """(helper-166) An all_reduce rank 2 never entered was left out of the per-op count and
    bytes too, while the note said only "left out of the latency columns"."""
    b = TraceBuilder(3)
    t = b.t0 + S
    for _ in range(4):
        t = b.collective(t, "all_reduce", latency=2 * MS) + MS
    b.sync(0, t, t + MS, "all_reduce")
    b.sync(1, t, t + MS, "all_reduce")
    text = _report_text(b.sorted_events(), 80)
    row = next(ln for ln in text.splitlines() if ln.startswith("all_reduce"))
    assert row.split()[1] == "4", row  # (the fifth instance, incomplete, not counted)
    said = " ".join(text.split())
    assert ("1 collective instance(s) not complete on every member (a rank that died or hung in it, or one whose "
            "part retention deleted) are left out of the per-op and per-group tables, counts and bytes included (their "
            "failed ops are counted).") in said
    # read with --since: the window's start cuts instances too (helper-181: 35 said to be
    # deaths or retention, where a dead rank read from its keyframe before the window ran them)
    windowed = " ".join(_report_text(b.sorted_events(), 80, windowed=True).split())
    assert ("not complete on every member (a rank that died or hung in it, one whose part retention deleted, or one "
            "some ranks ran before the window read)") in windowed, windowed


def test_report_long_names_run_past_the_width_uncut():
    b = TraceBuilder(2)
    t = b.t0 + S
    for _ in range(3):
        t = b.collective(t, "reduce_scatter_tensor_coalesced_with_a_very_long_name_indeed_for_testing",
                         latency=2 * MS) + MS
    text = _report_text(b.sorted_events(), 40)
    assert "reduce_scatter_tensor_coalesced_with_a_very_long_name_indeed_for_testing" in text
    assert "lat p50" in text and "…" not in text


def test_report_csv_and_json(tmp_path, capsys):
    import csv
    import io

    store = write_store(tmp_path / "s", _fr_dump_events())
    capsys.readouterr()
    assert cli(["report", str(store), "--csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    ar = next(r for r in rows if r["table"] == "op" and r["key"] == "all_reduce")
    assert ar["count"] == "40" and ar["untimed"] == "40" and ar["latency_p50_s"] == ""
    assert {r["table"] for r in rows} >= {"op", "group", "rank"}
    assert cli(["report", str(store), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["ops_untimed"] == 120 and rep["ops"]["all_reduce"]["latency_p50_s"] is None


@pytest.mark.parametrize("completed", ["zero", "none"])
def test_ops_without_timings_no_straggler_and_counted(completed):
    from commscope.analysis.report import compute_report

    events = _fr_dump_events(completed=completed)
    m = TraceModel.from_events(events)
    assert [f.kind for f in diagnose(m, hang_after=5)] == []  # rank 1's 3 ms lateness vs an unknown latency
    rep = compute_report(m)
    assert rep["ops_untimed"] == 120 and rep["ranks"]["1"]["untimed"] == 40
    assert rep["ops"]["all_reduce"]["latency_p50_s"] is None and rep["ops"]["all_reduce"]["busbw_p50"] is None
    assert rep["ops"]["all_reduce"]["skew_p50_s"] == pytest.approx(0.003)  # arrivals are still measured
    text = _report_text(events, 80)
    assert "120 ops without timings" in text
    row = next(ln for ln in text.splitlines() if ln.startswith("all_reduce")).split()
    assert row[1:5] == ["40", "160.0", "KiB", "—"]  # count, bytes, lat p50
    assert rep["ranks"]["1"]["busy_s"] is None


def test_straggler_still_found_among_some_untimed_ops():
    b = TraceBuilder(3)
    t = b.t0 + S
    for k in range(40):
        t = b.collective(t, "all_reduce", skew={1: 5 * MS}, latency=MS if k % 4 else 0) + MS
    kinds = [f.kind for f in diagnose(TraceModel.from_events(b.sorted_events()))]
    assert kinds == ["straggler"]


def test_a_finding_of_thousands_of_culprits_marks_each_with_a_count_not_the_list():
    """(Review) Every culprit's track gets the finding's mark: with 2,048 ranks crashed
    together, a list of them in each mark's args made the export quadratic in them."""
    from commscope.analysis.synth import STOPS, stopped_job

    events, t = stopped_job(4096, "half the ranks crashed together")
    m = TraceModel.from_events(events)
    findings = diagnose(m, t + 60 * S, 2.0)
    assert [(f.kind, len(f.culprits)) for f in findings] == [(k, len(c)) for k, c in
                                                            STOPS["half the ranks crashed together"].expect(4096)]
    trace = chrome_trace(m, findings)
    validate_chrome(trace)
    marks = [e for e in trace["traceEvents"] if e["ph"] == "i" and e["cat"] == "finding"]
    assert sorted(e["pid"] for e in marks) == list(range(2048))
    assert {e["args"]["culprits"] for e in marks} == {"2,048 ranks (0-2047)"}
    assert max(len(json.dumps(e["args"])) for e in marks) < 1000


def test_the_export_walks_each_collective_instance_once(monkeypatch):
    """(A 4,096-rank job's export took 150 s: each op's bandwidth walked its instance's
    members, once per member.)  Each instance is walked once; the figures are as before."""
    from commscope.analysis.bandwidth import op_busbw

    b = TraceBuilder(64, sample_interval=0.2)
    t = b.t0 + S // 10
    for _ in range(5):
        t = b.collective(t, "all_reduce") + 1_000_000
    m = TraceModel.from_events(b.sorted_events())
    alone = {(r, i): op_busbw(m, r, i) for r in m.rank_ids() for i in range(m.n_ops(r))}
    assert all(bw is not None for bw in alone.values())
    walks: list[int] = []
    real = TraceModel.matching
    monkeypatch.setattr(TraceModel, "matching", lambda self, r, i: (walks.append(r), real(self, r, i))[1])
    trace = chrome_trace(m, [])
    assert len(walks) == 5  # one per instance, not 5 x 64
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(spans) == 5 * 64
    for e in spans:
        bw = alone[(e["pid"], int(e["args"]["seq"]) - 1)]
        assert e["args"]["busbw_GBps"] == round(bw["busbw"] / 1e9, 4), e


def test_the_export_is_written_as_it_comes_and_says_the_same(tmp_path, monkeypatch):
    """``write_chrome`` serializes a few events at a time (a 4k-rank job's export held 4.2 GiB
    as one object); what it writes parses to what ``chrome_trace`` gives, metadata added."""
    import io

    from commscope.analysis import chrome

    m = TraceModel.from_events(healthy_trace(4, 300))
    found = diagnose(m)
    whole = chrome_trace(m, found)
    for every in (7, 1, chrome.WRITE_EVENTS):
        monkeypatch.setattr(chrome, "WRITE_EVENTS", every)
        out = io.BytesIO()
        n = chrome.write_chrome(out, m, found, None, {"skipped": {"damaged": 0}})
        got = json.loads(out.getvalue())
        assert n == len(whole["traceEvents"]) and got["traceEvents"] == whole["traceEvents"]
        assert got["metadata"] == {**whole["metadata"], "skipped": {"damaged": 0}}
        assert got["displayTimeUnit"] == "ms"


@pytest.mark.parametrize("failure", ["disk full", "interrupted", "a bug"])
def test_an_export_that_cannot_be_written_leaves_no_half_file(failure, tmp_path, capsys, monkeypatch):
    """A disk that fills, a Ctrl-C or a failure while writing: no half-written trace is left
    (it would mislead a viewer), and a file that was there is as it was."""
    import errno
    import os

    from commscope.commands import export

    def fail(out, *args, **kw):
        out.write(b'{"traceEvents":[')
        if failure == "disk full":
            raise OSError(errno.ENOSPC, "No space left on device")
        raise KeyboardInterrupt if failure == "interrupted" else TypeError("not serializable")

    monkeypatch.setattr(export, "write_chrome", fail)
    store = write_store(tmp_path / "s", hung_trace())
    out = tmp_path / "out"
    out.mkdir()
    there = out / "there.json"
    there.write_text("old")
    os.chmod(there, 0o640)
    expect = {"disk full": 2, "interrupted": 130}
    for target in (out / "t.json", there):
        if failure == "a bug":
            with pytest.raises(TypeError):
                cli(["export", str(store), "--chrome", str(target)])
        else:
            assert cli(["export", str(store), "--chrome", str(target)]) == expect[failure]
    if failure == "disk full":
        assert "cannot write" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["there.json"]  # nothing half-written left
    assert there.read_text() == "old" and (os.stat(there).st_mode & 0o777) == 0o640


def test_an_export_over_a_file_is_private_and_a_link_is_refused(tmp_path, capsys):
    """The file written is the owner's alone, also where it replaces one of another mode; a
    symbolic link at FILE is refused, never followed (tests/test_secrets.py: a FIFO too)."""
    import os

    store = write_store(tmp_path / "s", hung_trace())
    there = tmp_path / "there.json"
    there.write_text("old")
    os.chmod(there, 0o644)
    link = tmp_path / "link.json"
    link.symlink_to(there)
    assert cli(["export", str(store), "--chrome", str(link)]) == 2
    assert "symbolic link" in capsys.readouterr().err
    assert link.is_symlink() and there.read_text() == "old" and (os.stat(there).st_mode & 0o777) == 0o644
    assert cli(["export", str(store), "--chrome", str(there)]) == 0
    assert json.loads(there.read_text())["traceEvents"] and (os.stat(there).st_mode & 0o777) == 0o600
    new = tmp_path / "new.json"
    assert cli(["export", str(store), "--chrome", str(new)]) == 0
    assert (os.stat(new).st_mode & 0o777) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".part")) == []


def test_text_a_dump_holds_that_json_refuses_is_escaped_not_fatal():
    """(Review) A Flight Recorder pickle may hold a file name with a lone surrogate (bytes
    not in UTF-8): orjson refuses it; the event is written escaped, as ``json`` does."""
    import io

    from commscope.analysis.chrome import write_chrome

    b = TraceBuilder(2, sample_interval=0.2)
    t = b.t0 + S
    for r in range(2):
        b.sync(r, t, t + 1_000_000, "all_reduce", site="/home/u/tr\udce9in.py:3 in step", src="fr")
    m = TraceModel.from_events(b.sorted_events())
    out = io.BytesIO()
    write_chrome(out, m, [])
    spans = [e for e in json.loads(out.getvalue())["traceEvents"] if e["ph"] == "X"]
    assert [e["args"]["site"] for e in spans] == ["/home/u/tr\udce9in.py:3 in step"] * 2


def test_an_op_that_states_its_instance_seq_twice_gets_its_own_bandwidth():
    """(Review) Rank 1 states all_reduce seq 5 twice (a hostile trace): the instance is the
    first; the second op asks for itself, as without the export's cache."""
    from commscope.analysis.bandwidth import op_busbw

    b = TraceBuilder(4, sample_interval=0.2)
    t = b.t0 + S
    for r in range(4):
        b.sync(r, t, t + 1_000_000, "all_reduce", seq=5)
    b.sync(1, t + 2_000_000, t + 9_000_000, "all_reduce", seq=5)
    m = TraceModel.from_events(b.sorted_events())
    alone = {(r, i): op_busbw(m, r, i) for r in m.rank_ids() for i in range(m.n_ops(r))}
    cache: dict = {}
    for first in ((1, 1), (0, 0)):  # the odd op asking first, then after the instance is cached
        cache.clear()
        order = [first] + [k for k in alone if k != first]
        assert {k: op_busbw(m, *k, cache) for k in order} == alone


def test_a_summary_whose_op_has_no_name_is_counted_invalid_and_the_report_goes_on(tmp_path, capsys):
    """(The schema took a retention summary's op row without its "op", and report's history,
    which rows by op, raised KeyError, as did the console's history pane.)"""
    b = TraceBuilder(2)
    b.collective(b.t0 + S, "all_reduce")
    store = write_store(tmp_path / "s", b.sorted_events())
    named = {"op": "all_reduce", "group": "0", "count": 2}
    for rank, ops in ((0, [{"count": 3}]), (1, [named])):
        (store / "job-1" / f"rank-{rank:05d}.summary.jsonl").write_text(json.dumps(
            {"type": "summary", "rank": rank, "ts": b.t0, "v": 3, "seg": 7, "events": 10, "size": 100,
             "ops": ops}) + "\n")
    capsys.readouterr()
    assert cli(["report", str(store), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert list(rep["history"]) == ["all_reduce"] and rep["history"]["all_reduce"]["count"] == 2
    assert any("summary: an op without its name: 1" in w for w in rep["warnings"]), rep["warnings"]


def test_each_rank_says_how_many_of_its_ops_retention_summarized(tmp_path, capsys):
    """The history table sums every rank's: how many ops rank 1 ran in the part retention
    deleted was said nowhere, and the per-rank table counted only the ops read (rank 0:
    5,804 of the 21,732 it issued, helper-204).  Each rank's row says it, where any was."""
    b = TraceBuilder(3)
    b.collective(b.t0 + S, "all_reduce")
    store = write_store(tmp_path / "s", b.sorted_events())
    for rank, n in ((0, 5), (1, 7)):
        op = {"op": "all_reduce", "group": "0", "count": n, "minutes": [[b.t0, n, 10 * n, 20, [[3, n]]]]}
        (store / "job-1" / f"rank-{rank:05d}.summary.jsonl").write_text(json.dumps(
            {"type": "summary", "rank": rank, "ts": b.t0, "v": 3, "seg": 7, "events": 10, "size": 100,
             "ops": [op]}) + "\n")
    capsys.readouterr()
    assert cli(["report", str(store), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert {r: (row["count"], row["summarized"]) for r, row in rep["ranks"].items()} == {
        "0": (1, 5), "1": (1, 7), "2": (1, 0)}
    assert rep["history"]["all_reduce"]["count"] == 12
    assert cli(["report", str(store)]) == 0
    lines = capsys.readouterr().out.splitlines()
    head = next(ln for ln in lines if ln.lstrip().startswith("rank ") and "summarized" in ln)
    rows = {ln.split()[0]: ln.split() for ln in lines[lines.index(head) + 2:][:3]}
    assert rows["0"][:3] == ["0", "1", "5"] and rows["1"][:3] == ["1", "1", "7"] and rows["2"][2] != "0", rows


def test_summarized_latency_holds_counts_a_trace_may_state(tmp_path, capsys):
    """Histogram counts up to 2^62 each, over ranks and minutes: summed as int64 they wrapped
    (numpy said so on stderr) and the p50 and p99 came from the wrong buckets."""
    from commscope.store.retention import bucket_mid_s

    b = TraceBuilder(2)
    b.collective(b.t0 + S, "all_reduce")
    store = write_store(tmp_path / "s", b.sorted_events())
    big = (1 << 62) - 1
    for rank in (0, 1):
        op = {"op": "all_reduce", "group": "0", "count": 3, "minutes": [[b.t0, 3, 30, 20, [[3, big], [9, 1]]]]}
        (store / "job-1" / f"rank-{rank:05d}.summary.jsonl").write_text(json.dumps(
            {"type": "summary", "rank": rank, "ts": b.t0, "v": 3, "seg": 7, "events": 10, "size": 100,
             "ops": [op]}) + "\n")
    capsys.readouterr()
    assert cli(["report", str(store), "--json"]) == 0
    got = capsys.readouterr()
    row = json.loads(got.out)["history"]["all_reduce"]
    assert row["latency_p50_s"] == row["latency_p99_s"] == round(bucket_mid_s(3), 6)
    assert "overflow" not in got.err


def test_a_wide_job_lists_the_ranks_furthest_from_the_rest_first(tmp_path, capsys):
    """48 ranks, rank 25 missing from the last all_reduce (one op fewer): the table lists
    the 16 furthest from the rest, rank 25 first, and the median of all; --all and --json
    every rank (a 16k-rank job's report was 16k lines of ranks alike)."""
    from commscope.bench.synthstore import JobShape
    from commscope.bench.synthstore import write_store as write_job

    store = str(tmp_path / "s")
    write_job(store, JobShape(48, 40, fault="missing", hang_after=2.0))
    capsys.readouterr()
    assert cli(["report", store]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith("per rank"))
    assert lines[at] == "per rank: 16 of 48: culprits, then the furthest from the rest (--all)"
    rows = [ln.split()[0] for ln in lines[at + 3:at + 20]]
    assert rows[0] == "25" and rows[-1] == "median" and len(set(rows)) == 17
    assert lines[at + 3].split()[1] == "39" and lines[at + 19].split()[1] == "40"  # (its ops, and the median's)
    assert all(len(ln) <= 80 for ln in lines[at:at + 20])
    assert cli(["report", store, "--all"]) == 0
    every = capsys.readouterr().out.splitlines()
    at = every.index("per rank")
    assert [ln.split()[0] for ln in every[at + 3:at + 51]] == [str(r) for r in range(48)]
    assert cli(["report", store, "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["ranks"]) == 48


def test_the_rarest_ranks_come_first_then_the_furthest_times():
    """``unusual_ranks``: a rank that ended otherwise, ran an op fewer or raised, among ranks
    alike, comes before one whose times are far (ties in rank order); the times by robust
    deviations from the median, so a rank 3x slower beats noise; no more than ``n``."""
    from commscope.analysis.report import median_row, unusual_ranks

    def row(k: int) -> dict:
        return {"count": 400, "bytes": 4096, "busy_s": 1.0 + 0.001 * (k % 5), "latency_p50_s": 0.002,
                "latency_p99_s": None, "wait_s": 0.5 + 0.001 * (k % 7), "async_wait_s": 0.0, "failed": 0,
                "untimed": 0, "end": "running"}

    ranks = {str(k): row(k) for k in range(100)}
    ranks["7"]["end"] = "crashed (SIGSEGV)"
    ranks["50"]["count"] = 399
    ranks["80"]["failed"] = 1
    ranks["33"]["wait_s"] = 1.5
    ranks["61"]["busy_s"] = 1.2
    got = unusual_ranks(ranks, 6)
    assert sorted(got[:3]) == ["50", "7", "80"] and got[3:5] == ["33", "61"] and len(got) == 6
    assert unusual_ranks({"3": row(3), "1": row(1)}, 6) == ["3", "1"]  # (as few as it has, as given)
    med = median_row(ranks)
    assert med["count"] == 400 and med["end"] == "running" and med["latency_p99_s"] is None
    assert med["wait_s"] == pytest.approx(0.503)
    assert unusual_ranks(ranks, 3, first=["61", "99", "7"])[:3] == ["61", "99", "7"]  # (the findings' first)
    # a pipeline's first and last stages run fewer ops (16 of 64): not odd; its straggler is
    pipeline = {str(k): row(k) | {"count": 40 if k < 8 or k >= 56 else 60} for k in range(64)}
    pipeline["20"]["wait_s"] = 5.0
    assert unusual_ranks(pipeline, 4)[0] == "20"
    # bytes all different (uneven splits): not a measure; the crashed rank is still odd
    split = {str(k): row(k) | {"bytes": 4096 + k} for k in range(64)}
    split["9"]["end"] = "crashed (exit 1)"
    assert unusual_ranks(split, 4)[0] == "9"
    # 5 us of async wait where most ranks waited none is not far; a rank 500 ms faster is
    crowd = {str(k): row(k) | {"async_wait_s": 5e-6 if k < 20 else 0.0} for k in range(48)}
    crowd["30"]["busy_s"] = 0.001
    assert unusual_ranks(crowd, 4)[0] == "30"


def test_a_job_of_many_groups_lists_those_its_ranks_waited_in_most(tmp_path, capsys):
    """40 groups of 2 ranks (a pair a stage, as pipelines make): the group where a rank
    arrived 30 ms late comes first of the 16 listed, --all lists every one; a group with an
    op that raised comes before any wait."""
    from commscope.analysis.report import waited_groups

    b = TraceBuilder(4)
    t = b.t0 + S
    for g in range(40):
        b.group(f"pp{g}", [g % 4, (g + 1) % 4])
        t = b.collective(t, group=f"pp{g}", skew={(g + 1) % 4: (30 if g == 17 else 1 + g % 3) * MS}) + MS
    store = write_store(tmp_path / "s", b.sorted_events())
    capsys.readouterr()
    assert cli(["report", str(store)]) == 0
    lines = capsys.readouterr().out.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith("per group"))
    assert lines[at] == "per group: 16 of 40: the findings', then where ranks waited most (--all)"
    assert lines[at + 3].split()[0] == "pp17" and len(lines[at + 3:at + 19]) == 16
    assert cli(["report", str(store), "--all"]) == 0
    every = capsys.readouterr().out.splitlines()
    at = every.index("per group")
    assert sorted(ln.split()[0] for ln in every[at + 3:at + 43]) == sorted(f"pp{g}" for g in range(40))
    rows = {str(g): {"failed": int(g == 3), "wait_s": g / 10} for g in range(40)}
    assert waited_groups(rows, 4) == ["3", "39", "38", "37"]


def test_export_of_a_part_of_a_wide_job(tmp_path, capsys):
    """``export --ranks culprits,0-3``: those ranks' processes only, the finding marked on
    its culprit, the metadata saying which were exported; a choice the trace has none of, or
    that cannot be read, is a clear error (exit 2)."""
    from commscope.bench.synthstore import JobShape
    from commscope.bench.synthstore import write_store as write_job

    store = str(tmp_path / "s")
    write_job(store, JobShape(48, 40, fault="missing", hang_after=2.0))
    out = tmp_path / "t.json"
    assert cli(["export", store, "--chrome", str(out), "--ranks", "culprits,0-3"]) == 0
    assert "5 ranks of 48" in capsys.readouterr().err
    data = json.loads(out.read_text())
    validate_chrome(data)
    assert {e["pid"] for e in data["traceEvents"]} == {0, 1, 2, 3, 25}
    assert [e["pid"] for e in data["traceEvents"] if e.get("cat") == "finding"] == [25]
    assert data["metadata"]["ranks"] == 48 and data["metadata"]["ranks_exported"] == "0-3,25"
    assert cli(["export", store, "--chrome", str(out)]) == 0
    assert {e["pid"] for e in json.loads(out.read_text())["traceEvents"]} == set(range(48))
    assert cli(["export", store, "--chrome", str(out), "--ranks", "100-120"]) == 2
    assert "none of the ranks asked for is in the trace (it has 48: 0-47)" in capsys.readouterr().err
    for bad, says in (("3-1", "a range goes up from its first rank to its last"), ("x", "not a rank, a range")):
        with pytest.raises(SystemExit) as exit_:
            cli(["export", store, "--chrome", str(out), "--ranks", bad])
        assert exit_.value.code == 2 and says in capsys.readouterr().err
    healthy = str(tmp_path / "h")
    write_job(healthy, JobShape(4, 20, fault="healthy"))
    assert cli(["export", healthy, "--chrome", str(out), "--ranks", "culprits"]) == 2
    assert "no finding blames a rank" in capsys.readouterr().err


def _listed(store, capsys, table: str) -> list[str]:
    """The rows ``report`` lists in ``table`` ("per rank", "per group"), each its key (the
    text before two spaces)."""
    capsys.readouterr()
    assert cli(["report", str(store)]) == 0
    lines = capsys.readouterr().out.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith(table))
    end = next((j for j in range(at + 1, len(lines)) if not lines[j].strip()), len(lines))
    return [ln.split("  ")[0] for ln in lines[at + 3:end]]


@pytest.mark.parametrize("case", ["pipeline straggler", "rank that ran no op", "straggler among async waits",
                                  "mismatch"])
def test_the_rank_that_matters_is_listed_first_among_many(tmp_path, capsys, case):
    """helper-60's cases: a straggler in a pipeline whose first and last stages run fewer ops
    (16 such ranks took every place as "rare"); a rank that never ran an op (it had no row);
    a straggler among ranks that waited 5 us on an async op (5 us counted 5 million
    deviations where most waited none); the culprit of a mismatch, whose row is like every
    other (the findings' culprits go first)."""
    b = TraceBuilder(64 if case == "pipeline straggler" else 48)
    t = b.t0 + S
    if case == "pipeline straggler":  # (8 stages of 8; stage s sends to s+1; rank 20 late at every all_reduce)
        for _ in range(20):
            for st in range(7):
                for d in range(8):
                    b.sync(st * 8 + d, t, t + MS, "send", peer=(st + 1) * 8 + d, dir="send")
                    b.sync((st + 1) * 8 + d, t, t + MS, "recv", peer=st * 8 + d, dir="recv")
                t += 2 * MS
            t = b.collective(t, skew={r: (50 if r == 20 else (r * 7) % 5) * MS for r in range(64)}) + MS
        want = "20"
    elif case == "rank that ran no op":
        for _ in range(5):
            t = b.collective(t, ranks=[r for r in range(48) if r != 7]) + MS
        want = "7"
    elif case == "straggler among async waits":
        for _ in range(10):
            t = b.collective(t, skew={30: 50 * MS}) + MS
        b.group("a", list(range(20)))
        for r in range(20):
            b.async_op(r, t, t + 10_000, t + 15_000, "all_reduce", "a")
        b.group("b", list(range(20, 48)))
        b.collective(t, group="b", latency=10_000)
        want = "30"
    else:
        for k in range(10):  # (rank 11's #7 of another dtype of the same size: its row is like every other)
            for r in range(48):
                b.sync(r, t, t + MS, "all_reduce", shape=(12,), dtype="int32" if (r, k) == (11, 6) else "float32")
            t += 2 * MS
        want = "11"
    b.heartbeats(b.t0 + S, t + 5 * S)
    store = write_store(tmp_path / "s", b.sorted_events())
    rows = _listed(store, capsys, "per rank")
    assert rows[0] == want and rows[-1] == "median" and len(rows) == 17


def test_the_groups_that_matter_come_first_among_many(tmp_path, capsys):
    """40 pair groups: one where rank 0 still waits (the finding's group) goes first, before
    those ranks waited in most; p2p ops' async waits count in their "(p2p)" row (they went
    to the group's row, which then held no op)."""
    b = TraceBuilder(4)
    t = b.t0 + S
    for g in range(40):
        b.group(f"pp{g}", [g % 4, (g + 1) % 4])
        t = b.collective(t, group=f"pp{g}", skew={(g + 1) % 4: (1 + g % 3) * MS}) + MS
    for _ in range(5):
        b.async_op(2, t, t, t + MS, "isend", peer=3, dir="send")
        b.async_op(3, t, t, t + 500 * MS, "irecv", peer=2, dir="recv")
        t += 501 * MS
    b.sync(0, t, None, "all_reduce", "pp4")
    b.heartbeats(b.t0 + S, t + 60 * S)
    store = write_store(tmp_path / "s", b.sorted_events())
    rows = _listed(store, capsys, "per group")
    assert rows[:2] == ["pp4", "0 (p2p)"] and len(rows) == 16 and "0" not in rows
    assert cli(["report", str(store), "--json"]) == 0
    groups = json.loads(capsys.readouterr().out)["groups"]
    assert groups["0 (p2p)"]["async_wait_s"] == pytest.approx(5 * (0.5 + 0.001)) and "0" not in groups


def test_the_median_row_says_the_same_ending_in_every_run():
    """An ending half the ranks have, half another: the median row names the same one
    whatever the hash seed (a set's order chose it)."""
    import subprocess
    import sys

    code = ("from commscope.analysis.report import median_row\n"
            "print(median_row({str(k): {'count': 1, 'end': 'running' if k % 2 else 'crashed (exit 1)'} "
            "for k in range(40)})['end'])")
    said = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**__import__("os").environ, "PYTHONHASHSEED": str(seed)}).stdout for seed in range(6)}
    assert said == {"crashed (exit 1)\n"}


def test_a_p2p_op_s_finding_pins_its_group_s_p2p_row():
    """A send of group pp raised: the finding pins the "pp (p2p)" row, where the failure is
    counted, not the collectives' "pp" row (helper-61)."""
    from commscope.analysis.report import waited_groups
    from commscope.commands.report import pinned

    b = TraceBuilder(2)
    t = b.t0 + S
    b.group("pp", [0, 1])
    t = b.collective(t, group="pp") + MS
    i = b.sync(1, t, None, "send", group="pp", peer=0, dir="send")
    b.end(1, i, t + MS, exc="RuntimeError: send failed")
    b.sync(0, t, t + MS, "recv", group="pp", peer=1, dir="recv")
    m = TraceModel()
    m.ingest(b.sorted_events())
    from commscope.analysis.report import compute_report

    groups = compute_report(m)["groups"]
    assert {k: groups[k]["failed"] for k in groups} == {"pp": 0, "pp (p2p)": 1}
    first = pinned(m)
    assert first.ranks[:1] == ["1"] and first.groups[:1] == ["pp (p2p)"]
    assert waited_groups(groups, 1, first.groups) == ["pp (p2p)"]


def test_report_of_a_snapshot_says_it_holds_no_timings(tmp_path, capsys):
    """A ``commscope snapshot`` trace holds where each rank was, not how long its ops took:
    report printed empty tables and "waiting 0 ns" for ranks that had waited seconds, with
    nothing to say why (helper-67).  It says so, and points at check; a recorded trace does
    not get the line."""
    events = hung_trace()
    plain = str(write_store(tmp_path / "plain", events))
    for e in events:
        if e["type"] == "meta":
            e["recorder"] = "snapshot"
    snap = str(write_store(tmp_path / "snap", events))
    for store, said in ((snap, True), (plain, False)):
        capsys.readouterr()
        assert cli(["report", store]) == 0
        out = " ".join(capsys.readouterr().out.split())
        assert ("warning: this is a snapshot (commscope snapshot): it holds where each rank was, not how long "
                f"its ops took, so its ops have no timings; commscope check {store} says what is "
                "wrong" in out) is said, out[:400]
        assert cli(["report", store, "--json"]) == 0
        assert any("this is a snapshot" in w for w in json.loads(capsys.readouterr().out)["warnings"]) is said


def test_report_of_a_snapshot_on_redis_names_its_store_without_the_password(tmp_path, capsys, monkeypatch):
    """(helper-70) The snapshot line printed ``commscope check`` with the store as given: a
    Redis URL's password reached the terminal and CI logs."""
    from commscope.commands import progress

    events = hung_trace()
    for e in events:
        if e["type"] == "meta":
            e["recorder"] = "snapshot"
    snap = str(write_store(tmp_path / "snap", events))
    real = progress.load
    monkeypatch.setattr(progress, "load", lambda store, shown, since=None, max_memory=None: real(snap, shown, since,
                                                                                               max_memory))
    capsys.readouterr()
    assert cli(["report", "redis://:hunter2secret@db.example:6379/0"]) == 0
    out = capsys.readouterr().out
    assert "this is a snapshot" in out and "hunter2secret" not in out
