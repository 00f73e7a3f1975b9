"""Heartbeats and resource samples in columns: what a whole read's worker sends back for
a stream's liveness events instead of their dicts, and what a live poll's read process
sends (``beatscan.polled``).

Every rank writes a heartbeat and a sample a second or so.  Of a job of 4,096 ranks x 400
ops they are 270k of 3.5M events, yet as dicts they cost a third of the model's ingest in
the reading process (~1.9 us each: the model walks them in Python) plus their pickling
both ways.  What the model keeps of them is little: of a stream's heartbeats the latest
(its count of ops in flight, the last of equals) and their first and last times; of its
samples the ``analysis.columns.Samples`` columns and the last sample as it was.  A worker
(``of_events``) hands that over per stream, the events themselves never leaving it; the
model takes all streams' at once (``TraceModel.ingest``'s ``beats``).

A stream keeps its heartbeats as dicts where one carries another key, and its samples
where one says why GPU samples are missing (``gpu_error``: the model keeps the text); all of
them where one is at time 0; and a rank with several streams in a read (incarnations: the
caller's choice) keeps them all, so the model takes a rank's in the order they were written.

Torch-free, numpy only: a format, below the stores and the model.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat
from operator import itemgetter
from typing import NamedTuple

import numpy as np

#: The fields of a sample that the model keeps in columns (``analysis.columns.SampleRows``, which
#: takes them from here)
SAMPLE_FIELDS = ("ts", "cpu", "rss", "gpu_util", "gpu_mem", "gpu_mem_total")
_BEAT_KEYS = frozenset({"type", "ts", "inflight", "v", "rank"})


class Beats(NamedTuple):
    """Streams' heartbeats and samples, an entry a stream (in the order read): its ``rank``,
    how many events it stands for (``count``), their first and last times (``t0``, ``t1``),
    its latest heartbeat's time (``beat_ts``, -1: none) and count of ops in flight
    (``inflight``), its samples' rows ``start[k]:start[k + 1]`` of ``cols`` (``SAMPLE_FIELDS``,
    NaN where a sample lacks one) and its last sample (``last``, None: none; a poll's is its
    line as written, decoded when asked: ``Samples.last``)."""

    rank: np.ndarray
    count: np.ndarray
    t0: np.ndarray
    t1: np.ndarray
    beat_ts: np.ndarray
    inflight: np.ndarray
    start: np.ndarray
    cols: dict[str, np.ndarray]
    last: list[dict | bytes | None]

    def events(self) -> int:
        return int(self.count.sum())


class Entry(NamedTuple):
    """One stream's part of a ``Beats`` (``of_events``)."""

    rank: int
    count: int
    t0: int
    t1: int
    beat_ts: int
    inflight: int
    cols: dict[str, np.ndarray] | None
    last: dict | None


def of_events(rank: int, events: Sequence[dict]) -> tuple[Entry | None, list[dict]]:
    """(``rank``'s heartbeats and samples among its valid ``events``, in stream order, as one
    entry; the other events, in order).  (None, ``events``) where there are none to take."""
    beats: list[dict] = []
    samples: list[dict] = []
    rest: list[dict] = []
    for e in events:
        t = e["type"]
        (beats if t == "heartbeat" else samples if t == "sample" else rest).append(e)
    kept = keeps(beats, samples)
    if kept[0]:
        beats = []
    if kept[1]:
        samples = []
    if not beats and not samples:
        return None, list(events)
    if kept[0] or kept[1]:  # (those stay among the others, in order)
        taken = "heartbeat" if beats else "sample"
        rest = [e for e in events if e["type"] != taken]
    times = list(map(_TS_OF, beats)) + list(map(_TS_OF, samples))
    if not min(times):  # (a time of 0 is not seen by the model as one: kept as it takes it)
        return None, list(events)
    beat_ts, inflight = -1, 0
    if beats:  # the latest, the last of equals
        top = max(times[:len(beats)])
        last = next(e for e in reversed(beats) if e["ts"] == top)
        beat_ts, inflight = top, last.get("inflight", 0)
    cols = {f: np.array(list(map(dict.get, samples, repeat(f))), np.float64) for f in SAMPLE_FIELDS} \
        if samples else None
    return Entry(rank, len(times), min(times), max(times), beat_ts, inflight, cols,
                 samples[-1] if samples else None), rest


_TS_OF = itemgetter("ts")


def keeps(heartbeats: Sequence[dict], samples: Sequence[dict]) -> tuple[bool, bool]:
    """Whether a stream keeps its heartbeats, and its samples, as dicts (``of_events``): a
    heartbeat carries another key; a sample says why GPU samples are missing."""
    return (bool(heartbeats) and not all(map(_BEAT_KEYS.issuperset, heartbeats)),
            any("gpu_error" in e for e in samples))


def joined(entries: Sequence[Entry]) -> Beats | None:
    """Streams' entries as one ``Beats`` (None: none)."""
    if not entries:
        return None
    k = len(entries)
    sizes = [0 if e.cols is None else e.cols["ts"].shape[0] for e in entries]
    start = np.zeros(k + 1, np.int64)
    np.cumsum(sizes, out=start[1:])
    some = [e.cols for e in entries if e.cols is not None]
    cols = {f: np.concatenate([c[f] for c in some]) if some else np.zeros(0, np.float64) for f in SAMPLE_FIELDS}

    def column(name: str) -> np.ndarray:
        return np.fromiter((getattr(e, name) for e in entries), np.int64, k)

    return Beats(column("rank"), column("count"), column("t0"), column("t1"), column("beat_ts"), column("inflight"),
                 start, cols, [e.last for e in entries])

