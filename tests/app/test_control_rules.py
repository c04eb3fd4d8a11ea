"""The control rules have one home (``scaler/store/control_rules.py``): the service serves them,
and the dashboard builds its hints and checks from what it serves. No consumer states a
rule of its own."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from scalewatch.store import control_rules

ROOT = Path(__file__).resolve().parents[2]

# Run by node over the served rules: each field's hint, and what the form's check says of
# each value the test gives.
CHECKS = """
import { controlFields, ruleProblem } from "./web/rules.js";
const { served, values } = JSON.parse(process.argv[1]);
const fields = controlFields(served);
console.log(JSON.stringify(fields.map((field) => ({
  name: field.name, label: field.label, hint: field.hint, integer: field.integer,
  problems: values[field.name].map((number) => ruleProblem(field, number)),
}))));
"""


def test_the_service_serves_the_rules_of_the_store(client: TestClient) -> None:
    response = client.get("/api/control/rules")
    assert response.status_code == 200
    served = response.json()["fields"]
    assert [field["name"] for field in served] == list(control_rules.FIELDS)
    for field in served:
        name = field["name"]
        assert field == {
            "name": name,
            "integer": name in control_rules.INT_FIELDS,
            "purpose": control_rules.PURPOSES[name],
            "requirement": control_rules.requirement(name),
            "rule": control_rules.RULES[name],
            "bounds": control_rules.SCHEMAS[name],
        }
    schema = client.get("/openapi.json").json()["components"]["schemas"]["ControlRequest"]
    for field in served:  # the request's schema states the same bounds
        bounds = {k: v for k, v in schema["properties"][field["name"]].items() if k != "title"}
        assert bounds == field["bounds"], field["name"]


def _around_the_bounds(schema: dict[str, Any]) -> list[float]:
    """Each bound of ``schema``, and the numbers just either side of it."""
    numbers = []
    for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        if key in schema:
            bound = float(schema[key])
            if schema["type"] == "integer":
                numbers += [bound - 1, bound, bound + 1]
            else:
                numbers += [math.nextafter(bound, -math.inf), bound]
                numbers += [math.nextafter(bound, math.inf)]
    return [n for n in numbers if math.isfinite(n)]


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node")
def test_the_dashboards_hints_and_checks_are_the_served_rules(client: TestClient) -> None:
    """The dashboard's fields, hints and checks, computed by its own module (web/rules.js)
    from the service's answer, agree with the store at every bound: a value the form
    refuses is one the store refuses, with the store's message."""
    served = client.get("/api/control/rules").json()
    values = {
        name: _around_the_bounds(control_rules.SCHEMAS[name]) for name in control_rules.FIELDS
    }
    done = subprocess.run(
        ["node", "--input-type=module", "-e", CHECKS, json.dumps({"served": served,
                                                                 "values": values})],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    shown = json.loads(done.stdout)
    assert [field["name"] for field in shown] == list(control_rules.FIELDS)
    for field in shown:
        name = field["name"]
        purpose = control_rules.PURPOSES[name]
        assert (
            field["hint"] == f"{purpose[0].upper()}{purpose[1:]}: {control_rules.requirement(name)}"
        )
        assert field["integer"] == (name in control_rules.INT_FIELDS)
        assert field["label"] == name.replace("_", " ").capitalize()
        for number, problem in zip(values[name], field["problems"], strict=True):
            taken = control_rules.normalise(name, number) is not None
            assert problem == (None if taken else control_rules.RULES[name]), (name, number)


# What a rule stated outside control_rules.py looks like: one of its bounds written out, or (in the
# dashboard's text) a comparison with a number.
BOUND_LITERALS = re.compile(
    r"2147483647|2\s*\*\*\s*31|3\.40282|1\.17549|float32|INT32_MAX|FLOAT32_(MAX|TINY)", re.I
)
STRING = re.compile(r"\"(?:[^\"\\\n]|\\.)*\"|'(?:[^'\\\n]|\\.)*'|`(?:[^`\\]|\\.)*`")
STATED = re.compile(r"(?:[<>≤≥]=?|between)\s*[+-]?\d")
CODE_IN_TEMPLATE = re.compile(r"\$\{[^{}]*\}")  # ``${value > 0 ? a : b}`` is code, not text


def test_no_consumer_states_a_rule_of_its_own() -> None:
    """The dashboard's scripts and the service (its CLI too) take the rules from
    scaler/store/control_rules.py: none writes a bound out, and no text of the dashboard compares
    a value with a number (its hints, "between 0 and 1", once disagreed with the store)."""
    stated = []
    for path in sorted((ROOT / "web").glob("*.js")):
        source = path.read_text(encoding="utf-8")
        stated += [(path.name, m.group()) for m in BOUND_LITERALS.finditer(source)]
        for literal in STRING.findall(source):
            text = CODE_IN_TEMPLATE.sub("", literal)
            stated += [(path.name, literal) for _ in STATED.finditer(text)]
    for path in sorted((ROOT / "app").rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        found = [m.group() for m in BOUND_LITERALS.finditer(source)]
        stated += [(str(path.relative_to(ROOT)), text) for text in found]
    assert stated == []


def test_the_check_finds_a_rule_stated_in_a_hint() -> None:
    """The patterns above catch what the dashboard used to say."""
    old = 'hint: "Multiplier on overflow; between 0 and 1" }, { hint: "integer ≥ 1" }'
    assert [s for s in STRING.findall(old) if STATED.search(s)] == [
        '"Multiplier on overflow; between 0 and 1"',
        '"integer ≥ 1"',
    ]
    assert BOUND_LITERALS.search("maximum: 2147483647")
