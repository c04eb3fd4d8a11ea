"""``report_loss_scale(trainer)``: Hugging Face's Trainer logs each step's loss scale,
overflow, skip, tracker and learning rate (``scalewatch/...``) with its own logs, so that
every ``report_to`` gets them.

Runs on the training thread, in the Trainer's ``on_log``, with what the reporting rank's
tap holds (``_tap``).
"""

from __future__ import annotations

from typing import Any

from transformers import Trainer, TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from ..mirrors._base import PREFIX
from ._tap import StepTap, tap

STEP_KEY = PREFIX + "step"  # the step the values are of


class LossScaleCallback(TrainerCallback):
    """Adds the latest recorded step's values to each training log of the Trainer, with
    that step's number (``scalewatch/step``).

    It must come before the reporting callbacks, which the Trainer puts first:
    :func:`report_loss_scale` adds it there."""

    def __init__(self) -> None:
        self._tap: StepTap | None = None

    @property
    def recorded_step(self) -> int | None:
        """The latest step whose values have come (None before the first)."""
        latest = None if self._tap is None else self._tap.last
        return None if latest is None else latest.step

    def on_train_begin(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        optimizer: Any = None,
        **kwargs: Any,
    ) -> None:
        # accelerate's AcceleratedOptimizer holds the scaler it steps with
        self._tap = tap(getattr(optimizer, "scaler", None), "Hugging Face's Trainer", self._tap)

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if self._tap is None or logs is None or any(k.startswith("eval_") for k in logs):
            return
        latest = self._tap.last  # the latest step recorded: a second behind, or less
        if latest is not None:
            logs.update(latest.values)
            logs[STEP_KEY] = latest.step

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self._tap is not None:
            self._tap.take()  # only the latest is logged here


def report_loss_scale(trainer: Trainer) -> LossScaleCallback:
    """Make ``trainer`` log the loss scale with its own logs (to every ``report_to``), from
    the scaler it steps with (``trainer.accelerator.scaler``); returns the callback added."""
    callback = LossScaleCallback()
    trainer.callback_handler.callbacks.insert(0, callback)  # before the reporters
    return callback
