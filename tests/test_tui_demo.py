"""`commscope demo` in the console: the picker starts, stops and switches scenarios; no orphans."""

from __future__ import annotations

import asyncio
import time

import psutil
import pytest
from textual.screen import Screen
from textual.widgets import OptionList

from commscope.scenarios import SCENARIOS, DemoJob
from commscope.tui.demo_app import DemoApp, ScenarioPicker

pytestmark = pytest.mark.timeout(180)


def gone(pids: list[int]) -> bool:
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            pass
    return True


async def until(pilot, cond, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await pilot.pause(0.1)


def test_picker_starts_stops_and_switches_scenarios_without_orphans(tmp_path):
    app = DemoApp(scenarios=SCENARIOS, job_factory=DemoJob, ranks=3, store=str(tmp_path), bell=False, job_options={"pace": 0.2, "steps": 40})
    all_pids: list[int] = []

    async def run():
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause()
            assert isinstance(app.screen, ScenarioPicker)
            names = app.screen.names
            assert names[0] == "healthy-training" and "missing-rank" in names
            lst = app.screen.query_one("#list")
            assert app.focused is lst and lst.highlighted == 0  # nothing shown yet: the first one
            lst.highlighted = names.index("missing-rank")
            await pilot.pause()
            about = str(app.screen.query_one("#about-text").render())
            assert "What to look for" in about
            await pilot.press("enter")
            await until(pilot, lambda: app.job is not None and app.feed.model.events > 0)
            first = app.job
            all_pids.extend(first.pids)
            assert len(first.pids) == 3 and not isinstance(app.screen, ScenarioPicker)
            await until(pilot, lambda: any(f.kind == "missing_ranks" for f in app.findings))
            await pilot.press("S")  # stop: the hung workers are killed
            await until(pilot, lambda: gone(first.pids), timeout=15)
            painted: list[Screen] = []
            display = app._display
            app._display = lambda screen, update: (painted.append(screen), display(screen, update))
            await pilot.press("m")
            await pilot.pause()
            picker = app.screen
            assert isinstance(picker, ScenarioPicker) and picker.is_running and picker in painted
            lst = picker.query_one("#list", OptionList)
            assert app.focused is lst and names[lst.highlighted] == "missing-rank"  # where the user is
            assert "A rank skips a collective" in str(picker.query_one("#about-text").render())
            await pilot.press("down")  # keys reach the picker
            assert names[lst.highlighted] == names[names.index("missing-rank") + 1]
            lst.highlighted = names.index("pipeline")
            await pilot.press("enter")
            await until(pilot, lambda: app.job is not None and app.job is not first and app.job.pids)
            second = app.job
            all_pids.extend(second.pids)
            assert app.feed.source == str(second.store) and app.findings == []
            await pilot.press("q")  # quitting stops the running scenario too

    asyncio.run(run())
    deadline = time.monotonic() + 15
    while not gone(all_pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert gone(all_pids), [p for p in all_pids if psutil.pid_exists(p)]


def test_unknown_backend_errors_are_shown_not_raised(tmp_path):
    app = DemoApp(scenarios=SCENARIOS, job_factory=DemoJob, scenario="pipeline", ranks=2, backend="nccl", store=str(tmp_path), bell=False)
    shown: list[str] = []
    real = app.notify
    app.notify = lambda message, **kw: (shown.append(message), real(message, **kw))

    async def run():
        async with app.run_test(size=(100, 30)) as pilot:
            await until(pilot, lambda: bool(shown), timeout=30)
            assert "nccl" in shown[0] and "GPU" in shown[0]
            assert app.job is None

    asyncio.run(run())


@pytest.mark.parametrize("keep", [False, True])
def test_the_demo_removes_its_temporary_traces_unless_kept(keep):
    """Without --store a run records into a temporary directory: shown while it runs,
    removed when the demo quits, unless --keep."""
    import os
    import shutil

    app = DemoApp(scenarios=SCENARIOS, job_factory=DemoJob, scenario="pipeline", ranks=2, bell=False, keep=keep,
                  job_options={"pace": 0.2, "steps": 40})
    shown: list[str] = []
    real = app.notify
    app.notify = lambda message, **kw: (shown.append(message), real(message, **kw))
    stores: list[str] = []

    async def run():
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: app.job is not None and app.feed.model.events > 0)
            stores.append(app.job.store)
            assert os.path.isdir(app.job.store)
            assert any(f"trace: {app.job.store}" in m for m in shown), shown
            await pilot.press("q")

    asyncio.run(run())
    assert os.path.isdir(stores[0]) is keep
    shutil.rmtree(stores[0], ignore_errors=True)


@pytest.mark.parametrize("keep", [False, True])
def test_a_headless_demo_removes_its_temporary_trace_unless_kept(keep):
    import io
    import os
    import re
    import shutil

    from rich.console import Console

    from commscope.commands.check import check_store
    from commscope.scenarios import run_headless

    out = io.StringIO()
    con = Console(file=out, width=200)
    code = run_headless("async-leak", ranks=2, pace=0.0, steps=6, console=con, check=check_store, keep=keep)
    assert code == 0, out.getvalue()
    store = re.search(r"trace: (\S+)", out.getvalue()).group(1)
    assert os.path.isdir(store) is keep, out.getvalue()
    assert ("removed the temporary trace" in out.getvalue()) is not keep
    shutil.rmtree(store, ignore_errors=True)


def test_closing_the_terminal_stops_the_workers_and_removes_the_temporary_trace(tmp_path):
    """SIGHUP (the terminal window closed) skips atexit by default: the demo handles it."""
    import os
    import pty
    import signal
    import subprocess
    import sys
    import threading

    master, slave = pty.openpty()
    env = dict(os.environ, TMPDIR=str(tmp_path), TERM="xterm-256color")
    proc = subprocess.Popen([sys.executable, "-m", "commscope", "demo", "pipeline", "--ranks", "2"], stdin=slave,
                            stdout=slave, stderr=slave, env=env, start_new_session=True)
    os.close(slave)

    def drain() -> None:
        try:
            while os.read(master, 65536):
                pass
        except OSError:
            pass

    threading.Thread(target=drain, daemon=True).start()
    try:
        deadline = time.monotonic() + 120  # a guard, not a timing assertion
        runs: list = []
        while not runs:
            runs = [p for p in tmp_path.glob("commscope-demo-pipeline-*") if any(p.rglob("rank-*.jsonl"))]
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        workers = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
        assert workers
        proc.send_signal(signal.SIGHUP)
        assert proc.wait(timeout=60) == 128 + signal.SIGHUP
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    assert not any(p.exists() for p in runs)
    deadline = time.monotonic() + 15
    while not gone(workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert gone(workers)


async def _menu_again(app: DemoApp, pilot) -> None:
    """Close the picker the demo opens on, then open the menu: a new picker (not composed
    until the next pause)."""
    await pilot.pause()
    app.pop_screen()
    await pilot.pause()
    app.action_menu()


def test_the_status_tick_before_a_new_picker_is_composed_waits_for_it(tmp_path):
    """(Under load the app's status tick once came between pushing a new picker and its
    compose: ``#status`` was not there yet, and the tick raised.)  The picker shows the
    status when it mounts."""
    app = DemoApp(scenarios=SCENARIOS, job_factory=DemoJob, ranks=3, store=str(tmp_path), bell=False)

    async def run():
        async with app.run_test(size=(120, 40)) as pilot:
            await _menu_again(app, pilot)  # a new picker, not composed yet
            assert isinstance(app.screen, ScenarioPicker) and not app.screen.query("#status")
            app._job_status()  # the tick
            await pilot.pause()
            assert "no scenario running" in str(app.screen.query_one("#status").render())

    asyncio.run(run())


def test_a_feed_update_a_resize_and_the_panel_key_while_the_menu_is_open_reach_the_console(tmp_path):
    """(CI: a feed update came while the menu's picker was the active screen; the console
    looked its timeline's frame up in the picker and raised.)  The console behind the
    picker takes the update, the resize and the panel key, and shows them when it is back."""
    app = DemoApp(scenarios=SCENARIOS, job_factory=DemoJob, ranks=3, store=str(tmp_path), bell=False)

    async def run():
        async with app.run_test(size=(120, 40)) as pilot:
            await _menu_again(app, pilot)
            await pilot.pause()
            assert isinstance(app.screen, ScenarioPicker)
            app.apply(app.feed.info, [])
            app.action_toggle_panel()
            await pilot.resize_terminal(100, 30)
            await pilot.pause()
            app.pop_screen()
            await pilot.pause()
            assert not isinstance(app.screen, ScenarioPicker)
            assert app.left.current == "gpu" and "GPU per rank" in str(app.left.border_title)
            assert app.top.styles.height is not None and app.top.styles.height.value == 30 // 3

    asyncio.run(run())


def test_the_status_tick_while_the_app_closes_finds_no_picker_shown(tmp_path):
    """(Under load the status tick came after the pilot let go, with no screen left: the
    tick raised ``ScreenStackError``.)  With no screen, the picker is not shown, and the
    tick, the menu's check and a start ask that without raising."""
    app = DemoApp(scenarios=SCENARIOS, job_factory=DemoJob, ranks=3, store=str(tmp_path), bell=False)
    app.picker = ScenarioPicker(SCENARIOS)
    assert not app.screen_stack  # (not running: no screen, as while it closes)
    assert app._picker_shown() is False
    app._job_status()
    assert app.picker is not None


def test_a_store_named_with_brackets_is_shown_as_named(tmp_path):
    """The "started" toast and the picker's status line name the trace as written: Textual
    read "[/]" in a --store path as markup and the app ended with MarkupError."""
    store = tmp_path / "runs[/]1"
    app = DemoApp(scenarios=SCENARIOS, job_factory=DemoJob, scenario="pipeline", ranks=2, store=str(store), bell=False,
                  job_options={"pace": 0.2, "steps": 40})
    shown: list[str] = []
    real = app.notify
    app.notify = lambda message, **kw: (shown.append(message), real(message, **kw))
    status: list[str] = []

    async def run():
        async with app.run_test(size=(120, 40), notifications=True) as pilot:
            await until(pilot, lambda: app.job is not None and app.feed.model.events > 0)
            if not isinstance(app.screen, ScenarioPicker):
                app.action_menu()
            await until(pilot, lambda: bool(app.screen.query("#status")))
            app._job_status()
            await pilot.pause()
            status.append(str(app.screen.query_one("#status").render()))
            await pilot.press("q")

    asyncio.run(run())
    assert getattr(app, "_exception", None) is None
    assert any(f"trace: {store}" in m for m in shown), shown
    assert f"store {store}" in status[0]
