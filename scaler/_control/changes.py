"""A scaler's changes of its factors, by request or by setter, applied through one rule.

Every change goes through ``_control.apply`` (the pure rule over a :class:`ControlState`)
and then ``_adopt``, which makes it hold on the tensors.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from .. import _control
from .._config import not_an_integer, refusal
from .._control import ControlOutcome, ControlSource, ControlState, ControlUpdate
from .._extras import Extras
from .._recording import RunLink

if TYPE_CHECKING:
    from .._torch_compat import TorchGradScaler as _Base
else:
    _Base = object


class Controlled(_Base):
    """The control half of :class:`scaler._scaler.Instrumented`."""

    _extras: Extras
    _link: RunLink
    _control_version: int

    def _clamp_scale(self) -> None:
        """Keep the scale, and the one a lazy scaler starts from, within min/max_scale."""
        if self._extras.bounded:
            self._init_scale = self._extras.clamped(self._init_scale)
            self._extras.clamp_(self._scale)

    def _controls_for_step(self) -> list[tuple[ControlUpdate, str | None]]:
        """Requests every rank applies at this update() boundary, each with a refusal or None."""
        return []

    def _control_now(self) -> ControlState:
        extras = self._extras
        return ControlState(
            growth_interval=self._growth_interval,
            growth_factor=self._growth_factor,
            backoff_factor=self._backoff_factor,
            min_scale=extras.min_scale,
            max_scale=extras.max_scale,
            hysteresis=extras.hysteresis,
        )

    def control_state(self) -> dict[str, float | int | None]:
        """The factors in effect (no scale: reading it would sync)."""
        return self._control_now().as_dict()

    def _apply_control(
        self, update: ControlUpdate, refusal_reason: str | None = None
    ) -> ControlOutcome:
        problem = refusal_reason
        if problem is None:
            new, problem = _control.apply(self._control_now(), update.values)
        if problem is None:
            self._adopt(new, update.values)
            self._control_version += 1
        return ControlOutcome(
            source=ControlSource.REQUEST,
            request_id=update.request_id,
            values=dict(update.values),
            applied=problem is None,
            reason=problem,
            state=self.control_state(),
            version=self._control_version,
        )

    def _adopt(self, new: ControlState, values: Mapping[str, float | int]) -> None:
        """Make ``new`` (and a requested scale) hold from the next update on."""
        old = self._control_now()
        self._growth_factor, self._backoff_factor = new.growth_factor, new.backoff_factor
        if new.growth_interval != old.growth_interval:
            self._growth_interval = new.growth_interval
            # torch grows only when tracker + 1 == interval: never leave the tracker past it.
            if self._growth_tracker is not None:
                self._growth_tracker.clamp_(max=new.growth_interval - 1)
            self._init_growth_tracker = min(self._init_growth_tracker, new.growth_interval - 1)
        if "scale" in values:
            if self._scale is not None:
                self._scale.fill_(float(values["scale"]))
            self._init_scale = float(values["scale"])
        for name in ("min_scale", "max_scale", "hysteresis"):
            if name in values:
                self._extras.set(name, values[name])
        if "min_scale" in values or "max_scale" in values:
            self._clamp_scale()

    def _set_by_code(self, name: str, value: float | int) -> None:
        problem = _control.check({name: value}, self.control_state() if self._enabled else {})
        if problem is not None:
            raise refusal(problem, value)
        if not self._enabled:  # as torch: only the attribute, which a disabled scaler ignores
            setattr(self, f"_{name}", value)
            return
        new, _ = _control.apply(self._control_now(), {name: value})
        self._adopt(new, {name: value})
        self._control_version += 1
        self._link.code_outcomes.append(
            ControlOutcome(
                source=ControlSource.CODE,
                request_id=None,
                values={name: value},
                applied=True,
                reason=None,
                state=self.control_state(),
                version=self._control_version,
            )
        )

    def set_growth_factor(self, new_factor: float) -> None:
        """Set a new scale growth factor (> 1); recorded in the audit trail as a change by code."""
        self._set_by_code("growth_factor", new_factor)

    def set_backoff_factor(self, new_factor: float) -> None:
        """Set a new scale backoff factor (< 1, and at least float32's smallest normal);
        recorded as a change by code."""
        self._set_by_code("backoff_factor", new_factor)

    def set_growth_interval(self, new_interval: int) -> None:
        """Set a new growth interval (an integer >= 1); recorded as a change by code.

        Lowering it below the current growth tracker grows at the next clean step.
        """
        error = not_an_integer("growth_interval", new_interval)
        if error is not None:
            raise error
        self._set_by_code("growth_interval", new_interval)
