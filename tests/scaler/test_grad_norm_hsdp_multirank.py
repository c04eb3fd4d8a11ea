"""The gradient norm under HSDP on four real gloo ranks (2 replicas x 2 shards), on every rank.

The scaler agrees found_inf over all four ranks, while each shard is held by both
replicas: its squares, summed over the four, would count twice. One spawn trains the same
model under FSDP1's ``HYBRID_SHARD`` (flat parameters, and with ``use_orig_params=True``
their originals; the shard and replicate groups handed in: left to itself FSDP1 makes
them from the node's count of GPUs) and under FSDP2 on a 2-D mesh (replicate, shard), with
``ShardedGradScaler(grad_norm=True)`` over the world. After each ``unscale_`` every rank's
``last_grad_norm`` is compared with FSDP1's ``clip_grad_norm_`` there, or FSDP2's DTensor
norm made whole; an inf in one rank's shard makes it inf on all four.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

import scalewatch
from tests._helpers.nets import FSDP2_HERE, Net
from tests._helpers.ranks import run_ranks

STEPS = 4
OVERFLOW = 2  # inf in rank 3's gradients
KINDS = ["fsdp1-hybrid", "fsdp1-hybrid-orig", *(["fsdp2-hsdp"] if FSDP2_HERE else [])]
RELATIVE = 1e-5
WORLD = 4
SHARDS = 2  # ranks 2r and 2r+1 hold the shards of one replica


def hsdp_net(kind: str, rank: int, groups: tuple[Any, ...]) -> nn.Module:
    """A new :class:`Net` under ``kind``, each replica sharded over two ranks."""
    if kind == "fsdp2-hsdp":
        from torch.distributed.device_mesh import init_device_mesh

        from scalewatch._torch_compat import fsdp2

        mesh = init_device_mesh("cpu", (WORLD // SHARDS, SHARDS), mesh_dim_names=("rep", "shard"))
        net = Net()
        fully_shard = fsdp2().fully_shard
        fully_shard(net.encoder, mesh=mesh)
        fully_shard(net.decoder, mesh=mesh)
        return fully_shard(net, mesh=mesh)  # type: ignore[no-any-return]
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardingStrategy

    shard_groups, replicate_groups = groups
    return FSDP(
        Net(),
        device_id=torch.device("cpu"),
        sharding_strategy=ShardingStrategy.HYBRID_SHARD,
        process_group=(shard_groups[rank // SHARDS], replicate_groups[rank % SHARDS]),
        use_orig_params=kind == "fsdp1-hybrid-orig",
    )


def framework_norm(kind: str, model: nn.Module) -> float:
    """The norm the framework's own clipping returns (no bound: the gradients stay)."""
    if kind.startswith("fsdp1"):
        norm: Any = model.clip_grad_norm_(float("inf"))  # type: ignore[operator]
    else:
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf")).full_tensor()
    return float(norm)


def train(rank: int, kind: str, groups: tuple[Any, ...]) -> list[tuple[float, float | None]]:
    """(ours, the framework's) after ``unscale_``, each step (the framework's not asked at
    the overflow, where clipping would write NaN into the gradients)."""
    model = hsdp_net(kind, rank, groups)
    gs = scalewatch.ShardedGradScaler("cpu", init_scale=1024.0, telemetry=False, grad_norm=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    out: list[tuple[float, float | None]] = []
    for step in range(STEPS):
        opt.zero_grad()
        x = torch.randn(6, 4, generator=torch.Generator().manual_seed(10 * step + rank))
        gs.scale(model(x).pow(2).mean()).backward()
        if step == OVERFLOW and rank == 3:
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
    return out


def worker(rank: int, world: int) -> dict[str, list[tuple[float, float | None]]]:
    # every rank makes every group, in the same order
    shard_groups = [dist.new_group([r, r + 1]) for r in range(0, world, SHARDS)]
    replicate_groups = [dist.new_group(list(range(s, world, SHARDS))) for s in range(SHARDS)]
    groups = (shard_groups, replicate_groups)
    return {kind: train(rank, kind, groups) for kind in KINDS}


@pytest.mark.slow
def test_the_hsdp_norm_counts_each_shard_once_on_every_rank() -> None:
    per_rank = run_ranks(worker, WORLD, timeout=300.0)
    for kind in KINDS:
        norms = [[ours for ours, _ in results[kind]] for results in per_rank]
        assert all(n == norms[0] for n in norms), kind  # the same on every rank
        for rank, results in enumerate(per_rank):
            for step, (ours, theirs) in enumerate(results[kind]):
                if step == OVERFLOW:
                    assert math.isinf(ours), (kind, rank)
                    continue
                assert theirs is not None and theirs > 0
                assert ours == pytest.approx(theirs, rel=RELATIVE), (kind, rank, step)
