"""A token checked once is known for a few seconds: its requests read no store. A token
revoked through the service is refused at once, one revoked or expired elsewhere within
those seconds."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from scalewatch.app.main import create_app
from scalewatch.app.middleware import identity as identity_module
from scalewatch.app.settings import Settings
from scalewatch.store.engine import Store
from scalewatch.store.identities import Role, create_identity, revoke_identity
from tests._helpers.service import TOKEN, add_run, auth, simulate


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each read of the store for a token."""
    seen: list[str] = []
    check = identity_module.check_token

    def counted(store: Store, token: str, **kwargs: object) -> object:
        seen.append(token)
        return check(store, token, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(identity_module, "check_token", counted)
    return seen


@pytest.fixture
def client(db_url: str, store: Store, tmp_path: Path) -> Iterator[TestClient]:
    settings = Settings(
        db=db_url, token=SecretStr(TOKEN), token_file=tmp_path / "t", private_read=True
    )
    with TestClient(create_app(settings), base_url="http://127.0.0.1") as client:
        yield client


def _until_refused(client: TestClient, url: str, token: str, within_s: float) -> float:
    """Seconds until ``token`` is refused on ``url`` (fails after ``within_s``)."""
    began = time.monotonic()
    while client.get(url, headers=auth(token)).status_code != 401:
        assert time.monotonic() - began < within_s, "still accepted"
        time.sleep(0.02)
    return time.monotonic() - began


def test_a_known_token_reads_no_store(client: TestClient, store: Store, checks: list[str]) -> None:
    run = add_run(store, simulate(3, set()))
    viewer = create_identity(store, "v", Role.VIEWER, by="test").token
    for _ in range(5):
        assert client.get(f"/api/runs/{run}/steps", headers=auth(viewer)).status_code == 200
    assert checks == [viewer]


def test_revoked_through_the_service_is_refused_at_once(client: TestClient, store: Store) -> None:
    viewer = create_identity(store, "v", Role.VIEWER, by="test").token
    assert client.get("/api/runs", headers=auth(viewer)).status_code == 200
    assert client.delete("/api/tokens/v", headers=auth()).status_code == 200
    assert client.get("/api/runs", headers=auth(viewer)).status_code == 401


def test_revoked_or_expired_elsewhere_is_refused_within_the_known_seconds(
    client: TestClient, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(identity_module, "KNOWN_S", 0.5)
    viewer = create_identity(store, "v", Role.VIEWER, by="test").token
    assert client.get("/api/runs", headers=auth(viewer)).status_code == 200
    revoke_identity(store, "v", by="cli")  # as `scalewatch tokens revoke` does
    assert client.get("/api/runs", headers=auth(viewer)).status_code == 200  # still known
    assert _until_refused(client, "/api/runs", viewer, within_s=5) < 5

    monkeypatch.setattr(identity_module, "KNOWN_S", 3600.0)
    brief = create_identity(store, "b", Role.VIEWER, by="test", expires_at=time.time() + 0.5).token
    assert client.get("/api/runs", headers=auth(brief)).status_code == 200
    # Its expiry is checked at each use, however long it would be known.
    assert _until_refused(client, "/api/runs", brief, within_s=5) < 5
