"""Every use of torch internals lives here, pinned by ``tests/scaler/test_torch_compat.py``."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.amp.grad_scaler import GradScaler as TorchGradScaler
from torch.amp.grad_scaler import OptState, _MultiDeviceReplicator, _refresh_per_optimizer_state
from torch.distributed.fsdp.sharded_grad_scaler import (
    ShardedGradScaler as TorchShardedGradScaler,
)
from torch.distributed.fsdp.sharded_grad_scaler import _GeneralMultiDeviceReplicator

__all__ = [
    "OptState",
    "TorchGradScaler",
    "TorchShardedGradScaler",
    "_GeneralMultiDeviceReplicator",
    "_MultiDeviceReplicator",
    "_refresh_per_optimizer_state",
    "amp_update_scale_",
    "cuda_amp_unavailable",
    "local_tensor",
    "non_finite_check_and_unscale_",
    "process_group_info",
]


def non_finite_check_and_unscale_(
    grads: list[torch.Tensor], found_inf: torch.Tensor, inv_scale: torch.Tensor
) -> None:
    """Multiply ``grads`` by ``inv_scale`` in place; set ``found_inf`` to 1 if any is inf/NaN."""
    torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale)


# torch.amp.GradScaler's warning when it disables itself for want of CUDA, word for word.
CUDA_UNAVAILABLE = "torch.cuda.amp.GradScaler is enabled, but CUDA is not available.  Disabling."


def cuda_amp_unavailable(device: str) -> bool:
    """Whether torch's GradScaler on ``device`` would disable itself: cuda, and none here."""
    if device != "cuda":
        return False
    unavailable: Any = torch.cuda.amp.common.amp_definitely_not_available  # untyped in torch
    return bool(unavailable())


def amp_update_scale_(
    scale: torch.Tensor,
    growth_tracker: torch.Tensor,
    found_inf: torch.Tensor,
    growth_factor: float,
    backoff_factor: float,
    growth_interval: int,
) -> None:
    """torch's fused scale update kernel (cpu and cuda)."""
    torch._amp_update_scale_(
        scale, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval
    )


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The shard this rank holds: a DTensor's local tensor, any other tensor itself.

    Unwrapping keeps the inf check local (DTensor would otherwise all-reduce
    ``found_inf`` on its own) so that each rank's flag can be told apart.
    """
    local: Any = getattr(tensor, "_local_tensor", None)
    return local if isinstance(local, torch.Tensor) else tensor


def process_group_info(group: Any) -> tuple[int, int] | None:
    """(rank in group, group size), or None when no process group is initialised."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    return dist.get_rank(group), dist.get_world_size(group)
