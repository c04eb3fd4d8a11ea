"""``scalewatch alerts``: the alerts in the store, newest first, as a table or JSON Lines."""

from __future__ import annotations

import json
import time

import click

from ._common import Failed, Refused, aligned, command, db_option, existing_store

__all__ = ["alerts"]

COLUMNS = ["ID", "RUN", "RULE", "STATE", "STEP", "FIRED", "RESOLVED", "VALUE", "THRESHOLD"]


def _said(kind: str, value: float) -> str:
    from ..alerts.text import unit_of

    unit = unit_of(kind)
    return f"{value:.4g}" if unit is None else unit.say(value).replace(" ", "")


def _when(at: float | None) -> str:
    return "-" if at is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


@command("alerts", help="List the alerts the service's rules raised, newest first.")
@click.option("--run", type=int, metavar="RUN", help="only this run's (its id)")
@click.option("--firing", is_flag=True, help="only those firing now")
@click.option("--limit", type=int, default=50, show_default=True, help="at most this many")
@click.option("--jsonl", is_flag=True, help="one JSON object a line")
@db_option
def alerts(run: int | None, firing: bool, limit: int, jsonl: bool, db: str | None) -> None:
    from scalewatch.store.alerts import alert_page
    from scalewatch.store.engine import open_store
    from scalewatch.store.queries import run_status
    from scalewatch.store.states import AlertState

    from ..alerts.text import alert_text

    if limit < 1:
        raise Refused("--limit must be 1 or more")
    with open_store(existing_store(), check=True) as store:
        if run is not None and run_status(store, run) is None:
            raise Failed(f"no run {run}")
        state = AlertState.FIRING if firing else None
        rows, _ = alert_page(store, run_id=run, state=state, limit=limit)
    if jsonl:
        for row in rows:
            click.echo(json.dumps({**row.to_dict(), "text": alert_text(row)}))
        return
    table = [COLUMNS]
    for row in rows:
        resolved = "" if row.resolved_step is None else str(row.resolved_step)
        table.append(
            [
                str(row.id),
                f"#{row.run_id} {row.run_name}",
                row.rule if not row.detail else f"{row.rule} ({row.detail})",
                row.state,
                f"{row.fired_step}-{resolved}",
                _when(row.fired_at),
                _when(row.resolved_at),
                _said(row.kind, row.value),
                _said(row.kind, row.threshold),
            ]
        )
    for line in aligned(table):
        click.echo(line)
