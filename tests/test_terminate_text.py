"""The ``what()`` of a C++ exception that reached ``std::terminate`` is cut before a word
(helper-82).

The native recorder's terminate handler keeps ``what()`` in the spool's header (2,048
bytes) and the reader masks its credentials when it reads the spool.  A plain copy of the
first 2,048 bytes cut mid-word, and half a credential is no longer recognisable: a URL's
password straddling byte 2,048 (``postgres://user:TRUNCSECRET`` without its ``@host``)
reached the trace.  The handler now cuts as a record's text is cut (``cut_text``): the
whole words before the limit, then "…".

One real process each: it records with the native recorder (a one-rank Gloo group), then
throws ``std::runtime_error`` from C code called through ctypes (libstdc++'s
``std::__throw_runtime_error``): no handler can catch it across CPython's frames, so the
throw ends in ``std::terminate`` with the exception current, as a backend thread's
``EnforceNotMet`` does.  The dead rank's spool is read back as ``check`` reads it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
from trace_helpers import read_events

from commscope.cli import main as cli
from commscope.store.spool import signal_name

pytestmark = pytest.mark.timeout(300)

TERM_WHAT = 2048  # SpoolHeader.term_what (record/native/layout.h)
MARK = "\u2026"
URL = "postgres://user:TRUNCSECRETPASSWORD@db/app"
#: Where the URL starts: a copy of the first 2,048 bytes ends inside its password, after "TRUNCSECRET".
URL_AT = TERM_WHAT - len("postgres://user:TRUNCSECRET")
SECRET_PIECES = ("TRUNCSECRET", "TRUNC", "PASSWORD")


def _words(n: int) -> str:
    """``n`` bytes of words, ending in a whole word (ASCII, nothing a masker would touch)."""
    words = ("the", "collective", "failed", "on", "every", "member", "of", "the", "group", "after", "three",
             "retries")
    out, i = "", 0
    while len(out) < n - 12:
        out += words[i % len(words)] + " "
        i += 1
    out += "x" * (n - len(out))
    assert len(out) == n and not out.endswith(" ")
    return out


CROSSING = _words(URL_AT - 1) + " " + URL + " while connecting"
FITS = _words(TERM_WHAT)  # exactly as long as the field: kept whole, no mark

RANK = textwrap.dedent("""
    import ctypes, json, sys
    import torch, torch.distributed as dist
    import commscope
    rec = commscope.instrument(sys.argv[1], flight_recorder=False)
    dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=0, world_size=1)
    dist.all_reduce(torch.ones(4))
    print(json.dumps({"source": type(rec.ops).__name__, "spool": rec.spool is not None}), flush=True)
    throw = ctypes.CDLL("libstdc++.so.6")._ZSt21__throw_runtime_errorPKc  # std::__throw_runtime_error
    throw.argtypes = [ctypes.c_char_p]
    throw(sys.argv[3].encode())  # std::terminate: nothing catches it across CPython's frames
    print("still alive", flush=True)
""")


@pytest.fixture(scope="module")
def native_env():
    """The environment of a rank that records with the native recorder, built once (a launcher
    builds; a rank never does)."""
    from commscope.record import native

    built = subprocess.run([sys.executable, "-m", "commscope.record.native", "build"], capture_output=True,
                           text=True, timeout=900)
    assert built.returncode == 0, built.stdout + built.stderr
    return dict(os.environ, COMMSCOPE_NATIVE="1", COMMSCOPE_NATIVE_DIR=str(native.build_dir().parent),
                COMMSCOPE_SOURCE="native")


def _die_of_terminate(what: str, tmp_path, env: dict[str, str]) -> tuple[str, list[dict]]:
    """Run the rank; return its store and every event read back from it."""
    store = str(tmp_path / "trace")
    env = dict(env, COMMSCOPE_JOB=f"terminate-{tmp_path.name}")
    proc = subprocess.run([sys.executable, "-c", RANK, store, str(tmp_path / "rendezvous"), what], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGABRT, (proc.returncode, proc.stdout, proc.stderr[-3000:])
    assert json.loads(proc.stdout.splitlines()[0]) == {"source": "NativeOps", "spool": True}, proc.stdout
    assert "terminate called after throwing an instance of 'std::runtime_error'" in proc.stderr, proc.stderr[-3000:]
    return store, read_events(store)


def _check(store: str, capsys) -> tuple[int, dict]:
    capsys.readouterr()
    rc = cli(["check", store, "--json"])
    return rc, json.loads(capsys.readouterr().out)


def _exit_exc(events: list[dict]) -> str:
    exits = [e for e in events if e["type"] == "exit" and e["rank"] == 0]
    assert len(exits) == 1, exits
    assert (exits[0]["reason"], exits[0]["signal"]) == ("signal", signal_name(signal.SIGABRT)), exits[0]
    return exits[0]["exc"]


def test_a_long_what_is_cut_before_the_word_the_limit_falls_in(native_env, tmp_path, capsys):
    """A URL's password across byte 2,048 of ``what()`` leaves no piece in the trace, nor in
    what ``check`` says."""
    assert len(CROSSING.encode()) > TERM_WHAT and CROSSING.index(URL) == URL_AT
    assert CROSSING.encode()[:TERM_WHAT].endswith(b"postgres://user:TRUNCSECRET")  # where a plain copy ends
    store, events = _die_of_terminate(CROSSING, tmp_path, native_env)
    exc = _exit_exc(events)
    assert exc.startswith("std::runtime_error: "), exc[:100]
    what = exc.removeprefix("std::runtime_error: ")
    everything = json.dumps(events)
    for piece in SECRET_PIECES:
        assert piece not in everything, (piece, what[-60:])
    kept = CROSSING.encode()[:TERM_WHAT - len(MARK.encode())].rsplit(b" ", 1)[0].decode()
    assert what == kept + MARK, what[-120:]  # the whole words before the URL, and the mark of the cut
    assert len(what.encode()) <= TERM_WHAT
    rc, out = _check(store, capsys)
    errors = [f for f in out["findings"] if f["severity"] == "error"]
    assert rc == 1 and [(f["kind"], f["culprits"]) for f in errors] == [("rank_crashed", [0])], out["findings"]
    assert "std::runtime_error" in errors[0]["message"], errors[0]["message"]
    for piece in SECRET_PIECES:
        assert piece not in json.dumps(out), piece


def test_a_what_that_fits_is_kept_whole(native_env, tmp_path, capsys):
    assert len(FITS.encode()) == TERM_WHAT
    store, events = _die_of_terminate(FITS, tmp_path, native_env)
    assert _exit_exc(events) == "std::runtime_error: " + FITS
    rc, out = _check(store, capsys)
    errors = [f for f in out["findings"] if f["severity"] == "error"]
    assert rc == 1 and [(f["kind"], f["culprits"]) for f in errors] == [("rank_crashed", [0])], out["findings"]
    assert "std::runtime_error" in errors[0]["message"], errors[0]["message"]
