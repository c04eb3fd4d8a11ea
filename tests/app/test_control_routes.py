from __future__ import annotations

from fastapi.testclient import TestClient

from scalewatch.store.control_rules import RULES
from scalewatch.store.engine import Store
from scalewatch.store.runs import end_run
from tests._helpers.service import TOKEN, add_run, auth, simulate


def test_post_control_answers_202_with_the_pending_request(
    client: TestClient, store: Store
) -> None:
    run = add_run(store, simulate(10, set()))

    response = client.post(
        f"/api/runs/{run}/control", json={"growth_interval": 500}, headers=auth()
    )

    assert response.status_code == 202
    body = response.json()
    assert body["status"] == "pending"
    assert body["values"] == {"growth_interval": 500}
    assert body["run_id"] == run
    assert body["source"] == "api"
    history = client.get(f"/api/runs/{run}/control").json()["history"]
    assert [row["id"] for row in history] == [body["id"]]


def test_get_control_shows_the_values_in_effect(client: TestClient, store: Store) -> None:
    records = simulate(10, set())
    run = add_run(store, records)

    body = client.get(f"/api/runs/{run}/control").json()

    assert body["state"]["growth_interval"] == 4
    assert body["state"]["scale"] == records[-1].scale_after
    assert body["state"]["version"] == 0
    assert body["history"] == []


def test_control_needs_the_token(client: TestClient, store: Store) -> None:
    run = add_run(store, simulate(10, set()))
    wrong_same_length = "x" * len(TOKEN)
    for headers in (
        {},
        auth(wrong_same_length),
        auth(TOKEN + "x"),
        {"Authorization": TOKEN},
        {"Authorization": f"Basic {TOKEN}"},
    ):
        response = client.post(f"/api/runs/{run}/control", json={"scale": 2.0}, headers=headers)
        assert response.status_code == 401, headers
        assert response.headers["www-authenticate"] == "Bearer"
        assert TOKEN not in response.text
    assert client.get(f"/api/runs/{run}/control").json()["history"] == []


def test_a_body_is_not_judged_before_the_token(client: TestClient, store: Store) -> None:
    """FastAPI parses the body before it checks the token: broken JSON got a 422 with the
    parser's detail, to a client without the token."""
    run = add_run(store, simulate(10, set()))
    url = f"/api/runs/{run}/control"
    json_type = {"Content-Type": "application/json"}
    not_utf8 = b'{"growth_interval": "\xc3\x28"}'  # FastAPI's 400
    for body in (b"{", b'{"growth_interval": 0}', not_utf8, b"1" * 5000):
        refused = client.post(url, content=body, headers=json_type)
        assert refused.status_code == 401, body
        assert refused.headers["www-authenticate"] == "Bearer"
        assert "body" not in refused.text
    judged = client.post(url, content=b"{", headers={**auth(), **json_type})
    assert judged.status_code == 422
    assert judged.json()["detail"][0]["type"] == "json_invalid"
    assert client.post(url, content=not_utf8, headers={**auth(), **json_type}).status_code == 400


def test_a_lone_surrogate_in_a_body_is_a_422_not_a_500(client: TestClient, store: Store) -> None:
    """The validation error echoes the input, and UTF-8 cannot encode a lone surrogate:
    the error handler failed (a 500 in plain text, the connection dropped)."""
    run = add_run(store, simulate(10, set()))
    headers = {**auth(), "Content-Type": "application/json"}
    for body in (b'{"\\ud800": 1}', b'{"growth_interval": "\\ud800"}', b'"\\ud83d"'):
        response = client.post(f"/api/runs/{run}/control", content=body, headers=headers)
        assert response.status_code == 422, body
        assert "\\ud8" in response.text  # the surrogate, escaped
    assert client.get(f"/api/runs/{run}/control").json()["history"] == []


def test_invalid_values_are_422_naming_the_field(client: TestClient, store: Store) -> None:
    run = add_run(store, simulate(10, set()))
    for body, field in (
        ({"growth_interval": 0}, "growth_interval"),
        ({"growth_factor": 1.0}, "growth_factor"),
        ({"backoff_factor": 1.5}, "backoff_factor"),
        ({"backoff_factor": 1e-300}, "backoff_factor"),  # backs off a scale of 1 to 0
        ({"growth_interval": True}, "growth_interval"),
        ({"growth_interval": 1.5}, "growth_interval"),
        ({"min_scale": 10.0, "max_scale": 1.0}, None),
        ({"unknown": 1}, "unknown"),
    ):
        response = client.post(f"/api/runs/{run}/control", json=body, headers=auth())
        assert response.status_code == 422, body
        detail = response.json()["detail"]
        if field is not None:
            assert any(field in error["loc"] for error in detail), detail
    assert client.post(f"/api/runs/{run}/control", json={}, headers=auth()).status_code == 422
    assert client.get(f"/api/runs/{run}/control").json()["history"] == []


def test_a_value_of_the_wrong_type_is_one_error_in_the_rules_words(
    client: TestClient, store: Store
) -> None:
    """pydantic named each member of the union it tried: growth_interval.int and
    growth_interval.float, two raw errors for one wrong value."""
    run = add_run(store, simulate(10, set()))
    for body, field in (
        ({"growth_interval": "500"}, "growth_interval"),
        ({"growth_interval": True}, "growth_interval"),
        ({"hysteresis": [2]}, "hysteresis"),
        ({"growth_factor": "2"}, "growth_factor"),
    ):
        response = client.post(f"/api/runs/{run}/control", json=body, headers=auth())
        assert response.status_code == 422, body
        detail = response.json()["detail"]
        assert [(error["loc"], error["msg"]) for error in detail] == [
            (["body", field], RULES[field])
        ], body
    assert client.get(f"/api/runs/{run}/control").json()["history"] == []


def test_control_of_a_finished_or_unknown_run(client: TestClient, store: Store) -> None:
    run = add_run(store, simulate(10, set()))
    end_run(store, run)

    finished = client.post(f"/api/runs/{run}/control", json={"scale": 2.0}, headers=auth())
    unknown = client.post("/api/runs/999/control", json={"scale": 2.0}, headers=auth())

    assert finished.status_code == 409
    assert "finished" in finished.json()["detail"]
    assert unknown.status_code == 404


def test_the_history_comes_in_pages(client: TestClient, store: Store) -> None:
    """It came whole, however long (an autopilot files many requests)."""
    from scalewatch.store.control import request_control

    run = add_run(store, simulate(10, set()))
    ids = [
        request_control(store, run, {"growth_interval": 10 + i}, requested_by="t").id
        for i in range(7)
    ]
    url = f"/api/runs/{run}/control"
    first = client.get(url, params={"limit": 3}).json()
    assert [row["id"] for row in first["history"]] == ids[4:]
    assert first["next"] == ids[4] and first["state"]["growth_interval"] == 4
    second = client.get(url, params={"limit": 3, "before": first["next"]}).json()
    assert [row["id"] for row in second["history"]] == ids[1:4]
    last = client.get(url, params={"limit": 3, "before": second["next"]}).json()
    assert [row["id"] for row in last["history"]] == ids[:1] and last["next"] is None
    whole = client.get(url).json()
    assert [row["id"] for row in whole["history"]] == ids and whole["next"] is None
    assert client.get(url, params={"limit": 1001}).status_code == 422


def test_a_body_not_sent_as_json_is_told_to_be(client: TestClient, store: Store) -> None:
    """``curl -d`` sends a form: the 422 said the body was no 'valid dictionary'."""
    run = add_run(store, simulate(10, set()))
    url = f"/api/runs/{run}/control"
    for content_type in ("application/x-www-form-urlencoded", "text/plain", None):
        headers = {**auth(), **({"Content-Type": content_type} if content_type else {})}
        response = client.post(url, content=b'{"growth_interval": 500}', headers=headers)
        assert response.status_code == 422, content_type
        (error,) = response.json()["detail"]
        assert error["loc"] == ["body"] and error["type"] == "content_type"
        assert "Content-Type: application/json" in error["msg"] and "\n" not in error["msg"]
    wrong_token = client.post(url, content=b"growth_interval=5", headers=auth("x" * 20))
    assert wrong_token.status_code == 401
    assert client.get(url).json()["history"] == []
    typed = {**auth(), "Content-Type": "application/json; charset=utf-8"}
    assert client.post(url, content=b'{"growth_interval": 500}', headers=typed).status_code == 202
