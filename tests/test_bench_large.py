"""``bench large``'s live batch: a written job's last records ingested in polls, rank by rank
and with the ranks already begun together, into two models built alike; both must end as
the same model (what test_model_batch checks on generated records, here on a real store's)."""

from __future__ import annotations

import math
import sys

import pytest
from model_compare import differences, model_state
from readers import stand_in_workers

from commscope.analysis import model
from commscope.bench import large
from commscope.bench.synthstore import JobShape, write_store


def test_the_live_batch_goes_both_ways_into_the_same_model(tmp_path, monkeypatch):
    store = tmp_path / "job"
    write_store(str(store), JobShape(ranks=24, ops=40, culprit=5))
    built = []

    made = model.TraceModel.__init__

    def keep(self):
        made(self)
        built.append(self)

    monkeypatch.setattr(model.TraceModel, "__init__", keep)
    live = []
    together = model.TraceModel._together_begins

    def spy(self, *a, **k):
        live.append(self)
        return together(self, *a, **k)

    monkeypatch.setattr(model.TraceModel, "_together_begins", spy)
    times, touched = large.batches(str(store), True, tail_events=24 * 20, batch=100)
    assert list(times) == ["rank by rank", "together"]
    assert len(times["rank by rank"]) == len(times["together"]) >= 4 and touched == 24
    slow, fast = built
    assert (slow.live_rows, fast.live_rows) == (0, model.LIVE_ROWS)
    assert live and set(map(id, live)) == {id(fast)}  # every poll of the fast model went together
    assert slow.total_ops() == fast.total_ops() == 24 * 40 - 1  # (the culprit's last all_reduce missing)
    assert differences(model_state(slow), model_state(fast)) == []


def test_the_week_finds_the_same_in_every_read_directory_and_redis(tmp_path, capsys):
    """``bench large``'s week-long job: all of it, retained and ``--since 30m`` (from the
    keyframes, and without them from the segments), in segments and in a private
    redis-server with marks; every read names the dead rank."""
    from commscope.bench.large import week

    assert week(tmp_path, 4) is False
    out = capsys.readouterr().out
    assert out.count("the same in") == 2 and "NOT" not in out and "the same in all four" in out
    assert "on Redis (one redis-server" in out and "check --since 30m" in out
    assert "... no keyframes" in out and "keyframes: " in out


def test_the_live_poll_reads_every_stream_s_new_line_both_ways(tmp_path):
    """``bench large``'s live poll: every poll of both readers reads each stream's block
    (``polls`` raises where one does not), and leaves nothing behind."""
    times = large.polls(tmp_path, 16, 3)
    assert list(times) == ["together", "alone"] and all(len(t) == 3 for t in times.values())
    assert list(tmp_path.iterdir()) == []


def test_a_columns_measurement_says_where_its_cpu_went(tmp_path, monkeypatch):
    """``bench large``'s columns measurement (run here in the test's process): the reading
    process's CPU, the read workers' (none for a job this small: it is read in one process),
    and what one worker takes to start and read a stream, measured apart; with one worker
    that cannot start, no figure."""
    store = str(tmp_path / "job")
    write_store(store, JobShape(8, 20))
    got = large.measure("columns", store)
    assert got["errors"] == [("missing_ranks", [5])]
    assert got["main_cpu_s"] > 0 and got["workers"] == 0 and got["start_cpu_s"] == 0
    assert large._worker_start(store) > 0
    stand_in_workers(monkeypatch, (sys.executable, "-c", "raise SystemExit(3)"))
    assert math.isnan(large._worker_start(store))


def test_the_extrapolation_to_more_cores_follows_the_cpu_it_is_given():
    """``bench large``'s extrapolation of reader + model to machines of more cores (labelled
    as one): the read lasts at least the reading process's ingesting and all the CPU over
    the readers (the reading process and a worker a core but one, each paying a start); the
    chunks the reading process read itself cost it what the workers' cost them."""
    events = 3_600_000
    # 1 worker that took 2.2 s, 0.2 s of it starting, for 10 of 20 chunks; a reading process
    # of 3.2 s that read the other 10 (2.0 s): 1.2 s of ingesting
    assert large.ingesting(3.2, 2.0, 20, 10) == pytest.approx(1.2)
    two = large.extrapolated(events, 3.2, 2.2, 1, 0.2, 2, 8, 20, 10)
    assert two == pytest.approx(events / ((1.2 + 4.0 + 0.2) / 2))  # (all the CPU over both readers)
    four = large.extrapolated(events, 3.2, 2.2, 1, 0.2, 4, 8, 20, 10)
    assert four == pytest.approx(events / ((1.2 + 4.0 + 3 * 0.2) / 4))
    # past the readers' cap the reading process's ingesting bounds it, however many cores
    assert large.extrapolated(events, 3.2, 2.2, 1, 0.2, 16, 8, 20, 10) == pytest.approx(events / 1.2)
    assert large.extrapolated(events, 3.2, 2.2, 1, 0.2, 64, 8, 20, 10) == pytest.approx(events / 1.2)
    # the readers' share bounds it where ingesting costs nothing
    assert large.extrapolated(events, 0.0, 4.0, 1, 0.0, 8, 2, 20, 0) == pytest.approx(events / 2.0)
    # workers alone (the reading process read no chunk): all its CPU is ingesting
    assert large.extrapolated(events, 1.2, 4.0, 2, 0.2, 2, 8, 20, 0) == pytest.approx(events / ((1.2 + 3.6 + 0.2) / 2))
    # the reading process read every chunk: no worker's chunk says what one costs
    assert math.isnan(large.ingesting(3.2, 0.0, 20, 20))
    assert math.isnan(large.extrapolated(events, 3.2, 0.2, 1, 0.2, 4, 8, 20, 20))
    # a worker's start measured above what the workers took: they decoded nothing, not less
    assert large.decoding(0.3, 2, 0.2) == 0.0 and large.ingesting(1.5, large.decoding(0.3, 2, 0.2), 20, 10) == 1.5


@pytest.mark.parametrize("jobs_here", [10, 20])
def test_a_row_is_extrapolated_only_where_a_worker_read_a_chunk(capsys, jobs_here):
    """The printed row: the extrapolation where the workers read some chunks, none (and
    why) where the reading process read every one."""
    col = {"load_s": 1.0, "diag_s": 0.1, "rss": 1 << 27, "events": 2_000_000, "main_cpu_s": 1.6,
           "workers_cpu_s": 0.6, "workers": 1, "jobs": 20, "jobs_here": jobs_here, "start_cpu_s": 0.01}
    large._print_row({"fmt": "native", "note": "", "results": {"events": [col], "columns": [col]}})
    out = capsys.readouterr().out
    assert f"{jobs_here} of 20 chunks read itself" in out
    if jobs_here == 20:
        assert "not extrapolated: the reading process read every chunk" in out and "M/s on 4 cores" not in out
    else:
        assert "M/s on 4 cores" in out and "not extrapolated" not in out


def test_a_measuring_process_reports_its_own_peak_memory_not_its_bench_s():
    """Each measurement runs in a fresh process started by the bench, which by then may hold
    gigabytes (its live batches' models): the peak reported is the fresh process's own.
    ``ru_maxrss`` gave the bench's (Linux keeps it across ``exec``): 3.2 GiB for a 16k read
    of 1.2 GiB."""
    import subprocess

    held = bytearray(384 << 20)
    held[::4096] = b"\x01" * len(held[::4096])  # (resident, page by page)
    code = "from commscope.bench.large import peak_rss; print(peak_rss())"
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert 0 < int(got.stdout) < len(held) // 2
    assert large.peak_rss() > len(held)  # (and this process's own, held here)
    del held


def test_the_live_poll_runs_only_where_its_files_may_be_open_at_once(tmp_path, monkeypatch, capsys):
    """A poll of R ranks holds ~3R files at once (a writer's and two readers'): 16k ranks
    ~49k, past a hard limit of 20k, where a reader short of descriptors read part of a poll
    and the whole bench ended in an internal error.  Where the limit cannot be raised, the
    poll is not run and the line says why; where it can, it runs."""
    import resource

    large._print_polls(tmp_path, 16, 3)
    assert "live poll, together against alone" in capsys.readouterr().out
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    monkeypatch.setattr(resource, "getrlimit", lambda what: (60, 60))

    def refused(what, limits):
        raise ValueError("not allowed")

    monkeypatch.setattr(resource, "setrlimit", refused)
    large._print_polls(tmp_path, 16, 3)
    out = capsys.readouterr().out
    assert "live poll: not run at 16 ranks" in out and "may open 60" in out and "median" not in out
    assert large.files_short_of(50) is None and large.files_short_of(61) == 60
    assert list(tmp_path.iterdir()) == []
