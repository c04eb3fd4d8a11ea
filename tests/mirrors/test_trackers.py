"""Each mirror against its real tracker, read back with the tracker's own reader: TensorBoard's
event files with its EventAccumulator, an MLflow file store with its client, a W&B offline
run from its ``.wandb`` file. Each tracker skips when its extra is not installed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import scalewatch
from scalewatch.mirrors import MLflow, TensorBoard, WandB
from tests._helpers.integrations import instrumented
from tests._helpers.mirrors import STEPS, stored_steps, train

pytestmark = pytest.mark.heavy  # a real tracker each (W&B starts its service process)


def _same(read: list[tuple[int, float]], expected: list[tuple[int, float]]) -> bool:
    """The same steps, with the same values (to float32's precision: TensorBoard's)."""
    steps = [step for step, _ in read] == [step for step, _ in expected]
    return steps and [v for _, v in read] == pytest.approx([v for _, v in expected], rel=1e-6)


def _expected(db_url: str) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    """(step, loss scale) and (step, learning rate) of every step the store holds."""
    rows = stored_steps(db_url)
    assert len(rows) == STEPS
    return [(r["step"], r["scale"]) for r in rows], [(r["step"], r["lr"]) for r in rows]


def test_tensorboard_from_the_environment(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``SCALEWATCH_MIRROR=tensorboard:DIR`` (what ``scalewatch instrument`` and the
    integrations take) writes event files that TensorBoard's own reader reads back."""
    pytest.importorskip("tensorboard", reason="needs pip install scalewatch[tensorboard]")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.setenv("SCALEWATCH_MIRROR", f"tensorboard:{tmp_path / 'tb'}")
    monkeypatch.setenv("SCALEWATCH_DB", db_url)
    with instrumented():  # the script builds torch's scaler: scalewatch instrument's way
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**18)
    assert isinstance(scaler, scalewatch.GradScaler)
    train(scaler)
    scaler.close()
    (mirror,) = scaler.mirrors
    assert isinstance(mirror, TensorBoard) and mirror.failures == 0
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0})
    events.Reload()
    scales, rates = _expected(db_url)
    read = {
        tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]
    }
    assert read["scalewatch/loss_scale"] == scales
    assert _same(read["scalewatch/learning_rate"], rates)
    assert {"scalewatch/overflow", "scalewatch/schedule_drift"} <= set(read)
    (text,) = events.Tags()["tensors"]  # the run's uid and id, as TensorBoard's text
    assert text.startswith("scalewatch/run")

    # The user's own SummaryWriter: written into, and left open for them.
    from torch.utils.tensorboard import SummaryWriter

    theirs = SummaryWriter(str(tmp_path / "theirs"))
    scaler = scalewatch.GradScaler("cpu", telemetry=False)  # the variable's mirror: off
    assert scaler.mirrors == ()
    scaler = scalewatch.GradScaler("cpu", telemetry=db_url, mirrors=[TensorBoard(theirs)])
    train(scaler, 3)
    scaler.close()
    theirs.add_scalar("their/own", 1.0, global_step=4)
    theirs.close()
    events = EventAccumulator(str(tmp_path / "theirs"))
    events.Reload()
    assert [e.step for e in events.Scalars("scalewatch/loss_scale")] == [1, 2, 3]
    assert [e.step for e in events.Scalars("their/own")] == [4]


def test_mlflow_attaches_to_the_active_run_or_starts_one(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In the user's active run on their tracking URI; with none active, a run of its own
    there, ended when the scaler closes. Read back with MlflowClient."""
    mlflow: Any = pytest.importorskip("mlflow", reason="needs pip install scalewatch[mlflow]")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3's opt-in to a file store
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "mlruns").as_uri())
    client = mlflow.MlflowClient()
    with mlflow.start_run() as theirs:
        scaler = scalewatch.GradScaler(
            "cpu", init_scale=2.0**18, telemetry=db_url, mirrors=[MLflow()]
        )
        train(scaler)
        scaler.close()
    scales, rates = _expected(db_url)
    history = client.get_metric_history(theirs.info.run_id, "scalewatch/loss_scale")
    assert [(m.step, m.value) for m in history] == scales
    history = client.get_metric_history(theirs.info.run_id, "scalewatch/learning_rate")
    assert [(m.step, m.value) for m in history] == rates
    tags = client.get_run(theirs.info.run_id).data.tags
    assert tags["scalewatch/run_uid"] == scaler.run_uid
    assert tags["scalewatch/run_id"] == str(scaler.run_id)

    own = MLflow()
    scaler = scalewatch.GradScaler("cpu", init_scale=2.0**18, telemetry=db_url, mirrors=[own])
    train(scaler, 3)
    scaler.close()
    assert mlflow.active_run() is None  # none started in the user's thread
    assert own.run_id is not None and own.run_id != theirs.info.run_id
    run = client.get_run(own.run_id)
    assert run.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(own.run_id, "scalewatch/loss_scale")] == [
        1,
        2,
        3,
    ]


def test_wandb_offline_run(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The active ``wandb.run`` in offline mode: its ``.wandb`` file holds every step
    against ``scalewatch/step``, and its config the scalewatch run's uid and id."""
    wandb: Any = pytest.importorskip("wandb", reason="needs pip install scalewatch[wandb]")
    from tests._helpers.wandb_records import config, history

    monkeypatch.setenv("WANDB_SILENT", "true")
    run = wandb.init(mode="offline", dir=tmp_path, project="scalewatch-test")
    mirror = WandB()
    try:
        scaler = scalewatch.GradScaler(
            "cpu", init_scale=2.0**18, telemetry=db_url, mirrors=[mirror]
        )
        train(scaler)
        scaler.close()
        assert (mirror.failures, mirror.dropped) == (0, 0)
    finally:
        run.finish()
        wandb.teardown()  # its service writes the run's file to its end, and exits
    (path,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    rows = [row for row in history(path) if "scalewatch/step" in row]
    scales, rates = _expected(db_url)
    assert [(row["scalewatch/step"], row["scalewatch/loss_scale"]) for row in rows] == scales
    assert [(r["scalewatch/step"], r["scalewatch/learning_rate"]) for r in rows] == rates
    assert config(path)["scalewatch/run_uid"] == scaler.run_uid

    # No run: the mirror starts one as wandb.init() would (offline here, by WANDB_MODE),
    # from its own thread, and finishes it at close.
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "own"))
    (tmp_path / "own").mkdir()
    mirror = WandB()
    scaler = scalewatch.GradScaler("cpu", telemetry=db_url, mirrors=[mirror])
    try:
        train(scaler, 3)
        scaler.close()
    finally:
        wandb.teardown()
    assert (mirror.failures, mirror.dropped, wandb.run) == (0, 0, None)
    (path,) = (tmp_path / "own" / "wandb").glob("offline-run-*/run-*.wandb")
    assert [row["scalewatch/step"] for row in history(path) if "scalewatch/step" in row] == [
        1,
        2,
        3,
    ]
