"""commscope: a monitoring and debugging console for torch.distributed.

Public API (stable): ``instrument``, ``uninstrument``, ``instrumented``, ``varlen``,
``__version__``.  Importing commscope does not import torch; instrumenting does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["__version__", "instrument", "instrumented", "uninstrument", "varlen"]

if TYPE_CHECKING:
    from commscope.record.recorder import Recorder


def instrument(store: Any = None, *, hang_after: float | None = None, capture_stacks: bool = True,
               sample_interval: float = 1.0, flight_recorder: bool = True) -> Recorder:
    """Record every torch.distributed op of this process into ``store``.

    Idempotent: a second call returns the running Recorder.  ``store`` defaults to
    ``$COMMSCOPE_STORE``, then ``./commscope-trace``; ``hang_after`` to
    ``$COMMSCOPE_HANG_AFTER``, then 30 s.
    """
    from commscope.record.recorder import instrument as _instrument

    return _instrument(store, hang_after=hang_after, capture_stacks=capture_stacks,
                       sample_interval=sample_interval, flight_recorder=flight_recorder)


def uninstrument() -> None:
    """Restore torch.distributed exactly and stop the recorder (flushing what it holds)."""
    import sys

    if "commscope.record.recorder" in sys.modules:
        sys.modules["commscope.record.recorder"].uninstrument()


@contextlib.contextmanager
def instrumented(store: Any = None, **kwargs: Any) -> Iterator[Recorder]:
    """``with commscope.instrumented(store): ...`` records only inside the block."""
    rec = instrument(store, **kwargs)
    try:
        yield rec
    finally:
        uninstrument()


def __getattr__(name: str) -> Any:
    if name == "varlen":
        import importlib

        return importlib.import_module("commscope.varlen")
    raise AttributeError(f"module 'commscope' has no attribute {name!r}")
