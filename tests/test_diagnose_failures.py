"""diagnose() on failures: crashed and killed ranks, failed ops, one root cause per incident.

Every scenario is replayed the way a live console sees it: events arrive in time order in
small batches and the trace is judged after each one, at that moment.  At no moment may
an error finding name a rank other than the culprit; at the end exactly the root cause
remains, with its consequences as evidence.
"""

from __future__ import annotations

import json

import pytest

from commscope.analysis import TraceModel, diagnose, rankstate, stacks
from commscope.analysis.errors import (
    FAULTED,
    INTERRUPTED,
    LOCAL,
    NAMED,
    PEER_GONE,
    RELAYED,
    TIMEOUT,
    classify,
)
from commscope.analysis.stacks import fold
from commscope.analysis.synth import S, TraceBuilder

MS = 1_000_000
CLOSED = ("RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
          "[127.0.0.1]:17102. This is typically caused by a remote worker crashing.")
RESET = "RuntimeError: [../pair.cc:537] Read error [127.0.0.1]:58529: Connection reset by peer."
TIMED_OUT = "RuntimeError: [../unbound_buffer.cc:78] Timed out waiting 1000ms for recv operation to complete"
MONITORED = ("RuntimeError: [Rank 0]: Rank 1 failed to pass monitoredBarrier in 1000 ms\n Original exception: \n"
             "[../unbound_buffer.cc:78] Timed out waiting 998ms for recv operation to complete")
RELAY = ("RuntimeError: Rank 2 successfully reached monitoredBarrier, but received errors while waiting for "
         "send/recv from rank 0. Please check rank 0 logs for faulty rank.\n Original exception: \n" + CLOSED)



def stack(func: str, line: int = 30, *, inside: bool = False) -> list[dict]:
    frames = [["/job/train.py", 100, "<module>"], ["/job/train.py", line, func]]
    if inside:
        frames += [["/venv/lib/python3.11/site-packages/commscope/record/patch.py", 80, "wrapper"],
                   ["/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", 2500, "all_reduce"]]
    return [{"tid": 1, "name": "MainThread", "op_thread": True, "frames": frames},
            {"tid": 2, "name": "loader", "frames": [["/job/data.py", 5, "load"]]}]


def replay(b: TraceBuilder, culprits: set[int], hang_after: float = 2.0, step: int = 7, end: int | None = None):
    """Feed the events in time order, diagnose after every batch (at that batch's time) and
    check no error finding ever names a rank outside ``culprits``.  Returns the model and
    the findings at the end (judged at ``end``, default the trace's last timestamp)."""
    events = sorted(b.events, key=lambda e: e["ts"])
    m = TraceModel()
    for k in range(0, len(events), step):
        batch = events[k:k + step]
        m.ingest(batch)
        now = batch[-1]["ts"]
        for f in diagnose(m, now=now, hang_after=hang_after):
            json.dumps(f.to_json())
            if f.severity == "error":
                assert set(f.culprits) <= culprits, (now - b.t0, f.to_json())
    f = diagnose(m, now=end, hang_after=hang_after)
    for x in f:
        json.dumps(x.to_json())
    return m, f


def errors(findings):
    return [(f.kind, f.culprits) for f in findings if f.severity == "error"]


# ---------------------------------------------------------------------- text rules
def test_a_ring_of_batch_isend_irecv_with_a_recv_never_posted_names_its_rank_after_the_timeouts():
    """A ring of batch_isend_irecv in which rank 1 posts no recv from rank 0: rank 0's isend
    waits, ranks 1-3 go on into all_reduce #4; Gloo's timeouts end both and every rank
    crashes.  Live, an unmatched_p2p on rank 1; after, "ranks 0, 1 crashed together", rank 0
    a victim: the all_reduce's timeout was blamed on rank 0, which had not entered it, its
    isend's failure not seen as what held it (its irecv, begun after, not failed; helper-186).
    Rank 1 alone."""
    b = TraceBuilder(4)
    t = b.warmup()
    sends = {}
    for r in range(4):
        c = b.begin(r, t, "batch_isend_irecv", seq=None)
        sends[r] = b.begin(r, t + 100, "isend", peer=(r + 1) % 4, dir="send", parent=c, **{"async": True})
        recv = b.begin(r, t + 200, "irecv", peer=(r - 1) % 4, dir="recv", parent=c, **{"async": True}) \
            if r != 1 else None
        b.end(r, c, t + 400)
        b.phase(r, sends[r], t + 500, "wait_begin")
        if r != 0:  # (rank 0's send waits for the recv rank 1 never posts)
            b.end(r, sends[r], t + MS)
            if recv is not None:
                b.end(r, recv, t + MS)
    ids = {r: b.begin(r, t + 2 * MS + r * 100, "all_reduce") for r in (1, 2, 3)}
    b.heartbeats(b.t0, t + 10 * S)
    b.end(0, sends[0], t + 10 * S, exc=TIMED_OUT.replace("recv", "send"))
    for r in (1, 2, 3):
        b.end(r, ids[r], t + 10 * S + 2 * MS + r * 100, exc=TIMED_OUT)
    for r in range(4):
        b.exit(r, t + 10 * S + 10 * MS + r * MS, reason="exception",
               exc=TIMED_OUT.replace("recv", "send") if r == 0 else TIMED_OUT)
    _, f = replay(b, {1}, hang_after=3.0)
    assert [x.culprits for x in f if x.severity == "error"] == [[1]], [x.to_json()["message"] for x in f]


def test_a_failure_blamed_on_a_rank_held_in_a_failure_nobody_is_to_blame_for_is_its_consequence():
    """Rank 1 posts an isend to rank 0 and never waits for it (torch may drop its message),
    then waits in a barrier; rank 0's recv from rank 1 times out though rank 1 posted (no
    rank to blame), and the barrier's timeout is blamed on rank 0, held in that recv.  The
    barrier's failure stood as a second error naming nobody, its message "blamed on rank 0"
    (helper-186).  One error: the recv's, the barrier's its consequence."""
    b = TraceBuilder(2)
    t = b.warmup()
    b.async_op(1, t, None, None, "isend", peer=0, dir="send")
    r = b.begin(0, t + MS, "recv", peer=1, dir="recv")
    k = b.begin(1, t + 2 * MS, "barrier")
    b.heartbeats(b.t0, t + 10 * S)
    b.end(0, r, t + 10 * S, exc=TIMED_OUT)
    b.end(1, k, t + 10 * S + 2 * MS, exc=TIMED_OUT)
    for rank in range(2):
        b.exit(rank, t + 10 * S + 10 * MS + rank * MS, reason="exception", exc=TIMED_OUT)
    _, f = replay(b, {0, 1}, hang_after=3.0)
    got = [x for x in f if x.severity == "error"]
    assert len(got) == 1 and got[0].kind == "op_failed" and got[0].op == "recv", [x.to_json()["message"] for x in f]
    assert ("op_failed", "barrier") in [(c["kind"], c["op"]) for c in got[0].evidence["consequences"]]


def test_a_crash_is_said_to_be_in_the_op_that_raised_not_an_async_op_not_waited_for():
    """Rank 0 posts an irecv from rank 1 and, not waiting for it, blocks in all_reduce #4,
    which fails as rank 1 raises on its own: rank 0's crash was "in irecv #1 from 1 ...
    (inside all_reduce)" (helper-186).  It crashed in all_reduce #4."""
    b = TraceBuilder(2)
    t = b.warmup()
    b.async_op(0, t, None, None, "irecv", peer=1, dir="recv")
    i = b.begin(0, t + MS, "all_reduce")
    b.exit(1, t + 2 * S, reason="exception", exc="ValueError: bad batch")
    b.end(0, i, t + 2 * S + MS, exc=CLOSED)
    b.exit(0, t + 2 * S + 5 * MS, reason="exception", exc=CLOSED)
    b.heartbeats(b.t0, t + 2 * S)
    _, f = replay(b, {1}, hang_after=3.0)
    assert errors(f) == [("rank_crashed", [1])], [x.to_json()["message"] for x in f]
    crash = next(c for c in f[0].evidence["consequences"] if c["kind"] == "rank_crashed")
    assert crash["message"].startswith("rank 0 crashed in all_reduce #4 (group 0)"), crash["message"]


def test_a_crash_inside_a_wait_is_said_to_be_in_the_op_waited_for():
    """Rank 0 posts an irecv from rank 1, then an isend to it, and dies of a segfault inside
    the irecv's wait(): its crash was said "in isend #1 to 1", the last op pending, never waited
    for (helper-190).  It crashed in irecv #1, the op it was blocked in."""
    b = TraceBuilder(2)
    t = b.warmup()
    b.async_op(0, t, t + 2 * MS, None, "irecv", peer=1, dir="recv")
    b.async_op(0, t + MS, None, None, "isend", peer=1, dir="send")
    b.heartbeats(b.t0, t + S)
    b.exit(0, t + S, reason="signal", signal="Segmentation fault")
    _, f = replay(b, {0}, hang_after=3.0)
    assert errors(f) == [("rank_crashed", [0])], [x.to_json()["message"] for x in f]
    assert f[0].message.startswith("rank 0 crashed in irecv #1 from 1"), f[0].message


def test_a_broadcast_root_with_the_wrong_size_is_named_not_the_ranks_it_aborted():
    """The root broadcasts 3 elements where ranks 1 and 2 expect 2: Gloo aborts them, and
    the root, done, goes on into all_reduce #5, which fails.  The mismatch was folded into
    that failure, blamed on the ranks it aborted: its culprit, rank 0, was chased to what
    it waited on after (helper-191).  The mismatch is the root, naming rank 0."""
    b = TraceBuilder(3)
    t = b.warmup()
    for r in range(3):
        i = b.begin(r, t + r * 100_000, "broadcast", root=0, shape=(3,) if r == 0 else (2,))
        if r == 0:
            b.end(r, i, t + MS)
    for r in (1, 2):
        b.exit(r, t + MS, reason="signal", signal="Aborted",
               exc="gloo::EnforceNotMet: [enforce fail at gloo/transport/tcp/pair.cc:446] Received data size "
                   "doesn't match expected size")
    j = b.begin(0, t + 2 * MS, "all_reduce")
    b.end(0, j, t + 20 * MS, exc=CLOSED)
    b.exit(0, t + 21 * MS, reason="exception", exc=CLOSED)
    b.heartbeats(b.t0, t)
    _, f = replay(b, {0}, hang_after=3.0)
    assert errors(f) == [("collective_mismatch", [0])], [x.message for x in f]
    assert {(c["kind"], tuple(c["culprits"])) for c in f[0].evidence["consequences"]} >= {("op_failed", (1, 2))}


def test_a_crash_after_a_re_init_is_said_after_its_last_op():
    """Rank 1 destroyed its group, initialised again, ran on and crashed: its crash was said
    "after its process group ended", the first incarnation's exit taken for its end
    (helper-194).  It crashed after its last op."""
    b = TraceBuilder(2)
    t = b.warmup()
    for r in range(2):
        b.exit(r, t + MS, reason="destroy_process_group")
    t = b.collective(t + 2 * MS, "all_reduce") + MS
    b.exit(1, t + MS, reason="exception", exc="ValueError: corrupt batch")
    b.heartbeats(b.t0, t + S)
    f = judged(b)
    crash = next(x for x in f if x.kind == "rank_crashed")
    assert crash.message.startswith("rank 1 crashed after all_reduce #"), crash.message


def judged(b: TraceBuilder, hang_after: float = 3.0):
    """The findings of the whole trace, read at once, judged at its end."""
    m = TraceModel()
    m.ingest(b.sorted_events())
    return diagnose(m, hang_after=hang_after)


@pytest.mark.parametrize("late", [2, None])
def test_a_failure_caught_long_ago_explains_no_later_hang(late):
    """World all_reduce #4 times out on the ranks in it (rank 2, and rank 3 with ``late``
    None, late), every rank catches it and goes on; 20 collectives later rank 3 waits in
    group H's all_reduce for rank 0, which never comes.  Rank 0, the old failure's victim,
    was read as waiting on its culprits still: H's hang was folded into the old failure
    (rank 0 named nowhere), or named rank 2, not in H; the failure's culprit 3, waiting in H
    since, was chased to rank 0 (helper-192).  Each stands on its own."""
    b = TraceBuilder(4)
    b.group("H", [0, 3])
    t = b.warmup()
    on_time = (0, 1, 3) if late else (0, 1)
    for r in range(4):
        i = b.begin(r, t if r in on_time else t + 5 * S, "all_reduce")
        b.end(r, i, t + S if r in on_time else t + 6 * S, exc=TIMED_OUT)
    t2 = t + 7 * S
    for _ in range(20):
        t2 = b.collective(t2, "all_reduce") + MS
    b.sync(3, t2 + S, None, "all_reduce", group="H")
    b.heartbeats(b.t0, t2 + 20 * S)
    got = sorted((f.kind, f.group, f.culprits) for f in judged(b) if f.severity == "error")
    assert got == [("missing_ranks", "H", [0]), ("op_failed", "0", [2] if late else [2, 3])], got


def test_a_p2p_failure_long_before_a_collective_does_not_hold_its_rank_away():
    """Rank 1's recv from rank 2 times out and is caught; 90 s later ranks 0 and 2 enter a
    barrier rank 1 never enters, which times out.  The barrier's failure was blamed on rank
    2, in the barrier, "through" rank 1's old recv (helper-192): rank 1 sat idle since."""
    b = TraceBuilder(3)
    t = b.warmup()
    i = b.begin(1, t, "recv", peer=2, dir="recv")
    b.end(1, i, t + 10 * S, exc=TIMED_OUT)
    ids = {r: b.begin(r, t + 100 * S + r * MS, "barrier") for r in (0, 2)}
    for r in (0, 2):
        b.end(r, ids[r], t + 110 * S + r * MS, exc=TIMED_OUT)
    b.heartbeats(b.t0, t + 115 * S)
    got = sorted((f.op, f.culprits) for f in judged(b) if f.severity == "error")
    assert got == [("barrier", [1]), ("recv", [2])], got


def test_a_failure_nobody_is_to_blame_for_takes_in_no_failure_before_it():
    """Rank 1's recv from rank 2 times out (rank 2 never sent); Gloo closes rank 1's pairs,
    and the barrier ranks 0 and 2 enter 4 s later fails at once, naming nobody.  The recv's
    failure was folded into the barrier's, rank 2 among its victims, though the recv failed
    before the barrier began: rank 2 was named nowhere (a real job of helper-192's)."""
    b = TraceBuilder(3)
    t = b.warmup()
    i = b.begin(1, t, "recv", peer=2, dir="recv")
    b.end(1, i, t + 3 * S, exc=TIMED_OUT.replace("1000ms", "3000ms"))
    ids = {r: b.begin(r, t + 7 * S + r * MS, "barrier") for r in (0, 2)}
    for r in (0, 2):
        b.end(r, ids[r], t + 7 * S + 5 * MS, exc=CLOSED)
    b.heartbeats(b.t0, t + 11 * S, ranks=[0, 2])
    b.heartbeats(b.t0, t + 16 * S, ranks=[1])
    for r in (0, 2):
        b.exit(r, t + 11 * S + r * MS, reason="os._exit", code=0)
    b.exit(1, t + 16 * S, reason="os._exit", code=0)
    got = [(f.op, f.culprits) for f in judged(b, 2.0) if f.severity == "error"]
    assert ("recv", [2]) in got, got


def test_a_crash_of_a_failure_blamed_on_it_and_on_an_idle_rank_names_both():
    """Rank 0 waits in pair S's all_reduce for rank 1, which is in the world's; rank 3 waits
    in a recv from rank 1; rank 2 is idle.  The timeouts end the waits and those ranks crash
    of them.  The world's failure, blamed on ranks 0, 1 and 2, led through rank 0 (waiting
    on 1) to ranks 1 and 2, was folded into rank 1's crash: rank 2, idle and alive, was named
    nowhere (helper-192).  One failure names ranks 1 and 2, the crashes its consequences."""
    b = TraceBuilder(4)
    b.group("S", [0, 1])
    t = b.warmup()
    b.collective(t - 500 * MS, "all_reduce", "S")
    ids = {0: b.begin(0, t, "all_reduce", group="S"), 1: b.begin(1, t + MS, "all_reduce"),
           3: b.begin(3, t + 2 * MS, "recv", peer=1, dir="recv")}
    b.heartbeats(b.t0, t + 12 * S)
    for r, i in ids.items():
        b.end(r, i, t + 10 * S + r * MS, exc=TIMED_OUT)
        b.exit(r, t + 10 * S + r * MS + 5 * MS, reason="exception", exc=TIMED_OUT)
    (root,) = [f for f in judged(b) if f.severity == "error"]
    assert (root.kind, root.group, root.culprits) == ("op_failed", "0", [1, 2]), root.message
    assert sorted(c["culprits"][0] for c in root.evidence["consequences"] if c["kind"] == "rank_crashed") == [0, 1, 3]


def test_an_exception_raised_from_another_says_both_and_its_first_words():
    """torch's pipelining raises ``RuntimeError("\\n   [Stage 1] failed to run forward ...")``
    from the stage's own error: a crash said "RuntimeError: ," (its first line, the type
    alone) and nothing of the cause (helper-186).  The type's line joins the next; the cause
    is said on a last line."""
    from commscope.analysis.errors import first_line
    from commscope.record.ops import fmt_exc

    def stage():
        raise ValueError("stage 1: shape bug")

    try:
        try:
            stage()
        except ValueError as e:
            raise RuntimeError("\n            [Stage 1] failed to run forward:\n            args: ()\n") from e
    except RuntimeError as e:
        said = fmt_exc(e)
    assert said.endswith("\n(raised from ValueError: stage 1: shape bug)"), said
    assert first_line(said) == "RuntimeError: [Stage 1] failed to run forward:"
    # (a crash's message says the cause too: it said only the stage's line, the cause in the
    # JSON alone, helper-191)
    from commscope.analysis.failures import death_message

    assert death_message({"exc": said}) == ("RuntimeError: [Stage 1] failed to run forward: "
                                            "(raised from ValueError: stage 1: shape bug)")
    assert first_line("RuntimeError: [../pair.cc:537] Read error") == "RuntimeError: Read error"
    assert fmt_exc(ValueError("plain")) == "ValueError: plain"
    # (what it was raised from is not its own words: a local error raised while handling a
    # timeout classified as a timeout, and no rank was blamed, helper-190)
    try:
        try:
            raise RuntimeError(TIMED_OUT)
        except RuntimeError:
            raise ValueError("bad batch shape")  # noqa: B904 (raised while handling it, as user code does)
    except ValueError as e:
        local = fmt_exc(e)
    assert "(raised from RuntimeError:" in local and classify(local).kind == LOCAL, local
    assert first_line("RuntimeError: \n(raised from KeyError: 'k')") == "RuntimeError:"


def test_exception_texts_are_classified():
    assert classify(CLOSED).kind == PEER_GONE and classify(RESET).kind == PEER_GONE
    assert classify(TIMED_OUT).kind == TIMEOUT
    assert classify(MONITORED) == (NAMED, (1,))
    assert classify("[Rank 0]: Ranks 1, 3 failed to pass monitoredBarrier in 5000 ms") == (NAMED, (1, 3))
    assert classify(RELAY) == (RELAYED, (0,))
    assert classify("RuntimeError: ProcessGroupGloo::allgather: invalid tensor size at index 0").kind == LOCAL
    assert classify("KeyboardInterrupt").kind == INTERRUPTED
    assert classify("RuntimeError: KeyboardInterrupt raised by the user's code").kind == LOCAL
    # (the varlen toolkit names the ranks at fault, global ranks where a group's differ; not the
    # ranks a disagreement lists "on ranks [...]": helper-178 saw every rank blamed)
    assert classify("ValueError: all_gather_v: dtype differs across ranks (float32 on ranks [0, 2, 3]; float64 on "
                    "ranks [1]); offending ranks [1]") == (FAULTED, (1,))
    assert classify("ValueError: gather_v: ranks [1] (global [3]) passed a nested tensor; ranks [2] (global [5]) "
                    "passed a meta tensor") == (FAULTED, (3, 5))
    assert classify("ValueError: recv_tensors: the sender (rank 0) failed: it passed a bare tensor") == (FAULTED, (0,))
    assert classify("ValueError: send_tensors: expected a list or tuple of tensors, got int").kind == LOCAL


def test_stacks_fold_the_plumbing_and_keep_user_frames():
    v = fold("MainThread", stack("step", 42, inside=True)[0]["frames"])
    assert v["frames"] == ["/job/train.py:100 in <module>", "/job/train.py:42 in step"]
    assert v["where"] == "/job/train.py:42 in step" and v["inside"] == "all_reduce" and v["folded"] == 2
    demo = fold("MainThread", [["/x/commscope/scenarios/runner.py", 5, "_rank_main"],
                               ["/x/commscope/scenarios/workloads.py", 9, "dead_rank"]])
    assert demo["where"] == "/x/commscope/scenarios/workloads.py:9 in dead_rank"  # demo workloads are user code
    c10d = "/v/lib/python3.11/site-packages/torch/distributed/"
    spied = fold("MainThread", [["/job/hang.py", 7, "<module>"],  # (py-spy's qualified names: helper-171 saw
                                [c10d + "c10d_logger.py", 81, "_exception_logger.<locals>.wrapper"],  # 'inside
                                [c10d + "distributed_c10d.py", 2790, "broadcast"]])  # _exception_logger...')
    assert spied["where"] == "/job/hang.py:7 in <module>" and spied["inside"] == "broadcast"
    deprecated = fold("MainThread", [["/job/hang.py", 8, "<module>"],  # (torch's ``deprecated`` wrapper: helper-182
                                     [c10d + "c10d_logger.py", 81, "_exception_logger.<locals>.wrapper"],  # saw
                                     ["/v/lib/python3.11/site-packages/typing_extensions.py", 3140,  # "at typing_
                                      "deprecated.__call__.<locals>.wrapper"],  # extensions.py:3140")
                                     [c10d + "distributed_c10d.py", 4300, "reduce_scatter_tensor"]])
    assert deprecated["where"] == "/job/hang.py:8 in <module>" and deprecated["inside"] == "reduce_scatter_tensor"


def _stack_event() -> dict:
    return {"type": "stack", "rank": 0, "ts": 5, "v": 3, "reason": "hang", "threads": [
        {"tid": 1, "name": "MainThread", "op_thread": True, "frames": stack("step", 42, inside=True)[0]["frames"]},
        {"tid": 2, "name": "pin_memory", "frames": [["/job/data.py", 3, "load"]]}]}


def test_a_stack_is_folded_once_and_each_caller_gets_views_of_its_own(monkeypatch):
    """A diagnosis folds every waiting rank's stack each time: an event is folded once in
    its rank's memo, and equal threads of other events once for all (16k ranks waiting in
    one collective capture one stack); what a caller does to the views it got reaches no
    other caller; a memo past ``MEMO_HELD`` events, and the folds shared past
    ``FOLDS_HELD`` threads, are emptied; threads that are not JSON are folded each time."""
    folded = []
    real = stacks.fold
    monkeypatch.setattr(stacks, "fold", lambda *a: folded.append(a) or real(*a))
    monkeypatch.setattr(stacks, "_FOLDS", {})
    monkeypatch.setattr(stacks, "_folds_bytes", 0)
    ev, memo = _stack_event(), {}
    a, b = stacks.view(ev, memo), stacks.view(ev, memo)
    assert a == b == [real("MainThread", ev["threads"][0]["frames"])] and len(folded) == 1
    assert a is not b and a[0] is not b[0] and a[0]["frames"] is not b[0]["frames"]
    a[0]["frames"].append("elsewhere")
    a[0]["where"] = "elsewhere"
    assert stacks.view(ev, memo) == b and len(folded) == 1
    other = _stack_event()  # (equal, another event: its threads' folds shared)
    assert stacks.view(other, memo) == b and stacks.view(ev) == b and stacks.view(other, {}) == b
    assert len(folded) == 1
    moved = _stack_event()
    moved["threads"][0]["frames"][1][1] += 1  # (the user's frame on another line: folded for itself)
    assert stacks.view(moved, memo) != b and len(folded) == 2
    events = [_stack_event() for _ in range(stacks.MEMO_HELD)]
    for e in events:
        stacks.view(e, memo)
    assert len(memo) <= stacks.MEMO_HELD and all(memo[id(e)][0] is e for e in events[-2:])
    assert stacks.view(ev, memo) == b and len(folded) == 2  # (its memo emptied: its fold still shared)
    monkeypatch.setattr(stacks, "FOLDS_HELD", 3)
    for line in range(3):
        e = _stack_event()
        e["threads"][0]["frames"][1][1] = 1000 + line
        stacks.view(e)
    assert len(stacks._FOLDS) <= 3 and len(folded) == 5
    assert stacks.view(ev) == b and len(folded) == 6  # (emptied: folded again)
    monkeypatch.setattr(stacks, "FOLDS_BYTES", 2 * len(next(iter(stacks._FOLDS))) - 1)  # (one thread's key fits)
    assert stacks.view(ev) == b and len(folded) == 6
    assert stacks.view(moved) != b and len(stacks._FOLDS) == 1 and len(folded) == 7  # (past the bytes: emptied)
    assert stacks.view(ev) == b and len(folded) == 8
    huge = _stack_event()
    huge["threads"][0]["frames"].append(["/job/x.py", 1 << 70, "f"])  # (not JSON orjson writes)
    assert stacks.view(huge) == stacks.view(huge) == [real("MainThread", huge["threads"][0]["frames"])]
    assert len(folded) == 10 and len(stacks._FOLDS) <= 3


def test_a_diagnosis_folds_each_rank_s_stack_once(monkeypatch):
    """Diagnosing a hang again folds no waiting rank's stack again: each rank keeps its
    folded views (``RankTrace.stacks_folded``), and they go with the model."""
    ws = 64
    b = TraceBuilder(ws)
    t = b.warmup(1)
    for r in range(ws - 1):
        i = b.sync(r, t, None, "all_reduce")
        b.add(r, t + 3 * S, "stack", id=i, threads=[{"tid": 1, "name": "MainThread", "op_thread": True,
                                                      "frames": [["train.py", 42, "step"]]}])
    b.heartbeats(t, t + 5 * S)
    m = TraceModel.from_events(b.sorted_events())
    folded = []
    real = stacks.fold
    monkeypatch.setattr(stacks, "fold", lambda *a: folded.append(a) or real(*a))
    monkeypatch.setattr(stacks, "_FOLDS", {})
    monkeypatch.setattr(stacks, "_folds_bytes", 0)
    first = diagnose(m, t + 5 * S, 2.0)
    n = len(folded)
    again = diagnose(m, t + 5 * S + 1, 2.0)
    assert n == 1 and len(folded) == n  # (equal threads once for all, and none folded again)
    assert [f.evidence.get("stack_info") for f in first] == [f.evidence.get("stack_info") for f in again]
    assert errors(again) == [("missing_ranks", [ws - 1])]  # the rank that never came, no waiting rank blamed
    info = next(f for f in again if f.kind == "missing_ranks").evidence["stack_info"]
    assert info["0"]["count"] == ws - 1 and all(len(m.ranks[r].stacks_folded) == 1 for r in range(ws - 1))


def test_equal_stacks_share_one_key_and_every_value_has_one():
    """The ranks showing one stack are shown once (``same_key``): equal views, keys in any
    order, give one key; another view another; a value orjson refuses (an integer past 64
    bits: no reader gives one, a safeguard) still gives one."""
    v = stacks.view(_stack_event())
    assert stacks.same_key(v) == stacks.same_key(json.loads(json.dumps(v)))
    assert stacks.same_key(v) == stacks.same_key([dict(reversed(list(v[0].items())))])
    assert stacks.same_key(v) != stacks.same_key([dict(v[0], where="/job/train.py:43 in step")])
    huge = [dict(v[0], thread=1 << 70)]
    assert stacks.same_key(huge) == stacks.same_key(json.loads(json.dumps(huge)))
    assert stacks.same_key(huge) not in (stacks.same_key(v), stacks.same_key([dict(v[0], thread=1 << 60)]))
    assert stacks.same_key(None) == stacks.same_key(None) != stacks.same_key([])


# ---------------------------------------------------------------------- a rank killed
def _killed(b: TraceBuilder, victim: int, *, entered: bool, survivors_exit: bool | None) -> int:
    t = b.warmup()
    b.heartbeats(b.t0, t)
    others = [r for r in range(b.world) if r != victim]
    if entered:
        b.begin(victim, t, "all_reduce")
    ids = {r: b.begin(r, t + MS, "all_reduce") for r in others}
    tf = t + 20 * MS
    for k, r in enumerate(others):
        b.end(r, ids[r], tf + k * MS, exc=CLOSED if k % 2 == 0 else RESET)
    if survivors_exit is None:  # they hang on, alive
        b.heartbeats(tf + 2 * MS, tf + 6 * S, ranks=others)
    elif survivors_exit:
        for r in others:
            b.exit(r, tf + 50 * MS, reason="exception", exc=CLOSED)
    return tf


def test_sigkill_survivors_hang_on():
    b = TraceBuilder(3)
    _killed(b, 1, entered=False, survivors_exit=None)
    m, f = replay(b, {1})
    assert errors(f) == [("dead_rank", [1])]
    dead = f[0]
    assert dead.evidence["how"] == "vanished"
    cons = dead.evidence["consequences"]
    assert [c["kind"] for c in cons] == ["op_failed"] and sorted(cons[0]["failed"]) == ["0", "2"]
    waiting = {r: n for r, n in dead.evidence["stack_info"].items() if n["role"] == "waiting"}
    assert sum(n.get("count", 1) for n in waiting.values()) == 2  # the waiting ranks have a say (folded)
    assert "gone" in dead.evidence["stack_info"]["1"]["missing"]


def test_sigkill_inside_the_collective_and_everyone_gone_at_the_end():
    """The killed rank had entered the all_reduce; the survivors die right after (a launcher
    tearing the job down), so the trace ends with every rank silent together."""
    b = TraceBuilder(3)
    _killed(b, 1, entered=True, survivors_exit=False)
    _, f = replay(b, {1})
    assert errors(f) == [("dead_rank", [1])]
    _, f = replay(b, {1}, end=b.events[-1]["ts"] + 60 * S)  # a live console long after: the same
    assert errors(f) == [("dead_rank", [1])]


def test_survivors_crash_on_the_failure_they_saw():
    b = TraceBuilder(3)
    _killed(b, 1, entered=False, survivors_exit=True)
    _, f = replay(b, {1})
    assert errors(f) == [("dead_rank", [1])]
    kinds = sorted(c["kind"] for c in f[0].evidence["consequences"])
    assert kinds == ["op_failed", "rank_crashed", "rank_crashed"]


def test_four_ranks_blame_waits_until_the_bystander_is_heard_from():
    """Ranks 0 and 2 fail when rank 3 is killed; rank 1 sits in the same all_reduce and says
    nothing for a moment.  Until it does, either could have left: nobody is named."""
    b = TraceBuilder(4)
    t = b.warmup()
    b.heartbeats(b.t0, t)
    ids = {r: b.begin(r, t + MS, "all_reduce") for r in (0, 1, 2)}
    tf = t + 20 * MS
    b.end(0, ids[0], tf, exc=CLOSED)
    b.end(2, ids[2], tf + MS, exc=CLOSED)
    m = TraceModel.from_events(sorted(b.events, key=lambda e: e["ts"]))
    f = diagnose(m, now=tf + 10 * MS, hang_after=2.0)
    assert errors(f) == [("op_failed", [])]
    assert f[0].evidence["blame"]["reason"] == "pending"
    b.heartbeats(tf + 300 * MS, tf + 5 * S, ranks=[0, 1, 2])
    _, f = replay(b, {3})
    assert errors(f) == [("dead_rank", [3])]


# ---------------------------------------------------------------------- a rank raising, crashing
def test_python_exception_is_the_root_and_the_others_failures_its_consequence():
    b = TraceBuilder(3)
    t = b.warmup()
    b.heartbeats(b.t0, t)
    b.add(1, t + MS, "stack", reason="exception", threads=[dict(stack("load_batch", 77)[0])])
    b.exit(1, t + 2 * MS, reason="exception", exc="ValueError: bad data")
    ids = {r: b.begin(r, t, "all_reduce") for r in (0, 2)}
    for r in (0, 2):
        b.end(r, ids[r], t + 10 * MS, exc=CLOSED)
        b.exit(r, t + 20 * MS, reason="exception", exc=CLOSED)
    _, f = replay(b, {1})
    assert errors(f) == [("rank_crashed", [1])]
    x = f[0]
    assert x.evidence["exc"] == "ValueError: bad data"
    assert x.evidence["culprit_where"] == "/job/train.py:77 in load_batch"
    assert "after all_reduce #3" in x.message
    assert sorted(c["kind"] for c in x.evidence["consequences"]) == ["op_failed", "rank_crashed", "rank_crashed"]


def test_segfault_is_rank_crashed_with_its_signal_and_stack():
    b = TraceBuilder(3)
    t = b.warmup()
    b.heartbeats(b.t0, t)
    b.add(1, t + MS, "stack", reason="signal", threads=[dict(stack("parse", 12)[0])])
    b.exit(1, t + MS, reason="signal", signal="Segmentation fault", exc="Fatal Python error: Segmentation fault")
    ids = {r: b.begin(r, t, "all_reduce") for r in (0, 2)}
    for r in (0, 2):
        b.end(r, ids[r], t + 5 * MS, exc=CLOSED)
    b.heartbeats(t + 10 * MS, t + 3 * S, ranks=[0, 2])
    m, f = replay(b, {1})
    assert errors(f) == [("rank_crashed", [1])]
    assert f[0].evidence["signal"] == "Segmentation fault"
    assert f[0].evidence["stacks"]["1"][0]["where"] == "/job/train.py:12 in parse"
    assert rankstate.rank_state(m, 1, m.end_ns).kind == "crashed"


def test_a_crash_outside_any_op_is_titled_after_the_last_op_not_in_it():
    """Rank 1 raised in its own code after all_reduce #4 had completed on every rank: the
    finding's title named "group 0 #4 all_reduce" as if it had happened there (its message
    said "after").  A crash inside an op is titled with that op."""
    from rich.console import Console

    from commscope.commands.check import _panel

    b = TraceBuilder(2)
    t = b.warmup()
    for r in (0, 1):
        b.end(r, b.begin(r, t, "all_reduce"), t + 10 * MS)
    b.heartbeats(b.t0, t + 3 * S)
    b.exit(1, t + 2 * S, reason="exception", exc="ValueError: bad batch")
    b.exit(0, t + 3 * S, reason="atexit", code=0)
    _, (f,) = replay(b, {1})
    assert (f.kind, f.culprits, f.group, f.seq, f.op) == ("rank_crashed", [1], "0", 4, "all_reduce")
    assert f.place == "after group 0 #4 all_reduce"
    console = Console(width=80, record=True)
    console.print(_panel(f))
    assert console.export_text().splitlines()[0].startswith("╭─ ERROR rank_crashed  after group 0 #4 all_reduce ─")
    b = TraceBuilder(2)
    t = b.warmup()
    b.begin(1, t, "all_reduce")
    b.heartbeats(b.t0, t + 3 * S)
    b.exit(1, t + 2 * S, reason="exception", exc="ValueError: bad batch")
    _, found = replay(b, {1})
    (f,) = [x for x in found if x.severity == "error"]
    assert (f.kind, f.place) == ("rank_crashed", "group 0 #4 all_reduce")
    b = TraceBuilder(2)  # (before any op: its title said nothing there, "ERROR dead_rank   ───", helper-176)
    b.heartbeats(b.t0, b.t0 + 3 * S)
    b.exit(1, b.t0 + S, reason="exception", exc="ValueError: bad config")
    _, found = replay(b, {1})
    (f,) = [x for x in found if x.severity == "error"]
    assert (f.kind, f.place) == ("rank_crashed", "before any op")


def test_a_rank_killed_with_no_stack_says_how_it_went_not_that_it_is_silent():
    """A rank a launcher's SIGTERM killed inside an op, no stack captured: its stack note said
    "silent: the process is gone, or cannot run Python (stuck in native code holding the
    GIL)", where its exit says how it went (helper-176)."""
    from commscope.analysis.findings import rank_stack

    b = TraceBuilder(2)
    t = b.warmup()
    b.begin(1, t, "all_reduce")
    b.heartbeats(b.t0, t + 3 * S)
    b.add(1, t + S, "exit", reason="signal", signal="Terminated", src="spool")
    m = TraceModel.from_events(b.events)
    shown, note = rank_stack(m, 1, t + 3 * S)
    assert shown is None and note["missing"] == "killed by SIGTERM (Terminated); no stack was captured before", note


def test_local_failure_then_crash_is_one_finding():
    b = TraceBuilder(3)
    t = b.warmup()
    b.heartbeats(b.t0, t)
    i = b.begin(1, t, "all_gather")
    exc = "RuntimeError: ProcessGroupGloo::allgather: invalid tensor size at index 0 (expected (12), got (8))"
    b.end(1, i, t + MS, exc=exc)
    b.exit(1, t + 3 * MS, reason="exception", exc=exc)
    ids = {r: b.begin(r, t, "all_gather") for r in (0, 2)}
    for r in (0, 2):
        b.end(r, ids[r], t + 9 * MS, exc=CLOSED)
    b.heartbeats(t + 10 * MS, t + 3 * S, ranks=[0, 2])
    _, f = replay(b, {1})
    assert errors(f) == [("rank_crashed", [1])]
    assert "in all_gather #4" in f[0].message


# ---------------------------------------------------------------------- a rank that never arrives
def test_spinning_rank_shows_its_current_frame():
    b = TraceBuilder(3)
    t = b.warmup()
    for r in (0, 2):
        b.sync(r, t, None, "all_reduce")
        b.add(r, t + 2 * S + 10 * MS, "stack", id=b._ids[r], threads=stack("step", 42, inside=True))
    for r in range(3):
        b.add(r, t + 2 * S + 300 * MS, "stack", reason="request", trigger=0, request_ns=t + 2 * S + 20 * MS,
              threads=stack("spin_forever", 9) if r == 1 else stack("step", 42, inside=True))
    b.heartbeats(b.t0, t + 4 * S)
    _, f = replay(b, {1})
    assert errors(f) == [("missing_ranks", [1])]
    x = f[0]
    assert x.evidence["culprit_where"] == "/job/train.py:9 in spin_forever"
    assert list(x.evidence["stacks"])[0] == "1"  # the culprit first
    assert x.evidence["stacks"]["0"][0]["inside"] == "all_reduce"
    info = x.evidence["stack_info"]["1"]
    assert info["role"] == "culprit" and info["captured_ns"] == t + 2 * S + 300 * MS
    assert info["reason"] == "request" and info["requested_by"] == 0 and info["age_s"] > 1


def test_pg_timeout_blames_the_rank_that_had_not_arrived():
    b = TraceBuilder(3)
    t = b.warmup()
    ids = {r: b.begin(r, t, "all_reduce") for r in (0, 2)}
    b.add(1, t + 3 * S + 400 * MS, "stack", reason="request", trigger=0, request_ns=t + 3 * S + 100 * MS,
          threads=stack("spin_forever", 9))
    for r in (0, 2):
        b.end(r, ids[r], t + 3 * S + r * MS, exc=TIMED_OUT)
    late = b.begin(1, t + 5 * S, "all_reduce")  # it finally arrives, at an instance already broken
    b.end(1, late, t + 5 * S + MS, exc=CLOSED)
    b.heartbeats(b.t0, t + 6 * S)
    _, f = replay(b, {1}, hang_after=1.0)
    assert errors(f) == [("op_failed", [1])]
    x = f[0]
    assert x.evidence["blame"]["reason"] == "absent" and sorted(x.evidence["failed"]) == ["0", "1", "2"]
    assert x.evidence["culprit_where"] == "/job/train.py:9 in spin_forever"
    _, f = replay(b, {1}, hang_after=60.0)  # hang_after far beyond the timeout: the failure still counts
    assert errors(f) == [("op_failed", [1])]


def test_ctrl_c_on_a_hung_job_blames_the_rank_that_never_came_not_those_that_waited():
    """Ranks 0 and 2 wait in an all_reduce rank 1 never calls; the user presses Ctrl-C and
    both raise ``KeyboardInterrupt`` from inside it (helper-62: blamed on ranks 0 and 2
    themselves, "the op raised on rank 0 itself", the culprit not named).  Then rank 1,
    asleep elsewhere, exits."""
    b = TraceBuilder(3)
    t = b.warmup()
    ids = {r: b.begin(r, t, "all_reduce") for r in (0, 2)}
    for r in (0, 2):
        b.end(r, ids[r], t + 4 * S + r * MS, exc="KeyboardInterrupt")
    b.heartbeats(b.t0, t + 4 * S)
    for r in range(3):  # (as the recorder writes a KeyboardInterrupt's ending)
        b.add(r, t + 4 * S + (5 + r) * MS, "exit", reason="atexit", code=0)
    _, f = replay(b, {1}, hang_after=2.0)
    assert errors(f) == [("op_failed", [1])]
    blame = f[0].evidence["blame"]
    assert blame == {**blame, "reason": "absent",
                     "text": "rank 1 had not entered it when its ranks waiting there were interrupted"}


def test_ctrl_c_on_a_running_job_blames_no_rank_a_moment_behind():
    """Ctrl-C reaches every rank at once; rank 0 was 10 ms into an all_reduce rank 1 had not
    reached yet: nobody is to blame (helper-64: rank 1 was, as for a hang), and nothing is
    wrong: a warning, no error (helper-176: an error, check exited 1 on a job the user
    stopped)."""
    b = TraceBuilder(2)
    t = b.warmup()
    i = b.begin(0, t, "all_reduce")
    b.end(0, i, t + 10 * MS, exc="KeyboardInterrupt")
    b.heartbeats(b.t0, t + 10 * MS)
    for r in (0, 1):
        b.add(r, t + 20 * MS, "exit", reason="atexit", code=0)
    _, f = replay(b, set(), hang_after=2.0)
    assert [(x.kind, x.culprits, x.severity, x.evidence["blame"]["reason"]) for x in f if x.kind == "op_failed"] == [
        ("op_failed", [], "warning", "interrupted")]
    assert not [x for x in f if x.severity == "error"], f


@pytest.mark.parametrize("noted", [True, False])
def test_ctrl_c_on_a_rank_between_ops_while_its_peers_wait_is_a_stop_not_a_missing_rank(noted):
    """Ctrl-C (``commscope run`` passing it on): rank 1, in Python between ops (data loading),
    takes the KeyboardInterrupt and leaves, its exit saying so (``stop_signal`` Interrupt);
    ranks 0 and 2, waiting 0.1 s in an all_reduce, are ended by their launcher's SIGTERM.  A
    job stopped, well before hang_after: no error.  An exit that does not say the stop (the
    recorder before helper-176) named rank 1 missing, an error."""
    b = TraceBuilder(3)
    t = b.warmup()
    for r in (0, 2):
        b.begin(r, t, "all_reduce")
    b.heartbeats(b.t0, t + 100 * MS)
    stop = {"stop_signal": "Interrupt", "stop_ts": t + 100 * MS} if noted else {}
    b.add(1, t + 110 * MS, "exit", reason="atexit", **stop)
    for r in (0, 2):
        b.add(r, t + 120 * MS, "exit", reason="signal", signal="Terminated", src="spool")
    _, f = replay(b, set() if noted else {1}, hang_after=3.0)
    assert errors(f) == ([] if noted else [("missing_ranks", [1])]), [x.to_json() for x in f]


def test_a_rank_ctrl_c_stopped_long_after_its_peers_began_waiting_is_said_stopped():
    """Rank 2, stuck outside any op (native code holding the GIL) while ranks 0 and 1 wait
    past hang_after, then stopped by Ctrl-C: its finding said "rank 2 has exited (atexit)"
    (helper-186); it says the signal that stopped it."""
    b = TraceBuilder(3)
    t = b.warmup()
    for r in (0, 1):
        b.begin(r, t, "all_reduce")
    b.heartbeats(b.t0, t + 8 * S)
    b.add(2, t + 8 * S + MS, "exit", reason="atexit", stop_signal="Interrupt", stop_ts=t + 8 * S)
    for r in (0, 1):
        b.add(r, t + 8 * S + 20 * MS, "exit", reason="signal", signal="Terminated", src="spool")
    _, f = replay(b, {2}, hang_after=3.0)
    assert errors(f) == [("missing_ranks", [2])], [x.to_json()["message"] for x in f]
    assert "rank 2 has exited (stopped by SIGINT (Interrupt))" in f[0].message, f[0].message


def test_a_varlen_op_every_rank_refused_together_is_blamed_on_the_rank_it_names():
    """Rank 1 alone passed float64 to all_gather_v: every rank raises the toolkit's ValueError
    naming it; the op_failed names rank 1 alone, the others its victims.  Before, each rank
    was blamed for raising "itself": culprits 0-3 (helper-178)."""
    b = TraceBuilder(4)
    t = b.warmup()
    text = ("ValueError: all_gather_v: dtype differs across ranks (float32 on ranks [0, 2, 3]; float64 on ranks "
            "[1]); offending ranks [1]")
    for r in range(4):
        i = b.begin(r, t + r * MS, "all_gather_v", dtype="float64" if r == 1 else "float32")
        b.end(r, i, t + 5 * MS, exc=text)
    b.heartbeats(b.t0, t + S)
    _, f = replay(b, {1})
    assert errors(f) == [("op_failed", [1])]
    assert f[0].evidence["blame"]["reason"] == "faulted" and f[0].victims == {0: (1,), 2: (1,), 3: (1,)}


def test_a_rank_that_left_cleanly_inside_an_op_waited_only_until_it_left():
    """Rank 0 left through ``os._exit(0)`` half a second into an all_reduce rank 1 never
    called; rank 1 wrote its checkpoint for 5 s more and exited: rank 0 waited 0.5 s, not
    5 (helper-64: a missing_ranks error blamed rank 1 for a 5 s wait, with hang_after 2 s).
    Had it waited past hang_after before it left, the wait is a hang, told in its own
    seconds."""
    for waited, op in ((S // 2, "all_reduce"), (3 * S, "all_reduce"), (S // 2, "recv"), (3 * S, "recv")):
        b = TraceBuilder(2)
        t = b.warmup()
        b.begin(0, t, op, **({"peer": 1, "dir": "recv"} if op == "recv" else {}))
        b.heartbeats(b.t0, t + waited, ranks=[0])
        b.add(0, t + waited, "exit", reason="os._exit", code=0)
        b.heartbeats(b.t0, t + 5 * S, ranks=[1])
        b.add(1, t + 5 * S, "exit", reason="atexit", code=0)
        _, f = replay(b, {1} if waited > 2 * S else set(), hang_after=2.0)
        if waited < 2 * S:
            assert errors(f) == [], op
        elif op == "recv":
            assert errors(f) == [("unmatched_p2p", [1])]
            assert f[0].evidence["blocked_op"]["blocked_s"] == 3.0
        else:
            assert errors(f) == [("missing_ranks", [1])]
            assert f[0].evidence["waited_s"] == {"0": 3.0}
            assert (f[0].evidence["op"]["state"], f[0].evidence["op"]["for_s"]) == ("exited", 3.0)  # (helper-65)


def test_monitored_barrier_names_the_absent_rank():
    b = TraceBuilder(3)
    t = b.warmup()
    ids = {r: b.begin(r, t, "monitored_barrier") for r in (0, 2)}
    b.end(0, ids[0], t + S, exc=MONITORED)
    b.end(2, ids[2], t + S + 2 * MS, exc=RELAY)
    b.heartbeats(b.t0, t + 3 * S)
    _, f = replay(b, {1}, hang_after=60.0)
    assert errors(f) == [("op_failed", [1])]
    assert f[0].evidence["blame"]["reason"] == "named" and f[0].op == "monitored_barrier"


def test_p2p_recv_timeout_blames_the_peer_that_never_sent():
    b = TraceBuilder(2)
    t = b.warmup()
    i = b.begin(0, t, "recv", peer=1, dir="recv")
    b.end(0, i, t + S, exc=TIMED_OUT)
    b.heartbeats(b.t0, t + 2 * S)
    _, f = replay(b, {1}, hang_after=60.0)
    assert errors(f) == [("op_failed", [1])]


def _send_into_a_barrier(b: TraceBuilder, *, send_times_out: bool) -> None:
    """Rank 2 sends to 3 (group S), which never posts the recv: it went into group W's
    barrier, which rank 2 never reaches.  Then the timeouts: the barrier's on ranks 0, 1
    and 3 (they crash on it), and rank 2's send, by its own timeout first
    (``send_times_out``) or by rank 3's connection closing once it crashed."""
    t = b.warmup()
    b.group("S", [2, 3])
    b.group("W", [0, 1, 2, 3])
    send = b.begin(2, t, "send", group="S", peer=3, dir="send")
    ids = {r: b.begin(r, t + MS, "barrier", group="W") for r in (0, 1, 3)}
    fired = t + 3 * S
    if send_times_out:
        b.end(2, send, fired, exc=TIMED_OUT.replace("recv", "send"))
        b.exit(2, fired + 5 * MS, reason="exception", exc=TIMED_OUT.replace("recv", "send"))
    for r in (0, 1, 3):
        b.end(r, ids[r], fired + MS + r * MS, exc=TIMED_OUT)
        b.exit(r, fired + 10 * MS + r * MS, reason="exception", exc=TIMED_OUT)
    if not send_times_out:
        b.end(2, send, fired + 20 * MS, exc=CLOSED)
        b.exit(2, fired + 25 * MS, reason="exception", exc=CLOSED)
    b.heartbeats(b.t0, fired)


def test_a_barrier_timeout_while_its_absent_rank_sent_to_a_rank_in_it_blames_that_rank():
    """The wait cycle through a barrier (rank 2's send to 3, never received; rank 3 in the
    barrier rank 2 never reaches), after the timeouts: rank 3's crash is the one error, in
    either order of the timeouts.  The barrier's failure blamed rank 2 (absent: it was
    blocked in the send), rank 2's its peer 3 (crashed first): two rank_crashed naming
    each other."""
    for send_times_out, step in ((False, 1), (False, 7), (True, 1), (True, 3), (True, 7)):
        b = TraceBuilder(4)
        _send_into_a_barrier(b, send_times_out=send_times_out)
        _, f = replay(b, {3}, hang_after=1.0, step=step)
        assert errors(f) == [("rank_crashed", [3])], (send_times_out, [x.message for x in f])
        x = f[0]
        barrier = next(c for c in x.evidence["consequences"] if c["kind"] == "op_failed" and c["op"] == "barrier")
        assert barrier["culprits"] == [3] and barrier["blame"]["reason"] == "blocked"
        held = ("its send #1 to 3 (group S) had failed, rank 3 never having posted its side" if send_times_out else
                "it was blocked in send #1 to 3 (group S), which rank 3 had not posted")
        assert barrier["blame"]["text"] == "rank 2 had not entered it when the timeout fired: " + held
        assert "its own doing: rank 2 had not entered it" in x.message
        assert set(x.victims) == {0, 1, 2}


def _barrier_partly_in_a_wait_cycle(b: TraceBuilder, crash: bool = True, rank3_exc: str = TIMED_OUT,
                                    rank3_after: int = 13 * MS) -> int:
    """Rank 2 sends to 3, which is in the barrier with 0 and 1; rank 4 never comes (its
    heartbeats are the caller's).  The barrier times out (blamed on 3 and 4); with
    ``crash``, 0 and 1 crash of it at once, rank 3 raises ``rank3_exc`` ``rank3_after`` the
    timeout, and rank 2's send fails as it goes.  Returns when the timeout fired."""
    t = b.warmup()
    send = b.begin(2, t, "send", peer=3, dir="send")
    ids = {r: b.begin(r, t + MS, "barrier") for r in (0, 1, 3)}
    fired = t + S
    for r in (0, 1, 3):
        b.end(r, ids[r], fired + r * MS, exc=TIMED_OUT)
    if not crash:
        b.heartbeats(b.t0, fired + 5 * S, ranks=[0, 1, 2, 3])
        return fired
    for r in (0, 1):
        b.exit(r, fired + (10 + r) * MS, reason="exception", exc=TIMED_OUT)
    b.exit(3, fired + rank3_after, reason="exception", exc=rank3_exc)
    b.end(2, send, fired + rank3_after + MS, exc=CLOSED)
    b.heartbeats(b.t0, fired, ranks=[0, 1])
    b.heartbeats(b.t0, fired + rank3_after, ranks=[3])
    b.heartbeats(b.t0, fired + rank3_after + 5 * S, ranks=[2])
    return fired


@pytest.mark.parametrize("crash", [True, False], ids=["the waiting ranks crash", "they catch it"])
def test_a_barrier_timeout_partly_in_a_wait_cycle_is_one_finding_naming_each_rank_once(crash):
    """As above, and rank 4, idle, never comes either: the barrier's failure is blamed on
    ranks 3 and 4.  Rank 3 crashed of that failure: its crash is one of its consequences
    (it stood beside it as a rank_crashed, naming rank 3 twice), and so is rank 2's send
    failing as rank 3 went."""
    b = TraceBuilder(5)
    fired = _barrier_partly_in_a_wait_cycle(b, crash)
    b.heartbeats(b.t0, fired + 5 * S, ranks=[4])
    for step in (1, 7):
        _, f = replay(b, {3, 4}, hang_after=60.0, step=step)
        assert errors(f) == [("op_failed", [3, 4])], [x.message for x in f]
        assert f[0].evidence["blame"]["reason"] == "absent+blocked"
        assert [(c["kind"], c["ranks"]) for c in f[0].evidence.get("consequences", [])] == (
            [("rank_crashed", [0]), ("rank_crashed", [1]), ("rank_crashed", [3]), ("op_failed", [2, 3])]
            if crash else [])


@pytest.mark.parametrize("dies", [-500 * MS, 0, S], ids=["before the timeout", "as it fires", "after it"])
def test_a_barrier_timeout_partly_in_a_wait_cycle_beside_a_rank_that_died_keeps_both_causes(dies):
    """As above, but rank 4 died (silently) instead of idling.  Its death is one cause; the
    wait cycle that rank 3 crashed in, the other: rank 3's crash is not folded into the
    barrier's failure (blamed on 3 and the dead 4, that failure is rank 4's death's
    consequence, and with it went rank 2's send failing on rank 3: no finding named
    rank 3; helper-98)."""
    b = TraceBuilder(5)
    fired = _barrier_partly_in_a_wait_cycle(b)
    b.heartbeats(b.t0, fired + dies, ranks=[4])
    for step in (1, 7):
        _, f = replay(b, {3, 4}, hang_after=60.0, step=step)
        assert errors(f) == [("dead_rank", [4]), ("rank_crashed", [3])], [x.message for x in f]
        consequences = [(c["kind"], c["ranks"]) for x in f for c in x.evidence.get("consequences", [])]
        assert ("op_failed", [2, 3]) in consequences and ("op_failed", [0, 1, 2, 3, 4]) in consequences
        assert ("rank_crashed", [3]) not in consequences


@pytest.mark.parametrize(("exc", "after", "folded"), [
    (TIMED_OUT, 5 * S, True), ("torch.distributed.DistBackendError: " + TIMED_OUT.split(": ", 1)[1], 5 * S, True),
    ("ValueError: loss is nan", 100 * MS, True), ("ValueError: loss is nan", 5 * S, False)],
    ids=["its timeout, later", "its timeout in another type, later", "another exception, at once",
         "another exception, later"])
def test_a_rank_crashed_of_a_failure_blamed_on_it_and_others_only_where_it_raised_that_failure(exc, after, folded):
    """Rank 3's crash folds into the barrier's failure (blamed on it and rank 4) where it
    raised what the barrier raised (whatever type it was given: the native hook records a
    C++ what(), Python's crash its DistBackendError), or went as the barrier failed; a
    different exception seconds later is a crash of its own, beside the failure (it was
    folded as 'crashed on that failure'; helper-98)."""
    b = TraceBuilder(5)
    fired = _barrier_partly_in_a_wait_cycle(b, True, exc, after)
    b.heartbeats(b.t0, fired + after + 5 * S, ranks=[4])
    for step in (1, 7):
        _, f = replay(b, {3, 4}, hang_after=60.0, step=step)
        consequences = [(c["kind"], c["ranks"]) for x in f for c in x.evidence.get("consequences", [])]
        if folded:
            assert errors(f) == [("op_failed", [3, 4])], [x.message for x in f]
            assert ("rank_crashed", [3]) in consequences and ("op_failed", [2, 3]) in consequences
        else:
            assert errors(f) == [("rank_crashed", [3]), ("op_failed", [3, 4])], [x.message for x in f]
            assert "ValueError: loss is nan" in f[0].message
            assert f[0].evidence["consequences"][0]["kind"] == "op_failed"
            assert f[0].evidence["consequences"][0]["ranks"] == [2, 3]


def test_a_crash_in_a_wait_cycle_is_never_kept_naming_ranks_that_never_crashed():
    """Rank 0 recvs from 1, which waits in the all_reduce; rank 3 sends to 2, idle.  0 and
    3 time out and crash; rank 1's all_reduce fails as they go, and rank 1 crashes of a
    ValueError seconds later.  Every error names rank 2, the idle one, and no crash is
    kept naming others' ranks (rank 0's crash led to the same roots as a failure before
    it, was kept first and named ranks 0 and 2 crashed; helper-99's fuzzer)."""
    b = TraceBuilder(4, sample_interval=0.5)
    t = b.warmup(1)
    recv = b.begin(0, t, "recv", peer=1, dir="recv")
    send = b.begin(3, t + 3 * MS, "send", peer=2, dir="send")
    ar = b.begin(1, t + 4 * MS, "all_reduce")
    fired = t + S
    b.end(0, recv, fired, exc=TIMED_OUT)
    b.end(3, send, fired + 2 * MS, exc=TIMED_OUT)
    b.exit(0, fired + 11 * MS, reason="exception", exc=TIMED_OUT)
    b.exit(3, fired + 12 * MS, reason="exception", exc=TIMED_OUT)
    b.end(1, ar, fired + 13 * MS, exc=CLOSED)
    b.exit(1, fired + 4 * S, reason="exception", exc="ValueError: bad data")
    b.heartbeats(b.t0, fired, interval=S // 2, ranks=[0, 3])
    b.heartbeats(b.t0, fired + 4 * S, interval=S // 2, ranks=[1])
    b.heartbeats(b.t0, fired + 6 * S, interval=S // 2, ranks=[2])
    for step in (1, 7):
        _, f = replay(b, {0, 1, 2}, step=step)
        got = [x for x in f if x.severity == "error"]
        assert got and all(2 in x.culprits for x in got), [x.message for x in got]
        assert not [x.message for x in got if x.kind in ("rank_crashed", "dead_rank")]


def test_a_rank_crashed_of_its_own_failure_beside_a_dead_rank_is_still_named():
    """Rank 1 dies silently before the barrier; rank 2's barrier raises a ValueError on
    rank 2 itself and it exits of it; 0 and 3 fail as the connections close.  Two causes:
    rank 1's death and rank 2's crash (the crash folded into the barrier's failure, blamed
    on ranks 1 and 2, which went to rank 1's death: rank 2 was named by no finding;
    helper-99's fuzzer)."""
    b = TraceBuilder(4, sample_interval=0.5)
    t = b.warmup(1)
    ids = {r: b.begin(r, t + r * MS, "barrier") for r in (0, 2, 3)}
    b.heartbeats(b.t0, t + 400 * MS, interval=S // 2, ranks=[1])
    boom = t + 800 * MS
    b.end(2, ids[2], boom, exc="ValueError: bad data")
    b.exit(2, boom + MS, reason="exception", exc="ValueError: bad data")
    for r in (0, 3):
        b.end(r, ids[r], boom + (5 + r) * MS, exc=CLOSED)
    b.heartbeats(b.t0, boom, interval=S // 2, ranks=[2])
    b.heartbeats(b.t0, boom + 5 * S, interval=S // 2, ranks=[0, 3])
    for step in (1, 7):
        _, f = replay(b, {1, 2}, hang_after=60.0, step=step)
        assert errors(f) == [("dead_rank", [1]), ("rank_crashed", [2])], [x.message for x in f]


def test_a_rank_crashed_of_its_own_refusal_beside_an_absent_rank_that_crashed_too_is_named():
    """Rank 3 sends to 1 and never enters the all_reduce; rank 0's all_reduce raises a
    ValueError on rank 0 itself and it exits of it; the others' fail as it goes, and 1, 3
    and 4 crash.  The failure is blamed on 0 and 3, both gone: rank 0's crash stands (it
    folded into the failure, and rank 3's send failing was then kept naming rank 1, a
    victim; helper-99's fuzzer)."""
    b = TraceBuilder(5, sample_interval=0.5)
    t = b.warmup(1)
    send = b.begin(3, t, "send", peer=1, dir="send")
    ids = {r: b.begin(r, t + MS, "all_reduce") for r in (4, 2, 1, 0)}
    b.end(0, ids[0], t + 28 * MS, exc="ValueError: bad data")
    b.exit(0, t + 29 * MS, reason="exception", exc="ValueError: bad data")
    for r in (1, 4, 2):
        b.end(r, ids[r], t + (32 + r) * MS, exc=CLOSED)
    b.exit(4, t + 42 * MS, reason="exception", exc=CLOSED)
    b.exit(1, t + 45 * MS, reason="exception", exc="ValueError: bad data")
    b.end(3, send, t + 53 * MS, exc=CLOSED)
    b.exit(3, t + 59 * MS, reason="exception", exc="ValueError: bad data")
    for r, gone in ((0, 29), (1, 45), (3, 59), (4, 42)):
        b.heartbeats(b.t0, t + gone * MS, interval=S // 2, ranks=[r])
    b.heartbeats(b.t0, t + 5 * S, interval=S // 2, ranks=[2])
    for step in (1, 7):
        _, f = replay(b, {0, 3}, step=step)
        assert errors(f) == [("rank_crashed", [0]), ("op_failed", [0, 3])], [x.message for x in f]


def test_a_rank_crashed_of_the_second_of_two_timeouts_blamed_alike_folds_into_them():
    """As above, rank 4 idle, but the ranks catch the barrier's timeout and time out in the
    next barrier too, rank 3 crashing of that one: one failure finding for both timeouts
    (blamed alike), and rank 3's crash of the second folds into it (its crash was compared
    with its first timeout, another text seconds before, and stood beside it; helper-100)."""
    b = TraceBuilder(5)
    t = b.warmup()
    send = b.begin(2, t, "send", peer=3, dir="send")
    fired = t
    for seq in (10, 11):
        said = (f"torch.distributed.DistBackendError: [Rank 3] Watchdog caught collective operation timeout: "
                f"WorkNCCL(SeqNum={seq}, OpType=BARRIER) ran for 1001 milliseconds before timing out.")
        ids = {r: b.begin(r, fired + 2 * S + r * MS, "barrier") for r in (0, 1, 3)}
        fired += 3 * S
        for r in (0, 1, 3):
            b.end(r, ids[r], fired + r * MS, exc=said)
    b.exit(3, fired + 13 * MS, reason="exception", exc=said)
    b.end(2, send, fired + 14 * MS, exc=CLOSED)
    b.heartbeats(b.t0, fired + 13 * MS, ranks=[3])
    b.heartbeats(b.t0, fired + 5 * S, ranks=[0, 1, 2, 4])
    for step in (1, 7):
        _, f = replay(b, {3, 4}, hang_after=60.0, step=step)
        assert errors(f) == [("op_failed", [3, 4])], [x.message for x in f]
        assert f[0].evidence["later_failures"] == 1
        assert ("rank_crashed", [3]) in [(c["kind"], c["ranks"]) for c in f[0].evidence["consequences"]]


def test_many_wait_cycles_through_one_barrier_timed_out_are_one_failure_holding_every_crash():
    """Half of 64 ranks wait in the barrier; 31 of the others each send to one of them
    (which never receives), and rank 63 idles.  The barrier times out, blamed on the 31
    held by those sends and on rank 63; every waiting rank crashes of it, and the sends
    fail as their peers go.  One error, the failure, holding every crash and every send's
    failure (the sends' failures folded one at a time into the failure naming their peers,
    each fold copying its thousands of instances: 16k ranks took 12 s against 3 s)."""
    world, half = 64, 32
    b = TraceBuilder(world)
    t = b.warmup(1)
    sends = {r: b.begin(r, t, "send", peer=r - half, dir="send") for r in range(half, world - 1)}
    ids = {r: b.begin(r, t + MS, "barrier") for r in range(half)}
    fired = t + S
    for r in range(half):
        b.end(r, ids[r], fired + MS, exc=TIMED_OUT)
        b.exit(r, fired + 10 * MS, reason="exception", exc=TIMED_OUT)
    for r in sends:
        b.end(r, sends[r], fired + 14 * MS, exc=CLOSED)
    b.heartbeats(b.t0, fired, ranks=list(range(half)), interval=S)
    b.heartbeats(b.t0, fired + 5 * S, ranks=list(range(half, world)), interval=S)
    _, f = replay(b, {*range(half - 1), world - 1}, hang_after=60.0, step=64)
    assert errors(f) == [("op_failed", [*range(half - 1), world - 1])], [x.message for x in f]
    folded = [(c["kind"], c["ranks"]) for c in f[0].evidence["consequences"]]
    assert sorted(r for k, (r, *_) in folded if k == "rank_crashed") == list(range(half))
    assert sorted(rs for k, rs in folded if k == "op_failed") == [[r - half, r] for r in sends]
    assert len(folded) == half + len(sends)


def test_a_chain_of_p2p_waits_into_a_barrier_blames_its_end():
    """Rank 1 recvs from 2, rank 2 from 3, and rank 3 went into barrier W, which times out
    (then each crashes in turn).  The chain ends at rank 3: one rank_crashed, at every
    batch (it named rank 2, held by 3, then two rank_crashed; helper-93)."""
    b = TraceBuilder(4)
    t = b.warmup()
    b.group("A", [1, 2])
    b.group("B", [2, 3])
    b.group("W", [0, 1, 3])
    r1 = b.begin(1, t, "recv", group="A", peer=2, dir="recv")
    r2 = b.begin(2, t, "recv", group="B", peer=3, dir="recv")
    ids = {r: b.begin(r, t + MS, "barrier", group="W") for r in (0, 3)}
    fired = t + S
    for r in (0, 3):
        b.end(r, ids[r], fired + r * MS, exc=TIMED_OUT)
        b.exit(r, fired + (10 + r) * MS, reason="exception", exc=TIMED_OUT)
    b.end(2, r2, fired + 30 * MS, exc=CLOSED)
    b.exit(2, fired + 35 * MS, reason="exception", exc=CLOSED)
    b.end(1, r1, fired + 50 * MS, exc=CLOSED)
    b.exit(1, fired + 55 * MS, reason="exception", exc=CLOSED)
    b.heartbeats(b.t0, fired)
    for step in (1, 7):
        _, f = replay(b, {3}, hang_after=60.0, step=step)
        assert errors(f) == [("rank_crashed", [3])], [x.message for x in f]
        assert ("rank 1 had not entered it when the timeout fired: it was blocked in recv #1 from 2 (group A), "
                "which rank 2 had not posted, itself held so by rank 3") in f[0].message


def test_an_op_that_raised_on_the_absent_rank_itself_holds_it_for_nobody():
    """Rank 2's send to 3 raised on rank 2 (not contiguous) and rank 2 crashed of it; the
    barrier ranks 0, 1 and 3 wait in then times out.  Rank 2's own doing: rank 3, which
    never had its recv to post, is no culprit (helper-93: a second rank_crashed named it)."""
    b = TraceBuilder(4)
    t = b.warmup()
    b.group("S", [2, 3])
    b.group("W", [0, 1, 2, 3])
    send = b.begin(2, t, "send", group="S", peer=3, dir="send")
    b.end(2, send, t + MS // 10, exc="ValueError: Tensors must be contiguous")
    b.exit(2, t + 2 * MS, reason="exception", exc="ValueError: Tensors must be contiguous")
    ids = {r: b.begin(r, t + MS, "barrier", group="W") for r in (0, 1, 3)}
    fired = t + 3 * S
    for r in (0, 1, 3):
        b.end(r, ids[r], fired + r * MS, exc=TIMED_OUT)
        b.exit(r, fired + (10 + r) * MS, reason="exception", exc=TIMED_OUT)
    b.heartbeats(b.t0, t, ranks=[2])
    b.heartbeats(b.t0, fired, ranks=[0, 1, 3])
    _, f = replay(b, {2}, hang_after=60.0)
    assert errors(f) == [("rank_crashed", [2])], [x.message for x in f]


def test_a_peer_that_posted_while_the_absent_rank_waited_holds_nothing():
    """Rank 1 was in a recv from rank 3 when the all_reduce's timeout fired; rank 3 sent
    3 ms later, and rank 1, its message in hand, never came (it spins).  Rank 1 is blamed
    on the trace (helper-93: rank 3, healthy, was)."""
    b = TraceBuilder(4)
    t = b.warmup()
    b.group("W", [0, 1])
    b.group("P", [1, 3])
    a = b.begin(0, t, "all_reduce", group="W")
    fired = t + S
    b.sync(1, fired - 2 * MS, fired + 3 * MS, "recv", group="P", peer=3, dir="recv")
    b.sync(3, fired + 3 * MS, fired + 3 * MS + 1000, "send", group="P", peer=1, dir="send")
    b.end(0, a, fired, exc=TIMED_OUT)
    b.exit(0, fired + 10 * MS, reason="exception", exc=TIMED_OUT)
    b.heartbeats(b.t0, fired, ranks=[0])
    b.heartbeats(b.t0, fired + 5 * S, ranks=[1, 2, 3])
    m = TraceModel.from_events(sorted(b.events, key=lambda e: e["ts"]))
    f = diagnose(m, hang_after=60.0)
    assert errors(f) == [("op_failed", [1])] and f[0].evidence["blame"]["reason"] == "absent"


@pytest.mark.parametrize("chain", [False, True], ids=["peer", "chain"])
def test_a_post_the_timeout_let_through_does_not_clear_the_peer(chain):
    """Rank 2 sends to 3, which is in barrier W; the barrier times out, and rank 3, let go,
    catches it and posts the recv 5 ms later.  Rank 3 is still the cause: it posted only
    because the timeout freed it (helper-94: rank 2, blocked, was blamed, a post after the
    timeout taken for one made while it waited).  ``chain``: one link longer, rank 3 in a
    recv from 4, which is in W; 4, let go, sends (+5 ms), then 3 posts 2's recv (+7 ms):
    rank 4 is the cause (helper-95: rank 2, held all along, was blamed)."""
    last = 4 if chain else 3
    b = TraceBuilder(5)
    t = b.warmup()
    b.group("S", [2, 3])
    b.group("W", [0, 1, 2, last])
    send = b.begin(2, t, "send", group="S", peer=3, dir="send")
    if chain:
        b.group("T", [3, 4])
        rcv = b.begin(3, t, "recv", group="T", peer=4, dir="recv")
    ids = {r: b.begin(r, t + MS, "barrier", group="W") for r in (0, 1, last)}
    fired = t + S
    for r in (0, 1, last):
        b.end(r, ids[r], fired + r * MS, exc=TIMED_OUT)
    for r in (0, 1):
        b.exit(r, fired + (10 + r) * MS, reason="exception", exc=TIMED_OUT)
    if chain:
        b.sync(4, fired + 5 * MS, fired + 6 * MS, "send", group="T", peer=3, dir="send")
        b.end(3, rcv, fired + 6 * MS)
    b.sync(3, fired + 7 * MS, fired + 8 * MS, "recv", group="S", peer=2, dir="recv")
    b.end(2, send, fired + 8 * MS)
    b.heartbeats(b.t0, fired + 5 * S, ranks=[2, 3, 4])
    b.heartbeats(b.t0, fired, ranks=[0, 1])
    for step in (1, 7):
        _, f = replay(b, {last}, hang_after=60.0, step=step)
        assert errors(f) == [("op_failed", [last])], [x.message for x in f]


@pytest.mark.parametrize("start", ["before", "a moment after", "async"])
def test_a_peer_posting_just_after_the_timeout_to_a_rank_it_held_all_along_is_the_cause(start):
    """Rank 2 sent to 3 before barrier W began (or a millisecond after its first rank
    entered, or its isend's wait did) and waited there since; W times out, and rank 3, free,
    posts the recv 5 ms later.  Rank 3 held rank 2 away all the while: it is blamed
    (helper-95; helper-96: a millisecond's skew after the first arrival read as lateness).
    Unlike a rank that began its wait just before the timeout (late already:
    ``test_a_peer_that_posted_while_the_absent_rank_waited_holds_nothing``)."""
    b = TraceBuilder(4)
    t = b.warmup()
    b.group("S", [2, 3])
    b.group("W", [0, 1, 2])
    if start == "async":
        send = b.async_op(2, t, t + MS + 1000, None, "isend", group="S", peer=3, dir="send")
    else:
        send = b.begin(2, t if start == "before" else t + 2 * MS, "send", group="S", peer=3, dir="send")
    ids = {r: b.begin(r, t + MS, "barrier", group="W") for r in (0, 1)}
    fired = t + S
    for r in (0, 1):
        b.end(r, ids[r], fired + r * MS, exc=TIMED_OUT)
        b.exit(r, fired + (10 + r) * MS, reason="exception", exc=TIMED_OUT)
    b.sync(3, fired + 5 * MS, fired + 6 * MS, "recv", group="S", peer=2, dir="recv")
    if start == "async":
        b.phase(2, send, fired + 6 * MS, "wait_end")
    else:
        b.end(2, send, fired + 6 * MS)
    b.heartbeats(b.t0, fired + 5 * S, ranks=[2, 3])
    b.heartbeats(b.t0, fired, ranks=[0, 1])
    for step in (1, 7):
        _, f = replay(b, {3}, hang_after=60.0, step=step)
        assert errors(f) == [("op_failed", [3])], [x.message for x in f]


def test_a_p2p_timeout_whose_peer_was_held_by_another_follows_the_chain():
    """Rank 1's recv from 2 times out; rank 2 was in a recv from 3, idle: rank 3 (helper-94:
    rank 2, a victim, once a p2p op's own timeout asked nothing of its peer's wait)."""
    b = TraceBuilder(4)
    t = b.warmup()
    i = b.begin(1, t, "recv", peer=2, dir="recv")
    b.begin(2, t, "recv", peer=3, dir="recv")
    b.end(1, i, t + S, exc=TIMED_OUT)
    b.exit(1, t + S + 10 * MS, reason="exception", exc=TIMED_OUT)
    b.heartbeats(b.t0, t + S, ranks=[1])
    b.heartbeats(b.t0, t + 5 * S, ranks=[0, 2, 3])
    for step in (1, 7):
        _, f = replay(b, {3}, hang_after=60.0, step=step)
        assert errors(f) == [("op_failed", [3])], [x.message for x in f]


def test_a_p2p_timeout_whose_peer_sends_into_a_collective_is_one_finding_with_the_send():
    """Rank 1's recv from 2 times out, blamed on rank 3: rank 2 sends to 3, which waits in
    group C's barrier (0, 2, 3) that rank 2 never reaches.  Once the send and the barrier
    pass hang_after they are the failure's consequences: one error (before, the send's
    unmatched_p2p, the barrier's hang folded in, stood beside it naming rank 3 again)."""
    b = TraceBuilder(4)
    b.group("C", [0, 2, 3])
    t = b.warmup()
    i = b.begin(1, t, "recv", peer=2, dir="recv")
    b.begin(2, t, "send", peer=3, dir="send")
    for r in (0, 3):
        b.begin(r, t + MS, "barrier", group="C")
    b.end(1, i, t + S, exc=TIMED_OUT)
    b.heartbeats(b.t0, t + 10 * S)
    for step in (1, 7):
        _, f = replay(b, {3}, hang_after=5.0, step=step)
        assert errors(f) == [("op_failed", [3])], [x.message for x in f]
        said = sorted((c["kind"], c["culprits"]) for c in f[0].evidence["consequences"])
        assert said == [("missing_ranks", [2]), ("unmatched_p2p", [3])], said


def test_a_p2p_op_s_own_timeout_is_its_peer_s_whatever_the_peer_waited_in():
    """Ranks 0 and 1 each wait in a recv from the other; rank 0's times out.  Blamed on
    rank 1, as any p2p timeout on its peer (the held-by-peer rule turned it back on rank 0,
    "rank 1 had not entered it")."""
    b = TraceBuilder(2)
    t = b.warmup()
    i = b.begin(0, t, "recv", peer=1, dir="recv")
    b.begin(1, t, "recv", peer=0, dir="recv")
    b.end(0, i, t + S, exc=TIMED_OUT)
    b.heartbeats(b.t0, t + 2 * S)
    m = TraceModel.from_events(sorted(b.events, key=lambda e: e["ts"]))
    f = diagnose(m, hang_after=60.0)
    failed = next(x for x in f if x.kind == "op_failed")
    assert failed.culprits == [1] and failed.evidence["blame"]["reason"] == "absent"


def test_an_absent_rank_whose_peer_had_posted_stays_the_one_blamed():
    """Rank 2 was in a recv from rank 1 that rank 1 had posted (matched, and still rank 2
    had not come back from it) when the barrier's timeout fired: rank 2 is blamed, as any
    rank that had not entered; its peer is no cause."""
    b = TraceBuilder(3)
    t = b.warmup()
    b.group("S", [1, 2])
    b.sync(1, t, t + MS, "send", group="S", peer=2, dir="send")
    b.begin(2, t, "recv", group="S", peer=1, dir="recv")
    ids = {r: b.begin(r, t + 2 * MS, "barrier") for r in (0, 1)}
    for r in (0, 1):
        b.end(r, ids[r], t + 3 * S + r * MS, exc=TIMED_OUT)
    b.heartbeats(b.t0, t + 4 * S)
    _, f = replay(b, {2}, hang_after=60.0)
    assert errors(f) == [("op_failed", [2])], [x.message for x in f]
    assert f[0].evidence["blame"]["reason"] == "absent"


def _left_then_stopped(b: TraceBuilder, leaver: dict | None, *, leave_at: int) -> None:
    """Ranks 0 and 2 enter all_reduce #4 and wait; rank 1 leaves ``leave_at`` ms after they
    entered (its ``exit``: ``leaver``; None: it is stopped with them); the launcher stops
    ranks 0 and 2 with SIGTERM 45 and 47 ms after they entered."""
    t = b.warmup()
    b.heartbeats(b.t0, t)
    for r in (0, 2):
        b.begin(r, t + MS, "all_reduce")
    stop = {"reason": "signal", "signal": "Terminated"}
    b.exit(1, t + MS + leave_at * MS, **(leaver or stop))
    for r in (0, 2):
        b.exit(r, t + MS + (45 + r) * MS, **stop)


def test_a_wait_the_launcher_cut_short_for_a_rank_that_had_left_is_still_a_hang():
    """Rank 1 left with ``sys.exit(3)`` while ranks 0 and 2 waited in the all_reduce it never
    entered; mp.spawn then stopped them (SIGTERM) before Gloo told them it had gone (under
    load).  They waited 45 ms, far short of hang_after, yet the all_reduce could never have
    completed: missing_ranks, rank 1, its code said.  It read "no findings: the trace looks
    healthy" (test_spawn_exceptions failed so under load)."""
    for code in (3, 0):
        b = TraceBuilder(3)
        _left_then_stopped(b, {"reason": "atexit", "code": code}, leave_at=5)
        _, f = replay(b, {1}, hang_after=60.0)
        assert errors(f) == [("missing_ranks", [1])], (code, [x.message for x in f])
        said = "rank 1 has exited (atexit, code 3)" if code else "rank 1 has exited (atexit)"
        assert f[0].message.endswith(said) and f[0].evidence["entered"] == [0, 2], f[0].message
    b = TraceBuilder(3)  # a crash: the crash is the one error, the cut-short wait its consequence
    _left_then_stopped(b, {"reason": "exception", "exc": "RuntimeError: boom"}, leave_at=5)
    _, f = replay(b, {1}, hang_after=60.0)
    assert errors(f) == [("rank_crashed", [1])]
    assert [c["kind"] for c in f[0].evidence["consequences"]] == ["missing_ranks"]


def test_a_cut_short_wait_names_only_the_rank_that_left_and_only_that_op():
    """As above with a fourth rank, stopped with the job a moment behind (between ops), and
    an async all_reduce of group B = {0, 3} rank 0 had in flight: missing_ranks [1] alone
    (helper-94: rank 3 was named too, in A's hang and in B's)."""
    for with_b in (False, True):
        b = TraceBuilder(4)
        t = b.warmup()
        b.heartbeats(b.t0, t)
        b.group("A", [0, 1, 2, 3] if not with_b else [0, 1, 2])
        if with_b:
            b.group("B", [0, 3])
            b.async_op(0, t + MS, None, None, "all_reduce", group="B")  # (launched, never waited on)
        for r in (0, 2):
            b.begin(r, t + 2 * MS, "all_reduce", group="A")
        b.exit(1, t + 5 * MS, reason="atexit", code=3)
        for r in (0, 2, 3):
            b.exit(r, t + (45 + r) * MS, reason="signal", signal="Terminated")
        for step in (1, 7):
            _, f = replay(b, {1}, hang_after=60.0, step=step)
            assert errors(f) == [("missing_ranks", [1])], (with_b, [x.message for x in f])


def test_a_cut_short_wait_drawn_into_another_hang_still_names_only_the_rank_that_left():
    """Rank 0 waits in group A's all_reduce for rank 1 from ``t``; rank 1, from 0.5 s, waits
    in group B's (1, 2, 3), which rank 2 left (sys.exit(3) at 0.6 s) and rank 3, idle, never
    entered; the launcher stops ranks 0, 1 and 3 at 2.2 s.  Rank 1's wait, drawn into A's
    hang, is still only cut short: rank 2 is named, not rank 3, stopped with the job
    (helper-97: a drawn wait counted as one past hang_after)."""
    b = TraceBuilder(4)
    t = b.warmup()
    b.group("A", [0, 1])
    b.group("B", [1, 2, 3])
    b.heartbeats(b.t0, t)
    b.sync(0, t, None, "all_reduce", group="A")
    b.sync(1, t + 500 * MS, None, "all_reduce", group="B")
    b.exit(2, t + 600 * MS, reason="atexit", code=3)
    b.heartbeats(t, t + 2200 * MS, ranks=[0, 1, 3])
    for r in (0, 1, 3):
        b.exit(r, t + 2200 * MS + r * MS, reason="signal", signal="Terminated")
    assert errors(diagnose(TraceModel.from_events(b.sorted_events()), hang_after=2.0)) == [("missing_ranks", [2])]


def test_a_hang_past_hang_after_names_every_absent_rank_whoever_was_stopped_in_it():
    """Rank 0 (or 2) waited 2.95 s, past hang_after (2 s), in the all_reduce; rank 1 left
    with sys.exit(3) at 2.5 s, rank 3 idle never came, the other entered at 2.9 s, and the
    launcher stopped them.  Ranks 1 and 3 are named, whichever rank waited long (helper-95:
    the cut-short narrowing to rank 1 depended on which was read first)."""
    for long, late in ((0, 2), (2, 0)):
        b = TraceBuilder(4)
        t = b.warmup()
        b.heartbeats(b.t0, t + 2950 * MS)
        b.begin(long, t, "all_reduce")
        b.exit(1, t + 2500 * MS, reason="atexit", code=3)
        b.begin(late, t + 2900 * MS, "all_reduce")
        for r in (0, 2, 3):
            b.exit(r, t + 2950 * MS, reason="signal", signal="Terminated")
        m = TraceModel.from_events(b.events)
        assert errors(diagnose(m, hang_after=2.0)) == [("missing_ranks", [1, 3])], long


def test_a_job_stopped_while_its_ranks_were_a_moment_into_a_collective_is_no_hang():
    """No rank left by itself before the stop: stopped with the rest (SIGTERM), or leaving
    through its own SIGTERM handler (``stop_signal`` on its exit), or leaving after the
    others were stopped, or only ending its recording (``uninstrument()``; helper-94).
    Nothing could tell these from a whole job stopped."""
    for leaver, at in ((None, 5), ({"reason": "atexit", "code": 0, "stop_signal": "Terminated",
                                    "stop_ts": 1}, 5), ({"reason": "atexit", "code": 3}, 60),
                       ({"reason": "uninstrument"}, 5)):  # (recording stopped, the process went on)
        b = TraceBuilder(3)
        _left_then_stopped(b, leaver, leave_at=at)
        if at == 60:  # (rank 1's exit came after the others were stopped)
            last = max(b.events, key=lambda e: e["ts"])
            assert (last["rank"], last["type"]) == (1, "exit")
        _, f = replay(b, set(), hang_after=60.0)
        assert errors(f) == [], (leaver, [x.message for x in f])


# ---------------------------------------------------------------------- mismatches that kill
def _mismatch_abort(b: TraceBuilder, *, recorded: bool) -> None:
    t = b.warmup()
    b.heartbeats(b.t0, t)
    if recorded:
        b.begin(0, t, "all_reduce", shape=(1000,))
    b.add(0, t + 3 * MS, "stack", reason="signal", threads=[dict(stack("step", 42, inside=True)[0])])
    b.exit(0, t + 3 * MS, reason="signal", signal="Aborted", exc="Fatal Python error: Aborted")
    ids = {1: b.begin(1, t, "all_reduce", shape=(100000,)), 2: b.begin(2, t, "all_reduce", shape=(1000,))}
    for r in (1, 2):
        b.end(r, ids[r], t + 5 * MS, exc=RESET)
    b.heartbeats(t + 10 * MS, t + 3 * S, ranks=[1, 2])


def test_mismatch_that_kills_a_rank_is_the_root_cause():
    b = TraceBuilder(3)
    _mismatch_abort(b, recorded=True)
    _, f = replay(b, {1})
    assert errors(f) == [("collective_mismatch", [1])]
    kinds = sorted(c["kind"] for c in f[0].evidence["consequences"])
    assert kinds == ["op_failed", "rank_crashed"]
    # (the rank the backend aborted in it was shown "waiting" beside the words that it died: helper-62)
    assert {r: d["state"] for r, d in f[0].evidence["per_rank"].items()} == {
        "0": "crashed", "1": "failed", "2": "failed"}


def _subgroup_mismatch_then_world(b: TraceBuilder, t: int) -> None:
    """Group b = {2, 3}: rank 3 passes another size, Gloo aborts it, rank 2's op fails and it
    crashes; ranks 0 and 1 then fail in the next world all_reduce and crash."""
    ids = {r: b.begin(r, t, "all_reduce", group="b", shape=(8,) if r == 3 else (1024,)) for r in (2, 3)}
    b.exit(3, t + 3 * MS, reason="signal", signal="Aborted", exc="gloo::EnforceNotMet: 1024 vs 8. Is there a "
                                                                   "distributed collective mismatch")
    b.end(2, ids[2], t + 5 * MS, exc=RESET)
    b.exit(2, t + 6 * MS, reason="exception", exc=RESET)
    for r in (0, 1):
        i = b.begin(r, t + 2 * MS, "all_reduce")
        b.end(r, i, t + 7 * MS, exc=RESET)
        b.exit(r, t + 8 * MS, reason="exception", exc=RESET)


def test_a_subgroup_mismatch_is_the_root_of_the_world_collective_failing_after_it():
    """Groups {0, 1} and {2, 3}; rank 3 passes another size to its subgroup's all_reduce:
    Gloo aborts it, rank 2's op fails and it crashes; ranks 0 and 1 then fail in the next
    world all_reduce, blamed on ranks 2 and 3, which departed.  One error, the mismatch, with
    the world's failure among its consequences.  Before, the failure stood beside it, blamed
    on the same ranks (helper-176): the departures were folded into the mismatch, so nothing
    said the ranks it names had gone."""
    b = TraceBuilder(4)
    b.group("a", [0, 1])
    b.group("b", [2, 3])
    t = b.warmup()
    b.heartbeats(b.t0, t)
    for r in (0, 1):
        b.sync(r, t, t + MS, "all_reduce", group="a")
    _subgroup_mismatch_then_world(b, t)
    _, f = replay(b, {2, 3})
    assert errors(f) == [("collective_mismatch", [2, 3])], [x.to_json()["message"] for x in f]
    assert {c["kind"] for c in f[0].evidence["consequences"]} >= {"op_failed", "rank_crashed"}
    assert any(c["kind"] == "op_failed" and c["group"] == "0" for c in f[0].evidence["consequences"])


def test_a_failure_of_its_own_before_a_mismatch_aborted_the_rank_stays_its_own():
    """Rank 3's all_gather in a group of its own failed as called (a local failure, caught),
    then the subgroup's mismatch aborted it: the mismatch is the root of what names rank 3
    after it, not of that earlier failure (helper-180: it was folded in)."""
    b = TraceBuilder(4)
    b.group("b", [2, 3])
    b.group("x", [3])
    t = b.warmup()
    b.heartbeats(b.t0, t)
    i = b.begin(3, t - 500_000, "all_gather", group="x")
    b.end(3, i, t - 400_000, exc="RuntimeError: ProcessGroupGloo::allgather: invalid tensor size at index 0")
    _subgroup_mismatch_then_world(b, t)
    _, f = replay(b, {2, 3})
    assert errors(f) == [("collective_mismatch", [2, 3]), ("op_failed", [3])], [x.to_json()["message"] for x in f]
    assert f[1].group == "x"


ENFORCE = ("gloo::EnforceNotMet: [enforce fail at ../third_party/gloo/gloo/transport/tcp/pair.cc:446] "
           "op.preamble.length <= op.nbytes. 512 vs 256. Received data size doesn't match expected size.")


def _pipeline(sends: dict[int, tuple[int, ...]], recvs: dict[int, tuple[int, ...]], steps: int = 4
              ) -> tuple[TraceBuilder, int, dict]:
    """Rank 1 sends to rank 2, ``steps`` times, the shape of each step given by ``sends``
    (else (4, 16)); rank 2 receives into ``recvs``'s (else (4, 16)).  Returns the builder,
    the time after, and the ops by (rank, step)."""
    b = TraceBuilder(3)
    t = b.warmup()
    ids = {}
    for k in range(steps):
        ids[(1, k)] = b.begin(1, t, "isend", peer=2, dir="send", shape=sends.get(k, (4, 16)), site="pipe.py:18")
        ids[(2, k)] = b.begin(2, t + MS, "irecv", peer=1, dir="recv", shape=recvs.get(k, (4, 16)), site="pipe.py:17")
        t += 10 * MS
    return b, t, ids


@pytest.mark.parametrize("larger", [True, False])
def test_a_send_and_its_recv_of_different_sizes_are_one_error_naming_both(larger):
    """Rank 1 sends 512 B where rank 2's recv takes 256 B: Gloo aborts rank 2 ("op.preamble.
    length <= op.nbytes. 512 vs 256"), and rank 1's next send fails on its closed
    connection.  The aborted receiver alone was named, as crashed (helper-203, a real Gloo
    pipeline).  A smaller message Gloo takes without a word, the rest of the buffer left as
    it was: the job read healthy, exit 0.  Either way one unmatched_p2p naming both ranks
    (which is wrong, nothing says), the abort and what followed its consequences."""
    b, t, ids = _pipeline({2: (4, 32) if larger else (4, 8)}, {})
    for k in range(2):
        for r in (1, 2):
            b.end(r, ids[(r, k)], t + k * MS)
    if larger:
        b.end(1, ids[(1, 2)], t + 2 * MS)
        b.end(2, ids[(2, 2)], t + 3 * MS, exc=ENFORCE)
        b.exit(2, t + 4 * MS, reason="exception", exc=ENFORCE)
        b.end(1, ids[(1, 3)], t + 5 * MS, exc=CLOSED)
        b.exit(1, t + 6 * MS, reason="exception", exc=CLOSED)
        b.heartbeats(b.t0, t + 3 * MS, ranks=[2])
        b.heartbeats(b.t0, t + 6 * MS, ranks=[0, 1])
    else:
        for k in range(2, 4):
            for r in (1, 2):
                b.end(r, ids[(r, k)], t + k * MS)
        b.heartbeats(b.t0, t + 5 * MS)
        for r in range(3):
            b.exit(r, t + 6 * MS)
    _, f = replay(b, {1, 2})
    if not larger:  # (Gloo takes it: a short microbatch, or a buffer of the largest size on purpose: a
        assert errors(f) == [], [x.to_json()["message"] for x in f]  # warning, helper-209)
    f = [x for x in f if x.kind == "unmatched_p2p" and x.severity == ("error" if larger else "warning")]
    assert [(x.kind, x.culprits) for x in f] == [("unmatched_p2p", [1, 2])], [x.to_json()["message"] for x in f]
    sizes = f[0].evidence["sizes"]
    assert {r: d["bytes"] for r, d in sizes.items()} == {"1": 512 if larger else 128, "2": 256}
    assert f"sends {'512' if larger else '128'} B where irecv #3 from 1 (group 0) (rank 2, at pipe.py:17)" \
        in f[0].message
    assert sorted((c["kind"], c["culprits"]) for c in f[0].evidence.get("consequences", [])) == (
        [("op_failed", [2]), ("op_failed", [2]), ("rank_crashed", [1]), ("rank_crashed", [2])] if larger else [])


def test_sends_and_recvs_tags_pair_in_another_order_are_not_a_size_mismatch():
    """Tags are not recorded: a send of 256 B then one of 512 B, received by tags into 512 B
    then 256 B, pair by their order as 256 against 512.  The channel's sizes are the same
    sizes in another order: no finding."""
    b, t, ids = _pipeline({0: (4, 16), 1: (4, 32)}, {0: (4, 32), 1: (4, 16)}, steps=2)
    for k in range(2):
        for r in (1, 2):
            b.end(r, ids[(r, k)], t + k * MS)
    b.heartbeats(b.t0, t + 5 * MS)
    for r in range(3):
        b.exit(r, t + 6 * MS)
    _, f = replay(b, set())
    assert errors(f) == []


@pytest.mark.parametrize("case", ["any_source", "recv_waiting", "max_buffer", "swapped_aborted", "beside_tags",
                                  "another_dtype", "aborted_beside"])
def test_a_size_mismatch_is_named_where_the_order_is_sure_and_only_there(case):
    """What the order pairing by posting order cannot be sure of, or what Gloo allows, is not
    a size mismatch; what it is sure of is (helper-206, real Gloo jobs):

    - any_source: rank 2 received its first message with an any-source recv, whose source
      the recorder does not say: its next recv paired with the first send (healthy job,
      exit 1); no finding;
    - recv_waiting: a send of 128 B tagged, and the recv of 256 B the receiver posted first
      (by its tag, for the next message) still waiting: a live check named it; none;
    - max_buffer: every message into a buffer of the largest size, on purpose (Gloo allows
      it): a warning, not an error (as an error it came and went as a live job ran,
      helper-209);
    - swapped_aborted: the receiver took the two messages in the other order, and Gloo
      aborted it on the larger (the sizes cancel out, and the guard left the channel
      alone): both ranks named;
    - beside_tags: a pair tags reordered beside one short microbatch: the short one named
      (a warning: Gloo takes it), not the reordered pair;
    - another_dtype: one float32 (4, 16) message into a float64 (4, 16) buffer: named;
    - aborted_beside: rank 2 aborted on rank 1's larger message while rank 0's smaller one
      into a larger buffer waited in an irecv of its: rank 0 was named too (helper-209);
      the abort names the pair its sizes say."""
    world, culprits = 3, set()
    b = TraceBuilder(world)
    t = b.warmup()
    if case == "any_source":
        s1 = b.sync(1, t, t + MS, "send", peer=2, dir="send", shape=(5,), site="a.py:5")
        s2 = b.sync(1, t + 2 * MS, t + 3 * MS, "send", peer=2, dir="send", shape=(9,), site="a.py:6")
        any_ = b.begin(2, t, "recv", peer=None, dir="recv", shape=(5,), site="a.py:12")
        b.end(2, any_, t + MS)
        b.sync(2, t + 2 * MS, t + 3 * MS, "recv", peer=1, dir="recv", shape=(9,), site="a.py:13")
        assert s1 and s2
    elif case == "recv_waiting":
        b.sync(1, t, t + MS, "isend", peer=2, dir="send", shape=(32,), site="a.py:5")
        b.sync(1, t, t + MS, "isend", peer=2, dir="send", shape=(64,), site="a.py:6")
        b.begin(2, t + MS, "recv", peer=1, dir="recv", shape=(64,), site="a.py:12")
    elif case == "max_buffer":
        for k, n in enumerate((100, 37, 512)):
            b.sync(1, t + 3 * k * MS, t + (3 * k + 1) * MS, "send", peer=2, dir="send", shape=(n,), site="a.py:5")
            b.sync(2, t + 3 * k * MS, t + (3 * k + 2) * MS, "recv", peer=1, dir="recv", shape=(1024,), site="a.py:12")
    elif case == "swapped_aborted":
        culprits = {1, 2}
        b.sync(1, t, t + MS, "send", peer=2, dir="send", shape=(8,), site="a.py:5")
        b.begin(1, t + 2 * MS, "send", peer=2, dir="send", shape=(8, 16), site="a.py:6")
        b.sync(2, t, t + MS, "recv", peer=1, dir="recv", shape=(8, 16), site="a.py:12")
        bad = b.begin(2, t + 2 * MS, "recv", peer=1, dir="recv", shape=(8,), site="a.py:13")
        aborted = ENFORCE.replace("512 vs 256", "512 vs 32")  # (its sizes, as Gloo says them)
        b.end(2, bad, t + 3 * MS, exc=aborted)
        b.exit(2, t + 4 * MS, reason="exception", exc=aborted)
    elif case == "beside_tags":
        sends = [(10,), (20,), (32,), (32,), (24,), (32,)]
        recvs = [(20,), (10,), (32,), (32,), (32,), (32,)]
        for k, (a, c) in enumerate(zip(sends, recvs, strict=True)):
            b.sync(1, t + 3 * k * MS, t + (3 * k + 1) * MS, "isend", peer=2, dir="send", shape=a,
                   site=f"a.py:{5 + min(k, 2)}")
            b.sync(2, t + 3 * k * MS, t + (3 * k + 2) * MS, "recv", peer=1, dir="recv", shape=c,
                   site=f"a.py:{12 + min(k, 2)}")
    elif case == "aborted_beside":
        culprits = {1, 2}
        b.sync(0, t, t + MS, "isend", peer=2, dir="send", shape=(37,), site="b.py:5")
        b.begin(2, t, "irecv", peer=0, dir="recv", shape=(1024,), site="b.py:12")
        b.sync(1, t, t + MS, "send", peer=2, dir="send", shape=(8, 16), site="a.py:5")
        bad = b.begin(2, t + MS, "recv", peer=1, dir="recv", shape=(8,), site="a.py:13")
        aborted = ENFORCE.replace("512 vs 256", "512 vs 32")
        b.end(2, bad, t + 3 * MS, exc=aborted)
        b.exit(2, t + 4 * MS, reason="exception", exc=aborted)
    else:
        culprits = {1, 2}
        b.sync(1, t, t + MS, "send", peer=2, dir="send", shape=(4, 16), site="a.py:5")
        b.sync(2, t, t + 2 * MS, "recv", peer=1, dir="recv", shape=(4, 16), dtype="float64", out_bytes=512,
               site="a.py:12")
    b.heartbeats(b.t0, t + 20 * MS)
    _, f = replay(b, culprits)
    sized = [x for x in f if "sizes" in x.evidence and x.severity == "error"]
    assert bool(sized) == bool(culprits), [x.to_json()["message"] for x in f]
    warned = [x for x in f if "sizes" in x.evidence and x.severity == "warning"]
    assert [x.culprits for x in warned] == ([[1, 2]] if case in ("max_buffer", "beside_tags") else [])
    if case == "beside_tags":
        (x,) = warned
        assert {r: d["bytes"] for r, d in x.evidence["sizes"].items()} == {"1": 96, "2": 128}, x.message


@pytest.mark.parametrize("world", [3, 2])
def test_a_collective_called_on_the_wrong_group_names_its_rank_not_the_one_it_waits_for(world):
    """Rank 0 calls all_reduce on group {0, 1} where the other ranks call the world's: 0
    waits there for rank 1, which waits in the world's for 0.  One error, on rank 0 (the
    hang more ranks wait in), the other hang its consequence; before, rank 1 was named too,
    in a second error, for doing what the majority did (helper-176).  With two ranks, one
    waiting in each, neither is the odd one out: they called the two groups' collectives in
    different orders, a wait cycle, one error naming both (``wait_cycle``), the other hang
    its consequence; before, two errors, each naming the other's victim (helper-196)."""
    b = TraceBuilder(world)
    b.group("pair", [0, 1])
    t = b.warmup()
    b.begin(0, t, "all_reduce", group="pair")
    for r in range(1, world):
        b.begin(r, t, "all_reduce")
    b.heartbeats(b.t0, t + 10 * S)
    _, f = replay(b, {0} if world == 3 else {0, 1}, hang_after=3.0)
    if world == 3:
        assert errors(f) == [("missing_ranks", [0])]
        assert [(c["kind"], c["group"], c["culprits"]) for c in f[0].evidence["consequences"]] == [
            ("missing_ranks", "pair", [1])]
    else:
        assert errors(f) == [("missing_ranks", [0, 1])], [x.to_json()["message"] for x in f]
        assert f[0].evidence["wait_cycle"] == ["0", "pair"] and not f[0].victims
        assert f[0].message.startswith("ranks 0, 1 called the collectives of groups 0, pair in different orders: "
                                       "each waits in one for another (a wait cycle); first: ")
        assert [(c["kind"], c["culprits"]) for c in f[0].evidence["consequences"]] == [("missing_ranks", [0])]


def _crossing(world: int) -> tuple[TraceBuilder, int, int]:
    """Ranks 0 and 1 in the all_reduces of groups A and B (both {0, 1}), each in the one the
    other never reaches; rank 2 in the world's barrier.  Returns the builder, when they
    began, and rank 2's barrier."""
    b = TraceBuilder(world)
    b.group("A", [0, 1])
    b.group("B", [0, 1])
    t = b.warmup()
    b.begin(0, t, "all_reduce", group="A")
    b.begin(1, t + MS, "all_reduce", group="B")
    return b, t, b.begin(2, t + 2 * MS, "barrier")


@pytest.mark.parametrize("ended", [False, True])
def test_two_ranks_calling_two_groups_collectives_in_different_orders_are_one_error_holding_the_rest(ended):
    """Ranks 0 and 1 call the all_reduces of groups A and B, both {0, 1}, in different
    orders; rank 2 waits in the world's barrier, which times out on them, and crashes of it.
    Three errors (each group's hang naming the other's victim, and the barrier's failure):
    one root cause.  One missing_ranks naming ranks 0 and 1, a wait cycle, the other hang,
    the barrier's failure and rank 2's crash its consequences (helper-196, a real Gloo job);
    and so before the barrier's timeout ends its wait."""
    b, t, bar = _crossing(3)
    b.heartbeats(b.t0, t + 12 * S)
    if ended:
        b.end(2, bar, t + 10 * S, exc=TIMED_OUT)
        b.exit(2, t + 10 * S + 5 * MS, reason="exception", exc=TIMED_OUT)
    _, f = replay(b, {0, 1}, hang_after=3.0)
    assert errors(f) == [("missing_ranks", [0, 1])], [x.to_json()["message"] for x in f]
    assert f[0].evidence["wait_cycle"] == ["A", "B"] and set(f[0].victims) == {2}
    assert [c["kind"] for c in f[0].evidence["consequences"]] == (
        ["missing_ranks", "op_failed", "rank_crashed"] if ended else ["missing_ranks", "missing_ranks"])


def test_a_wait_cycle_of_groups_names_both_ranks_at_every_moment_as_their_timeouts_end_it():
    """As above, the backend's timeouts ending the cycle one rank at a time: rank 0 times out
    in A and crashes, rank 1 in B a second later, then rank 2's barrier.  Once rank 0 had
    crashed, the walk led from it to rank 1 and the finding named rank 1 alone, rank 0 its
    victim; at the end, "ranks 0, 1 crashed together" (helper-205).  At every moment one
    error naming both, none of them a victim, the cycle said."""
    b = TraceBuilder(3)
    b.group("A", [0, 1])
    b.group("B", [0, 1])
    t = b.warmup()
    ops = {0: b.begin(0, t, "all_reduce", group="A"), 1: b.begin(1, t + S, "all_reduce", group="B")}
    bar = b.begin(2, t + 2 * S, "barrier")
    b.heartbeats(b.t0, t + 10 * S)
    for r, at in ((0, 10), (1, 11)):
        b.end(r, ops[r], t + at * S, exc=TIMED_OUT)
        b.exit(r, t + at * S + 5 * MS, reason="exception", exc=TIMED_OUT)
        b.heartbeats(t + at * S, t + (at + 1) * S, ranks=[x for x in range(3) if x > r])
    b.end(2, bar, t + 12 * S, exc=TIMED_OUT)
    b.exit(2, t + 12 * S + 5 * MS, reason="exception", exc=TIMED_OUT)
    events, m, k = sorted(b.events, key=lambda e: e["ts"]), TraceModel(), 0
    for at in (9.5, 10.5, 11.5, 12.5):
        while k < len(events) and events[k]["ts"] <= t + int(at * S):
            m.ingest([events[k]])
            k += 1
        f = [x for x in diagnose(m, now=t + int(at * S), hang_after=3.0) if x.severity == "error"]
        assert [(x.culprits, x.evidence.get("wait_cycle")) for x in f] == [([0, 1], ["A", "B"])], (at, f)
        assert not set(f[0].victims) & {0, 1}, (at, f[0].victims)
    assert sum(c["kind"] == "rank_crashed" for c in f[0].evidence["consequences"]) == 3


def _rank_2_in_s1_the_others_in_the_world(b: TraceBuilder, t: int, ended: bool) -> None:
    """Rank 2 in group s1's all_reduce at ``t``, ranks 0, 1 and 3 in the world's; ``ended``:
    Gloo's timeouts end it (rank 2's first, and it crashes; the others fail on its closed
    connection, and they crash)."""
    stuck = {2: b.begin(2, t, "all_reduce", group="s1")}
    for r in (0, 1, 3):
        stuck[r] = b.begin(r, t + MS, "all_reduce")
    b.heartbeats(b.t0, t + 12 * S)
    if not ended:
        return
    b.end(2, stuck[2], t + 10 * S, exc=TIMED_OUT)
    b.exit(2, t + 10 * S + 5 * MS, reason="exception", exc=TIMED_OUT)
    for r in (0, 1, 3):
        b.end(r, stuck[r], t + 10 * S + 10 * MS, exc=CLOSED)
        b.exit(r, t + 10 * S + 15 * MS, reason="exception", exc=CLOSED)


@pytest.mark.parametrize("ended", [False, True])
def test_a_rank_that_skipped_a_step_its_sibling_subgroups_took_is_named_not_its_partner(ended):
    """``new_subgroups(group_size=2)`` on 4 ranks: {0, 1} and {2, 3} each run three
    all_reduces, then the world's; rank 3 skips its third and goes into the world's.  Rank 2
    waits in {2, 3}'s for rank 3, ranks 0, 1 and 3 in the world's for rank 2: the world's
    hang, more ranks waiting, named rank 2, which did what {0, 1} did (helper-203, a real
    Gloo job, 5 of 5 runs, live and once the timeouts ended it).  A step a sibling group
    took names its absentee: rank 3."""
    b = TraceBuilder(4)
    b.group("s0", [0, 1])
    b.group("s1", [2, 3])
    t = b.warmup()
    for step in range(3):
        t = b.collective(t, "all_reduce", "s0") + MS
        if step < 2:
            t = b.collective(t, "all_reduce", "s1") + MS
    _rank_2_in_s1_the_others_in_the_world(b, t, ended)
    _, f = replay(b, {3}, hang_after=3.0)
    assert errors(f) == [("op_failed" if ended else "missing_ranks", [3])], [x.to_json()["message"] for x in f]
    assert f[0].group == "s1" and not set(f[0].victims) & {3}


@pytest.mark.parametrize("ended", [False, True])
def test_groups_of_one_size_that_do_not_run_in_step_are_no_siblings(ended):
    """s0 = {0, 1} runs three all_reduces a step, s1 = {2, 3} two, then the world's; at step
    4 rank 2 makes an extra s1 call while ranks 0, 1 and 3 go into the world's.  s0's seqs,
    past s1's, read as a sibling that took the step, and rank 3, which did right, was named
    (helper-207).  A sibling is in step: its newest seq is the step's, and its members wait
    where the absentee does.  Rank 2 named, live and once the timeouts end it."""
    b = TraceBuilder(4)
    b.group("s0", [0, 1])
    b.group("s1", [2, 3])
    t = b.warmup()
    for step in range(4):
        for _ in range(3):
            t = b.collective(t, "all_reduce", "s0") + MS
        for _ in range(2):
            t = b.collective(t, "all_reduce", "s1") + MS
        if step < 3:
            t = b.collective(t, "all_reduce") + MS
    _rank_2_in_s1_the_others_in_the_world(b, t, ended)
    _, f = replay(b, {2}, hang_after=3.0)
    assert [c for k, c in errors(f)] == [[2]], [x.to_json()["message"] for x in f]


def test_a_wait_cycle_of_three_groups_beside_a_group_that_ran_more_is_still_the_cycle():
    """A = {0, 1}, B = {1, 2}, C = {0, 2}: each rank in one, waiting for another; an unrelated
    D = {2, 3} had run four all_reduces more.  D read as C's sibling, and two of the cycle's
    ranks became victims (helper-207).  One error naming 0, 1 and 2."""
    b = TraceBuilder(4)
    for g, rs in (("A", [0, 1]), ("B", [1, 2]), ("C", [0, 2]), ("D", [2, 3])):
        b.group(g, rs)
    t = b.warmup()
    for g in ("A", "B", "C", "D", "D", "D", "D"):
        t = b.collective(t, "all_reduce", g) + MS
    for r, g in enumerate("ABC"):
        b.begin(r, t + r * MS, "all_reduce", group=g)
    b.heartbeats(b.t0, t + 12 * S)
    _, f = replay(b, {0, 1, 2}, hang_after=3.0)
    assert errors(f) == [("missing_ranks", [0, 1, 2])] and f[0].evidence["wait_cycle"] == ["A", "B", "C"]
    assert not f[0].victims


def test_a_hang_that_waits_on_a_wait_cycle_and_an_idle_rank_names_the_idle_rank():
    """Ranks 0 and 1 in a wait cycle of groups A and B; rank 2 waits in the world's barrier,
    which idle rank 3 never reaches either.  The barrier's hang named ranks 0, 1 and 3: the
    cycle named twice (helper-205).  It names rank 3, and says where 0 and 1 are."""
    b, t, _ = _crossing(4)
    b.heartbeats(b.t0, t + 12 * S)
    _, f = replay(b, {0, 1, 3}, hang_after=3.0)
    assert errors(f) == [("missing_ranks", [0, 1]), ("missing_ranks", [3])], [x.to_json()["message"] for x in f]
    assert f[1].message.endswith("; ranks 0, 1 are in a wait cycle of groups' collectives"), f[1].message


@pytest.mark.parametrize("timed_out", [False, True])
def test_a_rank_that_skipped_a_step_of_a_2d_mesh_is_named_alone(timed_out):
    """tp groups {0,1}, {2,3} and dp groups {0,2}, {1,3}: rank 3 skips a step's two
    all_reduces and waits in the world's barrier; rank 2 waits in tp {2,3} for it, rank 0 in
    dp {0,2} for rank 2, rank 1 in dp {1,3} for rank 3.  The groups' hangs tie, and the
    finding named ranks 2 and 3, rank 2 a victim waiting in a hang the finding holds
    (helper-186, live: a hand-made mesh and DTensor's alike).  Rank 3 alone: a tied hang
    whose absentees wait in another tied hang is its consequence."""
    b = TraceBuilder(4)
    groups = {"tp0": [0, 1], "tp1": [2, 3], "dp0": [0, 2], "dp1": [1, 3]}
    for name, granks in groups.items():
        b.group(name, granks)
    t = b.warmup()
    for _ in range(2):
        for name in groups:
            t = b.collective(t, "all_reduce", name) + MS
    for name in ("tp0", "tp1", "dp0", "dp1"):  # (step 3: rank 3 skips it)
        t = b.collective(t, "all_reduce", name, ranks=[r for r in groups[name] if r != 3]) + MS \
            if 3 not in groups[name] else t
    t = b.collective(t, "all_reduce", "tp0") + MS  # (step 4: ranks 0 and 1 through tp0)
    ids = {0: b.begin(0, t, "all_reduce", group="dp0"), 1: b.begin(1, t, "all_reduce", group="dp1"),
           2: b.begin(2, t, "all_reduce", group="tp1"), 3: b.begin(3, t, "barrier")}
    b.heartbeats(b.t0, t + 12 * S)
    if timed_out:  # (Gloo's: rank 3's barrier times out, and it crashes; ranks 2 and 1 crash of its going)
        b.end(3, ids[3], t + 10 * S, exc=TIMED_OUT)
        b.exit(3, t + 10 * S + 5 * MS, reason="exception", exc=TIMED_OUT)
        for r, at in ((2, 10), (1, 12)):
            b.end(r, ids[r], t + 10 * S + at * MS, exc=CLOSED)
            b.exit(r, t + 10 * S + (at + 5) * MS, reason="exception", exc=CLOSED)
    _, f = replay(b, {3}, hang_after=3.0)
    if timed_out:
        assert errors(f) == [("op_failed", [3])], [x.to_json()["message"] for x in f]
        assert sum(c["kind"] == "rank_crashed" for c in f[0].evidence["consequences"]) == 3
        return
    assert errors(f) == [("missing_ranks", [3])], [x.to_json()["message"] for x in f]
    assert {c["group"] for c in f[0].evidence["consequences"]} | {f[0].group} == {"0", "dp0", "dp1", "tp1"}
    assert f[0].message.startswith("rank 3 is in another group's collective while 2 groups wait for it; first: ")


@pytest.mark.parametrize("ended", ["crashed", "caught", "both_timed_out"])
@pytest.mark.parametrize("world", [4, 3])
def test_a_wrong_group_call_the_backend_s_timeouts_ended_is_one_error(world, ended):
    """As above, until Gloo's timeouts end the waits: ranks 1-3 time out in the world's
    all_reduce (rank 0 never came), rank 0's in the pair's then fails as rank 1 leaves (or
    times out itself), and the ranks crash of it (or catch it and exit).  Live, one
    missing_ranks on rank 0; after, each failure's blame led to the other's ranks, a cycle
    the walk stops at: two rank_crashed roots, each the other's consequence, or two
    op_failed (helper-182: rank 1 skipped one of the pair's all_reduce calls).  One error,
    the world's failure blamed on rank 0, the pair's and every crash its consequences."""
    b = TraceBuilder(world)
    b.group("pair", [0, 1])
    t = b.warmup()
    ids = {0: b.begin(0, t, "all_reduce", group="pair")}
    for r in range(1, world):
        ids[r] = b.begin(r, t + r * MS, "all_reduce")
    b.heartbeats(b.t0, t + 12 * S)
    for r in range(1, world):
        b.end(r, ids[r], t + 10 * S + r * MS, exc=TIMED_OUT)
    b.end(0, ids[0], t + 10 * S + (-MS if ended == "both_timed_out" else 10 * MS),
          exc=TIMED_OUT if ended == "both_timed_out" else CLOSED)
    for r in range(world):
        if ended == "caught":
            b.exit(r, t + 10 * S + 20 * MS + r * MS, code=2)
        else:
            b.exit(r, t + 10 * S + 20 * MS + r * MS, reason="exception",
                   exc=TIMED_OUT if r or ended == "both_timed_out" else CLOSED)
    _, f = replay(b, {0}, hang_after=3.0)
    assert errors(f) == [("op_failed", [0])], [x.to_json()["message"] for x in f]
    assert f[0].group == "0" and not set(f[0].victims) & {0}
    cons = f[0].evidence["consequences"]
    assert ("op_failed", "pair") in [(c["kind"], c["group"]) for c in cons]
    assert sum(c["kind"] == "rank_crashed" for c in cons) == (0 if ended == "caught" else world)


@pytest.mark.parametrize("waits", ["recv", "group"])
def test_what_waits_on_a_rank_held_by_a_wrong_group_call_is_led_to_that_call(waits):
    """Rank 0 calls group {0, 1}'s all_reduce where ranks 1 and 2 call group G's; rank 3
    waits on rank 1 (a recv from it, or a group {1, 3} all_reduce): rank 1 is held in G by
    rank 0, so one error names rank 0, the rest its consequences.  Before, the crossing was
    judged after the walk that leads waits to their roots, and rank 3's wait named rank 1
    (helper-180)."""
    b = TraceBuilder(4)
    b.group("pair", [0, 1])
    b.group("G", [0, 1, 2])
    b.group("H", [1, 3])
    t = b.warmup()
    b.begin(0, t, "all_reduce", group="pair")
    for r in (1, 2):
        b.begin(r, t, "all_reduce", group="G")
    if waits == "recv":
        b.begin(3, t, "recv", peer=1, dir="recv")
    else:
        b.begin(3, t, "all_reduce", group="H")
    b.heartbeats(b.t0, t + 10 * S)
    _, f = replay(b, {0}, hang_after=3.0)
    assert errors(f) == [("missing_ranks", [0])]
    assert sorted(c["culprits"] for c in f[0].evidence["consequences"]) == [[1], [1]]


def test_mismatch_whose_dead_rank_never_recorded_its_call_names_no_innocent():
    b = TraceBuilder(3)
    _mismatch_abort(b, recorded=False)
    _, f = replay(b, {1})
    assert errors(f) == [("collective_mismatch", [])]
    assert f[0].evidence["died_in_it"] == [0] and "cannot be told" in f[0].message


# ---------------------------------------------------------------------- health and stacks
def test_ranks_exiting_at_different_times_are_healthy():
    b = TraceBuilder(3)
    t = b.warmup(6)
    for r in range(3):
        b.heartbeats(b.t0, t + r * 700 * MS, ranks=[r])
        b.exit(r, t + r * 700 * MS + MS, reason="destroy_process_group")
    _, f = replay(b, set(), step=3)
    assert f == []
    _, f = replay(b, set(), end=t + 3600 * S)
    assert f == []


def test_slow_progressing_rank_is_healthy():
    b = TraceBuilder(3)
    t = b.t0 + S // 10
    for _ in range(8):
        t = b.collective(t, "all_reduce", skew={2: 900 * MS}) + MS
    b.heartbeats(b.t0, t)
    _, f = replay(b, set())
    assert errors(f) == []


def test_unanswered_stack_request_says_the_rank_cannot_run_python():
    b = TraceBuilder(3)
    t = b.warmup()
    for r in (0, 2):
        b.sync(r, t, None, "all_reduce")
        b.add(r, t + 2 * S + 300 * MS, "stack", reason="request", trigger=0, request_ns=t + 2 * S + 20 * MS,
              threads=stack("step", 42, inside=True))
    b.heartbeats(b.t0, t + 8 * S, ranks=[0, 2])
    b.heartbeats(b.t0, t + 8 * S, ranks=[1])  # its heartbeat runs, but its threads never answer
    _, f = replay(b, {1})
    assert errors(f) == [("missing_ranks", [1])]
    assert "GIL" in f[0].evidence["stack_info"]["1"]["missing"]


def test_mismatch_names_nobody_until_the_last_call_is_in():
    b = TraceBuilder(3)
    t = b.warmup()
    b.sync(0, t, None, "all_reduce")
    b.sync(1, t + MS, None, "broadcast", root=0)
    b.heartbeats(b.t0, t + 2 * S)
    m = TraceModel.from_events(sorted(b.events, key=lambda e: e["ts"]))
    f = diagnose(m, now=t + 2 * S, hang_after=60.0)
    assert errors(f) == [("collective_mismatch", [])]
    assert f[0].evidence["undecided"] == {"died_in_it": [], "not_yet": [2]}
    b.sync(2, t + 2 * S + MS, None, "all_reduce")
    b.heartbeats(t + 2 * S, t + 3 * S)
    _, f = replay(b, {1}, hang_after=60.0)
    assert errors(f) == [("collective_mismatch", [1])]


def test_a_failure_of_ranks_in_different_ops_is_not_said_as_one_op():
    """A mismatch (ranks 0 and 2 in all_reduce #4, rank 1 in broadcast #4) whose ops all time
    out: the failure said "all_reduce #4 failed on ranks 0, 1, 2" (helper-67), though rank 1
    was in a broadcast.  It names the collective and the ops."""
    b = TraceBuilder(3)
    t = b.warmup()
    ids = {r: b.begin(r, t, "broadcast" if r == 1 else "all_reduce", root=0 if r == 1 else None) for r in range(3)}
    for r in range(3):
        b.end(r, ids[r], t + 60 * S + r * MS, exc=TIMED_OUT)
    b.heartbeats(b.t0, t + 61 * S)
    _, f = replay(b, {1})
    assert errors(f) == [("collective_mismatch", [1])]
    (failed,) = [c for c in f[0].evidence["consequences"] if c["kind"] == "op_failed"]
    assert failed["message"].startswith("collective #4 of group 0 (all_reduce, broadcast) failed on ranks 0, 1, 2 (")
    assert "Then: collective #4 failed on ranks 0, 1, 2" in f[0].message, f[0].message


@pytest.mark.parametrize("world,size", [(16, 4), (8, 4)])
def test_one_rank_per_group_calling_the_worlds_collective_is_one_error_naming_those_ranks(world, size):
    """A rank in each group of ``size`` calls the world's all_reduce where the rest of its
    group call the group's: every group's hang waits on its odd rank, the world's on all the
    others (a cycle through every group).  One error names the odd ranks, the world's hang
    and the other groups' its consequences.  Before, at 16 ranks the world's four waiters
    outnumbered each group's three and its hang named the twelve ranks that did right; at 8,
    three errors stood (at 4,096 ranks in groups of 8, one naming the 3,584 that did right)."""
    b = TraceBuilder(world)
    for k in range(world // size):
        b.group(f"g{k}", list(range(k * size, (k + 1) * size)))
    t = b.warmup()
    odd = set(range(0, world, size))
    for r in range(world):
        b.begin(r, t, "all_reduce", **({} if r in odd else {"group": f"g{r // size}"}))
    b.heartbeats(b.t0, t + 10 * S)
    _, f = replay(b, odd, hang_after=3.0)
    assert errors(f) == [("missing_ranks", sorted(odd))], [x.to_json()["message"] for x in f]
    assert sorted(c["group"] for c in f[0].evidence["consequences"]) == ["0"] + [f"g{k}" for k in range(1, world // size)]
    assert f[0].message.startswith(f"ranks {', '.join(map(str, sorted(odd)))} are each in another group's collective")


@pytest.mark.parametrize("crashing", ["none", "first", "all"])
@pytest.mark.parametrize("world", [2, 3])
def test_a_p2p_deadlock_ended_by_timeouts_is_one_p2p_deadlock(world, crashing):
    """Each rank's recv from the next waits for a send that rank never posts (it waits in
    its own recv), until Gloo's timeout ends every wait and the ranks exit (the exception
    caught) or crash of it (all of them, or the first alone).  Live, one p2p_deadlock; after,
    each recv's op_failed was blamed on the next rank, an error each, naming every rank a
    victim of another; crashed, their crash together was the root and the deadlock its
    consequence, and where one rank crashed the walk blamed a rank that never did
    (helper-182, helper-185).  One p2p_deadlock of them all, its cycle the failed recvs,
    the failures and crashes its consequences."""
    b = TraceBuilder(world)
    t = b.warmup()
    ids = {r: b.begin(r, t + r * MS, "recv", peer=(r + 1) % world, dir="recv") for r in range(world)}
    b.heartbeats(b.t0, t + 10 * S)
    crashed = {"none": [], "first": [0], "all": list(range(world))}[crashing]
    for r in range(world):
        b.end(r, ids[r], t + 10 * S + r * MS, exc=TIMED_OUT)
        if r in crashed:
            b.exit(r, t + 10 * S + 5 * MS, reason="exception", exc=TIMED_OUT)
        else:
            b.exit(r, t + 10 * S + 5 * MS, code=2)
    _, f = replay(b, set(range(world)), hang_after=3.0)
    assert errors(f) == [("p2p_deadlock", list(range(world)))], [x.to_json()["message"] for x in f]
    assert sorted(c["kind"] for c in f[0].evidence["consequences"]) == \
        ["op_failed"] * world + ["rank_crashed"] * len(crashed)
    assert [s["rank"] for s in f[0].evidence["cycle"]] == ([0, 1] if world == 2 else [0, 1, 2])
    assert "; the backend's timeout ended each wait. Then: recv #1 failed on rank 0" in f[0].message


def test_a_crash_of_something_else_after_a_timed_out_deadlock_stands_apart():
    """Ranks 0 and 1 deadlock and time out; rank 0 crashes of it, rank 1 catches it and
    crashes a minute later of something else: the deadlock, and rank 1's crash on its own
    (helper-185: it was folded into the deadlock, and the deadlock named rank 0 alone)."""
    b = TraceBuilder(2)
    t = b.warmup()
    ids = {r: b.begin(r, t + r * MS, "recv", peer=1 - r, dir="recv") for r in range(2)}
    b.heartbeats(b.t0, t + 70 * S)
    for r in range(2):
        b.end(r, ids[r], t + 10 * S + r * MS, exc=TIMED_OUT)
    b.exit(0, t + 10 * S + 5 * MS, reason="exception", exc=TIMED_OUT)
    b.exit(1, t + 70 * S, reason="exception", exc="ValueError: checkpoint dir /ckpt/step_100 not writable")
    _, f = replay(b, {0, 1}, hang_after=3.0)
    assert errors(f) == [("p2p_deadlock", [0, 1]), ("rank_crashed", [1])], [x.to_json()["message"] for x in f]
    assert "ValueError" in f[1].message


def test_p2p_timeouts_that_did_not_wait_at_once_are_no_deadlock():
    """Rank 0's recv from 1 timed out before rank 1 began its recv from 0: no cycle of
    waits at once, and each timeout stands (the first is rank 1's doing: it came late)."""
    b = TraceBuilder(2)
    t = b.warmup()
    i = b.begin(0, t, "recv", peer=1, dir="recv")
    b.end(0, i, t + 5 * S, exc=TIMED_OUT)
    j = b.begin(1, t + 6 * S, "recv", peer=0, dir="recv")
    b.end(1, j, t + 11 * S, exc=TIMED_OUT)
    b.heartbeats(b.t0, t + 12 * S)
    _, f = replay(b, {0, 1}, hang_after=3.0)
    assert "p2p_deadlock" not in {x.kind for x in f}


def test_a_subgroup_mismatch_its_ranks_wait_in_is_the_root_of_the_world_collective_timing_out():
    """Groups {0, 1} and {2, 3}; rank 3 calls broadcast where rank 2 calls all_reduce, and
    both wait there (nothing aborts them); ranks 0 and 1 then time out in the next world
    all_reduce, blamed on ranks 2 and 3, and crash.  One error, the mismatch, the world's
    failure and the crashes its consequences.  Before, the failure stood beside it, blamed
    on the ranks the mismatch held (helper-182; the rule covered ranks it aborted only)."""
    b = TraceBuilder(4)
    b.group("a", [0, 1])
    b.group("b", [2, 3])
    t = b.warmup()
    for r in (0, 1):
        b.sync(r, t, t + MS, "all_reduce", group="a")
    b.begin(2, t, "all_reduce", group="b")
    b.begin(3, t, "broadcast", group="b", root=2)
    for r in (0, 1):
        i = b.begin(r, t + 2 * MS, "all_reduce")
        b.end(r, i, t + 15 * S, exc="RuntimeError: [../pair.cc:598] Timed out waiting 15000ms for send operation "
                                  "to complete")
        b.exit(r, t + 15 * S + MS, reason="exception", exc="RuntimeError: Timed out waiting 15000ms")
    b.heartbeats(b.t0, t + 16 * S, ranks=[2, 3])
    _, f = replay(b, {2, 3})
    assert errors(f) == [("collective_mismatch", [2, 3])], [x.to_json()["message"] for x in f]
    assert {c["kind"] for c in f[0].evidence["consequences"]} == {"op_failed", "rank_crashed"}


def test_a_failure_blamed_on_ranks_of_a_p2p_deadlock_is_its_consequence():
    """Ranks 0 and 1 each recv from the other, never sending; rank 2's all_reduce times out
    on them ("each held in a send or recv the others of them had not posted").  One error,
    the deadlock; before, the all_reduce's failure stood beside it (helper-182)."""
    b = TraceBuilder(3)
    t = b.warmup()
    ids = {r: b.begin(r, t, "recv", peer=1 - r, dir="recv") for r in (0, 1)}
    i = b.begin(2, t, "all_reduce")
    b.heartbeats(b.t0, t + 10 * S)
    b.end(2, i, t + 10 * S, exc="RuntimeError: [../pair.cc:598] Timed out waiting 10000ms for recv operation to "
                                "complete")
    for r in (0, 1):
        b.end(r, ids[r], t + 10 * S + (r + 1) * MS, exc=TIMED_OUT)
    _, f = replay(b, {0, 1}, hang_after=3.0)
    assert errors(f) == [("p2p_deadlock", [0, 1])], [x.to_json()["message"] for x in f]
    assert sorted(c["kind"] for c in f[0].evidence["consequences"]) == ["op_failed"] * 3
    assert any(c["group"] == "0" and c["op"] == "all_reduce" for c in f[0].evidence["consequences"])


def test_a_failure_that_fired_before_a_deadlock_began_is_not_its_consequence():
    """Rank 2's all_reduce timed out on ranks 0 and 1, busy elsewhere; only later did they
    deadlock in recvs from each other: two errors (helper-185: the failure was folded into
    the deadlock that came after it)."""
    b = TraceBuilder(3)
    t = b.warmup()
    i = b.begin(2, t, "all_reduce")
    b.end(2, i, t + 10 * S, exc="RuntimeError: [../pair.cc:598] Timed out waiting 10000ms for recv operation to "
                                "complete")
    ids = {r: b.begin(r, t + 20 * S, "recv", peer=1 - r, dir="recv") for r in (0, 1)}
    b.heartbeats(b.t0, t + 30 * S)
    for r in (0, 1):
        b.end(r, ids[r], t + 30 * S + (r + 1) * MS, exc=TIMED_OUT)
    _, f = replay(b, {0, 1}, hang_after=3.0)
    assert sorted(errors(f)) == [("op_failed", [0, 1]), ("p2p_deadlock", [0, 1])], [x.to_json()["message"] for x in f]



def test_a_wrong_group_call_per_group_beside_an_idle_rank_names_each_apart():
    """As above at 16 ranks, but rank 12 (its group's odd rank) is idle, never calling
    anything: the world's hang names it besides the ranks the groups hold, and group g3's
    hang names it alone.  Two errors: ranks 0, 4 and 8 (the wrong-group calls), and rank 12
    (idle); before, the cycle was not folded (an absentee of the world's hang not held in
    it) and the world's hang named the ranks that did right (helper-184)."""
    b = TraceBuilder(16)
    for k in range(4):
        b.group(f"g{k}", list(range(k * 4, (k + 1) * 4)))
    t = b.warmup()
    for r in range(16):
        if r != 12:
            b.begin(r, t, "all_reduce", **({} if r % 4 == 0 else {"group": f"g{r // 4}"}))
    b.heartbeats(b.t0, t + 10 * S)
    _, f = replay(b, {0, 4, 8, 12}, hang_after=3.0)
    assert errors(f) == [("missing_ranks", [0, 4, 8]), ("missing_ranks", [12])], [x.to_json()["message"] for x in f]


@pytest.mark.parametrize(("latency_us", "said"), [(40, "40 µs"), (300, "300 µs"), (1400, "1.4 ms")])
def test_a_straggler_says_how_long_its_collectives_take_in_the_unit_that_reads(latency_us, said):
    """"the collectives themselves take a median 0.00 ms" where they took 40-300 µs, and
    1.00 ms for 600 µs-1.4 ms: the latency was rounded to whole ms (helper-181)."""
    b = TraceBuilder(4)
    t = b.t0 + S // 10
    for _ in range(12):
        t = b.collective(t, "all_reduce", skew={3: 50 * MS}, latency=latency_us * 1000) + MS
    b.heartbeats(b.t0, t)
    m = TraceModel()
    m.ingest(sorted(b.events, key=lambda e: e["ts"]))
    f = [x for x in diagnose(m, hang_after=2.0) if x.kind == "straggler"]
    assert [x.culprits for x in f] == [[3]]
    assert f"(the collectives themselves take a median {said})" in f[0].message, f[0].message
    assert f[0].evidence["median_latency_s"] == latency_us / 1e6


def _chain_into_an_all_reduce(links: list[tuple[int, str, int]]) -> TraceBuilder:
    """Ranks 0..n-1 each blocked in a send or recv (``links``: rank, "send"/"recv", peer), the
    last rank in the all_reduce; each op times out in rank order, and each rank crashes on it."""
    last = len(links)
    b = TraceBuilder(last + 1)
    t = b.warmup()
    ids = {r: b.begin(r, t, d, peer=p, dir=d) for r, d, p in links}
    ids[last] = b.begin(last, t, "all_reduce")
    fired = t + 5 * S
    for r, d, _p in links:
        b.end(r, ids[r], fired + r * MS, exc=TIMED_OUT.replace("recv", "send") if d == "send" else TIMED_OUT)
    b.end(last, ids[last], fired + last * MS, exc=TIMED_OUT)
    for r in range(last + 1):
        b.exit(r, fired + (10 + r) * MS, reason="exception", exc=TIMED_OUT)
    b.heartbeats(b.t0, fired)
    return b


def test_a_timeout_says_each_rank_of_a_chain_held_by_its_own_peer():
    """Rank 0 sends to 1, which receives from 2, which waits in the all_reduce until it times
    out: "ranks 0, 1 ... each held in a send or recv that rank 2 had not posted" said rank 0
    waited on rank 2 (it waited on rank 1; helper-191)."""
    _, f = replay(_chain_into_an_all_reduce([(0, "send", 1), (1, "recv", 2)]), {2})
    assert errors(f) == [("rank_crashed", [2])], [x.message for x in f]
    said = f[0].message
    assert "that rank 2 had not posted" not in said, said
    assert ("rank 0's send #1 to 1 (group 0) had failed, rank 1 never having posted its side, itself held so by "
            "rank 2; rank 1's recv #1 from 2 (group 0) had failed, rank 2 never having posted its side") in said, said


DDP_SIZES = ("RuntimeError: [{r}]: params[0] in this process with sizes [4, 8] appears not to match sizes of the "
             "same param in process 0.")
DDP_STRIDES = ("RuntimeError: [{r}]: params[0] in this process with sizes [4, 8] appears not to match strides of the "
               "same param in process 0.")
DDP_COUNT = ("RuntimeError: DDP expects same model across all ranks, but Rank {r} has {n} params, while rank {other} "
             "has inconsistent {m} params.")


@pytest.mark.parametrize(("world", "raising", "text", "named"), [
    (3, (1, 2), DDP_SIZES, [0]), (3, (1, 2), DDP_STRIDES, [0]), (4, (2,), DDP_SIZES, [2]),
    (4, (1, 2), DDP_SIZES, [0, 1, 2, 3]), (2, (1,), DDP_SIZES, [0, 1])])
def test_ranks_raising_at_ddps_model_check_name_the_odd_model_by_majority(world, raising, text, named):
    """DDP's check of sizes and strides raises on the ranks whose parameters differ from rank
    0's, never on rank 0: where all the others raised alike, rank 0's model is the odd one
    (helper-191: "ranks 1, 2 crashed together").  While the others still wait in the
    broadcast after it for the ranks gone, and once they failed there, one
    collective_mismatch; while a member's exit is not read yet and could turn the vote,
    nobody is named (a live poll named the ranks that raised first, helper-200)."""
    b = TraceBuilder(world)
    t = b.warmup()
    t = b.collective(t, "broadcast", root=0) + MS  # (the check's: rank 0's sizes)
    for r in raising:
        b.exit(r, t + 50 * MS * (1 + (r == raising[-1]) * 20), reason="exception", exc=text.format(r=r))
    rest = [r for r in range(world) if r not in raising]
    ids = {r: b.begin(r, t + r * MS, "broadcast", root=0) for r in rest}
    b.heartbeats(b.t0, t + 5 * S, ranks=rest)
    if len(raising) > 1:  # (the last exit not read yet: its vote could turn it)
        m = TraceModel()
        m.ingest(sorted((e for e in b.events if e["ts"] < t + 500 * MS), key=lambda e: e["ts"]))
        early = [x for x in diagnose(m, now=t + 500 * MS, hang_after=2.0) if x.severity == "error"]
        assert [(x.kind, x.culprits) for x in early] == [("collective_mismatch", [])], [x.message for x in early]
        assert "not seen past it yet" in early[0].message, early[0].message
    _, live = replay(b, set(named), end=t + 3 * S)
    assert errors(live) == [("collective_mismatch", named)], [x.message for x in live]
    for r in rest:
        b.end(r, ids[r], t + 5 * S + r * MS, exc=CLOSED)
        b.exit(r, t + 5 * S + (10 + r) * MS, reason="exception", exc=CLOSED)
    _, f = replay(b, set(named))
    assert errors(f) == [("collective_mismatch", named)], [x.message for x in f]
    (x,) = f
    assert x.evidence["died_in_it"] == list(raising) and x.evidence["differs"] == ["model"]
    assert x.message.startswith("the ranks' models differ at DistributedDataParallel's check of them (broadcast #"), x.message
    assert sorted(c["kind"] for c in x.evidence["consequences"]).count("rank_crashed") == world


@pytest.mark.parametrize(("world", "odd", "named"), [(4, 2, [2]), (3, 0, [0]), (2, 1, [0, 1])])
def test_ranks_raising_at_ddps_count_of_params_name_the_odd_model(world, odd, named):
    """DDP's check of the number of parameters gathers every rank's, and every rank raises
    where another's differs, each saying its own count first: the counts vote (helper-200:
    the texts naming another rank than 0 were not read, and the others' crashes stood apart)."""
    b = TraceBuilder(world)
    t = b.warmup()
    t = b.collective(t, "all_gather") + MS
    for r in range(world):
        n, other = (4, 0 if odd else 1) if r == odd else (2, odd)
        b.exit(r, t + (50 + r) * MS, reason="exception",
               exc=DDP_COUNT.format(r=r, n=n, other=other, m=2 if r == odd else 4))
    _, f = replay(b, set(named))
    assert errors(f) == [("collective_mismatch", named)], [x.message for x in f]
    assert f[0].evidence["died_in_it"] == list(range(world))
    assert sorted(c["kind"] for c in f[0].evidence["consequences"]) == ["rank_crashed"] * world


def test_a_long_chain_into_a_timeout_says_the_link_that_reaches_its_end():
    """Ranks 0-5 each send to the next, rank 5 to rank 6, in the all_reduce that times out:
    past four links the text cut the one that reaches rank 6 (helper-199)."""
    _, f = replay(_chain_into_an_all_reduce([(r, "send", r + 1) for r in range(6)]), {6})
    assert errors(f) == [("rank_crashed", [6])], [x.message for x in f]
    assert "; rank 5's send #1 to 6 (group 0) had failed, rank 6 never having posted its side; ...)" in f[0].message, f[0].message


def test_a_monitored_barrier_of_a_subgroup_names_the_absent_rank_by_its_global_rank():
    """Gloo's monitored_barrier names ranks of its group: global rank 3 of group [1, 2, 3] is
    its "Rank 2".  Read as global, rank 2, which came, was blamed and rank 3 named nowhere
    (helper-196)."""
    b = TraceBuilder(4)
    t = b.warmup()
    b.group("g", [1, 2, 3])
    ids = {r: b.begin(r, t, "monitored_barrier", group="g") for r in (1, 2)}
    b.end(1, ids[1], t + S, exc=MONITORED.replace("Rank 1 failed", "Rank 2 failed"))
    b.end(2, ids[2], t + S + 2 * MS, exc=RELAY)
    b.heartbeats(b.t0, t + 3 * S)
    _, f = replay(b, {3}, hang_after=60.0)
    assert errors(f) == [("op_failed", [3])], [x.message for x in f]
    assert "rank 3 never arrived (named by the exception)" in f[0].message, f[0].message


def test_a_monitored_barrier_of_a_group_whose_members_are_not_known_blames_nobody_by_global_rank():
    """Without the group's statement of its members (a window read, a lost record), the
    ranks seen in it are no order to read the text's group ranks by: rank 3, which came, was
    blamed for the group's "Rank 1" (helper-201)."""
    b = TraceBuilder(4)
    t = b.warmup()
    b.group("g", [0, 2, 3])
    ids = {r: b.begin(r, t, "monitored_barrier", group="g") for r in (0, 3)}
    b.end(0, ids[0], t + S, exc=MONITORED)
    b.end(3, ids[3], t + S + 2 * MS, exc=RELAY)
    b.heartbeats(b.t0, t + 3 * S)
    events = [e for e in b.events if e["type"] != "group" or e["group"] != "g"]  # (its statement not read)
    b.events[:] = events
    _, f = replay(b, {2}, hang_after=60.0)
    assert not [x for x in f if x.severity == "error" and {0, 3} & set(x.culprits)], [x.message for x in f]
    (x,) = [x for x in f if x.kind == "op_failed"]
    assert "rank 1 of group g, in its own numbering, never arrived" in x.message, x.message


def test_a_size_mismatch_judged_before_the_receiver_posts_an_any_source_recv_is_judged_again():
    """A live console judged a pair that differed as a mismatch; the receiver then posted an
    any-source recv in the group (in no channel: nothing the judgement was made of changed),
    and the stale error stayed, where check of the same trace said none (helper-210)."""
    b = TraceBuilder(3)
    t = b.warmup()
    b.sync(1, t, t + MS, "send", peer=2, dir="send", shape=(4, 16), site="a.py:5")
    b.sync(2, t, t + 2 * MS, "recv", peer=1, dir="recv", shape=(4, 16), dtype="float64", out_bytes=512,
           site="a.py:12")
    b.heartbeats(b.t0, t + 3 * MS)
    first = list(b.events)
    b.sync(0, t + 4 * MS, t + 5 * MS, "send", peer=2, dir="send", shape=(4,), site="c.py:5")
    anyone = b.begin(2, t + 4 * MS, "recv", peer=None, dir="recv", shape=(4,), site="a.py:20")
    b.end(2, anyone, t + 5 * MS)
    b.heartbeats(t + 3 * MS, t + 6 * MS)
    m = TraceModel()
    m.ingest(sorted(first, key=lambda e: e["ts"]))
    assert errors(diagnose(m, now=t + 3 * MS)) == [("unmatched_p2p", [1, 2])]
    m.ingest(sorted(b.events[len(first):], key=lambda e: e["ts"]))
    assert errors(diagnose(m, now=t + 6 * MS)) == []
    assert errors(diagnose(TraceModel.from_events(b.sorted_events()), now=t + 6 * MS)) == []


def test_an_op_failed_message_quotes_each_distinct_exception_once_numbers_aside():
    """Each distinct exception once with its ranks (the first rank's was quoted for all,
    helper-203); the same words with another peer's address or another timeout's
    milliseconds are one (seven ranks read as seven failures, helper-207)."""
    from commscope.analysis.failures import _each_said

    closed = "RuntimeError: [../pair.cc:553] Connection closed by peer [10.0.0.{r}]:1710{r}"
    excs = {r: closed.format(r=r) for r in range(1, 8)}
    assert _each_said(excs) == "ranks 1, 2, 3, 4, 5, 6, 7 (RuntimeError: Connection closed by peer [10.0.0.1]:17101)"
    excs[0] = "RuntimeError: ProcessGroupGloo::scatter: Incorrect input list size 2. Input list size should be 3"
    assert _each_said(excs).startswith("rank 0 (RuntimeError: ProcessGroupGloo::scatter: Incorrect input list size 2"
                                       ". Input list size should be 3) and ranks 1, 2, 3, 4, 5, 6, 7 (RuntimeError: Conn")
    # (numbers that say something stay apart: another rank blamed, other sizes; helper-209)
    barrier = "RuntimeError: Rank 0 successfully reached monitoredBarrier, but received errors while waiting for " \
              "send/recv from rank {r}."
    assert _each_said({0: barrier.format(r=1), 2: barrier.format(r=3)}).count("monitoredBarrier") == 2
    timed = "RuntimeError: [../unbound_buffer.cc:78] Timed out waiting {n}ms for recv operation to complete"
    assert _each_said({0: timed.format(n=1000), 2: timed.format(n=998)}).startswith("ranks 0, 2 (")
    watchdog = ("DistBackendError: [Rank {r}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=808, "
                "OpType=ALLREDUCE) ran for {n} milliseconds before timing out.")  # (NCCL's: one a rank, helper-210)
    assert _each_said({r: watchdog.format(r=r, n=600020 + r) for r in range(8)}).startswith("ranks 0, 1, 2, 3, 4,")
