"""A scaler's changes of its factors, by request or by setter, applied through one rule.

Runs on the training thread of every rank. Functions over the control state, which lives
in torch's attributes of the scaler (the factors, the scale and growth tracker tensors)
and in its :class:`~scalewatch._scale_rules.ScaleRules` (min/max scale, hysteresis):
every change goes through ``_control.apply`` (the pure rule over a :class:`ControlState`)
and then :func:`adopt`, which makes it hold on the tensors.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from .. import _control
from .._control import ControlOutcome, ControlSource, ControlState, ControlUpdate
from .._scale_rules import ScaleRules

if TYPE_CHECKING:
    from .._torch_compat import TorchGradScaler


def current(scaler: TorchGradScaler, rules: ScaleRules) -> ControlState:
    """The factors in effect on ``scaler`` (no scale: reading it would sync)."""
    return ControlState(
        growth_interval=scaler._growth_interval,
        growth_factor=scaler._growth_factor,
        backoff_factor=scaler._backoff_factor,
        min_scale=rules.min_scale,
        max_scale=rules.max_scale,
        hysteresis=rules.hysteresis,
    )


def clamp_scale(scaler: TorchGradScaler, rules: ScaleRules) -> None:
    """Keep the scale, and the one a lazy scaler starts from, within min/max_scale."""
    if rules.bounded:
        scaler._init_scale = rules.clamped(scaler._init_scale)
        rules.clamp_(scaler._scale)


def apply_request(
    scaler: TorchGradScaler,
    rules: ScaleRules,
    update: ControlUpdate,
    refusal_reason: str | None,
    version: int,
) -> ControlOutcome:
    """Apply a request at this update() boundary, unless ``refusal_reason`` or the rules
    refuse it; the outcome's ``version`` is the control version after it."""
    problem = refusal_reason
    if problem is None:
        new, problem = _control.apply(current(scaler, rules), update.values)
    if problem is None:
        adopt(scaler, rules, new, update.values)
        version += 1
    return ControlOutcome(
        source=ControlSource.REQUEST,
        request_id=update.request_id,
        values=dict(update.values),
        applied=problem is None,
        reason=problem,
        state=current(scaler, rules).as_dict(),
        version=version,
    )


def apply_setter(
    scaler: TorchGradScaler, rules: ScaleRules, name: str, value: float | int, version: int
) -> ControlOutcome:
    """Apply a setter's change (checked already); the outcome's ``version`` is the control
    version after it."""
    new, _ = _control.apply(current(scaler, rules), {name: value})
    adopt(scaler, rules, new, {name: value})
    version += 1
    return ControlOutcome(
        source=ControlSource.CODE,
        request_id=None,
        values={name: value},
        applied=True,
        reason=None,
        state=current(scaler, rules).as_dict(),
        version=version,
    )


def adopt(
    scaler: TorchGradScaler, rules: ScaleRules, new: ControlState, values: Mapping[str, float | int]
) -> None:
    """Make ``new`` (and a requested scale) hold from the next update on."""
    old = current(scaler, rules)
    scaler._growth_factor, scaler._backoff_factor = new.growth_factor, new.backoff_factor
    if new.growth_interval != old.growth_interval:
        scaler._growth_interval = new.growth_interval
        # torch grows only when tracker + 1 == interval: never leave the tracker past it.
        if scaler._growth_tracker is not None:
            scaler._growth_tracker.clamp_(max=new.growth_interval - 1)
        scaler._init_growth_tracker = min(scaler._init_growth_tracker, new.growth_interval - 1)
    if "scale" in values:
        if scaler._scale is not None:
            scaler._scale.fill_(float(values["scale"]))
        scaler._init_scale = float(values["scale"])
    for name in ("min_scale", "max_scale", "hysteresis"):
        if name in values:
            rules.set(name, values[name])
    if "min_scale" in values or "max_scale" in values:
        clamp_scale(scaler, rules)
