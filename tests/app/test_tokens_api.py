from __future__ import annotations

import time

from fastapi.testclient import TestClient

from scalewatch.store.engine import Store
from scalewatch.store.identities import identity_events_page
from tests._helpers.service import TOKEN, add_run, auth, simulate


def test_an_admin_creates_lists_and_revokes_identities(client: TestClient, store: Store) -> None:
    made = client.post("/api/tokens", json={"name": "ada", "role": "operator"}, headers=auth())
    assert made.status_code == 201
    token = made.json()["token"]
    assert made.json()["identity"]["role"] == "operator"
    assert made.json()["identity"]["created_by"] == "admin"  # the bootstrap admin

    me = client.get("/api/whoami", headers=auth(token)).json()
    assert me == {"name": "ada", "role": "operator", "source": "token", "reads_open": True}
    listed = client.get("/api/tokens", headers=auth())
    assert [row["name"] for row in listed.json()] == ["ada"]
    assert listed.json()[0]["last_used_at"] is not None
    assert token not in listed.text and token.split("_", 2)[2] not in listed.text

    again = client.post("/api/tokens", json={"name": "ada", "role": "admin"}, headers=auth())
    assert again.status_code == 409

    revoked = client.delete("/api/tokens/ada", headers=auth())
    assert revoked.status_code == 200 and revoked.json()["revoked_at"] is not None
    refused = client.get("/api/whoami", headers=auth(token))
    assert refused.status_code == 401
    assert refused.json() == {"detail": "the bearer token was revoked"}
    assert client.delete("/api/tokens/nobody", headers=auth()).status_code == 404
    events = [(e.name, e.action, e.by) for e in identity_events_page(store)]
    assert events == [("ada", "created", "admin"), ("ada", "revoked", "admin")]


def test_a_token_made_to_expire_expires(client: TestClient, store: Store) -> None:
    made = client.post(
        "/api/tokens", json={"name": "tmp", "role": "viewer", "expires": "30d"}, headers=auth()
    ).json()
    in_30_days = time.time() + 30 * 86400
    assert abs(made["identity"]["expires_at"] - in_30_days) < 60
    bad = client.post(
        "/api/tokens", json={"name": "x", "role": "viewer", "expires": "soon"}, headers=auth()
    )
    assert bad.status_code == 422
    nobody = client.post("/api/tokens", json={"name": "x", "role": "root"}, headers=auth())
    assert nobody.status_code == 422


def test_only_an_admin_manages_identities(client: TestClient) -> None:
    operator = client.post(
        "/api/tokens", json={"name": "op", "role": "operator"}, headers=auth()
    ).json()["token"]
    refused = client.post(
        "/api/tokens", json={"name": "me", "role": "admin"}, headers=auth(operator)
    )
    assert refused.status_code == 403
    assert refused.json() == {"detail": "'op' has the role operator: this needs admin"}


def test_the_audit_trail_names_who_asked(client: TestClient, store: Store) -> None:
    run = add_run(store, simulate(10, set()))
    token = client.post(
        "/api/tokens", json={"name": "ada", "role": "operator"}, headers=auth()
    ).json()["token"]
    client.post(f"/api/runs/{run}/control", json={"growth_interval": 8}, headers=auth(token))
    client.post(f"/api/runs/{run}/control", json={"growth_interval": 9}, headers=auth(TOKEN))
    history = client.get(f"/api/runs/{run}/control").json()["history"]
    assert [(h["requested_by"], h["source"]) for h in history] == [("ada", "api"), ("admin", "api")]


def test_whoami_of_an_anonymous_reader(client: TestClient) -> None:
    me = client.get("/api/whoami").json()
    assert me == {"name": None, "role": None, "source": "anonymous", "reads_open": True}
