"""Names from a trace or from the user are shown as written, never read as rich or Textual
markup: "[b]" in a host, a group or a path was taken for bold and lost, and "[/]" (a Gloo
error from a source build says "[/opt/pytorch/third_party/gloo/...]") raised MarkupError
where it was drawn, ending ``check`` in a traceback with exit 1 (its "errors found") and
the console with it."""

from __future__ import annotations

import asyncio
import io

import pytest
from rich.console import Console, Group
from test_check_cli import write_store
from textual.widgets._toast import Toast
from tui_scenarios import crashed_rank, drive, healthy, load, make_app

from commscope.analysis import Finding, evidence
from commscope.analysis.collectives import Straggler
from commscope.analysis.completeness import ReaderProblem
from commscope.analysis.synth import S, TraceBuilder
from commscope.cli import main as cli
from commscope.tui.detail import finding_detail, history_detail
from commscope.tui.feed import LIVE, REPLAY

pytestmark = pytest.mark.timeout(120)

#: An exception's text, as a rank raised it (a Gloo error's "[/opt/...]" prefix is cut off where shown)
RAISED = "ValueError: bad bracket [/] in config"


def shown(renderable: object, width: int = 160) -> str:
    con = Console(file=io.StringIO(), width=width)
    con.print(renderable)
    return con.file.getvalue()


def hung(group: str, op: str, site: str, host: str) -> list[dict]:
    """3 ranks, rank 2 never enters the last ``op`` of ``group``, called at ``site``."""
    b = TraceBuilder(3)
    for e in b.events:
        if e["type"] == "meta":
            e["host"] = host
    b.group(group, [0, 1, 2])
    t = b.collective(b.t0 + S, op, group, site=site)
    b.sync(0, t, None, op, group, site=site)
    b.sync(1, t, None, op, group, site=site)
    b.heartbeats(t, t + 5 * S)
    return b.sorted_events()


def test_check_shows_a_group_op_and_site_as_named(tmp_path, capsys):
    store = write_store(tmp_path / "s", hung("g[/]x", "all_reduce[/]", "[b]train.py:9 in step", "node[/]1"))
    assert cli(["check", str(store)]) == 1
    out = capsys.readouterr().out
    assert "missing_ranks  group g[/]x #2 all_reduce[/]" in out  # (the panel's title)
    assert "[b]train.py:9 in step" in out


def test_check_shows_a_crashed_ranks_host_and_exception_as_named(tmp_path, capsys):
    events, _ = crashed_rank()
    for e in events:
        if e["type"] == "meta":
            e["host"] = "node[/]3"
        if e.get("exc"):
            e["exc"] = RAISED
    assert cli(["check", str(write_store(tmp_path / "s", events))]) == 1
    out = capsys.readouterr().out
    assert "node[/]3" in out
    assert "bad bracket [/] in config" in out


def test_evidence_parts_show_text_as_written():
    """``kv`` (a straggler's host), the plain block a kind without its own renderer and the
    fallback show (a reader's error naming its path), and the retention history's op names."""
    ev = Straggler(host="node[/]2", host_ranks=[8, 9], group="0", collectives=50, last_share=0.9,
                   median_lateness_s=0.01, p90_lateness_s=0.02, median_latency_s=0.001, first_seq=1, last_seq=50,
                   ops=["all_reduce"])
    assert "host node[/]2" in shown(Group(*evidence.render(Finding("straggler", "0", 50, "all_reduce", [8, 9],
                                                                     [8, 9], "m", ev))))
    ev.host = "node[i]2"
    assert "host node[i]2" in shown(Group(*evidence.render(Finding("straggler", "0", 50, "all_reduce", [8, 9],
                                                                     [8, 9], "m", ev))))
    problem = ReaderProblem(reader_error="[Errno 13] Permission denied: '/data/run[/]3/rank0.jsonl'")
    f = Finding("trace_incomplete", None, None, None, [], [], "the trace could not be read", problem)
    assert "'/data/run[/]3/rank0.jsonl'" in shown(finding_detail(f))

    class Odd(evidence.RawEvidence):
        def render(self, f: Finding) -> list:
            raise TypeError("a part of an unexpected shape")

    f = Finding("rank_crashed", None, None, None, [0], [0], "m", Odd({"exc": "ValueError: a [/] b", "[b]key": "h[b]x"}))
    text = shown(Group(*evidence.render(f)))
    assert "ValueError: a [/] b" in text and "[b]key" in text and "h[b]x" in text
    row = {"count": 3, "bytes": 10, "latency_p50_s": 0.001, "latency_max_s": 0.002, "failed": 0, "first_ns": 0,
           "last_ns": 0}
    text = shown(history_detail({"all_reduce[/]": row, "[b]my_op": row}, 0, 6))
    assert "all_reduce[/]" in text and "[b]my_op" in text


def test_the_console_alerts_and_details_show_names_as_written():
    """A live console's alert (a toast: Textual's own markup) of a crash whose exception
    has "[/]" in it, and a replay's op detail of a call site with
    "[/]" in it, which the console selects by itself."""
    events, now = crashed_rank()
    for e in events:
        if e.get("exc"):
            e["exc"] = RAISED
        if e["type"] == "meta":
            e["host"] = "node[/]3"
    app = make_app(events, now, mode=LIVE)

    async def alerts() -> None:
        async with app.run_test(size=(120, 40), notifications=True) as pilot:  # (its default shows no toast)
            load(app)
            await pilot.pause()
            toasts.extend(app.screen.query(Toast))
            for toast in toasts:
                painted.append(str(toast.render()))

    toasts: list[Toast] = []
    painted: list[str] = []
    asyncio.run(alerts())
    assert getattr(app, "_exception", None) is None
    assert toasts and any("bad bracket [/] in config" in text for text in painted), painted

    events, now = healthy(3)
    for e in events:
        if e.get("site"):
            e["site"] = "train[/].py:9 in step"
    app = make_app(events, now, mode=REPLAY)
    seen: list[str] = []

    async def detail(pilot) -> None:
        await pilot.pause()
        seen.append(app.detail.text(200))

    drive(app, detail)
    assert getattr(app, "_exception", None) is None
    assert "train[/].py:9 in step" in seen[0]


def test_a_store_named_with_brackets_is_shown_as_named(tmp_path, monkeypatch, capsys):
    """The progress bar of a load on a terminal, and a headless demo's first line."""
    from commscope.commands import progress
    from commscope.scenarios import runner

    monkeypatch.setenv("FORCE_COLOR", "1")  # (rich draws the bar as on a terminal)
    monkeypatch.setenv("TERM", "xterm")
    with progress.bar("reading /data/p[/]q", True) as update:
        assert update is not None
    assert "/data/p[/]q" in capsys.readouterr().err

    def no_start(self) -> None:
        raise RuntimeError("not started: the header is what is looked at")

    monkeypatch.setattr(runner.DemoJob, "start", no_start)
    con = Console(file=io.StringIO(), width=200)
    with pytest.raises(RuntimeError, match="not started"):
        runner.run_headless("healthy-training", store=str(tmp_path / "demo[b]y"), check=lambda *a, **k: 0,
                            console=con)
    assert f"trace: {tmp_path / 'demo[b]y'}" in con.file.getvalue()



def test_a_headless_demo_names_its_removed_temporary_trace_as_named(tmp_path, monkeypatch):
    """The line that says the temporary trace was removed (its directory under $TMPDIR)."""
    import tempfile

    from commscope.scenarios import runner

    tmp = tmp_path / "t[/]x"
    tmp.mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.setattr(runner.DemoJob, "start", lambda self: None)
    monkeypatch.setattr(runner.DemoJob, "wait", lambda self, timeout=None: True)
    monkeypatch.setattr(runner.DemoJob, "stop", lambda self: None)
    con = Console(file=io.StringIO(), width=300)
    assert runner.run_headless("healthy-training", check=lambda *a, **k: 0, console=con, keep=False) == 0
    assert f"removed the temporary trace {tmp}" in con.file.getvalue()


def test_a_headless_demo_on_a_server_says_its_trace_stays_there(tmp_path, monkeypatch):
    """A demo recorded to Redis: its trace is its job there, kept; only the run's logs were
    temporary (helper-163: it said it removed a trace it kept)."""
    import tempfile

    from commscope.scenarios import runner

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(runner.DemoJob, "start", lambda self: None)
    monkeypatch.setattr(runner.DemoJob, "wait", lambda self, timeout=None: True)
    monkeypatch.setattr(runner.DemoJob, "stop", lambda self: None)
    con = Console(file=io.StringIO(), width=300)
    assert runner.run_headless("healthy-training", store="redis://127.0.0.1:1/0", check=lambda *a, **k: 0,
                               console=con, keep=False) == 0
    said = con.file.getvalue()
    assert "removed its temporary logs; the trace stays in redis://127.0.0.1:1/0 (--keep keeps it)" in said, said
    assert "removed the temporary trace" not in said and not list(tmp_path.glob("commscope-demo-*"))
