"""A scaler's state: torch's dicts with ours beside them, typed checkpoints, pickling.

``state_dict()`` is torch's five entries and ``"scalewatch"`` (the extras, the step count,
the run); a dict of torch's loads too, and starts a new run. A copy of a scaler (pickle,
deepcopy) leaves its transient parts (``_TRANSIENT``) behind and makes them anew.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._extras import Extras
from ._recording import RunLink
from .stats import ScalerCheckpoint

if TYPE_CHECKING:
    from ._torch_compat import TorchGradScaler as _Base
else:
    _Base = object

STATE_KEY = "scalewatch"


class Persisted(_Base):
    """The persistence half of :class:`scaler._scaler.Instrumented`."""

    _extras: Extras
    _link: RunLink
    _run_uid: str | None
    _step_count: int
    _control_version: int
    _TRANSIENT: tuple[str, ...]

    def state_dict(self) -> dict[str, Any]:
        """torch's five entries plus ``"scalewatch"`` (extras, step count, run id).

        .. warning:: like torch's, reads the scale: a CPU-GPU sync.
        """
        state = super().state_dict()
        if self._enabled:
            state[STATE_KEY] = {
                "step": self._step_count,
                "run_uid": self._run_uid,
                **self._extras.state(),
                "control_version": self._control_version,
            }
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Loads torch's dicts and ours: ours continue their run and its step count, a torch
        dict starts a new run. Steps already recorded of another run stay in that one,
        which is finished first.
        """
        super().load_state_dict(state_dict)
        if not self._enabled:
            return
        extras = state_dict.get(STATE_KEY)
        run_uid = None if extras is None else extras.get("run_uid")
        recorder = self._link.recorder
        recording = recorder is not None and not recorder.closed
        if recording and (extras is None or run_uid != self._run_uid):
            self.close()
        self._run_uid = run_uid
        self._step_count = 0 if extras is None else int(extras["step"])
        if extras is not None:
            self._extras.load(extras)
            self._control_version = int(extras.get("control_version", 0))
        self._clamp_scale()
        self._link.scale_host = self._extras.clamped(float(state_dict["scale"]))

    def checkpoint(self) -> ScalerCheckpoint:
        """A typed ``state_dict()``. Reads the scale: a CPU-GPU sync."""
        if not self._enabled:
            raise RuntimeError(
                "checkpoint(): this scaler is disabled and holds no state (its state_dict() is {})"
            )
        return ScalerCheckpoint(
            scale=self.get_scale(),
            growth_factor=self._growth_factor,
            backoff_factor=self._backoff_factor,
            growth_interval=self._growth_interval,
            growth_tracker=self._get_growth_tracker(),
            min_scale=self._extras.min_scale,
            max_scale=self._extras.max_scale,
            hysteresis=self._extras.hysteresis,
            hysteresis_tracker=self._extras.hysteresis_value(),
            step=self._step_count,
            run_uid=self._run_uid,
            control_version=self._control_version,
        )

    def load_checkpoint(self, checkpoint: ScalerCheckpoint) -> None:
        """Restore a ``checkpoint()``."""
        data = checkpoint.to_dict()
        self.load_state_dict(
            {
                "scale": checkpoint.scale,
                "growth_factor": checkpoint.growth_factor,
                "backoff_factor": checkpoint.backoff_factor,
                "growth_interval": checkpoint.growth_interval,
                "_growth_tracker": checkpoint.growth_tracker,
                STATE_KEY: {
                    key: data[key]
                    for key in (
                        "step",
                        "run_uid",
                        "min_scale",
                        "max_scale",
                        "hysteresis",
                        "hysteresis_tracker",
                        "control_version",
                    )
                },
            }
        )

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_extras"] = self._extras.for_pickle()
        for name in self._TRANSIENT:
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._reset_transient()

    if TYPE_CHECKING:  # Instrumented's

        def _clamp_scale(self) -> None: ...

        def _reset_transient(self) -> None: ...

        def close(self) -> None: ...
