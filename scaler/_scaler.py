"""What GradScaler and ShardedGradScaler add to torch's classes, written once.

Runs on the training thread of every rank. One class: torch's overrides (``scale``,
``unscale_``, ``_maybe_opt_step``, ``_check_inf_per_device``, ``update``, ``state_dict``,
``load_state_dict``), the public extras, and the hooks the two classes fill in. The logic
lives in plain objects and functions with explicit inputs, each a module or package of its
own: the added scale rules (``_scale_rules.ScaleRules``), the step in progress and the
device-to-host path (``_recording``: ``StepContext``, and the run's ``RunSession``), runtime
control (``_control``: its ``ControlInbox``, applied by the functions of
``_control.changes``), overflow diagnosis (``_diagnosis.Diagnoser``), the constructor's
checks (``_config``), our part of the state dict (``_checkpoint_state``).
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, cast, overload

import torch

from . import _control
from ._agreement.payload import Attribution
from ._checkpoint_state import (
    STATE_KEY,
    checkpoint_state_dict,
    loaded_spike_windows,
    note_load,
    our_state,
)
from ._config import Options, not_an_integer, refusal
from ._control import ControlOutcome, ControlUpdate
from ._control import changes as _changes
from ._control.inbox import ControlInbox
from ._diagnosis import Diagnoser
from ._diagnosis.preflight import TORCHS_REFUSAL, fp16_refusal
from ._grad_norm import GradNorm, named_norms
from ._group import Group
from ._recording import RunOpening, RunSession
from ._recording.learning_rates import Rates, group_rates
from ._recording.recorder import Snapshot, inf_ranks, make, with_diagnosis
from ._recording.step_context import StepContext
from ._recording.step_values import Captured, StepValues, read_cpu, read_if_clean, read_top
from ._scale_rules import ScaleRules
from ._schedules import Schedules
from ._spike_skip import SPIKE, SkipRule, SpikeSkip, check_z
from ._step_sample import StepSample, record_of, row_rates
from ._torch_compat import (
    OptState,
    _refresh_per_optimizer_state,
    combined_found_inf,
    found_on,
    maybe_opt_step_result,
    opt_step_unless_inf,
    process_group_info,
)
from .mirrors import Mirror
from .mirrors._env import chosen_mirrors
from .stats import ScalerCheckpoint, ScalerStats
from .store.spikes import DEFAULT as DEFAULT_SPIKES
from .store.spikes import SKIP_ENV, SpikeRule, skip_thresholds
from .telemetry import refuse_unusable_store

ON = ("1", "true", "yes", "on")  # $SCALEWATCH_GRAD_NORM's words for on

if TYPE_CHECKING:
    from ._diagnosis.findings import Diagnosis
    from ._torch_compat import TorchGradScaler as _Base
else:
    _Base = object


class Instrumented(_Base):
    """The scalewatch extras over torch's GradScaler state machine."""

    # What a copy of the scaler leaves behind (and makes anew).
    _TRANSIENT: tuple[str, ...] = (
        "_step_context",
        "_inbox",
        "_session",
        "_schedules",
        "_diagnoser",
        "_grad_norm",
        "_spike_skip",
        "_spike_windows_loaded",
    )
    _FOUND_SHAPE: tuple[int, ...] = ()  # of a found_inf, as torch's class makes it
    _ALLOW_FP16 = False  # whether unscale_ takes fp16 gradients, as torch's class does

    def _setup(self, options: Options) -> None:
        self._scale_rules = ScaleRules(options.min_scale, options.max_scale, options.hysteresis)
        self._scale_rules.hysteresis_start = options.hysteresis
        if self._enabled:
            _changes.clamp_scale(self, self._scale_rules)  # an init_scale outside the bounds
            refuse_unusable_store(options.telemetry)  # on every rank, before the first step
        self._telemetry_option = options.telemetry
        self._mirrors = chosen_mirrors(options.mirrors, options.telemetry)
        grad_norm = options.grad_norm
        if grad_norm is None:  # scalewatch instrument turns it on for a script it runs
            grad_norm = os.environ.get("SCALEWATCH_GRAD_NORM", "").strip().lower() in ON
        if not isinstance(grad_norm, bool):
            raise ValueError(f"grad_norm must be True, False or None, got {grad_norm!r}")
        self._measures_grad_norm = grad_norm
        if options.spikes is not None and not isinstance(options.spikes, SpikeRule):
            raise TypeError(f"spikes takes a SpikeRule, got {type(options.spikes).__name__}")
        self._spikes: SpikeRule | None = options.spikes
        # A scaler built by a script that cannot be edited (scalewatch instrument) is named so.
        self._run_name = options.run_name or os.environ.get("SCALEWATCH_RUN_NAME") or None
        self._run_uid: str | None = None
        self._step_count = 0
        self._control_version = 0
        self._skip_rule: SkipRule | None = None  # skip_on_spike's
        self._reset_transient()
        skip = os.environ.get(SKIP_ENV, "").strip()  # scalewatch instrument --skip-on-spike
        if skip and self._enabled:
            self.skip_on_spike(**skip_thresholds(skip))

    def _reset_transient(self) -> None:
        self._step_context = StepContext()
        self._inbox = ControlInbox()
        self._session = RunSession(self._inbox)
        self._schedules: Schedules | None = None  # the LR schedulers registered, if any
        self._diagnoser = Diagnoser()
        # a scaler pickled before the option was made measures nothing
        self._grad_norm = GradNorm(getattr(self, "_measures_grad_norm", False))
        rule = getattr(self, "_skip_rule", None)  # pickled before skip_on_spike: none
        self._spike_skip: SpikeSkip | None = None if rule is None else SpikeSkip(rule)
        # windows loaded before skip_on_spike() was called, for it to take
        self._spike_windows_loaded: dict[str, torch.Tensor] = {}

    # ------------------------------------------------------------------ steps

    def update(self, new_scale: float | torch.Tensor | None = None) -> None:
        if not self._enabled:
            return
        scale, tracker = self._check_scale_growth_tracker("update")
        # torch's step() marks the optimizers it stepped (or skipped for inf/NaN). step() is
        # not overridden: torch's warnings in it name the caller's line, as with torch's.
        stepped_count = 0
        for state in self._per_optimizer_states.values():
            stepped_count += state["stage"] is OptState.STEPPED
        flags = self._step_flags()
        # Read before _controls_for_step(), which forgets this step's payloads.
        attribution = self._attribution()
        spike_skip = self._spike_skip
        if spike_skip is not None:  # the scale is updated for overflows alone
            for key, per_device in spike_skip.gated.items():
                self._per_optimizer_states[key]["found_inf_per_device"] = per_device
        if new_scale is not None:
            # The step may have been skipped for inf/NaN: its record says so all the same.
            # Summed apart from the optimizers' own flags: torch's update(new_scale) leaves
            # them as they are (a refused new_scale leaves the scaler to step them still).
            states = self._per_optimizer_states
            found = combined_found_inf(states, scale, required=False, in_place=False)
            super().update(new_scale)
            _changes.clamp_scale(self, self._scale_rules)
            scale_set = True
        else:
            found = combined_found_inf(self._per_optimizer_states, scale)
            assert found is not None
            self._update_scale(scale, tracker, found)
            self._per_optimizer_states = defaultdict(_refresh_per_optimizer_state)
            scale_set = False
        self._step_count += 1
        outcomes = self._inbox.take_by_code()
        controls = self._controls_for_step()
        if controls:
            for update, refusal_reason in controls:
                outcome = _changes.apply_request(
                    self, self._scale_rules, update, refusal_reason, self._control_version
                )
                self._control_version = outcome.version
                scale_set = scale_set or (outcome.applied and "scale" in update.values)
                outcomes += (outcome,)
        self._step_context.last_found = found
        norm = self._grad_norm.finish()
        top = self._grad_norm.largest()
        word = found
        if spike_skip is not None:  # found_inf as recorded: SPIKE where skipped for a spike
            flag = spike_skip.finish(found if found is not None else scale.new_zeros(()))
            if flag is not None:
                word = (found if found is not None else 0.0) + SPIKE * flag
        self._snapshot(word, flags, attribution, stepped_count, scale_set, outcomes, norm, top)

    def _update_scale(
        self, scale: torch.Tensor, tracker: torch.Tensor, found: torch.Tensor
    ) -> None:
        rules = self._scale_rules
        if rules.hysteresis is None:
            self._torch_update(scale, tracker, found)
        else:
            factors = (self._growth_interval, self._growth_factor, self._backoff_factor)
            rules.hysteresis_update(scale, tracker, found, factors, self._multiply_scale)
        if rules.min_scale is not None or rules.max_scale is not None:
            rules.clamp_(scale)

    def _torch_update(
        self, scale: torch.Tensor, tracker: torch.Tensor, found: torch.Tensor
    ) -> None:
        raise NotImplementedError

    @overload
    def scale(self, outputs: torch.Tensor) -> torch.Tensor: ...

    @overload
    def scale(self, outputs: list[torch.Tensor]) -> list[torch.Tensor]: ...

    @overload
    def scale(self, outputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]: ...

    @overload
    def scale(self, outputs: Iterable[torch.Tensor]) -> Iterable[torch.Tensor]: ...

    def scale(
        self, outputs: torch.Tensor | Iterable[torch.Tensor]
    ) -> torch.Tensor | Iterable[torch.Tensor]:
        """As torch's; a one-element tensor is also this step's loss for the record."""
        scaled = super().scale(outputs)
        if isinstance(outputs, torch.Tensor) and self._enabled and outputs.numel() == 1:
            self._diagnoser.saw_loss(outputs)
        return scaled

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
        self._seen(optimizer)
        inv_scale = self._step_context.inverse_of(scale)
        found_inf = torch.full(self._FOUND_SHAPE, 0.0, dtype=torch.float32, device=scale.device)
        try:
            state["found_inf_per_device"] = self._unscale_grads_(
                optimizer, inv_scale, found_inf, self._ALLOW_FP16
            )
        except ValueError as error:  # torch's words first, then which parameters and why
            if str(error) != TORCHS_REFUSAL:
                raise
            names = self._diagnoser.names
            raise ValueError(fp16_refusal(optimizer, names.lookup)) from None
        state["stage"] = OptState.UNSCALED
        if self._grad_norm.on:
            self._grad_norm.measure(optimizer, scale.device, ranks=self._norm_ranks())
        self._checked(optimizer, state)
        if self._spike_skip is not None and getattr(optimizer, "_step_supports_amp_scaling", False):
            self._gate_fused(optimizer, state)

    def _seen(self, optimizer: torch.optim.Optimizer) -> None:
        """``optimizer`` is unscaled (``unscale_``) or checked (``_check_inf_per_device``, a
        fused optimizer's path): once a step on every path, before it steps."""
        self._step_context.rates += (group_rates(optimizer),)

    def _checked(self, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        """``optimizer``'s gradients were just checked, and unscaled unless it is fused
        (``state``: torch's); its norm measured."""

    def _check_inf_per_device(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        self._diagnoser.optimizers.append(optimizer)  # the fused path: no _maybe_opt_step
        self._seen(optimizer)
        found = super()._check_inf_per_device(optimizer)
        if self._grad_norm.on:  # the gradients are still scaled: the fused step unscales them
            scale, _ = self._check_scale_growth_tracker("step")
            inverse = self._step_context.inverse_of(scale)
            self._grad_norm.measure(optimizer, scale.device, inverse, self._norm_ranks())
        state = self._per_optimizer_states[id(optimizer)]
        self._checked(optimizer, state)
        if self._spike_skip is not None:
            self._gate_fused(optimizer, state)
        return found

    def _norm_ranks(self) -> int | None:
        """The ranks the squares of gradient shards are summed over, in the all-reduce that
        agrees found_inf (ShardedGradScaler in a process group); None: no such all-reduce,
        every gradient counts as whole."""
        return None

    def _maybe_opt_step(
        self,
        optimizer: torch.optim.Optimizer,
        optimizer_state: dict[str, Any],
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        if self._spike_skip is not None:
            return self._step_unless_spike(optimizer, optimizer_state, args, kwargs)
        result, found = opt_step_unless_inf(optimizer, optimizer_state, args, kwargs)
        self._step_context.skips.decided(found > 0)
        diagnoser = self._diagnoser
        diagnoser.optimizers.append(optimizer)
        group = self._group_info() if found else None  # asked of an overflow only
        diagnoser.read_at_step(optimizer, [found], bool(found), Attribution.single(), group)
        return result

    # ------------------------------------------------------------ spike skips

    def _step_unless_spike(
        self,
        optimizer: torch.optim.Optimizer,
        state: dict[str, Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """``_maybe_opt_step`` with :meth:`skip_on_spike`: found_inf and the decision are
        read in one (the read torch's step makes of found_inf)."""
        assert self._scale is not None
        found = found_on(state, self._scale.device)
        word = float((found + SPIKE * self._spike_flag(found)).item())
        overflow = word >= 1.0
        result = None if word > 0 else optimizer.step(*args, **kwargs)
        self._step_context.skips.decided(word > 0)
        diagnoser = self._diagnoser
        diagnoser.optimizers.append(optimizer)
        group = self._group_info() if overflow else None  # asked of an overflow only
        found_read = word if overflow else 0.0
        diagnoser.read_at_step(optimizer, [found_read], overflow, Attribution.single(), group)
        return maybe_opt_step_result(result, found_read)

    def _spike_flag(self, found: torch.Tensor) -> torch.Tensor:
        """This step's skip decision (see ``_spike_skip``), taken at its first call."""
        skip = self._spike_skip
        assert skip is not None
        if skip.flag is None and skip.rule.loss_z is not None and not self._attribution().known:
            raise RuntimeError(
                "skip_on_spike(loss_z=...): each rank's loss differs and GradScaler agrees "
                "nothing across ranks; use ShardedGradScaler in a multi-process job (or "
                "grad_norm_z alone, with DDP's gradients the same on every rank)"
            )
        return skip.decide(self._grad_norm.last, self._spike_loss(), found)

    def _spike_loss(self) -> torch.Tensor | None:
        """The loss a spike is judged by: this step's as ``scale()`` saw it."""
        return self._diagnoser.loss

    def _gate_fused(self, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        """A fused optimizer decides on the device: its found_inf, as it will read it, also
        says skip on a spike; ``update()`` puts the overflow's back for the scale."""
        skip = self._spike_skip
        assert skip is not None and self._scale is not None
        per_device = state["found_inf_per_device"]
        self._spike_flag(found_on(state, self._scale.device))
        skip.gated.setdefault(id(optimizer), per_device)
        state["found_inf_per_device"] = {
            device: skip.gate(found) for device, found in per_device.items()
        }

    def skip_on_spike(self, grad_norm_z: float | None = None, loss_z: float | None = None) -> None:
        """Skip the optimizer step of a step whose gradient norm, or loss, spikes: opt-in,
        off by default. Call it on every rank alike, before the steps it is to judge.

        Example::

            scaler = ShardedGradScaler(grad_norm=True)
            scaler.skip_on_spike(grad_norm_z=8.0, loss_z=8.0)
            for input, target in data:          # the loop as before
                ...
                scaler.step(optimizer)          # skipped on every rank at a spike
                scaler.update()                 # the scale is not backed off for it

        A value spikes when its robust z over the ``window`` steps before it (the run's
        ``spikes=`` rule's, 200 by default) is above ``grad_norm_z`` (the gradient norm) or
        ``loss_z`` (the loss ``scale()`` saw; a ``ShardedGradScaler`` in a process group
        judges the mean of the ranks' losses): ``(value - median) / (1.4826 * MAD)``, the
        rule the service flags spikes by, with at least 20 values in the window. None: that
        signal never skips; both None turn skipping off. ``grad_norm_z`` turns the norm's
        measure on (``grad_norm=True``).

        On a spike every rank skips every optimizer of the step, as for an overflow (a
        fused one too, on the device); the scale and the growth tracker are left as on a
        clean step; held schedulers hold (:meth:`hold`); ``last_step_skipped`` is True;
        the step is recorded as skipped with ``spike_skipped`` true and ``overflow`` false.
        An overflow step is no spike.

        Decided on the device and read with found_inf in the read ``step()`` already
        makes: no added sync, and no added collective (the loss rides in the found_inf
        all-reduce, one element more). The decision is taken at the step's first
        ``step()`` (a fused optimizer's: as its found_inf is checked), from the norm of the
        gradients unscaled by then: with several optimizers, ``unscale_`` each before the
        first ``step()`` to judge the whole step's norm. The windows are kept on the device;
        ``state_dict()`` carries them and ``load_state_dict()`` lays them back (before or
        after this call), so a resumed job skips with no warm-up; a copy of the scaler
        starts them empty (20 steps before the first skip). Raises ``ValueError`` for a z
        that is not a number above 0.
        """
        grad_norm_z = check_z("grad_norm_z", grad_norm_z)
        loss_z = check_z("loss_z", loss_z)
        if grad_norm_z is None and loss_z is None:
            self._skip_rule = None
        else:
            window = (self._spikes or DEFAULT_SPIKES).window
            self._skip_rule = SkipRule(grad_norm_z=grad_norm_z, loss_z=loss_z, window=window)
        if grad_norm_z is not None:
            self._measures_grad_norm = self._grad_norm.on = True
        self._spike_skip = None if self._skip_rule is None else SpikeSkip(self._skip_rule)
        loaded, self._spike_windows_loaded = self._spike_windows_loaded, {}
        if self._spike_skip is not None and loaded:  # load_state_dict() came first
            self._spike_skip.load(loaded, None if self._scale is None else self._scale.device)

    def _multiply_scale(self, scale: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
        """``scale * factor`` rounded as torch's update rounds it."""
        # torch's kernel multiplies in double and rounds once to float.
        return (scale.double() * factor).float()

    # ---------------------------------------------------------------- control

    def _controls_for_step(self) -> list[tuple[ControlUpdate, str | None]]:
        """Requests every rank applies at this update() boundary, each with a refusal or None."""
        return []

    def control_state(self) -> dict[str, float | int | None]:
        """The factors in effect (no scale: reading it would sync)."""
        return _changes.current(self, self._scale_rules).as_dict()

    def _set_by_code(self, name: str, value: float | int) -> None:
        problem = _control.check({name: value}, self.control_state() if self._enabled else {})
        if problem is not None:
            raise refusal(problem, value)
        if not self._enabled:  # as torch: only the attribute, which a disabled scaler ignores
            setattr(self, f"_{name}", value)
            return
        outcome = _changes.apply_setter(self, self._scale_rules, name, value, self._control_version)
        self._control_version = outcome.version
        self._inbox.note_by_code(outcome)

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
        error = not_an_integer("growth_interval", new_interval)
        if error is not None:
            raise error
        self._set_by_code("growth_interval", new_interval)

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
        stepped_count: int,
        scale_set: bool,
        outcomes: tuple[ControlOutcome, ...],
        norm: torch.Tensor | None = None,
        top: tuple[torch.Tensor, list[torch.Tensor]] | None = None,
    ) -> None:
        scale, tracker = self._scale, self._growth_tracker
        assert scale is not None and tracker is not None
        context, session = self._step_context, self._session
        recorder = session.recorder
        if recorder is None or recorder.closed:  # the first step: a recorder, and the run
            uid = session.open(self, self._init_scale, self._opening(), on_cpu=not scale.is_cuda)
            if uid is not None:
                self._run_uid = uid
            recorder = session.recorder
            assert recorder is not None
        rates = context.take_rates()  # this step's: read only if a snapshot is kept
        schedules = self._schedules
        schedule = None if schedules is None else schedules.take()
        stepped = stepped_count > 0
        # A cpu step with no recorder thread: counted as it comes, with no snapshot kept.
        inline = recorder.folds_inline and not scale.is_cuda
        add_row = session.add_row
        diagnoser = self._diagnoser
        clean = None
        if inline:
            clean = read_if_clean(found, scale, tracker, diagnoser.loss, add_row is not None, norm)
        if clean is not None and diagnoser.clean_step():  # step() met no overflow either
            context.skips.settle(stepped_count, found, 0.0)
            if add_row is None:  # and no record is kept: nothing else to read
                self._fold(clean[0], False, stepped, scale_set)
            elif outcomes:
                read = read_cpu(scale, tracker, found, None, flags)._replace(
                    loss=clean[2], grad_norm=clean[3], top=read_top(top and top[0])
                )
                self._hand_over(
                    add_row,
                    read,
                    attribution,
                    stepped,
                    scale_set,
                    rates,
                    schedule,
                    outcomes,
                    None,
                    top,
                )
            else:
                param_norms = () if top is None else self._named(read_top(top[0]), top)
                self._clean_row(add_row, clean, stepped, scale_set, rates, schedule, param_norms)
            return
        loss = diagnoser.take_loss()
        # cpu tensors are memory: read at once, no sync (see step_values.read_cpu)
        values = None if scale.is_cuda else read_cpu(scale, tracker, found, loss, flags, norm)
        if values is not None and top is not None:
            values = values._replace(top=read_top(top[0]))
        cpu_found = None if values is None else values.found or float(values.spiked)
        context.skips.settle(stepped_count, found, cpu_found)
        diagnosis = None
        overflow = diagnoser.end_step(values, attribution)
        if overflow is not None:
            group, process_group = self._group_info(), self._reporting_group()
            diagnosis = diagnoser.explain(overflow, values, attribution, loss, group, process_group)
        if inline and values is not None:
            if add_row is None:
                self._fold(values.scale, values.found > 0, stepped, scale_set, values.spiked)
            else:
                self._hand_over(
                    add_row,
                    values,
                    attribution,
                    stepped,
                    scale_set,
                    rates,
                    schedule,
                    outcomes,
                    diagnosis,
                    top,
                )
            return
        snapshot = make(Snapshot)  # every step: see recorder.make
        Snapshot.__init__(
            snapshot,
            step=self._step_count,
            wall_time=time.time(),
            captured=values
            if values is not None
            else Captured(
                scale,
                tracker,
                found,
                loss,
                cast(list[torch.Tensor], flags),
                context.pinned,
                norm,
                None if top is None else top[0],
            ),
            attribution=attribution,
            scale_used=context.scale_host,
            stepped=stepped,
            growth_interval=self._growth_interval,
            growth_factor=self._growth_factor,
            backoff_factor=self._backoff_factor,
            control_version=self._control_version,
            scale_set=scale_set,
            controls=outcomes,
            diagnosis=diagnosis,
            rates=rates,
            schedule=schedule,
            top_of=None if top is None else (top[1], self._diagnoser.names.lookup),
        )
        recorder.submit(snapshot)
        context.scale_host = None

    def _clean_row(
        self,
        add_row: Callable[[tuple[Any, ...]], None],
        clean: tuple[float, int, float | None, float | None],
        stepped: bool,
        scale_set: bool,
        rates: tuple[Rates, ...],
        schedule: tuple[int, int] | None,
        param_norms: tuple[tuple[str, float], ...] = (),
    ) -> None:
        """:meth:`_hand_over` of a clean cpu step with no control change (``clean``: its
        scale, tracker, loss and gradient norm as read): the shortest way, every step of
        most runs."""
        recorder, context = self._session.recorder, self._step_context
        assert recorder is not None
        scale_after, tracker, loss, norm = clean
        # Counted here, in one call: every frame on this path is paid every step.
        counts = recorder.counts
        used = counts.add(context.scale_host, scale_after, False, stepped, scale_set)
        drift = None if schedule is None else counts.drifted(schedule, counts.last_skipped, False)
        counts.last_skipped = False
        context.scale_host = None
        add_row(
            (  # in TrainingRow's order
                self._step_count,
                time.time(),
                used,
                False,
                False,
                (),
                scale_after,
                tracker,
                self._growth_interval,
                self._growth_factor,
                self._backoff_factor,
                self._control_version,
                loss,
                # row_rates, inline: the one rate itself keeps the row plain (no tuple in it)
                rates[0][0] if len(rates) == 1 and len(rates[0]) == 1 else rates,
                drift,
                norm,
                param_norms,
                False,
            )
        )

    def _hand_over(
        self,
        add_row: Callable[[tuple[Any, ...]], None],
        values: StepValues,
        attribution: Attribution,
        stepped: bool,
        scale_set: bool,
        rates: tuple[Rates, ...],
        schedule: tuple[int, int] | None,
        outcomes: tuple[ControlOutcome, ...],
        diagnosis: Diagnosis | None,
        top: tuple[torch.Tensor, list[torch.Tensor]] | None = None,
    ) -> None:
        """Count a cpu step and hand its row to the telemetry that takes rows
        (``RunSession.add_row``); a step with control changes or an explained overflow
        goes as a whole sample."""
        session, context = self._session, self._step_context
        recorder = session.recorder
        assert recorder is not None
        scale_after, tracker, found, loss, payloads, norm, top_read, spiked = values
        overflow = found > 0
        used, skipped, drift = recorder.fold_step(
            context.scale_host, scale_after, overflow, stepped, scale_set, schedule, spiked
        )
        context.scale_host = None
        row = (  # in TrainingRow's order
            self._step_count,
            time.time(),
            used,
            overflow,
            skipped,
            inf_ranks(attribution, overflow, payloads) if overflow else (),
            scale_after,
            tracker,
            self._growth_interval,
            self._growth_factor,
            self._backoff_factor,
            self._control_version,
            loss,
            row_rates(rates),
            drift,
            norm,
            self._named(top_read, top),
            spiked and stepped,
        )
        if not outcomes and diagnosis is None:
            add_row(row)
            return
        telemetry = session.telemetry
        assert telemetry is not None
        telemetry.submit([StepSample(with_diagnosis(record_of(row), diagnosis), outcomes)])

    def _named(
        self, read: list[float] | None, top: tuple[torch.Tensor, list[torch.Tensor]] | None
    ) -> tuple[tuple[str, float], ...]:
        """The largest per-parameter norms as read, named (none where none were read)."""
        if read is None or top is None:
            return ()
        return named_norms(read, top[1], self._diagnoser.names.lookup)

    def _fold(
        self,
        scale_after: float,
        overflow: bool,
        stepped: bool,
        scale_set: bool,
        spiked: bool = False,
    ) -> None:
        """Count a cpu step that no sink reads (see ``Recorder.fold``)."""
        recorder, context = self._session.recorder, self._step_context
        assert recorder is not None
        recorder.fold(context.scale_host, scale_after, overflow, stepped, scale_set, spiked)
        context.scale_host = None

    def _opening(self) -> RunOpening | None:
        """What the run's telemetry opens with, on the reporting rank; None elsewhere or
        when off."""
        option = self._telemetry_option
        info = self._group_info()
        if option is False or (info is not None and not info.reports):
            return None
        return RunOpening(
            target=None if option is None or option is True else option,
            name=self._run_name,
            world_size=1 if info is None else info.size,
            config=self._config(),
            control=_changes.current(self, self._scale_rules).as_dict(),
            uid=self._run_uid,
            mirrors=self._mirrors,
        )

    def _group_info(self) -> Group | None:
        """(rank, size) of the group whose rank 0 reports; None for a single process.

        Looked up once (a group, once joined, keeps its rank and size), not every step.
        """
        context = self._step_context
        if context.group is None:
            context.group = process_group_info(self._reporting_group())
        return context.group

    def _reporting_group(self) -> Any:
        """The process group whose rank 0 reports (None: the default, global ranks)."""
        return None

    def _config(self) -> dict[str, Any]:
        config: dict[str, Any] = {
            "class": type(self).__name__,
            "device": self._device,
            "init_scale": self._init_scale,
            "growth_factor": self._growth_factor,
            "backoff_factor": self._backoff_factor,
            "growth_interval": self._growth_interval,
            "min_scale": self._scale_rules.min_scale,
            "max_scale": self._scale_rules.max_scale,
            "hysteresis": self._scale_rules.hysteresis,
        }
        spikes = getattr(self, "_spikes", None)  # a scaler pickled before the option: none
        if spikes is not None:
            config["spikes"] = spikes.as_config()
        schedules = self._schedules
        if schedules is not None:  # registered before the first step: which, and held or not
            config["schedulers"] = schedules.described()
        return config

    @property
    def run_uid(self) -> str | None:
        """The telemetry run this scaler writes to (None before the first update or when off)."""
        return self._run_uid

    @property
    def run_id(self) -> int | None:
        """The run's id in the store, once the writer has created it."""
        return self._session.run_id

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        """torch's five entries plus ``"scalewatch"`` (extras, step count, run id).

        .. warning:: like torch's, reads the scale: a CPU-GPU sync.
        """
        state = super().state_dict()
        if self._enabled:
            skip = self._spike_skip
            windows = self._spike_windows_loaded if skip is None else skip.state()
            state[STATE_KEY] = our_state(
                self._step_count, self._run_uid, self._scale_rules, self._control_version, windows
            )
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Loads torch's dicts and ours: ours continue their run and its step count, a torch
        dict starts a new run. Steps already recorded of another run stay in that one,
        which is finished first.

        A load into a run that has steps is recorded in it, on the reporting rank: the step
        count loaded, the scale before and after, and whether the scale jumped (the loaded
        scale differs from the run's last recorded one): ``GET /api/runs/{id}/scale-loads``.
        A new process that loads a run's state before its first step records it too, the
        scale before being the run's last stored one. A dict of torch's starts a run of its
        own, whose first scale is the loaded one: no event.
        """
        session = self._session
        telemetry = session.telemetry
        before = None
        if self._enabled and telemetry is not None and not telemetry.closed:
            # This run records steps: its scale before, read as torch's state_dict() reads
            # it (a sync on cuda; a load is no step of the training loop).
            before = (self.get_scale(), self._step_count)
        super().load_state_dict(state_dict)
        if not self._enabled:
            return
        ours = state_dict.get(STATE_KEY)
        run_uid = None if ours is None else ours.get("run_uid")
        if session.is_open and (ours is None or run_uid != self._run_uid):
            self.close()
        self._run_uid = run_uid
        self._step_count = 0 if ours is None else int(ours["step"])
        if ours is not None:
            self._scale_rules.load(ours)
            self._control_version = int(ours.get("control_version", 0))
        windows = loaded_spike_windows(ours)
        if self._spike_skip is None:
            self._spike_windows_loaded = windows
        else:
            self._spike_skip.load(windows, None if self._scale is None else self._scale.device)
        _changes.clamp_scale(self, self._scale_rules)
        scale = self._scale_rules.clamped(float(state_dict["scale"]))
        self._step_context.scale_host = scale
        note_load(session, before, scale, self._step_count, self._run_uid)

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
            min_scale=self._scale_rules.min_scale,
            max_scale=self._scale_rules.max_scale,
            hysteresis=self._scale_rules.hysteresis,
            hysteresis_tracker=self._scale_rules.hysteresis_value(),
            step=self._step_count,
            run_uid=self._run_uid,
            control_version=self._control_version,
        )

    def load_checkpoint(self, checkpoint: ScalerCheckpoint) -> None:
        """Restore a ``checkpoint()``."""
        self.load_state_dict(checkpoint_state_dict(checkpoint))

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_scale_rules"] = self._scale_rules.for_pickle()
        state.pop("_mirrors", None)  # a copy starts a run of its own, which they do not show
        for name in self._TRANSIENT:
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        if "_extras" in state:  # pickled before the scale rules had their name
            state["_scale_rules"] = state.pop("_extras")
        super().__setstate__(state)
        self._mirrors = ()
        self._reset_transient()

    # ------------------------------------------------------------------ extras

    def watch(self, model: torch.nn.Module) -> int:
        """Name ``model``'s parameters in overflow reports; returns how many names it gave.

        Names are those of ``model.named_parameters()`` (less FSDP's wrapper prefixes):
        plain modules, DDP, FSDP1 (an FSDP1 flat parameter names each original parameter
        it holds) and FSDP2. Parameters no watched model has are named by optimizer
        position and shape, as ``"group 0 param 17 (4096, 4096)"``. A copy of the scaler
        (pickle, deepcopy) forgets the names: call ``watch`` on it again.
        """
        return self._diagnoser.names.watch(model)

    def watch_schedulers(self, *schedulers: Any) -> None:
        """Count how far ``schedulers`` (LR schedulers: ``LambdaLR``, ``OneCycleLR``,
        ``SequentialLR``, ``ReduceLROnPlateau``...) run ahead of the weights.

        A scheduler stepped after an optimizer step that was skipped for inf/NaN moves the
        learning rate on while the weights stayed: each step's record carries
        ``schedule_drift``, the skipped steps on which a registered scheduler stepped so
        far (the most calls of any one scheduler, if one steps more than once a step). A
        call after ``update()`` belongs to that update's step (so it is counted in the
        next record); one between ``step()`` and ``update()`` to the step in progress.
        Counted on the recorder thread from what it reads anyway: no sync. A step counts
        as skipped when the scaler skipped its optimizers (any of them, on any rank).

        Separate from :meth:`watch`, which names a model's parameters: a scheduler is made
        after the optimizer, often far from the model, and a job may have either alone.
        Each scheduler's ``step`` and ``state_dict`` are wrapped on the instance (its class,
        torch's ``optimizer.step()`` warning and its state dict are as they were). Register
        before the first step so the run's config lists the schedulers; a copy of the
        scaler (pickle, deepcopy) forgets them, as it forgets ``watch``'s names. Meant for
        schedulers stepped once per optimizer step, not once per epoch. The behaviour is
        torch's: nothing is held (see :meth:`hold`).
        """
        schedules = self._schedules_for()
        for scheduler in schedulers:
            schedules.add(scheduler, hold=False)

    def hold(self, *schedulers: Any) -> None:
        """Register ``schedulers`` as :meth:`watch_schedulers` does, and hold them: a held
        scheduler's ``step()`` does nothing on a step whose optimizers were skipped, so its
        ``last_epoch`` is the optimizer's real step count and the run's drift stays 0.

        Opt-in, off by default. Every rank decides alike (a sharded job's found_inf is
        all-reduced). Whether a step skipped is what torch's ``step()`` already read on the
        host (no sync), except for a fused optimizer with the scale on a GPU, which decides
        on the device: there a held scheduler's ``step()`` waits for that step's found_inf
        (one sync, on that path only), rather than hold on a guess. Holding is kept in the
        scheduler's own state: its ``state_dict()`` round-trips it, so a resumed job that
        registers the scheduler and loads its state keeps holding.
        """
        schedules = self._schedules_for()
        for scheduler in schedulers:
            schedules.add(scheduler, hold=True)

    def _schedules_for(self) -> Schedules:
        if self._schedules is None:
            self._schedules = Schedules(self)
        return self._schedules

    def _stepping(self) -> bool:
        """Whether this step's optimizers have stepped (or been skipped), update() to come."""
        return any(s["stage"] is OptState.STEPPED for s in self._per_optimizer_states.values())

    def _skipped(self, now: bool) -> bool:
        """Whether the step in progress (``now``) or the last update's skipped its
        optimizers; a fused optimizer's step on a GPU is waited for (a sync)."""
        skips = self._step_context.skips
        if not now:
            return bool(skips.wait())  # None before the first step: nothing was skipped
        states = [s for s in self._per_optimizer_states.values() if s["stage"] is OptState.STEPPED]
        if any(skips.decisions) or len(skips.decisions) >= len(states):
            return any(skips.decisions)
        return any(  # a fused optimizer decided on the device: read its found_inf
            float(found.sum().item()) > 0
            for state in states
            for found in state["found_inf_per_device"].values()
        )

    @property
    def last_step_skipped(self) -> bool | None:
        """Whether the last ``update()``'s step skipped its optimizers for inf/NaN gradients,
        or for a spike (:meth:`skip_on_spike`), on every rank of a sharded job alike:
        ``None`` before the first ``update()``.

        Costs no sync: it is what torch's ``step()`` already read on the host, or a CPU
        value. Where the host cannot know without a sync, a fused optimizer (which decides
        on the device) with the scale on a GPU, it is ``None`` until the GPU is past the
        step (asked without waiting; by the next ``update()`` it almost always is), never a
        wrong ``False``.
        """
        return self._step_context.skips.value

    @property
    def last_grad_norm(self) -> torch.Tensor | None:
        """The total L2 norm of the unscaled gradients, a 0-d float32 tensor on the scale's
        device: the value ``torch.nn.utils.clip_grad_norm_`` returns for them (FSDP1's and
        FSDP2's full norm with ``ShardedGradScaler``), the same on every rank; inf or NaN
        where the gradients held them. ``None`` before any.

        With ``grad_norm=True``: after ``unscale_(optimizer)``, the norm of the gradients
        unscaled so far this step (so a loop that clips can clip with it:
        ``clip_grads_with_norm_(params, max_norm, scaler.last_grad_norm)``); after
        ``update()``, that step's. A value handed to :meth:`record_grad_norm` takes its
        place. Reading the property costs no sync: the tensor is not read on the host.
        """
        return self._grad_norm.last

    def record_grad_norm(self, total_norm: torch.Tensor | float) -> None:
        """Record ``total_norm`` as this step's gradient norm, in place of measuring it.

        For a loop that computes the norm already, between ``unscale_`` and ``step``::

            scaler.unscale_(optimizer)
            total_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
            scaler.record_grad_norm(total_norm)
            scaler.step(optimizer)
            scaler.update()

        Works with ``grad_norm`` on or off (off, it is the norm's only cost). The value is
        kept as a tensor: no sync. An FSDP2 norm (a DTensor) is handed in as
        ``total_norm.full_tensor()``. Raises ``ValueError`` for a tensor of more than one
        value, ``TypeError`` for what is neither tensor nor number.
        """
        if not self._enabled:
            return
        scale = self._scale
        device = scale.device if scale is not None else torch.device(self._device)
        self._grad_norm.give(total_norm, device)

    def had_overflow(self) -> bool:
        """Whether the last ``update()`` saw inf/NaN gradients on any rank.

        .. warning:: reads a device value: a CPU-GPU sync.
        """
        found = self._step_context.last_found
        return bool(found is not None and found.reshape(-1).sum().item() > 0)

    @property
    def mirrors(self) -> tuple[Mirror, ...]:
        """The trackers each step is logged to as well (``mirrors=``, ``$SCALEWATCH_MIRROR``,
        ``add_mirror``); each counts its ``failures`` and ``dropped`` steps."""
        return self._mirrors

    def add_mirror(self, mirror: Mirror) -> None:
        """Log each step to ``mirror`` as well (see ``mirrors=``), from the run the next
        step opens: the first step's, for a scaler that has not stepped yet (a trainer's
        callback adds one as training begins)."""
        self._mirrors = chosen_mirrors((*self._mirrors, mirror), self._telemetry_option)

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until the steps so far are recorded (and, with telemetry, in the store).

        Returns False when they were not all recorded and stored within ``timeout`` seconds.
        """
        return self._session.flush(timeout)

    def stats(self, timeout: float = 30.0) -> ScalerStats:
        """Counts since creation: steps, skipped steps, overflows, growths, backoffs, scales
        seen, and ``dropped_records``: steps whose record was lost, by the recorder (a whole
        queue behind) or by telemetry (a store failing past its queue's bound, or at close).

        .. note:: waits for the background recorder to read the steps queued so far;
           raises ``TimeoutError`` if it has not within ``timeout`` seconds.
        """
        stats = self._session.stats(timeout)
        if stats is None:
            scale = self._init_scale if self._enabled else 1.0
            return ScalerStats(current_scale=scale, min_scale_seen=scale, max_scale_seen=scale)
        return stats

    @property
    def min_scale(self) -> float | None:
        return self._scale_rules.min_scale

    @property
    def max_scale(self) -> float | None:
        return self._scale_rules.max_scale

    @property
    def hysteresis(self) -> int | None:
        return self._scale_rules.hysteresis

    @property
    def steps(self) -> int:
        """Number of ``update()`` calls, continued across a resume."""
        return self._step_count

    # ---------------------------------------------------------------- closing

    def close(self) -> None:
        """Flush telemetry and mark the run finished. Safe to call twice.

        Also done when the scaler is garbage-collected and at interpreter exit.
        """
        self._session.close()

    def __enter__(self) -> Instrumented:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
