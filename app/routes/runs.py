"""Runs: the list, one run, its chart series, its overflows and the loads of its scaler's state."""

from __future__ import annotations

from typing import Annotated, Any

import anyio
from fastapi import APIRouter, HTTPException, Path, Query, Response, status

from scalewatch.store import diagnosis, forecast, queries, scale_loads, spike_list
from scalewatch.store.chart_cache import ChartCache
from scalewatch.store.engine import Store
from scalewatch.store.queries import BEFORE_FIRST_STEP, INT64_MAX, RunInfo

from ..deps import ServicesDep, SettingsDep, StoreDep
from ..models import (
    ErrorMessage,
    OverflowItem,
    OverflowPage,
    RunDetail,
    RunList,
    RunSummary,
    ScaleForecastOut,
    ScaleLoadItem,
    ScaleLoadList,
    Step,
    StepSeries,
)

router = APIRouter(prefix="/api/runs", tags=["runs"])

RunId = Annotated[int, Path(ge=1, le=INT64_MAX)]
NonNegative = Annotated[Step | None, Query()]
After = Annotated[int | None, Query(ge=BEFORE_FIRST_STEP, le=INT64_MAX)]
NOT_FOUND: dict[int | str, dict[str, object]] = {
    404: {"model": ErrorMessage, "description": "no such run"}
}
RETRY_AFTER_S = 1
BUSY: dict[int | str, dict[str, object]] = {
    503: {
        "model": ErrorMessage,
        "description": "every chart query slot stayed taken for the service's chart_wait_s:"
        " ask again after the seconds in Retry-After, or for fewer points",
        "headers": {"Retry-After": {"schema": {"type": "integer"}}},
    }
}


def summary(run: RunInfo) -> RunSummary:
    return RunSummary.model_validate(run, from_attributes=True)


def require_run(store: StoreDep, run_id: int) -> RunInfo:
    run = queries.get_run(store, run_id)
    if run is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no run {run_id}")
    return run


def require_run_exists(store: StoreDep, run_id: int) -> None:
    if queries.run_status(store, run_id) is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no run {run_id}")


@router.get("")
def list_runs(store: StoreDep) -> RunList:
    return RunList(runs=[summary(run) for run in queries.list_runs(store)])


@router.get("/{run}", responses=NOT_FOUND)
def get_run(store: StoreDep, run: RunId) -> RunDetail:
    detail = RunDetail.model_validate(require_run(store, run), from_attributes=True)
    loads, jumps = scale_loads.load_counts(store, run)
    update: dict[str, Any] = {"scale_loads": loads, "scale_jumps": jumps}
    update["forecast"] = _forecast(store, detail)
    update["spikes"] = spike_list.spike_counts(store, run)
    return detail.model_copy(update=update)


def _forecast(store: Store, detail: RunDetail) -> ScaleForecastOut | None:
    """Where the run's scale is heading, from its last ``forecast.WINDOW`` steps."""
    floor, ceiling = detail.config.get("min_scale"), detail.config.get("max_scale")
    found = forecast.read_forecast(
        forecast.recent_scale_changes(store, detail.id, detail.steps),
        floor=float(floor) if isinstance(floor, int | float) and floor > 0 else 1.0,
        ceiling=float(ceiling) if isinstance(ceiling, int | float) and ceiling > 0 else None,
    )
    return None if found is None else ScaleForecastOut.model_validate(found, from_attributes=True)


def chart_json(
    store: Store,
    run: int,
    start: int | None,
    end: int | None,
    max_points: int,
    cache: ChartCache | None = None,
) -> Response:
    """The chart series of a run as a JSON response, built and validated off the event loop."""
    require_run_exists(store, run)
    series = queries.chart_series(
        store, run, start=start, end=end, max_points=max_points, cache=cache
    )
    body = StepSeries.model_validate(
        {
            "run": series.run,
            "start": series.start,
            "end": series.end,
            "bucket_width": series.bucket_width,
            "series": series.columns,
        }
    ).model_dump_json()
    return Response(body, media_type="application/json")


@router.get("/{run}/steps", response_model=StepSeries, responses={**NOT_FOUND, **BUSY})
async def get_steps(
    services: ServicesDep,
    settings: SettingsDep,
    store: StoreDep,
    run: RunId,
    start: NonNegative = None,
    end: NonNegative = None,
    max_points: Annotated[int, Query(ge=2, le=10_000)] = 1000,
) -> Response:
    """Chart buckets with min/max/last per bucket: no overflow is ever sampled away. An
    ``end`` below ``start`` is an empty range. A busy service answers 503 with Retry-After
    rather than queue a request (fewer points read fewer rows)."""
    # A few chart queries at a time: more would only share the same cores, and a busy
    # service must still leave the event loop (the live streams) its turn. One that cannot
    # start within chart_wait_s is refused at once: a wait of tens of seconds on a
    # saturated machine is a dashboard that is down, a fast 503 one that says so.
    limiter, started = services.chart_limiter, False
    with anyio.move_on_after(settings.chart_wait_s):
        await limiter.acquire()
        started = True
    if not started:
        raise HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE,
            detail=f"busy: no chart query could start within {settings.chart_wait_s:g} s;"
            " ask again shortly, or for fewer points",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )
    try:
        return await anyio.to_thread.run_sync(
            chart_json, store, run, start, end, max_points, services.charts
        )
    finally:
        limiter.release()


@router.get("/{run}/overflows", responses=NOT_FOUND)
def get_overflows(
    store: StoreDep,
    run: RunId,
    after: After = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
    params: bool = True,
) -> OverflowPage:
    """Overflow steps after ``after``, oldest first, keyset-paged by step, each with the
    parameters found non-finite (``params``, by rank then name) and the ranks whose loss
    was not finite (``loss_nonfinite_ranks``, empty when it was finite everywhere).
    ``params=false`` leaves the parameters out (``null``): an overflow may have hundreds,
    and a chart's markers need none of them."""
    require_run_exists(store, run)
    page = diagnosis.overflow_page(store, run, after=after, limit=limit, with_params=params)
    return OverflowPage(
        items=[OverflowItem.model_validate(item) for item in page.items], next=page.next
    )


@router.get("/{run}/scale-loads", responses=NOT_FOUND)
def get_scale_loads(store: StoreDep, run: RunId) -> ScaleLoadList:
    """Each load of a scaler's state into the run once it had steps, oldest first: the
    step count loaded, the step the run was at, the scale before and after, and
    ``jump``, whether the loaded scale differs from the run's last recorded one (a resumed
    job that restored another scale). A run that started from a checkpoint has none for
    that load: its first scale is the loaded one."""
    require_run_exists(store, run)
    rows = scale_loads.scale_loads_of(store, run)
    items = [ScaleLoadItem.model_validate(row, from_attributes=True) for row in rows]
    return ScaleLoadList(run=run, items=items)
