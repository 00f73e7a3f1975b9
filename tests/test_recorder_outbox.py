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


def test_a_full_outbox_drops_the_oldest_and_counts_records_inside_dropped_blocks():
    box, _ = _box()
    box.PENDING_CAP = 3
    box.put(blocks.encode_block(b"", 0, 1, 5))
    for i in range(4):
        box.put(b'{"type":"heartbeat","ts":%d}' % i)
    assert len(box.pending) == 3
    assert box.dropped == 2 and box.dropped_records == 5


def test_a_failing_store_keeps_what_it_did_not_take_and_backs_off():
    box, warned = _box()
    writer = FlakyWriter(accept=1)
    box.opened(writer, b"meta")
    box.put(b"a")
    box.put(b"b")
    assert not box.write_once()
    assert writer.stored == [b"meta"] and list(box.pending) == [b"a", b"b"]
    assert box.error == "disk full" and box.backing_off()
    assert [key for key, _ in warned] == ["store"]
    writer.accept = None
    assert box.write_once()
    assert writer.stored == [b"meta", b"a", b"b"] and not box.pending and box.error is None


def test_the_last_write_reports_what_is_lost_and_closes_the_writer(capsys):
    box, _ = _box()
    box.FINAL_WRITE_S = 0.0
    writer = FlakyWriter(accept=0)
    box.opened(writer, blocks.encode_block(b"", 0, 1, 4))
    box.put(b"x")
    box.write_final(lambda: True, "rank 2", "/somewhere")
    err = capsys.readouterr().err
    assert "rank 2: 2 trace events (4 op records in blocks)" in err and "/somewhere" in err
    assert not box.pending and writer.closed
