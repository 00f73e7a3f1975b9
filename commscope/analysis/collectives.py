"""Collective findings: missing ranks, mismatches, stragglers; plus per-instance matrices.

A group's collectives form a matrix [seq x member] of op indices (see indexes.GroupIndex).
Gathering one column of every member's op table through it gives a dense matrix
(begin times, completion times, match codes) that numpy scans in milliseconds.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, NamedTuple

import numpy as np
from rich.console import RenderableType
from rich.text import Text

from commscope import histories
from commscope.analysis import evidence, rankstate
from commscope.analysis.columns import RankTable
from commscope.analysis.evidence import ABSENT, Evidence, record
from commscope.analysis.findings import (
    LISTED_RANKS,
    Finding,
    activity,
    doing_instead,
    op_brief,
    rank_list,
    ranks_text,
    secs,
)
from commscope.analysis.indexes import GroupIndex
from commscope.analysis.model import COLL, SPACE_FR, SPACE_NATIVE, MembersPrint, TraceModel, untimed
from commscope.analysis.ranks import ranges
from commscope.analysis.rankstate import snapshot
from commscope.analysis.vocab import FR_IMPORT
from commscope.optable import EXCHANGES
from commscope.units import duration, size

#: A rank straggles when it arrives last in at least this share of recent collectives...
STRAGGLER_LAST_SHARE = 0.7
#: ...its median lateness is at least this multiple of the collective's median true latency...
STRAGGLER_FACTOR = 2.0
#: ...and at least this many ns,
STRAGGLER_MIN_NS = 1_000_000
#: judged over this many recent complete collectives (at least STRAGGLER_MIN_ROWS).
STRAGGLER_WINDOW = 64
STRAGGLER_MIN_ROWS = 8
#: Stragglers may take turns (two slow hosts, alternately last): each last in at least this
#: share, late by the same measure where it is last, at most STRAGGLER_TURNS of them, and
#: last together in at least STRAGGLER_LAST_SHARE of the collectives.
STRAGGLER_TURN_SHARE = 0.3
STRAGGLER_TURNS = 3
#: Later mismatched instances of a group after its first one are counted, not reported.
MISMATCH_REPORT = 1


#: Groups with more members than this gather through one flat copy of the column (numpy per
#: member would cost more than the copy)
GATHER_FLAT = 64


def gather(model: TraceModel, gi: GroupIndex, column: str, rows: np.ndarray | slice = slice(None)) -> np.ndarray:
    """[rows x members] of one op column (int64); 0 where the member has no op at that seq."""
    return gather_many(model, gi, (column,), rows)[0]


def gather_many(model: TraceModel, gi: GroupIndex, columns: tuple[str, ...],
                rows: np.ndarray | slice = slice(None)) -> list[np.ndarray]:
    """``gather`` of several columns at the same rows, the rows' op indexes worked out once."""
    mat = gi.seqs.rows()[rows]
    outs = [np.zeros(mat.shape, np.int64) for _ in columns]
    members = gi.ranks[: mat.shape[1]]
    ok = mat >= 0
    if len(members) > GATHER_FLAT:  # a wide group: from the blocks its members' columns live in
        t = model.table
        slots = t.slots(np.asarray(members, np.int64))
        if not ok[:, slots < 0].any():  # (a member with ops has a slot, unless past RANK_SLOTS)
            _gather_blocks(t, slots, mat, ok, columns, outs)
            return outs
        ns = [model.ranks[r].n if r in model.ranks else 0 for r in members]  # (ranks past RANK_SLOTS)
        base = np.zeros(len(ns), np.int64)
        np.cumsum(ns[:-1], out=base[1:])
        at = (base[None, :] + mat)[ok]
        for out, column in zip(outs, columns, strict=True):
            cols = [getattr(model.ranks[r], column)[:n] if n else _EMPTY for r, n in zip(members, ns, strict=True)]
            out[ok] = np.concatenate(cols)[at]
        return outs
    for c, r in enumerate(members):
        rt = model.ranks.get(r)
        okc = ok[:, c]
        if rt is None or not okc.any():
            continue
        idx = mat[okc, c]
        for out, column in zip(outs, columns, strict=True):
            out[okc, c] = getattr(rt, column)[idx]
    return outs


_EMPTY = np.zeros(0, np.int64)


def _gather_blocks(t: RankTable, slots: np.ndarray, mat: np.ndarray, ok: np.ndarray, columns: tuple[str, ...],
                   outs: list[np.ndarray]) -> None:
    """``gather_many``'s wide group, a block at a time: the members living in one block are
    read from it together (a rank lives in one block), so the work and the temporaries
    follow that block's members, not the whole matrix once per block."""
    where = np.where(slots >= 0, t.block[np.maximum(slots, 0)], -1)
    order = np.argsort(where, kind="stable")
    sorted_ = where[order]
    cuts = np.flatnonzero(np.r_[True, sorted_[1:] != sorted_[:-1], True]).tolist()
    for a, b in zip(cuts[:-1], cuts[1:], strict=True):
        block = int(sorted_[a])
        if block < 0:  # (members with no ops: nothing in these rows)
            continue
        cols = t.blocks[block]
        assert cols is not None
        who = order[a:b]
        lo = int(who[0])
        run = int(who[-1]) - lo + 1 == who.shape[0]  # (ranks in slot order: a run of columns)
        part = slice(lo, lo + who.shape[0]) if run else who
        okb = ok[:, part]
        pos = (mat[:, part] + t.base[slots[who]][None, :])[okb]
        for out, column in zip(outs, columns, strict=True):
            values = cols[column][pos]
            if run:
                out[:, part][okb] = values
            else:
                sub = np.zeros(okb.shape, np.int64)
                sub[okb] = values
                out[:, part] = sub


def seq_of_row(gi: GroupIndex, row: int) -> int:
    return gi.seqs.seq_of(row)


# ---------------------------------------------------------------------- evidence
@record
class Mismatch(Evidence):
    """collective_mismatch: each rank's call at the (group, seq), what differs, the majority."""

    per_rank: dict[str, dict[str, Any]]  # rank -> op, shapes, dtypes, redop, root, site, state, exc
    differs: list[str]  # of "op", "shape", "dtype", "redop", "root"
    majority: dict[str, Any] | None  # None: a tie
    absent_ranks: list[int]
    later_mismatches: int  # later mismatched instances of the group, counted here
    died_in_it: list[int] = ABSENT  # members that died in it before their call was recorded
    #: {"died_in_it", "not_yet", and "before_read": ran it before what was read}: why nobody is named yet
    undecided: dict[str, list[int]] = ABSENT
    src: str = ABSENT  # "fr": Flight Recorder collectives
    #: A mismatch before what was read, told by the ranks' carried histories of the group's
    #: collectives (``find_history_mismatches``): ``up_to_seq``, ``ranks_by_history`` (the
    #: ranks of each history, the most alike first), ``not_compared`` (the members whose
    #: history was not: none read, or one that starts elsewhere, after records it lost)
    history: dict[str, Any] = ABSENT

    def render(self, f: Finding) -> list[RenderableType]:
        parts: list[RenderableType] = []
        per = evidence.values(self.per_rank)
        cols = [c for c in ("rank", "op", "members", "in_shapes", "out_shapes", "in_dtypes", "redop", "root", "state",
                            "site")
                if any(c in row for row in per) and (c != "out_shapes" or "split sizes" in self.differs)]
        if per:
            parts.append(evidence.table("per rank at this (group, seq)", cols,
                                        [[row.get(c) for c in cols] for row in per], set(f.culprits)))
        if self.history:
            alike = "; ".join(ranks_text(rs) for rs in self.history["ranks_by_history"])
            parts.append(Text(f"histories up to #{self.history['up_to_seq']}: {alike}", style=evidence.WARN))
        if self.differs:
            parts.append(Text(f"differs in: {evidence.cell(self.differs)}", style=f"bold {evidence.WARN}"))
        if self.absent_ranks:
            parts.append(Text(f"not there yet: {ranks_text(self.absent_ranks)}", style=evidence.GREY))
        if self.later_mismatches:
            parts.append(Text(f"{self.later_mismatches} later mismatched instances not shown", style=evidence.FAINT))
        return parts


@record
class MissingRanks(Evidence):
    """missing_ranks: who entered and how long they waited, what the missing ranks do instead."""

    entered: list[int]
    missing: list[int]
    waited_s: dict[str, float]  # rank -> seconds
    op: dict[str, Any]  # findings.op_brief of the lowest waiting rank's op
    missing_activity: dict[str, dict[str, Any]]  # rank -> findings.activity + last_seq_in_group
    failed_on: dict[str, str] = ABSENT  # rank -> exception, where the waiting op raised
    src: str = ABSENT  # "fr": Flight Recorder collectives

    def render(self, f: Finding) -> list[RenderableType]:
        waited = {int(r): float(v) for r, v in self.waited_s.items()}
        parts: list[RenderableType] = []
        if waited:
            vals = sorted(waited.values())
            if vals[-1] - vals[0] < 0.1:
                line = f"{ranks_text(waited)} waited {vals[-1]:.1f} s"
            elif len(waited) > LISTED_RANKS:  # (4,095 ranks' waits were 727 lines, the late one at 163: helper-165)
                median = vals[len(vals) // 2]
                least = [r for r in sorted(waited, key=lambda r: (waited[r], r)) if waited[r] < median - 0.05][:3]
                line = f"{len(waited):,} ranks, {vals[0]:.1f}-{vals[-1]:.1f} s (median {median:.1f} s)" + (
                    "; least (came last): " + ", ".join(f"rank {r} {waited[r]:.1f} s" for r in least) if least else "")
            else:
                line = ", ".join(f"{r}: {v:.1f} s" for r, v in sorted(waited.items()))
            parts.append(Text("waiting  ", style=evidence.DIM) + Text(line))
        if self.op:
            parts.append(Text("in       ", style=evidence.DIM) + Text(evidence.brief(self.op)))
        acts = evidence.values(self.missing_activity)
        if acts:
            parts.append(Text("never entered: what they do instead", style=f"bold {evidence.GREY}"))
        alike: dict[tuple[str, str | None, Any], list[Any]] = {}  # (ranks doing the same: one saying)
        for act in acts:
            op = act.get("in_op") or act.get("last_completed_op")
            said = (str(act.get("text", act.get("state"))), op.get("site") if op else None, act.get("last_seq_in_group"))
            alike.setdefault(said, []).append(act.get("rank"))
        for k, ((text, site, last), ranks) in enumerate(alike.items()):
            if k == LISTED_RANKS:  # (5,000 absent members drew 15,000 lines: the evidence has each)
                rest = sum(map(len, list(alike.values())[k:]))
                parts.append(Text(f"... and {rest:,} more rank(s), each in the evidence", style=evidence.FAINT))
                break
            t = Text()
            named = f"rank {ranks[0]}" if len(ranks) == 1 else \
                ranks_text(ranks) if all(isinstance(r, int) for r in ranks) else f"{len(ranks):,} ranks"
            t.append(f"{named}  ", style=f"bold {evidence.BAD}")
            t.append(text)
            if site:
                t.append(f"\n  at {site}", style=evidence.GREY)
            if last is not None:
                t.append(f"\n  last collective of the group it ran: #{last}", style=evidence.GREY)
            parts.append(t)
        if self.failed_on:
            parts.append(Text(f"the waiting op raised: {evidence.cell(self.failed_on)}", style=evidence.BAD))
        return parts


@record
class Straggler(Evidence):
    """straggler: how late the rank (or a host: its ranks together) arrives in its worst
    group, and in its other groups."""

    host: str = ABSENT  # a straggler host: its name (the culprits are its ranks)
    host_ranks: list[int] = ABSENT
    group: str
    src: str = ABSENT  # "fr": Flight Recorder collectives
    collectives: int  # recent complete collectives judged
    last_share: float  # share of them it arrived last at
    median_lateness_s: float
    p90_lateness_s: float
    median_latency_s: float
    first_seq: int
    last_seq: int
    ops: list[str]
    #: the other stragglers of the group it takes turns with at being last ("host node02", "rank 7")
    turns_with: list[str] = ABSENT
    other_groups: list[dict[str, Any]] = ABSENT  # the same fields, for its other groups

    def render(self, f: Finding) -> list[RenderableType]:
        rows = [[g["group"], g["collectives"], f"{g['last_share'] * 100:.0f}%",
                 f"{float(g['median_lateness_s']) * 1e3:.1f} ms", f"{float(g['p90_lateness_s']) * 1e3:.1f} ms",
                 duration(float(g['median_latency_s']) * 1e9)] for g in [self, *(self.other_groups or [])]]
        head = [evidence.kv([("host", f"{self.host}: ranks {ranges(self.host_ranks)}, slow together")])] \
            if self.host is not ABSENT else []
        return head + [evidence.table("arrived last", ["group", "collectives", "last", "median late", "p90 late",
                                                "median latency"], rows)]


# ---------------------------------------------------------------------- mismatch
def find_mismatches(model: TraceModel, now: int) -> tuple[list[Finding], dict[tuple[int, str, int], list[int]]]:
    """Mismatch findings, and every mismatched (space, group, seq) with the culprits its
    group's finding names (later instances of a group are counted in the first one)."""
    findings: list[Finding] = []
    rows_hit: dict[tuple[int, str, int], list[int]] = {}
    exchanged = _Exchanges.of(model)
    for (space, name), gi in model.coll.items():
        mat = gi.seqs.rows()
        if mat.shape[0] == 0 or mat.shape[1] < 2:
            continue
        sig = gather(model, gi, "sig")
        present = mat >= 0
        unknown = model.unknown_sigs()
        if unknown.shape[0]:  # (an op whose name its stream could not say votes for nothing)
            present &= ~np.isin(sig, unknown)
        codes = np.where(present, model.sig_match(sig.astype(np.int32)), -1)
        hi = codes.max(axis=1)
        lo = np.where(present, codes, np.iinfo(np.int32).max).min(axis=1)
        bad = np.nonzero((present.sum(axis=1) >= 2) & (hi != lo))[0]
        split = _unconserved(model, gi, sig, present, hi == lo, exchanged) if (space, name) in exchanged.groups else {}
        if split:
            bad = np.union1d(bad, np.fromiter(split, np.int64, len(split)))
        if bad.shape[0] == 0:
            continue
        for row in bad[:MISMATCH_REPORT].tolist():
            findings.append(_split_mismatch(model, gi, row, split[row], now, later=int(bad.shape[0]) - 1)
                            if row in split else _mismatch(model, gi, row, codes[row], now, later=int(bad.shape[0]) - 1))
        for b in bad.tolist():
            rows_hit[(space, name, seq_of_row(gi, b))] = list(findings[-1].culprits)
    return findings, rows_hit


class _Exchanges(NamedTuple):
    """Bytes in and out of each sig code of an exchange (``optable.EXCHANGES``: an
    all_to_all), -1 for any other, and the (space, group)s holding one: found once a
    diagnosis, from the sigs alone (a few hundred), so a trace with none pays nothing."""

    bytes_in: np.ndarray
    bytes_out: np.ndarray
    groups: frozenset[tuple[int, str]]

    @staticmethod
    def of(model: TraceModel) -> _Exchanges:
        # (a Flight Recorder's, dumped or side by side, not: a rank's dump missing leaves a group's
        # members unknown, and an uneven exchange summed over the ranks that dumped read as
        # unconserved, helper-189)
        codes = [s.code for s in model.sigs if s.op in EXCHANGES and s.in_shapes and s.out_shapes
                 and s.src not in ("fr", FR_IMPORT)]
        bytes_in = np.full(len(model.sigs), -1, np.int64)
        bytes_out = bytes_in.copy()
        for c in codes:
            bytes_in[c], bytes_out[c] = model.sigs[c].in_bytes, model.sigs[c].out_bytes
        return _Exchanges(bytes_in, bytes_out, frozenset((model.sigs[c].space, model.sigs[c].group) for c in codes))


def _unconserved(model: TraceModel, gi: GroupIndex, sig: np.ndarray, present: np.ndarray, alike: np.ndarray,
                 ex: _Exchanges) -> dict[int, tuple[int, int]]:
    """The rows of group ``gi`` where every member ran the same exchange (``alike``) and the
    bytes its ranks sent in all differ from those they received in all, each with the two:
    their split sizes disagree (rank 1 expected 3 elements from rank 0, which sent 2).  Gloo
    runs such an all_to_all_single without a word, and the job goes on with a garbage
    element (helper-182: exit 0, no finding)."""
    if sig.shape[1] < len(gi.members) or not gi.members:
        return {}
    bin_, bout = ex.bytes_in[sig], ex.bytes_out[sig]
    rows = np.nonzero(present.all(axis=1) & alike & (bin_ >= 0).all(axis=1) & (bout >= 0).all(axis=1))[0]
    if rows.shape[0] == 0:
        return {}
    sent, got = bin_[rows].sum(axis=1), bout[rows].sum(axis=1)
    off = np.nonzero(sent != got)[0]
    return {int(rows[k]): (int(sent[k]), int(got[k])) for k in off.tolist()}


def _split_mismatch(model: TraceModel, gi: GroupIndex, row: int, sums: tuple[int, int], now: int,
                    later: int) -> Finding:
    """The ``collective_mismatch`` of an exchange whose split sizes disagree
    (``_unconserved``), naming every rank: the splits themselves are not recorded, so which
    rank's are wrong is not known.  (Named by the majority of the ranks' bytes in and out, a
    rank that did right was named alone where the splits were uneven: rank 3 sending
    [1, 1, 2, 0] and expecting one row from itself, rank 2 rightly expecting five;
    helper-189.)  The message says whose totals stand apart."""
    seq = seq_of_row(gi, row)
    ops = gi.at(seq)
    io = {r: (model.sig_of(r, i).in_bytes, model.sig_of(r, i).out_bytes) for r, i in ops.items()}
    top = Counter(io.values()).most_common()
    tie = len(top) > 1 and top[0][1] == top[1][1]
    apart = [] if tie else sorted(r for r, v in io.items() if v != top[0][0])
    culprits = sorted(ops)
    table = {}
    for r in sorted(ops):
        b = op_brief(model, r, ops[r], now)
        table[str(r)] = {k: b.get(k) for k in ("op", "in_shapes", "in_shapes_total", "in_dtypes", "out_shapes",
                                               "out_shapes_total", "site", "state", "exc") if b.get(k) is not None}
    op = model.sig_of(culprits[0], ops[culprits[0]]).op
    did = {r: f"sent {size(io[r][0])}, received {size(io[r][1])}" for r in sorted(ops)}
    msg = (f"ranks disagree at collective #{seq} of group {gi.name}: {op} sent {size(sums[0])} in all and "
           f"received {size(sums[1])}, so their split sizes disagree (each rank's output splits must be what the "
           f"others send it); " + _who_ran(did) + "; the splits are not recorded, so every rank is named" +
           (f" ({rank_list(apart)} sent or received other than the rest)" if apart else ""))
    ev = Mismatch(per_rank=table, differs=["split sizes"], majority=None, absent_ranks=[], later_mismatches=later)
    t = max(int(model.ranks[r].begin[i]) for r, i in ops.items())
    return Finding("collective_mismatch", gi.name, seq, op, list(gi.members), culprits, msg, ev, ts=t)


def _who_ran(ran: dict[int, str]) -> str:
    """'rank 0: all_reduce, rank 1: broadcast'; past ``LISTED_RANKS`` ranks, those that ran
    the same said once, most first: '4,095 ranks (0-2048,2050-4095): all_reduce; rank 2049:
    broadcast' (a 4,096-rank mismatch's message named every rank, 93,207 characters, its
    culprit in the last clause: helper-165)."""
    if len(ran) <= LISTED_RANKS:
        return ", ".join(f"rank {r}: {what}" for r, what in ran.items())
    alike: dict[str, list[int]] = {}
    for r, what in ran.items():
        alike.setdefault(what, []).append(r)
    kinds = sorted(alike.items(), key=lambda kv: (-len(kv[1]), kv[1][0]))
    said = [f"{ranks_text(rs)}: {what}" for what, rs in kinds[:LISTED_RANKS]]
    if len(kinds) > LISTED_RANKS:
        said.append(f"{sum(len(rs) for _, rs in kinds[LISTED_RANKS:]):,} more ranks ran "
                    f"{len(kinds) - LISTED_RANKS:,} other kinds")
    return "; ".join(said)


def _mismatch(model: TraceModel, gi: GroupIndex, row: int, codes: np.ndarray, now: int, later: int) -> Finding:
    seq = seq_of_row(gi, row)
    ops = gi.at(seq)
    by_rank = {gi.ranks[c]: int(code) for c, code in enumerate(codes.tolist()) if code >= 0}
    counts = Counter(by_rank.values())
    top = counts.most_common()
    tie = len(top) > 1 and top[0][1] == top[1][1]
    majority = None if tie else top[0][0]
    # Members without a call here still have a vote: one that died in it before its call
    # reached the trace (Gloo aborts a process on mismatched sizes), or one that is still on
    # its way.  While their votes could make it a tie or turn it, the odd one out cannot be
    # told, and naming ranks would name innocents.
    absent = [m for m in gi.members if m not in ops]
    snap = snapshot(model, now)
    carried = model.histories.get(gi.name, {}) if gi.space == SPACE_NATIVE else {}
    # (a member whose carried history is past it ran it before what was read: its vote is not known)
    ran = [m for m in absent if m in carried and carried[m].history.first <= seq <= carried[m].history.last]
    lost = [m for m in absent if m not in ran and (snap[m].crashed or snap[m].dead) and _last_seq(gi, m) == seq - 1]
    coming = [m for m in absent if m not in lost and m not in ran and not rankstate.left_early(model, m, now)]
    margin = top[0][1] - (top[1][1] if len(top) > 1 else 0)
    undecided = bool(lost or coming or ran) and margin <= len(lost) + len(coming) + len(ran)
    culprits = [] if undecided else sorted(by_rank) if tie else sorted(r for r, c in by_rank.items() if c != majority)
    table = {}
    for r in sorted(ops):
        b = op_brief(model, r, ops[r], now)
        table[str(r)] = {k: b.get(k) for k in ("op", "in_shapes", "in_shapes_total", "in_dtypes", "out_shapes",
                                               "out_shapes_total", "out_dtypes", "redop", "root", "site", "state",
                                               "exc") if b.get(k) is not None}
    absent = [r for r in gi.members if r not in ops]
    names = sorted({model.sig_of(r, i).op for r, i in ops.items()})
    maj_rank = next((r for r, c in by_rank.items() if c == majority), None)
    op_name = model.sig_of(maj_rank, ops[maj_rank]).op if maj_rank is not None else "/".join(names)
    diff = _what_differs([model.sig_of(r, i) for r, i in ops.items()])
    did = {r: _call_text(table[str(r)], diff) for r in sorted(ops)}
    msg = (f"ranks disagree at collective #{seq} of group {gi.name}: " + _who_ran(did) +
           (f"; differing: {', '.join(diff)}" if diff else "") +
           (_undecided(lost, coming, ran) if undecided else "; tie, so every rank is named" if tie else
            f"; {rank_list(culprits)} differ from the majority"))
    ev = Mismatch(per_rank=table, differs=diff, majority=None if tie else
                  {k: table[str(maj_rank)].get(k) for k in ("op", "in_shapes", "in_dtypes", "redop", "root")},
                  absent_ranks=absent, later_mismatches=later, died_in_it=lost or ABSENT,
                  undecided=({"died_in_it": lost, "not_yet": coming} | ({"before_read": ran} if ran else {})
                             if undecided else ABSENT),
                  src="fr" if gi.space == SPACE_FR else ABSENT)
    t = max(int(model.ranks[r].begin[i]) for r, i in ops.items())
    return Finding("collective_mismatch", gi.name, seq, op_name, list(gi.members), culprits, msg, ev, ts=t)


def find_group_disagreements(model: TraceModel) -> list[Finding]:
    """``collective_mismatch`` where ranks of one run state different members for one group
    (``TraceModel.group_views``): they called new_group in different orders, or some skipped
    one, and torch paired ranks by the order their groups were made, so each group's
    collectives mixed ranks of different groups and gave wrong results without a word
    (helper-186: rank 0 paired with rank 3, check exit 0).  The ranks whose statement differs
    from most ranks' are named; all that stated it on a tie."""
    out: list[Finding] = []
    apart = model.kept_apart
    for name, who in sorted(model.group_disputes):  # (only those whose ranks' statements differ: few)
        views = {r: v for r, v in model.group_views[name][who].items() if r not in apart}
        counts = Counter(views.values()).most_common()
        if len(counts) < 2:
            continue
        tie = counts[0][1] == counts[1][1]
        culprits = sorted(views) if tie else sorted(r for r, v in views.items() if v != counts[0][0])
        said: dict[MembersPrint, list[int]] = {}
        for r, v in sorted(views.items()):
            said.setdefault(v, []).append(r)
        members = {v: model.group_members_of[(name, who, v)] for v in said}
        text = "; ".join(f"{ranks_text(rs)}: {members[v]}" for v, rs in sorted(said.items(), key=lambda kv: -len(kv[1])))
        msg = (f"ranks disagree on the members of group {name}: {text} (they made their groups in different "
               "orders, or some skipped one: torch pairs ranks by that order, so the group's collectives mix "
               "ranks of different groups, with wrong results or a hang); " +
               ("tie, so every rank that stated it is named" if tie else f"{rank_list(culprits)} differ from the majority"))
        ev = Mismatch(per_rank={str(r): {"members": members[v]} for r, v in sorted(views.items())},
                      differs=["group members"], majority=None if tie else {"members": members[counts[0][0]]},
                      absent_ranks=[], later_mismatches=0)
        ts = min((int(model.ranks[r].begin[0]) for r in views if r in model.ranks and model.ranks[r].n), default=0)
        out.append(Finding("collective_mismatch", name, None, None, sorted(views), culprits, msg, ev, ts=ts))
    return out


def find_history_mismatches(model: TraceModel, found: list[Finding]) -> tuple[list[Finding], list[Finding]]:
    """Mismatches before what was read: a window's ranks start after the segments it skips,
    each with its carried history of each group's collectives (``histories``, a digest).
    Brought to one seq with the collectives read (added after a history's end, taken off
    before it), the histories of ranks that ran the same collectives are equal; a rank
    whose history differs from most ranks' ran another op, dtype, shape, reduce op or root
    somewhere before (a mismatch that completed everywhere, which the window did not read).
    A rank read from its stream's start, with no carry, has the history of what was read.
    Only ranks whose histories start at the same seq and that ran every seq between are
    compared (a rank with no carry read from elsewhere is not).  A group with a mismatch
    ``found`` among what was read is left to it (it says where), unless it names nobody:
    the histories are compared then, and stand in for one that named nobody for ranks that
    ran it before what was read.  Returns the findings and those of ``found`` they stand
    in for."""
    native = [f for f in found if f.kind == "collective_mismatch" and f.evidence.get("src") != "fr"]
    settled = {f.group for f in native if not f.evidence.get("undecided")}
    out: list[Finding] = []
    replaced: list[Finding] = []
    for name, per in model.histories.items():
        if name in settled:
            continue
        gi = model.coll.get((SPACE_NATIVE, name))
        first = Counter(c.history.first for c in per.values()).most_common(1)[0][0]
        hist = {r: c.history for r, c in per.items() if c.history.first == first}
        if gi is not None:  # (a rank with no carry read from elsewhere than its start is not one)
            hist |= {r: h for r, h in _read_whole(gi, per).items() if h.first == first}
        if len(hist) < 2:
            continue
        at, digests = _histories_compared(model, gi, hist)
        kinds: dict[int, list[int]] = {}
        for r, d in digests.items():
            kinds.setdefault(d, []).append(r)
        if len(kinds) < 2:
            continue
        alike = sorted((sorted(rs) for rs in kinds.values()), key=lambda rs: (-len(rs), rs))
        tie = len(alike[0]) == len(alike[1])
        members = list(gi.members) if gi is not None else model.groups.get(name) or sorted(per)
        # A tie with members not compared (no carry yet, records lost): their histories would
        # break it, so the odd one out cannot be told, and naming every rank compared names
        # innocents (a window where one rank's carry was not written yet named ranks 2 and 3
        # of [1, 2, 3] where the full read names 3)
        unknown = [r for r in members if r not in digests]
        culprits = [] if tie and unknown else sorted(digests) if tie else sorted(r for rs in alike[1:] for r in rs)
        msg = (f"ranks disagree in the collectives of group {name} before what was read: up to #{at}, " +
               (f"their histories differ in halves, a tie that {rank_list(unknown)}, not compared, would break, so "
                "the odd one out cannot be told" if tie and unknown else
                "their histories differ in halves, a tie, so every rank compared is named" if tie else
                f"{rank_list(culprits)} ran other collectives than the {len(alike[0]):,} others compared") +
               (" (retention deleted the segments where they began: their summaries count those collectives, "
                "not where they differ)" if any(model.ranks[r].summaries for r in digests if r in model.ranks) else
                " (read from the start, without --since, to see where)"))
        ev = Mismatch(per_rank={}, differs=[], majority=None, absent_ranks=[], later_mismatches=0,
                      history={"up_to_seq": at, "ranks_by_history": alike,
                               "not_compared": sorted(r for r in members if r not in digests)})
        ts = max(c.ts for c in per.values())
        out.append(Finding("collective_mismatch", name, at, None, members, culprits, msg, ev, ts=ts))
        replaced += [f for f in native if f.group == name and _ran_before(f)]
    return out, replaced


def _ran_before(f: Finding) -> bool:
    """Whether a mismatch read named nobody for members that ran it before what was read
    (their histories decide)."""
    undecided = f.evidence.get("undecided")
    return bool(undecided and undecided.get("before_read"))


def _read_whole(gi: GroupIndex, per: Mapping[int, object]) -> dict[int, histories.History]:
    """The members of ``gi`` without a carried history (``per``): each an empty history
    starting at the first collective of the group it recorded (what was read of it is
    added to it; one read from its stream's start begins where the carried ones do)."""
    cols = np.array([c for c, r in enumerate(gi.ranks) if r not in per], np.int64)
    if not cols.shape[0]:
        return {}
    ran = gi.seqs.rows()[:, cols] >= 0
    firsts = gi.seqs.keys[: gi.seqs.n][ran.argmax(axis=0)]
    return {gi.ranks[int(c)]: histories.History(int(seq), int(seq) - 1, 0)
            for c, seq, some in zip(cols, firsts, ran.any(axis=0), strict=True) if some}


#: The seqs ``_histories_compared`` tries (where the latest histories end, and the seq
#: before each), and the cells of the collectives read it takes at a time (rows, the seqs
#: a part of the ranks is brought over, times their columns)
HISTORY_TRIES = 4
HISTORY_CELLS = 1 << 22


def _histories_compared(model: TraceModel, gi: GroupIndex | None,
                        hist: dict[int, histories.History]) -> tuple[int, dict[int, int]]:
    """The seq at which most of ``hist``'s ranks have a history, of those tried, and each
    such rank's digest up to it: its history, ending there, or brought there by the
    collectives read (those after its end added, those up to its end from there taken off),
    where the rank ran every seq between (a rank that did not is not compared there)."""
    ends = sorted({h.last for h in hist.values()}, reverse=True)[:HISTORY_TRIES]
    tries = sorted({x for e in ends for x in (e, e - 1) if x >= 0}, reverse=True)
    if not tries:
        return 0, {}
    got: dict[int, dict[int, int]] = {at: {r: h.digest for r, h in hist.items() if h.last == at} for at in tries}
    if gi is not None:
        moved = sorted((r for r in hist if r in gi.col), key=lambda r: hist[r].last)
        # (ranks whose histories end near one another together: a rank read whole spans all it read)
        for part in _spans(moved, hist, tries):
            _bring(model, gi, hist, part, tries, got)
    best = max(tries, key=lambda at: (len(got[at]), at))
    return best, got[best]


def _spans(ranks: list[int], hist: dict[int, histories.History], tries: list[int]) -> list[list[int]]:
    """``ranks`` (sorted by where their histories end) in parts whose matrix of the seqs they
    are brought over (their ends to the seqs tried) times their columns stays under
    ``HISTORY_CELLS``."""
    parts: list[list[int]] = []
    for r in ranks:
        if parts:
            part = parts[-1]
            rows = max(tries[0], hist[r].last) - min(hist[part[0]].last, tries[-1]) + 1
            if rows * (len(part) + 1) <= HISTORY_CELLS:
                part.append(r)
                continue
        parts.append([r])
    return parts


def _bring(model: TraceModel, gi: GroupIndex, hist: dict[int, histories.History], part: list[int],
           tries: list[int], got: dict[int, dict[int, int]]) -> None:
    """Each rank of ``part``'s digest at each seq of ``tries`` it can be brought to by the
    collectives read (``_histories_compared``), into ``got``."""
    idx = gi.seqs
    keys = idx.keys[: idx.n]
    last = np.array([hist[r].last for r in part], np.int64)
    lo = int(np.searchsorted(keys, min(int(last.min()), tries[-1]) + 1))
    hi = int(np.searchsorted(keys, max(int(last.max()), tries[0]), "right"))
    seqs = keys[lo:hi]
    if not seqs.shape[0]:
        return
    cols = np.array([gi.col[r] for r in part], np.int64)
    present = idx.rows()[lo:hi][:, cols] >= 0
    sig = gather(model, gi, "sig", np.arange(lo, hi))[:, cols]
    t = np.where(present, histories.terms(seqs[:, None], model.sig_hashes(sig)), np.uint64(0))
    zero = np.zeros((1, len(part)), np.uint64)
    sums = np.concatenate([zero, np.cumsum(t, axis=0, dtype=np.uint64)])
    counts = np.concatenate([zero.astype(np.int64), np.cumsum(present, axis=0)])
    digest = np.array([hist[r].digest for r in part], np.uint64)
    col = np.arange(len(part))
    for at in tries:
        a = np.searchsorted(seqs, np.minimum(last, at) + 1)
        e = np.searchsorted(seqs, np.maximum(last, at), "right")
        need = np.abs(at - last)
        ok = (need > 0) & (e - a == need) & (counts[e, col] - counts[a, col] == need)
        delta = sums[e, col] - sums[a, col]
        moved = np.where(at > last, digest + delta, digest - delta) & np.uint64(histories.MASK)
        got[at].update(zip(np.asarray(part)[ok].tolist(), moved[ok].tolist(), strict=True))


def _undecided(lost: list[int], coming: list[int], ran: Sequence[int] = ()) -> str:
    why = []
    if lost:
        why.append(f"{rank_list(lost)} died in it before its call was recorded")
    if coming:
        why.append(f"{rank_list(coming)} have not called it yet")
    if ran:
        why.append(f"{rank_list(ran)} ran it before what was read")
    return "; " + " and ".join(why) + ", so the odd one out cannot be told" + (" yet" if coming and not lost else "")


def _last_seq(gi: GroupIndex, rank: int) -> int | None:
    """The last seq of the group the rank ran (None: none)."""
    col = gi.col.get(rank)
    mat = gi.seqs.rows()
    if col is None or mat.shape[0] == 0:
        return None
    have = np.nonzero(mat[:, col] >= 0)[0]
    return seq_of_row(gi, int(have[-1])) if have.shape[0] else None


def _shapes_text(brief: dict) -> str:
    """An op's input shapes as a message quotes them: those its brief holds, and how many in
    all where it holds only the first (``findings.BRIEF_TENSORS``)."""
    total = brief.get("in_shapes_total")
    return f"{brief.get('in_shapes')}" + (f" (the first of {total:,} tensors)" if total else "")


def _call_text(brief: dict, differs: list[str]) -> str:
    """A rank's call as a mismatch's message quotes it: its op, and its value of each other
    field the ranks differ in ('all_reduce dtype=float16', 'broadcast root=1'): the message
    said only "differing: dtype", the values in the table (helper-186)."""
    said = [str(brief["op"])]
    if "shape" in differs:
        said.append(_shapes_text(brief))
    if "dtype" in differs:  # (as compared: its inputs' and outputs' together, ``histories.match_key``)
        dtypes = sorted({str(d) for k in ("in_dtypes", "out_dtypes") for d in brief.get(k) or ()})
        said.append(f"dtype={'/'.join(dtypes) or 'none'}")
    said.extend(f"{k}={brief.get(k, 'none')}" for k in ("redop", "root") if k in differs)
    return " ".join(said)


def _what_differs(sigs: list) -> list[str]:
    """The fields the ranks' calls differ in.  A reduce op or a root differs only between ops
    that have one: an all_gather beside an all_reduce differs in its op, not in a reduce op
    it does not take (helper-176 read "differing: op, redop")."""
    out = []
    for label, get, optional in (("op", lambda s: s.op, False), ("shape", lambda s: s.match_key()[2], False),
                                 ("dtype", lambda s: s.match_key()[1], False), ("redop", lambda s: s.redop, True),
                                 ("root", lambda s: s.root, True)):
        values = {get(s) for s in sigs} - ({None} if optional else set())
        if len(values) > 1:
            out.append(label)
    return out


# ---------------------------------------------------------------------- missing ranks
def find_missing(model: TraceModel, now: int, hang_ns: int, skip: Any,
                 drawn: Mapping[int, frozenset[int]] = MappingProxyType({})) -> list[Finding]:
    """Collectives some members entered long ago and still wait in, which others never
    entered (or a rank waits in, drawn into a hang: ``hangs.drawn_in``).  (Once the
    waiting op raises, it is an ``op_failed``.)"""
    pending: dict[tuple[int, str, int], dict[int, int]] = {}
    t = model.table
    slots, ops = rankstate.open_ops(model)
    sig, seq, begin, comp = t.gather(("sig", "seq", "begin", "comp"), t.block[slots], t.base[slots] + ops)
    # every rank's ops in flight at once: collectives waited in for hang_ns, or by a rank
    # stopped while it waited for a member that had left without entering (``cut_short``)
    waits = (comp == 0) & ((model.sig_flags(sig) & COLL) != 0) & (seq >= 0)
    hung = waits & (now - begin >= hang_ns)
    if model.kept_apart:  # (a foreign stream's waits are not this run's)
        hung &= ~np.isin(slots, model.slots_of(np.fromiter(model.kept_apart, np.int64)))
    cut = rankstate.cut_short(model)
    if cut:  # (the one op each was stopped in, not another it had open: an async op of another group)
        ranks_cut = np.fromiter(cut, np.int64, len(cut))
        ops_cut = np.fromiter((i for i, _ in cut.values()), np.int64, len(cut))
        at = (model.slots_of(ranks_cut).astype(np.int64) << 32) | ops_cut
        hung |= waits & np.isin((slots.astype(np.int64) << 32) | ops, at)
    if drawn:  # (each drawn rank's ops: the few a hang reached within hang_after of its start)
        pairs = [(r, i) for r, d in drawn.items() for i in d]
        at = (model.slots_of(np.array([r for r, _ in pairs], np.int64)).astype(np.int64) << 32) | \
            np.array([i for _, i in pairs], np.int64)
        hung |= waits & np.isin((slots.astype(np.int64) << 32) | ops, at)
    short: dict[tuple[int, str, int], frozenset[int]] = {}  # hangs only cut short: who left by themselves
    long: set[tuple[int, str, int]] = set()  # hangs some rank waited in past hang_after: every absent member late
    if hung.any():
        where = {r: k for k, r in enumerate(model.ranks)}  # (in the ranks' order, each rank's ops by index)
        ranks = [t.traces[s].rank for s in slots[hung].tolist()]
        rows = sorted(zip(map(where.__getitem__, ranks), ops[hung].tolist(), ranks, sig[hung].tolist(),
                          seq[hung].tolist(), strict=True))
        gone = rankstate.gone_early(model, list(dict.fromkeys(ranks)), now)
        for _, i, r, code, q in rows:
            if r in gone:
                continue  # a rank that is gone no longer waits
            s = model.sigs[code]
            key = (s.space, s.group, q)
            if model.exits_seen and rankstate.waited_until(model, r, now) - int(model.ranks[r].begin[i]) < hang_ns:
                if r in cut and cut[r][0] == i:
                    short[key] = short.get(key, frozenset()) | cut[r][1]
                elif i not in drawn.get(r, ()):
                    continue  # (it left, with its job, before it had waited that long)
                # (drawn into a hang: waited in, but not past hang_after, nor cut short)
            elif i not in drawn.get(r, ()):
                long.add(key)
            pending.setdefault(key, {})[r] = i
    out = []
    for (space, name, seq), waiting in pending.items():
        if (space, name, seq) in skip:
            continue
        gi = model.coll.get((space, name))
        if gi is None:
            continue
        entered = gi.at(seq)
        if not waiting.keys() <= entered.keys():  # a rank waiting in it entered it (a hostile seq moved it)
            entered = {**entered, **{r: i for r, i in waiting.items() if r not in entered}}
        missing = [r for r in gi.members if r not in entered]
        if (space, name, seq) in short and (space, name, seq) not in long:
            # (only cut short: those stopped with the job were a moment behind)
            missing = [r for r in missing if r in short[(space, name, seq)]]
        if not missing:
            continue
        out.append(_missing(model, gi, seq, entered, waiting, missing, now))
    return out


def _missing(model: TraceModel, gi: GroupIndex, seq: int, entered: dict[int, int], waiting: dict[int, int],
             missing: list[int], now: int) -> Finding:
    r0 = min(waiting)
    s = model.sig_of(r0, waiting[r0])
    # (gathered at once: 16k ranks entered, each rank's columns read alone were ~5 us a rank)
    ranks = np.array(sorted(entered), np.int64)  # (rank order: ``entered`` is in the order ranks were read)
    ops = np.fromiter(map(entered.__getitem__, ranks.tolist()), np.int64, ranks.shape[0])
    t = model.table
    slots = model.slots_of(ranks)
    begin, comp = t.gather(("begin", "comp"), t.block[slots], t.base[slots] + ops)
    ends = np.fromiter((rankstate.waited_until(model, r, now) for r in ranks.tolist()), np.int64, ranks.shape[0]) \
        if model.exits_seen else now
    waited = dict(zip(map(str, ranks.tolist()), map(secs, (np.where(comp != 0, comp, ends) - begin).tolist()),
                      strict=True))
    instead = {}
    for m in missing:
        a = activity(model, m, now)
        if m in model.ranks:
            a["last_seq_in_group"] = _last_seq(gi, m)
        instead[str(m)] = a
    longest = max(waited.values()) if waited else 0.0
    failed = [r for r, i in sorted(entered.items()) if i in model.ranks[r].exc] if model.failed else []
    msg = (f"{s.op} #{seq} of group {gi.name}: {rank_list(entered)} entered and waited "
           f"up to {longest:.1f} s; {rank_list(missing)} never entered: " + doing_instead(missing, instead))
    ev = MissingRanks(entered=sorted(entered), missing=missing, waited_s=waited,
                      op=op_brief(model, r0, waiting[r0], now), missing_activity=instead,
                      failed_on={str(r): model.ranks[r].exc[entered[r]] for r in failed} if failed else ABSENT,
                      src="fr" if gi.space == SPACE_FR else ABSENT)
    return Finding("missing_ranks", gi.name, seq, s.op, list(gi.members), missing, msg, ev, ts=int(begin.min()),
                   victims=dict.fromkeys(waiting, tuple(missing)), instances=(("coll", gi.space, gi.name, seq),))


# ---------------------------------------------------------------------- stragglers
def complete_rows(model: TraceModel, gi: GroupIndex) -> np.ndarray:
    """Row numbers where every member ran the collective and all finished."""
    mat = gi.seqs.rows()
    if mat.shape[0] == 0 or not gi.complete():
        return np.zeros(0, np.int64)
    full = np.nonzero((mat >= 0).all(axis=1))[0]
    if full.shape[0] == 0:
        return full
    comp = gather(model, gi, "comp", full)
    return full[(comp > 0).all(axis=1)]


def _timed_tail(model: TraceModel, gi: GroupIndex) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The last ``STRAGGLER_WINDOW`` rows where every member ran the collective, all finished
    and every latency is known, with their begin and completion times.  Read from the end,
    a window at a time: a long trace's earlier rows are never gathered.

    Instances where a member's completion is only a bound (Flight Recorder on Gloo) or
    missing (dur 0) have no known latency to weigh lateness against: left out."""
    mat = gi.seqs.rows()
    none = np.zeros(0, np.int64)
    if mat.shape[0] == 0 or not gi.complete():
        return none, np.zeros((0, mat.shape[1]), np.int64), np.zeros((0, mat.shape[1]), np.int64)
    full = np.nonzero((mat >= 0).all(axis=1))[0]
    got: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    have, end, step = 0, full.shape[0], 2 * STRAGGLER_WINDOW
    while end > 0 and have < STRAGGLER_WINDOW:
        rows = full[max(0, end - step):end]
        f, b, c = gather_many(model, gi, ("flags", "begin", "comp"), rows)
        keep = (c > 0).all(axis=1) & ~untimed(f, b, c).any(axis=1)
        got.append((rows[keep], b[keep], c[keep]))
        have += int(keep.sum())
        end -= step
        step *= 4
    rows, b, c = (np.concatenate(x[::-1]) for x in zip(*got, strict=True)) if got else (none, none, none)
    return rows[-STRAGGLER_WINDOW:], b[-STRAGGLER_WINDOW:], c[-STRAGGLER_WINDOW:]


def _hosts(model: TraceModel) -> Mapping[int, str]:
    """Each rank's host (its ``meta``), where the job spans several: ranks judged together."""
    hosts = model.hosts()
    return hosts if len(set(hosts.values())) > 1 else {}


def _lateness(model: TraceModel, gi: GroupIndex, rows: np.ndarray, late_by: np.ndarray, share: float,
              lat_med: float, col: int) -> dict[str, Any]:
    """What a straggler finding says of one group: ``late_by`` [row] is how late the culprit
    arrived (``col``: one of its columns, for the ops it ran)."""
    late = float(np.median(late_by))
    return {"group": gi.name, "src": "fr" if gi.space == SPACE_FR else None, "collectives": int(rows.shape[0]),
            "last_share": round(share, 3), "median_lateness_s": secs(late),
            "p90_lateness_s": secs(float(np.percentile(late_by, 90))), "median_latency_s": round(lat_med / 1e9, 6),  # (to the µs: collectives of 40-300 µs said "0.00 ms")
            "first_seq": seq_of_row(gi, int(rows[0])), "last_seq": seq_of_row(gi, int(rows[-1])),
            "ops": sorted({model.sig_of(gi.ranks[col], int(gi.seqs.rows()[row, col])).op
                           for row in rows[-8:].tolist()}),
            "_late": late, "_members": list(gi.members)}


def find_stragglers(model: TraceModel) -> list[Finding]:
    """Ranks that arrive last at most collectives of a group, by more than the collective
    takes, or a few that take turns at it (two slow hosts, alternately last: each judged
    where it is last); and hosts whose ranks do so together (8 slow GPUs of one node: the
    host is nearly always last, whichever of its ranks is), named once, as the host.  A host is
    judged in a group that holds several of its ranks (most of them late, two at least), or
    across groups that hold one each (an HSDP replica group per local rank: two of its
    ranks straggling, each in its own group)."""
    per_rank: dict[int, list[dict[str, Any]]] = {}
    per_host: dict[str, list[dict[str, Any]]] = {}
    hosts = _hosts(model)
    for gi in model.coll.values():
        if len(gi.members) < 2:
            continue
        rows, b, c = _timed_tail(model, gi)
        if rows.shape[0] < STRAGGLER_MIN_ROWS:
            continue
        skew = b - b.min(axis=1, keepdims=True)
        latency = np.maximum(c.max(axis=1) - b.max(axis=1), 0)
        last = b.argmax(axis=1)
        lat_med = float(np.median(latency))
        floor = max(STRAGGLER_FACTOR * lat_med, STRAGGLER_MIN_NS)
        shares = np.bincount(last, minlength=len(gi.ranks)) / rows.shape[0]
        hosted: set[int] = set()  # columns named with their host in this group
        by_host: dict[str, list[int]] = {}
        for col, r in enumerate(gi.ranks):
            if r in hosts:
                by_host.setdefault(hosts[r], []).append(col)
        # candidates: (name, share, stats, host or None); one last alone in most collectives,
        # or several taking turns (judged where each is last)
        cands: list[tuple[str, float, dict[str, Any], str | None]] = []
        for host, cols in by_host.items():
            share = float(shares[cols].sum())
            if len(cols) < 2 or len(cols) == len(gi.ranks) or share < STRAGGLER_TURN_SHARE:
                continue
            when = slice(None) if share >= STRAGGLER_LAST_SHARE else np.isin(last, cols)
            late = [k for k in cols if float(np.median(skew[when, k])) >= floor]
            if len(late) < 2 or 2 * len(late) < len(cols):  # one or two slow ranks: named as ranks
                continue
            host_late = skew[:, late].max(axis=1)  # the host is there once its last rank is
            cands.append((f"host {host}", share, dict(_lateness(model, gi, rows, host_late[when], share, lat_med,
                                                                late[0]), _ranks=[gi.ranks[k] for k in late],
                                                       _cols=late), host))
        for col in np.flatnonzero(shares >= STRAGGLER_TURN_SHARE).tolist():
            if any(col in c[2]["_cols"] for c in cands if c[3] is not None):
                continue
            share = float(shares[col])
            when = slice(None) if share >= STRAGGLER_LAST_SHARE else last == col
            if float(np.median(skew[when, col])) >= floor:
                cands.append((f"rank {gi.ranks[col]}", share, dict(
                    _lateness(model, gi, rows, skew[when, col], share, lat_med, col), _cols=[col]), None))
        turns = [c for c in cands if c[1] < STRAGGLER_LAST_SHARE]
        if not (len(turns) <= STRAGGLER_TURNS and sum(c[1] for c in turns) >= STRAGGLER_LAST_SHARE):
            turns = []
        for name, share, stats, host in cands:
            if share < STRAGGLER_LAST_SHARE and not any(t[0] == name for t in turns):
                continue
            if share < STRAGGLER_LAST_SHARE:
                stats["turns_with"] = [t[0] for t in turns if t[0] != name]
            if host is not None:
                hosted.update(stats["_cols"])
                per_host.setdefault(host, []).append(stats)
            else:
                per_rank.setdefault(gi.ranks[stats["_cols"][0]], []).append(stats)
    for host, ranks in _group_by_host(per_rank, hosts).items():  # one rank of the host per group
        for r in ranks:
            per_host.setdefault(host, []).extend(dict(d, _ranks=[r]) for d in per_rank.pop(r))
    out = []
    for host, stats in per_host.items():
        ranks = sorted({r for d in stats for r in d["_ranks"]})
        top, ev = _worst(stats, host=host, ranks=ranks)
        msg = (f"host {host} (ranks {ranges(ranks)}) arrived last in {top['last_share'] * 100:.0f}% of the "
               f"last {top['collectives']} collectives of group {top['group']}, by a median "
               f"{top['median_lateness_s'] * 1e3:.1f} ms: its ranks are slow together (the collectives themselves "
               f"take a median {duration(top['median_latency_s'] * 1e9)}){_turns(top)}")
        out.append(Finding("straggler", top["group"], top["last_seq"], (top["ops"] or [None])[0], top["_members"],
                           ranks, msg, ev))
    for r, stats in per_rank.items():
        top, ev = _worst(stats)
        msg = (f"rank {r} arrived last in {top['last_share'] * 100:.0f}% of the last {top['collectives']} "
               f"collectives of group {top['group']}, by a median {top['median_lateness_s'] * 1e3:.1f} ms "
               f"(the collectives themselves take a median {duration(top['median_latency_s'] * 1e9)}){_turns(top)}")
        out.append(Finding("straggler", top["group"], top["last_seq"], (top["ops"] or [None])[0], top["_members"],
                           [r], msg, ev))
    return out


def _turns(top: dict[str, Any]) -> str:
    """'; it takes turns with host node02 at being last' for stragglers that alternate."""
    return f"; it takes turns with {', '.join(top['turns_with'])} at being last" if top.get("turns_with") else ""


def _group_by_host(per_rank: dict[int, list[dict[str, Any]]], hosts: Mapping[int, str]) -> dict[str, list[int]]:
    """Straggling ranks that share a host, two or more of them: their host is the straggler."""
    out: dict[str, list[int]] = {}
    for r in per_rank:
        if r in hosts:
            out.setdefault(hosts[r], []).append(r)
    return {h: rs for h, rs in out.items() if len(rs) >= 2}


def _worst(stats: list[dict[str, Any]], host: str | None = None,
           ranks: list[int] | None = None) -> tuple[dict[str, Any], Straggler]:
    """The group a culprit is latest in, and its evidence (its other groups after it); a
    host's (``ranks``: its straggling ranks)."""
    stats.sort(key=lambda d: -d["_late"])

    def public(d: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in d.items() if v is not None and not k.startswith("_")}

    top = stats[0]
    extra: dict[str, Any] = {"host": host, "host_ranks": ranks} if host is not None else {}
    return top, Straggler(**extra, **public(top),
                          other_groups=[public(d) for d in stats[1:]] if len(stats) > 1 else ABSENT)
