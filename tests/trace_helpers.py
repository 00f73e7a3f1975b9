"""Reading a recorded trace back in tests: events per rank and ops assembled from phases."""

from __future__ import annotations

from collections import defaultdict

from commscope.store import open_reader


def read_events(store) -> list[dict]:
    return open_reader(str(store)).read_all()


def by_rank(events: list[dict]) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = defaultdict(list)
    for e in events:
        out[e["rank"]].append(e)
    return dict(out)


def ops(events: list[dict], rank: int | None = None) -> list[dict]:
    """One dict per op id: the begin fields plus ``phases`` {phase: event}; no ``seq`` where
    its end says the op was never issued (``unissued``: the begin's seq withdrawn)."""
    table: dict[tuple[int, int], dict] = {}
    order = []
    for e in events:
        if e["type"] != "op" or (rank is not None and e["rank"] != rank):
            continue
        key = (e["rank"], e["id"])
        if e["phase"] == "begin":
            table[key] = dict(e, phases={"begin": e})
            order.append(key)
        elif key in table:
            table[key]["phases"][e["phase"]] = e
            if e["phase"] == "end" and e.get("unissued"):
                table[key].pop("seq", None)
    return [table[k] for k in order]


def of_type(events: list[dict], typ: str, rank: int | None = None) -> list[dict]:
    return [e for e in events if e["type"] == typ and (rank is None or e["rank"] == rank)]


def protocol_members(proto: type) -> set[str]:
    """The public members a ``typing.Protocol`` names: methods, properties, attributes."""
    import inspect

    names = {n for n, v in vars(proto).items() if (inspect.isfunction(v) or isinstance(v, property))
             and not n.startswith("_")}
    return names | set(proto.__annotations__)


def missing_members(cls: type, proto: type) -> set[str]:
    """Members of ``proto`` that ``cls`` neither defines nor sets in ``__init__``."""
    import inspect
    import re

    init = inspect.getsource(cls.__init__)
    return {n for n in protocol_members(proto)
            if not hasattr(cls, n) and not re.search(rf"self\.{n}\b\s*[:=]", init)}


def the_hang(out: dict) -> dict | None:
    """The hang's finding in a ``check --json`` report (``hang_until_released``'s: a
    missing_ranks in all_reduce #6), when it is the only error finding but the trace's
    losses.  Not a wait in an earlier collective: on a loaded machine a rank late into one
    by more than its hang_after (1 s) is a hang for that moment, and a poll for this one
    goes on past it."""
    errors = [f for f in out["findings"] if f["severity"] == "error" and f["kind"] != "trace_incomplete"]
    hang = errors[0] if len(errors) == 1 and errors[0]["kind"] == "missing_ranks" else None
    return hang if hang is not None and (hang["seq"], hang["op"]) == (6, "all_reduce") else None


def assert_the_hang_outlived_the_loss(out: dict, group: str) -> dict:
    """A 3-rank job's hang (ranks 0 and 2 in all_reduce #6, which rank 1 never entered),
    checked after the store lost what every rank had written: still that finding, in
    ``group``, no victim blamed, and the loss named on every rank (its trace_incomplete,
    returned)."""
    hang = the_hang(out)
    assert hang is not None, [(f["kind"], f["culprits"], f["message"]) for f in out["findings"]]
    assert (hang["culprits"], hang["seq"], hang["op"], hang["group"]) == ([1], 6, "all_reduce", group)
    assert sorted(hang["ranks"]) == [0, 1, 2]
    for f in out["findings"]:  # no victim blamed
        if f["severity"] == "error" and f["kind"] != "trace_incomplete":
            assert f["culprits"] == [1], f
    lost = [f for f in out["findings"] if f["kind"] == "trace_incomplete"]
    assert lost and sorted(lost[0]["culprits"]) == [0, 1, 2], lost
    return lost[0]
