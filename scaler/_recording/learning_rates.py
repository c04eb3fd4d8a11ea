"""The learning rates of a step, read from the host: each optimizer's ``param_groups``.

Runs on the training thread of every rank, where an optimizer's gradients are unscaled or
checked (once a step on every path, fused optimizers included), before it steps: the rate
read is the one in effect at ``step()``, whatever the scheduler does after it. A rate
that is a tensor is read only from the CPU (memory, no sync); one on a device is not
read (None), never synced for.

>>> import torch
>>> opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1)
>>> opt.add_param_group({"params": [torch.nn.Parameter(torch.ones(1))], "lr": 0.01})
>>> step_rates([group_rates(opt)])
(0.1, ((0.1, 0.01),))
>>> step_rates([(0.1,), (0.1,)]), step_rates([])
((0.1, None), (None, None))
"""

from __future__ import annotations

from typing import Any

import torch

from .._step_sample import Rates, step_rates

__all__ = ["Rates", "group_rates", "step_rates"]


def group_rates(optimizer: torch.optim.Optimizer) -> Rates:
    """Each param group's learning rate, as the host holds it."""
    return tuple(_host_rate(group.get("lr")) for group in optimizer.param_groups)


def _host_rate(lr: Any) -> float | None:
    if isinstance(lr, float | int) and not isinstance(lr, bool):
        return float(lr)
    if isinstance(lr, torch.Tensor) and lr.device.type == "cpu" and lr.numel() == 1:
        return float(lr.item())
    return None
