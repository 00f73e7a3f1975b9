"""The store backends, one row each: everything the rest of commscope asks about a store.

A store is named by a string: a URL whose scheme one row claims (``redis://...``), else a
filesystem path (the directory store, the row without schemes).  Callers never test a
name's kind themselves: they ask its row (``backend_for(name)``) what they need to know,
so adding a backend is its module (a writer, a ``TraceReader`` subclass) plus one row in
``BACKENDS``, and nothing else changes.

A backend's module is imported when a store of its kind is first used (``_late``): a rank
recording to a directory never imports the Redis client.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import re
from collections.abc import Callable
from typing import Any, Protocol

from commscope.redact import redact as redact_text
from commscope.store import directory, redis_url
from commscope.store.base import StoreWriter, TraceReader


class WriterFactory(Protocol):
    """Opens the writer of one stream (``store.open_writer`` documents the arguments); a
    backend ignores what does not apply to it (a directory connects to nothing)."""

    def __call__(self, name: str, job: str, rank: int, job_meta: dict | None = None, *, incarnation: int = 0,
                 resume: bool = False, connect_timeout: float | None = None,
                 share: bool | None = None) -> StoreWriter: ...


class ReaderFactory(Protocol):
    """Opens a reader of the newest job in the store, or of the job its name pins
    (``wait``: before that job exists)."""

    def __call__(self, name: str, *, wait: bool = False) -> TraceReader: ...


def _same(name: str) -> str:
    return name


def _no_job(name: str) -> str | None:
    return None


def _late(module: str, attr: str) -> Callable[..., Any]:
    """``module.attr``, imported at the first call."""

    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(module), attr)(*args, **kwargs)

    call.__qualname__ = call.__name__ = f"{module}.{attr}"
    return call


@dataclasses.dataclass(frozen=True)
class Backend:
    """One store backend.  Every callable takes the store's name as given (after
    ``store.default_store``)."""

    name: str
    #: URL schemes it owns (lower case); () for the directory store: any name that is not
    #: a URL of another row's scheme.
    schemes: tuple[str, ...]
    writer: WriterFactory
    reader: ReaderFactory
    #: A path on this machine (commands may resolve it, create it, see whether it exists;
    #: it may also hold Flight Recorder dumps), rather than a server named by URL and taken
    #: as given.
    local: bool
    #: The name with the credentials it carries hidden (``***``): what a rank's spool keeps
    #: to be forwarded by (a name with ``***`` is never opened).  Display and ``meta.store``
    #: pass it through the text redaction as well (``store.redact_store``).
    redact: Callable[[str], str]
    #: The same store's identity, however spelt and without credentials: spools of a store
    #: are told apart by it (``spool.store_id``).
    identity: Callable[[str], str]
    #: Where job J of the store is, for people to read: ``(name, J) -> text``.
    job_location: Callable[[str, str], str]
    #: The name as every process of a job can use it, whatever its working directory.
    absolute: Callable[[str], str] = _same
    #: The name as a job's processes get it, and the environment that carries its
    #: credentials instead (out of every child's ``$COMMSCOPE_STORE``, and known to each
    #: child's redaction as a secret of its environment): ``name -> (name, env)``.
    credentials_apart: Callable[[str], tuple[str, dict[str, str]]] = lambda name: (name, {})
    #: The job the name itself pins (Redis ``?job=``), if any.
    pinned_job: Callable[[str], str | None] = _no_job
    #: The name that opens job J of the store exactly, whatever job is newest then:
    #: ``(name, J) -> name``.
    with_job: Callable[[str, str], str] = lambda name, job: name
    #: The name without the job it names, if any (Redis ``?job=``): its store.
    unpinned: Callable[[str], str] = _same
    #: The ids of the jobs it holds now, never raising (None from it: it could not be asked,
    #: a server down); None: not looked at.  ``commscope run`` says "nothing was recorded"
    #: only where it looked before and after; ``check`` finds a job's earlier attempts here.
    jobs: Callable[[str], set[str] | None] | None = None
    #: The ``commscope run`` launch that made job J, as the store says (``$COMMSCOPE_LAUNCH``):
    #: ``(name, J) -> launch``, None where not said; None: not asked.  ``commscope run``
    #: names its own of the jobs new to the store, not a concurrent launch's.
    launch_of: Callable[[str, str], str | None] | None = None
    #: Remove one job (a benchmark replacing its own job of that name); None: only a fresh
    #: store will do.
    delete_job: Callable[[str, str], Any] | None = None
    #: Why the ranks could never write to the store, asked before a job runs, never raising:
    #: ``name -> why`` (None where they may: a server down or full now is theirs to retry, a
    #: job id another node of the job names too).  None: not asked.
    refusal: Callable[[str], str | None] | None = None


DIRECTORY = Backend(
    name="directory", schemes=(), writer=directory.DirectoryWriter, reader=directory.DirectoryReader, local=True,
    redact=_same,  # a path carries no credential
    identity=os.path.realpath, job_location=directory.job_location, absolute=directory.absolute,
    with_job=directory.with_job, jobs=directory.jobs, launch_of=directory.launch_of)

REDIS = Backend(
    name="redis", schemes=redis_url.SCHEMES,
    writer=_late("commscope.store.redis_store", "RedisWriter"),
    reader=_late("commscope.store.redis_store", "RedisReader"),
    local=False, redact=redis_url.redact_url,  # user info, ?password=: the URL whole (a space in a password)
    identity=redis_url.identity, job_location=redis_url.job_location, pinned_job=redis_url.pinned_job,
    with_job=redis_url.with_job, unpinned=redis_url.unpinned, credentials_apart=redis_url.password_apart,
    jobs=_late("commscope.store.redis_store", "jobs"), delete_job=_late("commscope.store.redis_store", "delete_job"),
    refusal=_late("commscope.store.redis_store", "refusal"))

BACKENDS: tuple[Backend, ...] = (DIRECTORY, REDIS)

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
_BY_SCHEME = {scheme: row for row in BACKENDS for scheme in row.schemes}
_PATHS = next(row for row in BACKENDS if not row.schemes)


def backend_for(name: str | os.PathLike) -> Backend:
    """The row of the store ``name`` names: the one claiming its URL scheme, else the
    directory store."""
    m = _SCHEME.match(os.fspath(name))
    if m is None:
        return _PATHS
    return _BY_SCHEME.get(m.group(1).lower(), _PATHS)


def redact_store(name: str | os.PathLike) -> str:
    """A store's name fit to show or record (``meta.store``): its backend's redaction, then
    the text redaction every trace string passes (``commscope.redact``)."""
    text = os.fspath(name)
    return redact_text(backend_for(text).redact(text))
