"""Strategy rules: which collective moves a varlen op's data, per backend and size.

Pure functions of (op, per-rank lengths, bytes per row, backend), so every rank that holds
the same metadata picks the same plan, and tests can check the NCCL rules on a CPU box.
The measurements behind the Gloo rules are in the package docstring.
"""

from __future__ import annotations

from collections.abc import Sequence

#: Which strategies each op implements.
SUPPORTED: dict[str, tuple[str, ...]] = {
    "all_gather_v": ("native", "padded", "p2p", "bcast", "a2a"),
    "gather_v": ("native", "padded", "p2p", "a2a"),
    "scatter_v": ("native", "padded", "p2p", "a2a"),
    "reduce_scatter_v": ("native", "padded", "list", "allreduce"),
}
#: Strategies that need every rank's length to be equal.
EQUAL_ONLY = frozenset({"native"})

#: NCCL: a padded collective is worth its wasted bytes only when padding adds at most this
#: fraction (ring algorithms then run at bus bandwidth in one kernel) ...
NCCL_PAD_WASTE = 0.25
#: ... and the largest shard is at least this big (below it, launch latency dominates and
#: one grouped launch of exact-size broadcasts/reduces is as cheap).
NCCL_PAD_MIN_BYTES = 1 << 20


def choose_strategy(op: str, sizes: Sequence[int], row_bytes: int, backend: str) -> str:
    """The strategy ``op`` uses for per-rank lengths ``sizes`` (rows of ``row_bytes`` bytes).

    ``backend`` is the name of the backend that carries the data ("gloo", "nccl", ...)."""
    equal = len(set(sizes)) <= 1
    if op == "all_to_all_v":
        return "a2a"
    if op == "broadcast_v":
        return "native"
    if backend == "gloo":
        return _gloo(op, equal)
    if backend == "nccl":
        return _nccl(op, sizes, row_bytes, equal)
    # Other backends (ucc, mpi, ...): native when equal, else the one varlen primitive every
    # backend has (all_to_all_single) or a padded collective.
    if equal:
        return "native"
    return {"all_gather_v": "padded", "reduce_scatter_v": "padded"}.get(op, "a2a")


def _gloo(op: str, equal: bool) -> str:
    if op == "all_gather_v":
        # Exact-size isend/irecv between every pair, even for equal lengths: Gloo's all_gather
        # is a ring of size-1 dependent steps, and the concurrent exchange (same bytes per
        # rank) beat it in 13 of 14 measurements on 2 and 4 ranks, by 1.1-5.8x; uneven, it
        # beat the padded all_gather by 1.5-7x and all_to_all_single (which must replicate
        # the input) by up to 2x.
        return "p2p"
    if op == "gather_v":
        # isend/irecv to dst beat Gloo's gather in 13 of 14 equal-size measurements (1.2-20x).
        return "p2p"
    if op == "scatter_v":
        return "native" if equal else "p2p"
    if op == "reduce_scatter_v":
        # native reduce_scatter_tensor when equal (level with all_reduce + slice in the bench);
        # uneven: all_reduce + slice beat Gloo's uneven list reduce_scatter by 1.2-3.6x and a
        # padded reduce_scatter by 4-5x (skewed, 1 MiB).
        return "native" if equal else "allreduce"
    raise ValueError(f"unknown varlen op {op!r}")


def _nccl(op: str, sizes: Sequence[int], row_bytes: int, equal: bool) -> str:
    if equal:
        return "native"
    if op in ("gather_v", "scatter_v"):
        # exact-size all_to_all_single (zero splits to everyone but the root) moves fewer bytes
        # than a padded gather/scatter and is one grouped NCCL launch.
        return "a2a"
    total, largest = sum(sizes), max(sizes)
    waste = (len(sizes) * largest - total) / max(total, 1)
    balanced_and_large = waste <= NCCL_PAD_WASTE and largest * row_bytes >= NCCL_PAD_MIN_BYTES
    if op == "all_gather_v":
        # padded all_gather_into_tensor for large balanced shards; grouped broadcasts (NCCL's
        # uneven list all_gather) for small or skewed ones.
        return "padded" if balanced_and_large else "bcast"
    if op == "reduce_scatter_v":
        # padded reduce_scatter_tensor vs grouped reduces (NCCL's uneven list reduce_scatter)
        return "padded" if balanced_and_large else "list"
    raise ValueError(f"unknown varlen op {op!r}")
