"""Install and remove the wrappers around torch.distributed (and commscope.varlen).

Only the attributes of the ``torch.distributed`` package are replaced, not the globals of
``distributed_c10d``: torch's own helpers (``all_gather_object`` calling ``all_gather``,
``batch_isend_irecv`` comparing ``op.op is isend``) keep calling the originals, so an
object op is one logical op by construction and P2POp identity checks keep working.
``P2POp`` unwraps our ``isend``/``irecv`` wrappers back to the originals for the same
reason.  ``Work.wait`` is patched on the class, so the returned Work objects are the
very objects torch returned.  ``uninstall`` puts every original object back.

This module owns the patching (``replace``, ``unwrap``, ``when_imported``,
``uninstall``) and the wrappers every op source shares (process group creation and
destruction, ``P2POp``, ``Work.get_future``).  Each op source owns its op wrappers:
``nativeops`` (C callables that only name and place what the native kernel observes)
and ``pyhot`` (the whole hot path in Python).  ``ACTIVE`` is the op source while
instrumented (``opsource.OpSource``); its ``rec`` is the Recorder.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import sys
from collections.abc import Callable
from typing import Any

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from commscope import events
from commscope.record.importhook import AfterImportLoader
from commscope.record.opsource import OpSource

ACTIVE: OpSource | None = None  # the op source while instrumented (read on every wrapped call)

_saved: list[tuple[Any, str, Any, bool]] = []  # (owner, attr, original, existed)
_wait_patched: dict[type, Any] = {}
ORIG_ATTR = "__commscope_orig__"


def default_group() -> Any:
    """The default process group or None; avoids ``_get_default_group``'s two property calls."""
    try:
        return c10d._world._default_pg
    except AttributeError:
        try:
            return c10d._get_default_group()
        except Exception:
            return None


def replace(owner: Any, attr: str, value: Any) -> None:
    """Set ``owner.attr`` to ``value`` until ``uninstall`` puts the original back."""
    existed = attr in vars(owner) if isinstance(owner, type) else hasattr(owner, attr)
    original = vars(owner).get(attr) if isinstance(owner, type) else getattr(owner, attr, None)
    _saved.append((owner, attr, original, existed))
    setattr(owner, attr, value)


def unwrap(fn: Any) -> Any:
    """The original of a wrapper of ours (``fn`` itself if it is none)."""
    return getattr(fn, ORIG_ATTR, fn)


def wrapped(wrapper: Any, orig: Any) -> Any:
    """Mark ``wrapper`` as wrapping ``orig`` (see ``unwrap``)."""
    setattr(wrapper, ORIG_ATTR, orig)
    return wrapper


def _destroy_wrapper(orig: Any) -> Any:
    @functools.wraps(orig)
    def destroy_process_group(group=None):
        source = ACTIVE
        # (``destroy_process_group(dist.group.WORLD)`` is the whole job's, as torch takes it:
        # taken for a subgroup's, a crash after it read healthy, helper-194)
        whole = group is None or group is default_group()
        if source is not None and whole:
            try:
                # (called in a ``finally`` as an exception propagates: the ending that follows
                # is that exception, raised before the group ended, helper-195)
                raising = sys.exc_info()[0]
                source.rec.mark_exit(events.DESTROYED, raising=raising.__name__ if raising is not None
                                     and not issubclass(raising, SystemExit) else None)
                source.rec.flush(timeout=1.0)
            except Exception:
                pass
        try:
            return orig(group)
        finally:
            if source is not None:
                try:
                    source.on_destroy(whole)
                    if whole:
                        source.rec.on_destroyed()
                except Exception:
                    pass

    return wrapped(destroy_process_group, orig)


def _init_wrapper(orig: Any) -> Any:
    @functools.wraps(orig)
    def init_process_group(*args, **kwargs):
        ret = orig(*args, **kwargs)
        source = ACTIVE
        if source is not None:
            try:
                source.rec.on_group_created()
                source.rec.start()  # no-op unless the wrappers were installed by ``prepare``
            except Exception:
                pass
        return ret

    return wrapped(init_process_group, orig)


def ensure_wait_patched(cls: type, wrap: Callable[[Any], Any]) -> None:
    """Patch ``cls.wait`` (Work, or a varlen handle class) once while instrumented, with
    ``wrap(original)``: the active op source's wait wrapper."""
    if cls in _wait_patched:
        return
    orig = vars(cls).get("wait") if "wait" in vars(cls) else getattr(cls, "wait", None)
    if orig is None:
        return
    _wait_patched[cls] = orig
    try:
        replace(cls, "wait", wrap(orig))
    except (TypeError, AttributeError):
        pass


def _p2pop_new(orig_new: Any) -> Any:
    fn = orig_new.__func__ if isinstance(orig_new, staticmethod) else orig_new

    def __new__(cls, op, *args, **kwargs):
        return fn(cls, unwrap(op), *args, **kwargs)

    return staticmethod(__new__)


def _p2pop_init(orig_init: Any) -> Any:
    @functools.wraps(orig_init)
    def __init__(self, op, *args, **kwargs):
        orig_init(self, unwrap(op), *args, **kwargs)

    return __init__


def _get_future_wrapper(orig: Any) -> Any:
    @functools.wraps(orig)
    def get_future(self, *args, **kwargs):
        fut = orig(self, *args, **kwargs)
        source = ACTIVE
        if source is not None:
            try:
                source.untrack(self)  # its completion is taken through the future: not "never waited"
            except Exception:
                pass
        return fut

    return get_future


def install_common() -> Any:
    """Install the wrappers every op source shares (first removing any left installed);
    returns commscope.varlen (or None), whose ops the source wraps too."""
    if _saved:
        uninstall()
    get_future = vars(dist.Work).get("get_future")
    if get_future is not None:
        replace(dist.Work, "get_future", _get_future_wrapper(get_future))
    replace(dist, "destroy_process_group", _destroy_wrapper(unwrap(dist.destroy_process_group)))
    replace(dist, "init_process_group", _init_wrapper(unwrap(dist.init_process_group)))
    p2p = dist.P2POp
    replace(p2p, "__new__", _p2pop_new(vars(p2p)["__new__"]))
    replace(p2p, "__init__", _p2pop_init(vars(p2p)["__init__"]))
    varlen = sys.modules.get("commscope.varlen")
    if varlen is None:
        try:
            import commscope.varlen as varlen  # noqa: PLC0415
        except ImportError:
            varlen = None
    return varlen


def installed() -> bool:
    """Whether any wrapper is installed now."""
    return bool(_saved)


def activate(source: OpSource) -> None:
    """Make ``source`` (an ``opsource.OpSource``, its wrappers installed) the one every
    wrapper reports to."""
    global ACTIVE
    ACTIVE = source


class _Hook(importlib.abc.MetaPathFinder):
    """Runs callbacks right after a module is first imported (DTensor's modules are usually
    imported after commscope installs itself)."""

    def __init__(self) -> None:
        self.pending: dict[str, list] = {}

    def find_spec(self, name, path=None, target=None):
        if name not in self.pending:
            return None
        sys.meta_path.remove(self)  # find the real spec without finding ourselves
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is not None and spec.loader is not None:
            spec.loader = AfterImportLoader(spec.loader, self.pending.pop(name))
        return spec


_hook: _Hook | None = None


def when_imported(name: str, callback: Any) -> None:
    """``callback(module)`` now if ``name`` is imported, else right after its import."""
    global _hook
    module = sys.modules.get(name)
    if module is not None:
        callback(module)
        return
    if _hook is None:
        _hook = _Hook()
        sys.meta_path.insert(0, _hook)
    _hook.pending.setdefault(name, []).append(callback)


def uninstall() -> None:
    global ACTIVE, _hook
    ACTIVE = None
    if _hook is not None:
        if _hook in sys.meta_path:
            sys.meta_path.remove(_hook)
        _hook = None
    while _saved:
        owner, attr, original, existed = _saved.pop()
        if existed:
            setattr(owner, attr, original)
        else:
            try:
                delattr(owner, attr)
            except AttributeError:
                pass
    _wait_patched.clear()

