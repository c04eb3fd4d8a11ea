"""What ``scalewatch demo`` runs: the dashboard plus a real multi-rank fp16 training writing to it.

The training runs in its own processes (``python -m scalewatch.examples.tiny_lm``); this
process serves the dashboard on 127.0.0.1 until Ctrl-C, which also stops training
cleanly (the run is marked finished).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING, TextIO

from ..settings import Settings

if TYPE_CHECKING:
    import uvicorn

    from scalewatch.store.queries import RunInfo

TRAINER = "scalewatch.examples.tiny_lm"
# About 25 minutes on a 2-core machine (7 it/s; 10-60 on faster ones): 1500 ended before
# a reader had sent a change.
DEFAULT_STEPS = 10_000
WAIT_POLL_S = 0.1  # how often the demo looks whether its trainer has ended
STOP_S = 30.0  # for the trainer to stop after a Ctrl-C (its ranks get 20 s of it)


def run(
    settings: Settings, sock: socket.socket, *, steps: int, world_size: int, run_name: str
) -> int:
    """Serve the dashboard on ``sock`` and train ``steps`` steps on ``world_size`` ranks
    until Ctrl-C; the exit status of ``scalewatch demo``."""
    try:
        server, thread = _start_server(settings, sock)
    except BaseException:
        sock.close()
        raise
    try:
        _announce(settings, sys.stdout)
        before = _newest_run(settings, run_name)
        # A Ctrl-C while the trainer is being started (it exists, Popen has not returned)
        # would leave it without its handle: it is held until Popen returns, then taken as
        # any other. A Python handler is no handler in the child once it has exec'd.
        interrupted: list[object] = []
        previous = signal.signal(signal.SIGINT, lambda *_: interrupted.append(True))
        try:
            trainer = _start_trainer(
                settings, steps=steps, world_size=world_size, run_name=run_name
            )
        finally:
            signal.signal(signal.SIGINT, previous)
        try:
            if interrupted:
                raise KeyboardInterrupt
            code = _wait(trainer)
            print(
                f"\nscalewatch demo: training ended (exit {code}); the dashboard keeps serving"
                " until Ctrl-C.",
                flush=True,
            )
            _wait_for_interrupt()
        except KeyboardInterrupt:
            # From here to the exit a second Ctrl-C kills the ranks, without a traceback. The
            # server stops by itself within SHUTDOWN_GRACE_S.
            forced = threading.Event()
            signal.signal(signal.SIGINT, lambda *_: _force_stop(trainer, forced))
            print(
                "\nscalewatch demo: stopping (Ctrl-C again to stop at once)",
                file=sys.stderr,
                flush=True,
            )
            _stop_trainer(trainer)
            if forced.is_set():
                return 130  # as an interrupted command: the run was not closed
        print(f"scalewatch demo: {_outcome(settings, run_name, before)}", flush=True)
        return 0
    finally:
        _stop_server(server)
        thread.join(timeout=10)
        sock.close()


def _newest_run(settings: Settings, run_name: str) -> RunInfo | None:
    """The newest run named ``run_name`` in the store, or None."""
    from scalewatch.store.engine import open_store
    from scalewatch.store.queries import list_runs

    with open_store(settings.db) as store:
        return next((run for run in list_runs(store) if run.name == run_name), None)


def _outcome(settings: Settings, run_name: str, before: RunInfo | None) -> str:
    """The demo's last word: how its run ended, at which step, and where it is stored.

    ``before`` is the newest run of that name when the demo started: an older run, not this
    demo's.
    """
    from scalewatch.store.urls import parse_store_url, shown_url, sqlite_file

    path = sqlite_file(parse_store_url(settings.db))
    where = os.path.abspath(path) if path is not None else shown_url(settings.db)
    run = _newest_run(settings, run_name)
    if run is None or (before is not None and run.id == before.id):
        return f"no run was recorded (the store: {where})"
    return (
        f"run {run.id} ({run.name!r}) {run.status} at step {run.steps:,}; it is stored in"
        f" {where} ('scalewatch serve --db {where}' shows it again)"
    )


def _start_trainer(
    settings: Settings, *, steps: int, world_size: int, run_name: str
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            TRAINER,
            "--steps",
            str(steps),
            "--world-size",
            str(world_size),
            "--db",
            settings.db,
            "--run-name",
            run_name,
        ],
        # Its own session: a Ctrl-C reaches it through this process alone (see
        # _stop_trainer), and a forced stop kills the ranks with it. A terminal closed
        # (or this process killed) is no signal to it: it notices that this process
        # is gone and stops its ranks as for a Ctrl-C.
        start_new_session=True,
    )


def _start_server(
    settings: Settings, sock: socket.socket
) -> tuple[uvicorn.Server, threading.Thread]:
    from ..main import create_app
    from ._serving import CannotServe, make_server

    server = make_server(create_app(settings), settings, sock, log_level="warning")
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="scalewatch-server", daemon=True
    )
    thread.start()
    started = threading.Event()

    def _check() -> bool:
        return bool(server.started) or not thread.is_alive()

    while not _check():
        started.wait(0.05)
    if not server.started:
        raise CannotServe(f"could not serve on {settings.host}:{settings.port}")
    return server, thread


def _stop_server(server: uvicorn.Server) -> None:
    """Stop the server thread, its live streams first: sse-starlette ends them on a signal
    to uvicorn, which a server in a thread does not get."""
    from sse_starlette.sse import AppStatus

    AppStatus.should_exit = True
    server.should_exit = True


def _announce(settings: Settings, out: TextIO) -> None:
    url = f"http://{settings.host}:{settings.port}/"
    print(f"scalewatch demo: dashboard at {url}", file=out)
    print(
        "  change the growth interval of the running job (run ids: GET /api/runs):\n"
        f"  curl -X POST -H 'Authorization: Bearer <token>' -H 'Content-Type: application/json'"
        f" -d '{{\"growth_interval\": 20}}' {url}api/runs/1/control",
        file=out,
        flush=True,
    )


def _wait(trainer: subprocess.Popen[bytes]) -> int:
    """``trainer.wait()``, out of which a Ctrl-C comes at once.

    ``Popen.wait()`` takes a Ctrl-C as the child's too and first waits 0.25 s for it to
    exit: a second Ctrl-C meanwhile became part of the first one's KeyboardInterrupt.
    """
    while (code := trainer.poll()) is None:
        time.sleep(WAIT_POLL_S)
    return code


def _wait_for_interrupt() -> None:
    forever = threading.Event()
    while not forever.wait(3600):
        pass


def _force_stop(trainer: subprocess.Popen[bytes], forced: threading.Event) -> None:
    forced.set()
    if trainer.poll() is None:
        print(
            "scalewatch demo: stopping now (the ranks are killed: a run they had not closed"
            " will read as crashed)",
            file=sys.stderr,
            flush=True,
        )
    _kill_group(trainer)  # also ranks that outlived it


def _kill_group(trainer: subprocess.Popen[bytes]) -> None:
    """Kill the trainer and its ranks (its process group, which outlives the trainer)."""
    with contextlib.suppress(ProcessLookupError):  # every one of them is gone already
        os.killpg(trainer.pid, signal.SIGKILL)


def _stop_trainer(trainer: subprocess.Popen[bytes]) -> None:
    """Pass the Ctrl-C on to the trainer, which passes it on to its ranks and gives them time
    to close their scalers; past ``STOP_S`` they are killed.

    It gets a SIGTERM, which it takes as a Ctrl-C: one that comes while it still imports
    torch ends it quietly, where a SIGINT would print a traceback.
    """
    if trainer.poll() is None:
        trainer.send_signal(signal.SIGTERM)
    try:
        trainer.wait(timeout=STOP_S)
    except subprocess.TimeoutExpired:
        _kill_group(trainer)
        trainer.wait()
