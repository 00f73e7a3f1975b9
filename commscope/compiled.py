"""numba kernels: compiled ahead of time by the install, else on first use (or loaded from
numba's cache).  A module that holds one imports no numba until a kernel is asked for, so
a recording rank never pays for it.  Without numba there is none, and the caller takes its
numpy (or JSON) way.

Compiled on first use, a kernel costs its process numba's import and start (~0.3 s of CPU,
where the kernel itself decodes a stream in ~0.2 ms): every read worker, every CLI command
on a small trace, every test's process paid it.  So ``python -m commscope.compiled`` (run
by ``scripts/install.sh``) compiles every kernel ahead of time with numba's AOT compiler
(``numba.pycc``) into one extension module, ``commscope_kernels``, in
``$COMMSCOPE_KERNELS_DIR`` (default ``~/.cache/commscope/kernels``), in a directory per
Python version, machine, numpy version and x86-64 level (``tag``); a process then imports
it in ~2 ms and no numba.  The module's functions are named by a fingerprint of what numba
compiles (``fingerprint``: the kernel's and its helpers' code, the constants they read,
the argument types), so an edited kernel is simply not found there (it is compiled on
first use until the next build), never a stale one run.

An ahead-of-time function trusts its arguments (an array of another type crashes it), so
each is called through ``Ahead``, which checks them against the types it was compiled for
and, for any other, compiles the kernel on first use after all (counted: ``fallbacks``).
``COMMSCOPE_AOT=0`` never uses the module.  (A recording rank imports this module with the
block format's: what only a build or a kernel's first load needs is imported there.)
"""

from __future__ import annotations

import importlib
import os
import re
import sys
import types
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

ENV_AOT = "COMMSCOPE_AOT"
ENV_DIR = "COMMSCOPE_KERNELS_DIR"
MODULE = "commscope_kernels"
#: Every kernel's loader, "module:function": the kernels a build compiles (a loader calls
#: ``jit`` for its module's kernel; ``tests/test_compiled.py`` holds that each process's
#: kernels are among them)
LOADERS = ("commscope.blockscan:_load", "commscope.beatscan:_load", "commscope.jsonscan:_load",
           "commscope.blocks:_fixed_kernel", "commscope.blocks:_sig_kernel", "commscope.analysis.runmax:_load")

_missing = False


class Kernel(NamedTuple):
    """A kernel as ``jit`` was asked for it: its module's globals, its helpers then itself
    (``names``), the helpers merged into their callers and the types of its arguments."""

    scope: dict[str, Any]
    names: tuple[str, ...]
    inline: tuple[str, ...]
    args: tuple[str, ...]

    @property
    def key(self) -> str:
        return f"{self.scope['__name__']}.{self.names[-1]}"


#: Every kernel asked for in this process, by ``Kernel.key``
kernels: dict[str, Kernel] = {}
#: Calls of an ahead-of-time kernel with other types than its own (compiled on first use)
fallbacks: Counter[str] = Counter()


def jit(scope: dict[str, Any], names: tuple[str, ...], inline: tuple[str, ...] = (),
        args: tuple[str, ...] = ()) -> Callable[..., Any] | None:
    """The kernel ``names[-1]`` of a module's globals ``scope`` (its helpers before it: a
    kernel calls them by their global names): the ahead-of-time module's where it holds
    this kernel as it is (``Ahead``), else compiled here, in place, helpers first; None
    without numba.  ``inline``: helpers merged into their callers (a call in a loop over
    lines passes its arrays each time: the scanner's template took a tenth of its time).
    ``args``: its arguments' types in numba's notation, C-ordered arrays, ``const`` before
    one it never writes (``"const uint8[::1]"``, ``"int64"``)."""
    kernel = Kernel(scope, names, inline, args)
    kernels[kernel.key] = kernel
    if args and aot_enabled():
        module = _aot_module()
        fn = getattr(module, export_name(kernel), None) if module is not None else None
        if fn is not None:
            return Ahead(fn, kernel)
    return _compile_here(kernel)


def _compile_here(kernel: Kernel) -> Callable[..., Any] | None:
    global _missing
    if _missing:
        return None
    scope, names, inline = kernel.scope, kernel.names, kernel.inline
    if hasattr(scope[names[-1]], "py_func"):  # (compiled here already)
        return scope[names[-1]]
    try:
        import numba
    except ImportError:
        _missing = True
        return None
    for name, v in list(scope.items()):  # another kernel's helpers it calls: compiled first
        if isinstance(v, types.FunctionType) and v.__globals__ is not scope:
            other = next((k for k in kernels.values() if k.scope is v.__globals__ and v.__name__ in k.names), None)
            if other is not None:
                _compile_here(other)
                scope[name] = other.scope[v.__name__]
    compile_one = numba.njit(cache=True, nogil=True, boundscheck=False)
    merged = numba.njit(cache=True, nogil=True, boundscheck=False, inline="always")
    for name in names:
        scope[name] = (merged if name in inline else compile_one)(scope[name])
    return scope[names[-1]]


class _Arg(NamedTuple):
    dtype: np.dtype | None  # None: an integer
    ndim: int
    writes: bool


_ARG = re.compile(r"(const )?(\w+)(?:\[(.*)\])?")


def _parse(spec: str) -> _Arg:
    """One of ``jit``'s argument types: a C-ordered array (its dtype by numba's name) or an
    integer."""
    m = _ARG.fullmatch(spec.strip())
    if m is None:
        raise ValueError(f"not a kernel argument type: {spec!r}")
    const, name, dims = m.groups()
    if dims is None:
        if const or not name.startswith(("int", "uint")):
            raise ValueError(f"a kernel's scalar argument is an integer: {spec!r}")
        return _Arg(None, 0, False)
    if not dims.replace(" ", "").endswith("::1"):
        raise ValueError(f"a kernel's array argument is C-ordered ('::1' last): {spec!r}")
    return _Arg(np.dtype("bool" if name == "boolean" else name), dims.count(",") + 1, not const)


class Ahead:
    """A kernel compiled ahead of time, called with the types it was compiled for and, with
    any other, the kernel compiled here instead (the function itself does not check them)."""

    __slots__ = ("fn", "kernel", "arrays", "integers", "n")

    def __init__(self, fn: Callable[..., Any], kernel: Kernel) -> None:
        self.fn, self.kernel = fn, kernel
        parsed = [_parse(a) for a in kernel.args]
        self.arrays = [(i, a.dtype, a.ndim, a.writes) for i, a in enumerate(parsed) if a.dtype is not None]
        self.integers = [i for i, a in enumerate(parsed) if a.dtype is None]
        self.n = len(parsed)

    def __call__(self, *args: Any) -> Any:
        if len(args) != self.n:
            return self._elsewise(args)
        for i, dtype, ndim, writes in self.arrays:
            a = args[i]
            if type(a) is not np.ndarray or a.dtype != dtype or a.ndim != ndim:
                return self._elsewise(args)
            flags = a.flags
            if not (flags.c_contiguous and flags.aligned) or (writes and not flags.writeable):
                return self._elsewise(args)
        for i in self.integers:
            x = args[i]
            if not isinstance(x, (int, np.integer)) or isinstance(x, bool) or not -1 << 63 <= x < 1 << 63:
                return self._elsewise(args)
        return self.fn(*args)

    def _elsewise(self, args: tuple[Any, ...]) -> Any:
        fallbacks[self.kernel.key] += 1
        here = _compile_here(self.kernel)
        if here is None:
            raise TypeError(f"{self.kernel.key}: arguments of other types than its compiled ones, and no numba")
        return here(*args)


def aot_enabled() -> bool:
    return os.environ.get(ENV_AOT, "1").strip().lower() not in ("0", "false", "no", "off")


def level() -> str:
    """The x86-64 level the module is compiled for, as numpy finds this CPU ('' elsewhere:
    LLVM's generic target).  A level, not the CPU's name: a cache shared by machines of one
    level (a home directory on a cluster) serves them all, and a machine of another level
    looks in another directory instead of running instructions it lacks."""
    if _machine() not in ("x86_64", "amd64"):
        return ""
    core = getattr(np, "_core", None) or np.core  # (numpy 1 has no _core)
    features = core._multiarray_umath.__cpu_features__
    return next((f"x86-64-v{v}" for v in (4, 3, 2) if features.get(f"X86_V{v}")), "")


def _machine() -> str:
    import platform

    return platform.machine().lower()


def tag() -> str:
    """The build's directory name: what the module depends on besides the kernels' code."""
    numpy_version = ".".join(np.__version__.split(".")[:2])
    return (f"py{sys.version_info[0]}{sys.version_info[1]}-{_machine()}-numpy{numpy_version}"
            f"-{level() or 'generic'}")


def build_dir() -> Path:
    base = os.environ.get(ENV_DIR) or os.path.join(os.path.expanduser("~"), ".cache", "commscope", "kernels")
    return Path(base) / tag()


_module: types.ModuleType | None = None
_module_error: str | None = None


def _aot_module() -> types.ModuleType | None:
    """The built module, imported once (None where there is none, or it does not load)."""
    global _module, _module_error
    if _module is None and _module_error is None:
        try:
            _module = _import_from(build_dir())
            if _module is None:
                _module_error = "not built (python -m commscope.compiled builds it)"
        except Exception as exc:  # (a torn or foreign file: compiled on first use instead)
            _module_error = f"{type(exc).__name__}: {exc}"
    return _module


def _import_from(directory: Path) -> types.ModuleType | None:
    import importlib.machinery
    import importlib.util

    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = directory / (MODULE + suffix)
        if path.is_file():
            spec = importlib.util.spec_from_file_location(MODULE, path)
            if spec is None or spec.loader is None:
                return None
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module
    return None


def fingerprint(kernel: Kernel) -> str:
    """A digest of what numba compiles for ``kernel``: the code of the kernel and of every
    function it calls through a global name (its helpers, another module's), recursively,
    each with the constants and the values of the globals it reads (numba freezes them:
    arrays by their bytes), and its arguments' types.  Line numbers are not in it (moving a
    kernel recompiles nothing)."""
    import hashlib

    h = hashlib.sha256(repr((kernel.names, kernel.inline, kernel.args)).encode())
    seen: set[tuple[int, str]] = set()

    def code(c: types.CodeType, scope: dict[str, Any]) -> None:
        h.update(c.co_code)
        h.update(repr(c.co_names).encode())
        for k in c.co_consts:
            if isinstance(k, types.CodeType):
                code(k, scope)
            else:
                h.update(repr(k).encode())
        for name in c.co_names:
            if name in scope and (id(scope), name) not in seen:
                seen.add((id(scope), name))
                value(name, scope[name])

    def value(name: str, v: object) -> None:
        h.update(b"\0" + name.encode() + b"=")
        f = getattr(v, "py_func", v)
        if isinstance(f, types.FunctionType):
            h.update(repr(f.__defaults__).encode())
            code(f.__code__, f.__globals__)
        elif isinstance(v, np.ndarray):
            h.update(f"{v.dtype.str}{v.shape}".encode())
            h.update(np.ascontiguousarray(v).tobytes())
        elif isinstance(v, types.ModuleType):
            h.update(v.__name__.encode())
        else:
            h.update(repr(v).encode())

    value(kernel.names[-1], kernel.scope[kernel.names[-1]])
    return h.hexdigest()[:16]


def export_name(kernel: Kernel) -> str:
    """The kernel's function in the built module: its module, name and fingerprint."""
    return f"{kernel.key.replace('.', '_')}_{fingerprint(kernel)}"


def load_all() -> list[Kernel]:
    """Every kernel of ``LOADERS``, asked for (as the process's readers would ask)."""
    for loader in LOADERS:
        module, name = loader.split(":")
        getattr(importlib.import_module(module), name)()
    return [kernels[key] for key in sorted(kernels)]


def status() -> dict[str, str]:
    """Per kernel of ``LOADERS``: 'ahead' (the built module holds it as it is), 'stale'
    (the module holds another version of it) or 'missing'."""
    module = _aot_module() if aot_enabled() else None
    names = set(dir(module)) if module is not None else set()
    out = {}
    for kernel in load_all():
        prefix = kernel.key.replace(".", "_") + "_"
        out[kernel.key] = ("ahead" if export_name(kernel) in names
                           else "stale" if any(n.startswith(prefix) for n in names) else "missing")
    return out


def build(directory: Path | None = None, verbose: bool = False) -> Path:
    """Compile every kernel ahead of time into ``directory`` (default ``build_dir()``),
    unless the module there holds them all as they are; returns the module's path.  Runs
    in a process of its own (``python -m commscope.compiled``): it compiles each kernel
    here first (numba's JIT: the type it returns), which the process then keeps."""
    import shutil
    import tempfile
    import warnings

    os.environ[ENV_AOT] = "0"  # (every kernel compiled here: the build reads their types)
    directory = directory or build_dir()
    found = load_all()
    old = _import_from(directory)
    if old is not None and all(hasattr(old, export_name(k)) for k in found):
        return Path(str(old.__file__))
    print(f"commscope: compiling the readers' kernels ahead of time (once, ~30 s) in {directory}", file=sys.stderr)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (numba.pycc is pending deprecation: a warning, not news)
        import numba
        from numba.pycc import CC

        cc = CC(MODULE)
        cc.target_cpu = level()
        cc.verbose = verbose
        for kernel in found:
            dispatcher = kernel.scope[kernel.names[-1]]
            argtypes = tuple(_numba_type(numba, a) for a in kernel.args)
            dispatcher.compile(argtypes)
            cc.export(export_name(kernel), dispatcher.overloads[argtypes].signature)(dispatcher.py_func)
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".build-", dir=directory.parent) as scratch:
            cc.output_dir = scratch
            cc.compile()
            built = next(Path(scratch).glob(MODULE + "*"))
            target = directory / built.name
            # (a process that imported the old file keeps it: the new one takes its name whole)
            os.replace(built, target)
    for stale in directory.glob(".build-*"):
        shutil.rmtree(stale, ignore_errors=True)
    return target


def _numba_type(numba: Any, spec: str) -> Any:
    """``spec`` (``jit``'s notation) as numba's type: a writable array either way (an
    ahead-of-time function does not read the flag; ``Ahead`` checks the ones it writes)."""
    return eval(spec.strip().removeprefix("const "), {}, vars(numba.types))  # noqa: S307 (the modules' own strings)


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m commscope.compiled",
                                description="Compile commscope's numba kernels ahead of time (once per Python, "
                                            "numpy and machine, ~30 s), or show their state.")
    p.add_argument("action", nargs="?", choices=("build", "status"), default="build",
                   help="build (default): build unless built; status: say which kernels are built")
    p.add_argument("-v", "--verbose", action="store_true", help="show the compiler's output")
    args = p.parse_args(argv)
    if args.action == "status":
        states = status()
        for key, state in states.items():
            print(f"{state:8} {key}")
        where = build_dir()
        print(f"module: {where}" + ("" if _module is not None else f" ({_module_error or 'disabled'})"))
        return 0 if all(s == "ahead" for s in states.values()) else 1
    try:
        path = build(verbose=args.verbose)
    except Exception as exc:  # (no numba, no compiler, no setuptools ...)
        print(f"kernels not compiled ahead of time: {type(exc).__name__}: {exc}".rstrip(), file=sys.stderr)
        return 1
    print(f"kernels ready: {path}")
    return 0


if __name__ == "__main__":  # (as commscope.compiled, whose registry the kernels' modules fill; not as __main__)
    from commscope import compiled as _self

    raise SystemExit(_self.main())
