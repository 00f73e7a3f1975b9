"""``commscope demo``: the console plus a scenario picker that starts, stops and restarts jobs.

Each scenario runs as real worker processes (``commscope.scenarios.DemoJob``) recording
to a fresh store; the console attaches to that store like ``commscope attach`` would.
Stopping, restarting, picking another scenario and quitting all stop the workers; no
process outlives the app.
"""

from __future__ import annotations

import atexit
import os
import threading
from typing import Any

from rich.text import Text
from textual.app import ComposeResult, ScreenStackError, UnknownModeError
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.content import Content
from textual.screen import Screen
from textual.widgets import Footer, OptionList, Static
from textual.widgets.option_list import Option

from commscope.store import EmptyReader
from commscope.tui.app import CommscopeApp
from commscope.tui.feed import LIVE, Feed


class ScenarioPicker(Screen):
    """Lists the scenarios with what each does and what to look for."""

    BINDINGS = [
        Binding("enter", "start", "Start", show=True, priority=True),
        Binding("S", "stop", "Stop"),
        Binding("R", "restart", "Restart"),
        Binding("escape", "back", "Console"),
        Binding("q", "quit", "Quit"),
    ]
    DEFAULT_CSS = """
    ScenarioPicker { layout: vertical; }
    ScenarioPicker #title { height: 3; padding: 1 2; background: $panel; }
    ScenarioPicker #list { width: 42; border: round $primary; }
    ScenarioPicker #about { border: round $primary-darken-2; padding: 0 2; }
    ScenarioPicker #status { height: 1; padding: 0 2; color: $text-muted; }
    """

    def __init__(self, scenarios: dict[str, Any], current: str | None = None):
        super().__init__()
        self.scenarios = scenarios
        self.names = list(scenarios)
        self.current = current if current in scenarios else self.names[0]

    def compose(self) -> ComposeResult:
        yield Static(Text.assemble(("commscope demo", "bold"), "  pick a scenario: a real job on local Gloo ranks"),
                     id="title")
        with Horizontal():
            options = []
            for name, sc in self.scenarios.items():
                t = Text(sc.title, style="bold")
                t.append(f"\n{name}" + ("  · hangs" if sc.hangs else ""), style="grey62")
                options.append(Option(t, id=name))
            yield OptionList(*options, id="list")
            with VerticalScroll(id="about"):
                yield Static(id="about-text")
        yield Static(id="status")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#list").border_title = "scenarios"
        self.query_one("#about").border_title = "about"
        lst = self.query_one("#list", OptionList)
        lst.highlighted = self.names.index(self.current)
        lst.focus()
        self._describe(self.current)
        self.show_status()

    def _describe(self, name: str) -> None:
        sc = self.scenarios[name]
        t = Text()
        t.append(f"{sc.title}\n\n", style="bold")
        t.append(sc.summary + "\n\n")
        t.append("What to look for\n", style="bold #4f8fd6")
        t.append(sc.look_for + "\n\n")
        t.append(f"{sc.default_ranks} ranks by default · ", style="grey62")
        t.append("hangs, then ends on its own" if sc.hangs else "runs to completion", style="grey62")
        if sc.expected:
            kinds = ", ".join(sorted({k for k, _ in sc.expected}))
            t.append(f"\nexpected findings: {kinds}", style="grey62")
        else:
            t.append("\nexpected findings: none", style="grey62")
        self.query_one("#about-text", Static).update(t)

    def show_status(self) -> None:
        app = self.app
        job = getattr(app, "job", None)
        if job is None:
            text = "no scenario running · enter starts the highlighted one"
        else:
            state = "finished" if job.finished else ("running" if job.alive() else "stopped")
            text = f"{app.job_name}: {state} · {len(job.alive())} worker(s) alive · store {job.store}"
        for status in self.query("#status").results(Static):  # (none yet: the app's tick came before
            status.update(Content(text))  # the picker was composed; its mount shows the status)

    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        if event.option.id:
            self._describe(event.option.id)

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.action_start()

    def _highlighted(self) -> str:
        lst = self.query_one("#list", OptionList)
        return self.names[lst.highlighted or 0]

    def action_start(self) -> None:
        self.app.start_scenario(self._highlighted())

    def action_stop(self) -> None:
        self.app.action_stop_demo()
        self.show_status()

    def action_restart(self) -> None:
        self.app.action_restart_demo()

    def action_back(self) -> None:
        if getattr(self.app, "job", None) is not None:
            self.app.pop_screen()

    async def action_quit(self) -> None:
        await self.app.action_quit()


class DemoApp(CommscopeApp):
    BINDINGS = [
        Binding("m", "menu", "Scenarios", tooltip="scenarios: pick one to start (enter), esc returns"),
        Binding("S", "stop_demo", "Stop demo", tooltip="stop the running scenario (its workers are killed)"),
        Binding("R", "restart_demo", "Restart demo", tooltip="start the scenario shown again, on a fresh store"),
    ]

    def __init__(self, *, scenarios: dict[str, Any], job_factory: Any, scenario: str | None = None,
                 ranks: int | None = None, backend: str = "gloo", store: str | None = None, hang_after: float = 3.0,
                 job_options: dict[str, Any] | None = None, keep: bool = False, **kwargs: Any):
        """``scenarios`` (name -> scenario) and ``job_factory`` (``scenarios.DemoJob``) come
        from the caller (``commands/demo.py``): the console does not import the workloads.
        ``keep``: leave the temporary traces of the runs behind (else removed on quit)."""
        from commscope.launch import warm_up

        warm_up()  # before Textual takes over stderr, which multiprocessing's spawns need
        super().__init__(Feed(EmptyReader("commscope demo"), mode=LIVE, source="commscope demo"), **kwargs)
        self.scenarios = scenarios
        self.job_factory = job_factory
        self.job_options = dict(job_options or {})  # e.g. pace/steps for quick runs
        self.first = scenario
        self.ranks = ranks
        self.backend = backend
        self.store_root = store
        self.demo_hang_after = hang_after
        self.job: Any = None
        self.job_name = ""
        self.keep = keep
        self.jobs: list[Any] = []  # every run started: their temporary traces go on quit
        self.picker: ScenarioPicker | None = None  # the one on screen; a fresh one per `m`
        atexit.register(self._clean_up)

    def on_mount(self) -> None:
        super().on_mount()
        import signal

        if threading.current_thread() is threading.main_thread():
            # The terminal closed: no quit comes, and Python's default for SIGHUP skips atexit.
            signal.signal(signal.SIGHUP, self._hang_up)
        if self.first:
            self.start_scenario(self.first)
        else:
            self.action_menu()
        self.set_interval(1.0, self._job_status)

    def help_sections(self) -> list[tuple[str, list[tuple[str, str]]]]:
        return [*super().help_sections(), ("Demo", [(b.key, b.tooltip) for b in self.BINDINGS])]

    def start_scenario(self, name: str) -> None:
        """Stop what runs, then launch ``name`` off the UI thread (the first launch starts
        the worker forkserver, which takes a second) and attach the console to its store."""
        self._stop_job()
        self.job, self.job_name = None, name
        self.title_override = f"demo {name} · starting…"
        self._show_header()
        if self._picker_shown():
            self.pop_screen()
        self.picker = None
        self.run_worker(lambda: self._launch(name), thread=True, exclusive=True, group="demo-launch")

    def _launch(self, name: str) -> None:
        from commscope.analysis.source import open_source

        job = None
        try:
            job = self.job_factory(name, ranks=self.ranks, backend=self.backend, store=self.store_root,
                                   hang_after=self.demo_hang_after, **self.job_options)
            job.start()
            reader = open_source(job.store, wait=True)
        except (ValueError, OSError, RuntimeError) as exc:
            if job is not None:
                job.discard()  # it never ran: nothing of it to keep
            self.call_from_thread(self.notify, str(exc), title=f"cannot start {name}", severity="error", timeout=10,
                                  markup=False)
            return
        self.call_from_thread(self._attach, name, job, reader)

    def _attach(self, name: str, job: Any, reader: Any) -> None:
        if self.job_name != name or self.job is not None:  # something else was started meanwhile
            if self.keep:
                job.stop()
            else:
                job.discard()
            return
        self.job = job
        self.jobs.append(job)
        feed = Feed(reader, mode=LIVE, hang_after=self.demo_hang_after, clock=self.clock, source=str(job.store))
        self.switch_feed(feed, title=f"demo {name}")
        self._job_status()
        where = f"trace: {job.store}" + (" (removed on quit; --keep keeps it)" if job.temporary and not self.keep
                                         else "")
        self.notify(f"{name} started on {job.ranks} ranks (S stops it, R restarts it, m picks another). {where}",
                    timeout=6, markup=False)

    def _stop_job(self) -> None:
        job = self.job
        if job is not None:
            try:
                job.stop()
            except Exception:
                pass

    def _hang_up(self, signum: int, _frame: object) -> None:
        """The terminal went away: stop the workers, remove the temporary traces, leave."""
        self._clean_up()
        os._exit(128 + signum)

    def _clean_up(self) -> None:
        """Stop what runs; remove the temporary traces of every run unless ``keep``."""
        self._stop_job()
        if self.keep:
            return
        for job in self.jobs:
            try:
                job.discard()
            except Exception:
                pass

    def _picker_shown(self) -> bool:
        """Whether the picker is the screen shown.  No screen is while the app closes, and
        the status tick can come then (under load, after the test's pilot let go: Textual
        raised ``ScreenStackError``)."""
        if self.picker is None:
            return False
        try:
            return self.screen is self.picker
        except (ScreenStackError, UnknownModeError):
            return False

    def _job_status(self) -> None:
        if self.job is not None:
            state = "finished" if self.job.finished else ("running" if self.job.alive() else "stopped")
            self.title_override = f"demo {self.job_name} · {state}"
            self._show_header()
        if self._picker_shown():
            self.picker.show_status()

    def action_menu(self) -> None:
        """Show the picker, its cursor on the scenario shown.  A new screen each time: a
        popped screen is removed by Textual, and pushing the removed one again left it
        unpainted in a real terminal (the console's last frame stayed, keys went to it)."""
        if self._picker_shown():
            return
        self.picker = ScenarioPicker(self.scenarios, current=self.job_name or None)
        self.push_screen(self.picker)

    def action_stop_demo(self) -> None:
        if self.job is None:
            self.notify("no scenario is running", timeout=3)
            return
        self._stop_job()
        self.notify(f"{self.job_name}: workers stopped", timeout=4)
        self._job_status()

    def action_restart_demo(self) -> None:
        if self.job_name:
            self.start_scenario(self.job_name)

    async def action_quit(self) -> None:
        self._clean_up()
        await super().action_quit()

    def on_unmount(self) -> None:
        self._clean_up()
        super().on_unmount()
