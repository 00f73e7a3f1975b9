"""A group's members at 16k ranks: a carry (every keyframe's) states them as runs, not a
list of 16k (~90 KB a keyframe a rank, four times the stream at the full rate), and a
reader holds one list of them for every stream that states them alike, not one each (16k
streams x 16k members: ~10 GB in the read processes)."""

from __future__ import annotations

from typing import TypedDict

import msgspec
import orjson
import pytest

from commscope import schema
from commscope.blocks import BlockDecoder, StaticTable
from commscope.schema import SCHEMA_VERSION, decode_lines
from commscope.store import inflight

T = 1_700_000_000_000_000_000
WORLD = 16384


def group(rank: int, **kw: object) -> dict:
    ev: dict = {"type": "group", "ts": T, "v": SCHEMA_VERSION, "rank": rank, "group": "0", "gid": 0,
                "backend": "nccl"}
    ev.update(kw)
    return ev


@pytest.mark.parametrize("members", [list(range(WORLD)), list(range(0, WORLD, 8)), list(range(3, WORLD, 8)),
                                     [*range(0, 4096), *range(8192, 12288)], list(range(WORLD - 1, -1, -1)),
                                     [5, 9, 2, 7, 1, 8, 3, 6, 4, 0], [7] * 2048])
def test_a_group_line_with_its_members_as_runs_reads_as_the_list(members):
    """Written with ``with_runs`` (runs where shorter: a world, a stride, two blocks, the
    world backwards; a list with no runs stays a list), read back as the same ``granks``.  A
    reader from before runs refuses such a line (its members were a list of ranks), counted,
    rather than read a group of no members."""
    written = schema.with_runs(group(3, granks=members))
    line = orjson.dumps(written)
    if len(members) >= 1024 and len(set(members)) > 1:
        assert written["granks"].keys() == {"runs"} and len(line) < 200, line[:300]
    else:  # (too few for runs, none in them, or a member repeated: listed as it came)
        assert written["granks"] == members
    got = decode_lines(line, 3)
    assert not got.invalid and not got.damaged
    assert got.events == [group(3, granks=members)]
    before = msgspec.json.Decoder(TypedDict("Before", {"granks": list[schema.Rank]}, total=False))
    if "runs" in written["granks"]:
        with pytest.raises(msgspec.ValidationError):
            before.decode(line)


def test_the_streams_that_state_the_same_runs_share_one_list_of_members():
    lines = [orjson.dumps(schema.with_runs(group(r, granks=list(range(WORLD))))) for r in range(4)]
    events = [e for r, line in enumerate(lines) for e in decode_lines(line, r).events]
    assert len(events) == 4 and all(e["granks"] is events[0]["granks"] for e in events)


WHY = "group: runs of members out of range, or more than a reader expands"


@pytest.mark.parametrize("runs", [
    [[0, 1, WORLD], [schema.MAX_RANK, 1, 2]],  # past the last rank
    [[5, -1, 7]],  # below rank 0
    [[0, 1, schema.MAX_RUN_MEMBERS], [0, 1, 1]],  # more than a reader expands (nothing of them allocated)
    [[3, 0, 2]],  # one member twice
])
def test_runs_out_of_range_or_past_what_a_reader_expands_are_counted_not_read(runs):
    """Hostile runs: a member past the last rank or below 0, more members than a reader
    expands out of runs (a few bytes naming millions), a member repeated."""
    got = decode_lines(orjson.dumps(group(1, granks={"runs": runs})), 1)
    assert got.events == [] and got.invalid == {WHY: 1}


def test_a_run_the_schema_refuses_is_counted_as_invalid():
    for runs in ([[0, 1, 0]], [[0, 1, schema.MAX_RUN_MEMBERS + 1]], [[0, 1]], "0-7"):  # (no members, too many, ...)
        got = decode_lines(orjson.dumps(group(1, granks={"runs": runs})), 1)
        assert got.events == [] and sum(got.invalid.values()) == 1, runs


def test_a_process_expands_no_more_than_its_budget_of_members_it_did_not_keep(monkeypatch):
    """Distinct runs, each expanded once and kept (every stream stating them alike takes the
    list kept): past ``RUNS_BUDGET`` members expanded in all, runs are refused, counted."""
    monkeypatch.setattr(schema, "_MEMBERS_SEEN", {})
    monkeypatch.setattr(schema, "_members_held", 0)
    monkeypatch.setattr(schema, "_runs_spent", 0)
    monkeypatch.setattr(schema, "RUNS_BUDGET", 3 * 1000)
    lines = [orjson.dumps(group(1, granks={"runs": [[k, 1, 1000]]})) for k in range(4)]
    got = [decode_lines(line, 1) for line in lines]
    assert [len(g.events) for g in got] == [1, 1, 1, 0] and got[3].invalid == {WHY: 1}
    again = decode_lines(lines[0], 1)  # (kept: no members expanded again)
    assert again.events[0]["granks"] is got[0].events[0]["granks"]


def test_members_past_the_most_runs_a_line_states_are_written_as_a_list():
    """280k members in runs of 4 (70k runs: more than a line states): listed, as the
    recorder wrote them, and read back whole."""
    members = [r for k in range(0, 4 * 70_000, 4) for r in (2 * k, 2 * k + 1, 2 * k + 2, 2 * k + 3)]
    written = schema.with_runs(group(2, granks=members))
    assert written["granks"] == members
    assert decode_lines(orjson.dumps(written), 2).events == [group(2, granks=members)]


def test_a_carry_of_a_rank_of_a_16k_world_states_its_members_in_a_few_bytes():
    """What every keyframe of the rank holds: its meta apart, the group's line ~100 bytes (it
    was ~90 KB), and a reader of the carry has the members exactly."""
    meta = {"type": "meta", "ts": T, "v": SCHEMA_VERSION, "rank": 7, "world_size": WORLD, "recorder": "python"}
    lines = orjson.dumps(meta) + b"\n" + orjson.dumps(group(7, granks=list(range(WORLD)))) + b"\n"
    carry = inflight.replay(b"", lines, 7).carry()
    assert len(carry) < 400, carry[:500]
    events = decode_lines(carry, 7).events
    assert [e["granks"] for e in events if e["type"] == "group"] == [list(range(WORLD))]


def test_a_reader_s_decoders_hold_one_list_of_a_group_s_members():
    """Each stream's group line decoded into a list of its own (the line as a recorder
    writes it: a list), learnt by the stream's decoder: the decoders of one reader hold one
    list, and the events they pass on too (pickled once to the console)."""
    table = StaticTable()
    held = []
    for rank in range(8):
        ev = decode_lines(orjson.dumps(group(rank, granks=list(range(4096)))), rank).events[0]
        decoder = BlockDecoder(rank, table)
        decoder.note(ev)
        held.append((decoder.groups[0].granks, ev["granks"]))
    assert all(g is held[0][0] and e is held[0][0] for g, e in held)
    assert held[0][0] == list(range(4096))
    # members that are not ranks are none
    assert table.members([0, "1"]) is None and table.members([0, [1]]) is None and table.members("0") is None
