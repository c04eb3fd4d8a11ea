"""What code outside the package names: its public import paths, and what saved scalers name.

A pickle names each class by its module, so a module moved inside ``scaler/`` would break
every pickle saved before the move. ``golden/*.pickle`` were written by the layout of
commit 6ba68f0 (before ``scaler/`` was grouped into packages); they name
``scaler.grad_scaler``, ``scaler.sharded``, ``scaler._extras`` and ``scaler.telemetry``.
"""

from __future__ import annotations

import importlib
import pickle
from pathlib import Path

import pytest
import torch

import scaler
from scaler.telemetry import TelemetrySettings

GOLDEN = Path(__file__).parent / "golden"

PUBLIC = [
    ("scaler", "GradScaler"),
    ("scaler", "ShardedGradScaler"),
    ("scaler", "ScalerStats"),
    ("scaler.grad_scaler", "GradScaler"),
    ("scaler.sharded", "ShardedGradScaler"),
    ("scaler.telemetry", "TelemetrySettings"),
    ("scaler.store", "open_store"),
    ("scaler.store", "Store"),
    ("scaler.instrument", "instrument"),
    ("scaler.instrument", "uninstrument"),
    ("scaler.stats", "ScalerStats"),
    ("scaler.stats", "ScalerCheckpoint"),
    ("scaler.examples.tiny_lm", "TinyLM"),
]

# The state_dict() of the scaler in golden/grad_scaler.pickle when it was saved.
GRAD_SCALER_STATE = {
    "scale": 1024.0,
    "growth_factor": 2.0,
    "backoff_factor": 0.5,
    "growth_interval": 3,
    "_growth_tracker": 2,
    "scalewatch": {
        "step": 4,
        "run_uid": None,
        "min_scale": 1.0,
        "max_scale": None,
        "hysteresis": 2,
        "hysteresis_tracker": 1,
        "control_version": 0,
    },
}


@pytest.mark.parametrize(("module", "name"), PUBLIC)
def test_every_public_path_imports(module: str, name: str) -> None:
    assert getattr(importlib.import_module(module), name).__name__ == name


def test_the_package_and_the_class_modules_give_the_same_classes() -> None:
    assert scaler.GradScaler is importlib.import_module("scaler.grad_scaler").GradScaler
    assert scaler.ShardedGradScaler is importlib.import_module("scaler.sharded").ShardedGradScaler


def _overflow_step(gs: scaler.GradScaler) -> None:
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    gs.scale(model(torch.ones(1, 3)).sum()).backward()
    assert model.weight.grad is not None
    model.weight.grad[0, 0] = float("inf")
    gs.step(optimizer)
    gs.update()


def test_a_grad_scaler_pickled_before_the_move_loads_and_trains_on() -> None:
    loaded = pickle.loads((GOLDEN / "grad_scaler.pickle").read_bytes())
    assert type(loaded) is scaler.GradScaler
    assert loaded.state_dict() == GRAD_SCALER_STATE
    # It goes on as a scaler given the same state by load_state_dict(): the hysteresis it
    # had left (1) is spent by the next overflow, which backs the scale off.
    twin = scaler.GradScaler("cpu", min_scale=1.0, hysteresis=2, telemetry=False)
    twin.load_state_dict(GRAD_SCALER_STATE)
    for gs in (loaded, twin):
        _overflow_step(gs)
    assert loaded.get_scale() == twin.get_scale() == 512.0
    assert loaded.state_dict() == twin.state_dict()
    assert loaded.steps == 5


def test_a_sharded_scaler_pickled_before_the_move_loads_with_its_settings() -> None:
    loaded = pickle.loads((GOLDEN / "sharded.pickle").read_bytes())
    assert type(loaded) is scaler.ShardedGradScaler
    assert (loaded.get_scale(), loaded.max_scale, loaded.min_scale) == (256.0, 4096.0, None)
    assert loaded.state_dict()["growth_interval"] == 7
    assert loaded._telemetry_option == TelemetrySettings(
        "sqlite:///never-opened.db", max_pending=1000
    )
    assert loaded._run_name == "golden"
    assert loaded.run_uid is None
