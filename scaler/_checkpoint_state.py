"""A scaler's own state beside torch's: what ``state_dict()`` adds, a checkpoint's dict, and
the note a load leaves in its run.

Runs on the training thread of every rank. ``state_dict()`` is torch's five entries and
``"scalewatch"`` (``STATE_KEY``: the extras, the step count, the run and, with
``skip_on_spike``, its windows under ``SPIKE_WINDOWS``), which torch's ``load_state_dict``
leaves unread; a dict of torch's loads too, and starts a new run (its windows empty). A
copy of a scaler (pickle, deepcopy) leaves its transient parts behind and makes them anew.

A load into a run that has steps is recorded in it (``note_load``): the step, the scale
before and after, and whether the scale jumped. Only the reporting rank records it: the
others have no telemetry.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from ._recording import RunSession
from ._scale_rules import ScaleRules
from .stats import ScalerCheckpoint
from .store.records import ScaleLoad

STATE_KEY = "scalewatch"
# In the STATE_KEY entry: skip_on_spike's windows, by signal, oldest value first.
SPIKE_WINDOWS = "spike_windows"
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
    step: int,
    run_uid: str | None,
    rules: ScaleRules,
    control_version: int,
    spike_windows: dict[str, torch.Tensor],
) -> dict[str, Any]:
    """The ``STATE_KEY`` entry of a ``state_dict()`` (``spike_windows``: none, no entry).

    .. warning:: reads the hysteresis tracker, if there is one: a CPU-GPU sync.
    """
    state = {
        "step": step,
        "run_uid": run_uid,
        **rules.state(),
        "control_version": control_version,
    }
    if spike_windows:
        state[SPIKE_WINDOWS] = spike_windows
    return state


def loaded_spike_windows(ours: dict[str, Any] | None) -> dict[str, torch.Tensor]:
    """The spike windows a ``STATE_KEY`` entry carries (none in torch's dict, or in ours
    from before they were saved: the windows start empty)."""
    windows = None if ours is None else ours.get(SPIKE_WINDOWS)
    return dict(windows) if isinstance(windows, dict) else {}


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


def note_load(
    session: RunSession,
    before: tuple[float, int] | None,
    scale: float,
    step: int,
    run_uid: str | None,
) -> None:
    """Record a load of the scaler's state that left it at ``scale`` and step count ``step``.

    ``before``: (scale, step count) before the load, read where the load continues the run
    that this scaler records (its telemetry still open); the event goes to that run's
    writer at once. Otherwise a load that names a run (``run_uid``: a new process
    resuming it) waits for the telemetry its first step opens, whose writer takes the
    scale before from the run's last stored step. A load of torch's own dict starts a
    run of its own: nothing to record.
    """
    at = time.time()
    telemetry = session.telemetry
    if before is not None and telemetry is not None and not telemetry.closed:
        load = ScaleLoad(
            step=step, at=at, scale_after=scale, scale_before=before[0], from_step=before[1]
        )
        telemetry.note_scale_load(load)
    elif run_uid is not None:
        session.pending_load = ScaleLoad(step=step, at=at, scale_after=scale)
