"""One cuda step's values on their way to the host, without a sync.

The training thread copies [scale, growth tracker, found_inf, loss (if seen), *payload
words] asynchronously into a reused pinned row (``pinned_rows``); the recorder thread reads
the row once its copy has arrived. (A cpu step's values are read at once:
``pinned_rows.read_cpu``.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .pinned_rows import PinnedRing, PinnedRings


class Captured:
    """Values of one cuda step: [scale, growth tracker, found_inf, loss (if seen), *payload
    words], copied asynchronously to a pinned row of ``rings``. (A cpu step's values are
    read at once: ``pinned_rows.read_cpu``.)"""

    __slots__ = ("_has_loss", "_payloads", "_ring", "_row")

    def __init__(
        self,
        scale: torch.Tensor,
        tracker: torch.Tensor,
        found: torch.Tensor | None,
        loss: torch.Tensor | None,
        flags: Sequence[torch.Tensor],
        rings: PinnedRings,
    ) -> None:
        self._payloads = len(flags)
        if found is None:
            found = scale.new_zeros(1)
        elif found.numel() != 1:
            found = found.reshape(-1)[:1]
        parts = [scale.reshape(1), tracker.reshape(1), found.reshape(1)]
        self._has_loss = loss is not None
        if loss is not None:
            loss = loss.detach()  # cat(out=) refuses a tensor that requires grad
            if loss.device != scale.device:
                loss = loss.to(scale.device, non_blocking=True)
            parts.append(loss.reshape(1))
        sizes = (1,) * len(parts) + tuple(flag.numel() for flag in flags)
        parts.extend(flags)
        self._ring: PinnedRing | None
        self._ring, self._row = rings.capture(parts, sizes)

    def discard(self) -> None:
        """Give the row back without reading it (the step was dropped)."""
        if self._ring is not None:
            self._ring.release(self._row)
            self._ring = None

    def arrived(self) -> bool:
        """Whether the values have reached the host (reading them would not wait)."""
        return self._ring is None or self._ring.arrived(self._row)

    def read(self) -> Values:
        """(scale, growth tracker, found_inf, loss, each optimizer's payload words)."""
        assert self._ring is not None, "a step's values are read once"
        values: list[Any] = self._ring.read(self._row)
        self._ring = None
        if not self._has_loss:
            values.insert(3, None)
        return split_values(values, self._payloads)


# (scale after the update, growth tracker, found_inf, loss or None, payload words per optimizer)
Values = tuple[float, int, float, float | None, list[list[float]]]


def split_values(values: list[Any], payloads: int) -> Values:
    """A step's values as ``read()`` returns them: the words after the first four, per
    payload."""
    flags = values[4:]
    if not payloads:
        return values[0], int(values[1]), values[2], values[3], []
    width = len(flags) // payloads
    rows = [flags[start : start + width] for start in range(0, len(flags), width)]
    return values[0], int(values[1]), values[2], values[3], rows
