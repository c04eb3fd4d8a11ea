"""``scalewatch spool``: the batches that jobs of this node could not send to the service,
listed, and sent by hand (with ``$SCALEWATCH_TOKEN``)."""

from __future__ import annotations

import click

from ._common import Command, Failed, aligned

__all__ = ["spool"]

COLUMNS = ["RUN UID", "NAME", "SERVICE", "BATCHES", "BYTES", "STATE"]

dir_option = click.option(
    "--dir",
    "folder",
    envvar="SCALEWATCH_SPOOL_DIR",
    show_envvar=True,
    metavar="PATH",
    help="the spool folder (default: scalewatch-spool-<uid> in the temporary folder)",
)


@click.group(
    "spool",
    help="Records of jobs on this node that wait for the service (SCALEWATCH_DB=http://...).",
)
def spool() -> None:
    pass


@spool.command("list", cls=Command, help="List the runs whose records wait in the spool.")
@dir_option
def list_spool(folder: str | None) -> None:
    from scalewatch.spool import spool_root, spooled_runs

    table = [COLUMNS]
    for run in spooled_runs(spool_root(folder)):
        state = "job running" if run.held else "to send"
        table.append([run.uid, run.name, run.url, str(run.batches), str(run.bytes), state])
    for line in aligned(table):
        click.echo(line)


@spool.command(
    "send",
    cls=Command,
    help="Send the spooled records of jobs no longer running to their service, in order,"
    " with $SCALEWATCH_TOKEN (the writer's that made the run, or an admin's).",
)
@dir_option
def send(folder: str | None) -> None:
    from scalewatch.spool import send_orphans, spool_root

    results = send_orphans(spool_root(folder))
    for uid, what in results:
        click.echo(f"{uid}: {what}")
    if any("left in the spool" in what for _, what in results):
        raise Failed("some runs stay in the spool; `scalewatch spool list` shows them")
