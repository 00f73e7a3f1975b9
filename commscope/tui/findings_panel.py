"""The findings list: the live diagnose() result.  Highlighting one shows its evidence."""

from __future__ import annotations

from rich.text import Text
from textual.message import Message
from textual.widgets import OptionList
from textual.widgets.option_list import Option

from commscope.analysis import Finding
from commscope.analysis.findings import LISTED_RANKS
from commscope.analysis.ranks import ranges
from commscope.tui import palette
from commscope.tui.rank_table import abbreviate


def finding_key(f: Finding) -> tuple:
    """A finding's identity across diagnoses: ranks that went together are keyed by the
    first to go, so a host's ranks judged a moment apart stay one finding (one alert)."""
    together = f.evidence.get("together")
    return (f.kind, f.group, f.seq, (together["first"],) if together else tuple(sorted(f.culprits)))


def _culprits_text(culprits: list[int]) -> str:
    """'culprit 3' / 'culprits 0, 2' / '8,192 culprits (0-8191)': a line, however many."""
    if len(culprits) > LISTED_RANKS:
        return f"{len(culprits):,} culprits ({ranges(sorted(culprits), limit=4)})"
    return f"culprit{'s' if len(culprits) > 1 else ''} {', '.join(map(str, culprits))}"


class FindingsPanel(OptionList):
    class Chosen(Message):
        def __init__(self, finding: Finding):
            super().__init__()
            self.finding = finding

    NONE = "no problems found"
    LOADING = "findings come once the whole trace is read"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.findings: list[Finding] = []
        self._keys: list[tuple] | None = None
        self.empty_text = self.NONE

    def show(self, findings: list[Finding], _old: list[tuple] | None = None, *, empty: str | None = None) -> None:
        """List ``findings``; with none, say ``empty`` (default: that there is no problem)."""
        keys = [finding_key(f) + (f.message,) for f in findings]
        empty = empty or self.NONE
        if keys == self._keys and (keys or empty == self.empty_text):
            return
        self.empty_text = empty
        highlighted = self.highlighted
        old = _old or self._keys or []
        # the same finding by identity, whatever its message now says (a wait grows: "35.2 s")
        prev = old[highlighted][:-1] if highlighted is not None and highlighted < len(old) else None
        self.findings = findings
        self._keys = keys
        self.clear_options()
        if not findings:
            self.add_option(Option(Text(self.empty_text, style="grey50 italic"), disabled=True))
            return
        for f in findings:
            t = Text(no_wrap=False)
            t.append(f"{palette.SEVERITY_ICON[f.severity]} ", style=palette.SEVERITY_STYLE[f.severity])
            t.append(f.kind, style=palette.SEVERITY_STYLE[f.severity])
            if f.culprits:
                t.append(f"  {_culprits_text(f.culprits)}", style="bold")
            t.append("\n  " + self._fit_names(f.message), style="grey70")
            self.add_option(Option(t))
        ids = [k[:-1] for k in keys]
        if prev is not None and prev in ids:
            # Keep the highlight on it without a new Chosen: the app refreshes the detail pane
            # itself (and choosing again would move the timeline away from the user's op).
            with self.prevent(OptionList.OptionHighlighted):
                self.highlighted = ids.index(prev)

    def on_resize(self) -> None:
        if self.findings and self._keys is not None:
            keys, self._keys = self._keys, None  # lay the entries out again for the new width
            self.show(self.findings, _old=keys)

    def _fit_names(self, message: str) -> str:
        """A narrow list abbreviates op names too long for a line (all_gather_into_tensor ->
        ag_tensor) rather than folding them mid-word; the detail pane keeps them whole."""
        room = self.size.width - 4 if self.size.width else 10**6
        return " ".join(abbreviate(w, room) if len(w) > room and "_" in w else w for w in message.split(" "))

    def keep_highlight(self, finding: Finding) -> None:
        """Highlight ``finding`` (the one the detail pane shows) without choosing it again."""
        idx = next((i for i, f in enumerate(self.findings) if f is finding), None)
        if idx is not None and idx != self.highlighted:
            with self.prevent(OptionList.OptionHighlighted):
                self.highlighted = idx

    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        if self.findings and event.option_index < len(self.findings):
            self.post_message(self.Chosen(self.findings[event.option_index]))

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        if self.findings and event.option_index < len(self.findings):
            self.post_message(self.Chosen(self.findings[event.option_index]))
