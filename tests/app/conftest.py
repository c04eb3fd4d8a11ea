from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from scalewatch.app.main import create_app
from scalewatch.app.settings import Settings
from scalewatch.store.engine import Store, open_store
from tests._helpers.postgres import PASSWORD
from tests._helpers.service import LOCAL, TOKEN
from tests._helpers.serving import serve_on_thread


@pytest.fixture
def settings(db_url: str, tmp_path: Path) -> Settings:
    return Settings(db=db_url, token=SecretStr(TOKEN), token_file=tmp_path / "token")


@pytest.fixture
def client(settings: Settings, store: Store) -> Iterator[TestClient]:
    with TestClient(create_app(settings), base_url=LOCAL) as test_client:
        yield test_client


@pytest.fixture
def server(db_url: str, store: Store) -> Iterator[str]:
    """A real uvicorn on a free port of 127.0.0.1, in a thread, stopped after the test."""
    with serve_on_thread(db_url, poll_s=0.05) as url:
        yield url


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def both_backends_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A new store on each backend in turn: a SQLite file, a PostgreSQL database."""
    if request.param == "postgresql":
        url: str = request.getfixturevalue("postgres_url")
        return url
    return f"sqlite:///{tmp_path / 'scalewatch.db'}"


@pytest.fixture
def pg_url(postgres_url: str) -> str:
    return postgres_url.replace("postgres@", f"postgres:{PASSWORD}@", 1)


@pytest.fixture
def pg_store(pg_url: str) -> Iterator[Store]:
    with open_store(pg_url) as opened:
        yield opened


@pytest.fixture
def pg_client(pg_url: str, pg_store: Store, tmp_path: Path) -> Iterator[TestClient]:
    settings = Settings(db=pg_url, token=SecretStr(TOKEN), token_file=tmp_path / "token")
    with TestClient(create_app(settings), base_url=LOCAL) as client:
        yield client
