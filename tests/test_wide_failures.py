"""A wide job's failed collective is judged once per instance, not once per rank: what each
failed rank's blame asks of the others (who had entered by its timeout, who left or went
silent before its connection closed) is worked out once for the instance, and says what
asking it rank by rank said (``failures._Arrivals``, ``rankstate._bystanders``)."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from commscope.analysis import TraceModel, rankstate
from commscope.analysis.failures import _Arrivals, failed_instances
from commscope.analysis.rankstate import ARRIVAL_SLACK_NS, SLACK_NS, departed_ns
from commscope.analysis.synth import S, TraceBuilder

TIMEOUT = ("RuntimeError: Watchdog caught collective operation timeout: WorkNCCL(SeqNum=3, "
           "OpType=ALLREDUCE) ran for 600000 milliseconds before timing out")
CLOSED = "RuntimeError: Connection closed by peer [10.0.0.1]:1234"
MS = 1_000_000


def _job(rng: random.Random, world: int, exc: str) -> TraceModel:
    """Two healthy all_reduces, then one that some members enter (at random times) and
    fail in (at random times, a few before they entered: hostile), some exit or go silent."""
    b = TraceBuilder(world, sample_interval=0.2)
    t = b.warmup(2)
    for r in range(world):
        fate = rng.random()
        if fate < 0.6:
            begin = t + rng.randrange(0, 50) * MS
            i = b.begin(r, begin, "all_reduce")
            b.end(r, i, begin + rng.choice([-50, 1, 600_000, 600_000, 700_000]) * MS, exc=exc)
        elif fate < 0.7:
            b.exit(r, t + rng.randrange(0, 800_000) * MS, reason="signal", signal="SIGKILL")
        if fate < 0.85:
            b.heartbeats(b.t0, t + rng.randrange(0, 900) * S, interval=50 * S, ranks=[r])
    return TraceModel.from_events(b.sorted_events())


def _jobs(seed: int, exc: str) -> Iterator[TraceModel]:
    """Sixty such jobs of 3 to 23 ranks."""
    rng = random.Random(seed)
    for _ in range(60):
        yield _job(rng, rng.randrange(3, 24), exc)


def _absent(model: TraceModel, r: int, i: int, ops: dict[int, int]) -> tuple[int, ...]:
    """A timeout's absentees as each rank's blame asked them before."""
    t = model.failed_ns(r, i)
    return tuple(m for m in model.members(r, i) if m != r and
                 (m not in ops or int(model.ranks[m].begin[ops[m]]) > t + ARRIVAL_SLACK_NS))


def _gone(model: TraceModel, rank: int, i: int) -> tuple[list[int], list[int]]:
    """``peers_gone`` as each rank asked it before, walking every member."""
    t = model.failed_ns(rank, i)
    inst = model.counterparts(rank, i)
    left, silent = [], []
    for p in model.members(rank, i):
        if p == rank or (p in inst and inst[p] in model.ranks[p].exc):
            continue
        dep = departed_ns(model, p)
        if dep is not None:
            if dep <= t + SLACK_NS:
                left.append(p)
        elif model.last_seen(p) <= t + SLACK_NS:
            silent.append(p)
    return left, silent


def test_a_timeout_s_absentees_are_those_asking_each_rank_found():
    asked = 0
    for m in _jobs(3, TIMEOUT):
        for r, i in m.failed:
            ops = m.counterparts(r, i)
            arrivals = _Arrivals(m, r, i, ops)
            for q, j in m.failed:
                if m.counterparts(q, j) == ops:
                    assert arrivals.timeout(q, m.failed_ns(q, j)).culprits == _absent(m, q, j, ops)
                    asked += 1
    assert asked > 500


def test_who_left_before_a_connection_closed_is_what_asking_each_rank_found():
    asked = 0
    for m in _jobs(4, CLOSED):
        for r, i in m.failed:
            assert rankstate.peers_gone(m, r, i) == _gone(m, r, i)
            asked += 1
    assert asked > 300


@pytest.mark.parametrize("exc", [TIMEOUT, CLOSED])
def test_sixty_four_ranks_whose_all_reduce_failed_ask_the_others_once(exc, monkeypatch):
    """Each rank's blame reads what it needs of the instance; the instance is walked once."""
    b = TraceBuilder(64, sample_interval=0.2)
    t = b.warmup(2)
    for r in range(48):
        i = b.begin(r, t + r * MS, "all_reduce")
        b.end(r, i, t + 600 * S + r * MS, exc=exc)
    b.heartbeats(b.t0, t + 700 * S, interval=10 * S)
    m = TraceModel.from_events(b.sorted_events())
    walks: list[int] = []
    members, blame = TraceModel.members, _Arrivals._blame
    monkeypatch.setattr(TraceModel, "members", lambda self, r, i: walks.append(r) or members(self, r, i))
    monkeypatch.setattr(_Arrivals, "_blame",
                        lambda self, r, cut, when, t: walks.append(-1) or blame(self, r, cut, when, t))
    (failure,) = failed_instances(m, t + 700 * S, {}, 30 * S)
    assert len(failure.failed) == 48 and len(walks) == (2 if exc == TIMEOUT else 1), walks
    if exc == TIMEOUT:
        assert failure.blame.culprits == tuple(range(48, 64)) and failure.blame.reason == "absent"


def test_who_left_is_the_same_whichever_rank_asks_first():
    """A rank whose failed op's seq is stated again by a later op (a restarted process, a
    hostile seq): the instance is read from its own row, so what every rank is told does
    not depend on which asked first."""
    b = TraceBuilder(3, sample_interval=0.2)
    t = b.warmup(1)
    i = b.begin(0, t, "all_reduce", seq=2)
    b.end(0, i, t + S, exc=CLOSED)
    i = b.begin(0, t + 3 * S // 2, "all_reduce", seq=2)  # (seq 2 again)
    b.end(0, i, t + 8 * S // 5)
    for r in (1, 2):
        i = b.begin(r, t, "all_reduce", seq=2)
        b.end(r, i, t + 5 * S, exc=CLOSED)
    b.heartbeats(b.t0, t + 8 * S // 5, ranks=[0])  # (rank 0 silent since)
    b.heartbeats(b.t0, t + 5 * S, ranks=[1, 2])
    events = b.sorted_events()
    m = TraceModel.from_events(events)
    want = {(r, i): _gone(m, r, i) for r, i in m.failed}
    assert want[(1, 1)] == ([], [0])
    for order in (m.failed, m.failed[::-1]):
        fresh = TraceModel.from_events(events)
        assert {(r, i): rankstate.peers_gone(fresh, r, i) for r, i in order} == want
