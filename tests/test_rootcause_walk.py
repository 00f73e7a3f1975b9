"""Rule 2's walk over who waits on whom (``rootcause._chase``): exact on chains and cycles,
linear where following every path was exponential."""

from __future__ import annotations

import random

from commscope.analysis import TraceModel
from commscope.analysis.findings import Finding
from commscope.analysis.rootcause import _chase, resolve
from commscope.analysis.synth import S, TraceBuilder


def _paths(waits_on: dict[int, set[int]], c: int, path: frozenset[int] = frozenset()) -> set[int] | None:
    """The walk as it was: every path from ``c`` (exponential; small graphs only)."""
    if c in path or c not in waits_on:
        return {c}
    if not waits_on[c]:
        return None
    out: set[int] = set()
    for x in waits_on[c]:
        got = _paths(waits_on, x, path | {c})
        if got is None:
            return None
        out |= got
    return out


def _reaches(waits_on: dict[int, set[int]], a: int, b: int) -> bool:
    seen, todo = set(), list(waits_on.get(a, ()))
    while todo:
        x = todo.pop()
        if x == b:
            return True
        if x not in seen:
            seen.add(x)
            todo.extend(waits_on.get(x, ()))
    return False


def test_chains_cycles_and_unknown_blame():
    ends = _chase({0: {1}, 1: {2}, 3: {4}, 4: {3, 5}, 6: {7}, 7: set()})
    assert ends(0) == ends(1) == {2} and ends(2) == {2}  # a chain ends where the last waits on nobody
    assert ends(3) == {3, 5} and ends(4) == {4, 5}  # a cycle: itself, and where it waits outside
    assert ends(6) is None and ends(7) is None  # a blame not known yet, all the way up
    assert ends(99) == {99}


def test_the_same_as_every_path_where_that_is_exact():
    """Where a rank is on no cycle with chords (a chain, a tree, a ring, a pair), the walk
    ends where following every path ended; elsewhere it ends at a subset of that (the
    ranks a path entered a cycle by, not every rank a winding path met)."""
    rng = random.Random(5)
    for _ in range(3000):
        n = rng.randrange(1, 7)
        w = {v: {x for x in range(n + 2) if rng.random() < 0.3} for v in range(n) if rng.random() < 0.7}
        ends = _chase(w)
        for c in range(n + 2):
            old, new = _paths(w, c), ends(c)
            assert (old is None) == (new is None)
            if new is not None:
                assert new <= old
                assert (c in new) == (c not in w or _reaches(w, c, c))  # a rank on a cycle is its own culprit
    ring = {r: {(r + 1) % 5} for r in range(5)}
    assert all(_chase(ring)(r) == _paths(ring, r) == {r} for r in range(5))


def _by_definition(w: dict[int, set[int]], c: int) -> set[int] | None:
    """Rule 2's walk as its docstring defines it, on the components found by reachability
    (small graphs only): a rank outside any cycle ends where the ranks it waits on end; a
    rank in a cycle is its own culprit and ends where the cycle waits outside it; a cycle
    met from outside stops at the rank it is entered by (a shared wait set's node: at its
    ranks in the cycle); a rank that waits on nobody it is known to ends the walk unknown."""
    def comp(v: int) -> frozenset[int]:
        return frozenset({v} | {u for u in w if _reaches(w, v, u) and _reaches(w, u, v)})

    def cyclic(v: int) -> bool:
        return len(comp(v)) > 1 or v in w.get(v, ())

    def outside(k: frozenset[int]) -> set[int] | None:
        out: set[int] = set()
        for v in k:
            if v not in w:
                continue
            if not w[v]:
                return None
            for x in w[v] - k:
                got = entered(x)
                if got is None:
                    return None
                out |= got
        return out

    def entered(x: int) -> set[int] | None:
        if x not in w:
            return {x}
        out = outside(comp(x))
        if out is None or not cyclic(x):
            return out
        return out | ({x} if x >= 0 else {r for r in w[x] if r in comp(x)})

    return entered(c)


def test_the_walk_ends_as_its_definition_says():
    """Random wait graphs with shared wait sets (nodes below 0), ranks no rank waits on,
    ranks waiting on nobody known, self-waits and cycles entered from outside: every
    rank's walk ends where the definition says, whichever ranks are left out of the
    search for cycles (those no rank waits on)."""
    rng = random.Random(11)
    for _ in range(3000):
        n = rng.randrange(1, 9)
        nodes = list(range(n)) + [-1, -2][:rng.randrange(0, 3)]
        w = {v: {x for x in [*range(n + 2), *nodes] if rng.random() < 0.25} for v in nodes if rng.random() < 0.8}
        ends = _chase(w)
        for c in range(n + 2):
            assert ends(c) == _by_definition(w, c), (w, c)
    star = {v: {-1} for v in range(50)} | {-1: set(range(50, 60))}  # (16k ranks waiting on those missing)
    assert all(_chase(star)(v) == set(range(50, 60)) for v in range(50))


def test_thousands_of_ranks_waiting_on_each_other():
    """16k ranks in a chain (no recursion limit) and 300 ranks each waiting on 20 others
    (following every path never returned)."""
    chain = {r: {r + 1} for r in range(16_384)}
    assert _chase(chain)(0) == {16_384}
    rng = random.Random(1)
    dense = {r: set(rng.sample(range(300), 20)) for r in range(300)}
    dense[7].add(1000)
    ends = _chase(dense)
    assert ends(0) >= {0, 1000}


def test_a_wait_set_many_victims_share_is_one_node_and_the_walk_ends_where_the_edges_say(monkeypatch):
    """Victims sharing one large wait set (every rank waiting in a collective thousands never
    entered) wait on one node that waits on its ranks (``rootcause._waits``): wherever a
    walk starts, it ends where the wait graph's own edges end it, through chains, cycles
    entered through the shared set and blames not known yet."""
    from types import SimpleNamespace

    from commscope.analysis import rootcause

    monkeypatch.setattr(rootcause, "SHARED_WAIT", 2)  # (small sets shared: cycles through them)
    rng = random.Random(11)
    shared_nodes = 0
    for _ in range(600):
        n = rng.randrange(2, 40)
        findings = []
        for _ in range(rng.randrange(1, 5)):
            on = tuple(rng.sample(range(n + 3), rng.randrange(0, min(n + 3, 8))))
            victims = rng.sample(range(n), rng.randrange(1, n + 1))
            if rng.random() < 0.7:
                findings.append(SimpleNamespace(victims=dict.fromkeys(victims, on)))  # (one object, shared)
            else:
                findings.append(SimpleNamespace(victims={v: tuple(on) for v in victims}))
        direct: dict[int, set[int]] = {}
        for f in findings:
            for v, on in f.victims.items():
                direct.setdefault(v, set()).update(on)
        graph = rootcause._waits(findings)
        shared_nodes += sum(1 for v in graph if v < 0)
        want, got = _chase(direct), _chase(graph)
        for r in range(n + 3):
            assert got(r) == want(r), (findings, r)
    assert shared_nodes > 300


def test_thousands_waiting_on_thousands_who_never_entered():
    """8k ranks waiting in a collective 8k others never entered: one finding's victims share
    its wait set, and the walk ends at the absentees (64 M edges otherwise)."""
    from types import SimpleNamespace

    from commscope.analysis import rootcause

    missing = tuple(range(8192, 16_384))
    graph = rootcause._waits([SimpleNamespace(victims=dict.fromkeys(range(8192), missing))])
    assert sum(len(on) for on in graph.values()) == 8192 + 8192
    ends = _chase(graph)
    assert ends(0) == ends(8191) == set(missing) and ends(9000) == {9000}


def test_a_crash_whose_wait_has_no_one_to_blame_still_names_its_rank():
    """(Found by hypothesis in tests/test_model_batch.py: a rank streamed twice, its op
    failed on a closed connection with every other member still there, then it crashed.)
    The failure blames nobody and holds the rank as a victim whose blame is not known; the
    crash shares no instance with it.  Rule 2 renamed the crash's culprits to the roots it
    waits on, none, and the diagnosis failed on a departure naming no rank (IndexError).
    A departure always names its own rank."""
    b = TraceBuilder(4)
    t = b.t0 + S // 10
    b.heartbeats(b.t0, t + 5 * S)
    model = TraceModel.from_events(b.sorted_events())
    failed = Finding("op_failed", "0", None, "all_reduce", [3], [], "all_reduce failed on rank 3; no rank to blame",
                     {}, ts=t, victims={3: ()}, instances=(("op", 3, 99),))
    crashed = Finding("rank_crashed", "0", None, "all_reduce", [3], [3], "rank 3 crashed: ValueError: boom",
                      {}, ts=t + 1000)
    got = resolve(model, [failed, crashed], t + 5 * S, {})
    assert sorted((f.kind, f.culprits) for f in got) == [("op_failed", []), ("rank_crashed", [3])]
