"""Zero-code instrumentation for ``commscope run``.

An import hook waits for ``torch.distributed`` to be imported, then installs
commscope's wrappers at once (so even ``from torch.distributed import all_reduce`` in
user modules binds the wrapper) with store and hang_after from the environment
``commscope run`` set.  The recorder thread starts only when the process creates its
process group, so processes that never do get no thread and write nothing.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from typing import Any

from commscope.record.importhook import AfterImportLoader


def _prepare(dist: Any) -> None:
    """Wrap torch.distributed now; the recorder thread starts with the process group."""
    import os

    from commscope.record.recorder import prepare

    interval = float(os.environ.get("COMMSCOPE_SAMPLE_INTERVAL") or 1.0)
    rec = prepare(sample_interval=interval,
                  flight_recorder=os.environ.get("COMMSCOPE_FLIGHT_RECORDER") != "0")
    if dist.is_initialized():
        rec.start()


def _prepare_or_say(dist: Any) -> None:
    try:
        _prepare(dist)
    except Exception as exc:
        print(f"commscope: bootstrap failed: {exc!r}", file=sys.stderr)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds torch.distributed through the other finders and wraps its loader once."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch.distributed":
            return None
        sys.meta_path.remove(self)  # one shot; also avoids finding ourselves
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader = AfterImportLoader(spec.loader, [_prepare_or_say])
        return spec


def install_import_hook() -> None:
    dist = sys.modules.get("torch.distributed")
    if dist is not None:
        _prepare(dist)
        return
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
