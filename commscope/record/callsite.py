"""Finding the user's frame: the first one outside torch and commscope's own plumbing."""

from __future__ import annotations

import os
import sys
import threading
import traceback
from types import CodeType, FrameType

import torch

_INTERNAL_DIRS = (
    os.path.dirname(torch.__file__) + os.sep,
    os.path.dirname(os.path.abspath(__file__)) + os.sep,  # commscope/record/
    os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "varlen"),
    os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "launch.py"),
    "<frozen ",
)
_internal_cache: dict[CodeType, bool] = {}


def _is_internal(code: CodeType) -> bool:
    hit = _internal_cache.get(code)
    if hit is None:
        hit = code.co_filename.startswith(_INTERNAL_DIRS) or "contextlib.py" in code.co_filename
        if len(_internal_cache) > 50_000:
            _internal_cache.clear()
        _internal_cache[code] = hit
    return hit


def user_frame(frame: FrameType | None) -> tuple[str, int, str] | None:
    """(file, line, function) of the first non-internal frame at or above ``frame``."""
    while frame is not None:
        code = frame.f_code
        if not _is_internal(code):
            return code.co_filename, frame.f_lineno, code.co_name
        frame = frame.f_back
    return None


def format_site(site: tuple[str, int, str] | None) -> str | None:
    if site is None:
        return None
    return f"{site[0]}:{site[1]} in {site[2]}"


def all_stacks(limit: int = 64) -> list[dict]:
    """Every Python thread's stack, innermost frame last (like a traceback)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    out = []
    for tid, frame in sys._current_frames().items():
        frames = [[fs.filename, fs.lineno, fs.name] for fs in traceback.extract_stack(frame, limit=limit)]
        out.append({"tid": tid, "name": names.get(tid, "?"), "frames": frames})
    return out
