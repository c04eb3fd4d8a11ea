"""Load: a writer at 10k records/s, 50 SSE clients and 20 chart requests/s against a real
``scalewatch serve`` on 127.0.0.1, for ``SCALEWATCH_LOAD_SECONDS`` (20 s in the test suite;
``bench/load.py`` runs the minute the design's goals are stated for).

The test asserts what must hold on any machine: every chart request answered 200, every step
delivered to every stream in order, the writer keeping its pace. The latency goals (chart p99,
SSE lag) depend on the machine and what else runs on it: the test prints them, and
``bench/load.py`` (``make bench``) runs it and judges them.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from scalewatch.store.engine import open_store
from scalewatch.store.identities import Role, create_identity
from scalewatch.store.runs import create_run, write_steps
from tests._helpers.load import (
    BATCH,
    TOKEN_ENV,
    records,
    result,
    serving,
    spawn,
    wait_streams_open,
)
from tests._helpers.service import CONTROL

RATE = 10_000  # records/s, in batches of _load.BATCH
SECONDS = int(os.environ.get("SCALEWATCH_LOAD_SECONDS", "20"))  # the loaded phase
SOLO_SECONDS = max(5, SECONDS // 6)  # the paced writer alone
UNPACED_SECONDS = 3
SSE_CLIENTS = 50  # all in one process, one event loop
CHART_RATE = 20
HISTORY = 300_000  # steps in the run before the writer starts
# Generous bounds, so a slow machine makes the figures worse, never the test flaky.
CATCH_UP_S = 120  # after the writer's last step, for every stream to deliver it
CHART_TIMEOUT_S = 120  # for one chart request's answer
TICK = os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far, from ``/proc``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def machine_busy() -> tuple[float, float]:
    """CPU seconds of the whole machine so far: (busy, total), from ``/proc/stat``."""
    ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = ticks[3] + ticks[4]
    return (sum(ticks) - idle) / TICK, sum(ticks) / TICK


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str, int]]:
    url = f"sqlite:///{tmp_path / 'load.db'}"
    options: tuple[str, ...] = ()
    if os.environ.get("SCALEWATCH_LOAD_AUTH") == "1":  # bench/load.py --auth
        with open_store(url) as store:
            viewer = create_identity(store, "load-viewer", Role.VIEWER, by="test").token
        monkeypatch.setenv(TOKEN_ENV, viewer)  # the clients are child processes
        options = ("--private-read",)
    with serving(url, tmp_path, token="load-token", start_timeout_s=30, options=options) as (
        base,
        pid,
    ):
        yield url, base, pid


@pytest.mark.slow
# Alone: its 10k records/s and 70 clients need the 2 cores. Run beside the suite's browsers
# and trainers, one stream of 50 counted a gap in 2 of 3 full runs of 2026-12-06; alone (and
# in bench/load.py, 60 s) none.
@pytest.mark.alone
@pytest.mark.timeout(600)
def test_under_load_every_step_reaches_every_stream_and_every_chart_is_answered(
    server: tuple[str, str, int],
) -> None:
    url, base, server_pid = server
    with open_store(url) as store:
        run = create_run(store, name="load", world_size=8, config={}, control=CONTROL).id
        for first in range(1, HISTORY + 1, 50_000):
            write_steps(store, run, records(first, 50_000, time.time()))

    # Alone: the writer's top speed (for information), then the paced writer.
    unpaced = result(spawn("writer", url, run, HISTORY + 1, 0, UNPACED_SECONDS), 60)
    solo_first = unpaced["last_step"] + 1
    solo = result(spawn("writer", url, run, solo_first, RATE, SOLO_SECONDS), SOLO_SECONDS + 30)
    first = solo["last_step"] + 1
    last_step = first + RATE * SECONDS - 1

    clients = spawn(
        "sse", base, run, SSE_CLIENTS, last_step, SECONDS + CATCH_UP_S, stderr=subprocess.PIPE
    )
    wait_streams_open(clients)
    busy0, total0 = machine_busy()
    server0 = cpu_seconds(server_pid)
    charts = spawn("charts", base, run, CHART_RATE, SECONDS, first - 1, CHART_TIMEOUT_S)
    loaded = spawn("writer", url, run, first, RATE, SECONDS)
    try:
        under_load = result(loaded, SECONDS + 60)
        busy1, total1 = machine_busy()
        server1 = cpu_seconds(server_pid)
        chart = result(charts, CHART_TIMEOUT_S + 60)
        sse = result(clients, CATCH_UP_S + 30)
    finally:
        for process in (loaded, charts, clients):
            if process.poll() is None:
                process.kill()
                process.wait(timeout=5)
    streams = sse["clients"]

    latencies = chart["latencies"]
    lags = [lag for stream in streams for lag in stream["lags"]]
    assert under_load["last_step"] == last_step
    figures = {
        "writer_unpaced_solo_rate": unpaced["rate"],
        "writer_solo_rate": solo["rate"],
        "writer_load_rate": under_load["rate"],
        "writer_ratio": under_load["rate"] / solo["rate"],
        "writer_solo_max_late_s": solo["max_late"],
        "writer_load_max_late_s": under_load["max_late"],
        "writer_solo_ms_per_batch": 1000 * solo["busy"] * BATCH / solo["written"],
        "writer_load_ms_per_batch": 1000 * under_load["busy"] * BATCH / under_load["written"],
        "records_written": under_load["written"],
        "chart_requests": len(latencies),
        "chart_statuses": chart["statuses"],
        "chart_errors": len(chart["errors"]),
        "chart_p50_ms": 1000 * statistics.median(latencies) if latencies else None,
        "chart_p99_ms": 1000 * percentile(latencies, 0.99) if latencies else None,
        "chart_max_ms": 1000 * max(latencies) if latencies else None,
        "sse_clients": len(streams),
        "sse_events": sum(stream["events"] for stream in streams),
        # Steps a stream skipped to catch up while the service was busy (each named by an
        # event: coalesced; the store keeps them).
        "sse_coalesced": sum(stream["coalesced"] for stream in streams),
        "sse_events_expected": sum(
            last_step - stream["first"] + 1 for stream in streams if stream["first"]
        ),
        "sse_errors": sum(len(stream["errors"]) for stream in streams),
        "sse_gaps": sum(stream["gaps"] for stream in streams),
        "sse_lag_p50_ms": 1000 * statistics.median(lags) if lags else None,
        "sse_lag_p99_ms": 1000 * percentile(lags, 0.99) if lags else None,
        "sse_lag_max_ms": 1000 * max(lags) if lags else None,
        # CPU seconds over the loaded phase (the writer's SECONDS): who used the 2 cores.
        "cpu_s_server": server1 - server0,
        "cpu_s_writer": under_load["cpu_s"],
        "cpu_s_sse_clients": sse["cpu_s"],
        "cpu_s_chart_client": chart["cpu_s"],
        "cpu_s_machine_busy": busy1 - busy0,
        "cpu_s_machine_total": total1 - total0,
    }
    print("\nload figures:", json.dumps(figures, indent=1))
    out = os.environ.get("SCALEWATCH_LOAD_FIGURES")
    if out:
        Path(out).write_text(json.dumps(figures, indent=1))

    # 503: "busy", at once, where the chart could not start within chart_wait_s.
    assert not chart["errors"] and set(chart["statuses"]) <= {"200", "503"}, chart["errors"][:5]
    assert len(latencies) == CHART_RATE * SECONDS
    assert len(streams) == SSE_CLIENTS
    for stream in streams:
        assert stream["status"] == 200 and not stream["errors"], stream["errors"]
        assert stream["gaps"] == 0
        # Every stream saw every step from when it opened to the writer's last one, or
        # was told which it skipped to catch up.
        assert stream["first"] == first
        assert stream["last"] == last_step
        assert stream["events"] + stream["coalesced"] == last_step - stream["first"] + 1
    assert under_load["written"] == RATE * SECONDS
    # The writer is paced, in its own process: readers in the service never hold it back.
    assert figures["writer_ratio"] >= 0.8
