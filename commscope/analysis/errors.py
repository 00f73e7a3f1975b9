"""What an op's exception text says happened, so a failure can be blamed on the right rank.

Backends word their errors differently, but they fall into a few kinds: a peer's
connection closed (the peer went away), the group's timeout fired (someone never
arrived), ``monitored_barrier`` naming the ranks that did not arrive, a rank reporting
that *another* rank's monitored barrier failed, a rank interrupted while it waited
(``KeyboardInterrupt``: Ctrl-C, on a hung job blamed like a timeout on whoever had not
come), and everything else (the op raised on its own: a bad argument, a size check).
Texts below are the ones Gloo, NCCL and ``ProcessGroupGloo::monitoredBarrier`` print in
torch 2.4-2.13.
"""

from __future__ import annotations

import re
from typing import NamedTuple

PEER_GONE = "peer_gone"  # a connection to a peer closed or reset: the peer went away
TIMEOUT = "timeout"  # the group's own timeout fired: some member never arrived
NAMED = "named"  # monitored_barrier: the text names the ranks that never arrived
RELAYED = "relayed"  # this rank only heard that another rank's op failed
INTERRUPTED = "interrupted"  # the user stopped the rank while it waited (Ctrl-C): some member may never have come
#: the varlen toolkit's check of what every rank passed names the ranks at fault (all raise its
#: ValueError together: "offending ranks [1]", "ranks [1] passed ...", "the sender (rank 0) failed")
FAULTED = "faulted"
LOCAL = "local"  # anything else: the op raised on its own

_PEER_GONE = re.compile(
    r"connection (closed|reset)|broken pipe|socket closed|end of file|remote process exited|"
    r"connection refused|peer (closed|disconnected|hung up)|NCCL communicator was aborted|"
    r"ProcessGroup.* is aborted|aborted communicator", re.I)
_TIMEOUT = re.compile(r"timed out|timeout|watchdog caught collective operation", re.I)
_INTERRUPTED = re.compile(r"\s*KeyboardInterrupt\b")
_NAMED = re.compile(r"\bRanks? ((?:\d+\s*,\s*)*\d+) failed to pass monitoredBarrier")
_RELAYED = re.compile(r"successfully reached monitoredBarrier, but received errors while waiting for "
                      r"send/recv from rank (\d+)")


#: The varlen toolkit's words for the ranks whose input was at fault (``varlen._meta``: a group's
#: ranks, with the global ones after them where they differ; ``varlen._p2p``: a global rank)
_FAULTED_RANKS = re.compile(r"\b(?:offending ranks|(?<!\bon )ranks(?= \[[\d, ]*\](?: \(global \[[\d, ]*\]\))? passed )) "
                            r"\[([\d, ]*)\](?: \(global \[([\d, ]*)\]\))?")
_FAULTED_PEER = re.compile(r"\bthe sender \(rank (\d+)\) failed|\bthe message from rank (\d+) is not a "
                           r"send_tensors|\bcorrupt header from rank (\d+)")


class ExcKind(NamedTuple):
    kind: str
    ranks: tuple[int, ...] = ()  # NAMED, FAULTED: the ranks named; RELAYED: the rank relayed from


#: Where an exception's text says what it was raised from (``record.ops.fmt_exc``): not its own words
RAISED_FROM = "\n(raised from "


def own_words(text: str) -> str:
    """An exception's text without what it was raised from: a local error raised while
    handling a timeout is not a timeout (helper-190)."""
    return str(text).split(RAISED_FROM, 1)[0]


def classify(text: str) -> ExcKind:
    """The kind of failure an exception text describes (see the module docstring), by its
    own words (``own_words``)."""
    text = own_words(text)
    m = _NAMED.search(text)
    if m:
        return ExcKind(NAMED, tuple(int(x) for x in re.findall(r"\d+", m.group(1))))
    m = _RELAYED.search(text)
    if m:
        return ExcKind(RELAYED, (int(m.group(1)),))
    if _PEER_GONE.search(text):
        return ExcKind(PEER_GONE)
    if _TIMEOUT.search(text):
        return ExcKind(TIMEOUT)
    if _INTERRUPTED.match(text):
        return ExcKind(INTERRUPTED)
    line = first_line(text, 1 << 16)
    faulted = {int(x) for m in _FAULTED_RANKS.finditer(line) for x in re.findall(r"\d+", m.group(2) or m.group(1))}
    faulted |= {int(x) for m in _FAULTED_PEER.finditer(line) for x in m.groups() if x is not None}
    if faulted:  # (before, each rank was blamed for raising "itself": the victims too, helper-178)
        return ExcKind(FAULTED, tuple(sorted(faulted)))
    return ExcKind(LOCAL)


def first_line(text: str, limit: int = 160) -> str:
    """An exception's first line, without the C++ source location Gloo prefixes; where it
    is its type alone ("RuntimeError: ", its message on the lines below: torch's
    pipelining), the next line joined to it (helper-186: a crash said "RuntimeError: ,")."""
    lines = [x.strip() for x in own_words(text).splitlines() if x.strip()]
    line = lines[0] if lines else ""
    if len(lines) > 1 and re.fullmatch(r"[\w.]+:", line):
        line = f"{line} {lines[1]}"
    line = re.sub(r"\[[^\]]*\.(cc|cpp|h):\d+\]\s*", "", line)
    return line if len(line) <= limit else line[: limit - 1] + "…"
