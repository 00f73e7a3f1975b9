"""A rank's last words: fatal signals and uncaught exceptions leave their stacks in the trace.

* **Fatal signals** (segfault, abort, bus error, illegal instruction, FPE): when the rank
  attaches, ``faulthandler`` is pointed at the crash file next to its spool
  (``store/spool.py``; without a spool, ``rank-NNNNN.crash`` in a directory store's job
  directory), and then the native recorder's handlers, which chain to it, note the
  signal (and a C++ exception's type and message from ``std::terminate``) in the spool's
  header.  Whoever forwards the dead rank's spool turns the crash file into a ``stack``
  event and the header into its ``exit``.  If the program enabled faulthandler itself,
  it is left alone.  A forked child (a DataLoader worker) does not inherit it, so its
  crashes are not blamed on the rank.
* **Uncaught exceptions**: the recorder's ``sys.excepthook`` notes the exception; at the
  final tick its traceback is recorded as a ``stack`` event with ``reason: "exception"``.
* **SIGTERM, for the Python recorder** (the native one notes it in the spool's header):
  ``faulthandler`` writes the stacks into the spool's ``.term`` file as the signal comes,
  then the default action ends the process as ever; a forwarder reads a written file as
  the death (``store/spool.term_noted``).  Only while SIGTERM has its default action.

Interface: ``arm(path)`` when the rank attaches, ``tick(recorder, emit, final)`` every
tick, ``disarm()`` when it leaves; ``watch_term(path)``, ``term_watched()``,
``term_taken()`` and ``unwatch_term()`` for the Python recorder's SIGTERM.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from commscope import events

_file: Any = None  # the open crash file while faulthandler writes to it
_path: Path | None = None  # and its path
_term: Any = None  # the open ``.term`` file while faulthandler writes a SIGTERM's stacks to it
_term_path: Path | None = None
_term_taken = False  # the program set a SIGTERM handler of its own since (``term_taken``)


def arm(path: Path) -> bool:
    """Point faulthandler at ``path`` (unless the program enabled faulthandler itself)."""
    global _file, _path
    if _file is not None:
        if _path == Path(path):
            return True
        disarm()
    if faulthandler.is_enabled():
        return False
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        f = os.fdopen(fd, "w")
        faulthandler.enable(file=f, all_threads=True)
    except (OSError, ValueError, RuntimeError):
        return False
    _file, _path = f, Path(path)
    return True


def disarm(remove_empty: bool = True) -> None:
    global _file, _path
    f, path, _file, _path = _file, _path, None, None
    if f is None:
        return
    try:
        faulthandler.disable()
        f.close()
        if remove_empty and path is not None and os.path.getsize(path) == 0:
            os.unlink(path)
    except OSError:
        pass


def watch_term(path: Path) -> bool:
    """Have faulthandler write every thread's stack to ``path`` when SIGTERM comes, then call
    the default action (``chain``: the process ends of the signal, its status as ever).
    Only where SIGTERM has its default action: a handler of the program's own, or
    ``SIG_IGN``, would outlive the note, and is left alone (``term_watched`` is then False,
    which the spool says)."""
    global _term, _term_path, _term_taken
    if _term is not None:
        if _term_path == Path(path):
            return True
        unwatch_term()
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return False
    f = None
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        f = os.fdopen(fd, "w")
        faulthandler.register(signal.SIGTERM, file=f, all_threads=True, chain=True)
    except (OSError, ValueError, RuntimeError, AttributeError):
        if f is not None:
            f.close()
        return False
    _term, _term_path, _term_taken = f, Path(path), False
    return True


def term_watched() -> bool:
    """Whether a SIGTERM would be written as it comes: watched, and no handler of the
    program's own took the signal since (``signal.signal`` wrapped: ``term_taken``)."""
    return _term is not None and _term_installed()


def _term_installed() -> bool:
    """faulthandler's SIGTERM handler is still the one installed (none of the program's since)."""
    return not _term_taken and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def term_taken() -> None:
    """The program set a SIGTERM disposition of its own (through ``signal.signal``): the
    note's handler is no longer installed, even where it set ``SIG_DFL`` back."""
    global _term_taken
    _term_taken = True


def unwatch_term(remove_empty: bool = True) -> None:
    """Stop watching SIGTERM.  faulthandler puts back the disposition it found, so only
    while its own is still installed (no handler of the program's own set since: that
    one stays)."""
    global _term, _term_path
    f, path, _term, _term_path = _term, _term_path, None, None
    if f is None:
        return
    try:
        if _term_installed():
            faulthandler.unregister(signal.SIGTERM)
        f.close()
        if remove_empty and path is not None and os.path.getsize(path) == 0:
            os.unlink(path)
    except (OSError, ValueError, RuntimeError):
        pass


def exception_stack(rec: Any) -> dict | None:
    """The uncaught exception's traceback as a ``stack`` event, if the rank is dying of one."""
    if not getattr(rec, "crash", None):
        return None
    exc = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    tb = getattr(exc, "__traceback__", None) or getattr(sys, "last_traceback", None)
    if tb is None:
        return None
    frames = [[fs.filename, fs.lineno, fs.name] for fs in traceback.extract_tb(tb, limit=64)]
    return {"type": events.STACK, "ts": time.time_ns(), "reason": "exception", "exc": rec.crash,
            "threads": [{"tid": threading.main_thread().ident, "name": "MainThread", "frames": frames,
                         "op_thread": True}]}


def tick(rec: Any, emit: Any, final: bool = False) -> None:
    """At the final tick: record an uncaught exception's traceback."""
    if final:
        ev = exception_stack(rec)
        if ev is not None:
            emit(ev)


def _after_fork_child() -> None:
    global _file, _path, _term, _term_path
    if _file is not None:
        try:
            faulthandler.disable()
        except Exception:
            pass
        _file = _path = None  # the parent's file: not ours to close or remove
    if _term is not None:
        try:  # (a DataLoader worker's SIGTERM is no death of the rank's)
            if _term_installed():
                faulthandler.unregister(signal.SIGTERM)
        except Exception:
            pass
        _term = _term_path = None


os.register_at_fork(after_in_child=_after_fork_child)
