"""The keeper of a Redis job's keyframes: one child process a writing process and job.

A Redis stream's keyframes (``store/redis_marks.py``: marks every few seconds, in
``commscope:{J/S}:frames:N``) are taken by a child of the writing process at the lowest
priority (``children.Keeper``; LTTng's consumer daemon, as the directory store's keeper of
keyframes, ``store/keyframes.py``), never by the training process.  One a process, not a
stream: a process writing many ranks (``bench scale``) starts one child, not thousands.
It reads the store's URL (which may hold a password: never on a command line) and the
cluster nodes the writer knew on its first two lines of standard input, then a stream's
``RANK INCARNATION`` a line, as each writer names its stream, and ends when its input
ends (the last writer of the process closed, or the process died).  It holds a connection
where Redis has room for the job's writers and keepers and clients to spare (``holds``:
``maxclients`` as Redis says it, on the job's busiest master); otherwise, once Redis
refused it a connection as full, or once its clients passed 15/16 of ``maxclients`` (other
jobs, consoles: ``crowded``), it connects for each pass over its streams and closes after
it: the job's clients are then its ranks' writers, not twice them, at the cost of a
connection a pass (~0.1 ms of Redis's CPU), and a console or a rank starting again still
finds a free one.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import BinaryIO

from commscope.store import children, redis_marks
from commscope.store.base import StoreError, Stream
from commscope.store.cluster import Clients, Nodes
from commscope.store.redis_keys import Keys
from commscope.store.redis_url import parse_url
from commscope.store.resp import ReplyError
from commscope.store.segments import MAX_RANK

#: A stream whose keyframe failed otherwise than as Redis does (a bug, a carry that cannot be
#: replayed) is looked at again this many periods later, the others going on meanwhile
FAILED_WAIT = 30

#: The share of a Redis's ``maxclients`` a job leaves spare (``room``): consoles, the
#: children taking marks, a rank starting again, other jobs.  Redis's default 10,000 then
#: takes the writers and keepers of 4,375 ranks a master.  Past that the keepers connect for
#: each pass: ~8,000 connects a second at 16k ranks over the masters (a master's CPU 0.12 ms
#: each with a password, 0.09 ms without), where holding would pass maxclients.
SPARE = 1 / 8

#: A keeper holding its connection asks Redis how many clients it has every this many
#: periods, and lets go where they passed ``CROWDED`` of ``maxclients`` (``crowded``)
LOOK_PERIODS = 30

#: The share of ``maxclients`` past which a keeper lets go (``crowded``): half the spare
#: taken by others (a job at the edge of ``holds`` with a console or two keeps holding)
CROWDED = 1 - SPARE / 2


def room(ranks: int, maxclients: int, each: int = 1) -> bool:
    """Whether ``ranks`` ranks of a job on one master (``busiest``), holding ``each``
    connections a rank, leave ``SPARE`` of its ``maxclients`` free: 2, their writers and
    keepers (``holds``); 1, their writers alone (a writer warns at open where they do not)."""
    return each * ranks <= maxclients * (1 - SPARE)


def holds(ranks: int, maxclients: int) -> bool:
    """Whether the keepers of a job whose busiest master serves ``ranks`` ranks may each hold
    a connection."""
    return room(ranks, maxclients, 2)


def crowded(clients: Clients) -> bool:
    """Whether a node's clients (of every job, consoles) passed ``CROWDED`` of its
    ``maxclients``."""
    return clients.connected is not None and clients.connected > clients.most * CROWDED


def busiest(nodes: Nodes, job: str, world: int) -> int | None:
    """The ranks of ``job`` (``world`` of them) on its busiest master: a rank's stream sits in
    one of ``Keys.SHARDS`` hash slots (its rank modulo), which split unevenly over a
    cluster's masters (helper-161: 4,564 of 13,125 ranks on one of three, not 4,375).
    None where the slot map is learnt from redirections (an ACL user without CLUSTER)."""
    if nodes.learning:
        return None
    if not nodes.cluster:
        return world
    on: Counter[tuple[str, int]] = Counter()
    for shard in range(min(world, Keys.SHARDS)):
        on[nodes.node(Keys.stream(job, shard))] += world // Keys.SHARDS + (shard < world % Keys.SHARDS)
    return max(on.values(), default=world)


def full(exc: Exception) -> bool:
    """Whether Redis refused a connection as it holds ``maxclients`` already (it says so to a
    new client, then closes it; ``Connection.connect`` quotes it)."""
    return "max number of clients" in str(exc)  # (a cluster node: "... + cluster connections reached")


_WRONG_TYPE = re.compile(r"(?:^|: )WRONGTYPE ")


def wrong_type(exc: Exception) -> bool:
    """Whether Redis said a key is not of the type a command wanted: "WRONGTYPE ..." (Redis 7,
    a script's error as the command's), or "ERR Error running script (...): @user_script:1:
    WRONGTYPE ..." (Redis 6 wraps it; helper-156: the keeper retried such a key each period)."""
    return _WRONG_TYPE.search(str(exc)) is not None


def keep(url: str, job: str, commands: BinaryIO, every_s: float, known: Sequence[tuple[str, int]] = (),
         now: Callable[[], float] = time.monotonic, world: int = 1, hold: bool | None = None) -> int:
    """The keeper's loop: follow the streams the writers name on ``commands`` (``follow``) and
    take each one's next keyframe every ``every_s`` (``redis_marks.frame``), until
    ``commands`` ends.  Redis away: every stream tried again half a period later; refusing
    (out of memory, a cluster failing over, a read-only replica): the stream tried again a
    period later.  A key that is not a stream (WRONGTYPE) is no longer followed.  ``hold``:
    whether a connection is held between passes; None: as ``holds`` says for a job of
    ``world`` ranks at the first connect; never once Redis refused one as full or was
    ``crowded``."""
    target = parse_url(url)
    nodes = Nodes(target, target.display())
    nodes.know(known)
    followed: dict[Stream, redis_marks.Framed] = {}
    sent = children.Commands(commands)
    idle = children.Idle(now)
    up = False  # (the slot map read: connections are made as the streams' nodes are asked)
    looked = 0.0  # (when Redis's clients were last asked)
    try:
        while True:
            lines = sent.wait(every_s / 2)
            if lines is None or not lines and idle.over():  # (a command come meanwhile is taken first)
                return 0
            ended = False
            for line in lines:
                gone = children.ended(line)
                if gone is not None:  # (its writer closed: the process's next may name another)
                    ended = followed.pop(gone, None) is not None or ended
                    continue
                stream = named(line)
                if stream is not None and stream not in followed:
                    followed[stream] = redis_marks.Framed(job, stream)
            idle.note(len(followed), ended)
            t = now()
            took = False
            for stream, f in list(followed.items()):
                if t < f.due:
                    continue
                took = True
                try:
                    if not up:
                        nodes.connect()
                        up = True
                    if hold is None:  # (its stream's master: the one it would hold)
                        seen, ranks = nodes.clients(f.key), busiest(nodes, job, world)
                        # (the job's spread unknown: Redis's clients and refusals alone say)
                        hold, looked = (ranks is None or holds(ranks, seen.most)) and not crowded(seen), t
                    elif hold and t >= looked + LOOK_PERIODS * every_s:  # (other jobs, consoles, since)
                        hold, looked = not crowded(nodes.clients(f.key)), t
                    redis_marks.frame(nodes, f)
                except ReplyError as exc:
                    if wrong_type(exc):
                        del followed[stream]
                    else:  # (refused for now: this stream again a period later, the others meanwhile)
                        f.due = t + every_s
                    continue
                except (OSError, StoreError) as exc:
                    if full(exc):  # (holding, it would take a connection a writer or a console needs)
                        hold = False
                    nodes.reset()
                    up = False
                    break  # (Redis away or full: every stream again a step later)
                except Exception:  # (this stream's: the others go on)
                    f.due = t + FAILED_WAIT * every_s
                    continue
                f.due = t + every_s
            if took and up and not hold:
                # (a wide job's keeper beside its rank's writer would double the job's clients:
                # past maxclients; the slot map is kept, each pass connects to the nodes it asks)
                nodes.reset()
            elif took and up and nodes.cluster:  # (the URL's node, asked for the map, among them)
                nodes.keep_only(*(f.key for f in followed.values()))
    finally:
        nodes.close()


def named(line: bytes) -> Stream | None:
    """A writer's command line as ``follow`` writes it; None for anything else."""
    try:
        rank, inc = line.split()
        stream = (int(rank), int(inc))
    except ValueError:
        return None
    return stream if line == b"%d %d" % stream and stream[0] <= MAX_RANK and Keys.parse_member(Keys.member(*stream)) else None


def keeper(url: str, job: str, every_s: float, known: Sequence[tuple[str, int]] = (), world: int = 1
           ) -> children.Keeper:
    """The writing process's keeper of ``job``'s keyframes in the store at ``url`` (``keep`` in a
    child), told the URL and the cluster nodes the writer knows (not part of what makes it
    this process's one: writers that learnt other nodes share it), and the job's ``world``
    size (whether it holds a connection: ``holds``)."""
    nodes = " ".join(f"{h}:{p}" for h, p in sorted(known)[:64])
    return children.Keeper.of("commscope.store.redis_keeper", job, repr(every_s), str(world), secret=url.encode(),
                              preamble=f"{url}\n{nodes}\n".encode())


def follow(keeper: children.Keeper, stream: Stream) -> None:
    """Keyframes for ``stream`` from now on."""
    keeper.follow(stream, f"{stream[0]} {stream[1]}\n".encode())


def main(argv: list[str]) -> int:
    # (a writer of before ``holds`` said "hold" or "close", and before that nothing: it held)
    world = {"hold": 1, "close": None}.get(argv[2], argv[2]) if len(argv) == 3 else 1
    if len(argv) not in (2, 3) or not (world is None or str(world).isascii() and str(world).isdigit()
                                       and int(world) > 0):
        print("usage: python -m commscope.store.redis_keeper JOB EVERY_S WORLD_SIZE  (on standard input: the "
              "store URL, the nodes known, then the streams)", file=sys.stderr)
        return 2
    head = b""
    while head.count(b"\n") < 2:
        got = os.read(0, 1)  # (byte by byte: what follows is the loop's, read from the same fd)
        if not got:
            return 0
        head += got
    url, nodes = head.decode().split("\n")[:2]
    known = [a for a in map(redis_marks.address, nodes.split()) if a]
    with contextlib.suppress(KeyboardInterrupt, BrokenPipeError):
        return keep(url.strip(), argv[0], sys.stdin.buffer, float(argv[1]), known,
                    world=int(world or 1), hold=False if world is None else None)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
