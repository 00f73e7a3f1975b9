"""Giving a long-lived reader's freed memory back to the system.

A console that follows a job past its budget swaps its model out for a new one at the tail
(``tui.feed.Feed``).  The model swapped out is garbage in cycles (its ranks and their table
refer to each other), which the cyclic collector frees only when it next runs: rarely in a
console, which builds under ``events.gc_paused``.  And what is freed of a model's arrays
stays in the process's heap: glibc raises its mmap threshold as arrays are freed (up to 32
MiB), so a model's growing arrays come from the heap, and its freed pages stay resident
until the heap is trimmed.  Measured at 1,024 ranks (``bench scale``): 2-4 models alive at
once before the collection (a peak RSS of ~650 MiB, with a 64 MiB model), and ~100 MiB of
freed heap left resident after it, given back by the trim.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import os
import sys


@functools.cache
def _trim() -> ctypes._CFuncPtr | None:
    """glibc's ``malloc_trim`` (None: another C library, another system)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
        trim = libc.malloc_trim
    except (OSError, AttributeError):  # (musl has none)
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def give_back() -> bool:
    """Collect what is garbage in cycles, then give the heap's free pages back to the system
    (glibc's ``malloc_trim``, where there is one).  ~65 ms at 1,024 ranks: once per
    model swapped out, not per batch.  Returns whether the heap was trimmed (False: no
    glibc here: the collection alone)."""
    gc.collect()
    trim = _trim()
    if trim is None:
        return False
    trim(0)
    return True


def resident_bytes() -> int:
    """This process's resident bytes now (0 where the system does not say: not Linux), read
    without psutil (a read process says it once its imports are done, before it reads).  Not
    ``ru_maxrss``: an exec keeps the peak of the process it replaced."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0
