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
this one is the same, in float32). Its price is two sorts of ``window`` floats a step
(the signals' windows are rows of one tensor), launched asynchronously like every other
kernel of the step: nothing is read on the host (torch's own ``nanmedian`` reads its
count of NaNs on the host, a sync on a GPU: the median is taken here from the sorted
window and the count of its values, both left on the device).

The decision is a 0-d float32 tensor, 1 to skip. It is taken once a step, when ``step()``
first gates an optimizer, from the norm of the gradients unscaled by then; a step that
overflowed is no spike. Every rank decides alike, from the same numbers: the norm is the
same on every rank (DDP's replicas hold the same gradients; the squares of sharded ones
are summed in the found_inf all-reduce), and so is the loss a ``ShardedGradScaler`` in a
process group compares (the mean of the ranks' losses, summed in that same all-reduce);
each rank's windows have taken the same values.

The windows are state: ``state()`` gives each signal's, oldest value first, for the
scaler's ``state_dict()``; ``load()`` takes them back, so a resumed job judges its first
step by the window it left off with (no new warm-up).

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

__all__ = ["SIGNALS", "SPIKE", "SkipRule", "SpikeSkip", "check_z", "spiked_of"]

# What a skip for a spike adds to the step's found_inf as the record carries it: found_inf
# is 0 or at least 1, so a word strictly between says "skipped for a spike, no overflow".
SPIKE = 0.5

# The signals judged, by name, in the order of the windows' rows (those with a threshold).
SIGNALS = ("grad_norm", "loss")


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


class _Windows:
    """The last values of each signal judged (a row each: the norm, the loss), on the
    device, and the z rule over them. One tensor for the signals: each step's kernels are
    launched once for all of them (on cpu a kernel's launch is most of its cost)."""

    __slots__ = ("_slots", "_values", "_z")

    def __init__(self, size: int, z: list[float], device: torch.device) -> None:
        self._values = torch.full((len(z), size), math.nan, dtype=torch.float32, device=device)
        self._slots = torch.zeros((len(z), 1), dtype=torch.int64, device=device)
        # z > threshold as (value - median) > threshold * 1.4826 * MAD: no division. Filled
        # in place: a tensor made from a list on a GPU is a copy the host waits for.
        self._z = torch.empty((len(z), 1), dtype=torch.float32, device=device)
        for row, threshold in enumerate(z):
            self._z[row].fill_(threshold * MAD_TO_SIGMA)

    def spikes(self, value: torch.Tensor, finite: torch.Tensor) -> torch.Tensor:
        """Whether any of ``value`` (a column, a float32 per signal) spikes over its window,
        where ``finite`` (a column): a 0-d bool tensor."""
        values = self._values
        held = values.eq(values).sum(1, keepdim=True)  # the empty slots are NaN
        middle = _middle(held, values.shape[1])
        median = _median(values, middle)
        mad = _median((values - median).abs(), middle)
        above = (value - median).gt(self._z * mad)
        return (above & finite & held.ge(MIN_HISTORY) & mad.gt(0)).any()

    def ordered(self) -> torch.Tensor:
        """Each row's values, oldest first (the empty slots, NaN, before them): on the
        device, nothing read."""
        size = self._values.shape[1]
        where = torch.arange(size, device=self._values.device) + self._slots
        return self._values.gather(1, where.remainder_(size))

    def fill(self, row: int, history: torch.Tensor) -> None:
        """Row ``row`` holds ``history`` (oldest first; its last ``size`` values): at the
        end of the row, the empty slots before them taken first, as a ring filled so far."""
        size = self._values.shape[1]
        kept = history.detach().reshape(-1)[-size:]
        kept = kept.to(self._values.device, torch.float32, non_blocking=True)
        self._values[row].fill_(math.nan)
        if kept.numel():
            self._values[row, size - kept.numel() :] = kept
        self._slots[row].zero_()

    def push(self, value: torch.Tensor, keep: torch.Tensor) -> None:
        """Keep each of ``value`` (a column) where ``keep`` (a column)."""
        slots = self._slots
        kept = torch.where(keep, value, self._values.gather(1, slots))
        self._values.scatter_(1, slots, kept)
        self._slots = slots + keep
        self._slots.remainder_(self._values.shape[1])


class SpikeSkip:
    """A scaler's skip on spikes: the windows, this step's decision, and the found_inf of
    the fused optimizers it gated (put back before the scale is updated). A resumed job
    takes its windows back from the state dict (:meth:`state`, :meth:`load`); a copy of
    the scaler (pickle, deepcopy) starts with empty ones."""

    def __init__(self, rule: SkipRule) -> None:
        self.rule = rule
        self.flag: torch.Tensor | None = None  # this step's decision, once taken
        # The ranks' mean loss where a process group agreed it this step (else None).
        self.loss: torch.Tensor | None = None
        # id(optimizer) -> its found_inf by device as agreed, before the gate
        self.gated: dict[int, dict[torch.device, torch.Tensor]] = {}
        self._windows: _Windows | None = None
        # this step's values judged (a column, a signal each), and where they are finite
        self._value: tuple[torch.Tensor, torch.Tensor] | None = None
        # windows loaded (by signal, oldest first), laid in when the windows are made
        self._loaded: dict[str, torch.Tensor] = {}

    @property
    def signals(self) -> tuple[str, ...]:
        """The names of the signals judged, in the order of the windows' rows."""
        rule = self.rule
        return tuple(
            name
            for name, z in zip(SIGNALS, (rule.grad_norm_z, rule.loss_z), strict=True)
            if z is not None
        )

    def state(self) -> dict[str, torch.Tensor]:
        """Each judged signal's window, oldest first, NaN where empty (a float32 vector of
        the rule's ``window`` values on cpu); empty before the first step and load.

        .. warning:: copies the windows to the host: a CPU-GPU sync on a GPU (as
           ``state_dict()`` reads the scale), never in a step.
        """
        if self._windows is None:
            return {name: history.clone() for name, history in self._loaded.items()}
        rows = self._windows.ordered().cpu()
        return {name: rows[row].clone() for row, name in enumerate(self.signals)}

    def load(self, histories: dict[str, torch.Tensor], device: torch.device | None) -> None:
        """Judge from now on by ``histories`` (as :meth:`state` gave them; a signal absent
        starts empty), in place of the windows held so far; laid on ``device`` (the
        scale's) now, or where the first step decides (None: not known yet)."""
        self._loaded = {
            name: torch.as_tensor(history, dtype=torch.float32).detach().reshape(-1).cpu()
            for name, history in histories.items()
            if name in SIGNALS
        }
        self._windows = None if device is None or not self._loaded else self._made_windows(device)

    def _made_windows(self, device: torch.device) -> _Windows:
        """New windows on ``device``, holding what was loaded."""
        rule = self.rule
        thresholds = [z for z in (rule.grad_norm_z, rule.loss_z) if z is not None]
        windows = _Windows(rule.window, thresholds, device)
        for row, name in enumerate(self.signals):
            if name in self._loaded:
                windows.fill(row, self._loaded[name])
        self._loaded = {}
        return windows

    def decide(
        self, norm: torch.Tensor | None, loss: torch.Tensor | None, found: torch.Tensor
    ) -> torch.Tensor:
        """This step's decision (taken at the first call of the step): 1 where the norm or
        the loss spikes and ``found`` (found_inf as agreed so far) is 0."""
        if self.flag is not None:
            return self.flag
        device = found.device
        rule = self.rule
        signals = [(norm, rule.grad_norm_z), (loss, rule.loss_z)]
        judged = [value for value, z in signals if z is not None]
        if self._windows is None:
            self._windows = self._made_windows(device)
        values = [_nan(device) if v is None else _scalar(v, device) for v in judged]
        value = values[0].reshape(1, 1) if len(values) == 1 else torch.stack(values)[:, None]
        finite = (value - value).eq(0)  # NaN and inf give NaN
        self._value = (value, finite)
        spiked = self._windows.spikes(value, finite)
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
        judged, self._value = self._value, None
        if judged is not None and self._windows is not None:
            value, finite = judged
            self._windows.push(value, finite & found.reshape(-1).sum().eq(0))
        return flag


def _middle(held: torch.Tensor, size: int) -> torch.Tensor:
    """Where each row's middle values lie once sorted, for ``held`` (a column) finite
    values in rows of ``size`` >= 2 (the rest NaN, sorted last): the lower and the upper
    middle (the one middle twice, for an odd count). None held: the last place, a NaN.
    (No ``clamp``: on an integer tensor on cpu it costs ten times a division.)"""
    low = (held - 1).div(2, rounding_mode="floor").remainder(size)
    return torch.cat((low, held.div(2, rounding_mode="floor")), 1)


def _median(values: torch.Tensor, middle: torch.Tensor) -> torch.Tensor:
    """Each row's median of its finite values (the rest NaN), as numpy's: the mean of the
    two middle ones of an even count; NaN where a row holds none. A column.

    >>> values = torch.tensor([[4.0, float("nan"), 1.0, 3.0, 2.0]])
    >>> _median(values, _middle(values.isfinite().sum(1, keepdim=True), 5)).tolist()
    [[2.5]]
    """
    return values.sort(1).values.gather(1, middle).mean(1, keepdim=True)


def _nan(device: torch.device) -> torch.Tensor:
    return torch.full((), math.nan, dtype=torch.float32, device=device)


def _scalar(value: torch.Tensor, device: torch.device) -> torch.Tensor:
    return value.detach().reshape(()).to(device, torch.float32, non_blocking=True)
