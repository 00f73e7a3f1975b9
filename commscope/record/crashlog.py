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

Interface: ``arm(path)`` when the rank attaches, ``tick(recorder, emit, final)`` every
tick, ``disarm()`` when it leaves.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from commscope import events

_file: Any = None  # the open crash file while faulthandler writes to it
_path: Path | None = None  # and its path


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
    global _file, _path
    if _file is not None:
        try:
            faulthandler.disable()
        except Exception:
            pass
        _file = _path = None  # the parent's file: not ours to close or remove


os.register_at_fork(after_in_child=_after_fork_child)
