"""Which SQLite file a command may take for a store: one that exists, is not empty, and is
not another program's database (opening any of those would make a store of it)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from scalewatch.store.urls import parse_store_url, sqlite_file

__all__ = ["existing_store", "refuse_foreign"]


def local_file(url: str) -> Path | None:
    """The file behind a SQLite store URL; None for a server's database (PostgreSQL), an
    in-memory or a ``file:`` URI one."""
    path = sqlite_file(parse_store_url(url))
    return None if path is None else Path(path)


def existing_store(url: str) -> str:
    """``url``, when a command that reads a store may open it; else a one-line error: a
    mistyped path, or a 0-byte file (SQLite takes it for an empty database), would become
    a new, empty store."""
    path = local_file(url)
    if path is not None and (not path.exists() or _empty(path)):
        where = f"{path} is an empty file" if path.exists() else f"no store at {path}"
        raise FileNotFoundError(
            f"{where} (training creates a store; 'scalewatch db upgrade --db {url}' makes"
            " an empty one)"
        )
    refuse_foreign(url)
    return url


def refuse_foreign(url: str) -> None:
    """Raise ``FileExistsError`` for another program's SQLite database at ``url``."""
    path = local_file(url)
    if path is not None and path.exists() and _foreign(path):
        raise FileExistsError(f"{path} is a SQLite database, but not a scalewatch store")


def _empty(path: Path) -> bool:
    wal = path.with_name(path.name + "-wal")
    return path.is_file() and path.stat().st_size == 0 and not (wal.exists() and wal.stat().st_size)


def _foreign(path: Path) -> bool:
    """Whether ``path`` holds tables, none of them a store's (opening would add ours)."""
    try:
        conn = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True)
        try:
            names = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
        finally:
            conn.close()
    except sqlite3.DatabaseError:
        return False  # not a database at all: opening it says so
    return bool(names) and "alembic_version" not in names
