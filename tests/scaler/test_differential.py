"""torch's scalers and ours side by side: same model, data and injected inf/NaN, same results.

Each test runs the same loop under torch's class and ours and compares the scale
after every step, the growth tracker, which steps were skipped, what ``step()``
returned and the final parameters bit for bit.
"""

from __future__ import annotations

import copy
import inspect
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler as TorchSharded

import scalewatch
from scalewatch import _torch_compat as compat
from tests._helpers.twin import (
    FACTORS,
    INJECT,
    batch,
    fused_adam,
    make_pair,
    mlp,
    poison,
    sgd,
    skip_unless_torchs_sharded_steps_fused_overflows,
    train,
    twin_run,
    two_optimizers,
    unscale_and_clip,
    world1,
)


def test_non_trivial_factors(kind: str, device: str) -> None:
    kwargs = {**FACTORS, "growth_interval": 2}
    reference, ours = twin_run(kind, steps=16, inject=INJECT, scaler_kwargs=kwargs, device=device)
    ours.assert_same(reference)
    assert reference.skipped.count(True) == 3
    assert len(set(reference.scales)) > 3  # the sequence grew and backed off


def test_consecutive_overflows_and_growth_interval_one(kind: str, device: str) -> None:
    inject = {s: [(2, float("nan"))] for s in (1, 2, 3, 4, 9)}
    kwargs = {**FACTORS, "growth_interval": 1}
    reference, ours = twin_run(kind, steps=12, inject=inject, scaler_kwargs=kwargs, device=device)
    ours.assert_same(reference)


def autocast_forward(model: nn.Module, step: int) -> torch.Tensor:
    x = batch(step).to(next(model.parameters()).device)
    with torch.autocast(x.device.type, dtype=torch.float16):
        return model(x).float().pow(2).mean()


def test_autocast_fp16_training(kind: str, device: str) -> None:
    reference, ours = twin_run(
        kind,
        steps=12,
        inject=INJECT,
        forward=autocast_forward,
        scaler_kwargs={**FACTORS, "growth_interval": 2},
        device=device,
    )
    ours.assert_same(reference)
    assert reference.skipped.count(True) == 3


def test_several_optimizers(kind: str, device: str) -> None:
    # each optimizer skips on its own gradients' inf/NaN; any of them backs the scale off
    inject = {1: [(0, float("inf"))], 4: [(3, float("nan"))], 5: [(1, float("inf"))]}
    reference, ours = twin_run(
        kind,
        steps=10,
        inject=inject,
        optimizers=two_optimizers,
        scaler_kwargs={**FACTORS, "growth_interval": 3},
        device=device,
    )
    ours.assert_same(reference)
    expected = {1: (True, False), 4: (False, True), 5: (True, False)}
    assert reference.skipped_per_optimizer == [expected.get(s, (False, False)) for s in range(10)]
    assert len(set(reference.scales)) > 2


def test_unscale_then_clip_then_step(kind: str, device: str) -> None:
    reference, ours = twin_run(
        kind,
        steps=12,
        inject=INJECT,
        optimizers=two_optimizers,
        scaler_kwargs={**FACTORS, "growth_interval": 2},
        before_step=unscale_and_clip,
        device=device,
    )
    ours.assert_same(reference)


@pytest.mark.parametrize("unscale_first", [False, True], ids=["step", "unscale-clip-step"])
def test_fused_adam(kind: str, device: str, unscale_first: bool) -> None:
    if kind == "sharded" and unscale_first:
        # torch's sharded found_inf has shape (1,); fused Adam's in-place step count is 0-d
        messages = []
        for gs in make_pair(kind, init_scale=64.0, device=device):
            model = mlp().to(device)
            with pytest.raises(RuntimeError) as caught:
                train(gs, model, fused_adam(model), steps=1, before_step=unscale_and_clip)
            messages.append(str(caught.value))
        assert messages[0] == messages[1]
        assert "doesn't match the broadcast shape" in messages[0]
        return
    if kind == "sharded" and device == "cpu":
        skip_unless_torchs_sharded_steps_fused_overflows()
    reference, ours = twin_run(
        kind,
        steps=12,
        inject=INJECT,
        optimizers=fused_adam,
        scaler_kwargs={**FACTORS, "growth_interval": 2},
        before_step=unscale_and_clip if unscale_first else None,
        device=device,
    )
    ours.assert_same(reference)
    assert reference.skipped.count(True) == 3


class LegacyScalingSGD(torch.optim.SGD):
    """An optimizer on the old protocol: step() takes the scaler as ``grad_scaler``."""

    _step_supports_amp_scaling = True

    def step(self, closure: Any = None, grad_scaler: Any = None) -> Any:  # type: ignore[override]
        assert grad_scaler is not None
        grad_scaler.unscale_(self)
        found = sum(
            v.item()
            for v in grad_scaler._per_optimizer_states[id(self)]["found_inf_per_device"].values()
        )
        return None if found else super().step(closure)


def test_legacy_grad_scaler_kwarg_keeps_torchs_future_warning(kind: str) -> None:
    assert "grad_scaler" in inspect.signature(LegacyScalingSGD.step).parameters
    traces, sites = [], []
    for gs in make_pair(kind, init_scale=64.0, growth_interval=2):
        model = mlp()
        opt = LegacyScalingSGD(model.parameters(), lr=0.05)
        with pytest.warns(FutureWarning, match="stop passing itself as a keyword argument") as w:
            traces.append(train(gs, model, [opt], steps=6, inject=INJECT))
        sites.append({(r.filename, r.lineno) for r in w if r.category is FutureWarning})
    traces[1].assert_same(traces[0])
    # It names the line torch's does (train()'s step call; torch 2.4's own line): not
    # scalewatch's code, so a filter for the caller's module matches it as with torch's.
    assert sites[1] == sites[0]
    if compat.CUDA_WARNING_AT_CALLER:  # a torch that names its callers
        assert {Path(name).name for name, _ in sites[0]} == {"twin.py"}


def test_the_cuda_unavailable_warning_names_the_callers_line() -> None:
    if torch.cuda.is_available():
        pytest.skip("warns only without CUDA")
    records = []
    for cls in (torch.amp.GradScaler, scalewatch.GradScaler):
        with pytest.warns(UserWarning, match="CUDA is not available") as w:
            gs = cls("cuda")  # one line for both: the warning names it
        assert not gs.is_enabled()
        records.append([(str(r.message), r.filename, r.lineno) for r in w])
    assert records[1] == records[0]
    # torch 2.4 names its own line, where it warns; later releases the caller's
    assert (records[0][0][1] == __file__) is compat.CUDA_WARNING_AT_CALLER


def embedding_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Embedding(20, 3, sparse=True)


def embedding_forward(model: nn.Module, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(step)
    index = torch.randint(0, 20, (10,), generator=g)  # repeated rows: uncoalesced grads
    return model(index.to(model.weight.device)).pow(2).sum()


def test_sparse_gradients(kind: str, device: str) -> None:
    reference, ours = twin_run(
        kind,
        steps=10,
        inject={2: [(0, float("inf"))], 6: [(0, float("nan"))]},
        model=embedding_model,
        optimizers=lambda m: [torch.optim.SGD(m.parameters(), lr=0.1)],
        forward=embedding_forward,
        scaler_kwargs={**FACTORS, "growth_interval": 2},
        device=device,
    )
    ours.assert_same(reference)
    assert reference.skipped == [s in (2, 6) for s in range(10)]


def test_sharded_accepts_fp16_gradients(group: None, device: str) -> None:
    reference, ours = twin_run(
        "sharded",
        steps=10,
        inject=INJECT,
        model=lambda: mlp(dtype=torch.float16),
        optimizers=lambda m: [torch.optim.SGD(m.parameters(), lr=0.05)],
        dtype=torch.float16,
        scaler_kwargs={**FACTORS, "growth_interval": 2},
        device=device,
    )
    ours.assert_same(reference)
    assert reference.params[0].dtype == torch.float16


def test_plain_refuses_fp16_gradients_as_torch_naming_them_and_the_fixes(device: str) -> None:
    errors = []
    for gs in make_pair("plain", device=device):
        model = mlp(dtype=torch.float16).to(device)
        if gs.__module__.startswith("scalewatch"):
            gs.watch(model)
        with pytest.raises(ValueError) as caught:
            train(gs, model, sgd(model), steps=1, dtype=torch.float16)
        errors.append(str(caught.value))
    torchs, ours = errors
    assert torchs == "Attempting to unscale FP16 gradients."
    assert ours.startswith(torchs)  # what torch's own tests match
    assert "4 parameters have fp16 gradients: 0.weight, 0.bias, 2.weight and 1 more." in ours
    assert "torch.autocast" in ours and "MixedPrecisionPolicy" in ours
    model = mlp(dtype=torch.float16)
    unwatched = make_pair("plain")[1]
    with pytest.raises(ValueError, match=r"group 0 param 0 \(8, 4\), group 0 param 1 \(8\)"):
        train(unwatched, model, sgd(model), steps=1, dtype=torch.float16)


def run_with_new_scales(gs: Any, device: str) -> list[float]:
    model = mlp().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scales = []
    tensor = torch.tensor(5.5, device=device)
    for step, new_scale in enumerate([None, 3.0, None, tensor, None, None]):
        opt.zero_grad()
        gs.scale(model(batch(step).to(device)).pow(2).mean()).backward()
        gs.step(opt)
        gs.update(new_scale)
        scales.append((gs.get_scale(), gs._get_growth_tracker()))
    return scales


def test_update_with_new_scale_float_and_tensor(kind: str, device: str) -> None:
    reference, ours = make_pair(kind, init_scale=8.0, growth_interval=2, device=device)
    assert run_with_new_scales(ours, device) == run_with_new_scales(reference, device)
    assert ours.get_scale() == reference.get_scale()


def test_update_with_bad_new_scale_tensor_fails_as_torch(kind: str) -> None:
    messages = []
    for gs in make_pair(kind):
        gs.scale(torch.ones(()))
        with pytest.raises(AssertionError) as caught:
            gs.update(torch.tensor([1.0, 2.0]))
        messages.append(str(caught.value))
    assert messages[0] == messages[1]
    assert "new_scale should be a float" in messages[0]


def two_optimizers_after_a_refused_new_scale(gs: Any, device: str) -> list[Any]:
    """Two optimizers unscaled, the second one's gradients with an inf; update() refuses its
    new_scale; then the first optimizer steps."""
    first, second = mlp(seed=1).to(device), mlp(seed=2).to(device)
    opt_a = torch.optim.SGD(first.parameters(), lr=0.1)
    opt_b = torch.optim.SGD(second.parameters(), lr=0.1)
    x = batch(0).to(device)
    gs.scale(first(x).pow(2).mean() + second(x).pow(2).mean()).backward()
    poison(list(second.parameters()), 0, float("inf"))
    gs.unscale_(opt_a)
    gs.unscale_(opt_b)
    with pytest.raises(AssertionError):
        gs.update(torch.tensor([1.0, 2.0], device=device))
    flags = [
        f.clone() for f in gs._per_optimizer_states[id(opt_a)]["found_inf_per_device"].values()
    ]
    gs.step(opt_a)
    return [*flags, *(p.detach().clone() for p in first.parameters())]


def test_a_refused_new_scale_leaves_the_optimizers_flags_as_torch(kind: str, device: str) -> None:
    """Ours summed every optimizer's found_inf into the first one's before torch's update()
    refused the new_scale: that optimizer's clean step was then skipped."""
    reference, ours = make_pair(kind, device=device)
    theirs = two_optimizers_after_a_refused_new_scale(reference, device)
    mine = two_optimizers_after_a_refused_new_scale(ours, device)
    assert all(torch.equal(a, b) for a, b in zip(theirs, mine, strict=True))
    untrained = [p.to(device) for p in mlp(seed=1).parameters()]
    assert not any(torch.equal(a, b) for a, b in zip(mine[1:], untrained, strict=True))


def test_new_scale_after_a_fused_and_a_plain_optimizer(kind: str) -> None:
    """A fused optimizer's found_inf is 0-d, another's has one element: ours added them up
    for update(new_scale), which raised where torch's sets the scale."""
    scales = []
    for gs in make_pair(kind):
        first, second = mlp(seed=1), mlp(seed=2)
        fused = torch.optim.Adam(first.parameters(), lr=0.1, fused=True)
        plain = torch.optim.SGD(second.parameters(), lr=0.1)
        x = batch(0)
        gs.scale(first(x).pow(2).mean() + second(x).pow(2).mean()).backward()
        gs.step(fused)
        gs.step(plain)
        gs.update(1024.0)
        scales.append(gs.get_scale())
    assert scales == [1024.0, 1024.0]


def nested(dtype: torch.dtype, device: str) -> list[Any]:
    a, b, c = (torch.full((2,), v, dtype=dtype, device=device) for v in (1.0, 2.5, -3.0))
    return [a, (b, [c]), ((a,),)]


def flatten(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    return [t for item in value for t in flatten(item)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_scale_nested_lists_tuples_and_iterables(
    kind: str, device: str, dtype: torch.dtype
) -> None:
    results = []
    for gs in make_pair(kind, init_scale=4.0, device=device):
        out = gs.scale(nested(dtype, device))
        assert isinstance(out, list) and isinstance(out[1], tuple) and isinstance(out[1][1], list)
        ones = [torch.ones(n, dtype=dtype, device=device) for n in (2, 3)]
        lazy = gs.scale(iter(ones))
        assert not isinstance(lazy, list | tuple)
        results.append(flatten(out) + list(lazy))
    for mine, theirs in zip(results[1], results[0], strict=True):
        assert mine.dtype == theirs.dtype
        assert torch.equal(mine, theirs)
    if kind == "sharded":
        assert {t.dtype for t in results[1]} == {dtype}


def test_scale_refuses_non_tensors_as_torch(kind: str) -> None:
    for gs in make_pair(kind):
        with pytest.raises(ValueError, match="outputs must be a Tensor or an iterable of Tensors"):
            gs.scale([torch.ones(1), 3])


def trained(gs: Any, steps: int = 7) -> Any:
    model = mlp().to(gs._device)
    train(gs, model, sgd(model), steps=steps, inject={4: [(0, float("inf"))]})
    return gs


def continue_and_trace(gs: Any) -> Any:
    model = mlp(seed=5).to(gs._device)
    return train(gs, model, sgd(model), steps=8, inject={3: [(1, float("nan"))]})


def test_state_dict_cross_loading_both_directions(kind: str, device: str) -> None:
    kwargs = {**FACTORS, "growth_interval": 3}
    reference, ours = make_pair(kind, device=device, **kwargs)
    trained(reference)
    trained(ours)
    ours_state, torch_state = ours.state_dict(), reference.state_dict()
    torch_keys = {"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"}
    assert set(torch_state) == torch_keys
    assert set(ours_state) == torch_keys | {"scalewatch"}
    assert {k: ours_state[k] for k in torch_keys} == torch_state
    assert torch_state["scale"] == reference.get_scale()
    assert torch_state["_growth_tracker"] == reference._get_growth_tracker() == 2
    assert torch_state["growth_factor"] == 1.7 and torch_state["backoff_factor"] == 0.3
    assert torch_state["growth_interval"] == 3

    torch_from_ours, ours_from_torch = make_pair(kind, device=device)
    ours_from_theirs_first_scale = None
    torch_from_ours.load_state_dict(ours_state)
    ours_from_torch.load_state_dict(torch_state)
    assert ours_from_torch.state_dict() | {"scalewatch": None} == torch_state | {"scalewatch": None}
    ours_from_theirs_first_scale = ours_from_torch.get_scale()
    assert ours_from_theirs_first_scale == torch_state["scale"]
    continue_and_trace(ours_from_torch).assert_same(continue_and_trace(reference))
    continue_and_trace(torch_from_ours).assert_same(continue_and_trace(ours))


def test_pickle_round_trip_continues_identically(kind: str, device: str) -> None:
    reference, ours = make_pair(kind, **FACTORS, growth_interval=3, device=device)
    trained(reference)
    trained(ours)
    # process groups do not pickle: both sharded classes hold one only as an attribute
    copies = []
    for gs in (reference, ours):
        group = getattr(gs, "process_group", None)
        if group is not None:
            gs.process_group = None
        copy = pickle.loads(pickle.dumps(gs))
        if group is not None:
            gs.process_group = copy.process_group = group
        copies.append(copy)
    assert type(copies[1]) is type(ours)
    assert copies[1].get_scale() == copies[0].get_scale() == reference.get_scale()
    assert copies[1]._get_growth_tracker() == copies[0]._get_growth_tracker()
    continue_and_trace(copies[1]).assert_same(continue_and_trace(copies[0]))


def test_pickling_mid_iteration_fails_as_torch(kind: str) -> None:
    messages = []
    for gs in make_pair(kind):
        model = mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        gs.scale(model(batch(0)).sum()).backward()
        gs.step(opt)
        with pytest.raises(AssertionError) as caught:
            pickle.dumps(gs)
        messages.append(str(caught.value))
    assert messages[0] == messages[1]
    assert "may only be pickled at the beginning" in messages[0]


def test_disabled_mode(kind: str) -> None:
    reference, ours = twin_run(kind, steps=6, scaler_kwargs={"enabled": False})
    ours.assert_same(reference)
    assert ours.scales == [1.0] * 6
    for gs in make_pair(kind, enabled=False):
        loss = torch.ones(())
        assert gs.scale(loss) is loss
        assert not gs.is_enabled()
        assert gs.state_dict() == {}
        gs.load_state_dict({})  # a no-op when disabled, as torch's
        gs.update()
        assert gs._get_growth_tracker() == 0


def test_a_disabled_sharded_scaler_given_its_group_pickles_as_torchs(group: None) -> None:
    """torch's disabled ShardedGradScaler keeps no process group, so it pickles; ours
    held the group (which does not pickle) even when disabled."""
    pg = dist.new_group([0])
    theirs = TorchSharded("cpu", enabled=False, process_group=pg)
    ours = scalewatch.ShardedGradScaler("cpu", enabled=False, process_group=pg, telemetry=False)
    for gs in (theirs, ours):
        assert not hasattr(gs, "process_group")
        for restored in (pickle.loads(pickle.dumps(gs)), copy.deepcopy(gs)):
            assert type(restored) is type(gs) and not restored.is_enabled()


def misuse_cases() -> dict[str, Callable[[Any, torch.optim.Optimizer, torch.Tensor], None]]:
    def unscale_twice(gs: Any, opt: torch.optim.Optimizer, loss: torch.Tensor) -> None:
        gs.scale(loss).backward()
        gs.unscale_(opt)
        gs.unscale_(opt)

    def unscale_after_step(gs: Any, opt: torch.optim.Optimizer, loss: torch.Tensor) -> None:
        gs.scale(loss).backward()
        gs.step(opt)
        gs.unscale_(opt)

    def step_twice(gs: Any, opt: torch.optim.Optimizer, loss: torch.Tensor) -> None:
        gs.scale(loss).backward()
        gs.step(opt)
        gs.step(opt)

    def closure(gs: Any, opt: torch.optim.Optimizer, loss: torch.Tensor) -> None:
        gs.scale(loss).backward()
        gs.step(opt, closure=lambda: loss)

    def update_without_inf_checks(gs: Any, opt: torch.optim.Optimizer, loss: torch.Tensor) -> None:
        gs.scale(loss).backward()
        gs.update()

    def unscale_before_scale(gs: Any, opt: torch.optim.Optimizer, loss: torch.Tensor) -> None:
        gs.unscale_(opt)

    def step_before_scale(gs: Any, opt: torch.optim.Optimizer, loss: torch.Tensor) -> None:
        gs.step(opt)

    def update_before_scale(gs: Any, opt: torch.optim.Optimizer, loss: torch.Tensor) -> None:
        gs.update()

    return {
        f.__name__: f
        for f in (
            unscale_twice,
            unscale_after_step,
            step_twice,
            closure,
            update_without_inf_checks,
            unscale_before_scale,
            step_before_scale,
            update_before_scale,
        )
    }


@pytest.mark.parametrize("case", list(misuse_cases()))
def test_misuse_errors_match_torch(kind: str, device: str, case: str) -> None:
    errors = []
    for gs in make_pair(kind, device=device):
        model = mlp().to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with pytest.raises(Exception) as caught:
            misuse_cases()[case](gs, opt, model(batch(0).to(device)).sum())
        errors.append((type(caught.value), str(caught.value)))
    assert errors[1] == errors[0]
    assert errors[0][0] in (RuntimeError, AssertionError)


@pytest.mark.parametrize("kind_name", ["plain", "sharded"])
def test_nonsense_values_torch_accepts_are_refused(kind_name: str) -> None:
    """Intended difference: torch takes growth_interval 0 and a zero backoff silently."""
    cls = scalewatch.GradScaler if kind_name == "plain" else scalewatch.ShardedGradScaler
    reference_cls = torch.amp.GradScaler if kind_name == "plain" else TorchSharded
    for bad in ({"growth_interval": 0}, {"backoff_factor": 0.0}, {"init_scale": float("nan")}):
        reference_cls("cpu", **bad)
        with pytest.raises(ValueError, match=next(iter(bad)).replace("init_", "")):
            cls("cpu", telemetry=False, **bad)


def sharded_trace(gs: Any) -> Any:
    model = mlp().to(gs._device)
    return train(
        gs, model, two_optimizers(model), steps=12, inject=INJECT, before_step=unscale_and_clip
    )


def test_sharded_without_process_group_equals_torch_with_world_of_one(
    no_group: None, device: str
) -> None:
    """Intended difference: torch's sharded class needs a process group even for one process."""
    kwargs = {**FACTORS, "growth_interval": 2, "device": device}
    ours = sharded_trace(scalewatch.ShardedGradScaler(telemetry=False, **kwargs))
    lonely = TorchSharded(**kwargs)
    with pytest.raises(ValueError, match="Default process group has not been initialized"):
        sharded_trace(lonely)
    with world1():
        reference = sharded_trace(TorchSharded(**kwargs))
    ours.assert_same(reference)
    assert sum(any(step) for step in ours.skipped_per_optimizer) == 3
