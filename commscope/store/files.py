"""Files of a directory store, made and read safely: modes exact whatever the umask, an
atomic replace, and a read that never blocks on a FIFO in a file's place nor reads more than
its caller allows.  One place for it: segments, carries and summaries all go through here."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def make_dirs(path: Path, mode: int) -> None:
    """``path`` and its missing parents, each created with exactly ``mode`` whatever the
    umask (a 022 umask would open a store to every local user; 0 to writing too)."""
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    for d in reversed(missing):
        try:
            os.mkdir(d, mode)
        except FileExistsError:
            continue  # another rank made it: its creator set the mode
        os.chmod(d, mode)


def create_file(path: Path, flags: int, mode: int) -> int:
    """Open ``path`` (``flags``), creating it with exactly ``mode`` if it does not exist."""
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError:
        return os.open(path, flags)
    try:
        os.fchmod(fd, mode)
    except OSError:
        os.close(fd)
        raise
    return fd


def atomic_write(path: Path, data: bytes, mode: int) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)  # one a killed writer left
    fd = create_file(tmp, os.O_WRONLY | O_NOFOLLOW, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def read_regular(path: Path, limit: int) -> bytes:
    """Up to ``limit`` bytes of a regular file (OSError when it holds more), never blocking on
    a FIFO or device in its place."""
    data = read_from(path, 0, limit + 1)
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"larger than {limit} bytes")
    return data


def mode_of(path: Path) -> int:
    """The permission bits of ``path`` (what a file made beside it gets), 0600 when unknown."""
    try:
        return os.stat(path).st_mode & 0o777
    except OSError:
        return 0o600


def read_from(path: Path, offset: int, limit: int) -> bytes:
    """Up to ``limit`` bytes of a regular file from ``offset`` on (b"" past its end), never
    blocking on a FIFO or device in its place.  Only what the file holds is asked for
    (``os.pread`` allocates all it is asked for first: 64 MiB for a poll of a few bytes)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        n = min(limit, st.st_size - offset)
        if n <= 0:
            return b""
        data = os.pread(fd, n, offset)
        while 0 < len(data) < n:  # (one pread reads at most 2 GiB)
            more = os.pread(fd, n - len(data), offset + len(data))
            if not more:
                break
            data += more
        return data
    finally:
        os.close(fd)


def size_of(path: Path) -> int:
    """The size of ``path``, 0 when it is gone or cannot be stat'ed."""
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
