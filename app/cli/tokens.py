"""``scalewatch tokens``: the identities that may use the service, and their tokens."""

from __future__ import annotations

import getpass
import time

import click

from ._common import Command, Failed, Refused, aligned, db_option, existing_store

__all__ = ["tokens"]

COLUMNS = ["NAME", "ROLE", "KIND", "CREATED", "LAST USED", "EXPIRES", "REVOKED"]
ROLES = ("viewer", "operator", "admin", "writer")


def _when(at: float | None) -> str:
    return "-" if at is None else time.strftime("%Y-%m-%d %H:%M", time.localtime(at))


def _by() -> str:
    return f"{getpass.getuser()} (cli)"


@click.group(
    "tokens",
    help="Identities (viewer, operator, admin, writer) and their bearer tokens, in the store.",
)
def tokens() -> None:
    pass


@tokens.command(
    "create",
    cls=Command,
    help="Create an identity and print its token, once: the store keeps only a hash of it.",
)
@click.argument("name")
@click.option(
    "--role",
    type=click.Choice(ROLES),
    default="viewer",
    show_default=True,
    help="what it may do: read; also change runs; also manage identities;"
    " or (writer) record a job's runs through the service",
)
@click.option("--expires", metavar="DURATION", help="30d, 12h, 45m, 2w (default: never)")
@db_option
def create(name: str, role: str, expires: str | None, db: str | None) -> None:
    from scalewatch.store.engine import open_store
    from scalewatch.store.identities import IdentityExists, Role, create_identity

    from ..middleware.identity import parse_duration

    try:
        lasts = parse_duration(expires) if expires is not None else None
    except ValueError as refused:
        raise Refused(f"--expires: {refused}") from None
    expires_at = time.time() + lasts if lasts is not None else None
    with open_store(existing_store(), check=True) as store:
        try:
            made = create_identity(store, name, Role(role), by=_by(), expires_at=expires_at)
        except (IdentityExists, ValueError) as refused:
            raise Failed(str(refused)) from None
    until = "" if expires_at is None else f", until {_when(expires_at)}"
    click.echo(
        f"scalewatch: token of {made.identity.name} ({role}{until}); shown this once:", err=True
    )
    click.echo(made.token)


@tokens.command("list", cls=Command, help="List the identities (never a token).")
@db_option
def list_command(db: str | None) -> None:
    from scalewatch.store.engine import open_store
    from scalewatch.store.identities import list_identities

    with open_store(existing_store(), check=True) as store:
        rows = list_identities(store)
    table = [COLUMNS]
    for row in rows:
        table.append(
            [
                row.name,
                row.role.value,
                "token" if row.has_token else "proxy",
                _when(row.created_at),
                _when(row.last_used_at),
                _when(row.expires_at),
                _when(row.revoked_at),
            ]
        )
    for line in aligned(table):
        click.echo(line)


@tokens.command("revoke", cls=Command, help="Revoke an identity's token from now on.")
@click.argument("name")
@db_option
def revoke(name: str, db: str | None) -> None:
    from scalewatch.store.engine import open_store
    from scalewatch.store.identities import IdentityNotFound, revoke_identity

    with open_store(existing_store(), check=True) as store:
        try:
            row = revoke_identity(store, name, by=_by())
        except IdentityNotFound as missing:
            raise Failed(str(missing)) from None
    click.echo(f"scalewatch: {row.name} revoked at {_when(row.revoked_at)}")
