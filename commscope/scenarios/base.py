"""The pieces every demo scenario shares: ``Scenario``, ``DemoContext`` and rank-side helpers.

A scenario is a module-level function ``worker(rank, world_size, ctx)`` that runs real
torch.distributed work on the process group the runner created, plus the text the console
shows about it.  The runner (``commscope.scenarios.runner``) starts the processes, joins
the process group, switches instrumentation on and then calls the worker; the worker only
does the work.  Everything a worker needs to know travels in ``ctx`` (a picklable
``DemoContext``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

Expected = tuple[tuple[str, "tuple[int, ...] | None"], ...]


#: The most worker processes a demo starts on one machine: each is a Python process with
#: torch (~300 MB), and ``demo --ranks 5000`` started them all until the machine gave out
MAX_RANKS = 64


@dataclasses.dataclass(frozen=True)
class DemoContext:
    """What a demo worker gets besides its rank and the world size (picklable).

    ``pace`` scales every deliberate pause (1.0: watchable in the console; tests use
    less), ``steps`` overrides a scenario's number of iterations (None: its default).
    ``deadline`` is the wall-clock time (``time.time()``) by which every worker has
    exited; a hanging scenario holds its hang until then.
    """

    scenario: str
    backend: str = "gloo"
    store: str = ""
    hang_after: float = 3.0
    sample_interval: float = 0.2
    pace: float = 1.0
    steps: int | None = None
    seed: int = 0
    deadline: float = 0.0
    owner_pid: int = 0
    owner_started: float = 0.0
    log_dir: str | None = None

    @property
    def device_type(self) -> str:
        return "cuda" if self.backend == "nccl" else "cpu"

    def device(self, rank: int) -> Any:
        import torch

        return torch.device("cuda", rank) if self.backend == "nccl" else torch.device("cpu")

    def n(self, default: int, *, least: int = 1) -> int:
        """The number of iterations: ``steps`` when set, else ``default``; at least ``least``."""
        return max(least, self.steps if self.steps is not None else default)

    def pause(self, seconds: float) -> None:
        """Sleep ``seconds * pace`` (the scenario's rhythm, so the console can follow it)."""
        if seconds > 0 and self.pace > 0:
            time.sleep(seconds * self.pace)

    def hold(self) -> None:
        """Stay here (a hung rank's partner, or a rank idling) until the runner's watchdog
        ends every rank together at the deadline.  Returns only without a watchdog: a
        minute after the deadline (past the watchdog's wait for the others and its alarm),
        or after an hour when there is none."""
        end = self.deadline + 60.0 if self.deadline else time.time() + 3600.0
        while (left := end - time.time()) > 0:
            time.sleep(min(left, 1.0))


@dataclasses.dataclass(frozen=True)
class Scenario:
    """One demo workload.

    ``expected`` lists the findings (kind, culprits) ``commscope check`` reports for this
    scenario with ``default_ranks`` ranks (culprits None: not fixed); empty for the healthy
    ones.  ``expect(ranks)`` gives them for another rank count.  ``hangs``: the job blocks
    for good (until the demo's time limit) once the fault happened.
    """

    name: str
    title: str
    summary: str
    look_for: str
    worker: Callable[[int, int, DemoContext], Any]
    expected: Expected = ()
    default_ranks: int = 4
    min_ranks: int = 2
    hangs: bool = False
    expect_fn: Callable[[int], Expected] | None = dataclasses.field(default=None, repr=False, compare=False)

    def expect(self, ranks: int | None = None) -> Expected:
        """The expected findings with ``ranks`` ranks (default: ``default_ranks``)."""
        ranks = self.default_ranks if ranks is None else ranks
        if self.expect_fn is None:
            return self.expected
        return self.expect_fn(ranks)

    @property
    def faulty(self) -> bool:
        return bool(self.expected)
