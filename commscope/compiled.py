"""numba kernels: compiled ahead of time by the install, else on first use (or loaded from
numba's cache).  A module that holds one imports no numba until a kernel is asked for, so
a recording rank never pays for it.  Without numba there is none, and the caller takes its
numpy (or JSON) way.

Compiled on first use, a kernel costs its process numba's import and start (~0.3 s of CPU,
where the kernel itself decodes a stream in ~0.2 ms): every read worker, every CLI command
on a small trace, every test's process paid it.  So ``python -m commscope.compiled`` (run
by ``scripts/install.sh``) compiles every kernel ahead of time with numba's AOT compiler
(``numba.pycc``) into one extension module in ``$COMMSCOPE_KERNELS_DIR`` (default
``~/.cache/commscope/kernels``), in a directory per Python version, machine, numpy version
and x86-64 level (``tag``), beside a manifest that vouches for it (``MANIFEST``); a process
then imports it in a few ms and no numba.  The module's functions are named by a
fingerprint of what numba compiles (``fingerprint``), so an edited kernel is simply not
found there (it is compiled on first use until the next build), never a stale one run.

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
LOADERS = ("commscope.blockscan:_load", "commscope.blockscan:_load_find", "commscope.blockscan:_load_place",
           "commscope.beatscan:_load", "commscope.jsonscan:_load",
           "commscope.blocks:_fixed_kernel", "commscope.blocks:_sig_kernel", "commscope.blocks:_plan_kernel",
           "commscope.analysis.runmax:_load",
           "commscope.analysis.runsearch:_load", "commscope.analysis.busy:_load")

_missing = False


class Kernel(NamedTuple):
    """A kernel as ``jit`` was asked for it: its module's globals, its helpers then itself
    (``names``), the helpers merged into their callers, the types of its arguments and the
    helpers that allocate arrays."""

    scope: dict[str, Any]
    names: tuple[str, ...]
    inline: tuple[str, ...]
    args: tuple[str, ...]
    allocates: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.scope['__name__']}.{self.names[-1]}"

    @property
    def prefix(self) -> str:
        """Its functions' names in a build, before their fingerprint."""
        return f"{self.key.replace('.', '_')}_"


#: Every kernel asked for in this process, by ``Kernel.key``
kernels: dict[str, Kernel] = {}
#: Calls of an ahead-of-time kernel with other types than its own (compiled on first use)
fallbacks: Counter[str] = Counter()


def jit(scope: dict[str, Any], names: tuple[str, ...], inline: tuple[str, ...] = (),
        args: tuple[str, ...] = (), allocates: tuple[str, ...] = ()) -> Callable[..., Any] | None:
    """The kernel ``names[-1]`` of a module's globals ``scope`` (its helpers before it: a
    kernel calls them by their global names): the ahead-of-time module's where it holds
    this kernel as it is (``Ahead``), else compiled here, in place, helpers first; None
    without numba.  ``inline``: helpers merged into their callers by numba, where they are
    compiled as their callers are.  ``args``: its arguments' types in numba's notation,
    C-ordered arrays, ``const`` before one it never writes (``"const uint8[::1]"``,
    ``"int64"``).  Every helper but those that allocate arrays (``allocates``) is compiled
    without numba's reference counts (``_nrt=False``): it only borrows the arrays its kernel
    holds, and counting them, two atomic operations for each array a call is passed or a
    view it makes, on every line of a chunk, was ~40% of the block scanner's time.  numba
    refuses to compile a helper that allocates without them; one that returns an array (a
    reference its caller would count and it did not) is looked for by the tests
    (``borrowed_arrays``)."""
    kernel = Kernel(scope, names, inline, args, allocates)
    kernels[kernel.key] = kernel
    if args and aot_enabled():
        module = _aot_module()
        try:
            fn = getattr(module, export_name(kernel), None) if module is not None else None
        except Exception:  # (a fingerprint that cannot be taken: compiled here, as without a build)
            fn = None
        if fn is not None:
            return Ahead(fn, kernel)
    return _compile_here(kernel)


def same_bytes(a: np.ndarray, x: int, b: np.ndarray, y: int, n: int) -> bool:
    """Whether ``a[x:x + n]`` is ``b[y:y + n]`` (C-ordered uint8 arrays, each range within
    its array): in a kernel, one call of libc's ``memcmp`` (``_LOWERED``).  A kernel's loop
    of 8-byte words read through ``view``s cost ~0.15 us a call in the views alone: a
    stream's blocks restate their table prefixes, and comparing them was a third of
    ``blockscan._place``."""
    return bool(np.array_equal(a[x:x + n], b[y:y + n]))


def copy_bytes(a: np.ndarray, x: int, b: np.ndarray, y: int, n: int) -> None:
    """``a[x:x + n] = b[y:y + n]`` (C-ordered uint8 arrays, ranges within them, not
    overlapping): in a kernel, one ``memcpy`` (``_LOWERED``), where a slice's copy goes
    through a temporary and a loop of words through views."""
    a[x:x + n] = b[y:y + n]


def find_byte(a: np.ndarray, x: int, n: int, v: int) -> int:
    """Where the first byte ``v`` (0 to 255) of ``a[x:x + n]`` is, as an index of ``a``
    (``x + n``: none; a C-ordered uint8 array, the range within it): in a kernel, one call of libc's
    ``memchr`` (``_LOWERED``), where a loop looked at a byte, or an 8-byte word of a
    ``numpy.equal`` made first, at a time (a scan's newlines: ~100 ns a line)."""
    k = a[x:x + n].tobytes().find(v)
    return x + n if k < 0 else x + k


def _byte_pointer(context: Any, builder: Any, signature: Any, args: Any, at: int, offset: Any) -> Any:
    """In a lowering: the address of byte ``offset`` of the array argument ``at``."""
    from llvmlite import ir

    array = context.make_array(signature.args[at])(context, builder, args[at])
    return builder.gep(builder.bitcast(array.data, ir.IntType(8).as_pointer()), [offset])


def _memcmp_code(context: Any, builder: Any, signature: Any, args: Any) -> Any:
    """``same_bytes`` as numba lowers it: ``memcmp(a.data + x, b.data + y, n) == 0``."""
    from llvmlite import ir
    from numba.core import cgutils

    _, x, _, y, n = args  # (x, y, n: int64, as typed)
    first, second = (_byte_pointer(context, builder, signature, args, 0, x),
                     _byte_pointer(context, builder, signature, args, 2, y))
    memcmp = cgutils.get_or_insert_function(builder.module, ir.FunctionType(
        ir.IntType(32), [first.type, second.type, ir.IntType(64)]), "memcmp")
    return builder.icmp_signed("==", builder.call(memcmp, [first, second, n]), ir.Constant(ir.IntType(32), 0))


def _memcpy_code(context: Any, builder: Any, signature: Any, args: Any) -> Any:
    """``copy_bytes`` as numba lowers it: ``memcpy(a.data + x, b.data + y, n)``."""
    from numba.core import cgutils

    _, x, _, y, n = args
    cgutils.raw_memcpy(builder, _byte_pointer(context, builder, signature, args, 0, x),
                       _byte_pointer(context, builder, signature, args, 2, y), n, 1)
    return context.get_dummy_value()


def _memchr_code(context: Any, builder: Any, signature: Any, args: Any) -> Any:
    """``find_byte`` as numba lowers it: ``memchr(a.data + x, v, n)``, as an index of ``a``
    (``x + n`` where it finds none)."""
    from llvmlite import ir
    from numba.core import cgutils

    _, x, n, v = args
    start = _byte_pointer(context, builder, signature, args, 0, ir.Constant(ir.IntType(64), 0))
    memchr = cgutils.get_or_insert_function(builder.module, ir.FunctionType(
        start.type, [start.type, ir.IntType(32), ir.IntType(64)]), "memchr")
    found = builder.call(memchr, [builder.gep(start, [x]), builder.trunc(v, ir.IntType(32)), n])
    index = builder.sub(builder.ptrtoint(found, ir.IntType(64)), builder.ptrtoint(start, ir.IntType(64)))
    return builder.select(cgutils.is_null(builder, found), builder.add(x, n), index)


#: The functions a kernel may call that numba compiles as the code given here, not as their
#: Python (which a process without numba, or a test, runs): their lowering is part of a
#: kernel's fingerprint (``fingerprint``)
_LOWERED: dict[Callable[..., Any], Callable[..., Any]] = {same_bytes: _memcmp_code, copy_bytes: _memcpy_code,
                                                          find_byte: _memchr_code}
_lowered_for_numba = False


def _lower_for_numba() -> None:
    """Teach numba ``_LOWERED`` (once a process, before it compiles a kernel): each an
    intrinsic of its code for C-ordered byte arrays and integers (what the built kernels are
    given), a loop for strided byte arrays (a kernel compiled here for other arguments,
    ``Ahead``'s fallback); nothing else compiles."""
    global _lowered_for_numba
    if _lowered_for_numba:
        return
    from numba import types as ntypes
    from numba.extending import intrinsic, overload

    def bytes_array(t: Any) -> bool:
        return isinstance(t, ntypes.Array) and t.dtype == ntypes.uint8 and t.ndim == 1 and t.layout == "C"

    def strided(t: Any) -> bool:  # (a kernel compiled here for other arguments: a loop, as Python reads)
        return isinstance(t, ntypes.Array) and t.dtype == ntypes.uint8 and t.ndim == 1

    def same_loop(a, x, b, y, n):  # type: ignore[no-untyped-def]  # noqa: ANN001, ANN202
        for k in range(n):  # noqa: SIM110 (compiled: a loop, not a generator)
            if a[x + k] != b[y + k]:
                return False
        return True

    def copy_loop(a, x, b, y, n):  # type: ignore[no-untyped-def]  # noqa: ANN001, ANN202
        for k in range(n):
            a[x + k] = b[y + k]

    def find_loop(a, x, n, v):  # type: ignore[no-untyped-def]  # noqa: ANN001, ANN202
        for k in range(x, x + n):
            if a[k] == v:
                return k
        return x + n

    loops = {same_bytes: same_loop, copy_bytes: copy_loop, find_byte: find_loop}

    def lowered(fn: Callable[..., Any], code: Callable[..., Any]) -> Callable[..., Any]:
        returns = ntypes.boolean if fn is same_bytes else ntypes.none

        def typer(typingctx: Any, a: Any, x: Any, b: Any, y: Any, n: Any) -> Any:
            if (bytes_array(a) and bytes_array(b) and all(isinstance(t, ntypes.Integer) for t in (x, y, n))
                    and (fn is same_bytes or a.mutable)):  # (a copy into a read-only array does not compile)
                return returns(a, ntypes.int64, b, ntypes.int64, ntypes.int64), code
            return None

        typer.__name__ = f"_{fn.__name__}_lowered"
        call = intrinsic(typer)

        def impl(a, x, b, y, n):  # type: ignore[no-untyped-def]  # noqa: ANN001, ANN202 (``fn``'s arguments, unannotated as numba compares them)
            if bytes_array(a) and bytes_array(b):
                return lambda a, x, b, y, n: call(a, x, b, y, n)
            if strided(a) and strided(b) and (fn is same_bytes or a.mutable):
                return loops[fn]
            return None

        return impl

    def lowered_find(code: Callable[..., Any]) -> Callable[..., Any]:
        def typer(typingctx: Any, a: Any, x: Any, n: Any, v: Any) -> Any:
            if bytes_array(a) and all(isinstance(t, ntypes.Integer) for t in (x, n, v)):
                return ntypes.int64(a, ntypes.int64, ntypes.int64, ntypes.int64), code
            return None

        typer.__name__ = "_find_byte_lowered"
        call = intrinsic(typer)

        def impl(a, x, n, v):  # type: ignore[no-untyped-def]  # noqa: ANN001, ANN202 (as ``impl`` above)
            if bytes_array(a):
                return lambda a, x, n, v: call(a, x, n, v)
            if strided(a):
                return find_loop
            return None

        return impl

    for fn, code in _LOWERED.items():
        overload(fn)(lowered_find(code) if fn is find_byte else lowered(fn, code))
    _lowered_for_numba = True


def _owner(fn: types.FunctionType) -> Kernel | None:
    """The kernel asked for in this process whose helper (or self) ``fn`` is."""
    return next((k for k in kernels.values() if k.scope is fn.__globals__ and fn.__name__ in k.names), None)


def borrowed_arrays(kernel: Kernel) -> list[str]:
    """The helpers of ``kernel`` (compiled here) that are compiled without reference counts
    and return an array for the types the kernel calls them with: each would hand its counted
    caller a reference it never counted, freed under it.  The kernel is compiled again first,
    apart and past numba's cache (a kernel loaded from the cache typed none of its helpers):
    a second or so a kernel, for the tests (``tests/test_compiled.py``), not for every build."""
    import numba
    from numba import types as ntypes

    dispatcher = kernel.scope[kernel.names[-1]]
    numba.njit(**{**OPTIONS, "cache": False})(dispatcher.py_func).compile(
        tuple(_numba_type(numba, a) for a in kernel.args))

    def holds_array(t: Any) -> bool:
        return isinstance(t, ntypes.Array) or any(holds_array(x) for x in getattr(t, "types", ()))

    return [name for name in kernel.names[:-1] if name not in kernel.allocates
            and any(holds_array(sig.return_type) for sig in getattr(kernel.scope[name], "nopython_signatures", ()))]


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
    _lower_for_numba()
    for name, v in list(scope.items()):  # another kernel's helpers it calls: compiled first
        if isinstance(v, types.FunctionType) and v.__globals__ is not scope:
            other = _owner(v)
            if other is not None:
                _compile_here(other)
                scope[name] = other.scope[v.__name__]
    for name in names:
        if not hasattr(scope[name], "py_func"):  # (a helper another kernel of the module compiled already)
            counted = name == names[-1] or name in kernel.allocates
            scope[name] = numba.njit(**OPTIONS, **({} if counted else BORROWS),
                                     inline="always" if name in inline else "never")(scope[name])
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


#: numpy's flags (``ndarray.flags.num``) an array passed to a built function must have:
#: C-ordered and aligned, and writeable where the kernel writes it (one test of their bits,
#: where reading the flags' attributes one by one cost ~0.15 us an array)
_NEEDS = 0x1 | 0x100  # NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED
_NEEDS_WRITTEN = _NEEDS | 0x400  # | NPY_ARRAY_WRITEABLE


class Ahead:
    """A kernel compiled ahead of time, called with the types it was compiled for and, with
    any other, the kernel compiled here instead (the function itself does not check them)."""

    __slots__ = ("fn", "kernel", "arrays", "integers", "n")

    def __init__(self, fn: Callable[..., Any], kernel: Kernel) -> None:
        self.fn, self.kernel = fn, kernel
        parsed = [_parse(a) for a in kernel.args]
        self.arrays = [(i, np.dtype(a.dtype), a.ndim, _NEEDS_WRITTEN if a.writes else _NEEDS)
                       for i, a in enumerate(parsed) if a.dtype is not None]
        self.integers = [i for i, a in enumerate(parsed) if a.dtype is None]
        self.n = len(parsed)

    def __call__(self, *args: Any) -> Any:
        if len(args) != self.n:
            return self._elsewise(args)
        for i, dtype, ndim, needs in self.arrays:  # (~0.25 us an array: 19 for ``blocks._sig_rows``)
            a = args[i]
            if (type(a) is not np.ndarray or a.ndim != ndim or (a.dtype is not dtype and a.dtype != dtype)
                    or a.flags.num & needs != needs):
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


#: ``os.environ``'s own table where it is one of bytes (POSIX CPython), else None
_ENVIRON_BYTES: dict[bytes, bytes] | None = (
    os.environ._data if os.name == "posix" and isinstance(getattr(os.environ, "_data", None), dict) else None)
#: Each switch's name as that table's key
_ENV_KEYS: dict[str, bytes] = {}
_NO = ("0", "false", "no", "off")


def says_no(name: str) -> bool:
    """Whether the environment variable ``name`` switches something off ("0", "false",
    "no", "off"; unset: on).  Read where ``os.environ`` keeps it: its ``get`` of a name
    that is not set raises and catches a KeyError, ~0.8 us of the ~1.5 a look-up, and a
    reader asks six a stream (whether the scanner is on, at each of its steps).  Read each
    time, not once: a process (a test) may switch it between reads."""
    data = _ENVIRON_BYTES
    if data is None or data is not getattr(os.environ, "_data", None):
        return os.environ.get(name, "1").strip().lower() in _NO
    key = _ENV_KEYS.get(name)
    if key is None:
        key = _ENV_KEYS[name] = os.fsencode(name)
    raw = data.get(key)
    return raw is not None and os.fsdecode(raw).strip().lower() in _NO


def aot_enabled() -> bool:
    return not says_no(ENV_AOT)


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


#: The build's manifest in ``build_dir()``, written after its module: the module's name and
#: file, the file's size and digest, its functions, the numba that built it
MANIFEST = "kernels.json"


#: How a build makes its functions' Python wrappers (``_cached_objects``), in its manifest: a
#: build made otherwise is made again by the next (its functions run as they are meanwhile)
WRAPPERS = 2


class Built(NamedTuple):
    """A build as its manifest says it, its file checked."""

    module: str
    path: Path
    exports: frozenset[str]
    numba: str
    wrappers: int = 1


def _built(directory: Path) -> Built | None:
    """The build in ``directory`` where its manifest names a file of exactly the size and
    digest it says: a file cut short or changed since is never loaded (loading a torn
    extension crashes the process, and no ``except`` catches that)."""
    import hashlib
    import json

    try:
        manifest = json.loads((directory / MANIFEST).read_bytes())
        name, exports = manifest["file"], manifest["exports"]
        if (not isinstance(name, str) or Path(name).name != name or not name.startswith(MODULE)
                or not isinstance(exports, list) or not all(isinstance(x, str) for x in exports)):
            return None  # (a file of this directory, by its name; the functions by theirs)
        path = directory / name
        if _refused(directory, path):
            return None
        data = path.read_bytes()
        if len(data) != manifest["size"] or hashlib.sha256(data).hexdigest() != manifest["sha256"]:
            return None
        wrappers = manifest.get("wrappers", 1)
        return Built(str(manifest["module"]), path, frozenset(exports), str(manifest["numba"]),
                     wrappers if type(wrappers) is int else 1)
    except Exception:  # (unreadable, not JSON, nested past the recursion limit ...: no build)
        return None


_warned: set[str] = set()


def _refused(directory: Path, path: Path | None = None) -> bool:
    """A build that another user could have changed is never loaded (its module runs as
    whoever loads it): said once a process, on stderr."""
    from commscope.private import why_unsafe

    paths = [directory.parent, directory, directory / MANIFEST] + ([path] if path is not None else [])
    why = why_unsafe(*paths)
    if why is not None and why not in _warned:
        _warned.add(why)
        print(f"commscope: not loading the kernels compiled ahead of time: {why}; they are compiled on first "
              f"use instead (remove {directory} and run python -m commscope.compiled to build them again)",
              file=sys.stderr)
    return why is not None


_module: types.ModuleType | None = None
_module_error: str | None = None


def _aot_module() -> types.ModuleType | None:
    """The built module, imported once (None where there is none, or it does not load)."""
    global _module, _module_error
    if _module is None and _module_error is None:
        try:
            _module = _import(_built(build_dir()))
            if _module is None:
                _module_error = "not built (python -m commscope.compiled builds it)"
        except Exception as exc:  # (a foreign file: compiled on first use instead)
            _module_error = f"{type(exc).__name__}: {exc}"
    return _module


def _import(built: Built | None) -> types.ModuleType | None:
    import importlib.util

    if built is None:
        return None
    spec = importlib.util.spec_from_file_location(built.module, built.path)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: What every kernel is compiled with, here and ahead of time (part of its fingerprint)
OPTIONS = {"cache": True, "nogil": True, "boundscheck": False}
#: What a helper that allocates no array is compiled with besides (``jit``)
BORROWS = {"_nrt": False}


def fingerprint(kernel: Kernel) -> str:
    """A digest of what numba compiles for ``kernel``: the code of the kernel and of every
    function it calls through a global name (its helpers, another module's), recursively,
    each with its constants, its closure's values and the values of the globals and module
    attributes it reads (numba freezes them: arrays by their bytes), its arguments' types
    and the options it is compiled with.  Line numbers are not in it (moving a kernel
    recompiles nothing); a value is hashed by its type and repr where that is plain data,
    by name where it is a function, class or module (a repr with an address would never
    match again)."""
    import hashlib

    h = hashlib.sha256(repr((kernel.names, kernel.inline, kernel.args, sorted(OPTIONS.items()), kernel.allocates,
                             sorted(BORROWS.items()))).encode())
    seen: set[tuple[int, str]] = set()

    def code(c: types.CodeType, scope: dict[str, Any]) -> None:
        h.update(c.co_code)
        h.update(repr(c.co_names).encode())
        for k in c.co_consts:
            if isinstance(k, types.CodeType):
                code(k, scope)
            else:
                value("", k)  # (``x in {"a", "b"}`` compiles to a frozenset constant)
        for name in c.co_names:
            if name in scope and (id(scope), name) not in seen:
                seen.add((id(scope), name))
                v = scope[name]
                value(name, v)
                if isinstance(v, types.ModuleType):  # (``module.CONSTANT``: the attributes it may read)
                    for attr in c.co_names:
                        if attr != name and hasattr(v, attr) and (id(v), attr) not in seen:
                            seen.add((id(v), attr))
                            value(f"{name}.{attr}", getattr(v, attr))

    def value(name: str, v: object) -> None:
        h.update(b"\0" + name.encode() + b"=")
        f = getattr(v, "py_func", v)
        if isinstance(f, types.FunctionType) and f.__globals__ is not kernel.scope:  # (another kernel's helper:
            owner = _owner(f)                                                         # as that kernel compiles it)
            if owner is not None:
                h.update(repr((f.__name__ in owner.inline, f.__name__ in owner.allocates)).encode())
        if isinstance(f, types.FunctionType) and f in _LOWERED:  # (what numba compiles for it)
            code(_LOWERED[f].__code__, {})  # (their code: the globals they read are no kernel's)
            code(_lower_for_numba.__code__, {})
        if isinstance(f, types.FunctionType):
            h.update(repr(f.__defaults__).encode())
            for cell in f.__closure__ or ():
                value("(closure)", cell.cell_contents)
            code(f.__code__, f.__globals__)
        elif isinstance(v, np.ndarray):
            h.update(f"{v.dtype.str}{v.shape}".encode())
            h.update(np.ascontiguousarray(v).tobytes())
        elif isinstance(v, (type, types.ModuleType, types.BuiltinFunctionType)) or callable(v):
            h.update(f"{getattr(v, '__module__', '')}.{getattr(v, '__qualname__', getattr(v, '__name__', ''))}".encode())
        elif isinstance(v, (frozenset, set)):  # (its order follows string hashing: in an order of their own)
            h.update(f"{type(v).__name__}:{sorted(map(repr, v))!r}".encode())
        elif isinstance(v, (int, float, complex, str, bytes, bool, tuple, np.generic)) or v is None:
            h.update(f"{type(v).__name__}:{v!r}".encode())
        else:  # (nothing numba could freeze: its type says enough)
            h.update(type(v).__qualname__.encode())

    value(kernel.names[-1], kernel.scope[kernel.names[-1]])
    return h.hexdigest()[:16]


def export_name(kernel: Kernel) -> str:
    """The kernel's function in the built module: its module, name and fingerprint."""
    return f"{kernel.prefix}{fingerprint(kernel)}"


def _loaded() -> list[Callable[..., Any] | None]:
    """What each loader of ``LOADERS`` gives, asked as the process's readers ask."""
    return [getattr(importlib.import_module(m), f)() for m, f in (x.split(":") for x in LOADERS)]


def load_all() -> list[Kernel]:
    """Every kernel of ``LOADERS``, asked for (as the process's readers would ask)."""
    _loaded()
    return [kernels[key] for key in sorted(kernels)]


def status() -> dict[str, str]:
    """Per kernel of ``LOADERS``: 'ahead' (the build holds it as it is), 'stale' (the build
    holds another version of it) or 'missing' (no build, or one that does not load),
    whatever ``COMMSCOPE_AOT`` says."""
    try:
        module = _aot_module() if aot_enabled() else _import(_built(build_dir()))
    except Exception:  # (a file that does not load here)
        module = None
    names = frozenset(dir(module)) if module is not None else frozenset()
    out = {}
    for kernel in load_all():
        out[kernel.key] = ("ahead" if export_name(kernel) in names
                           else "stale" if any(n.startswith(kernel.prefix) for n in names) else "missing")
    return out


def summary() -> str:
    """Where this process's kernels come from, in a line (``bench`` figures say it): what
    its loaders gave, not what the build says it holds (a build that does not load gives
    none)."""
    got = _loaded()
    n, ahead, numpy = len(got), sum(isinstance(k, Ahead) for k in got), sum(k is None for k in got)
    if ahead == n:
        return f"all {n} compiled ahead of time (python -m commscope.compiled)"
    if numpy == n:
        return "none: numpy's way (no numba)"
    rest = "on first use (numba" + (f"; {ENV_AOT}=0)" if not aot_enabled() else ")")
    if numpy:
        rest += f", {numpy} none (numpy's way)"
    return f"{ahead} of {n} compiled ahead of time, the rest {rest}" if ahead else f"compiled {rest}"


#: A scratch directory a build left this long ago (killed half-way) is removed by the next build
STALE_S = 3600.0
#: Module files kept in a build's directory, the manifest's and the newest older ones
KEPT_BUILDS = 3


def build(directory: Path | None = None, verbose: bool = False) -> Path:
    """Compile every kernel ahead of time into ``directory`` (default ``build_dir()``),
    unless its build holds them all as they are, by this numba; returns the module's path.
    Runs in a process of its own (``python -m commscope.compiled``): it compiles each
    kernel here first (numba's JIT: the type it returns, and that it writes no argument it
    declares ``const``), which the process then keeps.  Each build is a module of its own
    name (a digest of its functions), written whole before the manifest names it."""
    import fcntl

    import numba  # noqa: F401 (first: without it, the build says so)

    os.environ[ENV_AOT] = "0"  # (every kernel compiled here: the build reads their types)
    from commscope.private import make_dirs, why_unsafe

    directory = directory or build_dir()
    found = load_all()
    names = sorted(export_name(k) for k in found)
    # (the owner's alone whatever the umask: another user who could put a module here would
    # run code in every process that loads it)
    make_dirs(directory)
    why = why_unsafe(directory.parent, directory, directory / ".lock")
    if why is not None:
        raise RuntimeError(f"refusing to build in {directory}: {why}")
    lock = os.open(directory / ".lock", os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(lock, "w"):
        os.fchmod(lock, 0o600)
        fcntl.flock(lock, fcntl.LOCK_EX)  # (two installs at once: one builds, the other finds it built)
        return _build_locked(directory, found, names, verbose)


def _build_locked(directory: Path, found: list[Kernel], names: list[str], verbose: bool) -> Path:
    import hashlib
    import json
    import shutil
    import tempfile
    import time
    import warnings

    import numba

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (numba.pycc is pending deprecation: a warning, not news)
        import numba.pycc.compiler
        from numba.core.pythonapi import PythonAPI
        from numba.pycc import CC

        old = _built(directory)
        if (old is not None and old.exports.issuperset(names) and old.numba == numba.__version__
                and old.wrappers == WRAPPERS):
            return old.path
        print(f"commscope: compiling the readers' kernels ahead of time (once, ~30 s) in {directory}",
              file=sys.stderr)
        # (a name of its own for each build, its functions' digest and when: a rebuild never
        # takes the name of a file a process may have loaded)
        module = f"{MODULE}_{hashlib.sha256(' '.join(names).encode()).hexdigest()[:12]}_{time.time_ns() // 1000}"
        cc = CC(module)
        cc.target_cpu = level()
        cc.verbose = verbose
        for kernel in found:
            dispatcher = kernel.scope[kernel.names[-1]]
            argtypes = tuple(_numba_type(numba, a) for a in kernel.args)
            dispatcher.compile(argtypes)
            cc.export(export_name(kernel), dispatcher.overloads[argtypes].signature)(dispatcher.py_func)
        now = time.time()
        for stale in directory.parent.glob(".build-*"):  # (scratch of a build killed half-way)
            if now - stale.stat().st_mtime > STALE_S:
                shutil.rmtree(stale, ignore_errors=True)
        flags, unserialize = numba.pycc.compiler.Flags, PythonAPI.unserialize
        numba.pycc.compiler.Flags = _released_flags()  # (as ``nogil`` does for the JIT: a console's thread runs meanwhile)
        PythonAPI.unserialize = _cached_objects(unserialize)
        try:
            with tempfile.TemporaryDirectory(prefix=".build-", dir=directory.parent) as scratch:
                cc.output_dir = scratch
                cc.compile()
                built = next(Path(scratch).glob(module + "*"))
                os.chmod(built, 0o700)  # (the compiler's mode is the umask's)
                data = built.read_bytes()
                target = directory / built.name
                os.replace(built, target)
        finally:
            numba.pycc.compiler.Flags, PythonAPI.unserialize = flags, unserialize
    manifest = {"module": module, "file": target.name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                "exports": names, "numba": numba.__version__, "wrappers": WRAPPERS}
    fd, scratch_manifest = tempfile.mkstemp(prefix=f".{MANIFEST}.", dir=directory)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(manifest, indent=1))
    os.replace(scratch_manifest, directory / MANIFEST)
    # older builds' files: the newest few kept (a process may still run one: removed, a file is
    # kept for a process that has it open on a local disk, not on every network one)
    older = sorted((p for p in directory.glob(MODULE + "*") if p.name != target.name),
                   key=lambda p: p.stat().st_mtime, reverse=True)
    for other in older[KEPT_BUILDS - 1:]:
        other.unlink(missing_ok=True)
    return target


def _released_flags() -> type:
    """numba's compiler flags with the GIL released around the kernel, as ``nogil`` does."""
    from numba.core.compiler import Flags

    class Released(Flags):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.release_gil = True

    return Released


def _cached_objects(unserialize: Callable[..., Any]) -> Callable[..., Any]:
    """numba's ``PythonAPI.unserialize`` (the code that unpickles an object the compiled code
    needs) made to unpickle each object once a process, in an ahead-of-time build.  A
    wrapper boxing an array it returns unpickles ``numpy.ndarray`` for it, and numba's JIT
    keeps what it unpickled (``numba.core.serialize._unpickled_memo``) where the build's
    ``numba_unpickle`` calls ``pickle.loads`` each time: ~1.3 us an array, ~12 us a call of
    ``blockscan._find``, which returns nine (~10% of a read worker's time).  Each object
    is kept in a global of the module, unpickled on the first call that needs it (under
    the GIL, as boxing is); each call still gets a reference of its own, as before."""
    from llvmlite import ir
    from numba.core import cgutils

    def cached(self: Any, structptr: Any) -> Any:
        if not isinstance(structptr, ir.GlobalVariable):
            return unserialize(self, structptr)
        builder, module = self.builder, self.builder.module
        name = f"{structptr.name}.object"
        try:
            kept = module.get_global(name)
        except KeyError:
            kept = ir.GlobalVariable(module, self.pyobj, name=name)
            kept.linkage = "internal"
            kept.initializer = ir.Constant(self.pyobj, None)
        got = cgutils.alloca_once_value(builder, builder.load(kept))
        with builder.if_then(cgutils.is_null(builder, builder.load(got)), likely=False):
            obj = unserialize(self, structptr)
            builder.store(obj, got)
            with builder.if_then(cgutils.is_not_null(builder, obj)):
                builder.store(obj, kept)  # (the global keeps this reference)
        obj = builder.load(got)
        self.incref(obj)  # (the caller's; ``Py_IncRef`` passes over NULL, an error)
        return obj

    return cached


def _numba_type(numba: Any, spec: str) -> Any:
    """``spec`` (``jit``'s notation) as numba's type: a ``const`` array read-only, so that a
    kernel writing one does not compile (an ahead-of-time function does not read the flag:
    it would write into a caller's read-only memory)."""
    spec = spec.strip()
    t = eval(spec.removeprefix("const "), {}, vars(numba.types))  # noqa: S307 (the modules' own strings)
    return t.copy(readonly=True) if spec.startswith("const ") else t


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
        built = _built(build_dir())
        try:
            for key, state in states.items():
                print(f"{state:8} {key}")
            print(f"build: {built.path if built is not None else f'none in {build_dir()}'}"
                  + ("" if aot_enabled() else f" (unused: {ENV_AOT}=0)"))
            sys.stdout.flush()
        except BrokenPipeError:  # (``status | head``: no traceback)
            from commscope.errors import closed_pipe

            return closed_pipe()
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
