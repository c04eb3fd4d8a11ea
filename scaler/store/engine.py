"""Opening a store: the SQLAlchemy engine, SQLite pragmas, and upgrading to the Alembic head.

>>> import tempfile
>>> folder = tempfile.TemporaryDirectory()
>>> store = open_store(f"sqlite:///{folder.name}/example.db")  # created and upgraded if needed
>>> store.engine.dialect.name
'sqlite'
>>> store.close()
>>> folder.cleanup()
"""

from __future__ import annotations

import functools
import logging
import os
import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from itertools import chain
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from alembic import command
from alembic import util as alembic_util
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import URL, Connection, Engine, create_engine, event, exc, make_url

from scalewatch import migrations

from . import postgres
from .errors import MigrationsUnusable, NotAStoreURL, StoreDamaged
from .timeouts import DEFAULTS, Timeouts

if TYPE_CHECKING:
    from .notify import Announcer

log = logging.getLogger("scalewatch.store")

ENV_VAR = "SCALEWATCH_DB"
DEFAULT_URL = "sqlite:///scalewatch.db"
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
# Each table and its key, for Store.probe.
_PROBED = (
    ("runs", ("id",)),
    ("steps", ("run_id", "step")),
    ("step_rollups", ("run_id", "level", "bucket")),
    ("control_requests", ("id",)),
    ("telemetry_gaps", ("id",)),
    ("alerts", ("id",)),
)
# SQLite's primary result codes of a store that cannot be used as it is (the file, the
# disk, a lock), as opposed to a mistake in a statement: sqlite3.h.
_STORAGE_CODES = frozenset(
    {
        3,  # SQLITE_PERM
        5,  # SQLITE_BUSY
        6,  # SQLITE_LOCKED
        8,  # SQLITE_READONLY
        10,  # SQLITE_IOERR
        11,  # SQLITE_CORRUPT
        13,  # SQLITE_FULL
        14,  # SQLITE_CANTOPEN
        15,  # SQLITE_PROTOCOL
        26,  # SQLITE_NOTADB
    }
)


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


def store_url(value: str) -> str:
    """A store URL as it is; anything else is the path of a SQLite file (``~`` expanded,
    and characters a URL would read otherwise, such as ``?`` and ``%``, escaped).

    >>> store_url("runs/sw.db"), store_url("/tmp/a?b.db"), store_url("sqlite:///sw.db")
    ('sqlite:///runs/sw.db', 'sqlite:////tmp/a%3Fb.db', 'sqlite:///sw.db')
    """
    if "://" in value or value.startswith("sqlite:"):
        return value
    path = os.path.expanduser(value)
    return URL.create("sqlite", database=path).render_as_string(hide_password=False)


def parse_store_url(value: str) -> URL:
    """:func:`store_url` of ``value``, parsed; :class:`NotAStoreURL` for another database
    than SQLite or PostgreSQL."""
    url = store_url(value)
    parsed = make_url(url)
    if parsed.get_backend_name() not in ("sqlite", "postgresql"):
        raise NotAStoreURL(parsed.render_as_string(hide_password=True))
    return parsed


def shown_url(url: str | URL) -> str:
    """``url`` as logs, errors and output show it: its password masked.

    >>> shown_url("postgresql+psycopg://me:secret@db/sw")
    'postgresql+psycopg://me:***@db/sw'
    """
    try:
        parsed = make_url(url) if isinstance(url, str) else url
    except exc.ArgumentError:
        return str(url)
    if parsed.password is None:
        return url if isinstance(url, str) else parsed.render_as_string(hide_password=False)
    return parsed.render_as_string(hide_password=True)


def default_url() -> str:
    """``$SCALEWATCH_DB`` when set, else ``sqlite:///scalewatch.db`` (relative to the cwd)."""
    return os.environ.get(ENV_VAR) or DEFAULT_URL


class Store:
    """An open store: a SQLAlchemy engine on one SQLite database at the Alembic head.

    Writers use :meth:`write`, which takes SQLite's write lock up front (``BEGIN
    IMMEDIATE``), so a write transaction never fails half-way on a lock upgrade.
    """

    def __init__(self, url: str, engine: Engine) -> None:
        self.url = url
        self.engine = engine
        # PostgreSQL: the LISTEN connection of this store's live streams, while any wait
        # (scalewatch.store.notify).
        self.listener: Announcer | None = None  # scalewatch.store.notify's, while streams wait

    def __repr__(self) -> str:
        return f"Store({shown_url(self.url)!r})"

    @contextmanager
    def read(self) -> Iterator[Connection]:
        """A connection to read on: in a read transaction on SQLite (one consistent
        snapshot), rolled back after; autocommitting on PostgreSQL, where under READ
        COMMITTED each statement has a snapshot of its own anyway."""
        with self.engine.connect() as conn:
            yield conn

    @contextmanager
    def write(self) -> Iterator[Connection]:
        """A connection in a write transaction: committed on success, rolled back on error."""
        with self.engine.connect() as conn:
            postgres.in_transactions(conn)
            conn.execution_options(sqlite_begin="IMMEDIATE")
            with conn.begin():
                yield conn

    def probe(self) -> None:
        """Read the first and the last rows of each table: quick (a few pages), and it
        raises SQLAlchemy's error for a store that cannot be read, or no longer at all."""
        with self.read() as conn:
            for table, key in _PROBED:
                for order in ("ASC", "DESC"):
                    by = ", ".join(f"{column} {order}" for column in key)
                    conn.exec_driver_sql(f"SELECT {key[0]} FROM {table} ORDER BY {by} LIMIT 1")

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def make_engine(url: str, *, timeouts: Timeouts = DEFAULTS) -> Engine:
    """An engine on a SQLite ``url`` whose every connection has the store's pragmas (a
    PostgreSQL one: :func:`scalewatch.store.postgres.make_engine`), waiting as ``timeouts`` say.

    Transactions are begun by SQLAlchemy itself (the driver's implicit BEGIN skips DDL),
    as ``BEGIN`` or, with the execution option ``sqlite_begin="IMMEDIATE"``, ``BEGIN
    IMMEDIATE``.
    """
    url = store_url(url)
    parsed = parse_store_url(url)
    if postgres.is_postgres(parsed):
        return postgres.make_engine(parsed, timeouts=timeouts)
    database = parsed.database or ""
    if database and database != ":memory:" and not database.startswith("file:"):
        parent = Path(database).expanduser().absolute().parent
        if not parent.is_dir():
            raise FileNotFoundError(
                f"cannot open the store {url!r}: the directory {str(parent)!r} does not exist"
            )
    pool: dict[str, int] = {}
    if database and database != ":memory:" and "mode=memory" not in database:
        # A file store gets SQLAlchemy's QueuePool; with WAL, readers never wait for the
        # writer, so let every worker thread of the service hold a connection at once
        # (anyio runs sync routes in up to 40 threads) and keep it.
        pool = {"pool_size": POOL_SIZE, "max_overflow": POOL_OVERFLOW}
    engine = create_engine(url, **pool)
    event.listen(engine, "connect", functools.partial(_on_connect, busy_ms=timeouts.busy_ms))
    event.listen(engine, "begin", _on_begin)
    return engine


def _on_connect(dbapi_connection: sqlite3.Connection, _record: Any, *, busy_ms: int) -> None:
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(f"PRAGMA busy_timeout = {int(busy_ms)}")
        _use_wal(cursor)
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


def storage_failure(error: BaseException) -> str | None:
    """The one-line reason when ``error`` (SQLAlchemy's or the driver's) says the store
    cannot be used as it is (damaged, unreadable, full, locked); None for another error.

    >>> storage_failure(sqlite3.DatabaseError("database disk image is malformed"))
    'database disk image is malformed'
    >>> storage_failure(sqlite3.IntegrityError("UNIQUE constraint failed")) is None
    True
    """
    orig = error.orig if isinstance(error, exc.DBAPIError) else error
    if isinstance(orig, StoreDamaged):
        return str(orig)
    if type(orig).__module__.split(".")[0] == "psycopg":  # the server is down or unreachable
        from psycopg import OperationalError

        return str(orig).splitlines()[0] if isinstance(orig, OperationalError) else None
    if not isinstance(orig, sqlite3.DatabaseError):
        return None
    code = getattr(orig, "sqlite_errorcode", None)
    if code is not None:
        return str(orig).splitlines()[0] if (code & 0xFF) in _STORAGE_CODES else None
    # A driver without error codes (Python 3.10): the classes SQLite's codes map to.
    storage = isinstance(orig, sqlite3.OperationalError) or type(orig) is sqlite3.DatabaseError
    return str(orig).splitlines()[0] if storage else None


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
        raise StoreDamaged(url, reason) from None
    if problems != ["ok"]:
        lines = [line for row in problems for line in str(row).splitlines()]
        first = next((line for line in lines if not line.startswith("***")), lines[0])
        raise StoreDamaged(url, f"SQLite's quick_check: {first}")


def _alembic_config(connection: Connection | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(Path(migrations.__file__).parent))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def _scripts() -> ScriptDirectory:
    return ScriptDirectory.from_config(_alembic_config())


def _versions_folder() -> str:
    return str(Path(migrations.__file__).parent / "versions")


def head_revision() -> str:
    """The revision the installed migrations lead to."""
    head = _scripts().get_current_head()
    if head is None:
        raise MigrationsUnusable("no revision files", _versions_folder())
    return head


def _known(revision: str) -> bool:
    try:
        return _scripts().get_revision(revision) is not None
    except alembic_util.CommandError:
        return False


def _current_revision(conn: Connection) -> str | None:
    return MigrationContext.configure(conn).get_current_revision()


@contextmanager
def _migration_lock(engine: Engine) -> Iterator[Connection]:
    # SQLite's write lock (PostgreSQL's advisory lock) serialises migrations across
    # processes; whoever waits for it re-reads the version inside and finds the work done.
    if engine.dialect.name == "postgresql":
        with postgres.migration_lock(engine) as conn:
            yield conn
        return
    with engine.connect() as conn:
        conn.execution_options(sqlite_begin="IMMEDIATE")
        with conn.begin():
            yield conn


def upgrade_engine(engine: Engine, *, wait_s: float = DEFAULTS.migration_wait_s) -> str:
    """Upgrade the database behind ``engine`` to the head revision; return the head.

    Another process upgrading a big store holds the write lock longer than the busy
    timeout: while the store is not at the head, the lock is asked for again, for up to
    ``wait_s``, with a warning once.
    """
    head = head_revision()
    deadline = time.monotonic() + wait_s
    warned = False
    while True:
        with engine.connect() as conn:
            if _current_revision(conn) == head:
                return head
        try:
            with _migration_lock(engine) as conn:
                current = _current_revision(conn)
                if current is not None and current != head and not _known(current):
                    raise MigrationsUnusable(
                        f"{engine.url.render_as_string(hide_password=True)} is at revision"
                        f" {current}, which this scalewatch does not know (its head is {head});"
                        " a newer scalewatch wrote it",
                        _versions_folder(),
                    )
                if current != head:
                    if current is not None:  # a store of an older scalewatch, not a new one
                        log.warning(
                            "scalewatch: upgrading the store's schema (%s to %s); a store"
                            " of many steps takes a while",
                            current,
                            head,
                        )
                    command.upgrade(_alembic_config(conn), "head")
            return head
        except exc.OperationalError as error:
            if "locked" not in str(error.orig) or time.monotonic() > deadline:
                raise
            if not warned:
                log.warning(
                    "scalewatch: another process holds the store's write lock (an upgrade?);"
                    " waiting up to %.0f s for it",
                    wait_s,
                )
                warned = True


def upgrade(url: str | None = None) -> str:
    """Create or upgrade the store at ``url`` (default: :func:`default_url`); return the head.

    A damaged store is refused (:class:`StoreDamaged`) before anything is written to it.
    """
    engine = make_engine(url or default_url())
    try:
        check_integrity(engine)
        return upgrade_engine(engine)
    finally:
        engine.dispose()


def downgrade(url: str | None = None, revision: str = "base") -> None:
    """Downgrade the store at ``url`` to ``revision`` (``"base"``: no tables at all)."""
    engine = make_engine(url or default_url())
    try:
        with _migration_lock(engine) as conn:
            command.downgrade(_alembic_config(conn), revision)
    finally:
        engine.dispose()


def open_store(
    url: str | None = None, *, check: bool = False, timeouts: Timeouts = DEFAULTS
) -> Store:
    """Open the store at ``url`` (default: :func:`default_url`), upgrading it to the head;
    with ``check``, first refuse a damaged one (:func:`check_integrity`). ``timeouts``: how
    long it waits for locks, another process's upgrade and a server.

    Safe when several processes open the same new file at the same moment.
    """
    resolved = store_url(url or default_url())
    engine = make_engine(resolved, timeouts=timeouts)
    try:
        if check:
            check_integrity(engine)
        upgrade_engine(engine, wait_s=timeouts.migration_wait_s)
    except BaseException:
        engine.dispose()
        raise
    return Store(resolved, engine)
