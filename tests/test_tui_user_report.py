"""What a user test of the console at 1k-4k ranks found (helper-202): the read-warnings pane
against the header, the history table in a narrow pane, the rank table's sort, the command
palette, counts without separators, and "idle · 0 µs" at a trace's end."""

from __future__ import annotations

import pytest
from rich.console import Console
from tui_scenarios import MS, S, drive, healthy, make_app, wide_fault, wide_missing_rank

from commscope.analysis.source import open_source
from commscope.tui.app import CommscopeApp
from commscope.tui.detail import history_detail
from commscope.tui.feed import REPLAY, Feed
from commscope.tui.rank_table import RankTable, sort_key

pytestmark = pytest.mark.timeout(120)


def _screen_text(app) -> str:
    return "\n".join("".join(seg.text for seg in strip) for strip in app.screen._compositor.render_strips())


def _damaged_store(root, garbage: bool) -> str:
    """``healthy``'s 4 ranks with 5 damaged lines on rank 1 and 3 invalid events on rank 2
    (``garbage``: every line of every rank damaged, nothing readable)."""
    from test_check_cli import write_store

    events, _ = healthy(steps=2)
    store = write_store(root, events)
    files = sorted(store.rglob("rank-*.jsonl"))
    if garbage:
        for f in files:
            f.write_bytes(b"\x00\xff garbage, not a trace\n" * 20)
    else:
        with open(files[1], "ab") as f:
            f.write(b"\x00\xff a damaged line\n" * 5)
        with open(files[2], "ab") as f:
            f.write(b'{"type":"begin","v":3,"rank":2}\n' * 3)
    return str(store)


@pytest.mark.parametrize("garbage", [False, True], ids=["damaged", "unreadable"])
def test_w_says_what_the_header_counts_as_skipped(tmp_path, garbage):
    """The header counted "5 damaged lines skipped" while ``w`` said "the reader has said
    nothing: no event lost, trimmed or skipped": each says what the other does."""
    store = _damaged_store(tmp_path / "s", garbage)
    app = CommscopeApp(Feed(open_source(store), mode=REPLAY, source=store), start_feed=False, bell=False)

    async def check(pilot):
        header = str(app.header_bar.render())
        said = ["no readable event (80 damaged lines skipped)"] if garbage else \
            ["5 damaged lines skipped", "3 invalid events skipped"]
        assert all(s in header for s in said), header
        await pilot.press("w")
        await pilot.pause()
        text = " ".join(app.detail.text(width=200).split())
        assert app.detail.border_title == "read warnings"
        assert "said nothing: no event lost, trimmed or skipped" not in text, text
        assert all(s in text for s in said), text

    drive(app, check, size=(200, 30))


def test_the_history_table_reads_whole_in_the_detail_pane_at_80_and_120_columns():
    """The detail pane is 38 columns at 120x40 and 24 at 80x24: the history's table was cut
    to "all_gather_into_…  …  85.…  …".  Each op's name and figures are whole there."""
    rows = {"all_gather_into_tensor": {"count": 10924, "bytes": 85.3 * 2**30, "latency_p50_s": 384e-6,
                                       "latency_max_s": 500e-6, "failed": 3, "first_ns": 1, "last_ns": 2},
            "reduce_scatter_tensor": {"count": 2728, "bytes": 10.7 * 2**20, "latency_p50_s": None,
                                      "latency_max_s": 2.5, "failed": 0, "first_ns": 1, "last_ns": 2}}
    for width in (24, 38):
        console = Console(width=width, record=True, color_system=None)
        console.print(history_detail(rows, 0, 13652))
        text = console.export_text()
        lines = [line.strip() for line in text.splitlines()]
        assert "…" not in text, text
        assert "all_gather_into_tensor" in lines and "reduce_scatter_tensor" in lines, text
        for pair in ("count 10,924", "bytes 85.3 GiB", "p50 384 µs", "max 500 µs", "failed 3", "count 2,728",
                     "p50 —", "max 2.5 s"):
            assert any(pair in line for line in lines), (pair, text)
    console = Console(width=100, record=True, color_system=None)  # (where it fits: a table)
    console.print(history_detail(rows, 0, 13652))
    assert any(line.split() == ["op", "count", "bytes", "p50", "max", "failed"]
               for line in console.export_text().splitlines())


def test_the_rank_table_sorts_by_a_value_column_once_per_change(monkeypatch):
    """Sorted by CPU, every refresh computed every rank's whole row (its state first: 0.5 s
    at 4,096 ranks), at each step of a replay too.  Now the order is made again only when
    what it depends on changed, and a sample column from the samples alone; the order is the
    column's, as of the cursor."""
    import commscope.tui.rank_table as rank_table

    # (as in a job of more than ALL_LABELS ranks: the last-op column sized by the rows shown,
    # not every rank's label at each refresh)
    monkeypatch.setattr(rank_table, "ALL_LABELS", 16)
    calls: list[int] = []
    row_values = RankTable._row_values
    monkeypatch.setattr(RankTable, "_row_values", lambda self, r, now: calls.append(r) or row_values(self, r, now))
    events, now = wide_missing_rank(world=256, culprit=10)
    app = make_app(events, now, mode=REPLAY)

    async def check(pilot):
        table = app.ranks_table
        shown = table.size.height  # (at most the rows on screen are computed)
        for col in ("cpu", "rss", "host"):
            table.sort_by(col)
            await pilot.pause()
            calls.clear()
            for _ in range(3):  # nothing changed: the order stays, only the rows shown are computed
                app._refresh_table()
            assert len(calls) <= 3 * shown, (col, len(calls))
            app.cursor_ns -= 2 * MS  # a replay step: the samples as of the cursor
            calls.clear()
            app._refresh_table()
            assert len(calls) <= shown, (col, len(calls))
            keys = [sort_key(table._row_values(r, table._now)[col][0]) for r in table.order]
            flagged = len(table.flagged & set(table.order))
            assert keys[flagged:] == sorted(keys[flagged:]), col  # (the findings' ranks first)
        # every column's key, taken alone, is the one its row has
        for col in ("cpu", "rss", "gpu", "gmem", "host", "state", "last", "rank"):
            with app.feed.lock:
                alone = table._sort_keys(col, table.order[:40])
            assert alone == {r: sort_key(table._row_values(r, table._now)[col][0]) for r in table.order[:40]}, col

    drive(app, check, size=(120, 40))


def test_the_command_palette_says_each_command_once_with_its_key():
    """Every palette entry's help line was its title again (each command read twice); the
    history and read-warnings panes had no entry."""
    events, now = healthy(3)
    app = make_app(events, now, mode=REPLAY)

    async def check(pilot):
        commands = list(app.get_system_commands(app.screen))
        titles = [c.title for c in commands]
        assert len(titles) == len(set(titles))
        assert all(c.help and c.help != c.title for c in commands), [c.title for c in commands if c.help == c.title]
        assert "Panels: history" in titles and "Panels: read warnings" in titles
        assert {"Focus: timeline", "Focus: findings", "Focus: ranks", "Timeline: selected op's detail"} <= set(titles)
        await pilot.press("ctrl+p")
        await pilot.press(*"zoom in")
        for _ in range(200):  # (until the palette shows what matched: polled, no time allowed)
            lines = [line.strip() for line in _screen_text(app).splitlines()]
            if "Timeline: zoom in" in lines:
                break
            await pilot.pause()
        assert lines.count("Timeline: zoom in") == 1, lines

    drive(app, check, size=(120, 40))


def test_counts_are_written_with_thousands_separators():
    """"4096 ranks" in the header and "×4088" in the gutter, beside "4,088 ranks" in the
    row's note and the findings: one way to write a count (``fmt.count``)."""
    events, now = wide_missing_rank(world=1200, culprit=10, late=None)
    app = make_app(events, now)

    async def check(pilot):
        header = str(app.header_bar.render())
        assert "1,200 ranks" in header, header
        labels = [row.label for row in app.timeline.rows]
        assert any(label.startswith("×1,1") and label[1:].replace(",", "").isdigit() for label in labels), labels

    drive(app, check, size=(200, 50))
    from commscope.tui.fmt import count

    assert (count(4096), count(1, "rank"), count(4096, "rank"), count(2, "match", "matches")) == \
        ("4,096", "1 rank", "4,096 ranks", "2 matches")


def test_a_replay_at_a_straggler_traces_end_says_the_trace_ends_not_idle_for_0_us():
    """A straggler trace that ends at its last collective: at its end every rank read
    "idle · 0 µs", a time never measured.  Each says its record ends there; mid-trace the
    ranks read as before."""
    events, now = wide_fault("straggler-host", world=64, culprit=10)
    app = make_app(events, now, mode=REPLAY)

    async def check(pilot):
        table = app.ranks_table
        states = {r: table.cells(r)["state"] for r in table.order}
        assert set(states.values()) == {"○ idle · trace ends"}, states
        assert app.findings and app.findings[0].kind == "straggler"
        await pilot.press("g", *["n"] * 20)
        await pilot.pause()
        states = {r: table.cells(r)["state"] for r in table.order}
        assert not any("trace ends" in s or "silent" in s for s in states.values()), states

    drive(app, check, size=(120, 40))


def test_a_replay_still_loading_never_says_a_rank_stopped_recording():
    """A replay posts the part read so far while it loads (``Feed.load_all``): a rank whose
    stream is half read read "idle · silent 572 ms", its record said to stop where the read
    had (helper-208).  Until the load ends, a rank's idle time reads as it is."""
    import dataclasses

    events, now = wide_fault("straggler-host", world=16, culprit=10)
    half = [e for e in events if e["rank"] == 2]
    cut = half[len(half) // 2]["ts"]
    app = make_app([e for e in events if e["rank"] != 2 or e["ts"] <= cut], now, mode=REPLAY)

    async def check(pilot):
        feed = app.feed
        feed.step()
        feed.publish()
        info = dataclasses.replace(feed._info(0), progress=0.5)  # (what load_all posts mid-load)
        feed.info = info
        app.apply(info, [])
        await pilot.pause()
        assert not app.info.loaded
        states = {r: app.ranks_table.cells(r)["state"] for r in (1, 2, 3)}
        assert not any("trace ends" in s or "silent" in s for s in states.values()), states

    drive(app, check, size=(120, 40), loaded=False)


def test_the_unusual_order_follows_ranks_that_turn_dead_while_no_event_comes():
    """A live job of 100 ranks (sorted by how far a rank is from the rest): ranks 80 and 90
    stop writing at different times and turn dead as the clock moves, no event coming.  The
    table's order was kept by the id of the view it was sorted with, an id a later view
    took again, and stayed stale (helper-208).  It follows each view's version and time."""
    from commscope.analysis.synth import T0, TraceBuilder
    from commscope.tui.feed import LIVE
    from commscope.tui.timeline import farthest_first

    world = 100
    b = TraceBuilder(world, hang_after=2.0, ranks_per_host=8)
    t = T0 + 100 * MS
    for _ in range(3):
        t = b.collective(t, "all_reduce", latency=20 * MS, shape=(4096,)) + 10 * MS
    for r in range(world):
        if r not in (80, 90):
            b.sync(r, t, None, "all_reduce", shape=(4096,))
    b.heartbeats(T0, t, interval=S, ranks=[90])
    b.heartbeats(T0, t + 8 * S, interval=S, ranks=[80])
    b.heartbeats(T0, t + 30 * S, interval=S, ranks=[r for r in range(world) if r not in (80, 90)])
    clock = [t + S]
    app = make_app(b.sorted_events(), 0, mode=LIVE)
    app.feed.clock = app.clock = lambda: clock[0]

    async def check(pilot):
        table, feed = app.ranks_table, app.feed
        for _ in range(16):
            clock[0] += S  # (the clock moves, no event)
            feed.publish()
            feed.publish()  # (two publishes between two refreshes of the table)
            table.refresh_ranks(app._now())
            assert table.order[:2] == farthest_first(feed.view, sorted(feed.model.rank_ids()))[:2], clock[0] - t

    drive(app, check, size=(120, 40))


def test_w_says_the_first_window_was_shorter_than_asked_as_the_header_does():
    """attach's first window cut short to fit memory: the header said "last 12 min read, not
    2 h (memory)" and ``w`` "the reader has said nothing" (helper-208)."""
    from commscope.tui.feed import LIVE

    events, now = healthy(steps=2)
    app = make_app(events, now, mode=LIVE)
    app.feed.window = "last 12 min read, not 2 h (memory)"

    async def check(pilot):
        assert str(app.header_bar.render()).count("last 12 min read, not 2 h (memory)") == 1
        await pilot.press("w")
        await pilot.pause()
        text = " ".join(app.detail.text(width=200).split())
        assert "has said nothing" not in text and "last 12 min read, not 2 h (memory): the first window read" in text, text

    drive(app, check, size=(200, 30))
