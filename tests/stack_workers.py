"""Training stacks for the coverage tests, run on real Gloo ranks (module-level for the forkserver).

Each worker records into ``store`` with ``commscope.instrument`` and returns how many
collectives Flight Recorder logged per group (the backend's own count, to compare with
the trace).  With ``hang_step`` set, rank 1 stops before that step and never comes back,
so the other rank hangs in the framework's next collective.
"""

from __future__ import annotations

import os
import time
import warnings

import torch

import commscope

HANG_AFTER = 1.0


def _start(store: str) -> None:
    warnings.simplefilter("ignore")
    commscope.instrument(store, hang_after=HANG_AFTER, sample_interval=0.2)


def _stall(rank: int, step: int, hang_step: int | None) -> None:
    if hang_step is not None and step == hang_step and rank == 1:
        commscope.record.recorder.active().flush()
        while True:  # never arrives: the other rank waits in the next collective
            time.sleep(0.1)


def fr_counts() -> dict[str, int]:
    """Collectives Flight Recorder logged, per group name."""
    from commscope.record import flight

    counts: dict[str, int] = {}
    for e in flight.dump_entries():
        group = str((e.get("process_group") or ["?"])[0])
        if group:  # DETAIL's hidden helper groups have no name
            counts[group] = counts.get(group, 0) + 1
    return counts


def _finish() -> dict[str, int]:
    counts = fr_counts()
    commscope.uninstrument()
    return counts


def fsdp2(rank: int, ws: int, store: str, hang_step: int | None = None) -> dict[str, int]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    _start(store)
    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (ws,))
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        _stall(rank, step, hang_step)
        opt.zero_grad()
        model(torch.randn(4, 16)).sum().backward()
        opt.step()
    return _finish()


class _MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(16, 32)
        self.down = torch.nn.Linear(32, 16)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def tensor_parallel(rank: int, ws: int, store: str, hang_step: int | None = None) -> dict[str, int]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    _start(store)
    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (ws,))
    model = parallelize_module(_MLP(), mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    for step in range(3):
        _stall(rank, step, hang_step)
        out = model(torch.randn(4, 16))
        out.sum().backward()
    t = distribute_tensor(torch.arange(8.0), mesh, [Shard(0)])
    t.redistribute(mesh, [Replicate()]).to_local()
    return _finish()


def pipeline(rank: int, ws: int, store: str, hang_step: int | None = None) -> dict[str, int]:
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    _start(store)
    torch.manual_seed(0)
    stage_mod = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    stage = PipelineStage(stage_mod, rank, ws, torch.device("cpu"))
    schedule = ScheduleGPipe(stage, n_microbatches=2, loss_fn=lambda out, target: out.sum())
    for step in range(3):
        _stall(rank, step, hang_step)
        if rank == 0:
            schedule.step(torch.randn(4, 8))
        else:
            schedule.step(target=torch.zeros(4, 8))
    return _finish()


def checkpoint(rank: int, ws: int, store: str, path: str, hang_step: int | None = None) -> dict[str, int]:
    import torch.distributed.checkpoint as dcp

    _start(store)
    state = {"w": torch.arange(4.0), "step": torch.tensor(7)}
    for step in range(2):
        _stall(rank, step, hang_step)
        dcp.save(state, checkpoint_id=os.path.join(path, f"ckpt{step}"))
    loaded = {"w": torch.zeros(4), "step": torch.tensor(0)}
    dcp.load(loaded, checkpoint_id=os.path.join(path, "ckpt1"))
    assert torch.equal(loaded["w"], state["w"])
    return _finish()
