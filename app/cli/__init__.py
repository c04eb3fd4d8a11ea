"""The ``scalewatch`` command line, on click: one module per command (group), in the
command's own process. What the commands share is in private modules: ``_common``
(options, the store a command opens), ``_serving`` (the token and the bind checks of
``serve`` and ``demo``), ``_demo`` (what ``demo`` runs) and ``_store_files`` (which
SQLite file a command may open).

>>> sorted(cli.commands)
['alerts', 'control', 'db', 'demo', 'export', 'instrument', 'runs', 'serve', 'spool', 'tokens']
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import click

from . import alerts, control, db, demo, export, instrument, runs, serve, spool, tokens

__all__ = ["cli", "main"]

cli = click.Group(
    "scalewatch",
    help="Loss-scale telemetry of fp16 training: serve the dashboard, list and export runs,"
    " change a running job's scaler.",
    commands=[
        serve.serve,
        runs.runs,
        export.export,
        control.control,
        alerts.alerts,
        db.db,
        demo.demo,
        instrument.instrument,
        tokens.tokens,
        spool.spool,
    ],
)
# The installed distribution's version, as ``pip show scalewatch`` gives it.
click.version_option(package_name="scalewatch", prog_name="scalewatch")(cli)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default: this process's); its exit status."""
    try:
        cli.main(args=None if argv is None else list(argv), prog_name="scalewatch")
    except SystemExit as done:
        if done.code is None or isinstance(done.code, int):
            return done.code or 0
        print(done.code, file=sys.stderr)
        return 1
    return 0
