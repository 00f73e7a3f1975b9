"""A live console behind on its streams judges ranks as of what it has read, never as of
the wall clock alone: its own lag never turns a rank silent, missing or dead
(``TraceReader.watermark_ns``, ``Feed.now``)."""

from __future__ import annotations

import time

from commscope.bench.synthstore import JobShape, write_store
from commscope.store import open_reader
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
        feed._next_diag = 0.0  # (would diagnose now)
        assert not feed.caught_up() and feed.findings == [], step
    for _ in range(3):
        feed.step()
        feed._next_diag = 0.0
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
        feed._next_diag = 0.0
    kinds = [(f.kind, f.culprits) for f in feed.findings if f.severity == "error"]
    assert kinds == [("missing_ranks", [shape.culprit_rank])], kinds  # no dead_rank, no stopped job
    assert not feed.ended
