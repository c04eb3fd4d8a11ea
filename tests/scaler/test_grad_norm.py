"""The gradient norm of every step: ``grad_norm=True``, ``last_grad_norm``, ``record_grad_norm``.

Compared with ``torch.nn.utils.clip_grad_norm_`` over the same unscaled gradients, on a
plain loop, a fused optimizer (whose gradients the scaler measures still scaled), two
optimizers and gradient accumulation, with both classes. (Ranks: test_grad_norm_multirank.)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch import nn

import scalewatch
from tests._helpers.twin import INJECT, batch, fused_adam, mlp, poison, two_optimizers, world1
from tests.scaler._kept_samples import keep_samples

STEPS = 9
Optimizers = Callable[[nn.Module], list[torch.optim.Optimizer]]


def sgd(model: nn.Module) -> list[torch.optim.Optimizer]:
    return [torch.optim.SGD(model.parameters(), lr=0.05)]


OPTIMIZERS: dict[str, Optimizers] = {"sgd": sgd, "fused-adam": fused_adam, "two": two_optimizers}


@pytest.fixture(params=["plain", "sharded"])
def make(request: pytest.FixtureRequest) -> Iterator[Callable[..., Any]]:
    """A scaler of either class (the sharded one in a group of one process)."""
    cls = scalewatch.GradScaler if request.param == "plain" else scalewatch.ShardedGradScaler
    if request.param == "plain":
        yield lambda **kw: cls("cpu", init_scale=256.0, growth_interval=3, **kw)
        return
    with world1():
        yield lambda **kw: cls("cpu", init_scale=256.0, growth_interval=3, **kw)


def clip_norm(params: list[nn.Parameter], divide_by: float = 1.0) -> float:
    """The norm torch's clip_grad_norm_ returns for the gradients of ``params`` (divided
    by ``divide_by``: they are still scaled), taken from copies: clipping by a norm that
    is not finite would write NaN into them."""
    copies = [nn.Parameter(p.detach().clone()) for p in params]
    for copy, param in zip(copies, params, strict=True):
        assert param.grad is not None
        copy.grad = param.grad.detach().clone()
    return float(torch.nn.utils.clip_grad_norm_(copies, float("inf"))) / divide_by


@pytest.mark.parametrize("optimizers", list(OPTIMIZERS))
def test_each_steps_norm_is_clip_grad_norms(make: Callable[..., Any], optimizers: str) -> None:
    gs = make(grad_norm=True)
    samples = keep_samples(gs)
    model = mlp()
    opts = OPTIMIZERS[optimizers](model)
    params = list(model.parameters())
    fused = optimizers == "fused-adam"
    expected: list[float] = []
    for step in range(STEPS):
        for opt in opts:
            opt.zero_grad()
        for micro in range(2):  # gradient accumulation: two backwards, one step
            gs.scale(model(batch(10 * step + micro)).pow(2).mean()).backward()
        for index, value in INJECT.get(step, []):
            poison(params, index, value)
        if fused:  # measured in step(), on the gradients still scaled
            expected.append(clip_norm(params, divide_by=gs.get_scale()))
        else:
            for opt in opts:
                gs.unscale_(opt)
            expected.append(clip_norm(params))
            assert gs.last_grad_norm is not None
            assert float(gs.last_grad_norm) == pytest.approx(expected[-1], rel=1e-6, nan_ok=True)
        for opt in opts:
            gs.step(opt)
        gs.update()
        norm = gs.last_grad_norm
        assert norm is not None and norm.dtype == torch.float32 and norm.dim() == 0
        assert float(norm) == pytest.approx(expected[-1], rel=1e-6, nan_ok=True), step
    assert gs.flush()
    stored = [sample.record.grad_norm for sample in samples]
    for step, (value, want) in enumerate(zip(stored, expected, strict=True)):
        assert (not math.isfinite(want)) == (step in INJECT)
        assert value == pytest.approx(want, rel=1e-6, nan_ok=True), step
    gs.close()


def test_off_by_default_and_a_handed_in_norm_is_recorded(make: Callable[..., Any]) -> None:
    gs = make()
    samples = keep_samples(gs)
    model = mlp()
    (opt,) = sgd(model)
    handed: list[float] = []
    for step in range(4):
        opt.zero_grad()
        gs.scale(model(batch(step)).pow(2).mean()).backward()
        gs.unscale_(opt)
        if step % 2:  # as a loop that clips already: its value, no second pass
            total = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.5)
            gs.record_grad_norm(total)
            assert gs.last_grad_norm is not None
            handed.append(float(total))
        else:
            assert gs.last_grad_norm is None or step > 0
        gs.step(opt)
        gs.update()
    assert gs.flush()
    assert [s.record.grad_norm for s in samples] == [None, handed[0], None, handed[1]]
    gs.close()


def test_a_handed_in_norm_takes_the_place_of_the_measured_one() -> None:
    gs = scalewatch.GradScaler("cpu", telemetry=False, grad_norm=True)
    model = mlp()
    (opt,) = sgd(model)
    gs.scale(model(batch(0)).pow(2).mean()).backward()
    gs.unscale_(opt)
    measured = gs.last_grad_norm
    assert measured is not None and float(measured) > 0
    gs.record_grad_norm(2.5)
    gs.step(opt)
    gs.update()
    assert float(gs.last_grad_norm) == 2.5  # type: ignore[arg-type]


def test_a_bad_norm_or_option_is_refused_in_one_line() -> None:
    gs = scalewatch.GradScaler("cpu", telemetry=False)
    with pytest.raises(ValueError, match="takes one value, got a tensor of 3"):
        gs.record_grad_norm(torch.ones(3))
    with pytest.raises(TypeError, match="takes a tensor or a number, got str"):
        gs.record_grad_norm("1.0")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="grad_norm must be True, False or None, got 'yes'"):
        scalewatch.GradScaler("cpu", telemetry=False, grad_norm="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize("optimizers", ["sgd", "fused-adam"])
def test_each_record_names_its_ten_largest_parameter_norms(
    make: Callable[..., Any], optimizers: str
) -> None:
    gs = make(grad_norm=True)
    samples = keep_samples(gs)
    model = nn.Sequential(*(nn.Linear(4, 4) for _ in range(6)))  # 12 parameters
    gs.watch(model)
    (opt,) = OPTIMIZERS[optimizers](model)
    wanted = []
    for step in range(3):
        opt.zero_grad()
        gs.scale(model(batch(step)).pow(2).mean()).backward()
        scale = gs.get_scale() if optimizers == "fused-adam" else 1.0
        if optimizers == "sgd":
            gs.unscale_(opt)
        norms = {n: float(p.grad.norm()) / scale for n, p in model.named_parameters()}
        wanted.append(sorted(norms.items(), key=lambda item: -item[1])[:10])
        gs.step(opt)
        gs.update()
    assert gs.flush()
    for sample, want in zip(samples, wanted, strict=True):
        got = sample.record.param_norms
        assert [name for name, _ in got] == [name for name, _ in want]
        assert [norm for _, norm in got] == pytest.approx([norm for _, norm in want], rel=1e-5)
    gs.close()


def test_a_runs_spike_rule_is_kept_in_its_config(tmp_path: Any) -> None:
    from scalewatch.store import open_store
    from scalewatch.store.queries import get_run
    from scalewatch.store.spikes import SpikeRule

    url = f"sqlite:///{tmp_path / 'sw.db'}"
    gs = scalewatch.GradScaler("cpu", telemetry=url, spikes=SpikeRule(window=50, z=4.5))
    model = mlp()
    (opt,) = sgd(model)
    gs.scale(model(batch(0)).pow(2).mean()).backward()
    gs.step(opt)
    gs.update()
    assert gs.flush()
    with open_store(url) as store:
        assert get_run(store, gs.run_id).config["spikes"] == {"window": 50, "z": 4.5}
    gs.close()
    with pytest.raises(TypeError, match="spikes takes a SpikeRule, got dict"):
        scalewatch.GradScaler("cpu", telemetry=False, spikes={"window": 50})  # type: ignore[arg-type]


def test_a_spike_reaches_the_store_with_the_parameters_it_came_from(tmp_path: Any) -> None:
    """Through the telemetry writer: the spike found where the steps are stored, with the
    largest parameter norms of its step (and of the overflow's), named as watch() did."""
    from scalewatch.store import open_store
    from scalewatch.store.spike_list import spikes_of

    url = f"sqlite:///{tmp_path / 'sw.db'}"
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # the weights stay: a steady history
    gs = scalewatch.GradScaler("cpu", init_scale=256.0, telemetry=url, grad_norm=True)
    gs.watch(model)
    for step in range(1, 201):
        opt.zero_grad()
        x = torch.randn(64, 8) * (30.0 if step == 150 else 1.0)
        gs.scale(model(x).pow(2).mean()).backward()
        if step == 100:
            model[0].weight.grad[0, 0] = float("inf")
        gs.step(opt)
        gs.update()
    assert gs.flush()
    with open_store(url) as store:
        found = spikes_of(store, gs.run_id)
        with store.read() as conn:
            kept = conn.exec_driver_sql("SELECT DISTINCT step FROM param_norms").fetchall()
    gs.close()
    assert {(s.step, s.what) for s in found} == {(150, "loss"), (150, "grad_norm")}
    names = [p.name for p in found[0].params]
    assert sorted(names) == ["0.bias", "0.weight", "2.bias", "2.weight"]
    assert [p.norm for p in found[0].params] == sorted(
        (p.norm for p in found[0].params), reverse=True
    )
    assert sorted(row[0] for row in kept) == [100, 150]  # the overflow's and the spike's
