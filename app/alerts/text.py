"""An alert said as a person would: its value and threshold in its kind's unit.

>>> said("rank_hotspot", 0.6363636363636364, 0.6, "last 11 overflows on rank 1")
'64% of the last 11 overflows on rank 1 (threshold 60%)'
>>> said("skip_streak", 12.0, 10.0, "")
'12 skipped steps in a row (threshold 10)'
"""

from __future__ import annotations

from scalewatch.store.alerts import AlertRow
from scalewatch.store.states import AlertState

from .kinds import KINDS
from .units import Unit

__all__ = ["alert_text", "said", "unit_of"]


def unit_of(kind: str) -> Unit | None:
    """The unit of a kind's value and threshold; None for a kind this service does not know
    (from a newer one sharing the store)."""
    known = KINDS.get(kind)
    return None if known is None else known.unit


def said(kind: str, value: float, threshold: float, detail: str) -> str:
    """The value of an alert of ``kind`` in words, with its threshold (kinds not known to
    this service, from a newer one sharing the store, read plainly)."""
    known = KINDS.get(kind)
    if known is None or ("{detail}" in known.says and not detail):  # a row from before details
        line = f"value {value:.4g}, threshold {threshold:.4g}"
        return f"{line} ({detail})" if detail else line
    words = known.says.format(value=known.unit.say(value), detail=detail)
    if known.unit is Unit.FLAG:
        return words
    return f"{words} (threshold {known.unit.say(threshold)})"


def alert_text(alert: AlertRow) -> str:
    """One line, as webhooks send it: ``scalewatch: skips (skip_rate) firing on run 'bert'
    (#3) at step 1200: 8% of the last 200 steps skipped (threshold 5%)``. A resolved alert
    says what it fired on."""
    words = said(alert.kind, alert.value, alert.threshold, alert.detail)
    head = (
        f"scalewatch: {alert.rule} ({alert.kind}) {alert.state} on run {alert.run_name!r}"
        f" (#{alert.run_id}) at step {alert.step}"
    )
    if alert.state is AlertState.RESOLVED:
        return f"{head}; it fired at step {alert.fired_step}: {words}"
    return f"{head}: {words}"
