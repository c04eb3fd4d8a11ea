"""Faults for the reliability tests: real trainers, a real service, SQLite-level faults, figures.

Run as a script, this module is a trainer that prints ``step wall_time work_s`` per step::

    python tests/_helpers/faults.py sqlite:///x.db NAME --period 0.005 --stop STOPFILE
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import IO, TYPE_CHECKING, Any

from sqlalchemy import Engine, event

from tests._helpers.net import free_port
from tests._helpers.processes import end_process
from tests._helpers.waiting import wait_for

if TYPE_CHECKING:
    from scalewatch.telemetry import TelemetrySettings

HERE = Path(__file__).resolve()
ROOT = HERE.parents[2]
TOKEN = "reliability-token"
FIGURES_ENV = "SCALEWATCH_RELIABILITY_OUT"
# Lines of a trainer's stderr that mean something reached the user: a traceback, a store
# error, or one of the telemetry's own warnings.
ALARMS = ("Traceback", "locked", "scalewatch:", "Error")


def ratio(during: Sequence[float], before: Sequence[float]) -> float:
    """Median of ``during`` over the median of ``before``."""
    return median(during) / median(before)


def record_figures(section: str, values: dict[str, Any]) -> None:
    """Merge ``values`` under ``section`` into the JSON file $SCALEWATCH_RELIABILITY_OUT names."""
    out = os.environ.get(FIGURES_ENV)
    if not out:
        return
    path = Path(out)
    data = json.loads(path.read_text()) if path.exists() else {}
    data[section] = values
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


# ------------------------------------------------------------ the trainer


def train(
    url: str,
    name: str,
    *,
    period: float,
    out: IO[str],
    stop: Path | None = None,
    max_steps: int = 1_000_000,
    writer_pid_out: str | None = None,
) -> int:
    """Train a small MLP with ``scalewatch.GradScaler`` writing to ``url``; one line per step.

    Every 50th step overflows (an inf loss), so the scale backs off and grows again.
    Steps are paced at ``period`` seconds; ``work_s`` is the step's own time, without
    the pacing. Stops after ``max_steps`` or once ``stop`` exists; returns the last step.
    ``writer_pid_out``: a file the pid of the run's telemetry writer process is written to.
    """
    import torch

    import scalewatch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    gs = scalewatch.GradScaler(
        "cpu", init_scale=2.0**10, growth_interval=20, telemetry=url, run_name=name
    )
    x = torch.randn(16, 32)
    step = 0
    next_at = time.monotonic()
    while step < max_steps:
        step += 1
        started = time.perf_counter()
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        if step % 50 == 0:
            loss = loss * float("inf")
        gs.scale(loss).backward()
        gs.step(opt)
        gs.update()
        work = time.perf_counter() - started
        if step == 1 and writer_pid_out is not None:  # the run opens at the first step
            Path(writer_pid_out).write_text(str(gs._session.telemetry.writer_pid))
        print(step, repr(time.time()), f"{work:.6f}", file=out, flush=True)
        if stop is not None and stop.exists():
            break
        next_at += period
        delay = next_at - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    gs.close()
    return step


@dataclass(frozen=True)
class StepLine:
    step: int
    wall_time: float
    work_s: float


def read_steps(path: Path) -> list[StepLine]:
    """The complete lines a trainer has written to ``path`` so far."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    lines = text.split("\n")[:-1]  # the last one may be half written
    return [StepLine(int(s), float(w), float(t)) for s, w, t in (line.split() for line in lines)]


def start_trainer(
    url: str, name: str, tmp: Path, *, period: float, stop: Path
) -> tuple[subprocess.Popen[bytes], Path, Path]:
    """This module as a trainer process; returns it, its stdout file and its stderr file."""
    out, err = tmp / f"{name}.out", tmp / f"{name}.err"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, str(HERE), url, name, "--period", str(period), "--stop", str(stop)],
            stdout=stdout,
            stderr=stderr,
            cwd=tmp,
            env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)},
        )
    return proc, out, err


def alarms(text: str) -> list[str]:
    return [line for line in text.splitlines() if any(word in line for word in ALARMS)]


# ------------------------------------------------------------ trainers forked from a warm server


_FORKSERVER_PRELOAD = ["torch", "scalewatch", "scalewatch.store.engine", "tests._helpers.faults"]


def killable_context() -> Any:
    """A forkserver that has imported torch and scaler, so each trainer starts in milliseconds."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_FORKSERVER_PRELOAD)
    return ctx


def killable_trainer(url: str, name: str, out_path: str, period: float) -> None:
    """A trainer whose stdout is ``out_path`` (the target of a forkserver process); the
    pid of its telemetry writer process is in ``out_path`` + ``.writer``."""
    fd = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.close(fd)
    stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 (the process's stdout)
    train(url, name, period=period, out=stdout, writer_pid_out=f"{out_path}.writer")


def process_gone(pid: int) -> bool:
    """Whether ``pid`` has exited (a zombie that nobody has reaped yet counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


# ------------------------------------------------------------ a trainer on the test's thread


class PacedTrainer:
    """A small MLP trained with ``scalewatch.GradScaler`` on this thread, a step every
    ``period`` seconds."""

    def __init__(self, telemetry: TelemetrySettings, period: float) -> None:
        import torch  # as train() does: this module starts trainers before torch is imported

        import scalewatch

        self.period = period
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(
            torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)
        )
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-3)
        self.gs = scalewatch.GradScaler(
            "cpu", init_scale=2.0**10, growth_interval=20, telemetry=telemetry, run_name="faulty"
        )
        self.x = torch.randn(16, 32)
        self.step = 0

    def dropped(self) -> int:
        """Records dropped so far by the telemetry writer."""
        return int(self.gs._session.telemetry.dropped)

    def run(self, seconds: float) -> list[float]:
        """Train for ``seconds``; each step's own time (without the pacing)."""
        times = []
        end = time.monotonic() + seconds
        next_at = time.monotonic()
        while time.monotonic() < end:
            self.step += 1
            started = time.perf_counter()
            self.opt.zero_grad()
            loss = self.model(self.x).pow(2).mean()
            if self.step % 50 == 0:
                loss = loss * float("inf")
            self.gs.scale(loss).backward()
            self.gs.step(self.opt)
            self.gs.update()
            times.append(time.perf_counter() - started)
            next_at += self.period
            time.sleep(max(0.0, next_at - time.monotonic()))
        return times


# ------------------------------------------------------------ the service


class Service:
    """``scalewatch serve`` on a fixed free port over ``url``; killed and restarted at will."""

    def __init__(self, url: str, tmp: Path) -> None:
        self.url = url
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._tmp = tmp
        self._starts = 0
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self._starts += 1
        log = self._tmp / f"serve-{self._starts}.log"
        script = Path(sys.executable).with_name("scalewatch")
        command = [str(script)] if script.exists() else [shutil.which("scalewatch") or "scalewatch"]
        env = {
            **os.environ,
            "SCALEWATCH_TOKEN": TOKEN,
            "SCALEWATCH_TOKEN_FILE": str(self._tmp / "token"),
        }
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                [
                    *command,
                    "serve",
                    "--db",
                    self.url,
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
            )

    def healthy(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"scalewatch serve exited:\n{self.logs()}")
        try:
            return self.get("/healthz")[0] == 200
        except OSError:
            return False

    def wait_healthy(self, timeout: float = 60.0) -> None:
        wait_for(self.healthy, timeout, "scalewatch serve to answer /healthz")

    def get(self, path: str, timeout: float = 10.0) -> tuple[int, Any]:
        """(status, JSON body); raises OSError when nothing answers."""
        try:
            with urllib.request.urlopen(self.base_url + path, timeout=timeout) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            body = error.read()
            error.close()
            return error.code, body.decode(errors="replace")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None:
            end_process(self.proc)

    def logs(self) -> str:
        return "\n".join(
            p.read_text(errors="replace") for p in sorted(self._tmp.glob("serve-*.log"))
        )


@contextmanager
def service(url: str, tmp: Path) -> Iterator[Service]:
    served = Service(url, tmp)
    served.start()
    try:
        yield served
    finally:
        served.stop()


# ------------------------------------------------------------ SQLite-level faults


_LOCKER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
conn.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
sys.stdin.readline()
conn.execute("COMMIT")
"""


@contextmanager
def exclusive_lock(db: Path) -> Iterator[None]:
    """Another process holds ``BEGIN EXCLUSIVE`` on ``db`` until the block ends."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _LOCKER, str(db)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        if proc.stdout.readline().strip() != "locked":
            raise RuntimeError("the locking process did not take the lock")
        yield
        proc.stdin.write("\n")
        proc.stdin.flush()
        if proc.wait(10) != 0:
            raise RuntimeError("the locking process failed to commit")
    finally:
        end_process(proc)
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()


class ConnectionFault:
    """Runs ``on_sql`` on every connection ``engine`` hands out while on, ``off_sql`` after.

    SQLite's own answers, whoever runs the tests (root ignores chmod): ``PRAGMA query_only``
    fails writes as a read-only file does, ``PRAGMA max_page_count`` as a full disk does.
    """

    def __init__(self, engine: Engine, on_sql: str, off_sql: str) -> None:
        self.on = False
        self._sql = (off_sql, on_sql)
        self._engine = engine
        event.listen(engine, "checkout", self._checkout)

    def _checkout(self, dbapi_connection: sqlite3.Connection, *_: Any) -> None:
        dbapi_connection.execute(self._sql[self.on]).fetchall()

    def remove(self) -> None:
        event.remove(self._engine, "checkout", self._checkout)


READ_ONLY = ("PRAGMA query_only = ON", "PRAGMA query_only = OFF")
DISK_FULL = ("PRAGMA max_page_count = 1", "PRAGMA max_page_count = 4294967294")


def integrity(db: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db, timeout=30) as conn:
        result = conn.execute("PRAGMA integrity_check").fetchall()
    conn.close()
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="a paced trainer writing telemetry")
    parser.add_argument("url")
    parser.add_argument("name")
    parser.add_argument("--period", type=float, default=0.005)
    parser.add_argument("--stop", type=Path)
    parser.add_argument("--max-steps", type=int, default=1_000_000)
    args = parser.parse_args(argv)
    train(
        args.url,
        args.name,
        period=args.period,
        out=sys.stdout,
        stop=args.stop,
        max_steps=args.max_steps,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
