"""``scalewatch control``: a change to a running job's scaler, one option per control field.

The options are the fields of :mod:`scalewatch.store.control_rules`, each with its type and its rule
from there; the store checks a request by the same rules.
"""

from __future__ import annotations

import getpass
import json
from collections.abc import Callable
from typing import Any

import click

from scalewatch.store.control_rules import FIELDS, PURPOSES, SCHEMAS, requirement

from ._common import Failed, Refused, command, db_option, existing_store

__all__ = ["control", "option_help", "option_metavar"]


def option_metavar(name: str) -> str:
    """What the option's value is called: ``N`` for a count, ``S`` for a scale, else ``F``."""
    if SCHEMAS[name]["type"] == "integer":
        return "N"
    return "S" if name.endswith("scale") else "F"


def option_help(name: str) -> str:
    """What the field does and the rule its value keeps, both from the rules."""
    return f"{PURPOSES[name]}: {requirement(name)}"


def _field_options(function: Callable[..., Any]) -> Callable[..., Any]:
    for name in reversed(FIELDS):
        function = click.option(
            f"--{name.replace('_', '-')}",
            name,
            type=int if SCHEMAS[name]["type"] == "integer" else float,
            metavar=option_metavar(name),
            help=option_help(name),
        )(function)
    return function


def _said_once(problem: tuple[str, str]) -> str:
    """A refused field's line: its rule names it already (``growth_interval must be ...``),
    another message after its name.

    >>> _said_once(("growth_interval", "growth_interval must be an integer"))
    'growth_interval must be an integer'
    >>> _said_once(("request", "a request sets at least one of: scale"))
    'request: a request sets at least one of: scale'
    """
    name, message = problem
    return message if message.startswith(f"{name} ") else f"{name}: {message}"


@command("control", help="Request a change to a running job's scaler.")
@click.argument("run", type=int)
@_field_options
@db_option
def control(run: int, db: str | None, **fields: int | float | None) -> None:
    from scalewatch.store.control import request_control
    from scalewatch.store.engine import open_store
    from scalewatch.store.errors import ControlValidationError, RunNotFound, RunNotRunning
    from scalewatch.store.states import RequestSource

    values = {name: value for name, value in fields.items() if value is not None}
    with open_store(existing_store(), check=True) as store:
        try:
            row = request_control(
                store, run, values, requested_by=getpass.getuser(), source=RequestSource.CLI
            )
        except ControlValidationError as refused:
            raise Refused("\n".join(map(_said_once, refused.errors.items()))) from None
        except (RunNotFound, RunNotRunning) as refused:
            raise Failed(str(refused)) from None
    click.echo(json.dumps(row.to_dict(), indent=2))
