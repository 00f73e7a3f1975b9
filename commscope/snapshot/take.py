"""Taking a snapshot: samples of every rank's stacks, written as an ordinary trace.

One *cycle* is ``count`` samples ``interval`` apart.  Each rank's stream gets:

- its ``meta`` (``recorder: "snapshot"``, ``hang_after``: the cycle's span, so an op the
  rank was seen inside at every sample counts as stuck, and one seen once does not when
  there were several samples; with one sample, every op seen counts) and the default
  group (every rank of the world);
- per sample: a ``stack`` (``reason: "snapshot"``; native frames at the last sample, where
  py-spy can: a native dump of a torch process costs ~0.3 s, a Python one ~20 ms)
  and a ``sample`` (CPU % and RSS from psutil);
- the op it was inside at the last sample (``infer``), begun at the first sample of the
  run of samples that showed it, ``src: "snapshot"``, its ``seq`` the cycle number (the
  same for every rank of the cycle: a snapshot knows no op history, so the ops of one cycle
  are matched with each other and nothing else).  The op of an earlier cycle ends where
  the next cycle starts (``approx``: only a bound);
- a rank this host should hold whose process is gone: its ``meta`` and an ``exit``
  (``reason: "gone"``, ``src: "snapshot"``);
- a rank py-spy could not read (no permission to attach, py-spy failing): its ``meta`` and
  one ``stack`` without threads whose ``reason`` says why (``analysis.vocab.UNREAD``), so
  ``check`` knows it is there, unread, and not on a host nobody snapshotted;
- a rank read, then not by the cycle's last sample: gone since (its process ended, or is
  a zombie), its stacks read and an ``exit`` just after the last sample that read it; else
  (stopped, py-spy failing) its stacks read, the op it was last seen inside, and the
  unread ``stack`` last.  Before, it was written as in no op: a rank killed mid-snapshot,
  or a victim stopped, and the job read healthy (helper-171).  Unread at every sample of a
  later cycle (``attach --pid``), it stays in the op it was last read inside, that cycle's
  instance (before, its op ended there, and the victim was named missing, helper-174).

An op counts as stuck from the first sample of the run that showed it, but never from
before a sample at which a rank outside it was seen going through that collective (inside
it, or past its call): the job was progressing then (``_progress``).

Where every live rank wrote a Flight Recorder dump (``flight``), its ops replace the
inferred ones: they carry real sequence numbers and the ops before the hang.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import socket
import sys
import time
from collections.abc import Callable

import psutil

from commscope import __version__, events
from commscope.analysis.vocab import SNAPSHOT, unread_reason
from commscope.redact import Redactor, default, redact
from commscope.schema import redact_event
from commscope.snapshot import flight, pyspy
from commscope.snapshot.infer import (
    DDP_REDUCER,
    DEFAULT_GROUP,
    InFlight,
    has_native,
    in_backward,
    in_flight,
    waiting_in_backward,
)
from commscope.snapshot.procs import Job
from commscope.store import StoreError, StoreWriter, open_writer, redact_store

MAX_FRAMES = 128
#: hang_after of a one-sample snapshot: every op seen in flight counts (0 would read as "not said")
ONE_SAMPLE = 1e-6
#: py-spy processes at once
DUMPERS = 8
#: A cycle's op ids are this plus the cycle's number: apart from the Flight Recorder entries'
#: (record ids + 1) a rank's stream may hold from the first cycle (a reused id reads as a
#: damaged trace: ``analysis/opids``)
OP_IDS = 1 << 50


@dataclasses.dataclass(frozen=True, slots=True)
class Sample:
    ts: int
    threads: list[pyspy.PyThread] | None
    error: pyspy.DumpError | None
    op: InFlight | None
    cpu: float | None
    rss: int | None


@dataclasses.dataclass(slots=True)
class Cycle:
    """What one cycle saw, for the command to print."""

    number: int
    started_ns: int
    ended_ns: int
    ops: dict[int, InFlight]  # rank -> the op it stayed inside
    gone: list[int]
    #: ranks not read at the last sample, and why (those read before: ``ops`` says the op they
    #: were last seen inside)
    failed: dict[int, pyspy.DumpError]
    flight: list[int]  # ranks whose ops came from a Flight Recorder dump
    flight_note: str | None = None
    #: ranks in no op at the last sample but inside autograd's backward: rank -> (the user's
    #: call, whether that sample had native frames, without which DDP's all_reduce is not seen)
    backward: dict[int, tuple[str | None, bool]] = dataclasses.field(default_factory=dict)


class Snapshotter:
    """Samples one job's ranks and writes them to a store, one cycle at a time."""

    def __init__(self, job: Job, store: str, job_id: str, *, count: int = 3, interval: float = 1.0,
                 native: bool = True, use_flight: bool = True, host: str | None = None):
        self.job, self.store, self.job_id = job, store, job_id
        self.count, self.interval = max(1, count), max(0.0, interval)
        self.native, self.use_flight = native, use_flight
        self.host = host or socket.gethostname()
        self.writers: dict[int, StoreWriter] = {}
        self.cycles = 0
        self._open: dict[int, int] = {}  # rank -> id of its op still open (from the last cycle)
        self._last_op: dict[int, InFlight] = {}  # rank -> the op it was in at the last cycle (read, or as last read)
        self._groups: dict[int, set[str]] = {}  # rank -> groups announced in its stream
        self._procs = {p.rank: _process(p.pid) for p in job.ranks}
        self._native_ok = native
        self._gone_written: set[int] = set()
        self._redactors = {p.rank: p.redactor() for p in job.ranks}

    def _redactor(self, rank: int) -> Redactor:
        """The rank's redaction: this process's, knowing the rank's environment's secrets."""
        hide = self._redactors.get(rank)
        return hide if hide is not None else self._redactors.setdefault(rank, default())

    @property
    def span_s(self) -> float:
        return (self.count - 1) * self.interval

    # ------------------------------------------------------------------ sampling
    def _sample(self, rank: int, pid: int, native: bool, ts: int) -> Sample:
        threads: list[pyspy.PyThread] | None = None
        error = None
        native = native and self._native_ok
        try:
            threads = pyspy.dump(pid, native=native, locals_=True)
        except pyspy.DumpError as exc:
            error = exc
            if native and exc.kind == pyspy.FAILED:  # native unwinding fails on some builds
                try:
                    threads, error = pyspy.dump(pid, native=False, locals_=True), None
                    self._native_ok = False
                except pyspy.DumpError as again:
                    error = again
        cpu = rss = None
        p = self._procs.get(rank)
        if p is not None:
            try:
                cpu = p.cpu_percent(None)
                rss = p.memory_info().rss
            except psutil.Error:
                pass
        return Sample(ts, threads, error, in_flight(threads) if threads else None, cpu, rss)

    def cycle(self, progress: Callable[[int, int], None] | None = None) -> Cycle:
        """``count`` samples of every rank, written; the cycle's summary."""
        self.cycles += 1
        k = self.cycles
        ranks = [p for p in self.job.ranks if p.rank not in self._gone_written]
        samples: dict[int, list[Sample]] = {p.rank: [] for p in ranks}
        started = time.time_ns()
        total = self.count * len(ranks)
        done = 0
        recorded = None  # the job's Flight Recorder buffers, read while the samples are taken
        if self.use_flight and k == 1:
            pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="commscope-flight")
            recorded = pool.submit(flight.collect, ranks, self.job_id)
            pool.shutdown(wait=False)
        # the ranks of one sample are dumped at once (py-spy is a process each): closer to one
        # moment, and as many times faster as the host has cores to spare
        with concurrent.futures.ThreadPoolExecutor(min(DUMPERS, len(ranks) or 1),
                                                   thread_name_prefix="commscope-dump") as dumpers:
            for i in range(self.count):
                t0 = time.monotonic()
                # native frames (~0.3 s a dump of a torch process: symbols) at the last sample only
                native = self.native and i + 1 == self.count
                # every rank's sample is timed at the round's start: rounds are at least
                # ``interval`` apart, so an op seen at every round spans ``span_s`` exactly or
                # more, whatever each dump's own delay on a loaded host
                at = time.time_ns()
                taken = dumpers.map(self._sample, [p.rank for p in ranks], [p.pid for p in ranks],
                                    [native] * len(ranks), [at] * len(ranks))
                for p, sample in zip(ranks, taken, strict=True):
                    samples[p.rank].append(sample)
                    done += 1
                    if progress is not None:
                        progress(done, total)
                if i + 1 < self.count:
                    time.sleep(max(0.0, self.interval - (time.monotonic() - t0)))
        ended = time.time_ns()
        return self._write(k, started, ended, samples, recorded.result() if recorded is not None else None)

    # ------------------------------------------------------------------ writing
    def _writer(self, rank: int) -> StoreWriter:
        w = self.writers.get(rank)
        if w is None:
            w = self.writers[rank] = open_writer(self.store, self.job_id, rank, job_meta={
                "created": time.time_ns(), "world_size": self.job.world_size, "schema": events.SCHEMA_VERSION,
                "commscope": __version__, "host": self.host, "recorder": SNAPSHOT})
        return w

    def _meta(self, rank: int, ts: int, pid: int | None, argv: tuple[str, ...]) -> dict:
        m = {"v": events.SCHEMA_VERSION, "type": events.META, "rank": rank, "ts": ts, "host": self.host, "pid": pid,
             "world_size": self.job.world_size, "backend": None, "torch": None, "commscope": __version__,
             "python": sys.version.split()[0], "job": self.job_id, "hang_after": self.span_s or ONE_SAMPLE,
             "sample_interval": self.interval or 1.0, "argv": list(argv)[:16],  # (redacted as written)
             "store": redact_store(self.store), "recorder": SNAPSHOT}
        local = next((p.local_rank for p in self.job.ranks if p.rank == rank), None)
        if local is not None:
            m["local_rank"] = local
        return m

    def _group(self, rank: int, ts: int, name: str, granks: list[int]) -> list[dict]:
        seen = self._groups.setdefault(rank, set())
        if name in seen:
            return []
        seen.add(name)
        return [{"v": events.SCHEMA_VERSION, "type": events.GROUP, "rank": rank, "ts": ts, "group": name,
                 "granks": granks}]

    def _write(self, k: int, started: int, ended: int, samples: dict[int, list[Sample]],
               recorded: flight.Found | None) -> Cycle:
        v = events.SCHEMA_VERSION
        gone = [r for r in self.job.gone if r not in self._gone_written]
        # when each went: before the cycle (not there when it began), or during it (its end:
        # only ranks seen alive in a later cycle then make it a death, not a job ending)
        went = dict.fromkeys(gone, started)
        out: dict[int, list[dict]] = {}
        ops: dict[int, InFlight] = {}
        failed: dict[int, pyspy.DumpError] = {}
        firsts: dict[int, int] = {}
        backward: dict[int, tuple[str | None, bool]] = {}
        died: set[int] = set()  # read, then gone before the cycle's last sample
        for rank, ss in samples.items():
            ok = [s for s in ss if s.threads is not None]
            if not ok:
                failed[rank] = ss[-1].error or pyspy.DumpError(pyspy.FAILED, "no sample")
                if failed[rank].kind == pyspy.GONE:
                    gone.append(rank)  # it ended while the snapshot looked
                    went[rank] = ended
                elif rank in self._open and rank in self._last_op:  # (unread this cycle: as last read, in the
                    ops[rank], firsts[rank] = self._last_op[rank], started  # op of the cycle before; helper-174)
                continue
            read = ss[:ss.index(ok[-1]) + 1]  # (up to its last sample read)
            if len(read) < len(ss):  # read, then not: it ended, or could no longer be read (helper-171)
                error = ss[-1].error or pyspy.DumpError(pyspy.FAILED, "no sample")
                if error.kind == pyspy.GONE:
                    gone.append(rank)
                    died.add(rank)
                    # (timed by its last sign of life, as a spool's unseen death is: found gone at a
                    # sample that saw the others there, it went before them)
                    went[rank] = read[-1].ts + 1
                    continue
                failed[rank] = error  # there, unread at the end: as last read, and said unread
            last = read[-1]
            if last.op is not None:
                ops[rank] = last.op
                # one sample a cycle: every op seen counts as stuck (hang_after ~0), from the cycle's start
                firsts[rank] = _tail_run(read)[0].ts if self.count > 1 else started
            elif (bw := in_backward(last.threads)) is not None:
                backward[rank] = (bw[1], has_native(last.threads))
        if self.count > 1:
            for rank, since in _progress(samples, ops).items():
                firsts[rank] = max(firsts[rank], since)
        # ops on a group passed by object: its members are the ranks seen in the same call
        unknown: dict[str, list[int]] = {}
        for rank, op in ops.items():
            if op.group is None:
                unknown.setdefault(_unknown_group(op, k), []).append(rank)
        fr_events, fr_ranks, fr_note = self._flight(samples, recorded)
        for p in self.job.ranks:
            rank = p.rank
            if (rank in gone and rank not in died) or rank not in samples:
                continue
            evs = out.setdefault(rank, [])
            if k == 1 or rank not in self._groups:
                evs.append(self._meta(rank, started, p.pid, p.argv))
                evs += self._group(rank, started, DEFAULT_GROUP, list(range(self.job.world_size)))
            prev = self._open.pop(rank, None)
            if prev is not None:
                evs.append({"v": v, "type": events.OP, "rank": rank, "ts": started, "id": prev, "phase": events.END,
                            "approx": True})
            unread = [] if rank not in failed else [{  # there, alive, unread: said so (not taken for a rank on
                "v": v, "type": events.STACK, "rank": rank, "ts": samples[rank][-1].ts, "threads": [],  # another host)
                "reason": unread_reason(failed[rank].kind, redact(str(failed[rank])))}]
            for s in samples[rank]:
                if s.threads is None:
                    continue
                evs.append({"v": v, "type": events.STACK, "rank": rank, "ts": s.ts, "reason": SNAPSHOT,
                            "threads": _threads(s.threads, s.op, p.pid)})
                if s.cpu is not None or s.rss is not None:
                    sample = {"v": v, "type": events.SAMPLE, "rank": rank, "ts": s.ts}
                    if s.cpu is not None:
                        sample["cpu"] = float(s.cpu)
                    if s.rss is not None:
                        sample["rss"] = int(s.rss)
                    evs.append(sample)
            evs += unread  # (after the stacks read before: the rank's last stack says it is unread)
            if rank in died:
                continue  # (its exit follows)
            if rank in fr_ranks:
                evs += [dict(e, rank=rank) for e in fr_events.get(rank, [])]
                continue
            op = ops.get(rank)
            if op is None:
                continue
            group = op.group or _unknown_group(op, k)
            if op.group is None:
                evs += self._group(rank, firsts[rank], group, sorted(unknown[group]))
            ev = {"v": v, "type": events.OP, "rank": rank, "ts": firsts[rank], "id": OP_IDS + k, "phase": events.BEGIN,
                  "op": op.op, "group": group, "seq": k, "src": SNAPSHOT, "tid": op.tid}
            if op.site:
                ev["site"] = redact(op.site)
            if op.direction:
                ev["dir"] = op.direction
                if op.peer is not None:
                    ev["peer"] = op.peer
            if op.root is not None:
                ev["root"] = op.root
            evs.append(ev)
            self._open[rank] = OP_IDS + k
        for rank in gone:
            self._gone_written.add(rank)
            pid = next((p.pid for p in self.job.ranks if p.rank == rank), None)
            argv = next((p.argv for p in self.job.ranks if p.rank == rank), ())
            evs = out.setdefault(rank, [])
            if rank not in self._groups:
                evs.append(self._meta(rank, started, pid, argv))
                evs += self._group(rank, started, DEFAULT_GROUP, list(range(self.job.world_size)))
            evs.append({"v": v, "type": events.EXIT, "rank": rank, "ts": went[rank], "reason": events.GONE, "src": SNAPSHOT})
        for rank in sorted(out):
            hide = self._redactor(rank)  # (the rank's text: its argv, stacks, sites, what py-spy said)
            lines = [events.encode(redact_event(e, hide)) for e in out[rank]]
            if lines:
                self._writer(rank).write(lines)
        self._last_op = dict(ops)
        return Cycle(k, started, ended, ops, sorted(gone), failed, sorted(fr_ranks), fr_note, backward)

    def _flight(self, samples: dict[int, list[Sample]], found: flight.Found | None
                ) -> tuple[dict[int, list[dict]], set[int], str | None]:
        """Flight Recorder ops per rank, used only when every live rank has some (their
        sequence numbers match only each other's)."""
        if found is None or not found.events:
            return {}, set(), found.note if found is not None else None
        live = {r for r, ss in samples.items() if ss and ss[-1].error is None}
        if not live <= set(found.events):
            return {}, set(), (f"Flight Recorder dumps of ranks {sorted(set(found.events) & live)} only: not used "
                               "(the other ranks' ops could not be matched against them)")
        return found.events, live, found.note

    def close(self) -> None:
        for w in self.writers.values():
            try:
                w.close()
            except (StoreError, OSError):
                pass
        self.writers.clear()


def _tail_run(ss: list[Sample]) -> list[Sample]:
    """The samples at the end that show the same op as the last one (failed samples skipped).
    DDP's all_reduce is seen only in native frames, taken at the last sample: the samples
    before it without native frames that show the same backward call (thread and site) are
    the same op as far as they can tell."""
    last = ss[-1].op
    key = last.key() if last is not None else None
    run: list[Sample] = []
    for s in reversed(ss):
        if s.threads is None:
            continue
        same = s.op is not None and s.op.key() == key
        if not same and s.op is None and last is not None and last.via == DDP_REDUCER and not has_native(s.threads):
            same = in_backward(s.threads) == (last.tid, last.site)
        if not same:
            break
        run.append(s)
    return list(reversed(run))


def _progress(samples: dict[int, list[Sample]], ops: dict[int, InFlight]) -> dict[int, int]:
    """rank -> the earliest its collective may count as begun, where the samples show the job
    going through that collective while the rank waited in it: a rank of the group outside it
    at the last sample was seen inside it (for DDP's all_reduce: inside backward, where its
    reducer issues it), or its frame of the function making the call moved from before the
    call's line to after it between two samples.  Such a rank is on its way, not one that never
    entered: the waiting counts only from the sample after the last sign of it (at the last
    sample: not stuck).  Only the default group's members are known (all ranks)."""
    out: dict[int, int] = {}
    still = {other: _still_from(ss) for other, ss in samples.items()}  # (each rank's once, not once a waiter)
    for rank, op in ops.items():
        if op.direction is not None or op.group != DEFAULT_GROUP:
            continue
        ts = [s.ts for s in samples[rank]]
        for other, ss in samples.items():
            theirs = ops.get(other)
            if other == rank or (theirs is not None and (theirs.op, theirs.group) == (op.op, op.group)):
                continue
            seen = [i for i, s in enumerate(ss[:still[other]]) if s.threads is not None and (
                _inside(s, op) or (i > 0 and ss[i - 1].threads is not None and _passed(ss[i - 1], s, op.site)))]
            if seen:
                out[rank] = max(out.get(rank, 0), ts[min(seen[-1] + 1, len(ts) - 1)])
    return out


def _inside(s: Sample, op: InFlight) -> bool:
    if s.op is not None and s.op.direction is None and (s.op.op, s.op.group) == (op.op, op.group):
        return True
    return op.via == DDP_REDUCER and s.threads is not None and in_backward(s.threads) is not None


def _still_from(ss: list[Sample]) -> int:
    """Where a rank's samples stop showing it on its way: from the first of the samples at
    the end that show the same Python frames as the last one, where the last one's native
    frames show it waiting inside backward (a lock, a condition: a hook stuck, not autograd
    computing); else past the end.  Inside backward at every sample was taken as going
    through DDP's all_reduce, and a hung DDP job read healthy (helper-71)."""
    last = ss[-1] if ss else None
    if last is None or last.threads is None or not waiting_in_backward(last.threads):
        return len(ss)
    k = len(ss) - 1
    while k > 0 and ss[k - 1].threads is not None and _python_frames(ss[k - 1]) == _python_frames(last):
        k -= 1
    return k


def _python_frames(s: Sample) -> tuple:
    """Every thread's Python frames of a sample (native ones come at the last sample only)."""
    return tuple((t.tid, tuple((f.file, f.line, f.func) for f in t.frames if not f.native)) for t in s.threads or ())


def _passed(before: Sample, after: Sample, site: str | None) -> bool:
    """The frame of the function at ``site`` ('file:line in func') was before its line at one
    sample and after it at the next: it went past the call."""
    if not site or " in " not in site:
        return False
    where, func = site.rsplit(" in ", 1)
    file, _, line = where.rpartition(":")
    if not line.isdigit():
        return False
    a, b = _line_in(before, file, func), _line_in(after, file, func)
    return a is not None and b is not None and a < int(line) < b


def _line_in(s: Sample, file: str, func: str) -> int | None:
    for t in s.threads or ():
        for f in reversed(t.frames):
            if not f.native and f.file == file and f.func == func:
                return f.line
    return None


def _unknown_group(op: InFlight, cycle: int) -> str:
    """A group passed by object: named after the call site (and the cycle after the first:
    its members are the ranks seen there in that cycle, and a group's members are fixed)."""
    name = f"?{os.path.basename((op.site or '?').split(' in ')[0])}"
    return name if cycle == 1 else f"{name}@{cycle}"


def _threads(threads: list[pyspy.PyThread], op: InFlight | None, pid: int) -> list[dict]:
    main = op.tid if op is not None else next((t.tid for t in threads if t.tid == pid), threads[0].tid if threads else 0)
    out = []
    for t in threads:
        frames = [[f.file, f.line, f.func] for f in t.frames][-MAX_FRAMES:]
        d = {"tid": t.tid, "name": t.name or ("MainThread" if t.tid == pid else str(t.tid)), "frames": frames}
        if t.tid == main:
            d["op_thread"] = True
        out.append(d)
    return out


def _process(pid: int) -> psutil.Process | None:
    try:
        p = psutil.Process(pid)
        p.cpu_percent(None)  # the first call starts the measurement
        return p
    except psutil.Error:
        return None



class Repeating:
    """Cycles of a ``Snapshotter`` on a thread until stopped: ``commscope attach --pid``'s
    source.  Each cycle's ops end where the next begins, so the console shows each rank's
    collective as one span per cycle and judges the latest."""

    def __init__(self, snap: Snapshotter):
        import threading

        self.snap = snap
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="commscope-snapshots", daemon=True)

    def start(self) -> Repeating:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self.snap.cycle()
        except StoreError as exc:
            self.error = f"cannot write the snapshots: {exc}"
        except Exception as exc:  # the console must not wait on a thread that died unseen
            self.error = f"snapshots stopped: {type(exc).__name__}: {exc}"
        finally:
            self.snap.close()

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        self._thread.join(timeout)
