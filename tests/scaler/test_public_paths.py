"""What code outside the package names: its public import paths, and what saved scalers name.

A pickle names each class by its module. ``golden/*.pickle`` were written when the package
was installed as ``scaler`` (the layout of commit 6ba68f0); they name ``scaler.grad_scaler``,
``scaler.sharded``, ``scaler._extras`` (the scale rules, now ``scalewatch._scale_rules``)
and ``scaler.telemetry``, a top-level name the wheel no
longer installs. Such a pickle of a scaler object is refused by plain ``pickle`` (no
module ``scaler``); the documented checkpoint, ``state_dict()``, is plain data and loads
both ways; and an old object pickle still loads through the unpickler docs/TRAINING.md
gives, which reads ``scaler.*`` as ``scalewatch.*``.
"""

from __future__ import annotations

import importlib
import pickle
from pathlib import Path

import pytest
import torch

import scalewatch
from scalewatch.telemetry import TelemetrySettings

GOLDEN = Path(__file__).parent / "golden"

PUBLIC = [
    ("scalewatch", "GradScaler"),
    ("scalewatch", "ShardedGradScaler"),
    ("scalewatch", "ScalerStats"),
    ("scalewatch.grad_scaler", "GradScaler"),
    ("scalewatch.sharded", "ShardedGradScaler"),
    ("scalewatch.telemetry", "TelemetrySettings"),
    ("scalewatch.store", "open_store"),
    ("scalewatch.store", "Store"),
    ("scalewatch.instrument", "instrument"),
    ("scalewatch.instrument", "uninstrument"),
    ("scalewatch.stats", "ScalerStats"),
    ("scalewatch.stats", "ScalerCheckpoint"),
    ("scalewatch.examples.tiny_lm", "TinyLM"),
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
    assert scalewatch.GradScaler is importlib.import_module("scalewatch.grad_scaler").GradScaler
    sharded = importlib.import_module("scalewatch.sharded")
    assert scalewatch.ShardedGradScaler is sharded.ShardedGradScaler


# Classes that moved within the package since a pickle was made: (module, name) -> new home.
MOVED = {("scalewatch._extras", "Extras"): ("scalewatch._scale_rules", "ScaleRules")}


class RenamedUnpickler(pickle.Unpickler):
    """docs/TRAINING.md's: a class saved under the old name ``scaler`` is ``scalewatch``'s."""

    def find_class(self, module: str, name: str) -> type:
        if module == "scaler" or module.startswith("scaler."):
            module = "scalewatch" + module[len("scaler") :]
        module, name = MOVED.get((module, name), (module, name))
        found: type = super().find_class(module, name)
        return found


def _load_old(path: Path) -> object:
    with path.open("rb") as saved:
        return RenamedUnpickler(saved).load()


def test_a_scaler_pickled_under_the_old_name_is_refused_by_plain_pickle() -> None:
    with pytest.raises(ModuleNotFoundError, match="No module named 'scaler'"):
        pickle.loads((GOLDEN / "grad_scaler.pickle").read_bytes())


def test_new_pickles_and_state_dicts_name_scalewatch_only() -> None:
    gs = scalewatch.GradScaler("cpu", telemetry=False)
    assert b"scalewatch.grad_scaler" in pickle.dumps(gs)
    assert pickle.loads(pickle.dumps(gs)).state_dict() == gs.state_dict()
    assert b"scaler." not in pickle.dumps(gs.state_dict())


def _overflow_step(gs: scalewatch.GradScaler) -> None:
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    gs.scale(model(torch.ones(1, 3)).sum()).backward()
    assert model.weight.grad is not None
    model.weight.grad[0, 0] = float("inf")
    gs.step(optimizer)
    gs.update()


def test_a_grad_scaler_pickled_under_the_old_name_loads_and_trains_on() -> None:
    loaded = _load_old(GOLDEN / "grad_scaler.pickle")
    assert type(loaded) is scalewatch.GradScaler
    assert loaded.state_dict() == GRAD_SCALER_STATE
    # It goes on as a scaler given the same state by load_state_dict(): the hysteresis it
    # had left (1) is spent by the next overflow, which backs the scale off.
    twin = scalewatch.GradScaler("cpu", min_scale=1.0, hysteresis=2, telemetry=False)
    twin.load_state_dict(GRAD_SCALER_STATE)
    for gs in (loaded, twin):
        _overflow_step(gs)
    assert loaded.get_scale() == twin.get_scale() == 512.0
    assert loaded.state_dict() == twin.state_dict()
    assert loaded.steps == 5


def test_a_sharded_scaler_pickled_under_the_old_name_loads_with_its_settings() -> None:
    loaded = _load_old(GOLDEN / "sharded.pickle")
    assert type(loaded) is scalewatch.ShardedGradScaler
    assert (loaded.get_scale(), loaded.max_scale, loaded.min_scale) == (256.0, 4096.0, None)
    assert loaded.state_dict()["growth_interval"] == 7
    assert loaded._telemetry_option == TelemetrySettings(
        "sqlite:///never-opened.db", max_pending=1000
    )
    assert loaded._run_name == "golden"
    assert loaded.run_uid is None


def test_every_module_of_the_package_is_loaded_under_one_name() -> None:
    """Two names for one file would be two modules: two classes, two registries."""
    import os
    import pkgutil
    import sys

    for found in pkgutil.walk_packages(scalewatch.__path__, "scalewatch."):
        if found.name.endswith("__main__") or found.name.startswith("scalewatch.migrations."):
            continue  # running it is its import; Alembic loads the revisions from their files
        importlib.import_module(found.name)
    names: dict[str, list[str]] = {}
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if path and name.split(".")[0] in {"scalewatch", "scaler", "app", "web", "migrations"}:
            names.setdefault(os.path.realpath(path), []).append(name)
    assert len(names) > 100
    assert {path: found for path, found in names.items() if len(found) > 1} == {}
    assert all(name.startswith("scalewatch") for found in names.values() for name in found)
