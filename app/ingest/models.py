"""The bodies of the ingest routes: a run opened, a batch of its records, the answer.

A step travels as an object keyed by its fields' names (``StepsIn``), or, to a service
that names its columns when a run is opened (``RunOpened.step_columns``), as a row of
those columns' values (``StepRowsIn``: a third of the bytes, and less than half the work
on either side). Both models are derived from the step schema
(:data:`~scalewatch.store.step_schema.STEP_FIELDS`), so a field declared there is taken
here with no change. Values travel as the store keeps them (``step_values``): a flag as a
boolean, ranks as ``"1,3"``, learning rates by group as JSON text.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    create_model,
)

from scalewatch.store.control_rules import FIELDS
from scalewatch.store.schema import PARAM_NAME_LENGTH
from scalewatch.store.step_rows import COLUMNS
from scalewatch.store.step_schema import STEP_FIELDS, Kind, StepField

__all__ = [
    "MAX_ITEMS",
    "MAX_STEPS",
    "BatchAnswer",
    "BatchIn",
    "ControlIn",
    "ControlValuesIn",
    "FindingIn",
    "GapIn",
    "LoadIn",
    "OutcomeIn",
    "PendingControl",
    "RunOpen",
    "RunOpened",
    "StepIn",
    "StepRowsIn",
    "StepsIn",
]

MAX_STEPS = 5000  # steps in one batch (the trainer's writer batches at most this many)
MAX_ITEMS = 1000  # other items in one batch


def _integral(value: Any) -> Any:
    """A float with no fraction is the integer it equals (JSON Schema's integers include
    ``3.0``); ``true`` stays no integer."""
    return int(value) if type(value) is float and value.is_integer() else value


_WHOLE = BeforeValidator(_integral)
StrictBool = Annotated[bool, Strict()]
# Bounds inside, before the validator: they are in the JSON Schema too. The store's integer
# columns are 32 bits on PostgreSQL: a value past them would fail the write, not the body.
INT4_MAX = (1 << 31) - 1
Count = Annotated[int, Strict(), Field(ge=0, le=INT4_MAX), _WHOLE]
StrictInt = Annotated[int, Strict(), Field(ge=-INT4_MAX, le=INT4_MAX), _WHOLE]
WorldSize = Annotated[int, Strict(), Field(ge=1, le=INT4_MAX), _WHOLE]
RequestId = Annotated[int, Strict(), Field(ge=1, le=INT4_MAX), _WHOLE]
# A JSON number (an integer too); not a boolean, which a lax float takes as 0.0 or 1.0
Real = Annotated[float, Strict()]
# JSON numbers and nulls in lists in a list, as format_lr_groups writes them.
_NUMBER = r"(null|-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?)"
_GROUP = rf"\[({_NUMBER}(,{_NUMBER})*)?\]"
LR_GROUPS = rf"^\[({_GROUP}(,{_GROUP})*)?\]$"
Name = Annotated[str, Field(min_length=1, max_length=200)]
FORBID = ConfigDict(extra="forbid")


def _lr_groups(text: str | None) -> str | None:
    if text is None:
        return None
    groups = json.loads(text)
    if not isinstance(groups, list) or not all(
        isinstance(g, list) and all(v is None or type(v) in (int, float) for v in g) for g in groups
    ):
        raise ValueError("learning rates by group are lists of numbers or nulls")
    return text


_TYPES: dict[Kind, Any] = {
    Kind.INT: StrictInt,
    Kind.FLOAT: Real,
    Kind.BOOL: StrictBool,
    Kind.RANKS: Annotated[str, Field(max_length=65536, pattern=r"^(\d{1,9}(,\d{1,9})*)?$")],
    Kind.FLOAT_GROUPS: Annotated[
        str, Field(max_length=65536, pattern=LR_GROUPS), AfterValidator(_lr_groups)
    ],
}
_SERVER_DEFAULTS: dict[Kind, Any] = {
    Kind.INT: int,
    Kind.FLOAT: float,
    Kind.BOOL: lambda text: text not in ("0", "false"),
    Kind.RANKS: str,
}


def _field(f: StepField) -> tuple[Any, Any]:
    kind = Count if f.key else _TYPES[f.kind]
    if f.nullable:
        return kind | None, None
    if f.server_default is not None:  # a field added later: absent from an older job's steps
        return kind, _SERVER_DEFAULTS[f.kind](f.server_default)
    return kind, ...


StepIn: type[BaseModel] = create_model(  # type: ignore[call-overload]
    "StepIn",
    __config__=FORBID,
    __doc__="One step's record, its fields as the step schema declares them.",
    **{f.name: _field(f) for f in STEP_FIELDS},
)


class FindingIn(BaseModel):
    """A parameter whose local gradient held inf or NaN on ``rank`` at the overflow ``step``."""

    model_config = FORBID
    step: Count
    rank: Count
    name: Annotated[str, Field(max_length=PARAM_NAME_LENGTH)]
    kind: Literal["inf", "nan", "both"]
    count: Count


class StepsIn(BaseModel):
    model_config = FORBID
    kind: Literal["steps"]
    steps: Annotated[list[StepIn], Field(min_length=1, max_length=MAX_STEPS)]  # type: ignore[valid-type]
    findings: Annotated[list[FindingIn], Field(max_length=MAX_STEPS)] = []


# A step as a row: its values in the step schema's column order (``COLUMNS``), each of its
# field's type; a field with a default is sent too.
StepRow: Any = tuple.__class_getitem__(tuple(_field(f)[0] for f in STEP_FIELDS))


def _same_columns(columns: list[str]) -> list[str]:
    if tuple(columns) != COLUMNS:
        raise ValueError(
            "the rows' columns are not this service's; open the run again and send the"
            " columns its answer names, or the steps as objects"
        )
    return columns


class StepRowsIn(BaseModel):
    """Steps as rows of ``columns``, which must be the columns the service named when the
    run was opened (``RunOpened.step_columns``), in that order."""

    model_config = FORBID
    kind: Literal["step_rows"]
    columns: Annotated[
        list[str],
        Field(max_length=len(COLUMNS), json_schema_extra={"const": list(COLUMNS)}),
        AfterValidator(_same_columns),
    ]
    rows: Annotated[list[StepRow], Field(min_length=1, max_length=MAX_STEPS)]
    findings: Annotated[list[FindingIn], Field(max_length=MAX_STEPS)] = []


class GapIn(BaseModel):
    """Steps ``first`` to ``last`` the job dropped (``dropped`` records), and why."""

    model_config = FORBID
    kind: Literal["gap"]
    first: Count
    last: Count
    dropped: Count
    reason: Annotated[str, Field(max_length=500)]


class LoadIn(BaseModel):
    """A load of the scaler's state (:class:`~scalewatch.store.records.ScaleLoad`)."""

    model_config = FORBID
    kind: Literal["load"]
    step: Count
    at: Real
    scale_after: Real
    scale_before: Real | None = None
    from_step: Count | None = None


Number = StrictInt | Real


# The scaler's factors, one property each: a map keyed by their names would leave the keys
# out of the JSON Schema on the oldest pydantic we admit (no ``propertyNames``), and a
# client generated from the schema would send any name. A factor left out is not set;
# ``ControlIn`` takes a null for one too (a run's or a state's factor that is off).
ControlIn: type[BaseModel] = create_model(  # type: ignore[call-overload]
    "ControlIn",
    __config__=FORBID,
    __doc__="The scaler's factors; one left out is not set, and null is off.",
    **{name: (Number | None, None) for name in FIELDS},
)
ControlValuesIn: type[BaseModel] = create_model(  # type: ignore[call-overload]
    "ControlValuesIn",
    __config__=FORBID,
    __doc__="The factors a change set; one left out is not changed.",
    **{name: (Number, None) for name in FIELDS},
)


class OutcomeIn(BaseModel):
    """What became of a control change at a step (``step`` null: settled at no step)."""

    model_config = FORBID
    kind: Literal["outcome"]
    step: Count | None
    at: Real
    source: Literal["request", "code"]
    request_id: RequestId | None
    values: ControlValuesIn  # type: ignore[valid-type]
    applied: StrictBool
    reason: Annotated[str, Field(max_length=500)] | None = None
    state: ControlIn  # type: ignore[valid-type]
    version: Count


Item = Annotated[StepsIn | StepRowsIn | GapIn | LoadIn | OutcomeIn, Field(discriminator="kind")]


class BatchIn(BaseModel):
    """A run's records in the order they came, numbered: the run keeps the last number
    stored, and a batch of a number stored already stores nothing (it is a poll)."""

    model_config = FORBID
    sequence: Count = Field(
        description="1 for the run's first batch, then one more each; 0: no records, a poll"
    )
    items: Annotated[list[Item], Field(max_length=MAX_ITEMS)] = []
    end: Literal["finished", "crashed"] | None = Field(
        None, description="the run ended so, after these records"
    )


class PendingControl(BaseModel):
    id: int
    values: dict[str, float | int]


class BatchAnswer(BaseModel):
    sequence: int = Field(description="the run's last batch stored")
    stored: bool = Field(description="false: this batch was stored before, nothing again")
    control: list[PendingControl] = Field(description="the run's pending control requests")


class RunOpen(BaseModel):
    """A job's run: a new one of ``uid``, or (``resume``) the stored one continued."""

    model_config = FORBID
    uid: Annotated[str, Field(pattern=r"^[0-9a-f]{32}$")]
    name: Name
    world_size: WorldSize
    config: Annotated[dict[str, Any], Field(max_length=100)]
    control: ControlIn  # type: ignore[valid-type]
    started_at: Real
    resume: StrictBool = False
    host: Annotated[str, Field(max_length=255)]
    pid: Count
    torch_version: Annotated[str, Field(max_length=64)]


class RunOpened(BaseModel):
    id: int
    uid: str
    sequence: int = Field(description="the run's last batch stored: the next is one more")
    step_columns: list[str] = Field(
        default_factory=lambda: list(COLUMNS),
        description="the columns of a step row (``step_rows`` items), in their order: a job"
        " whose steps have these columns may send them as rows",
    )
