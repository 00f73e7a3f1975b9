"""trace_incomplete: every way a trace loses events is a finding with true counts, never
'healthy' (an error, so check exits 1, when events were lost; a warning when a stream only
ends without an exit); and the reader's validation counts what it skipped, by reason, in every command."""

from __future__ import annotations

import json
from pathlib import Path

from commscope.analysis import TraceModel, diagnose
from commscope.analysis.synth import S, TraceBuilder
from commscope.cli import main as cli
from commscope.commands.check import check_store
from commscope.events import encode
from commscope.store import ReadStats, open_reader, open_writer

MS = 1_000_000


def finished(world: int = 3, *, exits: tuple[int, ...] | None = None) -> TraceBuilder:
    b = TraceBuilder(world)
    t = b.t0 + S // 10
    for _ in range(5):
        t = b.collective(t, "all_reduce") + MS
    b.heartbeats(t, t)
    for r in range(world) if exits is None else exits:
        b.exit(r, t + MS)
    return b


def incomplete(b: TraceBuilder, model: TraceModel | None = None):
    m = model or TraceModel.from_events(b.sorted_events())
    found = [f for f in diagnose(m) if f.kind == "trace_incomplete"]
    assert len(found) <= 1
    return found[0] if found else None


def test_a_complete_trace_has_no_such_finding():
    assert incomplete(finished()) is None


def test_drops_are_counted_with_their_cause_and_ring_overwrites_are_not():
    """A lost event is counted and shown with its cause: the count alone said none (helper-197)."""
    b = finished()
    t = b.t0 + S
    b.add(1, t, "dropped", count=40, total=40, reason="queue full (backpressure)")
    b.add(1, t + 1, "dropped", count=2, total=42, reason="cannot append: Redis said: OOM")
    b.add(1, t + 2, "dropped", count=0, total=42, reason="a report that counted nothing new")
    b.add(2, t, "dropped", count=3, total=3, reason="queue full (backpressure)")
    for r in range(3):
        b.add(r, t, "dropped", count=13_000, total=13_000,
              reason="Flight Recorder ring overwritten between polls (C++-issued collectives missing)")
    f = incomplete(b)
    assert f is not None and f.severity == "error" and f.culprits == [1, 2]
    assert f.evidence["lost_events"] == 45 and f.evidence["per_rank"] == {
        "1": {"dropped": 42, "dropped_why": "cannot append: Redis said: OOM"},
        "2": {"dropped": 3, "dropped_why": "queue full (backpressure)"}}
    assert f.evidence["fr_ring_overwritten"] == {"0": 13_000, "1": 13_000, "2": 13_000}
    assert "45 event(s) dropped by the recorder (rank 1: 42, rank 2: 3), why: rank(s) 1: cannot append: Redis " \
        "said: OOM; rank(s) 2: queue full (backpressure)" in f.message


def test_a_stream_whose_every_write_a_full_redis_refused_is_said_lost_once_read_to_its_end():
    """A rank whose stream is listed but none of its writes landed (its first one refused by
    a full Redis): read to its end, the rank lost what never came (``lost_unknown``
    ``full``); live, its writer may yet write.  Before, a finding with no words said
    ("the trace is incomplete: "), a warning, exit 0 (helper-205)."""
    from commscope.analysis.diagnose import trace_now

    b = finished(world=3, exits=(0, 1, 2))
    m = TraceModel.from_events(b.sorted_events())
    m.note_read_stats(ReadStats(refused_by_rank={5: 1}))
    assert [f for f in diagnose(m) if f.kind == "trace_incomplete"] == []  # (live: not known yet)
    (f,) = [f for f in diagnose(m, trace_now(m), wall_ns=trace_now(m) + 60 * S) if f.kind == "trace_incomplete"]
    assert f.severity == "error" and f.culprits == [5] and f.evidence["per_rank"] == {"5": {"lost_unknown": "full"}}
    assert "the store refused writes for lack of memory (a Redis at its maxmemory) and rank(s) 5 went silent" \
        in f.message


def test_only_ring_overwrites_is_a_healthy_trace():
    b = finished()
    b.add(0, b.t0 + S, "dropped", count=5, total=5, reason="Flight Recorder ring overwritten between polls")
    assert incomplete(b) is None


def test_a_stream_that_ends_without_exit_while_others_exited():
    b = finished(exits=(0, 2))
    f = incomplete(b)
    assert f is not None and f.culprits == [1] and f.evidence["per_rank"]["1"]["no_exit"] is True
    assert "rank(s) 1 ends without an exit event" in f.message


def test_no_exit_anywhere_is_a_live_or_killed_job_not_a_loss():
    assert incomplete(finished(exits=())) is None


def test_a_dead_rank_is_left_to_dead_rank():
    b = TraceBuilder(2, sample_interval=0.2)
    t = b.t0 + S // 10
    t = b.collective(t, "all_reduce") + MS
    b.heartbeats(t, t, ranks=[1])
    b.heartbeats(t, t + 10 * S, ranks=[0])
    b.exit(0, t + 10 * S)
    m = TraceModel.from_events(b.sorted_events())
    kinds = sorted(f.kind for f in diagnose(m))
    assert "dead_rank" in kinds and "trace_incomplete" not in kinds


def write_store(root: Path, events: list[dict], extra: dict[int, list[bytes]] | None = None) -> Path:
    by: dict[int, list[bytes]] = {}
    for e in events:
        by.setdefault(e["rank"], []).append(encode(e))
    for r, lines in (extra or {}).items():
        by.setdefault(r, []).extend(lines)
    for r, lines in sorted(by.items()):
        w = open_writer(str(root), "job", r, job_meta={"world_size": len(by)})
        w.write(lines)
        w.close()
    return root


BAD = [b'{"type":"dropped","rank":2,"ts":1700000001000000000,"count":null}',
       b'{"type":"sample","rank":2,"ts":1700000001000000000,"rss":"x"}',
       b'{"type":"op","rank":2,"ts":1700000001000000000,"phase":"begin","id":900,"op":[1]}',
       b'{"type":"op","rank":2,"ts":1700000001000000000,"phase":"begin","id":901,"op":"x","seq":500000000}',
       b'{"type":"heartbeat","rank":1000000000,"ts":1700000001000000000}',
       b'{"type":"heartbeat","rank":5,"ts":1700000001000000000}',
       b'{"type":"exit","rank":2,"ts":1700000001000000000,"unwaited":["a"]}',
       b'{"type":"op","rank":2,"ts":17',
       b'[1, 2]']


def test_invalid_and_damaged_lines_are_counted_by_reason_in_every_command(tmp_path, capsys):
    store = write_store(tmp_path / "s", finished().sorted_events(), {2: BAD})
    reader = open_reader(store)
    reader.read_all()
    assert reader.stats.corrupt == 1 and reader.stats.invalid == 7
    assert reader.stats.invalid_by_reason == {
        "dropped: bad count": 1, "sample: bad rss": 1, "op begin: bad op": 1,
        "heartbeat: bad rank": 1, "heartbeat: rank differs from its stream": 1, "exit: bad unwaited": 1, "event: not an object": 1}
    # the seq of 500000000 is valid: it must cost one index row, not 500 million
    capsys.readouterr()
    assert cli(["check", str(store), "--json"]) == 1  # never 0 over events it could not read
    out = json.loads(capsys.readouterr().out)
    assert out["skipped"]["damaged"] == 1 and out["skipped"]["invalid"] == 7
    f = [x for x in out["findings"] if x["kind"] == "trace_incomplete"]
    assert len(f) == 1 and f[0]["culprits"] == [2]
    assert f[0]["evidence"]["per_rank"]["2"] == {"damaged": 1, "invalid": 7}
    assert any("skipped 7 invalid event(s)" in w for w in out["warnings"])
    assert cli(["check", str(store)]) == 1
    text = capsys.readouterr().out
    assert "trace_incomplete" in text and "no findings" not in text
    assert cli(["report", str(store), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["skipped"]["invalid"] == 7
    assert cli(["export", str(store), "--chrome", str(tmp_path / "t.json")]) == 0
    data = json.loads((tmp_path / "t.json").read_text())
    assert data["metadata"]["skipped"]["invalid"] == 7
    assert any(e.get("name") == "error: trace_incomplete" for e in data["traceEvents"])


def test_a_rank_whose_stream_is_not_in_the_store_though_its_peers_completed_collectives_with_it(tmp_path, capsys):
    """Rank 1's stream removed, or empty (a directory store its host does not share, a file
    deleted): "no events from rank 1" was a warning, and check said "the trace looks
    healthy", exit 0 (helper-62), though ranks 0 and 2 completed five all_reduces that
    needed it.  A trace read to its end says so as trace_incomplete; a live job's reader
    may not have listed a stream yet (no such finding), and a world larger than the ranks
    that wrote, which no collective proves ran, stays a warning."""
    from commscope.commands.report import pinned
    from commscope.tui.feed import REPLAY, Feed

    b = finished()
    for r in (0, 2):
        b.add(r, b.t0 + S // 20, "group", group="0", granks=[0, 1, 2])
    events = b.sorted_events()
    for how in ("removed", "empty"):
        store = write_store(tmp_path / how, events)
        stream = next((tmp_path / how / "job").glob("rank-00001*.jsonl"))
        if how == "removed":
            stream.unlink()
        else:
            stream.write_bytes(b"")
        capsys.readouterr()
        assert cli(["check", str(store), "--json"]) == 1
        out = json.loads(capsys.readouterr().out)
        assert [(f["kind"], f["culprits"], f["severity"]) for f in out["findings"]] == [
            ("trace_incomplete", [1], "error")]
        assert out["findings"][0]["evidence"]["per_rank"] == {"1": {"no_events": True}}
        assert check_store(str(store), json=True) == 1  # (the headless demo's and snapshot's check: the same)
        assert json.loads(capsys.readouterr().out)["findings"] == out["findings"]
        # replay said "no problems found" (judged without the wall clock: helper-165), and
        # report did not list rank 1 first as the findings' culprit
        feed = Feed(open_reader(store), mode=REPLAY)
        feed.load_all()
        assert [f.to_json() for f in feed.findings] == out["findings"]
        model = TraceModel.from_events([e for e in events if e["rank"] != 1])
        assert pinned(model).ranks == ["1"]
        # (as many culprits as ranks read, but not every rank of the job: still singled out, helper-167)
        alone = TraceModel.from_events([e for e in events if e["rank"] == 0])
        assert set(pinned(alone).ranks) == {"1", "2"}
    live = TraceModel.from_events([e for e in events if e["rank"] != 1])
    assert incomplete(b, live) is None  # (judged live: no wall clock)
    assert [f.kind for f in diagnose(live, wall_ns=live.end_ns)] == ["trace_incomplete"]
    unproven = TraceModel.from_events([e for e in events if e["rank"] != 1 and e["type"] != "group"]
                                      + [{**events[0], "type": "meta", "world_size": 4, "host": "h"}])
    assert not [f for f in diagnose(unproven, wall_ns=unproven.end_ns) if f.kind == "trace_incomplete"]


def test_a_rank_with_nothing_but_lost_lines_keeps_them_and_traces_read_from_outside_prove_no_rank(tmp_path, capsys):
    """(helper-65) Rank 1's stream holds only damaged and invalid lines: its losses stay
    counted beside "no events" (they were replaced).  Flight Recorder dumps a user had of
    some ranks, and a snapshot of one host's ranks, list groups of the whole world: the
    ranks not there are not proven lost (a warning, as documented: docs/snapshot.md)."""
    from commscope.analysis.flight_import import dumps_to_events
    from commscope.analysis.rankstate import MAX_UNSEEN

    b = finished()
    for r in (0, 2):
        b.add(r, b.t0 + S // 20, "group", group="0", granks=[0, 1, 2])
    store = write_store(tmp_path / "s", [e for e in b.sorted_events() if e["rank"] != 1],
                        {1: [b"{garbage", b'{"type":"op","rank":1,"ts":1,"phase":"begin","id":"x"}'] * 5})
    capsys.readouterr()
    assert cli(["check", str(store), "--json"]) == 1
    (f,) = json.loads(capsys.readouterr().out)["findings"]
    assert (f["evidence"]["lost_events"], f["evidence"]["per_rank"]) == (
        10, {"1": {"damaged": 5, "invalid": 5, "no_events": True}})

    def entry(rid: int, seq: int) -> dict:
        return {"record_id": rid, "pg_id": 0, "process_group": ("0", "default_pg"), "collective_seq_id": seq,
                "p2p_seq_id": 0, "op_id": rid, "profiling_name": "nccl:all_reduce",
                "time_created_ns": 10**18 + rid * 10**6, "input_sizes": [[4]], "input_dtypes": ["Float"],
                "output_sizes": [[4]], "output_dtypes": ["Float"], "state": "completed",
                "time_discovered_started_ns": None, "time_discovered_completed_ns": 10**18 + rid * 10**6 + 500,
                "retired": True, "is_p2p": False, "frames": [{"name": "step", "filename": "train.py", "line": 7}]}

    cfg = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"}}
    dumps = {r: {"version": "2.10", "pg_config": cfg, "entries": [entry(0, 1)]} for r in (0, 1, 3)}
    model = TraceModel.from_events(dumps_to_events(dumps, {r: 10**18 + 60 * S for r in dumps}))
    assert [x.kind for x in diagnose(model, wall_ns=model.end_ns)] == []
    snap = finished(world=2)
    for r in (0, 1):
        snap.add(r, snap.t0 + S // 20, "group", group="0", granks=[0, 1, 2, 3])
    model = TraceModel.from_events([{**e, "world_size": 4, "recorder": "snapshot"} if e["type"] == "meta" else e
                                    for e in snap.sorted_events()])
    assert model.world_size == 4  # (the snapshot's own word for the hosts not seen yet, a warning)
    assert [(x.kind, x.severity, x.culprits) for x in diagnose(model, wall_ns=model.end_ns)] == [
        ("trace_incomplete", "warning", [2, 3])]
    hostile = TraceBuilder(2)  # (a group of two million members, one collective of it completed)
    hostile.group("0", list(range(2_000_000)))
    hostile.collective(hostile.t0 + S, ranks=[0, 1])
    model = TraceModel.from_events([{**e, "world_size": (1 << 24) - 1} if e["type"] == "meta" else e
                                    for e in hostile.sorted_events()])
    (f,) = diagnose(model, wall_ns=model.end_ns)
    assert f.kind == "trace_incomplete" and len(f.culprits) == MAX_UNSEEN and f.culprits[0] == 2


def test_a_huge_world_size_renders_briefly(tmp_path, capsys):
    b = finished()
    b.add(0, b.t0 + S, "meta", world_size=10_000_000, host="h")
    store = write_store(tmp_path / "s", b.sorted_events())
    capsys.readouterr()
    assert cli(["check", str(store)]) == 0
    out = capsys.readouterr().out
    assert len(out) < 5000 and "no events from rank(s) 3-9999999 of world size 10000000" in out


def test_console_feed_counts_invalid_events(tmp_path):
    from commscope.tui.feed import REPLAY, Feed

    store = write_store(tmp_path / "s", finished().sorted_events(), {2: BAD})
    feed = Feed(open_reader(store), mode=REPLAY)
    info = feed.load_all()
    assert info.invalid == 7 and info.corrupt == 1
    assert [f.kind for f in feed.findings] == ["trace_incomplete"]


def test_a_job_nobody_writes_any_more_without_any_exit_is_incomplete():
    """Every rank heartbeated, stopped between ops and never exited: judged at a wall clock
    past the dead threshold the job is gone (killed as a whole, or its store lost the tail);
    judged at the trace's own end it may still be running, and is healthy."""
    b = finished(3, exits=())
    m = TraceModel.from_events(b.sorted_events())
    assert not [f for f in diagnose(m) if f.kind == "trace_incomplete"]  # no wall clock: live
    assert not [f for f in diagnose(m, wall_ns=m.end_ns + S) if f.kind == "trace_incomplete"]
    (f,) = [f for f in diagnose(m, wall_ns=m.end_ns + 60 * S) if f.kind == "trace_incomplete"]
    assert f.culprits == [0, 1, 2] and "no rank wrote an exit event" in f.message
    assert all(v["no_exit"] for v in f.evidence["per_rank"].values())


def test_a_job_stopped_inside_an_op_is_judged_as_a_hang_not_as_lost_events():
    b = finished(3, exits=())
    t = b.sorted_events()[-1]["ts"] + S
    b.sync(0, t, None, "all_reduce")  # rank 0 waits, ranks 1 and 2 never come
    b.heartbeats(t, t + S)
    m = TraceModel.from_events(b.sorted_events())
    found = diagnose(m, hang_after=0.5, wall_ns=m.end_ns + 60 * S)
    assert [f.kind for f in found] == ["missing_ranks"] and found[0].culprits == [1, 2]
    found = diagnose(m, hang_after=60.0, wall_ns=m.end_ns + 60 * S)
    assert not found  # still waiting when it stopped, not yet a hang: nothing lost either


def test_a_rank_whose_stream_stopped_while_its_peers_went_on_is_not_dead_and_asked_once(monkeypatch):
    """A rank whose stream stopped (a full disk, a store gone) while its peers completed the
    next collective took part in it: it was alive, and is no dead rank
    (``liveness.outlived``).  Every silent rank of a wide job asks that of the same
    collective; it is worked out once (asked rank by rank, each walked every member: ~30 s a
    diagnosis of 16k silent ranks)."""
    world = 16
    b = TraceBuilder(world, sample_interval=0.2)
    t = b.t0 + S // 10
    for k in range(4):
        t = b.collective(t, "all_reduce", ranks=None if k < 3 else [r for r in range(world) if r != 5]) + MS
    others = [r for r in range(world) if r != 5]
    b.heartbeats(b.t0, t + 5 * S, ranks=others)
    b.heartbeats(b.t0, b.t0 + S // 10, ranks=[5])
    for r in others:
        b.exit(r, t + 5 * S)
    m = TraceModel.from_events(b.sorted_events())
    calls: list[tuple] = []
    real = TraceModel.collective
    monkeypatch.setattr(TraceModel, "collective", lambda self, *a: calls.append(a) or real(self, *a))
    kinds = {f.kind: f.culprits for f in diagnose(m, t + 5 * S, 2.0)}
    assert "dead_rank" not in kinds and kinds.get("trace_incomplete") == [5], kinds
    silent = TraceModel.from_events([e for e in b.sorted_events() if e["type"] != "exit"])
    calls.clear()
    diagnose(silent, t + 60 * S, 2.0)  # every rank silent: the job stopped as a whole
    assert calls and len(calls) == len(set(calls)), calls


def test_a_loss_is_never_folded_into_a_hang_as_its_consequence():
    """Rank 0 waits in an all_reduce that rank 1 never enters, and the store lost events of both
    (Redis restarted empty: a store_lost marker on each): the hang names rank 1, and the loss
    stays a trace_incomplete of its own. Before, rank 0's loss led through its wait to rank 1,
    so the loss was folded into the hang ("... Then: trace_incomplete an op", helper h203)."""
    b = finished(2, exits=())
    t = b.sorted_events()[-1]["ts"] + S
    b.sync(0, t + MS, None, "all_reduce")
    b.heartbeats(t, t + 5 * S)
    m = TraceModel.from_events(b.sorted_events())
    stats = ReadStats()
    for r in (0, 1):  # (what the reader counts of each rank's store_lost marker)
        stats.count_missing(r, 50)
    m.note_read_stats(stats)
    found = diagnose(m, hang_after=1.0)
    assert [(f.kind, f.culprits) for f in found] == [("missing_ranks", [1]), ("trace_incomplete", [0, 1])]
    assert "trace_incomplete" not in found[0].message and not found[0].evidence.get("consequences")


def test_a_rank_silent_through_its_masters_failover_while_its_peers_go_on_is_unsettled_not_gone():
    """Rank 0's master failed over since its writer last wrote, and its stream went silent
    there, while rank 1 completed collectives rank 0 took part in: rank 0 is alive (its writer
    will say what the replica lacked when it writes again), not gone with a loss for good
    (``lost_unknown``), as a live check read it (helper-172).  Its silence alone names it
    dead nowhere."""
    b = TraceBuilder(2, hang_after=1.0)
    t = b.warmup(3)
    b.heartbeats(b.t0, t)
    for k in range(5):  # (collectives of both ranks: rank 0's records of them on its master, not read yet)
        b.sync(1, t + k * 10 * MS, t + k * 10 * MS + MS, "all_reduce")
    b.heartbeats(t, t + 10 * S, ranks=[1])
    m = TraceModel.from_events(b.sorted_events())
    stats = ReadStats()
    stats.unsettled_by_rank[0] = 1
    m.note_read_stats(stats)
    found = diagnose(m, t + 10 * S, 1.0)
    assert [(f.kind, f.culprits) for f in found] == [("trace_incomplete", [0])], [f.message for f in found]
    assert found[0].evidence.to_json()["per_rank"] == {"0": {"unsettled": 1}}
