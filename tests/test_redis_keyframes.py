"""Keyframes of a Redis stream: marks every few seconds, taken by the writing process's keeper.

A real writer to a real redis-server names its stream to a real keeper child once it holds
``keyframes.FOLLOW_AFTER``; the child takes a keyframe every ``$COMMSCOPE_KEYFRAME_S`` that
the stream grew by ``keyframes.MIN_BYTES``, each chained on the one before; a window
(``--since``) starts at the newest one before it, with the op the rank has been in since
long before, and finds what a full read finds.  A keeper killed is started again and goes
on from its newest keyframe; a keeper never sees the URL on its command line.
"""

from __future__ import annotations

import re
import signal
import time

import orjson
import psutil
import pytest
from redis_fixture import *  # noqa: F403
from redis_fixture import _no_keeper_left, busiest_by_redis_py, filled, require_redis_server
from test_keyframes import _alive

from commscope.analysis.diagnose import default_hang_after, diagnose, trace_now
from commscope.analysis.source import load_trace, open_source
from commscope.bench.redis_server import RedisServer
from commscope.store import children, keyframes, redis_keeper, redis_marks
from commscope.store.base import StoreError
from commscope.store.cluster import DEFAULT_MAXCLIENTS, Clients, Nodes, keyslot
from commscope.store.redis_store import Keys, RedisWriter, delete_job
from commscope.store.redis_url import parse_url
from commscope.store.resp import ReplyError
from commscope.window import Since

S = 1_000_000_000
T0 = 1_780_000_000 * S
#: a bound for a failure, not a margin: each wait below is met within a second or two
BOUND_S = 120


def meta(rank: int = 0, world: int = 1) -> bytes:
    return orjson.dumps({"type": "meta", "ts": T0, "v": 3, "rank": rank, "world_size": world, "host": "h",
                         "sample_interval": 1.0})


def beat(k: int, rank: int = 0) -> bytes:
    return orjson.dumps({"type": "heartbeat", "ts": T0 + k * S, "v": 3, "rank": rank, "inflight": 1,
                         "pad": "x" * 60})


def begin(op: int, k: int, rank: int = 0) -> bytes:
    return orjson.dumps({"type": "op", "phase": "begin", "ts": T0 + k * S, "v": 3, "rank": rank, "id": op,
                         "op": "all_reduce", "group": "0", "gsize": 1, "seq": op, "tid": 1})


def frames_of(url: str, job: str, rank: int = 0) -> list[redis_marks.Mark]:
    nodes = Nodes(parse_url(url), "test")
    nodes.connect()
    try:
        key = Keys.frames(job, rank)
        return [m for m in map(redis_marks.Mark.parse, nodes.call(key, "XRANGE", key, "-", "+")) if m is not None]
    finally:
        nodes.close()


class Beats:
    """A writer's heartbeats, one second of the rank's time apart, written until a condition
    holds (polled, never timed)."""

    def __init__(self, writer: RedisWriter, k: int = 2):
        self.writer, self.k = writer, k

    def write(self, n: int) -> None:
        self.writer.write([beat(j, self.writer.rank) for j in range(self.k, self.k + n)])
        self.k += n

    def until(self, done, what: str) -> None:
        deadline = time.monotonic() + BOUND_S
        while not done():
            assert time.monotonic() < deadline, f"never: {what}"
            self.write(20)
            time.sleep(0.05)


def cmdline_of(proc: psutil.Process, module: str) -> list[str]:
    """``proc``'s command line once it runs ``module``: a child started through ``nice`` read
    an empty one once, just started, under CI's load (a check of it then failed, or passed
    for nothing)."""
    deadline = time.monotonic() + BOUND_S
    while module not in " ".join(args := proc.cmdline()):
        assert time.monotonic() < deadline, f"never: {module} in {args}"
        time.sleep(0.01)
    return args


def findings(model) -> list[dict]:
    return [f.to_json() for f in diagnose(model, trace_now(model), default_hang_after(model))]


@pytest.fixture
def every_02(monkeypatch):
    monkeypatch.setenv(keyframes.ENV_EVERY, "0.2")


def test_the_keeper_takes_keyframes_and_a_window_starts_at_one(redis_url, every_02):
    """An op begun at the rank's second 1 and still in flight: every keyframe carries it; a
    window of the last minute starts at the newest keyframe before it (no mark is that
    recent: they come every 5 minutes of the rank's time), skipping what came before, and
    reads what a full read reads."""
    w = RedisWriter(redis_url, "job", 0, {"world_size": 1}, mark_every_s=1e9)
    assert w.marks == "child" and w.keyframe_s == 0.2
    w.write([meta(), begin(7, 1)])
    beats = Beats(w)
    beats.until(lambda: w._keeper is not None and w._keeper._child is not None, "the stream named to a keeper")
    child = w._keeper._child
    args = cmdline_of(psutil.Process(child.pid), "commscope.store.redis_keeper")
    assert all(redis_url not in a for a in args)
    beats.until(lambda: len(frames_of(redis_url, "job")) >= 3, "three keyframes")
    beats.write(100)  # (100 s of the rank's time after them)
    w.close()
    assert child.wait(BOUND_S) == 0  # (its input ended: no keyframe comes after what is read here)
    frames = frames_of(redis_url, "job")
    assert [f.exact for f in frames] == [True] * len(frames)
    assert all(a.entry < b.entry and a.bytes < b.bytes for a, b in zip(frames, frames[1:], strict=False))
    for f in frames:
        carried = [orjson.loads(x) for x in f.carry.splitlines()]
        assert [(e["type"], e.get("id")) for e in carried if e["type"] in ("meta", "op")] == [("meta", None),
                                                                                            ("op", 7)]
    # (the window: from 60 s before the newest beat; a keyframe the keeper took of the last
    # 100 beats, as they came, is after its start)
    start_ms = (T0 + (beats.k - 1 - 60) * S) // 1_000_000
    before = [f for f in frames if f.ms <= start_ms]
    assert len(before) >= 3
    last = before[-1]
    assert last.ms == (T0 + (2 + last.entry - 3) * S) // 1_000_000  # (entry 3 is the rank's second 2)
    full, fr, _ = load_trace(redis_url)
    part, pr, _ = load_trace(redis_url, since=Since(ago_s=60))
    assert pr.stats.skipped_bytes == last.bytes  # (started at the newest keyframe: its bytes skipped)
    assert pr.stats.bytes + pr.stats.skipped_bytes == fr.stats.bytes
    assert len(part.inflight(0)) == len(full.inflight(0)) == 1
    got = open_source(redis_url, since=Since(ago_s=60)).read_all()
    assert [(e["type"], e.get("id")) for e in got][:3] == [("meta", None), ("group", None), ("op", 7)]
    assert len(got) == 3 + 100 + (beats.k - 102) - (last.entry - 2)  # (the carry, then what came after it)
    assert findings(part) == findings(full)


def test_a_keeper_killed_is_started_again_and_goes_on(redis_url, every_02, monkeypatch):
    """A keeper killed (out of memory, by hand) is started again by the next write that looks
    and takes keyframes on, exact, each counting the stream's bytes up to it (where its chain
    starts: ``test_a_keeper_chains_on_the_newer_of_the_stream_s_keyframe_and_mark``)."""
    monkeypatch.setattr(keyframes, "CHECK_S", 0.0)
    monkeypatch.setattr(children.Keeper, "RESPAWN_S", 0.0)
    w = RedisWriter(redis_url, "job", 0, {"world_size": 1}, mark_every_s=600)
    w.write([meta(), begin(7, 1)])
    beats = Beats(w)
    beats.until(lambda: len(frames_of(redis_url, "job")) >= 1, "a keyframe")
    keeper = w._keeper
    first = keeper._child
    first.send_signal(signal.SIGKILL)
    first.wait(60)
    had = len(frames_of(redis_url, "job"))
    beats.until(lambda: keeper._child is not first and len(frames_of(redis_url, "job")) >= had + 2,
                "keyframes from a keeper started again")
    second = keeper._child
    w.close()
    assert second is not None and second.wait(60) == 0  # (``LINGER_S`` after the last writer closed)
    frames = frames_of(redis_url, "job")
    assert all(f.exact for f in frames) and all(a.entry < b.entry for a, b in zip(frames, frames[1:], strict=False))
    # (the chain went on: each keyframe's bytes are the stream's up to it, counted afresh here)
    nodes = Nodes(parse_url(redis_url), "test")
    nodes.connect()
    try:
        key = Keys.stream("job", 0)
        sizes = [len(v[1]) for _, v in nodes.call(key, "XRANGE", key, "-", "+")]
    finally:
        nodes.close()
    assert [f.bytes for f in frames] == [sum(sizes[:f.entry]) for f in frames]


@pytest.fixture
def small_redis(tmp_path):
    """A private redis-server that takes 32 clients (``maxclients``), its URL's database
    flushed; no keeper of the test's writers left after it."""
    with RedisServer(binary=require_redis_server(), data_dir=tmp_path / "r", extra={"maxclients": 32}) as server:
        server.start()
        yield server
        _no_keeper_left()


def keeper_links(writer: RedisWriter, port: int) -> list:
    """The local ends of the connections ``writer``'s keeper holds to the Redis on ``port``."""
    keeper = psutil.Process(writer._keeper._child.pid)
    return [c.laddr for c in keeper.net_connections("tcp") if c.raddr and c.raddr[1] == port]


@pytest.mark.parametrize("world", [4, 16])
def test_a_keeper_holds_its_connection_only_where_redis_has_room_for_the_job_s_twice(small_redis, every_02, world):
    """A rank's keeper beside its writer doubles the job's clients: where a job's writers and
    keepers would take more than 7/8 of Redis's ``maxclients`` (as Redis says it: 32 here,
    so 16 ranks' 32 clients, where 4 ranks' 8 leave room) a keeper connects for a pass and
    closes after it; otherwise it holds one (a connect a pass costs Redis ~0.1 ms).  Its
    connections looked at while its writer writes on."""
    w = RedisWriter(small_redis.url, "job", 0, {"world_size": world}, mark_every_s=600)
    w.write([meta(0, world), begin(7, 1)])
    beats = Beats(w)
    beats.until(lambda: len(frames_of(small_redis.url, "job")) >= 2, "two keyframes")
    if world == 16:
        beats.until(lambda: keeper_links(w, small_redis.port) == [], "the keeper with no connection to Redis")
    held = keeper_links(w, small_redis.port)
    had = len(frames_of(small_redis.url, "job"))
    beats.until(lambda: len(frames_of(small_redis.url, "job")) >= had + 2, "keyframes after it")
    if world == 4:  # (the same connection, across passes)
        assert len(held) == 1 and keeper_links(w, small_redis.port) == held
    w.close()
    assert all(f.exact for f in frames_of(small_redis.url, "job"))


def test_a_keeper_refused_by_a_full_redis_no_longer_holds_a_connection(small_redis, every_02):
    """A Redis at ``maxclients`` (other jobs, consoles, a lower limit than the job's reckoning)
    refuses the keeper of a narrow job: from then on it connects for a pass and closes after
    it, leaving the connection it would hold to a writer starting again or a console.  Redis
    filled by the test's own clients until it refuses one, the keeper's refusal seen in
    Redis's count of them (``rejected_connections``), then room made."""
    w = RedisWriter(small_redis.url, "job", 0, {"world_size": 2}, mark_every_s=1e9)  # (no mark child refused)
    look = Nodes(parse_url(small_redis.url), "test")  # (the test's own connection, kept)
    look.connect()
    fillers = filled(small_redis)
    try:

        def rejected() -> int:
            stats = look.call(Keys.JOBS, "INFO", "stats").decode()
            return int(re.search(r"rejected_connections:(\d+)", stats).group(1))

        before = rejected()
        w.write([meta(0, 2), begin(7, 1)])
        beats = Beats(w)
        beats.until(lambda: w._keeper is not None and rejected() > before, "the keeper refused")
        assert frames_of_on(look, "job") == []
    finally:
        for s in fillers:
            s.close()
        look.close()
    beats.until(lambda: len(frames_of(small_redis.url, "job")) >= 2, "two keyframes once Redis has room")
    beats.until(lambda: keeper_links(w, small_redis.port) == [], "the keeper with no connection to Redis")
    had = len(frames_of(small_redis.url, "job"))
    beats.until(lambda: len(frames_of(small_redis.url, "job")) >= had + 2, "keyframes after it")
    w.close()
    assert all(f.exact for f in frames_of(small_redis.url, "job"))


def test_a_cluster_keeper_refused_as_full_no_longer_holds_a_connection(redis_cluster, redis_cluster_url, every_02):
    """A cluster node words its refusal "ERR max number of clients + cluster connections
    reached" (helper-162: the keeper read only one Redis's words, and held again).  The
    stream's master given 16 clients (its cluster bus links among them) and filled by the
    test, then room made."""
    look = Nodes(parse_url(redis_cluster_url), "test")
    look.connect()
    key = Keys.stream("job", 0)
    server = next(x for x in redis_cluster.servers if x.port == look.node(key)[1])
    was = redis_cluster.cli("CONFIG", "GET", "maxclients", server=server).split()[-1]
    w = RedisWriter(redis_cluster_url, "job", 0, {"world_size": 2}, mark_every_s=1e9)
    redis_cluster.cli("CONFIG", "SET", "maxclients", "16", server=server)
    fillers = []
    try:
        fillers = filled(server)

        def rejected() -> int:
            stats = look.call(key, "INFO", "stats").decode()
            return int(re.search(r"rejected_connections:(\d+)", stats).group(1))

        before = rejected()
        w.write([meta(0, 2), begin(7, 1)])
        beats = Beats(w)
        # (two refusals: where the URL's node is the stream's master, the first may be the slot
        # map's connect, which reads the map from another node and goes on; the keyframe's own
        # connect to the master is refused next, and that the keeper reads as full: a load run
        # freed Redis after the first, and the keeper held)
        beats.until(lambda: w._keeper is not None and rejected() > before + 1, "the keeper refused twice")
    finally:
        for s in fillers:
            s.close()
        redis_cluster.cli("CONFIG", "SET", "maxclients", was, server=server)
    beats.until(lambda: len(frames_of(redis_cluster_url, "job")) >= 2, "two keyframes once Redis has room")
    beats.until(lambda: keeper_links(w, server.port) == [], "the keeper with no connection to its master")
    had = len(frames_of(redis_cluster_url, "job"))
    beats.until(lambda: len(frames_of(redis_cluster_url, "job")) >= had + 2, "keyframes after it")
    w.close()
    look.close()
    assert redis_keeper.full(StoreError("cannot use x: Redis said: ERR max number of clients + cluster connections "
                                        "reached (it holds as many connections as its maxclients: ...)"))


def frames_of_on(nodes: Nodes, job: str, rank: int = 0) -> list[redis_marks.Mark]:
    """``frames_of`` on a connection already open (a full Redis takes no new one)."""
    key = Keys.frames(job, rank)
    return [m for m in map(redis_marks.Mark.parse, nodes.call(key, "XRANGE", key, "-", "+")) if m is not None]


def test_a_cluster_keeper_holds_a_connection_to_its_stream_s_master_alone(redis_cluster_url, every_02):
    """The keeper reads the slot map from the URL's node, then keyframes its streams on their
    masters: holding, it keeps only theirs (every keeper of a job also holding one to the
    URL's node would make it serve the job's ranks again)."""
    nodes = Nodes(parse_url(redis_cluster_url), "test")
    nodes.connect()
    url_node = (parse_url(redis_cluster_url).host, parse_url(redis_cluster_url).port)
    rank = next(r for r in range(1000) if nodes.node(Keys.stream("job", r)) != url_node)
    own = nodes.node(Keys.stream("job", rank))
    nodes.close()
    w = RedisWriter(redis_cluster_url, "job", rank, {"world_size": 8}, mark_every_s=600)
    w.write([meta(rank, 8), begin(7, 1, rank)])
    beats = Beats(w)
    beats.until(lambda: len(frames_of(redis_cluster_url, "job", rank)) >= 2, "two keyframes")
    keeper = psutil.Process(w._keeper._child.pid)

    def masters() -> list[int]:
        return sorted(c.raddr[1] for c in keeper.net_connections("tcp") if c.raddr)

    beats.until(lambda: masters() == [own[1]], f"the keeper connected to {own} alone")
    had = len(frames_of(redis_cluster_url, "job", rank))
    beats.until(lambda: len(frames_of(redis_cluster_url, "job", rank)) >= had + 2, "keyframes after it")
    assert masters() == [own[1]]
    w.close()


@pytest.mark.parametrize("ranks, most, held", [(4375, 10_000, True), (4376, 10_000, False), (434, 992, True),
                                               (435, 992, False), (1, 1, False)])
def test_a_job_s_keepers_hold_connections_while_its_writers_and_keepers_leave_an_eighth_spare(ranks, most, held):
    assert redis_keeper.holds(ranks, most) is held
    assert redis_keeper.room(ranks, most, 2) is held and redis_keeper.room(2 * ranks, most) is held


@pytest.mark.parametrize("job", ["job", "train", "llama-70b"])
def test_a_job_s_busiest_master_is_counted_shard_by_shard(redis_cluster_url, job):
    """A rank's stream sits in one of 256 hash slots, which split unevenly over the masters:
    13,125 ranks over three are not 4,375 on each (helper-161: 4,564 for "job"), so their
    keepers do not all hold.  Counted against redis-py's own slot map, rank by rank."""
    nodes = Nodes(parse_url(redis_cluster_url), "test")
    nodes.connect()
    try:
        for world in (1, 7, 256, 300, 13_125):
            assert redis_keeper.busiest(nodes, job, world) == busiest_by_redis_py(redis_cluster_url, job, world)
        assert redis_keeper.busiest(nodes, job, 13_125) > 13_125 // 3
        assert not redis_keeper.holds(redis_keeper.busiest(nodes, job, 13_125), 10_000)
    finally:
        nodes.close()


def test_a_keeper_holding_lets_go_once_redis_s_clients_pass_seven_eighths(small_redis, every_02):
    """Other jobs or consoles may fill Redis after a keeper started holding: it asks Redis's
    clients every ``LOOK_PERIODS`` periods and, past 7/8 of ``maxclients``, connects for each
    pass from then on.  Redis filled by the test's clients once the keeper holds."""
    w = RedisWriter(small_redis.url, "job", 0, {"world_size": 2}, mark_every_s=1e9)
    w.write([meta(0, 2), begin(7, 1)])
    beats = Beats(w)
    beats.until(lambda: len(frames_of(small_redis.url, "job")) >= 2, "two keyframes")
    beats.until(lambda: len(keeper_links(w, small_redis.port)) == 1, "the keeper holding its connection")
    fillers = filled(small_redis)
    try:
        beats.until(lambda: keeper_links(w, small_redis.port) == [], "the keeper letting go")
    finally:
        for s in fillers:
            s.close()
    had = len(frames_of(small_redis.url, "job"))
    beats.until(lambda: len(frames_of(small_redis.url, "job")) >= had + 2, "keyframes after it")
    beats.until(lambda: keeper_links(w, small_redis.port) == [], "the keeper with no connection between passes")
    w.close()
    assert all(f.exact for f in frames_of(small_redis.url, "job"))


@pytest.mark.parametrize("config, said", [({"maxclients": 123}, (1, 123, True)),
                                          ({"maxclients": 77, "rename-command": 'INFO ""'}, (None, 77, True)),
                                          ({"maxclients": 77, "user": "default on nopass ~* &* +@all -info -config"},
                                           (None, DEFAULT_MAXCLIENTS, False))])
def test_redis_s_clients_are_read_as_it_says_them(tmp_path, config, said):
    """``INFO clients`` (Redis 7): the clients connected (the test's one) and ``maxclients``;
    ``CONFIG GET`` where INFO is not there (before Redis 7, or renamed); Redis's default
    where an ACL allows neither, said to be assumed."""
    with RedisServer(binary=require_redis_server(), data_dir=tmp_path / "r", extra=config) as server:
        server.start()
        nodes = Nodes(parse_url(server.url), "test")
        nodes.connect()
        try:
            assert nodes.clients(Keys.JOBS) == Clients(*said)
        finally:
            nodes.close()


def test_keyframes_off_start_no_keeper(redis_url, monkeypatch):
    monkeypatch.setenv(keyframes.ENV_EVERY, "off")
    w = RedisWriter(redis_url, "job", 0, {"world_size": 1}, mark_every_s=600)
    w.write([meta()])
    Beats(w).write(1000)  # (90 KB: past FOLLOW_AFTER)
    w.close()
    assert w.keyframe_s is None and w._keeper is None and frames_of(redis_url, "job") == []


def test_a_forwarder_and_a_synthetic_job_take_no_keyframes(redis_url, every_02):
    assert RedisWriter(redis_url, "job", 0, {"world_size": 1}, marks="off").keyframe_s is None
    assert RedisWriter(redis_url, "job", 1, {"world_size": 2}, frames=False).keyframe_s is None


@pytest.mark.parametrize("line", [b"3 0", b"3 2", b"0 0"])
def test_a_keeper_s_command_is_a_stream(line):
    rank, inc = map(int, line.split())
    assert redis_keeper.named(line) == (rank, inc)


@pytest.mark.parametrize("line", [b"", b"3", b"03 0", b"3 00", b"-1 0", b"3 -1", b"3 1000000", b"100000000 0",
                                  b"3 0 x", b"a b", b" 3 0"])
def test_a_keeper_passes_over_a_command_that_is_not_a_stream(line):
    assert redis_keeper.named(line) is None


def test_a_cluster_keeps_keyframes_in_the_stream_s_slot_and_delete_removes_them(redis_cluster_url, every_02):
    assert all(keyslot(Keys.frames("j", r, i)) == keyslot(Keys.stream("j", r, i)) for r in range(300) for i in (0, 2))
    writers = [RedisWriter(redis_cluster_url, "job", r, {"world_size": 4}, mark_every_s=600) for r in range(4)]
    for r, w in enumerate(writers):
        w.write([meta(r, 4), begin(7, 1, r)])
    beats = [Beats(w) for w in writers]

    def all_framed() -> bool:
        for b in beats[1:]:
            b.write(20)
        return all(frames_of(redis_cluster_url, "job", r) for r in range(4))

    beats[0].until(all_framed, "a keyframe of each rank")
    assert writers[0]._keeper is writers[3]._keeper  # (one a process and job)
    for w in writers:
        w.close()
    delete_job(redis_cluster_url, "job")
    client = cluster_client(redis_cluster_url)  # noqa: F405
    try:
        assert not client.keys("commscope:*", target_nodes="all")
    finally:
        client.close()


def test_a_mark_taken_as_its_job_is_deleted_leaves_no_key(redis_url):
    """A mark child that read its stream before ``delete_job`` and appends after it left a
    marks key no one deletes (a load run's failure of the cluster test below): a mark, as a
    keyframe, is appended only while its stream is there."""
    w = RedisWriter(redis_url, "job", 0, {"world_size": 1}, marks="off")
    w.write([meta(), begin(7, 1)])
    w.close()
    nodes = Nodes(parse_url(redis_url), "test")
    nodes.connect()
    try:
        stream, marks = Keys.stream("job", 0).encode(), Keys.marks("job", 0).encode()
        mark = redis_marks.following(nodes, stream, None, 0)
        assert mark is not None
        delete_job(redis_url, "job")
        redis_marks.add(nodes, marks, stream, mark, redis_marks.MARKS_KEPT)
        assert nodes.call(marks, "EXISTS", marks) == 0
    finally:
        nodes.close()


@pytest.mark.parametrize("newer", ["frame", "mark"])
def test_a_keeper_chains_on_the_newer_of_the_stream_s_keyframe_and_mark(redis_url, newer):
    """A keeper (started again, or told a stream another process wrote before) starts its
    chain at what the store says the rank was in: the newest keyframe or mark, whichever
    comes later in the stream; never the stream's start.  Each here carries an op the
    stream's own entries never began (id 70 or 71): the next keyframe still holds it."""
    w = RedisWriter(redis_url, "job", 0, {"world_size": 1}, marks="off")
    w.write([meta(), begin(7, 1)])
    beats = Beats(w)
    beats.write(10)
    nodes = Nodes(parse_url(redis_url), "test")
    nodes.connect()
    try:
        planted = {}
        for key, entry, op in ((Keys.frames("job", 0), 6 if newer == "mark" else 9, 70),
                               (Keys.marks("job", 0), 9 if newer == "mark" else 6, 71)):
            carry = meta() + b"\n" + begin(op, 1) + b"\n"
            mark = redis_marks.Mark(entry, T0 // 1_000_000 + entry, 1000 * entry, True, carry)
            redis_marks.add(nodes, key.encode(), Keys.stream("job", 0).encode(), mark, redis_marks.FRAMES_KEPT)
            planted[op] = entry
        beats.write(200)  # (18 KB: past MIN_BYTES)
        f = redis_marks.Framed("job", (0, 0))
        redis_marks.frame(nodes, f)
        got = redis_marks.newest(nodes, Keys.frames("job", 0))
    finally:
        nodes.close()
        w.close()
    chained = 71 if newer == "mark" else 70
    assert got is not None and got == f.last and got.entry == 2 + 210
    ops = [orjson.loads(x).get("id") for x in got.carry.splitlines() if b'"op"' in x]
    assert ops == [chained]  # (not 7: begun in an entry before the chain's start, nor the other's)
    sizes = sum(len(beat(j)) for j in range(planted[chained], 212))  # (entry e > 2 is beat e - 1)
    assert got.bytes == 1000 * planted[chained] + sizes


def test_a_stream_that_grew_by_less_than_min_bytes_gets_no_keyframe(redis_url):
    w = RedisWriter(redis_url, "job", 0, {"world_size": 1}, marks="off")
    w.write([meta()])
    beats = Beats(w)
    nodes = Nodes(parse_url(redis_url), "test")
    nodes.connect()
    try:
        f = redis_marks.Framed("job", (0, 0))
        beats.write(50)  # (~4.5 KB)
        redis_marks.frame(nodes, f)
        assert f.last is None and frames_of(redis_url, "job") == []
        beats.write(50)
        redis_marks.frame(nodes, f)
        assert f.last is not None and f.last.entry == 101 and len(frames_of(redis_url, "job")) == 1
    finally:
        nodes.close()
        w.close()


@pytest.mark.parametrize("lost, frame_lost", [(range(150, 223), True), (range(203, 223), False),
                                              (range(103, 223), True)])
def test_a_keeper_whose_stream_redis_lost_the_tail_of_goes_on_exact(redis_url, lost, frame_lost):
    """Redis loses a stream's tail (a failover to a replica behind, a restart from an older
    save: here the newest entries deleted, and the newest keyframe with them or not).  The
    writer states the loss and restates only the ops whose begins went with it; op 7 began at
    entry 2, which Redis still holds.  Going on from its kept keyframe, lost with the tail,
    the keeper's next one was inexact and lacked op 7, and a window starting there lost the
    hang (helper-155); it now finds its keyframe gone (``Gone``) and starts again at the
    store's newest keyframe.  Where that keyframe's entry is the tail's last one left (kept,
    or found again), the gap after it was taken for entries trimmed, and op 7 dropped the
    same way (helper-156); a gap the writer stated now keeps what the keyframe says.  Either
    way: exact, op 7 in flight, as a full read says."""
    w = RedisWriter(redis_url, "job", 0, {"world_size": 1}, marks="inline", mark_every_s=1e9, frames=False)
    w.write([meta(), begin(7, 1)])  # (entries 1, 2)
    beats = Beats(w)
    nodes = Nodes(parse_url(redis_url), "test")
    nodes.connect()
    client = redis_client(redis_url)  # noqa: F405
    try:
        f = redis_marks.Framed("job", (0, 0))
        beats.write(100)
        redis_marks.frame(nodes, f)
        beats.write(100)
        redis_marks.frame(nodes, f)
        assert [m.entry for m in frames_of(redis_url, "job")] == [102, 202]
        beats.write(20)  # (223..: not keyframed yet)
        key, frames = Keys.stream("job", 0), Keys.frames("job", 0)
        client.xdel(key, *[f"0-{e}" for e in lost])
        if frame_lost:
            client.xdel(frames, client.xrevrange(frames, "+", "-", count=1)[0][0])
        beats.write(150)  # (the writer finds the loss: a store_lost marker, its meta, what it restates)
        redis_marks.frame(nodes, f)
        got = redis_marks.newest(nodes, frames)
    finally:
        client.close()
        nodes.close()
        w.close()
    assert got is not None and got == f.last and got.exact and got.entry > 223
    carried = [orjson.loads(x) for x in got.carry.splitlines()]
    assert [e["id"] for e in carried if e["type"] == "op"] == [7]
    full, _, _ = load_trace(redis_url)
    part, pr, _ = load_trace(redis_url, since=Since(ago_s=60))
    assert len(part.inflight(0)) == len(full.inflight(0)) == 1
    assert not any("trimmed by maxlen" in x for x in pr.stats.warnings), pr.stats.warnings


def test_a_keeper_refused_by_redis_goes_on_once_it_takes_writes_again(redis_url, redis_server):
    """Redis out of memory (a cluster failing over, a read-only replica: any refusal) refuses
    a keyframe; the keeper's loop tries the stream again a period later, not never (it
    dropped the stream for good on any error reply: helper-155)."""
    import os
    import threading

    w = RedisWriter(redis_url, "job", 0, {"world_size": 1}, marks="off")
    w.write([meta()])
    beats = Beats(w)
    beats.write(100)
    client = redis_client(redis_url)  # noqa: F405
    read_end, write_end = os.pipe()
    loop = threading.Thread(target=redis_keeper.keep, args=(redis_url, "job", os.fdopen(read_end, "rb"), 0.1),
                            daemon=True)
    def refusals() -> int:
        return client.info("errorstats").get("errorstat_OOM", {}).get("count", 0)

    before = refusals()
    try:
        client.config_set("maxmemory", 1)  # (every write refused: OOM)
        os.write(write_end, b"0 0\n")
        loop.start()
        refused = time.monotonic() + BOUND_S
        while refusals() < before + 2:
            assert time.monotonic() < refused, "never: two keyframes refused"
            time.sleep(0.05)
        assert frames_of(redis_url, "job") == []
    finally:
        client.config_set("maxmemory", 0)
    deadline = time.monotonic() + BOUND_S
    while not frames_of(redis_url, "job"):
        assert time.monotonic() < deadline, "never: a keyframe once Redis took writes again"
        time.sleep(0.05)
    os.close(write_end)
    loop.join(BOUND_S)
    assert not loop.is_alive()
    client.close()
    w.close()


_KILLED_WRITER = """
import os, sys, time
sys.path.insert(0, {tests!r})
from test_redis_keyframes import beat, begin, meta
from commscope.store.redis_store import RedisWriter
w = RedisWriter({url!r}, "job", 0, {{"world_size": 1}}, mark_every_s=1e9)
w.write([meta(), begin(7, 1)])
k = 2
while w._keeper is None or w._keeper._child is None:
    w.write([beat(j) for j in range(k, k + 20)])
    k += 20
print(w._keeper._child.pid, flush=True)
while True:
    w.write([beat(j) for j in range(k, k + 20)])
    k += 20
    time.sleep(0.01)
"""


def test_a_keeper_ends_when_its_writing_process_is_killed(redis_url, every_02):
    """A rank killed (SIGKILL: no ``close``) leaves no keeper behind: its commands end with the
    process (the pipe's last writer gone), and it exits, having taken keyframes meanwhile."""
    import subprocess
    import sys
    from pathlib import Path

    code = _KILLED_WRITER.format(tests=str(Path(__file__).parent), url=redis_url)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        keeper = psutil.Process(int(proc.stdout.readline()))
        cmdline_of(keeper, "commscope.store.redis_keeper")
        deadline = time.monotonic() + BOUND_S
        while not frames_of(redis_url, "job"):
            assert time.monotonic() < deadline, "never: a keyframe"
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(60)
    deadline = time.monotonic() + BOUND_S
    while _alive(keeper):
        assert time.monotonic() < deadline, "never: the keeper ended"
        time.sleep(0.05)



def test_a_keyframe_checked_reads_every_page_after_its_base(redis_url, monkeypatch):
    """The page that reads a kept keyframe's own entry (``check``) is a full page before its
    first entry is set aside: the step goes on to the next page, to the stream's top (it
    stopped one entry short of a page, and a stream growing faster never caught up:
    helper-156)."""
    monkeypatch.setattr(redis_marks, "PAGE", 5)
    w = RedisWriter(redis_url, "job", 0, {"world_size": 1}, marks="off")
    w.write([meta()])
    beats = Beats(w)
    beats.write(100)
    nodes = Nodes(parse_url(redis_url), "test")
    nodes.connect()
    try:
        key = Keys.stream("job", 0).encode()
        base = redis_marks.following(nodes, key, None, 0)
        beats.write(100)
        got = redis_marks.following(nodes, key, base, 0, check=True)
    finally:
        nodes.close()
        w.close()
    assert base is not None and base.entry == 101 and base.exact
    assert got is not None and got.entry == 201 and got.exact


@pytest.mark.parametrize("where", ["redis_url", "redis_cluster_url"])
def test_a_benchs_count_of_keyframes_counts_those_a_stream_trimmed(where, request):
    """``bench scale`` takes a node's keyframes (a keeper's script each) out of its appends by
    how many each node took (``frames_by_node``): every one added, not only the newest a
    stream keeps (its trim: a run longer than ~17 minutes), and none for a rank with none;
    on a cluster, each at its key's node (helper-157: routed by XINFO's "STREAM", every key
    but those of one node kept being redirected)."""
    from commscope.bench.scale import frames_by_node

    url = request.getfixturevalue(where)
    target = parse_url(url)
    nodes = Nodes(target, target.display())
    nodes.connect()
    want: dict[str, int] = {}
    try:
        for rank, n in ((0, 10), (1, 3), (2, 0), (3, 6), (4, 7), (5, 1)):
            key = Keys.frames("job", rank)
            for _ in range(n):
                nodes.call(key, "XADD", key, "MAXLEN", "4", "*", "f", "v")
            if n:
                host, port = nodes.node(key)
                want[f"{host}:{port}"] = want.get(f"{host}:{port}", 0) + n
        assert nodes.call(Keys.frames("job", 0), "XLEN", Keys.frames("job", 0)) == 4  # (trimmed)
    finally:
        nodes.close()
    if where == "redis_cluster_url":
        assert len(want) > 1  # (the ranks' keys on several masters)
    assert frames_by_node(url, "job", 6) == want


def test_a_key_of_another_type_is_told_as_redis_6_and_7_say_it(redis_url):
    """The keeper stops following a stream whose keyframes' key is not a stream: Redis 7 says
    it as the script's command said it, Redis 6 wrapped in "ERR Error running script"
    (helper-156: that one was retried every period for good); other refusals are not it."""
    target = parse_url(redis_url)
    nodes = Nodes(target, target.display())
    nodes.connect()
    try:
        nodes.call(b"frames", "SET", b"frames", b"not a stream")
        nodes.call(b"stream", "XADD", b"stream", "0-1", "e", "x")
        with pytest.raises(ReplyError) as e:  # (this server's own words, from inside the script)
            nodes.call(b"frames", "EVAL", redis_marks.ADD_MARK, 2, b"frames", b"stream", 4, "*", "k", "1")
    finally:
        nodes.close()
    assert redis_keeper.wrong_type(e.value)
    assert redis_keeper.wrong_type(ReplyError(
        "ERR Error running script (call to f_0123abcd): @user_script:1: WRONGTYPE Operation against a key "
        "holding the wrong kind of value"))
    assert not redis_keeper.wrong_type(ReplyError("OOM command not allowed when used memory > 'maxmemory'."))
    assert not redis_keeper.wrong_type(ReplyError("ERR no WRONGTYPEs here"))


@pytest.mark.parametrize("argv, code", [(["job", "0.2", "4096"], 0), (["job", "0.2", "hold"], 0),
                                        (["job", "0.2", "close"], 0), (["job", "0.2"], 0), (["job", "0.2", "0"], 2),
                                        (["job", "0.2", "-3"], 2), (["job", "0.2", "maybe"], 2), (["job"], 2),
                                        (["job", "0.2", "4", "x"], 2)])
def test_a_keeper_s_command_line_is_read_strictly_and_an_older_writer_s_still_starts_one(argv, code, monkeypatch):
    """A writer of before (a job running while the package was upgraded under it) starts its
    keeper with two arguments, or "hold" or "close": it holds its connection, or not, as
    then (helper-160: it exited 2 every 30 s and the job took no keyframes, silently)."""
    monkeypatch.setattr(redis_keeper.os, "read", lambda fd, n: b"")  # (its standard input ended at once)
    assert redis_keeper.main(argv) == code


def test_a_keeper_told_a_stream_is_done_keyframes_it_no_more(redis_url):
    """A process writing rank after rank (``commscope copy`` into Redis) keeps one keeper,
    which is told each closed stream is done (``children.end_line``) and stops following it:
    rank 1, followed after rank 0 was done, gets its keyframe alone.  Before, every stream a
    process ever wrote was followed until the process ended (each keeper ended with the
    writer that closed, and the next writer started another)."""
    import os
    import threading

    writers = [RedisWriter(redis_url, "job", r, {"world_size": 2}, marks="off") for r in (0, 1)]
    for w in writers:
        w.write([meta(w.rank, 2)])
        Beats(w).write(100)
    read_end, write_end = os.pipe()
    loop = threading.Thread(target=redis_keeper.keep, args=(redis_url, "job", os.fdopen(read_end, "rb"), 0.1),
                            daemon=True)
    os.write(write_end, b"0 0\n" + children.end_line((0, 0)) + b"1 0\n")  # (one write: read as one batch)
    loop.start()
    deadline = time.monotonic() + BOUND_S
    while not frames_of(redis_url, "job", 1):
        assert time.monotonic() < deadline, "never: rank 1's keyframe"
        time.sleep(0.05)
    assert frames_of(redis_url, "job", 0) == []
    os.close(write_end)
    loop.join(BOUND_S)
    assert not loop.is_alive()
    for w in writers:
        w.close()
