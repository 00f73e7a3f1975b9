"""open_source(): the one way the CLI and the TUI open anything that holds a trace."""

from __future__ import annotations

import os
from typing import Any

from commscope.analysis.flight_import import FlightRecorderReader, looks_like_fr_dir
from commscope.analysis.model import TraceModel
from commscope.store import StoreError, TraceReader, default_store, is_redis, open_reader


def open_source(path_or_url: str | os.PathLike | None, *, wait: bool = False) -> TraceReader:
    """A reader for a trace store or a directory of PyTorch Flight Recorder dumps.
    Raises StoreError when it is neither."""
    name = default_store(path_or_url)
    if is_redis(name):
        return open_reader(name, wait=wait)
    try:
        return open_reader(name, wait=False)
    except StoreError:
        if os.path.isdir(name) and looks_like_fr_dir(name):
            return FlightRecorderReader(name)
        if wait:
            return open_reader(name, wait=True)
        raise


def load_model(path_or_url: str | os.PathLike | None) -> tuple[TraceModel, Any]:
    """Read a whole source into a model; returns (model, reader) so callers can show stats."""
    reader = open_source(path_or_url)
    try:
        events = reader.read_all()
    finally:
        reader.close()
    return TraceModel.from_events(events), reader
