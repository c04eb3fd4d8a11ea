"""The chart series' oracle: random step records, and a chart's columns computed one stored
step at a time."""

from __future__ import annotations

import math
import random
from typing import Any

from scalewatch.store import StepRecord
from scalewatch.store.step_schema import SERIES, SERIES_KEYS, Fold

from .records import step_record


def chart_record(rng: random.Random, step: int) -> StepRecord:
    overflow = rng.random() < 0.02
    return step_record(
        step,
        scale=2.0 ** rng.randint(0, 24),
        overflow=overflow,
        skipped=overflow and rng.random() < 0.8,
        inf_ranks=(1,) if overflow else (),
        scale_after=2.0 ** rng.randint(0, 24),
        growth_tracker=rng.randint(0, 2000),
        loss=rng.choice([rng.uniform(0.0, 9.0)] * 6 + [None, math.inf, math.nan]),
        lr=rng.choice([rng.uniform(1e-5, 1e-3)] * 8 + [None]),
        schedule_drift=rng.choice([None, rng.randint(0, 50)]),
        grad_norm=rng.choice([rng.uniform(0.0, 40.0)] * 6 + [None, math.nan]),
        loss_spike=rng.random() < 0.01,
        grad_norm_spike=rng.random() < 0.01,
    )


def plain_columns(rows: list[dict[str, Any]], lo: int, hi: int, width: int) -> dict[str, list[Any]]:
    """The chart columns of the stored ``rows`` in ``[lo, hi]``, one step at a time."""
    buckets: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        if lo <= row["step"] <= hi:
            buckets.setdefault(row["step"] // width, []).append(row)
    columns: dict[str, list[Any]] = {key: [] for key in SERIES_KEYS}
    for members in buckets.values():
        last = members[-1]
        values: list[Any] = [members[0]["step"], last["step"], len(members)]
        for spec in SERIES:
            if spec.fold is Fold.RANGE:
                present = [m[f.name] for m in members for f in spec.fields]
                present = [v for v in present if v is not None]
                values += [min(present), max(present)] if present else [None, None]
            elif spec.fold is Fold.COUNT:
                values.append(sum(int(m[spec.fields[0].name]) for m in members))
            if spec.last is not None:
                values.append(last[spec.last.name])
        for key, value in zip(SERIES_KEYS, values, strict=True):
            columns[key].append(value)
    return columns
