"""``scalewatch demo``: train a small fp16 model on several ranks and watch it live."""

from __future__ import annotations

import sys

import click

from . import _demo as demo_run
from ._common import Failed, Refused, command, db_option, settings

__all__ = ["demo"]


@command("demo", help="Train a small fp16 model on several ranks and watch it live.")
@click.option(
    "--steps",
    type=click.IntRange(min=1),
    default=demo_run.DEFAULT_STEPS,
    show_default=True,
    help="training steps (the default takes about 25 minutes on 2 cores: time to try a"
    " control request)",
)
@click.option("--world-size", type=click.IntRange(min=1), default=2, show_default=True,
              help="ranks")  # fmt: skip
@click.option("--run-name", default="tiny-lm-fp16", show_default=True, help="the run's name")
@db_option
@click.option("--port", type=int, help="dashboard port (default 8765)")
def demo(steps: int, world_size: int, run_name: str, db: str | None, port: int | None) -> None:
    from scalewatch.examples.tiny_lm import world_size_refused

    from ._serving import BindRefused, CannotServe, ready_to_serve

    too_many = world_size_refused(world_size)
    if too_many is not None:  # before anything starts: the trainer would refuse it too
        raise Refused(too_many)
    try:  # the store is migrated once here, before the ranks and the server start
        served, sock = ready_to_serve(settings(port=port), out=sys.stdout)
        code = demo_run.run(served, sock, steps=steps, world_size=world_size, run_name=run_name)
    except BindRefused as refused:
        raise Refused(str(refused)) from None
    except CannotServe as refused:
        raise Failed(str(refused), refused.code) from None
    if code:
        click.get_current_context().exit(code)
