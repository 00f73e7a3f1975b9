"""Finding the user's frame: the first one outside torch and commscope's own plumbing."""

from __future__ import annotations

import os
import sys
import threading
import traceback
from types import CodeType, FrameType

import torch

from commscope.redact import redact

_INTERNAL_DIRS = (
    os.path.dirname(torch.__file__) + os.sep,
    os.path.dirname(os.path.abspath(__file__)) + os.sep,  # commscope/record/
    os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "varlen"),
    os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "launch.py"),
    "<frozen ",
)
# id(code) -> (code, internal?).  Keyed by id: hashing a code object hashes its whole
# contents (~0.6 us for a large training loop).  The value keeps the code alive, so its
# id cannot be reused while the entry exists.
_internal_cache: dict[int, tuple[CodeType, bool]] = {}


def _is_internal(code: CodeType) -> bool:
    hit = _internal_cache.get(id(code))
    if hit is None:
        internal = code.co_filename.startswith(_INTERNAL_DIRS) or "contextlib.py" in code.co_filename
        if len(_internal_cache) > 50_000:
            _internal_cache.clear()
            _site_cache.clear()
        hit = _internal_cache[id(code)] = (code, internal)
    return hit[1]


def user_frame(frame: FrameType | None) -> tuple[int, int] | None:
    """(id of the code, instruction offset) of the first non-internal frame at or above
    ``frame``; ``format_site`` turns it into text later.

    The line number is resolved off the hot path: ``frame.f_lineno`` scans the code's
    line table from its start, which costs more the larger the calling function.
    """
    while frame is not None:
        code = frame.f_code
        if not _is_internal(code):
            return id(code), frame.f_lasti
        frame = frame.f_back
    return None


_site_cache: dict[tuple[int, int], str] = {}


def line_of(code: CodeType, lasti: int) -> int:
    for start, end, line in code.co_lines():
        if start <= lasti < end and line is not None:
            return line
    return code.co_firstlineno


def code_site(code: CodeType, lasti: int) -> str:
    """``file:line in function`` of an instruction offset in a code object (redacted: it
    becomes a trace's call site; asked once per site)."""
    return redact(f"{code.co_filename}:{line_of(code, lasti)} in {code.co_name}")


def is_internal(code: CodeType) -> bool:
    """A frame of torch or of commscope's own plumbing (the native recorder asks this)."""
    return _is_internal(code)


def format_site(site: tuple[int, int] | None) -> str | None:
    """``file:line in function`` for a ``user_frame`` result (cached; runs on the thread)."""
    if site is None:
        return None
    text = _site_cache.get(site)
    if text is None:
        entry = _internal_cache.get(site[0])
        if entry is None:
            return None  # the cache was cleared meanwhile; the call site is lost
        text = code_site(entry[0], site[1])
        if len(_site_cache) > 100_000:
            _site_cache.clear()
        _site_cache[site] = text
    return text


def all_stacks(limit: int = 64) -> list[dict]:
    """Every Python thread's stack, innermost frame last (like a traceback)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    out = []
    for tid, frame in sys._current_frames().items():
        frames = [[fs.filename, fs.lineno, fs.name] for fs in traceback.extract_stack(frame, limit=limit)]
        out.append({"tid": tid, "name": names.get(tid, "?"), "frames": frames})
    return out
