"""The autopilot's policy: from a run's recent steps, its control and the autopilot's
settings and memory, the one change to make now, or none, always with a reason.

Plain functions of plain values (no store, no clock), so that recorded histories test it.

What ``growth_interval`` governs is how often the scale climbs back to where it overflows:
how often a streak of overflows begins. A run whose scale overflows whenever it passes a
ceiling skips about one step in ``growth_interval + 1``. The overflows that continue a
streak (the scale backing off step after step, to under a ceiling that fell) do not
depend on it: raising it would not help them.

>>> settings = Settings(target_skip_rate=0.01, min_growth_interval=20, max_growth_interval=10_000)
>>> window = Window(steps=500, skipped=24, streaks=24, overflow_free=20,
...                 scale_max=1024.0, scale_now=1024.0)
>>> decision = decide(window, Control(growth_interval=20, min_scale=None, max_scale=None),
...                   settings, Memory(steps_since_change=500))
>>> decision.action, decision.values
(<Action.RAISE: 'raise'>, {'growth_interval': 144})
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from scalewatch.store.autopilot import DEFAULT_COOLDOWN_STEPS, DEFAULT_MAX_CHANGES_PER_HOUR

__all__ = [
    "AIM",
    "COLLAPSE_HALVINGS",
    "DEFAULT_FLOOR",
    "GIVE_UP_AFTER",
    "HELPED",
    "MAX_RAISE",
    "Action",
    "Control",
    "Decision",
    "Memory",
    "Settings",
    "Window",
    "decide",
]

# A change aims at this share of the target: an aim at the target itself leaves a run that
# overflows a little more often than modelled just over it.
AIM = 0.7
# At most this factor on growth_interval in one raise.
MAX_RAISE = 16
# A raise helped when the skip rate after it is at most this far from the rate before it
# toward the rate it predicted (noise in a window of a few hundred steps moves a rate by a
# quarter of itself).
HELPED = 0.5
# Raises in a row that did not help before the autopilot stops itself.
GIVE_UP_AFTER = 2
# The scale collapsed when it is this many halvings under the window's highest.
COLLAPSE_HALVINGS = 10
# The floor set on a collapse when the settings name none.
DEFAULT_FLOOR = 1.0


class Action(StrEnum):
    HOLD = "hold"  # no change now; the reason says why
    RAISE = "raise"  # growth_interval up: streaks of overflows begin too often
    LOWER = "lower"  # growth_interval down: the scale has been stable for long
    FLOOR = "floor"  # min_scale set: the scale collapsed
    GIVE_UP = "give_up"  # its changes do not help: it stops itself


@dataclass(frozen=True, slots=True)
class Window:
    """The run's latest steps since the last applied change (at most a window of them)."""

    steps: int
    skipped: int
    streaks: int  # overflows after a step that did not overflow: streaks begun
    overflow_free: int  # steps since the window's last overflow (all of them: none)
    scale_max: float  # the highest scale used in the window
    scale_now: float  # the scale after the last step

    @property
    def skip_rate(self) -> float:
        return self.skipped / self.steps if self.steps else 0.0

    @property
    def streak_rate(self) -> float:
        return self.streaks / self.steps if self.steps else 0.0


@dataclass(frozen=True, slots=True)
class Control:
    """The run's control values in effect that the policy reads."""

    growth_interval: int
    min_scale: float | None
    max_scale: float | None


@dataclass(frozen=True, slots=True)
class Settings:
    target_skip_rate: float
    min_growth_interval: int
    max_growth_interval: int
    min_scale: float | None = None
    cooldown_steps: int = DEFAULT_COOLDOWN_STEPS
    max_changes_per_hour: int = DEFAULT_MAX_CHANGES_PER_HOUR


@dataclass(frozen=True, slots=True)
class Memory:
    """What the autopilot knows beyond the window: from its state row and the audit trail."""

    steps_since_change: int  # since the last applied change of the run's control, any source
    pending: bool = False  # a request of its own not applied yet
    changes_last_hour: int = 0  # its requests of the last hour
    # Under this skip rate its last raise counts as helping (None: no raise to judge).
    helped_below: float | None = None
    misses: int = 0  # raises in a row that did not help


@dataclass(frozen=True, slots=True)
class Decision:
    action: Action
    code: str  # a short, stable name of the reason, e.g. "cooldown"
    reason: str
    values: dict[str, Any] = field(default_factory=dict)  # the control request; {} for none
    misses: int = 0
    helped_below: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "action": str(self.action),
            "code": self.code,
            "reason": self.reason,
            "values": dict(self.values),
        }


def _pct(rate: float) -> str:
    return f"{rate * 100:.2f}%"


def decide(window: Window, control: Control, settings: Settings, memory: Memory) -> Decision:
    """The decision for a run now; see the module's docstring."""
    held = _hold(window, settings, memory)
    if held is not None:
        return held
    decision = _judge(window, control, settings, memory)
    if decision.values and memory.changes_last_hour >= settings.max_changes_per_hour:
        reason = (
            f"{memory.changes_last_hour} changes in the last hour, the most it makes: not"
            f" now: {decision.reason}"
        )
        return _keep(Action.HOLD, "hourly_limit", reason, memory)
    return decision


def _judge(window: Window, control: Control, settings: Settings, memory: Memory) -> Decision:
    if _collapsed(window) and _floor_missing(control, settings):
        floor = _floor(settings)
        reason = (
            f"the scale collapsed to {window.scale_now:g} from {window.scale_max:g} within"
            f" {window.steps} steps: min_scale floor set to {floor:g}"
        )
        return _change(Action.FLOOR, "collapse", reason, {"min_scale": floor})
    if window.skip_rate > settings.target_skip_rate:
        return _too_many_skips(window, control, settings, memory)
    return _within_target(window, control, settings, memory)


def _hold(window: Window, settings: Settings, memory: Memory) -> Decision | None:
    def keep(code: str, reason: str) -> Decision:
        return _keep(Action.HOLD, code, reason, memory)

    if memory.pending:
        return keep("pending", "waiting for its request to apply")
    if memory.steps_since_change < settings.cooldown_steps or window.steps < min(
        settings.cooldown_steps, memory.steps_since_change
    ):
        reason = (
            f"cooling down: {memory.steps_since_change} steps since the last change,"
            f" {settings.cooldown_steps} between changes"
        )
        return keep("cooldown", reason)
    return None


def _collapsed(window: Window) -> bool:
    return window.scale_now <= window.scale_max / 2.0**COLLAPSE_HALVINGS


def _floor(settings: Settings) -> float:
    return settings.min_scale if settings.min_scale is not None else DEFAULT_FLOOR


def _floor_missing(control: Control, settings: Settings) -> bool:
    floor = _floor(settings)
    if control.max_scale is not None and floor > control.max_scale:
        return False
    return control.min_scale is None or control.min_scale < floor


def _predicted(window: Window, interval: int, new: int) -> float:
    """The skip rate at growth_interval ``new``: streaks begin ``(interval + 1) / (new + 1)``
    times as often, the other skipped steps stay."""
    other = window.skip_rate - window.streak_rate
    return max(other, 0.0) + window.streak_rate * (interval + 1) / (new + 1)


def _too_many_skips(
    window: Window, control: Control, settings: Settings, memory: Memory
) -> Decision:
    target, rate, interval = settings.target_skip_rate, window.skip_rate, control.growth_interval
    misses = memory.misses
    if memory.helped_below is not None:
        misses = misses + 1 if rate > memory.helped_below else 0
        if misses >= GIVE_UP_AFTER:
            reason = (
                f"{misses} raises of growth_interval in a row did not lower the skipped-step"
                f" rate enough (under {_pct(memory.helped_below)} expected, {_pct(rate)} now;"
                f" target {_pct(target)})"
            )
            return Decision(Action.GIVE_UP, "no_effect", reason, misses=misses)
    aim = AIM * target
    if window.streak_rate <= aim:
        reason = (
            f"skipped-step rate {_pct(rate)} over {window.steps} steps, above the target"
            f" {_pct(target)}, but streaks of overflows begin at {_pct(window.streak_rate)}:"
            " the rest continue streaks (the scale backing off to under a lower ceiling),"
            " and raising growth_interval would not help"
        )
        return _keep(Action.HOLD, "streaks", reason, memory)
    if interval >= settings.max_growth_interval:
        reason = (
            f"skipped-step rate {_pct(rate)} above the target {_pct(target)} with"
            f" growth_interval at its upper bound {settings.max_growth_interval}"
        )
        return Decision(Action.GIVE_UP, "at_bound", reason, misses=misses)
    # The smallest interval at which streaks begin at the aim; the overflows continuing a
    # streak pass (a ceiling that fell), so they are not aimed at.
    needed = math.ceil(window.streak_rate * (interval + 1) / aim) - 1
    new = min(max(needed, interval + 1), interval * MAX_RAISE, settings.max_growth_interval)
    predicted = _predicted(window, interval, new)
    reason = (
        f"skipped-step rate {_pct(rate)} over {window.steps} steps, above the target"
        f" {_pct(target)}: growth_interval {interval} -> {new} (predicted {_pct(predicted)})"
    )
    return Decision(
        Action.RAISE,
        "above_target",
        reason,
        {"growth_interval": new},
        misses=misses,
        helped_below=rate - HELPED * max(rate - predicted, 0.0),
    )


def _within_target(
    window: Window, control: Control, settings: Settings, memory: Memory
) -> Decision:
    target, rate, interval = settings.target_skip_rate, window.skip_rate, control.growth_interval
    lowest = settings.min_growth_interval
    if interval > lowest and memory.steps_since_change >= 2 * settings.cooldown_steps:
        new = max(lowest, interval // 2)
        quiet = window.overflow_free >= 2 * settings.cooldown_steps
        predicted = _predicted(window, interval, new)
        if quiet or predicted <= AIM * target:
            why = (
                f"no overflow in {window.overflow_free} steps"
                if quiet
                else f"skipped-step rate {_pct(rate)}, predicted {_pct(predicted)} at {new}"
            )
            reason = f"the scale has been stable ({why}): growth_interval {interval} -> {new}"
            return _change(Action.LOWER, "stable", reason, {"growth_interval": new})
    reason = (
        f"skipped-step rate {_pct(rate)} over {window.steps} steps, within the target"
        f" {_pct(target)}"
    )
    return Decision(Action.HOLD, "within_target", reason)


def _keep(action: Action, code: str, reason: str, memory: Memory) -> Decision:
    """A decision that leaves what the autopilot remembers as it is."""
    return Decision(action, code, reason, misses=memory.misses, helped_below=memory.helped_below)


def _change(action: Action, code: str, reason: str, values: dict[str, Any]) -> Decision:
    """A change other than a raise: there is no raise to judge after it."""
    return Decision(action, code, reason, values, misses=0, helped_below=None)
