"""numba kernels, compiled on first use (or loaded from numba's cache): a module that holds
one imports no numba until a kernel is asked for, so a recording rank never pays for it.
Without numba there is none, and the caller takes its numpy (or JSON) way."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_missing = False


def jit(scope: dict[str, Any], names: tuple[str, ...], inline: tuple[str, ...] = ()) -> Callable[..., Any] | None:
    """Compile the functions ``names`` of a module's globals ``scope`` in place, helpers
    first (a kernel calls its helpers by their global names), and return the last; None
    without numba.  ``inline``: helpers merged into their callers (a call in a loop over
    lines passes its arrays each time: the scanner's template took a tenth of its time)."""
    global _missing
    if _missing:
        return None
    try:
        import numba
    except ImportError:
        _missing = True
        return None
    compile_one = numba.njit(cache=True, nogil=True, boundscheck=False)
    merged = numba.njit(cache=True, nogil=True, boundscheck=False, inline="always")
    for name in names:
        scope[name] = (merged if name in inline else compile_one)(scope[name])
    return scope[names[-1]]
