"""The distribution as users get it: the sdist and the wheel hold the whole product, and the
wheel, installed (not editable) into a fresh venv beside the pinned torch, puts one name in
its top level, ``scalewatch``, and trains, migrates and serves from a project folder of the
user's that holds packages named ``app``, ``web``, ``migrations`` and ``scaler`` of its own.

It builds and installs (a minute or two, torch included), so ``make wheel-check`` runs it
(``pytest --wheel``); elsewhere it is skipped.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests._helpers.imports import FOLDERS
from tests._helpers.net import free_port
from tests._helpers.processes import end_process
from tests._helpers.projects import own_packages

pytestmark = [pytest.mark.slow, pytest.mark.wheel]

ROOT = Path(__file__).resolve().parent.parent
# Each folder of the checkout and the path it is installed under (pyproject's package-dir).
PRODUCT = {folder: package.replace(".", "/") for folder, package in FOLDERS.items()}
# Tracked under the product's folders but not shipped: the dashboard's Node unit tests and
# the package.json that lets Node import web/'s modules for them.
NOT_SHIPPED = re.compile(r"^web/(tests/|package\.json$)")
BUILD_TIMEOUT_S = 300.0
INSTALL_TIMEOUT_S = 600.0
START_TIMEOUT_S = 60.0

TRAIN = """
import json
import torch
from scalewatch import GradScaler

torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
scaler = GradScaler("cpu", run_name="from the wheel")
for _ in range(20):
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(torch.randn(8, 4)), torch.randn(8, 1))
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
scaler.close()
print(json.dumps({"run_id": scaler.run_id, "steps": scaler.stats().steps}))
"""


def _shipped_files() -> set[str]:
    """The product's files in the working tree as git sees it (committed or not)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", *PRODUCT],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    return {name for name in listed if (ROOT / name).is_file() and not NOT_SHIPPED.match(name)}


def _installed_as(name: str) -> str:
    """A checkout's path as the wheel names it: ``app/main.py`` -> ``scalewatch/app/main.py``."""
    folder, _, rest = name.partition("/")
    return f"{PRODUCT[folder]}/{rest}"


@dataclass
class Built:
    wheel: Path
    sdist: Path


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """The sdist and the wheel, built from a copy of the tracked tree: a ``build/`` left in
    the checkout by an earlier build cannot slip stale files into them."""
    tree = tmp_path_factory.mktemp("tree")
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    for name in listed:
        if (ROOT / name).is_file():
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, tree / name)
    dist = tmp_path_factory.mktemp("dist")
    for command in (
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(tree)],
        [sys.executable, "-m", "build", "--sdist", "--outdir", str(dist), str(tree)],
    ):
        done = subprocess.run(command, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = dist.glob("scalewatch-*.whl")
    (sdist,) = dist.glob("scalewatch-*.tar.gz")
    return Built(wheel, sdist)


def test_the_wheel_holds_the_product_and_nothing_else(built: Built) -> None:
    with zipfile.ZipFile(built.wheel) as wheel:
        names = {n for n in wheel.namelist() if ".dist-info/" not in n}
        entry_points = next(n for n in wheel.namelist() if n.endswith("entry_points.txt"))
        assert "scalewatch = scalewatch.app.cli:main" in wheel.read(entry_points).decode()
    shipped = _shipped_files()
    assert "app/alerts/__init__.py" in shipped
    assert "web/run.html" in shipped
    assert names == {_installed_as(name) for name in shipped}


def test_the_wheel_puts_one_name_in_the_users_environment(built: Built) -> None:
    with zipfile.ZipFile(built.wheel) as wheel:
        top = {name.split("/")[0] for name in wheel.namelist()}
        (info,) = (name for name in top if name.endswith(".dist-info"))
        listed = (
            wheel.read(f"{info}/top_level.txt").decode().split()
            if (f"{info}/top_level.txt" in wheel.namelist())
            else ["scalewatch"]
        )
    assert top - {info} == {"scalewatch"}
    assert listed == ["scalewatch"]


def test_the_sdist_holds_the_product(built: Built) -> None:
    with tarfile.open(built.sdist) as sdist:
        names = {name.partition("/")[2] for name in sdist.getnames()}
    missing = (_shipped_files() | {"pyproject.toml", "setup.py", "README.md", "LICENSE"}) - names
    assert missing == set()


@dataclass
class Installed:
    venv: Path
    cwd: Path  # outside the checkout
    env: dict[str, str]

    def run(self, *command: str, timeout: float = 120.0) -> str:
        done = subprocess.run(
            [str(self.venv / "bin" / command[0]), *command[1:]],
            cwd=self.cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout


@pytest.fixture(scope="module")
def installed(built: Built, tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """The wheel in a fresh venv, its dependencies as pinned (torch from constraints.txt)."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    done = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "-q",
            "-c",
            str(ROOT / "constraints.txt"),
            str(built.wheel),
        ],
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    cwd = tmp_path_factory.mktemp("elsewhere")
    own_packages(cwd)
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    env["SCALEWATCH_DB"] = f"sqlite:///{cwd / 'scalewatch.db'}"
    return Installed(venv, cwd, env)


def test_the_installed_packages_are_the_wheels(installed: Installed) -> None:
    """Not the checkout's, nor the project folder's: what the fresh venv imports lies in it."""
    found = installed.run(
        "python",
        "-c",
        "import json, scalewatch, scalewatch.app, scalewatch.migrations, scalewatch.web as web;"
        "print(json.dumps([m.__file__ for m in (scalewatch, scalewatch.app, "
        "scalewatch.migrations, web)]))",
    )
    for path in json.loads(found):
        assert Path(path).is_relative_to(installed.venv), path


def test_the_version_is_the_distributions(installed: Installed) -> None:
    """As the console script and as ``python -m``, which puts the project folder first."""
    said = installed.run("scalewatch", "--version")
    assert installed.run("python", "-m", "scalewatch.app", "--version") == said
    version = installed.run(
        "python", "-c", "import importlib.metadata as m; print(m.version('scalewatch'))"
    ).strip()
    assert said.strip() == f"scalewatch, version {version}"


def test_the_migrations_run_from_the_installed_package(installed: Installed) -> None:
    url = f"sqlite:///{installed.cwd / 'upgraded.db'}"
    said = installed.run("scalewatch", "db", "upgrade", "--db", url)
    heads = sorted((ROOT / "migrations" / "versions").glob("*_*.py"))
    revisions = {path.name.partition("_")[0] for path in heads}
    (revision,) = re.findall(r"at revision (\w+)", said)
    assert revision in revisions


@pytest.fixture(scope="module")
def trained(installed: Installed) -> dict[str, int]:
    script = installed.cwd / "train.py"
    script.write_text(TRAIN)
    return dict(json.loads(installed.run("python", str(script), timeout=300)))


@pytest.fixture(scope="module")
def served(installed: Installed, trained: dict[str, int]) -> Iterator[str]:
    """``scalewatch serve`` of the venv over the store the run was trained into."""
    port = free_port()
    serve = [str(installed.venv / "bin" / "scalewatch"), "serve", "--port", str(port)]
    log = installed.cwd / "serve.log"
    with log.open("wb") as out:
        server = subprocess.Popen(
            [*serve, "--host", "127.0.0.1"],
            cwd=installed.cwd,
            env=installed.env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    base_url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while _status(f"{base_url}/healthz") != 200:
            assert server.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        yield base_url
    finally:
        end_process(server)


def _status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


def _get(url: str) -> tuple[str, bytes]:
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200, url
        return response.headers["content-type"], response.read()


def test_a_run_trained_from_the_wheel_is_served_by_it(served: str, trained: dict[str, int]) -> None:
    assert trained["steps"] == 20
    kind, body = _get(f"{served}/api/runs")
    assert kind.startswith("application/json")
    listed = [(run["id"], run["name"]) for run in json.loads(body)["runs"]]
    assert listed == [(trained["run_id"], "from the wheel")]
    _, body = _get(f"{served}/api/runs/{trained['run_id']}/export?format=jsonl")
    assert [json.loads(line)["step"] for line in body.splitlines()] == list(range(1, 21))

    kind, body = _get(f"{served}/run.html?run={trained['run_id']}")
    assert kind.startswith("text/html")
    assert b'<script type="module" src="run.js"></script>' in body
    kind, body = _get(f"{served}/run.js")
    assert kind.startswith("text/javascript")

    kind, body = _get(f"{served}/vendor/plotly.min.js")
    assert kind.startswith("text/javascript")
    assert re.match(rb"/\*\*\s*\* plotly\.js v\d", body)
