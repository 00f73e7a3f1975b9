"""A week-long job in a directory store: segments, a bounded history, windowed reads.

A stream rotates into segments that each decode alone; a follower reads every event once
across rotations; retention summarizes what it deletes, and readers count it; a window
(``--since``) reads only its segments yet finds exactly what a full read finds, a rank dead
for an hour included, because the ops in flight at each segment's end are carried.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import NamedTuple

import numpy as np
import orjson
import pytest
from readers import by_workers

from commscope import histories
from commscope.analysis.diagnose import default_hang_after, diagnose, trace_now
from commscope.analysis.model import TraceModel
from commscope.analysis.source import load_trace, open_source
from commscope.bench.synthstore import JobShape, Written, write_store
from commscope.cli import main as cli
from commscope.store import files, inflight, open_reader, retention
from commscope.store.directory import DirectoryWriter
from commscope.store.files import size_of
from commscope.store.segments import list_segments
from commscope.tui.feed import LIVE, Feed
from commscope.window import Since, parse_since

S = 1_000_000_000
T0 = 1_780_000_000 * S


def meta(rank: int = 0, world: int = 1) -> bytes:
    return orjson.dumps({"type": "meta", "ts": T0, "v": 3, "rank": rank, "world_size": world, "host": "h",
                         "sample_interval": 1.0})


def beat(rank: int, k: int) -> bytes:
    return orjson.dumps({"type": "heartbeat", "ts": T0 + k * S, "v": 3, "rank": rank, "inflight": k})


def written_beats(events: list[dict]) -> list[int]:
    return [e["inflight"] for e in events if e["type"] == "heartbeat"]


def _segmented(tmp_path, ranks: int = 1, beats: int = 3000, segment: int = 16 << 10, step: int = 50) -> Path:
    """Writes ``beats`` heartbeats per rank, ``step`` a write, in segments of ``segment`` bytes."""
    for r in range(ranks):
        w = DirectoryWriter(tmp_path, "job", r, {"world_size": ranks}, segment_bytes=segment, closer=False)
        w.write([meta(r)])
        for k in range(0, beats, step):
            w.write([beat(r, j) for j in range(k, min(k + step, beats))])
        w.close()
    return tmp_path / "job"


def test_a_stream_rotates_into_segments_that_each_decode_alone(tmp_path):
    _segmented(tmp_path, beats=300, segment=2048, step=10)
    segs = list_segments(tmp_path / "job")[(0, 0)]
    assert len(segs) > 5 and [s.number for s in segs] == list(range(len(segs)))
    assert segs[0].path.name == "rank-00000.jsonl" and segs[1].path.name.startswith("rank-00000.s000001.t")
    for s in segs:
        first = orjson.loads(s.path.read_bytes().split(b"\n", 1)[0])
        assert first["type"] == "meta"  # each decodes alone
        if s.number:
            assert s.start_s == orjson.loads(s.path.read_bytes().split(b"\n")[1])["ts"] // S
    events = open_reader(tmp_path).read_all()
    assert written_beats(events) == list(range(300))  # every event once, in order
    assert sum(e["type"] == "meta" for e in events) == len(segs)


def test_another_spelling_of_a_segment_s_name_is_not_read_for_it_nor_beside_it(tmp_path):
    """``rank-0.jsonl`` beside ``rank-00000.jsonl`` parsed as the same first segment, and the
    reader kept the first in sort order: the real stream's events were lost, uncounted; a
    second spelling of a later segment (``.s0000001``) was read as a copy of it."""
    job = _segmented(tmp_path, beats=300, segment=2048, step=10)
    segs = list_segments(job)[(0, 0)]
    first, second = segs[0].path, segs[1].path
    (job / "rank-0.jsonl").write_bytes(meta(0) + b"\n" + beat(0, 9999) + b"\n")
    (job / second.name.replace(".s000001.", ".s0000001.")).write_bytes(second.read_bytes())
    (job / "rank-00000+0.jsonl").write_bytes(first.read_bytes())
    (job / "rank-00000+01.summary.jsonl").write_bytes(orjson.dumps(
        {"type": "summary", "rank": 0, "ts": T0, "v": 3, "seg": 7, "events": 10, "size": 100, "ops": []}) + b"\n")
    assert [s.path for s in list_segments(job)[(0, 0)]] == [s.path for s in segs] and len(list_segments(job)) == 1
    events = open_reader(tmp_path).read_all()
    assert written_beats(events) == list(range(300))  # every event once, in order, none of the others
    assert not [e for e in events if e["type"] == "summary"]


def test_a_follower_reads_every_event_once_across_rotations(tmp_path):
    w = DirectoryWriter(tmp_path, "job", 0, {"world_size": 1}, segment_bytes=1500, closer=False)
    w.write([meta()])
    reader = open_reader(tmp_path)
    got: list[dict] = []
    for k in range(0, 200, 7):
        w.write([beat(0, j) for j in range(k, min(k + 7, 200))])
        if k % 3 == 0:
            got += reader.poll(max_bytes=300)  # behind, with a small budget: rotations happen between polls
    w.close()
    for _ in range(50):
        more = reader.poll(max_bytes=300)
        got += more
        if not more:
            break
    got += reader.read_all()
    assert written_beats(got) == list(range(200))


def test_a_forwarder_appends_to_the_newest_segment(tmp_path):
    _segmented(tmp_path, beats=60, segment=1024, step=6)
    newest = list_segments(tmp_path / "job")[(0, 0)][-1]
    f = DirectoryWriter(tmp_path, "job", 0, resume=True, segment_bytes=1024, closer=False)
    assert f.path == newest.path
    f.write([beat(0, 60)])
    f.close()
    assert written_beats(open_reader(tmp_path).read_all()) == list(range(61))
    with pytest.raises(Exception, match="already holds events"):
        DirectoryWriter(tmp_path, "job", 0, segment_bytes=1024)  # a new job never mixes into it


def _ops_by_name(model) -> Counter:
    out: Counter = Counter()
    for r in model.rank_ids():
        rt = model.ranks[r]
        for i in range(rt.n):
            out[model.sigs[int(rt.sig[i])].op] += 1
    return out


def test_retention_summarizes_what_it_deletes_and_readers_count_it(tmp_path):
    store = str(tmp_path / "trace")
    shape = JobShape(4, 3000, fault="missing", hang_after=2.0, segment_bytes=64 << 10)
    written = write_store(store, shape)
    before, _, _ = load_trace(store)
    job = Path(store) / "synthetic"
    sizes = {s.path: os.path.getsize(s.path) for segs in list_segments(job).values() for s in segs}
    limit = retention.Retention(max_bytes=(1 << 20) + 4 * (64 << 10), max_age_s=None)
    gone = {r: retention.close_stream(job, r, 0, limit) for r in range(4)}
    assert all(n > 0 for n in gone.values())
    for r in range(4):  # bounded: what is left fits the limit, give or take the newest segment
        left = [s for s in list_segments(job)[(r, 0)]]
        assert sum(os.path.getsize(s.path) for s in left) <= limit.max_bytes + (64 << 10)
        summaries = [orjson.loads(x) for x in (job / f"rank-{r:05d}.summary.jsonl").read_bytes().splitlines()]
        assert [s["seg"] for s in summaries] == list(range(gone[r]))  # one per deleted segment, oldest first
        assert sum(s["size"] for s in summaries) == sum(v for p, v in sizes.items()
                                                        if p.name.startswith(f"rank-{r:05d}") and not p.exists())
    after, reader, warnings = load_trace(store)
    # nothing dropped unsaid: the ops read plus those the summaries stand for are the ops written
    summarized: Counter = Counter()
    for r in after.rank_ids():
        for s in after.ranks[r].summaries:
            for op in s["ops"]:
                summarized[op["op"]] += op["count"]
    assert _ops_by_name(after) + summarized == _ops_by_name(before)
    assert sum(_ops_by_name(before).values()) == written.ops
    assert reader.stats.summarized == sum(s["events"] for r in after.rank_ids() for s in after.ranks[r].summaries) > 0
    # (its events and its ops, the unit report's history counts in: helper-204 could not match them)
    assert any(w.startswith(f"retention summarized {reader.stats.summarized:,} older event(s) "
                            f"({sum(summarized.values()):,} op(s): report's history counts these)") for w in warnings)
    # the diagnosis of what is left is the full one's: the culprit, from the carried state on
    fa = diagnose(before, trace_now(before), default_hang_after(before))
    fb = diagnose(after, trace_now(after), default_hang_after(after))
    assert [(f.kind, f.culprits) for f in fb] == [(f.kind, f.culprits) for f in fa] == [
        ("missing_ranks", [shape.culprit_rank])]
    minutes = [m for s in after.ranks[0].summaries for op in s["ops"] for m in op["minutes"]]
    assert minutes and all(m[1] == sum(c for _, c in m[4]) for m in minutes)  # histograms add up


def test_the_writer_starts_the_child_that_closes_its_segments(tmp_path):
    w = DirectoryWriter(tmp_path, "job", 0, {"world_size": 1}, segment_bytes=1024,
                        retain=retention.Retention(max_bytes=1 << 20, max_age_s=None))
    w.write([meta()])
    for k in range(0, 80, 8):
        w.write([beat(0, j) for j in range(k, k + 8)])
    child = w._retainer
    assert child is not None
    child.wait(60)
    w.close()
    job = tmp_path / "job"
    # the child carried what was in flight at the end of every segment closed before it ran
    assert inflight.carried(job, (0, 0), 0) == b""  # (heartbeats only: nothing in flight)


def test_a_segment_closed_while_a_closer_ran_is_carried_once_the_writer_closes(tmp_path):
    """A closer closes the segments it listed; one closed while it ran waits for the next
    segment's closer.  A writer closed before that (its rank ended) starts one: before, that
    segment's carry was never written, and each window read of the job made it again
    (``inflight.made``)."""
    busy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # (a closer still running)
    try:
        w = DirectoryWriter(tmp_path, "job", 0, {"world_size": 1}, segment_bytes=1024)
        w._retainer = busy
        w.write([meta()])
        for k in range(0, 40, 8):
            w.write([beat(0, j) for j in range(k, k + 8)])
        assert len(list_segments(tmp_path / "job")[(0, 0)]) > 2 and w._retainer is busy
    finally:
        busy.kill()
        busy.wait()
    w.close()
    assert w._retainer is not None and w._retainer is not busy
    assert w._retainer.wait(60) == 0
    segs = list_segments(tmp_path / "job")[(0, 0)]
    assert [inflight.carried(tmp_path / "job", (0, 0), s.number) for s in segs[:-1]] == [b""] * (len(segs) - 1)


@pytest.mark.parametrize("fault", ["dead", "missing", "mismatch"])
def test_a_window_finds_what_a_full_read_finds(tmp_path, fault):
    """A week of a job in segments; the fault an hour before the end; --since 30m reads a
    tenth of it and says the same, evidence and all."""
    store = str(tmp_path / "trace")
    shape = JobShape(8, 6000, fault=fault, days=7, tail_s=3600, hang_after=10.0, segment_bytes=128 << 10)
    write_store(store, shape)
    full, fr, _ = load_trace(store)
    part, pr, warnings = load_trace(store, since=Since(ago_s=1800))
    assert pr.stats.bytes < fr.stats.bytes / 10 and pr.stats.skipped_bytes > 0
    assert any("not read" in w for w in warnings)
    fa = [f.to_json() for f in diagnose(full, trace_now(full), default_hang_after(full))]
    fb = [f.to_json() for f in diagnose(part, trace_now(part), default_hang_after(part))]
    assert fb == fa
    assert [(f["kind"], f["culprits"]) for f in fb if f["severity"] == "error"] == [
        ({"dead": "dead_rank", "missing": "missing_ranks", "mismatch": "collective_mismatch"}[fault],
         [shape.culprit_rank])]


def _errors(model) -> list[tuple[str, list[int]]]:
    found = diagnose(model, trace_now(model), default_hang_after(model))
    return [(f.kind, list(f.culprits)) for f in found if f.severity == "error"]


def test_a_window_makes_the_carries_no_closer_wrote(tmp_path):
    """A carry its closer had not written (a window read as soon as the job ended; a rank
    dead before a next segment started a closer) is made from the segments before: the
    window finds what a full read finds, and says nothing is missing (CI: a restarted run's
    first attempt blamed rank 0, whose peer crashed, as crashed itself)."""
    store = str(tmp_path / "trace")
    shape = JobShape(2, 3000, fault="missing", hang_after=2.0, segment_bytes=32 << 10)
    write_store(store, shape)
    job = Path(store) / "synthetic"
    carries = sorted(job.glob("*.open.*.jsonl"))
    assert len(carries) > 4
    written = {p.name: p.read_bytes() for p in carries}
    with_carries, _, _ = load_trace(store, since=Since(ago_s=1))
    for p in carries:
        p.unlink()
    got, reader, warnings = load_trace(store, since=Since(ago_s=1))
    assert not any("not known" in w for w in warnings + reader.stats.warnings)
    assert _errors(got) == _errors(with_carries) == _errors(load_trace(store)[0]) == [
        ("missing_ranks", [shape.culprit_rank])]
    # made as its closer writes it (and nothing is written by a reader)
    assert not list(job.glob("*.open.*.jsonl"))
    segs = list_segments(job)[(0, 0)]
    last = segs[-2].number
    assert inflight.made(job, (0, 0), segs, last) == written[inflight.carry_path(job, (0, 0), last).name]


def test_a_window_whose_carry_cannot_be_made_says_what_it_may_miss(tmp_path):
    """No carry, and the segment before the window's first is gone (deleted by hand: retention
    deletes none before its carry is written): what the rank was in there is not known."""
    store = str(tmp_path / "trace")
    write_store(store, JobShape(2, 3000, fault="missing", hang_after=2.0, segment_bytes=32 << 10))
    job = Path(store) / "synthetic"
    for p in job.glob("*.open.*.jsonl"):
        p.unlink()
    segs = list_segments(job)[(1, 0)]
    segs[-3].path.unlink()
    reader = open_source(store, since=Since(ago_s=1))
    reader.read_all()
    assert [w for w in reader.stats.warnings if "not known" in w] == [
        f"rank 1: what it was in when segment {segs[-2].number} ended is not known (not carried, and a segment "
        "before it is gone): an op begun before may be missing"]


def test_a_carry_deleted_by_hand_where_the_read_begins_is_an_error_not_a_healthy_trace(tmp_path, capsys):
    """A 3 h hang begun in segments retention summarized: the carry of the newest one deleted
    (what the ranks waiting in it were in) removed by hand from ranks 0-2: the hang cannot be
    found, but check exits 1 (trace_incomplete, an error on those ranks: what they were in
    where the read began is not known), not 0.  Before, a warning alone: "no findings",
    exit 0, over a hung job (helper-177)."""
    import json

    from commscope.cli import main as cli

    store = tmp_path / "trace"
    write_store(str(store), JobShape(4, 400, fault="missing", days=7, segment_bytes=16 << 10, tail_s=10800))
    job = store / "synthetic"
    for r in range(4):
        assert retention.close_stream(job, r, 0, retention.parse("1MiB")) > 0
    assert cli(["check", str(job), "--json"]) == 1
    assert [f["kind"] for f in json.loads(capsys.readouterr().out)["findings"]] == ["missing_ranks"]
    newest = json.loads((job / "rank-00000.summary.jsonl").read_bytes().splitlines()[-1])["seg"]
    for r in range(3):
        (job / f"rank-{r:05d}.open.{newest:06d}.jsonl").unlink()
    assert cli(["check", str(job), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    (f,) = out["findings"]
    assert f["kind"] == "trace_incomplete" and f["severity"] == "error", f
    assert {r: d.get("uncarried") for r, d in f["evidence"]["per_rank"].items()} == {
        "0": 1, "1": 1, "2": 1, "3": None}, f["evidence"]
    assert "what rank(s) 0-2 were in where the read of their streams began is not known" in f["message"]


@pytest.mark.parametrize("damage", ["cut", "deleted"])
def test_a_damaged_carry_where_a_window_begins_is_made_again_as_a_missing_one(tmp_path, capsys, damage):
    """The carries where a window begins, of a rank waiting in the last collective and of
    the rank that called another op there, cut to 100 bytes: they were taken as read, their
    ranks "idle (no ops yet)", a missing_ranks named the rank only waiting, and the mismatch
    was lost (helper-187).  A damaged carry is made again from the segments before it, as a
    deleted one is, and says so."""
    import json

    from commscope.cli import main as cli
    from commscope.window import Since

    store = tmp_path / "trace"
    shape = JobShape(8, 3000, fault="mismatch", segment_bytes=64 << 10)
    write_store(str(store), shape)
    job = store / "synthetic"
    assert cli(["check", str(store), "--json"]) == 1
    whole = json.loads(capsys.readouterr().out)
    want = [(f["kind"], f["culprits"]) for f in whole["findings"]]
    assert want == [("collective_mismatch", [shape.culprit_rank])], want
    for r in (1, shape.culprit_rank):
        carry = sorted(job.glob(f"rank-{r:05d}.open.*.jsonl"))[-1]
        if damage == "cut":
            os.truncate(carry, 100)
        else:
            carry.unlink()
    since = Since(at_ns=whole["now_ns"] - 5 * 10**9).describe()[6:-4].replace(" ", "T")
    assert cli(["check", str(store), "--json", "--since", since]) == 1
    out = json.loads(capsys.readouterr().out)
    assert [(f["kind"], f["culprits"]) for f in out["findings"]] == want, out["findings"]
    if damage == "cut":
        assert sum("is damaged (not as its closer wrote it, 101 bytes): made again" in w for w in out["warnings"]) == 2


@pytest.mark.parametrize("keyframes", [None, 1.0])
def test_a_stream_s_newest_segment_gone_is_counted_where_the_store_still_names_it(tmp_path, capsys, keyframes):
    """Rank 1's newest segment deleted by hand: the segments before it read to their end and
    nothing said a segment was gone (its rank read dead, helper-187).  The store still names
    it: the carry of the one before (written once it began) and its keyframes; it is counted
    gone, and said."""
    import json

    from commscope.cli import main as cli

    store = tmp_path / "trace"
    write_store(str(store), JobShape(4, 3000, fault="healthy", segment_bytes=64 << 10, keyframe_s=keyframes))
    job = store / "synthetic"
    segs = list_segments(job)[(1, 0)]
    assert len(segs) > 2 and inflight.carried(job, (1, 0), segs[-2].number) is not None
    segs[-1].path.unlink()
    cli(["check", str(store), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert out["skipped"]["store_missing"] >= 1, out["skipped"]
    said = [w for w in out["warnings"] if w.startswith("rank 1: 1 segment(s) of its stream gone")]
    assert said and f"(segment {segs[-1].number})" in said[0], out["warnings"]
    assert "trace_incomplete" in [f["kind"] for f in out["findings"]]


def test_a_rotation_during_a_read_is_no_segment_gone(tmp_path):
    """A live writer rotates after a reader listed its segments, and its closer writes the
    carry of the one before: the newest-segment count took that carry for a segment gone
    (helper-190).  Only a carry written before the listing says so."""
    from commscope.store import open_reader

    w = DirectoryWriter(tmp_path, "job", 0, {"world_size": 1}, segment_bytes=1024, closer=False)
    w.write([meta(0)])
    k = 0
    while len(list_segments(tmp_path / "job")[(0, 0)]) < 3:
        w.write([beat(0, k)])
        k += 1
    reader = open_reader(tmp_path)
    reader.poll()  # (its listing: segments 0-2)
    n0 = len(list_segments(tmp_path / "job")[(0, 0)])
    while len(list_segments(tmp_path / "job")[(0, 0)]) == n0:
        w.write([beat(0, k)])
        k += 1
    retention.close_stream(tmp_path / "job", 0, 0, retention.NONE)
    reader._count_segments_gone()  # (what read_all does last, the listing not taken again)
    w.close()
    assert not [x for x in reader.stats.warnings if "gone from the store" in x], reader.stats.warnings


def test_age_retention_keeps_the_last_days(tmp_path):
    store = str(tmp_path / "trace")
    shape = JobShape(2, 6000, fault="healthy", days=7, segment_bytes=64 << 10)
    write_store(store, shape)
    job = Path(store) / "synthetic"
    keep = retention.Retention(max_bytes=None, max_age_s=2 * 86400)
    for r in range(2):
        retention.close_stream(job, r, 0, keep)
        segs = list_segments(job)[(r, 0)]
        assert segs[0].number > 0 and segs[-1].start_s - segs[1].start_s <= 2 * 86400
    model, reader, _ = load_trace(store)
    assert reader.stats.summarized > 0 and diagnose(model, trace_now(model), 30.0) == []


@pytest.mark.parametrize("text, seconds", [("1h30m", 5400), ("2d 12h", 216_000), ("1h 5min 3s", 3903), ("1.5h", 5400)])
def test_since_sums_a_duration_of_several_units(text, seconds):
    """``1h30m`` was refused (helper-163); a number with no unit after it still is."""
    assert parse_since(text) == Since(ago_s=seconds)
    with pytest.raises(ValueError, match="cannot read --since"):
        parse_since(text + "30")


@pytest.mark.parametrize("text, ok", [("10m", True), ("90s", True), ("2h", True), ("3d", True), ("all", True),
                                      ("14:00", True), ("2026-11-26T14:00", True), ("soon", False), ("10x", False),
                                      ("9" * 400 + "s", False), ("10000000000000000000000d", False),
                                      ("", False), ("  ", False), ("0", False), ("0s", False), ("0h 0m", False)])
def test_since_reads_durations_times_and_all(text, ok):
    if ok:
        got = parse_since(text)
        assert got is None if text == "all" else isinstance(got, Since)
    else:
        with pytest.raises(ValueError, match="cannot read --since"):
            parse_since(text)


def test_check_since_a_bad_window_is_a_usage_error(tmp_path, capsys):
    store = str(tmp_path / "trace")
    write_store(store, JobShape(2, 20, fault="healthy"))
    assert cli(["check", store, "--since", "yesterday-ish"]) == 2
    assert "cannot read --since" in capsys.readouterr().err
    assert cli(["check", store, "--since", "1h", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["skipped"]["before_window_bytes"] == 0 and out["skipped"]["summarized"] == 0
    # (the files written now, the trace's events dated months before: a window back from the
    # newest write starts after them, and says so)
    (said,) = out["warnings"]
    assert said.startswith("the window (the last 1 h) starts after the trace's newest event"), said
    # one segment a rank, no keyframe: a window inside the trace starts at each stream's start,
    # and says so (a copy's window read everything unsaid: helper-166)
    end = JobShape(2, 20).t0 + 2 * 10**9
    assert cli(["check", store, "--since", Since(at_ns=end).describe()[6:-4].replace(" ", "T"), "--json"]) == 0
    (said,) = json.loads(capsys.readouterr().out)["warnings"]
    assert "skipped nothing: each stream was read from its start" in said, said


@pytest.mark.parametrize("text, want", [("2GiB", (2 << 30, None)), ("500MB", (500_000_000, None)),
                                        ("7d", (None, 7 * 86400)), ("2GiB,12h", (2 << 30, 12 * 3600)),
                                        ("none", (None, None))])
def test_retention_limits_read_as_users_write_them(text, want):
    assert tuple(retention.parse(text)) == want


def test_memory_sizes_take_m_alone_as_mib():
    """(helper-168) ``--max-memory 512M`` and ``512m`` were refused once ``--retain`` refused m."""
    from commscope.commands.options import byte_size

    assert byte_size("512M") == byte_size("512m") == byte_size("512MiB") == 512 << 20


@pytest.mark.parametrize("text, why", [("lots", "cannot read"), ("5 parsecs", "unknown unit"),
                                       ("10KB", "at least 1 MiB"), ("30m", "a size or an age? write 30MiB or 30min"),
                                       ("0s", "an age of 1 s or more"), ("0.00001s", "an age of 1 s or more"),
                                       ("2GiB,1GiB", "two sizes"), ("1d,2h", "two ages"), ("", "cannot read")])
def test_retention_limits_that_make_no_sense_are_refused(text, why):
    """(helper-166) "30m" kept 30 MiB a rank where --since reads 30 minutes; "0s" kept only the
    segment being written; "2GiB,1GiB" kept the last silently.  (helper-173) "0.00001s" was
    taken, written for the child as "1e-05s", which it refused: nothing bounded."""
    with pytest.raises(ValueError, match=why.replace("?", r"\?")):
        retention.parse(text)


@pytest.mark.parametrize("text", ["99999999999999999d", "1.5s", "2GiB,7d", "90min", "1s"])
def test_a_retention_limit_reaches_the_child_as_it_reads_it(text, monkeypatch):
    """The writer's child is given the limit as a spec ``parse`` reads back the same: an age
    was written with an exponent (8.64e+21s) it refused (helper-173)."""
    got = []
    monkeypatch.setattr(retention.children, "start", lambda *args: got.append(args[-1]))
    limit = retention.parse(text)
    retention.spawn(Path("/nowhere"), 0, 0, limit)
    assert retention.parse(got[0]) == limit and "e" not in got[0].lower().replace("b", ""), got


def test_a_segment_name_carries_its_start_so_a_window_opens_none_before_it(tmp_path, monkeypatch):
    store = str(tmp_path / "trace")
    write_store(store, JobShape(2, 4000, fault="healthy", days=2, segment_bytes=32 << 10))
    opened: list[str] = []

    def spy(real):
        def opens(path, *a, **k):
            opened.append(str(path))
            return real(path, *a, **k)
        return opens

    monkeypatch.setattr("builtins.open", spy(open))
    monkeypatch.setattr("os.open", spy(os.open))  # (segments are read with os.pread: store/files.py)
    reader = open_source(store, since=Since(ago_s=600))
    reader.read_all()
    segs = [s for v in list_segments(Path(store) / "synthetic").values() for s in v]
    read = {p for p in opened if ".s0" in p or p.endswith("rank-00000.jsonl") or p.endswith("rank-00001.jsonl")}
    assert len(read) <= 4 < len(segs)  # the newest segment or two of each rank, not the week


@pytest.mark.parametrize("apart", [False, True])
def test_a_live_console_past_its_memory_budget_starts_again_at_the_tail(tmp_path, monkeypatch, apart):
    """However long the job ran, the console's model stays bounded: past its budget it is
    rebuilt from the tail (the store carries what ranks were in), and still says what is wrong;
    ``apart``: the first read and the tail's in worker processes (a large job's)."""
    from commscope.store import bulkread
    from commscope.store.directory import DirectoryReader
    from commscope.tui.feed import LIVE, Feed

    store = str(tmp_path / "trace")
    shape = JobShape(8, 6000, fault="missing", days=2, tail_s=600, hang_after=10.0, segment_bytes=64 << 10)
    written = write_store(store, shape)
    full, _, _ = load_trace(store)
    started: list[int] = []
    if apart:  # (a job this small: read apart all the same)
        monkeypatch.setattr(DirectoryReader, "PARALLEL_MIN_BYTES", 0)
        by_workers(monkeypatch)
        real = bulkread.Workers.__init__
        monkeypatch.setattr(bulkread.Workers, "__init__", lambda self, n: started.append(n) or real(self, n))
    end = full.end_ns
    feed = Feed(open_source(store), mode=LIVE, clock=lambda: end + S, reopen=lambda w: open_source(store, since=w))
    feed.MODEL_BUDGET = full.nbytes() // 4
    feed.BUDGET = 256 << 10
    for _ in range(500):
        _, got = feed.step()
        if not got:
            break
    assert feed.restarts >= 1
    assert len(started) == (1 + feed.restarts if apart else 0)  # (the first read, and each restart's)
    assert feed.model.nbytes() < full.nbytes() / 2
    found = diagnose(feed.model, feed.now(), feed.hang_after())
    assert [(f.kind, f.culprits) for f in found if f.severity == "error"] == [
        (written.kind, [shape.culprit_rank])]


class _PastBudget(NamedTuple):
    store: str
    shape: JobShape
    written: Written
    full: TraceModel  # (the whole read's model)
    feed: Feed  # (the live console's, followed to the job's end)
    spans: list[float]  # (each restart's window, seconds)


def _followed_past_budget(store: str, segment_bytes: int | None, keyframe_s: float | None = None) -> _PastBudget:
    """Two minutes of a job of 8 ranks at 50 ops a second (its last minute holds more than the
    budget, a quarter of the whole), then a missing rank's hang, written in segments of
    ``segment_bytes`` (None: the default: one a stream) with keyframes every ``keyframe_s``
    (None: none), dated to the job's end (a window counts back from the newest write),
    followed by a live console to its end."""
    shape = JobShape(8, 6000, fault="missing", rate=50.0, hang_after=10.0, segment_bytes=segment_bytes,
                     keyframe_s=keyframe_s)
    written = write_store(store, shape)
    full, _, _ = load_trace(store)
    for where, _, names in os.walk(store):
        for name in names:
            os.utime(os.path.join(where, name), ns=(full.end_ns, full.end_ns))
    end = full.end_ns
    spans: list[float] = []
    feed = Feed(open_source(store), mode=LIVE, clock=lambda: end + S,
                reopen=lambda w: spans.append(w.ago_s) or open_source(store, since=w))
    feed.MODEL_BUDGET = full.nbytes() // 4
    feed.BUDGET = 64 << 10
    for _ in range(500):
        _, got = feed.step()
        if not got:
            break
    return _PastBudget(store, shape, written, full, feed, spans)


@pytest.mark.parametrize("workers", [False, True])
def test_a_restart_at_the_tail_reads_no_more_than_half_the_budget_holds(tmp_path, monkeypatch, workers):
    """A job whose minute holds more than the console's budget (16k ranks at the full rate
    fill 1 GiB in 5-20 s) restarts at the tail with what half the budget holds, not a minute:
    its memory stays bounded.  ``workers``: the first read in workers, a part of the ranks
    each (the job's rate is told from the ranks read, for all of them), restarted in the
    middle.  A model read from a window tells the rate from its ops there: its carried ops
    and its events' first times are the job's start, not the window's."""
    from commscope.store.directory import DirectoryReader
    from commscope.tui.feed import TAIL_FLOOR_S, tail_span_s

    if workers:
        monkeypatch.setattr(DirectoryReader, "PARALLEL_MIN_BYTES", 0)
        by_workers(monkeypatch)
    past = _followed_past_budget(str(tmp_path / "trace"), 64 << 10)
    store, shape, written, full, feed, spans = past
    budget = feed.MODEL_BUDGET
    assert feed.restarts >= 1 and spans
    assert all(TAIL_FLOOR_S < s < feed.TAIL_MIN_S / 2 for s in spans)  # (what half the budget holds: ~17 s)
    assert feed.model.nbytes() <= budget  # (a minute read: ~2.5 budgets)
    assert TAIL_FLOOR_S < tail_span_s(full, budget, feed.TAIL_MIN_S) < feed.TAIL_MIN_S / 2
    # the job's rate, each rank's own (8 ranks x 50 ops a second, over their ops' span), is
    # not one rank's: its ops' span made a thousandth of what it is leaves it
    rate = full.op_rate()
    assert rate == pytest.approx(400, rel=0.02)
    rt = full.ranks[0]
    rt.begin[: rt.n] = rt.begin[0] + np.arange(rt.n)  # (its ops a nanosecond apart)
    assert full.op_rate() == pytest.approx(rate, rel=0.1)
    # a model read from the job's last minute: 45 s of ops at 400 a second, then the hang
    reader = open_source(store, since=Since(ago_s=60))
    window = TraceModel()
    window.ingest(reader.read_all())
    since = reader.window_start_ns()
    assert since is not None and window.start_ns < since  # (the ranks' metas, its carried ops)
    assert window.op_rate(since) == pytest.approx(400, rel=0.1)
    assert TAIL_FLOOR_S < tail_span_s(window, budget, feed.TAIL_MIN_S, since) < feed.TAIL_MIN_S / 2
    found = diagnose(feed.model, feed.now(), feed.hang_after())
    assert [(f.kind, f.culprits) for f in found if f.severity == "error"] == [
        (written.kind, [shape.culprit_rank])]


def test_a_model_a_restart_at_the_tail_swaps_out_is_freed_with_the_restart(tmp_path, monkeypatch):
    """The model a restart swaps out is garbage in cycles (its ranks and their table refer to
    each other; it and its judgements' cache too).  It is freed as the restart ends, not
    whenever the cyclic collector next runs: that runs rarely in a console (it builds under
    ``gc_paused``), and at 1k ranks 2-4 models were alive at once (~300 MiB).  The collector
    is off here but for what the restart collects itself."""
    import gc
    import weakref

    swapped: list[weakref.ref] = []
    alive_after: list[bool] = []
    swap_in = Feed._swap_in

    def swap(feed: Feed, reader, bound: bool = True) -> None:
        swapped.append(weakref.ref(feed.model))
        swap_in(feed, reader, bound)
        alive_after.append(swapped[-1]() is not None)

    monkeypatch.setattr(Feed, "_swap_in", swap)
    was = gc.isenabled()
    gc.disable()
    try:
        past = _followed_past_budget(str(tmp_path / "trace"), 64 << 10)
    finally:
        if was:
            gc.enable()
    assert past.feed.restarts >= 1 and len(swapped) == past.feed.restarts
    assert alive_after == [False] * len(swapped)


def _dated_job(store: str) -> tuple[JobShape, TraceModel]:
    """Two minutes of 8 ranks at 50 ops a second, native, keyframes every 5 s, dated to its end."""
    shape = JobShape(8, 6000, fault="missing", rate=50.0, hang_after=10.0, keyframe_s=5.0)
    write_store(store, shape)
    full, _, _ = load_trace(store)
    for where, _, names in os.walk(store):
        for name in names:
            os.utime(os.path.join(where, name), ns=(full.end_ns, full.end_ns))
    return shape, full


def test_a_first_window_whose_model_would_not_fit_the_budget_is_made_shorter(tmp_path):
    """``feed.first_window``: ten minutes asked of a job whose two minutes hold ~4x the budget:
    a shorter window, in proportion, whose model fits the budget's first share and names
    the culprit a whole read names, and says why; within the budget, at a time, or all of it,
    as asked."""
    from commscope.tui.feed import FIRST_SHARE, TAIL_FLOOR_S, first_window

    store = str(tmp_path / "trace")
    shape, full = _dated_job(store)
    budget = full.nbytes() // 4
    asked = Since(ago_s=600)
    reader, shorter, why = first_window(lambda w: open_source(store, since=w), asked, budget)
    assert shorter is not None and TAIL_FLOOR_S <= shorter.ago_s < 120 / 4
    assert reader.window_start_ns() == full.end_ns - int(shorter.ago_s * S)
    assert why == f"{shorter.describe()} of 10 min"
    model, _, _ = load_trace(store, since=shorter)
    assert 0 < model.nbytes() <= budget * FIRST_SHARE
    found = diagnose(model, trace_now(model), default_hang_after(model))
    assert [(f.kind, f.culprits) for f in found if f.severity == "error"] == [
        (f.kind, f.culprits) for f in diagnose(full, trace_now(full), default_hang_after(full)) if f.severity == "error"]
    for since in (asked, Since(at_ns=full.start_ns), None):
        budget_for = 100 * full.nbytes() if since is asked else budget
        _, got, why = first_window(lambda w: open_source(store, since=w), since, budget_for)
        assert (got, why) == (since, "")
    # without keyframes a shorter window reads what the asked one does (each stream from its
    # segment's start): as asked, not "the last 2 s" that would read it all the same; three
    # looks (the window asked, one in proportion, its last second: a job younger than the
    # window reads no less in a shorter one either, and is made shorter still)
    opened: list = []

    def open_at(w):
        opened.append(w)
        return open_source(store, since=w)

    for keys in Path(store).glob("*/*.keys.*.bin"):
        keys.unlink()
    _, got, why = first_window(open_at, asked, budget)
    assert (got, why) == (asked, "") and [w.ago_s for w in opened][::2] == [600, 1.0]


def test_a_first_window_none_fits_is_the_shortest_where_that_reads_less(tmp_path):
    """No window fits the budget's share (segments of 32 KiB, no keyframes: each stream starts
    at its segment), but a window of its last ``TAIL_FLOOR_S`` reads less than ten minutes:
    that one, as before ``fitting_window`` (helper-158: read as asked, its model 18x more)."""
    import time

    from commscope.analysis.source import MODEL_PER_STORED
    from commscope.tui.feed import FIRST_SHARE, TAIL_FLOOR_S, first_window

    store = str(tmp_path / "trace")
    write_store(store, JobShape(8, 1000, fault="missing", hang_after=2.0, segment_bytes=32 << 10,
                                t0=time.time_ns() - 50 * S))
    asked = Since(ago_s=600)
    whole = open_source(store, since=asked).backlog_bytes() * MODEL_PER_STORED
    last = open_source(store, since=Since(ago_s=TAIL_FLOOR_S)).backlog_bytes() * MODEL_PER_STORED
    assert last < 0.9 * whole
    budget = int(last / 2 / FIRST_SHARE)  # (not even the shortest fits)
    reader, got, why = first_window(lambda w: open_source(store, since=w), asked, budget)
    reader.close()
    assert (got, why) == (Since(ago_s=TAIL_FLOOR_S), "the last 2 s of 10 min")
    reader, got, why = first_window(lambda w: open_source(store, since=w), Since(ago_s=1.5), budget)
    reader.close()
    assert (got, why) == (Since(ago_s=1.5), "")  # (never longer than asked)


def test_attach_reads_a_first_window_that_fits_its_budget_and_says_so(tmp_path, monkeypatch):
    """``commscope attach`` (its default: the last ten minutes) on that job with the budget a
    quarter of it: the console reads the shorter window, and its header says so."""
    import asyncio

    from commscope.tui import app
    from commscope.tui.feed import Feed

    store = str(tmp_path / "trace")
    _, full = _dated_job(store)
    monkeypatch.setattr(Feed, "MODEL_BUDGET", full.nbytes() // 4)
    ran: list[Feed] = []
    monkeypatch.setattr(app.CommscopeApp, "run", lambda self: ran.append(self.feed))
    assert cli(["attach", "--read-processes", "0", "--no-bell", store]) == 0
    (feed,) = ran
    start = feed.reader.window_start_ns()
    assert start is not None and full.end_ns - 120 * S / 4 < start < full.end_ns
    assert feed.window.startswith("the last ") and feed.window.endswith(" s of 10 min (memory)"), feed.window

    async def shown() -> str:
        async with app.CommscopeApp(feed, bell=False).run_test(size=(160, 30)) as pilot:
            for _ in range(200):  # (until the header has a first frame of the job)
                await pilot.pause(0.05)
                if pilot.app.info.events:
                    break
            return str(pilot.app.header_bar.render())

    assert f"· {feed.window} " in asyncio.run(shown())


def test_a_restart_that_would_read_back_what_the_model_holds_is_not_made(tmp_path):
    """The same job in one segment a stream (a segment holds ~1.5 h of a rank at 25
    collectives a second): a restart at the tail would start every stream where the model
    did, read back what it holds and stall the feed meanwhile.  It is not made: no reader of
    a window is opened,
    and the console names the same culprit as a whole read.  Before, it read the job again
    at each doubling of the floor; now it is looked at again once the model grew by half
    the budget."""
    store, shape, written, full, feed, spans = _followed_past_budget(str(tmp_path / "trace"), None)
    budget = feed.MODEL_BUDGET
    assert feed.restarts == 0 and not spans and feed.restarts_skipped >= 1
    assert feed.model.events == full.events and feed.model.nbytes() > budget  # (the whole job, as read)
    assert budget < feed._restart_floor <= 2 * feed.model.nbytes()
    assert feed.reader.read_again(Since(ago_s=10)) == 1.0  # (every stream in its one segment)
    assert budget < feed._restart_floor <= feed.model.nbytes() + budget // 2  # (looked at again, not doubled)
    found = diagnose(feed.model, feed.now(), feed.hang_after())
    assert [(f.kind, f.culprits) for f in found if f.severity == "error"] == [
        (written.kind, [shape.culprit_rank])]


def test_a_restart_within_one_segment_a_stream_starts_at_its_keyframes(tmp_path):
    """The same job in one segment a stream, with the keyframes its keeper writes every 5 s:
    the restart at the tail is made, reads from each stream's keyframe before its window
    (not the segment's start), and the model ends within the budget; the culprit as a whole
    read's.  Without keyframes it was not made, and the model held the whole job."""
    store, shape, written, full, feed, spans = _followed_past_budget(str(tmp_path / "trace"), None, 5.0)
    budget = feed.MODEL_BUDGET
    assert feed.restarts >= 1 and spans and feed.restarts_skipped == 0
    assert feed.model.nbytes() <= budget
    assert [s for s, _ in feed.restart_reads] == spans and all(n <= budget for _, n in feed.restart_reads)
    assert feed.reader.stats.skipped_bytes > 0
    found = diagnose(feed.model, feed.now(), feed.hang_after())
    assert [(f.kind, f.culprits) for f in found if f.severity == "error"] == [
        (written.kind, [shape.culprit_rank])]


def test_what_a_window_reads_again_weighs_each_stream_by_its_bytes(tmp_path):
    """``DirectoryReader.read_again``: 8 ranks, each started twice before (incarnations 0 and
    1, one short segment each, ended), the live incarnation 2 in 4 segments of ~10 KB.  A
    reader of the window from segment 1 reads ~3 of them a rank; a window from the last
    reads ~1 again (a restart worth making), one from inside segment 1 all of them (not),
    one before everything all.  The ended incarnations weigh their few bytes: counted as
    streams, 2 of 3 could never start later, and no restart was ever made."""
    from commscope.store.directory import DirectoryReader
    from commscope.store.segments import segment_name

    t0 = T0 // S
    line = b'{"type":"meta","rank":%d,"ts":%d,"v":3,"pad":"' + b"x" * 200 + b'"}\n'
    for r in range(8):
        for inc in (0, 1):
            (tmp_path / segment_name(r, inc, 0, 0)).write_bytes(line % (r, T0))
        for n, start in ((0, 0), (1, t0 + 1000), (2, t0 + 2000), (3, t0 + 3000)):
            (tmp_path / segment_name(r, 2, n, start)).write_bytes(line % (r, (start or t0) * S) * 50)
    reader = DirectoryReader(tmp_path, since_ns=(t0 + 1100) * S)
    assert len(reader.streams()) == 24
    last = reader.read_again(Since(at_ns=(t0 + 3100) * S))
    assert last == pytest.approx((8 * 50 + 16) / (8 * 150 + 16), rel=1e-6)  # (~1/3)
    assert reader.read_again(Since(at_ns=(t0 + 1500) * S)) == 1.0
    assert reader.read_again(Since(at_ns=T0)) == 1.0
    whole = DirectoryReader(tmp_path)  # (a reader of the whole job: from each stream's first segment)
    assert whole.read_again(Since(at_ns=(t0 + 3100) * S)) == pytest.approx((8 * 50 + 16) / (8 * 200 + 16))


def test_a_window_of_a_long_job_maps_its_ranks_ids_without_a_dict(tmp_path):
    """A day-long job read from its last 30 minutes: each rank's ops there have ids far past
    the job's first, and its id map starts at them (``RankTrace.id_base``): no rank holds a
    dict of its ids (each rank of a window did, ~100 bytes an op the budget did not count),
    and every op is found by its id."""
    from commscope.analysis.model import TraceModel

    store = str(tmp_path / "trace")
    write_store(store, JobShape(4, 12000, fault="dead", days=1, tail_s=600, segment_bytes=128 << 10))
    m = TraceModel()
    m.ingest(open_source(store, since=Since(ago_s=1800)).read_all())
    assert m.total_ops() and len(m.ranks) == 4
    for rt in m.ranks.values():
        assert rt.id_dict is None and rt.id_base > 10_000
        ids = rt.id[: rt.n].tolist()
        assert [rt.index_of(i) for i in ids] == list(range(rt.n))


# ------------------------------------------------------------------ retention under a reader
def _force(job: Path, keep_bytes: int) -> int:
    """Summarize and delete all but about ``keep_bytes`` of rank 0's stream (a limit below
    what ``--retain`` accepts: the segments here are small)."""
    return retention.close_stream(job, 0, 0, retention.Retention(max_bytes=keep_bytes, max_age_s=None))


def test_a_reader_that_read_everything_counts_no_summary_for_it(tmp_path):
    job = _segmented(tmp_path)
    reader = open_reader(tmp_path)
    first = written_beats(reader.read_all())
    assert first == list(range(3000))
    assert _force(job, 32 << 10) > 0
    again = reader.poll()
    assert written_beats(again) == [] and reader.stats.summarized == 0
    assert not [e for e in again if e["type"] == "summary"]


def test_a_segment_retention_deletes_as_a_reader_enters_it_is_jumped_over_not_uncarried(tmp_path, monkeypatch):
    """A reader lists the stream, its oldest segment N, and enters it; retention then deletes
    N and the carry of N-1 (keeping N's, the newest deleted), before the reader looks for
    that carry.  It found none and said what the rank was in not known: a check of a
    healthy live job exited 1 on a trace_incomplete error, 2 of 20 checks (helper-204).
    The segment entered is gone: the reader jumps over it with the carry retention kept,
    and every event is read or summarized, once."""
    from commscope.store import inflight

    job = _segmented(tmp_path)
    assert _force(job, 128 << 10) > 0  # (the oldest left is a segment N > 0, its carry N-1 beside it)
    carried, raced = inflight.carried, []

    def retention_between(directory, stream, number):
        if not raced:
            raced.append(number)
            monkeypatch.setattr(inflight, "carried", carried)  # (retention's own look at the carries)
            raced.append(_force(job, 64 << 10))  # (N deleted, and N-1's carry)
        return carried(directory, stream, number)

    monkeypatch.setattr(inflight, "carried", retention_between)
    reader = open_reader(tmp_path)
    got = reader.read_all()
    assert raced[0] > 0 and raced[1] > 0
    assert not reader.stats.uncarried_by_rank and not [w for w in reader.stats.warnings if "not known" in w]
    beats = written_beats(got)
    assert beats == sorted(set(beats))  # nothing twice
    summarized = sum(e["events"] - 1 for e in got if e["type"] == "summary")  # (each held its meta line too)
    assert len(beats) + summarized == 3000 and not reader.stats.missing_by_rank


@pytest.mark.parametrize("races", [2, 12])
def test_a_whole_read_reads_on_while_retention_deletes_segment_after_segment_under_it(tmp_path, monkeypatch, races):
    """Retention deletes the oldest segment each time the reader enters one: 12 times, the
    reader's eight listings again ran out and it read nothing more of the stream, every
    count silent (helper-207: 4,400 of 6,000 events said).  It lists again while the stream
    moves on: every event read or summarized, once."""
    from commscope.store import inflight

    job = _segmented(tmp_path, beats=6000)
    assert _force(job, 256 << 10) > 0
    carried, raced, keep = inflight.carried, [], [240 << 10]

    def retention_between(directory, stream, number):
        if len(raced) < races:
            monkeypatch.setattr(inflight, "carried", carried)  # (retention's own look at the carries)
            raced.append(_force(job, keep[0]))
            keep[0] -= 16 << 10
            monkeypatch.setattr(inflight, "carried", retention_between)
        return carried(directory, stream, number)

    monkeypatch.setattr(inflight, "carried", retention_between)
    reader = open_reader(tmp_path)
    got = reader.read_all()
    beats = written_beats(got)
    assert beats == sorted(set(beats))
    summarized = sum(e["events"] - 1 for e in got if e["type"] == "summary")
    assert len(beats) + summarized == 6000, (len(beats), summarized, reader.stats.warnings)
    assert not reader.stats.uncarried_by_rank and not reader.stats.missing_by_rank


def test_a_stream_a_whole_read_could_not_read_to_its_end_is_said_so(tmp_path, monkeypatch):
    """Retention outrunning a whole read's listings: the rest of the stream not read is
    said, as its end not known (it read "what rank 0 was in where the read of its stream
    began is not known": its start, helper-209), an error."""
    from commscope.analysis import TraceModel
    from commscope.analysis.completeness import find_incomplete
    from commscope.store import inflight
    from commscope.store.directory import DirectoryReader

    job = _segmented(tmp_path, beats=6000)
    assert _force(job, 256 << 10) > 0
    carried, keep = inflight.carried, [240 << 10]

    def retention_between(directory, stream, number):
        monkeypatch.setattr(inflight, "carried", carried)
        _force(job, max(keep[0], 32 << 10))
        keep[0] -= 16 << 10
        monkeypatch.setattr(inflight, "carried", retention_between)
        return carried(directory, stream, number)

    monkeypatch.setattr(inflight, "carried", retention_between)
    monkeypatch.setattr(DirectoryReader, "RELISTS", 2)
    reader = open_reader(tmp_path)
    got = reader.read_all()
    assert reader.stats.unread_by_rank == {0: 1} and not reader.stats.uncarried_by_rank
    model = TraceModel()
    model.ingest(got)
    model.note_read_stats(reader.stats)
    (f,) = find_incomplete(model, model.end_ns)
    assert f.severity == "error" and f.evidence["per_rank"]["0"].get("unread") == 1
    assert "the rest of the stream of rank(s) 0 was not read" in f.message, f.message


@pytest.mark.parametrize(("segment", "held"), [(16 << 10, True), (256 << 10, True), (256 << 10, False)])
def test_a_reader_behind_counts_what_retention_deleted_under_it(tmp_path, monkeypatch, segment, held):
    """Whole segments deleted before the reader reached them are counted from their
    summaries; one deleted part of the way through (256 KiB segments, 64 KiB read) is read
    to its end through the file the reader holds, or where it holds none (no descriptor to
    spare), counted as lost in proportion."""
    job = _segmented(tmp_path, beats=24000, segment=segment)
    segs = list_segments(job)[(0, 0)]
    if not held:
        monkeypatch.setattr(files, "room_for", lambda n: 0)
    reader = open_reader(tmp_path)
    got = reader.poll(max_bytes=1)  # 64 KiB: part of the stream, the rest deleted under it
    assert 0 < len(written_beats(got)) < 24000
    gone = _force(job, 2 * segment)
    assert gone >= 3
    got += reader.read_all()
    beats = written_beats(got)
    assert beats == sorted(set(beats))  # nothing twice
    summaries = [e for e in got if e["type"] == "summary"]
    assert all(reader._read_of.get(((0, 0), e["seg"]), 0) == 0 for e in summaries)  # only segments never read
    s = reader.stats
    # what it read, what the summaries stand for and what it lost under it: every event said
    # (each deleted segment also held its meta line; a part lost is counted in proportion)
    unread = 24000 - len(beats)
    counted = sum(e["events"] - 1 for e in summaries) + s.missing_by_rank.get(0, 0)
    if not held:
        assert s.missing_by_rank[0] > 0
        assert any("while this reader was reading it" in w for w in s.warnings)
        # (the part lost is estimated from the bytes not read: within 1% of a segment's ~2,800 events)
        assert abs(counted - unread) <= 30, (counted, unread)
    else:
        assert counted == unread and not s.missing_by_rank
    assert len(segs) > gone


def test_a_summary_waits_for_its_segment_to_go_and_counts_once(tmp_path):
    job = _segmented(tmp_path)
    segs = list_segments(job)[(0, 0)]
    line = orjson.dumps(retention.summarize(segs[0].path, 0, 0)) + b"\n"
    (job / "rank-00000.summary.jsonl").write_bytes(line * 2)  # twice: a child stopped between its steps
    reader = open_source(str(tmp_path), since=Since(at_ns=(segs[3].start_s + 1) * S))
    reader.read_all()
    assert reader.stats.summarized == 0  # segment 0 is still there
    segs[0].path.unlink()
    got = reader.poll()
    assert [e["seg"] for e in got if e["type"] == "summary"] == [0]
    assert reader.stats.summarized == orjson.loads(line)["events"]


def test_a_fifo_in_a_carry_s_place_does_not_stop_a_reader(tmp_path):
    job = _segmented(tmp_path)
    segs = list_segments(job)[(0, 0)]
    fifo = inflight.carry_path(job, (0, 0), segs[-2].number)
    os.mkfifo(fifo)
    reader = open_source(str(tmp_path), since=Since(ago_s=1))
    assert written_beats(reader.read_all())
    assert not any("not known" in w for w in reader.stats.warnings)  # (made from the segments: ``inflight.made``)


def test_garbage_in_a_carry_never_stops_retention(tmp_path):
    job = _segmented(tmp_path)
    for n in range(3):
        inflight.carry_path(job, (0, 0), n).write_bytes(b"not json\n{\"type\": \"op\", \"id\": \"x\"}\n\x00\xff\n")
    assert _force(job, 32 << 10) >= 3
    model, reader, _ = load_trace(str(tmp_path))
    assert reader.stats.summarized > 0


def test_a_retention_limit_that_cannot_be_read_keeps_everything(monkeypatch):
    monkeypatch.setenv(retention.ENV_RETAIN, "unlimted")
    with pytest.warns(RuntimeWarning, match="keeping all history"):
        assert retention.from_env() == retention.NONE
    monkeypatch.setenv(retention.ENV_RETAIN, "500m")  # (a size or an age: never guessed, nothing deleted)
    with pytest.warns(RuntimeWarning, match="write 500MiB or 500min"):
        assert retention.from_env() == retention.NONE
    monkeypatch.setenv(retention.ENV_RETAIN, "500M")  # (M alone is MiB, as G is GiB: helper-168)
    assert retention.from_env() == retention.Retention(500 << 20, None)


def test_a_size_limit_caps_the_segments_so_it_holds(tmp_path, monkeypatch):
    """The segment being written is never deleted: under ``--retain 1MiB`` a rank kept its
    64 MiB segment, 62 MB on disk (helper-187).  A writer's segments are at most a quarter
    of a size limit (1 MiB at least); an age alone, or a size four times theirs, leaves them."""
    monkeypatch.delenv("COMMSCOPE_SEGMENT_MB", raising=False)
    for limit, want in (("1MiB", 1 << 20), ("40MiB", 10 << 20), ("1GiB", 64 << 20), ("7d", 64 << 20),
                        ("none", 64 << 20)):
        w = DirectoryWriter(tmp_path, f"job{want}-{limit}", 0, {"world_size": 1}, retain=retention.parse(limit),
                            closer=False)
        assert w.segment_bytes == want, (limit, w.segment_bytes)
        w.close()
    assert retention.age_text(15) == "15 s" and retention.age_text(90) == "90 s" and retention.age_text(7 * 86400) == "7 d"
    assert retention.age_text(36 * 3600) == "36 h" and retention.age_text(1800) == "30 min"


def test_a_forwarder_never_bounds_a_history(tmp_path):
    w = DirectoryWriter(tmp_path, "job", 0, {"world_size": 1}, segment_bytes=1024, closer=False)
    w.write([meta()])
    w.close()
    assert DirectoryWriter(tmp_path, "job", 0, resume=True).closer is False


def test_a_segment_read_to_its_torn_end_counts_no_loss_when_it_goes(tmp_path):
    """A closed segment's incomplete last line is read with it: once retention deletes the
    segment, a reader that read all of it counts nothing of it lost."""
    job = _segmented(tmp_path)
    first = list_segments(job)[(0, 0)][0].path
    with open(first, "ab") as f:
        f.write(b'{"type":"heartbeat","pad":"' + b"x" * 300)  # a write torn there (the writer went on)
    reader = open_reader(tmp_path)
    assert written_beats(reader.read_all()) == list(range(3000))
    assert any("is truncated" in w for w in reader.stats.warnings)
    assert _force(job, 32 << 10) > 0
    reader.poll()
    assert not reader.stats.missing_by_rank
    assert not any("while this reader was reading it" in w for w in reader.stats.warnings)


def test_what_a_deleted_segment_lost_is_counted_as_a_read_of_it_counts_it(tmp_path, capsys):
    """Rank 0's early segments held a damaged line, two invalid events and a writer's marker
    that the store lost 7 lines; retention then deleted them.  A reader of what is left
    counts those losses, with their reasons, as a full read before retention did (each
    summary keeps what its segment lost); a summary of a clean segment says nothing of it."""
    from commscope.store.base import store_lost

    w = DirectoryWriter(tmp_path, "job", 0, {"world_size": 1}, segment_bytes=16 << 10, closer=False)
    w.write([meta(), b'{"type":"heartbeat","ts":', store_lost(0, 7, "the job directory was deleted")])
    w.write([orjson.dumps({"type": "op", "ts": T0, "v": 3, "rank": 0, "phase": "begin", "id": -1}),
             orjson.dumps({"type": "sample", "ts": T0, "v": 3, "rank": 0, "rss": "big"})])
    for k in range(0, 3000, 50):
        w.write([beat(0, j) for j in range(k, k + 50)])
    w.close()

    def losses(stats) -> tuple:
        lost = [x for x in stats.warnings if "line(s) of its stream were lost" in x]
        return (stats.corrupt_by_rank, stats.invalid_by_rank, stats.invalid_by_reason, stats.missing_by_rank,
                [x.split(" (in segment")[0] for x in lost])

    full = open_reader(tmp_path)
    assert written_beats(full.read_all()) == list(range(3000))
    want = ({0: 1}, {0: 2}, {"op begin: bad id": 1, "sample: bad rss": 1}, {0: 7},
            ["rank 0: 7 line(s) of its stream were lost: the job directory was deleted"])
    assert losses(full.stats) == want
    assert _force(tmp_path / "job", 32 << 10) >= 3
    summaries = [orjson.loads(x) for x in (tmp_path / "job" / "rank-00000.summary.jsonl").read_bytes().splitlines()]
    assert {k: summaries[0][k] for k in ("damaged", "invalid", "entries", "reason")} == {
        "damaged": 1, "invalid": {"op begin: bad id": 1, "sample: bad rss": 1}, "entries": 7,
        "reason": "the job directory was deleted"}
    assert not {"damaged", "invalid", "entries", "reason"} & {k for s in summaries[1:] for k in s}
    after = open_reader(tmp_path)
    got = after.read_all()
    assert 0 < len(written_beats(got)) < 3000
    assert losses(after.stats) == want
    assert any("(in segment 0, which retention deleted since)" in x for x in after.stats.warnings)
    # every event said once: read, summarized (the valid ones) or lost
    assert len(written_beats(got)) + sum(s["events"] - 1 for s in summaries) - 1 == 3000  # (metas; the marker)
    assert cli(["check", str(tmp_path), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert {k: out["skipped"][k] for k in ("damaged", "invalid", "store_missing")} == {
        "damaged": 1, "invalid": 2, "store_missing": 7}
    assert [(f["kind"], f["culprits"], f["evidence"]["per_rank"]) for f in out["findings"]] == [
        ("trace_incomplete", [0], {"0": {"damaged": 1, "invalid": 2, "missing": 7, "no_exit": True,
                                          "last_event_ns": T0 + 2999 * S}})]


def test_a_summary_that_says_a_reason_no_reader_writes_is_not_taken():
    """A summary file is read as untrusted as any line: an invalid event's reason in it that
    no reader would write (escape codes, any text) makes the summary invalid, and retention
    never writes one (what it cannot state is "other")."""
    from commscope.events import decode_lines

    line = {"type": "summary", "v": 3, "rank": 0, "ts": T0, "seg": 0, "events": 3, "ops": [],
            "invalid": {"op begin: bad id": 2}}
    assert decode_lines(orjson.dumps(line) + b"\n", 0).events == [line]
    hostile = decode_lines(orjson.dumps(line | {"invalid": {"\x1b[2Jgone": 2}}) + b"\n", 0)
    assert hostile.events == [] and sum(hostile.invalid.values()) == 1
    kept = retention._lost(inflight.Losses(0, {"\x1b[2Jgone": 2, "op begin: bad id": 1}, 0, ""))
    assert kept == {"invalid": {"other": 2, "op begin: bad id": 1}}


def op_event(k: int, phase: str, op_id: int) -> bytes:
    more = {"op": "all_reduce", "group": "0", "seq": op_id, "tid": 1} if phase == "begin" else {}
    return orjson.dumps({"type": "op", "ts": T0 + k * S, "v": 3, "rank": 0, "phase": phase, "id": op_id, **more})


def test_a_reader_of_events_jumping_over_deleted_segments_reads_no_begin_twice(tmp_path):
    """An op begun in a segment this reader read, still in flight when retention deleted the
    segments after it, is carried on: the reader that jumps to the oldest left reads its begin once."""
    w = DirectoryWriter(tmp_path, "job", 0, {"world_size": 1}, segment_bytes=16 << 10, closer=False)
    w.write([meta(), op_event(0, "begin", 1)])
    for k in range(0, 3000, 50):
        w.write([beat(0, j) for j in range(k, k + 50)])
    w.write([op_event(3000, "end", 1)])
    w.close()
    reader = open_reader(tmp_path)
    got = reader.poll(max_bytes=1)  # the first segment: the begin
    assert _force(tmp_path / "job", 32 << 10) >= 3
    got += reader.read_all()
    assert [e["phase"] for e in got if e["type"] == "op"] == ["begin", "end"]


def _twenty_groups(root: Path, ops: int = 400, swapped: bool = False) -> dict[tuple[str, str], list[int]]:
    """One rank's ``ops`` all_reduces over 20 groups in turn (each carry keeps the last one
    done of every group), 1-3 raising, in 4 KiB segments; per (op, group), the ops written:
    count, in_bytes, failed, latency sum, latency max.  ``swapped``: ids in pairs the other
    way round (2, 1, 4, 3, ...: two threads' begins reach the stream in the other order than
    they took their ids)."""
    w = DirectoryWriter(root, "job", 0, {"world_size": 1}, segment_bytes=4 << 10, closer=False)
    w.write([meta()] + [orjson.dumps({"type": "group", "v": 3, "rank": 0, "ts": T0, "group": f"g{g}",
                                      "granks": [0]}) for g in range(20)])
    written: dict[tuple[str, str], list[int]] = {}
    for i in range(1, ops + 1):
        group, lat = f"g{i % 20}", 1000 * (1 + i % 7)
        op_id = i + (1 if i % 2 else -1) if swapped else i
        begin = {"type": "op", "ts": T0 + i * S, "v": 3, "rank": 0, "phase": "begin", "id": op_id,
                 "op": "all_reduce", "group": group, "seq": i // 20, "tid": 1 + swapped * (i % 2), "in_bytes": 64 * i}
        end = {"type": "op", "ts": T0 + i * S + lat, "v": 3, "rank": 0, "phase": "end", "id": op_id}
        if i % 97 == 0:
            end["exc"] = "RuntimeError: NCCL error"
        w.write([orjson.dumps(begin), orjson.dumps(end)])
        row = written.setdefault(("all_reduce", group), [0, 0, 0, 0, 0])
        for k, v in enumerate((1, 64 * i, i % 97 == 0, lat)):
            row[k] += v
        row[4] = max(row[4], lat)
    w.close()
    return written


def _said(events: list[dict]) -> dict[tuple[str, str], list[int]]:
    """Per (op, group), what ``events`` say of the ops (each begin read, and each op a
    summary stands for): count, in_bytes, failed, latency sum, latency max; no begin read
    twice."""
    begins = {e["id"]: e for e in events if e["type"] == "op" and e["phase"] == "begin"}
    assert len(begins) == sum(e["type"] == "op" and e["phase"] == "begin" for e in events)
    ends = {e["id"]: e for e in events if e["type"] == "op" and e["phase"] == "end"}
    out: dict[tuple[str, str], list[int]] = {}

    def add(key: tuple[str, str], count: int, in_bytes: int, failed: int, total: int, most: int) -> None:
        row = out.setdefault(key, [0, 0, 0, 0, 0])
        row[:4] = [a + b for a, b in zip(row[:4], (count, in_bytes, failed, total), strict=True)]
        row[4] = max(row[4], most)

    for i, b in begins.items():
        lat = ends[i]["ts"] - b["ts"]
        add((b["op"], b["group"]), 1, b["in_bytes"], "exc" in ends[i], lat, lat)
    for e in events:
        if e["type"] == "summary":
            for op in e["ops"]:
                add((op["op"], op["group"]), op["count"], op["in_bytes"], op["failed"],
                    sum(m[2] for m in op["minutes"]), max((m[3] for m in op["minutes"]), default=0))
                assert op["count"] - op["unfinished"] == sum(m[1] for m in op["minutes"]) == sum(
                    c for m in op["minutes"] for _, c in m[4])
    return out


def _retained_before(reader, job: Path, read) -> None:
    """``reader``'s next read of a segment (``read``: a ``_read_segment``) finds it gone:
    retention deleted all but the last 8 KiB of rank 0's stream just before (a segment
    deleted between the reader's listing and its read)."""
    def first_gone(stream, path, *a, **kw):
        if stream == (0, 0) and not first_gone.done and path.name != "rank-00000.jsonl":
            first_gone.done = True
            assert _force(job, 8 << 10) >= 10
        return read(stream, path, *a, **kw)

    first_gone.done = False
    reader._read_segment = first_gone


@pytest.mark.parametrize("behind", ["jumped", "jumped, ids out of order", "listed_before_the_deletion", "never_read",
                                    "moved_on_then_deleted", "entered_then_deleted", "decided_before_its_jump",
                                    "window_start_deleted", "read_by_a_worker"])
def test_a_reader_jumping_over_deleted_segments_counts_each_op_once(tmp_path, behind):
    """Ops of a segment this reader read, still carried when retention deleted the segments
    after it (each group's last one done), are counted by the summary of the segment where
    they were carried no further: the reader that read them must not count them there again
    (it counted 410 of 400 ops, and their bytes, failures and latencies with them), nor in
    that of a segment it entered (or moved on to, or its window started at) and read none
    of before it went (helper-59: 408-418 of 400), nor where its summaries are decided
    before its jump (a budgeted poll spent on another rank), nor after a worker's first read,
    nor where two threads' begins reached the stream in the other order than their ids (it
    took the last begun's id for the highest read: 401 of 400).
    Also where it reads from a listing made before the deletion (it went on to the next
    segment listed, also gone, without the carry: 19 of 20 ops of a group), and where it
    read nothing before.  A reader before the summaries listed their carried ops reads the
    same counts from their rows, all but the latencies' max."""
    from commscope.analysis.source import open_source
    from commscope.store import directory
    from commscope.store.bulkread import Job

    job = tmp_path / "job"
    written = _twenty_groups(tmp_path, swapped="out of order" in behind)
    if behind in ("window_start_deleted", "read_by_a_worker"):
        _force(job, 1 << 30)  # (the carries written, nothing deleted)
        start = list_segments(job)[(0, 0)][5]
        reader = open_source(str(tmp_path), since=Since(at_ns=(start.start_s + 1) * S))
    else:
        reader = open_reader(tmp_path)
    got: list[dict] = []
    if behind == "decided_before_its_jump":
        other = DirectoryWriter(tmp_path, "job", 1, {"world_size": 2}, segment_bytes=64 << 20, closer=False)
        other.write([meta(1)] + [beat(1, k) for k in range(50)])
    if behind.startswith("jumped") or behind in ("listed_before_the_deletion", "moved_on_then_deleted",
                                                 "decided_before_its_jump", "entered_then_deleted"):
        got += reader.poll(max_bytes=1)  # the first segment (64 KiB read at least)
    stale = list_segments(job)[(0, 0)]
    if behind == "entered_then_deleted":  # (a first jump, to the oldest left; gone before it is read)
        assert _force(job, 48 << 10) >= 3
        _retained_before(reader, job, reader._read_segment)
        got += reader.poll()
    elif behind in ("moved_on_then_deleted", "decided_before_its_jump", "window_start_deleted"):
        _retained_before(reader, job, reader._read_segment)
        got += reader.poll(max_bytes=1 if behind == "window_start_deleted" else None)
        if behind == "decided_before_its_jump":
            other.write([beat(1, k) for k in range(50, 100)])
            got += reader.poll(max_bytes=1)  # (rank 1's turn: rank 0's summaries are decided, it has not jumped)
            assert [e for e in got if e["type"] == "summary"] and not reader._jumps
    elif behind == "read_by_a_worker":  # (``directory.read_streams``, as a worker runs it, here)
        read = directory.DirectoryReader._read_segment

        def worker_reads(self, stream, path, *a, **kw):
            directory.DirectoryReader._read_segment = read
            self._read_segment = read.__get__(self)
            _retained_before(self, job, self._read_segment)
            return self._read_segment(stream, path, *a, **kw)

        directory.DirectoryReader._read_segment = worker_reads
        try:
            done = directory.read_streams(Job(str(job), reader.since_ns, reader.streams()))
        finally:
            directory.DirectoryReader._read_segment = read
        reader._adopt(done)
        batch = done.received()
        got += batch.events + [e for records in batch.ops for e in records.events()]
    else:
        assert _force(job, 8 << 10) >= 10
    if behind == "listed_before_the_deletion":
        assert reader._read_stream((0, 0), stale, None) == ([], 0)  # (waits for the listing to jump)
    got += reader.read_all()
    assert not stale[9].path.exists()  # (retention ran, or the case was not set up)
    if behind == "decided_before_its_jump":
        other.close()
        got = [e for e in got if e["rank"] == 0]
    assert _said(got) == written
    assert sum(e["type"] == "summary" for e in got) >= 10 and reader.stats.summarized > 0
    if behind == "never_read":  # (the rows as a reader before the lists reads them)
        rows = [orjson.loads(line) for line in (job / "rank-00000.summary.jsonl").read_bytes().splitlines()]
        assert any("carried" in e for e in rows)
        old = _said([e for e in got if e["type"] != "summary"] + rows)
        assert {k: v[:4] for k, v in old.items()} == {k: v[:4] for k, v in written.items()}


def test_a_summary_lists_the_ops_carried_into_its_segment_and_a_reader_takes_out_those_it_read():
    """``retention.counted``: a summary's rows count the ops carried into its segment too
    (a reader before the lists reads them as it did), but for their latencies in each
    minute's max; the carried ops a reader read (ids up to what it read before jumping)
    are taken out, the others' latencies put in the max.  A summary without the list is
    taken as it is; the list is read as untrusted as any line, and taking out what the rows
    do not hold leaves nothing below zero."""
    from commscope.events import decode_lines

    row = {"op": "all_reduce", "group": "g", "count": 1, "in_bytes": 8, "out_bytes": 8, "unfinished": 0,
           "failed": 0, "minutes": [[0, 1, 3000, 3000, [[1, 1]]]]}
    cast = {"op": "broadcast", "group": "g", "count": 1, "in_bytes": 2, "out_bytes": 2, "unfinished": 1, "failed": 0,
            "minutes": []}
    # (as ``summarize`` writes it: op 7, carried in, done after 40 us and raising, in the rows
    # but for the max; op 9, carried in, not done)
    summary = {"type": "summary", "v": 3, "rank": 0, "ts": T0, "seg": 4, "events": 9,
               "ops": [{**row, "count": 2, "in_bytes": 16, "out_bytes": 16, "failed": 1,
                        "minutes": [[0, 2, 43000, 3000, [[1, 1], [5, 1]]]]}, cast],
               "carried": [[7, "all_reduce", "g", 8, 8, True, 10, 10 + 40_000, "end", False],
                           [9, "broadcast", "g", 2, 2, False, 10, 0, "", False]]}
    [read] = decode_lines(orjson.dumps(summary) + b"\n", 0).events  # (as a reader has it)

    def ops(summary: dict, read_upto: int) -> list[dict]:
        got = retention.counted(summary, read_upto)
        assert "carried" not in got
        return orjson.loads(orjson.dumps(got["ops"]))

    assert ops(read, -1) == [{**summary["ops"][0], "minutes": [[0, 2, 43000, 40000, [[1, 1], [5, 1]]]]}, cast]
    assert ops(read, 7) == [row, cast]
    assert ops(read, 9) == [row]
    older = {k: v for k, v in summary.items() if k != "carried"}
    assert retention.counted(older, read_upto=9) is older
    stray = summary | {"carried": [[3, "gather", "h", 1, 1, False, 10, 20, "end", False],
                                   [7, "all_reduce", "g", 80, 8, True, 10, 99, "end", True]]}
    assert ops(stray, 9) == [{**row, "in_bytes": 0, "minutes": [[0, 1, 43000 - 89, 3000, [[1, 1], [5, 1]]]]}, cast]
    assert retention.completions(read, 8) == [{"type": "op", "v": 3, "rank": 0, "ts": 10 + 40_000, "phase": "end",
                                               "id": 7, "exc": retention.RAISED}]  # (op 9 not done: nothing)
    assert retention.completions(stray, 8)[-1]["approx"] is True
    assert retention.completions(read, 6) == [] and retention.completions(older, 9) == []
    for bad in ([-7, "all_reduce", "g", 8, 8, True, 10, 0, "", False], [7, "all_reduce", "g", 8, 8, True, 10, 0, ""],
                [7, "all_reduce", "g", "8", 8, True, 10, 0, "", False],
                [7, "all_reduce", "g", 8, 8, True, 10, 0, "begin", False], {"id": 7}):
        hostile = decode_lines(orjson.dumps(summary | {"carried": [bad]}) + b"\n", 0)
        assert hostile.events == [] and sum(hostile.invalid.values()) == 1


@pytest.mark.parametrize("kind", ["sync", "async", "sync, six raise"])
def test_a_reader_that_jumped_knows_an_op_it_read_the_begin_of_was_done(tmp_path, kind):
    """Two ranks' all_reduce #1 begun in what this reader read, done in a segment retention
    deleted before it read it, then 198 more: the reader that jumped kept #1 in flight for
    good (both ranks "blocked" in it, an op done long before) and counted it with no latency;
    the summary of the segment it was done in says when, and the reader completes it (as an
    async op is done: at the end of its wait).  Where #1-#6 all raise there (a carry keeps
    each group's first failure and the last 4: #2 only the summary lists), each is failed
    once, #2 with the summary's word for a text it does not hold (helper-61: done, not
    failed, 5 failures of 6)."""
    from commscope.analysis import rankstate
    from commscope.analysis.model import TraceModel

    writers = {}
    for r in (0, 1):
        writers[r] = DirectoryWriter(tmp_path, "job", r, {"world_size": 2}, segment_bytes=16 << 10, closer=False)
        writers[r].write([meta(r, 2), orjson.dumps({"type": "group", "v": 3, "rank": r, "ts": T0, "group": "g",
                                                 "granks": [0, 1]})])

    def op(r: int, **k) -> bytes:
        return orjson.dumps({"type": "op", "v": 3, "rank": r, **k})

    def beats(k: int, n: int) -> None:
        for r in (0, 1):
            writers[r].write([beat(r, j) for j in range(k, k + n)])

    beats(0, 50)
    raising = range(1, 7) if "raise" in kind else range(1, 2)
    for r in (0, 1):
        for i in raising:
            writers[r].write([op(r, ts=T0 + (50 + i) * S, phase="begin", id=i, op="all_reduce", group="g", seq=i,
                                 tid=1, in_bytes=64, **({"async": True} if kind == "async" else {}))]
                             + ([op(r, ts=T0 + 51 * S + 1000, phase="end", id=1)] if kind == "async" else []))
    beats(50, 300)
    done = T0 + 700 * S
    for r in (0, 1):
        writers[r].write([op(r, ts=done - S, phase="wait_begin", id=1), op(r, ts=done, phase="wait_end", id=1)]
                         if kind == "async" else [op(r, ts=done, phase="end", id=i, exc=f"RuntimeError: boom {i}")
                                                  for i in raising] if "raise" in kind else
                         [op(r, ts=done, phase="end", id=1)])
        for i in range(raising.stop, 200):
            writers[r].write([op(r, ts=done + i * S, phase="begin", id=i, op="all_reduce", group="g", seq=i, tid=1,
                                 in_bytes=64), op(r, ts=done + i * S + 1000, phase="end", id=i)])
    beats(350, 1000)
    for w in writers.values():
        w.close()
    reader = open_reader(tmp_path)
    got = reader.poll(max_bytes=1) + reader.poll(max_bytes=1)  # (each rank's first segment: #1 begun)
    assert sum(e["type"] == "op" and e["id"] in raising and e["phase"] == "begin" for e in got) == 2 * len(raising)
    for r in (0, 1):
        assert retention.close_stream(tmp_path / "job", r, 0, retention.Retention(24 << 10, None)) >= 5
    got += reader.read_all()
    model = TraceModel()
    model.ingest(got)
    assert {r: sorted(model.ranks[r].open) for r in (0, 1)} == {0: [], 1: []}
    assert {s.kind for s in rankstate.rank_states(model, trace_now(model)).values()} == {"idle"}
    assert [int(model.ranks[r].comp[0]) for r in (0, 1)] == [done, done]
    assert sum(o["count"] for e in got if e["type"] == "summary" for o in e["ops"]) + len(
        {(e["rank"], e["id"]) for e in got if e["type"] == "op" and e["phase"] == "begin"}) == 2 * 199
    if "raise" in kind:
        assert sorted(model.failed) == [(r, i) for r in (0, 1) for i in range(6)]
        assert {model.ranks[r].exc[i] for r in (0, 1) for i in range(6)} == {
            retention.RAISED, *(f"RuntimeError: boom {i}" for i in (1, 3, 4, 5, 6))}
        assert sum(o["failed"] for e in got if e["type"] == "summary" for o in e["ops"]) == 0


def test_an_op_done_in_the_rest_of_a_segment_deleted_while_it_was_read_is_done(tmp_path):
    """Rank 0's all_reduce #1 begun in the 64 KiB a reader read of its 256 KiB segment 0,
    done later in that segment; retention deleted segment 0 before the reader read on.  The
    reader counted the rest as lost and kept #1 in flight for good: missing_ranks blamed
    rank 1 for never entering an op both ranks had done (helper-63).  The reader holds the
    file it is part of the way through, so it reads the rest when the listing shows it
    gone: nothing lost, nothing in flight, no finding, and every op read."""
    from commscope.analysis.model import TraceModel

    writers = {r: DirectoryWriter(tmp_path, "job", r, {"world_size": 2}, segment_bytes=256 << 10, closer=False)
               for r in (0, 1)}

    def op(r: int, **k) -> bytes:
        return orjson.dumps({"type": "op", "v": 3, "rank": r, **k})

    for r in (0, 1):
        writers[r].write([meta(r, 2), orjson.dumps({"type": "group", "v": 3, "rank": r, "ts": T0, "group": "g",
                                                 "granks": [0, 1]})])
        writers[r].write([beat(r, j) for j in range(50)])
    writers[0].write([op(0, ts=T0 + 51 * S, phase="begin", id=1, op="all_reduce", group="g", seq=1, tid=1)])
    writers[0].write([beat(0, j) for j in range(52, 2000)])
    reader = open_reader(tmp_path)
    got = reader.poll(max_bytes=1) + reader.poll(max_bytes=1)  # (64 KiB of each stream: rank 0's #1 begun)
    assert [(e["rank"], e["id"]) for e in got if e["type"] == "op"] == [(0, 1)]
    done = T0 + 2000 * S
    writers[1].write([op(1, ts=T0 + 52 * S, phase="begin", id=1, op="all_reduce", group="g", seq=1, tid=1)])
    writers[1].write([beat(1, j) for j in range(52, 2000)])
    for r in (0, 1):
        writers[r].write([op(r, ts=done, phase="end", id=1)])
        for i in range(2, 200):
            writers[r].write([op(r, ts=done + i * S, phase="begin", id=i, op="all_reduce", group="g", seq=i, tid=1),
                              op(r, ts=done + i * S + 1000, phase="end", id=i)])
        writers[r].write([beat(r, j) for j in range(2200, 8200)])
        writers[r].close()
        assert retention.close_stream(tmp_path / "job", r, 0, retention.Retention(600 << 10, None)) == 1
        assert [seg.number for seg in list_segments(tmp_path / "job")[(r, 0)]] == [1]
    got += reader.read_all()
    model = TraceModel()
    model.ingest(got)
    model.settle()
    assert {r: sorted(model.ranks[r].open) for r in (0, 1)} == {0: [], 1: []}
    assert [int(model.ranks[r].comp[0]) for r in (0, 1)] == [done, done]
    assert diagnose(model, trace_now(model), default_hang_after(model)) == []
    assert not reader.stats.missing_by_rank and not reader.stats.summarized
    assert model.total_ops() == 2 * 199
    assert not any("while this reader was reading it" in w for w in reader.stats.warnings)


def test_the_rest_of_a_segment_rescued_by_read_all_s_last_listing_is_in_its_events(tmp_path):
    """(helper-70) ``read_all`` lists the job again after a dead rank's spool is forwarded;
    where that forward made the stream rotate and retention delete the segment the reader
    was in, the rescued rest landed after ``read_all`` had handed on what came first: the
    end of op #1 was left out (check and report never poll again), or in a poll, came after
    the stream's later segments.  It comes in order, in ``read_all``'s events."""
    w = DirectoryWriter(tmp_path, "job", 0, {"world_size": 1}, segment_bytes=256 << 10, closer=False)
    w.write([meta(0), orjson.dumps({"type": "group", "v": 3, "rank": 0, "ts": T0, "group": "g", "granks": [0]})])
    w.write([beat(0, j) for j in range(50)])
    w.write([orjson.dumps({"type": "op", "v": 3, "rank": 0, "ts": T0 + 51 * S, "phase": "begin", "id": 1,
                           "op": "all_reduce", "group": "g", "seq": 1, "tid": 1})])
    w.write([beat(0, j) for j in range(52, 1000)])
    w.close()
    reader = open_reader(tmp_path)
    got = reader.poll()
    assert [e["id"] for e in got if e["type"] == "op"] == [1]
    real = reader.spool_remnants

    def forwarded(job, store, writer, final):  # (the forward appends, the stream rotates, retention deletes)
        if not final:
            return real(job, store, writer, final)
        more = DirectoryWriter(tmp_path, "job", 0, resume=True, segment_bytes=256 << 10, closer=False)
        more.write([orjson.dumps({"type": "op", "v": 3, "rank": 0, "ts": T0 + 1000 * S, "phase": "end", "id": 1})])
        for k in range(1001, 8000, 100):
            more.write([beat(0, j) for j in range(k, k + 100)])
        more.close()
        assert retention.close_stream(tmp_path / "job", 0, 0, retention.Retention(300 << 10, None)) >= 1
        return 1, {}

    reader.spool_remnants = forwarded
    got += reader.read_all()
    assert any(e["type"] == "op" and e.get("phase") == "end" and e["id"] == 1 for e in got)
    beats = written_beats(got)
    assert beats == sorted(beats) and not reader._carried and not reader.stats.missing_by_rank


@pytest.mark.parametrize("ids", ["its own", "another incarnation's too", "not its incarnation's"])
def test_a_restarted_rank_s_op_done_in_a_deleted_segment_is_completed_where_its_id_is_its_own(tmp_path, ids):
    """Rank 0 restarted (incarnation 0 ran 3 ops and ended; incarnation 1 numbers its ops
    from ``1 << 40`` on); incarnation 1's all_reduce begun in what a reader read was done in
    a segment retention deleted before it read it.  The reader completed it only for a rank
    of one incarnation, and kept it in flight for good here: the console showed rank 0
    blocked in an op done long before.  It is completed where its id is its incarnation's
    own and no other incarnation of the rank reached into those ids; else not (closing
    another incarnation's op in flight of that id would hide its hang), as before."""
    from commscope.analysis.model import TraceModel
    from commscope.events import incarnation_ids

    base = incarnation_ids(1).start if ids != "not its incarnation's" else 100
    first = base if ids == "another incarnation's too" else 1

    def op(**k) -> bytes:
        return orjson.dumps({"type": "op", "v": 3, "rank": 0, **k})

    old = DirectoryWriter(tmp_path, "job", 0, {"world_size": 1}, incarnation=0, closer=False)
    old.write([meta()] + [op(ts=T0 + i * S, phase=p, id=first + i, op="all_reduce", group="0", seq=i + 1, tid=1)
                          for i in range(3) for p in ("begin", "end")])
    old.close()
    w = DirectoryWriter(tmp_path, "job", 0, {"world_size": 1}, incarnation=1, segment_bytes=16 << 10, closer=False)
    w.write([meta(), op(ts=T0 + 10 * S, phase="begin", id=base, op="all_reduce", group="0@1", seq=1, tid=1)])
    w.write([beat(0, k) for k in range(10, 300)])
    done = T0 + 300 * S
    w.write([op(ts=done, phase="end", id=base)])
    for i in range(1, 100):
        w.write([op(ts=done + i * S, phase="begin", id=base + i, op="all_reduce", group="0@1", seq=i + 1, tid=1),
                 op(ts=done + i * S + 1000, phase="end", id=base + i)])
    w.write([beat(0, k) for k in range(400, 1200)])
    w.close()
    reader = open_reader(tmp_path)
    got = reader.poll(max_bytes=1) + reader.poll(max_bytes=1)  # (incarnation 0; 1's first segment: the begin)
    assert any(e["type"] == "op" and e["id"] == base and e["phase"] == "begin" for e in got)
    assert retention.close_stream(tmp_path / "job", 0, 1, retention.Retention(24 << 10, None)) >= 3
    end = op(ts=done, phase="end", id=base)
    assert not any(end in p.read_bytes() for p in (tmp_path / "job").iterdir())  # (deleted, summarized)
    got += reader.read_all()
    model = TraceModel()
    model.ingest(got)
    completed = [e for e in got if e["type"] == "op" and e["ts"] == done]
    if ids == "its own":
        assert completed == [{"type": "op", "v": 3, "rank": 0, "ts": done, "phase": "end", "id": base}]
        assert not model.ranks[0].open
    else:
        assert completed == []
        assert [int(model.ranks[0].id[i]) for i in model.ranks[0].open] == [base]  # (as before)
    begun = [e["id"] for e in got if e["type"] == "op" and e["phase"] == "begin"]
    assert len(begun) + sum(o["count"] for e in got if e["type"] == "summary" for o in e["ops"]) == 3 + 100


def test_a_completion_from_a_summary_keeps_the_exception_text_read_before():
    """A reader that read an op's exception, then was told by a summary that it raised
    (``retention.RAISED``: the summary holds no text), keeps the text it read, and counts
    the failure once."""
    from commscope.analysis.model import TraceModel

    op = retention.Carried(1, "all_reduce", "0", 8, 8, True, T0, T0 + S, "end")
    model = TraceModel()
    model.ingest([orjson.loads(meta()), {"type": "op", "v": 3, "rank": 0, "ts": T0, "phase": "begin", "id": 1,
                                          "op": "all_reduce", "group": "0", "seq": 1, "tid": 1},
                  {"type": "op", "v": 3, "rank": 0, "ts": T0 + S, "phase": "end", "id": 1,
                   "exc": "RuntimeError: NCCL timeout"}])
    model.ingest([op.completion(0)])
    assert model.ranks[0].exc == {0: "RuntimeError: NCCL timeout"} and model.failed == [(0, 0)]
    assert int(model.ranks[0].comp[0]) == T0 + S


def test_one_child_bounds_a_stream_at_a_time_and_summarizes_a_segment_once(tmp_path):
    import fcntl

    job = _segmented(tmp_path)
    summary = job / "rank-00000.summary.jsonl"
    assert _force(job, 1 << 30) == 0 and not summary.exists()  # nothing to drop: no summary file
    with open(summary, "ab") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        assert _force(job, 32 << 10) == 0  # another child holds the stream
    first = list_segments(job)[(0, 0)][0]
    summary.write_bytes(orjson.dumps(retention.summarize(first.path, 0, 0)) + b"\n")  # a child stopped there
    gone = _force(job, 32 << 10)
    assert gone >= 3 and not first.path.exists()
    assert [orjson.loads(x)["seg"] for x in summary.read_bytes().splitlines()] == list(range(gone))


def _windowed(root: Path, events: list[dict], segment: int = 16 << 10, sizes: dict[int, int] | None = None) -> Path:
    """``events`` written through the directory writer in small segments (``sizes``: some
    ranks' own), 8 lines a write, the streams closed (carries written), every file's mtime
    the trace's end: a window counted back from the job's newest write then starts partway
    through its history."""
    from commscope.events import encode

    end = max(e["ts"] for e in events)
    ranks = sorted({e["rank"] for e in events})
    for r in ranks:
        lines = [encode(e) for e in sorted((e for e in events if e["rank"] == r), key=lambda e: e["ts"])]
        w = DirectoryWriter(root, "job", r, {"world_size": len(ranks)}, closer=False,
                            segment_bytes=(sizes or {}).get(r, segment))
        for k in range(0, len(lines), 8):
            w.write(lines[k:k + 8])
        w.close()
        retention.close_stream(w.dir, r, 0, retention.parse("none"))
    for p in (root / "job").iterdir():
        os.utime(p, ns=(end, end))
    return root


def _found(store: Path, capsys, *extra: str) -> tuple[int, list[tuple], dict]:
    capsys.readouterr()
    rc = cli(["check", str(store), "--json", *extra])
    out = json.loads(capsys.readouterr().out)
    return rc, [(f["kind"], f["culprits"]) for f in out["findings"]], out


def _window_says_what_a_full_read_says(root: Path, capsys, events: list[dict], evidence: bool = True,
                                       sizes: dict[int, int] | None = None) -> tuple[int, list[tuple], dict]:
    """``events`` written in segments (``_windowed``), read whole and ``--since 10m``: the
    same exit and findings (``evidence``: evidence and all), the window having read under
    a third of the events; returns the window's (exit, (kind, culprits) of each finding,
    ``check --json``)."""
    store = _windowed(root, events, sizes=sizes)
    full = _found(store, capsys)
    rc, found, out = _found(store, capsys, "--since", "10m")
    assert full[:2] == (rc, found)
    assert out["skipped"]["before_window_bytes"] > 0 and out["events"] < full[2]["events"] / (3 if not sizes else 1)
    if evidence:
        assert [f["evidence"] for f in out["findings"]] == [f["evidence"] for f in full[2]["findings"]]
    return rc, found, out


def _busy_then(tb, t: int) -> int:
    """100 all_reduces of every rank from ``t`` on, a second apart; returns the next second."""
    for _ in range(100):
        t = tb.collective(t) + S
    return t


@pytest.mark.parametrize("case", ["broadcast root", "broadcast root, then 9 groups", "send"])
def test_a_window_knows_what_a_rank_entered_in_each_group_and_channel(tmp_path, capsys, case):
    """The root of a broadcast that returned while the others still wait in it, or a send
    that returned while its recv waits, then an hour of ops in other groups: the window
    starts long after, yet names no rank that "never entered" or "never posted" (a carry
    kept only the rank's last op of all, from another group)."""
    from commscope.analysis.synth import TraceBuilder

    hour = 3600 * S
    tb = TraceBuilder(4, hang_after=10.0, sample_interval=5.0)
    t = _busy_then(tb, tb.t0 + S)
    done = 1 if case == "send" else 0
    if case != "send":
        tb.sync(0, t, t + 1000, "broadcast", root=0)
        for r in (1, 2, 3):
            tb.sync(r, t, None, "broadcast", root=0)
    else:
        tb.sync(1, t, t + 1000, "send", peer=0, dir="send")
        tb.sync(0, t + S, None, "recv", peer=1, dir="recv")
    tb.heartbeats(tb.t0 + S, t + hour, interval=5 * S)
    groups = [f"solo{g}" for g in range(9 if case.endswith("9 groups") else 1)]
    for g in groups:
        tb.group(g, [done])
    for k in range(1, 360):
        tb.sync(done, t + 10 * k * S, t + 10 * k * S + 1000, "all_reduce", group=groups[k % len(groups)])
    assert _window_says_what_a_full_read_says(tmp_path / "s", capsys, tb.events)[:2] == (0, [])


@pytest.mark.parametrize("differs", ["shape", "dtype", "op", "shape, rank 3 lost #50"])
def test_a_mismatch_that_completed_long_before_the_window_is_still_found(tmp_path, capsys, differs):
    """Rank 2 ran all_reduce #101 with another shape, dtype or op than ranks 0, 1 and 3, the
    collective completed everywhere, and the job ran on for an hour: the window, which
    reads none of it, names rank 2 for a mismatch in group 0, as the full read does (each
    carry says a digest of its rank's history of the group's collectives; compared at one
    seq, rank 2's differs).  Where rank 3 lost its records of #50, its history starts after
    them and is not compared: the evidence says so (it said only the ranks compared)."""
    from commscope.analysis.synth import TraceBuilder

    tb = TraceBuilder(4, hang_after=10.0, sample_interval=5.0)
    t = _busy_then(tb, tb.t0 + S)
    if "lost" in differs:
        lost = next(e for e in tb.events if e["rank"] == 3 and e["type"] == "op" and e.get("seq") == 50)
        tb.events[:] = [e for e in tb.events if not (e["rank"] == 3 and e["type"] == "op" and e["id"] == lost["id"])]
    odd = {"shape": {"shape": (12,)}, "dtype": {"dtype": "float16"}, "op": {"op": "all_gather"}}[differs.split(",")[0]]
    for r in range(4):
        kw = odd if r == 2 else {}
        tb.sync(r, t, t + 1000, kw.get("op", "all_reduce"), **{k: v for k, v in kw.items() if k != "op"})
    t += S
    for _ in range(36):
        t = _busy_then(tb, t)
    store = _windowed(tmp_path / "s", tb.events)
    full = _found(store, capsys)
    rc, found, out = _found(store, capsys, "--since", "10m")
    assert full[:2] == (rc, found) == (1, [("collective_mismatch", [2])])
    assert out["skipped"]["before_window_bytes"] > 0 and out["events"] < full[2]["events"] / 3
    assert full[2]["findings"][0]["seq"] == 101
    f = out["findings"][0]
    assert f["group"] == "0" and f["seq"] > 101 and "before what was read" in f["message"]
    compared, others = ([[0, 1], [2]], [3]) if "lost" in differs else ([[0, 1, 3], [2]], [])
    assert f["evidence"]["history"]["ranks_by_history"] == compared
    assert f["evidence"]["history"]["not_compared"] == others


def test_a_mismatch_in_history_retention_deleted_is_not_sent_to_a_read_from_the_start(tmp_path, capsys):
    """Rank 2's all_reduce #101 differed, and retention then deleted the segments holding it:
    a whole read finds the mismatch from the carries, as a window does, but no read can show
    where any more (it told the user to read "without --since": helper-72)."""
    from commscope.analysis.synth import TraceBuilder

    tb = TraceBuilder(4, hang_after=10.0, sample_interval=5.0)
    t = _busy_then(tb, tb.t0 + S)
    for r in range(4):
        tb.sync(r, t, t + 1000, "all_reduce", **({"shape": (12,)} if r == 2 else {}))
    t += S
    for _ in range(36):
        t = _busy_then(tb, t)
    store = _windowed(tmp_path / "s", tb.events)
    window = _found(store, capsys, "--since", "10m")[2]["findings"][0]["message"]
    assert "(read from the start, without --since, to see where)" in window
    for r in range(4):
        assert retention.close_stream(store / "job", r, 0, retention.Retention(max_bytes=64 << 10,
                                                                              max_age_s=None)) > 0
    rc, found, out = _found(store, capsys)
    assert (rc, found) == (1, [("collective_mismatch", [2])])
    said = out["findings"][0]["message"]
    assert "retention deleted the segments where they began" in said and "without --since" not in said


def _redop_mismatch(world: int, culprit: int, dies: bool = False, exits: bool = False) -> list[dict]:
    """360 all_reduces of every rank 10 s apart, ``culprit``'s #20 with another reduce op
    (it completes everywhere); ``dies``: the culprit dies after #249, the others wait in #250;
    ``exits``: every rank exits at the end."""
    from commscope.analysis.synth import TraceBuilder

    tb = TraceBuilder(world, hang_after=10.0, sample_interval=5.0)
    t = tb.t0 + S
    for k in range(1, 361):
        if dies and k == 250:
            for r in range(world):
                if r != culprit:
                    tb.sync(r, t, None, "all_reduce")
            tb.heartbeats(tb.t0 + S, t + 1200 * S, interval=5 * S, ranks=[r for r in range(world) if r != culprit])
            tb.heartbeats(tb.t0 + S, t - 20 * S, interval=5 * S, ranks=[culprit])
            return tb.events
        for r in range(world):
            tb.sync(r, t, t + 100_000, "all_reduce", redop="max" if k == 20 and r == culprit else "sum")
        t += 10 * S
    tb.heartbeats(tb.t0 + S, t + 60 * S, interval=5 * S)
    if exits:
        for r in range(world):
            tb.exit(r, t + 61 * S)
    return tb.events


@pytest.mark.parametrize("case", ["culprit read whole", "culprit read whole, all exited", "culprit carried",
                                  "culprit died since"])
def test_histories_of_ranks_read_whole_carried_or_stopped_compare(tmp_path, capsys, case):
    """A reduce-op mismatch long before the window (rank 3, or rank 0): where ranks 0 and 1
    rotate at 1 MiB (the window reads them whole, no carry) and 2 and 3 at 4 KiB, the
    ranks read whole have the history of what was read, and a mismatch read with members
    absent that ran it before (exited since, or not) is left to the histories (it named
    nobody, or ranks 0 and 1 as a tie, or 2 and 3); where the culprit died after #249 and
    the others' carries end at the #250 they wait in, theirs are taken back to #249.  The
    window names the culprit alone."""
    culprit = {"culprit carried": 3, "culprit died since": 1}.get(case, 0)
    sizes = None if case == "culprit died since" else {0: 1 << 20, 1: 1 << 20}
    events = _redop_mismatch(4, culprit, dies=case == "culprit died since", exits=case.endswith("exited"))
    segment = 4 << 10 if sizes else 16 << 10
    store = _windowed(tmp_path / "s", events, segment=segment, sizes=sizes)
    full = _found(store, capsys)
    rc, found, out = _found(store, capsys, "--since", "10m")
    want = [("collective_mismatch", [culprit])] + ([("dead_rank", [1])] if case == "culprit died since" else [])
    assert full[:2] == (rc, found) == (1, want)
    assert out["events"] < full[2]["events"]
    assert "before what was read" in out["findings"][0]["message"]


def test_a_window_that_starts_after_the_trace_s_end_says_so(tmp_path):
    """``--since 2030-01-01T00:00`` (or a time later today) read what the keyframes said the
    ranks were in, and said nothing of the window being past the trace (helper-163); a
    window inside it says nothing of the kind."""
    from commscope.analysis.synth import TraceBuilder

    tb = TraceBuilder(2, hang_after=10.0, sample_interval=5.0)
    t = tb.t0 + S
    for _ in range(400):
        t = tb.collective(t) + S
    store = _windowed(tmp_path / "t", tb.events)
    model, _, warnings = load_trace(str(store), since=parse_since("2030-01-01T00:00"))
    end = Since(at_ns=model.end_ns).describe()[6:]
    assert [w for w in warnings if "starts after" in w] == [
        f"the window (since 2030-01-01 00:00:00 UTC) starts after the trace's newest event ({end}): no event of the "
        "trace is in it; what is shown is what the ranks were in as the streams' keyframes and marks said"], warnings
    _, _, warnings = load_trace(str(store), since=parse_since("10m"))
    assert not [w for w in warnings if "starts after" in w], warnings


def test_histories_agree_where_the_ranks_ran_the_same_collectives(tmp_path, capsys):
    """Ranks whose segments end at different seqs (rank 3 writes more bytes), a rank that
    lost records long before the window (a gap in its seqs: its history starts again
    after it), and the rank whose carry ends first losing a collective inside the window,
    between its carry and the others': the window compares the ranks where it can, never
    one that did not run every seq up to where it compares, and blames nobody where they
    ran the same collectives."""
    from commscope.analysis.synth import TraceBuilder

    tb = TraceBuilder(4, hang_after=10.0, sample_interval=5.0)
    t = tb.t0 + S
    for k in range(3700):
        t = tb.collective(t, site="x" * 300 if k % 2 else None) + S
        if k % 50 == 0:
            tb.add(3, t, "heartbeat", inflight=0, pad="p" * 2000)

    def lose(rank: int, seq: int) -> None:
        lost = next(e for e in tb.events if e["rank"] == rank and e["type"] == "op" and e.get("seq") == seq)
        gone = {id(e) for e in tb.events if e["rank"] == rank and e["type"] == "op" and e["id"] == lost["id"]}
        tb.events[:] = [e for e in tb.events if id(e) not in gone]

    lose(1, 500)
    model, _, _ = load_trace(str(_windowed(tmp_path / "first", tb.events)), since=parse_since("10m"))
    ends = {r: c.history.last for r, c in model.histories["0"].items()}
    assert ends[3] + 2 < max(ends.values()) and model.histories["0"][1].history.first == 501
    lose(3, ends[3] + 2)
    rc, found, out = _window_says_what_a_full_read_says(tmp_path / "s", capsys, tb.events)
    assert (rc, found) == (0, [])


def _then_alone(tb, t: int, rank: int) -> None:
    """``rank`` runs all_reduces in a group of its own every 10 s for an hour; every rank beats."""
    tb.heartbeats(tb.t0 + S, t + 3600 * S, interval=5 * S)
    tb.group(f"solo{rank}", [rank])
    for k in range(1, 360):
        tb.sync(rank, t + 10 * k * S, t + 10 * k * S + 1000, "all_reduce", group=f"solo{rank}")


@pytest.mark.parametrize("then", ["batch_isend_irecv", "Flight Recorder all_reduce", "any-source recvs"])
def test_what_a_rank_did_after_a_collective_never_takes_its_place_in_the_carry(tmp_path, capsys, then):
    """The root of a broadcast that returned while the others wait in it then ran a
    batch_isend_irecv (a container: group 0, no seq) or a Flight Recorder all_reduce of
    group 0 (another seq space); or a rank received by any-source recv a send still in
    flight, then another from another rank.  Each op is carried in its own place (a
    collective by its space and group, a p2p op by its channel, an any-source recv by the
    source its end named; a container not at all): the window names nobody, as the full
    read does (it named rank 0 "never entered", or its recv unmatched)."""
    from commscope.analysis.synth import TraceBuilder

    tb = TraceBuilder(4, hang_after=10.0, sample_interval=5.0)
    t = _busy_then(tb, tb.t0 + S)
    if then == "any-source recvs":
        tb.sync(1, t, None, "send", peer=0, dir="send")
        i = tb.begin(0, t, "recv", peer=None, dir="recv")
        tb.end(0, i, t + 1000, peer=1, seq=1)
        tb.sync(2, t + S, t + S + 1000, "send", peer=0, dir="send")
        j = tb.begin(0, t + S, "recv", peer=None, dir="recv")
        tb.end(0, j, t + S + 1000, peer=2, seq=1)
    else:
        tb.sync(0, t, t + 1000, "broadcast", root=0)
        for r in (1, 2, 3):
            tb.sync(r, t, None, "broadcast", root=0)
        if then == "batch_isend_irecv":
            c = tb.begin(0, t + 2000, "batch_isend_irecv", seq=None)
            i = tb.begin(0, t + 2100, "isend", peer=1, dir="send", parent=c, **{"async": True})
            tb.end(0, i, t + 2300)
            tb.end(0, c, t + 2400)
            tb.phase(0, i, t + 2500, "wait_begin")
            tb.phase(0, i, t + 2600, "wait_end")
        else:
            tb.sync(0, t + 2000, t + 3000, "all_reduce", seq=1, src="fr")
    _then_alone(tb, t, 0)
    assert _window_says_what_a_full_read_says(tmp_path / "s", capsys, tb.events)[:2] == (0, [])


def test_a_group_s_first_failure_outlives_the_failures_after_it(tmp_path, capsys):
    """Ranks 0 and 2 timed out in all_reduce #101 waiting for rank 1, which came late and
    failed; then each of their 4 next all_reduces raised at once (an aborted communicator),
    an hour before the window.  The carry keeps each group's first op that raised beside
    the last 4, so the window still names rank 1, as the full read does."""
    from evidence_scenarios import CLOSED, TIMED_OUT

    from commscope.analysis.synth import TraceBuilder

    tb = TraceBuilder(3, hang_after=10.0, sample_interval=5.0)
    t = _busy_then(tb, tb.t0 + S)
    ids = {r: tb.begin(r, t, "all_reduce") for r in (0, 2)}
    for r in (0, 2):
        tb.end(r, ids[r], t + 3 * S + r * 1000, exc=TIMED_OUT)
    late = tb.begin(1, t + 5 * S, "all_reduce")
    tb.end(1, late, t + 5 * S + 1000, exc=CLOSED)
    for k in range(4):
        for r in (0, 2):
            tb.end(r, tb.begin(r, t + (6 + k) * S, "all_reduce"), t + (6 + k) * S + 1000, exc=CLOSED)
    tb.heartbeats(tb.t0 + S, t + 3600 * S, interval=5 * S)
    rc, found, _ = _window_says_what_a_full_read_says(tmp_path / "s", capsys, tb.events)
    assert (rc, found) == (1, [("op_failed", [1]), ("op_failed", [])])


def test_where_a_rank_is_stuck_is_still_shown_after_an_hour(tmp_path, capsys):
    """Rank 2 never entered all_reduce #4; the stack it captured when its op passed
    hang_after, and the others', were taken an hour before the window: the carry keeps the
    stacks of the ops in flight and each rank's latest, so the window shows the same
    evidence, stacks and where the culprit is included."""
    import evidence_scenarios

    tb = evidence_scenarios.missing_ranks()
    end = max(e["ts"] for e in tb.events)
    tb.heartbeats(end + 5 * S, end + 3600 * S, interval=5 * S)
    rc, found, out = _window_says_what_a_full_read_says(tmp_path / "s", capsys, tb.events)
    assert (rc, found) == (1, [("missing_ranks", [2])])
    assert out["findings"][0]["evidence"]["culprit_where"] and out["findings"][0]["evidence"]["stacks"]


def test_a_send_followed_by_a_later_one_on_its_channel_was_posted(tmp_path, capsys):
    """Rank 1's sends #1 and #2 to rank 0 returned while rank 0's recv #1 still waits, an
    hour before the window: the carry keeps send #2 only, and a later send on a channel
    says the earlier ones were posted, so the window names nobody, as the full read."""
    from commscope.analysis.synth import TraceBuilder

    tb = TraceBuilder(4, hang_after=10.0, sample_interval=5.0)
    t = _busy_then(tb, tb.t0 + S)
    tb.sync(1, t, t + 1000, "send", peer=0, dir="send")
    tb.sync(1, t + 2000, t + 3000, "send", peer=0, dir="send")
    tb.sync(0, t + S, None, "recv", peer=1, dir="recv")
    _then_alone(tb, t, 1)
    assert _window_says_what_a_full_read_says(tmp_path / "s", capsys, tb.events)[:2] == (0, [])


def test_a_send_whose_channel_a_carry_passed_is_still_posted(tmp_path, capsys):
    """Rank 1's send #1 to rank 0 returned while rank 0's recv #1 still waits; rank 1 then
    sent on 9 other channels, an hour before the window.  Its carry keeps the last 8
    channels' ops whole and says the rest's last seq on their group's line, so the window
    does not call rank 1's send "never posted", as the full read does not."""
    from commscope.analysis.synth import TraceBuilder

    tb = TraceBuilder(4, hang_after=10.0, sample_interval=5.0)
    t = _busy_then(tb, tb.t0 + S)
    tb.sync(1, t, t + 1000, "send", peer=0, dir="send")
    tb.sync(0, t + S, None, "recv", peer=1, dir="recv")
    tb.heartbeats(tb.t0 + S, t + 3600 * S, interval=5 * S)
    for g in range(9):
        tb.group(f"pp{g}", [1, 2])
        a = t + (10 + 10 * g) * S
        tb.sync(1, a, a + 1000, "send", group=f"pp{g}", peer=2, dir="send")
        tb.sync(2, a, a + 1000, "recv", group=f"pp{g}", peer=1, dir="recv")
    for j in range(340):
        tb.collective(t + (100 + 10 * j) * S, "all_reduce", group="pp0")
    assert _window_says_what_a_full_read_says(tmp_path / "s", capsys, tb.events)[:2] == (0, [])


def test_a_failure_an_hour_before_the_window_is_still_found(tmp_path, capsys):
    from commscope.analysis.synth import TraceBuilder

    tb = TraceBuilder(4, hang_after=10.0, sample_interval=5.0)
    t = _busy_then(tb, tb.t0 + S)
    for r in range(4):
        i = tb.begin(r, t, "all_reduce")
        tb.end(r, i, t + S, **({"exc": "RuntimeError: CUDA error: an illegal memory access"} if r == 2 else {}))
    t = _busy_then(tb, t + 2 * S)
    for _ in range(30):
        t = _busy_then(tb, t)
    assert _window_says_what_a_full_read_says(tmp_path / "s", capsys, tb.events)[:2] == (1, [("op_failed", [2])])


def test_a_window_starting_in_a_segment_s_first_second_reads_the_segment_before():
    """A segment's name says when it began in whole seconds, rounded down: one named 100 may
    have begun at 100.7, after a window's start at 100.15, and the one before it holds the
    window's first events."""
    from commscope.store.segments import Segment, window_start

    segs = [Segment(0, 0, Path("a")), Segment(1, 50, Path("b")), Segment(2, 100, Path("c")), Segment(3, 200, Path("d"))]
    assert [window_start(segs, s) for s in (None, 10.0, 50.5, 51.0, 100.0, 100.15, 101.0, 150.0, 250.0)] == [
        0, 0, 0, 1, 1, 1, 2, 2, 3]


def test_the_recorder_s_drops_before_the_window_are_counted_once(tmp_path, capsys):
    """Rank 1's recorder dropped 50 events an hour before the window: the window's read
    counts them as the full read does (its carry says the recorder's drops so far; the
    model takes it again as a running total, adding nothing)."""
    from commscope.analysis.model import TraceModel
    from commscope.analysis.synth import TraceBuilder

    tb = TraceBuilder(4, hang_after=10.0, sample_interval=5.0)
    t = _busy_then(tb, tb.t0 + S)
    tb.add(1, t, "dropped", count=50, total=50, reason="buffer full")
    for _ in range(30):
        t = _busy_then(tb, t)
    rc, found, out = _window_says_what_a_full_read_says(tmp_path / "s", capsys, tb.events)
    assert (rc, found) == (1, [("trace_incomplete", [1])])
    assert out["findings"][0]["evidence"]["per_rank"] == {"1": {"dropped": 50, "dropped_why": "buffer full"}}
    drop = {"type": "dropped", "v": 3, "rank": 1, "ts": T0, "count": 50, "total": 50, "reason": "buffer full"}
    carried = inflight.replay(b"", orjson.dumps(drop) + b"\n", 1).carry()
    m = TraceModel()
    m.ingest([drop])
    m.ingest(open_reader_events(carried, 1))
    assert m.ranks[1].dropped == 50
    m.ingest([dict(drop, count=5, total=55)])
    assert m.ranks[1].dropped == 55


def open_reader_events(lines: bytes, rank: int) -> list[dict]:
    from commscope.events import decode_lines

    return decode_lines(lines, rank).events


def test_a_carry_stays_small_however_many_channels_and_failures_a_rank_used():
    """A rank that sent to and received from 1,000 peers, 20 ops raising halfway: its carry
    keeps the last op of the 8 channels used last, the group's first op that raised and the
    last 4 (a window reads every rank's carry, a Redis mark keeps one)."""
    lines = [{"type": "group", "v": 3, "rank": 0, "ts": T0, "group": "0", "granks": list(range(1001))}]
    op_id = 0
    for peer in range(1, 1001):
        for direction in ("send", "recv"):
            op_id += 1
            ts = T0 + op_id * 1000
            lines.append({"type": "op", "v": 3, "rank": 0, "ts": ts, "phase": "begin", "id": op_id,
                          "op": direction, "group": "0", "peer": peer, "dir": direction, "seq": 1})
            end = {"type": "op", "v": 3, "rank": 0, "ts": ts + 500, "phase": "end", "id": op_id}
            lines.append(end | ({"exc": "RuntimeError: Connection reset by peer"} if 500 < peer <= 510 else {}))
    data = b"".join(orjson.dumps(e) + b"\n" for e in lines)
    got = inflight.replay(b"", data, 0)
    kept = got.carried_out()
    assert len(got.failed) == 20
    # (the first that raised, the last 4, the last 8)
    assert kept == [1001, 1017, 1018, 1019, 1020, *range(op_id - 7, op_id + 1)]
    carry = got.carry()
    assert carry.count(b'"type":"op"') == 26  # (each a begin and an end)
    # of the other 1,992 channels, the CHANNELS_PASSED done last: peer, direction, last seq, when
    passed = orjson.loads(carry.split(b"\n")[0])["channels"]
    assert [p[:3] for p in passed] == [[k // 2, "send" if k % 2 == 0 else "recv", 1]
                                       for k in range(2000 - 8 - 256 + 2, 2000 - 8 + 2)]
    assert len(carry) < 32 << 10


def test_a_carry_passes_the_channels_done_last_whatever_their_group_or_space():
    """Channels passed from carry to carry stay in the order they were done across groups
    (the cap drops the oldest, not a group's), a Flight Recorder op on a channel never
    takes a Python op's place, and a channel used again since is carried at its new seq."""
    def op(k: int, group: str, peer: int, seq: int = 1, src: str | None = None) -> list[dict]:
        ts = T0 + k * 1000
        b = {"type": "op", "v": 3, "rank": 0, "ts": ts, "phase": "begin", "id": k, "op": "send", "group": group,
             "peer": peer, "dir": "send", "seq": seq} | ({"src": src} if src else {})
        return [b, {"type": "op", "v": 3, "rank": 0, "ts": ts + 500, "phase": "end", "id": k}]

    def lines(ops: list[dict]) -> bytes:
        return b"".join(orjson.dumps(e) + b"\n" for e in ops)

    def passed(carry: bytes) -> dict[str, list]:
        return {g["group"]: [c[:3] for c in g.get("channels", [])]
                for g in map(orjson.loads, carry.splitlines()) if g["type"] == "group"}

    first = [e for k in range(1, 201) for e in op(k, "A", k)]  # (A's group line comes first)
    first += [e for k in range(201, 401) for e in op(k, "B", k)] + [e for k in range(401, 409) for e in op(k, "C", k)]
    carry = inflight.replay(b"", lines(first), 0).carry()
    assert len(passed(carry)["A"]) + len(passed(carry)["B"]) == 256 and passed(carry)["B"][-1] == [400, "send", 1]
    more = [e for k in range(409, 429) for e in op(k, "D", k)] + op(429, "B", 400, seq=2) + op(430, "C", 401, src="fr")
    again = passed(inflight.replay(carry, lines(more), 0).carry())
    # kept whole: the Flight Recorder op, B's 400 used again, D's last 6; passed, the 256 done
    # last of the rest: D's other 14, C's 8, B's 199, and A's last 35 (A's oldest went first)
    assert sum(map(len, again.values())) == 256
    assert again["A"] == [[k, "send", 1] for k in range(166, 201)]
    assert again["B"] == [[k, "send", 1] for k in range(201, 400)]
    assert again["C"] == [[k, "send", 1] for k in range(401, 409)]  # (401 too: no Flight Recorder op took it)
    assert again["D"] == [[k, "send", 1] for k in range(409, 423)]


def test_the_drops_of_each_incarnation_before_the_window_add_up(tmp_path):
    """Rank 0 restarted: its first process dropped 50 events, its second 30, both before the
    window: the window counts 80, as a full read does (each carry says its own process's
    running total)."""
    end = T0 + 20_000 * S
    t = T0
    for inc, drops in ((0, 50), (1, 30)):
        w = DirectoryWriter(tmp_path, "job", 0, {"world_size": 1}, incarnation=inc, segment_bytes=16 << 10,
                            closer=False)
        w.write([meta()])
        w.write([orjson.dumps({"type": "dropped", "v": 3, "rank": 0, "ts": t + S, "count": drops, "total": drops,
                               "reason": "buffer full"})])
        for k in range(0, 3000, 50):
            w.write([orjson.dumps({"type": "heartbeat", "v": 3, "rank": 0, "ts": t + (j + 2) * S, "inflight": 0})
                     for j in range(k, k + 50)])
        t += 5000 * S
        w.close()
        retention.close_stream(w.dir, 0, inc, retention.parse("none"))
    for p in (tmp_path / "job").iterdir():
        os.utime(p, ns=(end, end))
    full, _, _ = load_trace(str(tmp_path))
    window, reader, _ = load_trace(str(tmp_path), since=Since(ago_s=600))
    assert reader.stats.skipped_bytes > 0
    assert full.ranks[0].dropped == window.ranks[0].dropped == 80


@pytest.mark.parametrize("first", ["here", "in workers"])  # (a console's first read: ``read_apart``)
@pytest.mark.parametrize("other", [0, 40])  # drops of another incarnation of the rank
def test_a_reader_that_jumps_over_deleted_segments_counts_the_drops_once(tmp_path, monkeypatch, other, first):
    """A live reader read a stream whose recorder had dropped 10 events (no op yet), fell
    behind while 20 more drops landed in segments retention then deleted: it jumps to the
    oldest segment left, reading the carry of the one before, and counts the 20 it did not
    read, as a fresh full read does: 30, and 70 where an earlier incarnation of the rank
    dropped 40 (its running total alone would say 30 of them, its drops on top 10 twice),
    whether it read the stream first itself or went on from read workers' first read."""
    from commscope.analysis.model import TraceModel
    from commscope.store.directory import DirectoryReader

    if first == "in workers":
        by_workers(monkeypatch)
        monkeypatch.setattr(DirectoryReader, "PARALLEL_MIN_BYTES", 0)
        w1 = DirectoryWriter(tmp_path, "job", 1, {"world_size": 2}, closer=False)  # (two streams: a read apart)
        w1.write([meta(1), beat(1, 1)])
        w1.close()

    def drop(k: int, count: int, total: int) -> bytes:
        return orjson.dumps({"type": "dropped", "v": 3, "rank": 0, "ts": T0 + k * S, "count": count, "total": total,
                             "reason": "buffer full"})

    if other:
        w = DirectoryWriter(tmp_path, "job", 0, {"world_size": 1}, incarnation=1, closer=False)
        w.write([meta(), drop(10, other, other)])
        w.close()
    w = DirectoryWriter(tmp_path, "job", 0, {"world_size": 1}, segment_bytes=16 << 10, closer=False)
    w.write([meta(), drop(20, 10, 10)])
    for k in range(100, 400, 50):
        w.write([beat(0, j) for j in range(k, k + 50)])
    reader = open_reader(str(tmp_path))
    jumped = TraceModel()
    if first == "in workers":
        for b in reader.read_apart(1 << 20):
            jumped.ingest(b.events, b.ops, b.spans, b.beats)
        assert reader.stats.workers > 0
    jumped.ingest(reader.read_all())
    assert jumped.ranks[0].dropped == 10 + other
    w.write([drop(500, 20, 30)])
    for k in range(500, 3000, 50):
        w.write([beat(0, j) for j in range(k, k + 50)])
    w.close()
    assert retention.close_stream(tmp_path / "job", 0, 0, retention.Retention(max_bytes=32 << 10, max_age_s=None)) > 3
    jumped.ingest(reader.read_all())
    full = TraceModel()
    full.ingest(open_reader(str(tmp_path)).read_all())
    assert jumped.ranks[0].dropped == full.ranks[0].dropped == 30 + other


def test_a_carry_leaves_out_the_number_an_op_the_backend_refused_gave_back():
    """A broadcast and a send refused as they were called, their begins written out with a
    number before the refusal (their ends say ``unissued``): the group's history is that of
    its all_reduces #1 to #5 (not the broadcast at #4, the all_reduce #4 after it left out
    as read already), and the refused send passes no seq of its channel."""
    def begin(k: int, op: str, seq: int, **more) -> dict:
        return {"type": "op", "v": 3, "rank": 0, "ts": T0 + k * 1000, "phase": "begin", "id": k, "op": op,
                "group": "0", "seq": seq, "in_shapes": [[4]], "in_dtypes": ["float32"], "in_bytes": 16, **more}

    def end(k: int, **more) -> dict:
        return {"type": "op", "v": 3, "rank": 0, "ts": T0 + k * 1000 + 500, "phase": "end", "id": k, **more}

    refused = {"exc": "RuntimeError: invalid root rank", "unissued": True}
    lines = [{"type": "group", "v": 3, "rank": 0, "ts": T0, "group": "0", "granks": [0, 1, 2]}]
    for k in range(1, 4):
        lines += [begin(k, "all_reduce", k), end(k)]
    lines += [begin(4, "broadcast", 4, root=99), end(4, **refused)]
    lines += [begin(5, "send", 1, peer=1, dir="send"), end(5, **refused)]
    for k in range(6, 8):
        lines += [begin(k, "all_reduce", k - 2), end(k)]
    got = inflight.replay(b"", b"".join(orjson.dumps(e) + b"\n" for e in lines), 0)
    key = histories.key_hash(histories.match_key_of(lines[1]))
    assert got.histories["0"] == histories.extended(None, [1, 2, 3, 4, 5], [key] * 5)
    assert "seq" not in got.begins[4] and "seq" not in got.begins[5]
    assert got.failed == {4, 5}
    carry = [orjson.loads(x) for x in got.carry().splitlines()]
    assert [g.get("channels", []) for g in carry if g["type"] == "group"] == [[]]
    assert not [e for e in carry if e["type"] == "op" and e["phase"] == "begin" and e["id"] in (4, 5) and "seq" in e]


@pytest.mark.parametrize("split", [True, False])
def test_a_window_after_a_refused_op_whose_segment_ended_between_its_begin_and_end(tmp_path, capsys, split):
    """Rank 2's broadcast the backend refused, its begin written with seq 101 (drained before
    the refusal), the all_reduce #101 after it: with rank 2's segment ended right after that
    begin, the carry counted the broadcast in the group's history.  A window read from the
    next segment on takes its term back (``TraceModel._retract``), and so does the next
    carry (``inflight.replay``): every window gives what the whole read gives, one op_failed
    on rank 2, no collective_mismatch (one was reported at #101, and at every later carry's)."""
    from commscope.analysis.synth import TraceBuilder
    from commscope.events import encode

    root = tmp_path / "t"
    tb = TraceBuilder(3, hang_after=10.0, sample_interval=5.0)
    t = tb.t0 + S
    for _ in range(100):
        t = tb.collective(t) + S
    i = tb.begin(2, t, "broadcast", seq=101, root=99)
    drained = tb.events[-1]
    tb.end(2, i, t + 500, exc="RuntimeError: invalid root rank", unissued=True)
    refused_at = t
    t += S
    for _ in range(3700):
        t = tb.collective(t) + S
    tb.heartbeats(tb.t0 + S, t, interval=5 * S)
    end = max(e["ts"] for e in tb.events)
    for r in range(3):
        w = DirectoryWriter(root, "job", r, {"world_size": 3}, closer=False, segment_bytes=16 << 10)
        buf: list[bytes] = []
        for e in sorted((e for e in tb.events if e["rank"] == r), key=lambda e: e["ts"]):
            buf.append(encode(e))
            if e is drained and split:  # the segment ends right after the drained begin
                w.write(buf)
                buf = []
                w.segment_bytes = 1
                continue
            if len(buf) == 8:
                w.write(buf)
                buf = []
                w.segment_bytes = 16 << 10
        w.write(buf)
        w.close()
        retention.close_stream(w.dir, r, 0, retention.parse("none"))
    for p in (root / "job").iterdir():
        os.utime(p, ns=(end, end))
    right_after = f"{(end - refused_at) // S - 5}s"  # (a window from the segment after the begin)
    for since in ([], ["--since", "10m"], ["--since", right_after]):
        capsys.readouterr()
        assert cli(["check", str(root), "--json", *since]) == 1
        got = json.loads(capsys.readouterr().out)
        assert [(f["kind"], f["culprits"]) for f in got["findings"]] == [("op_failed", [2])], (since, got["findings"])


def test_a_carry_counts_every_collective_of_a_stream_that_reuses_op_ids():
    """A damaged or foreign stream whose op ids start again (1, 2, 3, 1, 2, 3): its six
    collectives are the group's history 1 to 6 (keyed by op id, the carry kept 4 to 6)."""
    lines = [{"type": "group", "v": 3, "rank": 0, "ts": T0, "group": "0", "granks": [0, 1]}]
    for k in range(1, 7):
        op_id = (k - 1) % 3 + 1
        lines += [{"type": "op", "v": 3, "rank": 0, "ts": T0 + k * 1000, "phase": "begin", "id": op_id,
                   "op": "all_reduce", "group": "0", "seq": k, "in_shapes": [[4]], "in_dtypes": ["float32"],
                   "in_bytes": 16},
                  {"type": "op", "v": 3, "rank": 0, "ts": T0 + k * 1000 + 500, "phase": "end", "id": op_id}]
    got = inflight.replay(b"", b"".join(orjson.dumps(e) + b"\n" for e in lines), 0)
    key = histories.key_hash(histories.match_key_of(lines[1]))
    assert got.histories["0"] == histories.extended(None, range(1, 7), [key] * 6)


def test_a_summary_says_which_carried_op_gave_its_number_back(tmp_path):
    """Rank 0's broadcast, its begin carried into a segment with seq 5 (drained before the
    backend refused it), ends there saying the number went back (``unissued``).  A reader
    that read the begin and jumps over that segment, deleted, is told so by the summary's
    completion, and the model drops the seq, as where it reads the end; before, it kept #5
    (the failed op shown as that collective).  A hostile list is refused like any field."""
    from commscope.analysis import TraceModel
    from commscope.events import decode_lines

    group = {"type": "group", "v": 3, "rank": 0, "ts": T0, "group": "0", "granks": [0, 1]}

    def op(op_id: int, ts: int, phase: str, **kw) -> dict:
        return {"type": "op", "v": 3, "rank": 0, "ts": T0 + ts, "phase": phase, "id": op_id, **kw}

    cast = {"op": "broadcast", "group": "0", "root": 99, "in_shapes": [[4]], "in_dtypes": ["float32"], "in_bytes": 16}
    refused = {"exc": "RuntimeError: invalid root rank", "unissued": True}
    # (the group's first failure, op 1, is carried for good; op 7's end in the next segment,
    # then more failures than a carry keeps: op 7 is carried no further, the summary counts it)
    first = [op(1, 100, "begin", seq=1, **cast), op(1, 200, "end", **refused)]
    begin = op(7, 1000, "begin", seq=1, **cast)
    end = op(7, 2000, "end", **refused)
    later = [e for k in range(inflight.FAILED_KEPT) for e in (op(8 + k, 3000 + k * 100, "begin", **cast),
                                                              op(8 + k, 3050 + k * 100, "end", **refused))]
    lines = b"".join(orjson.dumps(e) + b"\n" for e in (group, *first, begin))
    carry = inflight.replay(b"", lines, 0).carry()
    seg = tmp_path / "seg1"
    seg.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in (end, *later)))
    summary = retention.summarize(seg, 0, 1, carry)
    assert summary["unissued_ids"] == [7] and [c[0] for c in summary["carried"]] == [7]
    [read] = decode_lines(orjson.dumps(summary) + b"\n", 0).events
    [done] = retention.completions(read, 7)
    assert done["unissued"] is True and done["exc"] == retention.RAISED
    assert "unissued_ids" not in retention.counted(read, 7)
    m = TraceModel.from_events([group, begin, done])
    assert int(m.ranks[0].seq[0]) == -1 and 0 in m.ranks[0].exc
    assert int(TraceModel.from_events([group, begin, retention.completions(read, 7)[0] | {"unissued": False}]
                                      ).ranks[0].seq[0]) == 1  # (the model reads the word: without it, #1 stays)
    plain = {k: v for k, v in read.items() if k != "unissued_ids"}  # (a summary from before the list)
    assert "unissued" not in retention.completions(plain, 7)[0]
    for bad in (["7"], [-1], 7):
        hostile = decode_lines(orjson.dumps(summary | {"unissued_ids": bad}) + b"\n", 0)
        assert hostile.events == [] and sum(hostile.invalid.values()) == 1


@pytest.mark.parametrize("gone", ["first", "middle", "middle, windowed", "before the window", "a name past 10^8"])
def test_a_segment_gone_without_a_summary_is_a_stated_loss(tmp_path, capsys, gone):
    """A segment file gone from the store (not by retention, which summarizes first) lost its
    ops without a word: a rank's first segment (68 of its 2000 ops, native blocks: the ring
    is taken to start at the first block found), or a middle one of a JSON stream (no ring
    positions), and ``check`` said the trace looked healthy, exit 0.  Segment numbers go up by
    one, so a number neither on disk nor summarized is counted lost, once (a native stream's
    gap in its ring positions there is that segment's, not a second loss).  One before a
    window's first segment is not asked for; a name saying segment 10^8 costs nothing."""
    store = tmp_path / "t"
    write_store(str(store), JobShape(4, 2000, fault="healthy", segment_bytes=50000))
    job = store / "synthetic"
    segs = list_segments(job)[(1, 0)]
    end = _found(store, capsys)[2]["now_ns"]
    for p in job.iterdir():  # (the files written when the trace ends: the window counts back from then)
        os.utime(p, ns=(end, end))
    window = ("--since", "25s") if "window" in gone else ()  # (from segment 23 of 27 on)
    assert _found(store, capsys, *window)[:2] == (0, [])
    held = 0  # (the lines of the segment gone: its neighbours' metas say them)
    if gone == "first":
        held = segs[0].path.read_bytes().count(b"\n")
        segs[0].path.unlink()
    elif gone.startswith("middle"):
        held = segs[-3].path.read_bytes().count(b"\n")
        segs[-3].path.unlink()
    elif gone == "before the window":
        segs[2].path.unlink()
    else:
        last = segs[-1]
        last.path.rename(job / last.path.name.replace(f".s{last.number:06d}.", ".s100000000."))
    rc, found, out = _found(store, capsys, *window)
    if gone == "before the window":
        assert (rc, found, out["skipped"]["store_missing"]) == (0, [], 0)
        return
    assert (rc, found) == (1, [("trace_incomplete", [1])])
    assert out["skipped"]["store_missing"] == (100000000 - segs[-1].number if "10^8" in gone else held)
    said = [w for w in out["warnings"] if "segment(s) of its stream gone from the store" in w]
    assert len(said) == 1 and said[0].endswith("what they held is lost" if "10^8" in gone else
                                               f"{held} line(s) of them not read are lost"), said


@pytest.mark.parametrize("how", ["gone", "torn"])
def test_a_rank_whose_meta_line_was_lost_is_not_named_for_a_mismatch(tmp_path, capsys, how):
    """A rank's ``meta`` line (its op names table) lost, or torn: its blocks' ops decode as
    "?", and ``check`` named that healthy rank in a ``collective_mismatch`` at every one of
    its collectives ("rank 1: ?"), and where the line was gone said nothing else.  An op
    whose name is not known is compared with no rank's, and the trace says it could not
    name them (trace_incomplete, exit 1)."""
    store = tmp_path / "t"
    write_store(str(store), JobShape(4, 50, fault="healthy"))
    path = store / "synthetic" / "rank-00001.jsonl"
    data = path.read_bytes()
    path.write_bytes(data[data.index(b"\n") + 1:] if how == "gone" else data[:100] + b"\0" * 8 + data[108:])
    rc, found, out = _found(store, capsys)
    assert (rc, found) == (1, [("trace_incomplete", [1])])
    assert out["findings"][0]["evidence"]["per_rank"]["1"]["unnamed"] == 50
    assert "whose names their streams could not say" in out["findings"][0]["message"]


def test_a_history_tie_that_a_rank_not_compared_would_break_names_nobody(tmp_path, capsys):
    """Ranks 1 and 2 of group [1, 2, 3] agree and rank 3 differs (a shape) an hour before the
    window; rank 1's carries are not there, nor the segment before the window's first (so
    none can be made: ``inflight.made``), so only 2 and 3 are compared: a tie, and the
    window named both, an innocent with the culprit, where the full read names 3.  Rank 1's
    history would break the tie: the odd one out cannot be told, and nobody is named (the
    finding stays)."""
    from commscope.analysis.synth import TraceBuilder
    from commscope.store.segments import window_start

    tb = TraceBuilder(4, hang_after=10.0, sample_interval=5.0)
    tb.group("sub", [1, 2, 3])
    t = tb.t0 + S
    for r in (1, 2, 3):
        tb.sync(r, t, t + 1000, "all_reduce", group="sub", shape=(9,) if r == 3 else (8,))
    for r in (1, 2, 3):
        tb.sync(r, t + S, t + S + 1000, "all_reduce", group="sub")
    t += 2 * S
    for _ in range(36):
        t = _busy_then(tb, t)
    for r in range(4):
        tb.exit(r, t)
    store = _windowed(tmp_path / "s", tb.events)
    assert _found(store, capsys)[:2] == (1, [("collective_mismatch", [3])])
    for p in (store / "job").glob("rank-00001.open.*.jsonl"):
        p.unlink()
    segs = list_segments(store / "job")[(1, 0)]
    first = window_start(segs, max(e["ts"] for e in tb.events) / S - 600)
    assert first > 1
    segs[first - 1].path.unlink()
    rc, found, out = _found(store, capsys, "--since", "10m")
    # (what rank 1 was in where the window began is not known: said as an error too)
    assert (rc, found) == (1, [("collective_mismatch", []), ("trace_incomplete", [1])])
    assert out["findings"][0]["evidence"]["history"]["not_compared"] == [1]
    assert "cannot be told" in out["findings"][0]["message"]


def test_a_stream_with_a_segment_deleted_before_its_carry_is_bounded_still(tmp_path):
    """A segment deleted by hand before its closer carried it: the closer replays the one after
    it from none (a partial carry) and retention goes on bounding the stream.  Before, it
    stopped at the first segment with no carry for good, and the stream grew past its bound;
    a reader entering after the gap still says what the rank was in there is not known."""
    limit = retention.Retention(max_bytes=1 << 20, max_age_s=None)
    busy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # (no closer runs yet)
    try:
        w = DirectoryWriter(tmp_path, "job", 0, {"world_size": 1}, segment_bytes=64 << 10, retain=limit)
        w._retainer = busy
        w.write([meta()])
        k = 0
        while len(list_segments(tmp_path / "job")[(0, 0)]) < 3:
            w.write([beat(0, j) for j in range(k, k + 100)])
            k += 100
        job = tmp_path / "job"
        assert not list(job.glob("*.open.*"))  # (no carry written: its closer has not run)
        gone = list_segments(job)[(0, 0)][1].path
        held = gone.read_bytes().count(b"\n")
        gone.unlink()  # (by hand)
    finally:
        busy.kill()
        busy.wait()
    w._retainer = None
    for at in range(k, k + 20000, 100):
        w.write([beat(0, j) for j in range(at, at + 100)])
        if w._retainer is not None:  # (each closer done before the next write: none skipped)
            assert w._retainer.wait(60) == 0
    w.close()
    if w._retainer is not None:
        assert w._retainer.wait(60) == 0
    segs = list_segments(job)[(0, 0)]
    assert sum(os.path.getsize(s.path) for s in segs) <= limit.max_bytes + (64 << 10)
    assert segs[0].number > 2
    summaries = [orjson.loads(x) for x in (job / "rank-00000.summary.jsonl").read_bytes().splitlines()]
    assert [s["seg"] for s in summaries] == [0, *range(2, segs[0].number)]
    reader = open_source(str(tmp_path))
    reader.read_all()
    assert reader.stats.warnings == [
        f"rank 0: what it was in when segment {segs[0].number - 1} ended is not known (not carried, and a segment "
        "before it is gone): an op begun before may be missing",
        "rank 0: 1 segment(s) of its stream gone from the store (segment 1): neither on disk nor summarized by "
        f"retention; {held} line(s) of them not read are lost"]
    # (the lines it held, from the summaries of the segments around it: ``lines_before`` of the
    # one after it; before, it counted as one line, what it held not known)
    assert reader.stats.missing_by_rank == {0: held}
    assert reader.stats.summarized == sum(s["events"] for s in summaries)


def test_a_forwarder_s_next_segment_counts_the_lines_before_it_resumed(tmp_path):
    """A forwarder resuming a dead rank's stream and rotating says, in its next segment's meta,
    the lines the stream held before it too (``lines_before``): a segment of its gone by hand
    is counted as the lines it held.  Before, the meta counted only the forwarder's own lines,
    and a reader counted the gone segment's lines as not known."""
    _segmented(tmp_path, beats=60, segment=1024, step=6)  # (the rank's: two segments or more)
    job = tmp_path / "job"
    held = len(list_segments(job)[(0, 0)])
    f = DirectoryWriter(tmp_path, "job", 0, resume=True, segment_bytes=1024, closer=False)
    f.write([meta()])
    k = 60
    while len(list_segments(job)[(0, 0)]) < held + 2:
        f.write([beat(0, j) for j in range(k, k + 6)])
        k += 6
    f.close()
    segs = list_segments(job)[(0, 0)]
    gone = segs[held]  # (the first the forwarder started)
    lines = gone.path.read_bytes().count(b"\n")
    gone.path.unlink()
    reader = open_source(str(tmp_path))
    reader.read_all()
    assert reader.stats.warnings == [
        f"rank 0: 1 segment(s) of its stream gone from the store (segment {gone.number}): neither on disk nor "
        f"summarized by retention; {lines} line(s) of them not read are lost"]
    assert reader.stats.missing_by_rank == {0: lines}


def _skipped(store: str, capsys) -> tuple[int, dict]:
    """``check --json``'s exit code and what it says was skipped or lost."""
    rc = cli(["check", store, "--json"])
    return rc, json.loads(capsys.readouterr().out)["skipped"]


@pytest.mark.parametrize("cut", ["half", "all", "torn"])
def test_a_segment_cut_short_is_counted_exactly_before_and_after_retention(tmp_path, capsys, cut):
    """Rank 3's segment 4 cut in its middle, to nothing, or in its last line: a reader counts
    its torn last line damaged and the whole lines gone from its end lost, as the next
    segment's meta says them; and retention's summary says the same once it deleted the
    segment.  Before, the cut lines counted as one (or none), and once summarized the
    trace read healthy, exit 0 (helper-173)."""
    store = str(tmp_path / "trace")
    write_store(store, JobShape(4, 400, fault="healthy", days=7, segment_bytes=16 << 10))
    job = Path(store) / "synthetic"
    seg = next(s for s in list_segments(job)[(3, 0)] if s.number == 4)
    data = seg.path.read_bytes()
    keep = {"half": len(data) // 2, "all": 0, "torn": len(data) - 20}[cut]
    left = data[:keep]
    torn = int(bool(left) and not left.endswith(b"\n"))
    gone = data.count(b"\n") - left.count(b"\n") - torn  # whole lines cut off its end
    assert gone > 0 or cut == "torn"
    seg.path.write_bytes(left)
    before = _skipped(store, capsys)
    assert before[0] == 1 and (before[1]["damaged"], before[1]["store_missing"]) == (torn, gone), before
    assert retention.close_stream(job, 3, 0, retention.Retention(max_bytes=None, max_age_s=2 * 86400)) > 4
    after = _skipped(store, capsys)
    assert after[0] == 1 and (after[1]["damaged"], after[1]["store_missing"]) == (torn, gone), after
    assert after[1]["summarized"] > 0


def test_segments_deleted_by_hand_before_ones_retention_deleted_count_their_lines(tmp_path, capsys):
    """A cleaner deleted rank 3's segments 0-2; retention then summarized and deleted 3 and 4:
    the lines the first three held were counted from segment 3's meta, which went with it,
    and fell to one a segment (194 to 3, helper-173).  The summary keeps them (``lines_before``)."""
    store = str(tmp_path / "trace")
    write_store(store, JobShape(4, 400, fault="healthy", days=7, segment_bytes=16 << 10))
    job = Path(store) / "synthetic"
    segs = [s for s in list_segments(job)[(3, 0)] if s.number < 3]
    held = sum(s.path.read_bytes().count(b"\n") for s in segs)
    for s in segs:
        s.path.unlink()
    rc, before = _skipped(store, capsys)
    assert rc == 1 and before["store_missing"] == held
    assert retention.close_stream(job, 3, 0, retention.Retention(max_bytes=None, max_age_s=2 * 86400)) >= 2
    assert not any(s.number in (3, 4) for s in list_segments(job)[(3, 0)])
    rc, after = _skipped(store, capsys)
    assert rc == 1 and after["store_missing"] == held and after["summarized"] > 0


def _cut_in_half(path: Path) -> int:
    """Cut the segment at ``path`` in its middle (its last line torn): the whole lines it lost."""
    data = path.read_bytes()
    left = data[:len(data) // 2]
    path.write_bytes(left)
    return data.count(b"\n") - left.count(b"\n") - 1


def _rank3(job: Path, number: int):
    return next(s for s in list_segments(job)[(3, 0)] if s.number == number)


def test_a_cut_end_is_counted_after_segments_gone_and_by_a_reader_retention_passed(tmp_path, capsys):
    """(helper-174) A segment cut short after one gone: its cut was folded into the count of the
    gone one (65 where 97 were lost).  A live reader that read a cut segment to its end and
    stopped there, then retention deleted it and the next: its summary's cut was counted
    nowhere (33 lost, 0 said).  A sample line (no ring position) cut off the end of one
    segment: its excuse hid a block line gone from the newest segment later."""
    from commscope.store.directory import DirectoryReader

    store = str(tmp_path / "trace")
    write_store(store, JobShape(4, 400, fault="healthy", days=7, segment_bytes=16 << 10))
    job = Path(store) / "synthetic"
    base = tmp_path / "base"
    shutil.copytree(store, base)
    # gone, then cut: both counted
    held = _rank3(job, 2).path.read_bytes().count(b"\n")
    _rank3(job, 2).path.unlink()
    cut = _cut_in_half(_rank3(job, 3).path)
    rc, skipped = _skipped(store, capsys)
    assert rc == 1 and (skipped["damaged"], skipped["store_missing"]) == (1, held + cut), skipped
    # a reader at the end of a cut segment when retention deletes it
    shutil.rmtree(store)
    shutil.copytree(base, store)
    cut = _cut_in_half(_rank3(job, 4).path)
    r = DirectoryReader(job)
    left = size_of(_rank3(job, 4).path)
    while not (r._reading.get((3, 0)) == 4 and r._read_of.get(((3, 0), 4)) == left):
        assert r.poll(max_bytes=1) or r._reading.get((3, 0), 0) <= 4
    assert retention.close_stream(job, 3, 0, retention.Retention(max_bytes=None, max_age_s=2 * 86400)) == 5  # (0-4)
    r._listed = None  # (the next poll lists the directory again)
    r.poll()
    r.read_all()
    assert r.stats.missing_by_rank == {3: cut} and r.stats.corrupt_by_rank == {3: 1}, r.stats.warnings
    # a sample line cut off segment 4's end, a block line gone from the newest: two lines
    shutil.rmtree(store)
    shutil.copytree(base, store)
    _rank3(job, 8).path.unlink()
    newest = _rank3(job, 7).path.read_bytes().splitlines(keepends=True)
    i = next(i for i in range(len(newest) // 2, len(newest) - 1) if newest[i].startswith(b'{"type":"block"'))
    _rank3(job, 7).path.write_bytes(b"".join(newest[:i] + newest[i + 1:]))
    lines = _rank3(job, 4).path.read_bytes().splitlines(keepends=True)
    assert not lines[-1].startswith(b'{"type":"block"')
    _rank3(job, 4).path.write_bytes(b"".join(lines[:-1]))
    # (and segment 8, deleted here: the carry of segment 7 says it began; what it held is not
    # known, a line: helper-187)
    assert _skipped(store, capsys)[1]["store_missing"] == 3


def test_a_segment_cut_to_nothing_after_one_an_earlier_retention_deleted_is_counted(tmp_path, capsys):
    """The summary of a segment cut to nothing took the lines before it from the segment
    summarized before it in the same run only: summarized by a later run, it said nothing,
    and check said the trace looked healthy, exit 0 (helper-174).  The summary file's last
    line says them."""
    store = str(tmp_path / "trace")
    write_store(store, JobShape(4, 400, fault="healthy", days=7, segment_bytes=16 << 10))
    job = Path(store) / "synthetic"
    segs = list_segments(job)[(3, 0)]
    assert retention.enforce(job, 3, 0, retention.Retention(max_bytes=sum(size_of(s.path) for s in segs[4:]),
                                                             max_age_s=None), segs) == 4
    empty = _rank3(job, 4)
    held = empty.path.read_bytes().count(b"\n")
    empty.path.write_bytes(b"")
    rc, before = _skipped(store, capsys)
    assert rc == 1 and before["store_missing"] >= 1  # (entered at the empty oldest segment: at least said)
    assert retention.close_stream(job, 3, 0, retention.Retention(max_bytes=None, max_age_s=2 * 86400)) >= 1
    rc, after = _skipped(store, capsys)
    assert rc == 1 and after["store_missing"] == held, after


def test_a_torn_cut_does_not_hide_a_block_line_gone_from_the_next_segment(tmp_path, capsys):
    """Segment 6 cut in its middle (its last line torn), a block line gone from the newest:
    the torn line's excuse, meant for the gap the cut leaves (the ring is opened there now),
    hid the next one (33 where 34 were lost, helper-175)."""
    store = str(tmp_path / "trace")
    write_store(store, JobShape(4, 400, fault="healthy", days=7, segment_bytes=16 << 10))
    job = Path(store) / "synthetic"
    _rank3(job, 8).path.unlink()
    cut = _cut_in_half(_rank3(job, 6).path)
    lines = _rank3(job, 7).path.read_bytes().splitlines(keepends=True)
    blocks = [i for i in range(1, len(lines) - 1) if lines[i].startswith(b'{"type":"block"')]
    i = blocks[len(blocks) // 2]
    _rank3(job, 7).path.write_bytes(b"".join(lines[:i] + lines[i + 1:]))
    rc, skipped = _skipped(store, capsys)
    # (cut + the block line + segment 8, deleted here: segment 7's carry says it began, helper-187)
    assert rc == 1 and (skipped["damaged"], skipped["store_missing"]) == (1, cut + 2), skipped
