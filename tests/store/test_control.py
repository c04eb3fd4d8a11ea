from __future__ import annotations

import math
import time
from typing import Any

import pytest

from scalewatch.store import (
    ControlValidationError,
    RequestNotFound,
    RunNotFound,
    RunNotRunning,
    RunRef,
    Store,
)
from scalewatch.store.control import (
    CONTROL_FIELDS,
    control_history,
    control_state,
    mark_applied,
    mark_rejected,
    pending_requests,
    record_code_change,
    request_control,
    validate_control,
)
from scalewatch.store.runs import HEARTBEAT_TIMEOUT_S, create_run, end_run, heartbeat, resume_run
from scalewatch.store.states import RequestSource
from tests._helpers.stored import CONTROL

TINY_WORDS = "< 1 and at least float32's smallest normal"

INT_RULE = "must be an integer >= 1 and <= 2147483647"
BAD_VALUES: list[tuple[dict[str, Any], str, str]] = [
    ({"growth_interval": 0}, "growth_interval", INT_RULE),
    ({"growth_interval": -5}, "growth_interval", INT_RULE),
    ({"growth_interval": 2**31}, "growth_interval", INT_RULE),
    ({"growth_interval": 500.5}, "growth_interval", INT_RULE),
    ({"growth_interval": "500"}, "growth_interval", INT_RULE),
    ({"growth_interval": True}, "growth_interval", INT_RULE),
    ({"growth_interval": None}, "growth_interval", INT_RULE),
    ({"growth_interval": [500]}, "growth_interval", INT_RULE),
    ({"growth_interval": math.inf}, "growth_interval", INT_RULE),
    ({"growth_factor": 1.0}, "growth_factor", "finite number > 1"),
    ({"growth_factor": 0.5}, "growth_factor", "finite number > 1"),
    ({"growth_factor": math.inf}, "growth_factor", "finite number > 1"),
    ({"growth_factor": math.nan}, "growth_factor", "finite number > 1"),
    ({"growth_factor": True}, "growth_factor", "finite number > 1"),
    ({"growth_factor": "2.0"}, "growth_factor", "finite number > 1"),
    ({"growth_factor": {"value": 2.0}}, "growth_factor", "finite number > 1"),
    ({"backoff_factor": 0}, "backoff_factor", TINY_WORDS),
    ({"backoff_factor": 1}, "backoff_factor", TINY_WORDS),
    ({"backoff_factor": 1.5}, "backoff_factor", TINY_WORDS),
    ({"backoff_factor": -0.5}, "backoff_factor", TINY_WORDS),
    ({"backoff_factor": math.nan}, "backoff_factor", TINY_WORDS),
    ({"backoff_factor": False}, "backoff_factor", TINY_WORDS),
    ({"backoff_factor": 1e-300}, "backoff_factor", TINY_WORDS),
    ({"scale": 0.0}, "scale", "float32's normal range"),
    ({"scale": -1.0}, "scale", "float32's normal range"),
    ({"scale": math.inf}, "scale", "float32's normal range"),
    ({"scale": math.nan}, "scale", "float32's normal range"),
    ({"scale": 10**400}, "scale", "float32's normal range"),
    ({"min_scale": 0.0}, "min_scale", "float32's normal range"),
    ({"scale": 5e-324}, "scale", "float32's normal range"),  # rounds to 0 in float32
    ({"max_scale": 1e-46}, "max_scale", "float32's normal range"),
    ({"min_scale": 1e-39}, "min_scale", "float32's normal range"),
    ({"min_scale": -math.inf}, "min_scale", "float32's normal range"),
    ({"max_scale": math.nan}, "max_scale", "float32's normal range"),
    ({"max_scale": "big"}, "max_scale", "float32's normal range"),
    ({"min_scale": 8.0, "max_scale": 4.0}, "min_scale", "<= max_scale"),
    ({"min_scale": 8.0, "max_scale": 4.0}, "max_scale", ">= min_scale"),
    ({"hysteresis": 0}, "hysteresis", INT_RULE),
    ({"hysteresis": 1.5}, "hysteresis", INT_RULE),
    ({"hysteresis": True}, "hysteresis", INT_RULE),
    ({"growth_intervall": 500}, "growth_intervall", "unknown field"),
    ({"growth_interval": 500, "cheese": 1}, "cheese", "unknown field"),
    ({}, "request", "at least one of"),
]


def _snapshot(store: Store, run: RunRef) -> tuple[object, ...]:
    return (
        control_state(store, run.id),
        control_history(store, run.id),
        pending_requests(store, run.id),
    )


@pytest.mark.parametrize(("values", "field", "rule"), BAD_VALUES)
def test_bad_values_are_refused_and_nothing_changes(
    store: Store, run: RunRef, values: dict[str, Any], field: str, rule: str
) -> None:
    before = _snapshot(store, run)
    with pytest.raises(ControlValidationError) as caught:
        request_control(store, run.id, values, requested_by="alice")
    assert rule in caught.value.errors[field]
    assert field in str(caught.value)
    assert isinstance(caught.value, ValueError)
    assert _snapshot(store, run) == before
    assert before[1] == []


def test_min_and_max_are_checked_against_the_values_in_effect(store: Store) -> None:
    bounded = {**CONTROL, "min_scale": 1.0, "max_scale": 1024.0}
    run = create_run(store, name="bounded", world_size=1, config={}, control=bounded)
    with pytest.raises(ControlValidationError) as caught:
        request_control(store, run.id, {"min_scale": 2048.0}, requested_by="alice")
    assert caught.value.errors == {"min_scale": "min_scale must be <= max_scale (1024.0)"}
    with pytest.raises(ControlValidationError) as caught:
        request_control(store, run.id, {"max_scale": 0.5}, requested_by="alice")
    assert caught.value.errors == {"max_scale": "max_scale must be >= min_scale (1.0)"}
    for scale, rule in ((0.5, "scale must be >= min_scale (1.0)"), (2048.0, "<= max_scale")):
        with pytest.raises(ControlValidationError) as caught:
            request_control(store, run.id, {"scale": scale}, requested_by="alice")
        assert rule in caught.value.errors["scale"]
    with pytest.raises(ControlValidationError) as caught:  # checked against the new bound
        request_control(store, run.id, {"scale": 4.0, "min_scale": 8.0}, requested_by="alice")
    assert caught.value.errors == {"scale": "scale must be >= min_scale (8.0)"}
    assert control_history(store, run.id) == []
    accepted = request_control(store, run.id, {"max_scale": 1.0}, requested_by="alice")
    assert accepted.values == {"max_scale": 1.0}


def test_values_are_normalised() -> None:
    values = {
        "hysteresis": 2,
        "growth_interval": 500.0,
        "growth_factor": 2,
        "backoff_factor": 0.25,
        "scale": 1024,
        "min_scale": 1.0,
        "max_scale": 2**24,
    }
    clean = validate_control(values, CONTROL)
    assert list(clean) == list(CONTROL_FIELDS)
    assert clean["growth_interval"] == 500 and type(clean["growth_interval"]) is int
    assert type(clean["growth_factor"]) is float and type(clean["scale"]) is float


def test_pending_then_applied_then_rejected(store: Store, run: RunRef) -> None:
    first = request_control(
        store, run.id, {"growth_interval": 500, "backoff_factor": 0.25}, requested_by="alice"
    )
    second = request_control(store, run.id, {"scale": 1024.0}, requested_by="bob", source="cli")
    assert (first.status, first.source, first.requested_by) == ("pending", "api", "alice")
    assert first.applied_step is None and first.reason is None
    assert pending_requests(store, run.id) == [first, second]

    state = {**CONTROL, "growth_interval": 500, "backoff_factor": 0.25}
    mark_applied(store, first.id, step=120, at=1000.0, state=state, version=1)
    mark_rejected(store, second.id, reason="scale above max_scale", step=121)

    assert pending_requests(store, run.id) == []
    assert control_state(store, run.id) == {**state, "version": 1}
    applied, rejected = control_history(store, run.id)
    assert (applied.id, applied.status, applied.applied_step, applied.applied_at) == (
        first.id,
        "applied",
        120,
        1000.0,
    )
    assert applied.values == {"growth_interval": 500, "backoff_factor": 0.25}
    assert (rejected.status, rejected.reason, rejected.applied_step) == (
        "rejected",
        "scale above max_scale",
        121,
    )
    assert rejected.applied_at is not None
    assert rejected.to_dict() == {
        "id": second.id,
        "run_id": run.id,
        "values": {"scale": 1024.0},
        "source": "cli",
        "requested_by": "bob",
        "requested_at": second.requested_at,
        "status": "rejected",
        "applied_step": 121,
        "applied_at": rejected.applied_at,
        "reason": "scale above max_scale",
        "note": None,
    }

    with pytest.raises(ValueError, match="applied already"):
        mark_rejected(store, first.id, reason="late")
    with pytest.raises(RequestNotFound):
        mark_applied(store, 999, step=1, at=1.0, state=state, version=2)
    assert control_state(store, run.id)["version"] == 1


def test_code_changes_join_the_audit_trail(store: Store, run: RunRef) -> None:
    state = {**CONTROL, "growth_interval": 100}
    row = record_code_change(
        store, run.id, {"growth_interval": 100}, step=7, at=50.0, state=state, version=3
    )
    assert (row.source, row.status, row.applied_step, row.applied_at) == (
        "code",
        "applied",
        7,
        50.0,
    )
    assert control_history(store, run.id) == [row]
    assert control_state(store, run.id) == {**state, "version": 3}


def test_only_running_runs_take_requests(store: Store, run: RunRef) -> None:
    with pytest.raises(RunNotFound):
        request_control(store, run.id + 1, {"growth_interval": 500}, requested_by="alice")
    with pytest.raises(RunNotFound):
        control_state(store, run.id + 1)

    heartbeat(store, run.id, at=time.time() - HEARTBEAT_TIMEOUT_S - 5)
    with pytest.raises(RunNotRunning, match="crashed"):
        request_control(store, run.id, {"growth_interval": 500}, requested_by="alice")
    heartbeat(store, run.id)
    pending = request_control(store, run.id, {"growth_interval": 500}, requested_by="alice")

    end_run(store, run.id)
    with pytest.raises(RunNotRunning, match="finished") as caught:
        request_control(store, run.id, {"growth_interval": 400}, requested_by="alice")
    assert caught.value.status == "finished"
    (ended,) = control_history(store, run.id)
    assert (ended.id, ended.status) == (pending.id, "rejected")
    assert ended.reason == "the run finished first"


@pytest.mark.parametrize("how", ["by its run", "run ended", "run crashed"])
def test_a_rejected_request_keeps_why_it_was_asked_for(store: Store, run: RunRef, how: str) -> None:
    why = "skipped-step rate 5.00% over 500 steps, above the target 1.00%"
    asked = request_control(
        store, run.id, {"min_scale": 4.0}, requested_by="autopilot",
        source=RequestSource.AUTOPILOT, note=why,
    )  # fmt: skip
    assert (asked.note, asked.reason) == (why, None)
    if how == "by its run":  # its reporting rank refused it: the scale was under 4 by then
        mark_rejected(store, asked.id, reason="min_scale must be <= the scale", step=9)
        refusal = "min_scale must be <= the scale"
    elif how == "run ended":
        end_run(store, run.id)
        refusal = "the run finished first"
    else:
        heartbeat(store, run.id, at=time.time() - HEARTBEAT_TIMEOUT_S - 5)
        refusal = "the run crashed first"
    (shown,) = control_history(store, run.id)
    assert (shown.status, shown.note, shown.reason) == ("rejected", why, refusal)
    if how == "run crashed":  # stored so once a trainer resumes the run
        assert resume_run(store, run.uid) is not None
        (stored,) = control_history(store, run.id)
        assert (stored.status, stored.note, stored.reason) == ("rejected", why, refusal)


def test_a_request_left_pending_by_a_crash_is_rejected_never_applied_late(
    store: Store, run: RunRef
) -> None:
    early = request_control(store, run.id, {"growth_interval": 500}, requested_by="alice")
    heartbeat(store, run.id, at=time.time() - HEARTBEAT_TIMEOUT_S - 5)  # the trainer died
    (shown,) = control_history(store, run.id)
    assert (shown.id, shown.status, shown.reason) == (early.id, "rejected", "the run crashed first")
    assert resume_run(store, run.uid) is not None  # a trainer takes the run up again
    assert pending_requests(store, run.id) == []
    (stored,) = control_history(store, run.id)
    assert (stored.status, stored.reason) == ("rejected", "the run crashed first")
    # A run resumed while alive (its writer starting over) keeps what is pending.
    later = request_control(store, run.id, {"growth_interval": 400}, requested_by="alice")
    assert resume_run(store, run.uid) is not None
    assert [row.id for row in pending_requests(store, run.id)] == [later.id]


def test_unknown_source_is_refused(store: Store, run: RunRef) -> None:
    with pytest.raises(ValueError, match="source"):
        request_control(store, run.id, {"growth_interval": 5}, requested_by="x", source="web")
    assert control_history(store, run.id) == []
