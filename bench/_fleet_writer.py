"""The fleet bench's trainers: one thread per run, each writing a batch of its run's records
every ``BATCH / RATE`` s (a telemetry thread's batch at that rate), its start staggered so
the runs do not write in step. Each writes as a trainer does: into a store of its own
(``URL`` a database), or, ``URL`` a service (``http://...``), posting the batch to the
service's ingest route with the sender's own client and body (``$SCALEWATCH_TOKEN`` a
writer's token), the service storing it.

    python bench/_fleet_writer.py URL RUNS FIRST_STEP RATE SECONDS BATCH

RUNS: separated by commas, run ids (a store) or run uids (a service: each run is opened by
its uid, as a job opens its run). Prints one JSON line: records written, the rate achieved
by all runs together (records over the time from the first start to the last batch's end),
each batch's time inside the write (or the post), and how late a batch started at most.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scalewatch.spool.client import ServiceClient, is_service_url  # noqa: E402
from scalewatch.store.engine import open_store  # noqa: E402
from scalewatch.store.records import StepRecord  # noqa: E402
from scalewatch.store.runs import write_steps  # noqa: E402
from scalewatch.store.step_rows import step_values  # noqa: E402
from scalewatch.telemetry import TelemetrySettings  # noqa: E402
from scalewatch.telemetry._batches import items  # noqa: E402
from scalewatch.telemetry._queue import Command  # noqa: E402
from tests._helpers.load import records  # noqa: E402

Write = Callable[[list[StepRecord]], None]
T = TypeVar("T")
RETRIED = [0]  # posts answered 429 or 503 and tried again
WIRE_ENV = "SCALEWATCH_BENCH_WIRE"  # "objects": steps posted as objects, not rows
_RETRIED_LOCK = threading.Lock()


def opening(uid: str) -> dict[str, Any]:
    """The body that opens the run ``uid`` (made by ``bench/fleet.py`` already: the service
    answers with its id and its last batch stored)."""
    return {
        "uid": uid,
        "name": "fleet",
        "world_size": 8,
        "config": {},
        "control": {},
        "started_at": time.time(),
        "host": "fleet",
        "pid": 0,
        "torch_version": "bench",
    }


def _store_writer(url: str, run: str) -> tuple[Write, Callable[[], None]]:
    store = open_store(url)
    run_id = int(run)
    return (lambda batch: write_steps(store, run_id, batch)), store.close


def _retried(call: Callable[[], T]) -> T:
    """``call()``, tried again after the sender's ``retry_s`` while the service answers
    429 or 503."""
    while True:
        try:
            return call()
        except httpx.HTTPStatusError:
            with _RETRIED_LOCK:
                RETRIED[0] += 1
            time.sleep(TelemetrySettings().retry_s)


def _service_writer(url: str, uid: str) -> tuple[Write, Callable[[], None]]:
    """Batches posted as the sender posts them: the steps' rows as ``items`` makes them.
    An answer worth another try (429, 503: the service behind) is tried again after the
    sender's ``retry_s``, with the same number, as the sender does from its spool; the
    retries are counted (``RETRIED``)."""
    client = ServiceClient(url)
    run_id, sequence = _retried(lambda: client.open_run(opening(uid)))

    def post(batch: list[StepRecord]) -> None:
        nonlocal sequence
        sequence += 1
        rows: list[Command] = [step_values(record) for record in batch]
        as_rows = None if os.environ.get(WIRE_ENV) == "objects" else client.row_columns
        body = {"sequence": sequence, "items": items(rows, reason="", rows=as_rows)}
        _retried(lambda: client.post_batch(run_id, body))

    return post, client.close


def _write(
    url: str, run: str, first: int, count: int, interval: float, t0: float, out: dict[str, Any]
) -> None:
    write, close = (_service_writer if is_service_url(url) else _store_writer)(url, run)
    busy, late, step = [], 0.0, first
    for i in range(count):
        wait = t0 + i * interval - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        else:
            late = max(late, -wait)
        began = time.monotonic()
        # Each step at its own time: the first of a batch waited the whole interval,
        # as a trainer's does for its sender or writer, and a stream's lag counts it.
        write(records(step, out["batch"], time.time(), interval / out["batch"]))
        busy.append(time.monotonic() - began)
        step += out["batch"]
    out.update(busy=busy, late=late, last_step=step - 1, ended=time.monotonic())
    close()


def write(
    url: str, runs: list[str], first: int, rate: float, seconds: float, batch: int
) -> dict[str, Any]:
    interval = batch / rate
    count = int(rate * seconds) // batch
    t0 = time.monotonic() + 2.0  # every store open (a connection each) before the start
    outs: list[dict[str, Any]] = [{"batch": batch} for _ in runs]
    threads = [
        threading.Thread(
            target=_write,
            args=(url, run, first, count, interval, t0 + k * interval / len(runs), out),
        )
        for k, (run, out) in enumerate(zip(runs, outs, strict=True))
    ]
    cpu = time.process_time()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    busy = sorted(b for out in outs for b in out["busy"])
    written = len(busy) * batch
    elapsed = max(out["ended"] for out in outs) - t0
    return {
        "written": written,
        "elapsed": elapsed,
        "rate": written / elapsed,
        "batch_p50_ms": 1000 * busy[len(busy) // 2],
        "batch_p99_ms": 1000 * busy[min(len(busy) - 1, int(0.99 * len(busy)))],
        "max_late_s": max(out["late"] for out in outs),
        "last_step": {run: out["last_step"] for run, out in zip(runs, outs, strict=True)},
        "cpu_s": time.process_time() - cpu,
        "retried": RETRIED[0],
    }


if __name__ == "__main__":
    url, runs, first, rate, seconds, batch = sys.argv[1:]
    result = write(url, runs.split(","), int(first), float(rate), float(seconds), int(batch))
    print(json.dumps(result), flush=True)
