"""diagnose() on synthetic traces: every finding kind, and silence on healthy traces."""

from __future__ import annotations

import json

import numpy as np
import pytest

from commscope.analysis import TraceModel, diagnose
from commscope.analysis.synth import S, TraceBuilder, healthy_trace

MS = 1_000_000


def run(b: TraceBuilder, now: int | None = None, hang_after: float = 2.0, batches: int = 1):
    m = TraceModel()
    ev = b.sorted_events()
    step = max(1, len(ev) // batches)
    for k in range(0, len(ev), step):
        m.ingest(ev[k:k + step])
    f = diagnose(m, now=now, hang_after=hang_after)
    for x in f:
        json.dumps(x.to_json())  # evidence must be JSON-serializable
    return m, f


def kinds(findings):
    return sorted(f.kind for f in findings)


def sends_into(world: int, sends: dict[int, int], waiting: tuple[int, ...], op: str = "barrier",
               group: str = "0", members: list[int] | None = None) -> TraceBuilder:
    """Blocked sends (rank -> peer, never received) and ranks waiting in ``op`` of ``group``
    (of ``members``, where given) a moment later, ten seconds of heartbeats on: the wait
    cycles through a collective."""
    b = TraceBuilder(world)
    t = b.warmup()
    if members is not None:
        b.group(group, members)
    for r, peer in sends.items():
        b.sync(r, t, None, "send", peer=peer, dir="send")
    for r in waiting:
        b.sync(r, t + MS, None, op, group=group)
    b.heartbeats(t, t + 10 * S)
    return b



@pytest.mark.parametrize("batches", [1, 7])
def test_missing_ranks_names_the_absent_rank_and_what_it_does(batches):
    b = TraceBuilder(4)
    t = b.warmup()
    for r in (0, 1, 3):
        b.sync(r, t, None, "all_reduce")
    b.heartbeats(t, t + 10 * S)
    m, f = run(b, batches=batches)
    assert kinds(f) == ["missing_ranks"]
    x = f[0]
    assert x.culprits == [2] and x.seq == 4 and x.group == "0" and x.op == "all_reduce"
    assert x.evidence["missing"] == [2]
    assert x.evidence["waited_s"]["0"] >= 9.9
    assert x.evidence["missing_activity"]["2"]["state"] == "idle"
    assert x.evidence["missing_activity"]["2"]["last_seq_in_group"] == 3


def test_missing_rank_blocked_elsewhere_shows_its_op_and_stack():
    b = TraceBuilder(3)
    t = b.warmup()
    b.group("1", [1, 2])
    b.sync(0, t, None, "all_reduce")
    b.sync(1, t, None, "all_reduce")
    sid = b.sync(2, t, None, "all_reduce", group="1")
    b.add(2, t + 3 * S, "stack", id=sid, threads=[{"tid": 1, "name": "MainThread", "op_thread": True,
                                                    "frames": [["train.py", 42, "step"]]}])
    b.heartbeats(t, t + 5 * S)
    _, f = run(b)
    by = {(x.kind, x.group): x for x in f}
    x = by[("missing_ranks", "0")]
    assert x.culprits == [2]
    act = x.evidence["missing_activity"]["2"]
    assert act["state"] == "blocked" and act["in_op"]["group"] == "1"
    assert act["stack"][0]["frames"] == ["train.py:42 in step"]
    # (rank 1 waits in the world's for 2, which waits in group 1's for it: that hang is the
    # world's consequence, not a second error naming rank 1, which did as rank 0 did: helper-176)
    assert ("missing_ranks", "1") not in by
    assert [(c["group"], c["culprits"]) for c in x.evidence["consequences"]] == [("1", [1])]


def test_no_missing_before_hang_after_and_long_progressing_collective_is_fine():
    b = TraceBuilder(3)
    t = b.warmup()
    for r in range(3):
        b.sync(r, t + r * 100, None, "all_reduce", shape=(1 << 20,))  # everyone in, takes long
    b.heartbeats(t, t + 60 * S)
    _, f = run(b)
    assert f == []
    b2 = TraceBuilder(3)
    t = b2.warmup()
    b2.sync(0, t, None, "all_reduce")
    b2.heartbeats(t, t + S)
    _, f = run(b2)  # 1 s < hang_after
    assert f == []


def test_collective_mismatch_op_and_majority():
    b = TraceBuilder(4)
    t = b.warmup()
    for r in (0, 1, 3):
        b.sync(r, t, None, "all_reduce")
    b.sync(2, t, None, "broadcast", root=0)
    b.heartbeats(t, t + 5 * S)
    _, f = run(b)
    assert kinds(f) == ["collective_mismatch"]
    x = f[0]
    assert x.culprits == [2] and x.seq == 4 and x.op == "all_reduce"
    assert x.evidence["per_rank"]["2"]["op"] == "broadcast"
    assert "op" in x.evidence["differs"]


def test_collective_mismatch_shape_reported_even_after_error_and_exit():
    b = TraceBuilder(2)
    t = b.warmup()
    a = b.sync(0, t, None, "all_reduce", shape=(10,))
    c = b.sync(1, t, None, "all_reduce", shape=(12,))
    b.end(0, a, t + MS, exc="RuntimeError: size mismatch")
    b.end(1, c, t + MS, exc="RuntimeError: size mismatch")
    b.exit(0, t + 2 * MS, exc="RuntimeError: size mismatch", reason="exception")
    b.exit(1, t + 2 * MS, exc="RuntimeError: size mismatch", reason="exception")
    _, f = run(b)
    assert kinds(f) == ["collective_mismatch"]
    x = f[0]
    assert x.culprits == [0, 1]  # a tie names every rank
    assert x.evidence["differs"] == ["shape"]
    assert x.evidence["per_rank"]["0"]["in_shapes"] == [[10]]
    assert x.evidence["per_rank"]["1"]["exc"].startswith("RuntimeError")


def test_mismatch_dtype_redop_root():
    # (the message says each rank's value: it said "differing: dtype", the values only in
    # the table, helper-186)
    for kw0, kw1, what, said in (({"dtype": "float32"}, {"dtype": "float16"}, "dtype",
                                  "rank 0: all_reduce dtype=float32, rank 1: all_reduce dtype=float32, "
                                  "rank 2: all_reduce dtype=float16; differing: dtype"),
                                 ({"redop": "sum"}, {"redop": "max"}, "redop",
                                  "rank 0: all_reduce redop=sum, rank 1: all_reduce redop=sum, "
                                  "rank 2: all_reduce redop=max; differing: redop")):
        b = TraceBuilder(3)
        t = b.warmup()
        b.sync(0, t, None, "all_reduce", **kw0)
        b.sync(1, t, None, "all_reduce", **kw0)
        b.sync(2, t, None, "all_reduce", **kw1)
        _, f = run(b)
        assert kinds(f) == ["collective_mismatch"] and f[0].culprits == [2]
        assert f[0].evidence["differs"] == [what]
        assert f[0].message == f"ranks disagree at collective #4 of group 0: {said}; rank(s) 2 differ from the majority"
    # (as compared: the inputs' and outputs' dtypes together; it quoted rank 2's input alone,
    # alike, where its output differed, helper-194)
    b = TraceBuilder(3)
    t = b.warmup()
    for r in range(3):
        b.sync(r, t, None, "all_gather", dtype="float32", out_dtypes=["float16" if r == 2 else "float32"])
    _, f = run(b)
    assert kinds(f) == ["collective_mismatch"] and f[0].culprits == [2]
    assert "rank 1: all_gather dtype=float32, rank 2: all_gather dtype=float16/float32;" in f[0].message, f[0].message
    b = TraceBuilder(3)
    t = b.warmup()
    for r in range(3):
        b.sync(r, t, t + MS, "broadcast", root=0 if r != 1 else 1)
    _, f = run(b)
    assert kinds(f) == ["collective_mismatch"] and f[0].culprits == [1]
    assert "rank 0: broadcast root=0, rank 1: broadcast root=1, rank 2: broadcast root=0; differing: root" in \
        f[0].message, f[0].message


def test_a_broadcast_object_list_of_another_length_is_a_mismatch():
    """The root broadcasts a list of 3 objects where ranks 1 and 2 make room for 2: Gloo
    aborts them, and they were named "crashed together on host" (helper-191).  The lists'
    lengths are its shapes, which every rank's must agree in."""
    b = TraceBuilder(3)
    t = b.warmup()
    for r in range(3):
        b.sync(r, t, None, "broadcast_object_list", root=0, shape=(3,) if r == 0 else (2,))
    _, f = run(b)
    assert [(x.kind, x.culprits) for x in f if x.severity == "error"] == [("collective_mismatch", [0])], \
        [x.message for x in f]
    assert f[0].evidence["differs"] == ["shape"]


def test_gather_root_and_varlen_shapes_are_not_mismatches():
    b = TraceBuilder(3)
    t = b.warmup()
    for r in range(3):
        i = b.begin(r, t, "all_to_all_single", shape=(3 + r,))
        b.end(r, i, t + MS)
        j = b.begin(r, t + 2 * MS, "all_gather_v", shape=(5 * r + 1,))
        k = b.begin(r, t + 2 * MS, "all_gather", shape=(5 * r + 1,), nested=True, parent=j)
        b.end(r, k, t + 3 * MS)
        b.end(r, j, t + 3 * MS)
    _, f = run(b)
    assert f == []


@pytest.mark.parametrize("op", ["all_to_all_single", "all_to_all"])
def test_an_exchange_whose_split_sizes_disagree_is_a_mismatch_naming_the_odd_rank(op):
    """Rank 1 expects 3 elements from rank 0, which sends 2: the ranks sent 128 bytes in
    all and received 132.  Gloo runs it without a word and the job goes on with a garbage
    element; check said nothing (helper-182).  A collective_mismatch naming every rank (the
    splits are not recorded: which rank's are wrong is not known; named by the majority of
    bytes in and out, a rank that did right was named, helper-189), saying rank 1's totals
    stand apart; uneven splits that agree are no mismatch."""
    b = TraceBuilder(4)
    t = b.warmup()
    for r in range(4):
        b.sync(r, t, t + MS, op, shape=(8,), **({"out_shapes": [[9]], "out_bytes": 36} if r == 1 else {}))
        b.sync(r, t + 2 * MS, t + 3 * MS, op, shape=(2 + r,), out_shapes=[[5 - r]], out_bytes=4 * (5 - r))
    _, f = run(b)
    assert [(x.kind, x.culprits, x.seq) for x in f] == [("collective_mismatch", [0, 1, 2, 3], 4)], [x.message for x in f]
    assert f[0].evidence["differs"] == ["split sizes"]
    assert f"{op} sent 128 B in all and received 132 B" in f[0].message
    assert "rank 1: sent 32 B, received 36 B" in f[0].message
    assert "every rank is named (rank(s) 1 sent or received other than the rest)" in f[0].message


def test_an_uneven_exchange_with_one_wrong_split_names_no_rank_alone():
    """Ranks 0-2 send one element to each rank, rank 3 sends [1, 1, 2, 0] and wrongly expects
    one from itself: the totals (in, out) are (4, 4), (4, 4), (4, 5), (4, 4), and a majority
    of them named rank 2 alone, which did right (helper-189).  Every rank is named."""
    b = TraceBuilder(4)
    t = b.warmup()
    outs = {0: 4, 1: 4, 2: 5, 3: 4}
    for r in range(4):
        b.sync(r, t, t + MS, "all_to_all_single", shape=(4,), out_shapes=[[outs[r]]], out_bytes=4 * outs[r])
    _, f = run(b)
    assert [(x.kind, x.culprits) for x in f] == [("collective_mismatch", [0, 1, 2, 3])], [x.message for x in f]


def test_flight_recorder_dumps_missing_a_rank_s_are_no_split_mismatch():
    """Rank 3 never dumped: the MoE all_to_all every rank ran (uneven splits, conserved over
    the four) summed over the three that dumped read as unconserved, a collective_mismatch
    over a healthy exchange (helper-189).  A Flight Recorder's exchanges are not judged so."""
    from commscope.analysis.flight_import import dumps_to_events

    send = [[1, 2, 3, 4], [1, 1, 1, 1], [2, 2, 2, 2], [0, 0, 0, 9]]
    outs = [sum(send[i][j] for i in range(4)) for j in range(4)]

    def entry(rid, name, seq, ins, out):
        return {"record_id": rid, "pg_id": 0, "process_group": ("0", "default_pg"), "collective_seq_id": seq,
                "p2p_seq_id": 0, "op_id": rid, "profiling_name": name, "time_created_ns": 10**18 + rid * 10**6,
                "input_sizes": [[ins, 8]], "input_dtypes": ["Float"], "output_sizes": [[out, 8]],
                "output_dtypes": ["Float"], "state": "completed", "time_discovered_started_ns": None,
                "time_discovered_completed_ns": 10**18 + rid * 10**6 + 500, "retired": True, "is_p2p": False,
                "frames": [{"name": "step", "filename": "train.py", "line": 7}]}

    dumps = {r: {"version": "2.10", "entries": [entry(0, "nccl:all_reduce", 1, 4, 4),
                                                entry(1, "nccl:all_to_all", 2, sum(send[r]), outs[r])]}
             for r in range(3)}
    m = TraceModel.from_events(dumps_to_events(dumps, {r: 10**18 + 60 * 10**9 for r in range(3)}))
    assert "collective_mismatch" not in kinds(diagnose(m, hang_after=5))


def test_an_exchange_of_two_ranks_whose_splits_disagree_names_both():
    """With two ranks, neither is the odd one out: a tie names both (DESIGN's rule)."""
    b = TraceBuilder(2)
    t = b.warmup()
    for r in range(2):
        b.sync(r, t, t + MS, "all_to_all_single", shape=(8,), **({"out_shapes": [[9]], "out_bytes": 36} if r else {}))
    _, f = run(b)
    assert [(x.kind, x.culprits) for x in f] == [("collective_mismatch", [0, 1])], [x.message for x in f]
    assert "the splits are not recorded, so every rank is named" in f[0].message


@pytest.mark.parametrize("case", ["order", "skip", "middle"])
def test_ranks_that_disagree_on_a_group_s_members_are_a_mismatch(case):
    """Even ranks call new_group([0, 1]) then new_group([2, 3]), odd ranks the other way round
    ("order"), or rank 3 skips new_group([0, 1]) ("skip"): torch names groups by the order
    they were made, so group 1 is [0, 1] to some ranks and [2, 3] to others, and its
    collectives pair rank 0 with rank 3: wrong results, check exit 0 (helper-186).  A
    collective_mismatch per group whose members its ranks state differently, naming those
    that differ from most (all of them on a tie).  "middle": groups [0, 1, 3] and [0, 2, 3]
    made in different orders differ in a middle member only, and read alike (helper-192)."""
    b = TraceBuilder(4)
    t = b.warmup()
    said = {"order": {0: ("1", [0, 1]), 3: ("1", [2, 3]), 1: ("2", [0, 1]), 2: ("2", [2, 3])},
            "skip": {0: ("1", [0, 1]), 1: ("1", [0, 1]), 3: ("1", [2, 3]), 2: ("2", [2, 3])},
            "middle": {0: ("1", [0, 1, 3]), 1: ("1", [0, 1, 3]), 2: ("1", [0, 2, 3])}}[case]
    for r, (name, members) in said.items():
        b.add(r, t, "group", group=name, granks=members, backend="gloo")
        b.sync(r, t + MS, t + 2 * MS, "all_reduce", group=name)
    _, f = run(b)
    got = sorted((x.kind, x.group, x.culprits) for x in f if x.severity == "error")
    if case == "order":
        assert got == [("collective_mismatch", "1", [0, 3]), ("collective_mismatch", "2", [1, 2])], [x.message for x in f]
    elif case == "middle":
        assert got == [("collective_mismatch", "1", [2])], [x.message for x in f]
        assert "ranks 0, 1: [0, 1, 3]; rank 2: [0, 2, 3]" in f[0].message, f[0].message
    else:
        assert got == [("collective_mismatch", "1", [3])], [x.message for x in f]
        assert "ranks 0, 1: [0, 1]; rank 3: [2, 3]" in next(x.message for x in f if x.group == "1")


@pytest.mark.parametrize("timed_out", [False, True])
def test_a_send_and_a_recv_that_pair_up_but_never_complete_are_named(timed_out):
    """Rank 0 sends with tag 1, rank 1 receives with tag 2: the ops pair up by the order they
    were posted in (tags are not recorded), and both hang.  The job read healthy, exit 0,
    and after the timeouts "no rank to blame: every member had entered it" (helper-191).
    Live, an unmatched_p2p naming both (which tag is wrong, nothing says); after, the
    failure says why."""
    b = TraceBuilder(2)
    t = b.warmup()
    i = b.begin(0, t, "send", peer=1, dir="send", shape=(4,))
    j = b.begin(1, t + MS, "recv", peer=0, dir="recv", shape=(4,))
    b.heartbeats(b.t0, t + 12 * S)
    if timed_out:
        b.end(0, i, t + 10 * S, exc="RuntimeError: Timed out waiting 10000ms for send operation to complete")
        b.end(1, j, t + 10 * S + MS, exc="RuntimeError: Timed out waiting 10000ms for recv operation to complete")
    _, f = run(b)
    errors = [x for x in f if x.severity == "error"]
    if timed_out:
        assert [(x.kind, x.culprits) for x in errors] == [("op_failed", [])], [x.message for x in f]
        assert "both sides were posted when the timeout fired, and they did not match" in errors[0].message
        return
    assert [(x.kind, x.culprits) for x in errors] == [("unmatched_p2p", [0, 1])], [x.message for x in f]
    assert "pair up by the order they were posted in, but neither completed" in errors[0].message


def test_sends_and_recvs_that_never_match_at_one_pair_of_sites_are_one_finding():
    """Two stages' sends and recvs of one pair of call sites, none matching: one finding
    naming the four ranks (8,192 pairs at 16,384 ranks made as many errors, 2 s a diagnosis:
    helper-194).  A peer that came just after a send timed out is late, not unmatched."""
    b = TraceBuilder(4)
    t = b.warmup()
    for src in (0, 2):
        b.begin(src, t, "send", peer=src + 1, dir="send", shape=(4,), site="pipe.py:9")
        b.begin(src + 1, t + MS, "recv", peer=src, dir="recv", shape=(4,), site="pipe.py:11")
    b.heartbeats(b.t0, t + 12 * S)
    _, f = run(b)
    assert [(x.kind, x.culprits) for x in f if x.severity == "error"] == [("unmatched_p2p", [0, 1, 2, 3])], \
        [x.message for x in f]
    assert f[0].message.endswith("; 2 such pairs, of ranks 0, 1, 2, 3"), f[0].message
    b = TraceBuilder(2)
    t = b.warmup()
    i = b.begin(0, t, "send", peer=1, dir="send", shape=(4,))
    b.end(0, i, t + 10 * S, exc="RuntimeError: Timed out waiting 10000ms for send operation to complete")
    j = b.begin(1, t + 10 * S + 10 * MS, "recv", peer=0, dir="recv", shape=(4,))
    b.end(1, j, t + 10 * S + 11 * MS)
    b.heartbeats(b.t0, t + 12 * S)
    _, f = run(b)
    assert "both sides were posted" not in " ".join(x.message for x in f), [x.message for x in f]


def test_p2p_deadlock_cycle():
    b = TraceBuilder(3)
    t = b.warmup()
    for r in range(3):
        b.sync(r, t + r * MS, None, "recv", peer=(r - 1) % 3, dir="recv", shape=(4,))
    b.heartbeats(t, t + 5 * S)
    _, f = run(b)
    assert kinds(f) == ["p2p_deadlock"]
    x = f[0]
    assert x.culprits == [0, 1, 2]
    assert len(x.evidence["cycle"]) == 3
    assert "rank 0 waits recv (recv from 2)" in x.evidence["chain"]


def test_any_source_recvs_waiting_on_each_other_are_one_deadlock_of_them_all():
    """Every rank of a group in an any-source recv: each waits for all the others.  Every
    elementary cycle was enumerated (2^N sets: 10 ranks took 5 s and gave 1,013 findings, 16
    never ended); one finding names them all, its message one shortest cycle."""
    n = 16
    b = TraceBuilder(n)
    t = b.warmup()
    for r in range(n):
        b.sync(r, t, None, "recv", dir="recv", peer=None, shape=(4,))
    b.heartbeats(t, t + 5 * S)
    _, f = run(b)
    assert kinds(f) == ["p2p_deadlock"]
    x = f[0]
    assert x.culprits == x.ranks == list(range(n)) and not x.victims
    assert [c["rank"] for c in x.evidence["cycle"]] == [0, 1]
    assert x.message.startswith("p2p deadlock among ranks 0-15 (16 ranks that wait for each other; one cycle of them): "
                                "rank 0 waits recv (recv from any)")


def test_two_rings_are_two_deadlocks_and_a_rank_outside_waits_on_one():
    """Ranks 0-2 a ring, 3-4 a pair, rank 5 waits for rank 0 (in the ring: waits on it, is
    not part of it).  Rank 5's recv is unmatched because of the ring: its consequence, not
    an error of its own (it was one, naming rank 0)."""
    b = TraceBuilder(6)
    t = b.warmup()
    for r, peer in ((0, 2), (1, 0), (2, 1), (3, 4), (4, 3), (5, 0)):
        b.sync(r, t + r * MS, None, "recv", peer=peer, dir="recv", shape=(4,))
    b.heartbeats(t, t + 5 * S)
    _, f = run(b)
    assert sorted((x.kind, tuple(x.culprits)) for x in f) == [("p2p_deadlock", (0, 1, 2)), ("p2p_deadlock", (3, 4))]
    ring = next(x for x in f if x.culprits == [0, 1, 2])
    assert ring.message.startswith("p2p deadlock among ranks 0, 2, 1: rank 0 waits recv (recv from 2)")
    assert [c["rank"] for c in ring.evidence["cycle"]] == [0, 2, 1]
    assert [(c["kind"], c["culprits"], c["ranks"]) for c in ring.evidence["consequences"]] == [
        ("unmatched_p2p", [0], [0, 5])]
    assert ring.victims[5] == (0, 1, 2)


def test_p2p_deadlock_inside_batch_isend_irecv_waits():
    b = TraceBuilder(2)
    t = b.warmup()
    for r in range(2):
        c = b.begin(r, t, "batch_isend_irecv", seq=None)
        i = b.begin(r, t, "irecv", peer=1 - r, dir="recv", parent=c, **{"async": True})
        b.end(r, i, t + 10)
        b.end(r, c, t + 20)
        b.phase(r, i, t + 30, "wait_begin")
    b.heartbeats(t, t + 5 * S)
    _, f = run(b)
    assert kinds(f) == ["p2p_deadlock"] and f[0].culprits == [0, 1]


def test_unmatched_p2p_peer_idle_or_exited():
    b = TraceBuilder(2)
    t = b.warmup()
    b.sync(0, t, None, "send_tensors", peer=1, dir="send")
    b.exit(1, t + MS)
    b.heartbeats(t, t + 5 * S, ranks=[0])
    _, f = run(b)
    assert kinds(f) == ["unmatched_p2p"]
    x = f[0]
    assert x.culprits == [1] and x.evidence["expected"] == "recv"
    assert x.evidence["peer_activity"]["1"]["state"] == "exited"


def test_a_send_to_a_rank_the_job_does_not_have_is_the_sender_s_own_fault():
    """Gloo does not refuse ``send(dst=99)`` in a 2-rank job: it waits for that rank's
    connection until the timeout (or crashes).  The finding named rank 99, which does not
    exist, its culprit; now the sender is, and the rank then waiting on it is a consequence."""
    b = TraceBuilder(2)
    t = b.warmup()
    b.sync(0, t, None, "send", peer=99, dir="send")
    b.sync(1, t + MS, None, "recv", peer=0, dir="recv")
    b.heartbeats(t, t + 5 * S)
    _, f = run(b)
    assert [(x.kind, x.culprits, x.ranks) for x in f] == [("unmatched_p2p", [0], [0])]
    x = f[0]
    assert x.evidence["no_such_peer"] == 99 and x.evidence["peer_activity"] == {}
    assert "; the job has no rank 99 (world size 2): no recv can ever match it" in x.message
    assert [(c["kind"], c["ranks"]) for c in x.evidence["consequences"]] == [("unmatched_p2p", [0, 1])]
    assert x.message.endswith("Then: rank 1 blocked in recv #1")


def test_a_peer_past_the_ranks_seen_is_no_mistake_while_the_world_size_is_unknown():
    """Without a rank's word on the world size (no ``meta``), rank 5 may be a rank that
    recorded nothing: it stays the culprit."""
    b = TraceBuilder(2, meta=False)
    t = b.warmup()
    b.sync(0, t, None, "send", peer=5, dir="send")
    b.heartbeats(t, t + 5 * S)
    _, f = run(b)
    assert [(x.kind, x.culprits) for x in f] == [("unmatched_p2p", [5])]
    assert "no_such_peer" not in f[0].evidence


def test_peers_the_job_does_not_have_in_every_form_are_the_sender_s_own():  # (helper-87)
    # a group rank out of range (``group_dst=99``): the recorder gives it no peer; a send
    # without one is no any-source op (it read as a p2p_deadlock naming rank 1, a victim)
    b = TraceBuilder(2)
    t = b.warmup()
    b.begin(0, t, "send", peer=None, dir="send")
    b.sync(1, t + MS, None, "recv", peer=0, dir="recv")
    b.heartbeats(t, t + 5 * S)
    _, f = run(b)
    assert [(x.kind, x.culprits) for x in f] == [("unmatched_p2p", [0])]
    assert "rank 0 waits send (send to ?)" in f[0].message and "a group rank out of range" in f[0].message
    # Gloo's timeout ends the send: the failure is rank 0's own, not rank 99's; a send with no
    # peer, timed out, blames its rank, not the other members
    for world, peer, blame in ((2, 99, "rank 0's peer: the job has no rank 99 (world size 2)"),
                               (3, None, "rank 0's send: its peer is no rank of its group (a group rank out of range)")):
        b = TraceBuilder(world)
        t = b.warmup()
        i = b.begin(0, t, "send", peer=peer, dir="send")
        b.end(0, i, t + 3 * S, exc="RuntimeError: Timed out waiting 30000ms for send operation to complete")
        b.heartbeats(t, t + 5 * S)
        _, f = run(b)
        assert [(x.kind, x.culprits) for x in f] == [("op_failed", [0])]
        assert f[0].evidence["blame"]["text"] == blame
    # a Flight Recorder send that names no peer (``nccl:send``) is not said to have none
    b = TraceBuilder(2)
    t = b.warmup()
    b.begin(0, t, "send", peer=None, dir="send", seq=1, src="fr")
    b.heartbeats(t, t + 5 * S)
    _, f = run(b)
    assert not any("no_such_peer" in x.evidence for x in f), [x.message for x in f]
    # a collective the stuck rank and a late one never entered is the stuck rank's too
    b = TraceBuilder(3)
    t = b.warmup()
    b.sync(0, t, None, "send", peer=99, dir="send")
    b.sync(2, t + MS, None, "all_reduce")
    b.heartbeats(t, t + 5 * S)
    _, f = run(b)
    assert [(x.kind, x.culprits) for x in f] == [("unmatched_p2p", [0])]
    assert [(c["kind"], c["culprits"]) for c in f[0].evidence["consequences"]] == [("missing_ranks", [0, 1])]
    # a rank that recorded events is one of the job, whatever a meta says
    b = TraceBuilder(4, meta=False)
    for r in (0, 1):
        b.add(r, b.t0, "meta", host="h", pid=1000 + r, world_size=2, backend="gloo", hang_after=2.0)
    t = b.warmup()
    b.sync(0, t, None, "send", peer=3, dir="send")
    b.heartbeats(t, t + 5 * S)
    _, f = run(b)
    assert [(x.kind, x.culprits) for x in f] == [("unmatched_p2p", [3])]


def test_matched_but_slow_p2p_and_rings_are_fine():
    b = TraceBuilder(4)
    t = b.warmup()
    for r in range(4):  # ring: everyone sends first (isend), then recvs; all complete
        s = b.async_op(r, t, t + MS, t + 2 * MS, "isend", peer=(r + 1) % 4, dir="send")
        b.sync(r, t + MS, t + 2 * MS, "recv", peer=(r - 1) % 4, dir="recv")
        assert s
    # posted on both sides, just slow: 1.2 GB, 10 s on, moving at 120 MB/s or more (a send and
    # a recv of a few KiB that pair up and wait that long do not match: their tags differ)
    b.sync(0, t + 3 * MS, None, "send", peer=1, dir="send", shape=(300_000_000,))
    b.sync(1, t + 3 * MS, None, "recv", peer=0, dir="recv", shape=(300_000_000,))
    b.heartbeats(t, t + 10 * S)
    _, f = run(b)
    assert f == []


def test_any_source_recv_resolves_peer_at_end():
    b = TraceBuilder(2)
    t = b.warmup()
    s = b.sync(0, t, t + MS, "send", peer=1, dir="send")
    r = b.begin(1, t, "recv", dir="recv")
    b.end(1, r, t + MS, peer=0, seq=1)
    m, f = run(b)
    assert f == [] and s
    assert m.p2p_pair("0", 0, 1, 1) == (m.op_index(0, s), m.op_index(1, r))


def test_dead_rank():
    b = TraceBuilder(3)
    t = b.warmup()
    b.heartbeats(t, t + 10 * S, ranks=[0, 1])
    b.heartbeats(t, t + 1 * S, ranks=[2])
    for r in (0, 1):
        b.sync(r, t + 2 * S, None, "all_reduce")
    _, f = run(b)
    assert kinds(f) == ["dead_rank"]  # the ranks left waiting for it are its consequence, not a finding
    dead = f[0]
    assert dead.culprits == [2] and dead.evidence["silent_s"] >= 8.9
    (miss,) = dead.evidence["consequences"]
    assert miss["kind"] == "missing_ranks" and miss["culprits"] == [2] and miss["seq"] == 4
    info = dead.evidence["stack_info"]
    assert set(info) == {"0", "2"} and info["2"]["role"] == "culprit"
    assert (info["0"]["role"], info["0"]["count"], info["0"]["ranks"]) == ("waiting", 2, "0-1")  # folded


def test_killed_job_is_judged_at_its_last_timestamp():
    b = TraceBuilder(3)
    t = b.warmup()
    for r in (0, 1):
        b.sync(r, t, None, "all_reduce")
    b.heartbeats(t, t + 6 * S)  # all three stop together: killed, not dead
    _, f = run(b)  # now = last timestamp in trace
    assert kinds(f) == ["missing_ranks"] and f[0].culprits == [2]


def test_straggler():
    b = TraceBuilder(4)
    t = b.t0 + S // 10
    for _ in range(20):
        t = b.collective(t, "all_reduce", skew={3: 50 * MS, 1: 2 * MS}, latency=MS) + MS
    b.heartbeats(b.t0, t)
    _, f = run(b)
    assert kinds(f) == ["straggler"]
    x = f[0]
    assert x.culprits == [3] and x.severity == "warning"
    assert x.evidence["last_share"] == 1.0 and x.evidence["median_lateness_s"] == pytest.approx(0.05, abs=1e-3)


def test_unwaited_work():
    b = TraceBuilder(2)
    t = b.warmup()
    ids = [b.async_op(r, t, None, None, "all_reduce") for r in range(2)]
    b.exit(0, t + MS, unwaited=[ids[0]])
    b.exit(1, t + MS)
    _, f = run(b)
    assert kinds(f) == ["unwaited_work"]
    assert f[0].culprits == [0] and f[0].evidence["count"] == 1


@pytest.mark.parametrize("how", [{"reason": "exception", "exc": "RuntimeError: Connection closed by peer"},
                                 {"reason": "signal", "signal": "Terminated"},
                                 {"reason": "atexit", "stop_signal": "Interrupt"}])
def test_a_rank_cut_short_is_not_warned_of_ops_it_never_waited_on(how):
    """Rank 1 posts an irecv and raises (or is stopped) before its wait(): the exception or
    the signal skipped the wait, not its code.  Ranks crashed of another's failure were
    warned "exited with 1 async op(s) never waited on" beside the root (helper-186).  Rank 2
    has not left."""
    b = TraceBuilder(3)
    t = b.warmup()
    i = b.async_op(1, t, None, None, "irecv", peer=0, dir="recv")
    b.sync(0, t, t + MS, "send", peer=1, dir="send")
    b.exit(0, t + 2 * MS)
    b.exit(1, t + 2 * MS, unwaited=[i], **how)
    _, f = run(b)
    assert "unwaited_work" not in kinds(f), [x.message for x in f]



def test_work_left_unwaited_at_destroy_is_warned_of_whatever_came_after():
    """Rank 1 leaves an isend unwaited at destroy_process_group, then crashes: the crash
    does not excuse what was left before it (it was dropped with the crash, helper-194)."""
    b = TraceBuilder(2)
    t = b.warmup()
    i = b.async_op(1, t, None, None, "isend", peer=0, dir="send")
    b.sync(0, t, t + MS, "recv", peer=1, dir="recv")
    b.exit(0, t + 2 * MS, reason="destroy_process_group")
    b.exit(1, t + 2 * MS, reason="destroy_process_group", unwaited=[i])
    b.exit(1, t + 5 * MS, reason="exception", exc="OSError: checkpoint: No space left on device")
    _, f = run(b)
    assert ("unwaited_work", [1]) in [(x.kind, x.culprits) for x in f], [x.message for x in f]


@pytest.mark.parametrize("batches", [1, 13])
def test_healthy_trace_has_no_findings(batches):
    ev = healthy_trace(8, 600)
    m = TraceModel()
    step = len(ev) // batches + 1
    for k in range(0, len(ev), step):
        m.ingest(ev[k:k + step])
        assert diagnose(m, now=m.end_ns, hang_after=2.0) == [] or k + step < len(ev)
    assert diagnose(m, hang_after=0.001) == []
    assert diagnose(m, now=m.end_ns + 3600 * S, hang_after=2.0) == []  # all exited: nobody is dead


def test_healthy_trace_single_and_two_ranks():
    for w in (1, 2):
        m = TraceModel.from_events(healthy_trace(w, 200))
        assert diagnose(m, hang_after=0.001) == []


def test_fr_ops_match_only_fr_ops():
    b = TraceBuilder(2)
    t = b.warmup()
    # FR seq 1 on both ranks, while native seq 4 exists only on rank 0: no cross-space confusion
    for r in range(2):
        b.sync(r, t, t + MS, "all_reduce", seq=1, src="fr")
    _, f = run(b)
    assert f == []
    b.sync(0, t + 2 * MS, None, "all_reduce", seq=2, src="fr")
    b.sync(1, t + 2 * MS, None, "broadcast", seq=2, src="fr", root=0)
    _, f = run(b)
    assert kinds(f) == ["collective_mismatch"] and f[0].evidence.get("src") == "fr"


def test_no_straggler_where_completion_times_are_only_bounds():
    """Flight Recorder on Gloo gives no completion time (``approx`` ends): a rank a few ms late
    to DDP's all_reduces cannot be weighed against the collectives' unknown latency."""
    b = TraceBuilder(2)
    t = b.warmup()
    for k in range(20):
        for r in range(2):
            i = b.begin(r, t + (2 * MS if r == 1 else 0), "all_reduce", seq=k + 1, src="fr")
            b.end(r, i, t + (2 * MS if r == 1 else 0), approx=True)
        t += 10 * MS
    b.heartbeats(b.t0, t)
    _, f = run(b)
    assert f == []


@pytest.mark.parametrize("spoiled", [0, 3, 7])
def test_stragglers_read_the_tail_as_a_full_read_would(spoiled):
    """``_timed_tail`` reads a group's last rows a window at a time; what it keeps must be
    what filtering every row would keep: the last 64 instances where everyone finished and
    every completion is a time, not a bound."""
    from commscope.analysis.collectives import STRAGGLER_WINDOW, _timed_tail, complete_rows, gather_many
    from commscope.analysis.model import APPROX, untimed

    b = TraceBuilder(4)
    t = b.t0 + S // 10
    for _ in range(700):
        t = b.collective(t, "all_reduce", skew={3: 50 * MS}, latency=MS) + MS
    b.heartbeats(b.t0, t)
    m, _ = run(b)
    gi = next(iter(m.coll.values()))
    rng = np.random.default_rng(spoiled)
    for r in m.ranks.values():  # some instances lose a member's completion, some only bound it
        if spoiled:
            r.comp[rng.integers(0, r.n, spoiled * 20)] = 0
            r.flags[rng.integers(0, r.n, spoiled * 20)] |= APPROX
    rows = complete_rows(m, gi)
    f, bg, c = gather_many(m, gi, ("flags", "begin", "comp"), rows)
    timed = ~untimed(f, bg, c).any(axis=1)
    want = rows[timed][-STRAGGLER_WINDOW:]
    got, gb, gc = _timed_tail(m, gi)
    assert got.tolist() == want.tolist() and len(want) == STRAGGLER_WINDOW
    assert gb.tolist() == bg[timed][-STRAGGLER_WINDOW:].tolist() and gc.tolist() == c[timed][-STRAGGLER_WINDOW:].tolist()


def test_a_straggler_host_is_named_once_as_the_host():
    """8 ranks of one host slow together: each arrives last only an eighth of the time, the
    host nearly always.  One finding names the host and its ranks; no rank alone, no victim."""
    b = TraceBuilder(32, ranks_per_host=8)
    t = b.t0 + S // 10
    for k in range(24):
        slow = {r: 40 * MS for r in range(8, 16)}
        slow[8 + k % 8] = 50 * MS  # a different one of them last each time
        t = b.collective(t, "all_reduce", skew=slow, latency=MS) + MS
    b.heartbeats(b.t0, t)
    _, f = run(b)
    assert kinds(f) == ["straggler"]
    x = f[0]
    assert x.culprits == list(range(8, 16)) and x.evidence["host"] == "node01"
    assert x.evidence["host_ranks"] == list(range(8, 16)) and x.evidence["last_share"] == 1.0
    assert x.evidence["median_lateness_s"] == pytest.approx(0.05, abs=1e-3)
    assert "host node01 (ranks 8-15)" in x.message


def test_a_straggler_host_is_named_once_its_ranks_metas_come_after_a_diagnosis():
    """The ranks' hosts (``TraceModel.hosts``, kept between diagnoses) follow the metas as
    they come: without them the 8 slow ranks are 8 ranks; once their metas say where they
    run, the host; and a rank whose meta moves it to another host (restarted elsewhere)
    leaves it."""
    b = TraceBuilder(32, ranks_per_host=8)
    t = b.t0 + S // 10
    for k in range(24):
        slow = {r: 40 * MS for r in range(8, 16)}
        slow[8 + k % 8] = 50 * MS
        t = b.collective(t, "all_reduce", skew=slow, latency=MS) + MS
    b.heartbeats(b.t0, t)
    events = b.sorted_events()
    metas = [e for e in events if e["type"] == "meta"]
    m = TraceModel()
    m.ingest([e for e in events if e["type"] != "meta"])
    assert m.hosts() == {}
    assert not any(x.evidence.get("host") for x in diagnose(m, hang_after=2.0))
    m.ingest(metas)
    assert m.hosts() == {r: f"node{r // 8:02d}" for r in range(32)}
    (x,) = diagnose(m, hang_after=2.0)
    assert x.culprits == list(range(8, 16)) and x.evidence["host"] == "node01"
    nine = next(e for e in metas if e["rank"] == 9)
    m.ingest([dict(nine, host="node09", ts=nine["ts"] + 1)])
    assert m.hosts()[9] == "node09" and m.hosts()[8] == "node01"


def test_a_straggler_host_is_the_host_even_when_one_of_its_ranks_is_always_the_last():
    b = TraceBuilder(32, ranks_per_host=8)
    t = b.t0 + S // 10
    for _ in range(24):
        slow = {r: 40 * MS + (r - 8) * 10_000 for r in range(8, 16)}  # rank 15 always last, by a hair
        t = b.collective(t, "all_reduce", skew=slow, latency=MS) + MS
    b.heartbeats(b.t0, t)
    _, f = run(b)
    assert kinds(f) == ["straggler"]
    assert f[0].culprits == list(range(8, 16)) and f[0].evidence["host"] == "node01"


def test_two_slow_hosts_taking_turns_are_both_named_as_hosts():
    """Hosts node01 and node02 slow in turns (each last in half the collectives, by 40-50 ms):
    each is a straggler host that takes turns with the other; nobody else is named."""
    b = TraceBuilder(32, ranks_per_host=8)
    t = b.t0 + S // 10
    for k in range(24):
        host = (8 if k % 2 else 16)
        slow = {r: 40 * MS for r in range(host, host + 8)}
        slow[host + k % 8] = 50 * MS
        t = b.collective(t, "all_reduce", skew=slow, latency=MS) + MS
    b.heartbeats(b.t0, t)
    _, f = run(b)
    got = sorted((x.evidence["host"], x.culprits, x.evidence["turns_with"]) for x in f)
    assert kinds(f) == ["straggler", "straggler"]
    assert got == [("node01", list(range(8, 16)), ["host node02"]), ("node02", list(range(16, 24)), ["host node01"])]
    assert all(x.evidence["last_share"] == 0.5 for x in f)
    assert all(x.evidence["median_lateness_s"] == pytest.approx(0.05, abs=1e-3) for x in f)
    assert "takes turns with host node02" in next(x.message for x in f if x.evidence["host"] == "node01")


def test_two_ranks_taking_turns_are_both_named_and_jitter_is_not():
    """Ranks 3 and 9 late in turns by 30 ms: both named; rank 5, last now and then by a hair
    (0.2 ms against 1 ms collectives), is not."""
    b = TraceBuilder(16)
    t = b.t0 + S // 10
    for k in range(24):
        skew = {3 if k % 2 else 9: 30 * MS} if k % 6 else {5: 200_000}
        t = b.collective(t, "all_reduce", skew=skew, latency=MS) + MS
    b.heartbeats(b.t0, t)
    _, f = run(b)
    assert sorted((x.culprits, x.evidence["turns_with"]) for x in f) == [([3], ["rank 9"]), ([9], ["rank 3"])]


def test_one_slow_rank_of_a_multi_host_job_is_named_as_the_rank():
    b = TraceBuilder(32, ranks_per_host=8)
    t = b.t0 + S // 10
    for _ in range(24):
        t = b.collective(t, "all_reduce", skew={11: 50 * MS, 12: 5 * MS}, latency=MS) + MS
    b.heartbeats(b.t0, t)
    _, f = run(b)
    assert kinds(f) == ["straggler"]
    assert f[0].culprits == [11] and "host" not in f[0].evidence


def test_the_stacks_of_thousands_of_waiting_ranks_fold_to_their_distinct_stacks_with_counts():
    """4,095 ranks wait in an all_reduce for rank 4,095, from two call sites: the finding shows
    the culprit's stack and two waiting stacks, each with how many ranks share it and which."""
    ws = 4096
    b = TraceBuilder(ws)
    t = b.warmup(1)
    for r in range(ws - 1):
        i = b.sync(r, t, None, "all_reduce")
        line = 42 if r % 3 else 77  # a third of them called it from elsewhere
        b.add(r, t + 3 * S, "stack", id=i, threads=[{"tid": 1, "name": "MainThread", "op_thread": True,
                                                      "frames": [["train.py", line, "step"]]}])
    b.add(ws - 1, t + 3 * S, "stack", reason="request", threads=[{"tid": 1, "name": "MainThread",
                                                                   "frames": [["data.py", 7, "load"]]}])
    b.heartbeats(t, t + 5 * S)
    _, f = run(b)
    (x,) = [y for y in f if y.kind == "missing_ranks"]
    assert x.culprits == [ws - 1]
    info, stacks = x.evidence["stack_info"], x.evidence["stacks"]
    assert info[str(ws - 1)]["role"] == "culprit" and stacks[str(ws - 1)][0]["frames"] == ["data.py:7 in load"]
    waiting = {r: n for r, n in info.items() if n["role"] == "waiting"}
    assert sorted((n["count"], stacks[r][0]["frames"][0]) for r, n in waiting.items()) == \
        [(1365, "train.py:77 in step"), (2730, "train.py:42 in step")]
    assert sum(n["count"] for n in waiting.values()) == ws - 1  # every waiting rank counted once
    assert waiting["0"]["ranks"].startswith("0,3,6,") and "stacks_more" not in x.evidence
    assert len(info) == 3 and len(json.dumps(stacks)) < 5_000  # three stacks, not one per rank
    assert x.message.startswith("all_reduce #2 of group 0: 4,095 ranks (0-4094) entered and waited")
    assert len(x.message) < 300  # a count and ranges, not 4,095 numbers


def _waiting_one_by_one(m: TraceModel, f, now: int, limit: int = 8) -> tuple[dict, dict, int]:
    """The waiting ranks' stacks as ``attach_stacks`` is to fold them: each rank's
    ``rank_stack``, grouped by its note's reason and why none, and its threads' text."""
    from commscope.analysis import stacks
    from commscope.analysis.findings import rank_stack

    views = []  # (rank, what it is compared by, its threads, its note)
    for r in dict.fromkeys(f.victims):
        if r not in f.culprits:
            threads, note = rank_stack(m, r, now)
            views.append((r, (note.get("reason"), note.get("missing"), stacks.same_key(threads)), threads, note))
    shown = list(dict.fromkeys(v[1] for v in views))[:limit]  # (the first distinct ones, in the ranks' order)
    info, out = {}, {}
    for key in shown:
        ranks = [v[0] for v in views if v[1] == key]
        first, _, threads, note = next(v for v in views if v[1] == key)
        info[str(first)] = {"role": "waiting", **note}
        if len(ranks) > 1:
            info[str(first)] |= {"count": len(ranks), "ranks": ",".join(map(str, ranks))}
        if threads:
            out[str(first)] = threads
    return info, out, sum(v[1] not in shown for v in views)


@pytest.mark.parametrize("limit_past", [False, True])
def test_waiting_ranks_stacks_fold_as_each_rank_s_own_reads(limit_past):
    """Waiting ranks whose captures hold equal threads in events of their own, the same
    threads with a value folded anew each time (a line past 64 bits: no shared fold), a
    stack request's capture of the same threads (another reason), no capture at all, and
    (``limit_past``) more distinct stacks than are shown: grouped as each rank's own
    ``rank_stack`` reads, the first of each group shown with its count and ranks."""
    ws = 41
    b = TraceBuilder(ws)
    t = b.warmup(1)
    for r in range(ws - 1):
        i = b.sync(r, t, None, "all_reduce")
        frames = [["train.py", 42, "step"]]
        if r % 5 == 1:
            frames = [["train.py", 2**70, "step"]]
        elif r % 5 == 4:
            frames = [["train.py", 100 + (r if limit_past else 0), "step"]]
        thread = {"tid": 1, "name": "MainThread", "op_thread": True, "frames": frames}
        if r % 5 == 2:
            b.add(r, t + 3 * S, "stack", reason="request", threads=[thread])
        elif r % 5 != 3:
            b.add(r, t + 3 * S, "stack", id=i, threads=[thread])
    b.heartbeats(t, t + 5 * S)
    now = t + 5 * S
    m, f = run(b, now=now)
    (x,) = [y for y in f if y.kind == "missing_ranks"]
    assert x.culprits == [ws - 1]
    info, out, more = _waiting_one_by_one(m, x, now)
    got = {r: n for r, n in x.evidence["stack_info"].items() if n["role"] == "waiting"}
    for n in got.values():  # (ranges, as the finding writes them; the oracle lists them)
        if "ranks" in n:
            n["ranks"] = ",".join(str(r) for part in n["ranks"].split(",") for r in (
                range(int(part.split("-")[0]), int(part.split("-")[-1]) + 1)))
    assert got == info
    assert {r: v for r, v in x.evidence["stacks"].items() if r in got} == out
    assert x.evidence.get("stacks_more", 0) == more
    assert (more > 0) == limit_past and len(got) == (8 if limit_past else 5)
    assert got["0"]["count"] == 8 and got["1"]["count"] == 8 and got["3"]["missing"].startswith("no stack")


def test_a_slow_host_with_one_much_slower_rank_is_still_the_host():
    b = TraceBuilder(32, ranks_per_host=8)
    t = b.t0 + S // 10
    for _ in range(24):
        slow = {r: 45 * MS for r in range(8, 16)}
        slow[8] = 100 * MS  # one of them far worse: it must not hide the other seven
        t = b.collective(t, "all_reduce", skew=slow, latency=MS) + MS
    b.heartbeats(b.t0, t)
    _, f = run(b)
    assert [(x.kind, x.culprits, x.evidence["host"]) for x in f] == [("straggler", list(range(8, 16)), "node01")]


def test_a_slow_host_seen_across_hsdp_replica_groups_is_one_finding():
    """Replica groups hold one rank per host: each sees one of node01's ranks straggle; the
    finding is the host, once, not eight ranks."""
    b = TraceBuilder(32, ranks_per_host=8)
    for k in range(8):
        b.group(f"rep{k}", [k, k + 8, k + 16, k + 24])
    t = b.t0 + S // 10
    for _ in range(24):
        end = t
        for k in range(8):
            end = max(end, b.collective(t, "all_reduce", f"rep{k}", skew={k + 8: 40 * MS}, latency=MS))
        t = end + MS
    b.heartbeats(b.t0, t)
    _, f = run(b)
    assert [(x.kind, x.culprits, x.evidence["host"]) for x in f] == [("straggler", list(range(8, 16)), "node01")]
    assert len(f[0].evidence.get("other_groups") or []) == 7  # every replica group it was seen in


def test_a_host_rank_straggling_in_another_group_keeps_its_own_finding():
    b = TraceBuilder(32, ranks_per_host=8)
    b.group("dp", [0, 1, 2, 8])
    t = b.t0 + S // 10
    for _ in range(24):
        t = b.collective(t, "all_reduce", skew={r: 40 * MS for r in range(8, 16)}, latency=MS) + MS
        t = b.collective(t, "all_gather", "dp", skew={8: 200 * MS}, latency=MS) + MS
    b.heartbeats(b.t0, t)
    _, f = run(b)
    got = sorted((x.group, x.culprits, x.evidence.get("host")) for x in f)
    assert got == [("0", list(range(8, 16)), "node01"), ("dp", [8], None)]


def test_a_rank_that_died_waiting_is_not_counted_among_the_waiting():
    """A collective rank 3 never entered: ranks 1 and 2 still wait in it, rank 0 waited and
    then died (silent, its peers heartbeating on).  The missing-ranks detector counts only
    the living among those waiting (``rankstate.left_early``): rank 0 is not a victim."""
    from commscope.analysis.collectives import find_missing

    b = TraceBuilder(4)
    t = b.warmup()
    b.heartbeats(b.t0, t + 20 * S, ranks=[1, 2, 3])
    b.heartbeats(b.t0, t + S, ranks=[0])
    for r in (0, 1, 2):
        b.sync(r, t, None, "all_reduce")
    m = TraceModel.from_events(b.sorted_events())
    now = t + 20 * S
    (f,) = find_missing(m, now, 2 * S, set())
    assert f.kind == "missing_ranks" and f.culprits == [3]
    assert sorted(f.victims) == [1, 2]
    found = [(x.kind, x.culprits, sorted(x.victims)) for x in diagnose(m, now, 2.0)]
    assert found == [("missing_ranks", [3], [1, 2]), ("dead_rank", [0], [])]


def _absent_members(n: int):
    """The missing_ranks finding of a group of ``n`` in which ranks 0 and 1 alone entered."""
    b = TraceBuilder(2)
    b.group("big", list(range(n)))
    t = b.warmup()
    b.sync(0, t, None, "all_reduce", "big")
    b.sync(1, t, None, "all_reduce", "big")
    b.heartbeats(t, t + 5 * S)
    _, f = run(b)
    return next(x for x in f if x.kind == "missing_ranks")


def test_thousands_of_absent_members_are_said_together_in_one_line():
    """Ranks doing the same instead of a collective are said once, at most 8 sayings and then
    how many ranks more: a sentence a rank made a group of 5,000 absent members 8,000 lines
    of ``check`` (the evidence still has each rank's)."""
    n = 5000
    x = _absent_members(n)
    assert x.message.endswith("4,998 ranks (2-4999) never entered: 4,998 ranks (2-4999) have no events recorded"), \
        x.message[-300:]
    assert len(x.evidence["missing_activity"]) == n - 2


def _drawn(f) -> list[str]:
    """The finding's evidence as ``check`` draws it, at 80 columns."""
    import io

    from rich.console import Console, Group

    from commscope.analysis import evidence

    con = Console(width=80, file=io.StringIO(), record=True, color_system=None)
    con.print(Group(*evidence.render(f)))
    return con.export_text().splitlines()


def test_a_finding_of_thousands_of_ranks_says_the_ranks_alike_once():
    """(helper-165) At 4,096 ranks a mismatch's message named every rank (93,207 characters,
    its culprit in the last clause) and its table drew a row a rank; a hang's waits listed
    every rank's when one waited less; 5,000 absent members drew a saying each."""
    n = 512
    b = TraceBuilder(n)
    t = b.warmup()
    for r in range(n):
        if r != 300:
            b.sync(r, t, None, "all_reduce")
    b.sync(300, t, None, "broadcast", root=0)
    b.heartbeats(t, t + 5 * S)
    _, f = run(b)
    (x,) = f
    assert x.kind == "collective_mismatch" and x.culprits == [300]
    assert x.message == ("ranks disagree at collective #4 of group 0: 511 ranks (0-299,301-511): all_reduce; "
                         "rank 300: broadcast; differing: op; rank(s) 300 differ from the majority")
    # (not "op, redop, root": a broadcast takes no reduce op, an all_reduce no root, helper-176)
    drawn = _drawn(x)
    assert len(drawn) < 12 and len(x.evidence["per_rank"]) == n, drawn  # (the evidence keeps each rank's)
    assert any("300" in ln and "broadcast" in ln for ln in drawn)
    assert any("0-299,301-511 (511)" in ln for ln in drawn)

    b = TraceBuilder(n)  # rank 7 entered late (waited less), rank 9 never
    t = b.warmup()
    for r in range(n):
        if r != 9:
            b.sync(r, t + (2 * S if r == 7 else 0), None, "all_reduce")
    b.heartbeats(t, t + 6 * S)
    _, f = run(b)
    x = next(x for x in f if x.kind == "missing_ranks")
    assert x.culprits == [9]
    waiting = next(ln for ln in _drawn(x) if ln.startswith("waiting"))
    assert waiting.split("  ", 1)[1].strip() == "511 ranks, 4.0-6.0 s (median 6.0 s); least (came last): rank 7 4.0 s"

    drawn = _drawn(_absent_members(5000))
    assert len(drawn) < 20 and "4,998 ranks (2-4999)  no events recorded" in drawn, drawn


def test_what_absent_members_do_is_said_in_at_most_eight_sayings():
    from commscope.analysis.findings import doing_instead as _instead_said

    missing = list(range(20))
    instead = {str(m): {"text": f"idle for {m // 2} s"} for m in missing}  # (pairs alike)
    said = _instead_said(missing, instead)
    assert said.startswith("rank(s) 0, 1 are idle for 0 s; rank(s) 2, 3 are idle for 1 s; ")
    assert said.endswith("rank(s) 14, 15 are idle for 7 s; and 4 rank(s) more, each in the evidence")
    assert _instead_said([7], {"7": {"text": "dead"}}) == "rank 7 is dead"


def test_an_any_source_recv_no_one_answers_says_its_peers_together():
    """Rank 0 in an any-source recv of a group of 3,000, the others idle: one unmatched_p2p
    naming them all, its message what they do said once (a sentence a peer before)."""
    n = 3000
    b = TraceBuilder(2)
    b.group("big", list(range(n)))
    t = b.warmup()
    b.sync(0, t, None, "recv", "big", dir="recv", peer=None, shape=(4,))
    b.heartbeats(t, t + 5 * S)
    _, f = run(b)
    x = next(x for x in f if x.kind == "unmatched_p2p")
    assert x.culprits == list(range(1, n)) and x.victims == {0: tuple(range(1, n))}
    assert x.message.count("; ") <= 8 and "2,998 ranks (2-2999) have no events recorded" in x.message, \
        x.message[-400:]


@pytest.mark.parametrize("world", [3, 300])
def test_an_any_source_recv_names_no_member_that_waits_on_it_in_turn(world):
    """Rank 0 in an any-source recv; the others but rank 1 wait in the barrier rank 0 never
    reaches (they cannot send before it is served); rank 1, idle, neither sends nor comes.
    One error, the recv naming rank 1, the barrier's hang its consequence (before: the
    recv named ranks 1 and 2, the hang ranks 0 and 1, two errors each naming a victim).
    ``world`` 300: the barrier's waiting ranks share one wait set (``rootcause._waits``)."""
    b = TraceBuilder(world)
    t = b.warmup()
    b.sync(0, t, None, "recv", dir="recv", peer=None, shape=(4,))
    for r in range(2, world):
        b.sync(r, t + MS, None, "barrier")
    b.heartbeats(t, t + 10 * S)
    for batches in (1, 7):
        _, f = run(b, batches=batches)
        errors = [x for x in f if x.severity == "error"]
        assert [(x.kind, x.culprits) for x in errors] == [("unmatched_p2p", [1])], [x.message[:200] for x in f]
        assert [(c["kind"], c["culprits"]) for c in errors[0].evidence["consequences"]] == [("missing_ranks", [0, 1])]
        assert set(errors[0].victims) == set(range(world)) - {1}
        said = "ranks (2-299) wait" if world > 3 else "; rank 2 waits"
        assert said + " on rank 0 in turn and cannot send first. Then: " in errors[0].message, errors[0].message


def test_a_hang_on_a_deadlock_and_an_idle_rank_names_the_idle_rank_beside_the_deadlock():
    """Rank 0 in the barrier; ranks 1 and 2 send to each other, rank 3 to 2; rank 4, idle,
    never comes: the hang names rank 4, the deadlock ranks 1 and 2 (before, the hang named
    ranks 1, 2 and 4: the deadlock's ranks twice)."""
    b = TraceBuilder(5)
    t = b.warmup()
    for r, peer in ((1, 2), (2, 1), (3, 2)):
        b.sync(r, t, None, "send", peer=peer, dir="send")
    b.sync(0, t + MS, None, "barrier")
    b.heartbeats(t, t + 10 * S)
    for batches in (1, 7):
        _, f = run(b, batches=batches)
        errors = [x for x in f if x.severity == "error"]
        assert [(x.kind, x.culprits) for x in errors] == [("missing_ranks", [4]), ("p2p_deadlock", [1, 2])], [
            x.message[:200] for x in f]
        assert errors[0].victims == {0: (4,)} and errors[0].message.endswith("; ranks 1, 2 are in a p2p deadlock")


def test_any_source_recvs_each_waiting_on_the_others_in_turn_still_name_them():
    """Rank 0's any-source recv, ranks 1 and 2 in the barrier rank 0 never reaches: every
    member the recv could hear from waits on it in turn, so none is dropped (they wait on
    each other: rank 0 never entered, the recv names ranks 1 and 2)."""
    b = TraceBuilder(3)
    t = b.warmup()
    b.sync(0, t, None, "recv", dir="recv", peer=None, shape=(4,))
    for r in (1, 2):
        b.sync(r, t + MS, None, "barrier")
    b.heartbeats(t, t + 10 * S)
    _, f = run(b)
    recv = next(x for x in f if x.kind == "unmatched_p2p")
    assert recv.victims[0] == (1, 2) and "in turn" not in recv.message


def test_a_rank_missing_from_two_groups_of_a_mesh_is_one_finding():
    """A 2x2 mesh (tp groups {0,1} {2,3}, dp groups {0,2} {1,3}): rank 1 never comes, so rank
    0 waits in tp0's all_reduce and rank 3 in dp1's, and rank 2 waits on rank 0 in dp0's.  One
    root cause gave two missing_ranks errors naming rank 1 (helper-67, DTensor); now one, the
    others' waits its consequences, each named with its group."""
    b = TraceBuilder(4)
    for name, g in (("tp0", [0, 1]), ("tp1", [2, 3]), ("dp0", [0, 2]), ("dp1", [1, 3])):
        b.group(name, g)
    t = b.warmup()
    b.begin(0, t, "all_reduce", "tp0")
    b.begin(3, t + S // 20, "all_reduce", "dp1")
    b.begin(2, t + S // 10, "all_reduce", "dp0")
    b.heartbeats(b.t0, t + 10 * S)
    for batches in (1, 4):
        _, f = run(b, t + 10 * S, batches=batches)
        errors = [x for x in f if x.severity == "error"]
        assert [(x.kind, x.group, x.culprits) for x in errors] == [("missing_ranks", "tp0", [1])]
        said = [(c["kind"], c["group"], c["culprits"]) for c in errors[0].evidence["consequences"]]
        assert sorted(said) == [("missing_ranks", "dp0", [0]), ("missing_ranks", "dp1", [1])], said
        assert errors[0].message.endswith("Then: rank 3 waited in all_reduce #1 (group dp1); "
                                          "rank 2 waited in all_reduce #1 (group dp0)"), errors[0].message


@pytest.mark.parametrize("senders", [(2,), (1, 2)])
def test_a_send_never_received_because_its_peer_went_into_a_collective_is_one_finding(senders):
    """Rank 2 sends to rank 3, which never posts the recv: it went into the barrier rank 2
    never reaches (a wait cycle through the collective).  One error: the unmatched send,
    culprit 3, with the barrier's wait as its consequence; rank 2, blocked, is no culprit
    (the barrier's missing_ranks named it).  Two senders alike: one finding, the second
    send its consequence."""
    _, f = run(sends_into(4, dict.fromkeys(senders, 3), tuple(r for r in range(4) if r not in senders)))
    errors = [(x.kind, x.culprits) for x in f if x.severity == "error"]
    assert errors == [("unmatched_p2p", [3])], [x.message for x in f]
    x = f[0]
    also = [("unmatched_p2p", [3])] if len(senders) > 1 else []
    assert [(c["kind"], c["culprits"]) for c in x.evidence["consequences"]] == [*also, ("missing_ranks", list(senders))]
    assert set(x.victims) == {0, 1, 2} - {3}
    assert "the matching recv was never posted: rank 3 is in barrier #" in x.message


@pytest.mark.parametrize("batches", [1, 7])
def test_a_wait_cycle_through_a_barrier_beside_an_idle_rank_is_two_findings_naming_no_blocked_rank(batches):
    """Rank 2 sends to 3, which waits in the barrier rank 2 never reaches; rank 1, idle,
    never comes either.  Two causes: rank 1's absence (missing_ranks [1]) and the unmatched
    send (culprit 3).  The hang named ranks 1 and 2 (2 blocked, a victim) and the send was
    named through the hang as ranks 1 and 3."""
    _, f = run(sends_into(4, {2: 3}, (0, 3)), batches=batches)
    errors = [x for x in f if x.severity == "error"]
    assert [(x.kind, x.culprits) for x in errors] == [("missing_ranks", [1]), ("unmatched_p2p", [3])], [
        x.message for x in f]
    hang, send = errors
    assert "named_through" not in send.evidence and set(send.victims) == {2}
    assert hang.evidence["missing"] == [1, 2] and hang.victims == {0: (1,)}
    assert hang.message.endswith("; rank 2 is blocked in a wait cycle through it"), hang.message


def test_a_wait_cycle_through_a_barrier_that_another_group_waits_on_is_still_two_findings():
    """As above, and rank 5 waits in group D's all_reduce (ranks 3 and 5), which rank 3,
    in the barrier, never reaches: rank 5's wait is the cycle's consequence (helper-94: the
    send folded into rank 5's hang, and two missing_ranks named ranks 1 and 2, 1 and 3)."""
    b = TraceBuilder(6)
    t = b.warmup()
    b.group("W", [0, 1, 2, 3])
    b.group("D", [3, 5])
    b.sync(2, t, None, "send", peer=3, dir="send")
    for r in (0, 3):
        b.sync(r, t + MS, None, "barrier", group="W")
    b.sync(5, t + 2 * MS, None, "all_reduce", group="D")
    b.heartbeats(t, t + 10 * S)
    for batches in (1, 7):
        _, f = run(b, batches=batches)
        errors = [x for x in f if x.severity == "error"]
        assert [(x.kind, x.culprits) for x in errors] == [("missing_ranks", [1]), ("unmatched_p2p", [3])], [
            x.message[:200] for x in f]
        assert [(c["kind"], c["group"]) for c in errors[1].evidence["consequences"]] == [("missing_ranks", "D")]


def test_a_chain_of_sends_into_a_collective_beside_an_idle_rank_names_no_blocked_rank():
    """Rank 2 sends to 3, rank 3 to 4, which waits in the all_reduce with rank 0; rank 1,
    idle, never comes: missing_ranks [1] and the unmatched send to 4 (helper-94: the hang
    named rank 2, blocked, its send's finding folded into rank 3's before)."""
    b = sends_into(5, {2: 3, 3: 4}, (0, 4), "all_reduce")
    for batches in (1, 7):
        _, f = run(b, batches=batches)
        assert [(x.kind, x.culprits) for x in f if x.severity == "error"] == [
            ("missing_ranks", [1]), ("unmatched_p2p", [4])], [x.message for x in f]
        assert f[0].victims == {0: (1,)}


@pytest.mark.parametrize("world", [4, 300])
def test_a_chain_of_sends_into_a_collective_is_one_finding_at_its_end(world):
    """Rank 1 sends to 2, 2 to 3, ... and the last waits in the all_reduce with rank 0 (and,
    ``world`` 300, rank 1 idle besides: a chain of 297 sends): one error at the chain's end
    (helper-95: the hang folded into rank 1's send, naming rank 2, blocked; past 256 links
    every link was named as idle)."""
    last = world - 1
    first = 1 if world == 4 else 2
    b = sends_into(world, {r: r + 1 for r in range(first, last)}, (0, last), "all_reduce")
    _, f = run(b)
    want = [("unmatched_p2p", [last])] if first == 1 else [("missing_ranks", [1]), ("unmatched_p2p", [last])]
    assert [(x.kind, x.culprits) for x in f if x.severity == "error"] == want, [x.message[:200] for x in f]


def test_a_chain_of_sends_into_a_subgroup_s_collective_beside_an_idle_rank_names_no_link():
    """Rank 1 sends to 2, 2 to 3, which waits in group A's all_reduce (A = 0, 1, 3); rank 0,
    idle, never comes: missing_ranks [0] and the send to 3, the send to 2 a link folded into
    it (helper-96: it stood, named through the idle rank as ranks 0 and 2)."""
    b = sends_into(4, {1: 2, 2: 3}, (3,), "all_reduce", "A", members=[0, 1, 3])
    for batches in (1, 7):
        _, f = run(b, batches=batches)
        assert [(x.kind, x.culprits) for x in f if x.severity == "error"] == [
            ("missing_ranks", [0]), ("unmatched_p2p", [3])], [x.message[:200] for x in f]


def test_a_chain_of_sends_into_a_wait_cycle_beside_an_idle_rank_names_no_link():
    """Group B = 0, 1, 4: rank 1 waits in its all_reduce, rank 0 (idle) never comes, rank 4
    sends to 1 (a wait cycle through B); rank 3 sends to 1 as well, and rank 2 to 3.  The
    cycle is rank 1's: the hang names rank 0, the sends rank 1 (helper-96: the send to 3,
    the chain's outer link, was kept for the cycle, naming rank 3, blocked)."""
    b = sends_into(5, {2: 3, 3: 1, 4: 1}, (1,), "all_reduce", "B", members=[0, 1, 4])
    for batches in (1, 7):
        _, f = run(b, batches=batches)
        assert [(x.kind, x.culprits) for x in f if x.severity == "error"] == [
            ("missing_ranks", [0]), ("unmatched_p2p", [1])], [x.message[:200] for x in f]
        assert set(f[1].victims) == {2, 3, 4}


def _errors_at(b: TraceBuilder, now: int) -> list[tuple[str, list[int]]]:
    _, f = run(b, now=now)
    return [(x.kind, x.culprits) for x in f if x.severity == "error"]


@pytest.mark.parametrize("blocked_in", ["send", "all_reduce"])
def test_a_member_blocked_a_moment_less_than_hang_after_is_never_named(blocked_in):
    """Rank 2 waits in group A's all_reduce (ranks 1, 2, 4) from ``t``; rank 4, 3 ms later,
    blocks in a send to rank 1, idle (or in group B's all_reduce with rank 1); rank 3 sends
    to 4 3 ms later still.  For the 6 ms between rank 2's wait passing hang_after and rank
    3's send doing so, the hang named rank 4 (blocked: a victim), and rank 3's send, once
    hung, rank 4 again (helper-96's fuzzed hangs: 80 of 700 flashed a victim so).  Judged
    at every moment around hang_after it says what it says at the end."""
    b = TraceBuilder(5)
    t = b.warmup()
    b.group("A", [1, 2, 4])
    b.group("B", [1, 4])
    b.sync(2, t, None, "all_reduce", group="A")
    if blocked_in == "send":
        b.sync(4, t + 3 * MS, None, "send", peer=1, dir="send")
    else:
        b.sync(4, t + 3 * MS, None, "all_reduce", group="B")
    b.sync(3, t + 6 * MS, None, "send", peer=4, dir="send")
    b.heartbeats(t, t + 10 * S)
    end = _errors_at(b, t + 10 * S)
    assert {c for _, cs in end for c in cs} == {1}, end
    for ms in (1, 2, 4, 5, 7, 100):
        assert _errors_at(b, t + 2 * S + ms * MS) == end, ms


def test_a_member_late_by_itself_that_now_waits_a_moment_is_still_the_one_named():
    """Rank 2 waits in group A's all_reduce (ranks 2, 4) for 2 s; rank 4 runs a pipeline's
    sends to rank 1 all that time (each received), and has just posted another that rank 1
    has not received yet: rank 4 is the one late, not rank 1 (a wait that began in the
    latter half of the hang is not drawn into it: ``hangs.drawn_in``)."""
    b, t = _late_by_itself()
    b.heartbeats(t, t + 2 * S + 10 * MS)
    assert _errors_at(b, t + 2 * S + 5 * MS) == [("missing_ranks", [4])]


def _late_by_itself() -> tuple[TraceBuilder, int]:
    """Rank 2 in group A's all_reduce (ranks 2, 4) from ``t``; rank 4 sends to rank 1 every
    100 ms, each received, then once more at 1.99 s, not received yet."""
    b = TraceBuilder(5)
    t = b.warmup()
    b.group("A", [2, 4])
    b.sync(2, t, None, "all_reduce", group="A")
    for k in range(19):
        u = t + k * 100 * MS
        b.sync(4, u, u + MS, "send", peer=1, dir="send")
        b.sync(1, u, u + MS, "recv", peer=4, dir="recv")
    b.sync(4, t + 1990 * MS, None, "send", peer=1, dir="send")
    return b, t


def test_a_job_stopped_with_a_rank_late_by_itself_names_it_however_late_it_is_judged():
    """As above, and the launcher stops the job at 2.5 s: the midpoint is the stop's, not
    now's (helper-97: judged from 4 s on, rank 4's send, 0.5 s old when the job stopped,
    was drawn in and rank 1 named)."""
    b, t = _late_by_itself()
    stop = t + 2500 * MS
    b.heartbeats(t, stop)
    for r in range(5):
        b.exit(r, stop, reason="signal", signal="Terminated")
    for ms in (2500, 3000, 4000, 6000, 60000):
        assert _errors_at(b, t + ms * MS) == [("missing_ranks", [4])], ms


@pytest.mark.parametrize("world", [False, True], ids=["group A", "the world, rank 0 dead"])
def test_a_wait_drawn_in_down_a_later_path_names_no_blocked_rank(world):
    """Rank 1 waits in group A's all_reduce from ``t``; rank 2 (in A) blocks at 1.2 s in a
    send to rank 3; rank 3 (in A) at 1.45 s in a send to rank 4, idle.  Rank 3's send began
    in the latter half of A's wait but the first half of rank 2's: drawn in through rank 2
    (helper-97: rank 3 was walked once, from A's hang, and rank 2's send named it, blocked,
    from 2.4 s to 3.45 s).  (Before 2.4 s, rank 2's send began in the latter half of A's
    wait: ranks 2 and 3 are late by themselves.)"""
    b = TraceBuilder(5)
    t = b.warmup()
    b.group("A", [0, 1, 2, 3, 4] if world else [1, 2, 3])
    b.sync(1, t, None, "all_reduce", group="A")
    b.sync(2, t + 1200 * MS, None, "send", peer=3, dir="send")
    b.sync(3, t + 1450 * MS, None, "send", peer=4, dir="send")
    if world:
        b.heartbeats(b.t0, t, interval=S // 2, ranks=[0])
        b.exit(0, t + 50 * MS, reason="signal", signal="SIGKILL")
    b.heartbeats(t, t + 6 * S, ranks=[1, 2, 3, 4])
    for ms in (2400, 2500, 3000, 3400, 3500, 6000):
        named = {c for _, cs in _errors_at(b, t + ms * MS) for c in cs}
        assert named == ({0, 4} if world else {4}), (ms, named)


def test_an_idle_rank_missing_from_a_collective_and_never_receiving_a_send_is_one_finding():
    """Rank 3, idle, never enters group D's all_reduce (ranks 0 and 1 wait there) and never
    posts the recv of rank 2's send: one cause, one error (it was two, each naming rank 3)."""
    b = TraceBuilder(4)
    t = b.warmup()
    b.group("D", [0, 1, 3])
    b.sync(2, t, None, "send", peer=3, dir="send")
    for r in (0, 1):
        b.sync(r, t + MS, None, "all_reduce", group="D")
    b.heartbeats(t, t + 10 * S)
    _, f = run(b)
    assert [(x.kind, x.culprits) for x in f if x.severity == "error"] == [("unmatched_p2p", [3])], [
        x.message for x in f]
    assert [(c["kind"], c["group"]) for c in f[0].evidence["consequences"]] == [("missing_ranks", "D")]
    assert set(f[0].victims) == {0, 1, 2}


def test_a_send_to_a_rank_of_a_p2p_deadlock_is_the_deadlock_s_consequence():
    """Ranks 0 and 1 each wait in a recv from the other; rank 2 sends to rank 0, which never
    posts that recv because of the deadlock: one error, the deadlock (it was two)."""
    b = TraceBuilder(3)
    t = b.warmup()
    b.sync(0, t, None, "recv", peer=1, dir="recv")
    b.sync(1, t, None, "recv", peer=0, dir="recv")
    b.sync(2, t + MS, None, "send", peer=0, dir="send")
    b.heartbeats(t, t + 10 * S)
    _, f = run(b)
    assert [(x.kind, x.culprits) for x in f if x.severity == "error"] == [("p2p_deadlock", [0, 1])], [
        x.message for x in f]
    assert [(c["kind"], c["culprits"]) for c in f[0].evidence["consequences"]] == [("unmatched_p2p", [0])]
    assert 2 in f[0].victims


def test_ranks_blocked_sending_to_one_rank_that_never_receives_are_one_finding():
    """Eight ranks send to rank 0, which never posts a recv: one unmatched_p2p naming rank 0
    (it was eight, one per sender: thousands at scale), the other sends its consequences;
    a send to another idle rank stays a finding of its own."""
    b = TraceBuilder(11)
    t = b.warmup()
    for r in range(1, 9):
        b.sync(r, t + r * MS, None, "send", peer=0, dir="send")
    b.sync(9, t, None, "recv", peer=10, dir="recv")
    b.heartbeats(t, t + 10 * S)
    _, f = run(b)
    assert [(x.kind, x.culprits) for x in f] == [("unmatched_p2p", [10]), ("unmatched_p2p", [0])], [x.message for x in f]
    x = f[1]
    assert x.message.startswith("rank 1 waits send (send to 0)")
    assert [c["ranks"] for c in x.evidence["consequences"]] == [[0, r] for r in range(2, 9)]
    assert x.message.endswith("Then: rank 2 blocked in send #1; rank 3 blocked in send #1; rank 4 blocked in send #1; "
                              "rank 5 blocked in send #1 and 3 more")
    assert set(x.victims) == set(range(1, 9))


def test_an_op_refused_on_a_rank_that_waits_later_is_its_own_finding():
    """Rank 3's broadcast raised on rank 3 itself (refused, caught); later ranks 0, 1, 3 wait
    in an all_reduce rank 2 never enters.  Two errors: the hang (culprit 2) and the refusal
    (culprit 3).  The refusal was folded into the hang, as if rank 3's later wait for rank 2
    explained it ("Then: broadcast failed on rank 3")."""
    b = TraceBuilder(4)
    t = b.warmup()
    i = b.begin(3, t, "broadcast", seq=None, root=99)
    b.end(3, i, t + MS, exc="RuntimeError: invalid root rank", unissued=True)
    t = b.collective(t + 2 * MS, "all_reduce")
    for r in (0, 1, 3):
        b.sync(r, t + MS, None, "all_reduce")
    b.heartbeats(b.t0, t + 10 * S)
    _, f = run(b)
    assert [(x.kind, x.culprits) for x in f] == [("missing_ranks", [2]), ("op_failed", [3])], [x.message for x in f]
    assert "consequences" not in f[0].evidence and "raised on rank 3 itself" in f[1].message


def test_a_rank_blocked_in_a_p2p_cycle_is_no_culprit_of_another_group_s_hang():
    """Rank 2 sends to 3, which waits in group T's barrier for rank 2 (a cycle through it);
    rank 0 waits in group D's all_reduce for rank 2 too.  One error, the unmatched send
    (culprit 3), both hangs its consequences, whichever group's is judged first (D's was
    left naming rank 2, blocked in the cycle)."""
    for groups in ((("T", [2, 3]), ("D", [0, 2])), (("D", [0, 2]), ("T", [2, 3]))):
        b = TraceBuilder(4)
        t = b.warmup()
        for name, ranks in groups:
            b.group(name, ranks)
        b.sync(2, t, None, "send", peer=3, dir="send")
        b.sync(3, t + MS, None, "barrier", group="T")
        b.sync(0, t + 2 * MS, None, "all_reduce", group="D")
        b.heartbeats(t, t + 10 * S)
        _, f = run(b)
        assert [(x.kind, x.culprits) for x in f] == [("unmatched_p2p", [3])], [x.message for x in f]
        assert sorted((c["kind"], c["group"]) for c in f[0].evidence["consequences"]) == [
            ("missing_ranks", "D"), ("missing_ranks", "T")]


def test_an_old_refusal_and_a_later_absence_of_the_same_rank_are_two_findings():
    """Rank 3's broadcast raised on rank 3 itself; later rank 3 never comes to an all_reduce
    the others wait in.  Two causes: the hang was folded into the refusal, as if it were the
    wait the refusal timed out."""
    b = TraceBuilder(4)
    t = b.warmup()
    i = b.begin(3, t, "broadcast", seq=None, root=99)
    b.end(3, i, t + MS, exc="RuntimeError: invalid root rank", unissued=True)
    for r in (0, 1, 2):
        b.sync(r, t + 2 * MS, None, "all_reduce")
    b.heartbeats(b.t0, t + 10 * S)
    _, f = run(b)
    assert [(x.kind, x.culprits) for x in f] == [("missing_ranks", [3]), ("op_failed", [3])], [x.message for x in f]


def test_two_p2p_cycles_through_one_barrier_are_two_findings_naming_no_blocked_rank():
    """Rank 1 sends to 0 and rank 2 to 3; ranks 0 and 3 wait in the barrier ranks 1 and 2
    never reach.  Two causes, two errors: the unmatched sends (culprits 0 and 3), the
    barrier's hang folded into the first; no error names rank 1 or 2, blocked (the hang
    named both), and rank 3 is nobody's victim in the first."""
    _, f = run(sends_into(4, {2: 3, 1: 0}, (0, 3)))
    assert [(x.kind, x.culprits) for x in f] == [("unmatched_p2p", [0]), ("unmatched_p2p", [3])], [x.message for x in f]
    assert [c["kind"] for c in f[0].evidence["consequences"]] == ["missing_ranks"]
    assert set(f[0].victims) == {1} and set(f[1].victims) == {2}


@pytest.mark.parametrize("still_waiting", [False, True])
def test_a_timed_out_wait_and_another_group_s_hang_on_one_absent_rank_are_one_finding(still_waiting):
    """Rank 2, idle, never came to group A's all_reduce (it timed out on rank 0, and on 1 or
    1 still waits) nor to group B's (rank 3 waits): one error, the op_failed blamed on rank
    2, B's hang its consequence (an op_failed of another instance was left apart from it)."""
    timed_out = "RuntimeError: [../unbound_buffer.cc:78] Timed out waiting 1000ms for recv operation to complete"
    b = TraceBuilder(4)
    t = b.warmup()
    b.group("A", [0, 1, 2])
    b.group("B", [2, 3])
    ids = {r: b.begin(r, t, "all_reduce", group="A") for r in (0, 1)}
    b.end(0, ids[0], t + 3 * S, exc=timed_out)
    if not still_waiting:
        b.end(1, ids[1], t + 3 * S + MS, exc=timed_out)
    b.sync(3, t + MS, None, "all_reduce", group="B")
    b.heartbeats(b.t0, t + 10 * S)
    _, f = run(b)
    assert [(x.kind, x.culprits, x.group) for x in f] == [("op_failed", [2], "A")], [x.message for x in f]
    assert ("missing_ranks", "B") in [(c["kind"], c["group"]) for c in f[0].evidence["consequences"]]


@pytest.mark.parametrize("cpu", ["spinning", "idle", "spun then stuck", "idle then spinning"])
def test_a_missing_rank_busy_outside_any_op_is_said_computing_not_idle(cpu):
    """A rank spinning in Python instead of joining the all_reduce was "idle" while its
    samples said 70% CPU (helper-191): by its latest samples, it computes.  One that
    computed, then stuck on a lock, is idle now (helper-199); ranks busy alike are said
    once, their figures in the evidence."""
    b = TraceBuilder(6)
    t = b.warmup()
    for r in (0, 1, 3):
        b.sync(r, t, None, "all_reduce")
    for r in range(6):
        k = t
        while k <= t + 10 * S:
            late = k > t + 9 * S
            busy = r in (2, 4, 5) and {"spinning": True, "idle": False, "spun then stuck": not late,
                                       "idle then spinning": late}[cpu]
            b.heartbeat(r, k, cpu=(90.0 + r + (k // MS) % 7) if busy else 1.0)
            k += S // 5
    _, f = run(b, now=t + 10 * S)
    (miss,) = [x for x in f if x.kind == "missing_ranks"]
    assert miss.culprits == [2, 4, 5] and 0 not in miss.culprits
    computing = cpu in ("spinning", "idle then spinning")
    said = ("rank(s) 2, 4, 5 are computing, not communicating (busy on CPU; last all_reduce" if computing else
            "rank(s) 2, 4, 5 are idle (last all_reduce")
    assert said in miss.message, miss.message
    assert ("computing" in miss.message) == computing
    per = miss.evidence["missing_activity"]
    assert all((per[str(r)].get("cpu", 0) >= 90) == computing for r in (2, 4, 5)), per


def test_a_consequence_unmatched_p2p_names_the_rank_waiting_in_it_not_its_peer():
    """Rank 0 sends to 1, which receives from 2, which is in the all_reduce: "Then: ranks 0, 1
    blocked in send #1" said rank 1, in a recv, was in the send (helper-191)."""
    b = TraceBuilder(3)
    t = b.warmup()
    b.sync(0, t, None, "send", peer=1, dir="send")
    b.sync(1, t, None, "recv", peer=2, dir="recv")
    b.sync(2, t, None, "all_reduce")
    b.heartbeats(t, t + 10 * S)
    _, f = run(b, now=t + 10 * S)
    errors = [x for x in f if x.severity == "error"]
    assert [(x.kind, x.culprits) for x in errors] == [("unmatched_p2p", [2])]
    then = errors[0].message.split(". Then: ")[1]
    assert then.split("; ") == ["rank 2 waited in all_reduce #4", "rank 0 blocked in send #1"], then


def test_a_rank_that_destroyed_its_group_early_has_left_it_not_exited():
    """Rank 1 destroys its process group and runs on (its heartbeats go on) while ranks 0
    and 2 wait in the next all_reduce: it "is exited (destroy_process_group)" said a rank
    that was alive (helper-203).  It has left its process group."""
    b = TraceBuilder(3)
    t = b.warmup()
    b.exit(1, t, reason="destroy_process_group")
    for r in (0, 2):
        b.begin(r, t + MS, "all_reduce")
    b.heartbeats(t, t + 10 * S)
    _, f = run(b, hang_after=3.0)
    assert [(x.kind, x.culprits) for x in f if x.severity == "error"] == [("missing_ranks", [1])]
    assert "rank 1 has left its process group (destroy_process_group)" in f[0].message, f[0].message
