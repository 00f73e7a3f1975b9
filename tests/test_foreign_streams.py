"""A stream that is not of the run the others are (another job's rank file copied in,
another launch under a reused job id) is named with its cause: ``check`` never calls such
a mix healthy (``TraceModel.foreign_streams``, ``completeness.find_incomplete``).  Its ops
are kept out of the matching and the diagnosis (no finding of the job's made of them), in
``check``, ``report`` and the console alike, and the job's metadata says which run is the
job's where streams copied in outnumber its own (``analysis.runs``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from redis_fixture import *  # noqa: F403  (the redis_server and redis_url fixtures)

from commscope.launch import Job


def _steps(rank: int, world: int, store: str) -> None:
    """A short healthy recording: 20 all_reduces and a barrier."""
    import torch
    import torch.distributed as dist

    import commscope

    x = torch.ones(4)
    with commscope.instrumented(store, sample_interval=0.2, flight_recorder=False):
        for _ in range(20):
            dist.all_reduce(x)
        dist.barrier()


def _steps_then_a_recv_that_fails(rank: int, world: int, store: str) -> None:
    """``_steps``, then the last rank waits in a recv from rank 1, which never sends: it
    fails (the group's timeout, or rank 1's connection closed as it left), caught."""
    import torch
    import torch.distributed as dist
    from failure_workers import quick_group

    import commscope

    x = torch.ones(4)
    with commscope.instrumented(store, sample_interval=0.2, flight_recorder=False):
        for _ in range(20):
            dist.all_reduce(x)
        dist.barrier()
        quick = quick_group(3.0)
        if rank == world - 1:
            try:
                dist.recv(x, 1, group=quick)
            except RuntimeError:
                pass


def _steps_then_hold(rank: int, world: int, store: str, release: str) -> None:
    """``_steps``, then recording on (heartbeats) until the file ``release`` exists: a rank
    alive and writing for as long as a test needs it."""
    import torch
    import torch.distributed as dist

    import commscope

    x = torch.ones(4)
    with commscope.instrumented(store, sample_interval=0.2, flight_recorder=False):
        for _ in range(20):
            dist.all_reduce(x)
        dist.barrier()
        while not os.path.exists(release):
            time.sleep(0.05)


def _launch(store: Path | str, world: int, spools: Path, job: str | None = None, steps=_steps,
            segment_mb: str | None = None) -> None:
    env = {"COMMSCOPE_SOURCE": "native", "COMMSCOPE_SPOOL_DIR": str(spools)}
    if segment_mb is not None:
        env["COMMSCOPE_SEGMENT_MB"] = segment_mb
    if job is not None:
        env["COMMSCOPE_JOB"] = job
    results = Job(steps, world, args=(str(store),), env=env).start().join(120)
    assert all(r.ok for r in results.values()), {k: r.error for k, r in results.items()}


def _check(target: Path | str, spools: Path) -> tuple[int, dict]:
    got = subprocess.run([sys.executable, "-m", "commscope", "check", "--json", str(target)], capture_output=True,
                         text=True, timeout=300, env={**os.environ, "COMMSCOPE_SPOOL_DIR": str(spools)})
    return got.returncode, json.loads(got.stdout)


def _report(target: Path | str, spools: Path) -> dict:
    got = subprocess.run([sys.executable, "-m", "commscope", "report", "--json", str(target)], capture_output=True,
                         text=True, timeout=300, env={**os.environ, "COMMSCOPE_SPOOL_DIR": str(spools)})
    assert got.returncode == 0, got.stdout + got.stderr
    return json.loads(got.stdout)


def _text(command: str, target: Path | str, spools: Path) -> str:
    got = subprocess.run([sys.executable, "-m", "commscope", command, str(target)], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "COMMSCOPE_SPOOL_DIR": str(spools), "COLUMNS": "300"})
    return got.stdout + got.stderr


def _named(store: Path | str, spools: Path, ranks: list[int], why: dict[int, str], cause: str, world: int = 2) -> dict:
    """``check --json`` of ``store``: exit 1, one ``trace_incomplete`` error naming exactly
    ``ranks``, each with ``why`` and its typed ``cause``, nothing counted lost, and no other finding (the foreign
    streams' ops matched with none of the job's: no straggler, no mismatch they made); its
    ``ranks`` the job's own ``world``, the foreign streams counted apart.  The report."""
    rc, out = _check(store, spools)
    assert rc == 1, out
    assert (out["ranks"], out["foreign_streams"]) == (world, len(ranks)), out
    [finding] = out["findings"]
    assert (finding["kind"], finding["severity"], finding["culprits"], finding["ranks"]) == (
        "trace_incomplete", "error", ranks, ranks), finding
    assert finding["evidence"]["lost_events"] == 0
    assert finding["evidence"]["per_rank"] == {str(r): {"foreign": why[r], "foreign_cause": cause} for r in ranks}
    return out


def _kept_apart(store: Path | str, own: set[int], ops: dict[int, int]) -> None:
    """The trace of ``store`` read as ``check`` reads it: every collective matched among the
    ranks ``own`` alone (the foreign streams in no group's index, and the groups as the job's
    own streams state them), and each foreign rank's ops all read (``ops``: its own count:
    nothing dropped)."""
    from commscope.analysis.source import load_trace

    model, _, _ = load_trace(store)
    assert model.coll and all(set(gi.ranks) == own and set(gi.members) == own for gi in model.coll.values()), \
        {k: (gi.ranks, gi.members) for k, gi in model.coll.items()}
    assert {r: model.n_ops(r) for r in ops} == ops


def test_a_healthy_job_has_no_foreign_stream(tmp_path):
    spools = tmp_path / "spools"
    _launch(tmp_path / "a", 2, spools)
    rc, out = _check(tmp_path / "a", spools)
    assert rc == 0 and out["findings"] == [], out["findings"]
    assert (out["ranks"], out["foreign_streams"]) == (2, 0), out


def test_rank_files_copied_in_from_another_job_are_named(tmp_path):
    """Ranks 2 and 3 of a 4-rank job copied into a 2-rank job's directory: before, they were
    matched with the job's own ranks, ``check`` blamed rank 2 as a straggler and exited 0.
    Now a ``trace_incomplete`` error names exactly ranks 2 and 3, each with the job its meta
    names; the job's own ranks are blamed for nothing and nothing is counted lost."""
    spools = tmp_path / "spools"
    _launch(tmp_path / "a", 2, spools)
    _launch(tmp_path / "b", 4, spools)
    [a] = [p for p in (tmp_path / "a").iterdir() if p.is_dir()]
    [b] = [p for p in (tmp_path / "b").iterdir() if p.is_dir()]
    _, alone = _check(a, spools)  # (the job's own counts, before anything is copied in)
    span, said_alone = _report(a, spools)["span_s"], _text("check", a, spools)
    (tmp_path / "copied").mkdir()
    for r in (2, 3):
        shutil.copy(b / f"rank-0000{r}.jsonl", a)
        shutil.copy(b / f"rank-0000{r}.jsonl", tmp_path / "copied")
    _, theirs = _check(tmp_path / "copied", spools)  # (the copied streams read alone: their own counts)
    why = f"its meta names job {b.name!r}, not {a.name!r}"
    out = _named(a, spools, [2, 3], {2: why, 3: why}, "another_job")
    assert out["ops"] == 42, out  # (the job's ops, as report's ops_total counts them)
    # every count the job's own, as before the copy (before: ``events`` counted the foreign
    # streams' too), theirs stated apart
    assert (out["events"], out["ops"]) == (alone["events"], alone["ops"]), (out, alone)
    assert (out["foreign_events"], out["foreign_ops"]) == (theirs["events"], theirs["ops"]) == (theirs["events"], 42)
    said = (f"rank(s) 2-3: not of the run the others are, kept out of the matching, the diagnosis and the report "
            f"(rank 2: {why}; rank 3: {why})")
    assert said in out["warnings"], out["warnings"]
    _kept_apart(a, {0, 1}, {2: 21, 3: 21})
    report = subprocess.run([sys.executable, "-m", "commscope", "report", "--json", str(a)], capture_output=True,
                            text=True, timeout=300, env={**os.environ, "COMMSCOPE_SPOOL_DIR": str(spools)})
    assert report.returncode == 0 and said in json.loads(report.stdout)["warnings"], report.stdout + report.stderr
    tables = json.loads(report.stdout)
    assert sorted(tables["ranks"]) == ["0", "1"] and tables["groups"]["0"]["count"] == 21, tables
    # (the job's ops, 21 a rank, as its tables count them; the foreign streams' counted apart;
    # the span the job's own: before, to the end of the 4-rank job, launched after it)
    assert (tables["ops_total"], tables["foreign_streams"], tables["foreign_ops"]) == (42, 2, 42), tables
    assert tables["span_s"] == span, (tables["span_s"], span)
    for command in ("check", "report"):  # the text output's rank count: the job's, the foreign apart
        text = _text(command, a, spools)
        assert "2 ranks (+2 foreign stream(s) kept apart), " in text, text
        assert ", 42 ops" in text, text  # (the job's ops alone)
    # (the job's events alone, and its span: "2 ranks, 1,234 events, 42 ops, 1.2 s; ..." before the copy)
    own = said_alone.split("2 ranks, ", 1)[1].split(";", 1)[0]
    assert f"2 ranks (+2 foreign stream(s) kept apart), {own};" in _text("check", a, spools), own


def test_a_second_launch_under_a_reused_job_id_is_named(tmp_path):
    """``COMMSCOPE_JOB`` set by hand to the same id for two launches, 2 ranks then 4: the
    second launch's ranks 0 and 1 find their files taken and refuse to write, its ranks 2
    and 3 write new files next to the first launch's.  Before, ``check`` read it as one
    4-rank job (a straggler on rank 2, exit 0); now the two launches' streams are told apart
    by the run their metas name, and ranks 2 and 3 are named, from another launch."""
    spools = tmp_path / "spools"
    store = tmp_path / "s"
    _launch(store, 2, spools, job="samejob")
    _launch(store, 4, spools, job="samejob")
    metas = {r: json.loads((store / "samejob" / f"rank-0000{r}.jsonl").read_bytes().split(b"\n")[0])
             for r in range(4)}
    first, second = metas[0]["run"], metas[2]["run"]
    assert first != second and metas[1]["run"] == first and metas[3]["run"] == second  # (the premise)
    why = f"its meta names run {second!r} of the job, not {first!r}: another launch"
    _named(store, spools, [2, 3], {2: why, 3: why}, "another_launch")


def test_a_rank_past_the_world_size_is_named(tmp_path):
    """A rank file of rank 7 (its meta: world size 4) next to a 2-rank job's own, of the same
    job and run (rank 1's stream, relabelled by hand): before, it was read as an eighth rank
    and ``check`` exited 0; now it is named, past the world size its peers' metas say."""
    import orjson

    spools = tmp_path / "spools"
    _launch(tmp_path / "a", 2, spools)
    [a] = [p for p in (tmp_path / "a").iterdir() if p.is_dir()]
    lines = []
    for line in (a / "rank-00001.jsonl").read_bytes().splitlines():
        ev = orjson.loads(line)
        ev["rank"] = 7
        if ev["type"] == "meta":
            ev["world_size"] = 4
        lines.append(orjson.dumps(ev))
    (a / "rank-00007.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    why = "rank 7 is past the world size 2 the job's metadata says"
    out = _named(a, spools, [7], {7: why}, "past_world_size")
    # (before: "no events from rank(s) 2-6 of world size 8", the foreign rank 7 taken for a rank of the world)
    assert out["warnings"] == [f"rank(s) 7: not of the run the others are, kept out of the matching, the diagnosis "
                               f"and the report (rank 7: {why})"], out["warnings"]


def test_streams_copied_in_that_outnumber_the_jobs_own_are_named(tmp_path):
    """Ranks 2-5 of a 6-rank job copied into a 2-rank job's directory outnumber its own two:
    the vote of the metas named ranks 0 and 1 foreign (and matched 2-5 among themselves).
    The job's metadata (``job.json``: the job rank 0 wrote it under) says which job the
    directory is of: ranks 2-5 are named, 0 and 1 matched together."""
    spools = tmp_path / "spools"
    _launch(tmp_path / "a", 2, spools)
    _launch(tmp_path / "c", 6, spools)
    a, c = _copied(tmp_path / "a", tmp_path / "c", (2, 3, 4, 5)), _job_dir(tmp_path / "c")
    why = f"its meta names job {c.name!r}, not {a.name!r}"
    _named(a, spools, [2, 3, 4, 5], dict.fromkeys((2, 3, 4, 5), why), "another_job")
    _kept_apart(a, {0, 1}, dict.fromkeys((2, 3, 4, 5), 21))


@pytest.mark.parametrize("backend", ["directory", "redis"])
def test_a_wider_second_launch_under_a_reused_job_id_is_named(backend, tmp_path, request):
    """``COMMSCOPE_JOB`` reused by hand: 2 ranks, then 6.  The second launch's ranks 0 and 1
    refuse to write, its ranks 2-5 write beside the first launch's two and outvote them
    (before: ranks 0 and 1 named, "another launch").  The run the job's metadata says (rank
    0 of the first launch wrote it: ``job.json``, Redis's job key) names ranks 2-5.  The same
    on either store: one reader path, one model."""
    spools = tmp_path / "spools"
    store = tmp_path / "s" if backend == "directory" else request.getfixturevalue("redis_url")
    _launch(store, 2, spools, job="samejob")
    _launch(store, 6, spools, job="samejob")
    from commscope.store import open_reader

    reader = open_reader(str(store) if backend == "redis" else str(store / "samejob"))
    metas = {e["rank"]: e for e in reader.read_all() if e["type"] == "meta"}
    job = reader.job()
    reader.close()
    first, second = metas[0]["run"], metas[2]["run"]
    assert job["run"] == first and [metas[r]["run"] for r in range(6)] == [first] * 2 + [second] * 4  # (the premise)
    why = f"its meta names run {second!r} of the job, not {first!r}: another launch"
    _named(store, spools, [2, 3, 4, 5], dict.fromkeys((2, 3, 4, 5), why), "another_launch")
    _kept_apart(store, {0, 1}, dict.fromkeys((2, 3, 4, 5), 21))


def test_a_foreign_streams_failed_wait_blames_none_of_the_jobs_ranks(tmp_path):
    """Rank 3 of a 4-rank job, whose recv from rank 1 failed (rank 1 never sent), copied into
    a 2-rank job's directory: before, its failure was judged as this job's, an op_failed
    blaming the job's own rank 1.  Now only the trace_incomplete naming rank 3 is found, and
    its 22 ops (the failed recv among them) are all read."""
    spools = tmp_path / "spools"
    _launch(tmp_path / "a", 2, spools)
    _launch(tmp_path / "b", 4, spools, steps=_steps_then_a_recv_that_fails)
    a, b = _job_dir(tmp_path / "a"), _job_dir(tmp_path / "b")
    shutil.copy(b / "rank-00003.jsonl", a)
    why = f"its meta names job {b.name!r}, not {a.name!r}"
    _named(a, spools, [3], {3: why}, "another_job")
    _kept_apart(a, {0, 1}, {3: 22})


def _copied(into: Path, source: Path, ranks: tuple[int, ...]) -> Path:
    """The rank files ``ranks`` of the job stored at ``source`` copied into the job stored at
    ``into``; its job directory."""
    a, b = _job_dir(into), _job_dir(source)
    for r in ranks:
        shutil.copy(b / f"rank-{r:05d}.jsonl", a)
    return a


def _replayed(job: Path):
    """A console replaying ``job`` (its feed and app; ``drive`` runs it)."""
    from commscope.store import open_reader
    from commscope.tui.app import CommscopeApp
    from commscope.tui.feed import REPLAY, Feed

    feed = Feed(open_reader(str(job)), mode=REPLAY, source=str(job))
    return feed, CommscopeApp(feed, start_feed=False, bell=False)


def _job_dir(store: Path) -> Path:
    [d] = [p for p in store.iterdir() if p.is_dir()]
    return d


def _followed(feed, done) -> None:
    """Step a console's feed, each step judged at once, until ``done(feed)`` (a bounded count
    of steps: each reads what is there, so a few suffice)."""
    for _ in range(60):
        feed.step()
        feed._diagnosed_at = float("-inf")  # (would diagnose now)
        if feed.caught_up() and done(feed):
            return
    raise AssertionError(f"not reached: ranks {sorted(feed.model.ranks)}, findings {feed.findings}")


def test_a_console_keeps_streams_found_foreign_after_their_ops_out_of_the_matching(tmp_path):
    """A console follows a 2-rank job's directory, then ranks 2 and 3 of a 4-rank job are
    copied in: the poll that reads them ingests their ops with their metas, before any meta
    is compared, so they entered the matching (before: a straggler on rank 2 beside the
    trace_incomplete naming them).  Found foreign, they leave it: the console's findings are
    ``check``'s, the trace_incomplete alone, and every collective is matched among ranks 0
    and 1; each foreign rank's 21 ops are all in the model."""
    from commscope.store import open_reader
    from commscope.tui.feed import LIVE, Feed

    spools = tmp_path / "spools"
    _launch(tmp_path / "a", 2, spools)
    _launch(tmp_path / "b", 4, spools)
    a, b = _job_dir(tmp_path / "a"), _job_dir(tmp_path / "b")
    feed = Feed(open_reader(str(tmp_path / "a")), mode=LIVE)
    _followed(feed, lambda f: sorted(f.model.ranks) == [0, 1] and f.diagnoses)
    assert feed.findings == []
    feed.reader.LIST_TRUST_S = 0.0  # (list the directory again at once)
    for r in (2, 3):
        shutil.copy(b / f"rank-0000{r}.jsonl", a)
    _followed(feed, lambda f: sorted(f.model.ranks) == [0, 1, 2, 3] and f.model.n_ops(3) == 21)
    why = f"its meta names job {b.name!r}, not {a.name!r}"
    [(kind, culprits, evidence)] = [(f.kind, f.culprits, f.evidence) for f in feed.findings]
    assert (kind, culprits, evidence.lost_events) == ("trace_incomplete", [2, 3], 0)
    said = {"foreign": why, "foreign_cause": "another_job"}
    assert evidence.per_rank == {"2": said, "3": said}
    model = feed.model
    assert all(gi.ranks == [0, 1] and gi.members == [0, 1] for gi in model.coll.values())
    assert {r: model.n_ops(r) for r in (2, 3)} == {2: 21, 3: 21}


def test_a_console_whose_vote_turns_keeps_the_outvoted_streams_out_of_the_matching(tmp_path):
    """No job metadata to go by (``job.json`` deleted): a console follows a 2-rank job, then
    ranks 2-5 of a 6-rank job are copied in and outvote it.  Ranks 0 and 1, matched until
    then, leave the matching (named foreign: the vote is all there is) and ranks 2-5 are
    matched among themselves under the 6-rank job's own group statement."""
    from commscope.analysis.runs import Cause
    from commscope.store import open_reader
    from commscope.tui.feed import LIVE, Feed

    spools = tmp_path / "spools"
    _launch(tmp_path / "a", 2, spools)
    _launch(tmp_path / "c", 6, spools)
    a, c = _job_dir(tmp_path / "a"), _job_dir(tmp_path / "c")
    (a / "job.json").unlink()
    feed = Feed(open_reader(str(a)), mode=LIVE)
    _followed(feed, lambda f: sorted(f.model.ranks) == [0, 1] and f.diagnoses)
    assert feed.findings == [] and all(gi.ranks == [0, 1] for gi in feed.model.coll.values())
    feed.reader.LIST_TRUST_S = 0.0
    for r in (2, 3, 4, 5):
        shutil.copy(c / f"rank-0000{r}.jsonl", a)
    _followed(feed, lambda f: sorted(f.model.ranks) == [0, 1, 2, 3, 4, 5] and f.model.n_ops(5) == 21)
    why = f"its meta names job {a.name!r}, not {c.name!r}"
    model = feed.model
    assert {r: (f.cause, f.message) for r, f in model.foreign_streams.items()} == dict.fromkeys((0, 1), (Cause.JOB, why))
    assert all(gi.ranks == [2, 3, 4, 5] and gi.members == [0, 1, 2, 3, 4, 5] for gi in model.coll.values())
    [(kind, culprits, evidence)] = [(f.kind, f.culprits, f.evidence) for f in feed.findings]
    assert (kind, culprits, evidence.lost_events) == ("trace_incomplete", [0, 1], 0)
    said = {"foreign": why, "foreign_cause": "another_job"}
    assert evidence.per_rank == {"0": said, "1": said}


def test_the_consoles_rank_table_shows_foreign_streams_apart_as_foreign(tmp_path):
    """Ranks 2 and 3 of a 4-rank job copied into a 2-rank job's directory, replayed in the
    console: before, the rank table gave them states among the job's ranks ("exited", sorted
    in with ranks 0 and 1), as if the job had four.  Now they come last, apart, whatever the
    sort, their state cell saying what they are (another job's), the job's ranks theirs."""
    from tui_scenarios import drive


    spools = tmp_path / "spools"
    _launch(tmp_path / "a", 2, spools)
    ended = time.time_ns()  # (after every event of the 2-rank job)
    while time.time_ns() < ended + 10**9:  # the premise below: both jobs together span more than
        time.sleep(0.05)  # a fit's least (1 s; a warm machine launches the next job sooner)
    _launch(tmp_path / "b", 4, spools)
    a = _copied(tmp_path / "a", tmp_path / "b", (2, 3))
    feed, app = _replayed(a)

    async def check(pilot):
        table = app.ranks_table
        assert [(f.kind, f.culprits) for f in app.findings] == [("trace_incomplete", [2, 3])]
        assert table.order == [0, 1, 2, 3]
        states = {r: table.cells(r)["state"].strip() for r in range(4)}
        assert states[2] == states[3] == "⊘ foreign · another job", states
        assert all(states[r].startswith("· exited") for r in (0, 1)), states  # (their clean exits)
        for sort in ("rank", "state", "cpu"):
            for _ in range(2):  # a click on the column's header, as a user sorts (the second reverses)
                await pilot.click(table, offset=(table.column_span(sort)[0] + 1, 0))
                await pilot.pause()
                assert table.order[2:] == [2, 3] and sorted(table.order[:2]) == [0, 1], (sort, table.order)
        # the timeline the same way (before: rows r0-r3 alike, as if the job had four ranks,
        # and fitted to the span of both jobs): the job's ranks, then the foreign streams
        # apart, marked, and the view fitted to the job's own span (the 4-rank job was
        # launched after it ended)
        tl = app.timeline
        assert [(row.ranks, row.apart) for row in tl.rows] == [((0,), False), ((1,), False), ((2,), True),
                                                               ((3,), True)], tl.rows
        lines = [tl.render_line(y).text for y in range(4)]
        assert all(tl.rows[y].note == "⊘ foreign · another job" for y in (2, 3)), tl.rows
        assert all(lines[y].startswith("⊘ r") for y in (2, 3)), [ln[:60] for ln in lines]  # (the note: under the cursor)
        assert not any("foreign" in lines[y] for y in (0, 1)), lines
        model = app.feed.model
        first, last = min(model.ranks[r].first_ts for r in (0, 1)), max(model.ranks[r].last_ts for r in (0, 1))
        assert model.end_ns - first > 10**9  # (the premise: both jobs together span more than a fit's least)
        assert tl.npc == max(last - first, 10**9) // int(tl.timeline_width() * 0.8), (tl.npc, first, last)
        # and the replay's cursor at the job's own end, the view on it (before: the cursor at
        # the other job's end, and the view followed it there, past every op of the job's)
        assert app.cursor_ns == last and tl.t0 <= first < last <= tl.t1(), (app.cursor_ns, tl.t0, first, last)
        for _ in tl_modes(tl):  # every other way of drawing the rows: the foreign streams still apart, last
            await pilot.press("c")
            await pilot.pause()
            own = [row for row in tl.rows if not row.apart]
            assert {r for row in own for r in row.ranks} == {0, 1}, (tl.mode, tl.rows)
            assert [row.ranks for row in tl.rows if row.apart] in ([(2,), (3,)], [(2, 3)]), (tl.mode, tl.rows)
            assert tl.rows[-1].apart, (tl.mode, tl.rows)

    drive(app, check, size=(200, 40))


def tl_modes(tl) -> range:
    """As many presses of ``c`` as the timeline has row modes less one (each mode once)."""
    from commscope.tui.timeline import MODES

    return range(len(MODES) - 1)


def test_a_stream_no_longer_foreign_brings_what_its_carries_stated_while_it_was_apart(tmp_path):
    """No job metadata to go by (``job.json`` deleted): a console follows a 2-rank job, then
    rank 2 of a 6-rank job whose older segments retention deleted (its later segment and the
    carry of the one before: the groups' histories at the window's start, ``store/inflight``)
    is copied in; the vote names it foreign and its carry's history is kept apart.  Then
    ranks 3-5 come and outvote the 2-rank job: rank 2 is the job's again.  Before, the
    history it stated while apart was not read again (the model's ``histories`` lacked rank
    2, so a collective history that disagreed before the window went unseen on it), and
    first, as rank 2's carry was ingested before it was found foreign (the poll's events come
    before the metas are compared) and was the group's only history, taking it out left the
    group's histories empty and the console's next diagnosis raised IndexError
    (``find_history_mismatches``' vote).  Now the console's histories are those of a read of
    the directory as it ends (``check``'s)."""
    from commscope.analysis.source import load_trace
    from commscope.store import open_reader
    from commscope.tui.feed import LIVE, Feed

    spools = tmp_path / "spools"
    _launch(tmp_path / "a", 2, spools)
    _launch(tmp_path / "c", 6, spools, segment_mb="0.004")  # (segments of ~4 KB: the job makes several)
    a, c = _job_dir(tmp_path / "a"), _job_dir(tmp_path / "c")
    (a / "job.json").unlink()

    def carried(r: int) -> None:  # rank r's last segment and the carry of the one before: retention took those
        from commscope.store.segments import segments_of

        segs = segments_of([p.name for p in c.iterdir()], c)[(r, 0)]
        last = segs[-1]
        assert last.number > 0, segs  # (the premise: the rank wrote more than one segment)
        carry = c / f"rank-0000{r}.open.{last.number - 1:06d}.jsonl"
        deadline = time.monotonic() + 60
        while not carry.exists():  # (a child of the writer's makes it once the segment is closed)
            assert time.monotonic() < deadline, f"rank {r}'s carry never came"
            time.sleep(0.05)
        shutil.copy(last.path, a)
        shutil.copy(carry, a)

    feed = Feed(open_reader(str(a)), mode=LIVE)
    _followed(feed, lambda f: sorted(f.model.ranks) == [0, 1] and f.diagnoses)
    feed.reader.LIST_TRUST_S = 0.0  # (list the directory again at once)
    carried(2)
    _followed(feed, lambda f: sorted(f.model.ranks) == [0, 1, 2] and f.model.foreign_streams.keys() == {2})
    assert all(2 not in per for per in feed.model.histories.values())  # (kept apart: not this run's)
    for r in (3, 4, 5):
        carried(r)
    _followed(feed, lambda f: sorted(f.model.ranks) == list(range(6)) and f.model.foreign_streams.keys() == {0, 1})
    whole, _, _ = load_trace(a)
    assert whole.foreign_streams.keys() == {0, 1}

    def said(model) -> dict:
        return {name: {r: (h.history, h.ts) for r, h in sorted(per.items())} for name, per in model.histories.items()
                if per}

    assert said(whole) == said(feed.model) and set(said(whole)["0"]) == {2, 3, 4, 5}, (said(whole), said(feed.model))


def test_a_foreign_streams_cause_is_its_own_whatever_its_ids_say(tmp_path):
    """``COMMSCOPE_JOB`` reused by hand, 2 ranks then 4: ranks 2 and 3 are another launch's.
    Rank 3's meta names a run whose text holds "names job" (a run id is whatever a meta
    says).  Before, the console told the cause back from the message's text, and its rank
    table called rank 3 "another job"; now the cause is typed (``runs.Cause``), carried in
    the model, the message made of it: both ranks "another launch", in the console and in
    ``check --json``'s ``foreign_cause``."""
    import orjson
    from tui_scenarios import drive

    from commscope.analysis.runs import Cause
    from commscope.store import open_reader
    from commscope.tui.app import CommscopeApp
    from commscope.tui.feed import REPLAY, Feed

    spools = tmp_path / "spools"
    store = tmp_path / "s"
    _launch(store, 2, spools, job="samejob")
    _launch(store, 4, spools, job="samejob")
    path = store / "samejob" / "rank-00003.jsonl"
    lines = []
    for line in path.read_bytes().splitlines():
        ev = orjson.loads(line)
        if ev["type"] == "meta":
            ev["run"] = f"names job {ev['run']}"
        lines.append(orjson.dumps(ev))
    path.write_bytes(b"\n".join(lines) + b"\n")
    rc, out = _check(store / "samejob", spools)
    [finding] = out["findings"]
    assert {r: d["foreign_cause"] for r, d in finding["evidence"]["per_rank"].items()} == {
        "2": "another_launch", "3": "another_launch"}, finding
    assert "names job" in finding["evidence"]["per_rank"]["3"]["foreign"]  # (the premise: the words of another cause)
    feed = Feed(open_reader(str(store / "samejob")), mode=REPLAY, source=str(store))
    app = CommscopeApp(feed, start_feed=False, bell=False)

    async def check(pilot):
        assert {r: f.cause for r, f in app.feed.model.foreign_streams.items()} == {2: Cause.LAUNCH, 3: Cause.LAUNCH}
        table = app.ranks_table
        states = {r: table.cells(r)["state"].strip() for r in (2, 3)}
        assert states == dict.fromkeys((2, 3), "⊘ foreign · another launch"), states

    drive(app, check, size=(200, 40))


def test_a_trace_is_judged_at_its_own_ranks_end_not_a_later_foreign_streams():
    """A 2-rank job read while rank 0 waits 1 s in an all_reduce rank 1 has not entered yet
    (hang_after 30 s), with the stream of another job's rank copied in, whose events run an
    hour later.  Before, the trace was judged at its last timestamp, the foreign stream's:
    rank 0 had waited an hour, and ``check`` blamed rank 1 (missing_ranks, or both ranks
    dead, silent for an hour).  Now it is judged at the job's own end (``trace_now``,
    ``TraceModel.trace_end``): only the foreign stream is named."""
    from commscope.analysis.diagnose import diagnose, trace_now
    from commscope.analysis.model import TraceModel
    from commscope.analysis.synth import T0, S, TraceBuilder

    b = TraceBuilder(2, hang_after=30.0)
    t = b.collective(T0 + S // 10, "all_reduce", latency=S // 100)
    b.begin(0, t + S, "all_reduce")  # (rank 1 never enters: the job is read 1 s later)
    for r in range(2):
        for k in range(11):
            b.heartbeat(r, T0 + k * S // 5, cpu=50.0)
    b.add(2, T0 + 3600 * S, "meta", host="h", pid=9, world_size=4, backend="gloo", hang_after=30.0)
    for k in range(5):
        b.heartbeat(2, T0 + 3600 * S + k * S // 5, cpu=50.0)
    events = [{**e, "job": "other" if e["rank"] == 2 else "mine"} if e["type"] == "meta" else e
              for e in b.sorted_events()]
    model = TraceModel.from_events(events)
    assert model.kept_apart == {2} and model.end_ns >= T0 + 3600 * S  # (the premise)
    assert trace_now(model) == max(rt.last_ts for r, rt in model.ranks.items() if r != 2) < T0 + 3 * S
    own = [rt for r, rt in model.ranks.items() if r != 2]
    assert model.own_bounds() == (min(rt.first_ts for rt in own), max(rt.last_ts for rt in own))
    findings = diagnose(model, trace_now(model), 30.0)
    assert [(f.kind, f.culprits) for f in findings] == [("trace_incomplete", [2])], [
        (f.kind, f.culprits, f.message) for f in findings]


def test_a_console_started_before_the_jobs_metadata_judges_again_when_it_comes(tmp_path):
    """Ranks 2-5 of a 6-rank job copied into a 2-rank job's directory, followed by a console
    started before the job's metadata is there (rank 0 writes ``job.json`` at its open: a
    console attached before): the vote names the job's own ranks 0 and 1 foreign.  Then
    ``job.json`` comes (as rank 0 writes it: a rename).  Before, the model took it, but the
    console judged again only when events came, and an ended job writes none: its finding
    kept naming ranks 0 and 1.  Now the metadata's coming is judged at once: ranks 2-5 are
    named, as ``check`` names them."""
    from commscope.store import open_reader
    from commscope.tui.feed import LIVE, Feed

    spools = tmp_path / "spools"
    _launch(tmp_path / "a", 2, spools)
    _launch(tmp_path / "c", 6, spools)
    a = _copied(tmp_path / "a", tmp_path / "c", (2, 3, 4, 5))
    (a / "job.json").rename(tmp_path / "job.json")
    feed = Feed(open_reader(str(a)), mode=LIVE)
    _followed(feed, lambda f: sorted(f.model.ranks) == list(range(6)) and f.diagnoses)
    assert [(f.kind, f.culprits) for f in feed.findings] == [("trace_incomplete", [0, 1])]  # (the vote's)
    (tmp_path / "job.json").rename(a / "job.json")
    _followed(feed, lambda f: f.model.reference is not None)
    _followed(feed, lambda f: [(x.kind, x.culprits) for x in f.findings] == [("trace_incomplete", [2, 3, 4, 5])])
    assert sorted(feed.view.foreign) == [2, 3, 4, 5]  # (the timeline's rows too)


def _export(target: Path, spools: Path, *extra: str) -> tuple[dict, str]:
    """``commscope export --chrome`` of ``target``: the trace written, and what it said."""
    path = target.parent / "trace.json"
    got = subprocess.run([sys.executable, "-m", "commscope", "export", str(target), "--chrome", str(path), *extra],
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "COMMSCOPE_SPOOL_DIR": str(spools)})
    assert got.returncode == 0, got.stderr
    return json.loads(path.read_bytes()), got.stderr


def test_the_chrome_export_keeps_foreign_streams_apart(tmp_path):
    """Ranks 2 and 3 of a 4-rank job (launched after) copied into a 2-rank job's directory,
    exported to Chrome/Perfetto JSON.  Before, each was a process of the job's ("rank 2",
    "rank 3" beside ranks 0 and 1, as if the job had four ranks) and the trace's start and
    end spanned both jobs.  Now the export is the job's own, event for event as before the
    copy, its metadata naming the streams left out and why; asked for by ``--ranks``, they
    are processes of their own, marked foreign and sorted after the job's ranks."""
    spools = tmp_path / "spools"
    _launch(tmp_path / "a", 2, spools)
    _launch(tmp_path / "b", 4, spools)
    a, b = _job_dir(tmp_path / "a"), _job_dir(tmp_path / "b")
    alone, _ = _export(a, spools)  # (the job's own export, before anything is copied in)
    for r in (2, 3):
        shutil.copy(b / f"rank-0000{r}.jsonl", a)
    out, said = _export(a, spools)
    assert {e["pid"] for e in out["traceEvents"]} == {0, 1}, sorted({e["pid"] for e in out["traceEvents"]})
    assert out["traceEvents"] == alone["traceEvents"]  # (times from the job's own start: the same numbers)
    assert (out["metadata"]["start_ns"], out["metadata"]["end_ns"], out["metadata"]["ranks"]) == (
        alone["metadata"]["start_ns"], alone["metadata"]["end_ns"], 2), (out["metadata"], alone["metadata"])
    why = f"its meta names job {b.name!r}, not {a.name!r}"
    assert out["metadata"]["foreign_streams"] == [
        {"rank": r, "cause": "another_job", "why": why, "exported": False} for r in (2, 3)]
    assert "2 ranks (+2 foreign stream(s) kept apart, not written: --ranks 2-3 writes them, marked)" in said, said
    # asked for: processes of their own, named and labelled foreign, after the job's ranks
    asked, said = _export(a, spools, "--ranks", "0-3")
    names = {e["pid"]: e["args"]["name"] for e in asked["traceEvents"] if e["name"] == "process_name"}
    assert [names[r].split(" (")[0] for r in range(4)] == ["rank 0", "rank 1", "rank 2", "rank 3"], names
    assert not any("foreign" in names[r] for r in (0, 1)) and all(
        names[r].endswith(" ⊘ foreign · another job") for r in (2, 3)), names
    labels = {e["pid"]: e["args"]["labels"] for e in asked["traceEvents"] if e["name"] == "process_labels"}
    assert labels == {r: f"not of the job's run: {why}" for r in (2, 3)}, labels
    order = {e["pid"]: e["args"]["sort_index"] for e in asked["traceEvents"] if e["name"] == "process_sort_index"}
    assert max(order[0], order[1]) < min(order[2], order[3]), order
    assert all(e["ts"] >= 0 for e in asked["traceEvents"] if "ts" in e)  # (the range widened to theirs)
    assert [f["exported"] for f in asked["metadata"]["foreign_streams"]] == [True, True]
    assert "2 ranks of 2 (+2 foreign stream(s), marked)" in said, said


def test_a_consoles_job_ends_with_its_own_ranks_not_a_live_foreign_stream(tmp_path):
    """``COMMSCOPE_JOB`` reused by hand: a 2-rank launch ends (ranks 0 and 1 exit), then a
    4-rank launch under the same id writes ranks 2 and 3 beside them and stays alive
    (heartbeats).  A console following the directory judged the job ended only once every
    stream read had exited or died, foreign ones too: the job's own ranks had exited, but
    the other launch's live streams kept it "LIVE", judged by the running clock.  Now the
    job ends with its own ranks ("ENDED", judged at its end, as ``check`` judges it), while
    the foreign streams go on."""
    from tui_scenarios import drive

    from commscope.analysis import rankstate
    from commscope.launch import Job
    from commscope.store import open_reader
    from commscope.tui.app import CommscopeApp
    from commscope.tui.feed import LIVE, Feed

    spools = tmp_path / "spools"
    store = tmp_path / "s"
    _launch(store, 2, spools, job="samejob")
    release = tmp_path / "release"
    env = {"COMMSCOPE_SOURCE": "native", "COMMSCOPE_SPOOL_DIR": str(spools), "COMMSCOPE_JOB": "samejob"}
    second = Job(_steps_then_hold, 4, args=(str(store), str(release)), env=env).start()
    try:
        feed = Feed(open_reader(str(store / "samejob")), mode=LIVE, source=str(store))
        app = CommscopeApp(feed, start_feed=False, bell=False)

        async def step(pilot) -> None:
            feed._diagnosed_at = float("-inf")  # (would diagnose now)
            info, _ = feed.step()
            app.apply(info, feed.findings)
            await pilot.pause()

        async def check(pilot):
            m = feed.model
            deadline = time.monotonic() + 120
            # until the other launch's ranks 2 and 3 made their ops and hold, found foreign
            while not (feed.caught_up() and m.kept_apart == {2, 3} and all(m.n_ops(r) == 21 for r in (2, 3))):
                assert time.monotonic() < deadline, (sorted(m.ranks), m.kept_apart)
                await step(pilot)
                await pilot.pause(0.05)
            await step(pilot)
            wall = feed._live_now()
            assert all(rankstate.exited(m, r) is not None for r in (0, 1))  # (the premise: the job's own exited, ...
            assert not any(rankstate.exited(m, r) or rankstate.is_dead(m, r, wall) for r in (2, 3))  # ... theirs live)
            assert app.info.ended, "the job's own ranks exited: ended, whatever the foreign streams do"
            assert "ENDED" in str(app.header_bar.render()) and "LIVE" not in str(app.header_bar.render())
            assert app.info.now_ns == m.trace_end() == max(m.ranks[r].last_ts for r in (0, 1))
            assert [(f.kind, f.culprits) for f in app.findings] == [("trace_incomplete", [2, 3])]

        drive(app, check, size=(200, 40), loaded=False)
    finally:
        release.touch()
        results = second.join(120)
    assert all(r.ok for r in results.values()), {k: r.error for k, r in results.items()}


def test_the_consoles_header_counts_the_jobs_events_and_the_foreign_apart(tmp_path):
    """Ranks 2 and 3 of a 4-rank job copied into a 2-rank job's directory, replayed in the
    console: before, the header's "N events" counted every stream read, the foreign ones in
    with the job's.  Now it says the job's own and the foreign apart, the numbers ``check
    --json`` gives (``events``, ``foreign_events``)."""
    from tui_scenarios import drive


    spools = tmp_path / "spools"
    _launch(tmp_path / "a", 2, spools)
    _launch(tmp_path / "b", 4, spools)
    a = _copied(tmp_path / "a", tmp_path / "b", (2, 3))
    _, out = _check(a, spools)
    assert out["foreign_events"] > 0  # (the premise)
    feed, app = _replayed(a)

    async def check(pilot):
        header = str(app.header_bar.render())
        said = f"· {out['events']:,} events (+{out['foreign_events']:,} foreign) "
        assert said in header, (said, header)

    drive(app, check, size=(250, 40))


def test_the_consoles_clock_counts_from_the_jobs_own_start_not_an_earlier_foreign_streams(tmp_path):
    """Ranks 2 and 3 of a 4-rank job launched before a 2-rank job, copied into its directory,
    replayed in the console: before, the header's "+time" of the cursor and the ruler's
    labels counted from the trace's first event, the other job's, and ``g`` jumped there,
    before any op of the job's; ``G`` and play went to the trace's last.  Now they count
    from the job's own start, and ``g``/``G`` go to the job's own start and end."""
    from tui_scenarios import drive

    from commscope.tui.fmt import duration

    spools = tmp_path / "spools"
    _launch(tmp_path / "c", 4, spools)
    _launch(tmp_path / "a", 2, spools)
    a = _copied(tmp_path / "a", tmp_path / "c", (2, 3))
    feed, app = _replayed(a)

    async def check(pilot):
        m = feed.model
        first, last = min(m.ranks[r].first_ts for r in (0, 1)), max(m.ranks[r].last_ts for r in (0, 1))
        assert m.start_ns < first and m.kept_apart == {2, 3}  # (the premise: the other job's events came first)
        assert app.cursor_ns == last
        header = str(app.header_bar.render())
        assert f" +{duration(last - first)} " in header, (duration(last - first), header)
        ruler = str(app.ruler.render())
        assert "┆+0" in ruler, ruler  # (a tick at the job's start: its labels count from there)
        await pilot.press("g")
        assert app.cursor_ns == first, (app.cursor_ns, first, m.start_ns)
        await pilot.press("G")
        assert app.cursor_ns == last, (app.cursor_ns, last, m.end_ns)

    drive(app, check, size=(200, 40))


def test_the_consoles_gpu_panel_lists_foreign_streams_apart_and_marked(tmp_path):
    """No job metadata to go by (``job.json`` deleted): ranks 2-5 of a 6-rank job copied into
    a 2-rank job's directory outvote its ranks 0 and 1, which are then the foreign ones.
    Replayed in the console, the resource panel (``r``) listed every stream in rank order,
    alike: r0 and r1 first, as ranks of the job.  Now the job's ranks come first and the
    foreign streams last, marked "⊘", as the rank table and the timeline list them."""
    from tui_scenarios import drive


    spools = tmp_path / "spools"
    _launch(tmp_path / "a", 2, spools)
    _launch(tmp_path / "c", 6, spools)
    a = _copied(tmp_path / "a", tmp_path / "c", (2, 3, 4, 5))
    (a / "job.json").unlink()
    feed, app = _replayed(a)

    async def check(pilot):
        assert feed.model.kept_apart == {0, 1}  # (the premise: the vote names the 2-rank job's)
        await pilot.press("r")  # the resource panel in place of the rank table
        await pilot.pause()
        labels = [app.gpu.render_line(y).text[:7].strip() for y in range(1, 7)]
        assert labels == ["r2", "r3", "r4", "r5", "⊘r0", "⊘r1"], labels
        assert app.ranks_table.order == [2, 3, 4, 5, 0, 1]  # (the rank table's, as before)

    drive(app, check, size=(200, 50))
