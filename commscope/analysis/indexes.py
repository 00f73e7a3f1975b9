"""Cross-rank indexes: which op each member of a group ran at each seq.

A ``GroupIndex`` per (group, seq space) holds a ``SeqIndex``: an int32 matrix
[seq row x member column] -> op index.  p2p channels use the same matrix, keyed by
(group, src, dst).  ``model.TraceModel`` fills them during ingest.
"""

from __future__ import annotations

import numpy as np

from commscope.analysis.columns import grown

#: Ranks below this have their column in an array (``GroupIndex.columns``); others a dict only
COLMAP_MAX = 1 << 22


class SeqIndex:
    """An int32 matrix [row, column] -> op index (-1: none) with one row per seq some op has.

    ``keys`` holds the seqs of the rows, sorted.  Rows exist only for seqs present, so
    memory follows the number of ops, never the seq values: a damaged or hostile seq of
    10**12 costs one row, and a gap after dropped events costs nothing.
    """

    __slots__ = ("cols", "keys", "mat", "n")

    def __init__(self, ncols: int):
        self.cols = ncols
        self.mat = np.full((64, max(ncols, 1)), -1, np.int32)
        self.keys = np.zeros(64, np.int64)
        self.n = 0

    @property
    def base(self) -> int | None:
        """The smallest seq indexed (None: empty)."""
        return int(self.keys[0]) if self.n else None

    def seq_of(self, row: int) -> int:
        return int(self.keys[row])

    def add_cols(self, ncols: int) -> None:
        self.mat = grown(self.mat, ncols, fill=-1, axis=1)
        self.cols = max(self.cols, ncols)

    def _grow(self, rows: int) -> None:
        if rows > self.mat.shape[0]:
            self.mat = grown(self.mat, rows, self.n, fill=-1)
            self.keys = grown(self.keys, self.mat.shape[0], self.n)

    def _add_keys(self, new: np.ndarray) -> None:
        """Add rows for ``new`` (sorted, unique, none present yet)."""
        n, k = self.n, new.shape[0]
        self._grow(n + k)
        if n == 0 or new[0] > self.keys[n - 1]:  # the usual case: later seqs, appended in place
            self.keys[n:n + k] = new
        else:  # seqs before or between present ones (late Flight Recorder ops, gaps filled)
            keys = np.concatenate([self.keys[:n], new])
            order = np.argsort(keys, kind="stable")
            self.mat[: n + k] = np.concatenate([self.mat[:n], np.full((k, self.mat.shape[1]), -1, np.int32)])[order]
            self.keys[: n + k] = keys[order]
        self.n = n + k

    def put(self, seqs: np.ndarray, col: int, idx: np.ndarray) -> None:
        n = self.n
        if n == 0 or int(seqs.min()) > int(self.keys[n - 1]):
            self._add_keys(np.unique(seqs))
        else:
            keys = self.keys[:n]
            pos = np.minimum(np.searchsorted(keys, seqs), n - 1)
            missing = keys[pos] != seqs
            if missing.any():
                self._add_keys(np.unique(seqs[missing]))
        rows = np.searchsorted(self.keys[: self.n], seqs)
        self.mat[rows, col] = idx

    def rows(self) -> np.ndarray:
        """The filled part, [rows x cols] (a view); row r holds seq ``keys[r]``."""
        return self.mat[: self.n, : self.cols]

    def get(self, seq: int) -> np.ndarray | None:
        n = self.n
        if n == 0:
            return None
        r = int(np.searchsorted(self.keys[:n], seq))
        if r >= n or int(self.keys[r]) != seq:
            return None
        return self.mat[r, : self.cols]


class GroupIndex:
    """Collectives of one group in one seq space: which op each member ran at each seq.

    ``members`` is the group (group-rank order when a ``group`` event said so); the seq
    matrix has a column only for members that ran an op, ``ranks`` in column order, so
    a trace holding few ranks of a huge group costs only what those ranks recorded.
    """

    def __init__(self, name: str, space: int, members: list[int]):
        self.name = name
        self.space = space
        self.members = list(dict.fromkeys(members))
        self._member_set = set(self.members)
        self.ranks: list[int] = []  # rank of each matrix column
        self.col: dict[int, int] = {}
        self.colmap = np.full(0, -1, np.int32)  # rank -> column (-1: none), for ``columns``
        self.seqs = SeqIndex(0)

    def add_member(self, rank: int) -> None:
        if rank not in self._member_set:
            self._member_set.add(rank)
            self.members.append(rank)

    def column(self, rank: int) -> int:
        c = self.col.get(rank)
        if c is None:
            self.add_member(rank)
            c = self.col[rank] = len(self.ranks)
            self.ranks.append(rank)
            self.seqs.add_cols(len(self.ranks))
            if 0 <= rank < min(COLMAP_MAX, 4 * len(self.ranks) + (1 << 16)):  # (by rank: as many as columns)
                if rank >= self.colmap.shape[0]:
                    self.colmap = grown(self.colmap, rank + 1, fill=-1, minimum=64)
                self.colmap[rank] = c
        return c

    def columns(self, ranks: np.ndarray) -> np.ndarray:
        """``column`` of many ranks at once (those without one get theirs in ``ranks``'
        order, as calling ``column`` on each would)."""
        if not ranks.shape[0]:
            return np.zeros(0, np.int32)
        if int(ranks.min()) < 0 or int(ranks.max()) >= self.colmap.shape[0]:
            return np.array([self.column(r) for r in ranks.tolist()], np.int32)
        out = self.colmap[ranks]
        missing = np.flatnonzero(out < 0)
        if missing.shape[0]:
            out[missing] = [self.column(r) for r in ranks[missing].tolist()]
        return out

    def complete(self) -> bool:
        """Every member has a column (rows can be complete)."""
        return len(self.ranks) == len(self.members)

    def at(self, seq: int) -> dict[int, int]:
        row = self.seqs.get(seq)
        if row is None:
            return {}
        return {self.ranks[c]: int(i) for c, i in enumerate(row) if i >= 0}
