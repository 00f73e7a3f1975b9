"""The Redis Streams store: one stream per rank, for jobs without a shared filesystem.

The key layout is ``store/redis_keys.py``'s (one stream per rank, spread over hash-tagged
shards; marks beside each stream for windows: ``store/redis_marks.py``).

No duplicates, no reordering.  Each writer numbers its entries itself (``0-1``, ``0-2``
...) instead of letting Redis stamp them, and appends a batch with one Lua script, which
Redis runs atomically and which refuses to start below the stream's top entry.  So a
batch lands whole or not at all, an entry can never be stored twice, and after a lost
connection the writer learns exactly what landed by reading the stream's top ID.  The
recorder's ``written`` count stays exact; when the answer cannot be had (Redis still
down) the writer remembers the batch in flight and settles it on the next write, by
content, so events the recorder re-sends are stored once.  Readers see ``0-K`` numbers,
so a gap (``maxlen`` trimming, or data a Redis without persistence lost) is counted and
reported rather than silently skipped.  A writer that finds what it had stored gone states the
loss (a ``store_lost`` marker), then what its rank was in, as a mark's carry says it
(``RedisWriter._restated``): a hang that began before the loss is still found.

Every key and stream member is made (and a member read back) by ``Keys``, the one copy
of this layout.  The RESP client is ``commscope.store.resp`` (why not redis-py: see there).
"""

from __future__ import annotations

import dataclasses
import math
import subprocess
import time
from collections import deque
from typing import Any, NamedTuple

import orjson

from commscope import events
from commscope.events import Event, gc_paused
from commscope.redact import redact
from commscope.schema import decode_job
from commscope.store import children, inflight, keyframes, redis_keeper, redis_marks
from commscope.store.base import (
    ReadStats,
    Size,
    StoreError,
    Stream,
    TraceReader,
    is_job_name,
    is_store_lost,
    meta_line,
    store_lost,
)
from commscope.store.cluster import Address, Nodes, keyslot
from commscope.store.redis_keys import Keys, LegacyKeys, entry_number
from commscope.store.redis_url import MAX_WRITE_EVERY, RedisTarget, parse_url, scrub
from commscope.store.resp import Connection, RedisAuthError, RedisTLSRefused, ReplyError, pack
from commscope.units import size
from commscope.window import Since

# ---------------------------------------------------------------------------- writer
#: KEYS[1] the rank's stream; ARGV[1] the first entry number K; ARGV[2] maxlen (0: none);
#: ARGV[3] the lowest top the stream may have (K-1, or 0 to accept any); ARGV[4..] events.
#: Returns {appended, top id}.  Appends nothing when the stream's top is already at or past K
#: (that part of the batch landed before, or someone else writes this stream): the caller
#: settles what landed instead of guessing.  Appends nothing either, and returns -1, when the
#: stream's top is below ARGV[3]: what had landed is gone although the connection stayed up
#: (FLUSHDB, DEL, eviction; trimming only ever takes the oldest entries), which the caller
#: states as lost, as after a restart.
APPEND_SCRIPT = b"""
local key = KEYS[1]
local seq = tonumber(ARGV[1])
local floor = tonumber(ARGV[3])
local top = redis.call('XREVRANGE', key, '+', '-', 'COUNT', 1)[1]
if top then
  local ms, k = string.match(top[1], '^(%d+)-(%d+)$')
  if ms ~= '0' or tonumber(k) >= seq then
    return {0, top[1]}
  end
  if tonumber(k) < floor then
    return {-1, top[1]}
  end
elseif floor > 0 then
  return {-1, '0-0'}
end
local n = #ARGV
local maxlen = ARGV[2]
if maxlen == '0' then
  for i = 4, n do
    redis.call('XADD', key, '0-' .. string.format('%d', seq), 'e', ARGV[i])
    seq = seq + 1
  end
else
  for i = 4, n do
    redis.call('XADD', key, 'MAXLEN', '~', maxlen, '0-' .. string.format('%d', seq), 'e', ARGV[i])
    seq = seq + 1
  end
end
return {n - 3, '0-' .. string.format('%d', seq - 1)}
"""


def _pack_append(key: bytes, first: int, maxlen: int, lines: list[bytes], floor: int | None = None) -> bytes:
    """EVAL APPEND_SCRIPT 1 key first maxlen floor line...: packed by hand, the hot part of writing.
    ``floor``: the lowest top the stream may have (default ``first - 1``: nothing vanished)."""
    head = [b"*%d\r\n$4\r\nEVAL\r\n$%d\r\n%s\r\n$1\r\n1\r\n" % (len(lines) + 7, len(APPEND_SCRIPT), APPEND_SCRIPT)]
    for a in (key, b"%d" % first, b"%d" % maxlen, b"%d" % (first - 1 if floor is None else floor)):
        head.append(b"$%d\r\n%s\r\n" % (len(a), a))
    body = [b"$%d\r\n%s\r\n" % (len(line), line) for line in lines]
    return b"".join(head + body)


#: What a writer keeps to restate the ops its rank has in flight once Redis lost its stream
#: (``RedisWriter._restated``): the lines written after the newest mark it knows, at most this
#: many bytes (a mark is taken every ``MARK_BYTES`` written at most: past this, the marker
#: child fell behind, and a loss before its next mark restates nothing)
KEEP_BYTES = 2 * redis_marks.MARK_BYTES


class RedisWriter:
    """Appends one rank's events to its stream; owned by that rank's recorder thread.

    Opening connects, logs in and refuses a job whose stream for this rank already
    exists.  ``write`` reconnects by itself after a dropped connection, so the recorder
    simply calls it again after a StoreError.
    """

    CHUNK = 5_000  # events per script call: bounds how long one call holds Redis (~10 ms)
    CHUNK_BYTES = 4 << 20

    def __init__(self, url: str, job: str, rank: int, job_meta: dict | None = None, *, incarnation: int = 0,
                 resume: bool = False, connect_timeout: float | None = None, share: bool | None = None,
                 marks: str = "child", mark_every_s: float = redis_marks.MARK_EVERY_S, restate: bool = True,
                 frames: bool = True):
        """``resume``: append to the stream of a rank that died (a forwarder sending what its
        spool kept), after its last entry, instead of refusing a stream that exists.
        ``share``: not Redis's to decide (its readers are whoever its ACLs let in).
        ``marks``: who takes the stream's marks (``store/redis_marks.py``) every
        ``mark_every_s`` of the rank's time: a child process ("child"), this writer between
        two writes ("inline": tests and synthetic jobs), nobody ("off"; a forwarder never does).
        ``frames``: have the writing process's keeper take keyframes of the stream (every few
        seconds of it, ``$COMMSCOPE_KEYFRAME_S``: ``store/redis_marks.py``) once it holds
        ``keyframes.FOLLOW_AFTER``; never without marks.  Off where a job is written faster
        than it ran (a synthetic week: keyframes by the keeper's clock would mean nothing).
        ``restate``: keep what states the rank's ops in flight again after Redis lost them
        (``_restated``; never without marks).  Off (or ``restate`` set False before the first
        write) where one process writes thousands of simulated ranks: each keeps up to
        ``KEEP_BYTES``."""
        if marks not in ("child", "inline", "off"):
            raise ValueError(f"marks={marks!r}: child, inline or off")
        self._url = url  # (the child that takes marks connects with it)
        self.marks = "off" if resume else marks
        self.restate = restate and self.marks != "off"
        self.mark_every_ns = int(mark_every_s * 1e9)
        self._mark_from = 0  # the time (ns) of the first entry since the last mark: 0 none yet
        self._unmarked = 0  # bytes written since the last mark
        self._marker: subprocess.Popen | None = None  # the child taking the last mark
        #: seconds between keyframes (None: none), the keeper taking them once the stream
        #: holds ``keyframes.FOLLOW_AFTER`` (``_frame``), and the bytes written until then
        self.keyframe_s = keyframes.every_s_from_env() if frames and self.marks != "off" else None
        self._keeper: children.Keeper | None = None
        self._keeper_check = 0.0  # (monotonic) when to make sure the keeper runs next
        self._unframed = 0
        self.target = shown_target = parse_url(url)
        #: the URL's reply timeout, given back after the first write that went through: the
        #: ``connect_timeout`` bounds opening (and the recorder's first write, both inside
        #: init_process_group), not every reply of the rank's life
        self._full_timeout: float | None = None
        if connect_timeout is not None and connect_timeout < self.target.timeout:
            self._full_timeout = self.target.timeout
            self.target = dataclasses.replace(self.target, timeout=connect_timeout)
        self.job = self.target.job or job
        if not is_job_name(self.job):
            raise StoreError(f"bad job id {self.job!r}: use 1-120 letters, digits, '_', '.', '-'")
        self.rank = int(rank)
        self.incarnation = int(incarnation)
        self.resume = resume
        self.maxlen = self.target.maxlen or 0
        world = (job_meta or {}).get("world_size")
        self._world = world if isinstance(world, int) and world > 0 else 1
        #: the job's appends spread over time: world_size / rate seconds between a rank's writes
        self.write_every = min(MAX_WRITE_EVERY, self._world / self.target.rate)
        self.key = Keys.stream(self.job, self.rank, self.incarnation).encode()
        self.description = f"{shown_target.display(job=self.job)} rank {self.rank}"
        self._shown = shown_target.display()  # (the URL as given: not the opening's bound)
        meta = dict(job_meta or {}, job=self.job)
        if self.maxlen:
            meta["maxlen"] = self.maxlen
        self._meta = orjson.dumps(meta)
        self._secrets = [s.encode() for s in self.target.secrets() if len(s) >= 4]
        self._nodes = Nodes(self.target, self._shown)
        self._connected = False  # False after a failure: the next write reconnects (and settles)
        self._next = 1  # number of the next entry this writer appends
        self._unsure: list[bytes] | None = None  # sent as entries _next.. ; landed or not?
        self._settled: tuple[int, list[bytes]] | None = None  # last batch settled by reading the top
        #: Events the caller stopped resending (the recorder dropped and counted them while
        #: Redis was away) that had in fact reached Redis: a ``dropped`` count overstates
        #: what is missing by exactly this much.
        self.stored_after_drop = 0
        self._meta_line: bytes | None = None  # the rank's meta, stored again after Redis lost it
        self._lost: tuple[int, int] | None = None  # entries Redis no longer held on reconnecting
        self._lost_why: str | None = None  # the marker's reason where it is not that (``skip``)
        self._lost_ts: int | None = None  # and its time (``skip``: where it stands; None: now)
        #: The loss's statement being appended (``_say_lost``), how many of its lines are stored,
        #: and the state it restates (``_restated``)
        self._stating: list[bytes] | None = None
        self._stated = 0
        self._stating_state: tuple[list[bytes], bytes] | None = None
        #: What the rank was in after entry K (a mark's carry: ``store/inflight.py``), and the
        #: lines stored after it, by first entry: what restates its ops in flight after Redis
        #: lost them (``_restated``).  None: not known (no marks, or ``KEEP_BYTES`` passed)
        self._base: tuple[int, bytes] | None = (0, b"") if self.restate else None
        self._kept: deque[tuple[int, list[bytes]]] = deque()
        self._kept_bytes = 0
        if connect_timeout is None:
            self._open()
            return
        # ``connect_timeout`` bounds the whole opening (every round trip of it), not each reply
        self._nodes.set_deadline(time.monotonic() + connect_timeout)
        try:
            self._open()
        finally:
            self._nodes.set_deadline(None)

    crash_dir = None  # a server: no directory of this machine beside the stream

    @property
    def stored(self) -> int:
        """Entries this writer has put into its stream (known to have landed)."""
        return self._next - 1

    def __repr__(self) -> str:
        return f"RedisWriter({self.description})"

    def _open(self) -> None:
        nodes = self._nodes
        nodes.connect()
        try:
            if self.resume:
                top = self._top()
                if top < 0:
                    raise StoreError(f"{self._shown} job {self.job!r}: rank {self.rank}'s stream holds entries "
                                     "commscope did not write; not appending to it")
                self._next = top + 1
            elif nodes.call(self.key, "EXISTS", self.key):
                raise StoreError(
                    f"{self._shown} job {self.job!r} already holds events of rank {self.rank} "
                    "(an earlier job with the same id); refusing to mix jobs (choose a new COMMSCOPE_JOB, "
                    "another ?job= or another database)")
            self._register(first=True)
            self._say_via()
            if not self.resume:  # (a forwarder sends a dead rank's last records: the rank was told)
                self._heed_eviction()
                self._heed_clients()
                self._heed_failover()
            nodes.keep_only(self.key)
        except StoreError:
            nodes.close()
            raise
        except ReplyError as exc:
            nodes.close()
            raise StoreError(f"cannot use {self._shown}: Redis said: {scrub(str(exc), self.target)}") from None
        except OSError as exc:
            nodes.close()
            raise StoreError(f"cannot use {self._shown}: {nodes.why(exc)}") from None
        self._connected = True

    def _register(self, first: bool) -> None:
        """Make the job findable: again after every reconnect, in case Redis lost its data."""
        now_us = time.time_ns() // 1000
        # rank 0 opening: this job becomes the newest, its metadata rank 0's (a forwarder of
        # rank 0's spool has none to give: only where the key is missing, as the directory
        # store's forwarder never writes job.json)
        lead = self.rank == 0 and first and not self.resume
        replies = self._nodes.pipeline([
            ("SADD", Keys.ranks(self.job), Keys.member(self.rank, self.incarnation)),
            ("ZADD", Keys.JOBS, now_us, self.job) if lead else ("ZADD", Keys.JOBS, "NX", now_us, self.job),
            ("SET", Keys.meta(self.job), self._meta) if lead else ("SET", Keys.meta(self.job), self._meta, "NX"),
        ])
        for r in replies:
            if isinstance(r, ReplyError):
                raise r
        if self.resume and replies[1] == 1:  # (a forwarder put the job in the index: ``date_job``)
            self._put_in_index = now_us

    #: the score (µs) this writer, a forwarder, put its job in ``commscope:jobs`` with: the
    #: forward's time until ``date_job`` makes it the rank's start; None: it did not
    _put_in_index: int | None = None

    #: ``date_job``'s move: only a score that is still the forwarder's own (a rank 0 that
    #: registered since, as the job's lead, is not undone)
    DATE_JOB = b"""
if tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1])) == tonumber(ARGV[2]) then
  return redis.call('ZADD', KEYS[1], 'XX', ARGV[3], ARGV[1])
end
return 0
"""

    def date_job(self, started_ns: int) -> None:
        """A forwarder that put its job in the index (a job whose ranks never reached Redis)
        dates it by its rank's start (its meta's time), not by the forward: a reader takes the
        newest job, and a job forwarded after a later one started is not it (helper-163: a
        later run's launcher forwarded an earlier one, whose trace its hint then showed)."""
        if self._put_in_index is None or started_ns <= 0:
            return
        try:
            self._nodes.call(Keys.JOBS, "EVAL", self.DATE_JOB, 1, Keys.JOBS, self.job, self._put_in_index,
                             started_ns // 1000)
        except (OSError, ReplyError, StoreError):
            pass  # (the forward's time stays: the job is there all the same)

    #: what the user should know about this store, said once at open (``Recorder`` warns it)
    warning: str | None = None
    #: (monotonic) when the job's index keys were last set again (``_refresh_index``); None:
    #: never, the Redis does not evict them
    _refreshed: float | None = None
    refresh_every = 0.0  # (seconds: ``_heed_eviction`` or ``_heed_failover`` sets it)
    #: refreshes of the index a whole job sends per second at most, and the fewest seconds
    #: between two of one rank's (``_refresh_index``)
    REFRESH_RATE = 10.0
    REFRESH_MIN_S = 5.0

    def _heed_eviction(self) -> None:
        """At open: a Redis that evicts keys when full (``evicting_policy``, asked of the node
        of the job's index and of the stream's) may drop this trace's keys whole.  Say so once
        (``warning``), and keep the job's index keys (``_refresh_index``) used, and back
        should they go all the same: written once, idle while the streams are written, they
        are what an LRU policy drops first, and a reader then finds "no job" beside its
        streams."""
        nodes = self._nodes
        at = {nodes.node(k): k for k in (self.key, Keys.meta(self.job))}
        policy = next(filter(None, (evicting_policy(nodes, k) for k in at.values())), None)
        if policy is None:
            return
        self.warning = (f"commscope: {self._shown} {_evicts(policy)}: it may drop this trace's streams, or the "
                        "job's index, whole when full (set maxmemory-policy noeviction for a trace store)")
        self._refresh_from_now()

    def _refresh_from_now(self) -> None:
        """Set the job's index again every ``refresh_every`` seconds from now (``_refresh_index``)."""
        self.refresh_every = max(self.REFRESH_MIN_S, self._world / self.REFRESH_RATE)
        # (ranks that open together refresh apart: the first one comes early, by rank)
        self._refreshed = time.monotonic() - self.refresh_every * (1.0 - (self.rank * 0.6180339887) % 1.0)

    def _heed_failover(self) -> None:
        """At open, on a cluster whose master of the job's set of streams is not this stream's:
        should that master fail over before its replica had this rank's member, only writers
        that reconnect added theirs back, and a reader took the others' streams for absent
        (their ranks "never entered", the victims named: helper-197).  Set the index again
        every ``refresh_every`` seconds, as on a Redis that evicts."""
        if self._refreshed is None and self._nodes.node(Keys.ranks(self.job)) != self._nodes.node(self.key):
            self._refresh_from_now()

    def _heed_clients(self) -> None:
        """At open: a Redis that cannot take the job's writers with room to spare on its
        busiest master (``redis_keeper.room``, ``busiest``), or whose clients already fill
        it (other jobs: ``crowded``), refuses some ranks, and consoles: say so once
        (``warning``), with what to change.  Nothing said of a ``maxclients`` Redis would not
        tell, nor of a spread it would not (an ACL user without INFO, CONFIG or CLUSTER)."""
        nodes = self._nodes
        ranks = redis_keeper.busiest(nodes, self.job, self._world)
        seen = nodes.clients(self.key)
        on = "it" if len(nodes.masters()) == 1 and not nodes.learning else "its busiest master"
        if seen.said and ranks is not None and not redis_keeper.room(ranks, seen.most):
            said = (f"commscope: {self._shown} takes {seen.most:,} clients a master (maxclients), and this job "
                    f"puts {ranks:,} ranks on {on}, a connection each: too few are left for consoles and ranks "
                    f"starting again; raise maxclients to {math.ceil(ranks / (1 - redis_keeper.SPARE)):,} or more "
                    "(and Redis's open files: ulimit -n)")
        elif redis_keeper.crowded(seen):
            said = (f"commscope: {self._shown} already serves {seen.connected:,} of the {seen.most:,} clients it "
                    "takes (maxclients) on this rank's master: ranks of this job may find none (they wait in "
                    "their spools), nor consoles; raise maxclients (and Redis's open files: ulimit -n)")
        else:
            return
        self.warning = said if self.warning is None else f"{self.warning}\n{said}"

    def _refresh_index(self) -> None:
        """Set the job's index keys again (``_register``: its set of streams, its metadata, its
        row in ``commscope:jobs``), every ``refresh_every`` seconds of a Redis that evicts, or of a
        cluster whose master of the set of streams is another than this stream's:
        one round trip a rank at that cadence, the job's ranks together at most
        ``REFRESH_RATE`` a second, whatever its width; never per op.  The writes keep the
        keys used (an LRU or LFU policy drops the least used first), and set them back when
        evicted all the same: this rank's member, the metadata and the job's row if gone."""
        self._refreshed = time.monotonic()
        try:
            self._register(first=False)
        except (OSError, ReplyError, StoreError):
            self._nodes.reset()  # (the append says what is wrong; the index is tried again next time)

    #: on a cluster, the master this writer last said it appends through (``_say_via``)
    _via: tuple[str, int] | None = None

    def _say_via(self) -> None:
        """On a cluster: which master this stream is appended through (``Keys.via``), said at
        open and after the first append through another one (a failover, a slot moved): a
        replica that takes over holds the old one's address until this writer has appended
        through it, and stated what it found lost first, so a reader in between knows the
        stream's end is not settled (``RedisReader._unsettled``) instead of reading a healthy
        trace short of what the old master lost."""
        if not self._nodes.cluster:
            return
        node = self._nodes.node(self.key)
        key = Keys.via(self.job, self.rank, self.incarnation)
        reply = self._nodes.run(key, pack("SET", key, f"{node[0]}:{node[1]}"))
        if isinstance(reply, ReplyError):
            raise reply
        self._via = node

    def _reconnect(self) -> None:
        self._nodes.connect()  # StoreError (the slot map read again: a failover moved it)
        self._register_again()
        self._nodes.keep_only(self.key)
        self._connected = True
        top = self._top()
        if 0 <= top < self._next - 1:  # Redis lost what had landed: restarted empty, flushed
            self._lost = (top + 1, self._next - 1)
            self._stating = None  # (a statement of an earlier loss cut short: this one is stated anew)

    def _register_again(self) -> None:
        """``_register`` after a reconnect, in case Redis lost the job's keys.  Where the node of
        the job's keys cannot be reached (a cluster master down, the others serving: ``cluster-
        require-full-coverage no``), the stream's own master still takes the rank's writes: it
        is tried again after every write until it goes through (``_unregistered``).  Before, the
        writer failed with it, and its events were dropped although their master was up."""
        try:
            self._register(first=False)
            self._unregistered = False
        except ReplyError:
            pass  # e.g. OOM: the append will say so; registering again is only a safety net
        except (OSError, StoreError):  # (its node cannot be reached)
            self._unregistered = True
            self._register_at = time.monotonic() + self.REGISTER_EVERY_S
            self._nodes.reset()  # (``many`` closed them all already: the next use connects again)

    _unregistered = False
    _register_at = 0.0
    #: seconds between tries to register again while the job's node is down (each may wait a
    #: connect timeout: not at every write)
    REGISTER_EVERY_S = 5.0

    def skip(self, n: int, why: str, ts: int | None = None) -> None:
        """Leave ``n`` entry numbers unused before the next write, which starts with a
        ``store_lost`` marker saying ``why`` (timed ``ts``: where it stands among the rank's
        events, not now): a copy of a trace whose source no longer held those events
        (trimmed) keeps the gap a reader counts.  Skips with no write between them are one
        gap, their reasons joined."""
        if n <= 0:
            return
        if self._lost is None:
            self._lost = (self._next, self._next + n - 1)
            self._lost_why = why
            self._lost_ts = ts
        elif self._stating is None:  # (not being stated yet: the gap grows)
            self._lost = (self._lost[0], self._lost[1] + n)
            if self._lost_why is not None and why not in self._lost_why:
                self._lost_why = f"{self._lost_why}; {why}"
        else:
            return
        self._next += n

    def _say_lost(self) -> None:
        """Append a ``store_lost`` marker (the true cause of the gap readers will see), the
        rank's meta, and what the rank was in that went with the lost entries (``_restated``:
        its groups and the ops it still has in flight, so a hang is still found).  Made once
        per loss: a statement cut by a lost connection is settled and finished (``write``),
        never stated twice."""
        if self._stating is None:
            first, last = self._lost
            why = self._lost_why
            lines = [store_lost(self.rank, last - first + 1, why or
                                f"Redis no longer held entries #{first}-#{last} of this stream when the rank "
                                "reconnected (it restarted without persistence, or was flushed)",
                                ts=self._lost_ts if why is not None else None)]
            lines += [self._meta_line] if self._meta_line is not None else []
            state = self._restated(first - 1) if why is None else None  # (``skip``: nothing vanished)
            self._stating, self._stated = lines + (state[0] if state is not None else []), 0
            self._stating_state = state
        stating = self._stating
        while self._stating is stating and self._stated < len(stating):
            self._stated += self._append(stating, self._stated, floor=0)  # (below the gap: that is the point)
        if self._stating is not stating:
            return  # (the stream went again meanwhile: the call that found it stated that)
        why, state = self._lost_why, self._stating_state
        self._lost = self._lost_why = self._lost_ts = self._stating = self._stating_state = None
        if why is None:  # (what the rank is in from here: the restatement's state, the lost lines no longer kept)
            self._kept.clear()
            self._kept_bytes = 0
            if self._base is not None:
                self._base = (self._next - 1, state[1]) if state is not None else None

    def _settle_unsure(self, lines: list[bytes], done: int) -> int:
        """After a failure with a chunk in flight: settle it (``_settle``) against what it was
        part of, a loss's statement (``_say_lost``) or the caller's ``lines`` past ``done``;
        returns ``done`` moved past the caller's lines that landed."""
        if self._stating is not None:
            self._stated += self._settle(self._stating[self._stated:])
            return done
        return done + self._settle(lines[done:])

    def _keep(self, first: int, lines: list[bytes]) -> None:
        """``lines`` are stored from entry ``first`` on: kept until a mark covers them
        (``_rebase``), at most ``KEEP_BYTES``."""
        if not (self.restate and lines):
            return
        self._kept.append((first, lines))  # (a list of the caller's own: a slice)
        self._kept_bytes += sum(map(len, lines))
        while self._kept_bytes > KEEP_BYTES and self._kept:  # (the marks fell behind: not known until the next)
            _, gone = self._kept.popleft()
            self._kept_bytes -= sum(map(len, gone))
            self._base = None

    def _rebase(self, entry: int, carry: bytes) -> None:
        """A mark after entry ``entry`` holds ``carry``: the kept lines up to it are no longer
        needed; what the rank is in is known again where the kept lines follow it."""
        if self._base is not None and entry < self._base[0]:
            return  # (older than what is known: a mark taken before a loss restated the state)
        kept_from = self._kept[0][0] if self._kept else self._next
        if entry + 1 < kept_from:
            return  # (lines between the mark and the kept ones were let go: still not known)
        while self._kept and self._kept[0][0] <= entry:
            first, lines = self._kept.popleft()
            self._kept_bytes -= sum(map(len, lines))
            if first + len(lines) - 1 > entry:
                rest = lines[entry + 1 - first:]
                self._kept.appendleft((entry + 1, rest))
                self._kept_bytes += sum(map(len, rest))
                break
        self._base = (entry, carry)

    def _restated(self, top: int) -> tuple[list[bytes], bytes] | None:
        """What the rank was in at its last stored entry, as a mark's carry says it
        (``inflight.Replayed.carry``: its groups, its drops so far, the last ops it completed,
        the phases of every op still in flight, the stacks that say where it is), replayed
        from the newest mark known and the lines kept after it: the lines to restate after a
        loss, and the whole carry (the new base).  Redis still holding entries up to ``top``
        (a replica that lacked the newest writes), what they hold is not stated twice (a
        begin stated again reads as an id reused).  None when not known."""
        if self._base is None or not self.restate:
            return None
        entry, carry = self._base
        survived: list[bytes] = []
        if top > 0:
            if entry > top:
                return None  # (the mark's state holds lost and stored events alike)
            survived = [x for first, lines in self._kept for k, x in enumerate(lines, first) if k <= top]
        lines = [x for _, chunk in self._kept for x in chunk]
        restated = inflight.restatement(carry, b"".join(x + b"\n" for x in lines), self.rank)
        if restated is None or top <= 0:
            return (restated.lines, restated.carry) if restated is not None else None
        try:
            held = inflight.replay(carry, b"".join(x + b"\n" for x in survived), self.rank)
        except Exception:  # (a replay of what this writer stored itself: never expected)
            return None
        stored = {_said(e) for ops in held.phases.values() for e in ops}
        stored |= {_said(e) for e in (*held.stacks.of_op.values(), held.stacks.last, held.stacks.requested)
                   if e is not None}
        return [x for x in restated.lines if _said(orjson.loads(x)) not in stored], restated.carry

    def resume_after(self, stored: int, meta: bytes | None = None) -> bool:
        """A forwarder's writer (``resume``): the rank's stream held ``stored`` entries when the
        rank last wrote (its spool says).  Held fewer now (Redis restarted empty, or was
        flushed, while the rank was gone), the next write states the loss first, with ``meta``,
        as after a reconnect (``_say_lost``), and appends after the gap.  True if so."""
        top = self._next - 1
        if not (0 <= top < stored):
            return False
        self._lost = (top + 1, stored)
        self._next = stored + 1
        if meta is not None:
            self._meta_line = meta
        return True

    def first_event(self) -> dict | None:
        """The stream's first event (its meta), None when empty or unreadable."""
        try:
            if not self._connected:
                self._reconnect()
            entries = self._nodes.run(self.key, pack("XRANGE", self.key, "-", "+", "COUNT", 1),
                                      Connection.read_entries)
            ev = orjson.loads(entries[0][1]) if entries else None
        except (OSError, ReplyError, StoreError, orjson.JSONDecodeError, IndexError, TypeError):
            return None
        return ev if isinstance(ev, dict) else None

    def _top(self) -> int:
        """Number of the stream's last entry (0 when empty or gone); -1 if it is not ours."""
        top = self._nodes.run(self.key, pack("XREVRANGE", self.key, "+", "-", "COUNT", 1), Connection.read_entries)
        return entry_number(top[0][0]) if top else 0

    def _settle(self, lines: list[bytes], top: int | None = None) -> int:
        """Find out how much of the batch in flight landed; returns how many leading
        ``lines`` are therefore already stored (the caller skips them).

        ``lines`` is what the caller sends now: the batch in flight, in order, maybe
        without some of its events (the recorder drops the oldest events, not blocks,
        when its buffer is full), followed by newer ones.  The landed part is a prefix of
        the batch in flight, so the leading ``lines`` found in it are the ones to skip.
        """
        sent = self._unsure or []
        base = self._next - 1
        if top is None:
            top = self._top()
        if top < 0 or top > base + len(sent):
            raise StoreError(f"{self._shown} job {self.job!r}: rank {self.rank}'s stream is also written by "
                             "another process; refusing to mix events (two recorders with the same rank and job?)")
        landed = min(max(top - base, 0), len(sent))
        done = set(sent[:landed])
        skip = 0
        while skip < len(lines) and lines[skip] in done:
            skip += 1
        self._settled = (base, sent)
        self._unsure = None
        self._next = base + landed + 1
        self._keep(base + 1, sent[:landed])
        if lines:  # landed events the caller no longer sends: it dropped (and counted) them
            self.stored_after_drop += len(done) - len(set(lines[:skip]))
        return skip

    def _retry_settled(self, lines: list[bytes], top: int) -> int:
        """The stream's top is past what we thought (a batch we took for lost landed after
        all): settle again against the last batch we settled."""
        if self._settled is None:
            self._unsure = None  # the script refused it: it did not land
            raise StoreError(f"{self._shown} job {self.job!r}: rank {self.rank}'s stream is also written by "
                             "another process; refusing to mix events (two recorders with the same rank and job?)")
        base, sent = self._settled
        self._next, self._unsure = base + 1, sent
        return self._settle(lines, top)

    def _scrub_meta(self, line: bytes) -> bytes:
        """Belt and braces: a meta event's argv may quote the store URL with its password."""
        if not (b"://" in line or any(s in line for s in self._secrets)):
            return line
        try:
            ev = orjson.loads(line)
        except orjson.JSONDecodeError:
            return line
        if not isinstance(ev, dict) or ev.get("type") != events.META:
            return line
        secrets = [s.decode() for s in self._secrets]

        def clean(v: Any) -> Any:
            if isinstance(v, str):
                if "://" in v:
                    v = redact(v)
                for s in secrets:
                    v = v.replace(s, "***")
                return v
            if isinstance(v, list):
                return [clean(x) for x in v]
            if isinstance(v, dict):
                return {k: clean(x) for k, x in v.items()}
            return v

        cleaned = clean(ev)
        return line if cleaned == ev else orjson.dumps(cleaned)

    def write(self, lines: list[bytes]) -> None:
        if not lines:
            return
        done = 0  # leading lines known to be stored
        reason = "?"
        if self._meta_line is None:
            self._meta_line = meta_line(lines)
        try:
            for _attempt in range(2):  # one immediate reconnect, e.g. after an idle-timeout close
                try:
                    if not self._connected:
                        self._reconnect()
                    if self._unsure is not None:
                        done = self._settle_unsure(lines, done)
                    if self._lost is not None:
                        self._say_lost()
                    while done < len(lines):
                        done += self._append(lines, done)
                    if self._via is not None and self._nodes.node(self.key) != self._via:
                        try:
                            self._say_via()
                        except ReplyError:
                            pass  # (said after the next write: the lines landed, the write did not fail)
                    # (a MOVED or ASK opened one to the slot's new master, a lost stream's marker
                    # one to the job's: one connection a rank, or 16k ranks pass maxclients)
                    if self._unregistered and time.monotonic() >= self._register_at:
                        self._register_again()
                    elif self._refreshed is not None and time.monotonic() - self._refreshed >= self.refresh_every:
                        self._refresh_index()
                    self._nodes.keep_only(self.key)
                    if self._full_timeout is not None:
                        self._relax()
                    if self.marks != "off":
                        self._mark_if_due(lines)
                    if self.keyframe_s is not None:
                        self._frame(lines)
                    return
                except ReplyError as exc:  # Redis refused: OOM, read-only replica, loading, ...
                    reason = f"Redis said: {scrub(str(exc), self.target)}"
                    # A refused script stored nothing; reading the top proves it.
                    if self._unsure is not None:
                        done = self._settle_unsure(lines, done)
                    break
                except OSError as exc:  # connection lost: the chunk in flight may or may not have landed
                    reason = self._nodes.why(exc)
                    self._drop()
        except StoreError as exc:  # cannot connect or log in, or another writer: nothing more landed
            self._drop()
            raise type(exc)(str(exc), written=done) from None
        except (OSError, ReplyError):  # while settling after a refusal: settle next time
            self._drop()
        raise StoreError(f"cannot append to {self._shown} job {self.job!r} rank {self.rank}: {reason}", written=done)

    def set_deadline(self, deadline: float | None) -> None:
        """No wait of the writes from now on lasts past ``deadline`` (``time.monotonic``; None:
        each reply's timeout alone): a last write at exit takes what is left of its time."""
        self._nodes.set_deadline(deadline)

    def _relax(self) -> None:
        """The URL's reply timeout from now on (``_full_timeout``), on the open connections too."""
        timeout, self._full_timeout = self._full_timeout, None
        self.target = dataclasses.replace(self.target, timeout=timeout)
        self._nodes.set_timeout(timeout)

    def _mark_if_due(self, lines: list[bytes]) -> None:
        """Have the stream marked once ``mark_every_s`` of the rank's time or ``MARK_BYTES``
        went by since the last mark (one child at a time: the next one marks all it missed)."""
        self._unmarked += sum(map(len, lines))
        now = redis_marks.entry_ns(lines[-1])
        if not self._mark_from:  # (ranks that start together mark apart: the first mark comes early, by rank)
            self._mark_from = (redis_marks.entry_ns(lines[0]) or now) - int(
                self.mark_every_ns * ((self.rank * 0.6180339887) % 1.0))
        marks = Keys.marks(self.job, self.rank, self.incarnation).encode()
        if self._marker is not None and self._marker.poll() is not None:  # (the child marked: what it found)
            self._marker = None
            try:
                self._learn(redis_marks.newest(self._nodes, marks))
            except (OSError, ReplyError, StoreError):
                pass  # (the next mark says it)
        if now - self._mark_from < self.mark_every_ns and self._unmarked < redis_marks.MARK_BYTES:
            return
        if self.marks == "inline":
            try:
                self._learn(redis_marks.take(self._nodes, self.key, marks, self.rank))
            except (OSError, ReplyError, StoreError):
                pass  # (taken a period later: the next mark reads what this one would have)
        elif self._marker is not None:
            return  # (still marking: the next write asks again)
        else:
            self._marker = redis_marks.spawn(self._url, self.job, self.rank, self.incarnation, self._nodes.known())
        self._mark_from, self._unmarked = now, 0

    def _frame(self, lines: list[bytes]) -> None:
        """Name the stream to the process's keeper of keyframes once it holds
        ``keyframes.FOLLOW_AFTER`` (less is read from a mark at no great cost); make sure
        now and then that the keeper runs (one that died is started again)."""
        if self._keeper is None:
            self._unframed += sum(map(len, lines))
            if self._unframed < keyframes.FOLLOW_AFTER or self.keyframe_s is None:
                return
            self._keeper = redis_keeper.keeper(self._url, self.job, self.keyframe_s, self._nodes.known(), self._world)
            redis_keeper.follow(self._keeper, (self.rank, self.incarnation))
            self._keeper_check = time.monotonic() + keyframes.CHECK_S
        elif (now := time.monotonic()) >= self._keeper_check:
            self._keeper_check = now + keyframes.CHECK_S
            self._keeper.ensure()

    def _learn(self, mark: redis_marks.Mark | None) -> None:
        """A mark of this stream, as taken: what the rank was in after its entry (``_rebase``).
        (An inexact one, whose chain ``maxlen`` broke, lacks what the stream lost: what a
        window starting there reads, never an op wrongly in flight.)"""
        if mark is not None:
            self._rebase(mark.entry, mark.carry)

    def _append(self, lines: list[bytes], start: int, floor: int | None = None) -> int:
        """Send one chunk from ``lines[start:]``; returns how many of them are now stored.
        ``floor``: the lowest top the stream may have (``_pack_append``)."""
        chunk = lines[start:start + self.CHUNK]
        payload_lines = chunk
        size = 0
        for i, line in enumerate(chunk):
            size += len(line)
            if size > self.CHUNK_BYTES and i > 0:
                chunk = payload_lines = chunk[:i]
                break
        if any(b'"type":"meta"' in line for line in chunk):
            payload_lines = [self._scrub_meta(line) for line in chunk]
        payload = _pack_append(self.key, self._next, self.maxlen, payload_lines, floor)
        self._unsure = chunk  # the caller's lines, unscrubbed: _settle matches them by content
        reply = self._nodes.run(self.key, payload)  # (a redirection ran nothing: sent again where it says)
        if isinstance(reply, ReplyError):
            raise reply
        n, top = int(reply[0]), entry_number(reply[1])
        if n == 0:  # the script refused: the stream is already at or past our next number
            return self._retry_settled(lines[start:], top)
        if n < 0:  # what had landed is gone, the connection up all along (FLUSHDB, DEL, eviction)
            self._unsure = None  # (refused: nothing of the chunk landed)
            self._lost = (max(top, 0) + 1, self._next - 1)
            self._stating = None  # (stating an earlier loss, maybe: this one is stated anew)
            try:
                self._register(first=False)  # (the job's keys may have gone with it)
            except ReplyError:
                pass
            self._say_lost()
            return 0  # (the caller sends the chunk again, after the marker)
        self._unsure = None
        self._settled = None
        self._keep(self._next, chunk)
        self._next += n
        return n

    def _drop(self) -> None:
        self._nodes.close()
        self._connected = False

    def close(self) -> None:
        """Say how many entries the stream holds (``Keys.ends``, in a copy that, on a cluster,
        another master than the stream's serves), then drop the connection.  A tail the stream's master loses after
        this (it fails over before its replica got the last writes, or restarts empty) has no
        later entry to show the gap; readers count it from there (``RedisReader._tails``)."""
        if self._connected and self.stored > 0:
            nodes, member = self._nodes, Keys.member(self.rank, self.incarnation)
            copies = [Keys.ends(self.job, i) for i in range(Keys.ENDS)]
            away = [k for k in copies if nodes.node(k) != nodes.node(self.key)][:1] or copies[:1]
            nodes.set_timeout(min(1.0, self.target.timeout))  # (at the rank's exit: a node down costs it 1 s at most)
            try:  # (in the copies another master serves: one that is not lost with the stream's)
                # (the copy's version bumped after: a follower reads a copy only when it changed)
                nodes.pipeline([c for k in away for c in (("HSET", k, member, self.stored),
                                                           ("HINCRBY", k, Keys.ENDS_VERSION, 1))])
            except (OSError, ReplyError, StoreError):
                pass  # (not said: such a tail loss is not counted, as before)
            finally:
                nodes.set_timeout(self.target.timeout)
        if self._keeper is not None:
            self._keeper.done((self.rank, self.incarnation))
            self._keeper = None
        self._drop()


# ---------------------------------------------------------------------------- reader
class RedisReader(TraceReader):
    """Reads or follows one job: XREAD for ``poll``, XRANGE pages for ``read_all``.

    Without ?job= it opens the newest job in ``commscope:jobs``; ``wait`` lets it open
    before any job (or the named one) exists.  ``poll`` never raises for a lost
    connection (the console keeps running and retries); ``read_all`` does, since a
    partial read must not pass for a whole trace.
    """

    PAGE = 10_000
    shards = True

    def __init__(self, url: str, *, wait: bool = False, job: str | None = None):
        self._url = url
        self.target = parse_url(url)
        self._want = job or self.target.job
        self._shown = self.target.display()
        self.stats = ReadStats()
        self.missing: dict[int, int] = {}  # rank -> events absent from its streams (gaps)
        self._nodes = Nodes(self.target, self._shown)
        self._nodes.connect()
        self._up = True  # False after a failure: the next use connects again
        self.keys: type[Keys] = Keys  # the layout of the job (``_find_job``)
        self._down = False
        # (first: a job whose ranks never reached Redis exists only in their spools, whether or
        # not the store holds other jobs; forwarded, it is dated by its ranks' start, so the
        # newest job is still the newest: helper-163 found check reading the one before)
        self._orphans()
        self._wait = wait
        self.job_id: str | None = self._find_job()
        evicting = evicting_policy(self._nodes)
        if self.job_id is None and not wait:
            self.close()
            why = f"; {_evicts(evicting)}: the job's keys may have been evicted" if evicting else ""
            if self._want:
                raise StoreError(f"no job {self._want!r} in {self._shown}{self._known_jobs(url)}{why}")
            raise StoreError(f"{self._shown} holds no commscope trace (no job in {Keys.JOBS}){why}")
        if evicting:
            self.stats.warnings.append(f"{self._shown} {_evicts(evicting)}: it may have dropped streams of this "
                                       "trace, or the job's index, whole (set maxmemory-policy noeviction for "
                                       "a trace store)")
        full = full_nodes(self._nodes)
        if full:
            self.stats.warnings.append(f"{self._shown} {full}: events of this trace that never reached the store "
                                       "may be among them (raise maxmemory, or free memory, for a trace store)")
        self._cursor: dict[Stream, bytes] = {}  # stream -> id of the last entry returned
        self._last: dict[Stream, int] = {}  # stream -> number of the last commscope entry returned
        self._carried: list[Event] = []  # what streams started at a mark were in (``start_at``)
        self._skipped_entries = 0  # entries before the marks a window started at: not read
        #: the bytes and entries the marks a window started at say came before them: the mean
        #: entry size ``backlog_bytes`` takes before any entry is read
        self._marked = (0, 0)
        self._sampled: float | None = None  # (``_entry_bytes``)
        #: (monotonic) until when ``backlog_bytes`` keeps what it found: each stream's top entry
        #: and length, and the mean entry's bytes
        self._backlog: tuple[float, dict[Stream, tuple[int, int | None]], float] = (0.0, {}, 0.0)
        self._window_ms: int | None = None  # where the window ``start_at`` was given starts (ms)
        self._job: dict | None = None
        self._job_failed = False
        self._tail_said: dict[Stream, int] = {}  # stream -> the end ``_tails`` counted lost up to
        #: a follower's look at the ends (``_ends_changed``): each copy's (length, version) as
        #: last read, and every end read so far
        self._ends_seen: dict[int, tuple] = {}
        self._ends_known: dict[Stream, int] = {}
        self._unsettled_seen: set[Stream] = set()  # streams ``_unsettled`` counted (and not settled since)
        self._masters: frozenset | None = None  # a follower's: the cluster's masters at its last look (``_settling``)
        self._map_seen = -1  # ``Nodes.version`` at that look
        self._emptied_seen: set[Stream] = set()  # streams ``_emptying`` counted (and not settled since)
        self._connects = 0  # connections made again after a failure (``_nodes_ok``)
        self._looked = (0, 0)  # (``_connects``, streams listed) at ``_emptying``'s last poll

    @property
    def description(self) -> str:
        return self.target.display(job=self.job_id or self._want)

    def __repr__(self) -> str:
        return f"RedisReader({self.description})"

    def _known_jobs(self, url: str) -> str:
        try:
            jobs = list_jobs(url)[-5:]
        except StoreError:
            return ""
        return f" (newest jobs there: {', '.join(j for j, _ in reversed(jobs))})" if jobs else ""

    def _orphans(self) -> int:
        """Forward the spools of dead ranks of this store on this host: a job whose ranks
        never reached Redis (it was down, full, or refused their password all along) exists
        only there."""
        from commscope.store import spool

        sid = spool.store_id(self._url)
        try:
            return spool.forward_orphans(stores=lambda s: self._url if s == sid else None, only=sid)
        except Exception:
            return 0

    def _nodes_ok(self) -> Nodes:
        if not self._up:
            self._nodes.connect()
            self._up = True
            self._connects += 1
        return self._nodes

    def _lost(self) -> None:
        """After a failure: every connection closed, the next use connects again."""
        self._nodes.close()
        self._up = False

    def _find_job(self) -> str | None:
        nodes = self._nodes_ok()
        try:
            if self._want:
                keys = _layout(nodes, self._want)
                if keys is not None:
                    self.keys = keys
                return self._want if keys is not None else None
            # (the newest member that is a job id: one that is not, written by someone else, is passed over)
            newest = [j for j in map(_job_id, nodes.call(Keys.JOBS, "ZREVRANGE", Keys.JOBS, 0, 15) or []) if j][:1]
            if newest:
                self.keys = _layout(nodes, newest[0]) or Keys
        except ReplyError as exc:
            if self._wait and str(exc).startswith(PASSING):  # (a console waits on, as it
                return None  # waits for a job not there yet; helper-175)
            raise StoreError(f"cannot read {self._shown}: Redis said: {scrub(str(exc), self.target)}") from None
        except OSError as exc:
            self._lost()
            raise StoreError(f"cannot read {self._shown}: {nodes.why(exc)}") from None
        return newest[0] if newest else None

    def job(self) -> dict | None:
        if self._job is None and self.job_id is not None:
            try:
                key = self.keys.meta(self.job_id)
                raw = self._nodes_ok().call(key, "GET", key)
            except (OSError, ReplyError, StoreError):
                return None
            if isinstance(raw, bytes) and raw:
                self._job, why = decode_job(raw)
                if self._job is None and not self._job_failed:
                    self._job_failed = True
                    self.job_invalid(why, f"job metadata skipped ({why})")
        return self._job

    def job_name(self) -> str | None:
        return self.job_id

    def first_event(self, stream: Stream) -> dict | None:
        """(``TraceReader.first_event``) The stream's first entry, where it still holds it."""
        if self.job_id is None:
            return None
        key = self.keys.stream(self.job_id, *stream)
        try:
            entries = self._nodes_ok().run(key, pack("XRANGE", key, "-", "+", "COUNT", 1), Connection.read_entries)
            ev = orjson.loads(entries[0][1]) if entries else None
        except OSError:
            self._lost()
            return None
        except (ReplyError, StoreError, orjson.JSONDecodeError, IndexError, TypeError):
            return None
        return ev if isinstance(ev, dict) else None

    def ranks(self) -> list[Stream]:
        """The job's streams: (rank, incarnation), in order."""
        if self.job_id is None:
            return []
        key = self.keys.ranks(self.job_id)
        asked = time.time_ns()
        members = self._nodes_ok().call(key, "SMEMBERS", key) or []
        self._ranks_at = asked  # (the job's streams as of then: ``watermark_ns`` of a part with none)
        streams = filter(None, map(Keys.parse_member, members))
        shard = self.shard
        self._streams = sorted(streams if shard is None else (st for st in streams if shard.owns(st[0])))
        return self._streams

    def watermark_ns(self) -> int | None:
        streams = getattr(self, "_streams", None)
        if streams:
            return self._watermark_of(streams)
        # a part of the streams (``Shard``) that the job's set of streams names none of: each
        # of them (none) read as of when it was asked
        return getattr(self, "_ranks_at", None) if self.shard is not None and streams is not None else None

    def count(self) -> int:
        """Entries stored for this job right now (XLEN summed over streams, less those before
        a window's start): progress totals."""
        if self.job_id is None:
            return 0
        streams = self.ranks()
        if not streams:
            return 0
        replies = self._nodes_ok().pipeline([("XLEN", self.keys.stream(self.job_id, *st)) for st in streams])
        return max(0, sum(r for r in replies if isinstance(r, int)) - self._skipped_entries)

    def latest_ns(self) -> int:
        """When the job last wrote (its streams' newest entries' times), 0 if never: what a
        window relative to the trace's end counts from."""
        return max((ns for _, ns in self._tops().values()), default=0)

    def _tops(self) -> dict[Stream, tuple[int, int]]:
        """Each stream's top entry: its number and its time (ns), from one pipeline."""
        streams = self.ranks() if self.job_id is not None else []
        keys = [self.keys.stream(self.job_id, *st) for st in streams]
        replies = self._nodes_ok().pipeline([("XREVRANGE", k, "+", "-", "COUNT", 1) for k in keys])
        out = {}
        for stream, reply in zip(streams, replies, strict=True):
            try:
                eid, fields = reply[0]
                out[stream] = (entry_number(eid), redis_marks.entry_ns(fields[1]))
            except (IndexError, TypeError, ValueError):
                continue
        return out

    def window_start_ns(self) -> int | None:
        return None if self._window_ms is None else self._window_ms * 1_000_000

    def start_at(self, since: Since) -> None:
        """Start each stream after its newest mark or keyframe at or before the window's start,
        with what the rank was in there first (``store/redis_marks.py``); a duration counts back from
        the job's newest write.  A stream without such a mark is read from its start."""
        try:
            if self.job_id is None:
                self.job_id = self._find_job()
            tops = self._tops()
            start_ms = since.start_ns(max((ns for _, ns in tops.values()), default=0) or time.time_ns()) // 1_000_000
            self._window_ms = start_ms
            streams = list(tops)
            nodes = self._nodes_ok()
            replies = nodes.pipeline([("XREVRANGE", key(self.job_id, *st), str(start_ms), "-", "COUNT", 2)
                                      for st in streams for key in (self.keys.marks, self.keys.frames)])
            lengths = nodes.pipeline([("XLEN", self.keys.stream(self.job_id, *st)) for st in streams])
        except (OSError, ReplyError, StoreError) as exc:
            self._lost()
            self.stats.warnings.append(f"{since.describe()} asked for, but the marks could not be read ({exc}): "
                                       "this store is read from its start")
            return
        for i, (stream, length) in enumerate(zip(streams, lengths, strict=True)):
            top = tops[stream][0]
            # (the newer of its mark and its keyframe at or before the window's start)
            starts = [m for m in (redis_marks.starting(r, top) for r in replies[2 * i:2 * i + 2]) if m is not None]
            mark = max(starts, key=lambda m: m.entry, default=None)
            if mark is None or stream in self._cursor:
                continue
            self._cursor[stream] = b"0-%d" % mark.entry
            self._last[stream] = mark.entry
            gone = 0
            if isinstance(length, int):  # (entries up to the mark still stored: what a progress total leaves out)
                stored = max(0, min(length, mark.entry - (top - length)))
                self._skipped_entries += stored
                gone = max(0, min(mark.entry, top - length))  # (before the oldest entry left: trimmed, or lost)
            if gone:
                # (the mark's bytes count the entries gone too: the part --since skipped, which a read
                # without it reads, counted in entries, and the part gone apart, with its cause)
                self.stats.count_skipped_events(stream[0], stored)
                self.stats.count_gone_before_window(stream[0], gone)
                self.stats.trimmed = True
                maxlen = (self.job() or {}).get("maxlen")
                cause = f"were trimmed by maxlen={maxlen}" if maxlen else "are no longer in Redis (trimmed, or lost)"
                self.stats.warnings.append(f"rank {stream[0]}: the oldest {gone} stream entries before the window {cause}: "
                                           "gone, not skipped by --since")
            else:
                self.stats.count_skipped(stream[0], mark.bytes)
            # (an inexact mark's bytes leave out what was trimmed before it, counted in its entries;
            # one saying more than MAX_ENTRY_BYTES an entry is no mark commscope wrote: helper-158)
            if mark.exact and 0 < mark.bytes <= mark.entry * self.MAX_ENTRY_BYTES:
                self._marked = (self._marked[0] + mark.bytes, self._marked[1] + mark.entry)
            if not mark.exact:
                self.stats.warnings.append(f"rank {stream[0]}: what it was in at the window's start is not known "
                                           "(entries were trimmed by maxlen before they were marked): an op "
                                           "begun before may be missing")
            if mark.carry:
                # (a stream this reader starts here: it read none of its drops)
                self._carried.extend(inflight.as_read(self.ingest(stream, mark.carry).events, 0))

    def backlog_bytes(self) -> int:
        """Bytes stored but not yet returned, estimated (Redis says no stream's bytes): each
        stream's entries past the last returned (its top entry's number less that, at most
        its length: a trim) at the mean size of an entry (``_entry_bytes``).  Two pipelines of
        one command a stream.  What sizes ``attach``'s first window (``tui.feed.first_window``)
        and refuses a ``check`` past ``--max-memory`` (``analysis.source``) on Redis as on a
        directory: 0 before, so the last ten minutes of 1,024 ranks at 25 collectives a
        second (~7 GB) were read as asked.  Asked again sooner than its requests allow
        (``BACKLOG_REQUESTS_A_SECOND``: 1,024 streams every 4 s), the ends last found, against
        what was read since (helper-158: a figure kept said a console caught up "falling
        behind" for a minute at 16k ranks).  0 where Redis is away."""
        if self.job_id is None:
            return 0
        if time.monotonic() >= self._backlog[0]:
            try:
                tops = self._tops()
                streams = list(tops)
                lengths = self._nodes_ok().pipeline([("XLEN", self.keys.stream(self.job_id, *st)) for st in streams])
                ends = {st: (tops[st][0], n if isinstance(n, int) else None)
                        for st, n in zip(streams, lengths, strict=True)}
                mean = self._entry_bytes(streams, lengths)
            except (OSError, ReplyError, StoreError):
                return 0
            self._backlog = (time.monotonic() + 2 * len(streams) / self.BACKLOG_REQUESTS_A_SECOND, ends, mean)
        _, ends, mean = self._backlog
        entries = 0
        for stream, (top, length) in ends.items():  # (against what was read since: a follower caught up is not behind)
            behind = top - self._last.get(stream, 0)
            entries += max(0, behind if length is None else min(behind, length))
        return int(entries * mean)

    #: How much more than the lines Redis's ``MEMORY USAGE`` of a stream may say: ~1.2x on
    #: streams of many entries, up to 2.45x on short ones (helper-160: 256 streams of a few
    #: entries, 2.6 MB said of 1.07 MB written)
    SAMPLED_OVER = 2.5

    def least_backlog_bytes(self) -> int:
        """(``TraceReader.least_backlog_bytes``) ``backlog_bytes``, less where its entries'
        size is what ``MEMORY USAGE`` says (``_entry_bytes``: nothing read yet, no mark),
        which may say up to ``SAMPLED_OVER`` times the lines."""
        backlog = self.backlog_bytes()
        return int(backlog / self.SAMPLED_OVER) if self._sampled_mean else backlog

    def rank_count(self) -> int:
        """(``TraceReader.rank_count``) As last listed (``ranks``), else listed now; 0 where
        Redis is away."""
        streams = getattr(self, "_streams", None)
        if streams is None:
            try:
                streams = self.ranks()
            except (OSError, ReplyError, StoreError):
                return 0
        return len({rank for rank, _ in streams})

    #: Requests a second a follower's ``backlog_bytes`` sends at most (two a stream, then the
    #: figure is kept that long, less what is read meanwhile): asked every second, 16k streams
    #: sent 32k a second for a header.  A reader's: a console's read processes each
    BACKLOG_REQUESTS_A_SECOND = 500.0
    #: The most bytes an entry is taken to hold from what a mark says (a line of a tick's records)
    MAX_ENTRY_BYTES = 1 << 20

    #: Streams ``_entry_bytes`` asks Redis the memory of, where nothing else says an entry's size
    SAMPLED_STREAMS = 64
    _sampled_mean = False  # (the last ``backlog_bytes`` sized its entries so)

    def _entry_bytes(self, streams: list[Stream], lengths: list) -> float:
        """The mean bytes of an entry: of those read so far, else of those before the marks a
        window started at, else (once) what Redis says the first ``SAMPLED_STREAMS`` streams
        take in memory (``MEMORY USAGE``, its estimate from a few nodes of each: ~1.2x the
        lines they hold) over their entries, else ``ENTRY_BYTES``.  (The newest entries of a
        few streams said a quarter of it: a hung job's last entries are its beats.)"""
        self._sampled_mean = not (self._read_entries or self._marked[1])
        if self._read_entries:
            return self._read_bytes / self._read_entries
        if self._marked[1]:
            return self._marked[0] / self._marked[1]
        if self._sampled is None:
            sample = [(st, n) for st, n in zip(streams, lengths, strict=True) if isinstance(n, int) and n > 0]
            sample = sample[:self.SAMPLED_STREAMS]
            keys = [self.keys.stream(self.job_id, *st) for st, _ in sample]
            # (routed by the key, which is not the command's first argument)
            used = self._nodes_ok().many([(k, pack("MEMORY", "USAGE", k)) for k in keys]) if keys else []
            pairs = [(u, n) for u, (_, n) in zip(used, sample, strict=True) if isinstance(u, int)]
            entries = sum(n for _, n in pairs)
            self._sampled = sum(u for u, _ in pairs) / entries if entries else float(self.ENTRY_BYTES)
        return self._sampled

    def size(self) -> Size:
        """Entries stored (``count``): a progress bar counts events."""
        return Size(self.count(), "events")

    # -- reading
    def poll(self, max_bytes: int | None = None) -> list[Event]:
        """New events of every rank since the last call (XREAD, never blocks)."""
        got: dict[int, list[Event]] = {}
        try:
            if self.job_id is None:
                self.job_id = self._find_job()
            if self.job_id is not None:
                self._xread(max_bytes, got)
                if self._remnants(got, final=False):
                    self._xread(max_bytes, got)
            if self._down:
                self._down = False
                self.stats.warnings.append(f"reconnected to {self._shown}")
        except (OSError, StoreError, ReplyError) as exc:
            self._lost()
            if not self._down:
                self._down = True
                why = str(exc) if isinstance(exc, StoreError) else f"lost the connection to {self._shown}"
                self.stats.warnings.append(f"{why}; still trying")
        carried, self._carried = self._carried, []  # (what streams started at a mark were in first)
        return carried + [e for r in sorted(got) for e in got[r]]  # what was read before any failure too

    def _remnants(self, got: dict[Stream, list[Event]], final: bool) -> bool:
        """What ranks of this job that died on this host left in their spools
        (``TraceReader.spool_remnants``): forwarded to their streams (True: read them
        again), where this reader can write, else only read."""
        job, url = self.job_id, self._url

        def writer(rank: int, inc: int) -> RedisWriter:
            return RedisWriter(url, job, rank, incarnation=inc, resume=True, connect_timeout=2.0)

        forwarded, left = self.spool_remnants(job, url, writer, final)
        for stream, evs in left.items():
            got.setdefault(stream, []).extend(evs)
        return forwarded > 0

    def _xread(self, max_bytes: int | None, got: dict[Stream, list[Event]]) -> None:
        """New entries of every stream: one XREAD per hash slot (a shard's streams share
        one), each node's sent together (``Nodes.many``)."""
        nodes = self._nodes_ok()
        job = self.job_id
        look = time.monotonic() >= self._tail_look
        ends = self._ends_changed(nodes) if look else None  # (before the streams: a writer says its end after)
        pending = self.ranks()
        self.queue_chunks()  # (the streams' clean entries decoded together, after the round)
        queued = got if self._queued is not None else None
        with gc_paused():
            try:
                left = self._xread_pages(nodes, job, pending, max_bytes, got, queued)
            finally:
                self._drain(got, again=False)
        if ends:
            self._tails({st: n for st, n in ends.items() if st not in left})  # (those read to their end)
        if look:  # (a poll that failed looks again next time)
            self._refused(nodes, self._ends_known)
            self._tail_look = time.monotonic() + self.TAIL_LOOK_S
        self._settling(nodes, got)
        self._emptying(nodes, got)

    #: seconds between a follower's looks at the ends its streams' writers said (``_tails``)
    TAIL_LOOK_S = 5.0
    _tail_look = 0.0

    def _xread_pages(self, nodes: Nodes, job: str, pending: list[Stream], max_bytes: int | None,
                     got: dict[Stream, list[Event]], queued: dict[Stream, list[Event]] | None) -> set[Stream]:
        """``_xread``'s pages: XREAD again for the streams a page filled, within the budget.
        Returns the streams not read to their end (the budget ran out)."""
        used = 0
        while pending:
            keys = {self.keys.stream(job, *st).encode(): st for st in pending}
            by_slot: dict[int, list[bytes]] = {}
            for key in keys:
                by_slot.setdefault(keyslot(key), []).append(key)
            count = self._count(len(pending), None if max_bytes is None else max_bytes - used)
            commands = [(ks[0], pack("XREAD", "COUNT", count, "STREAMS", *ks,
                                     *(self._cursor.get(keys[k], b"0-0") for k in ks)))
                        for ks in by_slot.values()]
            full = []
            began = time.time_ns()
            for reply in nodes.many(commands, Connection.read_streams):
                if isinstance(reply, ReplyError):
                    raise reply
                for key, entries in reply:
                    stream = keys.get(key)
                    if stream is None:
                        continue
                    size = self._take(stream, entries, got.setdefault(stream, []), queued)
                    used += size
                    self._read_entries += len(entries)
                    self._read_bytes += size
                    if len(entries) >= count:
                        full.append(stream)
                if self.queue_full():
                    self._drain(got)
            for st in set(pending) - set(full):
                self._read_to_end(st, began)  # (a stream XREAD left out had nothing new)
            pending = full
            if max_bytes is not None and used >= max_bytes:
                break
        return set(pending)

    #: Entries an XREAD asks of a stream at least where a poll's budget is short (``_count``)
    MIN_PAGE = 4
    #: bytes an entry is taken to hold before any is read (a block of a tick's records)
    ENTRY_BYTES = 512
    _read_entries = 0
    _read_bytes = 0

    def _count(self, streams: int, left: int | None) -> int:
        """Entries each XREAD asks of each of ``streams`` streams: ``PAGE``, or, where ``left``
        bytes are left of a poll's budget, about as many as bring that much at the mean size
        of the entries read so far (``MIN_PAGE`` at least).  A round of every stream at
        ``PAGE`` each read past the budget: a restart of a 1,024-rank console at the tail,
        each stream from its keyframe seconds back, held ~60 MB of replies at once, and
        its read process peaked at ~250 MiB."""
        if left is None:
            return self.PAGE
        mean = self._read_bytes / self._read_entries if self._read_entries else self.ENTRY_BYTES
        return int(min(self.PAGE, max(self.MIN_PAGE, left / (max(mean, 1.0) * max(streams, 1)))))

    def read_all(self) -> list[Event]:
        """Everything of the job not returned yet, rank by rank in XRANGE pages."""
        if self.job_id is None:
            self.job_id = self._find_job()
            if self.job_id is None:
                return []
        out, self._carried = self._carried, []  # (what streams started at a mark were in first)
        rest: dict[Stream, list[Event]] = {}
        self._remnants(rest, final=True)  # forwarded first: then read with the rest of the streams
        try:
            nodes = self._nodes_ok()
            ends = self._ends_said(nodes)  # (before the streams: a writer says its end after its last write)
            with gc_paused():
                for stream in self.ranks():
                    key = self.keys.stream(self.job_id, *stream)
                    began = time.time_ns()
                    while True:
                        start = self._cursor.get(stream)
                        lo = b"-" if start is None else _after(start)
                        if lo is None:  # (the last id a stream can hold was read: nothing comes after it)
                            break
                        entries = nodes.run(key, pack("XRANGE", key, lo, "+", "COUNT", self.PAGE),
                                            Connection.read_entries)
                        if not entries:
                            break
                        self._take(stream, entries, out)
                        if len(entries) < self.PAGE:
                            break
                    self._read_to_end(stream, began)
                self._tails(ends)
                self._unsettled(nodes, ends)
                self._refused(nodes, ends)
                for stream in sorted(rest):
                    out.extend(rest[stream])
        except ReplyError as exc:
            raise StoreError(f"cannot read {self.description}: Redis said: {scrub(str(exc), self.target)}") from None
        except OSError as exc:
            why = self._nodes.why(exc)
            self._lost()
            raise StoreError(f"cannot read {self.description}: {why}") from None
        return out

    def _ends_said(self, nodes: Nodes, copies: range | list[int] = range(Keys.ENDS)) -> dict[Stream, int]:
        """What each stream's writer had stored when it closed (``Keys.ends``; in ``copies``)."""
        if self.keys is not Keys:
            return {}  # (a job in the layout before hash tags: its writers never said)
        out: dict[Stream, int] = {}
        for flat in nodes.pipeline([("HGETALL", Keys.ends(self.job_id, i)) for i in copies]):
            if not isinstance(flat, list):
                raise flat if isinstance(flat, ReplyError) else ReplyError("ERR unexpected HGETALL reply")
            for i in range(0, len(flat) - 1, 2):
                stream = Keys.parse_member(flat[i])
                try:
                    stored = int(flat[i + 1])
                except ValueError:
                    continue
                if stream is not None and 0 < stored <= (1 << 62):
                    out[stream] = max(out.get(stream, 0), stored)
        return out

    def _ends_changed(self, nodes: Nodes) -> dict[Stream, int]:
        """``_ends_said`` for a follower: every copy's length and version first (``HLEN`` and
        ``HGET`` of ``Keys.ENDS_VERSION``: 2 x ``Keys.ENDS`` replies of a few bytes), and only
        the copies that changed since its last look read whole.  A live job's ends change when
        its ranks exit: a look costs what changed, not one field per rank of the job (16k
        fields every 5 s, helper h403's figure in docs/redis.md).  The length catches the
        writers before the version (they never bumped it).  Returns every end known so far."""
        if self.keys is not Keys:
            return {}
        job = self.job_id
        looks = nodes.pipeline([c for i in range(Keys.ENDS) for c in (("HLEN", Keys.ends(job, i)),
                                                                       ("HGET", Keys.ends(job, i), Keys.ENDS_VERSION))])
        for reply in looks:
            if isinstance(reply, ReplyError):
                raise reply
        states = [(looks[2 * i], looks[2 * i + 1]) for i in range(Keys.ENDS)]
        changed = [i for i, state in enumerate(states) if self._ends_seen.get(i) != state]
        if changed:
            read = self._ends_said(nodes, changed)
            known = self._ends_known
            for stream, stored in read.items():
                known[stream] = max(known.get(stream, 0), stored)
            self._ends_seen.update((i, states[i]) for i in changed)
        return self._ends_known

    def _unsettled(self, nodes: Nodes, ends: dict[Stream, int]) -> None:
        """On a cluster: the streams whose master failed over since their writer last appended
        (``Keys.via`` names a node that no longer serves slots) and that said no end: the
        replica that took over may lack the last writes, which the writer counts (a
        ``store_lost`` marker) only when it writes again.  Until then the trace is not whole
        (``ReadStats.unsettled_by_rank``: ``check`` exits 1), where before it read as a
        healthy job a few events short.  A slot moved to another master loses nothing: not
        counted.  One GET a stream, in a pipeline per node."""
        seen = self._unsettled_seen
        streams = [st for st in getattr(self, "_streams", ()) if st not in ends and st not in seen]
        if not (nodes.cluster and self.keys is Keys and streams):
            return
        for stream, via in self._failed_vias(nodes, streams).items():
            seen.add(stream)  # (once: a later read_all of this reader reads what came since)
            rank = stream[0]
            self.stats.unsettled_by_rank[rank] = self.stats.unsettled_by_rank.get(rank, 0) + 1
            self.stats.warnings.append(
                f"rank {rank}: its stream's master {via} failed over since its writer last wrote: what the replica "
                "that took over had not received is not counted until the writer writes again (it says it then; "
                "a rank that died before it never will)")

    def _refused(self, nodes: Nodes, ends: dict[Stream, int]) -> None:
        """The streams whose writers said no end and whose node is full and refuses writes
        for lack of memory (``refusing``): their last events may never have reached it, their
        exits among them (they wait in their hosts' spools), so a rank gone that way is not
        known to have lost nothing (``ReadStats.refused_by_rank``, looked at again on every
        look at the ends: a node given memory since refuses no more).  A check from another
        host read a job that wrote 14% of its ops as healthy, exit 0 (helper-197).  Not of a
        node that refused some since it started and is not full now: those refusals are the
        server's, any job's, and a job merely killed failed check over them (helper-205)."""
        streams = getattr(self, "_streams", ())
        look = self.keys is Keys and any(st not in ends for st in streams)  # (a part's streams: a shard's)
        full = {a for a, r in refusing(nodes).items() if r.now} if look else set()
        counts: dict[int, int] = {}
        for stream in streams if full else ():
            if stream not in ends and nodes.node(self.keys.stream(self.job_id, *stream)) in full:
                counts[stream[0]] = counts.get(stream[0], 0) + 1
        self.stats.refused_by_rank = counts

    def _failed_vias(self, nodes: Nodes, streams: list[Stream]) -> dict[Stream, str]:
        """Of ``streams``, those whose ``Keys.via`` names a node that serves no slot now (and
        not the stream's own): each with that node.  None said (a writer before ``via``) is
        settled, as is one that cannot be read (an error reply).  One GET a stream, in a
        pipeline per node."""
        serving = {f"{h}:{p}".encode() for h, p in nodes.masters()}
        vias = nodes.pipeline([("GET", Keys.via(self.job_id, *st)) for st in streams])
        out = {}
        for stream, via in zip(streams, vias, strict=True):
            node = nodes.node(self.keys.stream(self.job_id, *stream))
            if isinstance(via, bytes) and via not in serving and via != f"{node[0]}:{node[1]}".encode():
                out[stream] = via.decode(errors="replace")
        return out

    def _settling(self, nodes: Nodes, got: dict[Stream, list[Event]]) -> None:
        """``_unsettled`` for a follower (a console's poll): looked for on its first poll and
        whenever the cluster's masters changed since its last look (a failover: the map read
        again after a lost connection or a MOVED), not on every poll; and a stream found so is
        settled again once its writer wrote through a master that serves (its ``via`` looked
        at again only when the stream brought entries, or said its end).  Before, a console
        never looked: it showed a healthy job where ``check`` exited 1."""
        if not (nodes.cluster and self.keys is Keys):
            return
        if nodes.version != self._map_seen:  # (the map moved: its masters compared, not on every poll)
            masters = frozenset(nodes.masters())
            if masters != self._masters:
                self._unsettled(nodes, self._ends_known)
                self._masters = masters
            self._map_seen = nodes.version
        seen = self._unsettled_seen
        again = [st for st in seen if got.get(st) or st in self._ends_known]
        if not again:
            return
        still = self._failed_vias(nodes, again)
        for stream in again:
            if stream in still and stream not in self._ends_known:
                continue
            seen.discard(stream)
            rank, counts = stream[0], self.stats.unsettled_by_rank
            if counts.get(rank, 0) > 1:
                counts[rank] -= 1
            else:
                counts.pop(rank, None)

    def _emptying(self, nodes: Nodes, got: dict[Stream, list[Event]]) -> None:
        """A follower's look at what Redis still holds of the streams it read, after it
        connected again (a restart) or found fewer streams listed (a flush, the job's set gone
        with it): a stream whose top is below the entry it read last lost what it held, and
        what of it was not read yet is not known until the writer writes again (its
        ``store_lost`` marker: ``_gap`` then counts it).  Counted meanwhile
        (``ReadStats.emptied_by_rank``: the trace is not whole), and settled by the stream's
        next entry (after its top fell below what was read, only the writer's write after the
        loss comes after it).  A stream read to the end its writer said at close lost nothing
        unread.  Before, a console in that window showed a healthy job.  One XREVRANGE a
        stream, at such moments only; streams a failover left unsettled (``_settling``) are
        not counted twice."""
        seen, counts = self._emptied_seen, self.stats.emptied_by_rank
        for stream in [st for st in seen if got.get(st)]:
            seen.discard(stream)
            if counts.get(stream[0], 0) > 1:
                counts[stream[0]] -= 1
            else:
                counts.pop(stream[0], None)
        listed = len(getattr(self, "_streams", ()))
        looked, self._looked = self._looked, (self._connects, listed)
        if self._connects == looked[0] and listed >= looked[1]:
            return
        ends, last = self._ends_known, self._last
        streams = [st for st, k in last.items() if k > 0 and st not in seen and st not in self._unsettled_seen
                   and not (st in ends and ends[st] <= k)]
        if not streams:
            return
        replies = nodes.pipeline([("XREVRANGE", self.keys.stream(self.job_id, *st), "+", "-", "COUNT", 1)
                                  for st in streams])
        for stream, reply in zip(streams, replies, strict=True):
            if isinstance(reply, ReplyError):
                continue  # (not known: the next reconnect looks again)
            top = entry_number(reply[0][0]) if reply else 0
            if top >= last[stream]:
                continue
            seen.add(stream)
            rank = stream[0]
            counts[rank] = counts.get(rank, 0) + 1
            self.stats.warnings.append(
                f"rank {rank}: Redis holds less of its stream than was read (up to #{max(top, 0)} of #{last[stream]}: "
                "it restarted without persistence, or was flushed): what it lost that was not read yet is not "
                "counted until the rank's writer writes again (it says it then; a rank gone never will)")

    def _tails(self, ends: dict[Stream, int]) -> None:
        """Count what each stream's writer had stored when it closed (``ends``, read before
        the streams) past the last entry read: the tail Redis lost after it (the stream's
        master failed over before its replica had the last writes, or restarted empty),
        which no later entry shows as a gap.  Once per stream and entry count."""
        said = self._tail_said
        streams = set(getattr(self, "_streams", ()))
        for stream, stored in ends.items():
            if stream not in streams:
                continue
            last = max(self._last.get(stream, 0), said.get(stream, 0))
            if last < stored:
                said[stream] = stored
                rank, n = stream[0], stored - last
                self.missing[rank] = self.missing.get(rank, 0) + n
                self.stats.count_missing(rank, n)
                self.stats.warnings.append(
                    f"rank {rank}: its last {n} stream entries (#{last + 1}-#{stored}) were lost by Redis (its writer had "
                    f"stored {stored} when it closed; the stream holds {last}: its master failed over before its "
                    "replica had them, or restarted without persistence)")

    def _drain(self, got: dict[Stream, list[Event]], again: bool = True) -> None:
        """The queued entries decoded (``decode_queued_streams``) into ``got``; ``again``:
        queueing goes on."""
        for stream, evs in self.decode_queued_streams().items():
            got.setdefault(stream, []).extend(evs)
        if again:
            self.queue_chunks()

    def _take(self, stream: Stream, entries: list, out: list[Event],
              queued: dict[Stream, list[Event]] | None = None) -> int:
        """Decode one stream's entries into ``out``; count gaps and damaged entries.  Returns bytes.
        ``queued``: a poll's events by stream, while its chunks are queued.  Entries that are
        one line each (no newline in one, none empty: the lines of a stream's file) are queued
        as those lines, decoded with the other streams' after the round; others are decoded
        now, after what was queued before them (``_drain``)."""
        if not entries:
            return 0
        rank = stream[0]
        last = self._last.get(stream, 0)
        first_k, last_k = entry_number(entries[0][0]), entry_number(entries[-1][0])
        if first_k == last + 1 and last_k - first_k + 1 == len(entries):  # contiguous: the usual case
            values = [v or b"" for _, v in entries]
            self._last[stream] = last_k
        else:
            values = []
            for eid, v in entries:
                k = entry_number(eid)
                if k < 0:  # an entry commscope did not write
                    values.append(b"")
                    continue
                if k > last + 1:
                    self._gap(rank, last, k, is_store_lost(v or b""))
                last = max(last, k)
                values.append(v or b"")
            self._last[stream] = last
        self._cursor[stream] = entries[-1][0]
        size = sum(map(len, values))
        lines = b"\n".join(values)
        if is_store_lost(lines):  # (one search of the page: a marker is rare)
            if queued is not None:
                self._drain(queued)
            self._take_restated(stream, values, out)
            return size
        if queued is not None:
            if all(values) and lines.count(b"\n") == len(values) - 1:
                self.ingest_later(stream, lines + b"\n", size)
                return size
            self._drain(queued)
        out.extend(self.ingest(stream, values, size).events)
        return size

    def _take_restated(self, stream: Stream, values: list[bytes], out: list[Event]) -> None:
        """``_take``'s entries where they hold a ``store_lost`` marker: the writer found what it
        had stored gone and stated after it what the rank was in (``RedisWriter._restated``).
        The begins this reader read before the marker are not read twice (a stream's op ids
        grow: those up to the highest it read), what else the ops reached is, as a directory
        reader reads a carry after a jump (``DirectoryReader._carry``)."""
        at = [i for i, v in enumerate(values) if is_store_lost(v)]
        for a, b in zip([0, *at], [*at, len(values)], strict=True):
            run = values[a:b]
            if not run:
                continue
            read = self.max_op_id(stream) if a in at else -1  # (as of the marker: the runs before it read)
            got = self.ingest(stream, run, sum(map(len, run))).events
            out.extend(got if read < 0 else (e for e in got if not (
                e["type"] == "op" and e["phase"] == "begin" and e["id"] <= read)))

    def _gap(self, rank: int, last: int, k: int, reset: bool = False) -> None:
        """Entries #last+1..#k-1 are not in the stream; ``reset``: the writer found them gone
        when it reconnected (its marker is entry #k), so Redis lost them, not maxlen."""
        n = k - last - 1
        self.missing[rank] = self.missing.get(rank, 0) + n
        self.stats.count_missing(rank, n)
        maxlen = (self.job() or {}).get("maxlen")
        if reset:
            self.stats.warnings.append(f"rank {rank}: {n} stream entries (#{last + 1}-#{k - 1}) were lost by Redis "
                                       "(gone when the rank reconnected: a restart without persistence, a failover "
                                       "before the replica had them, or a flush)")
        elif last == 0:
            self.stats.trimmed = True
            cause = "trimmed by maxlen" if maxlen else "no longer in Redis (trimmed, or lost by a restart)"
            self.stats.warnings.append(f"rank {rank}: the oldest {n} stream entries are {cause}; the trace starts "
                                       f"at entry #{k}")
        elif maxlen:
            self.stats.trimmed = True
            self.stats.warnings.append(f"rank {rank}: {n} stream entries (#{last + 1}-#{k - 1}) were trimmed by "
                                       f"maxlen={maxlen} before they were read")
        else:
            self.stats.warnings.append(f"rank {rank}: {n} stream entries (#{last + 1}-#{k - 1}) are missing from the "
                                       "stream (lost by Redis, e.g. a restart without persistence)")

    def close(self) -> None:
        self._lost()


def _said(e: dict) -> tuple:
    """An event of a carry as it was stored: an op's phase, a stack (``RedisWriter._restated``)."""
    return e.get("type"), e.get("id"), e.get("phase"), e.get("ts")


def _after(entry_id: bytes) -> bytes | None:
    """The smallest stream id after ``entry_id`` (XRANGE's exclusive '(' needs Redis 6.2); None
    after the largest one (a foreign entry 0-18446744073709551615 made the next id one Redis
    refuses, 'Invalid stream ID', and the whole job unreadable: helper h203)."""
    ms, _, k = entry_id.partition(b"-")
    if int(k) < _MAX_ID:
        return b"%s-%d" % (ms, int(k) + 1)
    return b"%d-0" % (int(ms) + 1) if int(ms) < _MAX_ID else None


_MAX_ID = (1 << 64) - 1  # a stream id's parts are unsigned 64-bit


# ---------------------------------------------------------------------------- helpers
#: Reply errors that pass (a node loading its data, a cluster converging): a reader that waits
#: for its job waits through them
PASSING = ("LOADING", "CLUSTERDOWN", "TRYAGAIN", "MASTERDOWN", "BUSY")


def _layout(nodes: Nodes, job: str) -> type[Keys] | None:
    """The key layout ``job`` was written with; None when it is not there.  Raises the
    ReplyError a node gave instead of an answer (``CLUSTERDOWN``, ``LOADING``, ``NOPERM``):
    it does not say the job is not there (a job on a cluster with a node down read as "no
    job", helper-172)."""
    refused = None
    for keys in (Keys, LegacyKeys):
        replies = nodes.pipeline([("EXISTS", keys.ranks(job)), ("EXISTS", keys.meta(job))])
        if any(r == 1 for r in replies):
            return keys
        refused = refused or next((r for r in replies if isinstance(r, ReplyError)), None)
    if refused is not None:
        raise refused
    return None


def _connect(url: str) -> tuple[RedisTarget, Nodes]:
    target = parse_url(url)
    nodes = Nodes(target, target.display())
    nodes.connect()
    return target, nodes


def list_jobs(url: str) -> list[tuple[str, float]]:
    """(job id, registration time in s) for every job in the store, oldest first."""
    target, nodes = _connect(url)
    try:
        flat = nodes.call(Keys.JOBS, "ZRANGE", Keys.JOBS, 0, -1, "WITHSCORES")
    except (OSError, ReplyError) as exc:
        why = nodes.why(exc) if isinstance(exc, OSError) else scrub(str(exc), target)
        raise StoreError(f"cannot list jobs in {redact(url)}: {why}") from None
    finally:
        nodes.close()
    return [(job, float(flat[i + 1]) / 1e6) for i in range(0, len(flat), 2) if (job := _job_id(flat[i]))]


def evicting_policy(nodes: Nodes, key: str | bytes = Keys.JOBS) -> str | None:
    """The ``maxmemory-policy`` of the Redis (the node of ``key``: the jobs' index) where it evicts keys
    that have no expiry, as commscope's have none (``allkeys-*``: when full, Redis drops the
    least used keys whole, a job's index keys first, written once, then rank streams; helper
    h203 found such a trace read as "no job", its loss said nowhere); None otherwise, or where
    Redis will not say (an ACL without INFO)."""
    try:
        info = nodes.call(key, "INFO", "memory")
    except (OSError, ReplyError, StoreError):
        return None
    if not isinstance(info, bytes):
        return None
    for line in info.splitlines():
        if line.startswith(b"maxmemory_policy:"):
            policy = line.split(b":", 1)[1].strip().decode("ascii", "replace")
            return policy if policy.startswith("allkeys-") else None
    return None


#: The share of its ``maxmemory`` from which a Redis that refused writes for lack of memory
#: is said to be full (``full_nodes``; over it, it is full whatever it refused)
FULL_SHARE = 0.95


class Refusal(NamedTuple):
    """What a node that refuses writes for lack of memory says (``refusing``)."""

    words: str
    #: full now (over its ``maxmemory``, or near it having refused some): not only a count of
    #: refusals since it started, which are the server's, any job's (helper-205)
    now: bool


def full_nodes(nodes: Nodes) -> str | None:
    """What the nodes of the store that refuse writes for lack of memory say (``refusing``),
    in one line; None where none refuses, or where none says."""
    return "; ".join(r.words for r in refusing(nodes).values()) or None


def refusing(nodes: Nodes) -> dict[Address, Refusal]:
    """The nodes of the store that refuse writes for lack of memory, each with what it says:
    over its ``maxmemory`` (``INFO memory``), or near it having refused some (``INFO
    errorstats``, ``errorstat_OOM``, Redis 6.2+, since it started), or having refused some at
    all.  A Redis at its ``maxmemory`` refuses the ranks' appends, and a reader on another
    host, with no spool to see, saw only the events that never came (helper-193: exit 0 over
    89% of ops never stored, the cause said nowhere).  Not of a node that evicts keys
    (``allkeys-*``: full by design, ``evicting_policy`` says it).  Its words hold no figure
    that moves while ranks retry: a console says a warning once by its text (helper-199)."""
    said: dict[Address, Refusal] = {}
    for address, info in nodes.each_master("INFO", "memory").items():
        fields = _info_fields(info)
        if fields.get("maxmemory_policy", "").startswith("allkeys-"):
            continue
        try:
            used, most = int(fields.get("used_memory", 0)), int(fields.get("maxmemory", 0))
        except ValueError:
            continue
        errors = _info_fields(nodes.each_master("INFO", "errorstats").get(address))
        oom = dict(kv.split("=", 1) for kv in errors.get("errorstat_OOM", "").split(",") if "=" in kv)
        refused = int(oom["count"]) if oom.get("count", "").isdigit() else 0
        where = f"node {address[0]}:{address[1]} " if len(nodes.masters()) > 1 else ""
        if most and (used > most or refused and used >= FULL_SHARE * most):
            said[address] = Refusal(f"{where}is full (maxmemory {size(most)}) and refuses writes for lack of memory",
                                    True)
        elif refused:
            said[address] = Refusal(f"{where}has refused writes for lack of memory since it started (maxmemory "
                                    f"{size(most) if most else 'since raised or lifted'})", False)
    return said


def _info_fields(info: object) -> dict[str, str]:
    """An ``INFO`` reply's ``field:value`` lines (empty for anything else)."""
    if not isinstance(info, bytes):
        return {}
    text = info.decode("utf-8", "replace")
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line and not line.startswith("#"))


def _evicts(policy: str) -> str:
    return f"evicts keys when full (maxmemory-policy {policy})"


def _job_id(member: object) -> str | None:
    """A member of ``commscope:jobs`` as a job id; None for one commscope never writes."""
    try:
        job = member.decode() if isinstance(member, bytes) else None
    except UnicodeDecodeError:
        return None
    return job if is_job_name(job) else None


#: how long ``refusal`` waits for a server before leaving it to the ranks
REFUSAL_WAIT_S = 2.0


def refusal(url: str) -> str | None:
    """Why the ranks of a job could never write to the Redis at ``url`` (``Backend.refusal``):
    a wrong or missing password, a TLS setting no retry mends (``RedisTLSRefused``), a
    cluster node named with a database other than 0, or no such database.  Said before the job runs, not found by each rank while it runs
    unrecorded (helper-163).  None where they may yet: a server that does not answer now
    (down, full) is theirs to retry, as always.  A job id the store holds already is not
    refused: another node of the same job (``?job=``, ``--job``), or a replacement node,
    names it too (helper-164); a rank whose stream exists refuses to mix then."""
    try:
        given = parse_url(url)
    except StoreError as exc:
        return str(exc)
    nodes = Nodes(dataclasses.replace(given, timeout=REFUSAL_WAIT_S), given.display())
    nodes.set_deadline(time.monotonic() + REFUSAL_WAIT_S)  # (the whole of it, not each reply)
    try:
        nodes.connect()
    except (RedisAuthError, RedisTLSRefused) as exc:  # (TLS: helper-183, the job ran unrecorded)
        return str(exc)
    except StoreError as exc:
        text = str(exc)
        return text if "a Redis Cluster node, and a cluster has only database 0" in text or "no database" in text \
            else None
    except (OSError, ReplyError):
        return None
    finally:
        nodes.close()
    return None


def jobs(url: str) -> set[str] | None:
    """The ids of the jobs the store holds now; None where it cannot be asked (never raises)."""
    try:
        return {job for job, _ in list_jobs(url)}
    except Exception:  # (a store error, or a reply no job id decodes from)
        return None


def delete_job(url: str, job: str) -> int:
    """Remove a job's streams, metadata and registration; returns how many keys went."""
    target, nodes = _connect(url)
    try:
        keys = _layout(nodes, job) or Keys
        members = nodes.call(keys.ranks(job), "SMEMBERS", keys.ranks(job)) or []
        streams = filter(None, map(Keys.parse_member, members))
        names = [keys.meta(job), keys.ranks(job)] + [Keys.ends(job, i) for i in range(Keys.ENDS)] + [k for st in streams
                                                     for k in (keys.stream(job, *st), keys.marks(job, *st),
                                                               keys.frames(job, *st), keys.via(job, *st))]
        replies = nodes.pipeline([("DEL", k) for k in names])  # (one key each: a cluster's slots differ)
        nodes.call(Keys.JOBS, "ZREM", Keys.JOBS, job)
        return sum(r for r in replies if isinstance(r, int))
    except (OSError, ReplyError) as exc:
        why = nodes.why(exc) if isinstance(exc, OSError) else scrub(str(exc), target)
        raise StoreError(f"cannot delete job {job!r} in {target.display()}: {why}") from None
    finally:
        nodes.close()


__all__ = ["Connection", "Keys", "LegacyKeys", "RedisAuthError", "ReplyError", "RedisReader", "RedisWriter", "delete_job",
           "jobs", "list_jobs"]
