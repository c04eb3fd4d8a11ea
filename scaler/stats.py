"""Typed records of the scaler's own state: statistics and checkpoints."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class ScalerStats:
    """What the scaler has seen since it was created (or its checkpoint was loaded).

    >>> ScalerStats().steps
    0
    """

    steps: int = 0
    skipped: int = 0
    overflows: int = 0
    growths: int = 0
    backoffs: int = 0
    current_scale: float = 0.0
    min_scale_seen: float = float("inf")
    max_scale_seen: float = 0.0
    dropped_records: int = 0  # steps whose record never reached the recorder or the store
    spike_skips: int = 0  # of the skipped steps, those skipped for a spike (skip_on_spike)


@dataclass(frozen=True, slots=True)
class ScalerCheckpoint:
    """A typed counterpart of ``state_dict()``.

    >>> ScalerCheckpoint(scale=1024.0).to_dict()["scale"]
    1024.0
    """

    scale: float
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    growth_tracker: int = 0
    min_scale: float | None = None
    max_scale: float | None = None
    hysteresis: int | None = None
    hysteresis_tracker: int | None = None
    step: int = 0
    run_uid: str | None = None
    control_version: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ScalerCheckpoint:
        return cls(**data)
