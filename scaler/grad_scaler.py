"""``GradScaler``: torch.amp.GradScaler with telemetry, runtime control and extras."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch

from ._agreement.payload import Attribution
from ._config import Options
from ._control import ControlUpdate
from ._scaler import Instrumented
from ._torch_compat import (
    CUDA_UNAVAILABLE,
    CUDA_WARNING_AT_CALLER,
    TorchGradScaler,
    amp_update_scale_,
    cuda_amp_unavailable,
    require_supported_torch,
    unscale_grads,
)
from .mirrors import Mirror
from .store.spikes import SpikeRule


class GradScaler(Instrumented, TorchGradScaler):
    """A drop-in ``torch.amp.GradScaler`` that records every step.

    Example::

        scaler = GradScaler("cuda", run_name="resnet-fp16")
        for input, target in data:
            optimizer.zero_grad()
            with torch.autocast("cuda", dtype=torch.float16):
                loss = loss_fn(model(input), target)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        scaler.close()

    Args:
        device (str, default "cuda"), init_scale (float, default 2.**16),
        growth_factor (float, default 2.0), backoff_factor (float, default 0.5),
        growth_interval (int, default 2000), enabled (bool, default True):
            as torch.amp.GradScaler, in the same positional order.
        min_scale, max_scale (float, keyword-only, default None): clamp the scale.
        hysteresis (int, keyword-only, default None): back off only after this
            many overflows since the last growth (Megatron's meaning).
        telemetry (None, str, store, TelemetrySettings or False, keyword-only): None
            records to the default store (``$SCALEWATCH_DB`` or ``sqlite:///scalewatch.db``),
            a URL or store picks another, ``scalewatch.telemetry.TelemetrySettings`` also sets
            the writer's queue bound and cadence, False turns recording off.
        run_name (str, keyword-only): the run's name in the store.
        grad_norm (bool, keyword-only, default None): measure the total L2 norm of the
            unscaled gradients of every step (``last_grad_norm``, and each step's record).
            None: ``$SCALEWATCH_GRAD_NORM`` (``1`` turns it on; ``scalewatch instrument``
            sets it), else off: it reads every gradient once more, which costs the
            scaler's calls more than 10% (bench/scaler_overhead.py). A loop that computes
            the norm already hands it in instead (:meth:`record_grad_norm`).
        spikes (``scalewatch.store.spikes.SpikeRule``, keyword-only, default None): the
            run's spike rule, kept in its config: a step's loss or gradient norm spikes
            when its robust z over the ``window`` steps before it is above ``z``
            (default ``SpikeRule(window=200, z=6.0)``). Found where steps are stored.
        mirrors (sequence of ``scalewatch.mirrors.Mirror``, keyword-only, default None):
            trackers the reporting rank also logs each step to (``TensorBoard``, ``MLflow``,
            ``WandB``); None takes those ``$SCALEWATCH_MIRROR`` names, ``[]`` none.

    In a multi-process job every rank applies the same values only with
    ``ShardedGradScaler``; this class refuses runtime control requests there.

    Opt-in, :meth:`skip_on_spike` skips the optimizer step of a step whose gradient norm or
    loss spikes (decided on the device, read with found_inf: no added sync); the scale is
    not backed off for it.
    """

    def __init__(
        self,
        device: str = "cuda",
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        enabled: bool = True,
        *,
        min_scale: float | None = None,
        max_scale: float | None = None,
        hysteresis: int | None = None,
        telemetry: Any = None,
        run_name: str | None = None,
        mirrors: Sequence[Mirror] | None = None,
        grad_norm: bool | None = None,
        spikes: SpikeRule | None = None,
    ) -> None:
        require_supported_torch()
        options = Options(
            min_scale,
            max_scale,
            hysteresis,
            telemetry,
            run_name,
            mirrors=mirrors,
            grad_norm=grad_norm,
            spikes=spikes,
        )
        init_scale, growth_factor, backoff_factor, growth_interval = options.torch_arguments(
            init_scale, growth_factor, backoff_factor, growth_interval
        )
        if enabled and cuda_amp_unavailable(device) and CUDA_WARNING_AT_CALLER:
            # torch's own warning, said here so that it names the caller's line as torch's
            # does (said by torch's __init__, it would name this file). torch 2.4's names
            # its own line: its __init__ says it.
            warnings.warn(CUDA_UNAVAILABLE, stacklevel=2)
            enabled = False
        super().__init__(
            device, init_scale, growth_factor, backoff_factor, growth_interval, enabled
        )
        self._setup(options)

    def _unscale_grads_(
        self,
        optimizer: torch.optim.Optimizer,
        inv_scale: torch.Tensor,
        found_inf: torch.Tensor,
        allow_fp16: bool,
    ) -> dict[torch.device, torch.Tensor]:
        return unscale_grads(optimizer, inv_scale, found_inf, allow_fp16)

    def _torch_update(
        self, scale: torch.Tensor, tracker: torch.Tensor, found: torch.Tensor
    ) -> None:
        amp_update_scale_(
            scale, tracker, found, self._growth_factor, self._backoff_factor, self._growth_interval
        )

    def _attribution(self) -> Attribution:
        group = self._step_context.group
        if group is None:  # asked every step: cheaply, for a group may be made later
            group = self._group_info()
        if group is not None and group.size > 1:
            return Attribution.unknown()
        return Attribution.single()

    def _controls_for_step(self) -> list[tuple[ControlUpdate, str | None]]:
        if not self._inbox:
            return []
        requests = self._inbox.take_all()
        refusal = None
        if not self._attribution().known:
            refusal = (
                "GradScaler cannot apply a change on every rank at the same step; "
                "use ShardedGradScaler in multi-process jobs"
            )
        return [(update, refusal) for update in requests]
