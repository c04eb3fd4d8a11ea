"""The control fields and the rules a value of each must keep.

One source for every side that checks a control request: the service and the CLI
before it is stored (:mod:`scalewatch.store.control`), the poller before a training thread
sees it, the scaler again before it applies it. Plain Python, so the service needs
neither torch nor the scaler to check one.

>>> check({"growth_interval": 500}, {})
>>> check({"growth_factor": 0.5}, {})
'growth_factor must be a finite number > 1'
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from typing import Any

__all__ = [
    "EMPTY",
    "FIELDS",
    "FLOAT32_MAX",
    "FLOAT32_TINY",
    "INT32_MAX",
    "INT_FIELDS",
    "PURPOSES",
    "RULES",
    "SCHEMAS",
    "UNKNOWN",
    "bounds_problems",
    "check",
    "normalise",
    "requirement",
]

FIELDS: tuple[str, ...] = (
    "growth_interval",
    "growth_factor",
    "backoff_factor",
    "scale",
    "min_scale",
    "max_scale",
    "hysteresis",
)
INT32_MAX = 2**31 - 1
FLOAT32_MAX = 3.4028234663852886e38  # the scale is a float32 tensor
FLOAT32_TINY = 1.1754943508222875e-38  # float32's smallest normal: less may round to 0

# Each field's rule in JSON Schema: what normalise() takes, the API's schema (app/models.py),
# the CLI's options and, through the service, the dashboard's checks.
_INTEGER = {"type": "integer", "minimum": 1, "maximum": INT32_MAX}
_SCALE = {"type": "number", "minimum": FLOAT32_TINY, "maximum": FLOAT32_MAX}
SCHEMAS: dict[str, dict[str, Any]] = {
    "growth_interval": _INTEGER,
    "growth_factor": {"type": "number", "exclusiveMinimum": 1, "maximum": sys.float_info.max},
    "backoff_factor": {"type": "number", "minimum": FLOAT32_TINY, "exclusiveMaximum": 1},
    "scale": _SCALE,
    "min_scale": _SCALE,
    "max_scale": _SCALE,
    "hysteresis": _INTEGER,
}
# The rules below say the float32 bounds as a person would; SCHEMAS has them exactly.
_TINY_WORDS = "float32's smallest normal (about 1.2e-38)"
_RANGE_WORDS = "float32's normal range, about 1.2e-38 to 3.4e38"
# What each field does, for the CLI's help and the dashboard's hints.
PURPOSES: dict[str, str] = {
    "growth_interval": "clean steps between two growths",
    "growth_factor": "what a growth multiplies the scale by",
    "backoff_factor": "what an overflow multiplies the scale by",
    "scale": "the scale, set now",
    "min_scale": "the lowest the scale may go (once set, it can be moved, not removed)",
    "max_scale": "the highest the scale may go (once set, it can be moved, not removed)",
    "hysteresis": "overflows since the last growth before a backoff (once set it cannot be"
    " removed; 1 backs off at every overflow, as without it)",
}
INT_FIELDS = frozenset(name for name, schema in SCHEMAS.items() if schema["type"] == "integer")
RULES: dict[str, str] = {
    "growth_interval": f"growth_interval must be an integer >= 1 and <= {INT32_MAX}",
    "hysteresis": f"hysteresis must be an integer >= 1 and <= {INT32_MAX}",
    "growth_factor": "growth_factor must be a finite number > 1",
    "backoff_factor": f"backoff_factor must be a number < 1 and at least {_TINY_WORDS}: a"
    " smaller one backs off a scale of 1 to 0 at the first overflow",
    **{
        name: f"{name} must be a number in {_RANGE_WORDS}"
        for name in ("scale", "min_scale", "max_scale")
    },
}
EMPTY = f"a request sets at least one of: {', '.join(FIELDS)}"
UNKNOWN = f"unknown field; allowed: {', '.join(FIELDS)}"


def requirement(name: str) -> str:
    """What a value of ``name`` must be: its rule without the field's name.

    >>> requirement("growth_factor")
    'a finite number > 1'
    """
    return RULES[name].removeprefix(f"{name} must be ")


def normalise(name: str, value: object) -> int | float | None:
    """``value`` as ``name`` takes it (integral fields ``int``), or None when it breaks the rule.

    >>> normalise("growth_interval", 500.0), normalise("growth_interval", True)
    (500, None)
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    schema = SCHEMAS[name]
    if schema["type"] == "integer":
        if isinstance(value, float) and not value.is_integer():
            return None
        return int(value) if _admits(schema, value) else None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) and _admits(schema, number) else None


def _admits(schema: Mapping[str, Any], number: float) -> bool:
    """Whether ``number`` keeps the bounds of a JSON Schema ``schema``."""
    low = number >= schema.get("minimum", -math.inf) and number > schema.get(
        "exclusiveMinimum", -math.inf
    )
    high = number <= schema.get("maximum", math.inf) and number < schema.get(
        "exclusiveMaximum", math.inf
    )
    return bool(low and high)


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
