"""The console's data side: a reader, a TraceModel and diagnose(), driven from a thread.

The UI thread only renders.  ``Feed.step`` does one cycle (read a bounded batch, ingest
it under the model lock and publish the model's immutable ``view``, diagnose now and then)
and returns an immutable ``FeedInfo``;
``run`` repeats it on a worker thread and posts ``FeedUpdated`` messages, which coalesce
when the UI is busy.  Tests call ``step`` directly.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Any, NamedTuple

from textual.message import Message

from commscope.analysis import Finding, TraceModel, diagnose, rankstate
from commscope.analysis.diagnose import judged
from commscope.analysis.flight_import import FlightRecorderReader
from commscope.analysis.model import EMPTY_VIEW, ModelView
from commscope.analysis.source import Loading, fitting_window, model_most
from commscope.events import DEFAULT_HANG_AFTER, gc_paused
from commscope.memory import give_back
from commscope.store import AsOf, Batch, TraceReader, readahead
from commscope.store.readahead import ReadAhead, ReadAheadLost
from commscope.window import Since

LIVE, REPLAY = "live", "replay"


#: The least a restart at the tail reads, whatever the job's rate says (a window of no time
#: would hold only what the ranks carry into it: ``tail_span_s``)
TAIL_FLOOR_S = 2.0
#: The reader's warnings a ``FeedInfo`` carries, its last (the header counts them all)
WARNINGS_KEPT = 200


@dataclasses.dataclass(frozen=True)
class FeedInfo:
    """What the header and panels show about the feed itself."""

    mode: str
    source: str
    version: int = 0
    events: int = 0  # every stream's read (the read counter: ``rate`` is its pace)
    #: of ``events``, the foreign streams' (``ModelView.foreign`` as published: not the job's;
    #: the header says them apart, "12,345 events (+678 foreign)")
    foreign_events: int = 0
    rate: float = 0.0  # events/s ingested recently
    behind_bytes: int = 0  # written but not yet read (live)
    behind: bool = False
    lag_s: float = 0.0  # how far the clock is past what every stream was read up to (live)
    catching_up: bool = False  # some stream not read to its end yet: nothing judged
    corrupt: int = 0  # damaged lines the reader skipped
    invalid: int = 0  # events that failed the schema, skipped
    reused: int = 0  # op begins that reused an op id their rank had begun (``TraceModel.reused``)
    trimmed: bool = False
    #: what reading the store said (``ReadStats.warnings``: events lost or trimmed and why, a
    #: reconnection, a read process lost), its readers before a restart's with it
    #: (``Feed._carry_warnings``), the last ``WARNINGS_KEPT``; ``w`` shows them
    warnings: tuple[str, ...] = ()
    warnings_total: int = 0  # ... how many were said in all
    waiting: bool = True  # nothing recorded yet
    ended: bool = False  # every rank of the job's own exited or died (``Feed._judge_end``)
    loaded: bool = False  # replay: the whole trace is in (findings are made then)
    progress: float = 0.0  # replay loading, 0..1
    now_ns: int = 0
    error: str | None = None
    restarts: int = 0  # the model started again at the tail (``Feed.MODEL_BUDGET``): panels reset
    #: what the first read took where it is not what was asked (``first_window``; the header's)
    window: str = ""


@dataclasses.dataclass
class FeedCosts:
    """Seconds of CPU the feed's thread has spent, by what (running totals): what a
    benchmark apportions between the events read and the streams and ranks followed (CPU,
    not the clock: on a busy machine the clock counts the others' turns too)."""

    read: float = 0.0  # the reader's polls
    ingest: float = 0.0  # the model's, publishing apart
    diagnose: float = 0.0
    publish: float = 0.0


class InFlight(NamedTuple):
    """What ``Feed._hang_due`` last found by walking every rank: as of model ``version``, the
    earliest begin after ``after`` among the ops in flight (None: none)."""

    version: int
    after: int
    oldest: int | None


class FeedUpdated(Message):
    """The model or findings changed.  Newer ones replace older ones still queued."""

    def __init__(self, info: FeedInfo, findings: list[Finding]):
        super().__init__()
        self.info = info
        self.findings = findings

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, FeedUpdated)


class Feed:
    POLL_S = 0.1
    ENDED_POLL_S = 1.0  # an ended job is still watched (a restart appends), at a lower rate
    #: A poll that read all there was is followed by the next this long after it began, at
    #: the soonest: each stream read costs its own (a stat, an open, a read, ~40 us), paid a
    #: few times a second, not as often as the polls can go (a 1,024-rank job: ~30 a second),
    #: and the console shows no more than that.  A poll the budget cut short goes on at once.
    ROUND_S = 0.25
    BUDGET = 8 << 20  # bytes per read: keeps each cycle short on huge backlogs
    DIAGNOSE_S = 0.5
    #: The header says the console is behind once its watermark is this far behind the clock
    LAG_SHOWN_S = 2.0

    #: A live console's model past this many bytes starts again at the tail (``reopen``): its
    #: memory stays bounded however long the job runs
    MODEL_BUDGET = 1 << 30
    TAIL_MIN_S = 60.0
    #: A restart at the tail is made only where it reads again at most this share of what the
    #: model's window read (``_restart_at_tail``)
    RESTART_READS_AGAIN = 0.75

    def __init__(self, reader: TraceReader, *, mode: str = LIVE, hang_after: float | None = None,
                 clock: Callable[[], int] = time.time_ns, source: str = "", hint: str = "",
                 reopen: Callable[[Since], TraceReader] | None = None):
        """``hint``: what to tell the user while nothing has been read (how a job gets there);
        ``reopen``: a reader of the same source from a window on, for a live model grown past
        ``MODEL_BUDGET`` (None: the model grows with the job)."""
        self.reader: TraceReader = reader
        self.reopen = reopen
        self.restarts = 0  # how many times the model started again at the tail (panels reset then)
        #: what the readers swapped out said (``_carry_warnings``), their last ``WARNINGS_KEPT``
        #: and how many in all: a restart at the tail reads only the window again
        self._said_before: list[str] = []
        self._said_before_total = 0
        self.restarts_skipped = 0  # ... and did not: it would have read again most of what the model's window read
        #: the last restarts' windows (s) and the models they read (``TraceModel.nbytes``): what a restart costs
        self.restart_reads: deque[tuple[float, int]] = deque(maxlen=64)
        #: never restart for less (no thrashing): twice what the last restart held, or half a
        #: budget past what the model held when the last was not made
        self._restart_floor = 0
        self._next_size_check = 0  # model.events at which to size the model next
        self.mode = mode
        self.clock = clock
        self.source = source or reader.description
        self.hint = hint
        self.window = ""  # (``FeedInfo.window``: set by who sized the first window)
        self.model = TraceModel()
        self.lock = threading.RLock()  # ingest (this thread) vs the panels that query the model
        #: The model as of the last batch (``TraceModel.view``): the timeline paints from it
        #: without the lock.  Replaced, never changed.
        self.view: ModelView = EMPTY_VIEW
        self._publish_cost = 0.0  # seconds the last publish took
        self._published_at = float("-inf")  # (monotonic) when the last publish ended
        self._backlog = (0.0, 0)  # (monotonic when to ask again, bytes): the reader's backlog
        self._as_of = AsOf()  # ``now`` never runs past the reader's last watermark
        self.hang_after_override = hang_after
        self.findings: list[Finding] = []
        self.diagnoses = 0  # how many times ``findings`` was made: a change to send the UI
        self._rates: deque[tuple[float, int]] = deque(maxlen=50)
        self._diagnosed_at = float("-inf")  # (monotonic) when the last diagnosis began (-inf: judge at once)
        self._diagnose_cost = 0.0  # seconds the last diagnosis took
        #: The last diagnosis: the moment it judged at and its hang_after (``_hang_due``), and
        #: (monotonic) the soonest another may run before its pace allows (``_diagnosis_due``)
        self._judged: tuple[int, int] | None = None
        self._early_from = 0.0
        self._in_flight: InFlight | None = None
        self._dirty = False
        self.info = FeedInfo(mode=mode, source=self.source)
        self.costs = FeedCosts()
        self.error: str | None = None
        #: (model version, trace end) once every rank has exited or died: the job is judged at
        #: its end from then on, as ``commscope check`` judges it, until something new arrives.
        self._ended: tuple[int, int] | None = None
        self._step_began = 0.0  # (monotonic) when the last step began
        self._cut_short = False  # the last step's poll stopped at the budget (there is more to read)
        #: The first read, in parallel where the reader can (``read_apart``); None once it is done
        self._first: Iterator[Batch] | None = None
        self._first_done = False
        #: A read process was lost (``_read_here``): the job is read in this process from
        #: then on, and a failed try to read it so is tried again from this (monotonic) on
        self._read_here_only = False
        self._read_here_at = 0.0
        #: Set when the feed is to end (``run``'s): a read into a new model (``_swap_in``)
        #: stops at its next batch, not at its end
        self._stop = threading.Event()

    @classmethod
    def pacing(cls) -> readahead.Pacing:
        """How a read process paces its polls: as this class paces its own."""
        return readahead.Pacing(cls.BUDGET, cls.POLL_S, cls.ROUND_S, cls.BACKLOG_S, cls.ENDED_POLL_S)

    # ------------------------------------------------------------------ one cycle
    def hang_after(self) -> float:
        """The job's hang_after (what its ranks were recorded with, else 30 s): asked by the
        UI thread too, so under the lock (this thread may be adding ranks)."""
        if self.hang_after_override is not None:
            return self.hang_after_override
        with self.lock:
            return self.model.hang_after() or DEFAULT_HANG_AFTER

    def now(self) -> int:
        """Live: the wall clock, held back to the reader's watermark (``TraceReader.
        watermark_ns``: a reader behind on its streams judges ranks as of the moment it has
        read them all up to, so its own lag never makes a rank look silent), or the trace's
        end once the job ended.  Replay: the end of the trace (the UI moves its own cursor)."""
        if self.mode == REPLAY:
            return self.model.trace_end()  # (the job's own end: as ``check`` judges it)
        if self._ended is not None:
            return self._ended[1]
        return self._live_now()

    def _live_now(self) -> int:
        return self._as_of.now(self.reader, self.clock())

    def caught_up(self) -> bool:
        """Every stream has been read to its end at least once (live): until then, ranks not
        read yet would look missing, so nothing is judged."""
        return self.mode == REPLAY or self._as_of.mark is not None or self.reader.watermark_ns() != 0

    @property
    def ended(self) -> bool:
        return self._ended is not None

    def _judge_end(self) -> bool:
        """Whether the job ended: every rank of the job's own exited or died, by the wall
        clock (a foreign stream, ``TraceModel.kept_apart``, is another job's or launch's:
        before, a live one kept an ended job "LIVE", judged by the running clock).  An ended
        job stays frozen at its last record (clocks stop, nobody turns dead by the passing of
        time) until a new event arrives.  Returns whether the judgement (or the end) moved."""
        m = self.model
        if self.mode == REPLAY:
            return False
        apart = m.kept_apart  # (first: finding a stream foreign moves the version on)
        if self._ended is not None and self._ended[0] == m.version:
            return False
        wall = self._live_now()
        ranks = [r for r in m.rank_ids() if r not in apart] if apart else m.rank_ids()
        over = bool(ranks) and all(rankstate.exited(m, r) is not None or rankstate.is_dead(m, r, wall) for r in ranks)
        was = self._ended
        self._ended = (m.version, m.trace_end()) if over else None
        if (was is None) != (self._ended is None):
            return True
        return was is not None and self._ended is not None and was[1] != self._ended[1]

    def step(self) -> tuple[FeedInfo, bool]:
        """Read and ingest one bounded batch; returns (info, whether anything new came in)."""
        got = 0
        behind_bytes = 0
        self._step_began = time.monotonic()
        self._cut_short = False
        try:
            with gc_paused():  # decoded dicts die right after ingest: no GC work for them
                t0 = time.thread_time()
                batch = self._read()
                t1 = time.thread_time()
                published = self.costs.publish
                self.ingest(batch)
                self.costs.read += t1 - t0
                self.costs.ingest += time.thread_time() - t1 - (self.costs.publish - published)
                got = batch.count()
                # (gone before the collector resumes: its first pass walked a 16k poll's dicts
                # still held here, ~12 ms a pass)
                del batch
            behind_bytes = self._backlog_bytes()
        except ReadAheadLost as exc:  # the read process gone: the job read again here
            self._read_here(str(exc))
        except Exception as exc:  # a store that vanished, a wrong password...
            self.error = str(exc) or type(exc).__name__
        if got and self.mode == LIVE and self.reopen is not None and self.model.events >= self._next_size_check:
            self._next_size_check = _next_size_check(self.model)
            held = self.model.nbytes()  # (~90 ms at 16k ranks: sized once, for the check and the tail)
            if held > max(self.MODEL_BUDGET, self._restart_floor):
                self._restart_at_tail(held)
        mono = time.monotonic()
        self._rates.append((mono, got))
        if self.caught_up() and self._judge_end():
            self._dirty = True
            self._diagnosed_at = float("-inf")  # judged at once: the findings the UI is sent next are check's
            self.publish()  # every rank's state as of the end (or, resumed, of now)
        if got:
            self._dirty = True
        ticking = self.mode == LIVE and not self.ended  # findings age with the clock
        due = self._diagnosis_due()
        if not self.caught_up():
            pass  # first reads of a large job: judged once every stream was read to its end
        elif (self._dirty and mono >= due or (ticking and mono >= due + 1.0)
              or ticking and self._hang_due(mono)):
            # An ended job is judged as ``check`` judges its trace: at its end, with the wall
            # clock only to tell a job that stopped writing from one still running.
            wall = self.clock() if self.ended else None
            now, hang_after = self.now(), self.hang_after()
            cpu = time.thread_time()
            # (the cyclic collector paused: a diagnosis of 16k ranks is tens of thousands of
            # small objects, and a pass of the collector among them walked the whole model,
            # 0.2-0.45 s more on a 0.7 s diagnosis of 16k waiting ranks)
            with gc_paused():
                self.findings = sorted(diagnose(self.model, now, hang_after, wall_ns=wall), key=Finding.sort_key)
            self.diagnoses += 1
            spent = time.monotonic() - mono
            self.costs.diagnose += time.thread_time() - cpu
            self._diagnosed_at, self._diagnose_cost = mono, spent  # (the next at ``_diagnosis_due``, ...
            # ... unless a hang's finding is due: then at once, never more than half the time)
            self._early_from = mono + 2 * spent
            self._judged = (now, int(hang_after * 1e9))
            self._dirty = False
        pace = self._publish_pace()
        if not got and mono >= self._published_at + max(self.DIAGNOSE_S, pace) and not self.ended:
            self.publish()  # (states age with the clock too)
        elif self.view.version != self.model.version and mono >= self._published_at + pace:
            self.publish()  # a batch whose publish was put off (costly views): never left unshown
        self.info = self._info(behind_bytes)
        return self.info, bool(got)

    def _diagnosis_due(self) -> float:
        """(monotonic) When the next diagnosis may run: DIAGNOSE_S after the last, and never
        more than a fifth of the time; a tenth for a console behind the job (``FeedInfo.behind``
        as the last step saw it: its findings are seconds old anyway), which needs the time
        to catch up (16k ranks: ~0.4 s a diagnosis, a fifth of the time of a console that
        read ~84k events/s against the job's ~82k).  Asked when one may be due, not when the
        last was made: a console that caught up meanwhile keeps to the fifth.  A hang's
        finding does not wait for it (``_hang_due``)."""
        return self._diagnosed_at + max(self.DIAGNOSE_S, (10 if self.info.behind else 5) * self._diagnose_cost)

    def _hang_due(self, mono: float) -> bool:
        """Whether an op in flight passed hang_after since the moment the last diagnosis
        judged at: a hang's finding is then due, and is looked for at once, not at the pace a
        costly diagnosis sets (16k ranks: ~0.5 s a diagnosis, so one every 2.5 s, which put
        the finding up to that much later); never more than half the time.  Only ops that had
        not passed it then count (one in flight for ever, an async op never waited on, would
        hide every later one).

        Every rank's ops in flight are walked only when the last walk (``InFlight``) or an op
        changed since (``TraceModel.touched_since``) may have passed it: a step of 16k ranks
        spent ~7 ms walking them (2.6-2.8 s of a 60 s ``bench scale``).  An op in flight now either
        was then, unchanged (so no older than the walk's oldest), or changed since."""
        if self._judged is None or mono < self._early_from:
            return False
        judged, hang_ns = self._judged
        after, upto = judged - hang_ns, self.now() - hang_ns
        model, last = self.model, self._in_flight
        if last is not None and last.after == after and (last.oldest is None or last.oldest > upto):
            changed = model.touched_since(last.version)
            if changed is not None and changed > upto:
                return False
        oldest = model.oldest_in_flight(after)
        self._in_flight = InFlight(model.version, after, oldest)
        return oldest is not None and oldest <= upto

    def _read(self) -> Batch:
        """The next batch: the first read's in parallel where the reader can (``read_apart``:
        a console attached to a large job shows it as soon as all the cores have read it, not
        one), then the polls', ``BUDGET`` bytes at most."""
        if not self._first_done:
            if self._first is None:
                self._first = self.reader.read_apart(self.BUDGET)
            try:
                batch = next(self._first, None)
            except BaseException:
                self._first_done, self._first = True, None  # (the polls read what it did not)
                raise
            if batch is not None:
                self._cut_short = True  # (more of it: the next step at once)
                return batch
            self._first_done, self._first = True, None
        read = self.reader.stats.bytes
        batch = self.reader.poll_batch(max_bytes=self.BUDGET)
        self._cut_short = self.reader.stats.bytes - read >= self.BUDGET
        return batch

    def pause_s(self, got: bool) -> float:
        """How long to wait before the next ``step``, which brought ``got``: nothing, when its
        poll stopped at the budget; until ``ROUND_S`` after it began, when it read all there
        was; ``POLL_S`` (an ended job's ``ENDED_POLL_S``) when nothing new came or it failed."""
        if self.reader.paces_itself and not self.info.error:
            return 0.0  # (its poll waited for the next batch: a read process paces itself)
        if not got or self.info.error:
            return self.ENDED_POLL_S if self.info.ended else self.POLL_S
        if self._cut_short:
            return 0.0
        return max(0.0, self._step_began + self.ROUND_S - time.monotonic())

    def _restart_at_tail(self, held: int | None = None) -> None:
        """Start the model again from the last half of what it holds (at least a minute, unless
        that holds more than half the budget: ``tail_span_s``): a reader of the window (the
        store carries what ranks were in where it starts), read to its end, then swapped in.
        What came before is the summarized history's, and the window's skipped bytes say so.
        The store starts a stream at a segment or a mark: a restart reads from there.  Where
        it would read again more than ``RESTART_READS_AGAIN`` of what the model's window read
        (``TraceReader.read_again``: a directory's segment holds ~1.5 h of a rank at 25
        collectives a second, so a job whose model fills the budget in minutes is read back
        whole), it is not made: a stall of the feed for about what the model holds
        (``restarts_skipped``); it is looked at again once the model grew by half the budget
        (not doubled: nothing was read)."""
        held = self.model.nbytes() if held is None else held
        span_s = tail_span_s(self.model, self.MODEL_BUDGET, self.TAIL_MIN_S, self.reader.window_start_ns(), held)
        window = Since(ago_s=span_s)
        try:
            again = self.reader.read_again(window)
        except Exception:  # (a listing that failed: the restart finds out)
            again = None
        if again is not None and again > self.RESTART_READS_AGAIN:
            self.restarts_skipped += 1
            self._restart_floor = held + self.MODEL_BUDGET // 2
            return
        try:
            reader = self.reopen(window) if self.reopen is not None else None
        except Exception as exc:  # a store gone meanwhile: keep following with what there is
            self.error = str(exc) or type(exc).__name__
            return
        if reader is None:
            return
        made = self.restarts
        try:
            if self._read_here_only and isinstance(reader, ReadAhead):  # (a read process was lost: none again)
                ahead, reader = reader, reader.here()
                ahead.close()
            self._swap_in(reader)
        except Stopped:
            reader.close()
        except Exception as exc:  # (its read process gone meanwhile: go on as before)
            reader.close()
            self.error = str(exc) or type(exc).__name__
        if self.restarts > made:
            self.restart_reads.append((span_s, self.model.nbytes()))

    #: After a failed read again here (``_read_here``), the next try waits this long
    READ_HERE_AGAIN_S = 1.0

    def _read_here(self, why: str) -> None:
        """The read process is gone (``ReadAheadLost``): the job read again in this process,
        from the same window, into a new model (nothing ingested twice), and said; no read
        process is started again (a restart at the tail reads here too).  A try that fails
        (the store gone meanwhile) is tried again ``READ_HERE_AGAIN_S`` later."""
        lost = self.reader
        assert isinstance(lost, ReadAhead)  # (only its polls raise it)
        self._read_here_only = True
        if time.monotonic() < self._read_here_at:
            return
        reader = None
        try:
            reader = lost.here()
            reader.stats.warnings.append(f"{why}: the job was read again in the console's process")
            self._swap_in(reader, bound=False)
            self.error = None  # (what the lost process said, or a failed try: read since)
        except Stopped:
            reader.close()  # (``reader`` is set: only ``_swap_in`` raises it)
        except Exception as exc:
            if reader is not None:
                reader.close()
            self._read_here_at = time.monotonic() + self.READ_HERE_AGAIN_S
            self.error = f"{why}; reading it here failed: {exc}"

    def _swap_in(self, reader: TraceReader, bound: bool = True) -> None:
        """``reader`` read to its end into a new model (a read process's: until its first
        batch that read all there was), then both swapped in for the old ones.  ``bound``:
        the model's size sets the floor of the next restart at the tail (not for a read
        again of the whole window, ``_read_here``).  Raises ``Stopped``, nothing swapped,
        where the feed is to end (``run``'s stop) before it is done: a console quit while
        it read a 16k-rank job again ends at once, not minutes later."""
        model = TraceModel()
        first = reader.read_apart(self.BUDGET)  # (in parallel where the reader can, as a first read)
        try:
            with gc_paused():
                for batch in first:
                    self._stopping()
                    model.ingest(batch.events, batch.ops, batch.spans, batch.beats)
                while True:
                    self._stopping()
                    batch = reader.poll_batch(self.BUDGET)
                    if batch.count():
                        model.ingest(batch.events, batch.ops, batch.spans, batch.beats)
                    elif not isinstance(reader, ReadAhead) or reader.read_once:
                        break
        finally:
            if isinstance(first, Generator):  # (its workers end now, where it stopped early)
                first.close()
        _noted(model, reader)
        with self.lock:
            old = self.reader
            self.close()  # (the old reader's first read, if it is still going: its workers end)
            self._carry_warnings(old.stats.warnings, reader.stats.warnings)
            self.reader, self.model = reader, model
            self._in_flight = None  # (of the model before)
            self.restarts += 1
            if bound:
                self._restart_floor = 2 * model.nbytes()
            self._next_size_check = _next_size_check(model)
            self._ended = None
        old.close()
        self.publish()
        give_back()  # the model swapped out: garbage in cycles, and its freed heap (``memory``)

    def _carry_warnings(self, old: Sequence[str], new: Sequence[str]) -> None:
        """Keep what a reader swapped out said (``old``) beside what the one swapped in said
        already (``new``), which said again what it read again (a loss in the window): that
        once, each copy the new one said standing for one said before (texts repeat for
        separate events: "reconnected to ..." each time).  A loss before the window is not
        read again, and stays said."""
        again = Counter(new)  # (a text said again twice takes two of the earlier: a reconnection each)
        before = [*self._said_before, *old]
        kept = []
        for w in before:
            if again[w]:
                again[w] -= 1
            else:
                kept.append(w)
        self._said_before_total += len(old) - (len(before) - len(kept))
        self._said_before = kept[-WARNINGS_KEPT:]

    def _stopping(self) -> None:
        if self._stop.is_set():
            raise Stopped

    def ingest(self, batch: Batch) -> None:
        """Ingest one batch (events, and op records in columns) under the lock, then publish
        the new view: at once while publishing is cheap, else at most every ten times what
        it costs (a view of 16k ranks' states takes ~0.35 s: not after every batch), within a
        second unless the console is behind (``_publish_pace``)."""
        got = batch.count()
        with self.lock:
            if got:
                self.model.ingest(batch.events, batch.ops, batch.spans, batch.beats)
            losses, ref = self.model.read_losses, self.model.reference
            _noted(self.model, self.reader)
            if self.model.read_losses != losses or self.model.reference != ref:
                # (judged again though nothing was read: a stream found not settled, or settled;
                # the job's metadata come, written after the console started: which streams are
                # foreign may change, ``TraceModel.note_job``; before, judged only when events came)
                self._dirty = True
            if got and (self._publish_cost < self.CHEAP_PUBLISH_S
                        or time.monotonic() >= self._published_at + self._publish_pace()):
                self.publish()

    #: A publish that took less than this is done after every batch
    CHEAP_PUBLISH_S = 0.02
    #: How often the reader's backlog is asked for (it stats every stream)
    BACKLOG_S = 1.0

    def publish(self) -> None:
        """Publish the model's view (see ``view``), with each rank's state at ``now``."""
        t0, cpu = time.monotonic(), time.thread_time()
        with self.lock, gc_paused():  # (16k ranks' states: as a diagnosis, see ``step``)
            now = self.now()
            self.view = self.model.view(now, rankstate.rank_states(self.model, now))
        done = time.monotonic()
        self._publish_cost = done - t0
        self.costs.publish += time.thread_time() - cpu
        self._published_at = done

    def _publish_pace(self) -> float:
        """How long a costly publish waits after the last: ten times what that cost, within
        a second; but a console behind the job (``FeedInfo.behind``, as the last step saw it:
        what it shows is seconds old already) keeps to the ten times.  Asked when a publish
        may be due, not when the last was made: a console that caught up meanwhile waits no
        longer than a second.  16k ranks: a publish costs ~0.35 s, so within a second it
        took a third of the console's time, which it needs to catch up (``bench scale``: it
        read ~84k events/s against the job's ~82k)."""
        pace = 10 * self._publish_cost
        return pace if self.info.behind else min(1.0, pace)

    def _backlog_bytes(self) -> int:
        """The reader's backlog, asked at most every ``BACKLOG_S``, or twenty times what it
        costs (16k streams: 16k stats, ~0.3 s)."""
        if time.monotonic() >= self._backlog[0]:
            t0 = time.monotonic()
            size = self.reader.backlog_bytes()
            done = time.monotonic()
            self._backlog = (done + max(self.BACKLOG_S, 20 * (done - t0)), size)
        return self._backlog[1]

    def _info(self, behind_bytes: int) -> FeedInfo:
        m = self.model
        mark = self.reader.watermark_ns() if self.mode == LIVE else None
        lag = max(0.0, (self.clock() - self._live_now()) / 1e9) if mark is not None else 0.0
        stats = self.reader.stats
        window = [x for x in self._rates if x[0] >= time.monotonic() - 2.0]
        rate = 0.0
        if len(window) >= 2:
            span = window[-1][0] - window[0][0]
            rate = sum(n for _, n in window[1:]) / span if span > 0 else 0.0
        now = self.now()
        ended = self.ended
        foreign = self.view.foreign  # (the published view's: no model state made here, off the lock)
        return FeedInfo(
            mode=self.mode, source=self.source, version=m.version, events=m.events,
            foreign_events=m.events_of(foreign) if foreign else 0, rate=rate,
            behind_bytes=behind_bytes, behind=behind_bytes > self.BUDGET or lag > self.LAG_SHOWN_S,
            lag_s=lag, catching_up=not self.caught_up() and m.events > 0,
            corrupt=stats.corrupt, invalid=stats.invalid, reused=sum(m.reused.values()), trimmed=stats.trimmed,
            warnings=tuple([*self._said_before, *stats.warnings[-WARNINGS_KEPT:]][-WARNINGS_KEPT:]),
            warnings_total=self._said_before_total + len(stats.warnings),
            waiting=m.events == 0, ended=ended,
            loaded=self.info.loaded, progress=self.info.progress, now_ns=now, error=self.error,
            restarts=self.restarts, window=self.window)

    # ------------------------------------------------------------------ replay loading
    #: While a replay loads, the console is shown what is in at most this often
    LOAD_POST_S = 0.5

    def load_all(self, progress: Callable[[Loading], None] | None = None,
                 post: Callable[[Message], Any] | None = None) -> FeedInfo:
        """Replay: read everything (op records in columns, ``BUDGET`` bytes a step), telling
        ``progress`` how far it is after each step and ``post``-ing the part read so far at
        most every ``LOAD_POST_S`` (no findings yet: a part of a trace is not judged); then
        what the polls held back (``bulk``'s last batch, as ``check`` reads it), and diagnose
        at the trace's end."""
        total = self.reader.size()
        next_post = time.monotonic() + self.LOAD_POST_S
        batches = self.reader.bulk(self.BUDGET)  # (in parallel where the store can)
        while not self.error:
            try:
                with gc_paused():
                    batch = next(batches, None)
                    if batch is None:
                        break
                    with self.lock:
                        self.model.ingest(batch.events, batch.ops, batch.spans, batch.beats)
            except Exception as exc:  # a store that vanished, a wrong password...
                self.error = str(exc) or type(exc).__name__
                break
            at = Loading.of(self.reader, total, self.model)
            if progress is not None:
                progress(at)
            if post is not None and time.monotonic() >= next_post:
                self.publish()
                self.info = dataclasses.replace(self._info(0), progress=at.fraction)
                post(FeedUpdated(self.info, []))
                next_post = time.monotonic() + self.LOAD_POST_S
        with self.lock:
            self.model.settle()
            _noted(self.model, self.reader)
            self.findings = sorted(judged(self.model, self.hang_after(), self.clock)[1], key=Finding.sort_key)
        self.diagnoses += 1
        self.publish()
        self.info = dataclasses.replace(self._info(0), loaded=True, progress=1.0)
        if progress is not None:
            at = Loading.of(self.reader, total, self.model)
            progress(at._replace(read=max(at.read, at.total)))
        return self.info

    # ------------------------------------------------------------------ thread
    def run(self, post: Callable[[Message], Any], stop: threading.Event,
            progress: Callable[[Loading], None] | None = None) -> None:
        if self.mode == REPLAY:
            info = self.load_all(progress, post)
            post(FeedUpdated(info, list(self.findings)))
            return
        self._stop = stop
        try:
            self._follow(post, stop)
        finally:
            self.close()

    def close(self) -> None:
        """End what the feed started: its first read's workers, where it is still going."""
        if self._first is not None:
            self._first.close()
            self._first_done, self._first = True, None

    def _follow(self, post: Callable[[Message], Any], stop: threading.Event) -> None:
        last_post = 0.0
        last: tuple = ()
        while not stop.is_set():
            info, got = self.step()
            mono = time.monotonic()
            # What the UI shows changed (a new diagnosis among it, or what the header says of
            # the reading: behind, the backlog, whether events come); a live job also ages
            # with the clock.  An ended job changes only when something new arrives, or its
            # reading settles (its header kept "falling behind (21.1 MiB unread)" and the rate
            # of the last post before it ended: helper-181).
            now = (info.version, info.ended, info.error, self.diagnoses, self.view.version, info.behind,
                   info.behind_bytes, info.rate > 0)
            if now != last or (not info.ended and mono - last_post >= 0.5):
                post(FeedUpdated(info, list(self.findings)))
                last, last_post = now, mono
            pause = self.pause_s(got)
            if pause:
                stop.wait(pause)


class Stopped(Exception):
    """The feed is to end (``run``'s stop was set) while it read into a new model."""


def _noted(model: TraceModel, reader: TraceReader) -> None:
    """What the model takes of its reader besides batches: its loss counts, and the job's
    metadata until it has it (``TraceModel.note_job``: what the streams' metas are
    compared with)."""
    model.note_read_stats(reader.stats)
    if model.reference is None:
        model.note_job(reader.job())


#: The share of the budget a first window is sized to fill at most (the rest: room to grow
#: before the model restarts at the tail)
FIRST_SHARE = 0.75


def first_window(open_at: Callable[[Since | None], TraceReader], since: Since | None, budget: int
                 ) -> tuple[TraceReader, Since | None, str]:
    """A reader of the window a console's first read takes (``open_at`` opens one), the
    window, and what was read instead of what was asked ("" where it is as asked, else e.g.
    "the last 14.4 s of 10 min"): a window of the last minutes (``attach``'s ten, by default)
    whose stored bytes (``backlog_bytes``, from where the reader starts each stream) would
    make a model of more than ``FIRST_SHARE`` of the budget is made the longest shorter one
    found that fits (``source.fitting_window``: in proportion while shorter windows hold
    less, then looked at between; a job younger than the window holds its bytes in less
    time), ``TAIL_FLOOR_S`` at least.  Read whole, it filled the budget first and then
    restarted at the tail: at 1,024 ranks at 25 collectives a second, ten minutes are ~3.7
    GB of model against a 1 GiB budget.  Where none fits (a store without keyframes starts
    each stream at its segment), the last ``TAIL_FLOOR_S`` if that reads less than the window
    asked, else the window as asked.  Never longer than asked.  A window at a
    time, all of a job, or a store that cannot say its bytes (Flight Recorder dumps: 0) are
    read as asked; a Redis store says an estimate (``RedisReader.backlog_bytes``)."""
    reader = open_at(since)
    if since is None or since.ago_s is None:
        return reader, since, ""
    room = budget * FIRST_SHARE
    try:
        held = model_most(reader, floor=0, per_rank=0)
        # (no floor: the budget's last quarter is the model's room to grow)
        ago = fitting_window(open_at, since, room, held, floor=0, per_rank=0) if held > room else None
        if ago is None and held > room and since.ago_s > TAIL_FLOOR_S:
            # (none fits: the shortest, where it reads less than the window asked; helper-158)
            shortest = open_at(Since(ago_s=TAIL_FLOOR_S))
            try:
                less = model_most(shortest, floor=0, per_rank=0)
            except BaseException:
                shortest.close()
                raise
            if less <= 0.9 * held:
                reader.close()
                return shortest, Since(ago_s=TAIL_FLOOR_S), _instead(Since(ago_s=TAIL_FLOOR_S), since)
            shortest.close()
    except BaseException:
        reader.close()
        raise
    ago = None if ago is None else max(TAIL_FLOOR_S, math.floor(ago * 10) / 10)  # (rounded down)
    if ago is None or ago >= since.ago_s:
        return reader, since, ""
    reader.close()
    shorter = Since(ago_s=ago)
    return open_at(shorter), shorter, _instead(shorter, since)


def _instead(read: Since, asked: Since) -> str:
    """What a console read instead of what was asked: "the last 14.4 s of 10 min"."""
    return f"{read.describe()} of {asked.describe().removeprefix('the last ')}"


def tail_span_s(model: TraceModel, budget: int, least_s: float, since_ns: int | None = None,
                held: int | None = None) -> float:
    """Seconds of the job a restart at the tail reads: the last half of what ``model`` holds,
    at least ``least_s``, but no more than half of ``budget`` holds at the job's rate
    (``TraceModel.op_rate`` from ``since_ns``, the model's window, at its bytes an op; never
    under ``TAIL_FLOOR_S``): 16k ranks at 25 collectives a second fill 1 GiB in 5-20 s, so
    a minute would hold 3-12 GiB.  ``held``: the model's ``nbytes``, where the caller has it."""
    span_s = max(least_s, (model.end_ns - model.start_ns) / 2e9)
    ops, rate = model.total_ops(), model.op_rate(since_ns)
    if ops and rate > 0:
        size = model.nbytes() if held is None else held
        span_s = min(span_s, max(TAIL_FLOOR_S, budget / 2 / (size / ops * rate)))
    return span_s


def _next_size_check(model: TraceModel) -> int:
    """The event count at which to size ``model`` next: sizing walks every rank's arrays
    (~90 ms at 16k ranks), so it is done as the model grows by an eighth, not every poll."""
    return model.events + max(100 * len(model.ranks), model.events // 8)


def read_ahead(reader: TraceReader, source: str, since: Since | None, processes: int | None = None) -> TraceReader:
    """``reader`` (a store's, opened on ``source`` from ``since`` on) with its polls made
    ahead in a child process where that is worth it (``store/readahead.py``; ``processes``:
    as many, each a part of the ranks, 0 none, None as the job's width says), paced as a
    ``Feed`` paces its own; a reader of Flight Recorder dumps as it is (nothing to follow)."""
    if isinstance(reader, FlightRecorderReader):
        return reader
    return readahead.around(reader, source, since, Feed.pacing(), processes)
