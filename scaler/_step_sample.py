"""What a step hands to telemetry: a :class:`StepSample`, or on a cpu step a plain row.

Imports no torch: the telemetry writer's own process reads these too
(:mod:`scalewatch.telemetry._host`).

A step with nothing rare about it (no control change, no overflow explained) travels as a
plain tuple in :class:`TrainingRow`'s order: made on the training thread in a tenth of the
time a :class:`~scalewatch.store.records.StepRecord` takes, and pickled as fast. It holds
plain values only (one optimizer's one learning rate is the rate itself: :func:`row_rates`),
so the garbage collector stops tracking it at its first collection while it waits to be
sent. The writer process makes it its ``steps`` row (:func:`row_values`), or its record
(:func:`record_of`) where a mirror or its parameter norms need one.

>>> row = TrainingRow(7, 1.5, 1024.0, False, False, (), 1024.0, 3, 100, 2, 0.5, 0, 2.5,
...                   ((0.1,),), None, 0.75, (), False)
>>> record = record_of(tuple(row))
>>> record.step, record.lr, record.growth_factor, record.lr_groups, record.grad_norm
(7, 0.1, 2.0, None, 0.75)
>>> step_rates([(0.1,), (0.1,)]), step_rates([(0.1,), (0.2,)]), step_rates([])
((0.1, None), (0.1, ((0.1,), (0.2,))), (None, None))
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any, NamedTuple

from ._control import ControlOutcome
from .store.records import StepRecord
from .store.step_rows import values_function

__all__ = [
    "Rates",
    "RowRates",
    "StepSample",
    "TrainingRow",
    "record_of",
    "row_rates",
    "row_values",
    "step_rates",
]

Rates = tuple[float | None, ...]  # one optimizer's learning rates, group by group
# A row's rates: one optimizer's one group's rate, itself (None: not read), else each
# optimizer's (row_rates)
RowRates = float | None | tuple[Rates, ...]


@dataclass(frozen=True, slots=True)
class StepSample:
    """One ``update()`` as the host sees it, with the control changes made at it."""

    record: StepRecord
    controls: tuple[ControlOutcome, ...] = ()


class TrainingRow(NamedTuple):
    """A clean step's values as the training thread hands them over, in this order.

    Each field but ``rates`` is the :class:`StepRecord` field of its name; ``rates`` are
    each optimizer's learning rates, of which the record's ``lr`` and ``lr_groups`` are
    made (:func:`step_rates`). Fields a clean step never sets take their defaults.
    """

    step: int
    wall_time: float
    scale: float
    overflow: bool
    skipped: bool
    inf_ranks: tuple[int, ...]
    scale_after: float
    growth_tracker: int
    growth_interval: int
    growth_factor: float
    backoff_factor: float
    control_version: int
    loss: float | None
    rates: RowRates
    schedule_drift: int | None
    grad_norm: float | None
    param_norms: tuple[tuple[str, float], ...]
    spike_skipped: bool


_RECORD_FIELDS = {f.name for f in fields(StepRecord)}
if not set(TrainingRow._fields) - {"rates"} <= _RECORD_FIELDS:
    raise TypeError("every TrainingRow field but rates is a StepRecord field")

_new = object.__new__  # see recorder.make: keywords to __init__ directly, twice as fast


def record_of(row: tuple[Any, ...]) -> StepRecord:
    """The record of a row in :class:`TrainingRow`'s order."""
    (
        step,
        wall_time,
        scale,
        overflow,
        skipped,
        inf_ranks,
        scale_after,
        tracker,
        interval,
        growth,
        backoff,
        version,
        loss,
        rates,
        drift,
        norm,
        param_norms,
        spike_skipped,
    ) = row
    lr, lr_groups = step_rates(rates)
    record = _new(StepRecord)
    StepRecord.__init__(
        record,
        step=step,
        wall_time=wall_time,
        scale=scale,
        overflow=overflow,
        skipped=skipped,
        inf_ranks=inf_ranks,
        scale_after=scale_after,
        growth_tracker=tracker,
        growth_interval=interval,
        growth_factor=float(growth),  # an int as torch keeps it: stored as float
        backoff_factor=float(backoff),
        control_version=version,
        loss=loss,
        lr=lr,
        lr_groups=lr_groups,
        schedule_drift=drift,
        grad_norm=norm,
        param_norms=param_norms,
        spike_skipped=spike_skipped,
    )
    return record


def row_rates(rates: tuple[Rates, ...]) -> RowRates:
    """A step's rates as its row carries them: the rate itself where one optimizer with one
    param group stepped, else each optimizer's.

    A row of plain values (no tuple within) is one the garbage collector stops tracking at
    its first collection; a row holding a tuple stays tracked while it waits to be sent,
    and rows that survive collections bring on the full ones, which take a training
    process hundreds of milliseconds.

    >>> row_rates(((0.1,),)), row_rates(((0.1, 0.01),)), row_rates(())
    (0.1, ((0.1, 0.01),), ())
    """
    if len(rates) == 1 and len(rates[0]) == 1:
        return rates[0][0]
    return rates


def step_rates(rates: Sequence[Rates] | RowRates) -> tuple[float | None, tuple[Rates, ...] | None]:
    """``(lr, groups)`` of a step: the first group's rate of the first optimizer stepped,
    and every group's, optimizer by optimizer, only when one differs from it. ``rates``:
    each optimizer's, or one rate as a row carries it (:func:`row_rates`)."""
    if rates is None or isinstance(rates, float | int):
        return None if rates is None else float(rates), None
    if not rates or not rates[0]:
        return None, None
    first = rates[0][0]
    if all(rate == first for one in rates for rate in one):
        return first, None
    return first, tuple(rates)


def _row_sources() -> dict[str, str]:
    """Each StepRecord field's value, as an expression of a row ``r`` in TrainingRow's order
    (``lr`` and ``lr_groups`` bound by the prologue; a field no row carries, its default)."""
    at = {name: i for i, name in enumerate(TrainingRow._fields)}
    sources = {"lr": "lr", "lr_groups": "lr_groups"}
    for f in fields(StepRecord):
        if f.name in at:
            value = f"r[{at[f.name]}]"
            # an int as torch keeps it: stored as float (as record_of)
            sources[f.name] = f"float({value})" if f.type == "float" else value
        elif f.name not in sources:
            sources[f.name] = repr(f.default)
    return sources


row_values = values_function(
    "row_values",
    _row_sources(),
    prologue=f"    lr, lr_groups = step_rates(r[{TrainingRow._fields.index('rates')}])\n",
    namespace={"step_rates": step_rates},
)
row_values.__doc__ = """A row in TrainingRow's order as its ``steps`` row after ``run_id``: the
:func:`~scalewatch.store.step_rows.step_values` of its :func:`record_of`, made in one call
with no record between (the writer process's way, every clean step)."""
