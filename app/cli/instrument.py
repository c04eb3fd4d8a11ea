"""``scalewatch instrument -- COMMAND``: run COMMAND with scalewatch's scalers in place of
torch's, in every Python process it starts (see :mod:`scalewatch.instrument`)."""

from __future__ import annotations

import os
import sys

import click

from scalewatch.store.spikes import SKIP_ENV, skip_thresholds

from ._common import Failed, Refused, command, db_option

__all__ = ["instrument"]

USAGE = "give the command to run after --, as: scalewatch instrument -- torchrun ... train.py"


@command(
    "instrument",
    help="Run a command with scalewatch's scalers in place of torch's.",
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@db_option
@click.option("--run-name", metavar="NAME", help="the run's name (default: $SCALEWATCH_RUN_NAME)")
@click.option(
    "--no-grad-norm",
    is_flag=True,
    help="do not measure each step's gradient norm (measured by default; a scaler made with"
    " grad_norm= keeps its own choice)",
)
@click.option(
    "--skip-on-spike",
    metavar="THRESHOLDS",
    help="skip a step whose gradient norm or loss spikes: grad_norm_z=Z and/or loss_z=Z,"
    " comma-separated (default: $SCALEWATCH_SKIP_ON_SPIKE, else off)",
)
@click.argument("command_line", nargs=-1, type=click.UNPROCESSED, metavar="-- COMMAND [ARGS...]")
def instrument(
    db: str | None,
    run_name: str | None,
    no_grad_norm: bool,
    skip_on_spike: str | None,
    command_line: tuple[str, ...],
) -> None:
    argv = list(command_line)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        raise Refused(USAGE)
    from scalewatch.instrument import site_dir

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(site_dir()), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])]
    )
    if db:
        env["SCALEWATCH_DB"] = db
    if run_name:
        env["SCALEWATCH_RUN_NAME"] = run_name
    env["SCALEWATCH_GRAD_NORM"] = "0" if no_grad_norm else "1"
    if skip_on_spike is not None:
        try:  # refused here, in one line, not in every rank of the job
            skip_thresholds(skip_on_spike)
        except ValueError as error:
            raise Refused(str(error).replace(f"${SKIP_ENV}", "--skip-on-spike")) from None
        env[SKIP_ENV] = skip_on_spike
    sys.stdout.flush()
    try:  # COMMAND takes this process's place: its exit status and signals are its own
        os.execvpe(argv[0], argv, env)
    except OSError as error:
        raise Failed(f"cannot run {argv[0]}: {error.strerror}", 127) from None
