"""Paint codes: what one byte per signature tells the timeline about an op.

A signature's code holds its traffic category (``& CAT_MASK``, a ``palette`` category),
``ASYNC_BIT`` for async ops and ``HIDDEN_BIT`` for inner traffic drawn as its outer op, so
one table lookup per op (``categories(sigs)[sig]``) tells the painters all three.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from commscope import optable
from commscope.analysis.model import ASYNC, CONTAINER, FR, NESTED, P2P, SPACE_FR
from commscope.tui import palette

VARLEN_OPS = optable.VARLEN

CAT_MASK, ASYNC_BIT, HIDDEN_BIT = 0x1F, 0x20, 0x80  # a signature's paint code: see categories


def categories(sigs: Sequence[Any], table: np.ndarray | None = None) -> np.ndarray:
    """Paint code of every signature code, as a lookup table: its traffic category
    (``& CAT_MASK``), ``ASYNC_BIT`` for async ops and ``HIDDEN_BIT`` for inner traffic drawn
    as its outer op (nested ops, containers), so one lookup per op tells all three.
    ``table``: the one built for a prefix of ``sigs`` (signatures only append), extended."""
    table = np.zeros(0, np.uint8) if table is None else table
    new = np.empty(len(sigs), np.uint8)
    new[: table.shape[0]] = table
    for code in range(table.shape[0], len(sigs)):
        sig = sigs[code]
        if sig.space == SPACE_FR or sig.flags & FR:
            c = palette.FR
        elif sig.op in VARLEN_OPS:
            c = palette.VARLEN
        elif sig.flags & P2P:
            c = palette.P2P
        else:
            c = palette.COLL
        new[code] = c | (ASYNC_BIT if sig.flags & ASYNC else 0) | (HIDDEN_BIT if sig.flags & (NESTED | CONTAINER) else 0)
    return new
