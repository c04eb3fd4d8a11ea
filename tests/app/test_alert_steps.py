"""Every kind fed a run's steps a batch at a time says what it says fed them one by one:
the same turns at the same steps with the same readings, and the same last reading of
each batch, where a batch is taken whole (no step can turn the condition) and where not."""

from __future__ import annotations

import random
from collections.abc import Iterable
from typing import Any

import pytest

from scalewatch.app.alerts.kinds import KINDS, Reading, RunView, Watch
from scalewatch.app.alerts.steps import StepBatch

RUN = RunView(1, "bert", 4, True, 1000.0, 0, None, min_scale=16.0)

# Small windows and thresholds, so that conditions turn often in a few thousand steps.
PARAMS: dict[str, dict[str, Any]] = {
    "scale_below": {"threshold": 256.0},
    "scale_drop": {"window": 20, "threshold": 3},
    "skip_rate": {"window": 30, "threshold": 0.1},
    "skip_streak": {"threshold": 3},
    "schedule_drift": {"threshold": 2},
    "loss_spike": {"window": 25, "threshold": 2},
    "grad_norm_spike": {"window": 25, "threshold": 2},
    "rank_hotspot": {"window": 40, "threshold": 0.6, "min_overflows": 2},
    "scale_forecast": {"window": 100, "threshold": 5000},
}


def _history(seed: int, steps: int = 4000) -> list[tuple[Any, ...]]:
    """Rows as ``new_steps`` reads them: calm stretches and stormy ones (overflows on a
    few ranks, backoffs, growths, a drifting schedule, spikes), a step missing now and
    then, and the scale set from outside (a control request) between two steps."""
    rng = random.Random(seed)
    rows, scale, drift, step = [], 2.0**12, None, 0
    storm = 0.0
    for _ in range(steps):
        step += 1 if rng.random() > 0.01 else rng.randint(2, 40)
        if rng.random() < 0.003:  # a stretch of ~300 steps, most of them calm
            storm = rng.choice([0.0, 0.0, 0.0, 0.01, 0.1, 0.5])
        if rng.random() < 0.002:
            scale = rng.choice([2.0**6, 2.0**10, 2.0**14])  # set between steps
        overflow = rng.random() < storm
        if overflow:
            after = max(1.0, scale / 2)
            named = rng.sample(range(4), rng.choice([1, 1, 2]))
            ranks = ",".join(str(rank) for rank in sorted(named))
        else:
            after = min(2.0**16, scale * 2) if rng.random() < 0.02 else scale
            ranks = ""
        if rng.random() < 0.005:
            drift = None if drift is not None and rng.random() < 0.3 else 0
        if drift is not None:
            drift = drift + 1 if overflow else max(0, drift - (rng.random() < 0.05))
        loss = storm > 0 and rng.random() < storm / 4
        norm = storm > 0 and rng.random() < storm / 4
        rows.append((1, step, 1000.0 + step, scale, after, int(overflow), int(overflow),
                     ranks, drift, int(loss), int(norm)))  # fmt: skip
        scale = after
    return rows


def _batches(rows: list[tuple[Any, ...]], rng: random.Random) -> list[StepBatch]:
    batches, first = [], 0
    while first < len(rows):
        size = rng.choice([1, 3, 20, 50, 100, 200])
        batches.append(StepBatch(rows[first : first + size]))
        first += size
    return batches


def _watch(kind: str) -> Watch[Any]:
    spec = KINDS[kind]
    return spec.watch(spec.params.model_validate(PARAMS[kind]), RUN)


def _one_by_one(kind: str, batches: list[StepBatch]) -> tuple[list[Any], list[Reading]]:
    watch, turns, lasts, on = _watch(kind), [], [], False
    for batch in batches:
        for row in batch.views:
            reading = watch.step(row)
            assert reading is not None
            if reading.on != on:
                on = reading.on
                turns.append((row.step, reading))
        lasts.append(reading)
    return turns, lasts


def _by_batch(kind: str, batches: list[StepBatch]) -> tuple[list[Any], list[Reading], int]:
    watch, turns, lasts, on = _watch(kind), [], [], False
    read = 0
    real_step = watch.step

    def step(row: Any) -> Reading | None:
        nonlocal read
        read += 1
        return real_step(row)

    watch.step = step  # type: ignore[method-assign]
    for batch in batches:
        fed = watch.feed(batch, on)
        turns += [(batch.steps[i], reading) for i, reading in fed.turns]
        on = turns[-1][1].on if turns else False
        assert fed.last is not None
        lasts.append(fed.last)
    return turns, lasts, read


@pytest.mark.parametrize("kind", sorted(PARAMS))
@pytest.mark.parametrize("seed", range(6))
def test_a_batch_is_read_as_its_steps_one_by_one(kind: str, seed: int) -> None:
    rows = _history(seed)
    batches = _batches(rows, random.Random(seed))
    turns, lasts = _one_by_one(kind, batches)
    batched, batched_lasts, read = _by_batch(kind, _batches(rows, random.Random(seed)))
    assert batched == turns
    assert batched_lasts == lasts
    assert len(turns) >= 2  # the condition turned on and off: not a quiet history
    assert read < len(rows)  # and some batches were taken whole, without their steps


def test_every_kind_that_reads_steps_is_checked_here() -> None:
    stepping = {name for name, spec in KINDS.items() if spec.watch.step is not Watch.step}
    assert stepping == set(PARAMS)


def _rows(steps: Iterable[int], skipped: Iterable[int] = (), backoffs: Iterable[int] = ()) -> list:
    skipped, backoffs, rows, scale = set(skipped), set(backoffs), [], 2.0**12
    for step in steps:
        after = scale / 2 if step in backoffs else scale
        rows.append((1, step, 1000.0 + step, scale, after, int(step in skipped),
                     int(step in skipped), "", None, 0, 0))  # fmt: skip
        scale = after
    return rows


def _turn_steps(kind: str, batches: list[list[tuple[Any, ...]]]) -> list[tuple[int, bool]]:
    """Where the condition turns, fed ``batches`` whole, checked against one by one."""
    turns, _ = _one_by_one(kind, [StepBatch(rows) for rows in batches])
    batched, _, _ = _by_batch(kind, [StepBatch(rows) for rows in batches])
    assert batched == turns
    return [(step, reading.on) for step, reading in turns]


def test_skip_rate_fires_where_its_window_fills_in_a_batch_without_skips() -> None:
    early = _rows(range(1, 11), skipped={2, 3, 4, 5})  # 4 of 30 once the window is full
    assert _turn_steps("skip_rate", [early, _rows(range(11, 60))]) == [(30, True), (32, False)]


def test_skip_rate_fires_where_missing_steps_shrink_its_window() -> None:
    full = _rows(range(1, 31), skipped={28, 29, 30})  # 3 of 30: not above 0.1
    after_gap = _rows([45, 46])  # 3 of the 16 steps in (15, 45]
    assert _turn_steps("skip_rate", [full, after_gap]) == [(45, True)]


def test_scale_forecast_turns_where_a_reading_is_due_inside_a_calm_batch() -> None:
    falling = _rows(range(1, 8), backoffs={2, 4, 6})
    calm = _rows(range(8, 400))
    turns = _turn_steps("scale_forecast", [falling, calm])
    # Off at the first reading due in the calm batch (50 steps after the last backoff's):
    # over a wider span the halvings are slower, the floor further than the threshold.
    assert turns == [(4, True), (56, False)]
