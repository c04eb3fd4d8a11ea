"""GET /api/runs/{run}/spikes, and the spikes counted in the run's detail."""

from __future__ import annotations

import dataclasses

from fastapi.testclient import TestClient

from scalewatch.store import Store
from tests._helpers.service import add_run, simulate


def test_the_spikes_are_listed_with_their_parameter_norms_and_counted(
    client: TestClient, store: Store
) -> None:
    records = [
        dataclasses.replace(
            r,
            loss=12.0 if r.step == 120 else 2.0 + 0.01 * (r.step % 5),
            grad_norm=None if r.overflow else 1.0 + 0.02 * (r.step % 3),
            param_norms=(("head.weight", 0.75), ("encoder.bias", 0.5)),
        )
        for r in simulate(200, {60})
    ]
    run = add_run(store, records)

    body = client.get(f"/api/runs/{run}/spikes").json()
    assert body == {
        "run": run,
        "items": [
            {
                "step": 120,
                "what": "loss",
                "value": 12.0,
                "z": body["items"][0]["z"],
                "params": [
                    {"name": "head.weight", "norm": 0.75},
                    {"name": "encoder.bias", "norm": 0.5},
                ],
            }
        ],
    }
    assert body["items"][0]["z"] > 6
    assert client.get(f"/api/runs/{run}/spikes?start=121").json()["items"] == []
    assert client.get(f"/api/runs/{run}").json()["spikes"] == {"loss": 1, "grad_norm": 0}
    assert client.get("/api/runs/999/spikes").status_code == 404
    assert client.get(f"/api/runs/{run}/spikes?limit=0").status_code == 422
