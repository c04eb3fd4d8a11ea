"""The user's LR schedulers, registered with a scaler: their steps counted, held on request.

Runs on the training thread of every rank. A registered scheduler's ``step`` is wrapped on
the instance (its class is left alone): each call is noted as belonging to the last
``update()``'s step or, between ``scaler.step()`` and ``update()``, to the step in
progress, and the recorder thread later adds to the run's ``schedule_drift`` the calls
that went to a step it read as skipped (no sync: see ``recorder._materialise``). A held
scheduler's call on a skipped step does nothing at all, so its ``last_epoch`` counts the
optimizer's real steps.

Whether a scheduler is held lives in its own ``__dict__`` (``HELD``), so it round-trips
with the scheduler's ``state_dict()``: a resumed job that registers the scheduler again
and loads its state keeps holding. The wrappers themselves are left out of the state
dict, and a pickled or copied scheduler comes back with its class's own ``step``.

>>> import torch
>>> opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1)
>>> sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.5**step)
>>> class Owner:  # what a scaler answers (see Instrumented._stepping, _skipped)
...     def _stepping(self): return False
...     def _skipped(self, now): return True
>>> owner = Owner()
>>> schedules = Schedules(owner)
>>> schedules.add(sched, hold=True)
>>> sched.step(); sched.last_epoch  # held on a skipped step: nothing happened
0
>>> schedules.take(), HELD in sched.state_dict(), "step" in sched.state_dict()
((0, 0), True, False)
"""

from __future__ import annotations

import weakref
from typing import Any, Protocol

__all__ = ["HELD", "Schedules"]

HELD = "_scalewatch_held"  # in a scheduler's __dict__: True while it is held
_OURS = ("step", "state_dict")  # the instance attributes set here, never in a state dict


class Owner(Protocol):
    """What a scheduler's step asks of the scaler it is registered with."""

    def _stepping(self) -> bool: ...

    def _skipped(self, now: bool) -> bool: ...


class Schedules:
    """A scaler's registered schedulers and the calls of their ``step`` since the last
    ``update()``: ``before`` (belonging to the last update's step) and ``after`` (to the
    step in progress), scheduler by scheduler."""

    def __init__(self, owner: Owner) -> None:
        self.owner = weakref.ref(owner)  # a scheduler must not keep its scaler alive
        self.names: list[str] = []
        self.held: list[Any] = []  # weak references to the schedulers, to say which hold
        self.before: list[int] = []
        self.after: list[int] = []

    def add(self, scheduler: Any, *, hold: bool) -> None:
        """Register ``scheduler`` (again: its count is kept); ``hold`` sets it held."""
        if not callable(getattr(scheduler, "step", None)) or not hasattr(scheduler, "optimizer"):
            raise TypeError(
                f"expected a learning-rate scheduler (with step() and .optimizer), got "
                f"{type(scheduler).__name__}"
            )
        if hold:
            setattr(scheduler, HELD, True)
        current = scheduler.__dict__.get("step")
        if isinstance(current, _Step) and current.schedules is self:
            return
        index = len(self.names)
        self.names.append(type(scheduler).__name__)
        self.held.append(weakref.ref(scheduler))
        self.before.append(0)
        self.after.append(0)
        scheduler.step = _Step(self, index, scheduler)
        scheduler.state_dict = _StateDict(scheduler)

    def take(self) -> tuple[int, int]:
        """The most calls any one scheduler made since the last ``update()``, before and
        after this step's optimizers stepped; the counts start again."""
        before, after = self.before, self.after
        counts = (max(before, default=0), max(after, default=0))
        if counts != (0, 0):
            self.before = [0] * len(before)
            self.after = [0] * len(after)
        return counts

    def described(self) -> list[dict[str, Any]]:
        """For the run's config: each scheduler's class and whether it holds."""
        return [
            {"name": name, "held": bool(getattr(ref(), HELD, False))}
            for name, ref in zip(self.names, self.held, strict=True)
        ]


class _Step:
    """A registered scheduler's ``step``: noted, or skipped when held on a skipped step."""

    __slots__ = ("index", "method", "schedules")

    def __init__(self, schedules: Schedules, index: int, scheduler: Any) -> None:
        self.schedules = schedules
        self.index = index
        self.method = type(scheduler).step.__get__(scheduler)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        schedules = self.schedules
        owner = schedules.owner()
        if owner is None:  # its scaler is gone: a plain scheduler again
            return self.method(*args, **kwargs)
        now = owner._stepping()
        if getattr(self.method.__self__, HELD, False) and owner._skipped(now):
            return None  # the optimizer did not step: neither does the schedule
        counts = schedules.after if now else schedules.before
        counts[self.index] += 1
        return self.method(*args, **kwargs)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_class_method, (self.method.__self__, "step"))


class _StateDict:
    """A registered scheduler's ``state_dict``: its class's, less the wrappers set here."""

    __slots__ = ("method",)

    def __init__(self, scheduler: Any) -> None:
        self.method = type(scheduler).state_dict.__get__(scheduler)

    def __call__(self) -> dict[str, Any]:
        state: dict[str, Any] = self.method()
        for name in _OURS:
            state.pop(name, None)
        return state

    def __reduce__(self) -> tuple[Any, ...]:
        return (_class_method, (self.method.__self__, "state_dict"))


def _class_method(scheduler: Any, name: str) -> Any:
    """``scheduler``'s class's own ``name``, bound: what a copy of it gets back."""
    return getattr(type(scheduler), name).__get__(scheduler)
