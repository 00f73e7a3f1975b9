"""The model's vocabulary: op flags, Flight Recorder's space, rank states and how exits read.

A leaf the model, the rank-state judgements and the console all import, so that none of
them imports another back (``model`` imports ``rankstate``, which needs only these).
"""

from __future__ import annotations

import re
import signal
from typing import NamedTuple

from commscope.events import GONE

# Sig flags
ASYNC, NESTED, P2P, COLL, CONTAINER, FR, SEND, RECV, DEVICE = (1 << i for i in range(9))
# Per-op flags
EXC, WAIT_EXC, APPROX, DONE, INFERRED = 1, 2, 4, 8, 16

SPACE_NATIVE, SPACE_FR = 0, 1

#: What ``commscope snapshot`` writes (a job read from outside, never instrumented): its meta's
#: ``recorder``, its ops' ``src``, its stacks' ``reason`` and its exits' ``src`` (the exit of a
#: rank whose process was not there when it looked: reason ``events.GONE``).
SNAPSHOT = "snapshot"
#: The ``reason`` of the empty ``stack`` a snapshot writes for a rank py-spy could not read:
#: ``"<UNREAD> (<kind>): <py-spy's error>"`` (kind: ``pyspy.PERMISSION`` or another)
UNREAD = "snapshot: not read"
_UNREAD = re.compile(rf"^{re.escape(UNREAD)} \((\w+)\): (.*)$", re.DOTALL)


def unread_reason(kind: str, text: str) -> str:
    return f"{UNREAD} ({kind}): {text}"


def unread_of(stack: dict | None) -> tuple[str, str] | None:
    """(py-spy's error kind, its text) of the stack a snapshot wrote for a rank it could not
    read; None for any other stack."""
    if stack is None or stack.get("threads"):
        return None
    m = _UNREAD.match(str(stack.get("reason") or ""))
    return (m.group(1), m.group(2)) if m else None


#: The ``src`` of the meta and ops ``flight_import`` reads from Flight Recorder dump files
FR_IMPORT = "fr-import"

#: Signals that kill a process from outside (a launcher stopping it, a user, the OOM killer):
#: the rank did not crash, it was killed.
KILL_SIGNALS = frozenset({"Terminated", "Killed", "Interrupt", "Hangup", "SIGTERM", "SIGKILL", "SIGINT", "SIGHUP"})
#: 'Segmentation fault' -> 'SIGSEGV': exits name signals as faulthandler and strsignal do.
_SIGNAL_LABELS = {signal.strsignal(s): s.name for s in signal.Signals if signal.strsignal(s)}


def signal_label(name: str) -> str:
    """'SIGSEGV (Segmentation fault)' for an exit's signal, as people search for it."""
    short = _SIGNAL_LABELS.get(name)
    return f"{short} ({name})" if short and short != name else name


def signal_name(name: str) -> str:
    """'SIGSEGV' for 'Segmentation fault' (faulthandler's word) and for 'SIGSEGV' (a launcher's)."""
    return _SIGNAL_LABELS.get(name, name)


def is_kill(ex: dict) -> bool:
    """An exit that is a killing, not a leaving: a launcher saw the rank die of a signal
    (``reason: "killed"``), the rank noted SIGTERM/SIGKILL as it died, or it cut itself off
    with ``os._exit`` and a failing code; or ``commscope snapshot`` found its process gone
    (``reason: "gone"``: how it went, nobody saw)."""
    reason = ex.get("reason")
    return (reason in ("killed", GONE) or (reason == "signal" and ex.get("signal") in KILL_SIGNALS)
            or (reason == "os._exit" and ex.get("code", 0) != 0))


#: Signals a whole job is stopped with: the one a launcher (torchrun, mp.spawn, SLURM) sends
#: the ranks left when one of them dies, and a user's Ctrl-C or scancel.
STOP_SIGNALS = frozenset({"Terminated", "Interrupt", "Hangup", "SIGTERM", "SIGINT", "SIGHUP"})
#: Of those, the one the native recorder's death handler notes in the spool as it comes
#: (``record/native/death.h``): a launcher's stop
TERM_SIGNALS = frozenset({"Terminated", "SIGTERM"})


def stopped(ex: dict) -> bool:
    """An exit by a stop signal (``STOP_SIGNALS``), noted by the rank or its launcher: a rank
    stopped with its job, not one that went by itself."""
    return ex.get("reason") in ("signal", "killed") and ex.get("signal") in STOP_SIGNALS


def unseen_death(ex: dict) -> bool:
    """The exit a dead rank's spool was forwarded with where nothing recorded how it died
    (SIGKILL, the OOM killer): timed by what was found, not by the death."""
    return ex.get("reason") == GONE and ex.get("src") == "spool"


def describe_kill(ex: dict) -> str:
    """'killed by SIGKILL', 'terminated (SIGTERM)', 'left through os._exit(3)'."""
    if ex.get("reason") == "os._exit":
        return f"left through os._exit({ex.get('code')})"
    if ex.get("reason") == GONE and ex.get("src") == SNAPSHOT:
        return "its process was gone when commscope snapshot looked (how it ended, nothing recorded)"
    if unseen_death(ex):
        return "its process ended without a word (SIGKILL, the OOM killer, or a signal nothing noted)"
    sig = ex.get("signal") or "a signal"
    who = " (its launcher saw it)" if ex.get("src") == "launcher" else ""
    return f"killed by {signal_label(sig)}{who}"


class RankState(NamedTuple):
    kind: str  # "blocked" | "running" | "idle" | "exited" | "crashed" | "dead" | "unknown"
    text: str
    op: int | None  # op index the rank is in (blocked/running), or its last op
    since_ns: int
