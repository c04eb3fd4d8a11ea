"""Device values a cuda ShardedGradScaler reads one update() later, without a sync.

On cuda, what the host did not read in ``step()`` (the fused-optimizer path) reaches it
through an asynchronous copy to pinned memory; the next ``update()`` waits on its event,
long since passed by then. Every rank does the same at the same update, so a control
request still applies on every rank at one step.
"""

from __future__ import annotations

from typing import Any

import torch

from . import payload as _payload


class InFlightCopies:
    """The request flag of a step whose payload was not read, and broadcast requests."""

    def __init__(self) -> None:
        self._flag: tuple[torch.Tensor, Any] | None = None
        self._flag_buffers: dict[int, tuple[torch.Tensor, Any]] = {}
        self._slots: list[tuple[torch.Tensor, Any]] = []

    @property
    def pending(self) -> bool:
        """Whether a request flag or a broadcast request is on its way to the host."""
        return self._flag is not None or bool(self._slots)

    def keep_request_flag(self, payloads: list[torch.Tensor]) -> None:
        """Copy word 0 of each payload (where rank 0's request flag is) to the host."""
        count = len(payloads)
        buffer = self._flag_buffers.get(count)
        if buffer is None:  # reused step after step: pinned memory is costly to allocate
            host = torch.empty(count, dtype=torch.float64, pin_memory=True)
            buffer = self._flag_buffers[count] = (host, torch.cuda.Event())  # type: ignore[no-untyped-call]
        host, event = buffer
        for i, payload in enumerate(payloads):
            host[i : i + 1].copy_(payload[:1], non_blocking=True)
        event.record()
        self._flag = buffer

    def take_request(self) -> bool:
        """Whether the step whose flag was kept carried a request."""
        if self._flag is None:
            return False
        host, event = self._flag
        self._flag = None
        event.synchronize()
        return any(_payload.carries_request([word]) for word in host.tolist())

    def keep_slots(self, slots: torch.Tensor) -> None:
        """Copy a broadcast request (on a control step only) to the host."""
        host = torch.empty(slots.shape, dtype=torch.float64, pin_memory=True)
        host.copy_(slots, non_blocking=True)
        event = torch.cuda.Event()  # type: ignore[no-untyped-call]
        event.record()
        self._slots.append((host, event))

    def take_slots(self) -> list[list[float]]:
        """The broadcast requests kept at the last update, read on the host."""
        if not self._slots:
            return []
        taken = []
        for host, event in self._slots:
            event.synchronize()
            taken.append(host.tolist())
        self._slots = []
        return taken
