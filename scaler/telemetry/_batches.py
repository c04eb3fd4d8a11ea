"""The writer's commands as the service's ingest routes take them: JSON-ready items.

A step travels as an object keyed by its fields' names (``step_values`` zipped with the
step schema's columns), or, to a service that takes them (``rows``), as its
``step_values`` under one list of the columns; either way a field declared in the schema
travels with no change here.
Pure functions; the sender to the service (``_sender``) calls them on its thread.

>>> from scalewatch.telemetry._queue import RecordGap
>>> items([RecordGap(3, 5, 3)], reason="telemetry queue full")
[{'kind': 'gap', 'first': 3, 'last': 5, 'dropped': 3, 'reason': 'telemetry queue full'}]
"""

from __future__ import annotations

from typing import Any, cast

from ..store.step_rows import COLUMNS
from ._queue import Command, RecordGap, RecordLoad, WriteOutcome, findings_of, is_step

__all__ = ["items", "steps_in"]


def steps_in(commands: list[Command]) -> int:
    """How many of ``commands`` are steps."""
    return sum(1 for command in commands if is_step(command))


def items(
    commands: list[Command], *, reason: str, rows: tuple[str, ...] | None = None
) -> list[dict[str, Any]]:
    """``commands`` (as :meth:`CommandQueue.take` gives them) as a batch's items, in their
    order; ``reason``: why a gap's steps were dropped; ``rows``: steps as rows of these of
    their columns (those a service takes: a field it does not know is left out)."""
    if not commands:
        return []
    head = commands[0]
    if isinstance(head, RecordGap):
        return [_gap(gap, reason) for gap in commands if isinstance(gap, RecordGap)]
    if isinstance(head, RecordLoad):
        load = head.load
        return [
            {
                "kind": "load",
                "step": load.step,
                "at": load.at,
                "scale_after": load.scale_after,
                "scale_before": load.scale_before,
                "from_step": load.from_step,
            }
        ]
    if isinstance(head, WriteOutcome):
        return [_outcome(head)]
    findings = [
        {"step": step, "rank": rank, "name": name, "kind": str(kind), "count": count}
        for step, rank, name, kind, count in findings_of(commands)
    ]
    values = cast(list[tuple[Any, ...]], commands)  # take() gives steps alone, or none
    if rows is not None:
        if rows != COLUMNS:
            picked = [COLUMNS.index(name) for name in rows]
            values = [tuple(row[i] for i in picked) for row in values]
        return [{"kind": "step_rows", "columns": rows, "rows": values, "findings": findings}]
    steps = [dict(zip(COLUMNS, row, strict=True)) for row in values]
    return [{"kind": "steps", "steps": steps, "findings": findings}]


def _gap(gap: RecordGap, reason: str) -> dict[str, Any]:
    return {
        "kind": "gap",
        "first": gap.first,
        "last": gap.last,
        "dropped": gap.dropped,
        "reason": reason,
    }


def _outcome(queued: WriteOutcome) -> dict[str, Any]:
    outcome = queued.outcome
    return {
        "kind": "outcome",
        "step": queued.step,
        "at": queued.at,
        "source": str(outcome.source),
        "request_id": outcome.request_id,
        "values": dict(outcome.values),
        "applied": outcome.applied,
        "reason": outcome.reason,
        "state": dict(outcome.state),
        "version": outcome.version,
    }
