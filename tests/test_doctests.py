"""The ``>>>`` examples in the package's docstrings are part of the suite: every module of
``scalewatch`` that has one is imported by its name, as users import it, and its examples
run."""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import pkgutil

import pytest

import scalewatch


def _modules_with_examples() -> list[str]:
    names = []
    for module in pkgutil.walk_packages(scalewatch.__path__, "scalewatch."):
        spec = importlib.util.find_spec(module.name)
        if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
            continue
        with open(spec.origin, encoding="utf-8") as source:
            if ">>> " in source.read():
                names.append(module.name)
    return sorted(names)


MODULES = _modules_with_examples()


def test_the_scan_finds_the_examples() -> None:
    assert "scalewatch.stats" in MODULES
    assert any(name.startswith("scalewatch.app.") for name in MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_examples_of(name: str) -> None:
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    tests = [test for test in finder.find(module, name) if test.examples]
    assert tests, f"{name} has '>>> ' but no example doctest finds"
    for test in tests:
        runner.run(test)
    failed, attempted = runner.summarize(verbose=False)
    assert failed == 0, f"{failed} of {attempted} examples of {name} failed (output above)"
