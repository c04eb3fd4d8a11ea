"""scalewatch inside a user's project: a folder with packages of its own named ``app``,
``web``, ``migrations`` and ``scaler`` (each raises if imported). A training script run
there records every step, and the service started there (``python -m`` puts the folder
first on ``sys.path``) migrates, serves the dashboard and every step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._helpers.net import free_port
from tests._helpers.processes import end_process
from tests._helpers.projects import NAMES, own_packages
from tests._helpers.waiting import wait_for

pytestmark = pytest.mark.heavy

STEPS = 30
TRAIN = f"""
import json, torch
from scalewatch import ShardedGradScaler

torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
with ShardedGradScaler("cpu", run_name="in a project") as scaler:
    for _ in range({STEPS}):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(torch.randn(8, 4)), torch.randn(8, 1))
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
print(json.dumps({{"run_id": scaler.run_id}}))
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    folder = own_packages(tmp_path / "project")
    (folder / "train.py").write_text(TRAIN)
    return folder


def _env(project: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["SCALEWATCH_DB"] = f"sqlite:///{project / 'scalewatch.db'}"
    return env


def _run(project: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *argv],
        cwd=project,
        env=_env(project),
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_the_projects_own_packages_are_what_the_folder_imports(project: Path) -> None:
    """The fixture's packages are really in the way: importing one there fails."""
    for name in NAMES:
        done = _run(project, "-c", f"import {name}")
        assert done.returncode == 1
        assert f"the project's own '{name}' package was imported" in done.stderr


@pytest.fixture
def trained(project: Path) -> int:
    done = _run(project, "train.py")
    assert done.returncode == 0, done.stderr
    assert "scalewatch:" not in done.stderr  # no warning: every record written
    return int(json.loads(done.stdout)["run_id"])


@pytest.fixture
def served(project: Path, trained: int) -> Iterator[str]:
    port = free_port()
    log = project / "serve.log"
    with log.open("wb") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "scalewatch.app", "serve", "--port", str(port)],
            cwd=project,
            env=_env(project),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        assert server.poll() is None, log.read_text()
        try:
            with urllib.request.urlopen(f"{base}/healthz", timeout=2) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False

    try:
        wait_for(healthy, timeout=60, what="the service started in the project folder")
        yield base
    finally:
        end_process(server)


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as answer:
        assert answer.status == 200, url
        body: bytes = answer.read()
        return body


def test_a_job_and_the_service_in_a_project_with_its_own_packages(
    served: str, trained: int
) -> None:
    runs = json.loads(_get(f"{served}/api/runs"))["runs"]
    assert [(run["id"], run["name"]) for run in runs] == [(trained, "in a project")]
    exported = _get(f"{served}/api/runs/{trained}/export?format=jsonl").splitlines()
    assert [json.loads(line)["step"] for line in exported] == list(range(1, STEPS + 1))
    assert b'src="run.js"' in _get(f"{served}/run.html?run={trained}")


def test_the_command_line_in_a_project_with_its_own_packages(project: Path, trained: int) -> None:
    listed = _run(project, "-m", "scalewatch.app", "runs")
    assert listed.returncode == 0, listed.stderr
    assert "in a project" in listed.stdout
    version = _run(project, "-m", "scalewatch.app", "--version")
    assert version.stdout.startswith("scalewatch, version ")
