"""A torchrun run that restarted (``--max-restarts``): each attempt records a job of its own,
and ``check``/``report`` of the store (its newest job, the last attempt) say which earlier
attempts there were and how they ended (helper-76: a run whose first attempt crashed was
"healthy", exit 0, with nothing about the crash)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
from procs import run_session
from redis_fixture import require_redis_server

from commscope.analysis import source
from commscope.analysis.source import MAX_LISTED, parse_attempt, restarts, stated_attempt
from commscope.bench.redis_server import RedisServer
from commscope.commands.check import restart_warnings, restarted
from commscope.record import jobid
from commscope.store import redis_store, redis_url

pytestmark = pytest.mark.timeout(240)

#: Two ranks on Gloo; in attempt 0 rank 1 fails ($FAULT) before its third all_reduce, and
#: torchrun restarts both; attempt 1 completes.  Each attempt's group uses a store prefix of
#: its own: torch 2.13's Gloo, restarted on torchrun's agent store, reads the last attempt's
#: addresses and fails to connect (an attempt that dies inside init_process_group).
TRAIN = textwrap.dedent("""
    import datetime, os, signal
    import torch, torch.distributed as dist
    attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    timeout = datetime.timedelta(seconds=60)
    master = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" and rank == 0
    base = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                         is_master=master, timeout=timeout)
    dist.init_process_group("gloo", store=dist.PrefixStore("attempt" + attempt, base), rank=rank,
                            world_size=world, timeout=timeout)
    x = torch.ones(4)
    for step in range(4):
        if attempt == "0" and rank == 1 and step == 2:
            if os.environ["FAULT"] == "raise":
                raise RuntimeError("boom from rank 1")
            os.kill(os.getpid(), signal.SIGKILL)
        dist.all_reduce(x)
    dist.barrier()
    dist.destroy_process_group()
""")


def commscope(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "500", **(env or {})}
    return run_session([sys.executable, "-m", "commscope", *args], cwd=cwd, env=env, capture_output=True,
                       text=True, timeout=200)


def run_restarting(tmp_path: Path, fault: str, *job: str, store: str = "trace") -> Path:
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    proc = commscope("run", "--store", store, *job, "--", sys.executable, "-m", "torch.distributed.run",
                     "--nproc-per-node", "2", "--max-restarts", "1", "--monitor-interval", "0.1", str(script),
                     cwd=tmp_path, env={"FAULT": fault})
    assert proc.returncode == 0, proc.stderr[-3000:]  # (the run recovered)
    return tmp_path / "trace"


def jobs_of(store: Path) -> list[str]:
    return sorted(d.name for d in store.iterdir() if d.is_dir())


def test_check_of_a_restarted_run_names_the_attempt_that_crashed(tmp_path):
    store = run_restarting(tmp_path, "raise")
    first, last = jobs_of(store)
    assert (parse_attempt(first).number, parse_attempt(last).number) == (0, 1)
    run = parse_attempt(last).run
    assert parse_attempt(first).run == run and first.endswith(f"-{run}-a0") and last.endswith(f"-{run}-a1")
    assert (store / "LATEST").read_text() == last + "\n"
    # each rank's recorder said which attempt its job is (check trusts no id alone)
    assert [json.loads((store / j / "job.json").read_text())["attempt"] for j in (first, last)] == [0, 1]
    metas = [json.loads(line) for j in (first, last) for f in sorted((store / j).rglob("*.jsonl"))
             for line in f.read_text().splitlines() if '"type":"meta"' in line.replace(" ", "")]
    assert sorted({(m["job"], m["rank"], m["attempt"]) for m in metas}) == [
        (first, 0, 0), (first, 1, 0), (last, 0, 1), (last, 1, 1)]

    proc = commscope("check", str(store), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr  # the run recovered: its last attempt is healthy
    lines = proc.stdout.splitlines()
    assert lines[1:] == [
        f"warning: this is attempt 1 of torchrun run {run}, which restarted: the findings and the exit code are "
        "this attempt's; its earlier attempts:",
        f"warning: attempt 0 (job {first}) failed: rank_crashed, culprits 1: rank 1 crashed after all_reduce #2 "
        f"(group 0): RuntimeError: boom from rank 1, at {tmp_path / 'train.py'}:16 in <module>; "
        f"commscope check {store / first}",
        "no findings: attempt 1 looks healthy (the run restarted 1 time(s): its earlier attempts are in the "
        "warnings above)",
    ]

    out = json.loads(commscope("check", "--json", str(store), cwd=tmp_path).stdout)
    assert out["findings"] == []
    assert out["warnings"] == [w.removeprefix("warning: ") for w in lines[1:3]]
    (earlier,) = out["restarts"]["earlier"]
    assert {k: out["restarts"][k] for k in ("attempt", "run", "untraced", "unlisted")} == {
        "attempt": 1, "run": run, "untraced": 0, "unlisted": 0}
    assert {k: v for k, v in earlier.items() if k != "findings"} == {
        "attempt": 0, "job": first, "store": str(store / first), "ranks": 2, "errors": 1, "warnings": 0}
    assert [(f["kind"], f["culprits"]) for f in earlier["findings"]] == [("rank_crashed", [1])]
    # the attempt's own check says the same, and fails
    alone = commscope("check", "--json", str(store / first), cwd=tmp_path)
    assert alone.returncode == 1
    assert json.loads(alone.stdout)["findings"] == earlier["findings"]
    assert json.loads(alone.stdout)["restarts"] is None  # (attempt 0: nothing before it)

    report = commscope("report", str(store), cwd=tmp_path)
    assert report.returncode == 0
    assert report.stdout.splitlines()[1] == (
        f"warning: this is attempt 1 of torchrun run {run}, which restarted: these tables are this attempt's "
        f"(attempt 0: commscope check {store / first})")
    rep = json.loads(commscope("report", "--json", str(store), cwd=tmp_path).stdout)
    assert rep["restarts"] == {"attempt": 1, "run": run,
                               "earlier": [{"attempt": 0, "job": first, "store": str(store / first)}],
                               "untraced": 0, "unlisted": 0, "listed": True}


def test_a_window_reads_the_earlier_attempts_with_it(tmp_path):
    """``check --since`` reads each earlier attempt judged with the same window: a check of
    a restarted run's tail does not read its earlier attempts whole (at 16k ranks each one
    cost a whole read), and still says how each ended, as a full read does."""
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    proc = commscope("run", "--store", "trace", "--", sys.executable, "-m", "torch.distributed.run",
                     "--nproc-per-node", "2", "--max-restarts", "1", "--monitor-interval", "0.1", str(script),
                     cwd=tmp_path, env={"FAULT": "raise", "COMMSCOPE_SEGMENT_MB": "0.002"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    store = tmp_path / "trace"
    first, _last = jobs_of(store)
    assert all(len(list((store / first).glob(f"rank-{r:05d}*.jsonl"))) > 1 for r in (0, 1))  # (segments)
    whole = json.loads(commscope("check", "--json", str(store), cwd=tmp_path).stdout)
    # As read before the ranks' closers wrote their carries (each a child at the lowest
    # priority: CI read attempt 0 before rank 0's last one, and blamed rank 0, whose
    # all_reduce rank 1's crash broke, as crashed): made from the segments instead.
    for carry in (store / first).glob("rank-*.open.*.jsonl"):
        carry.unlink()
    proc = commscope("check", "--json", "--since", "2099-01-01", str(store), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (earlier,) = json.loads(proc.stdout)["restarts"]["earlier"]
    (read_whole,) = whole["restarts"]["earlier"]
    assert earlier["before_window_bytes"] > 0 and "before_window_bytes" not in read_whole
    assert [(f["kind"], f["culprits"]) for f in earlier["findings"]] == [("rank_crashed", [1])]
    assert earlier["findings"] == read_whole["findings"]


def test_a_job_id_given_names_each_attempt_after_the_first(tmp_path):
    """``--job NAME``: attempt 0 records NAME, attempt 1 NAME-a1 (it was refused before: "already
    holds events of an earlier job")."""
    store = run_restarting(tmp_path, "kill", "--job", "myrun")
    assert jobs_of(store) == ["myrun", "myrun-a1"]
    proc = commscope("check", str(store), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[1:] == [
        "warning: this is attempt 1 of torchrun run myrun, which restarted: the findings and the exit code are "
        "this attempt's; its earlier attempts:",
        "warning: attempt 0 (job myrun) failed: dead_rank, culprits 1: rank 1 was gone without a clean exit (after "
        "all_reduce #2 (group 0)): its process ended without a word (SIGKILL, the OOM killer, or a signal nothing "
        f"noted); commscope check {store / 'myrun'}",
        "no findings: attempt 1 looks healthy (the run restarted 1 time(s): its earlier attempts are in the "
        "warnings above)",
    ]


def test_a_restarted_run_recorded_in_redis_names_its_earlier_attempt_too(tmp_path):
    """Redis could not list its jobs to check, so every earlier attempt was "not looked for";
    and a URL that pins the last attempt (``?job=``) opened that one for each earlier one."""
    require_redis_server()
    server = RedisServer(password="s3cret-pw")
    server.start()
    try:
        run_restarting(tmp_path, "raise", store=server.url)
        (first, _), (last, _) = redis_store.list_jobs(server.url)
        assert (parse_attempt(first).number, parse_attempt(last).number) == (0, 1)
        for url in (server.url, redis_url.with_job(server.url, last)):  # the newest job, or the one named
            out = json.loads(commscope("check", "--json", url, cwd=tmp_path).stdout)
            assert out["findings"] == []
            (earlier,) = out["restarts"]["earlier"]
            assert {k: out["restarts"][k] for k in ("attempt", "untraced", "unlisted", "listed")} == {
                "attempt": 1, "untraced": 0, "unlisted": 0, "listed": True}
            assert (earlier["job"], earlier["errors"]) == (first, 1)
            assert [(f["kind"], f["culprits"]) for f in earlier["findings"]] == [("rank_crashed", [1])]
            assert "s3cret-pw" not in earlier["store"] and earlier["store"].endswith(f"job={first}")
    finally:
        server.close()


def test_a_url_naming_a_job_gives_its_store_for_another():
    for url, want in (("redis://h:1", "redis://h:1"), ("redis://h:1/0?job=a", "redis://h:1/0"),
                      ("redis://:p%40w@h:1/?maxlen=5&job=a&rate=9", "redis://:p%40w@h:1/?maxlen=5&rate=9"),
                      ("redis://h:1/?jo%62=a", "redis://h:1/")):
        assert redis_url.unpinned(url) == want
        assert redis_url.pinned_job(redis_url.with_job(want, "b")) == "b"
    assert redis_url.with_job("redis://h:1/?job=a", "b") == "redis://h:1/?job=a"  # (its writers write job a)


# ---------------------------------------------------------------------- ids and grouping
def test_attempt_ids_share_the_run_key_and_read_back(monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    assert parse_attempt(jobid.attempt_job_id()) is None  # (not under torchrun: as before)
    assert jobid.attempt_job_id("given") == "given"
    for run_id in ("none", "5c2b7d0e-uuid"):
        monkeypatch.setenv("TORCHELASTIC_RUN_ID", run_id)
        got = []
        for n in (0, 1, 12):
            monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", str(n))
            got.append(parse_attempt(jobid.attempt_job_id()))
            assert jobid.attempt_job_id("given") == ("given" if n == 0 else f"given-a{n}")
            assert parse_attempt(jobid.attempt_job_id("given")) == (
                None if n == 0 else ("given", n, "", "given"))
        assert [a.number for a in got] == [0, 1, 12] and len({a.run for a in got}) == 1
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "another")
    assert parse_attempt(jobid.attempt_job_id()).run != got[0].run
    assert jobid.attempt_job_id("x" * 120) == "x" * 116 + "-a12"  # (within 120 characters)


def fake_store(root: Path, *jobs: str, **attempts: int | None) -> None:
    """Jobs with a ``job.json`` each, saying the attempt its id names (as the recorder writes
    it), or ``attempts[job]`` (None: says none, as before commscope wrote it)."""
    for job in jobs:
        (root / job).mkdir(parents=True)
        a = parse_attempt(job)
        n = attempts.get(job, a.number if a else None)
        (root / job / "job.json").write_text(json.dumps({"job": job, **({} if n is None else {"attempt": n})}))


def reading(root: Path, job: str) -> SimpleNamespace:
    return SimpleNamespace(job_name=lambda: job, job_dir=root / job,
                           job=lambda: json.loads((root / job / "job.json").read_text()))


def test_earlier_attempts_are_walked_back_through_the_run(tmp_path):
    k = "abc123"
    fake_store(tmp_path, f"20260101-000000-{k}-a0", f"20260101-000100-{k}-a1",  # an older run, same --rdzv-id
               f"20260102-000000-{k}-a0", f"20260102-000200-{k}-a2", f"20260102-000300-{k}-a3",
               "20260102-000100-ffffff-a1", "20260102-000100-0a1b2c", "other")
    r = restarts(None, reading(tmp_path, f"20260102-000300-{k}-a3"))
    assert (r.attempt, r.run, r.listed, r.untraced, r.unlisted) == (3, k, True, 1, 0)
    assert [(e.number, e.job, e.name) for e in r.earlier] == [  # (attempt 1 left no trace: the older run's
        (2, f"20260102-000200-{k}-a2", str(tmp_path / f"20260102-000200-{k}-a2")),  # is not taken for it)
        (0, f"20260102-000000-{k}-a0", str(tmp_path / f"20260102-000000-{k}-a0"))]
    # the older run's own attempt 1 stops at its own attempt 0
    older = restarts(str(tmp_path / f"20260101-000100-{k}-a1"), reading(tmp_path, f"20260101-000100-{k}-a1"))
    assert [(e.number, e.job) for e in older.earlier] == [(0, f"20260101-000000-{k}-a0")]
    for job in (f"20260102-000000-{k}-a0", "20260102-000100-0a1b2c", "other"):
        assert restarts(None, reading(tmp_path, job)) is None


def test_attempts_without_a_readable_trace_are_said_so(tmp_path):
    fake_store(tmp_path, "myrun", "myrun-a2", myrun=0)  # attempt 0's job holds no events; attempt 1 none at all
    restart = restarted(None, reading(tmp_path, "myrun-a2"))
    assert restart["earlier"] == [{"attempt": 0, "job": "myrun", "store": str(tmp_path / "myrun"),
                                   "note": f"could not be read: {tmp_path / 'myrun'}: no events recorded"}]
    assert (restart["untraced"], restart["unlisted"]) == (1, 0)
    assert restart_warnings(restart) == [
        "this is attempt 2 of torchrun run myrun, which restarted: the findings and the exit code are this "
        "attempt's; its earlier attempts:",
        f"attempt 0 (job myrun): could not be read: {tmp_path / 'myrun'}: no events recorded; "
        f"commscope check {tmp_path / 'myrun'}",
        "1 earlier attempt(s) left no trace in this store: they ended before init_process_group returned, or were "
        "recorded elsewhere",
    ]


# ---------------------------------------------------------------------- review (helper-80)
def test_the_list_of_earlier_attempts_is_bounded(tmp_path):
    """A job id (or a meta) saying attempt 2,000,000 made check build 2,000,001 warning lines
    (~6 s, ~1 GiB): the attempts found are listed, the newest few, the rest counted."""
    fake_store(tmp_path, "x-a1", "x-a2000000")
    restart = restarted(None, reading(tmp_path, "x-a2000000"))
    assert [(e["attempt"], e["job"]) for e in restart["earlier"]] == [(1, "x-a1")]
    assert (restart["untraced"], restart["unlisted"]) == (1_999_999, 0)
    lines = restart_warnings(restart)
    assert len(lines) == 3 and lines[2] == (
        "1,999,999 earlier attempt(s) left no trace in this store: they ended before init_process_group returned, "
        "or were recorded elsewhere")
    # many attempts found: the newest MAX_LISTED named, the older ones counted
    k = "abc123"
    many = tmp_path / "many"
    fake_store(many, *(f"20260102-0000{n:02d}-{k}-a{n}" for n in range(10)))
    r = restarted(None, reading(many, f"20260102-000009-{k}-a9"))
    assert [e["attempt"] for e in r["earlier"]] == [8, 7, 6, 5]
    assert [("findings" in e, e.get("note", "")[:9]) for e in r["earlier"]] == [
        (False, "could not"), (False, "could not"), (False, "not read:"), (False, "not read:")]
    assert (r["untraced"], r["unlisted"]) == (0, 5)
    assert restart_warnings(r)[-1] == f"5 older attempt(s) not listed (check names the {MAX_LISTED} newest found)"
    # at most MAX_LOOKED_AT jobs' metadata read: what lies below them is not looked for
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(source, "MAX_LOOKED_AT", 3)
        r = restarts(None, reading(many, f"20260102-000009-{k}-a9"))
    assert ([e.number for e in r.earlier], r.untraced, r.unlisted) == ([8, 7, 6], 0, 6)


def test_a_job_is_an_attempt_only_where_its_recorder_said_so(tmp_path):
    """``--job ablation-a2`` beside ``ablation-a1`` was "attempt 2 of torchrun run ablation",
    judging the other experiment: ids alone are not enough, the ranks' metas must say it."""
    fake_store(tmp_path, "ablation-a1", "ablation-a2", **{"ablation-a1": None, "ablation-a2": None})
    assert restarts(None, reading(tmp_path, "ablation-a2")) is None  # (not under torchrun)
    run0 = tmp_path / "under-torchrun"
    fake_store(run0, "ablation-a1", "ablation-a2", **{"ablation-a1": 0, "ablation-a2": 0})
    assert restarts(None, reading(run0, "ablation-a2")) is None  # (torchrun's first attempt of each)
    # a given name that ends like an attempt's is the run's own name; its attempt 1 finds it,
    # and an experiment named like an attempt of the run that its recorder did not call one is no attempt
    given = tmp_path / "given"
    fake_store(given, "exp-a2", "exp-a2-a1", "exp-a2-a2", "exp-a2-a3", **{"exp-a2": 0, "exp-a2-a2": None})
    r = restarts(None, reading(given, "exp-a2-a3"))
    assert (r.run, [(e.number, e.job) for e in r.earlier], r.untraced) == (
        "exp-a2", [(1, "exp-a2-a1"), (0, "exp-a2")], 1)
    # the ranks' metas, where the model read holds them, decide for the job read
    said = SimpleNamespace(ranks={0: SimpleNamespace(meta={"attempt": 0}), 1: SimpleNamespace(meta={"attempt": 0})})
    assert restarts(None, reading(given, "exp-a2-a3"), said) is None
    said.ranks[0].meta["attempt"] = said.ranks[1].meta["attempt"] = 3
    assert restarts(None, reading(given, "exp-a2-a3"), said).attempt == 3
    assert stated_attempt(reading(given, "exp-a2-a3"), SimpleNamespace(ranks={0: SimpleNamespace(meta={})})) == 3
    # a trace recorded before the recorder said which attempt it is: no restart
    old = tmp_path / "old"
    fake_store(old, "20260102-000000-abc123-a0", "20260102-000100-abc123-a1",
               **{"20260102-000000-abc123-a0": None, "20260102-000100-abc123-a1": None})
    assert restarts(None, reading(old, "20260102-000100-abc123-a1")) is None


class FakeC10dStore:
    """A c10d store's ``set``/``get``/``check``/``wait`` (``wait`` fails at once where a key is absent)."""

    def __init__(self, **keys: str):
        self.keys = {k: v.encode() for k, v in keys.items()}

    def set(self, key, value):
        self.keys[key] = value.encode() if isinstance(value, str) else value

    def get(self, key):
        return self.keys[key]

    def check(self, keys):
        return all(k in self.keys for k in keys)

    def wait(self, keys, timeout=None):
        if not self.check(keys):
            raise RuntimeError("Wait timeout")


def test_ranks_take_rank_0s_attempt_under_a_given_job(monkeypatch):
    """Under ``--job``, a replacement node's torchrun agent counts attempts from 0 while the
    others' went on: rank 0's attempt decides the job id (and the ``attempt`` the metas say)."""
    store = FakeC10dStore()
    monkeypatch.setattr(jobid, "_store", lambda: store)
    monkeypatch.setattr(jobid, "SLICE_S", 0.01)
    monkeypatch.setenv("COMMSCOPE_JOB", "myrun")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "r1")

    def as_rank(rank: int, count: int, fn):
        monkeypatch.setattr(jobid, "_agreed", None)
        monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", str(count))
        return fn(rank), jobid.job_attempt()

    settle = lambda rank: jobid.settle(rank, None, 1, timeout=0.05)  # noqa: E731
    (got0, n0) = as_rank(0, 2, settle)
    assert (got0.job, n0) == ("myrun-a2", 2)
    (got1, n1) = as_rank(1, 0, settle)  # (the replacement node: its agent's count is 0)
    assert (got1.job, got1.run, n1) == ("myrun-a2", got0.run, 2)
    assert as_rank(2, 2, settle)[0].job == "myrun-a2"  # (the nodes that counted alike)
    assert as_rank(1, 0, jobid.publish) == ("myrun-a2", 2)  # (the recorder thread's retry)
    # a store that outlives attempts (torchrun's agent store) holds attempt 0's key: rank 0's newer one wins
    store.keys["commscope/job/0"] = b"myrun 1 oldrun 0"
    assert as_rank(1, 0, settle)[0].job == "myrun-a2"
    # rank 0's last id from an earlier attempt is no later than this one: a rank keeps its own attempt's
    store.keys.pop("commscope/job/2")
    store.keys["commscope/job/3"] = b"myrun-a3 1 newrun 3"
    assert as_rank(1, 3, settle)[0][::2] == ("myrun-a3", "newrun")
    # rank 0 said nothing: each rank its own, as before
    monkeypatch.setattr(jobid, "_store", lambda: FakeC10dStore())
    assert as_rank(1, 1, settle) == (jobid.Settled("myrun-a1", 1, "?"), 1)
    monkeypatch.delenv("COMMSCOPE_JOB")
    assert as_rank(1, 1, settle) == (jobid.Settled(None, 1, "?"), 1)


def test_drawn_ids_take_rank_0s_attempt_too(monkeypatch):
    store = FakeC10dStore()
    monkeypatch.setattr(jobid, "_store", lambda: store)
    monkeypatch.setattr(jobid, "SLICE_S", 0.01)
    monkeypatch.delenv("COMMSCOPE_JOB", raising=False)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "r1")
    monkeypatch.setattr(jobid, "_agreed", None)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "4")
    first = jobid.settle(0, None, 1, timeout=0.05)
    assert parse_attempt(first.job).number == 4
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    monkeypatch.setattr(jobid, "_agreed", None)
    assert jobid.settle(3, None, 1, timeout=0.05).job == first.job and jobid.job_attempt() == 4
    # an older commscope's rank 0 published three fields: taken as before
    monkeypatch.setattr(jobid, "_agreed", None)
    store.keys = {"commscope/job/0": b"20260101-000000-abcdef 2 nonce"}
    assert jobid.settle(1, None, 1, timeout=0.05) == jobid.Settled("20260101-000000-abcdef", 2, "nonce")
    assert jobid.job_attempt() == 0


def test_an_earlier_attempt_that_would_not_fit_beside_the_last_is_not_read(tmp_path):
    """``check --max-memory``: an earlier attempt is read while the last attempt's model is
    held, so it may hold the limit less that model; one that would hold more is not read, and
    its line says why (``source._fits``), where before it was read whatever it held."""
    from commscope.analysis.source import MODEL_PER_RANK_LEAST, MODEL_PER_STORED_LEAST, open_source
    from commscope.bench.synthstore import JobShape, write_store

    write_store(str(tmp_path), JobShape(4, 40, fault="missing", hang_after=2.0), job="myrun")
    (tmp_path / "myrun" / "job.json").write_text(json.dumps({"job": "myrun", "attempt": 0}))
    fake_store(tmp_path, "myrun-a1")
    reader = open_source(str(tmp_path / "myrun"))
    least = int(reader.backlog_bytes() * MODEL_PER_STORED_LEAST + reader.rank_count() * MODEL_PER_RANK_LEAST)
    reader.close()
    held = 1 << 20
    last = SimpleNamespace(ranks={}, nbytes=lambda: held)  # (the last attempt's model, as loaded)
    (row,) = restarted(None, reading(tmp_path, "myrun-a1"), 2.0, last, max_memory=least + held - 1)["earlier"]
    assert "findings" not in row
    assert row["note"].startswith(f"could not be read: {tmp_path / 'myrun'}: all of it would hold at least")
    (row,) = restarted(None, reading(tmp_path, "myrun-a1"), 2.0, last, max_memory=least + held + 1)["earlier"]
    assert [(f["kind"], f["culprits"]) for f in row["findings"]] == [("missing_ranks", [3])]
