from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

from scaler.store import RunRef, StepRecord, Store
from scaler.store.runs import create_run
from scaler.store.schema import ROLLUP_LEVELS

CONTROL = {
    "growth_interval": 2000,
    "growth_factor": 2.0,
    "backoff_factor": 0.5,
    "min_scale": None,
    "max_scale": None,
    "hysteresis": None,
}


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


def expected_rollups(
    run_id: int,
    records: Iterable[StepRecord],
    levels: Mapping[int, int] = ROLLUP_LEVELS,
    *,
    with_loss: bool = True,
    with_lr: bool = True,
) -> set[tuple[int | float | None, ...]]:
    """The ``step_rollups`` rows of ``records`` at ``levels`` (level -> width), computed by
    brute force from the records themselves: the oracle for the store's rollups.

    ``with_loss``: with the min and max of the finite losses (revision 7c25d1a9e5f0 on);
    ``with_lr``: of the learning rates (revision b41e7f2c9d08 on).
    """
    expected: set[tuple[int | float | None, ...]] = set()
    for level, width in levels.items():
        buckets: dict[int, list[StepRecord]] = {}
        for record in records:
            buckets.setdefault(record.step // width, []).append(record)
        for bucket, members in buckets.items():
            last = max(members, key=lambda r: r.step)
            scales = [r.scale for r in members] + [r.scale_after for r in members]
            trackers = [r.growth_tracker for r in members]
            losses = [r.loss for r in members if r.loss is not None and math.isfinite(r.loss)]
            loss = (min(losses), max(losses)) if losses else (None, None)
            rates = [r.lr for r in members if r.lr is not None]
            lr = (min(rates), max(rates)) if rates else (None, None)
            expected.add(
                (
                    run_id,
                    level,
                    bucket,
                    min(r.step for r in members),
                    last.step,
                    len(members),
                    min(scales),
                    max(scales),
                    last.scale_after,
                    min(trackers),
                    max(trackers),
                    last.growth_tracker,
                    sum(r.overflow for r in members),
                    sum(r.skipped for r in members),
                    *(loss if with_loss else ()),
                    *(lr if with_lr else ()),
                )
            )
    return expected
