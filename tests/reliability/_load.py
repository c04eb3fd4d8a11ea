"""The load test's processes: a paced writer, SSE clients and chart clients, each bounded in
time, each printing one JSON line of results.

    python -m tests.reliability._load writer URL RUN FIRST_STEP RATE SECONDS
    python -m tests.reliability._load sse BASE RUN CLIENTS SECONDS
    python -m tests.reliability._load charts BASE RUN RATE SECONDS LAST_STEP
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import sys
import time
from typing import Any

import httpx

from scaler.store.engine import open_store
from scaler.store.records import StepRecord
from scaler.store.runs import write_steps

BATCH = 1000  # a telemetry thread's batch at 10k records/s and 10 writes/s
_WALL_TIME = re.compile(rb'"wall_time":([0-9.e+]+)')
_STEP_ID = re.compile(rb"^id: (\d+)$", re.MULTILINE)


def records(first: int, count: int, wall_time: float) -> list[StepRecord]:
    return [
        StepRecord(
            step=step,
            wall_time=wall_time,
            scale=65536.0,
            overflow=step % 1000 == 0,
            skipped=step % 1000 == 0,
            inf_ranks=(1,) if step % 1000 == 0 else (),
            scale_after=32768.0 if step % 1000 == 0 else 65536.0,
            growth_tracker=step % 2000,
            growth_interval=2000,
            growth_factor=2.0,
            backoff_factor=0.5,
            control_version=0,
        )
        for step in range(first, first + count)
    ]


def writer(url: str, run: int, first: int, rate: float, seconds: float) -> dict[str, Any]:
    """Write ``rate`` records/s in batches for ``seconds``; time spent inside ``write_steps``."""
    store = open_store(url)
    start = time.monotonic()
    written, busy, step, late = 0, 0.0, first, 0.0
    batches = int(rate * seconds) // BATCH
    for i in range(batches):
        due = start + i * BATCH / rate
        wait = due - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        else:
            late = max(late, -wait)
        began = time.monotonic()
        write_steps(store, run, records(step, BATCH, time.time()))
        busy += time.monotonic() - began
        written += BATCH
        step += BATCH
    elapsed = time.monotonic() - start
    store.close()
    return {
        "written": written,
        "elapsed": elapsed,
        "busy": busy,
        "rate": written / elapsed,
        "capacity": written / busy,
        "max_late": late,
        "last_step": step - 1,
    }


async def _sse_client(base: str, run: int, deadline: float, out: dict[str, Any]) -> None:
    lags: list[float] = out["lags"]
    pending = b""
    try:
        async with (
            httpx.AsyncClient(base_url=base, timeout=10) as http,
            http.stream("GET", f"/api/runs/{run}/stream") as response,
        ):
            out["status"] = response.status_code
            async for chunk in response.aiter_bytes():
                now = time.time()
                pending += chunk
                cut = pending.rfind(b"\n\n")
                if cut >= 0:
                    done, pending = pending[: cut + 2], pending[cut + 2 :]
                    ids = _STEP_ID.findall(done)
                    if ids:
                        first, last = int(ids[0]), int(ids[-1])
                        if out["last"] is not None and first != out["last"] + 1:
                            out["gaps"] += 1
                        out["first"] = out["first"] or first
                        out["last"] = last
                        out["events"] += len(ids)
                        # The oldest step of a delivery waited longest: its lag is kept.
                        oldest = _WALL_TIME.search(done)
                        if oldest is not None:
                            lags.append(now - float(oldest.group(1)))
                if time.monotonic() >= deadline:
                    return
    except Exception as error:  # counted and reported by the test
        out["errors"].append(repr(error))


async def _sse(base: str, run: int, clients: int, seconds: float) -> list[dict[str, Any]]:
    deadline = time.monotonic() + seconds
    results = [
        {"status": None, "lags": [], "events": 0, "gaps": 0, "first": None, "last": None}
        | {"errors": []}
        for _ in range(clients)
    ]
    tasks = [asyncio.create_task(_sse_client(base, run, deadline, out)) for out in results]
    # A stream stays open when no steps come: stop the clients at the deadline.
    await asyncio.wait(tasks, timeout=seconds)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return results


def sse(base: str, run: int, clients: int, seconds: float) -> dict[str, Any]:
    return {"clients": asyncio.run(_sse(base, run, clients, seconds))}


async def _charts(
    base: str, run: int, rate: float, seconds: float, last_step: int
) -> dict[str, Any]:
    rng = random.Random(0)
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    errors: list[str] = []

    async def one(http: httpx.AsyncClient, params: dict[str, int]) -> None:
        began = time.monotonic()
        try:
            response = await http.get(f"/api/runs/{run}/steps", params=params)
            response.json()
        except Exception as error:
            errors.append(repr(error))
            return
        latencies.append(time.monotonic() - began)
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1

    start = time.monotonic()
    limits = httpx.Limits(max_connections=50)
    async with httpx.AsyncClient(base_url=base, timeout=10, limits=limits) as http:
        tasks = []
        for i in range(int(rate * seconds)):
            wait = start + i / rate - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            params = {"max_points": 2000}
            if i % 2:  # a zoomed window somewhere in the run
                width = rng.choice([500, 5_000, 50_000])
                params["start"] = rng.randrange(1, max(2, last_step - width))
                params["end"] = params["start"] + width
            tasks.append(asyncio.create_task(one(http, params)))
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=30)
    return {"latencies": latencies, "statuses": statuses, "errors": errors}


def charts(base: str, run: int, rate: float, seconds: float, last_step: int) -> dict[str, Any]:
    return asyncio.run(_charts(base, run, rate, seconds, last_step))


def main(argv: list[str]) -> int:
    kind, args = argv[0], argv[1:]
    if kind == "writer":
        result = writer(args[0], int(args[1]), int(args[2]), float(args[3]), float(args[4]))
    elif kind == "sse":
        result = sse(args[0], int(args[1]), int(args[2]), float(args[3]))
    elif kind == "charts":
        result = charts(args[0], int(args[1]), float(args[2]), float(args[3]), int(args[4]))
    else:
        raise SystemExit(f"unknown kind {kind!r}")
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
