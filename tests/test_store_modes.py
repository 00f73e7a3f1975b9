"""A directory store is its owner's to read (issue 22): directories 0700 and files 0600
whatever the umask, group-readable only when asked (``--share-with-group``), and copies
keep the modes of their source."""

from __future__ import annotations

import argparse
import os
import stat
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import commscope
from commscope.cli import main as cli
from commscope.launch import run_ranks
from commscope.store import open_writer
from commscope.store.directory import ENV_SHARE


@pytest.fixture(params=[0o022, 0o000], ids=["umask022", "umask000"])
def umask(request):
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def modes(root: Path) -> dict[str, int]:
    """Permission bits of ``root`` and everything under it, by relative path."""
    out = {".": stat.S_IMODE(os.stat(root).st_mode)}
    for p in sorted(root.rglob("*")):
        out[str(p.relative_to(root))] = stat.S_IMODE(os.lstat(p).st_mode)
    return out


def assert_modes(root: Path, dirs: int, files: int) -> None:
    got = modes(root)
    assert len(got) > 3
    for name, mode in got.items():
        expect = dirs if (root / name).is_dir() else files
        assert mode == expect, f"{name}: {oct(mode)}, expected {oct(expect)}"


def write(root: Path, job: str = "j", ranks: int = 2, share: bool | None = None) -> None:
    for r in range(ranks):
        w = open_writer(str(root), job, r, {"world_size": ranks}, share=share)
        w.write([b'{"type":"meta","rank":%d,"ts":1,"v":3,"world_size":%d}' % (r, ranks)])
        w.close()


def test_a_new_store_is_private_whatever_the_umask(tmp_path, umask):
    root = tmp_path / "a" / "trace"  # parents are created too
    write(root)
    assert {"LATEST", "j", "j/job.json", "j/rank-00000.jsonl", "j/rank-00001.jsonl"} <= set(modes(root))
    assert_modes(root, 0o700, 0o600)
    assert stat.S_IMODE(os.stat(tmp_path / "a").st_mode) == 0o700


def test_shared_with_the_group_when_asked(tmp_path, umask, monkeypatch):
    write(tmp_path / "shared", share=True)
    assert_modes(tmp_path / "shared", 0o750, 0o640)
    monkeypatch.setenv(ENV_SHARE, "1")
    write(tmp_path / "by-env")
    assert_modes(tmp_path / "by-env", 0o750, 0o640)


def test_later_writers_follow_the_job_directory(tmp_path, umask):
    root = tmp_path / "trace"
    write(root, share=True, ranks=1)
    w = open_writer(str(root), "j", 1, share=False)  # another rank, or a forwarder: the job decides
    w.close()
    assert_modes(root, 0o750, 0o640)
    w = open_writer(str(root), "j", 0, resume=True)
    w.close()
    assert_modes(root, 0o750, 0o640)


def test_a_store_deleted_under_a_writer_comes_back_private(tmp_path, umask):
    import shutil

    root = tmp_path / "trace"
    w = open_writer(str(root), "j", 0, {"world_size": 1})
    w.write([b'{"type":"meta","rank":0,"ts":1,"v":3}'])
    shutil.rmtree(root)
    w.write([b'{"type":"heartbeat","rank":0,"ts":2,"v":3,"inflight":0}'])
    w.close()
    assert (root / "j" / "job.json").exists()
    assert_modes(root, 0o700, 0o600)


def ranks_job(rank: int, ws: int, store: str) -> int:
    commscope.instrument(store, sample_interval=0.1, flight_recorder=False)
    dist.all_reduce(torch.ones(1))
    commscope.uninstrument()
    return 0


@pytest.mark.parametrize("share", [False, True], ids=["private", "group"])
def test_a_real_job_writes_what_its_owner_chose(tmp_path, umask, share):
    store = tmp_path / "trace"
    env = {"COMMSCOPE_JOB": "modes"}
    if share:
        env[ENV_SHARE] = "1"
    results = run_ranks(ranks_job, 2, args=(str(store),), env=env, timeout=90)
    assert [r.value for r in results] == [0, 0]
    assert (store / "modes" / "rank-00001.jsonl").stat().st_size > 0
    assert_modes(store, 0o750 if share else 0o700, 0o640 if share else 0o600)


def test_copy_keeps_the_modes_and_shares_when_asked(tmp_path, umask, capsys):
    private, shared = tmp_path / "private", tmp_path / "shared"
    write(private)
    write(shared, share=True)
    assert cli(["copy", str(private), str(tmp_path / "c1"), "-q"]) == 0
    assert_modes(tmp_path / "c1", 0o700, 0o600)
    assert cli(["copy", str(shared), str(tmp_path / "c2"), "-q"]) == 0
    assert_modes(tmp_path / "c2", 0o750, 0o640)
    assert cli(["copy", str(private), str(tmp_path / "c3"), "-q", "--share-with-group"]) == 0
    assert_modes(tmp_path / "c3", 0o750, 0o640)


def test_an_export_is_private_too(tmp_path, umask, capsys):
    write(tmp_path / "trace")
    out = tmp_path / "chrome.json"
    assert cli(["export", str(tmp_path / "trace"), "--chrome", str(out)]) == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o600


def test_run_share_with_group_reaches_the_ranks():
    from commscope.commands.run import build_env

    args = argparse.Namespace(store="t", hang_after=None, job=None, sample_interval=None, no_flight_recorder=False,
                              share_with_group=True)
    assert build_env(args, base={})[ENV_SHARE] == "1"
    args.share_with_group = False
    assert ENV_SHARE not in build_env(args, base={})


def test_a_demos_rank_logs_are_private_too(tmp_path, umask):
    """``commscope demo --store DIR`` writes each rank's output beside its trace: the logs
    directory was made with the umask's mode (0777 under umask 0) and the logs 0644
    (helper-123)."""
    from commscope.scenarios import DemoJob

    job = DemoJob("healthy-training", ranks=2, store=str(tmp_path / "demo"), steps=1, pace=0).start()
    assert job.wait(120), job.errors()
    assert job.exitcodes == [0, 0]
    got = modes(tmp_path / "demo")
    assert any(name.endswith("logs/rank-1.log") for name in got)
    assert_modes(tmp_path / "demo", 0o700, 0o600)
