"""The autopilot's row and the summaries it decides on, on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest

from scalewatch.store import RunRef, Store
from scalewatch.store.autopilot import (
    disable_autopilot,
    enabled_autopilots,
    get_autopilot,
    save_decision,
    set_autopilot,
)
from scalewatch.store.control import mark_applied, request_control
from scalewatch.store.errors import ControlValidationError, RunNotFound, RunNotRunning
from scalewatch.store.runs import end_run, write_steps
from scalewatch.store.states import AutopilotState, RequestSource, RunStatus
from scalewatch.store.summaries import request_summary, step_summary
from tests._helpers.histories import Simulated, above, window
from tests._helpers.stored import CONTROL

ON = {"enabled": True, "target_skip_rate": 0.01}


def test_turned_on_with_defaults_from_the_runs_control(store: Store, run: RunRef) -> None:
    assert get_autopilot(store, run.id) is None
    row = set_autopilot(store, run.id, ON, now=5.0)
    assert (row.enabled, row.state, row.target_skip_rate) == (True, AutopilotState.WATCHING, 0.01)
    assert (row.min_growth_interval, row.max_growth_interval) == (2000, 100_000)
    assert (row.min_scale, row.cooldown_steps, row.max_changes_per_hour) == (None, 500, 6)
    assert (row.decision, row.reason, row.updated_at) == (None, None, 5.0)
    assert get_autopilot(store, run.id) == row
    (listed, facts), *others = enabled_autopilots(store)
    assert others == [] and listed == row
    assert (facts.status, facts.control) == (RunStatus.RUNNING, CONTROL)


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"enabled": True}, "target_skip_rate"),
        ({**ON, "target_skip_rate": 1.0}, "target_skip_rate"),
        ({**ON, "target_skip_rate": float("nan")}, "target_skip_rate"),
        ({**ON, "min_growth_interval": 0}, "min_growth_interval"),
        ({**ON, "max_growth_interval": 2**31}, "max_growth_interval"),
        ({**ON, "min_growth_interval": 50, "max_growth_interval": 40}, "min_growth_interval"),
        ({**ON, "min_scale": 0.0}, "min_scale"),
        ({**ON, "cooldown_steps": 1.5}, "cooldown_steps"),
        ({**ON, "max_changes_per_hour": 3601}, "max_changes_per_hour"),
        ({**ON, "enabled": 1}, "enabled"),
        ({**ON, "growth_interval": 5}, "growth_interval"),
    ],
)
def test_bad_settings_are_refused_naming_the_field(
    store: Store, run: RunRef, values: dict[str, object], field: str
) -> None:
    with pytest.raises(ControlValidationError) as refused:
        set_autopilot(store, run.id, values)
    assert field in refused.value.errors
    assert get_autopilot(store, run.id) is None


def test_a_min_scale_over_the_runs_max_scale_is_refused(store: Store, run: RunRef) -> None:
    request = request_control(store, run.id, {"max_scale": 64.0}, requested_by="me")
    mark_applied(store, request.id, step=1, at=1.0, state={**CONTROL, "max_scale": 64.0}, version=1)
    with pytest.raises(ControlValidationError) as refused:
        set_autopilot(store, run.id, {**ON, "min_scale": 128.0})
    assert refused.value.errors == {"min_scale": "min_scale must be <= max_scale (64.0)"}


def test_only_a_running_run_takes_it_and_an_unknown_one_is_not_found(
    store: Store, run: RunRef
) -> None:
    with pytest.raises(RunNotFound):
        set_autopilot(store, run.id + 1, ON)
    with pytest.raises(RunNotFound):
        disable_autopilot(store, run.id + 1)
    end_run(store, run.id)
    with pytest.raises(RunNotRunning):
        set_autopilot(store, run.id, ON)
    assert set_autopilot(store, run.id, {**ON, "enabled": False}).state is AutopilotState.OFF


def test_off_wins_over_a_decision_saved_after_it(store: Store, run: RunRef) -> None:
    set_autopilot(store, run.id, ON)
    decision = {"action": "hold", "code": "cooldown", "reason": "r", "values": {}}
    assert save_decision(store, run.id, decision=decision, misses=0, helped_below=None)
    off = disable_autopilot(store, run.id)
    assert off is not None and (off.enabled, off.state) == (False, AutopilotState.OFF)
    assert not save_decision(store, run.id, decision={"code": "late"}, misses=0, helped_below=None)
    row = get_autopilot(store, run.id)
    assert row is not None and row.decision == decision and enabled_autopilots(store) == []


def test_giving_up_is_kept_with_its_reason_until_turned_on_again(store: Store, run: RunRef) -> None:
    set_autopilot(store, run.id, ON)
    saved = save_decision(
        store, run.id, decision={"code": "no_effect"}, misses=2, helped_below=None, gave_up="why"
    )
    row = get_autopilot(store, run.id)
    assert saved and row is not None and (row.state, row.reason, row.misses) == (
        AutopilotState.GAVE_UP, "why", 2,
    )  # fmt: skip
    assert enabled_autopilots(store) == []
    again = set_autopilot(store, run.id, ON)
    assert (again.state, again.reason, again.misses) == (AutopilotState.WATCHING, None, 0)


def test_the_step_summary_is_the_windows_worked_out_by_brute_force(
    store: Store, run: RunRef
) -> None:
    sim = Simulated(interval=20)
    records = sim.run(700, above(2.0**10)) + sim.run(300, above(2.0**4))
    write_steps(store, run.id, records)
    for after in (0, 1, 6, 250, 699, 703, 999):
        summary = step_summary(store, run.id, after=after)
        assert summary is not None and summary.last_step == 1000
        expected = window(records[after:], records[after - 1] if after else None)
        overflow_free = 1000 - summary.last_overflow if summary.last_overflow else summary.steps
        assert (
            summary.steps, summary.skipped, summary.streaks, overflow_free,
            summary.scale_max, summary.scale_now,
        ) == (
            expected.steps, expected.skipped, expected.streaks, expected.overflow_free,
            expected.scale_max, expected.scale_now,
        )  # fmt: skip
    assert step_summary(store, run.id, after=1000) is None


def test_the_request_summary_counts_the_autopilots_own(store: Store, run: RunRef) -> None:
    empty = request_summary(store, run.id, since=0)
    assert (empty.changed_at_step, empty.pending, empty.changes_since) == (0, False, 0)
    person = request_control(store, run.id, {"growth_interval": 50}, requested_by="me")
    mark_applied(store, person.id, step=40, at=1.0, state=CONTROL, version=1)
    own = request_control(
        store, run.id, {"growth_interval": 80}, requested_by="autopilot",
        source=RequestSource.AUTOPILOT, note="because",
    )  # fmt: skip
    assert (own.note, own.reason) == ("because", None)
    summary = request_summary(store, run.id, since=0)
    assert (summary.changed_at_step, summary.pending, summary.changes_since) == (40, True, 1)
    mark_applied(store, own.id, step=90, at=2.0, state=CONTROL, version=2)
    later = request_summary(store, run.id, since=own.requested_at + 1)
    assert (later.changed_at_step, later.pending, later.changes_since) == (90, False, 0)
