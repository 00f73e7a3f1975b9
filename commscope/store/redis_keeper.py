"""The keeper of a Redis job's keyframes: one child process a writing process and job.

A Redis stream's keyframes (``store/redis_marks.py``: marks every few seconds, in
``commscope:{J/S}:frames:N``) are taken by a child of the writing process at the lowest
priority (``children.Keeper``; LTTng's consumer daemon, as the directory store's keeper of
keyframes, ``store/keyframes.py``), never by the training process.  One a process, not a
stream: a process writing many ranks (``bench scale``) starts one child, not thousands.
It reads the store's URL (which may hold a password: never on a command line) and the
cluster nodes the writer knew on its first two lines of standard input, then a stream's
``RANK INCARNATION`` a line, as each writer names its stream, and ends when its input
ends (the last writer of the process closed, or the process died).  It connects for each
pass over its streams and closes after it: a job's clients are its ranks' writers, not
twice them.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from typing import BinaryIO

from commscope.store import children, redis_marks
from commscope.store.base import StoreError, Stream
from commscope.store.cluster import Nodes
from commscope.store.redis_keys import Keys
from commscope.store.redis_url import parse_url
from commscope.store.resp import ReplyError
from commscope.store.segments import MAX_RANK

#: A stream whose keyframe failed otherwise than as Redis does (a bug, a carry that cannot be
#: replayed) is looked at again this many periods later, the others going on meanwhile
FAILED_WAIT = 30


_WRONG_TYPE = re.compile(r"(?:^|: )WRONGTYPE ")


def wrong_type(exc: Exception) -> bool:
    """Whether Redis said a key is not of the type a command wanted: "WRONGTYPE ..." (Redis 7,
    a script's error as the command's), or "ERR Error running script (...): @user_script:1:
    WRONGTYPE ..." (Redis 6 wraps it; helper-156: the keeper retried such a key each period)."""
    return _WRONG_TYPE.search(str(exc)) is not None


def keep(url: str, job: str, commands: BinaryIO, every_s: float, known: Sequence[tuple[str, int]] = (),
         now: Callable[[], float] = time.monotonic) -> int:
    """The keeper's loop: follow the streams the writers name on ``commands`` (``follow``) and
    take each one's next keyframe every ``every_s`` (``redis_marks.frame``), until
    ``commands`` ends.  Redis away: every stream tried again half a period later; refusing
    (out of memory, a cluster failing over, a read-only replica): the stream tried again a
    period later.  A key that is not a stream (WRONGTYPE) is no longer followed."""
    target = parse_url(url)
    nodes = Nodes(target, target.display())
    nodes.know(known)
    followed: dict[Stream, redis_marks.Framed] = {}
    sent = children.Commands(commands)
    up = False
    try:
        while True:
            lines = sent.wait(every_s / 2)
            if lines is None:
                return 0
            for line in lines:
                stream = named(line)
                if stream is not None and stream not in followed:
                    followed[stream] = redis_marks.Framed(job, stream)
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
                    redis_marks.frame(nodes, f)
                except ReplyError as exc:
                    if wrong_type(exc):
                        del followed[stream]
                    else:  # (refused for now: this stream again a period later, the others meanwhile)
                        f.due = t + every_s
                    continue
                except (OSError, StoreError):
                    nodes.reset()
                    up = False
                    break  # (Redis away: every stream again a step later)
                except Exception:  # (this stream's: the others go on)
                    f.due = t + FAILED_WAIT * every_s
                    continue
                f.due = t + every_s
            if took:
                # (no connection held between passes: a rank's keeper beside its writer's would
                # double a job's clients, and 5,000 ranks would pass one Redis's maxclients;
                # the slot map is kept, each pass connects again to its streams' nodes)
                nodes.reset()
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


def keeper(url: str, job: str, every_s: float, known: Sequence[tuple[str, int]] = ()) -> children.Keeper:
    """The writing process's keeper of ``job``'s keyframes in the store at ``url`` (``keep`` in a
    child), told the URL and the cluster nodes the writer knows (not part of what makes it
    this process's one: writers that learnt other nodes share it)."""
    nodes = " ".join(f"{h}:{p}" for h, p in sorted(known)[:64])
    return children.Keeper.of("commscope.store.redis_keeper", job, repr(every_s), secret=url.encode(),
                              preamble=f"{url}\n{nodes}\n".encode())


def follow(keeper: children.Keeper, stream: Stream) -> None:
    """Keyframes for ``stream`` from now on."""
    keeper.follow(stream, f"{stream[0]} {stream[1]}\n".encode())


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m commscope.store.redis_keeper JOB EVERY_S  (on standard input: the store URL, "
              "the nodes known, then the streams)", file=sys.stderr)
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
        return keep(url.strip(), argv[0], sys.stdin.buffer, float(argv[1]), known)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
