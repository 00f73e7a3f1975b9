"""The Redis store on a real Redis Cluster of three masters (the contract itself runs in
test_store_contract.py): keys spread over every master, any node's URL works, slots that
move while a job writes and a console reads (ASK, then MOVED) lose and repeat nothing, an
ACL user that may not read the slot map still works, and jobs written before hash tags are
still read."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis
from redis_fixture import *  # noqa: F403  (the redis_cluster, redis_cluster_url, redis_url fixtures)
from redis_fixture import cluster_client, redis_client

from commscope import events as E
from commscope.store import StoreError, open_reader, open_writer
from commscope.store.cluster import keyslot
from commscope.store.redis_store import Keys, LegacyKeys, RedisWriter, delete_job, list_jobs


def ev(rank: int, i: int) -> dict:
    return {"v": 1, "type": "op", "rank": rank, "ts": 1000 + i, "phase": "begin", "id": i, "op": "all_reduce",
            "group": "0", "seq": i, "site": "train.py:42 in step"}


def batch(rank: int, lo: int, hi: int) -> list[bytes]:
    return [E.encode(ev(rank, i)) for i in range(lo, hi)]


def ids(events: list[dict]) -> list[tuple[int, int]]:
    return [(e["rank"], e["id"]) for e in events if e["type"] == "op"]


def node(cluster, port: int) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=port, protocol=2)


def test_a_jobs_streams_spread_over_every_master_and_any_node_reads_them(redis_cluster, redis_cluster_url):
    ranks = 64
    writers = [open_writer(redis_cluster_url, "wide", r, {"world_size": ranks} if r == 0 else None)
               for r in range(ranks)]
    for r, w in enumerate(writers):
        w.write(batch(r, 1, 4))
    streams = [Keys.stream("wide", r) for r in range(ranks)]
    assert (streams[3], Keys.meta("wide"), Keys.stream("wide", 259, 1)) == \
        ("commscope:{wide/3}:rank:3", "commscope:{wide}:meta", "commscope:{wide/3}:rank:259+1")
    assert len({keyslot(k) for k in streams}) == ranks  # one shard each: 64 slots
    assert keyslot(Keys.meta("wide")) == keyslot(Keys.ranks("wide"))  # a job's own keys together
    c = cluster_client(redis_cluster_url)
    assert all(c.cluster_keyslot(k) == keyslot(k) for k in streams)
    held = [node(redis_cluster, s.port).dbsize() for s in redis_cluster.servers]
    assert all(n > 0 for n in held) and sum(n for n in held) >= ranks + 2, held
    other = f"redis://127.0.0.1:{redis_cluster.servers[2].port}/0"  # not the node writers were given
    reader = open_reader(other)
    assert reader.job() == {"world_size": ranks, "job": "wide"}
    got = reader.read_all()
    assert ids(got) == [(r, i) for r in range(ranks) for i in range(1, 4)]
    assert reader.count() == 3 * ranks
    live = open_reader(other)
    assert sorted(ids(live.poll())) == sorted(ids(got))
    for r, w in enumerate(writers):
        w.write(batch(r, 4, 5))
    assert sorted(ids(live.poll())) == [(r, 4) for r in range(ranks)]  # only what is new
    assert len(live._nodes.masters()) == 3  # one connection per master
    assert [j for j, _ in list_jobs(other)] == ["wide"]
    assert delete_job(other, "wide") == 2 * ranks + 2  # (each stream and the master its writer said: Keys.via)
    assert [node(redis_cluster, s.port).dbsize() for s in redis_cluster.servers] == [0, 0, 0]
    assert list_jobs(other) == []


def test_streams_trimmed_or_losing_entries_on_every_master_are_counted_as_on_one_redis(redis_cluster,
                                                                                        redis_cluster_url):
    """``maxlen`` trims each rank's stream on whichever master holds it, and entries gone from
    the middle of a stream (what a master without persistence may lose) are counted as lost:
    the reader says so per rank, as on a single Redis (test_redis_store)."""
    ranks = 6
    writers = [open_writer(redis_cluster_url + "?maxlen=100", "trim", r, {"world_size": ranks} if r == 0 else None)
               for r in range(ranks)]
    for a in range(1, 2001, 100):
        for r, w in enumerate(writers):
            w.write(batch(r, a, a + 100))
    streams = [Keys.stream("trim", r) for r in range(ranks)]
    c = cluster_client(redis_cluster_url)
    on = {c.cluster_keyslot(k) for k in streams}
    masters = {port for port in (c.get_node_from_key(k).port for k in streams)}
    assert len(on) == ranks and len(masters) == 3  # (every master holds some)
    assert all(c.xlen(k) < 400 for k in streams)  # approximate trimming: whole macro nodes go
    c.xdel(Keys.stream("trim", 5), "0-1990", "0-1991")  # (entry numbers are the events' order: two of the newest)
    reader = open_reader(redis_cluster_url)
    got = reader.read_all()
    firsts = {}
    for r in range(ranks):
        mine = [e["id"] for e in got if e["type"] == "op" and e["rank"] == r]
        firsts[r] = mine[0]
        want = [i for i in range(mine[0], 2001) if r != 5 or i not in (1990, 1991)]
        assert mine == want and mine[0] > 1, r  # the newest, contiguous but for the two taken
    assert reader.stats.trimmed and reader.missing == {r: firsts[r] - 1 + 2 * (r == 5) for r in range(ranks)}
    assert any("trimmed by maxlen" in m for m in reader.stats.warnings)
    assert reader.job()["maxlen"] == 100


def test_a_cluster_url_with_another_database_is_refused_clearly(redis_cluster, redis_cluster_url):
    with pytest.raises(StoreError, match="Redis Cluster node.*database 0"):
        open_writer(redis_cluster_url[:-1] + "3", "db3", 0)


def _migrate_start(cluster, key: str) -> tuple[redis.Redis, redis.Redis, str, int]:
    """Begin moving ``key``'s slot to another master and move its keys (``key``, and what
    else of its stream the slot holds, as a resharding moves every key of the slot): the
    source then answers ASK for them.  Returns (source, target, target id, slot)."""
    c = cluster_client(cluster.url)
    slot = keyslot(key)
    owner = c.get_node_from_key(key)
    src = node(cluster, owner.port)
    dst_port = next(s.port for s in cluster.servers if s.port != owner.port)
    dst = node(cluster, dst_port)
    src_id, dst_id = src.execute_command("CLUSTER MYID").decode(), dst.execute_command("CLUSTER MYID").decode()
    dst.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", src_id)
    src.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", dst_id)
    keys = src.execute_command("CLUSTER GETKEYSINSLOT", slot, 1000)
    assert key in keys
    src.execute_command("MIGRATE", "127.0.0.1", dst_port, "", 0, 5000, "KEYS", *keys)
    return src, dst, dst_id, slot


def test_slots_moving_while_a_job_writes_and_a_console_reads_lose_and_repeat_nothing(redis_cluster,
                                                                                     redis_cluster_url):
    w0 = open_writer(redis_cluster_url, "moving", 0, {"world_size": 2})
    w1 = open_writer(redis_cluster_url, "moving", 1)
    w0.write(batch(0, 1, 3))
    w1.write(batch(1, 1, 3))
    live = open_reader(redis_cluster_url)
    seen = ids(live.poll())
    key = Keys.stream("moving", 0)
    src, dst, dst_id, slot = _migrate_start(redis_cluster, key)
    w0.write(batch(0, 3, 5))  # the key is on the target already: ASK, followed
    seen += ids(live.poll())
    asked = dst.pipeline(transaction=False)
    asked.execute_command("ASKING")
    asked.xlen(key)
    assert asked.execute()[1] == 4 and src.execute_command("CLUSTER COUNTKEYSINSLOT", slot) == 0  # all moved
    for server in redis_cluster.servers:  # the move finished: every node says so (MOVED)
        node(redis_cluster, server.port).execute_command("CLUSTER SETSLOT", slot, "NODE", dst_id)
    w0.write(batch(0, 5, 7))
    w1.write(batch(1, 3, 5))
    # one connection, to the stream's new master (before, the old one stayed open too: after
    # a resharding, a wide job's ranks held one to every master their slots had been on); its
    # last command an append, or the master it now appends through said (``Keys.via``)
    clients = [sum(1 for c in node(redis_cluster, s.port).client_list() if c["name"] == "" and
                   int(c["id"]) > 0 and c["cmd"] in ("eval", "asking", "set")) for s in redis_cluster.servers]
    assert list(w0._nodes._conns) == [w0._nodes.node(key)] and sum(clients) == 2, clients  # (w0's and w1's)
    seen += ids(live.poll())
    expect = [(0, i) for i in range(1, 7)] + [(1, i) for i in range(1, 5)]
    assert sorted(seen) == expect and len(seen) == len(expect)  # nothing lost, nothing twice
    whole = open_reader(redis_cluster_url)
    assert ids(whole.read_all()) == expect and whole.missing == {} and not whole.stats.trimmed


def test_an_acl_user_without_the_slot_map_learns_slots_from_redirections(redis_cluster, redis_cluster_url):
    """The ACL docs/security.md gives (no ``cluster|slots``): each MOVED teaches one slot."""
    for server in redis_cluster.servers:
        node(redis_cluster, server.port).execute_command(
            "ACL", "SETUSER", "team", "on", ">long-random-password", "~commscope:*", "+@read", "+@write",
            "+@stream", "+@keyspace", "+@connection", "+@scripting", "-@dangerous")
    try:
        url = redis_cluster_url.replace("redis://", "redis://team:long-random-password@")
        writers = [open_writer(url, "acl", r, {"world_size": 8} if r == 0 else None) for r in range(8)]
        for r, w in enumerate(writers):
            w.write(batch(r, 1, 3))
        reader = open_reader(url)
        assert ids(reader.read_all()) == [(r, i) for r in range(8) for i in range(1, 3)]
        assert reader._nodes.cluster and len(reader._nodes.masters()) == 3
        reader._lost()  # a dropped connection: connecting again, it still may not read the map
        for r, w in enumerate(writers):
            w._drop()  # the writers too
            w.write(batch(r, 3, 4))
        assert sorted(ids(reader.poll())) == [(r, 3) for r in range(8)]
    finally:
        for server in redis_cluster.servers:
            node(redis_cluster, server.port).execute_command("ACL", "DELUSER", "team")


def test_a_job_written_before_hash_tags_is_still_read_and_deleted(redis_url):
    c = redis_client(redis_url)
    c.zadd(Keys.JOBS, {"old": 1})
    c.set(LegacyKeys.meta("old"), b'{"world_size":2,"job":"old"}')
    c.sadd(LegacyKeys.ranks("old"), "0", "1")
    for r in range(2):
        for i in range(1, 4):
            c.xadd(LegacyKeys.stream("old", r), {"e": E.encode(ev(r, i))}, id=f"0-{i}")
    assert LegacyKeys.stream("old", 1) == "commscope:old:rank:1" != Keys.stream("old", 1)
    reader = open_reader(redis_url)  # the newest job, in the old layout
    assert reader.job() == {"world_size": 2, "job": "old"}
    assert ids(reader.read_all()) == [(r, i) for r in range(2) for i in range(1, 4)]
    assert ids(open_reader(redis_url + "?job=old").poll()) == [(r, i) for r in range(2) for i in range(1, 4)]
    assert delete_job(redis_url, "old") == 4
    assert c.keys("commscope:*") == []


def _replica_of(master: redis.Redis) -> int:
    """The port of ``master``'s replica (INFO replication: slave0:ip=...,port=...)."""
    info = master.info("replication")
    return int(info["slave0"]["port"])


def _writing_to_its_master(cluster: Any, job: str, first: list[bytes] | None = None) -> tuple[str, int, Any]:
    """Rank 0's stream of ``job`` (its key), the port of the master that holds it, and a
    writer given that node's URL, having written ``first`` (entries 1-10 unless given)."""
    key = Keys.stream(job, 0)
    port = cluster_client(cluster.url).get_node_from_key(key).port
    w = open_writer(f"redis://127.0.0.1:{port}/0", job, 0, {"world_size": 1})
    w.write(batch(0, 1, 11) if first is None else first)
    return key, port, w


def _written_once_it_lands(w: Any, entries: list[bytes], deadline: float) -> None:
    """What the recorder does after a failover: retry ``entries`` until the new master takes
    them (a failed write lands nothing)."""
    while True:
        try:
            w.write(entries)
            return
        except StoreError as exc:
            assert exc.written == 0
            assert time.monotonic() < deadline, "the writer never reached the new master"
            time.sleep(0.2)


def _settled(cluster: Any, deadline: float) -> None:
    """Wait until every node alive says the cluster is ok (each says CLUSTERDOWN until its
    view of a failover converges, and a reader asks the node of each key)."""
    nodes = [node(cluster, s.port) for s in cluster.servers if s.running]
    while any(n.execute_command("CLUSTER INFO").get("cluster_state") != "ok" for n in nodes):
        assert time.monotonic() < deadline, "the cluster never settled after the failover"
        time.sleep(0.2)


def _failed_over(cluster: Any, port: int, replica: Any) -> redis.Redis:
    """Kill the master on ``port``, resume its stopped ``replica`` and wait until it took over
    and the cluster settled (``_settled``): the promoted node."""
    import os
    import signal

    next(s for s in cluster.servers if s.port == port).kill()
    os.kill(replica.proc.pid, signal.SIGCONT)
    deadline = time.monotonic() + 60
    promoted = node(cluster, replica.port)
    while promoted.info("replication")["role"] != "master":
        assert time.monotonic() < deadline, "the replica never took over"
        time.sleep(0.2)
    _settled(cluster, deadline)
    return promoted


def _replica_synced(cluster: Any, master: redis.Redis, key: str) -> Any:
    """The replica of ``master`` (the node of stream ``key``), once it holds what the stream
    holds now.  WAIT counts the replicas holding this connection's own writes (one that wrote
    nothing is answered at once, whatever they hold): a write of its own in the stream's
    slot, then WAIT."""
    master.set("test:" + key[key.index("{"):key.index("}") + 1] + ":synced", 1)
    deadline = time.monotonic() + 60
    while master.wait(1, 1000) != 1:
        assert time.monotonic() < deadline, "the replica never acknowledged the stream's entries"
    return next(s for s in cluster.servers if s.port == _replica_of(master))


def test_a_master_failing_over_counts_what_its_replica_never_got_and_loses_nothing_else(tmp_path):
    """A master dies with writes its replica never received (asynchronous replication):
    the replica takes over, the writer finds its stream shorter than what had landed,
    says so in the stream, and the reader counts exactly those entries as lost by Redis."""
    import os
    import signal

    from commscope.bench.redis_server import RedisCluster

    # (3 s: with 1 s, six servers on two loaded cores could take a starved master for failed
    # too, one loaded run in seven here; only the one killed may fail over)
    with RedisCluster(3, replicas=1, node_timeout_ms=3000) as cluster:
        cluster.start()
        # the writer is given the very node that fails: it must have learnt the others
        key, port, w = _writing_to_its_master(cluster, "fo")
        master = node(cluster, port)
        replica = _replica_synced(cluster, master, key)
        dead = next(s for s in cluster.servers if s.port == port)
        os.kill(replica.proc.pid, signal.SIGSTOP)  # it misses what comes next: stopped, and
        master.client_kill_filter(_type="replica")  # its link cut (nothing more reaches its socket)
        w.write(batch(0, 11, 16))  # acknowledged by the master only
        dead.kill()
        os.kill(replica.proc.pid, signal.SIGCONT)
        deadline = time.monotonic() + 60
        _written_once_it_lands(w, batch(0, 16, 21), deadline)
        alive = next(s for s in cluster.servers if s.running and s is not replica)
        # the write landed on the new master; the other nodes may not know yet (each says
        # CLUSTERDOWN until its view of the failover converges, and the reader asks the node of
        # each key): wait for every node alive to say ok
        _settled(cluster, deadline)
        reader = open_reader(f"redis://127.0.0.1:{alive.port}/0")
        got = ids(reader.read_all())
        # (ops 11-15 never ended: still in flight, their lost begins stated again after the
        # marker; those of 1-10 the replica holds, not twice)
        assert got == [(0, i) for i in range(1, 11)] + [(0, i) for i in range(11, 16)] + [(0, i) for i in range(16, 21)]
        assert reader.missing == {0: 5}  # exactly what the replica never got
        assert any("lost by Redis" in w for w in reader.stats.warnings), reader.stats.warnings


# ---------------------------------------------------------------------------- real ranks
def steady_job(rank: int, ws: int, store: str, out: str) -> None:
    """An all_reduce every 20 ms for ~2 s (100 ticks' worth of records), its elapsed time kept."""
    import time
    from pathlib import Path

    import torch
    import torch.distributed as dist

    import commscope

    commscope.instrument(store, sample_interval=60.0, hang_after=60.0, flight_recorder=False)
    x = torch.ones(16)
    t0 = time.monotonic()
    for _ in range(100):
        dist.all_reduce(x)
        time.sleep(0.02)
    elapsed = time.monotonic() - t0
    commscope.uninstrument()
    Path(out, f"elapsed-{rank}").write_text(f"{elapsed}")


def _evals(cluster) -> int:
    """EVAL calls the masters ran since their statistics were reset."""
    total = 0
    for server in cluster.servers:
        stats = node(cluster, server.port).info("commandstats")
        total += int(stats.get("cmdstat_eval", {}).get("calls", 0))
    return total


def test_real_ranks_on_a_cluster_are_diagnosed_like_a_directory_trace(redis_cluster, redis_cluster_url, tmp_path,
                                                                        capsys):
    from test_redis_ranks import check_json, diagnosable_job, normalized

    from commscope.launch import run_ranks

    env = {"COMMSCOPE_JOB": "same-job"}
    directory = str(tmp_path / "trace")
    run_ranks(diagnosable_job, 3, args=(directory,), env=env, timeout=60)
    run_ranks(diagnosable_job, 3, args=(redis_cluster_url,), env=env, timeout=60)
    from_dir, from_cluster = normalized(open_reader(directory).read_all()), \
        normalized(open_reader(redis_cluster_url).read_all())
    assert sorted(from_cluster) == [0, 1, 2] and from_cluster == from_dir
    a, b = check_json(directory, capsys), check_json(redis_cluster_url, capsys)
    def findings(report: dict) -> list[tuple]:
        return sorted((f["kind"], f.get("group"), f.get("seq"), tuple(f["ranks"]), tuple(f["culprits"]))
                      for f in report["findings"])

    assert {"straggler", "unwaited_work"} <= {f[0] for f in findings(b)} and findings(a) == findings(b)
    assert (b["rc"], b["events"], b["ops"]) == (a["rc"], a["events"], a["ops"])


def test_a_wide_jobs_ranks_write_less_often_and_lose_nothing(redis_cluster, redis_cluster_url, tmp_path):
    """``?rate=`` bounds the job's appends per second: with rate=2, each of 2 ranks writes
    at most once a second (the cap), however many ticks its records took."""
    from commscope.launch import run_ranks

    for server in redis_cluster.servers:
        node(redis_cluster, server.port).config_resetstat()
    run_ranks(steady_job, 2, args=(redis_cluster_url + "?rate=2", str(tmp_path)), env={"COMMSCOPE_JOB": "paced"},
              timeout=120)
    elapsed = max(float((tmp_path / f"elapsed-{r}").read_text()) for r in range(2))
    reader = open_reader(redis_cluster_url + "?job=paced")
    ops = [e for e in reader.read_all() if e["type"] == "op" and e.get("op") == "all_reduce" and e["phase"] == "begin"]
    assert len(ops) == 2 * 100 and reader.missing == {}  # everything, in a few appends
    # per rank: the first write, one a second while it ran, the last at uninstrument
    assert _evals(redis_cluster) <= 2 * (elapsed + 3), (_evals(redis_cluster), elapsed)


def test_a_redirection_without_a_host_means_the_node_that_sent_it():
    from commscope.store.cluster import _redirect
    from commscope.store.resp import ReplyError

    me = ("10.0.0.5", 7000)
    assert _redirect(ReplyError("MOVED 14415 :7001"), me) == ("MOVED", ("10.0.0.5", 7001))
    assert _redirect(ReplyError("ASK 3 ?:7002"), me) == ("ASK", ("10.0.0.5", 7002))
    assert _redirect(ReplyError("MOVED 3 ::1:7003"), me) == ("MOVED", ("::1", 7003))
    assert _redirect(ReplyError("MOVED 3 [::1]:7003"), me) == ("MOVED", ("::1", 7003))
    assert _redirect(ReplyError("MOVED 3 redis-2.internal:7004"), me) == ("MOVED", ("redis-2.internal", 7004))
    assert _redirect(ReplyError("ERR something else"), me) is None


def test_a_node_that_stops_answering_mid_pipeline_leaves_no_reply_behind(redis_cluster, redis_cluster_url):
    """A reply left unread on one master's connection would be taken for the next command's
    (a count's XLEN read back as a set of ranks): every connection is dropped instead."""
    c = cluster_client(redis_cluster_url)
    # a job whose own keys live on another master than rank 0's stream, which is read first
    job = next(j for j in (f"stall{k}" for k in range(100))
               if c.get_node_from_key(Keys.ranks(j)).port != c.get_node_from_key(Keys.stream(j, 0)).port)
    writers = [open_writer(redis_cluster_url, job, r, {"world_size": 32} if r == 0 else None) for r in range(32)]
    for r, w in enumerate(writers):
        w.write(batch(r, 1, 3))
    reader = open_reader(redis_cluster_url + f"?timeout=1&job={job}")
    stalled = node(redis_cluster, c.get_node_from_key(Keys.stream(job, 0)).port)
    stalled.execute_command("CLIENT", "PAUSE", 2500, "ALL")
    with pytest.raises((OSError, StoreError)):
        reader.count()  # one master does not answer in time
    assert reader.ranks() == [(r, 0) for r in range(32)]  # its own master answers, in step
    deadline = time.monotonic() + 30
    while True:  # the pause ends: the same reader goes on, in step
        try:
            assert reader.count() == 64
            break
        except (OSError, StoreError):
            assert time.monotonic() < deadline
    assert sorted(ids(reader.poll())) == [(r, i) for r in range(32) for i in (1, 2)]


def test_each_writer_keeps_one_connection_to_its_streams_master(redis_cluster, redis_cluster_url):
    """16k ranks each holding a connection to every master would pass maxclients (10,000)."""
    masters = [node(redis_cluster, s.port) for s in redis_cluster.servers]
    # (counted by client id, which each server gives in order: an earlier test's connection
    # that the server drops only now must not be counted off against the writers')
    first = [max(int(c["id"]) for c in m.client_list()) for m in masters]

    def opened() -> int:
        return sum(1 for m, f in zip(masters, first, strict=True) for c in m.client_list() if int(c["id"]) > f)

    writers = [open_writer(redis_cluster_url, "conns", r, {"world_size": 48} if r == 0 else None) for r in range(48)]
    for r, w in enumerate(writers):
        w.write(batch(r, 1, 2))
    assert opened() == 48
    for w in writers:
        w.close()


def test_the_urls_node_leaving_the_cluster_is_followed_by_writers_and_readers_that_reconnect():
    """The URL's node is resharded empty and removed (``redis-cli --cluster del-node``, which
    leaves it running, reset, knowing no slot): a writer or reader that connects again (an
    idle timeout, a dropped connection) asks the other nodes it knew for the map.  Before,
    it took the removed node's empty map for "every slot is mine" and every command there
    said CLUSTERDOWN, for ever."""
    import subprocess

    from commscope.bench.redis_server import RedisCluster, find_redis_cli

    with RedisCluster(3, node_timeout_ms=5000) as cluster:
        cluster.start()
        cli = find_redis_cli(cluster.binary)
        leaving, stay = cluster.servers[0], cluster.servers[1]
        for server in cluster.servers:  # (and an ACL user that may not read the map: it learns slots from MOVED)
            node(cluster, server.port).execute_command(
                "ACL", "SETUSER", "team", "on", ">long-random-password", "~commscope:*", "+@read", "+@write",
                "+@stream", "+@keyspace", "+@connection", "+@scripting", "-@dangerous")
        urls = {"leave": leaving.url, "leave-acl": leaving.url.replace("redis://", "redis://team:long-random-password@")}
        writers = {job: [open_writer(url, job, r, {"world_size": 6} if r == 0 else None) for r in range(6)]
                   for job, url in urls.items()}
        for ws in writers.values():
            for r, w in enumerate(ws):
                w.write(batch(r, 1, 3))
        lives = {job: open_reader(url + f"?job={job}") for job, url in urls.items()}
        seen = {job: ids(live.poll()) for job, live in lives.items()}
        gone, kept = (node(cluster, s.port).execute_command("CLUSTER MYID").decode() for s in (leaving, stay))
        for args in (["reshard", f"127.0.0.1:{stay.port}", "--cluster-from", gone, "--cluster-to", kept,
                      "--cluster-slots", str(16384), "--cluster-yes"], ["del-node", f"127.0.0.1:{stay.port}", gone]):
            done = subprocess.run([cli, "--cluster", *args], capture_output=True, text=True, timeout=300,
                                  stdin=subprocess.DEVNULL)
            assert done.returncode == 0, (done.stdout + done.stderr)[-2000:]
        assert node(cluster, leaving.port).execute_command("CLUSTER SLOTS") == []  # still up, in no cluster
        expect = [(r, i) for r in range(6) for i in range(1, 5)]
        for job, ws in writers.items():
            for r, w in enumerate(ws):
                w._drop()  # its connection dropped: the next write connects again
                w.write(batch(r, 3, 5))
            lives[job]._lost()
            seen[job] += ids(lives[job].poll())
            assert sorted(seen[job]) == expect and len(seen[job]) == len(expect), job  # nothing lost, nothing twice
            whole = open_reader(stay.url + f"?job={job}")
            assert ids(whole.read_all()) == expect and whole.missing == {}
        # the child that marks a stream (store/redis_marks.py) is given the URL and the nodes its
        # writer knows: before, it knew only the URL's node, and no mark was taken again
        from commscope.store import redis_marks

        w = writers["leave"][0]
        child = redis_marks.spawn(urls["leave"], "leave", 0, 0, w._nodes.known())
        assert child.wait(60) == 0
        assert cluster_client(stay.url).xlen(Keys.marks("leave", 0)) == 1


def test_a_tail_its_master_lost_after_the_writer_closed_is_counted_as_lost_by_redis(tmp_path):
    """The rank's last writes reach its stream's master only; the rank closes its writer (it
    exited); then the master dies and its replica takes over without them.  No later write
    shows the gap, so the writer said its end at close, in a copy on another master
    (``Keys.ends``), and the reader counts exactly those entries as lost by Redis.  Before,
    the stream just ended early: nothing counted, and check exited 0 over ops it never read."""
    import os
    import signal

    from commscope.bench.redis_server import RedisCluster
    from commscope.commands.copy import copy_trace

    with RedisCluster(3, replicas=1, node_timeout_ms=3000) as cluster:
        cluster.start()
        key, port, w = _writing_to_its_master(cluster, "tail")
        live = open_reader(cluster.url)  # a console following the job
        assert ids(live.poll()) == [(0, i) for i in range(1, 11)]
        master = node(cluster, port)
        replica = _replica_synced(cluster, master, key)
        os.kill(replica.proc.pid, signal.SIGSTOP)
        master.client_kill_filter(_type="replica")  # it misses what comes next
        w.write(batch(0, 11, 16))  # acknowledged by the master only
        w.close()  # the rank exits: nothing more will be written
        ends = [Keys.ends("tail", i) for i in range(Keys.ENDS)]
        said = [k for k in ends if cluster_client(cluster.url).get_node_from_key(k).port != port]
        assert said and any(cluster_client(cluster.url).hget(k, "0") == b"15" for k in said)
        _failed_over(cluster, port, replica)
        deadline = time.monotonic() + 60
        reader = open_reader(f"redis://127.0.0.1:{replica.port}/0")
        assert ids(reader.read_all()) == [(0, i) for i in range(1, 11)]
        assert reader.missing == {0: 5} and reader.stats.missing_by_rank == {0: 5}  # exactly what it never got
        assert any("last 5 stream entries (#11-#15) were lost by Redis" in m for m in reader.stats.warnings)
        assert reader.read_all() == [] and reader.missing == {0: 5}  # counted once
        live._tail_look = 0.0  # (it looks at the ends every TAIL_LOOK_S: now)
        while live.poll() or live._down:  # (until it has reconnected: the failover closed its connections)
            assert time.monotonic() < deadline
        assert live.missing == {0: 5} and sum("#11-#15) were lost by Redis" in m for m in live.stats.warnings) == 1
        live._tail_look = 0.0
        assert live.poll() == [] and live.missing == {0: 5}  # counted once
        for dst in (str(tmp_path / "copy"), f"redis://127.0.0.1:{replica.port}/0?job=tail-copy"):
            copy_trace(open_reader(f"redis://127.0.0.1:{replica.port}/0"), dst, "tail-copy", {"world_size": 1})
            copied = open_reader(dst if dst.startswith("redis") else str(tmp_path / "copy" / "tail-copy"))
            assert ids(copied.read_all()) == [(0, i) for i in range(1, 11)]
            assert copied.stats.missing_by_rank == {0: 5}, (dst, copied.stats.warnings)  # the copy says it too


def test_a_writer_writes_on_while_the_master_of_its_jobs_keys_is_down_and_registers_when_it_is_back():
    """``cluster-require-full-coverage no``: one master down (no replica), the others serve.
    A writer whose stream's master is up, but not the job's keys' (meta, set of streams),
    reconnects (a dropped connection): its writes land, and once that master is back (restarted
    empty, no persistence) the writer registers the job again, so a reader finds every stream.
    Before, registering again failed the write: the rank's events were dropped for as long."""
    from commscope.bench.redis_server import RedisCluster

    with RedisCluster(3, node_timeout_ms=2000) as cluster:
        cluster.start()
        for server in cluster.servers:
            node(cluster, server.port).config_set("cluster-require-full-coverage", "no")
        c = cluster_client(cluster.url)
        job = next(j for j in (f"idx{k}" for k in range(100))
                   if c.get_node_from_key(Keys.ranks(j)).port != c.get_node_from_key(Keys.stream(j, 0)).port)
        index = next(s for s in cluster.servers if s.port == c.get_node_from_key(Keys.ranks(job)).port)
        home = next(s for s in cluster.servers if s.port == c.get_node_from_key(Keys.stream(job, 0)).port)
        w = open_writer(home.url, job, 0, {"world_size": 1})
        w.write(batch(0, 1, 3))
        index.kill()
        w._drop()  # its connection dropped: it connects again, and cannot register
        w.write(batch(0, 3, 5))
        assert node(cluster, home.port).xlen(Keys.stream(job, 0)) == 4
        index.restart()  # empty: the job's keys are gone
        node(cluster, index.port).config_set("cluster-require-full-coverage", "no")

        def registered() -> bool:
            try:
                return node(cluster, index.port).exists(Keys.ranks(job)) == 1
            except redis.exceptions.ResponseError:  # (CLUSTERDOWN while it rejoins)
                return False

        deadline, written = time.monotonic() + 60, 4
        while not registered():
            assert time.monotonic() < deadline, "the writer never registered the job again"
            w._register_at = 0.0  # (its next write tries at once, not REGISTER_EVERY_S later)
            w.write(batch(0, written + 1, written + 2))  # (its stream's master is up all along)
            written += 1
            time.sleep(0.1)
        reader = open_reader(home.url + f"?job={job}")
        assert ids(reader.read_all()) == [(0, i) for i in range(1, written + 1)] and reader.missing == {}


def test_a_writer_closing_waits_a_second_at_most_for_the_node_of_its_end(redis_cluster, redis_cluster_url):
    """Closing says the stream's end on another master (``Keys.ends``): a rank's exit waits at
    most a second for it, not the URL's reply timeout, when that node does not answer.  The
    URL asks for a 600 s reply timeout and the node's writes are paused for 600 s: a close
    that waited for its reply cannot return while the test waits for it (no timing margin)."""
    import threading

    c = cluster_client(redis_cluster_url)
    url = redis_cluster_url + ("&" if "?" in redis_cluster_url else "?") + "timeout=600"
    w = open_writer(url, "slowend", 0, {"world_size": 1})
    w.write(batch(0, 1, 3))
    home = c.get_node_from_key(Keys.stream("slowend", 0)).port
    away = next(c.get_node_from_key(k).port for k in (Keys.ends("slowend", i) for i in range(Keys.ENDS))
                if c.get_node_from_key(k).port != home)
    paused = node(redis_cluster, away)
    paused.execute_command("CLIENT", "PAUSE", 600_000, "WRITE")  # (the HSET waits; the UNPAUSE does not)
    try:
        closing = threading.Thread(target=w.close, daemon=True)
        closing.start()
        closing.join(120)
        assert not closing.is_alive(), "close waited for a node that does not answer"
    finally:
        paused.execute_command("CLIENT", "UNPAUSE")
    assert open_reader(redis_cluster_url + "?job=slowend").read_all()  # (the store is read on)


def _check(url: str, capsys) -> tuple[int, list[dict]]:
    """``commscope check URL --json``: its exit code and findings."""
    import json

    from commscope import cli

    capsys.readouterr()
    rc = cli.main(["check", url, "--json"])
    return rc, json.loads(capsys.readouterr().out)["findings"]


def _complete_ops(lo: int, hi: int) -> list[bytes]:
    """Rank 0's all_reduces #lo..#hi-1, begun and ended: a healthy job, were they all read."""
    return [E.encode(e) for i in range(lo, hi) for e in (
        dict(ev(0, i), ts=10**18 + 2 * i), {"v": 1, "type": "op", "rank": 0, "ts": 10**18 + 2 * i + 1,
                                             "phase": "end", "id": i})]


_META = {"v": 1, "type": "meta", "rank": 0, "ts": 10**18, "world_size": 1, "backend": "gloo", "host": "h", "pid": 1}


def test_a_check_between_a_masters_failover_and_the_writers_return_is_not_healthy(capsys):
    """A rank's last writes reach its stream's master only; the master dies and its replica
    takes over without them.  Until the rank's writer writes again (and finds, and says, what
    was lost), the stream just ends early: a live ``check`` then exited 0 over ops it never
    read.  The writer says which master it appends through (``Keys.via``, replicated with the
    stream); a reader that finds it one that no longer serves knows the stream's end is not
    settled: ``check`` exits 1 (trace_incomplete on that rank alone, nothing counted lost yet);
    once the writer wrote again, exactly what the replica lacked is counted."""
    import os
    import signal

    from commscope.bench.redis_server import RedisCluster

    ops, meta = _complete_ops, _META
    with RedisCluster(3, replicas=1, node_timeout_ms=3000) as cluster:
        cluster.start()
        key, port, w = _writing_to_its_master(cluster, "via", [E.encode(meta)] + ops(1, 11))
        master = node(cluster, port)
        replica = _replica_synced(cluster, master, key)
        assert _check(cluster.url, capsys) == (0, [])  # healthy
        os.kill(replica.proc.pid, signal.SIGSTOP)
        master.client_kill_filter(_type="replica")  # it misses what comes next
        w.write(ops(11, 16))  # acknowledged by the master only
        stored = w.stored  # the rank's own count of what landed
        promoted = _failed_over(cluster, port, replica)
        deadline = time.monotonic() + 60
        held = promoted.xlen(key)
        assert held == stored - 10  # (the replica lacks ops 11-15: 10 entries)
        url = f"redis://127.0.0.1:{replica.port}/0"
        rc, findings = _check(url, capsys)  # the writer has not written since
        assert rc == 1 and [(f["kind"], f["severity"], f["culprits"]) for f in findings] == [
            ("trace_incomplete", "error", [0])], findings
        assert findings[0]["evidence"]["per_rank"] == {"0": {"unsettled": 1}}  # nothing counted lost: not known yet
        assert findings[0]["evidence"]["lost_events"] == 0 and "failed over" in findings[0]["message"]
        reader = open_reader(url)
        assert len(reader.read_all()) == held and reader.read_all() == []
        assert reader.stats.unsettled_by_rank == {0: 1} and not reader.stats.missing_by_rank  # (counted once)
        _written_once_it_lands(w, ops(16, 17), deadline)
        rc, findings = _check(url, capsys)
        assert rc == 1 and [(f["kind"], f["severity"], f["culprits"]) for f in findings] == [
            ("trace_incomplete", "error", [0])], findings
        assert findings[0]["evidence"]["per_rank"] == {"0": {"missing": stored - held}}  # exactly what it lacked
        w.close()


def _incomplete(findings: list) -> list[tuple]:
    """(kind, severity, culprits, per_rank) of each finding (``Finding`` objects)."""
    return [(f.kind, f.severity, f.culprits, f.evidence.to_json().get("per_rank")) for f in findings]


def test_a_console_between_a_masters_failover_and_the_writers_return_is_not_healthy():
    """``attach`` during the same window as the check above: its polls never looked at
    ``Keys.via``, so the console showed a healthy job while ``check`` exited 1.  Now a poll
    that finds the cluster's masters changed (a failover: one look, not one a poll) looks at
    the ``via`` of the streams without a said end, and the console's findings say the stream
    of rank 0 is not settled (trace_incomplete, error, nothing counted lost yet); once the
    writer wrote again through the new master, exactly what the replica lacked is counted and
    the stream is settled."""
    import os
    import signal

    from commscope.bench.redis_server import RedisCluster
    from commscope.tui.feed import LIVE, Feed

    with RedisCluster(3, replicas=1, node_timeout_ms=3000) as cluster:
        cluster.start()
        key, port, w = _writing_to_its_master(cluster, "vialive", [E.encode(_META)] + _complete_ops(1, 11))
        master = node(cluster, port)
        replica = _replica_synced(cluster, master, key)
        alive = next(s for s in cluster.servers if s.port not in (port, replica.port))
        feed = Feed(open_reader(f"redis://127.0.0.1:{alive.port}/0"), mode=LIVE, hang_after=60.0)
        deadline = time.monotonic() + 60
        while feed.model.events < 21:
            feed.step()
            assert time.monotonic() < deadline
        feed._diagnosed_at = float("-inf")
        feed.step()
        assert feed.findings == [] and feed.reader.stats.unsettled_by_rank == {}  # healthy
        os.kill(replica.proc.pid, signal.SIGSTOP)
        master.client_kill_filter(_type="replica")  # it misses what comes next
        w.write(_complete_ops(11, 16))  # acknowledged by the master only, never read by the console
        stored = w.stored
        promoted = _failed_over(cluster, port, replica)
        held = promoted.xlen(key)
        assert held == stored - 10

        def judged() -> list[tuple]:
            feed.step()
            feed._diagnosed_at = float("-inf")  # (judged at the next step, whatever the pace)
            feed.step()
            return _incomplete(feed.findings)

        while not feed.reader.stats.unsettled_by_rank:  # (until it reconnected: its connections were closed)
            feed.step()
            assert time.monotonic() < deadline, feed.reader.stats.warnings
        assert judged() == [("trace_incomplete", "error", [0], {"0": {"unsettled": 1}})]
        assert sum("failed over since its writer last wrote" in m for m in feed.reader.stats.warnings) == 1
        assert feed.reader.stats.missing_by_rank == {}  # nothing counted lost: not known yet
        _written_once_it_lands(w, _complete_ops(16, 17), deadline)
        w.write(_complete_ops(17, 18))  # (its next write: its ``via`` said after the first)
        while feed.reader.stats.unsettled_by_rank:
            feed.step()
            assert time.monotonic() < deadline, feed.reader.stats.warnings
        assert judged() == [("trace_incomplete", "error", [0], {"0": {"missing": stored - held}})]
        assert sum("failed over since its writer last wrote" in m for m in feed.reader.stats.warnings) == 1
        w.close()


def live_until_killed(rank: int, ws: int, store: str, spools: str) -> None:
    """An all_reduce every 10 ms, heartbeats every 0.2 s.  Once ``spools/stop`` exists, rank 0
    stops calling collectives, has all it recorded written (``flushed``) and waits to be
    killed; rank 1 waits in its next all_reduce, and lives on once it fails.  Each rank keeps
    its spool apart, as on a host of its own."""
    import os
    import time
    from pathlib import Path

    import torch
    import torch.distributed as dist

    import commscope

    os.environ["COMMSCOPE_SPOOL_DIR"] = os.path.join(spools, f"host{rank}")
    recorder = commscope.instrument(store, sample_interval=0.2, hang_after=60.0, flight_recorder=False)
    x = torch.ones(8)
    try:
        while rank != 0 or not os.path.exists(os.path.join(spools, "stop")):
            dist.all_reduce(x)
            time.sleep(0.01)
        recorder.flush(timeout=60)
        Path(spools, "flushed").touch()
    except RuntimeError:  # (its peer was killed: this rank lives on)
        pass
    while True:
        time.sleep(1)


@pytest.mark.timeout(240)
def test_a_rank_that_died_before_its_masters_failover_is_dead_with_an_unknown_loss_not_unsettled(tmp_path, capsys):
    """Rank 0 of two is SIGKILLed (its host lost with it: its spool gone, nobody forwards it)
    after writes its stream's replica never received; then that master fails over.  The
    rank's writer will never write again, so its stream stayed ``unsettled`` for good: check
    said "not counted yet (each writer says it when it writes again)", a wait for nothing.
    Now the rank is named gone (dead_rank, "vanished": rank 1's failed all_reduce its consequence) and its
    stream's end is a stated loss of an unknown count with its cause (its master failed over
    after the rank was gone: ``lost_unknown``); check exits 1.  A console that had read the
    stream to its real end says the same of it (and names the rank dead_rank: it read no peer
    outliving it)."""
    import os
    import shutil
    import signal

    from commscope.bench.redis_server import RedisCluster
    from commscope.launch import Job
    from commscope.tui.feed import LIVE, Feed

    spools = tmp_path / "spools"
    for host in ("host0", "host1"):
        (spools / host).mkdir(mode=0o700, parents=True)
    with RedisCluster(3, replicas=1, node_timeout_ms=3000) as cluster:
        cluster.start()
        c = cluster_client(cluster.url)
        name = next(j for j in (f"deadfo{k}" for k in range(100))  # (rank 1's stream on another master)
                    if c.get_node_from_key(Keys.stream(j, 0)).port != c.get_node_from_key(Keys.stream(j, 1)).port)
        key = Keys.stream(name, 0)
        port = c.get_node_from_key(key).port
        master = node(cluster, port)
        job = Job(live_until_killed, 2, args=(cluster.url, str(spools)), env={"COMMSCOPE_JOB": name}).start()
        try:
            deadline = time.monotonic() + 150
            while master.xlen(key) < 20:
                assert time.monotonic() < deadline, "the rank never wrote"
                time.sleep(0.1)
            replica = _replica_synced(cluster, master, key)
            os.kill(replica.proc.pid, signal.SIGSTOP)
            master.client_kill_filter(_type="replica")  # it misses what comes next
            synced = master.xlen(key)
            while master.xlen(key) < synced + 5:  # (the rank's writes the replica never gets)
                assert time.monotonic() < deadline
                time.sleep(0.05)
            (spools / "stop").touch()  # (rank 0's last ops all stored: rank 1 completes none after them)
            while not (spools / "flushed").exists():
                assert time.monotonic() < deadline
                time.sleep(0.05)
            os.kill(job.pids[0], signal.SIGKILL)
            while 0 in job.alive():
                assert time.monotonic() < deadline
                time.sleep(0.05)
            shutil.rmtree(spools / "host0")  # (its host is gone: nobody forwards its spool)
            stored = master.xlen(key)  # the rank's own count: all its writer ever stored
            url = f"redis://127.0.0.1:{replica.port}/0?job={name}"
            alive = next(s for s in cluster.servers if s.port not in (port, replica.port))
            feed = Feed(open_reader(f"redis://127.0.0.1:{alive.port}/0?job={name}"), mode=LIVE, hang_after=60.0)
            while feed.reader._last.get((0, 0), 0) < stored:  # (the console read all rank 0 wrote)
                feed.step()
                assert time.monotonic() < deadline
            promoted = _failed_over(cluster, port, replica)
            held = promoted.xlen(key)
            assert held < stored  # (the replica lacks the rank's last writes: a real loss, never counted)

            def found() -> tuple[int, list[dict]] | None:
                import json

                rc, findings = _check(url, capsys)
                return (rc, findings) if "vanished without a clean exit" in json.dumps(findings) else None

            while (out := found()) is None:  # (until the rank's silence passed its threshold: it is gone)
                assert time.monotonic() < deadline, [(f["kind"], f["severity"], f["culprits"], f["message"])
                                                     for f in _check(url, capsys)[1]]
                time.sleep(0.2)
            rc, findings = out
            # (rank 0 vanished: rank 1's all_reduce failed on its closed connection and nothing came
            # from it since.  Rank 1 completed collectives with it after the end of what the replica
            # holds, which proves it lived past that end, not that it never died: dead_rank, rank 1's
            # failed all_reduce its consequence, as the console that read the whole stream finds below;
            # before, op_failed blaming rank 0.  No victim is blamed: these are all the findings)
            assert rc == 1 and sorted((f["kind"], f["severity"], f["culprits"]) for f in findings) == [
                ("dead_rank", "error", [0]), ("trace_incomplete", "error", [0])], findings
            assert next(f for f in findings if f["kind"] == "dead_rank")["evidence"]["how"] == "vanished"
            incomplete = next(f for f in findings if f["kind"] == "trace_incomplete")
            assert incomplete["evidence"]["per_rank"] == {"0": {"lost_unknown": "failover"}}  # not "unsettled"
            assert incomplete["evidence"]["lost_events"] == 0  # (a count nobody knows is not made up)
            assert "after the rank(s) were gone" in incomplete["message"], incomplete["message"]
            assert "not counted yet" not in incomplete["message"]
            while not feed.reader.stats.unsettled_by_rank:  # the console, after it reconnected
                feed.step()
                assert time.monotonic() < deadline, feed.reader.stats.warnings
            feed._diagnosed_at = float("-inf")
            feed.step()
            # (it read rank 0's stream to its real end before the failover: no peer outlived it there,
            # so it is dead_rank, rank 1's failed all_reduce its consequence)
            assert sorted((f.kind, f.severity, f.culprits) for f in feed.findings) == [
                ("dead_rank", "error", [0]), ("trace_incomplete", "error", [0])], feed.findings
            assert _incomplete(f for f in feed.findings if f.kind == "trace_incomplete") == [
                ("trace_incomplete", "error", [0], {"0": {"lost_unknown": "failover"}})]
        finally:
            job.kill()
            job.join(30)


def test_a_full_node_is_said_where_the_url_s_node_is_down():
    """Connecting again after the URL's node went down, the others full: the error said only
    the first node's "connection refused", so a keeper never read them as full and held
    (``redis_keeper.full``).  A node that answered and refused says more, and is said."""
    from redis_fixture import filled

    from commscope.bench.redis_server import RedisCluster
    from commscope.store.cluster import Nodes
    from commscope.store.redis_keeper import full
    from commscope.store.redis_store import parse_url

    with RedisCluster(3, node_timeout_ms=60000) as cluster:
        cluster.start()
        nodes = Nodes(parse_url(cluster.url), "test")
        nodes.connect()
        assert len(nodes.masters()) == 3
        nodes.close()
        cluster.servers[0].kill()  # (the URL's node)
        held = []
        try:
            for server in cluster.servers[1:]:
                cluster.cli("CONFIG", "SET", "maxclients", "16", server=server)
                held += filled(server)
            with pytest.raises(StoreError) as info:
                nodes.connect()
        finally:
            for s in held:
                s.close()
    assert "max number of clients" in str(info.value) and full(info.value), info.value


def test_writers_whose_streams_are_not_on_the_master_of_the_jobs_index_set_it_again(redis_cluster, redis_cluster_url):
    """The set of a job's streams lives on one master.  Should it fail over before its replica
    had the members, only writers that reconnect (those on that master) added theirs back: a
    reader took the other ranks' streams for absent, and named them as never entering the
    collective they waited in (helper-197).  Writers on the other masters set it again every
    ``refresh_every`` seconds; one on its master reconnects, and sets it then."""
    ranks = 8
    writers = [open_writer(redis_cluster_url, "reindex", r, {"world_size": ranks} if r == 0 else None)
               for r in range(ranks)]
    for r, w in enumerate(writers):
        w.write(batch(r, 1, 3))
    home = writers[0]._nodes.node(Keys.ranks("reindex"))
    away = [r for r, w in enumerate(writers) if w._nodes.node(w.key) != home]
    assert away and len(away) < ranks  # (the case: streams on the index's master and on others)
    assert [r for r, w in enumerate(writers) if w._refreshed is not None] == away
    assert all(writers[r].refresh_every == RedisWriter.REFRESH_MIN_S for r in away)
    c = cluster_client(redis_cluster_url)
    c.srem(Keys.ranks("reindex"), *[Keys.member(r, 0) for r in away])  # (what a failover lost)
    assert [r for r, _inc in open_reader(redis_cluster_url + "?job=reindex").ranks()] == \
        [r for r in range(ranks) if r not in away]
    for r in away:
        writers[r].refresh_every = 0.0  # (its time come)
        writers[r].write(batch(r, 3, 4))
    assert [r for r, _inc in open_reader(redis_cluster_url + "?job=reindex").ranks()] == list(range(ranks))
    delete_job(redis_cluster_url, "reindex")
    for w in writers:
        w.close()
    c.close()
