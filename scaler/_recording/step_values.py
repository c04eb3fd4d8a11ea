"""A step's values on the host (``StepValues``), and a cuda step's on their way there.

On cuda the training thread copies [scale, growth tracker, found_inf, loss (if seen),
gradient norm (if measured), *payload words] asynchronously into a reused pinned row
(``pinned_rows``), without a sync; the recorder thread reads the row once its copy has
arrived. A cpu step's values are read
at once (``read_cpu``). The found_inf captured is 0.5 (``_spike_skip.SPIKE``) on a step
skipped for a spike, which its values read as found_inf 0 and ``spiked``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from .._spike_skip import spiked_of
from .pinned_rows import PinnedRing, PinnedRings


class Captured:
    """Values of one cuda step: [scale, growth tracker, found_inf, loss (if seen), gradient
    norm (if measured), *payload words], copied asynchronously to a pinned row of ``rings``.
    (A cpu step's values are read at once: ``read_cpu``.)"""

    __slots__ = ("_has_loss", "_has_norm", "_payloads", "_ring", "_row", "_top")

    def __init__(
        self,
        scale: torch.Tensor,
        tracker: torch.Tensor,
        found: torch.Tensor | None,
        loss: torch.Tensor | None,
        flags: Sequence[torch.Tensor],
        rings: PinnedRings,
        norm: torch.Tensor | None = None,
        top: torch.Tensor | None = None,
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
        self._has_norm = norm is not None
        if norm is not None:
            parts.append(norm.reshape(1).to(scale.device, non_blocking=True))
        self._top = 0 if top is None else top.numel()
        if top is not None:
            parts.append(top.to(scale.device, non_blocking=True))
        sizes = (1,) * (len(parts) - (self._top > 0)) + ((self._top,) if self._top else ())
        sizes += tuple(flag.numel() for flag in flags)
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

    def read(self) -> StepValues:
        """The values, once: wait for the copy if it has not arrived."""
        assert self._ring is not None, "a step's values are read once"
        values: list[Any] = self._ring.read(self._row)
        self._ring = None
        if not self._has_loss:
            values.insert(3, None)
        norm = values.pop(4) if self._has_norm else None
        top = None
        if self._top:
            top = values[4 : 4 + self._top]
            del values[4 : 4 + self._top]
        found, spiked = spiked_of(values[2])
        values[2] = found
        return split_values(values, self._payloads)._replace(grad_norm=norm, top=top, spiked=spiked)


class StepValues(NamedTuple):
    """One step's values on the host: read at once on cpu (``read_cpu``), from
    a pinned row on cuda (``Captured.read``)."""

    scale: float  # after the update
    tracker: int  # the growth tracker, after the update
    found: float  # found_inf: > 0 where some rank overflowed
    loss: float | None  # None: scale() saw none (or, on cpu, it was on a device)
    payloads: Sequence[list[float]]  # the words of each all-reduced payload, one per optimizer
    grad_norm: float | None = None  # None: neither measured nor handed in
    top: list[float] | None = None  # the largest per-parameter norms, then their positions
    spiked: bool = False  # skipped for a spike (skip_on_spike): found is 0 then


def split_values(values: list[Any], payloads: int) -> StepValues:
    """A row as read, [scale, tracker, found_inf, loss, *the words of ``payloads`` payloads],
    as :class:`StepValues`."""
    flags = values[4:]
    if not payloads:
        return StepValues(values[0], int(values[1]), values[2], values[3], [])
    width = len(flags) // payloads
    rows = [flags[start : start + width] for start in range(0, len(flags), width)]
    return StepValues(values[0], int(values[1]), values[2], values[3], rows)


def read_cpu(
    scale: torch.Tensor,
    tracker: torch.Tensor,
    found: torch.Tensor | None,
    loss: torch.Tensor | None,
    flags: Sequence[torch.Tensor] | Sequence[list[float]],
    norm: torch.Tensor | None = None,
) -> StepValues:
    """A cpu step's values, read at once: found_inf 0 if None, loss (and gradient norm) None
    if unseen, and the words of each flag payload.

    cpu tensors are plain memory: reading one is no sync, and a few ``item()`` calls cost
    the training thread less than copying into a row for the recorder to read.
    """
    if found is not None and found.numel() != 1:  # several flags: the first, as on cuda
        found = found.reshape(-1)[:1]
    payloads: Sequence[Any] = flags  # the words as read already (or none: GradScaler)
    if flags and not isinstance(flags[0], list):
        rows: list[list[float]] = []
        for flag in flags:  # read in this frame: a cpu read, no sync
            rows.append(flag if isinstance(flag, list) else flag.tolist())
        payloads = rows
    word = 0.0 if found is None else found.item()
    # Made every cpu step: tuple.__new__, as namedtuple's own _make, runs no Python frame.
    return _new_values(
        StepValues,
        (
            scale.item(),
            tracker.item(),
            0.0 if 0.0 < word < 1.0 else word,  # found_inf; between: a spike (spiked_of)
            # a loss elsewhere than the cpu scale is not read: that would be a sync
            None if loss is None or not loss.is_cpu else loss.item(),
            payloads,
            None if norm is None or not norm.is_cpu else norm.item(),
            None,  # the largest parameter norms: read_top
            0.0 < word < 1.0,
        ),
    )


_new_values = tuple.__new__


def read_top(top: torch.Tensor | None) -> list[float] | None:
    """A cpu step's largest per-parameter norms and their positions, read at once (a cpu
    read: no sync)."""
    if top is None or not top.is_cpu:
        return None
    values: list[float] = top.tolist()
    return values


def read_if_clean(
    found: torch.Tensor | None,
    scale: torch.Tensor,
    tracker: torch.Tensor,
    loss: torch.Tensor | None,
    whole: bool,
    norm: torch.Tensor | None = None,
) -> tuple[float, int, float | None, float | None] | None:
    """A clean cpu step's (scale, tracker, loss, gradient norm), read at once; None if it
    overflowed (found_inf > 0: :func:`read_cpu` reads it all). Not ``whole`` (no record is
    kept): the scale alone, the tracker 0, the loss and norm None.

    The read of every clean cpu step of a run: the fewest reads, no payload, no tuple
    of its own.
    """
    if found is not None and found.item() > 0:
        return None
    if not whole:
        return scale.item(), 0, None, None
    # item() is typed int | float: the tracker is an int32 tensor, whose item() is an int
    return (  # type: ignore[return-value]
        scale.item(),
        tracker.item(),
        None if loss is None or not loss.is_cpu else loss.item(),
        None if norm is None or not norm.is_cpu else norm.item(),
    )
