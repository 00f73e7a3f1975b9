"""Errors every layer may raise and only the command line turns into an exit code."""

from __future__ import annotations


class UsageError(Exception):
    """Bad input or usage: exit code 2 with a one-line message (``commscope.cli`` prints it)."""
