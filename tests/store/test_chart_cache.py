"""Charts answered through a ChartCache against a plain computation over the stored steps,
on both backends: as a run grows, after steps are written again (by this store object or
another), and with the cache full."""

from __future__ import annotations

import random
from typing import Any

from scalewatch.store import RunRef, Store, open_store
from scalewatch.store.chart_cache import ChartCache
from scalewatch.store.charts import chart_series
from scalewatch.store.runs import write_steps
from tests._helpers.chart_oracle import chart_record, plain_columns
from tests._helpers.stored import step_rows

# Gaps inside buckets, a stretch with no steps, and a first step past 0.
STEPS = sorted({*range(3, 6_000), *range(6_011, 9_000), *range(9_500, 14_000)} - {64, 100, 4096})
# (start, end, max_points): the whole run (16 and 64 steps a bucket), windows whose first
# and last buckets are partial, a window past the last step, one step a bucket (not kept).
WINDOWS: list[tuple[int | None, int | None, int]] = [
    (None, None, 2000),
    (None, None, 200),
    (5, 5_004, 2000),
    (1_003, 13_001, 1000),
    (7_000, 40_000, 300),
    (2_000, 2_600, 2000),
]


def _check(store: Store, run: int, cache: ChartCache, rows: list[dict[str, Any]]) -> None:
    for start, end, max_points in WINDOWS:
        series = chart_series(store, run, start=start, end=end, max_points=max_points, cache=cache)
        plain = chart_series(store, run, start=start, end=end, max_points=max_points)
        assert series == plain, (start, end, max_points)
        if rows and series.start is not None and series.end is not None:
            lo, hi = max(series.start, rows[0]["step"]), min(series.end, rows[-1]["step"])
            expected = plain_columns(rows, lo, hi, series.bucket_width)
            assert series.columns == expected, (start, end, max_points)


def test_a_growing_run_is_charted_as_stored_and_kept_buckets_are_not_read_again(
    store: Store, run: RunRef
) -> None:
    rng, cache = random.Random(3), ChartCache()
    records = [chart_record(rng, step) for step in STEPS]
    for i in range(0, len(records), 1_700):  # a live run: charted after each batch
        write_steps(store, run.id, records[i : i + 1_700])
        _check(store, run.id, cache, step_rows(store, run.id))
    assert cache.kept_buckets > 0

    read = cache.read_buckets  # charted again, nothing new: only buckets still filling
    whole = chart_series(store, run.id, max_points=2000, cache=cache)
    assert cache.read_buckets - read <= 1
    assert len(whole.columns["n"]) > 500


def test_steps_written_again_are_charted_as_rewritten(
    store: Store, run: RunRef, db_url: str
) -> None:
    rng, cache = random.Random(4), ChartCache()
    records = [chart_record(rng, step) for step in STEPS]
    write_steps(store, run.id, records)
    _check(store, run.id, cache, step_rows(store, run.id))

    # A resume from an older checkpoint writes steps again with other values...
    write_steps(store, run.id, [chart_record(rng, r.step) for r in records[2_000:4_000]])
    _check(store, run.id, cache, step_rows(store, run.id))
    # ... and so does another process, through a store of its own.
    with open_store(db_url) as other:
        write_steps(other, run.id, [chart_record(rng, r.step) for r in records[100:300]])
        write_steps(other, run.id, [chart_record(rng, 1)])  # before the first step
    _check(store, run.id, cache, step_rows(store, run.id))


def test_a_full_cache_drops_the_least_recent_and_answers_the_same(
    store: Store, run: RunRef
) -> None:
    rng, cache = random.Random(5), ChartCache(max_buckets=400)
    write_steps(store, run.id, [chart_record(rng, step) for step in STEPS])
    rows = step_rows(store, run.id)
    for _ in range(2):
        for start, end, max_points in WINDOWS:
            series = chart_series(
                store, run.id, start=start, end=end, max_points=max_points, cache=cache
            )
            lo, hi = max(series.start or 0, STEPS[0]), min(series.end or STEPS[-1], STEPS[-1])
            assert series.columns == plain_columns(rows, lo, hi, series.bucket_width)
            # the chart just answered stays, whatever its size
            assert len(cache) <= 400 or cache.charts == 1
    read = cache.read_buckets  # the chart just answered, asked again: kept
    chart_series(store, run.id, start=start, end=end, max_points=max_points, cache=cache)
    assert cache.read_buckets - read <= 1
