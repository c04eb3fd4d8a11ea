"""What a rule kind is made of: the parameters model, the watch that evaluates one rule on one
run, and the registry of kind name -> both (:data:`KINDS`), which :mod:`.kinds` fills.

A watch is one rule on one run. The evaluator feeds it the run's steps in order and, once
per tick, the clock; after each it says whether the rule's condition holds and the value
it compared. A new kind is a parameters model and a watch class, registered with
:func:`kind`::

    class Floor(Params):
        threshold: float = 1.0

    @kind("scale_below", Floor, "the scale after a step under the threshold",
          unit=Unit.SCALE, says="scale {value}")
    class ScaleBelow(Watch):
        def step(self, row: StepView) -> Reading:
            return Reading(row.scale_after < self.params.threshold, row.scale_after)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, TypeVar

from pydantic import BaseModel, ConfigDict

from .steps import StepBatch, StepView
from .units import Unit

__all__ = ["KINDS", "Fed", "Kind", "Params", "Reading", "RunView", "Watch", "Windowed", "kind"]


@dataclass(frozen=True, slots=True)
class RunView:
    """A run as the clock side of the rules reads it, once per tick."""

    id: int
    name: str
    world_size: int
    running: bool  # its stored status: a silent job still reads as running
    started_at: float
    last_step: int  # the newest step fed to the watches (0 before any)
    last_wall_time: float | None  # that step's wall time
    autopilot_gave_up: str | None = None  # its reason, while the run's autopilot has stopped itself
    min_scale: float | None = None  # the scaler's min_scale, where it was made with one


# Reading is made for many steps and rules: not frozen, whose __init__ costs three times as much.
@dataclass(slots=True)
class Reading:
    """Whether a rule's condition holds, the value compared with its threshold, and, when
    known better than the step's own wall time, when the condition turned (``at``)."""

    on: bool
    value: float
    detail: str = ""
    at: float | None = None


class Fed(NamedTuple):
    """What a watch says of a batch of steps: the readings at which its condition turned,
    by their index in the batch, and the last step's reading (None: it read no step)."""

    turns: list[tuple[int, Reading]]
    last: Reading | None


class Params(BaseModel):
    """A rule's parameters in the rules file, beside ``name``, ``kind`` and ``run``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    threshold: float


P = TypeVar("P", bound=Params)


class Watch(Generic[P]):
    """One rule on one run. ``history`` is how many steps before the newest it must be fed
    to know its condition (a window's width), when the service starts watching a run."""

    def __init__(self, params: P, run: RunView) -> None:
        self.params = params
        self.run = run

    @property
    def history(self) -> int:
        return 1

    def step(self, row: StepView) -> Reading | None:
        """After each new step; None: this kind does not look at steps."""
        return None

    def feed(self, batch: StepBatch, on: bool) -> Fed:
        """:meth:`step` over each step of ``batch``, saying where the condition turns from
        ``on`` (whether it held before the batch); a batch that :meth:`quiet` takes whole
        is not read step by step."""
        last = None if on else self.quiet(batch)
        if last is not None:
            return Fed([], last)
        turns = []
        for i, row in enumerate(batch.views):
            reading = self.step(row)
            if reading is None:
                continue
            last = reading
            if bool(reading.on) != on:
                on = not on
                turns.append((i, reading))
        return Fed(turns, last)

    def quiet(self, batch: StepBatch) -> Reading | None:
        """With the condition off before ``batch``: if none of its steps can turn it on,
        take them in at once and return the last one's reading; None: read them one by one
        (the default)."""
        return None

    def clock(self, run: RunView, now: float) -> Reading | None:
        """Once per tick, after the tick's steps; None: this kind does not look at time."""
        return None


@dataclass(frozen=True)
class Kind:
    name: str
    params: type[Params]
    watch: Callable[[Any, RunView], Watch[Any]]
    condition: str  # when it fires, for docs/ALERTS.md's table and ``--help``
    applies: Callable[[RunView], bool]
    default: bool  # in the default rule set
    unit: Unit  # of its value and threshold
    says: str  # its value in words: "{value} skipped steps in a row", with the reading's {detail}


KINDS: dict[str, Kind] = {}

W = TypeVar("W", bound=type[Watch[Any]])


def kind(
    name: str,
    params: type[Params],
    condition: str,
    *,
    unit: Unit = Unit.NUMBER,
    says: str = "value {value}",
    applies: Callable[[RunView], bool] = lambda run: True,
    default: bool = True,
) -> Callable[[W], W]:
    """Register a watch class as the rule kind ``name`` with its parameters model (whose
    defaults are those of the default rule of that kind when ``default``). ``says`` puts
    an alert's value (in ``unit``) and its reading's ``{detail}`` in words."""

    def register(watch: W) -> W:
        KINDS[name] = Kind(name, params, watch, condition, applies, default, unit, says)
        return watch

    return register


class Windowed(Watch[P]):
    """Keeps ``(step, item)`` of the last ``window`` steps for which ``item`` is not None."""

    def __init__(self, params: P, run: RunView) -> None:
        super().__init__(params, run)
        self.window: int = getattr(params, "window")  # noqa: B009  (every windowed model has one)
        self.items: deque[tuple[int, Any]] = deque()
        self.first: int | None = None

    @property
    def history(self) -> int:
        return self.window

    def slide(self, row: StepView, item: Any) -> list[Any]:
        """Add ``item`` of ``row`` and return the items that left the window."""
        if self.first is None:
            self.first = row.step
        if item is not None:
            self.items.append((row.step, item))
        gone = []
        while self.items and self.items[0][0] <= row.step - self.window:
            gone.append(self.items.popleft()[1])
        return gone

    def pass_over(self, steps: Sequence[int]) -> None:
        """Take in ``steps`` that add no item: what leaves the window by the last leaves."""
        if self.first is None:
            self.first = steps[0]
        while self.items and self.items[0][0] <= steps[-1] - self.window:
            self.items.popleft()

    def full(self, row: StepView) -> bool:
        return self.first is not None and row.step - self.first + 1 >= self.window
