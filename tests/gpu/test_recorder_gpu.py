"""The recorder on CUDA/NCCL (world size 1): device timings without host syncs, NVML samples.

Skipped where CUDA is absent (CI); run on a lent GPU with ``pytest tests/gpu``.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def nccl_work(rank: int, ws: int, store: str) -> dict:
    import time

    import torch.distributed as dist

    import commscope

    torch.cuda.set_device(0)
    commscope.instrument(store, sample_interval=0.1, hang_after=60)
    x = torch.ones(1 << 20, device="cuda")
    dist.all_reduce(x)  # warm up NCCL
    torch.cuda.synchronize()
    # A long kernel first: if the wrapper synchronized, the marker would be complete on return.
    torch.cuda._sleep(200_000_000)
    marker = torch.cuda.Event()
    marker.record()
    dist.all_reduce(x)
    pending_after_sync_op = not marker.query()
    w = dist.all_reduce(x, async_op=True)
    pending_after_async_op = not marker.query()
    w.wait()
    torch.cuda.synchronize()
    g = dist.new_group([0])
    dist.broadcast(x, src=0, group=g)
    torch.cuda.synchronize()
    time.sleep(0.5)  # let the recorder poll the events and take a GPU sample
    return {"sync": pending_after_sync_op, "async": pending_after_async_op}


@pytest.mark.parametrize("source", ["native", "python"])
def test_nccl_ops_get_device_timings_without_host_syncs(tmp_path, source):
    """Every op gets its device time, sync ones included (NCCL runs them on the caller's
    stream and returns no work: seen on an H200 with torch 2.11), and a finished op is no
    error; with the Python recorder too, whose ``done`` must come after its op's begin."""
    from trace_helpers import of_type, ops, read_events

    from commscope.launch import run_ranks

    store = tmp_path / "trace"
    res = run_ranks(nccl_work, 1, args=(str(store),), backend="nccl", timeout=120,
                    env={"COMMSCOPE_SOURCE": source})[0].value
    assert res == {"sync": True, "async": True}
    events = read_events(store)
    all_ops = [o for o in ops(events) if o.get("src") != "fr"]
    assert [o["op"] for o in all_ops] == ["all_reduce", "all_reduce", "all_reduce", "broadcast"]
    for o in all_ops:
        done = o["phases"].get("done")
        assert done is not None and done["gpu_ns"] > 0, o
        assert "exc" not in done, o  # a finished op is no error (WorkNCCL.isSuccess throws)
    slow = all_ops[1]  # queued behind the sleep kernel: its device time includes the wait
    assert slow["phases"]["done"]["ts"] >= slow["phases"]["end"]["ts"]
    assert all_ops[3]["group"] == "1"
    samples = of_type(events, "sample")
    gpu = [s for s in samples if "gpu_util" in s]
    assert gpu, samples[-1]
    assert gpu[-1]["gpu_mem_total"] > gpu[-1]["gpu_mem"] > 0
