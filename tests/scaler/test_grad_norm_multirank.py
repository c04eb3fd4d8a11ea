"""The gradient norm on two real gloo ranks: the framework's own clipping norm, on every rank.

One spawn trains the same model under DDP, FSDP1 (flat parameters, sharded; with
``use_orig_params=True`` its original parameters, views into each rank's shard, and the
same unsharded, ``NO_SHARD``) and FSDP2 (DTensor shards) with
``ShardedGradScaler(grad_norm=True)``. Each step, after
``unscale_``, every rank's ``last_grad_norm`` is compared with what the framework's
clipping returns there (``clip_grad_norm_``, FSDP1's ``FullyShardedDataParallel.
clip_grad_norm_``, FSDP2's DTensor norm made whole); an inf in one rank's shard makes the
norm inf on both. (That no collective is added: test_scaler_collectives_multirank.)
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import nn

import scalewatch
from tests._helpers.nets import FSDP2_HERE, wrapped_net
from tests._helpers.ranks import run_ranks

STEPS = 4
OVERFLOW = 2  # inf in rank 1's gradients (on both where every rank holds them whole)
KINDS = [
    "ddp",
    "fsdp1",
    "fsdp1-orig",
    "fsdp1-orig-no-shard",
    *(["fsdp2"] if FSDP2_HERE else []),
]
RELATIVE = 1e-5
WHOLE = ("ddp", "fsdp1-orig-no-shard")  # every rank holds the same gradients


def framework_norm(kind: str, model: nn.Module) -> float:
    """The norm the framework's own clipping returns for the gradients as they are (no
    bound: they are left unchanged)."""
    if kind.startswith("fsdp1"):
        norm: Any = model.clip_grad_norm_(float("inf"))  # type: ignore[operator]
    else:
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
    if hasattr(norm, "full_tensor"):  # FSDP2: a DTensor, partial on each rank
        norm = norm.full_tensor()
    return float(norm)


def train(rank: int, kind: str) -> list[tuple[float, float | None]]:
    """(ours, the framework's) after ``unscale_``, each step; the framework's is not asked
    at the overflow (clipping by a norm that is not finite writes NaN into the gradients)."""
    model = wrapped_net(kind)
    gs = scalewatch.ShardedGradScaler("cpu", init_scale=1024.0, telemetry=False, grad_norm=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    out: list[tuple[float, float | None]] = []
    for step in range(STEPS):
        opt.zero_grad()
        x = torch.randn(6, 4, generator=torch.Generator().manual_seed(10 * step + rank))
        gs.scale(model(x).pow(2).mean()).backward()
        if step == OVERFLOW and (rank == 1 or kind in WHOLE):
            grad = next(p.grad for p in model.parameters() if p.grad is not None)
            with torch.no_grad():
                getattr(grad, "_local_tensor", grad).view(-1)[0] = float("inf")
        gs.unscale_(opt)
        ours = gs.last_grad_norm
        assert ours is not None
        theirs = None if step == OVERFLOW else framework_norm(kind, model)
        out.append((float(ours), theirs))
        gs.step(opt)
        gs.update()
        assert gs.last_grad_norm is ours  # update() keeps the step's norm
    return out


def worker(rank: int, world: int) -> dict[str, list[tuple[float, float | None]]]:
    return {kind: train(rank, kind) for kind in KINDS}


@pytest.mark.slow
def test_the_norm_is_the_frameworks_clipping_norm_on_every_rank() -> None:
    per_rank = run_ranks(worker, 2, timeout=180.0)
    for kind in KINDS:
        rank0, rank1 = (results[kind] for results in per_rank)
        assert [ours for ours, _ in rank0] == [ours for ours, _ in rank1], kind  # same tensor
        for rank, results in enumerate(per_rank):
            for step, (ours, theirs) in enumerate(results[kind]):
                if step == OVERFLOW:
                    assert math.isinf(ours), (kind, rank)
                    continue
                assert theirs is not None and theirs > 0
                assert ours == pytest.approx(theirs, rel=RELATIVE), (kind, rank, step)
