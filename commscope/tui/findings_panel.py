"""The findings list: the live diagnose() result.  Highlighting one shows its evidence."""

from __future__ import annotations

from rich.text import Text
from textual.message import Message
from textual.widgets import OptionList
from textual.widgets.option_list import Option

from commscope.analysis import Finding
from commscope.analysis.findings import culprits_text
from commscope.analysis.rootcause import went_together
from commscope.tui import palette
from commscope.tui.rank_table import abbreviate


def finding_key(f: Finding) -> tuple:
    return (f.kind, f.group, f.seq, tuple(sorted(f.culprits)))


def same_finding(a: Finding, b: Finding) -> bool:
    """The same finding in two diagnoses: the same key, or ranks that went together
    (``rootcause.went_together``: they grow as they are read, the first maybe last)."""
    return finding_key(a) == finding_key(b) or went_together(a, b)


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
        shown = self.findings[highlighted] if highlighted is not None and highlighted < len(self.findings) else None
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
                t.append(f"  {culprits_text(f.culprits)}", style="bold")
            t.append("\n  " + self._fit_names(f.message), style="grey70")
            self.add_option(Option(t))
        ids = [k[:-1] for k in keys]
        at = ids.index(prev) if prev is not None and prev in ids else next(
            (i for i, f in enumerate(findings) if shown is not None and same_finding(shown, f)), None)
        if at is not None:
            # Keep the highlight on it without a new Chosen: the app refreshes the detail pane
            # itself (and choosing again would move the timeline away from the user's op).
            with self.prevent(OptionList.OptionHighlighted):
                self.highlighted = at

    def on_resize(self) -> None:
        if self.findings and self._keys is not None:
            keys, self._keys = self._keys, None  # lay the entries out again for the new width
            self.show(self.findings, _old=keys)

    def _fit_names(self, message: str) -> str:
        """A narrow list abbreviates op names too long for a line (all_gather_into_tensor ->
        ag_tensor) rather than folding them mid-word, and breaks a list of ranks too long
        for one after its commas ("(0-2049,2051-4" read as ranks 2051-4: helper-188); the
        detail pane keeps them whole."""
        room = self.size.width - 4 if self.size.width else 10**6

        def fit(w: str) -> str:
            if len(w) <= room:
                return w
            if "_" in w:
                return abbreviate(w, room)
            return w.replace(",", ", ") if "," in w else w

        return " ".join(fit(w) for w in message.split(" "))

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
