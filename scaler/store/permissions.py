"""Who may read a SQLite store's files: their owner alone.

A store holds every run, every control request and every identity's name; on a host shared
with other users (a cluster's login node) a file they can read gives all of it away, whatever
the service asks of them (``--private-read``). A new store's file is made mode 0600 before
SQLite opens it, and SQLite makes its ``-wal`` and ``-shm`` files with the database file's
mode, whatever the process's umask. An existing store is left as it is: ``serve`` says in one
line when others can read it (:func:`exposure`). Any thread, any process.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import stat
from pathlib import Path

__all__ = ["FILE_MODE", "create_private", "exposure", "readable_by_others"]

FILE_MODE = 0o600
# SQLite's files beside the database: the write-ahead log and its shared-memory index.
SIDE_FILES = ("-wal", "-shm")


def create_private(path: str) -> None:
    """Create the empty file ``path`` with mode 0600 (not the umask's), unless it exists.

    SQLite then takes it for a new database, as it would a missing file.
    """
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, FILE_MODE)
    except (FileExistsError, FileNotFoundError):
        return  # made by another process, or no folder: SQLite's own error says so
    try:
        os.fchmod(fd, FILE_MODE)  # a umask may take bits away, as 0277 would the owner's write
    finally:
        os.close(fd)


def readable_by_others(path: str) -> list[Path]:
    """The files of the store ``path`` (the database, its ``-wal`` and ``-shm``) that users
    other than their owner may read; those that do not exist are left out.

    >>> import tempfile
    >>> folder = tempfile.TemporaryDirectory()
    >>> db = Path(folder.name, "sw.db")
    >>> create_private(str(db))
    >>> readable_by_others(str(db))
    []
    >>> db.chmod(0o644)
    >>> [file.name for file in readable_by_others(str(db))]
    ['sw.db']
    >>> folder.cleanup()
    """
    found = []
    for file in (Path(path), *(Path(path + suffix) for suffix in SIDE_FILES)):
        with contextlib.suppress(OSError):
            if file.stat().st_mode & (stat.S_IRGRP | stat.S_IROTH):
                found.append(file)
    return found


def exposure(path: str) -> str | None:
    """One line saying which files of the store ``path`` others may read and how to stop
    it; None when none.

    >>> import tempfile
    >>> folder = tempfile.TemporaryDirectory()
    >>> db = Path(folder.name, "sw.db")
    >>> db.touch()
    >>> db.chmod(0o644)
    >>> print(exposure(str(db)).replace(folder.name, "/runs"))
    other users can read the store /runs/sw.db (mode 0644): chmod 600 /runs/sw.db
    >>> folder.cleanup()
    """
    files = readable_by_others(path)
    if not files:
        return None
    mode = stat.S_IMODE(files[0].stat().st_mode)
    shown = " ".join(shlex.quote(str(file.absolute())) for file in files)
    return (
        f"other users can read the store {Path(path).absolute()} (mode {mode:04o}):"
        f" chmod 600 {shown}"
    )
