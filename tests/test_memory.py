"""``memory.give_back``: what a console frees when it swaps its model out goes back to the
system, not only to its heap."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from commscope import memory

# Run apart: the heap of a test process is whatever the tests before made of it.
_FRAGMENTED = r"""
import gc, json, sys
import numpy as np, psutil
from commscope.memory import give_back

proc = psutil.Process()
gc.collect()
start = proc.memory_info().rss
kept, freed = [], []
for i in range(2048):  # 128 MiB in arrays of 64 KiB (below glibc's mmap threshold: the heap's)
    a = np.ones(8192, np.int64)
    (kept if i % 16 == 15 else freed).append(a)  # (one in 16 kept: the freed runs lie between)
held = proc.memory_info().rss
del freed, a
after_free = proc.memory_info().rss
trimmed = give_back()
after = proc.memory_info().rss
print(json.dumps({"start": start, "held": held, "after_free": after_free, "after": after,
                  "trimmed": trimmed, "kept": sum(k.nbytes for k in kept)}))
"""


@pytest.mark.skipif(memory._trim() is None, reason="glibc's malloc_trim: not in this system's C library")
def test_the_heap_a_model_freed_is_given_back():
    """128 MiB of arrays from the heap, 15 in 16 freed between those kept: freed, they stay
    resident (the heap's top is held, so free() trims nothing); ``give_back`` returns them."""
    out = subprocess.run([sys.executable, "-c", _FRAGMENTED], capture_output=True, text=True, check=True)
    got = json.loads(out.stdout)
    mib = 1 << 20
    assert got["trimmed"] is True
    assert got["held"] - got["start"] > 120 * mib  # (every array touched)
    assert got["after_free"] - got["start"] > 100 * mib  # freed, still resident: what the trim is for
    assert got["after"] - got["start"] < got["kept"] + 16 * mib  # what is kept, and little else
