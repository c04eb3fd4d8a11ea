"""Bound beyond loopback, reads need a viewer; a browser's streams and downloads carry a
short-lived ticket in the URL, never a token."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from scalewatch.app.main import create_app
from scalewatch.app.middleware.identity import TICKET_S, Identity
from scalewatch.app.settings import Settings
from scalewatch.store.engine import Store
from scalewatch.store.identities import Role, create_identity
from scalewatch.store.runs import end_run
from tests._helpers.service import TOKEN, add_run, auth, simulate


def beyond_loopback(db_url: str, tmp_path: Path, **more: object) -> Settings:
    return Settings(
        db=db_url, host="0.0.0.0", token=SecretStr(TOKEN), token_file=tmp_path / "t", **more
    )


@pytest.fixture
def exposed(db_url: str, store: Store, tmp_path: Path) -> Iterator[TestClient]:
    with TestClient(create_app(beyond_loopback(db_url, tmp_path))) as client:
        yield client


def test_reads_need_a_viewer_beyond_loopback(exposed: TestClient, store: Store) -> None:
    run = add_run(store, simulate(5, set()))
    viewer = create_identity(store, "v", Role.VIEWER, by="test").token
    for url in ("/api/runs", f"/api/runs/{run}/steps", f"/api/runs/{run}/export", "/metrics"):
        refused = exposed.get(url)
        assert refused.status_code == 401, url
        assert refused.json()["detail"].startswith("a bearer token is required")
        assert exposed.get(url, headers=auth(viewer)).status_code == 200, url
    assert exposed.get("/healthz").status_code == 200  # probes need nothing
    assert exposed.get("/").status_code == 200  # the dashboard's page holds no data
    assert exposed.get("/api/whoami").status_code == 401


def test_public_read_opens_reads_only(db_url: str, store: Store, tmp_path: Path) -> None:
    run = add_run(store, simulate(5, set()))
    settings = beyond_loopback(db_url, tmp_path, public_read=True)
    with TestClient(create_app(settings)) as client:
        assert client.get(f"/api/runs/{run}/steps").status_code == 200
        wrote = client.post(f"/api/runs/{run}/control", json={"growth_interval": 8})
        assert wrote.status_code == 401


def test_a_stream_and_an_export_open_with_a_ticket(exposed: TestClient, store: Store) -> None:
    run = add_run(store, simulate(3, set()))
    end_run(store, run)  # the stream ends by itself
    viewer = create_identity(store, "v", Role.VIEWER, by="test").token
    assert exposed.get(f"/api/runs/{run}/stream").status_code == 401
    issued = exposed.post("/api/tickets", headers=auth(viewer)).json()
    assert issued["expires_in"] == TICKET_S
    ticket = issued["ticket"]
    assert viewer not in ticket and viewer.split("_", 2)[2] not in ticket
    streamed = exposed.get(f"/api/runs/{run}/stream?after=0&ticket={ticket}")
    assert streamed.status_code == 200 and "event: end" in streamed.text
    exported = exposed.get(f"/api/runs/{run}/export?format=jsonl&ticket={ticket}")
    assert exported.status_code == 200 and len(exported.text.splitlines()) == 3
    # A ticket opens streams and exports alone, and a forged or stale one nothing.
    assert exposed.get(f"/api/runs?ticket={ticket}").status_code == 401
    forged = ticket[:-2] + ("AA" if not ticket.endswith("AA") else "BB")
    assert exposed.get(f"/api/runs/{run}/stream?ticket={forged}").status_code == 401
    stale = exposed.app.state.services.tickets.issue(Identity("v", Role.VIEWER, "token"), now=0.0)  # type: ignore[attr-defined]
    refused = exposed.get(f"/api/runs/{run}/export?ticket={stale}")
    assert refused.status_code == 401 and "ticket" in refused.json()["detail"]


def test_private_read_guards_reads_on_loopback_too(
    db_url: str, store: Store, tmp_path: Path
) -> None:
    """A host whose other users reach its loopback: reads need a viewer there as well."""
    run = add_run(store, simulate(3, set()))
    viewer = create_identity(store, "v", Role.VIEWER, by="test").token
    settings = Settings(
        db=db_url, token=SecretStr(TOKEN), token_file=tmp_path / "t", private_read=True
    )
    with TestClient(create_app(settings), base_url="http://127.0.0.1") as client:
        refused = client.get(f"/api/runs/{run}/steps")
        assert refused.status_code == 401
        assert refused.json()["detail"].startswith("a bearer token is required")
        assert client.get(f"/api/runs/{run}/steps", headers=auth(viewer)).status_code == 200
        assert client.get("/healthz").status_code == 200
        # The dashboard asks for a token, and once given one is told reads are not open.
        assert client.get("/api/whoami").status_code == 401
        who = client.get("/api/whoami", headers=auth(viewer)).json()
        assert (who["name"], who["reads_open"]) == ("v", False)
