"""The control fields and their rules, served: one source
(``scaler/store/control_rules.py``) for the store, the API's schema, the CLI and the
dashboard's form."""

from __future__ import annotations

from fastapi import APIRouter

from scalewatch.store.control_rules import FIELDS, PURPOSES, RULES, SCHEMAS, requirement

from ..models import ControlFieldRule, ControlRules

__all__ = ["CONTROL_RULES", "router"]

router = APIRouter(prefix="/api/control", tags=["control"])

CONTROL_RULES = ControlRules(
    fields=[
        ControlFieldRule(
            name=name,
            integer=SCHEMAS[name]["type"] == "integer",
            purpose=PURPOSES[name],
            requirement=requirement(name),
            rule=RULES[name],
            bounds=SCHEMAS[name],
        )
        for name in FIELDS
    ]
)


@router.get("/rules")
def control_rules() -> ControlRules:
    """Each control field, what it does and the rule its values keep: what
    ``POST /api/runs/{run}/control`` checks, in words and in JSON Schema."""
    return CONTROL_RULES
