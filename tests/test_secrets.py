"""No secret reaches a trace, or anything shown from one (issue 22).

A real 2-rank job under ``commscope run`` (torchrun, Gloo) carries every kind of credential
in its command line, in the exception a rank dies of, in the error of a collective that
fails, and in its environment.  Nothing of them may be found in any byte of the store
(a directory or Redis), nor in what check, report, export, copy and the replay console
show; the redacted forms keep the argument names, URL hosts and paths.  A trace written
by an older version (secrets in it) is redacted when read, so it is safe to show too.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from procs import run_session
from redis_fixture import *  # noqa: F403
from redis_fixture import redis_client
from trace_helpers import of_type, read_events

from commscope.cli import main as cli

pytestmark = pytest.mark.timeout(300)

HF = "hf_" + "Q7wErTy9" * 4 + "Zz"
OPENAI = "sk-proj-" + "Zx9Lm2Np" * 4
GITHUB = "ghp_" + "A1b2C3d4" * 5
GITHUB_PAT = "github_pat_11ABCDEFG0" + "abcXYZ789_" * 5
AWS = "AKIA" + "IOSFODNN7EXAMPL3"
AWS_SECRET = "Kq7/zT2xLmN9pR4vW8yB3cD6fG1hJ5kM0nQ+sU7x"  # (beside its id; not in the environment)
SLACK = "xoxb-2048-1024-" + "sL4ckT0k3n" * 2
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhbGljZSIsInNjb3BlIjoiYWRtaW4ifQ.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"
PASSWORD = "Hunter2-Pa55w0rd"
URL_PASSWORD = "Pg-S3cr3t-9914"
QUERY_TOKEN = "Qt0k3nValue77x"
PEM_BODY = "MIIEpAIBAAKCAQEA7bqSecretKeyMaterial0123456789abcdefXYZ"
ENV_WANDB = "wandb0123456789abcdef0123456789abcdef01"
ENV_AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
ENV_ONLY = "EnvOnlyS3cret-never-printed-77"  # in the environment, never used by the job
SECRETS = [HF, OPENAI, GITHUB, GITHUB_PAT, AWS, AWS_SECRET, SLACK, JWT, PASSWORD, URL_PASSWORD, QUERY_TOKEN, PEM_BODY, ENV_WANDB,
           ENV_AWS_SECRET, ENV_ONLY]
# Pieces long enough to be a leak if any of them shows up alone (a token cut short still leaks).
PIECES = sorted({s[i:i + 10] for s in SECRETS for i in range(0, len(s) - 9, 5)
                 if not s[i:i + 10].startswith(("hf_", "sk-proj", "ghp_", "github_pat", "AKIA", "xoxb-", "eyJ"))})

ARGV = ["--hf-token", HF, f"--password={PASSWORD}", "--api-key", OPENAI,
        f"--db=postgres://admin:{URL_PASSWORD}@db.internal:5432/runs",
        f"--hook=https://hooks.example.com/v1/notify?token={QUERY_TOKEN}&channel=ml", f"--gh={GITHUB}",
        f"--pat={GITHUB_PAT}", f"--aws={AWS}", f"--slack={SLACK}", f"--jwt={JWT}", f"--db-password:{PASSWORD}", "--lr",
        "3e-4"]
REDACTED_ARGV = ["--hf-token", "***", "--password=***", "--api-key", "***",
                 "--db=postgres://admin:***@db.internal:5432/runs",
                 "--hook=https://hooks.example.com/v1/notify?token=***&channel=ml", "--gh=ghp_***",
                 "--pat=github_pat_***", "--aws=AKIA***", "--slack=xoxb-***", "--jwt=eyJ***", "--db-password:***",
                 "--lr", "3e-4"]

JOB = textwrap.dedent(f'''
    import os, sys, torch, torch.distributed as dist

    class Unpicklable:
        def __reduce__(self):
            raise ValueError("cannot pickle the config: api_key={OPENAI} --password {PASSWORD} {GITHUB}")

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    dist.all_reduce(torch.ones(4))
    try:  # a collective that fails in the rank, quoting credentials in its error
        dist.all_gather_object([None, None], Unpicklable())
    except ValueError:
        pass
    dist.barrier()
    if rank == 1:
        raise RuntimeError(
            "cannot reach postgres://admin:{URL_PASSWORD}@db.internal:5432/runs; "
            "Authorization: Bearer {JWT}; wandb key " + os.environ["WANDB_API_KEY"] + "; "
            "-----BEGIN RSA PRIVATE KEY-----\\n{PEM_BODY}\\n-----END RSA PRIVATE KEY-----; "
            "{SLACK} {AWS} {AWS_SECRET} {HF}")
    dist.destroy_process_group()
''')


def run_job(tmp_path: Path, store: str) -> subprocess.CompletedProcess:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    env = dict(__import__("os").environ, WANDB_API_KEY=ENV_WANDB, AWS_SECRET_ACCESS_KEY=ENV_AWS_SECRET,
               HF_TOKEN=HF, MY_SERVICE_PASSWORD=ENV_ONLY)
    cmd = [sys.executable, "-m", "commscope", "run", "--store", store, "--job", "leaky", "--",
           sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script), *ARGV]
    return run_session(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)


def unpacked(data: bytes) -> bytes:
    """``data`` with the packed records of its ``block`` lines appended, decoded from base64:
    a credential inside a native block is not in the stored bytes as such."""
    import base64
    import re

    extra = [base64.b64decode(m.group(1)) for m in re.finditer(rb'"data":"([A-Za-z0-9+/=]*)"', data)]
    return b"\n".join([data, *extra])


def assert_clean(what: str, text: str | bytes) -> None:
    data = unpacked(text.encode() if isinstance(text, str) else text)
    for s in SECRETS:
        assert s.encode() not in data, f"{what} holds {s[:12]}..."
    for piece in PIECES:
        assert piece.encode() not in data, f"{what} holds a piece of a secret: {piece!r}"


def outputs(store: str, tmp_path: Path, capsys) -> dict[str, str]:
    """What every command shows of the trace: check (text and JSON), report (text and JSON),
    export (the file), copy (its output and every byte it wrote)."""
    out: dict[str, str] = {}
    capsys.readouterr()
    for name, argv in {"check": ["check", store], "check --json": ["check", store, "--json"],
                       "report": ["report", store], "report --json": ["report", store, "--json"]}.items():
        cli(argv)
        got = capsys.readouterr()
        out[name] = got.out + got.err
    chrome = tmp_path / f"chrome-{len(list(tmp_path.iterdir()))}.json"
    assert cli(["export", store, "--chrome", str(chrome)]) == 0
    got = capsys.readouterr()
    out["export"] = got.out + got.err + chrome.read_text()
    copy_dir = tmp_path / f"copy-{len(list(tmp_path.iterdir()))}"
    assert cli(["copy", store, str(copy_dir)]) == 0
    got = capsys.readouterr()
    out["copy"] = got.out + got.err
    out["copied bytes"] = b"".join(p.read_bytes() for p in sorted(copy_dir.rglob("*")) if p.is_file()).decode(
        "utf-8", "replace")
    return out


def replay_texts(store: str) -> list[str]:
    """The replay console (Pilot): every finding's detail pane and the whole screen."""
    from tui_scenarios import load

    from commscope.analysis.source import open_source
    from commscope.redact import redact
    from commscope.tui.app import CommscopeApp
    from commscope.tui.feed import REPLAY, Feed

    feed = Feed(open_source(store), mode=REPLAY, source=redact(store))
    app = CommscopeApp(feed, start_feed=False, bell=False, title=redact(store))
    texts: list[str] = []

    async def run() -> None:
        async with app.run_test(size=(160, 50)) as pilot:
            load(app)
            await pilot.pause()
            assert app.findings, "the crash is a finding"
            await pilot.press("2")
            for _ in app.findings:
                await pilot.pause()
                texts.append(app.detail.border_title + "\n" + app.detail.text(width=150))
                texts.append(app.export_screenshot())
                await pilot.press("down")

    asyncio.run(run())
    return texts


def check_job(store: str, tmp_path: Path, capsys, proc: subprocess.CompletedProcess) -> dict[str, str]:
    assert proc.returncode != 0, "rank 1 dies of its exception"
    events = read_events(store)
    for rank in (0, 1):
        assert of_type(events, "meta", rank)[0]["argv"][1:] == REDACTED_ARGV
    exits = of_type(events, "exit", 1)
    assert exits and exits[-1]["exc"].startswith("RuntimeError: cannot reach postgres://admin:***@db.internal:5432/runs")
    assert "Bearer ***" in exits[-1]["exc"] and "wandb key ***;" in exits[-1]["exc"]
    assert "-----BEGIN RSA PRIVATE KEY-----***-----END RSA PRIVATE KEY-----" in exits[-1]["exc"]
    failed = [e for e in events if e["type"] == "op" and e["phase"] == "end" and "cannot pickle" in e.get("exc", "")]
    assert len(failed) == 2  # both ranks' all_gather_object failed, masked in place in the native block
    assert all("api_key=" in e["exc"] and "--password" in e["exc"] for e in failed)
    shown = outputs(store, tmp_path, capsys)
    for what, text in shown.items():
        assert_clean(what, text)
    assert "postgres://admin:***@db.internal:5432/runs" in shown["check"].replace("\n", "")
    assert "hooks.example.com/v1/notify?token=***" in shown["copied bytes"]
    return shown


def test_a_job_full_of_secrets_leaves_none_in_a_directory_store(tmp_path, capsys):
    proc = run_job(tmp_path, "trace")
    store = str(tmp_path / "trace")
    assert_clean("the job's commscope lines", proc.stderr.split("commscope: done")[-1])
    for path in sorted(Path(store).rglob("*")):
        if path.is_file():
            assert_clean(str(path), path.read_bytes())
    check_job(store, tmp_path, capsys, proc)
    for text in replay_texts(store):
        assert_clean("replay", text)


def test_a_job_full_of_secrets_leaves_none_in_redis(tmp_path, capsys, redis_url):
    proc = run_job(tmp_path, redis_url)
    assert proc.returncode != 0, proc.stderr[-2000:]
    client = redis_client(redis_url)
    stored: list[bytes] = []
    for key in client.scan_iter(count=1000):
        kind = client.type(key)
        if kind == b"stream":
            stored += [v for _id, fields in client.xrange(key) for kv in fields.items() for v in kv]
        elif kind == b"string":
            stored.append(client.get(key))
        elif kind == b"hash":
            stored += [v for kv in client.hgetall(key).items() for v in kv]
        elif kind in (b"set", b"zset", b"list"):
            stored += list(client.smembers(key) if kind == b"set" else client.zrange(key, 0, -1)
                           if kind == b"zset" else client.lrange(key, 0, -1))
        stored.append(key)
    assert stored
    assert_clean("Redis", b"\n".join(stored))
    check_job(redis_url, tmp_path, capsys, proc)


def test_an_older_trace_holding_secrets_is_redacted_when_shown(tmp_path, capsys):
    """Written as a version before redaction would have: secrets in argv, store, exception
    texts, a call site, a stack and a native block's error record and site table."""
    from commscope import blocks

    store = tmp_path / "old"
    job = store / "j"
    job.mkdir(parents=True)
    (store / "LATEST").write_text("j\n")
    (job / "job.json").write_text(json.dumps({"job": "j", "world_size": 2, "copied_from":
                                              f"redis://:{PASSWORD}@cache.internal:6379/0"}))
    site = f"/home/alice/{HF}/train.py:12 in step"
    recs = (blocks.pack_site(0, f"train.py:3 in login(token={QUERY_TOKEN})")
            + blocks.pack_begin(1, 2_000, name=0, site=0, seq=1, ins=[(6, [4])], outs=[(6, [4])], in_bytes=16,
                                out_bytes=16)
            + blocks.pack_end(1, 3_000, exc=f"RuntimeError: bad auth --api-key {OPENAI}"))
    lines = {
        0: [{"type": "meta", "rank": 0, "ts": 1, "v": 2, "world_size": 2, "backend": "gloo", "recorder": "native",
             "names": ["all_reduce"], "argv": ["train.py", "--password", PASSWORD, f"--hf-token={HF}"],
             "store": f"redis://admin:{URL_PASSWORD}@cache.internal:6379/0"},
            {"type": "group", "rank": 0, "ts": 1, "v": 2, "group": "0", "gid": 0, "granks": [0, 1]},
            json.loads(blocks.encode_block(recs, 0, 5_000, blocks.count_records(recs))),
            {"type": "exit", "rank": 0, "ts": 9_000, "v": 2, "reason": "exception",
             "exc": f"RuntimeError: cannot reach postgres://admin:{URL_PASSWORD}@db.internal:5432/runs"}],
        1: [{"type": "meta", "rank": 1, "ts": 1, "v": 1, "world_size": 2, "backend": "gloo", "argv": ["train.py"]},
            {"type": "op", "rank": 1, "ts": 2_000, "v": 1, "phase": "begin", "id": 1, "op": "all_reduce", "group": "0",
             "seq": 1, "in_shapes": [[4]], "in_dtypes": ["float32"], "in_bytes": 16, "out_shapes": [[4]],
             "out_dtypes": ["float32"], "out_bytes": 16, "site": site},
            {"type": "stack", "rank": 1, "ts": 8_000, "v": 1, "id": 1, "threads": [
                {"tid": 1, "name": f"worker {GITHUB}", "op_thread": True,
                 "frames": [["train.py", 3, "main"], [f"/tmp/{AWS}/x.py", 9, f"fetch_{SLACK}"]]}]},
            {"type": "sample", "rank": 1, "ts": 8_500, "v": 1, "cpu": 1.0, "rss": 1, "gpu_error": f"nvml {JWT}"}],
    }
    for rank, evs in lines.items():
        (job / f"rank-{rank:05d}.jsonl").write_bytes(b"".join(json.dumps(e).encode() + b"\n" for e in evs))
    s = str(store)
    events = read_events(s)
    meta0 = of_type(events, "meta", 0)[0]
    assert meta0["argv"] == ["train.py", "--password", "***", "--hf-token=***"]
    assert meta0["store"] == "redis://admin:***@cache.internal:6379/0"
    ends = [e for e in events if e["type"] == "op" and e["phase"] == "end"]
    assert ends[0]["exc"] == "RuntimeError: bad auth --api-key ***"
    begins = {e["rank"]: e for e in events if e["type"] == "op" and e["phase"] == "begin"}
    assert begins[0]["site"] == "train.py:3 in login(token=***)"
    assert begins[1]["site"] == "/home/alice/hf_***/train.py:12 in step"
    shown = outputs(s, tmp_path, capsys)
    for what, text in shown.items():
        assert_clean(what, text)
    assert "postgres://admin:***@db.internal:5432/runs" in shown["copied bytes"]
    for text in replay_texts(s):
        assert_clean("replay", text)


def test_a_flight_recorder_dumps_group_descriptions_are_redacted(tmp_path, capsys):
    """``new_group(group_desc=…)`` is the program's text, and a Flight Recorder dump holds it
    (``process_group: [name, desc]``): its group events kept it whole in copy's files and
    export's (helper-123)."""
    fr = tmp_path / "fr"
    fr.mkdir()
    for rank in (0, 1):
        entry = {"record_id": 0, "process_group": ["1", f"eval --password {PASSWORD} {HF}"], "collective_seq_id": 1,
                 "profiling_name": "nccl:all_reduce", "time_created_ns": 10**18, "state": "scheduled",
                 "frames": [{"filename": "train.py", "line": 3, "name": "main"}]}
        (fr / f"rank_{rank}").write_text(json.dumps({"version": "2.10", "entries": [entry], "pg_config": {
            "1": {"name": "1", "desc": f"eval --password {PASSWORD}", "ranks": "[0, 1]"}}}))
    shown = outputs(str(fr), tmp_path, capsys)
    for what, text in shown.items():
        assert_clean(what, text)
    assert '"desc":"eval --password *** hf_***"' in shown["copied bytes"]


KILLED = """
import os, signal, sys, orjson
from commscope import blocks
from commscope.record.pyspool import PyRing
from commscope.store import spool
store, secret = sys.argv[1], sys.argv[2]
sp = spool.Spool.create({"job": "killed", "store_id": spool.store_id(store), "store": store, "rank": 1, "inc": 0,
                         "run": "r1", "host": "h", "pid": os.getpid()}, ring=1 << 16)
ring = PyRing(1 << 16)
ring.attach(sp.fd)
ring.note_meta(orjson.dumps({"type": "meta", "rank": 1, "ts": 1, "v": 3, "world_size": 2,
                             "argv": ["train.py", "--password", secret]}))
ring.put(blocks.pack_site(0, "train.py:9 in login(password=" + secret + ")"))
ring.put(blocks.pack_begin(1, 2_000, site=0, seq=1, ins=[(6, [4])], outs=[(6, [4])], in_bytes=16, out_bytes=16))
ring.put(blocks.pack_end(1, 3_000, exc="RuntimeError: auth failed for redis://:" + secret + "@cache:6379/0"))
ring.keep_event(orjson.dumps({"type": "exit", "rank": 1, "ts": 4_000, "v": 3, "reason": "exception",
                              "exc": "ValueError: api_key=" + secret}))
print(sp.path, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_ranks_spool_reaches_the_store_redacted(tmp_path):
    """What a rank killed outright left in its spool (never redacted by a drain) is
    redacted by whoever forwards it."""
    from commscope.store import open_writer, spool

    store = str(tmp_path / "trace")
    open_writer(store, "killed", 0, {"world_size": 2}).close()
    p = subprocess.run([sys.executable, "-c", KILLED, store, PASSWORD], capture_output=True, text=True, timeout=60)
    assert p.returncode == -9, p.stderr
    pid = int(Path(p.stdout.strip()).name.split("-")[0])
    assert spool.forward_orphans(exit_status={pid: -9}.get, only=spool.store_id(store)) == 1  # not the spools of other tests
    for path in Path(store).rglob("*"):
        if path.is_file():
            assert_clean(str(path), path.read_bytes())
    events = [e for e in read_events(store) if e["rank"] == 1]
    meta = of_type(events, "meta")[0]
    assert meta["argv"] == ["train.py", "--password", "***"]
    ops = [e for e in events if e["type"] == "op"]
    assert [e["phase"] for e in ops] == ["begin", "end"]
    assert ops[0]["site"].startswith("train.py:9 in login(password=*")
    assert ops[1]["exc"].startswith("RuntimeError: auth failed for redis://:*") and ops[1]["exc"].endswith(
        "@cache:6379/0")
    assert [e["exc"] for e in of_type(events, "exit") if e.get("reason") == "exception"] == ["ValueError: api_key=***"]


def test_the_documented_redis_acl_is_enough_for_commscope_and_no_more(redis_url, redis_server):
    """docs/security.md's ACL user writes and reads a trace, and reads nothing else."""
    import redis

    doc = (Path(__file__).resolve().parent.parent / "docs" / "security.md").read_text()
    rule = next(line for line in doc.splitlines() if line.startswith("ACL SETUSER ml-team"))
    admin = redis_client(redis_url)
    admin.execute_command(*rule.split())
    admin.set("payroll:2026", "not yours")
    try:
        from commscope.store import open_reader, open_writer

        host = redis_url.split("//", 1)[1]
        url = f"redis://ml-team:long-random-password@{host}"
        w = open_writer(url, "acl", 0, {"world_size": 1})
        w.write([b'{"type":"meta","rank":0,"ts":1,"v":3,"world_size":1}',
                 b'{"type":"heartbeat","rank":0,"ts":2,"v":3,"inflight":0}'])
        w.close()
        assert [e["type"] for e in open_reader(url).read_all()] == ["meta", "heartbeat"]
        t = __import__("commscope.store.redis_url", fromlist=["parse_url"]).parse_url(url)
        team = redis.Redis(host=t.host, port=t.port, db=t.db, username="ml-team", password=t.password, protocol=2)
        with pytest.raises(redis.exceptions.NoPermissionError):
            team.get("payroll:2026")
    finally:
        admin.execute_command("ACL", "DELUSER", "ml-team")
        admin.delete("payroll:2026")


# ------------------------------------------------------------------ a text cut to fit a record
def _crossing_the_cut() -> dict[str, str]:
    """Exception texts with a credential that starts before byte 4096 of the text (the
    native recorder's ``kMaxText``) and ends after it; by its piece that must not survive."""
    head = "RuntimeError: "
    return {"TRUNCSEC": head + "a" * 4060 + " postgres://u:TRUNCSECRET0123456789ABCDEFGH@db/app",
            "hf_TRUNC": head + "b" * 4070 + " hf_TRUNCHFTOKEN0123456789abcdefgh",
            "Pg-S3cr": head + "c" * 4070 + f" --password={URL_PASSWORD}"}


def test_a_secret_cut_by_a_records_text_limit_leaves_no_piece():
    """A text is cut to fit its record before its credentials are masked (at drain): the cut
    drops the word it falls in, so no piece of a credential stays that the masker could no
    longer recognise (a URL's password without its "@host", a token's first half)."""
    from commscope import blocks

    for piece, text in _crossing_the_cut().items():
        masked = blocks.mask_texts(blocks.pack_end(1, 2, exc=text))
        assert piece.encode() not in masked, piece
        kept = blocks.cut_text(text.encode())
        assert len(kept) <= blocks.MAX_RECORD_TEXT and kept.endswith(blocks.CUT_MARK)
        assert kept == text.encode().rsplit(b" ", 1)[0] + blocks.CUT_MARK  # the whole words before it
    short = b"RuntimeError: " + b"x" * 100
    assert blocks.cut_text(short) == short
    assert blocks.cut_text(b"y" * 5000) == blocks.CUT_MARK  # one long word: nothing of it


CUT_RANK = textwrap.dedent("""
    import json, sys
    import torch, torch.distributed as dist
    import commscope
    rec = commscope.instrument(sys.argv[1], flight_recorder=False)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[2], rank=0, world_size=1)

    class Bad:
        def __init__(self, text):
            self.text = text
        def __reduce__(self):
            raise RuntimeError(self.text)

    for text in json.loads(sys.argv[3]):
        try:
            dist.broadcast_object_list([Bad(text.split(": ", 1)[1])], src=0)
        except RuntimeError:
            pass
    dist.all_reduce(torch.ones(4))
    source = type(rec.ops).__name__
    commscope.uninstrument()
    dist.destroy_process_group()
    print(json.dumps({"source": source}))
""")


def test_the_native_recorder_cuts_an_error_before_a_whole_word(tmp_path):
    """The auditor's repro (/tmp/h74/job4.py), in one rank: the native recorder keeps 4096
    bytes of an error and masks them when the block is drained; a credential crossing byte
    4096 left its first half in the trace ("postgres://u:TRUNCSEC", "hf_TRUNCHFT")."""
    from commscope.launch import free_port
    from commscope.record import native

    built = subprocess.run([sys.executable, "-m", "commscope.record.native", "build"], capture_output=True,
                           text=True, timeout=900)
    assert built.returncode == 0, built.stdout + built.stderr
    texts = _crossing_the_cut()
    store = tmp_path / "trace"
    env = dict(__import__("os").environ, COMMSCOPE_NATIVE="1", COMMSCOPE_NATIVE_DIR=str(native.build_dir().parent))
    proc = subprocess.run([sys.executable, "-c", CUT_RANK, str(store), str(free_port()), json.dumps(list(texts.values()))],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"source": "NativeOps"}, proc.stderr[-3000:]
    raw = b"\n".join(unpacked(p.read_bytes()) for p in sorted(store.rglob("*")) if p.is_file())
    for piece in texts:
        assert piece.encode() not in raw, piece
    failed = [e["exc"] for e in read_events(store) if e["type"] == "op" and e["phase"] == "end" and e.get("exc")]
    assert len(failed) == len(texts), failed
    for exc, text in zip(sorted(failed), sorted(texts.values()), strict=True):
        assert exc == text.rsplit(" ", 1)[0] + "\u2026"  # its whole words, and the mark of the cut


# ------------------------------------------------------------------ code caches every rank loads
@pytest.fixture
def umask000():
    import os

    old = os.umask(0)
    yield
    os.umask(old)


def _mode(path) -> int:
    import os
    import stat

    return stat.S_IMODE(os.stat(path).st_mode)


def _another_users(path: Path, monkeypatch) -> None:
    """``path`` as another user's: chowned where we may (root), else we pretend to be someone else."""
    import os

    if os.getuid() == 0:
        os.chown(path, 4242, 4242)
    else:
        uid = os.getuid() + 4242
        monkeypatch.setattr(os, "getuid", lambda: uid)


class _FakeCompiler:
    """``subprocess.Popen`` of the native build's child: writes a module file the way a
    compiler does (the umask's mode), compiling nothing."""

    def __init__(self, command, **kw):
        scratch = Path(command[3])
        (scratch / "commscope_native.so").write_bytes(b"\x7fELF not really")
        self.pid, self.returncode = 0, 0

    def communicate(self, timeout=None):
        return "", None


def test_the_native_build_is_private_whatever_the_umask(tmp_path, umask000, monkeypatch):
    """Under umask 000 the build directory and the module every rank loads were 0777: another
    local user could have put their module there."""
    from commscope.record import native

    monkeypatch.setattr(native.subprocess, "Popen", _FakeCompiler)
    directory = tmp_path / "cache" / "native" / "torch-x"
    native._build(directory, verbose=True)
    assert _mode(tmp_path / "cache") == _mode(directory.parent) == _mode(directory) == 0o700
    assert _mode(directory / "commscope_native.so") == 0o700


def test_a_native_build_others_could_change_is_never_loaded(tmp_path, monkeypatch, capsys):
    import re

    from commscope.record import native

    monkeypatch.setattr(native, "_warned", False, raising=False)
    directory = tmp_path / "native" / "torch-x"
    directory.mkdir(parents=True, mode=0o700)
    module = directory / "commscope_native.so"
    module.write_bytes(b"\x7fELF not really")  # (never imported: refused first)
    for unsafe, why in ((module, "writable by the group and others (mode 0777)"),
                        (directory, "writable by others (mode 0703)"),
                        (directory.parent, "writable by the group (mode 0770)")):
        old = _mode(unsafe)
        unsafe.chmod({module: 0o777, directory: 0o703, directory.parent: 0o770}[unsafe])
        with pytest.raises(native.Refused, match=re.escape(f"{unsafe} is {why}")):
            native._import_built(directory)
        unsafe.chmod(old)
    monkeypatch.setattr(native.subprocess, "Popen", _FakeCompiler)
    module.unlink()
    directory.chmod(0o777)
    with pytest.raises(native.Refused):
        native._build(directory, verbose=True)  # (nor built into: checked before the compiler runs)
    assert list(directory.iterdir()) == []
    directory.chmod(0o700)
    module.write_bytes(b"\x7fELF not really")
    _another_users(directory, monkeypatch)
    with pytest.raises(native.Refused, match="belongs to .*uid 4242|belongs to .*, not to you"):
        native._import_built(directory)
    assert "refusing to use the native recorder's build" in capsys.readouterr().err


def test_the_compiled_kernels_cache_is_private_whatever_the_umask(tmp_path, umask000, monkeypatch):
    from commscope import compiled

    monkeypatch.setattr(compiled, "_build_locked", lambda directory, *a: directory)
    monkeypatch.setattr(compiled, "load_all", lambda: [])
    directory = tmp_path / "cache" / "kernels" / compiled.tag()
    assert compiled.build(directory) == directory
    assert _mode(tmp_path / "cache") == _mode(directory.parent) == _mode(directory) == 0o700
    assert _mode(directory / ".lock") == 0o600
    (directory / ".lock").chmod(0o666)  # (made by an earlier version): refused, never used
    with pytest.raises(RuntimeError, match="refusing to build in .* is writable by the group and others"):
        compiled.build(directory)


def test_compiled_kernels_others_could_change_are_never_loaded(tmp_path, monkeypatch, capsys):
    import hashlib

    from commscope import compiled

    monkeypatch.setattr(compiled, "_warned", set(), raising=False)
    directory = tmp_path / "kernels" / "tag"
    directory.mkdir(parents=True, mode=0o700)
    data = b"\x7fELF not really"
    name = compiled.MODULE + "_x.so"
    (directory / name).write_bytes(data)
    (directory / name).chmod(0o700)
    (directory / compiled.MANIFEST).write_text(json.dumps({
        "module": compiled.MODULE + "_x", "file": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
        "exports": [], "numba": "0"}))
    (directory / compiled.MANIFEST).chmod(0o600)
    assert compiled._built(directory) is not None
    for path in (directory / name, directory / compiled.MANIFEST, directory, directory.parent):
        old = _mode(path)
        path.chmod(old | 0o022)
        assert compiled._built(directory) is None, path
        path.chmod(old)
    assert compiled._built(directory) is not None
    _another_users(directory / name, monkeypatch)
    assert compiled._built(directory) is None
    err = capsys.readouterr().err
    assert "not loading the kernels compiled ahead of time" in err and "is writable by the group and others" in err
    assert "belongs to" in err


# ------------------------------------------------------------------ what commscope writes
def test_export_writes_a_private_file_and_follows_no_link(tmp_path, capsys):
    """``export --chrome FILE`` followed a symbolic link at FILE (the file it replaced kept its
    0644; a link another user planted in a shared directory chose where the trace went) and
    wrote into a FIFO there.  Now the trace is 0600, and a link, FIFO or device is refused."""
    import os
    import threading

    from test_store_modes import write

    store = tmp_path / "trace"
    write(store)
    there = tmp_path / "there.json"
    there.write_text("old")
    there.chmod(0o644)
    assert cli(["export", str(store), "--chrome", str(there)]) == 0
    assert json.loads(there.read_text())["traceEvents"] and _mode(there) == 0o600  # (an existing file too)
    victim = tmp_path / "victim.txt"
    victim.write_text("theirs")
    victim.chmod(0o644)
    link = tmp_path / "link.json"
    link.symlink_to(victim)
    capsys.readouterr()
    assert cli(["export", str(store), "--chrome", str(link)]) == 2
    assert "symbolic link" in capsys.readouterr().err
    assert link.is_symlink() and victim.read_text() == "theirs" and _mode(victim) == 0o644
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []

    def read() -> None:
        with open(fifo, "rb") as f:
            got.append(f.read())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()  # (a reader waiting: an export that wrote into the FIFO would not block)
    assert cli(["export", str(store), "--chrome", str(fifo)]) == 2
    assert "not a regular file" in capsys.readouterr().err
    with open(fifo, "wb"):  # (lets the reader go)
        pass
    reader.join(10)
    assert got == [b""]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".part")) == []


def test_a_job_directory_of_another_user_is_refused(tmp_path, monkeypatch):
    """A job directory another user made ahead (0750, their group) was written into: job.json
    and the rank files came out 0640, readable by their group."""
    from commscope.store import StoreError, open_writer

    root = tmp_path / "trace"
    (root / "j").mkdir(parents=True)
    (root / "j").chmod(0o750)
    _another_users(root / "j", monkeypatch)
    with pytest.raises(StoreError, match=r"refusing to write trace store .*/trace/j: it belongs to .*not to you"):
        open_writer(str(root), "j", 0, {"world_size": 1})
    assert sorted(p.name for p in (root / "j").iterdir()) == []


@pytest.mark.parametrize("mode, refused", [(0o777, True), (0o1777, False), (0o775, False)])
def test_a_store_root_anyone_may_write_is_refused(tmp_path, monkeypatch, mode, refused):
    """Whoever may write a store's root without its sticky bit can put a directory of theirs
    in place of our job's; a team's root that its group writes, or a sticky one, is fine."""
    from commscope.store import StoreError, open_writer

    root = tmp_path / "trace"
    root.mkdir()
    root.chmod(mode)
    _another_users(root, monkeypatch)
    if refused:
        with pytest.raises(StoreError, match=r"refusing to write trace store .*/trace: it belongs to .* anyone may"):
            open_writer(str(root), "j", 0, {"world_size": 1})
    else:
        open_writer(str(root), "j", 0, {"world_size": 1}).close()
        assert (root / "j" / "job.json").is_file()


def test_a_summary_file_takes_the_job_s_modes(tmp_path):
    """Retention's summary file was made 0600 (what a 077 umask leaves of 0640) in a job
    directory shared with the group, where every other file is 0640."""
    import os

    import orjson

    from commscope.store import retention
    from commscope.store.directory import DirectoryWriter

    old = os.umask(0o077)
    try:
        w = DirectoryWriter(tmp_path, "job", 0, {"world_size": 1}, share=True, segment_bytes=4096, closer=False)
        w.write([orjson.dumps({"type": "meta", "ts": 1, "v": 3, "rank": 0, "world_size": 1})])
        for k in range(200):
            w.write([orjson.dumps({"type": "heartbeat", "ts": 2 + k, "v": 3, "rank": 0, "inflight": k})])
        w.close()
        job = tmp_path / "job"
        assert retention.close_stream(job, 0, 0, retention.Retention(max_bytes=8192, max_age_s=None)) > 0
    finally:
        os.umask(old)
    summary = job / "rank-00000.summary.jsonl"
    assert summary.exists() and _mode(job) == 0o750
    assert {p.name: _mode(p) for p in job.iterdir() if _mode(p) != 0o640} == {}
