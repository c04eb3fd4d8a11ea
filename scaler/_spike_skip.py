"""Skipping a spiking step, opt-in: decided on the device, alike on every rank.

Runs on the training thread of every rank. ``scaler.skip_on_spike(grad_norm_z=...,
loss_z=...)`` keeps, on the scale's device, the last ``window`` values of the gradient
norm and of the loss (finite ones, of steps that did not overflow) and judges each step's
by the rule the service flags spikes by (:mod:`scalewatch.store.spikes`): the robust z
``(value - median) / (1.4826 * MAD)`` over the window before the step, once the window
holds ``MIN_HISTORY`` values and its MAD is above 0. That rule rather than a running mean
and variance (ZClip's EMA): one spike moves neither the median nor the MAD, where it
inflates a running variance for tens of steps and hides the spike that follows; and a
step skipped is one the dashboard flags too (the service's median is numpy's, in float64;
this one is the same, in float32). Its price is two sorts of ``window`` floats per signal
and step, launched asynchronously like every other kernel of the step: nothing is read
on the host (torch's own ``nanmedian`` reads its count of NaNs on the host: a sync on a
GPU, so the median is taken here from the sorted window and the count of its values,
both left on the device).

The decision is a 0-d float32 tensor, 1 to skip. It is taken once a step, when ``step()``
first gates an optimizer, from the norm of the gradients unscaled by then; a step that
overflowed is no spike. Every rank decides alike, from the same numbers: the norm is the
same on every rank (DDP's replicas hold the same gradients; the squares of sharded ones
are summed in the found_inf all-reduce), and so is the loss a ``ShardedGradScaler`` in a
process group compares (the mean of the ranks' losses, summed in that same all-reduce);
each rank's windows have taken the same values.

>>> import torch
>>> skip = SpikeSkip(SkipRule(grad_norm_z=6.0, loss_z=None, window=50))
>>> clean = torch.zeros(())
>>> for i in range(30):
...     _ = skip.decide(torch.tensor(1.0 + 0.01 * (i % 5)), None, clean)
...     _ = skip.finish(clean)
>>> skip.decide(torch.tensor(9.0), None, clean).item(), skip.finish(clean).item()
(1.0, 1.0)
>>> skip.decide(torch.tensor(1.02), None, clean).item()
0.0
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .store.spikes import MAD_TO_SIGMA, MIN_HISTORY

__all__ = ["SPIKE", "SkipRule", "SpikeSkip", "check_z", "spiked_of"]

# What a skip for a spike adds to the step's found_inf as the record carries it: found_inf
# is 0 or at least 1, so a word strictly between says "skipped for a spike, no overflow".
SPIKE = 0.5


def spiked_of(word: float) -> tuple[float, bool]:
    """(found_inf, skipped for a spike) of a found_inf word as recorded.

    >>> spiked_of(0.0), spiked_of(0.5), spiked_of(1.0)
    ((0.0, False), (0.0, True), (1.0, False))
    """
    if 0.0 < word < 1.0:
        return 0.0, True
    return word, False


def check_z(name: str, z: float | None) -> float | None:
    """``z`` as a float, or a ``ValueError`` naming ``name``; None stays None."""
    if z is None:
        return None
    if isinstance(z, bool) or not isinstance(z, int | float) or not math.isfinite(z) or z <= 0:
        raise ValueError(f"{name} is a number above 0 (or None: no skip on it), not {z!r}")
    return float(z)


@dataclass(frozen=True, slots=True, kw_only=True)
class SkipRule:
    """What skips a step: a gradient norm, or a loss, whose z is above its threshold (None:
    that signal never skips), over the ``window`` steps before it."""

    grad_norm_z: float | None
    loss_z: float | None
    window: int


class _Window:
    """The last values of one signal, on the device, and the z rule over them."""

    __slots__ = ("_slot", "_values", "_z")

    def __init__(self, size: int, z: float, device: torch.device) -> None:
        self._values = torch.full((size,), math.nan, dtype=torch.float32, device=device)
        self._slot = torch.zeros(1, dtype=torch.int64, device=device)
        self._z = z

    def spikes(self, value: torch.Tensor) -> torch.Tensor:
        """Whether ``value`` (0-d float32) spikes over the window: a 0-d bool tensor."""
        values = self._values
        held = values.isfinite().sum()  # the empty slots are NaN
        median = _median(values, held)
        mad = _median((values - median).abs(), held)
        z = (value - median) / (MAD_TO_SIGMA * mad)
        return value.isfinite() & held.ge(MIN_HISTORY) & mad.gt(0) & z.gt(self._z)

    def push(self, value: torch.Tensor, clean: torch.Tensor) -> None:
        """Keep ``value`` where it is finite and its step ``clean`` (did not overflow)."""
        keep = clean & value.isfinite()
        slot = self._slot
        kept = torch.where(keep, value.reshape(1), self._values.index_select(0, slot))
        self._values.index_copy_(0, slot, kept)
        self._slot = (slot + keep.long()) % self._values.numel()


class SpikeSkip:
    """A scaler's skip on spikes: the windows, this step's decision, and the found_inf of
    the fused optimizers it gated (put back before the scale is updated). Transient: a
    copy of the scaler, or a resumed job, starts with empty windows."""

    def __init__(self, rule: SkipRule) -> None:
        self.rule = rule
        self.flag: torch.Tensor | None = None  # this step's decision, once taken
        # The ranks' mean loss where a process group agreed it this step (else None).
        self.loss: torch.Tensor | None = None
        # id(optimizer) -> its found_inf by device as agreed, before the gate
        self.gated: dict[int, dict[torch.device, torch.Tensor]] = {}
        self._norms: _Window | None = None
        self._losses: _Window | None = None
        self._values: tuple[torch.Tensor | None, torch.Tensor | None] = (None, None)

    def decide(
        self, norm: torch.Tensor | None, loss: torch.Tensor | None, found: torch.Tensor
    ) -> torch.Tensor:
        """This step's decision (taken at the first call of the step): 1 where the norm or
        the loss spikes and ``found`` (found_inf as agreed so far) is 0."""
        if self.flag is not None:
            return self.flag
        device = found.device
        rule = self.rule
        spiked = torch.zeros((), dtype=torch.bool, device=device)
        norm_value = loss_value = None
        if rule.grad_norm_z is not None and norm is not None:
            norm_value = _scalar(norm, device)
            if self._norms is None:
                self._norms = _Window(rule.window, rule.grad_norm_z, device)
            spiked = spiked | self._norms.spikes(norm_value)
        if rule.loss_z is not None and loss is not None:
            loss_value = _scalar(loss, device)
            if self._losses is None:
                self._losses = _Window(rule.window, rule.loss_z, device)
            spiked = spiked | self._losses.spikes(loss_value)
        self._values = (norm_value, loss_value)
        self.flag = (spiked & found.reshape(-1).sum().eq(0)).float()
        return self.flag

    def gate(self, found: torch.Tensor) -> torch.Tensor:
        """A fused optimizer's found_inf that also skips on this step's decision: 1 where
        either is (its kernel skips at exactly 1)."""
        assert self.flag is not None
        return torch.maximum(found, self.flag.to(found.device, found.dtype).reshape(found.shape))

    def finish(self, found: torch.Tensor) -> torch.Tensor | None:
        """At ``update()``: the windows take this step's values (where finite and ``found``,
        the step's found_inf, is 0); returns its decision (None: none was taken) and starts
        the next step."""
        flag, self.flag = self.flag, None
        self.gated = {}
        self.loss = None
        if flag is None:
            return None
        clean = found.reshape(-1).sum().eq(0)
        norm, loss = self._values
        self._values = (None, None)
        if norm is not None and self._norms is not None:
            self._norms.push(norm, clean)
        if loss is not None and self._losses is not None:
            self._losses.push(loss, clean)
        return flag


def _median(values: torch.Tensor, held: torch.Tensor) -> torch.Tensor:
    """The median of the ``held`` finite values of ``values`` (the rest NaN), as numpy's:
    the mean of the two middle ones of an even count; NaN where none is held.

    >>> values = torch.tensor([4.0, float("nan"), 1.0, 3.0, 2.0])
    >>> _median(values, values.isfinite().sum()).item()
    2.5
    """
    ordered = values.sort().values  # NaN sorts last
    low = (held - 1).clamp(min=0).div(2, rounding_mode="floor").reshape(1)
    high = held.div(2, rounding_mode="floor").clamp(max=values.numel() - 1).reshape(1)
    middle = ordered.index_select(0, low) + ordered.index_select(0, high)
    return middle.reshape(()) / 2


def _scalar(value: torch.Tensor, device: torch.device) -> torch.Tensor:
    return value.detach().reshape(()).to(device, torch.float32, non_blocking=True)
