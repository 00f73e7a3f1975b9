"""Typed evidence of a finding, and the one Rich renderer of it (``commscope check`` and the console).

Each finding kind has an evidence record, a dataclass declared next to its detector
(``collectives.MissingRanks``, ``p2p.Deadlock``, ...), that derives from ``Evidence``:

- its fields are the keys of its ``check --json`` evidence, in that order.  A field left
  ``ABSENT`` is not in the JSON (``None`` is: it prints as ``null``);
- ``render(f)`` draws it with Rich.  ``render(f)`` below adds what every error finding
  carries: its consequences and the stacks of its culprits and waiting ranks.

After detection, ``rootcause`` and ``findings.attach_stacks`` annotate a finding with the
``ANNOTATIONS`` keys, in the order they happen to be added: they follow the kind's own
fields in the JSON.  An ``Evidence`` is a mutable mapping of JSON key to value, so code
reads ``f.evidence["blame"]`` whatever the kind; writing a key that is neither a field
nor an annotation is a ``KeyError``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, MutableMapping
from typing import Any

from rich.console import Group, RenderableType
from rich.markup import escape
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from commscope.analysis.ranks import ranges
from commscope.analysis.stacks import same_key


class _Absent:
    def __repr__(self) -> str:
        return "ABSENT"

    def __bool__(self) -> bool:
        return False


#: A field not in the evidence (a key the JSON leaves out).
ABSENT: Any = _Absent()

#: Keys any finding may gain after detection: ``consequences`` (rootcause: the findings folded
#: into it), ``named_through`` (rootcause: the culprits it named before they were followed to
#: their roots), ``stacks`` (rank -> folded threads), ``stack_info`` (rank -> role, capture
#: time or why none; for waiting ranks that share a stack, how many and which),
#: ``stacks_more`` (waiting ranks past the distinct stacks shown) and ``culprit_where``
#: (findings.attach_stacks), ``snapshot`` (the finding is read from a snapshot's stacks: the
#: span of its samples, the ranks it did not see; ``analysis.snapshots``), ``together``
#: (rootcause: ranks that departed together, one finding: ``first``, the first to go, whose
#: the kind's own fields are, and ``hosts``, host -> its ranks), ``wait_cycle`` (rootcause: the
#: groups whose collectives the culprits called in different orders, each waiting in one for
#: another).
ANNOTATIONS = ("consequences", "named_through", "stacks", "stack_info", "stacks_more", "culprit_where", "snapshot",
               "together", "wait_cycle")


@dataclasses.dataclass(kw_only=True, eq=False)
class Evidence(MutableMapping[str, Any]):
    """Base of every finding kind's evidence record (see the module docstring)."""

    def __post_init__(self) -> None:
        self._names = tuple(f.name for f in dataclasses.fields(self))
        self._notes: dict[str, Any] = {}

    # -- the mapping of JSON key -> value
    def __getitem__(self, key: str) -> Any:
        if key in self._notes:
            return self._notes[key]
        if key in self._names:
            v = getattr(self, key)
            if v is not ABSENT:
                return v
        raise KeyError(key)

    def __setitem__(self, key: str, value: Any) -> None:
        if key in self._names:
            setattr(self, key, value)
        elif key in ANNOTATIONS:
            self._notes[key] = value
        else:
            raise KeyError(f"{type(self).__name__} has no evidence field {key!r}")

    def __delitem__(self, key: str) -> None:
        if key in self._notes:
            del self._notes[key]
        elif key in self._names and getattr(self, key) is not ABSENT:
            setattr(self, key, ABSENT)
        else:
            raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        yield from (k for k in self._names if getattr(self, k) is not ABSENT)
        yield from self._notes

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({dict(self)!r})"

    def to_json(self) -> dict[str, Any]:
        """The ``evidence`` object of ``check --json``."""
        return dict(self.items())

    # -- presentation
    def render(self, f: Any) -> list[RenderableType]:
        """The kind's own evidence, drawn (``f`` is the finding: culprits, seq).  The default
        lists the fields; a kind overrides it."""
        return [evidence_block({k: v for k, v in self.items() if k not in ANNOTATIONS})]


#: The decorator of an evidence record: ``@record class MissingRanks(Evidence): ...``.
record = dataclasses.dataclass(kw_only=True, eq=False)


class RawEvidence(Evidence):
    """Evidence given as a plain dict (code that builds a ``Finding`` by hand): any keys,
    drawn as a key/value block."""

    def __init__(self, data: dict[str, Any] | None = None):
        self._names = ()
        self._notes = dict(data or {})

    def __setitem__(self, key: str, value: Any) -> None:
        self._notes[key] = value


def render(f: Any) -> list[RenderableType]:
    """Everything a finding's evidence shows: its kind's part, then its consequences and stacks.
    Used by ``commscope check`` (inside a panel) and by the console's detail pane."""
    ev = f.evidence
    try:
        return [*together(ev), *ev.render(f), *consequences(ev), *stacks_block(ev)]
    except Exception:  # nested parts of an unexpected shape: still show them, plainly
        return [evidence_block(dict(ev))]


# ---------------------------------------------------------------------- shared pieces
GREY, DIM, FAINT = "grey70", "grey62", "grey50"
BAD, WARN = "#e05050", "#e0a030"


def cell(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, list | tuple):
        return ", ".join(cell(x) for x in v) if not all(isinstance(x, int) for x in v) else str(list(v))
    return str(v)


def kv(rows: list[tuple[str, Any]]) -> Table:
    """Two columns, key and value; rows without a value are left out.  A value that is not
    ``Text`` is shown as written, never read as markup (a host, a call site, a reason from
    the trace: "[/]" in one raised rich's MarkupError where it was drawn)."""
    t = Table.grid(padding=(0, 1))
    t.add_column(style=DIM, no_wrap=True)
    t.add_column(overflow="fold")
    for k, v in rows:
        if v is None or v == "" or v == []:
            continue
        t.add_row(escape(k), v if isinstance(v, Text) else escape(str(v)))
    return t


#: A column whose every cell fits this many characters is short: never broken.
SHORT_CELL = 24
#: Rows a per-rank table draws before it folds ranks alike into one row (``PerRankTable``)
FOLD_ROWS = 16


class PerRankTable:
    """A borderless table that fits the width it is drawn at, never breaking a short cell
    ('all_reduce', '#12', '0.50 s'):

    - everything fits: one table;
    - the short columns fit: a table of them, each row followed by its long cells
      (exceptions, call sites) on indented lines of their own, wrapped at spaces;
    - not even that (a narrow pane): each row as ``column value`` pairs, wrapped.

    Rows whose ``key_col`` is in ``bad`` stand out.  Past ``FOLD_ROWS`` rows keyed by rank,
    the rows alike but for their rank are one, keyed by the ranks' ranges and count (a
    4,096-rank mismatch drew a row a rank, 5,468 lines of ``check``: helper-165), and past
    ``FOLD_ROWS`` such rows the rest are counted."""

    def __init__(self, title: str, columns: list[str], rows: list[list[Any]], bad: set[int] | None = None,
                 key_col: int = 0):
        self.title = title
        self.columns = columns
        self.keys = [row[key_col] for row in rows]
        self.cells = [[cell(x) for x in row] for row in rows]
        self.bad = bad or set()
        self.more = 0
        if len(rows) > FOLD_ROWS and columns[key_col] == "rank" and all(_rank(k) is not None for k in self.keys):
            self._fold(key_col)

    def _fold(self, key_col: int) -> None:
        alike: dict[tuple[bool, tuple[str, ...]], list[int]] = {}
        for key, row in zip(self.keys, self.cells, strict=True):
            rest = tuple(c for i, c in enumerate(row) if i != key_col)
            alike.setdefault((_rank(key) in self.bad, rest), []).append(_rank(key))
        folded = sorted(alike.items(), key=lambda kv: not kv[0][0])  # (the bad rows first, else in the rows' order)
        self.more = max(0, len(folded) - FOLD_ROWS)
        self.keys, self.cells = [], []
        for (bad, rest), ranks in folded[:FOLD_ROWS]:
            key = str(ranks[0]) if len(ranks) == 1 else f"{ranges(ranks, limit=4)} ({len(ranks):,})"
            self.keys.append(ranks[0] if bad else -1)
            self.cells.append([*rest[:key_col], key, *rest[key_col:]])

    def __rich_console__(self, console: Any, options: Any) -> Iterator[RenderableType]:
        from rich.cells import cell_len

        width = options.max_width
        widths = [max([cell_len(c), *(cell_len(row[i]) for row in self.cells)]) for i, c in enumerate(self.columns)]
        short = [i for i, w in enumerate(widths) if w <= SHORT_CELL]
        long = [i for i in range(len(widths)) if i not in short]
        styles = [f"bold {BAD}" if k in self.bad else "" for k in self.keys]
        yield Text(self.title, style=f"bold {GREY}")
        if sum(widths) + len(widths) - 1 <= width:
            shown, beneath = list(range(len(widths))), []
        elif long and sum(widths[i] for i in short) + len(short) - 1 <= width:
            shown, beneath = short, long
        else:
            for row, style in zip(self.cells, styles, strict=True):
                line = Text(style=style)
                for i, (c, v) in enumerate(zip(self.columns, row, strict=True)):
                    line.append("  " if i else "")
                    line.append(f"{c} ", style=DIM)
                    line.append(v)
                yield line
            yield from self._more()
            return

        gap = "  " if sum(widths[i] for i in shown) + 2 * (len(shown) - 1) <= width else " "

        def line(cells: list[str], style: str) -> Text:
            t = Text(style=style, no_wrap=True, overflow="crop")
            for k, i in enumerate(shown):  # padded by cells, not characters (wide glyphs)
                t.append(cells[i] + " " * (widths[i] - cell_len(cells[i])) + (gap if k < len(shown) - 1 else ""))
            t.rstrip()
            return t

        yield line(self.columns, DIM)
        for row, style in zip(self.cells, styles, strict=True):
            yield line(row, style)
            for i in beneath:
                if row[i] not in ("", "–"):
                    yield Padding(Text.assemble((f"{self.columns[i]} ", DIM), (row[i], style or GREY)), (0, 0, 0, 2))
        yield from self._more()

    def _more(self) -> Iterator[Text]:
        if self.more:
            yield Text(f"... {self.more:,} more kinds of row (check --json has every rank's)", style=FAINT)


def _rank(key: Any) -> int | None:
    """A row's rank, as an int (evidence keys ranks by their text too)."""
    if isinstance(key, int) and not isinstance(key, bool):
        return key
    return int(key) if isinstance(key, str) and key.isdigit() else None


def table(title: str, columns: list[str], rows: list[list[Any]], bad: set[int] | None = None,
          key_col: int = 0) -> PerRankTable:
    """A per-rank table that fits its width (``PerRankTable``)."""
    return PerRankTable(title, columns, rows, bad, key_col)


def values(x: Any) -> list:
    """Evidence collections come as lists or as dicts keyed by rank: their items either way."""
    if isinstance(x, dict):
        return [dict(v, rank=v.get("rank", k)) if isinstance(v, dict) else v for k, v in x.items()]
    return list(x or [])


def brief(op: dict | None) -> str:
    """'all_reduce #61 (group 0) at train.py:19 in step' from an evidence op (``findings.op_brief``)."""
    if not op:
        return "–"
    text = str(op.get("op", "?"))
    if op.get("seq") is not None:
        text += f" #{op['seq']}"
    if op.get("peer") is not None:
        text += f" {'to' if op.get('dir') == 'send' else 'from'} {op['peer']}"
    if op.get("group") is not None:
        text += f" (group {op['group']})"
    if op.get("site"):
        text += f" at {op['site']}"
    return text


def stack(threads: list[dict] | None, limit: int = 12) -> RenderableType | None:
    """Folded thread views (``analysis.stacks.fold``): the user's frames, innermost last, and
    what they are inside; torch's, commscope's and the standard library's frames folded."""
    if not threads:
        return None
    out = []
    for th in threads:
        frames = th.get("frames") or []
        text = Text()
        text.append(f"thread {th.get('thread') or th.get('name')}", style="bold")
        shown = frames[-limit:]
        if len(frames) > limit:
            text.append(f"\n  … {len(frames) - limit} outer frames", style=FAINT)
        for k, fr in enumerate(shown):
            line = fr if isinstance(fr, str) else f"{fr[0]}:{fr[1]} in {fr[2]}"
            text.append(f"\n  {line}", style="bold #e0e0e0" if k == len(shown) - 1 else GREY)
        if th.get("inside"):
            folded = th.get("folded")
            text.append(f"\n    └ inside {th['inside']}" + (f"  ({folded} frame{'' if folded == 1 else 's'} of torch, commscope and the "
                                                             "standard library folded)" if folded else ""),
                        style=FAINT)
        out.append(text)
    return Group(*out)


_WHY = {"request": "on request", "hang": "stuck in its op", "exception": "at its exception",
        "signal": "at its fatal signal"}


def stacks_block(ev: MutableMapping[str, Any]) -> list[RenderableType]:
    """The culprits' and waiting ranks' stacks (``stacks`` and ``stack_info``), or why a rank
    has none, and py-spy's dump where ``check --py-spy`` took one.  Ranks of one role whose
    stacks are the same (every waiting rank inside the same call) share one block: folded
    already (``count``, ``ranks``) or here."""
    out: list[RenderableType] = []
    stacks = ev.get("stacks") or {}
    info = ev.get("stack_info") or {str(r): {} for r in stacks}
    same: dict[str, list[str]] = {}  # first rank of a block -> the ranks it shows
    seen: dict[tuple, str] = {}
    for r, note in info.items():
        if r in stacks and not note.get("native_dump"):
            key = (note.get("role"), note.get("reason"), same_key(stacks[r]))
            if key in seen:
                same[seen[key]].append(r)
                continue
            seen[key] = r
        same[r] = [r]
    for r, ranks in same.items():
        note = info[r]
        role = note.get("role")
        if note.get("count"):
            spans = str(note.get("ranks", "")).split(",")
            who = f"{note['count']} ranks ({','.join(spans[:4])}{',...' if len(spans) > 4 else ''})"
        else:
            who = f"rank {r}" if len(ranks) == 1 else f"ranks {', '.join(ranks)}"
        head = Text(f"stack of {who}", style=f"bold {BAD}" if role == "culprit" else f"bold {GREY}")
        if role:
            head.append(f"  {role}", style=DIM)
        if r in stacks:
            ages = [float(info[x]["age_s"]) for x in ranks if info[x].get("age_s") is not None]
            if ages:
                age = f"{min(ages):.1f}" if max(ages) - min(ages) < 0.05 else f"{min(ages):.1f}-{max(ages):.1f}"
                head.append(f" · {age} s ago {_WHY.get(note.get('reason'), '')}", style=FAINT)
            out.append(head)
            block = stack(stacks[r])
            if block is not None:
                out.append(block)
        else:
            why = str(note.get("missing", "?"))
            head.append(f": {why}" if why.startswith("no stack") else f": no stack: {why}", style=FAINT)
            out.append(head)
        if note.get("native_dump"):
            out.append(Text(f"py-spy dump of rank {r}:\n{note['native_dump'].rstrip()}"))
    if ev.get("stacks_more"):
        out.append(Text(f"... and {ev['stacks_more']} more waiting rank(s), with other stacks", style=FAINT))
    return out


#: Hosts named one by one in a ``together`` block; the rest are a count.
TOGETHER_HOSTS = 8


def together(ev: MutableMapping[str, Any]) -> list[RenderableType]:
    """Ranks that departed together, by host (the first hosts; the rest counted)."""
    together = ev.get("together") or {}
    hosts = together.get("hosts") or {}
    if not hosts:
        return []
    n = sum(len(rs) for rs in hosts.values())
    t = Text(f"{n:,} ranks went together, on {len(hosts):,} host{'s' if len(hosts) > 1 else ''}:\n",
             style=f"bold {GREY}")
    for host, rs in list(hosts.items())[:TOGETHER_HOSTS]:
        t.append(f"  {host}", style=WARN)
        t.append(f"  ranks {ranges(rs, limit=8)}\n", style=GREY)
    if len(hosts) > TOGETHER_HOSTS:
        t.append(f"  … {len(hosts) - TOGETHER_HOSTS:,} more hosts\n", style=FAINT)
    t.append(f"below, the first of them: rank {together.get('first')}", style=f"bold {GREY}")
    return [t]


def consequences(ev: MutableMapping[str, Any]) -> list[RenderableType]:
    cons = ev.get("consequences") or []
    if not cons:
        return []
    t = Table.grid(padding=(0, 2))  # a long message wraps under itself, not under the kind
    t.add_column(style=WARN, no_wrap=True)
    t.add_column(style=GREY, overflow="fold")
    for c in cons[:12]:
        t.add_row(escape(c["kind"]), Text(c["message"]))
    if len(cons) > 12:
        t.add_row(Text(f"… {len(cons) - 12} more", style=FAINT), "")
    return [Text(f"consequences ({len(cons)}): folded into this finding", style=f"bold {GREY}"),
            Padding(t, (0, 0, 0, 2))]


def evidence_block(val: Any, depth: int = 0) -> RenderableType:
    """Any evidence value as nested key/value blocks (stacks and consequences left out)."""
    if isinstance(val, dict):
        rows = []
        for k, v in val.items():
            if k in ("stack", "stacks", "stack_info", "consequences"):
                continue  # shown by stacks_block and consequences
            if isinstance(v, dict | list) and v and depth < 2 and not (isinstance(v, list) and all(
                    isinstance(x, int | float | str) for x in v)):
                rows.append((escape(str(k)), evidence_block(v, depth + 1)))
            else:
                rows.append((escape(str(k)), escape(cell(v))))
        t = Table.grid(padding=(0, 1))
        t.add_column(style=DIM, no_wrap=True)
        t.add_column(overflow="fold")
        for k, v in rows:
            t.add_row(k, v)
        return t
    if isinstance(val, list):
        return Group(*[evidence_block(v, depth + 1) for v in val[:32]])
    return Text(cell(val))
