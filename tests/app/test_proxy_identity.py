"""Behind an authenticating proxy (oauth2-proxy): from the trusted addresses only, its
header names the user; from anywhere else the header is ignored."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from scalewatch.app.main import create_app
from scalewatch.app.settings import Settings
from scalewatch.store.engine import Store
from scalewatch.store.identities import (
    Role,
    create_identity,
    identity_events_page,
    list_identities,
    revoke_identity,
)
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
        assert me["name"] == "proxy:ada@example.org" and me["role"] == "viewer"
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
    assert (row.name, row.has_token, row.created_by) == ("proxy:ada@example.org", False, "proxy")
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
        assert wrote.status_code == 202 and wrote.json()["requested_by"] == "proxy:bob"
        revoke_identity(store, "proxy:bob", by="test")
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


def test_a_proxy_user_is_no_token_identity_and_its_role_is_for_its_request(
    db_url: str, store: Store, tmp_path: Path
) -> None:
    """A proxy user named like a token identity ('t_viewer') with the role header 'admin'
    changed that token identity's role for good; one named 'admin' was audited as the
    bootstrap admin."""
    made = create_identity(store, "t_viewer", Role.VIEWER, by="test")
    run = add_run(store, simulate(5, set()))
    with proxied(db_url, tmp_path, "10.1.0.9", role_header=True) as client:
        me = client.get("/api/whoami", headers={USER: "t_viewer", ROLE: "admin"}).json()
        assert (me["name"], me["role"], me["source"]) == ("proxy:t_viewer", "admin", "proxy")
        # The token identity of that name is untouched: still a viewer.
        assert client.get("/api/tokens", headers=auth(made.token)).status_code == 403
        # Without the role header the same proxy user is what its record says: a viewer.
        assert client.get("/api/whoami", headers={USER: "t_viewer"}).json()["role"] == "viewer"
        wrote = client.post(
            f"/api/runs/{run}/control",
            json={"growth_interval": 8},
            headers={USER: "admin", ROLE: "operator"},
        )
        assert wrote.json()["requested_by"] == "proxy:admin"
    roles = {row.name: (row.role, row.has_token) for row in list_identities(store)}
    assert roles == {
        "t_viewer": (Role.VIEWER, True),
        "proxy:t_viewer": (Role.VIEWER, False),
        "proxy:admin": (Role.VIEWER, False),
    }
    events = [(e.name, e.action, e.by) for e in identity_events_page(store)]
    assert ("proxy:t_viewer", "created", "proxy") in events and len(events) == 3


@pytest.mark.parametrize(
    "name", ["x" * 201, "<script>", "ops/team lead", "ada\tlovelace", "-ada", "_ada", ""]
)
def test_a_proxy_user_name_passes_the_name_rules(
    db_url: str, store: Store, tmp_path: Path, name: str
) -> None:
    with proxied(db_url, tmp_path, "10.1.0.9") as client:
        answer = client.get("/api/whoami", headers={USER: name or " "})
    if name:
        assert answer.status_code == 400
        assert answer.json()["detail"].startswith(f"the proxy's {USER} header names no user")
    else:
        assert answer.status_code == 401  # an empty header names nobody: no credentials
    assert list_identities(store) == []


def test_a_proxy_user_name_in_utf8_is_kept_as_sent(
    db_url: str, store: Store, tmp_path: Path
) -> None:
    """'ü' came back as 'Ã¼': the header's bytes were read as Latin-1."""
    with proxied(db_url, tmp_path, "10.1.0.9") as client:
        me = client.get("/api/whoami", headers={USER: "jürgen".encode()})
        assert me.json()["name"] == "proxy:jürgen"
        # The admin can name it to revoke it.
        gone = client.delete("/api/tokens/proxy:jürgen", headers=auth())
        assert gone.status_code == 200 and gone.json()["revoked_at"] is not None
    assert [row.name for row in list_identities(store)] == ["proxy:jürgen"]


def test_a_revoked_proxy_user_locks_out_no_other_user(
    db_url: str, store: Store, tmp_path: Path
) -> None:
    """21 requests as a revoked 'eve' made every proxy user (and every token sent through
    the proxy) 429 for a minute: the failures were counted against the proxy's address."""
    with proxied(db_url, tmp_path, "10.1.0.9", role_header=True) as client:
        client.get("/api/whoami", headers={USER: "eve"})
        revoke_identity(store, "proxy:eve", by="test")
        codes = {client.get("/api/runs", headers={USER: "eve"}).status_code for _ in range(30)}
        assert codes == {401}
        others = [
            client.get("/api/whoami", headers={USER: "eve2", ROLE: "admin"}).status_code,
            client.get("/api/whoami", headers=auth()).status_code,
        ]
        assert others == [200, 200]
