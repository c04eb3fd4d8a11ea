"""What the mirrors' tests share: a short cpu fp16 training, and the steps its store holds."""

from __future__ import annotations

from typing import Any

import torch
from torch.optim import lr_scheduler

from scalewatch.store import open_store
from tests._helpers.integrations import batches, tiny_model
from tests._helpers.stored import step_rows

STEPS = 24


def train(scaler: Any, steps: int = STEPS) -> None:
    """``steps`` steps of a tiny model in fp16 on the cpu (its first steps overflow), with a
    registered LR scheduler (so that the records carry a learning rate and a drift)."""
    model = tiny_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    schedule = lr_scheduler.LambdaLR(optimizer, lambda step: 0.9**step)
    scaler.watch_schedulers(schedule)
    for x in batches(steps):
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = model(x).float().pow(2).mean()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        schedule.step()


def stored_steps(db_url: str) -> list[dict[str, Any]]:
    """The ``steps`` rows of the store's runs, in step order."""
    with open_store(db_url) as store:
        return step_rows(store)
