"""Runtime control on the scaler side: what a request carries and the rules it must keep.

A request rides in the float64 payload of the all-reduce that agrees found_inf:
``[request id, field mask, value of each field in FIELDS]``; unset fields are 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

FIELDS: tuple[str, ...] = (
    "growth_interval",
    "growth_factor",
    "backoff_factor",
    "scale",
    "min_scale",
    "max_scale",
    "hysteresis",
)
INT_FIELDS = frozenset({"growth_interval", "hysteresis"})
SLOTS = 2 + len(FIELDS)
INT32_MAX = 2**31 - 1
FLOAT32_MAX = 3.4028234663852886e38  # the scale is a float32 tensor


@dataclass(frozen=True, slots=True)
class ControlUpdate:
    """One request: its id in the store (0 for changes made by code) and the fields it sets."""

    request_id: int
    values: Mapping[str, float | int]


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


def check(
    values: Mapping[str, float | int], current: Mapping[str, float | int | None]
) -> str | None:
    """The rule ``values`` break given the ``current`` settings, or None when they are fine.

    >>> check({"growth_interval": 0}, {})
    'growth_interval must be an integer >= 1 and <= 2147483647'
    >>> check({"min_scale": 8.0}, {"max_scale": 4.0})
    'min_scale must be <= max_scale (4.0)'
    """
    if not values:
        return f"a request sets at least one of: {', '.join(FIELDS)}"
    for name, value in values.items():
        problem = _check_field(name, value)
        if problem:
            return problem
    lo = values.get("min_scale", current.get("min_scale"))
    hi = values.get("max_scale", current.get("max_scale"))
    if lo is not None and hi is not None and lo > hi:
        if "min_scale" in values:
            return f"min_scale must be <= max_scale ({hi})"
        return f"max_scale must be >= min_scale ({lo})"
    return None


def _check_field(name: str, value: float | int) -> str | None:
    if name not in FIELDS:
        return f"unknown field {name!r}"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"{name} must be a number"
    if name in INT_FIELDS:
        low = 1
        if not (isinstance(value, int) or float(value).is_integer()) or not (
            low <= value <= INT32_MAX
        ):
            return f"{name} must be an integer >= {low} and <= {INT32_MAX}"
        return None
    if not math.isfinite(value):
        return f"{name} must be finite"
    if name == "growth_factor" and value <= 1.0:
        return "growth_factor must be > 1"
    if name == "backoff_factor" and not 0.0 < value < 1.0:
        return "backoff_factor must be in (0, 1)"
    if name in ("scale", "min_scale", "max_scale") and value <= 0.0:
        return f"{name} must be > 0"
    if name in ("scale", "min_scale", "max_scale") and value > FLOAT32_MAX:
        return f"{name} must be <= {FLOAT32_MAX!r} (float32's largest)"
    return None
