"""Caches of code that every process of a job loads (the native recorder, the compiled
kernels): whoever can change such a file runs code as every rank that loads it.  So they
are made their owner's alone whatever the umask (directories 0700, files 0600, a module
0700), and one that another user could have changed is never loaded: a directory or file
that is not ours (or root's), or that the group or others may write.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


def make_dirs(path: Path, mode: int = 0o700) -> None:
    """``path`` and its missing parents, each created with exactly ``mode`` whatever the
    umask (a 022 umask would open a store to every local user; 0 to writing too).  What
    exists is left as it is (``why_unsafe`` judges a cache; a store's creator set its mode)."""
    missing = []
    p = Path(path)
    while not os.path.lexists(p):
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    for d in reversed(missing):
        try:
            os.mkdir(d, mode)
        except FileExistsError:
            continue  # (another process made it)
        os.chmod(d, mode)


def owner_name(uid: int) -> str:
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (KeyError, ImportError):
        return f"uid {uid}"


def why_unsafe(*paths: Path) -> str | None:
    """Why one of ``paths`` (what a process would load, and the directories it lies in) is not
    to be trusted, or None: it belongs to another user than us or root, or the group or
    others may write it (a sticky directory, as /tmp, excepted).  A path that does not exist is no reason (there is nothing to load)."""
    me = os.getuid()
    for path in paths:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            continue
        except OSError as exc:
            return f"{path} cannot be checked: {exc.strerror or exc}"
        if st.st_uid not in (me, 0):
            return f"{path} belongs to {owner_name(st.st_uid)}, not to you ({owner_name(me)})"
        if stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX:
            continue  # (/tmp: what others make in it, they cannot put in place of ours)
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            who = "the group and others" if st.st_mode & stat.S_IWGRP and st.st_mode & stat.S_IWOTH else \
                "the group" if st.st_mode & stat.S_IWGRP else "others"
            return f"{path} is writable by {who} (mode {stat.S_IMODE(st.st_mode):04o})"
    return None
