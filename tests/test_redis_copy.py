"""``commscope copy SRC DST`` between a directory and Redis, both ways, through the CLI."""

from __future__ import annotations

import pytest
from redis_fixture import *  # noqa: F403  (the redis_server and redis_url fixtures)
from redis_fixture import redis_client

from commscope import cli
from commscope import events as E
from commscope.store import open_reader, open_writer


def make_job(store: str, job: str, ranks: int = 3, per_rank: int = 50, meta: dict | None = None) -> None:
    for r in range(ranks):
        w = open_writer(store, job, r, meta or {"world_size": ranks, "backend": "gloo"})
        evs = [{"v": 1, "type": "meta", "rank": r, "ts": 1, "host": "h", "world_size": ranks}]
        for i in range(1, per_rank + 1):
            evs.append({"v": 1, "type": "op", "rank": r, "ts": 10 + i, "phase": "begin" if i % 2 else "end",
                        "id": (i + 1) // 2, "op": "all_reduce", "group": "0", "seq": (i + 1) // 2})
        for a in range(0, len(evs), 40):
            w.write([E.encode(e) for e in evs[a:a + 40]])
        w.close()


def per_rank(events: list[dict]) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for e in events:
        out.setdefault(e["rank"], []).append(e)
    return out


def test_redis_to_directory_and_back(redis_url, tmp_path, capsys):
    make_job(redis_url, "run-7")
    original = per_rank(open_reader(redis_url).read_all())
    archive = tmp_path / "archive"
    assert cli.main(["copy", redis_url, str(archive)]) == 0
    out = capsys.readouterr().out
    assert "copied 153 events of 3 rank(s), job run-7" in out
    assert (archive / "run-7" / "rank-00002.jsonl").exists()
    copied = open_reader(str(archive))
    assert per_rank(copied.read_all()) == original  # same events, same order per rank
    assert copied.job()["job"] == "run-7" and copied.job()["world_size"] == 3
    assert copied.job()["copied_from"].startswith("redis://")

    back = redis_url + "?job=run-7-again"
    assert cli.main(["copy", str(archive), back]) == 0
    again = open_reader(back)
    assert per_rank(again.read_all()) == original
    assert again.job()["job"] == "run-7-again" and again.stats.corrupt == 0


def test_directory_to_redis_keeps_the_job_id(redis_url, tmp_path, capsys):
    src = tmp_path / "trace"
    make_job(str(src), "dir-job", ranks=2)
    assert cli.main(["copy", str(src), redis_url, "-q"]) == 0
    assert capsys.readouterr().out == ""
    reader = open_reader(redis_url)  # the newest job there
    assert reader.job()["job"] == "dir-job"
    assert per_rank(reader.read_all()) == per_rank(open_reader(str(src)).read_all())


def test_copy_refuses_to_mix_and_can_rename(redis_url, tmp_path, capsys):
    src = tmp_path / "trace"
    make_job(str(src), "j", ranks=1)
    assert cli.main(["copy", str(src), redis_url]) == 0
    assert cli.main(["copy", str(src), redis_url]) == 2
    err = capsys.readouterr().err
    assert "refusing to mix jobs" in err and "--job NEW" in err
    assert cli.main(["copy", str(src), redis_url, "--job", "j2"]) == 0
    assert open_reader(redis_url + "?job=j2").job()["job"] == "j2"
    assert cli.main(["copy", str(src), redis_url + "?job=x", "--job", "y"]) == 2


def test_copy_reports_bad_input(redis_url, tmp_path, capsys):
    assert cli.main(["copy", str(tmp_path / "nothing"), str(tmp_path / "out")]) == 2
    assert cli.main(["copy", "redis://127.0.0.1:notaport/0", str(tmp_path / "out")]) == 2
    assert cli.main(["copy", redis_url, str(tmp_path / "out")]) == 2  # an empty database
    err = capsys.readouterr().err
    assert "no trace store" in err and "port" in err and "no commscope trace" in err


def test_large_trimmed_copy_pages_through_and_warns(redis_url, tmp_path, capsys):
    make_job(redis_url + "?maxlen=20000", "big", ranks=2, per_rank=60_000)
    source = open_reader(redis_url)
    expected = per_rank(source.read_all())
    assert source.stats.trimmed
    assert cli.main(["copy", redis_url, str(tmp_path / "big"), "--progress", "always"]) == 0
    captured = capsys.readouterr()
    assert "trimmed" in captured.err
    copied = per_rank(open_reader(str(tmp_path / "big")).read_all())
    # the trimmed part is said in the copy (a store_lost marker first), the rest is the same
    markers = {r: v[0] for r, v in copied.items()}
    assert all(m["type"] == "dropped" and "store_lost" in m["reason"] for m in markers.values())
    assert {r: v[1:] for r, v in copied.items()} == expected
    assert all(m["entries"] == 60_001 - len(expected[r]) for r, m in markers.items())
    assert all(20_000 <= len(v) < 60_001 for v in expected.values())


@pytest.mark.parametrize("to", ["directory", "redis", "directory, then redis"])
def test_a_copy_of_a_trimmed_trace_still_says_what_is_missing(redis_url, tmp_path, capsys, to):
    """The source lost its oldest events to maxlen: check on it exits 1 (trace_incomplete); a
    copy must not pass for a whole trace (exit 0) because its own numbering has no gap.  Nor
    a copy of the copy: a directory's ``store_lost`` marker copied into Redis is a gap in its
    entry numbers there (it was an entry a Redis reader does not count, and check said the
    trace looked healthy, exit 0: helper-172)."""
    import json

    make_job(redis_url + "?maxlen=10", "trim", ranks=2, per_rank=300)
    assert cli.main(["check", redis_url, "--json"]) == 1
    lost = json.loads(capsys.readouterr().out)["skipped"]["store_missing"]
    assert lost > 0
    base, db = redis_url.rsplit("/", 1)
    other = f"{base}/{int(db) % 63 + 1}"  # (another database)
    dst = str(tmp_path / "copy") if to.startswith("directory") else other
    if to != "directory":
        redis_client(other).flushdb()
    assert cli.main(["copy", redis_url, dst, "--job", "trimcopy", "-q"]) == 0
    target = str(tmp_path / "copy" / "trimcopy") if to.startswith("directory") else dst + "?job=trimcopy"
    if to == "directory, then redis":
        assert cli.main(["copy", target, other, "--job", "again", "-q"]) == 0
        target = other + "?job=again"
    capsys.readouterr()
    rc = cli.main(["check", target, "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 1 and any(f["kind"] == "trace_incomplete" for f in out["findings"]), out
    assert out["skipped"]["store_missing"] == lost


@pytest.mark.parametrize("to", ["directory", "redis"])
def test_a_copy_of_a_retained_trace_counts_what_retention_summarized(redis_url, tmp_path, capsys, to):
    """The copy holds the summaries of the segments retention deleted among its events: check
    on the copy says what check on the source says, the summarized count and the culprit
    (it read 0 summarized: helper-166)."""
    import json
    from pathlib import Path

    from commscope.bench.synthstore import JobShape, write_store
    from commscope.store import retention

    store = str(tmp_path / "trace")
    shape = JobShape(4, 1500, fault="missing", hang_after=2.0, segment_bytes=32 << 10)
    write_store(store, shape)
    limit = retention.Retention(max_bytes=4 * (32 << 10), max_age_s=None)
    assert all(retention.close_stream(Path(store) / "synthetic", r, 0, limit) > 0 for r in range(4))
    assert cli.main(["check", store, "--json"]) == 1
    source = json.loads(capsys.readouterr().out)
    assert source["skipped"]["summarized"] > 0
    base, db = redis_url.rsplit("/", 1)
    dst = str(tmp_path / "copy") if to == "directory" else f"{base}/{int(db) % 63 + 1}"  # (another database)
    if to == "redis":
        redis_client(dst).flushdb()
    assert cli.main(["copy", store, dst, "--job", "kept", "-q"]) == 0
    capsys.readouterr()
    target = str(tmp_path / "copy" / "kept") if to == "directory" else dst + "?job=kept"
    assert cli.main(["check", target, "--json"]) == 1
    copied = json.loads(capsys.readouterr().out)
    assert copied["skipped"]["summarized"] == source["skipped"]["summarized"]
    assert [(f["kind"], f["culprits"]) for f in copied["findings"]] == [
        (f["kind"], f["culprits"]) for f in source["findings"]] == [("missing_ranks", [shape.culprit_rank])]
    assert any(w.startswith("retention summarized") for w in copied["warnings"]), copied["warnings"]


def test_a_directory_trace_s_store_lost_marker_copied_into_redis_counts_what_was_lost(redis_url, tmp_path, capsys):
    """A directory writer's ``store_lost`` marker says every line it wrote before it (its
    reader counts those it had not read); copied into Redis as a gap of that many entries,
    check counted 607 lost where 41 were (helper-175).  Into Redis, the gap is what the
    source's reader counted, and a Redis copy of that copy says the same."""
    import json

    from commscope.store.directory import DirectoryWriter
    from commscope.store.retention import Retention

    root = tmp_path / "trace"
    w = DirectoryWriter(root, "lost", 0, {"world_size": 1}, segment_bytes=16 << 10, closer=False,
                        retain=Retention(None, None))
    w.write([E.encode({"v": 1, "type": "meta", "rank": 0, "ts": 1, "host": "h", "world_size": 1})])
    for i in range(1, 401):
        w.write([E.encode({"v": 1, "type": "op", "rank": 0, "ts": 10 + 2 * i, "phase": "begin", "id": i,
                           "op": "all_reduce", "group": "0", "seq": i}),
                 E.encode({"v": 1, "type": "op", "rank": 0, "ts": 11 + 2 * i, "phase": "end", "id": i})])
        if i == 250:
            w.path.unlink()  # (the file being written, by hand: the writer starts it again with a marker)
    w.close()

    def missing(target: str) -> int:
        assert cli.main(["check", target, "--json"]) == 1
        return json.loads(capsys.readouterr().out)["skipped"]["store_missing"]

    lost = missing(str(root / "lost"))
    assert 0 < lost < 500
    base, db = redis_url.rsplit("/", 1)
    other = f"{base}/{int(db) % 63 + 1}"
    redis_client(other).flushdb()
    assert cli.main(["copy", str(root / "lost"), redis_url, "--job", "c1", "-q"]) == 0
    assert missing(redis_url + "?job=c1") == lost
    assert cli.main(["copy", redis_url + "?job=c1", other, "--job", "c2", "-q"]) == 0
    assert missing(other + "?job=c2") == lost


@pytest.mark.parametrize("loss", ["deleted", "cut", "cut, then summarized"])
@pytest.mark.parametrize("to", ["directory", "redis"])
def test_a_copy_of_a_directory_trace_says_every_line_its_source_lost_once(redis_url, tmp_path, capsys, loss, to):
    """A directory trace lost a segment of rank 1 (deleted by hand), or the lines cut off its
    end with its last line torn (then, maybe, retention summarized it): check on the source
    exits 1, trace_incomplete on rank 1, and a copy, into a directory or Redis, and a copy of
    that copy, say as many lines lost, once.  Before, a directory copy carried none of them
    (healthy, exit 0), and into Redis a summarized cut was counted by the summary and by the
    gap (74 for 37, helper-177)."""
    import json
    from pathlib import Path

    from commscope.bench.synthstore import JobShape, write_store
    from commscope.store import retention
    from commscope.store.segments import list_segments

    store = tmp_path / "trace"
    write_store(str(store), JobShape(4, 400, fault="healthy", days=7, segment_bytes=16 << 10))
    job = store / "synthetic"
    seg = next(s for s in list_segments(job)[(1, 0)] if s.number == 3)
    if loss == "deleted":
        seg.path.unlink()
    else:
        seg.path.write_bytes(seg.path.read_bytes()[:13_000])
    if loss == "cut, then summarized":
        assert retention.close_stream(job, 1, 0, retention.Retention(None, 2 * 86400)) > 3

    def lost(target: str) -> int:
        assert cli.main(["check", target, "--json"]) == 1
        out = json.loads(capsys.readouterr().out)
        assert [(f["kind"], f["culprits"]) for f in out["findings"]] == [("trace_incomplete", [1])], out["findings"]
        return out["skipped"]["store_missing"] + out["skipped"]["damaged"]

    source = lost(str(job))
    assert source > 1
    base, db = redis_url.rsplit("/", 1)
    other = f"{base}/{int(db) % 63 + 1}"  # (another database)
    redis_client(other).flushdb()
    first = str(tmp_path / "copy") if to == "directory" else redis_url
    assert cli.main(["copy", str(job), first, "--job", "c1", "-q"]) == 0
    target = str(Path(first) / "c1") if to == "directory" else f"{first}?job=c1"
    assert lost(target) == source
    again = str(tmp_path / "again") if to == "redis" else other
    assert cli.main(["copy", target, again, "--job", "c2", "-q"]) == 0
    assert lost(str(Path(again) / "c2") if to == "redis" else f"{again}?job=c2") == source


def test_a_directory_copy_keeps_every_segment_whatever_retention_the_environment_asks(tmp_path, capsys,
                                                                                      monkeypatch):
    """An archive keeps what it copied: ``$COMMSCOPE_RETAIN`` (and its 1 GiB default) bounded
    the copy's writers as a job's, and retention deleted what the copy wrote (68,795 events
    copied, 38,123 held, helper-177)."""
    import json

    from commscope.store.segments import list_segments

    src = tmp_path / "trace"
    make_job(str(src), "kept", ranks=2, per_rank=20_000)
    assert cli.main(["check", str(src / "kept"), "--json"]) in (0, 1)
    events = json.loads(capsys.readouterr().out)["events"]
    assert sum(p.stat().st_size for p in (src / "kept").glob("rank-00000*")) > 2 << 20
    monkeypatch.setenv("COMMSCOPE_RETAIN", "1MiB")
    monkeypatch.setenv("COMMSCOPE_SEGMENT_MB", "0.25")
    assert cli.main(["copy", str(src), str(tmp_path / "copy")]) == 0
    assert f"copied {events:,} events" in capsys.readouterr().out
    segs = list_segments(tmp_path / "copy" / "kept")
    assert all(len(v) > 4 and [s.number for s in v] == list(range(len(v))) for v in segs.values()), segs
    assert cli.main(["check", str(tmp_path / "copy" / "kept"), "--json"]) in (0, 1)
    out = json.loads(capsys.readouterr().out)
    metas = sum(len(v) - 1 for v in segs.values())  # (each segment after the first opens with the meta)
    assert out["events"] == events + metas and out["skipped"]["summarized"] == 0, out["skipped"]


@pytest.mark.parametrize("to", ["directory", "redis"])
def test_a_copy_of_a_trace_whose_read_begins_where_nothing_says_what_ranks_were_in_is_not_healthy(
        redis_url, tmp_path, capsys, to):
    """A 3 h hang begun in segments retention summarized, the carry of the newest one deleted
    by hand from ranks 0-2: check on the source says it cannot tell what they were in (an
    error); a copy, whose streams start afresh, says the same, its findings the source's.
    Before, the copy read healthy but for a warning, exit 0 (helper-179); and its markers,
    timed now among a week-old trace's events, made rank 3 the one silent: dead_rank."""
    import json
    from pathlib import Path

    from commscope.bench.synthstore import JobShape, write_store
    from commscope.store import retention

    store = tmp_path / "trace"
    write_store(str(store), JobShape(4, 400, fault="missing", days=7, segment_bytes=16 << 10, tail_s=10800))
    job = store / "synthetic"
    for r in range(4):
        assert retention.close_stream(job, r, 0, retention.parse("1MiB")) > 0
    newest = json.loads((job / "rank-00000.summary.jsonl").read_bytes().splitlines()[-1])["seg"]
    for r in range(3):
        (job / f"rank-{r:05d}.open.{newest:06d}.jsonl").unlink()

    def found(target: str) -> list:
        assert cli.main(["check", target, "--json"]) == 1
        return [(f["kind"], f["severity"], f["culprits"]) for f in json.loads(capsys.readouterr().out)["findings"]]

    source = found(str(job))
    assert source == [("trace_incomplete", "error", [0, 1, 2, 3])]
    base, db = redis_url.rsplit("/", 1)
    dst = str(tmp_path / "copy") if to == "directory" else f"{base}/{int(db) % 63 + 1}"
    if to == "redis":
        redis_client(dst).flushdb()
    assert cli.main(["copy", str(job), dst, "--job", "c", "-q"]) == 0
    assert found(str(Path(dst) / "c") if to == "directory" else f"{dst}?job=c") == source


def test_a_stream_whose_end_a_whole_read_could_not_read_is_a_loss_its_copy_says():
    """A stream the source's whole read left unread at its end (retention outran it) wrote
    no marker in its copy, which read healthy (helper-210)."""
    from commscope.commands.copy import _lost
    from commscope.store import ReadStats

    class Source:
        stats = ReadStats(unread_by_rank={3: 1})

    assert _lost(Source(), 3) == 1 and _lost(Source(), 2) == 0
