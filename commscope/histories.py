"""What the ranks of a group must agree on at each collective, and a digest of one rank's
history of it, so that two ranks' histories compare without their ops.

A window (``--since``, a reader after retention) reads each rank from a later segment, with
what the rank was in there (``store/inflight.py``).  A collective the ranks disagreed on (a
mismatch: another op, dtype, shape, reduce op or root) that then completed everywhere
before the window went with the segments skipped.  So a carry says, per group, a digest of
the rank's collectives of it from the first it recorded (``History.first``) to its last
(``History.last``): the sum, modulo 2**62, of one term per collective, its seq and what
must agree (``match_key``) hashed together (``terms``).  A sum, so a reader extends a
rank's digest with the collectives it read after the carry and compares ranks whose
carries were written at different seqs (``analysis/collectives.find_history_mismatches``).
A gap in a rank's seqs (records lost) starts its digest again at the seq after it: a
digest is compared only with those that start where it does, never taken for a mismatch.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from commscope import optable

#: Digests and terms are kept modulo 2**62: a schema ``Count``
MASK = (1 << 62) - 1
_M64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15

COLLECTIVE, P2P, CONTAINER, NESTED = "collective", "p2p", "container", "nested"


def kind_of(op: str, direction: Any, nested: bool) -> str:
    """What an op is to the seq indexes: a collective of its group (``COLLECTIVE``), a
    point-to-point op, a container of other ops (``batch_isend_irecv``, a coalesced
    container), or an op nested in one."""
    if direction in ("send", "recv") or op in optable.P2P_OPS:
        return P2P
    if op == "batch_isend_irecv" or op.endswith("_coalesced_container"):
        return CONTAINER
    return NESTED if nested else COLLECTIVE


def shapes(value: Any) -> tuple:
    """A list of shapes as the match key holds it (tuples)."""
    if not value:
        return ()
    return tuple(tuple(s) if isinstance(s, list | tuple) else s for s in value)


def match_key(op: str, in_shapes: tuple, out_shapes: tuple, in_dtypes: tuple, out_dtypes: tuple,
              redop: Any, root: Any) -> tuple:
    """What every member's call of one collective must agree on: the op, its dtypes (none
    for ops without comparable ones, ``optable.DTYPE_FREE``), the shapes of the sides that
    must match (``optable.SAME_SHAPE``), the reduce op and the root."""
    sides = optable.SAME_SHAPE.get(op, ())
    same = tuple(in_shapes if s == "in" else out_shapes for s in sides)
    dtypes: tuple = () if op in optable.DTYPE_FREE else tuple(sorted(set(in_dtypes) | set(out_dtypes)))
    return (op, dtypes, same, redop, root)


def match_key_of(begin: dict) -> tuple:
    """``match_key`` of an op's begin event (as the model's ``Sig.match_key`` makes it)."""
    get = begin.get
    return match_key(str(get("op") or "?"), shapes(get("in_shapes")), shapes(get("out_shapes")),
                     tuple(get("in_dtypes") or ()), tuple(get("out_dtypes") or ()), get("redop"), get("root"))


def key_hash(key: tuple) -> int:
    """A 64-bit hash of a match key, the same in every process (not Python's ``hash``)."""
    return int.from_bytes(hashlib.blake2b(repr(key).encode(), digest_size=8).digest(), "little")


def term(seq: int, khash: int) -> int:
    """One collective's term of a digest: splitmix64 of its seq and key hash, modulo 2**62
    (``terms`` for many)."""
    z = (khash + seq * _GOLDEN + _GOLDEN) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return (z ^ (z >> 31)) & MASK


def terms(seqs: np.ndarray, khashes: np.ndarray) -> np.ndarray:
    """``term`` of each (seq, key hash), as uint64 (arrays of one shape, or broadcast)."""
    with np.errstate(over="ignore"):
        z = khashes.astype(np.uint64) + seqs.astype(np.uint64) * np.uint64(_GOLDEN) + np.uint64(_GOLDEN)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return (z ^ (z >> np.uint64(31))) & np.uint64(MASK)


class History(NamedTuple):
    """A rank's collectives of one group from seq ``first`` to ``last``, every seq between
    recorded, as one digest."""

    first: int
    last: int
    digest: int

    def fields(self) -> dict[str, int]:
        """As a carried ``group`` event states it."""
        return {"dfrom": self.first, "dseq": self.last, "digest": self.digest}

    @classmethod
    def of_event(cls, e: dict) -> History | None:
        """The history a ``group`` event carries (None: it carries none)."""
        first, last, digest = e.get("dfrom"), e.get("dseq"), e.get("digest")
        if not (isinstance(first, int) and isinstance(last, int) and isinstance(digest, int)) or first > last:
            return None
        return cls(first, last, digest)


def withdrawn(history: History, seq: int, khash: int) -> History | None:
    """``history`` without the collective at ``seq`` (key hash ``khash``): an op the backend
    refused gave its number back after its begin was written with it (its end says
    ``unissued``), and a carry made between the two counted it, as the last collective the
    rank had begun.  Its term comes off (None: it was the history's only one).  A history
    that does not end at ``seq`` stays: it did not end with that op (a carry made after the
    op that took the number back, which counted that one)."""
    if seq != history.last:
        return history
    if seq == history.first:
        return None
    return History(history.first, seq - 1, (history.digest - term(seq, khash)) & MASK)


def extended(history: History | None, seqs: Sequence[int], khashes: Sequence[int]) -> History | None:
    """``history`` (None: none yet) with a rank's next collectives of the group (their seqs
    and key hashes, in stream order) recorded: each seq past the last one taken is added
    where it is the next seq, and starts the history again after a gap (records lost); one
    not past it (in it already: the carried last collective read again) is left out."""
    s = np.asarray(seqs, np.int64)
    if not s.shape[0]:
        return history
    k = np.asarray(khashes, np.uint64)
    before = np.maximum.accumulate(np.concatenate([[history.last if history is not None else -1], s[:-1]]))
    past = s > before
    s, k = s[past], k[past]
    if not s.shape[0]:
        return history
    gaps = np.flatnonzero(np.diff(s) != 1)
    run = int(gaps[-1]) + 1 if gaps.shape[0] else 0  # (the last run of seqs one after another)
    digest = int(terms(s[run:], k[run:]).sum(dtype=np.uint64)) & MASK
    if run == 0 and history is not None and int(s[0]) == history.last + 1:
        return History(history.first, int(s[-1]), (history.digest + digest) & MASK)
    return History(int(s[run]), int(s[-1]), digest)
