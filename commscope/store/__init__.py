"""Trace stores: where ranks write events and where every consumer reads them.

A store is named by a URL-ish string: a filesystem path (the directory store) or
``redis://[:password@]host:port/db[?job=NAME&maxlen=N]``.  ``None`` means
``$COMMSCOPE_STORE``, then ``./commscope-trace``.  Which backend a name means, and what
callers need to know about it, is its row in ``store.registry`` (``backend_for``).
"""

from __future__ import annotations

import os

from commscope.store.base import (
    AsOf,
    Batch,
    EmptyReader,
    ReadStats,
    Size,
    StoreError,
    StoreWriter,
    TraceReader,
)
from commscope.store.registry import BACKENDS, Backend, backend_for, redact_store

DEFAULT_STORE = "./commscope-trace"
ENV_STORE = "COMMSCOPE_STORE"

__all__ = [
    "BACKENDS", "DEFAULT_STORE", "ENV_STORE", "AsOf", "Backend", "Batch", "EmptyReader", "ReadStats", "Size",
    "StoreError", "StoreWriter", "TraceReader", "backend_for", "default_store", "open_reader", "open_writer",
    "redact_store", "refuse_url_like",
]


def default_store(store: str | os.PathLike | None = None) -> str:
    if store is None or str(store) == "":
        store = os.environ.get(ENV_STORE) or DEFAULT_STORE
    return os.fspath(store)


def open_writer(store: str | os.PathLike | None, job: str, rank: int, job_meta: dict | None = None, *,
                incarnation: int = 0, resume: bool = False, connect_timeout: float | None = None,
                share: bool | None = None) -> StoreWriter:
    """A writer for one stream: the rank's (of its ``incarnation``).  ``resume``: append to a
    stream that exists (a forwarder sending a dead rank's last records); ``connect_timeout``:
    give up connecting sooner than the store's own timeout (Redis); ``share``: a directory
    store's new job is readable by the owner's group (None: ``$COMMSCOPE_SHARE_WITH_GROUP``;
    a Redis store's readers are whoever its ACLs let in)."""
    name = default_store(store)
    return backend_for(name).writer(name, job, rank, job_meta, incarnation=incarnation, resume=resume,
                                    connect_timeout=connect_timeout, share=share)


def open_reader(store: str | os.PathLike | None, *, wait: bool = False) -> TraceReader:
    """A reader for the newest job in a store.  ``wait`` lets it open before the job exists."""
    name = default_store(store)
    return backend_for(name).reader(name, wait=wait)


def refuse_url_like(store: str | os.PathLike | None) -> None:
    """Raise ``StoreError`` where a store to write names no backend's URL yet looks like a
    URL (``http://``, a mistyped ``redis:/``): writing would make a directory of that name here
    and say its path, credentials and all."""
    from commscope.store.directory import not_a_path

    name = default_store(store)
    if backend_for(name).local:
        why = not_a_path(name)
        if why is not None:
            raise StoreError(f"not a trace store: {why}")
