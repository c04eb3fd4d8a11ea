"""Whether the torch we run on is one whose internals ``scalewatch._torch_compat`` knows.

Each scaler checks at construction (once a process) what it relies on: the signatures of
the privates it overrides or calls (``PINNED``), the shape of torch's per-optimizer state,
the shape of ``_maybe_opt_step``'s return, and the fused kernels. A torch that differs
fails there with :class:`UnsupportedTorchError`, one line naming the torch and the
difference, rather than with a traceback inside ``step()``.
"""

from __future__ import annotations

import enum
import functools
import inspect
import logging
from typing import Any, NamedTuple

import torch
from torch.amp import grad_scaler as amp_grad_scaler
from torch.distributed import fsdp
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler as _TorchSharded

_TorchPlain = torch.amp.GradScaler

log = logging.getLogger("scalewatch")

# FSDP2's fully_shard is public (torch.distributed.fsdp) from torch 2.6.
FSDP2_PUBLIC = hasattr(fsdp, "fully_shard")


class UnsupportedTorchError(RuntimeError):
    """This torch's internals are not those the scaler was written and tested against."""


def unsupported(mismatch: str) -> UnsupportedTorchError:
    """The error for ``mismatch`` on this torch, on one line.

    >>> str(unsupported("no _amp_update_scale_")).startswith("scalewatch does not support torch")
    True
    """
    said = " ".join(mismatch.split())  # one line, whatever torch's message held
    return UnsupportedTorchError(
        f"scalewatch does not support torch {torch.__version__}: {said} (tested: torch 2.4 to 2.15)"
    )


# (class, method) -> its parameters, for every torch private we override or call.
PINNED: dict[tuple[type, str], tuple[str, ...]] = {
    (_TorchPlain, "_maybe_opt_step"): ("self", "optimizer", "optimizer_state", "args", "kwargs"),
    (_TorchPlain, "_check_inf_per_device"): ("self", "optimizer"),
    (_TorchPlain, "_check_scale_growth_tracker"): ("self", "funcname"),
    (_TorchPlain, "_get_growth_tracker"): ("self",),
    (_TorchPlain, "_unscale_grads_"): ("self", "optimizer", "inv_scale", "found_inf", "allow_fp16"),
    (_TorchPlain, "unscale_"): ("self", "optimizer"),
    (_TorchPlain, "update"): ("self", "new_scale"),
    (_TorchSharded, "_unscale_grads_"): (
        "self",
        "optimizer",
        "inv_scale",
        "found_inf",
        "allow_fp16",
    ),
    (_TorchSharded, "unscale_"): ("self", "optimizer"),
    (_TorchSharded, "update"): ("self", "new_scale"),
}

KERNELS = ("_amp_foreach_non_finite_check_and_unscale_", "_amp_update_scale_", "_foreach_norm")


def mismatched_signatures() -> list[str]:
    """The pinned methods whose parameters in this torch differ from ``PINNED``."""
    wrong = []
    for (cls, name), expected in PINNED.items():
        method = getattr(cls, name, None)
        if method is None:
            wrong.append(f"{cls.__name__}.{name} is gone")
            continue
        found = tuple(inspect.signature(method).parameters)
        if found != expected:
            wrong.append(f"{cls.__name__}.{name}{found}, expected {expected}")
    return wrong


def per_optimizer_state_mismatch() -> str | None:
    """How torch's fresh per-optimizer state differs from ``{"stage": OptState.READY,
    "found_inf_per_device": {}}`` with stages READY, UNSCALED, STEPPED; None if it does not."""
    opt_state: Any = getattr(amp_grad_scaler, "OptState", None)
    refresh: Any = getattr(amp_grad_scaler, "_refresh_per_optimizer_state", None)
    if opt_state is None or refresh is None:
        return "torch.amp.grad_scaler has no OptState or _refresh_per_optimizer_state"
    stages = [m.name for m in opt_state] if issubclass(opt_state, enum.Enum) else None
    if stages != ["READY", "UNSCALED", "STEPPED"]:
        return f"OptState's stages are {stages}, expected ['READY', 'UNSCALED', 'STEPPED']"
    fresh = refresh()
    expected = {"stage": opt_state.READY, "found_inf_per_device": {}}
    if fresh != expected:
        return f"a fresh per-optimizer state is {fresh!r}, expected {expected!r}"
    return None


class StepShape(NamedTuple):
    """What torch's ``_maybe_opt_step`` returns: the optimizer's return value alone, or
    (``pair``) with found_inf after it, as a value of type ``found_type``."""

    pair: bool
    found_type: type | None = None


class _Probe:
    """An optimizer that only says it stepped."""

    def step(self, *args: Any, **kwargs: Any) -> str:
        return "stepped"


@functools.cache
def step_shape() -> StepShape | str:
    """The shape of this torch's ``_maybe_opt_step`` return, found by calling it on a clean
    state with an optimizer that returns a marker; a string saying what it returned if
    neither known shape."""
    state = {"stage": None, "found_inf_per_device": {torch.device("cpu"): torch.zeros(1)}}
    probe: Any = _Probe()  # stands in for an optimizer
    try:
        returned: Any = _TorchPlain._maybe_opt_step(_TorchPlain("cpu", enabled=False), probe, state)
    except Exception as exc:  # a torch whose step wants more than the pinned arguments
        return f"_maybe_opt_step on a clean state raised {type(exc).__name__}: {exc}"
    if returned == "stepped":
        return StepShape(pair=False)
    if (
        isinstance(returned, tuple)
        and len(returned) == 2
        and returned[0] == "stepped"
        and isinstance(returned[1], bool | torch.Tensor)
    ):
        return StepShape(pair=True, found_type=type(returned[1]))
    return f"_maybe_opt_step returned {returned!r}, expected the optimizer's return value"


def torch_mismatch() -> str | None:
    """The first way this torch differs from what the scaler relies on; None if none."""
    missing = [name for name in KERNELS if not hasattr(torch, name)]
    if missing:
        return f"torch has no {', '.join(missing)}"
    wrong = mismatched_signatures()
    if wrong:
        return f"private signature changed: {wrong[0]}"
    state = per_optimizer_state_mismatch()
    if state is not None:
        return state
    shape = step_shape()
    return shape if isinstance(shape, str) else None


@functools.cache
def _checked() -> str | None:
    return torch_mismatch()


def require_supported_torch() -> None:
    """Raise :class:`UnsupportedTorchError` unless this torch is one the scaler knows (the
    checks run once a process)."""
    mismatch = _checked()
    if mismatch is not None:
        raise unsupported(mismatch)


def forget_checks() -> None:
    """Check again at the next construction (for tests that stand in another torch)."""
    _checked.cache_clear()
    step_shape.cache_clear()
    note_older_torch.cache_clear()


@functools.cache
def note_older_torch() -> None:
    """Say once a process, in one line, what this torch lacks that the sharded scaler's
    tests use: FSDP2 before torch 2.6 is tested with neither this scaler nor torch's."""
    if not FSDP2_PUBLIC:
        log.warning(
            "scalewatch: torch %s predates FSDP2's public fully_shard (torch 2.6):"
            " ShardedGradScaler is tested on it with DDP and FSDP1, not FSDP2",
            torch.__version__,
        )
