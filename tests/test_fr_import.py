"""Flight Recorder import: safe unpickling, mapping, and cross-checks against PyTorch's own tools."""

from __future__ import annotations

import json
import os
import pickle
import time
from pathlib import Path

import analysis_workers as W
import pytest

from commscope.analysis import TraceModel, diagnose
from commscope.analysis.flight_import import SafeUnpickler, dumps_to_events, load_dump, parse_name, safe_loads
from commscope.analysis.source import open_source
from commscope.cli import main as cli
from commscope.launch import Job, run_ranks

FR_ENV = {"TORCH_FR_BUFFER_SIZE": "2000"}


class _Evil:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_safe_unpickler_loads_plain_data_only(tmp_path):
    plain = {"a": [1, 2.5, "x", None, True, (3, 4)], "b": b"raw", "c": {1, 2}, "d": frozenset({3})}
    assert safe_loads(pickle.dumps(plain, protocol=4)) == plain
    marker = tmp_path / "pwned"
    evil = pickle.dumps({"version": "2.10", "entries": [_Evil(str(marker))]})
    with pytest.raises(pickle.UnpicklingError):
        safe_loads(evil)
    assert not marker.exists()
    with pytest.raises(pickle.UnpicklingError):
        SafeUnpickler.__new__(SafeUnpickler).find_class("builtins", "eval")
    import datetime

    with pytest.raises(pickle.UnpicklingError):
        safe_loads(pickle.dumps(datetime.date(2020, 1, 1)))


def test_malicious_dump_dir_is_refused_not_run(tmp_path, capsys):
    d = tmp_path / "dumps"
    d.mkdir()
    marker = tmp_path / "pwned"
    (d / "fr_trace_0").write_bytes(pickle.dumps({"version": "2.10", "entries": [_Evil(str(marker))]}))
    with pytest.raises(ValueError):
        load_dump(d / "fr_trace_0")
    assert cli(["check", str(d)]) == 2
    assert "no readable Flight Recorder dump" in capsys.readouterr().err
    assert not marker.exists()


def test_parse_profiling_names():
    assert parse_name("nccl:send 0->1") == ("nccl", "send", "send", 1)
    assert parse_name("nccl:recv 3<-0") == ("nccl", "recv", "recv", 0)
    assert parse_name("gloo:all_reduce") == ("gloo", "all_reduce", None, None)


def test_synthetic_nccl_style_dumps_map_onto_events():
    def entry(rid, name, seq, p2p=0, state="completed", sizes=((4,),)):
        return {"record_id": rid, "pg_id": 0, "process_group": ("0", "default_pg"), "collective_seq_id": seq,
                "p2p_seq_id": p2p, "op_id": rid, "profiling_name": name, "time_created_ns": 10**18 + rid * 10**6,
                "input_sizes": [list(s) for s in sizes], "input_dtypes": ["Float"], "output_sizes": [list(s) for s in sizes],
                "output_dtypes": ["Float"], "state": state, "time_discovered_started_ns": None,
                "time_discovered_completed_ns": (10**18 + rid * 10**6 + 500) if state == "completed" else None,
                "retired": state == "completed", "is_p2p": bool(p2p), "frames": [{"name": "step", "filename": "train.py", "line": 7}]}
    cfg = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}}
    dumps = {
        0: {"version": "2.10", "pg_config": cfg, "entries": [entry(0, "nccl:all_reduce", 1), entry(1, "nccl:send 0->1", 0, 1),
                                                             entry(2, "nccl:all_reduce", 2, state="scheduled")]},
        1: {"version": "2.10", "pg_config": cfg, "entries": [entry(0, "nccl:all_reduce", 1), entry(1, "nccl:recv 0<-1", 0, 1)]},
    }
    ev = dumps_to_events(dumps, {0: 10**18 + 60 * 10**9, 1: 10**18 + 60 * 10**9})
    m = TraceModel.from_events(ev)
    assert m.p2p_pair("0", 0, 1, 1) != (None, None)
    assert m.op(0, 0)["site"] == "train.py:7 in step" and m.op(0, 0)["in_dtypes"] == ["float32"]
    f = diagnose(m, hang_after=5)
    assert [x.kind for x in f] == ["missing_ranks"] and f[0].culprits == [1] and f[0].seq == 2


@pytest.fixture(scope="module")
def crosscheck(tmp_path_factory):
    out = {}
    for mismatch in (False, True):
        base = tmp_path_factory.mktemp("mis" if mismatch else "ok")
        store = str(base / "trace")
        args = (store, str(base / "fr"), mismatch)
        if mismatch:  # hangs (or aborts) by design: wait for the dumps, then kill
            job = Job(W.fr_crosscheck, 3, args=args, env=FR_ENV, pg_timeout=300.0).start()
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not (len(list((base / "fr" / "pkl").glob("fr_trace_*"))) == 3
                                                       and _in_flight_recorded(store)):
                time.sleep(0.2)
            job.kill()
        else:
            run_ranks(W.fr_crosscheck, 3, args=args, env=FR_ENV, timeout=60)
        out[mismatch] = base
    return out


def _in_flight_recorded(store: str) -> bool:
    """Every rank's stream holds the mismatched all_reduce (#5 of the default group)."""
    try:
        events = open_source(store).read_all()
    except Exception:  # nothing written yet
        return False
    return {e["rank"] for e in events if e.get("type") == "op" and e.get("phase") == "begin"
            and e.get("op") == "all_reduce" and e.get("seq") == 5} == {0, 1, 2}


def _collectives(model: TraceModel, rank: int) -> list[tuple[str, int, str, list]]:
    rt = model.ranks[rank]
    rows = []
    for i in rt.order().tolist():
        s = model.sigs[int(rt.sig[i])]
        if s.flags & 8 and rt.seq[i] >= 0:  # COLL
            rows.append((s.group, int(rt.seq[i]), s.op, [list(x) for x in s.in_shapes]))
    return rows


def test_recorded_collectives_match_flight_recorder(crosscheck):
    base = crosscheck[False]
    ours = TraceModel.from_events(open_source(str(base / "trace")).read_all())
    for kind in ("json", "pkl"):
        fr = TraceModel.from_events(open_source(str(base / "fr" / kind)).read_all())
        assert sorted(fr.ranks) == [0, 1, 2]
        for r in range(3):
            a, b = _collectives(ours, r), _collectives(fr, r)
            assert a and a == b, (kind, r, a, b)
        assert diagnose(fr, hang_after=1.0) == []
    assert diagnose(ours, hang_after=1.0) == []
    # the raw dump agrees entry by entry too
    raw = json.loads((base / "fr" / "json" / "fr_trace_0").read_bytes())
    names = [e["profiling_name"] for e in raw["entries"] if e["process_group"][0] == "0"]
    assert names == ["gloo:all_reduce", "gloo:broadcast", "gloo:all_gather", "gloo:barrier", "gloo:all_reduce"]


def _fr_trace_verdict(pkl_dir: Path) -> list[tuple[int, list[int]]]:
    """torch.distributed.flight_recorder.fr_trace's analysis: (seq, culprit ranks) of failed collectives.

    Gloo dumps carry one nameless pg_config entry (its ranks sometimes '[]'); fr_trace
    needs it keyed by group name, so it is filled in with the job's known layout."""
    from torch.distributed.flight_recorder.components.builder import build_db
    from torch.distributed.flight_recorder.components.config_manager import JobConfig
    from torch.distributed.flight_recorder.components.loader import read_dir

    args = JobConfig().parse_args([str(pkl_dir)])
    details, version = read_dir(args)
    for d in details.values():
        groups = {tuple(e["process_group"]) for e in d["entries"]}
        d["pg_config"] = {n: {"name": n, "desc": desc, "ranks": "[0, 1, 2]" if desc == "default_pg" else "[0, 1]"}
                          for n, desc in groups}
    db = build_db(details, args, version)
    return [(c.collective_seq_id, sorted(c.mismatch_collectives or {})) for c in db.collectives if not c.pass_check]


def test_mismatch_verdict_agrees_with_fr_trace(crosscheck, capsys):
    base = crosscheck[True]
    theirs = _fr_trace_verdict(base / "fr" / "pkl")
    assert theirs == [(5, [1])]
    ours = TraceModel.from_events(open_source(str(base / "trace")).read_all())
    mine = [(f.seq, f.culprits) for f in diagnose(ours, hang_after=1.0) if f.kind == "collective_mismatch"]
    assert mine == theirs
    for kind in ("json", "pkl"):
        fr = TraceModel.from_events(open_source(str(base / "fr" / kind)).read_all())
        got = [(f.seq, f.culprits) for f in diagnose(fr, hang_after=1.0) if f.kind == "collective_mismatch"]
        assert got == theirs, kind
    capsys.readouterr()
    assert cli(["check", str(base / "fr" / "pkl"), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["findings"][0]["kind"] == "collective_mismatch" and out["findings"][0]["culprits"] == [1]
    assert cli(["report", str(base / "fr" / "json"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ops"]["all_reduce"]["count"] >= 1
    chrome = base / "fr.json"
    assert cli(["export", str(base / "fr" / "json"), "--chrome", str(chrome)]) == 0
    assert json.loads(chrome.read_text())["traceEvents"]


def test_an_entry_whose_frames_are_not_a_list_loses_its_stack_said_not_the_dump(tmp_path, capsys):
    """(Every command raised TypeError on such a dump: the in-flight entry's frames were
    walked as a list.)  The entry's op is read and judged as before; the stack it lacks is
    said in a warning, and is no lost op (``check`` exits on its findings)."""
    import json as json_

    from commscope.cli import main as cli

    def dump(frames: object) -> dict:
        p = tmp_path / f"fr-{frames!r}"
        p.mkdir()
        e = {"record_id": 0, "process_group": ["0", "default_pg"], "collective_seq_id": 1,
             "profiling_name": "nccl:all_reduce", "time_created_ns": 10**18, "state": "scheduled", "frames": frames}
        for r in (0, 1):
            (p / f"fr_trace_{r}").write_text(json_.dumps({"version": "2.10", "pg_config": {}, "entries": [e]}))
        capsys.readouterr()
        rc = cli(["check", str(p), "--json"])
        return dict(json_.loads(capsys.readouterr().out), rc=rc)

    plain = dump([])
    assert plain["rc"] == 0 and plain["warnings"] == []
    for frames in (5, True, "train.py"):
        got = dump(frames)
        assert got["rc"] == 0 and got["skipped"]["invalid"] == 0 and got["ops"] == plain["ops"] == 2
        assert got["warnings"] == [f"rank {r}: the stack of its first Flight Recorder entry in flight could not be "
                                   "read (its frames are not a list): its op is read, without a stack" for r in (0, 1)]
        assert got["findings"] == plain["findings"]


def test_entries_that_are_not_objects_are_counted(tmp_path, capsys):
    """(Entries such as 1, "x", null or [] were left out before anything counted them.)"""
    import json as json_

    from commscope.cli import main as cli

    e = {"record_id": 0, "process_group": ["0", "default_pg"], "collective_seq_id": 1,
         "profiling_name": "nccl:all_reduce", "time_created_ns": 10**18, "state": "completed",
         "time_discovered_started_ns": 10**18 + 10, "time_discovered_completed_ns": 10**18 + 20}
    for r, entries in ((0, [1, "x", None, [], e]), (1, [e])):
        (tmp_path / f"fr_trace_{r}").write_text(json_.dumps({"version": "2.10", "pg_config": {}, "entries": entries}))
    capsys.readouterr()
    assert cli(["check", str(tmp_path), "--json"]) == 1  # (what it could not read is a loss)
    got = json_.loads(capsys.readouterr().out)
    assert got["warnings"] == ["skipped 4 invalid event(s) (fr entry: not an object: 4)"]
    from collections import Counter

    from commscope.analysis.flight_import import dumps_to_events

    skipped: dict[int, Counter] = {}  # (entries that are not a list: parse_dump refuses such a file)
    events = dumps_to_events({0: {"version": "2.10", "entries": 5}, 1: {"version": "2.10", "entries": [e]}},
                             skipped=skipped)
    assert skipped == {0: Counter({"fr entry: not an object": 1})} and any(x["type"] == "op" for x in events)
