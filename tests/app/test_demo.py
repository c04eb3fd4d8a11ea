"""``scalewatch demo``: a real 2-rank fp16 FSDP2 training served live, stopped by Ctrl-C."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

from scalewatch.store.engine import open_store
from scalewatch.store.queries import list_runs
from tests._helpers.net import free_port
from tests._helpers.processes import interruptible
from tests._helpers.waiting import wait_for

pytestmark = pytest.mark.slow


def _get_json(url: str) -> object:
    with urllib.request.urlopen(url, timeout=5) as response:
        assert response.status == 200
        return json.loads(response.read())


def test_demo_trains_serves_and_stops_cleanly(tmp_path: Path) -> None:
    demo = _Demo(tmp_path, steps=60)

    def finished() -> list[dict[str, Any]] | None:
        assert demo.process.poll() is None, demo.output
        runs = demo.runs()
        return runs if runs and runs[0]["status"] == "finished" else None

    try:
        runs = wait_for(finished, 240, "the demo's run to finish")
        assert runs[0]["world_size"] == 2
        with urllib.request.urlopen(f"http://127.0.0.1:{demo.port}/", timeout=5) as page:
            assert page.status == 200
        with open_store(demo.db) as store:
            (info,) = list_runs(store)
            with store.read() as conn:
                rows = conn.exec_driver_sql(
                    "SELECT step, overflow, scale, scale_after, lr, skipped FROM steps"
                    " ORDER BY step"
                ).all()
                names = [r[0] for r in conn.exec_driver_sql("SELECT name FROM overflow_params")]
        assert [r[0] for r in rows] == list(range(1, 61)), "one row per step"
        assert info.steps == 60
        assert any(r[1] for r in rows), "the high initial scale overflows"
        assert any(r[3] > r[2] for r in rows), "the scale grows at least once"
        rates = [r[4] for r in rows]
        peak = rates.index(max(rates))
        assert rates[: peak + 1] == sorted(rates[: peak + 1]) and rates[-1] < rates[peak]
        # the demo holds its schedule on a skipped step (last_step_skipped)
        assert all(rates[i + 1] == rates[i] for i in range(len(rows) - 1) if rows[i][5])
        assert len(set(rates)) > 10, "warmup, then decay"
        assert names and not any(n.startswith("group ") for n in names), "watched: named"
        demo.process.send_signal(signal.SIGINT)
        assert demo.process.wait(180) == 0, demo.output
    finally:
        demo.stop()
    assert f"http://127.0.0.1:{demo.port}/" in demo.output
    assert "Warning" not in demo.output  # neither torch's numpy notice nor FSDP2's view warning
    # Not a terminal: the progress is plain lines, the last one whole.
    assert "\r" not in demo.output
    assert any(line.split()[1:3] == ["step", "60/60"] for line in demo.output.splitlines())
    db = demo.db.removeprefix("sqlite:///")
    assert demo.output.rstrip().splitlines()[-1] == (
        f"scalewatch demo: run 1 ('tiny-lm-fp16') finished at step 60; it is stored in {db}"
        f" ('scalewatch serve --db {db}' shows it again)"
    )


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc")
def test_a_demo_started_by_a_parent_that_ignores_sigint_still_takes_its_ctrl_c(
    tmp_path: Path,
) -> None:
    """``make test`` run as a background job (SIGINT ignored, as a shell starts one) failed
    every test here that stops the demo with a Ctrl-C: the demo inherited SIGINT ignored
    (and Python then installs no KeyboardInterrupt)."""
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        demo = _Demo(tmp_path, steps=1)
    finally:
        signal.signal(signal.SIGINT, before)
    try:
        status = Path(f"/proc/{demo.process.pid}/status").read_text()
    finally:
        demo.stop()
    ignored = int(next(line for line in status.splitlines() if line.startswith("SigIgn:"))[7:], 16)
    assert not ignored & (1 << (signal.SIGINT - 1)), "the demo starts with SIGINT ignored"


def _marked(mark: str, command: bytes = b"") -> list[int]:
    """Processes alive with ``mark`` in their environment (and ``command`` in their command
    line, when given): what a test started, and what those started in turn."""
    pids: list[int] = []
    if not Path("/proc").is_dir():
        return pids
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:  # ended meanwhile
            continue
        mine = f"SCALEWATCH_TEST_MARK={mark}".encode() in environ and state != "Z"
        if mine and command in cmdline:
            pids.append(int(entry.name))
    return pids


def _kill_marked(mark: str) -> None:
    """Kill what a test left running of the processes marked with ``mark``."""
    for pid in _marked(mark):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _run_status(db: str) -> str:
    """The status of the one run in the store at ``db``."""
    with open_store(db) as store:
        (run,) = list_runs(store)
    return run.status


class _Demo:
    """``scalewatch demo`` training ``steps`` steps (by default, for long), its output read as
    it comes, and every process it starts marked in its environment, so that none is
    missed at the end."""

    def __init__(
        self, tmp_path: Path, steps: int = 100_000, rank_stop_s: float | None = None
    ) -> None:
        self.db = f"sqlite:///{tmp_path / 'demo.db'}"
        self.port = free_port()
        self.mark = uuid.uuid4().hex
        env = {
            **os.environ,
            "SCALEWATCH_TOKEN": "demo-test-token",
            "HOME": str(tmp_path),
            "SCALEWATCH_TEST_MARK": self.mark,
        }
        if rank_stop_s is not None:
            from scalewatch.examples import tiny_lm

            env[tiny_lm.RANK_STOP_ENV] = str(rank_stop_s)
        command = [
            sys.executable,
            "-m",
            "scalewatch.app",
            "demo",
            "--steps",
            str(steps),
            "--db",
            self.db,
        ]
        self.process = interruptible(
            [*command, "--port", str(self.port)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        self._chunks: list[bytes] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        while chunk := self.process.stdout.read1(65536):
            self._chunks.append(chunk)

    @property
    def output(self) -> str:
        return b"".join(self._chunks).decode(errors="replace")

    def runs(self) -> list[dict[str, Any]]:
        """The runs the demo's server lists; none while it is not serving yet."""
        try:
            body = _get_json(f"http://127.0.0.1:{self.port}/api/runs")
        except OSError:
            return []
        assert isinstance(body, dict)
        runs: list[dict[str, Any]] = body["runs"]
        return runs

    def training(self) -> bool:
        """The run has steps stored: every rank is inside its training loop."""
        runs = self.runs()
        return bool(runs) and runs[0]["steps"] >= 3

    def run_status(self) -> str:
        return _run_status(self.db)

    def marked(self, command: bytes = b"") -> list[int]:
        """Processes alive with this demo's mark (the demo, its trainer and its ranks), those
        with ``command`` in their command line only, when given."""
        return _marked(self.mark, command)

    def stop(self) -> None:
        """What the test left running: killed."""
        _kill_marked(self.mark)
        if self.process.poll() is None:  # without /proc, the demo itself at least
            self.process.kill()
        self.process.wait(30)
        self._reader.join(10)
        assert self.process.stdout is not None
        self.process.stdout.close()


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc")
def test_ctrl_c_to_the_demo_alone_stops_every_rank_and_finishes_the_run(tmp_path: Path) -> None:
    """A Ctrl-C sent to the demo process only (``kill -INT``, a process manager) left the
    ranks training on after the demo had exited, and the run running."""
    demo = _Demo(tmp_path)
    try:
        wait_for(demo.training, 240, "the ranks to train")
        demo.process.send_signal(signal.SIGINT)
        assert demo.process.wait(180) == 0, demo.output
        wait_for(lambda: not demo.marked(), 30, "every process of the demo to end")
    finally:
        demo.stop()
    assert demo.run_status() == "finished"
    assert "Traceback" not in demo.output and "Warning" not in demo.output, demo.output


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc")
@pytest.mark.parametrize(
    "started", [b"scalewatch.examples.tiny_lm", b"spawn_main"], ids=["trainer", "ranks"]
)
def test_a_ctrl_c_while_torch_is_imported_stops_quietly(tmp_path: Path, started: bytes) -> None:
    """A Ctrl-C in the demo's first seconds, while its trainer (or its ranks) still imported
    torch, printed a KeyboardInterrupt traceback from each of them."""
    demo = _Demo(tmp_path)
    try:
        wait_for(lambda: demo.marked(started), 120, "the training processes to start")
        demo.process.send_signal(signal.SIGINT)
        assert demo.process.wait(180) == 0, demo.output
        wait_for(lambda: not demo.marked(), 30, "every process of the demo to end")
    finally:
        demo.stop()
    assert "Traceback" not in demo.output and "Warning" not in demo.output, demo.output


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc")
@pytest.mark.parametrize("quick", [False, True], ids=["after-the-notice", "0.2s-after"])
def test_a_second_ctrl_c_kills_the_ranks_at_once_and_quietly(tmp_path: Path, quick: bool) -> None:
    """``quick``: a second Ctrl-C 0.2 s after the first was lost. After a Ctrl-C the demo's
    wait for its trainer (``Popen.wait()``) first waited 0.25 s for the trainer to exit, and
    a Ctrl-C meanwhile became part of the first one."""
    demo = _Demo(tmp_path)
    lock = sqlite3.connect(tmp_path / "demo.db", isolation_level=None)
    try:
        wait_for(demo.training, 240, "the ranks to train")
        # The store locked, the first Ctrl-C cannot finish: rank 0's scaler waits to write.
        lock.execute("BEGIN IMMEDIATE")
        demo.process.send_signal(signal.SIGINT)
        if quick:
            time.sleep(0.2)  # a user's second Ctrl-C: the gap is what the test is about
        else:
            wait_for(lambda: "Ctrl-C again" in demo.output, 90, "the demo to say it stops")
        demo.process.send_signal(signal.SIGINT)
        assert demo.process.wait(20) == 130, demo.output
        wait_for(lambda: not demo.marked(), 10, "every process of the demo to end")
    finally:
        lock.close()
        demo.stop()
    assert "stopping now" in demo.output, demo.output
    assert "Traceback" not in demo.output, demo.output


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc")
def test_the_ranks_stop_and_finish_the_run_when_the_demo_is_killed(tmp_path: Path) -> None:
    """A terminal closed, or a demo killed outright, runs none of its own clean-up: its
    trainer, in a session of its own, notices and stops its ranks as for a Ctrl-C."""
    demo = _Demo(tmp_path)
    try:
        wait_for(demo.training, 240, "the ranks to train")
        demo.process.kill()
        demo.process.wait(10)
        wait_for(lambda: not demo.marked(), 60, "the trainer and its ranks to end")
    finally:
        demo.stop()
    assert demo.run_status() == "finished"


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc")
@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL], ids=["terminated", "killed"])
def test_the_ranks_stop_and_finish_the_run_when_the_trainer_is_stopped(
    tmp_path: Path, stop: signal.Signals
) -> None:
    """``python -m scalewatch.examples.tiny_lm`` run directly: a SIGTERM to it (a process
    manager's stop) stops its ranks as a Ctrl-C does; killed outright, its ranks notice by
    themselves (they ignore SIGINT, so torch's parent-death SIGINT no longer reaches them)."""
    db = tmp_path / "lm.db"
    mark = uuid.uuid4().hex
    command = [sys.executable, "-m", "scalewatch.examples.tiny_lm", "--steps", "100000"]
    trainer = subprocess.Popen(
        [*command, "--db", f"sqlite:///{db}"],
        env={**os.environ, "SCALEWATCH_TEST_MARK": mark},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )

    def training() -> bool:
        assert trainer.poll() is None
        with open_store(f"sqlite:///{db}") as store:
            runs = list_runs(store)
        return bool(runs) and runs[0].steps >= 3

    try:
        wait_for(training, 240, "the ranks to train")
        trainer.send_signal(stop)
        trainer.wait(40)
        wait_for(lambda: not _marked(mark), 40, "the ranks to end")
    finally:
        _kill_marked(mark)
        trainer.kill()
        _, err = trainer.communicate(timeout=30)
    assert _run_status(f"sqlite:///{db}") == "finished"
    assert b"Traceback" not in err, err.decode(errors="replace")


def test_a_sigterm_while_the_trainer_starts_its_ranks_waits_until_they_have(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A SIGTERM (the demo passing on a Ctrl-C) in the middle of ``mp.spawn`` raised there:
    a traceback, and a rank left unable to start. It now stops the ranks once started."""
    from scalewatch.examples import tiny_lm

    class Started:
        processes: list[Any] = []

        def join(self, timeout: float) -> bool:
            raise AssertionError("the trainer waits for ranks it was told to stop")

    spawned = []

    def spawn(fn: Any, args: Any, nprocs: int, join: bool) -> Started:
        os.kill(os.getpid(), signal.SIGTERM)  # its handler runs before the next line
        spawned.append(nprocs)  # the rest of the ranks start
        return Started()

    stopped = []
    monkeypatch.setattr(tiny_lm.mp, "spawn", spawn)
    monkeypatch.setattr(tiny_lm, "max_world_size", lambda: (3, 0))  # whatever the machine
    monkeypatch.setattr(tiny_lm, "_stop_ranks", lambda ranks, stop: stopped.append(ranks))
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = tiny_lm.main(["--steps", "5", "--world-size", "3"])
    except KeyboardInterrupt:
        pytest.fail("the SIGTERM was raised inside mp.spawn, while the ranks started")
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    assert code == 130 and spawned == [3] and stopped == [[]]


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc")
@pytest.mark.parametrize("killed", ["trainer", "demo"])
def test_a_rank_stuck_in_a_collective_ends_when_its_launcher_is_killed(
    tmp_path: Path, killed: str
) -> None:
    """A rank that cannot reach its next check for a stop (in the rendezvous for ranks never
    started, in a collective with a rank that does not answer: here one stopped) ran on
    after its trainer was killed outright, for as long as torch's 30-minute timeout; with a
    demo of 500 ranks, 341 of them did. A killed demo's trainer still ends its ranks."""
    demo = _Demo(tmp_path, rank_stop_s=3)  # the grace, shorter than the default 20 s
    stopped: list[int] = []
    try:
        wait_for(demo.training, 240, "the ranks to train")
        (trainer,) = demo.marked(b"scalewatch.examples.tiny_lm")
        first, second = sorted(demo.marked(b"spawn_main"))
        os.kill(second, signal.SIGSTOP)
        stopped.append(second)
        os.kill(trainer if killed == "trainer" else demo.process.pid, signal.SIGKILL)
        wait_for(lambda: first not in demo.marked(), 60, "the rank left waiting to end")
        os.kill(second, signal.SIGCONT)
        stopped.clear()
        wait_for(lambda: not demo.marked(b"spawn_main"), 60, "every rank to end")
    finally:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        demo.stop()


def test_the_demo_refuses_more_ranks_than_the_machine_runs_before_it_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``demo --world-size 500`` started 500 ranks on a 24 GB machine and exhausted it."""
    from scalewatch.app.cli import _demo as demo
    from scalewatch.app.cli import main
    from scalewatch.examples import tiny_lm

    def started(*args: object, **kwargs: object) -> None:
        raise AssertionError("the trainer was started")

    monkeypatch.setattr(demo.subprocess, "Popen", started)
    monkeypatch.setattr(tiny_lm, "max_world_size", lambda: (4, 2))
    db = f"sqlite:///{tmp_path / 'demo.db'}"
    argv = ["demo", "--world-size", "5", "--port", str(free_port()), "--db", db]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        "scalewatch demo: --world-size 5 is more ranks than this machine can run:"
        " 4 CPU cores (one a rank, gloo) and 2 GPUs (one a rank, NCCL)\n"
    )
    with pytest.raises(SystemExit) as refused:
        tiny_lm.parse_args(["--world-size", "5"])
    assert refused.value.code == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert tiny_lm.parse_args(["--world-size", "4"]).world_size == 4


def test_the_machine_runs_a_rank_per_core_or_per_gpu() -> None:
    from scalewatch.examples import tiny_lm

    cores, gpus = tiny_lm.max_world_size()
    assert cores == len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cores
    assert tiny_lm.world_size_refused(max(cores, gpus)) is None
    assert tiny_lm.world_size_refused(max(cores, gpus) + 1) is not None


class _Stream(io.StringIO):
    def __init__(self, terminal: bool) -> None:
        super().__init__()
        self.terminal = terminal

    def isatty(self) -> bool:
        return self.terminal


@pytest.mark.parametrize("terminal", [True, False], ids=["terminal", "log"])
def test_the_progress_redraws_one_line_on_a_terminal_only_and_ends_it(terminal: bool) -> None:
    """It wrote ``\\r`` into logs and pipes too, one long line of redraws."""
    from scalewatch.examples.tiny_lm import Progress

    out = _Stream(terminal)
    progress = Progress(250, out)
    for step in range(1, 251):
        if progress.due(step):
            progress.show(step, 1.0, 2.0**16)
    progress.end()
    text = out.getvalue()
    assert text.endswith("\n") and text.count("\n") == (1 if terminal else 3)
    if terminal:
        assert text.count("\r") == 50 and not text.startswith("\n")
    else:
        assert "\r" not in text
        assert [line.split()[2] for line in text.splitlines()] == ["100/250", "200/250", "250/250"]


def test_a_ctrl_c_while_the_trainer_is_being_started_stops_it_as_any_other(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The Ctrl-C came after the trainer's process existed and before Popen returned: the
    KeyboardInterrupt left from inside Popen, the demo exited 130 ("interrupted") and the
    trainer, without its handle, was never told to stop."""
    import socket as socket_module

    import scalewatch.app.cli._demo as demo_module
    from scalewatch.app.settings import Settings

    class Trainer:
        pid = 0

        def poll(self) -> int | None:
            return None

    trainer = Trainer()
    stopped: list[object] = []

    def start_trainer(*args: object, **kwargs: object) -> Trainer:
        os.kill(os.getpid(), signal.SIGINT)  # the Ctrl-C, while Popen would still run
        return trainer

    server = threading.Thread()  # a thread done already stands in for the server's
    server.start()
    monkeypatch.setattr(demo_module, "_start_server", lambda *a: (object(), server))
    monkeypatch.setattr(demo_module, "_stop_server", lambda server: None)
    monkeypatch.setattr(demo_module, "_start_trainer", start_trainer)
    monkeypatch.setattr(demo_module, "_stop_trainer", stopped.append)
    settings = Settings(db=f"sqlite:///{tmp_path / 'demo.db'}")
    with socket_module.socket() as sock:
        code = demo_module.run(settings, sock, steps=1, world_size=1, run_name="x")
    assert (code, stopped) == (0, [trainer])


def test_the_demo_ends_saying_how_its_run_ended_at_which_step_and_where_it_is_stored(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its last line was "stopping": nothing of the run it had trained, nor of its store."""
    import socket as socket_module

    import scalewatch.app.cli._demo as demo_module
    from scalewatch.app.settings import Settings
    from scalewatch.store.runs import create_run, end_run, write_steps
    from tests._helpers.records import step_record

    db = tmp_path / "demo.db"
    settings = Settings(db=f"sqlite:///{db}")
    with open_store(settings.db) as store:  # an older run of the same name
        create_run(store, name="tiny", world_size=2, config={}, control={})

    class Trainer:
        pid = 0

        def poll(self) -> int | None:
            return None

    def start_trainer(*args: object, **kwargs: object) -> Trainer:
        with open_store(settings.db) as store:  # the trainer's run: 1234 steps
            run = create_run(store, name="tiny", world_size=2, config={}, control={})
            write_steps(store, run.id, [step_record(1), step_record(1234)])
        os.kill(os.getpid(), signal.SIGINT)  # the Ctrl-C
        return Trainer()

    def stop_trainer(trainer: object) -> None:
        with open_store(settings.db) as store:
            end_run(store, 2)

    server = threading.Thread()
    server.start()
    monkeypatch.setattr(demo_module, "_start_server", lambda *a: (object(), server))
    monkeypatch.setattr(demo_module, "_stop_server", lambda server: None)
    monkeypatch.setattr(demo_module, "_start_trainer", start_trainer)
    monkeypatch.setattr(demo_module, "_stop_trainer", stop_trainer)
    with socket_module.socket() as sock:
        code = demo_module.run(settings, sock, steps=1234, world_size=2, run_name="tiny")
    assert code == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last == (
        f"scalewatch demo: run 2 ('tiny') finished at step 1,234; it is stored in {db}"
        f" ('scalewatch serve --db {db}' shows it again)"
    )


@pytest.mark.parametrize(
    ("raw", "expected"),
    [(None, 20.0), ("3", 3.0), ("0.5", 0.5), ("0", 20.0), ("-1", 20.0), ("nan", 20.0),
     ("inf", 20.0), ("soon", 20.0)],
)  # fmt: skip
def test_the_ranks_grace_is_the_default_unless_the_environment_names_a_positive_one(
    monkeypatch: pytest.MonkeyPatch, raw: str | None, expected: float
) -> None:
    from scalewatch.examples import tiny_lm

    if raw is None:
        monkeypatch.delenv(tiny_lm.RANK_STOP_ENV, raising=False)
    else:
        monkeypatch.setenv(tiny_lm.RANK_STOP_ENV, raw)
    assert tiny_lm.rank_stop_s() == expected
