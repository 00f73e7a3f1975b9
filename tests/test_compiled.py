"""The kernels compiled ahead of time (``commscope/compiled.py``): the install's build holds
every kernel, they decode what the kernels compiled on first use decode, an argument of
another type never reaches an ahead-of-time function, and an edited kernel is not taken
from an old build."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import pickle
import shutil
import subprocess
import sys
import textwrap
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from commscope import beatscan, blocks, blockscan, compiled, jsonscan
from commscope.analysis import runmax
from commscope.bench.synthstore import JobShape, write_store
from commscope.store.bulkread import Job
from commscope.store.directory import DirectoryReader, read_streams

ROOT = Path(__file__).resolve().parents[1]


def _run(env_dir: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, COMMSCOPE_KERNELS_DIR=str(env_dir))
    env.pop(compiled.ENV_AOT, None)
    return subprocess.run([sys.executable, "-m", "commscope.compiled", *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=900)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A build, as the install makes it, in a directory of its own."""
    where = tmp_path_factory.mktemp("kernels")
    got = _run(where, "build")
    assert got.returncode == 0, got.stdout + got.stderr
    return where


def _module(where: Path) -> ModuleType:
    saved = os.environ.get(compiled.ENV_DIR)
    os.environ[compiled.ENV_DIR] = str(where)
    try:
        module = compiled._import(compiled._built(compiled.build_dir()))
    finally:
        os.environ.pop(compiled.ENV_DIR) if saved is None else os.environ.__setitem__(compiled.ENV_DIR, saved)
    assert module is not None
    return module


def _both(where: Path, key: str) -> tuple[compiled.Ahead, Callable]:
    """The kernel ``key`` as the build holds it and as compiled here."""
    kernel = {k.key: k for k in compiled.load_all()}[key]
    fn = getattr(_module(where), compiled.export_name(kernel), None)
    assert fn is not None, f"{key} is not in the build"
    here = compiled._compile_here(kernel)
    assert here is not None
    return compiled.Ahead(fn, kernel), here


def test_the_build_holds_every_kernel_and_is_not_made_twice(built: Path) -> None:
    got = _run(built, "status")
    assert got.returncode == 0, got.stdout + got.stderr
    states = dict(line.split()[::-1] for line in got.stdout.splitlines() if not line.startswith("build:"))
    assert len(states) == len(compiled.LOADERS)
    assert set(states.values()) == {"ahead"}
    files = list(built.glob("*/commscope_kernels*"))
    assert len(files) == 1
    stamp = files[0].stat().st_mtime_ns
    again = _run(built, "build")
    assert again.returncode == 0, again.stderr
    assert files[0].stat().st_mtime_ns == stamp  # (up to date: not compiled again)


def test_every_kernel_has_a_loader() -> None:
    """A kernel the build does not know would be compiled on first use in every process."""
    calls = sum(p.read_text().count("compiled.jit(globals()") for p in (ROOT / "commscope").rglob("*.py"))
    assert calls == len(compiled.load_all()) == len(compiled.LOADERS)
    assert all(k.args for k in compiled.load_all())


#: The readers' kernels, and where each module keeps its own
_READERS = {"commscope.blockscan._scan": (blockscan, "_kernel"), "commscope.blockscan._find": (blockscan, "_find_kernel"),
            "commscope.blockscan._place": (blockscan, "_place_kernel"), "commscope.beatscan._scan": (beatscan, "_kernel"),
            "commscope.jsonscan._scan": (jsonscan, "_kernel"), "commscope.blocks._fixed_rows": (blocks, "_fixed"),
            "commscope.blocks._sig_rows": (blocks, "_sig")}


@pytest.fixture
def kernels_from(monkeypatch: pytest.MonkeyPatch, built: Path) -> Iterator[tuple[Callable[[bool], None], Counter]]:
    """Set the readers' kernels to the build's (True) or to those compiled here (False),
    each call counted by kernel."""
    pairs = {key: _both(built, key) for key in _READERS}
    calls: Counter = Counter()
    monkeypatch.delenv("COMMSCOPE_SCAN", raising=False)

    def counted(key: str, fn: Callable) -> Callable:
        def call(*args: object) -> object:
            calls[key] += 1
            return fn(*args)
        return call

    def use(ahead: bool) -> None:
        for key, (module, name) in _READERS.items():
            monkeypatch.setattr(module, name, counted(key, pairs[key][0 if ahead else 1]))

    yield use, calls


@pytest.mark.parametrize("json", [False, True], ids=["native", "json"])
def test_the_build_reads_what_the_kernels_compiled_here_read(
        tmp_path: Path, kernels_from: tuple[Callable[[bool], None], Counter], json: bool,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A whole read's worker (the scanner, its base64 decoded apart or in its one pass;
    fixed rows, signatures, heartbeats and samples; JSON op lines) gives the same bytes
    every way, every kernel called."""
    use, calls = kernels_from
    write_store(str(tmp_path), JobShape(6, 200, json=json))
    job_dir = str(tmp_path / "synthetic")
    streams = DirectoryReader(job_dir).streams()
    sent = []
    before = sum(compiled.fallbacks.values())
    one_pass, split = {"commscope.blockscan._scan"}, {"commscope.blockscan._find", "commscope.blockscan._place"}
    monkeypatch.setattr(blockscan, "SPLIT_FROM", 0)  # (every chunk, however short)
    for apart in (True, False):
        monkeypatch.setenv(blockscan.ENV_SPLIT, "1" if apart else "0")
        for ahead in (True, False, True):
            calls.clear()
            use(ahead)
            sent.append(pickle.dumps(read_streams(Job(job_dir, None, dict(streams))).sent()))
            want = {"commscope.jsonscan._scan"} if json else \
                set(_READERS) - {"commscope.jsonscan._scan"} - (one_pass if apart else split)
            assert {key for key, n in calls.items() if n} == want
    assert len(set(sent)) == 1
    assert sum(compiled.fallbacks.values()) == before  # (every call of the build's kernels with their own types)
    read = pickle.loads(sent[0])
    assert read.packed is not None and int(read.packed.start[-1]) > 1000  # (op records read)
    assert read.batch.beats is not None and len(read.batch.beats.rank) == 6  # (heartbeats and samples as rows)


def _kernel_types(env: dict[str, str]) -> tuple[list[str], str]:
    """In a process of its own with ``env``: the types of its kernels, whether it imported
    numba, and ``compiled.summary()``."""
    code = ("import importlib, sys; from commscope import compiled; "
            "got = [getattr(importlib.import_module(m), f)() for m, f in (x.split(':') for x in compiled.LOADERS)]; "
            "print(*sorted({type(k).__name__ for k in got}), 'numba' in sys.modules, '|', compiled.summary())")
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=600,
                         env=dict(os.environ, **env))
    assert got.returncode == 0, got.stderr
    kinds, summary = got.stdout.split("|")
    return kinds.split(), summary.strip()


def test_a_process_takes_the_build_without_numba(built: Path) -> None:
    """What the build is for: a process's kernels from it, numba never imported; and what
    ``bench`` says of them."""
    n = len(compiled.LOADERS)
    assert _kernel_types({"COMMSCOPE_KERNELS_DIR": str(built), "COMMSCOPE_AOT": "1"}) == (
        ["Ahead", "False"], f"all {n} compiled ahead of time (python -m commscope.compiled)")
    assert _kernel_types({"COMMSCOPE_KERNELS_DIR": str(built), "COMMSCOPE_AOT": "0"}) == (
        ["CPUDispatcher", "True"], "compiled on first use (numba; COMMSCOPE_AOT=0)")


def test_a_built_kernel_unpickles_what_it_returns_once(built: Path) -> None:
    """Each array a built function returns is boxed with ``numpy.ndarray``, which its
    wrapper unpickled at every call (~1.3 us an array) until the build kept what it
    unpickled (``compiled._cached_objects``): in a process of its own, the first call of
    ``blockscan._find`` (nine arrays) unpickles, the next ones nothing; every array they
    return is an array, and the reference counts they hand out are the caller's."""
    code = textwrap.dedent("""
        import pickle, sys
        import numpy as np
        loads, count = pickle.loads, [0]
        def counted(data, *args, **kwargs):
            count[0] += 1
            return loads(data, *args, **kwargs)
        pickle.loads = counted  # (before the build's first call looks it up)
        from commscope import blockscan
        assert blockscan._split()
        kernel = blockscan._find_kernel
        assert type(kernel).__name__ == "Ahead", type(kernel)
        d = np.frombuffer(b'{"type":"x"}\\n', np.uint8)
        starts, ranks = np.zeros(1, np.int64), np.array([1], np.int64)
        got = []
        for _ in range(4):
            before = count[0]
            out = kernel.fn(d, starts, ranks)
            assert len(out) == 9 and all(type(a) is np.ndarray for a in out)
            got.append(count[0] - before)
        line = out[0]
        del out
        assert sys.getrefcount(line) == 2 and line.tolist() == [0]  # (``line`` and getrefcount's)
        print(*got)
    """)
    env = dict(os.environ, COMMSCOPE_KERNELS_DIR=str(built), COMMSCOPE_AOT="1")
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=600,
                         env=env)
    assert got.returncode == 0, got.stderr
    first, *later = (int(n) for n in got.stdout.split())
    assert first >= 1 and later == [0, 0, 0]


def test_a_build_of_older_wrappers_is_made_again(built: Path, tmp_path: Path) -> None:
    """A build whose manifest does not say today's wrappers (``compiled.WRAPPERS``; older
    builds say none) is loaded while it is there, and the next build makes it again."""
    where = tmp_path / "older"
    shutil.copytree(built, where)
    (tag,) = where.iterdir()
    manifest = json.loads((tag / compiled.MANIFEST).read_text())
    assert manifest["wrappers"] == compiled.WRAPPERS
    del manifest["wrappers"]
    (tag / compiled.MANIFEST).write_text(json.dumps(manifest))
    assert _kernel_types({"COMMSCOPE_KERNELS_DIR": str(where), "COMMSCOPE_AOT": "1"})[0] == ["Ahead", "False"]
    again = _run(where, "build")
    assert again.returncode == 0, again.stderr
    remade = json.loads((tag / compiled.MANIFEST).read_text())
    assert remade["wrappers"] == compiled.WRAPPERS and remade["file"] != manifest["file"]


def test_a_damaged_build_is_never_loaded(built: Path, tmp_path: Path) -> None:
    """A module file cut short (loading a torn extension crashes the process: no ``except``
    catches it) or a manifest that does not say it: the kernels are compiled on first use,
    and ``status`` says they are not built (the next build makes them again)."""
    for damage in ("cut", "manifest", "nested", "elsewhere", "foreign"):
        where = tmp_path / damage
        shutil.copytree(built, where)
        (tag,) = where.iterdir()
        (so,) = tag.glob("commscope_kernels_*")
        manifest = json.loads((tag / compiled.MANIFEST).read_text())
        if damage == "cut":
            so.write_bytes(so.read_bytes()[:so.stat().st_size // 2])
        elif damage == "manifest":
            (tag / compiled.MANIFEST).write_text("{not json")
        elif damage == "nested":  # (past the recursion limit of the JSON parser)
            (tag / compiled.MANIFEST).write_text("[" * 100_000)
        elif damage == "elsewhere":  # (a file outside the build's directory, whatever it holds)
            (where / so.name).write_bytes(so.read_bytes())
            (tag / compiled.MANIFEST).write_text(json.dumps(dict(manifest, file=f"../{so.name}")))
        else:  # a file the manifest vouches for, that does not load as the module
            junk = b"not an extension"
            (tag / so.name).write_bytes(junk)
            (tag / compiled.MANIFEST).write_text(json.dumps(
                dict(manifest, size=len(junk), sha256=hashlib.sha256(junk).hexdigest())))
        assert _kernel_types({"COMMSCOPE_KERNELS_DIR": str(where), "COMMSCOPE_AOT": "1"}) == (
            ["CPUDispatcher", "True"], "compiled on first use (numba)")
        got = _run(where, "status")
        assert got.returncode == 1
        assert {line.split()[0] for line in got.stdout.splitlines() if not line.startswith("build:")} == {"missing"}


def test_the_running_max_is_the_same_either_way(built: Path) -> None:
    ahead, here = _both(built, "commscope.analysis.runmax._update")
    rng = np.random.default_rng(5)
    ranks, cap = 40, 64
    base = np.arange(ranks, dtype=np.int64) * cap
    n = rng.integers(0, cap + 1, ranks).astype(np.int64)
    begin = np.sort(rng.integers(0, 10_000, ranks * cap)).astype(np.int64)
    comp = np.where(rng.random(ranks * cap) < 0.3, 0, begin + rng.integers(-5, 3_000, ranks * cap)).astype(np.int64)
    valid = (n * rng.random(ranks)).astype(np.int64)
    since = np.where(rng.random(ranks) < 0.5, runmax.I64_MIN, rng.integers(0, 10_000, ranks)).astype(np.int64)
    start = rng.integers(0, 20_000, ranks * cap).astype(np.int64)
    pmax = [start.copy(), start.copy()]
    before = sum(compiled.fallbacks.values())
    ahead(begin, comp, pmax[0], base, n, valid, since)
    here(begin, comp, pmax[1], base, n, valid, since)
    assert sum(compiled.fallbacks.values()) == before
    assert not np.array_equal(pmax[0], start)
    assert np.array_equal(pmax[0], pmax[1])


def test_arguments_of_other_types_never_reach_the_built_function(built: Path) -> None:
    """The built function trusts its arguments (an array of another type would crash it):
    any other type goes to the kernel compiled here, counted."""
    ahead, here = _both(built, "commscope.blockscan._scan")
    data = (b'{"type":"heartbeat","rank":3,"ts":5}\n' + blocks.encode_block(blocks.pack_end(1, 10), 3, 10, 1)
            + b"\n")
    d = np.frombuffer(data, np.uint8)
    starts, ranks = np.zeros(1, np.int64), np.array([3], np.int64)
    want = here(d, starts, ranks)
    assert want[3].tolist() == [-1, 0]  # (the second line a block: a real scan)
    spread = np.zeros(2 * d.shape[0], np.uint8)
    spread[::2] = d
    key = "commscope.blockscan._scan"
    misaligned = np.frombuffer(b"\0" * 9, np.uint8)[1:].view(np.int64)  # (a zero, 8 bytes from an odd address)
    assert not misaligned.flags.aligned
    for args in ((spread[::2], starts, ranks), (d, starts.astype(np.int32), ranks), (d, starts, ranks.astype(np.uint8)),
                 (d, starts.reshape(1, 1), ranks), (d, misaligned, ranks)):
        before = compiled.fallbacks[key]
        got = ahead(*args)
        assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
        assert compiled.fallbacks[key] == before + 1
    before = compiled.fallbacks[key]
    got = ahead(d, starts, ranks)
    assert compiled.fallbacks[key] == before and all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
    # the same type, as an equal dtype that is another object (it carries metadata): the built function
    tagged = starts.view(np.dtype(np.int64, metadata={"tag": 1}))
    assert tagged.dtype is not starts.dtype and tagged.dtype == starts.dtype
    got = ahead(d, tagged, ranks)
    assert compiled.fallbacks[key] == before and all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
    # an array the kernel writes, read-only: never written behind its flag
    update, _ = _both(built, "commscope.analysis.runmax._update")
    one = np.array([0], np.int64)
    pmax = np.array([7], np.int64)
    pmax.flags.writeable = False
    before = compiled.fallbacks["commscope.analysis.runmax._update"]
    with pytest.raises(Exception):  # noqa: B017, PT011 (numba: a read-only array it would write)
        update(np.array([9], np.int64), one, pmax, one, np.array([1], np.int64), one, one)
    assert pmax.tolist() == [7]
    assert compiled.fallbacks["commscope.analysis.runmax._update"] == before + 1
    # integers that are not int64s
    scan, _ = _both(built, "commscope.beatscan._scan")
    before = compiled.fallbacks["commscope.beatscan._scan"]
    lo, hi = np.zeros(1, np.int64), np.array([d.shape[0]], np.int64)
    assert np.array_equal(scan(d, lo, hi, np.ones(1, np.int32))[0], scan(d, lo, hi, np.ones(1, np.int64))[0])
    assert compiled.fallbacks["commscope.beatscan._scan"] == before + 1


_KERNEL = '''
import numpy as np

_T = np.array([1, 2, 3], np.int64)


def _helper(x):
    return x + _T[0]


def _other(x):
    return x


def _kernel(a):
    s = 0
    for i in range(a.shape[0]):
        s += _helper(a[i])
    return s
'''


def _source_module(tmp_path: Path, name: str, source: str) -> ModuleType:
    """``source`` imported as the module ``name`` from a file of its own."""
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fingerprint(tmp_path: Path, name: str, source: str, args: tuple[str, ...] = ("const int64[::1]",)) -> str:
    module = _source_module(tmp_path, name, source)
    return compiled.fingerprint(compiled.Kernel(vars(module), ("_helper", "_kernel"), (), args))


def test_a_fingerprint_follows_what_numba_compiles(tmp_path: Path) -> None:
    """What numba freezes into a kernel changes its fingerprint (an old build is then not
    used for it); what it does not, does not."""
    base = _fingerprint(tmp_path, "k0", _KERNEL)
    assert base == _fingerprint(tmp_path, "k1", _KERNEL)
    same = {
        "lines moved": _KERNEL.replace("\n\ndef _kernel", "\n\n\n\n# a comment\ndef _kernel"),
        "another function": _KERNEL.replace("return x\n\n\ndef _kernel", "return x + 1\n\n\ndef _kernel"),
    }
    changed = {
        "the helper": _KERNEL.replace("x + _T[0]", "x - _T[0]"),
        "a constant it reads": _KERNEL.replace("[1, 2, 3]", "[1, 2, 4]"),
        "a constant's type": _KERNEL.replace("np.int64)", "np.int32)"),
        "the kernel": _KERNEL.replace("s += _helper", "s -= _helper"),
    }
    for n, (what, source) in enumerate(same.items()):
        assert _fingerprint(tmp_path, f"s{n}", source) == base, what
    for n, (what, source) in enumerate(changed.items()):
        assert _fingerprint(tmp_path, f"c{n}", source) != base, what
    assert _fingerprint(tmp_path, "a0", _KERNEL, ("const int32[::1]",)) != base


_READS_MORE = '''
import numpy as np
import {config} as cfg

_K = {k}


def _make(step):
    def add(x):
        return x + step
    return add


_helper = _make({step})


def _kernel(a):
    return _helper(a[0]) + cfg.LIMIT + _K
'''


def test_a_fingerprint_follows_closures_module_constants_and_types(tmp_path: Path) -> None:
    """Values numba freezes that are not in the module's own globals: a closure's, another
    module's constant; and a constant's type where its repr is the same."""
    (tmp_path / "fingerprint_cfg.py").write_text("LIMIT = 3\n")
    sys.path.insert(0, str(tmp_path))
    try:
        base = _fingerprint(tmp_path, "m0", _READS_MORE.format(config="fingerprint_cfg", k="1", step=1))
        assert _fingerprint(tmp_path, "m1", _READS_MORE.format(config="fingerprint_cfg", k="1", step=1)) == base
        assert _fingerprint(tmp_path, "m2", _READS_MORE.format(config="fingerprint_cfg", k="1", step=2)) != base
        assert _fingerprint(tmp_path, "m3", _READS_MORE.format(config="fingerprint_cfg", k="np.int32(1)",
                                                               step=1)) != base
        sys.modules["fingerprint_cfg"].LIMIT = 4  # (the same module, another value)
        assert _fingerprint(tmp_path, "m4", _READS_MORE.format(config="fingerprint_cfg", k="1", step=1)) != base
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("fingerprint_cfg", None)


def _lowered_probes() -> tuple[Callable[..., bool], Callable[..., None], Callable[..., int]]:
    """``same_bytes``, ``copy_bytes`` and ``find_byte`` inside kernels compiled here, as the
    scanners call them."""
    numba = pytest.importorskip("numba")
    compiled._lower_for_numba()
    same_bytes, copy_bytes, find_byte = compiled.same_bytes, compiled.copy_bytes, compiled.find_byte

    def same(a, x, b, y, n):  # type: ignore[no-untyped-def]  # noqa: ANN001, ANN202
        return same_bytes(a, x, b, y, n)

    def copy(a, x, b, y, n):  # type: ignore[no-untyped-def]  # noqa: ANN001, ANN202
        copy_bytes(a, x, b, y, n)

    def find(a, x, n, v):  # type: ignore[no-untyped-def]  # noqa: ANN001, ANN202
        return find_byte(a, x, n, v)

    return numba.njit(same), numba.njit(copy), numba.njit(find)


def test_find_byte_compiles_to_what_its_python_does() -> None:
    """Compiled (libc's memchr), ``find_byte`` finds what its Python finds: the first such
    byte of the range, as an index of the whole array, at every start and length (empty,
    at the array's end), none found, a byte past 127, from a read-only array."""
    _, _, find = _lowered_probes()
    a = np.frombuffer(b"ab\ncd\n\nefg\xff\n" * 3, np.uint8)
    spread = np.zeros(2 * a.shape[0], np.uint8)  # (strided: a loop)
    spread[::2] = a
    for x in range(a.shape[0] + 1):
        for n in range(a.shape[0] + 1 - x):
            for v in (10, 0xFF, ord("g"), 0):
                want = compiled.find_byte(a, x, n, v)
                assert find(a, x, n, v) == want == find(spread[::2], x, n, v), (x, n, v)
                k = bytes(a[x:x + n]).find(v)
                assert want == (x + n if k < 0 else x + k)


def test_same_bytes_and_copy_bytes_compile_to_what_their_python_does() -> None:
    """Compiled (libc's memcmp and memcpy), they compare and copy what their Python does: at
    every offset and length around a word, a byte changed at either end or inside, and from
    a read-only array (a kernel's ``const`` argument); given other types, they do not
    compile."""
    same, copy, _ = _lowered_probes()
    rng = np.random.default_rng(3)
    a = rng.integers(0, 256, 64, dtype=np.uint8)
    b = a.copy()
    b.flags.writeable = False
    for x in range(0, 10):
        for y in range(0, 10):
            for n in range(0, 25):
                want = compiled.same_bytes(a, x, b, y, n)
                assert same(a, x, b, y, n) == want == (a[x:x + n].tobytes() == b[y:y + n].tobytes())
    for n in (1, 7, 8, 9, 16, 17, 40):
        for at in {0, n // 2, n - 1}:
            c = a.copy()
            c[10 + at] ^= 0x80
            assert not same(a, 10, c, 10, n) and not compiled.same_bytes(a, 10, c, 10, n)
            assert same(a, 10, c, 10, at)  # (the bytes before the changed one)
    for x, y, n in ((0, 0, 0), (3, 11, 1), (5, 0, 8), (1, 2, 17), (0, 9, 40)):
        got, want = np.zeros(64, np.uint8), np.zeros(64, np.uint8)
        copy(got, x, b, y, n)
        compiled.copy_bytes(want, x, b, y, n)
        assert np.array_equal(got, want) and got[x:x + n].tobytes() == a[y:y + n].tobytes()
    spread = np.zeros(128, np.uint8)  # (strided: a kernel compiled here for other arguments loops)
    spread[::2] = a
    for x, y, n in ((0, 0, 0), (3, 11, 1), (5, 5, 8), (1, 2, 17)):
        assert same(spread[::2], x, b, y, n) == compiled.same_bytes(a, x, b, y, n)
        got = np.zeros(128, np.uint8)
        copy(got[::2], x, b, y, n)
        assert got[::2][x:x + n].tobytes() == a[y:y + n].tobytes()
    errors = pytest.importorskip("numba.core.errors")
    with pytest.raises(errors.TypingError):
        same(a.astype(np.int64), 0, b, 0, 1)
    with pytest.raises(errors.TypingError):
        copy(b, 0, a, 0, 1)  # (into a read-only array: a kernel declares what it writes)


def test_a_fingerprint_follows_what_numba_compiles_of_a_lowered_function(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel calling ``same_bytes`` changes its fingerprint where its lowering does (numba
    compiles the lowering, not the Python)."""
    source = _KERNEL.replace("import numpy as np", "import numpy as np\nfrom commscope.compiled import same_bytes")
    source = source.replace("return x + _T[0]", "return x + same_bytes(_B, 0, _B, 1, 1)").replace(
        "_T = np", "_B = np.zeros(2, np.uint8)\n_T = np")
    base = _fingerprint(tmp_path, "l0", source)
    assert _fingerprint(tmp_path, "l1", source) == base

    def other_code(context, builder, signature, args):  # type: ignore[no-untyped-def]  # noqa: ANN001, ANN202
        return None

    monkeypatch.setitem(compiled._LOWERED, compiled.same_bytes, other_code)
    assert _fingerprint(tmp_path, "l2", source) != base


_ALLOCATING = '''
import numpy as np


def _scratch(n):
    return np.zeros(n, np.int64)


def _first(a, i):
    return a[i]


def _kernel(a):
    s = _scratch(2)
    for i in range(a.shape[0]):
        s[0] += _first(a, i)
    return s[0]
'''


def test_helpers_borrow_their_kernel_s_arrays_but_those_that_allocate(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A helper is compiled without numba's reference counts unless it allocates (as its
    kernel says), and one that allocates does not compile without them; the scanners'
    helpers borrow, but for the hash table's, and their kernels count as numba does."""
    numba = pytest.importorskip("numba")
    monkeypatch.setenv(compiled.ENV_AOT, "0")
    blockscan._load_place()
    kernel = compiled.kernels["commscope.blockscan._place"]
    got = compiled._compile_here(kernel)
    assert got is not None and kernel.allocates == ("_prefix_table",)
    for name in kernel.names[:-1]:
        assert (kernel.scope[name].targetoptions.get("_nrt") is False) == (name != "_prefix_table"), name
    assert kernel.scope["_place"].targetoptions.get("_nrt") is not False
    a = np.arange(5, dtype=np.int64)
    for allocates, ok in (((), False), (("_scratch",), True)):
        module = _source_module(tmp_path, f"alloc{len(allocates)}", _ALLOCATING)
        fn = compiled.jit(vars(module), ("_scratch", "_first", "_kernel"), allocates=allocates)
        assert fn is not None
        if ok:
            assert fn(a) == 10
        else:
            with pytest.raises(numba.core.errors.NumbaError):
                fn(a)


_RETURNS_ARRAY = '''
import numpy as np


def _same(a):
    return a


def _kernel(a):
    return _same(a)[1]
'''


def test_a_helper_that_returns_an_array_is_found_unless_it_counts(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A borrowing helper that returns an array (numba allows one of its arguments) hands its
    counted caller a reference it never counted, freed too early: ``borrowed_arrays`` names
    it, not where the kernel says it counts; none of the readers' kernels has one.  (The
    wrong one is compiled, never run.)"""
    pytest.importorskip("numba")
    monkeypatch.setenv(compiled.ENV_AOT, "0")
    a = np.arange(5, dtype=np.int64)
    for allocates in ((), ("_same",)):
        module = _source_module(tmp_path, f"returns{len(allocates)}", _RETURNS_ARRAY)
        fn = compiled.jit(vars(module), ("_same", "_kernel"), allocates=allocates, args=("const int64[::1]",))
        assert fn is not None
        kernel = compiled.kernels[f"{module.__name__}._kernel"]
        assert compiled.borrowed_arrays(kernel) == ([] if allocates else ["_same"])
        if allocates:
            assert fn(a) == 1
    readers = [k for k in compiled.load_all() if k.key.startswith("commscope.")]
    assert len(readers) == len(compiled.LOADERS)
    for kernel in readers:  # (compiled here, or loaded from numba's cache: typed either way)
        assert compiled._compile_here(kernel) is not None
        assert compiled.borrowed_arrays(kernel) == [], kernel.key
    assert compiled.kernels["commscope.blockscan._place"].scope["_records"].nopython_signatures  # (looked at)


def test_a_kernel_argument_type_is_checked_when_written() -> None:
    assert compiled._parse("const uint8[::1]") == compiled._Arg(np.dtype(np.uint8), 1, False)
    assert compiled._parse("float64[:, ::1]") == compiled._Arg(np.dtype(np.float64), 2, True)
    assert compiled._parse("boolean[::1]").dtype == np.dtype(bool)
    assert compiled._parse("int64") == compiled._Arg(None, 0, False)
    for bad in ("uint8[:]", "const int64", "float64", "uint8[::1"):
        with pytest.raises(ValueError, match="kernel"):
            compiled._parse(bad)


_SET_KERNEL = '''
def _helper(x):
    return x


def _kernel(a):
    return 1 if a in {"alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"} else 0
'''


def test_a_fingerprint_is_the_same_in_every_process(tmp_path: Path) -> None:
    """A set constant's order follows string hashing, which differs between processes: the
    build's fingerprint and a reader's must still agree."""
    path = tmp_path / "set_kernel.py"
    path.write_text(_SET_KERNEL)
    code = ("import importlib.util, sys; from commscope import compiled; "
            "spec = importlib.util.spec_from_file_location('set_kernel', sys.argv[1]); "
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); "
            "print(compiled.fingerprint(compiled.Kernel(vars(m), ('_helper', '_kernel'), (), ('int64',))))")
    prints = {subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True,
                             env=dict(os.environ, PYTHONHASHSEED=str(seed))).stdout for seed in (1, 2, 3, 4)}
    assert len(prints) == 1, prints


def test_a_switch_is_read_from_the_environment_as_it_is_now_without_raising(monkeypatch: pytest.MonkeyPatch) -> None:
    """``says_no`` reads the environment each time (a process may switch it between reads)
    and, where the switch is not set, raises nothing on the way: ``os.environ.get``'s
    KeyError was half the cost of a look-up, and a reader asks six a stream."""
    name = "COMMSCOPE_TEST_SWITCH"
    monkeypatch.delenv(name, raising=False)
    raised: list[str] = []

    def trace(frame, event, arg):  # noqa: ANN001, ANN202 (sys.settrace's)
        if event == "exception":
            raised.append(arg[0].__name__)
        return trace

    sys.settrace(trace)
    try:
        unset = compiled.says_no(name)
    finally:
        sys.settrace(None)
    assert unset is False and raised == []
    for value, no in (("0", True), (" Off\n", True), ("FALSE", True), ("no", True), ("1", False), ("", False),
                      ("yes", False)):
        monkeypatch.setenv(name, value)
        assert compiled.says_no(name) is no, value
        assert compiled.says_no(name) is (os.environ[name].strip().lower() in ("0", "false", "no", "off"))
    monkeypatch.delenv(name)
    assert compiled.says_no(name) is False
