"""Opening a trace: ``open_source`` (a reader, the one way the CLI and the TUI open
anything that holds a trace) and ``load_trace`` (a whole source read into a model)."""

from __future__ import annotations

import gc
import os
import re
from collections.abc import Callable
from typing import NamedTuple

from commscope.analysis.flight_import import FlightRecorderReader, looks_like_fr_dir
from commscope.analysis.model import TraceModel
from commscope.analysis.ranks import absent, ranges
from commscope.errors import UsageError
from commscope.events import SCHEMA_VERSION, gc_paused
from commscope.redact import redact
from commscope.schema import VERSION_REFUSED
from commscope.store import ReadStats, Size, StoreError, TraceReader, backend_for, default_store, open_reader
from commscope.units import size
from commscope.window import Since


def open_source(path_or_url: str | os.PathLike | None, *, wait: bool = False, since: Since | None = None
                ) -> TraceReader:
    """A reader for a trace store or a directory of PyTorch Flight Recorder dumps, reading
    the window ``since`` on (None: everything).  Raises StoreError when it is neither."""
    reader = _open(path_or_url, wait)
    if since is not None:
        reader.start_at(since)
    return reader


def _open(path_or_url: str | os.PathLike | None, wait: bool) -> TraceReader:
    name = default_store(path_or_url)
    if not backend_for(name).local:  # only a path may also be a directory of Flight Recorder dumps
        return open_reader(name, wait=wait)
    try:
        return open_reader(name, wait=False)
    except StoreError:
        if os.path.isdir(name) and looks_like_fr_dir(name):
            return FlightRecorderReader(name)
        if wait:
            return open_reader(name, wait=True)
        raise


class Loading(NamedTuple):
    """How far a load is, for a progress bar: bytes read of ``total`` (0: unknown), events
    ingested, ranks seen."""

    read: int
    total: int
    events: int
    ranks: int

    @classmethod
    def of(cls, reader: TraceReader, total: Size, model: TraceModel) -> Loading:
        """How far ``reader`` is into ``total`` (bytes, or events where the store counts
        those), with what ``model`` holds."""
        read = reader.stats.bytes if total.unit == "bytes" else model.events
        return cls(read, total.amount, model.events, len(model.ranks))

    @property
    def fraction(self) -> float:
        """The part read, 0 to 1 (0 while the total is unknown)."""
        return min(1.0, self.read / self.total) if self.total else 0.0


#: A model's bytes per byte its store holds of the same stretch, at most: 0.21-0.26 for native
#: blocks, 0.23-0.69 for JSON op events (synthetic jobs of 64-256 ranks, their heartbeats and
#: samples with them): what a first window (``tui.feed.first_window``) and a window said to
#: fit (``fitting_window``) are sized by
MODEL_PER_STORED = 0.7
#: What a model's arrays hold before its ops fill them (an arena block, its tables: ~0.5 MB
#: at 16-64 ranks), beside what its stored bytes make (``fitting_window``)
MODEL_FLOOR = 1 << 20
#: What a model holds for each rank it reads, beside its stored bytes' part (its columns of
#: 16 ops and its table's row, its id map: 2.5-4.1 KB a rank of a few ops, native or JSON,
#: against 3.7-5.0 KB of them stored; the ranks as the store lists them,
#: ``TraceReader.rank_count``): a second of 16k ranks is ~64 MiB of model for ~8 MiB stored
MODEL_PER_RANK = 4 << 10
#: ... and at least: a read is refused before it starts only where even this much would not
#: fit (``_fits``)
MODEL_PER_STORED_LEAST = 0.2
#: ... and for each rank, beside its stored bytes' part, at least (a rank of a few ops:
#: 1.4-1.5 KB native beside x 0.2 of its bytes, more in JSON)
MODEL_PER_RANK_LEAST = 1 << 10


#: Bytes a load reads per step: the model takes each step's events and columns before the
#: next is read, so a load holds the model and one step, never the trace (a step of JSON
#: events is ~5x its size as dicts; of native blocks, ~1x as columns).
LOAD_STEP = 8 << 20


def load_trace(store: str | os.PathLike | None, progress: Callable[[Loading], None] | None = None,
               since: Since | None = None, freeze: bool = False, max_model: int | None = None
               ) -> tuple[TraceModel, TraceReader, list[str]]:
    """Read a whole source into a model: (model, the closed reader, warnings).  What
    ``check``, ``report``, ``export`` and the headless demo all start from.  Streams: the
    reader is read ``LOAD_STEP`` bytes at a time (``TraceReader.bulk``: in parallel where the
    store can), op records in columns, each step ingested before the next is read;
    ``progress`` is told after each.  Raises UsageError on input
    that cannot be used (no source, no events).  ``since``: read that window only
    (``window.py``).  ``freeze``: for a process that keeps the model until it exits (check,
    report, export), everything alive at the load's end is put out of the cyclic
    collector's sight (``gc.freeze``) before the collector resumes: its first pass would
    walk all of it (0.3 s at 16k ranks).  Not for a process that loads more than once.
    ``max_model``: refuse (UsageError) before reading where the window's stored bytes say its
    model would hold more than that many bytes (``_fits``; None: read whatever it holds)."""
    model = TraceModel()
    try:
        reader = open_source(store, since=since)
        if max_model is not None:
            _fits(reader, store, since, max_model)
        # (asked only for a bar: ``size`` stats every segment, ~20 ms at 4k ranks before the read began)
        total = reader.size() if progress is not None else None
        with gc_paused():
            for batch in reader.bulk(LOAD_STEP):
                model.ingest(batch.events, batch.ops, batch.spans, batch.beats)
                if progress is not None and total is not None:
                    progress(Loading.of(reader, total, model))
            model.settle()
            model.note_job(reader.job())  # (what ``foreign_streams`` compares the streams with)
            if freeze:
                gc.freeze()
    except StoreError as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        raise UsageError(f"cannot read {store}: {exc}") from None
    finally:
        try:
            reader.close()  # type: ignore[possibly-undefined]
        except Exception:
            pass
    stats = reader.stats
    if not model.events:
        versions = sum(n for why, n in stats.invalid_by_reason.items() if why.endswith(VERSION_REFUSED))
        if not stats.corrupt and versions and 2 * versions >= stats.invalid:  # (not damage: helper-198; most
            # of them, as a newer one's new kinds of event read as unknown, helper-201)
            raise UsageError(f"{redact(reader.description)}: written by another version of commscope: "
                             f"{versions:,} of its {stats.invalid:,} event(s) are of a schema version this one does "
                             f"not read (it reads version {SCHEMA_VERSION}); read it with the commscope that "
                             "recorded it")
        if stats.corrupt or stats.invalid:
            raise UsageError(f"{redact(reader.description)}: corrupt beyond use ({stats.corrupt} damaged "
                             f"line(s), {stats.invalid} invalid event(s), no readable event)")
        raise UsageError(f"{redact(reader.description)}: no events recorded")
    model.note_read_stats(stats)
    warnings = read_warnings(model, stats)
    start = None if since is None else since.at_ns if since.at_ns is not None else reader.window_start_ns()
    if start is not None and start > model.end_ns:  # (helper-163: not said)
        warnings.append(f"the window ({since.describe()}) starts after the trace's newest event "
                        f"({Since(at_ns=model.end_ns).describe()[6:]}): no event of the trace is in it; what is "
                        "shown is what the ranks were in as the streams' keyframes and marks said")
    elif (start is not None and start > (first := model.own_bounds()[0]) and not stats.skipped_bytes
          and not stats.skipped_events and not stats.summarized and not stats.gone_before_window):
        # (a copy: one file a rank, no segment or keyframe to start a window at; read whole unsaid: helper-166)
        warnings.append(f"the window ({since.describe()}) skipped nothing: each stream was read from its start (no "
                        f"keyframe, mark or segment of it starts later), {(start - first) / 1e9:,.1f} s before the "
                        "window")
    return model, reader, warnings


def _fits(reader: TraceReader, store: str | os.PathLike | None, since: Since | None, limit: int) -> None:
    """Raise UsageError, before a byte is read, where what ``reader`` would read (its stored
    bytes from where it starts each stream: ``backlog_bytes``) makes a model of more than
    ``limit`` bytes even at the least a stored byte and a rank make
    (``MODEL_PER_STORED_LEAST``, ``MODEL_PER_RANK_LEAST``): a
    window of a large job's last half hour is hundreds of GB stored, read for minutes before
    the process ran out of memory.  Says a window that fits at the most a stored byte makes
    (``fitting_window``).  A store that cannot say its bytes (a directory of Flight Recorder dumps:
    0) is read as asked."""
    stored, ranks = reader.least_backlog_bytes(), reader.rank_count()
    least = stored * MODEL_PER_STORED_LEAST + ranks * MODEL_PER_RANK_LEAST
    if least <= limit:
        return
    what = since.describe() if since is not None else "all"
    ago = fitting_window(lambda window: open_source(store, since=window), since, limit,  # (the window asked: not listed again)
                         held_asked=model_most(reader))
    if ago is not None:
        shorter = f"try --since {_duration(ago)}"
    elif ranks * MODEL_PER_RANK_LEAST > limit:
        shorter = (f"no window of it fits (its {ranks:,} ranks hold at least {size(MODEL_PER_RANK_LEAST)} each,\n"
                   f"  {size(ranks * MODEL_PER_RANK_LEAST)}, whatever they read)")
    elif ranks * MODEL_PER_RANK > limit:
        shorter = (f"no window of it is sure to fit (its {ranks:,} ranks may hold up to {size(MODEL_PER_RANK)}\n"
                   f"  each, {size(ranks * MODEL_PER_RANK)}, whatever they read)")
    else:
        shorter = ("no window of it fits (its last second reads more: its streams start\n  at segments, "
                   "or marks, that large, or the limit is about what a model\n  holds empty)")
    ranks_part = f", and {size(MODEL_PER_RANK_LEAST)} for each of {ranks:,} ranks" if ranks else ""
    raise UsageError(f"{redact(reader.description)}: {what} of it would hold at least {size(least)} in memory\n"
                     f"  ({size(stored)} stored x {MODEL_PER_STORED_LEAST:g}{ranks_part}),\n"
                     f"  more than --max-memory {size(limit)}:\n"
                     f"  {shorter},\n  or --max-memory none to read it anyway")


def model_most(reader: TraceReader, floor: float = MODEL_FLOOR, per_rank: float = MODEL_PER_RANK) -> float:
    """The most a model of what ``reader`` would read holds: its stored bytes (from where it
    starts each stream) x ``MODEL_PER_STORED``, ``floor``, and ``per_rank`` for each rank (the
    ranks not listed where it is 0).  What a window is sized by (``fitting_window``,
    ``tui.feed.first_window``)."""
    return reader.backlog_bytes() * MODEL_PER_STORED + floor + (reader.rank_count() * per_rank if per_rank else 0)


#: The window tried first for a whole read, or one from a time, that does not fit (``fitting_window``)
WHOLE_TRIED_S = 600.0


def fitting_window(open_at: Callable[[Since], TraceReader], since: Since | None, limit: float,
                   held_asked: float | None = None, floor: float = MODEL_FLOOR,
                   per_rank: float = MODEL_PER_RANK) -> float | None:
    """The longest window back from the end (seconds) found whose model fits ``limit`` at
    the most a stored byte makes (``MODEL_PER_STORED``, and ``floor``: ``MODEL_FLOOR``, and
    ``per_rank`` for each rank it reads: ``MODEL_PER_RANK``), each window
    opened (``open_at``) and its stored bytes looked at, from where it starts each stream:
    from the window asked (``held_asked``: what its model would hold, where the caller
    knows; a whole read, or one from a time: ten minutes, longer while they fit), made
    shorter in proportion while shorter windows hold less, else its last second; then
    halved in log space between one that fits and one that does not, a few times.  None
    where even one second does not fit (streams that start at segments larger than that: no
    keyframes).  A few listings of the store: ~0.2 s each at 8k ranks.  What ``check
    --max-memory`` says to try (``_fits``) and ``attach``'s first window (``tui.feed``)."""
    def held(ago: float) -> float:
        reader = open_at(Since(ago_s=ago))
        try:
            return model_most(reader, floor, per_rank)
        finally:
            reader.close()

    lo: float | None = None  # the longest window found that fits
    asked = since is not None and since.ago_s is not None
    hi = since.ago_s if asked else WHOLE_TRIED_S  # ... one that does not
    hi_held = held_asked if asked and held_asked is not None else held(hi)
    if hi_held <= limit:  # (ten minutes of a whole read fit: longer ones, while they do)
        lo, lo_held = hi, hi_held
        for _ in range(4):
            longer = lo * 4
            got = held(longer)
            if got > limit:
                hi, hi_held = longer, got
                break
            if got <= lo_held:  # (it reads no more: the job is no longer than that)
                return lo
            lo, lo_held = longer, got
        else:
            return lo
    if lo is None:
        for _ in range(4):  # (in proportion, while shorter windows hold less)
            guess = hi * limit / hi_held * 0.75
            if guess < 1:
                break
            got = held(guess)
            if got <= limit:
                lo = guess
                break
            shrank = got <= 0.9 * hi_held
            hi, hi_held = guess, got
            if not shrank:  # (a job younger than the window, or streams starting at segments)
                break
        if lo is None:
            if hi <= 1 or held(1.0) > limit:
                return None
            lo = 1.0
    for _ in range(4):  # (between one that fits and one that does not)
        if hi / lo < 1.25:
            break
        mid = (lo * hi) ** 0.5
        if held(mid) <= limit:
            lo = mid
        else:
            hi = mid
    return lo


def _duration(seconds: float) -> str:
    """``seconds`` as ``--since`` reads it, rounded down (a shorter window holds no more):
    "45s", "12m", "3h"."""
    if seconds >= 2 * 3600:
        return f"{int(seconds // 3600)}h"
    if seconds >= 120:
        return f"{int(seconds // 60)}m"
    return f"{int(seconds)}s"


def read_warnings(model: TraceModel, stats: ReadStats) -> list[str]:
    """What the reader had to skip or could not see, as short lines (bounded whatever the input)."""
    warnings = list(stats.warnings[:50])
    if len(stats.warnings) > 50:
        warnings.append(f"... and {len(stats.warnings) - 50} more reader warning(s)")
    if stats.corrupt:
        per = ", ".join(f"rank {r}: {n}" for r, n in sorted(stats.corrupt_by_rank.items())[:16])
        warnings.append(f"skipped {stats.corrupt} damaged line(s) ({per})")
    if stats.invalid:
        why = ", ".join(f"{reason}: {n}" for reason, n in sorted(stats.invalid_by_reason.items(),
                                                                    key=lambda kv: -kv[1])[:8])
        warnings.append(f"skipped {stats.invalid} invalid event(s) ({why})")
    if model.reused:
        per = ", ".join(f"rank {r}: {n}" for r, n in sorted(model.reused.items())[:16])
        warnings.append(f"{sum(model.reused.values())} op begin(s) reused an op id their rank had begun, as a "
                        f"damaged or foreign trace does ({per}): each phase was paired with the latest begin of its "
                        "id before it")
    if stats.trimmed:
        warnings.append("the store no longer held the oldest events of some ranks (trimmed, or lost: each rank's "
                        "warning says which): early ops may be missing")
    if stats.summarized:
        n = len(stats.summarized_by_rank)
        ops = sum(op.get("count", 0) for rt in model.ranks.values() for s in rt.summaries for op in s.get("ops", ()))
        warnings.append(f"retention summarized {stats.summarized:,} older event(s) ({ops:,} op(s): report's history "
                        f"counts these) of {n:,} rank(s) and deleted them: their counts, bytes and latencies per "
                        "minute are kept (commscope report)")
    if stats.skipped_bytes:
        warnings.append(f"{size(stats.skipped_bytes)} of history before the window not read "
                        f"({len(stats.skipped_by_rank):,} rank(s); drop --since to read it)")
    if stats.skipped_events:
        warnings.append(f"{stats.skipped_events:,} event(s) of history before the window not read "
                        f"({len(stats.skipped_events_by_rank):,} rank(s) whose older events are gone; drop --since "
                        "to read them)")
    if stats.gone_before_window:
        warnings.append(f"{stats.gone_before_window:,} older event(s) before the window are no longer in the store "
                        f"({len(stats.gone_before_window_by_rank):,} rank(s): trimmed by maxlen, or lost: each rank's "
                        "warning says which): gone, not skipped; dropping --since does not bring them back")
    foreign = model.foreign_streams
    if foreign:
        warnings.append(f"rank(s) {ranges(sorted(foreign), limit=8)}: not of the run the others are, kept out of the "
                        "matching, the diagnosis and the report (" + "; ".join(f"rank {r}: {why.message}" for r, why in sorted(foreign.items())[:4]) +
                        ("; ..." if len(foreign) > 4 else "") + ")")
    for r in model.rank_ids()[:64]:
        if model.ranks[r].dropped:
            why = model.ranks[r].drop_reason
            warnings.append(f"rank {r}: the recorder dropped {model.ranks[r].dropped:,} event(s)" + (f" ({why})" if why else ""))
    ws = model.world_size
    present = model.rank_ids()
    missing = ws - sum(1 for r in present if r < ws)
    if 0 < missing < ws:
        warnings.append(f"no events from rank(s) {ranges(absent(present, ws), limit=8)} of world size {ws}")
    return warnings


# ---------------------------------------------------------------------- torchrun restarts
#: A job id that names attempt N of a torchrun run (``record.jobid.attempt_job_id``):
#: ``<base>-a<N>``, where a base drawn by rank 0, ``<time>-<run key>``, is grouped by its
#: run key alone (each attempt draws its own time), and any other base (``--job``) is the
#: run, attempt 0 keeping the base as its id.
ATTEMPT_ID = re.compile(r"^(?P<base>.+)-a(?P<n>0|[1-9][0-9]{0,7})$")
DRAWN_BASE = re.compile(r"^(?P<ts>[0-9]{8}-[0-9]{6})-(?P<key>[0-9a-f]{6})$")
#: Earlier attempts ``check`` reads and judges at most (the newest); older ones are only
#: named (each is a whole trace: a 16k-rank run restarted often would cost a read each)
MAX_EARLIER = 2
#: Earlier attempts named at most, one line each (the newest); the others are counted
MAX_LISTED = 4
#: Jobs whose metadata is read at most to find the earlier attempts (one small read each)
MAX_LOOKED_AT = 64


class Attempt(NamedTuple):
    run: str  # what all attempts of the run share: a drawn id's run key, else the base id
    number: int
    order: str  # how attempts of one run sort in time: a drawn id's time ("" for a given base)
    base: str | None  # a given base: attempt 0's own id (None for a drawn id)


def parse_attempt(job: str | None) -> Attempt | None:
    """The run and attempt a job id names, or None for the id of no torchrun attempt (a job
    run otherwise, or recorded before ids said so).  An id alone proves nothing (a user's
    ``--job ablation-a2``): ``restarts`` asks the job's metadata too."""
    m = ATTEMPT_ID.match(job or "")
    if m is None:
        return None
    drawn = DRAWN_BASE.match(m["base"])
    if drawn is not None:
        return Attempt(drawn["key"], int(m["n"]), drawn["ts"], None)
    return Attempt(m["base"], int(m["n"]), "", m["base"])


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def stated_attempt(reader: TraceReader, model: TraceModel | None = None) -> int | None:
    """Which attempt of a torchrun run its recorder said the job is (``attempt`` in each rank's
    meta, rank 0's count, and in the job's metadata): the ranks' metas where ``model`` holds
    any that say one (all alike, else rank 0's), else the job's metadata; None where nothing
    says (not torchrun, or recorded before commscope wrote it)."""
    if model is not None:
        said = {r: n for r, rt in model.ranks.items() if rt.meta and (n := _count(rt.meta.get("attempt"))) is not None}
        if said:
            values = set(said.values())
            return values.pop() if len(values) == 1 else said.get(0)
    try:
        job = reader.job() or {}
    except Exception:
        return None
    return _count(job.get("attempt"))


def _job_attempt(row, name: str, job: str) -> int | None:
    """The attempt job ``job`` of store ``name`` says it is in its metadata (None: it says none)."""
    try:
        reader = row.reader(row.with_job(name, job), wait=False)
    except Exception:
        return None
    try:
        return stated_attempt(reader)
    finally:
        close = getattr(reader, "close", None)
        if close is not None:
            try:
                close()
            except Exception:
                pass


class EarlierAttempt(NamedTuple):
    number: int
    job: str
    name: str  # the store name that opens exactly that job


class Restarts(NamedTuple):
    """The job read is attempt ``attempt`` (> 0) of a torchrun run that restarted:
    ``attempt`` earlier attempts, each either in ``earlier``, or in ``untraced``, or in
    ``unlisted``."""

    attempt: int
    run: str
    earlier: list[EarlierAttempt]  # the newest found in the store, newest first (MAX_LISTED at most)
    untraced: int  # earlier attempts of which the store holds no job (among those looked for)
    unlisted: int  # the others: found but older than those listed, or not looked for
    listed: bool  # False: the store could not list its jobs (a server down), so none was looked for


def restarts(store: str | os.PathLike | None, reader: TraceReader, model: TraceModel | None = None
             ) -> Restarts | None:
    """When the job ``reader`` read (``model``: what it read, where loaded) is attempt N > 0 of
    a torchrun run, its earlier attempts found in the same store (None otherwise).  A job is
    an attempt only where its id names the attempt and its recorder said so too (``attempt``
    in its ranks' metas, ``stated_attempt``): a user's job named like one (``--job
    ablation-a2``), or one recorded before commscope wrote it, is none.  Each earlier attempt
    is the newest job of the run with that number, older than the attempt after it, whose
    metadata says that number; a run's attempts are walked back in time, and a job of the
    run numbered higher than the one expected (an older run with the same ``--rdzv-id``)
    ends the walk.  At most ``MAX_LISTED`` are listed and ``MAX_LOOKED_AT`` jobs' metadata
    read: the rest are counted (an attempt of which the store holds no job died before
    ``init_process_group`` returned, or was not recorded here)."""
    job = reader.job_name()
    me = parse_attempt(job)
    if me is None or me.number == 0 or stated_attempt(reader, model) != me.number:
        return None
    job_dir = getattr(reader, "job_dir", None)  # (a directory store's job: its store is the directory above)
    name = str(job_dir.parent) if job_dir is not None else default_store(store)
    row = backend_for(name)
    name = row.unpinned(name)  # (a Redis URL naming this attempt: each earlier one is named in its place)
    found: set[str] | None = None
    if row.jobs is not None:
        try:
            found = row.jobs(name)
        except Exception:
            found = None
    if found is None:
        return Restarts(me.number, me.run, [], 0, me.number, False)
    mine = []
    for other in found:
        # (a given base is attempt 0's own id, even where it ends like an attempt's: "exp-a2")
        a = Attempt(me.run, 0, "", me.base) if me.base is not None and other == me.base else parse_attempt(other)
        if a is not None and (a.run, a.base is None) == (me.run, me.base is None) and other != job \
                and (a.order, a.number) <= (me.order, me.number):
            mine.append(((a.order, a.number), a.number, other))
    earlier: list[EarlierAttempt] = []
    expect, lowest, looked, traced, walked_all = me.number - 1, me.number, 0, 0, True
    for _, number, other in sorted(mine, reverse=True):
        if number > expect or expect < 0:
            break
        if looked >= MAX_LOOKED_AT:
            walked_all = False
            break
        looked += 1
        if _job_attempt(row, name, other) != number:
            continue  # (named like an attempt of the run, but its recorder did not say so)
        if len(earlier) < MAX_LISTED:
            earlier.append(EarlierAttempt(number, other, row.with_job(name, other)))
        traced += 1
        lowest, expect = number, number - 1
    # (where the walk stopped early, the attempts below the oldest one found were not looked for)
    untraced = (me.number if walked_all else me.number - lowest) - traced
    return Restarts(me.number, me.run, earlier, untraced, me.number - len(earlier) - untraced, True)
