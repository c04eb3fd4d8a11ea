"""What the store's tests share: the control a run starts with, and the oracle of the
store's rollups computed by brute force from the records themselves.

    >>> sorted(CONTROL)[:2]
    ['backoff_factor', 'growth_factor']
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from sqlalchemy import select

from scalewatch.store import StepRecord, Store
from scalewatch.store.schema import ROLLUP_LEVELS, steps

CONTROL = {
    "growth_interval": 2000,
    "growth_factor": 2.0,
    "backoff_factor": 0.5,
    "min_scale": None,
    "max_scale": None,
    "hysteresis": None,
}


def expected_rollups(
    run_id: int,
    records: Iterable[StepRecord],
    levels: Mapping[int, int] = ROLLUP_LEVELS,
    *,
    with_loss: bool = True,
    with_lr: bool = True,
    with_grad_norm: bool = True,
) -> set[tuple[int | float | None, ...]]:
    """The ``step_rollups`` rows of ``records`` at ``levels`` (level -> width), computed by
    brute force from the records themselves: the oracle for the store's rollups.

    ``with_loss``: with the min and max of the finite losses (revision 7c25d1a9e5f0 on);
    ``with_lr``: of the learning rates (revision b41e7f2c9d08 on); ``with_grad_norm``: of
    the finite gradient norms (revision f5a3c9e1d7b2 on).
    """
    expected: set[tuple[int | float | None, ...]] = set()
    for level, width in levels.items():
        buckets: dict[int, list[StepRecord]] = {}
        for record in records:
            buckets.setdefault(record.step // width, []).append(record)
        for bucket, members in buckets.items():
            last = max(members, key=lambda r: r.step)
            scales = [r.scale for r in members] + [r.scale_after for r in members]
            trackers = [r.growth_tracker for r in members]
            losses = [r.loss for r in members if r.loss is not None and math.isfinite(r.loss)]
            loss = (min(losses), max(losses)) if losses else (None, None)
            rates = [r.lr for r in members if r.lr is not None]
            lr = (min(rates), max(rates)) if rates else (None, None)
            norms = [
                r.grad_norm
                for r in members
                if r.grad_norm is not None and math.isfinite(r.grad_norm)
            ]
            norm = (min(norms), max(norms)) if norms else (None, None)
            expected.add(
                (
                    run_id,
                    level,
                    bucket,
                    min(r.step for r in members),
                    last.step,
                    len(members),
                    min(scales),
                    max(scales),
                    last.scale_after,
                    min(trackers),
                    max(trackers),
                    last.growth_tracker,
                    sum(r.overflow for r in members),
                    sum(r.skipped for r in members),
                    *(loss if with_loss else ()),
                    *(lr if with_lr else ()),
                    *(norm if with_grad_norm else ()),
                    *(
                        (
                            sum(r.loss_spike for r in members),
                            sum(r.grad_norm_spike for r in members),
                            sum(r.spike_skipped for r in members),
                        )
                        if with_grad_norm
                        else ()
                    ),
                )
            )
    return expected


def db_url(path: Path) -> str:
    """The URL of a SQLite store in the file ``path``."""
    return f"sqlite:///{path}"


def step_rows(store: Store, run_id: int | None = None) -> list[dict[str, Any]]:
    """The ``steps`` rows of the store (of one run), in step order, as dicts."""
    query = select(steps).order_by(steps.c.run_id, steps.c.step)
    if run_id is not None:
        query = query.where(steps.c.run_id == run_id)
    with store.read() as conn:
        return [dict(row._mapping) for row in conn.execute(query)]
