"""The revisions that move step_rollups to levels 8 times apart and add the finest (8 steps),
each on a store filled before it."""

from __future__ import annotations

import dataclasses
import importlib
import random
from collections.abc import Iterable

import pytest
from alembic import command

from scalewatch.store import downgrade, upgrade
from scalewatch.store import revisions as revisions_module
from scalewatch.store import rollups as store_rollups
from scalewatch.store import runs as store_runs
from scalewatch.store.engine import Store, make_engine
from scalewatch.store.queries import EXPORT_COLUMNS
from scalewatch.store.records import StepRecord
from scalewatch.store.rollups import rollup_plan
from scalewatch.store.runs import create_run, write_steps
from scalewatch.store.schema import ROLLUP_LEVELS
from tests._helpers.records import step_record
from tests._helpers.stored import CONTROL, expected_rollups

PREVIOUS = "4bfa51145dc1"  # steps and rollups WITHOUT ROWID, three levels
REVISION = "394d114978d2"
OLD_LEVELS = {1: 64, 2: 4096, 3: 262144}
FIVE_LEVELS = {1: 64, 2: 512, 3: 4096, 4: 32768, 5: 262144}  # REVISION's
BEFORE_LEVEL_8, LEVEL_8 = "c7d3e9a1b5f2", "d4b8f2a6c1e9"

Rollup = tuple[int | float, ...]


def _record(rng: random.Random, step: int) -> StepRecord:
    overflow = rng.random() < 0.05
    return step_record(
        step,
        scale=2.0 ** rng.randint(-4, 24),
        overflow=overflow,
        skipped=overflow and rng.random() < 0.8,
        inf_ranks=(rng.randint(0, 7),) if overflow else (),
        scale_after=2.0 ** rng.randint(-4, 24),
        growth_tracker=rng.randint(0, 2000),
    )


def _brute_force(
    levels: dict[int, int],
    stored: dict[int, dict[int, StepRecord]],
    *,
    with_loss: bool = True,
    with_grad_norm: bool = True,
) -> set[Rollup]:
    """Without ``with_loss``: the rollups as they were before revision 7c25d1a9e5f0 (and
    so before the learning rate's and the gradient norm's columns too); without
    ``with_grad_norm``: before revision f5a3c9e1d7b2."""
    return {
        row
        for run_id, records in stored.items()
        for row in expected_rollups(
            run_id,
            records.values(),
            levels,
            with_loss=with_loss,
            with_lr=with_loss,
            with_grad_norm=with_loss and with_grad_norm,
        )
    }


def _stamp(url: str, revision: str) -> None:
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            command.stamp(revisions_module._alembic_config(conn), revision)
    finally:
        engine.dispose()


def _rollups(url: str) -> set[Rollup]:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.exec_driver_sql("SELECT * FROM step_rollups").fetchall()
            return {tuple(row) for row in rows}
    finally:
        engine.dispose()


def _fill(store: Store, rng: random.Random, numbers: Iterable[int]) -> dict[int, StepRecord]:
    """Write ``numbers`` in random batches, some retried or replayed; return what is stored."""
    run = create_run(store, name="before", world_size=8, config={}, control=CONTROL)
    ordered = sorted(numbers)
    stored: dict[int, StepRecord] = {}
    batches: list[list[StepRecord]] = []
    position = 0
    while position < len(ordered):
        size = rng.choice([1, 50, 300, 2000])
        batch = [_record(rng, step) for step in ordered[position : position + size]]
        batches.append(batch)
        position += size
        write_steps(store, run.id, batch)
        stored.update((r.step, r) for r in batch)
        if rng.random() < 0.1:  # an older batch replayed with new values
            replay = [_record(rng, r.step) for r in rng.choice(batches)]
            write_steps(store, run.id, replay)
            stored.update((r.step, r) for r in replay)
    return stored


def test_the_revision_builds_the_levels_of_the_schema() -> None:
    module = importlib.import_module(
        f"scalewatch.migrations.versions.{REVISION}_rollup_levels_eight_times_apart"
    )
    assert module.down_revision == PREVIOUS
    assert module.NEW_LEVELS == FIVE_LEVELS
    assert module.OLD_LEVELS == OLD_LEVELS
    finest = importlib.import_module(
        f"scalewatch.migrations.versions.{LEVEL_8}_rollup_level_of_8_steps"
    )
    assert finest.down_revision == BEFORE_LEVEL_8
    # A later change of levels needs a revision of its own.
    assert FIVE_LEVELS | {finest.LEVEL: finest.WIDTH} == ROLLUP_LEVELS


def test_upgrade_rebuilds_the_rollups_of_a_store_filled_before_it(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    upgrade(db_url)
    # The writer as it was at the previous revision: three levels, 64 times apart. It
    # writes at the head; the later revisions are then undone, and the store marked as at
    # the previous revision, whose schema this revision leaves as it is.
    monkeypatch.setattr(store_rollups, "PLAN", rollup_plan(OLD_LEVELS))
    rng = random.Random(5)
    stored: dict[int, dict[int, StepRecord]] = {}
    store = Store(db_url, make_engine(db_url))  # no upgrade on open
    try:
        # Two runs (the rebuild groups by run), with segments across the edges of every
        # old and new level and gaps between them.
        stored[1] = _fill(
            store,
            rng,
            {
                *range(0, 1300),
                *range(5 * 512 - 40, 5 * 512 + 40),
                *range(3 * 4096 - 300, 3 * 4096 + 300),
                *range(7 * 32768 - 200, 7 * 32768 + 200),
                *range(262144 - 700, 262144 + 600),
                *range(2 * 262144 + 5, 2 * 262144 + 90),
            },
        )
        stored[2] = _fill(store, rng, range(1, 5000, 3))
    finally:
        store.close()
    monkeypatch.undo()
    downgrade(db_url, REVISION)
    _stamp(db_url, PREVIOUS)
    assert _rollups(db_url) == _brute_force(OLD_LEVELS, stored, with_loss=False)

    upgrade(db_url)
    assert _rollups(db_url) == _brute_force(ROLLUP_LEVELS, stored)

    downgrade(db_url, PREVIOUS)
    assert _rollups(db_url) == _brute_force(OLD_LEVELS, stored, with_loss=False)

    upgrade(db_url)
    assert _rollups(db_url) == _brute_force(ROLLUP_LEVELS, stored)
    # The upgraded store keeps taking writes at the new levels.
    with Store(db_url, make_engine(db_url)) as store:
        batch = [_record(rng, step) for step in range(262144 + 600, 262144 + 900)]
        write_steps(store, 1, batch)
        stored[1].update((r.step, r) for r in batch)
    assert _rollups(db_url) == _brute_force(ROLLUP_LEVELS, stored)


def test_the_level_of_8_steps_is_built_for_a_store_filled_before_it(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    upgrade(db_url)
    # The writer before LEVEL_8: five levels, the finest 64 steps.
    monkeypatch.setattr(store_rollups, "PLAN", rollup_plan(FIVE_LEVELS))
    rng = random.Random(8)
    stored: dict[int, dict[int, StepRecord]] = {}
    with Store(db_url, make_engine(db_url)) as store:
        stored[1] = _fill(store, rng, {*range(0, 700), *range(4090, 4300), 9000})
        stored[2] = _fill(store, rng, range(3, 900, 5))
    monkeypatch.undo()
    downgrade(db_url, BEFORE_LEVEL_8)
    assert _rollups(db_url) == _brute_force(FIVE_LEVELS, stored, with_grad_norm=False)

    upgrade(db_url)
    assert _rollups(db_url) == _brute_force(ROLLUP_LEVELS, stored)
    with Store(db_url, make_engine(db_url)) as store:  # and keeps them up to date
        batches = [range(9001, 9100), range(650, 720)]  # new steps, then some replayed
        for numbers in batches:
            batch = [_record(rng, step) for step in numbers]
            write_steps(store, 1, batch)
            stored[1].update((r.step, r) for r in batch)
    assert _rollups(db_url) == _brute_force(ROLLUP_LEVELS, stored)

    downgrade(db_url, BEFORE_LEVEL_8)
    assert _rollups(db_url) == _brute_force(FIVE_LEVELS, stored, with_grad_norm=False)


def test_upgrade_of_an_empty_store_and_of_runs_without_steps(db_url: str) -> None:
    upgrade(db_url)
    downgrade(db_url, PREVIOUS)
    with Store(db_url, make_engine(db_url)) as store:
        create_run(store, name="empty", world_size=1, config={}, control=CONTROL)
    upgrade(db_url)
    assert _rollups(db_url) == set()


def test_step_columns_are_written_once() -> None:
    # A record's parameter findings are rows of overflow_params, its largest parameter
    # norms rows of param_norms: not columns.
    rows_elsewhere = ("params", "param_norms")
    fields = tuple(f.name for f in dataclasses.fields(StepRecord) if f.name not in rows_elsewhere)
    assert fields == EXPORT_COLUMNS
    assert ("run_id", *fields) == store_runs._STEP_COLUMNS
