"""The scale rules scalewatch adds to torch's: min/max bounds and Megatron's hysteresis.

Runs on the training thread of every rank. All off by default, so that a scaler without
them behaves exactly as torch's. A scaler pickled before this module had its name names
``scalewatch._extras.Extras`` (or ``scaler._extras.Extras``): the unpickler of
docs/TRAINING.md reads it as this class.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

Multiply = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(slots=True)
class ScaleRules:
    """min_scale/max_scale clamp the scale; ``hysteresis`` backs off only after that many
    overflows since the last growth. ``hysteresis_start`` is the tracker's value before
    its tensor exists (and what a checkpoint keeps); ``tracker`` is the tensor itself.

    >>> ScaleRules(min_scale=2.0, max_scale=8.0).clamped(16.0)
    8.0
    """

    min_scale: float | None = None
    max_scale: float | None = None
    hysteresis: int | None = None
    hysteresis_start: int | None = None
    tracker: torch.Tensor | None = None

    @property
    def bounded(self) -> bool:
        return self.min_scale is not None or self.max_scale is not None

    def clamped(self, scale: float) -> float:
        if self.min_scale is not None:
            scale = max(scale, self.min_scale)
        return scale if self.max_scale is None else min(scale, self.max_scale)

    def clamp_(self, scale: torch.Tensor | None) -> None:
        if scale is not None and self.bounded:
            scale.clamp_(min=self.min_scale, max=self.max_scale)

    def set(self, name: str, value: float | int) -> None:
        """Apply a validated min_scale, max_scale or hysteresis from the next update on."""
        if name == "hysteresis":
            self.hysteresis = int(value)
            if self.tracker is not None:
                self.tracker.clamp_(max=int(value))
            start = self.hysteresis_start
            self.hysteresis_start = int(value) if start is None else min(start, int(value))
        else:
            setattr(self, name, float(value))

    def hysteresis_value(self) -> int | None:
        """The hysteresis tracker's value (reads a device value: a sync on cuda)."""
        if self.tracker is not None:
            return int(self.tracker.item())
        return self.hysteresis_start

    def state(self) -> dict[str, Any]:
        return {
            "min_scale": self.min_scale,
            "max_scale": self.max_scale,
            "hysteresis": self.hysteresis,
            "hysteresis_tracker": self.hysteresis_value(),
        }

    def load(self, state: dict[str, Any]) -> None:
        self.min_scale = state.get("min_scale")
        self.max_scale = state.get("max_scale")
        self.hysteresis = state.get("hysteresis")
        self.hysteresis_start = state.get("hysteresis_tracker")
        if self.tracker is not None and self.hysteresis_start is not None:
            self.tracker.fill_(self.hysteresis_start)

    def hysteresis_update(
        self,
        scale: torch.Tensor,
        tracker: torch.Tensor,
        found: torch.Tensor,
        factors: tuple[int, float, float],
        multiply: Multiply,
    ) -> None:
        """Megatron's rule: back off only after ``hysteresis`` overflows since the last growth.

        ``factors``: (growth_interval, growth_factor, backoff_factor).
        """
        assert self.hysteresis is not None
        interval, growth_factor, backoff_factor = factors
        hyst = self._tracker(scale.device)
        overflow = found.reshape(()) > 0
        successful = tracker + 1
        grow = ~overflow & (successful >= interval)
        new_hyst = torch.where(overflow, hyst - 1, torch.where(grow, self.hysteresis, hyst))
        backoff = overflow & (new_hyst <= 0)
        one = torch.ones((), dtype=torch.float64, device=scale.device)
        factor = torch.where(backoff, backoff_factor, torch.where(grow, growth_factor, one))
        grown = multiply(scale, factor)
        keep = grow & ~torch.isfinite(grown)
        scale.copy_(torch.where(keep, scale, grown))
        tracker.copy_(torch.where(overflow | grow, torch.zeros_like(tracker), successful))
        hyst.copy_(new_hyst)

    def _tracker(self, device: torch.device) -> torch.Tensor:
        if self.tracker is None:
            start = self.hysteresis_start
            if start is None:
                start = self.hysteresis or 1
            self.tracker = torch.full((), start, dtype=torch.int32, device=device)
        return self.tracker

    def for_pickle(self) -> ScaleRules:
        """A copy without the tracker tensor, whose value it keeps as the start."""
        start = self.hysteresis_value()
        return ScaleRules(self.min_scale, self.max_scale, self.hysteresis, start, None)
