"""The alerts table: one firing alert per run and rule, resolved once, paged newest first."""

from __future__ import annotations

from scalewatch.store import RunRef, Store
from scalewatch.store.alerts import Firing, alert_page, fire_alert, firing_alerts, resolve_alert
from scalewatch.store.runs import create_run
from scalewatch.store.states import AlertState


def _firing(run: RunRef, rule: str = "skips", step: int = 10) -> Firing:
    return Firing(run.id, rule, "skip_rate", 0.05, 0.2, "", step, 100.0 + step)


def test_one_alert_of_a_run_and_rule_fires_at_a_time(store: Store, run: RunRef) -> None:
    first = fire_alert(store, _firing(run))
    assert first is not None and first.state is AlertState.FIRING and first.run_name == "test"
    assert fire_alert(store, _firing(run, step=11)) is None  # another service fired it
    other = create_run(store, name="other", world_size=1, config={}, control={})
    assert fire_alert(store, _firing(other)) is not None  # per run
    assert fire_alert(store, _firing(run, rule="streak")) is not None  # and per rule
    resolved = resolve_alert(store, first.id, step=20, at=120.0, value=0.01)
    assert resolved is not None and (resolved.step, resolved.current_value) == (20, 0.01)
    assert resolve_alert(store, first.id, step=21, at=121.0, value=0.0) is None
    again = fire_alert(store, _firing(run, step=30))  # resolved: it may fire again
    assert again is not None and again.id != first.id
    assert [a.id for a in firing_alerts(store, run.id)] == sorted(
        a.id for a in firing_alerts(store) if a.run_id == run.id
    )


def test_alerts_page_newest_first_by_run_and_state(store: Store, run: RunRef) -> None:
    ids = []
    for step in range(5):
        alert = fire_alert(store, _firing(run, step=step))
        assert alert is not None
        ids.append(alert.id)
        if step < 4:
            resolve_alert(store, alert.id, step=step + 1, at=0.0, value=0.0)
    page, before = alert_page(store, run_id=run.id, limit=3)
    assert [a.id for a in page] == ids[:1:-1] and before == ids[2]
    page, before = alert_page(store, run_id=run.id, before=before, limit=3)
    assert [a.id for a in page] == ids[1::-1] and before is None
    assert [a.id for a in alert_page(store, state=AlertState.FIRING)[0]] == ids[4:]
    assert alert_page(store, run_id=run.id + 1)[0] == []
