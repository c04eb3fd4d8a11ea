"""``skip_on_spike`` on two real gloo ranks: every rank skips the same steps, and only those.

One spawn trains the same model under DDP, FSDP1 (flat parameters) and FSDP2 (DTensor
shards) with ``ShardedGradScaler``, and under DDP with ``GradScaler``. At the spike
steps only rank 1's batch has a target far off: rank 0's own loss does not spike, its
gradients (DDP's averaged ones, or its shards) are what they would be. Judged by the
gradient norm (the same on every rank: DDP's replicas agree, the squares of the shards
are summed in the found_inf all-reduce) or by the loss alone (the ranks' mean, summed in
that same all-reduce): both ranks skip exactly the spike steps, their parameters (each
rank's shards) do not move at them, and the scale is never backed off (there is no
overflow). ``GradScaler`` agrees nothing across ranks: judging the loss there is refused.
(That no collective is added: test_scaler_collectives_multirank.)
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import scalewatch
from scalewatch.store.spikes import MIN_HISTORY
from tests._helpers.nets import FSDP2_HERE, wrapped_net
from tests._helpers.ranks import run_ranks

STEPS = MIN_HISTORY + 6
SPIKES = (MIN_HISTORY + 1, MIN_HISTORY + 4)  # rank 1's batch has a target far off
KINDS = ["ddp", "fsdp1", *(["fsdp2"] if FSDP2_HERE else [])]
RULES: dict[str, dict[str, float | None]] = {
    "norm": {"grad_norm_z": 20.0, "loss_z": None},
    "loss": {"grad_norm_z": None, "loss_z": 20.0},
}


def local(model: nn.Module) -> list[torch.Tensor]:
    return [getattr(p, "_local_tensor", p).detach().clone() for p in model.parameters()]


def train(rank: int, kind: str, rule: str, gs: Any) -> dict[str, Any]:
    """Each step: whether it was said skipped, whether this rank's parameters moved, the
    scale after it."""
    model = wrapped_net(kind)
    gs.skip_on_spike(**RULES[rule])
    opt = torch.optim.SGD(model.parameters(), lr=0.001)
    said, moved, scales = [], [], []
    for step in range(STEPS):
        opt.zero_grad()
        x = torch.randn(6, 4, generator=torch.Generator().manual_seed(10 * step + rank))
        target = 100.0 if step in SPIKES and rank == 1 else 1.0
        gs.scale(model(x).sub(target).pow(2).mean()).backward()
        before = local(model)
        gs.step(opt)
        gs.update()
        said.append(gs.last_step_skipped)
        moved.append(any(not torch.equal(b, a) for b, a in zip(before, local(model), strict=True)))
        scales.append(gs.get_scale())
    stats = gs.stats()
    gs.close()
    return {"said": said, "moved": moved, "scales": scales, "spike_skips": stats.spike_skips}


def refused(rank: int) -> str:
    """What GradScaler says to ``loss_z`` in a process group of two."""
    model = wrapped_net("ddp")
    gs = scalewatch.GradScaler("cpu", telemetry=False)
    gs.skip_on_spike(loss_z=6.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.001)
    gs.scale(model(torch.ones(2, 4)).sum()).backward()
    with pytest.raises(RuntimeError) as error:
        gs.step(opt)
    return str(error.value)


def worker(rank: int, world: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind in KINDS:
        for rule in RULES:
            gs = scalewatch.ShardedGradScaler("cpu", init_scale=1024.0, telemetry=False)
            out[f"{kind}-{rule}"] = train(rank, kind, rule, gs)
    plain = scalewatch.GradScaler("cpu", init_scale=1024.0, telemetry=False)
    out["ddp-norm-plain"] = train(rank, "ddp", "norm", plain)
    out["refused"] = refused(rank)
    return out


@pytest.mark.slow
def test_every_rank_skips_the_spike_steps_alone() -> None:
    per_rank = run_ranks(worker, 2, timeout=300.0)
    runs = [name for name in per_rank[0] if name != "refused"]
    assert len(runs) == 2 * len(KINDS) + 1
    for name in runs:
        for rank, results in enumerate(per_rank):
            run = results[name]
            skipped = [step for step, said in enumerate(run["said"]) if said]
            assert skipped == list(SPIKES), (name, rank)
            assert [not moved for moved in run["moved"]] == [
                step in SPIKES for step in range(STEPS)
            ], (name, rank)
            assert run["spike_skips"] == len(SPIKES), (name, rank)
            scales = run["scales"]
            assert scales == sorted(scales), (name, rank)  # never backed off
        assert per_rank[0][name]["scales"] == per_rank[1][name]["scales"], name
    for results in per_rank:
        assert "use ShardedGradScaler in a multi-process job" in results["refused"]
