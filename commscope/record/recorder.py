"""The Recorder: one background thread per rank that moves recorded ops into the store.

What an op costs the training thread depends on the op source:

- ``nativeops.NativeOps`` (the default where commscope_native builds): a C++ kernel sees
  every c10d collective, whoever issues it, and appends a packed record; thin C wrappers
  give it the torch.distributed name and the call site.  The thread moves the packed
  records into the trace as they are, one ``block`` event per tick.
- ``pyhot.PythonOps`` (the fallback): the wrappers do the work in Python and queue
  records that the thread turns into JSON events one by one; collectives issued from C++
  arrive only through Flight Recorder.

The thread (every ``TICK``) also captures stacks of ops stuck past ``hang_after``, samples
CPU/GPU, writes heartbeats, and writes to the store.  A slow, full or missing store never
blocks training: events wait in a bounded buffer, then are dropped and counted.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import sys
import threading
import time
import warnings
from collections import deque
from typing import Any

import torch
import torch.distributed as dist

from commscope import __version__, blocks, events
from commscope.events import encode as _dumps
from commscope.record import callsite, crashlog, hangsignal, jobid, native
from commscope.record.opsource import OpSource
from commscope.record.outbox import EXIT_RING_END, Outbox
from commscope.record.probes import ResourceProbe
from commscope.redact import redact_args
from commscope.schema import MAX_SECONDS, redact_event
from commscope.store import StoreError, backend_for, default_store, open_writer, redact_store, spool
from commscope.store.crashlog import crash_file_name
from commscope.store.resp import Interruptible

ENV_HANG_AFTER = "COMMSCOPE_HANG_AFTER"
ENV_JOB = "COMMSCOPE_JOB"
DEFAULT_HANG_AFTER = events.DEFAULT_HANG_AFTER


def _seconds(value: Any, default: float, what: str) -> float:
    """``value`` as seconds a trace may record (0 to ``schema.MAX_SECONDS``), else ``default``
    with a warning: -1 made the rank's ``meta`` invalid (skipped by every reader: check said
    the trace was incomplete), nan, inf and 1e300 made every tick raise before its heartbeat
    and sample (a live job's rank looked dead) and no stuck op was ever captured."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = float("nan")
    if 0 <= seconds <= MAX_SECONDS:  # (nan is neither)
        return seconds
    warnings.warn(f"commscope: {what}={value!r} is not seconds from 0 to {MAX_SECONDS:g}; using {default:g}",
                  RuntimeWarning, stacklevel=4)
    return default


class Recorder:
    """The recorder thread of one rank: each tick collects from the op source (``ops``),
    adds stacks, samples, heartbeats, drops and the exit, and writes through ``outbox``.

    ``attach`` (on the training thread, inside ``init_process_group`` or ``instrument()``)
    makes the rank known before training code runs: job and incarnation agreed with rank
    0, the spool created (the native records' ring, which outlives the process: see
    ``store/spool.py``), the ``meta`` written, the crash path armed.  Each later
    ``init_process_group`` after a ``destroy_process_group`` starts a new incarnation: a
    stream of its own, with its own groups, sequence numbers, rank and world size."""

    TICK = 0.05  # seconds between drains; a begin reaches the store within ~2 ticks
    EARLY_CAP = 1_000
    SETTLE_S = 5.0  # how long a rank waits at init for rank 0's job id
    FORWARD_EVERY = 1.0  # seconds between looks for spools of dead ranks on this host
    OPEN_TIMEOUT_S = 2.0  # connecting to the store from inside init_process_group, at most
    # How long a process that ends its recording waits for the last tick.  It takes
    # milliseconds, but seconds on a loaded host (2 cores, 4 ranks, a CI run beside): the old
    # 1 s cut it there, and the rank's exit was lost.  The bound is for a wedged tick (an NVML
    # call on a failed GPU), never reached otherwise: the store's part of the last tick ends
    # within ``Outbox.FINAL_WRITE_S``, a store that blocks included (``_make_way``).
    FINAL_HOLD_S = 10.0
    EXIT_LOCK_WAIT_S = 1.0  # ``_keep_exit``'s wait for the exit's lock (held briefly, or by what a signal interrupted)

    def __init__(self, store: Any = None, *, hang_after: float | None = None, capture_stacks: bool = True,
                 sample_interval: float = 1.0, flight_recorder: bool = True, source: str | None = None):
        """``source``: "native", "python" or None (native where it can be built)."""
        self.store = default_store(store)
        if hang_after is None:
            try:
                hang_after = float(os.environ.get(ENV_HANG_AFTER) or DEFAULT_HANG_AFTER)
            except ValueError:
                hang_after = DEFAULT_HANG_AFTER
        self.hang_after = _seconds(hang_after, DEFAULT_HANG_AFTER, "hang_after")
        self.capture_stacks = capture_stacks
        self.sample_interval = max(0.05, _seconds(sample_interval, 1.0, "sample_interval"))
        self.flight_recorder = flight_recorder
        self.rank: int | None = None
        self.job: str | None = None
        self.incarnation = -1  # of the process group being recorded (-1: none yet)
        self.run = "?"  # this run of the job, as rank 0 drew it (``jobid.settle``)
        self.group_alive = False  # between attach and destroy_process_group
        self.spool: spool.Spool | None = None
        self._spool_tried = False  # for this incarnation
        self._no_spool: str | None = None  # why this incarnation records without one (the meta says)
        self.pid = os.getpid()
        self._warned: set[str] = set()
        # encoded events on their way to the store; op records wait in the spool's ring
        self.outbox = self._new_outbox()
        self._early: deque[dict] = deque()  # events from before the rank is known
        self._records_reported = 0
        self._dropped_reported = 0
        self.drop_note: str | None = None
        self._next_sample = 0.0
        # Each tick, until it has to say so: would the spool's death handler note a SIGTERM?
        self._watch_term = False
        self._probe: ResourceProbe | None = None
        self.crash: str | None = None
        self.exit_code: int | None = None  # what the main thread's last ``sys.exit`` asked for
        self.exit_token = 0  # one more each ``sys.exit`` noted (``_ExitNoted``)
        self.exit_frame: Any = None  # the main thread's outermost frame at that ``sys.exit``
        self.exited = False
        self._ended_by: str | None = None  # the reason ``mark_exit`` last noted
        self._exit: tuple[int, str, int | None] | None = None  # (ts, reason, exit code) once marked
        #: when a KeyboardInterrupt left the program uncaught (Ctrl-C, a SIGINT: ``_excepthook``);
        #: its exit says the rank was stopped (``stop_signal``), as a SIGTERM its handler took
        self.interrupted: int | None = None
        # The exit's way out, which the recorder thread and a caller past FINAL_HOLD_S both
        # take (``_keep_exit``): once queued, stored, kept in the spool for a forwarder.
        self._exit_lock = threading.Lock()
        self._exit_line: bytes | None = None
        self._exit_stored = self._exit_kept = False
        self._kept_any = False  # this incarnation's spool holds events kept for a forwarder
        self._restated = False  # an exit after the one destroy_process_group wrote (``mark_exit``)
        self._raising: str | None = None  # the exception propagating through destroy_process_group
        self._destroy_line: bytes | None = None  # the exit destroy_process_group wrote, as queued
        self.group_end_stored = False  # the store holds it
        self._next_forward = 0.0
        self._stored_noted = -1  # the stream's entries as the spool last noted them (``_write``)
        self._next_write = 0.0  # (monotonic) the store's pace: ``StoreWriter.write_every``
        self._write_now = False  # ``flush`` asked: the next tick writes whatever the pace
        self._thread: threading.Thread | None = None
        self.need_job = False  # the job id is still unknown: see settle_job
        self._job_wait_since: float | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._ticks = 0
        # Held by each tick, its store I/O included.  Whoever else takes it (``attach``, at a
        # new incarnation) or waits for the last tick (``stop``) first makes way
        # (``_make_way``): the thread's store I/O (``_io``) gives up at once and keeps what it
        # did not write, so neither waits for a store that does not answer.
        self._tick_lock = threading.Lock()
        self._io = Interruptible()
        self.started_ns = time.time_ns()
        self.ops = self._make_source(source)

    def _make_source(self, source: str | None) -> OpSource:
        if source != "python":
            module = native.load()
            if module is not None:
                from commscope.record.nativeops import NativeOps

                return NativeOps(self, module)
            if source == "native":
                raise RuntimeError(f"commscope: the native recorder is unavailable: {native.error()}")
            if native.enabled():
                self.warn("native", f"commscope: native recorder unavailable ({native.error()}); recording "
                                    "in Python: higher overhead, C++-issued collectives via Flight Recorder only")
        from commscope.record.pyhot import PythonOps

        return PythonOps(self, self.flight_recorder)

    # ------------------------------------------------------------------ lifecycle
    def on_group_created(self) -> None:
        """The default process group now exists: make the rank known to the store (``attach``)."""
        try:
            self.attach()
        except Exception as exc:  # never break init_process_group
            self.warn("attach", f"commscope: could not register this rank with the store ({exc!r}); "
                                "the recorder thread keeps trying")

    def attach(self) -> None:
        """On the training thread, before training code runs: agree on the job and the
        incarnation with rank 0, create the spool, write the ``meta``, arm the crash path.
        A group initialised again after ``destroy_process_group`` starts a new incarnation
        (what the last one holds goes to its own stream first)."""
        if not (dist.is_available() and dist.is_initialized()):
            return
        closing = not self.group_alive and self.incarnation >= 0  # (both change on this thread only)
        if closing:
            self._make_way()
        with self._tick_lock:
            self._io.resume()
            if self.group_alive:
                return
            # All of this call's store I/O (the last incarnation's last write, opening the
            # store, the meta) ends within OPEN_TIMEOUT_S.
            io_started = time.monotonic()
            if self.incarnation >= 0:
                self._close_incarnation(io_started + self.OPEN_TIMEOUT_S)
            io_left = self.OPEN_TIMEOUT_S - (time.monotonic() - io_started)
            rank = dist.get_rank()
            job, inc, self.run = jobid.settle(rank, self.job, self.incarnation + 1, self.SETTLE_S)
            self.rank, self.incarnation, self.group_alive = rank, inc, True
            if inc > 0:
                self.ops.new_incarnation(inc, f"@{inc}")
            if job is not None:
                self.job = job
            self.need_job = self.job is None
            if self.need_job:
                self.ops.request_settle()
            self._flush_early()
            if self.job is not None:
                self.outbox._retry_at = 0.0
                opening = time.monotonic()
                if io_left > 0 and self._open_writer(timeout=io_left):
                    self.outbox.write_once(opening + io_left)  # (the meta's landing is noted: ``_meta_landed``)
                elif io_left <= 0:  # (the meta and the records wait in the spool for the thread's next try)
                    self._open_spool()
            self._arm()

    def _make_way(self) -> None:
        """For a caller about to wait for the tick (``attach``, ``stop``): the thread's store
        I/O in progress gives up at once (what it did not write stays queued, in order), and
        none starts until the caller has had its turn (``_io.resume``): a tick holds the lock
        for its own work, never for a store that does not answer."""
        self.outbox.interrupt()
        self._io.interrupt()

    def _close_incarnation(self, deadline: float) -> None:
        """Before a new incarnation: everything of the last one to its stream (its ``exit``
        was written at destroy_process_group), by ``deadline`` (``time.monotonic``) at the
        latest, its writer and spool closed (what did not make it waits in the spool for a
        forwarder: the thread's next tick, a reader).  Under the tick lock."""
        self._do_tick(final=True, deadline=deadline, forward=False)
        self.outbox = self._new_outbox()
        self.exited, self._ended_by, self._exit, self.crash, self.interrupted = False, None, None, None, None
        self._exit_line, self._exit_stored, self._exit_kept = None, False, False
        self._spool_tried, self._no_spool, self._kept_any, self._restated = False, None, False, False
        self._raising, self._destroy_line, self.group_end_stored = None, None, False
        self._stored_noted = -1

    def _new_outbox(self) -> Outbox:
        """An incarnation's outbox: a block it hands to the store frees the ring up to its end."""
        return Outbox(self.warn, on_forwarded=lambda end: self.ops.forwarded(end), on_exit_stored=self._exit_landed,
                      on_meta_stored=self._meta_landed)

    def _flush_early(self) -> None:
        """Events made before the rank was known, emitted now that it is."""
        for ev in self._early:
            self._emit(ev)
        self._early.clear()

    def on_destroyed(self) -> None:
        """``destroy_process_group()`` returned: the incarnation ends (its exit is written)."""
        self.group_alive = False

    def _arm(self) -> None:
        """The crash path: faulthandler into the spool's crash file (or, without a spool, the
        directory store's), then the native handlers that note the death in the spool."""
        if self.spool is not None:
            path = self.spool.crash_path
        else:
            job_dir = self.outbox.writer.crash_dir if self.outbox.writer is not None else None
            path = job_dir / crash_file_name(self.rank) if job_dir is not None and self.incarnation == 0 else None
        if path is not None:
            crashlog.arm(path)
        self.ops.arm_death()
        # (watched from the tick that finds a spool: one opened later, once the job id is
        # settled, is watched too; helper-104 found it never was, and such a rank SIGTERMed
        # through its own handler read as the dead rank)
        self._watch_term = True

    def check_term(self) -> None:
        """Note in the spool, once, that the death handler no longer takes SIGTERM (the program
        set its own handler after init, or ignores the signal): a rank found gone with no
        SIGTERM noted may have had one all the same.  At each tick, as the spool opens, and at
        once when the program sets a SIGTERM handler through ``signal.signal`` (``_signal``):
        a launcher's stop less than a tick later finds it said."""
        if self._watch_term and (sp := self.spool) is not None and not self.ops.term_watched():
            sp.set_flag(spool.TERM_UNWATCHED)
            self._watch_term = False

    JOB_WAIT = 15.0  # seconds to wait for rank 0's job id before deriving one

    def _settle_job_from_thread(self) -> bool:
        """One quick, non-blocking try per tick (the training thread may settle it first)."""
        from commscope.record.jobid import fallback_job_id, publish

        job = publish(self.rank)
        if self.job is None and job:
            self.job = job
        if self.job is not None:
            return True
        mono = time.monotonic()
        if self._job_wait_since is None:
            self._job_wait_since = mono
        if mono - self._job_wait_since < self.JOB_WAIT:
            return False
        self.job = fallback_job_id()
        self.warn("job", f"commscope: rank {self.rank} could not learn the job id from rank 0; "
                         f"recording to {self.job}")
        return True

    def settle_job(self) -> None:
        """Called by the wrapper right after an op completed while the job id is unknown.

        A completed op means rank 0 has created its process group and so published the
        id: one short check/get on the c10d store, from the training thread itself (so no
        contention with it), makes even very short jobs agree before rank 0 can exit.
        """
        self.need_job = False
        if self.job is None:
            from commscope.record.jobid import publish

            try:
                self.job = publish(dist.get_rank())
            except Exception:
                pass

    def start(self) -> None:
        """Start the thread (once); attaches the rank if the process group exists."""
        if self._thread is not None:
            return
        if dist.is_available() and dist.is_initialized():
            self.on_group_created()
        self._thread = threading.Thread(target=self._run, name="commscope-recorder", daemon=True)
        self._thread.start()

    def flush(self, timeout: float = 1.0) -> bool:
        """Ask the thread for a full tick (Flight Recorder included) and wait, bounded."""
        if self._thread is None or not self._thread.is_alive():
            return False
        self.ops.poll_fr_soon()
        self._write_now = True  # whatever the store's pace (read by the next tick to start)
        target = self._ticks + 2
        deadline = time.monotonic() + timeout
        while self._ticks < target and time.monotonic() < deadline:
            self._wake.set()
            time.sleep(0.002)
        return self._ticks >= target

    def pause(self) -> None:
        """Put torch.distributed back exactly as it was, keeping the thread and the trace
        (benchmarks alternate raw and recorded rounds in one process with this)."""
        self.ops.uninstall()

    def resume(self) -> None:
        self.ops.install()

    def mark_exit(self, reason: str, code: int | None = None, raising: str | None = None) -> None:
        """Note a shutdown once; its ``exit`` event follows everything recorded before.

        After ``destroy_process_group`` wrote its exit, an ending that is not clean (an
        uncaught exception, a failing code) is noted again, as a later exit: a rank that
        crashed saving its checkpoint after the group ended read healthy (helper-186).
        ``raising``: the exception propagating through ``destroy_process_group`` (called in a
        ``finally``), which the later ending is: what it skipped is not the program's doing."""
        if self.exited:
            if not (self._ended_by == events.DESTROYED and not self.group_alive and (self.crash or code)):
                return
            with self._exit_lock:  # (the destroy's exit is out: this one follows it)
                self._exit_line, self._exit_stored, self._exit_kept = None, False, False
            self._restated = True
        self.exited, self._ended_by = True, reason
        if reason == events.DESTROYED:
            self._raising = raising
        self._exit = (time.time_ns(), reason, code)

    def stop(self, reason: str = "uninstrument", timeout: float | None = None, code: int | None = None) -> None:
        """End the recording: the last tick writes everything and the ``exit``.  The caller
        waits for it (at most ``timeout``, default ``FINAL_HOLD_S``): a process that left
        sooner would cut it, and its rank would read as killed."""
        self.mark_exit(reason, code)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._make_way()  # (before the stop: the last tick, after it, writes for FINAL_WRITE_S at most)
        self._stop.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(self.FINAL_HOLD_S if timeout is None else timeout)
            if self._thread.is_alive():
                self._keep_exit()
                print(f"commscope: rank {self.rank}: the recorder's last write did not end within "
                      f"{self.FINAL_HOLD_S if timeout is None else timeout:g} s; the process leaves without "
                      "it (what the spool holds reaches the store through a forwarder)", file=sys.stderr)
        elif self._thread is None:
            self._tick(final=True)

    # ------------------------------------------------------------------ thread
    def _run(self) -> None:
        with self._io:  # (its store I/O: what ``_make_way`` cuts short)
            self._loop()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._tick()
            except Exception as exc:  # the recorder must never take the process down
                self.warn("internal", f"commscope recorder error (recording continues): {exc!r}")
            self._wake.wait(self.TICK)
            self._wake.clear()
        self._io.resume()  # (``stop`` made way before it asked for this last tick)
        try:
            self._tick(final=True)
        except Exception as exc:
            self.warn("internal", f"commscope recorder error at shutdown: {exc!r}")

    def warn(self, key: str, message: str) -> None:
        if key in self._warned:
            return
        self._warned.add(key)
        # (said as commscope's, not as the line of commscope that noticed it: the training log
        # it lands in showed our source, helper-193)
        # (its module the recorder's: a filter on commscope, or commscope.record, still matches it)
        warnings.warn_explicit(message, RuntimeWarning, "commscope", 0, module=__name__)

    def _tick(self, final: bool = False) -> None:
        with self._tick_lock:
            self._do_tick(final)

    def _do_tick(self, final: bool, deadline: float | None = None, forward: bool = True) -> None:
        """One tick (under the tick lock); ``final``: everything out, the writer closed, the
        store I/O ended by ``Outbox.FINAL_WRITE_S`` from now (or ``deadline``, if sooner);
        ``forward``: dead ranks' spools too, when it is time."""
        now = time.time_ns()
        started = time.monotonic()
        if final:
            end = started + Outbox.FINAL_WRITE_S
            deadline = end if deadline is None else min(deadline, end)
        asked, self._write_now = self._write_now, False
        if self.rank is None and dist.is_available() and dist.is_initialized():
            self.rank = dist.get_rank()
            self._flush_early()
        emit = self._emit
        # While the store fails, or until the store's pace allows the next write, op records
        # wait in the spool's ring (bounded by its size): then one write takes them all.
        due = final or asked or started >= self._next_write
        drain = final or (due and not self.outbox.backing_off())
        self.ops.collect(now, final, emit, self.outbox.put, self.rank, drain)
        if self.capture_stacks:
            stuck_ns = self._capture_stuck(now, emit)
            failed_ns = self.ops.failed_ns()
            hangsignal.tick(self, now, max(stuck_ns or 0, failed_ns or 0) or None, emit, final)
        crashlog.tick(self, emit, final)
        self.check_term()
        if final or time.monotonic() >= self._next_sample:
            self._next_sample = time.monotonic() + self.sample_interval
            self._samples(now, emit)
        outbox = self.outbox
        dropped = self.ops.dropped() + outbox.dropped  # hot-path records and whole events
        if dropped > self._dropped_reported:
            reason = self._drop_reason()
            ev = {"type": events.DROPPED, "ts": now, "count": dropped - self._dropped_reported,
                  "total": dropped, "reason": reason}
            records = self.ops.dropped() + outbox.dropped_records  # op records among them
            if records > self._records_reported:
                ev["records"] = records - self._records_reported
                self._records_reported = records
            emit(ev)
            self._dropped_reported = dropped
            self.warn("dropped", f"commscope: dropped {dropped} trace events ({reason}); training is unaffected")
        if self._exit is not None and (self.rank is not None or final):
            if self.rank is None:
                emit(self._exit_event(self._exit, self.spool))
                self._exit = None
            else:
                noted = self._exit
                line = self._stamped(self._exit_event(noted, self.spool))  # (outside the lock: held briefly)
                with self._exit_lock:
                    if noted[1] == events.DESTROYED:
                        self._destroy_line = line
                    self._exit_line = line
                    if self._exit is noted:  # (a crash noted meanwhile, after the destroy's: the next tick's)
                        self._exit = None
                outbox.put(line, EXIT_RING_END)  # last, after everything recorded before it
        if due:
            self._write(final, started, deadline)
        if forward and (final or time.monotonic() >= self._next_forward):
            self._forward_dead(deadline if final else None)
        if final:
            self._leave_spool()
        self._ticks += 1

    def _exit_event(self, noted: tuple[int, str, int | None], sp: spool.Spool | None) -> dict[str, Any]:
        """The ``exit`` of the shutdown ``mark_exit`` noted (``noted``)."""
        ts, reason, code = noted
        exit_ev: dict[str, Any] = {"type": events.EXIT, "ts": ts, "reason": reason}
        if code is not None:
            exit_ev["code"] = code
        unwaited, count = self.ops.unwaited()
        if count and not self._restated:  # (the destroy's exit listed them: once)
            exit_ev["unwaited"] = unwaited[:1000]
            exit_ev["unwaited_count"] = count
        if self.crash:
            exit_ev["exc"] = self.crash
        if reason == events.DESTROYED and self._raising:
            exit_ev["raising"] = self._raising
        if sp is not None:  # (a SIGTERM a handler of the program's own took, and when)
            exit_ev.update(sp.stop_noted())
        if self.interrupted is not None and "stop_signal" not in exit_ev:  # (Ctrl-C: ``_excepthook``)
            exit_ev.update(stop_signal="Interrupt", stop_ts=self.interrupted)
        return exit_ev

    def _exit_landed(self, line: bytes) -> None:
        """The store holds the exit: the spool says so at once, so that a forwarder of a spool
        left behind (its process gone before the tick ended) adds no second one; the exit of
        ``destroy_process_group`` as the group's end (``spool.GROUP_ENDED``: the process goes
        on, and how it then dies, if it does, is still to be said)."""
        with self._exit_lock:
            if line == self._destroy_line:  # (by the line that landed: a later ending may be noted since)
                self.group_end_stored = True
                if self.spool is not None:
                    self.spool.set_flag(spool.GROUP_ENDED)
                return
            self._exit_stored = True
            if self.spool is not None:
                self.spool.set_flag(spool.EXIT_STORED)

    def _meta_landed(self) -> None:
        """The store holds the meta: the spool says so, so that a forwarder of a spool left
        behind sends none again (before, only attach's own first write said it: a store that
        opened at a later tick got the meta twice, once from the forwarder)."""
        if self.spool is not None:
            self.spool.set_flag(spool.META_STORED)

    def _keep_line(self, line: bytes, is_exit: bool) -> None:
        """An event the last write could not store, kept in the spool for a forwarder (the
        exit once, whoever keeps it first)."""
        if is_exit:
            with self._exit_lock:
                if self._exit_kept or self._exit_stored or (self.group_end_stored and line == self._destroy_line):
                    return
                if line != self._destroy_line or not self._restated:  # (a later one follows it: kept too)
                    self._exit_kept = True
        self.ops.keep_event(line)
        self._kept_any = True

    def _keep_exit(self) -> None:
        """The last tick did not end in time and the process leaves: its ``exit`` waits in
        the spool with the records (a forwarder sends both), unless it is stored or kept."""
        sp = self.spool
        noted = self._exit  # (before the line: the tick sets the line, then clears this)
        line = self._exit_line
        if sp is None or self.rank is None:
            return  # the spool is left (the tick got that far)
        try:
            if line is None and noted is not None:  # not queued yet: made here (the tick's, if it
                line = self._stamped(self._exit_event(noted, sp))  # queues it meanwhile, is the same)
        except Exception:
            return
        # (bounded: this may run in a signal handler that interrupted the lock's holder)
        if not self._exit_lock.acquire(timeout=self.EXIT_LOCK_WAIT_S):
            return
        try:
            line = self._exit_line or line
            if line is not None and not (self._exit_kept or self._exit_stored
                                         or (self.group_end_stored and line == self._destroy_line)):
                self._exit_kept = True
                self.ops.keep_event(line)
                self._kept_any = True
        except Exception:
            pass
        finally:
            self._exit_lock.release()

    def _forward_dead(self, deadline: float | None = None) -> None:
        """Send what ranks of this job that died on this host left in their spools to their
        streams (``store/spool.py``), the store I/O ended by ``deadline`` (a final tick's),
        else within OPEN_TIMEOUT_S; none while a caller waits for the tick (``_make_way``):
        a spool not forwarded now is the next tick's (or a reader's)."""
        self._next_forward = time.monotonic() + self.FORWARD_EVERY
        if self.job is None or self._io.cut:
            return
        if deadline is None:
            deadline = time.monotonic() + self.OPEN_TIMEOUT_S
        own = {self.spool.path} if self.spool is not None else set()
        try:
            spool.forward_dead(self.job, self.store, lambda rank, inc: self._resume_writer(rank, inc, deadline),
                               own, run=self.run)
        except Exception as exc:
            self.warn("forward", f"commscope: could not forward a dead rank's last records: {exc}")

    def _resume_writer(self, rank: int, incarnation: int, deadline: float | None = None) -> Any:
        """A writer appending to a dead rank's stream whose waits end by ``deadline`` (None:
        within OPEN_TIMEOUT_S)."""
        if deadline is None:
            deadline = time.monotonic() + self.OPEN_TIMEOUT_S
        left = deadline - time.monotonic()
        if left <= 0:
            raise StoreError("no time left to forward it")
        writer = open_writer(self.store, self.job, rank, incarnation=incarnation, resume=True,
                             connect_timeout=min(left, self.OPEN_TIMEOUT_S))
        limit = getattr(writer, "set_deadline", None)
        if limit is not None:
            limit(deadline)
        return writer

    def _leave_spool(self) -> None:
        """At the end of an incarnation: the spool goes if the store has everything, else it
        stays (unlocked) for a forwarder."""
        self._watch_term = False
        sp, self.spool = self.spool, None
        crashlog.disarm()
        self.ops.disarm_death()
        if sp is not None:
            # (its records all stored, but not an event it kept: a crash's exit after the group
            # ended, the store refusing it, went with the spool, helper-194)
            drained = sp.drained() and not self._kept_any
            self.ops.detach_spool()
            sp.close(remove=drained)

    def _open_spool(self) -> None:
        """Create this incarnation's spool (once): the native records go there from now on."""
        if self._spool_tried or not self.ops.spools:
            return
        self._spool_tried = True
        backend = backend_for(self.store)  # a name to forward by: no credentials, whatever the store
        where = backend.redact(backend.absolute(self.store))
        identity = {"job": self.job, "run": self.run, "rank": self.rank, "inc": self.incarnation,
                    "store_id": spool.store_id(self.store),
                    "store": where[:600], "host": socket.gethostname()[:100], "pid": self.pid}
        if os.environ.get(spool.ENV_LAUNCH):  # (``commscope run``'s: it tells its ranks' spools by it)
            identity["launch"] = os.environ[spool.ENV_LAUNCH][:32]
        try:
            sp = spool.Spool.create(identity)
        except (OSError, ValueError) as exc:
            self._no_spool = str(exc)[:300]
            self.warn("spool", f"commscope: no spool ({exc}); recording in memory: a rank killed outright "
                               f"loses the records of its last tick")
            return
        try:
            self.ops.attach_spool(sp)
        except Exception as exc:
            sp.close(remove=True)
            self._no_spool = f"cannot use {sp.path}: {exc}"[:300]
            self.warn("spool", f"commscope: cannot use the spool {sp.path} ({exc}); recording in memory")
            return
        self.spool = sp
        self.check_term()  # (a handler the program set before a spool opened late)

    def _emit(self, ev: dict) -> None:
        """Stamp and encode one event at once, so no batch of dicts outlives the tick."""
        if self.rank is None:
            if len(self._early) >= self.EARLY_CAP:
                self._early.popleft()
                self.outbox.dropped += 1
            self._early.append(ev)
            return
        self.outbox.put(self._stamped(ev))

    def _stamped(self, ev: dict) -> bytes:
        """``ev`` as its line in the rank's stream."""
        ev["v"] = events.SCHEMA_VERSION
        ev["rank"] = self.rank
        redact_event(ev)  # stacks, exceptions, reasons: text from the program
        return _dumps(ev)

    def _drop_reason(self) -> str:
        if self.outbox.error:
            return self.outbox.error
        if self.drop_note:
            note, self.drop_note = self.drop_note, None
            return note
        return "recorder buffer full (the store could not keep up)"

    def _capture_stuck(self, now: int, emit) -> int | None:
        """Every thread's stack, once per op in flight longer than hang_after; returns the
        begin of the oldest op past hang_after (None: none), for ``hangsignal``."""
        stuck, oldest = self.ops.stuck(now, int(self.hang_after * 1e9))
        if not stuck:
            return oldest
        me = threading.get_ident()
        for op_id, tid in stuck:
            threads = [t for t in callsite.all_stacks() if t["tid"] != me]
            for t in threads:
                if t["tid"] == tid:
                    t["op_thread"] = True
            emit({"type": events.STACK, "ts": now, "id": op_id, "threads": threads})
        return oldest

    def _samples(self, now: int, emit) -> None:
        if self._probe is None:
            self._probe = ResourceProbe()
        gpu = self.ops.gpu_index
        if gpu is None:
            gpu = self.ops.gpu_index = _current_cuda_device()
        if gpu is not None:
            self._probe.use_gpu(gpu)
        sample = {"type": events.SAMPLE, "ts": now}
        sample.update(self._probe.sample())
        emit(sample)
        emit({"type": events.HEARTBEAT, "ts": now, "inflight": self.ops.inflight()})

    # ------------------------------------------------------------------ writing
    def _open_writer(self, timeout: float | None = None) -> bool:
        """Open the store once the rank and the job are known (True: ``outbox.writer`` is set)."""
        outbox = self.outbox
        if outbox.writer is not None:
            return True
        if self.rank is None:
            if not (dist.is_available() and dist.is_initialized()):
                return False
            self.rank = dist.get_rank()
        if outbox.backing_off():
            return False
        if self.job is None and not self._settle_job_from_thread():
            return False
        if self.incarnation < 0:
            self.incarnation = 0
        meta = self._meta()
        ring = self._ring_start()
        if ring is not None:
            meta["ring"] = ring
        attempt = jobid.job_attempt()  # (which attempt of a torchrun run, as rank 0 says: check finds the others)
        if attempt is not None:
            meta["attempt"] = attempt
        try:
            writer = open_writer(self.store, self.job, self.rank, job_meta={
                "created": self.started_ns, "world_size": meta["world_size"], "backend": meta["backend"],
                "schema": events.SCHEMA_VERSION, "commscope": __version__, "host": meta["host"],
                **({} if attempt is None else {"attempt": attempt}),
                # (the run and its incarnation: what a reader tells foreign streams by, ``analysis.runs``)
                **({} if self.run == "?" else {"run": self.run, "inc": self.incarnation}),
                # (the ``commscope run`` that launched it: which of the jobs new to a store are its own)
                **({"launch": os.environ[spool.ENV_LAUNCH][:32]} if os.environ.get(spool.ENV_LAUNCH) else {}),
            }, incarnation=self.incarnation, connect_timeout=timeout)
        except StoreError as exc:
            self._open_spool()  # the records wait there meanwhile
            if self.spool is not None:  # and the meta, for a forwarder, should the store never take it
                try:
                    meta["job"] = backend_for(self.store).pinned_job(self.store) or self.job
                except Exception:
                    pass
                meta["v"], meta["rank"] = events.SCHEMA_VERSION, self.rank
                self.ops.note_meta(_dumps(meta))
            outbox.failed(str(exc))
            return False
        # A store URL may name the job (redis://...?job=NAME): the events must say the same.
        self.job = meta["job"] = writer.job
        meta["v"], meta["rank"] = events.SCHEMA_VERSION, self.rank
        self._open_spool()
        if self._no_spool is not None:  # (a reader then knows its last records may have died with it)
            meta["no_spool"] = self._no_spool
        line = _dumps(meta)
        self.ops.note_meta(line)
        outbox.opened(writer, line)
        if getattr(writer, "warning", None):  # (e.g. a Redis that evicts keys when full)
            self.warn("store-open", writer.warning)
        return True

    def _ring_start(self) -> int | None:
        """The ring position the stream's first block starts at (the meta's ``ring``): the
        first block waiting for the store, else the next one drained.  A reader that reads
        the stream from its start counts a first block line gone against it, as it counts
        any later one against the block before (docs/recorder.md)."""
        try:
            for item in self.outbox.pending:
                if item.ring_end >= 0:
                    return blocks.block_pos(item.data)
            return self.ops.drained()
        except Exception:
            return None

    def _meta(self) -> dict:
        try:
            world = dist.get_world_size()
            backend = str(dist.get_backend())
        except Exception:
            world, backend = None, "?"
        meta = {"type": events.META, "ts": self.started_ns, "host": socket.gethostname(), "pid": os.getpid(),
                "world_size": world, "backend": backend, "torch": torch.__version__, "commscope": __version__,
                "python": sys.version.split()[0], "job": self.job, "hang_after": self.hang_after,
                "sample_interval": self.sample_interval,
                "argv": redact_args(sys.argv[:16]),  # no passwords in traces
                "store": redact_store(self.store), "recorder": self.ops.name}
        if self.incarnation > 0:
            meta["inc"] = self.incarnation
        if self.run != "?":
            meta["run"] = self.run
        meta.update(self.ops.meta())
        if os.environ.get("LOCAL_RANK", "").isdigit():
            meta["local_rank"] = int(os.environ["LOCAL_RANK"])
        return meta

    def _write(self, final: bool, started: float, deadline: float | None = None) -> None:
        """Hand what waits to the store (``started``: the tick's start, which the store's
        pace counts from, so a pace of one tick writes every tick; ``deadline``: a final
        write's end, ``time.monotonic``)."""
        outbox = self.outbox
        if final:
            outbox.write_final(self._open_writer, f"rank {self.rank}", redact_store(self.store),
                               kept=str(self.spool.path) if self.spool is not None else None, keep=self._keep_line,
                               deadline=deadline)
        elif outbox.pending and not outbox.backing_off() and self._open_writer():
            outbox.write_once()
            self._next_write = started + outbox.writer.write_every
        else:
            return
        # How many entries the stream holds, for a forwarder of the spool (``Spool.note_stored``)
        stored = getattr(outbox.writer, "stored", None)
        if self.spool is not None and isinstance(stored, int) and stored != self._stored_noted:
            self._stored_noted = stored
            self.spool.note_stored(stored)


def _current_cuda_device() -> int | None:
    try:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            return torch.cuda.current_device()
    except Exception:
        pass
    return None


# ---------------------------------------------------------------------- module API
_lock = threading.Lock()
_active: Recorder | None = None
_atexit_registered = False


def active() -> Recorder | None:
    return _active


def instrument(store: Any = None, *, hang_after: float | None = None, capture_stacks: bool = True,
               sample_interval: float = 1.0, flight_recorder: bool = True) -> Recorder:
    rec = prepare(store, hang_after=hang_after, capture_stacks=capture_stacks,
                  sample_interval=sample_interval, flight_recorder=flight_recorder)
    rec.start()
    return rec


def prepare(store: Any = None, *, hang_after: float | None = None, capture_stacks: bool = True,
            sample_interval: float = 1.0, flight_recorder: bool = True) -> Recorder:
    """Install the wrappers without starting the thread (``commscope run`` does this at
    import time, so early ``from torch.distributed import ...`` bindings are wrapped too);
    ``Recorder.start`` follows when the process creates its process group."""
    global _active, _atexit_registered
    with _lock:
        if _active is not None:
            if store is not None and default_store(store) != _active.store:
                warnings.warn(f"commscope: already recording to {redact_store(_active.store)}; instrument("
                              f"{redact_store(default_store(store))}) changes nothing (call commscope.uninstrument() "
                              "first to record elsewhere)", RuntimeWarning, stacklevel=3)
            return _active
        rec = Recorder(store, hang_after=hang_after, capture_stacks=capture_stacks,
                       sample_interval=sample_interval, flight_recorder=flight_recorder,
                       source=os.environ.get("COMMSCOPE_SOURCE") or None)
        if rec.ops.name == "native":
            # NCCL then times each collective with CUDA events (GPU durations in ``done``).
            os.environ.setdefault("TORCH_NCCL_ENABLE_TIMING", "1")
        if flight_recorder and rec.ops.name == "python":
            # The Python path sees C++-issued collectives only through Flight Recorder, which
            # must be switched on before the first process group exists.
            os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")
        rec.ops.install()
        _install_excepthook()
        _install_exit_hook()
        _active = rec
        if not _atexit_registered:
            atexit.register(_at_exit)
            os.register_at_fork(after_in_child=_after_fork_child)
            _atexit_registered = True
        return rec


def uninstrument() -> None:
    global _active
    with _lock:
        rec = _active
        if rec is None:
            return
        rec.ops.uninstall()
        _remove_excepthook()
        _remove_exit_hooks()
        _active = None
    rec.stop("uninstrument")


_prev_excepthook: Any = None


def _excepthook(exc_type, exc, tb):
    """Note an unhandled exception so the ``exit`` event says the process crashed."""
    rec = _active
    if rec is not None and issubclass(exc_type, KeyboardInterrupt) and rec.interrupted is None:
        # (a user's Ctrl-C: its exit said "atexit", and a rank stopped between ops while its
        # peers waited was named missing, exit 1, over a healthy job: helper-176)
        rec.interrupted = time.time_ns()
    elif rec is not None and not issubclass(exc_type, KeyboardInterrupt | SystemExit):
        from commscope.record.ops import fmt_exc

        rec.crash = fmt_exc(exc) if exc is not None else exc_type.__name__
    (_prev_excepthook or sys.__excepthook__)(exc_type, exc, tb)


def _install_excepthook() -> None:
    global _prev_excepthook
    if sys.excepthook is not _excepthook:
        _prev_excepthook = sys.excepthook
        sys.excepthook = _excepthook


def _remove_excepthook() -> None:
    global _prev_excepthook
    if sys.excepthook is _excepthook:
        sys.excepthook = _prev_excepthook or sys.__excepthook__
    _prev_excepthook = None


def _at_exit() -> None:
    global _active
    rec = _active
    if rec is None:
        return
    rec.ops.uninstall()
    _active = None
    code = None if _ran_to_its_end(rec.exit_frame) else rec.exit_code
    rec.stop("atexit" if rec.crash is None else "exception", code=code)


#: The instructions a frame that returned ended at (3.12 added the ``_CONST`` ones)
_RETURNS = frozenset({"RETURN_VALUE", "RETURN_CONST", "INSTRUMENTED_RETURN_VALUE", "INSTRUMENTED_RETURN_CONST"})


def _ran_to_its_end(frame: Any) -> bool:
    """Whether ``frame``, the main thread's outermost one when it called ``sys.exit``,
    returned: the program ran to its end, so no ``SystemExit`` left it, whatever it caught
    and kept alive past atexit (``_ExitNoted`` is not freed then; helper-121: ``kept = e``,
    then a clean exit, status 0, said code 3).  One the exception left was unwound where it
    passed (its last instruction a call or a raise), and its code stands."""
    if frame is None:
        return False
    try:
        import opcode

        lasti = frame.f_lasti
        return lasti >= 0 and opcode.opname[frame.f_code.co_code[lasti]] in _RETURNS
    except Exception:
        return False


_real_os_exit = os._exit


def _os_exit(code: int) -> None:
    """``os._exit``: no atexit, no finally.  What the rank recorded still reaches the store
    (bounded: ``Recorder.FINAL_HOLD_S``) and its ``exit`` says so, then the process leaves
    as asked."""
    end_before_exit(code)
    _real_os_exit(code)


#: Held while ``end_before_exit`` ends the recording: another thread's ``os._exit`` waits
#: for its last write (at most ``ENDING_WAIT_S``, past the holder's own wait for the last
#: tick, which it would cut).  Re-entrant: a signal handler that interrupted the holder goes
#: on at once (the recording is ended already); a forked child gets a fresh one.
_ending = threading.RLock()
ENDING_WAIT_S = Recorder.FINAL_HOLD_S + Recorder.EXIT_LOCK_WAIT_S + 2.0  # (2 s: the rest of ``stop``)


def end_before_exit(code: int) -> None:
    """The recording ends as ``os._exit(code)`` ends it (its ``exit`` says so), but the
    process stays: a caller that must not leave before others have ended theirs (the
    demo's ranks at their time limit: one leaving first would fail the others' waiting
    ops, in their traces) calls this, waits for them, then calls ``os._exit``.  What the
    rank's ops do after its last write is not recorded."""
    global _active
    held = _ending.acquire(timeout=ENDING_WAIT_S)
    try:
        rec = _active
        if rec is None or os.getpid() != rec.pid:
            return
        _active = None
        try:
            rec.ops.note_exit(int(code))
            rec.ops.uninstall()
            rec.stop("exception" if rec.crash else "os._exit", code=int(code))
        except BaseException:
            pass
    finally:
        if held:
            _ending.release()


def note_uncaught(exc: BaseException) -> None:
    """A launcher caught the exception a rank's function died of (it would have been
    uncaught): the exit says so, with its traceback, as ``sys.excepthook`` would have."""
    rec = _active
    if rec is None or isinstance(exc, KeyboardInterrupt | SystemExit):
        return
    from commscope.record.ops import fmt_exc

    sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, exc.__traceback__
    sys.last_exc = exc
    rec.crash = fmt_exc(exc)


#: Functions that catch the exception a rank's function raised and leave with ``sys.exit``
#: (their module, their name): that exception is, for the rank, uncaught.
#: ``torch.multiprocessing.spawn._wrap`` (``mp.spawn``, ``start_processes``, and torch
#: elastic's function entrypoints through it) writes the traceback for its parent, then
#: ``sys.exit(1)``: the exception never reaches ``sys.excepthook``.
EXCEPTION_EXITS = frozenset({("torch.multiprocessing.spawn", "_wrap")})

_prev_sys_exit: Any = None
_builtin_sys_exit = sys.exit


def _sys_exit(*args: Any, **kwargs: Any) -> None:
    """``sys.exit``: the recorder notes the code the process asks to leave with (its ``exit``
    event says it), and, when a launcher's wrapper (``EXCEPTION_EXITS``) leaves this way on
    the exception the rank's function raised, that exception as the rank's crash.  Then
    the ``sys.exit`` that was installed raises ``SystemExit`` as ever, with an
    ``_ExitNoted`` on it: a program that catches it and goes on takes the code back."""
    noted = None
    if len(args) <= 1 and not kwargs:  # (else the real one raises its TypeError, as ever)
        try:
            noted = _note_sys_exit(args[0] if args else None, sys._getframe(1))
        except Exception:  # never in the way of an exit
            pass
    try:
        (_prev_sys_exit or _builtin_sys_exit)(*args, **kwargs)
    except SystemExit as exc:
        if noted is not None:
            with contextlib.suppress(Exception):
                exc.__dict__["_commscope_noted"] = noted
        raise


class _ExitNoted:
    """Hung on the ``SystemExit`` a main thread's ``sys.exit`` raised, and freed with it.
    Freed while no Python frame runs, the exception left the program (the interpreter took
    its code and goes on to atexit): the code noted stands.  Freed inside a frame, the
    program caught it and went on: the code is taken back (helper-117: ``sys.exit(3)``
    caught, then a clean exit, status 0, whose ``exit`` event said code 3).  A caught
    exception kept alive until the exit is settled there (``_ran_to_its_end``)."""

    __slots__ = ("before", "rec", "token")

    def __init__(self, rec: Recorder, before: int | None) -> None:
        rec.exit_token += 1
        self.rec, self.before, self.token = rec, before, rec.exit_token

    def __del__(self) -> None:
        try:
            sys._getframe(1)  # (ValueError: no frame runs: the exception is leaving the program)
            rec = self.rec
            if rec.exit_token == self.token:  # (no later sys.exit noted since)
                rec.exit_code = self.before
        except Exception:
            pass


def _note_sys_exit(status: Any, caller: Any) -> _ExitNoted | None:
    rec = _active
    # a SystemExit raised in another thread ends only that thread
    if rec is None or os.getpid() != rec.pid or threading.current_thread() is not threading.main_thread():
        return None
    code = 0 if status is None else int(status) if isinstance(status, int) else 1  # Python's rule
    noted = _ExitNoted(rec, rec.exit_code)
    rec.exit_code = code
    outermost = caller
    while outermost.f_back is not None:
        outermost = outermost.f_back
    rec.exit_frame = outermost
    if code != 0 and (caller.f_globals.get("__name__"), caller.f_code.co_name) in EXCEPTION_EXITS:
        exc = sys.exc_info()[1]  # the exception the wrapper is handling
        if exc is not None:
            note_uncaught(exc)
    return noted


_prev_signal: Any = None
_builtin_signal = signal.signal


def _signal(*args: Any) -> Any:
    """``signal.signal``: a SIGTERM handler the program sets while it is instrumented takes
    the signal from the native death handler; the recorder notes so at once
    (``Recorder.check_term``), not at its next tick, which a launcher's stop may beat.  The
    ``signal.signal`` that was installed does the work, and raises as ever."""
    previous = (_prev_signal or _builtin_signal)(*args)
    if args and args[0] == signal.SIGTERM:
        crashlog.term_taken()  # (the Python recorder's watch of it is replaced)
        rec = _active
        if rec is not None and os.getpid() == rec.pid:
            try:
                rec.check_term()
            except Exception:  # never in the way of the program's handler
                pass
    return previous


def _install_exit_hook() -> None:
    global _prev_sys_exit, _prev_signal
    if os._exit is not _os_exit:
        os._exit = _os_exit
    if sys.exit is not _sys_exit:
        _prev_sys_exit = sys.exit
        sys.exit = _sys_exit
    if signal.signal is not _signal:
        _prev_signal = signal.signal
        signal.signal = _signal


def _remove_exit_hooks() -> None:
    global _prev_sys_exit, _prev_signal
    if os._exit is _os_exit:
        os._exit = _real_os_exit
    if sys.exit is _sys_exit:
        sys.exit = _prev_sys_exit or _builtin_sys_exit
    _prev_sys_exit = None
    if signal.signal is _signal:
        signal.signal = _prev_signal or _builtin_signal
    _prev_signal = None


def _after_fork_child() -> None:
    """A forked child (e.g. a DataLoader worker) must not write into its parent's trace."""
    global _active, _ending
    _ending = threading.RLock()  # (one a parent's thread held at the fork: none here frees it)
    rec = _active
    if rec is None:
        return
    _active = None
    from commscope.record import patch

    patch.uninstall()
    rec.ops.after_fork()
    rec.outbox.forget()
