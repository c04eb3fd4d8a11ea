"""What the distribution's dependencies must give every process that imports torch."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path


def test_torch_imports_without_a_warning() -> None:
    """Without numpy, torch warned "Failed to initialize NumPy" in every script and every
    demo rank; numpy is a dependency, so that no filter has to hide it."""
    done = subprocess.run(
        [
            sys.executable,
            "-W",
            "error",
            "-c",
            "import torch; import scaler; torch.zeros(1).numpy()",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""


def test_the_trainers_are_an_extra_for_the_tests_only() -> None:
    """lightning, accelerate and transformers are what tests/integrations/ trains with; a user
    of the scaler installs none of them, and the tests get the versions constraints.txt pins."""
    root = Path(__file__).resolve().parent.parent
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    trainers = {"lightning", "accelerate", "transformers"}

    def names(requirements: list[str]) -> set[str]:
        return {re.split(r"[\s<>=!~\[;]", r, maxsplit=1)[0].lower() for r in requirements}

    assert not names(project["dependencies"]) & trainers
    assert names(project["optional-dependencies"]["integrations"]) == trainers
    lines = (root / "constraints.txt").read_text().splitlines()
    pins = {line.split("==")[0].lower() for line in lines if "==" in line}
    assert trainers <= pins
