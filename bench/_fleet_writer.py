"""The fleet bench's trainers: one thread per run, each with a store of its own (as each
trainer has), writing a batch of its run's records every ``BATCH / RATE`` s (a telemetry
thread's batch at that rate), its start staggered so the runs do not write in step.

    python bench/_fleet_writer.py URL RUNS FIRST_STEP RATE SECONDS BATCH

RUNS: run ids separated by commas. Prints one JSON line: records written, the rate
achieved by all runs together (records over the time from the first start to the last
batch's end), each batch's time inside ``write_steps``, and how late a batch started at most.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scalewatch.store.engine import open_store  # noqa: E402
from scalewatch.store.runs import write_steps  # noqa: E402
from tests._helpers.load import records  # noqa: E402


def _write(
    url: str, run: int, first: int, count: int, interval: float, t0: float, out: dict[str, Any]
) -> None:
    store = open_store(url)
    busy, late, step = [], 0.0, first
    for i in range(count):
        wait = t0 + i * interval - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        else:
            late = max(late, -wait)
        began = time.monotonic()
        write_steps(store, run, records(step, out["batch"], time.time()))
        busy.append(time.monotonic() - began)
        step += out["batch"]
    out.update(busy=busy, late=late, last_step=step - 1, ended=time.monotonic())
    store.close()


def write(
    url: str, runs: list[int], first: int, rate: float, seconds: float, batch: int
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
        "last_step": {str(run): out["last_step"] for run, out in zip(runs, outs, strict=True)},
        "cpu_s": time.process_time() - cpu,
    }


if __name__ == "__main__":
    url, runs, first, rate, seconds, batch = sys.argv[1:]
    result = write(
        url, [int(r) for r in runs.split(",")], int(first), float(rate), float(seconds), int(batch)
    )
    print(json.dumps(result), flush=True)
