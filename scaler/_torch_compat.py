"""Every use of torch internals lives here, pinned by ``tests/scaler/test_torch_compat.py``.

That includes the bodies of our overrides of torch's private methods. What they rely on
(the signatures in ``PINNED``, the shapes of torch's state and returns) is checked when a
scaler is made (``_torch_check``): a torch whose privates changed refuses the scaler in one
line, rather than training on with a scaler that half-works.
"""

from __future__ import annotations

import gc
import importlib
import inspect
from collections import defaultdict
from typing import Any

import torch
import torch.distributed as dist
from torch.amp.grad_scaler import GradScaler as TorchGradScaler
from torch.distributed.fsdp.sharded_grad_scaler import (
    ShardedGradScaler as TorchShardedGradScaler,
)

from ._group import Group
from ._torch_check import (
    FSDP2_PUBLIC,
    PINNED,
    UnsupportedTorchError,
    mismatched_signatures,
    note_older_torch,
    require_supported_torch,
    step_shape,
    unsupported,
)

try:
    from torch.amp.grad_scaler import (
        OptState,
        _MultiDeviceReplicator,
        _refresh_per_optimizer_state,
    )
    from torch.distributed.fsdp._common_utils import clean_tensor_name
    from torch.distributed.fsdp.sharded_grad_scaler import _GeneralMultiDeviceReplicator
except ImportError as missing:  # one line naming the torch, not an import traceback
    raise unsupported(str(missing)) from None

__all__ = [
    "CUDA_WARNING_AT_CALLER",
    "FSDP2_PUBLIC",
    "PINNED",
    "OptState",
    "TorchGradScaler",
    "TorchShardedGradScaler",
    "UnsupportedTorchError",
    "_GeneralMultiDeviceReplicator",
    "_MultiDeviceReplicator",
    "_refresh_per_optimizer_state",
    "amp_update_scale_",
    "clean_parameter_name",
    "combined_found_inf",
    "cuda_amp_unavailable",
    "deprecation_of",
    "flat_param_parts",
    "foreach_l2_norm",
    "found_on",
    "fsdp2",
    "gather_to_group_rank0",
    "local_tensor",
    "maybe_opt_step_result",
    "mismatched_signatures",
    "non_finite_check_and_unscale_",
    "note_older_torch",
    "opt_step_unless_inf",
    "process_group_info",
    "require_supported_torch",
    "shard_count",
    "unscale_grads",
    "unscale_local_grads",
]


def maybe_opt_step_result(retval: Any, found: float) -> Any:
    """What this torch's ``_maybe_opt_step`` would return for ``retval``, found_inf summed to
    ``found``: ``retval``, or ``(retval, found_inf)`` where torch returns the pair (what
    ``step(..., return_found_inf=True)`` hands back)."""
    shape = step_shape()
    if isinstance(shape, str) or not shape.pair:  # an unknown shape: construction refused it
        return retval
    if shape.found_type is torch.Tensor:
        return retval, torch.tensor(float(found))
    return retval, bool(found)


def opt_step_unless_inf(
    optimizer: torch.optim.Optimizer,
    optimizer_state: dict[str, Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> tuple[Any, float]:
    """torch's ``_maybe_opt_step``: step unless found_inf is set, reading each found_inf
    as torch does. Returns (what torch's returns, the found_inf sum read on the host)."""
    found = sum(v.item() for v in optimizer_state["found_inf_per_device"].values())
    retval = None if found else optimizer.step(*args, **kwargs)
    return maybe_opt_step_result(retval, found), float(found)


def found_on(state: dict[str, Any], device: torch.device) -> torch.Tensor:
    """An optimizer's found_inf (torch's per-optimizer ``state``) summed over its devices:
    0-d on ``device``, asynchronous as torch's own ``to(scale.device)``."""
    founds = [
        found.to(device, non_blocking=True).reshape(())
        for found in state["found_inf_per_device"].values()
    ]
    if not founds:
        return torch.zeros((), dtype=torch.float32, device=device)
    return founds[0] if len(founds) == 1 else torch.stack(founds).sum()


def combined_found_inf(
    states: dict[int, dict[str, Any]],
    scale: torch.Tensor,
    required: bool = True,
    in_place: bool = True,
) -> torch.Tensor | None:
    """The found_inf of every optimizer (torch's per-optimizer ``states``) summed, into the
    first one's as torch's ``update()`` does (``in_place``), or into a new tensor (then a
    fused optimizer's 0-d flag and another optimizer's one-element flag add up too).

    None where none was recorded and not ``required`` (else torch's AssertionError).
    """
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
        for state in states.values()
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


Grouped = dict[torch.device, dict[torch.dtype, list[torch.Tensor]]]


def _grouped() -> Grouped:
    return defaultdict(lambda: defaultdict(list))


def unscale_grads(
    optimizer: torch.optim.Optimizer,
    inv_scale: torch.Tensor,
    found_inf: torch.Tensor,
    allow_fp16: bool,
) -> dict[torch.device, torch.Tensor]:
    """torch.amp.GradScaler's ``_unscale_grads_``: the same checks, errors and numbers."""
    with torch.no_grad():
        grouped = _group_grads(optimizer, allow_fp16, sharded=False)
        return _check_grouped(grouped, inv_scale, found_inf, _MultiDeviceReplicator)


def unscale_local_grads(
    optimizer: torch.optim.Optimizer,
    inv_scale: torch.Tensor,
    found_inf: torch.Tensor,
    allow_fp16: bool,
    fallback_device: torch.device | None,
) -> dict[torch.device, torch.Tensor]:
    """torch's ShardedGradScaler._unscale_grads_, each rank checking only its local shard.

    Returns found_inf per device; a rank that holds no gradient shard at all still gets
    one on ``fallback_device``, for it takes part in the all-reduce.
    """
    with torch.no_grad():
        grouped = _group_grads(optimizer, allow_fp16, sharded=True)
        return _check_grouped(
            grouped, inv_scale, found_inf, _GeneralMultiDeviceReplicator, fallback_device
        )


def _group_grads(optimizer: torch.optim.Optimizer, allow_fp16: bool, sharded: bool) -> Grouped:
    """``optimizer``'s gradients to check, by device and dtype, as torch's GradScaler
    groups them, or (``sharded``) its ShardedGradScaler: a DTensor's local shard, no check
    that each param is a tensor, and a sparse fp16 gradient coalesced in float32."""
    grouped = _grouped()
    for group in optimizer.param_groups:
        for param in group["params"]:
            if not sharded and not isinstance(param, torch.Tensor):
                raise AssertionError(
                    f"expected param to be torch.Tensor, got {type(param).__name__}"
                )
            grad = param.grad
            if grad is None:
                continue
            if (not allow_fp16) and grad.dtype == torch.float16:
                raise ValueError("Attempting to unscale FP16 gradients.")
            if grad.is_sparse:
                # Coalescing may overflow scaled fp16 values: check the coalesced ones.
                if grad.dtype is torch.float16:
                    if sharded:
                        grad = grad.type(torch.float32).coalesce().type(torch.float16)
                    else:
                        grad = grad.coalesce()
                    param.grad = grad
                to_unscale = grad._values()
            elif not sharded or type(grad) is torch.Tensor:  # no call per plain grad
                to_unscale = grad
            else:
                to_unscale = local_tensor(grad)
            grouped[to_unscale.device][to_unscale.dtype].append(to_unscale)
    return grouped


def _check_grouped(
    grouped: Grouped,
    inv_scale: torch.Tensor,
    found_inf: torch.Tensor,
    replicator: Any,
    fallback_device: torch.device | None = None,
) -> dict[torch.device, torch.Tensor]:
    """Check and unscale each device's and dtype's gradients; found_inf per device."""
    if len(grouped) == 1 and found_inf.device in grouped:
        # One device, the scale's: torch's replicators would copy both tensors to the
        # device they are on. Checked with them as they are: the same numbers.
        for grads in grouped[found_inf.device].values():
            non_finite_check_and_unscale_(grads, found_inf, inv_scale)
        return {found_inf.device: found_inf}
    per_device_inv_scale = replicator(inv_scale)
    per_device_found_inf = replicator(found_inf)
    for device, per_dtype in grouped.items():
        for grads in per_dtype.values():
            non_finite_check_and_unscale_(
                grads, per_device_found_inf.get(device), per_device_inv_scale.get(device)
            )
    if not grouped and fallback_device is not None:
        per_device_found_inf.get(fallback_device)
    tensors: dict[torch.device, torch.Tensor] = per_device_found_inf._per_device_tensors
    return tensors


def non_finite_check_and_unscale_(
    grads: list[torch.Tensor], found_inf: torch.Tensor, inv_scale: torch.Tensor
) -> None:
    """Multiply ``grads`` by ``inv_scale`` in place; set ``found_inf`` to 1 if any is inf/NaN."""
    torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale)


# torch.amp.GradScaler's warning when it disables itself for want of CUDA, word for word.
CUDA_UNAVAILABLE = "torch.cuda.amp.GradScaler is enabled, but CUDA is not available.  Disabling."


def _warns_at_the_caller() -> bool:
    """Whether torch's GradScaler names its caller's line in that warning (from torch 2.5;
    torch 2.4's names its own)."""
    try:
        source = inspect.getsource(TorchGradScaler.__init__)
    except (OSError, TypeError):  # no source installed: as the newest torch does
        return True
    call = source.partition(repr(CUDA_UNAVAILABLE)[1:-1])[2].partition(")")[0]
    return "stacklevel" in call


CUDA_WARNING_AT_CALLER = _warns_at_the_caller()


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


_DIST_AVAILABLE = dist.is_available()


_GATHER_TAKES_GROUP_DST = "group_dst" in inspect.signature(dist.gather).parameters


def gather_to_group_rank0(
    tensor: torch.Tensor, slots: list[torch.Tensor] | None, group: Any
) -> None:
    """``dist.gather`` of ``tensor`` into ``slots`` on the group's rank 0 (``group_dst``
    from torch 2.6; before it, that rank's global rank)."""
    if _GATHER_TAKES_GROUP_DST:
        dist.gather(tensor, slots, group=group, group_dst=0)
    else:
        named: Any = group if group is not None else dist.group.WORLD
        dst = dist.get_global_rank(named, 0)
        dist.gather(tensor, slots, dst=dst, group=group)


def process_group_info(group: Any) -> Group | None:
    """This process's place in ``group``, or None when no process group is initialised."""
    if not (_DIST_AVAILABLE and dist.is_initialized()):  # asked every step without a group
        return None
    return Group(dist.get_rank(group), dist.get_world_size(group))


def deprecation_of(device: str) -> str:
    """The FutureWarning text of torch's deprecated ``torch.<device>.amp.GradScaler``."""
    module = importlib.import_module(f"torch.{device}.amp.grad_scaler")
    message: Any = getattr(module.GradScaler.__init__, "__deprecated__", None)
    if isinstance(message, str):
        return message
    return (  # a torch whose alias is no longer marked so: its words as of torch 2.13
        f"`torch.{device}.amp.GradScaler(args...)` is deprecated. "
        f"Please use `torch.amp.GradScaler('{device}', args...)` instead."
    )


def foreach_l2_norm(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each tensor's 2-norm, one fused pass over tensors of one device and dtype.

    Non-finite exactly when the tensor holds inf or NaN, or when its sum of squares
    overflows (float32 values past ~1e19). On cpu the 2-norm is some 40 times faster
    than the infinity norm.
    """
    return list(torch._foreach_norm(tensors, 2))


def shard_count(param: torch.Tensor, grad: torch.Tensor) -> int:
    """Into how many distinct shards the ranks split the gradient of which ``grad`` is this
    rank's one; 1: a whole gradient, every rank (of its replicas) holding it alike.

    A DTensor gradient (FSDP2): the sizes of the mesh dimensions it is sharded on (on a
    2-D mesh of HSDP, the shard dimension's alone: the replicas hold the same shards). An
    FSDP1 flat parameter: its padded whole over its shard (a ``NO_SHARD`` one keeps no
    padded whole: 1; ``HYBRID_SHARD``'s is split over its shard group alone). The original
    parameters an FSDP1 module made with ``use_orig_params=True`` hands the optimizer: those
    of their flat parameter (each a view into this rank's shard of it, empty or partial).
    """
    placements: Any = getattr(grad, "placements", None)
    if placements is not None:
        mesh: Any = grad.device_mesh  # type: ignore[attr-defined]
        count = 1
        for dim, placement in enumerate(placements):
            if placement.is_shard():
                count *= int(mesh.size(dim))
        return count
    if getattr(param, "_is_flat_param", False):
        return _flat_shard_count(param)
    if getattr(param, "_fsdp_flattened", False):  # an original parameter of a flat one
        return _original_shard_count(param)
    return 1


def _flat_shard_count(flat: torch.Tensor) -> int:
    """An FSDP1 flat parameter's count of shards (1: ``NO_SHARD``, or not yet sharded)."""
    padded: Any = getattr(flat, "_padded_unsharded_size", None)
    sharded: Any = getattr(flat, "_sharded_size", None)
    if padded is None or sharded is None or not sharded.numel():
        return 1
    return max(1, int(padded.numel()) // int(sharded.numel()))


# Where an FSDP1 original parameter keeps its flat parameter's count of shards. FSDP marks
# the originals (``_fsdp_flattened``) but keeps no way back to their flat parameter: they
# are found in the live flat parameters' ``_params`` once (a scan of the heap, some 0.2 s
# for 500k objects), and marked as FSDP marks them, with an attribute.
_SHARDS = "_scalewatch_shard_count"


def _original_shard_count(param: torch.Tensor) -> int:
    count: int | None = getattr(param, _SHARDS, None)
    if count is None:
        for flat in _flat_params():
            flat_count = _flat_shard_count(flat)
            for original in getattr(flat, "_params", None) or ():
                setattr(original, _SHARDS, flat_count)
        count = getattr(param, _SHARDS, None)
        if count is None:  # in none (not FSDP's): whole
            count = 1
            setattr(param, _SHARDS, count)
    return count


def _flat_params() -> list[torch.Tensor]:
    """Every live FSDP1 flat parameter. ``type()``, not ``isinstance``: the latter asks
    every object its ``__class__``, which some of torch's deprecated names warn on."""
    return [
        obj
        for obj in gc.get_objects()
        if issubclass(type(obj), torch.Tensor) and getattr(obj, "_is_flat_param", False)
    ]


def clean_parameter_name(name: str) -> str:
    """``name`` without FSDP's (and activation checkpointing's) wrapper prefixes.

    >>> clean_parameter_name("_fsdp_wrapped_module.2._fsdp_wrapped_module._flat_param")
    '2._flat_param'
    """
    return clean_tensor_name(name)


def flat_param_parts(param: torch.Tensor) -> list[tuple[str, int, int]] | None:
    """An FSDP1 flat parameter's originals in this rank's shard, as (name relative to the
    flat parameter's module, offset in the shard, elements); None for any other tensor."""
    if not getattr(param, "_is_flat_param", False):
        return None
    fqns: Any = getattr(param, "_fqns", ())
    infos: Any = getattr(param, "_shard_param_infos", None)
    if infos is None:  # not sharded: the originals one after another
        numels: Any = getattr(param, "_numels", ())
        offsets = [sum(numels[:i]) for i in range(len(numels))]
        return [(fqn, o, n) for fqn, o, n in zip(fqns, offsets, numels, strict=True)]
    return [
        (fqn, int(info.offset_in_shard), int(info.numel_in_shard))
        for fqn, info in zip(fqns, infos, strict=True)
        if info.in_shard
    ]


def fsdp2() -> Any:
    """FSDP2's module (``fully_shard``, ``MixedPrecisionPolicy``): ``torch.distributed.fsdp``
    from torch 2.6, ``torch.distributed._composable.fsdp`` before it."""
    if FSDP2_PUBLIC:
        return importlib.import_module("torch.distributed.fsdp")
    return importlib.import_module("torch.distributed._composable.fsdp")
