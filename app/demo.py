"""``scalewatch demo``: the dashboard plus a real multi-rank fp16 training writing to it.

The training runs in its own processes (``python -m scaler.examples.tiny_lm``); this
process serves the dashboard on 127.0.0.1 until Ctrl-C, which also stops training
cleanly (the run is marked finished).
"""

from __future__ import annotations

import argparse
import signal
import socket
import subprocess
import sys
import threading
from typing import TYPE_CHECKING, TextIO

from app.cli import _db_argument, _settings, command
from app.settings import Settings

if TYPE_CHECKING:
    import uvicorn

TRAINER = "scaler.examples.tiny_lm"


def _demo_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=1500, help="training steps (default 1500)")
    parser.add_argument("--world-size", type=int, default=2, help="ranks (default 2)")
    parser.add_argument("--port", type=int, help="dashboard port (default 8765)")
    parser.add_argument("--run-name", default="tiny-lm-fp16")
    _db_argument(parser)


@command("demo", "train a small fp16 model on several ranks and watch it live", _demo_arguments)
def demo(args: argparse.Namespace) -> int:
    if args.steps < 1 or args.world_size < 1:
        print("scalewatch demo: --steps and --world-size must be >= 1", file=sys.stderr)
        return 2
    from app.serving import BindRefused, listen, prepare, refuse_unguarded, tune_for_serving
    from scaler.store.engine import open_store

    settings = _settings(args, port=args.port)
    try:
        refuse_unguarded(settings)
    except BindRefused as refused:
        print(f"scalewatch demo: {refused}", file=sys.stderr)
        return 2
    open_store(settings.db).close()  # migrate once, before the ranks and the server start
    try:  # before a token is written: a port in use leaves the token file as it is
        sock = listen(settings.host, settings.port)
    except OSError as error:
        where = f"{settings.host}:{settings.port}"
        print(
            f"scalewatch demo: cannot listen on {where}: {error.strerror or error}", file=sys.stderr
        )
        return 3
    try:
        settings = prepare(settings, out=sys.stdout)
        tune_for_serving()
        server, thread = _start_server(settings, sock)
    except BaseException:
        sock.close()
        raise
    try:
        _announce(settings, sys.stdout)
        trainer = subprocess.Popen(
            [
                sys.executable,
                "-m",
                TRAINER,
                "--steps",
                str(args.steps),
                "--world-size",
                str(args.world_size),
                "--db",
                settings.db,
                "--run-name",
                args.run_name,
            ]
        )
        try:
            code = trainer.wait()
            print(
                f"\nscalewatch demo: training ended (exit {code}); the dashboard keeps serving"
                " until Ctrl-C.",
                flush=True,
            )
            _wait_for_interrupt()
        except KeyboardInterrupt:
            _stop_trainer(trainer)
        return 0
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def _start_server(
    settings: Settings, sock: socket.socket
) -> tuple[uvicorn.Server, threading.Thread]:
    import uvicorn

    from app.main import create_app
    from app.serving import SHUTDOWN_GRACE_S, Server

    config = uvicorn.Config(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level="warning",
        timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
    )
    server = Server(config)
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
        raise SystemExit(f"scalewatch demo: could not serve on {settings.host}:{settings.port}")
    return server, thread


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


def _wait_for_interrupt() -> None:
    forever = threading.Event()
    while not forever.wait(3600):
        pass


def _stop_trainer(trainer: subprocess.Popen[bytes]) -> None:
    """The ranks got the same Ctrl-C; give them time to close their scalers."""
    if trainer.poll() is None:
        trainer.send_signal(signal.SIGINT)
    try:
        trainer.wait(timeout=30)
    except subprocess.TimeoutExpired:
        trainer.kill()
        trainer.wait()
