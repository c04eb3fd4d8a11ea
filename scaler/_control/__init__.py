"""Runtime control on the scaler side: what a request carries (its rules: ``store.control_rules``).

Runs on the training thread of every rank. A request reaches the scaler's inbox from the
reporting rank's poller (:mod:`scalewatch.telemetry`), and a ``ShardedGradScaler`` hands it
to its other ranks in the broadcast of ``_agreement``; a setter is called by the training
script. Every change goes through ``apply`` (the pure rule over a :class:`ControlState`),
then the scaler adopts it (``changes``).

A request travels in float64 words, in the broadcast that follows an all-reduce whose
payload flags it: ``[request id, field mask, value of each field in FIELDS]``; unset
fields are 0.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

# The rules live in the store, which the service uses without the scaler; re-exported here.
from ..store.control_rules import (
    EMPTY,
    FIELDS,
    FLOAT32_MAX,
    FLOAT32_TINY,
    INT32_MAX,
    INT_FIELDS,
    RULES,
    UNKNOWN,
    bounds_problems,
    check,
    normalise,
)

__all__ = [
    "EMPTY",
    "FIELDS",
    "FLOAT32_MAX",
    "FLOAT32_TINY",
    "INT32_MAX",
    "INT_FIELDS",
    "RULES",
    "SLOTS",
    "UNKNOWN",
    "ControlOutcome",
    "ControlSource",
    "ControlUpdate",
    "bounds_problems",
    "check",
    "decode",
    "encode",
    "normalise",
]

SLOTS = 2 + len(FIELDS)


@dataclass(frozen=True, slots=True)
class ControlUpdate:
    """One request: its id in the store and the fields it sets."""

    request_id: int
    values: Mapping[str, float | int]


class ControlSource(StrEnum):
    """Where a control change came from."""

    REQUEST = "request"  # a request in the store (the API or the CLI), ``request_id`` its id
    CODE = "code"  # a setter called by the training script: no request

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True, kw_only=True)
class ControlOutcome:
    """What happened to a control change at a step; ``request_id`` is None for ``CODE``."""

    source: ControlSource
    request_id: int | None
    values: dict[str, float | int]
    applied: bool
    reason: str | None
    state: dict[str, float | int | None]
    version: int

    def __post_init__(self) -> None:
        if (self.request_id is None) != (self.source is ControlSource.CODE):
            raise ValueError(f"a {self.source} change has request_id {self.request_id!r}")


def encode(update: ControlUpdate) -> list[float]:
    """
    >>> encode(ControlUpdate(7, {"growth_interval": 500}))[:3]
    [7.0, 1.0, 500.0]
    """
    mask = 0
    slots = [0.0] * len(FIELDS)
    for i, name in enumerate(FIELDS):
        if name in update.values:
            mask |= 1 << i
            slots[i] = float(update.values[name])
    return [float(update.request_id), float(mask), *slots]


def decode(slots: list[float]) -> ControlUpdate | None:
    """The request carried in ``slots``, or None when they carry none.

    >>> decode(encode(ControlUpdate(7, {"growth_interval": 500, "scale": 8.0})))
    ControlUpdate(request_id=7, values={'growth_interval': 500, 'scale': 8.0})
    """
    request_id, mask = int(slots[0]), int(slots[1])
    if mask == 0:
        return None
    values: dict[str, float | int] = {}
    for i, name in enumerate(FIELDS):
        if mask & (1 << i):
            value = slots[2 + i]
            values[name] = int(value) if name in INT_FIELDS else value
    return ControlUpdate(request_id, values)


@dataclass(frozen=True, slots=True)
class ControlState:
    """The factors in effect: what a request may change (the scale aside, which lives on the
    device and is set directly).

    >>> apply(ControlState(2000, 2.0, 0.5), {"growth_interval": 100})[0].growth_interval
    100
    """

    growth_interval: int
    growth_factor: float
    backoff_factor: float
    min_scale: float | None = None
    max_scale: float | None = None
    hysteresis: int | None = None

    def as_dict(self) -> dict[str, float | int | None]:
        return {name: getattr(self, name) for name in STATE_FIELDS}


STATE_FIELDS = tuple(name for name in FIELDS if name != "scale")


def apply(
    state: ControlState, values: Mapping[str, float | int]
) -> tuple[ControlState, str | None]:
    """``state`` with ``values`` applied, or ``state`` itself and the first rule they break.

    >>> apply(ControlState(2000, 2.0, 0.5, max_scale=4.0), {"min_scale": 8.0})[1]
    'min_scale must be <= max_scale (4.0)'
    """
    problem = check(values, state.as_dict())
    if problem is not None:
        return state, problem
    changes: dict[str, Any] = {}
    for name, value in values.items():
        if name in INT_FIELDS:
            changes[name] = int(value)
        elif name in ("min_scale", "max_scale"):
            changes[name] = float(value)
        elif name != "scale":
            changes[name] = value  # a factor as given, as torch's setters keep it
    return dataclasses.replace(state, **changes), None
