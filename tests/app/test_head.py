"""HEAD on the GET routes: their status and headers, no body (``curl -I``, health checks)."""

from __future__ import annotations

import pytest

from scaler.store.engine import Store
from tests.app.conftest import TestClient, add_run, simulate


def test_head_answers_as_get_without_the_body(client: TestClient, store: Store) -> None:
    """FastAPI's routes answered GET alone: a HEAD got 405."""
    run = add_run(store, simulate(10, {3}))
    for path in (
        "/healthz",
        "/metrics",
        "/api/runs",
        f"/api/runs/{run}",
        f"/api/runs/{run}/steps",
        f"/api/runs/{run}/overflows",
        f"/api/runs/{run}/control",
        "/api/runs/999",
    ):
        got, head = client.get(path), client.head(path)
        assert head.status_code == got.status_code, path
        assert head.content == b"", path
        for name in ("content-type", "content-length"):
            assert head.headers.get(name) == got.headers.get(name), (path, name)
    assert client.head("/healthz").status_code == 200


@pytest.mark.parametrize("ending", ["export", "stream"])
def test_head_of_an_export_or_a_stream_is_refused(
    client: TestClient, store: Store, ending: str
) -> None:
    """A HEAD would run them whole for nothing: they stay GET-only."""
    run = add_run(store, simulate(10, set()))
    refused = client.head(f"/api/runs/{run}/{ending}")
    assert refused.status_code == 405
    assert refused.headers["allow"] == "GET"
