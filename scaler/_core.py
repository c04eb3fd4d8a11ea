"""What GradScaler and ShardedGradScaler add to torch's classes, written once."""

from __future__ import annotations

import dataclasses
import threading
import time
import weakref
from collections import defaultdict, deque
from typing import TYPE_CHECKING, Any

import torch

from . import _control
from ._control import ControlUpdate
from ._pinned import PinnedRings
from ._recorder import Captured, ControlOutcome, ControlSource, Recorder, Snapshot
from ._torch_compat import OptState, _refresh_per_optimizer_state, process_group_info
from .stats import ScalerCheckpoint, ScalerStats

if TYPE_CHECKING:
    from ._torch_compat import TorchGradScaler as _Base
else:
    _Base = object

STATE_KEY = "scalewatch"


class ScalerConfigError(ValueError, AssertionError):
    """A constructor or setter value that would break training.

    It is a ValueError; it is also an AssertionError because torch raises that
    for the same growth/backoff checks, so code catching either keeps working.
    """


class _ConfigTypeError(TypeError, ScalerConfigError):
    """A value that is no number at all: torch's own checks raise TypeError for it."""


def _refusal(problem: str, *values: object) -> ScalerConfigError:
    """The error for ``problem``: a TypeError too when one of ``values`` is no number."""
    if any(not isinstance(v, int | float) for v in values):  # a bool is an int
        return _ConfigTypeError(problem)
    return ScalerConfigError(problem)


def torch_arguments(
    *,
    init_scale: float,
    growth_factor: float,
    backoff_factor: float,
    growth_interval: int,
    min_scale: float | None,
    max_scale: float | None,
    hysteresis: int | None,
) -> tuple[float, float, float, int]:
    """Check the constructor's values; returns torch's four, a one-element tensor (which
    torch takes too) as the number it holds."""
    plain: list[Any] = [
        value.item() if isinstance(value, torch.Tensor) and value.numel() == 1 else value
        for value in (init_scale, growth_factor, backoff_factor, growth_interval)
    ]
    init_scale, growth_factor, backoff_factor, growth_interval = plain
    if _control.normalise("scale", init_scale) is None:
        raise _refusal(f"init_{_control.RULES['scale']}", init_scale)
    values: dict[str, Any] = {
        "growth_factor": growth_factor,
        "backoff_factor": backoff_factor,
        "growth_interval": growth_interval,
    }
    values.update(
        {
            k: v
            for k, v in (
                ("min_scale", min_scale),
                ("max_scale", max_scale),
                ("hysteresis", hysteresis),
            )
            if v is not None
        }
    )
    problem = _control.check(values, {})
    if problem is not None:
        raise _refusal(problem, *values.values())
    if isinstance(growth_interval, float):
        raise ScalerConfigError(f"growth_interval must be an integer, got {growth_interval!r}")
    return init_scale, growth_factor, backoff_factor, growth_interval


class Instrumented(_Base):
    """The scalewatch extras over torch's GradScaler state machine."""

    _step_count: int
    _control_version: int

    def _setup_extras(
        self,
        *,
        min_scale: float | None,
        max_scale: float | None,
        hysteresis: int | None,
        telemetry: Any,
        run_name: str | None,
    ) -> None:
        self._min_scale = None if min_scale is None else float(min_scale)
        self._max_scale = None if max_scale is None else float(max_scale)
        self._hysteresis = hysteresis
        self._init_hysteresis_tracker = hysteresis
        if self._enabled:
            self._clamp_scale()  # an init_scale outside min/max_scale starts at the bound
        self._telemetry_option = telemetry
        self._run_name = run_name
        self._run_uid: str | None = None
        self._step_count = 0
        self._control_version = 0
        self._reset_transient()

    def _reset_transient(self) -> None:
        self._hysteresis_tracker: torch.Tensor | None = None
        self._recorder: Recorder | None = None
        self._pinned = PinnedRings()
        self._telemetry: Any = None
        self._inbox: deque[ControlUpdate] = deque()
        self._code_outcomes: list[ControlOutcome] = []
        self._scale_host: float | None = None
        self._last_found: torch.Tensor | None = None
        self._group: tuple[int, int] | None = None
        self._closer: weakref.finalize[Any, Any] | None = None
        self._last_run_id: int | None = None
        self._closed_telemetry_dropped = 0  # records earlier telemetry of this scaler lost

    # ------------------------------------------------------------------ steps

    def update(self, new_scale: float | torch.Tensor | None = None) -> None:
        if not self._enabled:
            return
        scale, tracker = self._check_scale_growth_tracker("update")
        # torch's step() marks the optimizers it stepped (or skipped for inf/NaN). step() is
        # not overridden: torch's warnings in it name the caller's line, as with torch's.
        stepped = any(
            state["stage"] is OptState.STEPPED for state in self._per_optimizer_states.values()
        )
        found: torch.Tensor | None = None
        flags = self._step_flags()
        # Read before _controls_for_step(), which forgets this step's payloads.
        width = self._attribution_width()
        if new_scale is not None:
            # The step may have been skipped for inf/NaN: its record says so all the same.
            # Summed apart from the optimizers' own flags: torch's update(new_scale) leaves
            # them as they are (a refused new_scale leaves the scaler to step them still).
            found = self._combined_found_inf(scale, required=False, in_place=False)
            super().update(new_scale)
            self._clamp_scale()
            scale_set = True
        else:
            found = self._combined_found_inf(scale)
            assert found is not None
            self._update_scale(scale, tracker, found)
            self._per_optimizer_states = defaultdict(_refresh_per_optimizer_state)
            scale_set = False
        self._step_count += 1
        outcomes = self._code_outcomes
        self._code_outcomes = []
        for update, refusal in self._controls_for_step():
            outcome = self._apply_control(update, refusal)
            scale_set = scale_set or (outcome.applied and "scale" in update.values)
            outcomes.append(outcome)
        self._last_found = found
        self._snapshot(found, flags, width, stepped, scale_set, tuple(outcomes))

    def _combined_found_inf(
        self, scale: torch.Tensor, required: bool = True, in_place: bool = True
    ) -> torch.Tensor | None:
        """The optimizers' found_inf summed, into the first one's as torch's update() does
        (``in_place``), or into a new tensor (then a fused optimizer's 0-d flag and another
        optimizer's one-element flag add up too)."""
        # As torch: if every found_inf lives on the scale's device this is asynchronous.
        found_infs = [
            found_inf.to(device=scale.device, non_blocking=True)
            for state in self._per_optimizer_states.values()
            for found_inf in state["found_inf_per_device"].values()
        ]
        if len(found_infs) == 0:
            if not required:
                return None
            raise AssertionError("No inf checks were recorded prior to update.")
        if not in_place:
            return torch.stack([found.reshape(()) for found in found_infs]).sum()
        combined: torch.Tensor = found_infs[0]
        for other in found_infs[1:]:
            combined += other
        return combined

    def _update_scale(
        self, scale: torch.Tensor, tracker: torch.Tensor, found: torch.Tensor
    ) -> None:
        if self._hysteresis is None:
            self._torch_update(scale, tracker, found)
        else:
            self._hysteresis_update(scale, tracker, found, self._hysteresis)
        if self._min_scale is not None or self._max_scale is not None:
            scale.clamp_(min=self._min_scale, max=self._max_scale)

    def _clamp_scale(self) -> None:
        """Keep the scale, and the one a lazy scaler starts from, within min/max_scale."""
        if self._min_scale is None and self._max_scale is None:
            return
        self._init_scale = self._clamped(self._init_scale)
        if self._scale is not None:
            self._scale.clamp_(min=self._min_scale, max=self._max_scale)

    def _clamped(self, scale: float) -> float:
        if self._min_scale is not None:
            scale = max(scale, self._min_scale)
        return scale if self._max_scale is None else min(scale, self._max_scale)

    def _torch_update(
        self, scale: torch.Tensor, tracker: torch.Tensor, found: torch.Tensor
    ) -> None:
        raise NotImplementedError

    def _hysteresis_update(
        self, scale: torch.Tensor, tracker: torch.Tensor, found: torch.Tensor, hysteresis: int
    ) -> None:
        """Megatron's rule: back off only after ``hysteresis`` overflows since the last growth."""
        hyst = self._hysteresis_tensor(scale.device)
        overflow = found.reshape(()) > 0
        successful = tracker + 1
        grow = ~overflow & (successful >= self._growth_interval)
        new_hyst = torch.where(overflow, hyst - 1, torch.where(grow, hysteresis, hyst))
        backoff = overflow & (new_hyst <= 0)
        one = torch.ones((), dtype=torch.float64, device=scale.device)
        factor = torch.where(
            backoff, self._backoff_factor, torch.where(grow, self._growth_factor, one)
        )
        grown = self._multiply_scale(scale, factor)
        keep = grow & ~torch.isfinite(grown)
        scale.copy_(torch.where(keep, scale, grown))
        tracker.copy_(torch.where(overflow | grow, torch.zeros_like(tracker), successful))
        hyst.copy_(new_hyst)

    def _multiply_scale(self, scale: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
        """``scale * factor`` rounded as torch's update rounds it."""
        # torch's kernel multiplies in double and rounds once to float.
        return (scale.double() * factor).float()

    def _hysteresis_tensor(self, device: torch.device) -> torch.Tensor:
        if self._hysteresis_tracker is None:
            start = self._init_hysteresis_tracker
            if start is None:
                start = self._hysteresis or 1
            self._hysteresis_tracker = torch.full((), start, dtype=torch.int32, device=device)
        return self._hysteresis_tracker

    # -------------------------------------------------------- telemetry hooks

    def _step_flags(self) -> list[torch.Tensor]:
        """The all-reduced per-rank flag payloads of this step (none for GradScaler)."""
        return []

    def _attribution_width(self) -> int:
        """How many rank flags the payloads carry; 0: single process; -1: unknown."""
        return 0

    def _snapshot(
        self,
        found: torch.Tensor | None,
        flags: list[torch.Tensor],
        width: int,
        stepped: bool,
        scale_set: bool,
        outcomes: tuple[ControlOutcome, ...],
    ) -> None:
        assert self._scale is not None and self._growth_tracker is not None
        recorder = self._recorder
        if recorder is None or recorder.closed:
            recorder = self._recorder = Recorder(self._init_scale, self._make_sink(), recorder)
            self._close_when_dropped(recorder)
        recorder.submit(
            Snapshot(
                step=self._step_count,
                wall_time=time.time(),
                captured=Captured(self._scale, self._growth_tracker, found, flags, self._pinned),
                world_size=width,
                scale_used=self._scale_host,
                stepped=stepped,
                growth_interval=self._growth_interval,
                growth_factor=self._growth_factor,
                backoff_factor=self._backoff_factor,
                control_version=self._control_version,
                scale_set=scale_set,
                controls=outcomes,
            )
        )
        self._scale_host = None

    def _make_sink(self) -> Any:
        """The telemetry writer's intake on the reporting rank; None elsewhere or when off."""
        option = self._telemetry_option
        info = self._group_info()
        if option is False or (info is not None and info[0] != 0):
            return None
        from .telemetry import Telemetry

        self._telemetry = Telemetry(
            None if option is None or option is True else option,
            name=self._run_name,
            world_size=1 if info is None else info[1],
            config=self._config(),
            control=self.control_state(),
            inbox=self._inbox,
            uid=self._run_uid,
        )
        self._run_uid = self._telemetry.uid
        return self._telemetry.submit

    def _close_when_dropped(self, recorder: Recorder) -> None:
        """Close ``recorder`` and the telemetry it feeds when this scaler is garbage-collected
        or at interpreter exit, whichever comes first: a scaler that is a local of a training
        function and never closed still has every step written and its run marked finished.
        """
        if self._closer is not None:
            self._closer.detach()
        self._closer = weakref.finalize(self, _close_parts, recorder, self._telemetry)

    def _group_info(self) -> tuple[int, int] | None:
        """(rank, size) of the group whose rank 0 reports; None for a single process.

        Looked up once (a group, once joined, keeps its rank and size), not every step.
        """
        if self._group is None:
            self._group = process_group_info(self._reporting_group())
        return self._group

    def _reporting_group(self) -> Any:
        """The process group whose rank 0 reports (None: the default, global ranks)."""
        return None

    def _config(self) -> dict[str, Any]:
        return {
            "class": type(self).__name__,
            "device": self._device,
            "init_scale": self._init_scale,
            "growth_factor": self._growth_factor,
            "backoff_factor": self._backoff_factor,
            "growth_interval": self._growth_interval,
            "min_scale": self._min_scale,
            "max_scale": self._max_scale,
            "hysteresis": self._hysteresis,
        }

    @property
    def run_uid(self) -> str | None:
        """The telemetry run this scaler writes to (None before the first update or when off)."""
        return self._run_uid

    @property
    def run_id(self) -> int | None:
        """The run's id in the store, once the writer has created it."""
        return self._last_run_id if self._telemetry is None else self._telemetry.run_id

    # ---------------------------------------------------------------- control

    def _controls_for_step(self) -> list[tuple[ControlUpdate, str | None]]:
        """Requests every rank applies at this update() boundary, each with a refusal or None."""
        return []

    def control_state(self) -> dict[str, float | int | None]:
        """The factors in effect (no scale: reading it would sync)."""
        return {
            "growth_interval": self._growth_interval,
            "growth_factor": self._growth_factor,
            "backoff_factor": self._backoff_factor,
            "min_scale": self._min_scale,
            "max_scale": self._max_scale,
            "hysteresis": self._hysteresis,
        }

    def _apply_control(self, update: ControlUpdate, refusal: str | None = None) -> ControlOutcome:
        problem = refusal or _control.check(update.values, self.control_state())
        if problem is None:
            for name, value in update.values.items():
                self._set_field(name, value)
            self._control_version += 1
        return ControlOutcome(
            source=ControlSource.REQUEST,
            request_id=update.request_id,
            values=dict(update.values),
            applied=problem is None,
            reason=problem,
            state=self.control_state(),
            version=self._control_version,
        )

    def _set_field(self, name: str, value: float | int) -> None:
        """Apply one validated value so that the rule holds from the next update on."""
        if name == "growth_interval":
            self._growth_interval = int(value)
            # torch grows only when tracker + 1 == interval: never leave the tracker past it.
            if self._growth_tracker is not None:
                self._growth_tracker.clamp_(max=int(value) - 1)
            self._init_growth_tracker = min(self._init_growth_tracker, int(value) - 1)
        elif name in ("growth_factor", "backoff_factor"):
            setattr(self, f"_{name}", value)  # as given, as torch's setters keep it
        elif name == "scale":
            if self._scale is not None:
                self._scale.fill_(float(value))
            self._init_scale = float(value)
        elif name in ("min_scale", "max_scale"):
            setattr(self, f"_{name}", float(value))
            self._clamp_scale()
        elif name == "hysteresis":
            self._hysteresis = int(value)
            if self._hysteresis_tracker is not None:
                self._hysteresis_tracker.clamp_(max=int(value))
            start = self._init_hysteresis_tracker
            self._init_hysteresis_tracker = int(value) if start is None else min(start, int(value))

    def _set_by_code(self, name: str, value: float | int) -> None:
        problem = _control.check({name: value}, self.control_state() if self._enabled else {})
        if problem is not None:
            raise _refusal(problem, value)
        if not self._enabled:  # as torch: only the attribute, which a disabled scaler ignores
            setattr(self, f"_{name}", value)
            return
        self._set_field(name, value)
        self._control_version += 1
        state = self.control_state()
        self._code_outcomes.append(
            ControlOutcome(
                ControlSource.CODE, None, {name: value}, True, None, state, self._control_version
            )
        )

    def set_growth_factor(self, new_factor: float) -> None:
        """Set a new scale growth factor (> 1); recorded in the audit trail as a change by code."""
        self._set_by_code("growth_factor", new_factor)

    def set_backoff_factor(self, new_factor: float) -> None:
        """Set a new scale backoff factor (< 1, and at least float32's smallest normal);
        recorded as a change by code."""
        self._set_by_code("backoff_factor", new_factor)

    def set_growth_interval(self, new_interval: int) -> None:
        """Set a new growth interval (an integer >= 1); recorded as a change by code.

        Lowering it below the current growth tracker grows at the next clean step.
        """
        if isinstance(new_interval, float):
            raise ScalerConfigError(f"growth_interval must be an integer, got {new_interval!r}")
        self._set_by_code("growth_interval", new_interval)

    # ------------------------------------------------------------------ extras

    def had_overflow(self) -> bool:
        """Whether the last ``update()`` saw inf/NaN gradients on any rank.

        .. warning:: reads a device value: a CPU-GPU sync.
        """
        found = self._last_found
        return bool(found is not None and found.reshape(-1).sum().item() > 0)

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until the steps so far are recorded (and, with telemetry, in the store).

        Returns False when they were not all recorded and stored within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        if self._recorder is not None:
            try:
                self._recorder.flush(timeout)
            except TimeoutError:
                return False
        if self._telemetry is None:
            return True
        return bool(self._telemetry.flush(max(0.0, deadline - time.monotonic())))

    def stats(self, timeout: float = 30.0) -> ScalerStats:
        """Counts since creation: steps, skipped steps, overflows, growths, backoffs, scales
        seen, and ``dropped_records``: steps whose record was lost, by the recorder (a whole
        queue behind) or by telemetry (a store failing past its queue's bound, or at close).

        .. note:: waits for the background recorder to read the steps queued so far;
           raises ``TimeoutError`` if it has not within ``timeout`` seconds.
        """
        if self._recorder is None:
            scale = self._init_scale if self._enabled else 1.0
            return ScalerStats(current_scale=scale, min_scale_seen=scale, max_scale_seen=scale)
        stats = self._recorder.stats(timeout)
        lost = self._closed_telemetry_dropped
        if self._telemetry is not None:
            lost += self._telemetry.dropped
        return dataclasses.replace(stats, dropped_records=stats.dropped_records + lost)

    @property
    def min_scale(self) -> float | None:
        return self._min_scale

    @property
    def max_scale(self) -> float | None:
        return self._max_scale

    @property
    def hysteresis(self) -> int | None:
        return self._hysteresis

    @property
    def steps(self) -> int:
        """Number of ``update()`` calls, continued across a resume."""
        return self._step_count

    def _hysteresis_value(self) -> int | None:
        if self._hysteresis_tracker is not None:
            return int(self._hysteresis_tracker.item())
        return self._init_hysteresis_tracker

    def state_dict(self) -> dict[str, Any]:
        """torch's five entries plus ``"scalewatch"`` (extras, step count, run id).

        .. warning:: like torch's, reads the scale: a CPU-GPU sync.
        """
        state = super().state_dict()
        if self._enabled:
            state[STATE_KEY] = {
                "step": self._step_count,
                "run_uid": self._run_uid,
                "min_scale": self._min_scale,
                "max_scale": self._max_scale,
                "hysteresis": self._hysteresis,
                "hysteresis_tracker": self._hysteresis_value(),
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
        recording = self._recorder is not None and not self._recorder.closed
        if recording and (extras is None or run_uid != self._run_uid):
            self.close()
        self._run_uid = run_uid
        self._step_count = 0 if extras is None else int(extras["step"])
        if extras is not None:
            self._min_scale = extras.get("min_scale")
            self._max_scale = extras.get("max_scale")
            self._hysteresis = extras.get("hysteresis")
            self._init_hysteresis_tracker = extras.get("hysteresis_tracker")
            if self._hysteresis_tracker is not None and self._init_hysteresis_tracker is not None:
                self._hysteresis_tracker.fill_(self._init_hysteresis_tracker)
            self._control_version = int(extras.get("control_version", 0))
        self._clamp_scale()
        self._scale_host = self._clamped(float(state_dict["scale"]))

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
            min_scale=self._min_scale,
            max_scale=self._max_scale,
            hysteresis=self._hysteresis,
            hysteresis_tracker=self._hysteresis_value(),
            step=self._step_count,
            run_uid=self._run_uid,
            control_version=self._control_version,
        )

    def load_checkpoint(self, checkpoint: ScalerCheckpoint) -> None:
        """Restore a ``checkpoint()``."""
        self.load_state_dict(
            {
                "scale": checkpoint.scale,
                "growth_factor": checkpoint.growth_factor,
                "backoff_factor": checkpoint.backoff_factor,
                "growth_interval": checkpoint.growth_interval,
                "_growth_tracker": checkpoint.growth_tracker,
                STATE_KEY: {
                    "step": checkpoint.step,
                    "run_uid": checkpoint.run_uid,
                    "min_scale": checkpoint.min_scale,
                    "max_scale": checkpoint.max_scale,
                    "hysteresis": checkpoint.hysteresis,
                    "hysteresis_tracker": checkpoint.hysteresis_tracker,
                    "control_version": checkpoint.control_version,
                },
            }
        )

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        if self._enabled:
            state["_init_hysteresis_tracker"] = self._hysteresis_value()
        for name in (
            "_hysteresis_tracker",
            "_recorder",
            "_pinned",
            "_telemetry",
            "_closer",
            "_last_run_id",
            "_closed_telemetry_dropped",
            "_inbox",
            "_code_outcomes",
            "_last_found",
            "_reduced",
        ):
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._reset_transient()

    # ---------------------------------------------------------------- closing

    def close(self) -> None:
        """Flush telemetry and mark the run finished. Safe to call twice.

        Also done when the scaler is garbage-collected and at interpreter exit.
        """
        closer, telemetry = self._closer, self._telemetry
        self._telemetry = None
        if closer is not None:
            closer()  # does nothing once done
        if telemetry is not None:
            self._last_run_id = telemetry.run_id
            self._closed_telemetry_dropped += telemetry.dropped

    def __enter__(self) -> Instrumented:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _close_parts(recorder: Recorder, telemetry: Any) -> None:
    """Close a scaler's recorder and telemetry (the finalizer of a dropped or exiting scaler).

    The garbage collector may run it on one of their own threads, which cannot wait for
    itself: then a thread of its own does it.
    """
    own = {recorder.thread, *(() if telemetry is None else telemetry.threads)}
    if threading.current_thread() in own:
        threading.Thread(
            target=_close_parts, args=(recorder, telemetry), name="scalewatch-closer"
        ).start()
        return
    recorder.close()
    if telemetry is not None:
        telemetry.close()
