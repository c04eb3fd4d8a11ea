from __future__ import annotations

import math
from dataclasses import fields

import pytest
from sqlalchemy import inspect

from scalewatch.store import upgrade
from scalewatch.store.engine import make_engine
from scalewatch.store.records import FindingKind, ParamFinding
from scalewatch.store.step_rows import EXPORT_COLUMNS, step_dict, step_values
from scalewatch.store.step_schema import (
    SERIES,
    SERIES_KEYS,
    STEP_FIELDS,
    Fold,
    Kind,
    StepField,
    StepRecord,
)
from tests._helpers.records import step_record

PYTHON_TYPES = {Kind.INT: int, Kind.FLOAT: float, Kind.BOOL: bool, Kind.RANKS: str}
PYTHON_TYPES[Kind.FLOAT_GROUPS] = str


def _columns(url: str, table: str) -> list[tuple[str, type, bool]]:
    engine = make_engine(url)
    try:
        reflected = inspect(engine).get_columns(table)
    finally:
        engine.dispose()
    return [(c["name"], c["type"].python_type, c["nullable"]) for c in reflected]


def test_the_steps_table_the_migrations_build_is_the_declarations(db_url: str) -> None:
    upgrade(db_url)
    declared = [(f.name, PYTHON_TYPES[f.kind], f.nullable) for f in STEP_FIELDS]
    assert _columns(db_url, "steps") == [("run_id", int, False), *declared]


def test_the_rollup_table_the_migrations_build_keeps_each_series(db_url: str) -> None:
    upgrade(db_url)
    built = {name: (kind, nullable) for name, kind, nullable in _columns(db_url, "step_rollups")}
    for spec in SERIES:
        for name in spec.stored:
            kind = int if spec.fold is Fold.COUNT else PYTHON_TYPES[spec.fields[-1].kind]
            assert built.pop(name) == (kind, spec.nullable and spec.fold is Fold.RANGE), name
    assert set(built) == {"run_id", "level", "bucket", "first_step", "last_step", "n"}


def test_every_field_of_a_record_but_its_findings_is_a_column() -> None:
    elsewhere = ("params", "param_norms")  # rows of overflow_params and param_norms
    assert [f.name for f in fields(StepRecord) if f.name not in elsewhere] == [
        f.name for f in STEP_FIELDS
    ]
    assert tuple(f.name for f in STEP_FIELDS) == EXPORT_COLUMNS


def test_a_record_becomes_its_row_and_the_row_its_json() -> None:
    record = step_record(
        4,
        wall_time=10.5,
        scale=65536.0,
        overflow=True,
        inf_ranks=(0, 3),
        scale_after=32768.0,
        control_version=1,
        loss=math.nan,
        loss_nonfinite_ranks=(3,),
        params=(ParamFinding(3, "fc.weight", FindingKind.INF, 2),),
        params_omitted=1,
        lr=0.001,
        lr_groups=((0.001, None),),
        schedule_drift=2,
        grad_norm=math.inf,
    )
    row = step_values(record)
    assert row == (
        *(4, 10.5, 65536.0, True, True, "0,3", 32768.0, 0, 2000, 2.0, 0.5, 1),
        *(None, "3", 1, 0.001, "[[0.001,null]]", 2, None, False, False, False),
    )
    shown = step_dict(row)
    assert shown["inf_ranks"] == [0, 3] and shown["loss_nonfinite_ranks"] == [3]
    assert shown["overflow"] is True and shown["lr_groups"] == [[0.001, None]]
    assert shown["loss"] is None and shown["schedule_drift"] == 2
    assert shown["grad_norm"] is None  # not finite: null, as the loss


def test_the_series_are_the_rollups_declared() -> None:
    assert (
        *("first_step", "last_step", "n", "scale_min", "scale_max", "scale_last"),
        *("overflows", "skipped", "tracker_min", "tracker_max", "tracker_last"),
        *("loss_min", "loss_max", "loss_last", "lr_min", "lr_max", "lr_last"),
        *("schedule_drift", "grad_norm_min", "grad_norm_max", "grad_norm_last"),
        *("loss_spikes", "grad_norm_spikes", "spike_skips"),
    ) == SERIES_KEYS


def test_a_finding_kind_is_named_whether_given_as_text_or_kind() -> None:
    assert ParamFinding(0, "w", "nan", 1).kind is FindingKind.NAN  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'neither'"):
        ParamFinding(0, "w", "neither", 1)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kind", "nullable", "message"),
    [(Kind.BOOL, True, "never null"), (Kind.FLOAT_GROUPS, False, "null when all are one")],
)
def test_a_field_the_store_could_not_show_is_refused(
    kind: Kind, nullable: bool, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        StepField(name="odd", kind=kind, nullable=nullable)
