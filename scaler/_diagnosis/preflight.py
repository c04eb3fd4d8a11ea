"""What GradScaler says when a model's weights are fp16: torch's refusal, with the way out.

torch's ``GradScaler`` refuses fp16 gradients ("Attempting to unscale FP16 gradients."):
they come from fp16 weights, which the scaler cannot keep in step. The same ValueError,
with torch's words first (what torch's own tests match), names the first parameters with
fp16 gradients and the two usual fixes:

>>> import torch
>>> p = torch.nn.Parameter(torch.zeros(3, 2, dtype=torch.float16))
>>> p.grad = torch.zeros_like(p)
>>> print(fp16_refusal(torch.optim.SGD([p], lr=0.1), lambda param: None))  # doctest: +ELLIPSIS
Attempting to unscale FP16 gradients. 1 parameter has fp16 gradients: group 0 param 0 (3, 2). ...
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .names import positional

__all__ = ["TORCHS_REFUSAL", "fp16_refusal"]

TORCHS_REFUSAL = "Attempting to unscale FP16 gradients."
SHOWN = 3  # parameters named at most

_FIXES = (
    "GradScaler needs fp32 weights. Keep the model in float32 and run its forward under"
    " torch.autocast(device_type=..., dtype=torch.float16) (fp32 master weights, fp16"
    " compute), or shard it with FSDP's mixed precision (FSDP1:"
    " MixedPrecision(param_dtype=torch.float16); FSDP2:"
    " MixedPrecisionPolicy(param_dtype=torch.float16)) and use ShardedGradScaler."
)


def fp16_refusal(optimizer: torch.optim.Optimizer, name_of: Callable[[Any], Any]) -> str:
    """torch's message, the first ``SHOWN`` parameters of ``optimizer`` with fp16 gradients
    (named by ``name_of``, a watched model's names, else by place and shape), the fixes."""
    found: list[str] = []
    count = 0
    for g, group in enumerate(optimizer.param_groups):
        for i, param in enumerate(group["params"]):
            grad = getattr(param, "grad", None)
            if grad is None or grad.dtype != torch.float16:
                continue
            count += 1
            if len(found) < SHOWN:
                name = name_of(param)
                found.append(name if isinstance(name, str) else positional(g, i, param.shape))
    more = f" and {count - len(found)} more" if count > len(found) else ""
    has = "parameter has" if count == 1 else "parameters have"
    return f"{TORCHS_REFUSAL} {count} {has} fp16 gradients: {', '.join(found)}{more}. {_FIXES}"
