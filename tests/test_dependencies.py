"""The distribution's dependencies: what they must give every process that imports torch,
and ranges that are tested at their lower ends."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version


@pytest.mark.heavy
def test_torch_imports_without_a_warning() -> None:
    """Without numpy, torch warned "Failed to initialize NumPy" in every script and every
    demo rank; numpy is a dependency, so that no filter has to hide it."""
    done = subprocess.run(
        [
            sys.executable,
            "-W",
            "error",
            "-c",
            "import torch; import scalewatch; torch.zeros(1).numpy()",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""


ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# torch's floor has a lane of its own (make torch-lanes), which tests/scaler/test_torch_check.py
# keeps in step with pyproject's range; make lowest runs on the pinned torch.
FLOORS_TESTED_ELSEWHERE = {"torch"}
MIRROR_EXTRAS = ("tensorboard", "mlflow", "wandb")  # scalewatch.mirrors: one tracker each


def _pins(name: str) -> dict[str, Version]:
    """``name==version`` lines of a constraints file, by canonical name."""
    pins = {}
    for line in (ROOT / name).read_text().splitlines():
        line = line.partition("#")[0].strip()
        if line:
            requirement = Requirement(line)
            (spec,) = requirement.specifier
            assert spec.operator == "==", line
            pins[canonicalize_name(requirement.name)] = Version(spec.version)
    return pins


def _requirements(*extras: str) -> list[Requirement]:
    lines = PROJECT["dependencies"] + [
        r for e in extras for r in PROJECT["optional-dependencies"][e]
    ]
    return [Requirement(line) for line in lines]


def test_each_runtime_range_is_tested_at_its_lower_end() -> None:
    """constraints-lowest.txt pins every runtime dependency (the PostgreSQL extra's too) at
    the floor pyproject.toml declares, which ``make lowest`` tests the service and the store
    against: a floor raised or lowered without it fails here. Each range has a floor."""
    lowest = _pins("constraints-lowest.txt")
    declared = {}
    for requirement in _requirements("postgres"):
        floors = [Version(s.version) for s in requirement.specifier if s.operator == ">="]
        assert len(floors) == 1, f"{requirement} has no floor"
        declared[canonicalize_name(requirement.name)] = floors[0]
    for name in FLOORS_TESTED_ELSEWHERE:
        declared.pop(name)
    extras_of_pins = {"psycopg-binary": lowest["psycopg"]}  # what psycopg[binary] installs
    assert lowest == declared | extras_of_pins


def test_each_tracker_extra_is_tested_at_its_lower_end() -> None:
    """constraints-lowest-trackers.txt pins each tracker extra at the floor pyproject.toml
    declares; ``make lowest`` reads the mirrors' records back with those releases."""
    declared = {}
    for extra in MIRROR_EXTRAS:
        for requirement in PROJECT["optional-dependencies"][extra]:
            parsed = Requirement(requirement)
            floors = [Version(s.version) for s in parsed.specifier if s.operator == ">="]
            assert len(floors) == 1, f"{requirement} has no floor"
            declared[canonicalize_name(parsed.name)] = floors[0]
    assert _pins("constraints-lowest-trackers.txt") == declared


def test_the_pinned_releases_are_in_the_declared_ranges() -> None:
    """What development and CI run (constraints.txt) is inside the ranges users get, the
    mirrors' trackers (the extras tests/mirrors/ reads back) too."""
    pins = _pins("constraints.txt")
    for requirement in _requirements("postgres", "dev", *MIRROR_EXTRAS):
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{name} is not pinned in constraints.txt"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            requirement,
            pins[name],
        )


def test_the_trainers_are_an_extra_for_the_tests_only() -> None:
    """lightning, accelerate and transformers are what tests/integrations/ trains with; a user
    of the scaler installs none of them, and the tests get the versions constraints.txt pins."""
    root, project = ROOT, PROJECT
    trainers = {"lightning", "accelerate", "transformers"}

    def names(requirements: list[str]) -> set[str]:
        return {re.split(r"[\s<>=!~\[;]", r, maxsplit=1)[0].lower() for r in requirements}

    assert not names(project["dependencies"]) & trainers
    assert names(project["optional-dependencies"]["integrations"]) == trainers
    lines = (root / "constraints.txt").read_text().splitlines()
    pins = {line.split("==")[0].lower() for line in lines if "==" in line}
    assert trainers <= pins


def test_make_venv_installs_each_mirror_extra() -> None:
    """tests/mirrors/ skips a tracker that is not installed: make venv installs all three,
    so that the suite runs them; each extra names one tracker."""
    makefile = (ROOT / "Makefile").read_text()
    (installed,) = re.findall(r"-e '\.\[([a-z,]+)\]'", makefile)
    assert set(MIRROR_EXTRAS) <= set(installed.split(","))
    for extra in MIRROR_EXTRAS:
        (requirement,) = PROJECT["optional-dependencies"][extra]
        assert extra in Requirement(requirement).name
