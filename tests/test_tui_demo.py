"""`commscope demo` in the console: the picker starts, stops and switches scenarios; no orphans."""

from __future__ import annotations

import asyncio
import time

import psutil
import pytest

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
            names = app.picker.names
            assert names[0] == "healthy-training" and "missing-rank" in names
            lst = app.picker.query_one("#list")
            lst.highlighted = names.index("missing-rank")
            await pilot.pause()
            about = str(app.picker.query_one("#about-text").render())
            assert "What to look for" in about
            await pilot.press("enter")
            await until(pilot, lambda: app.job is not None and app.feed.model.events > 0)
            first = app.job
            all_pids.extend(first.pids)
            assert len(first.pids) == 3 and not isinstance(app.screen, ScenarioPicker)
            await until(pilot, lambda: any(f.kind == "missing_ranks" for f in app.findings))
            await pilot.press("S")  # stop: the hung workers are killed
            await until(pilot, lambda: gone(first.pids), timeout=15)
            await pilot.press("m")
            assert isinstance(app.screen, ScenarioPicker)
            lst = app.picker.query_one("#list")
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
