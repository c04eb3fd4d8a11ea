"""Shared pieces of the scaler tests: a world-1 process group, tiny models, a traced loop."""

from __future__ import annotations

import contextlib
import functools
import math
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler as TorchSharded

# Imported here, before any test initialises a process group: as in torch's class, the
# default ``process_group=dist.group.WORLD`` is bound when the module is first imported,
# and ``scaler`` imports its classes lazily.
from scalewatch import GradScaler, ShardedGradScaler
from tests._helpers.ranks import leave_group

# step -> [(parameter index, value written into its gradient)]
Injection = dict[int, list[tuple[int, float]]]


@contextlib.contextmanager
def world1(backend: str = "gloo") -> Iterator[None]:
    """A process group of one process, initialised in this process through a file store."""
    assert not dist.is_initialized()
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group(
            backend, init_method=f"file://{Path(tmp) / 'store'}", rank=0, world_size=1
        )
        try:
            yield
        finally:
            leave_group()


def make_pair(kind: str, **kwargs: Any) -> tuple[Any, Any]:
    """(torch's scaler, ours) built with the same keyword arguments (device cpu unless given)."""
    kwargs.setdefault("device", "cpu")
    if kind == "plain":
        return torch.amp.GradScaler(**kwargs), GradScaler(telemetry=False, **kwargs)
    assert kind == "sharded"
    return TorchSharded(**kwargs), ShardedGradScaler(telemetry=False, **kwargs)


def mlp(seed: int = 0, dtype: torch.dtype = torch.float32, width: int = 8) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, width), nn.Tanh(), nn.Linear(width, 2)).to(dtype)


def batch(step: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(6, 4, generator=g).to(dtype)


def poison(params: Sequence[torch.Tensor], index: int, value: float) -> None:
    grad = params[index].grad
    assert grad is not None
    target = grad._values() if grad.is_sparse else grad
    with torch.no_grad():
        target.view(-1)[0].fill_(value)  # a kernel with the value as argument: no cuda sync


@dataclass
class Trace:
    scales: list[float] = field(default_factory=list)
    trackers: list[int] = field(default_factory=list)
    skipped: list[bool] = field(default_factory=list)  # every optimizer skipped its step
    skipped_per_optimizer: list[tuple[bool, ...]] = field(default_factory=list)
    params: list[torch.Tensor] = field(default_factory=list)
    returns: list[Any] = field(default_factory=list)
    said_skipped: list[bool | None] = field(default_factory=list)  # ours: last_step_skipped

    def assert_same(self, other: Trace) -> None:
        assert self.scales == other.scales
        assert self.trackers == other.trackers
        assert self.skipped == other.skipped
        assert self.skipped_per_optimizer == other.skipped_per_optimizer
        assert self.returns == other.returns
        assert len(self.params) == len(other.params)
        for mine, theirs in zip(self.params, other.params, strict=True):
            assert mine.dtype == theirs.dtype
            assert torch.equal(mine, theirs)


def train(
    gs: Any,
    model: nn.Module,
    optimizers: Sequence[torch.optim.Optimizer],
    *,
    steps: int,
    inject: Injection | None = None,
    dtype: torch.dtype = torch.float32,
    before_step: Callable[[Any, torch.optim.Optimizer], None] | None = None,
    forward: Callable[[nn.Module, int], torch.Tensor] | None = None,
) -> Trace:
    """Run ``steps`` iterations with scaler ``gs``; record what a user can observe.

    The batches go to the device the model's parameters are on.
    """
    params = list(model.parameters())
    device = params[0].device
    trace = Trace()
    for step in range(steps):
        for opt in optimizers:
            opt.zero_grad()
        if forward is None:
            loss = model(batch(step, dtype).to(device)).float().pow(2).mean()
        else:
            loss = forward(model, step)
        gs.scale(loss).backward()
        for index, value in (inject or {}).get(step, []):
            poison(params, index, value)
        per_optimizer = []
        for opt in optimizers:
            own = [p for group in opt.param_groups for p in group["params"]]
            before = [p.detach().clone() for p in own]
            if before_step is not None:
                before_step(gs, opt)
            trace.returns.append(gs.step(opt))
            per_optimizer.append(
                all(torch.equal(b, p.detach()) for b, p in zip(before, own, strict=True))
            )
        gs.update()
        if hasattr(gs, "last_step_skipped"):
            trace.said_skipped.append(gs.last_step_skipped)
        trace.scales.append(gs.get_scale())
        trace.trackers.append(gs._get_growth_tracker())
        trace.skipped.append(all(per_optimizer))
        trace.skipped_per_optimizer.append(tuple(per_optimizer))
    trace.params = [p.detach().clone() for p in params]
    return trace


def train_step(gs: Any, model: nn.Module, opt: torch.optim.Optimizer, step: int) -> None:
    """One step of ``model`` on ``batch(step)`` with the scaler ``gs``."""
    opt.zero_grad()
    gs.scale(model(batch(step)).pow(2).mean()).backward()
    gs.step(opt)
    gs.update()


def sgd(model: nn.Module) -> list[torch.optim.Optimizer]:
    return [torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)]


def twin_run(
    kind: str,
    *,
    steps: int = 12,
    inject: Injection | None = None,
    optimizers: Callable[[nn.Module], list[torch.optim.Optimizer]] = sgd,
    model: Callable[[], nn.Module] = mlp,
    scaler_kwargs: dict[str, Any] | None = None,
    device: str = "cpu",
    **train_kwargs: Any,
) -> tuple[Trace, Trace]:
    """The same loop under torch's scaler and ours on ``device``: (torch's trace, ours)."""
    reference, ours = make_pair(kind, device=device, **(scaler_kwargs or {}))
    traces = []
    for gs in (reference, ours):
        m = model().to(device)
        traces.append(train(gs, m, optimizers(m), steps=steps, inject=inject, **train_kwargs))
    return traces[0], traces[1]


# inf and nan on chosen steps and parameters, with clean runs between to let the scale grow.
INJECT: Injection = {2: [(0, float("inf"))], 3: [(3, float("nan"))], 7: [(1, float("-inf"))]}


def observable(value: Any) -> Any:
    """``value`` as a caller can compare it: tensors as (dtype, values), containers inside out."""
    if isinstance(value, torch.Tensor):
        dense = value.to_dense() if value.is_sparse else value
        return (str(value.dtype), str(value.device), dense.tolist())
    if isinstance(value, dict):
        return {str(key): observable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [observable(item) for item in value]
    return value


def outcome(call: Callable[[], Any]) -> Any:
    """What ``call`` shows its caller: its value, observable, or its error's class and text."""
    try:
        value = call()
    except Exception as error:
        return ("raised", type(error).__name__, str(error))
    return ("returned", observable(value))


@functools.cache
def torchs_sharded_fused_overflow_error() -> str | None:
    """What torch's own ShardedGradScaler raises at a fused Adam's overflow step on cpu
    (torch 2.4: "output with shape [] doesn't match the broadcast shape [1]"), or None
    where it skips the step as it should."""
    # The fused path makes no collective: no process group (one destroyed after a failed
    # step can hang torch 2.4's gloo at exit).
    model = mlp()
    opt = torch.optim.Adam(model.parameters(), lr=0.01, fused=True)
    gs = TorchSharded("cpu")
    gs.scale(model(batch(0)).sum()).backward()
    poison(list(model.parameters()), 0, math.inf)
    try:
        gs.step(opt)
    except RuntimeError as exc:
        return str(exc)
    return None


def skip_unless_torchs_sharded_steps_fused_overflows() -> None:
    """No reference to compare with where torch's own class fails that step."""
    error = torchs_sharded_fused_overflow_error()
    if error is not None:
        pytest.skip(
            f"torch {torch.__version__}'s own ShardedGradScaler fails a fused optimizer's"
            f" overflow step on cpu: {error}"
        )


# Factors other than torch's defaults: the sequences differ wherever a rule is misread.
FACTORS = {"init_scale": 2.0**10, "growth_factor": 1.7, "backoff_factor": 0.3}


def two_optimizers(model: nn.Module) -> list[torch.optim.Optimizer]:
    first, _, last = model  # type: ignore[misc]
    return [
        torch.optim.SGD(first.parameters(), lr=0.05),
        torch.optim.Adam(last.parameters(), lr=0.01),
    ]


def unscale_and_clip(gs: Any, opt: torch.optim.Optimizer) -> None:
    gs.unscale_(opt)
    params = [p for group in opt.param_groups for p in group["params"]]
    torch.nn.utils.clip_grad_norm_(params, max_norm=0.5)


def fused_adam(model: nn.Module) -> list[torch.optim.Optimizer]:
    opt = torch.optim.Adam(model.parameters(), lr=0.01, fused=True)
    assert opt._step_supports_amp_scaling  # type: ignore[attr-defined]
    return [opt]
