"""Each step's record carries the learning rate in effect at ``step()``, read on the host.

The schedule's own values are the truth: what ``param_groups`` held when the optimizer
stepped (or was skipped), step by step, on every optimizer path, overflows included.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import scalewatch
from scalewatch._recording.learning_rates import group_rates
from scalewatch.store import open_store
from tests._helpers.stored import db_url, step_rows
from tests._helpers.twin import INJECT, batch, mlp, poison

Optimizers = Callable[[nn.Module], list[torch.optim.Optimizer]]


def _warmup_then_decay(step: int) -> float:
    return (step + 1) / 4 if step < 4 else 0.9 ** (step - 4)


def _run(
    kind: str,
    url: str,
    optimizers: Optimizers,
    *,
    steps: int = 12,
    device: str = "cpu",
) -> tuple[list[list[list[float]]], list[dict[str, Any]]]:
    """Train with a LambdaLR per optimizer, stepped after every ``step()`` as users do;
    returns what ``param_groups`` held at each ``step()`` and the stored rows."""
    cls = scalewatch.GradScaler if kind == "plain" else scalewatch.ShardedGradScaler
    gs = cls(device, init_scale=2.0**10, growth_interval=2, telemetry=url)
    model = mlp().to(device)
    opts = optimizers(model)
    schedulers = [torch.optim.lr_scheduler.LambdaLR(o, _warmup_then_decay) for o in opts]
    params = list(model.parameters())
    seen = []
    for step in range(steps):
        for opt in opts:
            opt.zero_grad()
        gs.scale(model(batch(step).to(device)).pow(2).mean()).backward()
        for index, value in INJECT.get(step, []):
            poison(params, index, value)
        seen.append([[float(g["lr"]) for g in opt.param_groups] for opt in opts])
        for opt in opts:
            gs.step(opt)
        gs.update()
        for sched in schedulers:
            sched.step()
    assert gs.flush(30)
    run_id = gs.run_id
    gs.close()
    with open_store(url) as store:
        return seen, step_rows(store, run_id)


def _sgd(model: nn.Module) -> list[torch.optim.Optimizer]:
    return [torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)]


def _adam(flavour: str) -> Optimizers:
    def make(model: nn.Module) -> list[torch.optim.Optimizer]:
        return [torch.optim.Adam(model.parameters(), lr=0.01, **{flavour: True})]

    return make


def _fused_supported() -> bool:
    try:
        torch.optim.Adam([nn.Parameter(torch.ones(1))], fused=True)
    except (RuntimeError, ValueError):
        return False
    return True


@pytest.mark.parametrize(
    "optimizers",
    [
        pytest.param(_sgd, id="sgd"),
        pytest.param(_adam("foreach"), id="adam-foreach"),
        pytest.param(
            _adam("fused"),
            id="adam-fused",
            marks=pytest.mark.skipif(not _fused_supported(), reason="no fused Adam here"),
        ),
    ],
)
def test_the_lr_of_each_step_is_the_schedules_own(
    kind: str, device: str, optimizers: Optimizers, tmp_path: Path
) -> None:
    seen, rows = _run(kind, db_url(tmp_path / "sw.db"), optimizers, device=device)
    assert [r["step"] for r in rows] == list(range(1, 13))
    assert [r["overflow"] for r in rows] == [s in INJECT for s in range(12)]
    assert [r["lr"] for r in rows] == [opts[0][0] for opts in seen]
    assert all(r["lr_groups"] is None for r in rows)  # one group: nothing more to say
    assert len({r["lr"] for r in rows}) > 6  # the schedule moved


def _two_optimizers(model: nn.Module) -> list[torch.optim.Optimizer]:
    first, *rest = list(model.parameters())
    grouped = torch.optim.SGD(
        [{"params": [first]}, {"params": rest[:1], "lr": 0.02}], lr=0.05, momentum=0.9
    )
    return [grouped, torch.optim.SGD(rest[1:], lr=0.3)]


def test_groups_and_optimizers_that_differ_are_kept_each(kind: str, tmp_path: Path) -> None:
    seen, rows = _run(kind, db_url(tmp_path / "sw.db"), _two_optimizers)
    assert [r["lr"] for r in rows] == [opts[0][0] for opts in seen]
    assert [json.loads(r["lr_groups"]) for r in rows] == seen


def test_a_tensor_lr_is_read_on_the_cpu_and_never_synced_for_elsewhere(
    kind: str, tmp_path: Path
) -> None:
    def tensor_lr(model: nn.Module) -> list[torch.optim.Optimizer]:
        return [torch.optim.Adam(model.parameters(), lr=torch.tensor(0.01), foreach=False)]

    seen, rows = _run(kind, db_url(tmp_path / "sw.db"), tensor_lr)
    assert [r["lr"] for r in rows] == pytest.approx([opts[0][0] for opts in seen])
    on_device = torch.optim.SGD([nn.Parameter(torch.ones(1))], lr=0.1)
    on_device.param_groups[0]["lr"] = torch.tensor(0.1, device="meta")  # no value to read
    assert group_rates(on_device) == (None,)
