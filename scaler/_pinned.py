"""Pinned host rows reused step after step for the asynchronous copies of a step's values.

Allocating pinned memory and a CUDA event for every step costs the training thread far
more than the copy itself. A ring allocates them once: the training thread takes a free
row, queues the copy into it and records the row's event; the recorder thread waits on
that event, reads the row and gives it back.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

import torch

RING_BYTES = 4 * 1024 * 1024
MIN_ROWS = 64
MAX_ROWS = 4096


class PinnedRing:
    """``rows`` float64 host rows of ``width`` values, each with its own event.

    The training thread calls :meth:`capture`, the recorder thread :meth:`read`; a row is
    taken from and given back to a deque, whose appends and pops are atomic.
    """

    def __init__(self, width: int, device: torch.device, rows: int | None = None) -> None:
        if rows is None:
            rows = max(MIN_ROWS, min(MAX_ROWS, RING_BYTES // (8 * width)))
        self.width = width
        host = torch.empty((rows, width), dtype=torch.float64, pin_memory=True)
        self._rows = list(host.unbind(0))
        # A device row per host row: it is written again only after the recorder has read
        # the host row, so after its copy finished, whichever stream the next step uses.
        self._staging = list(torch.empty((rows, width), dtype=torch.float64, device=device))
        self._events: list[Any] = [None] * rows
        self._free: deque[int] = deque(range(rows))

    def capture(self, parts: Sequence[torch.Tensor]) -> int | None:
        """Queue the copy of ``parts`` (joined, as float64) to a free row; None if none is free."""
        try:
            row = self._free.popleft()
        except IndexError:  # the recorder is behind by a whole ring
            return None
        staging = self._staging[row]
        torch.cat(list(parts), out=staging)
        self._rows[row].copy_(staging, non_blocking=True)
        event = self._events[row]
        if event is None:
            event = self._events[row] = torch.cuda.Event()  # type: ignore[no-untyped-call]
        # On the stream that queued the copy: the scale's device need not be the current one.
        event.record(torch.cuda.current_stream(staging.device))
        return row

    def read(self, row: int) -> list[float]:
        """Wait for ``row``'s copy, read it and give the row back."""
        try:
            self._events[row].synchronize()
            values: list[float] = self._rows[row].tolist()
        finally:
            self._free.append(row)
        return values

    def release(self, row: int) -> None:
        """Give ``row`` back unread (its step was dropped)."""
        self._free.append(row)


class PinnedRings:
    """One :class:`PinnedRing` per row width (a scaler normally needs one), made on first use."""

    def __init__(self) -> None:
        self._rings: dict[int, PinnedRing] = {}

    def capture(self, parts: Sequence[torch.Tensor]) -> tuple[PinnedRing, int]:
        """Queue ``parts``' copy to a free row of the ring of their width.

        When that ring is full (the recorder is a whole ring behind), the step gets a ring
        of one row of its own: slower, nothing lost.
        """
        width = sum(part.numel() for part in parts)
        device = parts[0].device
        ring = self._rings.get(width)
        if ring is None:
            ring = self._rings[width] = PinnedRing(width, device)
        row = ring.capture(parts)
        if row is None:
            ring = PinnedRing(width, device, rows=1)
            row = ring.capture(parts)
            assert row is not None
        return ring, row
