"""Overflow diagnosis in the store: the loss of each step, the parameters of each overflow."""

from __future__ import annotations

import math
from typing import Any

import pytest
from sqlalchemy import event, select

from scalewatch.store import RunRef, StepRecord, Store
from scalewatch.store.records import ParamFinding
from scalewatch.store.runs import (
    create_run,
    finding_rows,
    step_values,
    write_step_values,
    write_steps,
)
from scalewatch.store.schema import overflow_params, steps
from tests._helpers.records import step_record


def _record(step: int, *, loss: float | None = 2.5, **diagnosis: Any) -> StepRecord:
    overflow = bool(diagnosis.get("params") or diagnosis.get("loss_nonfinite_ranks"))
    return step_record(
        step,
        overflow=overflow,
        inf_ranks=tuple(sorted({p.rank for p in diagnosis.get("params", ())})),
        scale_after=512.0 if overflow else 1024.0,
        loss=loss,
        **diagnosis,
    )


def _findings(store: Store, run_id: int) -> list[tuple[Any, ...]]:
    with store.read() as conn:
        rows = conn.execute(
            select(overflow_params)
            .where(overflow_params.c.run_id == run_id)
            .order_by(overflow_params.c.step, overflow_params.c.rank, overflow_params.c.name)
        ).all()
    return [tuple(row)[1:] for row in rows]


def _step_diagnosis(store: Store, run_id: int) -> dict[int, tuple[Any, ...]]:
    with store.read() as conn:
        rows = conn.execute(
            select(steps.c.step, steps.c.loss, steps.c.loss_nonfinite_ranks, steps.c.params_omitted)
            .where(steps.c.run_id == run_id)
            .order_by(steps.c.step)
        ).all()
    return {row[0]: tuple(row[1:]) for row in rows}


INF_ON_1 = ParamFinding(rank=1, name="encoder.layers.3.fc1.weight", kind="inf", count=12)
NAN_ON_0 = ParamFinding(rank=0, name="head.bias", kind="nan", count=3)
BOTH_ON_1 = ParamFinding(rank=1, name="head.bias", kind="both", count=7)


def test_records_with_findings_and_losses_read_back(store: Store, run: RunRef) -> None:
    records = [
        _record(1, loss=3.25),
        _record(2, loss=None),  # a loss the scaler never saw
        _record(3, loss=math.inf, loss_nonfinite_ranks=(0, 1), params=(NAN_ON_0, INF_ON_1)),
        _record(4, loss=2.0, params=(BOTH_ON_1,), params_omitted=5),
        _record(5, loss=math.nan, loss_nonfinite_ranks=(1,)),
    ]
    write_steps(store, run.id, records)
    assert _findings(store, run.id) == [
        (3, 0, "head.bias", "nan", 3),
        (3, 1, "encoder.layers.3.fc1.weight", "inf", 12),
        (4, 1, "head.bias", "both", 7),
    ]
    # A loss that is not finite is NULL on both backends; its ranks say it was not finite.
    assert _step_diagnosis(store, run.id) == {
        1: (3.25, "", 0),
        2: (None, "", 0),
        3: (None, "0,1", 0),
        4: (2.0, "", 5),
        5: (None, "1", 0),
    }


def test_rewriting_a_step_replaces_its_findings(store: Store, run: RunRef) -> None:
    write_steps(store, run.id, [_record(1), _record(2, params=(NAN_ON_0, INF_ON_1))])
    # A retried or replayed batch: step 2 found other parameters, step 1 now overflowed.
    write_steps(store, run.id, [_record(1, params=(INF_ON_1,)), _record(2, params=(BOTH_ON_1,))])
    assert _findings(store, run.id) == [
        (1, 1, "encoder.layers.3.fc1.weight", "inf", 12),
        (2, 1, "head.bias", "both", 7),
    ]
    write_steps(store, run.id, [_record(2, params_omitted=0)])  # clean this time
    assert _findings(store, run.id) == [(1, 1, "encoder.layers.3.fc1.weight", "inf", 12)]
    # One step twice in a batch: the later record's findings win where they overlap.
    later = ParamFinding(rank=0, name="head.bias", kind="inf", count=1)
    write_steps(store, run.id, [_record(3, params=(NAN_ON_0,)), _record(3, params=(later,))])
    assert _findings(store, run.id)[-1] == (3, 0, "head.bias", "inf", 1)


def test_findings_of_one_run_leave_another_alone(store: Store, run: RunRef) -> None:
    other = create_run(store, name="other", world_size=2, config={}, control={})
    write_steps(store, run.id, [_record(1, params=(INF_ON_1,))])
    write_steps(store, other.id, [_record(1, params=(NAN_ON_0,))])
    write_steps(store, other.id, [_record(1)])  # other's step 1 rewritten clean
    assert _findings(store, run.id) == [(1, 1, "encoder.layers.3.fc1.weight", "inf", 12)]
    assert _findings(store, other.id) == []


def test_finding_rows_are_what_write_step_values_takes(store: Store, run: RunRef) -> None:
    records = [_record(1), _record(7, params=(NAN_ON_0, INF_ON_1))]
    assert finding_rows(records) == [
        (7, 0, "head.bias", "nan", 3),
        (7, 1, "encoder.layers.3.fc1.weight", "inf", 12),
    ]
    assert finding_rows([_record(1), _record(2)]) == []
    write_step_values(store, run.id, [step_values(r) for r in records], finding_rows(records))
    assert [row[0] for row in _findings(store, run.id)] == [7, 7]


@pytest.mark.parametrize(
    ("finding", "message"),
    [
        ((9, 1, "w", "inf", 1), "step 9, which is not in the batch"),
        ((1, 1, "w", "big", 1), "inf, nan or both"),
        ((1, -1, "w", "inf", 1), ">= 0"),
    ],
)
def test_a_bad_finding_writes_nothing(
    store: Store, run: RunRef, finding: tuple[Any, ...], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        write_step_values(store, run.id, [step_values(_record(1))], [finding])
    assert _step_diagnosis(store, run.id) == {}
    assert _findings(store, run.id) == []


def test_a_long_name_is_cut_to_the_column(store: Store, run: RunRef) -> None:
    name = "block." * 100 + "weight"
    write_steps(store, run.id, [_record(1, params=(ParamFinding(0, name, "inf", 1),))])
    assert _findings(store, run.id) == [(1, 0, name[:500], "inf", 1)]


@pytest.mark.sqlite_only
def test_clean_batches_touch_no_findings(store: Store, run: RunRef) -> None:
    """The writer's batches of new, clean steps cost nothing for the diagnosis; a rewrite
    clears the findings of the steps it writes, one statement per run of steps."""
    statements: list[str] = []

    def trace(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.set_trace_callback(statements.append)

    event.listen(store.engine, "connect", trace)
    store.engine.dispose()
    write_steps(store, run.id, [_record(step) for step in range(1, 501)])
    assert not [sql for sql in statements if "overflow_params" in sql]
    write_steps(store, run.id, [_record(501, params=(INF_ON_1,))])
    assert len([sql for sql in statements if "overflow_params" in sql]) == 1
    statements.clear()
    write_steps(store, run.id, [_record(step) for step in (3, 4, 5, 9)])
    touched = [sql for sql in statements if "overflow_params" in sql]
    assert len(touched) == 2 and all(sql.startswith("DELETE") for sql in touched)
