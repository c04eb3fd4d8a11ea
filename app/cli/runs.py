"""``scalewatch runs``: the runs in the store, as a table."""

from __future__ import annotations

import click

from app.cli._common import command, db_option, existing_store

__all__ = ["runs"]

COLUMNS = ["ID", "NAME", "STATUS", "WORLD", "STEPS", "SCALE", "OVERFLOWS", "SKIPPED"]


@command("runs", help="List the runs in the store.")
@db_option
def runs(db: str | None) -> None:
    from scaler.store import queries
    from scaler.store.engine import open_store

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
