"""Plain values passed in and out of the store."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from enum import StrEnum
from math import isfinite
from typing import Any

from .states import RequestSource, RequestStatus
from .step_schema import StepRecord as StepRecord  # declared with its columns there


class FindingKind(StrEnum):
    """What a parameter's local gradient held at an overflow step (stored as its value)."""

    INF = "inf"
    NAN = "nan"
    BOTH = "both"


@dataclass(frozen=True, slots=True)
class ParamFinding:
    """One parameter whose local gradient held inf or NaN on one rank at an overflow step."""

    rank: int
    name: str
    kind: FindingKind
    count: int  # non-finite elements in that rank's local gradient

    def __post_init__(self) -> None:
        if type(self.kind) is not FindingKind:
            object.__setattr__(self, "kind", FindingKind(self.kind))


@dataclass(frozen=True, slots=True)
class RunRef:
    """A run's row id (foreign key of every other table) and its globally unique ``uid``."""

    id: int
    uid: str


@dataclass(frozen=True)
class ControlRequestRow:
    """One row of the control audit trail (``control_requests``)."""

    id: int
    run_id: int
    values: dict[str, Any]
    source: RequestSource
    requested_by: str
    requested_at: float
    status: RequestStatus
    applied_step: int | None
    applied_at: float | None
    reason: str | None  # why it was rejected
    note: str | None  # why it was asked for (the autopilot's reason), kept when rejected

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``{"id": 1, "run_id": 1, "values": {"growth_interval": 500}, ...}``."""
        return asdict(self)


def format_lr_groups(groups: tuple[tuple[float | None, ...], ...]) -> str:
    """Every param group's learning rate, optimizer by optimizer, as compact JSON (a rate
    not known or not finite as null).

    >>> format_lr_groups(((0.001, 0.0005), (0.01,)))
    '[[0.001,0.0005],[0.01]]'
    """
    return "[" + ",".join("[" + ",".join(map(_json_float, g)) + "]" for g in groups) + "]"


def parse_lr_groups(text: str | None) -> list[list[float | None]] | None:
    """:func:`format_lr_groups`'s text back (None stays None)."""
    return None if text is None else json.loads(text)


def _json_float(value: float | None) -> str:
    return repr(float(value)) if value is not None and isfinite(value) else "null"


def format_inf_ranks(ranks: tuple[int, ...]) -> str:
    """``(1, 3)`` -> ``"1,3"``; ``()`` -> ``""``."""
    return ",".join(map(str, ranks))


@dataclass(frozen=True, slots=True, kw_only=True)
class ScaleLoad:
    """A load as its scaler noted it. ``scale_before`` and ``from_step`` are None when the
    scaler had not stepped in this run (a new process resuming it): the store's last
    recorded step gives them, when the write comes.

    ``step`` is the step count loaded (the run's next step is ``step + 1``);
    ``from_step`` the step the run was at; ``at`` the wall time of the load.
    """

    step: int
    at: float
    scale_after: float
    scale_before: float | None = None
    from_step: int | None = None

    @property
    def jump(self) -> bool | None:
        """Whether the scale changed at the load; None while the scale before is unknown."""
        return None if self.scale_before is None else self.scale_before != self.scale_after
