"""Varlen fails together: a local problem on one rank (a meta, nested or sparse tensor; sizes= that
disagree) makes every rank raise the same error, never hang (real Gloo ranks)."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

from commscope import varlen
from commscope.launch import run_ranks


def _bad(kind: str) -> torch.Tensor:
    if kind == "meta":
        return torch.empty(3, 2, device="meta")
    if kind == "nested":
        return torch.nested.nested_tensor([torch.ones(2, 2), torch.ones(3, 2)])
    if kind == "jagged":
        return torch.nested.nested_tensor([torch.ones(2, 2), torch.ones(3, 2)], layout=torch.jagged)
    return torch.ones(3, 2).to_sparse()


def _call(name: str, kind: str, rank: int, ws: int) -> None:
    good = torch.ones(3, 2) * rank
    culprit = ws - 1
    t = _bad(kind) if rank == culprit else good
    if name == "all_gather_v":
        varlen.all_gather_v(t)
    elif name == "gather_v":
        varlen.gather_v(t, dst=0)
    elif name == "all_to_all_v":
        varlen.all_to_all_v([t] * ws)
    elif name == "reduce_scatter_v":
        varlen.reduce_scatter_v(t if rank == culprit else torch.ones(ws, 2), [1] * ws)
    elif name == "broadcast_v":
        varlen.broadcast_v(_bad(kind) if rank == 0 else None, src=0)
    elif name == "scatter_v":
        varlen.scatter_v([good] * (ws - 1) + [_bad(kind)] if rank == 0 else None, src=0)
    elif name == "scatter_v_split":
        varlen.scatter_v(_bad(kind) if rank == 0 else None, src=0, split_sizes=[1] * (ws - 1) + [3 - ws + 1])
    elif name == "send_tensors":
        if rank == 0:
            varlen.send_tensors([good, _bad(kind)], dst=1)
        elif rank == 1:
            varlen.recv_tensors(src=0)
    else:
        raise AssertionError(name)


def _sized(name: str, rank: int, ws: int) -> None:
    """sizes= cases, in checking mode (check_sizes=True or $COMMSCOPE_VARLEN_CHECK=1)."""
    n = 3 + rank
    t = torch.ones(n, 2)
    true = [3 + r for r in range(ws)]
    last = rank == ws - 1
    if name == "tensor_disagrees":
        varlen.all_gather_v(torch.ones(n + 1, 2) if last else t, sizes=true)
    elif name == "one_rank_only":
        varlen.all_gather_v(t, sizes=true if last else None)
    elif name == "differ_across_ranks":  # each consistent with its own tensor
        varlen.all_gather_v(t, sizes=[s + 1 if (last and r != rank) else s for r, s in enumerate(true)])
    elif name == "gather_disagrees":
        varlen.gather_v(t, dst=0, sizes=[s + (1 if last else 0) for s in true])
    elif name == "fine":
        out = varlen.all_gather_v(t, sizes=true, cat=True)
        assert out.shape == (sum(true), 2)
        out = varlen.gather_v(t, dst=0, sizes=true, cat=True)
        assert rank != 0 or out.shape == (sum(true), 2)


COLLECTIVE_CASES = [(name, kind) for name in ("all_gather_v", "gather_v", "all_to_all_v", "reduce_scatter_v",
                                              "broadcast_v", "scatter_v", "scatter_v_split")
                    for kind in ("meta", "nested", "jagged", "sparse")]
SIZED_CASES = ["tensor_disagrees", "one_rank_only", "differ_across_ranks", "gather_disagrees", "fine"]


def every_case(rank: int, ws: int, p2p: bool) -> dict:
    """Run every case in one job; per case (error text or None, seconds).  After a rank raised,
    the group is still consistent (the records were fully exchanged), so the next case runs.

    No wall-clock bound is asserted (it flakes on a loaded machine): a rank left waiting for a
    peer that raised alone would end in the process group's timeout, a RuntimeError that is not
    caught here, and its clear ValueError would be missing, so the messages alone show that
    every rank failed together."""
    import os

    out = {}
    runs = ([(f"send_tensors/{k}", lambda k=k: _call("send_tensors", k, rank, ws))
             for k in ("meta", "nested", "jagged", "sparse")] if p2p else
            [(f"{n}/{k}", lambda n=n, k=k: _call(n, k, rank, ws)) for n, k in COLLECTIVE_CASES])
    if not p2p:
        os.environ["COMMSCOPE_VARLEN_CHECK"] = "1"
        runs += [(f"sizes/{n}", lambda n=n: _sized(n, rank, ws)) for n in SIZED_CASES]
    for label, fn in runs:
        t0 = time.monotonic()
        try:
            fn()
            out[label] = (None, time.monotonic() - t0)
        except ValueError as exc:
            out[label] = (str(exc), time.monotonic() - t0)
    return out


@pytest.mark.parametrize("ws", [2, 3])
def test_collectives_fail_together_on_every_rank(ws):
    results = [r.value for r in run_ranks(every_case, ws, args=(False,), timeout=180)]
    for label in results[0]:
        errors = [res[label][0] for res in results]
        if label == "sizes/fine":
            assert errors == [None] * ws, errors
            continue
        assert all(errors), (label, errors)
        assert len(set(errors)) == 1, (label, errors)  # the same message on every rank
    assert "nested tensor" in results[0]["all_gather_v/nested"][0]
    assert "meta device" in results[0]["scatter_v/meta"][0]
    assert "sizes= was passed differs" in results[0]["sizes/one_rank_only"][0]
    assert "sizes= (fingerprint) differs" in results[0]["sizes/differ_across_ranks"][0]
    assert f"ranks [{ws - 1}] passed sizes=" in results[0]["sizes/tensor_disagrees"][0]


def test_send_tensors_fails_on_both_sides():
    results = [r.value for r in run_ranks(every_case, 2, args=(True,), timeout=120)]
    for label, (err0, _) in results[0].items():
        err1, _ = results[1][label]
        assert err0 and err1, (label, err0, err1)
        assert err0.startswith("send_tensors: tensor #1 is ")
        assert err1.startswith("recv_tensors: the sender (rank 0) failed")


def _not_whole(name: str, rank: int, ws: int) -> None:
    """A value that only ``int()`` would take (helper-106: ``dim=1.0`` on one rank compared in
    range, then raised a TypeError there alone, its peers waiting in the transfer; ``src=1.7``
    broadcast from rank 1; split sizes 1.5 read as 1)."""
    last = rank == ws - 1
    t = torch.ones(2, 3 + rank)
    dim = 1.0 if last else 1
    if name == "all_gather_v":
        varlen.all_gather_v(t, dim=dim)
    elif name == "gather_v":
        varlen.gather_v(t, dst=0, dim=dim)
    elif name == "all_to_all_v":
        varlen.all_to_all_v([t] * ws, dim=dim)
    elif name == "reduce_scatter_v":
        varlen.reduce_scatter_v(torch.ones(2, ws), [1] * ws, dim=dim)
    elif name == "scatter_v":
        varlen.scatter_v([t] * ws if rank == 0 else None, src=0, dim=1.0)
    elif name == "broadcast_v":
        varlen.broadcast_v(t if rank == 1 else None, src=1.7 if last else 1)
    elif name == "split_sizes":
        varlen.scatter_v(torch.ones(ws + 1, 2) if rank == 0 else None, src=0, split_sizes=[1.5] + [1] * (ws - 1))
    else:
        raise AssertionError(name)


NOT_WHOLE = ["all_gather_v", "gather_v", "all_to_all_v", "reduce_scatter_v", "scatter_v", "broadcast_v",
             "split_sizes"]
#: Dtypes Gloo cannot reduce (helper-106: "Invalid scalar type", naming neither op nor dtype)
NOT_REDUCED = ["int16", "uint16", "uint64", "float8_e4m3fn"]
#: A bitwise reduce op on floats: Gloo raised its own RuntimeError (helper-169), on whichever rank
BITWISE_ON_FLOATS = {"BAND float32": (dist.ReduceOp.BAND, torch.float32, False),
                     "BXOR bfloat16 uneven": (dist.ReduceOp.BXOR, torch.bfloat16, True),
                     # (NCCL's premul-sum: Gloo's RuntimeError "Cannot use ReduceOp.PREMUL_SUM", helper-178)
                     "premul-sum": (dist._make_nccl_premul_sum(2.0), torch.float32, False)}


def every_not_whole(rank: int, ws: int) -> dict:
    out = {}
    for name in NOT_WHOLE + NOT_REDUCED + list(BITWISE_ON_FLOATS):
        try:
            if name in NOT_REDUCED:
                varlen.reduce_scatter_v(torch.ones(ws, 2).to(getattr(torch, name)), [1] * ws)
            elif name in BITWISE_ON_FLOATS:
                op, dtype, uneven = BITWISE_ON_FLOATS[name]
                splits = [2] + [0] * (ws - 1) if uneven else [1] * ws
                varlen.reduce_scatter_v(torch.ones(sum(splits), 2, dtype=dtype), splits, op)
            else:
                _not_whole(name, rank, ws)
            out[name] = None
        except ValueError as exc:
            out[name] = str(exc)
    return out


def test_a_dim_root_or_size_that_is_not_an_integer_or_a_dtype_or_op_gloo_cannot_reduce_fails_together():
    results = [r.value for r in run_ranks(every_not_whole, 3, timeout=180)]
    for name in NOT_WHOLE + NOT_REDUCED + list(BITWISE_ON_FLOATS):
        errors = [res[name] for res in results]
        assert all(errors) and len(set(errors)) == 1, (name, errors)
    for name in NOT_REDUCED:
        assert results[0][name].startswith(f"reduce_scatter_v: gloo cannot reduce torch.{name} tensors"), name
    assert results[0]["BAND float32"] == ("reduce_scatter_v: ReduceOp.BAND needs an integer or bool dtype, "
                                          "got torch.float32")
    assert results[0]["premul-sum"].startswith("reduce_scatter_v: gloo has no premul-sum reduce op")


def check_on_one_side(rank: int, ws: int) -> dict:
    """The last rank passes ``sizes=`` with ``check_sizes=True``, the others call plainly (no
    ``$COMMSCOPE_VARLEN_CHECK``); cold, and after a call of the same sizes (its data then
    ride with the records, and a rank not checking returned them)."""
    import os

    os.environ.pop("COMMSCOPE_VARLEN_CHECK", None)
    out = {}
    t = torch.ones(2 + rank, 3)
    for case in ("cold", "warm", "gather_v"):
        if case == "warm":
            varlen.all_gather_v(t)
        try:
            sizes = {"sizes": [2 + r for r in range(ws)], "check_sizes": True} if rank == ws - 1 else {}
            if case == "gather_v":
                varlen.gather_v(t, dst=0, **sizes)
            else:
                varlen.all_gather_v(t, **sizes)
            out[case] = None
        except ValueError as exc:
            out[case] = str(exc)
    return out


def test_sizes_checked_on_some_ranks_only_fail_together():
    """helper-106: only the checking rank compared whether ``sizes=`` was passed; the others
    went on into the transfer (cold: waiting for a peer that had raised) or returned."""
    results = [r.value for r in run_ranks(check_on_one_side, 3, timeout=120)]
    for case in ("cold", "warm", "gather_v"):
        errors = [res[case] for res in results]
        assert all(errors) and len(set(errors)) == 1, (case, errors)
        assert "whether sizes= was passed differs" in errors[0], errors[0]


def _gen_that_raises():
    yield torch.ones(2)
    raise RuntimeError("generator broke")


BAD_LISTS = {"none": lambda: None, "int": lambda: 5, "0d_tensor": lambda: torch.tensor(3.0),
             "1d_tensor": lambda: torch.arange(3.0), "raising_generator": _gen_that_raises,
             "too_many": lambda: [torch.ones(1)] * 50_000}


def every_bad_list(rank: int, ws: int) -> dict:
    """send_tensors given something other than a usable list of tensors: the sender still sends
    the error header (both raise), then a good send shows the pair is still in step."""
    out = {}
    for label, make in BAD_LISTS.items():
        try:
            if rank == 0:
                varlen.send_tensors(make(), dst=1)
            else:
                varlen.recv_tensors(src=0)
            out[label] = None
        except ValueError as exc:
            out[label] = str(exc)
        if rank == 0:
            varlen.send_tensors([torch.ones(2)], dst=1)
        elif varlen.recv_tensors(src=0)[0].tolist() != [1.0, 1.0]:
            out[label] = "desync"
    return out


def test_send_tensors_refuses_non_lists_on_both_sides():
    sent, got = (r.value for r in run_ranks(every_bad_list, 2, timeout=120))
    for label in BAD_LISTS:
        assert sent[label] and got[label] and got[label] != "desync", (label, sent[label], got[label])
        assert sent[label].startswith("send_tensors: "), sent[label]
        assert got[label].startswith("recv_tensors: the sender (rank 0) failed: it passed "), got[label]
    assert "got a bare tensor (wrap it: [t])" in sent["1d_tensor"] and "wrap it: [t]" in got["1d_tensor"]
    assert "got NoneType" in sent["none"]
    assert "generator broke" in sent["raising_generator"]
    assert got["raising_generator"].endswith("an iterable of tensors that raised while it was read (its own error "
                                             "says why)")  # (it said "something other than a list", helper-178)
    hint = "at most 43688 1-d tensors fit, fewer with more dims; concatenate them (torch.cat)"
    assert "50000 tensors need a" in sent["too_many"] and hint in sent["too_many"] and hint in got["too_many"]


def isend_bad_then_collective(rank: int, ws: int) -> str:
    """Rank 0 posts isend_tensors of a bad list and goes on to a collective before rank 1
    posts its receive: rank 0 raises at once, rank 1 when it receives."""
    try:
        if rank == 0:
            try:
                varlen.isend_tensors([torch.ones(2), "oops"], dst=1)
            except ValueError as exc:
                varlen.all_gather_v(torch.ones(1))
                return str(exc)
            return "no error"
        varlen.all_gather_v(torch.ones(1))
        varlen.recv_tensors(src=0)
        return "received"
    except ValueError as exc:
        return str(exc)


def test_isend_tensors_of_a_bad_list_raises_at_once_and_the_receiver_too():
    """Its error header was waited for, which on Gloo lasts until the receiver posts: a sender
    that went on to a collective first never got its ValueError, and both ranks hung until
    the group's timeout (helper-178)."""
    sent, got = (r.value for r in run_ranks(isend_bad_then_collective, 2, timeout=120))
    assert sent == "isend_tensors: tensor #1 is an item that is not a torch.Tensor", sent
    assert got.startswith("recv_tensors: the sender (rank 0) failed: it passed "), got
