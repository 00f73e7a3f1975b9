"""Columnar op storage: one rank (``RankTrace``), every rank's scalars and shared column
blocks (``RankTable``), and the growth helper every array uses.

Ops are stored per rank in numpy columns (begin/end/wait/done times, id, seq, peer,
parent, signature code, flags), each a view of a block several ranks share, so a million
ops take 90-130 MB, window queries are binary searches, and a live batch writes thousands
of ranks with a numpy call per column; ``order``/``window`` keep a begin-time order and a
running max of op ends incrementally.  Ingest (``model.TraceModel.ingest``) writes these columns; the
cross-rank indexes live in ``indexes``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import chain, repeat
from operator import attrgetter
from types import MappingProxyType
from typing import Any, NamedTuple, Protocol

import numpy as np

from commscope.analysis import runmax, stacks
from commscope.beats import SAMPLE_FIELDS
from commscope.events import decode_lines

I64_MAX = np.iinfo(np.int64).max
I64_MIN = runmax.I64_MIN
#: A rank's op ids are looked up in a dense array while they stay below this multiple of its
#: op count (plus DENSE_ID_SLACK); sparse or huge ids (foreign, trimmed or hostile traces)
#: switch it to a dict, so an id costs memory by the ops held, never by its value.
DENSE_ID_FACTOR = 4
DENSE_ID_SLACK = 1 << 12
#: A dense map starts at its ids (``RankTrace.id_base``) with at most this many ids below it
#: (those a window's carry holds), else the ids go into a dict
BELOW_MAX = 1024
#: What an id in a dict costs (an entry, its key and value as Python ints): a model's bytes count it
ID_DICT_BYTES = 120
TOUCH_LOG = 64  # batches a rank remembers the changes of (RankTrace.touched)


def grown(arr: np.ndarray, need: int, keep: int | None = None, fill: Any = 0, minimum: int = 0,
          axis: int = 0) -> np.ndarray:
    """``arr`` if it holds ``need`` entries along ``axis``; else a new array of
    max(need, twice as many, ``minimum``) there, its first ``keep`` entries (default: all)
    copied and the rest ``fill``.  Always a new array, never a resize in place, so views
    already handed out stay valid; doubling keeps appends amortized O(1).  Paths run per
    rank per batch compare the capacity themselves first: the comparison costs less than
    the call."""
    cap = arr.shape[axis]
    if need <= cap:
        return arr
    shape = list(arr.shape)
    shape[axis] = max(need, 2 * cap, minimum)
    out = np.full(shape, fill, arr.dtype)
    keep = cap if keep is None else keep
    if axis == 0:
        out[:keep] = arr[:keep]
    else:
        out[:, :keep] = arr[:, :keep]
    return out


def _within(sizes: np.ndarray) -> np.ndarray:
    """For runs of ``sizes`` rows laid end to end, each row's place within its run
    (``[0, 1, 0, 1, 2]`` for sizes 2 and 3): ranks' rows gathered or copied at once."""
    return np.arange(int(sizes.sum()), dtype=np.int64) - np.repeat(np.cumsum(sizes) - sizes, sizes)


#: Empty columns, shared: nothing can be written into them, and growing one makes a new array
_NONE_I8, _NONE_I4, _NONE_U1, _NONE_F8 = (np.zeros(0, t) for t in (np.int64, np.int32, np.uint8, np.float64))
_VIEW_OF = attrgetter("_view")
_OPEN_OF = attrgetter("_open")

_COLS_I8 = ("begin", "end", "wb", "we", "done", "gpu", "comp", "id", "seq")
_COLS_I4 = ("peer", "parent", "sig")
#: An empty int64 buffer, not ``_NONE_I8`` (which a rank's order buffer is compared with)
_EMPTY_BUF = np.zeros(0, np.int64)


#: Ranks below this have their slot in an array (``RankTable.slots``); others go rank by rank
RANK_SLOTS = 1 << 22
#: Fill of each op column's unused rows: ints 0, the int32 references -1
_FILL = {**dict.fromkeys(_COLS_I8, 0), **dict.fromkeys(_COLS_I4, -1), "flags": 0, "pmax": 0}
_DTYPE = {**dict.fromkeys(_COLS_I8, np.int64), **dict.fromkeys(_COLS_I4, np.int32), "flags": np.uint8,
          "pmax": np.int64}
OP_COLUMNS = (*_COLS_I8, *_COLS_I4, "flags")
#: A block's columns: the op columns and the running max of ends of its ranks in time order
#: (``runmax``), which a move does not copy (it is recomputed in the new rows)
BLOCK_COLUMNS = (*OP_COLUMNS, "pmax")
#: The op columns a published view has (``RankView.COLUMNS``)
_VIEW_OPS = ("begin", "end", "wb", "we", "comp", "sig", "seq", "peer", "flags")
#: A block's columns a published view reads (``RankView``: its op columns, the running max)
VIEW_COLUMNS = (*_VIEW_OPS, "pmax")


class RankTable:
    """Every rank's scalars in arrays indexed by its slot, and the blocks that hold every
    rank's op columns: what lets a live batch of thousands of ranks, a record or two each,
    be written with a numpy call per column rather than a Python step per rank
    (``model.TraceModel._together_begins``, ``_together_phases``).

    A block is a set of op columns shared by ranks, each rank owning the rows
    ``[base, base + cap)`` of one block (its ``RankTrace`` columns are views of them).  The
    ranks of a whole read's step share the block they were ingested in; ranks that outgrow
    their rows move, each with twice the rows, into the arena: a block filled from its
    start, made anew (a quarter of the rows all ranks hold, at least ``ARENA_MIN_ROWS``)
    when full (``relocate``).  Appends stay amortized O(1), as doubling one array each was,
    and a live job of 16k ranks lives in a few blocks, not one per batch that moved some
    (2k of them: every gather across ranks went block by block).  A block no rank lives in
    any more is dropped (views handed out keep its arrays alive); one whose ranks hold
    under ``1 / EMPTY_BELOW`` of its rows is emptied after the batch (``compact``), so a
    few ranks that stopped growing (a dead one) do not pin a whole arena.
    """

    ARENA_MIN_ROWS = 1 << 12
    EMPTY_BELOW = 8

    INT = ("n", "first_ts", "last_ts", "last_op_ts", "last_begin", "last_comp", "version", "open_from",
           "mapped", "idoff", "aligned_from", "base", "cap", "touches", "pmax_n", "pmax_version",
           "open_min",  # (the earliest begin among the ops open at the last running max)
           "last_hb", "hb_inflight",
           "top_id",  # (the highest non-negative op id the rank began, while it has ops: ``opids``)
           "events")  # (events read of the rank, every kind: ``TraceModel.events_of``)
    BOOL = ("ordered", "stale", "device_seen", "parents")

    def __init__(self) -> None:
        self.size = 0
        cap = 64
        for name in self.INT:
            setattr(self, name, np.zeros(cap, np.int64))
        for name in self.BOOL:
            setattr(self, name, np.zeros(cap, np.bool_))
        self.block = np.full(cap, -1, np.int32)
        self.touch_version = np.zeros((cap, TOUCH_LOG), np.int64)
        self.touch_first = np.zeros((cap, TOUCH_LOG), np.int64)
        #: The earliest begin among the ops touched since the model last took it
        #: (``TraceModel._ingest``: a batch's, for its log of every rank's at once)
        self.touched_low = I64_MAX
        self.blocks: list[dict[str, np.ndarray] | None] = []
        self._frozen: dict[int, Mapping[str, np.ndarray]] = {}  # block -> read-only views of its columns
        self._residents: list[int] = []  # ranks living in each block
        self._held: list[int] = []  # rows of each block its ranks own
        self._arena = -1  # the block ranks that outgrow their rows move into, filled up to ``_fill``
        self._fill = 0
        self._thin: set[int] = set()  # blocks that lost ranks since the last ``compact``
        self.rank_slot = np.full(0, -1, np.int64)  # rank -> slot (-1: none), ranks below RANK_SLOTS
        self.traces: list[RankTrace] = []  # slot -> its rank
        self.sample_rows = SampleRows()  # every rank's resource samples, by slot

    def nbytes(self) -> int:
        """Bytes of the rank scalars' arrays and the ranks' samples (the op blocks are counted
        with their ranks)."""
        return sum(getattr(self, a).nbytes for a in (*self.INT, *self.BOOL, "block", "touch_version", "touch_first",
                                                     "rank_slot")) + self.sample_rows.nbytes()

    def slots(self, ranks: np.ndarray) -> np.ndarray:
        """The slots of ``ranks`` (-1: a rank with none, or beyond RANK_SLOTS)."""
        ok = (ranks >= 0) & (ranks < self.rank_slot.shape[0])
        if not ok.any():
            return np.full(ranks.shape[0], -1, np.int64)
        return np.where(ok, self.rank_slot[np.where(ok, ranks, 0)], -1)

    def add(self, rt: RankTrace) -> int:
        """A new slot (a rank with no ops)."""
        rank = rt.rank
        self.traces.append(rt)
        if 0 <= rank < min(RANK_SLOTS, 4 * self.size + (1 << 16)):  # (an array by rank: as many ranks as slots)
            if rank >= self.rank_slot.shape[0]:
                self.rank_slot = grown(self.rank_slot, rank + 1, fill=-1, minimum=64)
            self.rank_slot[rank] = self.size
        s = self.size
        if s == self.block.shape[0]:
            for name in (*self.INT, *self.BOOL, "touch_version", "touch_first"):
                setattr(self, name, grown(getattr(self, name), s + 1))
            self.block = grown(self.block, s + 1, fill=-1)
        self.ordered[s] = True
        self.size = s + 1
        return s

    def beat(self, slots: np.ndarray, ts: np.ndarray, inflight: np.ndarray) -> None:
        """``RankTrace.beat`` of a heartbeat each at ``slots`` (distinct)."""
        newer = ts >= self.last_hb[slots]
        s = slots[newer]
        self.last_hb[s] = ts[newer]
        self.hb_inflight[s] = inflight[newer]

    def settle_open(self) -> None:
        """Bring every rank's open set up to date (``RankTrace.open``) with a numpy call per
        block, not one per rank: what a view of every rank asks first."""
        k = self.size
        fold = np.flatnonzero(self.open_from[:k] < self.n[:k])
        if fold.shape[0]:
            lo, hi = self.open_from[fold], self.n[fold]
            sizes = hi - lo
            who = np.repeat(fold, sizes)
            i = _within(sizes) + np.repeat(lo, sizes)
            (comp,) = self.gather(("comp",), self.block[who], self.base[who] + i)
            at = comp <= 0
            who, i = who[at], i[at]
            if who.shape[0]:
                cuts = np.flatnonzero(np.r_[True, who[1:] != who[:-1], True])
                for a, b in zip(cuts[:-1].tolist(), cuts[1:].tolist(), strict=True):
                    self.traces[int(who[a])]._open.update(i[a:b].tolist())
            self.open_from[fold] = hi
        for s in np.flatnonzero(self.stale[:k]).tolist():
            self.traces[s].open  # noqa: B018 (filters the set)

    def open_ops(self) -> tuple[np.ndarray, np.ndarray]:
        """Every rank's open ops as (slots, op indices) (``settle_open`` first)."""
        self.settle_open()
        return self._open_of(range(self.size))  # (a position in range(size) is the slot)

    def touched_since(self, s: int, version: int) -> int | None:
        """Slot ``s``'s earliest begin among the ops changed after ``version`` (I64_MAX: none;
        None: its touch log no longer reaches back that far), without copying the log."""
        return _one(self.changed_since(np.array([s]), np.array([version], np.int64)))

    def touch_log(self, s: int) -> tuple[np.ndarray, np.ndarray]:
        """Slot ``s``'s touch log, oldest first, as two arrays of its own."""
        k = int(self.touches[s])
        tv, tf = self.touch_version[s], self.touch_first[s]
        if k <= TOUCH_LOG:
            return tv[:k].copy(), tf[:k].copy()
        j = k % TOUCH_LOG  # (the oldest kept)
        return np.concatenate((tv[j:], tv[:j])), np.concatenate((tf[j:], tf[:j]))

    def touch_rings(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The touch logs of ``slots`` as the table keeps them, gathered at once: an array
        (slot, 2, TOUCH_LOG) of rings of versions and earliest begins, and how many entries
        each was written in all (``_changed_since`` reads a ring as it is).  A published
        view copies its row: one copy a rank, not two and a roll (16k ranks: a tenth of a
        publish)."""
        return np.stack((self.touch_version[slots], self.touch_first[slots]), axis=1), self.touches[slots]

    def touch_ring(self, s: int) -> tuple[np.ndarray, int]:
        """``touch_rings`` of slot ``s`` alone: its ring, a copy of its own, and its count."""
        rings, written = self.touch_rings(np.array([s]))
        return rings[0], int(written[0])

    def touch(self, slots: np.ndarray, first: np.ndarray) -> None:
        """``RankTrace.touch`` of many ranks (``slots`` distinct)."""
        k = self.touches[slots]
        at = k % TOUCH_LOG
        self.touch_version[slots, at] = self.version[slots]
        self.touch_first[slots, at] = first
        self.touches[slots] = k + 1
        if first.shape[0]:
            self.touched_low = min(self.touched_low, int(first.min()))

    def _groups(self, block: np.ndarray) -> list[tuple[dict[str, np.ndarray], Any]]:
        """(columns, the rows in them) of each block among ``block`` (a row's): by a sort,
        so many blocks cost the rows once, not once per block."""
        b0 = int(block[0])
        if bool((block == b0).all()):
            cols = self.blocks[b0]
            assert cols is not None
            return [(cols, slice(None))]
        order = np.argsort(block, kind="stable")
        sorted_ = block[order]
        cuts = [0, *(np.flatnonzero(sorted_[1:] != sorted_[:-1]) + 1).tolist(), block.shape[0]]
        out = []
        for a, z in zip(cuts[:-1], cuts[1:], strict=True):
            cols = self.blocks[int(sorted_[a])]
            assert cols is not None
            out.append((cols, order[a:z]))
        return out

    def gather(self, names: Sequence[str], block: np.ndarray, pos: np.ndarray) -> list[np.ndarray]:
        """Columns ``names`` at rows ``pos`` of blocks ``block`` (a row each)."""
        if not pos.shape[0]:
            return [np.zeros(0, _DTYPE[c]) for c in names]
        groups = self._groups(block)
        if len(groups) == 1:
            return [groups[0][0][c][pos] for c in names]
        out = [np.empty(pos.shape[0], _DTYPE[c]) for c in names]
        for cols, m in groups:
            at = pos[m]
            for o, c in zip(out, names, strict=True):
                o[m] = cols[c][at]
        return out

    def scatter(self, values: Mapping[str, np.ndarray], block: np.ndarray, pos: np.ndarray) -> None:
        """Write ``values`` (a column each) at rows ``pos`` of blocks ``block``."""
        if not pos.shape[0]:
            return
        for cols, m in self._groups(block):
            at = pos[m]
            for c, v in values.items():
                cols[c][at] = v[m]

    def add_block(self, cols: dict[str, np.ndarray]) -> int:
        if "pmax" not in cols:
            cols["pmax"] = np.zeros(cols["begin"].shape[0], np.int64)  # (pages untouched until written)
        self.blocks.append(cols)
        self._residents.append(0)
        self._held.append(0)
        return len(self.blocks) - 1

    def adopt(self, rts: Sequence[RankTrace], b: int, start: np.ndarray) -> np.ndarray:
        """Rows of block ``b`` (the columns of ranks ingested together) as the op columns of
        empty ranks (distinct), rank ``rts[j]`` taking ``[start[j], start[j + 1])``: views,
        not copies (``TraceModel._fresh_begins``), made in one loop, their scalars written in
        arrays; a later append that outgrows them moves the rank (``relocate``).  Returns
        their slots."""
        slots = np.fromiter((rt._s for rt in rts), np.int64, len(rts))
        sizes = np.diff(start)
        self._move(slots, b, start[:-1], sizes)  # (a rank made before it had ops leaves rows of its own)
        self.n[slots] = sizes
        return slots

    def _move(self, slots: np.ndarray, b: int, start: np.ndarray, caps: np.ndarray) -> None:
        """Make rows ``[start[j], start[j] + caps[j])`` of block ``b`` the columns of rank
        ``slots[j]`` (distinct): the blocks' counts and the ranks' scalars written for all at
        once, a rank's views made in one loop (as ``adopt``'s).  Moving the 16k ranks of a
        first live round cost ~6 us a rank as a step each."""
        cols = self.blocks[b]
        assert cols is not None
        self._residents[b] += slots.shape[0]
        self._held[b] += int(caps.sum())
        self._leave(slots[self.block[slots] >= 0])
        self.block[slots], self.base[slots], self.cap[slots] = b, start, caps
        self.pmax_n[slots] = 0  # (recomputed in the new rows: the old ones stay as views hold them)
        columns = [cols[c] for c in BLOCK_COLUMNS]
        traces = self.traces
        for s, a, e in zip(slots.tolist(), start.tolist(), (start + caps).tolist(), strict=True):
            rt = traces[s]
            rt.__dict__.update(zip(BLOCK_COLUMNS, [col[a:e] for col in columns], strict=True))
            # (published again from the new rows: a view of the old, or its slices kept to
            # publish again from, would keep their block alive)
            rt._view = None

    def _leave(self, slots: np.ndarray) -> None:
        """Ranks ``slots`` leave their blocks (they move): a block left by every rank is
        dropped (not the arena), one left by some is looked at after the batch (``compact``)."""
        if not slots.shape[0]:
            return
        olds, at = np.unique(self.block[slots], return_inverse=True)
        counts = np.bincount(at.reshape(-1), minlength=olds.shape[0])
        held = np.bincount(at.reshape(-1), weights=self.cap[slots], minlength=olds.shape[0])
        for old, k, h in zip(olds.tolist(), counts.tolist(), held.astype(np.int64).tolist(), strict=True):
            self._residents[old] -= k
            self._held[old] -= h
            if self._residents[old]:
                self._thin.add(old)
            elif old != self._arena:
                self._drop(old)

    def _drop(self, b: int) -> None:
        self.blocks[b] = None
        self._frozen.pop(b, None)

    def frozen(self, b: int) -> Mapping[str, np.ndarray]:
        """Read-only views of block ``b``'s columns that a published view reads (made once a
        block): its columns are slices of them (``RankView.rows``).  Those alone, read-only
        as a mapping too: a view of a block dropped since keeps no more of it alive."""
        fz = self._frozen.get(b)
        if fz is None:
            cols = self.blocks[b]
            assert cols is not None
            fz = self._frozen[b] = MappingProxyType({c: _frozen(cols[c]) for c in VIEW_COLUMNS})
        return fz

    def views(self) -> None:
        """Bring every rank's published view up to date (``RankTrace.view``): the running
        max of every rank in time order at once, and of the ranks that changed, the scalars
        read and the touch logs gathered in one pass each, each block's read-only columns
        made once (``frozen``) (~7 us a rank, ~15 before views sliced their columns when read)."""
        self.settle_open()
        self.running_max()
        k = self.size
        changed = [s for s, v, version, n in zip(range(k), map(_VIEW_OF, self.traces), self.version[:k].tolist(),
                                                 self.n[:k].tolist(), strict=True)
                   if v is None or v.version != version or v.n != n]
        at = np.array(changed, np.int64)
        flights = self.in_flight(changed)
        rings, written = self.touch_rings(at)
        blocks = self.block[at]
        frozen = {b: self.frozen(b) for b in np.unique(blocks[blocks >= 0]).tolist()}
        in_order = self.n[at][self.ordered[at]]
        identity = _identity_of(int(in_order.max()) if in_order.shape[0] else 0)  # (ranks in time order use it)
        for ring, s, version, n, b, a, first, last, hb, ordered, count in zip(
                rings, changed, *(getattr(self, c)[at].tolist() for c in (
                    "version", "n", "block", "base", "first_ts", "last_ts", "last_hb", "ordered")), written.tolist(),
                strict=True):
            self.traces[s]._publish(version, n, frozen.get(b), a, first, last, hb, flights.get(s, ()),
                                    (ring.copy(), count), maxed=True, ordered=ordered, identity=identity)

    def in_flight(self, slots: Sequence[int]) -> dict[int, tuple[int, ...]]:
        """The ops in flight (completion 0) of ranks ``slots`` whose open set was settled, by
        index: what a published view lists as ``open`` (none: not in the result)."""
        where, op = self._open_of(slots)
        if not op.shape[0]:
            return {}
        at = np.asarray(slots, np.int64)[where]
        (comp,) = self.gather(("comp",), self.block[at], self.base[at] + op)
        at, op = at[comp == 0], op[comp == 0]
        if not at.shape[0]:  # (open with a completion below 0: hostile times, none in flight)
            return {}
        order = np.lexsort((op, at))
        at, op = at[order], op[order].tolist()
        cuts = np.flatnonzero(np.r_[True, at[1:] != at[:-1], True]).tolist()
        return {s: tuple(op[a:b]) for s, a, b in zip(at[cuts[:-1]].tolist(), cuts[:-1], cuts[1:], strict=True)}

    def oldest_in_flight(self, after: int) -> int | None:
        """The earliest begin after ``after`` among every rank's ops in flight (completion 0;
        None: none): once it is hang_after old, a hang may be found."""
        self.settle_open()
        at, op = self._open_of(range(self.size))  # (a position in range(size) is the slot)
        if not op.shape[0]:
            return None
        begin, comp = self.gather(("begin", "comp"), self.block[at], self.base[at] + op)
        begin = begin[(comp == 0) & (begin > after)]
        return int(begin.min()) if begin.shape[0] else None

    def running_max(self, slots: np.ndarray | None = None) -> None:
        """Bring the running max of ends (``pmax``) of ranks in time order up to date:
        those among ``slots`` (None: every rank), in one ``runmax.update`` per block."""
        k = self.size
        if slots is None:
            slots = np.arange(k, dtype=np.int64)
        n = self.n[slots]
        due = self.ordered[slots] & (n > 0) & (self.block[slots] >= 0) & (
            (self.pmax_n[slots] != n) | (self.pmax_version[slots] != self.version[slots]))
        slots = slots[due]
        if not slots.shape[0]:
            return
        n, valid, done = self.n[slots], self.pmax_n[slots], self.pmax_version[slots]
        # from the earliest op changed since (the touch log), or open then: one that closed since
        # without a change of its own in the log (a nested op its parent's end closed)
        since = np.minimum(self.changed_since(slots, done), self.open_min[slots])
        since[valid == 0] = I64_MIN
        for cols, m in self._groups(self.block[slots]):
            runmax.update(cols["begin"], cols["comp"], cols["pmax"], self.base[slots][m], n[m], valid[m], since[m])
        self.pmax_n[slots] = n
        self.pmax_version[slots] = self.version[slots]
        self.settle_open()
        self.open_min[slots] = self._earliest_open(slots)

    def _earliest_open(self, slots: np.ndarray) -> np.ndarray:
        """The earliest begin among each slot's open ops (I64_MAX: none; their sets settled):
        what ``open_min`` keeps as of a running max's update, either way it is kept."""
        out = np.full(slots.shape[0], I64_MAX, np.int64)
        at, ops = self._open_of(slots.tolist())
        if ops.shape[0]:
            s = slots[at]
            (begin,) = self.gather(("begin",), self.block[s], self.base[s] + ops)
            np.minimum.at(out, at, begin)
        return out

    def _open_of(self, slots: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """The open sets of ``slots`` (settled) as (position in ``slots``, op index) arrays, made
        with no Python step per rank."""
        traces = self.traces
        every = isinstance(slots, range) and slots == range(len(traces))
        held = list(map(_OPEN_OF, traces if every else map(traces.__getitem__, slots)))
        counts = np.fromiter(map(len, held), np.int64, len(held))
        ops = np.fromiter(chain.from_iterable(held), np.int64, int(counts.sum()))
        return np.repeat(np.arange(len(held), dtype=np.int64), counts), ops

    def changed_since(self, slots: np.ndarray, versions: np.ndarray) -> np.ndarray:
        """``touched_since`` of many slots (``slots[j]`` after ``versions[j]``), with I64_MIN
        where a touch log no longer reaches back that far."""
        return _changed_since(self.touches[slots], self.touch_version[slots], self.touch_first[slots], versions,
                              self.version[slots])

    def relocate(self, rts: Sequence[RankTrace], need: Sequence[int]) -> None:
        """Move ranks into the arena, each with rows for ``need`` ops (at least twice its
        rows before, 16 at least), their ops so far copied: one numpy call per column and
        block they came from."""
        slots = np.array([rt._s for rt in rts], np.int64)
        self._place(slots, np.maximum(np.maximum(np.asarray(need, np.int64), 2 * self.cap[slots]), 16))

    def compact(self) -> None:
        """Empty each block that lost ranks and whose ranks now own under ``1 / EMPTY_BELOW``
        of its rows: its ranks move into the arena with the rows they have.  Called between
        batches (a move changes the columns of ranks the caller did not name)."""
        thin, self._thin = self._thin, set()
        for b in sorted(thin):
            cols = self.blocks[b]
            if cols is None or b == self._arena or self._held[b] * self.EMPTY_BELOW >= cols["begin"].shape[0]:
                continue
            slots = np.flatnonzero(self.block[:self.size] == b)
            self._place(slots, self.cap[slots])

    def _room(self, rows: int) -> tuple[int, int]:
        """(block, first row) of ``rows`` free rows of the arena, a new arena if it is full."""
        b = self._arena
        cols = self.blocks[b] if b >= 0 else None
        if cols is None or self._fill + rows > cols["begin"].shape[0]:
            if cols is not None and not self._residents[b]:
                self._drop(b)
            elif cols is not None:
                self._thin.add(b)
            size = max(rows, self.ARENA_MIN_ROWS, int(self.cap[:self.size].sum()) // 4)
            # (np.empty: rows are written when a rank gets them, the rest is never touched)
            b = self._arena = self.add_block({c: np.empty(size, _DTYPE[c]) for c in BLOCK_COLUMNS})
            self._fill = 0
        lo = self._fill
        self._fill += rows
        return b, lo

    def _place(self, slots: np.ndarray, caps: np.ndarray) -> None:
        """Give ranks ``slots`` ``caps`` rows each in the arena, their ops copied there."""
        n = self.n[slots]
        start = np.zeros(slots.shape[0] + 1, np.int64)
        np.cumsum(caps, out=start[1:])
        total = int(start[-1])
        b, lo = self._room(total)
        cols = self.blocks[b]
        assert cols is not None
        for c in BLOCK_COLUMNS:
            cols[c][lo:lo + total] = _FILL[c]
        start += lo
        src_block = self.block[slots]
        rows = int(n.sum())
        if rows >= 64 * slots.shape[0]:  # long ranks (the first poll after a whole read): a slice each
            for j, (sb, a, k) in enumerate(zip(src_block.tolist(), self.base[slots].tolist(), n.tolist(),
                                               strict=True)):
                if k:
                    old = self.blocks[sb]
                    assert old is not None
                    at = int(start[j])
                    for c in OP_COLUMNS:
                        cols[c][at:at + k] = old[c][a:a + k]
        elif rows:
            who = np.repeat(np.arange(slots.shape[0]), n)
            within = _within(n)
            dst = start[who] + within
            src = self.base[slots][who] + within
            for old, m in self._groups(src_block[who]):
                at, to = src[m], dst[m]
                for c in OP_COLUMNS:
                    cols[c][to] = old[c][at]
        self._move(slots, b, start[:-1], caps)


class RankColumns(Protocol):
    """One rank's op columns as the console and the rank-state judgements read them: a
    ``RankTrace`` (the model's own) or a ``RankView`` (published)."""

    @property
    def n(self) -> int: ...
    @property
    def begin(self) -> np.ndarray: ...
    @property
    def end(self) -> np.ndarray: ...
    @property
    def wb(self) -> np.ndarray: ...
    @property
    def we(self) -> np.ndarray: ...
    @property
    def comp(self) -> np.ndarray: ...
    @property
    def sig(self) -> np.ndarray: ...
    @property
    def seq(self) -> np.ndarray: ...
    @property
    def peer(self) -> np.ndarray: ...
    @property
    def flags(self) -> np.ndarray: ...
    @property
    def first_ts(self) -> int: ...
    @property
    def last_ts(self) -> int: ...
    @property
    def last_hb(self) -> int: ...
    @property
    def meta(self) -> dict | None: ...

    def order(self) -> np.ndarray: ...

    def window(self, t0: int, t1: int) -> np.ndarray: ...


def _slot(name: str, doc: str, kind: type = int) -> property:
    """A ``RankTrace`` scalar kept in its table's array ``name``, at the rank's slot."""
    def get(self: RankTrace) -> Any:
        return kind(getattr(self._t, name)[self._s])

    def put(self: RankTrace, value: Any) -> None:
        getattr(self._t, name)[self._s] = value

    return property(get, put, doc=doc)


def _lowest_from(ids: np.ndarray | list[int], floor: int) -> int:
    """The lowest of ``ids`` at or past ``floor`` (one is: the highest)."""
    if isinstance(ids, np.ndarray):
        return int(ids[ids >= floor].min())
    return min(i for i in ids if i >= floor)


class RankTrace:
    """One rank: op columns plus liveness, samples, stacks and exits."""

    # What a rank's attributes start as, where each is rebound and never changed in place:
    # shared here, not set on each (a live console's first round makes 16k ranks at once,
    # and setting them all cost ~4 us a rank)
    # (and its op columns, none yet: set from ``_COLS_I8`` and ``_COLS_I4`` below the class)
    flags = _NONE_U1
    pmax = _NONE_I8  # rows of its block's running max of ends (``runmax``), in time order
    id2idx = _NONE_I4
    id_base = 0  # the id ``id2idx[0]`` stands for (a window's ranks begin far past their job's first ids)
    id_below: dict[int, int] | None = None  # the few ids below ``id_base`` (ops carried into a window)
    _dense_empty = True  # no id in ``id2idx`` yet
    id_dict: dict[int, int] | None = None
    meta: dict | None = None
    last_stack: dict | None = None
    dropped = 0  # events the recorder lost (backpressure, store failures)
    drop_reason: str | None = None  # why, as the latest report of drops said it
    fr_overwritten = 0  # Flight Recorder entries overwritten before a poll: not losses
    _order: np.ndarray | None = None
    _order_n = 0
    _pmax: np.ndarray | None = None
    _pmax_version = -1
    _ins_min = 0  # first order position changed by insertions since the last prefix max
    _pmax_shared = False  # a published RankView holds the prefix max: rewrite a copy
    _view: RankView | None = None

    def __init__(self, rank: int, cap: int = 256, table: RankTable | None = None):
        """``cap`` 0: no columns yet (the rank will take some, ``RankTable.adopt``, or grow its own).
        ``table``: the model's (a rank alone gets one of its own)."""
        self.rank = rank
        self._t = table if table is not None else RankTable()
        self._s = self._t.add(self)
        if cap:
            self._t.relocate([self], [cap])
            self.id2idx = np.full(1024, -1, np.int32)
        self._open: set[int] = set()  # op indices not yet complete, below ``open_from`` (see ``open``)
        self.exc: dict[int, str] = {}  # op index -> exception text
        self.exits: list[dict] = []
        self.summaries: list[dict] = []  # what retention kept of the segments it deleted (``summary`` events)
        self.stacks: dict[int, dict] = {}  # op id -> stack event
        self.captures: list[dict] = []  # the latest stack events, any reason, in arrival order
        #: Its stack events as diagnosis shows them, each folded once (``stacks.view``)
        self.stacks_folded: stacks.Memo = {}
        self.samples = Samples(rank, self._t.sample_rows, self._s)
        self._sb = self._ord_buf = self._sb_buf = self._pmax_buf = _EMPTY_BUF  # begins in ``order``; capacity

    # -- scalars, kept in the model's ``RankTable`` (a live batch writes them for many ranks at once)
    n = _slot("n", "ops held")
    first_ts = _slot("first_ts", "first timestamp seen (0: none)")
    last_ts = _slot("last_ts", "last timestamp seen")
    last_op_ts = _slot("last_op_ts", "latest op begin")
    last_comp = _slot("last_comp", "latest completion time of any op")
    version = _slot("version", "bumped by every batch that changed the rank")
    _last_begin = _slot("last_begin", "latest op begin (ops only)")
    _sorted = _slot("ordered", "begins came in time order", bool)
    device_seen = _slot("device_seen", "a ``done`` phase was seen", bool)
    last_hb = _slot("last_hb", "the latest heartbeat's time (0: none)")
    hb_inflight = _slot("hb_inflight", "the latest heartbeat's count of ops in flight, the last of equals")

    @property
    def touched(self) -> list[tuple[int, int]]:
        """(version, earliest begin among the ops that batch added or changed), the latest
        TOUCH_LOG batches: what a painter needs to repaint only the part of a row that changed."""
        versions, begins = self._t.touch_log(self._s)
        return list(zip(versions.tolist(), begins.tolist(), strict=True))

    @property
    def open(self) -> set[int]:
        """Op indices not yet complete (completion 0; below 0 only from hostile times).  Ops
        from ``open_from`` on are not in the set yet, and ops the set holds may have completed
        since (``stale``): a live batch only writes the completions
        (``TraceModel._together_phases``), and this brings the set up to date when asked."""
        t, s = self._t, self._s
        lo, n = int(t.open_from[s]), int(t.n[s])
        if lo < n or t.stale[s]:
            comp = self.comp
            if t.stale[s]:
                self._open = {i for i in self._open if comp[i] <= 0}
                t.stale[s] = False
            if lo < n:
                self._open.update((np.flatnonzero(comp[lo:n] <= 0) + lo).tolist())
                t.open_from[s] = n
        return self._open

    @open.setter
    def open(self, ops: set[int]) -> None:
        self._open = ops
        self._t.open_from[self._s] = self.n
        self._t.stale[self._s] = False

    def beat(self, ts: int, inflight: int) -> None:
        """A heartbeat: the latest one's count of ops in flight is kept, the last of equals
        (``RankTable.beat``: many ranks' at once)."""
        t, s = self._t, self._s
        if ts >= t.last_hb[s]:
            t.last_hb[s] = ts
            t.hb_inflight[s] = inflight

    # -- storage
    def nbytes(self, shared: dict[int, int] | None = None) -> int:
        """Bytes its arrays hold (capacity, the index buffers and the id map included).
        Columns it took from ranks ingested together (``RankTable.adopt``) are views: their whole
        block goes into ``shared`` (by id, so the model counts it once, for as long as any
        rank still holds part of it), or into the total without one."""
        arrays = [getattr(self, c) for c in (*BLOCK_COLUMNS, "id2idx")]
        arrays += [self._ord_buf, self._sb_buf, self._pmax_buf]
        total = 0
        for a in arrays:
            base = a.base
            if base is None or not isinstance(base, np.ndarray):
                total += a.nbytes
            elif shared is None:
                total += base.nbytes
            else:
                shared[id(base)] = base.nbytes
        return total + ID_DICT_BYTES * (len(self.id_dict or ()) + len(self.id_below or ()))

    def reserve(self, n: int) -> None:
        if n > self.begin.shape[0]:
            self._t.relocate([self], [n])

    def align(self, ids: np.ndarray, n0: int) -> None:
        """Note the ids of ops ``n0``.. just appended.  The table keeps, per rank, the run of
        latest ops whose ids are consecutive (op ``i`` has id ``i + idoff`` from
        ``aligned_from`` on): there an id's op is found by a subtraction, for many ranks at
        once (``TraceModel._together_phases``), and it is the latest op with that id, as the
        id map's."""
        k = ids.shape[0]
        if not k:
            return
        t, s = self._t, self._s
        breaks = np.flatnonzero(np.diff(ids) != 1) if k > 1 else ()
        j = int(breaks[-1]) + 1 if len(breaks) else 0
        off = int((ids[j:j + 1] - (n0 + j))[0])  # (int64, wrapping: a lookup checks the id it finds)
        if j or n0 == 0 or off != int(t.idoff[s]) or int(t.aligned_from[s]) >= n0:
            t.aligned_from[s] = n0 + j
            t.idoff[s] = off

    @staticmethod
    def mapped_at_once(ids: np.ndarray, local: np.ndarray) -> np.ndarray:
        """Which ids (of ops ``local``, a rank's indices) must be mapped as they come, not when
        asked (``_fold``): a negative one, or one large enough for a batch to move the dense
        map's start (``id_base``) or turn it into a dict (``_dense_map``), which a map made
        later, of more ops, would not."""
        return (ids < 0) | (ids >= DENSE_ID_FACTOR * (local + 1) + DENSE_ID_SLACK)

    def _dense_map(self, lo: int, hi: int, ids: np.ndarray | list[int]) -> np.ndarray | None:
        """The dense id map, grown to hold ids ``lo``..``hi`` at or past ``id_base`` (``k`` ids
        coming: ``ids``); None once ids are sparse or huge (foreign traces): ``id_dict`` holds
        them instead.  A window's rank (ids from far past its job's first, after the few ops its
        carry holds) starts the map at its ids (``id_base``), its carried ids apart
        (``id_below``): before, every such rank held a dict, ~100 bytes an op the console's
        budget did not count."""
        if self.id_dict is not None:
            return None
        span = DENSE_ID_FACTOR * (self.n + len(ids)) + DENSE_ID_SLACK
        if self._dense_empty and lo >= span:  # (where a map from 0 would be sparse: ids from 0 again stay dense)
            self.id_base = lo
        # (past the span: the map starts again at the lowest id coming within it of the highest)
        if hi - self.id_base >= span and not self._rebase(_lowest_from(ids, hi - span + 1)):
            self._to_dict()
            return None
        need = hi - self.id_base + 1
        if need > self.id2idx.shape[0]:  # (checked here too: this runs per rank per batch)
            self.id2idx = grown(self.id2idx, need, fill=-1)
        return self.id2idx

    def _rebase(self, base: int) -> bool:
        """Start the dense map at id ``base``, the ids it held below that moved to
        ``id_below``; False where that would hold more than ``BELOW_MAX`` there."""
        held = np.flatnonzero(self.id2idx[: max(0, base - self.id_base)] >= 0)
        if len(self.id_below or ()) + held.shape[0] > BELOW_MAX:
            return False
        if held.shape[0]:
            below = self.id_below if self.id_below is not None else {}
            below.update(zip((held + self.id_base).tolist(), self.id2idx[held].tolist(), strict=True))
            self.id_below = below
        self.id2idx = self.id2idx[base - self.id_base:].copy()  # (``base`` is past it: ``_dense_map``)
        self.id_base = base
        return True

    def _to_dict(self) -> None:
        """Every id mapped so far into ``id_dict`` (sparse or huge ids)."""
        held = np.flatnonzero(self.id2idx >= 0)
        self.id_dict = dict(zip((held + self.id_base).tolist(), self.id2idx[held].tolist(), strict=True))
        self.id_dict.update(self.id_below or {})
        self.id2idx, self.id_base, self.id_below = _NONE_I4, 0, None

    def _below(self, ids: list[int], idx: list[int]) -> None:
        """Map ids below ``id_base`` (past ``BELOW_MAX`` of them: every id into ``id_dict``)."""
        below = self.id_below if self.id_below is not None else {}
        below.update(zip(ids, idx, strict=True))
        self.id_below = below
        if len(below) > BELOW_MAX:
            self._to_dict()

    def _fold(self) -> None:
        """Map the ids of the ops a live batch appended without mapping them."""
        t, s = self._t, self._s
        m, n = int(t.mapped[s]), int(t.n[s])
        if m < n:
            self._map(self.id[m:n], np.arange(m, n, dtype=np.int32))
            t.mapped[s] = n

    def map_ids(self, ids: np.ndarray, idx: np.ndarray) -> None:
        """Map the ids of ops ``idx`` (ascending, following the ops mapped so far)."""
        if not ids.shape[0]:
            return
        self._fold()
        self._map(ids, idx)
        self._t.mapped[self._s] = int(idx[-1]) + 1

    def _map(self, ids: np.ndarray, idx: np.ndarray) -> None:
        ok = ids >= 0
        id2idx = self._dense_map(int(ids[ok].min()) if ok.any() else 0, int(ids.max()), ids)
        if id2idx is None:
            self.id_dict.update(zip(ids.tolist(), idx.tolist(), strict=True))
            return
        base = self.id_base
        inside = ok & (ids >= base)
        if inside.any():
            id2idx[ids[inside] - base] = idx[inside]
            self._dense_empty = False
        below = ok & (ids < base)
        if below.any():
            self._below(ids[below].tolist(), idx[below].tolist())
            if self.id_dict is not None:  # (past BELOW_MAX: the batch into the dict, as a dict maps it)
                self.id_dict.update(zip(ids.tolist(), idx.tolist(), strict=True))

    def map_few(self, ids: list[int], first: int) -> None:
        """``map_ids`` of a few ids, as a list, of ops ``first``, ``first + 1`` ...: a live
        batch's handful a rank, where Python's scalar steps cost less than numpy's calls."""
        if not ids:
            return
        self._fold()
        self._t.mapped[self._s] = first + len(ids)
        lo = min(ids)
        id2idx = self._dense_map(lo if lo >= 0 else min((i for i in ids if i >= 0), default=0), max(ids), ids)
        if id2idx is None:
            self.id_dict.update(zip(ids, range(first, first + len(ids)), strict=True))
            return
        base = self.id_base
        for i, op_id in enumerate(ids, first):
            if op_id >= base:
                id2idx[op_id - base] = i
                self._dense_empty = False
            elif op_id >= 0:
                self._below([op_id], [i])
                if self.id_dict is not None:  # (past BELOW_MAX: the rest into the dict too)
                    self.id_dict.update(zip(ids, range(first, first + len(ids)), strict=True))
                    return

    def lookup(self, ids: np.ndarray) -> np.ndarray:
        self._fold()
        if self.id_dict is not None:
            get = self.id_dict.get
            return np.array([get(k, -1) for k in ids.tolist()], np.int32)
        out = np.full(ids.shape[0], -1, np.int32)
        rel = ids.astype(np.int64, copy=False) - self.id_base
        ok = (ids >= 0) & (rel >= 0) & (rel < self.id2idx.shape[0])
        out[ok] = self.id2idx[rel[ok]]
        if self.id_below:
            get = self.id_below.get
            for j in np.flatnonzero((ids >= 0) & (rel < 0)).tolist():
                out[j] = get(int(ids[j]), -1)
        return out

    def index_of(self, op_id: int) -> int | None:
        self._fold()
        if self.id_dict is not None:
            return self.id_dict.get(op_id)
        rel = op_id - self.id_base
        if op_id >= 0 and 0 <= rel < self.id2idx.shape[0]:
            i = int(self.id2idx[rel])
            return i if i >= 0 else None
        if self.id_below and op_id >= 0:
            return self.id_below.get(op_id)
        return None

    # -- time queries
    def order(self) -> np.ndarray:
        """Op indices sorted by begin time (ops may arrive out of time order, e.g. Flight Recorder).

        Maintained incrementally: new ops are merged into the sorted order (one
        ``searchsorted`` and ``insert``), so a live trace never re-sorts a whole rank.
        """
        n = self.n
        if self._order is not None and self._order_n == n:
            return self._order
        if self._sorted:  # begins that came in time order (the usual case): their own order, no arrays
            self._ins_min = min(self._ins_min, self._order_n) if self._order is not None and self._order_n <= n else 0
            self._order, self._sb = _identity(n), self.begin[:n]  # (a begin is never written again)
            self._ord_buf = self._sb_buf = _NONE_I8
            self._order_n = n
            return self._order
        if self._order is None or self._order_n > n or self._ord_buf is _NONE_I8:  # (or just left time order)
            self._order = np.argsort(self.begin[:n], kind="stable")
            self._sb = self.begin[self._order]
            self._ord_buf, self._sb_buf = self._order, self._sb
            self._ins_min = 0
        else:
            new = np.arange(self._order_n, n, dtype=np.int64)
            nb = self.begin[self._order_n:n]
            if nb.shape[0] > 1 and bool((np.diff(nb) < 0).any()):
                k = np.argsort(nb, kind="stable")
                new, nb = new[k], nb[k]
            pos = np.searchsorted(self._sb, nb, side="right")
            m = self._order.shape[0]
            if pos[0] == m:  # the usual case: everything new comes last; append in place
                k = new.shape[0]
                if self._ord_buf.shape[0] < m + k:
                    self._ord_buf = grown(self._ord_buf, m + k, m, minimum=1024)
                    self._sb_buf = grown(self._sb_buf, m + k, m, minimum=1024)
                self._ord_buf[m:m + k] = new
                self._sb_buf[m:m + k] = nb
                self._order, self._sb = self._ord_buf[: m + k], self._sb_buf[: m + k]
            else:
                self._order = np.insert(self._order, pos, new)
                self._sb = np.insert(self._sb, pos, nb)
                self._ord_buf, self._sb_buf = self._order, self._sb
            self._ins_min = min(self._ins_min, int(pos[0]))
        self._order_n = n
        return self._order

    def window(self, t0: int, t1: int) -> np.ndarray:
        """Indices of ops overlapping [t0, t1), by begin time; ops in flight extend to +inf."""
        if self.n == 0:
            return np.zeros(0, np.int64)
        order = self.order()
        pmax = self._prefix_max(order, self._sb)
        return _window(order, self._sb, pmax, self.begin, self.comp, self.open, t0, t1)

    def _prefix_max(self, order: np.ndarray, begins: np.ndarray) -> np.ndarray:
        """Running max of op ends in begin order (in-flight ops count with their begin).

        A rank in time order keeps it in its block's rows, brought up to date in place
        (``RankTable.running_max``).  Another keeps its own array, recomputed only from the
        first position that can have changed (where ops were inserted, or where the earliest
        op that was still open last time begins), into a copy where a view holds it.
        """
        n = order.shape[0]
        if self._sorted:
            t, s = self._t, self._s
            if t.pmax_n[s] != n or t.pmax_version[s] != t.version[s]:
                t.running_max(np.array([s]))
            return self.pmax[:n]
        version = self.version
        if self._pmax is not None and self._pmax_version == version and self._pmax.shape[0] == n:
            return self._pmax
        start = 0
        if self._pmax is not None:
            # (ops that changed since, an op complete before included: a device time came later)
            since = self._t.touched_since(self._s, self._pmax_version)
            start = min(self._ins_min, int(np.searchsorted(begins, self._t.open_min[self._s], side="left")),
                        self._pmax.shape[0], 0 if since is None else int(np.searchsorted(begins, since, side="left")))
        ends = runmax.ends_of(begins[start:], self.comp[order[start:]])
        if start and start <= self._pmax.shape[0]:
            if ends.shape[0]:
                ends[0] = max(int(ends[0]), int(self._pmax[start - 1]))
            if self._pmax_buf.shape[0] < n:
                self._pmax_buf = grown(self._pmax, n, start, minimum=1024)
            elif self._pmax_shared and start < self._pmax.shape[0]:  # never rewrite what a view holds
                buf = np.empty(self._pmax_buf.shape[0], np.int64)
                buf[:start] = self._pmax[:start]
                self._pmax_buf = buf
            self._pmax_shared = False
            np.maximum.accumulate(ends, out=self._pmax_buf[start:n])
            self._pmax = self._pmax_buf[:n]
        else:
            self._pmax_buf = np.maximum.accumulate(ends)
            self._pmax = self._pmax_buf
            self._pmax_shared = False
        self._pmax_version = version
        self._ins_min = n
        self.open  # noqa: B018 (settles the set)
        self._t.open_min[self._s] = self._t._earliest_open(np.array([self._s]))[0]
        return self._pmax


    def touch(self, first_begin: int) -> None:
        """Note that the batch that made ``version`` changed ops beginning at ``first_begin``
        or later (I64_MAX: none, only liveness or samples)."""
        t, s = self._t, self._s
        k = int(t.touches[s])
        t.touch_version[s, k % TOUCH_LOG] = t.version[s]
        t.touch_first[s, k % TOUCH_LOG] = first_begin
        t.touches[s] = k + 1
        if first_begin < t.touched_low:
            t.touched_low = first_begin

    def view(self) -> RankView:
        """This rank as an immutable ``RankView`` (the same object while nothing changed)."""
        t, s = self._t, self._s
        version, n = int(t.version[s]), int(t.n[s])
        v = self._view
        if v is not None and v.version == version and v.n == n:
            return v
        self.open  # noqa: B018 (settles the set)
        b = int(t.block[s])
        return self._publish(version, n, t.frozen(b) if b >= 0 else None, int(t.base[s]), int(t.first_ts[s]),
                             int(t.last_ts[s]), int(t.last_hb[s]), t.in_flight([s]).get(s, ()), t.touch_ring(s))

    def _publish(self, version: int, n: int, fz: Mapping[str, np.ndarray] | None, a: int, first_ts: int,
                 last_ts: int, last_hb: int, flight: tuple[int, ...], touched: tuple[np.ndarray, int],
                 maxed: bool = False, ordered: bool | None = None, identity: np.ndarray | None = None) -> RankView:
        """A new view, from the rank's scalars, its block's read-only columns (``fz``: None,
        none), its ops in flight and its touch log (a copy of its ring, and how many entries
        were written to it: ``RankTable.touch_rings``); ``RankTable.views`` reads many at
        once.  ``maxed``: the running max of every rank in time order is up to date;
        ``ordered``, ``identity``: its begins came in time order, ``_identity_of`` at least
        ``n`` long (asked here where not given: many ranks' are read at once).  The
        view holds its block's columns and where its rows start, sliced when asked: 16k ranks
        published each second made ~200k slices, a third of a publish."""
        # (in time order: its order is the identity; its begins and running max, its block's)
        if n and (self._sorted if ordered is None else ordered):
            assert fz is not None  # (a rank in time order has its rows in a block)
            order = _identity_of(n) if identity is None else identity
            if not maxed:
                self._prefix_max(order[:n], fz["begin"][a:a + n])
            cols, sb, pmax = fz, None, None
        elif not n:
            cols, a, order, sb, pmax = _NO_COLUMNS, 0, _EMPTY, None, None
        else:
            if fz is not None:
                cols = fz
            else:
                cols, a = MappingProxyType({c: _frozen(getattr(self, c)[:n]) for c in RankView.COLUMNS}), 0
            order = self.order()
            sb, pmax = _frozen(self._sb), _frozen(self._prefix_max(order, self._sb))
            self._pmax_shared = True
            if order.flags.writeable:
                order = _frozen(order)
        v = self._view = RankView(self.rank, version, n, cols, a, order, sb, pmax, flight, first_ts, last_ts,
                                  last_hb, self.meta, tuple(self.exits), *touched)
        return v


def _no_columns_yet() -> None:
    """A rank's op columns before it has any: the class's, shared (``RankTrace``)."""
    for c in _COLS_I8:
        setattr(RankTrace, c, _NONE_I8)
    for c in _COLS_I4:
        setattr(RankTrace, c, _NONE_I4)


_no_columns_yet()


def _changed_since(count: np.ndarray, versions: np.ndarray, begins: np.ndarray, since: np.ndarray,
                   current: np.ndarray) -> np.ndarray:
    """The rule of a touch log, for many logs (a row each): ``versions``/``begins`` a ring of
    its latest entries (``count[j]`` written in all, the last ``width`` kept), ``since[j]``
    the version asked after, ``current[j]`` the rank's version.  Per row, the earliest begin
    among the ops changed after ``since[j]`` (I64_MAX: none), or I64_MIN when the log no
    longer reaches back that far."""
    rows, width = versions.shape
    out = np.full(rows, I64_MIN, np.int64)
    if width:
        held = np.arange(width) < np.minimum(count, width)[:, None]
        oldest = np.where(count > width, versions[np.arange(rows), count % width], versions[:, 0])
        out = np.where(held & (versions > since[:, None]), begins, I64_MAX).min(axis=1)
        out[(count == 0) | (oldest > since + 1)] = I64_MIN
    out[since >= current] = I64_MAX
    return out


def _one(since: np.ndarray) -> int | None:
    """A ``_changed_since`` of one log as ``touched_since`` says it (None: no longer known)."""
    value = int(since[0])
    return None if value == I64_MIN else value


_IDENTITY = np.zeros(0, np.int64)


def _identity(n: int) -> np.ndarray:
    """0 .. n-1, read-only: the order of every rank whose begins came in time order (one array
    for all of them, grown as ranks grow)."""
    return _identity_of(n)[:n]


def _identity_of(n: int) -> np.ndarray:
    """``_identity`` at least ``n`` long, as it is (grown here, on the writer's side: a view
    published with it slices it when read)."""
    global _IDENTITY
    if _IDENTITY.shape[0] < n:
        _IDENTITY = _frozen(np.arange(max(n, 2 * _IDENTITY.shape[0], 4096), dtype=np.int64))
    return _IDENTITY


def _frozen(a: np.ndarray) -> np.ndarray:
    v = a.view()
    v.flags.writeable = False
    return v


def _column(name: str) -> property:
    """A ``RankView``'s op column ``name``: the slice of its rows'."""

    def get(v: RankView) -> np.ndarray:
        return v.rows[name][v.at:v.at + v.n]

    return property(get, doc=f"op column {name!r}, read-only")


_EMPTY = _frozen(_NONE_I8)
_NO_TOUCHES = _frozen(np.zeros((2, 0), np.int64))
#: The columns of a rank with no ops
_NO_COLUMNS = MappingProxyType({c: _frozen(np.zeros(0, _DTYPE[c])) for c in VIEW_COLUMNS})


class RankView(NamedTuple):
    """One rank as published after an ingest batch: what the console paints from, with no lock.

    The index arrays (``order``, ``sb``: begins in that order, ``pmax``: running max of op
    ends) keep their order once published.  ``order`` and ``sb`` are never written again.  A
    rank in time order has its block's running max (``runmax``): raised in place when an op
    completes later, never lowered, so a reader bisecting it gets at least the ops it got
    before; another rank's is its own copy, never written again.  The op columns are the
    model's own, read-only here: after publishing, the writer only appends past ``n``, fills
    in the completion of ops listed in ``open`` (0 -> a time) and raises a completion that a
    later record moves on (a ``done`` with the op's device time), so a reader may see an op
    complete a moment early or a little later than before, never an index out of order.  The
    column names are those of ``RankTrace``, so painting and queries take either: each a
    slice of ``rows``, made when asked (a view holds its block's columns and where its rows
    start, not a slice a column: ``RankTrace._publish``).
    """

    rank: int
    version: int
    n: int
    rows: Mapping[str, np.ndarray]  # read-only columns its ops lie in from row ``at`` on (its block's, or its own)
    at: int
    ordering: np.ndarray  # op indices by begin time: its own, or the identity (at least ``n`` long) in time order
    own_sb: np.ndarray | None  # begins in that order, its own copy (None: in time order, its begins)
    own_pmax: np.ndarray | None  # running max of ends in that order, its own copy (None: its block's)
    open: tuple[int, ...]  # ops in flight at publishing, by index
    first_ts: int
    last_ts: int
    last_hb: int
    meta: dict | None
    exits: tuple[dict, ...]
    touched: np.ndarray = _NO_TOUCHES  # RankTrace.touched, two rows (versions, begins): its ring as written
    touches: int = 0  # entries written to that ring in all (the last TOUCH_LOG kept)

    begin = _column("begin")
    end = _column("end")
    wb = _column("wb")
    we = _column("we")
    comp = _column("comp")
    sig = _column("sig")
    seq = _column("seq")
    peer = _column("peer")
    flags = _column("flags")

    @property
    def order_(self) -> np.ndarray:
        return self.ordering[:self.n]

    @property
    def sb(self) -> np.ndarray:
        return self.begin if self.own_sb is None else self.own_sb

    @property
    def pmax(self) -> np.ndarray:
        return self.rows["pmax"][self.at:self.at + self.n] if self.own_pmax is None else self.own_pmax

    COLUMNS = _VIEW_OPS

    def order(self) -> np.ndarray:
        """Op indices sorted by begin time."""
        return self.order_

    def touched_since(self, version: int) -> int | None:
        """The earliest begin among the ops changed after ``version`` (I64_MAX: none), or
        None when the log no longer reaches back that far."""
        versions, begins = self.touched
        return _one(_changed_since(np.array([self.touches]), versions[None, :], begins[None, :],
                                   np.array([version], np.int64), np.array([self.version])))

    def window(self, t0: int, t1: int) -> np.ndarray:
        """``RankTrace.window`` on the published arrays."""
        return _window(self.order_, self.sb, self.pmax, self.begin, self.comp, self.open, t0, t1)


def _window(order: np.ndarray, begins: np.ndarray, pmax: np.ndarray, begin: np.ndarray, comp: np.ndarray,
            open_ops: Any, t0: int, t1: int) -> np.ndarray:
    """Indices of ops overlapping [t0, t1), by begin time; ops in flight extend to +inf.
    ``pmax`` may be any running upper bound of the ends (``runmax``): the ops before the
    first position reaching ``t0`` all end before it, and the candidates are filtered by
    their own ends (an op beginning at ``t0`` is in, whatever its end)."""
    if order.shape[0] == 0:
        return np.zeros(0, np.int64)
    i1 = int(np.searchsorted(begins, t1, side="left"))
    i0 = int(np.searchsorted(pmax, t0, side="left"))
    cand = order[i0:i1]
    if cand.shape[0] and t0 > begins[i0]:  # (from before the first op on: every one overlaps)
        ends = comp[cand]
        cand = cand[(ends > t0) | (ends == 0) | (begin[cand] >= t0)]
    if open_ops:  # (only ops in flight: a view's list was taken when it was published)
        extra = [i for i in open_ops if begin[i] < t1]
        if extra:
            cand = np.union1d(cand, np.array(extra, np.int64))
            cand = cand[np.argsort(begin[cand], kind="stable")]
    return cand


class SampleRows:
    """Every rank's resource samples as rows of one block the ranks share (a row a sample,
    ``SAMPLE_FIELDS`` in Fortran order, so each column is contiguous), each rank owning rows
    ``[base, base + cap)`` of it by its slot: a live poll brings 16k ranks a sample each a
    second, written here with a numpy call for them all (``append``), where a block a rank
    cost a Python step each, and an allocation each at its first growth (a quarter of a
    16k console's ingest while it caught up).  A rank that outgrows its rows moves, with
    twice as many, to the block's free end; a full block gives way to one holding every
    rank's rows side by side and a quarter as many free, every rank's samples copied
    (``_renew``).  Rows are never written again once a rank left them, nor the block once
    it gave way: arrays handed out (``arrays``) stay valid.  Each rank's last sample is
    kept too (``last``: as decoded, or its line as written)."""

    #: Rows a rank gets at its first sample (it doubles from there)
    MIN_ROWS = 16

    def __init__(self) -> None:
        self.rows = np.empty((0, len(SAMPLE_FIELDS)), np.float64, order="F")
        self.fill = 0  # rows of the block handed out, from its start
        self.base = np.zeros(0, np.int64)
        self.cap = np.zeros(0, np.int64)
        self.n = np.zeros(0, np.int64)
        self.last = np.empty(0, object)

    def nbytes(self) -> int:
        """Bytes held: the block's rows handed out (its free end is untouched until then: no
        memory) and the slots' arrays."""
        return self.fill * self.rows.itemsize * len(SAMPLE_FIELDS) + sum(
            a.nbytes for a in (self.base, self.cap, self.n, self.last))

    def arrays(self, s: int) -> dict[str, np.ndarray]:
        """Slot ``s``'s samples, a column each (views: its rows as they are now)."""
        if s >= self.n.shape[0] or not self.n[s]:
            return no_samples()
        a = int(self.base[s])
        b = a + int(self.n[s])
        return {f: self.rows[a:b, j] for j, f in enumerate(SAMPLE_FIELDS)}

    def append(self, slots: np.ndarray, counts: np.ndarray, values: np.ndarray, last: Sequence[object]) -> None:
        """Append ``counts[j]`` samples to slot ``slots[j]`` (distinct), ``values`` their rows in
        that order (``SAMPLE_FIELDS``' columns), ``last[j]`` the last of them."""
        if not slots.shape[0]:
            return
        top = int(slots.max()) + 1
        if top > self.n.shape[0]:
            self._slots(top)
        need = self.n[slots] + counts
        short = need > self.cap[slots]
        if short.any():
            grow = slots[short]
            self._give(grow, np.maximum(np.maximum(need[short], 2 * self.cap[grow]), self.MIN_ROWS))
        k = int(counts.sum())
        first = np.cumsum(counts) - counts  # (each slot's first among ``values``)
        self.rows[np.repeat(self.base[slots] + self.n[slots] - first, counts) + np.arange(k)] = values
        self.n[slots] = need
        got = np.empty(slots.shape[0], object)
        got[:] = last
        self.last[slots] = got

    def append_one(self, s: int, values: np.ndarray, last: object) -> None:
        """``append`` of one slot's samples (``values``: their rows), a scalar step: the
        paths that take samples a rank at a time."""
        if s >= self.n.shape[0]:
            self._slots(s + 1)
        n, k = int(self.n[s]), values.shape[0]
        if n + k > self.cap[s]:
            self._give(np.array([s], np.int64), np.array([max(n + k, 2 * int(self.cap[s]), self.MIN_ROWS)]))
        a = int(self.base[s]) + n
        self.rows[a:a + k] = values
        self.n[s] = n + k
        self.last[s] = last

    def _slots(self, size: int) -> None:
        """Room for slots up to ``size`` (a rank added to the table since: no samples yet)."""
        self.base = grown(self.base, size)
        self.cap = grown(self.cap, size)
        self.n = grown(self.n, size)
        self.last = grown(self.last, size, fill=None)

    def _give(self, slots: np.ndarray, caps: np.ndarray) -> None:
        """Rows for ``caps[j]`` samples to slot ``slots[j]`` (distinct), at the block's free
        end, its samples so far copied there; where there is no room, a new block."""
        total = int(caps.sum())
        if self.fill + total > self.rows.shape[0]:
            self._renew(slots, caps)
            return
        start = self.fill + np.cumsum(caps) - caps
        self._copy(slots, self.rows, start)
        self.base[slots] = start
        self.cap[slots] = caps
        self.fill += total

    def _renew(self, slots: np.ndarray, caps: np.ndarray) -> None:
        """A new block: every rank's rows, ``slots`` with ``caps`` rows now, side by side,
        and a quarter as many again free for ranks that outgrow theirs later (2,048 rows at
        least), or as many again where ranks new to the table came (a read taking in a
        wide job's ranks a batch at a time: grown by a quarter, the blocks copied every
        sample ~4 times, 34 ms of a 4k-rank read's 1 s); every rank's samples copied
        (``_copy``).  Rows ranks moved out of are left behind until then."""
        fresh = bool((self.cap[slots] == 0).any())
        self.cap[slots] = caps
        held = np.flatnonzero(self.cap)
        caps = self.cap[held]
        total = int(caps.sum())
        spare = total if fresh else total // 4
        rows = np.empty((max(total + spare, 2048), len(SAMPLE_FIELDS)), order="F")  # (a row is read once written)
        start = np.cumsum(caps) - caps
        self._copy(held, rows, start)
        self.rows = rows
        self.base[held] = start
        self.fill = total

    #: Samples ``_copy`` moves at a time: its index arrays and a column's values are this
    #: long at most (a new block for 16k ranks' millions of samples made them a few times
    #: the samples' size while both blocks were alive)
    COPY_ROWS = 1 << 18

    def _copy(self, slots: np.ndarray, to: np.ndarray, start: np.ndarray) -> None:
        """The samples of ``slots`` copied into block ``to`` from row ``start[j]`` on, a
        column and at most ``COPY_ROWS`` samples at a time."""
        n = self.n[slots]
        ends = np.cumsum(n)
        a = 0
        while a < slots.shape[0]:  # (slots a..b-1: at least one, ~COPY_ROWS samples)
            done = int(ends[a - 1]) if a else 0
            b = max(a + 1, int(np.searchsorted(ends, done + self.COPY_ROWS, side="right")))
            k = n[a:b]
            total = int(k.sum())
            if total:
                within = _within(k)
                src = np.repeat(self.base[slots[a:b]], k) + within
                dst = np.repeat(start[a:b], k) + within
                for j in range(len(SAMPLE_FIELDS)):
                    to[dst, j] = self.rows[src, j]
            a = b


def no_samples() -> dict[str, np.ndarray]:
    """``SampleRows.arrays`` of a rank with none."""
    return dict.fromkeys(SAMPLE_FIELDS, _NONE_F8)


class Samples:
    """One rank's resource samples for sparklines: ts, cpu, rss, gpu_util, gpu_mem,
    gpu_mem_total, kept by its table's ``SampleRows`` (its slot's rows, and its last)."""

    #: Why GPU samples are missing, as the rank's probe said (once: ``gpu_error``)
    gpu_error: str | None = None

    def __init__(self, rank: int, rows: SampleRows, slot: int) -> None:
        self.rank = rank
        self._rows = rows
        self._s = slot

    @property
    def n(self) -> int:
        rows = self._rows
        return int(rows.n[self._s]) if self._s < rows.n.shape[0] else 0

    @property
    def last(self) -> dict | None:
        """The last sample as an event.  A poll's rows bring each rank's as its line
        (``beatscan.polled``), decoded here once asked: few are (a dead rank's finding, the
        rank a console shows)."""
        rows, s = self._rows, self._s
        if s >= rows.last.shape[0]:
            return None
        last = rows.last[s]
        if isinstance(last, bytes):
            got = decode_lines(last, self.rank).events
            assert len(got) == 1  # (a row is one valid event of its rank: ``beatscan``)
            last = rows.last[s] = got[0]
        return last

    @classmethod
    def columns_of(cls, evs: Sequence[dict]) -> dict[str, np.ndarray]:
        """Sample events as columns (None, a field a sample lacks, becomes NaN)."""
        return {f: np.array(list(map(dict.get, evs, repeat(f))), np.float64) for f in SAMPLE_FIELDS}

    def add(self, evs: Sequence[dict], cols: Mapping[str, np.ndarray] | None = None) -> None:
        """Append sample events (``cols``: their ``columns_of``, when the caller has them)."""
        self.extend(cols if cols is not None else self.columns_of(evs), evs[-1])
        self.note_gpu_error(evs)

    def note_gpu_error(self, evs: Sequence[dict]) -> None:
        """Keep the first GPU error among sample events ``evs``, if any says one."""
        err = next((e["gpu_error"] for e in evs if e.get("gpu_error")), None)
        if err is not None:
            self.gpu_error = str(err)

    def extend(self, cols: Mapping[str, np.ndarray], last: dict | bytes) -> None:
        """``add`` of samples given as their columns alone, and the last of them (its line
        where it was not decoded: ``last``), a whole read's or a poll's (``beats.Beats``;
        none of them says ``gpu_error``)."""
        self._rows.append_one(self._s, np.column_stack([np.asarray(cols[f], np.float64) for f in SAMPLE_FIELDS]),
                              last)

    def arrays(self) -> dict[str, np.ndarray]:
        return self._rows.arrays(self._s)
