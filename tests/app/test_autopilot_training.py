"""The autopilot against a real scaler: a trainer in this process whose scale overflows
whenever it passes a ceiling, the service (its autopilot loop included) over the same
store."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from scalewatch.app.main import create_app
from scalewatch.app.settings import Settings
from scalewatch.store.control import control_history, control_state
from scalewatch.store.engine import Store
from scalewatch.store.states import RequestSource, RequestStatus
from scalewatch.store.summaries import step_summary
from tests._helpers.ceiling import CeilingTrainer, enable, settled, skip_rate_since_change
from tests._helpers.service import LOCAL, TOKEN, auth

pytestmark = pytest.mark.heavy  # real processes or a real trainer: make check leaves it out


@pytest.fixture
def client(db_url: str, tmp_path: Path, store: Store) -> Iterator[TestClient]:
    settings = Settings(
        db=db_url, token=SecretStr(TOKEN), token_file=tmp_path / "t", autopilot_interval_s=0.02
    )
    with TestClient(create_app(settings), base_url=LOCAL) as test_client:
        yield test_client


@pytest.fixture
def trainer(db_url: str) -> Iterator[CeilingTrainer]:
    job = CeilingTrainer(db_url, ceiling=2.0**10, growth_interval=20)
    try:
        job.run_until(lambda: job.scaler.run_id is not None, timeout_s=30, what="the run")
        yield job
    finally:
        job.close()


def _stored_to(store: Store, run: int) -> int:
    """The run's last stored step (0: none yet)."""
    summary = step_summary(store, run, after=0)
    return 0 if summary is None else summary.last_step


def test_a_run_skipping_5_percent_settles_under_a_1_percent_target(
    client: TestClient, trainer: CeilingTrainer, store: Store
) -> None:
    run = trainer.run_id
    # 500 steps trained and stored: the telemetry writes behind the training thread.
    trainer.run_until(
        lambda: trainer.steps >= 500 and _stored_to(store, run) >= 500,
        timeout_s=60,
        what="500 steps stored",
    )
    before = step_summary(store, run, after=100)
    assert before is not None and 0.04 <= before.skipped / before.steps <= 0.06
    enable(client, run)
    trainer.run_until(lambda: settled(store, run), timeout_s=60, what="a settled skip rate")

    history = control_history(store, run)
    assert history
    for row in history:
        assert (row.source, row.requested_by) == (RequestSource.AUTOPILOT, "autopilot")
        assert row.status is RequestStatus.APPLIED and row.applied_step is not None
        assert row.note and row.reason is None
    assert "above the target 1.00%: growth_interval 20 ->" in str(history[0].note)
    interval = control_state(store, run)["growth_interval"]
    assert interval >= 99 and history[-1].values == {"growth_interval": interval}
    view = client.get(f"/api/runs/{run}/autopilot").json()
    assert view["state"] == "watching" and view["decision"]["action"] in {"hold", "raise"}


def test_the_autopilot_follows_a_ceiling_that_drifts_down_and_up(
    client: TestClient, trainer: CeilingTrainer, store: Store
) -> None:
    run = trainer.run_id
    enable(client, run)
    trainer.run_until(lambda: settled(store, run), timeout_s=60, what="settled at 2**10")
    trainer.ceiling = 2.0**6
    trainer.run_until(
        lambda: trainer.scaler.get_scale() <= 2.0**6, timeout_s=10, what="the scale down"
    )
    down_at = trainer.steps
    trainer.run_until(
        lambda: settled(store, run, after=down_at), timeout_s=60, what="settled at 2**6"
    )
    trainer.ceiling = 2.0**14
    risen_at = trainer.steps

    def lowered() -> bool:
        return any(
            row.values["growth_interval"] < control_at(history, row.id)
            for history in [control_history(store, run)]
            for row in history
            if row.applied_step is not None and row.applied_step > risen_at
        )

    trainer.run_until(
        lambda: lowered() and trainer.scaler.get_scale() >= 2.0**13,
        timeout_s=60,
        what="growth_interval lowered and the scale up to the ceiling",
    )
    trainer.run_until(
        lambda: settled(store, run, after=risen_at), timeout_s=60, what="settled at 2**14"
    )
    assert client.get(f"/api/runs/{run}/autopilot").json()["state"] == "watching"
    assert all(row.source is RequestSource.AUTOPILOT for row in control_history(store, run))


def control_at(history: list, request_id: int) -> int:
    """growth_interval in effect before the request ``request_id`` (20 at the start)."""
    earlier = [
        row for row in history if row.id < request_id and row.status is RequestStatus.APPLIED
    ]
    return int(earlier[-1].values["growth_interval"]) if earlier else 20


def test_with_the_autopilot_off_nothing_changes(
    client: TestClient, trainer: CeilingTrainer, store: Store
) -> None:
    run = trainer.run_id
    # On, then off: a tick between the two must not file a raise, so while it is on its
    # target (50%) is far above the run's ~5%, and its lower bound is the interval in effect.
    body = {"enabled": True, "target_skip_rate": 0.5}
    response = client.put(f"/api/runs/{run}/autopilot", json=body, headers=auth())
    assert response.status_code == 200 and response.json()["state"] == "watching"
    response = client.delete(f"/api/runs/{run}/autopilot", headers=auth())
    assert response.status_code == 200 and response.json()["state"] == "off"
    loop = client.app.state.services.autopilot  # type: ignore[attr-defined]
    ticks = loop.ticks
    trainer.run_until(
        lambda: trainer.steps >= 2000 and loop.ticks >= ticks + 5,
        timeout_s=60,
        what="2000 steps and 5 evaluations",
    )
    assert control_history(store, run) == []
    assert control_state(store, run)["growth_interval"] == 20
    rate, _ = skip_rate_since_change(store, run)
    assert rate > 0.04
