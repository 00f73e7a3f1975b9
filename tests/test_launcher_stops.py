"""A rank that dies, after which its launcher stops the others (mp.spawn and torchrun send
SIGTERM to the ranks left within ~40 ms of one dying): the rank that went first is the root
cause, and the ranks stopped because it went are victims, never culprits.  A job stopped
as a whole (every rank the same signal, or every rank killed unseen) is no fault at all.

Each trace is what the recorder writes: the survivors' ends noted by their death handlers
in their spools ("signal", "Terminated"), the SIGKILLed rank's end forwarded from its spool
as ``gone`` and timed by its last record (helper-73's mp.spawn jobs read healthy, or named
the SIGTERMed rank 0 beside rank 1)."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest
from procs import run_session
from rich.console import Console
from trace_helpers import read_events

from commscope.analysis import TraceModel
from commscope.analysis.diagnose import default_hang_after, diagnose, trace_now
from commscope.analysis.rankstate import ending
from commscope.analysis.synth import S, TraceBuilder
from commscope.commands.check import render

MS = S // 1000
RESET = "RuntimeError: [pair.cc:537] Read error [127.0.0.1]:7406: Connection reset by peer"
GONE = {"reason": "gone", "src": "spool"}
SIGTERM = {"reason": "signal", "signal": "Terminated", "src": "spool"}


def _job(first: dict, *, failed: bool = False, idle_s: float = 0.0, others: dict = SIGTERM) -> TraceModel:
    """3 ranks, 3 all_reduces; rank 1 ends (``first``) after the third, idle ``idle_s`` first
    (its heartbeats go on meanwhile); ranks 0 and 2 wait in the fourth and are stopped 40 ms
    after rank 1 went (``others``), rank 2's all_reduce failing as its connection resets
    where ``failed``."""
    b = TraceBuilder(3, hang_after=2.0)
    t = b.warmup(3)
    last = t - 1_000_000  # rank 1's last record: the end of its third all_reduce
    gone = last + int(idle_s * S)
    ids = {r: b.begin(r, t + r * MS, "all_reduce") for r in (0, 2)}
    b.heartbeats(b.t0, gone, ranks=[0, 1, 2])
    stop = gone + 40 * MS
    b.exit(1, last if first is GONE else gone, **first)
    if failed:
        b.end(2, ids[2], stop - MS, exc=RESET)
    for r in (0, 2):
        b.exit(r, stop, **others)
    return TraceModel.from_events(b.sorted_events())


def _errors(m: TraceModel) -> list[tuple[str, list[int]]]:
    found = diagnose(m, trace_now(m), default_hang_after(m))
    return [(f.kind, f.culprits) for f in found if f.severity == "error"]


@pytest.mark.parametrize("failed", [False, True], ids=["waiting", "op-failed"])
def test_a_rank_killed_unseen_then_its_launcher_stopping_the_rest_is_a_dead_rank(failed):
    m = _job(GONE, failed=failed)
    assert _errors(m) == [("dead_rank", [1])]
    assert ending(m, 1, m.end_ns) == "died (no word)"
    assert ending(m, 0, m.end_ns) == ending(m, 2, m.end_ns) == "job stopped (SIGTERM)"


def test_a_rank_that_crashed_then_its_launcher_stopping_the_rest_blames_no_victim():
    """SIGABRT on rank 1, torchrun SIGTERMs ranks 0 and 2 while rank 2's all_reduce fails:
    one error, the crash (rank 0 'was gone: killed by SIGTERM' was blamed beside it)."""
    m = _job({"reason": "signal", "signal": "Aborted", "src": "spool"}, failed=True)
    assert _errors(m) == [("rank_crashed", [1])]


def test_a_rank_killed_while_the_others_hang_is_dead_from_when_it_was_last_heard():
    """Rank 1 idle for 15 s in a hang (its heartbeats go on), then SIGKILLed: its spool's
    end is timed by its last record, 15 s before it went; it was read as a rank that never
    left ('idle'), its last heartbeat after its exit."""
    m = _job(GONE, idle_s=15.0)
    assert _errors(m) == [("dead_rank", [1])]


@pytest.mark.parametrize("failed", [None, 0, 2], ids=["waiting", "rank 0's op failed", "rank 2's op failed"])
def test_a_rank_killed_before_its_first_op_is_the_dead_rank_though_no_record_listed_the_world(failed):
    """SIGKILL right after init: rank 1 ran no op, and the native recorder's group records
    had no members yet, so the world's group was known only by ranks 0 and 2 (the ones that
    ran it).  Nobody seemed to wait for rank 1 (the job read healthy), or the failing rank's
    peer was rank 2, stopped by mp.spawn (op_failed [2], a victim)."""
    b = TraceBuilder(3, hang_after=2.0)
    t = b.t0 + S
    ids = {r: b.begin(r, t + r * MS, "all_reduce") for r in (0, 2)}
    b.heartbeats(b.t0, t, ranks=[0, 2])
    b.exit(1, t - MS, **GONE)
    stop = t + 40 * MS
    if failed is not None:
        b.end(failed, ids[failed], stop - MS, exc=RESET)
    for r in (0, 2):
        b.exit(r, stop, **SIGTERM)
    b.events[:] = [e for e in b.events if e["type"] != "group"]
    assert _stopped_errors(b) == [("dead_rank", [1])]


def _never_came(failed: int | None, *, ran_before: bool = False) -> TraceBuilder:
    """Rank 1 wrote nothing (it died before ``instrument()``); ranks 0 and 2 wait in the
    world's first all_reduce (``ran_before``: its third, two having completed with rank 1
    writing elsewhere) until a launcher stops them (rank 0 first); ``failed``: the rank whose
    all_reduce failed on a closed connection as the other was stopped."""
    b = TraceBuilder(3, hang_after=2.0)
    b.events[:] = [e for e in b.events if e["rank"] != 1]
    t = b.t0 + S
    if ran_before:
        for _ in range(2):
            t = b.collective(t, "all_reduce") + MS
        b.events[:] = [e for e in b.events if e["rank"] != 1]
    ids = {r: b.begin(r, t + r * MS, "all_reduce") for r in (0, 2)}
    stop = t + S + 500 * MS  # (less than hang_after: a hang cut short)
    b.heartbeats(b.t0, stop - 100 * MS, ranks=[0, 2])
    if failed is not None:
        b.end(failed, ids[failed], stop + 1 + MS, exc=RESET)
    for r in (0, 2):
        b.exit(r, stop + r * MS, **SIGTERM)
    return b


@pytest.mark.parametrize("failed", [None, 2, 0], ids=["waiting", "rank 2's op failed", "rank 0's op failed"])
def test_a_rank_that_never_came_is_the_one_the_stopped_ranks_waited_for(failed):
    """helper-105: under mp.spawn, rank 1 died before ``instrument()`` (nothing of it in the
    trace) while ranks 0 and 2 waited in their first all_reduce; mp.spawn SIGTERMed them.
    Nothing named rank 1: the job read healthy (rank 1's exit, needed to say it left first,
    never came), or rank 2's failure, after rank 0 was stopped, was blamed on rank 0 (a
    victim).  A member of the world that wrote nothing, absent from a collective the stopped
    ranks waited in, of a group none of whose collectives completed, never came."""
    b = _never_came(failed)
    want = [("missing_ranks", [1])] if failed is None else [("op_failed", [1])]
    assert _stopped_errors(b) == want
    if failed is not None:
        m = TraceModel.from_events(b.sorted_events())
        (f,) = [f for f in diagnose(m, trace_now(m), default_hang_after(m)) if f.severity == "error"]
        assert "rank 1 had never come (it wrote nothing to this trace)" in f.message, f.message


def test_a_rank_whose_group_ran_without_it_in_this_trace_is_not_taken_for_one_that_never_came():
    """The same stop after two all_reduces rank 1 completed, its stream in another store (a
    directory a node does not share): it did come; the trace is incomplete, and the job was
    stopped as a whole a moment into a collective (no hang)."""
    b = _never_came(None, ran_before=True)
    assert _stopped_errors(b) == [("trace_incomplete", [1])]


#: The end a spool is forwarded with where nothing noted a SIGTERM could come (the Python
#: recorder notes none)
GONE_UNWATCHED = {**GONE, "term_unwatched": True}


@pytest.mark.parametrize("rank1", ["at its begin", "timed before its begin"])
def test_a_rank_stopped_while_it_waited_for_one_killed_is_no_culprit_under_the_python_recorder(rank1):
    """helper-105: mp.spawn, the Python recorder (no SIGTERM noted: every rank's spool is
    forwarded as gone).  Rank 2 SIGKILLed between ops; ranks 0 and 1 enter all_reduce #4;
    mp.spawn stops rank 1 while it waits there (its end timed at its last record, its
    all_reduce's begin, or earlier: a spool's), and rank 0's all_reduce fails on a reset
    connection.  Both gone before the failure, ranks 1 and 2 were blamed together (and 0 and
    2 when rank 1's failed).  Rank 1 entered the instance and waited there for rank 2, which
    never did: the one absent went first."""
    b = TraceBuilder(3, hang_after=2.0, recorder="python")
    t = b.warmup(3)
    ids = {r: b.begin(r, t + r * MS, "all_reduce") for r in (0, 1)}
    b.heartbeats(b.t0, t - 2 * MS, ranks=[0, 1, 2])
    b.exit(2, t - MS, **GONE_UNWATCHED)  # (its last record: the end of the third all_reduce)
    b.exit(1, t + MS if rank1 == "at its begin" else t - 40 * MS, **GONE_UNWATCHED)
    b.end(0, ids[0], t + 50 * MS, exc=RESET)
    b.exit(0, t + 50 * MS, **GONE_UNWATCHED)
    assert _stopped_errors(b) == [("op_failed", [2])]


def test_a_rank_that_never_came_is_blamed_for_a_failure_under_the_python_recorder():
    """The same under the Python recorder (no SIGTERM noted: rank 2, stopped while it waited,
    is forwarded as gone, timed at its begin): rank 0's failure was blamed on rank 2, a
    victim; rank 1, which wrote nothing, was no candidate (only a member heard from and
    then silent was)."""
    b = TraceBuilder(3, hang_after=2.0, recorder="python")
    b.events[:] = [e for e in b.events if e["rank"] != 1]
    t = b.t0 + S
    ids = {r: b.begin(r, t + r * MS, "all_reduce") for r in (0, 2)}
    b.heartbeats(b.t0, t + S, ranks=[0, 2])
    b.exit(2, t + 2 * MS, **GONE_UNWATCHED)
    b.end(0, ids[0], t + S + 50 * MS, exc=RESET)
    b.exit(0, t + S + 50 * MS, **GONE_UNWATCHED)
    assert _stopped_errors(b) == [("op_failed", [1])]


@pytest.mark.parametrize("case, errors", [
    ("the job stopped as a whole", [("trace_incomplete", [2])]),
    ("rank 1 killed in it", [("dead_rank", [1]), ("trace_incomplete", [2])]),
])
def test_a_rank_another_group_proves_running_is_not_taken_for_one_that_never_came(case, errors):
    """helper-107: rank 2's stream is in another store; it ran the world's first three
    all_reduces (proven running), then ranks 0 and 1 enter a new group's first all_reduce.
    Its own group had not run, so rank 2 was taken for a rank that never came: a whole-job
    stop gave missing_ranks [2], and rank 1's death op_failed [2] (a victim), hiding rank 1."""
    b = TraceBuilder(3, hang_after=2.0, recorder="native")
    b.group("1", [0, 1, 2])
    t = b.warmup(3)
    ids = {r: b.begin(r, t + r * MS, "all_reduce", "1") for r in (0, 1)}
    if case == "the job stopped as a whole":
        b.heartbeats(b.t0, t + 400 * MS, ranks=[0, 1, 2])
        for r in (0, 1):
            b.exit(r, t + 500 * MS + r * MS, **SIGTERM)
    else:
        b.heartbeats(b.t0, t + 200 * MS, ranks=[0, 1, 2])
        b.exit(1, t + 300 * MS, **GONE)
        b.end(0, ids[0], t + 310 * MS, exc=RESET)
        b.exit(0, t + 340 * MS, **SIGTERM)
    b.events[:] = [e for e in b.events if e["rank"] != 2]
    assert _stopped_errors(b) == errors


def test_a_rank_killed_in_the_collective_before_an_absent_one_went_stays_blamed():
    """helper-107: the Python recorder; rank 1 SIGKILLed while it waited in all_reduce #4,
    rank 2 (not in it yet) heard from 35 ms after, then stopped.  Rank 2 did not go before
    rank 1: ``awaited_first`` keeps both (a slack once let it blame rank 2 alone)."""
    b = TraceBuilder(3, hang_after=2.0, recorder="python")
    t = b.warmup(3)
    kill = t + S
    ids = {r: b.begin(r, t + r * MS, "all_reduce") for r in (0, 1)}
    b.heartbeats(b.t0, kill - 5 * MS)
    b.heartbeat(2, kill + 30 * MS)
    b.heartbeat(0, kill + 30 * MS)
    b.exit(1, kill - 5 * MS, **GONE_UNWATCHED)
    b.exit(2, kill + 30 * MS, **GONE_UNWATCHED)
    b.end(0, ids[0], kill + 50 * MS, exc=RESET)
    b.exit(0, kill + 50 * MS, **GONE_UNWATCHED)
    assert _stopped_errors(b) == [("op_failed", [1, 2])]


def _stopped_errors(b: TraceBuilder) -> list[tuple[str, list[int]]]:
    m = TraceModel.from_events(b.sorted_events())
    found = diagnose(m, trace_now(m), default_hang_after(m), wall_ns=m.end_ns + 60 * S)
    return [(f.kind, f.culprits) for f in found if f.severity == "error"]


def test_a_rank_whose_stop_went_unseen_is_no_culprit_where_nobody_waited_for_it():
    """scancel: ranks 0 and 2 note SIGTERM; rank 1's goes unseen (the Python recorder notes
    no signal) and its last heartbeat is 100 ms older: timed alone, it 'went first'
    (helper-80).  Nobody waited for it: a job stopped as a whole."""
    b = TraceBuilder(3, hang_after=2.0)
    t = b.warmup(3)
    stop = t + S
    b.heartbeats(b.t0, stop - 100 * MS)
    for r in (0, 2):
        b.exit(r, stop + r * MS, **SIGTERM)
    b.exit(1, t - MS, **GONE)
    assert _stopped_errors(b) == []


@pytest.mark.parametrize("case, errors", [
    ("killed between ops", [("dead_rank", [1])]),
    ("its SIGTERM noted", []),
    ("the Python recorder", [("dead_rank", [1])]),
    ("the Python recorder, SIGTERM unwatched", []),
    ("the others stopped by SIGINT", []),
    ("heard from after the stop", []),
    ("its program took SIGTERM from the recorder", []),
    ("the others' own handlers took it", [("dead_rank", [1])]),
])
def test_a_rank_killed_unseen_before_the_launcher_stopped_the_rest_is_the_dead_rank(case, errors):
    """The recorder notes a SIGTERM in the spool as it comes (the native one's death handler,
    the Python one's faulthandler), whatever ends the process after.  Rank 1, SIGKILLed (the OOM killer) between ops, ends unseen with
    none noted; mp.spawn SIGTERMs ranks 0 and 2 12 ms later, which note it: no SIGTERM reached
    rank 1, so it was gone before them, and it is the dead rank though nobody waited for it
    (before: "no findings", exit 0).  Not where a SIGTERM was noted for it (it was stopped
    too), nor under a Python recorder that could not watch for it (``term_unwatched``: what
    it said of every rank until it noted SIGTERM, helper-121), nor where the others were
    stopped by SIGINT (not noted), nor where it was heard from after the first stop, nor
    where its spool says a SIGTERM could have come unnoted (``term_unwatched``: the program
    replaced the death handler after init, helper-102).  The first SIGTERM may be one the
    others' own handlers took before they left cleanly (``stop_ts``; helper-102: "no
    findings" there)."""
    b = TraceBuilder(3, hang_after=2.0)
    for e in b.events:
        if e["type"] == "meta":
            e["recorder"] = "python" if case.startswith("the Python recorder") else "native"
    t = b.warmup(3)  # (between two steps: no op open)
    stop = t + S
    b.heartbeats(b.t0, stop - 100 * MS)
    b.heartbeat(1, stop + (50 if case == "heard from after the stop" else -12) * MS)
    others = dict(SIGTERM, signal="Interrupt") if case == "the others stopped by SIGINT" else SIGTERM
    for r in (0, 2):
        if case == "the others' own handlers took it":
            b.exit(r, stop + 20 * MS + r * MS, reason="atexit", **_stop_note(stop + r * MS))
        else:
            b.exit(r, stop + r * MS, **others)
    noted = {"stop_signal": "SIGTERM", "stop_ts": stop - MS} if case == "its SIGTERM noted" else {}
    if case in ("its program took SIGTERM from the recorder", "the Python recorder, SIGTERM unwatched"):
        noted = {"term_unwatched": True}
    b.exit(1, t - MS, **GONE, **noted)
    assert _stopped_errors(b) == errors


def test_a_rank_sigkilled_after_the_stop_in_the_op_the_others_were_in_is_no_culprit():
    """scancel: ranks 0 and 2 note SIGTERM inside an all_reduce rank 1 is in too; rank 1
    (its main thread in a C call: no heartbeat since) is SIGKILLed at the end of the grace
    period.  It entered the op they waited in: it did not make them wait (helper-80)."""
    b = TraceBuilder(3, hang_after=2.0)
    t = b.warmup(3)
    for r in range(3):
        b.begin(r, t + r * MS, "all_reduce")
    stop = t + S
    b.heartbeats(b.t0, stop, ranks=[0, 2])
    b.heartbeats(b.t0, stop - 150 * MS, ranks=[1])
    for r in (0, 2):
        b.exit(r, stop + r * MS, **SIGTERM)
    b.exit(1, t + MS, **GONE)
    assert _stopped_errors(b) == []


@pytest.mark.parametrize("how", ["SIGINT to every rank", "SIGTERM to every rank", "SIGKILL to every rank"])
def test_a_job_stopped_as_a_whole_is_no_fault(how):
    """Ctrl-C, scancel, kill -9 of the whole job while it ran: every rank ended alike, so no
    rank went first.  And the trace says how each ended: no 'no rank wrote an exit event'."""
    end = {"SIGINT to every rank": {"reason": "signal", "signal": "Interrupt", "src": "spool"},
           "SIGTERM to every rank": SIGTERM, "SIGKILL to every rank": GONE}[how]
    b = TraceBuilder(3, hang_after=2.0)
    t = b.warmup(3)  # (between two steps: no op open)
    b.heartbeats(b.t0, t + 100 * MS)
    for r in range(3):
        b.exit(r, t + 100 * MS + r * MS if end is not GONE else t - MS, **end)
    m = TraceModel.from_events(b.sorted_events())
    a_minute_later = m.end_ns + 60 * S  # (check, run on the stored trace afterwards)
    found = diagnose(m, trace_now(m), default_hang_after(m), wall_ns=a_minute_later)
    assert [(f.kind, f.severity) for f in found] == []
    out = io.StringIO()
    render(m, found, [], 2.0, "job", console=Console(file=out, width=80))
    said = {"SIGINT to every rank": "healthy until every rank was stopped by SIGINT\n",
            "SIGTERM to every rank": "healthy until every rank was stopped by SIGTERM\n",
            "SIGKILL to every rank": "the trace looks healthy\n"}[how]  # (nobody saw how those went)
    assert "no findings: the trace looks healthy" in out.getvalue() and said in out.getvalue()


@pytest.mark.parametrize("failed", [False, True], ids=["waiting", "op-failed"])
@pytest.mark.parametrize("gap_s", [60.0, 6.0])
def test_a_rank_stopped_by_a_signal_long_before_the_others_it_left_waiting_is_the_dead_rank(gap_s, failed):
    """Rank 1 SIGTERMed by hand (its death handler notes it) after its third all_reduce;
    ranks 0 and 2 wait for it in the fourth (rank 2's failing as its connection resets,
    where ``failed``), beating, until a scancel stops them ``gap_s`` later.  Rank 1 went
    first: dead_rank, not missing_ranks (helper-80), and the others are no culprits."""
    b = TraceBuilder(3, hang_after=2.0)
    t = b.warmup(3)
    ids = {r: b.begin(r, t + r * MS, "all_reduce") for r in (0, 2)}
    went = t + 5 * MS
    b.exit(1, went, **SIGTERM)
    if failed:
        b.end(2, ids[2], went + MS, exc=RESET)
    stop = went + int(gap_s * S)
    b.heartbeats(b.t0, went, ranks=[1])
    b.heartbeats(b.t0, stop - 500 * MS, ranks=[0, 2])
    for r in (0, 2):
        b.exit(r, stop + r * MS, **SIGTERM)
    m = TraceModel.from_events(b.sorted_events())
    assert _errors(m) == [("dead_rank", [1])]
    assert ending(m, 0, m.end_ns) == ending(m, 2, m.end_ns) == "job stopped (SIGTERM)"


def test_a_rank_stopped_by_the_same_scancel_a_moment_before_the_others_is_no_culprit():
    """scancel: rank 1's SIGTERM lands a second before ranks 0 and 2's (another node), as
    they wait in an all_reduce it has not entered: inside the dead threshold, one stop of
    the whole job, no fault."""
    b = TraceBuilder(3, hang_after=2.0)
    t = b.warmup(3)
    for r in (0, 2):
        b.begin(r, t + r * MS, "all_reduce")
    went = t + 5 * MS
    b.exit(1, went, **SIGTERM)
    b.heartbeats(b.t0, went, ranks=[0, 1, 2])
    for r in (0, 2):
        b.exit(r, went + S + r * MS, **SIGTERM)
    assert _stopped_errors(b) == []


# What a rank stopped by a signal long before the others is not (helper-83's review: each of
# these read as dead_rank under the first form of the rule, a dead threshold apart)

def _errors_at(b: TraceBuilder) -> list[tuple[str, list[int]]]:
    return _errors(TraceModel.from_events(b.sorted_events()))


def _two_groups(world: int, a: list[int], b_ranks: list[int]) -> tuple[TraceBuilder, int]:
    """``world`` ranks, 2 a host, with groups "a" and "b", after one all_reduce in each."""
    b = TraceBuilder(world, hang_after=30.0, sample_interval=1.0, ranks_per_host=2)
    b.group("a", a)
    b.group("b", b_ranks)
    t = b.warmup(3)
    t = b.collective(t, "all_reduce", "a") + MS
    return b, b.collective(t, "all_reduce", "b") + MS


@pytest.mark.parametrize("gap_s", [8.0, 40.0])
def test_ranks_a_launcher_stopped_after_a_crash_are_no_culprits_however_late_the_other_node_stops(gap_s):
    """torchrun on 2 nodes: rank 1 crashes, agent A SIGTERMs ranks 0 and 2 100 ms later,
    node B waits in an all_reduce node A never entered until agent B stops it ``gap_s``
    later: one root cause, the crash (ranks 0 and 2 were named dead beside it)."""
    b = TraceBuilder(6, hang_after=30.0, sample_interval=1.0, ranks_per_host=3)
    t = b.warmup(3)
    for r in (3, 4, 5):
        b.begin(r, t + r * MS, "all_reduce")
    went = t + 50 * MS
    b.exit(1, went, reason="exception", exc="Traceback (most recent call last):\nValueError: bad batch")
    b.heartbeats(b.t0, went + 100 * MS, ranks=[0, 1, 2], interval=S)
    for r in (0, 2):
        b.exit(r, went + 100 * MS + r * MS, **SIGTERM)
    stop = went + int(gap_s * S)
    b.heartbeats(b.t0, stop - 200 * MS, ranks=[3, 4, 5], interval=S)
    for r in (3, 4, 5):
        b.exit(r, stop + r * MS, **SIGTERM)
    assert _errors_at(b) == [("rank_crashed", [1])]


@pytest.mark.parametrize("gap_s", [6.0, 25.0])
def test_a_job_stopped_node_by_node_within_hang_after_is_no_fault(gap_s):
    """An ssh/pkill loop: node A's ranks SIGTERMed while node B's wait in an all_reduce they
    had not entered yet (computing); node B's SIGTERM lands ``gap_s`` later, within
    hang_after (30 s): one stop of the whole job."""
    b = TraceBuilder(6, hang_after=30.0, sample_interval=1.0, ranks_per_host=3)
    t = b.warmup(3)
    for r in (3, 4, 5):
        b.begin(r, t + r * MS, "all_reduce")
    went = t + 30 * MS
    b.heartbeats(b.t0, went, ranks=[0, 1, 2], interval=S)
    for r in (0, 1, 2):
        b.exit(r, went + r * MS, **SIGTERM)
    stop = went + int(gap_s * S)
    b.heartbeats(b.t0, stop - 100 * MS, ranks=[3, 4, 5], interval=S)
    for r in (3, 4, 5):
        b.exit(r, stop + r * MS, **SIGTERM)
    assert _errors_at(b) == []


def test_a_rank_awaited_only_by_a_rank_stopped_with_it_did_not_go_first():
    """Group a = {0, 1}: rank 0 waits a moment for rank 1, and both are stopped by the same
    SIGTERM; ranks 2 and 3 (group b) waited for nobody and are stopped 40 s later.  Who
    waited for rank 1 left with it: no fault (the waits of every stopped rank were pooled)."""
    b, t = _two_groups(4, [0, 1], [2, 3])
    b.begin(0, t, "all_reduce", "a")
    went = t + 20 * MS
    b.heartbeats(b.t0, went, ranks=[0, 1], interval=S)
    for r in (0, 1):
        b.exit(r, went + r * MS, **SIGTERM)
    stop = went + 40 * S
    b.heartbeats(b.t0, stop - 100 * MS, ranks=[2, 3], interval=S)
    for r in (2, 3):
        b.exit(r, stop + r * MS, **SIGTERM)
    assert _errors_at(b) == []


@pytest.mark.parametrize("kind", ["subgroups", "p2p"])
def test_a_hang_before_a_stop_node_by_node_stays_the_hang(kind):
    """Rank 0 stuck computing for 60 s; rank 1 waits for it, rank 2 for rank 1; then ranks 0
    and 1 are stopped, rank 2 40 s later.  Rank 2 had waited for rank 1 past hang_after
    before rank 1 was stopped: the stop did not cause that wait, and the finding is the hang
    on rank 0 (dead_rank [0, 1] named rank 1, which was only waiting)."""
    b, t = _two_groups(3, [0, 1], [1, 2])
    if kind == "subgroups":
        b.begin(1, t, "all_reduce", "a")
        b.begin(2, t + MS, "all_reduce", "b")
    else:
        b.begin(1, t, "recv", peer=0, dir="recv")
        b.begin(2, t + MS, "recv", peer=1, dir="recv")
    stop = t + 60 * S
    b.heartbeats(b.t0, stop, ranks=[0, 1], interval=S)
    for r in (0, 1):
        b.exit(r, stop + r * MS, **SIGTERM)
    end = stop + 40 * S
    b.heartbeats(b.t0, end - 100 * MS, ranks=[2], interval=S)
    b.exit(2, end, **SIGTERM)
    assert _errors_at(b) == [("missing_ranks" if kind == "subgroups" else "unmatched_p2p", [0])]


def _stop_note(ts: int) -> dict:
    return {"stop_signal": "Terminated", "stop_ts": ts}


@pytest.mark.parametrize("bug", [2, 1])
def test_a_genuine_crash_after_a_preemption_notice_stays_a_fault(bug):
    """Every rank's handler takes a SIGTERM (a preemption notice: training goes on to the end
    of the epoch); 20 s later rank ``bug`` raises a genuine ValueError and the others' ops
    fail on it.  The crash is the fault (helper-84: no findings, the job 'stopped')."""
    b = TraceBuilder(3, hang_after=30.0, sample_interval=1.0)
    told = b.warmup(3) + 100 * MS
    t = told + 50 * MS
    for _ in range(200):
        t = b.collective(t, "all_reduce") + 100 * MS
    ids = {r: b.begin(r, t + r * MS, "all_reduce") for r in (0, 1, 2) if r != bug}
    crash = t + 50 * MS
    b.heartbeats(b.t0, crash, interval=S)
    b.exit(bug, crash, reason="exception", exc="Traceback (most recent call last):\nValueError: bad batch",
           **_stop_note(told))
    for r, i in ids.items():
        b.end(r, i, crash + 3 * MS, exc=RESET)
        b.exit(r, crash + 10 * MS, reason="exception", exc="Traceback (most recent call last):\n" + RESET,
               **_stop_note(told + r * MS))
    assert _errors_at(b) == [("rank_crashed", [bug])]


def test_a_hang_before_a_scancel_on_ranks_with_handlers_stays_the_hang():
    """Rank 2 stuck computing for 10 minutes while ranks 0 and 1 wait in an all_reduce; a
    scancel reaches every rank's own handler: rank 2 exits cleanly, the others' op fails on
    the reset.  The hang is the fault, blamed on rank 2 (helper-84: no findings)."""
    b = TraceBuilder(3, hang_after=30.0, sample_interval=1.0)
    t = b.warmup(3)
    ids = {r: b.begin(r, t + r * MS, "all_reduce") for r in (0, 1)}
    stop = t + 600 * S
    b.heartbeats(b.t0, stop, interval=S)
    b.exit(2, stop + 50 * MS, reason="atexit", **_stop_note(stop + 2 * MS))
    for r, i in ids.items():
        b.end(r, i, stop + 55 * MS, exc=RESET)
        b.exit(r, stop + 60 * MS, reason="exception", exc="Traceback (most recent call last):\n" + RESET,
               **_stop_note(stop + r * MS))
    assert _errors_at(b) == [("op_failed", [2])]


def _run_job(tmp_path, source: str, *args: str, hang_after: str | None = None):
    """Run ``source`` (a job script, given a free port and ``args``) under ``commscope run``;
    its run and ``check --json``, and the store."""
    import sys

    from commscope.launch import free_port

    script = tmp_path / "job.py"
    script.write_text(source)
    store = str(tmp_path / "trace")
    opts = ["--hang-after", hang_after] if hang_after else []
    run = run_session([sys.executable, "-m", "commscope", "run", "--store", store, *opts, "--", sys.executable,
                       str(script), str(free_port()), *args], capture_output=True, text=True, timeout=240)
    check = run_session([sys.executable, "-m", "commscope", "check", store, "--json"], capture_output=True,
                        text=True, timeout=50)
    return run, check, store


#: A job script's look at its own store: the events it holds now (none where it cannot be read yet)
EVENTS_OF = """
def events_of(store):
    from commscope.analysis.source import open_source
    try:
        return open_source(store).read_all()
    except Exception:
        return []
"""

SPAWNED = """
import os, signal, sys, time, torch, torch.distributed as dist, torch.multiprocessing as mp
""" + EVENTS_OF + """
def entered(store, n):
    # ranks 0 and 2 are in their n-th all_reduce: its begin is in the store
    events = events_of(store)
    return all(sum(e["type"] == "op" and e["phase"] == "begin" and e["rank"] == r for e in events) >= n for r in (0, 2))

def worker(rank, port, when, store):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=3)
    x = torch.ones(4)
    for i in range(6):
        if rank == 1 and i == when:
            while not entered(store, when + 1):  # (on a loaded host they may not be there yet)
                time.sleep(0.05)
            os.kill(os.getpid(), signal.SIGKILL)
        dist.all_reduce(x)
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(worker, args=(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]), nprocs=3, join=True)
"""


@pytest.mark.parametrize("when", [0, 3], ids=["before-its-first-op", "mid-run"])
def test_a_spawned_rank_sigkilled_is_the_dead_rank_and_the_ranks_spawn_stopped_are_not(tmp_path, when):
    """Real ranks under ``commscope run``: mp.spawn SIGTERMs ranks 0 and 2 once rank 1 is
    SIGKILLed (they are inside an all_reduce rank 1 never came to, or their connection to it
    resets).  helper-73 read 'no findings: the trace looks healthy' (exit 0) in 2 runs of 3,
    and op_failed naming rank 0 in the third.  Rank 1 goes once ranks 0 and 2 are in the
    all_reduce it never comes to (a CI run on 2 loaded cores had them stopped before they
    entered their first: nothing then said they waited for rank 1; that case is the next
    test's, where no SIGTERM noted in its spool says it went first)."""
    import json

    run, check, _store = _run_job(tmp_path, SPAWNED, str(when), str(tmp_path / "trace"))
    assert run.returncode != 0, run.stderr[-2000:]
    assert check.returncode == 1, check.stdout[-2000:] + check.stderr[-2000:]
    found = json.loads(check.stdout)["findings"]
    assert [(f["kind"], f["culprits"]) for f in found if f["severity"] == "error"] == [("dead_rank", [1])]
    assert not any(set(f["culprits"]) & {0, 2} for f in found), found


SPAWNED_BETWEEN_OPS = """
import os, signal, sys, time, torch.distributed as dist, torch.multiprocessing as mp
""" + EVENTS_OF + """
def recording(store, ranks):
    # each of ``ranks`` has written its meta and a heartbeat: its recorder runs, its spool exists
    events = events_of(store)
    return all(any(e["type"] == "heartbeat" and e["rank"] == r for e in events) for r in ranks)

def worker(rank, port, store, others):
    if rank != 1 and others == "graceful":  # (their own handler, set before init: leave cleanly)
        signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=3)
    if rank == 1:
        while not recording(store, (0, 1, 2)):
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGKILL)  # (the OOM killer, right after init)
    while True:  # (loading data: no op yet; mp.spawn stops them once rank 1 is gone)
        time.sleep(0.05)

if __name__ == "__main__":
    mp.spawn(worker, args=(int(sys.argv[1]), sys.argv[2], sys.argv[3]), nprocs=3, join=True)
"""


@pytest.mark.parametrize("others", ["killed", "graceful"])
def test_a_spawned_rank_sigkilled_right_after_init_while_the_others_are_between_ops_is_the_dead_rank(
        tmp_path, others):
    """Real ranks under ``commscope run`` (the native recorder): rank 1 SIGKILLed right after
    init, ranks 0 and 2 between ops (no op yet), SIGTERMed by mp.spawn because it went
    (killed by it, or, ``graceful``, leaving cleanly from a handler of their own).
    Nobody waited for rank 1, but its spool noted no SIGTERM where theirs did: it went
    first (before: "no findings: the trace looks healthy", exit 0; with the others'
    handlers so until helper-102)."""
    import json

    run, check, store = _run_job(tmp_path, SPAWNED_BETWEEN_OPS, str(tmp_path / "trace"), others)
    assert run.returncode != 0, run.stderr[-2000:]
    from commscope.store import open_reader

    events = open_reader(store).read_all()
    assert {e["rank"]: e.get("recorder") for e in events if e["type"] == "meta"} == dict.fromkeys(range(3), "native")
    exits = {e["rank"]: e for e in events if e["type"] == "exit"}
    assert exits[1]["reason"] == "gone" and "term_unwatched" not in exits[1], exits
    if others == "killed":
        assert all(exits[r].get("signal") == "Terminated" for r in (0, 2)), exits
    else:
        assert all(exits[r].get("stop_signal") == "Terminated" and "signal" not in exits[r] for r in (0, 2)), exits
    assert not any(e["type"] == "op" for e in events) and not any(e["type"] == "block" for e in events)
    assert check.returncode == 1, check.stdout[-2000:] + check.stderr[-2000:]
    found = json.loads(check.stdout)["findings"]
    assert [(f["kind"], f["culprits"], f["severity"]) for f in found] == [("dead_rank", [1], "error")], found


#: A job script's end: ranks 0 and 2 SIGTERMed (a scancel), every rank joined, their exit codes printed
SCANCEL_THE_REST = """
    for r in (0, 2):
        os.kill(ranks[r].pid, signal.SIGTERM)
    for p in ranks:
        p.join()
    print("codes", [p.exitcode for p in ranks])
"""

HANDLER_REPLACED = """
import multiprocessing as mp, os, signal, sys, time, torch, torch.distributed as dist
""" + EVENTS_OF + """
def reraise(sig, frame):  # a program's own SIGTERM handler: clean up, then die of it
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)

def worker(rank, port, store, ready):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=3)
    x = torch.ones(4)
    if rank == 1:
        signal.signal(signal.SIGTERM, reraise)  # (after init: it replaces the recorder's death handler)
        from commscope.record import recorder
        while recorder.active().spool is None:  # (opened at init, or by a tick once the job id is settled)
            time.sleep(0.05)
        since = time.time_ns()
        while not any(e["type"] == "heartbeat" and e["rank"] == 1 and e["ts"] > since for e in events_of(store)):
            time.sleep(0.05)  # (a tick begun since, with the spool there: it looked at the handler; heartbeats
                              # emitted before the spool opened reach the store later, all at once)
    for i in range(3):
        dist.all_reduce(x)
    ready.release()
    while True:  # (between ops)
        time.sleep(0.05)

if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    ready = ctx.Semaphore(0)
    ranks = [ctx.Process(target=worker, args=(r, int(sys.argv[1]), sys.argv[2], ready)) for r in range(3)]
    for p in ranks:
        p.start()
    for _ in ranks:
        ready.acquire()
    os.kill(ranks[1].pid, signal.SIGTERM)  # a scancel that reaches rank 1 first
    ranks[1].join()
""" + SCANCEL_THE_REST


#: HANDLER_REPLACED with rank 0 publishing the job id 6 s late (a loaded machine): the others
#: settle none at init, and their spools are opened later, by the recorder's tick
LATE_JOB_ID = HANDLER_REPLACED.replace("""def worker(rank, port, store, ready):
""", """def worker(rank, port, store, ready):
    if rank == 0:
        from commscope.record import jobid
        publish0 = jobid._publish0
        def late(*a, **k):
            time.sleep(6.0)
            return publish0(*a, **k)
        jobid._publish0 = late
""", 1)


#: HANDLER_REPLACED with rank 1 setting its handler just before the stop, no tick between:
#: its recorder thread waits an hour after a tick begun once its records were in (a loaded
#: machine's thread, late), and the stop comes as the handler is set
JUST_BEFORE = HANDLER_REPLACED.replace("""        signal.signal(signal.SIGTERM, reraise)  # (after init: it replaces the recorder's death handler)
""", "", 1).replace("""    for i in range(3):
        dist.all_reduce(x)
    ready.release()
""", """    for i in range(3):
        dist.all_reduce(x)
    if rank == 1:
        rec = recorder.active()
        rec.TICK, rec._next_sample = 3600.0, 0.0  # (the next tick writes a heartbeat, then waits an hour)
        since = time.time_ns()
        while not any(e["type"] == "heartbeat" and e["rank"] == 1 and e["ts"] > since for e in events_of(store)):
            time.sleep(0.05)  # (a tick begun since has ended: the next is an hour away)
        signal.signal(signal.SIGTERM, reraise)
    ready.release()
""", 1)


@pytest.mark.parametrize("script", [HANDLER_REPLACED, LATE_JOB_ID, JUST_BEFORE],
                         ids=["job-id-at-init", "job-id-settled-late", "set-just-before-the-stop"])
def test_a_rank_sigtermed_through_a_handler_set_after_init_is_no_culprit(tmp_path, script):
    """Real ranks under ``commscope run``: rank 1 sets its own SIGTERM handler after init
    (clean up, then die of the signal), which takes the signal from the recorder's death
    handler; a scancel reaches it, then the others.  Rank 1 ends gone with no SIGTERM noted,
    before the others were stopped, but its spool says a SIGTERM could have come unnoted
    (``term_unwatched``): a job stopped as a whole, no fault (helper-102: dead_rank [1]).
    Also where the job id was settled after init, the spool opened by a later tick
    (helper-104: the watch was never started there, and rank 1 read as the dead rank), and
    where the handler is set just before the stop, no tick between (``signal.signal`` notes
    it at once: the tick alone left that window)."""
    import json

    assert len({HANDLER_REPLACED, LATE_JOB_ID, JUST_BEFORE}) == 3
    run, check, store = _run_job(tmp_path, script, str(tmp_path / "trace"))
    assert "codes [-15, -15, -15]" in run.stdout, run.stdout[-2000:] + run.stderr[-2000:]
    exits = {e["rank"]: e for e in read_events(store) if e["type"] == "exit"}
    assert exits[1]["reason"] == "gone" and exits[1].get("term_unwatched") is True, exits
    assert all(exits[r].get("signal") == "Terminated" and "term_unwatched" not in exits[r] for r in (0, 2)), exits
    assert check.returncode == 0, check.stdout[-2000:] + check.stderr[-2000:]
    assert json.loads(check.stdout)["findings"] == []


STOPPED_FIRST = """
import datetime, multiprocessing as mp, os, signal, sys, time, torch, torch.distributed as dist

def worker(rank, port):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=3,
                            timeout=datetime.timedelta(seconds=300))
    x = torch.ones(4)
    for i in range(6):
        if rank == 1 and i == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        try:
            dist.all_reduce(x)
        except RuntimeError:  # its peer is gone: it stays, as an NCCL rank would, until stopped
            while True:
                time.sleep(0.1)

if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    ranks = [ctx.Process(target=worker, args=(r, int(sys.argv[1]))) for r in range(3)]
    for p in ranks:
        p.start()
    ranks[1].join()
    time.sleep(7.0)  # the others stay stuck on rank 1 past hang_after (2 s), then a scancel
""" + SCANCEL_THE_REST


def test_a_real_rank_sigtermed_by_hand_before_a_scancel_is_the_dead_rank(tmp_path):
    """Real ranks under ``commscope run``: rank 1 SIGTERMed (by hand, not by a launcher)
    after three all_reduces; ranks 0 and 2 fail on it and stay until a scancel SIGTERMs them
    7 s later, past hang_after (2 s).  Rank 1 went first: dead_rank [1] (op_failed [1] before, all three being
    "stopped by SIGTERM"); nobody else is named."""
    import json

    run, check, _store = _run_job(tmp_path, STOPPED_FIRST, hang_after="2")
    assert "codes [-15, -15, -15]" in run.stdout, run.stdout[-2000:] + run.stderr[-2000:]
    assert check.returncode == 1, check.stdout[-2000:] + check.stderr[-2000:]
    found = json.loads(check.stdout)["findings"]
    assert [(f["kind"], f["culprits"]) for f in found if f["severity"] == "error"] == [("dead_rank", [1])]
    assert not any(set(f["culprits"]) & {0, 2} for f in found), found
    assert "killed by SIGTERM" in found[0]["message"]


HANDLED = """
import datetime, multiprocessing as mp, os, signal, sys, time, torch, torch.distributed as dist

def worker(rank, port, ready, how):
    if rank == 1 and how == "handler":  # a program that handles SIGTERM itself (a checkpoint on preemption)
        signal.signal(signal.SIGTERM, lambda *a: print("rank 1: SIGTERM, checkpointing", flush=True))
    elif rank == 1:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=3,
                            timeout=datetime.timedelta(seconds=300))
    x = torch.ones(4)
    for i in range(3):
        dist.all_reduce(x)
    ready.release()
    while True:
        dist.all_reduce(x)

if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    ready = ctx.Semaphore(0)
    ranks = [ctx.Process(target=worker, args=(r, int(sys.argv[1]), ready, sys.argv[2])) for r in range(3)]
    for p in ranks:
        p.start()
    for _ in ranks:
        ready.acquire()
    for r in (1, 0, 2):  # a scancel: SIGTERM to every rank (rank 1 first: it lives on, however slow the rest)
        os.kill(ranks[r].pid, signal.SIGTERM)
    for p in ranks:
        p.join()
    print("codes", [p.exitcode for p in ranks])
"""


@pytest.mark.parametrize("how", ["handler", "ignore"])
def test_a_sigterm_a_rank_handles_itself_is_noted_in_its_exit(tmp_path, how):
    """Real ranks under ``commscope run``: SIGTERM to all three; rank 1's own handler takes
    it (``how`` "handler") or it ignores SIGTERM ("ignore"), and it leaves with the failure
    of its all_reduce as ranks 0 and 2 die.  Its exit says it was told to stop (stop_signal,
    stop_ts, noted by the native death handler) only where a handler of its own took it."""
    run, _check, store = _run_job(tmp_path, HANDLED, how)
    assert "codes [-15, 1, -15]" in run.stdout, run.stdout[-2000:] + run.stderr[-2000:]
    exits = {e["rank"]: e for e in read_events(store) if e["type"] == "exit"}
    assert exits[1].get("stop_signal") == ("Terminated" if how == "handler" else None), exits[1]
    assert not any("stop_signal" in exits[r] for r in (0, 2)), exits
    if how == "handler":
        assert 0 < exits[1]["stop_ts"] <= exits[1]["ts"], exits


def test_a_garbled_stop_note_in_a_spool_header_is_no_note():
    """A spool header whose reserved bytes are garbage (an older build, damage) adds no
    stop_signal: a stop_ts past the schema's bound made the whole exit invalid (helper-84)."""
    from commscope.store.spool import Death

    assert Death(stop_signal=15, stop_ns=(1 << 63) - 1).stop_fields() == {}
    assert Death(stop_signal=999, stop_ns=5).stop_fields() == {}
    assert Death(stop_signal=15, stop_ns=5).stop_fields() == {"stop_signal": "Terminated", "stop_ts": 5}


_SIGNAL_DURING_IMPORT = r"""
import importlib.abc, importlib.machinery, os, signal, subprocess, sys
from commscope.commands import run

class SignalOnImport(importlib.abc.MetaPathFinder):
    # (a second SIGTERM that lands while psutil is being imported, as it did under ``timeout``)
    def find_spec(self, name, path, target=None):
        if name != "psutil":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        real = spec.loader.exec_module
        def exec_module(module):
            os.kill(os.getpid(), signal.SIGTERM)
            real(module)
        spec.loader.exec_module = exec_module
        return spec

proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
stop = run._Stop(proc)
sys.meta_path.insert(0, SignalOnImport())
signal.signal(signal.SIGTERM, stop.request)
os.kill(os.getpid(), signal.SIGTERM)
proc.wait(60)
print("asked", stop.asked is not None, "terminated", stop.terminated, flush=True)
"""


def test_a_second_stop_request_during_the_first_never_breaks_the_launcher():
    """``timeout`` (or a user) sends SIGTERM twice in a moment: the second landed while the
    first's handler imported psutil, which it found half made (AttributeError), and
    ``commscope run`` died with exit 3, its job left running (helper-183).  psutil is
    imported before any request can come; both requests are taken (the second: now)."""
    got = subprocess.run([sys.executable, "-c", _SIGNAL_DURING_IMPORT], capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stderr
    assert "asked True terminated" in got.stdout, got.stdout
