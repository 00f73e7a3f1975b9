"""Building and loading commscope's native recorder (commscope_native.cpp).

The extension is compiled against the installed torch, once per machine, torch version,
Python version and source, into ``$COMMSCOPE_NATIVE_DIR`` (default
``~/.cache/commscope/native``); later processes import the built file directly.  Building
needs a C++ compiler and ninja and takes 20-60 s; concurrent ranks wait for one build
(torch's build lock).  ``COMMSCOPE_NATIVE=0`` turns it off, and so does any failure: the
recorder then falls back to its pure-Python path (see ``commscope.record.recorder``).

``python -m commscope.record.native`` builds it ahead of time and says where it is.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import sys
import threading
from pathlib import Path
from types import ModuleType

ENV_NATIVE = "COMMSCOPE_NATIVE"
ENV_DIR = "COMMSCOPE_NATIVE_DIR"
MODULE = "commscope_native"
SOURCE = Path(__file__).with_name("commscope_native.cpp")

_lock = threading.Lock()
_module: ModuleType | None = None
_error: str | None = None


def enabled() -> bool:
    return os.environ.get(ENV_NATIVE, "1").strip().lower() not in ("0", "false", "no", "off")


def build_dir() -> Path:
    """Where this torch, Python and source's build lives."""
    import torch

    base = os.environ.get(ENV_DIR) or os.path.join(os.path.expanduser("~"), ".cache", "commscope", "native")
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    tag = f"torch-{torch.__version__}-py{sys.version_info[0]}{sys.version_info[1]}-{digest}".replace("+", "_")
    return Path(base) / tag


def _import_built(directory: Path) -> ModuleType | None:
    for suffix in importlib.machinery.EXTENSION_SUFFIXES + [".so"]:
        path = directory / (MODULE + suffix)
        if path.is_file():
            import torch  # noqa: F401  (the extension links against torch's libraries)

            spec = importlib.util.spec_from_file_location(MODULE, path)
            if spec is None or spec.loader is None:
                return None
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            sys.modules[MODULE] = module
            return module
    return None


def load(build: bool = True, verbose: bool = False) -> ModuleType | None:
    """The extension module, building it if needed and allowed; None when unavailable
    (``error()`` says why)."""
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
                module = _build(directory, verbose)
            if module is None:
                _error = "not built yet (python -m commscope.record.native builds it)"
                return None
            _module = module
            _error = None
            return module
        except Exception as exc:  # no compiler, no ninja, headers that do not match ...
            _error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"
            return None


def _build(directory: Path, verbose: bool) -> ModuleType:
    import torch.utils.cpp_extension as cpp

    directory.mkdir(parents=True, exist_ok=True)
    if not verbose:
        print(f"commscope: building the native recorder for torch {_torch_version()} (once, ~30 s) in {directory}",
              file=sys.stderr)
    return cpp.load(name=MODULE, sources=[str(SOURCE)], build_directory=str(directory),
                    extra_cflags=["-O2", "-w"], verbose=verbose)


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
    p.add_argument("action", nargs="?", choices=("build", "status"), default="build")
    p.add_argument("-v", "--verbose", action="store_true", help="show the compiler's output")
    args = p.parse_args(argv)
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
