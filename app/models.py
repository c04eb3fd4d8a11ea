"""Pydantic models of the HTTP API, one per purpose."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    create_model,
)
from pydantic_core import PydanticCustomError

from scalewatch.store.control_rules import RULES, SCHEMAS
from scalewatch.store.queries import INT64_MAX
from scalewatch.store.states import AlertState, RequestSource, RequestStatus, RunStatus
from scalewatch.store.step_schema import SERIES_COLUMNS, Kind

__all__ = [
    "AlertList",
    "AlertOut",
    "ControlFieldRule",
    "ControlRequest",
    "ControlRequestOut",
    "ControlRules",
    "ControlView",
    "ErrorMessage",
    "Health",
    "OverflowDetail",
    "OverflowItem",
    "OverflowPage",
    "OverflowParam",
    "ParamOverflows",
    "ParamRanking",
    "RunDetail",
    "RunList",
    "RunSummary",
    "ScaleLoadItem",
    "ScaleLoadList",
    "SeriesColumns",
    "Step",
    "StepSeries",
    "Unhealthy",
]

StrictInt = Annotated[int, Strict()]
# Strict: ``true`` is not a number; an integer is still a valid float.
StrictFloat = Annotated[float, Strict()]
# A step number as the store keeps it (a signed 64-bit integer): the one bound of every
# step the HTTP API and the CLI take; a larger one cannot even be compared with the rows.
Step = Annotated[int, Field(ge=0, le=INT64_MAX)]


class RunSummary(BaseModel):
    id: int
    name: str
    status: RunStatus = Field(description="running, finished or crashed")
    world_size: int
    steps: int
    scale: float | None
    overflows: int
    skipped_rate: float
    last_heartbeat: float
    started_at: float
    ended_at: float | None


class RunList(BaseModel):
    runs: list[RunSummary]


class RunDetail(RunSummary):
    # The counts skipped_rate is of: the run page moves its figures on with each live step.
    recorded: int = Field(description="step rows stored")
    skipped: int = Field(description="skipped steps among them")
    schedule_drift: int | None = Field(
        description="skipped steps on which a registered LR scheduler stepped, at the last"
        " recorded step: the schedule's lead over the weights (null: none registered;"
        " config.schedulers says which are held)"
    )
    spikes: dict[str, int] = Field(
        default_factory=lambda: {"loss": 0, "grad_norm": 0},
        description="spikes of the run by what spiked: loss, grad_norm",
    )
    grad_norm: float | None = Field(
        None,
        description="the total L2 norm of the unscaled gradients at the last recorded step"
        " (null: not measured, or not finite)",
    )
    config: dict[str, Any]
    control: dict[str, Any]
    control_version: int
    dropped: int
    torch_version: str
    host: str
    pid: int
    scale_loads: int = Field(
        0, description="loads of a scaler's state into the run once it had steps"
    )
    scale_jumps: int = Field(0, description="those whose scale differs from the last recorded one")
    forecast: ScaleForecastOut | None = Field(
        None, description="where the scale is heading, read from the last steps (null: too few)"
    )


class ScaleForecastOut(BaseModel):
    """Where a run's scale is heading (:mod:`scalewatch.store.forecast`)."""

    trend: Literal["falling", "rising", "steady", "pinned"]
    text: str = Field(description='in words: "halving every ~310 steps: 1.0 in ~3,700 steps..."')
    first_step: int = Field(description="the window it was read from")
    last_step: int
    scale: float = Field(description="the scale after the last step (under 1: gradients shrunk)")
    floor: float = Field(description="the run's min_scale, else 1.0")
    steps_to_floor: int | None = Field(description="falling: steps to the floor at this rate")
    halving_steps: float | None = Field(
        description="falling: steps per halving of the scale; rising: per doubling"
    )


_SERIES_TYPES: dict[Kind, Any] = {Kind.INT: int, Kind.FLOAT: float}


def _column_type(kind: Kind, nullable: bool) -> Any:
    value = _SERIES_TYPES[kind]
    return list[value | None] if nullable else list[value]  # type: ignore[valid-type]


def _series_model() -> type[BaseModel]:
    """The chart series' columns, from the step schema: min, max and last of each range
    (null where a bucket has no value, or a value is not recorded), counts."""
    columns: dict[str, Any] = {
        key: (_column_type(kind, nullable), ...) for key, kind, nullable in SERIES_COLUMNS
    }
    return create_model("SeriesColumns", **columns)


if TYPE_CHECKING:

    class SeriesColumns(BaseModel):
        first_step: list[int]

else:
    SeriesColumns = _series_model()


class StepSeries(BaseModel):
    run: int
    start: int | None
    end: int | None
    bucket_width: int = Field(description="steps per bucket; 1 means one step per bucket")
    series: SeriesColumns


class OverflowParam(BaseModel):
    """A parameter whose local gradient held inf or NaN on one rank at an overflow step."""

    rank: int
    name: str = Field(description="from scaler.watch(model), else 'group G param I (shape)'")
    kind: Literal["inf", "nan", "both"]
    count: int = Field(description="non-finite elements of that rank's local gradient")


class OverflowItem(BaseModel):
    step: int
    wall_time: float
    scale: float
    scale_after: float
    inf_ranks: list[int] = Field(description="ranks whose local gradients had inf or NaN")
    loss: float | None = Field(
        description="the reporting rank's loss; null when not recorded or not finite"
    )
    loss_nonfinite_ranks: list[int] = Field(
        description="ranks whose loss was already inf or NaN (a forward overflow); empty when"
        " the loss was finite on every rank"
    )
    params: list[OverflowParam] | None = Field(
        description="by rank, then name; at most 32 a rank; null when asked for without them"
    )
    params_omitted: int = Field(description="non-finite parameters beyond the 32 kept a rank")


class OverflowDetail(OverflowItem):
    """One overflow step in full: its step record and every parameter found at it."""

    params: list[OverflowParam] = Field(description="by rank, then name; at most 32 a rank")
    run: int
    skipped: bool
    growth_tracker: int
    growth_interval: int
    growth_factor: float
    backoff_factor: float
    control_version: int


class ParamOverflows(BaseModel):
    name: str
    overflows: int = Field(description="overflow steps of the window it was found at")
    ranks: list[int] = Field(description="the ranks it was found on")
    kinds: list[Literal["inf", "nan", "both"]]
    last_step: int = Field(description="the latest of those steps")
    count: int = Field(description="non-finite elements, summed over those findings")


class ParamRanking(BaseModel):
    run: int
    start: int | None
    end: int | None
    overflows: int = Field(description="overflow steps in the window")
    params_omitted: int = Field(description="findings of those steps that were not kept")
    params: list[ParamOverflows] = Field(description="most overflow steps first")


class ParamNormOut(BaseModel):
    name: str = Field(description="the parameter, as watch() named it (else by position)")
    norm: float | None = Field(description="its gradient's L2 norm on the reporting rank")


class SpikeItem(BaseModel):
    """A step whose loss or gradient norm spiked above the run's recent history."""

    step: int
    what: Literal["loss", "grad_norm"] = Field(description="what spiked")
    value: float = Field(description="its value at the step")
    z: float = Field(description="robust z: (value - median) / (1.4826 MAD) of the window")
    params: list[ParamNormOut] = Field(
        description="the ten largest parameter norms at the step, largest first (empty: the"
        " run did not measure the gradient norm)"
    )


class SpikeList(BaseModel):
    run: int
    items: list[SpikeItem] = Field(description="oldest first")


class ScaleLoadItem(BaseModel):
    """A load of a scaler's state (``load_state_dict``, ``load_checkpoint``) into the run
    once it had steps."""

    step: int = Field(description="the step count loaded: the run's next step is step + 1")
    from_step: int = Field(description="the run's last step when it was loaded")
    scale_before: float = Field(description="the run's last recorded scale")
    scale_after: float = Field(description="the scale loaded")
    jump: bool = Field(description="whether the loaded scale differs from the one before")
    at: float = Field(description="when it was loaded (seconds since the epoch)")


class ScaleLoadList(BaseModel):
    run: int
    items: list[ScaleLoadItem] = Field(description="oldest first")


class OverflowPage(BaseModel):
    items: list[OverflowItem]
    next: int | None = Field(description="pass as ?after= for the next page; null at the end")


def _control_schema(schema: dict[str, Any]) -> None:
    # Each field's rule as scaler/store/control_rules.py states it, so that the OpenAPI document
    # refuses what the store refuses. A null is refused too: a bound once set stays.
    schema["minProperties"] = 1  # an empty request changes nothing: refused
    schema["examples"] = [{"growth_interval": 500, "growth_factor": 2.0}]
    for name, field in schema["properties"].items():
        title = field.get("title")
        field.clear()
        field.update(SCHEMAS[name], title=title)


def _ruled(name: str) -> WrapValidator:
    """A control field refused in one error, its rule's words (as the store refuses a value
    out of range): pydantic's own is one error a member of the union it tried
    (``growth_interval.int``, ``growth_interval.float``)."""

    def validate(value: object, handler: ValidatorFunctionWrapHandler) -> object:
        try:
            return handler(value)
        except ValidationError:
            raise PydanticCustomError("value_error", RULES[name]) from None

    return WrapValidator(validate)


class ControlRequest(BaseModel):
    """A change to the running scaler; any subset of the fields (one at least), applied
    together. Beyond each field's rule, ``min_scale <= scale <= max_scale`` must hold, the
    values in effect standing in for those not sent (a 422 names the field): JSON Schema
    cannot say that."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra=_control_schema,
    )

    # JSON Schema's integers include 500.0; the store takes it as 500.
    growth_interval: Annotated[StrictInt | StrictFloat | None, _ruled("growth_interval")] = None
    growth_factor: Annotated[StrictFloat | None, _ruled("growth_factor")] = None
    backoff_factor: Annotated[StrictFloat | None, _ruled("backoff_factor")] = None
    scale: Annotated[StrictFloat | None, _ruled("scale")] = None
    min_scale: Annotated[StrictFloat | None, _ruled("min_scale")] = None
    max_scale: Annotated[StrictFloat | None, _ruled("max_scale")] = None
    hysteresis: Annotated[StrictInt | StrictFloat | None, _ruled("hysteresis")] = None


class ControlFieldRule(BaseModel):
    """One control field and the rule its values keep, as ``scaler/store/control_rules.py`` states
    it: what the dashboard builds its form, hints and checks from."""

    name: str
    integer: bool = Field(description="whole numbers only")
    purpose: str = Field(description="what the field does")
    requirement: str = Field(description="what a value must be, in words")
    rule: str = Field(description="what a 422 says of a value that breaks it")
    bounds: dict[str, Any] = Field(
        description="the rule in JSON Schema (type, minimum, maximum, exclusiveMinimum,"
        " exclusiveMaximum), as ControlRequest's schema states it"
    )


class ControlRules(BaseModel):
    """The control fields in the order a request takes them. Beyond each field's rule,
    ``min_scale <= scale <= max_scale`` must hold (the values in effect standing in)."""

    fields: list[ControlFieldRule]


class ControlRequestOut(BaseModel):
    id: int
    run_id: int
    values: dict[str, Any]
    source: RequestSource
    requested_by: str
    requested_at: float
    status: RequestStatus = Field(description="pending, applied or rejected")
    applied_step: int | None
    applied_at: float | None
    reason: str | None = Field(description="why it was rejected")
    note: str | None = Field(
        description="why it was asked for (the autopilot's reason), kept when it is rejected"
    )


class ControlView(BaseModel):
    state: dict[str, Any] = Field(description="runs.control plus the current scale and version")
    history: list[ControlRequestOut] = Field(description="a page of requests, oldest first")
    next: int | None = Field(description="pass as ?before= for the older page; null at the first")


class ErrorMessage(BaseModel):
    """A refusal other than a validation error: ``{"detail": "no run 7"}``."""

    detail: str


class Health(BaseModel):
    status: Literal["ok"] = "ok"


class Unhealthy(BaseModel):
    status: Literal["unavailable"] = "unavailable"
    detail: str = Field(description="why, in one line")


class AlertRun(BaseModel):
    id: int
    name: str


class AlertOut(BaseModel):
    """An alert of a rule on a run: fired once, resolved once."""

    id: int
    rule: str = Field(description="the rule's name")
    kind: str = Field(description="scale_below, scale_drop, skip_rate, skip_streak, ...")
    state: AlertState = Field(description="firing or resolved")
    run: AlertRun
    threshold: float
    value: float = Field(description="the value compared with the threshold when it fired")
    detail: str = Field(
        description='what the value was taken over ("last 11 overflows on rank 1"); "" for some'
    )
    says: str = Field(
        description="the value as it fired, in words with its unit and the threshold:"
        ' "64% of the last 11 overflows on rank 1 (threshold 60%)"'
    )
    text: str = Field(description="one line, as webhooks send it")
    fired_step: int
    fired_at: float
    resolved_step: int | None
    resolved_at: float | None
    resolved_value: float | None


class AlertList(BaseModel):
    alerts: list[AlertOut] = Field(description="newest first")
    next: int | None = Field(description="pass as ?before= for the older page; null at the end")
