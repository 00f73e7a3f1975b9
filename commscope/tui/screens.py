"""Modal screens: key help."""

from __future__ import annotations

from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from commscope.tui import palette

HELP_SECTIONS: list[tuple[str, list[tuple[str, str]]]] = [
    ("Timeline", [("← →", "previous / next op on the highlighted rank"), ("↑ ↓", "move between ranks"),
                  ("+ / i, - / o", "zoom in / out"), ("h l, shift+← →", "pan (stops following)"),
                  ("f", "follow live and jump to now"), ("c", "rows: ranks → behaviour → nodes → blocks → heatmap"),
                  ("x", "show only ranks named in findings"), ("click", "select the op under the mouse"),
                  ("enter", "show the selected op's detail")]),
    ("Replay", [("space", "play / pause"), ("] [", "faster / slower"), ("n p", "step to the next / previous op"),
                ("g G / home end", "jump to start / end")]),
    ("Panels", [("tab / shift+tab", "move focus between timeline, ranks, findings, detail"),
                ("1 2 3", "focus timeline / findings / ranks"), ("e", "next error finding"),
                ("s", "sort ranks by the next column (or click a header)"),
                ("pageup pagedown", "rank table: a page up / down (↑ ↓ a row, home end: first / last)"),
                ("r", "GPU panel ↔ rank table"),
                ("H", "history: what retention summarized, what the window did not read"),
                ("w", "read warnings: what the header counts as skipped, events lost or trimmed and why, "
                      "reconnections")]),
    ("App", [("?", "this help"), ("ctrl+p", "command palette (every action)"), ("q", "quit")]),
]


class HelpScreen(ModalScreen[None]):
    """Every key, by section: ``HELP_SECTIONS`` plus what the app adds (the demo's keys)."""

    BINDINGS = [Binding("escape,question_mark,q", "dismiss", "Close")]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll { width: 84; max-width: 100%; height: auto; max-height: 100%;
                                  border: round $accent; background: $panel; padding: 0 1; }
    """

    def __init__(self, sections: list[tuple[str, list[tuple[str, str]]]] | None = None):
        super().__init__()
        self.sections = HELP_SECTIONS if sections is None else sections

    def compose(self) -> ComposeResult:
        t = Table(box=None, padding=(0, 2), show_header=False)
        t.add_column(style="bold #4f8fd6", no_wrap=True)
        t.add_column()
        for title, keys in self.sections:
            t.add_row(f"[bold underline]{title}[/]", "")
            for k, what in keys:
                t.add_row(k, what)
            t.add_row("", "")
        legend = Table(box=None, padding=(0, 1), show_header=False, title="timeline colours",
                       title_justify="left", title_style="bold")
        for cat, name in palette.LEGEND:
            legend.add_row(f"[{palette.STYLE[cat]}]{palette.GLYPH[cat] * 3}[/]", name)
        with VerticalScroll() as box:  # scrolls where the terminal is shorter than the list
            box.border_title = "keys"
            box.border_subtitle = "↑↓ scroll · esc closes"
            yield Static(t)
            yield Static(legend)
