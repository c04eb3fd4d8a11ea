"""The writer (scalewatch.telemetry._writer): it carries out the queued commands in their
order, gathers a burst into one transaction, and keeps what a failed write took."""

from __future__ import annotations

import gc
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from scalewatch._control.inbox import ControlInbox
from scalewatch._recording.recorder import StepSample
from scalewatch.store import Store, open_store
from scalewatch.store import runs as store_runs
from scalewatch.store import scale_loads as store_scale_loads
from scalewatch.store.records import ScaleLoad
from scalewatch.store.schema import steps, telemetry_gaps
from scalewatch.telemetry import Telemetry, TelemetrySettings
from tests._helpers.records import step_record
from tests._helpers.stored import db_url
from tests._helpers.waiting import wait_for


def sample(step: int) -> StepSample:
    return StepSample(
        step_record(step, wall_time=time.time(), growth_tracker=step, growth_interval=50)
    )


MakeWriter = Callable[..., tuple[Telemetry, Store, list[int]]]


@pytest.fixture
def make_writer(tmp_path: Path) -> Iterator[MakeWriter]:
    """``make_writer(**settings)``: a telemetry writer with ``TelemetrySettings(**settings)``
    on a file store whose run exists, and the sizes of its step batches."""
    made: list[tuple[Telemetry, Store]] = []
    write = store_runs.write_step_values

    def make(**settings: Any) -> tuple[Telemetry, Store, list[int]]:
        assert not made, "one writer a test"
        store = open_store(db_url(tmp_path / "sw.db"))
        telemetry = Telemetry(
            TelemetrySettings(store, **settings),
            name="cadence",
            world_size=1,
            config={},
            control={},
            inbox=ControlInbox(),
        )
        made.append((telemetry, store))
        wait_for(lambda: telemetry.run_id is not None, 30, "the writer to create its run")
        return telemetry, store, batches

    batches: list[int] = []

    def counting(store: Store, run_id: int, values: Any, findings: Any = ()) -> None:
        batches.append(len(values))
        write(store, run_id, values, findings)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(store_runs, "write_step_values", counting)
        yield make
    for telemetry, store in made:
        telemetry.close()
        store.close()


@pytest.fixture
def writer(make_writer: MakeWriter) -> tuple[Telemetry, Store, list[int]]:
    """A telemetry writer with the default settings (see ``make_writer``)."""
    return make_writer()


def _stored(store: Store) -> int:
    with store.read() as conn:
        return int(conn.execute(select(func.count()).select_from(steps)).scalar_one())


def test_a_failed_batch_dropped_after_newer_records_is_in_the_same_gap(
    make_writer: MakeWriter,
) -> None:
    """Steps 1-3 fail to write and go back to the queue's front; 4-6, which came in
    meanwhile, are dropped first, then 1-3: one lost range, 1-6, is recorded."""
    telemetry, store, _ = make_writer(max_pending=4)
    write = store_runs.write_step_values
    taken, failed_once, resubmitted = threading.Event(), threading.Event(), threading.Event()

    def failing_once(store: Store, run_id: int, values: Any, findings: Any = ()) -> None:
        if not failed_once.is_set():
            taken.set()
            failed_once.wait(30)
            raise sqlite3.OperationalError("disk I/O error")
        write(store, run_id, values, findings)

    ensure_run = telemetry._writer._ensure_run

    def retry_after_resubmit() -> bool:
        if failed_once.is_set():  # the retry takes its batch only once 8-10 are queued
            resubmitted.wait(30)
        return ensure_run()

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(store_runs, "write_step_values", failing_once)
        patch.setattr(telemetry._writer, "_ensure_run", retry_after_resubmit)
        telemetry.submit([sample(step) for step in range(1, 4)])
        wait_for(taken.is_set, 30, "the writer to take steps 1-3")
        telemetry.submit([sample(step) for step in range(4, 8)])  # 4-6 dropped, 7 queued
        failed_once.set()
        wait_for(lambda: telemetry.failing is not None, 30, "the write of 1-3 to fail")
        telemetry.submit([sample(step) for step in range(8, 11)])  # 1-3 dropped now
        resubmitted.set()
        assert telemetry.flush(30)
    assert telemetry.dropped == 6
    with store.read() as conn:
        gaps = [
            tuple(g)
            for g in conn.execute(select(telemetry_gaps.c["first_step", "last_step", "dropped"]))
        ]
        stored = [s for (s,) in conn.execute(select(steps.c.step).order_by(steps.c.step))]
    assert gaps == [(1, 6, 6)]
    assert stored == [7, 8, 9, 10]


def test_the_writer_gathers_a_burst_of_records_into_one_transaction(
    make_writer: MakeWriter,
) -> None:
    telemetry, store, batches = make_writer(coalesce_s=2.0)
    for step in range(1, 41):  # as the recorder hands them over: a few at a time
        telemetry.submit([sample(step)])
        time.sleep(0.001)
    wait_for(lambda: _stored(store) == 40, 30, "the burst to reach the store")
    assert batches == [40]


def test_the_default_cadence_keeps_a_step_under_a_second_from_the_store(
    writer: tuple[Telemetry, Store, list[int]],
) -> None:
    """What a kill -9 may lose, and what a live chart waits for, stay under 1 s."""
    telemetry, store, _ = writer
    assert telemetry.settings.coalesce_s == TelemetrySettings().coalesce_s <= 0.25
    began = time.monotonic()
    telemetry.submit([sample(1)])
    wait_for(lambda: _stored(store) == 1, 30, "the step to reach the store")
    assert time.monotonic() - began < 1.0


def test_queued_records_leave_the_garbage_collectors_tracking(make_writer: MakeWriter) -> None:
    """Records waiting for the writer cost the collections that run meanwhile, some of them
    on the training thread, nothing once a collection has seen them."""
    telemetry, store, _ = make_writer(coalesce_s=600.0)  # they stay queued
    telemetry.submit([sample(step) for step in range(1, 11)])
    gc.collect(0)
    with telemetry._queue.lock:
        queued = list(telemetry._queue.commands)
    assert len(queued) == 10
    assert not any(gc.is_tracked(record) for record in queued)
    assert telemetry.flush(30) and _stored(store) == 10


def test_flush_and_a_full_batch_write_at_once(make_writer: MakeWriter) -> None:
    telemetry, store, batches = make_writer(coalesce_s=600.0, batch=10)
    telemetry.submit([sample(step) for step in range(1, 4)])
    assert telemetry.flush(30)
    assert _stored(store) == 3 and batches == [3]
    telemetry.submit([sample(step) for step in range(4, 14)])  # a whole batch: no waiting
    wait_for(lambda: _stored(store) == 13, 30, "a full batch to reach the store")
    assert batches == [3, 10]


def test_the_commands_are_carried_out_in_the_order_they_were_queued(
    make_writer: MakeWriter,
) -> None:
    """Steps, a load made between them, the steps after it: the store sees them in that
    order, whatever the kinds (the load is written after the steps before it)."""
    telemetry, store, _ = make_writer(coalesce_s=600.0)  # nothing written before the flush
    done: list[str] = []
    write, record_load = store_runs.write_step_values, store_scale_loads.record_scale_load

    def steps_noted(store: Store, run_id: int, values: Any, findings: Any = ()) -> None:
        done.append("steps " + ",".join(str(v[0]) for v in values))
        write(store, run_id, values, findings)

    def load_noted(store: Store, run_id: int, load: ScaleLoad) -> Any:
        done.append(f"load at {load.step}")
        return record_load(store, run_id, load)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(store_runs, "write_step_values", steps_noted)
        patch.setattr(store_scale_loads, "record_scale_load", load_noted)
        telemetry.submit([sample(1), sample(2)])
        telemetry.note_scale_load(
            ScaleLoad(step=2, at=time.time(), scale_after=8.0, scale_before=1024.0, from_step=2)
        )
        telemetry.submit([sample(3)])
        assert telemetry.flush(30)
    assert done == ["steps 1,2", "load at 2", "steps 3"]
    assert _stored(store) == 3
