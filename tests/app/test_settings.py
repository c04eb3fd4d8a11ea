"""The service's settings, as the environment gives them."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from scalewatch.app import Settings, create_app


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("proxy.example", ("proxy.example",)),
        (" proxy.example , Other.example,", ("proxy.example", "Other.example")),
        ("*", ("*",)),
        ("", ()),
    ],
)
def test_allowed_hosts_come_comma_separated_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, text: str, names: tuple[str, ...]
) -> None:
    monkeypatch.setenv("SCALEWATCH_ALLOWED_HOSTS", text)
    assert Settings().allowed_hosts == names


def test_the_app_carries_its_settings_without_dependency_overrides(tmp_path: Path) -> None:
    settings = Settings(db=f"sqlite:///{tmp_path / 'x.db'}", token=SecretStr("t"))
    app = create_app(settings)
    assert app.dependency_overrides == {}
    with TestClient(app, base_url="http://127.0.0.1") as client:
        # The token guard reads the app's own settings: "t" is the token, nothing else.
        wrong = client.post("/api/runs/1/control", json={}, headers={"Authorization": "Bearer x"})
        right = client.post("/api/runs/1/control", json={}, headers={"Authorization": "Bearer t"})
    assert wrong.status_code == 401
    assert right.status_code in (404, 422)
