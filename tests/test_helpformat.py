"""``--help`` reads well in an 80-column terminal or CI log: every command's and bench
suite's, its prose filled and its examples and tables laid out again where they did not fit
(their descriptions are module docstrings, written ~90 columns wide)."""

from __future__ import annotations

import argparse
import re

import pytest

from commscope import helpformat
from commscope.cli import build_parser


def _parsers(parser: argparse.ArgumentParser, path: str = "commscope"):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, f"{path} {name}")


def _words(text: str) -> list[str]:
    return text.split()


@pytest.mark.parametrize("columns", [80, 100])
def test_every_help_fits_the_terminal_and_says_all_its_description_says(monkeypatch, columns):
    monkeypatch.setenv("COLUMNS", str(columns))
    seen = 0
    for path, parser in _parsers(build_parser()):
        text = parser.format_help()
        over = [line for line in text.splitlines() if len(line) > columns]
        assert not over, (path, over)
        if parser.description:  # (every word of it, in its order)
            desc = helpformat.fill(parser.description, columns - 2)  # (argparse's width)
            assert _words(desc) == _words(parser.description.replace("``", "")), path
            assert desc in text, path
        seen += 1
    assert seen >= 20  # (the commands and the bench suites)


def test_prose_fills_and_examples_and_terms_keep_their_columns():
    text = ("A first paragraph of prose that runs on past the width it is given, so it is filled again.\n"
            "\n"
            "    commscope demo                       # pick one in the console\n"
            "    commscope demo missing-rank --headless   # no console: print the diagnosis\n"
            "\n"
            "    events   the path before columns, which says a great deal more than fits on one\n"
            "             line of forty columns\n"
            "    columns  load_trace\n"
            "\n"
            "- a bullet whose text is long enough to wrap onto a second line\n"
            "  and goes on here\n"
            "- another\n")
    got = helpformat.fill(text, 44).splitlines()
    assert all(len(line) <= 44 for line in got)
    assert got == [
        "A first paragraph of prose that runs on past", "the width it is given, so it is filled", "again.", "",
        # (an example's comment does not fit beside the longest command: under each)
        "    commscope demo", "        # pick one in the console", "    commscope demo missing-rank --headless",
        "        # no console: print the diagnosis", "",
        # (a term's text in its column)
        "    events   the path before columns, which", "             says a great deal more than",
        "             fits on one line of forty", "             columns", "    columns  load_trace", "",
        "- a bullet whose text is long enough to wrap", "  onto a second line and goes on here", "- another"]
    # where the comments fit in one column after the longest command, they are aligned there
    assert helpformat.fill("    a b" + " " * 30 + "# one\n    a b c d e f g h  # two is long\n",
                           40).splitlines() == ["    a b              # one", "    a b c d e f g h  # two is long"]


def test_a_description_that_fits_is_printed_as_written():
    text = "Short.\n\n    commscope check STORE   # exit 1 on errors\n    commscope check --json\n"
    assert helpformat.fill(text, 80) == text.rstrip("\n")
    assert re.search(r"\n    commscope check STORE   # exit 1", helpformat.fill(text, 80))


def test_labels_third_columns_long_commands_and_wide_terminals():
    """helper-60's cases: a line of prose starting with a label after a sentence's end
    starts a line of its own ("Exit 3:"); a table's third column wrapped is text, not runs
    of spaces; a command wrapped goes on deeper than its comment; prose is filled to 100
    columns at most however wide the terminal; a docstring's ``literals`` lose their marks."""
    text = ("Exit 0: ok.  Exit 1: errors.\nExit 3: a bug.\nTargets (docs): fast.\n\n"
            "    dead      the culprit goes silent (a killed rank)          -> dead_rank\n\n"
            "    python -m commscope.bench.fuzz --mutants 168 --seed 7 --code DIR   run the same mutants on other code\n\n"
            + "word " * 60 + "``--wide``.")
    got = helpformat.fill(text, 60).splitlines()
    assert got[:3] == ["Exit 0: ok.  Exit 1: errors.", "Exit 3: a bug.", "Targets (docs): fast."]
    assert got[4:6] == ["    dead      the culprit goes silent (a killed rank) ->", "              dead_rank"]
    assert got[7:10] == ["    python -m commscope.bench.fuzz --mutants 168 --seed 7", "            --code DIR",
                         "        run the same mutants on other code"]
    wide = helpformat.fill(text, 200).splitlines()
    assert max(len(line) for line in wide) <= 100 and wide[-1].endswith("--wide.") and "``" not in "".join(wide)
