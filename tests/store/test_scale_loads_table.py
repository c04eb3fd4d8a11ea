"""scale_loads: what the writer stores for a load of a scaler's state, and the reads of it."""

from __future__ import annotations

import pytest
from sqlalchemy import inspect

from scalewatch.store import RunNotFound, RunRef, Store, open_store
from scalewatch.store.engine import downgrade, make_engine, upgrade
from scalewatch.store.revisions import head_revision
from scalewatch.store.runs import create_run, write_steps
from scalewatch.store.scale_loads import ScaleLoad, load_counts, record_scale_load, scale_loads_of
from tests._helpers.service import simulate
from tests._helpers.stored import CONTROL


def test_a_load_with_the_scale_before_is_stored_as_the_scaler_saw_it(
    store: Store, run: RunRef
) -> None:
    write_steps(store, run.id, simulate(5, set()))
    load = ScaleLoad(step=3, at=10.0, scale_after=64.0, scale_before=2.0**16, from_step=5)
    row = record_scale_load(store, run.id, load)
    assert row is not None and row.jump
    (stored,) = scale_loads_of(store, run.id)
    assert stored == row
    assert (stored.step, stored.from_step, stored.scale_before, stored.scale_after) == (
        3,
        5,
        2.0**16,
        64.0,
    )


def test_a_load_without_the_scale_before_takes_the_last_stored_step(
    store: Store, run: RunRef
) -> None:
    records = simulate(9, {4})
    write_steps(store, run.id, records)
    last = records[-1]
    jumped = record_scale_load(store, run.id, ScaleLoad(step=9, at=1.0, scale_after=1.0))
    same = record_scale_load(store, run.id, ScaleLoad(step=9, at=2.0, scale_after=last.scale_after))
    assert jumped is not None and same is not None
    assert (jumped.from_step, jumped.scale_before, jumped.jump) == (9, last.scale_after, True)
    assert (same.scale_before, same.scale_after, same.jump) == (last.scale_after,) * 2 + (False,)
    assert [row.id for row in scale_loads_of(store, run.id)] == [jumped.id, same.id]
    assert load_counts(store, run.id) == (2, 1)


def test_a_run_without_steps_records_no_load(store: Store, run: RunRef) -> None:
    assert record_scale_load(store, run.id, ScaleLoad(step=0, at=1.0, scale_after=8.0)) is None
    assert scale_loads_of(store, run.id) == []
    assert load_counts(store, run.id) == (0, 0)


def test_a_load_of_no_run_is_refused(store: Store) -> None:
    with pytest.raises(RunNotFound):
        record_scale_load(store, 999, ScaleLoad(step=1, at=1.0, scale_after=8.0))


def test_the_revision_drops_the_table_with_its_rows_and_makes_it_again(db_url: str) -> None:
    upgrade(db_url)
    with open_store(db_url) as store:
        ref = create_run(store, name="r", world_size=1, config={}, control=CONTROL)
        write_steps(store, ref.id, simulate(3, set()))
        assert record_scale_load(store, ref.id, ScaleLoad(step=3, at=1.0, scale_after=2.0))
    downgrade(db_url, "b41e7f2c9d08")
    assert "scale_loads" not in _tables(db_url) and "steps" in _tables(db_url)
    assert upgrade(db_url) == head_revision()
    assert "scale_loads" in _tables(db_url)
    with open_store(db_url) as store:
        assert scale_loads_of(store, ref.id) == []


def _tables(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()
