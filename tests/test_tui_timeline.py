"""Timeline painting on synthetic models: categories per cell, labels, selection, collapse."""

from __future__ import annotations

import numpy as np
import pytest
from tui_scenarios import MS, StaticReader, drive, healthy, hung_missing_rank, make_app

from commscope.analysis.synth import T0, TraceBuilder
from commscope.tui import palette as P
from commscope.tui.feed import Feed
from commscope.tui.painter import GUTTER, Row, paint_group, paint_rank, render_row
from commscope.tui.timeline import MAX_NPC, Timeline


def timeline_for(events, now, *, t0=T0, npc=MS) -> Timeline:
    feed = Feed(StaticReader(events), clock=lambda: now)
    feed.step()
    tl = Timeline(feed)
    tl.t0, tl.npc, tl.now_ns, tl.follow = t0, npc, now, False
    tl.hang_after_ns = 2_000 * MS
    return tl


def cells_of(tl: Timeline, rank: int, w: int = 100) -> np.ndarray:
    return paint_rank(tl.model, rank, tl.window(w))[0]


def test_each_kind_of_traffic_gets_its_own_category():
    b = TraceBuilder(2)
    b.sync(0, T0 + 10 * MS, T0 + 20 * MS, "all_reduce")
    b.sync(0, T0 + 30 * MS, T0 + 40 * MS, "send", peer=1, dir="send")
    b.async_op(0, T0 + 50 * MS, T0 + 70 * MS, T0 + 80 * MS, "all_reduce")
    outer = b.begin(0, T0 + 85 * MS, "all_gather_v")
    inner = b.begin(0, T0 + 86 * MS, "all_gather_into_tensor", nested=True, parent=outer)
    b.end(0, inner, T0 + 88 * MS)
    b.end(0, outer, T0 + 90 * MS)
    tl = timeline_for(b.sorted_events(), T0 + 100 * MS)
    c = cells_of(tl, 0)
    assert (c[10:21] == P.COLL).all() and c[9] == P.IDLE and c[21] == P.IDLE
    assert (c[30:41] == P.P2P).all()
    assert c[50] == P.COLL  # the issue
    assert (c[51:70] == P.PENDING).all()  # running in the background
    assert (c[70:81] == P.WAIT).all()  # inside wait()
    assert (c[85:91] == P.VARLEN).all()  # the nested all_gather_into_tensor is drawn as its outer op


def test_in_flight_ops_turn_to_warning_then_error_past_hang_after():
    b = TraceBuilder(1)
    b.sync(0, T0, None, "all_reduce")
    tl = timeline_for(b.sorted_events(), T0 + 3_000 * MS, npc=100 * MS)
    c = cells_of(tl, 0, 40)
    # hang_after 2 s: warning from 2/3 s, error from 2 s, growing until now (3 s)
    assert (c[0:6] == P.COLL).all()
    assert (c[7:19] == P.WARN).all()
    assert (c[20:31] == P.ERROR).all() and (c[31:] == P.IDLE).all()


def test_selection_and_labels_on_wide_spans():
    b = TraceBuilder(1)
    i = b.sync(0, T0 + 10 * MS, T0 + 60 * MS, "broadcast")
    b.sync(0, T0 + 70 * MS, T0 + 72 * MS, "all_reduce")
    tl = timeline_for(b.sorted_events(), T0 + 100 * MS)
    cells, labels = paint_rank(tl.model, 0, tl.window(100))
    assert [(a, text) for a, _, text, _ in labels] == [(11, "broadcast #1")]
    tl.sel = (0, tl.feed.model.op_index(0, i))
    cells, _ = paint_rank(tl.model, 0, tl.window(100))
    assert (cells[10:61] == P.SELECTED).all() and cells[71] == P.COLL
    strip = render_row(tl.model, Row("r0", "r0", (0,)), tl.window(120 - GUTTER))
    assert "broadcast #1" in strip.text and strip.cell_length == 120


def test_the_replay_cursor_is_not_drawn_over_a_row_s_note():
    """A collapsed row's note ("4,088 ranks (0-2047,...") is written over the start of its
    time: the cursor's line crossed its words ("4│088 ranks", helper-188).  Over the note
    it is not drawn; past it, it is."""
    b = TraceBuilder(4)
    b.sync(0, T0 + 10 * MS, T0 + 60 * MS, "broadcast")
    tl = timeline_for(b.sorted_events(), T0 + 100 * MS)
    row = Row("g", "×4", (0, 1, 2, 3), note="4,088 ranks (0-2047,2049-4095): in all_reduce #4")
    for at in (3, 20, 50, 90):
        win = tl.window(100)._replace(cursor_ns=T0 + at * MS)
        text = render_row(tl.model, row, win).text
        assert f" {row.note} " in text, (at, text)
        assert ("│" in text[GUTTER:]) == (at >= len(row.note) + 2), (at, text)


@pytest.mark.parametrize("width", [80, 120, 200])
def test_the_legend_shows_whole_items_those_saying_most_first(width):
    """At 80 columns the legend was cut, its last items "slow" and "past hang_after" gone
    ("██ slow   ██ ", helper-188): whole items only, the ones a hang needs first."""
    from commscope.tui import palette

    b = TraceBuilder(1)
    b.sync(0, T0 + 10 * MS, T0 + 20 * MS, "all_reduce")
    tl = timeline_for(b.sorted_events(), T0 + 100 * MS)
    text = tl._legend(width).text
    assert len(text) == width
    names = [name for _, name in palette.LEGEND if f" {name}   " in text or text.rstrip().endswith(f" {name}")]
    assert {"past hang_after", "slow", "collective", "p2p"} <= set(names), text
    if width >= 200:
        assert len(names) == len(palette.LEGEND), text


def test_replay_cursor_hides_the_future():
    b = TraceBuilder(1)
    b.sync(0, T0 + 10 * MS, T0 + 20 * MS, "all_reduce")
    b.sync(0, T0 + 40 * MS, T0 + 60 * MS, "all_reduce")
    tl = timeline_for(b.sorted_events(), T0 + 100 * MS)
    tl.cursor_ns = T0 + 50 * MS
    c = cells_of(tl, 0)
    assert (c[10:21] == P.COLL).all()
    assert (c[40:51] == P.COLL).all() and (c[52:] == P.IDLE).all()  # running at the cursor, no further
    tl.cursor_ns = T0 + 30 * MS
    assert (cells_of(tl, 0)[35:] == P.IDLE).all()


def test_collapsed_rows_shade_by_how_many_ranks_are_busy():
    events, now = hung_missing_rank()
    tl = timeline_for(events, now, t0=now - 1000 * MS, npc=10 * MS)
    tl.mode = "nodes"  # all four ranks run on host "h"
    tl.rebuild_rows()
    assert len(tl.rows) == 1 and tl.rows[0].ranks == (0, 1, 2, 3)
    segs = paint_group(tl.model, (0, 1, 2, 3), tl.window(100))
    text = "".join(s.text for s in segs)
    assert set(text) == {P.SHADES[4]}  # everyone is stuck in something: fully shaded
    assert any(s.style == P.STYLE[P.ERROR] for s in segs)


def test_many_ranks_collapse_into_at_most_32_block_rows():
    b = TraceBuilder(1024, meta=False)
    b.collective(T0, latency=10 * MS, ranks=list(range(0, 1024, 2)))  # only even ranks
    tl = timeline_for(b.sorted_events(), T0 + 20 * MS)
    tl.mode = "blocks"
    tl.rebuild_rows()
    assert len(tl.rows) == 32 and tl.rows[0].label == "r0-30" and tl.rows[0].ranks[-1] == 30
    text = "".join(s.text for s in paint_group(tl.model, tl.rows[0].ranks, tl.window(100)))
    assert text[0:10] == P.SHADES[4] * 10  # every rank present in row 0 is busy (odd ones sent nothing)
    assert text[12:] == " " * 88


def test_findings_filter_keeps_only_flagged_ranks():
    events, now = healthy(2)
    tl = timeline_for(events, now)
    tl.rebuild_rows()
    assert [r.key for r in tl.rows] == ["r0", "r1", "r2", "r3"]
    tl.set_flagged({2})
    tl.only_findings = True
    tl.rebuild_rows()
    assert [r.key for r in tl.rows] == ["r2"]


def test_cover_matches_integer_reference():
    """_cover's float cell arithmetic gives what floor division gives, at real timestamps."""
    import numpy as np

    from commscope.tui.painter import N_CATEGORIES, _cover

    def reference(a, b, cat, t0, npc, w):
        c0, c1 = (a - t0) // npc, (b - t0) // npc
        cells = np.zeros(w, np.int8)
        for x0, x1, c in zip(c0.tolist(), c1.tolist(), cat.tolist(), strict=True):
            if x1 < 0 or x0 >= w:
                continue
            seg = cells[max(x0, 0):min(x1, w - 1) + 1]
            np.maximum(seg, c, out=seg)
        return cells

    rng = np.random.default_rng(7)
    t0 = 1_795_354_608_500_000_000
    for _ in range(2000):
        n, w = int(rng.integers(1, 40)), int(rng.integers(5, 60))
        npc = int(rng.choice([100, 137, 10**3, 999_983, 10**9, 3600 * 10**9]))
        a = t0 + rng.integers(-5 * npc, (w + 5) * npc, n)
        b = a + rng.integers(-3 * npc if n % 3 == 0 else 0, 12 * npc, n)  # (some end before they begin)
        cat = rng.integers(0, N_CATEGORIES, n).astype(np.int8)
        assert np.array_equal(_cover(a, b, cat, t0, npc, w), reference(a, b, cat, t0, npc, w))


def test_overview_path_draws_what_the_detailed_path_draws():
    """Far zoomed out the timeline takes a cheaper path; the picture is the same."""
    from commscope.analysis.synth import healthy_trace

    events = healthy_trace(4, 3000)
    end = max(e["ts"] for e in events)
    tl = timeline_for(events, end)
    m = tl.model
    start, end = m.bounds()
    w = 120
    taken = 0
    for cursor in (None, (start + end) // 2):
        tl.cursor_ns = cursor
        for frac, off in ((1.0, 0.0), (0.6, 0.3), (0.5, 0.45)):
            tl.npc = max(1, int((end - start) * frac) // w)
            tl.t0 = start + int((end - start) * off)
            for r in m.rank_ids():
                first = m.ranks[r].window(tl.t0, tl.t0 + w * tl.npc)
                if first.shape[0] <= 4 * w:  # the replay cursor hides the rest: detailed path
                    continue
                tl.sel = (r, int(first[first.shape[0] // 2]))
                fast = paint_rank(m, r, tl.window(w))
                slow = paint_rank(m, r, tl.window(w)._replace(overview=False))
                assert np.array_equal(fast[0], slow[0]) and fast[1] == slow[1]
                direct = paint_rank(tl.feed.model, r, tl.window(w))  # the model itself paints the same
                assert np.array_equal(fast[0], direct[0]) and fast[1] == direct[1]
                taken += 1
    assert taken >= 12


def test_repainting_what_changed_draws_what_a_full_paint_draws():
    """A row repainted after each batch from only the ops changed since (and those in
    flight) equals the row painted from scratch: cells and labels, live and with a selection."""
    from commscope.analysis import TraceModel
    from commscope.analysis.synth import healthy_trace
    from commscope.tui.painter import Window, repaint_rank, repaint_ranks

    events = sorted(healthy_trace(2, 2500), key=lambda e: e["ts"])
    start, end = events[0]["ts"], events[-1]["ts"]
    m = TraceModel()
    painted: dict = {}
    partial = 0
    modes: set = set()
    labelled = 0
    batched = 0
    for k in range(0, len(events), 613):  # batches cut through ops: some are in flight at each view
        m.ingest(events[k:k + 613])
        v = m.view()
        before = dict(painted)
        for r in v.rank_ids():
            for span, sel, mid, fast in ((end - start, None, 0.5, True), ((end - start) // 3, (r, 1500), 0.5, True),
                                         ((end - start) // 8, None, 0.3, True), ((end - start) // 8, None, 0.6, False),
                                         ((end - start) // 40, (r, 2000), 0.7, True),
                                         ((end - start) // 400, None, 0.8, True)):
                # whole trace, a third, an eighth (detailed, then overview once filled; and the
                # detailed path's own overview), a fortieth (detailed throughout), a 400th (labels)
                win = Window(start + int((end - start) * mid) - span // 2, max(1, span // 120), 120, v.end_ns,
                             hang_after_ns=50 * MS, sel=sel, overview=fast)
                key = (r, span, mid, fast)
                prev = painted.get(key)
                p = repaint_rank(v, r, win, prev)
                painted[key] = p
                cells, labels = paint_rank(v, r, win)
                assert np.array_equal(p.cells, cells) and p.labels == labels
                partial += prev is not None and prev.version != p.version
                modes.add((key, p.overview))
                labelled += bool(labels)
        # the console repaints a frame's rows together: the same rows
        for span, sel, mid, fast in ((end - start, None, 0.5, True), ((end - start) // 8, None, 0.3, True),
                                     ((end - start) // 8, None, 0.6, False), ((end - start) // 40, (1, 2000), 0.7, True)):
            win = Window(start + int((end - start) * mid) - span // 2, max(1, span // 120), 120, v.end_ns,
                         hang_after_ns=50 * MS, sel=sel, overview=fast)
            ranks = v.rank_ids()
            together = repaint_ranks(v, [(r, before.get((r, span, mid, fast)), None) for r in ranks], win)
            for r, p in zip(ranks, together, strict=True):
                assert np.array_equal(p.cells, painted[(r, span, mid, fast)].cells)
                assert p.labels == painted[(r, span, mid, fast)].labels and p.count == painted[(r, span, mid, fast)].count
                batched += 1
    assert batched >= 40
    assert partial >= 40 and labelled >= 4 and {k for k, ov in modes if ov} & {k for k, ov in modes if not ov}  # some switched


def test_repainting_a_stuck_rank_follows_the_clock():
    """No new events, the clock moves: the op in flight grows, past the hang thresholds."""
    from commscope.analysis import TraceModel
    from commscope.tui.painter import Window, repaint_rank

    b = TraceBuilder(1)
    for k in range(600):
        b.sync(0, T0 + k * MS, T0 + k * MS + MS // 2, "all_reduce")
    b.sync(0, T0 + 600 * MS, None, "all_reduce")
    v = TraceModel.from_events(b.sorted_events()).view()
    prev = None
    for now in (T0 + 601 * MS, T0 + 900 * MS, T0 + 1500 * MS):
        win = Window(T0, 10 * MS, 150, now, hang_after_ns=300 * MS)
        prev = repaint_rank(v, 0, win, prev)
        assert prev.overview
        cells, labels = paint_rank(v, 0, win)
        assert np.array_equal(prev.cells, cells) and prev.labels == labels
    assert (prev.cells[70:150] >= P.WARN).all() and (prev.cells[90:150] == P.ERROR).all()
    prev = None
    for now in (T0 + 601 * MS, T0 + 900 * MS, T0 + 1500 * MS):  # below hang_after: one span, labelled
        win = Window(T0, 10 * MS, 150, now, hang_after_ns=10_000 * MS)
        prev = repaint_rank(v, 0, win, prev)
        cells, labels = paint_rank(v, 0, win)
        assert np.array_equal(prev.cells, cells) and prev.labels == labels
    assert prev.labels == [(61, 15, "all_reduce #601", P.COLL)]


def test_span_index_draws_what_the_ops_draw():
    """The overview painted from the span index equals the one painted from the ops:
    cells, labels and op count, over views published while the trace arrives (ops in
    flight, async waits landing later), windows cutting through ops, the replay cursor
    anywhere, a selection, a rank stuck from the start, and an index brought up to date
    view after view (as the console keeps it) as well as built afresh.  The windows ask
    for the index whatever the number of ops in them (``Window.index_min_ops``), and every
    overview must be painted from it."""
    from commscope.analysis import TraceModel
    from commscope.analysis.synth import healthy_trace
    from commscope.tui.paintcode import categories
    from commscope.tui.painter import Window, repaint_rank
    from commscope.tui.spanindex import SpanIndex

    indexed = compared = 0

    class Counting(SpanIndex):
        """A span index counting the rows painted from it (its ``cells`` draws them)."""

        def cells(self, *args, **kwargs):
            nonlocal indexed
            indexed += 1
            return super().cells(*args, **kwargs)

    b = TraceBuilder(3)
    rng = np.random.default_rng(7)
    b.sync(0, T0, None, "all_reduce")  # in flight from the start: never touched again
    for k in range(600):
        b.sync(0, T0 + 10 * MS + k * 3 * MS, T0 + 11 * MS + k * 3 * MS, "all_reduce")
    for r in (1, 2):  # bursts of tiny ops, then sparse ones of every length, async work waited late
        t = T0 + 10 * MS
        for k in range(1400):
            if k % 200 < 150:
                t += int(rng.integers(1, 20_000))
                b.sync(r, t, t + int(rng.integers(0, 10_000)), "all_reduce")
                continue
            t += int(rng.integers(1, 80 * MS))
            d = int(rng.integers(0, 200 * MS))
            if k % 3 == 0:
                wait = t + int(rng.integers(0, 300 * MS))
                b.async_op(r, t, wait, wait + d if k != 1393 else None, "all_gather", peer=None)
            else:
                b.sync(r, t, t + d if k != 1390 else None, "broadcast" if k % 2 else "send",
                       **({"peer": 1 - r % 2, "dir": "send"} if not k % 2 else {}))
    events = healthy_trace(2, 2500) + [{**e, "rank": e["rank"] + 2} for e in b.sorted_events() if "rank" in e]  # ranks 2-4
    grid = TraceBuilder(1)  # rank 5: spans ending exactly on a cell's first ns (npc = 1 ms)
    for g in range(60):
        at = T0 + 3 * g * MS
        for j in range(14):
            grid.sync(0, at + j * 50_000, at + j * 50_000, "all_reduce")
        grid.sync(0, at + 800_000, at + MS, "all_reduce")
    events += [{**e, "rank": 5} for e in grid.sorted_events() if "rank" in e]
    events.sort(key=lambda e: e["ts"])
    start, end = events[0]["ts"], events[-1]["ts"]
    span = end - start
    m = TraceModel()
    kept: dict[int, SpanIndex] = {}
    per_rank: dict[int, int] = {}
    for k in range(0, len(events), 2311):
        m.ingest(events[k:k + 2311])
        v = m.view()
        cats = categories(v.sigs)
        for r in v.rank_ids():
            rv = v.ranks[r]
            sel = (r, int(rv.order_[rv.n // 2])) if rv.n else None
            # windows starting exactly where an op ends, and where a zero-length op is
            # (the window takes neither: the index must not draw them at cell 0)
            comp = rv.comp[: rv.n]
            done = np.flatnonzero(comp > 0)
            zero = np.flatnonzero((comp > 0) & (comp == rv.begin[: rv.n]))
            edges = [int(comp[i]) for i in done[len(done) // 3:: max(1, len(done) // 4)][:3]]
            edges += [int(comp[i]) for i in zero[len(zero) // 2:][:2]]
            for frac, off, cursor in ((1.0, -0.01, None), (0.5, 0.3, None), (0.35, 0.51, None),
                                      (1.0, 0.0, 0.5), (0.4, 0.4, 0.55), (0.7, 0.2, 0.33), (1.0, 0.0, 0.02),
                                      *((0.4, t, None) for t in edges), *((0.3, t, 0.8) for t in edges),
                                      (MS, T0, None)):
                w = 97
                npc = frac if isinstance(frac, int) else max(1, int(span * frac) // w)
                t0 = off if isinstance(off, int) else start + int(span * off)
                now = v.end_ns if cursor is None else start + int(span * cursor)
                for s in (None, sel):
                    win = Window(t0, npc, w, now, now if cursor is not None else None, 40 * MS, s, True,
                                 index_min_ops=0)
                    ref = repaint_rank(v, r, win, None, cats)  # (no span index: from the ops)
                    got = repaint_rank(v, r, win, None, cats, kept.setdefault(r, Counting()))
                    fresh = repaint_rank(v, r, win, None, cats, Counting())
                    for out in (got, fresh):
                        assert np.array_equal(out.cells, ref.cells), (r, frac, off, cursor, s)
                        assert (out.cands, out.overview, out.count) == (ref.cands, ref.overview, ref.count), \
                            (r, frac, off, cursor, s)
                    compared += ref.overview
                    per_rank[r] = per_rank.get(r, 0) + ref.overview
    # every rank drawn as an overview, each time painted from the index twice
    assert min(per_rank.values()) >= 2 and len(per_rank) == 6 and indexed == 2 * compared


def test_rows_painted_together_are_the_rows_painted_one_by_one():
    """The console paints every row a frame needs in one pass (``_paint_rows``): each row
    equals that row painted alone, detailed and overview rows mixed, whole rows and the
    parts repainted after a batch, with the replay cursor and a selection."""
    from commscope.analysis import TraceModel
    from commscope.analysis.synth import healthy_trace
    from commscope.tui.paintcode import categories
    from commscope.tui.painter import Job, Window, _paint, _paint_rows

    b = TraceBuilder(2)
    b.sync(0, T0, None, "all_reduce")  # stuck from the start
    for k in range(300):
        b.async_op(1, T0 + k * MS, T0 + k * MS + MS // 2, T0 + k * MS + 3 * MS // 4 if k != 299 else None, "all_gather")
    events = healthy_trace(3, 1500) + [{**e, "rank": e["rank"] + 3} for e in b.sorted_events() if "rank" in e]
    events.sort(key=lambda e: e["ts"])
    start, end = events[0]["ts"], events[-1]["ts"]
    span = end - start
    m = TraceModel()
    checked = modes = 0
    for k in range(0, len(events), 3001):
        before = m.view()
        m.ingest(events[k:k + 3001])
        v = m.view()
        cats = categories(v.sigs)
        ranks = v.rank_ids()
        for frac, off, cursor in ((1.0, 0.0, None), (0.2, 0.4, None), (0.03, 0.5, None), (0.5, 0.1, 0.3),
                                  (0.05, 0.28, 0.3)):
            npc = max(1, int(span * frac) // 90)
            t0 = start + int(span * off)
            now = v.end_ns if cursor is None else start + int(span * cursor)
            for sel in (None, (ranks[-1], v.ranks[ranks[-1]].n // 2)):
                win = Window(t0, npc, 90, now, None if cursor is None else now, 20 * MS, sel, True)
                jobs = [Job(r) for r in ranks]
                if before.ranks:  # the parts changed by the batch, as a repaint asks for them
                    jobs += [Job(r, t0 + (90 - 1 - r * 7) * npc, (300, before.ranks[r].n if r in before.ranks else 0))
                             for r in ranks]
                together = _paint_rows(v, win, jobs, cats)
                for job, got in zip(jobs, together, strict=True):
                    alone = _paint(v, job.rank, win, cats, job.from_t, job.base)
                    if got[2]:  # overview rows: the single-row path takes its own (equivalent) drawing
                        modes += 1
                    assert np.array_equal(got[0], alone[0]) and got[1:] == alone[1:], (job, frac, off, cursor, sel)
                    checked += 1
    assert checked >= 200 and modes >= 20


def _levels_rank_by_rank(m, ranks, win, cats, spans=None):
    """A collapsed row's levels as each rank's own row paints it (what ``group_levels`` did
    before ``levels_of``): the reference."""
    w = win.width
    busy, worst = np.zeros(w, np.int64), np.zeros(w, np.int8)
    for r in ranks:
        cells = paint_rank(m, r, win, cats, None if spans is None else spans[r])[0]
        busy += cells >= P.COLL
        np.maximum(worst, np.where(cells >= P.WARN, cells, 0), out=worst)
    level = np.where(busy > 0, np.maximum(1, np.round(busy / max(1, len(ranks)) * 4)), 0).astype(np.int8)
    return level, worst


def _collapsed_trace(stuck: bool = True) -> tuple[list[dict], list[dict]]:
    """Events of 8 ranks for the collapsed rows' tests, by time: ops in flight, async work
    waited late, inner traffic, zero-length ops, an op ending before it begins, approximate
    ends; and the ops of rank 1 that arrive after the rest (one begun among its first ones:
    the rank is then out of time order).  ``stuck``: rank 3's first op and rank 7's one op
    in flight to the end (else they end)."""
    from commscope.analysis.synth import healthy_trace

    rng = np.random.default_rng(11)
    b = TraceBuilder(5)
    b.sync(0, T0, None if stuck else T0 + MS, "all_reduce")  # in flight from the start
    for k in range(400):
        b.sync(0, T0 + 10 * MS + k * 3 * MS, T0 + 11 * MS + k * 3 * MS, "all_reduce")
    for r in (1, 2):
        t = T0 + 10 * MS
        for k in range(700):
            t += int(rng.integers(1, 40 * MS))
            d = int(rng.integers(0, 100 * MS))
            if k % 3 == 0:
                wait = t + int(rng.integers(-5 * MS, 150 * MS))  # (a wait begun before the issue ended, at times)
                b.async_op(r, t, wait, wait + d if k != 697 else None, "all_gather", peer=None)
            elif k % 7 == 0:
                outer = b.begin(r, t, "all_gather_v")
                inner = b.begin(r, t + 1, "all_gather_into_tensor", nested=True, parent=outer)
                b.end(r, inner, t + d // 2 + 1)
                b.end(r, outer, t + d + 2)
            else:
                b.sync(r, t, t + d if k != 690 else None, "broadcast" if k % 2 else "send",
                       **({"peer": 1 - r % 2, "dir": "send"} if not k % 2 else {}))
    for k in range(300):  # rank 3: zero-length ops, and one ending before it begins
        b.sync(3, T0 + k * 7 * MS, T0 + k * 7 * MS + (0 if k % 5 else 2 * MS), "all_reduce")
    b.sync(3, T0 + 2200 * MS, T0 + 2100 * MS, "all_reduce")
    for k in range(40):  # ... and ends only approximately known (Flight Recorder on Gloo)
        i = b.begin(3, T0 + 2300 * MS + k * 20 * MS, "all_reduce")
        b.add(3, T0 + 2300 * MS + k * 20 * MS + 15 * MS, "op", phase="end", id=i, approx=True)
    b.sync(4, T0 + 1500 * MS, None if stuck else T0 + 1501 * MS, "all_reduce")  # its one op, in flight
    events = healthy_trace(3, 1200) + [{**e, "rank": e["rank"] + 3} for e in b.sorted_events() if "rank" in e]
    events.sort(key=lambda e: e["ts"])
    late = TraceBuilder(1, meta=False)  # rank 1, after the rest: an op begun among its first ones
    late.sync(0, T0 + 500 * MS + 7, T0 + 700 * MS, "all_reduce")
    late_ops = [dict(e, rank=1, id=100_000 + e["id"]) for e in late.sorted_events() if e["type"] == "op"]
    return events, late_ops


def test_collapsed_rows_painted_together_are_their_ranks_painted_one_by_one():
    """``levels_of`` finds every rank's window of ops at once (a binary search over the ranks
    of a block) and draws them together: the levels and the worst category of each group
    equal those of its ranks' own rows, over views published while the trace arrives (ops in
    flight, async work waited late, inner traffic, zero-length ops, an op ending before it
    begins, a rank out of time order, ranks in several blocks), from the model itself too,
    windows anywhere, the replay cursor, a selection, far zoomed out from span indexes, and
    groups with ranks in no view, a rank in two groups, an empty group."""
    from collections import defaultdict

    from commscope.analysis import TraceModel
    from commscope.tui.paintcode import categories
    from commscope.tui.painter import Window, levels_of
    from commscope.tui.spanindex import SpanIndex

    events, late_ops = _collapsed_trace()
    start, end = events[0]["ts"], events[-1]["ts"]
    span = end - start
    m = TraceModel()
    spans: defaultdict[int, SpanIndex] = defaultdict(SpanIndex)
    checked = 0
    seen: set[str] = set()
    cuts = list(range(0, len(events), 2503))
    views = []
    for k in cuts:
        m.ingest(events[k:k + 2503])
        if k == cuts[-1]:
            m.ingest(late_ops)
        views.append(m.view())
    # each view painted once the model has gone on past it, as a console paints the view it
    # holds while the next batch is ingested: ops in flight then may have ended since
    for v in views:
        cats = categories(v.sigs)
        ranks = v.rank_ids()
        groups = [tuple(ranks), tuple(ranks[::2]) + (99,), (ranks[-1], ranks[0]), (), (ranks[1],)]
        edges = []  # (windows starting where an op ends)
        for r in (0, 6):
            comp = v.ranks[r].comp[:v.ranks[r].n]
            edges += [int(x) for x in comp[comp > 0][::97][:3]]
        long = [(int(a), int(z)) for r in (4, 5) for a, z in zip(v.ranks[r].begin[:v.ranks[r].n],
                                                                 v.ranks[r].comp[:v.ranks[r].n], strict=True)
                if z - a > 70 * MS][:2]  # (the replay cursor inside an op: drawn in flight up to it)
        for frac, off, cursor in ((1.0, -0.01, None), (0.3, 0.2, None), (0.02, 0.45, None), (1.0, 0.0, 0.5),
                                  (0.4, 0.3, 0.55), (0.001, 0.4, None), (0.01, 0.545, 0.55),
                                  *((0.002, t, None) for t in edges),
                                  *((2 * MS, a - 20 * MS, a + 65 * MS) for a, _ in long),
                                  (MS, T0 + 2290 * MS, None)):
            w = 93
            npc = frac if isinstance(frac, int) else max(1, int(span * frac) // w)
            t0 = off if isinstance(off, int) else start + int(span * off)
            now = v.end_ns if cursor is None else cursor if isinstance(cursor, int) else start + int(span * cursor)
            busiest = max(ranks, key=lambda r: v.ranks[r].n)
            for sel, index_min, overview in ((None, 2500, True), ((busiest, v.ranks[busiest].n // 2), 2500, True),
                                             (None, 0, True), (None, 0, False)):
                win = Window(t0, npc, w, now, now if cursor is not None else None, 60 * MS, sel, overview,
                             index_min_ops=index_min)
                for model in ((v, m) if v is views[-1] else (v,)):
                    for with_spans in ((None, spans) if model is v else (None,)):
                        got = levels_of(model, groups, win, cats, with_spans)
                        for g, (level, worst) in zip(groups, got, strict=True):
                            ref = _levels_rank_by_rank(model, g, win, cats, with_spans)
                            assert np.array_equal(level, ref[0]) and np.array_equal(worst, ref[1]), \
                                (g, frac, off, cursor, sel, index_min, model is v)
                            seen.update(f"level{x}" for x in set(level.tolist()))
                            seen.update(f"worst{x}" for x in set(worst.tolist()))
                            checked += 1
    assert v.ranks[1].own_sb is not None  # (out of time order: painted on its own)
    assert len({id(rv.rows) for rv in v.ranks.values()}) > 1  # (ranks in several blocks)
    assert checked >= 500 and len(long) == 2
    assert {f"level{x}" for x in range(5)} <= seen and {f"worst{x}" for x in (P.WARN, P.ERROR, P.SELECTED)} <= seen


def test_collapsed_rows_counted_again_from_what_changed_are_counted_anew(monkeypatch):
    """``count_levels`` given what it counted over the last view (``prev``) counts only the
    cells from the earliest op changed since or the earlier clock: the same levels, busy
    counts and worst categories as counting all again, over views published while the
    trace arrives (each counted once the model has gone on past it), the clock moving on
    with no event (ops in flight past the hang thresholds), a selection, the replay cursor,
    windows in the past that a late op reaches, rows whose drawing switches to one span an
    op as they fill, and span indexes; and never over a view of another model."""
    from collections import defaultdict

    from commscope.analysis import TraceModel
    from commscope.tui import painter
    from commscope.tui.paintcode import categories
    from commscope.tui.painter import Window, count_levels, follow
    from commscope.tui.spanindex import SpanIndex

    froms: list = []
    window_ops = painter._window_ops
    monkeypatch.setattr(painter, "_window_ops",
                        lambda *a, **k: froms.append(a[5] if len(a) > 5 else None) or window_ops(*a, **k))
    # (an op in flight from the start would have every cell counted again: its end may be
    # written into the columns a view shares after it was published)
    events, late_ops = _collapsed_trace(stuck=False)
    start, end = events[0]["ts"], events[-1]["ts"]
    span = end - start
    m = TraceModel()
    spans: defaultdict[int, SpanIndex] = defaultdict(SpanIndex)
    cuts = list(range(0, len(events), 1201))
    windows = []  # (t0, npc, width; None: following the clock in pages, ``follow``)
    for frac, off, w in ((1.2, 0.0, 93), (0.3, 0.6, 93), (0.05, 0.8, 60), (0.2, 0.1, 93), (1.2, 0.0, 12),
                         (0.01, 0.3, 93), (0.1, None, 60), (0.03, None, 93), (0.04, 0.0, 60)):
        windows.append((None if off is None else start + int(span * off), max(1, int(span * frac) // w), w))
    following: dict = {}
    prevs: dict = {}
    checked = partial = switched = untouched = turned = 0
    seen: set[str] = set()
    held = None  # (the view painted after the next batch went in, as a console paints its view)
    later = 0  # (then the clock goes on, no event)
    for k in [*cuts, None, None, None, None]:
        if k is not None:
            m.ingest(events[k:k + 1201])
            if k == cuts[-1]:
                m.ingest(late_ops)
        v, held = held, m.view()
        if v is None:
            continue
        cats = categories(v.sigs)
        ranks = v.rank_ids()
        groups = [tuple(ranks), tuple(ranks[::2]) + (99,), (ranks[-1], ranks[0]), (), (ranks[1],)]
        later += (k is None) * 700 * MS
        clock = v.end_ns + later
        for t0_at, npc, w in windows:
            for sel, cursor, index_min in ((None, None, 2500), ((3, 101), None, 2500), (None, None, 0),
                                           (None, start + span // 2, 2500)):
                now = clock if cursor is None else cursor
                key = (t0_at, npc, w, sel, cursor, index_min)
                t0 = t0_at if t0_at is not None else follow(following.get(key, now - npc * w // 2), npc, w, now)
                following[key] = t0
                win = Window(t0, npc, w, now, cursor, 60 * MS, sel, True, index_min_ops=index_min)
                prev = prevs.get(key)
                froms.clear()
                got = count_levels(v, groups, win, cats, spans, prev)
                partial += bool(froms) and froms[0] is not None
                turned += bool(froms) and froms[0] is not None and prev.win.t0 != t0
                untouched += not froms  # (nothing in view changed: nothing looked at)
                switched += len(froms) > 1
                prevs[key] = got
                fresh = count_levels(v, groups, win, cats, spans)
                assert np.array_equal(got.busy, fresh.busy) and np.array_equal(got.worst, fresh.worst), key
                for (level, worst), (level2, worst2) in zip(got.levels, fresh.levels, strict=True):
                    assert np.array_equal(level, level2) and np.array_equal(worst, worst2)
                seen.update(f"worst{x}" for x in set(got.worst.ravel().tolist()))
                checked += 1
    assert checked >= 300 and partial >= 50 and switched >= 1 and untouched >= 1 and turned >= 5
    assert {f"worst{x}" for x in (P.WARN, P.ERROR, P.SELECTED)} <= seen
    # another model at the same version: counted anew, not from what the first one's view held
    a, b = TraceModel(), TraceModel()
    a.ingest(events[:3000])
    b.ingest([e for e in events[:3000] if e.get("rank") != 0])
    va, vb = a.view(), b.view()
    assert va.version == vb.version
    win = Window(start, max(1, span // 93), 93, vb.end_ns)
    groups = [tuple(va.rank_ids())]
    again = count_levels(vb, groups, win, None, None, count_levels(va, groups, win))
    assert np.array_equal(again.busy, count_levels(vb, groups, win).busy)
    assert not np.array_equal(again.busy, count_levels(va, groups, win).busy)


@pytest.mark.parametrize("seed", range(12))
def test_collapsed_rows_counted_again_over_windows_moved_on_are_counted_anew(seed):
    """Random traces arriving in batches, counted frame after frame over a window that stays,
    moves on by whole cells (a page turned, a pan), by part of a cell or back, under a clock
    that moves on: each count given the last (``prev``) equals counting all again, rows of
    few cells (a rank drawn one span an op, some of the time) and many."""
    from commscope.analysis import TraceModel
    from commscope.tui.painter import Window, count_levels

    rng = np.random.default_rng(seed)
    ranks = int(rng.integers(2, 6))
    b = TraceBuilder(ranks)
    for r in range(ranks):
        t = T0 + int(rng.integers(0, 50 * MS))
        for _ in range(int(rng.integers(20, 160))):
            t += int(rng.integers(0, 30 * MS))
            kind = rng.random()
            if kind < 0.5:
                b.sync(r, t, t + int(rng.integers(0, 20 * MS)), "all_reduce")
            elif kind < 0.8:  # issued, running a while (not busy), then waited
                wait = t + int(rng.integers(1 * MS, 200 * MS))
                b.async_op(r, t, wait, wait + int(rng.integers(0, 20 * MS)), "all_gather", peer=None)
            elif kind < 0.9:  # a long one
                b.sync(r, t, t + int(rng.integers(100 * MS, 900 * MS)), "broadcast")
            else:
                b.sync(r, t, t + int(rng.integers(0, 5 * MS)), "send", peer=(r + 1) % ranks, dir="send")
        b.sync(r, t + 10 * MS, None if rng.random() < 0.7 else t + 300 * MS, "all_reduce")  # (in flight, mostly)
    events = b.sorted_events()
    end = max(e["ts"] for e in events)
    w = int(rng.choice([5, 9, 24, 60]))
    npc = int((end - T0) / w * rng.choice([0.2, 0.5, 1.2]))
    groups = [tuple(range(ranks)), (0,), tuple(range(1, ranks)), (ranks - 1, 0)]
    sel = (int(rng.integers(0, ranks)), int(rng.integers(1, 30))) if rng.random() < 0.5 else None
    m = TraceModel()
    t0, prev = T0 - npc, None
    counted = kept = moved = 0
    cuts = sorted(int(x) for x in rng.integers(1, len(events), 30))
    for a, z in zip([0, *cuts], [*cuts, len(events)], strict=True):
        m.ingest(events[a:z])
        v = m.view()
        last = events[z - 1]["ts"]
        for _ in range(4):
            now = last + int(rng.integers(0, npc))
            step = rng.random()
            if step < 0.4:
                t0 += int(rng.integers(1, w)) * npc  # (a page turned, a pan: whole cells)
            elif step < 0.45:
                t0 += int(rng.integers(1, npc)) if npc > 1 else 1
            elif step < 0.5:
                t0 -= int(rng.integers(1, w)) * npc
            if t0 > now:  # (back to the live edge: nothing to keep)
                t0 = now - w * npc // 2
            last = now
            win = Window(t0, npc, w, now, hang_after_ns=int(rng.choice([50, 400])) * MS, sel=sel)
            got = count_levels(v, groups, win, prev=prev)
            fresh = count_levels(v, groups, win)
            assert np.array_equal(got.busy, fresh.busy) and np.array_equal(got.worst, fresh.worst), (a, win)
            kept += 0 < got.start < w
            moved += 0 < got.start < w and prev is not None and prev.win.t0 != t0
            counted += 1
            prev = got
    # (rows of few cells hold more than 4 ops a cell, one span each, and a page turned over
    # them is counted whole: what picks their drawing is not known then)
    assert counted == 4 * (len(cuts) + 1) and kept >= 5 and (moved >= 2 or w < 24), (kept, moved)


def test_a_window_following_the_clock_turns_its_pages_by_whole_cells_with_the_clock_in_it():
    """``follow``: kept while the clock lies within 10-90% of the window; else moved on by whole
    cells to put it at 60% (up to a cell past); a window of fewer than 5 cells, where a cell
    is a fifth of it or more, puts it at 60% exactly."""
    from commscope.tui.painter import FOLLOW_CELLS, follow

    rng = np.random.default_rng(5)
    for _ in range(2000):
        width, npc = int(rng.integers(1, 300)), int(rng.integers(1, 10**9))
        t0 = int(rng.integers(0, 10**15))
        span = width * npc
        edge = t0 + int(rng.integers(-3 * span, 4 * span))
        got = follow(t0, npc, width, edge)
        if t0 + span * 0.1 <= edge <= t0 + span * 0.9:
            assert got == t0
        elif width >= FOLLOW_CELLS:
            assert (got - t0) % npc == 0 and 0.6 * span - 1 <= edge - got < 0.6 * span + npc
        else:
            assert got == edge - int(span * 0.6)
        assert got <= edge < got + span  # (the clock in view)


def test_a_page_turned_over_a_row_drawn_one_span_an_op_is_counted_anew():
    """A window moved on by whole cells keeps the cells it still shows, where every rank is
    drawn op by op before and after; where that is not known it counts all again: a rank
    drawn one span an op before (its ops straddling the new start, found by the bisection
    though they end before it), and one whose ops coming into view, with one in flight
    begun before the window, pass 4 a cell.  The async op in flight is drawn as a thin line
    op by op (not busy) and busy as one span."""
    from commscope.analysis import TraceModel
    from commscope.tui.painter import Window, count_levels

    def counted_after_the_turn(b: TraceBuilder) -> tuple:
        v = TraceModel.from_events(b.sorted_events()).view()
        before = count_levels(v, [(0, 1)], Window(T0, 100 * MS, 40, T0 + 6500 * MS))
        win = Window(T0 + 2000 * MS, 100 * MS, 40, T0 + 6500 * MS)
        return count_levels(v, [(0, 1)], win, prev=before), count_levels(v, [(0, 1)], win)

    b = TraceBuilder(2)  # drawn one span an op, then (but for a bound) op by op
    b.sync(0, T0, T0 + 2500 * MS, "broadcast")  # (its end keeps the running max past the new start)
    for k in range(300):
        b.sync(0, T0 + 100 * MS + k * 3 * MS, T0 + 100 * MS + k * 3 * MS + 1, "all_reduce")
    b.async_op(0, T0 + 3000 * MS, None, None, "all_gather", peer=None)
    b.sync(1, T0, T0 + 10, "all_reduce")
    again, fresh = counted_after_the_turn(b)
    assert np.array_equal(again.busy, fresh.busy) and not fresh.busy[0, 12:40].all()
    b = TraceBuilder(2)  # op by op, then one span an op
    b.async_op(0, T0 + 1500 * MS, None, None, "all_gather", peer=None)
    for k in range(100):
        b.sync(0, T0 + 2200 * MS + k * 8 * MS, T0 + 2200 * MS + k * 8 * MS + MS, "all_reduce")
    for k in range(60):
        b.sync(0, T0 + 4200 * MS + k * 10 * MS, T0 + 4200 * MS + k * 10 * MS + MS, "all_reduce")
    b.sync(1, T0, T0 + 10, "all_reduce")
    again, fresh = counted_after_the_turn(b)
    assert np.array_equal(again.busy, fresh.busy) and fresh.busy[0, :40].all()


def test_counted_again_where_an_op_s_columns_change_under_a_view_or_fall_outside_its_span():
    """Counting again from the last frame equals counting anew (from an adversarial review):
    an op in flight at publishing completed in the columns the view shares before the view was
    painted (an earlier end than the last frame's clock); a GPU op waited after the GPU had
    done, with another rank's op begun inside that wait arriving late or completing later; an
    async op's issue returning after its wait ended; a wait begun before its op (hostile); the
    replay cursor's clock moved.  An op is drawn within its span (begin to completion): the
    wait after the GPU had done is not drawn, as its completion says the op was over."""
    from commscope.analysis import TraceModel
    from commscope.tui.painter import Window, count_levels, repaint_rank

    def same(v, groups, win, prev) -> None:
        got, fresh = count_levels(v, groups, win, prev=prev), count_levels(v, groups, win)
        assert np.array_equal(got.busy, fresh.busy) and np.array_equal(got.worst, fresh.worst)

    def op(rank: int, op_id: int, ms: int, phase: str) -> dict:
        return {"type": "op", "ts": T0 + ms * MS, "phase": phase, "id": op_id, "v": 1, "rank": rank}

    # completed in the shared columns after publishing, before the last frame's clock
    b = TraceBuilder(2)
    x = b.begin(0, T0 + 100 * MS, "all_reduce")
    b.sync(1, T0 + 10 * MS, T0 + 20 * MS, "all_reduce")
    m = TraceModel()
    m.ingest(b.sorted_events())
    win = Window(T0, 50 * MS, 40, T0 + 800 * MS)
    prev = count_levels(m.view(), [(0, 1)], win)
    m.ingest([op(1, 1000, 900, "begin") | {"op": "all_reduce", "group": "0", "seq": 2}, op(1, 1000, 950, "end")])
    v2 = m.view()
    m.ingest([op(0, x, 300, "end")])  # (the model goes on before v2 is painted)
    same(v2, [(0, 1)], win._replace(now=T0 + 1000 * MS), prev)
    # a GPU op waited after the GPU had done; another rank's op begun in that wait, late
    for late in (True, False):
        b = TraceBuilder(2)
        x = b.begin(0, T0 + 100 * MS, "all_reduce", device="cuda:0", **{"async": True})
        b.end(0, x, T0 + 101 * MS)
        b.phase(0, x, T0 + 120 * MS, "done")
        b.phase(0, x, T0 + 300 * MS, "wait_begin")
        b.phase(0, x, T0 + 320 * MS, "wait_end")
        y = b.begin(1, T0 + 305 * MS, "all_reduce", device="cuda:1") if not late else None
        m = TraceModel()
        m.ingest(b.sorted_events())
        v = m.view()
        win = Window(T0, 50 * MS, 40, T0 + 500 * MS)
        prev = count_levels(v, [(0,), (0, 1)], win)
        assert prev.busy[0].tolist()[:8] == [0, 0, 1, 0, 0, 0, 0, 0]  # (to its completion, 120 ms)
        rows = {r: repaint_rank(v, r, win, None) for r in (0, 1)}
        assert (rows[0].cells[3:] == 0).all()  # (nothing of it past its completion, its thin line neither)
        if late:
            m.ingest([op(1, 1000, 305, "begin") | {"op": "all_reduce", "group": "0", "seq": 2, "device": "cuda:1"},
                      op(1, 1000, 306, "end")])
        else:
            m.ingest([op(1, y, 600, "done")])
        v2, win2 = m.view(), win._replace(now=T0 + 700 * MS)
        same(v2, [(0,), (0, 1)], win2, prev)
        for r in (0, 1):  # (a rank's own row, repainted from what changed, as well)
            again, cells = repaint_rank(v2, r, win2, rows[r]), paint_rank(v2, r, win2)[0]
            assert np.array_equal(again.cells, cells)
    # an async op's issue returning after its wait ended; the clock moves on
    b = TraceBuilder(2)
    x = b.begin(0, T0 + 100 * MS, "all_gather", **{"async": True})
    b.phase(0, x, T0 + 150 * MS, "wait_begin")
    b.phase(0, x, T0 + 200 * MS, "wait_end")
    b.end(0, x, T0 + 1500 * MS)
    b.sync(1, T0 + 10 * MS, T0 + 20 * MS, "all_reduce")
    v = TraceModel.from_events(b.sorted_events()).view()
    win = Window(T0, 50 * MS, 40, T0 + 900 * MS)
    same(v, [(0, 1)], win._replace(now=T0 + 1000 * MS), count_levels(v, [(0, 1)], win))
    # a wait begun before its op, in a later batch
    b = TraceBuilder(2)
    x = b.begin(0, T0 + 500 * MS, "all_gather", **{"async": True})
    b.end(0, x, T0 + 501 * MS)
    b.sync(1, T0 + 10 * MS, T0 + 20 * MS, "all_reduce")
    m = TraceModel()
    m.ingest(b.sorted_events())
    prev = count_levels(m.view(), [(0, 1)], win)
    m.ingest([op(0, x, 100, "wait_begin"), op(0, x, 200, "wait_end")])
    same(m.view(), [(0, 1)], win, prev)
    # the replay cursor's clock moved: the ops past it hidden before, shown now
    b = TraceBuilder(2)
    for k in range(5):
        t = T0 + k * 400 * MS
        b.async_op(0, t, t + 350 * MS, t + 360 * MS, "all_gather", peer=None)
    for k in range(200):
        b.sync(0, T0 + 2500 * MS + k * 5 * MS, T0 + 2500 * MS + k * 5 * MS + 1, "all_reduce")
    b.sync(1, T0, T0 + 10, "all_reduce")
    v = TraceModel.from_events(b.sorted_events()).view()
    win = Window(T0, 100 * MS, 40, T0 + 2400 * MS, cursor_ns=T0 + 2400 * MS)
    same(v, [(0, 1)], win._replace(now=T0 + 3900 * MS), count_levels(v, [(0, 1)], win))


def test_a_row_whose_drawing_switches_as_it_fills_is_counted_again_whole():
    """A rank's async ops drawn in detail (their issue, a thin line while they run, not
    busy) until the window holds more than 4 ops a cell, then one span each (busy
    throughout): the ops that push it past are late in the window, yet every cell is
    counted again."""
    from commscope.analysis import TraceModel
    from commscope.tui.painter import Window, count_levels
    from commscope.tui.spanindex import SpanIndex

    b = TraceBuilder(2)
    for k in range(5):  # issued for 1 ms, waited 350 ms later: three cells of running between
        t = T0 + k * 400 * MS
        b.async_op(0, t, t + 350 * MS, t + 360 * MS, "all_gather", peer=None)
    b.sync(1, T0, T0 + 10, "all_reduce")
    first = b.sorted_events()
    for k in range(200):
        b.sync(0, T0 + 2500 * MS + k * 5 * MS, T0 + 2500 * MS + k * 5 * MS + 1, "all_reduce")
    m = TraceModel()
    m.ingest(first)
    win = Window(T0, 100 * MS, 40, T0 + 3900 * MS)
    before = count_levels(m.view(), [(0, 1)], win)
    assert before.busy[0, 1:3].sum() == 0  # (the running part: not busy)
    m.ingest([e for e in b.sorted_events() if e not in first])
    v = m.view()
    again = count_levels(v, [(0, 1)], win, prev=before)
    assert np.array_equal(again.busy, count_levels(v, [(0, 1)], win).busy) and again.busy[0, 1:3].all()
    # the other way round, the rank first painted on its own (from its span index): its ops
    # drawn then are what picks the drawing of those added after
    b = TraceBuilder(2)
    for k in range(200):
        b.sync(0, T0 + k * 5 * MS, T0 + k * 5 * MS + 1, "all_reduce")
    b.sync(1, T0, T0 + 10, "all_reduce")
    first = b.sorted_events()
    t = T0 + 2500 * MS
    b.async_op(0, t, t + 350 * MS, t + 360 * MS, "all_gather", peer=None)
    m = TraceModel()
    m.ingest(first)
    win = Window(T0, 100 * MS, 40, T0 + 3900 * MS, index_min_ops=0)
    spans = {0: SpanIndex(), 1: SpanIndex()}
    before = count_levels(m.view(), [(0, 1)], win, spans=spans)
    m.ingest([e for e in b.sorted_events() if e not in first])
    v = m.view()
    again = count_levels(v, [(0, 1)], win, spans=spans, prev=before)
    assert np.array_equal(again.busy, count_levels(v, [(0, 1)], win).busy) and again.busy[0, 25:29].all()


@pytest.mark.parametrize(("npc", "cell"), [(2**50, 9), (MAX_NPC, 2503)])
def test_cells_of_a_window_spanning_2_to_the_53_ns_are_whole_numbers(npc, cell):
    """Past 2**53 ns in view (npc past ``MAX_NPC``, or ~2,500 cells at it: no terminal, a
    direct caller) a quotient in float64 rounds an op begun 1 ns before a cell's first ns
    onto it: the op [a, a + 1] touches cells ``cell - 1`` and ``cell``, as floor division
    says, painted alone (few intervals: integers), counted together (``levels_of``) and
    painted from many intervals (``_cover``'s bincount) alike (found in review)."""
    from commscope.analysis import TraceModel
    from commscope.tui.paintcode import categories
    from commscope.tui.painter import Window, _cover, levels_of

    b = TraceBuilder(1)
    b.sync(0, T0, T0 + 1, "all_reduce")
    v = TraceModel.from_events(b.sorted_events()).view()
    cats = categories(v.sigs)
    win = Window(T0 - (cell * npc - 1), npc, cell + 5, T0 + 10)
    ref = _levels_rank_by_rank(v, (0,), win, cats)
    assert np.flatnonzero(ref[0]).tolist() == [cell - 1, cell]
    got = levels_of(v, [(0,)], win, cats)[0]
    assert np.array_equal(got[0], ref[0]) and np.array_equal(got[1], ref[1])
    many = np.full(40, T0)  # (past 32 intervals: the bincount path)
    cells = _cover(many, many + 1, np.full(40, P.COLL, np.int8), win.t0, npc, win.width)
    assert np.flatnonzero(cells).tolist() == [cell - 1, cell]


def test_large_trace_first_frame_from_the_ops_then_span_indexes_built_when_idle():
    """Opening a large trace: the first whole-trace frame is painted from the ops (building
    the span indexes would cost more than the frame), the indexes the frame wanted are built
    when the UI is idle, and the frames after are painted from them: the same rows."""
    from commscope.analysis.synth import healthy_trace

    events = healthy_trace(3, 4000)
    app = make_app(events, max(e["ts"] for e in events))

    async def check(pilot) -> None:
        tl = app.timeline
        start, end = tl.model.bounds()
        tl.follow = False
        tl.npc = (end - start) // tl.timeline_width() + 1
        tl.t0 = start
        tl.clear_caches(indexes=True)
        built = []
        build = tl.build_indexes
        tl.build_indexes = lambda *a: built.append(build(*a)) or built[-1]
        first = [tl.render_line(y).text for y in range(4)]
        ranks = tl.model.rank_ids()
        assert all(tl._spans[r].wanted and tl._spans[r].version < 0 for r in ranks)
        for _ in range(2000):  # until the scheduled build has run (bounded only against a hang)
            await pilot.pause(0.005)
            if built and built[-1]:
                break
        assert built and built[-1]
        assert all(tl._spans[r].version == tl.model.ranks[r].version and not tl._spans[r].wanted for r in ranks)
        tl.clear_caches()
        assert [tl.render_line(y).text for y in range(4)] == first
        assert any("█" in line for line in first)
        # collapsed rows (all ranks of a host in one): their ranks' indexes are built too
        tl.clear_caches(indexes=True)
        tl.mode = "nodes"
        tl.rebuild_rows()
        assert len(tl.rows) == 1 and len(tl.rows[0].ranks) == 3
        built.clear()
        tl.render_line(0)
        assert all(tl._spans[r].wanted for r in ranks)
        for _ in range(2000):  # until the scheduled build has run (bounded only against a hang)
            await pilot.pause(0.005)
            if built and built[-1]:
                break
        assert all(tl._spans[r].version >= 0 and not tl._spans[r].wanted for r in ranks)

    drive(app, check, size=(160, 30))


def test_the_heatmap_following_a_live_job_counts_what_changed_as_it_counts_anew():
    """The console's heatmap of a job that goes on: the timeline follows the clock in pages
    of whole cells, and each frame counts its collapsed rows again only from what changed
    (``count_levels`` given the last frame's counts): the levels it shows equal those counted
    anew, over frames where the page turned and where it did not."""
    import asyncio

    from tui_scenarios import load

    from commscope.tui.app import CommscopeApp
    from commscope.tui.painter import rows_levels

    b = TraceBuilder(64, hang_after=2.0)
    steps = []
    t = T0 + 100 * MS
    for k in range(14):
        before = len(b.events)
        for r in range(64):  # (async work waited late on some ranks: not busy while it runs)
            b.async_op(r, t, t + (80 if r % 5 else 300) * MS, t + (90 if r % 5 else 320) * MS, "all_gather")
        t = b.collective(t + 330 * MS, "all_reduce", latency=(40 + 20 * (k % 3)) * MS, shape=(4096,)) + 30 * MS
        steps.append((b.events[before:], t))
    clock = [steps[0][1]]
    reader = StaticReader([e for e in b.events if e["type"] != "op"] + list(steps[0][0]))
    feed = Feed(reader, clock=lambda: clock[0], source="synthetic-job")
    app = CommscopeApp(feed, clock=lambda: clock[0], start_feed=False, bell=False, title="synthetic-job")
    checked, kept, turned = 0, 0, 0

    async def run() -> None:
        nonlocal checked, kept, turned
        async with app.run_test(size=(120, 40)) as pilot:
            load(app)
            tl = app.query_one(Timeline)
            tl.mode = "heat"
            tl.rebuild_rows()
            await pilot.pause()
            last_t0 = tl.t0
            for events, now in steps[1:]:
                reader.events.extend(events)
                clock[0] = now + 150 * MS
                load(app)
                await pilot.pause()
                for y in range(tl.size.height):
                    tl.render_line(y)
                m, win = tl.model, tl.window()
                rows = [r for r in tl.rows[tl.scroll_offset.y:][:tl.size.height] if len(r.ranks) > 1]
                fresh = rows_levels(m, rows, win)[0]
                assert len(rows) >= 4
                for row, levels in zip(rows, fresh, strict=True):
                    for (level, worst), (level2, worst2) in zip(tl._frame_levels[row.key], levels, strict=True):
                        assert np.array_equal(level, level2) and np.array_equal(worst, worst2), row.key
                        checked += 1
                kept += 0 < tl._counted.start < win.width
                turned += 0 < tl._counted.start < win.width and tl.t0 != last_t0
                last_t0 = tl.t0

    asyncio.run(run())
    assert checked >= 50 and kept >= 6 and turned >= 2, (checked, kept, turned)


def test_a_collapsed_row_s_dot_is_its_worst_rank_s_for_the_view_and_ranks_it_holds():
    """A collapsed row's gutter dot (the worst state among its ranks) is worked out once a view
    and row, not at every line painted; a row of the same key holding other ranks (a rank
    pinned out of it), and the next view, get their own."""
    from commscope.analysis import TraceModel
    from commscope.analysis.model import ModelView
    from commscope.analysis.vocab import RankState

    b = TraceBuilder(4)
    for r in range(4):
        b.sync(r, T0, T0 + MS, "all_reduce")
    tl = timeline_for(b.sorted_events(), T0 + 10 * MS)
    v = TraceModel.from_events(b.sorted_events()).view()

    def view(kinds: dict[int, str]) -> ModelView:
        states = {r: RankState(k, k, None, T0) for r, k in kinds.items()}
        return v._replace(states=states)

    m = view({0: "running", 1: "idle", 2: "dead", 3: "blocked"})
    calls = 0
    states = m.states

    class Counting(dict):
        def get(self, r, default=None):
            nonlocal calls
            calls += 1
            return states.get(r, default)

    m = m._replace(states=Counting())
    row = Row("b:r0-3", "r0-3", (0, 1, 2, 3))
    assert [tl._row_kind(m, row) for _ in range(5)] == ["dead"] * 5 and calls == 4
    pinned = Row("b:r0-3", "r0-3", (0, 1, 3))  # (the same key, rank 2 pinned out of it)
    assert tl._row_kind(m, pinned) == "blocked"
    after = view({0: "running", 1: "crashed", 2: "dead", 3: "blocked"})
    assert tl._row_kind(after, pinned) == "crashed" and tl._row_kind(after, Row("b:r0-1", "r0-1", (0, 1))) == "crashed"
