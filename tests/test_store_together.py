"""A directory reader decodes a poll's streams together (``TraceReader.decode_queued``,
``blocks.decode_chunks``): what it returns is what decoding each chunk as it is read
returns, on a live job whose streams grow by uneven pieces (lines torn in two, segments
rotating under the reader, polls cut short by a budget), and through a whole read.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import numpy as np
import orjson
import pytest

from commscope import blockscan
from commscope.bench.synthstore import JobShape, write_store
from commscope.store import open_reader, segments
from commscope.store.base import Batch, TraceReader

pytestmark = pytest.mark.skipif(not blockscan.available(), reason="numba is not installed")


def _stream_files(job: Path) -> dict[int, list[Path]]:
    """Each rank's files in the order its writer made them: segment 0, what was in flight
    when it ended (``open.000000``), segment 1, ..."""
    out: dict[int, list[tuple[int, int, Path]]] = {}
    for p in job.iterdir():
        seg = segments.parse(p.name)
        if seg is not None:
            out.setdefault(seg[0][0], []).append((seg[1], 0, p))
        elif ".open." in p.name:
            rank, number = int(p.name[5:10]), int(p.name.split(".")[2])
            out.setdefault(rank, []).append((number, 1, p))
    return {rank: [p for *_, p in sorted(files)] for rank, files in out.items()}


class _Growing:
    """A copy of a finished job that grows by a random piece of every stream a step, as if
    its ranks were writing it now (a piece may end inside a line).  ``torn``: a segment's
    last line may stay torn as the next segment starts (a writer that died mid-line)."""

    def __init__(self, src: Path, dst: Path, rng: random.Random, torn: bool) -> None:
        dst.mkdir()
        shutil.copy(src / "job.json", dst / "job.json")
        self.dst, self.rng, self.torn = dst, rng, torn
        self.todo = {rank: [(p, p.read_bytes()) for p in files] for rank, files in _stream_files(src).items()}
        self.at = {rank: 0 for rank in self.todo}  # bytes of its file written
        self.short = {rank: 0 for rank in self.todo}  # bytes its file will lack

    def step(self, most: int) -> bool:
        """Whether anything was left to write."""
        grew = False
        for rank, files in self.todo.items():
            want = self.rng.randint(0, most)
            while files and want:
                path, data = files[0]
                if ".open." in path.name:  # (written whole before the next segment, as the writer does)
                    (self.dst / path.name).write_bytes(data)
                    files.pop(0)
                    continue
                if not self.at[rank]:  # (``torn``: its last line may never be all there)
                    self.short[rank] = self.rng.choice([1, 1, self.rng.randint(2, 30)]) if self.torn and self.rng.random() < 0.3 else 0
                stop = len(data) - self.short[rank]
                piece = data[self.at[rank]:min(self.at[rank] + want, stop)]
                with open(self.dst / path.name, "ab") as f:
                    f.write(piece)
                self.at[rank] += len(piece)
                want -= len(piece)
                grew = grew or bool(piece)
                if self.at[rank] >= stop:
                    files.pop(0)
                    self.at[rank] = 0
        return grew or any(self.todo.values())


def _with_json_ops(job: Path) -> None:
    """Now and then a JSON op event among a stream's blocks (an older recorder's, or one
    merged in), its id past the blocks' ids: the reader's highest op id is its."""
    for p in job.iterdir():
        if segments.parse(p.name) is None:
            continue
        rank = segments.parse(p.name)[0][0]
        out = []
        for k, line in enumerate(p.read_bytes().splitlines(keepends=True)):
            out.append(line)
            if k % 50 == 49:
                ev = {"type": "op", "ts": 1_780_000_000_000_000_000 + k, "phase": "begin", "id": 10**6 + k,
                      "op": "barrier", "group": "0", "v": 3, "rank": rank}
                out.append(orjson.dumps(ev) + b"\n")
        p.write_bytes(b"".join(out))


def _by_rank(batches: list[Batch]) -> dict[int, tuple[list[dict], list[dict]]]:
    """Per rank, (op events, other events but heartbeats and samples) in stream order; its
    heartbeats and samples, some of which come as rows (``Batch.beats``), are compared as the
    model keeps them (``liveness``)."""
    out: dict[int, tuple[list[dict], list[dict]]] = {}
    for b in batches:
        for e in b.events:
            if e["type"] not in ("heartbeat", "sample"):
                out.setdefault(e["rank"], ([], []))[0 if e["type"] == "op" else 1].append(e)
        for o in b.ops:
            out.setdefault(o.rank, ([], []))[0].extend(o.events())
    return out


def liveness(batches: list[Batch]) -> dict[int, tuple]:
    """Per rank, what a model that ingested ``batches`` keeps of its heartbeats and samples:
    the latest heartbeat's time and count in flight, the samples' columns (NaN as -1), the
    last sample and why GPU samples are missing, its first and last times."""
    from commscope.analysis.model import TraceModel

    m = TraceModel()
    for b in batches:
        m.ingest(b.events, b.ops, b.spans, b.beats)
    return {r: (rt.last_hb, rt.hb_inflight,
                {k: np.nan_to_num(v, nan=-1.0).tolist() for k, v in rt.samples.arrays().items()},
                rt.samples.last, rt.samples.gpu_error, rt.first_ts, rt.last_ts) for r, rt in m.ranks.items()}


def _alone(reader: TraceReader) -> TraceReader:
    reader.queue_chunks = lambda: None  # type: ignore[method-assign]  # (each chunk decoded as it is read)
    return reader


@pytest.mark.parametrize(("seed", "torn"), [(1, False), (2, False), (3, True), (4, True)])
def test_a_live_job_polled_together_reads_as_each_stream_alone(tmp_path, seed, torn):
    rng = random.Random(seed)
    write_store(str(tmp_path / "src"), JobShape(5, 300, fault="healthy", segment_bytes=rng.choice([8_000, 30_000]),
                                                 seed=seed), job="j")
    _with_json_ops(tmp_path / "src" / "j")
    job = _Growing(tmp_path / "src" / "j", tmp_path / "j", rng, torn)
    job.step(2_000)
    together, alone = open_reader(str(tmp_path / "j")), _alone(open_reader(str(tmp_path / "j")))
    if seed % 2 == 0:  # (what is queued decoded between streams too, as a poll of a whole store does)
        together.QUEUE_BYTES = 6_000
    got: dict[str, list[Batch]] = {"together": [], "alone": []}
    while job.step(rng.choice([300, 3_000, 20_000])):
        budget = rng.choice([None, None, 4_000, 50_000])
        for name, reader in (("together", together), ("alone", alone)):
            got[name].append(reader.poll_batch(budget))
    for name, reader in (("together", together), ("alone", alone)):
        got[name].append(reader.read_all_batch())
    a, b = _by_rank(got["together"]), _by_rank(got["alone"])
    assert a == b
    assert liveness(got["together"]) == liveness(got["alone"])
    rows = sum(b.beats.events() for b in got["together"] if b.beats is not None)
    dicts = sum(e["type"] in ("heartbeat", "sample") for b in got["alone"] for e in b.events)
    assert 8 * rows > dicts and not any(b.beats is not None for b in got["alone"])  # (the first polls' are dicts)
    records = sum(1 for ops, _ in a.values() for e in ops if e["id"] < 10**6)
    if torn:  # (a torn line is counted, and the same both ways)
        assert records <= 5 * 300 * 2 and together.stats.corrupt > 0
    else:
        assert records == 5 * 300 * 2  # (every begin and end, once)
    spans = sum(o.span is not None for batch in got["together"] for o in batch.ops)
    assert spans > len(got["together"])  # (most polls decoded streams together)
    assert not any(o.span is not None for batch in got["alone"] for o in batch.ops)
    for field in ("events", "bytes", "corrupt", "invalid", "invalid_by_reason", "missing_by_rank", "partial_tail"):
        assert getattr(together.stats, field) == getattr(alone.stats, field), field
    tops = {r: together.max_op_id((r, 0)) for r in range(5)}
    assert tops == {r: alone.max_op_id((r, 0)) for r in range(5)} and min(tops.values()) > 10**6


def test_a_torn_segment_end_keeps_a_rank_s_incarnations_in_order(tmp_path):
    """A rank's two incarnations (two streams): the later one's finished segment ends in a
    torn line (decoded at once, with a newer segment there). What the earlier incarnation
    queued in the same poll still comes first, as read alone."""
    job = tmp_path / "j"
    job.mkdir()
    (job / "job.json").write_text('{"world_size": 1, "job": "j"}')

    def lines(tag: int, torn: bytes = b"") -> bytes:
        evs = [{"type": "meta", "ts": 1_780_000_000_000_000_000 + tag, "v": 3, "rank": 0, "world_size": 1,
                "tag": tag},
               {"type": "heartbeat", "ts": 1_780_000_000_000_000_100 + tag, "v": 3, "rank": 0, "inflight": tag}]
        return b"".join(orjson.dumps(e) + b"\n" for e in evs) + torn

    (job / segments.segment_name(0, 0, 0)).write_bytes(lines(0))
    (job / segments.segment_name(0, 1, 0)).write_bytes(lines(1, b'{"type":"heartbe'))
    (job / segments.segment_name(0, 1, 1, 1_780_000_001)).write_bytes(lines(2))
    got = []
    for reader in (open_reader(str(job)), _alone(open_reader(str(job)))):
        got.append([(e["type"], e.get("tag", e.get("inflight"))) for e in reader.poll_batch(None).events])
    assert got[0] == got[1]
    assert [tag for kind, tag in got[0] if kind == "meta"] == [0, 1, 2]


@pytest.mark.parametrize(("seed", "torn"), [(5, False), (6, True)])
def test_a_poll_decoded_together_hands_its_records_over_as_arrays(tmp_path, seed, torn):
    """A poll whose every record a reader decoded together comes with their ``Spans`` (one
    set of columns, each record's rows and rank as arrays); one where any record went
    alone comes without.  Decoded in one go, its records are handed over in those columns,
    no stream's view made (``Unpacked``).  A model ingesting the polls with their spans is
    the model ingesting them without."""
    import sys

    from commscope.analysis.model import TraceModel
    from commscope.oprecords import Unpacked

    sys.path.insert(0, str(Path(__file__).parent))
    from model_compare import differences, model_state

    rng = random.Random(seed)
    write_store(str(tmp_path / "src"), JobShape(6, 300, fault="healthy", seed=seed,
                                                segment_bytes=rng.choice([8_000, 30_000])), job="j")
    job = _Growing(tmp_path / "src" / "j", tmp_path / "j", rng, torn)
    job.step(2_000)
    reader = open_reader(str(tmp_path / "j"))
    if torn:  # (what is queued decoded between streams too: a poll of two sets of columns)
        reader.QUEUE_BYTES = 6_000
    given, plain = TraceModel(), TraceModel()
    with_spans = without = in_columns = 0
    last: Batch | None = None
    while job.step(rng.choice([300, 3_000, 20_000])):
        batch = reader.poll_batch(rng.choice([None, None, 50_000]))
        if batch.spans is not None:
            sp = batch.spans
            if isinstance(batch.ops, Unpacked):
                assert batch.ops.spans is sp and all(made is None for made in batch.ops._made)
                in_columns += 1
            assert sp.of(batch.ops) and len(batch.ops) == sp.ranks.shape[0]
            for k, o in enumerate(batch.ops):
                assert o.span is not None and o.span.whole is sp.whole and o.rank == int(sp.ranks[k])
                assert o.span.start == int(sp.start[k]) and len(o) == int(sp.start[k + 1] - sp.start[k]) > 0
            with_spans += 1
            if last is None or len(batch.ops) > len(last.ops):
                last = batch
        elif batch.ops:
            assert any(o.span is None or o.span.whole is not batch.ops[0].span.whole for o in batch.ops)
            without += 1
        given.ingest(batch.events, batch.ops, batch.spans, batch.beats)
        plain.ingest(batch.events, batch.ops, beats=batch.beats)
    assert with_spans >= 3 and without >= 1  # (the first polls learn each stream's tables alone)
    assert in_columns >= 3
    assert differences(model_state(given), model_state(plain)) == []
    # spans that are not the records' (one fewer, reversed) are not taken for them
    assert last is not None and last.spans is not None
    ops, sp = last.ops, last.spans
    assert len(ops) > 1 and not sp.of(ops[:-1]) and not sp.of(ops[1:]) and not sp.of(ops[::-1])
    a, b = TraceModel(), TraceModel()
    a.ingest([], ops[::-1], sp)
    b.ingest([], ops[::-1])
    assert differences(model_state(a), model_state(b)) == []


def test_heartbeats_and_samples_taken_as_rows_keep_each_rank_s_order(tmp_path):
    """A poll decoded together takes the heartbeats and samples of its streams as rows
    (``Batch.beats``), but a rank whose own lines say more keeps them as dicts, in line
    order, as a reader of each stream alone gives them: rank 0's chunk holds a sample that
    says why GPU samples are missing (all its stay dicts); rank 1's segment ends in a last
    line without its newline, a sample decoded after the others were taken (its rows go
    back where they were taken, before it); rank 2's are rows."""
    job = tmp_path / "j"
    job.mkdir()
    (job / "job.json").write_text('{"world_size": 3, "job": "j"}')
    t0 = 1_780_000_000_000_000_000

    def line(e: dict) -> bytes:  # (as the recorders write one: its version, then its rank, last)
        rank = e.pop("rank")
        return orjson.dumps({**e, "v": 3, "rank": rank})

    def meta(r: int) -> bytes:
        return line({"type": "meta", "ts": t0, "rank": r, "world_size": 3}) + b"\n"

    def beats(r: int, k: int, **more: object) -> list[bytes]:
        return [line({"type": "heartbeat", "ts": t0 + k * 1000, "inflight": k, "rank": r}),
                line({"type": "sample", "ts": t0 + k * 1000 + 1, "cpu": 10.5 + k, "rss": 1000 + k, **more,
                      "rank": r})]

    def write(r: int, number: int, data: bytes) -> None:
        path = job / segments.segment_name(r, 0, number, 1_780_000_000 + number)
        with open(path, "ab") as f:
            f.write(data)

    for r in range(3):
        write(r, 0, meta(r) + b"\n".join(beats(r, 1)) + b"\n")
    together, alone = open_reader(str(job)), _alone(open_reader(str(job)))
    got: dict[str, list[Batch]] = {"together": [], "alone": []}
    for name, reader in (("together", together), ("alone", alone)):
        got[name].append(reader.poll_batch(None))
    write(0, 0, b"\n".join([*beats(0, 2), *beats(0, 3, gpu_error="no NVML"), *beats(0, 4)]) + b"\n")
    write(1, 0, b"\n".join([*beats(1, 2), *beats(1, 3)]) + b"\n" + beats(1, 4)[1])  # (no newline: read as final)
    write(1, 1, b"\n".join(beats(1, 5)) + b"\n")
    write(2, 0, b"\n".join([*beats(2, 2), *beats(2, 3)]) + b"\n")
    write(2, 1, b"")  # (a newer segment of rank 2 too, so its newest does not end the poll's streams early)
    for name, reader in (("together", together), ("alone", alone)):
        got[name].append(reader.poll_batch(None))
    polled = got["together"][1]
    assert polled.beats is not None and polled.beats.rank.tolist() == [2]  # (ranks 0 and 1: dicts)
    assert polled.beats.count.tolist() == [4] and polled.beats.beat_ts.tolist() == [t0 + 3000]
    assert isinstance(polled.beats.last[0], bytes)  # (the last sample's line: decoded when asked)

    def liveness_dicts(batch: Batch, r: int) -> list[dict]:
        return [e for e in batch.events if e["rank"] == r and e["type"] in ("heartbeat", "sample")]

    for r in (0, 1):
        assert liveness_dicts(polled, r) == liveness_dicts(got["alone"][1], r)
        assert [e["ts"] for e in liveness_dicts(polled, r)] == sorted(e["ts"] for e in liveness_dicts(polled, r))
    assert len(liveness_dicts(polled, 0)) == 6 and len(liveness_dicts(polled, 1)) == 7
    assert not any(e["type"] == "rows taken" for e in polled.events)
    assert liveness(got["together"]) == liveness(got["alone"])
    assert together.stats.events == alone.stats.events


def test_rows_put_back_go_where_their_lines_were_among_a_first_chunk_s_events(tmp_path):
    """A stream's first chunk (a head: its meta and the groups its first block defines;
    then blocks, heartbeats, samples and an exit among them) decoded together takes the
    rest's heartbeats and samples as rows. Rank 1's segment then ends in a sample without
    its newline, decoded after them as a dict: its rows go back each where its line was,
    after the head's events and around the exit, so its events come in the order a reader
    of each stream alone gives them."""
    write_store(str(tmp_path / "src"), JobShape(2, 20, fault="healthy"), job="j")
    job = tmp_path / "j"
    job.mkdir()
    shutil.copy(tmp_path / "src" / "j" / "job.json", job / "job.json")
    for r in range(2):
        lines = (tmp_path / "src" / "j" / segments.segment_name(r, 0, 0)).read_bytes().splitlines()
        assert lines[1].startswith(b'{"type":"sample"') and lines[2].startswith(b'{"type":"heartbeat"')
        lines = [lines[0], *lines[3:]]  # (a head of its meta alone: the rest's are rows)
        lines.insert(8, orjson.dumps({"type": "exit", "ts": 1_780_000_001_300_000_001, "code": 0, "v": 3,
                                      "rank": r}))
        data = b"\n".join(lines) + b"\n"
        if r == 1:  # (a last line without its newline, a newer segment there: read as it is, after the rest)
            data += orjson.dumps({"type": "sample", "ts": 1_780_000_009_000_000_000, "cpu": 5.0, "v": 3, "rank": 1})
            (job / segments.segment_name(1, 0, 1, 1_780_000_010)).write_bytes(b"")
        (job / segments.segment_name(r, 0, 0)).write_bytes(data)
    together, alone = open_reader(str(job)), _alone(open_reader(str(job)))
    got = {"together": [together.poll_batch(None)], "alone": [alone.poll_batch(None)]}
    polled = got["together"][0]
    assert polled.beats is not None and polled.beats.rank.tolist() == [0]  # (rank 1's went back)
    each = got["alone"][0].events
    assert [e for e in polled.events if e["rank"] == 1] == [e for e in each if e["rank"] == 1]
    assert [e for e in polled.events if e["rank"] == 0] == [
        e for e in each if e["rank"] == 0 and e["type"] not in ("heartbeat", "sample")]
    kinds = [e["type"] for e in polled.events if e["rank"] == 1]
    assert kinds[0] == "meta" and "exit" in kinds and kinds.count("sample") > 2 and kinds[-1] == "sample"
    assert liveness(got["together"]) == liveness(got["alone"])
    assert together.stats.events == alone.stats.events
