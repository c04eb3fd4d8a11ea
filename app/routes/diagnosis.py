"""Overflow diagnosis: one overflow in full, and the parameters that overflow most."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Query, status

from scalewatch.store import diagnosis
from scalewatch.store.queries import INT64_MAX

from ..deps import StoreDep
from ..models import ErrorMessage, OverflowDetail, ParamRanking
from .runs import NonNegative, RunId, require_run_exists

router = APIRouter(prefix="/api/runs", tags=["diagnosis"])

StepNumber = Annotated[int, Path(ge=0, le=INT64_MAX)]


@router.get(
    "/{run}/overflows/{step}",
    responses={
        404: {"model": ErrorMessage, "description": "no such run, or that step is no overflow"}
    },
)
def get_overflow(store: StoreDep, run: RunId, step: StepNumber) -> OverflowDetail:
    """One overflow step: its record, every parameter found non-finite on every rank (by
    rank, then name), and the ranks whose loss was not finite."""
    require_run_exists(store, run)
    found = diagnosis.overflow_detail(store, run, step)
    if found.step is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"run {run} has no step {step}")
    if not found.is_overflow:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND, detail=f"step {step} of run {run} did not overflow"
        )
    return OverflowDetail.model_validate({**found.step, "run": run, "params": found.params})


@router.get("/{run}/params", responses={404: {"model": ErrorMessage, "description": "no such run"}})
def get_params(
    store: StoreDep,
    run: RunId,
    start: NonNegative = None,
    end: NonNegative = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 20,
) -> ParamRanking:
    """The parameters found non-finite at the most overflow steps of steps ``start..end``
    (default: the whole run), most first; ties go to the one seen latest. An ``end`` below
    ``start`` is an empty range."""
    require_run_exists(store, run)
    ranking = diagnosis.param_ranking(store, run, start=start, end=end, limit=limit)
    return ParamRanking.model_validate(
        {
            "run": run,
            "start": start,
            "end": end,
            "overflows": ranking.overflows,
            "params_omitted": ranking.params_omitted,
            "params": [asdict(param) for param in ranking.params],
        }
    )
