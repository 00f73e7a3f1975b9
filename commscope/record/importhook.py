"""A loader that runs callbacks right after a module's own code, for the import hooks of
``autostart`` (``commscope run``: wrap torch.distributed the moment it is imported) and
``patch.when_imported`` (wrap modules imported after ``instrument()``).  Torch-free: the
``commscope run`` bootstrap imports it before torch."""

from __future__ import annotations

import importlib.abc
from collections.abc import Callable
from typing import Any


class AfterImportLoader(importlib.abc.Loader):
    """Wraps a spec's loader: executes the module, then ``callback(module)`` for each
    callback; one that raises never breaks the import (nor the callbacks after it)."""

    def __init__(self, inner: Any, callbacks: list[Callable[[Any], Any]]):
        self.inner, self.callbacks = inner, callbacks

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        # Hand the real loader back first: importlib.resources and friends look at it.
        module.__loader__ = self.inner
        if module.__spec__ is not None:
            module.__spec__.loader = self.inner
        self.inner.exec_module(module)
        for cb in self.callbacks:
            try:
                cb(module)
            except Exception:
                pass  # recording must never break an import

    def __getattr__(self, name):
        return getattr(self.inner, name)
