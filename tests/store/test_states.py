"""Run and request states are enums on the way out of the store, the same text in it."""

from __future__ import annotations

from sqlalchemy import select

from scalewatch.store import RunRef, Store
from scalewatch.store.control import control_history, record_code_change, request_control
from scalewatch.store.queries import get_run, run_status
from scalewatch.store.runs import end_run
from scalewatch.store.schema import control_requests, runs
from scalewatch.store.states import RequestSource, RequestStatus, RunStatus
from tests._helpers.stored import CONTROL


def test_a_run_reads_as_its_status_enum_and_is_stored_as_text(store: Store, run: RunRef) -> None:
    info = get_run(store, run.id)
    assert info is not None and info.status is RunStatus.RUNNING
    end_run(store, run.id, "crashed")
    assert run_status(store, run.id) is RunStatus.CRASHED
    with store.read() as conn:
        stored = conn.execute(select(runs.c.status).where(runs.c.id == run.id)).scalar_one()
    assert type(stored) is str and stored == "crashed"


def test_requests_read_as_their_enums_and_are_stored_as_text(store: Store, run: RunRef) -> None:
    asked = request_control(store, run.id, {"growth_interval": 500}, requested_by="me")
    assert (asked.source, asked.status) == (RequestSource.API, RequestStatus.PENDING)
    assert isinstance(asked.source, RequestSource) and isinstance(asked.status, RequestStatus)
    coded = record_code_change(
        store, run.id, {"growth_interval": 100}, step=3, at=1.0, state=CONTROL, version=1
    )
    assert coded.source is RequestSource.CODE and coded.status is RequestStatus.APPLIED
    end_run(store, run.id)
    statuses = [row.status for row in control_history(store, run.id)]
    assert statuses == [RequestStatus.REJECTED, RequestStatus.APPLIED]
    assert all(isinstance(status, RequestStatus) for status in statuses)
    with store.read() as conn:
        stored = conn.execute(
            select(control_requests.c.source, control_requests.c.status).order_by(
                control_requests.c.id
            )
        ).all()
    assert [tuple(row) for row in stored] == [("api", "rejected"), ("code", "applied")]
    assert all(type(value) is str for row in stored for value in row)
