"""The fields of a step, declared once: :class:`StepRecord`, each field with its column.

A field's column says how the store keeps it (its :class:`Kind`, whether it may be null),
how it rolls up into a chart bucket (:class:`Rollup`), and its key in the exports and in
the live stream, and under which name the trackers' mirrors log it. The ``steps`` table,
the row the writer inserts, the export columns, the stream's step event, the chart series
and what a mirror logs (:data:`MIRRORED`) are all derived from :data:`STEP_FIELDS`;
adding a field is one line here (and the migration that adds its column).

>>> [f.name for f in STEP_FIELDS][:3]
['step', 'wall_time', 'scale']
>>> SERIES_KEYS[:4]
('first_step', 'last_step', 'n', 'scale_min')
>>> [f.mirror_name for f in MIRRORED][:3]
['loss_scale', 'overflow', 'skipped']
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from enum import Enum
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from .records import ParamFinding

__all__ = [
    "MIRRORED",
    "SERIES",
    "SERIES_COLUMNS",
    "SERIES_KEYS",
    "STEP_FIELDS",
    "Fold",
    "Kind",
    "Rollup",
    "SeriesColumn",
    "SeriesSpec",
    "StepField",
    "StepRecord",
    "column",
]


class Kind(Enum):
    """How a field's value is kept in its ``steps`` column and shown in JSON."""

    INT = "int"
    FLOAT = "float"
    BOOL = "bool"  # 0/1 in rows read back, true/false in JSON
    RANKS = "ranks"  # a tuple of ranks kept as "1,3"; a list in JSON
    FLOAT_GROUPS = "float_groups"  # tuples of floats kept as JSON text; lists in JSON


class Fold(Enum):
    """How a field's values over a bucket's steps become that bucket's."""

    RANGE = "range"  # min and max, kept in step_rollups as <series>_min and <series>_max
    COUNT = "count"  # the number of steps flagged, kept in step_rollups as <series>
    LAST = "last"  # nothing kept: the value at the bucket's last step


@dataclass(frozen=True, slots=True, kw_only=True)
class Rollup:
    """A field's part in the chart series ``series``.

    Two fields may share a range: the scale's band spans the scale used and the one after.
    ``last``: the series also carries the value at the bucket's last step
    (``<series>_last``); ``kept_last``: step_rollups keeps that value too.
    """

    series: str
    fold: Fold
    last: bool = False
    kept_last: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class StepField:
    """One field of a step: its name, its column and its keys."""

    name: str
    kind: Kind
    nullable: bool = False
    key: bool = False  # part of the steps table's primary key (after run_id)
    server_default: str | None = None  # for rows stored before the column was added
    rollup: Rollup | None = None
    export: str = ""  # its column in CSV and its key in JSON Lines; "" for the name
    sse: str = ""  # its key in the stream's step event; "" for the name
    mirror: str | None = ""  # its name in a tracker (under scalewatch/); None: not logged
    finite_only: bool = False  # a value that is not finite is stored as NULL
    few_values: bool = False  # few distinct values a page (the CSV writer reuses reprs)

    def __post_init__(self) -> None:
        if self.nullable and self.kind not in (Kind.INT, Kind.FLOAT, Kind.FLOAT_GROUPS):
            raise ValueError(f"a {self.kind.value} field is never null: {self.name!r}")
        if self.kind is Kind.FLOAT_GROUPS and not self.nullable:
            raise ValueError(f"learning rates by group are null when all are one: {self.name!r}")

    @property
    def export_name(self) -> str:
        return self.export or self.name

    @property
    def sse_key(self) -> str:
        return self.sse or self.name

    @property
    def mirror_name(self) -> str:
        return self.mirror or self.name


def column(kind: Kind, **options: Any) -> dict[str, Any]:
    """A dataclass field's metadata naming its ``steps`` column (see :class:`StepField`)."""
    return {"column": {"kind": kind, **options}}


def _range(series: str, **options: Any) -> Rollup:
    return Rollup(series=series, fold=Fold.RANGE, **options)


@dataclass(frozen=True, slots=True, kw_only=True)
class StepRecord:
    """One telemetry record: what one ``update()`` did. A ``steps`` row has the same fields
    but ``params`` (rows of ``overflow_params``)."""

    step: int = field(metadata=column(Kind.INT, key=True))
    wall_time: float = field(metadata=column(Kind.FLOAT, mirror=None))  # a tracker's own axis
    scale: float = field(
        metadata=column(Kind.FLOAT, rollup=_range("scale"), few_values=True, mirror="loss_scale")
    )
    overflow: bool = field(  # found inf/NaN on any rank
        metadata=column(Kind.BOOL, rollup=Rollup(series="overflows", fold=Fold.COUNT))
    )
    skipped: bool = field(
        metadata=column(Kind.BOOL, rollup=Rollup(series="skipped", fold=Fold.COUNT))
    )
    inf_ranks: tuple[int, ...] = field(metadata=column(Kind.RANKS))  # local grads had inf/NaN
    scale_after: float = field(
        metadata=column(
            Kind.FLOAT, rollup=_range("scale", last=True, kept_last=True), few_values=True
        )
    )
    growth_tracker: int = field(  # after the update
        metadata=column(Kind.INT, rollup=_range("tracker", last=True, kept_last=True))
    )
    growth_interval: int = field(metadata=column(Kind.INT))
    growth_factor: float = field(metadata=column(Kind.FLOAT, few_values=True))
    backoff_factor: float = field(metadata=column(Kind.FLOAT, few_values=True))
    control_version: int = field(metadata=column(Kind.INT))
    # The reporting rank's loss as passed to scale(); None if unseen. Not finite: NULL
    # (loss_nonfinite_ranks says whose), on both backends (SQLite keeps inf, nulls NaN).
    loss: float | None = field(
        default=None,
        metadata=column(
            Kind.FLOAT, nullable=True, finite_only=True, rollup=_range("loss", last=True)
        ),
    )
    loss_nonfinite_ranks: tuple[int, ...] = field(  # whose loss was inf/NaN (overflow steps)
        default=(), metadata=column(Kind.RANKS, server_default="")
    )
    params: tuple[ParamFinding, ...] = ()  # overflow steps only; at most 32 per rank
    params_omitted: int = field(  # non-finite parameters beyond the 32 kept per rank
        default=0, metadata=column(Kind.INT, server_default="0")
    )
    lr: float | None = field(  # in effect: first group of the first optimizer stepped
        default=None,
        metadata=column(
            Kind.FLOAT, nullable=True, rollup=_range("lr", last=True), mirror="learning_rate"
        ),
    )
    lr_groups: tuple[tuple[float | None, ...], ...] | None = field(  # all, when one differs
        default=None, metadata=column(Kind.FLOAT_GROUPS, nullable=True)
    )
    # Skipped steps so far on which a registered LR scheduler stepped (the schedule's lead
    # over the weights); None when none is registered. A count that only grows.
    schedule_drift: int | None = field(
        default=None,
        metadata=column(
            Kind.INT, nullable=True, rollup=Rollup(series="schedule_drift", fold=Fold.LAST)
        ),
    )
    # The total L2 norm of the unscaled gradients (clip_grad_norm_'s value, every rank's
    # gradients), measured or handed in; None when neither. Not finite: NULL, as the loss.
    grad_norm: float | None = field(
        default=None,
        metadata=column(
            Kind.FLOAT, nullable=True, finite_only=True, rollup=_range("grad_norm", last=True)
        ),
    )
    # Whether the step's loss, or its gradient norm, spiked above the run's recent history
    # (set where the step is stored, scalewatch.store.spike_store; the spikes table has z).
    loss_spike: bool = field(
        default=False,
        metadata=column(
            Kind.BOOL, server_default="0", rollup=Rollup(series="loss_spikes", fold=Fold.COUNT)
        ),
    )
    grad_norm_spike: bool = field(
        default=False,
        metadata=column(
            Kind.BOOL,
            server_default="0",
            rollup=Rollup(series="grad_norm_spikes", fold=Fold.COUNT),
        ),
    )
    # Skipped for a spike (``skip_on_spike``), not an overflow: ``skipped`` is true, and
    # ``overflow`` false; the scale was not backed off for it.
    spike_skipped: bool = field(
        default=False,
        metadata=column(
            Kind.BOOL, server_default="0", rollup=Rollup(series="spike_skips", fold=Fold.COUNT)
        ),
    )
    # With grad_norm on: the ten largest per-parameter gradient norms of the reporting
    # rank (its shards'), largest first, as (name, norm); kept where the step overflowed or
    # spiked (rows of ``param_norms``).
    param_norms: tuple[tuple[str, float], ...] = ()


STEP_FIELDS: tuple[StepField, ...] = tuple(
    StepField(name=f.name, **f.metadata["column"])
    for f in fields(StepRecord)
    if "column" in f.metadata
)
if [f.name for f in STEP_FIELDS if f.key] != ["step"] or STEP_FIELDS[0].name != "step":
    raise ValueError("a step's key is its number, its first field")

# What the trackers' mirrors log of a step (``scalewatch.mirrors``): each field that is one
# number, but the step itself (their step axis) and those marked ``mirror=None``.
MIRRORED: tuple[StepField, ...] = tuple(
    f
    for f in STEP_FIELDS
    if f.kind in (Kind.INT, Kind.FLOAT, Kind.BOOL) and not f.key and f.mirror is not None
)


class SeriesColumn(NamedTuple):
    """One column of the chart series: its key, its values' kind, whether one may be null."""

    key: str
    kind: Kind
    nullable: bool


@dataclass(frozen=True, slots=True)
class SeriesSpec:
    """One chart series and the fields it rolls up, in declaration order."""

    name: str
    fold: Fold
    fields: tuple[StepField, ...]

    @property
    def last(self) -> StepField | None:
        """The field whose value at a bucket's last step the series carries."""
        shown = [f for f in self.fields if f.rollup is not None and f.rollup.last]
        return shown[0] if shown else (self.fields[-1] if self.fold is Fold.LAST else None)

    @property
    def kept_last(self) -> bool:
        return any(f.rollup is not None and f.rollup.kept_last for f in self.fields)

    @property
    def nullable(self) -> bool:
        return any(f.nullable for f in self.fields)

    @property
    def kept(self) -> tuple[str, ...]:
        """Its columns of step_rollups but a kept last."""
        if self.fold is Fold.RANGE:
            return (f"{self.name}_min", f"{self.name}_max")
        return (self.name,) if self.fold is Fold.COUNT else ()

    @property
    def stored(self) -> tuple[str, ...]:
        """Its columns of step_rollups."""
        return (*self.kept, *((f"{self.name}_last",) if self.kept_last else ()))

    @property
    def keys(self) -> tuple[str, ...]:
        """Its keys in the chart series."""
        return tuple(c.key for c in self.columns)

    @property
    def columns(self) -> tuple[SeriesColumn, ...]:
        """Its columns in the chart series (a range's ends are null for a bucket without
        values)."""
        if self.fold is Fold.COUNT:
            return (SeriesColumn(self.name, Kind.INT, False),)
        last = self.last
        if self.fold is Fold.LAST:
            assert last is not None  # a series folded so has its one field
            return (SeriesColumn(self.name, last.kind, last.nullable),)
        kind = self.fields[-1].kind
        ends = tuple(SeriesColumn(key, kind, self.nullable) for key in self.kept)
        if last is None:
            return ends
        return (*ends, SeriesColumn(f"{self.name}_last", last.kind, last.nullable))


def _series() -> tuple[SeriesSpec, ...]:
    grouped: dict[str, list[StepField]] = {}
    for f in STEP_FIELDS:
        if f.rollup is not None:
            grouped.setdefault(f.rollup.series, []).append(f)
    out = []
    for name, members in grouped.items():
        folds = {f.rollup.fold for f in members if f.rollup is not None}
        if len(folds) != 1:
            raise ValueError(f"the fields of the series {name!r} fold in different ways")
        fold = folds.pop()
        if fold is not Fold.RANGE and len(members) > 1:
            raise ValueError(f"only a range spans several fields, not the series {name!r}")
        out.append(SeriesSpec(name, fold, tuple(members)))
    return tuple(out)


SERIES: tuple[SeriesSpec, ...] = _series()
# The columns of the chart series: a bucket's steps, then each series'.
SERIES_COLUMNS: tuple[SeriesColumn, ...] = (
    SeriesColumn("first_step", Kind.INT, False),
    SeriesColumn("last_step", Kind.INT, False),
    SeriesColumn("n", Kind.INT, False),
    *(c for spec in SERIES for c in spec.columns),
)
SERIES_KEYS: tuple[str, ...] = tuple(c.key for c in SERIES_COLUMNS)
