"""SVG snapshots of the console (pytest-textual-snapshot), clocks frozen, synthetic traces.

Update after an intended visual change with: pytest tests/test_tui_snapshots.py --snapshot-update
"""

from __future__ import annotations

import pytest
from tui_scenarios import (
    foreign_streams,
    healthy,
    hung_missing_rank,
    load,
    make_app,
    p2p_deadlock,
    wide_missing_rank,
)

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
        await pilot.press("2", "down")  # the findings pane, its one finding: rank 2's stack in the evidence
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


def test_foreign_streams_apart(snap_compare):
    """Two streams of another job (a rank file copied in) next to a 4-rank job's: the rank
    table and the timeline list them last, greyed, "⊘ foreign · another job"."""
    events, now = foreign_streams()
    app = make_app(events, now, mode=REPLAY)
    assert snap_compare(app, terminal_size=(120, 40), run_before=_loaded)


def test_replay_mid_way(snap_compare):
    events, _ = healthy()
    app = make_app(events, 0, mode=REPLAY)

    async def run_before(pilot) -> None:
        await _loaded(pilot)
        await pilot.press("g", *["n"] * 30)  # step through the first ops
        await pilot.pause()

    assert snap_compare(app, terminal_size=(120, 40), run_before=run_before)


async def _delayed_feed(pilot, events: list[dict]) -> None:
    """The race of a busy machine: the first layouts (resizes) arrive while the replay is
    still loading (part of the trace in the model, no clock reading yet); the rest comes
    after.  The first painted frame must still show the whole trace with true labels."""
    app = pilot.app
    feed = app.feed
    k = len(events) // 3
    feed.reader.events = list(events[:k])
    feed.step()  # the feed thread, mid-load
    w, h = app.size
    await pilot.resize_terminal(w - 1, h)
    await pilot.pause()
    await pilot.resize_terminal(w, h)
    await pilot.pause()
    feed.reader.events = list(events[k:])
    app.apply(feed.load_all(), feed.findings)
    await pilot.pause()


def _check_first_frame(app) -> None:
    tl = app.timeline
    m = app.feed.model
    assert m.start_ns - 10 * tl.npc <= tl.t0 <= m.start_ns  # the whole trace in view from its start
    assert tl.t1() >= m.end_ns
    labels = [t[1:] for t in app.ruler.render().plain.split() if t.startswith("┆")]
    assert labels and labels[0] in ("+0s", "+0ms", "+0.0s"), labels
    assert not any(t.startswith("-") for t in labels), labels  # never "-1795354608.5s"


@pytest.mark.parametrize("size", [(80, 24), (200, 60)])
def test_first_frame_under_delayed_feed(snap_compare, size):
    events, _ = healthy()
    app = make_app([], 0, mode=REPLAY)
    seen = {}

    async def run_before(pilot) -> None:
        await _delayed_feed(pilot, events)
        _check_first_frame(pilot.app)
        seen["ok"] = True

    assert snap_compare(app, terminal_size=size, run_before=run_before)
    assert seen


@pytest.mark.parametrize("size", [(80, 24), (200, 60)])
def test_fsdp2_hang_opens_on_its_finding(snap_compare, size):
    from tui_scenarios import fsdp2_hang

    events, now = fsdp2_hang()
    app = make_app(events, now)

    async def run_before(pilot) -> None:
        await _loaded(pilot)
        a = pilot.app
        assert a.findings and a.findings[0].kind == "missing_ranks" and a.findings[0].culprits == [3]
        assert a.detail.border_title == "finding · missing_ranks"
        assert a.timeline.sel == a._finding_op(a.findings[0])
        assert a.feed.model.label(*a.timeline.sel).startswith("all_gather_into_tensor #")

    assert snap_compare(app, terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", [(80, 24), (200, 60)])
def test_finding_with_per_rank_tables(snap_compare, size):
    """A mismatch whose all_reduce then failed with a long Gloo error: the per-rank tables
    keep op names and shapes whole (never 'all_reduc/e'), with call sites and the exception
    on lines of their own where the pane is narrow."""
    from tui_scenarios import mismatch_after_failure

    events, now = mismatch_after_failure()
    app = make_app(events, now)

    async def run_before(pilot) -> None:
        await _loaded(pilot)
        a = pilot.app
        assert a.findings[0].kind == "collective_mismatch" and a.findings[0].culprits == [1]
        assert a.detail.border_title == "finding · collective_mismatch"
        text = a.detail.text(width=a.detail.content_size.width)  # as wide as the pane shows it
        words = text.split()
        assert "all_reduce" in words and "broadcast" in words and "4096" in text, text
        a.clear_notifications()  # the alert's toast would hide the pane
        await pilot.pause()

    assert snap_compare(app, terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", [(80, 24), (200, 60)])
@pytest.mark.parametrize("job", ["gpu", "cpu"])
def test_gpu_panel(snap_compare, size, job):
    """`r` shows the GPU panel: GPU use per rank, or for a CPU-only job CPU and RSS with the
    reason in a title line that is cut to the pane and never runs into the next one."""
    events, now = healthy() if job == "gpu" else hung_missing_rank()
    app = make_app(events, now)

    async def run_before(pilot) -> None:
        await _loaded(pilot)
        await pilot.press("r")
        pilot.app.clear_notifications()  # a hung job's alert would hide the panes
        await pilot.pause()
        assert pilot.app.gpu.mode == job

    assert snap_compare(app, terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", [(80, 24), (200, 60)])
def test_4096_ranks_say_what_is_wrong_on_the_first_screen(snap_compare, size):
    """4,096 ranks: the culprit and its host on top, the 4,088 others one row, the finding open."""
    events, now = wide_missing_rank()
    app = make_app(events, now)
    assert snap_compare(app, terminal_size=size, run_before=_loaded)


def test_4096_ranks_as_a_heatmap(snap_compare):
    """The heat mode (c three times from behaviour): 4,096 ranks in the timeline's lines, two
    blocks a line.  The toasts each press raises are cleared: whether the first had timed out
    by the snapshot depended on how long the modes took to paint (it failed once the nodes
    and blocks modes painted faster)."""
    events, now = wide_missing_rank()
    app = make_app(events, now)

    async def run_before(pilot) -> None:
        await _loaded(pilot)
        await pilot.press("c", "c", "c")
        await pilot.pause()
        assert pilot.app.timeline.mode == "heat"
        pilot.app.clear_notifications()
        await pilot.pause()

    assert snap_compare(app, terminal_size=(200, 60), run_before=run_before)


@pytest.mark.parametrize("size", [(80, 24), (200, 60)])
def test_4096_ranks_by_host(snap_compare, size):
    """By node (c once from behaviour): 4,096 ranks, 8 a host, by host then behaviour: the
    culprit pinned, its host's line, and the 511 hosts alike as one line with their count."""
    events, now = wide_missing_rank()
    app = make_app(events, now)

    async def run_before(pilot) -> None:
        await _loaded(pilot)
        await pilot.press("c")
        await pilot.pause()
        assert pilot.app.timeline.mode == "nodes" and len(pilot.app.timeline.rows) == 3
        pilot.app.clear_notifications()
        await pilot.pause()

    assert snap_compare(app, terminal_size=size, run_before=run_before)
