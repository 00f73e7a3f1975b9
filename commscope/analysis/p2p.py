"""Point-to-point findings: deadlock cycles and sends/recvs whose peer never posted.

Wait-for graph: a rank blocked (longer than hang_after, or drawn into a hang:
``hangs.drawn_in``) in a send/recv, or in wait() on
an isend/irecv, whose counterpart (same group, src, dst, seq) the peer never posted,
waits for that peer.  A cycle is a deadlock; an edge outside any cycle is unmatched.
Outer varlen ops (send_tensors/recv_tensors) carry their own seq, so their nested inner
traffic never needs matching.
"""

from __future__ import annotations

import re
import weakref
from collections import deque
from collections.abc import Mapping
from itertools import chain
from types import MappingProxyType
from typing import Any, NamedTuple

import numpy as np
from rich.console import RenderableType
from rich.text import Text

from commscope import optable
from commscope.analysis import evidence, rankstate
from commscope.analysis.components import strongly_connected
from commscope.analysis.evidence import Evidence, record
from commscope.analysis.findings import (
    ERROR,
    WARNING,
    Finding,
    activity,
    doing_instead,
    no_such_peer_text,
    op_brief,
    ranks_text,
    secs,
)
from commscope.analysis.indexes import SeqIndex
from commscope.analysis.model import NESTED, P2P, SEND, SPACE_NATIVE, TraceModel
from commscope.analysis.ranks import ranges
from commscope.units import size


@record
class Deadlock(Evidence):
    """p2p_deadlock: the wait-for cycle, one blocked op per rank (its ``stacks`` set at detection)."""

    cycle: list[dict[str, Any]]  # findings.op_brief + blocked_s, in cycle order
    chain: str  # "rank 0 waits recv (recv from 2) at ... → ... → rank 0"

    def render(self, f: Finding) -> list[RenderableType]:
        steps = self.chain.split(" → ")
        t = Text()
        for k, step in enumerate(steps):
            t.append(("   " if k == 0 else " → ") + step + ("\n" if k < len(steps) - 1 else ""), style=evidence.WARN)
        parts: list[RenderableType] = [Text("wait-for cycle", style=f"bold {evidence.GREY}"), t]
        if self.cycle:
            parts.append(evidence.table("blocked", ["rank", "op", "peer", "seq", "blocked"],
                                 [[c.get("rank"), c.get("op"), c.get("peer"), c.get("seq"),
                                   f"{float(c.get('blocked_s', 0)):.1f} s"] for c in self.cycle], set(f.culprits)))
        return parts


@record
class Unmatched(Evidence):
    """unmatched_p2p: the blocked op, the op the peer should post, what the peer does instead."""

    blocked_op: dict[str, Any]  # findings.op_brief + blocked_s
    expected: str  # "send" or "recv"
    peer_activity: dict[str, dict[str, Any]]  # peer -> findings.activity
    #: The peer named, where the job has no such rank (world size known; -1: a group rank out
    #: of range, ``TraceModel.unplaced``): the blocked rank's own mistake, and the root of
    #: what then waits on it (``rootcause``).
    no_such_peer: int = evidence.ABSENT
    #: A send and the recv it pairs with whose sizes differ (``find_p2p_sizes``): rank ->
    #: ``op_brief`` of its side, with its ``bytes``
    sizes: dict[str, dict[str, Any]] = evidence.ABSENT

    def render(self, f: Finding) -> list[RenderableType]:
        if self.sizes:
            return [Text(f"{'sends' if b.get('dir') == 'send' else 'receives into'} {size(b.get('bytes'))}: "
                         f"{evidence.brief(b)}", style=evidence.WARN) for b in self.sizes.values()]
        parts: list[RenderableType] = [Text(f"blocked: {evidence.brief(self.blocked_op)}", style=evidence.WARN)]
        if self.no_such_peer is not evidence.ABSENT:
            parts.append(Text(f"{no_such_peer_text(self.no_such_peer, None)}: nothing can match it",
                              style=evidence.GREY))
        elif self.expected:
            parts.append(Text(f"needs a matching {self.expected} from the peer", style=evidence.GREY))
        peers = evidence.values(self.peer_activity)
        if peers:
            parts.append(evidence.table("the peer instead", ["rank", "doing"],
                                        [[p.get("rank"), p.get("text")] for p in peers],
                                        set(f.culprits)))
        return parts


def _edges(model: TraceModel, now: int, hang_ns: int,
           drawn: Mapping[int, frozenset[int]] = MappingProxyType({})) -> dict[int, list[tuple[int, int]]]:
    """rank -> [(peer it waits for, op index)] for blocked, unmatched p2p ops: blocked
    hang_after or longer, or drawn into a hang (``hangs.drawn_in``)."""
    edges: dict[int, list[tuple[int, int]]] = {}
    now_blocked = rankstate.blocked_ranks(model)
    apart = model.kept_apart  # (a foreign stream's waits are not this run's)
    for r in sorted(_in_p2p(model, now_blocked)):  # (a rank blocked in nothing waits for nobody)
        if r in apart:
            continue
        rt = model.ranks[r]
        p2p = [i for i in now_blocked[r] if model.sigs[int(rt.sig[i])].flags & P2P
               and not model.sigs[int(rt.sig[i])].nested]
        if not p2p or rankstate.left_early(model, r, now):
            continue  # (a rank that is gone no longer waits)
        until = rankstate.waited_until(model, r, now)
        for i in p2p:
            if until - rankstate.blocked_since(model, r, i) < hang_ns and i not in drawn.get(r, ()):
                continue
            edges.setdefault(r, []).extend((p, i) for p in waits_for(model, r, i))
    return edges


def waits_for(model: TraceModel, r: int, i: int) -> list[int]:
    """The ranks rank ``r``'s send or recv ``i`` waits for: its peer where the peer has not
    posted the other side (every other member for an any-source recv; the number it named
    where no such rank is there to place); none where the peer posted it."""
    rt = model.ranks[r]
    s = model.sigs[int(rt.sig[i])]
    peer = int(rt.peer[i])
    if model.unplaced(r, i):  # a group rank the recorder could not place: none there is
        return [peer]
    if peer < 0:  # any-source recv (or a Flight Recorder send naming no peer): every other member could be the other end
        members = model.groups.get(s.group) or model.rank_ids()
        return [m for m in members if m != r]
    if rt.seq[i] < 0:
        return []
    seq = int(rt.seq[i])
    send = bool(s.flags & SEND)
    src, dst = (r, peer) if send else (peer, r)
    a, b = model.p2p_pair(s.group, src, dst, seq, s.space)
    if (b if send else a) is None and not (
            s.space == SPACE_NATIVE and model.p2p_posted_before(s.group, src, dst, seq, send=not send)):
        return [peer]
    return []


def _in_p2p(model: TraceModel, blocked: dict[int, tuple[int, ...]]) -> list[int]:
    """The ranks of ``blocked`` (``rankstate.blocked_ranks``) blocked in a p2p op not nested
    in another, found for all at once: 16k ranks blocked in a collective, asked a rank at a
    time, cost a diagnosis ~2 us each."""
    if not blocked:
        return []
    ranks = np.fromiter(blocked, np.int64, len(blocked))
    counts = np.fromiter(map(len, blocked.values()), np.int64, ranks.shape[0])
    ops = np.fromiter(chain.from_iterable(blocked.values()), np.int64, int(counts.sum()))
    slots = np.repeat(model.slots_of(ranks), counts)
    t = model.table
    (sig,) = t.gather(("sig",), t.block[slots], t.base[slots] + ops)
    p2p = (model.sig_flags(sig) & (P2P | NESTED)) == P2P
    return np.unique(np.repeat(ranks, counts)[p2p]).tolist()


def _step(model: TraceModel, r: int, i: int, now: int) -> dict[str, Any]:
    d = op_brief(model, r, i, now)
    d["blocked_s"] = secs(rankstate.waited_until(model, r, now) - rankstate.blocked_since(model, r, i))
    return d


def _say(model: TraceModel, r: int, i: int) -> str:
    s = model.sig_of(r, i)
    return _said(r, s.op, bool(s.flags & SEND), int(model.ranks[r].peer[i]), s.site)


def _said(r: int, op: str, send: bool, peer: int, site: str | None) -> str:
    what = f"send to {peer if peer >= 0 else '?'}" if send else f"recv from {peer if peer >= 0 else 'any'}"
    return f"rank {r} waits {op} ({what}) at {site or '?'}"


def timed_out(cycle: list[dict[str, Any]], part: list[int]) -> Finding:
    """The p2p_deadlock of ranks ``part`` whose waits their timeouts ended (``rootcause``
    finds them: each failed send or recv blamed on a peer whose own is blamed on the next,
    back to the first), from the failed ops' evidence (``op_brief``), ``cycle`` in cycle
    order.  Live it was a p2p_deadlock; once the timeouts fired, each rank's op_failed named
    the next, an error each (helper-182)."""
    b0 = cycle[0]
    text = " → ".join(_said(b["rank"], b["op"], b.get("dir") == "send", b.get("peer", -1), b.get("site"))
                      for b in cycle) + f" → rank {b0['rank']}"
    ranks = [b["rank"] for b in cycle]
    among = ", ".join(map(str, ranks)) if set(ranks) == set(part) else (
        f"{ranges(part)} ({len(part)} ranks that wait for each other; one cycle of them)")
    steps = [{**{k: v for k, v in b.items() if k not in ("exc", "failure", "failed_ns", "after_s")},
              "blocked_s": b.get("duration_s")} for b in cycle]
    msg = f"p2p deadlock among ranks {among}: {text}; the backend's timeout ended each wait"
    return Finding("p2p_deadlock", b0.get("group"), b0.get("seq"), b0["op"], sorted(part), sorted(part), msg,
                   Deadlock(cycle=steps, chain=text), ts=min(int(b["begin_ns"]) for b in cycle))


def _components(edges: dict[int, list[tuple[int, int]]]) -> list[list[int]]:
    """The strongly connected parts of the wait-for graph that hold a cycle (two ranks or
    more, or a rank that waits for itself), each in rank order, in order of their lowest
    rank (``components.strongly_connected``: linear in the edges; every elementary cycle,
    enumerated, grew factorially: an any-source recv on each rank of a group waits for every
    other, and ``check`` of 16 such ranks never ended)."""
    parts = strongly_connected(sorted(edges), lambda v: [p for p, _ in edges[v] if p in edges])
    return sorted(sorted(part) for part in parts if len(part) > 1 or any(p == part[0] for p, _ in edges[part[0]]))


def _cycle_through(start: int, part: set[int], edges: dict[int, list[tuple[int, int]]]) -> list[tuple[int, int]]:
    """A shortest wait-for cycle from ``start`` back to it within ``part`` (a strongly
    connected part: there is one), as (rank, the op it waits in) from ``start`` on."""
    came: dict[int, tuple[int, int]] = {}  # rank -> (the rank that waits for it, that rank's op)
    frontier = deque([start])
    while frontier:
        node = frontier.popleft()
        for peer, i in edges[node]:
            if peer == start:
                path = [(node, i)]
                while node != start:
                    node, i = came[node]
                    path.append((node, i))
                return path[::-1]
            if peer in part and peer not in came:
                came[peer] = (node, i)
                frontier.append(peer)
    raise AssertionError("no cycle through a rank of a strongly connected part")


def find_p2p(model: TraceModel, now: int, hang_ns: int,
             drawn: Mapping[int, frozenset[int]] = MappingProxyType({})) -> list[Finding]:
    """One p2p_deadlock a set of ranks that wait for each other (its message and evidence
    show a shortest cycle among them), one unmatched_p2p a blocked op outside any."""
    edges = _edges(model, now, hang_ns, drawn)
    out: list[Finding] = _stuck_pairs(model, now, hang_ns)
    if not edges:
        return out
    in_cycle: set[tuple[int, int]] = set()  # (rank, op index)
    for part in _components(edges):
        members = set(part)
        cyc = _cycle_through(part[0], members, edges)
        ranks = [r for r, _ in cyc]
        chain = [_step(model, r, i, now) for r, i in cyc]
        r0, i0 = cyc[0]
        s = model.sig_of(r0, i0)
        text = " → ".join(_say(model, r, i) for r, i in cyc) + f" → rank {r0}"
        among = ", ".join(map(str, ranks)) if set(ranks) == members else (
            f"{ranges(part)} ({len(part)} ranks that wait for each other; one cycle of them)")
        msg = f"p2p deadlock among ranks {among}: {text}"
        ev = Deadlock(cycle=chain, chain=text)
        ev["stacks"] = {str(r): a["stack"] for r in part if (a := activity(model, r, now)).get("stack")}
        held = {(r, i) for r in part for p, i in edges[r] if p in members}  # (an any-source recv: one op)
        out.append(Finding("p2p_deadlock", s.group, int(model.ranks[r0].seq[i0]) if model.ranks[r0].seq[i0] >= 0
                           else None, s.op, part, part, msg, ev,
                           ts=min(rankstate.blocked_since(model, r, i) for r, i in held)))
        in_cycle.update(held)
    world = model.said_world_size
    for r, lst in sorted(edges.items()):
        any_source = [(p, i) for p, i in lst if model.ranks[r].peer[i] < 0 and not model.unplaced(r, i)]
        any_ops = {i for _, i in any_source}  # (a set: an any-source recv waits on every member)
        for peer, i in lst:
            if (r, i) in in_cycle or i in any_ops:
                continue
            if model.unplaced(r, i) or (world is not None and peer >= world):
                out.append(_no_such_peer(model, r, i, peer, world, now))
            else:
                out.append(_unmatched(model, r, i, [peer], now))
        if any_source:
            i = any_source[0][1]
            if (r, i) not in in_cycle:
                out.append(_unmatched(model, r, i, sorted({p for p, _ in any_source}), now, any_source=True))
    return out


#: The slowest a send or recv moves its bytes and is still moving them: one that waited
#: ``hang_after`` and its bytes at this rate more, its peer's side posted, is stuck (a 10 GB
#: transfer waits 100 s more before it is named; a few KiB, none)
SLOW_P2P_BYTES_PER_S = 100e6


def _stuck_pairs(model: TraceModel, now: int, hang_ns: int) -> list[Finding]:
    """unmatched_p2p naming both ranks of a send and a recv that pair up by the order they
    were posted in, each blocked in its side ``hang_after`` or longer (and its bytes'
    worth at ``SLOW_P2P_BYTES_PER_S``): they did not match after all, their tags (not
    recorded) or their sizes differing.  A send with tag 1 and a recv with tag 2 hung until
    the timeout, and the job read healthy, exit 0 (helper-191).  One finding per group and
    pair of call sites: thousands of pipeline stages posting a wrong tag are one mistake."""
    found: dict[tuple, list[tuple[int, int, int, int, int]]] = {}
    now_blocked = rankstate.blocked_ranks(model)
    apart = model.kept_apart
    for r in sorted(_in_p2p(model, now_blocked)):
        rt = model.ranks[r]
        if r in apart or rankstate.left_early(model, r, now):
            continue
        for i in now_blocked[r]:
            s = model.sigs[int(rt.sig[i])]
            peer, seq = int(rt.peer[i]), int(rt.seq[i])
            if not s.flags & SEND or s.nested or peer < 0 or seq < 0 or peer in apart or peer not in now_blocked:
                continue  # (each pair once, from its send)
            if rankstate.waited_until(model, r, now) - rankstate.blocked_since(model, r, i) < hang_ns:
                continue  # (the usual case, first: a send waiting its moment)
            j = model.p2p_pair(s.group, r, peer, seq, s.space)[1]
            if j is None or j not in now_blocked[peer] or rankstate.left_early(model, peer, now):
                continue
            since = max(rankstate.blocked_since(model, r, i), rankstate.blocked_since(model, peer, j))
            allowed = hang_ns + int(max(s.in_bytes, s.out_bytes) / SLOW_P2P_BYTES_PER_S * 1e9)
            if min(rankstate.waited_until(model, r, now), rankstate.waited_until(model, peer, now)) - since < allowed:
                continue
            recv = model.sig_of(peer, j)
            found.setdefault((s.group, s.site, recv.site), []).append((r, i, peer, j, since))
    out: list[Finding] = []
    for (group, sent_at, got_at), pairs in found.items():
        r, i, peer, j, since = pairs[0]
        sent, got = _step(model, r, i, now), _step(model, peer, j, now)
        waited = min(sent["blocked_s"], got["blocked_s"])
        ranks = sorted({x for p in pairs for x in (p[0], p[2])})
        seq = int(model.ranks[r].seq[i])
        more = f"; {len(pairs):,} such pairs, of {ranks_text(ranks)}" if len(pairs) > 1 else ""
        msg = (f"{model.label(r, i)} (rank {r}, at {sent_at or '?'}) and {model.label(peer, j)} (rank {peer}, "
               f"at {got_at or '?'}) pair up by the order they were posted in, but neither completed in "
               f"{waited:.1f} s: they do not match (their tags, not recorded, or sizes differ){more}")
        ev = Unmatched(blocked_op=sent, expected="", peer_activity={str(peer): activity(model, peer, now)})
        out.append(Finding("unmatched_p2p", group, seq, model.sig_of(r, i).op, ranks, ranks, msg, ev,
                           ts=min(p[4] for p in pairs)))
    return out


def find_p2p_sizes(model: TraceModel, now: int) -> list[Finding]:
    """unmatched_p2p naming both ranks of a send and the recv it pairs with by the order they
    were posted in, whose sizes differ: Gloo aborts the receiver of a larger message ("op.
    preamble.length <= op.nbytes. 512 vs 256"), and a smaller one it takes without a word,
    the rest of the buffer left as it was (helper-203: the aborted receiver alone was named,
    as crashed; the smaller message read healthy, exit 0).  Which side is wrong, nothing
    says.  Tags are not recorded, and the recorder does not say whose message an
    any-source recv took: the order is trusted only where it is sure (``_judged``).  One
    finding per group and pair of call sites (a pipeline's stages repeat one mistake)."""
    found: dict[tuple, list[tuple[int, int, int, int]]] = {}
    apart = model.kept_apart
    checked = _CHECKED.setdefault(model, {})
    for (space, group, src, dst), ch in model.p2p.items():
        if space != SPACE_NATIVE or not ch.n or src in apart or dst in apart:
            continue
        wrong, smaller = _differing(model, (space, group, src, dst), ch, checked)
        for severity, pairs in ((ERROR, wrong), (WARNING, smaller)):
            for i, j in pairs:
                key = (severity, group, model.sig_of(src, i).site, model.sig_of(dst, j).site)
                found.setdefault(key, []).append((src, i, dst, j))
    out: list[Finding] = []
    for (severity, group, sent_at, got_at), pairs in found.items():
        r, i, peer, j = pairs[0]
        sends, takes = model.sig_of(r, i).in_bytes, model.sig_of(peer, j).out_bytes
        ranks = sorted({x for p in pairs for x in (p[0], p[2])})
        more = f"; {len(pairs):,} such pairs, of {ranks_text(ranks)}" if len(pairs) > 1 else ""
        then = ("the backend aborts the receiver of a larger message" if sends > takes else
                "the receiver's dtype is another" if severity == ERROR else
                "Gloo takes it without a word: a buffer of the largest size on purpose, or the rest of the buffer "
                "is left as it was (a short message by mistake)")
        msg = (f"{model.label(r, i)} (rank {r}, at {sent_at or '?'}) sends {size(sends)} where "
               f"{model.label(peer, j)} (rank {peer}, at {got_at or '?'}), the recv it pairs with by the order they "
               f"were posted in, takes {size(takes)}: their sizes differ; {then}{more}")
        briefs = {str(r): {**op_brief(model, r, i, now), "bytes": sends},
                  str(peer): {**op_brief(model, peer, j, now), "bytes": takes}}
        ev = Unmatched(blocked_op=briefs[str(r)], expected="", peer_activity={}, sizes=briefs)
        out.append(Finding("unmatched_p2p", group, int(model.ranks[r].seq[i]), model.sig_of(r, i).op, ranks, ranks,
                           msg, ev, ts=max(int(model.ranks[r].begin[i]), int(model.ranks[peer].begin[j])),
                           instances=tuple(("p2p", SPACE_NATIVE, group, a, b, int(model.ranks[a].seq[x]))
                                           for a, x, b, _ in pairs), severity=severity))
    return out


#: model -> (sigs seen, bytes each sig sends, bytes each receives into): made again as sigs come
_SIG_BYTES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: model -> channel -> ``Checked``: what ``find_p2p_sizes`` found of it so far
_CHECKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class Checked(NamedTuple):
    """A channel's rows looked at so far: the first ``rows`` (each with both sides), the seq
    of the last of them (rows inserted before it, a late seq, make it looked at again whole),
    the pairs of those that differ, and the last judgement of them (``_judged``) with what
    it was made of (the rows, the recvs complete, the receiver's exits)."""

    index: SeqIndex
    rows: int
    last_seq: int
    pairs: list[tuple[int, int]]
    judged: tuple[tuple, tuple[list[tuple[int, int]], list[tuple[int, int]]]] | None = None


def _differing(model: TraceModel, key: tuple, ch: SeqIndex, checked: dict[tuple, Checked]
               ) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(send index, recv index) of the channel's pairs whose sizes differ and that nothing
    else explains, as (errors, warnings) (``_judged``).  Rows looked at before are not looked at again (a diagnosis
    of 4,096 pipeline channels cost 54 ms, every row again); the few channels with pairs
    that differ are judged whole each time."""
    _, _, src, dst = key
    was = checked.get(key)
    start = 0
    if was is not None and was.index is ch and was.rows <= ch.n and (
            not was.rows or int(ch.keys[was.rows - 1]) == was.last_seq):
        start = was.rows
    pairs = was.pairs if start else []
    if start < ch.n:
        rows = ch.mat[start: ch.n]
        filled = (rows[:, 0] >= 0) & (rows[:, 1] >= 0)
        done = start + (int(np.argmin(filled)) if not filled.all() else filled.shape[0])  # (a prefix: both sides)
        both = rows[filled]
        if both.shape[0]:
            sent = _bytes(model, src, both[:, 0], send=True)
            taken = _bytes(model, dst, both[:, 1], send=False)
            differ = (sent != taken) & (sent >= 0) & (taken >= 0)
            if differ.any():
                seen = set(pairs)  # (thousands of differing pairs: a list's membership was quadratic, helper-207)
                pairs = pairs + [(i, j) for i, j in both[differ].tolist() if (i, j) not in seen]
        # (a judgement kept where the rows were looked at on: ``made_of`` says whether it stands;
        # a channel with a recv posted before its send rescanned it each time, helper-210)
        was = checked[key] = Checked(ch, done, int(ch.keys[done - 1]) if done else -1, pairs,
                                     was.judged if start and was is not None else None)
    if not pairs:
        return [], []
    # (judged again only where what it is made of changed: a long job whose every message is
    # smaller than its buffer on purpose has every pair a candidate, every diagnosis)
    rt_dst = model.ranks[dst]
    ops = np.fromiter((j for _, j in pairs), np.int64, len(pairs))
    made_of = (ch.n, int((ch.mat[: ch.n] >= 0).sum()), len(pairs), int((rt_dst.comp[ops] != 0).sum()),
               len(rt_dst.exits), len(rt_dst.exc), rankstate.crash(model, dst) is not None,
               _any_source(model, dst, key[1]))  # (an any-source recv is in no channel: helper-210)
    if was.judged is not None and was.judged[0] == made_of:
        return was.judged[1]
    out = _judged(model, key, ch, pairs)
    checked[key] = was._replace(judged=(made_of, out))
    return out


#: Gloo's words aborting the receiver of a message larger than its buffer
ABORTED_LARGER = "op.preamble.length <= op.nbytes"


def _judged(model: TraceModel, key: tuple, ch: SeqIndex, pairs: list[tuple[int, int]]
            ) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Of ``pairs`` (their sizes differ, paired by the order they were posted in), those the
    order is sure of: (mistakes, an error; smaller messages into buffers of their dtype, a
    warning).  Helper-206's real Gloo jobs and helper-209's moments:

    - a recv Gloo aborted for a larger message (``ABORTED_LARGER``: its op's exception or
      its rank's crash in it), the pair whose sizes its words say ("512 vs 256"), else one
      whose message is larger: the order was real (not every pair of the rank's: a healthy
      smaller message beside it was named, helper-209);
    - else, none where the receiver has any-source recvs in the group (the recorder does not
      say whose message such a recv took: the order is off), nor a channel that pairs a
      rank with itself (group ranks the recorder could not place yet);
    - of the rest, a pair whose recv completed (one still waiting may yet take another
      message, by its tag), whose send's size and recv's size are both left over once the
      channel's sends and recvs of equal sizes cancel out (tags pairing them in another
      order: a live check named the first half of such a pair): a larger message, or one of
      another dtype (float32 into a float64 buffer), is a mistake; a smaller one of the
      buffer's dtype Gloo takes, and nothing in the trace tells a buffer of the largest
      size on purpose (a varlen protocol's) from a short microbatch, the rest of its
      buffer left as it was: a warning (as an error it came and went as a live job ran,
      helper-209)."""
    _, _, src, dst = key
    rt_src, rt_dst = model.ranks[src], model.ranks[dst]
    firsts = np.fromiter((i for i, _ in pairs), np.int64, len(pairs))
    seconds = np.fromiter((j for _, j in pairs), np.int64, len(pairs))
    a = _bytes(model, src, firsts, send=True)
    b = _bytes(model, dst, seconds, send=False)
    died = rankstate.crash(model, dst)
    died_of = str(died.get("exc") or "") if died is not None else ""
    aborted = np.zeros(len(pairs), bool)
    for k, j in enumerate(seconds.tolist()):
        text = rt_dst.exc.get(j) or (died_of if not rt_dst.comp[j] else "")
        if ABORTED_LARGER in text:
            said = _ABORT_SIZES.search(text)
            aborted[k] = (int(a[k]), int(b[k])) == (int(said[1]), int(said[2])) if said else bool(a[k] > b[k])
    sure = [p for p, x in zip(pairs, aborted.tolist(), strict=True) if x]
    if src == dst or _any_source(model, dst, model.sig_of(dst, pairs[0][1]).group):
        return sure, []
    rows = ch.mat[: ch.n]
    sent_all = _bytes(model, src, rows[rows[:, 0] >= 0, 0], send=True)
    taken_all = _bytes(model, dst, rows[rows[:, 1] >= 0, 1], send=False)
    left_sent, left_taken = _left_over(sent_all, taken_all), _left_over(taken_all, sent_all)
    keep = ~aborted & (rt_dst.comp[seconds] != 0) & np.isin(a, left_sent) & np.isin(b, left_taken)
    if not keep.any():
        return sure, []
    kept = [p for p, x in zip(pairs, keep.tolist(), strict=True) if x]
    other = np.fromiter((model.sigs[int(x)].in_dtypes != model.sigs[int(y)].out_dtypes
                         for x, y in zip(rt_src.sig[firsts[keep]].tolist(), rt_dst.sig[seconds[keep]].tolist(),
                                         strict=True)), bool, len(kept))
    wrong = ((a[keep] > b[keep]) | other).tolist()
    return sure + [p for p, x in zip(kept, wrong, strict=True) if x], [p for p, x in zip(kept, wrong, strict=True) if not x]


#: the sizes in Gloo's words aborting a receiver ("... 512 vs 256": sent, then the buffer's)
_ABORT_SIZES = re.compile(r"op\.nbytes\.\s*(\d+)\s+vs\s+(\d+)")


def _left_over(these: np.ndarray, those: np.ndarray) -> np.ndarray:
    """The sizes of ``these`` left once ``those`` of equal sizes cancel them out."""
    sizes, n = np.unique(these, return_counts=True)
    theirs, m = np.unique(those, return_counts=True)
    cancel = np.zeros(sizes.shape[0], np.int64)
    if theirs.shape[0]:
        at = np.minimum(np.searchsorted(theirs, sizes), theirs.shape[0] - 1)
        cancel = np.where(theirs[at] == sizes, m[at], 0)
    return sizes[n > cancel]


#: model -> rank -> (its ops looked at, the groups it posted an any-source recv in)
_ANY_SOURCE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _any_source(model: TraceModel, rank: int, group: str) -> bool:
    """Whether ``rank`` posted an any-source recv in ``group`` (its peer not recorded); its
    new ops looked at only (asked every diagnosis of a channel with pairs that differ)."""
    rt = model.ranks[rank]
    seen = _ANY_SOURCE.setdefault(model, {})
    start, groups = seen.get(rank, (0, frozenset()))
    if rt.n < start:  # (its ops made again: a model that read a window afresh)
        start, groups = 0, frozenset()
    if rt.n > start:
        codes = np.unique(rt.sig[start: rt.n][rt.peer[start: rt.n] < 0]).tolist()
        groups = groups | {s.group for c in codes if (s := model.sigs[c]).flags & P2P and not s.flags & SEND}
        seen[rank] = (rt.n, groups)
    return group in groups


def _bytes(model: TraceModel, rank: int, ops: np.ndarray, send: bool) -> np.ndarray:
    """The bytes each of ``ops`` of ``rank`` sends (``send``) or receives into (-1 where
    its sig says no tensor, a refused op's, a Flight Recorder's; or is a varlen toolkit's,
    whose recv sizes itself by what comes)."""
    n = len(model.sigs)
    got = _SIG_BYTES.get(model)
    if got is None or got[0] != n:
        said = [bool(s.in_shapes or s.out_shapes) and (s.op in optable.SENDS or s.op in optable.RECVS)
                for s in model.sigs]
        got = _SIG_BYTES[model] = (
            n, np.fromiter((s.in_bytes if k else -1 for s, k in zip(model.sigs, said, strict=True)), np.int64, n),
            np.fromiter((s.out_bytes if k else -1 for s, k in zip(model.sigs, said, strict=True)), np.int64, n))
    return (got[1] if send else got[2])[model.ranks[rank].sig[ops]]


def _unmatched(model: TraceModel, r: int, i: int, peers: list[int], now: int, any_source: bool = False) -> Finding:
    s = model.sig_of(r, i)
    rt = model.ranks[r]
    seq = int(rt.seq[i]) if rt.seq[i] >= 0 else None
    acts = {str(p): activity(model, p, now) for p in peers}
    counterpart = "recv" if s.flags & SEND else "send"
    step = _step(model, r, i, now)
    msg = (f"{_say(model, r, i)} (#{seq if seq is not None else '?'} of group {s.group}) for "
           f"{step['blocked_s']:.1f} s; the matching {counterpart} was never posted: " + doing_instead(peers, acts))
    ev = Unmatched(blocked_op=step, expected=counterpart, peer_activity=acts)
    return Finding("unmatched_p2p", s.group, seq, s.op, sorted({r, *peers}), peers, msg, ev,
                   ts=rankstate.blocked_since(model, r, i), victims={r: tuple(peers)},
                   any_of=frozenset((r,)) if any_source else frozenset())


def _no_such_peer(model: TraceModel, r: int, i: int, peer: int, world: int | None, now: int) -> Finding:
    """unmatched_p2p on a rank that sends to (or receives from) a rank the job does not
    have: its own mistake (Gloo waits for that rank's connection until the timeout, or
    crashes), never the rank's it names.  ``peer`` -1: a group rank past its group's size
    (``group_dst=99``), which the recorder could not place."""
    s = model.sig_of(r, i)
    rt = model.ranks[r]
    seq = int(rt.seq[i]) if rt.seq[i] >= 0 else None
    counterpart = "recv" if s.flags & SEND else "send"
    step = _step(model, r, i, now)
    msg = (f"{_say(model, r, i)} (#{seq if seq is not None else '?'} of group {s.group}) for "
           f"{step['blocked_s']:.1f} s; " + no_such_peer_text(peer, world) + f": no {counterpart} can ever match it")
    ev = Unmatched(blocked_op=step, expected=counterpart, peer_activity={}, no_such_peer=peer)
    return Finding("unmatched_p2p", s.group, seq, s.op, [r], [r], msg, ev, ts=rankstate.blocked_since(model, r, i))
