"""Host rows reused step after step for the copies of a step's values.

Allocating pinned memory and a CUDA event for every step costs the training thread far
more than the copy itself. A ring allocates them once: the training thread takes a free
row, queues the copy into it and records the row's event; the recorder thread waits on
that event, reads the row and gives it back.

On cpu the rows are plain host memory and the copy is done when ``capture`` returns: one
``_foreach_copy_`` instead of a clone per value, and nothing for the recorder thread to
free, which would hold the GIL the training thread is waiting for. (A scaler's own cpu
step is read at once instead: ``step_values.read_cpu``.)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

import torch

# A ring's rows unless its maker says: about RING_BYTES of host memory, within these bounds.
RING_BYTES = 4 * 1024 * 1024
MIN_ROWS = 64
MAX_ROWS = 4096


class PinnedRing:
    """``rows`` float64 host rows holding parts of ``sizes`` values, each row with its event.

    The training thread calls :meth:`capture`, the recorder thread :meth:`read`; a row is
    taken from and given back to a deque, whose appends and pops are atomic.
    """

    def __init__(self, sizes: Sequence[int], device: torch.device, rows: int | None = None) -> None:
        width = sum(sizes)
        if rows is None:
            rows = max(MIN_ROWS, min(MAX_ROWS, RING_BYTES // (8 * width)))
        self.width = width
        self._cuda = device.type == "cuda"
        host = torch.empty((rows, width), dtype=torch.float64, pin_memory=self._cuda)
        self._rows = list(host.unbind(0))
        # cuda: a device row per host row: it is written again only after the recorder has
        # read the host row, so after its copy finished, whichever stream the next step uses.
        # cpu: each row split into the parts it receives, the targets of one _foreach_copy_.
        self._staging = (
            list(torch.empty((rows, width), dtype=torch.float64, device=device))
            if self._cuda
            else []
        )
        # Split by columns, then unbind: one view per part and row, made in C++ (a split per
        # row took ~40 ms for a ring of 4096 rows, at the scaler's first update).
        columns = [] if self._cuda else torch.split(host, list(sizes), dim=1)
        self._parts = list(zip(*(column.unbind(0) for column in columns), strict=True))
        self._events: list[Any] = [None] * rows
        self._free: deque[int] = deque(range(rows))

    def capture(self, parts: list[torch.Tensor]) -> int | None:
        """Copy ``parts`` (as float64) to a free row, queued on cuda; None if none is free.

        On cuda each part has ``sizes``' shape; on cpu it may also be a 0-d tensor.
        """
        try:
            row = self._free.popleft()
        except IndexError:  # the recorder is behind by a whole ring
            return None
        if not self._cuda:
            torch._foreach_copy_(self._parts[row], parts)
            return row
        staging = self._staging[row]
        torch.cat(parts, out=staging)
        self._rows[row].copy_(staging, non_blocking=True)
        event = self._events[row]
        if event is None:
            event = self._events[row] = torch.cuda.Event()  # type: ignore[no-untyped-call]
        # On the stream that queued the copy: the scale's device need not be the current one.
        event.record(torch.cuda.current_stream(staging.device))
        return row

    def arrived(self, row: int) -> bool:
        """Whether ``row``'s copy has completed (on cpu it completes in ``capture``)."""
        return not self._cuda or bool(self._events[row].query())

    def read(self, row: int) -> list[float]:
        """Wait for ``row``'s copy, read it and give the row back."""
        try:
            if self._cuda:
                self._events[row].synchronize()
            values: list[float] = self._rows[row].tolist()
        finally:
            self._free.append(row)
        return values

    def release(self, row: int) -> None:
        """Give ``row`` back unread (its step was dropped)."""
        self._free.append(row)


class PinnedRings:
    """One :class:`PinnedRing` per layout of parts (a scaler needs one), made on first use,
    of ``rows`` rows (None: about ``RING_BYTES`` of them)."""

    def __init__(self, rows: int | None = None) -> None:
        if rows is not None and rows < 1:
            raise ValueError(f"a ring has 1 row or more, not {rows}")
        self._rows = rows
        self._rings: dict[tuple[int, ...], PinnedRing] = {}

    def capture(
        self, parts: list[torch.Tensor], sizes: tuple[int, ...] | None = None
    ) -> tuple[PinnedRing, int]:
        """Copy ``parts`` (of ``sizes`` values, when the caller knows) to a free row of the
        ring of their layout.

        When that ring is full (the recorder is a whole ring behind), the step gets a ring
        of one row of its own: slower, nothing lost.
        """
        if sizes is None:
            sizes = tuple(part.numel() for part in parts)
        ring = self._rings.get(sizes)
        if ring is None:
            ring = self._rings[sizes] = PinnedRing(sizes, parts[0].device, self._rows)
        row = ring.capture(parts)
        if row is None:
            ring = PinnedRing(sizes, parts[0].device, rows=1)
            row = ring.capture(parts)
            assert row is not None
        return ring, row
