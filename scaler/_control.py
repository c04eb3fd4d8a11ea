"""Runtime control on the scaler side: what a request carries and the rules it must keep.

A request rides in the float64 payload of the all-reduce that agrees found_inf:
``[request id, field mask, value of each field in FIELDS]``; unset fields are 0.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

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
FLOAT32_TINY = 1.1754943508222875e-38  # float32's smallest normal: less may round to 0


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


RULES: dict[str, str] = {
    "growth_interval": f"growth_interval must be an integer >= 1 and <= {INT32_MAX}",
    "hysteresis": f"hysteresis must be an integer >= 1 and <= {INT32_MAX}",
    "growth_factor": "growth_factor must be a finite number > 1",
    "backoff_factor": f"backoff_factor must be a number < 1 and >= {FLOAT32_TINY!r} (float32's"
    " smallest normal: a smaller one backs off a scale of 1 to 0 at the first overflow)",
    **{
        name: f"{name} must be a finite number > 0, from {FLOAT32_TINY!r} to {FLOAT32_MAX!r}"
        " (float32's normal range)"
        for name in ("scale", "min_scale", "max_scale")
    },
}
EMPTY = f"a request sets at least one of: {', '.join(FIELDS)}"
UNKNOWN = f"unknown field; allowed: {', '.join(FIELDS)}"


def normalise(name: str, value: object) -> int | float | None:
    """``value`` as ``name`` takes it (integral fields ``int``), or None when it breaks the rule.

    >>> normalise("growth_interval", 500.0), normalise("growth_interval", True)
    (500, None)
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if name in INT_FIELDS:
        if isinstance(value, float) and not value.is_integer():
            return None
        return int(value) if 1 <= value <= INT32_MAX else None
    try:
        number = float(value)
    except OverflowError:
        return None
    if not math.isfinite(number):
        return None
    if name == "growth_factor":
        return number if number > 1 else None
    if name == "backoff_factor":
        return number if FLOAT32_TINY <= number < 1 else None
    return number if FLOAT32_TINY <= number <= FLOAT32_MAX else None


def bounds_problems(values: Mapping[str, object], current: Mapping[str, object]) -> dict[str, str]:
    """min_scale <= scale <= max_scale, with the value in effect standing in for one not requested.

    >>> bounds_problems({"min_scale": 8.0}, {"max_scale": 4.0})
    {'min_scale': 'min_scale must be <= max_scale (4.0)'}
    >>> bounds_problems({"scale": 1.0}, {"min_scale": 2.0})
    {'scale': 'scale must be >= min_scale (2.0)'}
    """
    low = _number(values.get("min_scale", current.get("min_scale")))
    high = _number(values.get("max_scale", current.get("max_scale")))
    scale = _number(values.get("scale"))
    problems = {}
    if low is not None and high is not None and low > high:
        if "min_scale" in values:
            problems["min_scale"] = f"min_scale must be <= max_scale ({high!r})"
        if "max_scale" in values:
            problems["max_scale"] = f"max_scale must be >= min_scale ({low!r})"
    if scale is not None and low is not None and scale < low:
        problems["scale"] = f"scale must be >= min_scale ({low!r})"
    elif scale is not None and high is not None and scale > high:
        problems["scale"] = f"scale must be <= max_scale ({high!r})"
    return problems


def _number(value: object) -> float | None:
    return None if isinstance(value, bool) or not isinstance(value, int | float) else value


def check(values: Mapping[str, object], current: Mapping[str, object]) -> str | None:
    """The first rule ``values`` break given the ``current`` settings, or None.

    >>> check({"growth_interval": 0}, {})
    'growth_interval must be an integer >= 1 and <= 2147483647'
    >>> check({"min_scale": 8.0}, {"max_scale": 4.0})
    'min_scale must be <= max_scale (4.0)'
    """
    if not values:
        return EMPTY
    for name, value in values.items():
        if name not in FIELDS:
            return f"{name}: {UNKNOWN}"
        if normalise(name, value) is None:
            return RULES[name]
    return next(iter(bounds_problems(values, current).values()), None)


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
