"""Ours in place of torch's deprecated ``torch.cuda.amp.GradScaler`` and
``torch.cpu.amp.GradScaler`` (for ``scaler.instrument``): the same signature, and torch's
own FutureWarning, naming the caller's line."""

from __future__ import annotations

import warnings

from ._torch_compat import deprecation_of
from .grad_scaler import GradScaler


class CudaGradScaler(GradScaler):
    """``torch.cuda.amp.GradScaler(args...)``: ``GradScaler("cuda", args...)``."""

    def __init__(
        self,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        enabled: bool = True,
    ) -> None:
        warnings.warn(deprecation_of("cuda"), FutureWarning, stacklevel=2)
        super().__init__(
            "cuda", init_scale, growth_factor, backoff_factor, growth_interval, enabled
        )


class CpuGradScaler(GradScaler):
    """``torch.cpu.amp.GradScaler(args...)``: ``GradScaler("cpu", args...)``."""

    def __init__(
        self,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        enabled: bool = True,
    ) -> None:
        warnings.warn(deprecation_of("cpu"), FutureWarning, stacklevel=2)
        factors = (init_scale, growth_factor, backoff_factor, growth_interval)
        super().__init__("cpu", *factors, enabled)
