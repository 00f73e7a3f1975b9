"""Typed evidence keeps ``check --json`` as it was: every finding's JSON, key for key and in
the same order, on the scenarios of ``evidence_scenarios`` (golden captured before the change)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from evidence_scenarios import final_findings, findings_json

GOLDEN = json.loads((Path(__file__).parent / "golden" / "evidence.json").read_text())
NOW = findings_json()


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_finding_json_is_byte_identical(name):
    assert NOW[name] == GOLDEN[name]


def test_every_kind_is_covered():
    from commscope.analysis.findings import KINDS

    seen = {f["kind"] for text in GOLDEN.values() for run in json.loads(text) for f in run}
    assert seen == set(KINDS)


def test_each_kind_has_a_typed_record_that_draws_itself():
    """One renderer: check's panel and the detail pane both show ``evidence.render``."""
    import io

    from rich.console import Console

    from commscope.analysis import TraceModel
    from commscope.analysis.evidence import Evidence, RawEvidence
    from commscope.analysis.findings import KINDS
    from commscope.commands.check import render
    from commscope.tui.detail import finding_detail

    seen = set()
    for f in final_findings():
        kind = type(f.evidence)
        assert kind is not RawEvidence and kind.render is not Evidence.render, f.kind
        f.evidence.render(f)  # raises on a bad record (evidence.render would fall back to a plain dump)
        seen.add(f.kind)
        con = Console(width=100, file=io.StringIO(), record=True)
        con.print(finding_detail(f))
        detail = con.export_text()
        con = Console(width=100, file=io.StringIO(), record=True)
        render(TraceModel(), [f], [], 2.0, "x", console=con)
        check = con.export_text()
        for part in f.evidence.render(f):  # the same evidence, word for word, in both
            c = Console(width=100, file=io.StringIO(), record=True)
            c.print(part)
            first = c.export_text().strip().splitlines()[0].strip()
            assert first[:40] in detail and first[:40] in check, (f.kind, first)
    assert seen == set(KINDS)


def test_ranks_with_the_same_stack_share_one_block():
    import io

    from rich.console import Console

    from commscope.analysis.evidence import stacks_block

    def threads(fn: str) -> list[dict]:
        return [{"thread": "MainThread", "frames": [["train.py", 12, fn]], "inside": "all_reduce", "folded": 3}]

    ev = {"stacks": {"3": threads("hold"), "0": threads("step"), "1": threads("step"), "2": threads("log")},
          "stack_info": {"3": {"role": "culprit", "age_s": 0.6, "reason": "request"},
                         "0": {"role": "waiting", "age_s": 0.5, "reason": "request"},
                         "1": {"role": "waiting", "age_s": 0.7, "reason": "request"},
                         "2": {"role": "waiting", "age_s": 0.5, "reason": "request"},
                         "5": {"role": "waiting", "missing": "rank 5 wrote no stack"}}}
    con = Console(file=io.StringIO(), width=100)
    for block in stacks_block(ev):
        con.print(block)
    heads = [ln for ln in con.file.getvalue().splitlines() if ln.startswith("stack of")]
    assert heads == ["stack of rank 3  culprit · 0.6 s ago on request",
                     "stack of ranks 0, 1  waiting · 0.5-0.7 s ago on request",
                     "stack of rank 2  waiting · 0.5 s ago on request",
                     "stack of rank 5  waiting: no stack: rank 5 wrote no stack"]


def test_each_then_clause_names_the_ranks_its_table_lists():
    """A root's 'Then: …' sentence is made from the same facts as the consequences under it:
    an op that failed names the ranks whose op raised (the 'failed on' table), a wait names
    the ranks that waited; never a member that had not even called it."""
    import re

    checked = 0
    for text in NOW.values():
        for run in json.loads(text):
            for f in run:
                cons = f["evidence"].get("consequences") or []
                said = f["message"].split(". Then: ", 1)[1] if ". Then: " in f["message"] else ""
                for c in cons:
                    if c["kind"] == "op_failed" and c.get("failed"):
                        want = sorted(int(r) for r in c["failed"])
                        verb = "failed on"
                    elif c["kind"] == "missing_ranks" and c.get("waited_s"):
                        want = sorted(int(r) for r in c["waited_s"])
                        verb = "waited in"
                    else:
                        continue
                    where = f"{c['op']} #{c['seq']}"
                    clause = next((p for p in said.split("; ") if where in p and verb in p), None)
                    if clause is None:  # more than four consequences: the rest are counted
                        assert " more" in said, (said, c)
                        continue
                    before, after = clause.split(verb)
                    named = sorted(int(x) for x in re.findall(r"\d+", after if verb == "failed on" else before))
                    assert named == want, (clause, c)
                    checked += 1
    assert checked >= 5


def test_a_p2p_ops_detail_names_no_missing_rank_outside_its_two_ends():
    """A recv matched by its send in a 4-rank group: nobody 'not entered'."""
    from rich.console import Console

    from commscope.analysis import TraceModel
    from commscope.analysis.synth import T0, S, TraceBuilder
    from commscope.tui.detail import op_detail

    MS = S // 1000
    b = TraceBuilder(4)
    t = T0 + 10 * MS
    t = b.collective(t, "barrier", latency=MS, shape=())
    b.sync(1, t, t + 2 * MS, "send", peer=2, dir="send", shape=(8,))
    i = b.sync(2, t, t + 2 * MS, "recv", peer=1, dir="recv", shape=(8,))
    m = TraceModel.from_events(b.sorted_events())
    console = Console(width=100, record=True)
    console.print(op_detail(m, 2, m.op_index(2, i), t + 3 * MS))
    out = console.export_text()
    assert "same op on the other ranks" in out and "not entered" not in out


def _drawn(table, width: int) -> str:
    from rich.console import Console

    console = Console(width=width, record=True, color_system=None, file=io.StringIO())
    console.print(table)
    return console.export_text()


def test_per_rank_tables_fit_their_width_without_breaking_a_short_cell():
    from rich.cells import cell_len

    from commscope.analysis.evidence import PerRankTable

    cols = ["rank", "op", "in_shapes", "state", "site"]
    site = "/home/alice/projects/llm/src/llm/parallel/data_parallel.py:412 in sync_gradients"
    rows = [[r, "reduce_scatter_tensor", "[[1024, 1024]]", "blocked 12.3 s", site] for r in range(2)]
    wide = _drawn(PerRankTable("per rank", cols, rows), 200)
    assert len(wide.splitlines()) == 4 and site in wide  # one table: title, header, two rows
    mid = _drawn(PerRankTable("per rank", cols, rows), 72)  # the short ones fit, the site goes beneath
    lines = mid.splitlines()
    assert lines[1].split() == ["rank", "op", "in_shapes", "state"] and "reduce_scatter_tensor" in lines[2]
    assert lines[3].strip().startswith("site /home/alice")
    narrow = _drawn(PerRankTable("per rank", cols, rows), 40)  # not even those: pairs, wrapped at spaces
    assert "op reduce_scatter_tensor" in narrow.replace("\n", " ")
    for text, width in ((wide, 200), (mid, 72), (narrow, 40)):
        assert max(cell_len(x) for x in text.splitlines()) <= width
        assert "reduce_scatter_tensor" in text.split()  # never broken
    short = _drawn(PerRankTable("the peer instead", ["rank", "host", "doing"], [[0, "节点一号", "idle"],
                                                                            [1, "node-1", "idle"]]), 80)
    a, b = short.splitlines()[2:4]
    assert cell_len(a[: a.index("idle")]) == cell_len(b[: b.index("idle")])  # aligned in cells
    assert _drawn(PerRankTable("empty", ["rank", "exception"], []), 40).splitlines()[0] == "empty"


def test_an_op_of_millions_of_tensors_makes_a_finding_of_bounded_size():
    """A rank ran all_gather with 200,000 input tensors where the others ran one: the
    mismatch's message and its per-rank table quoted every shape (an op of 3 million
    tensors, a 12 MB line, made a 30 MB ``check --json`` and a 34 MB console message).
    The evidence quotes the first ``BRIEF_TENSORS`` and says how many in all."""
    from commscope.analysis.diagnose import diagnose
    from commscope.analysis.findings import BRIEF_TENSORS
    from commscope.analysis.model import TraceModel
    from commscope.analysis.synth import TraceBuilder

    tb = TraceBuilder(3, hang_after=10.0)
    t = tb.t0 + 10**9
    for r in range(3):
        many = {"in_shapes": [[1]] * 200_000, "in_dtypes": ["float32"] * 200_000} if r == 1 else {}
        tb.end(r, tb.begin(r, t, "all_gather", **many), t + 1000)
    model = TraceModel()
    model.ingest(tb.sorted_events())
    (f,) = [f for f in diagnose(model, t + 2 * 10**9, 10.0) if f.kind == "collective_mismatch"]
    assert f.culprits == [1] and "the first of 200,000 tensors" in f.message and len(f.message) < 4000
    row = f.evidence.per_rank["1"]
    assert len(row["in_shapes"]) == len(row["in_dtypes"]) == BRIEF_TENSORS and row["in_shapes_total"] == 200_000


def test_a_stack_says_one_folded_frame_as_one():
    """"(1 frames of torch ...)" read badly (helper-191)."""
    from rich.console import Console

    from commscope.analysis.evidence import stack

    console = Console(width=120, file=io.StringIO())
    for folded, said in ((1, "(1 frame of torch"), (3, "(3 frames of torch")):
        console.print(stack([{"name": "MainThread", "frames": [["train.py", 9, "step"]], "inside": "all_reduce",
                              "folded": folded}]))
        assert said in console.file.getvalue()


def test_a_long_consequence_wraps_under_its_message_not_its_kind():
    """At 80 columns a consequence's message went on at column 0, under the kind (helper-191)."""
    from commscope.analysis.evidence import consequences

    message = ("all_reduce #6 (group 0, 4 ranks) failed on ranks 0, 2 after rank 1 died: Connection closed "
               "by peer [127.0.0.1]:4455")
    text = _drawn(consequences({"consequences": [{"kind": "op_failed", "message": message},
                                                 {"kind": "missing_ranks", "message": "[x] short"}]})[1], 80)
    lines = text.rstrip().splitlines()
    assert len(lines) == 3 and lines[0].split()[0] == "op_failed" and lines[2].split() == ["missing_ranks", "[x]",
                                                                                           "short"]
    start = lines[0].index("all_reduce")
    assert lines[1][:start].strip() == "" and lines[1][start:].startswith("rank 1 died")  # under the message
    assert " ".join([*lines[0].split()[1:], *lines[1].split()]) == message


@pytest.mark.parametrize("how", ["killed", "silent"])
def test_a_killed_rank_is_not_said_to_have_been_silent_against_a_threshold(how):
    """A rank whose exit said it left through os._exit(3) read "silent for 0.0 s (threshold
    10.0 s)": no silence was waited for (helper-191)."""
    from rich.console import Console

    from commscope.analysis.findings import Finding
    from commscope.analysis.liveness import Dead

    ev = Dead(how=how, last_seen_ns=0, silent_s=0.0 if how == "killed" else 12.5, threshold_s=10.0,
              sample_interval_s=1.0, activity={"text": "idle"}, cause="left through os._exit(3)")
    f = Finding("dead_rank", None, None, None, [1], [1], "rank 1 was gone", ev)
    console = Console(width=100, file=io.StringIO())
    for r in ev.render(f):
        console.print(r)
    text = console.file.getvalue()
    if how == "killed":
        assert "silent for" not in text and "threshold" not in text and "gone for 0.0 s" in text, text
    else:
        assert "silent for 12.5 s (threshold 10.0 s)" in text, text
