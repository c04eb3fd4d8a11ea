"""``scalewatch control``: a change to a running job's scaler, one option per control field.

The options are the fields of :mod:`scalewatch.store.control_rules`, each with its type and its rule
from there; the store checks a request by the same rules.
"""

from __future__ import annotations

import getpass
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from scalewatch.store.control_rules import FIELDS, PURPOSES, SCHEMAS, requirement

from ._common import Failed, Refused, command, db_option, existing_store

if TYPE_CHECKING:
    from scalewatch.store.engine import Store
    from scalewatch.store.records import ControlRequestRow

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


# How often a waiting ``control`` reads the request again, and says it is still waiting
# (at most: a short --timeout gets four lines).
POLL_S = 0.2
PROGRESS_S = 10.0


@command(
    "control",
    help="Request a change to a running job's scaler, and wait until every rank applied it"
    " (the job applies it at its next step).",
)
@click.argument("run", type=int)
@_field_options
@click.option(
    "--no-wait",
    is_flag=True,
    help="only file the request (by default: wait until the job applied or rejected it)",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    default=60,
    show_default=True,
    metavar="SECONDS",
    help="how long to wait for the job",
)
@db_option
def control(
    run: int, no_wait: bool, timeout: float, db: str | None, **fields: int | float | None
) -> None:
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
        if no_wait:
            click.echo(f"request {row.id} filed: {_values(row.values)} (pending: the job applies"
                       " it at its next step)")  # fmt: skip
            return
        settled = _settled(store, row, timeout)
    _report(settled, timeout)


def _settled(store: Store, row: ControlRequestRow, timeout: float) -> ControlRequestRow:
    """``row`` once it is no longer pending, or as it is after ``timeout`` seconds; a line on
    standard error now and every ``PROGRESS_S`` (or quarter of the timeout) while it waits."""
    from scalewatch.store.control import control_request
    from scalewatch.store.states import RequestStatus

    click.echo(
        f"request {row.id} filed: waiting for run {row.run_id} to apply it at its next step"
        f" (up to {timeout:g} s; --no-wait does not wait)",
        err=True,
    )
    every = min(PROGRESS_S, timeout / 4)
    started = time.monotonic()
    said = started
    while True:
        row = control_request(store, row.id)
        now = time.monotonic()
        if row.status is not RequestStatus.PENDING or now - started >= timeout:
            return row
        if now - said >= every:
            click.echo(f"request {row.id}: still pending after {now - started:.0f} s", err=True)
            said = now
        time.sleep(min(POLL_S, max(0.0, timeout - (now - started))))


def _report(row: ControlRequestRow, timeout: float) -> None:
    """The request's outcome: a line on standard output once applied; else :class:`Failed`."""
    from scalewatch.store.states import RequestStatus

    if row.status is RequestStatus.APPLIED:
        click.echo(
            f"request {row.id} applied at step {row.applied_step} on every rank of run"
            f" {row.run_id}: {_values(row.values)}"
        )
    elif row.status is RequestStatus.REJECTED:
        raise Failed(f"request {row.id} rejected: {row.reason}")
    else:
        raise Failed(
            f"request {row.id} still pending after {timeout:g} s: is run {row.run_id}'s job"
            " stepping? It applies the request at its next step ('scalewatch runs' shows"
            " its last step)"
        )


def _values(values: dict[str, Any]) -> str:
    """``growth_interval = 500, growth_factor = 1.5``."""
    return ", ".join(f"{name} = {value!r}" for name, value in values.items())
