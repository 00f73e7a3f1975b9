"""commscope.varlen on real Gloo processes, checked against references built from every rank's input.

Inputs are generated from (seed, global rank, case), so every rank can rebuild every other
rank's input.  Workers collect mismatches instead of asserting, so one wrong answer does not
leave the other ranks hanging in the next collective; the test asserts the list is empty.
"""

from __future__ import annotations

import functools
import random

import pytest
import torch
import torch.distributed as dist
from trace_helpers import ops, read_events

import commscope.varlen as V
from commscope.launch import run_ranks
from commscope.varlen import _meta, _p2p, _plan

WS = 4
SEED = 1234
TIMEOUT = 60
DTYPES = [torch.float32, torch.bool, torch.bfloat16, torch.complex64, torch.int64, torch.uint8,
          torch.float8_e4m3fn, torch.int16, torch.float64, torch.complex128]
SIZE_CHOICES = [0, 1, 2, 3, 5, 8]


# ---------------------------------------------------------------------------------------
# deterministic inputs and comparisons
# ---------------------------------------------------------------------------------------

def rand(gen: torch.Generator, shape, dtype: torch.dtype) -> torch.Tensor:
    shape = tuple(shape)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    if dtype.is_complex:
        return torch.randn(shape, dtype=dtype, generator=gen)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=gen).to(dtype)
    low = 0 if dtype == torch.uint8 else -100
    return torch.randint(low, 100, shape, generator=gen).to(dtype)


def make(seed: int, who: int, case: int, shape, dtype: torch.dtype, noncontig: bool = False) -> torch.Tensor:
    """The input of global rank ``who`` for ``case``: the same on every process."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + case * 7919 + who)
    shape = list(shape)
    if not noncontig or not shape:
        return rand(gen, shape, dtype)
    wide = rand(gen, shape[:-1] + [shape[-1] * 2 + 1], dtype)
    return wide[..., 1::2]  # a strided view: not contiguous whenever the last dim > 1


def same(a, b) -> bool:
    """Bit-exact equality of two tensors (any dtype, NaNs and all)."""
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return False
    if a.dtype != b.dtype or a.shape != b.shape or a.device != b.device:
        return False
    return torch.equal(_meta.raw(a.contiguous()), _meta.raw(b.contiguous()))


def same_list(got, want) -> bool:
    return isinstance(got, list) and len(got) == len(want) and all(same(g, w) for g, w in zip(got, want, strict=True))


def shape_with(trailing, dim: int, n: int) -> list[int]:
    shape = list(trailing)
    shape.insert(dim % (len(trailing) + 1), n)
    return shape


def random_case(rng: random.Random, case: int, n_members: int, strategies) -> dict:
    ndim = rng.choice([1, 2, 3])
    strategy = strategies[case % len(strategies)]
    if case % 7 == 3 or strategy == "native":
        sizes = [rng.choice(SIZE_CHOICES)] * n_members
    else:
        sizes = [rng.choice(SIZE_CHOICES) for _ in range(n_members)]
    if case % 11 == 5:
        sizes = [0] * n_members
    return dict(case=case, dtype=DTYPES[case % len(DTYPES)], dim=rng.randrange(-ndim, ndim),
                trailing=[rng.choice([1, 2, 3]) for _ in range(ndim - 1)], sizes=sizes,
                strategy=strategy, cat=rng.random() < 0.5, known=rng.random() < 0.3,
                noncontig=rng.random() < 0.5)


def groups_of(rank: int, ws: int):
    """(group, members) pairs this rank belongs to: the world, and ranks [1, 3] (created by all)."""
    out = [(None, list(range(ws)))]
    if ws < 4:
        return out
    sub = dist.new_group([3, 1])
    if rank in (1, 3):
        members = dist.get_process_group_ranks(sub)
        # the reference indexes by group rank: make sure that is what this order is
        assert members == [dist.get_global_rank(sub, i) for i in range(2)] == [1, 3]
        assert dist.get_rank(sub) == members.index(rank)
        out.append((sub, members))
    return out


# ---------------------------------------------------------------------------------------
# workers (module level: the launcher pickles them by reference)
# ---------------------------------------------------------------------------------------

def _strategies(op, skip=()):
    return [s for s in (None, *_plan.SUPPORTED[op]) if s not in skip]


def _w_all_gather(rank, ws, seed, skip=()):
    fails = []
    for grp, members in groups_of(rank, ws):
        me = members.index(rank)
        rng = random.Random(seed + len(members))
        for case in range(36):
            c = random_case(rng, case, len(members), _strategies("all_gather_v", skip))
            inputs = [make(seed, who, case, shape_with(c["trailing"], c["dim"], c["sizes"][i]), c["dtype"],
                           c["noncontig"]) for i, who in enumerate(members)]
            got = V.all_gather_v(inputs[me], dim=c["dim"], sizes=c["sizes"] if c["known"] else None,
                                 cat=c["cat"], group=grp, strategy=c["strategy"])
            ok = same(got, torch.cat(inputs, c["dim"])) if c["cat"] else same_list(got, inputs)
            if not ok:
                fails.append(f"rank {rank} group {members} all_gather_v case {c}")
        # async_op: metadata now, data later; also with sizes= (fully async)
        x = make(seed, rank, 99, (rank % 3 + 1, 2), torch.float32)
        want = [make(seed, who, 99, (who % 3 + 1, 2), torch.float32) for who in members]
        strategy = "p2p" if None in skip else None
        handle = V.all_gather_v(x, group=grp, async_op=True, strategy=strategy)
        handle2 = V.all_gather_v(x, group=grp, async_op=True, sizes=[w.shape[0] for w in want], cat=True,
                                 strategy=strategy)
        if not (same_list(handle.wait(), want) and same(handle2.wait(), torch.cat(want))
                and handle.is_completed() and handle.wait() is handle.wait()):
            fails.append(f"rank {rank} group {members} async all_gather_v")
    return fails


def _w_gather_scatter(rank, ws, seed, skip=()):
    fails = []
    for grp, members in groups_of(rank, ws):
        me = members.index(rank)
        rng = random.Random(seed + 10 * len(members))
        for case in range(24):
            c = random_case(rng, case, len(members), _strategies("gather_v", skip))
            root = members[rng.randrange(len(members))]
            shapes = [shape_with(c["trailing"], c["dim"], n) for n in c["sizes"]]
            # gather_v
            inputs = [make(seed, who, case, shapes[i], c["dtype"], c["noncontig"]) for i, who in enumerate(members)]
            got = V.gather_v(inputs[me], dst=root, dim=c["dim"], sizes=c["sizes"] if c["known"] else None,
                             cat=c["cat"], group=grp, strategy=c["strategy"])
            if rank != root:
                ok = got is None
            else:
                ok = same(got, torch.cat(inputs, c["dim"])) if c["cat"] else same_list(got, inputs)
            if not ok:
                fails.append(f"rank {rank} group {members} gather_v root {root} case {c}")
            # scatter_v: chunks made by root, as a list or as one tensor plus split sizes
            chunks = [make(seed, root, 1000 + case * 10 + i, shapes[i], c["dtype"], c["noncontig"])
                      for i in range(len(members))]
            if rank == root and c["cat"]:
                arg, splits = torch.cat(chunks, c["dim"]), c["sizes"]
            elif rank == root:
                arg, splits = chunks, None
            else:
                arg, splits = None, None
            got = V.scatter_v(arg, src=root, split_sizes=splits, dim=c["dim"], group=grp,
                              strategy=c["strategy"])
            if not same(got, chunks[me].contiguous()):
                fails.append(f"rank {rank} group {members} scatter_v root {root} case {c}")
    return fails


def _w_all_to_all(rank, ws, seed):
    fails = []
    for grp, members in groups_of(rank, ws):
        me = members.index(rank)
        n = len(members)
        rng = random.Random(seed + 20 * n)
        for case in range(12):
            c = random_case(rng, case, n, [None])
            matrix = [[rng.choice(SIZE_CHOICES) for _ in range(n)] for _ in range(n)]  # [src][dst]
            if case == 5:
                matrix = [[0] * n for _ in range(n)]

            def chunk(s, d, c=c, matrix=matrix, case=case, members=members):
                shape = shape_with(c["trailing"], c["dim"], matrix[s][d])
                return make(seed, members[s], case * 100 + d, shape, c["dtype"], c["noncontig"])

            got = V.all_to_all_v([chunk(me, d) for d in range(n)], dim=c["dim"], group=grp)
            if not same_list(got, [chunk(s, me).contiguous() for s in range(n)]):
                fails.append(f"rank {rank} group {members} all_to_all_v case {c} matrix {matrix}")
    return fails


RS_CASES = [  # dtype, op
    (torch.float32, dist.ReduceOp.SUM), (torch.float64, dist.ReduceOp.MAX), (torch.int64, dist.ReduceOp.SUM),
    (torch.int32, dist.ReduceOp.MIN), (torch.float32, dist.ReduceOp.AVG), (torch.complex64, dist.ReduceOp.SUM),
    (torch.int64, dist.ReduceOp.PRODUCT), (torch.float64, dist.ReduceOp.SUM),
]


def _reduce_ref(inputs, dtype, op):
    stack = torch.stack([t.contiguous() for t in inputs])
    if op == dist.ReduceOp.SUM:
        return stack.sum(0).to(dtype)
    if op == dist.ReduceOp.AVG:
        return (stack.sum(0) / len(inputs)).to(dtype)
    if op == dist.ReduceOp.MAX:
        return stack.amax(0)
    if op == dist.ReduceOp.MIN:
        return stack.amin(0)
    return stack.prod(0).to(dtype)


def _w_reduce_scatter_broadcast(rank, ws, seed, skip=()):
    fails = []
    for grp, members in groups_of(rank, ws):
        me = members.index(rank)
        n = len(members)
        rng = random.Random(seed + 30 * n)
        strategies = _strategies("reduce_scatter_v", skip)
        for case in range(16):
            dtype, op = RS_CASES[case % len(RS_CASES)]
            c = random_case(rng, case, n, strategies)
            splits = c["sizes"]
            shape = shape_with(c["trailing"], c["dim"], sum(splits))
            gen_inputs = [make(seed, who, case, shape, dtype, c["noncontig"]) for who in members]
            if op == dist.ReduceOp.PRODUCT:
                gen_inputs = [t.remainder(3) for t in gen_inputs]
            got = V.reduce_scatter_v(gen_inputs[me], splits, op, dim=c["dim"], group=grp, strategy=c["strategy"])
            want = _reduce_ref(gen_inputs, dtype, op).split(splits, c["dim"])[me]
            close = (got.dtype == want.dtype and got.shape == want.shape
                     and torch.allclose(got, want, rtol=1e-5, atol=1e-5))
            if not close:
                fails.append(f"rank {rank} group {members} reduce_scatter_v {dtype} {op} case {c}")
        for case, dtype in enumerate(DTYPES):
            root = members[case % n]
            shape = [[], [0], [3], [2, 0, 4], [2, 3], [1, 2, 3]][case % 6]
            value = make(seed, root, 500 + case, shape, dtype, noncontig=case % 2 == 1)
            got = V.broadcast_v(value if rank == root else None, src=root, group=grp)
            if not (got is value if rank == root else same(got, value.contiguous())):
                fails.append(f"rank {rank} group {members} broadcast_v {dtype} {shape}")
    return fails


P2P_DTYPES = [torch.float32, torch.bool, torch.bfloat16, torch.complex64, torch.complex128, torch.int8,
              torch.float8_e5m2, torch.float16, torch.int64, torch.uint4]


BIG_P2P = {  # case -> element counts of float32/bool tensors past the eager copy-out and eager limits
    10: [40_000, 100_001],                 # ~260 KB: eager, returned as views of the staging buffer
    11: [1_300_000],                       # 5.2 MB, one tensor: header, then one message
    12: [300_000, 350_001, 333_333, 2],    # ~4 MB, small tensors: header, then one packed message
}


def _p2p_payload(seed, who, case):
    """A mixed list for ``case``: odd lengths (misaligned if packed naively), 0-d, empty."""
    if case in BIG_P2P:
        return [make(seed, who, case * 100 + i, [n], torch.bool if i % 2 else torch.float32)
                for i, n in enumerate(BIG_P2P[case])]
    rng = random.Random(seed * 31 + who * 7 + case)
    count = [0, 1, 3, 12, 40][case % 5]
    out = []
    for i in range(count):
        dtype = P2P_DTYPES[(case + i) % len(P2P_DTYPES)]
        shape = rng.choice([[], [0], [rng.randint(1, 9)], [rng.randint(1, 4), rng.randint(0, 3), 3]])
        if dtype == torch.uint4:  # a shell dtype without kernels: build it from bytes
            out.append(make(seed, who, case * 100 + i, shape, torch.uint8).view(torch.uint4))
            continue
        out.append(make(seed, who, case * 100 + i, shape, dtype, noncontig=i % 3 == 1))
    return out


def _w_send_recv(rank, ws, seed):
    fails = []
    for grp, members in groups_of(rank, ws):
        me, n = members.index(rank), len(members)
        nxt, prv = members[(me + 1) % n], members[(me - 1) % n]
        for case in range(13):
            mode = [None, _p2p.PACKED, _p2p.SPLIT, _p2p.EAGER][case % 4] if case < 10 else None
            mine = _p2p_payload(seed, rank, case)
            want = [t.contiguous() for t in _p2p_payload(seed, prv, case)]
            send = _p2p.post_send(mine, nxt, grp, mode=mode) if mode else V.isend_tensors(mine, nxt, group=grp)
            if case % 2:
                got = V.recv_tensors(prv, group=grp)
            else:
                handle = V.irecv_tensors(prv, group=grp)
                handle.is_completed()  # must not block or break anything
                got = handle.wait()
                if not handle.is_completed() or handle.wait() is not got:
                    fails.append(f"rank {rank} irecv_tensors handle state after wait")
            send.wait()
            if not same_list(got, want):
                fails.append(f"rank {rank} group {members} send/recv case {case} mode {mode}")
        # blocking pair: even sends first, odd receives first (group ranks)
        payload = _p2p_payload(seed, rank, 3)
        peer = members[me ^ 1] if (me ^ 1) < n else None
        if peer is not None:
            want = [t.contiguous() for t in _p2p_payload(seed, peer, 3)]
            if me % 2 == 0:
                V.send_tensors(payload, peer, group=grp)
                got = V.recv_tensors(peer, group=grp)
            else:
                got = V.recv_tensors(peer, group=grp)
                V.send_tensors(payload, peer, group=grp)
            if not same_list(got, want):
                fails.append(f"rank {rank} group {members} blocking send_tensors/recv_tensors")
    return fails


def _w_nccl_paths_on_gloo(rank, ws, seed):
    """The code NCCL takes, run over Gloo: metadata by all_gather, grouped batch_isend_irecv,
    the fixed-block p2p header (plus a second header message for long headers), NCCL's
    strategy rules.  Only NCCL's uneven list all_gather ("bcast", also what auto picks for small
    uneven all_gathers) can't run on Gloo."""
    _meta.Group.backend_for = lambda self, device: "nccl"
    _p2p._eager = lambda g: False
    return (_w_all_gather(rank, ws, seed + 5, skip=("bcast", None))
            + _w_gather_scatter(rank, ws, seed + 5)
            + _w_all_to_all(rank, ws, seed + 5)
            + _w_reduce_scatter_broadcast(rank, ws, seed + 5)
            + _w_send_recv(rank, ws, seed + 5))


# ---------------------------------------------------------------------------------------
# error cases: every rank raises the same ValueError, and the group stays usable
# ---------------------------------------------------------------------------------------

def _error_scenarios(rank):
    f32 = torch.zeros(2, 3)
    sub_members = (1, 3)
    return {
        "trailing": (lambda: V.all_gather_v(torch.zeros(rank + 1, 4 if rank == 2 else 3)), "[2]"),
        "dtype": (lambda: V.all_gather_v(torch.zeros(2, 3, dtype=torch.float64 if rank == 1 else torch.float32)),
                  "dtype"),
        "zero_d": (lambda: V.gather_v(torch.tensor(1.0) if rank == 3 else f32, dst=0), "0-d"),
        "ndim": (lambda: V.all_gather_v(torch.zeros(2, 3, 1) if rank == 0 else f32), "number of dims"),
        "dst": (lambda: V.gather_v(f32, dst=2 if rank == 1 else 0), "src/dst"),
        "op": (lambda: V.gather_v(f32) if rank == 0 else V.all_gather_v(f32), "operation"),
        "root_not_member": (lambda: V.broadcast_v(f32, src=7), "not a member"),
        "scatter_splits": (lambda: V.scatter_v(torch.zeros(5) if rank == 0 else None, split_sizes=[1, 1, 1, 1]),
                           "split sizes"),
        "scatter_chunks": (lambda: V.scatter_v([torch.zeros(1, 2), torch.zeros(1, 3), torch.zeros(0, 2),
                                                torch.zeros(2, 2)] if rank == 0 else None), "disagree"),
        "broadcast_none": (lambda: V.broadcast_v(None, src=0), "not a torch.Tensor"),
        "rs_splits": (lambda: V.reduce_scatter_v(torch.ones(4), [1, 1, 1, 1] if rank else [2, 0, 1, 1]),
                      "split_sizes"),
        "rs_shape": (lambda: V.reduce_scatter_v(torch.ones(4 + (rank == 3)), [1, 1, 1, 1 + (rank == 3)]), "shape"),
        "rs_op": (lambda: V.reduce_scatter_v(torch.ones(4), [1, 1, 1, 1], dist.ReduceOp.MAX if rank == 2
                                             else dist.ReduceOp.SUM), "reduce op"),
        "rs_complex_max": (lambda: V.reduce_scatter_v(torch.ones(4, dtype=torch.complex64), [1] * 4,
                                                      dist.ReduceOp.MAX), "complex"),
        "a2a_dtype": (lambda: V.all_to_all_v([torch.zeros(1, dtype=torch.int32 if rank == 2 else torch.int64)] * 4),
                      "dtype"),
        "strategy_mismatch": (lambda: V.all_gather_v(f32, strategy="padded" if rank == 0 else None), "strategy"),
        "strategy_unknown": (lambda: V.all_gather_v(f32, strategy="fastest" if rank == 3 else None), "strategy"),
        "native_uneven": (lambda: V.all_gather_v(torch.zeros(rank, 2), strategy="native"), "equal lengths"),
        "not_tensor": (lambda: V.all_gather_v([1, 2] if rank == 1 else f32), "not a torch.Tensor"),
        "subgroup_dtype": (lambda: V.all_gather_v(torch.zeros(2, dtype=torch.int8 if rank == 3 else torch.int16),
                                                  group=_SUB[0]) if rank in sub_members else None,
                           "(global [3])"),
        # turning the op or split sizes into the record raises nowhere, whatever they are
        "rs_op_string": (lambda: V.reduce_scatter_v(torch.ones(4), [1] * 4, "sum" if rank == 1 else dist.ReduceOp.SUM),
                         "ranks [1] passed a reduce op that is not a torch.distributed.ReduceOp"),
        "rs_splits_unconvertible": (lambda: V.reduce_scatter_v(torch.ones(4), [
            [1, 1, 1, 1], [float("inf")] * 4, [torch.empty(1, device="meta")] * 4, [torch.ones(2)] * 4][rank]),
            "ranks [1, 2, 3] passed split sizes"),
        "scatter_native_uneven": (lambda: V.scatter_v(torch.zeros(5) if rank == 0 else None, split_sizes=[1, 1, 1, 2],
                                                      strategy="native"), "'native', which needs equal lengths"),
        "scatter_unsupported_strategy": (lambda: V.scatter_v(torch.zeros(4) if rank == 0 else None,
                                                             split_sizes=[1] * 4, strategy="bcast"),
                                         "a strategy this op does not implement"),
        "scatter_none_on_src": (lambda: V.scatter_v(None, src=0), "neither a list of chunks (one per rank) nor a tensor"),
        "scatter_short_list": (lambda: V.scatter_v([f32] * 3 if rank == 0 else None), "length is not the group size"),
        "a2a_short_list": (lambda: V.all_to_all_v([f32] * (3 if rank == 1 else 4)),
                           "ranks [1] passed a list whose length is not the group size"),
        "a2a_tensor": (lambda: V.all_to_all_v(torch.zeros(4) if rank == 2 else [f32] * 4),
                       "ranks [2] passed something that is not a list or tuple of tensors"),
        "strategy_unhashable": (lambda: V.all_gather_v(f32, strategy=["p2p"] if rank == 0 else None), "strategy"),
    }


_SUB: list = []


def _w_errors(rank, ws, names):
    _SUB.append(dist.new_group([1, 3]))
    scenarios = _error_scenarios(rank)
    out = {}
    for name in names:
        fn, _ = scenarios[name]
        try:
            fn()
            out[name] = ("no error", "")
        except Exception as exc:  # noqa: BLE001 - we report whatever was raised
            out[name] = (type(exc).__name__, str(exc))
        # the group must still be in step: a correct op right after gives the right answer
        check = V.all_gather_v(torch.full((rank,), rank), cat=True)
        if check.tolist() != [r for r in range(ws) for _ in range(r)]:
            out[name] = ("desync", check.tolist())
    return out


def _w_send_error(rank, ws):
    if rank == 0:
        try:
            V.send_tensors([torch.ones(2), "not a tensor"], 1)
        except ValueError as exc:
            return str(exc)
        return "no error"
    if rank == 1:
        try:
            V.recv_tensors(0)
        except ValueError as exc:
            return str(exc)
        return "no error"
    return None


# ---------------------------------------------------------------------------------------
# tests
# ---------------------------------------------------------------------------------------

def _run(fn, *args, world_size=WS):
    results = run_ranks(fn, world_size, args=args, timeout=TIMEOUT)
    return [r.value for r in results]


@pytest.mark.parametrize("worker", [_w_all_gather, _w_gather_scatter, _w_all_to_all, _w_reduce_scatter_broadcast,
                                    _w_send_recv, _w_nccl_paths_on_gloo], ids=lambda f: f.__name__.removeprefix("_w_"))
def test_against_reference(worker):
    fails = [f for per_rank in _run(worker, SEED) for f in per_rank]
    assert not fails, "\n".join(fails[:20])


def test_two_ranks_world():
    """Group ranks == global ranks and the smallest uneven world."""
    fails = [f for per_rank in _run(_w_all_gather, SEED + 1, world_size=2) for f in per_rank]
    assert not fails, "\n".join(fails[:20])


ERROR_NAMES = list(_error_scenarios(0))


def _w_errors_collective_metadata(rank, ws, names):
    """Groups over ``P2P_METADATA_MAX_RANKS`` exchange records with one all_to_all_single."""
    _meta.P2P_METADATA_MAX_RANKS = 2  # the 4-rank world now takes that path; the pair [1, 3] not
    return _w_errors(rank, ws, names) | {"all_gather": _w_all_gather(rank, ws, SEED + 2)}


@pytest.mark.parametrize("worker", [_w_errors, _w_errors_collective_metadata],
                         ids=["p2p_metadata", "collective_metadata"])
def test_errors_raise_same_value_error_on_every_rank(worker):
    per_rank = _run(worker, ERROR_NAMES)
    assert all(not r.get("all_gather") for r in per_rank), [r.get("all_gather") for r in per_rank]
    for name in ERROR_NAMES:
        _, fragment = _error_scenarios(0)[name]
        outcomes = {r: per_rank[r][name] for r in range(WS)}
        involved = {r: o for r, o in outcomes.items() if not (name == "subgroup_dtype" and r not in (1, 3))}
        kinds = {o[0] for o in involved.values()}
        messages = {o[1] for o in involved.values()}
        assert kinds == {"ValueError"}, (name, outcomes)
        assert len(messages) == 1, (name, outcomes)
        assert fragment in messages.pop(), (name, outcomes)


def test_error_messages_name_offending_ranks():
    per_rank = _run(_w_errors, ["trailing", "dtype", "zero_d", "subgroup_dtype", "root_not_member"])
    assert "src/dst is a global rank: the group's are 0, 1, 2, 3" in per_rank[0]["root_not_member"][1]  # (helper-169)
    msg = per_rank[0]["trailing"][1]
    assert "offending ranks [2]" in msg and "(3,) on ranks [0, 1, 3]" in msg
    assert "offending ranks [1]" in per_rank[0]["dtype"][1]
    assert "ranks [3] passed a 0-d tensor" in per_rank[0]["zero_d"][1]
    sub = per_rank[1]["subgroup_dtype"][1]
    assert "ranks [0, 1] (global [1, 3])" in sub, sub  # a tie on two ranks names both


def _w_outstanding_irecvs(rank, ws, eager):
    """Several irecv_tensors from one peer posted before any wait: they take the messages in
    posting order whatever their sizes (eager <= 1 MiB, header + payload, split per tensor),
    waited in order or in reverse."""
    if not eager:  # NCCL's header protocol (exact-size blocks, matched by order alone), on Gloo
        _p2p._eager = lambda g: False
    msgs = [[torch.arange(262144, dtype=torch.float32)],                      # 1 MiB: just past eager
            [torch.arange(10, dtype=torch.float32) + 1000],                   # eager
            [torch.arange(2 * 262144, dtype=torch.float32)],                  # 2 MiB, split
            [torch.ones(3, dtype=torch.int8), torch.arange(600_000.0)],      # packed, 2.4 MB
            [torch.arange(2 * 262144, dtype=torch.float32) + 1]]              # 2 MiB again
    fails = []
    for order in ("in order", "reversed"):
        if rank == 0:
            for m in msgs:
                V.send_tensors(m, 1)
        else:
            handles = [V.irecv_tensors(0) for _ in msgs]
            got = {i: handles[i].wait() for i in (range(len(msgs)) if order == "in order"
                                                     else reversed(range(len(msgs))))}
            fails += [f"{order}: message {i}" for i, m in enumerate(msgs) if not same_list(got[i], m)]
    return fails


@pytest.mark.parametrize("eager", [True, False], ids=["gloo_protocol", "nccl_protocol"])
def test_outstanding_irecv_tensors_match_messages_in_posting_order(eager):
    assert _run(_w_outstanding_irecvs, eager, world_size=2) == [[], []]


def _w_nccl_then_gloo_exchange(rank, ws):
    """A receive by NCCL's header protocol, then the Gloo protocol's eager exchanges, both
    ways, in one process (an NCCL world beside a Gloo side group)."""
    real = _p2p._eager
    _p2p._eager = lambda g: False
    small = [torch.arange(6, dtype=torch.float32)]
    if rank == 0:
        V.send_tensors(small, 1)
    else:
        got = V.recv_tensors(0)
        assert same_list(got, small)
    _p2p._eager = real
    big = [torch.arange(25_000, dtype=torch.float32) + rank]  # (100 KB: eager, past the 512-byte header block)
    fails = []
    for sender in (0, 1):
        if rank == sender:
            V.send_tensors(big, 1 - rank)
        else:
            got = V.recv_tensors(sender)
            if not same_list(got, [torch.arange(25_000, dtype=torch.float32) + sender]):
                fails.append(f"from {sender}")
    fails += [f"a pooled buffer of {b.numel()} bytes" for b in _p2p.POOL._free if b.numel() != _p2p.EAGER_CAP]
    return fails


def test_a_receive_by_nccl_s_protocol_leaves_the_gloo_staging_pool_alone():
    """(helper-169) The NCCL protocol's receive gave its 512-byte header block (on the GPU, on
    NCCL) to the Gloo protocol's staging pool: the next eager send copied 100 KB into it (a
    segfault), the next eager receive made Gloo abort the process."""
    assert _run(_w_nccl_then_gloo_exchange, world_size=2) == [[], []]


def _w_conj_neg(rank, ws):
    """Every op, once with conjugate / negative-bit views on one rank and once with the same
    values as plain tensors: the results must be identical (bit for bit)."""
    z = torch.tensor([1 + 2j, 3 - 4j, 5 + 6j, 7 - 8j], dtype=torch.complex64)
    plain = {"neg": z.conj().imag.clone(), "conj": z.conj().resolve_conj(),
             "conj128": z.to(torch.complex128).conj().resolve_conj()}
    views = {"neg": z.conj().imag, "conj": z.conj(), "conj128": z.to(torch.complex128).conj()}
    fails = []
    for kind in plain:
        if not (views[kind].is_neg() or views[kind].is_conj()) or not same(views[kind].resolve_neg().resolve_conj(),
                                                                          plain[kind]):
            fails.append(f"{kind}: bad fixture")
        runs = {}
        holder = 1 if kind.startswith("conj") else 0  # the rank that passes the view
        for variant in ("plain", "view"):
            x = views[kind] if variant == "view" and rank == holder else plain[kind].clone()
            out = {"all_gather_v": V.all_gather_v(x, cat=True), "gather_v": V.gather_v(x, dst=1 - holder, cat=True),
                   "broadcast_v": V.broadcast_v(x, src=holder),
                   "scatter_v": V.scatter_v(x, src=holder, split_sizes=[1, 3]),
                   "scatter_v_list": V.scatter_v([x[:1], x[1:]], src=holder),
                   "all_to_all_v": V.all_to_all_v([x[:1], x[1:]]),
                   "reduce_scatter_v": V.reduce_scatter_v(x, [1, 3]),
                   "reduce_scatter_v_equal": V.reduce_scatter_v(x, [2, 2])}
            for mode in (None, _p2p.PACKED, _p2p.SPLIT):
                if rank == holder:
                    _p2p.post_send([x, x[1:]], 1 - rank, None, mode=mode).wait() if mode else \
                        V.send_tensors([x, x[1:]], 1 - rank)
                    out[f"send {mode}"] = None
                else:
                    out[f"send {mode}"] = V.recv_tensors(holder)
            runs[variant] = out
        for name, want in runs["plain"].items():
            got = runs["view"][name]
            ok = same_list(got, want) if isinstance(want, list) else (got is want is None or same(got, want))
            if not ok:
                fails.append(f"rank {rank} {kind} {name}: {got} != {want}")
    return fails


def test_conjugate_and_negative_bit_views_give_the_plain_tensors_results():
    assert _run(_w_conj_neg, world_size=2) == [[], []]


def _w_rs_autograd(rank, ws):
    out = []
    for splits in ([2, 2], [1, 3]):
        leaf = torch.ones(4, requires_grad=True)
        got = V.reduce_scatter_v(leaf * (rank + 1), splits)
        out.append((got.requires_grad, got.grad_fn is None, got.tolist()))
    return out


def test_reduce_scatter_v_result_is_detached():
    res = _run(_w_rs_autograd, world_size=2)
    assert res[0] == [(False, True, [3.0, 3.0]), (False, True, [3.0])]
    assert res[1] == [(False, True, [3.0, 3.0]), (False, True, [3.0, 3.0, 3.0])]


def _graded(n: int, *, rank: int, dtype: torch.dtype, graded: bool) -> torch.Tensor:
    x = torch.arange(float(n * 3)).reshape(n, 3).to(dtype) + 10 * rank
    return x.requires_grad_(True) * 1 if graded and rank == 0 else x


def _w_autograd(rank, ws):
    """Every op given tensors with autograd history on rank 0 only, of every width (complex128
    keeps its dtype through ``_meta.raw``): results equal to the same op on plain tensors."""
    out = {}
    for dtype in (torch.float32, torch.complex64, torch.complex128):
        for graded in (True, False):
            t = functools.partial(_graded, rank=rank, dtype=dtype, graded=graded)
            key = (str(dtype), graded)
            got = {"all_gather_v": V.all_gather_v(t(2 + rank)),
                   "all_gather_v sizes": V.all_gather_v(t(2 + rank), sizes=[2, 3]),
                   "all_gather_v cat": V.all_gather_v(t(2 + rank), cat=True),
                   "gather_v": V.gather_v(t(1 + rank), dst=1),
                   "scatter_v": V.scatter_v([t(1), t(2)] if rank == 0 else None, src=0),
                   "all_to_all_v": V.all_to_all_v([t(1 + rank), t(2)]),
                   "broadcast_v": V.broadcast_v(t(3) if rank == 0 else None, src=0)}
            if rank == 0:
                V.send_tensors([t(2), t(1)], dst=1)
            else:
                got["recv_tensors"] = V.recv_tensors(src=0)
            out[key] = {k: [x.tolist() for x in v] if isinstance(v, list) else None if v is None else v.tolist()
                        for k, v in got.items()}
            grads = [x.requires_grad for k, v in got.items() for x in (v if isinstance(v, list) else [v])
                     if x is not None and not (k == "broadcast_v" and rank == 0)]  # (src: its own tensor back)
            out[key + ("grad",)] = any(grads)
    return out


def test_tensors_with_autograd_history_give_the_plain_tensors_results_on_every_rank():
    """helper-106: a complex128 tensor that requires grad on one rank made all_gather_v and
    gather_v raise there alone (an autograd error copying it into a view of the result),
    while the other rank waited in its receive until the group's timeout."""
    for res in _run(_w_autograd, world_size=2):
        for dtype in ("torch.float32", "torch.complex64", "torch.complex128"):
            assert res[(dtype, True)] == res[(dtype, False)], dtype
            assert res[(dtype, True, "grad")] is False and res[(dtype, False, "grad")] is False


def _w_avg_half(rank, ws):
    out = {}
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        x = torch.full((4, 2), 40000.0 + rank, dtype=dtype)
        out[str(dtype)] = V.reduce_scatter_v(x, [2, 2], dist.ReduceOp.AVG).float().tolist()
        out[str(dtype) + " input"] = torch.equal(x, torch.full((4, 2), 40000.0 + rank, dtype=dtype))
    return out


def test_reduce_scatter_v_averages_half_floats_on_gloo_without_overflow():
    """helper-106: AVG on Gloo summed, then divided, in the input's dtype: two float16 ranks of
    ~40000 gave inf (their sum overflows, their average does not).  Each part is scaled first
    now, as NCCL's AVG does; the input is left as it was."""
    for rank, res in enumerate(_run(_w_avg_half, world_size=2)):
        for dtype in ("torch.float16", "torch.bfloat16", "torch.float32"):
            want = torch.tensor(40000.5, dtype=getattr(torch, dtype.removeprefix("torch."))).float().item()
            assert res[dtype] == [[want, want]] * 2, (dtype, res[dtype])
            assert res[dtype + " input"] is True, (rank, dtype)  # (scaled into a new tensor)


def _w_dropped(rank, ws):
    """Handles dropped before wait(): the group's next ops still run, with the right data."""
    out = []
    V.all_gather_v(torch.full((1,), 1.0))  # (sizes grow next: the data path runs after the records)
    h = V.all_gather_v(torch.full((rank + 2,), 1.0), async_op=True)
    del h
    out.append(V.all_gather_v(torch.full((rank + 7,), 5.0), cat=True).tolist())
    h = V.all_gather_v(torch.full((rank + 9,), 3.0), async_op=True, strategy="p2p")
    del h
    out.append(V.all_gather_v(torch.full((rank + 3,), 2.0), cat=True).tolist())
    return out


def test_a_handle_dropped_before_wait_does_not_hang_the_next_op():
    """helper-106: ``h = all_gather_v(x, async_op=True); del h`` destroyed the pending Gloo
    works it alone held, and the group's next op hung on every rank.  Its works now end in
    the background."""
    res = _run(_w_dropped, world_size=2)
    assert res == [[[5.0] * 15, [2.0] * 7]] * 2


def test_send_tensors_bad_input_fails_both_sides():
    res = _run(_w_send_error, world_size=2)
    assert "tensor #1" in res[0]
    assert "sender (rank 0) failed" in res[1]


# ---------------------------------------------------------------------------------------
# pure unit tests (no processes)
# ---------------------------------------------------------------------------------------

def test_dtype_codes_are_stable_and_round_trip():
    codes = _meta.DTYPE_CODES
    assert len(set(codes.values())) == len(codes)
    assert codes[torch.bool] == 1 and codes[torch.float32] == 9 and codes[torch.bfloat16] == 8
    assert codes[torch.complex128] == 13 and codes[torch.float8_e4m3fn] == 17
    for dtype, code in codes.items():
        assert _meta.CODE_DTYPES[code] is dtype
        t = torch.zeros(3 * dtype.itemsize, dtype=torch.uint8).view(dtype)  # no kernels needed
        assert _meta.raw(t).element_size() == t.element_size()
    assert _meta.dtype_code(torch.qint8) == 0


def test_choose_strategy_rules():
    mib = 1 << 20
    pick = V.choose_strategy
    for op in ("all_gather_v", "gather_v", "scatter_v", "reduce_scatter_v"):
        assert pick(op, [4, 4, 4, 4], 4, "nccl") == "native"
    # NCCL all_gather: large balanced -> padded; skewed or small -> grouped broadcasts
    assert pick("all_gather_v", [mib, mib, mib, mib - 1], 4, "nccl") == "padded"
    assert pick("all_gather_v", [8 * mib, mib, mib, mib], 4, "nccl") == "bcast"
    assert pick("all_gather_v", [100, 99, 100, 100], 4, "nccl") == "bcast"
    assert pick("reduce_scatter_v", [mib, mib, mib, mib - 1], 4, "nccl") == "padded"
    assert pick("reduce_scatter_v", [8 * mib, 1, 1, 1], 4, "nccl") == "list"
    assert pick("gather_v", [1, 2, 3, 4], 4, "nccl") == "a2a"
    assert pick("scatter_v", [1, 2, 3, 4], 4, "nccl") == "a2a"
    # Gloo: measured rules
    assert pick("all_gather_v", [4, 4], 4, "gloo") == "p2p"
    assert pick("all_gather_v", [4, 5], 4, "gloo") == "p2p"
    assert pick("gather_v", [4, 4], 4, "gloo") == "p2p"
    assert pick("scatter_v", [4, 4], 4, "gloo") == "native"
    assert pick("scatter_v", [4, 5], 4, "gloo") == "p2p"
    assert pick("reduce_scatter_v", [4, 4], 4, "gloo") == "native"
    assert pick("reduce_scatter_v", [4, 5], 4, "gloo") == "allreduce"
    assert pick("all_to_all_v", [1, 2], 4, "gloo") == pick("all_to_all_v", [1, 2], 4, "nccl") == "a2a"
    # other backends: native when equal, else a portable varlen path
    assert pick("gather_v", [1, 2], 4, "ucc") == "a2a"
    assert pick("all_gather_v", [1, 2], 4, "mpi") == "padded"
    for op, names in _plan.SUPPORTED.items():
        for backend in ("gloo", "nccl", "ucc"):
            assert pick(op, [1, 7, 0, 3], 8, backend) in names


def test_p2p_layout_is_aligned():
    specs = [(torch.bool, [3]), (torch.complex128, [2]), (torch.float16, [0]), (torch.int8, [5, 1]),
             (torch.float64, [])]
    offsets, total = _p2p.layout(specs)
    assert all(off % _p2p.ALIGN == 0 for off in offsets)
    assert offsets == [0, 16, 48, 48, 64] and total == 80
    assert _meta.hash_ints([1, 2, 3]) != _meta.hash_ints([3, 2, 1]) and _meta.hash_ints([]) >= 0


# ---------------------------------------------------------------------------------------
# all_gather_v on Gloo: the data ride with the metadata when no rank grew
# ---------------------------------------------------------------------------------------

#: (length on rank r, dtype, trailing dims, dim) per call: steady, one rank grows, one shrinks,
#: all zero, the dtype changes (to a wider and to a narrower one), the dim moves.
SPEC_CALLS = [
    (lambda r: r + 2, torch.float32, (3,), 0),
    (lambda r: r + 2, torch.float32, (3,), 0),
    (lambda r: r + 2 + (5 if r == 1 else 0), torch.float32, (3,), 0),
    (lambda r: r + 2 + (5 if r == 1 else 0), torch.float32, (3,), 0),
    (lambda r: 1 if r == 2 else r + 2, torch.float32, (3,), 0),
    (lambda r: 0, torch.float32, (3,), 0),
    (lambda r: r + 1, torch.int8, (3,), 0),
    (lambda r: r + 1, torch.complex128, (3,), 0),
    (lambda r: r + 1, torch.complex128, (3,), 0),
    (lambda r: 2 * r + 1, torch.bfloat16, (2, 2), 1),
    (lambda r: 2 * r + 1, torch.bfloat16, (2, 2), 1),
]


def _w_speculation(rank, ws, store):
    import commscope

    commscope.instrument(store, sample_interval=0.2)
    fails = []
    for k, (length, dtype, trailing, dim) in enumerate(SPEC_CALLS):
        inputs = [make(SEED, who, 500 + k, shape_with(trailing, dim, length(who)), dtype) for who in range(ws)]
        cat = k % 2 == 1
        got = V.all_gather_v(inputs[rank], dim=dim, cat=cat)
        if not (same(got, torch.cat(inputs, dim)) if cat else same_list(got, inputs)):
            fails.append(f"rank {rank} call {k}")
    _meta.SPECULATE_MAX_BYTES = 64  # then calls over that budget make no room for data
    for k in range(2):
        inputs = [make(SEED, who, 600, (10 + who,), torch.float32) for who in range(ws)]
        if not same_list(V.all_gather_v(inputs[rank]), inputs):
            fails.append(f"rank {rank} over-budget call {k}")
    commscope.uninstrument()
    return fails


def test_all_gather_v_sends_data_with_metadata_when_no_rank_grew(tmp_path):
    """Every call is right, and the inner messages show the protocol: one message per pair
    when no rank outgrew the previous call, a second round when one did."""
    store = tmp_path / "trace"
    ws = 3
    assert _run(_w_speculation, str(store), world_size=ws) == [[]] * ws
    events = read_events(store)
    per_call = []
    for rank in range(ws):
        all_ops = ops(events, rank)
        outer = [o for o in all_ops if o["op"] == "all_gather_v"]
        assert len(outer) == len(SPEC_CALLS) + 2
        per_call.append([len([o for o in all_ops if o.get("parent") == x["id"]]) for x in outer])
    assert per_call[0] == per_call[1] == per_call[2]
    one_round = 2 * (ws - 1)  # an isend and an irecv per peer
    counts = per_call[0]
    # no history (call 0), a rank grew (2), bytes grew after all-empty (6) and by a wider dtype (7)
    assert all(counts[k] > one_round for k in (0, 2, 6, 7)), counts
    # steady (1, 3, 8, 10), shrunk (4, 5) or fewer bytes in another dtype and dim (9): one round
    assert all(counts[k] == one_round for k in (1, 3, 4, 5, 8, 9, 10)), counts
    # over the speculation budget: a metadata round, then the data, every time
    assert counts[-2] > one_round and counts[-1] > one_round, counts
