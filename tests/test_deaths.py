"""The death matrix: a rank dies of every cause at every moment, on both stores and both
recorders, and the trace says exactly what happened.

Cause (abort, segfault, SIGKILL, ``os._exit``, uncaught exception, C++ ``std::terminate``)
× moment (right after ``init_process_group``, inside the recorder's first tick, mid-run
with an async op in flight, right after an op) × store (directory, Redis) × recorder
(native, Python).  Each job is two real Gloo ranks; rank 1 dies.  Every case asserts:

- one error finding, of the cause's kind, naming rank 1 and quoting the cause;
- no survivor blamed: rank 0 is never a culprit, and no ``trace_incomplete`` appears;
- nothing lost: the trace holds exactly as many ops of rank 1 as it issued (its own
  count, written just before it died), and the reader skipped nothing.

The spool makes even SIGKILL lossless: whoever finds the dead spool first (the launcher
with the exit status, rank 0's recorder, or the reader) forwards it.
"""

from __future__ import annotations

import json
from pathlib import Path

import death_workers as W
import pytest
from redis_fixture import *  # noqa: F403  (the redis_server and redis_url fixtures)

from commscope.analysis.model import TraceModel
from commscope.analysis.source import load_trace
from commscope.cli import main as cli
from commscope.launch import Job

pytestmark = pytest.mark.timeout(120)


def run_death(store: str, cause: str, moment: str, recorder: str, tmp_path: Path, job: str) -> int:
    """Run the two-rank job; return rank 1's own count of ops."""
    count = tmp_path / "own-count"
    env = {"COMMSCOPE_JOB": job, "COMMSCOPE_SOURCE": recorder}
    j = Job(W.dying, 2, args=(store, cause, moment, str(count)), env=env, pg_timeout=30).start()
    results = j.join(90)
    assert results[1].exitcode != 0, f"rank 1 did not die of {cause}: {results[1]}"
    return int(count.read_text())


def check_json(store: str, capsys) -> tuple[int, dict]:
    capsys.readouterr()
    rc = cli(["check", store, "--json", "--hang-after", "60"])
    return rc, json.loads(capsys.readouterr().out)


def assert_diagnosed(store: str, cause: str, own: int, capsys, recorder: str = "native", *,
                     unseen: bool = False, moment: str | None = None) -> None:
    """``unseen``: no commscope launcher saw rank 1's exit status (``W.UNSEEN``).  ``moment``:
    when rank 1 died; but mid-run (an async op in flight), every op it issued had ended, and
    the trace holds each end too."""
    kind, word = {**(W.EXPECT_PYTHON if recorder == "python" else W.EXPECT), **(W.UNSEEN if unseen else {})}[cause]
    rc, out = check_json(store, capsys)
    errors = [f for f in out["findings"] if f["severity"] == "error"]
    assert rc == 1, (out, sorted(p.name for p in Path(store).rglob("*")))  # (what was read, what the store holds)
    assert [(f["kind"], f["culprits"]) for f in errors] == [(kind, [1])], errors
    assert word in errors[0]["message"], errors[0]["message"]
    assert all(0 not in f["culprits"] for f in out["findings"]), out["findings"]
    assert not [f for f in out["findings"] if f["kind"] == "trace_incomplete"], out["findings"]
    skipped = out["skipped"]
    assert (skipped["damaged"], skipped["invalid"], skipped["store_missing"]) == (0, 0, 0), skipped
    model, _reader, _warnings = load_trace(store)
    assert isinstance(model, TraceModel)
    assert model.n_ops(1) == own, f"rank 1 issued {own} ops, the trace holds {model.n_ops(1)}"
    assert model.ranks[1].dropped == 0
    if moment is not None:
        assert len(model.ranks[1].open) <= (moment == "mid_run"), f"rank 1's ops left open: {model.ranks[1].open}"


@pytest.mark.parametrize("recorder", ["native", "python"])
@pytest.mark.parametrize("moment", W.MOMENTS)
@pytest.mark.parametrize("cause", W.CAUSES)
def test_death_directory(cause, moment, recorder, tmp_path, capsys):
    store = str(tmp_path / "trace")
    own = run_death(store, cause, moment, recorder, tmp_path, "death")
    assert_diagnosed(store, cause, own, capsys, recorder, moment=moment)


@pytest.mark.parametrize("recorder", ["native", "python"])
@pytest.mark.parametrize("moment", W.MOMENTS)
@pytest.mark.parametrize("cause", W.CAUSES)
def test_death_redis(cause, moment, recorder, redis_url, tmp_path, capsys):
    own = run_death(redis_url, cause, moment, recorder, tmp_path, "death")
    assert_diagnosed(redis_url, cause, own, capsys, recorder, moment=moment)


@pytest.mark.parametrize("recorder", ["native", "python"])
def test_sigterm_is_a_killing(recorder, tmp_path, capsys):
    """SIGTERM (what a launcher sends first) is noted by the rank itself: in its spool's
    header by the native death handler, in a file next to its spool by faulthandler for the
    Python recorder.  (``Job`` sees the exit status too; under mp.spawn and torchrun the
    note is all there is: ``test_death_under_a_launcher``.)"""
    store = str(tmp_path / "trace")
    own = run_death(store, "sigterm", "mid_run", recorder, tmp_path, "death")
    assert_diagnosed(store, "sigterm", own, capsys, recorder, moment="mid_run")


def test_a_sigterm_noted_by_a_coarse_clock_is_a_killing(tmp_path, capsys):
    """The Python recorder's SIGTERM is timed by the mtime of the ``.term`` file faulthandler
    writes as it comes, and the kernel keeps mtimes with its coarse clock: a file written
    with nobody looking at its times reads a jiffy or more early (2 ms here, up to 5).  A
    SIGTERM 0.4 ms after the rank's last begin then read as an exit before that op, so as
    no exit at all: "rank 1 vanished" (CI, twice).  The exit now says its time is a bound
    (``approx``), and readers allow a coarse clock's lag.  Here the forwarded exit is moved
    to 3 ms before the rank's last begin, as such a clock reads."""
    store = str(tmp_path / "trace")
    own = run_death(store, "sigterm", "mid_run", "python", tmp_path, "death")
    model, _reader, _warnings = load_trace(store)
    last_begin = model.ranks[1].last_op_ts
    stream = Path(store) / "death" / "rank-00001.jsonl"
    lines = stream.read_bytes().split(b"\n")
    exits = [i for i, line in enumerate(lines) if line.startswith(b"{") and json.loads(line)["type"] == "exit"]
    assert len(exits) == 1, lines
    ex = json.loads(lines[exits[0]])
    assert (ex["src"], ex["signal"], ex.get("approx")) == ("spool", "Terminated", True), ex
    ex["ts"] = last_begin - 3_000_000
    lines[exits[0]] = json.dumps(ex).encode()
    stream.write_bytes(b"\n".join(lines))
    assert_diagnosed(store, "sigterm", own, capsys, "python", moment="mid_run")


@pytest.mark.parametrize("recorder", ["native", "python"])
def test_a_rank_without_a_spool_is_said_to_have_had_none(recorder, tmp_path, capsys, monkeypatch):
    """A rank that could not make its spool (here: the spool directory is not private; in
    the field, a full /dev/shm) records in memory: killed outright, what its last tick had
    not stored dies with it, and nothing says how it died.  Its meta says why it had no
    spool (``no_spool``), and the finding that names it dead says its last records may be
    missing.  Before, a rank SIGTERMed so showed as vanished, its last op gone, and nothing
    said why."""
    shared = tmp_path / "spools"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    monkeypatch.setenv("COMMSCOPE_SPOOL_DIR", str(shared))
    store = str(tmp_path / "trace")
    own = run_death(store, "sigkill", "after_op", recorder, tmp_path, "death")
    rc, out = check_json(store, capsys)
    errors = [f for f in out["findings"] if f["severity"] == "error"]
    assert rc == 1 and [(f["kind"], f["culprits"]) for f in errors] == [("dead_rank", [1])], errors
    why = f"{shared} is not a private directory"
    assert f"; it recorded without a spool ([Errno 13] {why}): what it did last may be missing" in (
        errors[0]["message"]), errors[0]["message"]
    assert errors[0]["evidence"]["no_spool"] == f"[Errno 13] {why}", errors[0]["evidence"]
    model, _reader, _warnings = load_trace(store)
    assert model.n_ops(1) <= own and not list(shared.iterdir())


@pytest.mark.parametrize("moment", ["mid_run", "after_op"])
def test_sigkill_under_a_launcher_that_does_not_say_how_names_the_rank(moment, tmp_path, capsys, monkeypatch):
    """Under torchrun, nothing of commscope sees a worker's exit status: a rank SIGKILLed
    left no word, and its spool, forwarded when the command ended, was timed then, seconds
    after its peers had failed on it.  The survivors' failure blamed nobody ("every other
    member is still there"), and the dead rank showed as still running (helper-67).  The
    forwarder now says it ended without a word, at its last record."""
    from commscope.store import spool

    monkeypatch.setattr(Job, "forward_spools", lambda self: spool.forward_orphans())  # (no exit status)
    store = str(tmp_path / "trace")
    own = run_death(store, "sigkill", moment, "native", tmp_path, "death")
    model, _reader, _warnings = load_trace(store)
    (gone,) = model.ranks[1].exits
    assert (gone["reason"], gone["src"]) == ("gone", "spool")
    assert gone["ts"] <= min(model.last_seen(0), *(int(e["ts"]) for e in model.ranks[0].exits))
    rc, out = check_json(store, capsys)
    errors = [f for f in out["findings"] if f["severity"] == "error"]
    assert rc == 1 and [(f["kind"], f["culprits"]) for f in errors] == [("dead_rank", [1])], errors
    assert "ended without a word" in errors[0]["message"], errors[0]["message"]
    assert all(0 not in f["culprits"] for f in out["findings"]), out["findings"]
    assert model.n_ops(1) == own and model.ranks[1].dropped == 0


def test_skipped_all_reduce_names_the_skipping_rank(tmp_path, capsys):
    """Gloo aborts a rank that did nothing wrong; the finding names the rank that skipped
    (the odd one out by majority), quotes the backend's message, and folds the abort in."""
    store = str(tmp_path / "trace")
    results = Job(W.skipping, 3, args=(store,), env={"COMMSCOPE_JOB": "skip"}, pg_timeout=30).start().join(90)
    # (the backend aborted someone; on failure every rank's exit code first, then the end of its
    # error, short: pytest cuts a longer message, and showed rank 0's alone, twice in CI)
    codes = {r: (x.exitcode, x.timed_out) for r, x in results.items()}
    tails = {r: (x.error or "")[-100:] for r, x in results.items()}
    assert any(r.exitcode == -6 for r in results.values()), f"exit codes (and timed out) {codes}; errors {tails}"
    rc, out = check_json(store, capsys)
    errors = [f for f in out["findings"] if f["severity"] == "error"]
    assert rc == 1
    assert [(f["kind"], f["culprits"]) for f in errors] == [("collective_mismatch", [2])], errors
    assert "EnforceNotMet" in errors[0]["message"], errors[0]["message"]
    aborted = [c for c in errors[0]["evidence"]["consequences"] if c["kind"] == "rank_crashed" and c.get("signal")]
    assert aborted and all(c["culprits"] != [2] for c in aborted), aborted
    assert not [f for f in out["findings"] if f["kind"] == "trace_incomplete"], out["findings"]


@pytest.mark.parametrize("cause", ["segfault", "sigkill"])
def test_two_ranks_dying_together_are_one_finding_naming_both(cause, tmp_path, capsys):
    """Ranks 1 and 2 of four die of the same cause after the same all_reduce: one finding
    names both (``together``: by host), the survivors' failures fold into it, and neither
    survivor is blamed."""
    store = str(tmp_path / "trace")
    counts = tmp_path / "counts"
    counts.mkdir()
    results = Job(W.dying_together, 4, args=(store, cause, str(counts)), env={"COMMSCOPE_JOB": "together"},
                  pg_timeout=30).start().join(90)
    assert results[1].exitcode != 0 and results[2].exitcode != 0, results
    kind, word = W.EXPECT[cause]
    rc, out = check_json(store, capsys)
    errors = [f for f in out["findings"] if f["severity"] == "error"]
    assert rc == 1
    assert [(f["kind"], f["culprits"]) for f in errors] == [(kind, [1, 2])], errors
    assert word in errors[0]["message"] and "ranks 1, 2 " in errors[0]["message"], errors[0]["message"]
    together = errors[0]["evidence"]["together"]
    assert together["first"] in (1, 2) and [sorted(rs) for rs in together["hosts"].values()] == [[1, 2]]
    assert all(not set(f["culprits"]) & {0, 3} for f in out["findings"]), out["findings"]
    assert not [f for f in out["findings"] if f["kind"] == "trace_incomplete"], out["findings"]
    model, _reader, _warnings = load_trace(store)
    assert isinstance(model, TraceModel)
    for r in (1, 2):
        own = int((counts / str(r)).read_text())
        assert model.n_ops(r) == own and model.ranks[r].dropped == 0, (r, own, model.n_ops(r))


#: A rank of the death matrix under a real launcher: ``mp.spawn`` (which SIGTERMs the ranks
#: left once one dies) or torchrun (its agent does the same; the rank reads its place from
#: the environment).  Either instruments inside the rank function (``death_workers.dying``).
LAUNCHED = """
import datetime, os, sys
import torch.distributed as dist
import death_workers as W

LAUNCHER, STORE, CAUSE, MOMENT, COUNT = sys.argv[1:6]

def worker(rank, port=None):
    init = f"tcp://127.0.0.1:{port}" if port else "env://"
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=30))
    W.dying(rank, 2, STORE, CAUSE, MOMENT, COUNT)

if __name__ == "__main__":
    if LAUNCHER == "spawn":
        import torch.multiprocessing as mp
        from commscope.launch import free_port
        mp.spawn(worker, args=(free_port(),), nprocs=2, join=True)
    else:
        worker(int(os.environ["RANK"]))
"""


def run_launched(launcher: str, cause: str, moment: str, recorder: str, tmp_path: Path) -> tuple[str, int]:
    """Run the two-rank job under ``launcher``; the store and rank 1's own count of ops."""
    import os
    import sys

    from procs import run_session

    script, store, count = tmp_path / "job.py", str(tmp_path / "trace"), tmp_path / "own-count"
    script.write_text(LAUNCHED)
    here = str(Path(__file__).parent)
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMMSCOPE_") or k == "COMMSCOPE_SPOOL_DIR"}
    env.update(COMMSCOPE_JOB="death", COMMSCOPE_SOURCE=recorder,
               PYTHONPATH=os.pathsep.join([here, str(Path(here).parent), env.get("PYTHONPATH", "")]))
    args = [str(script), launcher, store, cause, moment, str(count)]
    if launcher == "spawn":
        cmd = [sys.executable, *args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "--monitor-interval", "0.1", *args]
    proc = run_session(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=100)
    assert proc.returncode != 0, f"rank 1 did not die of {cause}: {proc.stderr[-3000:]}"
    return store, int(count.read_text())


#: The cells of the matrix under a launcher: the Python recorder under mp.spawn, killed and
#: crashed, at every moment; the native one where the other tests leave a launcher's cell
#: open; torchrun's rank SIGKILLed right after its last op, on both recorders
LAUNCHED_CELLS = [
    *[("spawn", cause, moment, "python") for cause in ("sigkill", "segfault", "exception", "os_exit")
      for moment in W.MOMENTS],
    *[("spawn", cause, moment, "native") for cause in ("sigkill", "segfault", "os_exit")
      for moment in ("after_init", "mid_run", "after_op")],
    ("torchrun", "sigkill", "after_op", "native"),
    ("torchrun", "sigkill", "after_op", "python"),
    ("torchrun", "segfault", "mid_run", "native"),
    ("torchrun", "exception", "after_init", "python"),
]


@pytest.mark.parametrize("launcher, cause, moment, recorder", LAUNCHED_CELLS)
def test_death_under_a_launcher(launcher, cause, moment, recorder, tmp_path, capsys):
    """The launcher stops the rank left (SIGTERM) once rank 1 died, and no commscope
    launcher sees rank 1's exit status: its spool is forwarded by rank 0's recorder or by
    ``check``.  The same exact finding, no victim, nothing lost."""
    store, own = run_launched(launcher, cause, moment, recorder, tmp_path)
    assert_diagnosed(store, cause, own, capsys, recorder, unseen=True, moment=moment)


@pytest.mark.parametrize("recorder", ["native", "python"])
def test_a_rank_that_left_through_os_exit_while_its_peer_waited_for_nobody_is_dead_rank(recorder, tmp_path, capsys):
    """Under mp.spawn, rank 1 leaves through ``os._exit(3)`` while rank 0 is between ops (or
    in the op rank 1 had entered asynchronously, on a loaded host: CI's
    ``[spawn-os_exit-mid_run-native]``); mp.spawn SIGTERMs rank 0.  No rank waited for rank
    1, so nothing said it went first: "no findings", exit 0.  It left before the SIGTERM
    came, and none reached it: the others were stopped because it went."""
    store, own = run_launched("spawn", "os_exit", "peer_idle", recorder, tmp_path)
    assert_diagnosed(store, "os_exit", own, capsys, recorder, unseen=True)


def test_a_rank_stopped_before_the_tick_after_its_first_op_blames_the_crash(tmp_path, capsys):
    """The native recorder told its tables a group's members at the first tick after the
    group's first op.  Rank 0, SIGTERMed before that tick (mp.spawn under load), left a spool
    whose block restated the world without members; its all_reduce, failed on rank 1's
    segfault right after init, was blamed on nobody: an ``op_failed`` with no culprit beside
    ``rank_crashed`` [1].  The world's members are in the tables once the spool is there."""
    store = str(tmp_path / "trace")
    count = tmp_path / "own-count"
    results = Job(W.failing_before_a_tick, 2, args=(store, str(count)), env={"COMMSCOPE_JOB": "untold"},
                  pg_timeout=30).start().join(60)
    assert (results[0].exitcode, results[1].exitcode) == (-15, -11), results
    assert_diagnosed(store, "segfault", int(count.read_text()), capsys, moment="after_init")
