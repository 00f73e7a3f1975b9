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

Between swaps the same holds for what a read process frees every poll (its replies and
decoded columns): a console's read processes keep the threshold where glibc starts it
(``map_large_apart``), so such arrays are mappings of their own, given back as they are freed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import os
import sys

#: glibc's ``mallopt`` parameter: the size from which an allocation is a mapping of its own
M_MMAP_THRESHOLD = -3
#: ... kept where glibc starts it (its dynamic threshold rises to 32 MiB as mappings are freed)
MAPPED_FROM = 128 * 1024


@functools.cache
def _glibc(name: str) -> ctypes._CFuncPtr | None:
    """One of glibc's malloc functions (None: another C library, another system)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c") or None), name)
    except (OSError, AttributeError):  # (musl has neither)
        return None


def _trim() -> ctypes._CFuncPtr | None:
    """glibc's ``malloc_trim`` (None: none here)."""
    trim = _glibc("malloc_trim")
    if trim is not None:
        trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def map_large_apart() -> bool:
    """Keep glibc's mmap threshold at 128 KiB, so that every allocation of that size or more
    is a mapping of its own, given back to the system when it is freed.  glibc raises the
    threshold to the size of each such mapping freed (up to 32 MiB): after a few polls a
    long-lived process's poll-sized arrays came from its heap, where what they left when
    freed stayed resident, a hole among live objects, until a trim.  A console's read
    processes call it (``store.readahead``): measured at 1,024 ranks (``bench scale``,
    alternated, two runs each), a read process 114-121 -> 92-94 MiB on Redis, 77-88 -> 68-69
    MiB on a directory.  Not the console's own process: there each step's temporaries, mapped
    and zeroed afresh, cost the one thread that ingests (the console's CPU at the target,
    extrapolated, 1.8-2.4 -> 2.3-3.4 cores), for 30-40 MiB less held at 1,024 ranks.  A
    user's ``MALLOC_MMAP_THRESHOLD_`` is left as set.  Returns whether the threshold was set
    (False: not glibc, or the user's)."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    mallopt = _glibc("mallopt")
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt(M_MMAP_THRESHOLD, MAPPED_FROM) == 1


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


#: A cgroup's memory limit and use: v2's, then v1's (the first readable pair counts)
CGROUP_FILES = (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"))


def available_bytes() -> int | None:
    """What this process may still take of memory: the system's available memory
    (``psutil``), or, where a cgroup (a container, a batch job's slot) limits it to less, that
    limit less what the cgroup uses (v2's ``memory.max``, v1's ``memory.limit_in_bytes``).
    None where the system says neither."""
    import psutil

    known = []
    try:
        known.append(psutil.virtual_memory().available)
    except (OSError, RuntimeError):
        pass
    for limit, used in CGROUP_FILES:
        try:
            with open(limit) as f, open(used) as g:
                cap, now = f.read().strip(), g.read().strip()
        except OSError:
            continue
        if cap.isdigit() and now.isdigit() and int(cap) < 1 << 60:  # ("max", or v1's ~2^63: none)
            known.append(max(0, int(cap) - int(now)))
        break
    return min(known) if known else None


def resident_bytes() -> int:
    """This process's resident bytes now (0 where the system does not say: not Linux), read
    without psutil (a read process says it once its imports are done, before it reads).  Not
    ``ru_maxrss``: an exec keeps the peak of the process it replaced."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0
