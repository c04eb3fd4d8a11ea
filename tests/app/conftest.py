from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from app.main import create_app
from app.settings import Settings
from scaler.store.engine import Store
from scaler.store.records import StepRecord
from scaler.store.runs import create_run, write_steps

TOKEN = "s3cret-token-for-tests"
# The service bound to loopback answers only requests that name a loopback host.
LOCAL = "http://127.0.0.1"
CONTROL = {
    "growth_interval": 4,
    "growth_factor": 2.0,
    "backoff_factor": 0.5,
    "min_scale": None,
    "max_scale": None,
    "hysteresis": None,
}


def simulate(
    steps: int, overflows: set[int], *, first: int = 1, interval: int = 4, scale: float = 2.0**16
) -> list[StepRecord]:
    """Records of a scaler with torch's rules, overflowing (on rank 1) at ``overflows``."""
    records, tracker = [], 0
    for step in range(first, first + steps):
        overflow = step in overflows
        if overflow:
            after, tracker = scale * 0.5, 0
        elif tracker + 1 == interval:
            after, tracker = min(scale * 2.0, 2.0**24), 0
        else:
            after, tracker = scale, tracker + 1
        records.append(
            StepRecord(
                step=step,
                wall_time=1_700_000_000.0 + step / 4,
                scale=scale,
                overflow=overflow,
                skipped=overflow,
                inf_ranks=(1,) if overflow else (),
                scale_after=after,
                growth_tracker=tracker,
                growth_interval=interval,
                growth_factor=2.0,
                backoff_factor=0.5,
                control_version=0,
            )
        )
        scale = after
    return records


def add_run(
    store: Store, records: list[StepRecord], *, name: str = "bert-large", batch: int = 50_000
) -> int:
    ref = create_run(
        store, name=name, world_size=2, config={"init_scale": 2.0**16}, control=CONTROL
    )
    for i in range(0, len(records), batch):
        write_steps(store, ref.id, records[i : i + batch])
    return ref.id


@pytest.fixture
def settings(db_url: str, tmp_path: Path) -> Settings:
    return Settings(db=db_url, token=SecretStr(TOKEN), token_file=tmp_path / "token")


@pytest.fixture
def client(settings: Settings, store: Store) -> Iterator[TestClient]:
    with TestClient(create_app(settings), base_url=LOCAL) as test_client:
        yield test_client


def auth(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}
