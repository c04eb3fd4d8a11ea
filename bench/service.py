"""Service benchmark: chart queries, CSV export and live-stream latency on a synthetic run.

    .venv/bin/python bench/service.py             # 10M steps, SQLite
    .venv/bin/python bench/service.py --steps 2000000
    .venv/bin/python bench/service.py --postgres  # a throwaway PostgreSQL server of its own
    .venv/bin/python bench/service.py --db postgresql+psycopg://...  # an empty scratch database

Builds one synthetic run in a temporary store (``bench/_synthetic.py``: the steps in one
transaction, rollups computed with ``INSERT ... SELECT ... GROUP BY``), starts ``uvicorn``
in a child process and measures it over HTTP on 127.0.0.1. Goals: chart p95 < 100 ms,
export >= 200k rows/s with flat memory, a new step reaches an SSE client in < 1 s.
The server's CPU time per request or row is printed too: unlike wall time, other jobs on
a shared machine barely move it.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

sys.path.insert(0, str(ROOT / "bench"))
from _figures import figure  # noqa: E402
from _synthetic import CONTROL, build  # noqa: E402

from scalewatch.store.engine import open_store  # noqa: E402
from scalewatch.store.records import StepRecord  # noqa: E402
from scalewatch.store.runs import create_run, end_run, write_steps  # noqa: E402

SERVER = """
import sys, uvicorn
from pydantic import SecretStr
from scalewatch.app.main import create_app
from scalewatch.app.settings import Settings
settings = Settings(db=sys.argv[1], token=SecretStr("bench"))
uvicorn.run(create_app(settings), host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def start_server(url: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    process = subprocess.Popen([sys.executable, "-c", SERVER, url, str(port)], cwd=ROOT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                return process, base
        except httpx.TransportError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError("the server did not start")


def check_overflows(
    body: dict[str, Any], lo: int, hi: int, after: dict[int, float], ordered: list[int]
) -> int:
    """Every overflow step in ``[lo, hi]`` lies in a bucket that shows it; returns their count."""
    series = body["series"]
    first, last = series["first_step"], series["last_step"]
    inside = ordered[bisect.bisect_left(ordered, lo) : bisect.bisect_right(ordered, hi)]
    for step in inside:
        i = bisect.bisect_right(first, step) - 1
        assert i >= 0 and first[i] <= step <= last[i], step
        assert series["overflows"][i] > 0, step
        assert series["scale_min"][i] <= after[step], step
    return len(inside)


def server_cpu_s(pid: int) -> float:
    """CPU seconds the process has used: a figure that other jobs on the machine barely move."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench_charts(
    http: httpx.Client, run: int, pid: int, steps: int, after: dict[int, float], repeats: int
) -> list[list[str]]:
    ordered = sorted(after)
    rng = random.Random(1)
    table = []
    for label, width in (
        ("whole run", steps),
        ("4M window", 4_000_000),
        ("1M window", 1_000_000),
        ("50k window", 50_000),
        ("10k window", 10_000),
        ("500 window", 500),
    ):
        width = min(width, steps)
        times, buckets, seen = [], 0, 0
        cpu = server_cpu_s(pid)
        for _ in range(repeats):
            lo = 1 if width == steps else rng.randint(1, steps - width + 1)
            hi = lo + width - 1
            params = {"start": lo, "end": hi, "max_points": 2000}
            started = time.perf_counter()
            response = http.get(f"/api/runs/{run}/steps", params=params)
            times.append((time.perf_counter() - started) * 1000)
            body = response.json()
            buckets = len(body["series"]["n"])
            assert buckets <= 2000 and sum(body["series"]["n"]) == width
            seen += check_overflows(body, lo, hi, after, ordered)
        cpu_ms = (server_cpu_s(pid) - cpu) / repeats * 1000
        q = statistics.quantiles(times, n=20)
        figure(
            f"chart query p95, {label} ({width:,} of {steps:,} steps), max_points 2000",
            f"{q[18]:.1f} ms (p50 {statistics.median(times):.1f} ms)",
            "p95 < 100 ms, every overflow shown",
            q[18] < 100,
            f"server CPU {cpu_ms:.1f} ms/request; {seen} overflows checked",
        )
        table.append(
            [
                f"/steps {label} ({width:,} steps)",
                f"{statistics.median(times):.1f} ms",
                f"{q[18]:.1f} ms",
                f"{buckets} buckets, {seen} overflows checked, server CPU {cpu_ms:.1f} ms/request",
            ]
        )
    return table


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def bench_export(http: httpx.Client, run: int, pid: int, rows: int) -> list[str]:
    baseline, peak, stop = rss_kib(pid), [0], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], rss_kib(pid))
            time.sleep(0.005)

    sampler = threading.Thread(target=sample)
    sampler.start()
    cpu = server_cpu_s(pid)
    started, lines, size = time.perf_counter(), 0, 0
    params = {"what": "steps", "format": "csv", "start": 1, "end": rows}
    with http.stream("GET", f"/api/runs/{run}/export", params=params) as response:
        for chunk in response.iter_bytes():
            lines += chunk.count(b"\n")
            size += len(chunk)
    elapsed = time.perf_counter() - started
    cpu_us = (server_cpu_s(pid) - cpu) / rows * 1e6
    stop.set()
    sampler.join()
    assert lines == rows + 1, lines
    figure(
        f"CSV export of {rows:,} rows",
        f"{rows / elapsed:,.0f} rows/s",
        ">= 200,000 rows/s, flat memory",
        rows / elapsed >= 200_000,
        f"server RSS +{(peak[0] - baseline) / 1024:.1f} MiB; {cpu_us:.2f} us/row server CPU",
    )
    return [
        f"export CSV {rows:,} rows",
        f"{rows / elapsed:,.0f} rows/s",
        f"{size / elapsed / 1e6:.0f} MB/s",
        f"server RSS +{(peak[0] - baseline) / 1024:.1f} MiB over {baseline / 1024:.0f} MiB,"
        f" server CPU {cpu_us:.2f} us/row",
    ]


def bench_stream(http: httpx.Client, url: str, count: int) -> list[str]:
    store = open_store(url)
    run = create_run(store, name="bench-live", world_size=1, config={}, control=CONTROL).id
    write_steps(store, run, [_record(0)])
    arrived: dict[int, float] = {}
    ready = threading.Event()

    def read() -> None:
        with http.stream("GET", f"/api/runs/{run}/stream", timeout=30) as response:
            for line in response.iter_lines():
                ready.set()
                if line.startswith("id: "):
                    arrived[int(line[4:])] = time.perf_counter()
                elif line == "event: end":
                    return

    reader = threading.Thread(target=read)
    reader.start()
    ready.wait(10)
    written: dict[int, float] = {}
    for step in range(1, count + 1):
        write_steps(store, run, [_record(step)])
        written[step] = time.perf_counter()
        time.sleep(0.05)  # ~20 steps/s, a fast fp16 job
    end_run(store, run)
    reader.join(10)
    store.close()
    latencies = [(arrived[step] - written[step]) * 1000 for step in written if step in arrived]
    assert len(latencies) == count, f"{len(latencies)} of {count} steps arrived"
    figure(
        "step written -> SSE client",
        f"{statistics.median(latencies):.0f} ms median, {max(latencies):.0f} ms max",
        "< 1 s",
        max(latencies) < 1000,
        f"{count} steps at ~20 steps/s",
    )
    return [
        f"step -> SSE client ({count} steps)",
        f"{statistics.median(latencies):.0f} ms median",
        f"{max(latencies):.0f} ms max",
        "LISTEN/NOTIFY" if url.startswith("postgresql") else "one poller, every 20 ms",
    ]


def _record(step: int) -> StepRecord:
    return StepRecord(
        step=step,
        wall_time=time.time(),
        scale=65536.0,
        overflow=False,
        skipped=False,
        inf_ranks=(),
        scale_after=65536.0,
        growth_tracker=step % 2000,
        growth_interval=2000,
        growth_factor=2.0,
        backoff_factor=0.5,
        control_version=0,
    )


def _postgres_database(stack: contextlib.ExitStack) -> str:
    from tests._helpers import postgres as _postgres

    bindir = _postgres.server_bindir()
    if bindir is None:
        sys.exit(f"bench/service.py: {_postgres.HOW_TO_GET_ONE}, or pass --db")
    server = stack.enter_context(_postgres.cluster(bindir))
    return server.url(server.new_database())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10_000_000)
    parser.add_argument("--overflows", type=int, default=2000, help="overflow steps in the run")
    parser.add_argument("--repeats", type=int, default=40, help="requests per chart window")
    parser.add_argument(
        "--postgres", action="store_true", help="on a throwaway PostgreSQL server of its own"
    )
    parser.add_argument("--db", help="an empty scratch store (a PostgreSQL URL) instead")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        url = args.db or (_postgres_database(stack) if args.postgres else None)
        if url is None:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="scalewatch-bench-"))
            url = f"sqlite:///{Path(tmp) / 'bench.db'}"
        print(f"building a {args.steps:,}-step run with {args.overflows} overflows")
        started = time.perf_counter()
        run, after = build(url, args.steps, args.overflows)
        built = time.perf_counter() - started
        print(f"built in {built:.1f} s")
        process, base = start_server(url)
        try:
            with httpx.Client(base_url=base, timeout=120) as http:
                table = [["what", "p50 / rate", "p95 / max", "notes"]]
                table += bench_charts(http, run, process.pid, args.steps, after, args.repeats)
                table.append(bench_export(http, run, process.pid, min(100_000, args.steps)))
                table.append(bench_export(http, run, process.pid, min(1_000_000, args.steps)))
                table.append(bench_stream(http, url, 50))
        finally:
            process.terminate()
            process.wait(10)
    backend = "PostgreSQL" if url.startswith("postgresql") else "SQLite"
    widths = [max(len(row[i]) for row in table) for i in range(4)]
    print(
        f"\nservice benchmark on {backend}: {args.steps:,} steps, {os.cpu_count()} CPUs,"
        f" build {built:.0f} s"
    )
    for row in table:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))
    print(json.dumps({"steps": args.steps, "overflows": args.overflows}))


if __name__ == "__main__":
    main()
