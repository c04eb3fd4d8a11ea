"""Exports of a run's steps or overflows, streamed as CSV or JSON Lines with flat memory."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter
from fastapi.responses import StreamingResponse

from ..deps import StoreDep
from ..exports import MEDIA_TYPES, export_chunks, export_filename
from .runs import NOT_FOUND, NonNegative, RunId, require_run

router = APIRouter(prefix="/api/runs", tags=["export"])


@router.get(
    "/{run}/export",
    response_class=StreamingResponse,
    responses={200: {"content": {MEDIA_TYPES["csv"]: {}, MEDIA_TYPES["jsonl"]: {}}}, **NOT_FOUND},
)
def export(
    store: StoreDep,
    run: RunId,
    what: Literal["steps", "overflows"] = "steps",
    format: Literal["csv", "jsonl"] = "csv",
    start: NonNegative = None,
    end: NonNegative = None,
) -> StreamingResponse:
    """Columns: step, wall_time, scale, overflow, skipped, inf_ranks, scale_after,
    growth_tracker, growth_interval, growth_factor, backoff_factor, control_version, loss,
    loss_nonfinite_ranks, params_omitted, lr (the learning rate in effect at the step),
    lr_groups (every param group's, ``[[0.001,0.0005],[0.01]]``, only when one differs from
    lr); an overflows export adds params, the parameters
    found non-finite: in CSV ``rank:name:kind:count`` joined by ``;``
    (``1:fc.weight:inf:12;0:fc.bias:nan:3``), in JSON Lines a list of
    ``{"rank", "name", "kind", "count"}``. Ranks are ``"0,3"`` in CSV, lists in JSON; a
    loss or learning rate not recorded or not finite is empty (null).

    Everything is checked before the first byte: a bad request is a 4xx, never a broken 200.
    An ``end`` below ``start`` is an empty range.
    """
    info = require_run(store, run)
    filename = export_filename(info.name, run, what, format)
    return StreamingResponse(
        export_chunks(store, run, what=what, fmt=format, start=start, end=end),
        media_type=MEDIA_TYPES[format],
        headers={"Content-Disposition": f'attachment; filename="{filename}"'},
    )
