"""A real training job whose loss scale overflows whenever it passes a ceiling.

One process, torch's CPU autocast-free fp32 model with ``scaler.GradScaler("cpu")``
writing telemetry to a store: before ``step()``, a gradient gets an inf whenever the
scale in use is above ``ceiling``. At growth_interval G such a run skips one step in
G + 1 once its scale has come down to the ceiling. The test drives it step by step
(:meth:`CeilingTrainer.run_until`), so that it waits on a condition without sleeping.
``enable`` turns the service's autopilot on for its run; ``settled`` says when the
autopilot has brought the skip rate within its target.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from fastapi.testclient import TestClient

from scalewatch import GradScaler
from scalewatch.store.engine import Store
from scalewatch.store.summaries import request_summary, step_summary
from scalewatch.telemetry import TelemetrySettings
from tests._helpers.service import auth

CHECK_EVERY = 25  # steps between two looks at the condition
COOLDOWN = 200
SETTLED_STEPS = 3 * COOLDOWN  # steps within the target since the last change
TARGET = 0.01


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


def skip_rate_since_change(store: Store, run: int, after: int = 0) -> tuple[float, int]:
    """The skipped-step rate since the last change (or ``after``, if later), and of how
    many steps."""
    changed = request_summary(store, run, since=0).changed_at_step
    steps = step_summary(store, run, after=max(changed, after))
    return (steps.skipped / steps.steps, steps.steps) if steps else (1.0, 0)


def settled(store: Store, run: int, after: int = 0) -> bool:
    """The autopilot made a change, and the steps since (and since ``after``) are within
    the target, ``SETTLED_STEPS`` of them at least."""
    summary = request_summary(store, run, since=0)
    rate, steps = skip_rate_since_change(store, run, after)
    return (
        summary.changed_at_step > 0
        and not summary.pending
        and steps >= SETTLED_STEPS
        and (rate <= TARGET)
    )


def enable(client: TestClient, run: int) -> None:
    body = {"enabled": True, "target_skip_rate": TARGET, "cooldown_steps": COOLDOWN}
    response = client.put(f"/api/runs/{run}/autopilot", json=body, headers=auth())
    assert response.status_code == 200, response.text
    assert response.json()["state"] == "watching"
