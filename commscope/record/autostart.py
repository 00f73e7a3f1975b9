"""Zero-code instrumentation for ``commscope run``.

An import hook waits for ``torch.distributed`` to be imported, then replaces
``init_process_group`` with a version that calls ``commscope.instrument()`` (store,
hang_after from the environment ``commscope run`` set) just before the group exists,
so Flight Recorder and the job id are in place from the first collective.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import sys
from typing import Any

_ORIG_ATTR = "__commscope_orig__"


def _patch_init(dist: Any) -> None:
    orig = getattr(dist, "init_process_group", None)
    if orig is None or getattr(orig, "__commscope_bootstrap__", False):
        return

    @functools.wraps(orig)
    def init_process_group(*args, **kwargs):
        rec = None
        try:
            import os

            import commscope

            interval = float(os.environ.get("COMMSCOPE_SAMPLE_INTERVAL") or 1.0)
            rec = commscope.instrument(sample_interval=interval,
                                       flight_recorder=os.environ.get("COMMSCOPE_FLIGHT_RECORDER") != "0")
        except Exception as exc:
            print(f"commscope: could not instrument this process: {exc!r}", file=sys.stderr)
        ret = orig(*args, **kwargs)
        if rec is not None:
            try:
                rec.on_group_created()
            except Exception:
                pass
        return ret

    init_process_group.__commscope_bootstrap__ = True  # type: ignore[attr-defined]
    setattr(init_process_group, _ORIG_ATTR, orig)
    dist.init_process_group = init_process_group


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader):
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        # Hand the real loader back first: importlib.resources and friends look at it.
        module.__loader__ = self.inner
        if module.__spec__ is not None:
            module.__spec__.loader = self.inner
        self.inner.exec_module(module)
        try:
            _patch_init(module)
        except Exception as exc:
            print(f"commscope: bootstrap failed: {exc!r}", file=sys.stderr)

    def __getattr__(self, name):
        return getattr(self.inner, name)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds torch.distributed through the other finders and wraps its loader once."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch.distributed":
            return None
        sys.meta_path.remove(self)  # one shot; also avoids finding ourselves
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


def install_import_hook() -> None:
    dist = sys.modules.get("torch.distributed")
    if dist is not None:
        _patch_init(dist)
        return
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
