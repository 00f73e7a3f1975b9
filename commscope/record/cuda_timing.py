"""Device-side completion of CUDA ops from CUDA events, without a host sync.

The hot path records a pooled event pair on the stream the op's tensors use; the
recorder thread later asks ``query()`` (never ``synchronize``) and turns finished pairs
into ``done`` events with the GPU duration.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import torch


class CudaTimer:
    MAX_PENDING = 65_536

    def __init__(self) -> None:
        self._pools: dict[int, list[Any]] = {}
        self.pending: dict[int, deque[tuple[int, Any, Any]]] = {}  # device -> (op_id, start, end)
        self.dropped = 0

    def event(self, device: int) -> Any:
        pool = self._pools.get(device)
        if pool:
            try:
                return pool.pop()
            except IndexError:
                pass
        with torch.cuda.device(device):
            return torch.cuda.Event(enable_timing=True)

    def record(self, device: int) -> Any:
        """Record a pooled event on ``device``'s current stream (asynchronous)."""
        ev = self.event(device)
        ev.record(torch.cuda.current_stream(device))
        return ev

    def finish(self, op_id: int, start: Any, end: Any, device: int) -> None:
        queue = self.pending.get(device)
        if queue is None:
            queue = self.pending.setdefault(device, deque())
        if len(queue) >= self.MAX_PENDING:
            self.dropped += 1
            return
        queue.append((op_id, start, end))

    def poll(self) -> list[tuple[int, int]]:
        """(op_id, gpu_ns) for every pending pair whose end event has completed, in order.

        Per device it stops at the first unfinished pair: ops on a device mostly finish
        in issue order, and the rest are checked again on the next poll.
        """
        done = []
        for device, queue in list(self.pending.items()):
            pool = self._pools.setdefault(device, [])
            while queue:
                op_id, start, end = queue[0]
                try:
                    if not end.query():
                        break
                    gpu_ns = int(start.elapsed_time(end) * 1e6)
                except RuntimeError:
                    gpu_ns = -1  # e.g. the context is being torn down
                queue.popleft()
                done.append((op_id, gpu_ns))
                if len(pool) < 1024:
                    pool.extend((start, end))
        return done
