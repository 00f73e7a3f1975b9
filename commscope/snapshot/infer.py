"""Which collective a rank is inside, read from its stack: a pure function of py-spy's frames.

The rank is inside an op when a thread's stack holds a ``torch.distributed`` function the
op table names (``optable.OPS``) in ``distributed_c10d.py``, or a ``commscope.varlen`` op;
the outermost one counts (``all_gather_object`` calls ``all_gather``: the user called the
first).  What else the frames tell, and only that:

- the call site: the innermost frame outside torch and commscope (``analysis.stacks``);
- the peer of a send/recv and the root of a rooted op: the ``dst``/``src`` argument, an int
  py-spy can read (a global rank, as torch takes it);
- the group: the default group when the call passed none.  The decorator frame c10d wraps
  every public op in (``_exception_logger``) holds the user's own ``args``/``kwargs``:
  the group is the op's ``group`` parameter there, by position or by name.  A group that was
  passed is a ProcessGroup object py-spy shows only by address, so its members are unknown.

DDP's gradient all_reduce is issued by its C++ reducer, not from Python: a thread in autograd's
backward whose native frames (``py-spy --native``) show the reducer waiting
(``c10d::Reducer::finalize_backward`` -> ``condition_variable::wait``) or a c10d ``Work``
waited on is inside an all_reduce of DDP's group.  DDP's group object is not on that stack:
it is taken to be the default group.  Python frames alone show only ``loss.backward()``,
which computes as well as waits: without native frames no collective is read from it.

Shapes, dtypes and the reduce op are C++ objects py-spy cannot read: a snapshot has none.
"""

from __future__ import annotations

import dataclasses
import re

from commscope import optable
from commscope.analysis.stacks import is_internal
from commscope.snapshot.pyspy import PyFrame, PyThread

#: The default group's name in a trace (the recorder's name for torch's WORLD).
DEFAULT_GROUP = "0"
_C10D = re.compile(r"[/\\]torch[/\\]distributed[/\\]distributed_c10d\.py$")
_VARLEN = re.compile(r"[/\\]commscope[/\\]varlen[/\\][^/\\]+\.py$")
_OPS = frozenset(n for n, o in optable.OPS.items() if not o.alias)
#: The argument that names a rooted op's root, or a p2p op's peer.
_ROOT_ARG = {"broadcast": "src", "reduce": "dst", "gather": "dst", "scatter": "src", "broadcast_object_list": "src",
             "gather_object": "dst", "scatter_object_list": "src", "send": "dst", "isend": "dst", "recv": "src",
             "irecv": "src", "send_object_list": "dst", "recv_object_list": "src"}
_INT = re.compile(r"-?\d{1,9}")
#: Where autograd runs a backward pass (``loss.backward()``, ``torch.autograd.backward``/``grad``)
_AUTOGRAD = re.compile(r"[/\\]torch[/\\](autograd[/\\](graph|__init__)|_tensor)\.py$")
_BACKWARD_FUNCS = frozenset({"_engine_run_backward", "backward", "grad", "Tensor.backward"})
_REDUCER = re.compile(r"\bc10d::Reducer::")
_WAIT = re.compile(r"wait", re.IGNORECASE)
#: a c10d Work or ProcessGroup waited on (DDP's comm hooks, or the reducer's bucket work)
_WORK_WAIT = re.compile(r"\bc10d::\w*(Work|ProcessGroup)\w*::.*\bwait")
#: ``InFlight.via`` of an all_reduce read from DDP's reducer
DDP_REDUCER = "DDP's gradient reducer"


@dataclasses.dataclass(frozen=True, slots=True)
class InFlight:
    """The op a rank's stack shows it inside."""

    op: str
    group: str | None  # DEFAULT_GROUP, or None: a group passed by object (members unknown)
    peer: int | None  # p2p: the other rank (None: any source, or unreadable)
    direction: str | None  # "send" / "recv" for p2p
    root: int | None
    site: str | None  # "file:line in func": the user's call
    tid: int
    active: bool  # the thread was running, not waiting, when dumped
    via: str | None = None  # issued by C++ (``DDP_REDUCER``), not by the Python call at ``site``

    def key(self) -> tuple:
        """Equal when two samples show the same call (the same op, group, peer and site)."""
        return (self.op, self.group, self.peer, self.direction, self.root, self.site)


def in_flight(threads: list[PyThread]) -> InFlight | None:
    """The op the rank is inside (the first thread found in one), None when it is in none."""
    for t in threads:
        found = _thread_op(t)
        if found is not None:
            return found
    for t in threads:
        found = _ddp_op(t)
        if found is not None:
            return found
    return None


def has_native(threads: list[PyThread]) -> bool:
    """Whether the dump holds native frames (``py-spy --native``)."""
    return any(f.native for t in threads for f in t.frames)


def in_backward(threads: list[PyThread]) -> tuple[int, str | None] | None:
    """(tid, the user's call) of the first thread inside autograd's backward, from its Python
    frames alone (a DDP rank there computes gradients and has its reducer all_reduce them)."""
    for t in threads:
        at = _backward_at(t.frames)
        if at is not None:
            return t.tid, _site(t.frames, at)
    return None


#: The innermost native frame of a thread that waits (a lock, a condition, a futex) ...
_WAITING = re.compile(r"wait|lock|futex", re.IGNORECASE)
#: ... but not a thread computing that waits on its own workers (OpenMP's barriers)
_COMPUTING = re.compile(r"omp|kmp|barrier|parallel", re.IGNORECASE)


def waiting_in_backward(threads: list[PyThread]) -> bool:
    """A thread inside autograd's backward whose innermost frame is a native wait (a hook
    stuck on a lock), not autograd computing; only a dump with native frames can say."""
    for t in threads:
        at = _backward_at(t.frames)
        inner = t.frames[-1] if t.frames else None
        if at is not None and inner is not None and inner.native and _WAITING.search(inner.func) \
                and not _COMPUTING.search(inner.func):
            return True
    return False


def _backward_at(frames: tuple[PyFrame, ...]) -> int | None:
    return next((i for i, f in enumerate(frames) if not f.native and f.func in _BACKWARD_FUNCS
                 and _AUTOGRAD.search(f.file)), None)


def _ddp_op(t: PyThread) -> InFlight | None:
    """DDP's all_reduce: a thread in backward whose native frames show the reducer waiting
    (a Reducer frame with a wait below it) or a c10d Work waited on."""
    at = _backward_at(t.frames)
    if at is None:
        return None
    native = [f.func for f in t.frames[at:] if f.native]
    reducer = next((i for i, fn in enumerate(native) if _REDUCER.search(fn)), None)
    waits = (reducer is not None and any(_WAIT.search(fn) for fn in native[reducer + 1:])) or any(
        _WORK_WAIT.search(fn) for fn in native)
    if not waits:
        return None
    return InFlight("all_reduce", DEFAULT_GROUP, None, None, None, _site(t.frames, at), t.tid, t.active, DDP_REDUCER)


def _site(frames: tuple[PyFrame, ...], at: int) -> str | None:
    """The user's call below ``frames[at]``: its innermost frame outside torch and commscope."""
    site = next((fr for fr in reversed(frames[:at]) if not fr.native and not is_internal(fr.file)), None)
    return f"{site.file}:{site.line} in {site.func}" if site else None


def _is_op_frame(f: PyFrame) -> bool:
    return f.func in _OPS and bool(_C10D.search(f.file) or _VARLEN.search(f.file))


def _thread_op(t: PyThread) -> InFlight | None:
    frames = t.frames
    at = next((i for i, f in enumerate(frames) if _is_op_frame(f)), None)
    if at is None:
        return None
    f = frames[at]
    info = optable.OPS[f.func]
    direction = info.direction if info.kind == optable.P2P else None
    arg = _ROOT_ARG.get(f.func)
    value = _as_int(f.local(arg)) if arg else None
    peer = value if direction else None
    root = value if arg and not direction else None
    return InFlight(f.func, group_of(frames, at), peer, direction, root, _site(frames, at), t.tid, t.active)


def group_of(frames: tuple[PyFrame, ...], at: int) -> str | None:
    """DEFAULT_GROUP when the user's call passed no group (or None), else None (unknown)."""
    params = frames[at].args()
    if "group" not in params:
        return DEFAULT_GROUP  # an op without a group parameter runs on the default group
    if _VARLEN.search(frames[at].file):
        passed = frames[at].local("group")
        return DEFAULT_GROUP if passed == "None" else None
    wrapper = next((fr for fr in reversed(frames[:at]) if fr.func.endswith("wrapper") and fr.local("args") is not None),
                   None)
    if wrapper is None:
        return None
    kwargs = wrapper.local("kwargs") or "{}"
    m = re.search(r'"group":\s*([^,}]+)', kwargs)
    if m:
        return DEFAULT_GROUP if m.group(1).strip() == "None" else None
    args = split_items(wrapper.local("args") or "()")
    if "..." in kwargs or "..." in args:  # py-spy shortened them: the group may hide there
        return None
    i = params.index("group")
    if i < len(args):
        return DEFAULT_GROUP if args[i] == "None" else None
    return DEFAULT_GROUP


def split_items(text: str) -> list[str]:
    """The top-level items of py-spy's repr of a tuple or list: '(<Tensor at 0x1>, 3, None)'."""
    text = text.strip()
    if len(text) < 2 or text[0] not in "([" or text[-1] not in ")]":
        return []
    items, depth, quote, cur = [], 0, "", []
    for ch in text[1:-1]:
        if quote:
            cur.append(ch)
            if ch == quote:
                quote = ""
            continue
        if ch in "\"'":
            quote = ch
        elif ch in "([{<":
            depth += 1
        elif ch in ")]}>":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append("".join(cur).strip())
            cur = []
            continue
        cur.append(ch)
    last = "".join(cur).strip()
    if last:
        items.append(last)
    return items


def _as_int(text: str | None) -> int | None:
    return int(text) if text is not None and _INT.fullmatch(text.strip()) else None
