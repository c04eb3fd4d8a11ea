"""Behind an authenticating proxy (oauth2-proxy): from the trusted addresses only, its
header names the user; from anywhere else the header is ignored."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient
from pydantic import SecretStr

from scalewatch.app.main import create_app
from scalewatch.app.settings import Settings
from scalewatch.store.engine import Store
from scalewatch.store.identities import identity_events_page, list_identities, revoke_identity
from tests._helpers.service import TOKEN, add_run, auth, simulate

USER, ROLE = "X-Forwarded-User", "X-Forwarded-Role"


def proxied(db_url: str, tmp_path: Path, client: str, *, role_header: bool = False) -> TestClient:
    settings = Settings(
        db=db_url,
        host="0.0.0.0",
        token=SecretStr(TOKEN),
        token_file=tmp_path / "t",
        trust_proxy="10.1.0.0/16, fd00::/8",
        proxy_user_header=USER,
        proxy_role_header=ROLE if role_header else None,
    )
    return TestClient(create_app(settings), client=(client, 40000))


def test_the_trusted_proxy_names_a_viewer(db_url: str, store: Store, tmp_path: Path) -> None:
    run = add_run(store, simulate(5, set()))
    with proxied(db_url, tmp_path, "10.1.2.3") as client:
        me = client.get("/api/whoami", headers={USER: "ada@example.org"}).json()
        assert me["name"] == "ada@example.org" and me["role"] == "viewer"
        assert me["source"] == "proxy"
        assert client.get(f"/api/runs/{run}/steps", headers={USER: "ada@example.org"}).is_success
        wrote = client.post(
            f"/api/runs/{run}/control",
            json={"growth_interval": 8},
            headers={USER: "ada@example.org"},
        )
        assert wrote.status_code == 403
        assert client.get("/api/runs").status_code == 401  # no header: nobody
    [row] = list_identities(store)
    assert (row.name, row.has_token, row.created_by) == ("ada@example.org", False, "proxy")
    assert [e.action for e in identity_events_page(store)] == ["created"]


def test_a_role_header_maps_the_role_and_the_audit_names_the_user(
    db_url: str, store: Store, tmp_path: Path
) -> None:
    run = add_run(store, simulate(5, set()))
    headers = {USER: "bob", ROLE: "operator"}
    with proxied(db_url, tmp_path, "10.1.0.9", role_header=True) as client:
        wrote = client.post(
            f"/api/runs/{run}/control", json={"growth_interval": 8}, headers=headers
        )
        assert wrote.status_code == 202 and wrote.json()["requested_by"] == "bob"
        revoke_identity(store, "bob", by="test")
        assert client.get("/api/runs", headers=headers).status_code == 401


def test_the_header_from_elsewhere_is_ignored(db_url: str, store: Store, tmp_path: Path) -> None:
    run = add_run(store, simulate(5, set()))
    with proxied(db_url, tmp_path, "192.168.7.7", role_header=True) as client:
        forged = {USER: "mallory", ROLE: "admin"}
        assert client.get("/api/runs", headers=forged).status_code == 401
        wrote = client.post(f"/api/runs/{run}/control", json={"growth_interval": 8}, headers=forged)
        assert wrote.status_code == 401
        # A token still works from anywhere.
        assert client.get("/api/whoami", headers={**forged, **auth()}).json()["name"] == "admin"
        assert client.get("/api/whoami", headers=auth()).json()["source"] == "bootstrap"
    assert list_identities(store) == []
