"""Works of async varlen collectives dropped before ``wait()``, seen through to their end.

A Gloo point-to-point work destroyed while pending leaves its pair of ranks stuck: the next
op between them never completes (raw ``dist.isend``/``irecv`` behave the same).  A dropped
``VarlenWork`` was the only holder of its works, so
``h = all_gather_v(x, async_op=True); del h; all_gather_v(y)`` hung every rank (helper-106).
Such works, with the buffers they read and write, go to a thread of their own that waits on
each in turn (Gloo's point-to-point works say they are complete only once waited on) and
lets them go; a failure there is the handle's, which nobody holds any more, so it is dropped.
Every rank of a collective posts its side of each of them in the same call, so the waits
end.  Not ``isend_tensors``' ``SendWork``: its send ends only once the receiver posts, which
it may never do, and a thread blocked in that wait at exit aborted the process (helper-107);
a dropped one is the caller's, as a dropped ``dist.isend`` is.  Waiting on them on the
caller's next op instead could deadlock (a peer's op of its own may wait on this rank first).
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Sequence
from typing import Any

_pending: queue.SimpleQueue[tuple[Sequence[Any], object]] = queue.SimpleQueue()
_thread_pid = -1  # the process the thread runs in (a forked child starts its own)
_lock = threading.RLock()  # (a collection in ``Thread()`` may drop another handle: re-entered)


def adopt(works: Sequence[Any], keep: object) -> None:
    """Wait on ``works`` in the background, holding ``keep`` (their buffers) until they end."""
    if not works:
        return
    _pending.put((list(works), keep))
    _ensure_thread()


def _ensure_thread() -> None:
    global _thread_pid
    with _lock:
        if _thread_pid == os.getpid():
            return
        _thread_pid = os.getpid()
        threading.Thread(target=_run, name="commscope-varlen-orphans", daemon=True).start()


def _run() -> None:
    while True:
        works, keep = _pending.get()
        for w in works:
            try:
                w.wait()
            except Exception:  # (the handle's error, and nobody holds the handle)
                pass
        del works, keep
