"""SVG snapshots of the console (pytest-textual-snapshot), clocks frozen, synthetic traces.

Update after an intended visual change with: pytest tests/test_tui_snapshots.py --snapshot-update
"""

from __future__ import annotations

from tui_scenarios import healthy, hung_missing_rank, load, make_app, p2p_deadlock

from commscope.tui.feed import REPLAY


async def _loaded(pilot) -> None:
    load(pilot.app)
    await pilot.pause()


def test_healthy_job(snap_compare):
    events, now = healthy()
    app = make_app(events, now)
    assert snap_compare(app, terminal_size=(120, 40), run_before=_loaded)


def test_hung_job_missing_rank_with_stack(snap_compare):
    events, now = hung_missing_rank()
    app = make_app(events, now)

    async def run_before(pilot) -> None:
        await _loaded(pilot)
        await pilot.press("2", "down")  # the unmatched recv: rank 2's stack in the evidence
        await pilot.pause()
        await pilot.press("up")
        await pilot.pause()

    assert snap_compare(app, terminal_size=(120, 40), run_before=run_before)


def test_hung_job_wide(snap_compare):
    events, now = hung_missing_rank()
    app = make_app(events, now)
    assert snap_compare(app, terminal_size=(200, 60), run_before=_loaded)


def test_p2p_deadlock(snap_compare):
    events, now = p2p_deadlock()
    app = make_app(events, now)
    assert snap_compare(app, terminal_size=(120, 40), run_before=_loaded)


def test_replay_mid_way(snap_compare):
    events, _ = healthy()
    app = make_app(events, 0, mode=REPLAY)

    async def run_before(pilot) -> None:
        await _loaded(pilot)
        await pilot.press("g", *["n"] * 30)  # step through the first ops
        await pilot.pause()

    assert snap_compare(app, terminal_size=(120, 40), run_before=run_before)
