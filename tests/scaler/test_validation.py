"""Values that would break training are refused with a ValueError naming the field."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

import scalewatch

CLASSES = [scalewatch.GradScaler, scalewatch.ShardedGradScaler]

BAD: list[tuple[str, Any]] = [
    ("growth_interval", 0),
    ("growth_interval", -1),
    ("growth_interval", 2.5),
    ("growth_interval", True),
    ("growth_interval", 2**31),
    ("growth_factor", 1.0),
    ("growth_factor", 0.5),
    ("growth_factor", math.nan),
    ("growth_factor", math.inf),
    ("backoff_factor", 0.0),
    ("backoff_factor", 1.0),
    ("backoff_factor", 1.5),
    ("backoff_factor", math.nan),
    ("backoff_factor", 1e-300),  # a scale of 1 would back off to 0
    ("init_scale", 0.0),
    ("init_scale", -1.0),
    ("init_scale", math.inf),
    ("init_scale", math.nan),
    ("hysteresis", 0),
]

SETTERS = {
    "growth_interval": "set_growth_interval",
    "growth_factor": "set_growth_factor",
    "backoff_factor": "set_backoff_factor",
}


def build(cls: type, **kwargs: Any) -> Any:
    return cls("cpu", telemetry=False, **kwargs)


@pytest.mark.parametrize("cls", CLASSES)
@pytest.mark.parametrize(("field", "value"), BAD, ids=[f"{f}={v!r}" for f, v in BAD])
def test_constructor_refuses(cls: type, field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=field) as caught:
        build(cls, **{field: value})
    assert isinstance(caught.value, scalewatch.ScalerConfigError)


@pytest.mark.parametrize("cls", CLASSES)
@pytest.mark.parametrize("field", ["init_scale", "growth_factor", "backoff_factor"])
def test_a_value_that_is_no_number_is_a_type_error_as_in_torch(cls: type, field: str) -> None:
    """torch's own checks compare the value with a number: a TypeError for a string."""
    torch_cls = torch.amp.GradScaler if cls is scalewatch.GradScaler else None
    if torch_cls is not None:
        with pytest.raises(TypeError):
            torch_cls("cpu", **{field: "2"}).scale(torch.ones(()))
    with pytest.raises(TypeError, match=field) as caught:
        build(cls, **{field: "2"})
    assert isinstance(caught.value, scalewatch.ScalerConfigError)
    gs = build(cls)
    if field != "init_scale":
        with pytest.raises(TypeError, match=field):
            getattr(gs, SETTERS[field])(None)
    with pytest.raises(ValueError, match="growth_interval") as value_error:
        build(cls, growth_interval=0)
    assert not isinstance(value_error.value, TypeError)


@pytest.mark.parametrize("cls", CLASSES)
def test_min_scale_above_max_scale_is_refused(cls: type) -> None:
    with pytest.raises(ValueError, match="min_scale"):
        build(cls, min_scale=8.0, max_scale=4.0)
    build(cls, min_scale=4.0, max_scale=4.0)


@pytest.mark.parametrize("cls", CLASSES)
@pytest.mark.parametrize("value", [0.0, -2.0, math.inf, math.nan])
def test_min_and_max_scale_must_be_finite_and_positive(cls: type, value: float) -> None:
    for field in ("min_scale", "max_scale"):
        with pytest.raises(ValueError, match=field):
            build(cls, **{field: value})


@pytest.mark.parametrize("cls", CLASSES)
@pytest.mark.parametrize(
    ("field", "value"),
    [(f, v) for f, v in BAD if f in SETTERS],
    ids=[f"{f}={v!r}" for f, v in BAD if f in SETTERS],
)
def test_setter_refuses_and_changes_nothing(cls: type, field: str, value: Any) -> None:
    gs = build(cls, init_scale=16.0, growth_interval=5)
    gs.scale(torch.ones(()))  # lazily created scale and tracker exist
    before = (gs.state_dict(), gs.control_state())
    with pytest.raises(ValueError, match=field):
        getattr(gs, SETTERS[field])(value)
    assert (gs.state_dict(), gs.control_state()) == before


def test_config_error_is_also_an_assertion_error_as_torch_raises() -> None:
    # torch raises AssertionError for growth_factor <= 1; code catching that keeps working
    with pytest.raises(AssertionError, match="growth_factor"):
        build(scalewatch.GradScaler, growth_factor=1.0)
    with pytest.raises(AssertionError, match="growth factor"):
        torch.amp.GradScaler("cpu", growth_factor=1.0)


@pytest.mark.parametrize("cls", CLASSES)
def test_valid_edge_values_are_accepted(cls: type) -> None:
    gs = build(cls, growth_interval=1, growth_factor=1.0001, backoff_factor=0.999, hysteresis=1)
    gs.set_growth_interval(2**31 - 1)
    gs.set_growth_factor(1e9)
    gs.set_backoff_factor(1e-9)
    assert gs.get_growth_interval() == 2**31 - 1
    assert gs.get_growth_factor() == 1e9
    assert gs.get_backoff_factor() == 1e-9
    gs.set_backoff_factor(2.0**-126)  # float32's smallest normal
    assert gs.get_backoff_factor() == 2.0**-126


@pytest.mark.parametrize("cls", CLASSES)
def test_disabled_scaler_validates_too(cls: type) -> None:
    with pytest.raises(ValueError, match="growth_interval"):
        build(cls, enabled=False, growth_interval=0)
