"""Where a run's scale is heading, read from its recent steps: falling (halving every so
many steps, and when it reaches a floor at that rate), rising, steady, or pinned at its
ceiling; and said plainly when the scale is under 1.0 (the gradients are then made
smaller, not larger).

>>> rows = [ScaleStep(1, 2.0**16, 2.0**16)] + [
...     ScaleStep(310 * k, 2.0 ** (17 - k), 2.0 ** (16 - k)) for k in range(1, 5)]
>>> read_forecast(rows).text
'halving every ~310 steps: 1.0 in ~3,700 steps at this rate'
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from sqlalchemy import func, or_, select

from .engine import Store
from .schema import steps

__all__ = ["WINDOW", "ScaleForecast", "ScaleStep", "read_forecast", "recent_scale_changes"]

# The steps a forecast is read from, the newest last.
WINDOW = 2000
# This many doublings or halvings over the window or fewer (a backoff and the growth that
# follows it, as a healthy run goes), or no change at all: steady.
STEADY_LOG2 = 1.0

Trend = Literal["falling", "rising", "steady", "pinned"]


@dataclass(frozen=True, slots=True)
class ScaleStep:
    """A step's number, the scale it used, and the scale after it."""

    step: int
    scale: float
    scale_after: float


@dataclass(frozen=True, slots=True)
class ScaleForecast:
    trend: Trend
    text: str  # in words, as the run page says it
    first_step: int  # the window it was read from
    last_step: int
    scale: float  # the scale after the last step
    floor: float
    steps_to_floor: int | None  # falling: at this rate (0: there already); else None
    halving_steps: float | None  # falling: steps per halving; rising: per doubling


def recent_scale_changes(
    store: Store, run_id: int, last_step: int, window: int = WINDOW
) -> list[ScaleStep]:
    """The run's steps in the ``window`` up to ``last_step`` whose scale changed, and the
    first and last of them (the window's bounds), in step order."""
    first = max(1, last_step - window + 1)
    in_window = (steps.c.run_id == run_id) & (steps.c.step >= first) & (steps.c.step <= last_step)
    columns = (steps.c.step, steps.c.scale, steps.c.scale_after)
    with store.read() as conn:
        start = conn.execute(select(func.min(steps.c.step)).where(in_window)).scalar()
        if start is None:
            return []
        bounds = or_(steps.c.step == start, steps.c.step == last_step)
        query = select(*columns).where(in_window, or_(steps.c.scale_after != steps.c.scale, bounds))
        rows = conn.execute(query.order_by(steps.c.step)).all()
    return [ScaleStep(int(s), float(a), float(b)) for s, a, b in rows]


def read_forecast(
    rows: Sequence[ScaleStep], *, floor: float = 1.0, ceiling: float | None = None
) -> ScaleForecast | None:
    """The forecast from ``rows`` (a window's steps in order: every step, or its first,
    its last and those whose scale changed); None under two steps. ``floor``: the run's
    ``min_scale``, else 1.0; ``ceiling``: its ``max_scale``, if any."""
    if len(rows) < 2 or not all(r.scale > 0 and r.scale_after > 0 for r in rows):
        return None
    first, last = rows[0], rows[-1]
    span = last.step - first.step + 1
    net = math.log2(last.scale_after) - math.log2(first.scale)
    backoffs = sum(1 for r in rows if r.scale_after < r.scale)
    growths = sum(1 for r in rows if r.scale_after > r.scale)
    now = last.scale_after

    def made(trend: Trend, text: str, to_floor: int | None, per: float | None) -> ScaleForecast:
        if now < 1.0:
            text += f"; the scale is {_scale(now)}, under 1: the gradients are made smaller"
        return ScaleForecast(trend, text, first.step, last.step, now, floor, to_floor, per)

    if ceiling is not None and now >= ceiling:
        held = span - (_last_change(rows) - first.step + 1 if backoffs or growths else 0)
        return made("pinned", f"pinned at max_scale for {held:,} steps", None, None)
    # One change (a load, a control request, one backoff) is a level, not a rate.
    lone = (net < 0 and backoffs < 2) or (net > 0 and growths < 2)
    if abs(net) <= STEADY_LOG2 or lone:
        return made("steady", f"steady near {_power(now)}", None, None)
    per = span / abs(net)  # steps per halving (or doubling)
    if net < 0:
        below = math.log2(now) - math.log2(floor)
        to_floor = 0 if below <= 0 else round(below * per)
        where = (
            f"at {_scale(floor)} already"
            if to_floor == 0
            else f"{_scale(floor)} in ~{_round(to_floor):,} steps at this rate"
        )
        return made("falling", f"halving every ~{_round(per):,} steps: {where}", to_floor, per)
    text = f"doubling every ~{_round(per):,} steps"
    if ceiling is not None:
        text += f": max_scale in ~{_round(math.log2(ceiling / now) * per):,} steps"
    return made("rising", text, None, per)


def _last_change(rows: Sequence[ScaleStep]) -> int:
    return max(r.step for r in rows if r.scale_after != r.scale)


def _round(n: float) -> int:
    """Two significant digits: ~310, ~4,700."""
    if n < 100:
        return round(n)
    digits = len(str(int(n))) - 2
    return int(round(n, -digits))


def _power(scale: float) -> str:
    return f"2^{round(math.log2(scale))}"


def _scale(value: float) -> str:
    """1.0, 65,536.0, 0.25: as a person reads a scale."""
    return f"{value:,.1f}" if value >= 1 else f"{value:.3g}"
