"""The import structure docs/architecture.md promises: no module of the analysis or of the
recorder imports one that imports it back (even inside a function), and nothing below the
commands imports the commands, the CLI or the console."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "commscope"


def _imports(path: Path, package: str) -> set[str]:
    """The modules of ``package`` that ``path`` imports, wherever in it (but for type checkers
    only: ``if TYPE_CHECKING:``, which never runs)."""
    out: set[str] = set()
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for top in ast.walk(tree) if isinstance(top, ast.If) and isinstance(top.test, ast.Name)
                   and top.test.id == "TYPE_CHECKING" for n in ast.walk(top)}
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == package:
                out |= {f"{package}.{a.name}" for a in node.names}
            elif node.module.startswith(package + "."):
                out.add(node.module)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith(package + ".")}
    return out


def _cycles(directory: Path, package: str) -> set[tuple[str, ...]]:
    graph = {f"{package}.{p.stem}": _imports(p, package) for p in directory.glob("*.py")}
    found: set[tuple[str, ...]] = set()

    def walk(node: str, path: list[str]) -> None:
        for nxt in graph.get(node, ()):
            if nxt in path:
                cycle = path[path.index(nxt):]
                k = cycle.index(min(cycle))
                found.add(tuple(cycle[k:] + cycle[:k]))
            else:
                walk(nxt, [*path, nxt])

    for start in graph:
        walk(start, [start])
    return found


def test_the_analysis_has_no_import_cycle():
    assert _cycles(ROOT / "analysis", "commscope.analysis") == set()


def test_the_recorder_has_no_import_cycle():
    """Each op source owns its wrappers: ``patch`` patches, and imports neither source."""
    assert _cycles(ROOT / "record", "commscope.record") == set()
    assert not {"commscope.record.pyhot", "commscope.record.nativeops"} & _imports(ROOT / "record" / "patch.py",
                                                                                   "commscope.record")


def test_nothing_below_the_commands_imports_them_or_the_console():
    above = ("commscope.commands", "commscope.cli", "commscope.tui")
    for layer in ("analysis", "record", "store", "scenarios", "varlen", "snapshot"):
        for path in (ROOT / layer).rglob("*.py"):
            bad = {m for m in _imports(path, "commscope") if m.startswith(above)}
            assert not bad, (path, bad)
    for path in ROOT.glob("*.py"):
        if path.stem not in ("cli", "__main__"):
            assert not {m for m in _imports(path, "commscope") if m.startswith(above)}, path


def test_the_stores_have_no_import_cycle_and_never_import_the_analysis():
    """The stores sit below the analysis: a reader's worker, a retention child and the carry
    of a segment judge ops without the model (``oprecords.completes`` is the model's rule)."""
    assert _cycles(ROOT / "store", "commscope.store") == set()
    for path in (ROOT / "store").rglob("*.py"):
        assert not {m for m in _imports(path, "commscope") if m.startswith("commscope.analysis")}, path.name


def test_the_snapshot_has_no_import_cycle_and_the_analysis_never_imports_it():
    """``commscope snapshot`` sits above the analysis (it reads Flight Recorder dumps and folds
    stacks with it); the analysis knows a snapshot only by what it wrote (``analysis.snapshots``)."""
    assert _cycles(ROOT / "snapshot", "commscope.snapshot") == set()
    for path in (ROOT / "analysis").rglob("*.py"):
        assert not {m for m in _imports(path, "commscope") if m.startswith("commscope.snapshot")}, path.name


def test_a_command_that_runs_no_job_never_imports_torch(tmp_path):
    """torch takes ~0.8 s to import: the parser (which imports every bench suite for its
    options) and ``check`` of a stored trace do without it, so a command answers in a
    fraction of a second (a bench suite once imported its job's script for its path)."""
    import subprocess
    import sys

    from commscope.bench.synthstore import JobShape, write_store

    store = str(tmp_path / "trace")
    write_store(store, JobShape(4, 20, fault="missing", hang_after=2.0))
    code = ("import sys\nfrom commscope import cli\ncli.build_parser()\n"
            "code = cli.main(['check', sys.argv[1], '--json'])\n"
            "print(code, sorted(m for m in ('torch', 'torch.distributed') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code, store], capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[-1] == "1 []", out
