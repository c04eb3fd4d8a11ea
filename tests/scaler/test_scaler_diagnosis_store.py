"""A scaler's overflow findings and losses reach the store through the telemetry writer."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

import scalewatch
from scalewatch._recording.recorder import StepSample
from scalewatch.store import Store, open_store
from scalewatch.store import runs as store_runs
from scalewatch.store.diagnosis import overflow_detail
from scalewatch.store.records import ParamFinding
from scalewatch.store.schema import overflow_params, steps
from scalewatch.telemetry import TelemetrySettings
from scalewatch.telemetry._queue import CommandQueue, Diagnosed, RecordGap, findings_of
from tests._helpers.diagnosis import INF, NAN, PLAN, Net, run
from tests._helpers.records import step_record
from tests._helpers.waiting import wait_for


def stored(url: str, run_id: int) -> tuple[list[Any], list[tuple[Any, ...]]]:
    with open_store(url) as store, store.read() as conn:
        rows = list(conn.execute(select(steps).where(steps.c.run_id == run_id)))
        found = [
            tuple(r)
            for r in conn.execute(
                select(overflow_params.c["step", "rank", "name", "kind", "count"])
                .where(overflow_params.c.run_id == run_id)
                .order_by(overflow_params.c.step, overflow_params.c.name)
            )
        ]
    return rows, found


def train_and_check(cls: Any, url: str) -> None:
    gs = cls("cpu", init_scale=256.0, telemetry=url, run_name="diagnosed")
    model = Net()
    gs.watch(model)
    losses = run(gs, model, PLAN, steps=6, bad_loss=(4,))
    run_id = gs.run_id
    assert run_id is not None
    gs.close()
    rows, found = stored(url, run_id)
    assert [f for f in found if f[0] != 5] == [
        (2, 0, "decoder.weight", "inf", 3),
        (2, 0, "encoder.bias", "nan", 1),
        (4, 0, "encoder.weight", "nan", 2),
    ]
    # the infinite loss of step 5 reached every element of every gradient
    numels = {n: p.numel() for n, p in model.named_parameters()}
    assert {(name, count) for step, _, name, _, count in found if step == 5} == set(numels.items())
    by_step = {r.step: r for r in rows}
    # the loss of every step; an infinite one is stored as NULL, its rank says it was not finite
    assert [by_step[s].loss for s in range(1, 7)] == [*losses[:4], None, losses[5]]
    assert by_step[5].loss_nonfinite_ranks == "0"
    assert all(by_step[s].loss_nonfinite_ranks == "" for s in (1, 2, 3, 4, 6))
    assert all(r.params_omitted == 0 for r in rows)
    with open_store(url) as store:
        detail = overflow_detail(store, run_id, 2)
    assert detail.step is not None and detail.step["overflow"]


def test_findings_and_losses_are_stored(kind: str, tmp_path: Path) -> None:
    cls = scalewatch.GradScaler if kind == "plain" else scalewatch.ShardedGradScaler
    train_and_check(cls, f"sqlite:///{tmp_path / 'sw.db'}")


@pytest.mark.postgres
def test_findings_and_losses_are_stored_on_postgresql(postgres_url: str) -> None:
    train_and_check(scalewatch.GradScaler, postgres_url)


def _record(step: int, params: tuple[ParamFinding, ...] = ()) -> StepSample:
    return StepSample(
        step_record(
            step,
            wall_time=0.0,
            scale=8.0,
            overflow=bool(params),
            inf_ranks=(0,) if params else (),
            scale_after=4.0,
            growth_interval=9,
            loss=0.5,
            params=params,
        )
    )


def test_the_queue_keeps_findings_with_their_step() -> None:
    """Only an explained overflow's values carry findings; they go back to the queue and are
    dropped with their step, never apart from it."""
    queue = CommandQueue(max_pending=3, batch=2)
    finding = ParamFinding(1, "w", "both", 4)
    queue.put([_record(1), _record(2, (finding,)), _record(3)])
    batch = queue.take()
    assert [type(v) for v in batch] == [tuple, Diagnosed]
    assert findings_of(batch) == [(2, 1, "w", "both", 4)]
    queue.put_back(batch)
    queue.written()
    queue.put([_record(4), _record(5, (finding,))])  # over the bound: 1 and 2 dropped
    assert queue.dropped == 2
    assert queue.take() == [RecordGap(1, 2, 2)]  # in their place
    queue.written()
    batch = queue.take()
    assert [v[0] for v in batch] == [3, 4]
    assert findings_of(batch) == []
    queue.written()
    batch = queue.take()
    assert findings_of(batch) == [(5, 1, "w", "both", 4)]


def test_a_failed_write_keeps_its_findings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path / 'sw.db'}"
    write = store_runs.write_step_values
    failed = threading.Event()

    def failing_once(store: Store, run_id: int, values: Any, findings: Any = ()) -> None:
        if findings and not failed.is_set():
            failed.set()
            raise sqlite3.OperationalError("disk I/O error")
        write(store, run_id, values, findings)

    monkeypatch.setattr(store_runs, "write_step_values", failing_once)
    # the write fails in this process: written by a thread of it
    gs = scalewatch.GradScaler(
        "cpu", init_scale=256.0, telemetry=TelemetrySettings(url, writer="thread")
    )
    model = Net()
    gs.watch(model)
    run(gs, model, {1: [("decoder.bias", 1, NAN), ("decoder.weight", 2, INF)]}, steps=3)
    wait_for(failed.is_set, 30, "the write with findings to fail once")
    assert gs.flush(60)
    run_id = gs.run_id
    assert run_id is not None
    gs.close()
    _, found = stored(url, run_id)
    assert found == [(2, 0, "decoder.bias", "nan", 1), (2, 0, "decoder.weight", "inf", 2)]
