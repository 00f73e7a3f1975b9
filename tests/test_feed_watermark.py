"""A live console behind on its streams judges ranks as of what it has read, never as of
the wall clock alone: its own lag never turns a rank silent, missing or dead
(``TraceReader.watermark_ns``, ``Feed.now``)."""

from __future__ import annotations

import dataclasses
import gc
import time

import pytest
from readers import by_workers

from commscope.analysis import TraceModel, rankstate
from commscope.bench.synthstore import JobShape, write_store
from commscope.store import AsOf, Batch, EmptyReader, open_reader
from commscope.tui.feed import LIVE, Feed

S = 1_000_000_000


def recent_job(store: str, ranks: int = 16) -> JobShape:
    """A job that hung in its last all_reduce (rank ``culprit_rank`` never came), whose
    trace ends about now."""
    shape = JobShape(ranks, 40, fault="missing", hang_after=2.0, tail_s=6.0)
    span = S + 39 * int(S / shape.rate) + 500_000 + 6 * S
    shape = JobShape(ranks, 40, fault="missing", hang_after=2.0, tail_s=6.0, t0=time.time_ns() - span - S // 2)
    write_store(store, shape, job="recent")
    return shape


def test_the_watermark_is_zero_until_every_stream_was_read_to_its_end(tmp_path):
    store = str(tmp_path / "trace")
    recent_job(store, ranks=8)
    reader = open_reader(f"{store}/recent")
    before = time.time_ns()
    marks = []
    for _ in range(8):  # a budget of one byte: one stream a poll (each gets 64 KiB at least)
        reader.poll_batch(max_bytes=1)
        marks.append(reader.watermark_ns())
    assert marks[:7] == [0] * 7  # some stream not read yet: nothing is known to be complete
    assert before <= marks[7] <= time.time_ns()  # the oldest of the reads that reached each end


def test_a_console_catching_up_judges_nothing_until_it_has_read_every_stream(tmp_path):
    """Read one stream a step: the partial model looks like every unread rank is missing
    from the last collective; no finding is made until every stream was read, and then the
    one the whole trace gives (the culprit, no victim)."""
    store = str(tmp_path / "trace")
    shape = recent_job(store)
    feed = Feed(open_reader(f"{store}/recent"), mode=LIVE, hang_after=2.0)
    feed.BUDGET = 1
    for step in range(shape.ranks - 1):
        feed.step()
        feed._diagnosed_at = float("-inf")  # (would diagnose now)
        assert not feed.caught_up() and feed.findings == [], step
    for _ in range(3):
        feed.step()
        feed._diagnosed_at = float("-inf")
    assert feed.caught_up()
    assert [(f.kind, f.culprits) for f in feed.findings if f.severity == "error"] == \
        [("missing_ranks", [shape.culprit_rank])]
    assert feed.now() <= feed.reader.watermark_ns()


def test_a_console_far_behind_does_not_take_its_lag_for_deaths(tmp_path):
    """The wall clock runs a minute past what the reader has read (a console far behind):
    every rank's last heartbeat is a minute old by the clock, yet nobody is dead, because
    the ranks are judged as of the watermark."""
    store = str(tmp_path / "trace")
    shape = recent_job(store)
    feed = Feed(open_reader(f"{store}/recent"), mode=LIVE, hang_after=2.0, clock=lambda: time.time_ns() + 60 * S)
    for _ in range(3):
        feed.step()
        feed._diagnosed_at = float("-inf")
    kinds = [(f.kind, f.culprits) for f in feed.findings if f.severity == "error"]
    assert kinds == [("missing_ranks", [shape.culprit_rank])], kinds  # no dead_rank, no stopped job
    assert not feed.ended


def test_a_new_stream_never_lets_the_clock_run_past_what_was_read(tmp_path):
    """A rank's new incarnation appears while the console is behind: its unread stream sets
    the reader's watermark back to 0, and the console keeps judging at the last watermark
    (not the wall clock) until it has read it: no rank turns dead, the job does not end."""
    import json

    store = str(tmp_path / "trace")
    recent_job(store, ranks=8)
    feed = Feed(open_reader(f"{store}/recent"), mode=LIVE, hang_after=2.0, clock=lambda: time.time_ns() + 60 * S)
    for _ in range(3):
        feed.step()
        feed._diagnosed_at = float("-inf")
    before = feed.now()
    feed.reader.LIST_TRUST_S = 0.0  # (list the directory again at once)
    with open(f"{store}/recent/rank-00007+1.jsonl", "w") as fh:
        fh.write(json.dumps({"type": "meta", "v": 1, "rank": 7, "ts": time.time_ns(), "host": "node7", "pid": 1,
                             "world_size": 8, "hang_after": 2.0, "sample_interval": 1.0, "inc": 1}) + "\n")
    feed.BUDGET = 1  # one stream a poll, from the first: the new one (last in order) is read last
    feed.reader._next = 0
    seen_zero = False
    for _ in range(12):
        for r in range(8):  # the ranks go on beating: every stream has something new each poll
            with open(f"{store}/recent/rank-{r:05d}.jsonl", "a") as fh:
                fh.write(json.dumps({"type": "heartbeat", "v": 1, "rank": r, "ts": time.time_ns(), "inflight": 1})
                         + "\n")
        info, _ = feed.step()
        seen_zero |= feed.reader.watermark_ns() == 0
        assert before <= feed.now() <= time.time_ns() and not info.ended
        assert not any(getattr(s, "kind", "") == "dead" for s in feed.view.states.values())
    assert seen_zero  # the new stream did hold the watermark back for a while


class _Queue(EmptyReader):
    """A live source handing out the batches it is given, one a poll."""

    def __init__(self) -> None:
        super().__init__("queue")
        self.batches: list[list[dict]] = []

    def poll_batch(self, max_bytes=None):
        return Batch(self.batches.pop(0) if self.batches else [], [])


def test_a_follower_starved_after_its_read_judges_as_of_that_read(tmp_path):
    """``store.AsOf``, what the console and the tests that follow a live job judge by: a
    follower descheduled for seconds between its read and its judgement (a loaded machine)
    judges as of its read, the reader's watermark, not the wall clock: no rank turns dead
    by its own delay.  Before any watermark, and from a reader that cannot tell (None), the
    wall clock; while a stream new to the reader makes the watermark 0, the last one."""
    store = str(tmp_path / "trace")
    recent_job(store, ranks=8)
    reader = open_reader(f"{store}/recent")
    model = TraceModel()
    model.ingest(reader.poll())
    starved = time.time_ns() + 10 * S  # (the judgement comes 10 s after the read)
    as_of = AsOf()
    now = as_of.now(reader, starved)
    assert now == reader.watermark_ns() < starved - 9 * S
    assert not [r for r in model.rank_ids() if rankstate.is_dead(model, r, now)]
    assert [r for r in model.rank_ids() if rankstate.is_dead(model, r, starved)] == model.rank_ids()  # (by the wall)

    class Marks(EmptyReader):
        def __init__(self, marks: list[int | None]) -> None:
            super().__init__()
            self.marks = marks

        def watermark_ns(self) -> int | None:
            return self.marks.pop(0)

    marks, clock = AsOf(), Marks([None, 0, 5 * S, 0, 7 * S])
    assert [marks.now(clock, 9 * S) for _ in range(5)] == [9 * S, 9 * S, 5 * S, 5 * S, 7 * S]
    assert AsOf().now(Marks([8 * S]), 6 * S) == 6 * S  # (never past the wall clock)


def test_a_view_put_off_because_it_is_costly_is_published_later(monkeypatch):
    """A costly view is published at most every ten times what it costs; a batch that came
    meanwhile, even to an ended job, is shown once that time has passed."""
    from commscope.analysis import rankstate
    from commscope.analysis.synth import TraceBuilder
    t0 = time.time_ns() - 60 * S
    b = TraceBuilder(4, t0=t0)
    b.warmup(3)
    b.heartbeats(t0, t0 + 25 * S)  # a job stopped half a minute ago
    events = b.sorted_events()
    late = [e for e in events if e["rank"] == 2 and e["type"] == "heartbeat"][-3]
    reader = _Queue()
    reader.batches = [[e for e in events if e is not late]]
    slow = rankstate.rank_states

    def costly(m, now):
        time.sleep(0.03)  # a view of 16k ranks takes ~0.2 s
        return slow(m, now)

    monkeypatch.setattr(rankstate, "rank_states", costly)
    feed = Feed(reader, mode=LIVE, hang_after=2.0)
    info, _ = feed.step()
    assert info.ended and feed.view.version == feed.model.version
    reader.batches = [[late]]  # a line that does not move the trace's end
    feed.step()
    assert feed.view.version < feed.model.version  # put off
    deadline = time.monotonic() + 10
    while feed.view.version < feed.model.version:
        assert time.monotonic() < deadline, "the view was never published"
        time.sleep(0.05)
        feed.step()


class _Monotonic:
    """``time`` as the feed sees it, but a monotonic clock that moves only when told (what
    a publish costs is what it moved meanwhile)."""

    def __init__(self) -> None:
        self.t = 1000.0

    def monotonic(self) -> float:
        return self.t

    def __getattr__(self, name: str):
        return getattr(time, name)


@pytest.mark.parametrize("behind", [False, True])
def test_a_console_behind_publishes_a_tenth_of_its_time_one_caught_up_within_a_second(monkeypatch, behind):
    """A view costing 0.4 s is published at most every ten times that (4 s) by a console
    behind the job, whose view is seconds old anyway (``FeedInfo.behind``), so that it can
    catch up; a console that keeps up publishes within a second (and no sooner), one that
    caught up since its last publish too."""
    import commscope.tui.feed as feed_module
    from commscope.analysis.synth import TraceBuilder

    clock = _Monotonic()
    monkeypatch.setattr(feed_module, "time", clock)
    slow = rankstate.rank_states

    def costly(m, now):
        clock.t += 0.4
        return slow(m, now)

    monkeypatch.setattr(rankstate, "rank_states", costly)
    t0 = time.time_ns() - 60 * S
    b = TraceBuilder(4, t0=t0)
    b.warmup(3)
    events = b.sorted_events()
    feed = Feed(_Queue(), mode=LIVE, hang_after=2.0)
    feed.info = dataclasses.replace(feed.info, behind=behind)
    feed.ingest(Batch(events[: len(events) // 2], []))
    assert feed.view.version == feed.model.version  # (the first: at once)
    wait = 4.0 if behind else 1.0
    for step, (at, shown) in enumerate(((0.9, False), (wait - 0.05, False), (wait + 0.05, True))):
        clock.t = 1000.4 + at
        feed.ingest(Batch([dict(e, ts=e["ts"] + (step + 1) * S) for e in events[len(events) // 2:][step::3]], []))
        assert (feed.view.version == feed.model.version) is shown, (at, shown)
    if behind:  # caught up since the last publish: within a second of it, not ten times its cost
        feed.info = dataclasses.replace(feed.info, behind=False)
        published = clock.t
        clock.t = published + 1.05
        feed.ingest(Batch([dict(e, ts=e["ts"] + 9 * S) for e in events[len(events) // 2:][::5]], []))
        assert feed.view.version == feed.model.version


@pytest.mark.parametrize("behind", [False, True])
def test_a_console_behind_judges_a_tenth_of_its_time_one_caught_up_a_fifth(monkeypatch, behind):
    """A diagnosis costing 0.4 s is followed by the next at most every ten times that (4 s)
    by a console behind the job, which needs the time to catch up (its findings are seconds
    old anyway), every five times (2 s) by one that keeps up; one that caught up since its
    last diagnosis keeps to the five times."""
    import commscope.tui.feed as feed_module
    from commscope.analysis.synth import TraceBuilder

    clock = _Monotonic()
    monkeypatch.setattr(feed_module, "time", clock)
    judge = feed_module.diagnose

    def costly(*args, **kwargs):
        clock.t += 0.4
        return judge(*args, **kwargs)

    monkeypatch.setattr(feed_module, "diagnose", costly)
    t0 = time.time_ns() - 60 * S
    b = TraceBuilder(4, t0=t0)
    b.warmup(3)
    b.heartbeats(t0, t0 + 3 * S)
    events = b.sorted_events()
    reader = _Queue()
    feed = Feed(reader, mode=LIVE, hang_after=2.0, clock=lambda: t0 + 4 * S)
    reader.batches = [events[: len(events) // 2]]
    feed.step()
    assert feed.diagnoses == 1  # (the first: at once)
    began = 1000.0  # (when it began: its cost is counted from there)
    wait = 4.0 if behind else 2.0
    rest = events[len(events) // 2:]
    for step, (at, judged) in enumerate(((1.5, False), (wait - 0.05, False), (wait + 0.05, True))):
        feed.info = dataclasses.replace(feed.info, behind=behind)  # (as the last step saw it)
        clock.t = began + at
        reader.batches = [rest[step::4]]
        feed.step()
        assert feed.diagnoses == (2 if judged else 1), (at, judged)
    if behind:  # caught up since the last diagnosis: five times its cost after it, not ten
        began = began + wait + 0.05
        feed.info = dataclasses.replace(feed.info, behind=False)
        clock.t = began + 2.05
        reader.batches = [rest[3::4]]
        feed.step()
        assert feed.diagnoses == 3


def test_the_rank_table_of_a_console_far_behind_shows_no_rank_dead(tmp_path):
    """The console's own clock (the rank table, the timeline's now line) is held back as
    the feed's is: a console a minute behind shows the ranks waiting, not dead."""
    from tui_scenarios import drive

    from commscope.tui.app import CommscopeApp

    store = str(tmp_path / "trace")
    recent_job(store, ranks=8)
    behind = lambda: time.time_ns() + 60 * S  # noqa: E731
    feed = Feed(open_reader(f"{store}/recent"), mode=LIVE, hang_after=2.0, clock=behind)
    app = CommscopeApp(feed, clock=behind, start_feed=False, bell=False)

    async def check(pilot):
        for _ in range(3):
            info, _ = feed.step()
            feed._diagnosed_at = float("-inf")
        app.apply(info, feed.findings)
        await pilot.pause()
        table = app.ranks_table
        states = [table.cells(r)["state"] for r in table.order]
        assert len(states) == 8 and not any("dead" in s for s in states), states
        assert sum("in all_reduce" in s for s in states) == 7, states

    drive(app, check, loaded=False)


def test_a_console_that_kept_up_waits_for_its_round_and_one_cut_short_goes_on(tmp_path, monkeypatch):
    """``Feed.pause_s``: a poll that read all there was is followed by the next ``ROUND_S``
    after it began (each stream's own cost paid a few times a second, not as often as polls
    can go); one the budget stopped goes on at once; one with nothing new waits ``POLL_S``."""
    store = str(tmp_path / "trace")
    shape = recent_job(store, ranks=4)
    monkeypatch.setattr(Feed, "ROUND_S", 600.0)  # (no step takes that long: the wait is what is left of it)
    cut = Feed(open_reader(f"{store}/recent"), mode=LIVE, hang_after=2.0)
    cut.BUDGET = 1  # one stream a poll
    info, got = cut.step()
    assert got and cut.pause_s(got) == 0.0 and not cut.caught_up()
    whole = Feed(open_reader(f"{store}/recent"), mode=LIVE, hang_after=2.0)
    before = time.monotonic()
    info, got = whole.step()
    pause = whole.pause_s(got)
    took = time.monotonic() - before
    assert got and whole.caught_up() and whole.model.events >= shape.ranks
    assert 600.0 - took <= pause <= 600.0  # what is left of the round that began with the step
    info, got = whole.step()  # nothing new
    assert not got and whole.pause_s(got) == Feed.POLL_S


def _caught_up(opened, monkeypatch, workers: str) -> Feed:
    """A live console on the reader ``opened()`` gives, read with ``workers`` read workers in
    many chunks until every stream was read, then judged."""
    if workers == "2":
        by_workers(monkeypatch)
    else:
        monkeypatch.setenv("COMMSCOPE_READ_WORKERS", workers)
    feed = Feed(opened(), mode=LIVE, hang_after=2.0)
    feed.BUDGET = 1 << 12  # (many chunks)
    while not feed.caught_up():
        feed.step()
    feed._diagnosed_at = float("-inf")
    feed.step()
    return feed


def _per_rank(feed: Feed) -> dict[int, list]:
    m = feed.model
    return {r: [m.op(r, i) for i in range(m.n_ops(r))] for r in m.rank_ids()}


def test_a_console_attached_to_a_large_job_reads_it_apart_then_polls_on_from_there(tmp_path, monkeypatch):
    """``Feed``'s first read goes through ``TraceReader.read_apart`` (the directory store's
    worker processes, for a large job): the same model and finding as polls give it, and the
    polls after it read each stream from where its worker stopped, a line torn at the end
    included, every event once."""
    from commscope.store import bulkread
    from commscope.store.directory import DirectoryReader

    store = str(tmp_path / "trace")
    shape = recent_job(store, ranks=12)
    streams = sorted((tmp_path / "trace" / "recent").glob("rank-*.jsonl"))
    beat = b'{"type":"heartbeat","ts":%d,"inflight":0,"v":3,"rank":%d}'
    with open(streams[3], "ab") as f:  # a line being written as the console attaches
        f.write((beat % (time.time_ns(), 3))[:20])
    monkeypatch.setattr(DirectoryReader, "PARALLEL_MIN_BYTES", 0)
    started: list[int] = []
    real = bulkread.Workers.__init__
    monkeypatch.setattr(bulkread.Workers, "__init__", lambda self, n: started.append(n) or real(self, n))

    polled = _caught_up(lambda: open_reader(f"{store}/recent"), monkeypatch, "1")
    assert started == []  # (one core: polls read it)
    apart = _caught_up(lambda: open_reader(f"{store}/recent"), monkeypatch, "2")
    assert started == [2] and apart._first_done and apart._first is None
    assert apart.model.events == polled.model.events and _per_rank(apart) == _per_rank(polled)
    for feed in (polled, apart):
        assert [(f.kind, f.culprits) for f in feed.findings if f.severity == "error"] == \
            [("missing_ranks", [shape.culprit_rank])]
    before = apart.model.events
    with open(streams[3], "ab") as f:  # the torn line ends, and every rank beats once more
        f.write((beat % (time.time_ns(), 3))[20:] + b"\n")
    for rank, path in enumerate(streams):
        with open(path, "ab") as f:
            f.write(beat % (time.time_ns(), rank) + b"\n")
    for feed in (polled, apart):
        feed.step()
    assert apart.model.events == polled.model.events == before + len(streams) + 1
    assert _per_rank(apart) == _per_rank(polled)


def test_a_small_job_of_many_streams_goes_to_the_polls_on_a_sample_of_their_sizes(tmp_path, monkeypatch):
    """A console's first read of many streams asks the size of a sample of them first: a job
    they put far below ``PARALLEL_MIN_BYTES`` is polled without a stat of every stream; one
    they put near it has every stream's size looked at, and goes apart where it is large."""
    from commscope.store import directory
    from commscope.store.directory import DirectoryReader

    job = tmp_path / "trace" / "many"
    job.mkdir(parents=True)
    line = b'{"type":"heartbeat","ts":%d,"inflight":0,"v":3,"rank":%d}\n'
    for rank in range(48):
        (job / f"rank-{rank:05d}.jsonl").write_bytes(line % (time.time_ns(), rank) * 2)  # (alike: a fair sample)
    monkeypatch.setattr(DirectoryReader, "SIZE_SAMPLE", 4)  # (more than four times as many streams)
    asked: list[str] = []
    real = directory.size_of
    monkeypatch.setattr(directory, "size_of", lambda path: asked.append(path) or real(path))
    went: list[int] = []
    monkeypatch.setattr(DirectoryReader, "_bulk_parallel", lambda self, streams, *_: went.append(len(streams)) or iter(()))
    by_workers(monkeypatch)
    size = sum(p.stat().st_size for p in job.iterdir())
    for floor, stats, apart in ((size * 4 + 1, 4, False), (size * 3, 4 + 48, False), (size, 4 + 48, True)):
        asked.clear()
        went.clear()
        monkeypatch.setattr(DirectoryReader, "PARALLEL_MIN_BYTES", floor)
        assert list(open_reader(str(job)).read_apart(1 << 20)) == []
        assert len(asked) == stats and went == ([48] if apart else [])
    assert list(open_reader(str(job)).read_apart(1 << 20)) == []
    asked.clear()
    monkeypatch.setattr(DirectoryReader, "PARALLEL_MIN_BYTES", size * 4 + 1)
    assert list(open_reader(str(job)).bulk(1 << 20)) != [] and len(asked) >= 48  # (a whole read: not sampled)


def test_a_console_closed_during_its_first_read_leaves_no_worker(tmp_path, monkeypatch):
    """(Quitting ``attach`` while it reads a large job apart: ``Feed.run`` closes the feed.)"""
    import threading

    from test_oprecords import _bulkread_children

    from commscope.store.directory import DirectoryReader

    store = str(tmp_path / "trace")
    recent_job(store, ranks=32)
    monkeypatch.setattr(DirectoryReader, "PARALLEL_MIN_BYTES", 0)
    by_workers(monkeypatch)
    feed = Feed(open_reader(f"{store}/recent"), mode=LIVE, hang_after=2.0)
    feed.BUDGET = 1 << 12  # (many chunks: more to read after the first)
    stop = threading.Event()
    posted = []

    def post(msg) -> None:  # the first update: the UI asks to quit
        posted.append(msg)
        stop.set()

    feed.run(post, stop)
    assert posted and not feed.caught_up() and feed.model.events
    assert _bulkread_children() == []
    assert feed._first is None and feed._first_done


@pytest.mark.parametrize("window", [None, 8.0])
def test_a_first_read_apart_of_segments_and_a_window_is_the_polls_read(tmp_path, monkeypatch, window):
    """Streams of several segments each, read whole or from a window on (``attach --since``):
    the workers' first read leaves the model the polls leave, and the polls after it go on in
    each stream's newest segment."""
    from commscope.store import bulkread
    from commscope.store.directory import DirectoryReader
    from commscope.window import Since

    store = str(tmp_path / "trace")
    shape = JobShape(12, 150, fault="missing", hang_after=2.0, tail_s=6.0, segment_bytes=4096)
    span = S + 149 * int(S / shape.rate) + 500_000 + 6 * S
    shape = dataclasses.replace(shape, t0=time.time_ns() - span - S // 2)
    write_store(store, shape, job="recent")
    monkeypatch.setattr(DirectoryReader, "PARALLEL_MIN_BYTES", 0)
    started: list[int] = []
    real = bulkread.Workers.__init__
    monkeypatch.setattr(bulkread.Workers, "__init__", lambda self, n: started.append(n) or real(self, n))

    def opened():
        reader = open_reader(f"{store}/recent")
        if window is not None:
            reader.start_at(Since(ago_s=window))
        return reader

    polled, apart = _caught_up(opened, monkeypatch, "1"), _caught_up(opened, monkeypatch, "2")
    assert started == [2]
    assert apart.reader.stats.skipped_bytes == polled.reader.stats.skipped_bytes
    assert (window is not None) == (apart.reader.stats.skipped_bytes > 0)
    assert apart.model.events == polled.model.events

    def ops(feed: Feed) -> dict[int, list]:  # (the op in flight where the window starts, carried in
        # first, takes another index among a rank's ops when its records come in two pieces of a batch)
        return {r: sorted(({k: v for k, v in op.items() if k != "index"} for op in o),
                          key=lambda op: (op["begin_ns"], op["id"])) for r, o in _per_rank(feed).items()}

    assert ops(apart) == ops(polled)
    now = polled.now()
    assert {r: s.text for r, s in rankstate.rank_states(apart.model, now).items()} == \
        {r: s.text for r, s in rankstate.rank_states(polled.model, now).items()}
    for feed in (polled, apart):
        assert [(f.kind, f.culprits) for f in feed.findings if f.severity == "error"] == \
            [("missing_ranks", [shape.culprit_rank])]


@pytest.mark.parametrize("stale", [False, True])
def test_a_hang_is_looked_for_once_its_op_passes_hang_after_whatever_the_pacing(monkeypatch, stale):
    """A costly diagnosis paces the next (16k ranks: ~0.5 s each, so one every few seconds);
    a collective in flight that passed hang_after since the moment the last diagnosis judged
    at is looked for at once (``Feed._hang_due``), and only once for that moment; an op in
    flight for ever before it (``stale``: an async op never waited on) hides nothing."""
    from commscope.analysis.synth import TraceBuilder

    t0 = 1_800_000_000 * S
    b = TraceBuilder(4, t0=t0, hang_after=2.0)
    b.group("solo", [3])
    t = b.warmup(2)
    if stale:
        b.async_op(3, t, None, None, "all_reduce", "solo")
    ta = t + 3 * S // 2
    for r in (0, 1, 2):  # (rank 3 never enters)
        b.begin(r, ta, "all_reduce")
    b.heartbeats(t0, ta + 3 * S)
    events = b.sorted_events()
    clock = [ta + S]
    reader = _Queue()
    reader.batches = [[e for e in events if e["ts"] <= clock[0]]]
    monkeypatch.setattr(Feed, "DIAGNOSE_S", 3600.0)  # (the pacing of a diagnosis far costlier than any here)
    feed = Feed(reader, mode=LIVE, hang_after=2.0, clock=lambda: clock[0])
    feed.step()
    assert feed.diagnoses == 1 and not [f for f in feed.findings if f.kind == "missing_ranks"]  # (1 s of 2)
    reader.batches = [[e for e in events if ta + S < e["ts"] <= ta + 3 * S]]
    clock[0] = ta + 5 * S // 2
    deadline = time.monotonic() + 60
    while feed.diagnoses == 1:  # (the next step at once, or after twice what the last cost)
        assert time.monotonic() < deadline, "the hang was not looked for"
        feed.step()
    assert [(f.kind, f.culprits) for f in feed.findings if f.kind == "missing_ranks"] == [("missing_ranks", [3])]
    clock[0] = ta + 3 * S
    for _ in range(3):
        time.sleep(0.01)
        feed.step()
    assert feed.diagnoses == 2  # (judged past that moment already)


def test_a_console_judges_and_publishes_with_the_cyclic_collector_paused(monkeypatch):
    """A diagnosis and a view of 16k ranks are tens of thousands of small objects, and a pass
    of the cyclic collector among them walked the whole model (0.2-0.45 s more on a 0.7 s
    diagnosis of 16k waiting ranks): it is paused while they are made, and runs again after."""
    import commscope.tui.feed as feedmod
    from commscope.analysis.synth import TraceBuilder

    seen: list[tuple[str, bool]] = []
    judge, states = feedmod.diagnose, rankstate.rank_states
    monkeypatch.setattr(feedmod, "diagnose", lambda *a, **k: seen.append(("diagnose", gc.isenabled())) or judge(*a, **k))
    monkeypatch.setattr(rankstate, "rank_states", lambda m, now: seen.append(("view", gc.isenabled())) or states(m, now))
    b = TraceBuilder(4, t0=time.time_ns() - 10 * S)
    b.warmup(3)
    reader = _Queue()
    reader.batches = [b.sorted_events()]
    feed = Feed(reader, mode=LIVE, hang_after=2.0)
    feed.step()
    feed.publish()
    assert {what for what, _ in seen} == {"diagnose", "view"} and not any(on for _, on in seen)
    assert gc.isenabled()
