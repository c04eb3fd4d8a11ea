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

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from types import TracebackType
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine

from . import postgres, sqlite
from .revisions import downgrade_engine, upgrade_engine
from .sql import driver_sql
from .sqlite import check_integrity
from .timeouts import DEFAULTS, Timeouts
from .urls import default_url, parse_store_url, shown_url, store_url

if TYPE_CHECKING:
    from .notify import Announcer

# Each table and its key, for Store.probe.
_PROBED = (
    ("runs", ("id",)),
    ("steps", ("run_id", "step")),
    ("step_rollups", ("run_id", "level", "bucket")),
    ("control_requests", ("id",)),
    ("telemetry_gaps", ("id",)),
    ("alerts", ("id",)),
)


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

    def driver_rows(
        self, sql: str, params: Sequence[Any] | Mapping[str, Any]
    ) -> list[tuple[Any, ...]]:
        """The rows of one statement run on the driver's own cursor (``sql`` as
        :func:`~scalewatch.store.sql.driver_sql` takes it): a tuple a row and nothing more,
        for the reads made many times a second, where SQLAlchemy's connection, transaction
        and result objects cost many times the statement. The connection goes back to the
        pool after, its transaction rolled back."""
        raw = self.engine.raw_connection()
        try:
            cursor = raw.cursor()
            cursor.execute(driver_sql(sql, self.engine.dialect.name), params)
            rows: list[tuple[Any, ...]] = list(cursor.fetchall())  # tuples already
            cursor.close()
        finally:
            raw.close()
        return rows

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
    """An engine on ``url``, SQLite (:func:`scalewatch.store.sqlite.make_engine`) or
    PostgreSQL (:func:`scalewatch.store.postgres.make_engine`), waiting as ``timeouts`` say."""
    url = store_url(url)
    parsed = parse_store_url(url)
    if postgres.is_postgres(parsed):
        return postgres.make_engine(parsed, timeouts=timeouts)
    return sqlite.make_engine(url, parsed, timeouts=timeouts)


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
        downgrade_engine(engine, revision)
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
