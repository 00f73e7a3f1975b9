"""``memory``: what a console frees goes back to the system, not only to its heap: a model
swapped out (``give_back``), and the arrays of every poll its read processes make
(``map_large_apart``)."""

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


# Arrays of 1 MiB after one of 4 MiB was freed (glibc's threshold rose past them), one in two
# kept: freed, do they stay resident?  ``how``: "none" (glibc's own threshold), "call"
# (``map_large_apart``), "env" (the user's MALLOC_MMAP_THRESHOLD_, then the call).
_POLLS = r"""
import gc, json, sys
import numpy as np, psutil
from commscope import memory

how = sys.argv[1]
said = memory.map_large_apart() if how in ("call", "env") else None
proc = psutil.Process()
big = np.ones(4 << 17, np.int64)  # (4 MiB: a mapping; freed, glibc's threshold rises past 4 MiB)
del big
gc.collect()
start = proc.memory_info().rss
kept, freed = [], []
for i in range(128):  # 128 MiB in arrays of 1 MiB, as a poll's columns
    a = np.ones(1 << 17, np.int64)
    (kept if i % 2 else freed).append(a)
held = proc.memory_info().rss
del freed, a
after = proc.memory_info().rss
print(json.dumps({"start": start, "held": held, "after": after, "said": said,
                  "kept": sum(k.nbytes for k in kept)}))
"""


def _polls(how: str, env: dict[str, str] | None = None) -> dict:
    import os

    run_env = {k: v for k, v in os.environ.items() if k not in ("MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES")}
    run_env.update(env or {})
    out = subprocess.run([sys.executable, "-c", _POLLS, how], capture_output=True, text=True, check=True,
                         env=run_env)
    return json.loads(out.stdout)


@pytest.mark.skipif(memory._glibc("mallopt") is None, reason="glibc's mallopt: not in this system's C library")
def test_arrays_a_read_process_frees_go_back_to_the_system_as_they_are_freed():
    """With glibc's own threshold, risen past them, 1 MiB arrays come from the heap and the
    half freed between those kept stay resident; with the threshold kept at 128 KiB they go
    back as they are freed, no trim needed."""
    mib = 1 << 20
    before = _polls("none")
    assert before["held"] - before["start"] > 120 * mib  # (every array touched)
    assert before["after"] - before["start"] > 100 * mib  # freed, still resident: what it is for
    got = _polls("call")
    assert got["held"] - got["start"] > 120 * mib
    assert got["after"] - got["start"] < got["kept"] + 8 * mib  # what is kept, and little else
    assert got["said"] is True


@pytest.mark.skipif(memory._glibc("mallopt") is None, reason="glibc's mallopt: not in this system's C library")
@pytest.mark.parametrize("name, value", [("MALLOC_MMAP_THRESHOLD_", str(64 << 20)),
                                         ("GLIBC_TUNABLES", f"glibc.malloc.mmap_threshold={64 << 20}")])
def test_a_users_mmap_threshold_is_left_as_set(monkeypatch, name, value):
    """A threshold the user set (here 64 MiB: every array from the heap), the old way or as a
    glibc tunable (helper-157: the tunable was overridden), is theirs: not changed."""
    mib = 1 << 20
    got = _polls("env", {name: value})
    assert got["said"] is False
    assert got["after"] - got["start"] > 100 * mib  # (the heap's, as the user set)
    monkeypatch.setenv(name, value)
    assert memory.map_large_apart() is False


def test_a_read_process_keeps_the_threshold_before_it_reads(monkeypatch):
    """A console's read process (``readahead.main``) sets the threshold first thing, before
    it has anything to read."""
    import io
    import types

    from commscope.store import readahead

    calls = []
    monkeypatch.setattr(readahead, "map_large_apart", lambda: calls.append(1) or True)
    monkeypatch.setattr(readahead.signal, "signal", lambda *a: None)
    monkeypatch.setattr(readahead.sys, "stdin", types.SimpleNamespace(buffer=io.BytesIO(b"")))
    monkeypatch.setattr(readahead.sys, "stdout", types.SimpleNamespace(buffer=io.BytesIO()))
    assert readahead.main() == 0  # (stdin empty: nothing to read)
    assert calls == [1]
