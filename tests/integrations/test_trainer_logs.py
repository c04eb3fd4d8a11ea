"""The Trainers' own loggers get each step's loss scale, with no mirror: Lightning's every
logger at each step (its CSVLogger read back), Hugging Face's every ``report_to`` (its
TensorBoard reporter's event files read back with TensorBoard's reader)."""

from __future__ import annotations

import csv
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import scalewatch
from tests._helpers.integrations import INIT_SCALE, batches, tiny_model
from tests._helpers.mirrors import stored_steps
from tests._helpers.waiting import wait_for

pytestmark = pytest.mark.heavy  # a real trainer: make check leaves it out

HOW = "pip install -c constraints.txt '.[integrations,tensorboard]'"
STEPS = 16


def test_lightning_loggers_get_every_step(db_url: str, tmp_path: Path) -> None:
    L = pytest.importorskip("lightning", reason=f"needs lightning: {HOW}")
    from lightning.pytorch.loggers import CSVLogger
    from lightning.pytorch.plugins import MixedPrecision

    from scalewatch.integrations.lightning import LossScaleLogger

    class Regression(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = tiny_model()

        def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
            return self.net(batch[0]).float().pow(2).mean()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    scaler = scalewatch.GradScaler("cpu", init_scale=INIT_SCALE, telemetry=db_url)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        plugins=[MixedPrecision("16-mixed", "cpu", scaler=scaler)],
        callbacks=[LossScaleLogger()],
        logger=CSVLogger(tmp_path, name="csv"),
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    data = torch.utils.data.TensorDataset(torch.cat(batches(STEPS)))
    trainer.fit(Regression(), torch.utils.data.DataLoader(data, batch_size=8))
    scaler.close()
    (path,) = tmp_path.glob("csv/*/metrics.csv")
    with path.open() as file:
        logged = [row for row in csv.DictReader(file) if row.get("scalewatch/loss_scale")]
    stored = stored_steps(db_url)
    assert len(stored) == STEPS
    assert [(int(r["step"]), float(r["scalewatch/loss_scale"])) for r in logged] == [
        (r["step"], r["scale"]) for r in stored
    ]
    assert [float(r["scalewatch/overflow"]) for r in logged] == [r["overflow"] for r in stored]


@pytest.fixture
def _fresh_accelerator_state() -> Iterator[None]:
    yield
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)


@pytest.mark.usefixtures("_fresh_accelerator_state")
def test_hf_trainer_report_to_gets_the_loss_scale(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    transformers = pytest.importorskip("transformers", reason=f"needs transformers: {HOW}")
    pytest.importorskip("accelerate", reason=f"needs accelerate: {HOW}")
    pytest.importorskip("tensorboard", reason=f"needs tensorboard: {HOW}")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from scalewatch.integrations.transformers import report_loss_scale
    from tests.integrations.test_transformers import tiny_gpt2, token_rows

    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))  # its reporter's
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"),
        use_cpu=True,
        fp16=True,
        per_device_train_batch_size=4,
        max_steps=STEPS,
        report_to=["tensorboard"],
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
    )
    trainer = transformers.Trainer(
        model=tiny_gpt2(), args=args, train_dataset=token_rows(4 * STEPS)
    )
    scaler = scalewatch.GradScaler("cpu", init_scale=2.0**127, telemetry=db_url)
    trainer.accelerator.scaler = scaler
    ours = report_loss_scale(trainer)

    class Paced(transformers.TrainerCallback):
        """Steps that take longer than recording them, as a real model's do."""

        def on_step_end(self, args: object, state: Any, control: object, **kw: object) -> None:
            wait_for(lambda: ours.recorded_step == state.global_step, what="the step's record")

    trainer.add_callback(Paced())
    trainer.train()
    scaler.close()
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0})
    events.Reload()
    by_step = {r["step"]: r["scale"] for r in stored_steps(db_url)}
    logged = events.Scalars("train/scalewatch/loss_scale")
    steps = events.Scalars("train/scalewatch/step")
    # every training log, the last (the Trainer's summary) too, each of its own step
    assert [(s.step, s.value) for s in steps] == [(n, n) for n in range(1, STEPS + 1)] + [
        (STEPS, STEPS)
    ]
    assert [v.value for v in logged][:-1] == [by_step[n] for n in range(1, STEPS + 1)]


def test_a_rank_that_does_not_report_does_not_wait_for_steps() -> None:
    """Only the reporting rank's tap is attached and gets steps: a callback's wait at the
    end of training (for the last steps) is the reporting rank's alone."""
    from scalewatch.integrations._tap import StepTap

    started = time.monotonic()
    assert StepTap().take(until=5, timeout=30.0) == []
    assert time.monotonic() - started < 5.0
