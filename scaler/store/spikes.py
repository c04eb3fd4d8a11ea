"""Loss and gradient-norm spikes: a step's value far above the run's recent history.

Found where steps are written (the store's write path: the telemetry writer's thread or
process, never the training thread). A value is compared with the ``window`` values
before it (finite values of steps that did not overflow): its robust z is
``(value - median) / (1.4826 * MAD)``, and above ``z`` it is a spike. Overflow steps are
never spikes, nor part of a window. The median and MAD are taken once per ``BLOCK``
steps, over the window before the block (one sort per block, not per step: a window
of 200 moves by at most ``BLOCK - 1`` values before it is read again); a window with
fewer than ``MIN_HISTORY`` values, or a MAD of 0, flags nothing.

A run's ``window`` and ``z`` are its config's ``"spikes"`` entry (the scaler's
``spikes=`` option), else :data:`DEFAULT`.

>>> rule = SpikeRule()
>>> values = [1.0 + 0.01 * (i % 7) for i in range(100)] + [5.0]
>>> [(i, round(z)) for i, z in find(values[:100], values[100:], rule)]
[(0, 134)]
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

BLOCK = 16
MIN_HISTORY = 20
MAD_TO_SIGMA = 1.4826  # a normal distribution's sigma is 1.4826 times its MAD
WHAT = ("loss", "grad_norm")


@dataclass(frozen=True, slots=True)
class SpikeRule:
    """A run's spike rule: the values compared with, and the z above which one spikes."""

    window: int = 200
    z: float = 6.0

    def __post_init__(self) -> None:
        if isinstance(self.window, bool) or not isinstance(self.window, int):
            raise ValueError(f"a spike window is a number of steps, not {self.window!r}")
        if not MIN_HISTORY <= self.window <= 100_000:
            raise ValueError(f"a spike window is {MIN_HISTORY} to 100000 steps, not {self.window}")
        if not (isinstance(self.z, int | float) and math.isfinite(self.z) and self.z > 0):
            raise ValueError(f"a spike threshold z is a number above 0, not {self.z!r}")

    def as_config(self) -> dict[str, Any]:
        return {"window": self.window, "z": float(self.z)}


DEFAULT = SpikeRule()


def rule_of(config: Mapping[str, Any] | None) -> SpikeRule:
    """The rule a run's config names (a config without one, or a broken one: the default)."""
    entry = (config or {}).get("spikes")
    if not isinstance(entry, Mapping):
        return DEFAULT
    try:
        return SpikeRule(int(entry.get("window", DEFAULT.window)), float(entry.get("z", DEFAULT.z)))
    except (TypeError, ValueError):
        return DEFAULT


def find(
    history: Sequence[float], values: Sequence[float], rule: SpikeRule
) -> list[tuple[int, float]]:
    """``(index in values, z)`` of each of ``values`` that spikes, each compared with the
    ``rule.window`` values before it (``history``, the last values before these, then
    ``values`` themselves). Every value given is a finite one of a step that did not
    overflow."""
    if not values:
        return []
    every = np.asarray([*history[-rule.window :], *values], dtype=np.float64)
    first = len(every) - len(values)
    starts = np.arange(first, len(every), BLOCK)
    medians = np.full(len(starts), np.nan)
    mads = np.full(len(starts), np.nan)
    full = starts >= rule.window  # a whole window before the block: all at once
    if full.any():
        windows = sliding_window_view(every, rule.window)[starts[full] - rule.window]
        medians[full] = np.median(windows, axis=1)
        mads[full] = np.median(np.abs(windows - medians[full][:, None]), axis=1)
    for block in np.flatnonzero(~full):  # the run's first steps: a shorter window
        window = every[: starts[block]]
        if len(window) >= MIN_HISTORY:
            medians[block] = np.median(window)
            mads[block] = np.median(np.abs(window - medians[block]))
    of_value = (np.arange(first, len(every)) - first) // BLOCK
    median, mad = medians[of_value], mads[of_value]
    with np.errstate(divide="ignore", invalid="ignore"):
        scores = (every[first:] - median) / (MAD_TO_SIGMA * mad)
    spiked = np.flatnonzero((mad > 0) & (scores > rule.z))
    return [(int(i), float(scores[i])) for i in spiked]


def spike_rows(
    run_id: int,
    rows: Sequence[Sequence[Any]],
    history: Sequence[Sequence[Any]],
    rule: SpikeRule,
    columns: Mapping[str, int],
) -> list[tuple[int, int, str, float, float]]:
    """The ``spikes`` rows of ``rows`` (``steps`` rows, in step order), given the stored
    ``history`` before them (``(loss, grad_norm)`` of steps that did not overflow, oldest
    first); ``columns``: where a ``steps`` row holds ``step``, ``overflow`` and each
    value."""
    out = []
    step_at, overflow_at = columns["step"], columns["overflow"]
    for index, what in enumerate(WHAT):
        at = columns[what]
        past = [h[index] for h in history if h[index] is not None]
        kept = [r for r in rows if not r[overflow_at] and r[at] is not None]
        values = [float(r[at]) for r in kept]
        for position, z in find(past, values, rule):
            row = kept[position]
            out.append((run_id, int(row[step_at]), what, values[position], z))
    return out


SKIP_ENV = "SCALEWATCH_SKIP_ON_SPIKE"  # skip_on_spike from the environment (instrument)


def skip_thresholds(text: str) -> dict[str, float]:
    """``$SCALEWATCH_SKIP_ON_SPIKE``'s thresholds, as :meth:`skip_on_spike` takes them:
    ``grad_norm_z=8,loss_z=8`` (either alone). A ``ValueError`` of one line names the
    variable and what it takes.

    >>> skip_thresholds("grad_norm_z=8, loss_z=10")
    {'grad_norm_z': 8.0, 'loss_z': 10.0}
    """
    out: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.partition("=")
        name = name.strip()
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if name not in ("grad_norm_z", "loss_z") or name in out or not number > 0:
            raise ValueError(
                f"${SKIP_ENV} takes grad_norm_z=Z and/or loss_z=Z (each a number above 0,"
                f" comma-separated), not {text!r}"
            )
        out[name] = number
    return out
