"""GET, PUT and DELETE /api/runs/{run}/autopilot."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from scalewatch.store.engine import Store
from scalewatch.store.runs import end_run, heartbeat, resume_run
from scalewatch.store.schema import runs
from tests._helpers.service import add_run, auth, simulate

ON = {"enabled": True, "target_skip_rate": 0.01}


@pytest.fixture
def run(store: Store) -> int:
    return add_run(store, simulate(50, {10}))


def test_a_run_without_one_reads_as_off(client: TestClient, run: int) -> None:
    response = client.get(f"/api/runs/{run}/autopilot")
    assert response.status_code == 200
    body = response.json()
    assert (body["run_id"], body["enabled"], body["state"]) == (run, False, "off")
    assert body["decision"] is None and body["target_skip_rate"] is None


def test_put_turns_it_on_and_delete_off_at_once(client: TestClient, run: int) -> None:
    body = {**ON, "min_growth_interval": 4, "max_growth_interval": 4000, "min_scale": 2.0}
    response = client.put(f"/api/runs/{run}/autopilot", json=body, headers=auth())
    assert response.status_code == 200, response.text
    on = response.json()
    assert (on["enabled"], on["state"], on["target_skip_rate"]) == (True, "watching", 0.01)
    assert (on["min_growth_interval"], on["max_growth_interval"], on["min_scale"]) == (4, 4000, 2.0)
    assert client.get(f"/api/runs/{run}/autopilot").json() == on
    off = client.delete(f"/api/runs/{run}/autopilot", headers=auth()).json()
    assert (off["enabled"], off["state"], off["max_growth_interval"]) == (False, "off", 4000)
    assert client.get(f"/api/runs/{run}/autopilot").json()["state"] == "off"


@pytest.mark.parametrize("method", ["put", "delete"])
def test_writes_need_the_token(client: TestClient, run: int, method: str) -> None:
    kwargs = {"json": ON} if method == "put" else {}
    for headers in ({}, auth("wrong")):
        response = client.request(method, f"/api/runs/{run}/autopilot", headers=headers, **kwargs)
        assert response.status_code == 401
    assert client.get(f"/api/runs/{run}/autopilot").json()["state"] == "off"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"enabled": True}, "target_skip_rate"),
        ({**ON, "target_skip_rate": 0}, "target_skip_rate"),
        ({**ON, "enabled": "yes"}, "enabled"),
        ({**ON, "min_growth_interval": 0}, "min_growth_interval"),
        ({**ON, "min_growth_interval": 10, "max_growth_interval": 5}, "min_growth_interval"),
        ({**ON, "min_scale": -1.0}, "min_scale"),
        ({**ON, "growth_interval": 5}, "growth_interval"),
    ],
)
def test_bad_settings_are_422_naming_the_field(
    client: TestClient, run: int, body: dict[str, object], field: str
) -> None:
    response = client.put(f"/api/runs/{run}/autopilot", json=body, headers=auth())
    assert response.status_code == 422
    assert field in {item["loc"][-1] for item in response.json()["detail"]}
    assert client.get(f"/api/runs/{run}/autopilot").json()["state"] == "off"


def test_an_unknown_run_is_404_and_an_ended_one_409(
    client: TestClient, store: Store, run: int
) -> None:
    for method in ("get", "put", "delete"):
        kwargs = {"json": ON} if method == "put" else {}
        response = client.request(
            method, f"/api/runs/{run + 1}/autopilot", headers=auth(), **kwargs
        )
        assert response.status_code == 404, method
    end_run(store, run)
    response = client.put(f"/api/runs/{run}/autopilot", json=ON, headers=auth())
    assert response.status_code == 409


@pytest.mark.parametrize("how", ["finished", "crashed", "silent"])
def test_an_ended_runs_autopilot_reads_as_ended_and_takes_no_put(
    client: TestClient, store: Store, run: int, how: str
) -> None:
    assert client.put(f"/api/runs/{run}/autopilot", json=ON, headers=auth()).status_code == 200
    if how == "silent":  # its heartbeat stopped: a crash nobody reported
        heartbeat(store, run, at=1.0)
    else:
        end_run(store, run, how)
    body = client.get(f"/api/runs/{run}/autopilot").json()
    assert (body["enabled"], body["state"], body["target_skip_rate"]) == (True, "ended", 0.01)
    assert client.put(f"/api/runs/{run}/autopilot", json=ON, headers=auth()).status_code == 409
    assert client.get(f"/api/runs/{run}/autopilot").json() == body
    with store.read() as conn:
        uid = conn.execute(select(runs.c.uid).where(runs.c.id == run)).scalar_one()
    resume_run(store, uid)  # the run trains again: so does its autopilot
    assert client.get(f"/api/runs/{run}/autopilot").json()["state"] == "watching"
