from __future__ import annotations

import math
import os
import random
import time
from typing import Any

import pytest
from sqlalchemy import event, select

from scalewatch.store import RunNotFound, RunRef, StepRecord, Store
from scalewatch.store import rollups as store_rollups
from scalewatch.store.queries import parse_ranks
from scalewatch.store.records import format_inf_ranks
from scalewatch.store.runs import (
    HEARTBEAT_TIMEOUT_S,
    create_run,
    effective_status,
    end_run,
    heartbeat,
    record_gap,
    resume_run,
    write_step_values,
    write_steps,
)
from scalewatch.store.schema import ROLLUP_LEVELS, runs, steps, telemetry_gaps
from scalewatch.store.step_rows import step_values
from tests._helpers.records import step_record
from tests._helpers.stored import expected_rollups


def _run_row(store: Store, run_id: int) -> dict[str, object]:
    with store.read() as conn:
        return dict(conn.execute(select(runs).where(runs.c.id == run_id)).one()._mapping)


def _record(rng: random.Random, step: int) -> StepRecord:
    overflow = rng.random() < 0.15
    return step_record(
        step,
        wall_time=1_700_000_000.0 + step * 0.05,
        scale=2.0 ** rng.randint(-4, 24),
        overflow=overflow,
        skipped=overflow and rng.random() < 0.7,  # no step() called: an overflow not skipped
        inf_ranks=tuple(sorted(rng.sample(range(4), rng.randint(1, 3)))) if overflow else (),
        scale_after=2.0 ** rng.randint(-4, 24),
        growth_tracker=rng.randint(0, 2000),
        control_version=rng.randint(0, 3),
        # Mostly finite, some unseen, now and then not finite (stored as NULL).
        loss=rng.choice([rng.uniform(-1.0, 9.0)] * 6 + [None, math.inf, math.nan]),
        # A schedule's rate, now and then not known (a rate on a device, never read).
        lr=rng.choice([rng.uniform(1e-5, 1e-3)] * 8 + [None]),
        lr_groups=rng.choice([None] * 8 + [((0.001, None), (0.5,))]),
        schedule_drift=rng.choice([None, 0, rng.randint(1, 50)]),
        grad_norm=rng.choice([rng.uniform(0.0, 40.0)] * 6 + [None, math.inf, math.nan]),
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rollups_equal_a_brute_force_aggregation(
    store: Store, run: RunRef, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(seed)
    # New steps after every stored one are folded on the host; the rest are recomputed in SQL.
    folded: list[int] = []
    fold = store_rollups._fold

    def counted(cursor: Any, run_id: int, rows: Any, plan: Any) -> None:
        folded.append(len(rows))
        fold(cursor, run_id, rows, plan)

    monkeypatch.setattr(store_rollups, "_fold", counted)
    # Segments straddle bucket edges of every level, with gaps between them.
    numbers = sorted(
        {
            *range(1, 1500),
            *range(3 * 4096 - 300, 3 * 4096 + 300),
            *range(262144 - 900, 262144 + 700),
        }
    )
    batches: list[list[StepRecord]] = []
    position = 0
    while position < len(numbers):
        size = rng.choice([1, 7, 64, 200, 1000])
        batches.append([_record(rng, step) for step in numbers[position : position + size]])
        position += size
    stored: dict[int, StepRecord] = {}
    for written, batch in enumerate(batches, start=1):
        # In any order: the recorder hands steps over in order, but nothing here relies on it.
        write_steps(store, run.id, rng.sample(batch, len(batch)) if rng.random() < 0.5 else batch)
        stored.update((r.step, r) for r in batch)
        roll = rng.random()
        if roll < 0.15:  # a retry of the same batch
            write_steps(store, run.id, batch)
        elif roll < 0.25:  # an older batch replayed with new values (resume from a checkpoint)
            replay = [_record(rng, r.step) for r in rng.choice(batches[:written])]
            write_steps(store, run.id, replay)
            stored.update((r.step, r) for r in replay)
        elif roll < 0.3:  # one step twice in a batch: the later one is kept
            twice = [*batch, _record(rng, batch[0].step)]
            write_steps(store, run.id, twice)
            stored.update((r.step, r) for r in twice)

    with store.read() as conn:
        # In the table's column order, as the migrations made it (the oracle's).
        rollups = {tuple(row) for row in conn.exec_driver_sql("SELECT * FROM step_rollups")}
        rows = conn.execute(select(steps).order_by(steps.c.step)).all()
    assert rollups == expected_rollups(run.id, stored.values())
    assert sum(folded) == len(numbers)  # each batch of new steps, folded once
    assert [row.step for row in rows] == sorted(stored)
    for row in rows:
        record = stored[row.step]
        assert tuple(parse_ranks(row.inf_ranks)) == record.inf_ranks
        assert (row.scale, row.scale_after, row.overflow, row.growth_tracker) == (
            record.scale,
            record.scale_after,
            record.overflow,
            record.growth_tracker,
        )
        finite = record.loss is not None and math.isfinite(record.loss)
        assert row.loss == (record.loss if finite else None)
        assert row.lr == record.lr
        assert row.lr_groups == (None if record.lr_groups is None else "[[0.001,null],[0.5]]")
        assert row.schedule_drift == record.schedule_drift
    assert _run_row(store, run.id)["last_step"] == max(stored)


def test_write_steps_is_one_transaction(store: Store, run: RunRef) -> None:
    rng = random.Random(7)
    write_steps(store, run.id, [_record(rng, step) for step in range(1, 11)])
    with pytest.raises(ValueError, match=">= 0"):
        write_steps(store, run.id, [_record(rng, 11), _record(rng, -1)])
    with pytest.raises(RunNotFound):
        write_steps(store, run.id + 1, [_record(rng, 12)])
    with store.read() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM steps").scalar_one() == 10
        assert conn.exec_driver_sql("SELECT sum(n) FROM step_rollups").scalar_one() == 10 * len(
            ROLLUP_LEVELS
        )


@pytest.mark.sqlite_only
def test_write_steps_runs_few_statements(store: Store, run: RunRef) -> None:
    """Not one statement per row, nor per rollup level: the driver releases and retakes the
    GIL around each statement, and each time the training thread may wait for it."""
    statements: list[str] = []

    def trace(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.set_trace_callback(statements.append)

    event.listen(store.engine, "connect", trace)
    store.engine.dispose()
    rng = random.Random(5)
    write_steps(store, run.id, [_record(rng, step) for step in range(1, 1001)])
    written = list(statements)
    with store.read() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM steps").scalar_one() == 1000
    inserts = [sql for sql in written if sql.startswith("INSERT INTO steps (")]
    assert 1 < len(inserts) <= 1000 // 64 + 7  # 2**k rows a statement, 64 at least
    # BEGIN, last_step, the stored rollups, the 147 new ones (126 + 16 + 2 + 1 + 1 + 1 rows,
    # in statements of 128, 16, 2 and 1), the run row, COMMIT: however many levels there are;
    # and for the spikes, the run's rule and the history before the batch (and the spikes
    # found, if any).
    others = [sql for sql in written if sql not in inserts and not sql.startswith("PRAGMA")]
    assert len(others) <= 12, "\n".join(sql[:60] for sql in others)


@pytest.mark.sqlite_only
def test_the_rollups_new_steps_extend_are_read_by_primary_key(store: Store) -> None:
    """Not a scan of the run's rollups, which grows with the run."""
    sql = store_rollups._stored_sql(len(ROLLUP_LEVELS))
    with store.read() as conn:
        plan = conn.exec_driver_sql(
            f"EXPLAIN QUERY PLAN {sql}", (1, 1, 0) * len(ROLLUP_LEVELS)
        ).fetchall()
    searches = [row[-1] for row in plan if row[-1].startswith(("SEARCH", "SCAN"))]
    assert len(searches) == len(ROLLUP_LEVELS)
    assert all("(run_id=? AND level=? AND bucket=?)" in search for search in searches), searches


def test_write_steps_advances_last_step_and_heartbeat(store: Store, run: RunRef) -> None:
    heartbeat(store, run.id, at=100.0)
    write_steps(store, run.id, [_record(random.Random(3), step) for step in (5, 9, 7)])
    row = _run_row(store, run.id)
    assert row["last_step"] == 9
    assert isinstance(row["heartbeat_at"], float) and row["heartbeat_at"] > 100.0
    write_steps(store, run.id, [])
    assert _run_row(store, run.id)["last_step"] == 9


def test_a_jobs_batch_number_is_stored_with_its_steps_and_never_moves_back(
    store: Store, run: RunRef
) -> None:
    """The service's ingest advances a run's last batch stored in the steps' transaction;
    a lower number (a batch sent again) leaves it, and so do steps written without one."""
    rng = random.Random(4)
    rows = [step_values(_record(rng, step)) for step in (1, 2, 3)]
    write_step_values(store, run.id, rows, sequence=5)
    assert _run_row(store, run.id)["batch_sequence"] == 5
    write_step_values(store, run.id, [step_values(_record(rng, 4))], sequence=4)
    assert _run_row(store, run.id)["batch_sequence"] == 5
    write_step_values(store, run.id, [step_values(_record(rng, 5))])
    assert _run_row(store, run.id)["batch_sequence"] == 5


def test_inf_ranks_text_form() -> None:
    assert format_inf_ranks((1, 3)) == "1,3"
    assert format_inf_ranks(()) == ""
    assert parse_ranks("1,3") == [1, 3]
    assert parse_ranks("") == []


def test_create_run_records_identity(store: Store) -> None:
    ref = create_run(
        store,
        name="llama",
        world_size=8,
        config={"growth_interval": 2000},
        control={"growth_interval": 2000},
        torch_version="2.4.0",
    )
    row = _run_row(store, ref.id)
    assert len(ref.uid) == 32
    assert row["uid"] == ref.uid
    assert row["status"] == "running"
    assert (row["world_size"], row["pid"], row["torch_version"]) == (8, os.getpid(), "2.4.0")
    assert row["config"] == {"growth_interval": 2000}
    assert (row["control_version"], row["last_step"], row["dropped"]) == (0, 0, 0)
    assert row["ended_at"] is None
    default = create_run(store, name="b", world_size=1, config={}, control={})
    assert _run_row(store, default.id)["torch_version"] != ""
    with pytest.raises(ValueError, match="exists"):
        create_run(store, name="c", world_size=1, config={}, control={}, uid=ref.uid)


def test_create_run_takes_when_recording_began(store: Store) -> None:
    """A trainer creates its run after its first steps: the row starts when they did."""
    began = time.time() - 5.0
    ref = create_run(store, name="late", world_size=1, config={}, control={}, started_at=began)
    assert _run_row(store, ref.id)["started_at"] == began
    before = time.time()
    now = create_run(store, name="now", world_size=1, config={}, control={})
    started = _run_row(store, now.id)["started_at"]
    assert isinstance(started, float) and before <= started <= time.time()


def test_end_and_resume(store: Store, run: RunRef) -> None:
    end_run(store, run.id, "crashed")
    row = _run_row(store, run.id)
    assert row["status"] == "crashed"
    assert row["ended_at"] is not None
    assert resume_run(store, run.uid) == run
    row = _run_row(store, run.id)
    assert (row["status"], row["ended_at"]) == ("running", None)
    assert resume_run(store, "0" * 32) is None
    end_run(store, run.id)
    assert _run_row(store, run.id)["status"] == "finished"
    with pytest.raises(ValueError, match="finished"):
        end_run(store, run.id, "paused")
    with pytest.raises(RunNotFound):
        end_run(store, run.id + 1)


def test_effective_status_detects_a_stopped_heartbeat(store: Store, run: RunRef) -> None:
    now = time.time()
    assert effective_status(_run_row(store, run.id), now) == "running"
    heartbeat(store, run.id, at=now - HEARTBEAT_TIMEOUT_S - 1)
    assert effective_status(_run_row(store, run.id), now) == "crashed"
    assert effective_status(_run_row(store, run.id)) == "crashed"
    heartbeat(store, run.id)
    assert effective_status(_run_row(store, run.id)) == "running"
    assert effective_status({"status": "running", "heartbeat_at": 100.0}, 100.0 + 15.0) == (
        "running"
    )
    assert effective_status({"status": "finished", "heartbeat_at": 0.0}, 1e9) == "finished"
    with pytest.raises(RunNotFound):
        heartbeat(store, run.id + 1)


def test_gaps_are_recorded_and_counted(store: Store, run: RunRef) -> None:
    record_gap(store, run.id, 10, 19, 10, "store locked")
    record_gap(store, run.id, 40, 44, 5, "disk full")
    assert _run_row(store, run.id)["dropped"] == 15
    with store.read() as conn:
        gaps = conn.execute(
            select(
                telemetry_gaps.c.first_step,
                telemetry_gaps.c.last_step,
                telemetry_gaps.c.dropped,
                telemetry_gaps.c.reason,
            ).order_by(telemetry_gaps.c.id)
        ).all()
    assert [tuple(gap) for gap in gaps] == [(10, 19, 10, "store locked"), (40, 44, 5, "disk full")]
    with pytest.raises(RunNotFound):
        record_gap(store, run.id + 1, 1, 2, 2, "x")
    with pytest.raises(ValueError):
        record_gap(store, run.id, 5, 4, 1, "backwards")
    with store.read() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM telemetry_gaps").scalar_one() == 2
