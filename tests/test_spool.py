"""The spool: the file a rank's records wait in until the store has them.

Its header layout is shared by the C++ recorder and the Python reader (one layout, checked
here against the native module's own); a dead rank's spool is found by anyone (the lock
its owner held is free), forwarded once, and a rank that died without a word (SIGKILL)
leaves a tombstone until its launcher, the one that saw the exit status, names the death.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from commscope.record import native
from commscope.store import open_reader, open_writer, spool


def test_header_layout_is_the_native_recorder_s():
    mod = native.load()
    if mod is None:
        pytest.fail("the native recorder did not build here")
    assert mod.spool_layout() == spool.LAYOUT


CHILD = """
import os, signal, sys
from commscope.store import spool
sp = spool.Spool.create({"job": "tomb", "store_id": spool.store_id(sys.argv[1]), "store": sys.argv[1],
                         "rank": 1, "inc": 0, "run": "r1", "host": "h", "pid": os.getpid()}, ring=1 << 16)
print(sp.path, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


#: Its exit stored, then killed before it closed its spool (its last tick cut at exit); it
#: had kept the exit there too (for a forwarder, in case the write did not end).
EXIT_STORED_CHILD = CHILD.replace("print(sp.path", """from commscope.record.pyspool import PyRing
ring = PyRing()
ring.attach(sp.fd)
ring.keep_event(b'{"type":"exit","v":3,"rank":1,"ts":5,"reason":"uninstrument"}')
sp.set_flag(spool.EXIT_STORED)
print(sp.path""")


def killed_spool(store: str, child: str = CHILD) -> tuple[Path, int]:
    """A spool whose owner was SIGKILLed: (its path, the owner's pid)."""
    p = subprocess.run([sys.executable, "-c", child, store], capture_output=True, text=True)
    assert p.returncode == -signal.SIGKILL, p.stderr
    path = Path(p.stdout.strip())
    assert path.exists() and oct(path.stat().st_mode & 0o777) == "0o600"
    return path, int(path.name.split("-")[0])


def _forwarded_silent_death(tmp_path):
    """Rank 1 of job "tomb" SIGKILLed, its spool forwarded by a sibling: (store, spool path,
    pid, the sibling's writer)."""
    store = str(tmp_path / "trace")
    open_writer(store, "tomb", 0, {"world_size": 2}).close()
    path, pid = killed_spool(store)

    def writer(rank: int, inc: int):
        return open_writer(store, "tomb", rank, incarnation=inc, resume=True)

    # A sibling or a reader forwards what it holds but cannot say how the rank died: it ended
    # without a word (as under torchrun, where no commscope launcher sees the exit status).
    assert spool.forward_dead("tomb", store, writer) == 1
    return store, path, pid, writer


def test_a_silent_death_leaves_a_tombstone_for_its_launcher(tmp_path):
    store, path, pid, writer = _forwarded_silent_death(tmp_path)
    assert path.exists() and path.stat().st_size == spool.HEADER_SIZE  # the ring's memory is given back
    assert spool.read(path).flags & spool.FORWARDED
    assert spool.forward_dead("tomb", store, writer) == 0  # nothing more to forward: left for the launcher
    # The launcher saw the exit status: the death gets its cause, the tombstone goes.
    assert spool.forward_orphans(exit_status={pid: -signal.SIGKILL}.get, only=spool.store_id(store)) == 1
    assert not path.exists()
    exits = [e for e in open_reader(f"{store}/tomb").read_all() if e["type"] == "exit"]
    assert [(e["rank"], e["reason"], e.get("signal"), e["src"]) for e in exits] == [
        (1, "gone", None, "spool"), (1, "killed", "Killed", "launcher")]


def test_a_launcher_forwards_a_killed_rank_s_spool_with_its_cause(tmp_path):
    store = str(tmp_path / "trace")
    open_writer(store, "tomb", 0, {"world_size": 2}).close()
    path, pid = killed_spool(store)
    assert spool.forward_orphans(exit_status={pid: -signal.SIGKILL}.get, only=spool.store_id(store)) == 1
    assert not path.exists()
    events = [e for e in open_reader(f"{store}/tomb").read_all() if e["rank"] == 1]
    # it recorded nothing before it died: all there is to say is how it died
    assert [(e["type"], e.get("reason"), e.get("signal")) for e in events] == [("exit", "killed", "Killed")]


@pytest.mark.parametrize("who", ["sibling", "launcher", "reader"])
def test_a_spool_that_says_its_exit_is_stored_gets_no_second_exit(tmp_path, who):
    """Whoever reads it (a sibling rank, the launcher that saw exit status 0, a reader that may
    not forward) adds no exit and sends none it kept: the rank's own is in the store."""
    store = str(tmp_path / "trace")
    open_writer(store, "tomb", 0, {"world_size": 2}).close()
    path, pid = killed_spool(store, EXIT_STORED_CHILD)
    img = spool.read(path)
    assert img.flags & spool.EXIT_STORED and any(b'"exit"' in line for line in img.kept)  # (the case is set up)
    assert not any(b'"exit"' in line for line in spool.remnant_lines(img, 1))
    if who == "reader":
        assert [(r, lines) for r, _inc, lines in spool.remnant_events("tomb", store)] == [(1, [])]
        spool._remove(path)
        return
    if who == "sibling":
        def writer(rank: int, inc: int):
            return open_writer(store, "tomb", rank, incarnation=inc, resume=True)

        assert spool.forward_dead("tomb", store, writer) == 1
    else:
        assert spool.forward_orphans(exit_status={pid: 0}.get, only=spool.store_id(store)) == 1
    assert not path.exists()  # done with: no tombstone waits for a launcher
    assert [e for e in open_reader(f"{store}/tomb").read_all() if e["rank"] == 1] == []


#: A killed rank whose ring wrapped: records past the tail at the ring's end and at its start.
RECORDS_CHILD = CHILD.replace("ring=1 << 16)", "ring=1 << 20)").replace("print(sp.path", """from commscope import blocks
from commscope.record.pyspool import PyRing
ring = PyRing()
ring.attach(sp.fd)
ring.note_meta(b'{"type":"meta","v":3,"rank":1,"ts":1}')
rec = lambda k: blocks.HEADER.pack(blocks.RBEGIN, 0, 0, 200, k, k) + bytes([k % 251]) * (200 - blocks.HEADER.size)
ring.put_many(rec(k) for k in range(4000))
ring.drained = 3000 * 200
ring.forwarded(3000 * 200)  # (the store holds the first 3,000)
ring.put_many(rec(k) for k in range(4000, 6000))
assert ring.head == 6000 * 200 and ring.dropped == 0
print(sp.path""")


@pytest.mark.parametrize("why", ["its store is out of reach", "its store's password is hidden"])
def test_a_dead_spool_nobody_can_forward_gives_back_its_memory_but_what_a_forwarder_reads(tmp_path, why):
    """A dead rank's spool that cannot be forwarded now (its store out of reach; a Redis URL
    whose password the spool hides, and no launcher that holds it) waits for a forwarder
    that can, for up to MAX_AGE_S.  It keeps the memory of its records past the tail, its
    header and its tables, and gives back the rest of its ring and table (holes punched):
    before, it held all of them (here 5.1 MiB; 20 MiB a default spool), and a host's dead
    ranks filled /dev/shm.  What a forwarder reads of it is the same, byte for byte."""
    if why == "its store is out of reach":
        store = str(tmp_path / "not-a-directory")
        Path(store).write_text("")
    else:
        store = "redis://:***@127.0.0.1:1/0"
    path, _pid = killed_spool(store, RECORDS_CHILD)
    before, held, mtime = spool.read(path), path.stat().st_blocks * 512, path.stat().st_mtime_ns
    assert len(before.ring) == 3000 * 200 and before.meta and held >= 5 << 20  # (the case is set up: it wrapped)
    if why == "its store is out of reach":
        writer = lambda rank, inc: open_writer(store, "tomb", rank, incarnation=inc, resume=True)  # noqa: E731
        assert spool.forward_dead("tomb", store, writer) == 0
    else:
        assert spool.forward_orphans(only=spool.store_id(store)) == 0
    after = spool.read(path)
    assert path.stat().st_blocks * 512 <= 1 << 20, path.stat().st_blocks * 512
    assert path.stat().st_mtime_ns == mtime  # (it dates the rank's last record: ``gone_exit``)
    assert (after.ring, after.meta, after.tables, after.kept, after.head, after.tail, after.flags) == (
        before.ring, before.meta, before.tables, before.kept, before.head, before.tail, before.flags)
    spool._remove(path)


def test_a_forwarder_holds_its_claim_while_it_forwards(tmp_path):
    """A forwarder claims a dead spool with a POSIX lock; it read the spool by opening it
    again, and closing that descriptor dropped the lock (POSIX drops every lock a process
    holds on a file when any of its descriptors of it closes): another forwarder (the
    launcher, a sibling rank, a reader) could take the spool while the first wrote it."""
    store = str(tmp_path / "trace")
    open_writer(store, "tomb", 0, {"world_size": 2}).close()
    path, _pid = killed_spool(store)
    probe = ("import fcntl, os, sys\nfd = os.open(sys.argv[1], os.O_RDWR)\ntry:\n"
             "    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\n    print('taken')\n"
             "except OSError:\n    print('held')")
    seen = []

    def writer(rank: int, inc: int):
        seen.append(subprocess.run([sys.executable, "-c", probe, str(path)], capture_output=True, text=True).stdout)
        return open_writer(store, "tomb", rank, incarnation=inc, resume=True)

    assert spool.forward_dead("tomb", store, writer) == 1
    assert seen == ["held\n"]


def test_spool_directory_is_private():
    d = spool.spool_dirs()[0]
    assert d.stat().st_mode & 0o077 == 0 and d.stat().st_uid == os.getuid()


PROBE = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
try:
    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    print("free")
except OSError:
    print("locked")
"""


def test_a_recording_process_never_takes_its_own_live_spool_for_dead(tmp_path):
    """A process that records and reads its own store (a notebook, ``bench store``) once saw
    its live spool as dead: POSIX locks never stop their own process, and opening the file
    again dropped the lock others test.  Its reader forwarded the spool into its own stream
    (the writer then refused to mix events) and removed it under the recorder: a SIGBUS."""
    store = str(tmp_path / "trace")
    open_writer(store, "self", 0, {"world_size": 1}).close()
    sp = spool.Spool.create({"job": "self", "store_id": spool.store_id(store), "store": store, "rank": 0,
                             "inc": 0, "run": "r1", "host": "h", "pid": os.getpid()}, ring=1 << 16)
    try:
        assert spool.dead_spools("self", store) == [] and spool.remnant_events("self", store) == []
        open_reader(f"{store}/self").read_all()  # a reader sweeps what dead ranks left on this host
        assert spool.forward_orphans(only=spool.store_id(store)) == 0  # as a launcher does
        assert sp.path.exists() and sp.path.stat().st_size > spool.HEADER_SIZE
        probe = subprocess.run([sys.executable, "-c", PROBE, str(sp.path)], capture_output=True, text=True)
        assert probe.stdout.strip() == "locked", probe.stderr  # still ours: alive to every other process
    finally:
        sp.close(remove=True)
    assert not sp.path.exists() and sp.path not in spool._HELD


def test_a_spool_being_created_is_never_opened_by_its_own_process(tmp_path, monkeypatch):
    """Between taking the lock and returning, ``Spool.create`` allocates the file: a reader
    thread of the same process scanning then must already leave it alone."""
    store = str(tmp_path / "trace")
    open_writer(store, "self", 0, {"world_size": 1}).close()
    real = os.posix_fallocate

    def scanned_meanwhile(fd: int, offset: int, size: int) -> None:
        real(fd, offset, size)
        assert spool.dead_spools("self", store) == []
        spool.forward_orphans(only=spool.store_id(store))

    monkeypatch.setattr(os, "posix_fallocate", scanned_meanwhile)
    sp = spool.Spool.create({"job": "self", "store_id": spool.store_id(store), "store": store, "rank": 0,
                             "inc": 0, "run": "r1", "host": "h", "pid": os.getpid()}, ring=1 << 16)
    monkeypatch.undo()
    try:
        probe = subprocess.run([sys.executable, "-c", PROBE, str(sp.path)], capture_output=True, text=True)
        assert probe.stdout.strip() == "locked", probe.stderr
    finally:
        sp.close(remove=True)


def test_the_readers_of_a_job_s_parts_forward_any_spool_and_read_only_their_ranks_remnants(tmp_path, monkeypatch):
    """A console's read processes each read a part of the ranks (``Shard``): a dead rank's
    spool is forwarded by whichever part looks first (a real one, here by a part that is
    not its rank's); what could not be forwarded (the store not writable from here) is
    read by its rank's part alone, by the decoder of the rank's stream (each record once).
    The spools that could not be forwarded are stood in for (``remnant_events``)."""
    import orjson

    from commscope.store.base import Shard

    store = str(tmp_path / "trace")
    open_writer(store, "tomb", 0, {"world_size": 4}).close()
    path, pid = killed_spool(store)  # (rank 1's: part 1 of 3's)

    def writer(rank: int, inc: int):
        return open_writer(store, "tomb", rank, incarnation=inc, resume=True)

    reader = open_reader(f"{store}/tomb")
    reader.take_shard(Shard(2, 3))
    assert reader.spool_remnants("tomb", store, writer, final=True)[0] == 1
    assert spool.read(path).flags & spool.FORWARDED
    reader.close()
    # (the tombstone left for the launcher, which names the death: gone)
    assert spool.forward_orphans(exit_status={pid: -signal.SIGKILL}.get, only=spool.store_id(store)) == 1
    assert not path.exists()

    def beat(rank: int) -> bytes:
        return orjson.dumps({"type": "heartbeat", "v": 3, "rank": rank, "ts": 1_780_000_000_000_000_000,
                             "inflight": 0})

    monkeypatch.setattr(spool, "forward_dead", lambda job, store, writer: 0)
    monkeypatch.setattr(spool, "remnant_events", lambda job, store, run: [(1, 0, [beat(1)]), (2, 0, [beat(2)])])
    for k in range(3):
        reader = open_reader(f"{store}/tomb")
        reader.take_shard(Shard(k, 3))
        forwarded, left = reader.spool_remnants("tomb", store, writer, final=True)
        assert forwarded == 0 and {s: [e["rank"] for e in evs] for s, evs in left.items()} == (
            {(k, 0): [k]} if k in (1, 2) else {}), k
        reader.close()


def test_a_reader_that_may_not_forward_says_a_silent_death_once(tmp_path, monkeypatch):
    """(helper-70) A reader that cannot write to the store reads a dead rank's spool at each
    look: the rank's "gone" exit came once a look (every 2 s while following), each timed
    when read."""
    from commscope.store import directory

    store = str(tmp_path / "trace")
    open_writer(store, "tomb", 0, {"world_size": 2}).close()
    path, _pid = killed_spool(store)

    def refused(*args, **kwargs):
        raise PermissionError("a store this reader may only read")

    monkeypatch.setattr(directory, "DirectoryWriter", refused)
    reader = open_reader(f"{store}/tomb")
    reader.SPOOL_LOOK_S = 0.0
    try:
        exits = [e for _ in range(4) for e in reader.poll() if e["type"] == "exit"]
        assert [(e["rank"], e["reason"], e["src"]) for e in exits] == [(1, "gone", "spool")]
        assert exits[0]["ts"] == path.stat().st_mtime_ns  # (no record: the spool's last change)
    finally:
        spool._remove(path)


@pytest.mark.parametrize("run", ["r1", "r2"])
def test_a_reader_that_may_not_forward_reads_no_spool_of_another_run_under_the_job_s_id(tmp_path, monkeypatch, run):
    """Two runs given one job id at once: the store refused the second's ranks, whose records
    stayed in their spools; forwarding leaves them out (``_same_run``), but a reader that
    may not write read them into the first run's trace, and check blamed its ranks for the
    second's failures (helper-166).  The job's run is r1 or r2; the dead spool is r1's."""
    from commscope.store import directory

    store = str(tmp_path / "trace")
    open_writer(store, "tomb", 0, {"world_size": 2, "run": run, "inc": 0}).close()
    path, _pid = killed_spool(store)

    def refused(*args, **kwargs):
        raise PermissionError("a store this reader may only read")

    monkeypatch.setattr(directory, "DirectoryWriter", refused)
    try:
        exits = [e for e in open_reader(f"{store}/tomb").read_all() if e["type"] == "exit"]
        assert [(e["rank"], e["src"]) for e in exits] == ([(1, "spool")] if run == "r1" else [])
    finally:
        spool._remove(path)
    # rank 0 draws a run at each incarnation: one of incarnation 1 is read whatever run the
    # metadata (incarnation 0's) says (helper-167: a killed rank's last records were dropped)
    later, _pid = killed_spool(store, CHILD.replace('"inc": 0, "run": "r1"', '"inc": 1, "run": "r9"'))
    try:
        exits = [e for e in open_reader(f"{store}/tomb").read_all() if e["type"] == "exit"]
        assert [(e["rank"], e["src"]) for e in exits] == [(1, "spool")]
    finally:
        spool._remove(later)


@pytest.mark.parametrize("stream_run", ["rA", "r1"])
def test_a_spool_is_judged_by_its_own_stream_s_run_once_the_job_restarted(tmp_path, monkeypatch, stream_run):
    """(helper-168) The job's metadata says its newest incarnation (Redis's rank 0 writes it
    at each: run r9, incarnation 1); a dead spool of incarnation 0 and run r1 (a run the store
    refused under this id) was read into the job though rank 1's incarnation-0 stream says
    run rA.  It is read only where its stream's run is its own."""
    import orjson

    from commscope.store import directory

    store = str(tmp_path / "trace")
    open_writer(store, "tomb", 0, {"world_size": 2, "run": "r9", "inc": 1}).close()
    w = open_writer(store, "tomb", 1, {"world_size": 2, "run": stream_run, "inc": 0})
    w.write([orjson.dumps({"type": "meta", "ts": 1_780_000_000_000_000_000, "v": 3, "rank": 1, "world_size": 2,
                           "host": "h", "sample_interval": 1.0, "run": stream_run, "inc": 0})])
    w.close()
    path, _pid = killed_spool(store)  # (rank 1, incarnation 0, run r1)

    def refused(*args, **kwargs):
        raise PermissionError("a store this reader may only read")

    monkeypatch.setattr(directory, "DirectoryWriter", refused)
    try:
        exits = [e for e in open_reader(f"{store}/tomb").read_all() if e["type"] == "exit"]
        assert [(e["rank"], e["src"]) for e in exits] == ([(1, "spool")] if stream_run == "r1" else [])
    finally:
        spool._remove(path)


def test_a_launcher_says_only_its_own_ranks_spools_were_left(tmp_path):
    """(helper-167) Two launches on one store: the spools left by the other launch's ranks are
    not this one's to say "not in the trace" of."""
    store = str(tmp_path / "trace")
    paths = [killed_spool(store, CHILD.replace('"pid": os.getpid()}', f'"pid": os.getpid(), "launch": "{who}"}}'))[0]
             for who in ("mine", "theirs")]
    try:
        assert spool.stranded(store, "mine") == [paths[0]] and spool.stranded(store, "theirs") == [paths[1]]
        assert spool.stranded(store, "another") == []
    finally:
        for p in paths:
            spool._remove(p)


def test_a_spool_left_unclosed_after_a_clean_exit_does_not_make_the_rank_dead(tmp_path, capsys):
    """(helper-70) A rank's clean exit reached the store, but its spool was left unclosed (its
    last tick cut short): the forwarder, finding no exit in what the spool held, added one
    saying it ended without a word, and that later exit made the rank a dead_rank while
    rank 0 went on.  A rank that restarted after its exit and was then killed still is."""
    import json

    from commscope.analysis.synth import S, TraceBuilder
    from commscope.cli import main as cli
    from commscope.events import encode

    b = TraceBuilder(2)
    t = b.collective(b.warmup() + S, "all_reduce")
    b.heartbeats(b.t0, t + S, ranks=[1])
    b.exit(1, t + S, reason="atexit", code=0)
    b.heartbeats(b.t0, t + 30 * S, ranks=[0])
    b.exit(0, t + 30 * S, reason="atexit", code=0)
    store = str(tmp_path / "trace")
    for r in (0, 1):
        w = open_writer(store, "j", r, job_meta={"world_size": 2})
        w.write([encode(e) for e in b.sorted_events() if e["rank"] == r])
        if r == 1:  # (what the forwarder adds for the spool it found unclosed)
            w.write([encode({"type": "exit", "v": 3, "rank": 1, "ts": t + 40 * S, "src": "spool", "reason": "gone"})])
        w.close()
    capsys.readouterr()
    assert cli(["check", store, "--json"]) == 0, capsys.readouterr().out
    assert json.loads(capsys.readouterr().out)["findings"] == []


def test_a_rank_killed_after_it_restarted_is_still_dead(tmp_path, capsys):
    """The other side of the rule above: rank 1 exited, initialised again (ops after its
    exit), then died without a word while rank 0 went on and waited for it: the "gone" is
    its last word, not a spool left unclosed."""
    import json

    from commscope.analysis.synth import S, TraceBuilder
    from commscope.cli import main as cli
    from commscope.events import encode

    b = TraceBuilder(2)
    t = b.collective(b.warmup() + S, "all_reduce")
    b.exit(1, t + S, reason="atexit", code=0)
    t = b.collective(t + 2 * S, "all_reduce")  # (both again: rank 1 initialised anew)
    b.begin(0, t + S, "all_reduce")
    b.heartbeats(b.t0, t, ranks=[1])
    b.heartbeats(b.t0, t + 30 * S, ranks=[0])
    store = str(tmp_path / "trace")
    for r in (0, 1):
        w = open_writer(store, "j", r, job_meta={"world_size": 2})
        w.write([encode(e) for e in b.sorted_events() if e["rank"] == r])
        if r == 1:
            w.write([encode({"type": "exit", "v": 3, "rank": 1, "ts": t + S // 2, "src": "spool", "reason": "gone"})])
        w.close()
    capsys.readouterr()
    assert cli(["check", store, "--json", "--hang-after", "5"]) == 1
    errors = [f for f in json.loads(capsys.readouterr().out)["findings"] if f["severity"] == "error"]
    assert [(f["kind"], f["culprits"]) for f in errors] == [("dead_rank", [1])], errors
    assert "ended without a word" in errors[0]["message"]


def test_a_handled_sigterm_noted_in_a_spool_header_reaches_every_exit_read_from_it(tmp_path):
    """The note the native death handler leaves (``stop_sig``, ``stop_ns`` at OFF_STOP) is
    read back through ``read`` into every exit a forwarder makes of the spool: a death the
    header records, an ``os._exit``, none at all (``gone``); a garbled note is none."""
    import struct

    store = str(tmp_path / "trace")
    sp = spool.Spool.create({"job": "note", "store_id": spool.store_id(store), "store": store, "rank": 3,
                             "inc": 0, "run": "r1", "host": "h", "pid": os.getpid()}, ring=1 << 16)
    try:
        assert sp.stop_noted() == {}
        os.pwrite(sp.fd, struct.pack("<iiq", 15, 0, 1_234_567), spool.OFF_STOP)
        assert sp.stop_noted() == {"stop_signal": "Terminated", "stop_ts": 1_234_567}
        note = {"stop_signal": "Terminated", "stop_ts": 1_234_567}
        img = spool.read(sp.path)
        assert img is not None and spool.gone_exit(img, 3)["stop_signal"] == "Terminated"
        assert spool.exit_event(img, 3) is None  # (no death recorded: a forwarder writes 'gone')
        os.pwrite(sp.fd, struct.pack("<iiQQq", 9, 0, 0, 7, 2_000_000), spool.OFF_DEATH)  # killed by SIGKILL, noted
        ex = spool.exit_event(spool.read(sp.path), 3)
        assert (ex["reason"], ex["signal"], ex["stop_signal"], ex["stop_ts"]) == ("signal", "Killed", *note.values())
        os.pwrite(sp.fd, struct.pack("<iiq", 15, 0, -5), spool.OFF_STOP)  # garbled: no note, the death kept
        ex = spool.exit_event(spool.read(sp.path), 3)
        assert ex["signal"] == "Killed" and "stop_signal" not in ex
    finally:
        sp.close(remove=True)


def _opened_late_then_killed(rank: int, ws: int, store: str, ready: str) -> None:
    """The store cannot be opened at attach (a file in its place); the test removes it, the
    recorder's thread opens it at a later tick and writes the meta and the records; then
    the rank records more ops and dies without a word (SIGKILL), its spool left behind."""
    import time

    import torch
    import torch.distributed as dist

    import commscope

    commscope.instrument(store, sample_interval=0.1, hang_after=60.0)
    x = torch.ones(4)
    dist.all_reduce(x)
    Path(ready).touch()
    stream = Path(store) / "late" / f"rank-{rank:05d}.jsonl"
    while not (stream.exists() and b'"type":"meta"' in stream.read_bytes()):  # (the thread opened the store)
        dist.all_reduce(x)
        time.sleep(0.05)
    commscope.record.recorder.active().flush()
    for _ in range(3):  # (what only the spool holds when the rank dies)
        dist.all_reduce(x)
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("source", ["native", "python"])
def test_a_store_opened_after_attach_gets_the_meta_once_when_the_spool_is_forwarded(tmp_path, source):
    """(h402) The spool said the meta was stored only after attach's own first write: a store
    that failed at attach and opened at a later tick got the meta from the rank, then again
    from the forwarder of the spool the killed rank left (a reader read two metas for one
    rank).  Now the meta's landing is said whichever write takes it."""
    import time

    from commscope.launch import Job

    if source == "native" and native.load() is None:
        pytest.fail("the native recorder did not build here")
    store, ready = tmp_path / "trace", tmp_path / "ready"
    store.write_text("a file where the store goes\n")
    job = Job(_opened_late_then_killed, 1, args=(str(store), str(ready)),
              env={"COMMSCOPE_JOB": "late", "COMMSCOPE_NATIVE": "1" if source == "native" else "0"}).start()
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert time.monotonic() < deadline, "the rank never attached"
            time.sleep(0.05)
        store.unlink()  # (the recorder's thread opens the store at its next try)
        results = job.join(120)  # (the launcher forwards the dead rank's spool)
        assert not results[0].ok
    finally:
        job.kill()
    events = open_reader(str(store)).read_all()
    assert [e["type"] for e in events if e["type"] in ("meta", "exit")] == ["meta", "exit"], events
    exit_ev = next(e for e in events if e["type"] == "exit")
    assert exit_ev["reason"] == "killed", exit_ev
    assert len([e for e in events if e["type"] == "op" and e["phase"] == "begin"]) >= 5  # the spool's ops too


def test_a_tombstone_no_launcher_claimed_goes_whoever_reads_the_spools_later(tmp_path):
    """A tombstone was removed only by a forwarder of its own job: one nobody read again
    stayed in /dev/shm with its empty crash file (helper-193).  An hour on, any job's pass
    removes it; a younger one stays for its launcher."""
    store, path, _pid, _writer = _forwarded_silent_death(tmp_path)
    crash = path.with_suffix(spool.CRASH_SUFFIX)
    crash.touch()
    assert path.stat().st_size == spool.HEADER_SIZE
    assert spool.dead_spools("another-job", store) == [] and path.exists()  # (young: its launcher's yet)
    old = path.stat().st_mtime - spool.TOMBSTONE_AGE_S - 60
    os.utime(path, (old, old))
    assert spool.dead_spools("another-job", store) == []
    assert not path.exists() and not crash.exists()
