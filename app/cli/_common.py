"""What every ``scalewatch`` command shares: the ``--db`` option, settings from the command line
and the environment, and one way to fail (a line on standard error, an exit status)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import IO, Any, TypeVar

import click
from click.core import ParameterSource
from pydantic import ValidationError

from ..settings import Settings

__all__ = [
    "Command",
    "Failed",
    "Refused",
    "aligned",
    "command",
    "db_option",
    "existing_store",
    "settings",
]

F = TypeVar("F", bound=Callable[..., Any])

db_option = click.option(
    "--db",
    envvar="SCALEWATCH_DB",
    show_envvar=True,
    metavar="URL",
    help="store URL, or the path of its SQLite file (default: sqlite:///scalewatch.db)",
)


def command_name(ctx: click.Context | None) -> str:
    """``scalewatch export``, as messages name the command (``db upgrade`` is ``db``'s)."""
    if ctx is None:
        return "scalewatch"
    while ctx.parent is not None and ctx.parent.parent is not None:
        ctx = ctx.parent
    return ctx.command_path


class Refused(click.UsageError):
    """A value on the command line that the command refuses: exit status 2, each line of the
    message on standard error after the command's name, before any output."""

    def __init__(self, message: str) -> None:
        super().__init__(message, click.get_current_context(silent=True))

    def show(self, file: IO[Any] | None = None) -> None:
        for line in self.message.splitlines():
            click.echo(f"{command_name(self.ctx)}: {line}", file=file, err=True)


class Failed(click.ClickException):
    """An error a user can fix (a path, a store, a port): one line, exit status ``code``."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = code  # type: ignore[misc]
        self.ctx = click.get_current_context(silent=True)

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"{command_name(self.ctx)}: {self.message}", file=file, err=True)


class Command(click.Command):
    """A command whose known failures end it with their one line: a Ctrl-C (130), a reader
    that left a pipe (1, quietly), a store or setting a user can fix (1)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit):
            raise
        except KeyboardInterrupt:
            click.echo(f"\n{command_name(ctx)}: interrupted", err=True)
            ctx.exit(130)
        except BrokenPipeError:
            # The reader left (``scalewatch runs | head -1``): stop quietly, as other tools do.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            ctx.exit(1)
        except Exception as error:
            message = user_error(error)
            if message is None:
                raise
            raise Failed(message) from None


def command(name: str, **options: Any) -> Callable[[F], Command]:
    """``click.command`` with :class:`Command`'s handling of failures."""
    return click.command(name, cls=Command, **options)


def settings(**overrides: object) -> Settings:
    """The settings of this command: its options (those given, ``--db`` among them) over the
    environment's ``SCALEWATCH_*``."""
    ctx = click.get_current_context()
    values = {key: value for key, value in overrides.items() if value is not None}
    db = ctx.params.get("db")
    if db:
        values["db"] = db
    given = {
        name for name in values if ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE
    }
    try:
        return Settings(**values)  # type: ignore[arg-type]
    except ValidationError as error:
        raise Failed(refused(error, given)) from None


def refused(error: ValidationError, given: set[str]) -> str:
    """Each refused setting, named as the user gave it: an option, or ``$SCALEWATCH_*``."""
    problems = []
    for detail in error.errors():
        name = ".".join(map(str, detail["loc"])) or "settings"
        variable = f"SCALEWATCH_{name.upper()}"
        if name in given:
            name = f"--{name}"
        elif variable in os.environ:
            name = f"${variable}"
        problems.append(f"{name}: {detail['msg']}")
    return "; ".join(problems)


def existing_store() -> str:
    """The store URL of this command, when it names a store that is there to be read."""
    from ._store_files import existing_store

    return existing_store(settings().db)


def user_error(error: Exception) -> str | None:
    """One line for an error a user can fix (a path, a store, a setting); None for a bug."""
    from alembic.util.exc import CommandError
    from sqlalchemy.exc import ArgumentError, DBAPIError

    from scalewatch.store.errors import NotAStoreURL, StoreDamaged, StoreOnNetworkFilesystem

    from ..alerts.config import RulesFileError

    if isinstance(error, RulesFileError):  # $SCALEWATCH_ALERTS, read where the app is built
        return f"alert rules: {error}"
    if isinstance(error, ValidationError):
        return refused(error, given=set())
    if isinstance(error, NotAStoreURL | StoreDamaged | StoreOnNetworkFilesystem):
        return str(error)
    if isinstance(error, DBAPIError):
        # The driver's first line says what failed; libpq adds hints on lines of their own.
        reason = str(error.orig).strip().splitlines()
        return f"the store cannot be read: {reason[0] if reason else type(error.orig).__name__}"
    if isinstance(error, CommandError):
        return f"the store's schema: {error} (was it written by a newer scalewatch?)"
    if isinstance(error, ArgumentError | OSError):
        return str(error)
    return None


def aligned(rows: list[list[str]]) -> list[str]:
    """``rows`` in columns, a character that is not printable (a newline in a run's name)
    shown escaped.

    >>> aligned([["ID", "NAME"], ["12", "a\\tb"]])
    ['ID  NAME', '12  a\\\\tb']
    """
    rows = [["".join(c if c.isprintable() else repr(c)[1:-1] for c in cell) for cell in row]
            for row in rows]  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
