"""What the recorder asks of an op source: the native one (``nativeops.NativeOps``) or the
pure-Python fallback (``pyhot.PythonOps``).

An op source owns its wrappers (it installs them through ``patch``) and the records its
hot path makes; the recorder thread drives it through exactly these members, never
probing for others.  Torch-free, so the recorder's typing costs no import.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol


class RecorderHooks(Protocol):
    """What the wrappers every source shares (``patch``) tell the recorder."""

    def mark_exit(self, reason: str, code: int | None = None) -> None: ...

    def flush(self, timeout: float = 1.0) -> bool: ...

    def on_destroyed(self) -> None: ...

    def on_group_created(self) -> None: ...

    def start(self) -> None: ...


class OpSource(Protocol):
    #: the recorder it reports to
    rec: RecorderHooks
    #: "native" or "python", as ``meta.recorder`` says
    name: str
    #: its records live in the rank's spool (``store/spool.py``) until the store has them
    spools: bool
    #: the CUDA device its ops run on, once known (the recorder samples that GPU)
    gpu_index: int | None

    # -- installing (the training thread, at ``instrument`` / ``uninstrument``)
    def install(self) -> None: ...

    def uninstall(self) -> None: ...

    def request_settle(self) -> None:
        """The job id is still unknown: settle it on the training thread after the next op."""

    def new_incarnation(self, number: int, suffix: str) -> None:
        """The process group was created again: group names get ``suffix`` from now on."""

    def after_fork(self) -> None: ...

    # -- the recorder thread, every tick
    def collect(self, now: int, final: bool, emit: Callable[[dict], None], out: Callable[[bytes, int], None],
                rank: int | None, drain: bool = True) -> None:
        """Move what the hot path recorded into the trace: events to ``emit``, encoded
        lines to ``out(line, end)`` (``end``: the spool position they cover)."""

    def stuck(self, now: int, limit: int) -> tuple[list[tuple[int, int]], int | None]:
        """(op id, thread id) of ops newly in flight past ``limit`` ns, and the begin of the
        oldest op past it."""

    def failed_ns(self) -> int | None:
        """When an op last raised, if one did since the last tick."""

    def inflight(self) -> int: ...

    def unwaited(self) -> tuple[list[int], int]:
        """(op ids of async work never waited on: the first ones, how many in all)."""

    def dropped(self) -> int:
        """Hot-path records lost so far (a full queue or ring)."""

    def drained(self) -> int:
        """The ring position the next block starts at (records before it are drained)."""

    def meta(self) -> dict[str, Any]:
        """What the rank's ``meta`` event says about this source."""

    def note_meta(self, line: bytes) -> None: ...

    def poll_fr_soon(self) -> None:
        """Read Flight Recorder at the next tick (a stack request came)."""

    # -- the spool and the store
    def attach_spool(self, sp: Any) -> None: ...

    def detach_spool(self) -> None: ...

    def forwarded(self, end: int) -> None:
        """The store has everything up to spool position ``end``."""

    def keep_event(self, line: bytes) -> None:
        """Keep an encoded event in the spool (it reaches the store even if the rank dies)."""

    # -- dying
    def arm_death(self) -> None: ...

    def disarm_death(self) -> None: ...

    def term_watched(self) -> bool:
        """Whether a SIGTERM would be noted in the spool as it comes (the death handler is
        still installed and the program does not ignore the signal)."""

    def note_exit(self, code: int) -> None: ...

    # -- the shared wrappers (``patch``)
    def untrack(self, work: Any) -> None:
        """``Work.get_future()`` was called: completion is taken through the future."""

    def on_destroy(self, whole_job: bool) -> None:
        """``destroy_process_group`` returned (``whole_job``: the default group's)."""
