"""Options several commands share."""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from typing import TYPE_CHECKING, NamedTuple

from commscope.errors import UsageError
from commscope.schema import MAX_RANK, MAX_SECONDS
from commscope.visible import visible
from commscope.window import Since, parse_since

if TYPE_CHECKING:
    from rich.console import Console
    from rich.text import Text

SINCE_HELP = ("read only this window: a duration back from the job's newest write (90s, 10m, 1h30m, 3d; its "
              "files' modification time, a Redis stream's newest entry), a UTC time "
              "(14:00, 2026-11-26T14:00), or all.  Each rank's stream starts at its newest keyframe "
              "(every few seconds; else its segment, a Redis mark) before the window's start, with the "
              "ops in flight there; a rank silent since before it still shows its end; what retention "
              "summarized is read whatever the window")
MAX_MEMORY_HELP = ("refuse, before reading, a read whose model would hold more than SIZE (1 MiB or more: "
                   "512MiB, 8GiB), from the bytes the store holds of it, and say a --since that fits; none: "
                   "read whatever it holds (default: the memory available as the command starts, a "
                   "cgroup's limit where less)")


def ranks_read(world_size: int, apart: int) -> str:
    """The job's ranks (its world) and the foreign streams kept apart from them, where there
    are any (``TraceModel.kept_apart``): "2 ranks (+2 foreign stream(s) kept apart)", as
    ``check``'s and ``report``'s headers say it."""
    return f"{world_size:,} ranks" + (f" (+{apart:,} foreign stream(s) kept apart)" if apart else "")


def span_text(first: int, last: int, window_ns: int | None = None) -> str:
    """How long a read spans, in the unit that reads ("168.6 h", not "606787.7 s"); read
    with a window starting after the first event, the window's span, with the whole's (its
    carried events date from the job's start: a 2 h window said the week, helper-187)."""
    from commscope.units import duration

    if window_ns is not None and first < window_ns < last:
        return f"{duration(last - window_ns)} read (of {duration(last - first)})"
    return duration(max(0, last - first))


def headline(source: str, what: str, width: int) -> list[Text]:
    """``check``'s and ``report``'s first line, "source: what", or two where one would not fit
    ``width`` (the source on the first): a terminal folded it mid-figure ("hang_after 10" /
    "s"), and a long store URL ran past 80 columns.  The source as text, never markup (a
    path with "[...]" in it lost those characters)."""
    from rich.cells import cell_len
    from rich.text import Text

    if cell_len(source) + 2 + cell_len(what) <= width:  # (cells: a wide character takes two)
        return [Text.assemble((source, "bold"), ": ", what)]
    return [Text.assemble((source, "bold"), ":"), Text(f"  {what}")]


def seconds(text: str) -> float:
    """An argparse type: seconds from 0 to ``schema.MAX_SECONDS``, what a trace may say of
    hang_after.  "inf", "nan" and 1e300 were taken, and diagnosing raised (a duration in ns
    made of them), or the console's worker died."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 <= value <= MAX_SECONDS:  # (nan is neither)
        raise argparse.ArgumentTypeError(f"seconds from 0 to {MAX_SECONDS:g}, not {text!r}")
    return value


def _whole(text: str, least: int) -> int:
    """A whole number from ``least`` on, or argparse's error saying why not."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"a number from {least} on, not {text!r}")
    return value


def count(text: str) -> int:
    """An argparse type: a whole number from 0 on (a negative ``--top`` silently showed none)."""
    return _whole(text, 0)


def positive(text: str) -> int:
    """An argparse type: a whole number from 1 on (bench's ``--ranks 0``, ``--calls 0`` and
    ``--runs 0`` divided by zero or took the median of nothing; ``--iters -1`` never ended)."""
    return _whole(text, 1)


def amount(text: str) -> float:
    """An argparse type: a finite number above 0 (a rate, a duration: ``inf`` overflowed,
    ``nan`` and negatives ran forever or raised)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value <= MAX_SECONDS:  # (nan is neither)
        raise argparse.ArgumentTypeError(f"a number above 0 and at most {MAX_SECONDS:g}, not {text!r}")
    return value


class Ranks(NamedTuple):
    """A ``--ranks`` choice: these ranks, and (``culprits``) those the findings blame."""

    ranks: frozenset[int]
    culprits: bool

    def of(self, culprits: Iterable[int]) -> set[int]:
        """The ranks chosen, once the findings' culprits are known."""
        return set(self.ranks) | (set(culprits) if self.culprits else set())


#: The word ``--ranks`` takes for the ranks the findings blame
CULPRITS = "culprits"


def byte_size(text: str) -> int:
    """Bytes, as ``--retain`` reads them (``64MiB``, ``2GiB``, ``500MB``), at least 1 MiB; ``m``
    alone is MiB here too (``--retain`` refuses it, which also reads ages: helper-168)."""
    import re

    from commscope.store import retention

    try:
        kept = retention.parse(re.sub(r"(?<=\d)\s*m\s*$", "M", text))
    except ValueError as exc:
        said = str(exc).replace(" per rank", "")
        if "an age" not in said:  # (what it says of a size; not its offer of an age, which no size takes: helper-181)
            raise argparse.ArgumentTypeError(said) from None
        kept = None
    if kept is None or kept.max_bytes is None or kept.max_age_s is not None:
        raise argparse.ArgumentTypeError(f"cannot read {text!r}: give a size, such as 64MiB or 2GiB")
    return kept.max_bytes


def ranks(text: str) -> Ranks:
    """An argparse type: ranks and ranges of ranks, comma-separated (``0-7,2049``), and the
    word ``culprits``: the ranks the findings blame."""
    out: set[int] = set()
    culprits = False
    for part in (p.strip() for p in text.split(",")):
        if part == CULPRITS:
            culprits = True
            continue
        lo, dash, hi = part.partition("-")
        try:
            first, last = int(lo), int(hi if dash else lo)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a rank, a range of ranks (0-7) or {CULPRITS!r}: {part!r}") from None
        if not 0 <= first <= last <= MAX_RANK:
            raise argparse.ArgumentTypeError(f"a range goes up from its first rank to its last (0-7), ranks 0 to "
                                             f"{MAX_RANK:,}: {part!r}")
        if last - first >= 1 << 20:
            raise argparse.ArgumentTypeError(f"at most {1 << 20:,} ranks a range: {part!r}")
        out.update(range(first, last + 1))
    return Ranks(frozenset(out), culprits)


def warning(text: str) -> Text:
    """A reader's warning as every command says it: text, never markup ("[/]" in a path
    raised MarkupError), its control characters made visible (a dump's file name)."""
    from rich.text import Text

    return Text.assemble(("warning:", "yellow"), " ", visible(text))


def add_since(p: argparse.ArgumentParser, default: str = "all") -> None:
    p.add_argument("--since", default=default, metavar="WHEN", help=f"{SINCE_HELP} (default {default})")


def add_max_memory(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-memory", default=None, type=memory_size, metavar="SIZE", help=MAX_MEMORY_HELP)


def memory_size(text: str) -> int | str:
    """An argparse type: ``--max-memory``'s SIZE (1 MiB at least), or "none" (any)."""
    if text.strip().lower() == "none":
        return "none"
    try:
        return byte_size(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"give a size of 1 MiB or more (512MiB, 8GiB) or none, not {text!r}") from None


def max_memory_of(args: argparse.Namespace) -> int | None:
    """The most a read's model may hold (``--max-memory``): as given, None for "none", and by
    default the memory available now (``memory.available_bytes``; None where unknown)."""
    from commscope.memory import available_bytes

    given = getattr(args, "max_memory", None)
    if given == "none":
        return None
    return given if isinstance(given, int) else available_bytes()


def since_of(args: argparse.Namespace) -> Since | None:
    """The parsed ``--since`` (None: everything); UsageError (exit 2) when unreadable."""
    try:
        return parse_since(getattr(args, "since", None))
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def stdout_console() -> Console:
    """A rich console on standard output that a closed pipe stops as it stops any command
    (``commscope check trace | head``: exit ``errors.CLOSED_PIPE``, ``cli.main``), not with
    rich's own exit 1, which is ``check``'s "errors found"."""
    from rich.console import Console

    class _Output(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True
            raise BrokenPipeError

    return _Output()
