"""scalewatch: an instrumented, drop-in ShardedGradScaler and GradScaler for PyTorch."""

from __future__ import annotations

from ._core import ScalerConfigError
from .grad_scaler import GradScaler
from .sharded import ShardedGradScaler
from .stats import ScalerCheckpoint, ScalerStats

__all__ = [
    "GradScaler",
    "ScalerCheckpoint",
    "ScalerConfigError",
    "ScalerStats",
    "ShardedGradScaler",
]
