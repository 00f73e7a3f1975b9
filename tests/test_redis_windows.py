"""A window (``--since``) of a Redis store: marks beside each stream, carries that make it exact.

A week of a job written through the real Redis writer to a real redis-server; a window
reads a fraction of it yet finds exactly what a full read finds (a rank dead for an hour
and ranks waiting in an op begun before the window included); a mark is taken by a real
child process; a trimmed chain says what it may miss; a live follower reads each event
once; a cluster routes the marks with their streams.
"""

from __future__ import annotations

import time

import orjson
import pytest
from redis_fixture import *  # noqa: F403

from commscope.analysis.diagnose import default_hang_after, diagnose, trace_now
from commscope.analysis.source import load_trace, open_source
from commscope.bench.synthstore import JobShape, write_store
from commscope.cli import main as cli
from commscope.store import children, redis_marks
from commscope.store.cluster import Nodes, keyslot
from commscope.store.redis_store import Keys, RedisWriter, delete_job
from commscope.store.redis_url import parse_url
from commscope.window import Since

S = 1_000_000_000
T0 = 1_780_000_000 * S


def meta(rank: int = 0) -> bytes:
    return orjson.dumps({"type": "meta", "ts": T0, "v": 3, "rank": rank, "world_size": 1, "host": "h",
                         "sample_interval": 1.0})


def beat(k: int, rank: int = 0) -> bytes:
    return orjson.dumps({"type": "heartbeat", "ts": T0 + k * S, "v": 3, "rank": rank, "inflight": 0})


def begin(op: int, k: int, rank: int = 0) -> bytes:
    return orjson.dumps({"type": "op", "phase": "begin", "ts": T0 + k * S, "v": 3, "rank": rank, "id": op,
                         "op": "all_reduce", "group": "0", "gsize": 1, "seq": op, "tid": 1})


def end(op: int, k: int, rank: int = 0) -> bytes:
    return orjson.dumps({"type": "op", "phase": "end", "ts": T0 + k * S, "v": 3, "rank": rank, "id": op})


def findings(model) -> list[dict]:
    return [f.to_json() for f in diagnose(model, trace_now(model), default_hang_after(model))]


@pytest.mark.parametrize("fault", ["dead", "missing", "mismatch"])
def test_a_window_finds_what_a_full_read_finds(redis_url, fault):
    """A week of a job, marked every hour of its time; the fault an hour before the end;
    --since 30m reads a sixth of it and says the same, evidence and all."""
    shape = JobShape(8, 6000, fault=fault, days=7, tail_s=3600, hang_after=10.0, mark_every_s=3600)
    write_store(redis_url, shape)
    full, fr, _ = load_trace(redis_url)
    part, pr, warnings = load_trace(redis_url, since=Since(ago_s=1800))
    assert pr.stats.bytes < fr.stats.bytes / 5 and pr.stats.skipped_bytes > 0
    assert pr.stats.bytes + pr.stats.skipped_bytes == fr.stats.bytes  # (the marks count what they skip)
    assert any("not read" in w for w in warnings)
    assert not pr.stats.missing_by_rank and not fr.stats.missing_by_rank
    assert findings(part) == findings(full)
    assert [(f["kind"], f["culprits"]) for f in findings(part) if f["severity"] == "error"] == [
        ({"dead": "dead_rank", "missing": "missing_ranks", "mismatch": "collective_mismatch"}[fault],
         [shape.culprit_rank])]


def test_an_op_begun_before_the_window_is_read_from_the_mark(redis_url):
    """A rank that has waited in an all_reduce for an hour: the window holds only its
    heartbeats; the mark's carry still says what it waits in."""
    w = RedisWriter(redis_url, "job", 0, {"world_size": 1}, marks="inline", mark_every_s=600)
    w.write([meta(), begin(0, 0), end(0, 1), begin(1, 2)])
    for k in range(3, 3600, 60):
        w.write([beat(k)])
    w.close()
    reader = open_source(redis_url, since=Since(ago_s=300))
    got = reader.read_all()
    ops = [(e["id"], e["phase"]) for e in got if e["type"] == "op"]
    assert (1, "begin") in ops and (0, "end") in ops  # in flight, and the last op done
    assert [e["type"] for e in got][:1] == ["meta"]
    beats = [e["ts"] for e in got if e["type"] == "heartbeat"]
    assert beats and min(beats) >= T0 + (3600 - 300 - 600) * S and reader.stats.skipped_bytes > 0


def test_a_window_counted_once_reads_the_same_after_the_job_wrote_more(redis_url):
    """``window_start_ns``: where a reader's ``--since 300s`` started, counted back from the
    job's end when it was asked; a reader opened later from there (a lost read process's
    stand-in) starts at the same mark, though 300 s back from the job's new end would skip it."""
    w = RedisWriter(redis_url, "job", 0, {"world_size": 1}, marks="inline", mark_every_s=100)
    w.write([meta()])
    for k in range(0, 1000, 10):
        w.write([beat(j) for j in range(k, k + 10)])
    first = open_source(redis_url, since=Since(ago_s=300))
    start = first.window_start_ns()
    assert start == T0 + (999 - 300) * S  # (the job's newest write: beat 999)
    before = [e["ts"] for e in first.read_all() if e["type"] == "heartbeat"]
    for k in range(1000, 2000, 10):
        w.write([beat(j) for j in range(k, k + 10)])
    w.close()
    again = open_source(redis_url, since=Since(at_ns=start))
    assert again.window_start_ns() == start
    after = [e["ts"] for e in again.read_all() if e["type"] == "heartbeat"]
    assert min(after) == min(before) and len(after) == len(before) + 1000
    later = [e["ts"] for e in open_source(redis_url, since=Since(ago_s=300)).read_all() if e["type"] == "heartbeat"]
    assert min(later) > min(before)


def test_a_follower_from_a_mark_reads_every_later_event_once(redis_url):
    w = RedisWriter(redis_url, "job", 0, {"world_size": 1}, marks="inline", mark_every_s=100)
    w.write([meta()])
    for k in range(0, 1000, 10):
        w.write([beat(j) for j in range(k, k + 10)])
    reader = open_source(redis_url, since=Since(ago_s=50))
    first = [e["ts"] // S - T0 // S for e in reader.poll() if e["type"] == "heartbeat"]
    w.write([beat(j) for j in range(1000, 1020)])
    second = [e["ts"] // S - T0 // S for e in reader.poll() if e["type"] == "heartbeat"]
    w.close()
    seen = first + second
    assert len(seen) == len(set(seen)) and seen == sorted(seen)
    assert seen[-1] == 1019 and seen[0] <= 1000 - 50 and seen[0] > 700


def test_a_child_process_takes_the_mark(redis_url, redis_server):
    """The real path: the writer spawns a child (never marking in the rank), which reads the
    URL from its standard input; the carry holds the rank's meta, its history of the group's
    collectives (the one in flight: seq 7) and its op in flight."""
    w = RedisWriter(redis_url, "job", 3, {"world_size": 4}, mark_every_s=60)
    assert w.marks == "child"
    w.write([meta(3), begin(7, 1, 3)])
    w.write([beat(k, 3) for k in range(2, 120, 10)])  # (120 s of the rank's time: a mark is due)
    child = w._marker
    assert child is not None and all(redis_url not in str(a) for a in child.args)
    assert child.wait(timeout=120) == 0
    w.close()
    nodes = Nodes(parse_url(redis_url), "test")
    nodes.connect()
    try:
        mark = redis_marks.newest(nodes, Keys.marks("job", 3))
    finally:
        nodes.close()
    assert mark is not None and mark.exact and mark.entry == 2 + 12
    carried = [orjson.loads(x) for x in mark.carry.splitlines()]
    assert [(e["type"], e.get("phase"), e.get("id")) for e in carried] == [
        ("meta", None, None), ("group", None, None), ("op", "begin", 7)]
    assert {k: carried[1][k] for k in ("group", "dfrom", "dseq")} == {"group": "0", "dfrom": 7, "dseq": 7}
    assert mark.ms == (T0 + 112 * S) // 1_000_000


def test_a_chain_broken_by_maxlen_says_what_it_may_miss(redis_url):
    url = redis_url + "?maxlen=20"
    w = RedisWriter(url, "job", 0, {"world_size": 1}, marks="off")
    w.write([meta(), begin(0, 0)])
    for k in range(1, 400, 10):
        w.write([beat(j) for j in range(k, k + 10)])
    mark = redis_marks.mark(url, "job", 0)
    assert mark is not None and not mark.exact
    w.write([beat(j) for j in range(400, 410)])  # (the window starts after the mark)
    w.close()
    reader = open_source(url, since=Since(ago_s=5))
    reader.read_all()
    assert any("is not known (entries were trimmed by maxlen" in w for w in reader.stats.warnings)


def test_a_window_without_marks_reads_everything(redis_url):
    w = RedisWriter(redis_url, "job", 0, {"world_size": 1}, marks="off")
    w.write([meta()] + [beat(k) for k in range(100)])
    w.close()
    reader = open_source(redis_url, since=Since(ago_s=10))
    got = reader.read_all()
    assert sum(e["type"] == "heartbeat" for e in got) == 100 and reader.stats.skipped_bytes == 0


def test_check_since_on_redis_and_delete_removes_the_marks(redis_url, capsys):
    write_store(redis_url, JobShape(4, 2000, fault="missing", days=2, tail_s=1800, hang_after=10.0,
                                    mark_every_s=3600))
    assert cli(["check", redis_url, "--since", "20m", "--json"]) == 1
    out = orjson.loads(capsys.readouterr().out)
    assert [(f["kind"], f["culprits"]) for f in out["findings"] if f["severity"] == "error"] == [("missing_ranks", [3])]
    assert out["skipped"]["before_window_bytes"] > 0
    client = redis_client(redis_url)  # noqa: F405
    try:
        assert client.xlen(Keys.marks("synthetic", 3)) > 10
        delete_job(redis_url, "synthetic")
        assert not client.keys("commscope:*")
    finally:
        client.close()


def test_a_cluster_keeps_a_stream_s_marks_in_its_slot(redis_cluster_url):
    assert all(keyslot(Keys.marks("j", r)) == keyslot(Keys.stream("j", r)) for r in range(300))
    shape = JobShape(8, 3000, fault="missing", days=3, tail_s=3600, hang_after=10.0, mark_every_s=3600)
    write_store(redis_cluster_url, shape)
    full, _, _ = load_trace(redis_cluster_url)
    part, pr, _ = load_trace(redis_cluster_url, since=Since(ago_s=1800))
    assert pr.stats.skipped_bytes > 0 and findings(part) == findings(full)


def test_marks_come_at_the_rank_s_pace_not_per_write(redis_url):
    w = RedisWriter(redis_url, "job", 0, {"world_size": 1}, marks="inline", mark_every_s=100)
    w.write([meta()])
    for k in range(0, 1000, 5):
        w.write([beat(j) for j in range(k, k + 5)])
    w.close()
    client = redis_client(redis_url)  # noqa: F405
    try:
        ids = [eid for eid, _ in client.xrange(Keys.marks("job", 0))]
    finally:
        client.close()
    assert 9 <= len(ids) <= 10
    assert all(int(i.split(b"-")[0]) >= T0 // 1_000_000 for i in ids)


def test_a_mark_on_the_stream_s_top_leaves_the_rank_s_end_to_read(redis_url):
    """The rank's last write was marked (a copy may mark its last page): the window reads
    from the mark before, so the rank's exit is still read, after what it last did."""
    w = RedisWriter(redis_url, "job", 0, {"world_size": 1}, marks="inline", mark_every_s=100)
    w.write([meta(), begin(0, 0), end(0, 1)])
    for k in range(2, 1000, 10):
        w.write([beat(j) for j in range(k, k + 10)])
    w.write([orjson.dumps({"type": "exit", "rank": 0, "ts": T0 + 1000 * S, "v": 3, "reason": "finished"})])
    w.close()
    top = redis_marks.mark(redis_url, "job", 0)
    assert top is not None and top.entry == 3 + 1000 + 1  # (the mark is on the stream's top)
    got = open_source(redis_url, since=Since(at_ns=T0 + 2000 * S)).read_all()  # (after the rank's end)
    assert [e["type"] for e in got if e["type"] == "exit"] == ["exit"]
    assert got[0]["type"] == "meta" and (0, "end") in [(e["id"], e["phase"]) for e in got if e["type"] == "op"]


@pytest.mark.parametrize("bad", [
    {b"k": b"-5", b"b": b"1", b"c": b""},  # a negative entry
    {b"k": b"99", b"b": b"1", b"c": b""},  # k not the id's
    {b"k": b"4", b"b": b"1_0", b"c": b""},  # not digits
    {b"k": b"4", b"c": b""},  # a field missing
    {b"k": b"4", b"b": b"1", b"c": b"", b"odd": b"1", b"x": b"0", b"y": b"0"},  # (extra fields are fine)
])
def test_a_hostile_mark_is_passed_over_not_followed(redis_url, bad):
    """A mark is data like any other: one that is not what commscope writes is ignored, and
    the reader reads from the start instead of failing or skipping the rank."""
    w = RedisWriter(redis_url, "job", 0, {"world_size": 1}, marks="off")
    w.write([meta()] + [beat(k) for k in range(100)])
    w.close()
    client = redis_client(redis_url)  # noqa: F405
    try:
        client.xadd(Keys.marks("job", 0), {k.decode(): v for k, v in bad.items()}, id=f"{T0 // 1_000_000}-4")
    finally:
        client.close()
    reader = open_source(redis_url, since=Since(ago_s=10))
    got = reader.read_all()
    skipped = 4 if b"odd" in bad else 0
    assert sum(e["type"] == "heartbeat" for e in got) == 100 - max(0, skipped - 1)
    assert reader.stats.missing_by_rank == {}


def test_a_window_after_a_copy_into_redis_is_exact(tmp_path, redis_url):
    store = str(tmp_path / "trace")
    write_store(store, JobShape(4, 2000, fault="dead", days=2, tail_s=1800, hang_after=10.0))
    assert cli(["copy", store, redis_url]) == 0
    # (marked by the copy itself, by the job's own clock; no keeper's keyframes, at its pace)
    assert not any(k[1] == "commscope.store.redis_keeper" and k[3] == redis_url.encode() for k in children.Keeper._of)
    client = redis_client(redis_url)  # noqa: F405
    try:
        assert not client.keys("*:frames:*") and client.keys("*:marks:*")
    finally:
        client.close()
    full, _, _ = load_trace(redis_url)
    part, pr, _ = load_trace(redis_url, since=Since(ago_s=600))
    assert pr.stats.skipped_bytes > 0 and findings(part) == findings(full)
    assert [(f["kind"], f["culprits"]) for f in findings(part) if f["severity"] == "error"] == [("dead_rank", [3])]


def test_ranks_that_start_together_mark_apart(redis_url):
    """16k ranks marking in the same second would each start a child and connect at once:
    the first mark comes early by a share of the period that depends on the rank."""
    firsts = []
    for rank in range(4):
        w = RedisWriter(redis_url, "job", rank, {"world_size": 4}, marks="inline", mark_every_s=100)
        w.write([meta(rank)])
        for k in range(0, 300, 5):
            w.write([beat(j, rank) for j in range(k, k + 5)])
        w.close()
        client = redis_client(redis_url)  # noqa: F405
        try:
            firsts.append(int(client.xrange(Keys.marks("job", rank), count=1)[0][0].split(b"-")[1]))
        finally:
            client.close()
    assert len(set(firsts)) == 4


def test_a_window_after_maxlen_trimmed_history_before_its_mark_counts_the_trimmed_part_apart(redis_url, capsys):
    """Marks every 50 entries, ``maxlen`` trims the oldest entries after they were marked, and
    the window starts at a mark whose stretch lost its oldest entries.  The window skips the
    entries still stored before the mark and the trimmed ones are gone: before, both were
    counted as bytes skipped by --since ("drop --since to read it"), which cannot bring the
    trimmed part back.  Now each is counted apart: the stored part as events skipped (drop
    --since reads them), the trimmed part as events gone (trimmed by maxlen)."""
    import redis

    url = redis_url + "?maxlen=100"
    w = RedisWriter(url, "job", 0, {"world_size": 1}, marks="off")
    w.write([meta()])
    for k in range(1, 400, 50):  # (entry n is beat n - 1; a mark after every 50)
        w.write([beat(j) for j in range(k, k + 50)])
        assert redis_marks.mark(url, "job", 0).exact
    w.close()
    c = redis.Redis.from_url(redis_url)
    first = int(c.xrange(Keys.stream("job", 0), count=1)[0][0].split(b"-")[1])  # the oldest entry left
    marks = sorted(int(eid.split(b"-")[1]) for eid, _ in c.xrange(Keys.marks("job", 0)))
    at = min(k for k in marks if k >= first)  # a mark whose stretch lost its oldest entries
    assert first > 1 and at < marks[-1]
    since = Since(at_ns=T0 + (at - 1) * S + S // 2)  # (after mark ``at``, before the next)
    reader = open_source(url, since=since)
    got = reader.read_all()
    assert [e["ts"] for e in got if e["type"] == "heartbeat"] == [T0 + k * S for k in range(at, 401)]
    stats = reader.stats
    assert stats.skipped_bytes == 0 and stats.skipped_events_by_rank == {0: at - first + 1}
    assert stats.gone_before_window_by_rank == {0: first - 1} and stats.gone_before_window == first - 1
    _, _, warnings = load_trace(url, since=since)
    assert any(f"{at - first + 1:,} event(s) of history before the window not read" in m and "drop --since" in m
               for m in warnings), warnings
    gone = [m for m in warnings if f"{first - 1:,} older event(s) before the window" in m]
    assert gone and "trimmed" in gone[0] and "drop --since" not in gone[0].replace("dropping --since does not", "")
    assert any(f"rank 0: the oldest {first - 1} stream entries before the window were trimmed by maxlen=100" in m
               for m in warnings), warnings
    # the console's history pane (H) says the same, each part apart
    from rich.console import Console

    from commscope.tui.detail import history_detail

    console = Console(width=240, record=True)
    console.print(history_detail({}, stats.skipped_bytes, 0, stats.skipped_events, stats.gone_before_window))
    text = console.export_text()
    assert f"{at - first + 1:,} events before the window not read" in text, text
    assert f"{first - 1:,} older events before the window are gone from the store" in text, text


def _line_bytes(url: str, job: str, ranks: int) -> int:
    """The bytes of every entry's line, as Redis holds them."""
    target = parse_url(url)
    nodes = Nodes(target, target.display())
    nodes.connect()
    try:
        return sum(len(v) for r in range(ranks) for _, fields in nodes.call(Keys.stream(job, r), "XRANGE",
                                                                          Keys.stream(job, r), "-", "+")
                   for v in fields[1::2])
    finally:
        nodes.close()


def _drain(reader) -> None:
    """Poll until a poll reads nothing more (a batch of beats alone counts no event)."""
    while True:
        read = reader._read_bytes
        reader.poll_batch(max_bytes=256 << 10)
        if reader._read_bytes == read:
            return


def test_a_redis_reader_says_about_what_it_has_left_to_read(redis_url, monkeypatch):
    """``backlog_bytes`` on Redis, an estimate (Redis says no stream's bytes; it said 0, so
    ``attach``'s first window and ``check --max-memory`` read any window as asked): a whole
    read's from what Redis says the streams take (~1.2x their lines), a window's from the
    marks it starts at, a follower's from what it read; 0 once read."""
    import time

    from commscope.analysis.synth import S
    from commscope.store.redis_store import RedisReader

    job = "left"
    write_store(redis_url, JobShape(16, 400, fault="missing", hang_after=2.0, mark_every_s=2.0,
                                    t0=time.time_ns() - 30 * S), job=job)
    url = f"{redis_url}?job={job}"
    lines = _line_bytes(redis_url, job, 16)
    monkeypatch.setattr(RedisReader, "BACKLOG_REQUESTS_A_SECOND", float("inf"))  # (each asked afresh)
    whole = open_source(url)
    assert lines <= whole.backlog_bytes() <= 1.5 * lines
    window = open_source(url, since=Since(ago_s=10))
    left = lines - window.stats.skipped_bytes  # (the marks say the bytes before them)
    assert 0 < left < lines
    assert 0.7 * left <= window.backlog_bytes() <= 1.5 * left
    _drain(whole)  # (a follower: from what it read)
    assert whole.backlog_bytes() == 0
    whole.close()
    window.close()


def test_attachs_first_window_on_redis_is_sized_by_its_bytes(redis_url):
    """A first window whose model would not fit a console's budget is made shorter on Redis
    too, as on a directory (``feed.first_window``), where it was read as asked."""
    import time

    from commscope.analysis.source import MODEL_PER_STORED
    from commscope.analysis.synth import S
    from commscope.tui.feed import FIRST_SHARE, first_window

    job = "first"
    write_store(redis_url, JobShape(16, 400, fault="missing", hang_after=2.0, mark_every_s=1.0,
                                    t0=time.time_ns() - 30 * S), job=job)
    url = f"{redis_url}?job={job}"
    held = open_source(url, since=Since(ago_s=3600)).backlog_bytes() * MODEL_PER_STORED
    reader, since, why = first_window(lambda w: open_source(url, since=w), Since(ago_s=3600),
                                      int(held / 4 / FIRST_SHARE))
    try:
        assert since is not None and since.ago_s < 30
        assert why == f"{since.describe()} of 1 h"
        assert reader.backlog_bytes() * MODEL_PER_STORED <= held / 2
    finally:
        reader.close()


def test_a_redis_followers_backlog_is_asked_of_redis_at_a_bounded_rate(redis_url, monkeypatch):
    """A follower asked its backlog every second (a console's header) asks Redis at most
    ``BACKLOG_REQUESTS_A_SECOND`` (two requests a stream), the figure as last found between:
    16k streams sent 32k requests a second."""
    import time

    from commscope.analysis.synth import S
    from commscope.store.redis_store import RedisReader

    job = "rate"
    write_store(redis_url, JobShape(16, 100, fault="missing", hang_after=2.0, t0=time.time_ns() - 10 * S), job=job)
    monkeypatch.setattr(RedisReader, "BACKLOG_REQUESTS_A_SECOND", 32 / 3600)  # (an hour a figure)
    reader = open_source(f"{redis_url}?job={job}")
    asked = []
    real = RedisReader._tops
    monkeypatch.setattr(RedisReader, "_tops", lambda self: asked.append(1) or real(self))
    first = reader.backlog_bytes()
    assert first > 0 and asked == [1]
    reader.poll_batch(max_bytes=8 << 10)
    assert 0 < reader.backlog_bytes() < first and asked == [1]  # (the ends kept, less what was read: no request)
    _drain(reader)
    # (caught up: 0, not the figure kept, which said it "falling behind" for a minute; helper-158)
    assert reader.backlog_bytes() == 0 and asked == [1]
    monkeypatch.setattr(RedisReader, "BACKLOG_REQUESTS_A_SECOND", float("inf"))
    reader._backlog = (0.0, {}, 0.0)  # (its time up)
    assert reader.backlog_bytes() == 0 and asked == [1, 1]
    reader.close()


@pytest.mark.parametrize("ranks, ops", [(256, 3), (8, 2048)])
def test_the_least_a_redis_read_is_said_to_hold_is_no_more_than_its_model(redis_url, ranks, ops):
    """Before anything is read, a Redis reader's bytes are an estimate from ``MEMORY USAGE``,
    up to 2.45x the lines of short streams: the least it may be sizes a refusal
    (helper-160: 1.1-1.2x the model said "at least", and a read at 1.05x the model refused)."""
    from commscope.analysis.source import MODEL_PER_RANK_LEAST, MODEL_PER_STORED_LEAST

    job = f"least{ranks}"
    url = f"{redis_url}?job={job}"
    write_store(redis_url, JobShape(ranks, ops, fault="missing", hang_after=2.0), job=job)
    model, _, _ = load_trace(url)
    reader = open_source(url)
    try:
        assert reader.least_backlog_bytes() < reader.backlog_bytes()  # (estimated: nothing read, no mark)
        least = reader.least_backlog_bytes() * MODEL_PER_STORED_LEAST + reader.rank_count() * MODEL_PER_RANK_LEAST
    finally:
        reader.close()
    assert least <= model.nbytes()
    again, _, _ = load_trace(url, max_model=int(model.nbytes() * 1.05))
    assert again.nbytes() == model.nbytes()


def test_a_redis_reader_counts_its_streams_and_none_where_redis_is_away(redis_url):
    """What a window's model is sized by for each rank (``source.fitting_window``): the job's
    streams, a shard's of them; 0 where Redis cannot be asked."""
    import time

    from commscope.analysis.synth import S
    from commscope.store.base import Shard

    job = "counted"
    write_store(redis_url, JobShape(24, 8, fault="missing", hang_after=2.0, t0=time.time_ns() - 10 * S), job=job)
    reader = open_source(f"{redis_url}?job={job}")
    assert reader.rank_count() == 24
    part = open_source(f"{redis_url}?job={job}")
    part.take_shard(Shard(0, 3))
    assert part.rank_count() == 8
    part.close()
    reader.close()
    from commscope.bench.redis_server import start_redis

    own = start_redis()
    try:
        write_store(own.url, JobShape(4, 8, fault="missing", hang_after=2.0), job=job)
        away = open_source(f"{own.url}?job={job}")
    finally:
        own.stop()  # (not listed yet, and Redis gone when asked)
    assert away.rank_count() == 0
    away.close()


def test_an_inexact_mark_does_not_size_a_redis_window_small(redis_url):
    """A mark whose chain ``maxlen`` broke says the bytes of the entries it read, not of those
    trimmed before it, which its entry number counts: its mean is not an entry's size
    (helper-158: a window after one was estimated at a tenth of its bytes)."""
    from commscope.analysis.synth import S

    job = "inexact"
    writer = RedisWriter(f"{redis_url}?maxlen=100", job, 0, {"world_size": 1}, marks="off")
    t0 = time.time_ns() - 3000 * S

    def padded(k: int) -> bytes:
        return orjson.dumps({"type": "heartbeat", "ts": t0 + k * S, "v": 3, "rank": 0, "inflight": 0,
                             "pad": "x" * 200})

    writer.write([orjson.dumps({"type": "meta", "ts": t0, "v": 3, "rank": 0, "world_size": 1, "host": "h",
                                "sample_interval": 1.0})])
    for k in range(1, 1000, 50):
        writer.write([padded(j) for j in range(k, k + 50)])
    mark = redis_marks.mark(f"{redis_url}?maxlen=100", job, 0)
    assert mark is not None and not mark.exact and mark.bytes < mark.entry * 100  # (its chain lost ~900)
    writer.write([padded(j) for j in range(1000, 1060)])
    writer.close()
    window = open_source(f"{redis_url}?job={job}", since=Since(at_ns=t0 + 1000 * S + S // 2))
    try:
        left = sum(len(v) for k, fields in _entries(redis_url, job) if k > window._last[(0, 0)] for v in fields[1::2])
        assert 0.5 * left <= window.backlog_bytes() <= 1.5 * left
    finally:
        window.close()


def _entries(url: str, job: str) -> list[tuple[int, list]]:
    """Rank 0's entries: (number, fields)."""
    target = parse_url(url)
    nodes = Nodes(target, target.display())
    nodes.connect()
    try:
        key = Keys.stream(job, 0)
        return [(int(eid.split(b"-")[1]), fields) for eid, fields in nodes.call(key, "XRANGE", key, "-", "+")]
    finally:
        nodes.close()


def test_a_hostile_mark_does_not_size_a_redis_window(redis_url):
    """A mark is data: one saying its entries hold 10^18 bytes (no line is that long) is not
    taken for an entry's size (helper-158: a window starting at it was estimated at 10^17
    bytes, and ``check --max-memory`` said to try a window longer than the job)."""
    from commscope.analysis.synth import S

    job = "hostile"
    write_store(redis_url, JobShape(16, 400, fault="missing", hang_after=2.0, mark_every_s=2.0,
                                    t0=time.time_ns() - 30 * S), job=job)
    target = parse_url(redis_url)
    nodes = Nodes(target, target.display())
    nodes.connect()
    try:
        marks = Keys.marks(job, 3)
        (eid, flat), = nodes.call(marks, "XREVRANGE", marks, "+", "-", "COUNT", 1)
        ms, k = (int(n) for n in eid.decode().split("-"))
        fields = dict(zip(flat[::2], flat[1::2], strict=True))
        # (after the newest mark, at an entry before the stream's top: where a window starts)
        nodes.call(marks, "XADD", marks, f"{ms + 1}-{k - 50}", "k", str(k - 50), "b", "9" * 18, "x", "0",
                   "c", fields[b"c"])
    finally:
        nodes.close()
    window = open_source(f"{redis_url}?job={job}", since=Since(at_ns=(ms + 2) * 1_000_000))
    assert window._last[(3, 0)] == k - 50  # (rank 3 starts at it)
    try:
        lines = _line_bytes(redis_url, job, 16)
        assert 0 < window.backlog_bytes() <= 1.5 * lines
    finally:
        window.close()
