"""py-spy, the one way commscope reads the stacks of a process from outside (``commscope
snapshot``, ``attach --pid``, ``check --py-spy``).

``dump`` runs ``py-spy dump --json --locals`` (and ``--native`` where asked) on one pid and
returns its threads outermost frame first, like every stack in a trace.  A failure is a
``DumpError`` whose ``kind`` says what the user can do about it: py-spy missing, no
permission to attach (ptrace), the process gone, or anything else py-spy said.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess

import orjson

#: One dump of a stuck rank takes ~20 ms (a native one ~100-500 ms); past this it is hung itself.
TIMEOUT_S = 20.0
MISSING, PERMISSION, GONE, STOPPED, FAILED = "missing", "permission", "gone", "stopped", "failed"
INSTALL = "py-spy is not installed: pip install py-spy (commscope's own install brings it)"


class DumpError(Exception):
    def __init__(self, kind: str, text: str):
        super().__init__(text)
        self.kind = kind


@dataclasses.dataclass(frozen=True, slots=True)
class Local:
    name: str
    repr: str | None  # py-spy's repr: ints, strings, None and containers of them; "<Tensor at 0x..>" else
    arg: bool  # a parameter of the function (in parameter order among a frame's locals)


@dataclasses.dataclass(frozen=True, slots=True)
class PyFrame:
    func: str
    file: str
    line: int
    locals: tuple[Local, ...] = ()
    native: bool = False  # a C/C++ frame (``--native``): ``file`` is its library

    def local(self, name: str) -> str | None:
        return next((x.repr for x in self.locals if x.name == name), None)

    def args(self) -> list[str]:
        return [x.name for x in self.locals if x.arg]


@dataclasses.dataclass(frozen=True, slots=True)
class PyThread:
    tid: int
    name: str | None
    active: bool  # running (not waiting) when dumped
    owns_gil: bool
    frames: tuple[PyFrame, ...]  # outermost first


def executable() -> str | None:
    return shutil.which("py-spy")


def dump(pid: int, *, native: bool = False, locals_: bool = True, exe: str | None = None,
         timeout: float = TIMEOUT_S) -> list[PyThread]:
    """The Python (and native) stacks of every thread of ``pid``; raises DumpError."""
    out = _run(pid, ["--json"] + (["--locals"] if locals_ else []) + (["--native"] if native else []), exe, timeout)
    try:
        raw = orjson.loads(out)
    except orjson.JSONDecodeError:
        raise DumpError(FAILED, f"py-spy printed no JSON for pid {pid}") from None
    return parse(raw)


def dump_text(pid: int, *, native: bool = True, exe: str | None = None, timeout: float = TIMEOUT_S) -> str:
    """py-spy's own text dump (what ``check --py-spy`` quotes); raises DumpError."""
    return _run(pid, ["--native"] if native else [], exe, timeout).decode(errors="replace")


def _run(pid: int, flags: list[str], exe: str | None, timeout: float) -> bytes:
    exe = exe or executable()
    if exe is None:
        raise DumpError(MISSING, INSTALL)
    before = process_state(pid)  # (py-spy's attach and detach may let a stopped process run a moment)
    try:
        out = subprocess.run([exe, "dump", "--pid", str(pid), *flags], capture_output=True, timeout=timeout,
                             env=_env())
    except subprocess.TimeoutExpired:
        raise DumpError(FAILED, f"py-spy did not answer within {timeout:g} s for pid {pid}") from None
    except OSError as exc:
        raise DumpError(MISSING, f"cannot run py-spy ({exe}): {exc}") from None
    if out.returncode != 0:
        text = (out.stderr or out.stdout).decode(errors="replace").strip()
        kind = classify(text, pid, before)
        said = first_line(text) or f"py-spy exited {out.returncode}"
        if kind == STOPPED:  # (py-spy says only "Failed to get stack traces")
            said = f"pid {pid} is stopped (SIGSTOP, Ctrl-Z or a debugger holds it): py-spy cannot read it"
        raise DumpError(kind, said)
    return out.stdout


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("RUST_BACKTRACE", None)  # one line of error, not a Rust backtrace
    return env


def first_line(text: str) -> str:
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("Stack backtrace"):
            return line.removeprefix("Error: ")
    return ""


def classify(text: str, pid: int, before: str | None = None) -> str:
    """What py-spy's failure on ``pid`` means: no permission, the process gone (a zombie is:
    it ended, its parent has not collected it), stopped (``before``: its state before py-spy
    ran; py-spy's detach lets a stopped process run a moment, so its state after may read
    running: 2 of 30 dumps of one under load), or py-spy failing."""
    low = text.lower()
    if "permission denied" in low or "operation not permitted" in low or "os error 1)" in low or "os error 13" in low:
        return PERMISSION
    state = process_state(pid)
    if "no such process" in low or "os error 3)" in low or "failed to find process" in low or state in (None, "Z", "X"):
        return GONE
    if state in ("T", "t") or before in ("T", "t"):
        return STOPPED
    return FAILED


def process_state(pid: int) -> str | None:
    """The state letter of ``/proc/PID/stat`` (R, S, D, T stopped, t traced, Z zombie, ...);
    None where there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    after = stat.rpartition(b")")[2].split()  # (the command name, in parentheses, may hold anything)
    return after[0].decode(errors="replace") if after else None


def parse(raw: object) -> list[PyThread]:
    """py-spy's JSON (innermost frame first) as threads, outermost frame first."""
    threads = []
    for t in raw if isinstance(raw, list) else []:
        if not isinstance(t, dict):
            continue
        frames = []
        for f in t.get("frames") or []:
            if not isinstance(f, dict):
                continue
            locs = tuple(Local(str(x.get("name")), x.get("repr") if isinstance(x.get("repr"), str) else None,
                               bool(x.get("arg"))) for x in f.get("locals") or [] if isinstance(x, dict))
            line = f.get("line") if isinstance(f.get("line"), int) else 0
            file = str(f.get("filename") or f.get("short_filename") or "?")
            frames.append(PyFrame(str(f.get("name") or "?"), file, line, locs,
                                  native=not file.endswith(".py") and "<" not in file and line == 0))
        frames.reverse()
        tid = t.get("os_thread_id") or t.get("thread_id") or 0
        threads.append(PyThread(int(tid) if isinstance(tid, int) else 0, t.get("thread_name"), bool(t.get("active")),
                                bool(t.get("owns_gil")), tuple(frames)))
    return threads
