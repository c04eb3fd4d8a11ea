"""What GradScaler and ShardedGradScaler add to torch's classes, written once.

Runs on the training thread of every rank. The torch-facing overrides live here; the
parts they use are each a module or package of their own: the added scale rules
(``_extras``), the link to the run and the device-to-host path (``_recording``), runtime
control (``_control``), overflow diagnosis (``_diagnosis``), the constructor's checks
(``_config``), the state and checkpoints (``_state``).
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from typing import Any, cast

import torch

from ._agreement.payload import Attribution
from ._config import Options
from ._control import ControlOutcome
from ._control.changes import Controlled
from ._diagnosis import StepWatch, Watching
from ._extras import Extras
from ._recording import RunLink
from ._recording.recorder import Snapshot, make
from ._recording.step_values import Captured, read_cpu
from ._state import Persisted
from ._torch_compat import (
    OptState,
    _refresh_per_optimizer_state,
    process_group_info,
)
from .stats import ScalerStats


class Instrumented(Watching, Controlled, Persisted):
    """The scalewatch extras over torch's GradScaler state machine."""

    _step_count: int
    _control_version: int
    _TRANSIENT: tuple[str, ...] = ("_link", "_watch")  # what a copy of the scaler leaves behind
    _FOUND_SHAPE: tuple[int, ...] = ()  # of a found_inf, as torch's class makes it
    _ALLOW_FP16 = False  # whether unscale_ takes fp16 gradients, as torch's class does

    def _setup(self, options: Options) -> None:
        self._extras = Extras(options.min_scale, options.max_scale, options.hysteresis)
        self._extras.hysteresis_start = options.hysteresis
        if self._enabled:
            self._clamp_scale()  # an init_scale outside min/max_scale starts at the bound
        self._telemetry_option = options.telemetry
        # A scaler built by a script that cannot be edited (scalewatch instrument) is named so.
        self._run_name = options.run_name or os.environ.get("SCALEWATCH_RUN_NAME") or None
        self._run_uid: str | None = None
        self._step_count = 0
        self._control_version = 0
        self._reset_transient()

    def _reset_transient(self) -> None:
        self._link = RunLink()
        self._watch = StepWatch()

    # ------------------------------------------------------------------ steps

    def update(self, new_scale: float | torch.Tensor | None = None) -> None:
        if not self._enabled:
            return
        scale, tracker = self._check_scale_growth_tracker("update")
        # torch's step() marks the optimizers it stepped (or skipped for inf/NaN). step() is
        # not overridden: torch's warnings in it name the caller's line, as with torch's.
        stepped = False
        for state in self._per_optimizer_states.values():
            if state["stage"] is OptState.STEPPED:
                stepped = True
                break
        flags = self._step_flags()
        # Read before _controls_for_step(), which forgets this step's payloads.
        attribution = self._attribution()
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
        link = self._link
        outcomes: tuple[ControlOutcome, ...] = ()
        if link.code_outcomes:
            outcomes, link.code_outcomes = tuple(link.code_outcomes), []
        controls = self._controls_for_step()
        if controls:
            for update, refusal_reason in controls:
                outcome = self._apply_control(update, refusal_reason)
                scale_set = scale_set or (outcome.applied and "scale" in update.values)
                outcomes += (outcome,)
        link.last_found = found
        self._snapshot(found, flags, attribution, stepped, scale_set, outcomes)

    def _combined_found_inf(
        self, scale: torch.Tensor, required: bool = True, in_place: bool = True
    ) -> torch.Tensor | None:
        """The optimizers' found_inf summed, into the first one's as torch's update() does
        (``in_place``), or into a new tensor (then a fused optimizer's 0-d flag and another
        optimizer's one-element flag add up too)."""
        states = self._per_optimizer_states
        if len(states) == 1 and in_place:  # one optimizer, one device: its found_inf
            (state,) = states.values()
            per_device: dict[torch.device, torch.Tensor] = state["found_inf_per_device"]
            if len(per_device) == 1:
                (found,) = per_device.values()
                if found.device == scale.device:
                    return found  # what torch's to(scale.device) would return
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
        extras = self._extras
        if extras.hysteresis is None:
            self._torch_update(scale, tracker, found)
        else:
            factors = (self._growth_interval, self._growth_factor, self._backoff_factor)
            extras.hysteresis_update(scale, tracker, found, factors, self._multiply_scale)
        if extras.min_scale is not None or extras.max_scale is not None:
            extras.clamp_(scale)

    def _torch_update(
        self, scale: torch.Tensor, tracker: torch.Tensor, found: torch.Tensor
    ) -> None:
        raise NotImplementedError

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """As torch's: divides ``optimizer``'s gradients by the scale, in place, once a step."""
        if not self._enabled:
            return
        scale, _ = self._check_scale_growth_tracker("unscale_")
        state = self._per_optimizer_states[id(optimizer)]
        if state["stage"] is OptState.UNSCALED:
            raise RuntimeError(
                "unscale_() has already been called on this optimizer since the last update()."
            )
        if state["stage"] is OptState.STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        inv_scale = self._inverse_scale(scale)
        found_inf = torch.full(self._FOUND_SHAPE, 0.0, dtype=torch.float32, device=scale.device)
        state["found_inf_per_device"] = self._unscale_grads_(
            optimizer, inv_scale, found_inf, self._ALLOW_FP16
        )
        state["stage"] = OptState.UNSCALED
        self._unscaled(optimizer, state)

    def _unscaled(self, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        """``optimizer``'s gradients were just checked and unscaled (``state``: torch's)."""

    def _inverse_scale(self, scale: torch.Tensor) -> torch.Tensor:
        """``1 / scale`` as torch's unscale_ takes it (in float64, rounded once to float32:
        float32 division can be imprecise under some compile options), taken again only
        when the scale has changed since.

        Every in-place change of a tensor (the update's, ``fill_``, ``copy_``) bumps its
        version, which the host keeps: telling a changed scale costs no device read.
        """
        if scale.device.type == "mps":  # as torch's: mps has no float64
            return scale.reciprocal()
        kept = self._link.inverse
        try:
            version = scale._version
        except RuntimeError:  # an inference-mode tensor keeps no version: not kept
            return scale.double().reciprocal().float()
        if kept is not None and kept[0] is scale and kept[1] == version:
            return kept[2]
        inverse = scale.double().reciprocal().float()
        self._link.inverse = (scale, version, inverse)
        return inverse

    def _multiply_scale(self, scale: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
        """``scale * factor`` rounded as torch's update rounds it."""
        # torch's kernel multiplies in double and rounds once to float.
        return (scale.double() * factor).float()

    # -------------------------------------------------------- telemetry hooks

    def _step_flags(self) -> list[torch.Tensor] | list[list[float]]:
        """The all-reduced per-rank flag payloads of this step (none for GradScaler): the
        tensors, or on cpu their words as read."""
        return []

    def _attribution(self) -> Attribution:
        """Whose overflow flags this step's payloads carry."""
        return Attribution.single()

    def _snapshot(
        self,
        found: torch.Tensor | None,
        flags: list[torch.Tensor] | list[list[float]],
        attribution: Attribution,
        stepped: bool,
        scale_set: bool,
        outcomes: tuple[ControlOutcome, ...],
    ) -> None:
        scale, tracker = self._scale, self._growth_tracker
        assert scale is not None and tracker is not None
        link = self._link
        recorder = link.recorder
        # No sink reads a cpu step's record: counted as it comes, with no snapshot kept.
        inline = recorder is not None and recorder.folds_inline and not scale.is_cuda
        if inline and (found is None or not found.item() > 0) and self._watch.clean_step():
            self._fold(scale.item(), False, stepped, scale_set)  # clean: nothing else to read
            return
        loss = self._watch.take_loss()
        # cpu tensors are memory: read at once, no sync (see step_values.read_cpu)
        values = None if scale.is_cuda else read_cpu(scale, tracker, found, loss, flags)
        diagnosis = self._diagnose(values, attribution, loss)
        if inline and values is not None:
            self._fold(values.scale, values.found > 0, stepped, scale_set)
            return
        snapshot = make(Snapshot)  # every step: see recorder.make
        Snapshot.__init__(
            snapshot,
            step=self._step_count,
            wall_time=time.time(),
            captured=values
            if values is not None
            else Captured(
                scale, tracker, found, loss, cast(list[torch.Tensor], flags), link.pinned
            ),
            attribution=attribution,
            scale_used=link.scale_host,
            stepped=stepped,
            growth_interval=self._growth_interval,
            growth_factor=self._growth_factor,
            backoff_factor=self._backoff_factor,
            control_version=self._control_version,
            scale_set=scale_set,
            controls=outcomes,
            diagnosis=diagnosis,
        )
        link.submit(self, snapshot, self._init_scale, self._make_sink)
        link.scale_host = None

    def _fold(self, scale_after: float, overflow: bool, stepped: bool, scale_set: bool) -> None:
        """Count a cpu step that no sink reads (see ``Recorder.fold``)."""
        link = self._link
        assert link.recorder is not None
        link.recorder.fold(link.scale_host, scale_after, overflow, stepped, scale_set)
        link.scale_host = None

    def _make_sink(self) -> Any:
        """The telemetry writer's intake on the reporting rank; None elsewhere or when off."""
        option = self._telemetry_option
        info = self._group_info()
        if option is False or (info is not None and info[0] != 0):
            return None
        from .telemetry import Telemetry

        telemetry = self._link.telemetry = Telemetry(
            None if option is None or option is True else option,
            name=self._run_name,
            world_size=1 if info is None else info[1],
            config=self._config(),
            control=self.control_state(),
            inbox=self._link.inbox,
            uid=self._run_uid,
        )
        self._run_uid = telemetry.uid
        return telemetry.submit

    def _group_info(self) -> tuple[int, int] | None:
        """(rank, size) of the group whose rank 0 reports; None for a single process.

        Looked up once (a group, once joined, keeps its rank and size), not every step.
        """
        link = self._link
        if link.group is None:
            link.group = process_group_info(self._reporting_group())
        return link.group

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
            "min_scale": self._extras.min_scale,
            "max_scale": self._extras.max_scale,
            "hysteresis": self._extras.hysteresis,
        }

    @property
    def run_uid(self) -> str | None:
        """The telemetry run this scaler writes to (None before the first update or when off)."""
        return self._run_uid

    @property
    def run_id(self) -> int | None:
        """The run's id in the store, once the writer has created it."""
        return self._link.run_id

    # ------------------------------------------------------------------ extras

    def had_overflow(self) -> bool:
        """Whether the last ``update()`` saw inf/NaN gradients on any rank.

        .. warning:: reads a device value: a CPU-GPU sync.
        """
        found = self._link.last_found
        return bool(found is not None and found.reshape(-1).sum().item() > 0)

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until the steps so far are recorded (and, with telemetry, in the store).

        Returns False when they were not all recorded and stored within ``timeout`` seconds.
        """
        return self._link.flush(timeout)

    def stats(self, timeout: float = 30.0) -> ScalerStats:
        """Counts since creation: steps, skipped steps, overflows, growths, backoffs, scales
        seen, and ``dropped_records``: steps whose record was lost, by the recorder (a whole
        queue behind) or by telemetry (a store failing past its queue's bound, or at close).

        .. note:: waits for the background recorder to read the steps queued so far;
           raises ``TimeoutError`` if it has not within ``timeout`` seconds.
        """
        stats = self._link.stats(timeout)
        if stats is None:
            scale = self._init_scale if self._enabled else 1.0
            return ScalerStats(current_scale=scale, min_scale_seen=scale, max_scale_seen=scale)
        return stats

    @property
    def min_scale(self) -> float | None:
        return self._extras.min_scale

    @property
    def max_scale(self) -> float | None:
        return self._extras.max_scale

    @property
    def hysteresis(self) -> int | None:
        return self._extras.hysteresis

    @property
    def steps(self) -> int:
        """Number of ``update()`` calls, continued across a resume."""
        return self._step_count

    # ---------------------------------------------------------------- closing

    def close(self) -> None:
        """Flush telemetry and mark the run finished. Safe to call twice.

        Also done when the scaler is garbage-collected and at interpreter exit.
        """
        self._link.close()

    def __enter__(self) -> Instrumented:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
