"""Ours in place of torch's deprecated ``torch.cuda.amp.GradScaler`` and
``torch.cpu.amp.GradScaler`` (for ``scalewatch.instrument``): the same signature, and torch's
own FutureWarning, naming the caller's line."""

from __future__ import annotations

import warnings

from ._torch_compat import deprecation_of
from .grad_scaler import GradScaler


class _DeprecatedAlias(GradScaler):
    """``torch.<device>.amp.GradScaler(args...)``: ``GradScaler(device, args...)``."""

    _ALIAS_DEVICE: str

    def __init__(
        self,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        enabled: bool = True,
    ) -> None:
        device = self._ALIAS_DEVICE
        warnings.warn(deprecation_of(device), FutureWarning, stacklevel=2)
        factors = (init_scale, growth_factor, backoff_factor, growth_interval)
        super().__init__(device, *factors, enabled)


class CudaGradScaler(_DeprecatedAlias):
    """``torch.cuda.amp.GradScaler(args...)``: ``GradScaler("cuda", args...)``."""

    _ALIAS_DEVICE = "cuda"


class CpuGradScaler(_DeprecatedAlias):
    """``torch.cpu.amp.GradScaler(args...)``: ``GradScaler("cpu", args...)``."""

    _ALIAS_DEVICE = "cpu"
