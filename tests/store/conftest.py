from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from scaler.store import RunRef, Store, open_store
from scaler.store.runs import create_run

CONTROL = {
    "growth_interval": 2000,
    "growth_factor": 2.0,
    "backoff_factor": 0.5,
    "min_scale": None,
    "max_scale": None,
    "hysteresis": None,
}


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'store.db'}"


@pytest.fixture
def store(url: str) -> Iterator[Store]:
    with open_store(url) as opened:
        yield opened


@pytest.fixture
def run(store: Store) -> RunRef:
    return create_run(
        store, name="test", world_size=2, config={"init_scale": 65536.0}, control=CONTROL
    )
