"""A rank's last words: fatal signals and uncaught exceptions leave their stacks in the trace.

* **Fatal signals** (segfault, abort, bus error, illegal instruction, FPE): once the rank
  writes to a directory store, ``faulthandler`` is pointed at ``rank-NNNNN.crash`` next to
  the rank's trace file; the directory reader turns what it writes into ``stack`` and
  ``exit`` events (``commscope.store.crashlog``).  If the program enabled faulthandler
  itself, it is left alone.  A forked child (a DataLoader worker) does not inherit it, so
  its crashes are not blamed on the rank.  The Redis store has no such file: a rank
  killed by a signal shows there as a rank that vanished.
* **Uncaught exceptions**: the recorder's ``sys.excepthook`` notes the exception; at the
  final tick its traceback is recorded as a ``stack`` event with ``reason: "exception"``.

Interface: ``tick(recorder, emit, final)``, called by the recorder thread every tick.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time
import traceback
from typing import Any

from commscope import events
from commscope.store.crashlog import crash_file_name

_file: Any = None  # the open crash file while faulthandler writes to it


def arm(writer: Any) -> bool:
    """Point faulthandler at the writer's crash file (directory stores only)."""
    global _file
    if _file is not None:
        return True
    job_dir, rank = getattr(writer, "dir", None), getattr(writer, "rank", None)
    if job_dir is None or not isinstance(rank, int) or faulthandler.is_enabled():
        return False
    try:
        f = open(os.path.join(job_dir, crash_file_name(rank)), "w")  # noqa: SIM115 (lives until disarm)
        faulthandler.enable(file=f, all_threads=True)
    except (OSError, ValueError, RuntimeError):
        return False
    _file = f
    return True


def disarm(remove_empty: bool = True) -> None:
    global _file
    f, _file = _file, None
    if f is None:
        return
    try:
        faulthandler.disable()
        f.close()
        if remove_empty and os.path.getsize(f.name) == 0:
            os.unlink(f.name)
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
    """Arm once the rank's store is open; at the final tick record an uncaught exception's
    traceback and disarm (an empty crash file is removed)."""
    if final:
        ev = exception_stack(rec)
        if ev is not None:
            emit(ev)
        disarm()
    elif _file is None and rec.outbox.writer is not None:
        arm(rec.outbox.writer)


def _after_fork_child() -> None:
    global _file
    if _file is not None:
        try:
            faulthandler.disable()
        except Exception:
            pass
        _file = None  # the parent's file: not ours to close or remove


os.register_at_fork(after_in_child=_after_fork_child)
