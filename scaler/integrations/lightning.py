"""``LossScaleLogger``: a Lightning callback that logs each step's loss scale, overflow,
skip, tracker and learning rate (``scalewatch/...``) to every logger of the Trainer.

Runs on the training thread, at each batch's end, with what the reporting rank's tap
holds (``_tap``); the Trainer's loggers write on global rank 0.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import Callback

from ..mirrors import MirroredStep
from ._tap import StepTap, tap


class LossScaleLogger(Callback):
    """``Trainer(callbacks=[LossScaleLogger()], plugins=[MixedPrecision(..., scaler=ours)])``
    (or the scaler ``precision="16-mixed"`` builds under ``scalewatch instrument``): each
    optimizer step's values reach every logger at that step. They arrive from the
    scaler's recorder in batches (about a second behind); the last are logged as training
    ends."""

    def __init__(self) -> None:
        self._tap: StepTap | None = None

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        self._tap = tap(scaler, "Lightning's Trainer", self._tap)

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._tap is not None:
            _log(trainer, self._tap.take())

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._tap is not None:
            scaler = trainer.precision_plugin.scaler  # type: ignore[attr-defined]
            _log(trainer, self._tap.take(until=scaler.steps))


def _log(trainer: Trainer, steps: list[MirroredStep]) -> None:
    for step in steps:
        for logger in trainer.loggers:
            logger.log_metrics(step.values, step=step.step)
