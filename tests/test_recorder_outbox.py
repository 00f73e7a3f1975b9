"""The recorder thread's writer side (``record.outbox.Outbox``) on its own: bounds, drop
counts, a failing store and the last write at exit.  No torch.distributed needed."""

from __future__ import annotations

from commscope import blocks
from commscope.events import SCHEMA_VERSION
from commscope.record.outbox import Outbox
from commscope.store import StoreError


class FlakyWriter:
    """Takes ``accept`` lines of the next batch, then fails (None: takes everything)."""

    def __init__(self, accept: int | None = None):
        self.accept = accept
        self.stored: list[bytes] = []
        self.closed = False

    def write(self, lines: list[bytes]) -> None:
        if self.accept is None:
            self.stored.extend(lines)
            return
        self.stored.extend(lines[:self.accept])
        raise StoreError("disk full", written=self.accept)

    def close(self) -> None:
        self.closed = True


def _box() -> tuple[Outbox, list[tuple[str, str]]]:
    warned: list[tuple[str, str]] = []
    return Outbox(lambda key, message: warned.append((key, message))), warned


def test_block_lines_carry_the_schema_version_and_their_record_count():
    line = blocks.encode_block(b"\0" * 40, rank=3, ts=5, count=7)
    assert line.startswith(blocks.LINE_PREFIX)
    assert b'"v":%d,' % SCHEMA_VERSION in line
    assert blocks.records_in_line(line) == 7
    assert blocks.records_in_line(b'{"type":"op","n":7}') == 0  # not a block: no op records


def test_a_full_outbox_drops_the_oldest_lines_by_bytes_but_never_a_ring_block():
    box, _ = _box()
    box.cap_bytes = 100
    ring_block = blocks.encode_block(b"\0" * 300, 0, 1, 5, pos=0, end=300)
    box.put(ring_block, ring_end=300)  # its records wait in the spool's ring: bounded there
    stray = blocks.encode_block(b"", 0, 1, 4)  # a block that is not the ring's (no position)
    box.put(stray)
    for i in range(4):
        box.put(b'{"type":"heartbeat","ts":%d}' % i)  # 27-28 bytes each
    assert box.bytes <= 100
    assert [item.data for item in box.pending][0] == ring_block
    assert len(box.pending) == 4  # the ring block and the three newest heartbeats
    assert box.dropped == 2 and box.dropped_records == 4  # the stray block and the oldest heartbeat


def test_a_failing_store_keeps_what_it_did_not_take_in_order_and_backs_off():
    forwarded = []
    warned: list[tuple[str, str]] = []
    box = Outbox(lambda key, message: warned.append((key, message)), on_forwarded=forwarded.append)
    writer = FlakyWriter(accept=2)
    box.opened(writer, b"meta")
    box.put(b"blockA", ring_end=10)
    box.put(b"a")
    box.put(b"blockB", ring_end=20)
    box.put(b"b")
    assert not box.write_once()
    assert writer.stored == [b"meta", b"blockA"] and forwarded == [10]  # the ring may free up to 10
    assert [item.data for item in box.pending] == [b"a", b"blockB", b"b"]
    assert box.error == "disk full" and box.backing_off()
    assert [key for key, _ in warned] == ["store"]
    writer.accept = None
    assert box.write_once()
    assert writer.stored == [b"meta", b"blockA", b"a", b"blockB", b"b"] and not box.pending
    assert box.error is None and forwarded == [10, 20] and box.bytes == 0


class Clock:
    """``time`` for the outbox: a monotonic clock that moves only when it sleeps."""

    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


def test_the_last_write_says_what_refused_the_store_not_the_deadline_s_want_of_time(capsys, monkeypatch):
    """A store refused all along (full, a wrong password) and tried again at exit until the
    deadline: the last try fails for want of time ("no answer within 0 s"), which is not
    why the events were not written (helper-163: every rank said so)."""
    from commscope.record import outbox

    monkeypatch.setattr(outbox, "time", Clock())
    box, _ = _box()
    box.FINAL_WRITE_S = 1.0
    tries = []

    def refused(timeout: float) -> bool:
        tries.append(timeout)
        box.failed("cannot use redis://h:1/0: Redis said: ERR max number of clients reached" if len(tries) == 1
                   else f"cannot connect to redis://h:1/0: no answer within {timeout:g} s")
        return False

    box.put(b"x")
    box.write_final(refused, "rank 1", "redis://h:1/0", kept="/dev/shm/y.spool")
    assert len(tries) > 2 and tries[-1] == 0 and box.error.endswith("no answer within 0 s")
    err = capsys.readouterr().err
    assert "could not be written at exit to redis://h:1/0: cannot use redis://h:1/0: Redis said: ERR max number " \
           "of clients reached; they wait in /dev/shm/y.spool" in err, err
    box.failed("cannot log in to redis://h:1/0: wrong password or user name")  # (before the exit: the cause)
    box.put(b"y")
    box.write_final(refused, "rank 1", "redis://h:1/0")
    err = capsys.readouterr().err
    assert "no answer" not in err and "wrong password or user name" in err, err


def test_the_last_write_reports_what_is_lost_and_closes_the_writer(capsys):
    box, _ = _box()
    box.FINAL_WRITE_S = 0.0
    writer = FlakyWriter(accept=0)
    box.opened(writer, b"meta")
    box.put(blocks.encode_block(b"", 0, 1, 4, pos=0, end=96), ring_end=96)
    box.put(b"x")
    box.write_final(lambda _timeout: True, "rank 2", "/somewhere", kept="/dev/shm/x.spool")
    err = capsys.readouterr().err
    assert "rank 2: 3 trace events (4 op records in blocks)" in err and "/somewhere" in err
    assert "they wait in /dev/shm/x.spool for a forwarder" in err
    assert not box.pending and writer.closed
