"""Accelerate trains with scalewatch's scaler: set as ``accelerator.scaler``, or instrumented.

``Accelerator(mixed_precision="fp16")`` on the CPU (accelerate 1.15) raises nothing and
builds no scaler (nor autocasts): there the test sets ``accelerator.scaler`` by hand and
autocasts itself. On a GPU it builds ``torch.amp.GradScaler("cuda")``, which
``scalewatch instrument`` makes ours.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import scalewatch
from tests._helpers.integrations import INIT_SCALE, batches, the_run, tiny_model

accelerate = pytest.importorskip(
    "accelerate", reason="needs accelerate: pip install -c constraints.txt '.[integrations]'"
)
from accelerate.state import AcceleratorState  # noqa: E402

pytestmark = pytest.mark.heavy  # real processes or a real trainer: make check leaves it out

STEPS = 20


@pytest.fixture(autouse=True)
def _fresh_accelerator_state() -> Iterator[None]:
    """accelerate keeps one state a process; each test gets its own."""
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


def _train(grad_scaler: Any) -> tuple[list[float], list[bool]]:
    """Scale after each step and whether accelerate says it skipped it."""
    accelerator = accelerate.Accelerator(mixed_precision="fp16", cpu=True)
    assert accelerator.scaler is None  # accelerate builds none on the CPU
    accelerator.scaler = grad_scaler  # before prepare(): the optimizer takes it there
    module = tiny_model()
    model, optimizer = accelerator.prepare(module, torch.optim.SGD(module.parameters(), lr=0.1))
    scales, skipped = [], []
    for x in batches(STEPS):
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = model(x).float().pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
        scales.append(grad_scaler.get_scale())
        skipped.append(optimizer.step_was_skipped)
    AcceleratorState._reset_state(reset_partial_state=True)
    return scales, skipped


def test_accelerate_trains_with_our_scaler_as_with_torchs(db_url: str) -> None:
    theirs = _train(torch.amp.GradScaler("cpu", init_scale=INIT_SCALE))
    ours = scalewatch.GradScaler(
        "cpu", init_scale=INIT_SCALE, telemetry=db_url, run_name="accelerate"
    )
    scales, skipped = _train(ours)
    ours.close()
    assert (scales, skipped) == theirs
    run = the_run(db_url)
    assert (run.name, run.status, run.steps, run.world_size) == ("accelerate", "finished", STEPS, 1)
    assert run.skipped == run.overflows == sum(skipped) > 0
    assert run.scale == scales[-1]


ON_A_GPU = """
import torch
from accelerate import Accelerator

import scalewatch
accelerator = Accelerator(mixed_precision="fp16")
assert isinstance(accelerator.scaler, scalewatch.GradScaler), type(accelerator.scaler)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = accelerator.prepare(model, optimizer)
for step in range(20):
    optimizer.zero_grad()
    with accelerator.autocast():
        loss = model(torch.randn(8, 16, device=accelerator.device)).float().pow(2).mean()
    accelerator.backward(loss)
    optimizer.step()
accelerator.scaler.close()
"""


@pytest.mark.cuda
def test_the_scaler_accelerate_builds_on_a_gpu_is_ours_under_instrument(tmp_path: Path) -> None:
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(ON_A_GPU))
    db = f"sqlite:///{tmp_path / 'sw.db'}"
    command = [
        sys.executable,
        "-m",
        "scalewatch.app",
        "instrument",
        "--db",
        db,
        "--run-name",
        "unedited",
    ]
    done = subprocess.run(
        [*command, "--", sys.executable, str(path)],
        capture_output=True,
        text=True,
        timeout=240,
        env=dict(os.environ),
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    run = the_run(db)
    assert (run.name, run.status, run.steps, run.world_size) == ("unedited", "finished", 20, 1)


def _scheduled(optimizer: str, hold: bool) -> tuple[int, int, int]:
    """``STEPS`` steps through ``AcceleratedScheduler``, the scheduler inside it held or
    not: (its last_epoch, the optimizer steps skipped, those accelerate saw skipped)."""
    accelerator = accelerate.Accelerator(mixed_precision="fp16", cpu=True)
    grad_scaler = scalewatch.GradScaler("cpu", init_scale=INIT_SCALE, telemetry=False)
    accelerator.scaler = grad_scaler
    module = tiny_model()
    opt = (
        torch.optim.Adam(module.parameters(), lr=0.01, fused=True)
        if optimizer == "fused"
        else torch.optim.SGD(module.parameters(), lr=0.1)
    )
    inner = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.99**step)
    if hold:
        grad_scaler.hold(inner)  # the user's scheduler, which AcceleratedScheduler steps
    model, optimizer_, scheduler = accelerator.prepare(module, opt, inner)
    skipped = seen = 0
    for x in batches(STEPS):
        optimizer_.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = model(x).float().pow(2).mean()
        accelerator.backward(loss)
        optimizer_.step()
        scheduler.step()
        skipped += bool(grad_scaler.last_step_skipped)
        seen += optimizer_.step_was_skipped
    AcceleratorState._reset_state(reset_partial_state=True)
    return inner.last_epoch, skipped, seen


def test_holding_composes_with_accelerates_own_skip_handling() -> None:
    """accelerate does not step its scheduler after a step it saw skipped; a held scheduler
    inside it is then simply not called, and is not held twice: it counts the real steps."""
    alone, skipped, seen = _scheduled("sgd", hold=False)
    assert skipped == seen > 0 and alone == STEPS - skipped
    held, skipped, seen = _scheduled("sgd", hold=True)
    assert held == STEPS - skipped  # not STEPS - 2 * skipped


def test_holding_catches_the_fused_skips_accelerate_misses() -> None:
    """A fused optimizer is stepped by torch's scaler with its found_inf even when the step
    is skipped: accelerate's patched step sees a call and says not skipped
    (huggingface/accelerate#4242), and steps the schedule on. Held, the schedule stays."""
    alone, skipped, seen = _scheduled("fused", hold=False)
    assert skipped > 0 and seen == 0 and alone == STEPS
    held, skipped, _ = _scheduled("fused", hold=True)
    assert held == STEPS - skipped
