"""Crash files: what ``faulthandler`` wrote when a rank died of a fatal signal, read back as events.

A segfault or an abort kills a process before its recorder can write another line, so
the rank's recorder (``commscope.record.crashlog``) points ``faulthandler`` at a file next
to the rank's trace, ``rank-00003.crash``.  The directory reader turns a non-empty crash
file into two events at the file's mtime, once the file has stopped growing and the
rank's own file is read to its end: a ``stack`` (``reason: "signal"``, every thread's
frames, the crashing one marked ``op_thread``) and an ``exit`` (``reason: "signal"``,
``signal`` such as "Segmentation fault", ``src: "faulthandler"``).  An empty crash file
(a rank killed with SIGKILL, or one still running) means nothing.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

from commscope.events import SCHEMA_VERSION, Event
from commscope.schema import redact_event
from commscope.visible import visible_event

CRASH_FILE = re.compile(r"^rank-(\d+)\.crash$")
MAX_BYTES = 1 << 20  # faulthandler writes at most 100 frames per thread: far less than this
_FRAME = re.compile(r'^\s*File "(.*)", line (\d+) in (.*)$')
_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+)|^(Stack) \(most recent call first\)")


def crash_file_name(rank: int) -> str:
    return f"rank-{rank:05d}.crash"


#: Frames of commscope's own threads (the recorder, the stack-request poller): never the
#: thread a rank died in.
_OWN_THREAD = re.compile(r"[/\\]commscope[/\\]record[/\\](recorder|hangsignal)\.py$")
_COLLECTIVE = re.compile(r"[/\\]torch[/\\]distributed[/\\]")


def _ours(t: dict) -> bool:
    return any(_OWN_THREAD.search(f[0]) for f in t["frames"])


def mark_dying_thread(threads: list[dict], tid: int | None = None) -> None:
    """Mark the thread the rank died in (``op_thread``) when faulthandler did not name one
    ("Current thread"): the signal hit a thread without Python frames, such as a backend's
    worker that called std::terminate.  Then it is the thread the signal hit if it has
    Python frames (``tid``), else the one inside torch.distributed (the collective the
    backend was serving), else the last one faulthandler listed (the oldest: the main
    thread), never commscope's own."""
    if any(t.get("op_thread") for t in threads):
        return
    pick = next((t for t in threads if tid is not None and t["tid"] == tid), None)
    if pick is None:
        candidates = [t for t in threads if not _ours(t)]
        pick = next((t for t in candidates if any(_COLLECTIVE.search(f[0]) for f in t["frames"])), None)
        if pick is None and candidates:
            pick = candidates[-1]
    if pick is not None:
        pick["op_thread"] = True


def parse(text: str, tid: int | None = None) -> tuple[str | None, list[dict]]:
    """(the fatal error, threads with frames outermost first) from faulthandler's output;
    the dying thread is marked ``op_thread`` (``mark_dying_thread``; ``tid``: the pthread id
    the signal hit, if known)."""
    error = None
    threads: list[dict] = []
    cur: dict | None = None
    for line in text.splitlines():
        if line.startswith("Fatal Python error:"):
            error = line.split(":", 1)[1].strip() or None
            continue
        m = _THREAD.match(line)
        if m:
            current = m.group(1) == "Current thread" or m.group(3) == "Stack"
            ident = int(m.group(2), 16) if m.group(2) else 0
            cur = {"tid": ident, "name": "crashing thread" if current else f"thread {m.group(2)}", "frames": []}
            if current:
                cur["op_thread"] = True
            threads.append(cur)
            continue
        f = _FRAME.match(line)
        if f and cur is not None:
            cur["frames"].append([f.group(1), int(f.group(2)), f.group(3)])
    for t in threads:
        t["frames"].reverse()  # faulthandler prints the most recent call first
    mark_dying_thread(threads, tid)
    return error, threads


def exit_from(stack: dict, ts: int, rank: int) -> Event:
    """The ``exit`` of a fatal signal known only from faulthandler's crash file."""
    error = str(stack.get("exc") or "").removeprefix("Fatal Python error: ") or None
    return {"type": "exit", "v": SCHEMA_VERSION, "rank": rank, "ts": ts, "reason": "signal",
            "signal": error or "fatal signal", "exc": f"Fatal Python error: {error}" if error else "fatal signal",
            "src": "faulthandler", "approx": True}  # (timed by the file's mtime: a coarse clock)


def crash_events(path: Path, rank: int) -> list[Event]:
    """The ``stack`` and ``exit`` events of a crash file ([] when empty or unreadable)."""
    try:
        st = os.stat(path)
        if st.st_size == 0:
            return []
        with open(path, "rb") as f:
            text = f.read(MAX_BYTES).decode("utf-8", "replace")
    except OSError:
        return []
    error, threads = parse(text)
    if error is None and not threads:
        return []
    ts = st.st_mtime_ns
    base = {"v": SCHEMA_VERSION, "rank": rank, "ts": ts}
    out: list[Event] = []
    if threads:
        out.append({"type": "stack", **base, "reason": "signal", "threads": threads})
    out.append({"type": "exit", **base, "reason": "signal", "signal": error or "fatal signal",
                "exc": f"Fatal Python error: {error}" if error else "fatal signal", "src": "faulthandler"})
    return [visible_event(redact_event(e)) for e in out]  # (a crash file's text is the program's: its paths)


class CrashFiles:
    """Follows the crash files of one job directory; each crash is returned once."""

    def __init__(self) -> None:
        self._sizes: dict[int, int] = {}
        self._done: set[int] = set()

    def poll(self, job_dir: Path | None, caught_up: Callable[[int], bool], final: bool = False,
             names: list[str] | None = None) -> list[Event]:
        """Events of crash files that stopped growing (or all, with ``final``) of ranks whose
        trace file is read to its end.  ``names``: the crash files in ``job_dir`` as its
        reader last listed it (None: list it)."""
        if job_dir is None:
            return []
        if names is None:
            try:
                names = os.listdir(job_dir)
            except OSError:
                return []
        out: list[Event] = []
        for name in names:
            m = CRASH_FILE.match(name)
            if not m:
                continue
            rank = int(m.group(1))
            if rank in self._done:
                continue
            try:
                size = os.path.getsize(job_dir / name)
            except OSError:
                continue
            steady = final or self._sizes.get(rank) == size
            self._sizes[rank] = size
            if size and steady and caught_up(rank):
                events = crash_events(job_dir / name, rank)
                if events:
                    self._done.add(rank)
                    out.extend(events)
        return out
