"""CommscopeApp: the console shared by ``attach`` (live), ``replay`` and ``demo``.

Only the feed differs: a live tail against the wall clock, or a whole trace with a
replay cursor.  The feed runs on a worker thread; this module only renders.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

import numpy as np
from textual import events
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import Screen
from textual.widgets import ContentSwitcher, Footer

from commscope.analysis import Finding
from commscope.analysis.completeness import ReaderProblem
from commscope.analysis.findings import DEPARTED
from commscope.analysis.model import NESTED, untimed
from commscope.analysis.rankstate import rank_state, top_level_ops
from commscope.analysis.report import summarized_history
from commscope.analysis.rootcause import went_together
from commscope.analysis.source import Loading
from commscope.tui.detail import DetailPane, finding_detail, history_detail, op_detail, warnings_detail
from commscope.tui.feed import LIVE, REPLAY, Feed, FeedInfo, FeedUpdated
from commscope.tui.findings_panel import FindingsPanel, finding_key, same_finding
from commscope.tui.fmt import count
from commscope.tui.gpu_panel import GpuPanel
from commscope.tui.header import StatusHeader, read_losses
from commscope.tui.loadbar import LoadBar
from commscope.tui.rank_table import RankTable
from commscope.tui.ruler import Ruler
from commscope.tui.screens import HELP_SECTIONS, HelpScreen
from commscope.tui.timeline import Timeline, flagged_ranks

SPEEDS = [0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 100, 1000]


class LoadProgress(Message):
    """How far a replay's load is (what the load bar shows)."""

    def __init__(self, at: Loading):
        super().__init__()
        self.at = at

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, LoadProgress)


class CommscopeApp(App):
    CSS_PATH = "app.tcss"
    TITLE = "commscope"
    BINDINGS = [
        # (the timeline's and the rank table's keys, here so they work whichever pane has the focus;
        # first, so the footer says them before the rest as when they were the timeline's)
        Binding("c", "collapse", "Collapse"),
        Binding("x", "filter_findings", "Filter"),  # (its findings' ranks only: "Findings only" cut the footer)
        Binding("s", "cycle_sort", "Sort", show=False),
        Binding("question_mark", "help", "Help"),
        Binding("q", "quit", "Quit"),
        Binding("space", "play_pause", "Play/pause", show=False),
        Binding("right_square_bracket", "faster", "Faster", show=False),
        Binding("left_square_bracket", "slower", "Slower", show=False),
        Binding("n", "step_next", "Next op", show=False),
        Binding("p", "step_prev", "Prev op", show=False),
        Binding("g,home", "jump_start", "Start", show=False),
        Binding("G,end", "jump_end", "End", show=False),
        Binding("e", "next_error", "Next error"),
        Binding("r", "toggle_panel", "Ranks/GPU"),
        Binding("H", "history", "History", show=False),
        Binding("w", "read_warnings", "Read warnings", show=False),
        Binding("1", "focus('timeline')", "Timeline", show=False),
        Binding("2", "focus('findings')", "Findings", show=False),
        Binding("3", "focus('ranks')", "Ranks", show=False),
    ]
    #: How long a new error finding's notification stays up (``_alert``), in seconds of the
    #: terminal's clock (a console whose clock is frozen, as in its snapshots, holds it longer)
    ALERT_S = 8.0

    def __init__(self, feed: Feed, *, clock: Callable[[], int] = time.time_ns, start_feed: bool = True,
                 bell: bool = True, title: str | None = None):
        super().__init__()
        self.feed = feed
        self.clock = clock
        self.start_feed = start_feed
        self.use_bell = bell
        self.job_title = title or feed.source
        self.title_override: str | None = None
        self.findings: list[Finding] = []
        self.info: FeedInfo = feed.info
        self._alerted: set[tuple] = set()
        self._alerted_gone: list[Finding] = []  # departures alerted, as they grew (``_alert``)
        self._stop = threading.Event()
        self._last_table = 0.0
        self._table_cost = 0.0  # seconds the rank table's last refresh took
        self.loadbar = LoadBar(id="loadbar")
        self._finding_jump: tuple[int, int] | None = None
        self._shown_finding: Finding | None = None  # the finding the detail pane shows, kept current
        self._auto_op: tuple[int, int] | None = None  # the op selected on open (not by the user)
        self._problem: str | None = None  # what kept the trace from being read
        self._untimed_cache: dict[int, tuple[int, int]] = {}  # rank -> (version, ops without timings)
        self._untimed_total, self._untimed_at = 0, 0.0
        # replay clock
        self.cursor_ns: int | None = None
        self.playing = False
        self.speed = 1.0
        self._last_tick = 0.0
        self.timeline = Timeline(feed, id="timeline")
        self.ruler = Ruler(self.timeline, id="ruler")
        self.header_bar = StatusHeader(id="status")
        self.ranks_table = RankTable(feed, id="ranks")
        self.gpu = GpuPanel(feed, id="gpu")
        self.findings_panel = FindingsPanel(id="findings")
        self.detail = DetailPane(id="detail")
        # Held, not queried: an app query looks at the active screen, which is the
        # scenario picker while the demo's menu is open, and a feed update or a key
        # comes then too.
        self.top = Vertical(id="top")
        self.left = ContentSwitcher(initial="ranks", id="left")

    # ------------------------------------------------------------------ layout
    def compose(self) -> ComposeResult:
        yield self.header_bar
        yield self.loadbar
        with self.top:
            yield self.ruler
            yield self.timeline
        with Horizontal(id="bottom"):
            with self.left:
                yield self.ranks_table
                yield self.gpu
            yield self.findings_panel
            yield self.detail
        yield Footer()

    def on_mount(self) -> None:
        self.top.border_title = self.timeline.pane_title()
        self.left.border_title = "ranks  [dim](r: GPU)[/]"
        self.findings_panel.border_title = "findings"
        self.detail.border_title = "detail"
        self.timeline.focus()
        self._show_header()
        if self.feed.mode == REPLAY and self.start_feed and not self.feed.info.loaded:
            self.loadbar.start()
        if self.start_feed:
            self.run_worker(self._feed_thread, thread=True, exclusive=True, name="feed")
        self.set_interval(0.1, self._tick)

    def _feed_thread(self) -> None:
        feed, stop = self.feed, self._stop  # a switch_feed later leaves this thread its own
        feed.run(lambda msg: self.post_message(msg) if feed is self.feed else None, stop,
                 progress=lambda f: self.post_message(LoadProgress(f)))

    def switch_feed(self, feed: Feed, title: str | None = None) -> None:
        """Show another source (the demo picker starting a scenario): new model, fresh state."""
        self._stop.set()
        self._stop = threading.Event()
        self.feed = feed
        self.job_title = title or feed.source
        for widget in (self.timeline, self.ranks_table, self.gpu):
            widget.feed = feed
        self.timeline.reset()
        self.ranks_table.reset()
        self.findings = []
        self.info = feed.info
        self._auto_op = None
        self._problem = None
        self._untimed_cache.clear()
        self._untimed_total, self._untimed_at = 0, 0.0
        self._alerted.clear()
        self._alerted_gone.clear()
        self.cursor_ns = None
        self.playing = False
        self.findings_panel.show([])
        self.detail.show(self.detail.placeholder(), "detail")
        self.timeline.refresh()
        self._show_header()
        if self.start_feed:
            self.run_worker(self._feed_thread, thread=True, exclusive=True, name="feed")

    async def action_quit(self) -> None:
        self._stop.set()
        self.exit()

    def on_unmount(self) -> None:
        self._stop.set()

    # ------------------------------------------------------------------ feed updates
    def on_load_progress(self, message: LoadProgress) -> None:
        if not self.info.loaded:
            self.loadbar.set(message.at)

    def on_feed_updated(self, message: FeedUpdated) -> None:
        self.apply(message.info, message.findings)

    def apply(self, info: FeedInfo, findings: list[Finding]) -> None:
        """Show a new feed state (also called directly by tests)."""
        if info.restarts != self.info.restarts:  # a new model, from the tail: what was drawn of the old goes
            self.timeline.reset()
            self.ranks_table.reset()
        first_load = info.loaded and not self.info.loaded
        just_ended = info.ended and not self.info.ended  # the table shows the end at once
        self.info = info
        self._problem = self._reader_problem(info)
        if self._problem and (info.error or not any(f.kind == "trace_incomplete" for f in findings)):
            # The reader's failure is a finding too: never "no problems found" on a trace not read.
            ev = ReaderProblem(reader_error=info.error) if info.error else ReaderProblem(damaged=info.corrupt,
                                                                                         invalid=info.invalid)
            findings = [Finding("trace_incomplete", None, None, None, [], [], self._problem, ev), *findings]
        self.findings = findings
        self.timeline.empty_text = self._problem
        if info.mode == REPLAY and info.loaded:
            self.loadbar.done()
            if first_load or self.cursor_ns is None:
                self.cursor_ns = self.feed.view.trace_end()  # the whole job (a foreign stream's end is not its); g goes to the start
            if first_load:
                self.timeline.unplace()  # a layout during the load placed the view on a part
        self.timeline.cursor_ns = self.cursor_ns
        self.timeline.hang_after_ns = int(self.feed.hang_after() * 1e9)
        flagged = flagged_ranks(findings, len(self.feed.model.ranks))
        self.timeline.set_flagged(flagged)
        self.top.border_title = self.timeline.pane_title()
        self.ranks_table.flagged = flagged
        self.timeline.on_model_update(self._now())
        self._fit_timeline()
        self.ruler.refresh()
        loading = info.mode == REPLAY and not info.loaded
        self.findings_panel.show(findings, empty=FindingsPanel.LOADING if loading else None)
        self._refresh_finding_detail(findings)
        if first_load or just_ended or self._table_due(0.5):
            self._refresh_table()
            self.gpu.refresh_ranks()
        self._show_header()
        if info.mode == LIVE:
            self._alert(findings)
        untouched = self.timeline.sel is None or self.timeline.sel == self._auto_op
        if findings and untouched and not (self.detail.border_title or "").startswith("finding"):
            # Nothing chosen yet: open the most important finding, so a hang explains itself.
            self.findings_panel.highlighted = 0
        elif not findings and self.timeline.sel is None and self._auto_op is None and not loading:
            # No finding: select the latest op (the one still running, if any), once.
            target = self._latest_op()
            if target is not None:
                self._auto_op = target
                self.timeline.select(*target)
        if self.timeline.sel is not None and self.detail.border_title and self.detail.border_title.startswith("op"):
            self._show_op(*self.timeline.sel)

    def _reader_problem(self, info: FeedInfo) -> str | None:
        """What kept the trace from being read, for the header and the findings list."""
        if info.error:
            return f"the trace could not be read: {info.error}"
        if info.mode == REPLAY and info.loaded and self.feed.model.events == 0:
            if info.corrupt or info.invalid:
                skipped = [count(n, what) for n, what in ((info.corrupt, "damaged line"),
                                                          (info.invalid, "invalid event")) if n]
                return f"no readable event ({' and '.join(skipped)} skipped)"
            return "the trace holds no events"
        return None

    def _untimed_ops(self) -> int:
        """Ops completed without a measured duration (cached per rank version; a live job's
        count is refreshed at most once a second: it scans every changed rank's ops)."""
        m = self.feed.model
        mono = time.monotonic()
        if self.feed.mode != REPLAY and mono - self._untimed_at < 1.0:
            return self._untimed_total
        self._untimed_at = mono
        total = 0
        with self.feed.lock:
            for r, rt in m.ranks.items():
                hit = self._untimed_cache.get(r)
                if hit is None or hit[0] != rt.version:
                    n = rt.n
                    top = (m.sig_flags(rt.sig[:n]) & NESTED) == 0
                    hit = (rt.version, int((top & untimed(rt.flags[:n], rt.begin[:n], rt.comp[:n])).sum()))
                    self._untimed_cache[r] = hit
                total += hit[1]
        self._untimed_total = total
        return total

    def _latest_op(self) -> tuple[int, int] | None:
        """The top-level op that began last (up to the replay cursor), on any rank."""
        m = self.feed.model
        now = self._now()
        best: tuple[int, int, int] | None = None
        with self.feed.lock:
            for r in m.rank_ids():
                rt = m.ranks[r]
                order = top_level_ops(m, r)
                order = order[rt.begin[order] <= now] if self.feed.mode == REPLAY else order
                if order.shape[0] and (best is None or int(rt.begin[order[-1]]) > best[0]):
                    best = (int(rt.begin[order[-1]]), r, int(order[-1]))
        return None if best is None else (best[1], best[2])

    def _refresh_finding_detail(self, findings: list[Finding]) -> None:
        """Keep the finding shown in the detail pane current: the same finding (by kind,
        instance and culprits) as just diagnosed, else the one that now names the same
        culprits (a live finding may turn, say, from op_failed into dead_rank)."""
        shown = self._shown_finding
        if shown is None or not (self.detail.border_title or "").startswith("finding"):
            return
        now = next((f for f in findings if same_finding(shown, f)), None)
        if now is None:
            now = next((f for f in findings if f.culprits and f.culprits == shown.culprits), None)
        if now is None or now is shown:
            return
        self.findings_panel.keep_highlight(now)
        scroll = self.detail.scroll_y
        self._shown_finding = now
        self.detail.show(finding_detail(now), f"finding · {now.kind}")
        self.detail.scroll_to(y=scroll, animate=False)

    def on_timeline_view_changed(self, message: Timeline.ViewChanged) -> None:
        self.ruler.refresh()

    def _fit_timeline(self, screen_height: int | None = None) -> None:
        """Few ranks: the timeline takes only the rows it needs and the panels get the rest."""
        rows = len(self.timeline.rows)
        top = self.top
        if screen_height is None:
            screen_height = self.size.height
        want = rows + 4  # border, ruler, legend
        limit = max(8, int(screen_height * 0.6))
        height = min(want, limit) if rows else max(8, screen_height // 3)
        if top.styles.height is None or top.styles.height.value != height:
            top.styles.height = height

    def on_resize(self, event: events.Resize) -> None:
        # The event's size: the app's own is updated after its handlers run.
        self._fit_timeline(event.size.height)

    def _alert(self, findings: Iterable[Finding]) -> None:
        """A new error finding draws attention once: a notification and the bell."""
        for f in findings:
            key = finding_key(f)
            if f.severity != "error" or key in self._alerted:
                continue
            self._alerted.add(key)
            if f.kind in DEPARTED:  # ranks that went together, read a moment apart: one alert
                known = any(went_together(g, f) for g in self._alerted_gone)
                self._alerted_gone.append(f)
                if known:
                    continue
            self.notify(f.message, title=f.kind, severity="error", timeout=self.ALERT_S, markup=False)
            if self.use_bell:
                self.bell()

    def _now(self) -> int:
        """Replay: the cursor.  Live: the clock, held back by how far the feed's reader is
        behind (``FeedInfo.lag_s``: ranks are judged as of what was read, ``Feed.now``), or a
        job's end once it ended (the feed's judgement, ``Feed.ended``): an ended job is shown
        frozen, as ``check`` judges it."""
        if self.feed.mode == REPLAY:
            return self.cursor_ns if self.cursor_ns is not None else self.feed.view.trace_end()
        if self.info.ended and self.info.now_ns:
            return self.info.now_ns
        return self.clock() - int(self.info.lag_s * 1e9)

    def _show_header(self) -> None:
        with self.feed.lock:  # (the feed's thread may be adding ranks)
            m = self.feed.model
            meta = next((rt.meta for rt in m.ranks.values() if rt.meta), None) or {}
            world = m.world_size
        job = self.title_override or (m.job or {}).get("job") or meta.get("job") or self.job_title
        errors = sum(f.severity == "error" for f in self.findings)
        warnings = sum(f.severity == "warning" for f in self.findings)
        self.header_bar.show(self.info, job=str(job), world=world, backend=str(meta.get("backend", "?")),
                             errors=errors, warnings=warnings, cursor_ns=self.cursor_ns,
                             start_ns=self.timeline.own_span()[0],  # (the job's: not a foreign stream's start)
                             playing=self.playing, speed=self.speed, problem=self._problem,
                             untimed=self._untimed_ops())

    def _tick(self) -> None:
        """10 Hz: advance the replay cursor; in live mode keep in-flight spans growing."""
        mono = time.monotonic()
        dt = mono - self._last_tick if self._last_tick else 0.0
        self._last_tick = mono
        if self.feed.mode == REPLAY:
            if self.playing and self.cursor_ns is not None:
                end = max(self.timeline.own_span()[1], self.cursor_ns)  # (the job's end; a cursor past it stays)
                self.cursor_ns = min(end, self.cursor_ns + int(dt * self.speed * 1e9))
                if self.cursor_ns >= end:
                    self.playing = False
                self._cursor_moved(playing=True)
            return
        if self.feed.model.events and not self.info.ended:  # an ended job does not move
            self.timeline.on_model_update(self._now())
            self.ruler.refresh()
            self._show_header()

    def _table_due(self, every: float) -> bool:
        """Whether the rank table is due again: every ``every`` s, or ten times what it took
        last (16k ranks' rows take ~1 s: the UI thread keeps nine tenths for the rest)."""
        return time.monotonic() - self._last_table > max(every, 10 * self._table_cost)

    def _refresh_table(self) -> None:
        t0 = time.monotonic()
        self.ranks_table.refresh_ranks(self._now())
        self._last_table = time.monotonic()
        self._table_cost = self._last_table - t0

    def _cursor_moved(self, playing: bool = False) -> None:
        self.timeline.cursor_ns = self.cursor_ns
        self.timeline.on_model_update(self._now())
        self.ruler.refresh()
        self._show_header()
        if not playing or self._table_due(0.25):  # playback refreshes the table at 4 Hz
            self._refresh_table()

    # ------------------------------------------------------------------ selection
    def on_timeline_op_selected(self, message: Timeline.OpSelected) -> None:
        if self._finding_jump == (message.rank, message.index):
            self._finding_jump = None  # the timeline moved for a finding: keep its evidence
            return
        self._show_op(message.rank, message.index)

    def _show_op(self, rank: int, index: int) -> None:
        with self.feed.lock:
            body = op_detail(self.feed.model, rank, index, self._now())
        self.detail.show(body, f"op · rank {rank}")

    def on_findings_panel_chosen(self, message: FindingsPanel.Chosen) -> None:
        f = message.finding
        self._shown_finding = f
        self.detail.show(finding_detail(f), f"finding · {f.kind}")
        target = self._finding_op(f)
        if target is not None:
            self._finding_jump = target
            self.timeline.select(*target)

    def _finding_op(self, f: Finding) -> tuple[int, int] | None:
        """The op a finding is about: the op its evidence names (the blocked op, the waiting
        collective, the first op of a cycle, the failed op), else the collective instance on a
        culprit, else what a culprit is blocked in: never a foreign stream's op (a finding that
        names only foreign streams leaves the view on the job's, at its end)."""
        m = self.feed.model
        ev = f.evidence or {}
        with self.feed.lock:
            apart = m.kept_apart
            for key in ("blocked_op", "op", "cycle", "ops", "failed"):
                cand = ev.get(key)
                if isinstance(cand, dict) and "rank" not in cand:
                    cand = next(iter(cand.values()), None)  # keyed by rank
                if isinstance(cand, list):
                    cand = cand[0] if cand else None
                if isinstance(cand, dict) and isinstance(cand.get("rank"), int) and isinstance(cand.get("id"), int):
                    idx = m.op_index(cand["rank"], cand["id"])
                    if idx is not None:
                        return cand["rank"], idx
            if f.group is not None and f.seq is not None and f.kind in ("missing_ranks", "collective_mismatch",
                                                                        "straggler"):
                at = m.collective(f.group, f.seq)
                for r in list(f.culprits) + sorted(at):
                    if r in at:
                        return r, at[r]
            for r in list(f.culprits) + list(f.ranks):
                st = rank_state(m, r, self._now()) if r in m.ranks and r not in apart else None
                if st is not None and st.op is not None:
                    return r, st.op
        return None

    # ------------------------------------------------------------------ actions
    def help_sections(self) -> list[tuple[str, list[tuple[str, str]]]]:
        """What ``?`` lists; an app with keys of its own (the demo) adds a section."""
        return HELP_SECTIONS

    def action_help(self) -> None:
        self.push_screen(HelpScreen(self.help_sections()))

    def action_history(self) -> None:
        """The history the timeline does not hold, in the detail pane: what retention
        summarized (per op over every rank) and what the window did not read."""
        with self.feed.lock:
            rows = summarized_history(self.feed.model)
            stats = self.feed.reader.stats
            shown = (stats.skipped_bytes, stats.summarized, stats.skipped_events, stats.gone_before_window)
        self.detail.show(history_detail(rows, *shown), "history")

    def action_read_warnings(self) -> None:
        """What reading the store said, in the detail pane: what kept the trace from being
        read, the lines and events the header counts as skipped, events lost or trimmed with
        their cause, a reconnection, a read process lost (the header counts them)."""
        self.detail.show(warnings_detail(self.info.warnings, self.info.warnings_total,
                                         [why for _, why in read_losses(self.info)], self._problem),
                         "read warnings")

    def action_toggle_panel(self) -> None:
        sw = self.left
        sw.current = "gpu" if sw.current == "ranks" else "ranks"
        sw.border_title = "GPU per rank  [dim](r: ranks)[/]" if sw.current == "gpu" else "ranks  [dim](r: GPU)[/]"
        if sw.current == "gpu":
            self.gpu.refresh_ranks()

    #: The console's own panes' actions (bound on the app so that they work whichever pane
    #: has the focus): not on a screen over it (the demo's scenario picker, helper-174)
    CONSOLE_ACTIONS = frozenset({"collapse", "filter_findings", "cycle_sort"})

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return action not in self.CONSOLE_ACTIONS or self.screen is self.screen_stack[0]

    def action_collapse(self) -> None:
        self.timeline.action_collapse()

    def action_filter_findings(self) -> None:
        self.timeline.action_filter_findings()
        self.top.border_title = self.timeline.pane_title()

    def action_cycle_sort(self) -> None:
        self.ranks_table.action_cycle_sort()

    def action_focus(self, which: str) -> None:
        {"timeline": self.timeline, "findings": self.findings_panel, "ranks": self.ranks_table}[which].focus()

    def action_next_error(self) -> None:
        errs = [i for i, f in enumerate(self.findings) if f.severity == "error"] or list(range(len(self.findings)))
        if not errs:
            self.notify("no findings", timeout=2)
            return
        cur = self.findings_panel.highlighted
        nxt = next((i for i in errs if cur is None or i > cur), errs[0])
        self.findings_panel.focus()
        self.findings_panel.highlighted = nxt

    def _replay_only(self) -> bool:
        if self.feed.mode != REPLAY or self.cursor_ns is None:
            self.notify("replay controls work in `commscope replay`", timeout=2)
            return False
        return True

    def action_play_pause(self) -> None:
        if self._replay_only():
            start, end = self.timeline.own_span()
            if self.cursor_ns >= end:
                self.cursor_ns = start
            self.playing = not self.playing
            self._show_header()

    def _set_speed(self, step: int) -> None:
        i = min(range(len(SPEEDS)), key=lambda k: abs(SPEEDS[k] - self.speed))
        self.speed = SPEEDS[max(0, min(len(SPEEDS) - 1, i + step))]
        self._show_header()

    def action_faster(self) -> None:
        if self._replay_only():
            self._set_speed(1)

    def action_slower(self) -> None:
        if self._replay_only():
            self._set_speed(-1)

    def action_jump_start(self) -> None:
        if self._replay_only():
            self.cursor_ns = self.timeline.own_span()[0]  # (the job's: not a foreign stream's)
            self.timeline.follow = True
            self._cursor_moved()

    def action_jump_end(self) -> None:
        if self._replay_only():
            self.cursor_ns = self.timeline.own_span()[1]
            self.timeline.follow = True
            self._cursor_moved()

    def _step(self, forward: bool) -> None:
        """Move the cursor to the next/previous op begin on any rank, and select that op."""
        if not self._replay_only():
            return
        m = self.feed.model
        best: tuple[int, int, int] | None = None
        with self.feed.lock:
            for r in m.rank_ids():
                order = top_level_ops(m, r)
                if order.shape[0] == 0:
                    continue
                begins = m.ranks[r].begin[order]
                j = int(np.searchsorted(begins, self.cursor_ns, side="right")) if forward else \
                    int(np.searchsorted(begins, self.cursor_ns, side="left")) - 1
                if 0 <= j < order.shape[0]:
                    t = int(begins[j])
                    if best is None or (t < best[0] if forward else t > best[0]):
                        best = (t, r, int(order[j]))
        if best is None:
            return
        self.cursor_ns = best[0]
        self.timeline.follow = True
        self._cursor_moved()
        self.timeline.select(best[1], best[2])

    def action_step_next(self) -> None:
        self._step(True)

    def action_step_prev(self) -> None:
        self._step(False)

    # ------------------------------------------------------------------ command palette
    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        tl = self.timeline
        # (title, the key and what it does: its help line, never the title again; with the
        # title for help, the palette showed every entry twice, helper-202)
        entries = [
            ("Help: key bindings", "?: every key and the timeline colours", self.action_help),
            ("Timeline: zoom in", "+ or i: around the selection, the cursor or now", tl.action_zoom_in),
            ("Timeline: zoom out", "- or o", tl.action_zoom_out),
            ("Timeline: pan left", "h or shift+←: stops following", tl.action_pan_left),
            ("Timeline: pan right", "l or shift+→: stops following", tl.action_pan_right),
            ("Timeline: follow live / jump to now", "f", tl.action_follow),
            ("Timeline: next op", "→: on the highlighted rank", tl.action_select_next),
            ("Timeline: previous op", "←: on the highlighted rank", tl.action_select_prev),
            ("Timeline: rows by rank / behaviour / node / block", "c: then the heatmap", self.action_collapse),
            ("Timeline: only ranks with findings", "x", self.action_filter_findings),
            ("Findings: next error", "e", self.action_next_error),
            ("Panels: switch ranks / GPU", "r", self.action_toggle_panel),
            ("Panels: history", "H: what retention summarized, what the window did not read", self.action_history),
            ("Panels: read warnings", "w: what reading the store said, and what the header counts as skipped",
             self.action_read_warnings),
            ("Ranks: sort by next column", "s (or click a header)", self.ranks_table.action_cycle_sort),
            ("Timeline: selected op's detail", "enter: on the timeline", tl.action_open_op),
            ("Focus: timeline", "1", lambda: self.action_focus("timeline")),
            ("Focus: findings", "2", lambda: self.action_focus("findings")),
            ("Focus: ranks", "3", lambda: self.action_focus("ranks")),
            ("Replay: play / pause", "space", self.action_play_pause),
            ("Replay: faster", "]", self.action_faster), ("Replay: slower", "[", self.action_slower),
            ("Replay: step to next op", "n: the next op begin on any rank", self.action_step_next),
            ("Replay: step to previous op", "p: the previous op begin on any rank", self.action_step_prev),
            ("Replay: jump to start", "g or home", self.action_jump_start),
            ("Replay: jump to end", "G or end", self.action_jump_end),
        ]
        for title, help_text, cb in entries:
            yield SystemCommand(title, help_text, cb)
