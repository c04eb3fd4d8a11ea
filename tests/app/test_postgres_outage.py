"""The PostgreSQL server goes away while the service serves it (the tests' own server,
stopped and started again): every request is a 503 with the reason in one line, and the
service recovers by itself once the server is back."""

from __future__ import annotations

import logging

import pytest
from fastapi.testclient import TestClient

from scalewatch.store.engine import Store
from tests._helpers.postgres import Cluster
from tests._helpers.service import add_run, simulate
from tests._helpers.waiting import wait_for

pytestmark = pytest.mark.postgres
READS = ("/api/runs", "/api/runs/{run}", "/api/runs/{run}/steps", "/api/runs/{run}/control")


def test_the_service_answers_503_while_the_server_is_down_and_recovers_by_itself(
    pg_client: TestClient,
    pg_store: Store,
    postgres_cluster: Cluster,
    caplog: pytest.LogCaptureFixture,
) -> None:
    run = add_run(pg_store, simulate(2000, {100, 1500}))
    paths = [path.format(run=run) for path in READS]
    before = {path: pg_client.get(path).json() for path in paths}
    assert pg_client.get("/healthz").json() == {"status": "ok"}
    caplog.set_level(logging.WARNING)
    postgres_cluster.stop(mode="fast")  # a restart: every pooled connection is closed
    try:
        for path in [*paths, "/healthz"]:
            response = pg_client.get(path)
            assert response.status_code == 503, (path, response.text)
            detail = response.json()["detail"]
            assert detail.startswith("the store cannot be used: "), detail
            assert "\n" not in detail and len(detail) < 300, detail
        assert response.json()["status"] == "unavailable"
    finally:
        postgres_cluster.start()
    wait_for(lambda: pg_client.get("/healthz").status_code == 200, 30, "/healthz to recover")
    assert {path: pg_client.get(path).json() for path in paths} == before
    assert "Traceback" not in caplog.text
    assert all(record.exc_info is None for record in caplog.records)
