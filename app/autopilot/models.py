"""Pydantic models of the autopilot's endpoints."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from scalewatch.store.autopilot import (
    AUTOPILOT_SCHEMAS,
    DEFAULT_COOLDOWN_STEPS,
    DEFAULT_MAX_CHANGES_PER_HOUR,
    DEFAULT_MAX_GROWTH_INTERVAL,
)
from scalewatch.store.states import AutopilotState

from ..models import StrictFloat, StrictInt
from .policy import DEFAULT_FLOOR

__all__ = ["AutopilotIn", "AutopilotOut"]


def _autopilot_schema(schema: dict[str, Any]) -> None:
    # Each field's rule as the store states it, so that the OpenAPI document refuses what
    # the store refuses; the optional ones may be null (their defaults).
    schema["examples"] = [{"enabled": True, "target_skip_rate": 0.01}]
    for name, field in schema["properties"].items():
        rule = AUTOPILOT_SCHEMAS.get(name)
        if rule is None:
            continue
        title, description = field.get("title"), field.get("description")
        field.clear()
        if name in schema.get("required", ()):
            field.update(rule)
        else:
            field.update(anyOf=[rule, {"type": "null"}], default=None)
        field.update(title=title, **({"description": description} if description else {}))


class AutopilotIn(BaseModel):
    """The autopilot of a run: on or off, the skipped-step rate to keep, and its bounds.

    The store checks every value (a 422 names the field): each interval as
    growth_interval's rule, min <= max, ``min_scale`` as the control's and not above the
    run's max_scale."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra=_autopilot_schema,
    )

    enabled: bool = Field(strict=True)
    target_skip_rate: StrictFloat = Field(gt=0, lt=1, description="e.g. 0.01: 1% of steps")
    min_growth_interval: StrictInt | StrictFloat | None = Field(
        default=None, description="default: the run's growth_interval when turned on"
    )
    max_growth_interval: StrictInt | StrictFloat | None = Field(
        default=None, description=f"default {DEFAULT_MAX_GROWTH_INTERVAL}"
    )
    min_scale: StrictFloat | None = Field(
        default=None, description=f"the floor a collapse sets; default {DEFAULT_FLOOR}"
    )
    cooldown_steps: StrictInt | StrictFloat | None = Field(
        default=None, description=f"steps between changes; default {DEFAULT_COOLDOWN_STEPS}"
    )
    max_changes_per_hour: StrictInt | StrictFloat | None = Field(
        default=None, description=f"default {DEFAULT_MAX_CHANGES_PER_HOUR}"
    )


class AutopilotOut(BaseModel):
    run_id: int
    enabled: bool
    state: AutopilotState = Field(
        description="off; watching (on); gave_up (on, but stopped itself: see reason);"
        " ended (on, but its run finished or crashed: it acts no more)"
    )
    target_skip_rate: float | None = None
    min_growth_interval: int | None = None
    max_growth_interval: int | None = None
    min_scale: float | None = None
    cooldown_steps: int | None = None
    max_changes_per_hour: int | None = None
    decision: dict[str, Any] | None = Field(
        default=None,
        description="the last decision: action (hold, raise, lower, floor, give_up), code,"
        " reason, values, step, at, request_id",
    )
    reason: str | None = Field(default=None, description="why it gave up")
    updated_at: float | None = None
