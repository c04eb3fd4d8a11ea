"""The telemetry writer process (scalewatch.telemetry._remote and _host): a run's store is
written by a process of the training process's own, from rows the training thread hands
over, and every step reaches the store as the thread writer writes it."""

from __future__ import annotations

import logging
import os
import signal
import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from sqlalchemy import select

import scalewatch
from scalewatch.store import open_store
from scalewatch.store.schema import runs, telemetry_gaps
from scalewatch.telemetry import RemoteTelemetry, Telemetry, TelemetrySettings
from tests._helpers.stored import db_url, step_rows
from tests._helpers.twin import batch, mlp, sgd
from tests._helpers.waiting import wait_for

# Columns that differ between two runs of the same training: when, and which run.
NOT_COMPARED = ("run_id", "wall_time")


def _train(gs: Any, steps: int, *, inject: tuple[int, ...] = (), control_at: int = -1) -> None:
    """A tiny model with inf gradients at the steps in ``inject`` (0-based), a factor
    changed by code at ``control_at`` and an LR schedule registered."""
    torch.manual_seed(0)
    model = mlp(seed=0)
    opt = sgd(model)[0]
    schedule = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    gs.watch_schedulers(schedule)
    for step in range(steps):
        opt.zero_grad()
        gs.scale(model(batch(step)).pow(2).mean()).backward()
        if step in inject:
            next(iter(model.parameters())).grad.view(-1)[0] = float("inf")  # type: ignore[union-attr]
        if step == control_at:
            gs.set_growth_factor(4.0)
        gs.step(opt)
        gs.update()
        schedule.step()


def _store_fds(pid: int | str, name: str) -> list[str]:
    folder = f"/proc/{pid}/fd"
    found = []
    for fd in os.listdir(folder):
        try:
            target = os.readlink(f"{folder}/{fd}")
        except OSError:  # closed meanwhile
            continue
        if name in target:
            found.append(fd)
    return found


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="reads /proc")
def test_a_cpu_run_is_written_by_another_process_from_rows_the_training_thread_hands_over(
    tmp_path: Path,
) -> None:
    url = db_url(tmp_path / "process.db")
    gs = scalewatch.GradScaler("cpu", init_scale=2.0**10, growth_interval=4, telemetry=url)
    _train(gs, 30, inject=(7,))
    telemetry = gs._session.telemetry
    assert isinstance(telemetry, RemoteTelemetry)
    assert gs._session.recorder is not None and gs._session.recorder.thread is None
    assert gs.flush(30)
    assert telemetry.writer_pid != os.getpid()
    assert _store_fds(telemetry.writer_pid, "process.db")  # the writer process has it open
    assert not _store_fds("self", "process.db")  # and the training process never opened it
    assert gs.run_id is not None and gs.stats().steps == 30
    gs.close()
    with open_store(url) as store:
        rows = step_rows(store)
        with store.read() as conn:
            (status,) = conn.execute(select(runs.c.status)).one()
    assert [row["step"] for row in rows] == list(range(1, 31))
    assert [row["step"] for row in rows if row["overflow"]] == [8]
    assert status == "finished"


def test_the_rows_handed_over_store_what_the_thread_writer_stores(tmp_path: Path) -> None:
    """Clean steps, an overflow explained, a change by code and a registered LR schedule,
    through the writer process and through the thread writer: the same rows."""
    stored = {}
    for writer in ("process", "thread"):
        url = db_url(tmp_path / f"{writer}.db")
        settings = TelemetrySettings(url, writer=writer)
        gs = scalewatch.GradScaler("cpu", init_scale=2.0**10, growth_interval=3, telemetry=settings)
        _train(gs, 24, inject=(5, 6, 15), control_at=10)
        kind = RemoteTelemetry if writer == "process" else Telemetry
        assert isinstance(gs._session.telemetry, kind)
        gs.close()
        with open_store(url) as store:
            stored[writer] = [
                {k: v for k, v in row.items() if k not in NOT_COMPARED} for row in step_rows(store)
            ]
    assert len(stored["process"]) == 24
    assert stored["process"] == stored["thread"]
    changed = [row["step"] for row in stored["process"] if row["growth_factor"] == 4.0]
    assert changed[0] == 11
    assert {row["schedule_drift"] for row in stored["process"]} >= {0, 1}
    assert any(row["lr"] != stored["process"][0]["lr"] for row in stored["process"])


def test_a_writer_process_killed_is_told_and_training_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="scalewatch.telemetry")
    gs = scalewatch.GradScaler("cpu", telemetry=db_url(tmp_path / "killed.db"))
    _train(gs, 5)
    assert gs.flush(30)
    telemetry = gs._session.telemetry
    assert isinstance(telemetry, RemoteTelemetry)
    os.kill(telemetry.writer_pid, signal.SIGKILL)
    wait_for(
        lambda: any("writer process ended" in r.getMessage() for r in caplog.records),
        30,
        "a warning that the writer process ended",
    )
    _train(gs, 20)  # training goes on
    assert not gs.flush(5)
    gs.close()
    assert gs.stats().steps == 25
    assert gs.stats().dropped_records == 20
    (warning,) = [
        r.getMessage() for r in caplog.records if "writer process ended" in r.getMessage()
    ]
    assert "killed by signal 9" in warning and "\n" not in warning
    # The next run of the process starts a writer process of its own.
    url = db_url(tmp_path / "next.db")
    again = scalewatch.GradScaler("cpu", telemetry=url)
    _train(again, 3)
    again.close()
    with open_store(url) as store:
        assert [row["step"] for row in step_rows(store)] == [1, 2, 3]


@pytest.mark.skipif(not hasattr(signal, "SIGSTOP"), reason="stops a process")
def test_a_stopped_writer_process_costs_the_oldest_steps_as_a_recorded_gap(tmp_path: Path) -> None:
    """The writer process stopped while training runs on: past ``max_pending`` the
    training process drops the oldest steps it could not send, and every step is stored or
    inside a recorded gap once the writer process runs again."""
    url = db_url(tmp_path / "stopped.db")
    settings = TelemetrySettings(url, max_pending=200)
    gs = scalewatch.GradScaler("cpu", growth_interval=10**6, telemetry=settings)
    _train(gs, 5)
    assert gs.flush(30)
    telemetry = gs._session.telemetry
    assert isinstance(telemetry, RemoteTelemetry)
    os.kill(telemetry.writer_pid, signal.SIGSTOP)
    try:
        param = torch.nn.Parameter(torch.zeros(4))
        param.grad = torch.ones(4)
        opt = torch.optim.SGD([param], lr=0.0)
        steps = 5
        # until the connection is full and the training process itself has dropped steps
        while telemetry._lost == 0 and not _dropped_here(telemetry) and steps < 400_000:
            for _ in range(1000):
                gs.unscale_(opt)
                gs.step(opt)
                gs.update()
            steps += 1000
    finally:
        os.kill(telemetry.writer_pid, signal.SIGCONT)
    assert steps < 400_000, "the training process never dropped a step"
    gs.close()
    dropped = gs.stats().dropped_records
    assert 0 < dropped < steps
    with open_store(url) as store:
        stored = [row["step"] for row in step_rows(store)]
        with store.read() as conn:
            gaps = conn.execute(select(telemetry_gaps)).all()
    covered = set(stored)
    for gap in gaps:
        span = set(range(gap.first_step, gap.last_step + 1))
        assert not span & covered
        covered |= span
    assert covered == set(range(1, steps + 1))
    assert sum(gap.dropped for gap in gaps) == dropped == steps - len(stored)


def _dropped_here(telemetry: RemoteTelemetry) -> bool:
    """Whether the training process has put a gap in place of steps it dropped."""
    with telemetry._lock:
        return any(type(item).__name__ == "RecordGap" for item in telemetry._items)


def test_a_writer_process_that_cannot_start_leaves_the_run_to_a_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from scalewatch.telemetry import _remote

    caplog.set_level(logging.WARNING, logger="scalewatch.telemetry")
    monkeypatch.setattr(_remote, "_LINK", None)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-python"))
    url = db_url(tmp_path / "fallback.db")
    gs = scalewatch.GradScaler("cpu", telemetry=url)
    _train(gs, 4)
    assert isinstance(gs._session.telemetry, Telemetry)
    gs.close()
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "could not start the telemetry writer process" in warning and "\n" not in warning
    with open_store(url) as store:
        assert [row["step"] for row in step_rows(store)] == [1, 2, 3, 4]


def test_writer_names_a_known_writer() -> None:
    with pytest.raises(ValueError, match="writer must be one of process, thread"):
        TelemetrySettings("sqlite:///x.db", writer="fork")


def test_flush_returns_false_while_the_writer_process_is_behind(tmp_path: Path) -> None:
    """Another connection holds the store's write lock: the writer process cannot commit,
    flush says so in its time, and says the steps are written once the lock is let go."""
    db = tmp_path / "sw.db"
    gs = scalewatch.GradScaler("cpu", telemetry=TelemetrySettings(f"sqlite:///{db}", retry_s=0.05))
    _train(gs, 3)
    assert gs.flush(30)
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        _train(gs, 2)
        assert gs.flush(0.2) is False
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert gs.flush(30) is True
    gs.close()
    with open_store(db_url(db)) as store:
        assert len(step_rows(store)) == 5


def test_a_run_opened_after_the_environment_changed_goes_to_the_store_it_names_now(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer process lives as long as the training process: a later run's default
    store ($SCALEWATCH_DB) and a relative SQLite path are read by the training process as
    they are at the run's start, not as they were when the writer process started."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SCALEWATCH_DB", db_url(tmp_path / "first.db"))
    first = scalewatch.GradScaler("cpu", telemetry=TelemetrySettings())
    _train(first, 2)
    assert first.flush(30)
    writer_pid = first._session.telemetry.writer_pid
    monkeypatch.setenv("SCALEWATCH_DB", db_url(tmp_path / "second.db"))
    second = scalewatch.GradScaler("cpu", telemetry=TelemetrySettings())
    Path("elsewhere").mkdir()
    monkeypatch.chdir("elsewhere")
    third = scalewatch.GradScaler("cpu", telemetry="third.db")
    for gs in (second, third):
        _train(gs, 3)
    assert second._session.telemetry.writer_pid == third._session.telemetry.writer_pid == writer_pid
    for gs in (first, second, third):
        gs.close()
    for name, steps in (("first.db", 2), ("second.db", 3), ("elsewhere/third.db", 3)):
        with open_store(db_url(tmp_path / name)) as store:
            assert [row["step"] for row in step_rows(store)] == list(range(1, steps + 1)), name
    assert not (tmp_path / "third.db").exists()
