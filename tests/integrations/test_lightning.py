"""Lightning (Fabric and Trainer) trains with scalewatch's scalers, handed in or instrumented.

Lightning's ``MixedPrecision("16-mixed", "cpu", scaler=...)`` autocasts to fp16 on the CPU
too, so the first steps overflow here as on a GPU. Its FSDP strategy needs CUDA.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import scalewatch
from tests._helpers.integrations import INIT_SCALE, batches, instrumented, the_run, tiny_model

L = pytest.importorskip(
    "lightning", reason="needs lightning: pip install -c constraints.txt '.[integrations]'"
)
from lightning.fabric.plugins import MixedPrecision as FabricMixedPrecision  # noqa: E402
from lightning.pytorch.plugins import MixedPrecision  # noqa: E402

pytestmark = pytest.mark.heavy  # real processes or a real trainer: make check leaves it out

STEPS = 20


def _fabric_scales(grad_scaler: Any) -> tuple[list[float], list[torch.Tensor]]:
    """The scale after each of STEPS steps of Fabric training, and the trained parameters."""
    fabric = L.Fabric(
        accelerator="cpu",
        devices=1,
        plugins=[FabricMixedPrecision("16-mixed", "cpu", scaler=grad_scaler)],
    )
    module = tiny_model()
    model, optimizer = fabric.setup(module, torch.optim.SGD(module.parameters(), lr=0.1))
    scales = []
    for x in batches(STEPS):
        optimizer.zero_grad()
        fabric.backward(model(x).float().pow(2).mean())
        optimizer.step()
        scales.append(grad_scaler.get_scale())
    return scales, [p.detach().clone() for p in model.parameters()]


def test_fabric_trains_with_our_scaler_as_with_torchs(db_url: str) -> None:
    theirs, their_params = _fabric_scales(torch.amp.GradScaler("cpu", init_scale=INIT_SCALE))
    ours = scalewatch.GradScaler("cpu", init_scale=INIT_SCALE, telemetry=db_url, run_name="fabric")
    scales, params = _fabric_scales(ours)
    ours.close()
    assert scales == theirs
    assert all(torch.equal(a, b) for a, b in zip(params, their_params, strict=True))
    backoffs = sum(b < a for a, b in zip([INIT_SCALE, *theirs], theirs, strict=False))
    run = the_run(db_url)
    assert (run.name, run.status, run.steps, run.world_size) == ("fabric", "finished", STEPS, 1)
    assert run.overflows == run.skipped == backoffs > 0
    assert run.scale == theirs[-1]


class Regression(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = tiny_model()

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self.net(batch[0]).float().pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(precision: MixedPrecision, root: Path, steps: int = STEPS) -> Regression:
    data = torch.utils.data.TensorDataset(torch.cat(batches(steps)))
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        plugins=[precision],
        default_root_dir=root,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    module = Regression()
    trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=8))
    assert trainer.global_step == steps
    return module


def test_trainer_fits_a_lightning_module_with_our_scaler(db_url: str, tmp_path: Path) -> None:
    theirs = torch.amp.GradScaler("cpu", init_scale=INIT_SCALE)
    their_module = _fit(MixedPrecision("16-mixed", "cpu", scaler=theirs), tmp_path)
    ours = scalewatch.GradScaler("cpu", init_scale=INIT_SCALE, telemetry=db_url, run_name="trainer")
    module = _fit(MixedPrecision("16-mixed", "cpu", scaler=ours), tmp_path)
    ours.close()
    pairs = zip(module.parameters(), their_module.parameters(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)
    run = the_run(db_url)
    assert (run.name, run.status, run.steps, run.world_size) == ("trainer", "finished", STEPS, 1)
    assert run.scale == theirs.get_scale() < INIT_SCALE
    assert run.skipped == run.overflows > 0


def test_the_scaler_lightning_builds_is_ours_under_instrument(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = f"sqlite:///{tmp_path / 'instrumented.db'}"
    monkeypatch.setenv("SCALEWATCH_DB", db)
    monkeypatch.setenv("SCALEWATCH_RUN_NAME", "unedited")
    with instrumented():
        precision = MixedPrecision("16-mixed", "cpu")  # Lightning builds torch.amp.GradScaler
        assert isinstance(precision.scaler, scalewatch.GradScaler)
        _fit(precision, tmp_path, steps=10)
        precision.scaler.close()
    run = the_run(db)
    assert (run.name, run.status, run.steps, run.world_size) == ("unedited", "finished", 10, 1)


@pytest.mark.parametrize("plugins", ["lightning.fabric.plugins", "lightning.pytorch.plugins"])
def test_fsdp_precision_takes_our_scaler_only_afterwards_or_instrumented(plugins: str) -> None:
    """Lightning 2.6's FSDPPrecision("16-mixed", scaler=...) raises for any scaler (it checks
    the precision before it sets it), as docs/TRAINING.md says; ``precision.scaler = ...`` after
    it, or ``instrument``, is the way in. Its FSDP needs CUDA: the training is below."""
    fsdp_precision = importlib.import_module(plugins).FSDPPrecision
    with pytest.raises(ValueError, match="does not use a scaler"):
        fsdp_precision("16-mixed", scaler=scalewatch.ShardedGradScaler("cpu", telemetry=False))
    with instrumented(), warnings.catch_warnings():
        # It builds ShardedGradScaler() for "cuda", which torch's __init__ disables without one.
        warnings.filterwarnings("ignore", "torch.cuda.amp.GradScaler is enabled, but CUDA")
        built = fsdp_precision("16-mixed").scaler
    assert isinstance(built, scalewatch.ShardedGradScaler)
    built.close()


FSDP_FABRIC = """
import torch
from lightning.fabric import Fabric
from lightning.fabric.plugins import FSDPPrecision
from lightning.fabric.strategies import FSDPStrategy
from scalewatch import ShardedGradScaler

precision = FSDPPrecision("16-mixed")
precision.scaler = ShardedGradScaler("cuda", init_scale=2.0**24, run_name="fabric-fsdp")
fabric = Fabric(accelerator="cuda", devices=1, strategy=FSDPStrategy(), plugins=[precision])
fabric.launch()
model = fabric.setup_module(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 1)))
optimizer = fabric.setup_optimizers(torch.optim.SGD(model.parameters(), lr=0.1))
for step in range(20):
    optimizer.zero_grad()
    fabric.backward(model(torch.randn(8, 16, device="cuda")).float().pow(2).mean())
    optimizer.step()
precision.scaler.close()
"""

FSDP_TRAINER = """
import lightning as L
import torch
from scalewatch import ShardedGradScaler


class Regression(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 1))

    def training_step(self, batch, batch_idx):
        return self.net(batch[0]).float().pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


data = torch.utils.data.TensorDataset(torch.randn(160, 16))
trainer = L.Trainer(accelerator="cuda", devices=1, strategy="fsdp", precision="16-mixed",
                    max_epochs=1, logger=False, enable_checkpointing=False)
trainer.fit(Regression(), torch.utils.data.DataLoader(data, batch_size=8))
assert isinstance(trainer.precision_plugin.scaler, ShardedGradScaler)
trainer.precision_plugin.scaler.close()
"""


def _run_script(tmp_path: Path, script: str, *prefix: str) -> None:
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(script))
    env = {**os.environ, "SCALEWATCH_DB": f"sqlite:///{tmp_path / 'sw.db'}"}
    done = subprocess.run(
        [*prefix, sys.executable, str(path)],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.cuda
def test_fabric_fsdp_trains_with_our_sharded_scaler(tmp_path: Path) -> None:
    _run_script(tmp_path, FSDP_FABRIC)
    run = the_run(f"sqlite:///{tmp_path / 'sw.db'}")
    assert (run.name, run.status, run.steps, run.world_size) == ("fabric-fsdp", "finished", 20, 1)
    assert run.overflows > 0


@pytest.mark.cuda
def test_trainer_fsdp_under_scalewatch_instrument(tmp_path: Path) -> None:
    instrument = [
        sys.executable,
        "-m",
        "scalewatch.app",
        "instrument",
        "--run-name",
        "trainer-fsdp",
        "--",
    ]
    _run_script(tmp_path, FSDP_TRAINER, *instrument)
    run = the_run(f"sqlite:///{tmp_path / 'sw.db'}")
    assert (run.name, run.status, run.steps, run.world_size) == ("trainer-fsdp", "finished", 20, 1)


class Scheduled(Regression):
    """A scheduler stepped by the Trainer after every optimizer step; ``hold``: held by the
    scaler (all ``hold`` needs under the Trainer: the Trainer calls ``scheduler.step()``, the
    instance's, which the scaler wrapped)."""

    def __init__(self, grad_scaler: Any, hold: bool) -> None:
        super().__init__()
        self.grad_scaler, self.hold = grad_scaler, hold
        self.scheduler: Any = None

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.99**step)
        if self.hold:
            self.grad_scaler.hold(self.scheduler)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": self.scheduler, "interval": "step"},
        }


@pytest.mark.parametrize("hold", [False, True], ids=["torchs", "held"])
def test_the_trainer_steps_a_held_scheduler_only_on_real_steps(
    db_url: str, tmp_path: Path, hold: bool
) -> None:
    ours = scalewatch.GradScaler("cpu", init_scale=INIT_SCALE, telemetry=db_url, run_name="held")
    data = torch.utils.data.TensorDataset(torch.cat(batches(STEPS)))
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        plugins=[MixedPrecision("16-mixed", "cpu", scaler=ours)],
        default_root_dir=tmp_path,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    module = Scheduled(ours, hold)
    trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=8))
    ours.close()
    run = the_run(db_url)
    assert trainer.global_step == STEPS and run.skipped > 0
    expected = STEPS - run.skipped if hold else STEPS
    assert module.scheduler.last_epoch == expected
    if hold:
        assert run.config["schedulers"] == [{"name": "LambdaLR", "held": True}]
        assert run.schedule_drift == 0
