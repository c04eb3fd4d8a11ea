"""Alerts: rules evaluated by the service over the store, delivered to the dashboard,
the API, ``/metrics``, the CLI and webhooks."""

from __future__ import annotations

from .config import AlertConfig, Rule, RulesFileError, Webhook, default_rules, load_rules
from .kinds import KINDS, Kind, Params, Reading, RunView, StepView, Watch, kind

__all__ = [
    "KINDS",
    "AlertConfig",
    "Kind",
    "Params",
    "Reading",
    "Rule",
    "RulesFileError",
    "RunView",
    "StepView",
    "Watch",
    "Webhook",
    "default_rules",
    "kind",
    "load_rules",
]
