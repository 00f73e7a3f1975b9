"""A Redis reader's poll decodes its streams' clean entries together (one line an entry:
queued as those lines, ``TraceReader.decode_queued_streams``, ``blocks.decode_chunks``):
what it returns is what decoding each stream's entries as they are read returns, on a live
job written through the real writers in uneven pieces, with budgets, a foreign entry and
entries Redis lost in the middle."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from redis_fixture import *  # noqa: F403  (the redis_server and redis_url fixtures)
from redis_fixture import redis_client
from test_store_together import _by_rank, _stream_files, liveness

from commscope import blockscan
from commscope.analysis.model import TraceModel
from commscope.bench.synthstore import JobShape, write_store
from commscope.store import open_reader, open_writer
from commscope.store.base import Batch, TraceReader
from commscope.store.redis_store import Keys

pytestmark = pytest.mark.skipif(not blockscan.available(), reason="numba is not installed")


def _lines(job: Path) -> dict[int, list[bytes]]:
    """Each rank's lines as its directory writer wrote them (segments in order; what was in
    flight at a segment's end is the directory store's own, not a line of the stream)."""
    return {rank: [line for p in paths if ".open." not in p.name for line in p.read_bytes().splitlines()]
            for rank, paths in _stream_files(job).items()}


def _alone(reader: TraceReader) -> TraceReader:
    reader.queue_chunks = lambda: None  # type: ignore[method-assign]  # (each stream's entries decoded as read)
    return reader


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_live_job_polled_together_reads_as_each_stream_alone(tmp_path, redis_url, seed):
    rng = random.Random(seed)
    write_store(str(tmp_path / "src"), JobShape(5, 250, fault="healthy", seed=seed), job="j")
    todo = _lines(tmp_path / "src" / "j")
    tail0 = todo[0][-60:]  # (rank 0's last lines, written with the foreign entry after them: one poll's two pages)
    del todo[0][-60:]
    writers = {r: open_writer(redis_url, "j", r, {"world_size": 5}) for r in todo}
    together, alone = open_reader(redis_url + "?job=j"), _alone(open_reader(redis_url + "?job=j"))
    if seed == 2:  # (what is queued decoded between pages too)
        together.QUEUE_BYTES = 3_000
    together.PAGE = alone.PAGE = 50  # (a stream's new entries in several pages of a poll)
    got: dict[str, list[Batch]] = {"together": [], "alone": []}
    lost = foreign = False
    while not foreign:
        wrote = {}
        for r, left in todo.items():
            k = rng.randint(0, min(len(left), rng.choice([3, 40, 400])))
            if k:
                writers[r].write(left[:k])
                del left[:k]
            wrote[r] = k
        c = redis_client(redis_url)
        if not lost and wrote[1] >= 3 and todo[1]:  # two of rank 1's new entries lost (Redis without persistence)
            ids = [eid for eid, _ in c.xrange(Keys.stream("j", 1))]
            c.xdel(Keys.stream("j", 1), *ids[-3:-1])
            lost = True
        if not any(todo.values()):  # an entry of another program, once rank 0 wrote all (its writer stops there)
            writers[0].write(tail0)
            c.xadd(Keys.stream("j", 0), {"something": "else"})
            foreign = True
        c.close()
        budget = rng.choice([None, None, 3_000, 40_000])
        for name, reader in (("together", together), ("alone", alone)):
            got[name].append(reader.poll_batch(budget))
    assert lost
    for name, reader in (("together", together), ("alone", alone)):
        got[name].append(reader.read_all_batch())
    a, b = _by_rank(got["together"]), _by_rank(got["alone"])
    assert a == b and sum(len(ops) for ops, _ in a.values()) > 5 * 250
    assert liveness(got["together"]) == liveness(got["alone"])
    assert any(b.beats is not None for b in got["together"]) and not any(b.beats is not None for b in got["alone"])
    assert sum(o.span is not None for batch in got["together"] for o in batch.ops) >= 5  # (decoded together)
    assert not any(o.span is not None for batch in got["alone"] for o in batch.ops)
    for field in ("events", "records", "chunks", "bytes", "corrupt", "invalid", "invalid_by_reason", "missing_by_rank",
                  "partial_tail"):
        assert getattr(together.stats, field) == getattr(alone.stats, field), field
    assert together.stats.corrupt >= 1 and together.missing == alone.missing == {1: 2}
    assert together.stats.warnings == alone.stats.warnings
    tops = {r: together.max_op_id((r, 0)) for r in range(5)}
    assert tops == {r: alone.max_op_id((r, 0)) for r in range(5)}
    given, plain = TraceModel(), TraceModel()
    for batch in got["together"]:
        given.ingest(batch.events, batch.ops, batch.spans, batch.beats)
    for batch in got["alone"]:
        plain.ingest(batch.events, batch.ops)
    assert sorted(given.ranks) == sorted(plain.ranks) and given.events == plain.events
    for r in given.ranks:
        assert given.ranks[r].n == plain.ranks[r].n
        assert given.ranks[r].begin[:given.ranks[r].n].tolist() == plain.ranks[r].begin[:plain.ranks[r].n].tolist()
    for w in writers.values():
        w.close()
