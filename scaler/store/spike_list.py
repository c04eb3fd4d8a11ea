"""Reading a run's spikes: each with the largest parameter norms kept at its step.

>>> Spike(step=7, what="loss", value=9.5, z=11.2, params=()).what
'loss'
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func, select

from .engine import Store
from .schema import param_norms, spikes

__all__ = ["ParamNorm", "Spike", "spike_counts", "spikes_of"]


@dataclass(frozen=True, slots=True)
class ParamNorm:
    """One of a step's largest per-parameter gradient norms (None: not finite)."""

    name: str
    norm: float | None


@dataclass(frozen=True, slots=True)
class Spike:
    """A step whose loss or gradient norm spiked: ``what``, its ``value`` and robust ``z``,
    and the largest parameter norms kept at that step (largest first)."""

    step: int
    what: str
    value: float
    z: float
    params: tuple[ParamNorm, ...]


def spikes_of(
    store: Store,
    run_id: int,
    *,
    start: int | None = None,
    end: int | None = None,
    limit: int = 1000,
) -> list[Spike]:
    """The spikes of steps ``start..end`` of run ``run_id`` (default: all), oldest first,
    at most ``limit``."""
    query = select(spikes.c.step, spikes.c.what, spikes.c.value, spikes.c.z).where(
        spikes.c.run_id == run_id
    )
    if start is not None:
        query = query.where(spikes.c.step >= start)
    if end is not None:
        query = query.where(spikes.c.step <= end)
    query = query.order_by(spikes.c.step, spikes.c.what).limit(limit)
    with store.read() as conn:
        found = conn.execute(query).all()
        steps = sorted({row.step for row in found})
        kept: dict[int, list[ParamNorm]] = {}
        if steps:
            norms = (
                select(param_norms.c.step, param_norms.c.name, param_norms.c.norm)
                .where(param_norms.c.run_id == run_id, param_norms.c.step.in_(steps))
                .order_by(param_norms.c.step, param_norms.c.position)
            )
            for row in conn.execute(norms):
                kept.setdefault(row.step, []).append(ParamNorm(row.name, row.norm))
    return [
        Spike(row.step, row.what, row.value, row.z, tuple(kept.get(row.step, ()))) for row in found
    ]


def spike_counts(store: Store, run_id: int) -> dict[str, int]:
    """The run's spikes by what spiked: ``{"loss": n, "grad_norm": m}``."""
    query = (
        select(spikes.c.what, func.count()).where(spikes.c.run_id == run_id).group_by(spikes.c.what)
    )
    counts = {"loss": 0, "grad_norm": 0}
    with store.read() as conn:
        for what, count in conn.execute(query):
            counts[str(what)] = int(count)
    return counts
