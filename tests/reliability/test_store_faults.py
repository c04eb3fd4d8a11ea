"""A store that is locked, read-only, gone or full never slows training; what is lost is counted.

The trainer runs in this process (so the queue bound can be made small); the faults are
SQLite's own: another process's exclusive lock, ``query_only``, ``max_page_count``, and the
store's directory moved away or deleted.
"""

from __future__ import annotations

import shutil
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from statistics import median
from typing import Any

import pytest
import torch
from sqlalchemy import select

from scalewatch.store import Store, open_store
from scalewatch.store.schema import runs, steps, telemetry_gaps
from scalewatch.telemetry import TelemetrySettings
from tests._helpers.faults import (
    DISK_FULL,
    READ_ONLY,
    ConnectionFault,
    PacedTrainer,
    exclusive_lock,
    record_figures,
)
from tests._helpers.stored import db_url
from tests._helpers.waiting import wait_for

PERIOD = 0.005  # s per step: 200 steps/s
QUEUE_BOUND = 100  # records; each fault outlasts it several times
FAULT_S = {"locked": 10.0}
DEFAULT_FAULT_S = 2.0  # and until a record was dropped (a full disk fails at a page split)
MAX_FAULT_S = 20.0
# The median step time during a fault, at most this times the one before and after it.
SPEED_FACTOR = 2.0
MAX_STEP_S = 0.5  # no single step waits for the store


def last_stored(db: Path) -> int:
    """The newest step in the file at ``db`` now (0 when it is missing or has none)."""
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    except sqlite3.OperationalError:
        return 0
    try:
        return int(conn.execute("SELECT coalesce(max(step), 0) FROM steps").fetchone()[0])
    except sqlite3.OperationalError:
        return 0
    finally:
        conn.close()


def inject(fault: str, folder: Path, store: Store | None) -> tuple[Callable[[], None], Any]:
    """Start ``fault``; returns the function that ends it (and a context to keep open)."""
    db = folder / "sw.db"
    if fault == "locked":
        lock = exclusive_lock(db)
        lock.__enter__()
        return lambda: lock.__exit__(None, None, None), lock
    if fault in ("read-only", "disk-full"):
        assert store is not None
        injected = ConnectionFault(
            store.engine, *(READ_ONLY if fault == "read-only" else DISK_FULL)
        )
        injected.on = True

        def end() -> None:
            injected.on = False

        return end, injected
    if fault == "directory-moved":
        away = folder.with_name("elsewhere")
        folder.rename(away)
        return lambda: away.rename(folder), None
    assert fault == "directory-deleted"
    shutil.rmtree(folder)
    return lambda: folder.mkdir(), None


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """Train on one intra-op thread, as the ranks do: torch's idle pool threads spin for CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow
@pytest.mark.parametrize(
    "fault", ["locked", "read-only", "disk-full", "directory-moved", "directory-deleted"]
)
def test_a_store_fault_never_slows_training_and_every_drop_is_a_recorded_gap(
    tmp_path: Path, fault: str
) -> None:
    folder = tmp_path / "store"
    folder.mkdir()
    db = folder / "sw.db"
    url = db_url(db)
    store = open_store(url) if fault in ("read-only", "disk-full") else None
    trainer = PacedTrainer(TelemetrySettings(store or url, max_pending=QUEUE_BOUND), PERIOD)
    try:
        trainer.run(0.5)  # warm up
        before = trainer.run(1.0)
        assert trainer.gs.flush(30)
        first_in_fault = trainer.step + 1
        end_fault, _ = inject(fault, folder, store)
        started_at = time.monotonic()
        try:
            during = trainer.run(FAULT_S.get(fault, DEFAULT_FAULT_S))
            while trainer.dropped() == 0 and time.monotonic() - started_at < MAX_FAULT_S:
                during.extend(trainer.run(0.2))
        finally:
            end_fault()
        ended_at, last_in_fault = time.monotonic(), trainer.step
        after: list[float] = []

        def caught_up() -> bool:
            after.extend(trainer.run(0.1))
            return last_stored(db) > last_in_fault

        wait_for(caught_up, 60, "the telemetry to write steps trained after the fault")
        recovery_s = time.monotonic() - ended_at
        after.extend(trainer.run(1.0))
        assert trainer.gs.flush(30)
        trainer.gs.close()
    finally:
        trainer.gs.close()
        if store is not None:
            store.close()
    last = trainer.step

    with open_store(url) as reader, reader.read() as conn:
        (run,) = [dict(r._mapping) for r in conn.execute(select(runs))]
        stored = [r[0] for r in conn.execute(select(steps.c.step).order_by(steps.c.step))]
        gaps = [dict(g._mapping) for g in conn.execute(select(telemetry_gaps))]

    baseline = before + after
    speed = median(during) / median(baseline)
    assert speed <= SPEED_FACTOR, (median(before), median(during), median(after))
    assert max(during) < MAX_STEP_S
    assert run["status"] == "finished"
    assert len(stored) == len(set(stored))
    lost: set[int] = set()
    for gap in gaps:
        span = set(range(gap["first_step"], gap["last_step"] + 1))
        assert len(span) == gap["dropped"] and not span & lost and gap["reason"]
        lost |= span
    assert run["dropped"] == sum(g["dropped"] for g in gaps) == len(lost) > 0
    assert not lost & set(stored)
    accounted = sorted(lost | set(stored))
    if fault == "directory-deleted":
        # The steps already written went with the deleted file; from the first step the
        # new file holds on, every step is stored or counted.
        assert accounted == list(range(accounted[0], last + 1))
        assert accounted[0] <= first_in_fault
    else:
        assert accounted == list(range(1, last + 1))
    record_figures(
        f"store_fault.{fault}",
        {
            "fault_s": round(ended_at - started_at, 2),
            "steps_during_fault": last_in_fault - first_in_fault + 1,
            "median_step_ms_before_after": round(median(baseline) * 1e3, 3),
            "median_step_ms_during": round(median(during) * 1e3, 3),
            "median_step_time_ratio": round(speed, 3),
            "max_step_ms_during": round(max(during) * 1e3, 3),
            "queue_bound": QUEUE_BOUND,
            "dropped": run["dropped"],
            "gaps": len(gaps),
            "recovery_s": round(recovery_s, 2),
            "steps_stored": len(stored),
            "steps_trained": last,
        },
    )
