"""Chart series against a plain computation over the stored steps, on both backends: every
column of every bucket, whether the buckets are single steps, single rollup rows or
grouped from several pieces."""

from __future__ import annotations

import random

from scalewatch.store import RunRef, Store
from scalewatch.store.charts import Series, _bucket_width, chart_series
from scalewatch.store.runs import write_steps
from scalewatch.store.schema import ROLLUP_LEVELS
from scalewatch.store.step_schema import SERIES_KEYS
from tests._helpers.chart_oracle import chart_record, plain_columns
from tests._helpers.stored import step_rows

# Gaps inside buckets of every width the windows below chart at, and a whole empty stretch.
STEPS = sorted(
    {*range(1, 9_000), *range(9_013, 9_500), *range(9_700, 21_000), *range(23_000, 30_000)}
    - {7, 64, 65, 200, 4096, 12_345}
)


def _windows(rng: random.Random) -> list[tuple[int | None, int | None, int]]:
    """Windows whose buckets are single steps, a rollup level's rows, and several pieces."""
    fixed: list[tuple[int | None, int | None, int]] = [
        (None, None, 2000),  # the whole run: 16 steps a bucket, two 8-step rows each
        (None, None, 470),  # 64 steps a bucket: one rollup row each
        (1_000, 1_499, 2000),  # one step a bucket
        (5, 5_004, 2000),  # 8 steps a bucket, partial ones at both ends
        (3_333, 27_777, 100),  # 256 steps a bucket: four 64-step rows each
        (3_333, 27_777, 2),
        (8_990, 9_750, 7),
        (21_500, 22_500, 50),  # no steps at all
        (100, 99, 50),  # reversed: empty
    ]
    drawn: list[tuple[int | None, int | None, int]] = []
    for _ in range(60):
        start = rng.randint(0, 30_500)
        end = start + rng.choice([1, 30, 700, 5_000, 30_000])
        drawn.append((start, end, rng.choice([2, 3, 7, 100, 470, 1000, 2000])))
    return fixed + drawn


def test_buckets_equal_a_plain_computation_over_the_steps(store: Store, run: RunRef) -> None:
    rng = random.Random(7)
    records = [chart_record(rng, step) for step in STEPS]
    for i in range(0, len(records), 997):
        write_steps(store, run.id, records[i : i + 997])
    rows = step_rows(store, run.id)
    level_widths = set(ROLLUP_LEVELS.values())
    shapes = set()

    for start, end, max_points in _windows(rng):
        series = chart_series(store, run.id, start=start, end=end, max_points=max_points)

        lo, hi = max(start or 0, STEPS[0]), min(STEPS[-1] if end is None else end, STEPS[-1])
        assert isinstance(series, Series)
        assert (series.start, series.end) == (
            STEPS[0] if start is None else start,
            STEPS[-1] if end is None else end,
        )
        if lo > hi:
            assert series.columns == {key: [] for key in SERIES_KEYS}
            continue
        width = series.bucket_width
        assert width == _bucket_width(hi - lo + 1, max_points)[0]
        assert len(series.columns["n"]) <= max_points
        assert series.columns == plain_columns(rows, lo, hi, width), (start, end, max_points)
        shapes.add("step" if width == 1 else "row" if width in level_widths else "grouped")
    assert shapes == {"step", "row", "grouped"}
