"""Stack requests across ranks: when one rank is stuck or an op fails, every rank shows where it is.

A rank only captures its own stacks when one of *its* ops is stuck, but the question a
hang raises first is where the rank that never arrived is.  So when any rank has an op
in flight past ``hang_after``, or an op that raised, it posts a request in a key every
rank already shares, the process group's c10d store; every rank polls that key and,
for each new request, captures all its Python thread stacks once and records them as a
``stack`` event with ``reason: "request"``.  A rank spinning in Python still answers
(this poller is its own thread); a rank stuck in native code holding the GIL cannot, and
analysis says so.

The c10d store client is shared with the training thread (``new_group`` rendezvous uses
it), so, as in ``jobid``, only short requests are issued (``check``, ``get``, ``set``),
from a thread of our own, never ``wait``: neither training nor the recorder thread ever
waits on the store for us.  No collective is added.

Interface (the recorder calls one function per tick)::

    tick(recorder, now_ns, incident_ns, emit, final)

``incident_ns`` is when this rank's current incident began (the begin of its oldest op
past hang_after, or its latest failure), or None; ``emit`` takes the ``stack`` events to
record; ``final`` stops the poller.  The key's value is ``"<rank> <posted_ns> <nonce>"``; a rank
posts only when no request was posted since its own incident began, so ranks stuck in
the same collective ask once between them.
"""

from __future__ import annotations

import os
import secrets
import threading
import time
import weakref
from collections import deque
from typing import Any

from commscope import events
from commscope.record import callsite

KEY = "commscope/stacks/"
#: Poll the key this often: hang_after / 8, clamped (a request is answered within one poll).
MIN_POLL_S, MAX_POLL_S = 0.25, 1.0


def _key() -> str:
    return KEY + os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")


def _default_store() -> Any:
    from torch.distributed import distributed_c10d as c10d

    return c10d._get_default_store()


class StackRequests:
    """One rank's side of the protocol: post requests, answer everyone's (see module doc)."""

    def __init__(self, hang_after: float, *, store: Any = None, poll_s: float | None = None):
        self.poll_s = poll_s or min(MAX_POLL_S, max(MIN_POLL_S, hang_after / 8))
        self._store = store  # tests pass one; else the default group's, looked up per poll
        self.rank: int | None = None
        self.exclude: set[int] = set()  # thread idents not worth capturing (the recorder's)
        self._incident: int | None = None  # set by the recorder thread, read by the poller
        self._posted: int | None = None  # incident already posted (or answered since it began)
        self._answered: str | None = None
        self.out: deque[dict] = deque(maxlen=64)  # captured events for the recorder to emit
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.errors = 0

    # -- recorder thread
    def tick(self, rank: int | None, now_ns: int, incident_ns: int | None, emit: Any) -> None:
        if rank is None:
            return
        self.rank = rank
        if incident_ns is not None and (self._incident is None or incident_ns > self._incident):
            self._incident = incident_ns
        if self._thread is None and not self._stop.is_set():
            self._thread = threading.Thread(target=self._run, name="commscope-stack-requests", daemon=True)
            self._thread.start()
        while self.out:
            emit(self.out.popleft())

    def close(self) -> None:
        self._stop.set()

    # -- poller thread
    def _run(self) -> None:
        self.exclude.add(threading.get_ident())
        while not self._stop.wait(self.poll_s):
            try:
                store = self._store if self._store is not None else _default_store()
            except Exception:
                continue  # no process group (yet, or any more)
            try:
                self.poll(store)
            except Exception:
                # The store's host is gone (its process, or its group, ended first): torch
                # logs each failed request, so stop rather than log one per poll.
                self.errors += 1
                return

    def poll(self, store: Any) -> None:
        """One round: post this rank's incident if nobody announced one since it began, then
        answer the newest request if it is new."""
        key = _key()
        current = store.get(key).decode() if store.check([key]) else None
        seen = _parse(current)
        incident = self._incident
        if incident is not None and incident != self._posted:
            self._posted = incident
            if seen is None or seen[1] < incident:  # no request since this incident began
                current = f"{self.rank} {time.time_ns()} {secrets.token_hex(4)}"
                store.set(key, current)
                seen = _parse(current)
        if current is not None and current != self._answered and seen is not None:
            self._answered = current
            self.out.append(self.capture(seen[0], seen[1]))

    def capture(self, trigger: int, request_ns: int) -> dict:
        """All Python threads of this process but ours; the main thread stands for the rank."""
        main = threading.main_thread().ident
        threads = [t for t in callsite.all_stacks() if t["tid"] not in self.exclude]
        for t in threads:
            if t["tid"] == main:
                t["op_thread"] = True
        return {"type": events.STACK, "ts": time.time_ns(), "reason": "request", "trigger": trigger,
                "request_ns": request_ns, "threads": threads}


def _parse(value: str | None) -> tuple[int, int] | None:
    try:
        rank, ts, _ = (value or "").split()
        return int(rank), int(ts)
    except ValueError:
        return None


# ---------------------------------------------------------------------- the recorder's hook
_requests: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def tick(rec: Any, now_ns: int, incident_ns: int | None, emit: Any, final: bool = False) -> None:
    """Called by the recorder thread every tick (see the module docstring)."""
    req = _requests.get(rec)
    if req is None:
        if final or not rec.capture_stacks:
            return
        req = _requests[rec] = StackRequests(rec.hang_after)
    if getattr(rec, "_thread", None) is not None and rec._thread.ident:
        req.exclude.add(rec._thread.ident)
    try:
        req.tick(rec.rank, now_ns, incident_ns, emit)
    finally:
        if final:
            req.close()


def _after_fork_child() -> None:
    """Threads do not survive fork: a forked child starts without requests of its parent."""
    _requests.clear()


os.register_at_fork(after_in_child=_after_fork_child)
