"""A run's steps as the rules read them: one step (:class:`StepView`), or the steps of a
run read at once (:class:`StepBatch`, rows of ``scalewatch.store.watched.new_steps``).

>>> batch = StepBatch([(7, 1, 10.0, 8.0, 4.0, 1, 1, "0,1", None, 0, 0)])
>>> batch.steps, batch.column("skipped"), batch.views[0].inf_ranks
((1,), (1,), (0, 1))
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from scalewatch.store.queries import parse_ranks
from scalewatch.store.watched import WATCHED_COLUMNS

__all__ = ["StepBatch", "StepView"]


# StepView and Reading are made for every step and rule (tens of thousands a second on a
# busy service): not frozen, whose __init__ costs three times as much; nothing changes them.
@dataclass(slots=True)
class StepView:
    """One stored step, as the rules read it."""

    step: int
    wall_time: float
    scale: float
    scale_after: float
    overflow: bool
    skipped: bool
    inf_ranks: tuple[int, ...] = ()
    schedule_drift: int | None = None  # None: no LR scheduler registered
    loss_spike: bool = False  # the step's loss spiked (scalewatch.store.spikes)
    grad_norm_spike: bool = False  # its gradient norm did


class StepBatch:
    """New steps of one run, in step order, as stored (``WATCHED_COLUMNS`` less the run):
    by column, for a rule that can judge the batch as a whole, and as :class:`StepView`\\ s
    for one that reads it step by step. Each is made on first use, once for every rule."""

    def __init__(self, rows: Sequence[Sequence[Any]]) -> None:
        if not rows:
            raise ValueError("a batch has one step at least")
        self.rows = rows

    @cached_property
    def _columns(self) -> list[tuple[Any, ...]]:
        return list(zip(*self.rows, strict=True))

    def column(self, name: str) -> tuple[Any, ...]:
        """The values of one of ``WATCHED_COLUMNS`` (``inf_ranks`` as stored: ``"0,3"``, or
        empty), in step order."""
        return self._columns[_COLUMN[name]]

    @property
    def steps(self) -> tuple[int, ...]:
        return self.column("step")

    @property
    def wall_times(self) -> tuple[float, ...]:
        return self.column("wall_time")

    @cached_property
    def views(self) -> list[StepView]:
        return [_step_view(row) for row in self.rows]


_COLUMN = {name: i for i, name in enumerate(WATCHED_COLUMNS)}


def _step_view(row: Sequence[Any]) -> StepView:
    _run, step, wall_time, scale, scale_after, overflow, skipped, inf_ranks, drift, *spiked = row
    ranks = tuple(parse_ranks(inf_ranks)) if inf_ranks else ()
    view = StepView(
        step, wall_time, scale, scale_after, bool(overflow), bool(skipped), ranks, drift
    )
    view.loss_spike, view.grad_norm_spike = bool(spiked[0]), bool(spiked[1])
    return view
