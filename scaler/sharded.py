"""``ShardedGradScaler``: torch's FSDP scaler with per-rank attribution and telemetry."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from ._agreement import Agreement
from ._agreement import payload as _payload
from ._agreement.payload import Attribution
from ._config import Options
from ._control import ControlUpdate
from ._scaler import Instrumented
from ._torch_compat import (
    TorchShardedGradScaler,
    amp_update_scale_,
    found_on,
    maybe_opt_step_result,
    note_older_torch,
    require_supported_torch,
    unscale_local_grads,
)
from .mirrors import Mirror
from .store.spikes import SpikeRule


class ShardedGradScaler(Instrumented, TorchShardedGradScaler):
    """A drop-in ``torch.distributed.fsdp.sharded_grad_scaler.ShardedGradScaler``.

    Example::

        scaler = ShardedGradScaler(run_name="llm-fp16")   # was: torch's ShardedGradScaler()
        for input, target in data:
            optimizer.zero_grad()
            loss = loss_fn(fsdp_model(input), target)
            scaler.scale(loss).backward()
            scaler.step(optimizer)      # skipped on every rank if any rank saw inf/NaN
            scaler.update()
        scaler.close()

    Args:
        device (str, default "cuda"), init_scale (float, default 2.**16),
        backoff_factor (float, default 0.5), growth_factor (float, default 2.0),
        growth_interval (int, default 2000), enabled (bool, default True),
        process_group (default None: the default group, torch's ``dist.group.WORLD``):
            as torch's, in its order. torch's default is the group that is the default
            when its module is imported; None is the default group when the scaler runs,
            so a scaler made after ``destroy_process_group()`` and a new
            ``init_process_group()`` uses the new group. (Its rank and size are read at
            its first step and kept.)
        min_scale, max_scale, hysteresis, telemetry, run_name, mirrors, grad_norm, spikes
        (keyword-only):
            see :class:`scaler.GradScaler`.

    The all-reduce that agrees found_inf carries every rank's own flag (so the
    reporting rank, rank 0 of the group, knows which ranks overflowed) and any
    pending runtime-control request, so every rank applies it at the same step.
    Without an initialised process group it works as a single process.

    :meth:`skip_on_spike` (opt-in) skips a spiking step on every rank alike: the ranks judge
    the same gradient norm and the mean of their losses, summed in the same all-reduce.

    .. note:: unlike torch's class, the fused-optimizer path
       (``_step_supports_amp_scaling``) also agrees found_inf across ranks.
    """

    # Run the all-reduce even in a group of one rank (to measure what it costs).
    _reduce_alone = False
    _FOUND_SHAPE = (1,)  # torch's sharded found_inf has one element, its GradScaler's none
    _ALLOW_FP16 = True
    _TRANSIENT = (*Instrumented._TRANSIENT, "_agreement")

    def __init__(
        self,
        device: str = "cuda",
        init_scale: float = 2.0**16,
        backoff_factor: float = 0.5,
        growth_factor: float = 2.0,
        growth_interval: int = 2000,
        enabled: bool = True,
        process_group: dist.ProcessGroup | None = None,
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
        note_older_torch()
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
        super().__init__(
            device,
            init_scale,
            backoff_factor,
            growth_factor,
            growth_interval,
            enabled,
            process_group,
        )
        self._setup(options)

    def _reset_transient(self) -> None:
        super()._reset_transient()
        self._agreement = Agreement()

    # -------------------------------------------------------- found_inf

    def _unscale_grads_(
        self,
        optimizer: torch.optim.Optimizer,
        inv_scale: torch.Tensor,
        found_inf: torch.Tensor,
        allow_fp16: bool = True,
    ) -> dict[torch.device, torch.Tensor]:
        # torch's needs the scale only where no gradient names a device, as here.
        fallback = None if self._scale is None else self._scale.device
        self._diagnoser.optimizers.append(optimizer)
        found = unscale_local_grads(optimizer, inv_scale, found_inf, allow_fp16, fallback)
        if not found:
            raise AssertionError("Expected _scale to be initialized, got None")
        return found

    def _checked(self, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        self._agree_found_inf(optimizer, state)

    def _norm_ranks(self) -> int | None:
        group = self._group_info()
        return None if group is None else group.size

    def _agree_found_inf(self, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        """One all-reduce: every rank's flag, whether rank 0 carries a request, (with
        ``grad_norm``) the squares of the gradient shards each rank holds, and (with
        ``skip_on_spike(loss_z=...)``, once a step) each rank's loss."""
        group = self._group_info()
        if group is None:
            return
        assert self._scale is not None
        norm = self._grad_norm
        squares, norm.shard_squares = norm.shard_squares, None
        skip = self._spike_skip
        loss = None
        if skip is not None and skip.rule.loss_z is not None and skip.loss is None:
            loss = self._diagnoser.loss
            if loss is None:  # none seen: NaN, which judges nothing
                loss = torch.full((), math.nan, dtype=torch.float64, device=self._scale.device)
        extras = [
            x.detach().to(self._scale.device, torch.float64).reshape(1)
            for x in (squares, loss)
            if x is not None
        ]
        reduced = self._agreement.agree(
            id(optimizer),
            state["found_inf_per_device"],
            group,
            self._scale.device,
            self._inbox,
            self.process_group,
            self._reduce_alone,
            torch.cat(extras) if extras else None,
        )
        if reduced is None:
            return
        if squares is not None:
            norm.add_reduced(reduced[:1])
        if loss is not None:
            assert skip is not None
            skip.loss = reduced[-1] / group.size  # the ranks' mean, the same on every rank

    def _spike_loss(self) -> torch.Tensor | None:
        skip = self._spike_skip
        agreed = None if skip is None else skip.loss
        return agreed if agreed is not None else super()._spike_loss()

    def _maybe_opt_step(
        self,
        optimizer: torch.optim.Optimizer,
        optimizer_state: dict[str, Any],
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        agreement = self._agreement
        if not agreement.agreed(id(optimizer)):  # no process group: as GradScaler
            return super()._maybe_opt_step(optimizer, optimizer_state, *args, **kwargs)
        spiked = False
        if self._spike_skip is None:
            read = agreement.read(id(optimizer))  # one read, for torch's of each found_inf
            assert read is not None  # agreed
            host = read
        else:  # and the spike decision with it
            assert self._scale is not None
            flag = self._spike_flag(found_on(optimizer_state, self._scale.device))
            host, flag_read = agreement.read_with(id(optimizer), flag)
            spiked = flag_read > 0
        overflow = _payload.any_overflow(host)
        self._step_context.skips.decided(overflow or spiked)
        group = self._group_info() if overflow else None  # asked of an overflow only
        self._diagnoser.read_at_step(optimizer, host, overflow, agreement.attribution(), group)
        retval = None if overflow or spiked else optimizer.step(*args, **kwargs)
        return maybe_opt_step_result(retval, float(overflow))

    # ------------------------------------------------------------ update

    def _reporting_group(self) -> Any:
        return getattr(self, "process_group", None)  # a disabled scaler has none, as torch's

    def _step_flags(self) -> list[torch.Tensor] | list[list[float]]:
        assert self._scale is not None
        if not self._scale.is_cuda:  # the payloads' words, where read on the host already
            rows = self._agreement.host_rows()
            if rows is not None:
                return rows
        return self._agreement.flags()

    def _attribution(self) -> Attribution:
        return self._agreement.attribution()

    def _torch_update(
        self, scale: torch.Tensor, tracker: torch.Tensor, found: torch.Tensor
    ) -> None:
        if scale.device.type != "cpu":
            amp_update_scale_(
                scale,
                tracker,
                found,
                self._growth_factor,
                self._backoff_factor,
                self._growth_interval,
            )
            return
        # torch's ShardedGradScaler updates cpu scales in Python, with float32 arithmetic.
        rows = self._agreement.host_rows()
        if rows is not None:
            overflow = any(_payload.any_overflow(row) for row in rows)
        else:
            overflow = found.item() >= 1.0
        if overflow:
            scale *= self._backoff_factor
            tracker.fill_(0)
        else:
            successful = int(tracker.item()) + 1  # a cpu read: no sync
            if successful == self._growth_interval:
                scale *= self._growth_factor
                tracker.fill_(0)
            else:
                tracker.fill_(successful)  # torch's makes a new tensor of the same value

    def _multiply_scale(self, scale: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
        if scale.device.type != "cpu":
            return super()._multiply_scale(scale, factor)
        # As torch's cpu update (``scale *= factor``): float32 arithmetic.
        return scale * factor.float()

    def _controls_for_step(self) -> list[tuple[ControlUpdate, str | None]]:
        assert self._scale is not None
        group = self._group_info()
        inbox = self._inbox
        if not self._agreement.payloads and inbox and group is None:
            updates = inbox.take_all()  # no process group: a single process applies them now
        else:
            updates = self._agreement.controls(group, self._scale.device, self.process_group)
        return [(update, None) for update in updates]
