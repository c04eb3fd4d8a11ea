"""Alembic environment: migrates the connection handed over in ``config.attributes``."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from scalewatch.store.schema import metadata

config = context.config
target_metadata = metadata


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=True,
        compare_type=True,
    )
    # A caller that opened a transaction (scalewatch.store.engine holds the SQLite write lock
    # that way) commits it; otherwise each revision runs in its own transaction.
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if isinstance(connection, Connection):
        _configure(connection)
        return
    # Run by hand (``alembic -c ...``) rather than through scalewatch.store.engine.upgrade().
    from scalewatch.store.engine import make_engine
    from scalewatch.store.postgres import in_transactions
    from scalewatch.store.urls import default_url

    engine = make_engine(config.get_main_option("sqlalchemy.url") or default_url())
    try:
        with engine.connect() as conn:
            in_transactions(conn)  # a PostgreSQL engine's reads autocommit; a migration must not
            _configure(conn)
            conn.commit()
    finally:
        engine.dispose()


def run_migrations_offline() -> None:
    context.configure(
        url=config.get_main_option("sqlalchemy.url") or "sqlite://",
        target_metadata=target_metadata,
        literal_binds=True,
        render_as_batch=True,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
