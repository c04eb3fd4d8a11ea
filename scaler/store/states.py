"""The states a run and a control request are in, and where a request came from.

Stored as their values (plain text columns), so rows written before these existed read
the same:

>>> RunStatus("crashed") is RunStatus.CRASHED, f"{RequestSource.CLI}"
(True, 'cli')
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["AlertState", "AutopilotState", "RequestSource", "RequestStatus", "RunStatus"]


class RunStatus(StrEnum):
    RUNNING = "running"
    FINISHED = "finished"
    CRASHED = "crashed"  # ended by a crash, or silent past the heartbeat timeout


class RequestStatus(StrEnum):
    PENDING = "pending"
    APPLIED = "applied"
    REJECTED = "rejected"


class RequestSource(StrEnum):
    API = "api"
    CLI = "cli"
    CODE = "code"  # a setter called by the training script, recorded as applied
    AUTOPILOT = "autopilot"  # the service's autopilot (app/autopilot)


class AutopilotState(StrEnum):
    OFF = "off"
    WATCHING = "watching"  # enabled: evaluates the run, changes it when its policy says
    GAVE_UP = "gave_up"  # enabled, but stopped itself: its changes did not help
    ENDED = "ended"  # enabled, but its run ended: it acts no more (read, never stored)


class AlertState(StrEnum):
    FIRING = "firing"
    RESOLVED = "resolved"
