"""Step records for tests that write a store: a test names the fields it cares about, and
the rest are those of a quiet step (no overflow, the scale unchanged, torch's factors).

    >>> record = step_record(3, overflow=True, scale=8.0, scale_after=4.0)
    >>> record.skipped, record.wall_time, record.growth_interval
    (True, 1700000003.0, 2000)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from scalewatch.store.records import StepRecord


def step_record(
    step: int,
    *,
    overflow: bool = False,
    scale: float = 1024.0,
    wall_time: float | None = None,
    **fields: Any,
) -> StepRecord:
    """The record of ``step``: ``wall_time`` a second a step from 1_700_000_000, an overflow
    skipped, no rank named, the scale kept; every other field as ``fields`` give it."""
    fields.setdefault("skipped", overflow)
    fields.setdefault("inf_ranks", ())
    fields.setdefault("scale_after", scale)
    fields.setdefault("growth_tracker", 0)
    fields.setdefault("growth_interval", 2000)
    fields.setdefault("growth_factor", 2.0)
    fields.setdefault("backoff_factor", 0.5)
    fields.setdefault("control_version", 0)
    return StepRecord(
        step=step,
        wall_time=1_700_000_000.0 + step if wall_time is None else wall_time,
        scale=scale,
        overflow=overflow,
        **fields,
    )


def rising_records(
    steps: range, power: Callable[[int], int], overflows: frozenset[int] = frozenset()
) -> list[StepRecord]:
    """Steps whose scale is 2**power(step), overflowing (on rank 0) at ``overflows``."""
    return [
        step_record(
            step,
            scale=2.0 ** power(step),
            overflow=step in overflows,
            inf_ranks=(0,) if step in overflows else (),
            scale_after=2.0 ** power(step + 1),
            growth_interval=46,
        )
        for step in steps
    ]
