"""``scalewatch runs``: the runs in the store, as a table."""

from __future__ import annotations

import click

from ._common import aligned, command, db_option, existing_store

__all__ = ["runs"]

COLUMNS = ["ID", "NAME", "STATUS", "WORLD", "STEPS", "SCALE", "OVERFLOWS", "SKIPPED"]


@command("runs", help="List the runs in the store.")
@db_option
def runs(db: str | None) -> None:
    from scalewatch.store import queries
    from scalewatch.store.engine import open_store

    with open_store(existing_store(), check=True) as store:
        infos = queries.list_runs(store)
    table = [COLUMNS]
    for run in infos:
        scale = "-" if run.scale is None else f"{run.scale:g}"
        table.append(
            [
                str(run.id),
                run.name,
                run.status,
                str(run.world_size),
                str(run.steps),
                scale,
                str(run.overflows),
                f"{run.skipped_rate:.2%}",
            ]
        )
    for line in aligned(table):
        click.echo(line)
