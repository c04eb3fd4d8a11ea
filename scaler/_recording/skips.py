"""Whether the last step skipped its optimizers, from what the host knows without a sync.

Runs on the training thread of every rank. torch's ``step()`` reads each optimizer's
found_inf on the host before it steps or skips it (``_maybe_opt_step``): that read is
noted here, and a step whose optimizers were all decided that way is known at once; so
is every step whose found_inf lives on the CPU (memory). A fused optimizer on a GPU
decides on the device, and the host would need a sync to know: there the found_inf is
copied to pinned memory behind the step, and the answer is known once the GPU is past it
(asked without waiting); until then it is None, never a guess.

>>> import torch
>>> skips = Skips()
>>> skips.value is None  # before the first step
True
>>> skips.decided(False); skips.decided(True)
>>> skips.settle(stepped=2, found=torch.zeros(()), cpu_found=None)
>>> skips.value
True
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["Skips"]


class Skips:
    def __init__(self) -> None:
        self.decisions: list[bool] = []  # this step's, optimizer by optimizer, as torch read them
        self.known: bool | None = None
        self.pending: tuple[torch.Tensor, Any] | None = None  # pinned copy, its event

    def decided(self, overflow: bool) -> None:
        """torch's step just read an optimizer's found_inf: stepped it (False) or not."""
        self.decisions.append(overflow)

    def settle(self, stepped: int, found: torch.Tensor | None, cpu_found: float | None) -> None:
        """At ``update()``: ``stepped`` optimizers were stepped (or skipped); ``found`` is
        the step's combined found_inf, ``cpu_found`` its value where read already."""
        decisions = self.decisions
        self.pending = None
        if not stepped or found is None:
            self.known = False
        elif cpu_found is not None:
            self.known = cpu_found > 0
        elif len(decisions) >= stepped:
            self.known = any(decisions)
        else:
            self.known = None
            if found.is_cuda:
                self.pending = _copy_behind(found)
        decisions.clear()

    def wait(self) -> bool | None:
        """``value``, waiting for a pending copy (a sync: only a held scheduler asks)."""
        pending = self.pending
        if pending is not None:
            pending[1].synchronize()
        return self.value

    @property
    def value(self) -> bool | None:
        pending = self.pending
        if pending is not None and pending[1].query():
            self.known = bool(pending[0].item() > 0)  # pinned host memory: no sync
            self.pending = None
        return self.known


def _copy_behind(found: torch.Tensor) -> tuple[torch.Tensor, Any]:
    host = torch.empty((), dtype=found.dtype, pin_memory=True)
    host.copy_(found.reshape(()), non_blocking=True)
    event = torch.cuda.Event()  # type: ignore[no-untyped-call]
    event.record(torch.cuda.current_stream(found.device))
    return host, event
