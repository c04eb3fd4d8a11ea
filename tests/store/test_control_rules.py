"""The control rules live in the store, and the store stands without the scaler.

Arrows run one way: the scaler imports the store, never the reverse; the service
(``app``) needs the store alone, so neither imports torch or the scaler's private parts.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import scalewatch._control
import scalewatch.store.control
from scalewatch.store import control_rules

ROOT = Path(__file__).resolve().parents[2]

IMPORTED = """
import importlib, json, pkgutil, sys
import scalewatch.store
for module in pkgutil.iter_modules(scalewatch.store.__path__):
    importlib.import_module(f"scalewatch.store.{module.name}")
importlib.import_module(sys.argv[1])
print(json.dumps(sorted(sys.modules)))
"""


def _imported_by(module: str) -> list[str]:
    """Every module loaded by importing scalewatch.store, all its modules, and ``module``."""
    out = subprocess.run(
        [sys.executable, "-c", IMPORTED, module],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        timeout=120,
    ).stdout
    return list(json.loads(out))


@pytest.mark.heavy
def test_the_store_and_the_service_import_neither_torch_nor_the_scalers_private_modules() -> None:
    for module in ("scalewatch.store", "scalewatch.app.main", "scalewatch.app.cli"):
        loaded = _imported_by(module)
        assert "scalewatch.store.control_rules" in loaded
        private = [m for m in loaded if m.startswith("scalewatch._")]
        torch = [m for m in loaded if m == "torch" or m.startswith("torch.")]
        assert (module, private, torch) == (module, [], [])


def test_the_rules_have_one_home_that_the_scaler_re_exports() -> None:
    shared = [name for name in control_rules.__all__ if hasattr(scalewatch._control, name)]
    assert {"FIELDS", "RULES", "check", "normalise"} <= set(shared)
    for name in shared:
        assert getattr(scalewatch._control, name) is getattr(control_rules, name)
    assert scalewatch.store.control.CONTROL_FIELDS is control_rules.FIELDS


def test_the_rules_module_pins_its_public_names() -> None:
    assert sorted(control_rules.__all__) == [
        "EMPTY",
        "FIELDS",
        "FLOAT32_MAX",
        "FLOAT32_TINY",
        "INT32_MAX",
        "INT_FIELDS",
        "PURPOSES",
        "RULES",
        "SCHEMAS",
        "UNKNOWN",
        "bounds_problems",
        "check",
        "normalise",
        "requirement",
    ]


def test_the_cli_and_the_api_model_take_the_fields_the_rules_name() -> None:
    """The CLI's options are derived from the rules, their help too; the API model declares
    its fields with pydantic's strict types (for its schema), which must agree with them."""
    import click

    from scalewatch.app.cli.control import control
    from scalewatch.app.models import ControlRequest

    options = {p.name: p for p in control.params if isinstance(p, click.Option) and p.name}
    fields = [name for name in options if name in control_rules.SCHEMAS]
    assert fields == list(control_rules.FIELDS)
    assert {name for name in fields if options[name].type is click.INT} == control_rules.INT_FIELDS
    assert {name for name in fields if options[name].type is click.FLOAT} == (
        set(control_rules.FIELDS) - control_rules.INT_FIELDS
    )
    for name in fields:
        assert options[name].opts == [f"--{name.replace('_', '-')}"]
        help = options[name].help or ""
        assert help.startswith(control_rules.PURPOSES[name]), name
        assert help.endswith(control_rules.RULES[name].removeprefix(f"{name} must be ")), name
    assert list(ControlRequest.model_fields) == list(control_rules.FIELDS)
    integral = {
        name for name, info in ControlRequest.model_fields.items() if "int" in str(info.annotation)
    }
    assert integral == control_rules.INT_FIELDS


def test_normalise_keeps_each_bound_of_the_schemas_as_they_state_it() -> None:
    """At each bound and just past it, normalise() takes or refuses a value as the JSON
    Schema the API publishes says (inclusive or exclusive)."""
    for name, schema in control_rules.SCHEMAS.items():
        integer = schema["type"] == "integer"
        for key, inward, taken in (
            ("minimum", math.inf, True),
            ("maximum", -math.inf, True),
            ("exclusiveMinimum", math.inf, False),
            ("exclusiveMaximum", -math.inf, False),
        ):
            if key not in schema:
                continue
            bound = schema[key]
            outward = -inward
            past = bound + (1 if outward > 0 else -1) if integer else math.nextafter(bound, outward)
            inside = bound + (1 if inward > 0 else -1) if integer else math.nextafter(bound, inward)
            assert (control_rules.normalise(name, bound) is not None) is taken, (name, key)
            assert control_rules.normalise(name, past) is None, (name, key)
            assert control_rules.normalise(name, inside) is not None, (name, key)


def test_the_rules_say_float32s_bounds_as_a_person_would_and_the_schema_exactly() -> None:
    for rule in control_rules.RULES.values():
        assert not re.search(r"\d\.\d{6,}", rule), rule  # no bound quoted to 17 digits
    assert "about 1.2e-38 to 3.4e38" in control_rules.RULES["scale"]
    assert control_rules.SCHEMAS["scale"]["minimum"] == float(np.finfo(np.float32).tiny)
    assert control_rules.SCHEMAS["scale"]["maximum"] == float(np.finfo(np.float32).max)
