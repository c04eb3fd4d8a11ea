"""The small named model the multi-rank diagnosis and collective tests train."""

from __future__ import annotations

import torch
from torch import nn


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
    from scaler._torch_compat import fsdp2

    fully_shard = fsdp2().fully_shard
    fully_shard(net.encoder)
    fully_shard(net.decoder)
    return fully_shard(net)
