"""scalewatch: an instrumented, drop-in ShardedGradScaler and GradScaler for PyTorch.

The scalers are imported on first use, so ``import scalewatch.store`` (all the service
needs) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._config import ScalerConfigError
    from ._torch_check import UnsupportedTorchError
    from .grad_scaler import GradScaler
    from .sharded import ShardedGradScaler
    from .stats import ScalerCheckpoint, ScalerStats

__all__ = [
    "GradScaler",
    "ScalerCheckpoint",
    "ScalerConfigError",
    "ScalerStats",
    "ShardedGradScaler",
    "UnsupportedTorchError",
]

_HOMES = {
    "GradScaler": ".grad_scaler",
    "ScalerCheckpoint": ".stats",
    "ScalerConfigError": "._config",
    "ScalerStats": ".stats",
    "ShardedGradScaler": ".sharded",
    "UnsupportedTorchError": "._torch_check",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'scalewatch' has no attribute {name!r}")
    value = getattr(importlib.import_module(home, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
