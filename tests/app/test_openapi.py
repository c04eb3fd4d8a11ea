"""The OpenAPI document says what the service does: what it refuses, the schema refuses.
(Schema fuzzing with every schemathesis check: tests/reliability/test_hostile.py.)"""

from __future__ import annotations

import math

import jsonschema_rs
import pytest
from fastapi.testclient import TestClient

from scalewatch._control import normalise


@pytest.fixture
def document(client: TestClient) -> dict[str, object]:
    body: dict[str, object] = client.get("/openapi.json").json()
    return body


def _parameter(document: dict[str, object], path: str, name: str) -> dict[str, object]:
    operation = document["paths"][path]["get"]  # type: ignore[index]
    return next(p for p in operation["parameters"] if p["name"] == name)


def test_last_event_id_is_declared_an_integer(document: dict[str, object]) -> None:
    """It was declared a string, and a string that is no step number was refused."""
    header = _parameter(document, "/api/runs/{run}/stream", "last-event-id")
    assert header["in"] == "header"
    assert header["schema"]["type"] == "integer"  # type: ignore[index]
    assert header["schema"]["minimum"] == -1  # type: ignore[index]


def test_no_parameter_is_declared_nullable(document: dict[str, object]) -> None:
    """``?after=null`` is a 422: an optional parameter is absent, never null."""
    for path, operations in document["paths"].items():  # type: ignore[attr-defined]
        for operation in operations.values():
            for parameter in operation.get("parameters", []):
                assert "anyOf" not in parameter["schema"], (path, parameter["name"])


def test_the_control_schema_refuses_what_the_store_refuses(document: dict[str, object]) -> None:
    """An empty body was schema-valid and a 422; so were growth_interval 0 and scale 0."""
    schema = document["components"]["schemas"]["ControlRequest"]  # type: ignore[index]
    validator = jsonschema_rs.validator_for(schema)
    assert not validator.is_valid({})
    tiny, big = 1.1754943508222875e-38, 3.4028234663852886e38
    probes = [0, 0.5, 1, 1.5, 2, 2.5, 500, 500.0, 2**31 - 1, 2**31, -1, tiny, tiny / 2, 0.999,
              big, big * 2, 1e300, True, None, "2"]  # fmt: skip
    fields = schema["properties"]
    assert set(fields) == {
        "growth_interval", "growth_factor", "backoff_factor", "scale", "min_scale", "max_scale",
        "hysteresis",
    }  # fmt: skip
    for name in fields:
        for value in probes:
            ok = value is not None and normalise(name, value) is not None
            if isinstance(value, float) and not math.isfinite(value):
                continue
            assert validator.is_valid({name: value}) == ok, (name, value)
