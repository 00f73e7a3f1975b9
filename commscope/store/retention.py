"""A bounded history for a directory store: the oldest segments summarized, then deleted.

A week-long job writes without end; ``COMMSCOPE_RETAIN`` (``commscope run --retain``) bounds
each rank stream: a size (``2GiB``), an age (``7d``: segments that ended that long before
the stream's newest one), both (``2GiB,7d``) or ``none``.  The default keeps ``DEFAULT``.

When a writer starts a new segment, it runs this module in a child process at the lowest
priority (``python -m commscope.store.retention``), never in the training process: the
child carries the ops in flight at the end of the closed segment (``store/inflight.py``)
and, where the stream is past its limit, summarizes each segment it drops first, appending one
``summary`` event per segment to ``rank-00003.summary.jsonl`` (per op and group: counts,
bytes, failures, and per minute a latency histogram in powers of two of microseconds), and
only then deletes it.  Readers read the summaries with the stream and count what they
stand for (``ReadStats.summarized_by_rank``): nothing is dropped unsaid.  A summary whose
segment a reader reads anyway (a child stopped between the two steps) stands for nothing to
that reader; a segment is summarized once (a second child finds it summarized and only
deletes it), and one child works on a stream at a time (a lock on its summary file).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import subprocess
import sys
import warnings
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

import numpy as np
import orjson

from commscope.schema import MAX_REASONS, REASON, SCHEMA_VERSION
from commscope.store import children, inflight, keyframes
from commscope.store.files import O_NOFOLLOW, create_file, mode_of, read_from, size_of
from commscope.store.segments import (
    META_BYTES,
    Segment,
    lines_before,
    segments_of,
    stream_prefix,
    summary_name,
)
from commscope.window import DURATION_UNITS

ENV_RETAIN = "COMMSCOPE_RETAIN"
#: Sizes: decimal with B (``500MB``), binary with iB or alone (``2GiB``, ``2G``, ``500M``); never
#: ``m`` in lower case, which ``--since`` reads as minutes (helper-166: ``30m`` kept 30 MiB a rank)
_UNITS = {"b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4, "kib": 1 << 10, "mib": 1 << 20,
          "gib": 1 << 30, "tib": 1 << 40, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_PART = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]+)\s*$")
MINUTE_NS = 60 * 1_000_000_000
BUCKETS = 32  # latency histogram: bucket b holds latencies in [2^b, 2^(b+1)) us (b 0: under 2 us)


def bucket_of(lat_ns: int) -> int:
    """The histogram bucket of a latency (the last one holds every longer one)."""
    return min(BUCKETS - 1, max(0, int(np.log2(max(lat_ns / 1000.0, 1.0)))))


def bucket_mid_s(bucket: int) -> float:
    """The middle of a bucket, in seconds: what a quantile read from the histogram says."""
    return 1.5 * (1 << bucket) / 1e6


class Retention(NamedTuple):
    """How much of each rank stream to keep: bytes, and seconds before its newest segment
    (None: no bound)."""

    max_bytes: int | None
    max_age_s: float | None

    def describe(self) -> str:
        from commscope.units import size

        parts = []
        if self.max_bytes is not None:
            parts.append(f"{size(self.max_bytes)} per rank")
        if self.max_age_s is not None:
            parts.append(age_text(self.max_age_s))
        return ", ".join(parts) or "everything"

    @property
    def bounded(self) -> bool:
        return self.max_bytes is not None or self.max_age_s is not None


#: A size limit's segments are at most this share of it (and at least ``MIN_SEGMENT_BYTES``):
#: the segment being written is never deleted, so 64 MiB segments kept 62 MB of a rank under
#: ``--retain 1MiB`` (helper-187)
SEGMENT_SHARE = 4
MIN_SEGMENT_BYTES = 1 << 20


def segment_bytes_for(segment_bytes: int, limit: Retention) -> int:
    """The segment size a writer keeping ``limit`` uses, of ``segment_bytes`` asked."""
    if limit.max_bytes is None:
        return segment_bytes
    return min(segment_bytes, max(MIN_SEGMENT_BYTES, limit.max_bytes // SEGMENT_SHARE))


def age_text(seconds: float) -> str:
    """An age in the largest unit it is a whole number of (7 d, 36 h, 90 s), as ``--retain``
    takes them: ``run`` said "0.00416667 h" for ``--retain 15s`` (helper-187)."""
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g} {unit}"
    return f"{seconds:g} s"


#: Keep 1 GiB per rank stream (about a day of a busy rank), summarize the rest.
DEFAULT = Retention(1 << 30, None)
NONE = Retention(None, None)


def parse(text: str) -> Retention:
    """``2GiB``, ``500MB``, ``7d``, ``12h``, ``2GiB,7d`` or ``none``; ValueError otherwise."""
    text = text.strip()
    if text.lower() in ("none", "all", "unlimited", "off"):
        return NONE
    max_bytes, max_age = None, None
    for part in text.split(","):
        m = _PART.match(part)
        if m is None:
            raise ValueError(f"cannot read {part.strip()!r}: give a size (2GiB) or an age (7d), or both: 2GiB,7d")
        n, unit = float(m.group(1)), m.group(2).lower()
        if m.group(2) == "m":  # (M alone is MiB, as G is GiB: only m reads as minutes elsewhere)
            raise ValueError(f"{part.strip()!r}: a size or an age? write {m.group(1)}MiB or {m.group(1)}min")
        if unit in _UNITS:
            if max_bytes is not None:
                raise ValueError(f"two sizes in {text!r}: give one size, one age, or one of each")
            max_bytes = int(n * _UNITS[unit])
        elif unit in DURATION_UNITS:
            if max_age is not None:
                raise ValueError(f"two ages in {text!r}: give one size, one age, or one of each")
            if n * DURATION_UNITS[unit] < 1:
                raise ValueError(f"{part.strip()!r}: an age of 1 s or more (0 would keep only the segment being "
                                 "written)")
            max_age = n * DURATION_UNITS[unit]
        else:
            raise ValueError(f"unknown unit {unit!r} in {part.strip()!r}: sizes B, KB, MB, GB, KiB, MiB, GiB "
                             "(or K, G: binary); ages s, min, h, d, w")
    if max_bytes is not None and max_bytes < (1 << 20):
        raise ValueError("keep at least 1 MiB per rank")
    return Retention(max_bytes, max_age)


def from_env() -> Retention:
    """``$COMMSCOPE_RETAIN``, else ``DEFAULT``.  A value that cannot be read keeps everything
    (a typo never deletes history) and says so once."""
    text = os.environ.get(ENV_RETAIN, "").strip()
    if not text:
        return DEFAULT
    try:
        return parse(text)
    except ValueError as exc:
        warnings.warn(f"commscope: ${ENV_RETAIN}={text!r} cannot be read ({exc}): keeping all history",
                      RuntimeWarning, stacklevel=2)
        return NONE


def to_drop(segs: list[Segment], sizes: list[int], retain: Retention) -> list[Segment]:
    """Which of a stream's segments (oldest first, the newest being written) go: the
    oldest while the stream holds more than ``max_bytes``, and those that ended more than
    ``max_age_s`` before the newest began.  Never the newest."""
    out: list[Segment] = []
    total = sum(sizes)
    newest = segs[-1].start_s if segs else 0
    for i, seg in enumerate(segs[:-1]):
        ended = segs[i + 1].start_s
        too_big = retain.max_bytes is not None and total > retain.max_bytes
        too_old = retain.max_age_s is not None and ended and newest - ended > retain.max_age_s
        if not (too_big or too_old):
            break
        out.append(seg)
        total -= sizes[i]
    return out


class Carried(NamedTuple):
    """An op a summary counts, as a summary lists those carried into its segment
    (``carried``: a reader that read one before it jumped over the segment takes it out)."""

    id: int
    op: str
    group: str
    in_bytes: int
    out_bytes: int
    failed: bool
    begin_ns: int
    done_ns: int  # 0: not done
    #: The phase that completed it (the one that raised, where it did); "": none (not done,
    #: or a nested op done with its parent)
    done_phase: str = ""
    approx: bool = False  # that phase's time only a bound (an end the recorder did not see)

    @property
    def latency(self) -> int:
        return max(0, self.done_ns - self.begin_ns)

    def completion(self, rank: int, unissued: bool = False) -> dict:
        """The op event that completes it, as a reader that read its begin but not the
        segment it was done in is told (``completions``); ``unissued``: that end said the
        backend refused the op and its number went back (the summary's ``unissued_ids``)."""
        return {"type": "op", "v": SCHEMA_VERSION, "rank": rank, "ts": self.done_ns, "phase": self.done_phase,
                "id": self.id, **({"exc": RAISED} if self.failed else {}), **({"approx": True} if self.approx else {}),
                **({"unissued": True} if unissued and self.failed and self.done_phase == "end" else {})}


#: What a reader says an op raised where the text was in a segment retention deleted (a text
#: read before stays: ``TraceModel`` keeps an op's first)
RAISED = "raised (its exception was in a segment that retention deleted)"


class _Rows:
    """A summary's rows (per op and group: counts, bytes, failures and per minute a latency
    histogram: ops, latency sum and max, ops per bucket) as they are added up; ``rows``
    writes them out as a summary holds them."""

    def __init__(self, rows: Iterable[dict] = ()) -> None:
        self._per: dict[tuple[str, str], dict] = {}
        for row in rows:  # (a summary's, to take ops out of: ``counted``)
            mine = self._row(str(row.get("op", "?")), str(row.get("group", "?")))
            for k in _COUNTS:
                mine[k] += int(row.get(k) or 0)
            for minute, n, total, most, buckets in row.get("minutes") or ():
                cell = self._cell(mine, minute // MINUTE_NS)
                cell[0] += n
                cell[1] += total
                cell[2] = max(cell[2], most)
                for bucket, c in buckets:
                    cell[3][bucket] += c

    def _row(self, op: str, group: str) -> dict:
        row = self._per.get((op, group))
        if row is None:
            row = self._per[(op, group)] = {"op": op, "group": group, **dict.fromkeys(_COUNTS, 0), "minutes": {}}
        return row

    @staticmethod
    def _cell(row: dict, minute: int) -> list:
        return row["minutes"].setdefault(minute, [0, 0, 0, Counter()])

    def add(self, op: Carried, sign: int = 1, top: bool = True) -> None:
        """One op (``sign`` -1: taken out): its begin's op, group and bytes, whether it
        raised, when it began and was done (0: not done, no latency).  ``top``: its latency
        counts in its minute's max (a max cannot be taken out again: a summary's rows leave
        out of it the ops carried into its segment, ``top_of`` puts in those a reader adds)."""
        row = self._row(op.op, op.group)
        for k, v in zip(_COUNTS, (1, op.in_bytes, op.out_bytes, not op.done_ns, op.failed), strict=True):
            row[k] = max(0, row[k] + sign * v)
        if op.done_ns:
            lat = op.latency
            cell = self._cell(row, op.begin_ns // MINUTE_NS)
            cell[0] = max(0, cell[0] + sign)
            cell[1] = max(0, cell[1] + sign * lat)
            if top and sign > 0:
                cell[2] = max(cell[2], lat)
            b = bucket_of(lat)
            cell[3][b] = max(0, cell[3][b] + sign)

    def top_of(self, op: Carried) -> None:
        """``op``'s latency in its minute's max (an op the rows count, left out of it)."""
        if op.done_ns:
            cell = self._cell(self._row(op.op, op.group), op.begin_ns // MINUTE_NS)
            cell[2] = max(cell[2], op.latency)

    def rows(self) -> list[dict]:
        return [{**{k: v for k, v in row.items() if k != "minutes"},
                 "minutes": [[mi * MINUTE_NS, c[0], c[1], c[2], sorted((b, n) for b, n in c[3].items() if n)]
                             for mi, c in sorted(row["minutes"].items()) if c[0]]}
                for row in self._per.values() if row["count"]]


#: A summary row's counts, in the order ``_Rows.add`` adds an op to them
_COUNTS = ("count", "in_bytes", "out_bytes", "unfinished", "failed")


def summarize(path: Path, rank: int, number: int, carried_in: bytes = b"", lines_after: int | None = None,
              lines_before_it: int | None = None) -> dict:
    """The ``summary`` event of one segment: per op and group, counts, bytes, failures and
    per minute a latency histogram; what the segment held in events and bytes, and what it
    lost (``_lost``: a reader counts it as if it had read the segment).  The ops it
    stands for are those carried into it (``carried_in``: the previous segment's carry) or
    begun in it, but those carried on out of it (its own carry, which a reader after it
    reads as ops: ``Replayed.carried_out``), so each op is counted once: in one summary, or
    in what is read.  Those carried into it are also listed (``carried``): a reader that
    read them before retention deleted the segments under it has counted them already, and
    takes them out (``counted``).  Their latencies are left out of the rows' per-minute
    max, which could not be taken out again; a reader puts back those it does not take
    out, and one before these lists reads the rows as before, all but those maxima.
    ``lines_after``: the lines written before the next segment, as its meta says, which
    says the lines cut off the end of this one (``cut``); ``lines_before_it``: this one's,
    where its own meta cannot say (a file cut to nothing)."""
    data = inflight.read_segment(path)
    got = inflight.replay(carried_in, data, rank)
    carried_out = set(got.carried_out())
    rows, carried, stamps, unissued = _Rows(), [], [], []
    for op_id, b in got.begins.items():
        if op_id in carried_out:
            continue
        by = (got.done_by or {}).get(op_id)
        op = Carried(op_id, str(b.get("op", "?")), str(b.get("group", "?")), int(b.get("in_bytes") or 0),
                     int(b.get("out_bytes") or 0), op_id in got.failed, b["ts"], got.done.get(op_id, 0),
                     by["phase"] if by is not None else "", bool(by is not None and by.get("approx")))
        stamps.append(op.begin_ns)
        into = op_id in got.carried_in
        rows.add(op, top=not into)
        if into:
            carried.append(list(op))
            if by is not None and by.get("unissued") is True:  # (a reader that read its begin drops its seq)
                unissued.append(op_id)
    first, last = (min(stamps), max(stamps)) if stamps else (0, 0)
    before = 0 if number == 0 else lines_before(data)  # (its meta says them: ``segments.opening_meta``)
    if before is None:
        before = lines_before_it
    torn = not data.endswith(b"\n") and bool(data)  # (its last line cut: a reader counts it damaged)
    lines = data.count(b"\n") + torn
    gaps = len(got.losses.gaps) if got.losses is not None else 0  # (lines gone inside it: counted as its gaps)
    cut = lines_after - before - lines - gaps if lines_after is not None and before is not None else 0
    upto = before + lines + gaps + max(0, cut) if before is not None else None
    return {"type": "summary", "v": SCHEMA_VERSION, "rank": rank, "ts": last, "seg": number, "first_ns": first,
            "last_ns": last, "events": got.events, "size": len(data), "ops": rows.rows(),
            **({"carried": carried} if carried else {}), **({"unissued_ids": unissued} if unissued else {}),
            **({"lines_before": before, "lines_upto": upto} if before is not None else {}),
            **_lost(got.losses, torn, max(0, cut))}


def counted(summary: dict, read_upto: int = -1) -> dict:
    """A summary as a reader counts it: the ops carried into its segment (``carried``) that
    the reader read before it jumped over the segment (ids up to ``read_upto``) taken out
    of its rows, the others' latencies put in their minutes' max, so no op is counted twice
    and every figure is the ops' it stands for; the summary as it was where it lists none
    (one written before these lists counts them in its rows, max included)."""
    carried = summary.get("carried")
    lists = ("carried", "unissued_ids")
    if not carried:
        return {k: v for k, v in summary.items() if k not in lists} if "unissued_ids" in summary else summary
    rows = _Rows(summary.get("ops") or ())
    for entry in carried:
        op = Carried._make(entry)
        if op.id <= read_upto:
            rows.add(op, sign=-1)
        else:
            rows.top_of(op)
    return {k: v for k, v in summary.items() if k not in lists} | {"ops": rows.rows()}


#: Every op id a stream may hold (a rank of one incarnation: its completions may name any)
ANY_ID = range(1 << 63)


def completions(summary: dict, read_upto: int, ids: range = ANY_ID) -> list[dict]:
    """What a reader that read the begins of ops carried into a deleted segment (ids up to
    ``read_upto``) did not read of them: the op events that completed them there (it kept
    them in flight for good: a console behind showed their ranks blocked in an op done
    hours before).  A phase it read already comes again with the same time, which changes
    nothing; where it raised, the text is not in a summary (``RAISED``: one read before stays),
    but whether the backend refused it and its number went back is (``unissued_ids``).
    ``ids``: the only ids it may name (a rank's other incarnations have theirs)."""
    unissued = set(summary.get("unissued_ids") or ())
    return [op.completion(summary["rank"], op.id in unissued) for op in map(Carried._make, summary.get("carried") or ())
            if op.id <= read_upto and op.done_phase and op.id in ids]


def _lost(losses: inflight.Losses | None, torn: bool = False, cut: int = 0) -> dict:
    """A summary's keys for what its segment lost (none where it lost nothing), so a reader
    that never reads the segment counts it as a read of it would: damaged lines (its last
    one ``torn``: cut in two), invalid events by reason (a reason the schema would not take
    as one is "other"), the lines the store lost and why, the whole lines gone from its end
    (``cut``, as ``DirectoryReader._count_cut`` counts them), the gaps in its ring positions
    (lines gone from its file) and their bytes of op records.  Before, a segment cut short
    was summarized as whole: the trace it left read healthy (helper-173)."""
    out: dict = {"cut": cut} if cut else {}
    if losses is None:
        return out | ({"damaged": 1} if torn else {})
    if losses.damaged + torn:
        out["damaged"] = losses.damaged + torn
    invalid: Counter = Counter()
    for reason, n in losses.invalid.items():
        known = REASON.fullmatch(reason) is not None and (reason in invalid or len(invalid) < MAX_REASONS)
        invalid[reason if known else "other"] += n
    if invalid:
        out["invalid"] = dict(invalid)
    if losses.entries:
        out |= {"entries": losses.entries, "reason": losses.reason}
    if losses.gaps:
        out |= {"gaps": len(losses.gaps), "gap_bytes": sum(losses.gaps)}
    return out


def close_stream(directory: Path, rank: int, incarnation: int, retain: Retention) -> int:
    """What follows a writer's new segment: the ops in flight at the end of each closed one
    carried (``store/inflight.py``), then the history bounded (``enforce``); how many
    segments went.  The directory is listed once for both."""
    try:
        names = os.listdir(directory)
    except OSError:
        return 0
    stream = (rank, incarnation)
    segs = segments_of(names, directory).get(stream, [])
    inflight.write_carries(directory, stream, segs, set(names))
    return enforce(directory, rank, incarnation, retain, segs)


def enforce(directory: Path, rank: int, incarnation: int, retain: Retention, segs: list[Segment]) -> int:
    """Summarize, then delete, the segments of one stream (``segs``, oldest first) past
    ``retain``; how many went.  The carry of the newest one deleted stays (the oldest left
    starts from it)."""
    stream = (rank, incarnation)
    if len(segs) < 2 or not retain.bounded:
        return 0
    drop = to_drop(segs, [size_of(s.path) for s in segs], retain)
    if not drop:
        return 0  # (no summary file made: readers open every one on each listing)
    gone = 0
    summary = directory / summary_name(rank, incarnation)
    # (the job's file mode, its segments', exactly: not what the umask leaves of it)
    lock = create_file(summary, os.O_WRONLY | os.O_APPEND | O_NOFOLLOW, mode_of(segs[0].path))
    try:
        try:  # one child at a time per stream (a rank's, and one a forwarder started)
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return 0
        done, upto = _last_summarized(summary)
        upto_seg = done  # (the lines written to the end of the segment summarized last: one cut to nothing after it)
        # (segments are numbered one after the other: each one's carry is the next one's before)
        before = _carried(directory, stream, drop[0].number - 1) if drop[0].number > 0 else b""
        after = {s.number: s for s in segs}
        for seg in drop:
            out = _carried(directory, stream, seg.number)
            if out is None:
                break  # not carried yet: deleting it would lose what was in flight at its end
            if seg.number > done:  # (a child stopped after summarizing it: once is enough)
                nxt = after.get(seg.number + 1)
                try:
                    said = summarize(seg.path, rank, seg.number, before or b"",
                                     lines_after=_lines_before_of(nxt.path) if nxt is not None else None,
                                     lines_before_it=upto if upto_seg == seg.number - 1 else None)
                except OSError:
                    break
                upto, upto_seg = said.get("lines_upto"), seg.number
                line = orjson.dumps(said) + b"\n"
                os.write(lock, line)
                os.fsync(lock)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(seg.path)
                gone += 1
            for path in (inflight.carry_path, inflight.partial_path):
                with contextlib.suppress(FileNotFoundError):
                    path(directory, stream, seg.number - 1).unlink()
            with contextlib.suppress(FileNotFoundError):
                keyframes.keys_path(directory, stream, seg.number).unlink()
            before = out
    finally:
        os.close(lock)
    return gone


def _lines_before_of(path: Path) -> int | None:
    """The lines written before the segment at ``path``, as its meta says (None: it does not,
    or it cannot be read)."""
    try:
        return lines_before(read_from(path, 0, META_BYTES))
    except OSError:
        return None


def _carried(directory: Path, stream: tuple[int, int], number: int) -> bytes | None:
    """The carry of segment ``number``, whole or replayed past a gap (``inflight.partial_path``:
    a segment before it gone before its carry was written): either says what a reader entering
    after it is told, so the segment may go."""
    out = inflight.carried(directory, stream, number)
    return out if out is not None else inflight.carried(directory, stream, number, partial=True)


_SEG = re.compile(rb'"seg":(\d+)')
_UPTO = re.compile(rb'"lines_upto":(\d+)')


def _last_summarized(summary: Path) -> tuple[int, int | None]:
    """The newest segment a stream's summary file stands for (-1: none), and the lines
    written to its end (``lines_upto``; None: not said).  Segments are summarized oldest
    first, each before it is deleted, so every one left up to it is summarized.  Read from
    the end (the file grows for as long as the job runs): the last complete line's (a line
    a killed child left incomplete stands for nothing)."""
    size = size_of(summary)
    tail = 1 << 16
    while True:
        start = max(0, size - tail)
        try:
            data = read_from(summary, start, size - start)
        except OSError:
            return -1, None
        end = data.rfind(b"\n") + 1
        found = _SEG.findall(data, 0, end)
        if found:
            upto = _UPTO.search(data, data.rfind(b"\n", 0, end - 1) + 1, end)
            return int(found[-1]), int(upto.group(1)) if upto else None
        if start == 0:
            return -1, None
        tail *= 16


def _plain(seconds: float) -> str:
    """``seconds`` as ``parse`` reads them back: no exponent (``1e-05s``, ``8.64e+21s`` were
    written for ages ``--retain`` took, and the child refused them: nothing bounded, helper-173)."""
    return format(seconds, "f").rstrip("0").rstrip(".")


def spawn(directory: Path, rank: int, incarnation: int, retain: Retention) -> subprocess.Popen | None:
    """Run ``close_stream`` in a child process at the lowest priority (the writer's rank
    never does the work); None when it cannot be started."""
    spec = ",".join(x for x in (f"{retain.max_bytes}B" if retain.max_bytes is not None else "",
                                f"{_plain(retain.max_age_s)}s" if retain.max_age_s is not None else "") if x)
    return children.start("commscope.store.retention", str(directory), str(rank), str(incarnation), spec)


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print(f"usage: python -m commscope.store.retention JOB_DIR RANK INCARNATION LIMITS "
              f"(files {stream_prefix(0)}...)", file=sys.stderr)
        return 2
    directory, rank, inc, spec = Path(argv[0]), int(argv[1]), int(argv[2]), argv[3]
    close_stream(directory, rank, inc, parse(spec) if spec else NONE)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
