"""HEAD on the GET routes: their status and headers, no body (``curl -I``, health checks)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from scalewatch.store.engine import Store
from tests._helpers.service import add_run, simulate


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


def test_a_405_names_every_method_its_path_takes(client: TestClient, store: Store) -> None:
    """``PUT /api/runs/6/control`` said ``Allow: GET``: its GET and POST are two routes, and
    Starlette named the first one's methods alone."""
    run = add_run(store, simulate(5, set()))
    paths = client.get("/openapi.json").json()["paths"]
    assert paths
    for template, operations in paths.items():
        path = template.replace("{run}", str(run))
        taken = {method.upper() for method in operations}
        if "GET" in taken and not path.endswith(("/export", "/stream")):
            taken.add("HEAD")
        refused = sorted({"DELETE", "PATCH", "POST", "PUT"} - taken)[0]
        response = client.request(refused, path)
        assert response.status_code == 405, (refused, path)
        assert response.headers["allow"] == ", ".join(sorted(taken)), (refused, path)
    response = client.put(f"/api/runs/{run}/control")
    assert response.headers["allow"] == "GET, HEAD, POST"


def test_a_405_of_the_pages_names_get_and_head(client: TestClient) -> None:
    for path in ("/", "/run.html", "/docs", "/openapi.json", "/vendor/plotly.min.js"):
        response = client.post(path)
        assert response.status_code == 405, path
        assert response.headers["allow"] == "GET, HEAD", path
