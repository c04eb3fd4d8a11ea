"""A real service on 127.0.0.1 over a temporary store that a training process is writing.

Used by the browser tests and by ``take_screenshots.py``::

    with serve_live_run(tmp_dir) as served:
        print(served.base_url, served.run_id)
"""

from __future__ import annotations

import json
import os
import select
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scaler.store import runs
from scaler.store.engine import Store, open_store
from scaler.store.records import StepRecord

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
FEEDER = Path(__file__).with_name("_feeder.py")
TOKEN = "web-test-token"
START_TIMEOUT_S = 30.0
HOSTILE_NAME = "<img src=x onerror=alert(1)>"


@dataclass
class Served:
    base_url: str
    token: str
    db_url: str
    store: Store
    run_id: int  # the live run the feeder writes
    other_runs: dict[str, int] = field(default_factory=dict)  # name -> id, already ended


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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _stop(process: subprocess.Popen[bytes] | subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
    if process.stdout is not None:
        process.stdout.close()


def _scalewatch_command() -> list[str]:
    script = Path(sys.executable).with_name("scalewatch")
    if script.exists():
        return [str(script)]
    found = shutil.which("scalewatch")
    if found:
        return [found]
    return [sys.executable, "-c", "import sys; from app.cli import main; sys.exit(main())"]


def _read_run_id(feeder: subprocess.Popen[str], deadline: float) -> int:
    assert feeder.stdout is not None
    while time.monotonic() < deadline:
        ready, _, _ = select.select([feeder.stdout], [], [], 0.2)
        if ready:
            line = feeder.stdout.readline()
            if line:
                return int(json.loads(line)["run_id"])
        if feeder.poll() is not None:
            break
    raise RuntimeError(f"the feeder did not report its run (exit code {feeder.poll()})")


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


def add_ended_run(
    store: Store, name: str, *, status: str = "finished", steps: int = 120, world_size: int = 2
) -> int:
    """A run that has ended already, with a few overflows on rank 0."""
    control = {"growth_interval": 20, "growth_factor": 2.0, "backoff_factor": 0.5}
    ref = runs.create_run(
        store,
        name=name,
        world_size=world_size,
        config=control,
        control={**control, "min_scale": None, "max_scale": None, "hysteresis": None},
    )
    scale, tracker, records = 1024.0, 0, []
    for step in range(1, steps + 1):
        overflow = step % 30 == 0
        used = scale
        if overflow:
            scale, tracker = scale / 2, 0
        else:
            tracker += 1
            if tracker == 20:
                scale, tracker = scale * 2, 0
        records.append(
            StepRecord(
                step,
                time.time(),
                used,
                overflow,
                overflow,
                (0,) if overflow else (),
                scale,
                tracker,
                20,
                2.0,
                0.5,
                0,
            )
        )
    runs.write_steps(store, ref.id, records)
    runs.end_run(store, ref.id, status)
    return ref.id


@contextmanager
def serve_live_run(
    tmp_dir: Path,
    *,
    name: str = "bert-large fsdp",
    history: int = 300,
    rate: float = 20.0,
    overflow_every: int = 40,
    ranks: str = "1,3",
    ceiling: float = 0.0,
    ended_runs: Sequence[tuple[str, str]] = (),
) -> Iterator[Served]:
    """Start a feeder writing a running run and ``scalewatch serve`` over the same store.

    ``ended_runs`` are ``(name, status)`` pairs of runs written before the service starts.
    """
    db_url = f"sqlite:///{tmp_dir / 'scalewatch.db'}"
    with ExitStack() as stack:
        store = stack.enter_context(open_store(db_url))
        others = {
            run_name: add_ended_run(store, run_name, status=status)
            for run_name, status in ended_runs
        }
        feeder = subprocess.Popen(
            [
                sys.executable,
                str(FEEDER),
                "--db",
                db_url,
                "--name",
                name,
                "--history",
                str(history),
                "--rate",
                str(rate),
                "--overflow-every",
                str(overflow_every),
                "--ranks",
                ranks,
                "--ceiling",
                str(ceiling),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        stack.callback(_stop, feeder)
        run_id = _read_run_id(feeder, time.monotonic() + START_TIMEOUT_S)

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
        stack.callback(_stop, server)
        base_url = f"http://127.0.0.1:{port}"
        _wait_healthy(base_url, server, log)
        yield Served(base_url, TOKEN, db_url, store, run_id, others)
