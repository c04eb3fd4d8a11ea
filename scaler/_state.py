"""A scaler's own state beside torch's: what ``state_dict()`` adds, and a checkpoint's dict.

Runs on the training thread of every rank. ``state_dict()`` is torch's five entries and
``"scalewatch"`` (``STATE_KEY``: the extras, the step count, the run); a dict of torch's
loads too, and starts a new run. A copy of a scaler (pickle, deepcopy) leaves its
transient parts behind and makes them anew.
"""

from __future__ import annotations

from typing import Any

from ._extras import Extras
from .stats import ScalerCheckpoint

STATE_KEY = "scalewatch"
# What a checkpoint's STATE_KEY entry holds (the rest of it is torch's entries).
_CHECKPOINT_KEYS = (
    "step",
    "run_uid",
    "min_scale",
    "max_scale",
    "hysteresis",
    "hysteresis_tracker",
    "control_version",
)


def our_state(
    step: int, run_uid: str | None, extras: Extras, control_version: int
) -> dict[str, Any]:
    """The ``STATE_KEY`` entry of a ``state_dict()``.

    .. warning:: reads the hysteresis tracker, if there is one: a CPU-GPU sync.
    """
    return {
        "step": step,
        "run_uid": run_uid,
        **extras.state(),
        "control_version": control_version,
    }


def checkpoint_state_dict(checkpoint: ScalerCheckpoint) -> dict[str, Any]:
    """``checkpoint`` as the ``state_dict()`` it was made from."""
    data = checkpoint.to_dict()
    return {
        "scale": checkpoint.scale,
        "growth_factor": checkpoint.growth_factor,
        "backoff_factor": checkpoint.backoff_factor,
        "growth_interval": checkpoint.growth_interval,
        "_growth_tracker": checkpoint.growth_tracker,
        STATE_KEY: {key: data[key] for key in _CHECKPOINT_KEYS},
    }
