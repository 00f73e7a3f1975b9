# Sourced by scripts/test and scripts/demo: a virtual environment with commscope installed.
# CPU torch 2.13.0 first where no torch is present (a bare torch requirement would pull a
# multi-GB CUDA build); pyproject only asks for torch>=2.4.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [ -z "${VIRTUAL_ENV:-}" ]; then
  [ -x .venv/bin/python ] || "${PYTHON:-python3}" -m venv .venv
  # shellcheck disable=SC1091
  . .venv/bin/activate
fi
pip_install() {  # quiet: setuptools' editable-install notice is not news
  PYTHONWARNINGS=ignore python -m pip install -q --disable-pip-version-check "$@"
}
# Installed already, with these extras and this pyproject: nothing to do (a second launch of
# scripts/demo starts at once instead of re-running pip for ~10 s).
stamp="${VIRTUAL_ENV}/.commscope-installed-${COMMSCOPE_EXTRAS:-test}"
want="$(python -c 'import hashlib; print(hashlib.sha256(open("pyproject.toml", "rb").read()).hexdigest())')"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ] || ! python -c "import commscope, torch" 2>/dev/null; then
  pip_install --upgrade pip
  python -c "import torch" 2>/dev/null || pip_install torch==2.13.0
  pip_install -e ".[${COMMSCOPE_EXTRAS:-test}]"
  echo "$want" > "$stamp"
fi
# The native recorder is compiled against this torch once per machine (~30 s; cached in
# ~/.cache/commscope/native).  Without a compiler commscope records in Python instead.
python -m commscope.record.native build || echo "commscope: continuing with the Python recorder"
# The readers' numba kernels, compiled ahead of time once per Python, numpy and machine (~30 s;
# cached in ~/.cache/commscope/kernels): a process that reads a trace then loads them in a few ms,
# where compiling or loading them through numba cost each one ~0.3 s of CPU (every read
# worker, every CLI, every test's process).  Without them they are compiled on first use.
python -m commscope.compiled build || echo "commscope: continuing with kernels compiled on first use"
# commscope's bytecode, written here once: an editable install writes none, and where
# PYTHONDONTWRITEBYTECODE is set (as in CI's image) every process compiled commscope's modules
# again at its start (~0.1 s of CPU each; the suite starts hundreds: ranks, read workers, CLIs;
# test_e2e_failures and test_deaths took 88-92 s against 96-101 s without it).  Python reads
# the bytecode only while it matches the source: a module edited since is compiled at each
# start again, until this script runs again.
python -m compileall -q commscope > /dev/null || echo "commscope: bytecode not written (each process compiles it)"
