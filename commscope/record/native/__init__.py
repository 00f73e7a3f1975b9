"""Building and loading commscope's native recorder (commscope_native.cpp, one translation
unit, and the parts it includes: the .h files beside it).

The extension is compiled against the installed torch, once per machine, torch version,
Python version and source (``source_digest``: every source file's name and contents), into
``$COMMSCOPE_NATIVE_DIR`` (default ``~/.cache/commscope/native``); later processes import
the built file directly.  That directory and the module are their owner's alone (0700), and
a build another user could have changed is never loaded (``commscope.private``).  Building needs a C++ compiler and ninja and takes 20-60 s, so
only launchers build (the install script, ``commscope run``, the demo runner): a rank never
does, because a build in a rank would stall training for that long.  A rank without a
built module records in Python.

A build runs in a child process, in a private directory, under a time limit, and the
finished file is moved into place atomically: a build killed half-way (a rank killed, a
Ctrl-C) leaves no lock behind for the next one to wait on forever, as torch's own build
lock in a shared directory would.  ``COMMSCOPE_NATIVE=0`` turns the native recorder off,
and so does any failure: the recorder then falls back to its pure-Python path (see
``commscope.record.recorder``).

``python -m commscope.record.native`` builds it ahead of time and says where it is.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from types import ModuleType

ENV_NATIVE = "COMMSCOPE_NATIVE"
ENV_DIR = "COMMSCOPE_NATIVE_DIR"
MODULE = "commscope_native"
#: The extension's sources: the one file compiled, which includes the rest (headers, so that
#: torch's headers are compiled once), all in this directory.
SOURCE_DIR = Path(__file__).parent
SOURCE = SOURCE_DIR / "commscope_native.cpp"
SOURCE_SUFFIXES = (".cpp", ".cc", ".h", ".hpp")

_lock = threading.Lock()
_module: ModuleType | None = None
_error: str | None = None


def enabled() -> bool:
    return os.environ.get(ENV_NATIVE, "1").strip().lower() not in ("0", "false", "no", "off")


def source_files(directory: Path = SOURCE_DIR) -> list[Path]:
    """Every source file of the extension in ``directory`` (C++ sources and headers), by name."""
    return sorted((p for p in directory.iterdir() if p.suffix in SOURCE_SUFFIXES and p.is_file()),
                  key=lambda p: p.name)


def source_digest(directory: Path = SOURCE_DIR) -> str:
    """sha256 of every source file's name and contents, in name order: editing, adding,
    removing or renaming any of them gives another digest, so another build."""
    h = hashlib.sha256()
    for path in source_files(directory):
        data = path.read_bytes()
        h.update(os.fsencode(path.name) + b"\0" + str(len(data)).encode() + b"\0")
        h.update(data)
    return h.hexdigest()


def build_dir() -> Path:
    """Where this torch, Python and source's build lives."""
    import torch

    base = os.environ.get(ENV_DIR) or os.path.join(os.path.expanduser("~"), ".cache", "commscope", "native")
    digest = source_digest()[:12]
    tag = f"torch-{torch.__version__}-py{sys.version_info[0]}{sys.version_info[1]}-{digest}".replace("+", "_")
    return Path(base) / tag


class Refused(RuntimeError):
    """A build directory or module another user could have changed (``commscope.private``)."""


def _refuse_unsafe(directory: Path, path: Path | None = None) -> None:
    """Raise ``Refused`` where another user could have put their code in ``directory`` (or
    ``path`` in it): every rank that loaded it would run it.  Said once a process, on stderr."""
    from commscope.private import why_unsafe

    why = why_unsafe(directory.parent, directory, *([path] if path is not None else []))
    if why is None:
        return
    message = (f"refusing to use the native recorder's build in {directory}: {why} "
               f"(remove it, and a launcher builds it again)")
    global _warned
    if not _warned:
        _warned = True
        print(f"commscope: {message}; recording in Python", file=sys.stderr)
    raise Refused(message)


_warned = False


def _import_built(directory: Path) -> ModuleType | None:
    for suffix in importlib.machinery.EXTENSION_SUFFIXES + [".so"]:
        path = directory / (MODULE + suffix)
        if path.is_file():
            _refuse_unsafe(directory, path)
            import torch  # noqa: F401  (the extension links against torch's libraries)

            spec = importlib.util.spec_from_file_location(MODULE, path)
            if spec is None or spec.loader is None:
                return None
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            sys.modules[MODULE] = module
            return module
    return None


#: How long a build may take before it is given up (a machine under load takes minutes).
BUILD_TIMEOUT_S = 600.0


def load(build: bool = False, verbose: bool = False) -> ModuleType | None:
    """The extension module, building it first when ``build`` (launchers only, never a
    rank); None when unavailable (``error()`` says why)."""
    global _module, _error
    with _lock:
        if _module is not None or (_error is not None and not build):
            return _module
        if not enabled():
            _error = f"{ENV_NATIVE}=0"
            return None
        try:
            directory = build_dir()
            module = _import_built(directory)
            if module is None and build:
                _build(directory, verbose)
                module = _import_built(directory)
            if module is None:
                _error = "not built yet (python -m commscope.record.native builds it)"
                return None
            _module = module
            _error = None
            return module
        except Refused as exc:
            _error = str(exc)
            return None
        except Exception as exc:  # no compiler, no ninja, headers that do not match ...
            _error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"
            return None


def _build(directory: Path, verbose: bool) -> None:
    """Compile in a child process into a fresh directory beside ``directory``, then move the
    module into ``directory`` (atomic: readers see the whole file or none).  The directories
    are made 0700 and the module 0700, whatever the umask, and a directory another user
    could write is refused (``_refuse_unsafe``): every rank loads what lies there."""
    from commscope.private import make_dirs

    make_dirs(directory)
    _refuse_unsafe(directory)
    if not verbose:
        print(f"commscope: building the native recorder for torch {_torch_version()} (once, ~30 s) in {directory}",
              file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix=".build-", dir=directory.parent, ignore_cleanup_errors=True) as scratch:
        command = [sys.executable, str(Path(__file__).resolve()), "compile", scratch] + (["-v"] if verbose else [])
        # A session of its own: on timeout or interrupt the compilers it started go with it.
        child = subprocess.Popen(command, text=True, start_new_session=True,
                                 stdout=None if verbose else subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            output, _ = child.communicate(timeout=BUILD_TIMEOUT_S)
        except BaseException as exc:
            _kill_session(child.pid)
            child.wait()
            if isinstance(exc, subprocess.TimeoutExpired):
                raise RuntimeError(f"the build took longer than {BUILD_TIMEOUT_S:.0f} s and was stopped") from None
            raise
        if child.returncode != 0:
            lines = (output or "").strip().splitlines()
            raise RuntimeError(lines[-1] if lines else f"the build failed (exit {child.returncode})")
        for suffix in importlib.machinery.EXTENSION_SUFFIXES + [".so"]:
            built = Path(scratch) / (MODULE + suffix)
            if built.is_file():
                os.chmod(built, 0o700)  # (the compiler's mode is the umask's)
                os.replace(built, directory / built.name)
                return
        raise RuntimeError("the build finished without a module")


def _kill_session(sid: int) -> None:
    """Kill every process of session ``sid``: ninja gives each compiler a process group of
    its own, so killing the child's group would leave the compilers running."""
    import psutil

    for _ in range(5):  # a process may start another while the first pass kills
        found = False
        for proc in psutil.process_iter():
            try:
                if os.getsid(proc.pid) == sid:
                    proc.kill()
                    found = True
            except (OSError, psutil.Error):
                pass
        if not found:
            return


def _compile(scratch: str, verbose: bool) -> None:
    """The child's side of ``_build``: torch's extension builder, in a directory of its own."""
    import torch.utils.cpp_extension as cpp

    cpp.load(name=MODULE, sources=[str(SOURCE)], build_directory=scratch, extra_cflags=["-O2", "-w"],
             verbose=verbose)


def _torch_version() -> str:
    import torch

    return str(torch.__version__)


def error() -> str | None:
    """Why the native recorder is unavailable, or None."""
    return _error


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m commscope.record.native",
                                description="Build commscope's native recorder for this torch, or show its state.")
    p.add_argument("action", nargs="?", choices=("build", "status", "compile"), default="build",
                   help="build (default): build unless built; status: say whether it is built")
    p.add_argument("scratch", nargs="?", help=argparse.SUPPRESS)
    p.add_argument("-v", "--verbose", action="store_true", help="show the compiler's output")
    args = p.parse_args(argv)
    if args.action == "compile":  # the child process of a build
        _compile(args.scratch, args.verbose)
        return 0
    if not enabled():
        print(f"native recorder disabled ({ENV_NATIVE}=0)")
        return 0 if args.action == "status" else 1
    module = load(build=args.action == "build", verbose=args.verbose)
    if module is None:
        print(f"native recorder unavailable: {error()}")
        return 1
    print(f"native recorder ready: {module.__file__}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
