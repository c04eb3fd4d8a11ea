"""The small named model the multi-rank diagnosis and collective tests train, and a model
wrapped as DDP, FSDP1 (offloading or not) or FSDP2 shards it on real ranks (``wrap``)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from scalewatch._torch_compat import FSDP2_PUBLIC

# torch's FSDP2 before 2.6 (torch.distributed._composable.fsdp) makes CUDA streams at its
# first forward: on cpu ranks only the public one (torch 2.6 and newer) runs.
FSDP2_HERE = FSDP2_PUBLIC or torch.cuda.is_available()
NO_FSDP2 = f"torch {torch.__version__}'s FSDP2 (before torch 2.6) needs CUDA"


def skip_unless_fsdp2_here() -> None:
    """For a test of FSDP2 alone: a skip that says why, rather than a pass."""
    if not FSDP2_HERE:
        pytest.skip(NO_FSDP2)


class Net(nn.Module):
    """``encoder`` (4 -> 16), tanh, ``decoder`` (16 -> 4); the same weights on every rank."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.encoder = nn.Linear(4, 16)
        self.act = nn.Tanh()
        self.decoder = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.act(self.encoder(x)))


def fully_shard_net(net: Net) -> nn.Module:
    """``net`` under FSDP2: each linear layer a unit of its own, then the whole."""
    from scalewatch._torch_compat import fsdp2

    fully_shard = fsdp2().fully_shard
    fully_shard(net.encoder)
    fully_shard(net.decoder)
    return fully_shard(net)


def wrapped_net(kind: str) -> nn.Module:
    """A new :class:`Net` on cpu under ``kind``: ``ddp``, ``fsdp1``, ``fsdp2``, or FSDP1
    handing the optimizer its original parameters, sharded (``fsdp1-orig``) or not
    (``fsdp1-orig-no-shard``)."""
    net = Net()
    if kind == "ddp":
        return nn.parallel.DistributedDataParallel(net)
    if kind == "fsdp2":
        return fully_shard_net(net)
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardingStrategy

    cpu = torch.device("cpu")
    if kind == "fsdp1":
        return FSDP(net, device_id=cpu)
    if kind == "fsdp1-orig":
        return FSDP(net, device_id=cpu, use_orig_params=True)
    assert kind == "fsdp1-orig-no-shard"
    with warnings.catch_warnings():  # torch deprecates NO_SHARD for DDP: still supported
        warnings.filterwarnings("ignore", "The `NO_SHARD` sharding strategy", FutureWarning)
        return FSDP(
            net, device_id=cpu, use_orig_params=True, sharding_strategy=ShardingStrategy.NO_SHARD
        )


def wrap(kind: str, module: nn.Module, device: str) -> nn.Module:
    """``module`` wrapped by ``kind``: ``ddp``, ``fsdp1``, ``fsdp1-offload`` or ``fsdp2``."""
    if kind == "ddp":
        # on cuda every rank shares the one GPU: gloo all-reduces cuda tensors too
        return nn.parallel.DistributedDataParallel(module.to(device))
    if kind == "fsdp2":
        from scalewatch._torch_compat import fsdp2

        fully_shard = fsdp2().fully_shard
        policy = fsdp2().MixedPrecisionPolicy(param_dtype=torch.float16)
        for layer in (module[0], module[2]):
            fully_shard(layer, mp_policy=policy)
        return fully_shard(module, mp_policy=policy)
    from torch.distributed.fsdp import CPUOffload
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    if kind == "fsdp1":
        return FSDP(module, device_id=torch.device("cpu"))
    assert kind == "fsdp1-offload"
    offload = CPUOffload(offload_params=True)
    index = torch.cuda.current_device() if device == "cuda" else None
    return FSDP(module, device_id=torch.device(device, index), cpu_offload=offload)
