"""``scalewatch db``: the store's schema."""

from __future__ import annotations

import click

from ._common import Command, db_option, settings

__all__ = ["db"]


@click.group("db", help="Manage the store's schema.")
def db() -> None:
    pass


@db.command("upgrade", cls=Command, help="Migrate the store to the head revision.")
@db_option
def upgrade_command(db: str | None) -> None:
    from scalewatch.store.engine import upgrade
    from scalewatch.store.urls import shown_url

    from ._store_files import refuse_foreign

    url = settings().db
    refuse_foreign(url)  # upgrading would add a store's tables to another program's data
    click.echo(f"{shown_url(url)}: at revision {upgrade(url)}")
