"""Files of a directory store, made and read safely: modes exact whatever the umask, an
atomic replace, and a read that never blocks on a FIFO in a file's place nor reads more than
its caller allows.  One place for it: segments, carries and summaries all go through here."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
import weakref
from collections.abc import Mapping
from pathlib import Path

try:
    import resource
except ImportError:  # (not on Windows: files are then opened for each read)
    resource = None  # type: ignore[assignment]

O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


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


def read_from(path: Path | str, offset: int, limit: int) -> bytes:
    """Up to ``limit`` bytes of a regular file from ``offset`` on (b"" past its end), never
    blocking on a FIFO or device in its place.  Only what the file holds is asked for
    (``os.pread`` allocates all it is asked for first: 64 MiB for a poll of a few bytes)."""
    return read_sized(path, offset, limit)[0]


def read_sized(path: Path | str, offset: int, limit: int) -> tuple[bytes, int]:
    """``read_from`` and the file's size, from the one fstat of its read."""
    fd, st = _open_regular(path)
    try:
        return _pread(fd, offset, min(limit, st.st_size - offset)), st.st_size
    finally:
        os.close(fd)


def _open_regular(path: Path | str, flags: int = 0) -> tuple[int, os.stat_result]:
    """``path`` opened to read, never blocking (a FIFO in its place), and its stat; OSError
    where it is not a regular file (the descriptor then closed)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_open(fd: int, n: int) -> bytes:
    """The first ``n`` bytes of an open file (one deleted since: what it held is still there
    while it is open)."""
    return _pread(fd, 0, n)


def _pread(fd: int, offset: int, n: int) -> bytes:
    if n <= 0:
        return b""
    data = os.pread(fd, n, offset)
    while 0 < len(data) < n:  # (one pread reads at most 2 GiB)
        more = os.pread(fd, n - len(data), offset + len(data))
        if not more:
            break
        data += more
    return data


class OpenFiles:
    """Regular files kept open between reads, for a reader that reads the same thousands of
    files again and again: a live console polls every stream of a 16k-rank job a few times a
    second, and a stat, an open, an fstat and a close per stream were a quarter of its time
    (``size`` and ``read`` of a file held: an lseek to its end and a pread; every read of a
    held file is a pread, so where its offset lies does not matter).

    At most ``capacity`` are held (``reserve``); a file past it is read as ``read_from``
    reads it, and a full set is never churned (a round over more files than it holds would
    open each anyway).  A symlink is never held (its target may change where no listing of
    its directory sees it).  A file is held under its path with its inode: its reader, listing
    the directory again, lets go of each one whose name now names another file or none
    (``let_go``), of one it has read to its end and moved past (``forget``), and of all where
    the directory is gone (``drop_all``): a deleted file's space is never held by its reader."""

    def __init__(self) -> None:
        self._held: dict[str, tuple[int, int]] = {}  # path -> (fd, inode)
        self._room = [0]  # (a box: the finalizer gives it back to the ledger)
        self._closer = weakref.finalize(self, _close_all, self._held, self._room)

    @property
    def capacity(self) -> int:
        return self._room[0]

    def reserve(self, n: int) -> None:
        """Room to hold ``n`` files, as far as the process allows (``room_for``) counting
        what every other ``OpenFiles`` of the process holds room for: two readers (a console
        starting again at the tail reads a new one while the old holds its files) never count
        on the same descriptors."""
        global _promised
        with _ledger:
            others = _promised - self._room[0]
            self._room[0] = max(0, min(n, room_for(others + n) - others))
            _promised = others + self._room[0]

    def __len__(self) -> int:
        return len(self._held)

    def size(self, path: str) -> int:
        """The size of the regular file at ``path``, which is held from now on where there is
        room (one that is not regular, or a symlink, is never held: its size as ``os.stat``
        says it)."""
        got = self._held.get(path)
        if got is None and len(self._held) < self._room[0]:
            got = self._open(path)
        if got is None:
            return os.stat(path).st_size
        return os.lseek(got[0], 0, os.SEEK_END)  # (half an fstat's cost: no stat result made)

    def read(self, path: str, offset: int, limit: int, sized: bool = False) -> bytes:
        """``read_from(path, offset, limit)``, through the file held for ``path`` if any.
        ``sized``: the file holds ``limit`` bytes past ``offset`` at least, as its ``size``
        just said (nothing asked again: a file cut short meanwhile gives less)."""
        got = self._held.get(path)
        if got is not None and sized:
            return _pread(got[0], offset, limit)
        return self.read_sized(path, offset, limit)[0]

    def read_sized(self, path: str, offset: int, limit: int) -> tuple[bytes, int]:
        """``read(path, offset, limit)`` and the file's size, asked once with its read (a
        whole read of a stream asked its size first: a stat more a segment)."""
        got = self._held.get(path)
        if got is None:
            return read_sized(path, offset, limit)
        size = os.lseek(got[0], 0, os.SEEK_END)
        return _pread(got[0], offset, min(limit, size - offset)), size

    def holds(self, path: str) -> bool:
        return path in self._held

    def hold(self, path: str) -> None:
        """Hold ``path`` from now on where there is room (a reader part of the way through a
        file: if it is deleted before it is read to its end, ``stale`` says so while the rest
        can still be read through what is held)."""
        if path not in self._held and len(self._held) < self._room[0]:
            self._open(path)

    def stale(self, listing: Mapping[str, int]) -> list[str]:
        """The files held whose name (in the directory they all lie in) ``listing`` (name ->
        inode, as the directory's entries say) does not name, or names with another inode:
        deleted, or written again under their name.  Still held: ``let_go`` them."""
        return [path for path, (_fd, ino) in self._held.items() if listing.get(os.path.basename(path)) != ino]

    def _open(self, path: str) -> tuple[int, int] | None:
        try:
            fd, st = _open_regular(path, O_NOFOLLOW)
        except OSError:
            return None
        got = self._held[path] = (fd, st.st_ino)
        return got

    def let_go(self, listing: Mapping[str, int]) -> None:
        """Let go of every file held that ``listing`` no longer names as it is held (``stale``)."""
        for path in self.stale(listing):
            self.forget(path)

    def forget(self, path: str) -> None:
        got = self._held.pop(path, None)
        if got is not None:
            os.close(got[0])

    def drop_all(self) -> None:
        """Close every file held (their room stays reserved)."""
        _close_held(self._held)

    def close(self) -> None:
        """Close every file held and give their room back."""
        _close_all(self._held, self._room)


def _close_held(held: dict[str, tuple[int, int]]) -> None:
    for fd, _ in held.values():
        with contextlib.suppress(OSError):
            os.close(fd)
    held.clear()


def _close_all(held: dict[str, tuple[int, int]], room: list[int]) -> None:
    global _promised
    _close_held(held)
    with _ledger:
        _promised -= room[0]
        room[0] = 0


#: File descriptors a reader leaves to the rest of its process (sockets, pipes, the terminal)
FD_RESERVE = 1024
#: The room every ``OpenFiles`` of the process reserved, together (``OpenFiles.reserve``)
_promised = 0
_ledger = threading.Lock()


def room_for(n: int) -> int:
    """How many of ``n`` files the process may hold open (``OpenFiles``): its soft limit on
    open files, raised toward its hard limit as far as ``n`` needs, less ``FD_RESERVE``.
    Raising the soft limit is what a process may always do; a console of a 16k-rank job
    holds 16k files (most systems' soft limit is 1,024)."""
    if resource is None:
        return 0
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return 0
    infinity = resource.RLIM_INFINITY
    want = n + FD_RESERVE
    if soft != infinity and soft < want:
        new = want if hard == infinity else min(hard, want)
        with contextlib.suppress(OSError, ValueError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
            soft = new
    return n if soft == infinity else max(0, min(n, soft - FD_RESERVE))


def size_of(path: Path) -> int:
    """The size of ``path``, 0 when it is gone or cannot be stat'ed."""
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
