"""What the training thread notes of the step in progress, for the snapshot at ``update()``.

Runs on the training thread of every rank, filled by ``unscale_``, ``step()`` and
``update()``; never pickled (a copy of a scaler starts with a fresh one).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._group import Group
from .learning_rates import Rates
from .pinned_rows import PinnedRings
from .skips import Skips

if TYPE_CHECKING:
    import torch


class StepContext:
    """The host-side values of the step in progress, and what is reused step after step."""

    def __init__(self) -> None:
        self.pinned = PinnedRings()
        self.scale_host: float | None = None  # the scale, where the host knows it
        self.last_found: torch.Tensor | None = None
        self.group: Group | None = None  # this rank's place in the reporting group
        # (scale, its version, 1/scale): the inverse kept while the scale is unchanged
        self.inverse: tuple[torch.Tensor, int, torch.Tensor] | None = None
        # This step's learning rates, optimizer by optimizer: a tuple of tuples of floats,
        # which the garbage collector stops tracking, as it does the row that holds them.
        self.rates: tuple[Rates, ...] = ()
        self.skips = Skips()

    def take_rates(self) -> tuple[Rates, ...]:
        """This step's learning rates; the next step starts with none."""
        rates, self.rates = self.rates, ()
        return rates

    def inverse_of(self, scale: torch.Tensor) -> torch.Tensor:
        """``1 / scale`` as torch's unscale_ takes it (in float64, rounded once to float32:
        float32 division can be imprecise under some compile options), taken again only
        when the scale has changed since.

        Every in-place change of a tensor (the update's, ``fill_``, ``copy_``) bumps its
        version, which the host keeps: telling a changed scale costs no device read.
        """
        if scale.device.type == "mps":  # as torch's: mps has no float64
            return scale.reciprocal()
        kept = self.inverse
        try:
            version = scale._version
        except RuntimeError:  # an inference-mode tensor keeps no version: not kept
            return scale.double().reciprocal().float()
        if kept is not None and kept[0] is scale and kept[1] == version:
            return kept[2]
        inverse = scale.double().reciprocal().float()
        self.inverse = (scale, version, inverse)
        return inverse
