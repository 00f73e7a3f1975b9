"""The console driven with Textual's Pilot: attach, replay controls, selection, findings."""

from __future__ import annotations

import dataclasses
import time

import pytest
from readers import by_workers
from tui_scenarios import MS, S, StaticReader, drive, healthy, hung_missing_rank, load, make_app

from commscope.analysis.source import open_source
from commscope.analysis.synth import TraceBuilder
from commscope.events import encode
from commscope.store import open_writer
from commscope.store.base import ReadStats, TraceReader
from commscope.store.readahead import ReadAhead
from commscope.tui.app import CommscopeApp
from commscope.tui.feed import LIVE, REPLAY, Feed
from commscope.tui.screens import HelpScreen

pytestmark = pytest.mark.timeout(120)


async def wait_for(pilot, cond, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await pilot.pause(0.05)


async def rows_in(pilot, mode: str):
    """The app's timeline, its rows cycled (``c``) to ``mode`` and painted."""
    tl = pilot.app.timeline
    while tl.mode != mode:
        await pilot.press("c")
    await pilot.pause()
    return tl


@pytest.mark.parametrize("ahead", [False, True], ids=["read_here", "read_ahead"])
def test_attach_waits_for_the_job_then_follows_it_to_the_end(tmp_path, ahead):
    """Read in the console's process, or ahead in a read process (``attach``'s way where it
    has two cores), which waits for the job as the console would, and ends with it."""
    store = tmp_path / "trace"
    # nothing written yet
    reader = ReadAhead(str(store), None, Feed.pacing()) if ahead \
        else open_source(store, wait=True)
    feed = Feed(reader, mode=LIVE, source=str(store))
    app = CommscopeApp(feed, bell=False)
    t0 = time.time_ns()
    b = TraceBuilder(2, t0=t0)
    b.collective(t0, latency=5 * MS)
    first = b.sorted_events()

    async def check(pilot):
        await pilot.pause(0.3)
        assert app.info.waiting and "waiting for the job" in str(app.header_bar.render())
        writers = {r: open_writer(store, "job1", r, {"world_size": 2}) for r in range(2)}
        for r in range(2):
            writers[r].write([encode(e) for e in first if e["rank"] == r])
        # (the view may be published after the count moved: a publish that took over 20 ms,
        # on a loaded machine, is put off up to a second, ``Feed.ingest``)
        await wait_for(pilot, lambda: app.info.events == len(first)
                       and [row.key for row in app.timeline.rows] == ["r0", "r1"])
        assert app.info.mode == LIVE and not app.info.ended
        n = len(b.events)
        b.collective(t0 + 50 * MS, latency=5 * MS)
        for r in range(2):
            b.exit(r, t0 + 60 * MS)
        for r in range(2):
            writers[r].write([encode(e) for e in b.events[n:] if e["rank"] == r])
        await wait_for(pilot, lambda: app.info.ended)
        assert app.feed.model.total_ops() == 4
        assert "ENDED" in str(app.header_bar.render())
        await pilot.press("q")

    drive(app, check, loaded=False)
    assert feed.reader is reader and feed.restarts == 0
    reader.close(**({"grace_s": 120.0} if ahead else {}))  # (a bound on a loaded machine, not a margin)
    if ahead:
        assert reader.procs[0].returncode == 0  # (it saw its stdin end: not killed)


@pytest.mark.parametrize("wide", [False, True], ids=["4-ranks", "4096-ranks"])
def test_replay_controls_move_the_cursor(wide):
    """Start, next and previous op, speed, play and pause, end: at 4,096 ranks as at 4 (where
    the ops of a collective begin at once, a step to the next op may stay at that time)."""
    from tui_scenarios import wide_missing_rank

    events, _ = wide_missing_rank() if wide else healthy(4)
    app = make_app(events, 0, mode=REPLAY)

    async def check(pilot):
        m = app.feed.model
        assert app.cursor_ns == m.end_ns  # opens showing the whole trace
        await pilot.press("g")
        assert app.cursor_ns == m.start_ns
        await pilot.press("n")
        first = app.cursor_ns
        assert first > m.start_ns and app.timeline.sel is not None
        rank, idx = app.timeline.sel
        assert int(m.ranks[rank].begin[idx]) == first
        await pilot.press("n")
        second = app.cursor_ns
        await pilot.press("n")
        assert app.cursor_ns >= second >= first and (wide or app.cursor_ns > second > first)
        await pilot.press("p")  # back to the op before: the second one, selected
        assert app.cursor_ns == second
        rank, idx = app.timeline.sel
        assert int(m.ranks[rank].begin[idx]) == second
        await pilot.press("right_square_bracket", "right_square_bracket")
        assert app.speed == 5
        await pilot.press("left_square_bracket")
        assert app.speed == 2
        while app.speed > 0.1:
            await pilot.press("left_square_bracket")
        before = app.cursor_ns
        await pilot.press("space")
        assert app.playing
        await wait_for(pilot, lambda: app.cursor_ns > before)  # the 10 Hz replay clock ticked
        await pilot.press("space")
        assert not app.playing and app.cursor_ns > before
        await pilot.press("G")
        assert app.cursor_ns == m.end_ns
        assert "REPLAY" in str(app.header_bar.render())

    drive(app, check)


async def zoom_pan_follow(pilot, tl, now: int) -> None:
    """+ and - zoom in and back out; h pans left (no longer following), l back; f follows the
    clock again (it in view)."""
    npc = tl.npc
    await pilot.press("plus")
    assert tl.npc == npc // 2
    await pilot.press("minus")
    assert tl.npc == npc
    t0 = tl.t0
    await pilot.press("h")
    assert tl.t0 < t0 and not tl.follow
    await pilot.press("l")
    assert tl.t0 == t0
    await pilot.press("f")
    assert tl.follow and tl.t0 < now < tl.t1()


def test_select_zoom_pan_and_follow():
    events, now = hung_missing_rank()
    app = make_app(events, now)

    async def check(pilot):
        tl = app.timeline
        tl.sel = None
        tl.focus()
        await pilot.press("down", "down")  # rank 2
        assert tl.sel_row == 2
        await pilot.press("left")
        assert tl.sel is not None and tl.sel[0] == 2
        assert app.feed.model.label(*tl.sel).startswith("recv #1")
        await pilot.pause()
        assert app.detail.border_title == "op · rank 2"
        await zoom_pan_follow(pilot, tl, now)
        await pilot.click("#timeline", offset=(30, 0))  # rank 0's row, mid timeline
        assert tl.sel is not None and tl.sel[0] == 0

    drive(app, check)


def test_choosing_a_finding_shows_its_evidence_and_moves_the_timeline():
    events, now = hung_missing_rank(refused=True)
    app = make_app(events, now)

    async def check(pilot):
        kinds = [f.kind for f in app.findings]
        assert kinds == ["missing_ranks", "op_failed"]
        assert app.detail.border_title == "finding · missing_ranks"  # opened by itself
        assert app.timeline.sel[0] in (0, 1, 3)  # the waiting collective
        await pilot.press("2", "down")
        await pilot.pause()
        assert app.detail.border_title == "finding · op_failed"
        rank, idx = app.timeline.sel
        assert rank == 3 and app.feed.model.label(rank, idx).startswith("broadcast")
        text = " ".join(app.detail.text().split())
        assert "raised on rank 3 itself" in text and "invalid root rank" in text, text
        await pilot.press("e")
        assert app.findings_panel.highlighted == 0

    drive(app, check)


def test_the_timeline_and_rank_table_keys_work_whichever_pane_has_the_focus():
    """After ``e`` the findings pane has the focus: ``c``, ``x`` and ``s`` did nothing there
    (they were the timeline's and the rank table's own keys), where the help lists them as
    the console's."""
    events, now = hung_missing_rank()
    app = make_app(events, now)

    async def check(pilot):
        tl, table = app.timeline, app.ranks_table
        await pilot.press("e")
        await pilot.pause()
        assert app.focused is app.findings_panel
        mode, sort = tl.mode, table._sort_col
        await pilot.press("c")
        await pilot.pause()
        assert tl.mode != mode
        assert app.top.border_title == "timeline"
        await pilot.press("x")
        await pilot.pause()
        assert tl.only_findings and sorted(int(r.key[1:]) for r in tl.rows) == [2]
        # (the pane says what it hides while it hides it: a toast said it, helper-188)
        assert app.top.border_title == "timeline  [dim](x: only the 1 rank named in findings)[/dim]"
        # (the palette's entry too: it went round the title, helper-194)
        (entry,) = [c for c in app.get_system_commands(app.screen) if c.title == "Timeline: only ranks with findings"]
        entry.callback()
        assert not tl.only_findings and app.top.border_title == "timeline"
        entry.callback()
        assert tl.only_findings and app.top.border_title.startswith("timeline  [dim](x: only the 1 rank named")
        await pilot.press("s")
        await pilot.pause()
        assert table._sort_col != sort
        assert app.focused is app.findings_panel  # (the keys act; the focus stays)
        sort = table._sort_col
        await pilot.press("3", "s")  # the rank table's own focus, as before
        await pilot.pause()
        assert app.focused is table and table._sort_col != sort
        # (not on a screen over the console: the demo's scenario picker, helper-174)
        from textual.screen import Screen

        app.push_screen(Screen())
        await pilot.pause()
        mode, only, sort = tl.mode, tl.only_findings, table._sort_col
        await pilot.press("c", "x", "s")
        await pilot.pause()
        assert (tl.mode, tl.only_findings, table._sort_col) == (mode, only, sort)
        app.pop_screen()
        await pilot.pause()
        await pilot.press("c")
        await pilot.pause()
        assert tl.mode != mode

    drive(app, check)


def test_new_error_findings_alert_once():
    events, now = hung_missing_rank(refused=True)
    app = make_app(events, now)
    shown: list[str] = []
    real_notify = app.notify
    app.notify = lambda message, **kw: (shown.append(kw.get("title", "")), real_notify(message, **kw))
    rings: list[int] = []
    app.use_bell = True
    app.bell = lambda: rings.append(1)

    async def check(pilot):
        assert shown == ["missing_ranks", "op_failed"] and len(rings) == 2
        app.apply(app.info, app.findings)
        app.apply(app.info, app.findings)
        await pilot.pause()
        assert shown == ["missing_ranks", "op_failed"] and len(rings) == 2

    drive(app, check)


def test_help_opens_and_closes_and_the_palette_lists_actions():
    events, now = healthy(3)
    app = make_app(events, now, mode=REPLAY)

    async def check(pilot):
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)
        titles = [c.title for c in app.get_system_commands(app.screen)]
        for t in ("Timeline: zoom in", "Replay: play / pause", "Findings: next error", "Help: key bindings"):
            assert t in titles

    drive(app, check, size=(200, 50))


async def _click_header(pilot, table, key: str) -> None:
    """Click the header cell of column ``key``, as a user sorting by it would."""
    x0, _ = table.column_span(key)
    await pilot.click(table, offset=(x0 + 1, 0))


def test_rank_table_columns_and_sorting_by_clicks_and_keys():
    events, now = healthy(3)
    app = make_app(events, now, mode=REPLAY)

    async def check(pilot):
        table = app.ranks_table

        def order() -> list[int]:
            return table.order

        cols = table.column_keys()
        assert cols[:2] == ["rank", "state"] and {"gpu", "gmem", "cpu", "rss"} <= set(cols)
        assert "host" not in cols  # one host: no column for it
        await _click_header(pilot, table, "gpu")
        await _click_header(pilot, table, "gpu")  # the second click reverses
        await pilot.pause()
        assert order() == [3, 2, 1, 0]  # busiest GPU first
        await pilot.press("3", "s")  # the key cycles on to the next column, ascending
        await pilot.pause()
        assert order() != [3, 2, 1, 0]

    drive(app, check, size=(200, 50))


def test_gpu_panel_shows_each_ranks_usage():
    events, now = healthy(3)
    app = make_app(events, now, mode=REPLAY)

    async def check(pilot):
        await pilot.press("r")
        assert app.query_one("#left").current == "gpu" and app.gpu.mode == "gpu"
        line = app.gpu.render_line(1).text
        assert line.startswith("r0") and "%" in line

    drive(app, check, size=(200, 50))


def test_cpu_only_jobs_say_why_there_is_no_gpu_panel():
    events, now = hung_missing_rank()
    app = make_app(events, now)

    async def check(pilot):
        load(app)
        await pilot.press("r")
        await pilot.pause()
        assert app.gpu.mode == "cpu"
        assert "CPU-only job" in app.gpu.render_line(0).text
        assert "gpu" not in app.ranks_table.column_keys()

    drive(app, check, loaded=False)


def test_the_gpu_panel_keeps_the_probes_reason_after_later_samples():
    """The probe says why there is no GPU once, in a rank's first sample; the panel still
    shows that reason once later samples came without it."""
    events, now = hung_missing_rank()
    samples = [e for e in events if e["type"] == "sample" and e["rank"] == 1]
    assert len(samples) > 1
    samples[0]["gpu_error"] = "NVML Shared Library Not Found"
    app = make_app(events, now)

    async def check(pilot):
        load(app)
        await pilot.press("r")
        await pilot.pause()
        assert app.gpu.mode == "cpu"
        assert "NVML Shared Library Not Found" in app.gpu.render_line(0).text

    drive(app, check, loaded=False, size=(200, 50))


def test_a_crash_shows_its_signal_frame_and_consequences():
    from tui_scenarios import crashed_rank

    events, now = crashed_rank()
    app = make_app(events, now)

    async def check(pilot):
        assert [(f.kind, f.culprits) for f in app.findings] == [("rank_crashed", [1])]
        assert app.detail.border_title == "finding · rank_crashed"
        text = app.detail.text(width=140)
        assert "Segmentation fault" in text and "data.py:12 in parse_record" in text
        assert "inside string_at" in text
        assert "consequences (1)" in text and "failed on ranks 0, 2" in text
        assert "stack of 2 ranks (0,2)  waiting" in text  # the ranks it left waiting get theirs too, folded
        assert 1 in app.ranks_table.order and app.ranks_table.cells(1)["state"]  # the crashed rank's row

    drive(app, check, size=(140, 50))


def test_the_finding_detail_stays_current_while_the_job_is_live():
    """The list and the open detail must agree: re-diagnosed 1.5 s later, both say 7.5 s."""
    from commscope.analysis import diagnose

    events, now = hung_missing_rank()
    app = make_app(events, now)

    async def check(pilot):
        assert app.detail.border_title == "finding · missing_ranks"
        assert "waited 6.0 s" in app.detail.text()
        later = diagnose(app.feed.model, now=now + 3 * S // 2, hang_after=2.0)
        app.apply(app.info, later)
        await pilot.pause()
        assert app.detail.border_title == "finding · missing_ranks"
        assert "waited 7.5 s" in app.detail.text() and "waited 6.0 s" not in app.detail.text()

    drive(app, check)


# ---------------------------------------------------------------------- keys go where the trouble is
def _label(app) -> str:
    return app.feed.model.label(*app.timeline.sel)


def test_open_selects_the_latest_op_without_findings():
    events, _ = healthy()
    app = make_app(events, 0, mode=REPLAY)

    async def check(pilot):
        m = app.feed.model
        assert app.findings == [] and app.timeline.sel is not None
        rank, idx = app.timeline.sel
        # nothing began later on any rank (outer ops only)
        for r in m.rank_ids():
            rt = m.ranks[r]
            top = [i for i in range(rt.n) if not m.sig_of(r, i).nested]
            assert max(int(rt.begin[i]) for i in top) <= int(m.ranks[rank].begin[idx])
        assert app.detail.border_title == f"op · rank {rank}"
        assert _label(app).startswith("all_gather_v")  # each step ends in a varlen all_gather

    drive(app, check)


def test_open_selects_the_first_findings_op_and_arrows_reach_the_in_flight_op():
    events, now = hung_missing_rank()
    app = make_app(events, now)

    async def check(pilot):
        tl, m = app.timeline, app.feed.model
        assert app.detail.border_title == "finding · missing_ranks"
        assert tl.sel == app._finding_op(app.findings[0])
        assert _label(app).startswith("all_reduce #7") and m.ranks[tl.sel[0]].comp[tl.sel[1]] == 0
        tl.focus()
        rank = tl.sel[0]
        await pilot.press("left")
        assert tl.sel[0] == rank and _label(app).startswith("all_reduce #6")
        await pilot.press("right")  # back onto the in-flight op, not past it
        assert _label(app).startswith("all_reduce #7") and m.ranks[rank].comp[tl.sel[1]] == 0
        sel = tl.sel
        await pilot.press("right")  # the end: stays (and says so)
        assert tl.sel == sel
        # another row, nothing selected there: ← takes that rank's latest op, the stuck recv
        tl.sel = None
        while tl.sel_row != 2:
            await pilot.press("down" if tl.sel_row < 2 else "up")
        await pilot.press("left")
        assert tl.sel[0] == 2 and _label(app).startswith("recv #1") and m.ranks[2].comp[tl.sel[1]] == 0
        await pilot.press("up")  # rank 1, with rank 2's recv selected: → goes to the op at/after it
        await pilot.press("right")
        assert tl.sel[0] == 1 and _label(app).startswith("all_reduce #7")
        await pilot.press("left")
        assert tl.sel[0] == 1 and _label(app).startswith("all_reduce #6")

    drive(app, check)


def test_replay_arrows_from_the_end_include_the_in_flight_op():
    events, _ = hung_missing_rank()
    app = make_app(events, 0, mode=REPLAY)

    async def check(pilot):
        tl = app.timeline
        await pilot.press("G")
        tl.focus()
        tl.sel = None
        tl.sel_row = 0
        await pilot.press("left")
        assert tl.sel[0] == 0 and _label(app).startswith("all_reduce #7")
        assert app.feed.model.ranks[0].comp[tl.sel[1]] == 0

    drive(app, check)


# ---------------------------------------------------------------------- reader errors reach the screen
class _FailingReader(TraceReader):
    description = "broken-store"

    def __init__(self):
        self.stats = ReadStats()

    def poll(self, max_bytes=None):
        raise OSError("Connection refused by redis://host:6379/0")


def _screen_text(app) -> str:
    return "\n".join("".join(seg.text for seg in strip) for strip in app.screen._compositor.render_strips())


def test_reader_failure_reaches_header_and_findings():
    feed = Feed(_FailingReader(), mode=REPLAY, clock=lambda: 0, source="broken-store")
    app = CommscopeApp(feed, clock=lambda: 0, start_feed=False, bell=False)

    async def check(pilot):
        assert [f.kind for f in app.findings] == ["trace_incomplete"]
        assert "Connection refused" in app.findings[0].message
        header = str(app.header_bar.render())
        assert "could not be read: Connection refused" in header
        text = _screen_text(app)
        assert "no problems found" not in text and "waiting for the job" not in text
        assert "the trace could not be read" in text  # timeline and findings list say it

    drive(app, check, size=(120, 30))


def test_unparseable_trace_shows_why(tmp_path):
    from test_check_cli import write_store

    events, _ = healthy(steps=2)
    store = write_store(tmp_path / "s", events)
    for f in store.rglob("rank-*.jsonl"):
        f.write_bytes(b"\x00\xff garbage, not a trace\n" * 20)
    feed = Feed(open_source(store), mode=REPLAY, source=str(store))
    app = CommscopeApp(feed, start_feed=False, bell=False)

    async def check(pilot):
        assert app.findings and app.findings[0].kind == "trace_incomplete"
        header = str(app.header_bar.render())
        assert "no readable event (" in header and "damaged lines skipped" in header
        text = _screen_text(app)
        assert "no problems found" not in text and "waiting for the job" not in text
        assert "no readable event" in text

    drive(app, check, size=(120, 30))


def test_the_header_says_a_trace_reused_op_ids(tmp_path):
    """A damaged or foreign trace that reuses op ids (``analysis/opids``): the console pairs
    them in stream order, finds the hang they hid, and says so, as ``check`` warns."""
    from test_check_cli import write_store
    from test_op_ids import _hung_with_a_reused_id

    store = write_store(tmp_path / "s", _hung_with_a_reused_id())
    feed = Feed(open_source(store), mode=REPLAY, source=str(store))
    app = CommscopeApp(feed, start_feed=False, bell=False)

    async def check(pilot):
        assert [(f.kind, f.culprits) for f in app.findings] == [("missing_ranks", [1])]
        assert "· 1 reused op id " in str(app.header_bar.render())  # (one id: "1 reused op ids" before)

    drive(app, check, size=(160, 30))


def test_header_counts_ops_without_timings():
    from test_report_export import _fr_dump_events

    app = make_app(_fr_dump_events(), 0, mode=REPLAY)

    async def check(pilot):
        assert "120 ops without timings" in str(app.header_bar.render())
        assert not any(f.kind == "straggler" for f in app.findings)
        text = app.detail.text()
        assert "no timing recorded" in text and "done   —" in text

    drive(app, check, size=(160, 30))


# ---------------------------------------------------------------------- rank table
def _long_names_trace() -> list[dict]:
    """2 ranks with long op names; rank 1's stream starts 3 ms after rank 0's; both exit."""
    b = TraceBuilder(2, meta=False)
    t = b.t0
    b.add(0, t, "meta", host="h", pid=1, world_size=2, backend="gloo")
    b.add(1, t + 3 * MS, "meta", host="h", pid=2, world_size=2, backend="gloo")
    t += 100 * MS
    for op in ("all_gather_into_tensor", "reduce_scatter_tensor", "all_gather_single"):
        t = b.collective(t, op, latency=5 * MS) + MS
    b.heartbeats(b.t0 + 5 * MS, t, interval=S // 10)
    for r in range(2):
        b.exit(r, t + MS, reason="destroy_process_group")
    return b.sorted_events()


def _cells(app, rank: int) -> dict[str, str]:
    return app.ranks_table.cells(rank)


@pytest.mark.parametrize("width", [120, 200])
def test_rank_table_last_op_whole_names_and_consistent_start(width):
    app = make_app(_long_names_trace(), 0, mode=REPLAY)

    async def check(pilot):
        await pilot.pause()
        for r in (0, 1):
            c = _cells(app, r)
            assert c["state"].endswith("left its group (destroy_pg)"), c
            if "last" in c:  # a rank that exited still shows its last op, abbreviated on purpose
                assert c["last"] == "ag_single #3", c
        table = app.ranks_table
        assert "last" in table.column_keys() or width < 160
        await pilot.press("g")  # the replay's start: both ranks read the same
        await pilot.pause()
        states = [_cells(app, r)["state"] for r in (0, 1)]
        assert states[0] == states[1] == "○ idle", states

    drive(app, check, size=(width, 40))


def test_abbreviations_and_word_fitting():
    from commscope.tui.rank_table import abbreviate, fit_words

    assert abbreviate("all_gather_single") == "ag_single"
    assert abbreviate("all_gather_into_tensor") == "ag_tensor"
    assert abbreviate("reduce_scatter_tensor") == "rs_tensor"
    assert abbreviate("all_to_all_single") == "a2a_single"
    assert abbreviate("all_reduce") == "all_reduce" and abbreviate("broadcast") == "broadcast"
    assert fit_words("● in all_reduce #7 · 6.0 s", 20) == "● in all_reduce #7…"
    assert fit_words("exited (destroy_pg)", 12) == "exited…"


def test_a_narrow_findings_list_breaks_a_list_of_ranks_after_its_commas():
    """At 80x24 the findings list is ~18 columns: "(0-2049,2051-4095)" was folded mid-number,
    "(0-2049,2051-4" on a line, read as ranks 2051-4 (helper-188).  It breaks after a comma,
    each range whole on a line."""
    from tui_scenarios import wide_missing_rank

    events, now = wide_missing_rank()
    app = make_app(events, now)

    async def check(pilot):
        shown = _screen_text(app)
        assert "(0-2049," in shown and "2051-4095)" in shown, shown
        assert "2051-4\n" not in shown and "2051-4 " not in shown.replace("2051-4095", ""), shown

    drive(app, check, size=(80, 24))


def test_finding_detail_keeps_up_with_its_list_entry():
    """A live hang: each diagnose says the ranks waited longer; the detail pane and the list's
    highlight follow the same finding, and the timeline's selection stays put."""
    import re

    events, now = hung_missing_rank()
    clock = [now - 3 * S]
    feed = Feed(StaticReader(events), clock=lambda: clock[0], source="synthetic-job")
    app = CommscopeApp(feed, clock=lambda: clock[0], start_feed=False, bell=False)

    def waited(text: str) -> str:
        return re.search(r"waited up to ([\d.]+ s)", text).group(1)

    async def check(pilot):
        assert app.detail.border_title == "finding · missing_ranks"
        assert waited(app.detail.text()) == waited(app.findings[0].message) == "3.0 s"
        mine = app.timeline.sel
        for k in range(1, 4):
            beats = TraceBuilder(4, hang_after=2.0)
            beats.heartbeats(clock[0] + S // 5, clock[0] + 10 * S, interval=S // 5)  # hung, alive
            feed.reader.events = beats.sorted_events()
            clock[0] += 10 * S
            feed._diagnosed_at, feed._dirty = float("-inf"), True
            info, _ = feed.step()
            app.apply(info, feed.findings)
            await pilot.pause()
            listed = app.findings[app.findings_panel.highlighted]
            assert listed.kind == "missing_ranks"
            assert waited(listed.message) == waited(app.detail.text()) == f"{3 + 10 * k}.0 s"
            assert app.timeline.sel == mine

    drive(app, check)


def test_an_op_of_thousands_of_ranks_lists_the_last_to_arrive_and_summarizes_the_rest():
    """Selecting an op of a 4,096-rank group listed every rank (4,114 lines; Rich took ~10 s
    to lay it out, the console frozen), the last arrival buried among them, and its group
    line was cut mid-list at 120 characters ("ranks [0, 1, ..., 28, 29,"): helper-165."""
    import io

    from rich.console import Console

    from commscope.analysis import TraceModel
    from commscope.tui.detail import SAME_OP_ROWS, op_detail

    b = TraceBuilder(512)
    t = b.collective(b.t0 + S, "all_reduce", latency=MS, skew={300: 40 * MS, 7: 20 * MS})
    m = TraceModel.from_events(b.sorted_events())
    console = Console(width=100, record=True, file=io.StringIO(), color_system=None)
    console.print(op_detail(m, 5, 0, t + S))
    out = console.export_text()
    lines = out.splitlines()
    rows = [ln.split() for ln in lines if ln.split()[:1] and ln.split()[0].isdigit() and "ranks" not in ln]
    assert len(rows) == SAME_OP_ROWS - 1 and len(lines) < 40, out  # (the selected rank among them)
    assert rows[0][:4] == ["300", "+40.0", "ms", "(last)"] and rows[1][:3] == ["7", "+20.0", "ms"], out
    assert ["5", "◀"] in [r[:2] for r in rows]  # (the selected rank)
    assert "same op on the other ranks: the last 15 of 512 to arrive" in out
    assert "512 ranks arrived over +40.0 ms" in out and "512 done, 0 in flight" in out
    assert "0  512 ranks (0-511)" in out  # (the group, whole)
    console = Console(width=100, record=True, file=io.StringIO(), color_system=None)
    console.print(op_detail(m, 100, 0, t + S))  # (a rank not among the last 15: listed after them)
    lines = console.export_text().splitlines()
    assert lines[-1].split()[:2] == ["100", "◀"]
    assert len([ln for ln in lines if ln.split()[:1] and ln.split()[0].isdigit() and "ranks" not in ln]) == SAME_OP_ROWS


def _missing_from_512(missing: tuple[int, ...]) -> CommscopeApp:
    """An app over 512 ranks, 8 a host, that wait in all_reduce #4 but ``missing``."""
    b = TraceBuilder(512, hang_after=2.0, ranks_per_host=8)
    t = b.t0 + 100 * MS
    for _ in range(3):
        t = b.collective(t, "all_reduce", latency=20 * MS, shape=(4096,)) + 10 * MS
    for r in range(512):
        if r not in missing:
            b.sync(r, t + (r % 7) * MS, None, "all_reduce", shape=(4096,))
    now = t + 6 * S
    b.heartbeats(b.t0, now, interval=S)
    return make_app(b.sorted_events(), now)


def test_at_80x24_the_findings_ranks_stay_on_screen_and_nothing_scrolls_the_screen():
    """Two ranks of different hosts missing from a 512-rank all_reduce: the culprits and their
    hosts' ranks are 17 rows, more than 80x24 shows.  On open the app selects the finding's
    op, in the waiting ranks' row at the bottom, and the timeline scrolled the culprits off;
    the screen itself was 26 rows at 24 (it scrolled, the error count cut from the header):
    helper-165.  The findings' rows stay, the rest scrolls under them."""
    app = _missing_from_512((100, 300))

    async def check(pilot):
        tl = app.timeline
        assert [f.culprits for f in app.findings] == [[100, 300]]
        assert len(tl.rows) > tl.size.height and tl.sel_row == len(tl.rows) - 1 and tl.scroll_offset.y > 0
        lines = _screen_text(app).splitlines()
        shown = [ln for ln in lines if "r100 " in ln or "r300 " in ln]
        assert len(shown) == 2 and any("×" in ln for ln in lines), "\n".join(lines)  # (the selected row too)
        assert app.screen.max_scroll_y == 0 and "✖ 1 ▲ 0" in lines[0], lines[0]
        top = tl.scroll_offset.y
        await pilot.click(type(tl), offset=(3, 1))  # (a frozen row: the second culprit's)
        assert tl.sel_row == 1
        await pilot.click(type(tl), offset=(3, 2))  # (the first row that scrolls)
        assert tl.sel_row == 2 + top
        for _ in range(len(tl.rows)):  # (up through the rows that scroll, to the frozen ones)
            await pilot.press("up")
        await pilot.pause()
        assert tl.sel_row == 0 and tl.scroll_offset.y == 0

    drive(app, check, size=(80, 24))


def test_op_detail_site_latency_sparkline_and_group_best():
    b = TraceBuilder(2)
    t = b.t0 + S
    lats = [2, 2, 2, 8, 2, 2, 4, 2]
    for lat in lats:
        t = b.collective(t, "all_reduce", latency=lat * MS, shape=(250_000,), site="train.py:9 in step") + MS
    b.heartbeats(b.t0, t)
    app = make_app(b.sorted_events(), 0, mode=REPLAY)

    async def check(pilot):
        m = app.feed.model
        slow = next(i for i in range(m.ranks[0].n) if m.label(0, i).startswith("all_reduce #4"))
        app.timeline.select(0, slow)
        await pilot.pause()
        text = app.detail.text()
        assert "at site" in text and "8 ops · p50 2.0 ms · max 8.0 ms · this one 8.0 ms" in text
        bars = next(ln for ln in text.splitlines() if "at site" in ln).split("at site")[1].strip()
        assert bars == "▃▃▃█▃▃▅▃"
        assert "best bw" in text and "this op at 25%" in text  # 2 ms is the best; this one took 8

    drive(app, check, size=(160, 40))


def _rank_states(app) -> dict[int, str]:
    return {r: app.ranks_table.cells(r)["state"] for r in sorted(app.feed.model.ranks)}


def test_an_ended_job_stays_frozen_at_its_end_as_check_judges_it(tmp_path):
    """The demo's S on a hung job: every rank is killed together.  From then on the console
    shows the job at its end however long it stays open: the header's clock stops, no rank
    turns dead by the passing of time, and the findings are the ones `commscope check` gives
    for the same store, word for word."""
    import json
    import subprocess
    import sys

    events, now = hung_missing_rank()
    for r in range(4):  # stopped with the job, as the demo's S does: SIGTERM to every worker
        events.append({"type": "exit", "v": 1, "rank": r, "ts": now + r * MS, "reason": "signal",
                       "signal": "Terminated", "src": "spool"})
    store = tmp_path / "trace"
    for r in range(4):
        open_writer(store, "job1", r, {"world_size": 4}).write([encode(e) for e in events if e["rank"] == r])
    clock = [now + S]
    feed = Feed(open_source(store), mode=LIVE, clock=lambda: clock[0], source=str(store))
    app = CommscopeApp(feed, clock=lambda: clock[0], start_feed=False, bell=False)
    out = subprocess.run([sys.executable, "-m", "commscope", "check", "--json", str(store)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 1, out.stderr
    checked = [(f["kind"], f["culprits"], f["message"]) for f in json.loads(out.stdout)["findings"]]

    def seen() -> tuple[str, dict[int, str], list]:
        return (str(app.header_bar.render()), _rank_states(app),
                [(f.kind, f.culprits, f.message) for f in app.findings])

    async def step() -> None:
        feed._diagnosed_at, feed._dirty = float("-inf"), True
        info, _ = feed.step()
        app.apply(info, feed.findings)
        app._last_table = 0.0
        await app.workers.wait_for_complete()

    async def check(pilot):
        while not app.info.ended:
            await step()
        await step()
        await pilot.pause()
        header, states, findings = seen()
        assert "ENDED" in header and findings == checked
        assert findings[0][:2] == ("missing_ranks", [2]), findings
        assert "rank 2 is in recv" in findings[0][2] and "when the job was stopped" in findings[0][2]
        assert all(s == "✖ stopped · SIGTERM" for s in states.values()), states
        for _ in range(3):
            clock[0] += 100 * S  # the console stays open; nothing new arrives
            await step()
            app._tick()
            await pilot.pause()
            assert seen() == (header, states, findings)

    drive(app, check, loaded=False)


def test_help_lists_every_key_including_the_demos():
    """`?` lists every key the console binds, and in the demo also S, R and m."""
    from commscope.scenarios import SCENARIOS, DemoJob
    from commscope.tui.demo_app import DemoApp
    from commscope.tui.rank_table import RankTable
    from commscope.tui.timeline import Timeline

    def listed(app) -> dict[str, str]:
        return {k: what for _, keys in app.screen.sections for k, what in keys}

    events, now = healthy(3)
    app = make_app(events, now)

    async def check(pilot):
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        keys = " ".join(listed(app))
        for cls in (CommscopeApp, Timeline, RankTable):
            for b in cls.BINDINGS:
                key, action = (b.key, b.action) if hasattr(b, "key") else (b[0], b[1])
                names = {"question_mark": "?", "right_square_bracket": "]", "left_square_bracket": "[",
                         "plus": "+", "minus": "-", "equals_sign": "+", "shift+left": "shift+←", "left": "←",
                         "right": "→", "up": "↑", "down": "↓"}
                first = key.split(",")[0]
                assert names.get(first, first) in keys, (cls.__name__, key, action)

    drive(app, check, size=(80, 24))

    demo = DemoApp(scenarios=SCENARIOS, job_factory=DemoJob, bell=False)

    async def run_demo():
        async with demo.run_test(size=(80, 24)) as pilot:
            await pilot.pause()
            await pilot.press("question_mark")
            assert isinstance(demo.screen, HelpScreen)
            keys = listed(demo)
            assert "stop" in keys["S"] and "again" in keys["R"] and "scenarios" in keys["m"]
            await pilot.press("escape")
            assert not isinstance(demo.screen, HelpScreen)

    import asyncio

    asyncio.run(run_demo())


def test_the_feed_thread_sends_the_end_as_check_judges_it():
    """With the real feed thread: the job's last events (every rank stopped) arrive while
    heartbeats keep the diagnosis busy; the UI gets the findings judged at the end and a
    rank table that says the job was stopped, not the last live frame."""

    class Batches(TraceReader):
        description = "synthetic-job"

        def __init__(self, batches: list[list[dict]]):
            self.batches = batches
            self.stats = ReadStats()

        def poll(self, max_bytes=None):
            return self.batches.pop(0) if self.batches else []

    events, now = hung_missing_rank()
    exits = [{"type": "exit", "v": 1, "rank": r, "ts": now + r * MS, "reason": "signal", "signal": "Terminated",
              "src": "spool"} for r in range(4)]
    reader = Batches([events])
    feed = Feed(reader, mode=LIVE, clock=lambda: now + S, source="synthetic-job")
    app = CommscopeApp(feed, clock=lambda: now + S, bell=False)

    async def check(pilot):
        await wait_for(pilot, lambda: app.findings and app.info.events == len(events))
        reader.batches.append(exits)
        await wait_for(pilot, lambda: app.info.ended and app.findings and "when the job was stopped"
                       in app.findings[0].message)
        await wait_for(pilot, lambda: set(_rank_states(app).values()) == {"✖ stopped · SIGTERM"})
        assert [f.message for f in app.findings] == [f.message for f in feed.findings]

    drive(app, check, loaded=False)


def test_a_large_replay_paints_what_is_read_before_it_has_loaded(tmp_path):
    """Never a blank screen: a replay shows the part of the trace already read, with a load
    bar (events, ranks), before the rest is in; the findings come once all of it is, and are
    check's."""
    import threading

    from commscope.analysis.diagnose import default_hang_after, diagnose
    from commscope.analysis.source import load_trace
    from commscope.bench.synthstore import JobShape, write_store

    store = str(tmp_path / "trace")
    written = write_store(store, JobShape(48, 120, fault="missing", hang_after=2.0))
    reader = open_source(store)
    gate, polls = threading.Event(), [0]
    real = reader.poll_batch

    def gated(max_bytes=None):  # the rest of the load waits until the test has seen a frame
        polls[0] += 1
        if polls[0] > 4:
            gate.wait(60)
        return real(max_bytes)

    reader.poll_batch = gated
    feed = Feed(reader, mode=REPLAY, source=store)
    feed.BUDGET = 1 << 15  # many steps, as a large trace takes
    feed.LOAD_POST_S = 0.0
    app = CommscopeApp(feed, bell=False)

    def painted() -> bool:  # the part read, the load bar and the findings' placeholder, in one frame
        text = _screen_text(app)
        return polls[0] > 4 and len(app.timeline.rows) > 0 and " events · " in text and "findings come once" in text

    async def check(pilot):
        try:
            await wait_for(pilot, painted)
            assert not app.info.loaded and not feed.info.loaded
            text = _screen_text(app)
            line = next((x for x in text.splitlines() if x.startswith(" loading ")), "")  # the load bar, on screen
            assert " events · " in line and " ranks" in line and "%" in line, text
            assert "no problems found" not in text
            shown = len(app.timeline.rows)
        finally:
            gate.set()  # (the rest of the load goes on, whatever happened)
        await wait_for(pilot, lambda: app.info.loaded)
        await pilot.pause()
        assert not app.loadbar.display and len(app.timeline.rows) >= shown
        model, _, _ = load_trace(store)
        expect = [(f.kind, f.culprits) for f in diagnose(model, model.end_ns, default_hang_after(model))]
        assert [(f.kind, f.culprits) for f in app.findings] == expect == [
            (written.kind, [written.shape.culprit_rank])]
        assert app.feed.model.events == model.events

    try:
        drive(app, check, size=(120, 40), loaded=False)
    finally:
        gate.set()


def test_a_replay_before_its_first_events_says_it_is_reading_not_waiting_for_a_job(tmp_path):
    """A finished trace's first frame, before anything is read, said "waiting for the job
    to write its first events", as a live console on an empty store does."""
    import threading

    from commscope.bench.synthstore import JobShape, write_store

    store = str(tmp_path / "trace")
    write_store(store, JobShape(4, 20, fault="healthy"))
    reader = open_source(store)
    gate, real = threading.Event(), reader.poll_batch
    reader.poll_batch = lambda max_bytes=None: gate.wait(60) and real(max_bytes)
    app = CommscopeApp(Feed(reader, mode=REPLAY, source=store), bell=False)

    async def check(pilot):
        try:
            await wait_for(pilot, lambda: "reading the trace…" in _screen_text(app))
            assert "waiting for the job" not in _screen_text(app)
        finally:
            gate.set()
        await wait_for(pilot, lambda: app.info.loaded)

    try:
        drive(app, check, size=(100, 30), loaded=False)
    finally:
        gate.set()


def test_history_shows_what_retention_summarized_and_what_the_window_skipped(tmp_path):
    from commscope.bench.synthstore import JobShape, write_store
    from commscope.window import Since

    store = str(tmp_path / "trace")
    write_store(store, JobShape(4, 8000, fault="healthy", days=3, segment_bytes=128 << 10, retain="1MiB"))
    feed = Feed(open_source(store, since=Since(ago_s=3600)), mode=REPLAY, source=store)
    app = CommscopeApp(feed, start_feed=False, bell=False)

    async def check(pilot):
        await pilot.press("H")
        await pilot.pause()
        text = app.detail.text()
        assert app.detail.border_title == "history"
        assert "retention summarized" in text and "all_reduce" in text and "reduce_scatter_tensor" in text
        assert "before the window not read" in text and "UTC" in text

    drive(app, check, size=(140, 40))


def test_the_culprit_among_hundreds_of_ranks_is_on_the_first_screen(tmp_path):
    """A job of more ranks than fit: the ranks the findings name are the timeline's first rows
    at 80x24, in every row mode, and the rank table's first row."""
    from commscope.bench.synthstore import JobShape, write_store

    store = str(tmp_path / "trace")
    shape = JobShape(128, 40, fault="missing", hang_after=2.0)
    write_store(store, shape)
    feed = Feed(open_source(store), mode=REPLAY, source=store)
    app = CommscopeApp(feed, bell=False)
    culprit = shape.culprit_rank

    async def check(pilot):
        await wait_for(pilot, lambda: app.info.loaded and app.findings)
        assert [f.culprits for f in app.findings if f.severity == "error"] == [[culprit]]
        assert app.timeline.mode == "behaviour"  # more ranks than SUMMARY_MIN_RANKS: summarized
        assert app.timeline.rows[0].ranks == (culprit,)  # first, then the others
        await wait_for(pilot, lambda: f"r{culprit}" in _screen_text(app))  # (painted at the next refresh)
        assert app.ranks_table.order[0] == culprit  # the rank table too
        for _ in range(4):  # nodes, blocks, heatmap, ranks: the culprit stays its own row, on top
            await pilot.press("c")
            await pilot.pause()
            assert app.timeline.rows[0].ranks == (culprit,)
            assert all(culprit not in r.ranks for r in app.timeline.rows[1:])
        assert app.timeline.mode == "ranks"
        assert [r.ranks[0] for r in app.timeline.rows[1:4]] == [0, 1, 2]  # then the others in order

    drive(app, check, size=(80, 24), loaded=False)


def test_a_costly_rank_table_is_refreshed_less_often():
    """16k ranks' rows take ~1 s: the table waits ten times what its last refresh took."""
    app = CommscopeApp(Feed(StaticReader([])), bell=False)
    app._table_cost, app._last_table = 0.001, time.monotonic() - 0.6
    assert app._table_due(0.5)  # cheap: every half second
    app._table_cost, app._last_table = 1.0, time.monotonic() - 0.6
    assert not app._table_due(0.5)  # costly: not before ten seconds
    app._last_table = time.monotonic() - 10.5
    assert app._table_due(0.5)


def test_thousands_of_ranks_are_summarized_by_behaviour_and_every_key_works():
    """4,096 ranks open summarized: the culprit and the ranks of its host expanded on top,
    the ranks doing the same thing one row with a count; c cycles the modes, arrows move."""
    from tui_scenarios import wide_missing_rank

    from commscope.tui.painter import paint_group
    from commscope.tui.timeline import BEHAVIOUR_SAMPLE, MODES

    events, now = wide_missing_rank()
    app = make_app(events, now)

    async def check(pilot):
        tl = app.timeline
        assert [(f.kind, f.culprits) for f in app.findings] == [("missing_ranks", [2050])]
        assert tl.mode == "behaviour"
        assert [r.key for r in tl.rows[:8]] == ["r2050"] + [f"r{r}" for r in range(2048, 2056) if r != 2050]
        (rest,) = tl.rows[8:]
        assert len(rest.ranks) == 4088 and rest.label == "×4,088" and "in all_reduce #4 (group 0)" in rest.note
        assert "4,088 ranks (0-2047,2056-4095)" in rest.note
        # shaded from an even sample of its ranks (they do the same thing): a frame stays cheap
        sample = rest.painted_ranks()
        assert len(sample) <= BEHAVIOUR_SAMPLE and sample[0] == 0 and sample[-1] > 4000
        win = tl.window(tl.timeline_width())
        assert paint_group(tl.model, sample, win) == paint_group(tl.model, rest.ranks, win)  # alike ranks
        seen = [tl.mode]
        for _ in MODES:
            await pilot.press("c")
            await pilot.pause()
            seen.append(tl.mode)
            assert tl.rows and tl.rows[0].key == "r2050"  # the culprit stays on top in every mode
        assert seen == [*MODES[1:], MODES[0], MODES[1]]
        assert len(app.timeline.rows) == 9
        tl.focus()
        before = tl.sel_row
        await pilot.press("up", "up")
        await pilot.pause()
        assert tl.sel_row == max(0, before - 2)
        await pilot.press("down")
        await pilot.pause()
        assert tl.sel_row == max(0, before - 2) + 1
        await pilot.press("x")  # findings only: the culprit alone
        await pilot.pause()
        assert [r.key for r in tl.rows] == ["r2050"]

    drive(app, check, size=(80, 24))


@pytest.mark.parametrize("mode", ["behaviour", "nodes", "heat"])
def test_every_key_works_at_thousands_of_ranks_as_at_four(mode):
    """4,096 ranks, summarized by behaviour, by host or as a heatmap: the keys do what they do at 4
    ranks (test_select_zoom_pan_and_follow and the tests after it): select ops, zoom, pan,
    follow, a click, an op's detail, the next error, the findings and the rank table focused
    and sorted, the GPU panel, the history, the help."""
    from tui_scenarios import wide_missing_rank

    from commscope.tui.painter import GUTTER
    from commscope.tui.rank_table import UNUSUAL

    events, now = wide_missing_rank()
    app = make_app(events, now)

    async def check(pilot):
        tl = app.timeline
        tl.mode, tl._mode_chosen = mode, True  # (as c would, without painting the modes between)
        tl.rebuild_rows()
        await pilot.pause()
        tl.focus()
        tl.sel = None
        tl.sel_row = 0  # the culprit's row, on top
        await pilot.press("left")
        await pilot.pause()
        assert tl.sel is not None and tl.sel[0] == 2050
        assert app.detail.border_title == "op · rank 2050"
        first = tl.sel
        await pilot.press("left")
        assert tl.sel[0] == 2050 and tl.sel[1] < first[1]
        await pilot.press("right")
        assert tl.sel == first
        await zoom_pan_follow(pilot, tl, now)
        for y in range(tl.size.height):  # (the frame after them: every line paints)
            tl.render_line(y)
        tl.sel = None
        # (the second row: a rank of the culprit's host by behaviour, that host by host, the first
        # block of ranks as a heatmap; its first rank waits in all_reduce #4)
        first = tl.rows[1].ranks[0]
        assert first == (0 if mode == "heat" else 2048)
        await pilot.click("#timeline", offset=(30, 1))  # its row, mid timeline
        await pilot.pause()
        assert tl.sel is not None and tl.sel[0] == first  # its op under the click: the one in flight
        rv = app.feed.view.ranks[first]
        assert int(rv.comp[tl.sel[1]]) == 0 and int(rv.begin[tl.sel[1]]) <= tl.t0 + (30 - GUTTER) * tl.npc
        await pilot.press("H")  # (the detail shows something else)
        await pilot.pause()
        assert app.detail.border_title == "history"
        tl.focus()
        await pilot.press("enter")
        await pilot.pause()
        assert app.detail.border_title == f"op · rank {first}"
        await pilot.press("e")
        await pilot.pause()
        assert app.focused is app.findings_panel and app.findings_panel.highlighted == 0
        await pilot.press("2", "enter")
        await pilot.pause()
        assert app.detail.border_title == "finding · missing_ranks"
        await pilot.press("r")
        await pilot.pause()
        assert app.query_one("#left").current == "gpu" and app.gpu.mode == "cpu"
        await pilot.press("r")
        await pilot.pause()
        assert app.query_one("#left").current != "gpu"
        table = app.ranks_table
        await pilot.press("3")
        await pilot.pause()
        assert table._sort_col == UNUSUAL  # (a job this wide opens sorted by how unusual a rank is)
        await pilot.press("s")  # the key cycles the sort on: by rank (the findings' ranks pinned on top)
        await pilot.pause()
        assert table._sort_col == "rank" and table.order[0] == 2050 and table.order[1:] == sorted(table.order[1:])
        await pilot.press("s")
        await pilot.pause()
        assert table._sort_col not in ("rank", UNUSUAL)
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, HelpScreen)

    drive(app, check, size=(200, 60))


@pytest.mark.parametrize(("fault", "kind", "culprits"), [
    ("dead", "dead_rank", [2050]), ("crashed", "rank_crashed", [2050]),
    ("straggler-host", "straggler", list(range(2048, 2056)))])
def test_the_ranks_that_matter_are_on_the_first_screen_of_thousands(fault, kind, culprits):
    """4,096 ranks at 80x24 with a dead rank, a crashed one, or a straggler host: the finding
    names it (nothing else), and the timeline opens with its ranks and their host's on top,
    the thousands of others summarized below."""
    from tui_scenarios import wide_fault

    events, now = wide_fault(fault)
    app = make_app(events, now)

    async def check(pilot):
        tl = app.timeline
        assert [(f.kind, f.culprits) for f in app.findings] == [(kind, culprits)]
        assert app.detail.border_title == f"finding · {kind}"
        assert tl.mode == "behaviour"
        top = [r.ranks for r in tl.rows[:8]]
        assert [r for rs in top for r in rs] == [*culprits, *(r for r in range(2048, 2056) if r not in culprits)]
        assert sum(len(r.ranks) for r in tl.rows[8:]) == 4088 and len(tl.rows) <= 12
        assert tl.scroll_offset.y == 0 and tl.size.height >= 8  # (the first screen holds them)

    drive(app, check, size=(80, 24))


def test_a_finding_naming_every_rank_pins_none_of_them():
    """A job killed as a whole: no rank's end recorded, a ``trace_incomplete`` naming all
    4,096 ranks beside the straggler host's finding.  Every rank was pinned, one row each
    (the summary gone, the host below the fold at 80x24: helper-188); now the host's ranks
    are on top and the rest summarized, as without it."""
    from tui_scenarios import wide_fault

    from commscope.analysis.findings import Finding

    events, now = wide_fault("straggler-host")
    app = make_app(events, now)
    culprits = list(range(2048, 2056))

    async def check(pilot):
        every = Finding("trace_incomplete", None, None, None, list(range(4096)), list(range(4096)),
                        "no rank's end was recorded", {})
        app.apply(app.info, [*app.findings, every])
        await pilot.pause()
        tl = app.timeline
        assert tl.flagged == set(culprits) and tl.pinned_rows == 8
        assert [r for row in tl.rows[:8] for r in row.ranks] == culprits
        assert sum(len(r.ranks) for r in tl.rows[8:]) == 4088 and len(tl.rows) <= 12

    drive(app, check, size=(80, 24))


def test_the_focused_row_follows_its_rank_when_c_changes_the_rows():
    """4,096 ranks: an op of rank 2051 (on the culprit's host, pinned) selected, ``c`` makes
    the rows by host: the focus stays on the row holding rank 2051, and ← takes its previous
    op.  The focus stayed at its index, on ranks 0-7's host, and ← took rank 0's (helper-188)."""
    from tui_scenarios import wide_missing_rank

    events, now = wide_missing_rank()
    app = make_app(events, now)

    async def check(pilot):
        tl = app.timeline
        tl.focus()
        assert tl.mode == "behaviour"
        tl.sel_row = next(i for i, row in enumerate(tl.rows) if row.ranks == (2051,))
        await pilot.press("left")
        await pilot.pause()
        assert tl.sel is not None and tl.sel[0] == 2051
        picked = tl.sel
        while tl.mode != "ranks":  # (every mode c cycles through)
            await pilot.press("c")
            await pilot.pause()
            assert 2051 in tl.rows[tl.sel_row].ranks, (tl.mode, tl.rows[tl.sel_row].label)
            assert tl.sel == picked
        await pilot.press("left")
        await pilot.pause()
        assert tl.sel[0] == 2051 and tl.sel[1] < picked[1]

    drive(app, check, size=(120, 40))


def test_an_80_column_header_keeps_the_mode_and_its_clock_and_cuts_the_job_s_name():
    """At 80 columns the header was cut at its end: a replay's state, play or pause, speed and
    cursor went, and a live clock was cut mid-value, while a long job name stayed whole
    (helper-188).  The rate, events, world and backend go first, then the name is cut."""
    from commscope.tui.feed import FeedInfo
    from commscope.tui.header import StatusHeader, line

    long = "missing-rank-20261207-150655-340cba-with-a-long-suffix"
    events, _ = hung_missing_rank()
    app = make_app(events, 0, mode=REPLAY)
    app.title_override = long

    async def check(pilot):
        header = str(app.header_bar.render())
        assert len(header) <= 80 and " ✖ 1 ▲ 0 " in header, header
        assert "· REPLAY ❚❚ x1 +" in header and header.rstrip().endswith(" s"), header
        await pilot.press("g", "space")
        header = str(app.header_bar.render())
        assert "· REPLAY ▶ x1 +" in header and "missing-rank-2026" in header, header

    drive(app, check, size=(80, 24))
    bar = StatusHeader()
    bar.show(FeedInfo(mode=LIVE, source="s", events=123_456, rate=4_321.0, waiting=False,
                      now_ns=1_780_000_012_400_000_000),
             job=long, world=4096, backend="nccl", errors=1, warnings=0, start_ns=1_780_000_000_000_000_000)
    live = str(line(bar._parts, 80))
    assert len(live) <= 80 and "· LIVE " in live and live.rstrip().endswith("(+12.4 s)"), live
    assert long[:20] in live and "…" in live and "events" not in live, live
    assert "4,096 ranks" in str(line(bar._parts, 200)) and "123,456 events" in str(line(bar._parts, 0))
    # (a name of wide characters is cut by cells, and a narrow line cuts the name to a letter
    # before the clock: 114 cells at 80, and the clock gone below ~57 columns, helper-189)
    from rich.cells import cell_len

    for name, width in (("训练任务-" * 12, 80), (long, 60)):
        bar.show(FeedInfo(mode=LIVE, source="s", events=1, rate=1.0, waiting=False, now_ns=1_780_000_012_400_000_000),
                 job=name, world=4096, backend="nccl", errors=1, warnings=0, start_ns=1_780_000_000_000_000_000)
        text = str(line(bar._parts, width))
        assert cell_len(text) <= width and text.rstrip().endswith("(+12.4 s)") and "…" in text, (width, text)


def test_home_and_end_move_the_replay_cursor_however_many_rows_scroll():
    """``home``/``end`` are the replay's start and end (the help's ``g G / home end``): in
    the timeline they scrolled its rows instead where it could scroll (4,096 ranks one row
    each) and left the cursor (helper-188)."""
    from tui_scenarios import wide_missing_rank

    events, _ = wide_missing_rank()
    app = make_app(events, 0, mode=REPLAY)

    async def check(pilot):
        tl, m = app.timeline, app.feed.model
        tl.focus()
        while tl.mode != "ranks":
            await pilot.press("c")
        await pilot.pause()
        assert tl.max_scroll_y > 0  # (rows to scroll)
        await pilot.press("home")
        assert app.cursor_ns == m.start_ns
        await pilot.press("end")
        assert app.cursor_ns == m.end_ns

    drive(app, check, size=(80, 24))


@pytest.mark.parametrize("wide", [False, True])
def test_a_resized_terminal_keeps_the_same_time_in_view_and_the_legend_on_screen(wide):
    """Shrunk from 200x60 to 80x24 the view kept its scale: the trace's end and the replay
    cursor went off it, and a stale horizontal scrollbar took the legend's line (helper-188;
    at 4 ranks as at 4,096).  The same time stays in view, and the legend on its line."""
    from tui_scenarios import wide_missing_rank

    events, _ = wide_missing_rank() if wide else hung_missing_rank()
    app = make_app(events, 0, mode=REPLAY)

    async def check(pilot):
        tl = app.timeline
        span = (tl.t0, tl.t1())
        assert span[0] <= app.cursor_ns <= span[1]
        await pilot.resize_terminal(80, 24)
        await pilot.pause()
        assert tl.t0 == span[0] and span[1] <= tl.t1() <= span[1] + tl.npc, (span, tl.t0, tl.t1())
        assert not tl.show_horizontal_scrollbar and tl.scrollable_content_region.height == tl.size.height
        await pilot.resize_terminal(200, 60)
        await pilot.pause()
        assert tl.t0 == span[0] and abs(tl.t1() - span[1]) <= 3 * tl.npc

    drive(app, check, size=(200, 60))


def test_the_80_column_footer_shows_help_quit_and_the_panel_keys_whole():
    """At 80 columns the footer read "? Hel" and hid q, e and r (the timeline's zoom and
    follow keys before them: helper-188); every key it shows is whole now, whichever pane
    has the focus, and ? lists the rest."""
    events, now = hung_missing_rank()
    app = make_app(events, now)

    async def check(pilot):
        for pane in ("1", "2", "3"):
            await pilot.press(pane)
            await pilot.pause()
            footer = _screen_text(app).splitlines()[-1]
            for key in ("c Collapse", "x Filter", "? Help", "q Quit", "e Next error", "r Ranks/GPU"):
                assert key in footer, (pane, footer)

    drive(app, check, size=(80, 24))


def test_the_gpu_panel_s_title_line_is_cut_with_an_ellipsis_beside_its_scrollbar():
    """4,096 ranks: the GPU panel's first line was cut by its scrollbar, "(no GPU samples"
    with no ellipsis (at 4 ranks, no scrollbar, it had one: helper-188)."""
    from tui_scenarios import wide_missing_rank

    events, now = wide_missing_rank()
    app = make_app(events, now)

    async def check(pilot):
        await pilot.press("r")
        await pilot.pause()
        gpu = app.gpu
        room = gpu.scrollable_content_region.width
        assert room < gpu.size.width  # (its scrollbar's columns)
        title = gpu.render_line(0).text
        assert len(title) == room and title.endswith("…") and title.startswith("CPU % · RSS"), (room, title)

    drive(app, check, size=(80, 24))


def test_a_resize_dragged_a_few_columns_at_a_time_keeps_the_time_in_view():
    """Zoomed in to the deepest zoom, the terminal dragged narrower two columns at a time and
    back: each step's scale was rounded from the last, and the error compounded (an 18.7 us
    view came back 26.9 us: helper-189).  The span the first resize kept is kept."""
    from commscope.tui.timeline import MIN_NPC

    events, _ = hung_missing_rank()
    app = make_app(events, 0, mode=REPLAY)

    async def check(pilot):
        tl = app.timeline
        tl.focus()
        for _ in range(40):
            await pilot.press("i")
        await pilot.pause()
        assert tl.npc == MIN_NPC
        span = tl.t1() - tl.t0
        for w in range(198, 79, -2):
            await pilot.resize_terminal(w, 40)
        await pilot.pause()
        assert abs((tl.t1() - tl.t0) - span) <= tl.npc, (span, tl.t1() - tl.t0)
        for w in range(82, 201, 2):
            await pilot.resize_terminal(w, 40)
        await pilot.pause()
        assert abs((tl.t1() - tl.t0) - span) <= tl.npc, (span, tl.t1() - tl.t0)

    drive(app, check, size=(200, 40))


def test_behaviour_rows_put_the_odd_ones_out_first():
    from tui_scenarios import hung_missing_rank

    from commscope.tui.rank_table import UNUSUAL
    from commscope.tui.timeline import behaviours

    events, now = hung_missing_rank()
    app = make_app(events, now)

    async def check(pilot):
        rows = behaviours(app.feed.view, [0, 1, 2, 3])
        assert [r.ranks for r in rows] == [(2,), (0, 1, 3)]
        assert rows[0].label == "r2" and rows[0].note.startswith("in recv")
        assert rows[1].label == "×3" and rows[1].note == "ranks 0, 1, 3: in all_reduce #7 (group 0)"
        table = app.ranks_table  # the rank table sorts the same way, "how unusual"
        table.focus()
        for _ in range(12):
            if table._sort_col == UNUSUAL:
                break
            await pilot.press("s")
        await pilot.pause()
        assert table._sort_col == UNUSUAL
        # (then, of the three in the all_reduce, the farthest from their median entry first:
        # rank 3 entered 2 ms after it, rank 0 1 ms before it, rank 1 at it)
        assert table.order == [2, 3, 0, 1]

    drive(app, check)


def test_a_rank_late_into_the_op_thousands_wait_in_is_on_the_rank_tables_first_screen():
    """4,096 ranks at 80x24, all but the culprit in one all_reduce, one of them 1.5 s after
    the rest: no finding names it, and it does what 4,087 others do, but the rank table opens
    with it right under the culprit (how far a rank is from the rest: ``farthest_first``)."""
    from tui_scenarios import wide_missing_rank

    from commscope.tui.rank_table import UNUSUAL

    events, now = wide_missing_rank(late=3001)
    app = make_app(events, now)

    async def check(pilot):
        found = [(f.kind, f.culprits) for f in app.feed.findings if f.severity == "error"]
        assert found == [("missing_ranks", [2050])]  # (nothing names rank 3001)
        await pilot.press("3")
        await pilot.pause()
        table = app.ranks_table
        assert table._sort_col == UNUSUAL and table.order[:2] == [2050, 3001]
        shown = [table.render_line(y).text for y in range(1, table.size.height)]
        assert shown[1].split()[0] == "3001" and "all_reduce" in shown[1], shown

    drive(app, check, size=(80, 24))


def test_the_heatmap_holds_every_rank_in_the_lines_the_timeline_has():
    """4,096 ranks in heat mode at 80x24: the culprit on top, every other rank in exactly one
    half-cell block, no more lines than the widget shows, the cells coloured by how busy."""
    from tui_scenarios import wide_missing_rank

    from commscope.tui import palette
    from commscope.tui.painter import paint_heat

    events, now = wide_missing_rank()
    app = make_app(events, now)

    async def check(pilot):
        tl = await rows_in(pilot, "heat")
        assert tl.rows[0].key == "r2050"
        heat = tl.rows[1:]
        assert 1 <= len(heat) <= tl.size.height - 2 and all(r.upper for r in heat)
        ranks = [r for row in heat for r in row.ranks]
        assert sorted(ranks) == [r for r in range(4096) if r != 2050]
        assert "ranks a half-cell" in heat[0].note
        line = tl.render_line(1).text
        assert "▀" in line and "r0" in line
        # (each line labelled with its ranks' range, not its first rank alone: helper-188)
        first = heat[0].ranks
        assert heat[0].label == f"r{first[0]}-{first[-1]}" and f" {heat[0].label} " in line, line
        # waiting past hang_after is red; blocks of the waiting ranks against an empty lower half
        win = tl.window(tl.timeline_width())
        segs = paint_heat(tl.model, heat[0].ranks[:heat[0].upper], (), win)
        red = palette.STYLE[palette.ERROR].color
        assert any(seg.style.color == red for seg in segs if seg.text)
        blank = paint_heat(tl.model, (2050,), (), win)  # the culprit: one op long ago, then nothing
        assert any(seg.style.color.name == palette.HEAT[0] for seg in blank if seg.text)

    drive(app, check, size=(80, 24))


@pytest.mark.parametrize("fault", ["dead", "crashed"])
def test_the_heatmap_colours_a_block_by_its_ranks_state_from_the_moment_one_went(fault):
    """Heat mode over 32 ranks (none pinned: each rank a half-cell), rank 10 dead (silent
    since before the all_reduce the others wait in) or crashed in it: its half-cell turns
    magenta from the moment its state says it went (last seen, or its exit) up to the clock,
    over the busy share; the rank beside it in the lower half, and every other block, do not;
    the legend says what the colours are."""
    from tui_scenarios import wide_fault

    from commscope.tui import palette
    from commscope.tui.painter import GUTTER

    events, now = wide_fault(fault, world=32, culprit=10)
    app = make_app(events, now)

    async def check(pilot):
        tl = await rows_in(pilot, "heat")
        at = next(y for y, row in enumerate(tl.rows) if 10 in row.ranks)
        row = tl.rows[at]
        assert row.ranks[:row.upper] == (10,) and row.ranks[row.upper:] == (11,)
        st = tl.model.states[10]
        assert st.kind == fault
        win = tl.window(tl.timeline_width())
        went, clock = (st.since_ns - win.t0) // win.npc, (win.now - win.t0) // win.npc
        assert 0 < went < clock < win.width  # (the test shows both sides of the moment)
        cells = []  # (upper colour, lower colour) per cell
        for seg in tl.render_line(at - tl.scroll_offset.y).crop(GUTTER, GUTTER + win.width)._segments:
            cells += [(seg.style.color.name, seg.style.bgcolor.name)] * len(seg.text)
        assert [c for c, _ in cells[went:clock + 1]] == [palette.HEAT_DOWN] * (clock + 1 - went)
        assert palette.HEAT_DOWN not in [c for c, _ in cells[:went]] + [c for c, _ in cells[clock + 1:]]
        assert palette.HEAT_DOWN not in [b for _, b in cells]
        for y, other in enumerate(tl.rows):
            if y != at:
                line = tl.render_line(y - tl.scroll_offset.y)
                assert all(palette.HEAT_DOWN not in (s.style.color.name, s.style.bgcolor.name)
                           for s in line._segments if s.style and s.style.color and s.style.bgcolor), other
        legend = tl.render_line(tl.size.height - 1).text
        assert "dead/crashed" in legend and "past hang_after" in legend

    drive(app, check, size=(80, 40))


def _heat_cells(tl, rank: int) -> tuple[list[tuple[str, str]], object]:
    """The (upper, lower) colour of each cell of the heatmap line holding ``rank``, and the window."""
    from commscope.tui.painter import GUTTER

    at = next(y for y, row in enumerate(tl.rows) if rank in row.ranks)
    win = tl.window(tl.timeline_width())
    cells = []
    for seg in tl.render_line(at - tl.scroll_offset.y).crop(GUTTER, GUTTER + win.width)._segments:
        cells += [(seg.style.color.name, seg.style.bgcolor.name if seg.style.bgcolor else "")] * len(seg.text)
    return cells, win


def test_a_heatmap_line_shows_a_death_judged_with_no_new_event():
    """A rank judged dead by its silence alone changes no version of the model: the view the
    feed publishes on its clock has the same version and new states.  The heatmap line of a
    rank gone dead meanwhile shows it from then on, though the line's other rank was dead
    already (its gutter dot the same): before, the line painted for the older states stayed."""
    from tui_scenarios import wide_fault

    from commscope.analysis.vocab import RankState
    from commscope.tui import palette

    events, now = wide_fault("dead", world=32, culprit=10)
    app = make_app(events, now)

    async def check(pilot):
        tl = await rows_in(pilot, "heat")
        cells, win = _heat_cells(tl, 11)
        assert palette.HEAT_DOWN not in [b for _, b in cells]  # (rank 11, the lower half: alive)
        view = app.feed.view
        went = view.states[10].since_ns + 2 * win.npc
        states = {**view.states, 11: RankState("dead", "dead (last seen ...)", None, went)}
        app.feed.view = app.feed.model.view(view.now, states)
        assert app.feed.view.version == view.version
        cells, win = _heat_cells(tl, 11)
        at, clock = (went - win.t0) // win.npc, (win.now - win.t0) // win.npc
        assert [b for _, b in cells[at:clock + 1]] == [palette.HEAT_DOWN] * (clock + 1 - at)
        assert palette.HEAT_DOWN not in [b for _, b in cells[:at]]

    drive(app, check, size=(80, 40))


def test_at_a_replay_cursor_the_heatmap_shows_a_death_only_once_the_cursor_is_where_it_was_known():
    """Replay: the heatmap takes the ranks' states as of the cursor, as the gutter dots do.
    Rank 10 goes silent (its last heartbeat) and is judged dead seconds later.  With the
    cursor 0.3 s after its last sign of life, its half-cell is not magenta (the trace's end
    says dead since then: before, the future was shown); at the trace's end it is, from
    that last sign up to the cursor."""
    from tui_scenarios import wide_fault

    from commscope.tui import palette

    events, now = wide_fault("dead", world=32, culprit=10)
    app = make_app(events, 0, mode=REPLAY)

    async def check(pilot):
        await wait_for(pilot, lambda: app.info.loaded)
        tl = await rows_in(pilot, "heat")
        st = app.feed.view.states[10]
        assert st.kind == "dead"
        seen = st.since_ns
        for cursor, dead in ((seen + 300 * MS, False), (tl.own_span()[1], True)):
            app.cursor_ns = cursor
            app._cursor_moved()
            await pilot.pause()
            cells, win = _heat_cells(tl, 10)
            at, c = (seen - win.t0) // win.npc, (cursor - win.t0) // win.npc
            assert 0 < at < c < win.width
            if dead:
                assert [u for u, _ in cells[at:c]] == [palette.HEAT_DOWN] * (c - at)  # (the cursor's own cell: │)
                assert palette.HEAT_DOWN not in [u for u, _ in cells[:at] + cells[c + 1:]]
            else:
                assert palette.HEAT_DOWN not in [u for u, _ in cells], cursor - seen

    drive(app, check, size=(80, 40))


def test_the_heatmaps_legend_stays_on_screen_under_the_streams_drawn_apart():
    """Heat mode, 128 ranks and two foreign streams drawn apart after the heatmap: its lines
    are sized for the room those leave, so the legend is still the widget's last line."""
    from tui_scenarios import wide_missing_rank

    events, now = wide_missing_rank(world=128, culprit=50)
    own = [{**e, "job": "synthetic-job", "run": "r0"} if e["type"] == "meta" else e for e in events]
    theirs = [{**e, "rank": e["rank"] + 126, "ts": e["ts"] + 30 * MS,
               **({"job": "another-job", "run": "r9"} if e["type"] == "meta" else {})}
              for r in (2, 3) for e in events if e["rank"] == r]
    app = make_app(own + theirs, now + 30 * MS)

    async def check(pilot):
        tl = await rows_in(pilot, "heat")
        assert sorted(tl.model.foreign) == [128, 129] and sum(r.apart for r in tl.rows) == 2
        assert len(tl.rows) < tl.size.height
        assert "past hang_after" in tl.render_line(tl.size.height - 1).text

    drive(app, check, size=(80, 24))


def test_a_heatmap_line_of_one_rank_is_painted_as_a_heatmap_line():
    """31 ranks, one a half-cell: the last heatmap line holds one rank, in its upper half.
    It is a heatmap line (``▀`` cells, its block's states), not a rank's own row."""
    from tui_scenarios import wide_fault

    events, now = wide_fault("dead", world=31, culprit=30)
    app = make_app(events, now)

    async def check(pilot):
        tl = await rows_in(pilot, "heat")
        last = tl.rows[-1]
        assert last.ranks == (30,) and last.upper == 1 and not last.alone
        assert set(tl.render_line(len(tl.rows) - 1 - tl.scroll_offset.y).text[11:].strip()) == {"▀"}
        from commscope.tui import palette
        cells, _ = _heat_cells(tl, 30)
        assert palette.HEAT_DOWN in [u for u, _ in cells]

    drive(app, check, size=(80, 40))


def test_the_rows_are_made_again_only_when_what_they_are_made_from_changed(monkeypatch):
    """The app asks for the rows ten times a second; by host at 16,384 ranks they take
    ~22 ms.  With the same view, mode, findings, filter and height they are not made again;
    a new view, findings' ranks, filter or height makes them."""
    from tui_scenarios import wide_missing_rank

    from commscope.tui import timeline

    made = []
    real = timeline.host_rows
    monkeypatch.setattr(timeline, "host_rows", lambda *a, **k: made.append(1) or real(*a, **k))
    events, now = wide_missing_rank(world=128, culprit=50)
    app = make_app(events, now)

    async def check(pilot):
        tl = await rows_in(pilot, "nodes")
        n = len(made)
        assert n >= 1
        for _ in range(5):
            tl.on_model_update(now)
        assert len(made) == n
        app.feed.view = app.feed.model.view(now, dict(app.feed.view.states))  # (a new view)
        tl.on_model_update(now)
        assert len(made) == n + 1
        for change in (lambda: tl.set_flagged({3}), lambda: setattr(tl, "only_findings", True),
                       lambda: setattr(tl, "only_findings", False)):
            change()
            tl.on_model_update(now)
            assert len(made) == n + 2, change  # (what the rows are made from changed: made again)
            n += 1
        await pilot.resize_terminal(80, 30)
        await pilot.pause()
        tl.on_model_update(now)
        assert len(made) == n + 2  # (the height: the heatmap's lines)

    drive(app, check, size=(80, 24))


def test_a_heatmap_block_is_grey_once_every_rank_of_it_exited_and_magenta_over_all_once_one_died():
    """``gone_cells``: a block shows exited only once all of its ranks have (from the last
    exit), a death from the first death, over an exit; nothing past the clock."""
    from commscope.analysis.vocab import RankState
    from commscope.tui.painter import GONE_DOWN, GONE_EXITED, GONE_NONE, Window, gone_cells

    win = Window(t0=0, npc=10, width=10, now=75)
    states = {1: RankState("exited", "", None, 30), 2: RankState("exited", "", None, 52),
              3: RankState("blocked", "", None, 5), 4: RankState("dead", "", None, 41),
              5: RankState("crashed", "", None, 60)}
    assert gone_cells(states, (1, 2), win).tolist() == [0] * 5 + [GONE_EXITED] * 3 + [0] * 2
    assert gone_cells(states, (1, 3), win).tolist() == [GONE_NONE] * 10  # (one still in it)
    assert gone_cells(states, (1, 4), win).tolist() == [0] * 4 + [GONE_DOWN] * 4 + [0] * 2
    assert gone_cells(states, (2, 4, 5), win).tolist() == [0] * 4 + [GONE_DOWN] * 4 + [0] * 2
    assert gone_cells(states, (3, 6), win).tolist() == [GONE_NONE] * 10  # (6: no state yet)


def test_by_host_4096_ranks_are_three_lines_the_culprit_its_host_and_the_hosts_alike():
    """Nodes mode at 4,096 ranks (8 a host), 80x24: the culprit pinned, the host it sits on
    expanded as its own line (its 7 other ranks and what they do), then the 511 other hosts,
    whose ranks all wait in the same all_reduce, as one line with their count: every rank in
    exactly one line, not 512 host lines."""
    from tui_scenarios import wide_missing_rank

    events, now = wide_missing_rank()
    app = make_app(events, now)

    async def check(pilot):
        tl = await rows_in(pilot, "nodes")
        assert [(r.key, r.label) for r in tl.rows[:2]] == [("r2050", "r2050"), ("n:node256", "node256")]
        assert tl.rows[1].ranks == tuple(r for r in range(2048, 2056) if r != 2050)
        assert tl.rows[1].note == "node256: 7 in all_reduce #4 (group 0)"
        assert len(tl.rows) == 3 and tl.rows[2].label == "×511"
        assert tl.rows[2].note == "511 hosts (node00 … node511): 8 in all_reduce #4 (group 0)"
        assert sorted(r for row in tl.rows for r in row.ranks) == list(range(4096))
        assert "511 hosts" in tl.render_line(2).text and "node256" in tl.render_line(1).text

    drive(app, check, size=(80, 24))


def test_page_down_shows_every_row_under_the_frozen_ones():
    """(helper-168) Eight culprits on eight hosts: 65 rows, 8 frozen.  A page scrolled the
    widget's whole height, and the rows the frozen ones covered were never on screen."""
    app = _missing_from_512((10, 70, 130, 190, 250, 310, 370, 430))

    async def check(pilot):
        tl = app.timeline
        tl.focus()
        tl.scroll_to(y=0, animate=False)
        await pilot.pause()
        assert tl._frozen() == 8 and len(tl.rows) > 2 * tl.size.height
        seen: set[int] = set()
        for _ in range(len(tl.rows)):
            seen |= {tl._row_at(y) for y in range(tl.size.height)}
            await pilot.press("pagedown")
            await pilot.pause()
        assert seen >= set(range(len(tl.rows)))
        for _ in range(len(tl.rows)):
            await pilot.press("pageup")
        await pilot.pause()
        assert tl.scroll_offset.y == 0

    drive(app, check, size=(120, 40))


def test_a_replay_cursor_judges_a_sample_of_a_collapsed_row_s_ranks(monkeypatch):
    """(helper-165) As of a replay cursor each rank is judged alone (~60 us): the 4,088 ranks'
    row judged all of them at each cursor step, and playback lagged seconds behind its keys.
    Its dot is judged from an even sample, as its shading is."""
    from tui_scenarios import wide_missing_rank

    from commscope.tui import timeline
    from commscope.tui.timeline import BEHAVIOUR_SAMPLE

    events, now = wide_missing_rank()
    app = make_app(events, now, mode=REPLAY)
    calls = []
    real = timeline.rank_state
    monkeypatch.setattr(timeline, "rank_state", lambda *a, **k: calls.append(a[1]) or real(*a, **k))

    async def check(pilot):
        tl = app.timeline
        big = max(tl.rows, key=lambda r: len(r.ranks))
        assert len(big.ranks) == 4088
        tl.cursor_ns = now - 3 * S
        calls.clear()
        assert tl._row_kind(tl.model, big) == "blocked"
        assert 0 < len(calls) <= BEHAVIOUR_SAMPLE and set(calls) <= set(big.ranks)

    drive(app, check, size=(120, 40))


def test_a_label_cut_to_the_gutter_says_it_was_cut():
    """(helper-165) At 80 columns a block "r128-255" read "r128-25", a range of its own, and
    host "node00256" read "node002", another host: a cut label says so, a host keeps its tail;
    a range whose end does not fit is cut after its dash ("r512-1…" read as 512-1xxx,
    helper-189)."""
    from commscope.tui.painter import LABEL, fit_label

    assert fit_label("r128-255") == "r128-…" and fit_label("r2049") == "r2049"
    assert fit_label("r512-1023") == "r512-…" and fit_label("r0-511") == "r0-511"
    assert fit_label("node00256", tail=True) == "…e00256" and len(fit_label("x" * 40)) == LABEL


def test_hosts_collapse_by_what_their_ranks_do_the_rarest_first():
    """``host_rows`` over 128 ranks (16 hosts), none pinned: node05, one of whose ranks is
    idle after all_reduce #3 while its others wait in #4, alone; node03 and node09, whose
    ranks are all idle, one line; the 13 hosts all waiting, one line after them.  A job of
    64 ranks or fewer: one line a host."""
    from tui_scenarios import MS, T0, S, TraceBuilder

    from commscope.analysis.model import TraceModel
    from commscope.analysis.rankstate import rank_states
    from commscope.tui.timeline import host_rows

    def model(world: int, unnamed: range = range(0)):
        b = TraceBuilder(world, ranks_per_host=8)
        t = T0 + 100 * MS
        for _ in range(3):
            t = b.collective(t, "all_reduce", latency=MS) + MS
        idle = set(range(24, 32)) | set(range(72, 80)) | {42}
        for r in range(world):
            if r not in idle:
                b.sync(r, t, None, "all_reduce")
        events = [{k: v for k, v in e.items() if k != "host" or e["rank"] not in unnamed} for e in b.sorted_events()]
        m = TraceModel.from_events(events)
        return m.view(t + S, rank_states(m, t + S))

    v = model(128)
    rows = host_rows(v, v.rank_ids())
    assert [(r.label, len(r.ranks)) for r in rows] == [("node05", 8), ("×2", 16), ("×13", 104)]
    assert rows[0].note == "node05: 7 in all_reduce #4 (group 0), 1 idle after all_reduce #3 (group 0)"
    assert rows[1].note == "2 hosts (node03, node09): 8 idle after all_reduce #3 (group 0)"
    assert rows[2].note.startswith("13 hosts (node00 … node15): 8 in all_reduce #4")
    assert sorted(r for row in rows for r in row.ranks) == list(range(128))
    assert [r.label for r in host_rows(v, v.rank_ids(), {"node09"})] == ["node09", "node05", "node03", "×13"]
    # ranks whose meta names no host are not one more host among the alike: a row of their own
    v = model(128, unnamed=range(120, 128))
    rows = host_rows(v, v.rank_ids())
    assert [(r.label, len(r.ranks)) for r in rows] == [("node05", 8), ("×2", 16), ("?", 8), ("×12", 96)]
    assert rows[2].note == "no host said: 8 in all_reduce #4 (group 0)"
    small = model(64)
    assert [(r.label, r.note) for r in host_rows(small, small.rank_ids(), summarize=False)] == \
        [(f"node{h:02d}", "") for h in range(8)]


def test_the_rank_table_of_thousands_computes_only_the_rows_it_shows():
    """4,096 ranks: the table orders every rank but computes the cells of the rows on screen
    only; page keys, end and a click move the cursor, and each row reached shows its rank."""
    from tui_scenarios import wide_missing_rank

    from commscope.tui.rank_table import CELL_CACHE

    events, now = wide_missing_rank()
    app = make_app(events, now)

    async def check(pilot):
        table = app.ranks_table
        await pilot.pause()
        assert table.row_count == 4096 and sorted(table.order) == list(range(4096))
        assert table.order[0] == 2050  # the culprit first
        shown = table.size.height - 1
        # the cells of the rows on screen (and of those a layout before the last showed), not of 4,096
        assert 0 < len(table._cells) <= 2 * table.size.height
        table.focus()
        await pilot.press("pagedown", "pagedown")
        await pilot.pause()
        assert table.cursor_row == 2 * shown
        line = table.render_line(table.cursor_row - int(table.scroll_offset.y) + 1).text
        assert line.split()[0] == str(table.order[table.cursor_row])  # the cursor's row is in view
        await pilot.press("end")
        await pilot.pause()
        assert table.cursor_row == 4095
        last = table.render_line(table.size.height - 1).text
        assert last.split()[0] == str(table.order[-1]) and "in all_reduce" in last
        await pilot.click(table, offset=(2, 3))  # the third row on screen
        await pilot.pause()
        assert table.cursor_row == int(table.scroll_offset.y) + 2
        assert len(table._cells) <= CELL_CACHE
        await pilot.press("home")
        await pilot.pause()
        assert table.cursor_row == 0 and table.scroll_offset.y == 0
        assert table.render_line(1).text.split()[:2] == ["2050", "○"]  # the culprit, idle

    drive(app, check, size=(80, 24))


def test_the_rank_table_paints_blank_rows_for_ranks_a_fresh_model_lacks():
    """Found by review: a live feed that starts again at the tail swaps its model before the
    app resets the table; a row scrolled into view then named a rank the model no longer has,
    and painting it raised (Textual exits on that).  It is blank until the next refresh."""
    from tui_scenarios import wide_missing_rank

    from commscope.analysis.model import TraceModel

    events, now = wide_missing_rank(world=1500, culprit=5)
    app = make_app(events, now)

    async def check(pilot):
        table = app.ranks_table
        await pilot.pause()
        with app.feed.lock:
            small = TraceModel()
            small.ingest([e for e in events if e.get("rank", 0) < 3])
            app.feed.model = small
        table.scroll_to(y=700, animate=False)
        await pilot.pause()
        lines = [table.render_line(y).text for y in range(1, table.size.height)]
        assert lines and all(not line.strip() for line in lines)  # blank, no KeyError
        table.reset()
        table.refresh_ranks(now)
        await pilot.pause()
        # (how unusual: of the three in the all_reduce, those entered farthest from their median first)
        assert table.order == [0, 2, 1] and table.render_line(1).text.split()[0] == "0"
        await pilot.click(table, offset=(2, table.size.height - 1))  # under the last row: nothing
        assert table.cursor_row == 0

    drive(app, check, size=(120, 40))


def test_attach_to_a_large_job_reads_it_apart_and_shows_the_culprit(tmp_path, monkeypatch):
    """``attach``'s first read of a large job goes to the worker processes from the feed's
    thread (``Feed.step``, ``read_apart``); the console then follows the job and names the
    culprit as a live console does, and quitting leaves no worker behind."""
    from test_oprecords import _bulkread_children

    from commscope.bench.synthstore import JobShape, write_store
    from commscope.store import bulkread
    from commscope.store.directory import DirectoryReader

    store = str(tmp_path / "trace")
    shape = JobShape(64, 40, fault="missing", hang_after=2.0, tail_s=6.0)
    span = S + 39 * int(S / shape.rate) + 500_000 + 6 * S  # (its trace ends about now: a live job)
    write_store(store, dataclasses.replace(shape, t0=time.time_ns() - span - S // 2))
    monkeypatch.setattr(DirectoryReader, "PARALLEL_MIN_BYTES", 0)
    by_workers(monkeypatch)
    started: list[int] = []
    real = bulkread.Workers.__init__
    monkeypatch.setattr(bulkread.Workers, "__init__", lambda self, n: started.append(n) or real(self, n))
    feed = Feed(open_source(store), mode=LIVE, source=store)
    feed.BUDGET = 1 << 14  # (several chunks)
    app = CommscopeApp(feed, bell=False)

    async def check(pilot):
        await wait_for(pilot, lambda: [f.culprits for f in app.findings if f.severity == "error"]
                       == [[shape.culprit_rank]])
        assert started == [2] and feed._first_done and app.feed.model.events
        # (the finding is the app's before the screen shows it: painted at the next refresh)
        await wait_for(pilot, lambda: f"r{shape.culprit_rank}" in _screen_text(app))
        await pilot.press("q")

    drive(app, check, loaded=False)
    assert _bulkread_children() == []


def _crashing_together() -> tuple[list[dict], int]:
    """64 ranks in an all_reduce at ``t``: rank 8 segfaults, ranks 9-23 a second later."""
    from commscope.analysis.synth import after_two

    b, t = after_two(64)
    for r in range(64):
        b.begin(r, t, "all_reduce")
        if 8 <= r < 24:
            b.exit(r, t + (MS if r == 8 else S), reason="signal", signal="SIGSEGV")
        else:
            b.heartbeats(t, t + 30 * S, interval=S, ranks=[r])
    return b.sorted_events(), t


def test_ranks_crashing_together_alert_once_and_are_listed_in_a_line():
    """Rank 8 crashes first; ranks 9-23 (the rest of its host and the next) crash the same
    way a second later.  The finding grows from rank 8's to one naming all 16: still one
    finding to the console (keyed by the first to go), one alert, and its culprits a line."""
    from commscope.analysis import TraceModel, diagnose

    events, t = _crashing_together()
    early = diagnose(TraceModel.from_events([e for e in events if e["ts"] <= t + S // 2]), t + S // 2, 2.0)
    later = diagnose(TraceModel.from_events(events), t + 30 * S, 2.0)
    assert [(f.kind, f.culprits) for f in early if f.severity == "error"] == [("rank_crashed", [8])]
    assert [(f.kind, f.culprits) for f in later if f.severity == "error"] == [("rank_crashed", list(range(8, 24)))]
    app = make_app(events, t + 30 * S)
    shown: list[str] = []
    app.notify = lambda message, **kw: shown.append(kw.get("title", ""))
    rings: list[int] = []
    app.use_bell = True
    app.bell = lambda: rings.append(1)

    async def check(pilot):
        app.apply(app.info, early)
        await pilot.pause()
        app.findings_panel.highlighted = 0
        await pilot.pause()
        app.apply(app.info, later)
        await pilot.pause()
        assert shown == ["rank_crashed"] and rings == [1]
        assert app.findings_panel.findings == later and app.findings_panel.highlighted == 0
        line = str(app.findings_panel.get_option_at_index(0).prompt).split("\n")[0]
        assert line.endswith("rank_crashed  16 culprits (8-23)"), line
        text = app.detail.text(width=120)
        assert "16 ranks (8-23) crashed together on hosts node01, node02; first rank 8" in text, text
        assert "16 ranks went together, on 2 hosts:" in text and "below, the first of them: rank 8" in text

    drive(app, check, loaded=False)


def test_ranks_gone_together_whose_first_is_read_last_stay_one_finding_highlighted():
    """(Review) Streams are read at different moments: rank 8 crashed first, but its exit
    is read after ranks 9-23's.  The finding's first rank changes from 9 to 8: still one
    alert, the highlight stays on it and the detail pane follows it; its culprits a line."""
    from commscope.analysis import TraceModel, diagnose

    events, t = _crashing_together()
    unread = [e for e in events if not (e["rank"] == 8 and e["type"] == "exit")]
    early = diagnose(TraceModel.from_events(unread), t + 30 * S, 2.0)
    later = diagnose(TraceModel.from_events(events), t + 30 * S, 2.0)
    assert [(f.kind, f.culprits[0], len(f.culprits)) for f in early if f.severity == "error"] == [("rank_crashed", 9, 15)]
    assert [(f.kind, f.culprits[0], len(f.culprits)) for f in later if f.severity == "error"] == [("rank_crashed", 8, 16)]
    app = make_app(events, t + 30 * S)
    shown: list[str] = []
    app.notify = lambda message, **kw: shown.append(kw.get("title", ""))

    async def check(pilot):
        app.apply(app.info, early)
        await pilot.pause()
        app.findings_panel.highlighted = 0
        await pilot.pause()
        assert "first rank 9" in app.detail.text(width=120)
        app.apply(app.info, later)
        await pilot.pause()
        assert shown == ["rank_crashed"]
        assert app.findings_panel.highlighted == 0 and app.findings_panel.findings == later
        text = app.detail.text(width=120)
        assert "first rank 8 crashed" in text and "16 culprits (8-23)" in text, text

    drive(app, check, loaded=False)


def test_a_rank_that_crashes_again_after_a_restart_alerts_again():
    """(Review) Rank 3 segfaults; the job restarts (its groups' next incarnation) and rank 3
    crashes again, of another cause, seconds later: a new finding, a new alert."""
    from commscope.analysis import TraceModel, diagnose
    from commscope.analysis.synth import after_two

    b, t = after_two(4, ranks_per_host=0)
    for r in range(4):
        b.begin(r, t, "all_reduce")
    b.exit(3, t + MS, reason="signal", signal="Segmentation fault")
    b.heartbeats(b.t0, t + 3 * S, ranks=[0, 1, 2])
    t1 = t + 3 * S
    b.group("0@1", [0, 1, 2, 3])
    t = t1 + S
    for _ in range(3):
        t = b.collective(t, "all_reduce", "0@1") + MS
    for r in range(4):
        b.begin(r, t, "all_reduce", "0@1")
    b.exit(3, t + MS, reason="exception", exc="RuntimeError: CUDA error: out of memory")
    b.heartbeats(t1, t + 10 * S, ranks=[0, 1, 2])
    t2 = t + 10 * S
    events = b.sorted_events()
    first = diagnose(TraceModel.from_events([e for e in events if e["ts"] <= t1]), t1, 2.0)
    again = diagnose(TraceModel.from_events(events), t2, 2.0)
    assert [(f.kind, f.culprits, f.group) for f in first if f.severity == "error"] == [("rank_crashed", [3], "0")]
    assert [(f.kind, f.culprits, f.group) for f in again if f.severity == "error"] == [("rank_crashed", [3], "0@1")]
    app = make_app(events, t2)
    shown: list[str] = []
    app.notify = lambda message, **kw: shown.append(message)

    async def check(pilot):
        app.apply(app.info, first)
        await pilot.pause()
        app.apply(app.info, again)
        await pilot.pause()
        assert len(shown) == 2 and "SIGSEGV" in shown[0] and "out of memory" in shown[1], shown

    drive(app, check, loaded=False)


def test_what_the_reader_said_is_counted_in_the_header_and_shown_with_w(tmp_path):
    """A stream that says its store lost 401 of its lines (a directory deleted under the
    rank): the header counts the reader's warning, and ``w`` shows it with its cause, as
    ``check`` prints it; before any, ``w`` says there is none."""
    import orjson

    t0 = time.time_ns()
    b = TraceBuilder(2, t0=t0)
    for k in range(3):
        b.collective(t0 + k * 10 * MS, latency=2 * MS)
    store = tmp_path / "trace"
    writers = {r: open_writer(store, "job1", r, {"world_size": 2}) for r in range(2)}
    for r in range(2):
        writers[r].write([encode(e) for e in b.events if e["rank"] == r])
    feed = Feed(open_source(store), mode=LIVE, source=str(store))
    app = CommscopeApp(feed, bell=False)
    lost = orjson.dumps({"type": "dropped", "v": 3, "rank": 1, "ts": t0 + 40 * MS, "count": 0, "entries": 401,
                         "reason": "store_lost: the job directory was deleted"})

    async def check(pilot):
        await wait_for(pilot, lambda: app.info.events == len(b.events))
        assert "read warning" not in str(app.header_bar.render())
        await pilot.press("w")
        await pilot.pause()
        assert app.detail.border_title == "read warnings"
        assert "the reader has said nothing" in app.detail.text()
        writers[1].write([lost])
        # (the finding the loss makes opens itself in the detail first: then ``w`` is pressed)
        await wait_for(pilot, lambda: app.info.warnings_total == 1 and app.findings
                       and (app.detail.border_title or "").startswith("finding"))
        assert [(f.kind, f.culprits) for f in app.findings] == [("trace_incomplete", [1])]
        await pilot.pause(0.3)
        assert "· 1 read warning (w)" in str(app.header_bar.render())
        await pilot.press("w")
        await pilot.pause()
        text = " ".join(app.detail.text(width=200).split())
        assert "rank 1: 401 line(s) of its stream were lost: the job directory was deleted" in text, text

    drive(app, check, size=(200, 40), loaded=False)


def test_what_readers_said_before_a_restart_is_kept_and_what_is_read_again_is_said_once(tmp_path):
    """A restart at the tail swaps in a reader of the window: a loss it does not read again
    (before the window) stays said; one it reads again is said once, not twice."""
    import orjson

    t0 = time.time_ns() - 5 * S
    b = TraceBuilder(2, t0=t0)
    for k in range(3):
        b.collective(t0 + k * 10 * MS, latency=2 * MS)
    lost = orjson.dumps({"type": "dropped", "v": 3, "rank": 1, "ts": t0 + 40 * MS, "count": 0, "entries": 401,
                         "reason": "store_lost: the job directory was deleted"})
    said = "rank 1: 401 line(s) of its stream were lost: the job directory was deleted"
    stores = {}
    for name, extra in (("with", [lost]), ("without", [])):
        stores[name] = tmp_path / name
        writers = {r: open_writer(stores[name], "job1", r, {"world_size": 2}) for r in range(2)}
        for r in range(2):
            writers[r].write([encode(e) for e in b.events if e["rank"] == r] + (extra if r == 1 else []))
    feed = Feed(open_source(stores["with"]), mode=LIVE, source=str(stores["with"]))
    feed.step()
    assert (feed.info.warnings_total, feed.info.warnings) == (1, (said,))
    feed._swap_in(open_source(stores["without"]))  # (a window that starts after the loss)
    feed.step()
    assert (feed.restarts, feed.info.warnings_total, feed.info.warnings) == (1, 1, (said,))
    feed._swap_in(open_source(stores["with"]))  # (one that reads it again)
    feed.step()
    assert (feed.restarts, feed.info.warnings_total, feed.info.warnings) == (2, 1, (said,))
    # a text said for separate events (a reconnection each time): each copy said again stands for one
    feed._carry_warnings(["reconnected to redis://h:6379"] * 3, ["reconnected to redis://h:6379"])
    assert feed._said_before == ["reconnected to redis://h:6379"] * 2  # (and the new reader's one: 3 in all)
    assert feed._said_before_total == 2


def test_an_ended_job_s_header_is_posted_again_once_its_backlog_and_rate_settle(monkeypatch):
    """The feed posts an ended job again only when something changes; the header kept the
    "falling behind (21.1 MiB unread)" and the rate of the last post before the job ended,
    its backlog asked at most every BACKLOG_S (helper-181).  What the header shows (behind,
    the backlog, whether events come) is among what changes."""
    import threading

    from commscope.analysis.synth import T0, TraceBuilder
    from commscope.tui.feed import FeedUpdated

    b = TraceBuilder(2, hang_after=2.0)
    t = b.warmup()
    for r in range(2):
        b.exit(r, t + 10 * MS, reason="destroy_process_group")
    b.heartbeats(T0, t)
    end = t + 10 * MS
    reader = StaticReader(sorted(b.events, key=lambda e: e["ts"]))
    backlog = [64 << 20]  # (what the reader says it has not read yet: then nothing)
    monkeypatch.setattr(reader, "backlog_bytes", lambda: backlog[0], raising=False)
    feed = Feed(reader, clock=lambda: end + 3600 * S, source="x")
    monkeypatch.setattr(feed, "BACKLOG_S", 0.0)
    monkeypatch.setattr(feed, "ENDED_POLL_S", 0.0)
    posted: list = []
    stop = threading.Event()
    steps = [0]
    real = feed.step

    def step():
        steps[0] += 1
        if posted and posted[-1].info.ended:
            backlog[0] = 0  # (read to its end: the next backlog asked says so)
        if steps[0] > 50:
            stop.set()
        return real()

    monkeypatch.setattr(feed, "step", step)
    feed._follow(lambda m: posted.append(m) if isinstance(m, FeedUpdated) else None, stop)
    assert any(m.info.ended and m.info.behind for m in posted)  # (as the header said it)
    assert posted[-1].info.ended and not posted[-1].info.behind and posted[-1].info.behind_bytes == 0
    assert posted[-1].info.rate == 0


def test_the_view_follows_the_replay_cursor():
    """g, G and playback set follow, but the view followed only a live clock: zoomed in, the
    cursor went off screen and the rows read blank while playing (helper-198)."""
    events, _ = healthy(4)
    app = make_app(events, 0, mode=REPLAY)

    def in_view() -> bool:
        tl = app.timeline
        return tl.t0 <= app.cursor_ns < tl.t1()

    async def check(pilot):
        await pilot.press("+", "+", "+", "+", "+")
        tl = app.timeline
        assert tl.t1() - tl.t0 < (app.feed.model.end_ns - app.feed.model.start_ns) // 4  # (zoomed in)
        for key in ("g", "G", "g"):
            await pilot.press(key)
            assert in_view(), (key, tl.t0, tl.t1(), app.cursor_ns)
        await pilot.press("space")
        far = tl.t1()
        await wait_for(pilot, lambda: app.cursor_ns > far or not app.playing)
        assert in_view(), (tl.t0, tl.t1(), app.cursor_ns)

    drive(app, check)


def test_a_window_of_a_long_job_opens_on_what_was_read(tmp_path):
    """`replay --since 1h` of a job of days opened on its first day at the widest zoom, every
    row blank: the ops read are at its end (helper-198)."""
    from commscope.analysis.source import load_trace
    from commscope.bench.synthstore import JobShape, write_store
    from commscope.window import Since

    store = str(tmp_path / "trace")
    write_store(store, JobShape(4, 8000, fault="healthy", days=3, segment_bytes=128 << 10, retain="1MiB"))
    end = load_trace(store)[0].end_ns  # (the window by the trace's clock: its files' times are today's)
    feed = Feed(open_source(store, since=Since(at_ns=end - 3600 * S)), mode=REPLAY, source=store)
    app = CommscopeApp(feed, start_feed=False, bell=False)

    async def check(pilot):
        tl, m = app.timeline, app.feed.model
        window = app.feed.reader.window_start_ns()
        assert m.end_ns - m.start_ns > 86400 * S and window is not None  # (the job's span: days)
        assert tl.t0 <= window and m.end_ns < tl.t1(), (tl.t0, tl.t1(), window, m.end_ns)
        assert tl.t1() - tl.t0 < 2 * (m.end_ns - window) + 10 * S  # (fitted to the window read)

    drive(app, check, size=(120, 40))


def test_a_whole_trace_whose_ops_began_late_opens_on_all_of_it():
    """A rank that crashed during a 20-minute load, before any op, the others' ops only after
    it: the view opens on the whole trace, the crash in it (fitting to the ops read, for a
    window's sake, put it off screen: helper-201)."""
    b = TraceBuilder(4)
    crash = b.t0 + 60 * S
    b.exit(3, crash, reason="exception", exc="RuntimeError: checkpoint shard 3 is corrupt")
    t = b.t0 + 1200 * S
    for _ in range(3):
        t = b.collective(t, "all_reduce", ranks=[0, 1, 2]) + MS
    b.heartbeats(b.t0, t, ranks=[0, 1, 2])
    app = make_app(b.sorted_events(), 0, mode=REPLAY)

    async def check(pilot):
        tl = app.timeline
        assert tl.t0 <= crash < tl.t1(), (tl.t0 - b.t0, tl.t1() - b.t0)

    drive(app, check)
