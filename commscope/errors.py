"""Errors every layer may raise and only the command line turns into an exit code."""

from __future__ import annotations

import os
import select
import sys


class UsageError(Exception):
    """Bad input or usage: exit code 2 with a one-line message (``commscope.cli`` prints it)."""


#: The exit status when commscope itself failed (an exception it did not expect: a bug, its
#: traceback printed): not ``check``'s 1, which says the trace holds errors
INTERNAL = 3

#: The exit status when the reader of the output went away (``commscope export --chrome - |
#: head``): a shell's for a command a closed pipe stopped (128 + SIGPIPE), none of ``check``'s
CLOSED_PIPE = 141


def stdout_closed() -> bool:
    """Whether standard output is a pipe whose reader went away (the pipe says so: an error
    event on its end), not another pipe or socket a command broke."""
    try:
        fd = sys.stdout.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        return any(ev & select.POLLERR for _, ev in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # (no standard output to ask)
        return False


def closed_pipe() -> int:
    """After a write to a closed pipe: standard output pointed at /dev/null (Python flushes it
    at exit, which would fail again and print a traceback), and ``CLOSED_PIPE`` to exit with."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)
    return CLOSED_PIPE
