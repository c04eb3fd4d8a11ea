"""The PostgreSQL side of the store: engines on ``postgresql+psycopg://`` URLs, the advisory
lock that serialises schema upgrades, and bulk writes through COPY.

SQLite stays the embedded default; PostgreSQL is for many jobs on many nodes writing to
one store with one service over it. Both run the same schema and Alembic revisions.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import URL, Connection, Engine, create_engine, event, exc, text

from .errors import UnsupportedDriver
from .timeouts import DEFAULTS, Timeouts

DRIVER = "psycopg"
# pg_advisory_xact_lock's key: "scalewatch" in ASCII, truncated to 63 bits. Any key would
# do as long as every scalewatch process uses the same one.
MIGRATION_LOCK_KEY = 0x7363616C65776174
# Connections an engine keeps open (as many as the service's worker threads: anyio runs up
# to 40), and the most it opens beyond those. A pool that kept fewer closed and reopened
# connections under load, and each new one is a backend process the server forks and
# sets up (the fleet bench's service opened 15 a second).
# A trainer's engine opens only the few its threads use at once.
POOL_SIZE, POOL_OVERFLOW = 40, 10
# Every session without JIT compilation: the store's statements are short index walks,
# and the alert evaluator's one statement over 50 runs was estimated costly enough to be
# compiled at each run, 90 ms of the server's CPU for a 7 ms query (0.14 of a CPU under
# the fleet bench).
SESSION_OPTIONS = "-c jit=off"
# Where a step transaction announces its run's new steps (scalewatch.store.notify listens).
STEPS_CHANNEL = "scalewatch_steps"
# A step transaction's first statement: the run's last step before it (no row: no such
# run), the run advanced to the batch's last step, and its new steps announced (delivered
# at commit, to live streams anywhere), in one trip. The row is locked first, so a
# concurrent write of the same run reads the last step that one wrote.
ADVANCE_AND_NOTIFY = (
    "WITH before AS (SELECT last_step FROM runs WHERE id = %s FOR UPDATE)"
    " UPDATE runs SET last_step = GREATEST(runs.last_step, %s), heartbeat_at = %s"
    f" FROM before WHERE runs.id = %s RETURNING before.last_step, pg_notify('{STEPS_CHANNEL}', %s)"
)
# Reads autocommit (one round trip a statement, where a transaction adds BEGIN and
# ROLLBACK: under READ COMMITTED each statement has its own snapshot either way); writes
# and migrations run in transactions of this level.
WRITE_ISOLATION = "READ COMMITTED"


def is_postgres(url: URL) -> bool:
    return url.get_backend_name() == "postgresql"


def check_driver(url: URL) -> None:
    """psycopg 3 is the one driver the store is tested with; say so for another."""
    if url.get_driver_name() != DRIVER:
        raise UnsupportedDriver(url.drivername)
    try:
        import psycopg  # noqa: F401
    except ImportError as error:
        raise ImportError(
            "a PostgreSQL store needs psycopg 3: pip install 'scalewatch[postgres]'"
        ) from error


def make_engine(url: URL, *, timeouts: Timeouts = DEFAULTS) -> Engine:
    """An engine on a PostgreSQL ``url``; its pool as large as a SQLite file store's, so
    every worker thread of the service can hold a connection at once. A connection waits
    ``timeouts.connect_s`` for the server (unless the URL says), and one idle in the pool
    over ``timeouts.ping_idle_s`` is pinged at checkout."""
    check_driver(url)
    args: dict[str, Any] = {}
    if "connect_timeout" not in url.query:
        args["connect_timeout"] = math.ceil(timeouts.connect_s)  # libpq takes whole seconds
    if "options" not in url.query:  # a URL's own options are left as they are
        args["options"] = SESSION_OPTIONS
    engine = create_engine(
        url,
        pool_size=POOL_SIZE,
        max_overflow=POOL_OVERFLOW,
        isolation_level="AUTOCOMMIT",
        connect_args=args,
    )
    event.listen(engine, "checkin", _on_checkin)
    event.listen(engine, "checkout", functools.partial(_on_checkout, idle_s=timeouts.ping_idle_s))
    return engine


def in_transactions(conn: Connection) -> Connection:
    """``conn`` in transactions until it goes back to the pool: for writes and migrations,
    whose ``begin()`` must be a real one. A PostgreSQL engine from :func:`make_engine`
    autocommits otherwise; SQLite's connections are left as they are."""
    if conn.dialect.name == "postgresql":
        conn.execution_options(isolation_level=WRITE_ISOLATION)
    return conn


def _on_checkin(_dbapi_connection: Any, record: Any) -> None:
    record.info["idle_since"] = time.monotonic()


def _on_checkout(dbapi_connection: Any, record: Any, _proxy: Any, *, idle_s: float) -> None:
    """Ping a connection that sat in the pool ``idle_s`` or longer; a dead one is replaced
    (the pool retries on ``DisconnectionError``), so a restarted server costs no request an
    error."""
    since = record.info.get("idle_since")
    if since is None or time.monotonic() - since < idle_s:
        return
    import psycopg

    try:
        dbapi_connection.execute("SELECT 1")
    except psycopg.Error as error:
        raise exc.DisconnectionError(str(error)) from error


@contextmanager
def migration_lock(engine: Engine) -> Iterator[Connection]:
    """A transaction holding the store's advisory lock: trainers and the service starting at
    once upgrade one after another, and each re-reads the version inside the lock."""
    with engine.connect() as conn, in_transactions(conn).begin():
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
        yield conn


def copy_rows(
    cursor: Any, table: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]
) -> None:
    """Append ``rows`` to ``table`` by COPY: one round trip, no statement per row."""
    with cursor.copy(_copy_sql(table, tuple(columns))) as copy:
        for row in rows:
            copy.write_row(row)


@functools.cache
def _copy_sql(table: str, columns: tuple[str, ...]) -> str:
    return f"COPY {table} ({', '.join(columns)}) FROM STDIN"


def upsert_rows(
    cursor: Any,
    table: str,
    columns: Sequence[str],
    key: Sequence[str],
    rows: Sequence[Sequence[Any]],
) -> None:
    """Insert ``rows`` into ``table``, replacing the row of the same ``key`` (SQLite's
    ``INSERT OR REPLACE``); psycopg pipelines the statements of one ``executemany``.

    One statement a row, prepared once: a multi-row statement's text and parameters are
    too many for the driver's cache of parsed queries, and parsing it again for each batch
    cost more than it saved (an ``unnest`` of arrays a column saved the client nothing
    and cost the server more).
    """
    if rows:
        cursor.executemany(_upsert_sql(table, tuple(columns), tuple(key)), rows)


@functools.cache
def _upsert_sql(table: str, columns: tuple[str, ...], key: tuple[str, ...]) -> str:
    values = ", ".join(["%s"] * len(columns))
    updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in columns if c not in key)
    return (
        f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({values})"
        f" ON CONFLICT ({', '.join(key)}) DO UPDATE SET {updates}"
    )
