"""How ``--help`` lays out a command's description: to the terminal's width.

The descriptions are the commands' module docstrings, written at the code's line length
(~90 columns), so printed as they are (``RawDescriptionHelpFormatter``) they ran past an
80-column terminal or CI log.  ``Formatter`` fills prose paragraphs to the width argparse
gives (the terminal's, 80 in a pipe) and keeps indented blocks (examples, tables of terms)
as they are where they fit, else lays them out again (``_block``).
"""

from __future__ import annotations

import argparse
import re
import textwrap

#: Where an indented line's term or command ends and its text or comment begins
_GAP = re.compile(r"\S(\s{2,})\S")
#: A line that starts an item of a list in prose
_BULLET = re.compile(r"(?:[-*]|\d+[.)])\s")
#: A line of prose that starts with a label of a few words ("Exit 3:", "Targets (docs):"):
#: after a sentence's end, it starts a line of its own
_LABEL = re.compile(r"[A-Z][\w./-]*(?: [\w./()-]+){0,2}: ")
#: The widest prose is laid out (a line of 200 columns is hard to read)
MAX_WIDTH = 100


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def fill(text: str, width: int, indent: str = "") -> str:
    """``text`` laid out in ``width`` columns (see the module docstring), each line after
    ``indent``."""
    width = max(min(width, MAX_WIDTH) - len(indent), 20)
    text = text.replace("``", "")  # (a docstring's literals: no markup in a terminal)
    out: list[str] = []
    for para in re.split(r"\n\s*\n", text.strip("\n")):
        if out:
            out.append("")
        out.extend(_paragraph(para.splitlines(), width))
    return "\n".join(indent + line if line else line for line in out)


def _wrap(text: str, width: int, first: str, rest: str) -> list[str]:
    """``text`` filled in ``width`` columns, its runs of spaces one (a column of a table
    wrapped is no column), a sentence's end followed by two."""
    return textwrap.wrap(" ".join(text.split()), width, initial_indent=first, subsequent_indent=rest,
                         break_on_hyphens=False, break_long_words=False, fix_sentence_endings=True) or [first.rstrip()]


def _paragraph(lines: list[str], width: int) -> list[str]:
    """A paragraph's flush-left prose filled (a bullet's later lines hang under its text),
    its indented blocks laid out by ``_block``."""
    out: list[str] = []
    prose: list[str] = []  # the lines of a flush-left item, joined and filled together
    block: list[str] = []  # the lines of an indented block
    hang = ""  # the indent of a bullet's lines after its first

    def flush() -> None:
        if prose:
            out.extend(_wrap(" ".join(prose), width, "", hang))
            prose.clear()
        if block:
            out.extend(_block(block, width))
            block.clear()

    for line in lines:
        line = line.rstrip()
        ind = _indent(line)
        if ind == 0 or (prose and hang and ind == len(hang)):
            bullet = _BULLET.match(line) if ind == 0 else None
            label = ind == 0 and prose and prose[-1].endswith((".", ":")) and _LABEL.match(line) is not None
            if block or bullet is not None or label:
                flush()
                hang = " " * bullet.end() if bullet is not None else ""
            prose.append(line.strip())
        else:
            if prose:
                flush()
                hang = ""
            block.append(line)
    flush()
    return out


def _block(lines: list[str], width: int) -> list[str]:
    """Indented lines (examples, a table of terms) as they are where each fits.  Else by
    rows (a line at the block's least indent, with the more indented lines after it): a
    term's text filled in its column where that column is at most half the width; an
    example's comment (its text after two spaces or more) in one column after the longest
    command where all then fit, else under each command."""
    if all(len(line) <= width for line in lines):
        return lines
    base = min(map(_indent, lines))
    rows: list[tuple[str, list[str]]] = []
    for line in lines:
        if _indent(line) == base or not rows:
            rows.append((line, []))
        else:
            rows[-1][1].append(line.strip())
    cut = [(_GAP.search(first, base), first, more) for first, more in rows]
    out: list[str] = []
    columns = [gap.end(1) for gap, _, _ in cut if gap is not None]
    if columns and max(columns) <= width // 2:  # terms and their text
        for gap, first, more in cut:
            if gap is None:
                out.extend(_wrap(" ".join([first.strip(), *more]), width, first[:base], " " * (base + 4)))
            else:
                column = gap.end(1)
                out.extend(_wrap(" ".join([first[column:], *more]), width, first[:column], " " * column))
        return out
    heads = [(first[:gap.start(1)] if gap is not None else first,
              " ".join(([first[gap.end(1):]] if gap is not None else []) + more)) for gap, first, more in cut]
    texts = [len(head) for head, text in heads if text]
    column = max(texts) + 2 if texts else 0
    if all(len(head) <= width and (not text or column + len(text) <= width) for head, text in heads):
        return [head.ljust(column) + text if text else head for head, text in heads]
    under = " " * (base + 4)
    for head, text in heads:
        out.extend(_wrap(head.strip(), width, head[:base], under + "    "))  # (a command goes on deeper than its comment)
        if text:
            out.extend(_wrap(text, width, under, under + ("  " if text.startswith("#") else "")))
    return out


class Formatter(argparse.RawDescriptionHelpFormatter):
    """argparse's help with the description and epilog laid out by ``fill``."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return fill(text, width, indent)
