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
    extrapolated, 1.8-2.7 -> 2.5-3.4 cores on a directory), for 30-40 MiB less held at 1,024
    ranks.  A user's ``MALLOC_MMAP_THRESHOLD_`` (or ``GLIBC_TUNABLES``'s) is left as set.  Returns whether the threshold was set
    (False: not glibc, or the user's)."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or "glibc.malloc.mmap_threshold" in os.environ.get("GLIBC_TUNABLES", ""):
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


#: Where cgroups are mounted, and where this process says its own (``_cgroup_room``)
CGROUP_ROOT = "/sys/fs/cgroup"
PROC_CGROUP = "/proc/self/cgroup"


def available_bytes() -> int | None:
    """What this process may still take of memory: the system's available memory
    (``psutil``), or, where a cgroup it is in (a container, a batch job's slot, a systemd
    slice; its own or any above it) leaves less, that (``_cgroup_room``).  None where the
    system says neither."""
    import psutil

    known = _cgroup_room()
    try:
        known.append(psutil.virtual_memory().available)
    except (OSError, RuntimeError):
        pass
    return min(known) if known else None


def _cgroup_room() -> list[int]:
    """What each memory cgroup this process is in leaves, from its own up to the mount's
    root (``/proc/self/cgroup``: v2's ``0::PATH``, v1's ``memory`` line): its limit less its
    working set, what it uses less the file cache the kernel drops first (``inactive_file``,
    as kubelet counts it: a container writing traces sits near its limit in cache).  A
    group without a limit ("max", v1's ~2^63) or whose files are not there leaves nothing
    out."""
    try:
        with open(PROC_CGROUP) as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        number, controllers, path = parts
        if number == "0" and not controllers:
            base, names = CGROUP_ROOT, ("memory.max", "memory.current", "inactive_file")
        elif "memory" in controllers.split(","):
            base = os.path.join(CGROUP_ROOT, "memory")
            names = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
        else:
            continue
        here = os.path.normpath(os.path.join(base, path.lstrip("/")))
        while here.startswith(base):
            room = _room(here, *names)
            if room is not None:
                out.append(room)
            if here == base:
                break
            here = os.path.dirname(here)
    return out


def _room(group: str, limit_name: str, used_name: str, inactive_name: str) -> int | None:
    """What cgroup directory ``group`` leaves under its limit (None: no limit, or unreadable)."""
    try:
        with open(os.path.join(group, limit_name)) as f:
            limit = f.read().strip()
        with open(os.path.join(group, used_name)) as f:
            used = int(f.read().strip())
    except (OSError, ValueError):
        return None
    if not limit.isdigit() or int(limit) >= 1 << 60:  # ("max", or v1's ~2^63: none)
        return None
    inactive = 0
    try:
        with open(os.path.join(group, "memory.stat")) as f:
            for row in f:
                name, _, value = row.partition(" ")
                if name == inactive_name:
                    inactive = int(value)
                    break
    except (OSError, ValueError):
        pass
    return max(0, int(limit) - max(0, used - inactive))


def resident_bytes() -> int:
    """This process's resident bytes now (0 where the system does not say: not Linux), read
    without psutil (a read process says it once its imports are done, before it reads).  Not
    ``ru_maxrss``: an exec keeps the peak of the process it replaced."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0
