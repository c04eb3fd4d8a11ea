"""SQLite, the embedded store: its engine's connections (a new file readable by its owner
alone, WAL, the busy timeout, the pragmas, transactions begun as asked), multi-row inserts,
and the file's integrity check.
Any thread that opens a store; the writer thread inserts."""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Sequence
from itertools import chain
from pathlib import Path
from typing import Any

from sqlalchemy import URL, Connection, Engine, create_engine, event, exc

from .errors import NotAStore, StoreDamaged, storage_failure
from .filesystems import JOURNAL_MODES, refuse_network
from .permissions import create_private
from .timeouts import DEFAULTS, Timeouts
from .urls import parse_store_url, sqlite_file

BUSY_TIMEOUT_MS = DEFAULTS.busy_ms  # the default (bench/telemetry.py's raw connections)
# Connections an engine on a file keeps open (one per worker thread of the service), and
# the most it opens beyond those: as on PostgreSQL (scalewatch.store.postgres says why).
POOL_SIZE, POOL_OVERFLOW = 40, 10

_PRAGMAS = (
    "PRAGMA synchronous = NORMAL",
    "PRAGMA foreign_keys = ON",
)
# Rows in one multi-row INSERT at most; SQLite before 3.32 binds at most 999 values.
MAX_ROWS_PER_STATEMENT = 1024
_OLDEST_LIMIT = 999
# Attempts at switching a new file to WAL; each failed one waits for the lock holder.
_WAL_ATTEMPTS = 100


def insert_rows(cursor: sqlite3.Cursor, head: str, rows: Sequence[Sequence[Any]]) -> None:
    """Run ``head`` (``INSERT INTO t (a, b)``) for ``rows`` in a few multi-row statements.

    Not ``executemany``: the driver releases and retakes the GIL around every row, and each
    time the training thread may have to wait for it. Statements hold 2**k rows, as many as
    SQLite binds at once (capped), so a few statement texts serve every batch from the
    driver's statement cache.
    """
    if not rows:
        return
    width = len(rows[0])
    getlimit = getattr(cursor.connection, "getlimit", None)  # Python 3.11+
    limit = getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) if getlimit else _OLDEST_LIMIT
    most = 1 << (max(1, min(MAX_ROWS_PER_STATEMENT, limit // width)).bit_length() - 1)
    start = 0
    while start < len(rows):
        count = min(most, 1 << ((len(rows) - start).bit_length() - 1))
        cursor.execute(_values_sql(head, width, count), tuple(chain(*rows[start : start + count])))
        start += count


@functools.cache
def _values_sql(head: str, width: int, rows: int) -> str:
    """``_values_sql("INSERT INTO t (a, b)", 2, 2)``: ``... VALUES (?, ?), (?, ?)``."""
    row = f"({', '.join('?' * width)})"
    return f"{head} VALUES {', '.join([row] * rows)}"


def make_engine(url: str, parsed: URL, *, timeouts: Timeouts = DEFAULTS) -> Engine:
    """An engine on the SQLite database ``url`` (``parsed``) whose every connection has the
    store's pragmas, waiting as ``timeouts`` say.

    Transactions are begun by SQLAlchemy itself (the driver's implicit BEGIN skips DDL),
    as ``BEGIN`` or, with the execution option ``sqlite_begin="IMMEDIATE"``, ``BEGIN
    IMMEDIATE``.
    """
    journal_mode = journal_mode_of(parsed)
    if journal_mode is not None:  # ours, not the driver's: sqlite3.connect takes no such keyword
        parsed = parsed.difference_update_query(["journal_mode"])
        url = parsed.render_as_string(hide_password=False)
    database = parsed.database or ""
    path = sqlite_file(parsed)
    if path is not None:
        parent = Path(path).expanduser().absolute().parent
        if not parent.is_dir():
            raise FileNotFoundError(
                f"cannot open the store {url!r}: the directory {str(parent)!r} does not exist"
            )
        refuse_network(path, journal_mode)
    pool: dict[str, int] = {}
    if database and database != ":memory:" and "mode=memory" not in database:
        # A file store gets SQLAlchemy's QueuePool; with WAL, readers never wait for the
        # writer, so let every worker thread of the service hold a connection at once
        # (anyio runs sync routes in up to 40 threads) and keep it.
        pool = {"pool_size": POOL_SIZE, "max_overflow": POOL_OVERFLOW}
    engine = create_engine(url, **pool)
    on_connect = functools.partial(
        _on_connect, busy_ms=timeouts.busy_ms, journal_mode=journal_mode or "wal"
    )
    if path is not None:
        # Before SQLite opens it: a file made by SQLite itself takes the umask's mode
        # (0644, readable by every user of the host), and its -wal and -shm follow it.
        event.listen(engine, "do_connect", functools.partial(_before_connect, path))
    event.listen(engine, "connect", on_connect)
    event.listen(engine, "begin", _on_begin)
    return engine


def refuse_network_store(url: str) -> None:
    """Raise :class:`~scalewatch.store.errors.StoreOnNetworkFilesystem` for a SQLite store
    ``url`` on a network filesystem (unless its URL asks for a rollback journal), as
    opening it would; nothing for another store, or a URL that opening will refuse."""
    try:
        parsed = parse_store_url(url)
        journal_mode = journal_mode_of(parsed)
    except (ValueError, exc.ArgumentError):
        return
    path = sqlite_file(parsed)
    if path is not None:
        refuse_network(path, journal_mode)


def journal_mode_of(parsed: URL) -> str | None:
    """The journal mode a store's URL asks for (``?journal_mode=delete``), None if none.

    >>> from sqlalchemy import make_url
    >>> journal_mode_of(make_url("sqlite:////nfs/me/sw.db?journal_mode=DELETE"))
    'delete'
    """
    value = parsed.query.get("journal_mode")
    if value is None:
        return None
    mode = value if isinstance(value, str) else value[-1]
    if mode.lower() not in JOURNAL_MODES:
        raise ValueError(
            f"journal_mode in a store's URL is one of {', '.join(JOURNAL_MODES)}, not {mode!r}"
        )
    return mode.lower()


def _before_connect(path: str, *_: Any) -> None:
    create_private(path)


def _on_connect(
    dbapi_connection: sqlite3.Connection, _record: Any, *, busy_ms: int, journal_mode: str
) -> None:
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(f"PRAGMA busy_timeout = {int(busy_ms)}")
        if journal_mode == "wal":
            _use_wal(cursor)
        else:  # a rollback journal, asked for by the URL (one of JOURNAL_MODES)
            cursor.execute(f"PRAGMA journal_mode = {journal_mode}")
        for pragma in _PRAGMAS:
            cursor.execute(pragma)
    finally:
        cursor.close()


def _use_wal(cursor: sqlite3.Cursor) -> None:
    """Switch the database to WAL, also when other processes switch the same new file."""
    for _ in range(_WAL_ATTEMPTS):
        try:
            cursor.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as error:
            if "locked" not in str(error):
                raise
        # Two connections switching at once: SQLite refuses one without calling the busy
        # handler (it would deadlock). Wait for the other's lock, then try again, which
        # then finds WAL in place.
        cursor.execute("BEGIN IMMEDIATE")
        cursor.execute("ROLLBACK")
    cursor.execute("PRAGMA journal_mode = WAL")


def _on_begin(conn: Connection) -> None:
    mode = conn.get_execution_options().get("sqlite_begin", "DEFERRED")
    conn.exec_driver_sql(f"BEGIN {mode}")


def check_integrity(engine: Engine) -> None:
    """Raise :class:`StoreDamaged` unless SQLite's ``quick_check`` finds the database behind
    ``engine`` whole (a new, empty file is). It reads the whole file, so the service and
    the CLI check at open; the trainer, which must start at once, does not.
    """
    if engine.dialect.name != "sqlite":  # a server keeps its own files whole
        return
    url = engine.url.render_as_string(hide_password=True)
    try:
        with engine.connect() as conn:
            problems = conn.exec_driver_sql("PRAGMA quick_check(1)").scalars().all()
    except exc.DBAPIError as error:
        reason = storage_failure(error)
        if reason is None or "locked" in reason:
            raise
        path = sqlite_file(engine.url)
        if path is not None and not _sqlite_header(Path(path)):
            raise NotAStore(url, path) from None
        raise StoreDamaged(url, reason) from None
    if problems != ["ok"]:
        lines = [line for row in problems for line in str(row).splitlines()]
        first = next((line for line in lines if not line.startswith("***")), lines[0])
        raise StoreDamaged(url, f"SQLite's quick_check: {first}")


# The first 16 bytes of every SQLite database file (sqlite.org/fileformat.html).
_HEADER = b"SQLite format 3\x00"


def _sqlite_header(path: Path) -> bool:
    """Whether ``path`` begins as a SQLite database does; True where it cannot be read (the
    error SQLite gave says more then)."""
    try:
        with path.open("rb") as file:
            return file.read(len(_HEADER)) == _HEADER
    except OSError:
        return True
