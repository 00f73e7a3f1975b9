"""Install and remove the wrappers around torch.distributed (and commscope.varlen).

Only the attributes of the ``torch.distributed`` package are replaced, not the globals of
``distributed_c10d``: torch's own helpers (``all_gather_object`` calling ``all_gather``,
``batch_isend_irecv`` comparing ``op.op is isend``) keep calling the originals, so an
object op is one logical op by construction and P2POp identity checks keep working.
``P2POp`` unwraps our ``isend``/``irecv`` wrappers back to the originals for the same
reason.  ``Work.wait`` is patched on the class, so the returned Work objects are the
very objects torch returned.  ``uninstall`` puts every original object back.

Two sets of wrappers share these rules: the native ones (``install_native``: C callables
from commscope_native that only name and place the collectives the native kernel
observes) and the Python ones (``install_python``: the whole hot path in Python, for
machines where the native recorder cannot be built).  ``ACTIVE`` is the op source
(``nativeops.NativeOps`` or ``pyhot.PythonOps``); its ``rec`` is the Recorder.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import sys
import time
from typing import Any

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from commscope.record import ops
from commscope.record.importhook import AfterImportLoader

ACTIVE: Any = None  # the op source while instrumented (read on every wrapped call)

_saved: list[tuple[Any, str, Any, bool]] = []  # (owner, attr, original, existed)
_wait_patched: dict[type, Any] = {}
_ORIG_ATTR = "__commscope_orig__"


def default_group() -> Any:
    """The default process group or None; avoids ``_get_default_group``'s two property calls."""
    try:
        return c10d._world._default_pg
    except AttributeError:
        try:
            return c10d._get_default_group()
        except Exception:
            return None


def _set(owner: Any, attr: str, value: Any) -> None:
    existed = attr in vars(owner) if isinstance(owner, type) else hasattr(owner, attr)
    original = vars(owner).get(attr) if isinstance(owner, type) else getattr(owner, attr, None)
    _saved.append((owner, attr, original, existed))
    setattr(owner, attr, value)


def _unwrap(fn: Any) -> Any:
    return getattr(fn, _ORIG_ATTR, fn)


def _record_raise(end: Any, what: Any, exc: BaseException) -> None:
    """Record that a call raised; whatever happens here, the caller re-raises ``exc``."""
    try:
        end(what, exc, None)
    except Exception:
        pass


def make_wrapper(name: str, orig: Any, extract: Any, nests: bool = False) -> Any:
    """``nests``: the wrapped function calls other wrapped ones (the varlen ops)."""
    from commscope.record.pyhot import QueuedEnd, pack_plain_end  # noqa: PLC0415  (pyhot imports this module)

    getframe = sys._getframe
    time_ns = time.time_ns

    @functools.wraps(orig)
    def wrapper(*args, **kwargs):
        rec = ACTIVE
        if rec is None:
            return orig(*args, **kwargs)
        try:
            tok = rec.begin(name, extract(*args, **kwargs), getframe(1), None, False, nests)
        except Exception:
            tok = None  # arguments torch will reject itself, or an unknown group
        if tok is None:
            return orig(*args, **kwargs)
        try:
            ret = orig(*args, **kwargs)
        except BaseException as exc:
            _record_raise(rec.end, tok, exc)
            raise
        try:
            if not tok.plain or rec.need_job:
                rec.end(tok, None, ret)  # async, any-source recv, CUDA, job id unknown: full path
            else:  # the common case, inlined: a plain synchronous op ended
                if nests:
                    rec._tls.cur = tok.parent
                ts = time_ns()
                rec.ring.put(pack_plain_end(ts, tok.op_id))
                rec.q.append(QueuedEnd(tok.op_id, ts, None, None))
        except Exception:
            pass  # recording must never change what the call returns
        return ret

    setattr(wrapper, _ORIG_ATTR, orig)
    return wrapper


def _batch_wrapper(orig: Any) -> Any:
    orig_isend = c10d.isend

    @functools.wraps(orig)
    def batch_isend_irecv(p2p_op_list):
        rec = ACTIVE
        if rec is None:
            return orig(p2p_op_list)
        try:
            items = list(p2p_op_list)
            frame = sys._getframe(1)
            outer = rec.begin("batch_isend_irecv", ops.OpArgs(items[0].group, None, None, None, None, False, (), ()),
                              frame, container=True)  # its children get child_of, not nesting
        except Exception:
            outer = None
        if outer is None:
            return orig(p2p_op_list)
        children = []
        try:
            for p in items:
                send = _unwrap(p.op) is orig_isend
                ts = (p.tensor,)
                a = ops.OpArgs(p.group, p.peer, "send" if send else "recv", None, None, True,
                               ts if send else (), () if send else ts)
                tok = rec.begin("isend" if send else "irecv", a, frame, child_of=outer.op_id)
                if tok is not None:
                    children.append(tok)
        except Exception:
            pass
        try:
            works = orig(p2p_op_list)
        except BaseException as exc:
            for tok in children:
                _record_raise(rec.end, tok, exc)
            _record_raise(rec.end, outer, exc)
            raise
        for tok in children:
            rec.end(tok, None, None)
        rec.end(outer, None, None)
        try:
            if works:
                if len(works) == len(children):
                    for w, tok in zip(works, children, strict=True):
                        rec.track(w, (tok.op_id,), tok.cuda)
                else:  # coalesced: one Work completes the whole batch
                    ids = tuple(t.op_id for t in children)
                    for w in works:
                        rec.track(w, ids, children[0].cuda if children else None)
        except Exception:
            pass
        return works

    setattr(batch_isend_irecv, _ORIG_ATTR, orig)
    return batch_isend_irecv


def _destroy_wrapper(orig: Any) -> Any:
    @functools.wraps(orig)
    def destroy_process_group(group=None):
        source = ACTIVE
        if source is not None and (group is None or group is default_group()):
            try:
                source.rec.mark_exit("destroy_process_group")
                source.rec.flush(timeout=1.0)
            except Exception:
                pass
        try:
            return orig(group)
        finally:
            if source is not None:
                try:
                    source.on_destroy(group is None)
                    if group is None:
                        source.rec.on_destroyed()
                except Exception:
                    pass

    setattr(destroy_process_group, _ORIG_ATTR, orig)
    return destroy_process_group


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

    setattr(init_process_group, _ORIG_ATTR, orig)
    return init_process_group


def _make_wait(orig_wait: Any) -> Any:
    @functools.wraps(orig_wait)
    def wait(self, *args, **kwargs):
        rec = ACTIVE
        if rec is None or not rec.works:
            return orig_wait(self, *args, **kwargs)
        entry = rec.works.pop(id(self), None)
        if entry is None or entry.ref() is not self:
            return orig_wait(self, *args, **kwargs)
        op_ids, cuda = entry.op_ids, entry.cuda
        rec.wait_begin(op_ids)
        try:
            ret = orig_wait(self, *args, **kwargs)
        except BaseException as exc:
            _record_raise(rec.wait_end, op_ids, exc)
            raise
        rec.wait_end(op_ids, None, cuda)
        return ret

    return wait


def ensure_wait_patched(cls: type, native: Any = None) -> None:
    """Patch ``cls.wait`` (Work, or a varlen handle class) once while instrumented: with the
    native recorder's WaitWrapper when ``native`` is its module."""
    if cls in _wait_patched:
        return
    orig = vars(cls).get("wait") if "wait" in vars(cls) else getattr(cls, "wait", None)
    if orig is None:
        return
    _wait_patched[cls] = orig
    try:
        _set(cls, "wait", native.WaitWrapper(orig) if native is not None else _make_wait(orig))
    except (TypeError, AttributeError):
        pass


def _p2pop_new(orig_new: Any) -> Any:
    fn = orig_new.__func__ if isinstance(orig_new, staticmethod) else orig_new

    def __new__(cls, op, *args, **kwargs):
        return fn(cls, _unwrap(op), *args, **kwargs)

    return staticmethod(__new__)


def _p2pop_init(orig_init: Any) -> Any:
    @functools.wraps(orig_init)
    def __init__(self, op, *args, **kwargs):
        orig_init(self, _unwrap(op), *args, **kwargs)

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


def _install_common() -> Any:
    """The wrappers both paths share; returns commscope.varlen (or None)."""
    if _saved:
        uninstall()
    get_future = vars(dist.Work).get("get_future")
    if get_future is not None:
        _set(dist.Work, "get_future", _get_future_wrapper(get_future))
    _set(dist, "destroy_process_group", _destroy_wrapper(_unwrap(dist.destroy_process_group)))
    _set(dist, "init_process_group", _init_wrapper(_unwrap(dist.init_process_group)))
    p2p = dist.P2POp
    _set(p2p, "__new__", _p2pop_new(vars(p2p)["__new__"]))
    _set(p2p, "__init__", _p2pop_init(vars(p2p)["__init__"]))
    varlen = sys.modules.get("commscope.varlen")
    if varlen is None:
        try:
            import commscope.varlen as varlen  # noqa: PLC0415
        except ImportError:
            varlen = None
    return varlen


def install_python(source: Any) -> None:
    """The pure-Python hot path (``pyhot.PythonOps``)."""
    global ACTIVE
    varlen = _install_common()
    for name, extract in ops.TORCH_OPS.items():
        orig = getattr(dist, name, None)
        if orig is None:
            continue  # older torch
        _set(dist, name, make_wrapper(name, _unwrap(orig), extract))
    _set(dist, "batch_isend_irecv", _batch_wrapper(_unwrap(dist.batch_isend_irecv)))
    ensure_wait_patched(dist.Work)
    if varlen is not None:
        for name, extract in ops.VARLEN_OPS.items():
            orig = getattr(varlen, name, None)
            if orig is not None:
                _set(varlen, name, make_wrapper(name, _unwrap(orig), extract, nests=True))
    ACTIVE = source


# --------------------------------------------------------------------------- native path
#: torch's own entry points to collectives (functional collectives, DTensor's helpers, the
#: c10d functions torch calls internally), by module.  Wrapped to lend the collectives
#: they issue the caller's call site; inside another recorded call they are its traffic.
#: ``isend``/``irecv`` of distributed_c10d stay: ``batch_isend_irecv`` compares them by identity.
ANNOTATE: dict[str, tuple[str, ...]] = {
    "torch.distributed.distributed_c10d": tuple(n for n in ops.TORCH_OPS if n not in ("isend", "irecv")),
    "torch.distributed._functional_collectives": (
        "broadcast", "all_reduce", "all_gather_tensor", "all_gather_tensor_autograd", "reduce_scatter_tensor",
        "reduce_scatter_tensor_autograd", "all_reduce_coalesced", "all_gather_into_tensor_coalesced",
        "reduce_scatter_tensor_coalesced", "all_to_all_single", "all_to_all_single_autograd", "permute_tensor",
        "all_gather_single", "reduce_scatter_single", "all_gather_single_coalesced",
        "reduce_scatter_single_coalesced"),
    "torch.distributed._functional_collectives_impl": (
        "_broadcast", "_all_reduce", "_all_reduce_coalesced", "_all_gather_into_tensor",
        "_all_gather_into_tensor_coalesced", "_reduce_scatter_tensor", "_reduce_scatter_tensor_coalesced",
        "_all_to_all_single", "_isend", "_irecv", "_batch_p2p_ops"),
    "torch.distributed.tensor._collective_utils": ("broadcast", "scatter", "mesh_scatter", "mesh_broadcast",
                                                   "shard_dim_alltoall"),
}


def install_native(source: Any) -> None:
    """Thin C wrappers over torch.distributed and functional collectives; Python wrappers for
    the ops whose meaning Python describes (varlen ops, batch_isend_irecv)."""
    global ACTIVE
    m = source.m
    names = source_names(source)
    varlen = _install_common()
    for name in ops.TORCH_OPS:
        orig = getattr(dist, name, None)
        if orig is None:
            continue
        _set(dist, name, _native_wrapper(m, _unwrap(orig), names[name], m.KIND_PLAIN, name in ("isend", "irecv")))
    _set(dist, "batch_isend_irecv", _native_batch_wrapper(source, _unwrap(dist.batch_isend_irecv)))
    ensure_wait_patched(dist.Work, native=m)
    for module, names in ANNOTATE.items():
        when_imported(module, lambda mod, names=names: _annotate(m, mod, names))
    if varlen is not None:
        for name, extract in ops.VARLEN_OPS.items():
            orig = getattr(varlen, name, None)
            if orig is not None:
                _set(varlen, name, _native_rich_wrapper(source, name, _unwrap(orig), extract))
    ACTIVE = source


def _annotate(m: Any, module: Any, names: tuple[str, ...]) -> None:
    if ACTIVE is None and not _saved:
        return  # uninstalled meanwhile
    for name in names:
        orig = vars(module).get(name)
        if callable(orig) and not isinstance(orig, type):
            _set(module, name, _native_wrapper(m, _unwrap(orig), -1, m.KIND_ANNOTATE, False))


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


def source_names(source: Any) -> dict[str, int]:
    from commscope.record.nativeops import NAME_ID  # noqa: PLC0415

    return NAME_ID


def _native_wrapper(m: Any, orig: Any, name_id: int, kind: int, async_hint: bool) -> Any:
    w = m.Wrapper(orig, name_id, kind, async_hint)
    functools.update_wrapper(w, orig)
    return w


def _native_rich_wrapper(source: Any, name: str, orig: Any, extract: Any) -> Any:
    """A varlen op: described in Python (its own tensors), its collectives nested."""
    m = source.m
    name_id = source_names(source)[name]
    rich = m.KIND_RICH

    @functools.wraps(orig)
    def wrapper(*args, **kwargs):
        if ACTIVE is None:
            return orig(*args, **kwargs)
        try:
            a = extract(*args, **kwargs)
            described = source.describe(name, a)
        except Exception:
            described = None  # arguments the op will reject itself
        if described is None:
            return orig(*args, **kwargs)
        frag, gname, peer, direction = described
        op_id = m.enter(rich, name_id, frag, gname, peer, direction, bool(a[5]))
        try:
            ret = orig(*args, **kwargs)
        except BaseException as exc:
            _exit_raised(m, op_id, exc)
            raise
        m.exit(op_id, None)
        if a[5] and ret is not None and hasattr(ret, "wait"):
            try:
                m.track(ret, (op_id,))
                ensure_wait_patched(type(ret), native=m)
            except Exception:
                pass
        return ret

    setattr(wrapper, _ORIG_ATTR, orig)
    return wrapper


def _exit_raised(m: Any, op_id: int, exc: BaseException) -> None:
    """Record that a call raised; whatever happens here, the caller re-raises ``exc``."""
    try:
        from commscope.record.pyhot import fmt_exc  # noqa: PLC0415

        m.exit(op_id, fmt_exc(exc))
    except Exception:
        pass


def _native_batch_wrapper(source: Any, orig: Any) -> Any:
    m = source.m
    name_id = source_names(source)["batch_isend_irecv"]

    @functools.wraps(orig)
    def batch_isend_irecv(p2p_op_list):
        if ACTIVE is None:
            return orig(p2p_op_list)
        try:
            items = list(p2p_op_list)
            described = source.describe("batch_isend_irecv", (items[0].group, None, None, None, None, False, (), ()))
        except Exception:
            described = None
        if described is None:
            return orig(p2p_op_list)
        frag, gname, _, _ = described
        cid = m.enter(m.KIND_CONTAINER, name_id, frag, gname, -1, 0)
        try:
            works = orig(p2p_op_list)
        except BaseException as exc:
            _exit_raised(m, cid, exc)
            raise
        children = m.exit(cid, None)
        try:
            if works and children:
                if len(works) == len(children):
                    for w, child in zip(works, children, strict=True):
                        m.track(w, (child,))
                else:  # coalesced: one Work completes the whole batch
                    for w in works:
                        m.track(w, children)
        except Exception:
            pass
        return works

    setattr(batch_isend_irecv, _ORIG_ATTR, orig)
    return batch_isend_irecv


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

