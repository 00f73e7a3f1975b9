"""Reader fuzzing: mutants of a healthy trace and of Flight Recorder dumps through every reader.

Each mutant (a directory store with its rank files and job.json, or a directory of
Flight Recorder dumps in JSON and pickle) goes through ``check --json``, ``check``
(rendered), ``report --json``, ``export --chrome -`` and the replay loader (``open_source`` + ``TraceModel``
+ ``diagnose``) in a worker process whose address space is capped (RLIMIT_AS) and
whose commands each get a time limit.  A crash is any exception that escapes a
command (exit 2 with a message is the right answer to bad input), a command over its
time limit, or the worker dying.  Mutations: a hostile value in any field of an
appended or rewritten line, truncation, bit flips, duplicated, dropped or swapped
lines, garbage, rank file names, job.json, and for dumps hostile fields, deep nesting,
pickle length claims, shared-reference amplification and rank-number file names.

    python -m commscope.bench.fuzz --mutants 500 --seed 7     (or: commscope bench fuzz ...)
    python -m commscope.bench.fuzz --mutants 168 --code DIR   run the same mutants on other code

The test suite drives the same mutators from hypothesis (tests/test_fuzz_readers.py).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import pickle
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from commscope import helpformat

WORLD = 3
MEM_MB = 2048  # address space a worker may add above its own baseline
TIMEOUT_S = 20.0  # per command
COMMANDS = ("check", "check-text", "report", "export", "replay")
INF = "\x00inf\x00"  # stands for the JSON number 1e400 (which json cannot write)

Files = dict[str, bytes]  # relative path -> content; a mutant is one of these


# ------------------------------------------------------------------------------ seeds
def healthy_store() -> Files:
    """A small healthy 3-rank directory-store job, as the recorder writes it."""
    import orjson

    from commscope.analysis.synth import S, TraceBuilder

    b = TraceBuilder(WORLD, hang_after=5.0, sample_interval=0.2)
    t = b.t0 + S // 10
    for step in range(12):
        t = b.collective(t, "all_reduce", latency=100_000) + 50_000
        for r in range(WORLD):
            b.async_op(r, t, t + 200_000, t + 300_000, "all_gather", shape=(64, 8))
        t += 400_000
        for r in range(WORLD):
            peer = (r + 1) % WORLD
            b.sync(r, t, t + 50_000, "send", peer=peer, dir="send", shape=(16,))
            b.sync(r, t + 1000, t + 60_000, "recv", peer=(r - 1) % WORLD, dir="recv", shape=(16,))
        t += 100_000
        if step % 4 == 0:
            b.heartbeats(t, t)
    for r in range(WORLD):
        b.add(r, t, "dropped", count=5, total=5, reason="Flight Recorder ring overwritten between polls")
        b.add(r, t + 10, "stack", id=1, threads=[{"tid": 1, "name": "MainThread", "op_thread": True,
                                                  "frames": [["train.py", 10, "step"], ["dist.py", 2, "f"]]}])
        b.exit(r, t + 1000, unwaited=[2])
    files: Files = {"job/job.json": orjson.dumps({"job": "job", "world_size": WORLD, "backend": "gloo",
                                                  "schema": 1, "created": b.t0, "host": "h"})}
    for r in range(WORLD):
        lines = [orjson.dumps(e) for e in b.events if e["rank"] == r]
        files[f"job/rank-{r:05d}.jsonl"] = b"\n".join(lines) + b"\n"
    files["LATEST"] = b"job\n"
    return files


def native_store() -> Files:
    """The same kind of job as the native recorder writes it: ops packed in ``block`` events."""
    import orjson

    from commscope import blocks
    from commscope.analysis.synth import S

    t0 = 1_700_000_000_000_000_000 + S // 10
    files: Files = {"job/job.json": orjson.dumps({"job": "job", "world_size": WORLD, "backend": "gloo",
                                                  "schema": 2, "created": t0, "host": "h"})}
    names = ["all_reduce", "isend", "irecv", "all_gather"]
    for r in range(WORLD):
        head = [{"type": "meta", "rank": r, "ts": t0, "v": 2, "world_size": WORLD, "backend": "gloo",
                 "recorder": "native", "names": names, "hang_after": 5.0, "sample_interval": 0.2},
                {"type": "group", "rank": r, "ts": t0, "v": 2, "group": "0", "gid": 0, "granks": list(range(WORLD))},
                {"type": "site", "rank": r, "ts": t0, "v": 2, "sid": 0, "text": "train.py:10 in step"}]
        recs = b""
        t, op_id = t0, 0
        for step in range(12):
            p2p = step + 1
            op_id += 1
            recs += blocks.pack_begin(op_id, t, name=0, site=0, seq=step + 1, ins=[(6, [64, 8])], outs=[(6, [64, 8])],
                                 in_bytes=2048, out_bytes=2048) + blocks.pack_end(op_id, t + 100_000)
            op_id += 1
            recs += blocks.pack_begin(op_id, t + 200_000, name=1, site=0, seq=p2p, peer=(r + 1) % WORLD, direction=1,
                                 flags=blocks.FLAG_ASYNC, ins=[(6, [16])], in_bytes=64) + blocks.pack_end(op_id, t + 210_000)
            recs += blocks.pack_wait_begin(op_id, t + 220_000) + blocks.pack_end(op_id, t + 260_000, wait=True)
            op_id += 1
            recs += blocks.pack_begin(op_id, t + 230_000, name=2, site=0, seq=p2p, peer=(r - 1) % WORLD, direction=2,
                                 flags=blocks.FLAG_ASYNC, outs=[(6, [16])], out_bytes=64) + blocks.pack_end(op_id, t + 240_000)
            recs += blocks.pack_wait_begin(op_id, t + 245_000) + blocks.pack_end(op_id, t + 270_000, wait=True)
            op_id += 1
            recs += blocks.pack_begin(op_id, t + 300_000, opcode=1, seq=-1, role=blocks.ROLE_NESTED,
                                 parent=op_id - 3, ins=[(6, [4])], outs=[(6, [4]), (6, [4]), (6, [4])],
                                 in_bytes=16, out_bytes=48) + blocks.pack_end(op_id, t + 350_000)
            t += 1_000_000
        lines = [orjson.dumps(e) for e in head] + [blocks.encode_block(recs, r, t, blocks.count_records(recs))]
        lines += [orjson.dumps({"type": "heartbeat", "rank": r, "ts": t, "v": 2, "inflight": 0}),
                  orjson.dumps({"type": "exit", "rank": r, "ts": t + 1000, "v": 2, "reason": "atexit"})]
        files[f"job/rank-{r:05d}.jsonl"] = b"\n".join(lines) + b"\n"
    files["LATEST"] = b"job\n"
    return files


def fr_entries(rank: int, n: int = 12) -> list[dict]:
    t0 = 1_700_000_000_000_000_000
    out = []
    for i in range(n):
        p2p = i % 4 == 3
        out.append({
            "record_id": i, "pg_id": 0, "process_group": ["0", "default_pg"],
            "collective_seq_id": 0 if p2p else i + 1, "p2p_seq_id": i + 1 if p2p else 0, "op_id": i + 1,
            "profiling_name": f"nccl:send {rank}->{(rank + 1) % WORLD}" if p2p else "nccl:all_reduce",
            "time_created_ns": t0 + i * 1_000_000 + rank * 1000, "duration_ms": 0.5,
            "input_sizes": [[1024, 4]], "input_dtypes": ["Float"], "output_sizes": [[1024, 4]],
            "output_dtypes": ["Float"], "state": "completed", "time_discovered_started_ns": t0 + i * 1_000_000,
            "time_discovered_completed_ns": t0 + i * 1_000_000 + 500_000, "retired": True, "timeout_ms": 600000,
            "is_p2p": p2p, "frames": [{"name": "step", "filename": "train.py", "line": 10 + i}],
        })
    return out


def fr_dump(rank: int) -> dict:
    return {"version": "2.10", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2]"}},
            "pg_status": {}, "entries": fr_entries(rank)}


def fr_dumps(fmt: str) -> Files:
    """Flight Recorder dumps of a 3-rank job, JSON or pickle, named like PyTorch names them."""
    enc = (lambda d: json.dumps(d).encode()) if fmt == "json" else (lambda d: pickle.dumps(d, protocol=4))
    return {f"fr_trace_{r}": enc(fr_dump(r)) for r in range(WORLD)}


# ------------------------------------------------------------------------------ mutators
def _deep(n: int) -> Any:
    x: Any = []
    for _ in range(n):
        x = [x]
    return x


HOSTILE: list[Any] = [None, "x", [1], {}, {"a": [1]}, True, -1, 0, 1.5, INF, 1 << 31, 1 << 40, 10**12, 500_000_000,
                      10_000_000, 1_000_000_000, 10**30, "a" * 20_000, ["a"], [[1, 2], "x"], [[10**12] * 40],
                      [["a"]], [None], list(range(2000)), [-1]]
FIELDS = ["type", "rank", "ts", "v", "phase", "id", "op", "group", "seq", "peer", "dir", "root", "redop", "in_shapes",
          "in_dtypes", "in_bytes", "out_shapes", "out_bytes", "async", "site", "tid", "sk", "nested", "parent",
          "src", "exc", "approx", "gpu_ns", "world_size", "hang_after", "sample_interval", "granks", "cpu", "rss",
          "gpu_util", "inflight", "threads", "reason", "unwaited", "count", "total", "argv", "backend", "host"]
EVENT_TYPES = ["op", "meta", "group", "sample", "heartbeat", "stack", "exit", "dropped"]


def _dumps(obj: Any) -> bytes:
    """JSON with INF written as 1e400 and deep nesting allowed (json, not orjson)."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 20_000))
    try:
        return json.dumps(obj).replace(json.dumps(INF), "1e400").encode()
    finally:
        sys.setrecursionlimit(limit)


def _pickle(obj: Any) -> bytes:
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 20_000))
    try:
        return pickle.dumps(obj, protocol=4)
    finally:
        sys.setrecursionlimit(limit)


def _pick_value(rng: random.Random) -> Any:
    if rng.random() < 0.05:
        return _deep(rng.choice([200, 5000]))
    return rng.choice(HOSTILE)


def _lines(data: bytes) -> list[bytes]:
    return [x for x in data.split(b"\n") if x]


def _rank_files(files: Files) -> list[str]:
    """The rank files (one, empty, is made when earlier mutations left none)."""
    names = sorted(k for k in files if k.endswith(".jsonl"))
    if not names:
        files["job/rank-00000.jsonl"] = b""
        names = ["job/rank-00000.jsonl"]
    return names


def _hostile_event(rng: random.Random, files: Files) -> dict:
    name = rng.choice(_rank_files(files))
    try:
        ev = json.loads(rng.choice(_lines(files[name])))
    except (ValueError, IndexError):
        ev = {"type": "heartbeat", "rank": 0, "ts": 1}
    if not isinstance(ev, dict):
        ev = {}
    if rng.random() < 0.3:
        ev["type"] = rng.choice(EVENT_TYPES)
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        ev[rng.choice(FIELDS if rng.random() < 0.8 else list(ev) or FIELDS)] = _pick_value(rng)
    return ev


def m_append_event(rng: random.Random, files: Files) -> Files:
    """Append one event with a hostile value in one or more fields."""
    name = rng.choice(_rank_files(files))
    files[name] += _dumps(_hostile_event(rng, files)) + b"\n"
    return files


def m_rewrite_event(rng: random.Random, files: Files) -> Files:
    """Replace a line in the middle of a rank file by a hostile event."""
    name = rng.choice(_rank_files(files))
    lines = _lines(files[name]) or [b"{}"]
    lines[rng.randrange(len(lines))] = _dumps(_hostile_event(rng, files))
    files[name] = b"\n".join(lines) + b"\n"
    return files


def m_bytes(rng: random.Random, files: Files) -> Files:
    """Bit flips, truncation, garbage, duplicated/dropped/swapped lines."""
    name = rng.choice(sorted(files) or ["job/rank-00000.jsonl"])
    data = bytearray(files.get(name, b""))
    how = rng.choice(["flip", "truncate", "garbage", "dup", "drop", "swap", "empty"])
    if how == "flip" and data:
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    elif how == "truncate":
        del data[rng.randrange(len(data) + 1):]
    elif how == "garbage":
        at = rng.randrange(len(data) + 1)
        data[at:at] = rng.choice([b"\x00" * 100, b"{{{{", b"\n\n\n", b'{"type":"op"', rng.randbytes(64), b"\xff\xfe"])
    elif how == "empty":
        data = bytearray()
    else:
        lines = _lines(bytes(data))
        if lines:
            i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
            if how == "dup":
                lines[i:i] = [lines[j]] * rng.choice([1, 100])
            elif how == "drop":
                del lines[i]
            else:
                lines[i], lines[j] = lines[j], lines[i]
        data = bytearray(b"\n".join(lines) + b"\n")
    files[name] = bytes(data)
    return files


def m_job_json(rng: random.Random, files: Files) -> Files:
    """Hostile job metadata: other types, huge numbers, not JSON, not an object, a path as job id."""
    meta = {"job": "job", "world_size": WORLD, "backend": "gloo", "schema": 1}
    meta[rng.choice(["job", "world_size", "backend", "schema", "maxlen", "created"])] = _pick_value(rng)
    files["job/job.json"] = rng.choice([_dumps(meta), _dumps([meta]), b"{", b"", _dumps(_deep(5000))])
    if rng.random() < 0.3:
        files["LATEST"] = rng.choice([b"../..\n", b"/etc\n", b"job/../job\n", b"\x00\n"])
    return files


def m_rename(rng: random.Random, files: Files) -> Files:
    """A rank file under a hostile rank number."""
    name = rng.choice(_rank_files(files))
    new = rng.choice(["rank-99999999.jsonl", "rank-1000000000.jsonl", "rank-99999999999999999999.jsonl",
                      "rank-00001.jsonl", "rank-16777215.jsonl"])
    files[f"job/{new}"] = files.pop(name)
    return files


def m_block(rng: random.Random, files: Files) -> Files:
    """Hostile packed records inside a ``block`` event: flipped, cut or rewritten header and
    body fields (lengths, ids, dims, counts), still valid base64 and JSON around them."""
    import base64
    import struct

    import orjson

    from commscope import blocks

    names = [n for n in _rank_files(files) if b'"type":"block"' in files[n]]
    if not names:
        return m_bytes(rng, files)
    name = rng.choice(names)
    lines = _lines(files[name])
    idx = [i for i, line in enumerate(lines) if b'"type":"block"' in line]
    i = rng.choice(idx)
    try:
        ev = orjson.loads(lines[i])
        raw = bytearray(base64.b64decode(ev["data"]))
    except Exception:
        return files
    how = rng.choice(["flip", "cut", "field", "append"])
    if how == "flip" and raw:
        for _ in range(rng.randint(1, 16)):
            raw[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
    elif how == "cut":
        del raw[rng.randrange(len(raw) + 1):]
    elif how == "field" and len(raw) >= blocks.HEADER.size + blocks.BEGIN_BODY.size:
        at = rng.randrange(0, len(raw) - 8)
        raw[at:at + 8] = struct.pack("<q", rng.choice([-1, 0, 1 << 62, -(1 << 63), (1 << 63) - 1, 255, 65535]))
    else:
        raw += blocks.pack_begin(rng.randrange(1 << 40), rng.choice([0, -5, 1 << 62]), seq=rng.choice([-1, 10**12]),
                            ins=[(rng.randrange(256), [rng.choice([-1, 1 << 40, 3])] * rng.randrange(80))],
                            gid=rng.choice([0, 7, -3]), peer=rng.choice([-1, 5, 1 << 30]))
    ev["data"] = base64.b64encode(bytes(raw)).decode()
    lines[i] = orjson.dumps(ev)
    files[name] = b"\n".join(lines) + b"\n"
    return files


STORE_MUTATORS: list[Callable[[random.Random, Files], Files]] = [m_append_event, m_rewrite_event, m_bytes,
                                                                  m_job_json, m_rename, m_block]


def _fr_load(data: bytes) -> Any:
    from commscope.analysis.flight_import import safe_loads

    if data[:1] == b"\x80":
        return safe_loads(data)
    return json.loads(data)


def m_fr_field(rng: random.Random, files: Files) -> Files:
    """A hostile value in a dump field or entry field (record_id 1e400, ranks strings, nesting)."""
    name = rng.choice(sorted(files) or ["fr_trace_0"])
    try:
        dump = _fr_load(files[name])
    except Exception:
        dump = fr_dump(0)
    if not isinstance(dump, dict):  # (an earlier mutation made the dump a list, a number ...)
        dump = fr_dump(0)
    where = rng.choice(["entry", "entry", "entry", "pg", "top"])
    value = _pick_value(rng)
    if where == "pg":
        value = rng.choice([value, "[" + ", ".join(["1"] * 20_000) + "]", "[" * 50_000, "__import__('os')",
                            "[0, 1, 99999999999]", "(0, 1)"])
        pg = dump.get("pg_config")
        if not isinstance(pg, dict):  # (an earlier "top" mutation put a hostile value there)
            pg = dump["pg_config"] = {}
        if not isinstance(pg.get("0"), dict):
            pg["0"] = {}
        pg["0"]["ranks"] = value
    elif where == "top":
        dump[rng.choice(["version", "entries", "pg_config", "pg_status"])] = value
    elif isinstance(dump.get("entries"), list) and dump["entries"]:
        e = rng.choice(dump["entries"])
        if isinstance(e, dict):
            e[rng.choice(list(e) + ["record_id", "time_created_ns", "input_sizes"])] = value
    pickled = files[name][:1] == b"\x80"
    files[name] = _pickle(dump) if pickled and rng.random() < 0.8 else _dumps(dump)
    return files


def m_fr_structure(rng: random.Random, files: Files) -> Files:
    """Deep nesting, pickle length claims, shared-reference amplification, rank file names."""
    name = rng.choice(sorted(files) or ["fr_trace_0"])
    files.setdefault(name, b"")
    how = rng.choice(["deep_json", "deep_pickle", "claim", "amplify", "name", "bytes"])
    if how == "deep_json":
        files[name] = b'{"version": "2.10", "entries": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    elif how == "deep_pickle":
        files[name] = (b"\x80\x04}\x94(\x8c\x07version\x94\x8c\x042.10\x94\x8c\x07entries\x94"
                       + b"]\x94" * 100_000 + b"e" * 99_999 + b"u.")
    elif how == "claim":  # BINUNICODE8 claiming 2**40 bytes
        files[name] = b"\x80\x04\x8d" + (1 << 40).to_bytes(8, "little") + b"abc"
    elif how == "amplify":  # every entry references one entry with 3,000 shapes
        big = fr_entries(0, 1)[0]
        big["input_sizes"] = [[4, 4]] * 3000
        big["output_sizes"] = big["input_sizes"]
        files[name] = pickle.dumps({"version": "2.10", "entries": [big] * 20_000}, protocol=4)
    elif how == "name":
        new = rng.choice(["fr_trace_99999999999", "fr_trace_16777215", "fr_trace_9999999", "nccl_trace_rank_0"])
        files[new] = files.pop(name)
    else:
        files = m_bytes(rng, files)
    return files


FR_MUTATORS: list[Callable[[random.Random, Files], Files]] = [m_fr_field, m_fr_structure]


def mutate(seed_files: Files, mutators: list, choices: list[tuple[int, int]]) -> Files:
    """Apply mutators[i] with random.Random(s) for each (i, s): a mutant, reproducible from its choices."""
    files = dict(seed_files)
    for i, s in choices:
        files = mutators[i % len(mutators)](random.Random(s), files)
    return files


def write_mutant(files: Files, root: Path) -> Path:
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return root


def make_mutants(n: int, seed: int, out: Path) -> list[Path]:
    """``n`` mutants (about one in four of Flight Recorder dumps), reproducible from ``seed``."""
    rng = random.Random(seed)
    seeds = {"store": healthy_store(), "native": native_store(), "json": fr_dumps("json"), "pickle": fr_dumps("pickle")}
    paths = []
    for k in range(n):
        kind = rng.choice(["store", "native"]) if rng.random() < 0.75 else rng.choice(["json", "pickle"])
        mutators = STORE_MUTATORS if kind in ("store", "native") else FR_MUTATORS
        choices = [(rng.randrange(1 << 16), rng.randrange(1 << 32)) for _ in range(rng.choice([1, 1, 2, 3]))]
        paths.append(write_mutant(mutate(seeds[kind], mutators, choices), out / f"m{k:05d}"))
    return paths


# ------------------------------------------------------------------------------ worker
class _Timeout(BaseException):
    """Raised by the interval timer: a BaseException, so no ``except Exception`` swallows it."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise _Timeout()


def run_commands(path: str, timeout: float = TIMEOUT_S) -> list[dict]:
    """Every reader on ``path``; one dict per command that crashed or ran out of time: CPU
    time (``ITIMER_PROF``), which a loaded host does not stretch (a wall-clock limit failed
    a seed's first check, its imports included, on 2 cores shared with a test run); a
    command that waits instead of computing is the caller's ``Worker`` wall-clock limit's."""
    from commscope.cli import main as cli

    problems = []
    for command in COMMANDS:
        t0 = time.perf_counter()
        signal.setitimer(signal.ITIMER_PROF, timeout)
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                if command == "replay":
                    _replay_loader(path)
                else:
                    argv = {"check": ["check", path, "--json"], "check-text": ["check", path],
                            "report": ["report", path, "--json"],
                            "export": ["export", path, "--chrome", "-"]}[command]
                    cli(argv)
        except _Timeout:
            problems.append({"command": command, "error": f"timeout after {timeout:g} CPU-seconds"})
        except SystemExit:
            pass
        except BaseException as exc:  # noqa: BLE001 - that is what we are looking for
            tb = traceback.extract_tb(exc.__traceback__)
            where = next((f"{Path(f.filename).name}:{f.lineno}" for f in reversed(tb) if "commscope" in f.filename),
                         "?")
            problems.append({"command": command, "error": f"{type(exc).__name__}: {str(exc)[:160]}", "at": where,
                             "seconds": round(time.perf_counter() - t0, 2)})
        finally:
            signal.setitimer(signal.ITIMER_PROF, 0)
    return problems


def _replay_loader(path: str) -> None:
    """What ``commscope replay`` does before it draws: open, read everything, model, diagnose."""
    from commscope.analysis import TraceModel, diagnose
    from commscope.analysis.source import open_source
    from commscope.store import StoreError

    try:
        reader = open_source(path)
    except StoreError:
        return
    try:
        events = reader.read_all()
    except StoreError:
        return
    model = TraceModel.from_events(events)
    if hasattr(model, "note_read_stats"):
        model.note_read_stats(reader.stats)
    diagnose(model)


def worker(mem_mb: int, timeout: float) -> None:
    """Serve paths from stdin (one per line) with the address space capped; answer JSON lines."""
    import commscope.analysis.source  # noqa: F401  (imports counted in the baseline)
    import commscope.cli  # noqa: F401

    base = _vm_size()
    limit = base + (mem_mb << 20)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    signal.signal(signal.SIGPROF, _on_alarm)
    sys.setrecursionlimit(10_000)
    for line in sys.stdin:
        path = line.strip()
        if not path:
            continue
        t0 = time.perf_counter()
        problems = run_commands(path, timeout)
        print(json.dumps({"path": path, "problems": problems, "seconds": round(time.perf_counter() - t0, 3)}),
              flush=True)


def _vm_size() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


class Worker:
    """A capped worker process; restarted when it dies (killed for memory or time)."""

    def __init__(self, mem_mb: int = MEM_MB, timeout: float = TIMEOUT_S, code: str | None = None):
        self.mem_mb, self.timeout, self.code = mem_mb, timeout, code
        self.proc: subprocess.Popen | None = None

    def _start(self) -> subprocess.Popen:
        env = dict(os.environ)
        if self.code:
            env["PYTHONPATH"] = self.code + os.pathsep + env.get("PYTHONPATH", "")
        return subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--worker", "--mem-mb",
                                 str(self.mem_mb), "--timeout", str(self.timeout)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
                                cwd=tempfile.gettempdir())

    def run(self, path: Path) -> dict:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = self._start()
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{path}\n")
        self.proc.stdin.flush()
        import selectors

        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        ready = sel.select(timeout=self.timeout * len(COMMANDS) + 30)
        sel.close()
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            self.close()
            why = "worker died (memory cap or a fatal error)" if ready else "worker hung past every time limit"
            return {"path": str(path), "problems": [{"command": "?", "error": why}], "seconds": None}
        return json.loads(line)

    def close(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            self.proc = None


# ------------------------------------------------------------------------------ bench
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mutants", type=int, default=200, help="how many mutants (default 200)")
    p.add_argument("--seed", type=int, default=7, help="mutant generator seed (default 7)")
    p.add_argument("--mem-mb", type=int, default=MEM_MB, help=f"address space per worker (default {MEM_MB})")
    p.add_argument("--timeout", type=float, default=TIMEOUT_S, help=f"CPU-seconds per command (default {TIMEOUT_S:g})")
    p.add_argument("--code", metavar="DIR", help="run the readers of another checkout (its package root)")
    p.add_argument("--keep", metavar="DIR", help="write the mutants here and keep them")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    out = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="commscope-fuzz-"))
    paths = make_mutants(args.mutants, args.seed, out)
    w = Worker(args.mem_mb, args.timeout, args.code)
    crashed: list[dict] = []
    kinds: Counter = Counter()
    slowest = 0.0
    t0 = time.perf_counter()
    try:
        for p in paths:
            res = w.run(p)
            slowest = max(slowest, res.get("seconds") or 0.0)
            if res["problems"]:
                crashed.append(res)
                for prob in res["problems"]:
                    kinds[prob["error"].split(":")[0]] += 1
    finally:
        w.close()
        if not args.keep:
            shutil.rmtree(out, ignore_errors=True)
    summary = {"mutants": len(paths), "crashed": len(crashed), "crash_rate": round(len(crashed) / max(1, len(paths)), 4),
               "problems": sum(len(c["problems"]) for c in crashed), "by_error": dict(kinds.most_common()),
               "seed": args.seed, "mem_mb": args.mem_mb, "timeout_s": args.timeout,
               "slowest_mutant_s": slowest, "seconds": round(time.perf_counter() - t0, 1),
               "examples": [{"mutant": Path(c["path"]).name, **c["problems"][0]} for c in crashed[:12]]}
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"commscope bench fuzz: {summary['mutants']} mutants (seed {args.seed}), {summary['crashed']} crashed "
              f"({summary['crash_rate'] * 100:.1f}%), {summary['problems']} failing commands; slowest mutant "
              f"{slowest:.1f} s; {summary['seconds']} s in all (cap {args.mem_mb} MiB, {args.timeout:g} CPU-s/command)")
        for k, v in kinds.most_common():
            print(f"  {v:4d}  {k}")
        for ex in summary["examples"]:
            print(f"  {ex['mutant']}: {ex['command']}: {ex['error']} {ex.get('at', '')}")
    return 1 if crashed else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m commscope.bench.fuzz", description=__doc__,
                                formatter_class=helpformat.Formatter)
    add_arguments(p)
    args = p.parse_args(argv)
    if args.worker:
        worker(args.mem_mb, args.timeout)
        return 0
    return run(args)


if __name__ == "__main__":
    # Run as a file (so that --code can put another checkout first): this directory's
    # modules must not shadow top-level names.
    here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if not p or Path(p).resolve() != here]
    sys.exit(main())
