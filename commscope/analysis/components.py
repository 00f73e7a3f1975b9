"""Strongly connected components of a wait graph (Tarjan's, iterative): the one walk that
both the root-cause rule (``rootcause._chase``: who a wait ends at) and the p2p deadlocks
(``p2p._components``: who waits for each other) make.  Linear in the edges, and no
recursion: 16k ranks waiting on each other is a deep graph."""

from __future__ import annotations

from collections.abc import Callable, Iterable


def strongly_connected(roots: Iterable[int], successors: Callable[[int], Iterable[int]]) -> list[list[int]]:
    """The components reachable from ``roots`` (walked in their order, each node's
    ``successors`` in theirs), in the order Tarjan's algorithm finishes them: a component
    after every one its nodes lead to.  Each component's nodes in the order they left the
    stack (the one that started it last)."""
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    on_stack: set[int] = set()
    stack: list[int] = []
    out: list[list[int]] = []
    for root in roots:
        if root in index:
            continue
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        work = [(root, iter(successors(root)))]
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(successors(w))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                u = work[-1][0]
                low[u] = min(low[u], low[v])
            if low[v] == index[v]:
                members = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    members.append(w)
                    if w == v:
                        break
                out.append(members)
    return out
