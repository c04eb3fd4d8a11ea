"""What a scaler is constructed with: torch's four values checked, and scalewatch's options."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from . import _control


class ScalerConfigError(ValueError, AssertionError):
    """A constructor or setter value that would break training.

    It is a ValueError; it is also an AssertionError because torch raises that
    for the same growth/backoff checks, so code catching either keeps working.
    """


class _ConfigTypeError(TypeError, ScalerConfigError):
    """A value that is no number at all: torch's own checks raise TypeError for it."""


def refusal(problem: str, *values: object) -> ScalerConfigError:
    """The error for ``problem``: a TypeError too when one of ``values`` is no number."""
    if any(not isinstance(v, int | float) for v in values):  # a bool is an int
        return _ConfigTypeError(problem)
    return ScalerConfigError(problem)


def not_an_integer(name: str, value: object) -> ScalerConfigError | None:
    """torch's sharded class takes ``2000.0`` as an interval; ours does not."""
    if isinstance(value, float):
        return ScalerConfigError(f"{name} must be an integer, got {value!r}")
    return None


@dataclass(frozen=True, slots=True)
class Options:
    """scalewatch's keyword-only constructor options (see :class:`scaler.GradScaler`)."""

    min_scale: float | None = None
    max_scale: float | None = None
    hysteresis: int | None = None
    telemetry: Any = None
    run_name: str | None = None
    mirrors: Sequence[Any] | None = None  # scalewatch.mirrors.Mirror; None: $SCALEWATCH_MIRROR
    grad_norm: bool | None = None  # None: $SCALEWATCH_GRAD_NORM, else off
    spikes: Any = None  # a SpikeRule: the run's spike window and threshold

    def torch_arguments(
        self, init_scale: Any, growth_factor: Any, backoff_factor: Any, growth_interval: Any
    ) -> tuple[float, float, float, int]:
        """Check the constructor's values; returns torch's four, a one-element tensor
        (which torch takes too) as the number it holds."""
        plain: list[Any] = [
            value.item() if isinstance(value, torch.Tensor) and value.numel() == 1 else value
            for value in (init_scale, growth_factor, backoff_factor, growth_interval)
        ]
        init_scale, growth_factor, backoff_factor, growth_interval = plain
        if _control.normalise("scale", init_scale) is None:
            raise refusal(f"init_{_control.RULES['scale']}", init_scale)
        values: dict[str, Any] = {
            "growth_factor": growth_factor,
            "backoff_factor": backoff_factor,
            "growth_interval": growth_interval,
        }
        extras = {"min_scale": self.min_scale, "max_scale": self.max_scale}
        extras["hysteresis"] = self.hysteresis
        values.update({k: v for k, v in extras.items() if v is not None})
        problem = _control.check(values, {})
        if problem is not None:
            raise refusal(problem, *values.values())
        error = not_an_integer("growth_interval", growth_interval)
        if error is not None:
            raise error
        return init_scale, growth_factor, backoff_factor, growth_interval
