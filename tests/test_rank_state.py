"""One answer to 'what is rank r doing at t': live, as of a replay cursor, once per diagnose,
and as the console shows it (the published view, the rank table's sort)."""

from __future__ import annotations

import gc
import math
import weakref

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from test_model_batch import polls

from commscope.analysis import TraceModel, diagnose
from commscope.analysis.columns import _DTYPE, BLOCK_COLUMNS, RankTable, RankTrace, RankView
from commscope.analysis.rankstate import rank_state, rank_states, snapshot
from commscope.analysis.synth import TraceBuilder, liveness_trace
from commscope.tui.rank_table import sort_key

S = 10**9
MS = 10**6


def _job():
    b, t, _ = liveness_trace()
    return TraceModel.from_events(b.sorted_events()), t


def test_the_model_the_cursor_and_the_view_agree():
    m, t = _job()
    now = t + 10 * S
    for r in range(4):
        assert m.view(now, rank_states(m, now)).states[r] == rank_state(m, r, now)
    # as of a moment: later events ignored
    assert rank_state(m, 0, t + S // 2, as_of=True).kind == "idle"
    assert rank_state(m, 0, t + 2 * S, as_of=True).text == "in all_reduce #2 (group 0) for 1.0 s"
    assert rank_state(m, 2, t + 2 * S, as_of=True).kind == "idle"  # it exits at t + 3 s
    assert rank_state(m, 2, t + 4 * S, as_of=True).kind == "exited"
    assert rank_state(m, 9, now, as_of=True).kind == "unknown"


def test_diagnose_computes_each_rank_state_once():
    m, t = _job()
    now = t + 10 * S
    diagnose(m, now, 2.0)
    snap = snapshot(m, now)
    assert snapshot(m, now) is snap  # the detectors of one diagnose() share it
    assert snap[3].dead and not snap[0].dead and snap[2].exit is not None and not snap[2].crashed
    assert snap[0].state == rank_state(m, 0, now)
    assert snapshot(m, now + S) is not snap


def test_published_views_keep_their_order_and_their_running_max_only_rises():
    """What a view published holds is never reordered: ``order`` and ``sb`` never change, and
    the running max of a rank in time order (its block's, ``runmax``) only rises in place,
    when an op in flight then completes, so the old view still finds every op it found."""
    b = TraceBuilder(1, meta=False)
    for k in range(50):
        b.sync(0, b.t0 + k * MS, b.t0 + k * MS + MS // 2, "all_reduce")
    b.sync(0, b.t0 + 60 * MS, b.t0 + 70 * MS, "all_reduce")  # in flight when the second view is taken
    for k in range(80, 90):
        b.sync(0, b.t0 + k * MS, b.t0 + k * MS + MS // 2, "all_reduce")
    events = b.sorted_events()
    m = TraceModel.from_events([e for e in events if e["ts"] < b.t0 + 30 * MS])
    m.ranks[0].reserve(256)  # (arrays with room to spare: the ops to come are added in place)
    m.view()
    m.ingest([e for e in events if b.t0 + 30 * MS <= e["ts"] < b.t0 + 65 * MS])
    v = m.view()
    assert v.ranks[0].n == 51 and len(v.ranks[0].open) == 1
    order, sb, pmax = (a.copy() for a in (v.ranks[0].order_, v.ranks[0].sb, v.ranks[0].pmax))
    windows = [(b.t0 + k * MS, b.t0 + (k + 3) * MS) for k in range(0, 70, 5)]
    found = [v.ranks[0].window(t0, t1).tolist() for t0, t1 in windows]
    m.ingest([e for e in events if e["ts"] >= b.t0 + 65 * MS])
    v2 = m.view()
    old = v.ranks[0]
    assert np.array_equal(order, old.order_) and np.array_equal(sb, old.sb)
    assert bool((old.pmax >= pmax).all()) and bool((np.diff(old.pmax) >= 0).all())
    assert int(old.pmax[50]) == b.t0 + 70 * MS  # (the op in flight, complete now)
    assert pmax[:50].tolist() == old.pmax[:50].tolist()
    for (t0, t1), ops in zip(windows, found, strict=True):
        assert set(ops) <= set(old.window(t0, t1).tolist())
    assert v2.ranks[0].n == 61 and not v2.ranks[0].open and not old.pmax.flags.writeable
    assert not old.order_.flags.writeable and not old.sb.flags.writeable and not old.begin.flags.writeable
    assert v2.ranks[0].touched_since(old.version) == b.t0 + 60 * MS  # the op that ended


def test_a_completion_that_grows_after_publishing_reaches_the_running_max():
    """An op complete when a view was published whose completion grows later (a ``done``
    with its device time, after the end): the next view's running max of ends has it."""
    b = TraceBuilder(1, meta=False)
    first = b.sync(0, b.t0, b.t0 + MS, "all_reduce")
    b.sync(0, b.t0 + 2 * MS, None, "all_reduce")
    m = TraceModel.from_events(b.sorted_events())
    m.view()
    m.ingest([{"type": "op", "v": 3, "rank": 0, "ts": b.t0 + 5 * MS, "phase": "done", "id": first,
               "gpu_ns": 4 * MS}])
    rv = m.view().ranks[0]
    assert int(rv.comp[0]) == b.t0 + 5 * MS
    assert rv.pmax.tolist() == np.maximum.accumulate(np.where(rv.comp[:2] > 0, rv.comp[:2], rv.begin[:2])).tolist()


def _fresh(m: TraceModel, r: int):
    """Rank ``r``'s view published afresh (not from the view before it)."""
    rt = m.ranks[r]
    rt._view = None
    return rt.view()


#: What a view reads as, field by field (its columns sliced from its rows)
_READ = ("rank", "version", "n", *RankView.COLUMNS, "order_", "sb", "pmax", "open", "first_ts", "last_ts", "last_hb",
         "meta", "exits", "touched", "touches")


def _copied(v) -> dict:
    """What ``v`` reads as, its arrays copied (a view's columns are the model's: a later
    publish may write them in place)."""
    return {f: x.copy() if isinstance(x := getattr(v, f), np.ndarray) else x for f in _READ}


def _same_view(a, b) -> bool:
    a, b = (x if isinstance(x, dict) else _copied(x) for x in (a, b))
    return all(np.array_equal(a[f], b[f]) if isinstance(a[f], np.ndarray) else a[f] == b[f] for f in _READ)


@pytest.mark.parametrize("whole", [True, False], ids=["model-view", "rank-view"])
def test_a_view_published_again_from_the_same_rows_is_what_publishing_afresh_gives(whole):
    """A rank in time order whose rows did not move or grow (a heartbeat, a sample, an op's
    end or its device time came) is published again from its block's rows, as its last
    view was; every field reads as a view published afresh reads, the completion and
    running max included."""
    b = TraceBuilder(2, meta=False)
    for k in range(20):
        b.sync(0, b.t0 + k * MS, b.t0 + k * MS + MS // 2, "all_reduce")
    b.sync(1, b.t0 + 3 * MS, b.t0 + 4 * MS, "all_reduce")
    first = b.sync(0, b.t0 + 30 * MS, None, "all_reduce")  # in flight
    m = TraceModel.from_events(b.sorted_events())

    def publish(r):
        return m.view().ranks[r] if whole else m.ranks[r].view()

    v0 = publish(0)
    assert v0.n == 21 and v0.open == (20,) and m.ranks[0]._sorted
    steps = [
        [{"type": "heartbeat", "v": 3, "rank": 0, "ts": b.t0 + 40 * MS, "inflight": 1}],
        [{"type": "sample", "v": 3, "rank": 0, "ts": b.t0 + 41 * MS, "cpu": 50.0}],
        [{"type": "op", "v": 3, "rank": 0, "ts": b.t0 + 50 * MS, "phase": "end", "id": first}],
        [{"type": "op", "v": 3, "rank": 0, "ts": b.t0 + 60 * MS, "phase": "done", "id": first, "gpu_ns": MS}],
    ]
    before = v0
    for batch in steps:
        m.ingest(batch)
        v = publish(0)
        assert v.version > before.version and v.rows is before.rows and v.at == before.at  # (the same rows)
        assert np.shares_memory(v.pmax, m.table.frozen(int(m.table.block[m.ranks[0]._s]))["pmax"])  # (raised in place)
        got = _copied(v)
        before = _fresh(m, 0)
        assert _same_view(got, before)
    assert before.open == () and int(before.comp[20]) == b.t0 + 60 * MS and int(before.pmax[20]) == b.t0 + 60 * MS
    assert before.last_hb == b.t0 + 40 * MS
    # grown: published from new slices
    late = TraceBuilder(2, meta=False)
    late.sync(0, b.t0 + 80 * MS, b.t0 + 81 * MS, "all_reduce")
    m.ingest([dict(e, id=1000 + e["id"]) for e in late.sorted_events() if e["type"] == "op"])
    v = publish(0)
    assert v.n == 22 and int(v.begin[21]) == b.t0 + 80 * MS
    assert _same_view(v, _fresh(m, 0))
    # out of time order: its own order, never the slices of a view before
    late = TraceBuilder(2, meta=False)
    late.sync(0, b.t0 + 5 * MS + 1, b.t0 + 5 * MS + 2, "all_reduce")
    m.ingest([dict(e, id=2000 + e["id"]) for e in late.sorted_events() if e["type"] == "op"])
    before = publish(0)
    m.ingest([{"type": "heartbeat", "v": 3, "rank": 0, "ts": b.t0 + 90 * MS, "inflight": 0}])
    v = publish(0)
    assert not m.ranks[0]._sorted and v.n == 23 and _same_view(v, _fresh(m, 0))
    assert v.order_.tolist() == np.argsort(v.begin, kind="stable").tolist()


def test_a_rank_moved_out_of_a_block_leaves_nothing_of_it_held():
    """Ranks moved out of a block that no rank is left in (it is dropped): nothing they
    published from it, nor what they would publish again from, holds its columns."""
    t = RankTable()
    rts = [RankTrace(r, cap=0, table=t) for r in range(2)]
    n = 1 << 12
    cols = {c: np.zeros(n, _DTYPE[c]) for c in BLOCK_COLUMNS if c != "pmax"}
    cols["begin"][:] = np.arange(n)
    cols["comp"][:] = np.arange(n) + 1
    b = t.add_block(cols)
    t.adopt(rts, b, np.array([0, n // 2, n]))
    t.version[:2] = 1
    for rt in rts:
        assert rt.view().n == n // 2 and rt._view.rows is t.frozen(b)
    held = weakref.ref(t.blocks[b]["begin"])
    del cols
    t.relocate(rts, [n, n])
    gc.collect()
    assert t.blocks[b] is None and held() is None
    assert all(rt.view().n == n // 2 for rt in rts)


def test_a_rank_in_time_order_then_out_of_it_keeps_its_order_and_its_views():
    """A rank whose begins came in time order has the shared identity as its order (no
    arrays of its own); a begin out of order sorts it once, and what was published before
    reads as it was."""
    b = TraceBuilder(1, meta=False)
    for k in range(40):
        b.sync(0, b.t0 + k * MS, b.t0 + k * MS + MS // 2, "all_reduce")
    m = TraceModel.from_events(b.sorted_events())
    v = m.view()
    assert v.ranks[0].order_.tolist() == list(range(40)) and not v.ranks[0].order_.flags.writeable
    copies = [a.copy() for a in (v.ranks[0].order_, v.ranks[0].sb, v.ranks[0].pmax)]
    late = TraceBuilder(1, meta=False)
    late.sync(0, b.t0 + 5 * MS + 1, b.t0 + 5 * MS + 2, "all_reduce")  # begun among the first ops
    m.ingest([dict(e, id=1000 + e["id"]) for e in late.sorted_events() if e["type"] == "op"])
    rt = m.ranks[0]
    assert rt.n == 41 and not rt._sorted
    assert rt.order().tolist() == np.argsort(rt.begin[:41], kind="stable").tolist() and rt.order()[6] == 40
    assert [int(i) for i in m.ops_in_window(0, b.t0 + 5 * MS, b.t0 + 5 * MS + 3)] == [5, 40]
    for old, a in zip(copies, (v.ranks[0].order_, v.ranks[0].sb, v.ranks[0].pmax), strict=True):
        assert np.array_equal(old, a)
    # out of order within a batch, after every op before: the order still holds them all
    m = TraceModel.from_events(b.sorted_events())
    m.view()
    late = TraceBuilder(1, meta=False)
    for at in (50, 45):
        late.sync(0, b.t0 + at * MS, b.t0 + at * MS + 1, "all_reduce")
    m.ingest([dict(e, id=1000 + e["id"]) for e in late.events if e["type"] == "op"])
    rt = m.ranks[0]
    assert not rt._sorted and rt.order().tolist() == [*range(40), 41, 40]


def test_rank_table_sort_key_never_raises():
    vals = [3, 2.5, None, "x", (1, -2.0), (0, "a"), float("nan"), -1, {"odd": 1}, (1, None)]
    keys = sorted(vals, key=sort_key)
    assert keys[:3] == [-1, 2.5, 3] and math.isnan(keys[3]) and keys[4] == "x"


def test_ending_in_a_few_words_for_every_way_a_rank_goes():
    """report's end column and the rank table: how a rank ended, never raising, whatever
    its exit says."""
    from commscope.analysis import TraceModel
    from commscope.analysis.rankstate import ending
    from commscope.analysis.synth import T0, S, TraceBuilder

    def end_of(**exit_kw) -> str | None:
        b = TraceBuilder(2)
        t = b.collective(T0 + S, "all_reduce", latency=S // 100)
        b.heartbeats(T0, t + 5 * S, ranks=[1])  # rank 1 goes on after rank 0 is gone
        b.exit(1, t + 5 * S, reason="destroy_process_group")
        b.heartbeats(T0, t + (S if exit_kw else 5 * S), ranks=[0])
        if exit_kw:
            b.exit(0, t + S, **exit_kw)
        m = TraceModel.from_events(b.sorted_events())
        return ending(m, 0, m.end_ns)

    assert end_of(reason="destroy_process_group") == "left its group (destroy_process_group)"  # (it may run on: helper-207)
    assert end_of(reason="uninstrument") == "exited (recording stopped)"
    assert end_of(reason="signal", signal="Segmentation fault") == "crashed (SIGSEGV)"
    assert end_of(reason="exception", exc="RuntimeError: [pair.cc:534] Connection closed by peer") == \
        "crashed (RuntimeError)"
    assert end_of(reason="exception", exc="Traceback (most recent call last):\n  x\nValueError: bad") == \
        "crashed (ValueError)"
    assert end_of(reason="exception", exc="\n") == "crashed (exception)"
    assert end_of(reason="os._exit", code=3) == "killed (os._exit(3))"  # rank 1 went on: not the job stopping
    assert end_of() is None  # still running at the trace's end


def test_a_console_that_diagnosed_judges_no_rank_twice(monkeypatch):
    """The console diagnoses and then publishes every rank's state for the same model
    version at the same ``now`` (the watermark moves only with reads): the states come from
    the snapshot diagnose made (at 16k ranks each judgement was made twice)."""
    from commscope.analysis import rankstate

    m, t = _job()
    now = t + 10 * S
    calls = []
    together: list[dict] = []
    judge, judge_plain = rankstate._present, rankstate._plain_states
    monkeypatch.setattr(rankstate, "_present", lambda *a: calls.append(a[1]) or judge(*a))
    monkeypatch.setattr(rankstate, "_plain_states", lambda *a: together.append(judge_plain(*a)) or together[-1])
    diagnose(m, now=now, hang_after=5.0)
    first = len(calls)
    assert len(together) == 1 and first + len(together[0]) >= len(m.ranks)  # (the plain ranks together)
    states = rank_states(m, now)
    assert len(calls) == first and len(together) == 1  # none judged again
    assert states == {r: rank_state(m, r, now) for r in m.ranks}
    before = len(calls)
    plain = rankstate._plain_states(m, now + S)
    rank_states(m, now + S)  # another moment: judged again, the plain ranks together
    assert plain and len(calls) == before + len(m.ranks) - len(plain)


def _one_by_one(m: TraceModel, now: int) -> dict:
    from commscope.analysis.rankstate import _present

    return {r: _present(m, r, now) for r in m.ranks}


@pytest.mark.parametrize("seed", [1, 2])
def test_ranks_judged_together_are_judged_as_one_by_one(seed):
    """The plain ranks' states judged together (``_plain_states``: blocked, waiting on an
    async op, idle) are what judging each alone gives, on a live job (async ops, device
    times, begins out of order, ends never begun) at several moments; and they are most
    ranks."""
    from test_model_batch import _build, _live_job

    from commscope.analysis.rankstate import _plain_states

    m = _build(_live_job(seed, world=40, polls=60), True)
    for now in (m.end_ns, m.end_ns + S, m.end_ns + 100 * S):
        plain = _plain_states(m, now)
        assert len(plain) > len(m.ranks) // 2 and {k.kind for k in plain.values()} == {"blocked"}
        want = _one_by_one(m, now)
        assert all(plain[r] == want[r] for r in plain)
        assert rank_states(m, now) == want


def test_idle_blocked_and_waiting_ranks_are_judged_together_as_one_by_one():
    """Ranks idle after their last op, blocked in a collective, waiting on an async op; one
    with an async op in flight that it does not wait on and one whose last op began before
    others (judged alone: their last complete op is not the newest they were told of)."""
    from test_model_batch import T, _rows, _static

    from commscope.analysis.rankstate import _plain_states
    from commscope.oprecords import PH_BEGIN, PH_END, PH_WAIT_BEGIN

    statics = [_static("all_reduce"), _static("all_reduce", is_async=True)]
    done = [x for j in range(5) for x in ((PH_BEGIN, T + j * 1000, j + 1, 0, j + 1, -1, 0),
                                          (PH_END, T + j * 1000 + 500, j + 1, -1, -1, -1, 0))]
    extra = {1: [(PH_BEGIN, T + 9000, 6, 0, 6, -1, 0)],
             2: [(PH_BEGIN, T + 9000, 6, 1, 6, -1, 0), (PH_END, T + 9100, 6, -1, -1, -1, 0),
                 (PH_WAIT_BEGIN, T + 9200, 6, -1, -1, -1, 0)],
             3: [(PH_BEGIN, T + 9000, 6, 1, 6, -1, 0), (PH_END, T + 9100, 6, -1, -1, -1, 0)],
             5: [(PH_BEGIN, T + 200, 6, 0, 6, -1, 0), (PH_END, T + 300, 6, -1, -1, -1, 0)]}  # (begun before)
    m = TraceModel()
    m.ingest([], [_rows(r, done + extra.get(r, []), statics) for r in range(6)])
    now = T + 3 * S
    plain = _plain_states(m, now)
    assert sorted(plain) == [0, 1, 2, 4]  # (3 has an op in flight, 5's newest op is not its last)
    assert [plain[r].text.split(" ")[0] for r in (0, 1, 2)] == ["idle", "in", "waiting"]
    assert rank_states(m, now) == _one_by_one(m, now)


def test_ranks_judged_together_read_their_seconds_as_the_float_formats_them():
    """The seconds in a plain rank's text are read off the integer interval for ranks that
    share them (``rankstate._tenths``): an interval exactly halfway between two tenths, a
    nanosecond either side of one, below zero (an op begun after the judging time, which a
    console judging at its watermark sees), and past what the integers are trusted for
    read as ``f"{ns / 1e9:.1f}"`` writes them, blocked and idle, and as each alone."""
    from test_model_batch import T, _rows, _static

    from commscope.analysis.rankstate import _TENTHS_EXACT_NS, _plain_states
    from commscope.oprecords import PH_BEGIN, PH_END

    intervals = [0, 1, 49_999_999, 50_000_000, 50_000_001, 150_000_000, 250_000_000, 1_049_999_999,
                 1_050_000_000, 1_050_000_001, -1, -40_000_000, -50_000_000, -50_000_001, -150_000_000,
                 _TENTHS_EXACT_NS - 50_000_000, _TENTHS_EXACT_NS - 1, _TENTHS_EXACT_NS,
                 _TENTHS_EXACT_NS + 50_000_000, 10**17 + 50_000_000, 10**17 + 50_000_001]
    now = T + 2 * 10**17
    statics = [_static("all_reduce")]
    recs = []
    for r, ns in enumerate(intervals):  # (blocked since its begin)
        recs.append(_rows(r, [(PH_BEGIN, now - ns, 1, 0, 1, -1, 0)], statics))
    for r, ns in enumerate(intervals, len(intervals)):  # (idle since its end)
        recs.append(_rows(r, [(PH_BEGIN, now - ns - 10, 1, 0, 1, -1, 0), (PH_END, now - ns, 1, -1, -1, -1, 0)],
                          statics))
    m = TraceModel()
    m.ingest([], recs)
    plain = _plain_states(m, now)
    assert sorted(plain) == list(range(2 * len(intervals)))
    for r, ns in enumerate(intervals * 2):
        secs = f"{ns / 1e9:.1f}"
        text = plain[r].text
        assert (text.startswith("in ") and text.endswith(f" for {secs} s") if r < len(intervals)
                else text.startswith("idle (last ") and text.endswith(f" {secs} s ago)")), (ns, text)
    assert plain == {r: st for r, st in _one_by_one(m, now).items() if r in plain}
    assert len({st.text for st in plain.values()}) == len({f"{ns / 1e9:.1f}" for ns in intervals}) * 2


@settings(derandomize=True, deadline=None, database=None, max_examples=60, print_blob=False,
          suppress_health_check=list(HealthCheck))
@given(polls())
def test_generated_polls_judge_the_same_together(plan):
    """Generated polls (heartbeats, exits, meta, groups, nested and async ops, a rank twice
    in a batch): every rank's state, with the plain ones judged together, is what judging
    each alone gives; and so are the ranks gone early (``gone_early``)."""
    from test_model_batch import T, _build

    from commscope.analysis.rankstate import gone_early, left_early

    m = _build(plan, True)
    for now in (T, T + 10**6, T + 3 * S, T + 10**12):
        snap_free = _one_by_one(m, now)
        assert rank_states(m, now) == snap_free, now
        assert gone_early(m, list(m.ranks), now) == {r for r in m.ranks if left_early(m, r, now)}


def test_ranks_heard_from_within_their_own_dead_threshold_are_judged_together():
    """A rank last heard from longer ago than the shortest dead threshold (``DEAD_MIN_S``)
    but within its own (``DEAD_INTERVALS`` sample intervals) is judged with the plain ranks:
    a console catching up judges 16k ranks seconds after they were heard from.  One past its
    own threshold is dead, judged alone; every state is what judging each alone gives."""
    from commscope.analysis.rankstate import DEAD_MIN_S, _plain_states

    b = TraceBuilder(4, sample_interval=1.0)  # (dead after 5 s)
    for e in b.events:
        if e["type"] == "meta" and e["rank"] == 3:
            e["sample_interval"] = 0.2  # (dead after DEAD_MIN_S)
    b.heartbeats(b.t0, b.warmup(2) + S)
    m = TraceModel.from_events(b.sorted_events())
    last = max(m.last_seen(r) for r in m.ranks)
    now = last + 3 * S
    assert now - last > DEAD_MIN_S * S
    plain = _plain_states(m, now)
    states = rank_states(m, now)
    assert sorted(plain) == [0, 1, 2] and {states[r].kind for r in (0, 1, 2)} == {"idle"}
    assert states[3].kind == "dead" and states == _one_by_one(m, now)
    later = last + 6 * S
    assert _plain_states(m, later) == {} and {x.kind for x in rank_states(m, later).values()} == {"dead"}


def test_a_sample_interval_past_what_int64_holds_is_judged_as_one_by_one():
    """A meta's sample interval the model took without a reader's checks (``from_events``):
    its rank's dead threshold passes int64, and is compared as a Python int."""
    b = TraceBuilder(2, sample_interval=0.2)
    for e in b.events:
        if e["type"] == "meta" and e["rank"] == 1:
            e["sample_interval"] = 1e10
    t = b.warmup(2)
    b.heartbeats(b.t0, t)
    m = TraceModel.from_events(b.sorted_events())
    now = t + 10 * S
    assert rank_states(m, now) == _one_by_one(m, now) and rank_states(m, now)[1].kind == "idle"


@pytest.mark.parametrize("scenario", ["liveness", "dead_rank", "vanished", "crashed", "crashed_together",
                                      "pg_timeout", "missing_ranks"])
def test_ranks_gone_early_together_are_those_each_alone_reads_so(scenario):
    """``gone_early`` (the ranks a detector skips as no longer waiting, judged together)
    is ``left_early`` asked of each rank: dead, vanished, exited, crashed, killed with the
    job (none gone), at moments before, at and long after the job's end."""
    import evidence_scenarios

    from commscope.analysis.rankstate import gone_early, left_early

    if scenario == "liveness":
        m, _ = _job()
    else:
        m = TraceModel.from_events(getattr(evidence_scenarios, scenario)().sorted_events())
    seen = set()
    for now in (m.start_ns, m.end_ns - S, m.end_ns, m.end_ns + 3 * S, m.end_ns + 100 * S):
        want = {r for r in m.ranks if left_early(m, r, now)}
        assert gone_early(m, list(m.ranks), now) == want, now
        assert gone_early(m, list(m.ranks)[::-2], now) == want & set(list(m.ranks)[::-2])
        seen |= want
    # (a job stopped as a whole: its ranks still wait, however long after)
    assert bool(seen) == (scenario not in ("pg_timeout", "missing_ranks")) and gone_early(m, [], m.end_ns) == set()


def test_dead_vanished_and_exited_ranks_are_judged_alone():
    """A rank silent past its dead threshold, one that exited and one dead in the liveness
    job are never among the plain ranks; their states are ``_present``'s."""
    from commscope.analysis.rankstate import _plain_states

    m, t = _job()
    now = t + 10 * S
    plain = _plain_states(m, now)
    states = rank_states(m, now)
    assert states[3].kind == "dead" and states[2].kind == "exited" and 3 not in plain and 2 not in plain
    assert states == _one_by_one(m, now)


@pytest.mark.parametrize("rank0", ["between_ops", "in_the_async_op", "in_the_next_op"])
def test_a_rank_that_left_through_os_exit_before_the_launcher_stopped_the_other_went_first(rank0):
    """Rank 1 issues an async all_reduce and leaves through ``os._exit(3)``; 20 ms later its
    launcher SIGTERMs rank 0: between ops, inside that all_reduce (rank 1's async one never
    ran with it: a loaded host) or in the next one, which rank 1 never entered.  In each, rank
    1 went first: ``dead_rank`` [1].  The first two read "no findings" (CI's
    ``[spawn-os_exit-mid_run-native]``): nobody waited for rank 1 in an op."""
    ms = 1_000_000
    b = TraceBuilder(2, hang_after=60.0, recorder="native")
    t = b.t0 + ms * 100
    for _ in range(30):
        t = b.collective(t) + ms
    b.heartbeats(b.t0, t)
    i = b.async_op(1, t, None, None, "all_reduce")
    b.exit(1, t + ms // 2, reason="os._exit", code=3, unwaited=[i], unwaited_count=1)
    if rank0 == "in_the_async_op":
        b.sync(0, t, None, "all_reduce")
    elif rank0 == "in_the_next_op":
        b.sync(0, t, t + ms // 5, "all_reduce")
        b.sync(0, t + ms * 3 // 5, None, "all_reduce")
    b.exit(0, t + 20 * ms, reason="signal", signal="Terminated", src="spool")
    errors = [(f.kind, f.culprits) for f in diagnose(TraceModel.from_events(b.sorted_events()), hang_after=60.0)
              if f.severity == "error"]
    assert errors == [("dead_rank", [1])], errors
