"""Analysis: TraceModel, cross-rank matching, diagnose(), bandwidth, Flight Recorder import, export.

Imports only the torch-free modules below it (``commscope.events``, ``schema``, ``dtypes``,
``flightfmt``, ``errors``, ``store``), numpy and Rich (``evidence`` draws findings): never ``commands``,
``cli`` or ``tui``.  See docs/analysis.md.
"""

from __future__ import annotations

from commscope.analysis.diagnose import diagnose, trace_now
from commscope.analysis.findings import KINDS, Finding
from commscope.analysis.model import RankState, TraceModel
from commscope.analysis.source import load_trace, open_source

__all__ = ["KINDS", "Finding", "RankState", "TraceModel", "diagnose", "load_trace", "open_source", "trace_now"]
