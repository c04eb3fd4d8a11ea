from __future__ import annotations

from pathlib import Path

import pytest

from scalewatch.store import RunRef, Store
from scalewatch.store.runs import create_run
from tests._helpers.stored import CONTROL

BACKENDS = ("sqlite", "postgresql")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Every test of a ``db_url`` (or a ``store``) runs on both backends, but those marked
    ``sqlite_only`` (WAL, pragmas, file locks: what PostgreSQL has no counterpart of)."""
    if "backend" not in metafunc.fixturenames:
        return
    only = metafunc.definition.get_closest_marker("sqlite_only") is not None
    backends = [
        pytest.param(b, marks=[pytest.mark.postgres] if b == "postgresql" else [])
        for b in BACKENDS
        if not only or b == "sqlite"
    ]
    metafunc.parametrize("backend", backends, indirect=True)


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture
def db_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A new, empty store of the test's backend: a SQLite file in the test's directory, or
    a database of its own on the session's PostgreSQL server."""
    if backend == "postgresql":
        url: str = request.getfixturevalue("postgres_url")
        return url
    return f"sqlite:///{tmp_path / 'scalewatch.db'}"


@pytest.fixture
def run(store: Store) -> RunRef:
    return create_run(
        store, name="test", world_size=2, config={"init_scale": 65536.0}, control=CONTROL
    )
