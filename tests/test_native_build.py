"""Building the native recorder never stalls or blocks training: a rank never builds (it
records in Python until a launcher has built the module), and a build stopped half-way leaves
nothing behind that a later build would wait on (real builds, in child processes)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil

from commscope.launch import free_port
from commscope.record import native

RANK = textwrap.dedent("""
    import json, sys
    import torch, torch.distributed as dist
    import commscope
    rec = commscope.instrument(sys.argv[1], flight_recorder=False)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[2], rank=0, world_size=1)
    x = torch.ones(4)
    for _ in range(5):
        dist.all_reduce(x)
    source = type(rec.ops).__name__
    commscope.uninstrument()
    dist.destroy_process_group()
    print(json.dumps({"source": source, "value": x.tolist()}))
""")

BUILD = textwrap.dedent("""
    import json, signal, sys
    # Ctrl-C as a foreground process gets it: a suite started in the background (a CI
    # runner, `cmd &`) hands its children SIGINT ignored, and the build would run on
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from commscope.record import native
    native.BUILD_TIMEOUT_S = float(sys.argv[1])
    module = native.load(build=True)
    print(json.dumps({"module": module is not None, "error": native.error()}))
""")


def _env(cache: Path) -> dict[str, str]:
    return {**os.environ, "COMMSCOPE_NATIVE_DIR": str(cache), "COMMSCOPE_NATIVE": "1"}


def _compilers(root: Path) -> list[str]:
    """Processes still working in ``root`` (ninja runs each compiler in the build directory)."""
    out = []
    for proc in psutil.process_iter(["cwd", "cmdline"]):
        if (proc.info["cwd"] or "").startswith(str(root)):
            out.append(" ".join(proc.info["cmdline"] or [])[:80])
    return out


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_a_rank_without_a_built_module_records_in_python_and_builds_nothing(tmp_path):
    cache = tmp_path / "cache"
    proc = subprocess.run([sys.executable, "-c", RANK, str(tmp_path / "trace"), str(free_port())], env=_env(cache),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"source": "PythonOps", "value": [1.0] * 4}
    assert "native recorder unavailable (not built yet" in proc.stderr
    assert "building the native recorder" not in proc.stderr
    assert not cache.exists() or _files(cache) == []


def _build(cache: Path, timeout: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", BUILD, str(timeout)], env=_env(cache), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_a_build_stopped_half_way_leaves_nothing_to_wait_on(tmp_path):
    cache = tmp_path / "cache"
    # Ctrl-C while the compiler runs (torch has taken its lock and ninja started the compiler)
    builder = _build(cache, 600)
    deadline = time.monotonic() + 120
    while not _compilers(cache):
        assert builder.poll() is None, builder.communicate()
        assert time.monotonic() < deadline, "the build never started"
        time.sleep(0.05)
    builder.send_signal(signal.SIGINT)
    out, err = builder.communicate(timeout=60)
    assert builder.returncode != 0 and "KeyboardInterrupt" in err, (out, err[-3000:])
    # nothing left: no lock, no scratch directory, no half-written module, no compiler running
    assert [p for p in _files(cache) if "/" in p or p.startswith(".build-")] == [], _files(cache)
    assert _compilers(cache) == []
    # the next build is not held up by the first: it runs until its own time limit
    builder = _build(cache, 2)
    out, err = builder.communicate(timeout=120)
    assert builder.returncode == 0, err
    assert json.loads(out.strip().splitlines()[-1]) == {
        "module": False, "error": "RuntimeError: the build took longer than 2 s and was stopped"}
    assert [p for p in _files(cache) if "/" in p or p.startswith(".build-")] == [], _files(cache)
    assert _compilers(cache) == []


# ---------------------------------------------------------------- the build's key
def _copy_sources(tmp_path: Path) -> Path:
    copy = tmp_path / "native"
    copy.mkdir()
    for path in native.source_files():
        shutil.copyfile(path, copy / path.name)
    return copy


def test_every_source_file_is_part_of_the_build_key():
    """The build directory is keyed by every source of the extension: the translation unit
    and each part it includes."""
    names = [p.name for p in native.source_files()]
    assert names == sorted(names) and native.SOURCE.name in names
    included = re.findall(r'^#include "([^"]+)"', native.SOURCE.read_text(), re.MULTILINE)
    assert included and set(included) <= set(names)
    assert set(names) - set(included) == {native.SOURCE.name}  # and nothing else
    assert native.build_dir().name.endswith("-" + native.source_digest()[:12])


def test_changing_adding_or_renaming_any_source_file_changes_the_key(tmp_path):
    """On a copy of the sources: one byte changed in any one file, a line moved from one file
    to the next, a file added or renamed: each gives a digest never seen before."""
    copy = _copy_sources(tmp_path)
    base = native.source_digest(copy)
    assert base == native.source_digest()  # names and contents, not where they lie
    files = native.source_files(copy)
    assert [p.name for p in files] == [p.name for p in native.source_files()]
    seen = {base}

    def fresh(why: str) -> None:
        digest = native.source_digest(copy)
        assert digest not in seen, why
        seen.add(digest)

    for path in files:
        data = path.read_bytes()
        path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # same size, one bit off
        fresh(f"{path.name} changed")
        path.write_bytes(data)
        assert native.source_digest(copy) == base
    first, second = files[0], files[1]
    a, b = first.read_bytes(), second.read_bytes()
    head, _, last = a.rstrip(b"\n").rpartition(b"\n")
    first.write_bytes(head + b"\n")  # the same bytes in all, split differently
    second.write_bytes(last + b"\n" + b)
    fresh(f"a line moved from {first.name} to {second.name}")
    first.write_bytes(a)
    second.write_bytes(b)
    assert native.source_digest(copy) == base
    (copy / "extra.h").write_text("// a new part\n")
    fresh("a file added")
    (copy / "extra.h").unlink()
    first.rename(copy / ("renamed_" + first.name))
    fresh("a file renamed")
