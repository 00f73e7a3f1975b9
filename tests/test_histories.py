"""A rank's history of a group's collectives as one digest (``commscope/histories.py``):
the same terms in Python and numpy, a history that restarts after a gap, and the match key
a carry makes from an op's begin event equal to the one the model makes of the same op
read as records (native blocks) or as events (JSON)."""

from __future__ import annotations

import numpy as np
import pytest

from commscope import histories
from commscope.analysis.model import COLL
from commscope.analysis.source import load_trace
from commscope.bench.synthstore import JobShape, write_store
from commscope.store import open_reader


def test_a_term_is_the_same_one_at_a_time_and_in_arrays():
    rng = np.random.default_rng(7)
    seqs = rng.integers(0, 1 << 40, 500)
    hashes = rng.integers(0, 1 << 63, 500, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    got = histories.terms(seqs, hashes)
    assert got.dtype == np.uint64 and int(got.max()) <= histories.MASK
    assert [int(x) for x in got] == [histories.term(int(s), int(h)) for s, h in zip(seqs, hashes, strict=True)]
    assert len(set(got.tolist())) == 500


def test_a_history_adds_the_next_seqs_skips_those_it_holds_and_starts_again_after_a_gap():
    term, extended = histories.term, histories.extended
    h = extended(None, [1, 2, 3, 4, 5], [11] * 5)
    assert h == (1, 5, sum(term(s, 11) for s in range(1, 6)) & histories.MASK)
    assert extended(h, [5, 3], [99, 99]) == h  # (the carried last collective, read again)
    assert extended(h, [], []) == h and extended(None, [], []) is None
    assert extended(h, [6], [11]).digest == (h.digest + term(6, 11)) & histories.MASK
    assert extended(h, [6], [11]) != extended(h, [6], [12])  # what must agree is in it
    assert extended(h, [6, 4, 7], [11, 99, 11]) == extended(h, [6, 7], [11, 11])
    assert extended(h, [8, 9], [11, 11]) == (8, 9, (term(8, 11) + term(9, 11)) & histories.MASK)  # (6, 7 lost)
    assert extended(h, [6, 9, 10], [11, 11, 11]) == extended(None, [9, 10], [11, 11])
    one_by_one = None
    for seq in [1, 2, 2, 3, 5, 4, 6, 9, 10]:
        one_by_one = extended(one_by_one, [seq], [seq * 7])
    assert one_by_one == extended(None, [1, 2, 2, 3, 5, 4, 6, 9, 10], [s * 7 for s in [1, 2, 2, 3, 5, 4, 6, 9, 10]])
    assert histories.History.of_event({"type": "group", **h.fields()}) == h
    assert histories.History.of_event({"type": "group", "dfrom": 5, "dseq": 4, "digest": 1}) is None
    assert histories.History.of_event({"type": "group", "group": "0"}) is None


@pytest.mark.parametrize("json", [False, True])  # native blocks, JSON events
def test_a_carry_keys_each_collective_as_the_model_does(tmp_path, json):
    """Every op of a job (a mismatched collective among them) read as events, as a carry
    replays it, is a collective where the model reading it in columns takes it for one, and
    has the match key the model gives it."""
    store = str(tmp_path / "t")
    write_store(store, JobShape(4, 60, fault="mismatch", json=json))
    model, _, _ = load_trace(store)
    events = [e for e in open_reader(store).read_all() if e["type"] == "op" and e["phase"] == "begin"]
    assert len(events) >= 4 * 60
    for e in events:
        code = model.ranks[e["rank"]].sig[model.op_index(e["rank"], e["id"])]
        kind = histories.kind_of(str(e.get("op")), e.get("dir"), bool(e.get("nested")))
        assert (kind == histories.COLLECTIVE) == bool(model.sig_flags(np.array([code]))[0] & COLL)
        assert histories.match_key_of(e) == model.sigs[int(code)].match_key()
    assert len({histories.match_key_of(e) for e in events}) > 1  # (the mismatch among them)


def test_a_withdrawn_collective_comes_off_the_history_that_ended_with_it():
    term, extended, withdrawn = histories.term, histories.extended, histories.withdrawn
    h = extended(None, [1, 2, 3, 4], [11, 11, 11, 99])  # (4: a refused op's begin, counted)
    assert withdrawn(h, 4, 99) == extended(None, [1, 2, 3], [11] * 3)
    assert withdrawn(h, 4, 99).digest == (h.digest - term(4, 99)) & histories.MASK
    assert withdrawn(h, 2, 11) == h  # (a history that went on past it counted what took the number)
    assert withdrawn(h, 7, 11) == h
    assert withdrawn(extended(None, [5], [99]), 5, 99) is None  # (its only collective)


def test_a_withdrawal_comes_off_the_carry_read_before_the_end_only():
    """Rank 2's refused broadcast took #6 (a carry counted it), then gave it back to the
    all_reduce #6 after it.  The first carry's history loses the broadcast's term; a later
    carry, made after the all_reduce #6 (its history 1 to 6, that all_reduce's term), keeps
    its own: it lost its last term too, and ranks 0-2 disagreed (a collective_mismatch)."""
    from commscope.analysis import TraceModel, diagnose
    from commscope.analysis.synth import S, TraceBuilder

    b = TraceBuilder(3, hang_after=10.0)
    t = b.t0 + S
    for _ in range(5):
        t = b.collective(t) + S
    reduce_key = histories.key_hash(histories.match_key_of(
        next(e for e in b.events if e.get("phase") == "begin" and e["op"] == "all_reduce")))
    i = b.begin(2, t, "broadcast", seq=6, root=99)
    broadcast_key = histories.key_hash(histories.match_key_of(b.events[-1]))
    b.end(2, i, t + 500, exc="RuntimeError: invalid root rank", unissued=True)
    t = b.collective(t + S) + S  # all_reduce #6: the number given back

    def carry(rank: int, keys: list[int]) -> dict:
        h = histories.extended(None, list(range(1, len(keys) + 1)), keys)
        return {"type": "group", "v": 1, "rank": rank, "ts": b.t0, "group": "0", "granks": [0, 1, 2], **h.fields()}

    window = []
    for r in range(3):  # a window from after all_reduce #5 on: each rank's carry, then its events
        mine = [e for e in b.sorted_events() if e["rank"] == r]
        window += [e for e in mine if e["type"] == "meta"]
        window.append(carry(r, [reduce_key] * 5 + ([broadcast_key] if r == 2 else [])))
        window += [e for e in mine if e["type"] == "op" and e["ts"] > b.t0 + 5 * S]
    m = TraceModel()
    m.ingest(window)
    want5 = histories.extended(None, range(1, 6), [reduce_key] * 5)
    assert {r: m.histories["0"][r].history for r in range(3)} == dict.fromkeys(range(3), want5)
    m.ingest([carry(r, [reduce_key] * 6) for r in range(3)])  # (a reader past deleted segments)
    want6 = histories.extended(None, range(1, 7), [reduce_key] * 6)
    assert {r: m.histories["0"][r].history for r in range(3)} == dict.fromkeys(range(3), want6)
    assert [(x.kind, x.culprits) for x in diagnose(m, now=t + S, hang_after=10.0)] == [("op_failed", [2])]
