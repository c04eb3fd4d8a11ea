"""The control rules live in the store, and the store stands without the scaler.

Arrows run one way: the scaler imports the store, never the reverse; the service
(``app``) needs the store alone, so neither imports torch or the scaler's private parts.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import scaler._control
import scaler.store.control
from scaler.store import rules

ROOT = Path(__file__).resolve().parents[2]

IMPORTED = """
import importlib, json, pkgutil, sys
import scaler.store
for module in pkgutil.iter_modules(scaler.store.__path__):
    importlib.import_module(f"scaler.store.{module.name}")
importlib.import_module(sys.argv[1])
print(json.dumps(sorted(sys.modules)))
"""


def _imported_by(module: str) -> list[str]:
    """Every module loaded by importing scaler.store, all its modules, and ``module``."""
    out = subprocess.run(
        [sys.executable, "-c", IMPORTED, module],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        timeout=120,
    ).stdout
    return list(json.loads(out))


def test_the_store_and_the_service_import_neither_torch_nor_the_scalers_private_modules() -> None:
    for module in ("scaler.store", "app.main", "app.cli"):
        loaded = _imported_by(module)
        assert "scaler.store.rules" in loaded
        private = [m for m in loaded if m.startswith("scaler._")]
        torch = [m for m in loaded if m == "torch" or m.startswith("torch.")]
        assert (module, private, torch) == (module, [], [])


def test_the_rules_have_one_home_that_the_scaler_re_exports() -> None:
    for name in rules.__all__:
        assert getattr(scaler._control, name) is getattr(rules, name)
    assert scaler.store.control.CONTROL_FIELDS is rules.FIELDS


def test_the_rules_module_pins_its_public_names() -> None:
    assert sorted(rules.__all__) == [
        "EMPTY",
        "FIELDS",
        "FLOAT32_MAX",
        "FLOAT32_TINY",
        "INT32_MAX",
        "INT_FIELDS",
        "RULES",
        "UNKNOWN",
        "bounds_problems",
        "check",
        "normalise",
    ]


def test_the_cli_and_the_api_model_take_the_fields_the_rules_name() -> None:
    """The CLI's options are derived from the rules; the API model declares its fields
    with pydantic's strict types (for its schema), which must agree with them."""
    from app.cli import CONTROL_HELP, CONTROL_OPTIONS
    from app.models import ControlRequest

    assert list(CONTROL_OPTIONS) == list(CONTROL_HELP) == list(rules.FIELDS)
    assert {name for name, kind in CONTROL_OPTIONS.items() if kind is int} == rules.INT_FIELDS
    assert list(ControlRequest.model_fields) == list(rules.FIELDS)
    integral = {
        name for name, info in ControlRequest.model_fields.items() if "int" in str(info.annotation)
    }
    assert integral == rules.INT_FIELDS
