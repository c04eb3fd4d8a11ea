"""The service's autopilot: a policy over a run's recent steps
(:mod:`scalewatch.app.autopilot.policy`), a loop that files its changes as control
requests (:mod:`scalewatch.app.autopilot.loop`), and the endpoints that switch it
(:mod:`scalewatch.app.routes.autopilot`)."""

from __future__ import annotations

from .loop import AutopilotLoop, run_loop

__all__ = ["AutopilotLoop", "run_loop"]
