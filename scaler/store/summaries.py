"""Summaries of a run's audit trail and of its latest steps, for the autopilot: each one
or two small queries, on SQLite and PostgreSQL alike."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import and_, case, func, select, true

from .engine import Store
from .schema import control_requests, steps
from .states import RequestSource, RequestStatus

__all__ = ["RequestSummary", "StepSummary", "request_summary", "step_summary"]


@dataclass(frozen=True, slots=True)
class RequestSummary:
    """What the run's audit trail says about changes, for the autopilot."""

    changed_at_step: int  # the step its control last changed at (any source); 0: never
    pending: bool  # a request of the autopilot not applied yet
    changes_since: int  # the autopilot's requests since the time asked about


def request_summary(store: Store, run_id: int, *, since: float) -> RequestSummary:
    c = control_requests.c
    own = c.source == RequestSource.AUTOPILOT
    query = select(
        func.max(case((c.status == RequestStatus.APPLIED, c.applied_step))),
        func.count(case((and_(own, c.status == RequestStatus.PENDING), 1))),
        func.count(case((and_(own, c.requested_at >= since), 1))),
    ).where(c.run_id == run_id)
    with store.read() as conn:
        changed, pending, recent = conn.execute(query).one()
    return RequestSummary(int(changed or 0), bool(pending), int(recent))


@dataclass(frozen=True, slots=True)
class StepSummary:
    """The run's steps after a step: counts, the start of overflow streaks, scales."""

    steps: int
    skipped: int
    streaks: int  # overflows after a step that did not overflow (or none stored)
    last_overflow: int | None
    last_step: int
    scale_max: float
    scale_now: float


def step_summary(store: Store, run_id: int, *, after: int) -> StepSummary | None:
    """The steps of ``run_id`` numbered over ``after``: one range of the primary key, and
    one look-up of each step's predecessor. None when there are none."""
    s, p = steps.alias("s"), steps.alias("p")
    began = and_(s.c.overflow, p.c.overflow.is_not(true()))
    query = (
        select(
            func.count(),
            func.sum(case((s.c.skipped, 1), else_=0)),
            func.sum(case((began, 1), else_=0)),
            func.max(case((s.c.overflow, s.c.step))),
            func.max(s.c.step),
            func.max(s.c.scale),
        )
        .select_from(s.outerjoin(p, and_(p.c.run_id == s.c.run_id, p.c.step == s.c.step - 1)))
        .where(s.c.run_id == run_id, s.c.step > after)
    )
    with store.read() as conn:
        count, skipped, streaks, last_overflow, last, scale_max = conn.execute(query).one()
        if not count:
            return None
        now = conn.execute(
            select(steps.c.scale_after).where(steps.c.run_id == run_id, steps.c.step == last)
        ).scalar_one()
    return StepSummary(
        steps=int(count),
        skipped=int(skipped),
        streaks=int(streaks),
        last_overflow=None if last_overflow is None else int(last_overflow),
        last_step=int(last),
        scale_max=float(max(scale_max, now)),
        scale_now=float(now),
    )
