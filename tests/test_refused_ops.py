"""An op the backend refuses as it is called was never issued: it takes no sequence number.

Rank 2 of 3 Gloo ranks calls ``broadcast(src=99)``; ProcessGroupGloo raises "invalid root
rank" inside the call, before it issues anything (torch's own sequence number does not
move).  The rank catches it and goes on with the same all_reduces as the others.  Both
recorders (native, and the Python fallback: ``COMMSCOPE_NATIVE=0``) must record the
broadcast as a failed op of rank 2 with no seq, so that rank 2's later collectives keep
the numbers the others give them: no false ``collective_mismatch``, one ``op_failed`` blamed
on rank 2 itself, and a later hang names the rank that never came, not a victim.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import failure_workers as W
import pytest
from trace_helpers import ops

from commscope.analysis import TraceModel, diagnose
from commscope.analysis.source import load_trace, open_source
from commscope.cli import main as cli
from commscope.launch import Job
from commscope.record import native
from commscope.store import AsOf

pytestmark = pytest.mark.timeout(240)
STEPS, REFUSED_AT = 8, 3


def refused_broadcast(t, before=None) -> None:  # noqa: ANN001
    """``broadcast(src=99)``, which Gloo refuses ("invalid root rank"); ``before`` (None:
    nothing) runs inside the call, after the Python recorder's begin and before the backend
    (``_rank_not_in_group``: broadcast's last step before it)."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    real = c10d._rank_not_in_group

    def hooked(group):  # noqa: ANN001, ANN202
        c10d._rank_not_in_group = real
        before()
        return real(group)

    if before is not None:
        c10d._rank_not_in_group = hooked
    try:
        dist.broadcast(t, src=99)
    except RuntimeError as exc:
        assert "invalid root rank" in str(exc)
    else:
        raise AssertionError("broadcast(src=99) returned")


def refused_then_maybe_hang(rank: int, ws: int, store: str, release: str, hang: bool, drain: bool = False) -> str:
    """Rank 2 calls broadcast(src=99) before all_reduce #4 (caught); then STEPS all_reduces
    and a barrier on every rank.  With ``hang``, rank 1 then waits for ``release`` while
    ranks 0 and 2 wait in one more all_reduce, which it joins once released.  With ``drain``
    (the Python recorder), the recorder's thread drains the broadcast's begin, seq and all,
    between the call and Gloo's refusal: the recorder can no longer take the number back
    from the begin, and only its end says so."""
    import torch
    import torch.distributed as dist

    from commscope.record.recorder import active

    W.start(store, 1.0)
    rec = active()
    source = type(rec.ops).__name__
    t = torch.ones(4)
    def drained() -> None:
        while not rec.flush(timeout=60.0):  # two whole ticks: the begin drained
            pass

    for step in range(STEPS):
        if step == REFUSED_AT and rank == 2:
            refused_broadcast(t, drained if drain else None)
        dist.all_reduce(t)
        t.fill_(1.0)
    dist.barrier()
    if hang:
        W.flush()
        if rank == 1:
            W.wait_release(release)
        dist.all_reduce(t)
    W.finish()
    return source


@pytest.fixture(scope="module")
def native_built():
    if native.load(build=True) is None:
        pytest.skip(f"the native recorder cannot be built here: {native.error()}")


@pytest.fixture(params=["native", "python"])
def source(request):
    if request.param == "native":
        request.getfixturevalue("native_built")
    return request.param


def _env(source: str) -> dict[str, str]:
    return {"COMMSCOPE_NATIVE": "1" if source == "native" else "0"}


def _want_source(source: str) -> str:
    return "NativeOps" if source == "native" else "PythonOps"


def _ran(fn, ranks: int, args: tuple, source: str) -> list:
    """Run ``fn`` on ``ranks`` Gloo ranks with ``source``'s recorder; each rank's value (every
    rank must have returned)."""
    job = Job(fn, ranks, args=args, env=_env(source), pg_timeout=60).start()
    try:
        results = job.join(120)
    finally:
        job.kill()
    assert all(results[r].ok for r in range(ranks)), [results[r].error for r in range(ranks)]
    return [results[r].value for r in range(ranks)]


def _check(store: str, capsys) -> dict:
    capsys.readouterr()
    code = cli(["check", store, "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == (1 if any(f["severity"] == "error" for f in out["findings"]) else 0)
    return out


def _errors(findings) -> list[tuple[str, list[int]]]:
    return [(f["kind"], f["culprits"]) for f in findings if f["severity"] == "error"]


def _assert_numbering(store: str, extra: int) -> dict:
    """Every rank's collectives are numbered alike; rank 2's broadcast is failed and unnumbered,
    in the events and in the model (which matches the others' all_reduce #4 with rank 2's).
    Returns the broadcast's begin event."""
    events = open_source(store).read_all()
    want = [("all_reduce", s) for s in range(1, STEPS + 1)] + [("barrier", STEPS + 1)]
    want += [("all_reduce", STEPS + 2)] * extra
    for rank in range(3):
        top = [o for o in ops(events, rank) if not o.get("nested")]
        numbered = [(o["op"], o.get("seq")) for o in top if o["op"] != "broadcast"]
        assert numbered == want, (rank, numbered)
        refused = [o for o in top if o["op"] == "broadcast"]
        if rank != 2:
            assert refused == []
            continue
        (b,) = refused
        assert "seq" not in b, b  # (``ops``: not where its end withdraws it)
        assert b["phases"]["end"].get("unissued") is True, b
    failed = [e for e in events if e.get("type") == "op" and e.get("phase") == "end" and e.get("exc")]
    assert [(e["rank"], "invalid root rank" in e["exc"]) for e in failed] == [(2, True)]
    # the model, from the events (their dicts) and from the store (its columns), alike
    for model in (TraceModel(), load_trace(store)[0]):
        if not model.ranks:
            model.ingest(events)
        top = [model.op(2, i) for i in range(model.ranks[2].n)]
        top = [o for o in top if not o.get("nested")]
        assert [o.get("seq") for o in top if o["op"] == "broadcast"] == [None]
        numbered = [(o["op"], o.get("seq")) for o in top if o["op"] != "broadcast"]
        assert numbered == want
        assert model.collective("0", REFUSED_AT + 1) == {r: want_index(model, r) for r in range(3)}
    return b["phases"]["begin"]


def want_index(model: TraceModel, rank: int) -> int:
    """The op index of the rank's all_reduce #REFUSED_AT+1."""
    rt = model.ranks[rank]
    return next(i for i in range(rt.n) if model.op(rank, i).get("seq") == REFUSED_AT + 1
                and model.op(rank, i)["op"] == "all_reduce")


def _assert_refusal_finding(findings) -> None:
    (f,) = [f for f in findings if f["kind"] == "op_failed"]
    assert f["culprits"] == [2]
    assert "raised on rank 2 itself" in f["message"]
    assert not [f for f in findings if f["kind"] == "collective_mismatch"]


def test_a_refused_op_takes_no_sequence_number(tmp_path, capsys, source):
    store, release = str(tmp_path / "trace"), str(tmp_path / "release")
    assert set(_ran(refused_then_maybe_hang, 3, (store, release, False), source)) == {_want_source(source)}
    _assert_numbering(store, extra=0)
    out = _check(store, capsys)
    assert _errors(out["findings"]) == [("op_failed", [2])]
    _assert_refusal_finding(out["findings"])


def test_a_refused_op_whose_begin_was_drained_first_takes_no_sequence_number(tmp_path, capsys):
    """The recorder's thread drains the begin of the refused broadcast, numbered, in the
    moment between the call and Gloo's refusal (forced here; a loaded CI host did it by
    chance): the begin in the store keeps its number, the end says ``unissued``, and readers
    withdraw it, so everything reads as when the begin was rewritten in time.  (The Python
    recorder: a hook between its begin and the backend; the native recorder writes the same
    end, read the same way.)"""
    store, release = str(tmp_path / "trace"), str(tmp_path / "release")
    _ran(refused_then_maybe_hang, 3, (store, release, False, True), "python")
    begin = _assert_numbering(store, extra=0)
    assert begin["seq"] == REFUSED_AT + 1, begin  # (drained before the refusal: kept its number)
    out = _check(store, capsys)
    assert _errors(out["findings"]) == [("op_failed", [2])]
    _assert_refusal_finding(out["findings"])


def refused_while_another_thread_takes_a_number(rank: int, ws: int, store: str) -> None:
    """Rank 2's broadcast(src=99) takes #4; before Gloo refuses it, another thread of rank 2
    runs an all_reduce, which takes #5 (Gloo pairs it with the others' 4th all_reduce): the
    broadcast's number then stays (the counter went on past it).  Every rank runs STEPS
    all_reduces and a barrier."""
    import threading

    import torch
    import torch.distributed as dist

    W.start(store, 1.0)
    t = torch.ones(4)
    works: list = []

    def meanwhile() -> None:
        # (issued, not waited on until the broadcast is refused: a wait would tell the
        # recorder the broadcast may have issued something, and it keeps its number)
        other = threading.Thread(target=lambda: works.append(dist.all_reduce(torch.ones(4), async_op=True)))
        other.start()
        other.join()

    for step in range(STEPS):
        if step == REFUSED_AT and rank == 2:
            refused_broadcast(t, meanwhile)
            works[0].wait()
            continue  # (the other thread ran this step's all_reduce)
        dist.all_reduce(t)
        t.fill_(1.0)
    dist.barrier()
    W.finish()


def test_a_refused_op_whose_number_stays_does_not_say_it_gave_it_back(tmp_path):
    """Where the number stayed (another thread's op took the next one), the end does not say
    ``unissued``: readers keep the begin's number, as the recorder did (the Python recorder;
    the native one numbers the broadcast in its dispatch, after the hook)."""
    store = str(tmp_path / "trace")
    _ran(refused_while_another_thread_takes_a_number, 3, (store,), "python")
    events = open_source(store).read_all()
    top = [o for o in ops(events, 2) if not o.get("nested")]
    assert [(o["op"], o.get("seq")) for o in top][REFUSED_AT:REFUSED_AT + 3] == [
        ("broadcast", REFUSED_AT + 1), ("all_reduce", REFUSED_AT + 2), ("all_reduce", REFUSED_AT + 3)]
    (b,) = [o for o in top if o["op"] == "broadcast"]
    assert "invalid root rank" in b["phases"]["end"]["exc"] and "unissued" not in b["phases"]["end"], b
    model = load_trace(store)[0]
    assert [model.op(2, i).get("seq") for i in range(model.ranks[2].n)
            if model.op(2, i)["op"] == "broadcast"] == [REFUSED_AT + 1]


def test_a_hang_after_a_refused_op_names_the_rank_that_never_came(tmp_path, capsys, source):
    """Live, at every poll: no error finding names a rank but 1 (the one that never came) or
    2 (whose refused op failed); once the hang shows, it is rank 1's, with ranks 0 and 2 in
    it, matched at the same seq.  Then rank 1 comes and the job ends cleanly."""
    store, release = str(tmp_path / "trace"), str(tmp_path / "release")
    job = Job(refused_then_maybe_hang, 3, args=(store, release, True), env=_env(source), pg_timeout=60).start()
    model, reader, as_of, hang = TraceModel(), None, AsOf(), None
    try:
        end = time.monotonic() + 90
        while hang is None and job.alive() and time.monotonic() < end:
            time.sleep(0.2)
            if reader is None:
                try:
                    reader = open_source(store)
                except Exception:
                    continue
            model.ingest(reader.poll())
            findings = [f.to_json() for f in diagnose(model, now=as_of.now(reader, time.time_ns()), hang_after=1.0)]
            errors = _errors(findings)
            assert all(set(c) <= {1, 2} for _, c in errors), findings
            assert all(k != "collective_mismatch" for k, _ in errors), findings
            assert all(c == [2] for k, c in errors if k == "op_failed"), findings
            hang = next((f for f in findings if f["kind"] == "missing_ranks"), None)
        assert hang is not None, "the hang was not diagnosed while the job ran"
        assert hang["culprits"] == [1]
        assert (hang["evidence"]["entered"], hang["evidence"]["missing"]) == ([0, 2], [1])
        assert hang["seq"] == STEPS + 2
        Path(release).touch()
        results = job.join(120)
    finally:
        job.kill()
    assert all(results[r].ok for r in range(3)), [results[r].error for r in range(3)]
    _assert_numbering(store, extra=1)
    out = _check(store, capsys)
    assert _errors(out["findings"]) == [("op_failed", [2])]
    _assert_refusal_finding(out["findings"])


def refused_p2p(rank: int, ws: int, store: str) -> None:
    """Rank 0 sends to itself (torch refuses: ValueError), isends to itself and receives from
    itself (Gloo refuses: no pair to itself), all caught, between exchanges with rank 1."""
    import torch
    import torch.distributed as dist

    W.start(store, 1.0)
    x = torch.ones(4)
    for step in range(4):
        if step == 2 and rank == 0:
            for refused in (lambda: dist.send(x, dst=0), lambda: dist.isend(x, dst=0).wait(),
                            lambda: dist.recv(x, src=0)):
                try:
                    refused()
                except (ValueError, RuntimeError):
                    pass
                else:
                    raise AssertionError("a p2p op with this rank was not refused")
        if rank == 0:
            dist.send(x, dst=1)
            dist.recv(x, src=1)
        else:
            dist.recv(x, src=0)
            dist.send(x, dst=0)
    dist.barrier()
    W.finish()


def test_refused_p2p_ops_take_no_number_of_the_pair(tmp_path, capsys, source):
    """Later sends and recvs between ranks 0 and 1 keep the numbers the other side gives
    them (no unmatched_p2p), and the refusals are one op_failed on rank 0 itself, titled
    without a peer it never had ("send from any" was said of the refused send)."""
    store = str(tmp_path / "trace")
    _ran(refused_p2p, 2, (store,), source)
    events = open_source(store).read_all()
    pairs = {r: [(o["op"], o.get("peer"), o.get("seq")) for o in ops(events, r) if not o.get("nested")
                 and o["op"] in ("send", "recv") and "seq" in o] for r in range(2)}
    assert pairs[0] == [(op, 1, n) for n in range(1, 5) for op in ("send", "recv")]
    assert pairs[1] == [(op, 0, n) for n in range(1, 5) for op in ("recv", "send")]
    out = _check(store, capsys)
    assert _errors(out["findings"]) == [("op_failed", [0])]
    (f,) = out["findings"]
    # (the native recorder hears of the send only as it fails, before its peer and group;
    # the Python one wraps the call)
    title = "send (group ?)" if source == "native" else "send to 0 (group 0)"
    assert f["message"].startswith(f"{title} failed on rank 0 (ValueError: Invalid destination rank")
    assert "raised on rank 0 itself" in f["message"]
