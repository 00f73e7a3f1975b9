"""Captured stacks as people read them: the user's frames, with the plumbing folded away.

A stack captured inside ``dist.all_reduce`` is mostly torch's and commscope's wrapper
frames (and, at the outer end, the launcher's); the line that matters is the user's
own call.  ``fold`` keeps the user's frames (outermost first, like a traceback) and
counts the rest, remembering the innermost folded function ("inside all_reduce").
Frames are classified by file path only, so this works on stacks from any machine.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any, NamedTuple

import orjson

#: File paths of frames that are plumbing, not the user's code: torch, commscope's own
#: recorder, varlen toolkit and launchers, and the standard library (its thread, process
#: and import machinery, and leaf calls like ``os.path.exists`` the user's frame is inside),
#: typing_extensions' ``deprecated`` wrapper (torch's around all_gather_into_tensor and
#: reduce_scatter_tensor: a crash or a snapshot said "at typing_extensions.py:3140", helper-182),
#: and native frames (a shared library's, or the interpreter's own: ``commscope snapshot``).
_INTERNAL = re.compile(
    r"[/\\]torch[/\\]|[/\\]commscope[/\\](record|varlen)[/\\]|[/\\]commscope[/\\]launch\.py$|"
    r"[/\\]commscope[/\\]scenarios[/\\](runner|base)\.py$|[/\\]multiprocessing[/\\]|"
    r"[/\\]lib[/\\]python3\.\d+[/\\](?!site-packages|dist-packages)|^<frozen |^<string>$|"
    r"[/\\]typing_extensions\.py$|"  # (the ``deprecated`` wrapper torch puts around some collectives)
    r"\.so(\.[\d.]+)?$|[/\\]python3?(\.\d+)?$")  # native frames (py-spy --native): libraries, the interpreter
#: Names of decorator layers: "inside" names the first real function below the user's frame.
_GENERIC = frozenset({"wrapper", "inner", "wrapped", "_fn", "decorate_context", "__call__", "_call_impl",
                      "_wrapped_call_impl"})


@functools.lru_cache(maxsize=4096)
def is_internal(path: str) -> bool:
    """Whether frames of ``path`` are plumbing.  Remembered by path: a stack is mostly the
    same few files, and 16k waiting ranks' stacks are folded at every diagnosis (the
    expression's search was ~40% of one, ~20 frames a rank)."""
    return bool(_INTERNAL.search(path or ""))


class Frame(NamedTuple):
    file: str
    line: int
    func: str

    def text(self) -> str:
        return f"{self.file}:{self.line} in {self.func}"


def _frames(raw: Any) -> list[Frame]:
    out = []
    for f in raw or []:
        if isinstance(f, list | tuple) and len(f) >= 3:
            try:
                out.append(Frame(str(f[0]), int(f[1]), str(f[2])))
            except (TypeError, ValueError):
                continue
    return out


def fold(name: Any, raw_frames: Any, keep_internal: int = 3) -> dict[str, Any]:
    """One thread's frames as evidence: ``frames`` (the user's, outermost first, as
    'file:line in func'), ``where`` (the innermost user frame: what the thread is doing),
    ``inside`` (the function the user's frame called, e.g. 'all_reduce'), ``folded`` (how many
    frames were left out).  A thread with no user frame keeps its innermost few."""
    frames = _frames(raw_frames)
    plumbing = [is_internal(f.file) for f in frames]
    user = [f for f, p in zip(frames, plumbing, strict=True) if not p]
    d: dict[str, Any] = {"thread": name}
    if user:
        d["frames"] = [f.text() for f in user]
        d["where"] = user[-1].text()
        last_user = max(i for i, p in enumerate(plumbing) if not p)
        inner = [f.func for f in frames[last_user + 1:]]
        named = [f for f in inner if f.rsplit(".", 1)[-1] not in _GENERIC]  # (py-spy says qualified names)
        if inner:
            d["inside"] = (named or inner)[0]
        d["folded"] = len(frames) - len(user)
    else:
        kept = frames[-keep_internal:]
        d["frames"] = [f.text() for f in kept]
        d["where"] = kept[-1].text() if kept else None
        d["folded"] = len(frames) - len(kept)
    return d


def main_threads(stack_event: dict) -> list[dict]:
    """The threads worth showing from a ``stack`` event: the one in the op (or, for
    request and crash captures, the main/crashing thread), else the first."""
    threads = [t for t in stack_event.get("threads") or [] if isinstance(t, dict)]
    return [t for t in threads if t.get("op_thread")] or threads[:1]


#: What ``view`` remembers of one rank's stack events: their folded views, by the event's id
#: (the event held with them, so an id is not reused while it is there)
Memo = dict[int, tuple[dict, list[dict]]]
#: A memo of more events than this is emptied (a rank's latest capture and the op captures a
#: diagnosis looks at: a few)
MEMO_HELD = 8


def view(stack_event: dict, memo: Memo | None = None) -> list[dict]:
    """A ``stack`` event as folded thread views (see ``fold``): the lists and dicts each
    call's own (equal threads of any events folded once, ``_fold_shared``).  ``memo``, the rank's
    (``RankTrace.stacks_folded``): an event is folded once there, not at every diagnosis
    (16k waiting ranks' stacks at a hang: ~20 us a rank).  Kept by the rank, it goes with the
    model; emptied whole past ``MEMO_HELD`` (one step: the console's threads may both ask)."""
    return [dict(t, frames=list(t["frames"])) for t in folded(stack_event, memo)]


def folded(stack_event: dict, memo: Memo | None = None) -> list[dict]:
    """What ``view`` copies: the folded threads, shared by every rank whose capture holds
    equal ones (read only)."""
    if memo is None:
        return _folded(stack_event)
    got = memo.get(id(stack_event))
    if got is None or got[0] is not stack_event:
        if len(memo) >= MEMO_HELD:
            memo.clear()
        got = memo[id(stack_event)] = (stack_event, _folded(stack_event))
    return got[1]


def _folded(stack_event: dict) -> list[dict]:
    """The folded views of a stack event's threads, shared (``view`` hands out copies)."""
    return [_fold_shared(t.get("name"), t.get("frames")) for t in main_threads(stack_event)]


#: Threads folded (``fold``), by their name and frames as JSON: ranks waiting in one
#: collective capture the same stack, and 16k of them folded it ~20 us each, the first
#: diagnosis that showed them (its finding that much later)
_FOLDS: dict[bytes, dict[str, Any]] = {}
#: Distinct threads ``_FOLDS`` holds at most, and bytes of their keys (emptied whole past either)
FOLDS_HELD = 1024
FOLDS_BYTES = 8 << 20
_folds_bytes = 0


def _fold_shared(name: Any, frames: Any) -> dict[str, Any]:
    """``fold(name, frames)``, once for equal threads (shared: not to be changed)."""
    global _folds_bytes
    try:
        key = orjson.dumps([name, frames])
    except TypeError:  # (not JSON, ``orjson.JSONEncodeError``: no reader gives such a value)
        return fold(name, frames)
    got = _FOLDS.get(key)
    if got is None:
        if len(_FOLDS) >= FOLDS_HELD or _folds_bytes + len(key) > FOLDS_BYTES:
            _FOLDS.clear()
            _folds_bytes = 0
        got = _FOLDS[key] = fold(name, frames)
        _folds_bytes += len(key)
    return got


def same_key(threads: list[dict] | None) -> bytes | str:
    """What two folded views are equal by, as text (the ranks showing one stack are shown
    once): orjson's, keys sorted (16k waiting ranks' at each diagnosis), or ``json``'s where
    orjson refuses a value (an integer past 64 bits: no reader gives one, orjson reads it as
    a float; a safeguard); the two are never equal (bytes, str)."""
    try:
        return orjson.dumps(threads, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS, default=str)
    except orjson.JSONEncodeError:
        return json.dumps(threads, sort_keys=True, default=str)


def one_line(threads: list[dict] | None) -> str | None:
    """'train.py:42 in step (inside all_reduce)' for the first thread of a view."""
    if not threads:
        return None
    t = threads[0]
    if not t.get("where"):
        return None
    return t["where"] + (f" (inside {t['inside']})" if t.get("inside") else "")
