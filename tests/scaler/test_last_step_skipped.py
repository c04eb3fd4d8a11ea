"""``last_step_skipped`` says, after each ``update()``, what torch's own scaler did: whether
the step skipped an optimizer for inf/NaN, on every optimizer path, with no added read."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from tests._helpers.twin import (
    FACTORS,
    INJECT,
    fused_adam,
    make_pair,
    mlp,
    sgd,
    skip_unless_torchs_sharded_steps_fused_overflows,
    train,
    twin_run,
    two_optimizers,
    unscale_and_clip,
)


def _foreach_adam(model: nn.Module) -> list[torch.optim.Optimizer]:
    return [torch.optim.Adam(model.parameters(), lr=0.01, foreach=True)]


PATHS = {
    "sgd": (sgd, None),
    "sgd-unscale-clip": (sgd, unscale_and_clip),
    "adam-foreach": (_foreach_adam, None),
    "two-optimizers": (two_optimizers, None),
    "adam-fused": (fused_adam, None),
}


@pytest.mark.parametrize("path", list(PATHS))
def test_it_matches_torchs_own_skip_decision_on_every_step(
    kind: str, device: str, path: str
) -> None:
    optimizers, before_step = PATHS[path]
    if path == "adam-fused" and kind == "sharded" and device == "cpu":
        skip_unless_torchs_sharded_steps_fused_overflows()
    inject = {**INJECT, 5: [(1, float("inf"))]} if path == "two-optimizers" else INJECT
    reference, ours = twin_run(
        kind,
        steps=12,
        inject=inject,
        optimizers=optimizers,
        scaler_kwargs={**FACTORS, "growth_interval": 2},
        before_step=before_step,
        device=device,
    )
    ours.assert_same(reference)
    torchs = [any(per_optimizer) for per_optimizer in reference.skipped_per_optimizer]
    assert torchs.count(True) >= 3
    if path == "adam-fused" and device == "cuda":
        # decided on the device: known once the GPU is past the step, else None, never wrong
        pairs = zip(ours.said_skipped, torchs, strict=True)
        assert all(said in (None, truth) for said, truth in pairs)
        return
    assert ours.said_skipped == torchs


def test_none_before_the_first_step_and_false_without_a_step(kind: str) -> None:
    _, ours = make_pair(kind)
    assert ours.last_step_skipped is None
    model = mlp()
    ours.scale(model(torch.ones(2, 4)).sum()).backward()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ours.unscale_(opt)  # checked, never stepped: nothing was skipped
    ours.update()
    assert ours.last_step_skipped is False


def test_a_disabled_scaler_skips_nothing_it_says_none() -> None:
    ours: Any = make_pair("plain", enabled=False)[1]
    model = mlp()
    train(ours, model, sgd(model), steps=2)
    assert ours.last_step_skipped is None
