"""A real service on 127.0.0.1 over a temporary store that a real training job is writing.

Used by the browser tests and by ``take_screenshots.py``::

    with serve_live_run(tmp_dir) as served:
        print(served.base_url, served.run_id)
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from scalewatch.store import queries
from scalewatch.store.engine import Store, open_store
from tests._helpers.net import free_port
from tests._helpers.processes import end_process

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
TRAINER = Path(__file__).with_name("trainer.py")
TOKEN = "web-test-token"
START_TIMEOUT_S = 180.0  # the trainers start torch and train their burst: slow on a loaded machine
HOSTILE_NAME = "<img src=x onerror=alert(1)>"


@dataclass
class Served:
    base_url: str
    token: str
    db_url: str
    store: Store
    run_id: int  # the live run, being trained
    other_runs: dict[str, int] = field(default_factory=dict)  # name -> id, already finished


@dataclass
class Tab:
    """A page with what it said: console errors, uncaught exceptions and dialogs."""

    page: Any
    errors: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)

    def unexpected_errors(self, *expected_statuses: int) -> list[str]:
        """Errors other than the browser's own log line for an expected HTTP refusal."""
        allowed = tuple(f"status of {status} " for status in expected_statuses)
        return [
            text
            for text in self.errors
            if not (text.startswith("Failed to load resource") and any(a in text for a in allowed))
        ]


def stop_process(process: subprocess.Popen[bytes] | subprocess.Popen[str]) -> None:
    end_process(process)
    if process.stdout is not None:
        process.stdout.close()


def _scalewatch_command() -> list[str]:
    script = Path(sys.executable).with_name("scalewatch")
    if script.exists():
        return [str(script)]
    found = shutil.which("scalewatch")
    if found:
        return [found]
    return [sys.executable, "-m", "scalewatch.app"]


def read_run_id(trainer: subprocess.Popen[str], deadline: float) -> int:
    assert trainer.stdout is not None
    while time.monotonic() < deadline:
        ready, _, _ = select.select([trainer.stdout], [], [], 0.2)
        if ready:
            line = trainer.stdout.readline()
            if line:
                return int(json.loads(line)["run_id"])
        if trainer.poll() is not None:
            break
    raise RuntimeError(f"a trainer did not report its run (exit code {trainer.poll()})")


def _wait_healthy(base_url: str, server: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"scalewatch serve exited early:\n{log.read_text()}")
        try:
            with urllib.request.urlopen(f"{base_url}/healthz", timeout=1) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.1)
    raise RuntimeError(
        f"scalewatch serve not healthy after {START_TIMEOUT_S} s:\n{log.read_text()}"
    )


def start_trainer(
    db_url: str, name: str, *options: str, stderr: IO[bytes]
) -> subprocess.Popen[str]:
    """``trainer.py`` training a run called ``name``; it prints the run's id on stdout."""
    port = str(free_port())
    return subprocess.Popen(
        [sys.executable, str(TRAINER), "--db", db_url, "--port", port, "--name", name, *options],
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
    )


def wait_for_steps(store: Store, run_id: int, count: int, deadline: float) -> None:
    """Wait until the store holds ``count`` steps of the run."""
    while (queries.last_step(store, run_id) or 0) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"run {run_id} has not reached step {count}")
        time.sleep(0.1)


def wait_for_exit(process: subprocess.Popen[str], deadline: float) -> None:
    returncode = process.wait(timeout=max(0.0, deadline - time.monotonic()))
    if returncode != 0:
        raise RuntimeError(f"a trainer exited with code {returncode}")


def start_service(stack: ExitStack, db_url: str, tmp_dir: Path) -> str:
    """``scalewatch serve`` over ``db_url`` with the token ``TOKEN``, stopped by ``stack``."""
    port = free_port()
    log = tmp_dir / "server.log"
    env = {
        **os.environ,
        "SCALEWATCH_TOKEN": TOKEN,
        "SCALEWATCH_TOKEN_FILE": str(tmp_dir / "token"),
    }
    log_file = stack.enter_context(log.open("wb"))
    server = subprocess.Popen(
        [
            *_scalewatch_command(),
            "serve",
            "--db",
            db_url,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        stdout=log_file,
        stderr=subprocess.STDOUT,
        env=env,
    )
    stack.callback(stop_process, server)
    base_url = f"http://127.0.0.1:{port}"
    _wait_healthy(base_url, server, log)
    return base_url


@contextmanager
def serve_live_run(
    tmp_dir: Path,
    *,
    name: str = "bert-large fsdp",
    world_size: int = 2,
    burst: int = 200,
    rate: float = 20.0,
    ended_runs: Sequence[tuple[str, int]] = (),
) -> Iterator[Served]:
    """Train a run that keeps going and serve ``scalewatch serve`` over its store.

    The live run trains ``burst`` steps at full speed, then ``rate`` steps per second,
    until it is stopped at the end. ``ended_runs`` are ``(name, steps)`` pairs: runs
    trained to the end (on one process) at the same time. The service starts once the
    ended runs have finished and the live run holds ``burst`` steps.
    """
    db_url = f"sqlite:///{tmp_dir / 'scalewatch.db'}"
    with ExitStack() as stack:
        store = stack.enter_context(open_store(db_url))
        live = start_trainer(
            db_url,
            name,
            "--world-size",
            str(world_size),
            "--burst",
            str(burst),
            "--rate",
            str(rate),
            stderr=stack.enter_context((tmp_dir / "trainer.log").open("wb")),
        )
        stack.callback(stop_process, live)
        ended = {}
        for i, (run_name, steps) in enumerate(ended_runs):
            log = stack.enter_context((tmp_dir / f"trainer-ended-{i}.log").open("wb"))
            ended[run_name] = start_trainer(
                db_url,
                run_name,
                "--world-size",
                "1",
                "--steps",
                str(steps),
                "--rate",
                "0",
                stderr=log,
            )
            stack.callback(stop_process, ended[run_name])
        deadline = time.monotonic() + START_TIMEOUT_S
        others = {}
        for run_name, trainer in ended.items():
            others[run_name] = read_run_id(trainer, deadline)
            wait_for_exit(trainer, deadline)
        run_id = read_run_id(live, deadline)
        wait_for_steps(store, run_id, burst, deadline)

        base_url = start_service(stack, db_url, tmp_dir)
        yield Served(base_url, TOKEN, db_url, store, run_id, others)
