"""Fuzzing the readers: no mutant of a trace or of Flight Recorder dumps makes check, report,
export or the replay loader raise, exceed a memory cap or run past a time limit.

Hypothesis picks the mutations (commscope.bench.fuzz's mutators, fixed seed, derandomized);
each mutant runs in one worker process whose address space is capped (RLIMIT_AS) and
whose commands each have a time limit.  A longer run: ``commscope bench fuzz --mutants N``.
"""

from __future__ import annotations

import itertools
import os
import sys

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from commscope.bench import fuzz

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc: Linux")

MEM_MB = 1536
TIMEOUT_S = 15.0
SETTINGS = settings(max_examples=60, derandomize=True, deadline=None, database=None,
                    suppress_health_check=list(HealthCheck))
_counter = itertools.count()


@pytest.fixture(scope="module")
def worker():
    w = fuzz.Worker(MEM_MB, TIMEOUT_S, os.environ.get("COMMSCOPE_FUZZ_CODE"))  # other code: see bench.fuzz
    yield w
    w.close()


@pytest.fixture(scope="module")
def seeds():
    return {"store": fuzz.healthy_store(), "native": fuzz.native_store(), "json": fuzz.fr_dumps("json"),
            "pickle": fuzz.fr_dumps("pickle")}


def _choices(n_mutators: int):
    return st.lists(st.tuples(st.integers(0, n_mutators - 1), st.integers(0, 2**32 - 1)), min_size=1, max_size=3)


def _survives(worker, tmp_path_factory, files) -> None:
    path = fuzz.write_mutant(files, tmp_path_factory.mktemp("mutant") / f"m{next(_counter)}")
    res = worker.run(path)
    assert res["problems"] == [], res


def test_the_seeds_are_healthy(worker, seeds, tmp_path_factory):
    for files in seeds.values():
        _survives(worker, tmp_path_factory, files)


@seed(14)
@SETTINGS
@given(choices=_choices(len(fuzz.STORE_MUTATORS)))
def test_store_mutants_never_crash_a_reader(worker, seeds, tmp_path_factory, choices):
    _survives(worker, tmp_path_factory, fuzz.mutate(seeds["store"], fuzz.STORE_MUTATORS, choices))


@seed(14)
@settings(SETTINGS, max_examples=40)
@given(choices=_choices(len(fuzz.STORE_MUTATORS)))
def test_native_store_mutants_never_crash_a_reader(worker, seeds, tmp_path_factory, choices):
    """The same, on a trace whose ops are packed in blocks (the native recorder's)."""
    _survives(worker, tmp_path_factory, fuzz.mutate(seeds["native"], fuzz.STORE_MUTATORS, choices))


@seed(14)
@settings(SETTINGS, max_examples=24)
@given(fmt=st.sampled_from(["json", "pickle"]), choices=_choices(len(fuzz.FR_MUTATORS)))
def test_flight_recorder_mutants_never_crash_a_reader(worker, seeds, tmp_path_factory, fmt, choices):
    _survives(worker, tmp_path_factory, fuzz.mutate(seeds[fmt], fuzz.FR_MUTATORS, choices))


SKIPPED, KEPT = "skipped", "kept"


@pytest.mark.parametrize("line,fate", [
    (b'{"type":"dropped","rank":0,"ts":1700000000200000000,"count":null}', SKIPPED),
    (b'{"type":"sample","rank":0,"ts":1700000000200000000,"rss":"x"}', SKIPPED),
    (b'{"type":"op","rank":0,"ts":1700000000200000000,"phase":"begin","id":900,"op":[1]}', SKIPPED),
    (b'{"type":"op","rank":0,"ts":1700000000200000000,"phase":"begin","id":901,"op":"all_reduce","group":"0",'
     b'"seq":500000000}', KEPT),
    (b'{"type":"op","rank":0,"ts":1700000000200000000,"phase":"begin","id":902,"op":"all_reduce","group":"0",'
     b'"seq":1000000000000}', KEPT),
    (b'{"type":"heartbeat","rank":1000000000,"ts":1700000000200000000}', SKIPPED),
    (b'{"type":"meta","rank":0,"ts":1700000000200000000,"world_size":10000000}', KEPT),
    (b'{"type":"exit","rank":0,"ts":1700000000200000000,"unwaited":["a"]}', SKIPPED),
    (b'{"type":"op","rank":0,"ts":1700000000200000000,"phase":"begin","id":67108863,"op":"barrier","group":"0"}',
     KEPT),
    (b'{"type":"heartbeat","rank":0,"ts":1700000000200000000,"host":"\xe7\xff"}', SKIPPED),  # not UTF-8
])
def test_known_crashers_are_skipped_and_counted(worker, seeds, tmp_path_factory, line, fate):
    """One appended line each crashed or stalled a reader before (issue 14).  Now every
    command survives it, and the reader either keeps it (an extreme but valid event) or
    skips it and counts it: never both, never neither."""
    from commscope.analysis.source import open_source

    files = dict(seeds["store"])
    files["job/rank-00000.jsonl"] += line + b"\n"
    _survives(worker, tmp_path_factory, files)

    def counts(files) -> tuple[int, int]:
        reader = open_source(str(fuzz.write_mutant(files, tmp_path_factory.mktemp("read") / "m")))
        reader.read_all()
        return reader.stats.events, reader.stats.invalid + reader.stats.corrupt

    (events0, skipped0), (events, skipped) = counts(seeds["store"]), counts(files)
    assert skipped0 == 0
    assert (events - events0, skipped) == ((1, 0) if fate == KEPT else (0, 1))


def test_known_flight_recorder_crashers(worker, seeds, tmp_path_factory):
    import pickle

    base = fuzz.fr_dump(0)
    big = fuzz.fr_entries(0, 1)[0]
    big["input_sizes"] = big["output_sizes"] = [[4, 4]] * 3000
    bad_id = fuzz.fr_dump(1)
    bad_id["entries"][0]["record_id"] = fuzz.INF
    long_ranks = fuzz.fr_dump(2)
    long_ranks["pg_config"]["0"]["ranks"] = "[" + ", ".join(["1"] * 50_000) + "]"
    cases = [
        {"fr_trace_0": b'{"version": "2.10", "entries": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"},
        {"fr_trace_0": b"\x80\x04\x8d" + (1 << 40).to_bytes(8, "little") + b"abc"},
        {"fr_trace_0": pickle.dumps({"version": "2.10", "entries": [big] * 20_000}, protocol=4)},
        {"fr_trace_1": fuzz._dumps(bad_id), "fr_trace_2": fuzz._dumps(long_ranks)},
        {"fr_trace_99999999999": fuzz._dumps(base), "fr_trace_16000000": fuzz._dumps(base)},
    ]
    for extra in cases:
        _survives(worker, tmp_path_factory, {**seeds["json"], **extra})


def test_a_command_that_computes_forever_is_stopped_by_its_cpu_time(monkeypatch):
    """The limit is CPU time (a wall-clock one failed a seed's first check, imports and all,
    on 2 cores a test run shared): a loop is still stopped, and said."""
    import signal

    import commscope.cli

    def command(argv):
        while argv[0] == "check":
            pass

    monkeypatch.setattr(commscope.cli, "main", command)
    monkeypatch.setattr(fuzz, "_replay_loader", lambda path: None)
    old = signal.signal(signal.SIGPROF, fuzz._on_alarm)
    try:
        problems = fuzz.run_commands("unused", timeout=0.2)
    finally:
        signal.signal(signal.SIGPROF, old)
    assert problems == [{"command": c, "error": "timeout after 0.2 CPU-seconds"} for c in ("check", "check-text")]


def test_the_default_mutants_are_made_without_an_error(tmp_path):
    # A "top" mutation left pg_config a number; a later "pg" one called .setdefault on it:
    # `commscope bench fuzz` with its defaults (200 mutants, seed 7) ended in a traceback.
    assert len(fuzz.make_mutants(200, 7, tmp_path)) == 200
    for n in range(40):
        fuzz.mutate(fuzz.fr_dumps("json"), fuzz.FR_MUTATORS, [(k % 2, n * 7919 + k) for k in range(3)])
