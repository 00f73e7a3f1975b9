"""Shared test setup: the tests directory is importable from every test package (tests/gpu too)."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
