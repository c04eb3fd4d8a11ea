"""A run's loss and gradient-norm spikes."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from scalewatch.store import spike_list

from ..deps import StoreDep
from ..models import ErrorMessage, SpikeItem, SpikeList
from .runs import NonNegative, RunId, require_run_exists

router = APIRouter(prefix="/api/runs", tags=["spikes"])


@router.get("/{run}/spikes", responses={404: {"model": ErrorMessage, "description": "no such run"}})
def get_spikes(
    store: StoreDep,
    run: RunId,
    start: NonNegative = None,
    end: NonNegative = None,
    limit: Annotated[int, Query(ge=1, le=10000)] = 1000,
) -> SpikeList:
    """The steps of ``start..end`` (default: the whole run) whose loss or gradient norm
    spiked, oldest first: what spiked, its value and robust z against the run's window, and
    the ten largest parameter norms kept at that step (a run that measures the norm)."""
    require_run_exists(store, run)
    found = spike_list.spikes_of(store, run, start=start, end=end, limit=limit)
    return SpikeList(
        run=run, items=[SpikeItem.model_validate(s, from_attributes=True) for s in found]
    )
