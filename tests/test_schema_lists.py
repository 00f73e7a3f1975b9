"""Many streams' first lines decoded together (``schema.decode_many``, ``decode_indexed``):
a meta's lists of op names and dtype codes are decoded once per distinct list and shared,
and every line decodes, or is counted, exactly as the full decoder has it line by line."""

from __future__ import annotations

from collections import Counter

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from commscope import schema
from commscope.schema import SCHEMA_VERSION, decode_lines

T = 1_700_000_000_000_000_000
NAMES = ["all_reduce", "all_gather", "reduce_scatter", "send", "recv"]
DTYPES = ["Float", "BFloat16", "Long"]


def meta(rank: int, **kw: object) -> bytes:
    ev: dict = {"type": "meta", "ts": T, "v": SCHEMA_VERSION, "rank": rank, "world_size": 4, "names": NAMES,
                "dtypes": DTYPES, "recorder": "native"}
    ev.update(kw)
    return orjson.dumps(ev)


def alone(lines: list[bytes], rank: int | None) -> tuple[list[dict], int, Counter]:
    """Each line through the full decoder on its own (``decode_lines``: what a stream read
    alone gives), joined."""
    events: list[dict] = []
    damaged, invalid = 0, Counter()
    for line in lines:
        got = decode_lines(line, rank)
        events += got.events
        damaged += got.damaged
        invalid.update(got.invalid)
    return events, damaged, invalid


def test_every_rank_s_meta_shares_one_list_of_each_kind_and_decodes_as_alone():
    lines = [meta(rank) for rank in range(4)]
    lines.insert(2, orjson.dumps({"type": "site", "ts": T, "rank": 1, "sid": 3, "text": "train.py:9 in step"}))
    ranks = [0, 1, 1, 2, 3]
    got = schema.decode_many(lines, ranks)
    assert got is not None
    want = [e for line, rank in zip(lines, ranks, strict=True) for e in decode_lines(line, rank).events]
    assert got == want
    metas = [e for e in got if e["type"] == "meta"]
    assert len(metas) == 4 and all(m["names"] is metas[0]["names"] for m in metas)
    assert all(m["dtypes"] is metas[0]["dtypes"] for m in metas)
    assert metas[0]["names"] == NAMES and metas[0]["dtypes"] == DTYPES
    # the same list written with other spacing is equal, and decoded apart
    spaced = meta(5).replace(b'"names":["all_reduce",', b'"names" : [ "all_reduce" ,')
    both = schema.decode_many([meta(4), spaced], [4, 5])
    assert both is not None and both[0]["names"] == both[1]["names"] == NAMES


def test_a_meta_whose_list_is_not_valid_is_counted_as_the_full_decoder_counts_it():
    """A list the full decoder refuses (an element not a string, too many, not a list)
    fails the shared decode too: each line then goes through the full decoder on its own,
    so the event is counted invalid with the full decoder's reason, and the others kept."""
    twice = meta(1).replace(b'"names":', b'"names":[7],"names":', 1)  # (the first value is checked too)
    escaped = meta(1).replace(b'"names":', b'"na\\u006des":[7],"names":', 1)  # (... however it is written)
    bad = [meta(1, names=[*NAMES, 7]), meta(1, dtypes=["x"] * 4097), meta(1, names="all_reduce"),
           meta(1, names={"a": 1}), twice, escaped]
    for line in bad:
        lines = [meta(1), line, meta(1)]
        assert schema.decode_many(lines, [1, 1, 1]) is None  # (each stream then read alone)
        events, at = schema.decode_indexed(lines, 1)
        want_events, want_damaged, want_invalid = alone(lines, 1)
        assert events.events == want_events and at == [0, 2]
        assert events.invalid == want_invalid and sum(want_invalid.values()) == 1
        assert events.damaged == want_damaged == 0


def test_lines_without_a_meta_s_lists_take_the_full_decoder_as_they_are():
    lines = [orjson.dumps({"type": "heartbeat", "ts": T, "rank": 2, "inflight": 0}),
             meta(2, names=None, dtypes=None), meta(2).replace(b'"names"', b'"na\\u006des"'),
             meta(2, argv=["train.py", "names"])]  # (the word as a value: the full decoder)
    got, at = schema.decode_indexed(lines, 2)
    want, damaged, invalid = alone(lines, 2)
    assert got.events == want and at == [0, 1, 2, 3] and not damaged and not invalid
    assert got.events[1]["names"] is None and got.events[2]["names"] == NAMES
    assert got.events[3]["names"] == NAMES and got.events[3]["names"] is not got.events[2]["names"]  # (not shared)


_TEXTS = st.lists(st.text(max_size=6), max_size=6)
_VALUES = st.one_of(st.none(), _TEXTS, st.integers(-2**63, 2**63 - 1), st.text(max_size=4), st.lists(st.integers(-9, 9), max_size=3),
                    st.lists(st.one_of(st.text(max_size=3), st.none()), max_size=3))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, 3), st.one_of(st.just("absent"), _VALUES),
                          st.one_of(st.just("absent"), _VALUES), st.booleans()), min_size=1, max_size=6))
def test_lines_of_any_lists_decode_together_exactly_as_each_alone(drawn):
    """Any mix of metas (lists, nulls, strings, numbers, absent keys) and other events:
    ``decode_indexed`` of them all gives each line's events and counts as the full decoder
    gives line by line, and ``decode_many`` gives them or leaves them to be read alone."""
    lines, ranks = [], []
    for rank, names, codes, other in drawn:
        if other:
            lines.append(orjson.dumps({"type": "heartbeat", "ts": T, "rank": rank, "inflight": 1}))
        else:
            ev: dict = {"type": "meta", "ts": T, "rank": rank}
            if names != "absent":
                ev["names"] = names
            if codes != "absent":
                ev["dtypes"] = codes
            lines.append(orjson.dumps(ev))
        ranks.append(rank)
    for rank in range(4):  # (decode_indexed: one stream's lines)
        mine = [line for line, r in zip(lines, ranks, strict=True) if r == rank]
        if mine:
            got, _ = schema.decode_indexed(mine, rank)
            want, damaged, invalid = alone(mine, rank)
            assert (got.events, got.damaged, got.invalid) == (want, damaged, invalid)
    together = schema.decode_many(lines, ranks)
    want = [e for line, rank in zip(lines, ranks, strict=True) for e in decode_lines(line, rank).events]
    if together is not None:
        assert together == want
    else:  # (a line that is not one valid event: the streams are read alone)
        assert len(want) < len(lines)
