from __future__ import annotations

import bisect
import dataclasses
import math
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scalewatch.store.engine import Store, open_store
from scalewatch.store.queries import chart_series
from scalewatch.store.records import StepRecord
from scalewatch.store.schema import ROLLUP_LEVELS
from tests._helpers.service import add_run, simulate

BIG = max(ROLLUP_LEVELS.values()) + 40_000  # every rollup level has whole buckets


def with_losses(records: list[StepRecord], rng: random.Random) -> list[StepRecord]:
    """A falling loss with spikes, a stretch never seen, and now and then an inf or NaN;
    a learning rate that warms up, decays and restarts, not recorded on a stretch."""
    out = []
    for r in records:
        roll = rng.random()
        if roll < 0.002:
            loss: float | None = rng.choice([math.inf, math.nan])
        elif roll < 0.004:
            loss = 50.0 * rng.random()  # a spike
        elif r.step % 3000 < 700:
            loss = None
        else:
            loss = 5.0 / (1 + r.step / 1000) + rng.random() / 100
        phase = r.step % 9000
        lr = None if 4000 <= phase < 4500 else 1e-3 * min(1.0, (phase + 1) / 500) * 0.999**phase
        drift = phase // 700 if phase >= 2000 else None  # a scheduler registered at 2000
        out.append(dataclasses.replace(r, loss=loss, lr=lr, schedule_drift=drift))
    return out


def _stored_loss(r: StepRecord) -> float | None:
    return r.loss if r.loss is not None and math.isfinite(r.loss) else None


@pytest.fixture(scope="module")
def big_run(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Store, int, list[StepRecord]]]:
    path: Path = tmp_path_factory.mktemp("big") / "big.db"
    rng = random.Random(5)
    edges = {1} | {edge for width in ROLLUP_LEVELS.values() for edge in (width - 1, width)}
    overflows = set(rng.sample(range(1, BIG + 1), 120)) | edges
    records = with_losses(simulate(BIG, overflows, interval=50), rng)
    with open_store(f"sqlite:///{path}") as store:
        yield store, add_run(store, records), records


def check_buckets(
    body: dict[str, Any], records: list[StepRecord], start: int, end: int, max_points: int
) -> None:
    """Buckets cover exactly the steps in range and agree with the raw records."""
    series = body["series"]
    first, last = series["first_step"], series["last_step"]
    assert len(first) <= max_points
    inside = [r for r in records if start <= r.step <= end]
    assert sum(series["n"]) == len(inside)
    steps = [r.step for r in records]
    for i in range(len(first)):
        lo, hi = bisect.bisect_left(steps, first[i]), bisect.bisect_right(steps, last[i])
        chunk = records[lo:hi]
        assert series["n"][i] == len(chunk)
        assert series["overflows"][i] == sum(r.overflow for r in chunk)
        assert series["skipped"][i] == sum(r.skipped for r in chunk)
        assert series["scale_min"][i] == min(min(r.scale, r.scale_after) for r in chunk)
        assert series["scale_max"][i] == max(max(r.scale, r.scale_after) for r in chunk)
        assert series["scale_last"][i] == chunk[-1].scale_after
        assert series["tracker_min"][i] == min(r.growth_tracker for r in chunk)
        assert series["tracker_last"][i] == chunk[-1].growth_tracker
        losses = [loss for loss in map(_stored_loss, chunk) if loss is not None]
        assert series["loss_min"][i] == (min(losses) if losses else None)
        assert series["loss_max"][i] == (max(losses) if losses else None)
        assert series["loss_last"][i] == _stored_loss(chunk[-1])
        rates = [r.lr for r in chunk if r.lr is not None]
        assert series["lr_min"][i] == (min(rates) if rates else None)
        assert series["lr_max"][i] == (max(rates) if rates else None)
        assert series["lr_last"][i] == chunk[-1].lr
        assert series["schedule_drift"][i] == chunk[-1].schedule_drift
    for r in inside:
        if r.overflow:
            i = bisect.bisect_right(first, r.step) - 1
            assert first[i] <= r.step <= last[i]
            assert series["overflows"][i] > 0
            assert series["scale_min"][i] <= r.scale_after


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_big_run_buckets_never_lose_an_overflow(
    big_run: tuple[Store, int, list[StepRecord]], data: st.DataObject
) -> None:
    store, run, records = big_run
    start = data.draw(st.integers(1, BIG), label="start")
    end = data.draw(st.integers(start, BIG), label="end")
    max_points = data.draw(st.sampled_from([2, 3, 7, 100, 1000, 2000]), label="max_points")
    series = chart_series(store, run, start=start, end=end, max_points=max_points)
    body = {"series": series.columns}
    check_buckets(body, records, start, end, max_points)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    steps=st.integers(1, 9000),
    first=st.integers(0, 5000),
    density=st.sampled_from([0.0, 0.001, 0.01, 0.2]),
    seed=st.integers(0, 2**16),
    window=st.tuples(st.floats(0, 1), st.floats(0, 1)),
    max_points=st.integers(2, 400),
)
def test_random_runs_buckets_never_lose_an_overflow(
    client: TestClient,
    store: Store,
    steps: int,
    first: int,
    density: float,
    seed: int,
    window: tuple[float, float],
    max_points: int,
) -> None:
    rng = random.Random(seed)
    overflows = {s for s in range(first, first + steps) if rng.random() < density}
    records = with_losses(simulate(steps, overflows, first=first), rng)
    run = add_run(store, records)
    a, b = sorted(window)
    start, end = first + int(a * steps), first + int(b * steps)

    response = client.get(
        f"/api/runs/{run}/steps", params={"start": start, "end": end, "max_points": max_points}
    )

    assert response.status_code == 200
    body = response.json()
    assert (body["start"], body["end"]) == (start, end)
    check_buckets(body, records, start, end, max_points)


def test_whole_run_by_default_and_zoom_down_to_single_steps(
    client: TestClient, store: Store
) -> None:
    records = simulate(100_000, {500, 77_777})
    run = add_run(store, records)

    whole = client.get(f"/api/runs/{run}/steps?max_points=500").json()
    assert (whole["start"], whole["end"]) == (1, 100_000)
    assert 250 <= len(whole["series"]["n"]) <= 500
    assert whole["bucket_width"] > 1

    zoom = client.get(f"/api/runs/{run}/steps?start=77770&end=77790&max_points=500").json()
    assert zoom["bucket_width"] == 1
    assert zoom["series"]["first_step"] == list(range(77_770, 77_791))
    assert zoom["series"]["first_step"] == zoom["series"]["last_step"]
    at = zoom["series"]["first_step"].index(77_777)
    assert zoom["series"]["overflows"][at] == 1
    assert zoom["series"]["scale_last"][at] == records[77_776].scale_after


def test_empty_run_and_range_outside_the_run(client: TestClient, store: Store) -> None:
    empty = add_run(store, [])
    body = client.get(f"/api/runs/{empty}/steps").json()
    assert body["series"]["n"] == []
    run = add_run(store, simulate(10, set()))
    body = client.get(f"/api/runs/{run}/steps?start=100&end=200").json()
    assert body["series"]["n"] == []
    assert (body["start"], body["end"]) == (100, 200)
    # Past the last step with no end: no reversed range (start 11, end 10) comes back.
    body = client.get(f"/api/runs/{run}/steps?start=11").json()
    assert (body["start"], body["end"], body["series"]["n"]) == (11, None, [])
    body = client.get(f"/api/runs/{run}/steps?start=10").json()
    assert (body["start"], body["end"], body["series"]["n"]) == (10, 10, [1])
