"""A real training job whose loss scale overflows whenever it passes a ceiling.

One process, torch's CPU autocast-free fp32 model with ``scaler.GradScaler("cpu")``
writing telemetry to a store: before ``step()``, a gradient gets an inf whenever the
scale in use is above ``ceiling``. At growth_interval G such a run skips one step in
G + 1 once its scale has come down to the ceiling. The test drives it step by step
(:meth:`CeilingTrainer.run_until`), so that it waits on a condition without sleeping.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from scaler import GradScaler
from scaler.telemetry import TelemetrySettings

CHECK_EVERY = 25  # steps between two looks at the condition


class CeilingTrainer:
    def __init__(self, url: str, *, ceiling: float, growth_interval: int = 20) -> None:
        torch.manual_seed(0)
        self.ceiling = ceiling
        self.model = torch.nn.Linear(4, 1)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=1e-6)
        settings = TelemetrySettings(url, coalesce_s=0.02, poll_interval_s=0.02)
        self.scaler = GradScaler(
            "cpu", init_scale=2.0**16, growth_interval=growth_interval, telemetry=settings,
            run_name="ceiling",
        )  # fmt: skip
        self.x = torch.randn(8, 4)
        self.steps = 0

    def step(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(self.model(self.x).pow(2).mean()).backward()
        if self.scaler.get_scale() > self.ceiling:
            grad = self.model.weight.grad
            assert grad is not None
            grad.view(-1)[0] = float("inf")
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.steps += 1

    def run_until(self, condition: Callable[[], bool], *, timeout_s: float, what: str) -> None:
        """Train until ``condition()`` holds; fail after ``timeout_s`` seconds."""
        deadline = time.monotonic() + timeout_s
        while True:
            for _ in range(CHECK_EVERY):
                self.step()
            if condition():
                return
            assert time.monotonic() < deadline, f"timed out after {self.steps} steps: {what}"

    @property
    def run_id(self) -> int:
        run_id = self.scaler.run_id
        assert run_id is not None
        return run_id

    def close(self) -> None:
        self.scaler.close()
