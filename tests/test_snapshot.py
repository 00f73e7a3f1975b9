"""``commscope snapshot`` on real uninstrumented Gloo jobs (``commscope.bench.hungjob``).

Each job is started by a real launcher (plain processes with RANK/WORLD_SIZE, torchrun,
torch.multiprocessing.spawn), left to hang, and waited for by polling py-spy until every
rank is where the fault puts it; then the command runs as a user runs it and ``check
--json`` must name the exact kind and culprit and blame no victim.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from redis_fixture import *  # noqa: F403  (the redis_server and redis_url fixtures)

from commscope.bench import hungjob, snapshot
from commscope.launch import free_port
from commscope.snapshot import infer, procs, pyspy

WORKER = hungjob.__file__
assert os.path.samefile(snapshot.HUNGJOB, WORKER)  # (``bench snapshot`` runs it by path)
SETTLE_S = 180.0  # a generous bound on a loaded machine; the poll returns as soon as ranks are there


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COMMSCOPE_", "TORCH_FR", "RANK", "WORLD_SIZE",
                                                                       "LOCAL_", "MASTER_", "TORCHELASTIC"))}
    env["PYTHONUNBUFFERED"] = "1"
    return {**env, **(extra or {})}


class Launched:
    """A job's launcher processes; kills the whole tree on exit."""

    def __init__(self, popens: list[subprocess.Popen]):
        self.popens = popens

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.popens]

    def kill(self) -> None:
        for p in self.popens:
            try:
                kids = [k.pid for k in psutil.Process(p.pid).children(recursive=True)]
            except psutil.Error:
                kids = []
            for pid in [*kids, p.pid]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            p.wait()


@pytest.fixture
def jobs():
    started: list[Launched] = []

    def start(how: str, mode: str, world: int = 4, *, local_world: int | None = None, extra: dict | None = None,
              ranks: list[int] | None = None, args: tuple[str, ...] = (), wrapped: bool = False) -> Launched:
        port = free_port()
        if how == "env":
            ps = []
            for r in (ranks if ranks is not None else range(world)):
                lw = local_world or world
                e = _env({"RANK": str(r), "WORLD_SIZE": str(world), "LOCAL_RANK": str(r % lw),
                          "LOCAL_WORLD_SIZE": str(lw), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                          **(extra or {})})
                ps.append(subprocess.Popen([sys.executable, WORKER, mode, *args], env=e, stdout=subprocess.DEVNULL,
                                           stderr=subprocess.DEVNULL))
            job = Launched(ps)
        elif how == "torchrun":
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(world),
                   "--master-addr", "127.0.0.1", "--master-port", str(port), WORKER, mode]
            if wrapped:  # (a shell above the launcher, as ``commscope run`` is: not exec'd)
                cmd = ["bash", "-c", shlex.join(cmd) + "; exit $?"]
            job = Launched([subprocess.Popen(cmd, env=_env(extra), stdout=subprocess.DEVNULL,
                                             stderr=subprocess.DEVNULL)])
        else:
            e = _env({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), **(extra or {})})
            job = Launched([subprocess.Popen([sys.executable, WORKER, "--spawn", str(world), mode], env=e,
                                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)])
        started.append(job)
        return job

    yield start
    for job in started:
        job.kill()


def where(threads: list[pyspy.PyThread]) -> str | None:
    """The op a rank is inside, else the innermost frame of the job's own file."""
    op = infer.in_flight(threads)
    if op is not None:
        return op.op
    for t in threads:
        for f in reversed(t.frames):
            if f.file.endswith("hungjob.py") and f.func != "<module>":
                return f.func
    return None


def settle(launched: Launched, expect: dict[int, str | None]) -> None:
    """Poll until the job's ranks are where ``expect`` says (rank -> op or function; None:
    the rank's process is gone)."""
    deadline = time.monotonic() + SETTLE_S
    last = None
    while time.monotonic() < deadline:
        found = procs.find(launched.pids)
        ranks = {p.rank: p.pid for j in found.jobs for p in j.ranks}
        state: dict[int, str | None] = {}
        for r, pid in ranks.items():
            try:
                state[r] = where(pyspy.dump(pid, locals_=True))
            except pyspy.DumpError:
                state[r] = "?"
        ok = all((r not in ranks) if w is None else state.get(r) == w for r, w in expect.items())
        if ok:
            return
        last = state
        time.sleep(0.2)
    raise AssertionError(f"the job never settled: expected {expect}, last seen {last}")


def snapshot(*args: str, env: dict | None = None, prefix: list[str] | None = None) -> subprocess.CompletedProcess:
    cmd = [*(prefix or []), sys.executable, "-m", "commscope", "snapshot", "--interval", "0.3", "--count", "2", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=_env(env))


def taken(store: Path | str, job: Launched | None, *extra: str) -> str:
    """``commscope snapshot --out STORE [--pid <the job's pids>] EXTRA...``, which must succeed:
    its output."""
    pids = ["--pid", *map(str, job.pids)] if job is not None else []
    out = snapshot("--out", str(store), *pids, *extra)
    assert out.returncode == 0, out.stderr
    return out.stdout


def check(store: Path | str) -> dict:
    out = subprocess.run([sys.executable, "-m", "commscope", "check", str(store), "--json"], capture_output=True,
                         text=True, timeout=300, env=_env())
    assert out.returncode in (0, 1), out.stderr
    return json.loads(out.stdout)


def errors(report: dict) -> list[dict]:
    return [f for f in report["findings"] if f["severity"] == "error"]


def one_error(report: dict, kind: str, culprits: list[int]) -> dict:
    errs = errors(report)
    assert [(f["kind"], f["culprits"]) for f in errs] == [(kind, culprits)], [f["message"] for f in errs]
    f = errs[0]
    assert "snapshot" in f["message"]
    return f


# ---------------------------------------------------------------------- the faults
def test_a_rank_spinning_in_python_is_the_missing_rank_with_its_frame(jobs, tmp_path):
    job = jobs("torchrun", "missing")
    settle(job, {0: "all_reduce", 1: "all_reduce", 2: "spin", 3: "all_reduce"})
    out = taken(tmp_path / "s", job)
    assert "4 of 4 ranks" in out and "torchrun" in out
    f = one_error(check(tmp_path / "s"), "missing_ranks", [2])
    assert f["seq"] is None and f["op"] == "all_reduce" and f["group"] == "0"
    assert "spin" in f["message"] and "% CPU" in f["message"]  # where it is instead, and busy
    # (the wait began before the samples: "waited up to 2.0 s" said less than it was, helper-203)
    assert re.search(r"rank\(s\) 0, 1, 3 entered and waited at least \d+\.\d s;", f["message"]), f["message"]
    culprit = f["evidence"]["stacks"]["2"][0]
    assert culprit["where"].endswith("in spin")
    assert f["evidence"]["entered"] == [0, 1, 3] and f["evidence"]["missing"] == [2]


def test_a_rank_sleeping_in_a_data_loader_under_spawn(jobs, tmp_path):
    job = jobs("spawn", "loader")
    settle(job, {0: "all_reduce", 1: "SlowDataset.__getitem__", 2: "all_reduce", 3: "all_reduce"})
    out = taken(tmp_path / "s", job)
    assert "spawn" in out and "4 of 4 ranks" in out
    f = one_error(check(tmp_path / "s"), "missing_ranks", [1])
    assert "__getitem__" in f["evidence"]["stacks"]["1"][0]["where"]


def test_ranks_in_different_collectives_are_a_mismatch(jobs, tmp_path):
    job = jobs("env", "mismatch")
    settle(job, {0: "all_reduce", 1: "all_reduce", 2: "all_reduce", 3: "broadcast"})
    taken(tmp_path / "s", job)
    f = one_error(check(tmp_path / "s"), "collective_mismatch", [3])
    assert f["seq"] is None


def test_a_p2p_cycle_is_named_and_the_barrier_behind_it_is_its_consequence(jobs, tmp_path):
    job = jobs("env", "cycle")
    settle(job, {0: "recv", 1: "recv", 2: "barrier", 3: "barrier"})
    taken(tmp_path / "s", job)
    f = one_error(check(tmp_path / "s"), "p2p_deadlock", [0, 1])
    assert [c["kind"] for c in f["evidence"]["consequences"]] == ["missing_ranks"]


def test_a_ranks_environment_secret_is_hidden_though_the_snapshot_never_had_it(jobs, tmp_path):
    """A rank's argv holding its $WANDB_API_KEY's value (no token shape: 40 hex digits): its
    own recorder hides it (it knows its environment), but ``snapshot``, run from another
    shell, wrote it whole into every rank's meta (helper-123)."""
    secret = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c"
    assert secret not in os.environ.values()
    job = jobs("env", "cycle", world=2, extra={"WANDB_API_KEY": secret}, args=("--run", secret))
    settle(job, {0: "recv", 1: "recv"})
    taken(tmp_path / "s", job)
    for path in (tmp_path / "s").rglob("*"):
        assert not path.is_file() or secret.encode() not in path.read_bytes(), path
    metas = [json.loads(line) for path in (tmp_path / "s").rglob("rank-*.jsonl")
             for line in path.read_text().splitlines() if '"type":"meta"' in line]
    assert len(metas) == 2 and all(m["argv"][-2:] == ["--run", "***"] for m in metas)
    one_error(check(tmp_path / "s"), "p2p_deadlock", [0, 1])


def test_a_dead_rank_is_the_one_culprit(jobs, tmp_path):
    job = jobs("env", "dead")
    settle(job, {3: None, 1: "all_reduce"})
    # (the whole host is looked at: with --pid, ranks not given are not called gone)
    out = taken(tmp_path / "s", None, "--job-pid", str(job.pids[0]))
    assert "3 of 4 ranks" in out and "gone: rank(s) 3" in out
    report = check(tmp_path / "s")
    f = one_error(report, "dead_rank", [3])
    assert "gone" in f["message"]
    assert report["ranks"] == 4
    assert "pid" not in f["evidence"] and f["evidence"]["host"]  # (gone before it was read: its pid not known)
    drawn = subprocess.run([sys.executable, "-m", "commscope", "check", str(tmp_path / "s")], capture_output=True,
                           text=True, timeout=300, env=_env()).stdout
    assert "host  " in drawn and "None" not in drawn, drawn  # (it drew "host / pid  h / None")


def test_flight_recorder_dumps_give_sequence_numbers(jobs, tmp_path):
    prefix = str(tmp_path / "fr_")
    job = jobs("env", "flight", extra={"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_FR_DUMP_TEMP_FILE": prefix})
    settle(job, {0: "all_reduce", 1: "all_reduce", 2: "spin", 3: "all_reduce"})
    deadline = time.monotonic() + SETTLE_S
    while not all(os.path.exists(f"{prefix}{r}") for r in range(4)) and time.monotonic() < deadline:
        time.sleep(0.2)
    out = taken(tmp_path / "s", job)
    assert "Flight Recorder dumps of 4 rank(s) read (4 from dump files)" in out
    f = one_error(check(tmp_path / "s"), "missing_ranks", [2])
    assert f["seq"] == 2 and "Flight Recorder" in f["message"]  # the job's first all_reduce was #1


def test_torchs_debug_server_gives_sequence_numbers(jobs, tmp_path):
    """A job running torch.distributed.debug's server: each rank's buffer comes from it."""
    job = jobs("env", "debugserver", extra={"TORCH_FR_BUFFER_SIZE": "2000", "DEBUG_PORT": str(free_port())})
    settle(job, {0: "all_reduce", 1: "all_reduce", 2: "spin", 3: "all_reduce"})
    out = taken(tmp_path / "s", job)
    assert "4 of 4 ranks" in out  # (not the frontend rank 0 starts: it has rank 0's environment)
    assert "Flight Recorder dumps of 4 rank(s) read (4 from torch's debug server)" in out
    f = one_error(check(tmp_path / "s"), "missing_ranks", [2])
    assert f["seq"] == 2 and "Flight Recorder" in f["message"]


def test_a_snapshot_into_redis(jobs, redis_url):
    """Redis when given: nodes without a shared filesystem write one snapshot there."""
    job = jobs("env", "mismatch")
    settle(job, {0: "all_reduce", 1: "all_reduce", 2: "all_reduce", 3: "broadcast"})
    out = taken(redis_url, job)
    assert "ERROR collective_mismatch" in out
    one_error(check(redis_url), "collective_mismatch", [3])


# ---------------------------------------------------------------------- jobs and hosts
def test_two_jobs_on_one_host_ask_which(jobs, tmp_path):
    a, b = jobs("env", "cycle", 2), jobs("env", "cycle", 2)
    settle(a, {0: "recv", 1: "recv"})
    settle(b, {0: "recv", 1: "recv"})
    pids = [*a.pids, *b.pids]
    out = snapshot("--out", str(tmp_path / "s"), "--pid", *map(str, pids))
    assert out.returncode == 2
    assert "2 jobs on this host" in out.stderr and "--job-pid" in out.stderr
    taken(tmp_path / "s", None, "--pid", *map(str, pids), "--job-pid", str(b.pids[1]))
    report = check(tmp_path / "s")
    one_error(report, "p2p_deadlock", [0, 1])
    events = [json.loads(x) for p in (tmp_path / "s").rglob("rank-*.jsonl") for x in p.read_text().splitlines()]
    assert {e["pid"] for e in events if e["type"] == "meta"} == set(b.pids)


def test_job_pid_takes_the_process_that_started_a_job_and_the_list_of_jobs_fits_80_columns(jobs, tmp_path):
    """``--job-pid`` of a process above a job's launcher (``commscope run`` above torchrun, a
    shell script) takes that job; one above several jobs is refused, naming a pid of each.
    The list of jobs to choose from fits 80 columns.  Before, --job-pid refused the
    ``commscope run`` process (helper-171), and each job's line ran past 80 columns."""
    a, b = jobs("env", "cycle", 2), jobs("torchrun", "cycle", 2, wrapped=True)
    settle(a, {0: "recv", 1: "recv"})
    settle(b, {0: "recv", 1: "recv"})
    pids = [*a.pids, *b.pids]
    for extra, said in (([], "2 jobs on this host"), (["--job-pid", str(os.getpid())], "started 2 of the")):
        out = snapshot("--out", str(tmp_path / "x"), "--pid", *map(str, pids), *extra)
        assert out.returncode == 2 and said in out.stderr, out.stderr
        assert max(map(len, out.stderr.splitlines())) <= 80, out.stderr
    taken(tmp_path / "s", None, "--pid", *map(str, pids), "--job-pid", str(b.pids[0]))
    one_error(check(tmp_path / "s"), "p2p_deadlock", [0, 1])
    events = [json.loads(x) for p in (tmp_path / "s").rglob("rank-*.jsonl") for x in p.read_text().splitlines()]
    ranks = {k.pid for k in psutil.Process(b.pids[0]).children(recursive=True)}
    assert {e["pid"] for e in events if e["type"] == "meta"} <= ranks and not set(a.pids) & ranks


def test_two_hosts_add_their_ranks_to_one_snapshot(jobs, tmp_path):
    """Two nodes of two ranks each (LOCAL_WORLD_SIZE 2), snapshotted one after the other
    into one store: the first half names nobody, the whole names the culprit."""
    first = jobs("env", "missing", 4, local_world=2, ranks=[0, 1])
    master = psutil.Process(first.pids[0]).environ()["MASTER_PORT"]
    second = Launched([subprocess.Popen([sys.executable, WORKER, "missing"], env=_env(
        {"RANK": str(r), "WORLD_SIZE": "4", "LOCAL_RANK": str(r - 2), "LOCAL_WORLD_SIZE": "2",
         "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": master}), stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL) for r in (2, 3)])
    try:
        settle(first, {0: "all_reduce", 1: "all_reduce"})
        settle(second, {2: "spin", 3: "all_reduce"})
        store = tmp_path / "s"
        out = taken(store, first, "--id", "two-hosts")
        assert "rank(s) 2-3 are on other hosts" in out
        half = check(store)
        assert errors(half) == []  # nobody blamed for ranks no snapshot saw
        assert [(f["kind"], f["culprits"]) for f in half["findings"]] == [("trace_incomplete", [2, 3])]
        taken(store, second, "--id", "two-hosts")
        one_error(check(store), "missing_ranks", [2])
    finally:
        second.kill()


def test_without_permission_it_says_what_to_do(tmp_path):
    """A rank this user may not read (another user's, or one that is not dumpable): exit 2."""
    env = _env({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"})
    code = "import ctypes, time; ctypes.CDLL(None).prctl(4, 0, 0, 0, 0); print('ok', flush=True); time.sleep(600)"
    target = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert target.stdout.readline().strip() == "ok"
        # root may read anything: drop its capabilities, as a plain user has none
        prefix = ["setpriv", "--bounding-set=-all", "--inh-caps=-all", "--"] if os.geteuid() == 0 else []
        assert os.geteuid() != 0 or shutil.which("setpriv"), "setpriv (util-linux) is needed to drop root's capabilities"
        out = snapshot("--out", str(tmp_path / "s"), "--pid", str(target.pid), prefix=prefix)
        assert out.returncode == 2, out.stdout + out.stderr
        assert "not readable" in out.stderr and "CAP_SYS_PTRACE" in out.stderr and str(target.pid) in out.stderr
        assert not (tmp_path / "s").exists()
    finally:
        target.kill()
        target.wait()


def test_no_job_and_bad_arguments_are_clear_errors(tmp_path):
    out = snapshot("--out", str(tmp_path / "s"), "--pid", str(os.getpid()))
    assert out.returncode == 2 and "no torch.distributed job found" in out.stderr
    out = snapshot("--count", "0")
    assert out.returncode == 2 and "--count" in out.stderr


def _snapshot_with(job: Launched, store: Path, act) -> tuple:
    """A snapshot of 3 samples of ``job`` by ``Snapshotter``, ``act(ranks)`` called once the
    first round is taken (rank -> pid); (the Job, the cycle)."""
    from commscope.snapshot.take import Snapshotter

    found = procs.find(job.pids).jobs[0]
    pids = {p.rank: p.pid for p in found.ranks}
    snap = Snapshotter(found, str(store), "j", count=3, interval=0.3, native=False, use_flight=False)

    def progress(done: int, total: int) -> None:
        if done == len(pids):
            act(pids)

    try:
        return found, snap.cycle(progress)
    finally:
        snap.close()


def _until_state(pid: int, states: tuple) -> None:
    deadline = time.monotonic() + SETTLE_S
    while pyspy.process_state(pid) not in states:
        assert time.monotonic() < deadline, pyspy.process_state(pid)
        time.sleep(0.01)


def test_a_rank_killed_while_the_snapshot_looks_is_the_dead_rank(jobs, tmp_path, capsys):
    """Read at the first sample, then SIGKILLed (a zombie of its launcher after): it was written
    as in no collective, and the job read healthy (helper-171)."""
    from commscope.commands.snapshot import summary

    job = jobs("env", "missing-caught")
    settle(job, {0: "all_reduce", 1: "all_reduce", 2: "spin", 3: "all_reduce"})

    def kill(pids: dict[int, int]) -> None:
        os.kill(pids[2], signal.SIGKILL)
        _until_state(pids[2], ("Z", "X", None))

    found, cycle = _snapshot_with(job, tmp_path / "s", kill)
    assert cycle.gone == [2] and 2 not in cycle.failed
    summary(found, cycle, str(tmp_path / "s"), "j", 0.6)
    out = " ".join(capsys.readouterr().out.split())  # (wrapped at 80 columns)
    pid = next(p.pid for p in found.ranks if p.rank == 2)
    assert f"rank 2 pid {pid} gone: its process ended while the snapshot looked" in out, out
    report = check(tmp_path / "s")
    f = one_error(report, "dead_rank", [2])
    assert "gone" in f["message"]
    stacks = [json.loads(line) for line in (tmp_path / "s" / "j" / "rank-00002.jsonl").read_text().splitlines()
              if '"type":"stack"' in line]
    assert len(stacks) == 1 and "spin" in json.dumps(stacks[0])  # (where it was when last read)


def test_a_victim_stopped_while_the_snapshot_looks_is_unread_and_the_culprit_still_named(jobs, tmp_path, capsys):
    """Rank 0 waits in the all_reduce, read at the first sample, then stopped (SIGSTOP: a
    debugger, Ctrl-Z): it read as having left the collective, which made the job look as if
    it went on, and the spinning rank 2 was not named (helper-171)."""
    from commscope.commands.snapshot import summary

    job = jobs("env", "missing")
    settle(job, {0: "all_reduce", 1: "all_reduce", 2: "spin", 3: "all_reduce"})

    def stop(pids: dict[int, int]) -> None:
        os.kill(pids[0], signal.SIGSTOP)
        _until_state(pids[0], ("T",))

    found, cycle = _snapshot_with(job, tmp_path / "s", stop)
    assert set(cycle.failed) == {0} and cycle.failed[0].kind == pyspy.STOPPED and cycle.ops[0].op == "all_reduce"
    summary(found, cycle, str(tmp_path / "s"), "j", 0.6)
    out = " ".join(capsys.readouterr().out.split())  # (wrapped at 80 columns)
    assert "is stopped (SIGSTOP, Ctrl-Z or a debugger holds it)" in out and "(last seen in all_reduce" in out, out
    report = check(tmp_path / "s")
    errs = sorted((f["kind"], f["culprits"]) for f in errors(report))
    assert errs == [("missing_ranks", [2]), ("trace_incomplete", [0])], [f["message"] for f in errors(report)]
    unread = next(f for f in errors(report) if f["kind"] == "trace_incomplete")
    assert "kill -CONT" in unread["message"]


# ---------------------------------------------------------------------- attach --pid
def test_attach_pid_follows_the_job_through_repeated_snapshots(jobs, tmp_path):
    """The console on ``attach --pid``'s source: cycle after cycle, one finding, the right culprit."""
    from tui_scenarios import drive

    from commscope.analysis.source import open_source
    from commscope.snapshot.take import Repeating, Snapshotter
    from commscope.tui.app import CommscopeApp
    from commscope.tui.feed import LIVE, Feed

    job = jobs("env", "missing")
    settle(job, {0: "all_reduce", 1: "all_reduce", 2: "spin", 3: "all_reduce"})
    found = procs.find(job.pids)
    snap = Snapshotter(found.jobs[0], str(tmp_path / "live"), "live", count=2, interval=0.3)
    loop = Repeating(snap).start()
    app = CommscopeApp(Feed(open_source(tmp_path / "live", wait=True), mode=LIVE, source="live"), bell=False)

    def judged() -> list:
        return [(f.kind, f.culprits) for f in app.findings if f.severity == "error"]

    async def check(pilot):
        deadline = time.monotonic() + SETTLE_S
        while not (snap.cycles >= 3 and app.info.events and judged() == [("missing_ranks", [2])]):
            assert time.monotonic() < deadline, (snap.cycles, judged())
            await pilot.pause(0.1)
        assert [row.key for row in app.timeline.rows] == ["r0", "r1", "r2", "r3"]
        await pilot.press("q")

    try:
        drive(app, check, loaded=False)
    finally:
        loop.stop()
    assert loop.error is None


def test_attach_pid_without_a_job_is_a_clear_error(tmp_path):
    out = subprocess.run([sys.executable, "-m", "commscope", "attach", "--pid", str(os.getpid())],
                         capture_output=True, text=True, timeout=120, env=_env())
    assert out.returncode == 2 and "no torch.distributed job found" in out.stderr


# ---------------------------------------------------------------------- reading frames (pure)
def _frame(func: str, file: str, line: int = 1, **locs: str) -> pyspy.PyFrame:
    return pyspy.PyFrame(func, file, line, tuple(pyspy.Local(k, v, True) for k, v in locs.items()))


C10D = "/site-packages/torch/distributed/distributed_c10d.py"
LOGGER = "/site-packages/torch/distributed/c10d_logger.py"


def _thread(*frames: pyspy.PyFrame) -> list[pyspy.PyThread]:
    return [pyspy.PyThread(7, "MainThread", False, False, tuple(frames))]


def test_the_group_is_the_default_only_when_the_call_passed_none():
    user = _frame("step", "/job/train.py", 42)

    def op(args: str, kwargs: str) -> infer.InFlight | None:
        wrapper = pyspy.PyFrame("_exception_logger.<locals>.wrapper", LOGGER, 83, (
            pyspy.Local("args", args, True), pyspy.Local("kwargs", kwargs, True)))
        return infer.in_flight(_thread(user, wrapper, _frame("all_reduce", C10D, tensor="<Tensor at 0x1>",
                                                             op="<RedOpType at 0x2>", group="<ProcessGroup at 0x3>",
                                                             async_op="False")))

    assert op("(<Tensor at 0x1>)", "{}").group == "0"
    assert op("(<Tensor at 0x1>, <RedOpType at 0x2>, None)", "{}").group == "0"
    assert op("(<Tensor at 0x1>)", '{"group": None}').group == "0"
    assert op("(<Tensor at 0x1>, <RedOpType at 0x2>, <ProcessGroup at 0x3>)", "{}").group is None
    assert op("(<Tensor at 0x1>)", '{"group": <ProcessGroup at 0x3>, "async_op": False}').group is None
    assert op("([<Tensor at 0x1>, ...], ...)", "{}").group is None  # py-spy shortened the arguments
    assert op("(<Tensor at 0x1>)", "{...}").group is None
    got = op("(<Tensor at 0x1>)", "{}")
    assert got.site == "/job/train.py:42 in step" and got.op == "all_reduce" and got.peer is None


def test_peers_roots_and_the_outermost_op():
    user = _frame("step", "/job/train.py", 9)
    recv = infer.in_flight(_thread(user, _frame("recv", C10D, tensor="<Tensor at 0x1>", src="3", group="None")))
    assert (recv.op, recv.direction, recv.peer) == ("recv", "recv", 3)
    anyone = infer.in_flight(_thread(user, _frame("recv", C10D, tensor="<Tensor at 0x1>", src="None")))
    assert anyone.peer is None
    bcast = infer.in_flight(_thread(user, _frame("broadcast", C10D, tensor="<Tensor at 0x1>", src="5")))
    assert (bcast.root, bcast.peer, bcast.direction) == (5, None, None)
    nested = infer.in_flight(_thread(user, _frame("all_gather_object", C10D, object_list="[]", obj="1"),
                                     _frame("all_gather", C10D, tensor_list="[]", tensor="<Tensor at 0x1>")))
    assert nested.op == "all_gather_object"
    assert infer.in_flight(_thread(user, _frame("all_reduce", "/job/mine.py"))) is None  # not torch's


def test_split_items_reads_pyspy_tuples():
    assert infer.split_items("(<Tensor at 0x1>, 3, None)") == ["<Tensor at 0x1>", "3", "None"]
    assert infer.split_items("('a, b', [1, 2], {\"k\": 1})") == ["'a, b'", "[1, 2]", '{"k": 1}']
    assert infer.split_items("()") == [] and infer.split_items("nonsense") == []


def test_pyspy_errors_are_classified():
    assert pyspy.classify("Error: Permission Denied (os error 13)", os.getpid()) == pyspy.PERMISSION
    assert pyspy.classify("Error: Operation not permitted (os error 1)", os.getpid()) == pyspy.PERMISSION
    assert pyspy.classify("Error: No such process (os error 3)", 2 ** 22 + 1) == pyspy.GONE
    assert pyspy.classify("Error: something else", os.getpid()) == pyspy.FAILED
    with pytest.raises(pyspy.DumpError) as exc:
        pyspy.dump(os.getpid(), exe="/nonexistent/py-spy")
    assert exc.value.kind == pyspy.MISSING


def test_cycles_after_a_flight_recorder_one_reuse_no_op_id(tmp_path):
    """The first cycle writes each rank's Flight Recorder entries (ids: record ids + 1), the
    later ones the op each rank's stack shows: their ids lie apart (``take.OP_IDS``), so the
    trace reads as one whose ids never repeat, not as a damaged one (``analysis/opids``)."""
    from commscope.analysis.source import load_trace
    from commscope.snapshot.flight import Found
    from commscope.snapshot.take import OP_IDS, Sample, Snapshotter

    ranks = [procs.RankProcess(pid=os.getpid(), rank=r, world_size=2, local_rank=r, launcher="env", job="k",
                               argv=("train.py",), user=None, create_time=0.0) for r in (0, 1)]
    snap = Snapshotter(procs.Job("k", "env", 2, ranks, [0, 1]), str(tmp_path / "s"), "j", count=1, native=False)
    t = time.time_ns()
    fr = {r: [{"v": 3, "type": "op", "rank": r, "ts": t - 10**9, "id": i, "phase": "begin", "op": "all_reduce",
               "group": "0", "seq": i} for i in (1, 2, 3)] for r in (0, 1)}
    stuck = infer.InFlight("all_reduce", "0", None, None, None, "train.py:3 in step", 7, False)
    for k in (1, 2, 3):
        snap.cycles = k
        samples = {r: [Sample(t + k, _thread(_frame("step", "/job/train.py", 3)), None, stuck, None, None)]
                   for r in (0, 1)}
        snap._write(k, t + k, t + k + 1, samples, Found(fr, "read") if k == 1 else None)
    snap.close()
    model, _, warnings = load_trace(tmp_path / "s")
    assert model.reused == {} and not any("reused" in w for w in warnings)
    assert model.ranks[0].id[:model.ranks[0].n].tolist() == [1, 2, 3, OP_IDS + 2, OP_IDS + 3]


# ---------------------------------------------------------------------- judging samples (synthetic, pure)
TORCH = "/venv/lib/python3.11/site-packages/torch"
#: a CPU DDP rank blocked at the end of backward, as py-spy --native shows it
REDUCER_WAIT = ("torch::autograd::Engine::execute", "torch::autograd::GraphTask::exec_post_processing",
                "c10d::Reducer::finalize_backward", "std::condition_variable::wait", "pthread_cond_wait")


def _native(*funcs: str) -> list[pyspy.PyFrame]:
    return [pyspy.PyFrame(f, f"{TORCH}/lib/libtorch_cpu.so", 0, native=True) for f in funcs]


def _backward(*native: str, line: int = 16) -> list[pyspy.PyThread]:
    """A rank inside ``loss.backward()`` at ddp.py:``line`` (native frames: ``native``)."""
    return _thread(_frame("<module>", "/job/ddp.py", line), _frame("Tensor.backward", f"{TORCH}/_tensor.py", 623),
                   _frame("backward", f"{TORCH}/autograd/__init__.py", 395),
                   _frame("_engine_run_backward", f"{TORCH}/autograd/graph.py", 979), *_native(*native))


def _at(line: int, *native: str, file: str = "/job/train.py") -> list[pyspy.PyThread]:
    return _thread(_frame("<module>", file, line), *_native(*native))


def _in_all_reduce(line: int = 7) -> list[pyspy.PyThread]:
    return _thread(_frame("<module>", "/job/train.py", line), _frame("all_reduce", C10D, tensor="<Tensor at 0x1>"))


def _judge(tmp_path: Path, rounds: dict[int, list], interval: float = 0.2) -> list:
    """Findings of a snapshot whose samples are ``rounds`` (rank -> per sample, its threads or
    the DumpError py-spy gave), written as ``commscope snapshot`` writes them."""
    from commscope.analysis.diagnose import diagnose
    from commscope.analysis.source import load_trace
    from commscope.snapshot.take import Sample, Snapshotter

    world, count = len(rounds), len(next(iter(rounds.values())))
    ranks = [procs.RankProcess(pid=os.getpid(), rank=r, world_size=world, local_rank=r, launcher="env", job="k",
                               argv=("train.py",), user=None, create_time=0.0) for r in range(world)]
    snap = Snapshotter(procs.Job("k", "env", world, ranks, list(range(world))), str(tmp_path / "s"), "j",
                       count=count, interval=interval, native=False, use_flight=False)
    t = time.time_ns()
    ts = [t + int(i * interval * 1e9) for i in range(count)]
    samples = {r: [Sample(ts[i], None, x, None, None, None) if isinstance(x, pyspy.DumpError)
                   else Sample(ts[i], x, None, infer.in_flight(x), 1.0, 1 << 20) for i, x in enumerate(ss)]
               for r, ss in rounds.items()}
    snap._write(1, ts[0], ts[-1], samples, None)
    snap.close()
    model, _, _ = load_trace(tmp_path / "s")
    return diagnose(model)


def _errors_of(findings: list) -> list[tuple[str, list[int]]]:
    return [(f.kind, f.culprits) for f in findings if f.severity == "error"]


def test_ddps_reducer_waiting_under_backward_is_an_all_reduce_of_the_default_group():
    op = infer.in_flight(_backward(*REDUCER_WAIT))
    assert (op.op, op.group, op.site, op.via) == ("all_reduce", "0", "/job/ddp.py:16 in <module>", infer.DDP_REDUCER)
    work = infer.in_flight(_backward("c10d::Reducer::finalize_backward", "c10d::ProcessGroupGloo::AsyncWork::wait"))
    assert work is not None and work.op == "all_reduce"
    assert infer.in_flight(_backward()) is None  # Python frames alone: computing or waiting, not told
    assert infer.in_flight(_backward("torch::autograd::Engine::evaluate_function", "at::addmm")) is None
    assert infer.in_flight(_at(14, "c10d::Reducer::finalize_backward", "pthread_cond_wait")) is None  # not in backward


def test_a_ddp_rank_that_skipped_backward_is_the_missing_rank(tmp_path):
    """Native frames come at the last sample only: the samples before it that show the same
    backward call are the same wait."""
    waiting = [_backward(), _backward(), _backward(*REDUCER_WAIT)]
    sleeping = [_at(14, file="/job/ddp.py"), _at(14, file="/job/ddp.py"), _at(14, "time_sleep", file="/job/ddp.py")]
    found = _judge(tmp_path, {0: waiting, 1: sleeping, 2: waiting})
    assert _errors_of(found) == [("missing_ranks", [1])]
    f = found[0]
    assert f.op == "all_reduce" and f.group == "0" and f.seq is None and "ddp.py:14" in f.message


def test_without_native_frames_backward_says_no_collective(tmp_path):
    found = _judge(tmp_path, {0: [_backward()] * 3, 1: [_at(14, file="/job/ddp.py")] * 3, 2: [_backward()] * 3})
    assert found == []


def test_a_ddp_rank_still_computing_backward_is_not_missing(tmp_path):
    waiting = [_backward(), _backward(), _backward(*REDUCER_WAIT)]
    computing = [_backward(), _backward(), _backward("torch::autograd::Engine::evaluate_function", "at::addmm")]
    assert _errors_of(_judge(tmp_path, {0: waiting, 1: computing, 2: waiting})) == []


def test_a_ddp_rank_stuck_in_a_backward_hook_is_the_missing_rank(tmp_path):
    """(helper-71) Rank 1 sat in one Python hook inside backward at every sample, its last
    native frame a lock wait: "inside backward" was taken as going through DDP's all_reduce,
    and the hung job read healthy.  A rank whose last sample shows autograd computing, or
    computing on OpenMP's workers, is still on its way."""
    hook = _thread(*_backward()[0].frames, _frame("hook", "/job/ddp.py", 30))[0].frames
    stuck = [_thread(*hook)] * 2 + [_thread(*hook, *_native("PyFunctionTensorPostAccGradHooks", "__lll_lock_wait"))]
    waiting = [_backward(), _backward(), _backward(*REDUCER_WAIT)]
    found = _judge(tmp_path / "stuck", {0: waiting, 1: stuck, 2: waiting})
    assert _errors_of(found) == [("missing_ranks", [1])] and "ddp.py:30 in hook" in found[0].message
    for inner in ("at::addmm", "gomp_barrier_wait_end", "__kmp_wait_template"):
        computing = [_backward(), _backward(), _backward("torch::autograd::Engine::evaluate_function", inner)]
        assert _errors_of(_judge(tmp_path / inner, {0: waiting, 1: computing, 2: waiting})) == [], inner


def test_a_snapshot_that_read_no_rank_is_an_error(tmp_path):
    """(helper-71) py-spy could read no rank: only a trace_incomplete warning, and check
    exited 0 over ranks it had not read."""
    denied = pyspy.DumpError(pyspy.PERMISSION, "Operation not permitted (os error 1)")
    found = _judge(tmp_path, {0: [denied] * 3, 1: [denied] * 3})
    assert _errors_of(found) == [("trace_incomplete", [0, 1])] and "ptrace" in found[0].message


def test_a_rank_seen_going_through_the_collective_is_not_missing(tmp_path):
    """healthy_ar: ranks 0 and 1 in all_reduce at every sample, rank 2 in it at all but the last."""
    work = _at(9)
    assert _errors_of(_judge(tmp_path / "a", {0: [_in_all_reduce()] * 3, 1: [_in_all_reduce()] * 3,
                                              2: [_in_all_reduce(), _in_all_reduce(), work]})) == []
    assert _errors_of(_judge(tmp_path / "b", {0: [_in_all_reduce()] * 3, 1: [_in_all_reduce()] * 3,
                                              2: [_in_all_reduce(), work, work]})) == []
    # before the call's line at one sample, after it at the next: it went through
    assert _errors_of(_judge(tmp_path / "c", {0: [_in_all_reduce()] * 3, 1: [_in_all_reduce()] * 3,
                                              2: [_at(5), _at(9), _at(9)]})) == []
    # outside it at every sample (and not moving past it): hung
    assert _errors_of(_judge(tmp_path / "d", {0: [_in_all_reduce()] * 3, 1: [_in_all_reduce()] * 3,
                                              2: [work, _at(9), _at(5)]})) == [("missing_ranks", [2])]


def test_a_rank_read_then_gone_or_unread_is_said_so(tmp_path):
    """Samples read, then not: gone (its process ended) is a dead rank; unread (py-spy failing)
    keeps the op it was last seen inside and is an error, never healthy (helper-171)."""
    gone = pyspy.DumpError(pyspy.GONE, "No such process")
    spinning = [_at(14)] * 3
    waited = [_in_all_reduce(), _in_all_reduce(), _at(20)]  # (its all_reduce failed: it went on to sleep)
    assert _errors_of(_judge(tmp_path / "dead", {0: waited, 1: waited, 2: [_at(14), _at(14), gone]})) == [
        ("dead_rank", [2])]
    failing = pyspy.DumpError(pyspy.FAILED, "Failed to get stack traces")
    found = _judge(tmp_path / "unread", {0: [_in_all_reduce(), _in_all_reduce(), failing],
                                         1: [_in_all_reduce()] * 3, 2: spinning})
    assert sorted(_errors_of(found)) == [("missing_ranks", [2]), ("trace_incomplete", [0])]


def test_a_rank_unread_at_a_whole_later_cycle_stays_in_the_op_it_was_last_read_in(tmp_path):
    """``attach --pid``: rank 0 read in the all_reduce, then stopped for good.  At the next
    cycle every sample of it failed, its op ended there, and the stopped victim was named
    missing beside the culprit (helper-174)."""
    from commscope.analysis.diagnose import diagnose
    from commscope.analysis.source import load_trace
    from commscope.snapshot.take import Sample, Snapshotter

    world, count, interval = 3, 3, 0.2
    ranks = [procs.RankProcess(pid=os.getpid(), rank=r, world_size=world, local_rank=r, launcher="env", job="k",
                               argv=("train.py",), user=None, create_time=0.0) for r in range(world)]
    snap = Snapshotter(procs.Job("k", "env", world, ranks, list(range(world))), str(tmp_path / "s"), "j",
                       count=count, interval=interval, native=False, use_flight=False)
    stopped = pyspy.DumpError(pyspy.STOPPED, "pid 1 is stopped")
    cycles = [{0: [_in_all_reduce(), _in_all_reduce(), stopped], 1: [_in_all_reduce()] * 3, 2: [_at(14)] * 3},
              {0: [stopped] * 3, 1: [_in_all_reduce()] * 3, 2: [_at(14)] * 3}]
    t = time.time_ns()
    for k, rounds in enumerate(cycles, 1):
        ts = [t + int((k * count + i) * interval * 1e9) for i in range(count)]
        samples = {r: [Sample(ts[i], None, x, None, None, None) if isinstance(x, pyspy.DumpError)
                       else Sample(ts[i], x, None, infer.in_flight(x), 1.0, 1 << 20) for i, x in enumerate(ss)]
                   for r, ss in rounds.items()}
        snap.cycles = k
        cycle = snap._write(k, ts[0], ts[-1], samples, None)
        assert cycle.ops[0].op == "all_reduce" and set(cycle.failed) == {0}, k
        model, _, _ = load_trace(tmp_path / "s")
        assert sorted(_errors_of(diagnose(model))) == [("missing_ranks", [2]), ("trace_incomplete", [0])], k
    snap.close()


def test_a_rank_py_spy_may_not_read_is_named_with_what_to_do(tmp_path):
    denied = pyspy.DumpError(pyspy.PERMISSION, "Operation not permitted (os error 1)")
    found = _judge(tmp_path, {0: [_in_all_reduce()] * 3, 1: [denied] * 3, 2: [_in_all_reduce()] * 3,
                              3: [_in_all_reduce()] * 3})
    assert _errors_of(found) == [("missing_ranks", [1]), ("trace_incomplete", [1])]
    f = found[0]
    assert "not readable by py-spy (Operation not permitted" in f.message and "is not known" in f.message
    assert "ptrace_scope=0" in f.message and "in no collective" not in f.message
    warn = [x for x in found if x.kind == "trace_incomplete"]
    assert len(warn) == 1 and warn[0].culprits == [1] and "ptrace" in warn[0].message
    assert "their hosts" not in " ".join(x.message for x in found)
    from commscope.analysis.rankstate import rank_state
    from commscope.analysis.source import load_trace

    model, _, _ = load_trace(tmp_path / "s")  # (the console's rank table: not "in no collective: at ?")
    assert rank_state(model, 1, model.end_ns).text == "not read by py-spy (Operation not permitted (os error 1))"


def test_snapshot_findings_show_no_sequence_numbers(tmp_path):
    recv = _thread(_frame("<module>", "/job/train.py", 7), _frame("recv", C10D, tensor="<Tensor at 0x1>", src="2"))
    found = _judge(tmp_path, {0: [recv] * 3, 1: [_at(9)] * 3, 2: [_at(12)] * 3})
    assert _errors_of(found) == [("unmatched_p2p", [2])]
    text = json.dumps(found[0].to_json())
    assert "#" not in found[0].message and "( of" not in found[0].message and "(group 0)" in found[0].message
    assert '"seq": 1' not in text


# ---------------------------------------------------------------------- pids, hosts, terminal
def test_pids_that_do_not_exist_are_said_so():
    gone = str(2 ** 22 + 1)  # above Linux's largest pid_max
    for args in (["--pid", gone], ["--job-pid", gone]):
        out = snapshot(*args)
        assert out.returncode == 2 and "no process has" in out.stderr and gone in out.stderr, out.stderr
        assert "give its processes with --pid" not in out.stderr
        assert all(len(line) <= 80 for line in out.stderr.splitlines()), out.stderr


def test_ranks_of_this_host_not_given_with_pid_are_not_called_remote(tmp_path):
    """``--pid`` with rank 0's pid of a job whose LOCAL_WORLD_SIZE says all 3 ranks are here."""
    env = _env({"RANK": "0", "WORLD_SIZE": "3", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "3",
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"})
    target = subprocess.Popen([sys.executable, "-c", "import time; print('ok', flush=True); time.sleep(600)"],
                              env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert target.stdout.readline().strip() == "ok"
        found = procs.find([target.pid])
        assert found.jobs[0].here == [0, 1, 2] and found.jobs[0].local_ranks is None
        out = taken(tmp_path / "s", None, "--pid", str(target.pid))
        assert "other hosts" not in out and "are on this host" in out and "not given with --pid" in out
        assert all(len(line) <= 80 for line in out.splitlines()), out
    finally:
        target.kill()
        target.wait()
