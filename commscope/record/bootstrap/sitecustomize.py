"""commscope's bootstrap for ``commscope run``: on PYTHONPATH only while it runs a command.

Python imports ``sitecustomize`` at start-up.  This one chains to any other
sitecustomize further down sys.path, then (when COMMSCOPE_AUTO=1) arranges for
commscope to instrument the process the moment it creates a process group.  Processes
that never call ``init_process_group`` are left alone.  Kept tiny: it runs in every
Python process the command starts.
"""

import os
import sys


def _chain_next_sitecustomize() -> None:
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None or os.path.abspath(spec.origin or "") == os.path.abspath(__file__):
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["_commscope_chained_sitecustomize"] = module
    spec.loader.exec_module(module)


try:
    _chain_next_sitecustomize()
finally:
    if os.environ.get("COMMSCOPE_AUTO") == "1":
        try:
            from commscope.record.autostart import install_import_hook

            install_import_hook()
        except Exception as exc:  # never break the user's program
            print(f"commscope: bootstrap disabled: {exc!r}", file=sys.stderr)
