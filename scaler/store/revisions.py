"""The schema's Alembic revisions as installed: the head, and bringing an engine's
database to it (or back). Any thread that opens a store; once per process and store.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic import util as alembic_util
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, exc

from scalewatch import migrations

from . import postgres
from .errors import MigrationsUnusable
from .timeouts import DEFAULTS

log = logging.getLogger("scalewatch.store")
# Alembic runs a command through module-level proxies (``alembic.context``, ``alembic.op``)
# bound for its duration: two threads of one process upgrading two stores at once would
# run each other's revisions. The store's own lock serialises processes; this, threads.
_ALEMBIC_COMMANDS = threading.Lock()


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
                    with _ALEMBIC_COMMANDS:
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


def downgrade_engine(engine: Engine, revision: str = "base") -> None:
    """Downgrade the database behind ``engine`` to ``revision`` (``"base"``: no tables)."""
    with _migration_lock(engine) as conn, _ALEMBIC_COMMANDS:
        command.downgrade(_alembic_config(conn), revision)
