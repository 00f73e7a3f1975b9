"""Ranks that departed together are one finding (``rootcause._together``): a lost host's
eight ranks, or one fault that crashes half of a 4k job, name all their ranks in one
``dead_rank`` / ``rank_crashed``, listed by host; departures of another manner, or apart
in time, stay apart.  Every case asserts the exact findings, their culprits, and that no
rank that only waited is blamed."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from commscope.analysis import TraceModel, diagnose
from commscope.analysis.evidence import render
from commscope.analysis.rootcause import TOGETHER_NS, went_together
from commscope.analysis.synth import STOPS, S, TraceBuilder, after_two, stopped_job

MS = 1_000_000


def _text(f) -> str:
    console = Console(width=80, record=True, file=io.StringIO())
    console.print(*render(f))
    return console.export_text()


def _errors(model: TraceModel, now: int) -> list:
    return [f for f in diagnose(model, now, 2.0) if f.severity == "error"]


def _crashes(world: int, fates: dict[int, tuple[int, dict]], per_host: int = 8) -> tuple[TraceModel, int]:
    """Two all_reduces, then every rank enters a third; rank r of ``fates`` exits at the
    given offset (ns after the third's start) with the given exit fields; the others wait
    and keep beating."""
    b, t = after_two(world, per_host)
    for r in range(world):
        b.begin(r, t, "all_reduce")
        if r in fates:
            after, fields = fates[r]
            b.exit(r, t + after, **fields)
        else:
            b.heartbeats(t, t + 30 * S, interval=S, ranks=[r])
    return TraceModel.from_events(b.sorted_events()), t + 30 * S


SEGV = {"reason": "signal", "signal": "SIGSEGV"}
ABRT = {"reason": "signal", "signal": "SIGABRT"}


def _raised(text: str) -> dict:
    return {"reason": "exception", "exc": text}


def test_a_lost_host_is_one_dead_rank_naming_its_ranks_with_the_wait_folded_in():
    """Host node01 (ranks 8-15) goes silent mid-run, its ranks' last beats spread over a
    sample interval; the others enter the next all_reduce and wait for them."""
    b, t = after_two(64)
    lost = list(range(8, 16))
    for r in range(64):
        if r in lost:
            b.heartbeats(t, t + S + (r - 8) * 25 * MS, interval=S // 5, ranks=[r])
        else:
            b.begin(r, t + 2 * S, "all_reduce")
            b.heartbeats(t, t + 60 * S, interval=S // 5, ranks=[r])
    model = TraceModel.from_events(b.sorted_events())
    errors = _errors(model, t + 60 * S)
    assert [(f.kind, f.culprits) for f in errors] == [("dead_rank", lost)], [(f.kind, f.culprits) for f in errors]
    f = errors[0]
    assert f.evidence["together"] == {"first": 8, "hosts": {"node01": lost}}
    assert f.message.startswith("ranks 8, 9, 10, 11, 12, 13, 14, 15 went away together on host node01; first rank 8 ")
    waited = [c for c in f.evidence["consequences"] if c["kind"] == "missing_ranks"]
    assert waited and all(set(c["culprits"]) <= set(lost) for c in waited), waited
    assert set(f.victims) == set(range(64)) - set(lost)  # the waiting ranks, none of them a culprit


def test_half_of_a_4k_job_crashing_at_once_is_one_finding_listed_by_host():
    world = 4096
    model, now = _crashes(world, {r: (1000 + r, SEGV) for r in range(world // 2)})
    errors = _errors(model, now)
    assert [(f.kind, len(f.culprits)) for f in errors] == [("rank_crashed", world // 2)]
    f = errors[0]
    assert f.culprits == list(range(world // 2))
    assert f.evidence["together"]["first"] == 0
    assert list(f.evidence["together"]["hosts"]) == [f"node{h:02d}" for h in range(world // 2 // 8)]
    assert f.evidence["together"]["hosts"]["node03"] == list(range(24, 32))
    assert f.message.startswith("2,048 ranks (0-2047) crashed together on 256 hosts; first rank 0 crashed in "
                                "all_reduce #3 (group 0): a fatal signal: SIGSEGV"), f.message
    json = f.to_json()
    assert json["culprits"] == list(range(world // 2)) and json["evidence"]["together"]["hosts"]["node00"] == list(range(8))
    text = _text(f)
    assert "2,048 ranks went together, on 256 hosts:" in text and "… 248 more hosts" in text, text


@pytest.mark.parametrize(("fates", "expect"), [
    # the same signal on two hosts at the same moment: one finding
    ({**{r: (0, SEGV) for r in (8, 9)}, 20: (5 * MS, SEGV)}, [[8, 9, 20]]),
    # another signal: two
    ({8: (0, SEGV), 9: (0, ABRT)}, [[8], [9]]),
    # exceptions that differ only in digits (a device, an address): one
    ({3: (0, _raised("RuntimeError: CUDA error on device 3 at 0x7f12")),
      5: (MS, _raised("RuntimeError: CUDA error on device 5 at 0x7f80"))}, [[3, 5]]),
    # another exception type: two
    ({3: (0, _raised("RuntimeError: bad batch")), 5: (0, _raised("ValueError: bad batch"))}, [[3], [5]]),
    # a run: each within TOGETHER_NS of the one before, the last far from the first: one
    ({1: (0, SEGV), 2: (TOGETHER_NS, SEGV), 3: (2 * TOGETHER_NS, SEGV)}, [[1, 2, 3]]),
    # apart by more than TOGETHER_NS: two
    ({1: (0, SEGV), 2: (TOGETHER_NS + 1, SEGV)}, [[1], [2]]),
])
def test_only_crashes_of_one_manner_close_in_time_fold(fates, expect):
    model, now = _crashes(32, fates)
    errors = _errors(model, now)
    assert sorted((f.kind, f.culprits) for f in errors) == sorted(("rank_crashed", c) for c in expect), \
        [(f.kind, f.culprits, f.message) for f in errors]
    for f in errors:
        folded = f.evidence.get("together")
        assert (folded is not None) == (len(f.culprits) > 1)
        if folded:
            assert sorted(r for rs in folded["hosts"].values() for r in rs) == f.culprits
            assert folded["first"] == min(f.culprits, key=lambda r: (fates[r][0], r))


def test_a_dead_rank_and_a_crash_at_the_same_moment_stay_two_findings():
    b, t = after_two(16)
    for r in range(16):
        b.begin(r, t, "all_reduce")
        if r == 4:
            b.exit(r, t + S, **SEGV)
        elif r == 5:
            b.heartbeats(t, t + S, interval=S // 5, ranks=[r])
        else:
            b.heartbeats(t, t + 60 * S, interval=S // 5, ranks=[r])
    errors = _errors(TraceModel.from_events(b.sorted_events()), t + 60 * S)
    assert sorted((f.kind, f.culprits) for f in errors) == [("dead_rank", [5]), ("rank_crashed", [4])]
    assert not any("together" in f.evidence for f in errors)


def test_a_crash_caused_by_a_failure_stays_a_consequence_not_a_co_culprit():
    """Rank 6 segfaults; the others' all_reduce then fails on the closed connection and
    rank 2 aborts on it with the same signal a moment later: rank 2 is rank 6's victim."""
    b, t = after_two(8)
    for r in range(8):
        i = b.begin(r, t, "all_reduce")
        if r == 6:
            b.exit(r, t + MS, **SEGV)
            continue
        b.end(r, i, t + 50 * MS, exc="RuntimeError: Connection closed by peer [10.0.0.6]:1234")
        if r == 2:
            b.exit(r, t + 60 * MS, reason="signal", signal="SIGSEGV",
                   exc="RuntimeError: Connection closed by peer [10.0.0.6]:1234")
        else:
            b.heartbeats(t, t + 30 * S, interval=S // 5, ranks=[r])
    errors = _errors(TraceModel.from_events(b.sorted_events()), t + 30 * S)
    assert [(f.kind, f.culprits) for f in errors] == [("rank_crashed", [6])], [(f.kind, f.culprits) for f in errors]
    assert "together" not in errors[0].evidence
    crashed = [c for c in errors[0].evidence["consequences"] if c["kind"] == "rank_crashed"]
    assert [c["culprits"] for c in crashed] == [[2]]


@pytest.mark.parametrize("way", list(STOPS))
def test_each_way_a_wide_job_stops_gives_its_findings_and_no_more(way):
    """The ways ``commscope bench analysis`` times at 16k ranks, at 256: exactly the
    findings each must give (one per root cause, no victim named), judged as a console
    judges it (a job stopped as a whole at its end, else a minute after it stopped)."""
    world = 256
    events, t = stopped_job(world, way)
    model = TraceModel.from_events(events)
    stop = STOPS[way]
    got = [(f.kind, f.culprits) for f in diagnose(model, model.end_ns if stop.whole else t + 60 * S, 2.0)]
    assert got == stop.expect(world), [(f.kind, f.culprits, f.message[:160]) for f in diagnose(model, t + 60 * S, 2.0)]


def test_a_way_a_job_stops_that_is_not_known_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown way a job stops: 'melted'; known: every all_reduce timed out"):
        stopped_job(8, "melted")


def test_a_lost_host_noticed_two_ways_is_one_finding():
    """(Review) Data-parallel groups span two hosts; host node01 is lost.  Rank 0's
    all_reduce fails on the closed connection, so its peer rank 8 is found vanished, the
    other seven silent: how each was noticed, not how they went; one finding."""
    b = TraceBuilder(16, sample_interval=0.2, ranks_per_host=8)
    for i in range(8):
        b.group(f"dp{i}", [i, i + 8])
    t = b.t0 + S // 10
    for _ in range(2):
        for i in range(8):
            b.collective(t, "all_reduce", f"dp{i}")
        t += 2 * MS
    b.heartbeats(b.t0, t + 100 * MS, interval=S // 5, ranks=list(range(8, 16)))
    for i in range(8):
        op = b.begin(i, t + 200 * MS, "all_reduce", f"dp{i}")
        if i == 0:
            b.end(i, op, t + 300 * MS, exc="RuntimeError: Connection closed by peer [10.0.0.2]:1234")
        b.heartbeats(b.t0, t + 60 * S, interval=S // 5, ranks=[i])
    model = TraceModel.from_events(b.sorted_events())
    for now in (t + 5 * S, t + 60 * S):
        errors = _errors(model, now)
        assert [(f.kind, sorted(f.culprits)) for f in errors] == [("dead_rank", list(range(8, 16)))], \
            [(f.kind, f.culprits, f.evidence.get("how")) for f in errors]


def test_the_first_to_go_is_named_first_and_its_stack_comes_first():
    """(Review) Rank 12 crashes a millisecond before ranks 0-15 of its job's first two
    hosts: the evidence is rank 12's, so are the first culprit (the console goes to its op)
    and the first stack shown."""
    model, now = _crashes(32, {r: (0 if r == 12 else MS, SEGV) for r in range(16)})
    (f,) = _errors(model, now)
    assert f.culprits[0] == 12 and sorted(f.culprits) == list(range(16))
    assert f.evidence["together"]["first"] == 12 and list(f.evidence["stack_info"])[0] == "12"
    assert f.message.startswith("16 ranks (0-15) crashed together on hosts node00, node01; first rank 12 crashed")
    assert f.to_json()["culprits"] == list(range(16))  # the JSON sorts them


def test_one_signal_folds_however_a_record_names_it():
    """(Review) faulthandler's crash file says 'Segmentation fault' (and a 'Fatal Python
    error' header); a launcher's record says SIGSEGV.  One fault: one finding."""
    faulthandler = {"reason": "signal", "signal": "Segmentation fault", "exc": "Fatal Python error: Segmentation fault"}
    model, now = _crashes(32, {3: (0, faulthandler), 5: (MS, SEGV)})
    assert [(f.kind, sorted(f.culprits)) for f in _errors(model, now)] == [("rank_crashed", [3, 5])]


def test_ranks_on_hosts_not_known_are_said_so():
    model, now = _crashes(32, {8: (0, SEGV), 9: (MS, SEGV), 20: (2 * MS, SEGV)})
    assert model.ranks[20].meta.get("host") == "node02"
    model.ranks[20].meta.pop("host")
    (f,) = _errors(model, now)
    assert f.message.startswith("ranks 8, 9, 20 crashed together on host node01 and hosts not known; first rank 8")
    assert f.evidence["together"]["hosts"] == {"node01": [8, 9], "?": [20]}


def test_ranks_that_left_through_os_exit_with_other_codes_stay_apart():
    """(Review) Digits are set aside in what a crash said, not in how a rank was killed:
    os._exit(1) and os._exit(3) are two ways to go."""
    b, t = after_two(16)
    for r in range(16):
        b.begin(r, t, "all_reduce")
        if r in (4, 5):
            b.exit(r, t + MS * r, reason="os._exit", code=r - 3)
        else:
            b.heartbeats(t, t + 60 * S, interval=S // 5, ranks=[r])
    errors = _errors(TraceModel.from_events(b.sorted_events()), t + 60 * S)
    assert sorted((f.kind, f.culprits) for f in errors) == [("dead_rank", [4]), ("dead_rank", [5])], \
        [(f.kind, f.culprits, f.message) for f in errors]


def test_a_long_run_read_last_rank_first_is_the_finding_already_seen():
    """Ranks 0-4 crash 1.5 s apart (one run, 6 s from first to last).  A console that read
    rank 4's crash alone first, then the others, is shown one finding (one alert): the run
    that starts 6 s before the crash it saw is the same departure (``went_together``: a
    rank in common, gone at the same moment in both).  A crash of rank 4 10 s after the run,
    or of rank 0 1.5 s after it (within 2 s of the run's last departure: a restart's), is a
    new one."""
    step = 3 * TOGETHER_NS // 4
    run = {r: (r * step, SEGV) for r in range(5)}
    model, now = _crashes(32, run)
    (whole,) = _errors(model, now)
    assert whole.culprits == [0, 1, 2, 3, 4] and whole.gone == {r: whole.ts + r * step for r in range(5)}
    model, now = _crashes(32, {4: run[4]})
    (alone,) = _errors(model, now)
    assert alone.culprits == [4] and alone.ts - whole.ts == 4 * step > TOGETHER_NS
    assert went_together(alone, whole) and went_together(whole, alone)
    for rank, after in ((4, 4 * step + 10 * S), (0, 5 * step)):
        model, now = _crashes(32, {rank: (after, SEGV)})
        (again,) = _errors(model, now)
        assert again.culprits == [rank] and not went_together(again, whole) and not went_together(whole, again)
