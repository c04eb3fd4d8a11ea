"""Control latency: from ``request_control`` to the step at which the trainer applied it.

A training process (a child, ``GradScaler`` on cpu, paced to ~20 steps/s) writes to a
store in a temporary directory; this process inserts requests one at a time through
``scalewatch.store.control.request_control`` and waits for each to be applied. Latency is
``applied_at - requested_at`` and, in steps, the trainer's steps in that interval.
Goal (issue 4): under 1 s plus two steps. ``--http``: the trainer records through a
``scalewatch serve`` over that store (``SCALEWATCH_DB=http://...``, a writer's token), and
the requests reach it in the answers to its batches.

    python bench/control.py [--requests 10] [--rate 20] [--http]
"""

from __future__ import annotations

import argparse
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from sqlalchemy import func, select

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scalewatch.store import open_store  # noqa: E402
from scalewatch.store.control import control_history, request_control  # noqa: E402
from scalewatch.store.identities import Role, create_identity  # noqa: E402
from scalewatch.store.schema import runs, steps  # noqa: E402

TRAINER = """
import sys, time, torch, scalewatch
from pathlib import Path
url, period, stop = sys.argv[1], 1.0 / float(sys.argv[2]), Path(sys.argv[3])
model = torch.nn.Linear(16, 1)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
with scalewatch.GradScaler("cpu", growth_interval=100, telemetry=url, run_name="latency") as gs:
    next_at = time.monotonic()
    while not stop.exists():
        opt.zero_grad()
        gs.scale(model(torch.randn(8, 16)).pow(2).mean()).backward()
        gs.step(opt)
        gs.update()
        next_at += period
        time.sleep(max(0.0, next_at - time.monotonic()))
"""


def _wait(condition: object, timeout: float, what: str) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()  # type: ignore[operator]
        if value:
            return value
        time.sleep(0.01)
    raise TimeoutError(f"timed out waiting for {what}")


def _serve(url: str, tmp: str) -> tuple[subprocess.Popen[bytes], str, str]:
    """``scalewatch serve`` over ``url`` on a free port of 127.0.0.1; (it, its URL, a
    writer's token)."""
    store = open_store(url)
    writer = create_identity(store, "bench-job", Role.WRITER, by="bench").token
    store.close()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "SCALEWATCH_TOKEN": secrets.token_hex(16),
           "SCALEWATCH_TOKEN_FILE": str(Path(tmp) / "token")}  # fmt: skip
    command = [sys.executable, "-m", "scalewatch.app", "serve", "--db", url, "--port", str(port)]
    server = subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    service = f"http://127.0.0.1:{port}"
    _wait(lambda: _answers(service), 60, "scalewatch serve")
    return server, service, writer


def _answers(service: str) -> bool:
    try:
        return httpx.get(f"{service}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def bench_control(
    requests: int = 10, rate: float = 20.0, http: bool = False
) -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'control.db'}"
        stop = Path(tmp) / "stop"
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore"}
        target, server = url, None
        if http:
            server, target, env["SCALEWATCH_TOKEN"] = _serve(url, tmp)
        trainer = subprocess.Popen(
            [sys.executable, "-c", TRAINER, target, str(rate), str(stop)], env=env, cwd=tmp
        )
        seconds: list[float] = []
        in_steps: list[float] = []
        try:
            store = _wait(lambda: _open_if_there(url), 120, "the store")
            assert not isinstance(store, bool)

            def running_run() -> int | None:
                with store.read() as conn:
                    row = conn.execute(select(runs.c.id, runs.c.last_step)).first()
                return row.id if row is not None and row.last_step >= 10 else None

            run_id = _wait(running_run, 120, "the trainer's first steps")
            assert isinstance(run_id, int)
            for i in range(requests):
                time.sleep(0.137 * (i % 4))  # land at different points of a step
                row = request_control(
                    store, run_id, {"growth_interval": 200 + i}, requested_by="bench"
                )

                def settled(request_id: int = row.id) -> object:
                    done = [r for r in control_history(store, run_id) if r.id == request_id]
                    return done[0] if done and done[0].status != "pending" else None

                done = _wait(settled, 30, f"request {row.id} to apply")
                assert done.status == "applied", done  # type: ignore[attr-defined]
                seconds.append(done.applied_at - done.requested_at)  # type: ignore[attr-defined]
                with store.read() as conn:
                    count = conn.execute(
                        select(func.count())
                        .select_from(steps)
                        .where(
                            steps.c.run_id == run_id,
                            steps.c.wall_time > done.requested_at,  # type: ignore[attr-defined]
                            steps.c.step <= done.applied_step,  # type: ignore[attr-defined]
                        )
                    ).scalar_one()
                in_steps.append(count)
            store.close()
        finally:
            stop.touch()
            try:
                trainer.wait(30)
            except subprocess.TimeoutExpired:
                trainer.kill()
                trainer.wait(10)
            if server is not None:
                server.terminate()
                server.wait(30)
    return {"seconds": seconds, "steps": in_steps}


def _open_if_there(url: str) -> object:
    path = Path(url.removeprefix("sqlite:///"))
    return open_store(url) if path.exists() else None


sys.path.insert(0, str(Path(__file__).resolve().parent))
from _figures import figure  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=10)
    parser.add_argument("--rate", type=float, default=20.0, help="trainer steps per second")
    parser.add_argument(
        "--http", action="store_true", help="the trainer records through the service"
    )
    args = parser.parse_args()
    result = bench_control(args.requests, args.rate, args.http)
    seconds, in_steps = result["seconds"], result["steps"]
    period = 1.0 / args.rate
    how = "through the service (HTTP)" if args.http else "into the store"
    print(
        f"control latency over {len(seconds)} requests, trainer at {args.rate:g} steps/s,"
        f" recording {how}"
    )
    print(
        f"  request -> applied: median {statistics.median(seconds) * 1e3:.0f} ms,"
        f" max {max(seconds) * 1e3:.0f} ms"
    )
    print(
        f"  in steps:           median {statistics.median(in_steps):.0f}, max {max(in_steps):.0f}"
    )
    goal = 1.0 + 2 * period
    verdict = "ok" if max(seconds) < goal else "MISSED"
    print(f"  goal: under 1 s plus two steps ({goal * 1e3:.0f} ms): {verdict}")
    figure(
        f"control request to application, trainer at {args.rate:g} steps/s"
        + (", recording through the service" if args.http else ""),
        f"median {statistics.median(seconds) * 1e3:.0f} ms, max {max(seconds) * 1e3:.0f} ms",
        f"< {goal * 1e3:.0f} ms (1 s + 2 steps)",
        max(seconds) < goal,
        f"median {statistics.median(in_steps):.0f} steps, max {max(in_steps):.0f} steps",
    )


if __name__ == "__main__":
    main()
