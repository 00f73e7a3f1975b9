"""Flight Recorder buffers of a job, collected beside its stacks.

Two places hold them:

- dump files: PyTorch writes a rank's buffer to ``<prefix><rank>`` when its watchdog sees a
  collective time out (NCCL), or when the job asks (``_dump_fr_trace_json``).  The prefix is
  the job's ``TORCH_FR_DUMP_TEMP_FILE`` (``TORCH_NCCL_DEBUG_INFO_TEMP_FILE`` in older
  releases), default ``/tmp/nccl_trace_rank_`` (``procs`` reads it with the rest of the rank's
  environment).  A dump older than its process is an earlier
  run's and is left alone;
- torch's debug server (``torch.distributed.debug.start_debug_server``): every rank serves
  its buffer at ``<url>/handler/fr_trace_json``, its url in the job's TCPStore
  (``MASTER_ADDR:MASTER_PORT``) under ``debug_server/rank<N>``.  Asked only for the ranks
  without a dump file, when one of them listens on every address (``may_serve``), with a
  short timeout; torch is imported for the store's client.

Either is read with ``analysis.flight_import`` (pickles as untrusted input) and turned into
the same op events ``commscope replay DIR`` shows.
"""

from __future__ import annotations

import dataclasses
import http.client
import os
import urllib.request
from datetime import timedelta

import psutil

from commscope.analysis.flight_import import MAX_DUMP_BYTES, dumps_to_events, load_dump, parse_dump
from commscope.snapshot.procs import FR_DEFAULT_PREFIX, RankProcess

#: Event types a dump contributes (the snapshot writes its own meta; its stacks are better).
_KEEP = frozenset({"op", "group"})


@dataclasses.dataclass(slots=True)
class Found:
    events: dict[int, list[dict]]  # rank -> its Flight Recorder op and group events
    note: str | None  # what was found or refused, for the summary


#: Seconds for the job's TCPStore and each rank's debug server to answer.
SERVER_TIMEOUT_S = 5.0


def dump_path(p: RankProcess) -> str:
    return f"{p.fr_prefix or FR_DEFAULT_PREFIX}{p.rank}"


def collect(ranks: list[RankProcess], job: str, server: bool = True) -> Found:
    """Every rank's buffer: its dump file, else (``server``) what torch's debug server answers."""
    dumps: dict[int, dict] = {}
    mtimes: dict[int, int] = {}
    bad: list[str] = []
    for p in ranks:
        path = dump_path(p)
        try:
            st = os.stat(path)
        except OSError:
            continue
        if st.st_mtime < p.create_time:
            continue  # an earlier run's dump
        try:
            dumps[p.rank] = load_dump(path)
            mtimes[p.rank] = st.st_mtime_ns
        except ValueError as exc:
            bad.append(str(exc))
    files = len(dumps)
    served = 0
    rest = [p for p in ranks if p.rank not in dumps]
    if server and rest and may_serve(rest):
        got, why = from_debug_server(rest)
        served = len(got)
        for rank, (dump, at) in got.items():
            dumps[rank], mtimes[rank] = dump, at
        bad += why
    if not dumps:
        return Found({}, f"unreadable Flight Recorder dumps: {'; '.join(bad[:3])}" if bad else None)
    out: dict[int, list[dict]] = {}
    for e in dumps_to_events(dumps, mtimes, job=job):
        if e.get("type") in _KEEP:
            out.setdefault(int(e["rank"]), []).append(e)
    where = [f"{files} from dump files"] if files else []
    where += [f"{served} from torch's debug server"] if served else []
    note = f"Flight Recorder dumps of {len(dumps)} rank(s) read ({', '.join(where)})"
    if bad:
        note += f"; unreadable: {'; '.join(bad[:3])}"
    return Found({r: out.get(r, []) for r in dumps}, note)


def may_serve(ranks: list[RankProcess]) -> bool:
    """Whether a rank listens on every address at a port other than the job's store: torch's
    debug server does ("::", an ephemeral port), Gloo and NCCL listen on one interface's
    address.  Asking the job's TCPStore needs torch (~1.5 s to import): only then."""
    for p in ranks:
        try:
            conns = psutil.Process(p.pid).net_connections("tcp")
        except (psutil.Error, OSError):
            return True  # cannot tell: ask
        if any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.ip in ("::", "0.0.0.0")
               and c.laddr.port != p.master[1] for c in conns):
            return True
    return False


def from_debug_server(ranks: list[RankProcess]) -> tuple[dict[int, tuple[dict, int]], list[str]]:
    """rank -> (its Flight Recorder buffer, when it was taken) from torch's debug server, and
    what went wrong; nothing when the job runs none (no ``debug_server/rank<N>`` key)."""
    import time

    addr, port = ranks[0].master
    if not addr or port is None:
        return {}, []
    try:
        import torch.distributed as dist

        store = dist.PrefixStore("debug_server", dist.TCPStore(
            addr, port, is_master=False, timeout=timedelta(seconds=SERVER_TIMEOUT_S), wait_for_workers=False))
    except Exception:  # no torch, no store there any more: no server to ask
        return {}, []
    out: dict[int, tuple[dict, int]] = {}
    bad: list[str] = []
    for p in ranks:
        key = f"rank{p.rank}"
        try:
            if not store.check([key]):
                continue
            url = store.get(key).decode() + "/handler/fr_trace_json"
        except Exception:
            continue
        try:
            req = urllib.request.Request(url, data=b"", method="POST")
            with urllib.request.urlopen(req, timeout=SERVER_TIMEOUT_S) as resp:  # noqa: S310 (the job's own server)
                data = resp.read(MAX_DUMP_BYTES + 1)
            if len(data) > MAX_DUMP_BYTES:
                raise ValueError(f"rank {p.rank}'s debug server answered more than {MAX_DUMP_BYTES} bytes")
            out[p.rank] = (parse_dump(data, f"rank {p.rank}'s debug server"), time.time_ns())
        except (OSError, ValueError, http.client.HTTPException) as exc:
            bad.append(f"rank {p.rank}'s debug server: {exc}"[:200])
    return out, bad
