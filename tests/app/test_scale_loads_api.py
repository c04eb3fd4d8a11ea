"""GET /api/runs/{run}/scale-loads and the run's counts of them: a viewer's read."""

from __future__ import annotations

from fastapi.testclient import TestClient

from scalewatch.app.middleware.roles import ROUTE_ROLES
from scalewatch.store.engine import Store
from scalewatch.store.identities import Role
from scalewatch.store.scale_loads import ScaleLoad, record_scale_load
from tests._helpers.service import add_run, simulate


def test_the_loads_of_a_run_are_listed_oldest_first_with_their_jump(
    client: TestClient, store: Store
) -> None:
    records = simulate(20, {5})
    run = add_run(store, records)
    other = add_run(store, simulate(3, set()), name="other")
    last = records[-1].scale_after
    record_scale_load(store, run, ScaleLoad(step=20, at=5.0, scale_after=last))
    record_scale_load(store, run, ScaleLoad(step=12, at=6.0, scale_after=2.0**16, from_step=20))
    assert client.get(f"/api/runs/{other}/scale-loads").json() == {"run": other, "items": []}

    body = client.get(f"/api/runs/{run}/scale-loads").json()

    assert body == {
        "run": run,
        "items": [
            {"step": 20, "from_step": 20, "scale_before": last, "scale_after": last,
             "jump": False, "at": 5.0},
            {"step": 12, "from_step": 20, "scale_before": last, "scale_after": 2.0**16,
             "jump": True, "at": 6.0},
        ],
    }  # fmt: skip
    assert last != 2.0**16
    detail = client.get(f"/api/runs/{run}").json()
    assert (detail["scale_loads"], detail["scale_jumps"]) == (2, 1)
    assert client.get(f"/api/runs/{other}").json()["scale_jumps"] == 0


def test_a_run_that_is_not_there_is_404(client: TestClient) -> None:
    response = client.get("/api/runs/999/scale-loads")
    assert response.status_code == 404
    assert response.json() == {"detail": "no run 999"}


def test_the_route_is_a_viewers_read_in_the_api_document(client: TestClient) -> None:
    assert ROUTE_ROLES[("GET", "/api/runs/{run}/scale-loads")] is Role.VIEWER
    operation = client.get("/openapi.json").json()["paths"]["/api/runs/{run}/scale-loads"]["get"]
    schema = operation["responses"]["200"]["content"]["application/json"]["schema"]
    assert schema["$ref"].endswith("/ScaleLoadList")
