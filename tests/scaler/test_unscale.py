"""unscale_: 1/scale kept while the scale is unchanged, and gradients checked in place.

The differential tests compare whole trainings with torch's; these pin the two shortcuts
unscale_ takes to match torch's numbers at less cost: the inverse of the scale is taken
again whenever the scale tensor changed in place (growth, backoff, a loaded state, a
control), and on one device the gradients are checked against found_inf itself.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import scalewatch


def make(kind: str, **kwargs: Any) -> Any:
    cls = scalewatch.GradScaler if kind == "plain" else scalewatch.ShardedGradScaler
    return cls("cpu", telemetry=False, **kwargs)


def unscaled_grad(gs: Any, value: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(the gradient after unscale_, its found_inf) of a one-parameter optimizer whose
    gradient was ``value`` times the current scale."""
    param = nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([param], lr=0.1)
    param.grad = torch.full((2,), value) * gs.get_scale()
    gs.unscale_(opt)
    found = gs._per_optimizer_states[id(opt)]["found_inf_per_device"]
    gs._per_optimizer_states.clear()  # not stepped: let the next call unscale afresh
    return param.grad, next(iter(found.values()))


def test_the_inverse_is_kept_until_the_scale_changes_in_place(kind: str) -> None:
    gs = make(kind, init_scale=1024.0)
    gs.scale(torch.ones(()))  # makes the scale tensor
    scale = gs._scale
    first = gs._step_context.inverse_of(scale)
    assert gs._step_context.inverse_of(scale) is first  # unchanged: not taken again
    assert first.item() == 1 / 1024
    scale.mul_(0.25)
    assert gs._step_context.inverse_of(scale).item() == 1 / 256
    scale.fill_(3.0)
    assert (
        gs._step_context.inverse_of(scale).item()
        == torch.tensor(1 / 3.0, dtype=torch.float32).item()
    )


def test_growth_backoff_and_a_loaded_state_unscale_by_the_new_scale(kind: str) -> None:
    gs = make(kind, init_scale=64.0, growth_interval=1)
    gs.scale(torch.ones(()))
    grad, _ = unscaled_grad(gs)
    assert grad.tolist() == [1.0, 1.0]
    gs._scale.mul_(2.0)  # as a growth does
    grad, _ = unscaled_grad(gs, 3.0)
    assert grad.tolist() == [3.0, 3.0]
    gs.load_state_dict({**gs.state_dict(), "scale": 8.0})
    assert gs.get_scale() == 8.0
    grad, _ = unscaled_grad(gs, 5.0)
    assert grad.tolist() == [5.0, 5.0]


def test_a_training_that_backs_off_unscales_each_step_by_its_scale(kind: str) -> None:
    gs = make(kind, init_scale=2.0**12, growth_interval=2, backoff_factor=0.5)
    param = nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([param], lr=0.0)
    for step in range(8):
        used = gs.get_scale()
        opt.zero_grad()
        gs.scale((param * (step + 1.0)).sum()).backward()
        if step in (2, 5):
            param.grad[0] = float("inf")
        gs.unscale_(opt)
        if step not in (2, 5):  # the gradient is (step + 1) unscaled by the scale it used
            assert param.grad.tolist() == [step + 1.0] * 3, (step, used)
        gs.step(opt)
        gs.update()
    assert gs.stats().backoffs == 2 and gs.stats().growths >= 1


def test_an_inference_mode_scale_is_inverted_without_keeping(kind: str) -> None:
    gs = make(kind, init_scale=16.0)
    with torch.inference_mode():
        scale = torch.full((), 16.0)
    assert gs._step_context.inverse_of(scale).item() == 1 / 16
    assert gs._step_context.inverse is None


def test_one_device_checks_against_found_inf_itself(kind: str) -> None:
    gs = make(kind)
    gs.scale(torch.ones(()))
    _, clean = unscaled_grad(gs)
    assert clean.item() == 0.0
    _, found = unscaled_grad(gs, float("inf"))
    assert found.item() == 1.0
    assert found.shape == ((1,) if kind == "sharded" else ())  # as torch's classes make it


def test_fp16_gradients_are_refused_by_gradscaler_as_torchs() -> None:
    gs = make("plain")
    gs.scale(torch.ones(()))
    param = nn.Parameter(torch.zeros(2, dtype=torch.float16))
    param.grad = torch.ones(2, dtype=torch.float16)
    with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients"):
        gs.unscale_(torch.optim.SGD([param], lr=0.1))
