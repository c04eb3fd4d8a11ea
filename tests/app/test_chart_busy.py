"""A chart request that cannot start within ``chart_wait_s`` is answered at once, 503 with
Retry-After, instead of queueing behind the others: a busy service degrades, it does not
make the dashboard wait tens of seconds."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from scalewatch.app.main import create_app
from scalewatch.app.settings import Settings
from scalewatch.store.engine import Store
from tests._helpers.service import LOCAL, TOKEN, add_run, simulate

WAIT_S = 0.3


@pytest.fixture
def busy_client(db_url: str, store: Store) -> Iterator[TestClient]:
    settings = Settings(db=db_url, token=SecretStr(TOKEN), chart_wait_s=WAIT_S)
    with TestClient(create_app(settings), base_url=LOCAL) as client:
        yield client


def _take_every_slot(client: TestClient) -> list[object]:
    """Borrow every chart query slot, as requests in flight would."""
    limiter = client.app.state.services.chart_limiter  # type: ignore[attr-defined]
    holders = [object() for _ in range(int(limiter.total_tokens))]
    for holder in holders:
        client.portal.call(limiter.acquire_on_behalf_of, holder)  # type: ignore[union-attr]
    return holders


def test_a_chart_request_with_every_slot_taken_is_refused_fast_with_retry_after(
    busy_client: TestClient, store: Store
) -> None:
    run = add_run(store, simulate(200, {50}))
    _take_every_slot(busy_client)
    began = time.monotonic()
    response = busy_client.get(f"/api/runs/{run}/steps")
    waited = time.monotonic() - began
    assert response.status_code == 503
    assert response.headers["Retry-After"] == "1"
    assert response.json()["detail"].startswith("busy: no chart query could start within 0.3 s")
    assert WAIT_S <= waited < WAIT_S + 5  # the bound, not the other queries' time


def test_a_slot_freed_within_the_wait_serves_the_chart(
    busy_client: TestClient, store: Store
) -> None:
    run = add_run(store, simulate(200, {50}))
    limiter = busy_client.app.state.services.chart_limiter  # type: ignore[attr-defined]
    holders = _take_every_slot(busy_client)
    busy_client.portal.call(limiter.release_on_behalf_of, holders[0])  # type: ignore[union-attr]
    response = busy_client.get(f"/api/runs/{run}/steps")
    assert response.status_code == 200
    assert response.json()["series"]["overflows"] == [0] * 49 + [1] + [0] * 150  # steps 1-200
    # The request gave its slot back: the one freed is free again.
    assert limiter.borrowed_tokens == limiter.total_tokens - 1


def test_the_busy_answer_is_in_the_openapi_document(busy_client: TestClient) -> None:
    operation = busy_client.get("/openapi.json").json()["paths"]["/api/runs/{run}/steps"]["get"]
    assert "Retry-After" in operation["responses"]["503"]["headers"]
