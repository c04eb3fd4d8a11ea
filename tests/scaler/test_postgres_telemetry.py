"""A trainer writing its telemetry to a PostgreSQL store: the same rows as on SQLite."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
import torch
from sqlalchemy import select

import scalewatch
from scalewatch.store import open_store
from scalewatch.store.control import control_history, request_control
from scalewatch.store.schema import runs, steps, telemetry_gaps
from scalewatch.telemetry import TelemetrySettings
from tests._helpers.postgres import Cluster
from tests._helpers.twin import INJECT, mlp, sgd, train, train_step
from tests._helpers.waiting import wait_for

pytestmark = pytest.mark.postgres


def test_a_trainer_writes_every_step_and_ends_its_run_on_postgresql(postgres_url: str) -> None:
    kwargs: dict[str, Any] = {"device": "cpu", "init_scale": 2.0**10, "growth_interval": 2}
    theirs = torch.amp.GradScaler(**kwargs)
    ours = scalewatch.GradScaler(**kwargs, telemetry=postgres_url, run_name="on postgres")
    traces = []
    for gs in (theirs, ours):
        model = mlp()
        traces.append(train(gs, model, sgd(model), steps=12, inject=INJECT))
    traces[1].assert_same(traces[0])
    assert ours.flush(30)
    run_id = ours.run_id
    ours.close()
    with open_store(postgres_url) as store, store.read() as conn:
        rows = [
            dict(row._mapping)
            for row in conn.execute(
                select(steps).where(steps.c.run_id == run_id).order_by(steps.c.step)
            )
        ]
        run = conn.execute(select(runs).where(runs.c.id == run_id)).one()._mapping
    scales = traces[0].scales
    assert [r["step"] for r in rows] == list(range(1, 13))
    assert [r["overflow"] for r in rows] == [s in INJECT for s in range(12)]
    assert [r["skipped"] for r in rows] == traces[0].skipped
    assert [r["scale_after"] for r in rows] == scales
    assert [r["scale"] for r in rows] == [2.0**10, *scales[:-1]]
    assert [r["growth_tracker"] for r in rows] == traces[0].trackers
    assert run["name"] == "on postgres" and run["status"] == "finished"
    assert run["last_step"] == 12


def test_training_goes_on_while_the_server_is_down_and_nothing_is_lost(
    postgres_cluster: Cluster, postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The server stops mid-run (a restart, a lost network): steps wait in the queue and
    are written once it is back, by a writer that reconnects by itself."""
    settings = TelemetrySettings(postgres_url, retry_s=0.1)
    model = mlp()
    opt = sgd(model)[0]
    with caplog.at_level(logging.WARNING):
        gs = scalewatch.GradScaler("cpu", growth_interval=2, telemetry=settings, run_name="restart")
        for step in range(1, 11):
            train_step(gs, model, opt, step)
        assert gs.flush(30)
        postgres_cluster.stop(mode="fast")
        try:
            began = time.monotonic()
            for step in range(11, 61):
                train_step(gs, model, opt, step)
            assert time.monotonic() - began < 10  # never waits for the store
            wait_for(lambda: "not taking writes" in caplog.text, 30, "the writer to fail")
        finally:
            postgres_cluster.start()
        assert gs.flush(60)
        run_id = gs.run_id
        gs.close()
    with open_store(postgres_url) as store, store.read() as conn:
        stored = conn.execute(
            select(steps.c.step).where(steps.c.run_id == run_id).order_by(steps.c.step)
        ).scalars()
        assert list(stored) == list(range(1, 61))
        run = conn.execute(select(runs).where(runs.c.id == run_id)).one()._mapping
    assert run["dropped"] == 0 and run["status"] == "finished"
    assert caplog.text.count("not taking writes") == 1
    assert "takes writes again" in caplog.text


def test_a_killed_connection_is_reconnected_and_nothing_is_lost(
    postgres_cluster: Cluster, postgres_url: str
) -> None:
    """The server stays up but drops the trainer's connections (an administrator's
    pg_terminate_backend, a proxy's idle timeout): the writer connects again by itself."""
    database = postgres_url.rsplit("/", 1)[1]
    settings = TelemetrySettings(postgres_url, retry_s=0.1)
    model = mlp()
    opt = sgd(model)[0]
    gs = scalewatch.GradScaler("cpu", growth_interval=2, telemetry=settings, run_name="killed")
    for step in range(1, 11):
        train_step(gs, model, opt, step)
    assert gs.flush(30)
    for round_ in range(3):
        postgres_cluster.sql(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            f" WHERE datname = '{database}' AND pid <> pg_backend_pid()"
        )
        for step in range(11 + 20 * round_, 31 + 20 * round_):
            train_step(gs, model, opt, step)
        assert gs.flush(30)
    run_id = gs.run_id
    # The control poller's connection went too: a request still reaches the trainer.
    with open_store(postgres_url) as store:
        asked = request_control(store, run_id, {"growth_interval": 7}, requested_by="t")
        step = 70
        while gs.get_growth_interval() != 7:
            assert step < 2000, "the request was never applied"
            step += 1
            train_step(gs, model, opt, step)
            time.sleep(0.01)
        gs.close()
        (applied,) = [row for row in control_history(store, run_id) if row.id == asked.id]
        with store.read() as conn:
            stored = conn.execute(
                select(steps.c.step).where(steps.c.run_id == run_id).order_by(steps.c.step)
            ).scalars()
            assert list(stored) == list(range(1, step + 1))
            run = conn.execute(select(runs).where(runs.c.id == run_id)).one()._mapping
    assert applied.status == "applied" and 70 < (applied.applied_step or 0) <= step
    assert run["dropped"] == 0 and run["status"] == "finished"


def test_a_missing_database_is_one_warning_and_training_goes_on(
    postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    missing = postgres_url.rsplit("/", 1)[0].replace("postgres@", "postgres:pw-s3cret@")
    settings = TelemetrySettings(f"{missing}/no_such_db", retry_s=0.05, close_failing_s=0.5)
    model = mlp()
    opt = sgd(model)[0]
    with caplog.at_level(logging.WARNING):
        gs = scalewatch.GradScaler("cpu", growth_interval=2, telemetry=settings)
        for step in range(1, 21):
            train_step(gs, model, opt, step)
        wait_for(lambda: "not taking writes" in caplog.text, 30, "the writer to fail")
        for step in range(21, 41):
            train_step(gs, model, opt, step)
        gs.close()
    assert caplog.text.count("records wait, then are dropped") == 1  # once while training
    assert "no_such_db" in caplog.text and "pw-s3cret" not in caplog.text


def test_beyond_the_queues_bound_the_gap_is_recorded_once_the_server_is_back(
    postgres_cluster: Cluster, postgres_url: str
) -> None:
    """The server is down for longer than the queue holds: the oldest waiting records are
    dropped, and the run says which, as on SQLite; the rest are written."""
    settings = TelemetrySettings(postgres_url, retry_s=0.1, max_pending=20)
    model = mlp()
    opt = sgd(model)[0]
    gs = scalewatch.GradScaler("cpu", growth_interval=2, telemetry=settings, run_name="long outage")
    for step in range(1, 11):
        train_step(gs, model, opt, step)
    assert gs.flush(30)
    postgres_cluster.stop(mode="fast")
    try:
        for step in range(11, 61):
            train_step(gs, model, opt, step)
        wait_for(lambda: gs._session.telemetry.dropped > 0, 30, "records to be dropped")
    finally:
        postgres_cluster.start()
    assert gs.flush(60)
    run_id = gs.run_id
    gs.close()
    with open_store(postgres_url) as store, store.read() as conn:
        stored = list(
            conn.execute(
                select(steps.c.step).where(steps.c.run_id == run_id).order_by(steps.c.step)
            ).scalars()
        )
        gaps = [dict(g._mapping) for g in conn.execute(select(telemetry_gaps))]
        run = conn.execute(select(runs).where(runs.c.id == run_id)).one()._mapping
    lost = set(range(1, 61)) - set(stored)
    spans = [set(range(gap["first_step"], gap["last_step"] + 1)) for gap in gaps]
    assert [len(span) for span in spans] == [gap["dropped"] for gap in gaps]
    assert set().union(*spans) == lost and len(stored) >= 20
    # The oldest waiting records went, the newest stayed. On a busy machine the writer may
    # have taken the first steps of the outage (11, 12) into a write before the queue
    # filled: in its hands, not waiting, they are written once the server is back.
    assert lost and min(lost) >= 11 and max(lost) < 60
    assert set(range(max(lost) + 1, 61)) <= set(stored)
    assert run["dropped"] == sum(gap["dropped"] for gap in gaps) == len(lost)
    assert run["status"] == "finished"
