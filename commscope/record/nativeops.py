"""The native op source: every c10d collective observed in C++, named and placed by thin wrappers.

``commscope_native.cpp`` does the per-op work (see its header).  This module installs it
(``install_native``), and on the recorder thread moves what it recorded into the
trace: one ``block`` event per tick holding the packed records as they are (decoded by
the readers, ``commscope.blocks``), with the groups, call sites and signatures they refer
to restated at its head, so every block decodes on its own.  The records sit in the
rank's spool (``store/spool.py``) until the store has them.  The thread never touches an
op one by one.
"""

from __future__ import annotations

import contextlib
import functools
from types import ModuleType
from typing import Any

import torch.distributed as dist

from commscope import blocks, optable
from commscope.events import SCHEMA_VERSION
from commscope.events import encode as _dumps
from commscope.record import callsite, ops, patch
from commscope.record.ops import fmt_exc

#: Names of the wrapped functions, by the id the native records carry.
NAMES: tuple[str, ...] = (*ops.TORCH_OPS, "batch_isend_irecv", *ops.VARLEN_OPS)
NAME_ID = {n: i for i, n in enumerate(NAMES)}


class NativeOps:
    """Op capture by the native recorder."""

    name = "native"
    spools = True  # its records live in a spool (see attach_spool)

    def __init__(self, rec: Any, module: ModuleType):
        self.rec = rec
        self.m = module
        self._dropped = 0
        self._inflight = 0
        self.gpu_index: int | None = None
        self.cuda = None
        self.registered: list[str] = []

    # ------------------------------------------------------------------ install
    def install(self) -> None:
        specs = [(c.operator, c.direction, c.describe) for c in optable.C10D]  # the C++ takes traits, not names
        self.registered = self.m.install(specs, callsite.is_internal, dist.Work, callsite.code_site)
        install_native(self)

    def uninstall(self) -> None:
        patch.uninstall()
        self.m.uninstall()

    def request_settle(self) -> None:
        """Settle the job id on the training thread right after its next completed op."""
        self.m.set_after_op(self.rec.settle_job)

    # ------------------------------------------------------------------ the thread's side
    def collect(self, now: int, final: bool, emit, out, rank: int | None, drain: bool = True) -> None:
        """Groups' members to the tables, then (unless the store is failing: ``drain`` False)
        the records up to where they stood when the groups were taken as one block, handed to
        ``out(line, end)``: a block never restates a group without its members (a group first
        used meanwhile goes in the next block).  The last tick takes what came meanwhile too."""
        if rank is None:
            return  # records wait in the native buffer until the rank is known
        m = self.m
        m.poll_devices()
        for _ in range(2 if final else 1):
            for _gid, name in m.take_groups():  # before the block that uses them (and where it ends)
                self._note_group(name)
            if not drain:
                return
            line, _count, dropped, end, texts = m.drain_block(rank, now, SCHEMA_VERSION)  # encoded without the GIL
            self._dropped += dropped
            if line is not None:
                if texts:  # an op failed: its error message may quote a credential (rare: decoded only then)
                    line = blocks.mask_line(line)
                out(line, end)

    def _note_group(self, name: str) -> None:
        """Tell the tables a group's global ranks and backend (blocks restate them)."""
        try:
            for pg, pg_name in list(patch.c10d._world.pg_names.items()):
                if str(pg_name) == name:
                    backend = str(dist.get_backend(pg))
                    self.m.note_group(name, backend, list(dist.get_process_group_ranks(pg)))
                    if "nccl" in backend:  # CUDA event timing inside NCCL: GPU durations
                        try:
                            pg._enable_collectives_timing()
                        except Exception:
                            pass
                    return
        except Exception:
            pass  # destroyed already: members are inferred from the trace

    # ------------------------------------------------------------------ the spool
    def attach_spool(self, sp: Any) -> None:
        self.m.attach_spool(sp.fd)
        # The world's members in the tables now, not at the first tick after its first op: a
        # rank stopped before that tick (mp.spawn's SIGTERM on a loaded host) left a spool whose
        # block restated the world without members, and its op's failure on a rank that died
        # right after init was blamed on nobody (helper-121: op_failed [] beside the crash)
        pg = patch.default_group()
        if pg is not None:
            with contextlib.suppress(Exception):
                self._note_group(str(pg.group_name))

    def detach_spool(self) -> None:
        self.m.detach_spool()

    def forwarded(self, end: int) -> None:
        self.m.forwarded(end)

    def keep_event(self, line: bytes) -> None:
        self.m.keep_event(line)

    def note_meta(self, line: bytes) -> None:
        self.m.note_meta(line)

    def arm_death(self) -> None:
        self.m.arm_death()

    def disarm_death(self) -> None:
        self.m.disarm_death()

    def term_watched(self) -> bool:
        return bool(self.m.term_watched())

    def note_exit(self, code: int) -> None:
        self.m.note_exit(code)

    def new_incarnation(self, number: int, suffix: str) -> None:
        self.m.new_incarnation(number, suffix)

    def drained(self) -> int:
        return int(self.m.stats()["drained"])

    def dropped(self) -> int:
        return self._dropped

    def stuck(self, now: int, limit: int) -> tuple[list[tuple[int, int]], int | None]:
        """(op id, thread id) of ops newly in flight past ``limit`` ns (an op whose outer op is
        in flight too leaves the stack to it), and the begin of the oldest op past it."""
        hits, self._inflight, oldest = self.m.stuck(now, limit)
        return [(op_id, tid) for op_id, tid, _parent, _waiting in hits], (oldest if oldest >= 0 else None)

    def failed_ns(self) -> int | None:
        """When an op of this rank last raised, or None."""
        return self.m.last_failure() or None

    def inflight(self) -> int:
        return self._inflight

    def unwaited(self) -> tuple[list[int], int]:
        """(op ids of async work never waited on: the first ones, how many in all)."""
        return self.m.unwaited()

    def untrack(self, work: Any) -> None:
        """``Work.get_future()``: completion is taken through the future."""
        self.m.untrack(work)

    def meta(self) -> dict:
        return {"recorder": "native", "names": list(NAMES), "dtypes": self.m.scalar_type_names()}

    def on_destroy(self, whole_job: bool) -> None:
        if whole_job:
            self.m.reset_seqs()

    def after_fork(self) -> None:
        self.m.set_active(False)  # the extension's own fork handler does the rest

    def poll_fr_soon(self) -> None:
        pass

    # ------------------------------------------------------------------ logical ops described in Python
    def describe(self, name: str, a: tuple) -> tuple[bytes, str, int, int] | None:
        """(JSON fragment, group name, peer as a group rank, direction code) of a varlen or
        batch op from its extractor tuple (``ops.OpArgs``); None when torch will decide."""
        pg, peer, direction, root, redop, async_op, ins, outs = a
        if pg is None:
            pg = patch.default_group()
            if pg is None:
                return None
        try:
            gname = str(pg.group_name)
            granks = dist.get_process_group_ranks(pg)
        except Exception:
            return None
        if isinstance(peer, tuple):
            peer = granks[peer[1]] if 0 <= peer[1] < len(granks) else None
        if isinstance(root, tuple):
            root = granks[root[1]] if 0 <= root[1] < len(granks) else None
        idesc = ib = odesc = ob = None
        try:
            if ins:
                idesc = tuple((t.shape, t.dtype) for t in ins)
                ib = sum(t.nbytes for t in ins)
            if outs:
                odesc = tuple((t.shape, t.dtype) for t in outs)
                ob = sum(t.nbytes for t in outs)
        except Exception:  # (not tensors: a receiver's placeholder the op ignores, or input it refuses:
            idesc = ib = odesc = ob = None  # recorded unsized, as pyhot does; it ran unrecorded, helper-178)
        fields = ops.begin_fields(name, gname, peer, direction, root, redop,
                                  idesc if idesc and len(idesc) > 1 else (idesc[0] if idesc else None), ib,
                                  odesc if odesc and len(odesc) > 1 else (odesc[0] if odesc else None), ob,
                                  bool(async_op), None, False, None)
        group_peer = granks.index(peer) if peer is not None and peer in granks else -1
        code = {"send": optable.DIR_SEND, "recv": optable.DIR_RECV}.get(direction or "", optable.DIR_NONE)
        return _dumps(fields)[1:-1], gname, group_peer, code


# --------------------------------------------------------------------------- the wrappers
#: torch's own entry points to collectives (functional collectives, DTensor's helpers, the
#: c10d functions torch calls internally), by module.  Wrapped to lend the collectives
#: they issue the caller's call site; inside another recorded call they are its traffic.
#: ``isend``/``irecv`` of distributed_c10d stay: ``batch_isend_irecv`` compares them by identity.
ANNOTATE: dict[str, tuple[str, ...]] = {
    "torch.distributed.distributed_c10d": tuple(n for n in ops.TORCH_OPS if n not in ("isend", "irecv")),
    "torch.distributed._functional_collectives": (
        "broadcast", "all_reduce", "all_gather_tensor", "all_gather_tensor_autograd", "reduce_scatter_tensor",
        "reduce_scatter_tensor_autograd", "all_reduce_coalesced", "all_gather_into_tensor_coalesced",
        "reduce_scatter_tensor_coalesced", "all_to_all_single", "all_to_all_single_autograd", "permute_tensor",
        "all_gather_single", "reduce_scatter_single", "all_gather_single_coalesced",
        "reduce_scatter_single_coalesced"),
    "torch.distributed._functional_collectives_impl": (
        "_broadcast", "_all_reduce", "_all_reduce_coalesced", "_all_gather_into_tensor",
        "_all_gather_into_tensor_coalesced", "_reduce_scatter_tensor", "_reduce_scatter_tensor_coalesced",
        "_all_to_all_single", "_isend", "_irecv", "_batch_p2p_ops"),
    "torch.distributed.tensor._collective_utils": ("broadcast", "scatter", "mesh_scatter", "mesh_broadcast",
                                                   "shard_dim_alltoall"),
}


def install_native(source: NativeOps) -> None:
    """Thin C wrappers over torch.distributed and functional collectives; Python wrappers for
    the ops whose meaning Python describes (varlen ops, batch_isend_irecv)."""
    m = source.m
    varlen = patch.install_common()
    for name in ops.TORCH_OPS:
        orig = getattr(dist, name, None)
        if orig is None:
            continue
        patch.replace(dist, name, _native_wrapper(m, patch.unwrap(orig), NAME_ID[name], m.KIND_PLAIN,
                                                  name in ("isend", "irecv")))
    patch.replace(dist, "batch_isend_irecv", _native_batch_wrapper(source, patch.unwrap(dist.batch_isend_irecv)))
    patch.ensure_wait_patched(dist.Work, m.WaitWrapper)
    for module, names in ANNOTATE.items():
        patch.when_imported(module, lambda mod, names=names: _annotate(m, mod, names))
    if varlen is not None:
        for name, extract in ops.VARLEN_OPS.items():
            orig = getattr(varlen, name, None)
            if orig is not None:
                patch.replace(varlen, name, _native_rich_wrapper(source, name, patch.unwrap(orig), extract))
    patch.activate(source)


def _annotate(m: ModuleType, module: ModuleType, names: tuple[str, ...]) -> None:
    if patch.ACTIVE is None and not patch.installed():
        return  # uninstalled meanwhile
    for name in names:
        orig = vars(module).get(name)
        if callable(orig) and not isinstance(orig, type):
            patch.replace(module, name, _native_wrapper(m, patch.unwrap(orig), -1, m.KIND_ANNOTATE, False))


def _native_wrapper(m: ModuleType, orig: Any, name_id: int, kind: int, async_hint: bool) -> Any:
    w = m.Wrapper(orig, name_id, kind, async_hint)
    functools.update_wrapper(w, orig)
    return w


def _native_rich_wrapper(source: NativeOps, name: str, orig: Any, extract: Any) -> Any:
    """A varlen op: described in Python (its own tensors), its collectives nested."""
    m = source.m
    name_id = NAME_ID[name]
    rich = m.KIND_RICH

    @functools.wraps(orig)
    def wrapper(*args, **kwargs):
        if patch.ACTIVE is None:
            return orig(*args, **kwargs)
        try:
            a = extract(*args, **kwargs)
            described = source.describe(name, a)
        except Exception:
            described = None  # arguments the op will reject itself
        if described is None:
            return orig(*args, **kwargs)
        frag, gname, peer, direction = described
        op_id = m.enter(rich, name_id, frag, gname, peer, direction, bool(a[5]))
        try:
            ret = orig(*args, **kwargs)
        except BaseException as exc:
            _exit_raised(m, op_id, exc)
            raise
        m.exit(op_id, None)
        if a[5] and ret is not None and hasattr(ret, "wait"):
            try:
                m.track(ret, (op_id,))
                patch.ensure_wait_patched(type(ret), m.WaitWrapper)
            except Exception:
                pass
        return ret

    return patch.wrapped(wrapper, orig)


def _exit_raised(m: ModuleType, op_id: int, exc: BaseException) -> None:
    """Record that a call raised; whatever happens here, the caller re-raises ``exc``."""
    try:
        m.exit(op_id, fmt_exc(exc))
    except Exception:
        pass


def _native_batch_wrapper(source: NativeOps, orig: Any) -> Any:
    m = source.m
    name_id = NAME_ID["batch_isend_irecv"]

    @functools.wraps(orig)
    def batch_isend_irecv(p2p_op_list):
        if patch.ACTIVE is None:
            return orig(p2p_op_list)
        try:
            items = list(p2p_op_list)
            described = source.describe("batch_isend_irecv", (items[0].group, None, None, None, None, False, (), ()))
        except Exception:
            described = None
        if described is None:
            return orig(p2p_op_list)
        frag, gname, _, _ = described
        cid = m.enter(m.KIND_CONTAINER, name_id, frag, gname, -1, 0)
        try:
            works = orig(p2p_op_list)
        except BaseException as exc:
            _exit_raised(m, cid, exc)
            raise
        children = m.exit(cid, None)
        try:
            if works and children:
                if len(works) == len(children):
                    for w, child in zip(works, children, strict=True):
                        m.track(w, (child,))
                else:  # coalesced: one Work completes the whole batch
                    for w in works:
                        m.track(w, children)
        except Exception:
            pass
        return works

    return patch.wrapped(batch_isend_irecv, orig)
