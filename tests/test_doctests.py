"""The ``>>>`` examples in the packages' docstrings are part of the suite (pyproject's
``--doctest-modules``): every module that has one gives pytest a doctest to run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("scaler", "app")


def _modules_with_examples() -> set[str]:
    return {
        path.relative_to(ROOT).as_posix()
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        if ">>> " in path.read_text(encoding="utf-8")
    }


@pytest.mark.heavy
def test_every_module_with_an_example_is_collected_as_a_doctest() -> None:
    modules = _modules_with_examples()
    assert "scaler/stats.py" in modules  # the scan itself finds them
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            *PACKAGES,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    collected = {line.split("::")[0] for line in done.stdout.splitlines() if "::" in line}
    assert modules <= collected, sorted(modules - collected)
