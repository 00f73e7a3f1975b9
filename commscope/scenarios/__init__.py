"""Demo scenarios for ``commscope demo``: real torch.distributed jobs, healthy or broken.

API (what the console and ``commscope demo`` use)::

    from commscope.scenarios import SCENARIOS, Scenario, DemoJob, run_headless

    SCENARIOS                      # dict name -> Scenario, in the order of issue 6
    sc = SCENARIOS["missing-rank"]
    sc.title, sc.summary, sc.look_for   # picker text: one line, what it does, what to look for
    sc.default_ranks, sc.min_ranks, sc.hangs
    sc.expected                    # ((kind, culprits), ...) `check` reports with default ranks
    sc.expect(ranks)               # the same for another rank count
    sc.worker                      # worker(rank, world_size, ctx: DemoContext), module level

    job = DemoJob("missing-rank", ranks=4, backend="gloo", hang_after=3.0).start()
    job.store                      # fresh trace directory of this run: open_source(job.store, wait=True)
    job.alive(), job.pids, job.finished, job.exitcodes, job.wait(timeout), job.stop()

    run_headless("missing-rank", json=False, check=commands.check.check_store) -> int  # demo X --headless

``DemoJob(..., backend="nccl")`` raises ValueError("nccl backend needs 4 GPUs, found 0; use
--backend gloo") without enough GPUs.  See commscope/scenarios/runner.py for the process
lifecycle and docs/demos.md for the scenarios.
"""

from __future__ import annotations

from commscope.scenarios import workloads
from commscope.scenarios.base import DemoContext, Expected, Scenario
from commscope.scenarios.runner import (
    EXIT_ORPHANED,
    EXIT_TIME_LIMIT,
    DemoJob,
    get_scenario,
    run_headless,
    watch_until_diagnosed,
)


def _scenario(expect_fn=None, **kw) -> Scenario:
    default = kw.get("default_ranks", 4)
    if expect_fn is not None:
        kw["expected"] = expect_fn(default)
    return Scenario(expect_fn=expect_fn, **kw)


_LIST = [
    _scenario(
        name="healthy-training", title="Healthy DDP training",
        summary=("Trains a small MLP with DistributedDataParallel for 300 steps. Rank 0 splits the dataset "
                 "unevenly with varlen scatter_v; DDP's C++ reducer all-reduces the gradients (seen through "
                 "PyTorch's Flight Recorder); each step's loss is all-reduced asynchronously while the next step "
                 "computes; every 100 steps each rank's predictions (of a different length per rank) are "
                 "collected with varlen all_gather_v to compute the accuracy."),
        look_for=("A steady rhythm on every rank: the 'fr' all_reduce ops of DDP in each step, the async "
                  "all_reduce whose wait overlaps compute, and the periodic all_gather_v with its per-rank "
                  "sizes in the op detail. No findings: this is what healthy looks like."),
        worker=workloads.healthy_training),
    _scenario(
        name="varlen-tour", title="Tour of the varlen toolkit",
        summary=("Calls every commscope.varlen function in turn, four rounds: all_gather_v, gather_v, "
                 "scatter_v, all_to_all_v, reduce_scatter_v, broadcast_v, send_tensors/recv_tensors around the "
                 "ring and isend_tensors/irecv_tensors. Sizes are random per round and one rank is empty each "
                 "time; every result is checked."),
        look_for=("Open an op's detail to see the sizes per rank (the empty rank has 0 bytes), and the inner "
                  "collectives each varlen op ran, marked nested. No findings."),
        worker=workloads.varlen_tour),
    _scenario(
        name="pipeline", title="Pipeline-parallel p2p",
        summary=("Each rank is a pipeline stage. Activations of micro-batches with different sequence lengths "
                 "flow forward with send_tensors/recv_tensors (the receiver needs no shapes), the last stage "
                 "returns each loss to stage 0 with isend_tensors, and gradients flow back along the ring with "
                 "batch_isend_irecv."),
        look_for=("The fill-and-drain wave across ranks in the timeline, matching send/recv pairs, and the "
                  "batch_isend_irecv containers with their isend/irecv children. No findings."),
        worker=workloads.pipeline),
    _scenario(
        name="straggler", title="One slow rank",
        summary=("A training loop of compute plus a gradient all_reduce, where the last rank also spends "
                 "0.15 s 'loading data' before every step, so all other ranks wait for it in every "
                 "all_reduce."),
        look_for=("The others' all_reduce bars are long and the slow rank's are short: it arrives last every "
                  "time. A straggler warning names it, with its median lateness."),
        worker=workloads.straggler,
        expect_fn=lambda n: (("straggler", (n - 1,)),)),
    _scenario(
        name="missing-rank", title="A rank skips a collective (hangs)",
        summary=("A loop of all_reduces in which the last rank skips one ('my batch is empty'). Gloo matches "
                 "collectives by order, so its later calls pair with the others' earlier ones and it finishes "
                 "one early, while every other rank waits forever in its last all_reduce."),
        look_for=("All ranks but one blocked in the same all_reduce, waiting longer and longer; after hang_after "
                  "a missing_ranks error names the rank that never entered, what it is doing instead and its "
                  "last sequence number in the group."),
        worker=workloads.missing_rank, hangs=True,
        expect_fn=lambda n: (("missing_ranks", (n - 1,)),)),
    _scenario(
        name="collective-mismatch", title="Ranks disagree on the collective (hangs)",
        summary=("Rank 1 takes a different branch: it calls broadcast where the others call all_reduce (async, "
                 "so the step goes on), then on a second group it passes a tensor of shape (16,) where the "
                 "others pass (4, 4) (same bytes: the backend cannot notice, the result is silently wrong). "
                 "Waiting for the first collective hangs."),
        look_for=("Two collective_mismatch errors naming rank 1: one on the default group (broadcast vs "
                  "all_reduce, at the same sequence number), one on the second group (shape). The per-rank "
                  "table shows what each rank called and where."),
        worker=workloads.collective_mismatch, hangs=True, min_ranks=3,
        expect_fn=lambda n: (("collective_mismatch", (1,)), ("collective_mismatch", (1,)))),
    _scenario(
        name="p2p-deadlock", title="Everyone receives first (hangs)",
        summary=("A ring exchange that works (even ranks send first), then a version where every rank "
                 "receives from its left neighbour before sending to its right one: all ranks block in recv."),
        look_for=("Every rank blocked in recv; a p2p_deadlock error shows the wait-for cycle rank by rank "
                  "(rank 0 waits for 3, 3 for 2, ...) with each rank's call site and stack."),
        worker=workloads.p2p_deadlock, hangs=True,
        expect_fn=lambda n: (("p2p_deadlock", tuple(range(n))),)),
    _scenario(
        name="dead-rank", title="A rank dies mid-run",
        summary=("A loop of all_reduces; halfway through, rank 1 exits abruptly (os._exit, like a segfault or "
                 "the OOM killer: no exception, no clean shutdown). The others' next all_reduce fails; they tear "
                 "their process group down cleanly, keep running for a few seconds and exit."),
        look_for=("Rank 1 vanishes while the others keep their heartbeat: it turns dead, they show a failed "
                  "all_reduce and a clean exit. One dead_rank error names rank 1 with the op it was after and "
                  "its last resource sample; the others' failed all_reduce is listed as its consequence, not "
                  "as an error of their own."),
        worker=workloads.dead_rank,
        expected=(("dead_rank", (1,)),)),
    _scenario(
        name="async-leak", title="Async work never waited on",
        summary=("Training steps with async all_reduces that are waited correctly, but the last rank also "
                 "sends its metrics to rank 0 with isend every third step and never calls wait() on the "
                 "returned work."),
        look_for=("When the ranks exit, an unwaited_work warning lists the leaked isend ops of the last rank "
                  "with their call site."),
        worker=workloads.async_leak,
        expect_fn=lambda n: (("unwaited_work", (n - 1,)),)),
]

#: Every scenario by name, in the order of issue 6.
SCENARIOS: dict[str, Scenario] = {s.name: s for s in _LIST}

__all__ = ["SCENARIOS", "Scenario", "DemoContext", "DemoJob", "Expected", "run_headless",
           "get_scenario", "watch_until_diagnosed", "EXIT_TIME_LIMIT", "EXIT_ORPHANED"]
