"""Variable-length collectives and multi-tensor send/recv for torch.distributed (Gloo and NCCL).

    all_gather_v(t, *, dim=0, sizes=None, cat=False, group=None, async_op=False, check_sizes=None)
    gather_v(t, dst=0, *, dim=0, sizes=None, cat=False, group=None, check_sizes=None)
    scatter_v(chunks_or_tensor, src=0, *, split_sizes=None, dim=0, group=None)
    all_to_all_v(tensors_per_dst, *, dim=0, group=None)
    reduce_scatter_v(t, split_sizes, op=SUM, *, dim=0, group=None)
    broadcast_v(t_or_None, src=0, *, group=None)
    send_tensors(tensors, dst, *, group=None) / recv_tensors(src, *, group=None)
    isend_tensors(...) / irecv_tensors(...)  -> handles with wait()

Tensors vary along ``dim``; dtype, device type and the other dims must agree.  ``src``/``dst``
are global ranks, as in torch.distributed; lists come back in group-rank order.  The
collectives also take ``strategy=`` (below) to force a data path.  Depends on torch only, and
calls torch.distributed through the module at call time, so wrappers (commscope's recorder)
see every inner call.  No pickle anywhere.

How a collective runs
---------------------
1. Metadata: every rank encodes op, root, dim, dtype (a stable small code, see DTYPE_CODES),
   device type, shape, forced strategy and any local problem (0-d tensor, dim out of range,
   bad split sizes or list length, unknown strategy, a reduce op that is not a ReduceOp,
   non-tensor, meta/nested/sparse tensor...) into one 26 x int64 record: no local problem
   raises before the exchange.  One small exchange hands everyone every record (NCCL: all_gather on the current CUDA device; Gloo:
   one isend/irecv message per pair of ranks, the same for every op), then one host read.
   ``sizes=`` on all_gather_v/gather_v skips this; then only local checks run, and a rank
   that fails them raises alone while the others block (docs/varlen.md says exactly what
   each disagreement does).  ``check_sizes=True`` or ``$COMMSCOPE_VARLEN_CHECK=1`` exchanges
   anyway, with the sizes in the record, so that every rank raises together.
   all_gather_v on Gloo sends its data in the same message: each rank makes room after
   rank s's record for as many bytes as rank s sent in the group's previous all_gather_v (a
   Gloo receive takes a shorter message; every rank knows those counts alike, from the
   previous call's records).  When no rank grew, the op is over after this one round of
   messages; otherwise the normal data path runs with the now known sizes.  Steady-state
   calls (the same or smaller sizes every step) thus cost one round instead of two: 1 MiB
   per rank on 4 ranks measured 0.87x the all_gather_into_tensor "limit" (was 1.08x), and
   3.2x faster than all_gather_object (was 2.4x).  Because every op on a group sends exactly
   one such message per pair, ranks that disagree about the op still swap records and all
   raise; a receive never accepts a longer message, so nothing is left dangling.
2. Validation: every rank decides from the same numbers, so a disagreement (ndim, dtype,
   device type, trailing dims, op, root, strategy, reduce op, split sizes) or a local
   problem raises the same ValueError on every rank, naming the offending ranks (those off
   the majority; all of them on a tie).  Never a hang, never garbage.
3. Data: moved as raw bytes (bit-exact for bool, bfloat16, complex, float8, ...), except
   reductions, which run in the tensor's own dtype.  Data of a device type the group has no
   backend for (CPU tensors on an NCCL-only group, CUDA tensors on Gloo) are staged through
   the group's device and returned on the caller's.

Strategy rule (``choose_strategy``; a ``strategy=`` passed on every rank overrides it)
-------------------------------------------------------------------------------------
  op                Gloo                              NCCL
  all_gather_v      p2p (equal lengths or not)         equal: native all_gather_into_tensor;
                                                       uneven: padded if it wastes <= 25% and the
                                                       largest shard is >= 1 MiB, else bcast
                                                       (NCCL's uneven list all_gather = grouped
                                                       broadcasts)
  gather_v          p2p                                equal: native gather; uneven: a2a
  scatter_v         equal: native scatter; else p2p    equal: native scatter; uneven: a2a
  all_to_all_v      a2a (exact-size all_to_all_single)  a2a
  reduce_scatter_v  equal: native; else allreduce     equal: native reduce_scatter_tensor;
                                                       uneven: padded (<= 25% waste, >= 1 MiB),
                                                       else list (grouped reduces)
  broadcast_v       broadcast of the bytes             broadcast of the bytes
Other backends: native when equal, else a2a (gather/scatter) or padded.  "p2p" is an
exact-size isend/irecv exchange (NCCL: one batch_isend_irecv group); "a2a" is
all_to_all_single with exact split sizes (zero to everyone but the root for gather/scatter),
which moves fewer bytes than any padded collective.

Why those Gloo rules: measured with ``commscope bench varlen`` (strategy table; 4 Gloo ranks
sharing 2 CPU cores with other jobs, float32, median of the slowest rank; ratio to the
fastest strategy of the op in that column):

  op[strategy]                  4 KiB bal     4 KiB skew    1 MiB bal     1 MiB skew
  all_gather_v[p2p]             3.11 ms 1.00  2.34 ms 1.13  6.46 ms 1.00  16.44 ms 1.29
  all_gather_v[bcast]           3.34 ms 1.08  3.27 ms 1.59  6.83 ms 1.06  12.73 ms 1.00
  all_gather_v[native]          4.23 ms 1.37  -             8.99 ms 1.39  -
  all_gather_v[a2a]             3.31 ms 1.07  2.06 ms 1.00  8.45 ms 1.31  27.16 ms 2.13
  all_gather_v[padded]          3.10 ms 1.00  3.88 ms 1.88  11.11 ms 1.72 127.54 ms 10.0
  gather_v[p2p]                 0.64 ms 1.00  0.86 ms 1.00  3.25 ms 1.39  7.61 ms 1.65
  gather_v[native]              0.94 ms 1.47  -             2.35 ms 1.00  -
  gather_v[a2a]                 2.38 ms 3.71  1.72 ms 2.00  3.59 ms 1.53  4.62 ms 1.00
  gather_v[padded]              0.92 ms 1.44  1.32 ms 1.54  2.71 ms 1.15  37.17 ms 8.04
  scatter_v[native]             4.04 ms 1.07  -             3.22 ms 1.00  -
  scatter_v[p2p]                4.26 ms 1.13  3.47 ms 1.40  4.22 ms 1.31  6.47 ms 1.09
  scatter_v[padded]             3.78 ms 1.00  2.48 ms 1.00  4.15 ms 1.29  20.21 ms 3.42
  reduce_scatter_v[allreduce]   7.75 ms 1.00  9.36 ms 1.08  16.84 ms 1.11 31.88 ms 1.00
  reduce_scatter_v[native]      8.27 ms 1.07  -             15.17 ms 1.00 -
  reduce_scatter_v[padded]      10.04 ms 1.30 8.70 ms 1.00  20.15 ms 1.33 164.76 ms 5.17
  reduce_scatter_v[list]        19.85 ms 2.56 21.12 ms 2.43 29.09 ms 1.92 37.82 ms 1.19
  metadata exchange: all_to_all 3.16/3.84/3.80/2.74 ms vs all_gather 3.95/4.49/3.35/4.37 ms
  (later, the per-pair p2p messages that replaced the all_to_all for groups of <= 64 ranks:
  2.49/1.23/2.14/4.15 ms vs all_gather 4.01/3.59/4.13/3.64 ms, one run)

That box is noisy (single runs swing 1.5x), so the rules rest on the pattern over four full
bench runs plus dedicated A/B runs (2 and 4 ranks), not on one table:
- all_gather_v: the concurrent p2p exchange beat Gloo's all_gather (a ring of size-1
  dependent steps; same bytes per rank) in 13 of 14 equal-length comparisons, by 1.1-5.8x,
  so Gloo uses it for equal lengths too; skewed, it beat the padded all_gather by 1.5-7x,
  and all_to_all_single, which must replicate the input, by up to 2x.  Grouped broadcasts
  were level with p2p (within 30% either way, depending on size and run).
- gather_v: isend/irecv to the root beat Gloo's gather in 13 of 14 equal-length
  comparisons (1.2-20x).
- scatter_v: Gloo's scatter is fine when equal; uneven, p2p or all_to_all_single (level).
- reduce_scatter_v: reduce_scatter_tensor and all_reduce + slice were level when equal;
  uneven, all_reduce + slice beat the uneven list reduce_scatter (1.2-3.6x) and, at 1 MiB
  skewed, padding (4-5x); at 4 KiB skewed padding was 5-25% faster, not worth a second rule.
- metadata: all_to_all beat all_gather in 17 of 19 comparisons (a quiet A/B: median 0.53
  ms vs 3.7 ms on 4 ranks).
The NCCL rules could not be measured here (no GPU); they follow the issue: one padded ring
kernel when padding wastes little and shards are big, exact-size grouped broadcasts/reduces
or all_to_all splits otherwise.

Overlap
-------
all_gather_v(async_op=True): the metadata exchange (a blocking small collective plus a host
read) happens before it returns; the data transfer overlaps with compute until ``wait()``.
With ``sizes=`` nothing blocks.  For send/recv see isend_tensors and irecv_tensors: the whole
send overlaps; a receive posts its first buffer at once, which on Gloo takes a whole transfer
of up to 1 MiB, while bigger payloads are received once the header is in.  Gloo's p2p works
report completion only when waited on, so ``is_completed()`` polling helps on NCCL only.
Hence the one limit: on Gloo, no collective between ``irecv_tensors`` and its ``wait()`` when
the message may exceed 1 MiB and the sender blocks in ``send_tensors`` (a deadlock; the
payload receive is posted in ``wait()``).  Outstanding receives from one peer match its
messages in posting order.  Conjugate/negative-bit views travel as their values, and results
carry no autograd history.
"""

from __future__ import annotations

from commscope.varlen._collectives import (
    VarlenWork,
    all_gather_v,
    all_to_all_v,
    broadcast_v,
    gather_v,
    reduce_scatter_v,
    scatter_v,
)
from commscope.varlen._meta import DTYPE_CODES
from commscope.varlen._p2p import RecvWork, SendWork, irecv_tensors, isend_tensors, recv_tensors, send_tensors
from commscope.varlen._plan import SUPPORTED, choose_strategy

__all__ = [
    "all_gather_v", "gather_v", "scatter_v", "all_to_all_v", "reduce_scatter_v", "broadcast_v",
    "send_tensors", "recv_tensors", "isend_tensors", "irecv_tensors",
    "VarlenWork", "SendWork", "RecvWork", "choose_strategy", "SUPPORTED", "DTYPE_CODES",
]
