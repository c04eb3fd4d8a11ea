"""Mirrors: each step's loss scale and its other values in the trackers a team already
watches (TensorBoard, MLflow, W&B), beside the store.

Given to a scaler (``GradScaler(..., mirrors=[TensorBoard("./tb")])``) or named in
``$SCALEWATCH_MIRROR`` (``tensorboard:./tb,mlflow``). Only the reporting rank's mirrors
write: each attaches to the tracker's run on the training thread as the run opens (its
first step), then a thread of its own (``_feed``) writes the steps its telemetry was
handed, in batches, under ``scalewatch/``. A tracker that is slow or fails costs the
training thread nothing and the store no record.
"""

from __future__ import annotations

from ._base import Mirror, MirroredStep, RunLinks
from ._mlflow import MLflow
from ._tensorboard import TensorBoard
from ._wandb import WandB

__all__ = ["MLflow", "Mirror", "MirroredStep", "RunLinks", "TensorBoard", "WandB"]
