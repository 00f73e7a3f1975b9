"""The Redis store's key layout, in one place: every key commscope reads or writes.

Layout (``J`` is the job id, ``N`` the global rank, ``S`` the stream's shard, ``N % 256``)::

    commscope:jobs              sorted set: job ids scored by registration time (µs); the
                                newest is what a reader without ?job= opens (like LATEST)
    commscope:{J}:meta          job metadata, JSON (rank 0 writes it; others only if missing)
    commscope:{J}:ranks         set of the streams: "N" for rank N, "N+I" for its incarnation I
    commscope:{J}:ends          hash: a stream's member -> the entries its writer had stored
                                when it closed (a tail its master lost afterwards is counted),
                                and field "#v", bumped after each (a follower reads a copy only
                                when it changed); copies in slots of their own, {J/e1} .. {J/e3}
    commscope:{J/S}:rank:N      stream of rank N: entry ``0-K`` holds the K-th event (K = 1,
                                2, ...) of that rank in field ``e``, one JSON event per entry
    commscope:{J/S}:rank:N+I    the same rank's incarnation I (its process group initialised
                                again in one process)
    commscope:{J/S}:marks:N     where a window may start rank N's stream, and what the rank
                                was in there (``store/redis_marks.py``)
    commscope:{J/S}:frames:N    the same, every few seconds of the rank's stream, the newest
                                ~17 minutes of them (keyframes: ``store/redis_marks.py``)
    commscope:{J/S}:via:N       on a cluster: "host:port" of the master the writer of rank N's
                                stream last appended through (a reader finds a master that
                                failed over since, before the writer says what it lost)

The braces are Redis Cluster hash tags: a job's metadata and set of streams share a slot,
and its streams are spread over 256 shards, each a slot of its own, so a cluster spreads a
large job over its masters while a reader still reads a whole shard with one XREAD
(``store/cluster.py`` routes each command to its node; one Redis is a cluster of one).
Jobs written before the hash tags (``commscope:J:meta``, ``commscope:J:rank:N``) are still
read (``LegacyKeys``).
"""

from __future__ import annotations

import re

from commscope.store.base import Stream

#: A member as ``Keys.member`` spells it: a rank (8 digits at most, no leading zero), and an
#: incarnation after "+" (6 at most, not 0)
_MEMBER = re.compile(r"(0|[1-9][0-9]{0,7})(?:\+([1-9][0-9]{0,5}))?")


class Keys:
    """The key layout (module docstring), in one place: every key commscope reads or
    writes, and every stream member, is made (and a member read back) here."""

    PREFIX = "commscope"
    #: sorted set of the job ids, scored by registration time (µs)
    JOBS = f"{PREFIX}:jobs"
    #: a pattern matching every key commscope writes (KEYS, SCAN)
    ALL = f"{PREFIX}:*"
    #: shards of a job's streams: each its own hash slot (so a cluster spreads them), each
    #: read with one XREAD (so a poll costs at most this many commands)
    SHARDS = 256

    #: how a job's own keys, and the keys of a shard of its streams, begin: hash tags
    JOB = PREFIX + ":{{{job}}}"
    SHARD = PREFIX + ":{{{job}/{shard}}}"

    @classmethod
    def meta(cls, job: str) -> str:
        """The job's metadata (JSON)."""
        return cls.JOB.format(job=job) + ":meta"

    @classmethod
    def ranks(cls, job: str) -> str:
        """The set of the job's stream members (``member``)."""
        return cls.JOB.format(job=job) + ":ranks"

    #: copies of ``ends``, each in a slot of its own: a writer says its end in those served
    #: by another master than its stream's (``ends``)
    ENDS = 4
    #: the field of an ``ends`` copy that its writers bump after saying their end (no member
    #: spells it: ``parse_member``)
    ENDS_VERSION = "#v"

    @classmethod
    def ends(cls, job: str, i: int = 0) -> str:
        """Hash ``i`` (of ``ENDS``): stream member -> the entries its writer had stored when it
        closed.  Each copy is in a slot of its own (the first the job's), so on a cluster a
        writer finds one on another master than its stream's, and a stream's tail that its
        master lost after the writer closed (a failover before the replica had it) is still
        counted: nothing else would show it."""
        return cls.JOB.format(job=job) + ":ends" if i == 0 else cls.SHARD.format(job=job, shard=f"e{i}") + ":ends"

    @staticmethod
    def member(rank: int, incarnation: int = 0) -> str:
        """A stream's member in ``ranks(job)``: "3", or "3+1" for an incarnation."""
        return f"{rank}+{incarnation}" if incarnation else str(rank)

    @staticmethod
    def parse_member(name: bytes | str) -> Stream | None:
        """(rank, incarnation) of a ``member``, as ``member`` spells it; None for anything else:
        "03", "3+0" and "٣" (a digit ``isdigit`` takes) were rank 3 too, its stream listed twice,
        and "²" raised in ``int``."""
        text = name.decode("utf-8", "replace") if isinstance(name, bytes) else name
        m = _MEMBER.fullmatch(text)
        return None if m is None else (int(m.group(1)), int(m.group(2) or 0))

    @classmethod
    def stream(cls, job: str, rank: int, incarnation: int = 0) -> str:
        """The stream of one rank (incarnation) of the job, in its rank's shard."""
        return cls.SHARD.format(job=job, shard=rank % cls.SHARDS) + f":rank:{cls.member(rank, incarnation)}"

    @classmethod
    def marks(cls, job: str, rank: int, incarnation: int = 0) -> str:
        """The marks of one rank's stream (``store/redis_marks.py``), in its slot."""
        return cls.SHARD.format(job=job, shard=rank % cls.SHARDS) + f":marks:{cls.member(rank, incarnation)}"

    @classmethod
    def frames(cls, job: str, rank: int, incarnation: int = 0) -> str:
        """The keyframes of one rank's stream (``store/redis_marks.py``), in its slot."""
        return cls.SHARD.format(job=job, shard=rank % cls.SHARDS) + f":frames:{cls.member(rank, incarnation)}"

    @classmethod
    def via(cls, job: str, rank: int, incarnation: int = 0) -> str:
        """The master a stream's writer last appended through, on a cluster ("host:port"), in
        the stream's slot: replicated with it, so a replica that took over holds the old
        master's address until the writer appends through it."""
        return cls.SHARD.format(job=job, shard=rank % cls.SHARDS) + f":via:{cls.member(rank, incarnation)}"


class LegacyKeys(Keys):
    """The layout before hash tags (``commscope:J:meta``, ``commscope:J:rank:N``): what
    readers find in a job an earlier commscope wrote.  Never written."""

    JOB = SHARD = Keys.PREFIX + ":{job}"


def entry_number(entry_id: bytes) -> int:
    """K of a commscope entry id ``0-K``; -1 for an id commscope did not write (one past
    ``MAX_ENTRY`` too: a foreign entry 0-18446744073709551615 was read as 1.8e19 events lost)."""
    if entry_id[:2] == b"0-":
        try:
            k = int(entry_id[2:])
        except ValueError:
            return -1
        return k if k <= MAX_ENTRY else -1
    return -1


#: The highest entry number a rank's writer reaches (2^53 events: never), so past it no id is ours
MAX_ENTRY = 1 << 53
