"""A small net trained with non-finite values written into chosen parameters' gradients,
for the tests of the overflow diagnosis: which parameters, ranks and kinds it names.

    >>> sorted(PLAN), [name for name, _, _ in PLAN[1]]
    ([1, 3], ['decoder.weight', 'encoder.bias'])
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

INF, NAN = float("inf"), float("nan")


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.encoder = nn.Linear(4, 8)
        self.act = nn.Tanh()
        self.decoder = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.act(self.encoder(x)))


def run(
    gs: Any,
    model: nn.Module,
    plan: dict[int, list[tuple[str, int, float]]],
    *,
    steps: int = 5,
    opt: torch.optim.Optimizer | None = None,
    device: str = "cpu",
    bad_loss: tuple[int, ...] = (),
) -> list[float]:
    """Train; ``plan``: step -> (parameter name, elements, value) written into its grad."""
    params = dict(model.named_parameters())
    opt = opt or torch.optim.SGD(model.parameters(), lr=0.01)
    losses = []
    for step in range(steps):
        opt.zero_grad()
        x = torch.randn(3, 4, generator=torch.Generator().manual_seed(step)).to(device)
        loss = model(x).pow(2).mean()
        if step in bad_loss:
            loss = loss * INF
        losses.append(loss.item())
        gs.scale(loss).backward()
        for name, count, value in plan.get(step, []):
            grad = params[name].grad
            assert grad is not None
            with torch.no_grad():
                grad.view(-1)[:count] = value
        gs.step(opt)
        gs.update()
    assert gs.flush()
    return losses


PLAN = {1: [("decoder.weight", 3, INF), ("encoder.bias", 1, NAN)], 3: [("encoder.weight", 2, NAN)]}
