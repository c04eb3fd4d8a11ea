"""A recording scaler's life: dropped without close(), loaded mid-run, flushed, closed."""

from __future__ import annotations

import gc
import logging
import subprocess
import sys
import threading
from copy import deepcopy
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from scalewatch import GradScaler, ShardedGradScaler
from scalewatch._recording import recorder as _recorder
from scalewatch.store import open_store
from scalewatch.store.schema import runs, steps
from scalewatch.telemetry import TelemetrySettings, _writer
from tests._helpers.twin import mlp, sgd, train_step
from tests._helpers.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]

DROPPED = """
import sys
import torch
import scalewatch
def main():
    gs = getattr(scalewatch, sys.argv[2])("cpu", telemetry=sys.argv[1], run_name="dropped")
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(300):
        opt.zero_grad()
        gs.scale(model(torch.ones(2, 4)).sum()).backward()
        gs.step(opt)
        gs.update()

main()
"""


def stored(url: str) -> tuple[list[tuple[str, str]], list[tuple[int, int]]]:
    """(name, status) of each run, and (run id, step) of each step row."""
    with open_store(url) as store, store.read() as conn:
        run_list = [(r.name, r.status) for r in conn.execute(select(runs).order_by(runs.c.id))]
        step_list = [(r.run_id, r.step) for r in conn.execute(select(steps.c.run_id, steps.c.step))]
    return run_list, sorted(step_list)


def by_run(url: str) -> list[list[int]]:
    """The stored steps of each run, runs in id order."""
    steps_of: dict[int, list[int]] = {}
    for run_id, step in stored(url)[1]:
        steps_of.setdefault(run_id, []).append(step)
    return [steps_of[run_id] for run_id in sorted(steps_of)]


def train_steps(gs: Any, steps: range) -> None:
    """``gs`` through ``steps`` of a small model."""
    model = mlp()
    opt = sgd(model)[0]
    for step in steps:
        train_step(gs, model, opt, step)


@pytest.mark.heavy
@pytest.mark.parametrize("cls", ["GradScaler", "ShardedGradScaler"])
def test_a_scaler_never_closed_in_a_function_that_returns_loses_no_step(
    tmp_path: Path, cls: str
) -> None:
    """The swap-one-import user: the scaler is a local of main(), the script ends with it."""
    url = f"sqlite:///{tmp_path / 'sw.db'}"
    script = tmp_path / "dropped.py"
    script.write_text(DROPPED)
    done = subprocess.run(
        [sys.executable, str(script), url, cls],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    run_list, step_list = stored(url)
    assert run_list == [("dropped", "finished")]
    assert [step for _, step in step_list] == list(range(1, 301))


@pytest.mark.parametrize("writer", ["process", "thread"])
@pytest.mark.parametrize("cls", [GradScaler, ShardedGradScaler])
def test_a_dropped_scaler_is_closed_and_its_threads_end(
    tmp_path: Path, cls: type, writer: str
) -> None:
    """The threads that are the run's end with it; a writer process's link to the training
    process is the process's, shared by its runs, and stays."""
    url = f"sqlite:///{tmp_path / 'sw.db'}"
    gs = cls("cpu", telemetry=TelemetrySettings(url, writer=writer), run_name="dropped")
    train_steps(gs, range(1, 21))
    telemetry = gs._session.telemetry
    threads = [gs._session.recorder.thread]
    if writer == "thread":
        threads += telemetry.threads
    del gs
    gc.collect()
    for thread in threads:
        if thread is not None:
            thread.join(30)
            assert not thread.is_alive(), thread.name
    assert telemetry.closed
    assert stored(url)[0] == [("dropped", "finished")]
    assert by_run(url) == [list(range(1, 21))]


def test_loading_another_runs_state_into_a_recording_scaler_keeps_each_runs_steps(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'sw.db'}"
    first = GradScaler("cpu", telemetry=url, run_name="A")
    train_steps(first, range(1, 6))
    saved = first.state_dict()
    first.close()

    other = GradScaler("cpu", telemetry=url, run_name="C")
    train_steps(other, range(1, 3))
    assert other.flush(30)
    c_id = other.run_id
    other.load_state_dict(saved)  # C's two steps stay in C; A goes on from step 5
    assert other.steps == 5 and other.run_uid == saved["scalewatch"]["run_uid"]
    assert other.run_id == c_id  # until the next update() opens A again
    train_steps(other, range(6, 9))
    other.close()

    assert stored(url)[0] == [("A", "finished"), ("C", "finished")]
    assert by_run(url) == [list(range(1, 9)), [1, 2]]


def test_loading_a_torch_dict_into_a_recording_scaler_starts_a_new_run(tmp_path: Path) -> None:
    import torch

    url = f"sqlite:///{tmp_path / 'sw.db'}"
    gs = GradScaler("cpu", telemetry=url, run_name="first")
    train_steps(gs, range(1, 4))
    gs.load_state_dict(torch.amp.GradScaler("cpu", init_scale=8.0).state_dict())
    assert gs.steps == 0 and gs.run_uid is None
    train_steps(gs, range(1, 3))
    gs.close()
    assert [status for _, status in stored(url)[0]] == ["finished", "finished"]
    assert by_run(url) == [[1, 2, 3], [1, 2]]


def test_flush_returns_false_when_the_recorder_is_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = threading.Event()
    original = _recorder._materialise

    def slow(*args: Any, **kwargs: Any) -> Any:
        release.wait(60)
        return original(*args, **kwargs)

    monkeypatch.setattr(_recorder, "_materialise", slow)
    # A cpu run read by a recorder thread: one whose store a thread writes (with a writer
    # process the training thread hands the rows over itself; test_writer_process).
    gs = GradScaler(
        "cpu", telemetry=TelemetrySettings(f"sqlite:///{tmp_path / 'sw.db'}", writer="thread")
    )
    train_steps(gs, range(1, 2))
    assert gs.flush(0.2) is False
    with pytest.raises(TimeoutError):
        gs.stats(timeout=0.2)
    release.set()
    assert gs.flush(30) is True
    assert gs.stats().steps == 1
    gs.close()


def _close_failing_soon(db: Path) -> TelemetrySettings:
    """A store that close() waits 0.3 s for once it fails."""
    return TelemetrySettings(f"sqlite:///{db}", close_failing_s=0.3)


def test_close_waits_only_briefly_for_a_store_that_is_failing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    gs = GradScaler("cpu", telemetry=_close_failing_soon(tmp_path / "missing" / "sw.db"))
    train_steps(gs, range(1, 4))
    telemetry = gs._session.telemetry
    wait_for(lambda: telemetry.failing, 30, "the writer to find the store failing")
    closer = threading.Thread(target=gs.close)
    with caplog.at_level(logging.WARNING, logger="scalewatch.telemetry"):
        closer.start()
        closer.join(20)  # 30 s, the close() default, before the bound
        assert not closer.is_alive()
    assert "waiting up to 0.3 s for 3 records" in caplog.text
    assert "3 telemetry records not written at close" in caplog.text
    assert gs.stats().dropped_records == 3  # the records the store never took are counted


def test_close_waits_only_briefly_for_a_store_that_fails_while_it_waits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A short script that exits before its writer first tried the store (a mistyped path)."""
    tried = threading.Event()
    original = _writer.open_store

    def open_later(url: str | None = None) -> Any:
        tried.wait(60)
        return original(url)

    monkeypatch.setattr(_writer, "open_store", open_later)
    gs = GradScaler("cpu", telemetry=_close_failing_soon(tmp_path / "missing" / "sw.db"))
    train_steps(gs, range(1, 4))
    telemetry = gs._session.telemetry
    closer = threading.Thread(target=gs.close)
    with caplog.at_level(logging.WARNING, logger="scalewatch.telemetry"):
        closer.start()
        wait_for(lambda: telemetry.closed, 30, "close() to start")
        assert telemetry.failing is None  # not failing yet when close() began waiting
        tried.set()
        closer.join(20)  # 30 s, the close() default, before the bound
        assert not closer.is_alive()
    assert "waiting up to 0.3 s for 3 records" in caplog.text
    assert "3 telemetry records not written at close" in caplog.text
    assert gs.stats().dropped_records == 3


def test_run_id_outlives_close(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'sw.db'}"
    with GradScaler("cpu", telemetry=url) as gs:
        train_steps(gs, range(1, 2))
        assert gs.flush(30)
        run_id = gs.run_id
    assert run_id is not None and gs.run_id == run_id


@pytest.mark.parametrize("copy", ["deepcopy", "state_dict"])
def test_a_copy_recording_beside_its_original_writes_a_run_of_its_own(
    tmp_path: Path, copy: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"sqlite:///{tmp_path / 'sw.db'}"
    original = GradScaler("cpu", telemetry=url, run_name="original")
    train_steps(original, range(1, 3))
    if copy == "deepcopy":
        twin = deepcopy(original)
    else:
        twin = GradScaler("cpu", telemetry=url, run_name="twin")
        twin.load_state_dict(original.state_dict())
    with caplog.at_level(logging.WARNING, logger="scalewatch.telemetry"):
        train_steps(original, range(3, 5))
        train_steps(twin, range(3, 5))
        twin.flush(30)
    assert "starts a run of its own" in caplog.text
    assert twin.run_uid != original.run_uid
    original.close()
    twin.close()
    assert sorted(by_run(url)) == [[1, 2, 3, 4], [3, 4]]
