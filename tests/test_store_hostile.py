"""Stores that fight back, with real processes: a FIFO where a rank file should be, job ids
that try to leave the store, passwords in every spelling, and a torn write retried."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import warnings

import pytest
import torch
import torch.distributed as dist
from redis_fixture import require_redis_server
from trace_helpers import of_type, read_events

import commscope
from commscope.launch import run_ranks
from commscope.redact import redact, redact_args
from commscope.store import StoreError, open_reader
from commscope.store.directory import DirectoryWriter
from commscope.store.redis_url import parse_url


def commscope_cli(*args: str, cwd=None, env=None, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "commscope", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


# ---------------------------------------------------------------------------- FIFO rank file
def fifo_job(rank: int, ws: int, store: str) -> dict:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        commscope.instrument(store, sample_interval=0.1, flight_recorder=False)
        x = torch.ones(2)
        for _ in range(10):
            dist.all_reduce(x)
        time.sleep(0.3)
        commscope.uninstrument()
    return {"value": x.tolist(),
            "warnings": [str(w.message) for w in caught if "commscope" in str(w.message)]}


def test_fifo_rank_file_is_refused_at_once_and_training_goes_on(tmp_path):
    store = tmp_path / "trace"
    (store / "fifo-job").mkdir(parents=True)
    os.mkfifo(store / "fifo-job" / "rank-00001.jsonl")
    results = run_ranks(fifo_job, 2, args=(str(store),), env={"COMMSCOPE_JOB": "fifo-job"}, timeout=60)
    for r in results:
        # no clock needed: a recorder blocked opening the FIFO would hold uninstrument() past
        # the job's time limit, and the ranks would not return
        assert r.value["value"] == [2.0**10] * 2
    assert not results[0].value["warnings"]
    assert any("not a regular file" in w for w in results[1].value["warnings"]), results[1].value
    # the readers skip it without opening it (opening a FIFO would block them)
    proc = commscope_cli("check", str(store), "--json", timeout=60)
    out = json.loads(proc.stdout)
    assert proc.returncode in (0, 1) and any("rank-00001.jsonl is not a regular file" in w for w in out["warnings"])
    assert out["events"] > 0


def test_fifo_is_refused_by_the_writer_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "rank-00000.jsonl")
    code = textwrap.dedent(f"""
        from commscope.store.directory import DirectoryWriter
        from commscope.store import StoreError
        try:
            DirectoryWriter({str(tmp_path.parent)!r}, {tmp_path.name!r}, 0)
        except StoreError as exc:
            print("refused:", exc)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert "refused:" in proc.stdout and "not a regular file" in proc.stdout, proc.stderr


# ---------------------------------------------------------------------------- job ids
@pytest.mark.parametrize("job", ["..", ".", "../escape", "/abs", "a/b", ".hidden", "x\n", ""])
def test_writer_refuses_job_ids_that_leave_the_store(tmp_path, job):
    with pytest.raises(StoreError, match="bad job id"):
        DirectoryWriter(tmp_path / "store", job, 0)
    assert sorted(p.name for p in tmp_path.iterdir()) in ([], ["store"])
    assert not (tmp_path / "store").exists() or not any((tmp_path / "store").iterdir())


def test_run_and_copy_refuse_job_dotdot(tmp_path):
    store = tmp_path / "box" / "trace"
    proc = commscope_cli("run", "--store", str(store), "--job", "..", "--", sys.executable, "-c", "pass")
    assert proc.returncode == 2 and "bad --job '..'" in proc.stderr
    assert not (tmp_path / "box").exists()
    src = tmp_path / "src" / "j"
    src.mkdir(parents=True)
    (src / "rank-00000.jsonl").write_text('{"type":"heartbeat","rank":0,"ts":1}\n')
    proc = commscope_cli("copy", str(src), str(store), "--job", "..")
    assert proc.returncode == 2 and "bad --job" in proc.stderr
    assert not (tmp_path / "box").exists()


def escaping_job(rank: int, ws: int, store: str) -> int:
    commscope.instrument(store, sample_interval=0.1, flight_recorder=False)
    dist.all_reduce(torch.ones(1))
    commscope.uninstrument()
    return 0


def test_job_env_with_separators_stays_inside_the_store(tmp_path):
    store = tmp_path / "box" / "trace"
    run_ranks(escaping_job, 2, args=(str(store),), env={"COMMSCOPE_JOB": "../../escape"}, timeout=60)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["box"]
    assert sorted(p.name for p in (tmp_path / "box").iterdir()) == ["trace"]
    jobs = [p.name for p in store.iterdir() if p.is_dir()]
    assert jobs == ["job.._.._escape"]
    assert len(read_events(store)) > 0


def test_reader_ignores_a_latest_pointing_outside(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "rank-00000.jsonl").write_text('{"type":"heartbeat","rank":0,"ts":1}\n')
    store = tmp_path / "store"
    (store / "real").mkdir(parents=True)
    (store / "real" / "rank-00000.jsonl").write_text('{"type":"heartbeat","rank":0,"ts":2}\n')
    (store / "LATEST").write_text("../outside\n")
    assert [e["ts"] for e in open_reader(store).read_all()] == [2]


# ---------------------------------------------------------------------------- secrets
SECRET = "S3cr3t-Pw-42"
LEAKY = [
    f"redis://:{SECRET}@host:6379/0",
    f"redis://alice:{SECRET}@host/1",
    f"redis://{SECRET}@host/1",
    f"redis://host/0?password={SECRET}&job=j",
    f"redis://host/0?pass%77ord={SECRET}",
    f"redis://host/0?PASSWORD={SECRET}",
    f"rediss://host/0?job=j&p%61ssword={SECRET}",
    f"unix://:{SECRET}@/tmp/redis.sock?db=2",
    f"redis://:{SECRET.replace('-', '%2D')}@host/0",
]


@pytest.mark.parametrize("url", LEAKY)
def test_every_spelling_of_the_password_is_redacted(url):
    for text in (redact(url), redact(f"--store={url}"), redact(f"x {url} y"),
                 *redact_args(["train.py", f"--x={url}", url])[1:]):
        assert SECRET not in text and SECRET.replace("-", "%2D") not in text and "***" in text, text


def test_percent_encoded_key_logs_in_and_is_still_hidden():
    t = parse_url(f"redis://h/0?pass%77ord={SECRET}")
    assert t.password == SECRET and SECRET not in repr(t) and SECRET not in t.display()


def argv_job(rank: int, ws: int, store: str) -> int:
    sys.argv[1:] = [f"--x=redis://:{SECRET}@db:6379/0", f"--y=redis://db/0?pass%77ord={SECRET}",
                    "--z", f"rediss://user:{SECRET}@db/2", f"--w=http://u:{SECRET}@example/x?token={SECRET}"]
    commscope.instrument(store, sample_interval=0.1, flight_recorder=False)
    dist.all_reduce(torch.ones(1))
    commscope.uninstrument()
    return 0


def test_meta_argv_hides_passwords_with_a_directory_store(tmp_path):
    store = tmp_path / "trace"
    run_ranks(argv_job, 2, args=(str(store),), env={"COMMSCOPE_JOB": "argv"}, timeout=60)
    raw = b"".join(p.read_bytes() for p in store.rglob("*") if p.is_file())
    assert SECRET.encode() not in raw
    argv = of_type(read_events(store), "meta", 0)[0]["argv"]
    assert argv[1:] == ["--x=redis://:***@db:6379/0", "--y=redis://db/0?pass%77ord=***", "--z",
                        "rediss://user:***@db/2", "--w=http://u:***@example/x?token=***"]


def test_run_never_prints_a_percent_encoded_password(tmp_path):
    proc = commscope_cli("run", "--store", f"redis://127.0.0.1:1/0?pass%77ord={SECRET}", "--",
                         sys.executable, "-c", "pass")
    assert proc.returncode == 0, proc.stderr
    assert SECRET not in proc.stderr + proc.stdout and "pass%77ord=***" in proc.stderr


def env_password_job(rank: int, ws: int, store: str) -> int:
    commscope.instrument(store, sample_interval=0.1, flight_recorder=False)
    for _ in range(5):
        dist.all_reduce(torch.ones(1))
    commscope.uninstrument()
    return 0


def test_password_from_the_environment_keeps_it_out_of_argv(tmp_path):
    require_redis_server()
    from commscope.bench.redis_server import RedisServer

    with RedisServer(password=SECRET, data_dir=tmp_path / "redis") as server:
        server.start()
        bare = f"redis://127.0.0.1:{server.port}/0"
        env = {"COMMSCOPE_JOB": "envpw", "COMMSCOPE_REDIS_PASSWORD": SECRET}
        run_ranks(env_password_job, 2, args=(bare,), env=env, timeout=60)
        proc = commscope_cli("check", bare, "--json", env={**os.environ, "COMMSCOPE_REDIS_PASSWORD": SECRET})
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
        assert out["ops"] == 10 and SECRET not in proc.stdout
        no_env = {k: v for k, v in os.environ.items() if k != "COMMSCOPE_REDIS_PASSWORD"}
        proc = commscope_cli("check", bare, env=no_env)
        assert proc.returncode == 2 and SECRET not in proc.stderr
        # the URL as check shows it (its password hidden), pasted back: the environment's password
        # (helper-163: "wrong password", the *** taken for one)
        shown = f"redis://:***@127.0.0.1:{server.port}/0?job=envpw"
        assert shown in json.loads(commscope_cli("check", bare, "--json", env={
            **os.environ, "COMMSCOPE_REDIS_PASSWORD": SECRET}).stdout)["source"], "not the URL check shows"
        proc = commscope_cli("check", shown, "--json", env={**os.environ, "COMMSCOPE_REDIS_PASSWORD": SECRET})
        assert proc.returncode == 0 and json.loads(proc.stdout)["ops"] == 10, proc.stderr
        proc = commscope_cli("check", shown, env=no_env)  # (no password then: Redis asks for one)
        assert proc.returncode == 2 and "the server requires a password ($COMMSCOPE_REDIS_PASSWORD, or " \
            "redis://:***@host:port/db)" in proc.stderr, proc.stderr  # (redacted as any URL)
        proc = commscope_cli("check", bare, env={**os.environ, "COMMSCOPE_REDIS_PASSWORD": "not-it"})
        assert proc.returncode == 2 and "wrong password or user name (the password of $COMMSCOPE_REDIS_PASSWORD: " \
            "it is used for any URL without one)" in proc.stderr, proc.stderr
    with RedisServer(data_dir=tmp_path / "open") as server:  # (no password set: the variable's is refused)
        server.start()
        proc = commscope_cli("check", server.url, env={**os.environ, "COMMSCOPE_REDIS_PASSWORD": SECRET})
        assert proc.returncode == 2 and "the server has no password set; $COMMSCOPE_REDIS_PASSWORD gave one (it is " \
            "used for any URL without one): unset it for this store" in proc.stderr, proc.stderr
        assert SECRET not in proc.stderr


# ---------------------------------------------------------------------------- torn write retried
TORN = textwrap.dedent("""
    import resource, signal, sys
    from commscope.store import StoreError
    from commscope.store.directory import DirectoryWriter

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # past the limit, write() fails with EFBIG
    def line(i):
        return b'{"type":"heartbeat","rank":0,"ts":%d,"inflight":0,"v":1}' % (1000 + i)
    w = DirectoryWriter(sys.argv[1], "torn", 0)
    w.write([line(i) for i in range(3)])
    size = w.path.stat().st_size
    hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
    resource.setrlimit(resource.RLIMIT_FSIZE, (size + 20, hard))   # the disk "fills" mid-line
    outcomes = []
    for attempt in range(3):   # the recorder retries; the later attempts write nothing at all
        try:
            w.write([line(3), line(4)])
            outcomes.append("ok")
        except StoreError as exc:
            outcomes.append(exc.written)
    resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))   # space comes back
    w.write([line(3), line(4)])
    print(outcomes)
""")


def test_a_retry_after_a_torn_write_never_glues_onto_the_torn_line(tmp_path):
    proc = subprocess.run([sys.executable, "-c", TORN, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[0, 0, 0]"
    data = (tmp_path / "torn" / "rank-00000.jsonl").read_bytes()
    assert data.count(b"\n") == 5 and data.endswith(b"\n")  # 3 lines, the torn one cut off, 2 lines retried
    reader = open_reader(tmp_path)
    assert [e["ts"] for e in reader.read_all()] == [1000, 1001, 1002, 1003, 1004]
    assert reader.stats.corrupt == 0  # (nothing lost: the torn line was a copy the retry wrote whole)
