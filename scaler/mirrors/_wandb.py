"""``WandB``: steps as the history of the user's W&B run, offline mode included."""

from __future__ import annotations

from typing import Any

from ._base import PREFIX, Mirror, MirroredStep, RunLinks, require

STEP_METRIC = PREFIX + "step"


class WandB(Mirror):
    """Logs each step's values to W&B against ``scalewatch/step`` (the optimizer step), so
    that they keep their own axis beside the user's ``wandb.log`` calls.

    It writes to ``wandb.run`` as the scaler's run opens (its first step), online or
    offline; with none, it starts one as ``wandb.init()`` would (``WANDB_*`` settings) and
    finishes it when the scaler closes. Needs ``pip install scalewatch[wandb]``.
    """

    name = "wandb"

    def __init__(self) -> None:
        super().__init__()
        self._wandb: Any = require("wandb", "wandb", "scalewatch.mirrors.WandB")
        self._run: Any = None
        self._started = False
        self._defined = False

    def attach(self) -> None:
        self._run = self._wandb.run
        self._started = self._defined = False

    def _the_run(self) -> Any:
        if self._run is None:
            self._run = self._wandb.init()
            self._started = True
        run = self._run
        if not self._defined:
            run.define_metric(STEP_METRIC, hidden=True)
            run.define_metric(PREFIX + "*", step_metric=STEP_METRIC)
            self._defined = True
        return run

    def describe(self, links: RunLinks) -> None:
        self._the_run().config.update(links.as_tags(), allow_val_change=True)

    def write(self, steps: list[MirroredStep]) -> None:
        run = self._the_run()
        for step in steps:
            run.log({STEP_METRIC: step.step, **step.values})

    def close(self) -> None:
        if self._started and self._run is not None:
            self._run.finish()
        self._run = None
        self._started = False
