from __future__ import annotations

import re

from fastapi.testclient import TestClient

from scalewatch.store.engine import Store
from scalewatch.store.runs import end_run
from tests._helpers.service import add_run, simulate


def test_list_runs_summarises_each_run(client: TestClient, store: Store) -> None:
    first = add_run(store, simulate(100, {10, 20}), name="first")
    second = add_run(store, simulate(50, set()), name="second")
    end_run(store, first)

    body = client.get("/api/runs").json()

    by_id = {run["id"]: run for run in body["runs"]}
    assert set(by_id) == {first, second}
    assert by_id[first]["status"] == "finished"
    assert by_id[first]["steps"] == 100
    assert by_id[first]["overflows"] == 2
    assert by_id[first]["skipped_rate"] == 0.02
    assert by_id[first]["ended_at"] is not None
    assert by_id[second]["status"] == "running"
    assert by_id[second]["world_size"] == 2
    assert by_id[second]["scale"] == simulate(50, set())[-1].scale_after
    assert set(by_id[second]) == {
        "id", "name", "status", "world_size", "steps", "scale", "overflows", "skipped_rate",
        "last_heartbeat", "started_at", "ended_at",
    }  # fmt: skip


def test_run_detail_has_configuration(client: TestClient, store: Store) -> None:
    run = add_run(store, simulate(10, set()))

    body = client.get(f"/api/runs/{run}").json()

    assert body["id"] == run
    assert body["config"] == {"init_scale": 2.0**16}
    assert body["control"]["growth_interval"] == 4
    assert body["control_version"] == 0
    assert body["dropped"] == 0
    assert {"torch_version", "host", "pid"} <= set(body)


def test_run_detail_says_where_the_scale_is_heading(client: TestClient, store: Store) -> None:
    collapsing = add_run(store, simulate(1200, set(range(100, 1201, 100)), interval=10**9))
    healthy = add_run(store, simulate(200, {50}, interval=100), name="healthy")
    forecast = client.get(f"/api/runs/{collapsing}").json()["forecast"]
    assert forecast == {
        "trend": "falling",
        "text": "halving every ~100 steps: 1.0 in ~400 steps at this rate",
        "first_step": 1,
        "last_step": 1200,
        "scale": 16.0,
        "floor": 1.0,
        "steps_to_floor": 400,
        "halving_steps": 100.0,
    }
    steady = client.get(f"/api/runs/{healthy}").json()["forecast"]
    assert (steady["trend"], steady["text"]) == ("steady", "steady near 2^16")
    assert client.get(f"/api/runs/{add_run(store, [], name='empty')}").json()["forecast"] is None


def test_a_silent_running_run_reads_as_crashed(client: TestClient, store: Store) -> None:
    run = add_run(store, simulate(10, set()))
    with store.write() as conn:
        conn.exec_driver_sql("UPDATE runs SET heartbeat_at = heartbeat_at - 60")

    assert client.get(f"/api/runs/{run}").json()["status"] == "crashed"


def test_unknown_run_is_404_json(client: TestClient) -> None:
    for path in ("", "/steps", "/overflows", "/control", "/export", "/stream"):
        response = client.get(f"/api/runs/999{path}")
        assert response.status_code == 404, path
        assert response.json() == {"detail": "no run 999"}


def test_bad_parameters_are_422_json(client: TestClient, store: Store) -> None:
    run = add_run(store, simulate(10, set()))
    for query in ("max_points=1", "max_points=10001", "start=-1", "end=x"):
        response = client.get(f"/api/runs/{run}/steps?{query}")
        assert response.status_code == 422, query
        assert isinstance(response.json()["detail"], list)
    assert client.get("/api/runs/abc").status_code == 422


def test_health_and_unknown_paths(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    response = client.get("/api/nothing-here")
    assert response.status_code == 404
    assert response.json() == {"detail": "Not Found"}


def test_dashboard_and_plotly_are_served(client: TestClient) -> None:
    index = client.get("/")
    assert index.status_code == 200
    assert "text/html" in index.headers["content-type"]
    plotly = client.get("/vendor/plotly.min.js")
    assert plotly.status_code == 200
    assert "javascript" in plotly.headers["content-type"]
    assert len(plotly.content) > 1_000_000


def test_the_dashboard_serves_browser_files_only(client: TestClient) -> None:
    for path in ("/run.html", "/style.css", "/runs.js"):
        assert client.get(path).status_code == 200, path
    for path in ("/__init__.py", "/__pycache__/__init__.cpython-311.pyc", "/runs.js.map"):
        assert client.get(path).status_code == 404, path


def test_a_method_an_api_route_does_not_take_is_its_405(client: TestClient) -> None:
    """Not the static files' answer (which named their own methods, GET and HEAD)."""
    for method, path in (
        ("PUT", "/api/runs"),
        ("HEAD", "/api/runs/1/stream"),
        ("PATCH", "/api/runs/1"),
    ):
        response = client.request(method, path)
        assert response.status_code == 405, (method, path)
        assert response.headers["allow"] == ("GET" if path.endswith("/stream") else "GET, HEAD")
    response = client.request("DELETE", "/api/runs/1/control")
    assert response.status_code == 405
    assert response.headers["allow"] == "GET, HEAD, POST"


def test_the_api_docs_page_loads_nothing_from_the_internet(client: TestClient) -> None:
    page = client.get("/docs")
    assert page.status_code == 200 and "swagger" in page.text.lower()
    assert re.findall(r"https?://", page.text) == []
    assets = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert len(assets) == 4  # Swagger UI's script and stylesheet, an icon, web/docs.js
    for asset in assets:
        response = client.get(asset)
        assert response.status_code == 200 and len(response.content) > 100, asset
    assert 'data-openapi-url="/openapi.json"' in page.text
    assert client.get("/openapi.json").status_code == 200


def test_the_api_docs_page_is_swagger_ui_5_which_reads_openapi_3_1(client: TestClient) -> None:
    """Swagger UI 4 said "Unable to render this definition" of FastAPI's OpenAPI 3.1."""
    assert client.get("/openapi.json").json()["openapi"].startswith("3.1.")
    bundle = client.get("/vendor/swagger-ui/swagger-ui-bundle.js").text
    version = re.search(r'PACKAGE_VERSION:"(\d+)\.(\d+)\.(\d+)"', bundle)
    assert version is not None and int(version.group(1)) >= 5, version


def test_openapi_lists_the_api(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    assert {
        "/api/runs", "/api/runs/{run}", "/api/runs/{run}/steps", "/api/runs/{run}/overflows",
        "/api/runs/{run}/stream", "/api/runs/{run}/control", "/api/runs/{run}/export",
        "/metrics", "/healthz",
    } <= set(paths)  # fmt: skip


def test_an_end_below_the_start_is_an_empty_range(client: TestClient, store: Store) -> None:
    """It was a 422 that the OpenAPI document could not express (valid parameters refused)."""
    run = add_run(store, simulate(10, {3}))
    steps = client.get(f"/api/runs/{run}/steps?start=5&end=4")
    assert steps.status_code == 200
    assert steps.json()["series"]["first_step"] == [] and steps.json()["start"] == 5
    for what in ("steps", "overflows"):
        export = client.get(f"/api/runs/{run}/export?what={what}&start=3&end=1&format=jsonl")
        assert export.status_code == 200 and export.text == "", what


def test_a_chart_asked_again_reads_only_its_newest_buckets(
    client: TestClient, store: Store
) -> None:
    run = add_run(store, simulate(3_000, {10, 2_000}))
    charts = client.app.state.services.charts  # type: ignore[attr-defined]
    first = client.get(f"/api/runs/{run}/steps?max_points=200").json()
    read = charts.read_buckets
    again = client.get(f"/api/runs/{run}/steps?max_points=200").json()
    assert again == first and first["bucket_width"] > 1
    assert charts.read_buckets - read <= 1 and charts.kept_buckets >= len(first["series"]["n"]) - 1
