"""Read a directory of PyTorch Flight Recorder dumps as commscope events.

Dumps come from ``torch._C._distributed_c10d._dump_fr_trace_json`` (JSON) or
``_dump_fr_trace`` / the NCCL watchdog (pickle), one file per rank whose name ends in
the rank number (``fr_trace_3``, ``nccl_trace_rank_3``), as ``fr_trace`` expects.
Pickles are untrusted input: ``SafeUnpickler`` refuses every global, so only plain
containers and scalars load and a malicious dump cannot run code.

Mapping onto the event model (``src: "fr-import"``):
- ``profiling_name`` ('nccl:all_reduce', 'nccl:send 0->1') -> op, dir and peer (the peer
  is a group rank in the name; mapped to a global rank through the group's ranks);
- ``collective_seq_id`` -> seq of collectives; p2p get commscope's own per
  (group, peer, dir) counter, counted in record order, so they match like live p2p;
- ``input_sizes``/``output_sizes``/dtypes -> shapes, dtypes and bytes;
- ``time_created_ns`` -> begin; ``time_discovered_completed_ns`` (or ``retired`` /
  ``state == completed``, approximate) -> end; anything else is still in flight;
- ``pg_config`` -> group membership; Gloo dumps leave it empty, so membership is then
  the ranks that logged the group (the default group: every dump);
- the dump file's mtime -> one heartbeat per rank: the time the snapshot was taken,
  which ``check`` judges the trace at.
"""

from __future__ import annotations

import io
import os
import pickle
import pickletools
import re
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec

from commscope.analysis.vocab import FR_IMPORT
from commscope.events import SCHEMA_VERSION, Event
from commscope.flightfmt import FrOp, as_int, completed_ns, finished, parse_name, tensor_fields, thread_id
from commscope.schema import MAX_INT, MAX_RANK, validate_events
from commscope.store import ReadStats, StoreError, TraceReader
from commscope.store.files import read_regular
from commscope.visible import visible

_RANK_SUFFIX = re.compile(r"(?<!\d)(\d{1,8})(\.(json|pkl|pickle))?$")
MAX_DUMP_BYTES = 256 << 20
#: A dump may expand to at most this many objects per byte of file (plus DUMP_SLACK), counting
#: an object again wherever it is referenced: pickle memo references cannot amplify it.
DUMP_OBJECTS_PER_BYTE = 4
DUMP_SLACK = 1 << 16
_ENTRY_PROBLEMS = frozenset({"bad time_created_ns", "bad record_id"})
MAX_DEPTH = 32  # FR dumps nest 4-5 levels (dump > entries > entry > sizes > shape)
#: Ranks named in a file name or pg_config beyond this many per dump read are not guessed at
#: (a default group is then the ranks seen, not range(max rank + 1)).
WORLD_PER_DUMP = 1024
_RANK_LIST = re.compile(r"\s*[\[(]?\s*(\d{1,8}\s*(,\s*\d{1,8}\s*)*,?)?\s*[\])]?\s*")

class SafeUnpickler(pickle.Unpickler):
    """Loads only plain containers and scalars: every class or function lookup is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from an untrusted Flight Recorder dump")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("refusing persistent ids in an untrusted Flight Recorder dump")


def _scan_pickle(data: bytes) -> None:
    """Walk the opcodes before unpickling: every length an opcode claims must be present
    in the data (a 2**40-byte string claim would otherwise be allocated first), and no
    opcode may build a class.  ``pickletools`` reads lengths without allocating them."""
    try:
        for op, _, _ in pickletools.genops(data):
            if op.name in ("GLOBAL", "STACK_GLOBAL", "INST", "OBJ", "NEWOBJ", "NEWOBJ_EX", "REDUCE", "BUILD",
                           "EXT1", "EXT2", "EXT4", "PERSID", "BINPERSID"):
                raise pickle.UnpicklingError(f"refusing {op.name} in an untrusted Flight Recorder dump")
    except ValueError as exc:  # a length past the end, a bad opcode
        raise pickle.UnpicklingError(str(exc)[:200]) from None


def safe_loads(data: bytes) -> Any:
    _scan_pickle(data)
    return SafeUnpickler(io.BytesIO(data)).load()


def check_size(obj: Any, budget: int) -> None:
    """Raise ValueError when ``obj`` nests deeper than MAX_DEPTH or, counting shared objects
    once per reference, holds more than ``budget`` objects (iterative: no recursion)."""
    stack = [(obj, 0)]
    seen = 0
    while stack:
        x, depth = stack.pop()
        seen += 1
        if seen > budget:
            raise ValueError(f"expands to more than {budget:,} objects")
        if isinstance(x, dict):
            if depth >= MAX_DEPTH:
                raise ValueError(f"nested deeper than {MAX_DEPTH}")
            stack.extend((v, depth + 1) for v in x.values())
            seen += len(x)
        elif isinstance(x, list | tuple):
            if depth >= MAX_DEPTH:
                raise ValueError(f"nested deeper than {MAX_DEPTH}")
            stack.extend((v, depth + 1) for v in x)
        elif isinstance(x, str | bytes) and len(x) > MAX_DUMP_BYTES:
            raise ValueError("a string larger than the dump limit")


def load_dump(path: str | os.PathLike) -> dict:
    """One dump file as a dict (JSON or restricted pickle); raises ValueError when it is not one.

    Bounded whatever the file holds: its size, what its opcodes claim, its nesting and
    how far shared references expand it (``check_size``).
    """
    p = Path(path)
    try:
        data = read_regular(p, MAX_DUMP_BYTES)
    except OSError as exc:
        raise ValueError(f"{p.name}: {exc.strerror or exc}") from None
    return parse_dump(data, p.name)


def parse_dump(data: bytes, name: str) -> dict:
    """A dump's bytes (a file's, or torch's debug server's answer) as a dict; ValueError when
    it is not one.  ``name`` says where it came from in the error."""
    head = data.lstrip()[:1]
    try:
        if head == b"{":
            obj = msgspec.json.decode(data)
        elif data[:1] == b"\x80":
            obj = safe_loads(data)
        else:
            raise ValueError(f"{name}: neither JSON nor pickle")
        check_size(obj, DUMP_OBJECTS_PER_BYTE * len(data) + DUMP_SLACK)
    except (pickle.UnpicklingError, msgspec.DecodeError, EOFError, UnicodeDecodeError, ValueError, TypeError,
            IndexError, KeyError, AttributeError, OverflowError, RecursionError, MemoryError) as exc:
        raise ValueError(f"{name}: {str(exc)[:200] or type(exc).__name__}") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("entries", []), list) or "version" not in obj:
        raise ValueError(f"{name}: not a Flight Recorder dump")
    return obj


def dump_files(path: str | os.PathLike) -> dict[int, Path]:
    """rank -> dump file for every file in ``path`` whose name ends in a rank number."""
    p = Path(path)
    out: dict[int, Path] = {}
    if not p.is_dir():
        return out
    for f in sorted(p.iterdir()):
        if not f.is_file() or f.name.startswith("."):
            continue
        m = _RANK_SUFFIX.search(f.name)
        if m and int(m.group(1)) <= MAX_RANK:
            out.setdefault(int(m.group(1)), f)
    return out


def looks_like_fr_dir(path: str | os.PathLike) -> bool:
    for f in dump_files(path).values():
        try:
            with open(f, "rb") as fh:
                head = fh.read(64).lstrip()
        except OSError:
            continue
        if head[:1] == b"{" or head[:1] == b"\x80":
            return True
    return False


def _ranks_of(cfg: Any) -> list[int] | None:
    """A pg_config entry's ranks: a list, or its text '[0, 1, 2]' (parsed by a regular
    expression, never evaluated)."""
    ranks = cfg.get("ranks") if isinstance(cfg, dict) else None
    if isinstance(ranks, str):
        if not _RANK_LIST.fullmatch(ranks):
            return None
        ranks = [int(x) for x in re.findall(r"\d+", ranks)]
    if isinstance(ranks, list | tuple) and ranks and all(as_int(r, 0, MAX_RANK) is not None for r in ranks):
        return list(dict.fromkeys(ranks))
    return None


def _site(frames: Any) -> str | None:
    if not isinstance(frames, list):
        return None
    for f in frames:
        if not isinstance(f, dict):
            continue
        fn = str(f.get("filename", ""))
        if "/torch/" in fn or "/commscope/" in fn or not fn:
            continue
        return f"{fn}:{f.get('line')} in {f.get('name')}"
    return None


def dumps_to_events(dumps: dict[int, dict], mtimes: dict[int, int] | None = None,
                    job: str = "flight-recorder", skipped: dict[int, Counter] | None = None,
                    warnings: list[str] | None = None) -> list[Event]:
    """Convert per-rank dumps to schema events, per-rank order preserved.  Entries that are
    not entries are left out and counted in ``skipped`` (rank -> reason -> count); a stack
    that cannot be read is said in ``warnings`` (its entry's op is read: nothing is lost
    that ``check`` judges by)."""
    mtimes = mtimes or {}
    world = max(dumps) + 1 if dumps else 0
    if world > WORLD_PER_DUMP * len(dumps):  # a rank number far beyond the dumps read: no guess
        world = 0
    # group membership: pg_config where it says, else the ranks that logged the group
    members: dict[str, list[int]] = {}
    default_ranks: list[int] | None = None
    seen: dict[str, set[int]] = {}
    descs: dict[str, str] = {}
    for rank, d in dumps.items():
        cfg = d.get("pg_config") or {}
        if isinstance(cfg, dict):
            for name, c in cfg.items():
                ranks = _ranks_of(c)
                if ranks and name:
                    members.setdefault(str(name), ranks)
                elif ranks:  # Gloo: one nameless entry, the default group's ranks
                    default_ranks = ranks
        listed = d.get("entries")
        for e in listed if isinstance(listed, list) else ():
            pg = e.get("process_group") if isinstance(e, dict) else None
            if isinstance(pg, list | tuple) and pg:
                g = str(pg[0])
                seen.setdefault(g, set()).add(rank)
                if len(pg) > 1:
                    descs[g] = str(pg[1])
    for g, rs in seen.items():
        if g not in members:
            everyone = default_ranks or (list(range(world)) if world else sorted(dumps))
            members[g] = everyone if descs.get(g) == "default_pg" else sorted(rs)
    out: list[Event] = []
    for rank in sorted(dumps):
        d = dumps[rank]
        listed = d.get("entries") or []
        entries = [e for e in listed if isinstance(e, dict)] if isinstance(listed, list) else []
        if len(entries) != (len(listed) if isinstance(listed, list) else 1) and skipped is not None:
            skipped.setdefault(rank, Counter())["fr entry: not an object"] += (
                len(listed) - len(entries) if isinstance(listed, list) else 1)
        created = [t for t in (as_int(e.get("time_created_ns")) for e in entries) if t is not None]
        t_meta = min(created) if created else mtimes.get(rank, 0)
        backend = next((parse_name(str(e.get("profiling_name", "")))[0] for e in entries), "") or "?"
        out.append({"v": SCHEMA_VERSION, "type": "meta", "rank": rank, "ts": t_meta, "world_size": world or None,
                    "backend": backend, "job": job, "fr_version": str(d.get("version")), "src": FR_IMPORT,
                    "sample_interval": 1.0})
        announced: set[str] = set()
        p2p_seq: dict[tuple, int] = {}
        stuck_first: int | None = None
        frames_of: dict[int, Any] = {}
        for e in entries:
            try:
                ev = _entry_events(e, rank, members, announced, p2p_seq)
            except (TypeError, ValueError, KeyError, OverflowError) as exc:
                if skipped is not None:
                    why = str(exc) if isinstance(exc, ValueError) and str(exc) in _ENTRY_PROBLEMS else type(exc).__name__
                    skipped.setdefault(rank, Counter())[f"fr entry: {why}"] += 1
                continue
            for x in ev:
                out.append(x)
            if ev and ev[-1].get("phase") == "begin" and stuck_first is None:
                stuck_first = ev[-1]["id"]
                frames_of[stuck_first] = e.get("frames")
                if not isinstance(frames_of[stuck_first], list | None) and warnings is not None:
                    warnings.append(f"rank {rank}: the stack of its first Flight Recorder entry in flight could not "
                                    "be read (its frames are not a list): its op is read, without a stack")
        ts_end = mtimes.get(rank) or (max(created) if created else 0)
        if stuck_first is not None and isinstance(frames_of.get(stuck_first), list) and frames_of[stuck_first]:
            frames = [[str(f.get("filename")), f.get("line"), str(f.get("name"))]
                      for f in frames_of[stuck_first] if isinstance(f, dict)]
            out.append({"v": SCHEMA_VERSION, "type": "stack", "rank": rank, "ts": ts_end, "id": stuck_first,
                        "threads": [{"tid": 0, "name": "flight recorder", "frames": frames, "op_thread": True}]})
        if ts_end:
            out.append({"v": SCHEMA_VERSION, "type": "heartbeat", "rank": rank, "ts": ts_end, "inflight": 0})
    return out


def _entry_events(e: dict, rank: int, members: dict[str, list[int]], announced: set[str],
                  p2p_seq: dict[tuple, int]) -> list[Event]:
    fr = FrOp(e, members.get)
    group = fr.group
    created = as_int(e.get("time_created_ns"))
    if created is None:
        raise ValueError("bad time_created_ns")
    out: list[Event] = []
    if group not in announced:
        announced.add(group)
        out.append({"v": SCHEMA_VERSION, "type": "group", "rank": rank, "ts": created, "group": group,
                    "granks": members.get(group, [])})
        if fr.desc is not None:
            out[-1]["desc"] = fr.desc
    record_id = as_int(e.get("record_id", 0), 0, MAX_INT - 1)
    if record_id is None:
        raise ValueError("bad record_id")
    op_id = record_id + 1
    begin: Event = {"v": SCHEMA_VERSION, "type": "op", "rank": rank, "ts": created, "phase": "begin", "id": op_id,
                    "op": fr.op, "group": group, "src": FR_IMPORT, **tensor_fields(e)}
    tid = thread_id(e)
    if tid is not None:
        begin["tid"] = tid
    site = _site(e.get("frames"))
    if site:
        begin["site"] = site
    if fr.is_p2p:
        direction = fr.direction or "send"
        begin["dir"] = direction
        if fr.peer is not None:
            begin["peer"] = fr.peer
            key = (group, fr.peer, direction)
            begin["seq"] = p2p_seq[key] = p2p_seq.get(key, 0) + 1
    elif as_int(e.get("collective_seq_id")) is not None:
        begin["seq"] = e["collective_seq_id"]
    out.append(begin)
    done_ns = completed_ns(e)
    if done_ns:
        out.append({"v": SCHEMA_VERSION, "type": "op", "rank": rank, "ts": done_ns, "phase": "end", "id": op_id})
    elif finished(e):
        out.append({"v": SCHEMA_VERSION, "type": "op", "rank": rank, "ts": created, "phase": "end", "id": op_id,
                    "approx": True})
    return out


class FlightRecorderReader(TraceReader):
    """A reader over a directory of FR dumps: the first ``poll`` returns them all (a dump
    is a snapshot: there is nothing to follow, and no budget to honour)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.description = f"Flight Recorder dumps in {self.path}"
        self.stats = ReadStats()
        self._done = False
        self._job: dict | None = None

    def _load(self) -> list[Event]:
        files = dump_files(self.path)
        if not files:
            raise StoreError(f"{self.path} holds no Flight Recorder dumps (files named <prefix><rank>)")
        dumps: dict[int, dict] = {}
        mtimes: dict[int, int] = {}
        for rank, f in files.items():
            try:
                dumps[rank] = load_dump(f)
                mtimes[rank] = f.stat().st_mtime_ns
            except (ValueError, OSError) as exc:
                self.stats.count_corrupt(rank, 1)
                self.stats.warnings.append(visible(f"rank {rank}: skipped {f.name}: {exc}"))  # (a file's name)
        if not dumps:
            raise StoreError(f"{self.path}: no readable Flight Recorder dump "
                             f"({'; '.join(self.stats.warnings[:3])})")
        by_rank: dict[int, list[Event]] = {}
        skipped: dict[int, Counter] = {}
        for ev in dumps_to_events(dumps, mtimes, job=self.path.name, skipped=skipped, warnings=self.stats.warnings):
            by_rank.setdefault(ev["rank"], []).append(ev)
        events: list[Event] = []
        for rank, evs in by_rank.items():  # the one schema every reader validates against
            good, invalid = validate_events(evs, rank)
            self.stats.count_invalid(rank, invalid)
            events.extend(good)
        for rank, reasons in skipped.items():
            self.stats.count_invalid(rank, reasons)
        versions = sorted({str(d.get("version"))[:64] for d in dumps.values()})
        self._job = {"job": self.path.name, "world_size": max(dumps) + 1, "source": "flight-recorder",
                     "fr_version": versions}
        self.stats.events += len(events)
        return events

    def poll(self, max_bytes: int | None = None) -> list[Event]:
        if self._done:
            return []
        self._done = True
        return self._load()

    def job(self) -> dict | None:
        return self._job
