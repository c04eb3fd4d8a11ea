"""What the integration tests share: a tiny model, and the one run a training left in a store."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from scalewatch.instrument import instrument, uninstrument
from scalewatch.store.engine import open_store
from scalewatch.store.queries import RunInfo, list_runs

# Well above what fp16 gradients of these models hold, so the first steps overflow and back off.
INIT_SCALE = 2.0**18


def tiny_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))


def batches(count: int, size: int = 8) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randn(size, 16, generator=generator) for _ in range(count)]


def the_run(db: str) -> RunInfo:
    """The store's only run (the test fails if there is none or more than one)."""
    with open_store(db) as store:
        (run,) = list_runs(store)
    return run


@contextmanager
def instrumented() -> Iterator[None]:
    """scalewatch's scalers in place of torch's for the block (``scalewatch.instrument``)."""
    instrument()
    try:
        yield
    finally:
        uninstrument()
